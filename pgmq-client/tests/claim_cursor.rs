//! Ranged reads (`ReadFrom::Ranged`), on a database of its own with the
//! `pgmq_sdk` schema: each read starts past the ranges taken before it,
//! a message made visible again below the cursor is skipped by ranged
//! reads and found by a read from the start, a short read pulls the
//! cursor back to the tail, and without the schema a ranged read is
//! `Error::SdkSchemaMissing`, having claimed nothing.

mod common;

use std::time::Duration;

use pgmq_client::{Delay, Error, Message, QueueName, RawJson, ReadFrom, ReadOptions};
use serde_json::json;

use common::OwnDb;

const VT: Duration = Duration::from_secs(30);

fn ids(v: Vec<Message<RawJson>>) -> Vec<i64> {
    let mut ids: Vec<i64> = v.iter().map(|m| m.msg_id).collect();
    ids.sort_unstable();
    ids
}

#[tokio::test]
async fn ranged_reads_take_successive_ranges_and_follow_the_tail() {
    let db = OwnDb::new("claim_cursor").await;
    let client = db.client().await;
    client.install_sdk_schema().await.unwrap();
    let q = QueueName::new("jobs").unwrap();
    client.create(&q).await.unwrap();
    let sent = client
        .send_batch(&q, &(0..30).map(|i| json!({ "i": i })).collect::<Vec<_>>())
        .await
        .unwrap();
    let opts = |n| ReadOptions::new(VT).qty(n);

    // Two readers with the same bound (0) take successive ranges.
    let a = client
        .read_from_raw(&q, ReadFrom::Ranged(0), &opts(5))
        .await
        .unwrap();
    let b = client
        .read_from_raw(&q, ReadFrom::Ranged(0), &opts(5))
        .await
        .unwrap();
    assert_eq!(ids(a), sent[..5]);
    assert_eq!(ids(b), sent[5..10]);

    // Released below the cursor: ranged reads pass it (the cursor is past
    // its id, whatever the reader's own bound), a read from the start
    // claims it.
    client.set_vt(&q, sent[0], Delay::NONE).await.unwrap();
    let c = client
        .read_from_raw(&q, ReadFrom::Ranged(0), &opts(5))
        .await
        .unwrap();
    assert_eq!(ids(c), sent[10..15]);
    let start = client
        .read_from_raw(&q, ReadFrom::Start, &opts(5))
        .await
        .unwrap();
    assert_eq!(
        ids(start),
        [sent[0], sent[15], sent[16], sent[17], sent[18]]
    );

    // A short read (the rest of the tail) pulls the cursor back to where
    // it ended: the next message sent is the next ranged read's.
    let tail = client
        .read_from_raw(&q, ReadFrom::Ranged(0), &opts(100))
        .await
        .unwrap();
    assert_eq!(ids(tail), sent[19..]);
    let later = client.send(&q, &json!({ "i": 30 })).await.unwrap();
    let next = client
        .read_from_raw(&q, ReadFrom::Ranged(0), &opts(100))
        .await
        .unwrap();
    assert_eq!(ids(next), [later]);

    // An empty read pulls it back to the reader's own bound, so a range
    // taken ahead of the tail is not kept.
    let empty = client
        .read_from_raw(&q, ReadFrom::Ranged(later), &opts(100))
        .await
        .unwrap();
    assert!(empty.is_empty());
    let pg = common::raw_to(&db.dsn()).await;
    let next_id: i64 = pg
        .query_one("SELECT next_id FROM pgmq_sdk.claim_cursors", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(next_id, later);
}

#[tokio::test]
async fn without_the_schema_a_ranged_read_claims_nothing() {
    let db = OwnDb::new("claim_cursor_none").await;
    let client = db.client().await;
    let q = QueueName::new("jobs").unwrap();
    client.create(&q).await.unwrap();
    client.send(&q, &json!({ "i": 0 })).await.unwrap();
    let err = client
        .read_from_raw(&q, ReadFrom::Ranged(0), &ReadOptions::new(VT).qty(5))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::SdkSchemaMissing { .. }), "{err:?}");
    let all = client
        .read_from_raw(&q, ReadFrom::Start, &ReadOptions::new(VT).qty(5))
        .await
        .unwrap();
    assert_eq!(all.len(), 1, "the message is still visible");
}
