//! pinned_horizon: a paced stream drained while long transactions pin the
//! MVCC horizon, so that no dead tuple of the queue can be vacuumed. The
//! calibration, the clean, pinned and recovered phases, what each records
//! and the two targets are described once, in docs/benchmark-streams.md ("pinned_horizon").

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use pgmq_client::QueueName;
use pgmq_testkit::spec::WorkerSettings;
use pgmq_worker::Outcome;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::checks::Checks;
use crate::document::ClaimReadsArg;
use crate::config::{pick, Apply, Profile};
use crate::document::{Runs, SectionRuns, 
    Better, Document, Figure, Percentiles, Rate, Sample, Sections, TargetCheck, WorkerCounters,
};
use crate::error::{Error, Result};
use crate::figures::{check, measured, median_of, Figures};
use crate::report::runs_and_workload;
use crate::report::definitions;
use crate::report::{round_cell, thousands};
use crate::kit::body::padding;
use crate::kit::load::{Pace, TOP_UP_MOST};
use crate::kit::snapshot::SteadyServer;
use crate::kit::stream::{Producer, StreamRun, StreamSpec};
use crate::kit::worker::{claim_reads, counters};
use crate::kit::Ctx;
use crate::sections::{seconds, within, Options, Round, Rounds, Section};
use crate::config::Config;
use crate::sections::plan::Plan;

/// The section's name, in the document and on the command line.
const NAME: &str = "pinned_horizon";

/// The section\'s runs in the document.
const RUNS: Runs<PinnedRun> = Runs::new(NAME);

/// The least share of the pinned phase's produced messages completed in it.
pub const KEEP_UP_FLOOR: f64 = 0.95;

/// The most seconds after the pin clears for the backlog to be back.
pub const RECOVERY_LIMIT_S: f64 = 30.0;

/// The depth the calibration's producer keeps.
const CALIBRATION_DEPTH: u64 = 4_000;

/// The pinned_horizon options.
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
#[non_exhaustive]
pub struct PinnedOptions {
    /// pinned_horizon: the worker's handlers.
    #[arg(long, default_value_t = 64)]
    pub pinned_handlers: u32,

    /// pinned_horizon: what each handler call sleeps, milliseconds.
    #[arg(long, default_value_t = 1)]
    pub pinned_sleep_ms: u64,

    /// pinned_horizon: the producer's messages a second in the phases (0:
    /// `--pinned-share` of the clean rate the calibration measured).
    #[arg(long, default_value_t = 0)]
    pub pinned_rate: u64,

    /// pinned_horizon: the share of the calibrated clean rate the producer
    /// sends at when `--pinned-rate` is 0.
    #[arg(long, default_value_t = 0.7)]
    pub pinned_share: f64,

    /// pinned_horizon: seconds of the unpaced calibration.
    #[arg(long, default_value_t = 10.0)]
    pub pinned_calibrate_s: f64,

    /// pinned_horizon: seconds of each phase (clean, pinned, recovered).
    #[arg(long, default_value_t = 20.0)]
    pub pinned_phase_s: f64,

    /// pinned_horizon: sessions repeating `REPEATABLE READ` scans of the
    /// queue table while pinned.
    #[arg(long, default_value_t = 4)]
    pub pinned_readers: u32,

    /// pinned_horizon: the claim reads compared, one run each
    /// (comma-separated).
    #[arg(long, value_delimiter = ',', value_enum, default_value = "bounded,function")]
    pub pinned_claim_reads: Vec<ClaimReadsArg>,
}

impl PinnedOptions {
    /// The claim reads compared, without repeats in a row.
    fn claim_reads(&self) -> Vec<ClaimReadsArg> {
        let mut claim_reads = self.pinned_claim_reads.clone();
        claim_reads.dedup();
        claim_reads
    }

    /// The calibration.
    fn calibrate(&self) -> Duration {
        Duration::from_secs_f64(self.pinned_calibrate_s)
    }

    /// Each phase.
    fn phase(&self) -> Duration {
        Duration::from_secs_f64(self.pinned_phase_s)
    }
}

