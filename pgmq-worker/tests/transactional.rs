//! Transactional completion: a handler's row and its message's delete
//! commit together. Workers are killed at random points, up to
//! `MAX_KILLS` times (their runtime dropped at once: every task ends and
//! every connection closes, as when the process dies). After each kill,
//! once the server has ended the killed worker's sessions, rows plus queued
//! messages are exactly the messages sent; at least one kill must leave
//! messages it had claimed undone (the kill interrupted work); and at the
//! end every message's row exists exactly once and the queue is empty.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{dsn, queue_len, unique, InsertRow};
use pgmq_client::{Client, QueueName};
use pgmq_worker::Worker;
use rand::Rng;
use serde_json::{json, Value};

const MESSAGES: i64 = 200;
const MAX_KILLS: usize = 15;

async fn worker(q: &QueueName, table: &str, app: &str) -> Worker<Value> {
    let client = Client::builder(&dsn())
        .max_size(12)
        .application_name(app)
        .connect()
        .await
        .unwrap();
    Worker::builder(client, q.clone())
        .concurrency(4)
        .visibility_timeout(Duration::from_secs(1))
        .poll_interval(Duration::from_millis(20))
        // Up to 40 ms per message with 4 handlers: a run until the kill
        // (at most 400 ms) cannot drain the queue, so kills land mid-work.
        .transactional_handler(InsertRow {
            table: table.to_owned(),
            pause_ms: 40,
        })
        .build()
        .unwrap()
}

/// The rows table and the queue, read in one statement (one snapshot, so a
/// handler's row and its message's delete are seen together or not at all).
struct Snapshot {
    rows: i64,
    /// Each queued message's `read_ct`, by id.
    reads: HashMap<i64, i32>,
}

async fn snapshot(client: &Client, q: &QueueName, table: &str) -> Snapshot {
    let conn = client.connection().await.unwrap();
    let row = conn
        .query_one(
            &format!(
                "SELECT (SELECT count(*) FROM {table}), \
                        coalesce(array_agg(msg_id), '{{}}'), \
                        coalesce(array_agg(read_ct), '{{}}') \
                 FROM {}",
                q.table()
            ),
            &[],
        )
        .await
        .unwrap();
    let ids: Vec<i64> = row.get(1);
    let reads: Vec<i32> = row.get(2);
    Snapshot {
        rows: row.get(0),
        reads: ids.into_iter().zip(reads).collect(),
    }
}

/// Waits (at most 30 s) until a message queued in `before` has a higher
/// `read_ct` and is still in the queue: claimed, not yet completed.
async fn claimed_since(client: &Client, q: &QueueName, table: &str, before: &Snapshot) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        let now = snapshot(client, q, table).await;
        let claimed = now
            .reads
            .iter()
            .any(|(id, read_ct)| before.reads.get(id).is_some_and(|b| read_ct > b));
        if claimed {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until the server has ended every session of the killed worker, so
/// that each of its transactions has committed or rolled back.
async fn sessions_ended(client: &Client, app: &str) {
    common::wait_for(
        Duration::from_secs(30),
        "the killed worker's sessions ended",
        || async {
            let conn = client.connection().await.unwrap();
            let n: i64 = conn
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                    &[&app],
                )
                .await
                .unwrap()
                .get(0);
            n == 0
        },
    )
    .await;
}

#[test]
fn every_row_exists_exactly_once_with_workers_killed_at_random_points() {
    let main = tokio::runtime::Runtime::new().unwrap();
    let (client, q, table) = main.block_on(async {
        let client = Client::connect(&dsn()).await.unwrap();
        let q = unique("txdone");
        client.create(&q).await.unwrap();
        let table = format!("public.rows_{}", q.as_str());
        {
            let conn = client.connection().await.unwrap();
            conn.batch_execute(&format!("CREATE TABLE {table} (msg_id bigint NOT NULL)"))
                .await
                .unwrap();
        }
        let msgs: Vec<Value> = (0..MESSAGES).map(|n| json!({ "n": n })).collect();
        client.send_batch(&q, &msgs).await.unwrap();
        (client, q, table)
    });
    let killed_app = format!("killed_{}", q.as_str());

    let mut kills = 0;
    let mut interrupting_kills = 0;
    let mut before = main.block_on(snapshot(&client, &q, &table));
    while kills < MAX_KILLS && !before.reads.is_empty() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (q2, t2, app2) = (q.clone(), table.clone(), killed_app.clone());
        rt.spawn(async move {
            let w = worker(&q2, &t2, &app2).await;
            let _ = w.run_until(std::future::pending::<()>()).await;
        });
        // Kill while the worker holds claimed work: wait (however loaded the
        // machine) until a message it claimed is still queued, then let it
        // run a random moment longer.
        main.block_on(claimed_since(&client, &q, &table, &before));
        std::thread::sleep(Duration::from_millis(rand::thread_rng().gen_range(0..100)));
        // The kill: every task dropped where it stands, every connection closed.
        rt.shutdown_background();
        kills += 1;
        main.block_on(sessions_ended(&client, &killed_app));
        let after = main.block_on(snapshot(&client, &q, &table));
        assert_eq!(
            after.rows + after.reads.len() as i64,
            MESSAGES,
            "after kill {kills}: a row without its delete, or a delete without its row"
        );
        // A message still queued whose read_ct rose was claimed by the
        // killed worker and not completed: the kill interrupted it.
        let interrupted = after
            .reads
            .iter()
            .filter(|&(id, read_ct)| before.reads.get(id).is_some_and(|b| read_ct > b))
            .count();
        if interrupted > 0 {
            interrupting_kills += 1;
        }
        before = after;
    }
    assert!(
        interrupting_kills >= 1,
        "no kill of {kills} interrupted claimed work"
    );
    // What the killed workers left comes back after its visibility timeout:
    // a last worker, stopped gracefully, drains it.
    main.block_on(async {
        let handle = worker(&q, &table, &format!("drain_{}", q.as_str()))
            .await
            .spawn();
        common::wait_for(Duration::from_secs(60), "the queue drained", || async {
            queue_len(&client, &q).await == 0
        })
        .await;
        handle.shutdown().await.unwrap();
        let conn = client.connection().await.unwrap();
        let dup: i64 = conn
            .query_one(
                &format!(
                    "SELECT count(*) FROM (SELECT msg_id FROM {table} GROUP BY msg_id HAVING count(*) <> 1) d"
                ),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let distinct: i64 = conn
            .query_one(&format!("SELECT count(DISTINCT msg_id) FROM {table}"), &[])
            .await
            .unwrap()
            .get(0);
        println!(
            "{kills} kills, {interrupting_kills} interrupting claimed work; \
             {distinct} rows, {dup} ids not exactly once"
        );
        assert_eq!(dup, 0, "a message's row was committed twice");
        assert_eq!(distinct, MESSAGES, "a message's row is missing");
        conn.batch_execute(&format!("DROP TABLE {table}")).await.unwrap();
        client.drop_queue(&q).await.unwrap();
    });
}

