# Shared settings of the throwaway PostgreSQL cluster. Sourced by db-*.sh.
#   PGMQ_DB_PORT   port to listen on (default 55432)
#   PGMQ_DB_DIR    folder of the cluster (default /tmp/pgmq-sdk-db-<port>)
# The cluster listens on 127.0.0.1 only. Role pgmq (password pgmq, superuser)
# owns three databases: pgmq (PGMQ as an extension), pgmq_sqlonly (PGMQ installed
# by running its SQL, as on managed servers) and pgmq_none (no PGMQ at all).
PGMQ_DB_PORT="${PGMQ_DB_PORT:-55432}"
PGMQ_DB_DIR="${PGMQ_DB_DIR:-/tmp/pgmq-sdk-db-$PGMQ_DB_PORT}"
PGDATA_DIR="$PGMQ_DB_DIR/data"
PG_LOG="$PGMQ_DB_DIR/postgres.log"
DSN="postgres://pgmq:pgmq@127.0.0.1:$PGMQ_DB_PORT/pgmq"

db_log() { printf 'pgmq-db: %s\n' "$*" >&2; }

find_pg_bin() {
  local bindir=""
  if command -v pg_config >/dev/null 2>&1; then
    bindir="$(pg_config --bindir 2>/dev/null || true)"
  fi
  if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
    bindir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)"
  fi
  [ -n "$bindir" ] && [ -x "$bindir/initdb" ] && echo "$bindir"
}

# Runs a command as the cluster's OS user: postgres when we are root. From
# /, with absolute paths: the checkout may sit in a directory postgres cannot
# enter (mktemp -d makes it 0700), and initdb and pg_ctl fail in a working
# directory they cannot open.
as_pg() {
  if [ "$(id -u)" = 0 ]; then
    (cd / && runuser -u postgres -- "$@")
  else
    "$@"
  fi
}
