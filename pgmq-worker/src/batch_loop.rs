//! The batch loop: the handler loop of a batch handler. It takes up to
//! `batch_max` messages from the claim queue (waiting at most
//! `batch_window` for more after the first), runs the handler once on
//! them, and maps each message's result to its acknowledgement as the
//! handler loop does for one.
//!
//! `concurrency` batch loops run at once, so `concurrency` is the number
//! of batches handled at once. Each message of a batch is checked as in the
//! handler loop before it joins the batch (not waited too long locally, not
//! delivered too often, a body that decodes into `T`; the hooks' `before`);
//! each has a [lease](crate::lease) of its own from the start of the run
//! until its acknowledgement is written, and its result goes through the
//! same outcome mapping ([`crate::handler_loop`]): one message's failure
//! retries that message alone, with its own attempt count. A whole-batch
//! failure (an `Err` for the batch, a panic, `handler_timeout`, a result
//! count that is not the batch's length) fails every message of the run.
//!
//! Two runs ([`BatchRun`]):
//!
//! - [`AsyncBatch`]: a [`BatchHandler`]'s future, panics caught; its
//!   results go to the completer (batched acknowledgements).
//! - [`TxBatch`]: a [`TransactionalBatchHandler`] in a transaction of its
//!   own on a pooled connection. **Fence first:** after BEGIN the batch's
//!   leases are marked [`State::Locked`] (the heartbeat stops extending
//!   them; an extension already on its way is waited for), then the rows
//!   still held by this worker's deliveries are locked (`SELECT ... FOR
//!   UPDATE`, fenced on `msg_id` and `last_read_at`); the handler gets only
//!   those. A message whose claim was lost before the lock is left out
//!   (`claims_lost`): nothing of it can commit. While locked, no other
//!   consumer can claim the rows (PGMQ's reads skip locked rows), so no
//!   claim is lost during the run. The fenced deletes (archives) of the
//!   successes run in the transaction before COMMIT; the other results go
//!   to the completer after the transaction ended. Every call of the
//!   worker's own (checkout, BEGIN, the lock, the acknowledgement, COMMIT,
//!   ROLLBACK) is bounded by `db_timeout`; a failure of those is the
//!   worker's (snoozed, no attempt used: `tx_unavailable`).

use std::collections::HashSet;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use futures::FutureExt;
use pgmq_client::{Message, Pgmq, QueueName, Receipt};
use serde::de::DeserializeOwned;
use tracing::Instrument;

use crate::batch_context::BatchContext;
use crate::claim_queue::Claimed;
use crate::completer::{acknowledge, AckKind};
use crate::context::Context;
use crate::fence;
use crate::handler::{
    panic_text, BatchHandler, BatchHandlerWithContext, HandlerError, MessageResult, Outcome,
    TransactionalBatchHandler,
};
use crate::handler_loop::{
    admit, after_hooks, begin_run, next_claimed, outcome_to_ack, refused_result, send_ack, settle,
    spawn_loops, unavailable_snooze, Delivery, HandlerLoops, LoopTiming, Spawner, STOPPED,
};
use crate::hooks;
use crate::lease::{Expiry, State};
use crate::runners::{within, worker_side, RunResult, Settled, TxConn};
use crate::stats::{bump, HandlerCounters, LocalHistograms};

/// What a batch run says of one message of its batch.
pub(crate) enum Each {
    /// What the handler (or the batch's failure) said of it: written by
    /// the completer, as a single handler's result.
    Ran(RunResult),
    /// Deleted or archived in the batch's transaction, committed.
    Written(AckKind),
    /// Its claim was lost before the transaction locked it: not run,
    /// nothing written for it.
    Lost,
    /// The worker's own database work around the run failed: snoozed, no
    /// attempt used.
    Unavailable(String),
    /// The run was stopped by the fence at the earliest of its messages'
    /// claims' ends (`fence.rs`): not acknowledged by this worker.
    Stopped,
}

