//! A worker on a caller's deadpool-postgres pool (feature `deadpool`): every
//! message is handled and acknowledged with plain and transactional
//! handlers, notifications come over a LISTEN connection of their own, and
//! nothing is lost.
#![cfg(feature = "deadpool")]

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{client, dsn, queue_len, unique, wait_for, InsertRow, Queues};
use pgmq_client::Message;
use pgmq_worker::{ConnectionSource, Outcome, WakeUp, Worker};
use serde_json::{json, Value};

fn pool(size: usize) -> deadpool_postgres::Pool {
    let config: tokio_postgres::Config = dsn().parse().unwrap();
    let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
    deadpool_postgres::Pool::builder(manager)
        .max_size(size)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_worker_on_a_deadpool_pool_handles_and_acknowledges_every_message() {
    let setup = client().await;
    let q = unique("dp");
    let _queues = Queues::new(&setup, &[&q]).await;
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let s = Arc::clone(&seen);
    // claimers (2) + ack_flushers + heartbeat: the pool is the only one.
    let conns = ConnectionSource::deadpool(pool(5)).listen_dsn(&dsn());
    let worker: Worker<Value> = Worker::builder(conns, q.clone())
        .concurrency(4)
        .batch_size(20)
        .wake_up(WakeUp::Notify)
        .poll_interval(Duration::from_secs(5))
        .handler(move |msg: Message<Value>| {
            let s = Arc::clone(&s);
            async move {
                s.lock().unwrap().insert(msg.body["n"].as_i64().unwrap());
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    // Sent after the worker started: the first batch wakes it by notification.
    let bodies: Vec<Value> = (0..300).map(|n| json!({ "n": n })).collect();
    setup.send_batch(&q, &bodies).await.unwrap();
    wait_for(Duration::from_secs(30), "every message handled", || {
        let n = seen.lock().unwrap().len();
        async move { n == 300 }
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.stats.deleted, 300, "{report:?}");
    assert_eq!(report.stats.acks_failed, 0);
    assert_eq!(queue_len(&setup, &q).await, 0, "every message acknowledged");
}

#[tokio::test]
async fn transactional_completion_runs_on_a_deadpool_connection() {
    let setup = client().await;
    let q = unique("dptx");
    let _queues = Queues::new(&setup, &[&q]).await;
    let ledger = common::Ledger::create(&setup, "rows", &q).await;
    let bodies: Vec<Value> = (0..150).map(|n| json!({ "n": n })).collect();
    setup.send_batch(&q, &bodies).await.unwrap();
    // Room for the handlers' transactions too.
    let worker: Worker<Value> = Worker::builder(pool(9), q.clone())
        .concurrency(4)
        .poll_interval(Duration::from_millis(20))
        .transactional_handler(InsertRow {
            table: ledger.table.clone(),
            pause_ms: 0,
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(Duration::from_secs(30), "the queue drained", || {
        let (setup, q) = (&setup, &q);
        async move { queue_len(setup, q).await == 0 }
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    let (rows, distinct) = ledger.counts_and_drop().await;
    assert_eq!((rows, distinct), (150, 150), "each row once: {report:?}");
    assert_eq!(report.stats.claims_lost, 0);
}

#[tokio::test]
async fn notifications_on_a_deadpool_pool_need_a_listen_dsn() {
    let setup = client().await;
    let q = unique("dpnl");
    let _queues = Queues::new(&setup, &[&q]).await;
    let worker: Worker<Value> = Worker::builder(pool(4), q.clone())
        .wake_up(WakeUp::Notify)
        .handler(|_msg: Message<Value>| async { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let err = common::start_error(worker).await;
    assert!(err.to_string().contains("listen_dsn"), "{err}");
}
