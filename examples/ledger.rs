//! A transactional handler writing a ledger: each transfer's ledger row and
//! the message's acknowledgement commit in one transaction, so a crash, a
//! lost connection or a timeout before the commit undoes both, and the
//! redelivered message finds no row of its own. Delivery stays at least
//! once; for this database work it becomes effectively once.
//!
//! It creates a ledger table, sends 50 transfers (one of them twice, as a
//! producer retrying after a timeout would), runs a worker with
//! `transactional_handler`, and checks that every transfer is in the ledger
//! exactly once. With `--demo` it stops by itself; otherwise on Ctrl-C.
//!
//! `cargo run -p pgmq-examples --example ledger [-- --demo]` (reads `DATABASE_URL`).

use std::time::Duration;

use pgmq_client::{Client, Message, QueueName, Transaction};
use pgmq_worker::{Context, HandlerError, Outcome, TransactionalHandler, Worker};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Transfer {
    /// The producer's key for the transfer: the ledger's primary key, so a
    /// transfer sent twice is booked once.
    transfer_id: i64,
    account: String,
    amount_cents: i64,
}

/// Books a transfer in `table`, inside the worker's transaction.
struct Book {
    table: String,
}

impl TransactionalHandler<Transfer> for Book {
    async fn handle(
        &self,
        msg: Message<Transfer>,
        tx: &Transaction<'_>,
        _ctx: Context,
    ) -> Result<Outcome, HandlerError> {
        let t = &msg.body;
        // `ON CONFLICT DO NOTHING`: a transfer the producer sent twice
        // (two messages, one key) is booked once.
        let booked = tx
            .execute(
                &format!(
                    "INSERT INTO {} (transfer_id, account, amount_cents) VALUES ($1, $2, $3) \
                     ON CONFLICT (transfer_id) DO NOTHING",
                    self.table
                ),
                &[&t.transfer_id, &t.account, &t.amount_cents],
            )
            .await?;
        if booked == 0 {
            println!("transfer {} already booked: nothing to do", t.transfer_id);
        }
        // The worker runs the message's fenced delete in `tx`, then commits.
        Ok(Outcome::Delete)
    }
}

const TRANSFERS: i64 = 50;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let demo = pgmq_examples::demo_mode();
    let client = Client::connect(&pgmq_examples::database_url()).await?;
    let queue = pgmq_examples::demo_queue("ledger")?;
    // Digits only after the prefix: safe to put into SQL.
    let table = format!("ledger_demo_{}", std::process::id());
    client.create(&queue).await?;
    let conn = client.connection().await?;
    conn.execute(
        &format!(
            "CREATE TABLE {table} (transfer_id bigint PRIMARY KEY, account text NOT NULL, \
             amount_cents bigint NOT NULL)"
        ),
        &[],
    )
    .await?;
    drop(conn);
    println!("created queue {queue} and table {table}");

    let result = run(&client, &queue, &table, demo).await;

    client
        .connection()
        .await?
        .execute(&format!("DROP TABLE {table}"), &[])
        .await?;
    client.drop_queue(&queue).await?;
    println!("dropped queue {queue} and table {table}");
    result
}

async fn run(
    client: &Client,
    queue: &QueueName,
    table: &str,
    demo: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut transfers: Vec<Transfer> = (1..=TRANSFERS)
        .map(|id| Transfer {
            transfer_id: id,
            account: format!("acct-{}", id % 5),
            amount_cents: 100 * id,
        })
        .collect();
    // The producer's retry: transfer 7 sent a second time.
    transfers.push(Transfer {
        transfer_id: 7,
        account: "acct-2".into(),
        amount_cents: 700,
    });
    client.send_batch(queue, &transfers).await?;
    let sent = transfers.len() as u64;
    println!("sent {sent} messages ({TRANSFERS} transfers, one twice)");

    // One pooled connection per running handler, for its transaction.
    let worker: Worker<Transfer> = Worker::builder(client.clone(), queue.clone())
        .concurrency(4)
        .transactional_handler(Book {
            table: table.to_owned(),
        })
        .build()?;
    let handle = worker.spawn();
    if demo {
        while handle.acked() < sent {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    } else {
        println!("worker running: press Ctrl-C to stop");
        tokio::signal::ctrl_c().await?;
    }
    let report = handle.shutdown().await?;
    println!("worker stopped: {} handled", report.handled);

    let row = client
        .connection()
        .await?
        .query_one(
            &format!("SELECT count(*), coalesce(sum(amount_cents), 0)::bigint FROM {table}"),
            &[],
        )
        .await?;
    let (rows, total): (i64, i64) = (row.get(0), row.get(1));
    println!("ledger: {rows} rows, {total} cents in all");
    let want_total: i64 = (1..=TRANSFERS).map(|id| 100 * id).sum();
    if demo && (rows != TRANSFERS || total != want_total) {
        return Err(format!(
            "expected {TRANSFERS} rows and {want_total} cents, got {rows} and {total}"
        )
        .into());
    }
    Ok(())
}
