//! `pgmq-bench compare OLD NEW`: every figure's change and a verdict that
//! takes the measured spread into account.
//!
//! A figure regresses only when its median moved the wrong way by more than
//! the threshold *and* the change is more than the runs' own spread explains:
//!
//! - with at least [`MIN_RUNS_FOR_TEST`] values on each side (rounds, or
//!   per-invocation medians of an aggregate document), a two-sided
//!   Mann-Whitney U test of the two sets of values at [`ALPHA`]: a 15% drop
//!   whose ranges overlap (one slow round) is still a regression when the
//!   values are shifted as a whole;
//! - with fewer, the two min–max ranges must not overlap (three rounds cannot
//!   reach a p-value below 0.1, so no test is applied).
//!
//! A change the spread can explain is reported as noise, not as a regression.
//! Durable and non-durable documents are never compared, nor is a document
//! whose run failed (`outcome.ok` false).

use std::fmt::Write as _;

use crate::document::{Better, Document, DurabilityClass, Figure};
use crate::error::{Error, Result};
use crate::report::summary::HEADLINE;
use crate::report::{fmt_figure, fmt_value};
use crate::stats::mann_whitney;

/// A condition's value in a document that does not record it.
const NOT_RECORDED: &str = "–";

/// The condition holding the command line's options.
const COMMAND: &str = "metadata.command";

/// The fewest values per side for the Mann-Whitney test.
pub const MIN_RUNS_FOR_TEST: usize = 5;

/// The test's significance level (two-sided).
pub const ALPHA: f64 = 0.05;

/// The verdict on one figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Worse by more than the threshold, ranges apart.
    Regression,
    /// Better by more than the threshold, ranges apart.
    Improvement,
    /// Changed by more than the threshold, but the ranges overlap.
    Noise,
    /// Changed by at most the threshold.
    Unchanged,
    /// No direction is better (counts, slopes), or no base to compare with.
    Informational,
    /// Only in the new document.
    Added,
    /// Only in the old document.
    Removed,
}

impl Verdict {
    /// The word in the table.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Regression => "REGRESSION",
            Verdict::Improvement => "improvement",
            Verdict::Noise => "within spread",
            Verdict::Unchanged => "unchanged",
            Verdict::Informational => "info",
            Verdict::Added => "new",
            Verdict::Removed => "gone",
        }
    }
}

/// Percent change of the median, and the verdict.
///
/// ```
/// use pgmq_bench::document::{Better, Figure, Sample};
/// use pgmq_bench::report::compare::{judge, Verdict};
/// let fig = |v: &[f64]| Figure::from_runs("x", "s", "x", "msg/s", Better::Higher, "",
///     v.iter().enumerate().map(|(i, v)| Sample::value(i as u32, *v)).collect()).unwrap();
/// assert_eq!(judge(&fig(&[100.0, 101.0, 102.0]), &fig(&[80.0, 81.0, 82.0]), 10.0).1, Verdict::Regression);
/// assert_eq!(judge(&fig(&[100.0, 60.0, 102.0]), &fig(&[80.0, 81.0, 82.0]), 10.0).1, Verdict::Noise);
/// // Five values a side: the Mann-Whitney test decides, not the ranges.
/// let old = fig(&[1000.0, 960.0, 1040.0, 980.0, 1020.0]);
/// let new = fig(&[850.0, 820.0, 880.0, 830.0, 990.0]);
/// assert_eq!(judge(&old, &new, 10.0).1, Verdict::Regression);
/// ```
pub fn judge(old: &Figure, new: &Figure, threshold_pct: f64) -> (Option<f64>, Verdict) {
    let j = judge_with_test(old, new, threshold_pct);
    (j.change_pct, j.verdict)
}

/// A verdict with the test that decided it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Judgement {
    /// Percent change of the median.
    pub change_pct: Option<f64>,
    /// The verdict.
    pub verdict: Verdict,
    /// The two-sided Mann-Whitney p-value, when both sides had at least
    /// [`MIN_RUNS_FOR_TEST`] values.
    pub p_value: Option<f64>,
}

