//! One `WorkerGroup` over several queues: each queue has its own message
//! type, handler and settings, all share one pool (the client's) and stop
//! together, each draining as it would alone.
//!
//! It sends 20 e-mails and 20 invoices to two queues, runs both workers as
//! one group, prints each queue's progress from its `Monitor`, and stops the
//! group on Ctrl-C or, with `--demo`, once every message is handled.
//!
//! `cargo run -p pgmq-examples --example worker_group [-- --demo]` (reads `DATABASE_URL`).

use std::time::Duration;

use pgmq_client::{Client, Message, QueueName};
use pgmq_worker::{Monitor, Outcome, Worker, WorkerGroup};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Email {
    to: String,
}

#[derive(Serialize, Deserialize)]
struct Invoice {
    id: u32,
    amount_cents: u64,
}

const EACH: usize = 20;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let demo = pgmq_examples::demo_mode();
    // One pool for both workers: size it for the sum (each worker wants its
    // claimers + ack_flushers + 1, 4 at the defaults).
    let client = Client::builder(&pgmq_examples::database_url())
        .max_size(10)
        .connect()
        .await?;
    let emails = pgmq_examples::demo_queue("group_emails")?;
    let invoices = pgmq_examples::demo_queue("group_invoices")?;
    client.create(&emails).await?;
    client.create(&invoices).await?;

    let result = run(&client, &emails, &invoices, demo).await;

    client.drop_queue(&emails).await?;
    client.drop_queue(&invoices).await?;
    println!("dropped queues {emails} and {invoices}");
    result
}

async fn run(
    client: &Client,
    emails: &QueueName,
    invoices: &QueueName,
    demo: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let mail: Vec<Email> = (0..EACH)
        .map(|i| Email {
            to: format!("user{i}@example.com"),
        })
        .collect();
    let bills: Vec<Invoice> = (0..EACH as u32)
        .map(|id| Invoice {
            id,
            amount_cents: 1_000 + u64::from(id),
        })
        .collect();
    client.send_batch(emails, &mail).await?;
    client.send_batch(invoices, &bills).await?;
    println!("sent {EACH} messages to {emails} and {EACH} to {invoices}");

    let email_worker: Worker<Email> = Worker::builder(client.clone(), emails.clone())
        .concurrency(4)
        .handler(|m: Message<Email>| async move {
            println!("mail to {}", m.body.to);
            Ok(Outcome::Delete)
        })
        .build()?;
    let invoice_worker: Worker<Invoice> = Worker::builder(client.clone(), invoices.clone())
        .concurrency(2)
        .handler(|m: Message<Invoice>| async move {
            println!("invoice {} for {} cents", m.body.id, m.body.amount_cents);
            // Archived, not deleted: PGMQ's archive keeps a copy.
            Ok(Outcome::Archive)
        })
        .build()?;

    let group = WorkerGroup::new(client.clone())
        .with_worker(email_worker)
        .with_worker(invoice_worker);
    let monitors = group.monitors();
    let reports = if demo {
        println!(
            "group running (--demo: stops once all {} are handled)",
            2 * EACH
        );
        group.run_until(all_handled(monitors)).await?
    } else {
        println!("group running: press Ctrl-C to stop");
        group.run_until_signal().await?
    };
    let mut handled = 0;
    for report in &reports {
        println!(
            "stopped: {} handled, {} released",
            report.handled, report.released
        );
        handled += report.handled;
    }
    if demo && handled != (2 * EACH) as u64 {
        return Err(format!("expected {} handled, got {handled}", 2 * EACH).into());
    }
    Ok(())
}

/// Resolves once every queue's worker has acknowledged its share, printing
/// each queue's count from its monitor on the way.
async fn all_handled(monitors: Vec<(QueueName, Monitor)>) {
    loop {
        let counts: Vec<u64> = monitors.iter().map(|(_, m)| m.acked()).collect();
        if counts.iter().all(|&n| n >= EACH as u64) {
            for (queue, m) in &monitors {
                println!("{queue}: {} acknowledged", m.acked());
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
