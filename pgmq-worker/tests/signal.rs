#![cfg(unix)]
//! `run_until_signal`: the first SIGTERM starts the graceful shutdown, a
//! second one cuts it short. The test sends SIGTERM to its own process,
//! which is safe only because `run_until_signal` has installed its handlers
//! by then (a handler is running, which happens after they are installed)
//! and this binary holds no other test.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{client, unique, Queues};
use pgmq_client::Message;
use pgmq_worker::{Outcome, Worker};
use serde_json::{json, Value};
use tokio::sync::Notify;

/// Sends SIGTERM to this process.
async fn sigterm_self() {
    let status = tokio::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .await
        .expect("kill runs");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_stops_at_once() {
    let client = client().await;
    let q = unique("signal");
    let _g = Queues::new(&client, &[&q]).await;
    let hang = client.send(&q, &json!({"hang": true})).await.unwrap();
    let started = Arc::new(Notify::new());
    let s = Arc::clone(&started);
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(20))
        .shutdown_grace(Duration::from_secs(30))
        .handler(move |_m: Message<Value>| {
            let s = Arc::clone(&s);
            async move {
                s.notify_one();
                std::future::pending::<()>().await;
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap();
    let stop = worker.shutdown_handle();
    let running = tokio::spawn(worker.run_until_signal());
    started.notified().await;

    // The first signal: a graceful shutdown, waiting for the handler.
    sigterm_self().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !stop.is_requested() {
        assert!(Instant::now() < deadline, "the first SIGTERM was not seen");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!running.is_finished());
    assert!(!stop.is_immediate());

    // The second: at once.
    let t = Instant::now();
    sigterm_self().await;
    let report = running.await.unwrap().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "returned {:?} after the second signal",
        t.elapsed()
    );
    assert!(report.immediate);
    assert_eq!(report.abandoned, [hang]);
    // Still claimed: it comes back after its visibility timeout.
    let m = client.metrics(&q).await.unwrap();
    assert_eq!((m.queue_length, m.queue_visible_length), (1, 0));
}
