//! Wakes idle claimers when PGMQ notifies an insert.
//!
//! One dedicated connection (outside the pool) LISTENs on the queue's insert
//! channel. A notification wakes every parked claimer at once; notifications
//! that arrived meanwhile are folded into that one wake-up, and the next
//! wake-up comes at most once per [`DEBOUNCE`], so a burst of inserts costs a
//! few reads, not one per insert. When the connection drops, the notifier
//! reconnects with backoff (100 ms doubling to 10 s) and wakes the claimers
//! once after reconnecting, since notifications sent meanwhile were lost.
//! Polling stays on throughout: PGMQ does not notify when a delayed message or
//! an expired visibility timeout makes a message visible.
//!
//! PGMQ's trigger notifies at most once per throttle window: a message sent
//! within the window after a notification gets none. So, when the queue's
//! throttle is shorter than the poll interval, the notifier wakes the
//! claimers once more one throttle interval after the last notification,
//! when the window that kept those inserts silent has closed: a message
//! committed inside a window is found within about one throttle interval
//! rather than one poll interval. (One committed after its window closed, by
//! a transaction that inserted before, waits for the next notification or
//! the poll.)

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use futures::FutureExt;
use pgmq_client::Listener;
use tokio_util::sync::CancellationToken;

use pgmq_client::QueueName;
use tokio::task::JoinHandle;

use crate::backoff::ErrorBackoff;
use crate::db::Source;
use crate::stats::{bump, Stats};
use crate::supervise::Supervisor;
use crate::wake::Wake;

/// What the notifier reads.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub queue: QueueName,
    /// The claimers' poll interval: a throttle this long or longer needs
    /// no follow-up read.
    pub poll_interval: Duration,
}

/// The notifier: its settings and the handles it touches.
pub(crate) struct Notifier {
    pub settings: Settings,
    pub source: Source,
    pub stats: Arc<Stats>,
    pub wake: Wake,
}

/// How idle claimers learn that messages arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WakeUp {
    /// Poll every `poll_interval` while the queue is empty (the default).
    #[default]
    Poll,
    /// LISTEN on PGMQ's insert channel on one dedicated connection and read
    /// as soon as a notification arrives; polling stays on at
    /// `poll_interval`, because PGMQ does not notify when a delayed message or
    /// an expired visibility timeout makes a message visible.
    ///
    /// At start the worker runs `pgmq.enable_notify_insert(queue,
    /// notify_throttle)` unless the queue's insert trigger is already enabled.
    /// An existing trigger keeps its throttle, unless
    /// [`notify_throttle`](crate::WorkerBuilder::notify_throttle) was called: then
    /// the worker sets that one (`pgmq.update_notify_insert`).
    ///
    /// PGMQ sends at most one notification per throttle window; an insert
    /// inside the window sends none. So that such a message does not wait
    /// for the poll timer, the worker reads once more one throttle interval
    /// after each notification (when the throttle is shorter than
    /// `poll_interval`): a message committed inside a window is found within
    /// about one throttle interval.
    Notify,
}

/// The shortest time between two wake-ups by notification.
pub(crate) const DEBOUNCE: Duration = Duration::from_millis(1);

/// Opens the LISTEN connection and listens on the queue's insert channel.
pub(crate) async fn listen(
    source: &Source,
    queue: &pgmq_client::QueueName,
) -> Result<Listener, pgmq_client::Error> {
    let listener = source.listener().await?;
    listener.listen(queue).await?;
    Ok(listener)
}

/// What a [`WorkerGroup`](crate::WorkerGroup)'s one LISTEN connection
/// tells each of its workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HubEvent {
    /// An insert notification on the worker's queue.
    Notified,
    /// The shared connection was lost and is back: notifications may have
    /// been missed.
    Reconnected,
}

/// The wake-ups one notification path gives: at once on a notification
/// (then at most once per [`DEBOUNCE`]), and once more when the throttle
/// window that followed it closes (see the module docs). `throttle` is the
/// queue's insert-trigger throttle, as the start found or set it.
struct Wakes<'a> {
    n: &'a Notifier,
    throttle: Duration,
    follow_up: bool,
    window_end: Option<Instant>,
}

impl<'a> Wakes<'a> {
    fn new(n: &'a Notifier, throttle: Duration) -> Self {
        Wakes {
            n,
            throttle,
            follow_up: !throttle.is_zero() && throttle < n.settings.poll_interval,
            window_end: None,
        }
    }

    /// Resolves when the open throttle window closes (never when none is open).
    async fn window_closed(&self) {
        match self.window_end {
            Some(t) => tokio::time::sleep_until(t).await,
            None => std::future::pending().await,
        }
    }

    /// The window closed: the re-read for inserts it kept silent.
    fn after_window(&mut self) {
        self.window_end = None;
        bump(&self.n.stats.c.wakeups_after_throttle, 1);
        self.n.wake.wake();
    }

