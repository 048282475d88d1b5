//! Runs the handlers.
//!
//! `concurrency` long-lived handler loops pull messages from the claim queue:
//! no task is spawned per message. Each loop decides whether the message may
//! run at all (not waited too long locally, not delivered too often, a body
//! that decodes into `T`), runs the handler with panics caught and within
//! `handler_timeout`, turns the result into an acknowledgement and hands it
//! to the completer. While the handler runs and until its acknowledgement is
//! written, the delivery is a [lease](crate::lease) the heartbeat extends.
//!
//! **Attempts are handler runs.** The attempt number is one more than the
//! `x-pgmq-worker-attempts` header, which each retry writes (fenced) with the
//! message's visibility; PGMQ's `read_ct` counts deliveries instead, which
//! include claims lost in a crash before their handler ran. So a message is
//! dead-lettered after `max_attempts` runs that failed, and, as a guard
//! against a message that crashes the process every time (no attempt is
//! ever written), after `max_deliveries` deliveries without running.
//!
//! An async handler's loop is a tokio task. A blocking handler's loop is a
//! tokio task too, which hands each message to a dedicated plain thread of
//! its own and waits for the result, so that CPU-bound work never stalls
//! the runtime, a hung run can be abandoned at `handler_timeout` (its thread
//! is left to end on its own, the loop starts a new one), and a hung thread
//! never keeps the process alive at exit. At most
//! `max_abandoned_blocking_threads` abandoned threads may still run; past
//! that, a loop acknowledges its own abandoned run (its retry written, its
//! lease ended) and then waits for one to end before it takes another
//! message. With FIFO groups a loop waits for its abandoned run's thread to
//! return before acknowledging it, so a group never has two runs at once.

use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use pgmq_client::{Message, Pgmq, QueueName, Receipt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backoff::jittered;
use crate::claim_queue::{ClaimQueue, WAKE_BUDGET};
use crate::claimer::Claimed;
use crate::completer::{Ack, AckKind};
use crate::config::Config;
use crate::context::Context;
use crate::handler::{
    panic_text, panic_text_of, BlockingHandler, Handler, HandlerError, HandlerWithContext, Outcome,
    TransactionalHandler,
};
use crate::hooks;
use crate::lease::State;
use crate::stats::{bump, micros, record, HandlerCounters, LocalHistograms};
use crate::worker::Shared;

/// The header in which retries record the attempts used so far.
pub const ATTEMPTS_HEADER: &str = "x-pgmq-worker-attempts";

/// What a handler loop needs.
pub(crate) struct ExecContext {
    pub shared: Arc<Shared>,
    pub queue: Arc<ClaimQueue<Claimed>>,
    pub acks: mpsc::Sender<Ack>,
    pub stop: CancellationToken,
    pub queue_name: Arc<QueueName>,
}

/// The result of one handler run: its return value, or the panic's text.
type RunResult = Result<Result<Outcome, HandlerError>, String>;

/// One way of running a handler (async on the runtime, or blocking on a
/// thread of the loop's own).
pub(crate) trait Run<T: Send>: Send + Sync + 'static {
    /// Per loop: what a run needs beyond the handler (the blocking loop's
    /// thread).
    type Local: Send + Default;

    fn run(
        &self,
        local: &mut Self::Local,
        msg: Message<T>,
        ctx: Context,
    ) -> impl Future<Output = RunResult> + Send;

    /// Called by the loop after every run, before its outcome is
    /// acknowledged: deals with what the run left behind that must end
    /// before the message may run again (a FIFO blocking run's thread).
    fn after_run(
        &self,
        _local: &mut Self::Local,
        _shared: &Shared,
    ) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Called by the loop once the outcome was handed to the completer,
    /// before it takes its next message: waits for room for what the run
    /// left behind (a thread under `max_abandoned_blocking_threads`), so
    /// that the wait never holds the acknowledged message; ends early when
    /// `stop` fires.
    fn before_next(
        &self,
        _local: &mut Self::Local,
        _shared: &Shared,
        _stop: &CancellationToken,
    ) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Runs the handler; a run that acknowledged its message itself (in
    /// the handler's transaction) says how in the second value.
    fn run_settling(
        &self,
        local: &mut Self::Local,
        msg: Message<T>,
        ctx: Context,
        _shared: &Shared,
        _receipt: Receipt,
    ) -> impl Future<Output = (RunResult, Option<Settled>)> + Send {
        async move { (self.run(local, msg, ctx).await, None) }
    }
}

/// How a transactional run settled its message itself.
pub(crate) enum Settled {
    /// Deleted or archived in the handler's transaction, committed.
    Written(AckKind),
    /// The claim was lost: the transaction was rolled back.
    Lost,
    /// The worker's own database work around the handler failed (the
    /// checkout, BEGIN, the acknowledgement in the transaction or COMMIT
    /// lost its connection or timed out): not the handler's failure, so no
    /// attempt is used; the message is snoozed (see [`worker_side`]).
    Unavailable(String),
}

/// Whether `e`, met by the worker's own call around a transactional
/// handler, is the worker's failure rather than the handler's: no
/// connection to be had, a connection lost, a call that timed out. An
/// error the server reported (a deferred constraint or a serialization
/// failure at COMMIT, a transaction the handler left aborted) is the
/// handler's: it uses an attempt, so that a message that always fails that
/// way is dead-lettered in the end.
fn worker_side(e: &pgmq_client::Error) -> bool {
    matches!(
        e,
        pgmq_client::Error::PoolTimeout
            | pgmq_client::Error::ConnectionLost { .. }
            | pgmq_client::Error::Connect(_)
    )
}

/// `call` within `limit`; past it, [`pgmq_client::Error::timed_out`].
async fn within<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, pgmq_client::Error>>,
) -> Result<T, pgmq_client::Error> {
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or_else(|_| Err(pgmq_client::Error::timed_out()))
}

