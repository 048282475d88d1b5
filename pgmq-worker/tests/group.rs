//! Many queues in one process: two workers with different message types and
//! settings run as one group on one pool and one LISTEN connection, wake on
//! notifications, report per queue, and stop together.

mod common;

use std::time::{Duration, Instant};

use common::{client, queue_len, unique, wait_for, Queues};
use pgmq_client::Message;
use pgmq_worker::{Outcome, WakeUp, Worker, WorkerGroup};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
struct Email {
    to: String,
}

#[derive(Deserialize)]
struct Invoice {
    id: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_runs_two_queues_on_one_listen_connection() {
    let client = client().await;
    let (qa, qb) = (unique("grp_mail"), unique("grp_inv"));
    let _g = Queues::new(&client, &[&qa, &qb]).await;
    let emails: Worker<Email> = Worker::builder(client.clone(), qa.clone())
        .wake_up(WakeUp::Notify)
        .notify_throttle(Duration::ZERO)
        .poll_interval(Duration::from_secs(30))
        .handler(|m: Message<Email>| async move {
            assert!(m.body.to.contains('@'));
            Ok(Outcome::Delete)
        })
        .build()
        .unwrap();
    let invoices: Worker<Invoice> = Worker::builder(client.clone(), qb.clone())
        .concurrency(2)
        .wake_up(WakeUp::Notify)
        .notify_throttle(Duration::ZERO)
        .poll_interval(Duration::from_secs(30))
        .handler(|m: Message<Invoice>| async move {
            assert!(m.body.id > 0);
            Ok(Outcome::Archive)
        })
        .build()
        .unwrap();
    let group = WorkerGroup::new(client.clone())
        .with_worker(emails)
        .with_worker(invoices);
    let monitors = group.monitors();
    let stop = group.shutdown_handle();
    let running = tokio::spawn(group.run_until(std::future::pending::<()>()));

    // Both idle after their first read, with one LISTEN connection between them.
    let conn = client.connection().await.unwrap();
    wait_for(
        Duration::from_secs(10),
        "one listener on both channels",
        || async {
            let listeners: i64 = conn
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            monitors.iter().all(|(_, m)| m.stats().empty_reads >= 1) && listeners >= 1
        },
    )
    .await;
    let listeners: Vec<String> = conn
        .query(
            "SELECT query FROM pg_stat_activity WHERE query LIKE 'LISTEN %'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .filter(|q: &String| q.contains(qa.as_str()) || q.contains(qb.as_str()))
        .collect();
    assert_eq!(
        listeners.len(),
        1,
        "one LISTEN connection for the group: {listeners:?}"
    );

    // Woken by notifications, well inside the 30 s poll interval.
    let sent = Instant::now();
    client
        .send(&qa, &json!({"to": "ada@example.com"}))
        .await
        .unwrap();
    client.send(&qb, &json!({"id": 7})).await.unwrap();
    client.send(&qb, &json!({"id": 8})).await.unwrap();
    wait_for(Duration::from_secs(10), "both queues handled", || async {
        monitors[0].1.stats().deleted == 1 && monitors[1].1.stats().archived == 2
    })
    .await;
    assert!(sent.elapsed() < Duration::from_secs(10));

    stop.graceful();
    let reports = running.await.unwrap().unwrap();
    assert_eq!(reports.len(), 2);
    assert_eq!(reports[0].stats.deleted, 1);
    assert_eq!(reports[1].stats.archived, 2);
    assert_eq!(
        queue_len(&client, &qa).await + queue_len(&client, &qb).await,
        0
    );
}

/// A member that cannot start stops the whole group at once: `run_until`
/// returns that member's error instead of serving the other queues until a
/// signal that may never come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_cannot_start_stops_the_group() {
    let client = client().await;
    let (served, missing) = (unique("grp_ok"), unique("grp_missing"));
    let _g = Queues::new(&client, &[&served]).await;
    let ok: Worker<Email> = Worker::builder(client.clone(), served.clone())
        .poll_interval(Duration::from_millis(50))
        .handler(|_m: Message<Email>| async move { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    // `missing` is never created: this worker's start-up check fails.
    let broken: Worker<Invoice> = Worker::builder(client.clone(), missing.clone())
        .handler(|_m: Message<Invoice>| async move { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let group = WorkerGroup::new(client.clone())
        .with_worker(ok)
        .with_worker(broken);
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        group.run_until(std::future::pending::<()>()),
    )
    .await
    .expect("the group kept running with a member that could not start");
    let err = result.expect_err("the group reported success");
    assert!(
        err.to_string().contains(missing.as_str()),
        "the error names the missing queue: {err}"
    );
}
