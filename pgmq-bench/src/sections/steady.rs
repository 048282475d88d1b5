//! steady_stream: a producer and the worker together at a steady depth,
//! once per handler count, so that the worker's rate can be followed as
//! its concurrency grows on a queue that never drains (the handler returns
//! `Outcome::Archive` or `Outcome::Delete` as `--steady-ack` says). What a
//! run records, when it keeps up and the two targets are described once, in
//! docs/benchmark-streams.md ("steady_stream").

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use pgmq_testkit::spec::WorkerSettings;
use pgmq_worker::Outcome;
use serde::{Deserialize, Serialize};

use crate::checks::Checks;
use crate::config::{pick, Apply, Profile};
use crate::document::{Runs, SectionRuns, Better, Document, Percentiles, Rate, Sample, Sections, WorkerCounters};
use crate::error::{Error, Result};
use crate::document::{Figure, TargetCheck};
use crate::figures::{check, measured, median_of, Figures};
use crate::report::runs_and_workload;
use crate::report::definitions;
use crate::report::{round_cell, thousands};
use crate::kit::body::padding;
use crate::kit::load::{Pace, TOP_UP_MOST};
use crate::kit::stream::{StreamRun, StreamSpec};
use crate::kit::worker::counters;
use crate::kit::Ctx;
use crate::sections::{at_least, seconds, Options, Round, Rounds, Section};
use crate::config::Config;
use crate::sections::plan::Plan;

/// The section's name, in the document and on the command line.
const NAME: &str = "steady_stream";

/// The section\'s runs in the document.
const RUNS: Runs<SteadyRun> = Runs::new(NAME);

/// The least share of the best rate before it a handler count must reach.
pub const STEP_FLOOR: f64 = 0.95;

/// The claim latency p99 target on runs that kept up, milliseconds.
pub const CLAIM_P99_LIMIT_MS: f64 = 100.0;

/// The least share of the paced rate completed for a run to keep up.
const KEEP_UP: f64 = 0.95;

/// How the handler acknowledges a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SteadyAck {
    /// `Outcome::Archive`: moved to the archive table.
    Archive,
    /// `Outcome::Delete`.
    Delete,
}

impl SteadyAck {
    fn name(self) -> &'static str {
        match self {
            SteadyAck::Archive => "archive",
            SteadyAck::Delete => "delete",
        }
    }

    fn outcome(self) -> Outcome {
        match self {
            SteadyAck::Archive => Outcome::Archive,
            SteadyAck::Delete => Outcome::Delete,
        }
    }
}

/// The steady_stream options.
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
#[non_exhaustive]
pub struct SteadyOptions {
    /// steady_stream: the handler counts, one run each (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "16,64,256,1024")]
    pub steady_handlers: Vec<u32>,

    /// steady_stream: what each handler call sleeps, milliseconds
    /// (comma-separated: one series each).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub steady_sleep_ms: Vec<u64>,

    /// steady_stream: how a success is acknowledged (comma-separated:
    /// one series each).
    #[arg(long, value_delimiter = ',', value_enum, default_value = "archive")]
    pub steady_ack: Vec<SteadyAck>,

    /// steady_stream: the producer's most messages a second (0: only the
    /// depth bounds it), comma-separated: one series each.
    #[arg(long, value_delimiter = ',', default_value = "0,2000")]
    pub steady_rates: Vec<u64>,

    /// steady_stream: the depth the producer keeps (sent minus completed).
    #[arg(long, default_value_t = 4_000)]
    pub steady_depth: u64,

    /// steady_stream: seconds measured per run, after the warm-up.
    #[arg(long, default_value_t = 20.0)]
    pub steady_duration_s: f64,

    /// steady_stream: seconds at the start of each run left out.
    #[arg(long, default_value_t = 5.0)]
    pub steady_warmup_s: f64,

    /// steady_stream: the worker's poll interval, milliseconds.
    #[arg(long, default_value_t = 50)]
    pub steady_poll_ms: u64,

    /// steady_stream: bytes of each message body.
    #[arg(long, default_value_t = 256)]
    pub steady_body_bytes: u32,

    /// steady_stream: connections in the worker's pool.
    #[arg(long, default_value_t = 10)]
    pub steady_pool: u32,

    /// steady_stream: the dead row versions at which the worker vacuums
    /// its queue table (`WorkerBuilder::vacuum`); 0: off, autovacuum alone.
    #[arg(long, default_value_t = 0)]
    pub steady_vacuum: u64,
}

