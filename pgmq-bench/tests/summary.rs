//! The short summary and the headline comparison of the committed results
//! (real documents of full runs, read without a database): the Markdown
//! summary fits in 25 lines, the JSON summary validates against
//! docs/benchmark-summary.v1.schema.json, and `compare --markdown` gives
//! one verdict line per headline figure.

mod common;

use common::{docs_dir, headline_labels, run, summary_schema_errors};

/// The committed results, JSON documents of docs/results/.
fn committed() -> Vec<std::path::PathBuf> {
    let mut out: Vec<_> = std::fs::read_dir(docs_dir().join("results"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("json"))
        .collect();
    out.sort();
    assert!(out.len() >= 5, "{out:?}");
    out
}

#[test]
fn every_committed_result_summarizes_in_25_lines_and_valid_json() {
    for path in committed() {
        let p = path.to_str().unwrap();
        let out = run(&["summary", "--markdown", p]);
        assert_eq!(out.status.code(), Some(0), "{p}");
        let md = String::from_utf8(out.stdout).unwrap();
        assert!(md.lines().count() <= 25, "{p}:\n{md}");
        assert!(md.starts_with("### pgmq-bench: SDK "), "{p}:\n{md}");
        let out = run(&["summary", p]);
        assert_eq!(out.status.code(), Some(0), "{p}");
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let errors = summary_schema_errors(&summary);
        assert!(errors.is_empty(), "{p}: {errors:#?}");
    }
}

#[test]
fn compare_markdown_of_two_full_runs_has_a_line_per_headline_figure() {
    // An older full run kept as test data, and the current one.
    let old = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/dev-machine-fbd4125.json");
    let new = docs_dir().join("results/dev-machine-6773cc8.json");
    let out = run(&[
        "compare",
        "--markdown",
        old.to_str().unwrap(),
        new.to_str().unwrap(),
    ]);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("- ")).collect();
    // A line per headline figure; those the older run predates are new.
    let want: Vec<&str> = headline_labels();
    assert_eq!(lines.len(), want.len(), "{text}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("- Keyed") && l.ends_with(": new")),
        "{text}"
    );
    for (line, label) in lines.iter().zip(want) {
        assert!(line.starts_with(&format!("- {label}: ")), "{line}");
    }
    assert!(text.lines().count() <= 25, "{text}");
    assert!(text.contains("**Verdict: "), "{text}");
}
