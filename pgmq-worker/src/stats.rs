//! Counters and histograms, and their cheap snapshot.
//!
//! Counters are relaxed atomics bumped once per message or per batch. The
//! histograms' values are gathered per task in plain vectors and recorded
//! into the shared histograms under a mutex at most every [`MERGE_EVERY`],
//! so the per-message path takes no lock. A merge costs what was gathered,
//! not the histograms' size: a per-task histogram would have to be walked
//! and cleared at each merge (three of thousands of buckets), a cost every
//! loop pays every [`MERGE_EVERY`] however few messages it ran, so that a
//! worker of 1,024 handler loops spent more of its CPU merging than
//! handling. A handler loop that goes idle with values left merges them once
//! its wait outlasts [`MERGE_EVERY`], not after every batch. A claim loop
//! merges when it parks. A snapshot of a worker idle for [`MERGE_EVERY`] is
//! therefore complete, and the shutdown report always is.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// How often a task's local histograms are merged into the shared ones.
pub(crate) const MERGE_EVERY: Duration = Duration::from_millis(100);

/// Largest value recorded: one day in microseconds (larger values saturate).
const HIST_MAX_US: u64 = 86_400_000_000;

/// A fresh histogram: microseconds, two significant digits (1% resolution,
/// about 30 KiB each).
pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_US, 2).expect("static histogram bounds are valid")
}

pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// The live counters of one worker.
        #[derive(Default)]
        pub(crate) struct Counters { $(pub $name: AtomicU64,)* }

        /// What a worker did since it started: counters and latency histograms.
        ///
        /// Taking a snapshot reads the atomic counters and copies the three
        /// histograms under a short lock; it does not stop the worker.
        #[derive(Debug, Clone)]
        #[non_exhaustive]
        pub struct StatsSnapshot {
            $($(#[$doc])* pub $name: u64,)*
            /// Handler run time, microseconds (handler start to end).
            pub handler_latency: Histogram<u64>,
            /// Time in the queue by the database clock, microseconds
            /// (`enqueued_at` to `last_read_at`, recorded at claim).
            pub queue_wait_db: Histogram<u64>,
            /// Time between claim and handler start in this process, microseconds.
            pub queue_wait_local: Histogram<u64>,
        }

        impl Counters {
            fn snapshot(&self, h: &Histograms) -> StatsSnapshot {
                StatsSnapshot {
                    $($name: self.$name.load(Relaxed),)*
                    handler_latency: h.handler_latency.clone(),
                    queue_wait_db: h.queue_wait_db.clone(),
                    queue_wait_local: h.queue_wait_local.clone(),
                }
            }
        }
    };
}

counters! {
    /// Messages read from the queue.
    claimed,
    /// Handler runs that ended (with any outcome, an error or a panic).
    handled,
    /// Handler runs that returned `Ok`.
    succeeded,
    /// Handler runs that returned `Err` or panicked.
    failed,
    /// Messages made visible again after a delay (written).
    retried,
    /// Messages moved to the dead-letter queue, or archived for want of one (written).
    dead_lettered,
    /// Messages archived on `Outcome::Archive` (written).
    archived,
    /// Messages deleted (written).
    deleted,
    /// Claimed-but-unstarted messages given back at shutdown (written): visible
    /// again at once, their read undone (`read_ct` one lower).
    released,
    /// Acknowledgements queued or being written right now.
    acks_pending,
    /// Acknowledgements given up on (non-transient error, or retried past
    /// `ack_retry_timeout`): those messages come back after their visibility timeout.
    acks_failed,
    /// Acknowledgement writes that failed and were retried.
    ack_retries,
    /// Handler runs that panicked (also counted in `failed`).
    panicked,
    /// Messages whose body did not decode into the handler's type (dead-lettered unhandled).
    decode_failures,
    /// Claimed messages not started because their visibility timeout had
    /// nearly run out while they waited locally; they are given back at once
    /// with their read undone (see `expired_released`).
    expired_unstarted,
    /// Of `expired_unstarted`, those given back (written): visible again
    /// at once, their `read_ct` one lower, so that the wait used up no attempt.
    expired_released,
    /// Claim reads that succeeded.
    reads,
    /// Of `reads`, those that started at the queue's head: the periodic
    /// and after-a-short-read ones of [`ClaimReads::Bounded`], or every
    /// read of [`ClaimReads::FromStart`]. Each one walks whatever dead rows
    /// the head holds (many, while a long transaction pins the MVCC
    /// horizon); the bounded reads between them do not.
    ///
    /// [`ClaimReads::Bounded`]: crate::ClaimReads::Bounded
    /// [`ClaimReads::FromStart`]: crate::ClaimReads::FromStart
    reads_from_start,
    /// Reads that returned nothing.
    empty_reads,
    /// Reads that failed (the claimer backed off and retried).
    read_errors,
    /// Wake-ups of idle claimers by a notification.
    wakeups_notify,
    /// Wake-ups of idle claimers by the poll timer.
    wakeups_poll,
    /// Wake-ups of idle claimers one throttle interval after a notification
    /// ([`WakeUp::Notify`](crate::WakeUp::Notify)), for messages sent inside
    /// PGMQ's throttle window (which get no notification of their own).
    wakeups_after_throttle,
    /// Visibility timeouts extended by the heartbeat.
    heartbeats,
    /// Handler runs still going when the shutdown grace period ended (abandoned).
    still_running_at_deadline,
    /// Deliveries this worker lost to another one: a fenced write (heartbeat,
    /// acknowledgement, release) found the message read again since its
    /// claim expired, so nothing was written for it here.
    claims_lost,
    /// Handler runs cancelled for outliving `handler_timeout` (also counted
    /// in `failed`).
    timed_out,
    /// Messages snoozed (`Outcome::Snooze`, written).
    snoozed,
    /// Internal tasks (claim loops, handler loops, heartbeat, notifier)
    /// restarted after a panic.
    task_restarts,
    /// Transactional runs whose own database work failed (no connection
    /// within `db_timeout`, BEGIN, the acknowledgement or COMMIT lost its
    /// connection or timed out): snoozed without using an attempt.
    tx_unavailable,
    /// Under a fleet-wide limit of places: handler runs stopped because
    /// their claim may have ended before it was extended (the process was
    /// stopped, or could not reach the database, for about a visibility
    /// timeout); their messages are not acknowledged by this worker.
    stopped_at_claim_end,
}