impl SteadyOptions {
    /// The handler counts, ascending, without repeats.
    fn handlers(&self) -> Vec<u32> {
        let mut handlers = self.steady_handlers.clone();
        handlers.sort_unstable();
        handlers.dedup();
        handlers
    }

    /// The measured window.
    pub fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.steady_duration_s)
    }

    /// The warm-up left out.
    fn warmup(&self) -> Duration {
        Duration::from_secs_f64(self.steady_warmup_s)
    }
}

impl Options for SteadyOptions {
    fn check(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::Config(m.into()));
        if self.steady_handlers.is_empty()
            || self.steady_handlers.iter().any(|n| !(1..=4096).contains(n))
        {
            return bad("--steady-handlers must list handler counts between 1 and 4096");
        }
        if self.steady_sleep_ms.is_empty() || self.steady_ack.is_empty() {
            return bad("--steady-sleep-ms and --steady-ack need at least one value");
        }
        if self.steady_rates.is_empty() {
            return bad("--steady-rates needs at least one value (0: unpaced)");
        }
        seconds(self.steady_duration_s, "--steady-duration-s", 0.5)?;
        seconds(self.steady_warmup_s, "--steady-warmup-s", 0.0)?;
        at_least(self.steady_depth, 1, "--steady-depth")?;
        at_least(self.steady_poll_ms, 1, "--steady-poll-ms")?;
        at_least(self.steady_pool, 4, "--steady-pool")?;
        Ok(())
    }

    fn apply_profile(&mut self, p: &Apply<'_>) {
        let full = [16, 64, 256, 1024];
        match p.profile {
            Profile::Quick | Profile::Default => {
                let seconds = if p.profile == Profile::Quick { 3.0 } else { 2.0 };
                pick!(p, self.steady_handlers, full.to_vec(), vec![16, 256]);
                pick!(p, self.steady_duration_s, 20.0, seconds);
                pick!(p, self.steady_warmup_s, 5.0, 1.0);
            }
            Profile::Standard => {
                pick!(p, self.steady_duration_s, 20.0, 10.0);
                pick!(p, self.steady_warmup_s, 5.0, 3.0);
            }
            Profile::Full | Profile::Long => {}
        }
    }
}

/// One run: one handler count, sleep, acknowledgement and producer rate.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct SteadyRun {
    /// Round.
    pub round: u32,
    /// Warm-up or measured.
    pub warmup: bool,
    /// Handlers.
    pub handlers: u32,
    /// Handler sleep, milliseconds.
    pub sleep_ms: u64,
    /// `archive` or `delete`.
    pub ack: SteadyAck,
    /// The producer's most messages a second (None: unpaced).
    pub rate_limit_per_s: Option<f64>,
    /// Messages whose handler finished within the measured window.
    pub completed: Rate,
    /// Messages sent within the measured window.
    pub produced: Rate,
    /// Mean and largest depth (sent minus completed) over one-second samples.
    pub depth_mean: f64,
    /// Largest depth sampled.
    pub depth_max: u64,
    /// Paced, completed at least 95% of the pace, mean depth below half
    /// the target.
    pub kept_up: bool,
    /// Claim latency (`enqueued_at` to handler start) over the window, ms.
    pub claim_ms: Percentiles,
    /// Completions per second of the window.
    pub per_second: Vec<f64>,
    /// The database's counters over the window, per message completed.
    pub server: SteadyServer,
    /// The worker's counters at shutdown.
    pub worker: WorkerCounters,
    /// Messages the worker archived (its `archived` counter at shutdown).
    pub archived: u64,
    /// Peak RSS of the bench process during the run.
    pub peak_rss_bytes: u64,
}

pub use crate::kit::snapshot::SteadyServer;

/// The steady_stream section (see the module docs).
pub(crate) struct SteadyStream;

impl Section for SteadyStream {
    fn runs(&self) -> &dyn SectionRuns {
        &RUNS
    }

