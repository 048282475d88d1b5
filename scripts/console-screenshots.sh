#!/usr/bin/env bash
# Takes the operator console's screenshots in docs/images/ (console-*.png)
# with the browser test's WebDriver setup: headless Chromium and
# chromedriver (scripts/install-chromium.sh), the dev database
# (scripts/db-start.sh), sample queues named shop_orders, shop_emails,
# shop_invoices and shop_orders_dlq (dropped and created again).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install-chromium.sh
PGMQ_TEST_DSN="${PGMQ_TEST_DSN:-$(bash scripts/db-start.sh)}"
export PGMQ_TEST_DSN
mkdir -p docs/images
PGMQ_CONSOLE_SCREENSHOTS="$PWD/docs/images" \
  cargo test -p pgmq-console --test browser -- --ignored --exact screenshots
ls -l docs/images/console-*.png
