//! Hooks around handler calls: composed in order, `after` in reverse, and a
//! refusing `before` stops the call and fails the run.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{client, unique, wait_for, Queues};
use pgmq_client::Message;
use pgmq_worker::{Context, HandlerError, Hook, Outcome, Worker};
use serde_json::{json, Value};

struct Recorder {
    name: &'static str,
    log: Arc<Mutex<Vec<String>>>,
    refuse_n: Option<i64>,
}

impl Hook for Recorder {
    fn before(&self, ctx: &Context, _headers: Option<&Value>) -> Result<(), HandlerError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("{} before {}", self.name, ctx.msg_id()));
        if self.refuse_n == Some(ctx.msg_id()) {
            return Err("refused by policy".into());
        }
        Ok(())
    }

    fn after(&self, ctx: &Context, result: &Result<Outcome, String>, _took: Duration) {
        let what = match result {
            Ok(o) => format!("{o:?}"),
            Err(e) => format!("error {e}"),
        };
        self.log
            .lock()
            .unwrap()
            .push(format!("{} after {} {what}", self.name, ctx.msg_id()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_compose_in_order_and_a_refusal_fails_the_run() {
    let client = client().await;
    let q = unique("hooks");
    let dlq = unique("hooks_dlq");
    let _g = Queues::new(&client, &[&q, &dlq]).await;
    let ok_id = client.send(&q, &json!({"n": 1})).await.unwrap();
    let refused_id = client.send(&q, &json!({"n": 2})).await.unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let ran = Arc::new(Mutex::new(Vec::new()));
    let r = Arc::clone(&ran);
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(1)
        .poll_interval(Duration::from_millis(20))
        .max_attempts(1)
        .dead_letter_queue(dlq.clone())
        .hook(Recorder {
            name: "outer",
            log: Arc::clone(&log),
            refuse_n: None,
        })
        .hook(Recorder {
            name: "inner",
            log: Arc::clone(&log),
            refuse_n: Some(refused_id),
        })
        .handler(move |m: Message<Value>| {
            r.lock().unwrap().push(m.msg_id);
            async { Ok(Outcome::Delete) }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(Duration::from_secs(20), "both settled", || async {
        let s = handle.stats();
        s.deleted == 1 && s.dead_lettered == 1
    })
    .await;
    handle.shutdown().await.unwrap();
    assert_eq!(
        *ran.lock().unwrap(),
        vec![ok_id],
        "the refused handler did not run"
    );
    let log = log.lock().unwrap().clone();
    let of = |id: i64| -> Vec<String> {
        log.iter()
            .filter(|l| l.split(' ').nth(2) == Some(&id.to_string()))
            .cloned()
            .collect()
    };
    assert_eq!(
        of(ok_id),
        vec![
            format!("outer before {ok_id}"),
            format!("inner before {ok_id}"),
            format!("inner after {ok_id} Delete"),
            format!("outer after {ok_id} Delete"),
        ]
    );
    assert_eq!(
        of(refused_id),
        vec![
            format!("outer before {refused_id}"),
            format!("inner before {refused_id}"),
            format!("inner after {refused_id} error refused by policy"),
            format!("outer after {refused_id} error refused by policy"),
        ]
    );
    let dead = client
        .read_raw(&dlq, Duration::from_secs(30), 5)
        .await
        .unwrap();
    let reason = dead[0].headers.as_ref().unwrap()["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.contains("refused by policy"), "{reason}");
}

/// A hook whose `before` or `after` panics the first time it runs.
struct PanicsOnce {
    in_before: bool,
    fired: std::sync::atomic::AtomicBool,
}

impl PanicsOnce {
    fn fire(&self) {
        if !self.fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
            panic!("hook bug");
        }
    }
}

impl Hook for PanicsOnce {
    fn before(&self, _ctx: &Context, _headers: Option<&Value>) -> Result<(), HandlerError> {
        if self.in_before {
            self.fire();
        }
        Ok(())
    }

    fn after(&self, _ctx: &Context, _result: &Result<Outcome, String>, _took: Duration) {
        if !self.in_before {
            self.fire();
        }
    }
}

/// Concurrency 2, a hook that panics once, 3 messages, visibility timeout
/// 2 s: every message is handled and deleted within a bound, none is held,
/// none dead-lettered, and the panic counts as a failed attempt.
async fn a_panicking_hook_neither_stops_a_loop_nor_holds_a_message(in_before: bool) {
    let client = client().await;
    let q = unique("hookp");
    let dlq = unique("hookp_dlq");
    let _g = Queues::new(&client, &[&q, &dlq]).await;
    for n in 0..3 {
        client.send(&q, &json!({ "n": n })).await.unwrap();
    }
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(2)
        .visibility_timeout(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(20))
        .retry_backoff(pgmq_worker::Backoff::constant(Duration::from_millis(100)))
        .dead_letter_queue(dlq.clone())
        .hook(PanicsOnce {
            in_before,
            fired: Default::default(),
        })
        .handler(|_m: Message<Value>| async { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(Duration::from_secs(20), "every message deleted", || async {
        common::queue_len(&client, &q).await == 0
    })
    .await;
    let s = handle.shutdown().await.unwrap().stats;
    assert_eq!(
        (s.deleted, s.panicked, s.retried, s.task_restarts),
        (3, 1, 1, 0),
        "3 deleted, the panic a failed attempt, retried once, no loop restarted"
    );
    assert_eq!(common::queue_len(&client, &dlq).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_after_hook_is_a_failed_attempt_and_the_loop_goes_on() {
    a_panicking_hook_neither_stops_a_loop_nor_holds_a_message(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_before_hook_is_a_failed_attempt_and_the_loop_goes_on() {
    a_panicking_hook_neither_stops_a_loop_nor_holds_a_message(true).await;
}

/// A body type whose `Deserialize` panics on `{"boom": true}`.
struct Fragile;

impl<'de> serde::Deserialize<'de> for Fragile {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        if v.get("boom") == Some(&Value::Bool(true)) {
            panic!("deserialize bug");
        }
        Ok(Fragile)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_deserialize_is_a_failed_attempt_and_the_loops_go_on() {
    // The panicking message uses its attempts and is dead-lettered; the
    // loops survive it and handle the others.
    let client = client().await;
    let q = unique("hookd");
    let dlq = unique("hookd_dlq");
    let _g = Queues::new(&client, &[&q, &dlq]).await;
    client.send(&q, &json!({"boom": true})).await.unwrap();
    let worker: Worker<Fragile> = Worker::builder(client.clone(), q.clone())
        .concurrency(2)
        .visibility_timeout(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(20))
        .max_attempts(3)
        .retry_backoff(pgmq_worker::Backoff::constant(Duration::from_millis(100)))
        .dead_letter_queue(dlq.clone())
        .handler(|_m: Message<Fragile>| async { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(
        Duration::from_secs(20),
        "the panicking message dead-lettered",
        || async { handle.stats().dead_lettered == 1 },
    )
    .await;
    // Both loops still run: two more messages are handled.
    for n in 0..2 {
        client.send(&q, &json!({ "n": n })).await.unwrap();
    }
    wait_for(Duration::from_secs(20), "the others deleted", || async {
        handle.stats().deleted == 2
    })
    .await;
    let s = handle.shutdown().await.unwrap().stats;
    assert_eq!(s.panicked, 3, "one per attempt");
    assert_eq!(common::queue_len(&client, &q).await, 0);
    let conn = client.connection().await.unwrap();
    let row = conn
        .query_one(
            &format!("SELECT headers::text FROM {}", dlq.quoted_table()),
            &[],
        )
        .await
        .unwrap();
    let headers: String = row.get(0);
    assert!(headers.contains("Deserialize panicked"), "{headers}");
}
