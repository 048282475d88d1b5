#!/usr/bin/env bash
# Checks the documentation (the mdBook under docs/ and the Markdown around
# it) for what a reader would trip over. Needs bash, git and python3 (the
# standard library only); reads files, writes nothing. Exit 0 when every
# check holds, 1 with one line per problem otherwise. Takes about a second.
#
# What it checks:
#
# 1. Links. Every relative link and image (`[text](target)`, `![..](..)`
#    and reference definitions `[id]: target`) outside fenced code blocks
#    and inline code, in docs/**/*.md, README.md, CONTRIBUTING.md,
#    CHANGELOG.md, docker/README.md and each crate's README.md, names a
#    file or folder that exists. A `#fragment` on a Markdown target (or
#    alone, for the same page) must be the anchor of one of its headings,
#    slugged as GitHub and mdBook both do: the heading's text without its
#    Markdown (backticks, emphasis, link targets), lower case, every
#    character that is not a letter, digit, `-` or `_` dropped, each space
#    a `-`, and a repeated heading suffixed `-1`, `-2`, ... Absolute URLs
#    (`scheme:`) are not fetched.
# 2. Page size. No Markdown page under docs/ outside docs/results has more
#    than 3,000 words (whitespace-separated tokens, as `wc -w` counts
#    them, code blocks included): reference pages are split by question.
# 3. Commit hashes. No page under docs/ outside docs/results names a
#    commit: measured figures and their history, which are tied to
#    commits, live in docs/results. The rule: a token of lower-case hex
#    digits with at least one digit and at least one of a-f, standing
#    alone (not part of a longer word, nor joined to another token by `-`
#    or `_`, so UUIDs, anchors and longer hex payloads never match), is a
#    commit hash when it has 7 to 12 digits (how short hashes are
#    written, whether or not this clone has the commit: history may be
#    shallow or rewritten), or when it has 13 to 40 and git knows it as a
#    commit of this repository (`git cat-file`): a 16-digit span id or a
#    32-digit trace id in an example is not one. Code blocks count too.
#    Files other than Markdown (JSON, the schema) are not pages.
# 4. The size of docs/results: its files together stay under 1,000,000
#    bytes. It keeps the current results and the history table; raw
#    documents of past sittings stay in git's history, not in the tree.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec python3 - "$@" <<'PY'
import os
import re
import subprocess
import sys

ROOT = os.getcwd()
MAX_WORDS = 3000
MAX_RESULTS_BYTES = 1_000_000
problems = []


def markdown_files():
    out = []
    for base, dirs, files in os.walk("docs"):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(".md"):
                out.append(os.path.join(base, f))
    for f in ["README.md", "CONTRIBUTING.md", "CHANGELOG.md", "docker/README.md"]:
        if os.path.exists(f):
            out.append(f)
    for d in sorted(os.listdir(".")):
        f = os.path.join(d, "README.md")
        if d.startswith("pgmq-") and os.path.exists(f):
            out.append(f)
    return out


def in_results(path):
    return path.startswith("docs/results/") or path == "docs/results"


def prose(text):
    """The text with fenced code blocks blanked (lines kept, for line numbers)."""
    out, fence = [], None
    for line in text.split("\n"):
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            out.append("")
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            out.append("")
            continue
        out.append(line)
    return out


def strip_inline_code(line):
    return re.sub(r"(`+)(.+?)\1", lambda m: " " * len(m.group(0)), line)


def heading_text(raw):
    t = raw.strip().rstrip("#").strip()
    t = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", t)  # links: their text
    t = re.sub(r"<[^>]+>", "", t)                      # inline HTML
    t = t.replace("`", "")
    t = re.sub(r"(\*\*|\*)(\S.*?\S|\S)\1", r"\2", t)
    t = re.sub(r"(?<!\w)(__|_)(\S.*?\S|\S)\1(?!\w)", r"\2", t)  # not intraword
    return t


def slug(text):
    out = []
    for c in text.strip().lower():
        if c.isalnum() or c in "-_":
            out.append(c)
        elif c.isspace():
            out.append("-")
    return "".join(out)


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen, result = {}, set()
        with open(path, encoding="utf-8") as fh:
            lines = prose(fh.read())
        for line in lines:
            m = re.match(r"^(#{1,6})\s+(.*)$", line)
            if not m:
                continue
            base = slug(heading_text(m.group(2)))
            n = seen.get(base, 0)
            seen[base] = n + 1
            result.add(base if n == 0 else f"{base}-{n}")
        _anchors[path] = result
    return _anchors[path]


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")


def check_links(path):
    with open(path, encoding="utf-8") as fh:
        lines = prose(fh.read())
    for no, line in enumerate(lines, 1):
        line = strip_inline_code(line)
        targets = [m.group(1) for m in LINK.finditer(line)]
        m = REFDEF.match(line)
        if m:
            targets.append(m.group(1))
        for target in targets:
            if not target or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue
            file, _, fragment = target.partition("#")
            dest = path if file == "" else os.path.normpath(os.path.join(os.path.dirname(path), file))
            if not os.path.exists(dest):
                problems.append(f"{path}:{no}: link to a missing file: {target}")
                continue
            if fragment and dest.endswith(".md") and fragment not in anchors(dest):
                problems.append(f"{path}:{no}: no heading in {dest} for #{fragment}")


HEX = re.compile(r"(?<![\w-])([0-9a-f]{7,40})(?![\w-])")


def hex_candidates(text):
    for m in HEX.finditer(text):
        tok = m.group(1)
        if re.search(r"[0-9]", tok) and re.search(r"[a-f]", tok):
            yield tok


def known_commits(tokens):
    tokens = sorted({t for t in tokens if len(t) > 12})
    if not tokens:
        return set()
    try:
        out = subprocess.run(
            ["git", "cat-file", "--batch-check"],
            input="".join(f"{t}^{{commit}}\n" for t in tokens),
            capture_output=True, text=True, check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return set()
    return {t for t, line in zip(tokens, out) if line.endswith(" commit")}


files = markdown_files()
for f in files:
    check_links(f)

pages = [f for f in files if f.startswith("docs/") and not in_results(f)]
texts = {}
for f in pages:
    with open(f, encoding="utf-8") as fh:
        texts[f] = fh.read()
    words = len(texts[f].split())
    if words > MAX_WORDS:
        problems.append(f"{f}: {words} words, over {MAX_WORDS}: split it by question")

commits = known_commits(t for text in texts.values() for t in hex_candidates(text))
for f in pages:
    for no, line in enumerate(texts[f].split("\n"), 1):
        found = {t for t in hex_candidates(line) if len(t) <= 12 or t in commits}
        for t in sorted(found):
            problems.append(f"{f}:{no}: a commit hash ({t}): figures tied to a commit belong in docs/results")

size = 0
for base, _, fs in os.walk("docs/results"):
    for name in fs:
        size += os.path.getsize(os.path.join(base, name))
if size >= MAX_RESULTS_BYTES:
    problems.append(f"docs/results: {size:,} bytes, over {MAX_RESULTS_BYTES:,}: move superseded documents out (git keeps them)")

for p in problems:
    print(p)
print(f"check-docs: {len(files)} Markdown files, {len(pages)} pages, docs/results {size:,} bytes: "
      + ("ok" if not problems else f"{len(problems)} problem(s)"))
sys.exit(1 if problems else 0)
PY
