//! The completer on the real database: acknowledgements that arrive while
//! the writer is busy go out as soon as it is free, not after the flush
//! interval; dead letters keep no worker-private header in their original
//! headers, and of two deliveries of one message in a batch the newest is
//! the one moved.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{client, queue_len, unique, wait_for, Queues, RowLock};
use pgmq_client::{Message, SendOptions};
use pgmq_worker::{Backoff, Outcome, Worker, ATTEMPTS_HEADER};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};

const WAIT: Duration = Duration::from_secs(20);

#[derive(Debug, Deserialize)]
struct Job {
    n: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_waiting_on_a_busy_writer_go_out_when_it_is_free() {
    let client = client().await;
    let q = unique("busyw");
    let _g = Queues::new(&client, &[&q]).await;
    let first: Vec<_> = (0..10).map(|n| json!({ "n": n })).collect();
    let ids = client.send_batch(&q, &first).await.unwrap();

    // Message 0's handler reports its id and waits until the test holds a
    // lock on its row, so that the delete of the first batch (10 acks, a
    // full batch) blocks: the writer is busy.
    let (started_tx, mut started) = mpsc::unbounded_channel::<i64>();
    let locked = Arc::new(Notify::new());
    let l = Arc::clone(&locked);
    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .concurrency(16)
        .batch_size(10)
        .poll_interval(Duration::from_millis(20))
        .ack_batch_size(10)
        .ack_flushers(1)
        // A partial batch would wait a minute for more acknowledgements if
        // it did not go out as soon as the writer is free.
        .ack_flush_interval(Duration::from_secs(60))
        .handler(move |m: Message<Job>| {
            let started_tx = started_tx.clone();
            let l = Arc::clone(&l);
            async move {
                if m.body.n == 0 {
                    started_tx.send(m.msg_id).unwrap();
                    l.notified().await;
                }
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();

    let held = started.recv().await.unwrap();
    assert_eq!(held, ids[0]);
    let lock = RowLock::take(&client, &q, held).await;
    locked.notify_one();
    // The first batch's delete now waits on the row lock. Five more
    // messages are handled meanwhile; their acknowledgements wait.
    let more: Vec<_> = (10..15).map(|n| json!({ "n": n })).collect();
    client.send_batch(&q, &more).await.unwrap();
    wait_for(WAIT, "15 handled", || async {
        handle.stats().handled == 15
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(handle.acked(), 0, "the first delete should be blocked");
    assert_eq!(queue_len(&client, &q).await, 15);

    let freed = Instant::now();
    lock.release().await;
    wait_for(WAIT, "15 deletes", || async { handle.acked() == 15 }).await;
    let took = freed.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the 5 waiting acknowledgements took {took:?} after the writer was free"
    );
    assert_eq!(queue_len(&client, &q).await, 0);
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.stats.deleted, 15);
    assert_eq!(report.stats.acks_pending, 0);
}

/// A dead letter sent back to its queue with its original headers (as
/// `pgmq redrive` does) gets all of `max_attempts` again: the attempts
/// header the worker's retries wrote is not among the original headers;
/// the sender's own headers are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redriven_dead_letter_gets_max_attempts_again() {
    let client = client().await;
    let q = unique("redrv");
    let dlq = unique("redrv_dlq");
    let _g = Queues::new(&client, &[&q, &dlq]).await;
    let opts = SendOptions::new().headers(json!({"tenant": "acme"}));
    client.send_with(&q, &json!({"n": 1}), &opts).await.unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    let r = Arc::clone(&runs);
    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(20))
        .max_attempts(2)
        .retry_backoff(Backoff::constant(Duration::ZERO))
        .dead_letter_queue(dlq.clone())
        .handler(move |_m: Message<Job>| {
            r.fetch_add(1, Ordering::Relaxed);
            async { Err::<Outcome, _>("boom".into()) }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    dead_lettered(&handle, 1).await;
    assert_eq!(runs.load(Ordering::Relaxed), 2);
    // Redrive: the body and the original headers back to the queue.
    let dead = client
        .read::<Value>(&dlq, Duration::from_secs(30), 10)
        .await
        .unwrap();
    let dead = common::ok(dead);
    assert_eq!(dead.len(), 1);
    let original = dead[0].headers.as_ref().unwrap()["original_headers"].clone();
    assert_eq!(original, json!({"tenant": "acme"}), "{original}");
    assert!(original.get(ATTEMPTS_HEADER).is_none());
    let opts = SendOptions::new().headers(original);
    client.send_with(&q, &dead[0].body, &opts).await.unwrap();
    client.delete(&dlq, dead[0].msg_id).await.unwrap();
    dead_lettered(&handle, 2).await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(
        runs.load(Ordering::Relaxed),
        4,
        "the redriven message ran too few times"
    );
    assert_eq!(report.stats.failed, 4);
    let again = common::ok(
        client
            .read::<Value>(&dlq, Duration::from_secs(30), 10)
            .await
            .unwrap(),
    );
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].headers.as_ref().unwrap()["attempts"], 2);
}

/// Two deliveries of one message that meet in one dead-letter batch (the
/// first one's acknowledgement waited past the visibility timeout, without
/// a heartbeat, and the message was claimed again): the newest delivery is
/// the one moved, so the message is dead-lettered by that batch and not
/// delivered a third time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newest_delivery_of_a_dead_letter_in_a_batch_is_moved() {
    let client = client().await;
    let q = unique("dldup");
    let dlq = unique("dldup_dlq");
    let _g = Queues::new(&client, &[&q, &dlq]).await;
    client.send(&q, &json!({"n": 1})).await.unwrap();
    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(50))
        .visibility_timeout(Duration::from_secs(2))
        .heartbeat(false)
        // The first acknowledgement waits 3 s for company: the second
        // delivery (at 2 s) joins its batch; a third (at 4 s) cannot.
        .ack_flush_interval(Duration::from_secs(3))
        .dead_letter_queue(dlq.clone())
        .handler(|_m: Message<Job>| async { Ok(Outcome::DeadLetter("poison".into())) })
        .build()
        .unwrap();
    let handle = worker.spawn();
    dead_lettered(&handle, 1).await;
    // A third delivery would come 2 s after the second one's claim.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.stats.handled, 2, "delivered again after the batch");
    assert_eq!(report.claims_lost, 0);
    assert_eq!(queue_len(&client, &q).await, 0);
    assert_eq!(queue_len(&client, &dlq).await, 1);
}

async fn dead_lettered(handle: &pgmq_worker::WorkerHandle, n: u64) {
    wait_for(WAIT, "dead-lettered", || async {
        handle.stats().dead_lettered == n
    })
    .await;
}