/// [`judge`], also returning the p-value of the test when one was applied.
pub fn judge_with_test(old: &Figure, new: &Figure, threshold_pct: f64) -> Judgement {
    let values = |f: &Figure| f.runs.iter().map(|s| s.value).collect::<Vec<f64>>();
    let p_value = (old.runs.len() >= MIN_RUNS_FOR_TEST && new.runs.len() >= MIN_RUNS_FOR_TEST)
        .then(|| mann_whitney(&values(old), &values(new)).map(|t| t.p_value))
        .flatten();
    let (change_pct, verdict) = judge_inner(old, new, threshold_pct, p_value);
    Judgement {
        change_pct,
        verdict,
        p_value,
    }
}

fn judge_inner(
    old: &Figure,
    new: &Figure,
    threshold_pct: f64,
    p_value: Option<f64>,
) -> (Option<f64>, Verdict) {
    if old.median == 0.0 {
        return (None, Verdict::Informational);
    }
    let change = (new.median - old.median) / old.median.abs() * 100.0;
    if old.better == Better::None || new.better == Better::None {
        return (Some(change), Verdict::Informational);
    }
    if change.abs() <= threshold_pct {
        return (Some(change), Verdict::Unchanged);
    }
    let explained = match p_value {
        Some(p) => p >= ALPHA,
        None => new.min <= old.max && old.min <= new.max,
    };
    if explained {
        return (Some(change), Verdict::Noise);
    }
    let worse = match old.better {
        Better::Higher => change < 0.0,
        Better::Lower => change > 0.0,
        Better::None => false,
    };
    (
        Some(change),
        if worse {
            Verdict::Regression
        } else {
            Verdict::Improvement
        },
    )
}

/// Whether the condition `key` (a path of [`differences`]) is measured
/// during a run rather than set for it (the load, the `SELECT 1` round
/// trip, uncommitted changes): it differs between any two runs.
pub fn measured_condition(key: &str) -> bool {
    key.contains("load_average")
        || key.contains("select1_round_trip")
        || key == "metadata.sdk.git_dirty"
}

/// Every condition that differs between the two documents: each leaf of
/// `metadata` (times and the DSN aside; `pg_settings` rows keyed by name;
/// the command line's options, the output path and DSN aside, as
/// `metadata.command`), `durability`, `protocol` and the memory method, as
/// `(path, old, new)`.
pub fn differences(old: &Document, new: &Document) -> Vec<(String, String, String)> {
    let (a, b) = (conditions(old), conditions(new));
    let mut out = Vec::new();
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let absent = NOT_RECORDED.to_owned();
    for k in keys {
        let (x, y) = (a.get(k).unwrap_or(&absent), b.get(k).unwrap_or(&absent));
        if x != y {
            out.push((k.clone(), x.clone(), y.clone()));
        }
    }
    out
}

