//! Prometheus metrics of a worker: the `metrics` feature of pgmq-worker with
//! `metrics-exporter-prometheus` serving them on http://127.0.0.1:9898/metrics.
//!
//! `cargo run -p pgmq-examples --example metrics` (reads `DATABASE_URL`;
//! default: the docker compose database) runs until Ctrl-C (scrape the
//! endpoint meanwhile); with `--demo` it sends 100 messages, waits until they
//! are handled, reads its own endpoint once, prints the worker's lines and
//! stops (what CI runs).

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use pgmq_client::{Client, Message};
use pgmq_worker::{Outcome, Worker};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ADDR: ([u8; 4], u16) = ([127, 0, 0, 1], 9898);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let demo = pgmq_examples::demo_mode();
    PrometheusBuilder::new()
        .with_http_listener(ADDR)
        .install()?;

    let client = Client::connect(&pgmq_examples::database_url()).await?;
    // metrics_<pid>: its own queue, and its label on the metrics lines.
    let queue = pgmq_examples::demo_queue("metrics")?;
    client.create(&queue).await?;
    let worker: Worker<serde_json::Value> = Worker::builder(client.clone(), queue.clone())
        .metrics_interval(Duration::from_millis(200))
        .handler(|_m: Message<serde_json::Value>| async {
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok(Outcome::Delete)
        })
        .build()?;
    let monitor = worker.monitor();
    let stop = worker.shutdown_handle();
    let running = tokio::spawn(worker.run_until_signal());

    if demo {
        let bodies: Vec<_> = (0..100).map(|n| serde_json::json!({ "n": n })).collect();
        client.send_batch(&queue, &bodies).await?;
        while monitor.stats().deleted < 100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // One publishing interval, so that the exporter holds the latest figures.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let page = scrape().await?;
        let ours: Vec<&str> = page
            .lines()
            .filter(|l| l.starts_with("pgmq_") && l.contains(queue.as_str()))
            .collect();
        for line in &ours {
            println!("{line}");
        }
        let deleted = ours
            .iter()
            .find(|l| l.starts_with("pgmq_worker_deleted_total"))
            .ok_or("pgmq_worker_deleted_total missing from the endpoint")?;
        if !deleted.ends_with(" 100") {
            return Err(format!("expected 100 deleted, the endpoint says: {deleted}").into());
        }
        stop.graceful();
    } else {
        println!("serving http://127.0.0.1:9898/metrics; Ctrl-C to stop");
    }
    running.await??;
    client.drop_queue(&queue).await?;
    Ok(())
}

/// GET /metrics from the exporter, with a plain HTTP/1.0 request.
async fn scrape() -> Result<String, Box<dyn std::error::Error>> {
    let mut s = tokio::net::TcpStream::connect(std::net::SocketAddr::from(ADDR)).await?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await?;
    let mut page = String::new();
    s.read_to_string(&mut page).await?;
    Ok(page)
}
