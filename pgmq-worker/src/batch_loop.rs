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
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backoff::retry_delay;
use crate::claim_queue::Claimed;
use crate::completer::{acknowledge, AckKind};
use crate::context::Context;
use crate::fence;
use crate::handler::{
    panic_text, BatchHandler, HandlerError, MessageResult, Outcome, TransactionalBatchHandler,
};
use crate::handler_loop::{
    next_claimed, outcome_to_ack, past_limits, send_ack, settle, spawn_loops, Delivery,
    HandlerLoops, LoopTiming, Spawner, STOPPED,
};
use crate::hooks::{self, Refusal};
use crate::lease::{Expiry, State};
use crate::protocol::{attempts_used, truncate_reason};
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
    /// Runs the handler on `msgs`, whose deliveries are `receipts` (same
    /// order); returns one [`Each`] per message, in that order.
    fn run(
        &self,
        loops: &HandlerLoops,
        msgs: Vec<Message<T>>,
        receipts: &[Receipt],
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
    let cfg = &ctx.settings;
    let counts = &ctx.stats.per_handler[index];
    // As in the handler loop: a message that waited 3/4 of its visibility
    // timeout locally is given back unstarted.
    let stale_after = cfg.visibility_timeout * 3 / 4;
    let mut timing = LoopTiming::new(&ctx);
    'batches: while let Some(items) = next_batch(&ctx, &mut timing.local).await {
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
        // Acknowledgements decided before the run (not started, not
        // runnable), sent before it starts.
        let mut early: Vec<(Delivery, AckKind)> = Vec::new();
        let mut ready: Vec<(Message<T>, Delivery)> = Vec::with_capacity(items.len());
        for Claimed {
            msg,
            receipt,
            claimed_at,
            sent_at,
        } in items
        {
            let d = Delivery {
                receipt,
                claimed_at,
                sent_at,
                started,
                attempt: attempts_used(msg.headers.as_ref()).saturating_add(1),
                deliveries: u32::try_from(msg.read_ct).unwrap_or(0),
            };
            let waited = started.duration_since(claimed_at);
            if waited >= stale_after {
                bump(&counts.expired_unstarted, 1);
                early.push((d, AckKind::Release));
                continue;
            }
            timing.record_wait(waited);
            if let Some(reason) = past_limits(cfg, &d) {
                early.push((d, AckKind::DeadLetter { reason }));
                continue;
            }
            let typed = match std::panic::catch_unwind(AssertUnwindSafe(|| msg.decode::<T>())) {
                Err(p) => {
                    let why = crate::handler::panic_text_of("the body's Deserialize", &*p);
                    let kind = outcome_to_ack(shared, counts, Err(why), d.attempt);
                    early.push((d, kind));
                    continue;
                }
                Ok(Err(e)) => {
                    bump(&counts.decode_failures, 1);
                    let reason = truncate_reason(format!("body does not decode: {e}"));
                    early.push((d, AckKind::DeadLetter { reason }));
                    continue;
                }
                Ok(Ok(typed)) => typed,
            };
            ready.push((typed, d));
        }
        for (d, kind) in early {
            if !send_ack(&ctx, counts, &d, kind).await {
                // The completer takes no more (the shutdown gave up): what
                // this loop holds comes back after its visibility timeout.
                break 'batches;
            }
        }
        let mut members: Vec<Member> = Vec::with_capacity(ready.len());
        let mut msgs: Vec<Message<T>> = Vec::with_capacity(ready.len());
        // Refused by a hook: failed alone, acknowledged with the batch's.
        let mut acks: Vec<(Delivery, AckKind)> = Vec::with_capacity(ready.len());
        for (typed, d) in ready {
            let (receipt, claimed_at) = (d.receipt, d.claimed_at);
            let waited = started.duration_since(claimed_at);
            // Its lease, from now until its acknowledgement is written.
            let cancel = CancellationToken::new();
            let expiry = Expiry::new(d.sent_at + cfg.visibility_timeout);
            shared
                .leases
                .start(receipt, Arc::clone(&expiry), cancel.clone());
            holding.receipts.push(receipt);
            if waited >= cfg.visibility_timeout / 2 {
                shared.heartbeat.nudge();
            }
            let hctx = Context {
                cancel,
                deadline: cfg.handler_timeout.map(|t| started + t),
                attempt: d.attempt,
                deliveries: d.deliveries,
                msg_id: receipt.msg_id,
                queue: Arc::clone(&cfg.queue),
            };
            let (hooks_ran, refused) = if cfg.hooks.0.is_empty() {
                (0, None)
            } else {
                hooks::before_all(&cfg.hooks.0, &hctx, typed.headers.as_ref())
            };
            if let Some(why) = refused {
                // Refused alone: it fails this attempt, the others run.
                let result = match why {
                    Refusal::Refused(e) => Ok(Err(e)),
                    Refusal::Panicked(p) => Err(p),
                };
                let result = after_hooks(shared, counts, hooks_ran, &hctx, result, &d, false);
                bump(&counts.handled, 1);
                let kind = outcome_to_ack(shared, counts, result, d.attempt);
                shared.leases.set_state([receipt], State::Acking);
                acks.push((d, kind));
                continue;
            }
            msgs.push(typed);
            members.push(Member {
                d,
                expiry,
                ctx: hctx,
                hooks_ran,
            });
        }
        let run_started = Instant::now();
        let results = if members.is_empty() {
            Vec::new()
        } else {
            run_batch(&ctx, &*run, &members, msgs, counts).await
        };
        if !members.is_empty() {
            timing.record_runs(shared, run_started, members.len());
        }
        shared.panic_once.maybe_panic("handler loop");
        let mut unavailable: Option<(usize, String)> = None;
        for (m, each) in members.into_iter().zip(results) {
            let receipt = m.d.receipt;
            match each {
                Each::Ran(result) => {
                    let result =
                        after_hooks(shared, counts, m.hooks_ran, &m.ctx, result, &m.d, false);
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
                    let _ = after_hooks(
                        shared,
                        counts,
                        m.hooks_ran,
                        &m.ctx,
                        Ok(Ok(outcome)),
                        &m.d,
                        true,
                    );
                    bump(&counts.handled, 1);
                    bump(&counts.succeeded, 1);
                    settle(shared, &cfg.queue, receipt, Settled::Written(kind));
                }
                Each::Lost => {
                    let why = "claim lost before the batch's transaction locked it; not run";
                    let _ = after_hooks(
                        shared,
                        counts,
                        m.hooks_ran,
                        &m.ctx,
                        Ok(Err(why.into())),
                        &m.d,
                        true,
                    );
                    settle(shared, &cfg.queue, receipt, Settled::Lost);
                }
                Each::Stopped => {
                    let _ = after_hooks(
                        shared,
                        counts,
                        m.hooks_ran,
                        &m.ctx,
                        Ok(Err(STOPPED.into())),
                        &m.d,
                        true,
                    );
                    settle(shared, &cfg.queue, receipt, Settled::Stopped);
                }
                Each::Unavailable(why) => {
                    let _ = after_hooks(
                        shared,
                        counts,
                        m.hooks_ran,
                        &m.ctx,
                        Ok(Err(why.clone().into())),
                        &m.d,
                        true,
                    );
                    bump(&shared.stats.c.tx_unavailable, 1);
                    unavailable.get_or_insert((0, why)).0 += 1;
                    shared.leases.set_state([receipt], State::Acking);
                    let delay = retry_delay(&cfg.retry_backoff, 1, cfg.retry_jitter);
                    acks.push((m.d, AckKind::Snooze(delay)));
                }
            }
        }
        if let Some((n, why)) = unavailable {
            tracing::warn!(messages = n, reason = %why, "transactional batch could not use the database; its messages come back without using an attempt");
        }
        // Every message is handed on (settled, or its acknowledgement
        // below): nothing left to let go should the loop unwind.
        holding.receipts.clear();
        for (d, kind) in acks {
            if !send_ack(&ctx, counts, &d, kind).await {
                break 'batches;
            }
        }
    }
    timing.local.merge(&ctx.stats, Instant::now());
}

