//! Upgrading the pgmq_sdk schema from every earlier version: a database
//! left at version N (its migrations applied as the install applied them,
//! with the state a running fleet leaves in them) is brought to the
//! current version by `install_sdk_schema`, and what the upgrade promises
//! to carry over is still there: a deduplication key taken before stays
//! taken for the rest of its window, answering with its message's id; a
//! paused queue stays paused, with its reason; a worker's presence row
//! stays listed. Every feature then works on the upgraded schema.

mod common;

use std::time::Duration;

use pgmq_client::{DedupKey, FleetLimit, QueueName, ReadOptions};
use serde_json::json;

use common::OwnDb;

/// Each version's migration, as the install applies them (version `i + 1`
/// is `MIGRATIONS[i]`); the list must follow `sdk_schema::VERSION`.
const MIGRATIONS: &[&str] = &[
    include_str!("../sql/pgmq_sdk_v1.sql"),
    include_str!("../sql/pgmq_sdk_v2.sql"),
    include_str!("../sql/pgmq_sdk_v3.sql"),
    include_str!("../sql/pgmq_sdk_v4.sql"),
    include_str!("../sql/pgmq_sdk_v5.sql"),
    include_str!("../sql/pgmq_sdk_v6.sql"),
    include_str!("../sql/pgmq_sdk_v7.sql"),
    include_str!("../sql/pgmq_sdk_v8.sql"),
    include_str!("../sql/pgmq_sdk_v9.sql"),
    include_str!("../sql/pgmq_sdk_v10.sql"),
    include_str!("../sql/pgmq_sdk_v11.sql"),
];

#[test]
fn every_version_is_listed_here() {
    assert_eq!(
        MIGRATIONS.len(),
        pgmq_client::sdk_schema::VERSION as usize,
        "add the new migration to MIGRATIONS"
    );
}

/// Leaves the database at `version`: its migrations applied in one
/// transaction, each recorded in `pgmq_sdk.schema_version`, then the state
/// that version keeps for queue `orders`: key `k` taken for an hour by
/// message `msg_id`, the queue paused for "before the upgrade", and (from
/// version 7) a worker's presence row.
async fn leave_at(raw: &tokio_postgres::Client, version: usize, msg_id: i64) {
    let mut script = String::from("BEGIN;\nSET LOCAL search_path = pg_catalog, pg_temp;\n");
    for (i, m) in MIGRATIONS.iter().take(version).enumerate() {
        script.push_str(m);
        script.push_str(&format!(
            "\nINSERT INTO pgmq_sdk.schema_version (version) VALUES ({});\n",
            i + 1
        ));
    }
    script.push_str("COMMIT;\n");
    raw.batch_execute(&script).await.unwrap();
    raw.batch_execute(
        "CREATE TEMP VIEW pgmq_sdk_upgrade_relid AS SELECT 'pgmq.q_orders'::regclass::oid AS oid",
    )
    .await
    .unwrap();
    if version == 1 {
        raw.execute(
            "INSERT INTO pgmq_sdk.send_keys (scope, key, result, sent_at, expires_at) \
             VALUES ('queue:orders', 'k', $1, now(), now() + interval '1 hour')",
            &[&msg_id],
        )
        .await
        .unwrap();
        raw.batch_execute(
            "INSERT INTO pgmq_sdk.paused_queues (queue_name, reason) \
             VALUES ('orders', 'before the upgrade')",
        )
        .await
        .unwrap();
        return;
    }
    let keys = if version < 11 {
        "INSERT INTO pgmq_sdk.queue_keys (queue_relid, key, msg_id, sent_at, expires_at) \
         SELECT oid, 'k', $1, now(), now() + interval '1 hour' FROM pgmq_sdk_upgrade_relid"
    } else {
        "INSERT INTO pgmq_sdk.queue_keys (queue_relid, key, msg_id, expires_at) \
         SELECT oid, 'k', $1, now() + interval '1 hour' FROM pgmq_sdk_upgrade_relid"
    };
    raw.execute(keys, &[&msg_id]).await.unwrap();
    raw.batch_execute(
        "INSERT INTO pgmq_sdk.paused (queue_relid, queue_name, reason) \
         SELECT oid, 'orders', 'before the upgrade' FROM pgmq_sdk_upgrade_relid",
    )
    .await
    .unwrap();
    if version >= 7 {
        raw.batch_execute(
            "INSERT INTO pgmq_sdk.workers (worker_id, queue_relid, queue_name, host, pid, \
             concurrency, claimed, acked, failed, claims_per_sec, acks_per_sec, paused, limited, \
             started_at, seen_at) \
             SELECT 'w-before', oid, 'orders', 'h', 1, 1, 0, 0, 0, 0, 0, false, false, now(), now() \
             FROM pgmq_sdk_upgrade_relid",
        )
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn every_earlier_version_upgrades_keeping_its_state() {
    let current = pgmq_client::sdk_schema::VERSION as usize;
    for version in 1..current {
        let db = OwnDb::new(&format!("sdk_up{version}")).await;
        let client = db.client().await;
        let q = QueueName::new("orders").unwrap();
        client.create(&q).await.unwrap();
        let first = client.send(&q, &json!({"first": true})).await.unwrap();
        let raw = common::raw_to(&db.dsn()).await;
        leave_at(&raw, version, first).await;
        assert_eq!(
            client.sdk_schema_version().await.unwrap(),
            version as i32,
            "left at {version}"
        );

        let done = client.install_sdk_schema().await.unwrap();
        assert_eq!((done.before, done.now), (version as i32, current as i32));

        // The key taken before the upgrade still answers with its message.
        let key = DedupKey::new("k", Duration::from_secs(60));
        let again = client.send_keyed(&q, &key, &json!(2)).await.unwrap();
        assert!(again.duplicate, "from {version}: the key was lost");
        assert_eq!(again.msg_id, first, "from {version}");
        // The queue is still paused, for the same reason.
        assert!(client.is_paused(&q).await.unwrap(), "from {version}");
        let paused = client.paused_queues().await.unwrap();
        assert_eq!(
            paused[0].reason.as_deref(),
            Some("before the upgrade"),
            "from {version}"
        );
        if version >= 7 {
            let n: i64 = raw
                .query_one(
                    "SELECT count(*) FROM pgmq_sdk.workers WHERE worker_id = 'w-before'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(n, 1, "from {version}: the presence row was lost");
        }

        // Every feature works on the upgraded schema.
        let fresh = DedupKey::new("fresh", Duration::from_secs(60));
        assert!(
            !client
                .send_keyed(&q, &fresh, &json!(3))
                .await
                .unwrap()
                .duplicate
        );
        let batch = client
            .send_batch_keyed(
                &q,
                &["a", "b", "fresh"],
                Duration::from_secs(60),
                &[json!(4), json!(5), json!(6)],
                &Default::default(),
            )
            .await
            .unwrap();
        assert_eq!(
            batch.iter().map(|s| s.duplicate).collect::<Vec<_>>(),
            [false, false, true],
            "from {version}"
        );
        assert!(client.resume(&q).await.unwrap(), "from {version}");
        let opts = ReadOptions::new(Duration::from_secs(30)).qty(10);
        let got = client
            .read_limited_raw(&q, &FleetLimit::max_running(2), &opts)
            .await
            .unwrap();
        assert_eq!(got.len(), 2, "from {version}: the limit's places");
        let again = client.install_sdk_schema().await.unwrap();
        assert!(
            again.repaired.is_empty(),
            "from {version}: {:?}",
            again.repaired
        );
    }
}
