//! Every call inside a transaction: rolled back (nothing changed) and
//! committed (everything changed), through this crate's own transaction
//! (`Connection::transaction`, cached statements) and through a caller's own
//! `tokio_postgres::Transaction` (`Pgmq::on(&tx)`).

mod common;

use std::time::Duration;

use chrono::Utc;
use pgmq_client::ReadOptions;
use pgmq_client::{
    Client, Delay, Executor, GroupStrategy, Message, Pgmq, QueueName, RawJson, SendOptions,
    FIFO_GROUP_HEADER,
};
use serde_json::{json, Value};

use common::{fetch, Queues};

/// Queues made (and committed) before the transaction.
struct Fixture {
    main: QueueName,
    main_ids: Vec<i64>,
    purge: QueueName,
    dropme: QueueName,
    notify_on: QueueName,
    notify_off: QueueName,
    topic_q: QueueName,
    fifo: QueueName,
    new_plain: QueueName,
    new_unlogged: QueueName,
    key: String,
}

async fn fixture(client: &Client, qs: &Queues) -> Fixture {
    let main = qs.fresh(client, "tx_main").await;
    let bodies: Vec<Value> = (0..8)
        .map(|i| {
            if i < 2 {
                json!({"n": i, "kind": "x"})
            } else {
                json!({"n": i})
            }
        })
        .collect();
    let main_ids = client.send_batch(&main, &bodies).await.unwrap();
    let purge = qs.fresh(client, "tx_purge").await;
    client
        .send_batch(&purge, &[json!(1), json!(2), json!(3)])
        .await
        .unwrap();
    let dropme = qs.fresh(client, "tx_drop").await;
    let notify_on = qs.fresh(client, "tx_non").await;
    let notify_off = qs.fresh(client, "tx_noff").await;
    client
        .enable_notify_insert(&notify_off, Duration::ZERO)
        .await
        .unwrap();
    let topic_q = qs.fresh(client, "tx_topic").await;
    // A routing-key prefix no other test binds.
    let key = format!("k{}", topic_q.as_str());
    client
        .bind_topic(&format!("{key}.old"), &topic_q)
        .await
        .unwrap();
    let fifo = qs.fresh(client, "tx_fifo").await;
    let headers: Vec<Value> = ["a", "a", "b"]
        .iter()
        .map(|g| json!({ FIFO_GROUP_HEADER: g }))
        .collect();
    client
        .send_batch_with(
            &fifo,
            &[1, 2, 3],
            &pgmq_client::SendOptions::new().headers_each(headers.to_vec()),
        )
        .await
        .unwrap();
    Fixture {
        main,
        main_ids,
        purge,
        dropme,
        notify_on,
        notify_off,
        topic_q,
        fifo,
        new_plain: qs.name("tx_newp"),
        new_unlogged: qs.name("tx_newu"),
        key,
    }
}

/// Everything about the fixture's queues that the calls can change.
#[derive(Debug, PartialEq)]
struct Snapshot {
    meta: Vec<(String, bool)>,
    rows: Vec<(String, i64, i32, String, Value, Option<Value>)>,
    throttles: Vec<(String, i32)>,
    triggers: Vec<String>,
    bindings: Vec<(String, String)>,
    indexes: Vec<String>,
}

async fn snapshot(pg: &tokio_postgres::Client, fx: &Fixture) -> Snapshot {
    let names: Vec<&str> = [
        &fx.main,
        &fx.purge,
        &fx.dropme,
        &fx.notify_on,
        &fx.notify_off,
        &fx.topic_q,
        &fx.fifo,
        &fx.new_plain,
        &fx.new_unlogged,
    ]
    .iter()
    .map(|q| q.as_str())
    .collect();
    let meta = fetch(
        pg,
        "SELECT queue_name, is_unlogged FROM pgmq.meta WHERE queue_name = ANY($1) ORDER BY 1",
        &[&names],
        |r| (r.get(0), r.get(1)),
    )
    .await;
    let mut rows = Vec::new();
    for q in [&fx.main, &fx.purge, &fx.topic_q, &fx.fifo] {
        for table in [q.table(), q.archive_table()] {
            let sql = format!(
                "SELECT msg_id, read_ct, vt::text, message, headers FROM {table} ORDER BY msg_id"
            );
            let t = &table;
            rows.extend(
                fetch(pg, &sql, &[], |r| {
                    (t.clone(), r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))
                })
                .await,
            );
        }
    }
    let throttles = fetch(
        pg,
        "SELECT queue_name::text, throttle_interval_ms FROM pgmq.notify_insert_throttle \
         WHERE queue_name = ANY($1) ORDER BY 1",
        &[&names],
        |r| (r.get(0), r.get(1)),
    )
    .await;
    let tables: Vec<String> = names.iter().map(|n| format!("q_{n}")).collect();
    let triggers = fetch(
        pg,
        "SELECT c.relname::text FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid \
         WHERE NOT t.tgisinternal AND c.relname = ANY($1) ORDER BY 1",
        &[&tables],
        |r| r.get(0),
    )
    .await;
    let bindings = fetch(
        pg,
        "SELECT pattern, queue_name FROM pgmq.topic_bindings WHERE queue_name = ANY($1) ORDER BY 1, 2",
        &[&names],
        |r| (r.get(0), r.get(1)),
    )
    .await;
    let indexes = fetch(
        pg,
        "SELECT indexname::text FROM pg_indexes WHERE schemaname = 'pgmq' AND tablename = $1 ORDER BY 1",
        &[&format!("q_{}", fx.fifo.as_str())],
        |r| r.get(0),
    )
    .await;
    Snapshot {
        meta,
        rows,
        throttles,
        triggers,
        bindings,
        indexes,
    }
}

