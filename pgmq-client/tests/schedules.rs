//! Periodic sends against the real database: schedules created, listed,
//! paused, resumed and removed; several runners at once sending each tick
//! once; a paused schedule sending nothing; the catch-up bound after a
//! gap; a firing rolled back (a crash before its commit) sending the tick
//! later, and a stale firing sending nothing.
//!
//! A runner fires every due schedule it may see, so each test has a
//! database of its own: no test's runner fires another test's schedule.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use pgmq_client::{Cadence, Client, Error, Pgmq, QueueName, Schedule, TICK_HEADER};
use serde_json::json;

use common::OwnDb;

/// The tick of each message of the fixture's queue, by message id.
async fn ticks(f: &Fixture) -> Vec<DateTime<Utc>> {
    let q = &f.q;
    let rows = common::raw_to(&f.db.dsn())
        .await
        .query(
            &format!(
                "SELECT headers->>'{TICK_HEADER}' FROM pgmq.q_{} ORDER BY msg_id",
                q.as_str()
            ),
            &[],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| {
            DateTime::parse_from_rfc3339(&r.get::<_, String>(0))
                .unwrap()
                .with_utc()
        })
        .collect()
}

trait WithUtc {
    fn with_utc(self) -> DateTime<Utc>;
}

impl WithUtc for DateTime<chrono::FixedOffset> {
    fn with_utc(self) -> DateTime<Utc> {
        self.with_timezone(&Utc)
    }
}

/// A database of its own with a queue and a schedule on it, dropped at
/// the end.
struct Fixture {
    client: Client,
    q: QueueName,
    name: String,
    db: OwnDb,
}

async fn fixture(prefix: &str, cadence: Cadence, catch_up: u32) -> Fixture {
    let db = OwnDb::new(prefix).await;
    let client = db.client().await;
    client.install_sdk_schema().await.unwrap();
    let q = QueueName::new(prefix).unwrap();
    client.create(&q).await.unwrap();
    let name = format!("{prefix}-schedule");
    let s = Schedule::new(&name, q.clone(), cadence)
        .unwrap()
        .catch_up(catch_up);
    assert!(client.put_schedule(&s).await.unwrap());
    Fixture {
        client,
        q,
        name,
        db,
    }
}

fn every(ms: u64) -> Cadence {
    Cadence::every(Duration::from_millis(ms)).unwrap()
}

/// Asserts that `ticks` are distinct, in order, and `step` apart.
fn assert_one_per_tick(ticks: &[DateTime<Utc>], step: chrono::Duration) {
    let distinct: HashSet<_> = ticks.iter().collect();
    assert_eq!(distinct.len(), ticks.len(), "a tick sent twice: {ticks:?}");
    for w in ticks.windows(2) {
        assert_eq!(w[1] - w[0], step, "a tick lost or out of order: {ticks:?}");
    }
}

#[tokio::test]
async fn schedules_are_created_listed_paused_resumed_and_removed() {
    let f = fixture("sched_crud", every(1000), 0).await;
    let (client, q, name) = (&f.client, &f.q, f.name.as_str());
    let cron = Cadence::cron("0 9 * * MON-FRI", "Europe/Paris").unwrap();
    let s = Schedule::new(name, q.clone(), cron.clone())
        .unwrap()
        .message(json!({"job": "report"}))
        .headers(json!({"team": "ops"}))
        .catch_up(3);
    assert!(
        !client.put_schedule(&s).await.unwrap(),
        "a second put replaces"
    );
    let listed = client.schedules().await.unwrap();
    let mine = listed.iter().find(|i| i.name == name).unwrap();
    assert_eq!(mine.queue_name, q.as_str());
    assert_eq!(mine.cadence, Some(cron));
    assert_eq!(mine.message, json!({"job": "report"}));
    assert_eq!(mine.headers, Some(json!({"team": "ops"})));
    assert_eq!(mine.catch_up, 3);
    assert!(!mine.paused);
    assert!(client.pause_schedule(name).await.unwrap());
    assert!(!client.pause_schedule(name).await.unwrap());
    let mine = client.schedules().await.unwrap();
    assert!(mine.iter().find(|i| i.name == name).unwrap().paused);
    assert!(client.resume_schedule(name).await.unwrap());
    assert!(!client.resume_schedule(name).await.unwrap());
    assert!(client.remove_schedule(name).await.unwrap());
    assert!(!client.remove_schedule(name).await.unwrap());
    assert!(!client.pause_schedule(name).await.unwrap());

    let nowhere = QueueName::new("sched_no_such_queue").unwrap();
    let missing = Schedule::new(name, nowhere, every(1000)).unwrap();
    assert!(matches!(
        client.put_schedule(&missing).await,
        Err(Error::QueueNotFound { .. })
    ));
    let bad = Schedule::new(name, q.clone(), every(1000))
        .unwrap()
        .headers(json!([1]));
    assert!(matches!(
        client.put_schedule(&bad).await,
        Err(Error::InvalidArgument(_))
    ));
}

