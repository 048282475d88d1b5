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
        std::thread::sleep(Duration::from_millis(
            rand::thread_rng().gen_range(100..400),
        ));
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
