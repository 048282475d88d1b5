# Shared settings of the throwaway PostgreSQL cluster. Sourced by db-*.sh.
#   PGMQ_DB_PORT   port to listen on (default 55432)
#   PGMQ_DB_DIR    folder of the cluster (default /tmp/pgmq-sdk-db-<port>)
# The cluster listens on 127.0.0.1 only. Role pgmq (superuser, with a password
# generated when the cluster is made) owns three databases: pgmq (PGMQ as an
# extension), pgmq_sqlonly (PGMQ installed by running its SQL, as on managed
# servers) and pgmq_none (no PGMQ at all).
#
# Safe on a machine with other local users:
# - the folder is made fresh by whoever runs the scripts (mode 0711, so the
#   postgres user can reach its own subfolders). An existing folder is used
#   only when it is a real directory (not a symlink) owned by us and writable
#   by nobody else; otherwise the scripts refuse to touch it;
# - inside it, data/ (the cluster) and run/ (its unix socket and log) belong
#   to the server's OS user, mode 0700: other users cannot reach the socket,
#   and local connections use peer authentication (no trust);
# - TCP connections need the pgmq role's password, generated from
#   /dev/urandom and kept in $PGMQ_DB_DIR/dsn (mode 0600, with the DSN);
# - files in folders the postgres user owns are written as that user, so a
#   symlink planted there cannot lead a root-run script anywhere.
PGMQ_DB_PORT="${PGMQ_DB_PORT:-55432}"
PGMQ_DB_DIR="${PGMQ_DB_DIR:-/tmp/pgmq-sdk-db-$PGMQ_DB_PORT}"
PGDATA_DIR="$PGMQ_DB_DIR/data"
PG_RUN_DIR="$PGMQ_DB_DIR/run"
PG_LOG="$PG_RUN_DIR/postgres.log"
DSN_FILE="$PGMQ_DB_DIR/dsn"

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

# The OS user the server runs as, and its superuser role (peer authentication
# maps one to the other): postgres when we are root, else ourselves.
if [ "$(id -u)" = 0 ]; then PG_OS_USER=postgres; else PG_OS_USER="$(id -un)"; fi
PG_SUPERUSER="$PG_OS_USER"

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

# Succeeds when $1 is a real directory (not a symlink) owned by user id $2
# and writable by nobody else (no group or other write bit).
owned_dir() {
  local dir="$1" uid="$2" st
  [ -d "$dir" ] && [ ! -L "$dir" ] || return 1
  st="$(stat -c '%u %a' -- "$dir")" || return 1
  [ "${st%% *}" = "$uid" ] || return 1
  (( (8#${st##* } & 8#022) == 0 ))
}

# A folder made by an older version of these scripts belongs to the
# cluster's OS user (postgres), which root controls anyway: it is accepted,
# and replaced by a fresh one at start.
legacy_db_dir() {
  [ "$(id -u)" = 0 ] && owned_dir "$PGMQ_DB_DIR" "$(id -u postgres 2>/dev/null || echo none)"
}

# Checks that the cluster's folder is ours (see above); exits with a reason
# when it exists and is not.
check_db_dir() {
  if [ -e "$PGMQ_DB_DIR" ] || [ -L "$PGMQ_DB_DIR" ]; then
    if ! owned_dir "$PGMQ_DB_DIR" "$(id -u)" && ! legacy_db_dir; then
      db_log "refusing $PGMQ_DB_DIR: it is not a directory owned by $(id -un) and writable by nobody else (a symlink, another user's folder, or one made by an older version of these scripts). Remove it, or set PGMQ_DB_DIR"
      exit 1
    fi
  fi
}

# Makes the cluster's folder fresh (mkdir fails on anything already there,
# symlinks included, so nothing another user planted is followed), or checks
# an existing one. Refuses a parent that others may write without the sticky
# bit (they could swap the folder out).
make_db_dir() {
  local parent
  parent="$(dirname -- "$PGMQ_DB_DIR")"
  if [ -n "$(find "$parent" -maxdepth 0 -perm -0002 ! -perm -1000 2>/dev/null)" ]; then
    db_log "refusing $PGMQ_DB_DIR: its parent $parent is writable by everyone without the sticky bit"
    exit 1
  fi
  if ! mkdir -m 0711 -- "$PGMQ_DB_DIR" 2>/dev/null; then
    check_db_dir
    if legacy_db_dir; then
      db_log "replacing $PGMQ_DB_DIR, made by an older version of these scripts"
      local bin
      bin="$(find_pg_bin || true)"
      if [ -n "$bin" ] && [ -f "$PGDATA_DIR/postmaster.pid" ]; then
        as_pg "$bin/pg_ctl" -D "$PGDATA_DIR" stop -m immediate >/dev/null 2>&1 || true
      fi
      rm -rf -- "$PGMQ_DB_DIR"
      mkdir -m 0711 -- "$PGMQ_DB_DIR"
    fi
  fi
  # The server's own folders: made here (the parent is ours), then given to it.
  local sub
  for sub in "$PGDATA_DIR" "$PG_RUN_DIR"; do
    if mkdir -m 0700 -- "$sub" 2>/dev/null; then
      if [ "$(id -u)" = 0 ]; then chown postgres:postgres -- "$sub"; fi
    fi
    if ! owned_dir "$sub" "$(id -u "$PG_OS_USER")"; then
      db_log "refusing $sub: not a directory owned by $PG_OS_USER and writable by nobody else"
      exit 1
    fi
  done
}
