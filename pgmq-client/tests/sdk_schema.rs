//! The pgmq_sdk schema's install step, on databases of their own: what a
//! database without it answers, installing (also twice at once), the SQL
//! for migration tools, and pause/resume.

mod common;

use std::time::Duration;

use pgmq_client::{DedupKey, Error, FleetLimit, QueueName, ReadOptions};
use serde_json::json;

use common::OwnDb;

#[tokio::test]
async fn without_the_schema_each_feature_says_how_to_install_it() {
    let db = OwnDb::new("sdk_missing").await;
    let client = db.client().await;
    let q = QueueName::new("orders").unwrap();
    client.create(&q).await.unwrap();
    assert_eq!(client.sdk_schema_version().await.unwrap(), 0);

    let key = DedupKey::new("k", Duration::from_secs(60));
    let e = client.send_keyed(&q, &key, &json!(1)).await.unwrap_err();
    assert!(matches!(e, Error::SdkSchemaMissing { .. }), "{e:?}");
    assert!(e.to_string().contains("pgmq install-sdk"), "{e}");
    assert_eq!(e.outcome(), pgmq_client::CommitOutcome::Rejected);
    let e = client.pause(&q, None).await.unwrap_err();
    assert!(matches!(e, Error::SdkSchemaMissing { .. }), "{e:?}");
    let e = client.is_paused(&q).await.unwrap_err();
    assert!(matches!(e, Error::SdkSchemaMissing { .. }), "{e:?}");
    let opts = ReadOptions::new(Duration::from_secs(30)).qty(1);
    let e = client
        .read_limited_raw(&q, &FleetLimit::max_running(1), &opts)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::SdkSchemaMissing { .. }), "{e:?}");
    // Nothing was sent.
    assert!(client
        .read_raw(&q, Duration::from_secs(1), 10)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn installing_twice_at_once_installs_once() {
    let db = OwnDb::new("sdk_install").await;
    let (a, b) = (db.client().await, db.client().await);
    let (x, y) = tokio::join!(a.install_sdk_schema(), b.install_sdk_schema());
    let (x, y) = (x.unwrap(), y.unwrap());
    let mut befores = [x.before, y.before];
    befores.sort_unstable();
    assert_eq!(befores, [0, pgmq_client::sdk_schema::VERSION]);
    let v = pgmq_client::sdk_schema::VERSION;
    assert_eq!((x.now, y.now), (v, v));
    let again = a.install_sdk_schema().await.unwrap();
    assert_eq!((again.before, again.now), (v, v));
    assert!(again.repaired.is_empty(), "{:?}", again.repaired);
    assert_eq!(a.sdk_schema_version().await.unwrap(), v);
}

#[tokio::test]
async fn the_printed_sql_installs_the_same_schema() {
    let db = OwnDb::new("sdk_sql").await;
    common::raw_to(&db.dsn())
        .await
        .batch_execute(&pgmq_client::sdk_schema::sql())
        .await
        .unwrap();
    let client = db.client().await;
    let v = pgmq_client::sdk_schema::VERSION;
    assert_eq!(client.sdk_schema_version().await.unwrap(), v);
    let done = client.install_sdk_schema().await.unwrap();
    assert_eq!(done.before, v, "nothing left to apply");
    assert!(done.repaired.is_empty(), "{:?}", done.repaired);
    let q = QueueName::new("orders").unwrap();
    client.create(&q).await.unwrap();
    let key = DedupKey::new("k", Duration::from_secs(60));
    assert!(
        !client
            .send_keyed(&q, &key, &json!(1))
            .await
            .unwrap()
            .duplicate
    );
}

#[tokio::test]
async fn pause_and_resume_say_what_changed() {
    let db = OwnDb::new("sdk_pause").await;
    let client = db.client().await;
    client.install_sdk_schema().await.unwrap();
    let q = QueueName::new("orders").unwrap();
    client.create(&q).await.unwrap();
    assert!(!client.is_paused(&q).await.unwrap());
    assert!(client.pause(&q, Some("maintenance")).await.unwrap());
    assert!(!client.pause(&q, None).await.unwrap(), "already paused");
    assert!(client.is_paused(&q).await.unwrap());
    let listed = client.paused_queues().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].queue_name, "orders");
    assert_eq!(listed[0].reason.as_deref(), Some("maintenance"));
    // Pausing does not touch PGMQ: sends and plain reads still work.
    client.send(&q, &json!(1)).await.unwrap();
    assert_eq!(
        client
            .read_raw(&q, Duration::from_secs(1), 1)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(client.resume(&q).await.unwrap());
    assert!(!client.resume(&q).await.unwrap(), "not paused");
    assert!(client.paused_queues().await.unwrap().is_empty());
    let e = client
        .pause(&QueueName::new("nosuch").unwrap(), None)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::QueueNotFound { .. }), "{e:?}");
}

