//! A worker over a typed (serde) payload, with retries, a dead-letter queue
//! and a graceful shutdown on Ctrl-C.
//!
//! It sends a handful of invoices, some of which are meant to go wrong:
//!
//! - most are handled on the first try and deleted;
//! - "flaky" ones fail on their first delivery (the handler returns an
//!   error) and succeed when retried after the backoff;
//! - "broken" ones fail every time and are dead-lettered after
//!   `max_attempts` deliveries, with the last error as the reason;
//! - one is refused by a business rule (`Outcome::DeadLetter`);
//! - one is not an invoice at all: its body does not decode, so the worker
//!   dead-letters it without calling the handler.
//!
//! The worker then keeps running until Ctrl-C (SIGINT) or SIGTERM, and shuts
//! down gracefully: it stops claiming, lets running handlers finish, releases
//! what it claimed but did not start, and writes pending acknowledgements.
//! With `--demo` it stops by itself once every invoice above is settled.
//! Finally it prints the dead letters with their headers and drops its queues.
//!
//! `cargo run -p pgmq-examples --example typed_worker [-- --demo]` (reads `DATABASE_URL`).

use std::time::{Duration, Instant};

use pgmq_client::{Client, Message, QueueName};
use pgmq_worker::{Backoff, HandlerError, Outcome, ShutdownReport, Worker, WorkerHandle};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Debug, Serialize, Deserialize)]
struct Invoice {
    id: u32,
    customer: String,
    amount_cents: u64,
}

