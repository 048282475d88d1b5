//! sustained: producers and the worker together for `--duration`. The
//! producers' pacing, the backlog's samples, the per-second records and the
//! verdict (the backlog's slope and every message handled) are described
//! once, in docs/benchmark-streams.md ("sustained").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use serde::{Deserialize, Serialize};

use crate::document::{
    HandlerKind, IntervalPercentiles, LedgerReport, Percentiles, Rate, Runs, SectionRuns, WorkerCounters,
};
use crate::error::Result;
use crate::kit::stream::{clocked_tally, joined};
use crate::kit::tally::Tally;
use crate::kit::worker::counters;
use crate::kit::Ctx;
use crate::stats::{histogram_delta, interval_percentiles_ms, least_squares_fit};
use std::collections::BTreeMap;
use std::fmt::Write as _;


use crate::checks::Checks;
use crate::document::{Better, Document, Sample, Sections};
use crate::figures::{measured, Figures};
use crate::report::MIB;
use crate::report::{cell, definitions, fig, round_cell};
use crate::report::{fmt_value, thousands};
use crate::sections::{Round, Rounds, Section};
use crate::config::Config;
use crate::sections::plan::Plan;

/// The section's runs in the document.
pub(crate) const RUNS: Runs<SustainedRun> = Runs::new("sustained");

/// A sustained run.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct SustainedRun {
    /// Round.
    pub round: u32,
    /// Warm-up or measured.
    pub warmup: bool,
    /// Producer window, seconds.
    pub duration_s: f64,
    /// Seconds at the start excluded from the slope fit.
    pub warmup_s: f64,
    /// Producer target, messages/s in total (None: unpaced).
    pub target_rate_per_s: Option<f64>,
    /// Producer tasks.
    pub producers: u32,
    /// Handler concurrency.
    pub workers: u32,
    /// Messages per send call.
    pub batch_size: u32,
    /// Messages produced over the producer window.
    pub produced: Rate,
    /// Messages handled over the same window.
    pub handled: Rate,
    /// One record per second.
    pub intervals: Vec<Interval>,
    /// Every backlog sample (one per 50 ms): the points of the slope fit.
    pub backlog_samples: Vec<BacklogSample>,
    /// Least-squares slope of the database backlog over the fit window, messages/s.
    pub backlog_slope_per_s: Option<f64>,
    /// Its standard error (residuals taken as independent), messages/s: the
    /// resolution of this window.
    pub backlog_slope_stderr_per_s: Option<f64>,
    /// Largest backlog sampled.
    pub backlog_max: i64,
    /// Seconds to drain what was left after the producers stopped.
    pub drain_s: f64,
    /// Which messages were handled (after the drain).
    pub ledger: LedgerReport,
    /// Pass when the slope is at most the limit and produced equals handled.
    pub verdict: Verdict,
    /// Worker counters at shutdown.
    pub worker: WorkerCounters,
    /// Peak RSS during the run, bytes.
    pub peak_rss_bytes: u64,
    /// The database's own counters over the run (absent in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_counters: Option<DbCounters>,
    /// With `--rate-search`: the step (0 at `--rate`, each next one
    /// `--rate-step` times faster). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_search_step: Option<u32>,
    /// `empty`, `db-write` or `db-write-tx` (absent in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<HandlerKind>")]
    pub handler: Option<String>,
    /// Handler durations over the whole run (absent in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler_ms: Option<Percentiles>,
    /// Queue wait, database segment, over the whole run (absent in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_wait_db_ms: Option<Percentiles>,
}

/// The database's own counters over a sustained run (None: not readable).
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct DbCounters {
    /// WAL written by the whole cluster over the run (pg_current_wal_lsn
    /// difference), bytes: other databases' activity included.
    pub wal_bytes: Option<u64>,
    /// Checkpoints completed over the run (pg_stat_checkpointer or pg_stat_bgwriter).
    pub checkpoints: Option<u64>,
    /// Autovacuum runs on the queue table (pg_stat_user_tables; the table is new per run).
    pub queue_autovacuum_count: Option<u64>,
    /// Autoanalyze runs on the queue table.
    pub queue_autoanalyze_count: Option<u64>,
    /// Dead tuples of the queue table at the end.
    pub queue_dead_tuples: Option<u64>,
}

