//! backlog_scaling: the worker draining fresh queues of several backlog
//! sizes; `vs_smallest` divides each size's rate by the smallest size's of
//! the same round, whose reference is pooled over [`REFERENCE_DRAINS`]
//! drains. Described once, in docs/benchmark-sections.md ("backlog_scaling").

use crate::document::{ConsumeRun, Runs, SectionRuns};
use crate::error::Result;
use crate::kit::drain::drain;
use crate::kit::Ctx;
use std::fmt::Write as _;
use std::sync::Arc;


use crate::checks::Checks;
use crate::document::{Better, Document, Rate, Sample, Sections};
use crate::figures::{measured, Figures};
use crate::report::{cell, definitions, figure_keys};
use crate::report::thousands;
use crate::sections::{Rounds, Round, Section};
use crate::config::Config;
use crate::sections::plan::{self, Plan};

/// The section's runs in the document.
pub(crate) const RUNS: Runs<ConsumeRun> = Runs::new("backlog_scaling");

/// One drain of a backlog of `n` messages.
pub async fn run(ctx: &Ctx, n: u64, round: u32) -> Result<ConsumeRun> {
    drain(ctx, "backlog", n, ctx.cfg.backlog_workers, round, false).await
}

/// The backlog_scaling section: the worker draining fresh queues of each
/// `--backlog-sizes` size.
pub(crate) struct BacklogScaling;

impl Section for BacklogScaling {
    fn runs(&self) -> &dyn SectionRuns {
        &RUNS
    }

    fn about(&self) -> &'static str {
        "The worker draining fresh queues of several backlog sizes (`--backlog-sizes`)"
    }

    fn planned(&self, cfg: &Config) -> Plan {
        let sizes = cfg.backlog_sizes();
        let reference = if sizes.len() > 1 { REFERENCE_DRAINS as f64 - 1.0 } else { 0.0 };
        let first = sizes.first().map_or(0.0, |n| reference * plan::drain(*n, plan::DRAIN));
        Plan::work(first + sizes.iter().map(|n| plan::drain(*n, plan::DRAIN)).sum::<f64>())
    }

    fn check(&self, s: &Sections, out: &mut Checks) {
        let at = |r: &ConsumeRun| (r.ledger.expected, r.round, r.warmup);
        out.each(&RUNS, s, at, Checks::drained_worker);
    }

    /// backlog_scaling: per size, the drain rate and its ratio to the
    /// smallest size's rate of the same round.
    fn figures(&self, s: &Sections, f: &mut Figures) {
        let mut sizes: Vec<u64> = RUNS
            .list(s)
            .iter()
            .map(|r| r.ledger.expected)
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        let all = RUNS.list(s);
        let backlog = || measured(&all, |r| r.warmup);
        // One rate per size and measured round: the round's drains of that size
        // pooled (their messages over their seconds); only the smallest size is
        // drained more than once.
        let pooled = |n: u64| -> Vec<(u32, Rate)> {
            let mut rounds: Vec<u32> = backlog()
                .filter(|r| r.ledger.expected == n)
                .map(|r| r.round)
                .collect();
            rounds.dedup();
            rounds
                .into_iter()
                .map(|round| {
                    let (count, secs) = backlog()
                        .filter(|r| r.round == round && r.ledger.expected == n)
                        .fold((0, 0.0), |(c, t), r| (c + r.rate.count, t + r.rate.elapsed_s));
                    (round, Rate::new(count, secs))
                })
                .collect()
        };
        for n in &sizes {
            f.rate(
                &format!("backlog_scaling.n{n}.throughput"),
                "backlog_scaling",
                &format!(
                    "Drain rate, backlog of {}",
                    crate::report::thousands(*n as f64)
                ),
                DEF_BACKLOG,
                pooled(*n).iter().map(|(round, rate)| (*round, rate)),
            );
        }
        if let Some(smallest) = sizes.first() {
            let reference = pooled(*smallest);
            for n in sizes.iter().skip(1) {
                let runs = pooled(*n)
                    .iter()
                    .filter_map(|(round, rate)| {
                        let (_, base) = reference.iter().find(|(r, _)| r == round)?;
                        (base.rate_per_s > 0.0)
                            .then(|| Sample::value(*round, rate.rate_per_s / base.rate_per_s))
                    })
                    .collect();
                f.add(
                    format!("backlog_scaling.n{n}.vs_smallest"),
                    "backlog_scaling",
                    format!(
                        "Drain rate, backlog of {} vs {}",
                        crate::report::thousands(*n as f64),
                        crate::report::thousands(*smallest as f64)
                    ),
                    "x",
                    Better::Higher,
                    DEF_BACKLOG_RATIO,
                    runs,
                );
            }
        }
    }

    /// backlog_scaling: the drain rate per backlog size and its ratio to the
    /// smallest size's rate.
    fn report(&self, d: &Document, out: &mut String) {
        let sizes = figure_keys(d, "backlog_scaling.n", ".throughput");
        let Some(smallest) = sizes.first() else {
            return;
        };
        let w = &d.metadata.workload;
        let mut how = Vec::new();
        if let Some(n) = w.backlog_workers {
            how.push(format!("{n} handlers"));
        }
        if let Some(c) = &w.claim_reads {
            how.push(format!("claim reads `{c}`"));
        }
        let _ = writeln!(
            out,
            "## Backlog scaling (backlog_scaling)\n\n{}| Backlog (messages) | Drain rate (msg/s) | vs {} |\n| --- | --- | --- |",
            if how.is_empty() {
                String::new()
            } else {
                format!("{}.\n\n", how.join(", "))
            },
            thousands(*smallest as f64)
        );
        let mut ids = Vec::new();
        for n in &sizes {
            let rate = format!("backlog_scaling.n{n}.throughput");
            let ratio = format!("backlog_scaling.n{n}.vs_smallest");
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                thousands(*n as f64),
                cell(d, &rate),
                if n == smallest {
                    "1 (the reference)".to_owned()
                } else {
                    cell(d, &ratio)
                }
            );
            ids.extend([rate, ratio]);
        }
        out.push('\n');
        definitions(out, d, &ids);
    }
}

