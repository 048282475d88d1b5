//! fifo_groups: what FIFO groups cost. A worker with
//! `ClaimReads::FifoGroups` drains a fresh queue whose messages are spread
//! over `--fifo-groups` groups (the `x-pgmq-group` header, message `i` in
//! group `i % groups`), and the same worker with the default claim reads
//! drains a queue of as many messages without groups, in the same round.
//! A grouped claim takes only the head of each group, and a group's next
//! message is claimed once its head was acknowledged (docs/worker-claims.md,
//! "FIFO groups"): the grouped drain runs at most one message per group at
//! a time, so with as many handlers it pays one acknowledgement and one
//! claim per message of a group. Described once, in
//! docs/benchmark-sections.md ("fifo_groups").

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use pgmq_client::{QueueName, SendOptions, FIFO_GROUP_HEADER};
use pgmq_testkit::spec::ClaimReadsSpec;
use serde::{Deserialize, Serialize};

use crate::checks::Checks;
use crate::config::{pick, Apply, Config, Profile};
use crate::document::{Better, Document, LedgerReport, Rate, Runs, SectionRuns, Sections, WorkerCounters};
use crate::error::Result;
use crate::figures::{measured, paired_ratios, Figures, RunKey};
use crate::kit::body::{id_batches, OutBody};
use crate::kit::drain::timed;
use crate::kit::tally::Tally;
use crate::kit::worker::counters;
use crate::kit::Ctx;
use crate::report::{cell, definitions, workload_if};
use crate::sections::plan::{self, Plan};
use crate::sections::{at_least, within, Options, Round, Rounds, Section};

/// The section's name, in the document and on the command line.
const NAME: &str = "fifo_groups";

/// The section's runs in the document.
const RUNS: Runs<FifoRun> = Runs::new(NAME);

/// The modes of a round: grouped claims, and the default claims on
/// messages without groups.
const MODES: [&str; 2] = ["grouped", "plain"];

/// Messages of one send while loading a queue.
const LOAD_BATCH: u64 = 1_000;

/// The fifo_groups options.
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
#[non_exhaustive]
pub struct FifoOptions {
    /// fifo_groups: messages per run.
    #[arg(long, default_value_t = 20_000)]
    pub fifo_messages: u64,

    /// fifo_groups: FIFO groups the messages are spread over.
    #[arg(long, default_value_t = 64)]
    pub fifo_groups: u32,

    /// fifo_groups: the worker's handlers (concurrency), in both modes.
    #[arg(long, default_value_t = 16)]
    pub fifo_workers: u32,
}

impl Options for FifoOptions {
    fn check(&self) -> Result<()> {
        at_least(self.fifo_messages, 1, "--fifo-messages")?;
        within(self.fifo_groups, 1..=100_000, "--fifo-groups")?;
        within(self.fifo_workers, 1..=1024, "--fifo-workers")?;
        Ok(())
    }

    fn apply_profile(&mut self, p: &Apply<'_>) {
        match p.profile {
            Profile::Quick | Profile::Default => pick!(p, self.fifo_messages, 20_000, 4_000),
            Profile::Standard | Profile::Full | Profile::Long => {}
        }
    }
}

/// One drain: grouped or plain claims.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct FifoRun {
    /// Round.
    pub round: u32,
    /// Warm-up or measured.
    pub warmup: bool,
    /// `grouped` (`ClaimReads::FifoGroups`, messages in groups) or `plain`
    /// (the default claim reads, messages without groups).
    pub mode: String,
    /// FIFO groups of the messages (0 in `plain` runs).
    pub groups: u32,
    /// The worker's handlers.
    pub workers: u32,
    /// Distinct messages handled over the seconds from spawning the worker
    /// to the end of the handler that completed the last one.
    pub rate: Rate,
    /// Seconds of the shutdown after that (acknowledgements drained).
    pub ack_drain_s: f64,
    /// Messages left in the queue after the worker stopped.
    pub remaining_after: i64,
    /// Every message handled once.
    pub ledger: LedgerReport,
    /// The worker's counters at shutdown.
    pub worker: WorkerCounters,
    /// Seconds loading the queue.
    pub load_s: f64,
    /// Peak RSS during the drain, bytes.
    pub peak_rss_bytes: u64,
}

/// Loads `n` messages into a fresh queue, in groups when `groups` is not
/// zero; returns the queue and the seconds the load took.
async fn load(ctx: &Ctx, mode: &str, n: u64, groups: u32) -> Result<(QueueName, f64)> {
    let q = ctx.guard.fresh(&format!("fifo_{mode}")).await?;
    let t = Instant::now();
    let mut bodies = Vec::with_capacity(LOAD_BATCH as usize);
    for ids in id_batches(n, LOAD_BATCH) {
        bodies.clear();
        bodies.extend(ids.clone().map(|id| OutBody { id, pad: &ctx.pad }));
        let opts = if groups == 0 {
            SendOptions::new()
        } else {
            SendOptions::new().headers_each(
                ids.map(|id| serde_json::json!({ FIFO_GROUP_HEADER: format!("g{}", id % u64::from(groups)) }))
                    .collect(),
            )
        };
        ctx.client.send_batch_with(&q, &bodies, &opts).await?;
    }
    if groups > 0 {
        ctx.client.create_fifo_index(&q).await?;
    }
    ctx.vacuum(&q).await?;
    Ok((q, t.elapsed().as_secs_f64()))
}

