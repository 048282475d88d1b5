//! Running a handler in a unit test, without a database or a worker.
//!
//! Build the message with [`Message::new`](pgmq_client::Message::new) and,
//! for handlers that take one, the context with [`Context::for_test`]; the
//! functions here run the handler as the worker would (panics caught and
//! reported as errors) and return what it decided.
//!
//! ```
//! use pgmq_client::Message;
//! use pgmq_worker::testing::run_handler;
//! use pgmq_worker::{HandlerError, Outcome};
//!
//! #[derive(serde::Deserialize)]
//! struct Email { to: String }
//!
//! async fn handle(msg: Message<Email>) -> Result<Outcome, HandlerError> {
//!     if msg.body.to.is_empty() {
//!         return Ok(Outcome::DeadLetter("no recipient".into()));
//!     }
//!     Ok(Outcome::Delete)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let msg = Message::new(1, Email { to: String::new() });
//! let outcome = run_handler(&handle, msg).await.unwrap();
//! assert_eq!(outcome, Outcome::DeadLetter("no recipient".into()));
//! # }
//! ```

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use pgmq_client::Message;

use crate::context::Context;
use crate::handler::{
    panic_text, BatchHandler, BlockingHandler, Handler, HandlerError, HandlerWithContext,
    MessageResult, Outcome,
};

/// Runs an async [`Handler`] on `msg`; a panic comes back as an error with
/// its message, as the worker would record it.
pub async fn run_handler<T, H: Handler<T>>(
    handler: &H,
    msg: Message<T>,
) -> Result<Outcome, HandlerError> {
    AssertUnwindSafe(handler.handle(msg))
        .catch_unwind()
        .await
        .unwrap_or_else(|p| Err(panic_text(&*p).into()))
}

/// Runs a [`HandlerWithContext`] on `msg` with `ctx` (see
/// [`Context::for_test`]).
pub async fn run_handler_with_context<T, H: HandlerWithContext<T>>(
    handler: &H,
    msg: Message<T>,
    ctx: Context,
) -> Result<Outcome, HandlerError> {
    AssertUnwindSafe(handler.handle(msg, ctx))
        .catch_unwind()
        .await
        .unwrap_or_else(|p| Err(panic_text(&*p).into()))
}

/// Runs a [`BlockingHandler`] on `msg`, on the calling thread.
pub fn run_blocking_handler<T, H: BlockingHandler<T>>(
    handler: &H,
    msg: Message<T>,
) -> Result<Outcome, HandlerError> {
    std::panic::catch_unwind(AssertUnwindSafe(|| handler.handle(msg)))
        .unwrap_or_else(|p| Err(panic_text(&*p).into()))
}

/// Runs a [`BatchHandler`] on `batch`; a panic comes back as an error
/// with its message. The worker fails every message of a batch whose
/// handler errs, panics or returns a result count other than the batch's
/// length; check the count in your test.
///
/// ```
/// use pgmq_client::Message;
/// use pgmq_worker::testing::run_batch_handler;
/// use pgmq_worker::{HandlerError, MessageResult, Outcome};
///
/// async fn handle(batch: Vec<Message<i64>>) -> Result<Vec<MessageResult>, HandlerError> {
///     Ok(batch
///         .iter()
///         .map(|m| if m.body < 0 { Err("negative".into()) } else { Ok(Outcome::Delete) })
///         .collect())
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let results = run_batch_handler(&handle, vec![Message::new(1, 5), Message::new(2, -1)])
///     .await
///     .unwrap();
/// assert_eq!(results.len(), 2);
/// assert_eq!(results[0].as_ref().unwrap(), &Outcome::Delete);
/// assert!(results[1].is_err());
/// # }
/// ```
pub async fn run_batch_handler<T, H: BatchHandler<T>>(
    handler: &H,
    batch: Vec<Message<T>>,
) -> Result<Vec<MessageResult>, HandlerError> {
    AssertUnwindSafe(handler.handle(batch))
        .catch_unwind()
        .await
        .unwrap_or_else(|p| Err(panic_text(&*p).into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn panics_come_back_as_errors() {
        let h = |_m: Message<u32>| async {
            if true {
                panic!("boom");
            }
            Ok(Outcome::Delete)
        };
        let err = run_handler(&h, Message::new(1, 5u32)).await.unwrap_err();
        assert!(err.to_string().contains("boom"));
        let ctx = Context::for_test(pgmq_client::QueueName::new("q").unwrap(), 1);
        let h = |m: Message<u32>, ctx: Context| async move {
            Ok(if ctx.attempt() == 1 && m.body == 5 {
                Outcome::Delete
            } else {
                Outcome::Archive
            })
        };
        assert_eq!(
            run_handler_with_context(&h, Message::new(1, 5u32), ctx)
                .await
                .unwrap(),
            Outcome::Delete
        );
        let b = |_m: Message<u32>| Ok(Outcome::Archive);
        assert_eq!(
            run_blocking_handler(&b, Message::new(1, 5u32)).unwrap(),
            Outcome::Archive
        );
        let h = |batch: Vec<Message<u32>>| async move {
            if batch.len() > 1 {
                panic!("batch boom");
            }
            Ok(vec![Ok(Outcome::Delete)])
        };
        let err = run_batch_handler(&h, vec![Message::new(1, 5u32), Message::new(2, 6)])
            .await
            .unwrap_err();
        assert!(err.to_string().contains("batch boom"));
        let one = run_batch_handler(&h, vec![Message::new(1, 5u32)])
            .await
            .unwrap();
        assert_eq!(one.len(), 1);
    }
}
