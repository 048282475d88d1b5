//! send_single and send_batch: sequential SDK sends into a fresh queue.
//!
//! Timed from the first call to the last reply; each call is awaited before
//! the next (one call in flight). Afterwards the queue length must equal the
//! count sent, or the run fails.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::checks::{run_tag, Checks};
use crate::document::{Document, Rate, Runs, SectionRuns, Sections};
use crate::error::Result;
use crate::figures::{measured, Figures};
use crate::report::{cell, definitions, fig};
use crate::kit::plain::{neighbour, Loop};
use crate::kit::Ctx;
use crate::sections::{Round, Rounds, Section};
use crate::config::Config;
use crate::sections::plan::{self, Plan};

/// The runs of send_single.
pub(crate) const SINGLE: Runs<SendRun> = Runs::new("send_single");

/// The runs of send_batch.
pub(crate) const BATCH: Runs<SendRun> = Runs::new("send_batch");

/// A send run.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct SendRun {
    /// Round (warm-up rounds first, then measured rounds, each from 0).
    pub round: u32,
    /// Whether this run was a discarded warm-up.
    pub warmup: bool,
    /// Messages sent over the timed interval.
    #[serde(flatten)]
    pub rate: Rate,
    /// Messages per call (1 for send_single).
    pub batch_size: u32,
    /// `pgmq.metrics` queue length after the run: must equal the count.
    pub in_queue_after: i64,
    /// Peak RSS during the run, bytes.
    pub peak_rss_bytes: u64,
}

/// One send_single run: `--single-messages` calls of `Client::send`.
pub async fn single(ctx: &Ctx, round: u32, warmup: bool) -> Result<SendRun> {
    let q = ctx.guard.fresh("send_single").await?;
    let n = ctx.cfg.single_messages;
    ctx.meter.begin();
    let t = Instant::now();
    for id in 0..n {
        ctx.client.send(&q, &ctx.body(id)).await?;
    }
    finish(
        ctx,
        &q,
        Rate::new(n, t.elapsed().as_secs_f64()),
        1,
        round,
        warmup,
    )
    .await
}

/// Ends a send run: peak RSS, the queue length check, the queue dropped.
async fn finish(
    ctx: &Ctx,
    q: &pgmq_client::QueueName,
    rate: Rate,
    batch_size: u32,
    round: u32,
    warmup: bool,
) -> Result<SendRun> {
    let peak_rss_bytes = ctx.meter.end();
    Ok(SendRun {
        round,
        warmup,
        rate,
        batch_size,
        in_queue_after: ctx.finish_queue(q).await?,
        peak_rss_bytes,
    })
}

/// One send_batch run: `--messages` in calls of `Client::send_batch` of `--batch-size`.
pub async fn batch(ctx: &Ctx, round: u32, warmup: bool) -> Result<SendRun> {
    let q = &ctx.guard.fresh("send_batch").await?;
    let n = ctx.cfg.batch_messages;
    let size = u64::from(ctx.cfg.batch_size);
    let elapsed = ctx
        .timed_batches(n, size, |b| b, |bodies| async move {
            ctx.client.send_batch(q, &bodies).await?;
            Ok(bodies)
        })
        .await?;
    let rate = Rate::new(n, elapsed);
    finish(ctx, q, rate, ctx.cfg.batch_size, round, warmup).await
}

/// A send section: its loop's sends between two runs of the baseline's
/// loop of the same kind, the ratio's reference being their mean.
pub(crate) struct Sends {
    /// `Loop::SendSingle` or `Loop::SendBatch`.
    which: Loop,
    runs: Runs<SendRun>,
    about: &'static str,
    label: &'static str,
    definition: &'static str,
}

/// The send_single section: `--single-messages` sends of one message.
#[allow(non_upper_case_globals)]
pub(crate) const SendSingle: Sends = Sends {
    which: Loop::SendSingle,
    runs: SINGLE,
    about: "Sequential one-message SDK sends",
    label: "Single send",
    definition: "SDK Client::send, one message per call, each call awaited before the next: \
        messages divided by the seconds from the first call to the last reply.",
};

