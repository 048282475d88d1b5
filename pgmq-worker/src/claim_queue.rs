//! The claim queue: claimed messages waiting for a handler.
//!
//! A claimer pushes a whole batch at once, under one lock, and wakes as
//! many waiting handler loops as the batch needs ([`loops_for`]): enough
//! to work through it within [`WAKE_BUDGET`] at the current average
//! handler time, at most one per message and at most every loop. A handler
//! loop takes one message at a time and waits only when the queue is
//! empty; one that takes a message that has already waited longer than the
//! budget wakes one more loop, so a batch whose handlers turn out slower
//! than the average said still gets every loop within a few wake-ups. So a
//! batch of 100 costs one lock and a few wake-ups, not a notification per
//! message; and fast handlers do not wake every loop for work that one
//! finishes in a fraction of a millisecond. The client's CPU is taken from
//! the database when both share a host: per-message signalling through a
//! channel would be a large part of the worker's own work, and every loop
//! woken is a thread woken on another core.
//!
//! **Its own permits.** The queue owns its free room ([`Room`]): a
//! semaphore of `claim_capacity` permits. A claimer takes permits before it
//! reads and pushes the messages with them; taking a message out of the
//! queue (a handler loop's pop, the shutdown's drain) gives its permit
//! back. So the queue never holds more than `claim_capacity`, and the
//! handler loops never touch the claimers' state.
//!
//! **Its drain rate.** The handler loops record how long their runs take
//! ([`ClaimQueue::record_run`], a moving average); the queue uses it to
//! wake as many loops as a batch needs, and the claimers to claim only
//! what the handlers will start in time.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pgmq_client::{Message, RawJson, Receipt};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// A message in the claim queue.
pub(crate) struct Claimed {
    pub msg: Message<RawJson>,
    /// The delivery: every write about this message is fenced on it.
    pub receipt: Receipt,
    /// When the read that claimed it returned.
    pub claimed_at: Instant,
    /// When the read that claimed it was sent: the database set the
    /// message's visibility timeout after this, so the claim lasts at
    /// least until this plus the timeout (the fence, `fence.rs`, counts
    /// from it).
    pub sent_at: Instant,
}

/// How long a woken loop may take to work through its share of a batch
/// before another loop is woken for it.
pub(crate) const WAKE_BUDGET: Duration = Duration::from_micros(100);

/// How many loops to wake for `n` new messages when handlers take
/// `avg_us` on average (0: not known yet, wake as many as can start).
pub(crate) fn loops_for(n: usize, avg_us: u64, loops: usize) -> usize {
    let most = n.min(loops);
    if avg_us == 0 {
        return most;
    }
    let work_us = (n as u64).saturating_mul(avg_us);
    let budget_us = WAKE_BUDGET.as_micros() as u64;
    let want = work_us.div_ceil(budget_us);
    usize::try_from(want)
        .unwrap_or(usize::MAX)
        .clamp(1, most.max(1))
}

/// The moving average of handler run time: recorded by the handler loops,
/// read by the queue (how many loops a batch wakes) and by the claim loops
/// (how much to claim).
#[derive(Default)]
struct HandlerTime {
    avg_us: AtomicU64,
}

impl HandlerTime {
    /// Folds one handler run time into the moving average (weight 1/8).
    fn record(&self, us: u64) {
        let us = us.max(1);
        let old = self.avg_us.load(Relaxed);
        let new = if old == 0 { us } else { (old * 7 + us) / 8 };
        if new != old {
            self.avg_us.store(new.max(1), Relaxed);
        }
    }

    /// The average in µs; 0 until the first handler run ends.
    fn average_us(&self) -> u64 {
        self.avg_us.load(Relaxed)
    }
}

/// The free room of the claim queue, in messages.
///
/// A semaphore of `claim_capacity` permits, of which `withheld` are kept
/// back (acquired and forgotten) to lower the room to the current claim
/// limit; they are handed back when the limit rises.
pub(crate) struct Room {
    sem: Arc<Semaphore>,
    capacity: usize,
    withheld: Mutex<usize>,
}

