//! What a handler is and what it returns.

use std::future::Future;
use std::time::Duration;

use pgmq_client::Message;

use crate::context::Context;

/// What to do with a message once its handler is done.
///
/// Every outcome is written in batches by the completer; none of them costs a
/// round trip of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Delete it (the usual acknowledgement).
    Delete,
    /// Move it to the queue's archive table.
    Archive,
    /// Make it visible again after this delay (sub-second delays are kept;
    /// at most [`MAX_DELAY`](pgmq_client::MAX_DELAY)). It counts as an
    /// attempt: past `max_attempts` it is dead-lettered.
    Retry(Duration),
    /// Come back after this delay without using an attempt (nor a
    /// delivery: the read is undone), for work that is not ready yet. At most
    /// [`MAX_DELAY`](pgmq_client::MAX_DELAY).
    Snooze(Duration),
    /// Move it to the dead-letter queue (or archive it when none is
    /// configured), with this reason in its headers.
    DeadLetter(String),
}

/// `()` is the usual acknowledgement: a handler that returns `Ok(())`
/// has its message deleted, as with [`Outcome::Delete`].
impl From<()> for Outcome {
    fn from((): ()) -> Self {
        Outcome::Delete
    }
}

/// The error a handler returns: a boxed error. `?` converts any
/// `std::error::Error + Send + Sync` into it (`std::io::Error`,
/// `tokio_postgres::Error`, `anyhow::Error`, ...), and so does `.into()` on a
/// `String` or `&str`: `Err("no recipient".into())`.
///
/// Handler closures return `Result<(), HandlerError>` or
/// `Result<Outcome, HandlerError>`; since the error type is fixed, `Ok(())`
/// needs no annotation.
///
/// An error means "retry with backoff"; past `max_attempts` the message is
/// dead-lettered with the error's text as the reason.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An async message handler.
///
/// Implemented for every `Fn(Message<T>) -> impl Future<Output = Result<O, HandlerError>>`
/// where `O` is an [`Outcome`] or `()` (meaning [`Outcome::Delete`]), so
/// closures and `async fn`s work directly, and `?` works inside them:
///
/// ```
/// use pgmq_client::Message;
/// use pgmq_worker::Handler;
///
/// #[derive(serde::Deserialize)]
/// struct Job { path: String }
///
/// fn assert_handler<H: Handler<Job>>(_: H) {}
///
/// assert_handler(|msg: Message<Job>| async move {
///     // An io::Error becomes a retry with backoff.
///     tokio::fs::metadata(&msg.body.path).await?;
///     Ok(())
/// });
/// ```
///
/// Implement it on your own type to keep state (a connection pool, a client):
///
/// ```
/// use pgmq_client::Message;
/// use pgmq_worker::{Handler, HandlerError, Outcome};
///
/// struct Mailer { from: String }
///
/// impl Handler<serde_json::Value> for Mailer {
///     async fn handle(&self, msg: Message<serde_json::Value>) -> Result<Outcome, HandlerError> {
///         if msg.body.get("to").is_none() {
///             return Ok(Outcome::DeadLetter("no recipient".into()));
///         }
///         println!("mail from {}", self.from);
///         Ok(Outcome::Delete)
///     }
/// }
/// ```
pub trait Handler<T>: Send + Sync + 'static {
    /// Handles one message.
    fn handle(&self, msg: Message<T>)
        -> impl Future<Output = Result<Outcome, HandlerError>> + Send;
}

impl<T, F, Fut, O> Handler<T> for F
where
    T: Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, HandlerError>> + Send,
    O: Into<Outcome>,
{
    async fn handle(&self, msg: Message<T>) -> Result<Outcome, HandlerError> {
        (self)(msg).await.map(Into::into)
    }
}

/// An async message handler that also receives the delivery's [`Context`]:
/// its cancellation (fired when the claim is lost, when the handler outlives
/// `handler_timeout`, and at immediate shutdown), its deadline, its attempt
/// number and its queue.
///
/// Implemented for every `Fn(Message<T>, Context) -> impl Future<Output = Result<O, HandlerError>>`
/// where `O` is an [`Outcome`] or `()`; give it to
/// [`WorkerBuilder::handler_with_context`](crate::WorkerBuilder::handler_with_context).
///
/// ```
/// use pgmq_client::Message;
/// use pgmq_worker::{Context, HandlerError, Outcome};
///
/// async fn handle(msg: Message<serde_json::Value>, ctx: Context) -> Result<Outcome, HandlerError> {
///     tokio::select! {
///         // Stop early when the claim is lost or the time is up.
///         _ = ctx.cancelled() => Err("cancelled".into()),
///         _ = tokio::time::sleep(std::time::Duration::from_millis(10)) => {
///             println!("attempt {} of message {}", ctx.attempt(), msg.msg_id);
///             Ok(Outcome::Delete)
///         }
///     }
/// }
/// ```
pub trait HandlerWithContext<T>: Send + Sync + 'static {
    /// Handles one message.
    fn handle(
        &self,
        msg: Message<T>,
        ctx: Context,
    ) -> impl Future<Output = Result<Outcome, HandlerError>> + Send;
}

