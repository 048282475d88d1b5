//! The PGMQ 1.13 functions wrapped last: create_non_partitioned,
//! convert_archive_partitioned, create_fifo_indexes_all, validate_queue_name,
//! format_table_name, validate_routing_key, validate_topic_pattern and
//! acquire_queue_lock.

mod common;

use pgmq_client::{Error, Pgmq};

async fn index_count(pg: &tokio_postgres::Client, table: &str) -> i64 {
    pg.query_one(
        "SELECT count(*) FROM pg_indexes WHERE schemaname = 'pgmq' AND tablename = $1",
        &[&table],
    )
    .await
    .unwrap()
    .get(0)
}

/// In a database of its own: `create_fifo_indexes_all` builds an index on
/// every queue of the database, and CREATE INDEX waits for every
/// transaction on a table (a grouped read polling for 20 s, in another
/// test) while the other test's writes queue behind it.
#[tokio::test]
async fn create_non_partitioned_and_fifo_indexes_on_every_queue() {
    let db = common::OwnDb::new("fifo_all").await;
    let client = db.client().await;
    let pg = common::raw_to(&db.dsn()).await;
    let q = pgmq_client::QueueName::new("nonpart").unwrap();
    client.create_non_partitioned(&q).await.unwrap();
    assert!(client.queue_exists(&q).await.unwrap());
    let before = index_count(&pg, &format!("q_{}", q.as_str())).await;
    client.create_fifo_indexes_all().await.unwrap();
    assert_eq!(
        index_count(&pg, &format!("q_{}", q.as_str())).await,
        before + 1
    );
    let fifo: i64 = pg
        .query_one(
            "SELECT count(*) FROM pg_indexes WHERE schemaname = 'pgmq' AND indexname = $1",
            &[&format!("q_{}_fifo_idx", q.as_str())],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(fifo, 1);
}

#[tokio::test]
async fn convert_archive_partitioned_with_pg_partman() {
    let client = common::client().await;
    let pg = common::raw().await;
    let qs = common::Queues::new();
    let q = qs.fresh(&client, "convarch").await;
    let partman = pg
        .query_opt(
            "SELECT 1 FROM pg_extension WHERE extname = 'pg_partman'",
            &[],
        )
        .await
        .unwrap()
        .is_some();
    let res = client
        .convert_archive_partitioned(&q, "10000", "100000", 10)
        .await;
    if !partman {
        let e = res.unwrap_err();
        assert!(matches!(e, Error::Database { .. }), "{e:?}");
        eprintln!("SKIPPED the partitioned half: pg_partman is not installed");
        return;
    }
    res.unwrap();
    let kind: String = pg
        .query_one(
            "SELECT c.relkind::text FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'pgmq' AND c.relname = $1",
            &[&format!("a_{}", q.as_str())],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(kind, "p", "the archive is partitioned");
    // A second call leaves it as it is.
    client
        .convert_archive_partitioned(&q, "10000", "100000", 10)
        .await
        .unwrap();
    // Archiving still works.
    let id = client.send(&q, &serde_json::json!(1)).await.unwrap();
    assert!(client.archive(&q, id).await.unwrap());
    pg.batch_execute(&format!("DROP TABLE IF EXISTS {}_old", q.archive_table()))
        .await
        .unwrap();
}

#[tokio::test]
async fn pgmq_checks_of_names_keys_and_patterns() {
    let client = common::client().await;
    client.validate_queue_name("orders").await.unwrap();
    let e = client
        .validate_queue_name(&"x".repeat(48))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Database { .. }), "{e:?}");
    assert_eq!(
        client.format_table_name("Orders", "q").await.unwrap(),
        "q_orders"
    );
    assert!(client.format_table_name("a;b", "q").await.is_err());
    assert!(client
        .validate_routing_key("orders.eu.created")
        .await
        .unwrap());
    assert!(client
        .validate_routing_key("orders..created")
        .await
        .is_err());
    assert!(client
        .validate_topic_pattern("orders.*.created")
        .await
        .unwrap());
    assert!(client.validate_topic_pattern("").await.is_err());
}

#[tokio::test]
async fn acquire_queue_lock_holds_until_the_transaction_ends() {
    let client = common::client().await;
    let other = common::raw().await;
    let q = common::unique("qlock");
    let try_lock = "SELECT pg_try_advisory_xact_lock(hashtext('pgmq.queue_' || $1))";
    let mut conn = client.connection().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    Pgmq::on(&tx).acquire_queue_lock(&q).await.unwrap();
    let free: bool = other
        .query_one(try_lock, &[&q.as_str()])
        .await
        .unwrap()
        .get(0);
    assert!(!free, "held by the transaction");
    tx.commit().await.unwrap();
    let free: bool = other
        .query_one(try_lock, &[&q.as_str()])
        .await
        .unwrap()
        .get(0);
    assert!(free, "released at commit");
}
