#!/usr/bin/env bash
# Installs libpq-dev (pg_config, libpq-fe.h, libpq.so) when missing, as root:
# pgmq-client/tests/dsn_libpq.rs builds a small program against libpq as the
# oracle of the crate's DSN parser, and fails without it.
#
# On Debian, libpq-dev pins libpq5 to its own version, and apt then upgrades
# the PostgreSQL server packages with it. A server that was running through
# that upgrade still runs the old binary but loads the new plpgsql.so, and
# every PL/pgSQL call (all of PGMQ) fails with "undefined symbol". So run
# this before starting any cluster; when it did upgrade the server package,
# it says so and exits 3, and the caller restarts what was running.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/db-common.sh"
have() { [ -e "$(pg_config --includedir 2>/dev/null)/libpq-fe.h" ]; }
if have; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "install-libpq-dev: libpq-dev is missing (apt-get install -y libpq-dev as root)" >&2
  exit 1
fi
server_version() { dpkg-query -W -f='${Version}' 'postgresql-[0-9]*' 2>/dev/null | tr '\n' ' '; }
before="$(server_version)"
apt_install libpq-dev
have || { echo "install-libpq-dev: libpq-fe.h still missing after the install" >&2; exit 1; }
after="$(server_version)"
if [ "$before" != "$after" ]; then
  echo "install-libpq-dev: the PostgreSQL server packages changed ($before-> $after): restart running clusters" >&2
  exit 3
fi