/// One way of running a batch handler.
pub(crate) trait BatchRun<T: Send>: Send + Sync + 'static {
    /// Runs the handler on `msgs`, whose deliveries are `receipts` and
    /// whose contexts are `ctx` (same order); returns one [`Each`] per
    /// message, in that order.
    fn run(
        &self,
        loops: &HandlerLoops,
        msgs: Vec<Message<T>>,
        receipts: &[Receipt],
        ctx: BatchContext,
    ) -> impl Future<Output = Vec<Each>> + Send;
}

fn spawner<T: DeserializeOwned + Send + 'static, R: BatchRun<T>>(run: R) -> Box<dyn Spawner<T>> {
    spawn_loops(run, batch_loop::<T, R>)
}

/// The loops of a [`BatchHandler`].
pub(crate) fn batch_spawner<T: DeserializeOwned + Send + 'static, H: BatchHandler<T>>(
    handler: H,
) -> Box<dyn Spawner<T>> {
    spawner::<T, _>(AsyncBatch(handler))
}

/// The loops of a [`BatchHandlerWithContext`].
pub(crate) fn batch_with_context_spawner<
    T: DeserializeOwned + Send + 'static,
    H: BatchHandlerWithContext<T>,
>(
    handler: H,
) -> Box<dyn Spawner<T>> {
    spawner::<T, _>(AsyncBatchWithContext(handler))
}

/// The loops of a [`TransactionalBatchHandler`].
pub(crate) fn transactional_batch_spawner<
    T: DeserializeOwned + Send + 'static,
    H: TransactionalBatchHandler<T>,
>(
    handler: H,
) -> Box<dyn Spawner<T>> {
    spawner::<T, _>(TxBatch(handler))
}

/// Up to `batch_max` claimed messages: the first waited for (None once
/// `stop` fires or the queue closes), then what is queued now, then what
/// arrives within `batch_window` of the first (not once `stop` fires).
/// When messages are left behind, one more loop is woken for them.
async fn next_batch(ctx: &HandlerLoops, local: &mut LocalHistograms) -> Option<Vec<Claimed>> {
    let cfg = &ctx.settings;
    let max = cfg.batch_max.max(1);
    let (first, _) = next_claimed(ctx, local).await?;
    let mut items = Vec::with_capacity(max);
    items.push(first);
    let mut left = ctx.queue.try_pop_many(&mut items, max);
    if items.len() < max && !cfg.batch_window.is_zero() {
        let deadline = tokio::time::Instant::now() + cfg.batch_window;
        while items.len() < max {
            tokio::select! {
                biased;
                _ = ctx.stop.cancelled() => break,
                r = tokio::time::timeout_at(deadline, ctx.queue.pop()) => match r {
                    Ok(Some((item, _))) => {
                        items.push(item);
                        left = ctx.queue.try_pop_many(&mut items, max);
                    }
                    _ => break,
                },
            }
        }
    }
    if left > 0 {
        // Another batch is waiting: one more loop takes it meanwhile.
        ctx.queue.wake_one();
    }
    Some(items)
}

/// The messages of one batch a loop holds: should the loop unwind while it
/// holds them (a bug of the worker's), their leases end and they come back
/// after their visibility timeout.
struct Holding<'a> {
    loops: &'a HandlerLoops,
    receipts: Vec<Receipt>,
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        if !self.receipts.is_empty() && std::thread::panicking() {
            self.loops.leases.finish(self.receipts.drain(..));
        }
    }
}

/// Acknowledgements for the completer, each with its message's delivery.
type Acks = Vec<(Delivery, AckKind)>;

/// One message of a batch about to run (its body goes to the run).
struct Member {
    d: Delivery,
    /// When its claim may end.
    expiry: Arc<Expiry>,
    /// Its run's context (for the hooks).
    ctx: Context,
    /// How many hooks' `before` ran.
    hooks_ran: usize,
}

