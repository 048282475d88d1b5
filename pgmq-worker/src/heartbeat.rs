//! Keeps long handlers' messages invisible.
//!
//! Each handler task owns one [`Slot`]: the id of the message it runs and the
//! local deadline of that message's visibility timeout. The heartbeat task
//! wakes every quarter of the visibility timeout (or at once when a handler
//! starts a message already past half its timeout), collects the messages
//! that are past half their timeout and extends them all with one batched
//! `pgmq.set_vt`. The handler's own path only stores two atomics per message.
//!
//! **Order with retries.** A handler may finish while the heartbeat's write
//! for its message is on the way; if its `Outcome::Retry(delay)` landed
//! first, the extension would then overwrite the delay with one visibility
//! timeout. So the heartbeat holds `Shared::heartbeat_write` from collecting
//! the ids until its write returned (a write is never abandoned half-way,
//! not even by the shutdown's stop), and the completer waits for it
//! ([`Shared::after_heartbeat`](crate::worker::Shared::after_heartbeat))
//! before writing retries, as the shutdown does before releasing. A
//! heartbeat that collects after that no longer sees the finished handlers.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgmq_client::VisibleAt;
use tokio_util::sync::CancellationToken;

use crate::stats::{bump, micros};
use crate::worker::Shared;

/// What one handler task is running (on a cache line of its own: each
/// handler writes its slot twice per message).
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct Slot {
    /// The running message, 0 when idle (PGMQ ids start at 1).
    msg_id: AtomicI64,
    /// When its visibility timeout ends, microseconds since the worker's epoch.
    deadline_us: AtomicU64,
}

impl Slot {
    pub(crate) fn start(&self, msg_id: i64, deadline_us: u64) {
        self.deadline_us.store(deadline_us, Relaxed);
        self.msg_id.store(msg_id, Relaxed);
    }

    pub(crate) fn finish(&self) {
        self.msg_id.store(0, Relaxed);
    }

    pub(crate) fn running(&self) -> Option<i64> {
        match self.msg_id.load(Relaxed) {
            0 => None,
            id => Some(id),
        }
    }
}

/// How often the heartbeat looks: a quarter of the visibility timeout.
pub(crate) fn tick(vt: Duration) -> Duration {
    (vt / 4).max(Duration::from_millis(50))
}

/// Runs until `stop`: extends the visibility timeout of every message whose
/// handler is still running past half of it.
pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let cfg = &shared.config;
    let vt = cfg.visibility_timeout;
    let half_us = micros(vt / 2);
    let mut ids = Vec::new();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = shared.heartbeat_nudge.notified() => {}
            _ = tokio::time::sleep(tick(vt)) => {}
        }
        // Held until the write returned (see the module docs).
        let _writing = shared.heartbeat_write.lock().await;
        let now_us = shared.now_us();
        ids.clear();
        for slot in shared.slots.iter() {
            if let Some(id) = slot.running() {
                if slot.deadline_us.load(Relaxed) <= now_us + half_us {
                    ids.push(id);
                }
            }
        }
        if ids.is_empty() {
            continue;
        }
        let sent = Instant::now();
        // Not raced against `stop`: a write dropped here could still reach
        // the server after a retry written meanwhile. The shutdown bounds
        // how long it waits for this task.
        let res = shared
            .client
            .set_vt_batch(&cfg.queue, &ids, VisibleAt::After(vt))
            .await;
        match res {
            Ok(updated) => {
                // The server set vt = its now + vt, its now being after `sent`:
                // `sent + vt` is a safe (early) local estimate.
                let deadline = shared.us_since_epoch(sent) + micros(vt);
                for slot in shared.slots.iter() {
                    if let Some(id) = slot.running() {
                        if updated.contains(&id) {
                            slot.deadline_us.store(deadline, Relaxed);
                        }
                    }
                }
                bump(&shared.stats.c.heartbeats, updated.len() as u64);
                tracing::debug!(extended = updated.len(), "heartbeat");
            }
            Err(e) => {
                tracing::warn!(error = %e, messages = ids.len(), "heartbeat failed; retrying at the next tick");
            }
        }
    }
}
