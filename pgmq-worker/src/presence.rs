//! The worker's presence record: every interval the worker writes a row of
//! `pgmq_sdk.workers` ([`Pgmq::report_presence`]) with where it runs, what
//! it serves, its counts and rates over the interval, whether it is paused
//! or under a fleet limit; the operator console's fleet page lists them. A
//! worker stopping writes its row once more, marked stopped.
//!
//! Optional: off unless [`WorkerBuilder::presence`](crate::WorkerBuilder::presence)
//! sets an interval. Nothing else depends on it: a failed write (no
//! `pgmq_sdk` schema of version 4, no grant) is logged once and retried at
//! the next interval, and the worker goes on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgmq_client::{Pgmq, QueueName, WorkerPresence};
use tokio_util::sync::CancellationToken;

use crate::db::{self, Source};
use crate::pause::Paused;
use crate::stats::Stats;
use crate::supervise::Supervisor;

/// What the presence task reads.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub queue: QueueName,
    pub interval: Duration,
    pub db_timeout: Duration,
    pub concurrency: usize,
    pub limited: bool,
}

/// The presence task: its settings and the handles it reads.
pub(crate) struct Presence {
    pub settings: Settings,
    pub source: Source,
    pub stats: Arc<Stats>,
    pub paused: Arc<Paused>,
}

/// This host's name, as the kernel has it (else `$HOSTNAME`, else
/// "unknown").
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Starts the supervised presence task; it runs until `stop`, then writes
/// the record once more, marked stopped.
pub(crate) fn spawn(part: Presence, supervisor: &Supervisor, stop: &CancellationToken) {
    static WORKERS: AtomicU64 = AtomicU64::new(0);
    let host = host_name();
    let pid = std::process::id();
    let n = WORKERS.fetch_add(1, Ordering::Relaxed);
    let id = format!("{host}:{pid}:{}:{n}", part.settings.queue);
    let mut record = WorkerPresence::new(&id, part.settings.queue.as_str(), &host, pid as i32);
    record.concurrency = i32::try_from(part.settings.concurrency).unwrap_or(i32::MAX);
    record.limited = part.settings.limited;
    let (part, stop) = (Arc::new(part), stop.clone());
    let record = Arc::new(tokio::sync::Mutex::new(record));
    supervisor.spawn("presence", move || {
        run(Arc::clone(&part), Arc::clone(&record), stop.clone())
    });
}

/// The counts the record carries: claimed, acknowledged, failed.
fn counts(stats: &Stats) -> (u64, u64, u64) {
    let c = &stats.c;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    (
        get(&c.claimed),
        get(&c.deleted) + get(&c.archived) + get(&c.dead_lettered),
        get(&c.failed),
    )
}

async fn run(
    part: Arc<Presence>,
    record: Arc<tokio::sync::Mutex<WorkerPresence>>,
    stop: CancellationToken,
) {
    let cfg = &part.settings;
    let mut record = record.lock().await;
    let mut last = (Instant::now(), counts(&part.stats));
    let mut warned = false;
    loop {
        let stopping = tokio::select! {
            biased;
            _ = stop.cancelled() => true,
            _ = tokio::time::sleep(cfg.interval) => false,
        };
        let now = (Instant::now(), counts(&part.stats));
        let secs = now.0.duration_since(last.0).as_secs_f64().max(1e-3);
        let ((_, (c0, a0, _)), (_, (c1, a1, f1))) = (last, now);
        record.claimed = c1 as i64;
        record.acked = a1 as i64;
        record.failed = f1 as i64;
        record.claims_per_sec = c1.saturating_sub(c0) as f64 / secs;
        record.acks_per_sec = a1.saturating_sub(a0) as f64 / secs;
        record.paused = part.paused.is_paused();
        last = now;
        let once = db::Kept::new(part.source.clone(), 0, cfg.db_timeout);
        match Pgmq::on(&once).report_presence(&record, stopping).await {
            Ok(()) => warned = false,
            Err(e) if !warned => {
                warned = true;
                tracing::warn!(queue = %cfg.queue, error = %e, "presence record not written; retrying every interval");
            }
            Err(e) => tracing::debug!(error = %e, "presence record not written"),
        }
        if stopping {
            return;
        }
    }
}
