#!/usr/bin/env bash
# The worker's memory target, checked by the benchmark binary: peak RSS while
# draining a 1,000,000-message backlog at most 64 MiB, and within 10% of the
# figure for 100,000. Two consume_scaling runs (one round each, no warm-up),
# then `pgmq-bench check-memory`, which prints the table and exits 1 on a miss.
#
#   bash scripts/bench-memory.sh [--workers 8] [--small 100000] [--large 1000000] [--out DIR]
#
# Uses PGMQ_BENCH_DSN when set (a database the benchmark may use); otherwise a
# throwaway cluster on port ${PGMQ_BENCH_MEMORY_PORT:-55437}, removed afterwards.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

workers=8 small=100000 large=1000000 out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) workers="$2"; shift 2 ;;
    --small) small="$2"; shift 2 ;;
    --large) large="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "bench-memory.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || out="$(mktemp -d /tmp/pgmq-bench-memory.XXXXXX)"
mkdir -p "$out"

. scripts/bench-common.sh
bench_build
[ -n "${PGMQ_BENCH_DSN:-}" ] || bench_cluster "${PGMQ_BENCH_MEMORY_PORT:-55437}"

common=(--sections consume_scaling --workers "$workers" --repeat 1 --warmup 0)
"$bin" "${common[@]}" --messages "$small" --output "$out/memory-small.json"
"$bin" "${common[@]}" --messages "$large" --output "$out/memory-large.json"
echo "Documents: $out/memory-small.json $out/memory-large.json"
"$bin" check-memory "$out/memory-small.json" "$out/memory-large.json"
