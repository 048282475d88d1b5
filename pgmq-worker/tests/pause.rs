//! Pausing a queue (`Pgmq::pause`) against the real database: what a worker
//! promises once the pause committed.
//!
//! - No claim starts later than one `poll_interval` plus a read of the flag
//!   after the pause committed: checked on the claims' own timestamps (the
//!   database's clock, `last_read_at`), when the claim loops were waiting
//!   for room in a full claim queue at the pause, and when they were waiting
//!   for a grant at a prioritized group's gate.
//! - A paused queue of a prioritized group holds none of the others: they
//!   drain while it is paused, under strict and weighted priorities.
//! - A worker whose role cannot read the pause flag does not start
//!   (`Error::PauseFlagUnreadable`), and one that loses the right while
//!   running stops claiming (`Health::pause_flag_unreadable`) until the
//!   flag is readable again. The role is the test's own (it may create
//!   databases, not roles): it revokes its own right in its database.
//!
//! Each test runs in a database of its own (`common::OwnDatabase`), so that
//! pausing sees this build's `pgmq_sdk` schema whatever the shared
//! database has, and a right revoked there is revoked for nobody else.

mod common;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{queue_len, unique, wait_for, OwnDatabase};
use pgmq_client::{Client, Message, QueueName};
use pgmq_worker::{Outcome, Priority, Worker, WorkerGroup};

/// The poll interval of every worker here.
const POLL: Duration = Duration::from_millis(100);

/// How late after `pause commit + POLL` a claim may still be stamped: the
/// read of the flag, a claim read already in flight, and a loaded machine.
const SLACK: Duration = Duration::from_secs(1);

/// What one queue's handler records.
#[derive(Default)]
struct Record {
    handled: AtomicU64,
    /// The `last_read_at` of every message a handler ran (µs, database clock).
    claims: Mutex<Vec<i64>>,
}

impl Record {
    fn handled(&self) -> u64 {
        self.handled.load(Relaxed)
    }
}

