//! The run's own checks, which decide its outcome: each section checks
//! its runs ([`Section::check`](crate::sections::Section::check)) with the
//! checks they share here (every message handled once, nothing left in a
//! drained queue, the worker's counters adding up, runs long enough to
//! measure).

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::document::{ConsumeRun, LedgerReport, RunOutcome, Runs, Sections, WorkerCounters};

/// The failures and warnings the sections' checks found.
#[derive(Debug, Default)]
pub(crate) struct Checks {
    failures: Vec<String>,
    warnings: Vec<String>,
}

impl Checks {
    /// The run's outcome: these failures and warnings, and a warning when
    /// the build (`profile`) is not a release build.
    pub(crate) fn outcome(mut self, profile: &str) -> RunOutcome {
        if profile != "release" {
            self.warn("debug build: numbers show correctness, not representative throughput");
        }
        RunOutcome {
            ok: self.failures.is_empty(),
            failures: self.failures,
            warnings: self.warnings,
        }
    }

    /// A failure: the run's outcome is not ok.
    pub(crate) fn fail(&mut self, what: impl Into<String>) {
        self.failures.push(what.into());
    }

    /// The runs of `runs` in `s`: none, and a failure, when they do not
    /// parse as their type.
    pub(crate) fn runs<T: Serialize + DeserializeOwned>(
        &mut self,
        runs: &Runs<T>,
        s: &Sections,
    ) -> Vec<T> {
        runs.of(s).unwrap_or_else(|e| {
            self.fail(e.to_string());
            Vec::new()
        })
    }

    /// Checks each run of `runs` in `s` (none, and a failure, when they do
    /// not parse) with `check`, given the run's tag in the checks'
    /// messages: the section's name, what sets the run apart in its round
    /// and its round, as `at` gives them (`consume_scaling w=4 round 2`).
    pub(crate) fn each<T, W>(
        &mut self,
        runs: &Runs<T>,
        s: &Sections,
        at: impl Fn(&T) -> (W, u32, bool),
        mut check: impl FnMut(&mut Checks, &str, &T),
    ) where
        T: Serialize + DeserializeOwned,
        W: std::fmt::Display,
    {
        for r in &self.runs(runs, s) {
            let (what, round, warmup) = at(r);
            let what = what.to_string();
            let tag = match what.as_str() {
                "" => format!("{} {}", runs.name(), run_tag(round, warmup)),
                _ => format!("{} {what} {}", runs.name(), run_tag(round, warmup)),
            };
            check(self, &tag, r);
        }
    }

    /// A warning about a weak number.
    pub(crate) fn warn(&mut self, what: impl Into<String>) {
        self.warnings.push(what.into());
    }

    /// A warning for a timed run under one second.
    pub(crate) fn short_run(&mut self, what: &str, elapsed: f64) {
        if elapsed < 1.0 {
            self.warn(format!(
                "{what} lasted {elapsed:.3} s, under 1 s: the rate measures start-up as much as steady state"
            ));
        }
    }

    /// The checks of a worker run that drained a preloaded queue of
    /// `elapsed` timed seconds: a warning when it was short, every message
    /// handled once, and nothing left in the queue once the workers stopped.
    pub(crate) fn drained(
        &mut self,
        tag: &str,
        elapsed: f64,
        l: &LedgerReport,
        remaining_after: i64,
    ) {
        self.short_run(tag, elapsed);
        if l.missing > 0 {
            self.fail(format!(
                "{tag}: {} of {} messages never handled (first: {:?})",
                l.missing, l.expected, l.missing_ids
            ));
        }
        if remaining_after != 0 {
            self.fail(format!(
                "{tag}: {remaining_after} messages still in the queue after the workers stopped (acknowledgements not drained)"
            ));
        }
        self.ledger(tag, l);
    }

    /// [`drained`](Self::drained) and [`counters`](Self::counters) of a
    /// worker's drain of a preloaded queue.
    pub(crate) fn drained_worker(&mut self, tag: &str, r: &ConsumeRun) {
        self.drained(tag, r.rate.elapsed_s, &r.ledger, r.remaining_after);
        self.counters(tag, &r.worker);
    }

