//! The server crashes (`pg_ctl stop -m immediate`) and comes back while the
//! worker consumes 10,000 messages: every message is handled at least once,
//! none is lost, and the worker resumes by itself.
//!
//! Runs on its own throwaway cluster on port 55435 (never the shared 55432),
//! started and removed by this test. Tests that use that port must not run
//! at once: they take `CLUSTER`.

mod common;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pgmq_client::{Client, Message, QueueName};
use pgmq_testkit::cluster::Cluster;
use pgmq_worker::{Outcome, Worker};
use serde::Deserialize;
use serde_json::json;

const PORT: u16 = 55435;
static CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Removes the cluster when the test ends, even when it fails.
struct ClusterGuard(Cluster);

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        self.0.remove_blocking();
    }
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[derive(Deserialize)]
struct Item {
    id: u32,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_survives_a_server_crash_mid_consume() {
    let _lock = CLUSTER.lock().await;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "pgmq_worker=error".into()),
        )
        .with_test_writer()
        .try_init();
    let t0 = Instant::now();
    let cluster = ClusterGuard(Cluster::new(&workspace(), PORT).unwrap());
    let dsn = cluster.0.start().await.unwrap();

    let client = Client::builder(&dsn)
        .pool_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let q = QueueName::new("restart_test").unwrap();
    let _ = client.drop_queue(&q).await;
    client.create(&q).await.unwrap();
    const N: u32 = 10_000;
    for chunk in (0..N).collect::<Vec<_>>().chunks(1000) {
        let bodies: Vec<_> = chunk.iter().map(|id| json!({ "id": id })).collect();
        client.send_batch(&q, &bodies).await.unwrap();
    }

    let handled = Arc::new(Mutex::new(HashSet::new()));
    let runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (h, r) = (Arc::clone(&handled), Arc::clone(&runs));
    let worker: Worker<Item> = Worker::builder(client.clone(), q.clone())
        .concurrency(4)
        // Short, so messages claimed by reads the crash cut off come back soon.
        .visibility_timeout(Duration::from_secs(3))
        .poll_interval(Duration::from_millis(100))
        .handler(move |m: Message<Item>| {
            let (h, r) = (Arc::clone(&h), Arc::clone(&r));
            async move {
                // Slow enough that the crash lands mid-consume.
                tokio::time::sleep(Duration::from_millis(1)).await;
                h.lock().unwrap().insert(m.body.id);
                r.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();

    let count = |h: &Arc<Mutex<HashSet<u32>>>| h.lock().unwrap().len();
    let start = Instant::now();
    while count(&handled) < 2_000 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "consuming did not start"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let at_crash = count(&handled);
    let started_before = postmaster_start(&client).await;
    println!("consuming after {:?}; crashing", t0.elapsed());
    cluster.0.kill().await.unwrap();
    cluster.0.restart_after_kill().await.unwrap();
    println!("restarted after {:?}", t0.elapsed());
    let after_restart = count(&handled);
    assert!(
        at_crash < N as usize && after_restart < N as usize,
        "the crash came too late"
    );

    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let done = count(&handled) == N as usize;
        if done {
            if let Ok(m) = client.metrics(&q).await {
                if m.queue_length == 0 {
                    break;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} of {N} handled after the restart",
            count(&handled)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("all handled after {:?}", t0.elapsed());
    let report = handle.shutdown().await.unwrap();
    let s = &report.stats;
    println!(
        "crash at {at_crash} handled; runs {} for {N} messages; read errors {}, ack retries {}, acks failed {}",
        runs.load(std::sync::atomic::Ordering::Relaxed),
        s.read_errors,
        s.ack_retries,
        s.acks_failed
    );
    // The server really restarted while messages were left (whether the
    // worker saw an error depends on where its connections were at that
    // instant: one idle in the pool is replaced on checkout unseen).
    let started_after = postmaster_start(&client).await;
    assert!(
        started_after > started_before,
        "the server did not restart ({started_before} then {started_after})"
    );
    assert!(report.handled >= u64::from(N));
    let _ = client.drop_queue(&q).await;
}

/// When the server's postmaster started, in microseconds since the
/// epoch, asked again until the server answers.
async fn postmaster_start(client: &Client) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = async {
            let conn = client.pool().get().await.ok()?;
            let row = conn
                .query_one(
                    "SELECT (extract(epoch FROM pg_postmaster_start_time()) * 1e6)::int8",
                    &[],
                )
                .await
                .ok()?;
            Some(row.get::<_, i64>(0))
        }
        .await;
        if let Some(t) = got {
            return t;
        }
        assert!(Instant::now() < deadline, "the server did not answer");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
