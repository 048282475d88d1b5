//! The stop sequence and its report.
//!
//! A running worker is a set of tasks tied together by two cancellation
//! tokens and two channels:
//!
//! ```text
//!  claimers ──claim queue──▶ handler loops ──ack channel──▶ completer
//!     ▲  stop                    ▲  stop                   (ends when the
//!  notifier                  heartbeat  hb_stop             channel closes)
//! ```
//!
//! [`Running::shutdown`] stops them in this order:
//!
//! 1. **Stop claiming and taking.** `stop` is cancelled: claimers stop
//!    reading (a read already in flight finishes and queues its messages),
//!    the notifier closes its connection, and handler loops take no new
//!    message (one that is running goes on).
//! 2. **Release at once.** Claimers are awaited (a read in flight is one
//!    round trip; one stuck longer than 2 s is aborted), then every
//!    claimed-but-unstarted message in the claim queue, including what those
//!    last reads brought, is given back with its read undone
//!    (`Pgmq::release_batch`, batched: visible now, `read_ct` one lower), so
//!    another worker can take it now rather than after the visibility
//!    timeout, and a message released by shutdown after shutdown never runs
//!    out of attempts without having run. Releasing only after the claimers
//!    stopped means no read of this worker re-claims a released message.
//! 3. **Let in-flight handlers finish**, until `shutdown_grace` after the
//!    start of the shutdown. Their acknowledgements go to the completer as
//!    usual, and the heartbeat keeps their messages invisible meanwhile.
//!    Handlers still running at the deadline are abandoned (async ones are
//!    cancelled; blocking ones cannot be and are left to end on their own,
//!    their results discarded) and counted: their messages come back after
//!    the visibility timeout.
//! 4. **Stop the heartbeat.** An extension it is writing is finished first
//!    (retries wait for it; see heartbeat.rs), within `ack_drain_timeout`.
//! 5. **Drain the completer.** The ack channel is closed; the completer
//!    writes what is queued (retrying transient
//!    failures) and ends, within `ack_drain_timeout` of the end of step 3
//!    (shared with step 4). Whatever could not be written is counted in
//!    `acks_failed`.
//! 6. **Report.**

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::claimer::{Claimed, ErrorBackoff};
use crate::stats::{bump, StatsSnapshot};
use crate::worker::Shared;

/// How long the shutdown waits for a claimer's read in flight.
const CLAIMER_STOP_WAIT: Duration = Duration::from_secs(2);

/// What a shutdown did, with the final statistics.
///
/// The shutdown runs these steps, in order:
///
/// 1. stop claiming (a read in flight finishes) and stop starting handlers;
/// 2. release the claimed-but-unstarted messages at once, their read undone
///    (`Pgmq::release_batch`: visible now, `read_ct` one lower, so the
///    release uses up no attempt): `released`;
/// 3. let running handlers finish until `shutdown_grace` has passed since the
///    start of the shutdown; those still running then are abandoned (their
///    messages come back after the visibility timeout):
///    `still_running_at_deadline`;
/// 4. stop the heartbeat and the LISTEN connection;
/// 5. write the queued acknowledgements (within `ack_drain_timeout`):
///    `acked`, and `acks_failed` for what could not be written.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Handler runs that ended, over the worker's life.
    pub handled: u64,
    /// Acknowledgements written (deleted + archived + retried + dead-lettered).
    pub acked: u64,
    /// Claimed-but-unstarted messages given back by the shutdown (visible
    /// again at once, their read undone).
    pub released: u64,
    /// Handlers still running when the grace period ended (abandoned; their
    /// messages come back after the visibility timeout).
    pub still_running_at_deadline: u64,
    /// Acknowledgements that could not be written (the messages come back).
    pub acks_failed: u64,
    /// Claimed messages neither released nor handled because the release
    /// itself failed (they come back after the visibility timeout).
    pub release_failed: u64,
    /// How long the shutdown took.
    pub elapsed: Duration,
    /// Everything counted over the worker's life.
    pub stats: StatsSnapshot,
}

/// The tasks of a running worker.
pub(crate) struct Running {
    pub shared: Arc<Shared>,
    /// Parent of the tokens below: cancelled when a running worker is dropped.
    pub root: CancellationToken,
    /// Stops claimers, notifier and handler loops taking new messages.
    pub stop: CancellationToken,
    /// Stops the heartbeat.
    pub hb_stop: CancellationToken,
    pub claim_rx: async_channel::Receiver<Claimed>,
    pub claimers: Vec<JoinHandle<()>>,
    pub handlers: Vec<JoinHandle<()>>,
    pub heartbeat: Option<JoinHandle<()>>,
    pub notifier: Option<JoinHandle<()>>,
    pub completer: JoinHandle<()>,
    /// Tells the completer to close its channel and drain.
    pub completer_close: CancellationToken,
}