impl Room {
    fn new(capacity: usize) -> Self {
        Room {
            sem: Arc::new(Semaphore::new(capacity)),
            capacity,
            withheld: Mutex::new(0),
        }
    }

    /// Messages left the claim queue.
    fn free(&self, n: usize) {
        self.sem.add_permits(n);
    }

    /// Moves the room towards `limit` messages in all (queued + free).
    pub(crate) fn limit_to(&self, limit: usize) {
        let target = self.capacity - limit.clamp(1, self.capacity);
        let mut withheld = self.withheld.lock().unwrap_or_else(|p| p.into_inner());
        if *withheld > target {
            self.sem.add_permits(*withheld - target);
            *withheld = target;
        } else if *withheld < target {
            // Only what is free now; the rest on later calls, as handlers
            // take messages.
            let take = (target - *withheld).min(self.sem.available_permits());
            if take > 0 {
                if let Ok(p) = self.sem.try_acquire_many(take as u32) {
                    p.forget();
                    *withheld += take;
                }
            }
        }
    }

    /// `n` permits if they are free now.
    pub(crate) fn try_take(&self, n: usize) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.sem).try_acquire_many_owned(n as u32).ok()
    }

    /// `n` permits, waiting for them.
    pub(crate) async fn take(&self, n: usize) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.sem)
            .acquire_many_owned(n as u32)
            .await
            .ok()
    }

    /// Adds to `permits` what is free now, up to `extra` more.
    pub(crate) fn top_up(&self, permits: &mut OwnedSemaphorePermit, extra: usize) {
        let extra = self.sem.available_permits().min(extra);
        if extra > 0 {
            if let Some(more) = self.try_take(extra) {
                permits.merge(more);
            }
        }
    }
}

/// What the claim queue reads.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// `claim_capacity`: its permits.
    pub capacity: usize,
    /// `concurrency`: the most loops one push wakes.
    pub handlers: usize,
}

/// Generic over the item so that its tests need no database; the worker
/// queues [`Claimed`].
pub(crate) struct ClaimQueue<T> {
    state: Mutex<State<T>>,
    /// Handler loops waiting for a message.
    ready: Notify,
    /// The number of handler loops: the most one push needs to wake.
    handlers: usize,
    /// Free room; every queued message holds one of its permits.
    room: Room,
    handler_time: HandlerTime,
}

struct State<T> {
    items: VecDeque<T>,
    closed: bool,
}

impl<T> ClaimQueue<T> {
    pub(crate) fn new(capacity: usize, handlers: usize) -> Self {
        ClaimQueue {
            state: Mutex::new(State {
                items: VecDeque::with_capacity(capacity),
                closed: false,
            }),
            ready: Notify::new(),
            handlers: handlers.max(1),
            room: Room::new(capacity),
            handler_time: HandlerTime::default(),
        }
    }

    /// A queue as `settings` say.
    pub(crate) fn with(settings: &Settings) -> Self {
        Self::new(settings.capacity, settings.handlers)
    }

    /// The free room, for the claimers.
    pub(crate) fn room(&self) -> &Room {
        &self.room
    }

    /// A handler run took `us`: folded into the moving average.
    pub(crate) fn record_run(&self, us: u64) {
        self.handler_time.record(us);
    }

