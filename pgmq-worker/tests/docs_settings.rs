//! The settings table users read, docs/settings.md of this package (the
//! "Every setting" section of `WorkerBuilder`'s rustdoc includes it, and
//! the workspace's docs/worker.md links to it), states the defaults the
//! builder really has: each row whose default is a number, a duration, a
//! flag or a multiple of `batch_size` is compared with the settings of a
//! fresh `WorkerBuilder` (read from its `Debug` output), every setting named
//! there exists, and every public setting method of `WorkerBuilder` has a
//! row.

mod common;

use std::collections::{BTreeMap, BTreeSet};

/// Public `WorkerBuilder` methods that are not settings: the final call,
/// and the hidden test hooks.
const NOT_SETTINGS: &[&str] = &[
    "build",
    "panic_once_in",
    "resume_handler_panics",
    "fence_off",
    "fifo_blocking_wait_off",
    "claim_cursor_fence",
    "claim_handoff_unplaced",
    "trust_stale_pause_flag",
    "claims_ahead_past_vt",
];

/// The settings table, relative to this package's root.
const SETTINGS_MD: &str = "docs/settings.md";

fn package_file(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The rows of the settings table, split into trimmed cells (the first is
/// empty: rows start with `|`).
fn settings_rows() -> Vec<Vec<String>> {
    table_rows(&package_file(SETTINGS_MD))
}

fn table_rows(text: &str) -> Vec<Vec<String>> {
    let table = text
        .split("| setting | default |")
        .nth(1)
        .expect("docs/settings.md has a settings table");
    table
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| line.split('|').map(|c| c.trim().to_owned()).collect())
        .collect()
}

/// The builder calls a row's first cell names: `` `name(arg)` ``, or several
/// separated by ` / `.
fn calls_of(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|call| Some(call.split_once('(')?.0.to_owned()))
        .collect()
}

/// `name -> default` from the settings table (its rows start with a
/// builder call such as `` `concurrency(n)` ``).
fn documented_defaults() -> BTreeMap<String, String> {
    settings_rows()
        .into_iter()
        .filter_map(|cells| {
            let name = calls_of(cells.get(1)?).into_iter().next()?;
            let default = cells.get(2)?.clone();
            (default != "required").then_some((name, default))
        })
        .collect()
}

/// Every builder call the settings table names.
fn documented_calls() -> BTreeSet<String> {
    settings_rows()
        .iter()
        .filter_map(|cells| cells.get(1))
        .flat_map(|cell| calls_of(cell))
        .collect()
}

/// The `pub fn`s of `impl ... WorkerBuilder<T>` in `source`.
fn builder_methods(source: &str) -> BTreeSet<String> {
    let body = source
        .split_once("> WorkerBuilder<T> {\n")
        .expect("builder.rs has the builder's impl block")
        .1;
    body.lines()
        .take_while(|line| *line != "}")
        .filter_map(|line| line.strip_prefix("    pub fn "))
        .filter_map(|rest| rest.split(['(', '<']).next())
        .map(str::to_owned)
        .collect()
}

/// The value of `name: value` in a `Debug` rendering, up to the next `,` or
/// the end of the struct.
fn debug_field<'a>(debug: &'a str, name: &str) -> Option<&'a str> {
    let start = debug.find(&format!(" {name}: "))? + name.len() + 3;
    let rest = &debug[start..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    Some(rest[..end].trim())
}

/// The `Debug` form a documented default must have, where the default is one
/// this test can evaluate.
fn expected_debug(default: &str, batch_size: u64) -> Option<String> {
    let default = default.split(" (").next().unwrap().trim();
    if default.parse::<u64>().is_ok() || default == "true" || default == "false" {
        return Some(default.to_owned());
    }
    if let Some(secs) = default.strip_suffix(" s") {
        return Some(format!("{}s", secs.parse::<u64>().ok()?));
    }
    if let Some(ms) = default.strip_suffix(" ms") {
        return Some(format!("{}ms", ms.parse::<u64>().ok()?));
    }
    if let Some(n) = default
        .strip_prefix('`')
        .and_then(|d| d.strip_suffix(" x batch_size`"))
    {
        return Some((n.parse::<u64>().ok()? * batch_size).to_string());
    }
    None
}