/// A transactional run's connection: abandoned when dropped unless the run
/// ended its transaction cleanly (`clean`), so that a connection whose call
/// was cut off (at `db_timeout`, at `handler_timeout`, at an immediate
/// shutdown) never goes back to the pool with a statement still running on
/// it, and the server stops that statement.
struct TxConn {
    conn: crate::db::Held,
    clean: bool,
}

impl Drop for TxConn {
    fn drop(&mut self) {
        if !self.clean {
            self.conn.abandon();
        }
    }
}

struct TxRun<H>(H);

impl<T: Send + 'static, H: TransactionalHandler<T>> Run<T> for TxRun<H> {
    type Local = ();

    async fn run(&self, _: &mut (), _msg: Message<T>, _ctx: Context) -> RunResult {
        Err("a transactional handler runs through run_settling".to_owned())
    }

    async fn run_settling(
        &self,
        _: &mut (),
        msg: Message<T>,
        ctx: Context,
        shared: &Shared,
        receipt: Receipt,
    ) -> (RunResult, Option<Settled>) {
        let limit = shared.config.db_timeout;
        let conn = match shared.source.checkout(limit).await {
            Ok(c) => c,
            Err(e) => return unavailable("checking out a connection", &e),
        };
        let mut held = TxConn { conn, clean: false };
        let (out, clean) = self
            .in_transaction(&mut held.conn, msg, ctx, shared, receipt)
            .await;
        held.clean = clean;
        out
    }
}

/// The result of a transactional run whose own database work failed with
/// `e` during `what`: the worker's failure (no attempt used) or the
/// handler's.
fn tx_failed(what: &str, e: pgmq_client::Error) -> (RunResult, Option<Settled>) {
    if worker_side(&e) {
        unavailable(what, &e)
    } else {
        (Ok(Err(Box::new(e))), None)
    }
}

fn unavailable(what: &str, e: &pgmq_client::Error) -> (RunResult, Option<Settled>) {
    let why = format!("{what} failed: {e}");
    (Ok(Err(why.clone().into())), Some(Settled::Unavailable(why)))
}

impl<H> TxRun<H> {
    /// Runs the handler in a transaction on `conn`; the second value says
    /// whether the transaction ended cleanly (committed or rolled back in
    /// time), so that `conn` may go back to the pool. Every call of the
    /// worker's own here (BEGIN, the fenced acknowledgement, COMMIT,
    /// ROLLBACK) is bounded by `db_timeout`.
    async fn in_transaction<T: Send + 'static>(
        &self,
        conn: &mut crate::db::Held,
        msg: Message<T>,
        ctx: Context,
        shared: &Shared,
        receipt: Receipt,
    ) -> ((RunResult, Option<Settled>), bool)
    where
        H: TransactionalHandler<T>,
    {
        let cfg = &shared.config;
        let limit = cfg.db_timeout;
        let tx = match within(limit, conn.transaction()).await {
            Ok(tx) => tx,
            Err(e) => return (tx_failed("BEGIN", e), false),
        };
        let result = AssertUnwindSafe(self.0.handle(msg, &tx, ctx))
            .catch_unwind()
            .await
            .map_err(|p| panic_text(&*p));
        let kind = match &result {
            Ok(Ok(Outcome::Delete)) => AckKind::Delete,
            Ok(Ok(Outcome::Archive)) => AckKind::Archive,
            _ => {
                // Anything else is written by the completer as usual; the
                // handler's writes are undone with the transaction.
                let clean = within(limit, tx.rollback()).await.is_ok();
                return ((result, None), clean);
            }
        };
        let pg = Pgmq::on(&tx);
        let written = within(
            limit,
            crate::completer::acknowledge(&pg, cfg, matches!(kind, AckKind::Archive), &[receipt]),
        )
        .await;
        match written {
            Ok(ids) if ids.is_empty() => {
                let clean = within(limit, tx.rollback()).await.is_ok();
                ((result, Some(Settled::Lost)), clean)
            }
            Ok(_) => match within(limit, tx.commit()).await {
                Ok(()) => ((result, Some(Settled::Written(kind))), true),
                Err(e) => (tx_failed("COMMIT", e), false),
            },
            Err(e) => {
                let clean = !worker_side(&e) && within(limit, tx.rollback()).await.is_ok();
                (
                    tx_failed("the acknowledgement in the transaction", e),
                    clean,
                )
            }
        }
    }
}

