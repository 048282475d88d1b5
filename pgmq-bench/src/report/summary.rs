//! `pgmq-bench summary --markdown`, also printed at the end of every run:
//! what a release engineer pastes into a release note. At most
//! [`MAX_LINES`] lines: the SDK's version and commit, the benchmark
//! profile, PostgreSQL and PGMQ, the build and the machine, one row per
//! [headline figure](HEADLINE) (median, min–max, runs), and the targets met
//! and missed. `compare --markdown` gives one verdict line per headline
//! figure (see [`compare::headline`](super::compare::headline)).

use std::fmt::Write as _;

use crate::document::{Document, Figure, Summary, SummaryDatabase, SummaryFigure, SUMMARY_SCHEMA};
use crate::report::{count, fmt_value};

/// The headline figures, `(figure id, label)` in the order of their rows: a
/// small fixed set that every profile measures (a run of some sections
/// only has some of them). Sends one at a time and in batches, the keyed
/// send's cost, the worker's throughput at 1 and 8 handlers and against the
/// one-connection read + delete loop, two worker processes on one queue,
/// the NOTIFY wake-up latency's p50 and p99, the batch handler's gain, an
/// idle worker's CPU and the worker's peak memory.
pub const HEADLINE: [(&str, &str); 12] = [
    ("send_single.rate", "Single send"),
    ("send_batch.rate", "Batch send"),
    (
        "send_batch_keyed.keyed_vs_plain",
        "Keyed ÷ plain batch send",
    ),
    ("consume_scaling.w1.throughput", "Worker, 1 handler"),
    ("consume_scaling.w8.throughput", "Worker, 8 handlers"),
    (
        "consume_scaling.w8.vs_baseline",
        "Worker (8 handlers) ÷ read + delete loop",
    ),
    ("worker_processes.p2.throughput", "Worker, 2 processes"),
    ("wakeup_latency.notify.p50_ms", "Wake-up (NOTIFY), p50"),
    ("wakeup_latency.notify.p99_ms", "Wake-up (NOTIFY), p99"),
    (
        "batch_handler.batch_tx_vs_per_message",
        "Batch handler ÷ per-message handler",
    ),
    ("idle_worker.cpu_percent", "Idle worker CPU"),
    ("memory.consume_scaling.peak_rss_mib", "Worker peak RSS"),
];

/// The most lines [`markdown`] writes.
pub const MAX_LINES: usize = 25;

/// The headline figures `d` has, with their labels, in row order.
pub fn headline(d: &Document) -> impl Iterator<Item = (&'static str, &Figure)> {
    HEADLINE
        .iter()
        .filter_map(|(id, label)| d.figure(id).map(|f| (*label, f)))
}

/// The Markdown summary of `d`, at most [`MAX_LINES`] lines.
pub fn markdown(d: &Document) -> String {
    let mut out = String::new();
    title(&mut out, d);
    let _ = writeln!(
        out,
        "\n| Headline figure | Median | Min–max | Runs |\n| --- | ---: | ---: | ---: |"
    );
    for (label, f) in headline(d) {
        let range = if f.runs.len() > 1 {
            format!(
                "{}–{}",
                fmt_value(f.min, &f.unit),
                fmt_value(f.max, &f.unit)
            )
        } else {
            "–".to_owned()
        };
        let _ = writeln!(
            out,
            "| {label} | {} {} | {range} | {} |",
            fmt_value(f.median, &f.unit),
            f.unit,
            f.runs.len()
        );
    }
    out.push('\n');
    targets(&mut out, d);
    warnings(&mut out, d);
    out
}

/// The heading and the two lines of conditions.
fn title(out: &mut String, d: &Document) {
    let m = &d.metadata;
    let commit = m
        .sdk
        .git_commit
        .as_deref()
        .map_or("unknown".to_owned(), |c| {
            let short = &c[..c.len().min(12)];
            if m.sdk.git_dirty == Some(true) {
                format!("{short}, uncommitted changes")
            } else {
                short.to_owned()
            }
        });
    let _ = writeln!(
        out,
        "### pgmq-bench: SDK {} ({commit}), {} profile: {}",
        m.sdk.version,
        d.profile(),
        if d.outcome.ok { "ok" } else { "FAILED" }
    );
    let db = &m.database;
    let h = &m.host;
    let rustc = m
        .build
        .rustc
        .as_deref()
        .map_or("rustc unknown".to_owned(), |r| {
            r.split_whitespace().take(2).collect::<Vec<_>>().join(" ")
        });
    let _ = writeln!(
        out,
        "PostgreSQL {}, PGMQ {}, {} · {} build, {rustc} · {} × {}, {:.1} GiB, {}",
        server_version(db.server_version_num),
        db.pgmq_version,
        if d.durability.comparable {
            "durable"
        } else {
            "NON-DURABLE"
        },
        m.build.profile,
        h.cpu_count,
        h.cpu_model.as_deref().unwrap_or("unknown CPU"),
        h.memory_bytes.unwrap_or(0) as f64 / (1u64 << 30) as f64,
        h.os_release.as_deref().unwrap_or(&h.os)
    );
    let p = &d.protocol;
    let rounds = match p.invocations {
        Some(n) => format!(
            "{n} invocations of {} (runs: invocations)",
            count(p.repeat, "measured round")
        ),
        None if p.warmup == 0 => format!("{}, no warm-up", count(p.repeat, "measured round")),
        None => format!(
            "{} after {}",
            count(p.repeat, "measured round"),
            count(p.warmup, "warm-up round")
        ),
    };
    let secs = (m.finished_at - m.started_at).num_seconds().max(0);
    let _ = writeln!(
        out,
        "{rounds} · {} UTC, {} min {} s · load {} at start",
        m.started_at.format("%Y-%m-%d %H:%M"),
        secs / 60,
        secs % 60,
        h.load_average_start
            .map_or("unknown".to_owned(), |l| format!("{l:.2}"))
    );
}

