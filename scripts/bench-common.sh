# Shared by bench-memory.sh and bench-targets.sh (sourced, not run).

# Builds pgmq-bench (release) and sets $bin.
bench_build() {
  cargo build --release --quiet -p pgmq-bench
  bin="${CARGO_TARGET_DIR:-target}/release/pgmq-bench"
}

# Starts a throwaway cluster on port $1 (refusing one already running there),
# removes it on exit, and exports its DSN as PGMQ_BENCH_DSN.
bench_cluster() {
  bench_port="$1"
  if PGMQ_DB_PORT="$bench_port" bash scripts/db-ctl.sh status >/dev/null 2>&1; then
    echo "$(basename "$0"): a cluster already runs on port $bench_port; stop it (PGMQ_DB_PORT=$bench_port bash scripts/db-stop.sh) or pick another port" >&2
    exit 2
  fi
  trap 'PGMQ_DB_PORT="$bench_port" bash scripts/db-stop.sh >/dev/null 2>&1 || true' EXIT
  PGMQ_BENCH_DSN="$(PGMQ_DB_PORT="$bench_port" bash scripts/db-start.sh)"
  export PGMQ_BENCH_DSN
}
