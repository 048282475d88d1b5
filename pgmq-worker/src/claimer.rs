//! Reads batches into the bounded claim queue.
//!
//! `claimers` loops (2 by default) run at once, each with one `pgmq.read` in
//! flight, so the next claim never waits for the previous one, nor for any
//! acknowledgement. They share the free room of the claim queue through a
//! semaphore of `claim_capacity` permits: a loop takes up to `batch_size`
//! permits (waiting for at least half a batch, so a nearly full queue is not
//! refilled one message at a time), reads that many, and gives back what the
//! read did not fill. A handler returns a permit when it takes a message. The
//! claim queue therefore never holds more than `claim_capacity` messages, and
//! memory does not grow with the backlog.
//!
//! After a full read a loop reads again at once. After a short or empty read
//! it parks: loop 0 until the poll interval passes or a wake-up arrives, the
//! others until a wake-up only, so an idle worker polls once per interval
//! whatever the number of loops. A wake-up is a notification from the
//! notifier, or another loop reading a full batch (the backlog is back).

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgmq_client::{Message, RawJson};
use tokio_util::sync::CancellationToken;

use crate::stats::{bump, record, LocalHistograms};
use crate::worker::Shared;

/// A message in the claim queue.
pub(crate) struct Claimed {
    pub msg: Message<RawJson>,
    /// When the read that claimed it returned.
    pub claimed_at: Instant,
}

/// Backoff after failed reads: 50 ms doubling to 5 s.
pub(crate) struct ErrorBackoff {
    next: Duration,
    min: Duration,
    max: Duration,
}

impl ErrorBackoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        ErrorBackoff {
            next: min,
            min,
            max,
        }
    }

    pub(crate) fn reset(&mut self) {
        self.next = self.min;
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }
}

/// State shared by the claim loops.
pub(crate) struct ClaimQueue {
    pub tx: async_channel::Sender<Claimed>,
    /// Loops parked after a short read, to skip waking when nobody waits.
    parked: AtomicUsize,
}

impl ClaimQueue {
    pub(crate) fn new(tx: async_channel::Sender<Claimed>) -> Self {
        ClaimQueue {
            tx,
            parked: AtomicUsize::new(0),
        }
    }
}

/// One claim loop; runs until `stop`. A read in flight when `stop` fires is
/// finished and its messages queued, for the shutdown to release.
pub(crate) async fn run(
    shared: Arc<Shared>,
    queue: Arc<ClaimQueue>,
    index: usize,
    stop: CancellationToken,
) {
    let cfg = &shared.config;
    let batch = cfg.batch_size.min(cfg.claim_capacity);
    let at_least = (batch / 2).max(1);
    let mut wake = shared.wake.subscribe();
    let mut backoff = ErrorBackoff::new(Duration::from_millis(50), Duration::from_secs(5));
    let mut local = LocalHistograms::new();
    loop {
        // Room in the claim queue: at least half a batch, topped up to a batch.
        let mut permits = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            p = shared.room.clone().acquire_many_owned(at_least as u32) => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let extra = shared.room.available_permits().min(batch - at_least);
        if extra > 0 {
            if let Ok(more) = shared.room.clone().try_acquire_many_owned(extra as u32) {
                permits.merge(more);
            }
        }
        let qty = permits.num_permits();
        // Anything announced from here on is not missed: it marks `wake` changed.
        wake.borrow_and_update();
        let res = shared
            .client
            .read_raw(&cfg.queue, cfg.visibility_timeout, qty)
            .await;
        let msgs = match res {
            Ok(msgs) => msgs,
            Err(e) => {
                drop(permits);
                bump(&shared.stats.c.read_errors, 1);
                let delay = backoff.next_delay();
                if e.is_transient() {
                    tracing::warn!(error = %e, retry_in = ?delay, claimer = index, "read failed");
                } else {
                    tracing::error!(error = %e, retry_in = ?delay, claimer = index, "read failed");
                }
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(delay) => continue,
                }
            }
        };
        backoff.reset();
        let now = Instant::now();
        let n = msgs.len();
        bump(&shared.stats.c.reads, 1);
        bump(&shared.stats.c.claimed, n as u64);
        // The permits of the messages travel with them; a handler gives each
        // back when it takes the message. The rest go back now.
        if let Some(taken) = permits.split(n) {
            taken.forget();
        }
        drop(permits);
        for msg in msgs {
            if let Some(read_at) = msg.last_read_at {
                let waited = (read_at - msg.enqueued_at).num_microseconds().unwrap_or(0);
                record(&mut local.h.queue_wait_db, waited.max(0) as u64);
            }
            // The channel holds `claim_capacity` and every message in it holds
            // a permit: this never waits.
            if queue
                .tx
                .send(Claimed {
                    msg,
                    claimed_at: now,
                })
                .await
                .is_err()
            {
                // Closed only when the worker is being torn down.
                return;
            }
        }
        local.maybe_merge(&shared.stats, now);
        if n == qty {
            if queue.parked.load(Relaxed) > 0 {
                shared.wake_claimers();
            }
            continue;
        }
        if n == 0 {
            bump(&shared.stats.c.empty_reads, 1);
        }
        local.merge(&shared.stats, now);
        // Short read: the queue is drained for now. Park.
        queue.parked.fetch_add(1, Relaxed);
        let timer = async {
            if index == 0 {
                tokio::time::sleep(cfg.poll_interval).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let stopped = tokio::select! {
            biased;
            _ = stop.cancelled() => true,
            _ = wake.changed() => false,
            _ = timer => {
                bump(&shared.stats.c.wakeups_poll, 1);
                false
            }
        };
        queue.parked.fetch_sub(1, Relaxed);
        if stopped {
            break;
        }
    }
    local.merge(&shared.stats, Instant::now());
}