/// The handler: an `async fn` over the typed message.
async fn handle(msg: Message<Invoice>) -> Result<Outcome, HandlerError> {
    let inv = &msg.body;
    match inv.customer.as_str() {
        "flaky" if msg.read_ct < 2 => {
            println!(
                "invoice {:>2}: delivery {}, upstream timed out: retry later",
                inv.id, msg.read_ct
            );
            Err("upstream timed out".into())
        }
        "broken" => {
            println!(
                "invoice {:>2}: delivery {}, failing again",
                inv.id, msg.read_ct
            );
            Err(format!("customer record {} is corrupt", inv.id).into())
        }
        _ if inv.amount_cents == 0 => {
            println!("invoice {:>2}: refusing an empty invoice", inv.id);
            Ok(Outcome::DeadLetter("amount is zero".into()))
        }
        _ => {
            // Real work would go here: render, store, send...
            println!(
                "invoice {:>2}: charged {} {}.{:02} (delivery {})",
                inv.id,
                inv.customer,
                inv.amount_cents / 100,
                inv.amount_cents % 100,
                msg.read_ct
            );
            Ok(Outcome::Delete)
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let demo = pgmq_examples::demo_mode();
    let client = Client::connect(&pgmq_examples::database_url()).await?;
    let queue = pgmq_examples::demo_queue("invoices")?;
    let dlq = pgmq_examples::demo_queue("invoices_dlq")?;
    client.create(&queue).await?;
    client.create(&dlq).await?;
    println!("created queue {queue} and dead-letter queue {dlq}");

    let result = run(&client, &queue, &dlq, demo).await;

    client.drop_queue(&queue).await?;
    client.drop_queue(&dlq).await?;
    println!("dropped queues {queue} and {dlq}");
    result
}

/// Sends the invoices, runs the worker until it is told to stop, and shows
/// what happened.
async fn run(
    client: &Client,
    queue: &QueueName,
    dlq: &QueueName,
    demo: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let total = send_invoices(client, queue).await?;
    let handle = start_worker(client, queue, dlq)?;
    if demo {
        println!("worker running (--demo: stops once all {total} messages are settled)");
    } else {
        println!("worker running: press Ctrl-C to stop");
    }
    wait_for_stop(&handle, total, demo).await?;

    let report = handle.shutdown().await?;
    print_report(&report);
    let dead = print_dead_letters(client, dlq).await?;
    let deleted = report.stats.deleted;
    if demo && (deleted != 8 || dead != 3) {
        return Err(
            format!("expected 8 deleted and 3 dead letters, got {deleted} and {dead}").into(),
        );
    }
    Ok(())
}

/// Sends the work: 6 good, 2 flaky, 1 broken, 1 refused, 1 undecodable.
/// Returns how many messages were sent.
async fn send_invoices(
    client: &Client,
    queue: &QueueName,
) -> Result<u64, Box<dyn std::error::Error>> {
    let customers = [
        "ada", "grace", "flaky", "alan", "broken", "edsger", "flaky", "barbara", "ken",
    ];
    let mut invoices: Vec<Invoice> = customers
        .iter()
        .zip(1u32..)
        .map(|(c, id)| Invoice {
            id,
            customer: (*c).to_owned(),
            amount_cents: 1_000 + u64::from(id) * 250,
        })
        .collect();
    invoices.push(Invoice {
        id: 10,
        customer: "linus".into(),
        amount_cents: 0,
    });
    client.send_batch(queue, &invoices).await?;
    client
        .send(queue, &json!({"id": "eleven", "note": "not an invoice"}))
        .await?;
    let total = invoices.len() as u64 + 1;
    println!("sent {total} messages to {queue}");
    Ok(total)
}

/// Configures the worker (concurrency, retries, dead-letter queue, shutdown
/// grace) and starts it in the background.
fn start_worker(
    client: &Client,
    queue: &QueueName,
    dlq: &QueueName,
) -> Result<WorkerHandle, Box<dyn std::error::Error>> {
    let worker: Worker<Invoice> = Worker::builder(client.clone(), queue.clone())
        .concurrency(4)
        .visibility_timeout(Duration::from_secs(10))
        .max_attempts(3)
        // Short delays so that the demo is quick; the default is 1 s doubling to 5 min.
        .retry_backoff(Backoff::constant(Duration::from_secs(1)))
        .dead_letter_queue(dlq.clone())
        .shutdown_grace(Duration::from_secs(10))
        .handler(handle)
        .build()?;
    Ok(worker.spawn())
}

/// Waits for Ctrl-C / SIGTERM, or in demo mode for every one of the `total`
/// messages to be settled (deleted or dead-lettered).
async fn wait_for_stop(
    handle: &WorkerHandle,
    total: u64,
    demo: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let signal = shutdown_signal();
    tokio::pin!(signal);
    loop {
        tokio::select! {
            _ = &mut signal => {
                println!("signal received: shutting down");
                return Ok(());
            }
            _ = tick.tick(), if demo => {
                let s = handle.stats();
                if s.deleted + s.dead_lettered >= total {
                    println!("all {total} messages settled: shutting down");
                    return Ok(());
                }
                if started.elapsed() > Duration::from_secs(60) {
                    return Err(format!(
                        "demo did not settle in 60 s: {} deleted, {} dead-lettered",
                        s.deleted, s.dead_lettered
                    )
                    .into());
                }
            }
        }
    }
}

/// Prints what the graceful shutdown did and the worker's counters.
fn print_report(report: &ShutdownReport) {
    let s = &report.stats;
    println!(
        "shutdown report: handled {}, acknowledged {}, released {}, still running at the deadline {}",
        report.handled, report.acked, report.released, report.still_running_at_deadline
    );
    println!(
        "stats: claimed {}, succeeded {}, failed {}, retried {}, deleted {}, dead-lettered {}, decode failures {}",
        s.claimed, s.succeeded, s.failed, s.retried, s.deleted, s.dead_lettered, s.decode_failures
    );
}

/// Prints what ended up in the dead-letter queue, and why (the reason is in
/// each message's headers). Returns how many dead letters there are.
async fn print_dead_letters(
    client: &Client,
    dlq: &QueueName,
) -> Result<usize, Box<dyn std::error::Error>> {
    let dead = client
        .read::<serde_json::Value>(dlq, Duration::from_secs(30), 100)
        .await?
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    println!("{} dead letter(s) in {dlq}:", dead.len());
    for m in &dead {
        println!("  {}", m.body);
        if let Some(h) = &m.headers {
            println!("    headers: {h}");
        }
    }
    Ok(dead.len())
}

/// Resolves on Ctrl-C (SIGINT) or, on Unix, SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
