//! Keeps the deliveries this worker holds invisible to others.
//!
//! The heartbeat wakes every quarter of the visibility timeout (or at once
//! when a handler starts a message already past half its timeout), collects
//! the [leases](crate::lease) that are past half their timeout, whether
//! their handler still runs or their acknowledgement waits to be written,
//! and extends them all with one fenced requeue
//! ([`Pgmq::requeue_fenced`](pgmq_client::Pgmq::requeue_fenced)), on a
//! connection of its own and within `db_timeout`. A running handler whose
//! extension matches nothing has lost its claim (another delivery holds the
//! message): it is counted in `claims_lost`, logged once, and its
//! [`Context`](crate::Context) is cancelled.
//!
//! Under a fleet-wide limit of places the runs are fenced on their claims'
//! ends (`fence.rs`): a lease whose claim may have ended is not extended
//! any more, and an extension that returned too late extends nothing
//! ([`crate::lease`]), so a run stopped by its fence is not revived.
//!
//! **Order with retries.** A retry, snooze or release sets the visibility
//! itself; an extension landing after it would overwrite its delay. So the
//! heartbeat holds [`HeartbeatSignals`]' write lock from collecting the leases until
//! its write returned (a write is never abandoned half-way, not even by the
//! shutdown's stop), does not collect leases being settled, and the
//! completer marks them settling and then waits for it
//! ([`HeartbeatSignals::after_write`]). An extension that still lands later
//! (one this task stopped waiting for at `db_timeout` while the server went
//! on with it) matches nothing: a retry, snooze or release ends its
//! delivery, and only the extension keeps the claim
//! ([`Requeue::keep_claim`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pgmq_client::{Pgmq, Requeue};
use tokio_util::sync::CancellationToken;

use pgmq_client::QueueName;
use tokio::task::JoinHandle;

use crate::db::{self, Source};
use crate::lease::Leases;
use crate::stats::{bump, Stats};
use crate::supervise::{PanicOnce, Supervisor};

/// What the heartbeat reads.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub queue: QueueName,
    pub visibility_timeout: Duration,
    pub db_timeout: Duration,
}

/// The heartbeat: its settings and the handles it touches.
pub(crate) struct Heartbeat {
    pub settings: Settings,
    pub source: Source,
    pub leases: Arc<Leases>,
    pub signals: Arc<HeartbeatSignals>,
    pub stats: Arc<Stats>,
    pub panic_once: Arc<PanicOnce>,
}

/// How the rest of the worker coordinates with the heartbeat.
#[derive(Default)]
pub(crate) struct HeartbeatSignals {
    /// Asks the heartbeat to look now (a handler started late in its timeout).
    nudge: tokio::sync::Notify,
    /// Held by the heartbeat from collecting the leases until its write
    /// returned; see [`HeartbeatSignals::after_write`].
    write: tokio::sync::Mutex<()>,
}

impl HeartbeatSignals {
    /// Makes the heartbeat look now instead of at its next tick.
    pub(crate) fn nudge(&self) {
        self.nudge.notify_one();
    }

    /// Waits for a heartbeat write in flight, if any.
    ///
    /// A write that sets the visibility of messages whose handlers finished
    /// (a retry's delay, a release) calls this first, so that it lands after
    /// any heartbeat extension that may include them: the heartbeat collects
    /// the leases under the write lock, and a handler clears its slot before
    /// its acknowledgement is sent, so a heartbeat that starts after this
    /// returns no longer sees them.
    pub(crate) async fn after_write(&self) {
        drop(self.write.lock().await);
    }
}

/// How often the heartbeat looks: a quarter of the visibility timeout.
pub(crate) fn tick(vt: Duration) -> Duration {
    (vt / 4).max(Duration::from_millis(50))
}

/// Starts the supervised heartbeat; it runs until `stop`.
pub(crate) fn spawn(
    hb: Heartbeat,
    supervisor: &Supervisor,
    stop: &CancellationToken,
) -> JoinHandle<()> {
    let (hb, stop) = (Arc::new(hb), stop.clone());
    supervisor.spawn("heartbeat", move || run(Arc::clone(&hb), stop.clone()))
}

/// Runs until `stop`: extends the visibility timeout of every lease past
/// half of it.
async fn run(hb: Arc<Heartbeat>, stop: CancellationToken) {
    hb.panic_once.maybe_panic("heartbeat");
    let cfg = &hb.settings;
    let vt = cfg.visibility_timeout;
    let mut due = Vec::new();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = hb.signals.nudge.notified() => {}
            _ = tokio::time::sleep(tick(vt)) => {}
        }
        // Held until the write returned (see the module docs).
        let _writing = hb.signals.write.lock().await;
        hb.leases.due(Instant::now(), vt / 2, &mut due);
        if due.is_empty() {
            continue;
        }
        let items: Vec<Requeue> = due
            .iter()
            .map(|r| Requeue::new(*r, vt).keep_claim())
            .collect();
        let sent = Instant::now();
        // Not raced against `stop`: a write dropped here could still reach
        // the server after a retry written meanwhile. It is bounded by
        // `db_timeout`, and the shutdown bounds how long it waits for this task.
        let res = async {
            // A connection per write, not kept between ticks.
            let once = db::Kept::new(hb.source.clone(), 0, cfg.db_timeout);
            Pgmq::on(&once).requeue_fenced(&cfg.queue, &items).await
        }
        .await;
        match res {
            Ok(extended) => {
                // The server set vt = its now + vt, its now being after `sent`:
                // `sent + vt` is a safe (early) local estimate.
                let lost = hb
                    .leases
                    .extended(&due, &extended, sent + vt, Instant::now());
                bump(&hb.stats.c.heartbeats, extended.len() as u64);
                if !lost.is_empty() {
                    bump(&hb.stats.c.claims_lost, lost.len() as u64);
                    for id in &lost {
                        tracing::warn!(queue = %cfg.queue, msg_id = id, "claim lost: the message was delivered again since this worker claimed it; its handler is cancelled and its outcome will not be written");
                    }
                }
                tracing::debug!(extended = extended.len(), lost = lost.len(), "heartbeat");
            }
            Err(e) => {
                tracing::warn!(error = %e, messages = due.len(), "heartbeat failed; retrying at the next tick");
            }
        }
    }
}