#[tokio::test]
async fn documented_defaults_match_the_builder() {
    let client = common::client().await;
    let queue = common::unique("docs_settings");
    let builder = pgmq_worker::Worker::<serde_json::Value>::builder(client, queue);
    let debug = format!("{builder:?}");
    let batch_size: u64 = debug_field(&debug, "batch_size").unwrap().parse().unwrap();

    let documented = documented_defaults();
    assert!(
        documented.len() >= 20,
        "settings table not found: {documented:?}"
    );
    let mut checked = 0;
    let mut problems = Vec::new();
    for (name, default) in &documented {
        // `hook(h)` adds to the builder's `hooks`.
        let Some(actual) =
            debug_field(&debug, name).or_else(|| debug_field(&debug, &format!("{name}s")))
        else {
            problems.push(format!(
                "`{name}` is documented but the builder has no such setting"
            ));
            continue;
        };
        let Some(expected) = expected_debug(default, batch_size) else {
            continue;
        };
        checked += 1;
        let actual = actual
            .strip_prefix("Some(")
            .and_then(|a| a.strip_suffix(')'))
            .unwrap_or(actual);
        if actual != expected {
            problems.push(format!(
                "`{name}`: docs say {default}, the builder has {actual}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}\n{debug}", problems.join("\n"));
    assert!(checked >= 15, "only {checked} defaults could be checked");
}

#[test]
fn every_builder_setting_is_documented() {
    let methods = builder_methods(&package_file("src/builder.rs"));
    assert!(
        methods.len() >= 25,
        "builder methods not found: {methods:?}"
    );
    let documented = documented_calls();
    let missing: Vec<&String> = methods
        .iter()
        .filter(|m| !NOT_SETTINGS.contains(&m.as_str()) && !documented.contains(*m))
        .collect();
    assert!(
        missing.is_empty(),
        "WorkerBuilder settings without a row in {SETTINGS_MD}: {missing:?}"
    );
}

#[test]
fn an_undocumented_setting_is_caught() {
    let source = "impl<T> Other<T> {\n    pub fn elsewhere(self) {}\n}\n\
        impl<T: X> WorkerBuilder<T> {\n    pub(crate) fn new() {}\n    pub fn a(mut self, n: usize) -> Self {}\n    pub fn b<H: Handler<T>>(mut self, h: H) -> Self {}\n}\nfn after() {}\n";
    let methods = builder_methods(source);
    assert_eq!(methods, ["a", "b"].map(String::from).into());
    assert_eq!(
        calls_of("`handler(h)` / `blocking_handler(h)`"),
        ["handler", "blocking_handler"]
    );
}

#[test]
fn a_wrong_default_is_caught() {
    assert_eq!(expected_debug("30 s", 100).as_deref(), Some("30s"));
    assert_eq!(
        expected_debug("250 ms (PGMQ's default)", 100).as_deref(),
        Some("250ms")
    );
    assert_eq!(
        expected_debug("`3 x batch_size`", 100).as_deref(),
        Some("300")
    );
    assert_ne!(expected_debug("8", 100).as_deref(), Some("9"));
    assert_eq!(
        debug_field("B { config: C { a: 1, ab: 2s }, x: 3 }", "ab"),
        Some("2s")
    );
}

/// The doc attributes (`///` lines and `#[doc = ...]`) right above
/// `pub struct WorkerBuilder` in `source`, in order.
fn builder_doc_lines(source: &str) -> Vec<&str> {
    let before = source
        .split_once("\npub struct WorkerBuilder<")
        .expect("builder.rs defines WorkerBuilder")
        .0;
    let mut lines: Vec<&str> = before
        .lines()
        .rev()
        .take_while(|line| line.starts_with("///") || line.starts_with("#["))
        .filter(|line| line.starts_with("///") || line.starts_with("#[doc"))
        .collect();
    lines.reverse();
    lines
}

/// Whether `WorkerBuilder`'s rustdoc (the page docs.rs shows) includes the
/// settings table, under a heading of its own.
fn builder_docs_include_table(source: &str) -> bool {
    let docs = builder_doc_lines(source);
    let include = format!("#[doc = include_str!(\"../{SETTINGS_MD}\")]");
    docs.iter()
        .position(|line| *line == include)
        .is_some_and(|i| docs[..i].contains(&"/// # Every setting"))
}

#[test]
fn the_builder_docs_include_the_settings_table() {
    assert!(
        builder_docs_include_table(&package_file("src/builder.rs")),
        "WorkerBuilder's rustdoc must include {SETTINGS_MD} under \"# Every setting\""
    );
    // The table is kept in one place: the workspace's reference doc links to
    // it instead of holding a copy that could drift (checked only in the
    // workspace; the published package has no docs/worker.md).
    let worker_md = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/worker.md");
    if let Ok(text) = std::fs::read_to_string(worker_md) {
        assert!(
            !text.contains("| setting | default |"),
            "docs/worker.md holds a copy of the settings table; link to pgmq-worker/{SETTINGS_MD}"
        );
        assert!(text.contains("(../pgmq-worker/docs/settings.md)"));
    }
}

#[test]
fn a_table_left_out_of_the_builder_docs_is_caught() {
    let with = "/// Builds.\n///\n/// # Every setting\n///\n#[doc = include_str!(\"../docs/settings.md\")]\n#[must_use]\npub struct WorkerBuilder<T> {";
    assert!(builder_docs_include_table(with));
    let without = "/// Builds.\n#[must_use]\npub struct WorkerBuilder<T> {";
    assert!(!builder_docs_include_table(without));
    // An include on another item does not count.
    let elsewhere = "#[doc = include_str!(\"../docs/settings.md\")]\nstruct Other;\n\n/// # Every setting\npub struct WorkerBuilder<T> {";
    assert!(!builder_docs_include_table(elsewhere));
    let rows = table_rows("x\n\n| setting | default | what |\n| --- | --- | --- |\n| `a(n)` | 1 | x |\n\nafter | b |\n");
    assert_eq!(rows.len(), 1);
    assert_eq!(calls_of(&rows[0][1]), ["a"]);
}