pub(crate) struct Histograms {
    pub handler_latency: Histogram<u64>,
    pub queue_wait_db: Histogram<u64>,
    pub queue_wait_local: Histogram<u64>,
}

impl Histograms {
    pub(crate) fn new() -> Self {
        Histograms {
            handler_latency: new_histogram(),
            queue_wait_db: new_histogram(),
            queue_wait_local: new_histogram(),
        }
    }
}

/// Values waiting to be recorded into a shared histogram: (microseconds,
/// how many times), in the order they came.
#[derive(Default)]
pub(crate) struct Values(Vec<(u64, u64)>);

impl Values {
    /// Adds one value of `us`.
    pub(crate) fn record(&mut self, us: u64) {
        self.0.push((us, 1));
    }

    /// Adds `n` values of `us` (a batch's run time, once per message).
    pub(crate) fn record_n(&mut self, us: u64, n: u64) {
        self.0.push((us, n));
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Records every value into `h` and empties itself (keeping its room).
    fn drain_into(&mut self, h: &mut Histogram<u64>) {
        for (us, n) in self.0.drain(..) {
            record_n(h, us, n);
        }
    }
}

/// One task's values of the three histograms since its last merge.
#[derive(Default)]
pub(crate) struct Pending {
    pub handler_latency: Values,
    pub queue_wait_db: Values,
    pub queue_wait_local: Values,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.handler_latency.is_empty()
            && self.queue_wait_db.is_empty()
            && self.queue_wait_local.is_empty()
    }

    fn merge_into(&mut self, shared: &mut Histograms) {
        self.handler_latency.drain_into(&mut shared.handler_latency);
        self.queue_wait_db.drain_into(&mut shared.queue_wait_db);
        self.queue_wait_local
            .drain_into(&mut shared.queue_wait_local);
    }
}

/// The per-message counters of one handler loop, on a cache line of their
/// own: each loop bumps only its own, so the per-message path never contends
/// with other threads for a counter. Snapshots add them up.
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct HandlerCounters {
    pub handled: AtomicU64,
    pub succeeded: AtomicU64,
    pub failed: AtomicU64,
    pub panicked: AtomicU64,
    pub decode_failures: AtomicU64,
    pub expired_unstarted: AtomicU64,
    pub timed_out: AtomicU64,
    /// Acknowledgements handed to the completer.
    pub acks_sent: AtomicU64,
}

/// Counters and histograms shared by every task of one worker.
pub(crate) struct Stats {
    pub c: Counters,
    /// One per handler loop.
    pub per_handler: Box<[HandlerCounters]>,
    /// Acknowledgements the completer finished with (written or given up);
    /// `acks_pending` is the handlers' `acks_sent` minus this.
    pub acks_resolved: AtomicU64,
    hist: Mutex<Histograms>,
}

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stats")
            .field("deleted", &read(&self.c.deleted))
            .finish_non_exhaustive()
    }
}

