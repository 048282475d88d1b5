//! Archive retention and moving messages between queues.
//!
//! `cargo run -p pgmq-examples --example retention_move` (reads
//! `DATABASE_URL`; default: the docker compose database). It:
//!
//! 1. sends 30 orders, some for the EU region, and moves the EU ones to
//!    their own queue in batches (`Pgmq::move_batch`, one transaction per
//!    batch: each order is in exactly one of the two queues, headers kept);
//! 2. archives the rest and prunes the archive past a count (keep the
//!    newest 5), once (`apply_retention`, what `pgmq archive prune` runs),
//!    then runs pgmq-worker's periodic retention task beside it, which
//!    finds nothing more to prune and stops when cancelled.

use std::time::Duration;

use pgmq_client::{ArchiveRetention, Client, MoveBatch, MoveSelection, SendOptions};
use pgmq_worker::{run_retention, RetentionConfig};
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::connect(&pgmq_examples::database_url()).await?;
    let orders = pgmq_examples::demo_queue("orders")?;
    let orders_eu = pgmq_examples::demo_queue("orders_eu")?;
    for q in [&orders, &orders_eu] {
        client.create(q).await?;
    }

    // 1. Thirty orders, every third one for the EU, each with a header.
    let bodies: Vec<_> = (0..30)
        .map(|id| json!({"id": id, "region": if id % 3 == 0 { "eu" } else { "us" }}))
        .collect();
    let headers: Vec<_> = (0..30)
        .map(|id| json!({"trace": format!("t-{id}")}))
        .collect();
    client
        .send_batch_with(&orders, &bodies, &SendOptions::new().headers_each(headers))
        .await?;
    let eu = MoveSelection::Matching {
        body: Some(json!({"region": "eu"})),
        headers: None,
    };
    let mut batch = MoveBatch::new(eu).limit(4);
    let mut moved = 0;
    loop {
        let done = client.move_batch(&orders, &orders_eu, &batch).await?;
        let Some(last) = done.last() else { break };
        moved += done.len();
        batch = batch.after(last.msg_id);
    }
    let (left, there) = (
        client.metrics(&orders).await?.queue_length,
        client.metrics(&orders_eu).await?.queue_length,
    );
    println!("moved {moved} EU orders: {there} in {orders_eu}, {left} left in {orders}");
    assert_eq!((moved, there, left), (10, 10, 20));
    let first = client.peek_raw(&orders_eu, 1).await?;
    println!("a moved order keeps its headers: {:?}", first[0].headers);

    // 2. The rest archived, then the archive pruned to its newest 5.
    let ids: Vec<i64> = client
        .peek_raw(&orders, 100)
        .await?
        .iter()
        .map(|m| m.msg_id)
        .collect();
    client.archive_batch(&orders, &ids).await?;
    let keep_five = ArchiveRetention::keeping(5).batch(4);
    let done = client.apply_retention(&orders, &keep_five).await?;
    println!(
        "pruned {} archived orders once (busy: {})",
        done.pruned, done.busy
    );
    assert_eq!(done.pruned, 15);

    // The same retention, periodically, as a worker process would run it.
    let config =
        RetentionConfig::new(vec![orders.clone()], keep_five).every(Duration::from_millis(200));
    let stop = CancellationToken::new();
    let task = tokio::spawn(run_retention(client.clone(), config, stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    println!("the retention task pruned {} more", task.await?);
    println!(
        "{} archived orders kept",
        client.peek_archive_raw(&orders, 100).await?.len()
    );

    for q in [&orders, &orders_eu] {
        client.drop_queue(q).await?;
    }
    Ok(())
}