/// One batch loop: take a batch, check each message, run the batch,
/// acknowledge each message, until `stop`.
async fn batch_loop<T: DeserializeOwned + Send + 'static, R: BatchRun<T>>(
    ctx: Arc<HandlerLoops>,
    index: usize,
    run: Arc<R>,
) {
    let shared = &*ctx;
    let counts = &ctx.stats.per_handler[index];
    let mut timing = LoopTiming::new(&ctx);
    while let Some(items) = next_batch(&ctx, &mut timing.local).await {
        // In a prioritized group: waits for runs of the group's
        // concurrency; they and the messages' claims go back when this
        // batch's handling ends.
        let _slots = match &ctx.share {
            Some(s) => Some(s.start(items.len()).await),
            None => None,
        };
        let started = Instant::now();
        let mut holding = Holding {
            loops: shared,
            receipts: Vec::new(),
        };
        let (unstarted, ready) = admit_batch::<T>(shared, counts, &mut timing, items, started);
        if !send_acks(shared, counts, unstarted).await {
            // The completer takes no more (the shutdown gave up): what
            // this loop holds comes back after its visibility timeout.
            break;
        }
        let Begun {
            members,
            msgs,
            mut acks,
        } = begin_batch(shared, counts, ready, &mut holding);
        let run_started = Instant::now();
        let results = if members.is_empty() {
            Vec::new()
        } else {
            let results = run_batch(&ctx, &*run, &members, msgs, counts).await;
            timing.record_runs(shared, run_started, members.len());
            results
        };
        shared.panic_once.maybe_panic("handler loop");
        settle_batch(shared, counts, members, results, &mut acks);
        // Every message is handed on (settled, or its acknowledgement
        // below): nothing left to let go should the loop unwind.
        holding.receipts.clear();
        if !send_acks(shared, counts, acks).await {
            break;
        }
    }
    timing.local.merge(&ctx.stats, Instant::now());
}

/// Hands each acknowledgement to the completer, in order; false when it
/// takes no more (the rest are not sent).
async fn send_acks(shared: &HandlerLoops, counts: &HandlerCounters, acks: Acks) -> bool {
    for (d, kind) in acks {
        if !send_ack(shared, counts, &d, kind).await {
            return false;
        }
    }
    true
}

/// Checks each message of a batch as the handler loop checks one
/// ([`admit`]): those that may run, decoded, with their deliveries; and
/// the acknowledgements of those that may not (sent before the run).
fn admit_batch<T: DeserializeOwned>(
    shared: &HandlerLoops,
    counts: &HandlerCounters,
    timing: &mut LoopTiming,
    items: Vec<Claimed>,
    started: Instant,
) -> (Acks, Vec<(Message<T>, Delivery)>) {
    let mut unstarted = Vec::new();
    let mut ready = Vec::with_capacity(items.len());
    for item in items {
        let (msg, d) = Delivery::take(item, started);
        match admit::<T>(shared, counts, timing, msg, &d) {
            Ok(typed) => ready.push((typed, d)),
            Err(kind) => unstarted.push((d, kind)),
        }
    }
    (unstarted, ready)
}

/// A batch whose runs began.
struct Begun<T> {
    /// The messages that run, in the batch's order, and their bodies.
    members: Vec<Member>,
    msgs: Vec<Message<T>>,
    /// The acknowledgements of those a hook refused (each fails alone,
    /// acknowledged with the batch's).
    acks: Acks,
}

/// Begins each ready message's run ([`begin_run`]: its lease, held by
/// `holding`, and its context) and runs the hooks' `before` on it; one a
/// hook refuses fails this attempt alone, the others run.
fn begin_batch<T>(
    shared: &HandlerLoops,
    counts: &HandlerCounters,
    ready: Vec<(Message<T>, Delivery)>,
    holding: &mut Holding<'_>,
) -> Begun<T> {
    let hooks = &shared.settings.hooks.0;
    let mut begun = Begun {
        members: Vec::with_capacity(ready.len()),
        msgs: Vec::with_capacity(ready.len()),
        acks: Vec::with_capacity(ready.len()),
    };
    for (typed, d) in ready {
        let (expiry, hctx) = begin_run(shared, &d);
        holding.receipts.push(d.receipt);
        let (hooks_ran, refused) = if hooks.is_empty() {
            (0, None)
        } else {
            hooks::before_all(hooks, &hctx, typed.headers.as_ref())
        };
        if let Some(why) = refused {
            let result = refused_result(why);
            let result = after_hooks(shared, counts, hooks_ran, &hctx, result, &d, false);
            bump(&counts.handled, 1);
            let kind = outcome_to_ack(shared, counts, result, d.attempt);
            shared.leases.set_state([d.receipt], State::Acking);
            begun.acks.push((d, kind));
            continue;
        }
        begun.msgs.push(typed);
        begun.members.push(Member {
            d,
            expiry,
            ctx: hctx,
            hooks_ran,
        });
    }
    begun
}