    fn about(&self) -> &'static str {
        "A producer keeping a depth and the worker, per handler count"
    }

    fn planned(&self, cfg: &Config) -> Plan {
        let o = &cfg.options.steady;
        let series = o.steady_sleep_ms.len() * o.steady_ack.len() * o.steady_rates.len();
        let runs = (o.handlers().len() * series) as f64;
        Plan::fixed(runs * (o.warmup() + o.duration()).as_secs_f64()) + Plan::work(runs * 0.5)
    }

    fn check(&self, s: &Sections, out: &mut Checks) {
        out.each(&RUNS, s, |r| (series_key(r), r.round, r.warmup), |out, tag, r| {
            out.short_run(tag, r.completed.elapsed_s);
            match r.ack {
                SteadyAck::Delete => out.counters(tag, &r.worker),
                // The shared check counts deletes; archives are counted apart.
                SteadyAck::Archive if r.archived != r.worker.succeeded => out.fail(format!(
                    "{tag}: {} handler successes but {} archived",
                    r.worker.succeeded, r.archived
                )),
                SteadyAck::Archive => {}
            }
        });
    }

    fn figures(&self, s: &Sections, f: &mut Figures) {
        add_figures(f, &RUNS.list(s));
    }

    /// The section's table: one row per run, then the two round figures.
    fn report(&self, d: &Document, out: &mut String) {
        let Some((runs, w)) = runs_and_workload::<_, SteadyOptions>(d, &RUNS) else {
            return;
        };
        let _ = writeln!(
            out,
            "## Steady stream (steady_stream)\n\n\
             A producer keeping {} messages queued, bodies of {} bytes, poll interval {} ms, pool {}; \
             {} s measured per run after {} s of warm-up.\n\n\
             | Round | Series | Handlers | Completed/s | Produced/s | Mean depth | Claim p50 / p95 / p99 (ms) | Kept up | Server CPU/msg (µs) | Bench CPU/msg (µs) | Index tuples/msg | Buffers/msg | Dead tuples peak |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            thousands(w.steady_depth as f64),
            w.steady_body_bytes,
            w.steady_poll_ms,
            w.steady_pool,
            w.steady_duration_s,
            w.steady_warmup_s
        );
        for r in &runs {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {:.1} / {:.1} / {:.1} | {} | {} |",
                round_cell(r.round, r.warmup),
                series_key(r),
                r.handlers,
                thousands(r.completed.rate_per_s),
                thousands(r.produced.rate_per_s),
                thousands(r.depth_mean),
                r.claim_ms.p50,
                r.claim_ms.p95,
                r.claim_ms.p99,
                if r.rate_limit_per_s.is_none() {
                    "–"
                } else if r.kept_up {
                    "yes"
                } else {
                    "no"
                },
                r.server.cells(true),
            );
        }
        out.push('\n');
        definitions(
            out,
            d,
            &[
                format!("{NAME}.step_ratio_min"),
                format!("{NAME}.claim_p99_kept_up_ms"),
            ],
        );
    }

    /// Completions never fall as handlers grow, and claim latency stays
    /// low while the worker keeps up.
    fn targets(&self, figures: &[Figure]) -> Vec<TargetCheck> {
        let med = |id: &str| median_of(figures, id);
        vec![
            check(
                "steady_step_rule",
                "Steady stream: each handler count completes at least 0.95x the best rate of the smaller counts of its series",
                med("steady_stream.step_ratio_min"),
                STEP_FLOOR,
                "x",
                |v| v >= STEP_FLOOR,
                Ok(()),
                "median over rounds of each round's smallest ratio over every series",
            ),
            check(
                "steady_claim_p99",
                "Steady stream: claim latency p99 at most 100 ms while the worker keeps up with a paced producer",
                med("steady_stream.claim_p99_kept_up_ms"),
                CLAIM_P99_LIMIT_MS,
                "ms",
                |v| v <= CLAIM_P99_LIMIT_MS,
                Ok(()),
                "median over rounds of each round's worst p99 among the paced runs that completed at least 95% of the rate",
            ),
        ]
    }
}

