# Shared settings of the throwaway PostgreSQL cluster. Sourced by db-*.sh.
#   PGMQ_DB_PORT   port to listen on, 1024-65535 (default 55432)
#   PGMQ_DB_DIR    folder of the cluster (default /tmp/pgmq-sdk-db-<port>)
#   PGMQ_DB_RESERVE_PORTS  0: leave net.ipv4.ip_local_reserved_ports alone
#                  (see reserve_ports)
# The cluster listens on 127.0.0.1 only. Role pgmq (with a password generated
# when the cluster is made; not a superuser, see below) owns three databases:
# pgmq (PGMQ as an extension), pgmq_sqlonly (PGMQ installed by running its
# SQL, as on managed servers) and pgmq_none (no PGMQ at all).
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
# - no superuser logs in over TCP: while the server is down (the fault suite
#   stops it on purpose) any local user may bind its port and ask a client
#   for its password in clear text, so the DSN's role pgmq is no superuser
#   (it may create databases, read the statistics and settings, and turn
#   default_transaction_read_only with ALTER SYSTEM and reload, which the
#   tests, the benchmark and the fault suite need), and pg_hba.conf refuses
#   the superuser over TCP; the superuser has no password and gets in only
#   over the 0700 socket, by peer authentication;
# - files in folders the postgres user owns are written as that user, so a
#   symlink planted there cannot lead a root-run script anywhere.
PGMQ_DB_PORT="${PGMQ_DB_PORT:-55432}"

db_log() { printf 'pgmq-db: %s\n' "$*" >&2; }

# The Debian packages installed now, one name a line, sorted.
installed_packages() {
  dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' 2>/dev/null | awk '$1 == "ii" { print $2 }' | sort
}

# Installs Debian packages "$@" with apt-get (as root), saying on stderr
# before that it changes the host, and after which packages it added (the
# named ones and their dependencies). The package lists are updated only
# when the first try cannot find a package.
apt_install() {
  local before added
  before="$(installed_packages)"
  db_log "host change: apt-get install $* (with their dependencies)"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq "$@" >/dev/null 2>&1; then
    apt-get update -qq >&2 || true
    apt-get install -y -qq "$@" >&2 || { db_log "apt-get install $* failed"; return 1; }
  fi
  added="$(comm -13 <(printf '%s\n' "$before") <(installed_packages) | tr '\n' ' ')"
  db_log "host change: apt-get installed ${added:-no new package}"
}

# Succeeds when $1 is a TCP port number in 1024-65535 (digits only, no
# leading zero).
valid_port() {
  [[ "$1" =~ ^[1-9][0-9]{3,4}$ ]] && [ "$1" -ge 1024 ] && [ "$1" -le 65535 ]
}

# Checked before anything else runs: the port goes into the server's
# configuration and the host-wide reserved ports.
if ! valid_port "$PGMQ_DB_PORT"; then
  db_log "PGMQ_DB_PORT=$PGMQ_DB_PORT is not a port number in 1024-65535"
  exit 2
fi
PGMQ_DB_DIR="${PGMQ_DB_DIR:-/tmp/pgmq-sdk-db-$PGMQ_DB_PORT}"
PGDATA_DIR="$PGMQ_DB_DIR/data"
PG_RUN_DIR="$PGMQ_DB_DIR/run"
PG_LOG="$PG_RUN_DIR/postgres.log"
DSN_FILE="$PGMQ_DB_DIR/dsn"

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

# The ports this project's servers listen on: the clusters (55432-55438), the
# fault suite's proxy (55434), PgBouncer (55439), the campaign tests
# (55440-55449), the setup-script tests (55450-55459) and the tests that kill
# a cluster of their own (55460-55469). They lie inside Linux's ephemeral range (32768-60999), so an
# outgoing connection of any process may take one of them as its local port;
# while that socket is open, and for 60 s after it closes (TIME_WAIT), no
# server can listen there ("could not bind IPv4 address: Address already in
# use"). A fault run opens thousands of connections, so a cluster started
# right after it hit this now and then. As root, reserve_ports adds the block
# (and the cluster's own port, when outside it) to
# net.ipv4.ip_local_reserved_ports, which the kernel never hands out as an
# ephemeral port; entries already there are kept, it lasts until reboot, and
# what it added is logged. PGMQ_DB_RESERVE_PORTS=0 leaves the setting alone.
# Without root nothing changes, and start_server's wait covers a busy port.
PGMQ_PORT_BLOCK="55432-55469"

# Succeeds when port $1 is in the reserved list $2 (the kernel's format:
# comma-separated ports and ranges).
port_listed() {
  local port="$1" item lo hi
  local IFS=,
  for item in $2; do
    lo="${item%-*}"; hi="${item#*-}"
    [ -n "$lo" ] && [ "$port" -ge "$lo" ] && [ "$port" -le "$hi" ] && return 0
  done
  return 1
}

reserve_ports() {
  local f=/proc/sys/net/ipv4/ip_local_reserved_ports cur add=""
  [ "$(id -u)" = 0 ] && [ -w "$f" ] || return 0
  if [ "${PGMQ_DB_RESERVE_PORTS:-1}" = 0 ]; then
    db_log "PGMQ_DB_RESERVE_PORTS=0: leaving net.ipv4.ip_local_reserved_ports alone"
    return 0
  fi
  # Checked at the top already; again here, right before the host-wide write.
  valid_port "$PGMQ_DB_PORT" || return 1
  cur="$(tr -d ' \n' <"$f" 2>/dev/null)" || return 0
  port_listed "${PGMQ_PORT_BLOCK%-*}" "$cur" && port_listed "${PGMQ_PORT_BLOCK#*-}" "$cur" \
    || add="$PGMQ_PORT_BLOCK"
  port_listed "$PGMQ_DB_PORT" "$cur${add:+,$add}" || add="${add:+$add,}$PGMQ_DB_PORT"
  [ -z "$add" ] && return 0
  if printf '%s\n' "${cur:+$cur,}$add" >"$f" 2>/dev/null; then
    db_log "host change: reserved ports $add against ephemeral use: net.ipv4.ip_local_reserved_ports was '${cur}', now '$(tr -d ' \n' <"$f")' (until reboot; PGMQ_DB_RESERVE_PORTS=0 turns this off)"
  fi
}

# Starts the server of $PGDATA_DIR with the binaries in $1. When it cannot
# bind its port because a socket of some other process holds it (see
# reserve_ports: one reserved too late, or no root), it waits and tries again
# for up to 75 s, longer than TIME_WAIT lasts. On failure it prints pg_ctl's
# message and the end of the server's log, so the cause is in the output.
start_server() {
  local bindir="$1" deadline=$((SECONDS + 75)) out
  reserve_ports
  while :; do
    if out="$(as_pg "$bindir/pg_ctl" -D "$PGDATA_DIR" -l "$PG_LOG" -w -t 60 start 2>&1)"; then
      return 0
    fi
    if [ "$SECONDS" -lt "$deadline" ] \
      && as_pg tail -n 20 "$PG_LOG" 2>/dev/null | grep -q "Address already in use"; then
      db_log "port $PGMQ_DB_PORT is held by another socket (an outgoing connection, or one in TIME_WAIT): retrying"
      sleep 3
      continue
    fi
    db_log "the server did not start: $out"
    db_log "the end of $PG_LOG:"
    as_pg tail -n 20 "$PG_LOG" >&2 2>/dev/null || true
    return 1
  done
}