/// One drain of `mode` (see [`MODES`]).
async fn run(ctx: &Ctx, mode: &str, round: u32, warmup: bool) -> Result<FifoRun> {
    let o = &ctx.cfg.options.fifo;
    let n = o.fifo_messages;
    let groups = if mode == "grouped" { o.fifo_groups } else { 0 };
    let (q, load_s) = load(ctx, mode, n, groups).await?;
    let tally = Tally::new(n, ctx.cfg.handler_work());
    let mut spec = ctx.worker_spec(&q, o.fifo_workers);
    if groups > 0 {
        spec.settings.claim_reads = Some(ClaimReadsSpec::FifoGroups);
    }
    let w = ctx.worker(&spec, &tally)?;
    let d = timed(ctx, w, &tally).await?;
    let remaining_after = ctx.finish_queue(&q).await?;
    Ok(FifoRun {
        round,
        warmup,
        mode: mode.to_owned(),
        groups,
        workers: o.fifo_workers,
        rate: Rate::new(tally.distinct(), d.elapsed_s),
        ack_drain_s: d.ack_drain_s,
        remaining_after,
        ledger: tally.ledger.report(n),
        worker: counters(&d.report.stats),
        load_s,
        peak_rss_bytes: d.peak_rss_bytes,
    })
}

/// The fifo_groups section.
pub(crate) struct FifoGroups;

impl Section for FifoGroups {
    fn runs(&self) -> &dyn SectionRuns {
        &RUNS
    }

    fn about(&self) -> &'static str {
        "FIFO groups: a grouped drain against a plain one of as many messages and handlers"
    }

    fn planned(&self, cfg: &Config) -> Plan {
        let n = cfg.options.fifo.fifo_messages;
        // Loaded by the client in batches, drained one message per group
        // at a time: taken at the pace of sequential sends.
        Plan::work(plan::drain(n, plan::DRAIN) + plan::drain(n, plan::SINGLE_SENDS) + 2.0 * n as f64 / plan::BATCH_SENDS)
    }

    fn in_warmup(&self) -> bool {
        true
    }

    fn check(&self, s: &Sections, out: &mut Checks) {
        let at = |r: &FifoRun| (r.mode.clone(), r.round, r.warmup);
        out.each(&RUNS, s, at, |c, tag, r| {
            c.drained(tag, r.rate.elapsed_s, &r.ledger, r.remaining_after);
            c.counters(tag, &r.worker);
        });
    }

    /// fifo_groups: each mode's drain rate and grouped ÷ plain per round.
    fn figures(&self, s: &Sections, f: &mut Figures) {
        let runs = RUNS.list(s);
        for (mode, def) in [("grouped", DEF_GROUPED), ("plain", DEF_PLAIN)] {
            f.rate(
                &format!("{NAME}.{mode}.throughput"),
                NAME,
                &format!("FIFO groups: {mode} drain rate"),
                def,
                measured(&runs, |r| r.warmup)
                    .filter(|r| r.mode == mode)
                    .map(|r| (r.round, &r.rate)),
            );
        }
        let key: RunKey<FifoRun> = |r| (r.round, r.warmup, r.mode.as_str(), r.rate.rate_per_s);
        f.add(
            format!("{NAME}.grouped_vs_plain"),
            NAME,
            "FIFO groups: grouped ÷ plain drain rate".into(),
            "x",
            Better::Higher,
            DEF_RATIO,
            paired_ratios(&runs, key, "grouped", "plain"),
        );
    }

    /// fifo_groups: both drain rates and their ratio.
    fn report(&self, d: &Document, out: &mut String) {
        let Some(w) = workload_if::<FifoOptions>(d, &format!("{NAME}.grouped_vs_plain")) else {
            return;
        };
        let ids = [
            format!("{NAME}.grouped.throughput"),
            format!("{NAME}.plain.throughput"),
            format!("{NAME}.grouped_vs_plain"),
        ];
        let _ = writeln!(
            out,
            "## FIFO groups ({NAME})\n\n{} messages in {} groups, {} handlers.\n\n\
             | Grouped (msg/s) | Plain (msg/s) | Grouped ÷ plain |\n| --- | --- | --- |\n| {} | {} | {} |\n",
            w.fifo_messages,
            w.fifo_groups,
            w.fifo_workers,
            cell(d, &ids[0]),
            cell(d, &ids[1]),
            cell(d, &ids[2]),
        );
        definitions(out, d, &ids);
    }
}

impl Rounds for FifoGroups {
    /// One round of fifo_groups: a grouped drain and a plain one, their
    /// order swapped every other round so that neither always runs second.
    async fn run_round(&self, ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
        let first = at.index as usize % MODES.len();
        for k in 0..MODES.len() {
            let mode = MODES[(first + k) % MODES.len()];
            let r = run(ctx, mode, at.index, at.warm).await?;
            let rate = r.rate.rate_per_s;
            RUNS.record(s, &r)?;
            let tag = at.tag;
            ctx.progress.say(format!("{tag} {NAME} {mode}: {rate:.0} msg/s"));
        }
        Ok(())
    }
}

const DEF_GROUPED: &str = "A worker with ClaimReads::FifoGroups (--fifo-workers handlers) draining a \
    fresh queue of --fifo-messages messages spread over --fifo-groups FIFO groups (the x-pgmq-group \
    header; PGMQ's FIFO index created): distinct messages handled divided by the seconds from spawning \
    the worker to the end of the handler that completed the last one.";

const DEF_PLAIN: &str = "The same worker with the default claim reads draining a fresh queue of as \
    many messages without groups, in the same round, timed the same way.";

const DEF_RATIO: &str = "The grouped drain rate divided by the plain drain rate of the same round: \
    what keeping each group's order costs at these handlers and groups.";
