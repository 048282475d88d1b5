//! A worker consumes a queue another PGMQ client made with a name PGMQ
//! accepts and folds (upper case, `-`, `.`), dead-letters to another such
//! queue, with notifications on: every message handled once.

mod common;

use std::time::Duration;

use common::{client, wait_for, Queues};
use pgmq_client::{Message, QueueName};
use pgmq_worker::{Outcome, WakeUp, Worker};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_consumes_and_dead_letters_queues_with_folded_names() {
    let client = client().await;
    let id = std::process::id();
    // pgmq.create with the names as given, as another client would call it.
    let q = QueueName::new(&format!("Orders-EU.v2-{id}")).unwrap();
    let dlq = QueueName::new(&format!("Orders-EU.DLQ-{id}")).unwrap();
    let _g = Queues::new(&client, &[&q, &dlq]).await;
    let bodies: Vec<Value> = (0..20).map(|n| json!({ "n": n })).collect();
    client.send_batch(&q, &bodies).await.unwrap();

    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(4)
        .poll_interval(Duration::from_millis(50))
        .wake_up(WakeUp::Notify)
        .dead_letter_queue(dlq.clone())
        .handler(|m: Message<Value>| async move {
            Ok(match m.body["n"].as_u64() {
                Some(n) if n % 5 == 0 => Outcome::DeadLetter("every fifth".into()),
                Some(n) if n % 2 == 0 => Outcome::Archive,
                _ => Outcome::Delete,
            })
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(Duration::from_secs(30), "20 acknowledgements", || async {
        handle.acked() == 20
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.handled, 20);
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 0);
    // 0, 5, 10, 15 dead-lettered into the other folded queue.
    let dead = client
        .read_raw(&dlq, Duration::from_secs(30), 100)
        .await
        .unwrap();
    assert_eq!(dead.len(), 4);
    // 2, 4, 6, 8, 12, 14, 16, 18 archived in the folded archive table.
    let conn = client.connection().await.unwrap();
    let archived: i64 = conn
        .query_one(
            &format!("SELECT count(*) FROM {}", q.quoted_archive_table()),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(archived, 8);
}
