//! The statements pgmq-worker runs through this crate: the fenced
//! dead-letter move, the fenced lock, the look for rows still queued, and
//! the start-up probes (the queue table's columns, who holds a lock on it,
//! transaction-local timeouts, the fleet limit's read).

mod common;

use std::time::Duration;

use pgmq_client::{DeadLetter, Error, Pgmq, Receipt, SendOptions};
use serde_json::{json, Value};

use common::Queues;

const VT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn the_dead_letter_move_is_fenced_exact_and_leaves_out_headers() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "dlmove").await;
    // The dead-letter queue's name starts with the source's.
    let dlq = qs.adopt(&format!("{}_dlq", q.as_str()));
    client.create(&dlq).await.unwrap();
    let pg = common::raw().await;

    let body = json!({"n": 12345678901234567890u64, "deep": {"a": [1, 2.5e300]}});
    let opts = SendOptions::new().headers_each(vec![
        json!({"x-own": 1, "keep": "yes"}),
        json!({"keep": 2}),
        json!("not an object"),
    ]);
    let ids = client
        .send_batch_with(&q, &[body.clone(), json!({"n": 2}), json!({"n": 3})], &opts)
        .await
        .unwrap();
    let first = client.read_raw(&q, Duration::ZERO, 10).await.unwrap();
    let stale: Vec<Receipt> = first.iter().filter_map(|m| m.receipt()).collect();
    let msgs = client.read_raw(&q, VT, 10).await.unwrap();
    let receipts: Vec<Receipt> = msgs.iter().filter_map(|m| m.receipt()).collect();
    assert_eq!(receipts.len(), 3);

    // An earlier delivery's move matches nothing.
    let old: Vec<DeadLetter> = stale.iter().map(|r| DeadLetter::new(*r, "stale")).collect();
    let moved = client
        .dead_letter_fenced(&q, &dlq, &old, &["x-own"])
        .await
        .unwrap();
    assert!(moved.is_empty());

    let letters: Vec<DeadLetter> = receipts[..2]
        .iter()
        .chain(&receipts[2..])
        .map(|r| DeadLetter::new(*r, "gave up").attempts(5).deliveries(2))
        .collect();
    let mut moved = client
        .dead_letter_fenced(&q, &dlq, &letters, &["x-own"])
        .await
        .unwrap();
    moved.sort_unstable();
    assert_eq!(moved, ids);
    assert!(common::queue_rows(&pg, &q).await.is_empty());

    let copies = client.read_raw(&dlq, VT, 10).await.unwrap();
    assert_eq!(copies.len(), 3);
    let first: Value = serde_json::from_str(copies[0].body.get()).unwrap();
    assert_eq!(first, body, "the body is copied as stored");
    let h = copies[0].headers.clone().unwrap();
    assert_eq!(h["reason"], "gave up");
    assert_eq!(h["attempts"], 5);
    assert_eq!(h["deliveries"], 2);
    assert_eq!(h["source_queue"], q.as_str());
    assert_eq!(h["original_msg_id"], ids[0]);
    assert_eq!(h["original_headers"], json!({"keep": "yes"}));
    let h3 = copies[2].headers.clone().unwrap();
    assert_eq!(h3["original_headers"], "not an object");

    // Nothing to move: no call.
    assert!(client
        .dead_letter_fenced(&q, &dlq, &[], &[])
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn a_missing_queue_of_the_move_is_named() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "dlmiss").await;
    client.send(&q, &json!({"n": 1})).await.unwrap();
    let msgs = client.read_raw(&q, VT, 1).await.unwrap();
    let letters = [DeadLetter::new(msgs[0].receipt().unwrap(), "x")];

    // Named after the source, so that only the exact table name tells them
    // apart in the server's error.
    let dlq = qs.adopt(&format!("{}_dlq", q.as_str()));
    match client.dead_letter_fenced(&q, &dlq, &letters, &[]).await {
        Err(Error::QueueNotFound { queue }) => assert_eq!(queue, dlq.as_str()),
        other => panic!("expected the dead-letter queue missing: {other:?}"),
    }
    // The move was one statement: the message is still in its queue.
    assert_eq!(
        client
            .still_queued(&q, &[msgs[0].msg_id])
            .await
            .unwrap()
            .len(),
        1
    );

    let gone = qs.name("dlgone");
    match client.dead_letter_fenced(&gone, &q, &letters, &[]).await {
        Err(Error::QueueNotFound { queue }) => assert_eq!(queue, gone.as_str()),
        other => panic!("expected the source missing: {other:?}"),
    }
}

