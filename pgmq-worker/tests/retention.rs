//! The retention task against the real database: two tasks (each with its
//! own pool) on the same archive prune the old rows, each once, and leave
//! the young ones; both stop when cancelled.

mod common;

use std::time::Duration;

use pgmq_client::{ArchiveRetention, Client};
use pgmq_worker::{run_retention, RetentionConfig};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use common::{client, dsn, unique, Queues};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_retention_tasks_prune_old_rows_once_and_keep_young_ones() {
    let direct = client().await;
    let q = unique("retention");
    let _g = Queues::new(&direct, &[&q]).await;
    let bodies: Vec<_> = (0..400).map(|i| json!({ "i": i })).collect();
    let ids = direct.send_batch(&q, &bodies).await.unwrap();
    direct.archive_batch(&q, &ids).await.unwrap();
    let old: Vec<i64> = ids.iter().copied().filter(|id| id % 3 != 0).collect();
    let (pg, conn) = tokio_postgres::connect(&dsn(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    pg.execute(
        &format!(
            "UPDATE {} SET archived_at = archived_at - interval '2 days' WHERE msg_id = ANY($1)",
            q.quoted_archive_table()
        ),
        &[&old],
    )
    .await
    .unwrap();
    let config = RetentionConfig::new(
        vec![q.clone()],
        ArchiveRetention::older_than(Duration::from_secs(86_400)).batch(10),
    )
    .every(Duration::from_millis(50));
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let c = Client::connect(&dsn()).await.unwrap();
        tasks.push(tokio::spawn(run_retention(c, config.clone(), stop.clone())));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let left = loop {
        let left: Vec<i64> = pg
            .query(
                &format!(
                    "SELECT msg_id FROM {} ORDER BY msg_id",
                    q.quoted_archive_table()
                ),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        if left.len() <= ids.len() - old.len() || tokio::time::Instant::now() > deadline {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    stop.cancel();
    let mut total = 0;
    for t in tasks {
        total += tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .expect("a retention task did not stop when cancelled")
            .unwrap();
    }
    let young: Vec<i64> = ids.iter().copied().filter(|id| id % 3 == 0).collect();
    assert_eq!(left, young);
    assert_eq!(total, old.len() as u64);
}