/// Settles each member by what the run said of it ([`Each`]), after the
/// hooks' `after`: a result the handler (or the batch's failure) gave
/// becomes an acknowledgement in `acks`, as a single handler's would; a
/// message written in the batch's transaction, lost before it, or stopped
/// by the fence is [settled](settle) here; one the worker's own database
/// work failed is snoozed.
fn settle_batch(
    shared: &HandlerLoops,
    counts: &HandlerCounters,
    members: Vec<Member>,
    results: Vec<Each>,
    acks: &mut Acks,
) {
    let queue = &shared.settings.queue;
    let mut unavailable: Option<(usize, String)> = None;
    for (m, each) in members.into_iter().zip(results) {
        let receipt = m.d.receipt;
        // What the hooks see of a message settled without an
        // acknowledgement from the completer.
        let after_settled = |result: RunResult| {
            let _ = after_hooks(shared, counts, m.hooks_ran, &m.ctx, result, &m.d, true);
        };
        match each {
            Each::Ran(result) => {
                let result = after_hooks(shared, counts, m.hooks_ran, &m.ctx, result, &m.d, false);
                bump(&counts.handled, 1);
                shared.leases.set_state([receipt], State::Acking);
                let kind = outcome_to_ack(shared, counts, result, m.d.attempt);
                acks.push((m.d, kind));
            }
            Each::Written(kind) => {
                let outcome = match kind {
                    AckKind::Archive => Outcome::Archive,
                    _ => Outcome::Delete,
                };
                after_settled(Ok(Ok(outcome)));
                bump(&counts.handled, 1);
                bump(&counts.succeeded, 1);
                settle(shared, queue, receipt, Settled::Written(kind));
            }
            Each::Lost => {
                let why = "claim lost before the batch's transaction locked it; not run";
                after_settled(Ok(Err(why.into())));
                settle(shared, queue, receipt, Settled::Lost);
            }
            Each::Stopped => {
                after_settled(Ok(Err(STOPPED.into())));
                settle(shared, queue, receipt, Settled::Stopped);
            }
            Each::Unavailable(why) => {
                after_settled(Ok(Err(why.clone().into())));
                unavailable.get_or_insert((0, why)).0 += 1;
                shared.leases.set_state([receipt], State::Acking);
                acks.push((m.d, unavailable_snooze(shared)));
            }
        }
    }
    if let Some((n, why)) = unavailable {
        tracing::warn!(messages = n, reason = %why, "transactional batch could not use the database; its messages come back without using an attempt");
    }
}

/// Runs the batch within `handler_timeout`, in its span; one [`Each`] per
/// member.
async fn run_batch<T: Send, R: BatchRun<T>>(
    ctx: &HandlerLoops,
    run: &R,
    members: &[Member],
    msgs: Vec<Message<T>>,
    counts: &HandlerCounters,
) -> Vec<Each> {
    let cfg = &ctx.settings;
    let n = members.len();
    let receipts: Vec<Receipt> = members.iter().map(|m| m.d.receipt).collect();
    let span = tracing::debug_span!("pgmq_worker.handle_batch", queue = %cfg.queue, messages = n);
    let bctx = BatchContext::new(members.iter().map(|m| m.ctx.clone()).collect());
    let call = run.run(ctx, msgs, &receipts, bctx).instrument(span);
    let ends = || members.iter().map(|m| Arc::clone(&m.expiry)).collect();
    let call = async {
        match fence::bounded(call, cfg.fence, ends).await {
            Some(out) => out,
            None => {
                // Stopped at the earliest claim's end; work it spawned is
                // told.
                for m in members {
                    m.ctx.cancel.cancel();
                }
                (0..n).map(|_| Each::Stopped).collect()
            }
        }
    };
    let mut out = match cfg.handler_timeout {
        None => call.await,
        Some(limit) => match tokio::time::timeout(limit, call).await {
            Ok(r) => r,
            Err(_) => {
                for m in members.iter() {
                    m.ctx.cancel.cancel();
                }
                bump(&counts.timed_out, n as u64);
                let why = format!("batch handler timed out after {limit:?}");
                return fail_all(n, &why);
            }
        },
    };
    #[cfg(feature = "fault-injection")]
    if cfg.resume_panics {
        for e in &out {
            if let Each::Ran(Err(p)) = e {
                std::panic::resume_unwind(Box::new(p.clone()));
            }
        }
    }
    if out.len() != n {
        // A run always answers for each message; should it not, nothing is
        // lost: the missing ones are failed attempts.
        out.resize_with(n, || {
            Each::Ran(Ok(Err(
                "the batch run gave no result for this message".into()
            )))
        });
    }
    out
}

