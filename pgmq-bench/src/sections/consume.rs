//! consume_scaling: the worker runtime draining a preloaded queue, once per
//! handler count. Timed from just before the worker is spawned to the end of
//! the handler that completed the last new id; the shutdown's drain of the
//! batched deletes is timed apart (`ack_drain_s`) and verified
//! (`remaining_after` must be 0). Described once, in docs/benchmark-sections.md
//! ("consume_scaling").

use std::fmt::Write as _;
use std::sync::Arc;

use crate::document::{ConsumeRun, Runs, SectionRuns, BASELINE_RUNS};
use crate::error::Result;
use crate::kit::drain::drain;
use crate::kit::Ctx;


use crate::checks::Checks;
use crate::document::{Document, Sections};
use crate::figures::{measured, Figures};
use crate::report::fmt_value;
use crate::report::{cell, definitions, fig, worker_counts};
use crate::kit::plain::{neighbour, Loop};
use crate::sections::{Rounds, Round, Section};
use crate::config::Config;
use crate::sections::plan::{self, Plan};

/// The section's runs in the document.
pub(crate) const RUNS: Runs<ConsumeRun> = Runs::new("consume_scaling");

/// One run at `workers` handlers.
pub async fn run(ctx: &Ctx, workers: u32, round: u32, warmup: bool) -> Result<ConsumeRun> {
    drain(ctx, "consume", ctx.cfg.messages, workers, round, warmup).await
}

/// The consume_scaling section: the worker draining a preloaded queue at
/// each `--workers` handler count, each run between two consume loops.
pub(crate) struct ConsumeScaling;

impl Section for ConsumeScaling {
    fn runs(&self) -> &dyn SectionRuns {
        &RUNS
    }

    fn about(&self) -> &'static str {
        "The worker draining a preloaded queue at each handler count"
    }

    fn planned(&self, cfg: &Config) -> Plan {
        let (n, w) = (cfg.messages, cfg.workers.len() as f64);
        // Around the worker runs: a consume loop before each and after the
        // last, the equal-layout loop before the first and after the last.
        let loops = (w + 1.0) * plan::drain(n, plan::LOOP_DRAIN) + 2.0 * plan::drain(n, plan::DRAIN);
        Plan::work(w * plan::drain(n, plan::DRAIN) + plan::loops_around(cfg, 1) * loops)
    }

    fn in_warmup(&self) -> bool {
        true
    }

    fn check(&self, s: &Sections, out: &mut Checks) {
        let at = |r: &ConsumeRun| (format!("w={}", r.workers), r.round, r.warmup);
        out.each(&RUNS, s, at, Checks::drained_worker);
    }

    fn figures(&self, s: &Sections, f: &mut Figures) {
        add_figures(f, s, &consume_counts(s));
    }

    /// consume_scaling: throughput, its ratio to the baseline loop and the
    /// latency percentiles per handler count.
    fn report(&self, d: &Document, out: &mut String) {
        let counts = worker_counts(d);
        if counts.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "## Worker scaling (consume_scaling)\n\n\
             | Handlers | Throughput (msg/s) | vs baseline | Handler p50 / p95 / p99 / max (ms) | \
             Queue wait, database p50 / p95 / p99 / max (ms) | Queue wait, local p50 / p95 / p99 / max (ms) |\n\
             | --- | --- | --- | --- | --- | --- |"
        );
        let mut ids = Vec::new();
        for w in &counts {
            let p = format!("consume_scaling.w{w}");
            let pct = |what: &str| {
                ["p50", "p95", "p99", "max"]
                    .iter()
                    .map(|q| {
                        fig(d, &format!("{p}.{what}.{q}_ms"))
                            .map(|f| fmt_value(f.median, "ms"))
                            .unwrap_or_else(|| "–".into())
                    })
                    .collect::<Vec<_>>()
                    .join(" / ")
            };
            let _ = writeln!(
                out,
                "| {w} | {} | {} | {} | {} | {} |",
                cell(d, &format!("{p}.throughput")),
                cell(d, &format!("{p}.vs_baseline")),
                pct("handler"),
                pct("queue_wait_db"),
                pct("queue_wait_local")
            );
            ids.extend([
                format!("{p}.throughput"),
                format!("{p}.vs_baseline"),
                format!("{p}.handler.p50_ms"),
                format!("{p}.queue_wait_db.p50_ms"),
                format!("{p}.queue_wait_local.p50_ms"),
            ]);
        }
        let _ = writeln!(
            out,
            "\nBaseline read + delete on one connection: {} msg/s. Latency columns show medians over rounds.\n",
            cell(d, "baseline.consume.rate")
        );
        ids.push("baseline.consume.rate".into());
        definitions(out, d, &ids);
    }
}