/// Runs every call of the client on `pg` (inside the caller's transaction),
/// checking what each returns, including that reads see the transaction's own
/// uncommitted changes.
///
/// `sp` is the same transaction, for savepoints.
async fn exercise<E: Executor>(pg: &Pgmq<E>, fx: &Fixture, sp: &tokio_postgres::Transaction<'_>) {
    let vt = Duration::from_secs(30);
    let m = &fx.main_ids;

    // Queues.
    pg.create(&fx.new_plain).await.unwrap();
    pg.create_unlogged(&fx.new_unlogged).await.unwrap();
    assert!(pg.queue_exists(&fx.new_plain).await.unwrap());
    let listed = pg.list_queues().await.unwrap();
    let unlogged = listed
        .iter()
        .find(|i| i.queue_name == fx.new_unlogged.as_str())
        .expect("the new queue is listed inside the transaction");
    assert!(unlogged.is_unlogged);
    assert_eq!(pg.metrics(&fx.new_plain).await.unwrap().queue_length, 0);
    assert!(metrics_all_in_tx(pg, sp)
        .await
        .iter()
        .any(|x| x.queue_name == fx.new_plain.as_str()));
    assert_eq!(pg.purge_queue(&fx.purge).await.unwrap(), 3);
    assert!(pg.drop_queue(&fx.dropme).await.unwrap());
    assert!(!pg.queue_exists(&fx.dropme).await.unwrap());

    // Sending.
    let id = pg.send(&fx.main, &json!({"n": 100})).await.unwrap();
    assert!(id > *m.last().unwrap());
    let opts = SendOptions::new()
        .headers(json!({"h": 1}))
        .delay(Duration::from_secs(5));
    pg.send_with(&fx.main, &json!({"n": 101}), &opts)
        .await
        .unwrap();
    assert_eq!(
        pg.send_batch(
            &fx.main,
            &[json!({"n": 102}), json!({"n": 103}), json!({"n": 104})]
        )
        .await
        .unwrap()
        .len(),
        3
    );
    let later = Utc::now() + chrono::Duration::hours(1);
    let hs = [json!({"i": 0}), json!({"i": 1})];
    let delayed = pg
        .send_batch_with(
            &fx.main,
            &[json!({"n": 105}), json!({"n": 106})],
            &pgmq_client::SendOptions::new()
                .headers_each(hs.to_vec())
                .delay(later),
        )
        .await
        .unwrap();
    assert_eq!(delayed.len(), 2);

    // Reading.
    let r: Vec<Message> = common::ok(pg.read(&fx.main, vt, 1).await.unwrap());
    assert_eq!(common::ids(&r), [m[0]]);
    let r: Vec<Message> = common::ok(
        pg.read_with(
            &fx.main,
            &ReadOptions::new(vt).qty(5).filter(json!({"kind": "x"})),
        )
        .await
        .unwrap(),
    );
    assert_eq!(common::ids(&r), [m[1]]);
    let r: Vec<Message> = common::ok(
        pg.read_with(
            &fx.main,
            &ReadOptions::new(vt)
                .qty(1)
                .poll(Duration::from_secs(1), Duration::from_millis(50)),
        )
        .await
        .unwrap(),
    );
    assert_eq!(common::ids(&r), [m[2]]);
    let r: Vec<Message> = common::ok(pg.pop(&fx.main, 1).await.unwrap());
    assert_eq!(common::ids(&r), [m[3]]);
    let r: Vec<Message<RawJson>> = pg.read_raw(&fx.main, vt, 1).await.unwrap();
    assert_eq!(common::ids(&r), [m[4]]);

    // Acknowledging.
    assert!(pg.delete(&fx.main, m[5]).await.unwrap());
    assert_eq!(pg.delete_batch(&fx.main, &[m[6]]).await.unwrap(), [m[6]]);
    assert!(pg.archive(&fx.main, m[7]).await.unwrap());
    assert_eq!(pg.archive_batch(&fx.main, &[m[0]]).await.unwrap(), [m[0]]);
    let moved = pg
        .set_vt(&fx.main, m[1], Duration::ZERO)
        .await
        .unwrap()
        .expect("m1 exists");
    assert_eq!(moved.body["n"], 1);
    assert_eq!(
        pg.set_vt_batch(&fx.main, &[m[2]], Delay::At(later))
            .await
            .unwrap(),
        [m[2]]
    );

    // Notify.
    pg.enable_notify_insert(&fx.notify_on, Duration::ZERO)
        .await
        .unwrap();
    pg.update_notify_insert(&fx.notify_on, Duration::from_millis(100))
        .await
        .unwrap();
    pg.disable_notify_insert(&fx.notify_off).await.unwrap();
    let throttles = pg.list_notify_insert_throttles().await.unwrap();
    let on = throttles
        .iter()
        .find(|t| t.queue_name == fx.notify_on.as_str())
        .expect("enabled inside the transaction");
    assert_eq!(on.throttle_interval_ms, 100);
    assert!(!throttles
        .iter()
        .any(|t| t.queue_name == fx.notify_off.as_str()));

    // Topics.
    let key = &fx.key;
    pg.bind_topic(&format!("{key}.*"), &fx.topic_q)
        .await
        .unwrap();
    let routes = pg.test_routing(&format!("{key}.a")).await.unwrap();
    assert_eq!(routes.len(), 1);
    assert_eq!(routes[0].queue_name, fx.topic_q.as_str());
    assert_eq!(
        pg.send_topic(&format!("{key}.a"), &json!({"t": 1}))
            .await
            .unwrap(),
        1
    );
    let sent = pg
        .send_batch_topic(&format!("{key}.a"), &[json!({"t": 2}), json!({"t": 3})])
        .await
        .unwrap();
    assert_eq!(sent.len(), 2);
    assert!(sent.iter().all(|(q, _)| q == fx.topic_q.as_str()));
    let bound = pg.list_topic_bindings(Some(&fx.topic_q)).await.unwrap();
    assert_eq!(bound.len(), 2);
    assert!(pg
        .unbind_topic(&format!("{key}.old"), &fx.topic_q)
        .await
        .unwrap());

    // FIFO.
    pg.create_fifo_index(&fx.fifo).await.unwrap();
    let r: Vec<Message> = common::ok(
        pg.read_grouped(&fx.fifo, GroupStrategy::Head, &ReadOptions::new(vt).qty(10))
            .await
            .unwrap(),
    );
    assert_eq!(r.len(), 2, "heads of groups a and b");
    let r: Vec<Message> = common::ok(
        pg.read_grouped(
            &fx.fifo,
            GroupStrategy::RoundRobin,
            &ReadOptions::new(vt)
                .qty(10)
                .poll(Duration::from_secs(1), Duration::from_millis(50)),
        )
        .await
        .unwrap(),
    );
    assert!(r.is_empty(), "both groups have a message in flight");
}

