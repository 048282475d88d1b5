//! The repository's Markdown documents link only to files and headings that
//! exist: every relative link in README.md, CHANGELOG.md, docker/README.md,
//! docs/*.md and docs/results/*.md must name an existing file, and a
//! `#fragment` on a Markdown target must match one of its headings (GitHub's
//! anchor rules: lower case, punctuation dropped, spaces to hyphens).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn documents() -> Vec<PathBuf> {
    let root = repo_root();
    let mut docs: Vec<PathBuf> = ["README.md", "CHANGELOG.md", "docker/README.md"]
        .iter()
        .map(|p| root.join(p))
        .filter(|p| p.exists())
        .collect();
    for dir in ["docs", "docs/results"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) == Some("md") {
                docs.push(path);
            }
        }
    }
    docs
}

/// The lines outside fenced code blocks.
fn prose_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut in_fence = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            return false;
        }
        !in_fence
    })
}

/// The targets of inline links `[text](target)` outside fenced code blocks.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose_lines(text) {
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].trim().to_owned());
            rest = &after[end..];
        }
    }
    out
}

/// GitHub's anchor for a heading text.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose_lines(text)
        .filter(|line| line.starts_with('#'))
        .map(|line| anchor(line.trim_start_matches('#')))
        .collect()
}

fn problems_in(doc: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(doc).unwrap();
    let mut problems = Vec::new();
    for link in links(&text) {
        if link.contains("://") || link.starts_with("mailto:") {
            continue;
        }
        let (file, fragment) = match link.split_once('#') {
            Some((f, frag)) => (f, Some(frag)),
            None => (link.as_str(), None),
        };
        let target = if file.is_empty() {
            doc.to_path_buf()
        } else {
            doc.parent().unwrap().join(file)
        };
        if !target.exists() {
            problems.push(format!("{}: link to missing {link}", doc.display()));
            continue;
        }
        if let Some(fragment) = fragment {
            if target.extension().and_then(|e| e.to_str()) == Some("md") {
                let heads = anchors(&std::fs::read_to_string(&target).unwrap());
                if !heads.contains(fragment) {
                    problems.push(format!("{}: no heading for {link}", doc.display()));
                }
            }
        }
    }
    problems
}

#[test]
fn every_relative_link_resolves() {
    let docs = documents();
    assert!(docs.len() >= 5, "found only {docs:?}");
    let problems: Vec<String> = docs.iter().flat_map(|d| problems_in(d)).collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_checker_finds_a_broken_link() {
    let dir = std::env::temp_dir().join(format!("pgmq-docs-links-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let doc = dir.join("a.md");
    std::fs::write(
        &doc,
        "# Title\n\n## Some Section: here\n\n[ok](#some-section-here) [bad](missing.md) \
         [bad anchor](a.md#nowhere)\n\n```\n[in code](ignored.md)\n```\n",
    )
    .unwrap();
    let problems = problems_in(&doc);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("missing.md"));
    assert!(problems[1].contains("#nowhere"));
}
