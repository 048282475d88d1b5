//! The runners: how one handler run happens, for each kind of handler.
//!
//! - [`AsyncRun`] and [`ContextRun`]: the handler's future, on the
//!   runtime, with panics caught.
//! - [`TxRun`]: a [`TransactionalHandler`] in a transaction of its own on a
//!   pooled connection; a `Delete` or `Archive` is written (fenced) in that
//!   transaction ([`Settled`]). Every call of the worker's own around it
//!   (checkout, BEGIN, the acknowledgement, COMMIT, ROLLBACK) is bounded by
//!   `db_timeout`; a failure of those is the worker's, not the handler's
//!   ([`Settled::Unavailable`]: no attempt used).
//! - [`BlockingRun`]: a blocking handler's loop is a tokio task too, which
//!   hands each message to a dedicated plain thread of its own and waits
//!   for the result, so that CPU-bound work never stalls the runtime, a
//!   hung run can be abandoned at `handler_timeout` (its thread is left to
//!   end on its own, the loop starts a new one), and a hung thread never
//!   keeps the process alive at exit. At most
//!   `max_abandoned_blocking_threads` abandoned threads may still run; past
//!   that, a loop acknowledges its own abandoned run (its retry written, its
//!   lease ended) and then waits for one to end before it takes another
//!   message. With FIFO groups a loop waits for its abandoned run's thread
//!   to return before acknowledging it, so a group never has two runs at
//!   once.
//!
//! The handler loop ([`crate::handler_loop`]) calls them through [`Run`];
//! what they read is [`RunEnv`].

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use pgmq_client::{Message, Pgmq, QueueName, Receipt};
use tokio_util::sync::CancellationToken;

use crate::completer::{AckKind, FenceOff};
use crate::context::Context;
use crate::db::Source;
use crate::handler::{
    panic_text, BlockingHandler, Handler, HandlerError, HandlerWithContext, Outcome,
    TransactionalHandler,
};
use crate::health::HealthState;

/// What the runners read.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub queue: QueueName,
    pub db_timeout: Duration,
    /// Group-ordered claims: a blocking loop waits for its abandoned run.
    pub fifo_groups: bool,
    /// Runs fenced on their claims' ends (a fleet-wide limit of places): a
    /// blocking loop waits for its abandoned run too.
    pub fenced: bool,
    pub max_abandoned_blocking_threads: usize,
    /// Test hook: a transactional success acknowledged without the fence.
    pub fence_off: FenceOff,
    /// Test hook: a FIFO blocking loop acknowledges its abandoned run
    /// without waiting for its thread.
    #[cfg(feature = "fault-injection")]
    pub fifo_blocking_wait_off: bool,
}

impl Settings {
    /// Whether a blocking loop waits for its abandoned run's thread before
    /// acknowledging it (or leaving it unacknowledged) and taking another
    /// message: with FIFO groups, unless the `fifo_blocking_wait_off` test
    /// hook (feature `fault-injection`) says otherwise, and under a fence,
    /// so that a run that cannot be stopped is not joined by another on
    /// its loop.
    fn waits_for_abandoned(&self) -> bool {
        if self.fenced {
            return true;
        }
        #[cfg(feature = "fault-injection")]
        if self.fifo_blocking_wait_off {
            return false;
        }
        self.fifo_groups
    }
}

/// What a run reads beyond its message: the runners' settings and the
/// handles they touch.
pub(crate) struct RunEnv {
    pub settings: Settings,
    /// Where a transactional run's connection comes from.
    pub source: Source,
    /// Counts the blocking loops that wait for an abandoned thread.
    pub health: Arc<HealthState>,
}

/// The result of one handler run: its return value, or the panic's text.
pub(crate) type RunResult = Result<Result<Outcome, HandlerError>, String>;

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
        _env: &RunEnv,
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
        _env: &RunEnv,
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
        _env: &RunEnv,
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
    /// Stopped by the fence at its claim's end (`fence.rs`): not
    /// acknowledged by this worker.
    Stopped,
}

