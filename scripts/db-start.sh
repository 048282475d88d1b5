#!/usr/bin/env bash
# Start a throwaway native PostgreSQL cluster with PGMQ installed, and print its DSN
# on stdout (unless stdout is a terminal; the DSN, with the generated password,
# is also in $PGMQ_DB_DIR/dsn, mode 0600). Idempotent: a running cluster is
# reused; a stale one (killed server, half-made folder) is recovered. Installs the PostgreSQL server with apt-get when
# its binaries are missing (root only). Every change it makes to the host outside
# its folder is said on stderr as "pgmq-db: host change: ...". See db-common.sh
# for the settings.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/db-common.sh"

bindir="$(find_pg_bin || true)"
if [ -z "$bindir" ]; then
  if [ "$(id -u)" != 0 ]; then
    db_log "PostgreSQL server binaries not found; install them (apt-get install postgresql) and retry"
    exit 1
  fi
  db_log "PostgreSQL server binaries not found: installing them"
  apt_install postgresql
  bindir="$(find_pg_bin)"
  # Debian's package makes a cluster of its own (on port 5432) and may
  # start it; these scripts never use or stop it: say it is there.
  if command -v pg_lsclusters >/dev/null 2>&1; then
    while read -r ver name port state _; do
      db_log "host change: Debian's postgresql package made its own cluster $ver/$name on port $port ($state); these scripts leave it alone (pg_dropcluster --stop $ver $name removes it)"
    done < <(pg_lsclusters --no-header 2>/dev/null || true)
  fi
fi
export PG_CONFIG="$bindir/pg_config"
[ -x "$PG_CONFIG" ] || PG_CONFIG="$(command -v pg_config)"

# PGMQ's SQL into share/extension (fetched from the pinned crate; no-op when present).
"$here/install-pgmq.sh"

if [ "$(id -u)" = 0 ]; then
  if ! id postgres >/dev/null 2>&1; then
    db_log "host change: creating the system user postgres (home /var/lib/postgresql), the OS user the cluster runs as"
    useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
  fi
fi
make_db_dir

running() { as_pg "$bindir/pg_ctl" -D "$PGDATA_DIR" status >/dev/null 2>&1; }

# In data/ (the postgres user's), test and read files as that user.
pg_file() { as_pg test -f "$PGDATA_DIR/$1"; }

# Half-made: initdb ran but setup did not finish, or initdb did not finish.
if { pg_file PG_VERSION && ! pg_file .pgmq-ready; } \
  || { ! pg_file PG_VERSION && [ -n "$(as_pg ls -A "$PGDATA_DIR")" ]; }; then
  if running; then as_pg "$bindir/pg_ctl" -D "$PGDATA_DIR" stop -m immediate >&2 || true; fi
  db_log "removing a half-made cluster at $PGDATA_DIR"
  as_pg find "$PGDATA_DIR" -mindepth 1 -delete
fi

if ! pg_file PG_VERSION; then
  db_log "initdb into $PGDATA_DIR"
  # Local (socket) connections: peer, so only the OS user of the same name
  # gets in (the socket's folder is 0700 besides). TCP: SCRAM passwords.
  as_pg "$bindir/initdb" -D "$PGDATA_DIR" -U "$PG_SUPERUSER" --auth-local=peer --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 >/dev/null
  # The superuser never over TCP (see db-common.sh): first match wins.
  as_pg sed -i "1i host all $PG_SUPERUSER all reject" "$PGDATA_DIR/pg_hba.conf"
  as_pg tee -a "$PGDATA_DIR/postgresql.conf" >/dev/null <<CONF
# throwaway cluster for this SDK's development, tests and benchmarks
listen_addresses = '127.0.0.1'
port = $PGMQ_DB_PORT
unix_socket_directories = '$PG_RUN_DIR'
unix_socket_permissions = 0700
max_connections = 200
shared_buffers = 256MB
logging_collector = off
CONF
  rm -f -- "$DSN_FILE"
  fresh=1
else
  fresh=0
fi

if ! running; then
  # A server killed with SIGKILL leaves postmaster.pid behind; pg_ctl copes unless
  # the pid now belongs to another process.
  if pg_file postmaster.pid; then
    pid="$(as_pg head -n1 "$PGDATA_DIR/postmaster.pid" | tr -cd 0-9)"
    if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null || ! grep -q postgres "/proc/$pid/comm" 2>/dev/null; then
      db_log "removing stale postmaster.pid (pid ${pid:-?})"
      as_pg rm -f "$PGDATA_DIR/postmaster.pid"
    fi
  fi
  start_server "$bindir"
fi

psql_su() { as_pg "$bindir/psql" -h "$PG_RUN_DIR" -p "$PGMQ_DB_PORT" -U "$PG_SUPERUSER" -v ON_ERROR_STOP=1 -qAt "$@"; }

