//! priorities: what a [`Priority`] policy costs: a [`WorkerGroup`] of three
//! workers under `Priority::weighted()` against the same workers with no
//! policy. The runs and the steady rate they are judged on are described
//! once, in docs/benchmark-streams.md ("priorities").

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use pgmq_testkit::spec::HandlerKind as SpecHandler;
use pgmq_worker::{Outcome, Priority, WorkerGroup};
use serde::{Deserialize, Serialize};

use crate::checks::Checks;
use crate::config::{pick, Apply, Config, Profile};
use crate::document::{
    Better, Document, Figure, LedgerReport, Rate, Runs, Sample, SectionRuns, Sections, TargetCheck,
};
use crate::error::{Error, Result};
use crate::figures::{check, measured, median_of, Figures};
use crate::kit::tally::Tally;
use crate::kit::worker::worker_on;
use crate::kit::Ctx;
use crate::report::{cell, definitions, fig};
use crate::sections::plan::{self, Plan};
use crate::sections::{at_least, within, Options, Round, Rounds, Section};

/// The section's name, in the document and on the command line.
const NAME: &str = "priorities";

/// The section's runs in the document.
const RUNS: Runs<PrioritiesRun> = Runs::new(NAME);

/// The weighted group's weights, one per queue.
const WEIGHTS: [u32; 3] = [4, 2, 1];

/// The modes of a round, in the order they run.
const MODES: [&str; 2] = ["weighted", "plain"];

/// The steady window: from this share of all the messages handled...
const WINDOW_FROM: f64 = 0.1;
/// ...to this one.
const WINDOW_TO: f64 = 0.5;

/// The least weighted ÷ plain ratio, at a handler time of 1 ms or more.
const FLOOR_WORK: f64 = 0.95;
/// The least weighted ÷ plain ratio with empty handlers.
const FLOOR_EMPTY: f64 = 0.90;

/// The priorities options.
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
#[non_exhaustive]
pub struct PrioritiesOptions {
    /// priorities: messages per queue (three queues) per run.
    #[arg(long, default_value_t = 5_000)]
    pub priorities_messages: u64,

    /// priorities: the handler times to measure at, milliseconds of
    /// simulated I/O per call (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,0")]
    pub priorities_work_ms: Vec<u64>,

    /// priorities: the group's capacity (handlers running at once across
    /// the three queues).
    #[arg(long, default_value_t = 8)]
    pub priorities_concurrency: u32,
}

impl PrioritiesOptions {
    /// The handler times, in the order they run.
    fn work(&self) -> impl Iterator<Item = Duration> + '_ {
        self.priorities_work_ms.iter().map(|ms| Duration::from_millis(*ms))
    }
}

impl Options for PrioritiesOptions {
    fn check(&self) -> Result<()> {
        at_least(self.priorities_messages, 100, "--priorities-messages")?;
        within(self.priorities_concurrency, 3..=1024, "--priorities-concurrency")?;
        if self.priorities_work_ms.is_empty() {
            return Err(Error::Config(
                "--priorities-work-ms needs at least one handler time".into(),
            ));
        }
        Ok(())
    }

    fn apply_profile(&mut self, p: &Apply<'_>) {
        // The other profiles keep the flag's default.
        if matches!(p.profile, Profile::Quick) {
            pick!(p, self.priorities_messages, 5_000, 1_000);
        }
    }
}

/// One run: three queues drained by a weighted group or by plain workers.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct PrioritiesRun {
    /// Round.
    pub round: u32,
    /// Warm-up or measured.
    pub warmup: bool,
    /// `weighted` or `plain`.
    pub mode: String,
    /// Simulated I/O per handler call, milliseconds.
    pub work_ms: u64,
    /// Handlers per worker, one per queue.
    pub handlers: Vec<u32>,
    /// The messages handled in the steady window over its seconds.
    pub steady: Rate,
    /// Every message of the three queues over the seconds from the start
    /// to the last handler's end.
    pub drain: Rate,
    /// Messages claimed per read, over the three workers.
    pub messages_per_read: f64,
    /// Every message handled once? One report per queue.
    pub ledgers: Vec<LedgerReport>,
    /// Messages left in the three queues after the run.
    pub remaining_after: i64,
}

