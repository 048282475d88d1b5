//! What a handler is and what it returns.

use std::future::Future;
use std::time::Duration;

use pgmq_client::Message;

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
    /// Make it visible again after this delay (whole seconds, rounded up).
    /// A delay longer than [`pgmq_client::MAX_SECONDS`] (about 68 years,
    /// the most PGMQ's integer seconds hold), `Duration::MAX` included, is
    /// clamped to it. It still counts as an attempt: past `max_attempts` it
    /// is dead-lettered.
    Retry(Duration),
    /// Move it to the dead-letter queue (or archive it when none is
    /// configured), with this reason in its headers.
    DeadLetter(String),
}

/// The error a handler returns: anything that converts into a boxed error
/// (`std::io::Error`, `anyhow::Error`, a `String`, ...).
///
/// An error means "retry with backoff"; past `max_attempts` the message is
/// dead-lettered with the error's text as the reason.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An async message handler.
///
/// Implemented for every `Fn(Message<T>) -> impl Future<Output = Result<Outcome, E>>`
/// with `E: Into<HandlerError>`, so closures and `async fn`s work directly.
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

impl<T, F, Fut, E> Handler<T> for F
where
    T: Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Outcome, E>> + Send,
    E: Into<HandlerError>,
{
    async fn handle(&self, msg: Message<T>) -> Result<Outcome, HandlerError> {
        (self)(msg).await.map_err(Into::into)
    }
}

/// A blocking (CPU-bound) message handler, run on a dedicated thread.
///
/// Implemented for every `Fn(Message<T>) -> Result<Outcome, E>` with
/// `E: Into<HandlerError>`.
pub trait BlockingHandler<T>: Send + Sync + 'static {
    /// Handles one message.
    fn handle(&self, msg: Message<T>) -> Result<Outcome, HandlerError>;
}

impl<T, F, E> BlockingHandler<T> for F
where
    F: Fn(Message<T>) -> Result<Outcome, E> + Send + Sync + 'static,
    E: Into<HandlerError>,
{
    fn handle(&self, msg: Message<T>) -> Result<Outcome, HandlerError> {
        (self)(msg).map_err(Into::into)
    }
}

/// The text of a panic's payload.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        format!("handler panicked: {s}")
    } else if let Some(s) = payload.downcast_ref::<String>() {
        format!("handler panicked: {s}")
    } else {
        "handler panicked".to_owned()
    }
}
