//! A handler that runs past its visibility timeout: the heartbeat keeps the
//! message invisible (no second delivery); without it, it is redelivered. A
//! heartbeat write still in flight when a handler retries does not undo the
//! retry's delay.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{client, queue_len, unique, wait_for, Queues};
use pgmq_client::Message;
use pgmq_worker::{Outcome, Worker};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};

/// Runs one 5 s handler on a 2 s visibility timeout; returns the read_ct of
/// every delivery the worker saw, and the worker's heartbeat count.
async fn long_job(heartbeat: bool) -> (Vec<i32>, u64) {
    let client = client().await;
    let q = unique(if heartbeat { "hb" } else { "nohb" });
    let _g = Queues::new(&client, &[&q]).await;
    client.send(&q, &json!({"job": "long"})).await.unwrap();

    let deliveries = Arc::new(Mutex::new(Vec::new()));
    let d = Arc::clone(&deliveries);
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(2)
        .visibility_timeout(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(50))
        .heartbeat(heartbeat)
        .handler(move |m: Message<Value>| {
            d.lock().unwrap().push(m.read_ct);
            async move {
                // Only the first delivery is long, so a second one ends soon.
                if m.read_ct == 1 {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    let h = &handle;
    wait_for(Duration::from_secs(20), "the long job done", || async {
        h.stats().handled >= 1 && h.stats().acks_pending == 0
    })
    .await;
    // Give a redelivered copy time to be seen.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(queue_len(&client, &q).await, 0);
    let d = deliveries.lock().unwrap().clone();
    (d, report.stats.heartbeats)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_keeps_a_long_handlers_message_invisible() {
    let (deliveries, heartbeats) = long_job(true).await;
    assert_eq!(deliveries, vec![1], "delivered twice despite the heartbeat");
    // Extended at ~1 s, ~2 s, ~3 s, ~4 s (every half timeout, checked every quarter).
    assert!(heartbeats >= 3, "{heartbeats} heartbeats");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_heartbeat_a_long_handlers_message_is_delivered_again() {
    let (deliveries, heartbeats) = long_job(false).await;
    assert_eq!(heartbeats, 0);
    assert!(deliveries.len() >= 2, "{deliveries:?}");
    assert_eq!(&deliveries[..2], &[1, 2]);
}

/// The race: the heartbeat has collected a running message and its
/// `set_vt` is on the way (here: blocked behind another row of the same
/// batch, which the test holds locked); meanwhile the handler returns
/// `Outcome::Retry(30 s)`. The retry must land after the heartbeat's write,
/// so the message stays invisible for the retry's 30 s, not for one
/// visibility timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_flight_heartbeat_does_not_undo_a_retry_delay() {
    let client = client().await;
    let q = unique("hbrace");
    let _g = Queues::new(&client, &[&q]).await;
    // `hold` first: the lower id, and first in the table, so the heartbeat's
    // batched update reaches it before `retry`.
    let hold_id = client.send(&q, &json!("hold")).await.unwrap();
    let retry_id = client.send(&q, &json!("retry")).await.unwrap();

    let (started_tx, mut started) = mpsc::unbounded_channel();
    let go = Arc::new(Notify::new());
    let done = Arc::new(Notify::new());
    let (g, d) = (Arc::clone(&go), Arc::clone(&done));
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(2)
        .visibility_timeout(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(50))
        .handler(move |m: Message<Value>| {
            let (g, d, started_tx) = (Arc::clone(&g), Arc::clone(&d), started_tx.clone());
            async move {
                let _ = started_tx.send(m.msg_id);
                if m.body == json!("retry") {
                    g.notified().await;
                    Ok(Outcome::Retry(Duration::from_secs(30)))
                } else {
                    d.notified().await;
                    Ok(Outcome::Delete)
                }
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(10), started.recv())
            .await
            .expect("both handlers start")
            .unwrap();
    }

    // Hold `hold`'s row: the heartbeat's next write (at half the timeout)
    // blocks on it. Its visibility is pushed out first, so that it cannot
    // expire (and be claimed again) while the heartbeat is stuck; then
    // `retry`'s (to 10 s, below what the test expects), so that its row
    // version stays after `hold`'s in the table.
    client
        .set_vt(&q, hold_id, Duration::from_secs(60))
        .await
        .unwrap();
    client
        .set_vt(&q, retry_id, Duration::from_secs(10))
        .await
        .unwrap();
    let mut locker = client.connection().await.unwrap();
    let tx = locker.transaction().await.unwrap();
    let select = format!("SELECT 1 FROM {} WHERE msg_id = $1 FOR UPDATE", q.table());
    tx.execute(&select, &[&hold_id]).await.unwrap();
    let pid: i32 = tx
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let observer = client.connection().await.unwrap();
    let waiting = Instant::now();
    loop {
        let blocked: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
                &[&pid],
            )
            .await
            .unwrap()
            .get(0);
        if blocked > 0 {
            break;
        }
        assert!(
            waiting.elapsed() < Duration::from_secs(10),
            "the heartbeat never blocked on the held row"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The scenario needs the heartbeat stuck before `retry`'s row: if it had
    // locked that row already, the retry would simply queue behind it.
    {
        let mut c = client.connection().await.unwrap();
        let probe = c.transaction().await.unwrap();
        let nowait = format!(
            "SELECT 1 FROM {} WHERE msg_id = $1 FOR UPDATE NOWAIT",
            q.table()
        );
        probe
            .execute(&nowait, &[&retry_id])
            .await
            .expect("the heartbeat locked `retry` before `hold`: scenario not reproduced");
        probe.rollback().await.unwrap();
    }

    // The handler retries while the heartbeat's write is in flight.
    go.notify_one();
    tokio::time::sleep(Duration::from_millis(500)).await;
    tx.rollback().await.unwrap();
    let h = &handle;
    wait_for(
        Duration::from_secs(10),
        "the retry and the heartbeat written",
        || async {
            let s = h.stats();
            s.retried == 1 && s.heartbeats >= 1
        },
    )
    .await;
    let left: f64 = observer
        .query_one(
            &format!(
                "SELECT extract(epoch FROM vt - clock_timestamp())::float8 FROM {} WHERE msg_id = $1",
                q.table()
            ),
            &[&retry_id],
        )
        .await
        .unwrap()
        .get(0);
    done.notify_one();
    let report = handle.shutdown().await.unwrap();
    assert!(
        left > 20.0,
        "the retried message is visible again in {left:.1} s, not ~30 s: the heartbeat undid the retry delay"
    );
    assert_eq!(report.stats.deleted, 1);
    assert_eq!(report.stats.claimed, 2);
}
