//! The fence of a worker under a fleet-wide limit of places
//! ([`FleetLimit::max_running`](pgmq_client::FleetLimit::max_running)):
//! a handler run stops when its claim may have ended.
//!
//! The limit counts a claim while its message's visibility timeout is
//! ahead, by the database's clock; once it has passed, another process may
//! take the place. A process that could not extend its claim in time (its
//! connection frozen, the process stopped by SIGSTOP or paused by its
//! host) would otherwise go on running the handler beside the one that
//! took the place, and the fleet would run more than `max_running`
//! handlers while the database counted `max_running`.
//!
//! So each run knows, by this process's monotonic clock, the latest moment
//! its claim is surely still its own: the instant the read that claimed it
//! was sent, or the last extension that returned in time was sent, plus the
//! visibility timeout (the database set the timeout after that instant),
//! less a [`margin`] for the clocks' drift ([`Expiry`]). [`Fenced`] wraps
//! the run's future and looks at that moment on every poll, before polling
//! the run: once it has passed, the run is not polled again and is dropped
//! at once. A timer at that moment ends a run that nothing else wakes, and
//! the look before every poll covers the wake-ups that race with the timer:
//! a process stopped and continued after the moment does not poll its run
//! once more, whichever of the run's wake-ups comes first. Only a poll
//! already in progress when the process was stopped finishes. An extension
//! that returns after the moment extends nothing (`lease.rs`).
//!
//! A stopped run's message is not acknowledged by this process: its
//! delivery may be someone else's now (and the fenced writes would find
//! nothing of it to match). It is counted in `stopped_at_claim_end`,
//! logged as a warning, and comes back when its visibility timeout passes,
//! if no one took it already.
//!
//! **Which runs stop.** An async run (a [`Handler`](crate::Handler),
//! [`HandlerWithContext`](crate::HandlerWithContext), a transactional or a
//! batch handler) stops at the moment: it is dropped (its
//! [`Context`](crate::Context) is cancelled for work it spawned, and a
//! transactional run's transaction is rolled back with its connection
//! discarded). A batch run stops at the earliest moment among its
//! messages, none of which is acknowledged. A [`BlockingHandler`]'s thread
//! cannot be stopped: its run is abandoned at the moment and the thread
//! runs on, so the place may be taken by another process while it does;
//! its loop waits for the thread to return before it takes another
//! message, so this process starts no run on that loop meanwhile.
//!
//! [`BlockingHandler`]: crate::BlockingHandler
//! [`Expiry`]: crate::lease::Expiry

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::lease::Expiry;

/// How early a run stops before its claim may end: a twentieth of the
/// visibility timeout, at most a second, for the drift between this
/// process's clock and the database's over one timeout and for the moment
/// between the look and the poll.
pub(crate) fn margin(visibility_timeout: Duration) -> Duration {
    (visibility_timeout / 20).min(Duration::from_secs(1))
}

/// A run bounded by the ends of its claims: yields the run's output, or
/// `None` once the earliest end less the margin has passed (see the module
/// docs).
pub(crate) struct Fenced<F> {
    /// The run; dropped as soon as the fence has passed.
    run: Option<Pin<Box<F>>>,
    /// The claims the run holds.
    ends: Vec<Arc<Expiry>>,
    margin: Duration,
    /// Wakes the run at the fence, so that one nothing else wakes stops.
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl<F: Future> Fenced<F> {
    /// `run` on the claims ending at `ends`, stopped `margin` before the
    /// earliest of them (as extended meanwhile).
    pub(crate) fn new(run: F, ends: Vec<Arc<Expiry>>, margin: Duration) -> Self {
        let mut fenced = Fenced {
            run: Some(Box::pin(run)),
            ends,
            margin,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
        };
        let at = fenced.fence();
        fenced.timer.as_mut().reset(at.into());
        fenced
    }

    /// The moment the run stops, now: the earliest end less the margin.
    fn fence(&self) -> Instant {
        let end = self.ends.iter().map(|e| e.at()).min();
        let end = end.unwrap_or_else(Instant::now);
        end.checked_sub(self.margin).unwrap_or(end)
    }
}

impl<F: Future> Future for Fenced<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            // Before every poll of the run: a process stopped past the
            // fence does not poll its run again, whatever woke it.
            let fence = this.fence();
            if Instant::now() >= fence {
                this.run = None;
                return Poll::Ready(None);
            }
            let Some(run) = this.run.as_mut() else {
                return Poll::Ready(None);
            };
            if let Poll::Ready(out) = run.as_mut().poll(cx) {
                this.run = None;
                return Poll::Ready(Some(out));
            }
            let armed = this.timer.deadline().into_std();
            if armed != fence {
                // Extended since the timer was set.
                this.timer.as_mut().reset(fence.into());
            }
            if this.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if this.fence() <= fence {
                // The timer fired at the fence, which has not moved.
                this.run = None;
                return Poll::Ready(None);
            }
        }
    }
}

/// `run`, fenced on `ends` when the worker is (`margin` given): its output,
/// or `None` when the fence stopped it.
pub(crate) async fn bounded<F: Future>(
    run: F,
    margin: Option<Duration>,
    ends: impl FnOnce() -> Vec<Arc<Expiry>>,
) -> Option<F::Output> {
    match margin {
        None => Some(run.await),
        Some(m) => Fenced::new(run, ends(), m).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

    /// A run that counts its polls and never ends by itself.
    fn counted(polls: &Arc<AtomicU32>) -> impl Future<Output = ()> {
        let polls = Arc::clone(polls);
        std::future::poll_fn(move |cx| {
            polls.fetch_add(1, Relaxed);
            cx.waker().wake_by_ref();
            Poll::<()>::Pending
        })
    }

    #[tokio::test]
    async fn a_run_past_its_fence_is_not_polled_again() {
        let polls = Arc::new(AtomicU32::new(0));
        let end = Expiry::new(Instant::now() + Duration::from_millis(200));
        let mut fenced = Box::pin(Fenced::new(
            counted(&polls),
            vec![Arc::clone(&end)],
            Duration::from_millis(50),
        ));
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(fenced.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Relaxed), 1);
        // The process "stops" past the fence; the first poll after it
        // does not reach the run.
        std::thread::sleep(Duration::from_millis(200));
        assert!(matches!(fenced.as_mut().poll(&mut cx), Poll::Ready(None)));
        assert_eq!(polls.load(Relaxed), 1);
        assert!(fenced.run.is_none(), "the run is dropped at once");
    }

    #[tokio::test]
    async fn the_timer_stops_a_run_nothing_wakes() {
        let margin = margin(Duration::from_secs(2));
        let start = Instant::now();
        let end = Expiry::new(start + Duration::from_millis(300));
        let out = Fenced::new(std::future::pending::<()>(), vec![end], margin).await;
        assert!(out.is_none());
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(200), "{took:?}");
        // A run that ends first gives its output.
        let end = Expiry::new(Instant::now() + Duration::from_secs(5));
        let out = Fenced::new(async { 7 }, vec![end], margin).await;
        assert_eq!(out, Some(7));
    }

    #[test]
    fn the_margin_is_a_twentieth_of_the_timeout_at_most_a_second() {
        assert_eq!(margin(Duration::from_secs(2)), Duration::from_millis(100));
        assert_eq!(margin(Duration::from_secs(60)), Duration::from_secs(1));
    }
}
