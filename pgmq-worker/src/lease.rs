//! The deliveries this worker holds, from handler start until their
//! acknowledgement is written.
//!
//! A lease is one delivery ([`Receipt`]: the message id and the
//! `last_read_at` of the read that claimed it) with the local estimate of
//! when its visibility timeout ends, its state, and the cancellation token of
//! its handler run. The heartbeat extends the leases near their end; the
//! completer marks them while it writes and drops them once written; the
//! shutdown lists and cancels the running ones.
//!
//! **States and the heartbeat.** `Running` (the handler runs) and `Acking`
//! (its acknowledgement waits for, or is in, a delete, archive or
//! dead-letter write) are extended: an acknowledgement waiting behind a
//! slow database does not let the claim expire. `Settling` (a retry, snooze
//! or release is being written, which sets the visibility itself) is not:
//! the heartbeat's extension would overwrite the delay. The completer marks
//! leases `Settling` and then waits for any heartbeat write in flight
//! ([`HeartbeatSignals::after_write`](crate::heartbeat::HeartbeatSignals::after_write)), so
//! no extension lands after the retry's own write.
//!
//! `Locked` (a transactional batch holds the message's row locked in its
//! transaction) is not extended either: no other consumer can claim a
//! locked row (PGMQ's reads skip them), and the extension's `UPDATE` would
//! wait for the transaction. It counts as running for the shutdown (its
//! handler runs). The batch loop marks leases `Locked` and then waits for
//! any heartbeat write in flight before it takes the locks, as the
//! completer does for `Settling`.
//!
//! **Lost claims.** A fenced write that matches nothing means another
//! delivery holds the message now. The heartbeat reports a lost claim only
//! for leases still `Running` after its write returned (a lease whose
//! acknowledgement is on the way is judged by that write alone), and marks
//! it lost so that nothing counts it twice.
//!
//! **The claim's end.** Each lease carries an [`Expiry`]: when its claim
//! may end, by this process's monotonic clock, counted from the instant the
//! read that claimed it was sent (or the last extension was sent) plus the
//! visibility timeout; the database set the timeout after that instant, so
//! the claim is this worker's at least until then. A worker under a
//! fleet-wide limit of places fences its runs on it (`fence.rs`): for it
//! (`fence` set), a lease whose end less the fence's margin has passed is
//! not extended any more, and an extension that returned after that
//! moment moves nothing, since the claim may have ended (and its place
//! been counted free) before the extension landed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use pgmq_client::Receipt;
use tokio_util::sync::CancellationToken;

/// Where a lease is in its life (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Running,
    Acking,
    Settling,
    /// Running, its row locked by a transactional batch: not extended.
    Locked,
}

/// When a delivery's claim may end, by this process's monotonic clock (a
/// local estimate on the early side: see the module docs); shared by its
/// lease, which the heartbeat extends, and its fenced run, which reads it
/// on every poll.
#[derive(Debug)]
pub(crate) struct Expiry {
    origin: Instant,
    /// The end, in µs after `origin`; it only moves later.
    after_us: AtomicU64,
}

impl Expiry {
    /// A claim that ends at `at` unless extended.
    pub(crate) fn new(at: Instant) -> Arc<Expiry> {
        Arc::new(Expiry {
            origin: at,
            after_us: AtomicU64::new(0),
        })
    }

    /// When the claim may end, as last extended.
    pub(crate) fn at(&self) -> Instant {
        self.origin + Duration::from_micros(self.after_us.load(Ordering::Acquire))
    }

    /// Whether the claim may have ended by `now`, less `margin`.
    pub(crate) fn passed(&self, now: Instant, margin: Duration) -> bool {
        now + margin >= self.at()
    }

