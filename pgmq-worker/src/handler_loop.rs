//! The handler loop: takes a message from the claim queue, decides whether
//! it may run, runs it through its runner, maps the outcome to an
//! acknowledgement, and hands that to the completer.
//!
//! `concurrency` long-lived handler loops pull messages from the claim queue:
//! no task is spawned per message. Each loop decides whether the message may
//! run at all (not waited too long locally, not delivered too often, a body
//! that decodes into `T`), runs the handler ([`crate::runners`]) with its
//! hooks, within `handler_timeout`, turns the result into an
//! acknowledgement and hands it to the completer. While the handler runs
//! and until its acknowledgement is written, the delivery is a
//! [lease](crate::lease) the heartbeat extends.
//!
//! **Attempts are handler runs.** The attempt number is one more than the
//! `x-pgmq-worker-attempts` header ([`crate::protocol`]), which each retry
//! writes (fenced) with the message's visibility; PGMQ's `read_ct` counts
//! deliveries instead, which include claims lost in a crash before their
//! handler ran. So a message is dead-lettered after `max_attempts` runs
//! that failed, and, as a guard against a message that crashes the process
//! every time (no attempt is ever written), after `max_deliveries`
//! deliveries without running.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgmq_client::{Message, QueueName, RawJson, Receipt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backoff::{retry_delay, Backoff};
use crate::claim_queue::{ClaimQueue, Claimed, WAKE_BUDGET};
use crate::completer::{Ack, AckKind};
use crate::context::Context;
use crate::fence;
use crate::handler::{
    panic_text_of, BlockingHandler, Handler, HandlerWithContext, Outcome, TransactionalHandler,
};
use crate::heartbeat::HeartbeatSignals;
use crate::hooks::{self, HookList};
use crate::lease::{Expiry, Leases, State};
use crate::protocol::{attempts_used, truncate_reason};
use crate::runners::{AsyncRun, BlockingRun, ContextRun, Run, RunEnv, RunResult, Settled, TxRun};
use crate::stats::{bump, micros, HandlerCounters, LocalHistograms, Stats};
use crate::supervise::{PanicOnce, Supervisor};
use crate::wake::Wake;

/// What the handler loops read.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub queue: Arc<QueueName>,
    pub concurrency: usize,
    pub visibility_timeout: Duration,
    pub handler_timeout: Option<Duration>,
    pub max_attempts: u32,
    pub max_deliveries: u32,
    pub retry_backoff: Backoff,
    pub retry_jitter: bool,
    pub hooks: HookList,
    /// Wake the claimers when a run acknowledged its message itself
    /// (group-ordered claims: the group's next message is claimable).
    pub wake_claimers: bool,
    /// Batch handlers: the most messages one run takes (1 otherwise).
    pub batch_max: usize,
    /// Batch handlers: how long a run waits for more messages after the
    /// first (zero: what is queued at once).
    pub batch_window: Duration,
    /// Under a fleet-wide limit of places: runs are fenced on their
    /// claims' ends, stopping this margin before (`fence.rs`).
    pub fence: Option<Duration>,
    /// Test hook: a handler's caught panic is raised again in its loop.
    #[cfg(feature = "fault-injection")]
    pub resume_panics: bool,
}

/// The handler loops: their settings, their runners' environment, and the
/// handles they touch.
pub(crate) struct HandlerLoops {
    pub settings: Settings,
    pub runs: RunEnv,
    pub queue: Arc<ClaimQueue<Claimed>>,
    pub acks: mpsc::Sender<Ack>,
    /// Stops the loops taking new messages.
    pub stop: CancellationToken,
    pub stats: Arc<Stats>,
    pub leases: Arc<Leases>,
    pub heartbeat: Arc<HeartbeatSignals>,
    pub wake: Wake,
    pub supervisor: Supervisor,
    pub panic_once: Arc<PanicOnce>,
    /// In a prioritized group: each message waits for one of the group's
    /// runs, and gives it and its claim back when its handling ends
    /// (`priority.rs`).
    pub share: Option<crate::priority::Share>,
}

/// Starts the handler loops of one worker; type-erased over the handler.
pub(crate) trait Spawner<T>: Send {
    fn spawn(self: Box<Self>, ctx: Arc<HandlerLoops>) -> Vec<JoinHandle<()>>;
}

