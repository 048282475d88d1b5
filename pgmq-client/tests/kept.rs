//! The executors of a long-running task: calls on kept connections succeed
//! and an idle owner holds none; a call past its bound fails as a lost
//! connection of unknown outcome, its connection is discarded and its
//! statement cancelled on the server.

mod common;

use std::time::{Duration, Instant};

use common::Queues;
use pgmq_client::{CommitOutcome, ConnectionPool, Error, KeptConnections, Pgmq};

#[tokio::test]
async fn kept_connections_run_calls_and_an_idle_owner_holds_none() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "kept").await;
    let kept = KeptConnections::new(client.clone(), 1, Duration::from_secs(10));
    let pg = Pgmq::on(&kept);
    kept.busy();
    let id = pg.send(&q, &serde_json::json!({"n": 1})).await.unwrap();
    let read = pg.read_raw(&q, Duration::from_secs(30), 10).await.unwrap();
    assert_eq!(read.iter().map(|m| m.msg_id).collect::<Vec<_>>(), [id]);
    assert!(pg.delete(&q, id).await.unwrap());
    kept.idle();
    let state = client.pool().state();
    assert_eq!(state.idle_connections, state.connections, "{state:?}");
}

#[tokio::test]
async fn a_call_past_its_bound_abandons_the_connection_and_its_statement() {
    let client = common::client().await;
    let pool = ConnectionPool::from(client);
    let conn = pool.checkout(Duration::from_secs(10)).await.unwrap();
    let tag = format!("kept-bound-{}", std::process::id());
    let sql = format!("SELECT pg_sleep(60) /* {tag} */");
    let slow = async { Ok(conn.client().simple_query(&sql).await?) };
    let err = conn
        .bounded(Duration::from_millis(300), slow)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::ConnectionLost {
                outcome: CommitOutcome::Unknown,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_transient());
    assert!(conn.is_broken());
    // The cancel request stops the sleep on the server (generous bound: did
    // not hang).
    let watcher = common::raw().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pattern = format!("%{tag}%");
        let running: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE $1 AND state = 'active' AND pid <> pg_backend_pid()",
                &[&pattern],
            )
            .await
            .unwrap()
            .get(0);
        if running == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the abandoned statement still runs"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
