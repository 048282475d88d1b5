#!/usr/bin/env bash
# Checks that each published crate (pgmq-client, pgmq-worker) carries every
# file its sources include (`include_str!`/`include_bytes!`, e.g. the README
# and the worker's settings table, which the rustdoc and the doc tests read):
# fails, naming the file, when an include points outside the crate's folder
# or at a file `cargo package --list` leaves out. crates.io and docs.rs get
# the package only, so such an include would break the build there, or the
# doc tests of the packaged crate (those under `#[cfg(doctest)]` are not
# compiled by `cargo publish --dry-run`, so it cannot see them). Needs cargo
# and python3.
#
#   bash scripts/check-package-files.sh [crate...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
crates=("$@")
[ ${#crates[@]} -gt 0 ] || crates=(pgmq-client pgmq-worker)
status=0
for crate in "${crates[@]}"; do
  # --allow-dirty: list what the working tree would package (CI runs on a
  # clean clone, where that is the committed tree).
  list="$(cargo package --list --allow-dirty --locked -p "$crate")"
  python3 - "$crate" "$list" <<'PY' || status=1
import os, re, sys

crate, listed = sys.argv[1], set(sys.argv[2].split())
root = os.path.realpath(crate)
include = re.compile(r'include_(?:str|bytes)!\(\s*"([^"]+)"\s*\)')
bad = []
for folder, _, files in os.walk(root):
    for name in files:
        if not name.endswith(".rs"):
            continue
        source = os.path.join(folder, name)
        rel_source = os.path.relpath(source, root)
        if rel_source not in listed:
            continue  # not packaged, so not built from the package
        for target in include.findall(open(source, encoding="utf-8").read()):
            path = os.path.realpath(os.path.join(folder, target))
            rel = os.path.relpath(path, root)
            if rel.startswith(".."):
                bad.append(f"{rel_source}: includes {target}, outside the package")
            elif rel not in listed:
                bad.append(f"{rel_source}: includes {rel}, which the package leaves out")
for line in bad:
    print(f"check-package-files: {crate}: {line}", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
done
[ "$status" = 0 ] && echo "check-package-files: every included file is in its package (${crates[*]})"
exit "$status"
