//! Periodic sends: a schedule fired by two schedulers at once, each tick
//! sent once.
//!
//! `cargo run -p pgmq-examples --example schedules` (reads `DATABASE_URL`;
//! default: the docker compose database). It installs the SDK's
//! `pgmq_sdk` schema if needed (what `pgmq install-sdk` does), then:
//!
//! 1. puts a schedule sending `{"job": "sync"}` to a queue every second
//!    (`pgmq schedule add ... --every 1s` from a shell);
//! 2. runs a worker on that queue with a scheduler beside it, and a second
//!    scheduler on its own, as two processes of a fleet would: each tick
//!    is handled once, with its `x-pgmq-tick` header;
//! 3. pauses the schedule, lists it (`pgmq schedule list`), and removes it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pgmq_client::{Cadence, Client, Message, Schedule, TICK_HEADER};
use pgmq_worker::{Outcome, Scheduler, SchedulerConfig, Worker};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::connect(&pgmq_examples::database_url()).await?;
    client.install_sdk_schema().await?;
    let queue = pgmq_examples::demo_queue("sync_jobs")?;
    client.create(&queue).await?;

    // 1. Every second, for the whole fleet.
    let name = format!("sync-{}", queue.as_str());
    let schedule = Schedule::new(
        &name,
        queue.clone(),
        Cadence::every(Duration::from_secs(1))?,
    )?
    .message(serde_json::json!({"job": "sync"}))
    .catch_up(5);
    client.put_schedule(&schedule).await?;

    // 2. A worker with a scheduler beside it, and a scheduler on its own.
    let ticks = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = Arc::clone(&ticks);
    let cfg = SchedulerConfig::default().poll_interval(Duration::from_millis(200));
    let worker: Worker<serde_json::Value> = Worker::builder(client.clone(), queue.clone())
        .poll_interval(Duration::from_millis(100))
        .scheduler(cfg.clone())
        .handler(move |msg: Message<serde_json::Value>| {
            let seen = Arc::clone(&seen);
            async move {
                let tick = msg
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(TICK_HEADER))
                    .and_then(|t| t.as_str())
                    .unwrap_or("?")
                    .to_owned();
                println!("tick {tick}: {}", msg.body);
                seen.lock().unwrap().push(tick);
                Ok(Outcome::Delete)
            }
        })
        .build()?;
    let handle = worker.spawn();
    let stop = CancellationToken::new();
    let other = tokio::spawn(Scheduler::new(client.clone(), cfg).run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(4500)).await;

    // 3. Paused: nothing more is sent.
    client.pause_schedule(&name).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    other.await?;
    handle.shutdown().await?;
    for s in client.schedules().await? {
        if s.name == name {
            println!(
                "{}: {} messages sent, paused {}, last tick {:?}",
                s.name, s.sent, s.paused, s.last_tick
            );
        }
    }
    let ticks = ticks.lock().unwrap().clone();
    let distinct: HashSet<&String> = ticks.iter().collect();
    assert_eq!(distinct.len(), ticks.len(), "a tick handled twice");
    println!("{} ticks, each handled once", ticks.len());
    client.remove_schedule(&name).await?;
    client.drop_queue(&queue).await?;
    Ok(())
}