impl<T, F> Spawner<T> for F
where
    F: FnOnce(Arc<HandlerLoops>) -> Vec<JoinHandle<()>> + Send,
{
    fn spawn(self: Box<Self>, ctx: Arc<HandlerLoops>) -> Vec<JoinHandle<()>> {
        (*self)(ctx)
    }
}

/// A [`Spawner`] of `concurrency` loops, each `body(ctx, index, run)`, all
/// sharing one runner. Supervised as the other internal tasks are: a loop
/// that panics anyway is restarted, counted and shown in health.
pub(crate) fn spawn_loops<T, R, F, Fut>(run: R, body: F) -> Box<dyn Spawner<T>>
where
    R: Send + Sync + 'static,
    F: Fn(Arc<HandlerLoops>, usize, Arc<R>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (run, body) = (Arc::new(run), Arc::new(body));
    Box::new(move |ctx: Arc<HandlerLoops>| {
        (0..ctx.settings.concurrency)
            .map(|i| {
                let (ctx2, run, body) = (Arc::clone(&ctx), Arc::clone(&run), Arc::clone(&body));
                ctx.supervisor.spawn("handler loop", move || {
                    body(Arc::clone(&ctx2), i, Arc::clone(&run))
                })
            })
            .collect()
    })
}

fn spawner<T: DeserializeOwned + Send + 'static, R: Run<T>>(run: R) -> Box<dyn Spawner<T>> {
    spawn_loops(run, handler_loop::<T, R>)
}

/// The loops of a [`TransactionalHandler`].
pub(crate) fn transactional_spawner<
    T: DeserializeOwned + Send + 'static,
    H: TransactionalHandler<T>,
>(
    handler: H,
) -> Box<dyn Spawner<T>> {
    spawner::<T, _>(TxRun(handler))
}

/// The loops of an async [`Handler`].
pub(crate) fn async_spawner<T: DeserializeOwned + Send + 'static, H: Handler<T>>(
    handler: H,
) -> Box<dyn Spawner<T>> {
    spawner::<T, _>(AsyncRun(handler))
}

/// The loops of a [`HandlerWithContext`].
pub(crate) fn context_spawner<T: DeserializeOwned + Send + 'static, H: HandlerWithContext<T>>(
    handler: H,
) -> Box<dyn Spawner<T>> {
    spawner::<T, _>(ContextRun(handler))
}

/// The loops of a [`BlockingHandler`].
pub(crate) fn blocking_spawner<T: DeserializeOwned + Send + 'static, H: BlockingHandler<T>>(
    handler: H,
) -> Box<dyn Spawner<T>> {
    spawner::<T, _>(BlockingRun::new(handler))
}