/// One second of a sustained run.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Interval {
    /// Seconds since the producers started, at the end of the interval.
    pub t_s: f64,
    /// Produced within the interval.
    pub produced: Rate,
    /// Handled (distinct) within the interval.
    pub handled: Rate,
    /// Mean of the interval's backlog samples.
    pub backlog_mean: f64,
    /// Largest backlog sample of the interval.
    pub backlog_max: i64,
    /// Resident set size of the bench process at the end of the interval
    /// (absent in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Handler run time of the handler calls that ended in the interval, ms
    /// (absent in older documents; null when none ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler_ms: Option<IntervalPercentiles>,
    /// Queue wait of the handler calls that started in the interval, ms:
    /// the message's `enqueued_at` to the handler's start (absent in older
    /// documents; null when none started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_wait_ms: Option<IntervalPercentiles>,
}

/// One backlog sample: `pgmq.metrics` queue length (visible plus in flight).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct BacklogSample {
    /// Seconds since the producers started.
    pub t_s: f64,
    /// Messages in the queue.
    pub backlog: i64,
}

/// A pass/fail with reasons.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Verdict {
    /// Passed.
    pub pass: bool,
    /// The slope limit used, messages/s.
    pub slope_limit_per_s: f64,
    /// Why it failed (empty on pass).
    pub reasons: Vec<String>,
}

/// The largest backlog slope that passes, messages/s.
pub const SLOPE_LIMIT: f64 = 10.0;

/// How often the backlog is sampled: often enough that the backlog's swing
/// (batches arriving, a polling worker draining it in bursts) averages out of
/// the fitted slope instead of aliasing into it.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// Length of one per-interval record.
pub const INTERVAL: Duration = Duration::from_secs(1);

async fn produce(
    ctx: Arc<Ctx>,
    q: pgmq_client::QueueName,
    next_id: Arc<AtomicU64>,
    produced: Arc<AtomicU64>,
    per_producer_rate: Option<f64>,
    stop: CancellationToken,
) -> Result<()> {
    let size = u64::from(ctx.cfg.batch_size);
    let period = per_producer_rate.map(|r| Duration::from_secs_f64(size as f64 / r));
    let mut next = tokio::time::Instant::now();
    let mut bodies = Vec::with_capacity(size as usize);
    while !stop.is_cancelled() {
        if let Some(p) = period {
            next += p;
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = stop.cancelled() => break,
            }
        }
        let first = next_id.fetch_add(size, Ordering::AcqRel);
        bodies.clear();
        bodies.extend((first..first + size).map(|i| ctx.body(i)));
        ctx.client.send_batch(&q, &bodies).await?;
        produced.fetch_add(size, Ordering::AcqRel);
    }
    Ok(())
}

/// One sustained run at `--rate`.
pub async fn run(ctx: &Arc<Ctx>, round: u32, warmup: bool) -> Result<SustainedRun> {
    run_at(ctx, ctx.cfg.sustained_rate(), round, warmup).await
}

/// The database's own counters at one moment.
struct DbSnapshot {
    lsn: String,
    checkpoints: Option<i64>,
}

async fn db_snapshot(ctx: &Ctx) -> Result<DbSnapshot> {
    let lsn: String = ctx
        .admin
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get(0);
    Ok(DbSnapshot {
        lsn,
        checkpoints: checkpoints(ctx).await,
    })
}

/// Checkpoints since the statistics reset: pg_stat_checkpointer
/// (PostgreSQL 17+), else pg_stat_bgwriter; None when neither is readable.
async fn checkpoints(ctx: &Ctx) -> Option<i64> {
    for sql in [
        "SELECT (num_timed + num_requested)::int8 FROM pg_stat_checkpointer",
        "SELECT (checkpoints_timed + checkpoints_req)::int8 FROM pg_stat_bgwriter",
    ] {
        if let Ok(row) = ctx.admin.query_one(sql, &[]).await {
            return row.try_get(0).ok();
        }
    }
    None
}