/// The loops of a [`TransactionalHandler`].
pub(crate) fn transactional_spawner<
    T: DeserializeOwned + Send + 'static,
    H: TransactionalHandler<T>,
>(
    handler: H,
) -> Box<dyn Spawner<T>> {
    Box::new(spawner::<T, _>(TxRun(handler)))
}

struct AsyncRun<H>(H);

impl<T: Send + 'static, H: Handler<T>> Run<T> for AsyncRun<H> {
    type Local = ();

    async fn run(&self, _: &mut (), msg: Message<T>, _ctx: Context) -> RunResult {
        AssertUnwindSafe(self.0.handle(msg))
            .catch_unwind()
            .await
            .map_err(|p| panic_text(&*p))
    }
}

struct ContextRun<H>(H);

impl<T: Send + 'static, H: HandlerWithContext<T>> Run<T> for ContextRun<H> {
    type Local = ();

    async fn run(&self, _: &mut (), msg: Message<T>, ctx: Context) -> RunResult {
        AssertUnwindSafe(self.0.handle(msg, ctx))
            .catch_unwind()
            .await
            .map_err(|p| panic_text(&*p))
    }
}

/// A blocking handler's thread: takes jobs, sends each result back.
type Job = Box<dyn FnOnce() + Send>;

/// A blocking loop's current thread (None until the first message, and
/// after a run was abandoned), and the run it last abandoned.
#[derive(Default)]
pub(crate) struct BlockingThread {
    jobs: Option<std::sync::mpsc::Sender<Job>>,
    /// The last run, when it was abandoned (timed out, cancelled, or its
    /// future dropped) and not yet dealt with by [`Run::after_run`] or
    /// [`Run::before_next`].
    abandoned: Option<Arc<RunEnd>>,
}

impl BlockingThread {
    fn submit(&mut self, job: Job) {
        let job = match &self.jobs {
            Some(tx) => match tx.send(job) {
                Ok(()) => return,
                Err(e) => e.0,
            },
            None => job,
        };
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name("pgmq-worker-blocking".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            });
        match spawned {
            Ok(_) => {
                // A new thread always takes its first job.
                let _ = tx.send(job);
                self.jobs = Some(tx);
            }
            Err(e) => tracing::error!(error = %e, "could not start a blocking handler thread"),
        }
    }
}

/// The end of one blocking run, shared by its job and its loop: whether
/// the handler returned, and the permit of the abandoned-thread cap the run
/// holds once its loop has left it behind.
#[derive(Default)]
struct RunEnd {
    state: std::sync::Mutex<RunEndState>,
    returned: tokio::sync::Notify,
}

#[derive(Default)]
struct RunEndState {
    returned: bool,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl RunEnd {
    fn lock(&self) -> std::sync::MutexGuard<'_, RunEndState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// On the run's thread, once the handler returned: frees its permit.
    fn returned(&self) {
        let permit = {
            let mut st = self.lock();
            st.returned = true;
            st.permit.take()
        };
        drop(permit);
        self.returned.notify_waiters();
    }

    /// Hands the run a permit to hold until its handler returns; false
    /// (the permit dropped) when it already has.
    fn hold(&self, permit: tokio::sync::OwnedSemaphorePermit) -> bool {
        let mut st = self.lock();
        if st.returned {
            return false;
        }
        st.permit = Some(permit);
        true
    }

    /// Waits until the handler returned.
    async fn wait(&self) {
        loop {
            let notified = self.returned.notified();
            tokio::pin!(notified);
            // Registered before looking, so a return after the look wakes it.
            notified.as_mut().enable();
            if self.lock().returned {
                return;
            }
            notified.await;
        }
    }
}

struct BlockingRun<H> {
    handler: Arc<H>,
    /// Permits for the abandoned runs whose threads still run
    /// (`max_abandoned_blocking_threads`), made with the first one.
    abandoned: std::sync::OnceLock<Arc<tokio::sync::Semaphore>>,
}

impl<T: Send + 'static, H: BlockingHandler<T>> Run<T> for BlockingRun<H> {
    type Local = BlockingThread;