/// One handler loop: take a message, run it, acknowledge, until `stop`.
async fn handler_loop<T: DeserializeOwned + Send + 'static, R: Run<T>>(
    ctx: Arc<HandlerLoops>,
    index: usize,
    run: Arc<R>,
) {
    let shared = &*ctx;
    let cfg = &ctx.settings;
    let stats = &ctx.stats;
    let counts = &stats.per_handler[index];
    let mut timing = LoopTiming::new(&ctx);
    let mut run_local = R::Local::default();
    while let Some((item, left)) = next_claimed(&ctx, &mut timing.local).await {
        // In a prioritized group: waits for a run of the group's
        // concurrency; the slot gives the run and the message's claim back
        // when its handling ends, however the iteration ends.
        let slot = match &ctx.share {
            Some(s) => Some(s.start(1).await),
            None => None,
        };
        let (msg, d) = Delivery::take(item, Instant::now());
        let receipt = d.receipt;
        if left > 0 && d.started.duration_since(d.claimed_at) > WAKE_BUDGET {
            // The loops awake are not keeping up with this batch (handlers
            // slower than their average said): one more joins.
            ctx.queue.wake_one();
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
        let kind = match admit::<T>(shared, counts, &mut timing, msg, &d) {
            Err(kind) => kind,
            Ok(typed) => {
                let (result, settled) =
                    run_message(&ctx, &*run, &mut run_local, typed, &d, counts).await;
                run.after_run(&mut run_local, &ctx.runs).await;
                if let Some(Settled::Stopped) = settled {
                    // Its claim may have ended: not acknowledged here.
                    holding.disarm();
                    settle(shared, &cfg.queue, receipt, Settled::Stopped);
                    continue;
                }
                shared.leases.set_state([receipt], State::Acking);
                timing.record_run(shared, d.started);
                shared.panic_once.maybe_panic("handler loop");
                if let Some(Settled::Unavailable(why)) = &settled {
                    tracing::warn!(msg_id = receipt.msg_id, reason = %why, "transactional run could not use the database; the message comes back without using an attempt");
                    unavailable_snooze(shared)
                } else {
                    bump(&counts.handled, 1);
                    if let Some(settled) = settled {
                        // Acknowledged in the handler's transaction: nothing
                        // for the completer.
                        bump(&counts.succeeded, 1);
                        holding.disarm();
                        settle(shared, &ctx.settings.queue, receipt, settled);
                        continue;
                    }
                    outcome_to_ack(shared, counts, result, d.attempt)
                }
            }
        };
        holding.disarm();
        if !send_ack(&ctx, counts, &d, kind).await {
            break;
        }
        drop(slot);
        run.before_next(&mut run_local, &ctx.runs, &ctx.stop).await;
    }
    timing.local.merge(stats, Instant::now());
}

/// A message a handler loop took and has not handed on yet: should the
/// loop unwind while it holds it, its lease ends (the heartbeat stops
/// extending it) and it comes back after its visibility timeout.
struct Holding<'a> {
    shared: &'a HandlerLoops,
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
pub(crate) struct LoopTiming {
    pub(crate) local: LocalHistograms,
    /// Handler runs so far.
    runs: u64,
    #[cfg(feature = "metrics")]
    metrics: crate::metrics::LoopMetrics,
}

impl LoopTiming {
    pub(crate) fn new(ctx: &HandlerLoops) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = ctx;
        LoopTiming {
            local: LocalHistograms::new(),
            runs: 0,
            #[cfg(feature = "metrics")]
            metrics: crate::metrics::LoopMetrics::new(ctx.settings.queue.as_str()),
        }
    }

    /// How long a message waited in the claim queue.
    pub(crate) fn record_wait(&mut self, waited: Duration) {
        self.local.h.queue_wait_local.record(micros(waited));
        #[cfg(feature = "metrics")]
        self.metrics.wait.record(waited.as_secs_f64());
    }

    /// A handler run that started at `started` and just ended: its latency,
    /// and the moving average the claim limit follows.
    fn record_run(&mut self, shared: &HandlerLoops, started: Instant) {
        self.record_runs(shared, started, 1);
    }

    /// A run of `n` messages (a batch handler's) that started at `started`
    /// and just ended: its latency for each of them, and its time per
    /// message in the moving average (the rate the claim limit follows).
    pub(crate) fn record_runs(&mut self, shared: &HandlerLoops, started: Instant, n: usize) {
        let ended = Instant::now();
        let took_us = micros(ended - started);
        let n = n.max(1);
        self.local.h.handler_latency.record_n(took_us, n as u64);
        #[cfg(feature = "metrics")]
        for _ in 0..n {
            self.metrics.handler.record((ended - started).as_secs_f64());
        }
        // The claim limit (claimer.rs) follows slow handlers at once; for
        // fast ones the first and every 16th run are enough (and spare a
        // shared write per message).
        self.runs += 1;
        let per_msg_us = took_us / n as u64;
        if self.runs == 1 || per_msg_us >= 500 || self.runs.is_multiple_of(16) {
            shared.queue.record_run(per_msg_us);
        }
        self.local.maybe_merge(&shared.stats, ended);
    }
}

/// One message taken by a handler loop.
pub(crate) struct Delivery {
    pub(crate) receipt: Receipt,
    /// When the read that claimed it returned.
    pub(crate) claimed_at: Instant,
    /// When the read that claimed it was sent (its claim's end counts
    /// from it).
    pub(crate) sent_at: Instant,
    /// When the loop took it.
    pub(crate) started: Instant,
    /// This run's attempt number (from the attempts header).
    pub(crate) attempt: u32,
    /// PGMQ's `read_ct`.
    pub(crate) deliveries: u32,
}

impl Delivery {
    /// A claimed message its loop took at `started`: the message, and its
    /// delivery.
    pub(crate) fn take(item: Claimed, started: Instant) -> (Message<RawJson>, Delivery) {
        let Claimed {
            msg,
            receipt,
            claimed_at,
            sent_at,
        } = item;
        let d = Delivery {
            receipt,
            claimed_at,
            sent_at,
            started,
            attempt: attempts_used(msg.headers.as_ref()).saturating_add(1),
            deliveries: u32::try_from(msg.read_ct).unwrap_or(0),
        };
        (msg, d)
    }
}

