//! Tallies of handled ids: what every handler call of an in-process worker
//! shares (the ledger, the distinct count and the target that completes a
//! run, the end of the latest handler call), and each call's queue wait.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use hdrhistogram::Histogram;
use tokio::sync::Notify;

use crate::ledger::Ledger;
use crate::stats::us_histogram;

/// What every handler call shares.
#[derive(Debug)]
pub(crate) struct Tally {
    pub(crate) ledger: Ledger,
    /// Distinct ids handled.
    pub(crate) distinct: AtomicU64,
    /// Distinct ids after which the run is complete (u64::MAX: open-ended).
    pub(crate) target: AtomicU64,
    /// When the handler completing the target finished.
    pub(crate) completed_at: OnceLock<Instant>,
    pub(crate) done: Notify,
    pub(crate) work: Duration,
    /// When the tally was made.
    pub(crate) base: Instant,
    /// Nanoseconds from `base` to the end of the latest handler call.
    pub(crate) last_done_ns: AtomicU64,
    /// When set (sustained): each handler call's queue wait.
    pub(crate) waits: Option<QueueWaits>,
}

/// Queue wait of each handler call: the message's `enqueued_at` (database
/// clock) to the handler's start (this host's clock, moved onto the
/// database's by `offset`), microseconds, for the caller to take per interval.
#[derive(Debug)]
pub(crate) struct QueueWaits {
    /// Database clock minus this host's clock, microseconds.
    offset_us: i64,
    hist: Mutex<Histogram<u64>>,
}

impl QueueWaits {
    pub(crate) fn new(offset_us: i64) -> QueueWaits {
        QueueWaits {
            offset_us,
            hist: Mutex::new(us_histogram()),
        }
    }

    fn record(&self, enqueued_at: DateTime<Utc>) {
        let waited = (Utc::now() - enqueued_at)
            .num_microseconds()
            .unwrap_or(i64::MAX)
            + self.offset_us;
        let mut h = self.hist.lock().unwrap_or_else(|p| p.into_inner());
        h.saturating_record(waited.max(0) as u64);
    }

    /// The waits recorded since the last call, and a fresh start.
    pub(crate) fn take(&self) -> Histogram<u64> {
        let mut h = self.hist.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut *h, us_histogram())
    }
}

impl Tally {
    pub(crate) fn new(target: u64, work: Duration) -> Arc<Tally> {
        Arc::new(Tally {
            ledger: Ledger::new(),
            distinct: AtomicU64::new(0),
            target: AtomicU64::new(target),
            completed_at: OnceLock::new(),
            done: Notify::new(),
            work,
            base: Instant::now(),
            last_done_ns: AtomicU64::new(0),
            waits: None,
        })
    }

    /// A tally that also records each handler call's queue wait.
    pub(crate) fn with_waits(target: u64, work: Duration, waits: QueueWaits) -> Arc<Tally> {
        let mut t = Arc::into_inner(Tally::new(target, work)).expect("not shared yet");
        t.waits = Some(waits);
        Arc::new(t)
    }

    /// Called first in each handler call.
    pub(crate) fn started(&self, enqueued_at: DateTime<Utc>) {
        if let Some(w) = &self.waits {
            w.record(enqueued_at);
        }
    }

    /// The handler body: simulated work, then the ledger.
    pub(crate) async fn handle(&self, id: u64) {
        if !self.work.is_zero() {
            tokio::time::sleep(self.work).await;
        }
        if self.ledger.mark(id) {
            let d = self.distinct.fetch_add(1, Ordering::AcqRel) + 1;
            self.check(d);
        }
        let ns = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_done_ns.fetch_max(ns, Ordering::AcqRel);
    }

    /// Marks completion once `distinct` reaches the target.
    pub(crate) fn check(&self, distinct: u64) {
        if distinct >= self.target.load(Ordering::Acquire)
            && self.completed_at.set(Instant::now()).is_ok()
        {
            self.done.notify_one();
        }
    }

    pub(crate) fn distinct(&self) -> u64 {
        self.distinct.load(Ordering::Acquire)
    }

    /// Waits until the target is reached, or no new id arrives for `stall`.
    /// Returns false on a stall.
    pub(crate) async fn wait(&self, stall: Duration) -> bool {
        let mut last = self.distinct();
        let mut last_change = Instant::now();
        loop {
            if self.completed_at.get().is_some() {
                return true;
            }
            tokio::select! {
                () = self.done.notified() => {}
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
            let now = self.distinct();
            if now != last {
                last = now;
                last_change = Instant::now();
            } else if last_change.elapsed() >= stall {
                return self.completed_at.get().is_some();
            }
        }
    }
}