    /// The average handler run time in µs; 0 until the first run ends.
    pub(crate) fn average_run_us(&self) -> u64 {
        self.handler_time.average_us()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many messages wait now.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn len(&self) -> usize {
        self.lock().items.len()
    }

    /// Queues a claimed batch, each message holding a permit of the room,
    /// and wakes the loops it needs ([`loops_for`] at the average handler
    /// time); false (and nothing queued) once closed.
    pub(crate) fn push_batch<I>(&self, batch: I) -> bool
    where
        I: IntoIterator<Item = T>,
        I::IntoIter: ExactSizeIterator,
    {
        let batch = batch.into_iter();
        let wake = loops_for(batch.len(), self.average_run_us(), self.handlers);
        self.push_waking(batch, wake)
    }

    /// Queues a batch and wakes up to `wake` waiting loops (at least one,
    /// at most one per message); false (and nothing queued) once closed.
    fn push_waking(&self, batch: impl IntoIterator<Item = T>, wake: usize) -> bool {
        let added = {
            let mut st = self.lock();
            if st.closed {
                return false;
            }
            let before = st.items.len();
            st.items.extend(batch);
            st.items.len() - before
        };
        // Each wakes one waiting loop; with none waiting, the first leaves a
        // single permit (one spare look later) and the rest cost an atomic.
        for _ in 0..wake.clamp(1, self.handlers).min(added) {
            self.ready.notify_one();
        }
        true
    }

    /// Wakes one more waiting loop (a taken message had waited too long).
    pub(crate) fn wake_one(&self) {
        self.ready.notify_one();
    }

    /// The next message, if one is queued now, and how many are left; its
    /// permit goes back to the room.
    pub(crate) fn try_pop(&self) -> Option<(T, usize)> {
        let mut st = self.lock();
        let item = st.items.pop_front()?;
        let left = st.items.len();
        drop(st);
        self.room.free(1);
        Some((item, left))
    }

    /// Moves what is queued now into `out`, until it holds `max` (a batch
    /// handler's batch), under one lock; their permits go back to the room.
    /// Returns how many are left queued.
    pub(crate) fn try_pop_many(&self, out: &mut Vec<T>, max: usize) -> usize {
        let mut st = self.lock();
        let take = max.saturating_sub(out.len()).min(st.items.len());
        out.extend(st.items.drain(..take));
        let left = st.items.len();
        drop(st);
        if take > 0 {
            self.room.free(take);
        }
        left
    }

    /// The next message, waiting for one (its permit goes back to the
    /// room); `None` once the queue is closed
    /// and empty. Cancel-safe: a wake-up received by a loop that stops
    /// waiting is passed on to another waiting loop (tokio's `Notify` does
    /// this for `notify_one`).
    pub(crate) async fn pop(&self) -> Option<(T, usize)> {
        loop {
            let notified = self.ready.notified();
            tokio::pin!(notified);
            // Registered before looking, so a push after the look wakes it.
            notified.as_mut().enable();
            {
                let mut st = self.lock();
                if let Some(item) = st.items.pop_front() {
                    let left = st.items.len();
                    drop(st);
                    self.room.free(1);
                    return Some((item, left));
                }
                if st.closed {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Takes everything queued (at shutdown, to release it); their permits
    /// go back to the room.
    pub(crate) fn drain(&self) -> Vec<T> {
        let all: Vec<T> = self.lock().items.drain(..).collect();
        self.room.free(all.len());
        all
    }

    /// Refuses further pushes and wakes every waiting loop; what is queued
    /// can still be taken.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::{loops_for, ClaimQueue};

    /// A batch wakes the loops that finish it within the budget: one for
    /// an empty handler, all of them for slow handlers or when the handler
    /// time is not known yet; never more than one per message.
    #[test]
    fn a_batch_wakes_the_loops_it_needs() {
        assert_eq!(loops_for(100, 1, 8), 1);
        assert_eq!(loops_for(100, 2, 8), 2);
        assert_eq!(loops_for(100, 0, 8), 8);
        assert_eq!(loops_for(100, 1_000, 8), 8);
        assert_eq!(loops_for(3, 1_000, 8), 3);
        assert_eq!(loops_for(3, 0, 8), 3);
        assert_eq!(loops_for(100, 5, 1), 1);
    }

    /// Handler-like loops whose waits are often cut short (as the
    /// handler loop's merge timer does) still take every pushed item, and once
    /// the cuts stop, loops that only wait are woken by every push: no
    /// wake-up is lost, whether a batch is smaller or larger than the
    /// number of loops.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cancelled_waits_lose_no_item() {
        const LOOPS: usize = 8;
        let q = Arc::new(ClaimQueue::<u32>::new(300, LOOPS));
        let taken = Arc::new(AtomicUsize::new(0));
        let cutting = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let mut tasks = Vec::new();
        for i in 0..LOOPS {
            let (q, taken, cutting) = (Arc::clone(&q), Arc::clone(&taken), Arc::clone(&cutting));
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                loop {
                    n += 1;
                    let item = if cutting.load(Ordering::Relaxed) {
                        let cut = Duration::from_micros(50 + (n * 37 + i as u64 * 11) % 400);
                        tokio::select! {
                            biased;
                            item = q.pop() => item.map(|(i, _)| i),
                            _ = tokio::time::sleep(cut) => continue,
                        }
                    } else {
                        q.pop().await.map(|(i, _)| i)
                    };
                    match item {
                        Some(_) => {
                            taken.fetch_add(1, Ordering::Relaxed);
                        }
                        None => break,
                    }
                }
            }));
        }
        let push = |round: u32, pushed: &mut usize| {
            let n = [1usize, 3, 8, 100][round as usize % 4];
            // Waking every loop, or one (fast handlers): either way the
            // batch is taken.
            let wake = if round.is_multiple_of(3) { 1 } else { n };
            assert!(q.push_waking((0..n as u32).map(|k| round * 1000 + k), wake));
            *pushed += n;
        };
        let wait_all = |pushed: usize| {
            let taken = Arc::clone(&taken);
            async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                while taken.load(Ordering::Relaxed) < pushed
                    && tokio::time::Instant::now() < deadline
                {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                taken.load(Ordering::Relaxed)
            }
        };
        // Phase 1: waits cut short all the time.
        let mut pushed = 0;
        for round in 0..400u32 {
            push(round, &mut pushed);
            if round % 7 == 0 {
                tokio::time::sleep(Duration::from_micros(300)).await;
            }
        }
        assert_eq!(wait_all(pushed).await, pushed);
        // Phase 2: the loops only wait; only pushes can wake them.
        cutting.store(false, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(20)).await;
        for round in 0..200u32 {
            push(round, &mut pushed);
            if round.is_multiple_of(3) {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        }
        assert_eq!(wait_all(pushed).await, pushed);
        q.close();
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(5), t)
                .await
                .expect("a loop did not see the close")
                .unwrap();
        }
    }

