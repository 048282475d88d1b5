#!/usr/bin/env bash
# The acknowledgement paths side by side, with no SDK: pgbench (C, libpq,
# prepared statements) drains a preloaded queue by `pgmq.read(q, 30, 100)`
# and then deletes the ids it read, either with PGMQ's `pgmq.delete(q, ids)`
# (the function call) or with the fenced statement the worker prepares on the
# queue table (delete only the rows that still hold the delivery read, keyed
# on msg_id and last_read_at). Each run uses a freshly created and vacuumed
# queue; the two paths alternate for a number of rounds, so that they are
# compared in one sitting. Prints messages/s per run and the per-round ratio
# fenced/function.
#
#   bash scripts/ack-paths.sh [messages per run, default 100000] [rounds, default 3]
#
# The database is PGMQ_TEST_DSN, or the throwaway cluster (scripts/db-start.sh,
# started when needed). The password goes to pgbench and psql through the
# environment, never on a command line. The queue is this script's own
# (ackpaths_<pid>_<random>) and is dropped on exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
messages="${1:-100000}"
rounds="${2:-3}"
[ "$messages" -ge 100 ] && [ $((messages % 100)) = 0 ] || { echo "ack-paths: messages must be a multiple of 100" >&2; exit 2; }

dsn="${PGMQ_TEST_DSN:-$(bash scripts/db-start.sh)}"
# PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE from the DSN.
eval "$(python3 -c '
import shlex, sys, urllib.parse
u = urllib.parse.urlparse(sys.stdin.read().strip())
for k, v in (("PGHOST", u.hostname), ("PGPORT", u.port), ("PGUSER", u.username),
             ("PGPASSWORD", urllib.parse.unquote(u.password or "")),
             ("PGDATABASE", u.path.lstrip("/"))):
    if v:
        print("export %s=%s" % (k, shlex.quote(str(v))))
' <<<"$dsn")"
bindir="$(pg_config --bindir 2>/dev/null || ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)"
pgbench="$bindir/pgbench"
[ -x "$pgbench" ] || pgbench="$(command -v pgbench)"

queue="ackpaths_$$_$RANDOM"
work="$(mktemp -d)"
trap 'psql -qAt -c "SELECT pgmq.drop_queue('"'$queue'"')" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

read_line="SELECT pg_catalog.array_agg(msg_id)::text AS ids, pg_catalog.array_agg(last_read_at)::text AS ats FROM pgmq.read('$queue', 30, 100) \\gset"
cat >"$work/function.sql" <<EOF
$read_line
SELECT pgmq.delete('$queue', :ids::bigint[]);
EOF
cat >"$work/fenced.sql" <<EOF
$read_line
WITH d AS (DELETE FROM pgmq."q_$queue" AS m USING ROWS FROM (pg_catalog.unnest(:ids::bigint[]), pg_catalog.unnest(:ats::timestamptz[])) AS r(id, read_at) WHERE m.msg_id = r.id AND m.last_read_at = r.read_at AND m.msg_id = ANY(:ids::bigint[]) RETURNING m.msg_id) SELECT pg_catalog.array_agg(d.msg_id) FROM d;
EOF

fresh_queue() {
  psql -qAt -v ON_ERROR_STOP=1 >/dev/null <<EOF
SELECT pgmq.drop_queue('$queue') FROM pgmq.list_queues() WHERE queue_name = '$queue';
SELECT pgmq.create('$queue');
SELECT pgmq.send_batch('$queue', pg_catalog.array_agg('{"n": 1, "pad": "0123456789012345678901234567890123456789012345678901234567890123456789"}'::jsonb)) FROM pg_catalog.generate_series(1, $messages);
VACUUM ANALYZE pgmq."q_$queue";
EOF
}

# One drain with one path; prints messages/s and checks the queue is empty.
drain() {
  fresh_queue
  local tps left
  tps="$("$pgbench" -n -M prepared -c 1 -t $((messages / 100)) -f "$work/$1.sql" 2>&1 |
    sed -n 's/^tps = \([0-9.]*\) .*without initial connection time.*/\1/p')"
  left="$(psql -qAt -c "SELECT count(*) FROM pgmq.\"q_$queue\"")"
  [ -n "$tps" ] && [ "$left" = 0 ] || { echo "ack-paths: the $1 run failed (tps '$tps', $left messages left)" >&2; exit 1; }
  python3 -c "print(round(float('$tps') * 100))"
}

echo "ack-paths: $messages messages per run, $rounds rounds, read 100 then delete, pgbench -M prepared, one connection"
printf '%-6s %14s %14s %8s\n' round function fenced ratio
for r in $(seq 1 "$rounds"); do
  f="$(drain function)"
  s="$(drain fenced)"
  printf '%-6s %14s %14s %8s\n' "$r" "$f" "$s" "$(python3 -c "print('%.3f' % ($s / $f))")"
done
