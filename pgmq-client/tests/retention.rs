//! Archive retention against the real database: what an age and a count
//! keep, the lock that lets one process prune a queue at a time, and
//! several pruners at once pruning each row once and never a young one.

mod common;

use std::time::Duration;

use pgmq_client::{ArchiveRetention, Client, QueueName};
use serde_json::json;

use common::Queues;

/// Archives `n` messages of `q`; the first `old` of them backdated by ten
/// days. Their msg_ids.
async fn archived(client: &Client, q: &QueueName, n: usize, old: usize) -> Vec<i64> {
    let bodies: Vec<_> = (0..n).map(|i| json!({ "i": i })).collect();
    let mut ids = Vec::new();
    for chunk in bodies.chunks(1000) {
        ids.extend(client.send_batch(q, chunk).await.unwrap());
    }
    for chunk in ids.chunks(1000) {
        client.archive_batch(q, chunk).await.unwrap();
    }
    let pg = common::raw().await;
    pg.execute(
        &format!(
            "UPDATE {} SET archived_at = archived_at - interval '10 days' WHERE msg_id = ANY($1)",
            q.quoted_archive_table()
        ),
        &[&ids[..old].to_vec()],
    )
    .await
    .unwrap();
    ids
}

/// The msg_ids left in `q`'s archive.
async fn left(q: &QueueName) -> Vec<i64> {
    common::archive_rows(&common::raw().await, q)
        .await
        .iter()
        .map(|r| r.0)
        .collect()
}

const WEEK: Duration = Duration::from_secs(7 * 86_400);

/// An age keeps the young rows; a count keeps the newest; both together
/// keep what either keeps.
#[tokio::test]
async fn an_age_and_a_count_each_keep_their_rows() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "ret_rules").await;
    let ids = archived(&client, &q, 10, 6).await;

    // Both: old (first 6) and not among the newest 7 (the last 7): 3 go.
    let both = ArchiveRetention::older_than(WEEK).keep(7).batch(2);
    let done = client.apply_retention(&q, &both).await.unwrap();
    assert_eq!((done.pruned, done.busy), (3, false));
    assert_eq!(left(&q).await, ids[3..]);

    // The age alone: the other 3 old ones go, the 4 young stay.
    let age = ArchiveRetention::older_than(WEEK);
    assert_eq!(client.apply_retention(&q, &age).await.unwrap().pruned, 3);
    assert_eq!(left(&q).await, ids[6..]);

    // The count alone: all but the newest 2, young or not.
    let count = ArchiveRetention::keeping(2);
    assert_eq!(client.apply_retention(&q, &count).await.unwrap().pruned, 2);
    assert_eq!(left(&q).await, ids[8..]);
    // The queue itself is untouched.
    assert_eq!(common::queue_rows(&common::raw().await, &q).await.len(), 0);
}

/// While another session holds the queue's retention lock, a prune deletes
/// nothing and says it was busy.
#[tokio::test]
async fn a_prune_finding_the_lock_taken_deletes_nothing() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "ret_busy").await;
    archived(&client, &q, 5, 5).await;
    let mut holder = common::raw().await;
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('pgmq archive retention ' || $1::text, 0))",
        &[&q.as_str()],
    )
    .await
    .unwrap();
    let done = client
        .apply_retention(&q, &ArchiveRetention::older_than(WEEK))
        .await
        .unwrap();
    assert_eq!((done.pruned, done.busy), (0, true));
    assert_eq!(left(&q).await.len(), 5);
    tx.rollback().await.unwrap();
    let done = client
        .apply_retention(&q, &ArchiveRetention::older_than(WEEK))
        .await
        .unwrap();
    assert_eq!((done.pruned, done.busy), (5, false));
}

/// Four pruners (each its own pool, so its own sessions) on one archive at
/// once, in small batches, each running until it is done or finds another
/// pruning: together they delete every old row once (their counts add up
/// to the old rows) and no young one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruners_at_once_prune_each_row_once_and_never_a_young_one() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "ret_fleet").await;
    // Young and old rows interleaved by msg_id: every other one is old.
    let ids = archived(&client, &q, 3000, 0).await;
    let old: Vec<i64> = ids.iter().copied().step_by(2).collect();
    common::raw()
        .await
        .execute(
            &format!(
                "UPDATE {} SET archived_at = archived_at - interval '10 days' WHERE msg_id = ANY($1)",
                q.quoted_archive_table()
            ),
            &[&old],
        )
        .await
        .unwrap();
    let policy = ArchiveRetention::older_than(WEEK).batch(20);
    let mut runs = Vec::new();
    for _ in 0..4 {
        let (q, policy) = (q.clone(), policy.clone());
        let c = common::client().await;
        runs.push(tokio::spawn(async move {
            let mut pruned = 0;
            loop {
                let done = c.apply_retention(&q, &policy).await.unwrap();
                pruned += done.pruned;
                if !done.busy {
                    return pruned;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }));
    }
    let mut total = 0;
    for r in runs {
        total += r.await.unwrap();
    }
    let young: Vec<i64> = ids.iter().copied().skip(1).step_by(2).collect();
    assert_eq!(
        left(&q).await,
        young,
        "a young row was pruned or an old one left"
    );
    assert_eq!(total, old.len() as u64, "the pruners' counts do not add up");
}
