//! The suite's table: one row per scenario (or sub-scenario), as Markdown and JSON.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::ctx::Ctx;
use super::ledger::Tally;
use pgmq_testkit::environment::{Build, Database, Durability, Sdk};

/// One check of a scenario beyond the per-key counts.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Check {
    pub name: String,
    pub pass: bool,
    pub detail: String,
}

impl Check {
    pub(crate) fn new(name: &str, pass: bool, detail: impl Into<String>) -> Check {
        Check {
            name: name.to_owned(),
            pass,
            detail: detail.into(),
        }
    }

    /// The failed check `name` of a cell or step (`what`) that could not
    /// run, and why.
    pub(crate) fn could_not_run(name: &str, what: &str, e: impl std::fmt::Display) -> Check {
        Check::new(name, false, format!("{what} could not run: {e}"))
    }
}

/// The most duplicates a scenario's faults can explain: the messages held
/// (claimed, or handled and not yet acknowledged) and the reads in flight at
/// each fault, as measured then.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DupBound {
    pub max: u64,
    /// How the bound was made, per fault.
    pub why: String,
}

/// One row of the table.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    pub scenario: String,
    pub title: String,
    #[serde(flatten)]
    pub tally: Tally,
    /// Whether duplicates are legitimate here (at-least-once after a crash).
    pub duplicates_allowed: bool,
    /// Where they are: at most this many (a row with more fails).
    pub duplicate_bound: Option<DupBound>,
    pub checks: Vec<Check>,
    pub pass: bool,
    pub seconds: f64,
}

impl Row {
    /// A row whose verdict follows from the counts and the checks.
    /// Duplicates are allowed only up to `bound`; without a bound, none are.
    pub(crate) fn new(
        scenario: &str,
        title: &str,
        tally: Tally,
        bound: Option<DupBound>,
        mut checks: Vec<Check>,
        took: Duration,
    ) -> Row {
        if let Some(b) = &bound {
            checks.push(Check::new(
                "duplicates within what the faults explain",
                tally.duplicated <= b.max,
                format!(
                    "{} duplicated, at most {}: {}",
                    tally.duplicated, b.max, b.why
                ),
            ));
        }
        let duplicates_allowed = bound.is_some();
        let pass = tally.lost == 0
            && tally.unexpected == 0
            && (duplicates_allowed || tally.duplicated == 0)
            && checks.iter().all(|c| c.pass);
        Row {
            scenario: scenario.to_owned(),
            title: title.to_owned(),
            tally,
            duplicates_allowed,
            duplicate_bound: bound,
            checks,
            pass,
            seconds: took.as_secs_f64(),
        }
    }

    /// Adds a check; a failed check fails the row.
    pub(crate) fn push_check(&mut self, c: Check) {
        self.pass &= c.pass;
        self.checks.push(c);
    }

    /// A scenario whose harness failed (it did not get to a verdict).
    pub(crate) fn harness_failure(scenario: u8, error: &str) -> Row {
        Row {
            scenario: scenario.to_string(),
            title: "harness error".to_owned(),
            tally: Tally::default(),
            duplicates_allowed: false,
            duplicate_bound: None,
            checks: vec![Check::new("scenario ran", false, error)],
            pass: false,
            seconds: 0.0,
        }
    }
}

/// The whole result.
#[derive(Debug, Serialize)]
pub(crate) struct Document {
    pub schema: &'static str,
    pub run_id: String,
    pub messages_per_scenario: usize,
    pub started_at: String,
    pub seconds: f64,
    pub pass: bool,
    pub machine: String,
    pub server: String,
    /// Version, git commit and dirty flag of the source this binary was built from.
    pub sdk: Sdk,
    /// Build profile (the suite's timings mean little in a debug build).
    pub build: Build,
    /// The suite's cluster: PostgreSQL and PGMQ versions, the allow-listed settings
    /// ([`RECORDED_SETTINGS`](pgmq_testkit::environment::RECORDED_SETTINGS)).
    pub database: Database,
    /// fsync, synchronous_commit, full_page_writes, autovacuum: a crash test
    /// on a server without them proves less.
    pub durability: Durability,
    /// The fault worker's deliberate bug, when one was asked for (the run
    /// must then fail).
    pub sabotage: Option<String>,
    pub rows: Vec<Row>,
    /// With `--campaign`: each seed's schedule, faults by kind and replay
    /// command (one row per seed above).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub campaign: Option<Vec<crate::campaign::model::SeedSummary>>,
}

impl Document {
    pub(crate) fn new(ctx: &Ctx, rows: Vec<Row>, took: Duration) -> Document {
        Document {
            schema: "pgmq-faults.v2",
            run_id: ctx.run_id.clone(),
            messages_per_scenario: ctx.n,
            started_at: ctx.started_at.to_rfc3339(),
            seconds: took.as_secs_f64(),
            pass: rows.iter().all(|r| r.pass),
            machine: ctx.machine.clone(),
            server: ctx.server.clone(),
            sdk: pgmq_testkit::environment::sdk(),
            build: pgmq_testkit::environment::build(),
            database: ctx.database.clone(),
            durability: ctx.durability.clone(),
            sabotage: ctx.sabotage_name(),
            rows,
            campaign: None,
        }
    }