async fn db_counters(ctx: &Ctx, before: &DbSnapshot, q: &pgmq_client::QueueName) -> DbCounters {
    let wal_bytes = ctx
        .admin
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::float8",
            &[&before.lsn],
        )
        .await
        .ok()
        .and_then(|r| r.try_get::<_, f64>(0).ok())
        .map(|v| v.max(0.0) as u64);
    let checkpoints = match (before.checkpoints, checkpoints(ctx).await) {
        (Some(a), Some(b)) => Some((b - a).max(0) as u64),
        _ => None,
    };
    let table = ctx
        .admin
        .query_opt(
            "SELECT coalesce(autovacuum_count, 0)::int8, coalesce(autoanalyze_count, 0)::int8, \
             coalesce(n_dead_tup, 0)::int8 FROM pg_stat_user_tables \
             WHERE schemaname = 'pgmq' AND relname = $1",
            &[&format!("q_{}", q.as_str())],
        )
        .await
        .ok()
        .flatten();
    let get = |i: usize| {
        table
            .as_ref()
            .and_then(|r| r.try_get::<_, i64>(i).ok())
            .map(|v| v.max(0) as u64)
    };
    DbCounters {
        wal_bytes,
        checkpoints,
        queue_autovacuum_count: get(0),
        queue_autoanalyze_count: get(1),
        queue_dead_tuples: get(2),
    }
}

/// One sustained run at `rate` (None: unpaced).
pub async fn run_at(
    ctx: &Arc<Ctx>,
    rate: Option<f64>,
    round: u32,
    warmup: bool,
) -> Result<SustainedRun> {
    let cfg = &ctx.cfg;
    let q = ctx.guard.fresh("sustained").await?;
    let before = db_snapshot(ctx).await?;
    let tally = clocked_tally(ctx, cfg.handler_work()).await?;
    let w = ctx.worker(&ctx.worker_spec(&q, cfg.sustained_workers), &tally)?;
    let produced = Arc::new(AtomicU64::new(0));
    let stop = CancellationToken::new();
    ctx.meter.begin();
    let handle = w.spawn();
    let start = Instant::now();
    let per_producer = rate.map(|r| r / f64::from(cfg.producers));
    let producers = spawn_producers(ctx, &q, &produced, per_producer, &stop);

    let (intervals, samples) =
        sample(ctx, &q, &handle, &tally, &produced, &producers, start).await?;
    stop.cancel();
    join_producers(producers).await?;
    let window = start.elapsed();
    let produced_total = produced.load(Ordering::Acquire);
    let handled_in_window = tally.distinct();
    let drain_s = drain(&tally, produced_total, cfg.stall_timeout).await;
    let report = handle.shutdown().await?;
    let peak = ctx.meter.end();
    // The statistics collector publishes table counters about once a second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let db = db_counters(ctx, &before, &q).await;
    ctx.guard.release(&q).await?;

    let measured = Measured {
        window,
        produced_total,
        handled_in_window,
        intervals,
        samples,
        drain_s,
        report,
        peak,
        db,
    };
    Ok(sustained_run(cfg, rate, round, warmup, measured, &tally))
}