impl<T, F, Fut, O> HandlerWithContext<T> for F
where
    T: Send + 'static,
    F: Fn(Message<T>, Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, HandlerError>> + Send,
    O: Into<Outcome>,
{
    async fn handle(&self, msg: Message<T>, ctx: Context) -> Result<Outcome, HandlerError> {
        (self)(msg, ctx).await.map(Into::into)
    }
}

/// A handler whose database writes commit together with the message's
/// acknowledgement: effectively once for work in the same database.
///
/// The worker opens a transaction on a pooled connection (one per running
/// handler: size the pool for `concurrency` more connections) and hands it
/// to the handler. When the handler returns `Ok(Outcome::Delete)` or
/// `Ok(Outcome::Archive)`, the fenced delete (or archive) of the message
/// runs inside that transaction, then it commits: the handler's writes and
/// the acknowledgement both happen or neither does. A crash, a lost
/// connection or a timeout before the commit rolls both back, and the
/// message comes back to a handler that finds none of its writes; a crash
/// after the commit leaves nothing to redo. If the claim was lost meanwhile
/// (another delivery holds the message), the transaction is rolled back and
/// the loss counted in `claims_lost`. Any other outcome, an error or a panic
/// rolls the transaction back and is then handled as usual (retry,
/// snooze, dead letter).
///
/// Give it to [`WorkerBuilder::transactional_handler`](crate::WorkerBuilder::transactional_handler).
///
/// ```
/// use pgmq_client::{Message, Transaction};
/// use pgmq_worker::{Context, HandlerError, Outcome, TransactionalHandler};
///
/// #[derive(serde::Deserialize)]
/// struct Payment { order: i64, cents: i64 }
///
/// struct Ledger;
///
/// impl TransactionalHandler<Payment> for Ledger {
///     async fn handle(
///         &self,
///         msg: Message<Payment>,
///         tx: &Transaction<'_>,
///         _ctx: Context,
///     ) -> Result<Outcome, HandlerError> {
///         tx.execute(
///             "INSERT INTO payments (order_id, cents) VALUES ($1, $2)",
///             &[&msg.body.order, &msg.body.cents],
///         )
///         .await?;
///         // The insert and the message's delete commit together.
///         Ok(Outcome::Delete)
///     }
/// }
/// ```
pub trait TransactionalHandler<T>: Send + Sync + 'static {
    /// Handles one message inside `tx`.
    fn handle(
        &self,
        msg: Message<T>,
        tx: &pgmq_client::Transaction<'_>,
        ctx: Context,
    ) -> impl Future<Output = Result<Outcome, HandlerError>> + Send;
}

/// What a batch handler returns for one message of its batch: that
/// message's [`Outcome`], or an error that fails that message's attempt
/// alone (retried with backoff, dead-lettered on its last attempt, as a
/// single handler's error is).
pub type MessageResult = Result<Outcome, HandlerError>;

