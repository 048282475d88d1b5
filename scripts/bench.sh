#!/usr/bin/env bash
# The main job on a throwaway local database (until the benchmark binary lands:
# the quickstart example, which creates a queue, sends, reads and deletes).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
started=0
bash scripts/db-ctl.sh status >/dev/null 2>&1 || started=1
[ "$started" = 1 ] && trap 'bash scripts/db-stop.sh >/dev/null 2>&1 || true' EXIT
DATABASE_URL="$(bash scripts/db-start.sh)" cargo run --release -q -p pgmq-examples --example quickstart
