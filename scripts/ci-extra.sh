#!/usr/bin/env bash
# Keeps the examples and the Docker files from rotting. Called by .ci/run after
# the test binaries build, before the tests; runs on its own too (it starts the
# throwaway cluster if needed):
#
#   bash scripts/ci-extra.sh
#
# 1. docker/Dockerfile pins the same PGMQ crate (version and SHA-256) as
#    scripts/pgmq-sql, which the native cluster installs from.
# 2. Every [[example]] of examples/Cargo.toml is built, then run against the
#    throwaway database (port 55432) with `--demo` (examples that would run
#    until Ctrl-C stop on their own) and a time limit; so is pgmq-client's
#    statement_modes example, with a few calls and one round. An example fails
#    the script if it exits non-zero, runs past the limit, or leaves a queue
#    behind.
#
# Env: PGMQ_EXAMPLE_TIMEOUT  seconds allowed per example (default 120)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/db-common.sh

log() { printf 'ci-extra: %s\n' "$*"; }
fail() { printf 'ci-extra: FAIL: %s\n' "$*" >&2; exit 1; }

# --- 1. the Docker image installs the PGMQ the tests run against -------------
want_version="$(sed -n 's/^pgmq = { version = "=\([^"]*\)".*/\1/p' scripts/pgmq-sql/Cargo.toml)"
want_sha="$(awk '/^name = "pgmq"$/{f=1} f&&/^checksum/{gsub(/"/,"",$3); print $3; exit}' scripts/pgmq-sql/Cargo.lock)"
have_version="$(sed -n 's/^ARG PGMQ_CRATE_VERSION=//p' docker/Dockerfile)"
have_sha="$(sed -n 's/^ARG PGMQ_CRATE_SHA256=//p' docker/Dockerfile)"
[ -n "$want_version" ] && [ -n "$want_sha" ] || fail "could not read the PGMQ pin from scripts/pgmq-sql"
[ "$have_version" = "$want_version" ] || fail "docker/Dockerfile pins pgmq crate $have_version, scripts/pgmq-sql pins $want_version"
[ "$have_sha" = "$want_sha" ] || fail "docker/Dockerfile's PGMQ_CRATE_SHA256 differs from scripts/pgmq-sql/Cargo.lock"
log "docker/Dockerfile pins pgmq crate $want_version, as scripts/pgmq-sql does"

# --- 2. every example, built and run -----------------------------------------
DATABASE_URL="$(bash scripts/db-start.sh)"
export DATABASE_URL
unset PGMQ_EXAMPLES_DEMO
bindir="$(find_pg_bin)" || fail "PostgreSQL binaries not found"
# Over the cluster's socket as its superuser (peer authentication): no
# password on psql's command line.
queues() {
  as_pg "$bindir/psql" -h "$PG_RUN_DIR" -p "$PGMQ_DB_PORT" -U "$PG_SUPERUSER" -d pgmq -qAtX \
    -c "SELECT queue_name FROM pgmq.meta ORDER BY 1"
}

examples="$(awk '/^\[\[example\]\]/{e=1; next} e && /^name *=/{gsub(/[" ]/,""); sub(/^name=/,""); print; e=0}' examples/Cargo.toml)"
[ -n "$examples" ] || fail "no [[example]] in examples/Cargo.toml"

# Every example of the workspace, with the workspace's features all on: the
# features the test build (`cargo nextest run --workspace --all-features`)
# compiles the libraries with, so that after that build this one reuses
# them and little is left to compile.
log "building the examples"
cargo build --quiet --workspace --all-features --examples
target_dir="${CARGO_TARGET_DIR:-target}"
limit="${PGMQ_EXAMPLE_TIMEOUT:-120}"
logdir="$(mktemp -d)"
trap 'rm -rf "$logdir"' EXIT

failed=0
# run_example NAME BINARY ARGS...: runs one example under the time limit and
# checks it exited 0 and left no queue behind; sets failed=1 otherwise.
run_example() {
  local name="$1" bin="$2"
  shift 2
  [ -x "$bin" ] || fail "example binary $bin missing after the build"
  local before start pid dog rc took left
  before="$(queues)"
  start=$SECONDS
  "$bin" "$@" >"$logdir/$name.log" 2>&1 &
  pid=$!
  # A watchdog for this one process: TERM at the limit, KILL 10 s later.
  # Stopping the watchdog also stops its sleep, so nothing outlives this call.
  (
    trap 'kill "$nap" 2>/dev/null; exit 0' TERM
    sleep "$limit" & nap=$!; wait "$nap"
    kill -TERM "$pid" 2>/dev/null
    sleep 10 & nap=$!; wait "$nap"
    kill -KILL "$pid" 2>/dev/null
  ) &
  dog=$!
  rc=0
  wait "$pid" || rc=$?
  kill "$dog" 2>/dev/null || true
  wait "$dog" 2>/dev/null || true
  took=$((SECONDS - start))
  # Queues this run left behind: new since the start, named after the example
  # or ending in its process id (pgmq_examples::demo_queue names them
  # <prefix>_<pid>).
  left="$(comm -13 <(echo "$before") <(queues) | grep -E "(^${name}\$|_${pid}\$)" || true)"
  if [ "$rc" != 0 ] || [ "$took" -ge "$limit" ] || [ -n "$left" ]; then
    failed=1
    echo "---- example $name (exit $rc, ${took}s) output:" >&2
    cat "$logdir/$name.log" >&2
    [ "$took" -lt "$limit" ] || echo "ci-extra: example $name ran past ${limit}s" >&2
    if [ -n "$left" ]; then
      echo "ci-extra: example $name left queues behind: $left" >&2
    fi
  else
    log "example $name: ok (${took}s)"
  fi
}

for name in $examples; do
  run_example "$name" "$target_dir/debug/examples/$name" --demo
done
# pgmq-client's statement_modes: prepared against unnamed statements, here
# only to show both modes work (20 calls, 1 round), not to measure them.
PGMQ_TEST_DSN="$DATABASE_URL" run_example statement_modes \
  "$target_dir/debug/examples/statement_modes" 20 1
[ "$failed" = 0 ] || fail "some examples failed"
log "all examples built, ran and cleaned up"
