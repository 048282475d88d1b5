//! The worker's vacuum of its queue table (`WorkerBuilder::vacuum`)
//! against the real database: a worker that owns its queue table vacuums
//! it once the dead row versions pass the threshold, and handles every
//! message all the while; the setting off, the worker never vacuums.

mod common;

use std::time::Duration;

use common::{queue_len, unique, wait_for, Queues};
use pgmq_client::{Client, Message, QueueName};
use pgmq_worker::{Outcome, QueueVacuum, Worker};

/// How many times the queue table was vacuumed by a `VACUUM` statement.
async fn vacuum_count(q: &QueueName) -> i64 {
    let pg = tokio_postgres::connect(&common::dsn(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(pg.1);
    pg.0.query_one(
        "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = to_regclass($1)",
        &[&q.quoted_table()],
    )
    .await
    .unwrap()
    .get(0)
}

/// Sends `n` messages to `q` and runs a worker with `vacuum` until every
/// one is handled; returns the worker's handle, still running.
async fn drain(
    client: &Client,
    q: &QueueName,
    n: u64,
    vacuum: Option<QueueVacuum>,
) -> pgmq_worker::WorkerHandle {
    let bodies: Vec<u64> = (0..n).collect();
    for chunk in bodies.chunks(500) {
        client.send_batch(q, chunk).await.unwrap();
    }
    let worker = Worker::builder(client.clone(), q.clone())
        .concurrency(4)
        .poll_interval(Duration::from_millis(50))
        .vacuum(vacuum)
        .handler(|_m: Message<u64>| async { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(Duration::from_secs(30), "every message handled", || {
        let (client, q) = (client.clone(), q.clone());
        async move { queue_len(&client, &q).await == 0 }
    })
    .await;
    handle
}

#[tokio::test]
async fn a_worker_vacuums_its_queue_table_past_the_threshold() {
    let client = common::client().await;
    let q = unique("wvac");
    let _qs = Queues::new(&client, &[&q]).await;
    let before = vacuum_count(&q).await;
    let policy = QueueVacuum::at_dead_rows(100).check_every(Duration::from_millis(100));
    let handle = drain(&client, &q, 2_000, Some(policy)).await;
    wait_for(Duration::from_secs(30), "the queue table vacuumed", || {
        let q = q.clone();
        async move { vacuum_count(&q).await > before }
    })
    .await;
    handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn without_the_setting_the_worker_never_vacuums() {
    let client = common::client().await;
    let q = unique("wvac_off");
    let _qs = Queues::new(&client, &[&q]).await;
    let before = vacuum_count(&q).await;
    let handle = drain(&client, &q, 500, None).await;
    // Long enough for a look of a worker with the setting on, and for the
    // statistics of the deletes to reach the server.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    handle.shutdown().await.unwrap();
    assert_eq!(vacuum_count(&q).await, before);
}
