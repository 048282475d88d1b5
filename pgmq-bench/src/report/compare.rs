//! `pgmq-bench compare OLD NEW`: every figure's change and a verdict that
//! takes the measured spread into account.
//!
//! A figure regresses only when its median moved the wrong way by more than
//! the threshold *and* the two min–max ranges do not overlap: a change the
//! runs' own spread can explain is reported as noise, not as a regression.
//! Durable and non-durable documents are never compared.

use std::fmt::Write as _;

use crate::document::{Better, Document, DurabilityClass, Figure};
use crate::error::{Error, Result};
use crate::report::fmt_figure;

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
/// ```
pub fn judge(old: &Figure, new: &Figure, threshold_pct: f64) -> (Option<f64>, Verdict) {
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
    let overlap = new.min <= old.max && old.min <= new.max;
    if overlap {
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

/// The conditions that differ between the two documents.
fn differences(old: &Document, new: &Document) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut diff = |name: &str, a: String, b: String| {
        if a != b {
            out.push((name.to_owned(), a, b));
        }
    };
    let (o, n) = (&old.metadata, &new.metadata);
    diff(
        "SDK commit",
        format!("{:?}", o.sdk.git_commit),
        format!("{:?}", n.sdk.git_commit),
    );
    diff("build", o.build.profile.clone(), n.build.profile.clone());
    diff(
        "rustc",
        format!("{:?}", o.build.rustc),
        format!("{:?}", n.build.rustc),
    );
    diff(
        "CPU",
        format!("{:?} x{}", o.host.cpu_model, o.host.cpu_count),
        format!("{:?} x{}", n.host.cpu_model, n.host.cpu_count),
    );
    diff(
        "PostgreSQL",
        o.database.server_version_num.to_string(),
        n.database.server_version_num.to_string(),
    );
    diff(
        "PGMQ",
        o.database.pgmq_version.clone(),
        n.database.pgmq_version.clone(),
    );
    let (ow, nw) = (&o.workload, &n.workload);
    diff("messages", ow.messages.to_string(), nw.messages.to_string());
    diff(
        "single messages",
        ow.single_messages.to_string(),
        nw.single_messages.to_string(),
    );
    diff(
        "batch messages",
        ow.batch_messages.to_string(),
        nw.batch_messages.to_string(),
    );
    diff(
        "batch size",
        ow.batch_size.to_string(),
        nw.batch_size.to_string(),
    );
    diff(
        "visibility timeout",
        ow.visibility_timeout_s.to_string(),
        nw.visibility_timeout_s.to_string(),
    );
    diff(
        "payload bytes",
        ow.payload_bytes.to_string(),
        nw.payload_bytes.to_string(),
    );
    diff(
        "handler work ms",
        ow.handler_work_ms.to_string(),
        nw.handler_work_ms.to_string(),
    );
    diff(
        "pool size",
        ow.pool_size.to_string(),
        nw.pool_size.to_string(),
    );
    diff(
        "repeat",
        old.protocol.repeat.to_string(),
        new.protocol.repeat.to_string(),
    );
    diff(
        "warm-up",
        old.protocol.warmup.to_string(),
        new.protocol.warmup.to_string(),
    );
    diff(
        "memory method",
        old.memory.method.clone(),
        new.memory.method.clone(),
    );
    out
}

/// The comparison: Markdown, and whether any figure regressed.
pub fn compare(old: &Document, new: &Document, threshold_pct: f64) -> Result<(String, bool)> {
    if old.durability.class != new.durability.class {
        let name = |d: &Document| match d.durability.class {
            DurabilityClass::Durable => "durable",
            DurabilityClass::NonDurable => "non-durable",
        };
        return Err(Error::Refused(format!(
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
        )));
    }
    if !(threshold_pct.is_finite() && threshold_pct >= 0.0) {
        return Err(Error::Config(
            "--threshold must be a percentage >= 0".into(),
        ));
    }
    let mut out = String::from("# pgmq-bench comparison\n\n");
    let diffs = differences(old, new);
    if diffs.is_empty() {
        out.push_str("Same workload, build profile, versions and protocol.\n\n");
    } else {
        out.push_str("| Condition | Old | New |\n| --- | --- | --- |\n");
        for (k, a, b) in &diffs {
            let _ = writeln!(out, "| {k} | {a} | {b} |");
        }
        if diffs.len() > 1 {
            out.push_str("\nMore than one condition changed: a difference below cannot be pinned on one of them.\n");
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "Threshold {threshold_pct}%: a figure regresses when its median moves the wrong way by more than that \
         and the min–max ranges of the two documents do not overlap.\n\n\
         | Figure | Unit | Old median (min–max) | New median (min–max) | Change | Verdict |\n\
         | --- | --- | --- | --- | --- | --- |"
    );
    let mut regressed = false;
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for nf in &new.figures {
        let (change, verdict, old_cell) = match old.figure(&nf.id) {
            Some(of) => {
                let (c, v) = judge(of, nf, threshold_pct);
                (c, v, fmt_figure(of))
            }
            None => (None, Verdict::Added, "–".to_owned()),
        };
        regressed |= verdict == Verdict::Regression;
        *counts.entry(verdict.as_str()).or_default() += 1;
        let _ = writeln!(
            out,
            "| {} | {} | {old_cell} | {} | {} | {} |",
            nf.label.trim_end_matches(','),
            nf.unit,
            fmt_figure(nf),
            change.map_or("–".to_owned(), |c| format!("{c:+.1}%")),
            verdict.as_str()
        );
    }
    for of in &old.figures {
        if new.figure(&of.id).is_none() {
            *counts.entry(Verdict::Removed.as_str()).or_default() += 1;
            let _ = writeln!(
                out,
                "| {} | {} | {} | – | – | {} |",
                of.label.trim_end_matches(','),
                of.unit,
                fmt_figure(of),
                Verdict::Removed.as_str()
            );
        }
    }
    let _ = writeln!(
        out,
        "\n**Verdict: {}** ({}).",
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
    );
    Ok((out, regressed))
}