/// `15.18` for `server_version_num` 150018 (`9.6.24` before 10).
fn server_version(num: i32) -> String {
    if num >= 100_000 {
        format!("{}.{}", num / 10_000, num % 10_000)
    } else {
        format!("{}.{}.{}", num / 10_000, num / 100 % 100, num % 100)
    }
}

/// One line: how many targets were met, the missed ones with their
/// observed value and limit, how many were not evaluated.
fn targets(out: &mut String, d: &Document) {
    let met = d.targets.iter().filter(|t| t.pass == Some(true)).count();
    let missed: Vec<String> = d
        .targets
        .iter()
        .filter(|t| t.pass == Some(false))
        .map(|t| {
            format!(
                "{} ({} {}, limit {})",
                t.id,
                t.observed.map_or("–".to_owned(), |v| fmt_value(v, &t.unit)),
                t.unit,
                fmt_value(t.limit, &t.unit)
            )
        })
        .collect();
    let unevaluated = d.targets.iter().filter(|t| t.pass.is_none()).count();
    let _ = writeln!(
        out,
        "Targets (limits set for --full on a 2-core x86_64 machine): {met} met, {} missed{}, \
         {unevaluated} not evaluated.",
        missed.len(),
        if missed.is_empty() {
            String::new()
        } else {
            format!(": {}", missed.join(", "))
        }
    );
}

/// One line for the failures, if any, and one for the warnings, if any.
fn warnings(out: &mut String, d: &Document) {
    let o = &d.outcome;
    if let Some(first) = o.failures.first() {
        let _ = writeln!(
            out,
            "FAILED checks: {} (the first: {first}); the figures are not evidence.",
            o.failures.len()
        );
    }
    if !o.warnings.is_empty() {
        let _ = writeln!(
            out,
            "Warnings: {} (runs under 1 s and the like); `pgmq-bench report` lists them.",
            o.warnings.len()
        );
    }
}

impl Document {
    /// The summary of this document.
    pub fn summary(&self) -> Summary {
        Summary {
            schema: SUMMARY_SCHEMA,
            source_schema: self.schema.clone(),
            started_at: self.metadata.started_at,
            finished_at: self.metadata.finished_at,
            sdk: self.metadata.sdk.clone(),
            profile: self.profile(),
            repeat: self.protocol.repeat,
            invocations: self.protocol.invocations,
            build: self.metadata.build.clone(),
            database: SummaryDatabase {
                server_version: self.metadata.database.server_version.clone(),
                server_version_num: self.metadata.database.server_version_num,
                pgmq_version: self.metadata.database.pgmq_version.clone(),
                pgmq_install: self.metadata.database.pgmq_install.clone(),
            },
            host: self.metadata.host.clone(),
            outcome: self.outcome.clone(),
            durable_comparable: self.durability.comparable,
            headline: headline(self).map(|(_, f)| f.id.clone()).collect(),
            figures: self
                .figures
                .iter()
                .map(|f| SummaryFigure {
                    id: f.id.clone(),
                    label: f.label.clone(),
                    unit: f.unit.clone(),
                    better: f.better,
                    median: f.median,
                    min: f.min,
                    max: f.max,
                    runs: f.runs.len(),
                })
                .collect(),
            targets: self.targets.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_versions() {
        assert_eq!(server_version(150018), "15.18");
        assert_eq!(server_version(170002), "17.2");
        assert_eq!(server_version(90624), "9.6.24");
    }

    /// The Markdown summary of the document `text`, checked to fit in
    /// [`MAX_LINES`].
    fn summary_of(text: &str, name: &str) -> String {
        let md = markdown(&Document::from_json(text, name).unwrap());
        assert!(md.lines().count() <= MAX_LINES, "{md}");
        md
    }

    #[test]
    fn a_committed_full_run_fits_in_25_lines_with_every_headline_row() {
        let md = summary_of(
            include_str!("../../../docs/results/dev-machine-6773cc8.json"),
            "committed",
        );
        for (_, label) in HEADLINE {
            assert!(md.contains(&format!("| {label} |")), "{label}: {md}");
        }
        assert!(md.starts_with("### pgmq-bench: SDK 0.1.0 (6773cc838b80), full profile: ok\n"));
        assert!(md.contains("| Single send | 2,870 msg/s | "), "{md}");
    }

    #[test]
    fn an_older_document_without_a_profile_reads_as_the_full_run() {
        // Kept as test data; it predates the recorded profile (its
        // flagless run was the full one) and several sections, whose rows
        // are left out.
        let md = summary_of(
            include_str!("../../tests/data/dev-machine-fbd4125.json"),
            "older",
        );
        assert!(md.contains("| Single send | 1,572 msg/s | "), "{md}");
        assert!(!md.contains("| Keyed ÷ plain batch send |"), "{md}");
        assert!(md.starts_with("### pgmq-bench: SDK 0.1.0 (fbd412580473), full profile: ok\n"));
    }
}
