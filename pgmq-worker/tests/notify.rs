//! LISTEN/NOTIFY wake-ups: with polling every 30 s, a sent message still
//! reaches the handler at once; after the LISTEN connection is killed the
//! notifier reconnects and wake-ups work again. PGMQ's throttle: the worker's
//! default, an existing trigger's throttle kept unless one is given, and a
//! message sent inside a throttle window found after the window, not after
//! the poll interval.

mod common;

use std::time::{Duration, Instant};

use common::{client, unique, wait_for, Queues};
use pgmq_client::{Client, Message, QueueName};
use pgmq_worker::{Outcome, WakeUp, Worker, WorkerHandle};
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

/// Backends LISTENing on the queue's insert channel.
async fn listening(conn: &tokio_postgres::Client, q: &QueueName) -> i64 {
    let row = conn
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE query = $1",
            &[&format!("LISTEN \"{}\"", q.insert_channel())],
        )
        .await
        .unwrap();
    row.get(0)
}

/// Waits until the worker's claimers parked after an empty read and its
/// LISTEN connection is up.
async fn wait_idle_and_listening(client: &Client, q: &QueueName, handle: &WorkerHandle) {
    wait_for(Duration::from_secs(10), "claimers parked", || async {
        handle.stats().empty_reads >= 2
    })
    .await;
    let conn = client.connection().await.unwrap();
    wait_for(Duration::from_secs(10), "a LISTEN connection", || async {
        listening(&conn, q).await > 0
    })
    .await;
}

/// The throttle of the queue's insert trigger, if it has one.
async fn throttle_of(client: &Client, q: &QueueName) -> Option<i32> {
    let list = client.list_notify_insert_throttles().await.unwrap();
    list.iter()
        .find(|t| t.queue_name == q.as_str())
        .map(|t| t.throttle_interval_ms)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_idle_claimers_and_survives_a_lost_listen_connection() {
    let client = client().await;
    let q = unique("ntf");
    let _g = Queues::new(&client, &[&q]).await;

    let (tx, mut seen) = mpsc::unbounded_channel();
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .wake_up(WakeUp::Notify)
        // A notification for every insert: this test counts them.
        .notify_throttle(Duration::ZERO)
        .poll_interval(Duration::from_secs(30))
        .handler(move |_m: Message<Value>| {
            let _ = tx.send(Instant::now());
            async { Ok(Outcome::Delete) }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    // Started: the trigger is on, both claimers have parked after an empty
    // read, and the LISTEN connection is up.
    wait_idle_and_listening(&client, &q, &handle).await;
    assert_eq!(throttle_of(&client, &q).await, Some(0));
    let conn = client.connection().await.unwrap();
    let channel = q.insert_channel();

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
    while listening(&conn, &q).await == 0 {
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "the notifier did not reconnect"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Wake-ups resumed: the message reaches the handler within the
    // notification path's time, not the 30 s poll interval.
    let after = one_wakeup(&client, &q, &mut seen).await;
    assert!(after < Duration::from_secs(1), "{after:?}");

    // Every message was handled. How many notifications were counted
    // depends on timing (a read can take a message before its notification
    // is processed), so it is not asserted.
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.stats.deleted, 6);
    assert_eq!(report.acks_failed, 0);
}

/// Starts a notified worker on `q` (deleting what it handles), optionally
/// with an explicit throttle, and returns it once idle and listening.
async fn start_notified(
    client: &Client,
    q: &QueueName,
    throttle: Option<Duration>,
    poll: Duration,
    seen: mpsc::UnboundedSender<(Value, Instant)>,
) -> WorkerHandle {
    let mut builder = Worker::<Value>::builder(client.clone(), q.clone())
        .wake_up(WakeUp::Notify)
        .poll_interval(poll)
        .handler(move |m: Message<Value>| {
            let _ = seen.send((m.body, Instant::now()));
            async { Ok(Outcome::Delete) }
        });
    if let Some(t) = throttle {
        builder = builder.notify_throttle(t);
    }
    let handle = builder.build().unwrap().spawn();
    wait_idle_and_listening(client, q, &handle).await;
    handle
}

/// Without an explicit throttle the worker enables the trigger with PGMQ's
/// default (250 ms) and leaves an existing trigger's throttle alone; with
/// one, it sets it on an existing trigger too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_throttle_default_and_existing_triggers() {
    let client = client().await;
    let fresh = unique("thrd");
    let preset = unique("thrp");
    let _g = Queues::new(&client, &[&fresh, &preset]).await;
    let (tx, _seen) = mpsc::unbounded_channel();
    let poll = Duration::from_secs(30);

    let h = start_notified(&client, &fresh, None, poll, tx.clone()).await;
    assert_eq!(throttle_of(&client, &fresh).await, Some(250));
    h.shutdown().await.unwrap();

    client
        .enable_notify_insert(&preset, Duration::from_millis(1000))
        .await
        .unwrap();
    let h = start_notified(&client, &preset, None, poll, tx.clone()).await;
    assert_eq!(
        throttle_of(&client, &preset).await,
        Some(1000),
        "the operator's throttle was overridden"
    );
    h.shutdown().await.unwrap();

    let h = start_notified(&client, &preset, Some(Duration::from_millis(40)), poll, tx).await;
    assert_eq!(throttle_of(&client, &preset).await, Some(40));
    h.shutdown().await.unwrap();
}

/// A message sent inside PGMQ's throttle window gets no notification of its
/// own; the worker reads again when the window closes, so it is handled
/// about one throttle after the notification, not after the 5 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_inside_the_throttle_window_is_found_after_the_window() {
    let client = client().await;
    let q = unique("thrw");
    let _g = Queues::new(&client, &[&q]).await;
    let (tx, mut seen) = mpsc::unbounded_channel();
    let throttle = Duration::from_millis(300);
    let handle = start_notified(&client, &q, Some(throttle), Duration::from_secs(5), tx).await;

    client.send(&q, &json!("a")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let sent_b = Instant::now();
    client.send(&q, &json!("b")).await.unwrap();
    let mut latency_b = None;
    while latency_b.is_none() {
        let (body, at) = tokio::time::timeout(Duration::from_secs(10), seen.recv())
            .await
            .expect("a message was not handled within 10 s")
            .unwrap();
        if body == json!("b") {
            latency_b = Some(at - sent_b);
        }
    }
    let latency_b = latency_b.unwrap();
    println!("message inside the throttle window handled after {latency_b:?}");
    let report = handle.shutdown().await.unwrap();
    assert!(latency_b < Duration::from_secs(1), "{latency_b:?}");
    assert!(
        report.stats.wakeups_after_throttle >= 1,
        "{:?}",
        report.stats
    );
    assert_eq!(report.stats.deleted, 2);
}