impl Options for PinnedOptions {
    fn check(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::Config(m.into()));
        if !(self.pinned_share > 0.0 && self.pinned_share <= 1.0) {
            return bad("--pinned-share must be above 0 and at most 1");
        }
        if self.pinned_claim_reads.is_empty() {
            return bad("--pinned-claim-reads needs at least one value");
        }
        within(self.pinned_handlers, 1..=4096, "--pinned-handlers")?;
        seconds(self.pinned_calibrate_s, "--pinned-calibrate-s", 0.5)?;
        seconds(self.pinned_phase_s, "--pinned-phase-s", 1.0)?;
        within(self.pinned_readers, 0..=64, "--pinned-readers")?;
        Ok(())
    }

    fn apply_profile(&mut self, p: &Apply<'_>) {
        match p.profile {
            Profile::Quick | Profile::Default => {
                pick!(p, self.pinned_calibrate_s, 10.0, 2.0);
                pick!(p, self.pinned_phase_s, 20.0, 2.0);
                pick!(
                    p,
                    self.pinned_claim_reads,
                    vec![ClaimReadsArg::Bounded, ClaimReadsArg::Function],
                    vec![ClaimReadsArg::Bounded]
                );
            }
            Profile::Standard => {
                pick!(p, self.pinned_calibrate_s, 10.0, 5.0);
                pick!(p, self.pinned_phase_s, 20.0, 10.0);
            }
            Profile::Full | Profile::Long => {}
        }
    }
}

/// One run: one claim-reads path through the three phases.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct PinnedRun {
    /// Round.
    pub round: u32,
    /// Warm-up or measured.
    pub warmup: bool,
    /// How the worker claimed.
    pub claim_reads: ClaimReadsArg,
    /// Handlers.
    pub handlers: u32,
    /// Handler sleep, milliseconds.
    pub sleep_ms: u64,
    /// Completions of the unpaced calibration (its last three quarters).
    pub clean_unpaced: Rate,
    /// The producer's rate in the phases, messages a second.
    pub rate_per_s: f64,
    /// Clean, pinned, recovered.
    pub phases: Vec<PinnedPhase>,
    /// Seconds from the pin's release to the first one-second sample of
    /// the backlog at most twice the clean phase's largest (None: not
    /// within the recovered phase).
    pub recovery_s: Option<f64>,
    /// The worker's counters at shutdown.
    pub worker: WorkerCounters,
    /// Peak RSS of the bench process during the run.
    pub peak_rss_bytes: u64,
}

/// One phase of a run.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct PinnedPhase {
    /// `clean`, `pinned` or `recovered`.
    pub phase: String,
    /// Messages sent in the phase.
    pub produced: Rate,
    /// Messages whose handler finished in the phase.
    pub completed: Rate,
    /// Completed ÷ produced.
    pub kept_ratio: f64,
    /// Backlog (sent minus completed) at the phase's start.
    pub backlog_start: u64,
    /// Backlog sampled each second of the phase.
    pub backlog: Vec<u64>,
    /// Least-squares slope of the samples, messages a second (positive:
    /// the backlog grows).
    pub backlog_slope_per_s: f64,
    /// Claim latency (`enqueued_at` to handler start) in the phase, ms.
    pub claim_ms: Percentiles,
    /// The worker's claim reads in the phase (absent in older documents).
    #[serde(default)]
    pub reads: u64,
    /// Of those, the reads that started at the queue's head: each walks the
    /// dead rows a pinned horizon keeps there (absent in older documents).
    #[serde(default)]
    pub reads_from_start: u64,
    /// The database's counters over the phase, per message completed.
    pub server: SteadyServer,
}

/// The pinned_horizon section (see the module docs).
pub(crate) struct PinnedHorizon;

impl Section for PinnedHorizon {
    fn runs(&self) -> &dyn SectionRuns {
        &RUNS
    }