/// A database of its own with the schema installed and a queue `jobs` of
/// 20 messages.
async fn jobs_queue(prefix: &str) -> (OwnDb, pgmq_client::Client, QueueName) {
    let db = OwnDb::new(prefix).await;
    let client = db.client().await;
    client.install_sdk_schema().await.unwrap();
    let q = QueueName::new("jobs").unwrap();
    client.create(&q).await.unwrap();
    client
        .send_batch(&q, &(0..20).collect::<Vec<i32>>())
        .await
        .unwrap();
    (db, client, q)
}

/// How many messages one limited read of `q` claims, within 5 s (a read
/// that waits longer waited for another's transaction).
async fn claims(
    client: &pgmq_client::Client,
    q: &QueueName,
    limit: &FleetLimit,
    opts: &ReadOptions,
) -> Vec<i64> {
    let read = client.read_limited_raw(q, limit, opts);
    let got = tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("a limited read waited for another's transaction")
        .unwrap();
    got.iter().map(|m| m.msg_id).collect()
}

#[tokio::test]
async fn limited_reads_never_pass_the_limit() {
    let (_db, client, q) = jobs_queue("sdk_limit").await;
    let opts = ReadOptions::new(Duration::from_secs(30)).qty(10);
    let limit = FleetLimit::max_running(3);
    let first = client.read_limited_raw(&q, &limit, &opts).await.unwrap();
    assert_eq!(first.len(), 3);
    assert!(client
        .read_limited_raw(&q, &limit, &opts)
        .await
        .unwrap()
        .is_empty());
    // A delete frees its place at once.
    client.delete(&q, first[0].msg_id).await.unwrap();
    assert_eq!(
        client
            .read_limited_raw(&q, &limit, &opts)
            .await
            .unwrap()
            .len(),
        1
    );
    // A claim whose visibility timeout passed (a crashed reader) frees its
    // place too.
    let short = ReadOptions::new(Duration::from_secs(1)).qty(10);
    let q2 = QueueName::new("jobs2").unwrap();
    client.create(&q2).await.unwrap();
    client.send_batch(&q2, &[1, 2, 3]).await.unwrap();
    let one = FleetLimit::max_running(1);
    assert_eq!(
        client
            .read_limited_raw(&q2, &one, &short)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(client
        .read_limited_raw(&q2, &one, &short)
        .await
        .unwrap()
        .is_empty());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        client
            .read_limited_raw(&q2, &one, &short)
            .await
            .unwrap()
            .len(),
        1
    );

    // A rate of 5 per second with a bucket of 2: 2 at once, then about 5
    // per second.
    let q3 = QueueName::new("jobs3").unwrap();
    client.create(&q3).await.unwrap();
    client
        .send_batch(&q3, &(0..50).collect::<Vec<i32>>())
        .await
        .unwrap();
    let rate = FleetLimit::per_second(5.0).with_burst(2.0);
    assert_eq!(
        client
            .read_limited_raw(&q3, &rate, &opts)
            .await
            .unwrap()
            .len(),
        2
    );
    assert!(
        client
            .read_limited_raw(&q3, &rate, &opts)
            .await
            .unwrap()
            .len()
            <= 1
    );
    let started = std::time::Instant::now();
    let mut got = 0;
    while started.elapsed() < Duration::from_secs(1) {
        got += client
            .read_limited_raw(&q3, &rate, &opts)
            .await
            .unwrap()
            .len();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // One second refills 5 tokens, plus at most the one left over.
    assert!(got <= 6, "{got} claims in a second at 5 per second");
    assert!(FleetLimit::max_running(0).check().is_err());
}

/// Limited reads of one queue take different places and never wait for
/// each other: a read whose transaction is still open holds its places
/// (others pass over them, and never take them), and a read beside it
/// claims the places left without waiting for that transaction to end.
#[tokio::test]
async fn limited_reads_in_flight_take_different_places_without_waiting() {
    let (db, client, q) = jobs_queue("sdk_limit_places").await;
    let opts = ReadOptions::new(Duration::from_secs(30)).qty(2);
    let limit = FleetLimit::max_running(3);
    // The first read of a queue under a limit makes its places (a read
    // beside it waits for them once); its claims ended, all three are free.
    for id in claims(&client, &q, &limit, &opts).await {
        client.delete(&q, id).await.unwrap();
    }

    // (A client of its own: each client here pools one connection.)
    let holder = db.client().await;
    let mut conn = holder.connection().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    let held = pgmq_client::Pgmq::on(&tx)
        .read_limited_raw(&q, &limit, &opts)
        .await
        .unwrap();
    assert_eq!(held.len(), 2);
    // The open transaction holds two places: another read takes the third
    // at once, and no more.
    let beside = claims(&client, &q, &limit, &opts).await;
    assert_eq!(beside.len(), 1);
    assert_eq!(claims(&client, &q, &limit, &opts).await, Vec::<i64>::new());
    // Committed, the held places stay taken until their claims end.
    tx.commit().await.unwrap();
    assert_eq!(claims(&client, &q, &limit, &opts).await, Vec::<i64>::new());
    client.delete(&q, held[0].msg_id).await.unwrap();
    client.delete(&q, beside[0]).await.unwrap();
    assert_eq!(claims(&client, &q, &limit, &opts).await.len(), 2);

    // A read rolled back leaves its places free (and its places made in
    // that transaction are rolled back with it).
    let q2 = QueueName::new("jobs2").unwrap();
    client.create(&q2).await.unwrap();
    client.send_batch(&q2, &[1, 2, 3]).await.unwrap();
    let one = FleetLimit::max_running(1);
    let tx = conn.transaction().await.unwrap();
    let got = pgmq_client::Pgmq::on(&tx)
        .read_limited_raw(&q2, &one, &opts)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    tx.rollback().await.unwrap();
    assert_eq!(claims(&client, &q2, &one, &opts).await.len(), 1);
}

#[tokio::test]
async fn an_acknowledgement_and_the_next_claims_share_one_statement() {
    let (_db, client, q) = jobs_queue("sdk_ackread").await;
    let opts = ReadOptions::new(Duration::from_secs(30)).qty(10);
    let limit = FleetLimit::max_running(3);
    let first = client.read_limited_raw(&q, &limit, &opts).await.unwrap();
    assert_eq!(first.len(), 3);
    // Two deliveries acknowledged, and a stale receipt of the third (its
    // delivery is not the one it names): the fence leaves that one.
    let mut acks: Vec<_> = first[..2].iter().map(|m| m.receipt().unwrap()).collect();
    let mut stale = first[2].receipt().unwrap();
    stale.read_at -= chrono::Duration::seconds(1);
    acks.push(stale);
    let (deleted, next) = client
        .ack_read_limited_raw(&q, &acks, &limit, &opts)
        .await
        .unwrap();
    let mut deleted = deleted;
    deleted.sort_unstable();
    assert_eq!(deleted, [first[0].msg_id, first[1].msg_id]);
    assert_eq!(next.len(), 2, "the places the deletes freed, no more");
    assert!(client
        .read_limited_raw(&q, &limit, &opts)
        .await
        .unwrap()
        .is_empty());
    let none: [pgmq_client::Receipt; 0] = [];
    let (deleted, next) = client
        .ack_read_limited_raw(&q, &none, &limit, &opts)
        .await
        .unwrap();
    assert!(deleted.is_empty() && next.is_empty(), "every place is held");
}