/// `metrics_all` inside a transaction, under a savepoint that is rolled back
/// afterwards: it only reads, and rolling back to the savepoint releases the
/// share lock it took on every queue table of the database (held to the end
/// of the transaction otherwise, blocking other sessions' purges and drops).
/// PGMQ's `metrics_all` fails (42P01) when another session drops a queue
/// while it runs; then it is repeated.
async fn metrics_all_in_tx<E: Executor>(
    pg: &Pgmq<E>,
    sp: &tokio_postgres::Transaction<'_>,
) -> Vec<pgmq_client::QueueMetrics> {
    for _ in 0..10 {
        sp.batch_execute("SAVEPOINT metrics_all").await.unwrap();
        let res = pg.metrics_all().await;
        sp.batch_execute("ROLLBACK TO SAVEPOINT metrics_all")
            .await
            .unwrap();
        match res {
            Ok(m) => return m,
            Err(e) if e.sqlstate().map(|c| c.code()) == Some("42P01") => {}
            Err(e) => panic!("metrics_all: {e:?}"),
        }
    }
    panic!("metrics_all kept failing");
}

/// The exercises take turns, also across processes (nextest runs each test
/// in its own): each one's transaction purges and drops queues (exclusive
/// locks) and runs `metrics_all` (a share lock on every queue table); two at
/// once could deadlock, as they would in production.
async fn my_turn() -> tokio_postgres::Client {
    common::advisory_lock("pgmq-client tests: transactions.rs exercise").await
}