    fn about(&self) -> &'static str {
        "A paced stream while long transactions pin the MVCC horizon"
    }

    fn planned(&self, cfg: &Config) -> Plan {
        let o = &cfg.options.pinned;
        let runs = o.claim_reads().len() as f64;
        Plan::fixed(runs * (o.calibrate() + o.phase() * 3).as_secs_f64()) + Plan::work(runs)
    }

    fn check(&self, s: &Sections, out: &mut Checks) {
        out.each(&RUNS, s, |r| (r.claim_reads.name(), r.round, r.warmup), |out, tag, r| {
            out.counters(tag, &r.worker);
            if r.phases.len() != 3 {
                out.fail(format!("{tag}: {} phases, not 3", r.phases.len()));
            }
            for p in &r.phases {
                out.short_run(&format!("{tag} {}", p.phase), p.completed.elapsed_s);
            }
        });
    }

    fn figures(&self, s: &Sections, f: &mut Figures) {
        add_figures(f, &RUNS.list(s));
    }

    /// The section's table: one row per phase of each run.
    fn report(&self, d: &Document, out: &mut String) {
        let Some((runs, w)) = runs_and_workload::<_, PinnedOptions>(d, &RUNS) else {
            return;
        };
        let _ = writeln!(
            out,
            "## Pinned MVCC horizon (pinned_horizon)\n\n\
             {} handlers sleeping {} ms; a producer at {} of the clean unpaced rate (or --pinned-rate), \
             phases of {} s: clean, pinned (an idle transaction holding an xid and {} repeating \
             REPEATABLE READ scans of the queue table), recovered.\n\n\
             | Round | Claim reads | Phase | Produced/s | Completed/s | Completed ÷ produced | Backlog slope (msg/s) | Backlog max | Claim p50 / p99 (ms) | Reads (from the start) | Server CPU/msg (µs) | Index tuples/msg | Buffers/msg | Dead tuples peak |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            w.pinned_handlers,
            w.pinned_sleep_ms,
            w.pinned_share,
            w.pinned_phase_s,
            w.pinned_readers,
        );
        for r in &runs {
            let round = round_cell(r.round, r.warmup);
            for p in &r.phases {
                let _ = writeln!(
                    out,
                    "| {round} | {} | {} | {} | {} | {:.3} | {:.1} | {} | {:.1} / {:.1} | {} ({}) | {} |",
                    r.claim_reads.name(),
                    p.phase,
                    thousands(p.produced.rate_per_s),
                    thousands(p.completed.rate_per_s),
                    p.kept_ratio,
                    p.backlog_slope_per_s,
                    thousands(p.backlog.iter().copied().max().unwrap_or(0) as f64),
                    p.claim_ms.p50,
                    p.claim_ms.p99,
                    thousands(p.reads as f64),
                    thousands(p.reads_from_start as f64),
                    p.server.cells(false),
                );
            }
        }
        out.push('\n');
        for r in &runs {
            let _ = writeln!(
                out,
                "- Round {}, {} reads: clean unpaced {}/s, paced at {}/s, backlog back {}.",
                round_cell(r.round, r.warmup),
                r.claim_reads.name(),
                thousands(r.clean_unpaced.rate_per_s),
                thousands(r.rate_per_s),
                r.recovery_s.map_or("not within the recovered phase".to_owned(), |v| format!(
                    "{v:.0} s after the pin cleared"
                )),
            );
        }
        out.push('\n');
        definitions(
            out,
            d,
            &[
                format!("{NAME}.bounded.pinned.kept_ratio"),
                format!("{NAME}.bounded.recovery_s"),
            ],
        );
    }

    /// The worker's own reads keep up while pinned and recover after.
    fn targets(&self, figures: &[Figure]) -> Vec<TargetCheck> {
        let med = |id: &str| median_of(figures, id);
        vec![
            check(
                "pinned_keeps_up",
                "Pinned horizon: the worker completes at least 95% of what the producer sent while the horizon is pinned",
                med(&format!("{NAME}.bounded.pinned.kept_ratio")),
                KEEP_UP_FLOOR,
                "x",
                |v| v >= KEEP_UP_FLOOR,
                Ok(()),
                "median over rounds of the pinned phase's completed ÷ produced, the worker's own claim reads",
            ),
            check(
                "pinned_recovery",
                "Pinned horizon: the backlog is back to the clean phase's within 30 s of the pin clearing",
                med(&format!("{NAME}.bounded.recovery_s")),
                RECOVERY_LIMIT_S,
                "s",
                |v| v <= RECOVERY_LIMIT_S,
                Ok(()),
                "median over rounds, the worker's own claim reads; a run that did not recover within its recovered phase counts as that phase's length plus one second",
            ),
        ]
    }
}