/// Whether a message a loop took may run: its body decoded into `T`, or
/// the acknowledgement that ends it unstarted. Records how long it waited
/// locally, unless too long.
///
/// A message that waited locally for 3/4 of its visibility timeout is not
/// started: it is about to become visible again (and may be claimed by
/// another worker); running it would likely deliver it twice. It is given
/// back at once instead, its read undone, so that waiting here uses up no
/// delivery (the completer writes it with the acknowledgements). One
/// delivered too often or with its attempts used up is dead-lettered
/// ([`past_limits`]); one whose body does not decode too.
pub(crate) fn admit<T: DeserializeOwned>(
    shared: &HandlerLoops,
    counts: &HandlerCounters,
    timing: &mut LoopTiming,
    msg: Message<RawJson>,
    d: &Delivery,
) -> Result<Message<T>, AckKind> {
    let cfg = &shared.settings;
    let waited = d.started.duration_since(d.claimed_at);
    if waited >= cfg.visibility_timeout * 3 / 4 {
        bump(&counts.expired_unstarted, 1);
        return Err(AckKind::Release);
    }
    timing.record_wait(waited);
    if let Some(reason) = past_limits(cfg, d) {
        return Err(AckKind::DeadLetter { reason });
    }
    // A `Deserialize` of the user's is user code too: a panic in it is a
    // failed attempt, as a handler panic is.
    match std::panic::catch_unwind(AssertUnwindSafe(|| msg.decode::<T>())) {
        Err(p) => Err(outcome_to_ack(
            shared,
            counts,
            Err(panic_text_of("the body's Deserialize", &*p)),
            d.attempt,
        )),
        Ok(Err(e)) => {
            bump(&counts.decode_failures, 1);
            Err(AckKind::DeadLetter {
                reason: truncate_reason(format!("body does not decode: {e}")),
            })
        }
        Ok(Ok(typed)) => Ok(typed),
    }
}

/// Starts a message's run: its [lease](crate::lease), from now until its
/// acknowledgement is written (ended early by cancelling the context), and
/// the [`Context`] its handler and hooks see; returns its claim's end
/// and the context.
pub(crate) fn begin_run(shared: &HandlerLoops, d: &Delivery) -> (Arc<Expiry>, Context) {
    let cfg = &shared.settings;
    let expiry = Expiry::new(d.sent_at + cfg.visibility_timeout);
    let cancel = CancellationToken::new();
    shared
        .leases
        .start(d.receipt, Arc::clone(&expiry), cancel.clone());
    if d.started.duration_since(d.claimed_at) >= cfg.visibility_timeout / 2 {
        // Past half its timeout already: extend it now rather than at the
        // heartbeat's next tick.
        shared.heartbeat.nudge();
    }
    let hctx = Context {
        cancel,
        deadline: cfg.handler_timeout.map(|t| d.started + t),
        attempt: d.attempt,
        deliveries: d.deliveries,
        msg_id: d.receipt.msg_id,
        queue: Arc::clone(&cfg.queue),
    };
    (expiry, hctx)
}

/// What a hook's refusal makes of a run: a failed attempt, or a panicked
/// one.
pub(crate) fn refused_result(why: hooks::Refusal) -> RunResult {
    match why {
        hooks::Refusal::Refused(e) => Ok(Err(e)),
        hooks::Refusal::Panicked(p) => Err(p),
    }
}

/// Runs the `after` of the first `ran` hooks on one message's result; an
/// `after` that panics makes the result a failed attempt (as a handler
/// panic), unless the message was already `settled` (acknowledged in the
/// handler's transaction, or not acknowledged here): then it is only
/// counted.
pub(crate) fn after_hooks(
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

/// The acknowledgement of a message whose transactional run could not use
/// the database (the worker's own work failed, not the handler): back
/// soon, with no attempt (nor delivery) used.
pub(crate) fn unavailable_snooze(shared: &HandlerLoops) -> AckKind {
    let cfg = &shared.settings;
    bump(&shared.stats.c.tx_unavailable, 1);
    AckKind::Snooze(retry_delay(&cfg.retry_backoff, 1, cfg.retry_jitter))
}

/// The next message and how many are left behind it, waiting when the
/// claim queue is empty; None once `stop` fires or the queue closes.
pub(crate) async fn next_claimed(
    ctx: &HandlerLoops,
    local: &mut LocalHistograms,
) -> Option<(Claimed, usize)> {
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
                local.merge(&ctx.stats, Instant::now());
                merge_at = None;
            }
        }
    }
}