#[tokio::test]
async fn several_runners_send_each_tick_once() {
    let f = fixture("sched_fleet", every(100), 10).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut runners = Vec::new();
    for _ in 0..4 {
        let c = f.db.client().await;
        let stop = stop.clone();
        runners.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let pass = c.fire_due_schedules(10).await.unwrap();
                assert!(pass.failed.is_empty(), "{:?}", pass.failed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(2000)).await;
    f.client.pause_schedule(&f.name).await.unwrap();
    stop.store(true, Ordering::Relaxed);
    for r in runners {
        r.await.unwrap();
    }
    let got = ticks(&f).await;
    assert!(got.len() >= 10, "too few ticks sent: {got:?}");
    assert_one_per_tick(&got, chrono::Duration::milliseconds(100));
    let info = f.client.schedules().await.unwrap();
    let info = info.iter().find(|i| i.name == f.name).unwrap();
    assert_eq!(info.sent, got.len() as i64);
    assert_eq!(info.last_tick, got.last().copied());
}

/// Runs `n` passes of a runner, 50 ms apart.
async fn passes(client: &Client, n: usize) {
    for _ in 0..n {
        client.fire_due_schedules(10).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_paused_schedule_sends_nothing_and_resumes_from_now() {
    let f = fixture("sched_pause", every(50), 10).await;
    f.client.pause_schedule(&f.name).await.unwrap();
    passes(&f.client, 8).await;
    assert!(ticks(&f).await.is_empty(), "a paused schedule sent");
    f.client.resume_schedule(&f.name).await.unwrap();
    let listed = f.client.schedules().await.unwrap();
    let resumed_at = listed.iter().find(|i| i.name == f.name).unwrap().changed_at;
    passes(&f.client, 6).await;
    let got = ticks(&f).await;
    assert!(!got.is_empty(), "a resumed schedule sent nothing");
    assert!(
        got[0] > resumed_at,
        "ticks due while paused were sent: {got:?} (resumed {resumed_at})"
    );
    assert_one_per_tick(&got, chrono::Duration::milliseconds(50));
}

/// Moves a schedule's next tick `back` into the past, as if no runner had
/// run for that long.
async fn outage(f: &Fixture, back_ms: i64) {
    // Place the first tick, then move it back.
    f.client.fire_due_schedules(10).await.unwrap();
    let name = &f.name;
    let n = common::raw_to(&f.db.dsn())
        .await
        .execute(
            "UPDATE pgmq_sdk.schedules SET next_tick = next_tick - make_interval(secs => $2::bigint / 1000.0) \
             WHERE name = $1",
            &[&name, &back_ms],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn missed_ticks_are_caught_up_to_the_bound() {
    for (catch_up, want) in [(3u32, 4usize), (0, 1), (100, 20)] {
        let f = fixture("sched_catch", every(1000), catch_up).await;
        outage(&f, 20_000).await;
        let pass = f.client.fire_due_schedules(10).await.unwrap();
        assert!(pass.failed.is_empty(), "{:?}", pass.failed);
        let got = ticks(&f).await;
        // The first tick was placed at most a second ahead and moved 20
        // back: 20 ticks are due, 21 when a second boundary passed
        // between placing and firing.
        assert!(
            got.len() == want || (catch_up == 100 && got.len() == 21),
            "catch_up {catch_up}: {} ticks sent: {got:?}",
            got.len()
        );
        assert_one_per_tick(&got, chrono::Duration::seconds(1));
        // The skipped ticks stay skipped: at most the next one is sent.
        f.client.fire_due_schedules(10).await.unwrap();
        let again = ticks(&f).await;
        assert!(again.len() <= got.len() + 1);
        assert_eq!(&again[..got.len()], &got[..]);
    }
}

#[tokio::test]
async fn a_rolled_back_firing_sends_later_and_a_stale_one_sends_nothing() {
    let f = fixture("sched_crash", every(1000), 10).await;
    let (client, name) = (&f.client, &f.name);
    outage(&f, 3_000).await;
    let due: Vec<_> = client
        .due_schedules(100)
        .await
        .unwrap()
        .into_iter()
        .filter(|d| &d.name == name)
        .collect();
    assert_eq!(due.len(), 1);
    assert!(!due[0].ticks.is_empty());
    // A runner that dies before its commit: nothing sent, nothing moved.
    let mut pg = common::raw_to(&f.db.dsn()).await;
    let tx = pg.transaction().await.unwrap();
    let sent = Pgmq::on(&tx).fire(&due[0]).await.unwrap().unwrap();
    assert_eq!(sent.len(), due[0].ticks.len());
    tx.rollback().await.unwrap();
    assert!(ticks(&f).await.is_empty());
    // The same firing again (the next runner read the same): sent once.
    let sent = client.fire(&due[0]).await.unwrap().unwrap();
    assert_eq!(sent.len(), due[0].ticks.len());
    // A late runner with what it read before: nothing.
    assert_eq!(client.fire(&due[0]).await.unwrap(), None);
    let got = ticks(&f).await;
    assert_eq!(got, due[0].ticks);
    assert_one_per_tick(&got, chrono::Duration::seconds(1));
}
