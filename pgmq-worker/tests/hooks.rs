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
