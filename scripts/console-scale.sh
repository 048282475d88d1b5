#!/usr/bin/env bash
# Measures the operator console at scale: a queue of SCALE_MESSAGES
# messages (default 10,000,000) and SCALE_QUEUES queues (default 10,000)
# in the dev database, then the time each page takes to render, fetched
# with curl from a release build (5 fetches each, the slowest printed).
# The console's promise: every page within a second on this machine.
# A measurement, not a test: not run in CI (filling takes minutes and
# several GB). The queues are named scale_*; SCALE_CLEAN=1 drops them at
# the end.
#
#   bash scripts/console-scale.sh            # the full size
#   SCALE_MESSAGES=100000 SCALE_QUEUES=200 bash scripts/console-scale.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
messages="${SCALE_MESSAGES:-10000000}"
queues="${SCALE_QUEUES:-10000}"
port="${SCALE_PORT:-18499}"
DSN="${PGMQ_TEST_DSN:-$(bash scripts/db-start.sh)}"

psql_() { PGOPTIONS="-c client_min_messages=warning" psql "$DSN" -qAtX -v ON_ERROR_STOP=1 "$@"; }

have="$(psql_ -c "SELECT count(*) FROM pgmq.meta WHERE queue_name LIKE 'scale\_q\_%'")"
if [ "$have" -lt "$queues" ]; then
  echo "creating $((queues - have)) queues"
  # 200 a transaction: each queue locks its new tables until COMMIT.
  for ((from = have; from < queues; from += 200)); do
    to=$((from + 200 < queues ? from + 200 : queues))
    psql_ -c "SELECT pgmq.create('scale_q_' || i) FROM generate_series($from, $to - 1) i" >/dev/null
  done
fi
psql_ -c "SELECT pgmq.create('scale_big'); SELECT pgmq.create('scale_big_dlq')" >/dev/null
rows="$(psql_ -c "SELECT count(*) FROM (SELECT 1 FROM pgmq.q_scale_big LIMIT $messages) t")"
if [ "$rows" -lt "$messages" ]; then
  echo "sending $((messages - rows)) messages to scale_big (one INSERT per million)"
  left=$((messages - rows))
  while [ "$left" -gt 0 ]; do
    n=$((left < 1000000 ? left : 1000000))
    psql_ -c "INSERT INTO pgmq.q_scale_big (vt, message, headers) SELECT clock_timestamp(), \
      jsonb_build_object('order', i, 'customer', 'c' || (i % 1000)), \
      jsonb_build_object('attempts', i % 5) FROM generate_series(1, $n) i"
    left=$((left - n))
  done
fi
if [ "$(psql_ -c "SELECT count(*) FROM (SELECT 1 FROM pgmq.q_scale_big_dlq LIMIT 1) t")" = 0 ]; then
  psql_ -c "INSERT INTO pgmq.q_scale_big_dlq (vt, message, headers) SELECT clock_timestamp(), \
    jsonb_build_object('order', i), jsonb_build_object('reason', 'reason ' || (i % 7), \
    'source_queue', 'scale_big') FROM generate_series(1, 100000) i"
fi
psql_ -c "VACUUM ANALYZE pgmq.q_scale_big"
psql_ -c "VACUUM ANALYZE pgmq.q_scale_big_dlq"

cargo build -q --release -p pgmq-console
DATABASE_URL="$DSN" "${CARGO_TARGET_DIR:-target}/release/pgmq-console" --listen "127.0.0.1:$port" \
  --bench-doc docs/results/dev-machine-6773cc8.json >/dev/null 2>&1 &
console=$!
trap 'kill "$console" 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/fleet" >/dev/null && break; sleep 0.1; done

echo "queues: $((queues + 2))+; scale_big: $messages messages"
worst=0
for path in "/" "/?q=scale_q_9" "/queues/scale_big" \
  "/queues/scale_big?filter=%7B%22customer%22%3A%22c7%22%7D" \
  "/queues/scale_big?after=9000000" "/dead/scale_big_dlq" \
  "/dead/scale_big_dlq?reason=reason%203" "/fleet" "/bench"; do
  slowest=0
  for _ in 1 2 3 4 5; do
    t="$(curl -s -o /dev/null -w '%{http_code} %{time_total}' "http://127.0.0.1:$port$path")"
    [ "${t%% *}" = 200 ] || { echo "$path: HTTP ${t%% *}"; exit 1; }
    slowest="$(python3 -c "print(max($slowest, ${t#* }))")"
  done
  printf '%-60s %6.3f s\n' "$path" "$slowest"
  worst="$(python3 -c "print(max($worst, $slowest))")"
done
echo "slowest page: $worst s"
if [ "${SCALE_CLEAN:-0}" = 1 ]; then
  psql_ -c "SELECT pgmq.drop_queue(queue_name) FROM pgmq.meta WHERE queue_name LIKE 'scale\_%'" >/dev/null
fi
python3 -c "import sys; sys.exit(0 if $worst < 1.0 else 1)" || { echo "a page took a second or more"; exit 1; }
