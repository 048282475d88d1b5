#!/usr/bin/env bash
# Start (or reuse) a throwaway cluster with TLS on, for the TLS tests of
# pgmq-client: its own port (PGMQ_TLS_PORT, default 55438), a private CA and a
# server certificate for localhost/127.0.0.1 made with openssl, and TCP
# connections only over TLS (pg_hba `hostssl`: sslmode=disable is refused).
# Prints the DSN (sslmode=require) on stdout; the CA certificate is at
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

tls="$PGMQ_DB_DIR/tls"
if [ ! -f "$tls/ca.crt" ] || [ ! -f "$tls/other-ca.crt" ] || [ ! -f "$PGDATA_DIR/server.crt" ]; then
  rm -rf "$tls"
  mkdir -p "$tls"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=pgmq-sdk test CA" \
    -keyout "$tls/ca.key" -out "$tls/ca.crt" 2>/dev/null
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=pgmq-sdk test CA" \
    -keyout "$tls/other-ca.key" -out "$tls/other-ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
    -keyout "$tls/server.key" -out "$tls/server.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' >"$tls/ext.cnf"
  openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" -CAcreateserial \
    -days 3650 -extfile "$tls/ext.cnf" -out "$tls/server.crt" 2>/dev/null
  install -m 0600 "$tls/server.key" "$PGDATA_DIR/server.key"
  install -m 0644 "$tls/server.crt" "$PGDATA_DIR/server.crt"
  if [ "$(id -u)" = 0 ]; then chown postgres: "$PGDATA_DIR/server.key" "$PGDATA_DIR/server.crt"; fi
  chmod 0755 "$tls"; chmod 0644 "$tls/ca.crt" "$tls/other-ca.crt"; chmod 0600 "$tls"/*.key
fi

bindir="$(find_pg_bin)"
# TCP only over TLS: every `host` line of pg_hba.conf becomes `hostssl`.
as_pg sed -i -E 's/^host([[:space:]])/hostssl\1/' "$PGDATA_DIR/pg_hba.conf"
as_pg "$bindir/psql" -h "$PGMQ_DB_DIR" -p "$PGMQ_DB_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qAt \
  -c "ALTER SYSTEM SET ssl = on" -c "SELECT pg_reload_conf()" >/dev/null
# The reload is asynchronous: wait until new sessions see it.
for _ in $(seq 50); do
  on="$(as_pg "$bindir/psql" -h "$PGMQ_DB_DIR" -p "$PGMQ_DB_PORT" -U postgres -d postgres -qAt -c "SHOW ssl")"
  [ "$on" = on ] && break
  sleep 0.1
done
echo "postgres://pgmq:pgmq@localhost:$PGMQ_DB_PORT/pgmq?sslmode=require"
