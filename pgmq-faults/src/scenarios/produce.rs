//! 11: producers whose connections are cut while `send` and `send_batch` are
//! in flight. Every produce is classified by [`pgmq_client::Error::outcome`];
//! the queue then shows whether the classification was right.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pgmq_client::{Client, QueueName};

use super::super::job::{key_headers, Job};
use super::super::ledger::{self, ProduceOutcome, Produced};
use super::super::proxy::Proxy;
use super::super::report::{Check, Row};
use super::crash::{proxied_dsn, start_proxy};
use super::{BoxError, Ctx, Run};

/// One producer: sends its keys one by one (`batch` 1) or in batches.
async fn producer(client: Client, q: QueueName, keys: Vec<i64>, batch: usize) -> Produced {
    let mut produced = Produced::default();
    for chunk in keys.chunks(batch) {
        let res = if batch == 1 {
            let k = chunk[0];
            let opts = pgmq_client::SendOptions::new().headers(key_headers(k));
            client
                .send_with(&q, &Job::plain(k), &opts)
                .await
                .map(|id| vec![id])
        } else {
            let jobs: Vec<Job> = chunk.iter().map(|k| Job::plain(*k)).collect();
            let headers: Vec<serde_json::Value> = chunk.iter().map(|k| key_headers(*k)).collect();
            client
                .send_batch_with(
                    &q,
                    &jobs,
                    &pgmq_client::SendOptions::new().headers_each(headers),
                )
                .await
        };
        let failed = res.is_err();
        produced.record(chunk, &res);
        if failed {
            // A producer backs off briefly before its next message.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    produced
}

/// 11: four producers (two single, two batches of 10) through the proxy,
/// which cuts every connection every 100 ms and refuses new ones for 100 ms
/// every fifth time.
pub(crate) async fn producers_under_cuts(ctx: &Ctx) -> Result<Row, BoxError> {
    let mut run = Run::start(ctx, "11").await?;
    let proxy = start_proxy(ctx).await?;
    let client = Client::builder(&proxied_dsn(ctx, &proxy))
        .max_size(4)
        .connect_timeout(Duration::from_secs(1))
        .pool_timeout(Duration::from_secs(1))
        .application_name("pgmq-faults-producer")
        .connect()
        .await?;
    let plan = produce_plan(ctx);
    let done = Arc::new(AtomicBool::new(false));
    let faults = cut_until_done(proxy, done.clone());
    let producers = futures::future::join_all(plan.into_iter().map(|(keys, batch)| {
        tokio::spawn(producer(client.clone(), run.qs.q.clone(), keys, batch))
    }));
    let producers = async {
        let r = producers.await;
        done.store(true, Ordering::SeqCst);
        r
    };
    let (results, (cuts, proxy)) = tokio::join!(producers, faults);
    for r in results {
        run.produced.merge(r?);
    }
    let (cut_conns, refused) = proxy.totals();
    drop(proxy);
    drop(client);
    let cut_stats = CutStats {
        cuts,
        cut_conns,
        refused,
    };

    // Before anything consumes: which keys made it into the queue?
    let (present, unkeyed) = ledger::keys_in_queue(&ctx.client, &run.qs.q).await?;
    let present: HashSet<i64> = present.into_iter().collect();
    run.produced.classify_unknown(&present);
    let checks = produce_checks(&run.produced, &present, unkeyed, &cut_stats);
    run.checks.extend(checks);
    // Then consume everything (unfaulted) and count per key.
    let w = run.spawn(&run.worker_args()).await?;
    Ok(run
        .finish("producers under connection cuts", vec![w])
        .await?
        .row)
}

/// The keys of the four producers, each with its batch size: two send one
/// by one, two in batches of 10.
fn produce_plan(ctx: &Ctx) -> Vec<(Vec<i64>, usize)> {
    // At least 10,000 even with --quick: fewer are produced before the first cut.
    let n = ctx.n.max(10_000) as i64;
    // Singles cost a round trip each: two fifths of the keys keep the
    // producers busy for several seconds, across a few dozen cuts.
    let singles = n * 2 / 5;
    vec![
        ((0..singles).step_by(2).collect(), 1),
        ((1..singles).step_by(2).collect(), 1),
        ((singles..n).filter(|k| k % 2 == 0).collect(), 10),
        ((singles..n).filter(|k| k % 2 == 1).collect(), 10),
    ]
}

/// Cuts every connection through `proxy` every 100 ms, refusing new ones
/// for 100 ms every fifth cut, until `done`; returns the cuts and the proxy.
async fn cut_until_done(proxy: Proxy, done: Arc<AtomicBool>) -> (u32, Proxy) {
    let mut cuts = 0u32;
    while !done.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cuts += 1;
        let refuse = cuts.is_multiple_of(5);
        if refuse {
            proxy.set_accepting(false);
        }
        proxy.cut_all();
        if refuse {
            tokio::time::sleep(Duration::from_millis(100)).await;
            proxy.set_accepting(true);
        }
    }
    (cuts, proxy)
}

/// What the proxy did to the producers.
struct CutStats {
    cuts: u32,
    cut_conns: u64,
    refused: u64,
}

/// The checks of each produce's classification against the keys `present`
/// in the queue before anything consumed.
fn produce_checks(
    produced: &Produced,
    present: &HashSet<i64>,
    unkeyed: u64,
    cut_stats: &CutStats,
) -> [Check; 4] {
    let CutStats {
        cuts,
        cut_conns,
        refused,
    } = *cut_stats;
    let committed_missing = produced
        .records
        .iter()
        .filter(|r| r.outcome == ProduceOutcome::Committed && !present.contains(&r.key))
        .count();
    let failed_present = produced
        .records
        .iter()
        .filter(|r| {
            matches!(
                r.outcome,
                ProduceOutcome::NotSent | ProduceOutcome::Rejected
            ) && present.contains(&r.key)
        })
        .count();
    let per_call = unknown_per_call(produced, present);
    let torn = per_call.values().filter(|(n, p)| *p != 0 && p != n).count();
    let unknown = produced.count(ProduceOutcome::Unknown);
    let recovered = produced
        .records
        .iter()
        .filter(|r| r.recovered == Some(true))
        .count();
    let failed_without_effect =
        produced.count(ProduceOutcome::NotSent) + produced.count(ProduceOutcome::Rejected);
    [
        Check::new(
            "connections cut while produces were in flight",
            cuts > 0 && cut_conns > 0 && unknown > 0,
            format!(
                "{cuts} cuts resetting {cut_conns} connections, {refused} connects refused; \
                 {unknown} produces in flight at a cut, {recovered} of them committed; \
                 failed calls: {:?}",
                produced.errors
            ),
        ),
        Check::new(
            "every committed produce is in the queue",
            committed_missing == 0 && unkeyed == 0,
            format!("{committed_missing} committed but missing"),
        ),
        Check::new(
            "no \"not sent\" or rejected produce is in the queue",
            failed_present == 0,
            format!("{failed_present} of {failed_without_effect} failed-without-effect produces found in the queue"),
        ),
        Check::new(
            "batches all-or-nothing",
            torn == 0,
            format!("{} unknown calls, {torn} partly present", per_call.len()),
        ),
    ]
}

/// Per produce call of unknown outcome: its keys, and how many of them are
/// `present` (a batch is one statement: all of it or none of it).
fn unknown_per_call(produced: &Produced, present: &HashSet<i64>) -> HashMap<u64, (usize, usize)> {
    let mut per_call: HashMap<u64, (usize, usize)> = HashMap::new();
    for r in produced
        .records
        .iter()
        .filter(|r| r.outcome == ProduceOutcome::Unknown)
    {
        let e = per_call.entry(r.call).or_default();
        e.0 += 1;
        e.1 += usize::from(present.contains(&r.key));
    }
    per_call
}
