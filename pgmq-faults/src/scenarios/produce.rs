//! 11: producers whose connections are cut while `send` and `send_batch` are
//! in flight. Every produce is classified by [`pgmq_client::Error::outcome`];
//! the queue then shows whether the classification was right.
//!
//! 11b: the same cuts under producers that send with deduplication keys
//! (`send_keyed`, `send_batch_keyed`) and retry every failed try with the
//! same keys until it succeeds: the queue must then hold every message
//! exactly once, whatever each cut try did.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pgmq_client::{Client, QueueName, SendOptions};

use super::run::Run;
use crate::ctx::Ctx;
use crate::job::{key_headers, Job};
use crate::keyed::{self, Retry, Tries, Try, KEY_WINDOW};
use crate::ledger::{self, ProduceOutcome, Produced};
use crate::proxy::Proxy;
use crate::report::{Check, Row};
use crate::BoxError;

/// One producer: sends its keys one by one (`batch` 1) or in batches.
async fn producer(client: Client, q: QueueName, keys: Vec<i64>, batch: usize) -> Produced {
    let mut produced = Produced::default();
    for chunk in keys.chunks(batch) {
        let res = if batch == 1 {
            let k = chunk[0];
            let opts = SendOptions::new().headers(key_headers(k));
            client
                .send_with(&q, &Job::plain(k), &opts)
                .await
                .map(|id| vec![id])
        } else {
            let (jobs, opts) = batch_of(chunk);
            client.send_batch_with(&q, &jobs, &opts).await
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

/// The jobs of `keys` and the options that put each key in its headers.
fn batch_of(keys: &[i64]) -> (Vec<Job>, SendOptions) {
    let jobs = keys.iter().map(|k| Job::plain(*k)).collect();
    let headers: Vec<serde_json::Value> = keys.iter().map(|k| key_headers(*k)).collect();
    (jobs, SendOptions::new().headers_each(headers))
}

/// The deduplication key of a fault key.
fn dedup_key(k: i64) -> String {
    format!("fault-{k}")
}

/// How a keyed producer retries one call.
const RETRY: Retry = Retry {
    limit: Duration::from_secs(60),
    pause: Duration::from_millis(20),
};

/// What the calls of the keyed producers came to: their tries, and how the
/// calls that landed were answered.
#[derive(Debug, Default)]
struct Calls {
    tries: Tries,
    /// Calls whose successful retry answered every key a duplicate: an
    /// earlier, unknown try had committed.
    committed_before: u64,
    /// Calls answered with duplicates on their first try, or with some
    /// duplicates and some new messages: neither can happen to fresh keys
    /// sent in one statement.
    torn: u64,
}

impl Calls {
    fn merge(&mut self, o: &Calls) {
        self.tries.merge(&o.tries);
        self.committed_before += o.committed_before;
        self.torn += o.torn;
    }
}

/// One keyed producer: sends its keys one by one (`send_keyed`, `batch` 1)
/// or in batches (`send_batch_keyed`), each message under the
/// deduplication key of its fault key, and retries every try that fails
/// with a transient error or an unknown outcome, with the same keys, until
/// it succeeds.
async fn keyed_producer(
    client: Client,
    q: QueueName,
    keys: Vec<i64>,
    batch: usize,
) -> (Produced, Calls) {
    let mut produced = Produced::default();
    let mut calls = Calls::default();
    for chunk in keys.chunks(batch) {
        let dedup: Vec<String> = chunk.iter().map(|k| dedup_key(*k)).collect();
        let (client, q, dedup) = (&client, &q, &dedup);
        let res = keyed::send_retrying(RETRY, &mut calls.tries, &mut produced, |_| async move {
            Try::Answered(if batch == 1 {
                let key = pgmq_client::DedupKey::new(dedup[0].clone(), KEY_WINDOW);
                let opts = SendOptions::new().headers(key_headers(chunk[0]));
                client
                    .send_keyed_with(q, &key, &Job::plain(chunk[0]), &opts)
                    .await
                    .map(|s| vec![s])
            } else {
                let (jobs, opts) = batch_of(chunk);
                client
                    .send_batch_keyed(q, dedup, KEY_WINDOW, &jobs, &opts)
                    .await
            })
        })
        .await;
        if let Ok(landed) = &res {
            let dups = landed.sent.iter().filter(|s| s.duplicate).count();
            if dups != 0 && (landed.tries == 1 || dups != landed.sent.len()) {
                calls.torn += 1;
            } else if dups != 0 {
                calls.committed_before += 1;
            }
        }
        keyed::record(&mut produced, chunk, &res);
    }
    (produced, calls)
}

/// How the producers of a run send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sends {
    /// Plain sends, each failure classified and not retried (11).
    Plain,
    /// Keyed sends, each failure retried with the same keys (11b).
    Keyed,
}

/// 11: four producers (two single, two batches of 10) through the proxy,
/// which cuts every connection every 100 ms and refuses new ones for 100 ms
/// every fifth time.
pub(crate) async fn producers_under_cuts(ctx: &Ctx) -> Result<Row, BoxError> {
    under_cuts(ctx, "11", Sends::Plain).await
}

/// 11b: the producers of 11 with deduplication keys, each failed try
/// retried with the same keys; on the pgmq_sdk schema, installed first.
pub(crate) async fn keyed_producers_under_cuts(ctx: &Ctx) -> Result<Row, BoxError> {
    ctx.client.install_sdk_schema().await?;
    under_cuts(ctx, "11b", Sends::Keyed).await
}

async fn under_cuts(ctx: &Ctx, label: &'static str, sends: Sends) -> Result<Row, BoxError> {
    let mut run = Run::start(ctx, label).await?;
    let proxy = ctx.start_proxy().await?;
    let client = Client::builder(&ctx.proxied_dsn(&proxy))
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
        let (client, q) = (client.clone(), run.qs.q.clone());
        tokio::spawn(async move {
            match sends {
                Sends::Plain => (producer(client, q, keys, batch).await, None),
                Sends::Keyed => {
                    let (p, t) = keyed_producer(client, q, keys, batch).await;
                    (p, Some(t))
                }
            }
        })
    }));
    let producers = async {
        let r = producers.await;
        done.store(true, Ordering::SeqCst);
        r
    };
    let (results, (cuts, proxy)) = tokio::join!(producers, faults);
    let mut calls = Calls::default();
    for r in results {
        let (p, c) = r?;
        run.produced.merge(p);
        if let Some(c) = c {
            calls.merge(&c);
        }
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
    let (ids, unkeyed) = ledger::ids_in_table(&ctx.client, &run.qs.q.quoted_table()).await?;
    match sends {
        Sends::Plain => {
            let present: HashSet<i64> = ids.iter().map(|(k, _)| *k).collect();
            run.produced.classify_unknown(&present);
            let checks = produce_checks(&run.produced, &present, unkeyed, &cut_stats);
            run.checks.extend(checks);
        }
        Sends::Keyed => {
            let checks = keyed_checks(&run.produced, &calls, &ids, unkeyed, &cut_stats);
            run.checks.extend(checks);
        }
    }
    // Then consume everything (unfaulted) and count per key.
    let title = match sends {
        Sends::Plain => "producers under connection cuts",
        Sends::Keyed => "keyed producers retrying through connection cuts",
    };
    let args = run.worker_args();
    Ok(run.finish_by(title, &args).await?.row)
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

impl CutStats {
    /// Whether the proxy cut any connection at all.
    fn cut_any(&self) -> bool {
        self.cuts > 0 && self.cut_conns > 0
    }

    /// The cuts, the connections they reset and the connects refused.
    fn describe(&self) -> String {
        format!(
            "{} cuts resetting {} connections, {} connects refused",
            self.cuts, self.cut_conns, self.refused
        )
    }
}

/// The checks of each produce's classification against the keys `present`
/// in the queue before anything consumed.
fn produce_checks(
    produced: &Produced,
    present: &HashSet<i64>,
    unkeyed: u64,
    cut_stats: &CutStats,
) -> [Check; 4] {
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
            cut_stats.cut_any() && unknown > 0,
            format!(
                "{}; {unknown} produces in flight at a cut, {recovered} of them committed; \
                 failed calls: {:?}",
                cut_stats.describe(),
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

/// The checks of 11b against the messages in the queue before anything
/// consumed (`ids`: key and message id of each): every produced key there
/// exactly once, under the id its producer was given.
fn keyed_checks(
    produced: &Produced,
    calls: &Calls,
    ids: &[(i64, i64)],
    unkeyed: u64,
    cut_stats: &CutStats,
) -> [Check; 4] {
    let mut copies: HashMap<i64, u64> = HashMap::new();
    let mut id_of: HashMap<i64, i64> = HashMap::new();
    for (k, id) in ids {
        *copies.entry(*k).or_default() += 1;
        id_of.insert(*k, *id);
    }
    let sent: HashSet<i64> = produced.records.iter().map(|r| r.key).collect();
    let not_committed = produced
        .records
        .iter()
        .filter(|r| r.outcome != ProduceOutcome::Committed)
        .count();
    let missing = sent.iter().filter(|k| !copies.contains_key(k)).count();
    let doubled = copies.values().filter(|n| **n > 1).count();
    let stray = copies.keys().filter(|k| !sent.contains(k)).count();
    let wrong_id = produced
        .records
        .iter()
        .filter(|r| r.msg_id.is_some() && r.msg_id != id_of.get(&r.key).copied())
        .count();
    [
        Check::new(
            "connections cut while keyed sends were in flight",
            cut_stats.cut_any() && calls.tries.unknown > 0,
            format!(
                "{}; {} tries for {} messages: {} failed with the outcome unknown, {} without \
                 effect, all retried with their keys; {} retried calls found their keys \
                 taken (an unknown try had committed); failed tries: {:?}",
                cut_stats.describe(),
                calls.tries.tries,
                sent.len(),
                calls.tries.unknown,
                calls.tries.no_effect,
                calls.committed_before,
                produced.errors
            ),
        ),
        Check::new(
            "every keyed message in the queue exactly once",
            not_committed == 0
                && calls.tries.gave_up == 0
                && missing == 0
                && doubled == 0
                && stray == 0
                && unkeyed == 0,
            format!(
                "{} keys sent, {} messages in the queue: {missing} missing, {doubled} twice or \
                 more, {stray} never sent, {unkeyed} without a key; {} calls given up",
                sent.len(),
                ids.len() as u64 + unkeyed,
                calls.tries.gave_up
            ),
        ),
        Check::new(
            "each send answered with its message's id",
            wrong_id == 0,
            format!(
                "{wrong_id} keys whose send (or retry) returned an id other than the queued \
                 message's"
            ),
        ),
        Check::new(
            "keyed batches all new or all duplicate",
            calls.torn == 0,
            format!(
                "{} calls answered partly duplicate, or duplicate on their first try",
                calls.torn
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cuts() -> CutStats {
        CutStats {
            cuts: 3,
            cut_conns: 5,
            refused: 0,
        }
    }

    /// Keys 1 to 3 sent as ids 11 to 13, after one unknown try.
    fn sent() -> (Produced, Calls) {
        let mut p = Produced::default();
        p.record(&[1, 2, 3], &Ok(vec![11, 12, 13]));
        let tries = Tries {
            tries: 2,
            unknown: 1,
            ..Tries::default()
        };
        let c = Calls {
            tries,
            ..Calls::default()
        };
        (p, c)
    }

    fn passes(checks: &[Check]) -> Vec<bool> {
        checks.iter().map(|c| c.pass).collect()
    }

    #[test]
    fn keyed_checks_pass_when_each_message_is_there_once() {
        let (p, t) = sent();
        let ids = [(1, 11), (2, 12), (3, 13)];
        assert_eq!(passes(&keyed_checks(&p, &t, &ids, 0, &cuts())), [true; 4]);
    }

    #[test]
    fn keyed_checks_fail_on_a_duplicate_a_loss_or_a_wrong_id() {
        let (p, t) = sent();
        let doubled = [(1, 11), (2, 12), (3, 13), (3, 14)];
        assert!(!keyed_checks(&p, &t, &doubled, 0, &cuts())[1].pass);
        let missing = [(1, 11), (2, 12)];
        assert!(!keyed_checks(&p, &t, &missing, 0, &cuts())[1].pass);
        let stray = [(1, 11), (2, 12), (3, 13), (9, 19)];
        assert!(!keyed_checks(&p, &t, &stray, 0, &cuts())[1].pass);
        let wrong = [(1, 11), (2, 12), (3, 14)];
        assert!(!keyed_checks(&p, &t, &wrong, 0, &cuts())[2].pass);
        let torn = Calls {
            torn: 1,
            ..sent().1
        };
        assert!(!keyed_checks(&p, &torn, &[(1, 11), (2, 12), (3, 13)], 0, &cuts())[3].pass);
        let mut no_cut = sent().1;
        no_cut.tries.unknown = 0;
        assert!(!keyed_checks(&p, &no_cut, &[(1, 11), (2, 12), (3, 13)], 0, &cuts())[0].pass);
    }
}