/// What a committed `exercise` leaves behind.
async fn check_committed(pg: &tokio_postgres::Client, client: &Client, fx: &Fixture) {
    let m = &fx.main_ids;
    let names = common::meta_names(pg).await;
    assert!(names.contains(&fx.new_plain.as_str().to_owned()));
    assert!(names.contains(&fx.new_unlogged.as_str().to_owned()));
    assert!(!names.contains(&fx.dropme.as_str().to_owned()));

    let rows = common::queue_rows(pg, &fx.main).await;
    let left: Vec<i64> = rows.iter().map(|r| r.0).filter(|id| *id <= m[7]).collect();
    assert_eq!(left, [m[1], m[2], m[4]]);
    assert_eq!(rows.len(), 3 + 7, "seven messages were sent");
    let archived: Vec<i64> = common::archive_rows(pg, &fx.main)
        .await
        .iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(archived, [m[0], m[7]]);
    // m1's visibility was reset to now, m2's moved an hour ahead, m4 was read.
    let visible: Vec<Message> = common::ok(
        client
            .read_with(
                &fx.main,
                &ReadOptions::new(Duration::from_secs(30))
                    .qty(10)
                    .filter(json!({"n": 1})),
            )
            .await
            .unwrap(),
    );
    assert_eq!(common::ids(&visible), [m[1]]);
    assert_eq!(rows.iter().find(|r| r.0 == m[4]).unwrap().1, 1);

    assert_eq!(client.metrics(&fx.purge).await.unwrap().queue_length, 0);

    let throttles = client.list_notify_insert_throttles().await.unwrap();
    assert!(throttles
        .iter()
        .any(|t| t.queue_name == fx.notify_on.as_str() && t.throttle_interval_ms == 100));
    assert!(!throttles
        .iter()
        .any(|t| t.queue_name == fx.notify_off.as_str()));

    let patterns: Vec<String> = client
        .list_topic_bindings(Some(&fx.topic_q))
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.pattern)
        .collect();
    assert_eq!(patterns, [format!("{}.*", fx.key)]);
    assert_eq!(common::queue_rows(pg, &fx.topic_q).await.len(), 3);

    let idx: i64 = pg
        .query_one(
            "SELECT count(*) FROM pg_indexes WHERE schemaname = 'pgmq' AND tablename = $1",
            &[&format!("q_{}", fx.fifo.as_str())],
        )
        .await
        .unwrap()
        .get(0);
    assert!(idx >= 2, "the FIFO index was added");
}

#[tokio::test]
async fn cached_transaction_rolls_back_every_call() {
    let client = common::client().await;
    let qs = Queues::new();
    let _turn = my_turn().await;
    let fx = fixture(&client, &qs).await;
    let pg = common::raw().await;
    let before = snapshot(&pg, &fx).await;

    let mut conn = client.connection().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    exercise(&Pgmq::on(&tx), &fx, &tx).await;
    tx.rollback().await.unwrap();

    assert_eq!(snapshot(&pg, &fx).await, before);
    // The connection is fine afterwards, and its cached statements still work.
    let id = Pgmq::on(&conn).send(&fx.main, &json!({})).await.unwrap();
    assert!(Pgmq::on(&conn).delete(&fx.main, id).await.unwrap());
}

#[tokio::test]
async fn cached_transaction_commits_every_call() {
    let client = common::client().await;
    let qs = Queues::new();
    let _turn = my_turn().await;
    let fx = fixture(&client, &qs).await;
    let pg = common::raw().await;

    let mut conn = client.connection().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    exercise(&Pgmq::on(&tx), &fx, &tx).await;
    tx.commit().await.unwrap();
    drop(conn);

    check_committed(&pg, &client, &fx).await;
}

#[tokio::test]
async fn callers_transaction_rolls_back_every_call() {
    let client = common::client().await;
    let qs = Queues::new();
    let _turn = my_turn().await;
    let fx = fixture(&client, &qs).await;
    let pg = common::raw().await;
    let before = snapshot(&pg, &fx).await;

    let mut own = common::raw().await;
    let tx = own.transaction().await.unwrap();
    exercise(&Pgmq::on(&tx), &fx, &tx).await;
    // Dropping a tokio_postgres transaction rolls it back too; be explicit.
    tx.rollback().await.unwrap();

    assert_eq!(snapshot(&pg, &fx).await, before);
}

