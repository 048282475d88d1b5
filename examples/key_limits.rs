//! Limits per key: at most 2 jobs per customer at once, across every
//! process, while other customers' jobs go at the queue's full rate.
//!
//! `cargo run -p pgmq-examples --example key_limits` (reads `DATABASE_URL`;
//! default: the docker compose database). It installs the SDK's `pgmq_sdk`
//! schema if needed (what `pgmq install-sdk` does), then:
//!
//! 1. sends 30 jobs of one busy customer first, then one job each for 20
//!    other customers, the customer in the header `customer`;
//! 2. runs a worker of 8 handlers under a limit of 2 running jobs per
//!    customer: the busy customer's jobs never run more than 2 at once, and
//!    its backlog at the head of the queue holds back no other customer
//!    (their jobs are all done while the busy customer's are still
//!    queued).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pgmq_client::{Client, FleetLimit, KeyFrom, KeyLimit, Message, SendOptions};
use pgmq_worker::{Outcome, Worker};

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Job {
    n: u32,
}

/// Per customer: jobs running now, the most at once, and jobs done.
#[derive(Debug, Default)]
struct Tally {
    running: HashMap<String, usize>,
    most: HashMap<String, usize>,
    done: HashMap<String, usize>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::connect(&pgmq_examples::database_url()).await?;
    client.install_sdk_schema().await?;
    let queue = pgmq_examples::demo_queue("key_limits")?;
    client.create(&queue).await?;

    // 1. The busy customer's backlog first, then the others.
    let mut customers: Vec<String> = vec!["busy".to_owned(); 30];
    customers.extend((0..20).map(|i| format!("customer-{i}")));
    let jobs: Vec<Job> = (0..customers.len() as u32).map(|n| Job { n }).collect();
    let headers = customers
        .iter()
        .map(|c| serde_json::json!({ "customer": c }))
        .collect();
    client
        .send_batch_with(&queue, &jobs, &SendOptions::new().headers_each(headers))
        .await?;

    // 2. At most 2 running jobs per customer, however many processes run
    // this worker; a job without the header would not be limited.
    let per_customer = KeyLimit::new(KeyFrom::header("customer")?, FleetLimit::max_running(2));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let t = Arc::clone(&tally);
    let worker: Worker<Job> = Worker::builder(client.clone(), queue.clone())
        .concurrency(8)
        .poll_interval(Duration::from_millis(50))
        .key_limit(per_customer)
        .handler(move |msg: Message<Job>| {
            let t = Arc::clone(&t);
            async move {
                let customer = msg
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("customer"))
                    .and_then(|c| c.as_str())
                    .unwrap_or("")
                    .to_owned();
                {
                    let mut t = t.lock().unwrap();
                    let now = *t.running.entry(customer.clone()).or_default() + 1;
                    t.running.insert(customer.clone(), now);
                    let most = t.most.entry(customer.clone()).or_default();
                    *most = (*most).max(now);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                let mut t = t.lock().unwrap();
                *t.running.get_mut(&customer).unwrap() -= 1;
                *t.done.entry(customer).or_default() += 1;
                println!("job {} done", msg.body.n);
                Ok(Outcome::Delete)
            }
        })
        .build()?;
    let handle = worker.spawn();

    // The 20 other customers' jobs are done while the busy one's queue.
    loop {
        let (others, busy) = {
            let t = tally.lock().unwrap();
            let busy = t.done.get("busy").copied().unwrap_or(0);
            (t.done.values().sum::<usize>() - busy, busy)
        };
        if others == 20 {
            println!("the 20 other customers done, the busy one's {busy} of 30 so far");
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while client.metrics(&queue).await?.queue_length > 0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    handle.shutdown().await?;
    let most = tally
        .lock()
        .unwrap()
        .most
        .values()
        .copied()
        .max()
        .unwrap_or(0);
    println!("at most {most} jobs of one customer at once (limit 2)");
    assert!(most <= 2);
    client.drop_queue(&queue).await?;
    Ok(())
}
