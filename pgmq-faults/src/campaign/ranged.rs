//! The ranged-drain cell, after the last seed: worker processes draining
//! one backlog together, so that their claim reads take ranges of ids from
//! the queue's claim cursor (`ReadFrom::Ranged`, in the `pgmq_sdk`
//! schema). Every tenth message fails its first attempt and comes back a
//! second or two later, below the ranges taken since. The invariant: the
//! cursor is a hint, never a fence, so every message of the backlog is
//! handled, the retries below the cursor too (the workers' reads from the
//! start claim them).
//!
//! Its sabotage (`cursor-fence`) makes the workers take the cursor for a
//! fence: once they took a range, their reads from the start take a range
//! instead, and the retries below the cursor are never claimed.

use std::time::Duration;

use crate::ctx::Ctx;
use crate::job::{Act, Job};
use crate::ledger;
use crate::report::Check;
use crate::worker::{FaultSpec, Sabotage};
use crate::BoxError;

/// The invariant's name, as the campaign's document shows it.
pub(crate) const NAME: &str = "a retry below the claim cursor is claimed";

/// Messages in the backlog.
const N: i64 = 4_000;
/// Worker processes draining it.
const PROCESSES: usize = 3;
/// How long the drain may take, the retries' backoff included.
const LIMIT: Duration = Duration::from_secs(20);

/// Runs the cell; its check (failed when it could not run).
pub(crate) async fn ranged_cell(ctx: &Ctx, sabotage: &[Sabotage]) -> Vec<Check> {
    let check = match drain(ctx, sabotage).await {
        Ok(handled) => Check::new(
            NAME,
            handled >= N,
            format!(
                "{PROCESSES} processes drained a backlog of {N} messages, every tenth failing \
                 its first attempt: {handled} of {N} handled within {} s",
                LIMIT.as_secs()
            ),
        ),
        Err(e) => Check::new(
            NAME,
            false,
            format!("the ranged-drain cell could not run: {e}"),
        ),
    };
    vec![check]
}

/// The drain: how many messages the ledger says were handled.
async fn drain(ctx: &Ctx, sabotage: &[Sabotage]) -> Result<i64, BoxError> {
    let scenario = "rd";
    ctx.client.install_sdk_schema().await?;
    let qs = ctx.queues(scenario).await?;
    let result = async {
        let jobs: Vec<Job> = (0..N)
            .map(|k| match k % 10 {
                5 => Job::with(k, Act::fail_before(2)),
                _ => Job::plain(k),
            })
            .collect();
        ctx.produce(&qs.q, &jobs).await;
        let mut spec = FaultSpec::for_queue(&qs.q, &qs.dlq, &ctx.run_id, scenario);
        spec.sabotage = sabotage
            .iter()
            .copied()
            .filter(|s| *s == Sabotage::CursorFence)
            .collect();
        spec.worker.application_name = Some("pgmq-campaign-ranged-cell".into());
        let mut procs = Vec::new();
        for _ in 0..PROCESSES {
            procs.push(ctx.spawn_worker(&spec).await?);
        }
        // Short of all of them within the limit, the count says how many.
        let _ = ctx.wait_progress(scenario, N, LIMIT).await;
        let handled = ledger::handled_count(&ctx.client, &ctx.run_id, scenario).await?;
        for p in procs {
            let _ = p.stop(Duration::from_secs(10)).await;
        }
        Ok(handled)
    }
    .await;
    ctx.drop_queues(&qs).await;
    result
}
