//! The retention cell: archive retention by several pruners at once (two
//! on their own connections, one through the proxy, which cuts its
//! connections), while fresh messages are archived beside them. The
//! invariant: retention never deletes a message younger than its age (on
//! the database clock); and every older one goes, once.
//!
//! Its sabotage (`retention-young`) gives the pruners an age read in the
//! wrong unit (seconds for hours): messages far younger than the age go.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use pgmq_client::{ArchiveRetention, Client, QueueName};
use serde_json::json;

use super::workload::connect_producer;
use crate::ctx::Ctx;
use crate::ledger;
use crate::proxy::Proxy;
use crate::report::Check;
use crate::worker::Sabotage;
use crate::BoxError;

/// The invariant's name, as the campaign's document shows it.
pub(crate) const YOUNG_KEPT: &str = "retention never deletes a message younger than its age";
/// The liveness beside it.
pub(crate) const OLD_PRUNED: &str = "retention prunes every message older than its age";

/// The age the cell's retention keeps.
const AGE: Duration = Duration::from_secs(3600);
/// Archived messages at the start; every other one backdated past the age.
const ARCHIVED: usize = 2000;

/// Runs the cell; its checks (a failed check when it could not run).
pub(crate) async fn retention_cell(ctx: &Ctx, proxy: &Proxy, sabotage: &[Sabotage]) -> Vec<Check> {
    match run(ctx, proxy, sabotage).await {
        Ok(checks) => checks,
        Err(e) => vec![Check::could_not_run(YOUNG_KEPT, "the retention cell", e)],
    }
}

/// Sends and archives `n` messages of `q`; their msg_ids.
async fn archive_n(client: &Client, q: &QueueName, n: usize) -> Result<Vec<i64>, BoxError> {
    let bodies: Vec<_> = (0..n).map(|k| json!({ "key": k })).collect();
    let mut ids = Vec::with_capacity(n);
    for chunk in bodies.chunks(500) {
        let sent = client.send_batch(q, chunk).await?;
        client.archive_batch(q, &sent).await?;
        ids.extend(sent);
    }
    Ok(ids)
}

async fn run(ctx: &Ctx, proxy: &Proxy, sabotage: &[Sabotage]) -> Result<Vec<Check>, BoxError> {
    let qs = ctx.queues("retention_cell").await?;
    let q = qs.q.clone();
    let ids = archive_n(&ctx.client, &q, ARCHIVED).await?;
    let old: Vec<i64> = ids.iter().copied().step_by(2).collect();
    ctx.client
        .connection()
        .await?
        .execute(
            &format!(
                "UPDATE {} SET archived_at = archived_at - interval '2 hours' WHERE msg_id = ANY($1)",
                q.quoted_archive_table()
            ),
            &[&old],
        )
        .await?;
    // Past a second, so that an age of a second (the sabotage) would let
    // the young ones go too.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let age = if sabotage.contains(&Sabotage::RetentionYoung) {
        Duration::from_secs(AGE.as_secs() / 3600)
    } else {
        AGE
    };
    let policy = ArchiveRetention::older_than(age).batch(25);
    let mut pruners = Vec::new();
    for via_proxy in [false, false, true] {
        let dsn = if via_proxy {
            ctx.proxied_dsn(proxy)
        } else {
            ctx.cluster.dsn()
        };
        let client = connect_producer(&dsn, 2, "pgmq-campaign-retention").await?;
        let (q, policy) = (q.clone(), policy.clone());
        pruners.push(tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(30);
            // Until a run ends with nothing left to prune (an error, a cut
            // connection, or another pruner at work: again).
            while Instant::now() < until {
                match client.apply_retention(&q, &policy).await {
                    Ok(done) if !done.busy && done.pruned == 0 => return true,
                    _ => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
            false
        }));
    }
    let cutter = {
        let stop = Instant::now() + Duration::from_secs(2);
        async move {
            while Instant::now() < stop {
                tokio::time::sleep(Duration::from_millis(40)).await;
                proxy.cut_all();
            }
        }
    };
    // Fresh messages archived while the pruners run: young, to be kept.
    let (fresh, _) = tokio::join!(archive_n(&ctx.client, &q, 500), cutter);
    let fresh = fresh?;
    let mut finished = true;
    for p in pruners {
        finished &= p.await.unwrap_or(false);
    }
    let archive = q.quoted_archive_table();
    let (archived, _) = ledger::ids_in_table(&ctx.client, &archive).await?;
    let left: BTreeSet<i64> = archived.into_iter().map(|(_, id)| id).collect();
    ctx.drop_queues(&qs).await;
    let young: Vec<i64> = ids
        .iter()
        .copied()
        .skip(1)
        .step_by(2)
        .chain(fresh)
        .collect();
    let young_gone = young.iter().filter(|id| !left.contains(id)).count();
    let old_left = old.iter().filter(|id| left.contains(id)).count();
    Ok(vec![
        Check::new(
            YOUNG_KEPT,
            young_gone == 0,
            format!(
                "3 pruners at once (one through a proxy cutting its connections), age {} s, \
                 batches of 25, while 500 more were archived: {young_gone} of {} messages \
                 younger than the age deleted",
                AGE.as_secs(),
                young.len()
            ),
        ),
        Check::new(
            OLD_PRUNED,
            old_left == 0 && finished,
            format!(
                "{old_left} of {} messages older than the age left; every pruner finished: \
                 {finished}",
                old.len()
            ),
        ),
    ])
}
