//! What a handler knows about the delivery it runs: cancellation, deadline,
//! attempt, queue.

use std::sync::Arc;
use std::time::Instant;

use pgmq_client::QueueName;
use tokio_util::sync::CancellationToken;

/// The context of one handler run, given to a
/// [`HandlerWithContext`](crate::HandlerWithContext).
///
/// Its [cancellation](Context::cancelled) fires when
/// - the claim is lost: a fenced write (the heartbeat's extension) found the
///   message taken by another delivery, so this run's outcome will not be
///   written;
/// - the run outlives `handler_timeout` (the worker then stops waiting for
///   it: an async handler's future is dropped, and the message is retried
///   with backoff, an attempt used);
/// - an immediate shutdown abandons running handlers.
///
/// Cheap to clone (an `Arc` and a token).
#[derive(Debug, Clone)]
pub struct Context {
    pub(crate) cancel: CancellationToken,
    pub(crate) deadline: Option<Instant>,
    pub(crate) attempt: u32,
    pub(crate) deliveries: u32,
    pub(crate) msg_id: i64,
    pub(crate) queue: Arc<QueueName>,
}

impl Context {
    /// Resolves when the run is cancelled (see the type's docs).
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await;
    }

    /// Whether the run was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The cancellation token itself, to hand to code that takes one.
    pub fn cancellation_token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// When `handler_timeout` ends for this run (None without a timeout).
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// This run's attempt number: 1 on the first run, one more after each
    /// run that failed or returned [`Outcome::Retry`](crate::Outcome::Retry).
    /// Claims given back unstarted, snoozes and runs cut short by a crash do
    /// not count (see `max_attempts` and `max_deliveries`).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// How many times the message was delivered (PGMQ's `read_ct`, less the
    /// deliveries undone by releases and snoozes).
    pub fn deliveries(&self) -> u32 {
        self.deliveries
    }

    /// The message id.
    pub fn msg_id(&self) -> i64 {
        self.msg_id
    }

    /// The queue the message came from.
    pub fn queue(&self) -> &QueueName {
        &self.queue
    }

    /// A context for calling a handler in a test, outside a worker: attempt
    /// 1, one delivery, no deadline, never cancelled unless through
    /// [`cancellation_token`](Self::cancellation_token).
    ///
    /// ```
    /// let ctx = pgmq_worker::Context::for_test(pgmq_client::QueueName::new("jobs").unwrap(), 7);
    /// assert_eq!(ctx.attempt(), 1);
    /// assert!(!ctx.is_cancelled());
    /// ```
    pub fn for_test(queue: QueueName, msg_id: i64) -> Self {
        Context {
            cancel: CancellationToken::new(),
            deadline: None,
            attempt: 1,
            deliveries: 1,
            msg_id,
            queue: Arc::new(queue),
        }
    }
}