    /// The table, then each scenario's checks.
    pub(crate) fn markdown(&self) -> String {
        let mut s = String::new();
        self.write_table(&mut s);
        let _ = writeln!(
            s,
            "\nRejected counts produces that failed without effect (not sent, or refused by the server); \
             unknown ones were in flight when the connection died, and are recovered when the message \
             was found in the queue afterwards.\n"
        );
        self.write_checks(&mut s);
        self.write_campaign(&mut s);
        self.write_footer(&mut s);
        s
    }

    /// With `--campaign`: faults by kind per seed, and the replay command of
    /// each seed that failed.
    fn write_campaign(&self, s: &mut String) {
        let Some(seeds) = &self.campaign else {
            return;
        };
        let _ = writeln!(s, "\n| seed | faults injected, by kind | verdict |");
        let _ = writeln!(s, "| ---: | --- | --- |");
        for c in seeds {
            let kinds: Vec<String> = c
                .faults_by_kind
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            let _ = writeln!(
                s,
                "| {} | {} | {} |",
                c.seed,
                if kinds.is_empty() {
                    "none".to_owned()
                } else {
                    kinds.join(", ")
                },
                if c.pass { "pass" } else { "FAIL" }
            );
        }
        for c in seeds.iter().filter(|c| !c.pass) {
            let _ = writeln!(s, "\nreplay seed {}: `{}`", c.seed, c.replay);
        }
    }

    /// The table: one line per row, with its counts and verdict.
    fn write_table(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "| scenario | produced (committed / rejected / unknown) | handled | lost | duplicated | unexpected | dead-lettered | verdict |"
        );
        let _ = writeln!(s, "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |");
        for r in &self.rows {
            let t = &r.tally;
            let unknown = if t.unknown > 0 {
                format!("{} ({} recovered)", t.unknown, t.unknown_recovered)
            } else {
                "0".to_owned()
            };
            let dups = match &r.duplicate_bound {
                Some(b) => format!("{} (≤ {})", t.duplicated, b.max),
                None => t.duplicated.to_string(),
            };
            let _ = writeln!(
                s,
                "| {} {} | {} / {} / {} | {} | {} | {} | {} | {} | {} |",
                r.scenario,
                r.title,
                t.committed,
                t.rejected + t.not_sent,
                unknown,
                t.handled,
                t.lost,
                dups,
                t.unexpected,
                t.dead_lettered,
                if r.pass { "pass" } else { "FAIL" }
            );
        }
    }

    /// Each row's verdict, its losses and unexpected keys, and its checks.
    fn write_checks(&self, s: &mut String) {
        for r in &self.rows {
            let _ = writeln!(
                s,
                "- **{} {}** ({:.1} s): {}",
                r.scenario,
                r.title,
                r.seconds,
                if r.pass { "pass" } else { "FAIL" }
            );
            if r.tally.lost > 0 {
                let _ = writeln!(
                    s,
                    "  - FAIL lost {} (left in queue {}), e.g. keys {:?}",
                    r.tally.lost, r.tally.left_in_queue, r.tally.lost_sample
                );
            }
            if r.tally.unexpected > 0 {
                let _ = writeln!(
                    s,
                    "  - FAIL unexpected {}, e.g. keys {:?}",
                    r.tally.unexpected, r.tally.unexpected_sample
                );
            }
            for c in &r.checks {
                let _ = writeln!(
                    s,
                    "  - {} {}: {}",
                    if c.pass { "ok" } else { "FAIL" },
                    c.name,
                    c.detail
                );
            }
        }
    }

    /// The closing line: the run's verdict, and what it ran on and against.
    fn write_footer(&self, s: &mut String) {
        let commit = match (&self.sdk.git_commit, self.sdk.git_dirty) {
            (Some(c), Some(true)) => format!("commit {} (dirty)", &c[..c.len().min(7)]),
            (Some(c), _) => format!("commit {}", &c[..c.len().min(7)]),
            (None, _) => "commit unknown".to_owned(),
        };
        let durable = if self.durability.reasons.is_empty() {
            "durable settings".to_owned()
        } else {
            format!("NOT durable: {}", self.durability.reasons.join(", "))
        };
        let _ = writeln!(
            s,
            "\n{} rows, {}; {:.0} s, {} messages per scenario; {}; {}; {} build, {}; {}; run {}{}.",
            self.rows.len(),
            if self.pass {
                "all passed"
            } else {
                "SOME FAILED"
            },
            self.seconds,
            self.messages_per_scenario,
            self.machine,
            self.server,
            self.build.profile,
            commit,
            durable,
            self.run_id,
            match &self.sabotage {
                Some(x) => format!("; SABOTAGED ({x})"),
                None => String::new(),
            }
        );
    }
}
