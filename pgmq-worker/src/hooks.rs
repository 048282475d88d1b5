//! Hooks around each handler call: logging, tracing, timing, authorization.

use std::sync::Arc;
use std::time::Duration;

use crate::context::Context;
use crate::handler::{HandlerError, Outcome};

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

/// Runs every `before` in order; returns how many ran without refusing and
/// the first refusal.
pub(crate) fn before_all(
    hooks: &[Arc<dyn Hook>],
    ctx: &Context,
    headers: Option<&serde_json::Value>,
) -> (usize, Option<HandlerError>) {
    for (i, h) in hooks.iter().enumerate() {
        if let Err(e) = h.before(ctx, headers) {
            return (i + 1, Some(e));
        }
    }
    (hooks.len(), None)
}

/// Runs the `after` of the first `ran` hooks, last first.
pub(crate) fn after_all(
    hooks: &[Arc<dyn Hook>],
    ran: usize,
    ctx: &Context,
    result: &Result<Outcome, String>,
    took: Duration,
) {
    for h in hooks[..ran].iter().rev() {
        h.after(ctx, result, took);
    }
}