/// A transactional handler that sleeps, then records its message in the
/// ledger table in the worker's transaction.
struct SlowLedger {
    table: String,
    sleep: Duration,
}

impl pgmq_worker::TransactionalHandler<Value> for SlowLedger {
    async fn handle(
        &self,
        msg: pgmq_client::Message<Value>,
        tx: &pgmq_client::Transaction<'_>,
        _ctx: pgmq_worker::Context,
    ) -> Result<pgmq_worker::Outcome, pgmq_worker::HandlerError> {
        tokio::time::sleep(self.sleep).await;
        tx.execute(
            &format!("INSERT INTO {} (msg_id) VALUES ($1)", self.table),
            &[&msg.msg_id],
        )
        .await?;
        Ok(pgmq_worker::Outcome::Delete)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_too_small_for_the_handlers_uses_no_attempt_and_dead_letters_nothing() {
    // Pool of 3, concurrency 4, handlers sleeping 3 s then writing their
    // row, max_attempts 2, db_timeout 500 ms: handlers that get no
    // connection in time have not run; that must use no attempt, so no
    // message is dead-lettered and every message's row is written once.
    let setup = common::client().await;
    let q = unique("txpool");
    let dlq = unique("txpool_dlq");
    let _g = common::Queues::new(&setup, &[&q, &dlq]).await;
    let ledger = common::Ledger::create(&setup, "ledger", &q).await;
    let bodies: Vec<Value> = (0..12).map(|n| json!({ "n": n })).collect();
    setup.send_batch(&q, &bodies).await.unwrap();
    let client = Client::builder(&dsn()).max_size(3).connect().await.unwrap();
    let worker: Worker<Value> = Worker::builder(client, q.clone())
        .concurrency(4)
        .max_attempts(2)
        .db_timeout(Duration::from_millis(500))
        .poll_interval(Duration::from_millis(50))
        .dead_letter_queue(dlq.clone())
        .allow_small_pool(true)
        .transactional_handler(SlowLedger {
            table: ledger.table.clone(),
            sleep: Duration::from_secs(3),
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    let drained = tokio::time::timeout(Duration::from_secs(120), async {
        while queue_len(&setup, &q).await > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    let (rows, distinct) = ledger.counts_and_drop().await;
    let dead = queue_len(&setup, &dlq).await;
    let s = &report.stats;
    let seen = format!(
        "failed {}, retried {}, dead-lettered {}, tx_unavailable {}",
        s.failed, s.retried, s.dead_lettered, s.tx_unavailable
    );
    assert_eq!(
        dead, 0,
        "no dead letter for a message that never ran: {seen}"
    );
    assert!(drained.is_ok(), "the queue drained: {seen}");
    assert_eq!((rows, distinct), (12, 12), "each row once: {seen}");
    assert_eq!(s.failed, 0, "no attempt used: {seen}");
}

#[tokio::test]
async fn build_refuses_a_pool_that_cannot_hold_the_handlers_transactions() {
    // The defaults: a pool of 10, 8 handlers each holding a connection,
    // plus 2 claimers, 1 flusher and the heartbeat.
    let client = common::client().await;
    let q = unique("txsmall");
    let build = |allow: bool| {
        Worker::<Value>::builder(client.clone(), q.clone())
            .allow_small_pool(allow)
            .transactional_handler(InsertRow {
                table: "unused".into(),
                pause_ms: 0,
            })
            .build()
    };
    match build(false) {
        Err(pgmq_worker::Error::PoolTooSmall { size, needed, .. }) => {
            assert_eq!((size, needed), (10, 12));
        }
        other => panic!("expected PoolTooSmall, got {other:?}"),
    }
    assert!(build(true).is_ok(), "allow_small_pool opts out");
    // A plain handler's tasks give their connections back before waiting:
    // a small pool only slows it.
    let plain = Worker::<Value>::builder(client.clone(), q.clone())
        .handler(|_m: pgmq_client::Message<Value>| async { Ok(pgmq_worker::Outcome::Delete) })
        .build();
    assert!(plain.is_ok());
}
