//! Hooks around each handler call: logging, tracing, timing, authorization.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use crate::context::Context;
use crate::handler::{panic_text_of, HandlerError, Outcome};

/// Code that runs around every handler call, for logging, tracing, timing
/// or authorization. Hooks added with
/// [`WorkerBuilder::hook`](crate::WorkerBuilder::hook) compose in order:
/// every [`before`](Hook::before) in the order added, then the handler,
/// then every [`after`](Hook::after) in reverse order (like nested
/// middleware). A `before` that returns an error stops the call: the
/// handler does not run, the later hooks' `before` do not either, and the
/// run counts as a failure with that error (retried, then dead-lettered).
/// Every hook whose `before` ran sees the `after`.
///
/// A hook that panics is caught like a panicking handler, and the worker
/// keeps running: a `before` that panics stops the call as a refusal does,
/// with the panic's text as the error; an `after` that panics turns the run
/// into a failed attempt (retried, then dead-lettered, as a handler panic
/// is), except after a [`TransactionalHandler`](crate::TransactionalHandler)
/// whose acknowledgement already committed, where it is only logged and
/// counted. Either way it is counted in `panicked`, and the other hooks'
/// `after` still run.
///
/// Both methods are synchronous and run on the handler's task: keep them
/// short (start a timer, check a header, record a metric).
///
/// ```
/// use std::time::Duration;
/// use pgmq_worker::{Context, Hook, HandlerError, Outcome};
///
/// /// Refuses messages without a tenant header, and logs every run's time.
/// struct Audit;
///
/// impl Hook for Audit {
///     fn before(&self, ctx: &Context, headers: Option<&serde_json::Value>) -> Result<(), HandlerError> {
///         match headers.and_then(|h| h.get("tenant")) {
///             Some(_) => Ok(()),
///             None => Err(format!("message {} has no tenant", ctx.msg_id()).into()),
///         }
///     }
///
///     fn after(&self, ctx: &Context, result: &Result<Outcome, String>, took: Duration) {
///         println!("message {} attempt {}: {result:?} in {took:?}", ctx.msg_id(), ctx.attempt());
///     }
/// }
/// ```
pub trait Hook: Send + Sync + 'static {
    /// Before the handler; an error stops the call (see the trait docs).
    fn before(
        &self,
        ctx: &Context,
        headers: Option<&serde_json::Value>,
    ) -> Result<(), HandlerError> {
        let _ = (ctx, headers);
        Ok(())
    }

    /// After the handler (or after a later hook's `before` refused): what
    /// came of the call (an error's or panic's text as `Err`) and how long
    /// it took.
    fn after(&self, ctx: &Context, result: &Result<Outcome, String>, took: Duration) {
        let _ = (ctx, result, took);
    }
}

/// The hooks of one worker, in the order added.
#[derive(Clone, Default)]
pub(crate) struct HookList(pub Vec<Arc<dyn Hook>>);

impl std::fmt::Debug for HookList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} hooks", self.0.len())
    }
}

/// Why a `before` stopped the call.
pub(crate) enum Refusal {
    /// It returned this error.
    Refused(HandlerError),
    /// It panicked: the panic's text.
    Panicked(String),
}

/// Runs every `before` in order, each with panics caught; returns how many
/// ran (the refusing or panicking one included) and why the call stops.
pub(crate) fn before_all(
    hooks: &[Arc<dyn Hook>],
    ctx: &Context,
    headers: Option<&serde_json::Value>,
) -> (usize, Option<Refusal>) {
    for (i, h) in hooks.iter().enumerate() {
        match std::panic::catch_unwind(AssertUnwindSafe(|| h.before(ctx, headers))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return (i + 1, Some(Refusal::Refused(e))),
            Err(p) => {
                return (
                    i + 1,
                    Some(Refusal::Panicked(panic_text_of("a hook's before", &*p))),
                )
            }
        }
    }
    (hooks.len(), None)
}

/// Runs the `after` of the first `ran` hooks, last first, each with panics
/// caught (a panicking one does not keep the others from running); returns
/// the text of the first panic.
pub(crate) fn after_all(
    hooks: &[Arc<dyn Hook>],
    ran: usize,
    ctx: &Context,
    result: &Result<Outcome, String>,
    took: Duration,
) -> Option<String> {
    let mut panicked = None;
    for h in hooks[..ran].iter().rev() {
        if let Err(p) = std::panic::catch_unwind(AssertUnwindSafe(|| h.after(ctx, result, took))) {
            panicked.get_or_insert_with(|| panic_text_of("a hook's after", &*p));
        }
    }
    panicked
}