    /// A notification (others already folded into it): wakes the claimers,
    /// opens the follow-up window, waits the debounce; false when `stop`
    /// fired meanwhile.
    async fn notified(&mut self, stop: &CancellationToken) -> bool {
        bump(&self.n.stats.c.wakeups_notify, 1);
        self.n.wake.wake();
        if self.follow_up {
            self.window_end = Some(Instant::now() + self.throttle);
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => false,
            _ = tokio::time::sleep(DEBOUNCE) => true,
        }
    }
}

/// Starts the supervised notifier: on a group's shared LISTEN connection
/// (`hub`) or on a connection of its own (starting with `listener`, when
/// one was opened). Either is taken by the first run; a restart after a
/// panic opens a connection of its own. `throttle` is the insert trigger's:
/// the notifier reads once more this long after each notification.
pub(crate) fn spawn(
    notifier: Notifier,
    supervisor: &Supervisor,
    throttle: std::time::Duration,
    hub: Option<tokio::sync::mpsc::UnboundedReceiver<HubEvent>>,
    listener: Option<pgmq_client::Listener>,
    stop: &CancellationToken,
) -> JoinHandle<()> {
    let (notifier, stop) = (Arc::new(notifier), stop.clone());
    let first = std::sync::Mutex::new(Some((hub, listener)));
    supervisor.spawn("notifier", move || {
        let taken = first.lock().unwrap_or_else(|p| p.into_inner()).take();
        let (n, stop) = (Arc::clone(&notifier), stop.clone());
        async move {
            match taken {
                Some((Some(events), _)) => run_shared(n, throttle, events, stop).await,
                Some((None, listener)) => run(n, throttle, listener, stop).await,
                None => run(n, throttle, None, stop).await,
            }
        }
    })
}

/// Runs until `stop` on the group's shared LISTEN connection: the same
/// wake-ups as [`run`], from the events the group forwards.
async fn run_shared(
    n: Arc<Notifier>,
    throttle: Duration,
    mut events: tokio::sync::mpsc::UnboundedReceiver<HubEvent>,
    stop: CancellationToken,
) {
    let mut wakes = Wakes::new(&n, throttle);
    loop {
        let event = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            e = events.recv() => e,
            _ = wakes.window_closed() => {
                wakes.after_window();
                continue;
            }
        };
        match event {
            None => return,
            Some(HubEvent::Reconnected) => n.wake.wake(),
            Some(HubEvent::Notified) => {
                while let Ok(HubEvent::Notified) = events.try_recv() {}
                if !wakes.notified(&stop).await {
                    return;
                }
            }
        }
    }
}

/// Runs until `stop`, starting with `opened` when the start already
/// connected (otherwise it connects, retrying with backoff); `throttle` is
/// the queue's insert-trigger throttle.
async fn run(
    n: Arc<Notifier>,
    throttle: Duration,
    opened: Option<Listener>,
    stop: CancellationToken,
) {
    let queue = &n.settings.queue;
    let mut backoff = ErrorBackoff::new(Duration::from_millis(100), Duration::from_secs(10));
    let mut first = true;
    let mut opened = opened;
    let mut wakes = Wakes::new(&n, throttle);
    loop {
        let listener = match opened.take() {
            Some(l) => Some(l),
            None => {
                connect_with_backoff(&stop, &mut backoff, "LISTEN connection", || {
                    listen(&n.source, queue)
                })
                .await
            }
        };
        let Some(mut listener) = listener else {
            return;
        };
        if !first {
            tracing::info!(queue = %queue, "LISTEN connection restored");
            n.wake.wake();
        }
        first = false;
        loop {
            let got = tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                got = listener.recv() => got,
                _ = wakes.window_closed() => {
                    wakes.after_window();
                    continue;
                }
            };
            if got.is_none() {
                tracing::warn!(queue = %queue, "LISTEN connection lost; reconnecting");
                break;
            }
            // Fold whatever else already arrived into this wake-up.
            while let Some(Some(_)) = listener.recv().now_or_never() {}
            if !wakes.notified(&stop).await {
                return;
            }
        }
    }
}

/// Opens a LISTEN connection with `open`, retrying with `backoff` (and
/// polling meanwhile, as the claim loops do on their own) until it opens or
/// `stop` is cancelled (None). Shared by a worker's own notifier and a
/// group's hub.
pub(crate) async fn connect_with_backoff<F, Fut>(
    stop: &CancellationToken,
    backoff: &mut ErrorBackoff,
    what: &str,
    mut open: F,
) -> Option<Listener>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Listener, pgmq_client::Error>>,
{
    loop {
        let res = tokio::select! {
            biased;
            _ = stop.cancelled() => return None,
            r = open() => r,
        };
        match res {
            Ok(l) => {
                backoff.reset();
                return Some(l);
            }
            Err(e) => {
                let delay = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?delay, "{what} failed; polling meanwhile");
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => return None,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}
