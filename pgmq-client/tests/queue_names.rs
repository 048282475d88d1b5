//! Queues another PGMQ client made, with names PGMQ 1.13 accepts: upper
//! case (folded for the table name), `-`, `.`, a space, `"`, `/`. Created
//! by raw `pgmq.create`, then used through every kind of call of this
//! crate: PGMQ's functions, the statements on the queue's tables (quoted),
//! notifications.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::Queues;
use pgmq_client::{
    ClientBuilder, Error, Listener, Message, QueueName, RawJson, ReadFrom, ReadOptions,
};
use serde_json::json;

/// A name made of `stem` and what makes it unique, at most 47 characters.
fn named(stem: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let name = format!("{stem}-{}.{n}", std::process::id());
    assert!(name.len() <= 47, "{name}");
    name
}

/// Creates a queue named after `stem` the way another client would (PGMQ's
/// own function, the name as given); dropped when `qs` goes.
async fn foreign(qs: &Queues, stem: &str) -> QueueName {
    let name = named(stem);
    common::raw()
        .await
        .execute("SELECT pgmq.create($1)", &[&name])
        .await
        .unwrap();
    qs.adopt(&name)
}

/// A listener on `q`'s insert channel, with notifications enabled (no
/// throttle).
async fn listening(client: &pgmq_client::Client, q: &QueueName) -> Listener {
    client
        .enable_notify_insert(q, Duration::ZERO)
        .await
        .unwrap();
    let l = Listener::connect(&ClientBuilder::new(&common::dsn()))
        .await
        .unwrap();
    l.listen(q).await.unwrap();
    l
}

fn body(m: &Message<RawJson>) -> serde_json::Value {
    serde_json::from_str(m.body.get()).unwrap()
}

#[tokio::test]
async fn queues_with_names_pgmq_accepts_work_through_every_call() {
    let client = common::client().await;
    let qs = Queues::new();
    for stem in ["Orders-EU.v2", "Team \"A\"/jobs", "lower.case-only"] {
        let q = foreign(&qs, stem).await;
        assert!(client.queue_exists(&q).await.unwrap(), "{stem}");
        assert!(client
            .list_queues()
            .await
            .unwrap()
            .iter()
            .any(|i| i.queue_name == q.as_str()));

        // PGMQ's functions, the name as given.
        let ids = client
            .send_batch(&q, &[json!(1), json!(2), json!(3), json!(4), json!(5)])
            .await
            .unwrap();
        let m = client.metrics(&q).await.unwrap();
        assert_eq!((m.queue_name.as_str(), m.queue_length), (q.as_str(), 5));
        let read = client
            .read_raw(&q, Duration::from_secs(30), 1)
            .await
            .unwrap();
        assert_eq!(read[0].msg_id, ids[0]);
        assert!(client.archive(&q, ids[0]).await.unwrap());
        assert!(client.delete(&q, ids[1]).await.unwrap());

        // Statements on the folded, quoted tables.
        let opts = ReadOptions::new(Duration::from_secs(30)).qty(2);
        let got = client
            .read_from_raw(&q, ReadFrom::After(ids[1]), &opts)
            .await
            .unwrap();
        assert_eq!(common::ids(&got), ids[2..4], "{stem}");
        assert_eq!(body(&got[0]), json!(3));
        let receipts: Vec<_> = got.iter().map(|m| m.receipt().unwrap()).collect();
        assert_eq!(
            client.delete_fenced(&q, &receipts[..1]).await.unwrap(),
            ids[2..3]
        );
        assert_eq!(
            client.archive_fenced(&q, &receipts[1..]).await.unwrap(),
            ids[3..4]
        );
        let last = client
            .read_raw(&q, Duration::from_secs(30), 1)
            .await
            .unwrap();
        assert_eq!(last[0].msg_id, ids[4]);
        assert_eq!(
            client
                .release_batch(&q, &[(ids[4], last[0].read_ct)])
                .await
                .unwrap(),
            ids[4..]
        );
        let raw = common::raw().await;
        let archived: Vec<i64> = common::fetch(
            &raw,
            &format!("SELECT msg_id FROM {} ORDER BY 1", q.quoted_archive_table()),
            &[],
            |r| r.get(0),
        )
        .await;
        assert_eq!(archived, [ids[0], ids[3]]);

        assert_eq!(client.purge_queue(&q).await.unwrap(), 1);
        assert!(client.drop_queue(&q).await.unwrap());
        assert!(!client.queue_exists(&q).await.unwrap());
        // A missing queue of such a name is still QueueNotFound.
        let err = client
            .read_from_raw(&q, ReadFrom::Start, &opts)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::QueueNotFound { .. }), "{err:?}");
    }
}

#[tokio::test]
async fn names_differing_in_case_share_their_tables() {
    let client = common::client().await;
    let qs = Queues::new();
    let upper = foreign(&qs, "Shared-Case").await;
    let lower = QueueName::new(&upper.as_str().to_lowercase()).unwrap();
    assert_eq!(upper.quoted_table(), lower.quoted_table());
    let id = client.send(&upper, &json!("one")).await.unwrap();
    // The table statements of either name reach the same rows.
    let opts = ReadOptions::new(Duration::from_secs(30));
    let got = client
        .read_from_raw(&lower, ReadFrom::Start, &opts)
        .await
        .unwrap();
    assert_eq!(common::ids(&got), [id]);
}

#[tokio::test]
async fn a_listener_wakes_for_a_queue_with_dots_and_dashes() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = foreign(&qs, "orders-eu.v2").await;
    let mut l = listening(&client, &q).await;
    client.send(&q, &json!(1)).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(10), l.recv())
        .await
        .expect("a notification within 10 s")
        .unwrap();
    assert_eq!(n.channel, q.insert_channel());
    l.unlisten(&q).await.unwrap();
}

#[tokio::test]
async fn a_mixed_case_queue_listens_where_the_installed_pgmq_notifies() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = foreign(&qs, "Orders-EU").await;
    let install = client.install().expect("detected at connect").clone();
    let mut l = listening(&client, &q).await;
    client.send(&q, &json!(1)).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(3), l.recv()).await;
    match q.insert_channel_for(install.version) {
        // 1.13.1 and later: notified on the channel that keeps the case.
        Some(channel) => assert_eq!(n.unwrap().unwrap().channel, channel),
        // Before: PGMQ's trigger sends nothing for this queue.
        None => assert!(n.is_err(), "{n:?}"),
    }
}