/// Starts `--producers` tasks sending into `q` at `per_producer` messages/s
/// each (None: unpaced), numbering their messages from 0 and counting them
/// in `produced`, until `stop`.
fn spawn_producers(
    ctx: &Arc<Ctx>,
    q: &pgmq_client::QueueName,
    produced: &Arc<AtomicU64>,
    per_producer: Option<f64>,
    stop: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<Result<()>>> {
    let next_id = Arc::new(AtomicU64::new(0));
    (0..ctx.cfg.producers)
        .map(|_| {
            tokio::spawn(produce(
                ctx.clone(),
                q.clone(),
                next_id.clone(),
                produced.clone(),
                per_producer,
                stop.clone(),
            ))
        })
        .collect()
}

/// Lets the worker handle what is left once the producers stopped: waits
/// until every one of the `produced_total` ids was handled (or the stall
/// timeout); the seconds it took.
async fn drain(tally: &Tally, produced_total: u64, stall_timeout: Duration) -> f64 {
    // The run is complete once every produced id was handled.
    let drain_start = Instant::now();
    tally.target.store(produced_total, Ordering::Release);
    tally.check(tally.distinct());
    tally.wait(stall_timeout).await;
    drain_start.elapsed().as_secs_f64()
}

/// What one sustained run measured, before the verdict.
struct Measured {
    /// From the worker's start to the producers' end.
    window: Duration,
    produced_total: u64,
    /// Distinct ids handled within the window (before the drain).
    handled_in_window: u64,
    intervals: Vec<Interval>,
    samples: Vec<BacklogSample>,
    drain_s: f64,
    report: pgmq_worker::ShutdownReport,
    peak: u64,
    db: DbCounters,
}

/// The run's record: its settings, what it measured, the backlog slope
/// and the verdict on it and on the ledger.
fn sustained_run(
    cfg: &crate::config::Config,
    rate: Option<f64>,
    round: u32,
    warmup: bool,
    m: Measured,
    tally: &Tally,
) -> SustainedRun {
    let (slope, stderr) = backlog_slope(&m.samples, cfg.sustained_warmup);
    let ledger = tally.ledger.report(m.produced_total);
    let reasons = failure_reasons(slope, stderr, m.produced_total, &ledger);
    let window = m.window;
    SustainedRun {
        round,
        warmup,
        duration_s: window.as_secs_f64(),
        warmup_s: cfg.sustained_warmup.as_secs_f64(),
        target_rate_per_s: rate,
        producers: cfg.producers,
        workers: cfg.sustained_workers,
        batch_size: cfg.batch_size,
        produced: Rate::new(m.produced_total, window.as_secs_f64()),
        handled: Rate::new(m.handled_in_window, window.as_secs_f64()),
        backlog_max: m.samples.iter().map(|s| s.backlog).max().unwrap_or(0),
        intervals: m.intervals,
        backlog_samples: m.samples,
        backlog_slope_per_s: slope,
        backlog_slope_stderr_per_s: stderr,
        drain_s: m.drain_s,
        verdict: Verdict {
            pass: reasons.is_empty(),
            slope_limit_per_s: SLOPE_LIMIT,
            reasons,
        },
        ledger,
        worker: counters(&m.report.stats),
        peak_rss_bytes: m.peak,
        db_counters: Some(m.db),
        rate_search_step: None,
        handler: Some(cfg.handler.name().to_owned()),
        handler_ms: Some(crate::stats::percentiles_us_to_ms(
            &m.report.stats.handler_latency,
        )),
        queue_wait_db_ms: Some(crate::stats::percentiles_us_to_ms(
            &m.report.stats.queue_wait_db,
        )),
    }
}

/// Samples the backlog every [`SAMPLE_EVERY`] and records an [`Interval`]
/// every [`INTERVAL`], until `--duration` has passed or a producer ended.
async fn sample(
    ctx: &Ctx,
    q: &pgmq_client::QueueName,
    handle: &pgmq_worker::WorkerHandle,
    tally: &Tally,
    produced: &AtomicU64,
    producers: &[tokio::task::JoinHandle<Result<()>>],
    start: Instant,
) -> Result<(Vec<Interval>, Vec<BacklogSample>)> {
    let mut intervals = Vec::new();
    let mut samples = Vec::new();
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + SAMPLE_EVERY, SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut last_p, mut last_h, mut last_t) = (0u64, 0u64, 0.0f64);
    let (mut sum, mut n, mut max) = (0i64, 0u32, 0i64);
    let mut last_handler = handle.stats().handler_latency;
    loop {
        tick.tick().await;
        let backlog = ctx.queue_length(q).await?;
        let t = start.elapsed().as_secs_f64();
        samples.push(BacklogSample { t_s: t, backlog });
        (sum, n, max) = (sum + backlog, n + 1, max.max(backlog));
        // A producer that ends before the stop ended with an error (joined below).
        let end = start.elapsed() >= ctx.cfg.duration || producers.iter().any(|p| p.is_finished());
        if t - last_t >= INTERVAL.as_secs_f64() || end {
            let p = produced.load(Ordering::Acquire);
            let h = tally.distinct();
            let handler_now = handle.stats().handler_latency;
            let handler = histogram_delta(&handler_now, &last_handler);
            last_handler = handler_now;
            let waits = tally.waits.as_ref().map(|w| w.take());
            intervals.push(Interval {
                t_s: t,
                produced: Rate::new(p - last_p, t - last_t),
                handled: Rate::new(h.saturating_sub(last_h), t - last_t),
                backlog_mean: sum as f64 / f64::from(n),
                backlog_max: max,
                rss_bytes: crate::process::current_rss(),
                handler_ms: interval_percentiles_ms(&handler),
                queue_wait_ms: waits.as_ref().and_then(interval_percentiles_ms),
            });
            (last_p, last_h, last_t) = (p, h, t);
            (sum, n, max) = (0, 0, 0);
        }
        if end {
            return Ok((intervals, samples));
        }
    }
}