/// `n` failed attempts with the text `why`.
fn fail_all(n: usize, why: &str) -> Vec<Each> {
    (0..n)
        .map(|_| Each::Ran(Ok(Err(why.to_owned().into()))))
        .collect()
}

/// `n` panicked runs with the panic's text.
fn panicked_all(n: usize, why: &str) -> Vec<Each> {
    (0..n).map(|_| Each::Ran(Err(why.to_owned()))).collect()
}

/// The handler's results for a batch of `n`, or every message failed
/// when it failed as a whole (an `Err`, a panic, a count that is not `n`).
fn results_of(
    r: Result<Result<Vec<MessageResult>, HandlerError>, String>,
    n: usize,
) -> Result<Vec<MessageResult>, Vec<Each>> {
    match r {
        Err(panic) => Err(panicked_all(n, &panic)),
        Ok(Err(e)) => Err(fail_all(n, &e.to_string())),
        Ok(Ok(v)) if v.len() != n => Err(fail_all(
            n,
            &format!(
                "the batch handler returned {} results for {n} messages",
                v.len()
            ),
        )),
        Ok(Ok(v)) => Ok(v),
    }
}

/// A [`BatchHandler`]'s runs, on the runtime; its results go to the
/// completer.
pub(crate) struct AsyncBatch<H>(pub H);

impl<T: Send + 'static, H: BatchHandler<T>> BatchRun<T> for AsyncBatch<H> {
    async fn run(
        &self,
        _: &HandlerLoops,
        msgs: Vec<Message<T>>,
        _: &[Receipt],
        _: BatchContext,
    ) -> Vec<Each> {
        let n = msgs.len();
        ran(self.0.handle(msgs), n).await
    }
}

/// A [`BatchHandlerWithContext`]'s runs: as [`AsyncBatch`], with the
/// batch's context.
pub(crate) struct AsyncBatchWithContext<H>(pub H);

impl<T: Send + 'static, H: BatchHandlerWithContext<T>> BatchRun<T> for AsyncBatchWithContext<H> {
    async fn run(
        &self,
        _: &HandlerLoops,
        msgs: Vec<Message<T>>,
        _: &[Receipt],
        ctx: BatchContext,
    ) -> Vec<Each> {
        let n = msgs.len();
        ran(self.0.handle(msgs, ctx), n).await
    }
}

/// The [`Each`]es of an async batch handler's call for `n` messages, a
/// panic caught.
async fn ran(
    call: impl Future<Output = Result<Vec<MessageResult>, HandlerError>>,
    n: usize,
) -> Vec<Each> {
    let r = AssertUnwindSafe(call)
        .catch_unwind()
        .await
        .map_err(|p| panic_text(&*p));
    match results_of(r, n) {
        Ok(v) => v.into_iter().map(|r| Each::Ran(Ok(r))).collect(),
        Err(failed) => failed,
    }
}

/// A [`TransactionalBatchHandler`]'s runs: each batch in a transaction of
/// its own, fenced first (see the module docs).
pub(crate) struct TxBatch<H>(pub H);

