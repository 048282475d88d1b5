//! Draining a queue: an in-process worker timed until its tally reaches
//! its target (or stalls), a fresh preloaded queue drained that way, and a
//! worker process's wait until its queue is empty.

use std::time::{Duration, Instant};

use pgmq_client::QueueName;
use pgmq_worker::{ShutdownReport, Worker};

use crate::document::{ConsumeRun, Rate};
use crate::error::Result;
use crate::kit::body::InBody;
use crate::kit::tally::Tally;
use crate::kit::worker::counters;
use crate::kit::Ctx;
use crate::stats::percentiles_us_to_ms;

/// What a timed drain saw.
pub(crate) struct Drained {
    /// The worker's report at shutdown.
    pub(crate) report: ShutdownReport,
    /// Seconds from spawning the worker to the end of the handler that
    /// completed the tally's target (to the end of the shutdown when it
    /// stalled).
    pub(crate) elapsed_s: f64,
    /// Seconds of the shutdown after that (the acknowledgements drained).
    pub(crate) ack_drain_s: f64,
    /// Peak RSS from spawning to the end of the shutdown, bytes.
    pub(crate) peak_rss_bytes: u64,
}

/// Spawns `w`, waits until `tally` reaches its target or nothing new is
/// handled for `--stall-timeout`, and shuts the worker down. The clock
/// runs from just before the spawn to the end of the handler that
/// completed the target; the shutdown that follows is timed apart.
pub(crate) async fn timed(ctx: &Ctx, w: Worker<InBody>, tally: &Tally) -> Result<Drained> {
    ctx.meter.begin();
    let start = Instant::now();
    let handle = w.spawn();
    tally.wait(ctx.cfg.stall_timeout).await;
    let completed = tally.completed_at.get().copied();
    let report = handle.shutdown().await?;
    let shut = Instant::now();
    let peak_rss_bytes = ctx.meter.end();
    let end = completed.unwrap_or(shut);
    Ok(Drained {
        report,
        elapsed_s: end.duration_since(start).as_secs_f64(),
        ack_drain_s: shut.duration_since(end).as_secs_f64(),
        peak_rss_bytes,
    })
}

/// A worker of the run's settings with `workers` handlers draining a
/// fresh, vacuumed queue of `n` messages (queue `pgmq_bench_<suffix>`).
pub(crate) async fn drain(
    ctx: &Ctx,
    suffix: &str,
    n: u64,
    workers: u32,
    round: u32,
    warmup: bool,
) -> Result<ConsumeRun> {
    let (q, preload_s, vacuum_s) = ctx.fresh_loaded(suffix, n).await?;
    let tally = Tally::new(n, ctx.cfg.handler_work());
    let w = ctx.worker(&ctx.worker_spec(&q, workers), &tally)?;
    let d = timed(ctx, w, &tally).await?;
    let stats = &d.report.stats;
    let remaining_after = ctx.finish_queue(&q).await?;
    Ok(ConsumeRun {
        round,
        warmup,
        workers,
        rate: Rate::new(tally.distinct(), d.elapsed_s),
        handler_work_ms: ctx.cfg.handler_work_ms,
        handler_ms: percentiles_us_to_ms(&stats.handler_latency),
        queue_wait_db_ms: percentiles_us_to_ms(&stats.queue_wait_db),
        queue_wait_local_ms: percentiles_us_to_ms(&stats.queue_wait_local),
        ack_drain_s: d.ack_drain_s,
        remaining_after,
        ledger: tally.ledger.report(n),
        worker: counters(stats),
        preload_s,
        vacuum_s,
        peak_rss_bytes: d.peak_rss_bytes,
        handler: Some(ctx.cfg.handler.name().to_owned()),
    })
}

/// Looks every 20 ms until `q` is empty (in flight included) or nothing was
/// handled for `stall`; true when it stopped on the stall.
///
/// It asks the database only once its handlers finished nothing for
/// [`QUIET`], and then at most once per [`QUIET`]: `pgmq.metrics` counts the
/// whole queue table (a scan of every page, dead ones included), and such a
/// probe per process every tick would load the database in proportion to
/// the number of processes, the very thing worker_processes measures. A
/// process still handling messages is not done, and its clock stops at its
/// last handler's end, so a probe made later costs the figures nothing.
pub(crate) async fn until_empty(
    client: &pgmq_client::Client,
    q: &QueueName,
    tally: &Tally,
    stall: Duration,
) -> Result<bool> {
    let (mut last, mut last_change) = (0u64, Instant::now());
    let mut last_probe = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = tally.ledger.handled();
        if now != last {
            (last, last_change) = (now, Instant::now());
            continue;
        }
        if last_change.elapsed() < QUIET || last_probe.elapsed() < QUIET {
            continue;
        }
        last_probe = Instant::now();
        if client.metrics(q).await?.queue_length == 0 {
            return Ok(false);
        }
        if last_change.elapsed() >= stall {
            return Ok(true);
        }
    }
}

/// How long a process's handlers must be quiet before it asks whether the
/// queue is empty, and how often it asks while they stay quiet.
const QUIET: Duration = Duration::from_millis(100);