/// Waits for every producer; the first error (or panic) fails the run.
async fn join_producers(producers: Vec<tokio::task::JoinHandle<Result<()>>>) -> Result<()> {
    for p in producers {
        joined(p.await)?;
    }
    Ok(())
}

/// The least-squares slope of the backlog after the warm-up, and its
/// standard error (None: too few samples to fit).
fn backlog_slope(samples: &[BacklogSample], warmup: Duration) -> (Option<f64>, Option<f64>) {
    let fit: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.t_s > warmup.as_secs_f64())
        .map(|s| (s.t_s, s.backlog as f64))
        .collect();
    match least_squares_fit(&fit) {
        Some((s, e)) => (Some(s), Some(e)),
        None => (None, None),
    }
}

/// Why the run fails the verdict (empty: it passes).
fn failure_reasons(
    slope: Option<f64>,
    stderr: Option<f64>,
    produced_total: u64,
    ledger: &crate::document::LedgerReport,
) -> Vec<String> {
    let mut reasons = Vec::new();
    match slope {
        Some(s) if s > SLOPE_LIMIT => reasons.push(format!(
            "backlog slope {s:.1} ± {:.1} msg/s exceeds the {SLOPE_LIMIT} msg/s limit",
            stderr.unwrap_or(f64::NAN)
        )),
        None => reasons.push("too few backlog samples after the warm-up to fit a slope".into()),
        _ => {}
    }
    if ledger.distinct != produced_total || ledger.missing > 0 {
        reasons.push(format!(
            "produced {produced_total} but handled {} distinct ({} missing)",
            ledger.distinct, ledger.missing
        ));
    }
    reasons
}

/// The sustained section: producers and the worker together for
/// `--duration` (with `--rate-search`, at rising rates until a step fails).
pub(crate) struct Sustained;

impl Rounds for Sustained {
    /// One run at `--rate`, or with `--rate-search` a run per step.
    async fn run_round(&self, ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
        if ctx.cfg.rate_search {
            sustained_rate_search(ctx, at, s).await
        } else {
            sustained_once(ctx, at, s).await
        }
    }
}

impl Section for Sustained {
    fn runs(&self) -> &dyn SectionRuns {
        &RUNS
    }

