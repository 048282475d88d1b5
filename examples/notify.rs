//! Wake-up latency: a worker woken by LISTEN/NOTIFY against one that polls.
//!
//! For each mode it starts a worker on an idle queue, then sends a few
//! messages one at a time, pausing between them so that the worker is idle
//! (waiting) when each arrives. A sample is the time from just before the
//! producer's `send` to the start of the handler, on one monotonic clock in
//! this process. The polling worker finds a message up to one
//! `poll_interval` (250 ms by default) late; the notified worker is woken as
//! soon as the send commits.
//!
//! With `WakeUp::Notify` the worker enables PGMQ's insert trigger on the
//! queue itself (`pgmq.enable_notify_insert`) and keeps polling as a fallback,
//! for messages that become visible without an insert (delays, expired
//! visibility timeouts).
//!
//! `cargo run -p pgmq-examples --example notify` (reads `DATABASE_URL`).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use pgmq_client::{Client, Message, QueueName};
use pgmq_worker::{Outcome, WakeUp, Worker};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// Pauses before each send, milliseconds: uneven, so that sends land at
/// different points of the polling cycle.
const PAUSES_MS: [u64; 8] = [310, 170, 420, 260, 90, 380, 140, 230];

#[derive(Serialize, Deserialize)]
struct Ping {
    seq: usize,
    /// Microseconds since [`epoch`] when the producer called `send`.
    sent_at_us: u64,
}

/// One clock for the producer and the handler, in this process.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_us() -> u64 {
    u64::try_from(epoch().elapsed().as_micros()).unwrap_or(u64::MAX)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    epoch();
    let client = Client::connect(&pgmq_examples::database_url()).await?;
    let mut medians = Vec::new();
    for (label, mode) in [("polling", WakeUp::Poll), ("notify", WakeUp::Notify)] {
        let queue = pgmq_examples::demo_queue(&format!("wakeup_{label}"))?;
        client.create(&queue).await?;
        println!("\n== {label}: queue {queue}");
        let result = measure(&client, &queue, mode).await;
        client.drop_queue(&queue).await?;
        println!("dropped queue {queue}");
        let mut samples = result?;
        samples.sort_unstable();
        let median = samples[samples.len() / 2];
        println!(
            "{label}: median {:.1} ms, min {:.1} ms, max {:.1} ms over {} sends",
            ms(median),
            ms(samples[0]),
            ms(samples[samples.len() - 1]),
            samples.len()
        );
        medians.push((label, median));
    }
    println!("\nwake-up latency, send to handler start (median):");
    for (label, m) in &medians {
        println!("  {label:<8} {:>7.1} ms", ms(*m));
    }
    Ok(())
}

/// Runs a worker in `mode` and returns one latency per send, in microseconds.
async fn measure(
    client: &Client,
    queue: &QueueName,
    mode: WakeUp,
) -> Result<Vec<u64>, Box<dyn std::error::Error>> {
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, u64)>();
    let worker: Worker<Ping> = Worker::builder(client.clone(), queue.clone())
        .wake_up(mode)
        .handler(move |msg: Message<Ping>| {
            let latency = now_us().saturating_sub(msg.body.sent_at_us);
            let tx = tx.clone();
            async move {
                let _ = tx.send((msg.body.seq, latency));
                Ok(Outcome::Delete)
            }
        })
        .build()?;
    let handle = worker.spawn();

    // Let the worker start (and, for notify, LISTEN) and go idle.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut samples = Vec::with_capacity(PAUSES_MS.len());
    let mut failure = None;
    for (seq, pause) in PAUSES_MS.into_iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let ping = Ping {
            seq,
            sent_at_us: now_us(),
        };
        if let Err(e) = client.send(queue, &ping).await {
            failure = Some(e.to_string());
            break;
        }
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            Ok(Some((got, us))) if got == seq => {
                println!("send {seq}: handler started after {:.1} ms", ms(us));
                samples.push(us);
            }
            other => {
                failure = Some(format!(
                    "send {seq}: no matching handler call within 5 s ({other:?})"
                ));
                break;
            }
        }
    }
    let report = handle.shutdown().await?;
    let s = &report.stats;
    println!(
        "worker: {} reads ({} empty), woken {} time(s) by a notification and {} by the poll timer",
        s.reads, s.empty_reads, s.wakeups_notify, s.wakeups_poll
    );
    match failure {
        Some(f) => Err(f.into()),
        None => Ok(samples),
    }
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}
