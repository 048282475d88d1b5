//! sustained: producers and the worker together for `--duration`.
//!
//! `--producers` tasks send batches of `--batch-size` through the SDK, paced
//! to `--rate` messages/s in total (open loop: a producer that falls behind
//! sends its missed batches at once) or, with `--rate 0`, as fast as they can.
//! A worker with `--sustained-workers` handlers consumes meanwhile. Every
//! 50 ms the bench samples the queue's backlog (`pgmq.metrics` queue length:
//! visible plus in flight); every second it records the produced and handled
//! counts with the backlog's mean and maximum, the median and 99th
//! percentile of the handler run time (from the worker's statistics) and of
//! the queue wait (`enqueued_at` to handler start, measured in the handler),
//! and the process RSS.
//!
//! Verdict, as in the streams report this section follows: pass when the
//! least-squares slope of the backlog over the window after
//! `--sustained-warmup` is at most 10 messages/s, and, once the producers
//! stop and the worker drains what is left, the distinct ids handled equal
//! the ids produced (none missing). Duplicates (redeliveries) are reported,
//! not failed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::document::{BacklogSample, DbCounters, Interval, Rate, SustainedRun, Verdict};
use crate::error::{Error, Result};
use crate::sections::consume::{worker, QueueWaits, Tally};
use crate::sections::{counters, Ctx};
use crate::stats::{histogram_delta, interval_percentiles_ms, least_squares_fit};

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
    run_at(ctx, ctx.cfg.rate, round, warmup).await
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

/// The database clock minus this host's clock, microseconds: from the
/// `clock_timestamp()` read with the shortest of five round trips, taken as
/// read at that round trip's midpoint (so within half of it).
pub async fn db_clock_offset_us(admin: &tokio_postgres::Client) -> Result<i64> {
    let stmt = admin.prepare("SELECT clock_timestamp()").await?;
    let mut best: Option<(i64, i64)> = None;
    for _ in 0..5 {
        let before = chrono::Utc::now();
        let db: chrono::DateTime<chrono::Utc> = admin.query_one(&stmt, &[]).await?.get(0);
        let after = chrono::Utc::now();
        let rtt = (after - before).num_microseconds().unwrap_or(i64::MAX);
        let mid = before + (after - before) / 2;
        let offset = (db - mid).num_microseconds().unwrap_or(0);
        if best.is_none_or(|(r, _)| rtt < r) {
            best = Some((rtt, offset));
        }
    }
    Ok(best.map_or(0, |(_, o)| o))
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
    let offset_us = db_clock_offset_us(&ctx.admin).await?;
    let tally = Tally::with_waits(u64::MAX, cfg.handler_work, QueueWaits::new(offset_us));
    let w = worker(ctx, &q, cfg.sustained_workers, &tally).build()?;
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
        match p.await {
            Ok(r) => r?,
            Err(e) => return Err(Error::Panicked(format!("producer: {e}"))),
        }
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
