//! Supervision of the worker's internal tasks, with the `fault-injection`
//! feature's hook that makes one panic once: a claim loop or the heartbeat
//! is restarted and every message is still handled; a completer that panics
//! stops the worker with an error instead of leaving it silently stuck.
#![cfg(feature = "fault-injection")]

mod common;

use std::time::Duration;

use common::{client, queue_len, unique, wait_for, Queues};
use pgmq_client::Message;
use pgmq_worker::{Error, Outcome, Worker};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(20);

async fn restarted_after_a_panic_in(task: &'static str) {
    let client = client().await;
    let q = unique("superv");
    let _g = Queues::new(&client, &[&q]).await;
    let msgs: Vec<Value> = (0..50).map(|n| json!({ "n": n })).collect();
    client.send_batch(&q, &msgs).await.unwrap();
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(20))
        .visibility_timeout(Duration::from_secs(2))
        .panic_once_in(task)
        .handler(|_m: Message<Value>| async { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "every message handled", || async {
        handle.stats().deleted == 50
    })
    .await;
    assert!(handle.health().is_healthy(), "{:?}", handle.health());
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.stats.task_restarts, 1, "{task}");
    assert_eq!(queue_len(&client, &q).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_loop_that_panics_is_restarted() {
    restarted_after_a_panic_in("claim loop").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_that_panics_is_restarted() {
    restarted_after_a_panic_in("heartbeat").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completer_that_panics_stops_the_worker_with_an_error() {
    let client = client().await;
    let q = unique("supervc");
    let _g = Queues::new(&client, &[&q]).await;
    client.send(&q, &json!({"n": 1})).await.unwrap();
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(20))
        .shutdown_grace(Duration::from_secs(1))
        .panic_once_in("completer")
        .handler(|_m: Message<Value>| async { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let monitor = worker.monitor();
    let res = tokio::time::timeout(WAIT, worker.run_until(std::future::pending::<()>()))
        .await
        .expect("the worker stopped on its own");
    match res {
        Err(Error::Task(why)) => assert!(why.contains("completer"), "{why}"),
        other => panic!("expected Error::Task, got {other:?}"),
    }
    let h = monitor.health();
    assert!(!h.running && h.failure.is_some(), "{h:?}");
    // Nothing acknowledged: the message comes back after its timeout.
    assert_eq!(queue_len(&client, &q).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_loop_that_panics_is_restarted_and_its_message_comes_back() {
    // The loop panics while it holds a message (after its handler ran,
    // before the acknowledgement): the loop is restarted, the health says
    // so, and the message is not held for ever (the heartbeat stops
    // extending it; it comes back after its visibility timeout).
    restarted_after_a_panic_in("handler loop").await;
    let client = client().await;
    let q = unique("supervh");
    let _g = Queues::new(&client, &[&q]).await;
    client.send(&q, &json!({"n": 1})).await.unwrap();
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(1)
        .poll_interval(Duration::from_millis(20))
        .visibility_timeout(Duration::from_secs(2))
        .panic_once_in("handler loop")
        .handler(|_m: Message<Value>| async { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "the message handled after the restart", || async {
        handle.stats().deleted == 1
    })
    .await;
    let h = handle.health();
    assert_eq!(h.task_restarts, 1, "{h:?}");
    assert!(
        h.last_restart
            .as_deref()
            .is_some_and(|w| w.contains("handler loop")),
        "{h:?}"
    );
    handle.shutdown().await.unwrap();
    assert_eq!(queue_len(&client, &q).await, 0);
}
