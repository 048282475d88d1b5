//! The stop sequence, its escalation (by [`ShutdownHandle`], or by
//! SIGINT/SIGTERM: [`Signals`]), and its report.
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
//!    (a fenced requeue with the read undone, `Pgmq::requeue_fenced` with
//!    `Requeue::undo_read`, batched: visible now, `read_ct` one lower), so
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
//!    `acks_failed`, and so is every acknowledgement of a handler that
//!    finished but whose loop the deadline of step 3 cut off while it waited
//!    for room in the ack channel (the writer retrying a failed write): no
//!    finished handler's message is missing from both `abandoned` and
//!    `acks_failed`.
//! 6. **Report.**
//!
//! **Escalation.** A [`ShutdownHandle`] starts this sequence
//! ([`graceful`](ShutdownHandle::graceful)) or cuts it short
//! ([`immediate`](ShutdownHandle::immediate)); `Worker::run_until_signal`
//! calls the first on SIGINT/SIGTERM and the second on another one. Once
//! `immediate` is called (before or during the sequence), step 3 stops
//! waiting at once and abandons every running handler, and each step still
//! to come, or under way, gets at most [`IMMEDIATE_BOUND`] from the moment
//! the shutdown noticed the escalation: reads in flight, the release (step
//! 2 still runs: unstarted claims are still given back), the heartbeat's
//! write and the acknowledgement drain (acknowledgements of handlers that
//! already finished are still written). What those bounds cut off is
//! counted as usual (`release_failed`, `acks_failed`) and comes back after
//! its visibility timeout. With a healthy database the whole sequence then
//! takes milliseconds.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use pgmq_client::Requeue;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::backoff::ErrorBackoff;
use crate::claim_queue::{ClaimQueue, Claimed};
use crate::db::Source;
use crate::health::HealthState;
use crate::heartbeat::HeartbeatSignals;
use crate::lease::Leases;
use crate::stats::{bump, Stats, StatsSnapshot};

/// What the stop sequence reads.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub queue: pgmq_client::QueueName,
    pub shutdown_grace: Duration,
    pub ack_drain_timeout: Duration,
    /// The most messages one release statement gives back (`batch_size`).
    pub release_batch: usize,
    pub db_timeout: Duration,
}

/// The stop sequence: its settings and the handles it touches.
pub(crate) struct Shutdown {
    pub settings: Settings,
    pub source: Source,
    pub stats: Arc<Stats>,
    pub leases: Arc<Leases>,
    pub heartbeat: Arc<HeartbeatSignals>,
    pub health: Arc<HealthState>,
}

/// How long the shutdown waits for a claimer's read in flight.
const CLAIMER_STOP_WAIT: Duration = Duration::from_secs(2);

/// How long the shutdown waits for the handler loops it aborted to end.
const HANDLER_ABORT_WAIT: Duration = Duration::from_millis(100);

/// After [`ShutdownHandle::immediate`], the most time each step of the
/// shutdown still under way or to come may take, counted from when the
/// shutdown noticed the call (see the module docs).
pub(crate) const IMMEDIATE_BOUND: Duration = Duration::from_secs(1);

/// Starts a worker's shutdown, gracefully or at once, from anywhere.
///
/// Get one from [`Worker::shutdown_handle`](crate::Worker::shutdown_handle)
/// (before running it) or
/// [`WorkerHandle::shutdown_handle`](crate::WorkerHandle::shutdown_handle);
/// clones are cheap and all act on the same worker. Calls are idempotent,
/// and do nothing once the worker has stopped.
///
/// - [`graceful`](Self::graceful) starts the graceful shutdown (the steps
///   listed on [`ShutdownReport`]), as the `run_until` future resolving,
///   the first SIGINT/SIGTERM of `run_until_signal`, or
///   [`WorkerHandle::shutdown`](crate::WorkerHandle::shutdown) do.
/// - [`immediate`](Self::immediate) escalates, as a second signal does: the
///   shutdown (started now if it was not) stops waiting for running
///   handlers and abandons them at once (their messages come back after
///   their visibility timeout, as [`ShutdownReport::abandoned`] lists); it
///   still gives back the unstarted claims and writes the acknowledgements
///   of handlers that finished, all of it within about a second of the
///   escalation, and returns the report.
///
/// ```no_run
/// # async fn f(worker: pgmq_worker::Worker<serde_json::Value>) -> Result<(), pgmq_worker::Error> {
/// use std::time::Duration;
/// let handle = worker.spawn();
/// let stop = handle.shutdown_handle();
/// // ... later: stop gracefully, but give handlers 5 s at most, whatever
/// // `shutdown_grace` says.
/// let escalate = tokio::spawn(async move {
///     tokio::time::sleep(Duration::from_secs(5)).await;
///     stop.immediate();
/// });
/// let report = handle.shutdown().await?;
/// escalate.abort();
/// println!("abandoned: {:?}", report.abandoned);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct ShutdownHandle {
    graceful: CancellationToken,
    immediate: CancellationToken,
}

