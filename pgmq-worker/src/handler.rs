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