#[tokio::test]
async fn callers_transaction_commits_every_call() {
    let client = common::client().await;
    let qs = Queues::new();
    let _turn = my_turn().await;
    let fx = fixture(&client, &qs).await;
    let pg = common::raw().await;

    let mut own = common::raw().await;
    let tx = own.transaction().await.unwrap();
    exercise(&Pgmq::on(&tx), &fx, &tx).await;
    tx.commit().await.unwrap();

    check_committed(&pg, &client, &fx).await;
}

/// The outbox pattern: the caller's row and the message commit together, or
/// neither does.
#[tokio::test]
async fn outbox_row_and_message_are_atomic() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "outbox").await;
    let mut own = common::raw().await;
    let table = format!("t_{}", q.as_str());
    own.batch_execute(&format!("CREATE TABLE {table} (id int)"))
        .await
        .unwrap();

    for commit in [false, true] {
        let tx = own.transaction().await.unwrap();
        tx.execute(&format!("INSERT INTO {table} VALUES (1)"), &[])
            .await
            .unwrap();
        Pgmq::on(&tx).send(&q, &json!({"row": 1})).await.unwrap();
        if commit {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
        let rows: i64 = own
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .unwrap()
            .get(0);
        let msgs = client.metrics(&q).await.unwrap().queue_length;
        assert_eq!((rows, msgs), if commit { (1, 1) } else { (0, 0) });
    }
    own.batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}

/// An error inside a transaction aborts it (PostgreSQL semantics) and is typed.
#[tokio::test]
async fn error_in_transaction_is_typed_and_rolls_back() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "txerr").await;
    let missing = qs.name("txerr_missing");
    let mut conn = client.connection().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    Pgmq::on(&tx).send(&q, &1).await.unwrap();
    let err = Pgmq::on(&tx).send(&missing, &1).await.unwrap_err();
    assert!(
        matches!(err, pgmq_client::Error::QueueNotFound { .. }),
        "{err:?}"
    );
    // The transaction is aborted now: the next statement is refused (25P02).
    let err = Pgmq::on(&tx).send(&q, &2).await.unwrap_err();
    assert_eq!(err.sqlstate().map(|s| s.code()), Some("25P02"), "{err:?}");
    tx.rollback().await.unwrap();
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 0);
}

/// The caller's own SQL next to PGMQ calls: `?` turns its errors into this
/// crate's, classified the same way (a server error keeps its SQLSTATE and is
/// not transient; a lost connection is transient).
#[tokio::test]
async fn own_sql_errors_convert_with_their_classification() {
    let client = common::client().await;
    let mut conn = client.connection().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    let own = async { tx.execute("SELECT no_such_column", &[]).await };
    let err: pgmq_client::Error = own.await.unwrap_err().into();
    assert!(
        matches!(err, pgmq_client::Error::Database { .. }),
        "{err:?}"
    );
    assert_eq!(err.sqlstate().map(|s| s.code()), Some("42703"), "{err:?}");
    assert!(!err.is_transient());
    tx.rollback().await.unwrap();

    // The server ends this session: the connection is lost.
    let err: pgmq_client::Error = conn
        .execute("SELECT pg_terminate_backend(pg_backend_pid())", &[])
        .await
        .unwrap_err()
        .into();
    assert!(
        matches!(err, pgmq_client::Error::ConnectionLost { .. }),
        "{err:?}"
    );
    assert!(err.is_transient());
}

/// A batch of 1,000 inside a transaction: seen by the transaction itself,
/// gone after a rollback, all there after a commit.
#[tokio::test]
async fn a_thousand_in_a_transaction() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "tx_1000").await;
    let bodies: Vec<Value> = (0..1000).map(|i| json!({ "i": i })).collect();
    let mut conn = client.connection().await.unwrap();
    for commit in [false, true] {
        let tx = conn.transaction().await.unwrap();
        let pg = Pgmq::on(&tx);
        let ids = pg.send_batch(&q, &bodies).await.unwrap();
        assert_eq!(ids.len(), 1000);
        assert_eq!(pg.metrics(&q).await.unwrap().queue_length, 1000);
        let read: Vec<Message> =
            common::ok(pg.read(&q, Duration::from_secs(30), 1000).await.unwrap());
        assert_eq!(read.len(), 1000);
        assert_eq!(
            pg.set_vt_batch(&q, &ids, Duration::ZERO)
                .await
                .unwrap()
                .len(),
            1000
        );
        if commit {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
        let m = client.metrics(&q).await.unwrap();
        let expected = if commit { 1000 } else { 0 };
        assert_eq!(
            (m.queue_length, m.queue_visible_length),
            (expected, expected)
        );
    }
}
