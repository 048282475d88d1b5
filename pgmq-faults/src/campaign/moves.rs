//! The move cell: messages moved from one queue to another
//! ([`Pgmq::move_batch`](pgmq_client::Pgmq::move_batch)) through the proxy,
//! which cuts the connection before, during or after every other batch;
//! each failed batch is tried again. The invariant: a move loses and
//! doubles nothing through a cut connection (every message ends in the
//! target exactly once, none left in the source).
//!
//! Its sabotage (`move-split`) moves in two transactions, the send to the
//! target and then the delete from the source, and the cut lands between
//! them: the batch tried again is sent twice.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use pgmq_client::{Client, MoveBatch, MoveSelection, QueueName};
use serde_json::{json, Value};

use super::workload::connect_producer;
use crate::ctx::Ctx;
use crate::ledger;
use crate::proxy::Proxy;
use crate::report::Check;
use crate::worker::Sabotage;
use crate::BoxError;

/// The invariant's name, as the campaign's document shows it.
pub(crate) const NAME: &str = "a move loses and doubles nothing through a cut connection";

/// Messages moved.
const N: i64 = 600;
/// Messages per batch.
const BATCH: usize = 20;

/// Runs the cell; its check (failed when it could not run).
pub(crate) async fn move_cell(ctx: &Ctx, proxy: &Proxy, sabotage: &[Sabotage]) -> Vec<Check> {
    let check = match run(ctx, proxy, sabotage).await {
        Ok(c) => c,
        Err(e) => Check::could_not_run(NAME, "the move cell", e),
    };
    proxy.set_latency(Duration::ZERO);
    vec![check]
}

/// How many times each key (`{"key": key}`, read as the ledger reads
/// keys) is in `q`.
async fn keys_in(client: &Client, q: &QueueName) -> Result<BTreeMap<i64, u32>, BoxError> {
    let mut out = BTreeMap::new();
    for k in ledger::keys_in_queue(client, q).await?.0 {
        *out.entry(k).or_insert(0) += 1;
    }
    Ok(out)
}

/// The sabotaged move: a batch sent, then (in another transaction)
/// deleted; on the rounds that cut, the cut lands between the two.
async fn split_move(
    client: &Client,
    proxy: &Proxy,
    (from, to): (&QueueName, &QueueName),
    cut: bool,
) -> Result<usize, BoxError> {
    let msgs = client.peek_raw(from, BATCH).await?;
    if msgs.is_empty() {
        return Ok(0);
    }
    let bodies: Vec<&pgmq_client::RawJson> = msgs.iter().map(|m| &m.body).collect();
    client.send_batch(to, &bodies).await?;
    if cut {
        proxy.cut_all();
        return Err("cut between the send and the delete".into());
    }
    let ids: Vec<i64> = msgs.iter().map(|m| m.msg_id).collect();
    client.delete_batch(from, &ids).await?;
    Ok(ids.len())
}

async fn run(ctx: &Ctx, proxy: &Proxy, sabotage: &[Sabotage]) -> Result<Check, BoxError> {
    let qs = ctx.queues("move_cell").await?;
    let (from, to) = (qs.q.clone(), qs.dlq.clone());
    let bodies: Vec<Value> = (0..N).map(|k| json!({ "key": k })).collect();
    for chunk in bodies.chunks(300) {
        ctx.client.send_batch(&from, chunk).await?;
    }
    let client = connect_producer(&ctx.proxied_dsn(proxy), 2, "pgmq-campaign-move").await?;
    // Each chunk a little late, so that cuts land inside statements too.
    proxy.set_latency(Duration::from_millis(2));
    let split = sabotage.contains(&Sabotage::MoveSplit);
    let (mut failed, mut round) = (0u32, 0u64);
    let until = Instant::now() + Duration::from_secs(60);
    let mut finished = false;
    while Instant::now() < until {
        let cut = round % 2 == 1;
        let delay = Duration::from_millis((round * 7) % 10);
        round += 1;
        let moved = if split {
            split_move(&client, proxy, (&from, &to), cut).await
        } else {
            let cutting = async {
                if cut {
                    tokio::time::sleep(delay).await;
                    proxy.cut_all();
                }
            };
            let batch = MoveBatch::new(MoveSelection::All).limit(BATCH);
            let (moved, ()) = tokio::join!(client.move_batch(&from, &to, &batch), cutting);
            moved.map(|m| m.len()).map_err(Into::into)
        };
        match moved {
            Ok(0) => {
                finished = true;
                break;
            }
            Ok(_) => {}
            Err(_) => failed += 1,
        }
    }
    proxy.set_latency(Duration::ZERO);
    let left = keys_in(&ctx.client, &from).await?;
    let there = keys_in(&ctx.client, &to).await?;
    ctx.drop_queues(&qs).await;
    let lost = (0..N)
        .filter(|k| !there.contains_key(k) && !left.contains_key(k))
        .count();
    let doubled = there.values().filter(|c| **c > 1).count()
        + there.keys().filter(|k| left.contains_key(k)).count();
    Ok(Check::new(
        NAME,
        lost == 0 && doubled == 0 && finished && left.is_empty(),
        format!(
            "{N} messages moved in batches of {BATCH} through a proxy cutting every other \
             batch ({failed} batches failed and were tried again; the move finished: \
             {finished}): {lost} lost, {doubled} doubled, {} left in the source",
            left.len()
        ),
    ))
}
