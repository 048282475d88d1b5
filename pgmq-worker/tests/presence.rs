//! The presence record (`WorkerBuilder::presence`) against the real
//! database: a worker that keeps one is listed by `Pgmq::fleet` with its
//! host, pid, queue, concurrency and counts while it runs, and marked
//! stopped after a clean shutdown; a worker without the `pgmq_sdk` schema
//! runs all the same.

mod common;

use std::time::Duration;

use common::{queue_len, unique, wait_for, OwnDatabase};
use pgmq_client::{Client, Message, QueueName};
use pgmq_worker::{Outcome, Worker, WorkerHandle};

/// A worker on `q` with a presence record every 100 ms, spawned, once it
/// handled every message of `q`.
async fn drained(client: &Client, q: &QueueName, concurrency: usize) -> WorkerHandle {
    let worker = Worker::builder(client.clone(), q.clone())
        .concurrency(concurrency)
        .poll_interval(Duration::from_millis(50))
        .presence(Some(Duration::from_millis(100)))
        .handler(|_m: Message<u64>| async { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(Duration::from_secs(10), "the messages handled", || {
        let client = client.clone();
        let q = q.clone();
        async move { queue_len(&client, &q).await == 0 }
    })
    .await;
    handle
}

#[tokio::test]
async fn a_worker_keeps_its_presence_record_and_marks_it_stopped() {
    let db = OwnDatabase::create("wpres").await;
    let client = db.client(8).await;
    let q = unique("wpres");
    client.create(&q).await.unwrap();
    client.send_batch(&q, &[1u64, 2, 3]).await.unwrap();
    let handle = drained(&client, &q, 3).await;
    wait_for(Duration::from_secs(10), "a record with the acks", || {
        let client = client.clone();
        async move {
            let fleet = client.fleet(10).await.unwrap();
            fleet.iter().any(|w| w.acked == 3 && w.claimed == 3)
        }
    })
    .await;
    let fleet = client.fleet(10).await.unwrap();
    assert_eq!(fleet.len(), 1);
    let w = &fleet[0];
    assert_eq!(w.queue_name, q.as_str());
    assert_eq!(w.pid, std::process::id() as i32);
    assert_eq!(w.concurrency, 3);
    assert!(!w.paused && !w.limited && w.stopped_at.is_none());
    assert!(w.seen_secs_ago.unwrap() < 10.0);
    handle.shutdown().await.unwrap();
    wait_for(Duration::from_secs(10), "the record marked stopped", || {
        let client = client.clone();
        async move { client.fleet(10).await.unwrap()[0].stopped_at.is_some() }
    })
    .await;
}

#[tokio::test]
async fn a_worker_without_the_schema_runs_all_the_same() {
    let db = OwnDatabase::create("wpres_none").await;
    db.execute("DROP SCHEMA pgmq_sdk CASCADE").await;
    let client = db.client(8).await;
    let q = unique("wpres_none");
    client.create(&q).await.unwrap();
    client.send_batch(&q, &[1u64, 2]).await.unwrap();
    let handle = drained(&client, &q, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    handle.shutdown().await.unwrap();
}
