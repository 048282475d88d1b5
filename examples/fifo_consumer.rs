//! A worker over FIFO groups: messages carrying the same `x-pgmq-group`
//! header (`FIFO_GROUP_HEADER`) are handled one at a time, in the order
//! sent; different groups run in parallel. Per-account order without giving
//! up concurrency.
//!
//! It sends 10 events for each of 3 accounts, interleaved, runs a worker
//! with `ClaimReads::FifoGroups` and 3 handlers, and checks that every
//! account's events were handled in order. With `--demo` it stops by
//! itself; otherwise on Ctrl-C.
//!
//! `cargo run -p pgmq-examples --example fifo_consumer [-- --demo]` (reads `DATABASE_URL`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pgmq_client::{Client, Message, QueueName, SendOptions, FIFO_GROUP_HEADER};
use pgmq_worker::{ClaimReads, Outcome, Worker};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Event {
    account: String,
    seq: u32,
}

const ACCOUNTS: [&str; 3] = ["acct-a", "acct-b", "acct-c"];
const PER_ACCOUNT: u32 = 10;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let demo = pgmq_examples::demo_mode();
    let client = Client::connect(&pgmq_examples::database_url()).await?;
    let queue = pgmq_examples::demo_queue("fifo_events")?;
    client.create(&queue).await?;
    // Busy FIFO queues want PGMQ's index on the group header.
    client.create_fifo_index(&queue).await?;

    let result = run(&client, &queue, demo).await;

    client.drop_queue(&queue).await?;
    println!("dropped queue {queue}");
    result
}

async fn run(
    client: &Client,
    queue: &QueueName,
    demo: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    // Interleaved: a-0, b-0, c-0, a-1, ...; each in its account's group.
    for seq in 0..PER_ACCOUNT {
        for account in ACCOUNTS {
            let opts =
                SendOptions::new().headers(serde_json::json!({ FIFO_GROUP_HEADER: account }));
            let event = Event {
                account: account.to_owned(),
                seq,
            };
            client.send_with(queue, &event, &opts).await?;
        }
    }
    let sent = u64::from(PER_ACCOUNT) * ACCOUNTS.len() as u64;
    println!("sent {sent} events in {} groups", ACCOUNTS.len());

    let seen: Arc<Mutex<HashMap<String, Vec<u32>>>> = Arc::default();
    let record = Arc::clone(&seen);
    let worker: Worker<Event> = Worker::builder(client.clone(), queue.clone())
        .concurrency(3)
        .claim_reads(ClaimReads::FifoGroups)
        .handler(move |m: Message<Event>| {
            let record = Arc::clone(&record);
            async move {
                // Work that takes a while: the group's next event waits.
                tokio::time::sleep(Duration::from_millis(5)).await;
                println!("{} event {}", m.body.account, m.body.seq);
                record
                    .lock()
                    .unwrap()
                    .entry(m.body.account.clone())
                    .or_default()
                    .push(m.body.seq);
                Ok(Outcome::Delete)
            }
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

    let seen = seen.lock().unwrap();
    for account in ACCOUNTS {
        let order = seen.get(account).cloned().unwrap_or_default();
        let in_order = order.windows(2).all(|w| w[0] < w[1]);
        println!(
            "{account}: {order:?} {}",
            if in_order { "in order" } else { "OUT OF ORDER" }
        );
        if demo && (!in_order || order.len() != PER_ACCOUNT as usize) {
            return Err(format!("{account}: events handled as {order:?}").into());
        }
    }
    Ok(())
}
