#!/usr/bin/env bash
# The main job: build pgmq-bench (release), run every benchmark section on a
# throwaway local PostgreSQL + PGMQ cluster started on its own port (installed
# with apt-get when missing, removed afterwards), write the benchmark.v1 JSON
# document, and print its Markdown summary (plus an SVG chart beside the JSON).
#
#   bash scripts/bench.sh                     # default profile, a few minutes on 2 cores
#   bash scripts/bench.sh --long              # 5 measured rounds, larger runs, 5-minute sustained
#   bash scripts/bench.sh --quick             # smoke test: 1 round, no warm-up, small runs
#   bash scripts/bench.sh --output run.json -- --sections consume_scaling,baseline --handler-work-ms 1
#
# Flags after `--` go to pgmq-bench unchanged (see `pgmq-bench --help`); they
# override the profile's. The cluster port is PGMQ_BENCH_LOCAL_PORT (55436 by
# default; never 55432, the development cluster). Exit status: pgmq-bench's
# (0 ok, 1 a failed check such as a missing message, 2 refused).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

output=benchmark.json
profile=default
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --output|-o) output="$2"; shift 2 ;;
    --long) profile=long; shift ;;
    --quick) profile=quick; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument $1 (flags for pgmq-bench go after --)" >&2; exit 2 ;;
  esac
done

case "$profile" in
  default) flags=() ;;
  long) flags=(--repeat 5 --warmup 1 --messages 300000 --batch-messages 500000 --single-messages 20000 --duration 5m --sustained-warmup 30s) ;;
  quick) flags=(--repeat 1 --warmup 0 --messages 20000 --batch-messages 20000 --single-messages 2000 --duration 20s --sustained-warmup 3s) ;;
esac

cargo build --release --quiet -p pgmq-bench
bin="${CARGO_TARGET_DIR:-target}/release/pgmq-bench"

rm -f "$output"
status=0
"$bin" --local --local-port "${PGMQ_BENCH_LOCAL_PORT:-55436}" --output "$output" \
  "${flags[@]}" "${extra[@]}" || status=$?

if [ -f "$output" ] && [ "$status" -le 1 ]; then
  "$bin" report "$output" --svg "${output%.json}.svg"
  echo
  echo "Document: $output   Chart: ${output%.json}.svg"
fi
exit "$status"