/// Handlers per queue in `mode`: the whole capacity for each worker of the
/// weighted group (the gate divides it), an even split for plain workers.
fn handlers(mode: &str, capacity: u32) -> Vec<u32> {
    let n = WEIGHTS.len() as u32;
    (0..n)
        .map(|i| match mode {
            "weighted" => capacity,
            _ => capacity / n + u32::from(i < capacity % n),
        })
        .collect()
}

/// The messages handled in all of `tallies`.
fn handled(tallies: &[Arc<Tally>]) -> u64 {
    tallies.iter().map(|t| t.distinct()).sum()
}

/// Waits until `tallies` handled `n` in all; the moment it saw it, or an
/// error when nothing new was handled for `stall`.
async fn until_handled(tallies: &[Arc<Tally>], n: u64, stall: Duration) -> Result<Instant> {
    let (mut last, mut changed) = (handled(tallies), Instant::now());
    loop {
        let now = handled(tallies);
        if now >= n {
            return Ok(Instant::now());
        }
        if now != last {
            (last, changed) = (now, Instant::now());
        } else if changed.elapsed() >= stall {
            return Err(Error::Timeout(format!(
                "{NAME}: stalled at {now} of {n} messages handled"
            )));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// One run of `mode` with handlers of `work`, on three fresh queues.
async fn run(
    ctx: &Ctx,
    mode: &str,
    work: Duration,
    round: u32,
    warmup: bool,
) -> Result<PrioritiesRun> {
    let o = &ctx.cfg.options.priorities;
    let n = o.priorities_messages;
    let mut qs = Vec::new();
    for i in 0..WEIGHTS.len() {
        qs.push(ctx.fresh_loaded(&format!("{NAME}_{i}"), n).await?.0);
    }
    // Its own pool: each worker's claimers, flusher and one spare.
    let client = ctx
        .target
        .builder()
        .max_size(4 * WEIGHTS.len() as u32 + 2)
        .connect()
        .await?;
    let per_queue = handlers(mode, o.priorities_concurrency);
    let tallies: Vec<Arc<Tally>> = qs.iter().map(|_| Tally::new(n, work)).collect();
    let mut group = WorkerGroup::new(client.clone());
    if mode == "weighted" {
        group = group.priority(Priority::weighted().concurrency(o.priorities_concurrency as usize));
    }
    for (i, q) in qs.iter().enumerate() {
        let mut spec = ctx.worker_spec(q, per_queue[i]);
        spec.handler = SpecHandler::Context;
        let w = worker_on(client.clone(), &spec, &tallies[i], None, Outcome::Delete)?.build()?;
        group = match mode {
            "weighted" => group.with_worker_priority(w, WEIGHTS[i]),
            _ => group.with_worker(w),
        };
    }
    let monitors = group.monitors();
    let stop = group.shutdown_handle();
    let total = n * WEIGHTS.len() as u64;
    let stall = ctx.cfg.stall_timeout;
    let started = Instant::now();
    let running = tokio::spawn(group.run_until(std::future::pending::<()>()));
    let from = (total as f64 * WINDOW_FROM) as u64;
    let to = (total as f64 * WINDOW_TO) as u64;
    let timed = async {
        let opened = until_handled(&tallies, from, stall).await?;
        let closed = until_handled(&tallies, to, stall).await?;
        let ended = until_handled(&tallies, total, stall).await?;
        Ok::<_, Error>((opened, closed, ended))
    }
    .await;
    stop.graceful();
    running
        .await
        .map_err(|e| Error::Panicked(format!("{NAME}: the group's task: {e}")))??;
    let (opened, closed, ended) = timed?;
    let (reads, claimed) = monitors.iter().fold((0, 0), |(r, c), (_, m)| {
        let s = m.stats();
        (r + s.reads, c + s.claimed)
    });
    let mut remaining_after = 0;
    for q in &qs {
        remaining_after += ctx.finish_queue(q).await?;
    }
    Ok(PrioritiesRun {
        round,
        warmup,
        mode: mode.to_owned(),
        work_ms: work.as_millis() as u64,
        handlers: per_queue,
        steady: Rate::new(to - from, closed.duration_since(opened).as_secs_f64()),
        drain: Rate::new(handled(&tallies), ended.duration_since(started).as_secs_f64()),
        messages_per_read: claimed as f64 / reads.max(1) as f64,
        ledgers: tallies.iter().map(|t| t.ledger.report(n)).collect(),
        remaining_after,
    })
}

/// The priorities section.
pub(crate) struct Priorities;

impl Section for Priorities {
    fn runs(&self) -> &dyn SectionRuns {
        &RUNS
    }

    fn about(&self) -> &'static str {
        "A weighted worker group against plain workers with the same handlers: what the gate costs"
    }

    fn planned(&self, cfg: &Config) -> Plan {
        let o = &cfg.options.priorities;
        let n = 3 * o.priorities_messages;
        // Each run: the handlers' simulated I/O over the capacity, at
        // about half of it used, and the drain's own work.
        let io: f64 = o
            .work()
            .map(|w| n as f64 * w.as_secs_f64() / f64::from(o.priorities_concurrency) / 0.5)
            .sum();
        let runs = (MODES.len() * o.priorities_work_ms.len()) as f64;
        Plan::fixed(MODES.len() as f64 * io)
            + Plan::work(runs * (3.0 * plan::SETUP + plan::drain(n, plan::DRAIN)))
    }

    fn check(&self, s: &Sections, out: &mut Checks) {
        let at = |r: &PrioritiesRun| (format!("{} {} ms", r.mode, r.work_ms), r.round, r.warmup);
        out.each(&RUNS, s, at, |out, tag, r| {
            out.short_run(tag, r.steady.elapsed_s);
            for (i, l) in r.ledgers.iter().enumerate() {
                out.drained(&format!("{tag} queue {i}"), r.drain.elapsed_s, l, 0);
            }
            if r.remaining_after != 0 {
                out.fail(format!(
                    "{tag}: {} messages still in the queues after the workers stopped",
                    r.remaining_after
                ));
            }
        });
    }

    fn figures(&self, s: &Sections, f: &mut Figures) {
        if let Ok(runs) = RUNS.of(s) {
            add_figures(f, &runs);
        }
    }

    fn report(&self, d: &Document, out: &mut String) {
        report_part(out, d);
    }

    fn targets(&self, figures: &[Figure]) -> Vec<TargetCheck> {
        vec![
            ratio_target(figures, "priorities_work", 1, FLOOR_WORK, "1 ms"),
            ratio_target(figures, "priorities_empty", 0, FLOOR_EMPTY, "empty"),
        ]
    }
}

/// The target `id`: the weighted ÷ plain ratio with handlers of `work_ms`
/// (`handlers` in its description) at least `floor`.
fn ratio_target(
    figures: &[Figure],
    id: &str,
    work_ms: u64,
    floor: f64,
    handlers: &str,
) -> TargetCheck {
    check(
        id,
        &format!(
            "Priorities: a weighted group handles at least {floor} of what plain workers with the same {handlers} handlers do"
        ),
        median_of(figures, &ratio_id(work_ms)),
        floor,
        "x",
        |v| v >= floor,
        Ok(()),
        "the median, over rounds, of the weighted group's steady rate over the plain workers' in the same round",
    )
}

impl Rounds for Priorities {
    /// One round: at each handler time, the weighted group, then the plain
    /// workers.
    async fn run_round(&self, ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
        for work in ctx.cfg.options.priorities.work() {
            for mode in MODES {
                let r = run(ctx, mode, work, at.index, at.warm).await?;
                ctx.progress.say(format!(
                    "{} {NAME} {mode} {} ms: {:.0} msg/s steady, {:.0} msg/s draining, {:.1} messages a read",
                    at.tag, r.work_ms, r.steady.rate_per_s, r.drain.rate_per_s, r.messages_per_read
                ));
                RUNS.record(s, &r)?;
            }
        }
        Ok(())
    }
}

/// The id of the weighted ÷ plain ratio at `work_ms`.
fn ratio_id(work_ms: u64) -> String {
    format!("{NAME}.weighted_vs_plain.work_{work_ms}ms")
}

/// The id of `mode`'s steady throughput at `work_ms`.
fn rate_id(mode: &str, work_ms: u64) -> String {
    format!("{NAME}.{mode}.work_{work_ms}ms.throughput")
}

const DEF_RATE: &str = "Messages handled from a tenth to a half of the three queues' messages \
    (every queue still has a backlog), over the seconds between the two.";

const DEF_RATIO: &str = "The weighted group's steady rate over the plain workers' in the same \
    round, at the same handler time.";

const DEF_PER_READ: &str = "Messages claimed over reads, the three workers together.";

fn add_figures(f: &mut Figures, runs: &[PrioritiesRun]) {
    let mut times: Vec<u64> = runs.iter().map(|r| r.work_ms).collect();
    times.sort_unstable();
    times.dedup();
    for w in times {
        let of = |mode: &'static str| {
            measured(runs, |r| r.warmup).filter(move |r| r.mode == mode && r.work_ms == w)
        };
        for mode in MODES {
            f.rate(
                &rate_id(mode, w),
                NAME,
                &format!("Steady throughput, {mode}, {w} ms handlers"),
                DEF_RATE,
                of(mode).map(|r| (r.round, &r.steady)),
            );
            f.add(
                format!("{NAME}.{mode}.work_{w}ms.messages_per_read"),
                NAME,
                format!("Messages per read, {mode}, {w} ms handlers"),
                "msg",
                Better::Higher,
                DEF_PER_READ,
                of(mode)
                    .map(|r| Sample::value(r.round, r.messages_per_read))
                    .collect(),
            );
        }
        let ratios = of("weighted")
            .filter_map(|g| {
                let p = of("plain").find(|p| p.round == g.round)?;
                (p.steady.rate_per_s > 0.0)
                    .then(|| Sample::value(g.round, g.steady.rate_per_s / p.steady.rate_per_s))
            })
            .collect();
        f.add(
            ratio_id(w),
            NAME,
            format!("Weighted ÷ plain, {w} ms handlers"),
            "x",
            Better::Higher,
            DEF_RATIO,
            ratios,
        );
    }
}

fn report_part(out: &mut String, d: &Document) {
    let Ok(w) = d.metadata.workload.options_of::<PrioritiesOptions>() else {
        return;
    };
    let times: Vec<u64> = w
        .priorities_work_ms
        .iter()
        .copied()
        .filter(|ms| fig(d, &ratio_id(*ms)).is_some())
        .collect();
    if times.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "## Priorities\n\nThree queues of {} messages, a weighted group (weights 4, 2, 1) of {} handlers \
         against plain workers splitting them evenly.\n\n\
         | Handler | Weighted msg/s | Plain msg/s | Weighted ÷ plain | Messages a read, weighted | plain |\n\
         | --- | --- | --- | --- | --- | --- |",
        w.priorities_messages, w.priorities_concurrency
    );
    let mut ids = Vec::new();
    for ms in times {
        let per_read = |mode: &str| cell(d, &format!("{NAME}.{mode}.work_{ms}ms.messages_per_read"));
        let _ = writeln!(
            out,
            "| {ms} ms | {} | {} | {} | {} | {} |",
            cell(d, &rate_id("weighted", ms)),
            cell(d, &rate_id("plain", ms)),
            cell(d, &ratio_id(ms)),
            per_read("weighted"),
            per_read("plain"),
        );
        ids.extend([
            rate_id("weighted", ms),
            ratio_id(ms),
            format!("{NAME}.weighted.work_{ms}ms.messages_per_read"),
        ]);
    }
    out.push('\n');
    definitions(out, d, &ids);
}
