//! Priorities across queues: one `WorkerGroup` over three queues that
//! share 4 handlers by weight (4:2:1), then the same queues by strict
//! priority.
//!
//! It sends 300 messages to each queue and runs the weighted group until
//! 350 are handled, printing each queue's share (about 57 %, 29 % and
//! 14 %, the weights' shares, since every queue still has a backlog), then
//! a strict group until every message is handled: the `high` queue's
//! backlog first, then `mid`'s, then `low`'s. It stops on Ctrl-C, or by
//! itself with `--demo`.
//!
//! `cargo run -p pgmq-examples --example priorities [-- --demo]` (reads `DATABASE_URL`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use pgmq_client::{Client, Message, QueueName};
use pgmq_worker::{Outcome, Priority, Worker, WorkerGroup};

const EACH: u64 = 300;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let demo = pgmq_examples::demo_mode();
    // Three workers: each wants its claimers + ack_flushers + 1 (4).
    let client = Client::builder(&pgmq_examples::database_url())
        .max_size(14)
        .connect()
        .await?;
    let queues = [
        pgmq_examples::demo_queue("prio_high")?,
        pgmq_examples::demo_queue("prio_mid")?,
        pgmq_examples::demo_queue("prio_low")?,
    ];
    for q in &queues {
        client.create(q).await?;
    }
    let result = run(&client, &queues, demo).await;
    for q in &queues {
        client.drop_queue(q).await?;
    }
    println!("dropped the three queues");
    result
}

async fn run(
    client: &Client,
    queues: &[QueueName; 3],
    demo: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let bodies: Vec<u64> = (0..EACH).collect();
    for q in queues {
        client.send_batch(q, &bodies).await?;
    }
    println!("sent {EACH} messages to each of {queues:?}");
    let handled: Vec<Arc<AtomicU64>> = queues.iter().map(|_| Arc::default()).collect();

    // Weighted: with a backlog on every queue, 4/7, 2/7 and 1/7 of the
    // group's 4 handlers; a queue with nothing ready leaves its share to
    // the others.
    let mut group = WorkerGroup::new(client.clone()).priority(Priority::weighted().concurrency(4));
    for ((q, n), weight) in queues.iter().zip(&handled).zip([4, 2, 1]) {
        group = group.with_worker_priority(worker(client, q, n)?, weight);
    }
    let counts = handled.clone();
    group
        .run_until(async move {
            while total(&counts) < 350 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await?;
    let weighted: Vec<u64> = handled.iter().map(|n| n.load(Relaxed)).collect();
    let sum: u64 = weighted.iter().sum();
    for (q, n) in queues.iter().zip(&weighted) {
        println!(
            "weighted: {q}: {n} handled ({:.0} %)",
            100.0 * *n as f64 / sum as f64
        );
    }

    // Strict: `mid` gets handlers only while `high` has nothing ready,
    // `low` only while neither has.
    let mut group = WorkerGroup::new(client.clone()).priority(Priority::strict().concurrency(4));
    for ((q, n), rank) in queues.iter().zip(&handled).zip([3, 2, 1]) {
        group = group.with_worker_priority(worker(client, q, n)?, rank);
    }
    let counts = handled.clone();
    let names = queues.clone();
    let progress = async move {
        let mut drained = [false; 3];
        loop {
            for (i, n) in counts.iter().enumerate() {
                if !drained[i] && n.load(Relaxed) == EACH {
                    drained[i] = true;
                    let so_far: Vec<u64> = counts.iter().map(|n| n.load(Relaxed)).collect();
                    println!("strict: {} drained; handled so far {so_far:?}", names[i]);
                }
            }
            if drained.iter().all(|d| *d) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    if demo {
        println!("strict group running (--demo: stops once every message is handled)");
        group.run_until(progress).await?;
    } else {
        println!("strict group running: press Ctrl-C to stop");
        tokio::spawn(progress);
        group.run_until_signal().await?;
    }
    if demo && total(&handled) != 3 * EACH {
        return Err(format!("expected {} handled, got {}", 3 * EACH, total(&handled)).into());
    }
    Ok(())
}

/// A worker on `q` whose handler takes about 2 ms and counts into `handled`.
fn worker(
    client: &Client,
    q: &QueueName,
    handled: &Arc<AtomicU64>,
) -> Result<Worker<u64>, pgmq_worker::Error> {
    let handled = Arc::clone(handled);
    Worker::builder(client.clone(), q.clone())
        .concurrency(4)
        .handler(move |_m: Message<u64>| {
            let handled = Arc::clone(&handled);
            async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                handled.fetch_add(1, Relaxed);
                Ok(Outcome::Delete)
            }
        })
        .build()
}

fn total(counts: &[Arc<AtomicU64>]) -> u64 {
    counts.iter().map(|n| n.load(Relaxed)).sum()
}