    fn about(&self) -> &'static str {
        "Producers and the worker together for `--duration`"
    }

    fn planned(&self, cfg: &Config) -> Plan {
        // A rate search runs at most --rate-steps-max windows.
        let windows = f64::from(if cfg.rate_search { cfg.rate_steps_max } else { 1 });
        Plan::fixed(windows * cfg.duration.as_secs_f64()) + Plan::work(windows * 1.5)
    }

    fn check(&self, s: &Sections, out: &mut Checks) {
        out.each(&RUNS, s, |r| ("", r.round, r.warmup), |out, tag, r| {
            if let Some(se) = r.backlog_slope_stderr_per_s {
                if se > r.verdict.slope_limit_per_s / 2.0 {
                    out.warn(format!(
                        "{tag}: the backlog slope's standard error is {se:.1} msg/s, too coarse to judge the \
                         {} msg/s limit; use a longer --duration",
                        r.verdict.slope_limit_per_s
                    ));
                }
            }
            if r.rate_search_step.is_some() {
                // A rate search ends on a failing step by design: only messages
                // not accounted for fail the run.
                if r.ledger.missing > 0 {
                    out.fail(format!(
                        "{tag} (rate search step): {} messages never handled",
                        r.ledger.missing
                    ));
                }
            } else if !r.verdict.pass {
                out.fail(format!("{tag}: {}", r.verdict.reasons.join("; ")));
            }
            out.ledger(tag, &r.ledger);
            out.counters(tag, &r.worker);
        });
    }

    /// sustained: the rate search, the rates, the backlog slope and maximum.
    fn figures(&self, s: &Sections, f: &mut Figures) {
        let all = RUNS.list(s);
        let sus = || measured(&all, |r| r.warmup || r.rate_search_step.is_some());
        // The rate search: per round, the highest target rate whose verdict passed.
        let mut best: BTreeMap<u32, f64> = BTreeMap::new();
        for r in measured(&RUNS.list(s), |r| r.warmup).filter(|r| r.rate_search_step.is_some()) {
            let e = best.entry(r.round).or_insert(0.0);
            if r.verdict.pass {
                *e = e.max(r.target_rate_per_s.unwrap_or(0.0));
            }
        }
        f.add(
            "sustained.rate_search.highest_passing".into(),
            "sustained",
            "Highest sustained producer rate that passed".into(),
            "msg/s",
            Better::Higher,
            DEF_SUS_SEARCH,
            best.into_iter()
                .map(|(round, v)| Sample::value(round, v))
                .collect(),
        );
        f.rate(
            "sustained.produced_rate",
            "sustained",
            "Sustained produced",
            DEF_SUS_PROD,
            sus().map(|r| (r.round, &r.produced)),
        );
        f.rate(
            "sustained.handled_rate",
            "sustained",
            "Sustained handled",
            DEF_SUS_HAND,
            sus().map(|r| (r.round, &r.handled)),
        );
        f.add(
            "sustained.backlog_slope".into(),
            "sustained",
            "Sustained backlog slope".into(),
            "msg/s",
            Better::None,
            DEF_SUS_SLOPE,
            sus()
                .filter_map(|r| r.backlog_slope_per_s.map(|v| Sample::value(r.round, v)))
                .collect(),
        );
        f.add(
            "sustained.backlog_max".into(),
            "sustained",
            "Sustained largest backlog".into(),
            "msg",
            Better::Lower,
            DEF_SUS_MAX,
            sus()
                .map(|r| Sample::value(r.round, r.backlog_max as f64))
                .collect(),
        );
    }

    /// sustained: each run's rates, slope and verdict, its intervals, the
    /// database's counters and the rate search's result.
    fn report(&self, d: &Document, out: &mut String) {
        if RUNS.list(&d.sections).is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "## Sustained\n\n| Round | Duration (s) | Target rate | Produced/s | Handled/s | Backlog slope ± std. error (msg/s) | \
             Largest backlog | Produced = handled | Verdict |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        );
        for r in &RUNS.list(&d.sections) {
            let _ = writeln!(
                out,
                "| {} | {:.1} | {} | {} | {} | {} | {} | {} | {} |",
                sustained_round(r),
                r.duration_s,
                r.target_rate_per_s
                    .map_or("unpaced".to_owned(), |v| format!("{} msg/s", thousands(v))),
                thousands(r.produced.rate_per_s),
                thousands(r.handled.rate_per_s),
                match (r.backlog_slope_per_s, r.backlog_slope_stderr_per_s) {
                    (Some(v), Some(se)) => format!("{v:+.2} ± {se:.2}"),
                    (Some(v), None) => format!("{v:+.2}"),
                    _ => "n/a".to_owned(),
                },
                thousands(r.backlog_max as f64),
                if r.ledger.distinct == r.produced.count && r.ledger.missing == 0 {
                    format!("yes ({})", thousands(r.produced.count as f64))
                } else {
                    format!(
                        "NO ({} produced, {} handled)",
                        r.produced.count, r.ledger.distinct
                    )
                },
                if r.verdict.pass { "pass" } else { "FAIL" }
            );
        }
        out.push('\n');
        rate_search(out, d);
        sustained_intervals(out, d);
        db_counters_table(out, d);
        definitions(
            out,
            d,
            &[
                "sustained.produced_rate".into(),
                "sustained.handled_rate".into(),
                "sustained.backlog_slope".into(),
                "sustained.rate_search.highest_passing".into(),
            ],
        );
    }
}

