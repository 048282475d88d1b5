//! Whether the worker is claiming, acknowledging and connected: what an
//! orchestrator's liveness or readiness probe asks.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// Failed calls in a row after which a path counts as down.
const DOWN_AFTER: u64 = 3;

/// The live health facts of one worker, updated by its tasks.
#[derive(Debug)]
pub(crate) struct HealthState {
    epoch: Instant,
    /// µs since `epoch` of the last successful read (0: none yet).
    read_ok_us: AtomicU64,
    read_errors: AtomicU64,
    ack_ok_us: AtomicU64,
    ack_errors: AtomicU64,
    running: AtomicBool,
    /// The queue is paused for the fleet (the pause watch's last read).
    paused: AtomicBool,
    /// The pause watch's last read was refused for want of a right.
    pause_flag_unreadable: AtomicBool,
    /// Handler loops waiting for an abandoned blocking thread to end.
    blocking_waiting: AtomicU64,
    /// Set when an internal task failed and the worker stops with an error.
    failure: Mutex<Option<String>>,
    /// Internal tasks restarted after a panic, and the last one's panic.
    restarts: AtomicU64,
    last_restart: Mutex<Option<String>>,
    /// Cancelled with the first failure: the worker's run waits on it.
    failed: CancellationToken,
}

impl HealthState {
    pub(crate) fn new() -> Self {
        HealthState {
            epoch: Instant::now(),
            read_ok_us: AtomicU64::new(0),
            read_errors: AtomicU64::new(0),
            ack_ok_us: AtomicU64::new(0),
            ack_errors: AtomicU64::new(0),
            running: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            pause_flag_unreadable: AtomicBool::new(false),
            blocking_waiting: AtomicU64::new(0),
            failure: Mutex::new(None),
            restarts: AtomicU64::new(0),
            last_restart: Mutex::new(None),
            failed: CancellationToken::new(),
        }
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    pub(crate) fn read_ok(&self) {
        self.read_ok_us.store(self.now_us(), Relaxed);
        if self.read_errors.load(Relaxed) != 0 {
            self.read_errors.store(0, Relaxed);
        }
    }

    pub(crate) fn read_failed(&self) {
        self.read_errors.fetch_add(1, Relaxed);
    }

    pub(crate) fn ack_ok(&self) {
        self.ack_ok_us.store(self.now_us(), Relaxed);
        if self.ack_errors.load(Relaxed) != 0 {
            self.ack_errors.store(0, Relaxed);
        }
    }

    pub(crate) fn ack_failed(&self) {
        self.ack_errors.fetch_add(1, Relaxed);
    }

    /// A handler loop starts (`true`) or stops waiting for an abandoned
    /// blocking thread to end (`max_abandoned_blocking_threads` reached).
    pub(crate) fn blocking_wait(&self, on: bool) {
        if on {
            self.blocking_waiting.fetch_add(1, Relaxed);
        } else {
            self.blocking_waiting.fetch_sub(1, Relaxed);
        }
    }

    pub(crate) fn set_running(&self, on: bool) {
        self.running.store(on, Relaxed);
    }

    /// The queue is paused (`on`) or not, as the pause watch read it.
    pub(crate) fn set_paused(&self, on: bool) {
        self.paused.store(on, Relaxed);
    }

    /// The pause watch's reads are refused for want of a right (`on`), or
    /// succeed again.
    pub(crate) fn set_pause_flag_unreadable(&self, on: bool) {
        self.pause_flag_unreadable.store(on, Relaxed);
    }

    /// An internal task failed for good: records why (the first reason
    /// wins) and fires [`failed`](Self::failed), which stops the worker.
    pub(crate) fn fail(&self, why: String) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        f.get_or_insert(why);
        self.failed.cancel();
    }

    /// An internal task panicked and was restarted: `why` is its panic.
    pub(crate) fn restarted(&self, why: String) {
        self.restarts.fetch_add(1, Relaxed);
        *self.last_restart.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }

    /// Completes once [`fail`](Self::fail) was called.
    pub(crate) async fn failed(&self) {
        self.failed.cancelled().await;
    }

    pub(crate) fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn ago(&self, us: u64) -> Option<Duration> {
        (us != 0).then(|| {
            self.epoch
                .elapsed()
                .saturating_sub(Duration::from_micros(us))
        })
    }