    async fn run(&self, thread: &mut BlockingThread, msg: Message<T>, ctx: Context) -> RunResult {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let handler = Arc::clone(&self.handler);
        let end = Arc::new(RunEnd::default());
        // Marks the run returned when dropped: after the handler, or with
        // the job if it never runs (no thread could be started).
        let job_end = ReturnOnDrop(Arc::clone(&end));
        thread.submit(Box::new(move || {
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| handler.handle(msg)))
                .map_err(|p| panic_text(&*p));
            // Before the result, so a loop that has it sees the run returned.
            drop(job_end);
            let _ = tx.send(r);
        }));
        // Abandoned unless the result arrives: a timeout or a shutdown that
        // drops this future leaves the thread to finish on its own.
        let mut guard = AbandonOnDrop(Some((thread, end)));
        let r = tokio::select! {
            r = rx => r.unwrap_or_else(|_| Err("blocking handler thread ended".to_owned())),
            // An abandoned run still counts as cancelled for the caller.
            _ = ctx.cancelled() => Err("blocking handler cancelled".to_owned()),
        };
        if r.is_ok() {
            guard.0 = None;
        }
        r
    }

    /// A run abandoned at `handler_timeout` (or on a lost claim) is still
    /// running on its thread. With FIFO groups the loop waits for it to
    /// return before the message is acknowledged, so that neither the
    /// message's retry nor its group's next message runs alongside it; the
    /// thread is then free for the next message. Otherwise the thread is
    /// dealt with in [`Run::before_next`], after the acknowledgement.
    async fn after_run(&self, thread: &mut BlockingThread, shared: &Shared) {
        if shared.config.claim_reads != crate::config::ClaimReads::FifoGroups {
            return;
        }
        if let Some(end) = thread.abandoned.take() {
            end.wait().await;
        }
    }

    /// Without FIFO groups the loop leaves an abandoned run's thread
    /// behind, holding one of `max_abandoned_blocking_threads` permits
    /// until its handler returns, and waits for a permit when none is
    /// free; the abandoned message's retry is written by then, so the wait
    /// holds no message.
    async fn before_next(
        &self,
        thread: &mut BlockingThread,
        shared: &Shared,
        stop: &CancellationToken,
    ) {
        let Some(end) = thread.abandoned.take() else {
            return;
        };
        let cfg = &shared.config;
        let cap = self.abandoned.get_or_init(|| {
            Arc::new(tokio::sync::Semaphore::new(
                cfg.max_abandoned_blocking_threads,
            ))
        });
        let permit = match Arc::clone(cap).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let _waiting = BlockingWait::new(shared);
                tracing::warn!(
                    queue = %cfg.queue,
                    cap = cfg.max_abandoned_blocking_threads,
                    "max_abandoned_blocking_threads abandoned blocking runs still run: this loop waits for one to end"
                );
                tokio::select! {
                    p = Arc::clone(cap).acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                    // Its own run returned first: its thread is free again.
                    _ = end.wait() => return,
                    // Shutting down: no next message to make room for.
                    _ = stop.cancelled() => return,
                }
            }
        };
        if end.hold(permit) {
            // The thread is busy with the abandoned run: the next message
            // gets a new one.
            thread.jobs = None;
        }
    }
}

/// Marks a blocking run returned when dropped.
struct ReturnOnDrop(Arc<RunEnd>);

impl Drop for ReturnOnDrop {
    fn drop(&mut self) {
        self.0.returned();
    }
}

/// Counts a loop in `Health::blocking_runs_waiting` while it lives.
struct BlockingWait<'a>(&'a Shared);

impl<'a> BlockingWait<'a> {
    fn new(shared: &'a Shared) -> Self {
        shared.health.blocking_wait(true);
        BlockingWait(shared)
    }
}

impl Drop for BlockingWait<'_> {
    fn drop(&mut self) {
        self.0.health.blocking_wait(false);
    }
}

/// Records the run as abandoned in its loop's thread unless disarmed.
struct AbandonOnDrop<'a>(Option<(&'a mut BlockingThread, Arc<RunEnd>)>);

impl Drop for AbandonOnDrop<'_> {
    fn drop(&mut self) {
        if let Some((t, end)) = self.0.take() {
            t.abandoned = Some(end);
        }
    }
}

/// Starts the handler loops of one worker; type-erased over the handler.
pub(crate) trait Spawner<T>: Send {
    fn spawn(self: Box<Self>, ctx: Arc<ExecContext>) -> Vec<JoinHandle<()>>;
}

/// Spawns `concurrency` handler loops over one [`Run`].
pub(crate) struct RunSpawner<T, R> {
    run: Arc<R>,
    _t: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned + Send + 'static, R: Run<T>> Spawner<T> for RunSpawner<T, R> {
    fn spawn(self: Box<Self>, ctx: Arc<ExecContext>) -> Vec<JoinHandle<()>> {
        (0..ctx.shared.config.concurrency)
            .map(|i| {
                let ctx2 = Arc::clone(&ctx);
                let run = Arc::clone(&self.run);
                // Supervised as the other internal tasks are: a loop that
                // panics anyway is restarted, counted and shown in health.
                crate::worker::supervised(&ctx.shared, "handler loop", move || {
                    handler_loop::<T, R>(Arc::clone(&ctx2), i, Arc::clone(&run))
                })
            })
            .collect()
    }
}