impl Rounds for PinnedHorizon {
    /// One round: a run per claim-reads path.
    async fn run_round(&self, ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
        let c = ctx.cfg.options.pinned.clone();
        for reads in c.claim_reads() {
            let r = run(ctx, &c, reads, at).await?;
            let say = |i: usize| {
                r.phases.get(i).map_or("–".to_owned(), |p| {
                    format!(
                        "{:.0}/s (p99 {:.0} ms)",
                        p.completed.rate_per_s, p.claim_ms.p99
                    )
                })
            };
            ctx.progress.say(format!(
                "{} {NAME} {}: clean {:.0}/s unpaced, paced at {:.0}/s: clean {}, pinned {}, recovered {}, back in {}",
                at.tag,
                reads.name(),
                r.clean_unpaced.rate_per_s,
                r.rate_per_s,
                say(0),
                say(1),
                say(2),
                r.recovery_s.map_or("–".to_owned(), |v| format!("{v:.0} s"))
            ));
            RUNS.record(s, &r)?;
        }
        Ok(())
    }
}

/// A producer keeping `depth` messages queued, as fast as they drain.
fn at_depth(depth: u64) -> Pace {
    Pace {
        depth: Some(depth),
        rate: None,
        least: 20,
        most: TOP_UP_MOST,
        nap: Duration::from_millis(2),
    }
}

/// A producer sending `rate` messages a second, whatever the backlog.
fn at_rate(rate: f64) -> Pace {
    Pace {
        depth: None,
        rate: Some(rate),
        least: 1,
        most: TOP_UP_MOST,
        nap: Duration::from_millis(2),
    }
}

/// One run of the claim reads `reads` (see the module docs).
async fn run(
    ctx: &Arc<Ctx>,
    c: &PinnedOptions,
    reads: ClaimReadsArg,
    at: Round<'_>,
) -> Result<PinnedRun> {
    let spec = StreamSpec {
        prefix: "pinned",
        pool: None,
        sleep: Duration::from_millis(c.pinned_sleep_ms),
        settings: WorkerSettings {
            concurrency: Some(c.pinned_handlers as usize),
            claim_reads: Some(claim_reads(reads)),
            ..WorkerSettings::default()
        },
        ack: Outcome::Delete,
    };
    let run = StreamRun::start(ctx, spec).await?;
    let stream = &run.stream;
    let pad = padding(ctx.cfg.payload_bytes);

    // Calibration: unpaced, its first quarter left out.
    let producer = run.produce(ctx, &pad, at_depth(CALIBRATION_DEPTH));
    tokio::time::sleep(c.calibrate() / 4).await;
    let (d0, t0) = (stream.tally.distinct(), Instant::now());
    tokio::time::sleep(c.calibrate() - c.calibrate() / 4).await;
    let clean_unpaced = Rate::new(stream.tally.distinct() - d0, t0.elapsed().as_secs_f64());
    producer.stop().await?;
    let rate = match c.pinned_rate {
        0 => clean_unpaced.rate_per_s * c.pinned_share,
        r => r as f64,
    }
    .max(1.0);
    let drained = Instant::now();
    while stream.backlog() > 0 && drained.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The phases, the producer paced throughout.
    let producer = run.produce(ctx, &pad, at_rate(rate));
    let mut phases = vec![phase(ctx, c, (&run, &producer), "clean").await];
    let pin = Pin::start(ctx, &run.q, c.pinned_readers).await?;
    phases.push(phase(ctx, c, (&run, &producer), "pinned").await);
    pin.release().await?;
    let clean_max = phases[0].backlog.iter().copied().max().unwrap_or(0);
    let back = (2 * clean_max).max(1);
    let recovered = phase(ctx, c, (&run, &producer), "recovered").await;
    let recovery_s = if recovered.backlog_start <= back {
        Some(0.0)
    } else {
        recovered
            .backlog
            .iter()
            .position(|b| *b <= back)
            .map(|i| (i + 1) as f64)
    };
    phases.push(recovered);
    let (report, peak) = run.finish(ctx, producer).await?;
    Ok(PinnedRun {
        round: at.index,
        warmup: at.warm,
        claim_reads: reads,
        handlers: c.pinned_handlers,
        sleep_ms: c.pinned_sleep_ms,
        clean_unpaced,
        rate_per_s: rate,
        phases,
        recovery_s,
        worker: counters(&report.stats),
        peak_rss_bytes: peak,
    })
}