#[tokio::test]
async fn the_fenced_lock_holds_the_rows_until_the_transaction_ends() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "lockf").await;
    let ids = client
        .send_batch(&q, &[json!({"n": 1}), json!({"n": 2})])
        .await
        .unwrap();
    let stale = client.read_raw(&q, Duration::ZERO, 10).await.unwrap();
    let msgs = client.read_raw(&q, VT, 10).await.unwrap();
    let mut receipts: Vec<Receipt> = msgs.iter().filter_map(|m| m.receipt()).collect();
    receipts.reverse();
    // One current delivery, one stale one.
    let asked = [receipts[0], stale[0].receipt().unwrap()];

    let mut conn = client.connection_owned().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    let locked = Pgmq::on(&tx).lock_fenced(&q, &asked).await.unwrap();
    assert_eq!(locked, [receipts[0].msg_id]);

    // Another session cannot lock that row meanwhile; the other one it can.
    let pg = common::raw().await;
    let sql = format!(
        "SELECT msg_id FROM {} WHERE msg_id = $1 FOR UPDATE NOWAIT",
        q.quoted_table()
    );
    assert!(pg.query(&sql, &[&receipts[0].msg_id]).await.is_err());
    let other = receipts[1].msg_id;
    assert_eq!(pg.query(&sql, &[&other]).await.unwrap().len(), 1);
    tx.rollback().await.unwrap();
    assert_eq!(
        pg.query(&sql, &[&receipts[0].msg_id]).await.unwrap().len(),
        1
    );

    // By id alone, in id order.
    let tx = conn.transaction().await.unwrap();
    let locked = Pgmq::on(&tx)
        .lock_batch(&q, &[ids[1], ids[0], -1])
        .await
        .unwrap();
    assert_eq!(locked, ids);
    tx.rollback().await.unwrap();
    assert!(client.lock_fenced(&q, &[]).await.unwrap().is_empty());
}

#[tokio::test]
async fn still_queued_names_the_rows_left() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "stillq").await;
    let ids = client
        .send_batch(&q, &[json!({"n": 1}), json!({"n": 2}), json!({"n": 3})])
        .await
        .unwrap();
    client.delete(&q, ids[1]).await.unwrap();
    client.archive(&q, ids[2]).await.unwrap();
    assert_eq!(
        client
            .still_queued(&q, &[ids[0], ids[1], ids[2], -5])
            .await
            .unwrap(),
        [ids[0]]
    );
    assert!(client.still_queued(&q, &[ids[1]]).await.unwrap().is_empty());
    assert!(client.still_queued(&q, &[]).await.unwrap().is_empty());
    let gone = qs.name("stillgone");
    assert!(matches!(
        client.still_queued(&gone, &[1]).await,
        Err(Error::QueueNotFound { .. })
    ));
}

#[tokio::test]
async fn the_probes_read_the_catalogs() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "probe").await;

    let cols = client.queue_table_columns(&q).await.unwrap();
    let has = |name: &str, ty: &str| cols.iter().any(|c| c.name == name && c.type_name == ty);
    assert!(has("msg_id", "bigint"));
    assert!(has("last_read_at", "timestamp with time zone"));
    assert!(has("headers", "jsonb"));
    let missing = qs.name("probegone");
    assert!(client
        .queue_table_columns(&missing)
        .await
        .unwrap()
        .is_empty());

    // A session holding a lock on the table is named.
    assert!(client
        .queue_table_lock_holders(&q, 5)
        .await
        .unwrap()
        .is_empty());
    let mut holder = common::raw().await;
    holder
        .execute("SET application_name = 'lock_holder_probe'", &[])
        .await
        .unwrap();
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        &format!("LOCK TABLE {} IN SHARE MODE", q.quoted_table()),
        &[],
    )
    .await
    .unwrap();
    let holders = client.queue_table_lock_holders(&q, 5).await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].application_name, "lock_holder_probe");
    assert_eq!(holders[0].mode, "ShareLock");
    assert!(client
        .queue_table_lock_holders(&q, 0)
        .await
        .unwrap()
        .is_empty());
    tx.rollback().await.unwrap();

    // Timeouts for the rest of the transaction only.
    let mut conn = client.connection_owned().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    Pgmq::on(&tx)
        .set_local_timeouts(Duration::from_millis(500), Duration::from_secs(7))
        .await
        .unwrap();
    let shown = tx.query_one("SHOW lock_timeout", &[]).await.unwrap();
    assert_eq!(shown.get::<_, String>(0), "500ms");
    let shown = tx.query_one("SHOW statement_timeout", &[]).await.unwrap();
    assert_eq!(shown.get::<_, String>(0), "7s");
    tx.rollback().await.unwrap();
    let shown = conn
        .client()
        .query_one("SHOW lock_timeout", &[])
        .await
        .unwrap();
    assert_ne!(shown.get::<_, String>(0), "500ms");

    // The fleet limit's read is there exactly when the catalog has it.
    let pg = common::raw().await;
    let there: bool = pg
        .query_one(
            "SELECT to_regprocedure('pgmq_sdk.read_limited(text, integer, integer, integer, double precision, double precision)') IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(client.fleet_limit_available().await.unwrap(), there);
}