impl<T: Send + 'static, H: TransactionalBatchHandler<T>> BatchRun<T> for TxBatch<H> {
    async fn run(
        &self,
        loops: &HandlerLoops,
        msgs: Vec<Message<T>>,
        receipts: &[Receipt],
        _: BatchContext,
    ) -> Vec<Each> {
        let n = msgs.len();
        let conn = match loops
            .runs
            .source
            .checkout(loops.runs.settings.db_timeout)
            .await
        {
            Ok(c) => c,
            Err(e) => return unavailable_all(n, "checking out a connection", &e),
        };
        let mut held = TxConn { conn, clean: false };
        let (out, clean) = self
            .in_transaction(&mut held.conn, loops, msgs, receipts)
            .await;
        held.clean = clean;
        out
    }
}

/// Every message of a batch of `n` snoozed: the worker's own `what` failed.
fn unavailable_all(n: usize, what: &str, e: &pgmq_client::Error) -> Vec<Each> {
    let why = format!("{what} failed: {e}");
    (0..n).map(|_| Each::Unavailable(why.clone())).collect()
}

/// A batch of `n` whose transaction failed with `e` during `what`: the
/// worker's failure (snoozed, no attempt used) or the handler's.
fn tx_failed_all(n: usize, what: &str, e: pgmq_client::Error) -> Vec<Each> {
    if worker_side(&e) {
        unavailable_all(n, what, &e)
    } else {
        fail_all(n, &format!("{what} failed: {e}"))
    }
}

/// Locks the batch's rows in `tx`, fenced on `receipts`
/// ([`Pgmq::lock_fenced`]; by id alone when `unfenced`); returns the ids
/// locked: the messages this worker still owns.
async fn lock_fenced(
    tx: &pgmq_client::Transaction<'_>,
    queue: &QueueName,
    unfenced: bool,
    receipts: &[Receipt],
) -> Result<HashSet<i64>, pgmq_client::Error> {
    let pg = Pgmq::on(tx);
    let locked = if unfenced {
        let ids: Vec<i64> = receipts.iter().map(|r| r.msg_id).collect();
        pg.lock_batch(queue, &ids).await?
    } else {
        pg.lock_fenced(queue, receipts).await?
    };
    Ok(locked.into_iter().collect())
}

