#!/usr/bin/env bash
# The main job: build pgmq-bench (release), run every benchmark section on a
# throwaway local PostgreSQL + PGMQ cluster started on its own port (installed
# with apt-get when missing, removed afterwards), write the benchmark.v1 JSON
# document and an SVG chart beside it, and end with the short Markdown
# summary, the document's path and the command for the full report.
# Progress goes to stderr whether it is a terminal or a pipe (`| tee log`):
# the build, the cluster, each step as [k/N] with an estimate of the time
# left, each run's rate, long preloads' counts.
#
#   bash scripts/bench.sh                     # every section at small sizes: about 3 minutes on 2 cores, plus the build
#   bash scripts/bench.sh --full              # the release run: 3 rounds, full sizes, about 26 minutes on 2 cores
#   bash scripts/bench.sh --long              # pgmq-bench --long: 5 rounds, larger runs, 5-minute sustained
#   bash scripts/bench.sh --standard          # pgmq-bench --standard: between the default and --full
#   bash scripts/bench.sh --quick             # pgmq-bench --quick: smoke test, 1 round, small runs
#   bash scripts/bench.sh --invocations 5     # 5 independent invocations, one aggregate document
#   bash scripts/bench.sh --output run.json -- --sections consume_scaling,baseline --handler-work-ms 1
#
# Flags after `--` go to pgmq-bench unchanged (see `pgmq-bench --help`); they
# override the profile's. The cluster port is PGMQ_BENCH_LOCAL_PORT (55436 by
# default; never 55432, the development cluster). A result file this run
# writes that already exists is kept as <file>.prev, and said so (an older
# .prev is replaced, and that is said too). Exit status: pgmq-bench's (0 ok,
# 1 a failed check such as a missing message, 2 refused). With
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
    --full|--long|--standard|--quick) profile="${1#--}"; shift ;;
    --invocations) invocations="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument $1 (flags for pgmq-bench go after --)" >&2; exit 2 ;;
  esac
done

# The profiles are pgmq-bench's own (one definition, in its config.rs).
flags=()
[ "$profile" = default ] || flags=("--$profile")

echo "bench.sh: building pgmq-bench (release; several minutes on a fresh clone)" >&2
cargo build --release -p pgmq-bench
bin="${CARGO_TARGET_DIR:-target}/release/pgmq-bench"
port="${PGMQ_BENCH_LOCAL_PORT:-55436}"
svg="${output%.json}.svg"

# Keeps an earlier result at $1 as $1.prev, saying so.
keep_previous() {
  [ -e "$1" ] || return 0
  if [ -e "$1.prev" ]; then
    echo "bench.sh: keeping the earlier $1 as $1.prev (replacing the older $1.prev)" >&2
  else
    echo "bench.sh: keeping the earlier $1 as $1.prev" >&2
  fi
  mv -f -- "$1" "$1.prev"
}
keep_previous "$output"
keep_previous "$svg"

# The run's own stdout (its summary, the document's path, the command for
# the full report) is printed last, after the chart is written.
summary="$(mktemp)"
trap 'rm -f "$summary"' EXIT
started=$SECONDS
status=0
if [ "$invocations" -le 1 ]; then
  "$bin" --local --local-port "$port" --output "$output" \
    "${flags[@]}" "${extra[@]}" >"$summary" || status=$?
else
  runs=()
  for i in $(seq 1 "$invocations"); do
    run="${output%.json}-inv$i.json"
    keep_previous "$run"
    echo "== invocation $i of $invocations -> $run" >&2
    s=0
    "$bin" --local --local-port "$port" --output "$run" \
      "${flags[@]}" "${extra[@]}" >/dev/null || s=$?
    [ "$s" -le 1 ] && [ -f "$run" ] || { status=$s; break; }
    runs+=("$run")
  done
  if [ "$status" -le 1 ] && [ "${#runs[@]}" -ge 2 ]; then
    "$bin" aggregate "${runs[@]}" --output "$output" || status=$?
  fi
  if [ -f "$output" ] && [ "$status" -le 1 ]; then
    {
      "$bin" summary --markdown "$output"
      echo
      echo "Document: $output"
      echo "Full report: $bin report $output"
    } >"$summary"
  fi
fi
ran=$((SECONDS - started))
echo "bench.sh: the benchmark ran $((ran / 60)) min $((ran % 60)) s after the build" >&2

if [ -f "$output" ] && [ "$status" -le 1 ]; then
  "$bin" report "$output" --svg "$svg" >/dev/null
  echo "bench.sh: chart $svg" >&2
fi
echo >&2
cat "$summary"
exit "$status"