fn spawner<T, R>(run: R) -> RunSpawner<T, R> {
    RunSpawner {
        run: Arc::new(run),
        _t: PhantomData,
    }
}

/// The loops of an async [`Handler`].
pub(crate) fn async_spawner<T: DeserializeOwned + Send + 'static, H: Handler<T>>(
    handler: H,
) -> Box<dyn Spawner<T>> {
    Box::new(spawner::<T, _>(AsyncRun(handler)))
}

/// The loops of a [`HandlerWithContext`].
pub(crate) fn context_spawner<T: DeserializeOwned + Send + 'static, H: HandlerWithContext<T>>(
    handler: H,
) -> Box<dyn Spawner<T>> {
    Box::new(spawner::<T, _>(ContextRun(handler)))
}

/// The loops of a [`BlockingHandler`].
pub(crate) fn blocking_spawner<T: DeserializeOwned + Send + 'static, H: BlockingHandler<T>>(
    handler: H,
) -> Box<dyn Spawner<T>> {
    Box::new(spawner::<T, _>(BlockingRun {
        handler: Arc::new(handler),
        abandoned: std::sync::OnceLock::new(),
    }))
}

/// The attempts a message's header says were used (0 without one).
fn attempts_used(headers: Option<&serde_json::Value>) -> u32 {
    headers
        .and_then(|h| h.get(ATTEMPTS_HEADER))
        .and_then(serde_json::Value::as_u64)
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// One handler loop: take a message, run it, acknowledge, until `stop`.
async fn handler_loop<T: DeserializeOwned + Send + 'static, R: Run<T>>(
    ctx: Arc<ExecContext>,
    index: usize,
    run: Arc<R>,
) {
    let shared = &ctx.shared;
    let cfg = &shared.config;
    let stats = &shared.stats;
    let counts = &stats.per_handler[index];
    // A message that waited locally for 3/4 of its visibility timeout is not
    // started: it is about to become visible again (and may be claimed by
    // another worker); running it would likely deliver it twice. It is
    // given back at once instead, its read undone.
    let stale_after = cfg.visibility_timeout * 3 / 4;
    let mut timing = LoopTiming::new(&ctx);
    let mut run_local = R::Local::default();
    while let Some((item, left)) = next_claimed(&ctx, &mut timing.local).await {
        shared.claims.room.free(1);
        let Claimed {
            msg,
            receipt,
            claimed_at,
        } = item;
        let d = Delivery {
            receipt,
            claimed_at,
            started: Instant::now(),
            attempt: attempts_used(msg.headers.as_ref()).saturating_add(1),
            deliveries: u32::try_from(msg.read_ct).unwrap_or(0),
        };
        let waited = d.started.duration_since(claimed_at);
        if left > 0 && waited > WAKE_BUDGET {
            // The loops awake are not keeping up with this batch (handlers
            // slower than their average said): one more joins.
            ctx.queue.wake_one();
        }
        if waited < stale_after {
            timing.record_wait(waited);
        }
        // Should this loop panic anyway (a bug of the worker's; every user
        // code path below is caught), the message is not held for ever: its
        // lease ends, so it comes back after its visibility timeout, and
        // the supervisor starts a new loop.
        let holding = Holding {
            shared,
            receipt,
            armed: true,
        };
        let kind = if waited >= stale_after {
            // Given back with its read undone, so that waiting here uses up
            // no delivery (the completer writes it with the acknowledgements).
            bump(&counts.expired_unstarted, 1);
            AckKind::Release
        } else if let Some(reason) = past_limits(cfg, &d) {
            AckKind::DeadLetter { reason }
        } else {
            // A `Deserialize` of the user's is user code too: a panic in it
            // is a failed attempt, as a handler panic is.
            match std::panic::catch_unwind(AssertUnwindSafe(|| msg.decode::<T>())) {
                Err(p) => outcome_to_ack(
                    shared,
                    counts,
                    Err(panic_text_of("the body's Deserialize", &*p)),
                    d.attempt,
                ),
                Ok(Err(e)) => {
                    bump(&counts.decode_failures, 1);
                    AckKind::DeadLetter {
                        reason: truncate_reason(format!("body does not decode: {e}")),
                    }
                }
                Ok(Ok(typed)) => {
                    let (result, settled) =
                        run_message(&ctx, &*run, &mut run_local, typed, &d, counts).await;
                    run.after_run(&mut run_local, shared).await;
                    shared.leases.set_state([receipt], State::Acking);
                    timing.record_run(shared, d.started);
                    #[cfg(feature = "fault-injection")]
                    shared.maybe_panic("handler loop");
                    if let Some(Settled::Unavailable(why)) = &settled {
                        // The worker's own database work failed, not the
                        // handler: back soon, with no attempt (nor delivery)
                        // used.
                        bump(&shared.stats.c.tx_unavailable, 1);
                        tracing::warn!(msg_id = receipt.msg_id, reason = %why, "transactional run could not use the database; the message comes back without using an attempt");
                        let pause = cfg.retry_backoff.delay(1);
                        AckKind::Snooze(if cfg.retry_jitter {
                            jittered(pause)
                        } else {
                            pause
                        })
                    } else {
                        bump(&counts.handled, 1);
                        if let Some(settled) = settled {
                            // Acknowledged in the handler's transaction: nothing
                            // for the completer.
                            bump(&counts.succeeded, 1);
                            holding.disarm();
                            settle(shared, &ctx.queue_name, receipt, settled);
                            continue;
                        }
                        outcome_to_ack(shared, counts, result, d.attempt)
                    }
                }
            }
        };
        holding.disarm();
        if !send_ack(&ctx, counts, &d, kind).await {
            break;
        }
        run.before_next(&mut run_local, shared, &ctx.stop).await;
    }
    timing.local.merge(stats, Instant::now());
}