/// A worker on `q` whose handler takes `ms` and records into `rec`.
fn recording(client: &Client, q: &QueueName, ms: u64, rec: &Arc<Record>) -> Worker<u64> {
    let rec = Arc::clone(rec);
    Worker::builder(client.clone(), q.clone())
        .concurrency(4)
        .batch_size(10)
        .poll_interval(POLL)
        .handler(move |m: Message<u64>| {
            let rec = Arc::clone(&rec);
            async move {
                let read_at = m.last_read_at.map_or(0, |t| t.timestamp_micros());
                rec.claims.lock().unwrap().push(read_at);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                rec.handled.fetch_add(1, Relaxed);
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap()
}

async fn fill(client: &Client, q: &QueueName, n: u64) {
    let bodies: Vec<u64> = (0..n).collect();
    for chunk in bodies.chunks(1_000) {
        client.send_batch(q, chunk).await.unwrap();
    }
}

/// The database's clock now, µs since the epoch.
async fn db_now(client: &Client) -> i64 {
    client
        .connection()
        .await
        .unwrap()
        .query_one("SELECT pg_catalog.clock_timestamp()", &[])
        .await
        .unwrap()
        .get::<_, chrono::DateTime<chrono::Utc>>(0)
        .timestamp_micros()
}

/// Pauses `q`; returns a moment (database clock) no earlier than the
/// pause's commit.
async fn pause(client: &Client, q: &QueueName) -> i64 {
    assert!(client.pause(q, Some("test")).await.unwrap());
    db_now(client).await
}

/// The latest claim of `q` (µs, database clock): among those its handlers
/// ran (`rec`) and those still in the queue table (claimed, not yet
/// acknowledged).
async fn latest_claim(client: &Client, q: &QueueName, rec: &Record) -> i64 {
    let in_table: Option<chrono::DateTime<chrono::Utc>> = client
        .connection()
        .await
        .unwrap()
        .query_one(
            &format!("SELECT max(last_read_at) FROM {}", q.quoted_table()),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let ran = rec.claims.lock().unwrap().iter().copied().max();
    in_table
        .map(|t| t.timestamp_micros())
        .into_iter()
        .chain(ran)
        .max()
        .unwrap_or(0)
}

/// No claim of `q` later than `since` (when `what` committed) + [`POLL`]
/// + [`SLACK`].
async fn assert_no_claim_after(
    client: &Client,
    q: &QueueName,
    rec: &Record,
    since: i64,
    what: &str,
) {
    let latest = latest_claim(client, q, rec).await;
    let late_ms = (latest - since) as f64 / 1e3;
    if latest == 0 {
        eprintln!("{q}: no claim");
    } else {
        eprintln!("{q}: latest claim {late_ms:.0} ms after {what} committed");
    }
    let bound = (POLL + SLACK).as_micros() as i64;
    assert!(
        latest <= since + bound,
        "{q}: claimed {late_ms:.0} ms after {what} committed (promise: {} ms + {} ms slack)",
        POLL.as_millis(),
        SLACK.as_millis()
    );
}

/// With a backlog on both queues, one of them paused: the other drains
/// while it is paused, the paused one claims nothing from a poll interval
/// after the pause, and drains once resumed.
async fn paused_queue_holds_nothing(policy: Priority, pause_high: bool) {
    const N: u64 = 400;
    let db = OwnDatabase::create("wpz_prio").await;
    let client = db.client(12).await;
    let qs = [unique("pz_hi"), unique("pz_lo")];
    for q in &qs {
        client.create(q).await.unwrap();
        fill(&client, q, N).await;
    }
    let recs: Vec<Arc<Record>> = (0..2).map(|_| Arc::default()).collect();
    let high = recording(&client, &qs[0], 5, &recs[0]);
    let low = recording(&client, &qs[1], 5, &recs[1]);
    let group = WorkerGroup::new(client.clone())
        .priority(policy.clone().concurrency(4))
        .with_worker_priority(high, 3)
        .with_worker_priority(low, 1);
    let monitors = group.monitors();
    let stop = group.shutdown_handle();
    let running = tokio::spawn(group.run_until(std::future::pending::<()>()));
    wait_for(Duration::from_secs(30), "some messages handled", || async {
        recs.iter().map(|r| r.handled()).sum::<u64>() >= 20
    })
    .await;
    let (p, o) = if pause_high { (0, 1) } else { (1, 0) };
    let paused_at = pause(&client, &qs[p]).await;
    wait_for(Duration::from_secs(10), "health to say paused", || async {
        monitors[p].1.health().paused
    })
    .await;
    let before = recs[o].handled();
    // The other queue drains while this one is paused.
    let drained = tokio::time::timeout(Duration::from_secs(20), async {
        while recs[o].handled() < N {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let after = recs[o].handled();
    assert!(
        drained.is_ok(),
        "{policy:?}, {} queue paused: the other handled {} in 20 s (from {before} to {after} of {N})",
        if pause_high { "high" } else { "low" },
        after - before
    );
    assert_no_claim_after(&client, &qs[p], &recs[p], paused_at, "the pause").await;
    assert!(client.resume(&qs[p]).await.unwrap());
    wait_for(
        Duration::from_secs(60),
        "the resumed queue drained",
        || async { recs[p].handled() == N },
    )
    .await;
    stop.graceful();
    running.await.unwrap().unwrap();
    for q in &qs {
        assert_eq!(queue_len(&client, q).await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_high_paused_leaves_the_low_queue_running() {
    paused_queue_holds_nothing(Priority::strict(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_low_paused_leaves_the_high_queue_running() {
    paused_queue_holds_nothing(Priority::strict(), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_high_paused_leaves_the_low_queue_running() {
    paused_queue_holds_nothing(Priority::weighted(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_low_paused_leaves_the_high_queue_running() {
    paused_queue_holds_nothing(Priority::weighted(), false).await;
}

/// The claim loops wait for room in a full claim queue when the pause
/// commits (one handler of 2 s, a claim queue of one message): the room
/// that frees when the handler takes the next message starts no claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_claim_after_the_pause_from_a_full_claim_queue() {
    let db = OwnDatabase::create("wpz_full").await;
    let client = db.client(8).await;
    let q = unique("pz_full");
    client.create(&q).await.unwrap();
    fill(&client, &q, 8).await;
    let rec = Arc::new(Record::default());
    let starts = Arc::new(AtomicU64::new(0));
    let worker: Worker<u64> = {
        let (rec, starts) = (Arc::clone(&rec), Arc::clone(&starts));
        Worker::builder(client.clone(), q.clone())
            .concurrency(1)
            .batch_size(1)
            .claim_capacity(1)
            .poll_interval(POLL)
            .handler(move |m: Message<u64>| {
                let (rec, starts) = (Arc::clone(&rec), Arc::clone(&starts));
                async move {
                    let read_at = m.last_read_at.map_or(0, |t| t.timestamp_micros());
                    rec.claims.lock().unwrap().push(read_at);
                    starts.fetch_add(1, Relaxed);
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    rec.handled.fetch_add(1, Relaxed);
                    Ok(Outcome::Delete)
                }
            })
            .build()
            .unwrap()
    };
    let handle = worker.spawn();
    // The second run starts: the claim queue holds the third message, and
    // a claim loop waits for room.
    wait_for(Duration::from_secs(30), "the second run", || async {
        starts.load(Relaxed) >= 2
    })
    .await;
    let paused_at = pause(&client, &q).await;
    wait_for(Duration::from_secs(10), "health to say paused", || async {
        handle.health().paused
    })
    .await;
    // The next run starts about 2 s after the pause, freeing room.
    wait_for(Duration::from_secs(30), "the next run", || async {
        starts.load(Relaxed) >= 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_no_claim_after(&client, &q, &rec, paused_at, "the pause").await;
    handle.shutdown_now().await.unwrap();
}

/// The low queue of a strict group waits at the gate while the high one
/// has a backlog; it is paused meanwhile. Once the high queue drains, the
/// grant it would have got starts no claim; once resumed, it drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_claim_after_the_pause_from_a_priority_gate() {
    let db = OwnDatabase::create("wpz_gate").await;
    let client = db.client(12).await;
    let qs = [unique("pz_ghi"), unique("pz_glo")];
    for q in &qs {
        client.create(q).await.unwrap();
    }
    fill(&client, &qs[0], 12).await;
    fill(&client, &qs[1], 20).await;
    let recs: Vec<Arc<Record>> = (0..2).map(|_| Arc::default()).collect();
    let high = recording(&client, &qs[0], 250, &recs[0]);
    let low = recording(&client, &qs[1], 5, &recs[1]);
    let group = WorkerGroup::new(client.clone())
        .priority(Priority::strict().concurrency(1))
        .with_worker_priority(high, 2)
        .with_worker_priority(low, 1);
    let monitors = group.monitors();
    let stop = group.shutdown_handle();
    let running = tokio::spawn(group.run_until(std::future::pending::<()>()));
    wait_for(
        Duration::from_secs(30),
        "the high queue's first run",
        || async { !recs[0].claims.lock().unwrap().is_empty() },
    )
    .await;
    let paused_at = pause(&client, &qs[1]).await;
    wait_for(Duration::from_secs(10), "health to say paused", || async {
        monitors[1].1.health().paused
    })
    .await;
    wait_for(
        Duration::from_secs(60),
        "the high queue drained",
        || async { recs[0].handled() == 12 },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_no_claim_after(&client, &qs[1], &recs[1], paused_at, "the pause").await;
    assert!(client.resume(&qs[1]).await.unwrap());
    wait_for(Duration::from_secs(60), "the low queue drained", || async {
        recs[1].handled() == 20
    })
    .await;
    stop.graceful();
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_cannot_read_the_pause_flag_does_not_start() {
    let db = OwnDatabase::create("wpz_start").await;
    let client = db.client(8).await;
    let q = QueueName::new("pz_noright").unwrap();
    client.create(&q).await.unwrap();
    fill(&client, &q, 5).await;
    // Without SELECT on the flag's table, then without USAGE on its schema.
    for (revoke, grant) in [
        (
            "REVOKE ALL ON pgmq_sdk.paused FROM PUBLIC, CURRENT_USER",
            "GRANT ALL ON pgmq_sdk.paused TO CURRENT_USER; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON pgmq_sdk.paused TO PUBLIC",
        ),
        (
            "REVOKE USAGE ON SCHEMA pgmq_sdk FROM PUBLIC, CURRENT_USER",
            "GRANT USAGE ON SCHEMA pgmq_sdk TO PUBLIC, CURRENT_USER",
        ),
    ] {
        db.execute(revoke).await;
        let worker: Worker<u64> = Worker::builder(client.clone(), q.clone())
            .poll_interval(POLL)
            .handler(|_m: Message<u64>| async move { Ok(Outcome::Delete) })
            .build()
            .unwrap();
        let err = tokio::time::timeout(Duration::from_secs(15), common::start_error(worker))
            .await
            .expect("the worker refused to start within 15 s");
        eprintln!("{revoke}: {err}");
        assert!(
            matches!(err, pgmq_worker::Error::PauseFlagUnreadable { .. }),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("GRANT") && text.contains("install-sdk"),
            "{text}"
        );
        db.execute(grant).await;
        assert_eq!(queue_len(&client, &q).await, 5, "nothing claimed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_loses_the_right_to_read_the_pause_flag_stops_claiming() {
    const N: u64 = 300;
    let db = OwnDatabase::create("wpz_lost").await;
    let client = db.client(8).await;
    let q = QueueName::new("pz_lost").unwrap();
    client.create(&q).await.unwrap();
    fill(&client, &q, N).await;
    let rec = Arc::new(Record::default());
    let worker = {
        let rec = Arc::clone(&rec);
        Worker::builder(client.clone(), q.clone())
            .concurrency(2)
            .batch_size(5)
            .poll_interval(POLL)
            .handler(move |m: Message<u64>| {
                let rec = Arc::clone(&rec);
                async move {
                    let read_at = m.last_read_at.map_or(0, |t| t.timestamp_micros());
                    rec.claims.lock().unwrap().push(read_at);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    rec.handled.fetch_add(1, Relaxed);
                    Ok(Outcome::Delete)
                }
            })
            .build()
            .unwrap()
    };
    let handle = worker.spawn();
    wait_for(Duration::from_secs(30), "some messages handled", || async {
        rec.handled() >= 20
    })
    .await;
    db.execute("REVOKE ALL ON pgmq_sdk.paused FROM PUBLIC, CURRENT_USER")
        .await;
    let revoked_at = db_now(&client).await;
    wait_for(Duration::from_secs(10), "health to say so", || async {
        handle.health().pause_flag_unreadable
    })
    .await;
    assert!(!handle.health().is_healthy());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_no_claim_after(&client, &q, &rec, revoked_at, "the revoke").await;
    assert!(
        queue_len(&client, &q).await > 0,
        "drained before the revoke"
    );
    db.execute(
        "GRANT ALL ON pgmq_sdk.paused TO CURRENT_USER; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON pgmq_sdk.paused TO PUBLIC",
    )
    .await;
    wait_for(Duration::from_secs(60), "the queue drained", || async {
        rec.handled() == N
    })
    .await;
    let h = handle.health();
    assert!(!h.pause_flag_unreadable && h.is_healthy(), "{h:?}");
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.handled, N);
}

/// Reads of the pause flag that hang (its table locked) hold the claims:
/// no claim read starts later than one poll interval and the grace after
/// the last read of the flag that succeeded, so none later than that after
/// the lock was taken; the claims go on once the lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_reads_of_the_pause_flag_hang_stops_claiming() {
    const N: u64 = 1_000;
    /// What the worker allows past a poll interval after its last good
    /// read of the flag (pgmq-worker's grace).
    const GRACE: Duration = Duration::from_secs(1);
    let db = OwnDatabase::create("wpz_hang").await;
    let client = db.client(8).await;
    let q = QueueName::new("pz_hang").unwrap();
    client.create(&q).await.unwrap();
    fill(&client, &q, N).await;
    let rec = Arc::new(Record::default());
    let handle = recording(&client, &q, 20, &rec).spawn();
    wait_for(Duration::from_secs(30), "some messages handled", || async {
        rec.handled() >= 20
    })
    .await;
    let locker = client.connection().await.unwrap();
    locker
        .batch_execute("BEGIN; LOCK TABLE pgmq_sdk.paused IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let locked_at = db_now(&client).await;
    tokio::time::sleep(POLL + GRACE + Duration::from_millis(2_000)).await;
    let since = locked_at + GRACE.as_micros() as i64;
    assert_no_claim_after(&client, &q, &rec, since, "the lock (plus the grace)").await;
    assert!(queue_len(&client, &q).await > 0, "drained before the lock");
    locker.batch_execute("COMMIT").await.unwrap();
    wait_for(Duration::from_secs(60), "the queue drained", || async {
        rec.handled() == N
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.handled, N);
}
