#!/usr/bin/env bash
# Control a running throwaway cluster without removing it; used by the fault tests.
#   db-ctl.sh kill      stop the server at once (pg_ctl stop -m immediate: a crash)
#   db-ctl.sh start     start it again (crash recovery runs)
#   db-ctl.sh restart   kill, then start
#   db-ctl.sh status    exit 0 when running
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/db-common.sh"
check_db_dir
bindir="$(find_pg_bin)"
case "${1:-}" in
  kill) as_pg "$bindir/pg_ctl" -D "$PGDATA_DIR" stop -m immediate -w >/dev/null ;;
  start) start_server "$bindir" ;;
  restart) "$0" kill; "$0" start ;;
  status) as_pg "$bindir/pg_ctl" -D "$PGDATA_DIR" status >/dev/null 2>&1 ;;
  *) echo "usage: $0 kill|start|restart|status" >&2; exit 2 ;;
esac
