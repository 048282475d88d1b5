//! idle_worker: a worker on an empty queue, polling only (`--idle-poll-ms`,
//! 250 ms by default), no notifications, for `--idle` (3 s by default).
//!
//! The window opens once the worker has run for two poll intervals (start-up
//! excluded). Over it: process CPU time from getrusage(2) (user + system, all
//! threads of this process, which holds nothing else at that moment) divided
//! by wall time, as percent of one core; the worker's own read, empty-read and
//! wake-up counters divided by the same wall time.

use std::time::Instant;

use pgmq_worker::WakeUp;

use crate::document::{IdleRun, Rate};
use crate::error::Result;
use crate::process::cpu_time;
use crate::sections::consume::{worker, Tally};
use crate::sections::Ctx;

/// One idle run.
pub async fn run(ctx: &Ctx, round: u32, warmup: bool) -> Result<IdleRun> {
    let q = ctx.guard.fresh("idle").await?;
    let tally = Tally::new(u64::MAX, ctx.cfg.handler_work);
    let poll = ctx.cfg.idle_poll;
    let w = worker(ctx, &q, 1, &tally)
        .poll_interval(poll)
        .wake_up(WakeUp::Poll)
        .build()?;
    ctx.meter.begin();
    let handle = w.spawn();
    tokio::time::sleep(poll * 2).await;
    let s0 = handle.stats();
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    tokio::time::sleep(ctx.cfg.idle).await;
    let s1 = handle.stats();
    let cpu1 = cpu_time();
    let elapsed = t0.elapsed().as_secs_f64();
    handle.shutdown().await?;
    let peak = ctx.meter.end();
    ctx.guard.release(&q).await?;
    let cpu_s = (cpu1.saturating_sub(cpu0)).as_secs_f64();
    let wakeups = (s1.wakeups_poll + s1.wakeups_notify) - (s0.wakeups_poll + s0.wakeups_notify);
    Ok(IdleRun {
        round,
        warmup,
        poll_interval_ms: poll.as_millis() as u64,
        elapsed_s: elapsed,
        cpu_s,
        cpu_percent: cpu_s / elapsed * 100.0,
        reads: Rate::new(s1.reads - s0.reads, elapsed),
        empty_reads: Rate::new(s1.empty_reads - s0.empty_reads, elapsed),
        wakeups: Rate::new(wakeups, elapsed),
        peak_rss_bytes: peak,
    })
}