impl ShutdownHandle {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Starts the graceful shutdown.
    pub fn graceful(&self) {
        self.graceful.cancel();
    }

    /// Stops at once: starts the shutdown if it has not started, and stops
    /// waiting for running handlers (see the type's docs).
    pub fn immediate(&self) {
        // First, so that a shutdown woken by `graceful` already sees it.
        self.immediate.cancel();
        self.graceful.cancel();
    }

    /// Whether a shutdown was asked for (either kind).
    pub fn is_requested(&self) -> bool {
        self.graceful.is_cancelled()
    }

    /// Whether an immediate shutdown was asked for.
    pub fn is_immediate(&self) -> bool {
        self.immediate.is_cancelled()
    }

    /// Resolves when a shutdown is asked for.
    pub(crate) async fn requested(&self) {
        self.graceful.cancelled().await;
    }
}

/// The time limits of one shutdown, tightened once it is escalated.
struct Bounds {
    immediate: CancellationToken,
    /// Set when the shutdown first notices the escalation: the latest end
    /// of every step from then on.
    hard: OnceLock<tokio::time::Instant>,
}

impl Bounds {
    fn hard(&self) -> tokio::time::Instant {
        *self
            .hard
            .get_or_init(|| tokio::time::Instant::now() + IMMEDIATE_BOUND)
    }

    /// `deadline`, or the escalated one if that is earlier.
    fn deadline(&self, deadline: tokio::time::Instant) -> tokio::time::Instant {
        if self.immediate.is_cancelled() {
            deadline.min(self.hard())
        } else {
            deadline
        }
    }

    /// Runs `fut` until `deadline`, or until [`IMMEDIATE_BOUND`] after an
    /// escalation, whichever comes first; None when cut off.
    async fn within<F: Future>(&self, deadline: tokio::time::Instant, fut: F) -> Option<F::Output> {
        let mut fut = std::pin::pin!(fut);
        if !self.immediate.is_cancelled() {
            tokio::select! {
                biased;
                r = &mut fut => return Some(r),
                _ = tokio::time::sleep_until(deadline) => return None,
                _ = self.immediate.cancelled() => {}
            }
        }
        tokio::time::timeout_at(self.deadline(deadline), fut)
            .await
            .ok()
    }
}