/// Runs every hook's `after` on one message's result; an `after` that
/// panics makes the result a failed attempt (as a handler panic), unless
/// the message was already `settled` (acknowledged in the transaction, or
/// not run): then it is only counted.
fn after_hooks(
    shared: &HandlerLoops,
    counts: &HandlerCounters,
    ran: usize,
    ctx: &Context,
    result: RunResult,
    d: &Delivery,
    settled: bool,
) -> RunResult {
    if ran == 0 {
        return result;
    }
    let seen = match &result {
        Ok(Ok(o)) => Ok(o.clone()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(p) => Err(p.clone()),
    };
    match hooks::after_all(
        &shared.settings.hooks.0,
        ran,
        ctx,
        &seen,
        d.started.elapsed(),
    ) {
        None => result,
        Some(p) => {
            tracing::warn!(msg_id = d.receipt.msg_id, panic = %truncate_reason(p.clone()), "a hook's after panicked");
            if settled {
                bump(&counts.panicked, 1);
                result
            } else {
                Err(p)
            }
        }
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
    let call = run.run(ctx, msgs, &receipts).instrument(span);
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
    async fn run(&self, _: &HandlerLoops, msgs: Vec<Message<T>>, _: &[Receipt]) -> Vec<Each> {
        let n = msgs.len();
        let r = AssertUnwindSafe(self.0.handle(msgs))
            .catch_unwind()
            .await
            .map_err(|p| panic_text(&*p));
        match results_of(r, n) {
            Ok(v) => v.into_iter().map(|r| Each::Ran(Ok(r))).collect(),
            Err(failed) => failed,
        }
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
            lock_fenced(&tx, &cfg.queue, cfg.unfenced(), receipts),
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
        let (q, unfenced) = (&cfg.queue, cfg.unfenced());
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
