//! Runs the handlers.
//!
//! `concurrency` long-lived handler loops pull messages from the claim queue:
//! no task is spawned per message. Each loop decodes the body into `T`, runs
//! the handler with panics caught, turns the result into an acknowledgement
//! and hands it to the completer. An async handler's loop is a tokio task;
//! a blocking handler's loop runs on a thread of its own (tokio's blocking
//! pool, held for the worker's life), so CPU-bound work never stalls the
//! runtime.

use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use futures::FutureExt;
use pgmq_client::Message;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::claim_queue::{ClaimQueue, WAKE_BUDGET};
use crate::claimer::Claimed;
use crate::completer::{Ack, AckKind};
use crate::handler::{panic_text, BlockingHandler, Handler, HandlerError, Outcome};
use crate::stats::{bump, micros, record, HandlerCounters, LocalHistograms};
use crate::worker::Shared;

/// What a handler loop needs.
pub(crate) struct ExecContext {
    pub shared: Arc<Shared>,
    pub queue: Arc<ClaimQueue<Claimed>>,
    pub acks: mpsc::Sender<Ack>,
    pub stop: CancellationToken,
}

/// The result of one handler run: its return value, or the panic's text.
type RunResult = Result<Result<Outcome, HandlerError>, String>;

/// One way of running a handler (async on the runtime, or blocking in place).
pub(crate) trait Run<T>: Send + Sync + 'static {
    fn run(&self, msg: Message<T>) -> impl Future<Output = RunResult> + Send;
}

struct AsyncRun<H>(H);

impl<T: Send + 'static, H: Handler<T>> Run<T> for AsyncRun<H> {
    async fn run(&self, msg: Message<T>) -> RunResult {
        AssertUnwindSafe(self.0.handle(msg))
            .catch_unwind()
            .await
            .map_err(|p| panic_text(&*p))
    }
}

struct BlockingRun<H>(H);

impl<T: Send + 'static, H: BlockingHandler<T>> Run<T> for BlockingRun<H> {
    async fn run(&self, msg: Message<T>) -> RunResult {
        // Runs on the loop's own thread (see `BlockingSpawner`).
        std::panic::catch_unwind(AssertUnwindSafe(|| self.0.handle(msg)))
            .map_err(|p| panic_text(&*p))
    }
}

/// Starts the handler loops of one worker; type-erased over the handler.
pub(crate) trait Spawner<T>: Send {
    fn spawn(self: Box<Self>, ctx: Arc<ExecContext>) -> Vec<JoinHandle<()>>;
}

pub(crate) struct AsyncSpawner<T, H> {
    run: Arc<AsyncRun<H>>,
    _t: PhantomData<fn() -> T>,
}

impl<T, H> AsyncSpawner<T, H> {
    pub(crate) fn new(handler: H) -> Self {
        AsyncSpawner {
            run: Arc::new(AsyncRun(handler)),
            _t: PhantomData,
        }
    }
}

impl<T: DeserializeOwned + Send + 'static, H: Handler<T>> Spawner<T> for AsyncSpawner<T, H> {
    fn spawn(self: Box<Self>, ctx: Arc<ExecContext>) -> Vec<JoinHandle<()>> {
        (0..ctx.shared.config.concurrency)
            .map(|i| {
                let ctx = Arc::clone(&ctx);
                let run = Arc::clone(&self.run);
                tokio::spawn(handler_loop::<T, _>(ctx, i, run))
            })
            .collect()
    }
}

pub(crate) struct BlockingSpawner<T, H> {
    run: Arc<BlockingRun<H>>,
    _t: PhantomData<fn() -> T>,
}

impl<T, H> BlockingSpawner<T, H> {
    pub(crate) fn new(handler: H) -> Self {
        BlockingSpawner {
            run: Arc::new(BlockingRun(handler)),
            _t: PhantomData,
        }
    }
}

