//! The suite's table: one row per scenario (or sub-scenario), as Markdown and JSON.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::ctx::Ctx;
use super::ledger::Tally;

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
    pub checks: Vec<Check>,
    pub pass: bool,
    pub seconds: f64,
}

impl Row {
    /// A row whose verdict follows from the counts and the checks.
    pub(crate) fn new(
        scenario: &str,
        title: &str,
        tally: Tally,
        duplicates_allowed: bool,
        checks: Vec<Check>,
        took: Duration,
    ) -> Row {
        let pass = tally.lost == 0
            && tally.unexpected == 0
            && (duplicates_allowed || tally.duplicated == 0)
            && checks.iter().all(|c| c.pass);
        Row {
            scenario: scenario.to_owned(),
            title: title.to_owned(),
            tally,
            duplicates_allowed,
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
    pub rows: Vec<Row>,
}

impl Document {
    pub(crate) fn new(ctx: &Ctx, rows: Vec<Row>, took: Duration) -> Document {
        Document {
            schema: "pgmq-faults.v1",
            run_id: ctx.run_id.clone(),
            messages_per_scenario: ctx.n,
            started_at: ctx.started_at.to_rfc3339(),
            seconds: took.as_secs_f64(),
            pass: rows.iter().all(|r| r.pass),
            machine: ctx.machine.clone(),
            server: ctx.server.clone(),
            rows,
        }
    }

    /// The table, then each scenario's checks.
    pub(crate) fn markdown(&self) -> String {
        let mut s = String::new();
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
            let dups = if t.duplicated > 0 && r.duplicates_allowed {
                format!("{} (allowed)", t.duplicated)
            } else {
                t.duplicated.to_string()
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
        let _ = writeln!(
            s,
            "\nRejected counts produces that failed without effect (not sent, or refused by the server); \
             unknown ones were in flight when the connection died, and are recovered when the message \
             was found in the queue afterwards.\n"
        );
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
        let _ = writeln!(
            s,
            "\n{} rows, {}; {:.0} s, {} messages per scenario; {}; {}; run {}.",
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
            self.run_id
        );
        s
    }
}