/// Drains of the smallest size per round when there are larger ones: their
/// pooled rate is the reference of `vs_smallest`.
pub const REFERENCE_DRAINS: usize = 3;

impl Rounds for BacklogScaling {
    /// One round of backlog_scaling: a run at each backlog size, the smallest
    /// (the reference) [`REFERENCE_DRAINS`] times when there are larger ones.
    async fn run_round(&self, ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
        let tag = at.tag;
        let sizes = ctx.cfg.backlog_sizes();
        for (i, n) in sizes.iter().enumerate() {
            let drains = if i == 0 && sizes.len() > 1 {
                REFERENCE_DRAINS
            } else {
                1
            };
            for _ in 0..drains {
                let r = run(ctx, *n, at.index).await?;
                ctx.progress.say(format!(
                    "{tag} backlog_scaling {n}: {:.0} msg/s",
                    r.rate.rate_per_s
                ));
                RUNS.record(s, &r)?;
            }
        }
        Ok(())
    }
}

const DEF_BACKLOG: &str = "Worker runtime (--backlog-workers handlers) draining a fresh, preloaded and vacuumed \
    queue of this many messages: distinct messages handled divided by the seconds from spawning the worker to \
    the end of the handler that completed the last one (the smallest size, drained 3 times a round when there \
    are larger ones: its drains pooled, their messages over their seconds).";

const DEF_BACKLOG_RATIO: &str =
    "This backlog's drain rate divided by the smallest backlog's pooled drain rate of the \
    same round (its drains' messages over their seconds; the smallest size is drained 3 times \
    a round): 1 when the rate holds as the backlog grows.";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::ConsumeRun;
    use crate::figures::median_of;

    /// A recorded backlog run (from a committed document) with the size,
    /// round and rate given.
    fn drain_of(n: u64, round: u32, count: u64, secs: f64) -> ConsumeRun {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/dev-machine-fbd4125.json"
        );
        let d: Document = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let mut r = RUNS.list(&d.sections)[0].clone();
        (r.round, r.warmup, r.ledger.expected) = (round, false, n);
        r.rate = Rate::new(count, secs);
        r
    }

    #[test]
    fn the_reference_pools_every_drain_of_the_smallest_size() {
        let mut s = Sections::default();
        for r in [
            drain_of(100, 0, 100, 1.0),
            drain_of(100, 0, 100, 2.0),
            drain_of(100, 0, 100, 1.0),
            drain_of(1_000, 0, 1_000, 20.0),
        ] {
            RUNS.record(&mut s, &r).unwrap();
        }
        let mut f = Figures::default();
        BacklogScaling.figures(&s, &mut f);
        let figures = f.into_figures();
        // 300 messages in 4 s: 75/s; 1,000 in 20 s: 50/s. The first
        // drain alone (100/s) would have made it 0.5.
        let ratio = median_of(&figures, "backlog_scaling.n1000.vs_smallest").unwrap();
        assert!((ratio - 50.0 / 75.0).abs() < 1e-9, "{ratio}");
        // One value a round for the smallest size too: the pooled rate.
        let small = figures
            .iter()
            .find(|f| f.id == "backlog_scaling.n100.throughput")
            .unwrap();
        assert_eq!(small.runs.len(), 1);
        assert!((small.median - 75.0).abs() < 1e-9, "{}", small.median);
        assert!(DEF_BACKLOG_RATIO.contains(&format!("drained {REFERENCE_DRAINS} times")));
    }
}