    /// An extension sent so as to end at `to` (its send instant plus the
    /// visibility timeout) returned at `returned`: moves the end to `to`
    /// if later, except under a fence of `margin` when the extension
    /// returned after the end less the margin (the claim may have ended
    /// before it landed). False when refused so.
    fn extend(&self, to: Instant, returned: Instant, margin: Option<Duration>) -> bool {
        let to_us = u64::try_from(to.saturating_duration_since(self.origin).as_micros())
            .unwrap_or(u64::MAX);
        let mut cur = self.after_us.load(Ordering::Acquire);
        loop {
            let end = self.origin + Duration::from_micros(cur);
            if margin.is_some_and(|m| returned + m >= end) {
                return false;
            }
            if to_us <= cur {
                return true;
            }
            match self.after_us.compare_exchange_weak(
                cur,
                to_us,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }
}

struct Lease {
    read_at: DateTime<Utc>,
    /// When the claim may end.
    expiry: Arc<Expiry>,
    state: State,
    /// The handler run's cancellation (fired when the claim is lost).
    cancel: CancellationToken,
    lost: bool,
}

/// Every lease of one worker, by message id.
#[derive(Default)]
pub(crate) struct Leases {
    map: Mutex<HashMap<i64, Lease>>,
    /// The fence's margin, for a worker whose runs are fenced on their
    /// claims' ends (`fence.rs`); None otherwise.
    fence: Option<Duration>,
}

impl Leases {
    /// The leases of a worker fenced with `fence`'s margin (None: not
    /// fenced).
    pub(crate) fn new(fence: Option<Duration>) -> Self {
        Leases {
            map: Mutex::default(),
            fence,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Lease>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A handler starts on this delivery, whose claim ends at `expiry`.
    pub(crate) fn start(&self, r: Receipt, expiry: Arc<Expiry>, cancel: CancellationToken) {
        self.lock().insert(
            r.msg_id,
            Lease {
                read_at: r.read_at,
                expiry,
                state: State::Running,
                cancel,
                lost: false,
            },
        );
    }

    /// Moves the leases of these deliveries to `state` (those that are
    /// still this worker's).
    pub(crate) fn set_state(&self, receipts: impl IntoIterator<Item = Receipt>, state: State) {
        let mut map = self.lock();
        for r in receipts {
            if let Some(l) = map.get_mut(&r.msg_id) {
                if l.read_at == r.read_at {
                    l.state = state;
                }
            }
        }
    }

    /// Drops the leases of these deliveries (their acknowledgement was
    /// written, or given up); returns those of them that were already
    /// reported lost.
    pub(crate) fn finish(&self, receipts: impl IntoIterator<Item = Receipt>) -> Vec<i64> {
        let mut map = self.lock();
        let mut already_lost = Vec::new();
        for r in receipts {
            if let std::collections::hash_map::Entry::Occupied(e) = map.entry(r.msg_id) {
                if e.get().read_at == r.read_at {
                    if e.get().lost {
                        already_lost.push(r.msg_id);
                    }
                    e.remove();
                }
            }
        }
        already_lost
    }

    /// The leases to extend at `now`: `Running` or `Acking`, not lost,
    /// ending within `ahead`; under a fence, not those whose end less the
    /// margin has passed (their runs are stopped: see the module docs).
    pub(crate) fn due(&self, now: Instant, ahead: Duration, out: &mut Vec<Receipt>) {
        out.clear();
        for (id, l) in self.lock().iter() {
            let extend = matches!(l.state, State::Running | State::Acking);
            let lapsed = self.fence.is_some_and(|m| l.expiry.passed(now, m));
            if extend && !l.lost && !lapsed && l.expiry.at() <= now + ahead {
                out.push(Receipt {
                    msg_id: *id,
                    read_at: l.read_at,
                });
            }
        }
    }

    /// Records the heartbeat's result, returned at `returned`: `extended`
    /// end at `deadline` now (unless the fence refuses it: see the module
    /// docs); of the others, the ones still `Running` are lost (marked,
    /// cancelled and returned).
    pub(crate) fn extended(
        &self,
        asked: &[Receipt],
        extended: &[i64],
        deadline: Instant,
        returned: Instant,
    ) -> Vec<i64> {
        let mut map = self.lock();
        let mut lost = Vec::new();
        for r in asked {
            let Some(l) = map.get_mut(&r.msg_id) else {
                continue;
            };
            if l.read_at != r.read_at {
                continue;
            }
            if extended.contains(&r.msg_id) {
                l.expiry.extend(deadline, returned, self.fence);
            } else if l.state == State::Running && !l.lost {
                l.lost = true;
                l.cancel.cancel();
                lost.push(r.msg_id);
            }
        }
        lost
    }

    /// The ids of the messages whose handlers run now.
    pub(crate) fn running(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self
            .lock()
            .iter()
            .filter(|(_, l)| matches!(l.state, State::Running | State::Locked))
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Fires the cancellation of every running handler (immediate shutdown).
    pub(crate) fn cancel_running(&self) {
        for l in self.lock().values() {
            if matches!(l.state, State::Running | State::Locked) {
                l.cancel.cancel();
            }
        }
    }

    /// Whether this delivery's lease was reported lost.
    #[cfg(test)]
    fn is_lost(&self, r: Receipt) -> bool {
        self.lock()
            .get(&r.msg_id)
            .is_some_and(|l| l.read_at == r.read_at && l.lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt(id: i64, us: i64) -> Receipt {
        Receipt {
            msg_id: id,
            read_at: DateTime::from_timestamp_micros(us).unwrap(),
        }
    }

    /// `us` microseconds after `t0`.
    fn at(t0: Instant, us: u64) -> Instant {
        t0 + std::time::Duration::from_micros(us)
    }

    #[test]
    fn only_running_leases_are_lost_and_settling_ones_are_not_extended() {
        let leases = Leases::default();
        let t0 = Instant::now();
        let (a, b, c) = (receipt(1, 10), receipt(2, 20), receipt(3, 30));
        let tokens: Vec<_> = (0..3).map(|_| CancellationToken::new()).collect();
        leases.start(a, Expiry::new(at(t0, 100)), tokens[0].clone());
        leases.start(b, Expiry::new(at(t0, 100)), tokens[1].clone());
        leases.start(c, Expiry::new(at(t0, 100)), tokens[2].clone());
        leases.set_state([b], State::Acking);
        leases.set_state([c], State::Settling);
        let d = receipt(4, 40);
        leases.start(d, Expiry::new(at(t0, 100)), CancellationToken::new());
        leases.set_state([d], State::Locked);
        let mut due = Vec::new();
        leases.due(t0, Duration::from_micros(1000), &mut due);
        due.sort_by_key(|r| r.msg_id);
        // Neither the settling one nor the locked one is extended.
        assert_eq!(due, vec![a, b]);
        // Neither matched: the running one is lost, the acking one is left
        // to its own write.
        let lost = leases.extended(&due, &[], at(t0, 2000), t0);
        assert_eq!(lost, vec![1]);
        assert!(tokens[0].is_cancelled() && !tokens[1].is_cancelled());
        assert!(leases.is_lost(a) && !leases.is_lost(b));
        // Reported once: not due again, and flagged when finished.
        leases.due(t0, Duration::from_micros(1000), &mut due);
        assert_eq!(due, vec![b]);
        assert_eq!(leases.finish([a, b]), vec![1]);
        // A locked lease's handler runs: the shutdown lists it.
        assert_eq!(leases.running(), vec![4]);
        leases.finish([c, d]);
        assert!(leases.running().is_empty());
    }

    #[test]
    fn under_a_fence_a_lapsed_claim_is_neither_due_nor_extended() {
        let margin = Duration::from_millis(50);
        let leases = Leases::new(Some(margin));
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let (a, b) = (receipt(1, 10), receipt(2, 20));
        let (ea, eb) = (Expiry::new(ms(1000)), Expiry::new(ms(1000)));
        leases.start(a, Arc::clone(&ea), CancellationToken::new());
        leases.start(b, Arc::clone(&eb), CancellationToken::new());
        let mut due = Vec::new();
        leases.due(ms(600), Duration::from_millis(500), &mut due);
        due.sort_by_key(|r| r.msg_id);
        assert_eq!(due, vec![a, b]);
        // One extension returned in time, the other after the end less
        // the margin: that one moves nothing.
        leases.extended(&[a], &[1], ms(2600), ms(900));
        leases.extended(&[b], &[2], ms(2600), ms(960));
        assert_eq!((ea.at(), eb.at()), (ms(2600), ms(1000)));
        assert!(eb.passed(ms(950), margin) && !ea.passed(ms(950), margin));
        // The lapsed one is not due any more; the other is, later.
        leases.due(ms(2200), Duration::from_millis(500), &mut due);
        assert_eq!(due, vec![a]);
        // Without a fence, a late extension still counts (as before).
        let plain = Leases::default();
        let e = Expiry::new(ms(1000));
        plain.start(b, Arc::clone(&e), CancellationToken::new());
        plain.extended(&[b], &[2], ms(2600), ms(1500));
        assert_eq!(e.at(), ms(2600));
    }

    #[test]
    fn a_newer_delivery_of_the_same_message_is_not_touched_by_the_old_one() {
        let leases = Leases::default();
        let old = receipt(5, 1);
        let new = receipt(5, 2);
        leases.start(new, Expiry::new(Instant::now()), CancellationToken::new());
        leases.set_state([old], State::Settling);
        assert!(leases.finish([old]).is_empty());
        assert_eq!(leases.running(), vec![5]);
    }
}
