#!/usr/bin/env bash
# Best effort: install pg_partman for the installed PostgreSQL major version, so
# that partitioned queues can be tested. Without it those tests are skipped
# with a printed reason.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/db-common.sh"
bindir="$(find_pg_bin || true)"
[ -n "$bindir" ] || exit 0
sharedir="$("$bindir/pg_config" --sharedir 2>/dev/null || pg_config --sharedir)"
[ -f "$sharedir/extension/pg_partman.control" ] && exit 0
[ "$(id -u)" = 0 ] || { db_log "pg_partman missing (not root: not installing)"; exit 0; }
major="$("$bindir/pg_config" --version | sed -n 's/^PostgreSQL \([0-9]*\).*/\1/p')"
apt_install "postgresql-$major-partman" || db_log "pg_partman could not be installed"
