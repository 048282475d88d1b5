//! backlog_scaling: the worker draining fresh queues of several backlog sizes
//! (`--backlog-sizes`, default 100,000 and 1,000,000; `--backlog-10m` adds
//! 10,000,000) with `--backlog-workers` handlers, once per size per measured
//! round. Each size gets a fresh queue, preloaded on the server and vacuumed
//! (`VACUUM (ANALYZE)`) before the timed interval, exactly as a consume_scaling
//! run; the figure per size is its drain rate, and `vs_smallest` divides it by
//! the smallest size's rate of the same round: 1.0 means the rate holds as the
//! backlog grows.

use crate::document::ConsumeRun;
use crate::error::Result;
use crate::sections::consume::drain;
use crate::sections::Ctx;

/// One drain of a backlog of `n` messages.
pub async fn run(ctx: &Ctx, n: u64, round: u32) -> Result<ConsumeRun> {
    drain(ctx, "backlog", n, ctx.cfg.backlog_workers, round, false).await
}