/// The dead-letter reason of a message that must not run again: delivered
/// more than `max_deliveries` times, or with its attempts used up.
pub(crate) fn past_limits(cfg: &Settings, d: &Delivery) -> Option<String> {
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
    ctx: &HandlerLoops,
    run: &R,
    run_local: &mut R::Local,
    typed: Message<T>,
    d: &Delivery,
    counts: &HandlerCounters,
) -> (RunResult, Option<Settled>) {
    let shared = ctx;
    let cfg = &ctx.settings;
    let msg_id = d.receipt.msg_id;
    let attempt = d.attempt;
    let (expiry, hctx) = begin_run(shared, d);
    let cancel = hctx.cancel.clone();
    let hooks = &cfg.hooks.0;
    let hook_ctx = (!hooks.is_empty()).then(|| hctx.clone());
    let (hooks_ran, refused) = match &hook_ctx {
        Some(c) => hooks::before_all(hooks, c, typed.headers.as_ref()),
        None => (0, None),
    };
    let span = handle_span(
        ctx.settings.queue.as_str(),
        msg_id,
        attempt,
        typed.headers.as_ref(),
    );
    let call = run
        .run_settling(run_local, typed, hctx, &ctx.runs, d.receipt)
        .instrument(span);
    let call = async {
        match fence::bounded(call, cfg.fence, || vec![expiry]).await {
            Some(out) => out,
            None => {
                // Stopped at its claim's end; work it spawned is told.
                cancel.cancel();
                (Ok(Err(STOPPED.into())), Some(Settled::Stopped))
            }
        }
    };
    let (result, settled) = if let Some(why) = refused {
        drop(call);
        (refused_result(why), None)
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
    let result = match &hook_ctx {
        Some(c) => after_hooks(shared, counts, hooks_ran, c, result, d, settled.is_some()),
        None => result,
    };
    (result, settled)
}

/// Hands the acknowledgement to the completer; false when it no longer
/// takes any (the shutdown gave up on this abandoned handler: the message
/// comes back after its visibility timeout).
pub(crate) async fn send_ack(
    ctx: &HandlerLoops,
    counts: &HandlerCounters,
    d: &Delivery,
    kind: AckKind,
) -> bool {
    let stats = &ctx.stats;
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
    ctx.leases.finish([d.receipt]);
    bump(&stats.acks_resolved, 1);
    bump(&stats.c.acks_failed, 1);
    false
}

/// What a run stopped by its fence returned, as the hooks see it.
pub(crate) const STOPPED: &str =
    "stopped at its claim's end: the claim was not extended in time, so another worker may hold the message";

/// Records a message a transactional run acknowledged itself, or one that
/// is not acknowledged here (its claim lost, or its run stopped by the
/// fence).
pub(crate) fn settle(shared: &HandlerLoops, queue: &QueueName, receipt: Receipt, settled: Settled) {
    let c = &shared.stats.c;
    let already_lost = !shared.leases.finish([receipt]).is_empty();
    if matches!(settled, Settled::Written(_)) && shared.settings.wake_claimers {
        // The group's next message is claimable now.
        shared.wake.wake();
    }
    match settled {
        Settled::Written(AckKind::Archive) => bump(&c.archived, 1),
        Settled::Written(_) => bump(&c.deleted, 1),
        Settled::Lost if !already_lost => {
            bump(&c.claims_lost, 1);
            tracing::warn!(queue = %queue, msg_id = receipt.msg_id, "claim lost: the message was delivered again; the handler's transaction was rolled back");
        }
        Settled::Stopped => {
            bump(&c.stopped_at_claim_end, 1);
            tracing::warn!(queue = %queue, msg_id = receipt.msg_id, "handler run stopped at its claim's end: the claim was not extended in time (the process was stopped or could not reach the database), so another worker may hold the message now; its outcome will not be written here");
        }
        // Snoozed by the handler loop instead; never settled here.
        Settled::Lost | Settled::Unavailable(_) => {}
    }
}

/// Maps what the handler returned to what the completer writes.
pub(crate) fn outcome_to_ack(
    shared: &HandlerLoops,
    counts: &HandlerCounters,
    result: RunResult,
    attempt: u32,
) -> AckKind {
    let cfg = &shared.settings;
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
            AckKind::Retry(retry_delay(&cfg.retry_backoff, attempt, cfg.retry_jitter))
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