/// An async handler of batches: up to `max` messages at once, or what
/// arrived within a short window after the first (see
/// [`WorkerBuilder::batch_handler`](crate::WorkerBuilder::batch_handler)),
/// for work that is cheaper in bulk: a multi-row insert, an API that takes
/// batches.
///
/// It returns one [`MessageResult`] per message, in the batch's order, and
/// each goes through the same mapping as a single handler's result: a
/// `Delete` is batched with the other acknowledgements, an `Err` retries
/// that message alone. An `Err` for the whole call, a panic, a run past
/// `handler_timeout`, or a result count that differs from the batch's
/// length fails every message of the batch (each an attempt used).
///
/// Implemented for every `Fn(Vec<Message<T>>) -> impl Future<Output =
/// Result<Vec<MessageResult>, HandlerError>>`:
///
/// ```
/// use pgmq_client::Message;
/// use pgmq_worker::{BatchHandler, MessageResult, Outcome};
///
/// #[derive(serde::Deserialize)]
/// struct Reading { sensor: String, value: f64 }
///
/// fn assert_batch_handler<H: BatchHandler<Reading>>(_: H) {}
///
/// assert_batch_handler(|batch: Vec<Message<Reading>>| async move {
///     // One call for the whole batch (say, an API that takes batches);
///     // a reading without a sensor fails alone and is retried.
///     let results: Vec<MessageResult> = batch
///         .iter()
///         .map(|m| if m.body.sensor.is_empty() {
///             Err("no sensor".into())
///         } else {
///             Ok(Outcome::Delete)
///         })
///         .collect();
///     println!("{} readings", batch.len());
///     Ok(results)
/// });
/// ```
pub trait BatchHandler<T>: Send + Sync + 'static {
    /// Handles one batch; one result per message, in order.
    fn handle(
        &self,
        batch: Vec<Message<T>>,
    ) -> impl Future<Output = Result<Vec<MessageResult>, HandlerError>> + Send;
}

impl<T, F, Fut> BatchHandler<T> for F
where
    T: Send + 'static,
    F: Fn(Vec<Message<T>>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<MessageResult>, HandlerError>> + Send,
{
    async fn handle(&self, batch: Vec<Message<T>>) -> Result<Vec<MessageResult>, HandlerError> {
        (self)(batch).await
    }
}

/// A [`BatchHandler`] that also gets a [`BatchContext`](crate::BatchContext):
/// the batch's cancellation and deadline, and each message's attempt and
/// deliveries ([`Context`] per message). Results, failures and timeouts are
/// as for a [`BatchHandler`].
///
/// Implemented for every `Fn(Vec<Message<T>>, BatchContext) -> impl
/// Future<Output = Result<Vec<MessageResult>, HandlerError>>`:
///
/// ```
/// use pgmq_client::Message;
/// use pgmq_worker::{BatchContext, BatchHandlerWithContext, MessageResult, Outcome};
///
/// fn assert_handler<H: BatchHandlerWithContext<serde_json::Value>>(_: H) {}
///
/// assert_handler(|batch: Vec<Message<serde_json::Value>>, ctx: BatchContext| async move {
///     let results: Vec<MessageResult> = (0..batch.len())
///         .map(|i| match ctx.attempt(i) {
///             Some(a) if a > 3 => Ok(Outcome::Archive),
///             _ => Ok(Outcome::Delete),
///         })
///         .collect();
///     tokio::select! {
///         _ = ctx.cancelled() => Err("cancelled".into()),
///         _ = async {} => Ok(results),
///     }
/// });
/// ```
pub trait BatchHandlerWithContext<T>: Send + Sync + 'static {
    /// Handles one batch; one result per message, in order.
    fn handle(
        &self,
        batch: Vec<Message<T>>,
        ctx: crate::BatchContext,
    ) -> impl Future<Output = Result<Vec<MessageResult>, HandlerError>> + Send;
}

