//! The worker's figures through the [`metrics`] facade (feature `metrics`).
//!
//! Every `metrics_interval` a task publishes the counters and gauges,
//! labelled with `queue`, and the handler loops record the per-message
//! histograms on handles made once. The names are listed in
//! docs/metrics.md of this package, which the crate docs include and
//! tests/metrics.rs checks against what a run publishes.

use std::sync::Arc;

use metrics::{counter, gauge, Counter, Histogram};
use tokio_util::sync::CancellationToken;

use crate::claim_queue::{ClaimQueue, Claimed};
use crate::db::Source;
use crate::health::HealthState;
use crate::lease::Leases;
use crate::stats::{Stats, StatsSnapshot};
use crate::supervise::Supervisor;

/// What the publisher reads.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub queue: pgmq_client::QueueName,
    /// `metrics_interval`.
    pub interval: std::time::Duration,
    pub db_timeout: std::time::Duration,
}

/// The publisher: its settings and the handles it reads.
pub(crate) struct Metrics {
    pub settings: Settings,
    pub source: Source,
    pub stats: Arc<Stats>,
    pub leases: Arc<Leases>,
    pub health: Arc<HealthState>,
    pub queue: Arc<ClaimQueue<Claimed>>,
}

/// Starts the supervised publisher; it runs until `stop`.
pub(crate) fn spawn(part: Metrics, supervisor: &Supervisor, stop: &CancellationToken) {
    let (part, stop) = (Arc::new(part), stop.clone());
    supervisor.spawn("metrics", move || run(Arc::clone(&part), stop.clone()));
}

/// Per-message histograms of one handler loop, made once.
pub(crate) struct LoopMetrics {
    pub handler: Histogram,
    pub wait: Histogram,
}

impl LoopMetrics {
    pub(crate) fn new(queue: &str) -> Self {
        LoopMetrics {
            handler: metrics::histogram!("pgmq_worker_handler_seconds", "queue" => queue.to_owned()),
            wait: metrics::histogram!("pgmq_worker_queue_wait_seconds", "queue" => queue.to_owned()),
        }
    }
}

/// Publishes the snapshot, the gauges and the queue's own metrics every
/// `metrics_interval`, until `stop`.
async fn run(part: Arc<Metrics>, stop: CancellationToken) {
    let cfg = &part.settings;
    let queue = &part.queue;
    let q = cfg.queue.as_str().to_owned();
    let counter_of = |name: &str| -> Counter {
        counter!(format!("pgmq_worker_{name}_total"), "queue" => q.clone())
    };
    let counters: Vec<Counter> = counter_values(&part.stats.snapshot())
        .iter()
        .map(|(name, _)| counter_of(name))
        .collect();
    let depth = gauge!("pgmq_worker_claim_queue_depth", "queue" => q.clone());
    let running = gauge!("pgmq_worker_running_handlers", "queue" => q.clone());
    let pending = gauge!("pgmq_worker_acks_pending", "queue" => q.clone());
    let healthy = gauge!("pgmq_worker_healthy", "queue" => q.clone());
    let paused = gauge!("pgmq_worker_paused", "queue" => q.clone());
    let unreadable = gauge!("pgmq_worker_pause_flag_unreadable", "queue" => q.clone());
    let length = gauge!("pgmq_queue_length", "queue" => q.clone());
    let visible = gauge!("pgmq_queue_visible_length", "queue" => q.clone());
    let oldest = gauge!("pgmq_queue_oldest_msg_age_seconds", "queue" => q.clone());
    loop {
        let s = part.stats.snapshot();
        for (c, (_, v)) in counters.iter().zip(counter_values(&s)) {
            c.absolute(v);
        }
        depth.set(queue.len() as f64);
        running.set(part.leases.running().len() as f64);
        pending.set(s.acks_pending as f64);
        let health = part.health.snapshot();
        healthy.set(if health.is_healthy() { 1.0 } else { 0.0 });
        paused.set(if health.paused { 1.0 } else { 0.0 });
        unreadable.set(if health.pause_flag_unreadable {
            1.0
        } else {
            0.0
        });
        // Bounded by db_timeout; a sample past it is abandoned (its
        // connection discarded, its statement cancelled on the server).
        let once = crate::db::Kept::new(part.source.clone(), 0, cfg.db_timeout);
        match pgmq_client::Pgmq::on(&once).metrics(&cfg.queue).await {
            Ok(m) => {
                length.set(m.queue_length as f64);
                visible.set(m.queue_visible_length as f64);
                oldest.set(f64::from(m.oldest_msg_age_sec.unwrap_or(0)));
            }
            Err(e) => tracing::debug!(error = %e, "could not sample pgmq.metrics"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(cfg.interval) => {}
        }
    }
}

/// Every counter published, by name (`pgmq_worker_<name>_total`), with its
/// value in `s`.
fn counter_values(s: &StatsSnapshot) -> [(&'static str, u64); 30] {
    [
        ("claimed", s.claimed),
        ("handled", s.handled),
        ("succeeded", s.succeeded),
        ("failed", s.failed),
        ("retried", s.retried),
        ("snoozed", s.snoozed),
        ("dead_lettered", s.dead_lettered),
        ("deleted", s.deleted),
        ("archived", s.archived),
        ("released", s.released),
        ("claims_lost", s.claims_lost),
        ("timed_out", s.timed_out),
        ("panicked", s.panicked),
        ("decode_failures", s.decode_failures),
        ("acks_failed", s.acks_failed),
        ("ack_retries", s.ack_retries),
        ("read_errors", s.read_errors),
        ("reads", s.reads),
        ("reads_from_start", s.reads_from_start),
        ("empty_reads", s.empty_reads),
        ("heartbeats", s.heartbeats),
        ("task_restarts", s.task_restarts),
        ("tx_unavailable", s.tx_unavailable),
        ("expired_unstarted", s.expired_unstarted),
        ("expired_released", s.expired_released),
        ("wakeups_notify", s.wakeups_notify),
        ("wakeups_poll", s.wakeups_poll),
        ("wakeups_after_throttle", s.wakeups_after_throttle),
        ("still_running_at_deadline", s.still_running_at_deadline),
        ("stopped_at_claim_end", s.stopped_at_claim_end),
    ]
}
