//! The scheduler of periodic sends against the real database: several
//! schedulers at once (two on their own, one inside a worker that consumes
//! the target queue, each on a pool of its own) send each tick of a
//! schedule exactly once, lose none, and send nothing while it is paused.
//!
//! The test runs in a database of its own (`common::OwnDatabase`): a
//! scheduler fires every schedule it may, so no other test's schedules
//! are in its way.

mod common;

use std::time::Duration;

use chrono::{DateTime, Utc};
use common::OwnDatabase;
use pgmq_client::{Cadence, Message, QueueName, Schedule, TICK_HEADER};
use pgmq_worker::{Outcome, Scheduler, SchedulerConfig, Worker};
use tokio_util::sync::CancellationToken;

const STEP_MS: i64 = 200;

/// The tick of every message the schedule sent: handled (archived) or
/// still in the queue.
async fn sent_ticks(db: &OwnDatabase, q: &QueueName) -> Vec<DateTime<Utc>> {
    let c = db.client(1).await;
    let conn = c.connection().await.unwrap();
    let sql = format!(
        "SELECT headers->>'{TICK_HEADER}' FROM pgmq.q_{q} UNION ALL \
         SELECT headers->>'{TICK_HEADER}' FROM pgmq.a_{q}",
        q = q.as_str()
    );
    let mut ticks: Vec<DateTime<Utc>> = conn
        .client()
        .query(&sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| {
            DateTime::parse_from_rfc3339(&r.get::<_, String>(0))
                .unwrap()
                .with_timezone(&Utc)
        })
        .collect();
    let n = ticks.len();
    ticks.sort();
    ticks.dedup();
    assert_eq!(ticks.len(), n, "a tick was sent twice");
    ticks
}

#[tokio::test]
async fn schedulers_in_and_beside_workers_send_each_tick_once() {
    let db = OwnDatabase::create("wsched").await;
    let client = db.client(4).await;
    let q = QueueName::new("ticks").unwrap();
    client.create(&q).await.unwrap();
    let cadence = Cadence::every(Duration::from_millis(STEP_MS as u64)).unwrap();
    let schedule = Schedule::new("every-200ms", q.clone(), cadence)
        .unwrap()
        .message(serde_json::json!({"kind": "tick"}));
    assert!(client.put_schedule(&schedule).await.unwrap());

    let cfg = SchedulerConfig::default().poll_interval(Duration::from_millis(50));
    let stop = CancellationToken::new();
    let mut alone = Vec::new();
    for _ in 0..2 {
        let s = Scheduler::new(db.client(2).await, cfg.clone());
        alone.push(tokio::spawn(s.run(stop.clone())));
    }
    let worker = Worker::<serde_json::Value>::builder(db.client(6).await, q.clone())
        .poll_interval(Duration::from_millis(50))
        .scheduler(cfg.clone())
        .handler(|_m: Message<serde_json::Value>| async move { Ok(Outcome::Archive) })
        .build()
        .unwrap()
        .spawn();

    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(client.pause_schedule("every-200ms").await.unwrap());
    let paused_at = DateTime::<Utc>::from(std::time::SystemTime::now());
    // Nothing is sent while paused, however long the schedulers run.
    tokio::time::sleep(Duration::from_millis(600)).await;
    stop.cancel();
    for t in alone {
        t.await.unwrap();
    }
    worker.shutdown().await.unwrap();

    let ticks = sent_ticks(&db, &q).await;
    assert!(ticks.len() >= 8, "too few ticks: {ticks:?}");
    for w in ticks.windows(2) {
        assert_eq!(
            (w[1] - w[0]).num_milliseconds(),
            STEP_MS,
            "a tick lost: {ticks:?}"
        );
    }
    let last = *ticks.last().unwrap();
    assert!(
        last <= paused_at + chrono::Duration::milliseconds(100),
        "sent after the pause: {last} (paused by {paused_at})"
    );
    let info = client.schedules().await.unwrap();
    assert_eq!(info[0].sent, ticks.len() as i64);
}