impl<T: DeserializeOwned + Send + 'static, H: BlockingHandler<T>> Spawner<T>
    for BlockingSpawner<T, H>
{
    fn spawn(self: Box<Self>, ctx: Arc<ExecContext>) -> Vec<JoinHandle<()>> {
        (0..ctx.shared.config.concurrency)
            .map(|i| {
                let ctx = Arc::clone(&ctx);
                let run = Arc::clone(&self.run);
                let rt = tokio::runtime::Handle::current();
                // The whole loop runs on this blocking-pool thread: waiting for
                // a message or for room in the completer parks the thread, and
                // the handler runs right here, off the runtime's workers.
                tokio::task::spawn_blocking(move || rt.block_on(handler_loop::<T, _>(ctx, i, run)))
            })
            .collect()
    }
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
    let slot = &shared.slots[index];
    let vt_us = micros(cfg.visibility_timeout);
    // A message that waited locally for 3/4 of its visibility timeout is not
    // started: it is about to become visible again (and may be claimed by
    // another worker); running it would likely deliver it twice. It is
    // given back at once instead, its read undone.
    let stale_after = cfg.visibility_timeout * 3 / 4;
    let half_vt = cfg.visibility_timeout / 2;
    let mut runs: u64 = 0;
    let max_attempts = cfg.max_attempts;
    let mut local = LocalHistograms::new();
    loop {
        if ctx.stop.is_cancelled() {
            break;
        }
        let (item, left) = match ctx.queue.try_pop() {
            Some(item) => item,
            None => {
                // Going idle. This loop's histograms reach the shared ones at
                // most every MERGE_EVERY (a merge walks and clears three
                // histograms: done on every idle moment of 8 loops, once per
                // claimed batch each, it was a tenth of the client's CPU per
                // message), and at the latest when the wait outlasts that, so
                // that an idle worker's snapshot is complete.
                let mut merge_at = local.merge_due();
                let item = loop {
                    tokio::select! {
                        biased;
                        _ = ctx.stop.cancelled() => break None,
                        r = ctx.queue.pop() => break r,
                        _ = tokio::time::sleep_until(merge_at.unwrap_or_else(Instant::now).into()), if merge_at.is_some() => {
                            local.merge(stats, Instant::now());
                            merge_at = None;
                        }
                    }
                };
                match item {
                    Some(item) => item,
                    None => break,
                }
            }
        };
        shared.room.free(1);
        let Claimed { msg, claimed_at } = item;
        let started = Instant::now();
        let waited = started.duration_since(claimed_at);
        if left > 0 && waited > WAKE_BUDGET {
            // The loops awake are not keeping up with this batch (handlers
            // slower than their average said): one more joins.
            ctx.queue.wake_one();
        }
        let msg_id = msg.msg_id;
        let attempts = u32::try_from(msg.read_ct).unwrap_or(0);
        if waited < stale_after {
            record(&mut local.h.queue_wait_local, micros(waited));
        }
        let kind = if waited >= stale_after {
            // Given back with its read undone, so that waiting here uses up
            // no attempt (the completer writes it with the acknowledgements).
            bump(&counts.expired_unstarted, 1);
            AckKind::Release {
                read_ct: msg.read_ct,
            }
        } else if attempts > max_attempts {
            // Delivered again after its last allowed attempt (a crash or an
            // abandoned handler): do not run it again.
            AckKind::DeadLetter {
                reason: format!(
                    "delivered {attempts} times, more than max_attempts ({max_attempts})"
                ),
            }
        } else {
            match msg.decode::<T>() {
                Err(e) => {
                    bump(&counts.decode_failures, 1);
                    AckKind::DeadLetter {
                        reason: format!("body does not decode: {e}"),
                    }
                }
                Ok(typed) => {
                    let deadline_us = shared.us_since_epoch(claimed_at) + vt_us;
                    slot.start(msg_id, deadline_us);
                    if waited >= half_vt {
                        // Past half its timeout already: extend it now
                        // rather than at the heartbeat's next tick.
                        shared.heartbeat_nudge.notify_one();
                    }
                    let span = tracing::debug_span!("pgmq_worker.handle", msg_id, attempts);
                    let result = run.run(typed).instrument(span).await;
                    slot.finish();
                    let ended = Instant::now();
                    let took_us = micros(ended - started);
                    record(&mut local.h.handler_latency, took_us);
                    // The claim limit (claimer.rs) follows slow handlers at
                    // once; for fast ones the first and every 16th run are
                    // enough (and spare a shared write per message).
                    runs += 1;
                    if runs == 1 || took_us >= 500 || runs % 16 == 0 {
                        shared.record_handler_time(took_us);
                    }
                    bump(&counts.handled, 1);
                    let kind = outcome_to_ack(shared, counts, result, attempts);
                    local.maybe_merge(stats, ended);
                    kind
                }
            }
        };
        bump(&counts.acks_sent, 1);
        if ctx
            .acks
            .send(Ack {
                msg_id,
                attempts,
                kind,
            })
            .await
            .is_err()
        {
            // The completer stopped taking acknowledgements: the shutdown
            // gave up on this (abandoned) handler. The message comes back
            // after its visibility timeout.
            bump(&stats.acks_resolved, 1);
            bump(&stats.c.acks_failed, 1);
            break;
        }
    }
    local.merge(stats, Instant::now());
}

/// Maps what the handler returned to what the completer writes.
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

fn outcome_to_ack(
    shared: &Shared,
    counts: &HandlerCounters,
    result: RunResult,
    attempts: u32,
) -> AckKind {
    let cfg = &shared.config;
    let failure = |reason: String| {
        let reason = truncate_reason(reason);
        bump(&counts.failed, 1);
        if attempts >= cfg.max_attempts {
            tracing::debug!(attempts, %reason, "handler failed on its last attempt; dead-lettering");
            AckKind::DeadLetter {
                reason: format!("failed {attempts} times, last error: {reason}"),
            }
        } else {
            tracing::debug!(attempts, %reason, "handler failed; retrying with backoff");
            AckKind::Retry(cfg.retry_backoff.delay(attempts))
        }
    };
    match result {
        Ok(Ok(outcome)) => {
            bump(&counts.succeeded, 1);
            match outcome {
                Outcome::Delete => AckKind::Delete,
                Outcome::Archive => AckKind::Archive,
                Outcome::Retry(d) if attempts < cfg.max_attempts => AckKind::Retry(d),
                Outcome::Retry(_) => AckKind::DeadLetter {
                    reason: format!("retried {attempts} times (max_attempts)"),
                },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_cut_to_the_limit() {
        assert_eq!(truncate_reason("short".into()), "short");
        let long = truncate_reason("x".repeat(10_000));
        assert_eq!(long.len(), MAX_REASON_LEN + '…'.len_utf8());
        // Never in the middle of a character.
        let wide = truncate_reason("é".repeat(MAX_REASON_LEN));
        assert!(wide.ends_with('…'));
        assert!(wide.len() <= MAX_REASON_LEN + '…'.len_utf8());
    }
}