/// Whether `e`, met by the worker's own call around a transactional
/// handler, is the worker's failure rather than the handler's: no
/// connection to be had, a connection lost, a call that timed out. An
/// error the server reported (a deferred constraint or a serialization
/// failure at COMMIT, a transaction the handler left aborted) is the
/// handler's: it uses an attempt, so that a message that always fails that
/// way is dead-lettered in the end.
pub(crate) fn worker_side(e: &pgmq_client::Error) -> bool {
    matches!(
        e,
        pgmq_client::Error::PoolTimeout
            | pgmq_client::Error::ConnectionLost { .. }
            | pgmq_client::Error::Connect(_)
    )
}

/// `call` within `limit`; past it, [`pgmq_client::Error::timed_out`].
pub(crate) async fn within<T>(
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
pub(crate) struct TxConn {
    pub(crate) conn: crate::db::Held,
    pub(crate) clean: bool,
}

impl Drop for TxConn {
    fn drop(&mut self) {
        if !self.clean {
            self.conn.abandon();
        }
    }
}

/// A [`TransactionalHandler`]'s runs: each in a transaction of its own.
pub(crate) struct TxRun<H>(pub H);

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
        env: &RunEnv,
        receipt: Receipt,
    ) -> (RunResult, Option<Settled>) {
        let limit = env.settings.db_timeout;
        let conn = match env.source.checkout(limit).await {
            Ok(c) => c,
            Err(e) => return unavailable("checking out a connection", &e),
        };
        let mut held = TxConn { conn, clean: false };
        let (out, clean) = self
            .in_transaction(&mut held.conn, msg, ctx, env, receipt)
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
        env: &RunEnv,
        receipt: Receipt,
    ) -> ((RunResult, Option<Settled>), bool)
    where
        H: TransactionalHandler<T>,
    {
        let cfg = &env.settings;
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
        let archive = matches!(kind, AckKind::Archive);
        let written = within(
            limit,
            crate::completer::acknowledge(
                &pg,
                &cfg.queue,
                cfg.fence_off.unfenced(),
                archive,
                &[receipt],
            ),
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

/// An async [`Handler`]'s runs, on the runtime.
pub(crate) struct AsyncRun<H>(pub H);

impl<T: Send + 'static, H: Handler<T>> Run<T> for AsyncRun<H> {
    type Local = ();

    async fn run(&self, _: &mut (), msg: Message<T>, _ctx: Context) -> RunResult {
        AssertUnwindSafe(self.0.handle(msg))
            .catch_unwind()
            .await
            .map_err(|p| panic_text(&*p))
    }
}

/// A [`HandlerWithContext`]'s runs, on the runtime.
pub(crate) struct ContextRun<H>(pub H);

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

/// A [`BlockingHandler`]'s runs, each on its loop's own thread.
pub(crate) struct BlockingRun<H> {
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
    async fn after_run(&self, thread: &mut BlockingThread, env: &RunEnv) {
        if !env.settings.waits_for_abandoned() {
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
        env: &RunEnv,
        stop: &CancellationToken,
    ) {
        let Some(end) = thread.abandoned.take() else {
            return;
        };
        let cfg = &env.settings;
        let cap = self.abandoned.get_or_init(|| {
            Arc::new(tokio::sync::Semaphore::new(
                cfg.max_abandoned_blocking_threads,
            ))
        });
        let permit = match Arc::clone(cap).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let _waiting = BlockingWait::new(&env.health);
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

impl<H> BlockingRun<H> {
    pub(crate) fn new(handler: H) -> Self {
        BlockingRun {
            handler: Arc::new(handler),
            abandoned: std::sync::OnceLock::new(),
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
struct BlockingWait<'a>(&'a HealthState);

impl<'a> BlockingWait<'a> {
    fn new(health: &'a HealthState) -> Self {
        health.blocking_wait(true);
        BlockingWait(health)
    }
}

impl Drop for BlockingWait<'_> {
    fn drop(&mut self) {
        self.0.blocking_wait(false);
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
