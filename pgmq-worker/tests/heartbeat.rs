//! A handler that runs past its visibility timeout: the heartbeat keeps the
//! message invisible (no second delivery); without it, it is redelivered.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{client, queue_len, unique, wait_for, Queues};
use pgmq_client::Message;
use pgmq_worker::{Outcome, Worker};
use serde_json::{json, Value};

/// Runs one 5 s handler on a 2 s visibility timeout; returns the read_ct of
/// every delivery the worker saw, and the worker's heartbeat count.
async fn long_job(heartbeat: bool) -> (Vec<i32>, u64) {
    let client = client().await;
    let q = unique(if heartbeat { "hb" } else { "nohb" });
    let _g = Queues::new(&client, &[&q]).await;
    client.send(&q, &json!({"job": "long"})).await.unwrap();

    let deliveries = Arc::new(Mutex::new(Vec::new()));
    let d = Arc::clone(&deliveries);
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(2)
        .visibility_timeout(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(50))
        .heartbeat(heartbeat)
        .handler(move |m: Message<Value>| {
            d.lock().unwrap().push(m.read_ct);
            async move {
                // Only the first delivery is long, so a second one ends soon.
                if m.read_ct == 1 {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                Ok::<_, std::io::Error>(Outcome::Delete)
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    let h = &handle;
    wait_for(Duration::from_secs(20), "the long job done", || async {
        h.stats().handled >= 1 && h.stats().acks_pending == 0
    })
    .await;
    // Give a redelivered copy time to be seen.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(queue_len(&client, &q).await, 0);
    let d = deliveries.lock().unwrap().clone();
    (d, report.stats.heartbeats)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_keeps_a_long_handlers_message_invisible() {
    let (deliveries, heartbeats) = long_job(true).await;
    assert_eq!(deliveries, vec![1], "delivered twice despite the heartbeat");
    // Extended at ~1 s, ~2 s, ~3 s, ~4 s (every half timeout, checked every quarter).
    assert!(heartbeats >= 3, "{heartbeats} heartbeats");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_heartbeat_a_long_handlers_message_is_delivered_again() {
    let (deliveries, heartbeats) = long_job(false).await;
    assert_eq!(heartbeats, 0);
    assert!(deliveries.len() >= 2, "{deliveries:?}");
    assert_eq!(&deliveries[..2], &[1, 2]);
}