/// What a shutdown did, with the final statistics.
///
/// The shutdown runs these steps, in order:
///
/// 1. stop claiming (a read in flight finishes) and stop starting handlers;
/// 2. release the claimed-but-unstarted messages at once, their read undone
///    (a fenced requeue with the read undone: visible now, `read_ct` one lower, so the
///    release uses up no attempt): `released`;
/// 3. let running handlers finish until `shutdown_grace` has passed since the
///    start of the shutdown, or until [`ShutdownHandle::immediate`] (a
///    second signal); those still running then are abandoned (their
///    messages come back after the visibility timeout):
///    `still_running_at_deadline` and `abandoned`;
/// 4. stop the heartbeat and the LISTEN connection;
/// 5. write the queued acknowledgements (within `ack_drain_timeout`):
///    `acked`, and `acks_failed` for what could not be written.
///
/// After an escalation (`immediate`) every step left takes at most about a
/// second (see [`ShutdownHandle`]).
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
    /// Handlers still running when the grace period ended, or when an
    /// immediate shutdown cut it short (abandoned; their messages come back
    /// after the visibility timeout).
    pub still_running_at_deadline: u64,
    /// The ids of the messages of those abandoned handlers.
    pub abandoned: Vec<i64>,
    /// Whether the shutdown was escalated ([`ShutdownHandle::immediate`], or
    /// a second signal).
    pub immediate: bool,
    /// Acknowledgements that could not be written (the messages come back),
    /// including those of handlers that finished but whose loops the grace
    /// deadline cut off before the writer took their outcome.
    pub acks_failed: u64,
    /// Claimed messages neither released nor handled because the release
    /// itself failed (they come back after the visibility timeout).
    pub release_failed: u64,
    /// Deliveries lost to another worker over the worker's life (their
    /// claims expired and the messages were read again; nothing was written
    /// for them here): see [`StatsSnapshot::claims_lost`].
    pub claims_lost: u64,
    /// How long the shutdown took.
    pub elapsed: Duration,
    /// Everything counted over the worker's life.
    pub stats: StatsSnapshot,
}

/// The tasks of a running worker.
pub(crate) struct Running {
    pub part: Shutdown,
    /// Parent of the tokens below: cancelled when a running worker is dropped.
    pub root: CancellationToken,
    /// Stops claimers, notifier and handler loops taking new messages.
    pub stop: CancellationToken,
    /// Stops the heartbeat.
    pub hb_stop: CancellationToken,
    pub claim_queue: Arc<ClaimQueue<Claimed>>,
    pub claimers: Vec<JoinHandle<()>>,
    pub handlers: Vec<JoinHandle<()>>,
    pub heartbeat: Option<JoinHandle<()>>,
    pub notifier: Option<JoinHandle<()>>,
    pub completer: JoinHandle<()>,
    /// Tells the completer to close its channel and drain, by when.
    pub completer_close: Arc<crate::completer::Close>,
}

impl Running {
    /// The stop sequence (see the module docs); `stop` may escalate it.
    pub(crate) async fn shutdown(self, stop: &ShutdownHandle) -> ShutdownReport {
        let started = Instant::now();
        let part = self.part;
        let cfg = &part.settings;
        let deadline = tokio::time::Instant::now() + cfg.shutdown_grace;
        let bounds = Bounds {
            immediate: stop.immediate.clone(),
            hard: OnceLock::new(),
        };
        tracing::info!(queue = %cfg.queue, grace = ?cfg.shutdown_grace, immediate = stop.is_immediate(), "worker stopping");

        // 1. Stop claiming and taking.
        self.stop.cancel();

        // 2. Release what is claimed but not started, at once. Claimers end
        //    first, so that no read re-claims what the release makes visible.
        stop_claimers(self.claimers, deadline, &bounds).await;
        let release_failed = release(&part, &self.claim_queue, deadline, &bounds).await;

        // 3. Let in-flight handlers finish within the grace period, or until
        //    an escalation.
        let abandoned = finish_handlers(&part, self.handlers, deadline, &bounds).await;
        // Nothing takes from the claim queue any more: a claimer's late push
        // (none expected) is refused.
        self.claim_queue.close();

        // 4. Stop the heartbeat and the notifier. A heartbeat write in
        //    flight is finished first (retries wait for it), within the
        //    drain time.
        let drain_deadline = tokio::time::Instant::now() + cfg.ack_drain_timeout;
        self.hb_stop.cancel();
        if let Some(hb) = self.heartbeat {
            let abort = hb.abort_handle();
            if bounds.within(drain_deadline, hb).await.is_none() {
                abort.abort();
                tracing::warn!("heartbeat write unanswered within the drain time; abandoned");
            }
        }
        if let Some(n) = self.notifier {
            let _ = n.await;
        }

        // 5. Drain the completer.
        self.completer_close
            .close(bounds.deadline(drain_deadline).into_std());
        drain_completer(&part, self.completer, drain_deadline, &bounds).await;

        // 6. Report.
        let stats = part.stats.snapshot();
        let report = ShutdownReport {
            handled: stats.handled,
            acked: stats.deleted + stats.archived + stats.retried + stats.dead_lettered,
            released: stats.released,
            still_running_at_deadline: abandoned.len() as u64,
            abandoned,
            immediate: bounds.immediate.is_cancelled(),
            acks_failed: stats.acks_failed,
            release_failed,
            claims_lost: stats.claims_lost,
            elapsed: started.elapsed(),
            stats,
        };
        part.health.set_running(false);
        tracing::info!(
            queue = %cfg.queue,
            handled = report.handled,
            claims_lost = report.claims_lost,
            acked = report.acked,
            released = report.released,
            still_running = report.still_running_at_deadline,
            immediate = report.immediate,
            "worker stopped"
        );
        report
    }
}

