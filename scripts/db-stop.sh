#!/usr/bin/env bash
# Stop the throwaway cluster started by db-start.sh and remove its folder.
# Idempotent: nothing to stop is not an error. A folder that is not ours (see
# db-common.sh) is left alone, with an error.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/db-common.sh"
if [ ! -e "$PGMQ_DB_DIR" ] && [ ! -L "$PGMQ_DB_DIR" ]; then
  db_log "nothing at $PGMQ_DB_DIR"
  exit 0
fi
check_db_dir
# A PgBouncer started by pgbouncer-start.sh in front of this cluster. Its
# pid file lies in a folder of the server's OS user, who may write any pid
# there: read it and signal as that user, so it reaches only that user's
# own processes (and never a group: digits only).
if as_pg test -f "$PG_RUN_DIR/pgbouncer/pgbouncer.pid"; then
  as_pg sh -c 'pid="$(head -n1 "$1" | tr -cd 0-9)"; [ -n "$pid" ] && kill "$pid"' \
    sh "$PG_RUN_DIR/pgbouncer/pgbouncer.pid" 2>/dev/null || true
fi
bindir="$(find_pg_bin || true)"
if [ -n "$bindir" ] && as_pg test -f "$PGDATA_DIR/postmaster.pid"; then
  as_pg "$bindir/pg_ctl" -D "$PGDATA_DIR" stop -m fast -w -t 60 >/dev/null 2>&1 \
    || as_pg "$bindir/pg_ctl" -D "$PGDATA_DIR" stop -m immediate >/dev/null 2>&1 || true
fi
# rm -rf does not follow symlinks; the folder is ours and nobody else's to change.
rm -rf -- "$PGMQ_DB_DIR"
db_log "stopped and removed $PGMQ_DB_DIR"
