//! The completer's batching, on the real database: acknowledgements that
//! arrive while the writer is busy go out as soon as it is free, not after
//! the flush interval.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{client, queue_len, unique, wait_for, Queues, RowLock};
use pgmq_client::Message;
use pgmq_worker::{Outcome, Worker};
use serde::Deserialize;
use serde_json::json;
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
