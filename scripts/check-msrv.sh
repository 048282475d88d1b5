#!/usr/bin/env bash
# Checks the workspace's declared `rust-version` (Cargo.toml,
# [workspace.package]) against every package of Cargo.lock built on this
# host's platform (the one CI builds and tests; packages only other platforms
# take, such as windows-*, are left out): fails, naming them, when a locked
# package declares a newer `rust-version` than the workspace does, since that
# Rust could then not build the locked dependencies. Needs cargo, python3 and
# the registry (cargo metadata reads each locked package's manifest).
#
#   bash scripts/check-msrv.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
meta="$(mktemp)"
trap 'rm -f "$meta"' EXIT
host="$(rustc -vV | sed -n 's/^host: //p')"
cargo metadata --format-version 1 --locked --filter-platform "$host" >"$meta"
python3 - "$meta" <<'PY'
import json, sys

def key(v):
    return tuple(int(x) for x in v.split("."))

meta = json.load(open(sys.argv[1]))
members = set(meta["workspace_members"])
declared = {p["rust_version"] for p in meta["packages"] if p["id"] in members}
if len(declared) != 1 or None in declared:
    sys.exit(f"check-msrv: the workspace members declare {sorted(map(str, declared))}, want one rust-version")
declared = declared.pop()
newer = sorted(
    (key(p["rust_version"]), p["name"], p["version"], p["rust_version"])
    for p in meta["packages"]
    if p["id"] not in members and p["rust_version"] and key(p["rust_version"]) > key(declared)
)
if newer:
    for _, name, version, rv in newer:
        print(f"check-msrv: {name} {version} needs Rust {rv}", file=sys.stderr)
    sys.exit(f"check-msrv: FAIL: rust-version is {declared}, but locked packages need up to {newer[-1][3]}")
top = max(
    (key(p["rust_version"]), p["rust_version"], p["name"])
    for p in meta["packages"]
    if p["id"] not in members and p["rust_version"]
)
print(f"check-msrv: rust-version {declared}; the newest a locked package needs is {top[1]} ({top[2]})")
PY