impl Rounds for SteadyStream {
    /// One round: every series, each handler count in ascending order.
    async fn run_round(&self, ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
        let c = ctx.cfg.options.steady.clone();
        for &ack in &c.steady_ack {
            for &sleep_ms in &c.steady_sleep_ms {
                let sleep = Duration::from_millis(sleep_ms);
                for &rate in &c.steady_rates {
                    for n in c.handlers() {
                        let r = run(ctx, &c, Series { ack, sleep, rate }, n, at).await?;
                        ctx.progress.say(format!(
                            "{} {NAME} {} h{n}: {:.0} completed/s, claim p99 {:.1} ms, {} µs server CPU/msg",
                            at.tag,
                            series_key(&r),
                            r.completed.rate_per_s,
                            r.claim_ms.p99,
                            r.server
                                .cpu_us_per_msg
                                .map_or("–".to_owned(), |v| format!("{v:.0}"))
                        ));
                        RUNS.record(s, &r)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// What a series holds fixed.
#[derive(Debug, Clone, Copy)]
struct Series {
    ack: SteadyAck,
    sleep: Duration,
    rate: u64,
}

/// One run of `n` handlers: the warm-up left out, then one window.
async fn run(
    ctx: &Arc<Ctx>,
    c: &SteadyOptions,
    series: Series,
    n: u32,
    at: Round<'_>,
) -> Result<SteadyRun> {
    let spec = StreamSpec {
        prefix: "steady",
        pool: Some(c.steady_pool),
        sleep: series.sleep,
        settings: WorkerSettings {
            concurrency: Some(n as usize),
            poll_interval_ms: Some(c.steady_poll_ms),
            vacuum: (c.steady_vacuum > 0).then_some(c.steady_vacuum),
            ..WorkerSettings::default()
        },
        ack: series.ack.outcome(),
    };
    let stream = StreamRun::start(ctx, spec).await?;
    let pace = Pace {
        depth: Some(c.steady_depth),
        rate: (series.rate > 0).then_some(series.rate as f64),
        least: (c.steady_depth / 20).clamp(1, 100),
        most: TOP_UP_MOST,
        nap: Duration::from_millis(1),
    };
    let producer = stream.produce(ctx, &padding(c.steady_body_bytes), pace);
    tokio::time::sleep(c.warmup()).await;
    let w = stream.window(ctx, c.duration(), &producer).await;
    let (report, peak) = stream.finish(ctx, producer).await?;
    let completed = Rate::new(w.completed, w.elapsed_s);
    let rate_limit = (series.rate > 0).then_some(series.rate as f64);
    let depth_mean = w.backlog.iter().sum::<u64>() as f64 / w.backlog.len().max(1) as f64;
    Ok(SteadyRun {
        round: at.index,
        warmup: at.warm,
        handlers: n,
        sleep_ms: series.sleep.as_millis() as u64,
        ack: series.ack,
        rate_limit_per_s: rate_limit,
        kept_up: rate_limit.is_some_and(|r| completed.rate_per_s >= KEEP_UP * r)
            && (depth_mean as u64) < c.steady_depth / 2,
        completed,
        produced: Rate::new(w.produced, w.elapsed_s),
        depth_mean,
        depth_max: w.backlog.iter().copied().max().unwrap_or(0),
        claim_ms: crate::stats::percentiles_us_to_ms(&w.claims),
        per_second: w.per_second,
        server: w.server,
        worker: counters(&report.stats),
        archived: report.stats.archived,
        peak_rss_bytes: peak,
    })
}

/// `archive/sleep1ms/unpaced` or `delete/sleep10ms/rate2000`.
fn series_key(r: &SteadyRun) -> String {
    format!(
        "{}/sleep{}ms/{}",
        r.ack.name(),
        r.sleep_ms,
        r.rate_limit_per_s
            .map_or("unpaced".to_owned(), |v| format!("rate{v:.0}"))
    )
}

/// The figure id of `what` for the run's series and handler count.
fn id(r: &SteadyRun, what: &str) -> String {
    format!("{NAME}.{}.h{}.{what}", series_key(r).replace('/', "."), r.handlers)
}

const DEF_RATE: &str = "Messages whose handler finished within the measured window (after the \
    warm-up) ÷ its seconds, with a producer keeping the depth at --steady-depth (and, when paced, \
    sending at most its rate).";

const DEF_P99: &str = "99th percentile of the claim latency: the message's enqueued_at (database \
    clock) to the start of its handler call (this host's clock moved onto the database's), over \
    the measured window.";

const DEF_P50: &str = "Median claim latency over the measured window (see the p99's definition).";

const DEF_CPU: &str = "CPU time of every process of the PostgreSQL cluster over the measured \
    window (/proc: the postmaster, its live children and the children it reaped) ÷ messages \
    completed; only when the server runs on the bench's host. It includes the producer's sends.";

const DEF_DEAD: &str = "Largest n_dead_tup of the run's queue table over one-second samples.";

const DEF_STEP: &str = "Per round, the smallest ratio, over every series (ack, sleep, rate) and \
    handler count, of its completed rate to the best completed rate of the smaller handler counts \
    of the series (target: at least 0.95).";

const DEF_KEPT: &str = "Per round, the largest claim latency p99 of the paced runs whose worker \
    completed at least 95% of the producer's rate (target: at most 100 ms).";

/// Per run its rate, claim latency, server CPU and dead tuples; per round
/// the step rule's smallest ratio and the worst p99 of runs that kept up.
fn add_figures(f: &mut Figures, runs: &[SteadyRun]) {
    let mut ids: BTreeMap<String, Vec<&SteadyRun>> = BTreeMap::new();
    for r in measured(runs, |r| r.warmup) {
        ids.entry(id(r, "")).or_default().push(r);
    }
    for group in ids.values() {
        let r0 = group[0];
        let label = format!("{}, {} handlers", series_key(r0), r0.handlers);
        f.rate(
            &id(r0, "completed_rate"),
            NAME,
            &format!("Completed, {label}"),
            DEF_RATE,
            group.iter().map(|r| (r.round, &r.completed)),
        );
        let values = |pick: fn(&SteadyRun) -> Option<f64>| {
            group
                .iter()
                .filter_map(|r| pick(r).map(|v| Sample::value(r.round, v)))
                .collect()
        };
        type Pick = fn(&SteadyRun) -> Option<f64>;
        let picks: [(&str, &str, &str, Better, &str, Pick); 4] = [
            ("claim_p50_ms", "claim p50", "ms", Better::Lower, DEF_P50, |r| {
                Some(r.claim_ms.p50)
            }),
            ("claim_p99_ms", "claim p99", "ms", Better::Lower, DEF_P99, |r| {
                Some(r.claim_ms.p99)
            }),
            ("server_cpu_us_per_msg", "server CPU per message", "µs/msg", Better::Lower, DEF_CPU, |r| {
                r.server.cpu_us_per_msg
            }),
            ("dead_tuples_peak", "dead tuples peak", "msg", Better::Lower, DEF_DEAD, |r| {
                r.server.dead_tuples_peak.map(|v| v as f64)
            }),
        ];
        for (what, name, unit, better, def, pick) in picks {
            f.add(id(r0, what), NAME, format!("{label}, {name}"), unit, better, def, values(pick));
        }
    }
    let mut step: Vec<Sample> = Vec::new();
    let mut kept: Vec<Sample> = Vec::new();
    let rounds: std::collections::BTreeSet<u32> =
        measured(runs, |r| r.warmup).map(|r| r.round).collect();
    for round in rounds {
        let of: Vec<&SteadyRun> = measured(runs, |r| r.warmup).filter(|r| r.round == round).collect();
        if let Some(v) = step_ratio_min(&of) {
            step.push(Sample::value(round, v));
        }
        if let Some(v) = of
            .iter()
            .filter(|r| r.kept_up)
            .map(|r| r.claim_ms.p99)
            .reduce(f64::max)
        {
            kept.push(Sample::value(round, v));
        }
    }
    f.add(
        format!("{NAME}.step_ratio_min"),
        NAME,
        "Steady stream: smallest step ratio".into(),
        "x",
        Better::Higher,
        DEF_STEP,
        step,
    );
    f.add(
        format!("{NAME}.claim_p99_kept_up_ms"),
        NAME,
        "Steady stream: worst claim p99 while keeping up".into(),
        "ms",
        Better::Lower,
        DEF_KEPT,
        kept,
    );
}

/// The smallest ratio of a run's rate to the best rate of the smaller
/// handler counts of its series, over the runs of one round (None: no
/// series with two handler counts).
fn step_ratio_min(runs: &[&SteadyRun]) -> Option<f64> {
    let mut series: BTreeMap<String, Vec<(u32, f64)>> = BTreeMap::new();
    for r in runs {
        series
            .entry(series_key(r))
            .or_default()
            .push((r.handlers, r.completed.rate_per_s));
    }
    let mut min: Option<f64> = None;
    for mut s in series.into_values() {
        s.sort_by_key(|(n, _)| *n);
        let mut best = 0.0f64;
        for (i, (_, rate)) in s.iter().enumerate() {
            if i > 0 && best > 0.0 {
                let ratio = rate / best;
                min = Some(min.map_or(ratio, |m| m.min(ratio)));
            }
            best = best.max(*rate);
        }
    }
    min
}