/// A message a handler loop took and has not handed on yet: should the
/// loop unwind while it holds it, its lease ends (the heartbeat stops
/// extending it) and it comes back after its visibility timeout.
struct Holding<'a> {
    shared: &'a Shared,
    receipt: Receipt,
    armed: bool,
}

impl Holding<'_> {
    /// Handed on (to the completer, or settled in the handler's transaction).
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        if self.armed && std::thread::panicking() {
            self.shared.leases.finish([self.receipt]);
        }
    }
}

/// A handler loop's own timing records: merged into the shared statistics
/// now and then, so the per-message path takes no lock.
struct LoopTiming {
    local: LocalHistograms,
    /// Handler runs so far.
    runs: u64,
    #[cfg(feature = "metrics")]
    metrics: crate::metrics::LoopMetrics,
}

impl LoopTiming {
    fn new(ctx: &ExecContext) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = ctx;
        LoopTiming {
            local: LocalHistograms::new(),
            runs: 0,
            #[cfg(feature = "metrics")]
            metrics: crate::metrics::LoopMetrics::new(ctx.queue_name.as_str()),
        }
    }

    /// How long a message waited in the claim queue.
    fn record_wait(&mut self, waited: Duration) {
        record(&mut self.local.h.queue_wait_local, micros(waited));
        #[cfg(feature = "metrics")]
        self.metrics.wait.record(waited.as_secs_f64());
    }

    /// A handler run that started at `started` and just ended: its latency,
    /// and the moving average the claim limit follows.
    fn record_run(&mut self, shared: &Shared, started: Instant) {
        let ended = Instant::now();
        let took_us = micros(ended - started);
        record(&mut self.local.h.handler_latency, took_us);
        #[cfg(feature = "metrics")]
        self.metrics.handler.record((ended - started).as_secs_f64());
        // The claim limit (claimer.rs) follows slow handlers at once; for
        // fast ones the first and every 16th run are enough (and spare a
        // shared write per message).
        self.runs += 1;
        if self.runs == 1 || took_us >= 500 || self.runs.is_multiple_of(16) {
            shared.handler_time.record(took_us);
        }
        self.local.maybe_merge(&shared.stats, ended);
    }
}

/// One message taken by a handler loop.
struct Delivery {
    receipt: Receipt,
    /// When the read that claimed it returned.
    claimed_at: Instant,
    /// When the loop took it.
    started: Instant,
    /// This run's attempt number (from the attempts header).
    attempt: u32,
    /// PGMQ's `read_ct`.
    deliveries: u32,
}

/// The next message and how many are left behind it, waiting when the
/// claim queue is empty; None once `stop` fires or the queue closes.
async fn next_claimed(ctx: &ExecContext, local: &mut LocalHistograms) -> Option<(Claimed, usize)> {
    if ctx.stop.is_cancelled() {
        return None;
    }
    if let Some(item) = ctx.queue.try_pop() {
        return Some(item);
    }
    // Going idle. This loop's histograms reach the shared ones at most
    // every MERGE_EVERY (a merge walks and clears three histograms), and at
    // the latest when the wait outlasts that, so that an idle worker's
    // snapshot is complete.
    let mut merge_at = local.merge_due();
    loop {
        tokio::select! {
            biased;
            _ = ctx.stop.cancelled() => return None,
            r = ctx.queue.pop() => return r,
            _ = tokio::time::sleep_until(merge_at.unwrap_or_else(Instant::now).into()), if merge_at.is_some() => {
                local.merge(&ctx.shared.stats, Instant::now());
                merge_at = None;
            }
        }
    }
}