    /// The worker's counters that do not add up, each a failure of `tag`.
    pub(crate) fn counters(&mut self, tag: &str, w: &WorkerCounters) {
        for i in w.inconsistencies() {
            self.fail(format!("{tag}: {i}"));
        }
    }

    /// Duplicates and unexpected ids in a ledger fail the run: with a
    /// visibility timeout longer than a run and a drained queue, a message
    /// handled twice or an id the bench never sent is a fault, not noise.
    pub(crate) fn ledger(&mut self, tag: &str, l: &LedgerReport) {
        if l.duplicates > 0 {
            self.fail(format!(
                "{tag}: {} duplicate deliveries (first: {:?})",
                l.duplicates, l.duplicate_ids
            ));
        }
        if l.unexpected > 0 {
            self.fail(format!(
                "{tag}: {} handled ids outside the ids sent",
                l.unexpected
            ));
        }
    }
}

/// `round 2` or `warm-up round 0`: a run's round in a check's message.
pub(crate) fn run_tag(round: u32, warmup: bool) -> String {
    if warmup {
        format!("warm-up round {round}")
    } else {
        format!("round {round}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sections::evaluate;

    /// The sections of a committed document, with a backlog_scaling run
    /// and a worker_processes run made from its first consume run.
    fn sections() -> Sections {
        let mut v: serde_json::Value =
            serde_json::from_str(include_str!("../tests/data/dev-machine-fbd4125.json")).unwrap();
        let s = &mut v["sections"];
        let consume = s["consume_scaling"][0].clone();
        s["backlog_scaling"] = serde_json::json!([consume.clone()]);
        s["worker_processes"] = serde_json::json!([{
            "round": 0, "warmup": false, "processes": 2, "workers_per_process": 2,
            "handler": "empty", "handler_work_ms": 0,
            "count": consume["count"], "elapsed_s": 2.0, "rate_per_s": 1.0,
            "per_process": [{
                "index": 1, "rate": {"count": 1, "elapsed_s": 2.0, "rate_per_s": 0.5},
                "share": 1.0, "stalled": false, "worker": consume["worker"],
                "handler_ms": consume["handler_ms"], "peak_rss_bytes": 1
            }],
            "min_over_max": 1.0, "jain_index": 1.0,
            "ledger": consume["ledger"], "remaining_after": 0, "preload_s": 0.1, "vacuum_s": 0.1
        }]);
        serde_json::from_value(v["sections"].clone()).unwrap()
    }

    /// Every drained run is checked the same way, its failures named by
    /// section, size or count, and round.
    #[test]
    fn drained_runs_fail_on_what_they_lost_or_left() {
        let clean = evaluate(&sections(), "release");
        assert!(clean.ok, "{:?}", clean.failures);
        let mut v = serde_json::to_value(sections()).unwrap();
        v["consume_scaling"][0]["ledger"]["missing"] = 3.into();
        v["backlog_scaling"][0]["remaining_after"] = 5.into();
        v["backlog_scaling"][0]["worker"]["deleted"] = 9_999_999.into();
        v["worker_processes"][0]["per_process"][0]["worker"]["failed"] = 1.into();
        v["worker_processes"][0]["per_process"][0]["stalled"] = true.into();
        let expected = v["backlog_scaling"][0]["ledger"]["expected"]
            .as_u64()
            .unwrap();
        let s: Sections = serde_json::from_value(v).unwrap();
        let out = evaluate(&s, "release");
        let has = |needle: &str| out.failures.iter().any(|f| f.starts_with(needle));
        assert!(!out.ok);
        assert!(
            has("consume_scaling w=1 warm-up round 0: 3 of"),
            "{:?}",
            out.failures
        );
        assert!(
            has(&format!(
                "backlog_scaling {expected} warm-up round 0: 5 messages still in the queue"
            )),
            "{:?}",
            out.failures
        );
        assert!(
            has(&format!(
                "backlog_scaling {expected} warm-up round 0: worker counters do not add up"
            )),
            "{:?}",
            out.failures
        );
        assert!(
            has("worker_processes 2 round 0: process 1 stalled"),
            "{:?}",
            out.failures
        );
        assert!(
            has("worker_processes 2 round 0: process 1: worker counters: 1 failed"),
            "{:?}",
            out.failures
        );
    }
}
