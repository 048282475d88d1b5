#!/usr/bin/env bash
# Measures this SDK against the crates.io `pgmq` crate (sqlx-based), side by
# side on one database: single send, batch send, and draining a preloaded
# backlog with 1 and 8 consumers (see scripts/compare-pgmq-crate/src/main.rs).
# The measuring program is not a workspace member (the workspace and CI never
# build sqlx); it is built here in release with its own Cargo.lock.
#
#   bash scripts/compare-pgmq-crate.sh                   # 3 rounds, full sizes
#   bash scripts/compare-pgmq-crate.sh --rounds 5
#   bash scripts/compare-pgmq-crate.sh --quick           # smoke test: 1 round, small sizes
#   bash scripts/compare-pgmq-crate.sh --output run.json -- --backlog 50000
#
# Database: $PGMQ_COMPARE_DSN when set; otherwise a throwaway local cluster on
# port ${PGMQ_COMPARE_PORT:-55447} (refused when one already runs there),
# removed afterwards. Writes docs/results/compare/pgmq-crate.json (or
# --output) and prints a Markdown table. Exit status: 0 ok, 1 a run did not
# count every message exactly once, 2 refused or failed to run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

output=docs/results/compare/pgmq-crate.json
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --output|-o) output="$2"; shift 2 ;;
    --rounds) extra+=(--rounds "$2"); shift 2 ;;
    --quick) extra+=(--quick); shift ;;
    --) shift; extra+=("$@"); break ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "compare-pgmq-crate.sh: unknown argument $1 (program flags go after --)" >&2; exit 2 ;;
  esac
done

manifest=scripts/compare-pgmq-crate/Cargo.toml
target="${CARGO_TARGET_DIR:-scripts/compare-pgmq-crate/target}"
cargo build --release --quiet --locked --manifest-path "$manifest" --target-dir "$target"
bin="$target/release/compare-pgmq-crate"

if [ -z "${PGMQ_COMPARE_DSN:-}" ]; then
  . scripts/bench-common.sh
  bench_cluster "${PGMQ_COMPARE_PORT:-55447}"
  PGMQ_COMPARE_DSN="$PGMQ_BENCH_DSN"
  unset PGMQ_BENCH_DSN
fi
export PGMQ_COMPARE_DSN

# Conditions the program records (none of them secret).
COMPARE_GIT_COMMIT="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
COMPARE_GIT_DIRTY=0
git diff --quiet HEAD -- pgmq-client pgmq-worker scripts/compare-pgmq-crate 2>/dev/null || COMPARE_GIT_DIRTY=1
COMPARE_SDK_VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
COMPARE_SQLX_VERSION="$(awk '/^name = "sqlx"$/ {getline; gsub(/version = |"/, ""); print; exit}' scripts/compare-pgmq-crate/Cargo.lock)"
COMPARE_RUSTC="$(rustc --version)"
export COMPARE_GIT_COMMIT COMPARE_GIT_DIRTY COMPARE_SDK_VERSION COMPARE_SQLX_VERSION COMPARE_RUSTC

mkdir -p "$(dirname "$output")"
status=0
"$bin" --output "$output" "${extra[@]}" || status=$?
[ "$status" -le 1 ] && echo && echo "Document: $output"
exit "$status"
