//! What a batch handler knows about the batch it runs: cancellation,
//! deadline, and each message's attempt and deliveries.

use std::time::Instant;

use pgmq_client::QueueName;

use crate::context::Context;

/// The context of one batch run, given to a
/// [`BatchHandlerWithContext`](crate::BatchHandlerWithContext): a
/// [`Context`] per message, in the batch's order, and what holds for the
/// batch as a whole.
///
/// The batch is [cancelled](BatchContext::cancelled) when any of its
/// messages' runs is: the batch outlives `handler_timeout`, the fence stops
/// it at the earliest of its claims' ends, a claim is lost, or an immediate
/// shutdown abandons it. Its [deadline](BatchContext::deadline) is the
/// earliest of its messages' deadlines.
///
/// ```
/// use pgmq_client::QueueName;
/// use pgmq_worker::{BatchContext, Context};
/// let q = QueueName::new("jobs").unwrap();
/// let ctx = BatchContext::for_test(vec![Context::for_test(q.clone(), 1), Context::for_test(q, 2)]);
/// assert_eq!(ctx.len(), 2);
/// assert_eq!(ctx.attempt(1), Some(1));
/// assert!(!ctx.is_cancelled());
/// ```
#[derive(Debug, Clone)]
pub struct BatchContext {
    contexts: Vec<Context>,
}

impl BatchContext {
    pub(crate) fn new(contexts: Vec<Context>) -> Self {
        BatchContext { contexts }
    }

    /// Resolves when the batch is cancelled (see the type's docs); at once
    /// for an empty batch.
    pub async fn cancelled(&self) {
        if self.contexts.is_empty() {
            return;
        }
        let each = self.contexts.iter().map(|c| Box::pin(c.cancelled()));
        futures::future::select_all(each).await;
    }

    /// Whether the batch was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.contexts.iter().any(Context::is_cancelled)
    }

    /// The earliest deadline of the batch's messages (None without
    /// `handler_timeout`).
    pub fn deadline(&self) -> Option<Instant> {
        self.contexts.iter().filter_map(Context::deadline).min()
    }

    /// The attempt of the batch's `i`-th message (see
    /// [`Context::attempt`]).
    pub fn attempt(&self, i: usize) -> Option<u32> {
        self.contexts.get(i).map(Context::attempt)
    }

    /// How many times the `i`-th message was delivered (see
    /// [`Context::deliveries`]: PGMQ's `read_ct`, less the deliveries
    /// undone).
    pub fn deliveries(&self, i: usize) -> Option<u32> {
        self.contexts.get(i).map(Context::deliveries)
    }

    /// Each message's own context, in the batch's order.
    pub fn contexts(&self) -> &[Context] {
        &self.contexts
    }

    /// How many messages the batch holds.
    pub fn len(&self) -> usize {
        self.contexts.len()
    }

    /// Whether the batch holds no message.
    pub fn is_empty(&self) -> bool {
        self.contexts.is_empty()
    }

    /// The queue the batch came from (None for an empty batch).
    pub fn queue(&self) -> Option<&QueueName> {
        self.contexts.first().map(Context::queue)
    }

    /// A batch context for calling a handler in a test, outside a worker.
    pub fn for_test(contexts: Vec<Context>) -> Self {
        BatchContext { contexts }
    }
}
