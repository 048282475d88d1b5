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
//! The queue itself is not bounded: the claimers' room ([`crate::claimer`])
//! is. Every message in it holds a permit of that room, so it never holds
//! more than `claim_capacity`.

use std::collections::VecDeque;
use std::sync::Mutex;

use std::time::Duration;

use tokio::sync::Notify;

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

/// Generic over the item so that its tests need no database; the worker
/// queues [`crate::claimer::Claimed`].
pub(crate) struct ClaimQueue<T> {
    state: Mutex<State<T>>,
    /// Handler loops waiting for a message.
    ready: Notify,
    /// The number of handler loops: the most one push needs to wake.
    handlers: usize,
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
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many messages wait now.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn len(&self) -> usize {
        self.lock().items.len()
    }

    /// Queues a claimed batch and wakes up to `wake` waiting loops (at
    /// least one, at most one per message); false (and nothing queued) once
    /// closed.
    pub(crate) fn push_batch(&self, batch: impl IntoIterator<Item = T>, wake: usize) -> bool {
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

    /// The next message, if one is queued now, and how many are left.
    pub(crate) fn try_pop(&self) -> Option<(T, usize)> {
        let mut st = self.lock();
        let item = st.items.pop_front()?;
        let left = st.items.len();
        Some((item, left))
    }

    /// The next message, waiting for one; `None` once the queue is closed
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
                    return Some((item, left));
                }
                if st.closed {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Takes everything queued (at shutdown, to release it).
    pub(crate) fn drain(&self) -> Vec<T> {
        self.lock().items.drain(..).collect()
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
    /// executor's merge timer does) still take every pushed item, and once
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
            assert!(q.push_batch((0..n as u32).map(|k| round * 1000 + k), wake));
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
        assert!(q.push_batch([7], 1));
        let got = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiting loop was not woken")
            .unwrap();
        assert_eq!(got, Some(7));
    }

    /// Closing refuses pushes and ends waits; what was queued can still be
    /// drained (the shutdown releases it).
    #[tokio::test]
    async fn close_refuses_pushes_and_keeps_what_is_queued() {
        let q = Arc::new(ClaimQueue::<u32>::new(10, 2));
        assert!(q.push_batch([1, 2, 3], 3));
        assert_eq!(q.try_pop(), Some((1, 2)));
        q.close();
        assert!(!q.push_batch([4], 1));
        assert_eq!(q.drain(), vec![2, 3]);
        assert_eq!(q.pop().await, None);
        assert_eq!(q.try_pop(), None);
    }
}