impl Running {
    /// The stop sequence (see the module docs).
    pub(crate) async fn shutdown(self) -> ShutdownReport {
        let started = Instant::now();
        let shared = self.shared;
        let cfg = &shared.config;
        let deadline = tokio::time::Instant::now() + cfg.shutdown_grace;
        tracing::info!(queue = %cfg.queue, grace = ?cfg.shutdown_grace, "worker stopping");

        // 1. Stop claiming and taking.
        self.stop.cancel();

        // 2. Release what is claimed but not started, at once. Claimers end
        //    first (a read in flight is one round trip), so that no read
        //    re-claims what the release makes visible; one stuck on a dead
        //    connection is aborted after CLAIMER_STOP_WAIT (what it read, if
        //    anything, comes back after the visibility timeout).
        let claimers_done = tokio::time::Instant::now() + CLAIMER_STOP_WAIT;
        for claimer in self.claimers {
            let abort = claimer.abort_handle();
            if tokio::time::timeout_at(claimers_done.min(deadline), claimer)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        let release_failed = release(&shared, &self.claim_rx, deadline).await;

        // 3. Let in-flight handlers finish within the grace period.
        let mut abandoned = 0;
        for handler in self.handlers {
            let abort = handler.abort_handle();
            if tokio::time::timeout_at(deadline, handler).await.is_err() {
                abort.abort();
            }
        }
        for slot in shared.slots.iter() {
            if let Some(id) = slot.running() {
                abandoned += 1;
                tracing::warn!(
                    msg_id = id,
                    "handler still running at the shutdown deadline; abandoned"
                );
            }
        }
        bump(&shared.stats.c.still_running_at_deadline, abandoned);
        // Nothing takes from the claim queue any more; drop it so that a
        // claimer's pending send (none expected) fails rather than waits.
        self.claim_rx.close();

        // 4. Stop the heartbeat and the notifier. A heartbeat write in
        //    flight is finished first (retries wait for it), within the
        //    drain time.
        let drain_deadline = Instant::now() + cfg.ack_drain_timeout;
        self.hb_stop.cancel();
        if let Some(hb) = self.heartbeat {
            let abort = hb.abort_handle();
            if tokio::time::timeout_at(drain_deadline.into(), hb)
                .await
                .is_err()
            {
                abort.abort();
                tracing::warn!("heartbeat write unanswered within ack_drain_timeout; abandoned");
            }
        }
        if let Some(n) = self.notifier {
            let _ = n.await;
        }

        // 5. Drain the completer.
        shared.set_ack_deadline(drain_deadline);
        self.completer_close.cancel();
        let completer = self.completer;
        let abort = completer.abort_handle();
        if tokio::time::timeout_at(drain_deadline.into(), completer)
            .await
            .is_err()
        {
            abort.abort();
            let pending = shared.stats.acks_pending();
            bump(&shared.stats.c.acks_failed, pending);
            tracing::error!(
                pending,
                "acknowledgements not written within ack_drain_timeout"
            );
        }

        // 6. Report.
        let stats = shared.stats.snapshot();
        let report = ShutdownReport {
            handled: stats.handled,
            acked: stats.deleted + stats.archived + stats.retried + stats.dead_lettered,
            released: stats.released,
            still_running_at_deadline: abandoned,
            acks_failed: stats.acks_failed,
            release_failed,
            elapsed: started.elapsed(),
            stats,
        };
        tracing::info!(
            queue = %cfg.queue,
            handled = report.handled,
            acked = report.acked,
            released = report.released,
            still_running = report.still_running_at_deadline,
            "worker stopped"
        );
        report
    }
}

/// Gives back every message left in the claim queue, in batches, with its
/// read undone (`Pgmq::release_batch`: visible now, `read_ct` one lower, so
/// the release uses up no attempt); returns how many could not be released
/// before `deadline`. A message read again by someone else since (its
/// timeout ended) is theirs and left alone.
async fn release(
    shared: &Shared,
    rx: &async_channel::Receiver<Claimed>,
    deadline: tokio::time::Instant,
) -> u64 {
    let mut reads = Vec::new();
    while let Ok(c) = rx.try_recv() {
        reads.push((c.msg.msg_id, c.msg.read_ct));
    }
    shared.room.free(reads.len());
    if !reads.is_empty() {
        // Unstarted messages are in no heartbeat batch, unless one was
        // claimed again while a copy still runs: keep the order anyway.
        shared.after_heartbeat().await;
    }
    let mut failed = 0;
    for chunk in reads.chunks(shared.config.batch_size.max(1)) {
        let mut backoff = ErrorBackoff::new(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            match shared
                .client
                .release_batch(&shared.config.queue, chunk)
                .await
            {
                Ok(done) => {
                    bump(&shared.stats.c.released, done.len() as u64);
                    break;
                }
                Err(e) => {
                    let delay = backoff.next_delay();
                    if !e.is_transient() || tokio::time::Instant::now() + delay >= deadline {
                        tracing::warn!(error = %e, messages = chunk.len(), "could not release claimed messages; they come back after their visibility timeout");
                        failed += chunk.len() as u64;
                        break;
                    }
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }
    failed
}