impl Stats {
    pub(crate) fn new(handlers: usize) -> Self {
        Stats {
            c: Counters::default(),
            per_handler: (0..handlers).map(|_| HandlerCounters::default()).collect(),
            acks_resolved: AtomicU64::new(0),
            hist: Mutex::new(Histograms::new()),
        }
    }

    /// A copy of everything, now.
    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let mut snap = {
            let h = self.hist.lock().unwrap_or_else(|p| p.into_inner());
            self.c.snapshot(&h)
        };
        let mut acks_sent = 0;
        for p in self.per_handler.iter() {
            snap.handled += read(&p.handled);
            snap.succeeded += read(&p.succeeded);
            snap.failed += read(&p.failed);
            snap.panicked += read(&p.panicked);
            snap.decode_failures += read(&p.decode_failures);
            snap.expired_unstarted += read(&p.expired_unstarted);
            snap.timed_out += read(&p.timed_out);
            acks_sent += read(&p.acks_sent);
        }
        snap.acks_pending = acks_sent.saturating_sub(read(&self.acks_resolved));
        snap
    }

    /// Acknowledgements queued or being written right now.
    pub(crate) fn acks_pending(&self) -> u64 {
        let sent: u64 = self.per_handler.iter().map(|p| read(&p.acks_sent)).sum();
        sent.saturating_sub(read(&self.acks_resolved))
    }

    fn merge(&self, local: &mut Pending) {
        if local.is_empty() {
            return;
        }
        let mut h = self.hist.lock().unwrap_or_else(|p| p.into_inner());
        local.merge_into(&mut h);
    }
}

/// A task's own histogram values, merged into the shared histograms now
/// and then.
pub(crate) struct LocalHistograms {
    pub h: Pending,
    last_merge: Instant,
}

impl LocalHistograms {
    pub(crate) fn new() -> Self {
        LocalHistograms {
            h: Pending::default(),
            last_merge: Instant::now(),
        }
    }

    /// Merges when the last merge is older than [`MERGE_EVERY`].
    pub(crate) fn maybe_merge(&mut self, stats: &Stats, now: Instant) {
        if now.duration_since(self.last_merge) >= MERGE_EVERY {
            self.merge(stats, now);
        }
    }

    /// When unmerged values should be merged at the latest: `None` when there
    /// are none; the next [`MERGE_EVERY`] boundary (possibly already past).
    pub(crate) fn merge_due(&self) -> Option<Instant> {
        if self.h.is_empty() {
            None
        } else {
            Some(self.last_merge + MERGE_EVERY)
        }
    }

    /// Merges now.
    pub(crate) fn merge(&mut self, stats: &Stats, now: Instant) {
        stats.merge(&mut self.h);
        self.last_merge = now;
    }
}

/// Adds `n` to a counter.
pub(crate) fn bump(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Relaxed);
}

/// Reads a counter.
pub(crate) fn read(counter: &AtomicU64) -> u64 {
    counter.load(Relaxed)
}

/// Records `us` `n` times (a batch's run time, once per message).
fn record_n(h: &mut Histogram<u64>, us: u64, n: u64) {
    h.saturating_record_n(us.clamp(1, HIST_MAX_US), n);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_histograms_merge_into_snapshot() {
        let stats = Stats::new(2);
        let mut local = LocalHistograms::new();
        local.h.handler_latency.record(250);
        local.h.queue_wait_local.record(0);
        local.h.queue_wait_local.record_n(7, 3);
        assert!(stats.snapshot().handler_latency.is_empty());
        local.merge(&stats, Instant::now());
        let snap = stats.snapshot();
        assert_eq!(snap.handler_latency.len(), 1);
        assert_eq!(snap.queue_wait_local.len(), 4);
        // A zero is recorded as the histogram's lowest value, 1 µs.
        assert_eq!(snap.queue_wait_local.min(), 1);
        assert_eq!(snap.queue_wait_local.count_at(7), 3);
        assert!(local.h.is_empty());
        bump(&stats.c.deleted, 3);
        bump(&stats.per_handler[0].handled, 2);
        bump(&stats.per_handler[1].handled, 1);
        bump(&stats.per_handler[1].acks_sent, 3);
        bump(&stats.acks_resolved, 1);
        let snap = stats.snapshot();
        assert_eq!((snap.deleted, snap.handled, snap.acks_pending), (3, 3, 2));
        assert_eq!(stats.acks_pending(), 2);
    }
}
