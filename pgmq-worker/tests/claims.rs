//! How the claimers read: every claim path drains a queue once per message,
//! and with the default bounded reads a message retried below the bound is
//! claimed again by the next read from the start, long before the backlog
//! above it is drained, also with several workers (cursors) on one queue.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{client, queue_len, unique, wait_for, Queues};
use pgmq_client::Message;
use pgmq_worker::{ClaimReads, Outcome, Worker};
use serde::Deserialize;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);

#[derive(Debug, Deserialize)]
struct Job {
    n: u64,
}

async fn send_jobs(client: &pgmq_client::Client, q: &pgmq_client::QueueName, count: u64) {
    let mut n = 0;
    while n < count {
        let k = (count - n).min(5000);
        let bodies: Vec<Value> = (n..n + k).map(|n| json!({ "n": n })).collect();
        client.send_batch(q, &bodies).await.unwrap();
        n += k;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_claim_path_drains_each_message_once() {
    let client = client().await;
    for how in [
        ClaimReads::Bounded,
        ClaimReads::FromStart,
        ClaimReads::Function,
    ] {
        let q = unique("paths");
        let _g = Queues::new(&client, &[&q]).await;
        send_jobs(&client, &q, 1000).await;
        let seen = Arc::new(Mutex::new(HashMap::<u64, u32>::new()));
        let s = Arc::clone(&seen);
        let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
            .batch_size(50)
            .poll_interval(Duration::from_millis(50))
            .claim_reads(how)
            .handler(move |m: Message<Job>| {
                let s = Arc::clone(&s);
                async move {
                    *s.lock().unwrap().entry(m.body.n).or_default() += 1;
                    Ok(Outcome::Delete)
                }
            })
            .build()
            .unwrap();
        let handle = worker.spawn();
        wait_for(WAIT, "1000 deletes", || async { handle.acked() == 1000 }).await;
        let report = handle.shutdown().await.unwrap();
        assert_eq!(queue_len(&client, &q).await, 0, "{how:?}");
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1000, "{how:?}");
        assert!(
            seen.values().all(|&c| c == 1),
            "{how:?}: a message ran twice"
        );
        assert_eq!(report.stats.claimed, 1000, "{how:?}");
        // The reads that started at the queue's head: every one of the
        // path that always does, none of `pgmq.read`'s (not counted: it is
        // not a statement on the table), and for the bounded path at least
        // the first (how many more depends on the drain's timing).
        let (reads, from_start) = (report.stats.reads, report.stats.reads_from_start);
        match how {
            ClaimReads::FromStart => assert_eq!(from_start, reads),
            ClaimReads::Function => assert_eq!(from_start, 0),
            _ => assert!((1..=reads).contains(&from_start), "{from_start} of {reads}"),
        }
    }
}

/// The lowest message fails once and is retried at once; the claimers are
/// far above it by then. It must run again within about a poll interval,
/// while most of the backlog is still waiting, not after the tail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_below_the_bound_is_claimed_again_while_the_backlog_lasts() {
    const COUNT: u64 = 8000;
    let client = client().await;
    let q = unique("retry_low");
    let _g = Queues::new(&client, &[&q]).await;
    send_jobs(&client, &q, COUNT).await;

    let handled = Arc::new(AtomicU64::new(0));
    // Messages handled before each run of message 0.
    let runs_of_first = Arc::new(Mutex::new(Vec::<u64>::new()));
    let (h, r) = (Arc::clone(&handled), Arc::clone(&runs_of_first));
    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .concurrency(4)
        .poll_interval(Duration::from_millis(100))
        .retry_jitter(false)
        .handler(move |m: Message<Job>| {
            let (h, r) = (Arc::clone(&h), Arc::clone(&r));
            async move {
                // Slow enough that the drain takes seconds.
                tokio::time::sleep(Duration::from_millis(1)).await;
                let before = h.fetch_add(1, Ordering::Relaxed);
                if m.body.n == 0 {
                    let mut runs = r.lock().unwrap();
                    runs.push(before);
                    if runs.len() == 1 {
                        return Ok(Outcome::Retry(Duration::ZERO));
                    }
                }
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "every message deleted", || async {
        handle.acked() == COUNT + 1
    })
    .await;
    handle.shutdown().await.unwrap();
    assert_eq!(queue_len(&client, &q).await, 0);
    let runs = runs_of_first.lock().unwrap().clone();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(
        runs[1] < COUNT / 2,
        "the retried message waited for {} others to run first",
        runs[1]
    );
}

/// Four workers (each its own cursor, as separate processes have) drain one
/// queue; every 50th message fails once and is retried at once, below the
/// bounds by then, found only by reads from the start, which a worker that
/// sees others on its queue makes less often. Every message is deleted,
/// each runs once, the retried ones exactly twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_workers_handles_each_message_once_and_every_retry() {
    const COUNT: u64 = 4000;
    let admin = client().await;
    let q = unique("fleet");
    let _g = Queues::new(&admin, &[&q]).await;
    send_jobs(&admin, &q, COUNT).await;
    let runs = Arc::new(Mutex::new(HashMap::<u64, u32>::new()));
    let mut handles = Vec::new();
    for _ in 0..4 {
        let r = Arc::clone(&runs);
        let worker: Worker<Job> = Worker::builder(client().await, q.clone())
            .batch_size(50)
            .poll_interval(Duration::from_millis(50))
            .retry_jitter(false)
            .handler(move |m: Message<Job>| {
                let r = Arc::clone(&r);
                async move {
                    let n = {
                        let mut runs = r.lock().unwrap();
                        let c = runs.entry(m.body.n).or_default();
                        *c += 1;
                        *c
                    };
                    if m.body.n.is_multiple_of(50) && n == 1 {
                        return Ok(Outcome::Retry(Duration::ZERO));
                    }
                    Ok(Outcome::Delete)
                }
            })
            .build()
            .unwrap();
        handles.push(worker.spawn());
    }
    let retried = COUNT / 50;
    wait_for(WAIT, "every message deleted", || async {
        handles.iter().map(|h| h.acked()).sum::<u64>() == COUNT + retried
    })
    .await;
    for h in handles {
        h.shutdown().await.unwrap();
    }
    assert_eq!(queue_len(&admin, &q).await, 0);
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len() as u64, COUNT);
    for (n, c) in runs.iter() {
        let want = if n.is_multiple_of(50) { 2 } else { 1 };
        assert_eq!(*c, want, "message {n} ran {c} times");
    }
}
