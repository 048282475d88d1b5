//! `release_batch`: claimed messages given back with their read undone
//! (visible now, `read_ct` one lower), on the pool, a transaction and a
//! caller's own `tokio_postgres` client; messages read again since are left
//! alone.

mod common;

use std::time::Duration;

use pgmq_client::{Error, Pgmq};
use serde_json::{json, Value};

use common::{msg_states as rows, Queues};

const VT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_release_makes_messages_visible_and_undoes_their_read() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "rel").await;
    let pg = common::raw().await;
    let ids = client
        .send_batch(&q, &[json!({"n": 0}), json!({"n": 1}), json!({"n": 2})])
        .await
        .unwrap();

    // Read all three twice (the first read's timeout ended at once).
    let first = common::ok(client.read::<Value>(&q, Duration::ZERO, 10).await.unwrap());
    assert!(first.iter().all(|m| m.read_ct == 1));
    let second = common::ok(client.read::<Value>(&q, VT, 10).await.unwrap());
    assert_eq!(second.len(), 3);
    assert!(second.iter().all(|m| m.read_ct == 2));
    assert!(common::ok(client.read::<Value>(&q, VT, 10).await.unwrap()).is_empty());

    // Release two of them, as read.
    let reads: Vec<(i64, i32)> = second[..2].iter().map(|m| (m.msg_id, m.read_ct)).collect();
    let mut released = client.release_batch(&q, &reads).await.unwrap();
    released.sort_unstable();
    assert_eq!(released, ids[..2]);
    assert_eq!(
        rows(&pg, &q).await,
        vec![(ids[0], 1, true), (ids[1], 1, true), (ids[2], 2, false)]
    );

    // Read again: the released ones come back with read_ct 2, not 3.
    let again = common::ok(client.read::<Value>(&q, VT, 10).await.unwrap());
    let seen: Vec<(i64, i32)> = again.iter().map(|m| (m.msg_id, m.read_ct)).collect();
    assert_eq!(seen, vec![(ids[0], 2), (ids[1], 2)]);

    // An empty batch is no call at all.
    assert!(client.release_batch(&q, &[]).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_message_read_again_since_or_deleted_is_left_alone() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "relguard").await;
    let pg = common::raw().await;
    let ids = client
        .send_batch(&q, &[json!({"n": 0}), json!({"n": 1})])
        .await
        .unwrap();
    // This consumer reads both; the timeout of the first ends and another
    // consumer reads it (read_ct 2); the second is deleted meanwhile.
    let mine = common::ok(client.read::<Value>(&q, VT, 10).await.unwrap());
    assert_eq!(mine.len(), 2);
    client
        .set_vt_batch(&q, &ids[..1], Duration::ZERO)
        .await
        .unwrap();
    let theirs = common::ok(client.read::<Value>(&q, VT, 10).await.unwrap());
    assert_eq!((theirs[0].msg_id, theirs[0].read_ct), (ids[0], 2));
    assert!(client.delete(&q, ids[1]).await.unwrap());

    let reads: Vec<(i64, i32)> = mine.iter().map(|m| (m.msg_id, m.read_ct)).collect();
    assert!(client.release_batch(&q, &reads).await.unwrap().is_empty());
    // The other consumer's claim is untouched: still invisible, read_ct 2.
    assert_eq!(rows(&pg, &q).await, vec![(ids[0], 2, false)]);
}

#[tokio::test]
async fn read_ct_never_goes_below_zero() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "relzero").await;
    let pg = common::raw().await;
    let id = client.send(&q, &json!({})).await.unwrap();
    // Never read: read_ct 0 matches, and stays 0.
    assert_eq!(client.release_batch(&q, &[(id, 0)]).await.unwrap(), [id]);
    assert_eq!(rows(&pg, &q).await, vec![(id, 0, true)]);
}

#[tokio::test]
async fn release_in_a_transaction_and_on_a_callers_client() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "reltx").await;
    let pg = common::raw().await;
    let id = client.send(&q, &json!({})).await.unwrap();
    let m = common::ok(client.read::<Value>(&q, VT, 1).await.unwrap()).remove(0);

    // Rolled back: nothing changes.
    let mut conn = client.connection().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    assert_eq!(
        Pgmq::on(&tx)
            .release_batch(&q, &[(id, m.read_ct)])
            .await
            .unwrap(),
        [id]
    );
    tx.rollback().await.unwrap();
    assert_eq!(rows(&pg, &q).await, vec![(id, 1, false)]);

    // On a caller's own tokio_postgres client (no statement cache).
    assert_eq!(
        Pgmq::on(&pg)
            .release_batch(&q, &[(id, m.read_ct)])
            .await
            .unwrap(),
        [id]
    );
    assert_eq!(rows(&pg, &q).await, vec![(id, 0, true)]);
}

#[tokio::test]
async fn release_on_a_missing_queue_is_queue_not_found() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.name("relmissing");
    let err = client.release_batch(&q, &[(1, 1)]).await.unwrap_err();
    assert!(matches!(err, Error::QueueNotFound { .. }), "{err:?}");
}
