//! Behind PgBouncer in transaction pooling mode (Debian 12's 1.18, which
//! cannot carry named prepared statements): the client with
//! `prepared_statements(false)` and the worker with LISTEN on a direct DSN.
//! The PgBouncer comes from scripts/pgbouncer-start.sh, which
//! scripts/test.sh runs; its DSN is in PGMQ_PGBOUNCER_DSN. Without it the
//! tests say so and pass, except in CI (CI=true), where they fail.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{dsn, queue_len, unique, wait_for, Queues};
use pgmq_client::{Client, Message};
use pgmq_worker::{Outcome, WakeUp, Worker};
use serde_json::{json, Value};

fn bouncer_dsn() -> Option<String> {
    match std::env::var("PGMQ_PGBOUNCER_DSN") {
        Ok(d) => Some(d),
        Err(_) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("PGMQ_PGBOUNCER_DSN is not set in CI: scripts/test.sh starts PgBouncer")
        }
        Err(_) => {
            eprintln!("skipped: PGMQ_PGBOUNCER_DSN is not set (scripts/pgbouncer-start.sh)");
            None
        }
    }
}

async fn bounced(dsn_via: &str) -> Client {
    Client::builder(dsn_via)
        .prepared_statements(false)
        .listen_dsn(&dsn())
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_works_through_pgbouncer_with_unnamed_statements() {
    let Some(via) = bouncer_dsn() else { return };
    let client = bounced(&via).await;
    let q = unique("bouncer");
    let _g = Queues::new(&client, &[&q]).await;
    let bodies: Vec<Value> = (0..50).map(|n| json!({ "n": n })).collect();
    // Many calls at once over the pool: each may land on another server
    // connection, which named statements would not survive.
    let ids = client.send_batch(&q, &bodies).await.unwrap();
    assert_eq!(ids.len(), 50);
    let mut sends = Vec::new();
    for n in 0..20 {
        let c = client.clone();
        let q = q.clone();
        sends.push(tokio::spawn(
            async move { c.send(&q, &json!({ "n": n })).await },
        ));
    }
    for s in sends {
        s.await.unwrap().unwrap();
    }
    let msgs = client
        .read_raw(&q, Duration::from_secs(30), 100)
        .await
        .unwrap();
    assert_eq!(msgs.len(), 70);
    let receipts: Vec<_> = msgs.iter().filter_map(|m| m.receipt()).collect();
    assert_eq!(client.delete_fenced(&q, &receipts).await.unwrap().len(), 70);
    assert_eq!(queue_len(&client, &q).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_drains_through_pgbouncer_and_listens_directly() {
    let Some(via) = bouncer_dsn() else { return };
    let client = bounced(&via).await;
    let q = unique("bouncerw");
    let dlq = unique("bouncerw_dlq");
    let _g = Queues::new(&client, &[&q, &dlq]).await;
    let bodies: Vec<Value> = (0..300).map(|n| json!({ "n": n })).collect();
    client.send_batch(&q, &bodies).await.unwrap();
    let failures = Arc::new(AtomicU64::new(0));
    let f = Arc::clone(&failures);
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .wake_up(WakeUp::Notify)
        .poll_interval(Duration::from_secs(30))
        .dead_letter_queue(dlq.clone())
        .handler(move |m: Message<Value>| {
            let n = m.body["n"].as_i64().unwrap_or(0);
            let f = Arc::clone(&f);
            async move {
                if n % 50 == 0 {
                    f.fetch_add(1, Ordering::Relaxed);
                    return Ok(Outcome::DeadLetter("n % 50".into()));
                }
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(Duration::from_secs(60), "drained", || async {
        let s = handle.stats();
        s.deleted == 294 && s.dead_lettered == 6
    })
    .await;
    // Idle now, polling every 30 s: a new message arrives through LISTEN on
    // the direct connection.
    let sent = Instant::now();
    client.send(&q, &json!({"n": 1})).await.unwrap();
    wait_for(Duration::from_secs(10), "the notified message", || async {
        handle.stats().deleted == 295
    })
    .await;
    // Well inside the 30 s poll interval: the notification woke it.
    assert!(sent.elapsed() < Duration::from_secs(10));
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.acks_failed, 0);
    assert_eq!(failures.load(Ordering::Relaxed), 6);
    assert_eq!(queue_len(&client, &q).await, 0);
    assert_eq!(queue_len(&client, &dlq).await, 6);
}