/// The conditions of a document, flattened to `path -> value`.
fn conditions(d: &Document) -> std::collections::BTreeMap<String, String> {
    let mut v = serde_json::json!({
        "metadata": d.metadata,
        "durability": d.durability,
        "protocol": d.protocol,
        "memory_method": d.memory.method,
    });
    if let Some(m) = v.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        // When the run happened and where the DSN pointed are not conditions
        // of the measurement.
        for k in ["started_at", "finished_at"] {
            m.remove(k);
        }
        m.insert(
            "command".into(),
            serde_json::Value::String(command_options(&d.metadata.command)),
        );
        if let Some(db) = m.get_mut("database").and_then(|d| d.as_object_mut()) {
            db.remove("dsn");
            if let Some(serde_json::Value::Array(rows)) = db.remove("settings") {
                let by_name: serde_json::Map<String, serde_json::Value> = rows
                    .into_iter()
                    .filter_map(|r| {
                        let name = r.get("name")?.as_str()?.to_owned();
                        let setting = r.get("setting")?.as_str()?;
                        let unit = r.get("unit").and_then(|u| u.as_str());
                        Some((
                            name,
                            serde_json::Value::String(crate::report::fmt_setting(setting, unit)),
                        ))
                    })
                    .collect();
                db.insert("settings".into(), serde_json::Value::Object(by_name));
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    flatten("", &v, &mut out);
    out
}

/// The options of a command line that can change a measurement, joined by
/// spaces: without the program, a leading `run` subcommand, and the options
/// that only say where the database is, where the document goes or whether
/// leftovers are dropped first.
fn command_options(argv: &[String]) -> String {
    const WITH_VALUE: [&str; 4] = ["--output", "-o", "--dsn", "--dsn-file"];
    let mut out: Vec<&str> = Vec::new();
    let mut args = argv.iter().skip(1).map(String::as_str).peekable();
    if args.peek() == Some(&"run") {
        args.next();
    }
    while let Some(a) = args.next() {
        if WITH_VALUE.contains(&a) {
            args.next();
            continue;
        }
        let dropped = a == "--clean" || WITH_VALUE.iter().any(|o| a.starts_with(&format!("{o}=")));
        if !dropped {
            out.push(a);
        }
    }
    out.join(" ")
}

fn flatten(
    path: &str,
    v: &serde_json::Value,
    out: &mut std::collections::BTreeMap<String, String>,
) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                flatten(&p, x, out);
            }
        }
        serde_json::Value::String(s) => {
            out.insert(path.to_owned(), s.clone());
        }
        other => {
            out.insert(path.to_owned(), other.to_string());
        }
    }
}

/// Refuses a document whose run failed its own checks.
pub fn refuse_failed(doc: &Document, what: &str) -> Result<()> {
    if doc.outcome.ok {
        return Ok(());
    }
    Err(Error::Refused(format!(
        "{what} records a failed run (outcome.ok is false): {}; its figures are not evidence",
        if doc.outcome.failures.is_empty() {
            "no failure recorded".to_owned()
        } else {
            doc.outcome.failures.join("; ")
        }
    )))
}

/// Refuses what is not compared: a failed run, durable against
/// non-durable, a threshold that is not a percentage.
fn refuse_incomparable(old: &Document, new: &Document, threshold_pct: f64) -> Result<()> {
    refuse_failed(old, "the old document")?;
    refuse_failed(new, "the new document")?;
    refuse_mixed_durability(old, new)?;
    if !(threshold_pct.is_finite() && threshold_pct >= 0.0) {
        return Err(Error::Config(
            "--threshold must be a percentage >= 0".into(),
        ));
    }
    Ok(())
}

