//! A call made while the server is down goes through once the server is
//! back, without waiting out the pool's timeout; with the server down past
//! that timeout, it fails with `PoolTimeout` at the timeout.
//!
//! Runs on its own throwaway cluster on port 55461 (never the shared 55432),
//! started, killed (`pg_ctl stop -m immediate`), started again and removed
//! by this test.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use pgmq_client::{Client, Error, QueueName};

const PORT: &str = "55461";

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `scripts/<script> <args>` against this test's cluster; returns stdout.
async fn db_script(script: &str, args: &[&str]) -> String {
    let out = tokio::process::Command::new("bash")
        .arg(workspace().join("scripts").join(script))
        .args(args)
        .env("PGMQ_DB_PORT", PORT)
        .current_dir(workspace())
        .output()
        .await
        .expect("bash runs");
    assert!(
        out.status.success(),
        "{script} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Removes the cluster when the test ends, even when it fails.
struct ClusterGuard;

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(workspace().join("scripts/db-stop.sh"))
            .env("PGMQ_DB_PORT", PORT)
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_through_an_outage_goes_through_when_the_server_is_back() {
    let dsn = db_script("db-start.sh", &[]).await;
    let dsn = dsn.lines().last().unwrap().to_owned();
    let _cluster = ClusterGuard;
    assert!(dsn.contains(PORT), "{dsn}");

    // A pool timeout far longer than the outage: a call that only got a
    // connection when its timeout ran out would fail with PoolTimeout.
    let client = Client::builder(&dsn)
        .pool_timeout(Duration::from_secs(60))
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let q = QueueName::new(&format!("outage_{}", std::process::id())).unwrap();
    client.create(&q).await.unwrap();
    client.send(&q, &serde_json::json!({"n": 1})).await.unwrap();

    db_script("db-ctl.sh", &["kill"]).await;
    // The call starts while nothing listens on the port: every connection
    // attempt it causes is refused until the server is started again.
    let call = {
        let (client, q) = (client.clone(), q.clone());
        tokio::spawn(async move {
            let t = Instant::now();
            (client.metrics(&q).await, t.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !call.is_finished(),
        "the call ended while the server was down"
    );
    db_script("db-ctl.sh", &["start"]).await;
    let (res, took) = call.await.unwrap();
    let metrics = res.unwrap_or_else(|e| panic!("after {took:?}: {e:?}"));
    assert_eq!(metrics.queue_length, 1);
    println!("the call went through after {took:?}");

    // Down past the pool's timeout: PoolTimeout, at that timeout.
    let short = Client::builder(&dsn)
        .pool_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    db_script("db-ctl.sh", &["kill"]).await;
    let t = Instant::now();
    let res = tokio::time::timeout(Duration::from_secs(30), short.metrics(&q))
        .await
        .expect("a call must end at its pool timeout");
    let took = t.elapsed();
    assert!(matches!(res, Err(Error::PoolTimeout)), "{res:?}");
    assert!(took >= Duration::from_secs(2), "ended after {took:?}");
    db_script("db-ctl.sh", &["start"]).await;
    client.drop_queue(&q).await.unwrap();
}