/// The dead-letter reason of a message that must not run again: delivered
/// more than `max_deliveries` times, or with its attempts used up.
fn past_limits(cfg: &Config, d: &Delivery) -> Option<String> {
    if d.deliveries > cfg.max_deliveries {
        // Delivered again and again without an attempt being recorded:
        // likely a message whose handler crashes the process.
        Some(format!(
            "delivered {} times, more than max_deliveries ({}), with {} attempts recorded",
            d.deliveries,
            cfg.max_deliveries,
            d.attempt - 1
        ))
    } else if d.attempt > cfg.max_attempts {
        // Its last allowed attempt failed, but the dead-letter write did
        // not happen (a crash after the retry was written, or a lower
        // max_attempts since).
        Some(format!(
            "{} attempts used, max_attempts is {}",
            d.attempt - 1,
            cfg.max_attempts
        ))
    } else {
        None
    }
}

/// Runs the handler on one decoded message: holds its lease, builds its
/// [`Context`], runs the hooks around it, and bounds it by
/// `handler_timeout` (cancelling the context when it is over).
async fn run_message<T: Send, R: Run<T>>(
    ctx: &ExecContext,
    run: &R,
    run_local: &mut R::Local,
    typed: Message<T>,
    d: &Delivery,
    counts: &HandlerCounters,
) -> (RunResult, Option<Settled>) {
    let shared = &ctx.shared;
    let cfg = &shared.config;
    let msg_id = d.receipt.msg_id;
    let attempt = d.attempt;
    let lease_end = d.claimed_at + cfg.visibility_timeout;
    let cancel = CancellationToken::new();
    shared.leases.start(d.receipt, lease_end, cancel.clone());
    if d.started.duration_since(d.claimed_at) >= cfg.visibility_timeout / 2 {
        // Past half its timeout already: extend it now rather than at the
        // heartbeat's next tick.
        shared.heartbeat.nudge();
    }
    let hctx = Context {
        cancel: cancel.clone(),
        deadline: cfg.handler_timeout.map(|t| d.started + t),
        attempt,
        deliveries: d.deliveries,
        msg_id,
        queue: Arc::clone(&ctx.queue_name),
    };
    let hooks = &cfg.hooks.0;
    let hook_ctx = (!hooks.is_empty()).then(|| hctx.clone());
    let (hooks_ran, refused) = match &hook_ctx {
        Some(c) => hooks::before_all(hooks, c, typed.headers.as_ref()),
        None => (0, None),
    };
    let span = handle_span(
        ctx.queue_name.as_str(),
        msg_id,
        attempt,
        typed.headers.as_ref(),
    );
    let call = run
        .run_settling(run_local, typed, hctx, shared, d.receipt)
        .instrument(span);
    let (result, settled) = if let Some(why) = refused {
        drop(call);
        match why {
            hooks::Refusal::Refused(e) => (Ok(Err(e)), None),
            hooks::Refusal::Panicked(p) => (Err(p), None),
        }
    } else {
        match cfg.handler_timeout {
            None => call.await,
            Some(limit) => match tokio::time::timeout(limit, call).await {
                Ok(r) => r,
                Err(_) => {
                    cancel.cancel();
                    bump(&counts.timed_out, 1);
                    (
                        Ok(Err(format!("handler timed out after {limit:?}").into())),
                        None,
                    )
                }
            },
        }
    };
    #[cfg(feature = "fault-injection")]
    if cfg.resume_panics {
        if let Err(p) = &result {
            std::panic::resume_unwind(Box::new(p.clone()));
        }
    }
    if let Some(c) = &hook_ctx {
        let seen = match &result {
            Ok(Ok(o)) => Ok(o.clone()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(p) => Err(p.clone()),
        };
        if let Some(p) = hooks::after_all(hooks, hooks_ran, c, &seen, d.started.elapsed()) {
            tracing::warn!(msg_id, panic = %truncate_reason(p.clone()), "a hook's after panicked");
            if settled.is_none() {
                // A failed attempt, as a handler panic is.
                return (Err(p), None);
            }
            // Acknowledged in the handler's transaction already: counted only.
            bump(&counts.panicked, 1);
        }
    }
    (result, settled)
}

/// Hands the acknowledgement to the completer; false when it no longer
/// takes any (the shutdown gave up on this abandoned handler: the message
/// comes back after its visibility timeout).
async fn send_ack(
    ctx: &ExecContext,
    counts: &HandlerCounters,
    d: &Delivery,
    kind: AckKind,
) -> bool {
    let stats = &ctx.shared.stats;
    bump(&counts.acks_sent, 1);
    let ack = Ack {
        receipt: d.receipt,
        attempt: d.attempt,
        deliveries: d.deliveries,
        kind,
    };
    if ctx.acks.send(ack).await.is_ok() {
        return true;
    }
    ctx.shared.leases.finish([d.receipt]);
    bump(&stats.acks_resolved, 1);
    bump(&stats.c.acks_failed, 1);
    false
}

/// The most bytes of handler-supplied text (an error's text, a panic
/// message, an `Outcome::DeadLetter` reason) that the worker logs or writes
/// into a dead-letter `reason` header: 512. Such text can quote the data
/// being handled; longer text is cut at a character boundary and ends in
/// `…`.
pub const MAX_REASON_LEN: usize = 512;

/// `reason` cut to [`MAX_REASON_LEN`] bytes.
pub(crate) fn truncate_reason(mut reason: String) -> String {
    if reason.len() > MAX_REASON_LEN {
        let mut end = MAX_REASON_LEN;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
        reason.push('…');
    }
    reason
}

/// Records a message a transactional run acknowledged itself.
fn settle(shared: &Shared, queue: &QueueName, receipt: Receipt, settled: Settled) {
    let c = &shared.stats.c;
    let already_lost = !shared.leases.finish([receipt]).is_empty();
    if matches!(settled, Settled::Written(_)) {
        shared.claims.acknowledged(shared.config.claim_reads);
    }
    match settled {
        Settled::Written(AckKind::Archive) => bump(&c.archived, 1),
        Settled::Written(_) => bump(&c.deleted, 1),
        Settled::Lost if !already_lost => {
            bump(&c.claims_lost, 1);
            tracing::warn!(queue = %queue, msg_id = receipt.msg_id, "claim lost: the message was delivered again; the handler's transaction was rolled back");
        }
        // Snoozed by the handler loop instead; never settled here.
        Settled::Lost | Settled::Unavailable(_) => {}
    }
}

/// Maps what the handler returned to what the completer writes.
fn outcome_to_ack(
    shared: &Shared,
    counts: &HandlerCounters,
    result: RunResult,
    attempt: u32,
) -> AckKind {
    let cfg = &shared.config;
    let delay = |d: Duration| {
        if cfg.retry_jitter {
            jittered(d)
        } else {
            d.min(pgmq_client::MAX_DELAY)
        }
    };
    let failure = |reason: String| {
        bump(&counts.failed, 1);
        // Cut once, before it is logged or written.
        let reason = truncate_reason(reason);
        if attempt >= cfg.max_attempts {
            tracing::debug!(attempt, %reason, "handler failed on its last attempt; dead-lettering");
            AckKind::DeadLetter {
                reason: format!("failed {attempt} times (max_attempts), last error: {reason}"),
            }
        } else {
            tracing::debug!(attempt, %reason, "handler failed; retrying with backoff");
            AckKind::Retry(delay(cfg.retry_backoff.delay(attempt)))
        }
    };
    match result {
        Ok(Ok(outcome)) => {
            bump(&counts.succeeded, 1);
            match outcome {
                Outcome::Delete => AckKind::Delete,
                Outcome::Archive => AckKind::Archive,
                Outcome::Retry(d) if attempt < cfg.max_attempts => {
                    AckKind::Retry(d.min(pgmq_client::MAX_DELAY))
                }
                Outcome::Retry(_) => AckKind::DeadLetter {
                    reason: format!("retried {attempt} times (max_attempts)"),
                },
                Outcome::Snooze(d) => AckKind::Snooze(d.min(pgmq_client::MAX_DELAY)),
                Outcome::DeadLetter(reason) => AckKind::DeadLetter {
                    reason: truncate_reason(reason),
                },
            }
        }
        Ok(Err(e)) => failure(e.to_string()),
        Err(panic) => {
            bump(&counts.panicked, 1);
            failure(panic)
        }
    }
}

/// The per-message span. A message whose headers carry a sender's trace
/// context (feature `otel`, see trace.rs) gets an INFO span that continues
/// that trace; others a DEBUG span, cheap when DEBUG is off.
fn handle_span(
    queue: &str,
    msg_id: i64,
    attempt: u32,
    headers: Option<&serde_json::Value>,
) -> tracing::Span {
    #[cfg(feature = "otel")]
    if let Some(cx) = crate::trace::sender_context(headers) {
        let span = tracing::info_span!("pgmq_worker.handle", queue = %queue, msg_id, attempt);
        crate::trace::continue_in(&span, cx);
        return span;
    }
    #[cfg(not(feature = "otel"))]
    let _ = headers;
    tracing::debug_span!("pgmq_worker.handle", queue = %queue, msg_id, attempt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_come_from_the_header() {
        assert_eq!(attempts_used(None), 0);
        assert_eq!(attempts_used(Some(&serde_json::json!({"x": 1}))), 0);
        assert_eq!(
            attempts_used(Some(&serde_json::json!({ATTEMPTS_HEADER: 3}))),
            3
        );
        assert_eq!(attempts_used(Some(&serde_json::json!([1, 2]))), 0);
    }
}