impl<H> TxBatch<H> {
    /// Runs the batch in a transaction on `conn`, fenced first; the second
    /// value says whether the transaction ended cleanly (so that `conn` may
    /// go back to the pool). Every call of the worker's own here is bounded
    /// by `db_timeout`.
    async fn in_transaction<T: Send + 'static>(
        &self,
        conn: &mut crate::db::Held,
        loops: &HandlerLoops,
        msgs: Vec<Message<T>>,
        receipts: &[Receipt],
    ) -> (Vec<Each>, bool)
    where
        H: TransactionalBatchHandler<T>,
    {
        let cfg = &loops.runs.settings;
        let limit = cfg.db_timeout;
        let n = msgs.len();
        let tx = match within(limit, conn.transaction()).await {
            Ok(tx) => tx,
            Err(e) => return (tx_failed_all(n, "BEGIN", e), false),
        };
        // Fence first. The heartbeat leaves locked rows alone (its UPDATE
        // would wait for this transaction); one of its writes already on
        // its way lands before the lock.
        loops
            .leases
            .set_state(receipts.iter().copied(), State::Locked);
        loops.heartbeat.after_write().await;
        let owned = match within(
            limit,
            lock_fenced(&tx, &cfg.queue, cfg.fence_off.unfenced(), receipts),
        )
        .await
        {
            Ok(owned) => owned,
            Err(e) => {
                let clean = !worker_side(&e) && within(limit, tx.rollback()).await.is_ok();
                return (tx_failed_all(n, "locking the batch", e), clean);
            }
        };
        let mut out: Vec<Option<Each>> = (0..n).map(|_| None).collect();
        let mut run_msgs = Vec::with_capacity(owned.len());
        let mut run_idx = Vec::with_capacity(owned.len());
        for (i, (m, r)) in msgs.into_iter().zip(receipts).enumerate() {
            if owned.contains(&r.msg_id) {
                run_msgs.push(m);
                run_idx.push(i);
            } else {
                out[i] = Some(Each::Lost);
            }
        }
        let finish = |out: Vec<Option<Each>>| -> Vec<Each> {
            out.into_iter()
                .map(|e| e.unwrap_or_else(|| Each::Ran(Ok(Err("not run".into())))))
                .collect()
        };
        let fill = |out: &mut Vec<Option<Each>>, eaches: Vec<Each>| {
            for (i, e) in run_idx.iter().zip(eaches) {
                out[*i] = Some(e);
            }
        };
        if run_msgs.is_empty() {
            let clean = within(limit, tx.rollback()).await.is_ok();
            return (finish(out), clean);
        }
        let k = run_msgs.len();
        let r = AssertUnwindSafe(self.0.handle(run_msgs, &tx))
            .catch_unwind()
            .await
            .map_err(|p| panic_text(&*p));
        let results = match results_of(r, k) {
            Ok(v) => v,
            Err(failed) => {
                // The handler's writes are undone with the transaction.
                let clean = within(limit, tx.rollback()).await.is_ok();
                fill(&mut out, failed);
                return (finish(out), clean);
            }
        };
        let mut deletes = Vec::new();
        let mut archives = Vec::new();
        for (j, r) in results.iter().enumerate() {
            match r {
                Ok(Outcome::Delete) => deletes.push(receipts[run_idx[j]]),
                Ok(Outcome::Archive) => archives.push(receipts[run_idx[j]]),
                _ => {}
            }
        }
        if deletes.is_empty() && archives.is_empty() {
            // Nothing succeeded: nothing commits.
            let clean = within(limit, tx.rollback()).await.is_ok();
            fill(
                &mut out,
                results.into_iter().map(|r| Each::Ran(Ok(r))).collect(),
            );
            return (finish(out), clean);
        }
        let pg = Pgmq::on(&tx);
        let (q, unfenced) = (&cfg.queue, cfg.fence_off.unfenced());
        let written = within(limit, async {
            let d = acknowledge(&pg, q, unfenced, false, &deletes).await?;
            let a = acknowledge(&pg, q, unfenced, true, &archives).await?;
            Ok((d.len(), a.len()))
        })
        .await;
        match written {
            Err(e) => {
                let clean = !worker_side(&e) && within(limit, tx.rollback()).await.is_ok();
                fill(
                    &mut out,
                    tx_failed_all(k, "the acknowledgement in the transaction", e),
                );
                (finish(out), clean)
            }
            Ok((d, a)) if d < deletes.len() || a < archives.len() => {
                // Locked by this transaction, yet not matched: the handler
                // changed the rows. Nothing commits.
                let clean = within(limit, tx.rollback()).await.is_ok();
                let why = format!(
                    "the batch's fenced acknowledgement matched {} of its {} successes (did the handler change the queue's rows?); rolled back",
                    d + a,
                    deletes.len() + archives.len()
                );
                fill(&mut out, fail_all(k, &why));
                (finish(out), clean)
            }
            Ok(_) => match within(limit, tx.commit()).await {
                Err(e) => {
                    fill(&mut out, tx_failed_all(k, "COMMIT", e));
                    (finish(out), false)
                }
                Ok(()) => {
                    let eaches = results
                        .into_iter()
                        .map(|r| match r {
                            Ok(Outcome::Delete) => Each::Written(AckKind::Delete),
                            Ok(Outcome::Archive) => Each::Written(AckKind::Archive),
                            other => Each::Ran(Ok(other)),
                        })
                        .collect();
                    fill(&mut out, eaches);
                    (finish(out), true)
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_that_fails_as_a_whole_fails_each_message() {
        let ok = |v: Vec<MessageResult>| results_of(Ok(Ok(v)), 2);
        assert!(ok(vec![Ok(Outcome::Delete), Err("x".into())]).is_ok());
        let short = ok(vec![Ok(Outcome::Delete)]).unwrap_err();
        assert_eq!(short.len(), 2);
        assert!(
            matches!(&short[1], Each::Ran(Ok(Err(e))) if e.to_string().contains("1 results for 2"))
        );
        let panicked = results_of(Err("boom".into()), 3).unwrap_err();
        assert!(panicked
            .iter()
            .all(|e| matches!(e, Each::Ran(Err(p)) if p == "boom")));
        let failed = results_of(Ok(Err("down".into())), 2).unwrap_err();
        assert!(failed
            .iter()
            .all(|e| matches!(e, Each::Ran(Ok(Err(e))) if e.to_string() == "down")));
    }
}