    /// A loop that waits and is never cut short is woken by a push.
    #[tokio::test]
    async fn a_push_wakes_a_waiting_loop() {
        let q = Arc::new(ClaimQueue::<u32>::new(10, 2));
        let waiter = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.pop().await.map(|(i, _)| i) }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(q.push_batch([7]));
        let got = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiting loop was not woken")
            .unwrap();
        assert_eq!(got, Some(7));
    }

    /// A batch takes what is queued, up to its size, and says what is left.
    #[test]
    fn a_batch_takes_up_to_its_size() {
        let q = ClaimQueue::<u32>::new(10, 2);
        assert!(q.push_batch([1, 2, 3, 4, 5]));
        let mut batch = vec![0];
        assert_eq!(q.try_pop_many(&mut batch, 3), 3);
        assert_eq!(batch, vec![0, 1, 2]);
        assert_eq!(q.try_pop_many(&mut batch, 10), 0);
        assert_eq!(batch, vec![0, 1, 2, 3, 4, 5]);
        // Every permit is back: the room is whole again.
        assert!(q.room().try_take(10).is_some());
    }

    /// Closing refuses pushes and ends waits; what was queued can still be
    /// drained (the shutdown releases it).
    #[tokio::test]
    async fn close_refuses_pushes_and_keeps_what_is_queued() {
        let q = Arc::new(ClaimQueue::<u32>::new(10, 2));
        assert!(q.push_batch([1, 2, 3]));
        assert_eq!(q.try_pop(), Some((1, 2)));
        q.close();
        assert!(!q.push_batch([4]));
        assert_eq!(q.drain(), vec![2, 3]);
        assert_eq!(q.pop().await, None);
        assert_eq!(q.try_pop(), None);
    }
}
