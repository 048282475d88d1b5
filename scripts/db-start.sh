#!/usr/bin/env bash
# Start a throwaway native PostgreSQL cluster with PGMQ installed, and print its DSN
# on stdout. Idempotent: a running cluster is reused; a stale one (killed server,
# half-made folder) is recovered. Installs the PostgreSQL server with apt-get when
# its binaries are missing (root only). See db-common.sh for the settings.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/db-common.sh"

bindir="$(find_pg_bin || true)"
if [ -z "$bindir" ]; then
  if [ "$(id -u)" != 0 ]; then
    db_log "PostgreSQL server binaries not found; install them (apt-get install postgresql) and retry"
    exit 1
  fi
  db_log "PostgreSQL server binaries not found: installing with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
  bindir="$(find_pg_bin)"
fi
export PG_CONFIG="$bindir/pg_config"
[ -x "$PG_CONFIG" ] || PG_CONFIG="$(command -v pg_config)"

# PGMQ's SQL into share/extension (fetched from the pinned crate; no-op when present).
"$here/install-pgmq.sh"

mkdir -p "$PGMQ_DB_DIR"
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
  chown postgres: "$PGMQ_DB_DIR"
fi

running() { as_pg "$bindir/pg_ctl" -D "$PGDATA_DIR" status >/dev/null 2>&1; }

if [ -d "$PGDATA_DIR" ] && [ ! -f "$PGDATA_DIR/PG_VERSION" -o ! -f "$PGDATA_DIR/.pgmq-ready" ]; then
  if running; then as_pg "$bindir/pg_ctl" -D "$PGDATA_DIR" stop -m immediate >&2 || true; fi
  db_log "removing a half-made cluster at $PGDATA_DIR"
  rm -rf "$PGDATA_DIR"
fi

if [ ! -d "$PGDATA_DIR" ]; then
  db_log "initdb into $PGDATA_DIR"
  as_pg "$bindir/initdb" -D "$PGDATA_DIR" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 >/dev/null
  cat >>"$PGDATA_DIR/postgresql.conf" <<CONF
# throwaway cluster for pgmq-rs development, tests and benchmarks
listen_addresses = '127.0.0.1'
port = $PGMQ_DB_PORT
unix_socket_directories = '$PGMQ_DB_DIR'
max_connections = 200
shared_buffers = 256MB
logging_collector = off
CONF
  fresh=1
else
  fresh=0
fi

if ! running; then
  # A server killed with SIGKILL leaves postmaster.pid behind; pg_ctl copes unless
  # the pid now belongs to another process.
  if [ -f "$PGDATA_DIR/postmaster.pid" ]; then
    pid="$(head -n1 "$PGDATA_DIR/postmaster.pid")"
    if ! kill -0 "$pid" 2>/dev/null || ! grep -q postgres "/proc/$pid/comm" 2>/dev/null; then
      db_log "removing stale postmaster.pid (pid $pid)"
      rm -f "$PGDATA_DIR/postmaster.pid"
    fi
  fi
  as_pg "$bindir/pg_ctl" -D "$PGDATA_DIR" -l "$PG_LOG" -w -t 60 start >/dev/null
fi

psql_su() { as_pg "$bindir/psql" -h "$PGMQ_DB_DIR" -p "$PGMQ_DB_PORT" -U postgres -v ON_ERROR_STOP=1 -qAt "$@"; }

if [ "$fresh" = 1 ] || [ ! -f "$PGDATA_DIR/.pgmq-ready" ]; then
  sqldir="$("$here/install-pgmq.sh" --print-sql-dir)"
  version="$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$sqldir/pgmq.control")"
  psql_su -d postgres -c "CREATE ROLE pgmq LOGIN SUPERUSER PASSWORD 'pgmq'" >/dev/null
  for db in pgmq pgmq_sqlonly pgmq_none; do
    psql_su -d postgres -c "CREATE DATABASE $db OWNER pgmq" >/dev/null
  done
  psql_su -d pgmq -c "CREATE EXTENSION pgmq" >/dev/null
  as_pg "$bindir/psql" -h "$PGMQ_DB_DIR" -p "$PGMQ_DB_PORT" -U pgmq -d pgmq_sqlonly -v ON_ERROR_STOP=1 -qAt \
    -f - <"$sqldir/pgmq--$version.sql" >/dev/null 2>&1
  as_pg touch "$PGDATA_DIR/.pgmq-ready"
  db_log "cluster ready: PostgreSQL $(psql_su -d pgmq -c 'show server_version'), PGMQ $version"
fi

# pg_partman, when its package is installed (it may arrive after the cluster did).
if [ -f "$("$PG_CONFIG" --sharedir)/extension/pg_partman.control" ]; then
  psql_su -d pgmq -c "CREATE SCHEMA IF NOT EXISTS partman; CREATE EXTENSION IF NOT EXISTS pg_partman SCHEMA partman" >/dev/null
fi

echo "$DSN"
