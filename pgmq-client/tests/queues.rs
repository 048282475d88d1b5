//! Queue management: create (plain, unlogged, partitioned), drop, purge,
//! list, metrics; missing queues; invalid names.

mod common;

use std::time::Duration;

use pgmq_client::ReadOptions;
use pgmq_client::{Client, ClientBuilder, ConnectionManager, Error, Message, QueueName};
use serde_json::{json, Value};

use common::{scalar, Queues};

const VT: Duration = Duration::from_secs(30);

async fn relpersistence(pg: &tokio_postgres::Client, q: &QueueName) -> String {
    let c: i8 = scalar(
        pg,
        "SELECT relpersistence FROM pg_class WHERE oid = to_regclass($1)",
        &[&q.table()],
    )
    .await;
    (c as u8 as char).to_string()
}

#[tokio::test]
async fn create_is_idempotent_and_listed() {
    let client = common::client().await;
    let qs = Queues::new();
    let pg = common::raw().await;
    let q = qs.fresh(&client, "create").await;
    client.create(&q).await.unwrap();
    assert!(client.queue_exists(&q).await.unwrap());
    let info = client
        .list_queues()
        .await
        .unwrap()
        .into_iter()
        .find(|i| i.queue_name == q.as_str())
        .expect("listed");
    assert!(!info.is_partitioned && !info.is_unlogged);
    assert_eq!(relpersistence(&pg, &q).await, "p");
    // The archive table exists too.
    let a: Option<String> =
        scalar(&pg, "SELECT to_regclass($1)::text", &[&q.archive_table()]).await;
    assert!(a.is_some());
}

#[tokio::test]
async fn create_unlogged() {
    let client = common::client().await;
    let qs = Queues::new();
    let pg = common::raw().await;
    let q = qs.name("unlogged");
    client.create_unlogged(&q).await.unwrap();
    let info = client
        .list_queues()
        .await
        .unwrap()
        .into_iter()
        .find(|i| i.queue_name == q.as_str())
        .expect("listed");
    assert!(info.is_unlogged && !info.is_partitioned);
    assert_eq!(relpersistence(&pg, &q).await, "u");
    let id = client.send(&q, &json!({"u": 1})).await.unwrap();
    let got: Vec<Message> = common::ok(client.read(&q, VT, 1).await.unwrap());
    assert_eq!(common::ids(&got), [id]);
    assert!(client.drop_queue(&q).await.unwrap());
}

#[tokio::test]
async fn create_partitioned_when_pg_partman_is_installed() {
    let client = common::client().await;
    let pg = common::raw().await;
    let partman: Option<String> = pg
        .query_opt(
            "SELECT extversion FROM pg_extension WHERE extname = 'pg_partman'",
            &[],
        )
        .await
        .unwrap()
        .map(|r| r.get(0));
    let Some(version) = partman else {
        eprintln!(
            "SKIPPED create_partitioned: the pg_partman extension is not installed in the test \
             database (run scripts/install-partman.sh as root, then scripts/db-start.sh)"
        );
        return;
    };
    eprintln!("pg_partman {version}");
    let qs = Queues::new();
    let q = qs.name("part");
    client
        .create_partitioned(&q, "10000", "100000")
        .await
        .unwrap();
    let info = client
        .list_queues()
        .await
        .unwrap()
        .into_iter()
        .find(|i| i.queue_name == q.as_str())
        .expect("listed");
    assert!(info.is_partitioned);
    let parts: i64 = scalar(
        &pg,
        "SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass($1)",
        &[&q.table()],
    )
    .await;
    assert!(parts >= 1, "pg_partman made partitions");
    let ids = client
        .send_batch(&q, &[json!(1), json!(2), json!(3)])
        .await
        .unwrap();
    let got: Vec<Message> = common::ok(client.read(&q, VT, 3).await.unwrap());
    assert_eq!(got.len(), 3);
    assert!(client.archive(&q, ids[0]).await.unwrap());
    assert_eq!(client.delete_batch(&q, &ids[1..]).await.unwrap().len(), 2);
    let m = client.metrics(&q).await.unwrap();
    assert_eq!((m.queue_length, m.total_messages), (0, 3));
    assert!(client.drop_queue(&q).await.unwrap());
    let config: i64 = scalar(
        &pg,
        "SELECT count(*) FROM partman.part_config WHERE parent_table = $1",
        &[&q.table()],
    )
    .await;
    assert_eq!(config, 0, "drop_queue removed the pg_partman config");
}

