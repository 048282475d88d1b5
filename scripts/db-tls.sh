#!/usr/bin/env bash
# Start (or reuse) a throwaway cluster with TLS on, for the TLS tests of
# pgmq-client: its own port (PGMQ_TLS_PORT, default 55438), a private CA and a
# server certificate for localhost/127.0.0.1 made with openssl, and TCP
# connections only over TLS (pg_hba `hostssl`: sslmode=disable is refused).
# Prints the DSN (sslmode=require; not onto a terminal) on stdout; the CA
# certificate is at
# /tmp/pgmq-sdk-db-<port>/tls/ca.crt, and other-ca.crt beside it is a CA that
# did not sign the server's certificate (for the tests' wrong-CA cases). Stop
# it with
#   PGMQ_DB_PORT=<port> bash scripts/db-stop.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PGMQ_DB_PORT="${PGMQ_TLS_PORT:-55438}"
. "$here/db-common.sh"
command -v openssl >/dev/null || { db_log "openssl is needed for the TLS cluster"; exit 1; }

"$here/db-start.sh" >/dev/null

# The certificates: made by us in tls/ (in our folder, mode 0755 so that the
# tests can read ca.crt; keys 0600), fresh each time they are (re)made. The
# server's copies are written into data/ as the postgres user.
tls="$PGMQ_DB_DIR/tls"
if [ ! -f "$tls/ca.crt" ] || [ ! -f "$tls/other-ca.crt" ] || ! as_pg test -f "$PGDATA_DIR/server.crt"; then
  rm -rf -- "$tls"
  mkdir -m 0700 -- "$tls"
  (
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=pgmq-sdk test CA" \
      -keyout "$tls/ca.key" -out "$tls/ca.crt" 2>/dev/null
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=pgmq-sdk test CA" \
      -keyout "$tls/other-ca.key" -out "$tls/other-ca.crt" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
      -keyout "$tls/server.key" -out "$tls/server.csr" 2>/dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' >"$tls/ext.cnf"
    openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" -CAcreateserial \
      -days 3650 -extfile "$tls/ext.cnf" -out "$tls/server.crt" 2>/dev/null
  )
  # rm then write, as postgres: a symlink there leads nowhere postgres
  # could not already write.
  as_pg sh -c 'umask 077; rm -f "$1" && cat >"$1"' sh "$PGDATA_DIR/server.key" <"$tls/server.key"
  as_pg sh -c 'umask 022; rm -f "$1" && cat >"$1"' sh "$PGDATA_DIR/server.crt" <"$tls/server.crt"
  chmod 0644 "$tls/ca.crt" "$tls/other-ca.crt" "$tls/server.crt"
  chmod 0755 "$tls"
fi

bindir="$(find_pg_bin)"
# TCP only over TLS: every `host` line of pg_hba.conf becomes `hostssl`.
as_pg sed -i -E 's/^host([[:space:]])/hostssl\1/' "$PGDATA_DIR/pg_hba.conf"
psql_su() { as_pg "$bindir/psql" -h "$PG_RUN_DIR" -p "$PGMQ_DB_PORT" -U "$PG_SUPERUSER" -d postgres -v ON_ERROR_STOP=1 -qAt "$@"; }
psql_su -c "ALTER SYSTEM SET ssl = on" -c "SELECT pg_reload_conf()" >/dev/null
# The reload is asynchronous: wait until new sessions see it.
for _ in $(seq 50); do
  on="$(psql_su -c "SHOW ssl")"
  [ "$on" = on ] && break
  sleep 0.1
done
# The DSN of db-start.sh, for localhost (the certificate's name) and TLS.
dsn="$(sed -e 's/@127\.0\.0\.1:/@localhost:/' -e 's/$/?sslmode=require/' "$DSN_FILE")"
if [ -t 1 ]; then
  db_log "DSN: the one in $DSN_FILE, with host localhost and ?sslmode=require"
else
  printf '%s\n' "$dsn"
fi