/// One round of sustained without `--rate-search`: one run at `--rate`.
async fn sustained_once(ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
    let tag = at.tag;
    let r = run(ctx, at.index, at.warm).await?;
    ctx.progress.say(format!(
        "{tag} sustained: {:.0} produced/s, {:.0} handled/s, slope {:.1}, {}",
        r.produced.rate_per_s,
        r.handled.rate_per_s,
        r.backlog_slope_per_s.unwrap_or(f64::NAN),
        if r.verdict.pass { "pass" } else { "FAIL" }
    ));
    RUNS.record(s, &r)?;
    Ok(())
}

/// One round of sustained with `--rate-search`: a run per step, recorded
/// in `s`.
async fn sustained_rate_search(ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
    let tag = at.tag;
    let cfg = &ctx.cfg;
    // Step the rate up until the slope verdict fails.
    let base = cfg.sustained_rate().unwrap_or(1.0);
    for k in 0..cfg.rate_steps_max {
        let rate = base * cfg.rate_step.powi(k as i32);
        let mut r = run_at(ctx, Some(rate), at.index, at.warm).await?;
        r.rate_search_step = Some(k);
        let pass = r.verdict.pass;
        ctx.progress.say(format!(
            "{tag} sustained rate search step {k}: {rate:.0} msg/s target, {:.0} handled/s, slope {:.1}, {}",
            r.handled.rate_per_s,
            r.backlog_slope_per_s.unwrap_or(f64::NAN),
            if pass { "pass" } else { "fail: search ends" }
        ));
        RUNS.record(s, &r)?;
        if !pass {
            break;
        }
    }
    Ok(())
}

const DEF_SUS_PROD: &str =
    "Messages the producers sent over the producer window, divided by its seconds.";

const DEF_SUS_HAND: &str =
    "Distinct messages handled over the producer window, divided by its seconds \
    (messages left at the end are drained afterwards, outside the window).";

const DEF_SUS_SLOPE: &str =
    "Least-squares slope of the sampled backlog (pgmq.metrics queue length, in flight \
    included) after the sustained warm-up: at most 10 msg/s passes.";

const DEF_SUS_SEARCH: &str = "--rate-search: sustained runs at --rate, then each --rate-step times faster, \
    until a run's verdict fails (backlog slope above 10 msg/s, or a message not handled): the highest target \
    rate whose run passed (0 when the first failed). The resolution is the step factor.";

const DEF_SUS_MAX: &str = "Largest backlog sampled (every 50 ms).";