#[tokio::test]
async fn drop_queue_removes_tables_and_a_missing_queue_is_false() {
    let client = common::client().await;
    let qs = Queues::new();
    let pg = common::raw().await;
    let q = qs.fresh(&client, "drop").await;
    client.send(&q, &1).await.unwrap();
    // Deprecated by PGMQ and a no-op there: the call works and changes nothing.
    client.detach_archive(&q).await.unwrap();
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 1);
    assert!(client.drop_queue(&q).await.unwrap());
    assert!(!client.queue_exists(&q).await.unwrap());
    let t: Option<String> = scalar(&pg, "SELECT to_regclass($1)::text", &[&q.table()]).await;
    assert_eq!(t, None);
    assert!(!client.drop_queue(&q).await.unwrap(), "already gone");
    assert!(!client.drop_queue(&qs.name("never")).await.unwrap());
}

#[tokio::test]
async fn purge_returns_the_count() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "purge").await;
    assert_eq!(client.purge_queue(&q).await.unwrap(), 0);
    client
        .send_batch(&q, &(0..25).collect::<Vec<i32>>())
        .await
        .unwrap();
    assert_eq!(client.purge_queue(&q).await.unwrap(), 25);
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 0);
    // The queue still works.
    client.send(&q, &1).await.unwrap();
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 1);
}

#[tokio::test]
async fn metrics_and_metrics_all() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "metrics").await;
    let empty = client.metrics(&q).await.unwrap();
    assert_eq!(empty.queue_name, q.as_str());
    assert_eq!(
        (
            empty.queue_length,
            empty.queue_visible_length,
            empty.total_messages
        ),
        (0, 0, 0)
    );
    assert_eq!(empty.oldest_msg_age_sec, None);
    client
        .send_batch(&q, &[json!(1), json!(2), json!(3)])
        .await
        .unwrap();
    let _: Vec<Message> = common::ok(client.read(&q, VT, 1).await.unwrap());
    let ids: Vec<i64> = client
        .pop_raw(&q, 1)
        .await
        .unwrap()
        .iter()
        .map(|m| m.msg_id)
        .collect();
    assert_eq!(ids.len(), 1);
    let m = client.metrics(&q).await.unwrap();
    assert_eq!(m.queue_length, 2);
    assert_eq!(m.queue_visible_length, 1);
    assert_eq!(m.total_messages, 3);
    assert!(m.oldest_msg_age_sec.unwrap() >= 0);
    assert!(m.newest_msg_age_sec.unwrap() <= m.oldest_msg_age_sec.unwrap());
    let all = client.metrics_all().await.unwrap();
    let mine = all
        .iter()
        .find(|x| x.queue_name == q.as_str())
        .expect("in metrics_all");
    assert_eq!(mine.queue_length, 2);
    // Every queue of list_queues is in metrics_all, modulo concurrent tests.
    assert!(!all.is_empty());
}