/// One phase: a window of `c.phase()` of the stream `run` fed by
/// `producer`, and the worker's claim reads in it.
async fn phase(
    ctx: &Ctx,
    c: &PinnedOptions,
    (run, producer): (&StreamRun, &Producer),
    name: &str,
) -> PinnedPhase {
    let reads_before = run.handle.stats();
    let w = run.window(ctx, c.phase(), producer).await;
    let reads_after = run.handle.stats();
    PinnedPhase {
        phase: name.to_owned(),
        produced: Rate::new(w.produced, w.elapsed_s),
        completed: Rate::new(w.completed, w.elapsed_s),
        kept_ratio: w.completed as f64 / w.produced.max(1) as f64,
        backlog_start: w.backlog_start,
        backlog_slope_per_s: slope(&w.backlog),
        backlog: w.backlog,
        claim_ms: crate::stats::percentiles_us_to_ms(&w.claims),
        reads: reads_after.reads - reads_before.reads,
        reads_from_start: reads_after.reads_from_start - reads_before.reads_from_start,
        server: w.server,
    }
}

/// Least-squares slope of one-second samples (0 for fewer than two).
fn slope(samples: &[u64]) -> f64 {
    let points: Vec<(f64, f64)> = samples
        .iter()
        .enumerate()
        .map(|(i, v)| (i as f64, *v as f64))
        .collect();
    crate::stats::least_squares_slope(&points).unwrap_or(0.0)
}

/// What pins the horizon: one session idle in a transaction holding an
/// xid, and readers repeating `REPEATABLE READ` scans of the queue table.
struct Pin {
    holder: tokio_postgres::Client,
    stop: CancellationToken,
    readers: Vec<tokio::task::JoinHandle<Result<()>>>,
}

impl Pin {
    async fn start(ctx: &Ctx, q: &QueueName, readers: u32) -> Result<Pin> {
        let session = || async {
            let (pg, _notifications) = ctx
                .target
                .builder()
                .application_name("pgmq-bench-pin")
                .connect_dedicated()
                .await?;
            Ok::<_, Error>(pg)
        };
        let holder = session().await?;
        holder
            .batch_execute("BEGIN; SELECT pg_catalog.txid_current()")
            .await?;
        let stop = CancellationToken::new();
        let scan = format!("SELECT count(*) FROM {}", q.quoted_table());
        let mut tasks = Vec::new();
        for _ in 0..readers {
            let (pg, stop, scan) = (session().await?, stop.clone(), scan.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.is_cancelled() {
                    pg.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ").await?;
                    pg.batch_execute(&scan).await?;
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                        () = stop.cancelled() => {}
                    }
                    pg.batch_execute("COMMIT").await?;
                }
                Ok(())
            }));
        }
        Ok(Pin {
            holder,
            stop,
            readers: tasks,
        })
    }

    async fn release(self) -> Result<()> {
        self.holder.batch_execute("COMMIT").await?;
        self.stop.cancel();
        for t in self.readers {
            match t.await {
                Ok(r) => r?,
                Err(e) => return Err(Error::Panicked(format!("pinned reader: {e}"))),
            }
        }
        Ok(())
    }
}

/// The figure id of `what` for the run's claim reads.
fn id(r: &PinnedRun, what: &str) -> String {
    format!("{NAME}.{}.{what}", r.claim_reads.name())
}

const DEF_CLEAN: &str = "Completions per second of the unpaced calibration (the producer keeping \
    4,000 queued), over its last three quarters: the rate the paced phases take their share of.";

const DEF_RATE: &str = "Messages whose handler finished within the phase ÷ its seconds, the \
    producer sending at the run's rate.";

const DEF_KEPT: &str = "Messages completed in the phase ÷ messages produced in it (at least 0.95 \
    while pinned: target pinned_keeps_up, on the worker's own claim reads).";

const DEF_SLOPE: &str = "Least-squares slope of the backlog (sent minus completed) sampled each \
    second of the phase: near zero when the worker keeps up.";

const DEF_P99: &str = "99th percentile of the claim latency (enqueued_at to the handler's start) \
    in the phase.";

