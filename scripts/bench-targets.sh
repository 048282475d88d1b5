#!/usr/bin/env bash
# The worker runtime's performance targets, checked by the benchmark binary on
# one throwaway local cluster (port ${PGMQ_BENCH_TARGETS_PORT:-55437}, removed
# afterwards), never by timed unit tests:
#   1. empty handler: worker >= 1.4x the one-connection read + delete loop at
#      every handler count (worker_vs_baseline), 8 handlers >= 1 handler
#      (w8_not_below_w1), 8 handlers >= 1.1x the equal-layout loop
#      (consume_w8_vs_equal_layout), batch send >= 0.95x its no-SDK loop
#      (send_batch_vs_baseline), idle CPU <= 1% of a core with ~4 empty
#      reads/s at 250 ms polling (idle_cpu, idle_empty_reads), NOTIFY wake-up
#      p50 <= 5 ms (notify_wakeup_p50);
#   2. a handler awaiting 1 ms: 8 handlers >= 7x the 1-handler rate
#      (handler_1ms_w8_7x);
#   3. backlog: draining 1,000,000 messages >= 0.85x the rate of draining
#      100,000 (backlog_1m_vs_100k);
#   4. memory: scripts/bench-memory.sh (1,000,000 vs 100,000 messages).
# Each run is of the full profile (--full), the sizes the targets were set
# for. Each step writes its document to --out DIR and prints `pgmq-bench check`'s
# table, every target named above required; the exit status is 1 when any
# target is missed or was not measured.
#
#   bash scripts/bench-targets.sh [--out DIR] [--skip-memory]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

out="" memory=1
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --skip-memory) memory=0; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "bench-targets.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || out="$(mktemp -d /tmp/pgmq-bench-targets.XXXXXX)"
mkdir -p "$out"

. scripts/bench-common.sh
bench_build
bench_cluster "${PGMQ_BENCH_TARGETS_PORT:-55437}"

failed=0
echo "## 1. Empty handler"
"$bin" --full --sections send_batch,consume_scaling,baseline,idle_worker,wakeup_latency \
  --output "$out/targets-empty.json" || failed=1
"$bin" check "$out/targets-empty.json" \
  --require worker_vs_baseline,w8_not_below_w1,consume_w8_vs_equal_layout,send_batch_vs_baseline,idle_cpu,idle_empty_reads,notify_wakeup_p50 \
  || failed=1

echo "## 2. Handler awaiting 1 ms"
"$bin" --full --sections consume_scaling --workers 1,8 --handler-work-ms 1 --messages 10000 \
  --output "$out/targets-1ms.json" || failed=1
"$bin" check "$out/targets-1ms.json" --require handler_1ms_w8_7x || failed=1

echo "## 3. Backlog of 1,000,000 against 100,000"
"$bin" --full --sections backlog_scaling --backlog-sizes 100000,1000000 \
  --output "$out/targets-backlog.json" || failed=1
"$bin" check "$out/targets-backlog.json" --require backlog_1m_vs_100k || failed=1

if [ "$memory" = 1 ]; then
  echo "## 4. Memory"
  bash scripts/bench-memory.sh --out "$out" || failed=1
fi
echo "Documents in $out"
exit "$failed"