/// `metrics_all` on the pool survives queues being dropped while it runs.
#[tokio::test]
async fn metrics_all_while_queues_are_dropped() {
    let client = common::client().await;
    let qs = Queues::new();
    let dropper = client.clone();
    let names: Vec<QueueName> = (0..20).map(|_| qs.name("churn")).collect();
    for q in &names {
        client.create(q).await.unwrap();
    }
    let churn = tokio::spawn(async move {
        for q in &names {
            dropper.drop_queue(q).await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    while !churn.is_finished() {
        client.metrics_all().await.expect("metrics_all on the pool");
    }
    churn.await.unwrap();
}

#[tokio::test]
async fn calls_on_a_missing_queue_are_queue_not_found() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.name("missing");
    let errs: Vec<(&str, Error)> = vec![
        ("send", client.send(&q, &1).await.unwrap_err()),
        (
            "send_batch",
            client.send_batch(&q, &[1, 2]).await.unwrap_err(),
        ),
        ("read", client.read::<Value>(&q, VT, 1).await.unwrap_err()),
        (
            "read_where",
            client
                .read_with::<Value>(&q, &ReadOptions::new(VT).qty(1).filter(json!({"a": 1})))
                .await
                .unwrap_err(),
        ),
        (
            "read_with_poll",
            client
                .read_with::<Value>(
                    &q,
                    &ReadOptions::new(VT)
                        .qty(1)
                        .poll(Duration::from_secs(1), Duration::from_millis(10)),
                )
                .await
                .unwrap_err(),
        ),
        ("pop", client.pop::<Value>(&q, 1).await.unwrap_err()),
        ("delete", client.delete(&q, 1).await.unwrap_err()),
        (
            "delete_batch",
            client.delete_batch(&q, &[1]).await.unwrap_err(),
        ),
        ("archive", client.archive(&q, 1).await.unwrap_err()),
        (
            "archive_batch",
            client.archive_batch(&q, &[1]).await.unwrap_err(),
        ),
        (
            "set_vt",
            client.set_vt(&q, 1, Duration::ZERO).await.unwrap_err(),
        ),
        (
            "set_vt_batch",
            client
                .set_vt_batch(&q, &[1], Duration::ZERO)
                .await
                .unwrap_err(),
        ),
        ("purge_queue", client.purge_queue(&q).await.unwrap_err()),
        ("metrics", client.metrics(&q).await.unwrap_err()),
        (
            "read_grouped",
            client
                .read_grouped::<Value>(&q, Default::default(), &ReadOptions::new(VT).qty(1))
                .await
                .unwrap_err(),
        ),
        (
            "enable_notify_insert",
            client
                .enable_notify_insert(&q, Duration::ZERO)
                .await
                .unwrap_err(),
        ),
        (
            "update_notify_insert",
            client
                .update_notify_insert(&q, Duration::ZERO)
                .await
                .unwrap_err(),
        ),
        (
            "bind_topic",
            client.bind_topic("a.b", &q).await.unwrap_err(),
        ),
    ];
    for (call, err) in errs {
        match &err {
            Error::QueueNotFound { queue } => assert_eq!(queue, q.as_str(), "{call}"),
            other => panic!("{call}: expected QueueNotFound, got {other:?}"),
        }
        assert_eq!(
            err.outcome(),
            pgmq_client::CommitOutcome::Rejected,
            "{call}"
        );
        assert!(!err.is_transient(), "{call}");
        assert!(err.to_string().contains(q.as_str()), "{call}: {err}");
    }
    // Nothing was created on the way.
    assert!(!client.queue_exists(&q).await.unwrap());
}

#[tokio::test]
async fn invalid_names_are_refused_before_any_sql() {
    let pg = common::raw().await;
    let before = common::meta_names(&pg).await;
    let long = "a".repeat(48);
    let bad = [
        "",
        "x'; DROP TABLE pgmq.meta; --",
        "q\"; select 1; --",
        "a;b",
        "a--b",
        "a$b",
        "tab\tname",
        "new\nline",
        "ünïcode",
        "nul\0byte",
        long.as_str(),
    ];
    for name in bad {
        let err = QueueName::new(name).unwrap_err();
        assert!(
            matches!(err, Error::InvalidQueueName { .. }),
            "{name:?}: {err:?}"
        );
        assert_eq!(err.outcome(), pgmq_client::CommitOutcome::NotSent);
        assert!(name.parse::<QueueName>().is_err());
        assert!(serde_json::from_value::<QueueName>(json!(name)).is_err());
    }
    // 47 characters is PGMQ's limit, and it works end to end.
    let client = common::client().await;
    let qs = Queues::new();
    let max = QueueName::new(&format!("t_max_{}", "m".repeat(41))).unwrap();
    assert_eq!(max.as_str().len(), 47);
    let _ = client.drop_queue(&max).await;
    qs.name("unused"); // keeps the guard's drop path exercised
    client.create(&max).await.unwrap();
    client.send(&max, &1).await.unwrap();
    assert!(client.drop_queue(&max).await.unwrap());
    // pgmq.meta holds what it held (other tests may add or drop their own
    // queues meanwhile, but none of the bad names).
    let after = common::meta_names(&pg).await;
    for name in bad {
        assert!(!after.iter().any(|n| n == name), "{name:?}");
    }
    assert!(!after.iter().any(|n| n.contains("drop table")));
    assert!(before.iter().all(|n| !n.contains(';')));
}

/// A pool built by the caller (bb8) works the same, and PGMQ is checked on it.
#[tokio::test]
async fn from_a_callers_pool() {
    let builder = ClientBuilder::new(&common::dsn());
    let pool = bb8::Pool::builder()
        .max_size(2)
        .build_unchecked(ConnectionManager::new(
            builder.pg_config().unwrap(),
            builder.make_tls().unwrap(),
        ));
    let client = Client::from_pool(pool).await.unwrap();
    assert!(client.install().is_some());
    let qs = Queues::new();
    let q = qs.fresh(&client, "frompool").await;
    let id = client.send(&q, &1).await.unwrap();
    assert!(client.delete(&q, id).await.unwrap());
    let none = Client::from_pool(
        bb8::Pool::builder()
            .max_size(1)
            .build_unchecked(ConnectionManager::new(
                ClientBuilder::new(&common::dsn_for("pgmq_none"))
                    .pg_config()
                    .unwrap(),
                builder.make_tls().unwrap(),
            )),
    )
    .await
    .unwrap_err();
    assert!(matches!(none, Error::PgmqMissing { .. }), "{none:?}");
}

/// The queue table's `autovacuum_*` storage parameters, sorted.
async fn autovacuum_options(client: &Client, q: &QueueName) -> Vec<String> {
    let mut settings = client.queue_table_autovacuum(q).await.unwrap().settings;
    settings.sort();
    settings
}

/// `QUEUE_TABLE_AUTOVACUUM` as the catalog lists it, sorted.
fn sdk_autovacuum() -> Vec<String> {
    let mut want: Vec<String> = pgmq_client::QUEUE_TABLE_AUTOVACUUM
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    want.sort();
    want
}

#[tokio::test]
async fn create_gives_the_queue_table_autovacuum_settings_and_keeps_an_operators() {
    let client = common::client().await;
    let qs = Queues::new();
    let pg = common::raw().await;
    let q = qs.fresh(&client, "autovac").await;
    let t = client.queue_table_autovacuum(&q).await.unwrap();
    assert!(t.caller_owns && !t.partitioned, "{t:?}");
    assert_eq!(autovacuum_options(&client, &q).await, sdk_autovacuum());
    // The archive only grows by inserts: left at the server's settings.
    let archive: Option<Vec<String>> = scalar(
        &pg,
        "SELECT reloptions FROM pg_class WHERE oid = to_regclass($1)",
        &[&q.archive_table()],
    )
    .await;
    assert_eq!(archive, None);

    // An operator's own setting survives creating the queue again...
    let table = q.quoted_table();
    pg.batch_execute(&format!(
        "ALTER TABLE {table} RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_cost_delay); \
         ALTER TABLE {table} SET (autovacuum_vacuum_threshold = 5000)"
    ))
    .await
    .unwrap();
    client.create(&q).await.unwrap();
    assert_eq!(
        autovacuum_options(&client, &q).await,
        ["autovacuum_vacuum_threshold=5000"]
    );
    // ... until tune_autovacuum replaces it.
    let tuned = client.tune_autovacuum(&q).await.unwrap();
    assert_eq!(tuned.table, q.table());
    assert_eq!(autovacuum_options(&client, &q).await, sdk_autovacuum());

    // A table with none (a queue made before, or by another client) gets
    // them from a create.
    pg.batch_execute(&format!(
        "ALTER TABLE {table} RESET (autovacuum_vacuum_scale_factor, \
         autovacuum_vacuum_threshold, autovacuum_vacuum_cost_delay)"
    ))
    .await
    .unwrap();
    assert!(autovacuum_options(&client, &q).await.is_empty());
    client.create(&q).await.unwrap();
    assert_eq!(autovacuum_options(&client, &q).await, sdk_autovacuum());

    // Unlogged queues too.
    let u = qs.name("autovac_unlogged");
    client.create_unlogged(&u).await.unwrap();
    assert_eq!(autovacuum_options(&client, &u).await, sdk_autovacuum());

    let missing = qs.name("autovac_missing");
    assert!(matches!(
        client.tune_autovacuum(&missing).await,
        Err(Error::QueueNotFound { .. })
    ));
}

/// `queue_table_rows` counts the dead row versions acknowledgements leave,
/// and `vacuum_queue` clears them; both refuse a queue that does not exist.
#[tokio::test]
async fn vacuum_queue_clears_the_dead_rows_the_statistics_count() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "vacuum").await;
    let ids = client.send_batch(&q, &[1u64; 200]).await.unwrap();
    client.delete_batch(&q, &ids).await.unwrap();
    // Each backend reports its counts about once a second.
    let mut rows = client.queue_table_rows(&q).await.unwrap();
    for _ in 0..100 {
        if rows.dead >= 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        rows = client.queue_table_rows(&q).await.unwrap();
    }
    assert!(rows.dead >= 200, "{rows:?}");
    // A vacuum ran (one that found the table held by autovacuum skipped it:
    // try again). What it removed depends on the snapshots other sessions
    // hold, so the count of vacuums is what is checked.
    let pg = common::raw().await;
    let count = "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = to_regclass($1)";
    let before: i64 = scalar(&pg, count, &[&q.quoted_table()]).await;
    let mut vacuumed = false;
    for _ in 0..50 {
        client.vacuum_queue(&q).await.unwrap();
        if scalar::<i64>(&pg, count, &[&q.quoted_table()]).await > before {
            vacuumed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(vacuumed, "the queue table was never vacuumed");

    let missing = qs.name("vacuum_missing");
    assert!(matches!(
        client.queue_table_rows(&missing).await,
        Err(Error::QueueNotFound { .. })
    ));
    assert!(matches!(
        client.vacuum_queue(&missing).await,
        Err(Error::QueueNotFound { .. })
    ));
}