impl Rounds for ConsumeScaling {
    /// One round of consume_scaling: the worker at each handler count, each
    /// between two consume loops.
    async fn run_round(&self, ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
        let tag = at.tag;
        let p = &ctx.progress;
        // A consume loop before each worker run and one after the last: every
        // worker run sits between two loops, and its ratio's reference is their
        // mean. The equal-layout loop once before the first worker run and once
        // after the last: the reference of `vs_equal_layout` is the mean of the
        // two.
        neighbour(ctx, Loop::ConsumeEqualLayout, at, s).await?;
        let mut before: Option<u32> = None;
        for w in &ctx.cfg.workers {
            if let Some(i) = neighbour(ctx, Loop::Consume, at, s).await? {
                BASELINE_RUNS.update(s, |runs| {
                    runs[i].paired_workers = Some(*w);
                    runs[i].follows_workers = before;
                })?;
            }
            before = Some(*w);
            let r = run(ctx, *w, at.index, at.warm).await?;
            p.say(format!(
                "{tag} consume_scaling w={w}: {:.0} msg/s, handler p99 {:.3} ms",
                r.rate.rate_per_s, r.handler_ms.p99
            ));
            RUNS.record(s, &r)?;
        }
        if let Some(w) = before {
            if let Some(i) = neighbour(ctx, Loop::Consume, at, s).await? {
                BASELINE_RUNS.update(s, |runs| runs[i].follows_workers = Some(w))?;
            }
        }
        neighbour(ctx, Loop::ConsumeEqualLayout, at, s).await?;
        Ok(())
    }
}

const DEF_THROUGHPUT: &str = "Worker runtime draining a preloaded, vacuumed queue with N handlers: distinct \
    messages handled divided by the seconds from spawning the worker to the end of the handler that completed \
    the last one. The final acknowledgement drain is verified afterwards and not included.";

const DEF_HANDLER: &str =
    "Handler duration from the worker's histogram: handler start to handler end, \
    acknowledgement excluded (microsecond histogram, two significant digits).";

const DEF_WAIT_DB: &str =
    "Queue wait, database segment: enqueued_at to last_read_at of each claimed message, \
    both stamped by the database clock (no host/database clock skew).";

const DEF_WAIT_LOCAL: &str =
    "Queue wait, local segment: claim registered in the worker to handler start, \
    on the monotonic clock. The reply's transit between the two segments is in neither.";

/// The handler counts of consume_scaling, ascending.
fn consume_counts(s: &Sections) -> Vec<u32> {
    let mut worker_counts: Vec<u32> = RUNS.list(s).iter().map(|r| r.workers).collect();
    worker_counts.sort_unstable();
    worker_counts.dedup();
    worker_counts
}

/// consume_scaling: throughput and latency percentiles per handler count.
fn add_figures(f: &mut Figures, s: &Sections, worker_counts: &[u32]) {
    for w in worker_counts {
        let all = RUNS.list(s);
        let runs = || measured(&all, |r| r.warmup).filter(move |r| r.workers == *w);
        let p = format!("consume_scaling.w{w}");
        f.rate(
            &format!("{p}.throughput"),
            "consume_scaling",
            &format!("Worker throughput, {w} handlers"),
            DEF_THROUGHPUT,
            runs().map(|r| (r.round, &r.rate)),
        );
        f.percentiles(
            &format!("{p}.handler"),
            "consume_scaling",
            &format!("Handler duration, {w} handlers,"),
            DEF_HANDLER,
            runs().map(|r| (r.round, &r.handler_ms)),
        );
        f.percentiles(
            &format!("{p}.queue_wait_db"),
            "consume_scaling",
            &format!("Queue wait (database), {w} handlers,"),
            DEF_WAIT_DB,
            runs().map(|r| (r.round, &r.queue_wait_db_ms)),
        );
        f.percentiles(
            &format!("{p}.queue_wait_local"),
            "consume_scaling",
            &format!("Queue wait (local), {w} handlers,"),
            DEF_WAIT_LOCAL,
            runs().map(|r| (r.round, &r.queue_wait_local_ms)),
        );
    }
}