/// The send_batch section: `--batch-messages` messages in batch sends.
#[allow(non_upper_case_globals)]
pub(crate) const SendBatch: Sends = Sends {
    which: Loop::SendBatch,
    runs: BATCH,
    about: "Sequential SDK batch sends",
    label: "Batch send",
    definition: "SDK Client::send_batch of --batch-size messages per call, each awaited before \
        the next: messages divided by the seconds from the first call to the last reply.",
};

impl Rounds for Sends {
    /// One round: the run between two runs of the baseline's loop.
    async fn run_round(&self, ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
        neighbour(ctx, self.which, at, s).await?;
        let r = match self.which {
            Loop::SendSingle => single(ctx, at.index, at.warm).await?,
            _ => batch(ctx, at.index, at.warm).await?,
        };
        ctx.progress.say(format!(
            "{} {}: {:.0} msg/s",
            at.tag,
            self.which.name(),
            r.rate.rate_per_s
        ));
        self.runs.record(s, &r)?;
        neighbour(ctx, self.which, at, s).await?;
        Ok(())
    }
}

impl Section for Sends {
    fn runs(&self) -> &dyn SectionRuns {
        &self.runs
    }

    fn about(&self) -> &'static str {
        self.about
    }

    fn planned(&self, cfg: &Config) -> Plan {
        let runs = 1.0 + plan::loops_around(cfg, 2);
        let sends = match self.which {
            Loop::SendSingle => cfg.single_messages as f64 / plan::SINGLE_SENDS,
            _ => cfg.batch_messages as f64 / plan::BATCH_SENDS,
        };
        Plan::work(runs * (plan::SETUP + sends))
    }

    fn in_warmup(&self) -> bool {
        true
    }

    fn check(&self, s: &Sections, out: &mut Checks) {
        let runs = out.runs(&self.runs, s);
        check_sends(out, self.name(), &runs);
    }

    fn figures(&self, s: &Sections, f: &mut Figures) {
        let name = self.name();
        f.rate(
            &format!("{name}.rate"),
            name,
            self.label,
            self.definition,
            measured(&self.runs.list(s), |r| r.warmup).map(|r| (r.round, &r.rate)),
        );
    }

    /// The Sends table, of both send sections, comes with send_single's.
    fn report(&self, d: &Document, out: &mut String) {
        if self.which == Loop::SendSingle {
            report_sends(out, d);
        }
    }
}

/// The checks of a send section's runs: a warning for a short run, and a
/// failure unless every message sent is in the queue afterwards.
fn check_sends(out: &mut Checks, name: &str, runs: &[SendRun]) {
    for r in runs {
        let tag = run_tag(r.round, r.warmup);
        out.short_run(&format!("{name} {tag}"), r.rate.elapsed_s);
        if r.in_queue_after != r.rate.count as i64 {
            out.fail(format!(
                "{name} {tag}: sent {} but the queue holds {}",
                r.rate.count, r.in_queue_after
            ));
        }
    }
}

/// Single and batch sends beside their baseline loops.
fn report_sends(out: &mut String, d: &Document) {
    let send_ids: Vec<String> = [
        "send_single.rate",
        "send_single.vs_baseline",
        "baseline.send_single.rate",
        "send_batch.rate",
        "send_batch.vs_baseline",
        "baseline.send_batch.rate",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if !send_ids.iter().any(|id| fig(d, id).is_some()) {
        return;
    }
    let _ = writeln!(
        out,
        "## Sends\n\n| | SDK (msg/s) | baseline, no SDK (msg/s) | SDK / baseline |\n| --- | --- | --- | --- |"
    );
    for (label, kind) in [("Single send", "send_single"), ("Batch send", "send_batch")] {
        if fig(d, &format!("{kind}.rate")).is_some()
            || fig(d, &format!("baseline.{kind}.rate")).is_some()
        {
            let _ = writeln!(
                out,
                "| {label} | {} | {} | {} |",
                cell(d, &format!("{kind}.rate")),
                cell(d, &format!("baseline.{kind}.rate")),
                cell(d, &format!("{kind}.vs_baseline"))
            );
        }
    }
    out.push('\n');
    definitions(out, d, &send_ids);
}
