//! FIFO groups in the worker (`ClaimReads::FifoGroups`): messages of one
//! group run one at a time in `msg_id` order, different groups in parallel,
//! and a retried head holds the rest of its group back.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{client, queue_len, unique, wait_for, Queues};
use pgmq_client::{Message, SendOptions, FIFO_GROUP_HEADER};
use pgmq_worker::{Backoff, ClaimReads, Outcome, Worker};
use serde_json::{json, Value};

#[derive(Debug, Clone)]
struct Run {
    group: String,
    seq: i64,
    start: Instant,
    end: Instant,
    ok: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_run_in_order_one_at_a_time_and_a_retry_holds_its_group() {
    let client = client().await;
    let q = unique("fifo");
    let _g = Queues::new(&client, &[&q]).await;
    let groups = ["a", "b", "c", "d"];
    // Interleaved: a0 b0 c0 d0 a1 b1 ...
    for seq in 0..8i64 {
        for g in groups {
            let opts = SendOptions::new().headers(json!({ FIFO_GROUP_HEADER: g }));
            client
                .send_with(&q, &json!({ "group": g, "seq": seq }), &opts)
                .await
                .unwrap();
        }
    }
    let runs = Arc::new(Mutex::new(Vec::<Run>::new()));
    let in_flight = Arc::new(Mutex::new((0usize, 0usize)));
    let (r, f) = (Arc::clone(&runs), Arc::clone(&in_flight));
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(4)
        .poll_interval(Duration::from_millis(50))
        .claim_reads(ClaimReads::FifoGroups)
        .retry_backoff(Backoff::constant(Duration::ZERO))
        .retry_jitter(false)
        .handler(move |m: Message<Value>| {
            let (r, f) = (Arc::clone(&r), Arc::clone(&f));
            async move {
                let group = m.body["group"].as_str().unwrap().to_owned();
                let seq = m.body["seq"].as_i64().unwrap();
                {
                    let mut f = f.lock().unwrap();
                    f.0 += 1;
                    f.1 = f.1.max(f.0);
                }
                let start = Instant::now();
                tokio::time::sleep(Duration::from_millis(10)).await;
                // Group a's third message fails on its first run.
                let ok = !(group == "a" && seq == 2 && m.read_ct == 1);
                f.lock().unwrap().0 -= 1;
                r.lock().unwrap().push(Run {
                    group,
                    seq,
                    start,
                    end: Instant::now(),
                    ok,
                });
                if ok {
                    Ok(Outcome::Delete)
                } else {
                    Err("not yet".into())
                }
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(Duration::from_secs(60), "every message deleted", || async {
        handle.stats().deleted == 32
    })
    .await;
    handle.shutdown().await.unwrap();
    assert_eq!(queue_len(&client, &q).await, 0);

    let runs = runs.lock().unwrap().clone();
    let mut by_group: HashMap<String, Vec<Run>> = HashMap::new();
    for run in runs {
        by_group.entry(run.group.clone()).or_default().push(run);
    }
    for (g, mut list) in by_group {
        list.sort_by_key(|r| r.start);
        // One at a time: each run starts after the previous one ended.
        for w in list.windows(2) {
            assert!(w[1].start >= w[0].end, "group {g}: runs overlap: {w:?}");
        }
        // In order, the failed head run again before anything after it.
        let order: Vec<(i64, bool)> = list.iter().map(|r| (r.seq, r.ok)).collect();
        let mut want: Vec<(i64, bool)> = (0..8).map(|s| (s, true)).collect();
        if g == "a" {
            want.insert(2, (2, false));
        }
        assert_eq!(order, want, "group {g}");
    }
    // Different groups ran at the same time.
    assert!(
        in_flight.lock().unwrap().1 >= 2,
        "groups never ran in parallel"
    );
}

/// One message of group "a", `seq` in its body.
async fn send_in_group(client: &pgmq_client::Client, q: &pgmq_client::QueueName, n: i64) {
    for seq in 0..n {
        let opts = SendOptions::new().headers(json!({ FIFO_GROUP_HEADER: "a" }));
        client
            .send_with(q, &json!({ "group": "a", "seq": seq }), &opts)
            .await
            .unwrap();
    }
}

/// A blocking run abandoned at `handler_timeout` goes on on its thread: the
/// group keeps it until that thread returns, so the retried head does not
/// run alongside it, nor does the group's next message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_run_past_its_timeout_keeps_its_group_until_it_returns() {
    let client = client().await;
    let q = unique("fifoblk");
    let _g = Queues::new(&client, &[&q]).await;
    send_in_group(&client, &q, 2).await;
    // (running now, most at once)
    let in_flight = Arc::new(Mutex::new((0usize, 0usize)));
    let f = Arc::clone(&in_flight);
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(2)
        .poll_interval(Duration::from_millis(50))
        .claim_reads(ClaimReads::FifoGroups)
        .retry_backoff(Backoff::constant(Duration::ZERO))
        .retry_jitter(false)
        .handler_timeout(Duration::from_millis(200))
        .blocking_handler(move |m: Message<Value>| {
            {
                let mut f = f.lock().unwrap();
                f.0 += 1;
                f.1 = f.1.max(f.0);
            }
            // The head's first run outlives its timeout fivefold.
            if m.body["seq"] == 0 && m.read_ct == 1 {
                std::thread::sleep(Duration::from_secs(1));
            }
            f.lock().unwrap().0 -= 1;
            Ok(Outcome::Delete)
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(Duration::from_secs(20), "both deleted", || async {
        handle.stats().deleted == 2
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.stats.timed_out, 1);
    assert_eq!(
        in_flight.lock().unwrap().1,
        1,
        "two runs of one group at once"
    );
}

/// Deletes every message in its transaction.
struct DeleteInTx;

impl pgmq_worker::TransactionalHandler<Value> for DeleteInTx {
    async fn handle(
        &self,
        _msg: Message<Value>,
        _tx: &pgmq_client::Transaction<'_>,
        _ctx: pgmq_worker::Context,
    ) -> Result<Outcome, pgmq_worker::HandlerError> {
        Ok(Outcome::Delete)
    }
}

/// A message acknowledged in a transactional handler's transaction wakes
/// the claimers, as the completer's acknowledgements do: the group's next
/// message is claimed at once, not at the next poll (a minute away here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_acknowledgements_advance_the_group_at_once() {
    let client = client().await;
    let q = unique("fifotx");
    let _g = Queues::new(&client, &[&q]).await;
    send_in_group(&client, &q, 3).await;
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_secs(60))
        .claim_reads(ClaimReads::FifoGroups)
        .concurrency(2)
        .transactional_handler(DeleteInTx)
        .build()
        .unwrap();
    let handle = worker.spawn();
    // Did not wait for a poll: 3 messages need 2 group advances.
    wait_for(Duration::from_secs(20), "all 3 deleted", || async {
        handle.stats().deleted == 3
    })
    .await;
    handle.shutdown().await.unwrap();
    assert_eq!(queue_len(&client, &q).await, 0);
}
