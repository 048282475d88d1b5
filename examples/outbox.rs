//! The transactional outbox: write your own row and enqueue a message in one
//! transaction, so that both commit or neither does.
//!
//! The commit case leaves one row and one message; the rollback case (a
//! business check fails after both writes) leaves neither.
//!
//! `cargo run -p pgmq-examples --example outbox` (reads `DATABASE_URL`).

use std::time::Duration;

use pgmq_client::{Client, Pgmq, QueueName, Transaction};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: i64,
    item: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::connect(&pgmq_examples::database_url()).await?;
    let queue = pgmq_examples::demo_queue("outbox_orders")?;
    // The example's own business table; the name only ever comes from a pid.
    let table = format!("outbox_demo_orders_{}", std::process::id());

    client.create(&queue).await?;
    client
        .connection()
        .await?
        .batch_execute(&format!(
            "CREATE TABLE {table} (id bigint PRIMARY KEY, item text NOT NULL)"
        ))
        .await?;
    println!("created queue {queue} and table {table}");

    let result = run(&client, &queue, &table).await;

    // Clean up whatever happened above.
    client
        .connection()
        .await?
        .batch_execute(&format!("DROP TABLE IF EXISTS {table}"))
        .await?;
    client.drop_queue(&queue).await?;
    println!("dropped queue {queue} and table {table}");
    result
}

async fn run(
    client: &Client,
    queue: &QueueName,
    table: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut conn = client.connection().await?;

    // 1. Commit: the row and the message become visible together.
    let tx = conn.transaction().await?;
    let msg_id = place_order(
        &tx,
        table,
        queue,
        OrderPlaced {
            order_id: 1,
            item: "book".into(),
        },
    )
    .await?;
    tx.commit().await?;
    println!("commit:   inserted order 1 and sent message {msg_id} in one transaction, committed");

    // 2. Rollback: both writes happen, then the transaction is abandoned.
    let tx = conn.transaction().await?;
    let msg_id = place_order(
        &tx,
        table,
        queue,
        OrderPlaced {
            order_id: 2,
            item: "lamp".into(),
        },
    )
    .await?;
    println!(
        "rollback: inserted order 2 and sent message {msg_id}, then a check failed: rolling back"
    );
    tx.rollback().await?;
    drop(conn);

    // What is left: order 1 and its message, nothing of order 2.
    let rows: i64 = client
        .connection()
        .await?
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await?
        .get(0);
    let messages = client
        .read::<OrderPlaced>(queue, Duration::from_secs(30), 10)
        .await?
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    println!(
        "result:   {rows} row(s) in {table}, {} message(s) in {queue}",
        messages.len()
    );
    for m in &messages {
        println!("          message {}: {:?}", m.msg_id, m.body);
        client.delete(queue, m.msg_id).await?;
    }
    let ids: Vec<i64> = messages.iter().map(|m| m.body.order_id).collect();
    if rows != 1 || ids != [1] {
        return Err(
            format!("expected order 1 only, found {rows} row(s) and messages for {ids:?}").into(),
        );
    }
    println!("ok: the committed order has its message; the rolled-back order left neither row nor message");
    Ok(())
}

/// The business write and the message, both on the caller's transaction.
async fn place_order(
    tx: &Transaction<'_>,
    table: &str,
    queue: &QueueName,
    order: OrderPlaced,
) -> Result<i64, Box<dyn std::error::Error>> {
    let insert = format!("INSERT INTO {table} (id, item) VALUES ($1, $2)");
    tx.execute(&insert, &[&order.order_id, &order.item]).await?;
    Ok(Pgmq::on(tx).send(queue, &order).await?)
}
