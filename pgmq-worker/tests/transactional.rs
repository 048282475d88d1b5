//! Transactional completion: a handler's row and its message's delete
//! commit together. Workers are killed at random points over many runs
//! (their runtime dropped at once: every task ends and every connection
//! closes, as when the process dies), and still every message's row exists
//! exactly once and the queue ends empty.

mod common;

use std::time::Duration;

use common::{dsn, queue_len, unique, InsertRow};
use pgmq_client::{Client, QueueName};
use pgmq_worker::Worker;
use rand::Rng;
use serde_json::{json, Value};

const MESSAGES: i64 = 200;

async fn worker(q: &QueueName, table: &str) -> Worker<Value> {
    let client = Client::builder(&dsn())
        .max_size(12)
        .connect()
        .await
        .unwrap();
    Worker::builder(client, q.clone())
        .concurrency(4)
        .visibility_timeout(Duration::from_secs(1))
        .poll_interval(Duration::from_millis(20))
        .transactional_handler(InsertRow {
            table: table.to_owned(),
            pause_ms: 5,
        })
        .build()
        .unwrap()
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

    let mut kills = 0;
    for _ in 0..15 {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (q2, t2) = (q.clone(), table.clone());
        rt.spawn(async move {
            let w = worker(&q2, &t2).await;
            let _ = w.run_until(std::future::pending::<()>()).await;
        });
        std::thread::sleep(Duration::from_millis(
            rand::thread_rng().gen_range(100..400),
        ));
        // The kill: every task dropped where it stands, every connection closed.
        rt.shutdown_background();
        kills += 1;
        if main.block_on(queue_len(&client, &q)) == 0 {
            break;
        }
    }
    // What the killed workers left comes back after its visibility timeout:
    // a last worker, stopped gracefully, drains it.
    main.block_on(async {
        let handle = worker(&q, &table).await.spawn();
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
        println!("{kills} kills; {distinct} rows, {dup} ids not exactly once");
        assert_eq!(dup, 0, "a message's row was committed twice");
        assert_eq!(distinct, MESSAGES, "a message's row is missing");
        assert!(kills >= 1);
        conn.batch_execute(&format!("DROP TABLE {table}")).await.unwrap();
        client.drop_queue(&q).await.unwrap();
    });
}