# A cluster made before the pgmq role lost its superuser status keeps it
# (its objects belong to the superuser); say how to get the safer one.
attrs="LOGIN NOSUPERUSER CREATEDB"
if pg_file .pgmq-ready && ! pg_file .pgmq-nosuperuser; then
  attrs=""
  db_log "$PGDATA_DIR was made by an older version of these scripts: its role pgmq is a superuser that logs in over TCP. Run db-stop.sh, then db-start.sh, to remake it"
fi

# The pgmq role's password: generated, never on a command line (SQL goes in
# on stdin), kept only in the 0600 DSN file.
if [ "$fresh" = 1 ] || ! pg_file .pgmq-ready || [ ! -f "$DSN_FILE" ]; then
  password="$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
  [ "${#password}" = 32 ] || { db_log "could not read /dev/urandom"; exit 1; }
  (umask 077; rm -f -- "$DSN_FILE"; printf 'postgres://pgmq:%s@127.0.0.1:%s/pgmq\n' "$password" "$PGMQ_DB_PORT" >"$DSN_FILE")
  if psql_su -d postgres -c "SELECT 1 FROM pg_roles WHERE rolname = 'pgmq'" | grep -q 1; then
    verb=ALTER
  else
    verb=CREATE
  fi
  printf "%s ROLE pgmq %s PASSWORD '%s';\n" "$verb" "$attrs" "$password" | psql_su -d postgres >/dev/null
  unset password
fi

if [ "$fresh" = 1 ] || ! pg_file .pgmq-ready; then
  sqldir="$("$here/install-pgmq.sh" --print-sql-dir)"
  version="$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$sqldir/pgmq.control")"
  # What the tests, the benchmark and the fault suite do beyond owning their
  # databases: read every session's statistics and the settings, and switch
  # the cluster read-only and back (ALTER SYSTEM on that one parameter, PG 15
  # and later, and a reload). A function's grant holds in its database:
  # template1's is copied into every database made after it.
  psql_su -d postgres -c "GRANT pg_monitor TO pgmq" >/dev/null
  for db in template1 postgres; do
    psql_su -d "$db" -c "GRANT EXECUTE ON FUNCTION pg_reload_conf() TO pgmq" >/dev/null
  done
  if [ "$(psql_su -d postgres -c 'show server_version_num')" -ge 150000 ]; then
    psql_su -d postgres -c "GRANT ALTER SYSTEM ON PARAMETER default_transaction_read_only TO pgmq" >/dev/null
  fi
  for db in pgmq pgmq_sqlonly pgmq_none; do
    psql_su -d postgres -c "CREATE DATABASE $db OWNER pgmq" >/dev/null
  done
  # As role pgmq (the owner: the queues' tables go in its schema), over the
  # socket as the superuser would make postgres own the objects; SET ROLE
  # keeps peer authentication.
  psql_su -d pgmq -c "SET ROLE pgmq" -c "CREATE EXTENSION pgmq" >/dev/null
  { echo "SET ROLE pgmq;"; cat "$sqldir/pgmq--$version.sql"; } | psql_su -d pgmq_sqlonly -f - >/dev/null 2>&1
  as_pg touch "$PGDATA_DIR/.pgmq-nosuperuser"
  as_pg touch "$PGDATA_DIR/.pgmq-ready"
  db_log "cluster ready: PostgreSQL $(psql_su -d pgmq -c 'show server_version'), PGMQ $version"
fi

# The security tests (pgmq-client/tests/sdk_security.rs) play other roles
# on this throwaway cluster (tenants, a role that squats a schema): role
# pgmq creates and drops them. Idempotent, so older clusters get it too.
if pg_file .pgmq-nosuperuser; then
  psql_su -d postgres -c "ALTER ROLE pgmq CREATEROLE" >/dev/null
fi

# pg_partman, when its package is installed (it may arrive after the cluster did).
if [ -f "$("$PG_CONFIG" --sharedir)/extension/pg_partman.control" ]; then
  psql_su -d pgmq -c "CREATE SCHEMA IF NOT EXISTS partman; CREATE EXTENSION IF NOT EXISTS pg_partman SCHEMA partman" >/dev/null
  # pg_partman needs a superuser to install; role pgmq uses it (partitioned
  # queues) with the grants its documentation lists.
  psql_su -d pgmq -c "GRANT ALL ON SCHEMA partman TO pgmq" \
    -c "GRANT ALL ON ALL TABLES IN SCHEMA partman TO pgmq" \
    -c "GRANT ALL ON ALL SEQUENCES IN SCHEMA partman TO pgmq" \
    -c "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA partman TO pgmq" \
    -c "GRANT EXECUTE ON ALL PROCEDURES IN SCHEMA partman TO pgmq" >/dev/null
fi

# The DSN (with the password) on stdout for scripts that capture it
# (DATABASE_URL="$(bash scripts/db-start.sh)"); never onto a terminal.
if [ -t 1 ]; then
  db_log "DSN (with its password) in $DSN_FILE: export DATABASE_URL=\"\$(cat $DSN_FILE)\""
else
  cat -- "$DSN_FILE"
fi
