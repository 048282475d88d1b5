#!/usr/bin/env bash
# Start a throwaway PgBouncer in transaction pooling mode in front of the
# throwaway cluster (db-start.sh, started first if needed), and print its DSN
# on stdout (it holds the cluster's generated password: capture it, do not
# log it). Installs pgbouncer from Debian's packages when missing (root).
#   PGMQ_PGBOUNCER_PORT  port to listen on (default 55439)
# Its files live in $PGMQ_DB_DIR/run/pgbouncer (the server's OS user's,
# mode 0700); db-stop.sh stops it with the cluster.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/db-common.sh"
port="${PGMQ_PGBOUNCER_PORT:-55439}"
valid_port "$port" || { db_log "PGMQ_PGBOUNCER_PORT=$port is not a port number in 1024-65535"; exit 2; }

if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
  if [ "$(id -u)" != 0 ]; then
    db_log "pgbouncer not found; install it (apt-get install pgbouncer) and retry"
    exit 1
  fi
  db_log "pgbouncer not found: installing it"
  apt_install pgbouncer
fi
bouncer="$(command -v pgbouncer || echo /usr/sbin/pgbouncer)"

direct="$("$here/db-start.sh")"
password="$(python3 -c 'import sys, urllib.parse; print(urllib.parse.unquote(urllib.parse.urlparse(sys.stdin.read().strip()).password or ""))' <<<"$direct")"
[ -n "$password" ] || { db_log "the cluster's DSN has no password"; exit 1; }
dir="$PG_RUN_DIR/pgbouncer"
dsn="postgres://pgmq:$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.stdin.read().strip(), safe=""))' <<<"$password")@127.0.0.1:$port/pgmq"

# The pid file is the server's OS user's: read and signalled as that user.
if as_pg sh -c 'pid="$(head -n1 "$1" 2>/dev/null | tr -cd 0-9)"; [ -n "$pid" ] && kill -0 "$pid"' \
  sh "$dir/pgbouncer.pid" 2>/dev/null; then
  echo "$dsn"
  exit 0
fi
as_pg mkdir -p -m 0700 "$dir"
# Written as the server's OS user, from stdin: no password on a command line,
# no root write into a folder another user controls.
as_pg tee "$dir/userlist.txt" >/dev/null <<EOF2
"pgmq" "$password"
EOF2
as_pg chmod 0600 "$dir/userlist.txt"
as_pg tee "$dir/pgbouncer.ini" >/dev/null <<EOF2
[databases]
pgmq = host=127.0.0.1 port=$PGMQ_DB_PORT dbname=pgmq

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = scram-sha-256
auth_file = $dir/userlist.txt
pool_mode = transaction
max_client_conn = 400
default_pool_size = 20
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
ignore_startup_parameters = extra_float_digits
EOF2
as_pg "$bouncer" -d -q "$dir/pgbouncer.ini"
for _ in $(seq 1 50); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    db_log "pgbouncer 1.$("$bouncer" --version | sed -n 's/^PgBouncer 1\.\([0-9.]*\).*/\1/p') ready on $port (transaction pooling)"
    echo "$dsn"
    exit 0
  fi
  sleep 0.1
done
db_log "pgbouncer did not start; see $dir/pgbouncer.log"
exit 1