const DEF_CPU: &str = "CPU of every process of the PostgreSQL cluster over the phase ÷ messages \
    completed (only when the server runs on the bench's host; includes the producer's sends, the \
    pin's readers and autovacuum).";

const DEF_DEAD: &str = "Largest n_dead_tup of the queue table over the phase's one-second samples.";

const DEF_RECOVERY: &str = "Seconds from the pin's release to the first one-second sample with \
    the backlog at most twice the clean phase's largest (0: never above it); a run still above it \
    at the end of its recovered phase counts as the phase's seconds plus one (target \
    pinned_recovery: at most 30 s).";

/// Per claim-reads path: the calibrated rate, per phase its rate, kept
/// ratio, backlog slope, claim p99, server CPU and dead tuples, and the
/// recovery time.
fn add_figures(f: &mut Figures, runs: &[PinnedRun]) {
    let mut paths: Vec<ClaimReadsArg> = Vec::new();
    for r in measured(runs, |r| r.warmup) {
        if !paths.contains(&r.claim_reads) {
            paths.push(r.claim_reads);
        }
    }
    for path in paths {
        let group: Vec<&PinnedRun> = measured(runs, |r| r.warmup)
            .filter(|r| r.claim_reads == path)
            .collect();
        let r0 = group[0];
        let label = format!("Pinned horizon, {} reads", path.name());
        f.rate(
            &id(r0, "clean_unpaced_rate"),
            NAME,
            &format!("{label}, clean unpaced"),
            DEF_CLEAN,
            group.iter().map(|r| (r.round, &r.clean_unpaced)),
        );
        for (i, phase) in ["clean", "pinned", "recovered"].into_iter().enumerate() {
            let of: Vec<(u32, &PinnedPhase)> = group
                .iter()
                .filter_map(|r| r.phases.get(i).map(|p| (r.round, p)))
                .collect();
            f.rate(
                &id(r0, &format!("{phase}.completed_rate")),
                NAME,
                &format!("{label}, {phase}, completed"),
                DEF_RATE,
                of.iter().map(|(round, p)| (*round, &p.completed)),
            );
            type Pick = fn(&PinnedPhase) -> Option<f64>;
            let picks: [(&str, &str, &str, Better, &str, Pick); 5] = [
                ("kept_ratio", "completed ÷ produced", "x", Better::Higher, DEF_KEPT, |p| {
                    Some(p.kept_ratio)
                }),
                ("backlog_slope", "backlog slope", "msg/s", Better::Lower, DEF_SLOPE, |p| {
                    Some(p.backlog_slope_per_s)
                }),
                ("claim_p99_ms", "claim p99", "ms", Better::Lower, DEF_P99, |p| {
                    Some(p.claim_ms.p99)
                }),
                ("server_cpu_us_per_msg", "server CPU per message", "µs/msg", Better::Lower, DEF_CPU, |p| {
                    p.server.cpu_us_per_msg
                }),
                ("dead_tuples_peak", "dead tuples peak", "msg", Better::Lower, DEF_DEAD, |p| {
                    p.server.dead_tuples_peak.map(|v| v as f64)
                }),
            ];
            for (what, name, unit, better, def, pick) in picks {
                let samples = of
                    .iter()
                    .filter_map(|(round, p)| pick(p).map(|v| Sample::value(*round, v)))
                    .collect();
                f.add(
                    id(r0, &format!("{phase}.{what}")),
                    NAME,
                    format!("{label}, {phase}, {name}"),
                    unit,
                    better,
                    def,
                    samples,
                );
            }
        }
        let recovery = group
            .iter()
            .map(|r| {
                let phase_s = r.phases.get(2).map_or(0.0, |p| p.completed.elapsed_s);
                Sample::value(r.round, r.recovery_s.unwrap_or(phase_s.round() + 1.0))
            })
            .collect();
        f.add(
            id(r0, "recovery_s"),
            NAME,
            format!("{label}, recovery"),
            "s",
            Better::Lower,
            DEF_RECOVERY,
            recovery,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_of_a_line_and_of_a_flat_series() {
        assert!((slope(&[10, 20, 30, 40]) - 10.0).abs() < 1e-9);
        assert_eq!(slope(&[5, 5, 5]), 0.0);
        assert_eq!(slope(&[7]), 0.0);
    }
}
