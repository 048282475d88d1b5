//! Prepared statements whose result type changes under them (what
//! `ALTER EXTENSION pgmq UPDATE` does to `pgmq.metrics_result`): the pooled
//! connection keeps working. Each test alters PGMQ's objects in a database
//! of its own, dropped at the end.

mod common;

use std::time::Duration;

use pgmq_client::{Pgmq, QueueName, ReadFrom, ReadOptions};
use serde_json::json;

#[tokio::test]
async fn metrics_survive_a_field_added_to_pgmqs_metrics_type() {
    let db = common::OwnDb::new("stale_metrics").await;
    let client = db.client().await;
    let q = QueueName::new("jobs").unwrap();
    client.create(&q).await.unwrap();
    client.send(&q, &json!(1)).await.unwrap();
    // Prepared on the pool's one connection.
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 1);
    assert_eq!(client.metrics_all().await.unwrap().len(), 1);

    // What PGMQ's 1.12 -> 1.13 upgrade did: a field added to the type, and
    // the functions replaced (here only touched, which invalidates the
    // statements that call them the same way).
    let admin = common::raw_to(&db.dsn()).await;
    admin
        .batch_execute(
            "ALTER TYPE pgmq.metrics_result ADD ATTRIBUTE another_field bigint; \
             ALTER FUNCTION pgmq.metrics(text) COST 101; \
             ALTER FUNCTION pgmq.metrics_all() COST 101",
        )
        .await
        .unwrap();

    let m = client.metrics(&q).await.unwrap();
    assert_eq!((m.queue_name.as_str(), m.queue_length), ("jobs", 1));
    let all = client.metrics_all().await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].total_messages, 1);
}

/// Gives `SELECT * FROM pgmq.delete(text, bigint[])` a second column, as a
/// function replaced by an upgrade with another result shape would.
const RESHAPE_DELETE: &str = "ALTER FUNCTION pgmq.delete(text, bigint[]) RENAME TO delete_before; \
     CREATE FUNCTION pgmq.delete(queue_name text, msg_ids bigint[]) \
     RETURNS TABLE (msg_id bigint, note text) LANGUAGE sql AS \
     $$ SELECT d, 'deleted' FROM pgmq.delete_before(queue_name, msg_ids) d $$";

#[cfg(feature = "deadpool")]
#[tokio::test]
async fn deadpools_cache_is_prepared_again_too() {
    let db = common::OwnDb::new("stale_deadpool").await;
    let config: tokio_postgres::Config = db.dsn().parse().unwrap();
    let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(1)
        .build()
        .unwrap();
    let pgmq = Pgmq::on(pool);
    let q = QueueName::new("jobs").unwrap();
    pgmq.create(&q).await.unwrap();
    let ids = pgmq.send_batch(&q, &[json!(1), json!(2)]).await.unwrap();
    assert_eq!(pgmq.delete_batch(&q, &ids[..1]).await.unwrap(), ids[..1]);
    common::raw_to(&db.dsn())
        .await
        .batch_execute(RESHAPE_DELETE)
        .await
        .unwrap();
    assert_eq!(pgmq.delete_batch(&q, &ids[1..]).await.unwrap(), ids[1..]);
}

#[tokio::test]
async fn a_statement_whose_result_type_changed_is_prepared_again() {
    let db = common::OwnDb::new("stale_stmt").await;
    let client = db.client().await;
    let q = QueueName::new("jobs").unwrap();
    client.create(&q).await.unwrap();
    let ids = client
        .send_batch(&q, &[json!(1), json!(2), json!(3)])
        .await
        .unwrap();
    assert_eq!(client.delete_batch(&q, &ids[..1]).await.unwrap(), ids[..1]);
    let opts = ReadOptions::new(Duration::from_secs(0)).qty(10);
    assert_eq!(
        client
            .read_from_raw(&q, ReadFrom::Start, &opts)
            .await
            .unwrap()
            .len(),
        2
    );

    let admin = common::raw_to(&db.dsn()).await;
    admin
        .batch_execute(&format!(
            "{RESHAPE_DELETE}; ALTER TABLE pgmq.q_jobs ALTER COLUMN headers TYPE json"
        ))
        .await
        .unwrap();

    // Both kinds of cached statement: a Stmt and a text on the queue table.
    assert_eq!(
        client.delete_batch(&q, &ids[1..2]).await.unwrap(),
        ids[1..2]
    );
    let left = client
        .read_from_raw(&q, ReadFrom::Start, &opts)
        .await
        .unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].msg_id, ids[2]);

    // In a transaction the stale statement cannot be run again (the error
    // aborted it), but it is forgotten: the call after it works.
    admin
        .batch_execute("ALTER TABLE pgmq.q_jobs ALTER COLUMN headers TYPE jsonb")
        .await
        .unwrap();
    let mut conn = client.connection().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    let err = Pgmq::on(&tx)
        .read_from_raw(&q, ReadFrom::Start, &opts)
        .await
        .unwrap_err();
    assert_eq!(
        err.sqlstate(),
        Some(&pgmq_client::reexports::tokio_postgres::error::SqlState::FEATURE_NOT_SUPPORTED),
        "{err:?}"
    );
    tx.rollback().await.unwrap();
    let left = Pgmq::on(&*conn)
        .read_from_raw(&q, ReadFrom::Start, &opts)
        .await
        .unwrap();
    assert_eq!(left.len(), 1);
}
