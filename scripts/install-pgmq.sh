#!/usr/bin/env bash
# Install PGMQ's SQL into a PostgreSQL server's share/extension/ folder, so that
# `CREATE EXTENSION pgmq` works as it does on a production server.
#
# The SQL is taken, at setup time, from one pinned release of the `pgmq` crate on
# crates.io (its package ships pgmq.control and sql/pgmq.sql). Nothing of PGMQ is
# committed to this repository. The pin and the package checksum live in
# scripts/pgmq-sql/Cargo.toml and scripts/pgmq-sql/Cargo.lock.
#
# Usage: scripts/install-pgmq.sh [--print-sql-dir]
#   --print-sql-dir   only fetch and extract; print the folder holding pgmq.control
#                     and pgmq--<version>.sql (used to install PGMQ SQL-only).
# Env:   PG_CONFIG    the pg_config of the target server (default: found on PATH)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
manifest="$here/pgmq-sql/Cargo.toml"
crate_version="$(sed -n 's/^pgmq = { version = "=\([^"]*\)".*/\1/p' "$manifest")"
checksum="$(awk '/^name = "pgmq"$/{f=1} f&&/^checksum/{gsub(/"/,"",$3); print $3; exit}' "$here/pgmq-sql/Cargo.lock")"
out="${PGMQ_SQL_CACHE:-$root/target/pgmq-sql/$crate_version}"

log() { printf 'install-pgmq: %s\n' "$*" >&2; }

extract() {
  if [ -f "$out/pgmq.control" ] && ls "$out"/pgmq--*.sql >/dev/null 2>&1; then
    return 0
  fi
  log "fetching the pgmq crate $crate_version from crates.io (pinned, checksum verified)"
  host="$(rustc -vV | sed -n 's/^host: //p')"
  cargo fetch --locked --quiet --manifest-path "$manifest" --target "$host"
  cargo_home="${CARGO_HOME:-$HOME/.cargo}"
  pkg="$(ls "$cargo_home"/registry/cache/*/"pgmq-$crate_version.crate" 2>/dev/null | head -n1 || true)"
  [ -n "$pkg" ] || { log "pgmq-$crate_version.crate not found under $cargo_home/registry/cache"; exit 1; }
  got="$(sha256sum "$pkg" | cut -d' ' -f1)"
  [ "$got" = "$checksum" ] || { log "checksum mismatch for $pkg: $got != $checksum"; exit 1; }
  tmp="$(mktemp -d)"
  tar -xzf "$pkg" -C "$tmp" "pgmq-$crate_version/src/install/embedded/pgmq.control" \
    "pgmq-$crate_version/src/install/embedded/sql"
  emb="$tmp/pgmq-$crate_version/src/install/embedded"
  pgmq_version="$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$emb/pgmq.control")"
  mkdir -p "$out"
  cp "$emb/pgmq.control" "$out/pgmq.control"
  cp "$emb/sql/pgmq.sql" "$out/pgmq--$pgmq_version.sql"
  # Upgrade scripts, so that ALTER EXTENSION pgmq UPDATE works from older installs.
  cp "$emb"/sql/pgmq--*--*.sql "$out/"
  rm -rf "$tmp"
  log "PGMQ $pgmq_version extracted to $out"
}

extract
if [ "${1:-}" = "--print-sql-dir" ]; then
  echo "$out"
  exit 0
fi

pg_config="${PG_CONFIG:-pg_config}"
sharedir="$("$pg_config" --sharedir)"
dest="$sharedir/extension"
pgmq_version="$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$out/pgmq.control")"
if cmp -s "$out/pgmq.control" "$dest/pgmq.control" && cmp -s "$out/pgmq--$pgmq_version.sql" "$dest/pgmq--$pgmq_version.sql"; then
  log "PGMQ $pgmq_version already installed in $dest"
  exit 0
fi
if [ ! -w "$dest" ]; then
  log "cannot write to $dest: run as root (or as the owner of PostgreSQL's share folder)"
  exit 1
fi
cp "$out"/pgmq.control "$out"/pgmq--*.sql "$dest/"
log "host change: PGMQ $pgmq_version installed into $dest (pgmq.control and pgmq--*.sql)"
