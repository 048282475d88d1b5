//! Fleet controls: idempotent sends, a fleet-wide limit, pause and resume.
//!
//! `cargo run -p pgmq-examples --example fleet_controls` (reads
//! `DATABASE_URL`; default: the docker compose database). It installs the
//! SDK's `pgmq_sdk` schema if needed (what `pgmq install-sdk` does), then:
//!
//! 1. sends 20 orders under deduplication keys, each twice, as a producer
//!    retrying after an unknown outcome would: the queue holds 20;
//! 2. runs a worker whose handlers may run at most 3 at once across every
//!    process started with the same limit;
//! 3. pauses the queue halfway (as `pgmq pause` does from a shell), checks
//!    that nothing is claimed while paused, and resumes it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pgmq_client::{Client, CommitOutcome, DedupKey, FleetLimit, Message, QueueName};
use pgmq_worker::{Outcome, Worker};

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Order {
    id: u32,
}

/// Sends `order` under its key, retrying what may or may not have been
/// stored: the key makes a second store impossible within its window.
async fn send_order(
    client: &Client,
    q: &QueueName,
    order: &Order,
) -> Result<i64, pgmq_client::Error> {
    let key = DedupKey::new(format!("order-{}", order.id), Duration::from_secs(3600));
    loop {
        match client.send_keyed(q, &key, order).await {
            Ok(sent) => return Ok(sent.msg_id),
            Err(e) if e.is_transient() || e.outcome() == CommitOutcome::Unknown => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::connect(&pgmq_examples::database_url()).await?;
    let installed = client.install_sdk_schema().await?;
    println!(
        "pgmq_sdk schema version {} (was {})",
        installed.now, installed.before
    );
    let queue = pgmq_examples::demo_queue("fleet_orders")?;
    client.create(&queue).await?;

    // 1. Every order sent twice: the second send of each finds its key.
    for id in 0..20 {
        let first = send_order(&client, &queue, &Order { id }).await?;
        let again = send_order(&client, &queue, &Order { id }).await?;
        assert_eq!(first, again);
    }
    let length = client.metrics(&queue).await?.queue_length;
    println!("sent 40 times, {length} messages in the queue");

    // 2. A worker under a fleet-wide limit of 3 running handlers.
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (r, m) = (Arc::clone(&running), Arc::clone(&most));
    let worker: Worker<Order> = Worker::builder(client.clone(), queue.clone())
        .concurrency(8)
        .poll_interval(Duration::from_millis(100))
        .fleet_limit(FleetLimit::max_running(3))
        .handler(move |msg: Message<Order>| {
            let (r, m) = (Arc::clone(&r), Arc::clone(&m));
            async move {
                let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                r.fetch_sub(1, Ordering::SeqCst);
                println!("handled order {}", msg.body.id);
                Ok(Outcome::Delete)
            }
        })
        .build()?;
    let handle = worker.spawn();

    // 3. Pause once some are handled; nothing is claimed until the resume.
    while handle.stats().handled < 5 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client.pause(&queue, Some("example")).await?;
    while !handle.health().paused {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Claims made before the pause are still handled.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let claimed = handle.stats().claimed;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(handle.stats().claimed, claimed, "claimed while paused");
    println!(
        "paused with {} handled; nothing claimed for 500 ms",
        handle.stats().handled
    );
    client.resume(&queue).await?;

    while client.metrics(&queue).await?.queue_length > 0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let report = handle.shutdown().await?;
    println!(
        "handled {}, at most {} handlers at once (limit 3)",
        report.handled,
        most.load(Ordering::SeqCst)
    );
    client.drop_queue(&queue).await?;
    Ok(())
}