impl<T, F, Fut> BatchHandlerWithContext<T> for F
where
    T: Send + 'static,
    F: Fn(Vec<Message<T>>, crate::BatchContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<MessageResult>, HandlerError>> + Send,
{
    async fn handle(
        &self,
        batch: Vec<Message<T>>,
        ctx: crate::BatchContext,
    ) -> Result<Vec<MessageResult>, HandlerError> {
        (self)(batch, ctx).await
    }
}

/// A batch handler whose database writes commit in one transaction with
/// the deletes (or archives) of the batch's successes: effectively once
/// for bulk work in the same database, at a commit per batch instead of
/// one per message.
///
/// The worker opens a transaction on a pooled connection and, **before the
/// handler runs**, locks the batch's messages in it, fenced on their
/// deliveries (`SELECT ... FOR UPDATE` of the rows that still carry this
/// worker's `msg_id` and `last_read_at`). The handler gets only the
/// messages it still owns: one whose claim was lost before the lock
/// (another delivery holds it now) is left out, counted in `claims_lost`,
/// and none of its effects can be written here. While the transaction
/// holds the locks no other consumer can claim those messages, even past
/// their visibility timeout (PGMQ's reads skip locked rows), so no claim
/// is lost during the run; the heartbeat leaves them alone meanwhile.
///
/// When the handler returns, the fenced deletes (and archives) of the
/// messages whose result is `Ok(Outcome::Delete)` (or `Archive`) run in
/// the same transaction, then it commits: the batch's writes and those
/// acknowledgements happen together or not at all. A crash, a lost
/// connection or a `handler_timeout` before the commit rolls both back.
/// The other messages' results (retry, snooze, dead letter, an error) are
/// written afterwards by the worker's batched acknowledgements, as for a
/// single handler.
///
/// **Write only for the successes.** The transaction commits whenever at
/// least one message of the batch succeeded, and with it every write the
/// handler made in it. A message that fails (or is retried, snoozed or
/// dead-lettered) must not leave writes in `tx`: decide each message's
/// result before writing the batch, or wrap a message's writes in a
/// savepoint (`SAVEPOINT` / `ROLLBACK TO SAVEPOINT`) and undo them when it
/// fails. When no message succeeded, the transaction is rolled back.
///
/// An `Err` for the whole batch, a panic, a run past `handler_timeout` or
/// a result count that differs from the batch's length rolls the
/// transaction back and fails every message of the batch (an attempt
/// each). A failure of the worker's own database work (no connection
/// within `db_timeout`; BEGIN, the lock, the acknowledgement or COMMIT
/// losing its connection or timing out) is not the handler's: the batch is
/// snoozed for the first retry delay, no attempt used (`tx_unavailable`).
///
/// Give it to
/// [`WorkerBuilder::transactional_batch_handler`](crate::WorkerBuilder::transactional_batch_handler).
///
/// ```
/// use pgmq_client::{Message, Transaction};
/// use pgmq_worker::{HandlerError, MessageResult, Outcome, TransactionalBatchHandler};
///
/// #[derive(serde::Deserialize)]
/// struct Payment { order: i64, cents: i64 }
///
/// struct Ledger;
///
/// impl TransactionalBatchHandler<Payment> for Ledger {
///     async fn handle(
///         &self,
///         batch: Vec<Message<Payment>>,
///         tx: &Transaction<'_>,
///     ) -> Result<Vec<MessageResult>, HandlerError> {
///         // Decide first: a negative amount fails alone, and writes nothing.
///         let results: Vec<MessageResult> = batch
///             .iter()
///             .map(|m| if m.body.cents < 0 {
///                 Err("negative amount".into())
///             } else {
///                 Ok(Outcome::Delete)
///             })
///             .collect();
///         let good: Vec<&Message<Payment>> = batch.iter().filter(|m| m.body.cents >= 0).collect();
///         let orders: Vec<i64> = good.iter().map(|m| m.body.order).collect();
///         let cents: Vec<i64> = good.iter().map(|m| m.body.cents).collect();
///         // One statement for the batch; it commits with the deletes.
///         tx.execute(
///             "INSERT INTO payments (order_id, cents) SELECT * FROM unnest($1::bigint[], $2::bigint[])",
///             &[&orders, &cents],
///         )
///         .await?;
///         Ok(results)
///     }
/// }
/// ```
pub trait TransactionalBatchHandler<T>: Send + Sync + 'static {
    /// Handles one batch inside `tx`; one result per message, in order.
    fn handle(
        &self,
        batch: Vec<Message<T>>,
        tx: &pgmq_client::Transaction<'_>,
    ) -> impl Future<Output = Result<Vec<MessageResult>, HandlerError>> + Send;
}

/// A blocking (CPU-bound) message handler, run on a dedicated thread.
///
/// Implemented for every `Fn(Message<T>) -> Result<O, HandlerError>` where
/// `O` is an [`Outcome`] or `()`.
pub trait BlockingHandler<T>: Send + Sync + 'static {
    /// Handles one message.
    fn handle(&self, msg: Message<T>) -> Result<Outcome, HandlerError>;
}

impl<T, F, O> BlockingHandler<T> for F
where
    F: Fn(Message<T>) -> Result<O, HandlerError> + Send + Sync + 'static,
    O: Into<Outcome>,
{
    fn handle(&self, msg: Message<T>) -> Result<Outcome, HandlerError> {
        (self)(msg).map(Into::into)
    }
}

/// The text of a handler's panic.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    panic_text_of("handler", payload)
}

/// The text of a panic of `what` (the handler, a hook, a `Deserialize`):
/// "`what` panicked: message".
pub(crate) fn panic_text_of(what: &str, payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        format!("{what} panicked: {s}")
    } else if let Some(s) = payload.downcast_ref::<String>() {
        format!("{what} panicked: {s}")
    } else {
        format!("{what} panicked")
    }
}
