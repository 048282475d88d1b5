#!/usr/bin/env bash
# The main job: build pgmq-bench (release), run every benchmark section on a
# throwaway local PostgreSQL + PGMQ cluster started on its own port (installed
# with apt-get when missing, removed afterwards), write the benchmark.v1 JSON
# document, and print its Markdown summary (plus an SVG chart beside the JSON).
#
#   bash scripts/bench.sh                     # the full run: about 26 minutes on 2 cores
#   bash scripts/bench.sh --long              # pgmq-bench --long: 5 rounds, larger runs, 5-minute sustained
#   bash scripts/bench.sh --standard          # pgmq-bench --standard: between --quick and the full run
#   bash scripts/bench.sh --quick             # pgmq-bench --quick: smoke test, 1 round, small runs
#   bash scripts/bench.sh --invocations 5     # 5 independent invocations, one aggregate document
#   bash scripts/bench.sh --output run.json -- --sections consume_scaling,baseline --handler-work-ms 1
#
# Flags after `--` go to pgmq-bench unchanged (see `pgmq-bench --help`); they
# override the profile's. The cluster port is PGMQ_BENCH_LOCAL_PORT (55436 by
# default; never 55432, the development cluster). Exit status: pgmq-bench's
# (0 ok, 1 a failed check such as a missing message, 2 refused). With
# --invocations N, each invocation writes <output>-invK.json (its own
# throwaway cluster each time) and `pgmq-bench aggregate` merges them into
# <output>, keeping every run; compare then tests per-invocation medians.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

output=benchmark.json
profile=default
invocations=1
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --output|-o) output="$2"; shift 2 ;;
    --long|--standard|--quick) profile="${1#--}"; shift ;;
    --invocations) invocations="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument $1 (flags for pgmq-bench go after --)" >&2; exit 2 ;;
  esac
done

# The profiles are pgmq-bench's own (one definition, in its config.rs).
flags=()
[ "$profile" = default ] || flags=("--$profile")

cargo build --release --quiet -p pgmq-bench
bin="${CARGO_TARGET_DIR:-target}/release/pgmq-bench"

rm -f "$output"
status=0
if [ "$invocations" -le 1 ]; then
  "$bin" --local --local-port "${PGMQ_BENCH_LOCAL_PORT:-55436}" --output "$output" \
    "${flags[@]}" "${extra[@]}" || status=$?
else
  runs=()
  for i in $(seq 1 "$invocations"); do
    run="${output%.json}-inv$i.json"
    rm -f "$run"
    echo "== invocation $i of $invocations -> $run" >&2
    s=0
    "$bin" --local --local-port "${PGMQ_BENCH_LOCAL_PORT:-55436}" --output "$run" \
      "${flags[@]}" "${extra[@]}" || s=$?
    [ "$s" -le 1 ] && [ -f "$run" ] || { status=$s; break; }
    runs+=("$run")
  done
  if [ "$status" -le 1 ] && [ "${#runs[@]}" -ge 2 ]; then
    "$bin" aggregate "${runs[@]}" --output "$output" || status=$?
  fi
fi

if [ -f "$output" ] && [ "$status" -le 1 ]; then
  "$bin" report "$output" --svg "${output%.json}.svg"
  echo
  echo "Document: $output   Chart: ${output%.json}.svg"
fi
exit "$status"
