#!/usr/bin/env bash
# Installs headless Chromium and its WebDriver from Debian's packages
# (chromium, chromium-driver) for pgmq-console's browser test
# (pgmq-console/tests/browser.rs); does nothing when both are installed.
# As root; exit 1 when it cannot install them.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "install-chromium: chromium or chromedriver is missing (apt-get install -y chromium chromium-driver as root)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
pkgs=(chromium chromium-driver)
if ! apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null 2>&1; then
  apt-get update -qq >&2 || true
  apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >&2
fi
command -v chromedriver >/dev/null 2>&1 || { echo "install-chromium: chromedriver still missing" >&2; exit 1; }