/// Per run, what its one-second intervals recorded: the median interval
/// and the worst one, so a stall or a creeping RSS shows without printing
/// every second (the document has them all).
fn sustained_intervals(out: &mut String, d: &Document) {
    let all = RUNS.list(&d.sections);
    let runs: Vec<_> = all
        .iter()
        .filter(|r| {
            r.intervals
                .iter()
                .any(|i| i.handler_ms.is_some() || i.rss_bytes.is_some())
        })
        .collect();
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "Per one-second interval (median over the run's intervals / worst interval):\n\n\
         | Round | Intervals | Handler p50 (ms) | Handler p99 (ms) | Queue wait p50 (ms) | Queue wait p99 (ms) | RSS first → last (largest), MiB |\n\
         | --- | --- | --- | --- | --- | --- | --- |"
    );
    let both = |vals: Vec<f64>| match crate::stats::median_min_max(&vals) {
        Some((med, _, max)) => format!("{} / {}", fmt_value(med, "ms"), fmt_value(max, "ms")),
        None => "–".to_owned(),
    };
    for r in runs {
        let iv = &r.intervals;
        let pick = |f: &dyn Fn(&Interval) -> Option<f64>| {
            both(iv.iter().filter_map(f).collect())
        };
        let rss: Vec<u64> = iv.iter().filter_map(|i| i.rss_bytes).collect();
        let rss = match (rss.first(), rss.last(), rss.iter().max()) {
            (Some(a), Some(b), Some(m)) => format!(
                "{:.1} → {:.1} ({:.1})",
                *a as f64 / MIB,
                *b as f64 / MIB,
                *m as f64 / MIB
            ),
            _ => "–".to_owned(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {rss} |",
            sustained_round(r),
            iv.len(),
            pick(&|i| i.handler_ms.map(|p| p.p50)),
            pick(&|i| i.handler_ms.map(|p| p.p99)),
            pick(&|i| i.queue_wait_ms.map(|p| p.p50)),
            pick(&|i| i.queue_wait_ms.map(|p| p.p99)),
        );
    }
    let _ = writeln!(
        out,
        "\n- *Handler p50/p99 per interval*: handler run time (start to end of the handler call, as the worker \
         measures it) of the calls recorded in that second.\n\
         - *Queue wait p50/p99 per interval*: the message's `enqueued_at` (database clock) to the start of its \
         handler call (this host's clock, moved onto the database's by an offset measured before the run), of \
         the calls that started in that second.\n\
         - *RSS*: the bench process's resident set size at the end of each interval.\n"
    );
}

/// A sustained run's round, flagged when a warm-up or a rate-search step.
fn sustained_round(r: &SustainedRun) -> String {
    let mut s = round_cell(r.round, r.warmup);
    if let Some(k) = r.rate_search_step {
        let _ = write!(s, " (search step {k})");
    }
    s
}

/// The rate search's highest passing producer rate, when it ran.
fn rate_search(out: &mut String, d: &Document) {
    let id = "sustained.rate_search.highest_passing";
    if fig(d, id).is_none() {
        return;
    }
    let settings = d
        .metadata
        .workload
        .rate_search
        .as_ref()
        .map_or(String::new(), |s| {
            format!(
                " (steps {}× apart, at most {})",
                fmt_value(s.step, "x"),
                s.steps_max
            )
        });
    let _ = writeln!(
        out,
        "Rate search{settings}: highest producer rate that passed {} msg/s.\n",
        cell(d, id)
    );
}

/// The database's own counters over each sustained run that read them.
fn db_counters_table(out: &mut String, d: &Document) {
    let all = RUNS.list(&d.sections);
    let runs: Vec<_> = all
        .iter()
        .filter_map(|r| r.db_counters.as_ref().map(|c| (r, c)))
        .collect();
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "Database counters over each run:\n\n\
         | Round | WAL written (MiB) | Checkpoints | Queue autovacuums | Queue autoanalyzes | Queue dead tuples at end |\n\
         | --- | --- | --- | --- | --- | --- |"
    );
    let n = |v: Option<u64>| v.map_or("–".to_owned(), |v| thousands(v as f64));
    for (r, c) in runs {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            sustained_round(r),
            c.wal_bytes
                .map_or("–".to_owned(), |b| format!("{:.1}", b as f64 / MIB)),
            n(c.checkpoints),
            n(c.queue_autovacuum_count),
            n(c.queue_autoanalyze_count),
            n(c.queue_dead_tuples)
        );
    }
    let _ = writeln!(
        out,
        "\n- *WAL written*: the whole cluster's (other databases' activity included), from the difference of \
         `pg_current_wal_lsn()`.\n\
         - *Queue autovacuums, autoanalyzes, dead tuples*: `pg_stat_user_tables` of the run's queue table (a new \
         table per run).\n"
    );
}