    pub(crate) fn snapshot(&self) -> Health {
        let read_errors = self.read_errors.load(Relaxed);
        let ack_errors = self.ack_errors.load(Relaxed);
        let failure = self.failure();
        let running = self.running.load(Relaxed) && failure.is_none();
        Health {
            running,
            claiming: running && read_errors < DOWN_AFTER,
            acknowledging: running && ack_errors < DOWN_AFTER,
            paused: self.paused.load(Relaxed),
            pause_flag_unreadable: self.pause_flag_unreadable.load(Relaxed),
            connected: read_errors < DOWN_AFTER && ack_errors < DOWN_AFTER,
            since_last_read: self.ago(self.read_ok_us.load(Relaxed)),
            since_last_ack: self.ago(self.ack_ok_us.load(Relaxed)),
            read_errors_in_a_row: read_errors,
            ack_errors_in_a_row: ack_errors,
            blocking_runs_waiting: self.blocking_waiting.load(Relaxed),
            failure,
            task_restarts: self.restarts.load(Relaxed),
            last_restart: self
                .last_restart
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }
}

/// What a liveness or readiness probe needs to know, from
/// [`WorkerHandle::health`](crate::WorkerHandle::health) or
/// [`Monitor::health`](crate::Monitor::health).
///
/// A path counts as down after 3 failed calls in a row (each bounded by
/// `db_timeout`), and as up again at its first success.
///
/// ```no_run
/// # async fn f(worker: pgmq_worker::Worker<serde_json::Value>) {
/// let monitor = worker.monitor();
/// tokio::spawn(async move {
///     loop {
///         tokio::time::sleep(std::time::Duration::from_secs(5)).await;
///         let h = monitor.health();
///         if !h.is_healthy() {
///             eprintln!("worker unhealthy: {h:?}");
///         }
///     }
/// });
/// let _ = worker.run_until_signal().await;
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// Started and not yet stopped, and no internal task failed.
    pub running: bool,
    /// Reads succeed (fewer than 3 failures in a row): claim reads, and
    /// the pause watch's reads of the pause flag, whose failures count
    /// too (a worker that cannot read the flag holds its claims, so its
    /// claim loops read nothing that could fail).
    pub claiming: bool,
    /// Acknowledgement writes succeed (fewer than 3 failures in a row).
    pub acknowledging: bool,
    /// The database answers: neither reads nor writes are failing.
    pub connected: bool,
    /// The queue is paused for the fleet (`pgmq pause`): the worker makes
    /// no claims until it is resumed, so `since_last_read` grows without
    /// anything being wrong. A paused worker is still healthy.
    pub paused: bool,
    /// The worker's role may not read whether the queue is paused (the
    /// read of the pause flag failed with SQLSTATE 42501: a right revoked
    /// while the worker runs). The worker then claims nothing, as if
    /// paused, until a read succeeds, and is not healthy meanwhile: grant
    /// the role SELECT on the queue's table (`pgmq install-sdk` grants the
    /// rest of `pgmq_sdk` to PUBLIC). (At start, the same refusal fails the
    /// start with [`Error::PauseFlagUnreadable`](crate::Error::PauseFlagUnreadable).)
    pub pause_flag_unreadable: bool,
    /// Time since the last successful read (None: none yet).
    pub since_last_read: Option<Duration>,
    /// Time since the last successful acknowledgement write (None: none yet).
    pub since_last_ack: Option<Duration>,
    /// Reads failed in a row, now.
    pub read_errors_in_a_row: u64,
    /// Acknowledgement writes failed in a row, now.
    pub ack_errors_in_a_row: u64,
    /// Handler loops of a blocking handler waiting, now, for an abandoned
    /// run's thread to end: `max_abandoned_blocking_threads` of them still
    /// run (a handler that hangs past `handler_timeout`). Above 0, the
    /// worker handles fewer messages at once than `concurrency`.
    pub blocking_runs_waiting: u64,
    /// Why the worker stopped on its own (an internal task failed), if it did.
    pub failure: Option<String>,
    /// Internal tasks (claim loops, handler loops, heartbeat, notifier)
    /// that panicked and were restarted so far: each is a bug of the
    /// worker's (user code is caught where it runs), worth a report.
    pub task_restarts: u64,
    /// The panic of the last of those restarts, naming the task.
    pub last_restart: Option<String>,
}

impl Health {
    /// Running, claiming, acknowledging and connected, and the pause flag
    /// readable.
    pub fn is_healthy(&self) -> bool {
        self.running
            && self.claiming
            && self.acknowledging
            && self.connected
            && !self.pause_flag_unreadable
    }
}