/// Waits for the claim loops to end (a read in flight is one round trip);
/// one stuck on a dead connection is aborted after [`CLAIMER_STOP_WAIT`]
/// (what it read, if anything, comes back after the visibility timeout).
async fn stop_claimers(
    claimers: Vec<JoinHandle<()>>,
    deadline: tokio::time::Instant,
    bounds: &Bounds,
) {
    let claimers_done = tokio::time::Instant::now() + CLAIMER_STOP_WAIT;
    for claimer in claimers {
        let abort = claimer.abort_handle();
        if bounds
            .within(claimers_done.min(deadline), claimer)
            .await
            .is_none()
        {
            abort.abort();
        }
    }
}

/// Waits for the handler loops until `deadline` or an escalation, then
/// cancels what still runs and returns those messages' ids (abandoned:
/// they come back after their visibility timeout).
async fn finish_handlers(
    part: &Shutdown,
    mut handlers: Vec<JoinHandle<()>>,
    deadline: tokio::time::Instant,
    bounds: &Bounds,
) -> Vec<i64> {
    if !bounds.immediate.is_cancelled() {
        tokio::select! {
            biased;
            _ = futures::future::join_all(handlers.iter_mut()) => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = bounds.immediate.cancelled() => {}
        }
    }
    // Running handlers see their Context cancelled, then their loops end:
    // an async handler's future is dropped; a blocking handler's thread is
    // left to end on its own (it keeps neither the worker nor the process
    // waiting).
    part.leases.cancel_running();
    for handler in &handlers {
        handler.abort();
    }
    // An aborted loop stops at its next await; one in the middle of a poll
    // ends that poll first. Waiting for them (briefly) means no handler
    // code runs once the acknowledgements are counted (see
    // `drain_completer`).
    let _ = bounds
        .within(
            tokio::time::Instant::now() + HANDLER_ABORT_WAIT,
            // Only those still running: a JoinHandle already polled to its
            // end must not be polled again.
            futures::future::join_all(handlers.into_iter().filter(|h| !h.is_finished())),
        )
        .await;
    let why = if bounds.immediate.is_cancelled() {
        "immediate shutdown"
    } else {
        "shutdown grace period over"
    };
    let abandoned: Vec<i64> = part.leases.running();
    for id in &abandoned {
        tracing::warn!(msg_id = id, "{why}: handler still running, abandoned (the message comes back after its visibility timeout)");
    }
    bump(
        &part.stats.c.still_running_at_deadline,
        abandoned.len() as u64,
    );
    abandoned
}

/// Waits for the completer to write what is queued, until `drain_deadline`;
/// past it, aborts it. Then counts every acknowledgement a handler finished
/// that was neither written nor given up in `acks_failed`: what the aborted
/// completer had left, and those of handler loops that the grace deadline
/// aborted while they waited for room in a full ack channel (a writer
/// retrying a failed write): their messages come back after their
/// visibility timeout, and the report says so.
async fn drain_completer(
    part: &Shutdown,
    completer: JoinHandle<()>,
    drain_deadline: tokio::time::Instant,
    bounds: &Bounds,
) {
    let abort = completer.abort_handle();
    let drained = bounds.within(drain_deadline, completer).await.is_some();
    if !drained {
        abort.abort();
    }
    let pending = part.stats.acks_pending();
    if pending == 0 {
        return;
    }
    bump(&part.stats.c.acks_failed, pending);
    bump(&part.stats.acks_resolved, pending);
    if drained {
        tracing::error!(
            pending,
            "acknowledgements of handlers stopped at the grace deadline never reached the writer (it was retrying a failed write); the messages come back after their visibility timeout"
        );
    } else {
        tracing::error!(
            pending,
            "acknowledgements not written within the drain time"
        );
    }
}