/// The verdict over every figure, and how many got each verdict.
fn verdict_line(regressed: bool, counts: &std::collections::BTreeMap<&str, usize>) -> String {
    format!(
        "**Verdict: {}** ({}).",
        if regressed {
            "regression"
        } else {
            "no regression"
        },
        counts
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The comparison: Markdown, and whether any figure regressed.
pub fn compare(old: &Document, new: &Document, threshold_pct: f64) -> Result<(String, bool)> {
    refuse_incomparable(old, new, threshold_pct)?;
    let mut out = String::from("# pgmq-bench comparison\n\n");
    write_conditions(&mut out, &differences(old, new));
    let _ = writeln!(
        out,
        "Threshold {threshold_pct}%: a figure regresses when its median moves the wrong way by more than that \
         and the change is beyond the spread: with at least {MIN_RUNS_FOR_TEST} values a side (rounds, or \
         per-invocation medians of an aggregate document) a two-sided Mann-Whitney U test at p < {ALPHA}, \
         with fewer min–max ranges that do not overlap.\n\n\
         | Figure | Unit | Old median (min–max) | New median (min–max) | Change | p (Mann-Whitney) | Verdict |\n\
         | --- | --- | --- | --- | --- | --- | --- |"
    );
    let (regressed, counts) = write_figure_rows(&mut out, old, new, threshold_pct);
    let _ = writeln!(out, "\n{}", verdict_line(regressed, &counts));
    Ok((out, regressed))
}

/// `compare --markdown`: a heading, a line on the conditions, one verdict
/// line per headline figure either document has (`- label: old → new unit
/// (change): verdict`, like criterion's one line per benchmark), and the
/// verdict over every figure, which decides the exit status as
/// [`compare`]'s does. `old_name` and `new_name` name the documents (their
/// paths).
pub fn headline(
    old: &Document,
    new: &Document,
    threshold_pct: f64,
    (old_name, new_name): (&str, &str),
) -> Result<(String, bool)> {
    refuse_incomparable(old, new, threshold_pct)?;
    let mut out = format!("### pgmq-bench compare: {old_name} → {new_name}\n\n");
    let diffs: Vec<_> = differences(old, new)
        .into_iter()
        .filter(|(k, _, _)| !measured_condition(k))
        .collect();
    let short = |v: &str| match v.char_indices().nth(40) {
        Some((i, _)) => format!("{}…", &v[..i]),
        None => v.to_owned(),
    };
    let shown: Vec<String> = diffs
        .iter()
        .filter(|(k, _, _)| k != COMMAND)
        .take(2)
        .map(|(k, a, b)| format!("{k} {} → {}", short(a), short(b)))
        .collect();
    let _ = writeln!(
        out,
        "Threshold {threshold_pct}%; {}.\n",
        match diffs.len() {
            0 => "same workload, build profile, versions and protocol".to_owned(),
            n if n > shown.len() => format!(
                "conditions differ: {} and {} more (`pgmq-bench compare` lists them)",
                shown.join(", "),
                n - shown.len()
            ),
            _ => format!("conditions differ: {}", shown.join(", ")),
        }
    );
    for (id, label) in HEADLINE {
        let line = match (old.figure(id), new.figure(id)) {
            (Some(o), Some(n)) => {
                let j = judge_with_test(o, n, threshold_pct);
                let mut change = j
                    .change_pct
                    .map_or("no base".to_owned(), |c| format!("{c:+.1}%"));
                if let Some(p) = j.p_value {
                    let _ = write!(change, ", p = {p:.3}");
                }
                format!(
                    "{} → {} {} ({change}): {}",
                    fmt_value(o.median, &o.unit),
                    fmt_value(n.median, &n.unit),
                    n.unit,
                    j.verdict.as_str()
                )
            }
            (Some(_), None) => format!("only in {old_name}: {}", Verdict::Removed.as_str()),
            (None, Some(_)) => format!("only in {new_name}: {}", Verdict::Added.as_str()),
            (None, None) => continue,
        };
        let _ = writeln!(out, "- {label}: {line}");
    }
    let (regressed, counts) = write_figure_rows(&mut String::new(), old, new, threshold_pct);
    let _ = writeln!(
        out,
        "\n{} Every figure's row: `pgmq-bench compare {old_name} {new_name}`.",
        verdict_line(regressed, &counts)
    );
    Ok((out, regressed))
}

/// Refuses to compare a durable document with a non-durable one, naming
/// what made either non-durable.
fn refuse_mixed_durability(old: &Document, new: &Document) -> Result<()> {
    if old.durability.class == new.durability.class {
        return Ok(());
    }
    let name = |d: &Document| match d.durability.class {
        DurabilityClass::Durable => "durable",
        DurabilityClass::NonDurable => "non-durable",
    };
    Err(Error::Refused(format!(
        "cannot compare a {} result with a {} one ({}): unlogged queues or fsync, synchronous_commit, \
         full_page_writes or autovacuum off change what is measured",
        name(old),
        name(new),
        old.durability
            .reasons
            .iter()
            .chain(new.durability.reasons.iter())
            .cloned()
            .collect::<Vec<_>>()
            .join("; ")
    )))
}

/// The conditions section: the table of differing conditions with its
/// caveats, or a line saying there is none.
fn write_conditions(out: &mut String, diffs: &[(String, String, String)]) {
    if diffs.is_empty() {
        out.push_str("Same workload, build profile, versions and protocol.\n\n");
        return;
    }
    out.push_str("| Condition | Old | New |\n| --- | --- | --- |\n");
    for (k, a, b) in diffs {
        let _ = writeln!(out, "| {k} | {a} | {b} |");
    }
    // The command line repeats the recorded workload (a changed option
    // shows twice: as its workload field and here), and a condition
    // only one document records is not known to have changed.
    let changed = diffs
        .iter()
        .filter(|(k, a, b)| k != COMMAND && a != NOT_RECORDED && b != NOT_RECORDED)
        .count();
    if changed > 1 {
        out.push_str("\nMore than one condition changed: a difference below cannot be pinned on one of them.\n");
    }
    if diffs
        .iter()
        .any(|(_, a, b)| a == NOT_RECORDED || b == NOT_RECORDED)
    {
        let _ = writeln!(
            out,
            "\n{NOT_RECORDED}: not recorded in that document (older documents record fewer conditions)."
        );
    }
    out.push('\n');
}

/// A table row per figure (the new document's, then those only the old one
/// has); whether any figure regressed, and how many got each verdict.
fn write_figure_rows(
    out: &mut String,
    old: &Document,
    new: &Document,
    threshold_pct: f64,
) -> (bool, std::collections::BTreeMap<&'static str, usize>) {
    let mut regressed = false;
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for nf in &new.figures {
        let (change, verdict, p, old_cell) = match old.figure(&nf.id) {
            Some(of) => {
                let j = judge_with_test(of, nf, threshold_pct);
                (j.change_pct, j.verdict, j.p_value, fmt_figure(of))
            }
            None => (None, Verdict::Added, None, "–".to_owned()),
        };
        regressed |= verdict == Verdict::Regression;
        *counts.entry(verdict.as_str()).or_default() += 1;
        let change = change.map_or("–".to_owned(), |c| format!("{c:+.1}%"));
        let p = p.map_or("–".to_owned(), |p| format!("{p:.3}"));
        row(
            out,
            nf,
            [&old_cell, &fmt_figure(nf), &change, &p, verdict.as_str()],
        );
    }
    for of in &old.figures {
        if new.figure(&of.id).is_none() {
            *counts.entry(Verdict::Removed.as_str()).or_default() += 1;
            let old_cell = fmt_figure(of);
            row(
                out,
                of,
                [&old_cell, "–", "–", "–", Verdict::Removed.as_str()],
            );
        }
    }
    (regressed, counts)
}

/// A row of the comparison table: the figure's label and unit, then the
/// old value, the new value, the change, the test's p and the verdict.
fn row(out: &mut String, f: &Figure, cells: [&str; 5]) {
    let _ = writeln!(
        out,
        "| {} | {} | {} |",
        f.label.trim_end_matches(','),
        f.unit,
        cells.join(" | ")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differing_settings_print_with_their_units() {
        let text = include_str!("../../tests/data/dev-machine-fbd4125.json");
        let old = Document::from_json(text, "old").unwrap();
        let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
        for r in v["metadata"]["database"]["settings"]
            .as_array_mut()
            .unwrap()
        {
            if r["name"] == "shared_buffers" {
                r["setting"] = "40961".into();
            }
        }
        let new = Document::from_json(&v.to_string(), "new").unwrap();
        let d = differences(&old, &new);
        assert!(
            d.contains(&(
                "metadata.database.settings.shared_buffers".into(),
                "256MB".into(),
                "327688kB".into()
            )),
            "{d:?}"
        );
    }
}
