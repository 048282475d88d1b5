#!/usr/bin/env bash
# The whole test suite on a throwaway local database. Works on a fresh Debian
# machine as root: installs PostgreSQL (and pg_partman, best effort) when
# missing, installs PGMQ from the pinned crate, starts the cluster, runs every
# test and doc test, and stops the cluster again if this script started it.
# The setup-script safety tests (pgmq-bench/tests/setup_scripts.rs) are part of
# that run: as root they start and stop clusters of their own on a free port
# of 55450-55459, in folders of their own.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# A one-shot run gains nothing from incremental data, and line tables keep
# file:line in backtraces: the debug build then takes about 2 GB of disk
# instead of 7.3 GB. Set either variable to override.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}"

started=0
if ! bash scripts/db-ctl.sh status >/dev/null 2>&1; then
  started=1
fi
if [ "$started" = 1 ]; then
  trap 'bash scripts/db-stop.sh >/dev/null 2>&1 || true' EXIT
fi
# libpq-dev for the DSN parser's libpq oracle test. It can upgrade the
# server packages: a cluster that was already running is restarted then.
rc=0
bash scripts/install-libpq-dev.sh || rc=$?
if [ "$rc" = 3 ] && [ "$started" = 0 ]; then
  bash scripts/db-ctl.sh restart
elif [ "$rc" != 0 ] && [ "$rc" != 3 ]; then
  echo "test.sh: without libpq-dev, pgmq-client's dsn_libpq test will fail" >&2
fi
bash scripts/install-partman.sh || true
PGMQ_TEST_DSN="$(bash scripts/db-start.sh)"
export PGMQ_TEST_DSN
# PgBouncer in transaction mode in front of it, for tests/pgbouncer.rs
# (stopped with the cluster).
PGMQ_PGBOUNCER_DSN="$(bash scripts/pgbouncer-start.sh)"
export PGMQ_PGBOUNCER_DSN

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --all-features --no-fail-fast
else
  cargo test --workspace --all-features --no-fail-fast
fi
cargo test --workspace --all-features --doc