/// Gives back every message left in the claim queue, in batches, with its
/// read undone (a fenced requeue: visible now, `read_ct` one lower, so
/// the release uses up no attempt); returns how many could not be released
/// before `deadline` (or the escalated one). A message read again by someone
/// else since (its timeout ended) is theirs and left alone.
async fn release(
    part: &Shutdown,
    queue: &ClaimQueue<Claimed>,
    deadline: tokio::time::Instant,
    bounds: &Bounds,
) -> u64 {
    let reads: Vec<Requeue> = queue
        .drain()
        .into_iter()
        .map(|c| Requeue::new(c.receipt, Duration::ZERO).undo_read())
        .collect();
    if reads.is_empty() {
        return 0;
    }
    // Unstarted messages are in no heartbeat batch, unless one was claimed
    // again while a copy still runs: keep the order anyway (releasing even
    // when the heartbeat's write does not return in time).
    let _ = bounds.within(deadline, part.heartbeat.after_write()).await;
    let mut failed = 0;
    let pg = pgmq_client::Pgmq::on(part.source.pool());
    for chunk in reads.chunks(part.settings.release_batch.max(1)) {
        let mut backoff = ErrorBackoff::new(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            let call = tokio::time::timeout(
                part.settings.db_timeout,
                pg.requeue_fenced(&part.settings.queue, chunk),
            );
            let err = match bounds.within(deadline, call).await {
                Some(Err(_)) => Some(pgmq_client::Error::timed_out()),
                Some(Ok(Err(e))) => Some(e),
                Some(Ok(Ok(done))) => {
                    // The others were read again since (their claims expired).
                    let lost = (chunk.len() - done.len()) as u64;
                    if lost > 0 {
                        bump(&part.stats.c.claims_lost, lost);
                        tracing::warn!(queue = %part.settings.queue, lost, "claims lost before the release: those messages were delivered again");
                    }
                    bump(&part.stats.c.released, done.len() as u64);
                    break;
                }
                None => None,
            };
            let delay = backoff.next_delay();
            let give_up = match &err {
                Some(e) => {
                    !e.is_transient()
                        || tokio::time::Instant::now() + delay >= bounds.deadline(deadline)
                }
                None => true,
            };
            if give_up {
                let error = err.map_or_else(|| "no answer in time".to_owned(), |e| e.to_string());
                tracing::warn!(%error, messages = chunk.len(), "could not release claimed messages; they come back after their visibility timeout");
                failed += chunk.len() as u64;
                break;
            }
            tokio::time::sleep(delay).await;
        }
    }
    failed
}

/// SIGINT and SIGTERM (Ctrl-C only, off Unix), installed once and received
/// as often as they come.
pub(crate) struct Signals {
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    pub(crate) fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let install = |kind: SignalKind, name: &str| match signal(kind) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::error!(error = %e, "could not install a {name} handler; it will not stop the worker");
                    None
                }
            };
            Signals {
                int: install(SignalKind::interrupt(), "SIGINT"),
                term: install(SignalKind::terminate(), "SIGTERM"),
            }
        }
        #[cfg(not(unix))]
        {
            Signals {}
        }
    }

    /// Resolves on the next signal.
    pub(crate) async fn recv(&mut self) {
        #[cfg(unix)]
        {
            async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
                if let Some(s) = s {
                    if s.recv().await.is_some() {
                        return;
                    }
                }
                std::future::pending().await
            }
            tokio::select! {
                () = next(&mut self.int) => {}
                () = next(&mut self.term) => {}
            }
        }
        #[cfg(not(unix))]
        {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}
