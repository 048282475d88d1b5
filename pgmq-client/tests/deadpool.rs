//! A caller's deadpool-postgres pool runs every PGMQ call (feature
//! `deadpool`): on the pool itself, on one of its connections, and inside a
//! transaction the caller opened on it.
#![cfg(feature = "deadpool")]

mod common;

use std::time::Duration;

use pgmq_client::{Pgmq, QueueName};
use serde_json::json;

fn pool() -> deadpool_postgres::Pool {
    let config: tokio_postgres::Config = common::dsn().parse().unwrap();
    let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
    deadpool_postgres::Pool::builder(manager)
        .max_size(4)
        .build()
        .unwrap()
}

#[tokio::test]
async fn every_call_runs_on_a_deadpool_pool() {
    let pgmq = Pgmq::on(pool());
    let q = QueueName::new(&format!("deadpool_{}", std::process::id())).unwrap();
    pgmq.create(&q).await.unwrap();
    let ids = pgmq
        .send_batch(&q, &[json!({"n": 1}), json!({"n": 2})])
        .await
        .unwrap();
    assert_eq!(ids.len(), 2);
    let msgs = pgmq
        .read_raw(&q, Duration::from_secs(30), 10)
        .await
        .unwrap();
    assert_eq!(msgs.len(), 2);
    // A statement on the queue table (prepared in deadpool's cache).
    let receipts: Vec<_> = msgs.iter().filter_map(|m| m.receipt()).collect();
    assert_eq!(pgmq.delete_fenced(&q, &receipts).await.unwrap().len(), 2);

    // Inside the caller's own transaction on one of the pool's connections:
    // rolled back, the message was never sent.
    let p = pool();
    let mut conn = p.get().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    Pgmq::on(&*tx).send(&q, &json!({"n": 3})).await.unwrap();
    tx.rollback().await.unwrap();
    let on_conn = Pgmq::on(conn);
    assert_eq!(on_conn.metrics(&q).await.unwrap().queue_length, 0);
    pgmq.drop_queue(&q).await.unwrap();
}
