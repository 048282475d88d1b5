//! The service's own deadpool-postgres pool, shared by producers and a
//! worker: no second pool. Producers call PGMQ on the pool with
//! `Pgmq::on(&pool)`; the worker takes its connections from it through
//! `ConnectionSource::deadpool` (features `deadpool` of both crates).
//!
//! It sends 30 orders through the pool, runs a worker on the same pool, and
//! stops on Ctrl-C or, with `--demo`, once every order is handled.
//!
//! `cargo run -p pgmq-examples --example deadpool_shared [-- --demo]` (reads `DATABASE_URL`).

use std::time::Duration;

use pgmq_client::{Message, Pgmq, QueueName};
use pgmq_worker::{ConnectionSource, Outcome, Worker};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Order {
    id: u32,
}

const ORDERS: u32 = 30;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let demo = pgmq_examples::demo_mode();
    let dsn = pgmq_examples::database_url();
    // The service's pool, as it would make it anyway. Size it for the
    // service plus the worker (claimers + ack_flushers + 1: 4 by default).
    // NoTls here for the local database; give deadpool a TLS connector
    // (tokio-postgres-rustls, say) for a remote one.
    let config: tokio_postgres::Config = dsn.parse()?;
    let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(8)
        .build()?;

    let queue = pgmq_examples::demo_queue("dp_orders")?;
    let pgmq = Pgmq::on(&pool);
    pgmq.create(&queue).await?;

    let result = run(&pool, &queue, demo).await;

    pgmq.drop_queue(&queue).await?;
    println!("dropped queue {queue}");
    result
}

async fn run(
    pool: &deadpool_postgres::Pool,
    queue: &QueueName,
    demo: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    // A producer: any call on the pool (a request handler would do this).
    for id in 0..ORDERS {
        Pgmq::on(pool).send(queue, &Order { id }).await?;
    }
    println!("sent {ORDERS} orders through the service's pool");

    // The worker on the same pool. A polling worker needs nothing else; for
    // WakeUp::Notify add `.listen_dsn(&dsn)` (LISTEN needs a connection of
    // its own, outside any pool).
    let worker: Worker<Order> =
        Worker::builder(ConnectionSource::deadpool(pool.clone()), queue.clone())
            .concurrency(4)
            .handler(|m: Message<Order>| async move {
                println!("order {}", m.body.id);
                Ok(Outcome::Delete)
            })
            .build()?;
    let handle = worker.spawn();
    if demo {
        while handle.acked() < u64::from(ORDERS) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    } else {
        println!("worker running: press Ctrl-C to stop");
        tokio::signal::ctrl_c().await?;
    }
    let report = handle.shutdown().await?;
    let status = pool.status();
    println!(
        "worker stopped: {} handled; pool: {} connections, {} idle",
        report.handled, status.size, status.available
    );
    if demo && report.handled != u64::from(ORDERS) {
        return Err(format!("expected {ORDERS} handled, got {}", report.handled).into());
    }
    Ok(())
}
