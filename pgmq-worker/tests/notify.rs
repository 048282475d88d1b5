//! LISTEN/NOTIFY wake-ups: with polling every 30 s, a sent message still
//! reaches the handler at once; after the LISTEN connection is killed the
//! notifier reconnects and wake-ups work again.

mod common;

use std::time::{Duration, Instant};

use common::{client, unique, wait_for, Queues};
use pgmq_client::Message;
use pgmq_worker::{Outcome, WakeUp, Worker};
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// Sends one message and returns how long until the handler saw it.
async fn one_wakeup(
    client: &pgmq_client::Client,
    q: &pgmq_client::QueueName,
    seen: &mut mpsc::UnboundedReceiver<Instant>,
) -> Duration {
    let sent = Instant::now();
    client.send(q, &json!({"ping": 1})).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), seen.recv())
        .await
        .expect("no wake-up within 5 s (the poll interval is 30 s)")
        .unwrap();
    got - sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_idle_claimers_and_survives_a_lost_listen_connection() {
    let client = client().await;
    let q = unique("ntf");
    let _g = Queues::new(&client, &[&q]).await;

    let (tx, mut seen) = mpsc::unbounded_channel();
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .wake_up(WakeUp::Notify)
        .poll_interval(Duration::from_secs(30))
        .handler(move |_m: Message<Value>| {
            let _ = tx.send(Instant::now());
            async { Ok::<_, std::io::Error>(Outcome::Delete) }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    // Started: the trigger is on and both claimers have parked after an empty read.
    let h = &handle;
    wait_for(Duration::from_secs(10), "claimers parked", || async {
        h.stats().empty_reads >= 2
    })
    .await;
    let throttles = client.list_notify_insert_throttles().await.unwrap();
    assert!(throttles.iter().any(|t| t.queue_name == q.as_str()));
    // Let the LISTEN connection come up.
    let conn = client.connection().await.unwrap();
    let channel = q.insert_channel();
    let listening = || async {
        let row = conn
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE query = $1",
                &[&format!("LISTEN \"{channel}\"")],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0)
    };
    let started = Instant::now();
    while listening().await == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no LISTEN connection"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let mut latencies = Vec::new();
    for _ in 0..5 {
        latencies.push(one_wakeup(&client, &q, &mut seen).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    latencies.sort();
    println!("notify wake-up latencies: {latencies:?}");
    assert!(latencies[2] < Duration::from_secs(1), "{latencies:?}");

    // Kill the LISTEN connection: the notifier reconnects, wake-ups resume.
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = $1",
        &[&format!("LISTEN \"{channel}\"")],
    )
    .await
    .unwrap();
    let killed = Instant::now();
    while listening().await == 0 {
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "the notifier did not reconnect"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = one_wakeup(&client, &q, &mut seen).await;
    assert!(after < Duration::from_secs(1), "{after:?}");

    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.stats.deleted, 6);
    assert!(
        report.stats.wakeups_notify >= 6,
        "{}",
        report.stats.wakeups_notify
    );
    assert_eq!(report.stats.wakeups_poll, 0);
}
