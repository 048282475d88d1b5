//! An HTTP service with a queue inside: what most users build.
//!
//! - One `Client`, shared by every request handler (it is a pool; cloning it
//!   is cheap). `POST /orders` writes the order row and its message in one
//!   transaction (the outbox pattern): both commit, or neither.
//! - A worker in the same process handles those messages.
//! - `GET /healthz` answers from the worker's `Monitor`: 200 while it claims,
//!   acknowledges and is connected, 503 otherwise (a readiness probe).
//! - One shutdown for both: on Ctrl-C (or SIGTERM) the server stops taking
//!   requests and finishes the ones in flight, then the worker drains.
//!
//! With `--demo` the example is its own client: it posts 20 orders over
//! HTTP, reads `/healthz`, waits until the worker has handled every order,
//! and stops; tables and queues are dropped at the end either way.
//!
//! `cargo run -p pgmq-examples --example axum_service [-- --demo]` (reads
//! `DATABASE_URL`; listens on 127.0.0.1:3000, or an ephemeral port with `--demo`).

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use pgmq_client::{Client, Message, Pgmq, QueueName};
use pgmq_worker::{Monitor, Outcome, Worker};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Serialize, Deserialize)]
struct Order {
    id: i64,
    item: String,
}

/// What every request handler shares: cheap to clone.
#[derive(Clone)]
struct AppState {
    client: Client,
    queue: QueueName,
    /// The orders table (a name of digits after a fixed prefix: safe in SQL).
    table: String,
    monitor: Monitor,
}

/// `POST /orders`: the row and its message in one transaction.
async fn create_order(
    State(app): State<AppState>,
    Json(order): Json<Order>,
) -> Result<StatusCode, (StatusCode, String)> {
    let mut conn = app.client.connection().await.map_err(fail)?;
    let tx = conn.transaction().await.map_err(fail)?;
    tx.execute(
        &format!("INSERT INTO {} (id, item) VALUES ($1, $2)", app.table),
        &[&order.id, &order.item],
    )
    .await
    .map_err(fail)?;
    Pgmq::on(&tx).send(&app.queue, &order).await.map_err(fail)?;
    tx.commit().await.map_err(fail)?;
    Ok(StatusCode::ACCEPTED)
}

/// A database failure as the response: 503, the error's text (which never
/// holds the password).
fn fail(e: impl std::fmt::Display) -> (StatusCode, String) {
    (StatusCode::SERVICE_UNAVAILABLE, e.to_string())
}

/// `GET /healthz`: the worker's health.
async fn healthz(State(app): State<AppState>) -> (StatusCode, String) {
    let health = app.monitor.health();
    let code = if health.is_healthy() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, format!("{health:?}\n"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let demo = pgmq_examples::demo_mode();
    let client = Client::connect(&pgmq_examples::database_url()).await?;
    let queue = pgmq_examples::demo_queue("http_orders")?;
    let table = format!("http_orders_{}", std::process::id());
    client.create(&queue).await?;
    client
        .connection()
        .await?
        .execute(
            &format!("CREATE TABLE {table} (id bigint PRIMARY KEY, item text NOT NULL)"),
            &[],
        )
        .await?;

    let result = serve(&client, &queue, &table, demo).await;

    client
        .connection()
        .await?
        .execute(&format!("DROP TABLE {table}"), &[])
        .await?;
    client.drop_queue(&queue).await?;
    println!("dropped queue {queue} and table {table}");
    result
}

async fn serve(
    client: &Client,
    queue: &QueueName,
    table: &str,
    demo: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let worker: Worker<Order> = Worker::builder(client.clone(), queue.clone())
        .concurrency(4)
        .handler(|m: Message<Order>| async move {
            // Real work here: e-mail the customer, call the warehouse...
            println!("worker: order {} ({})", m.body.id, m.body.item);
            Ok(Outcome::Delete)
        })
        .build()?;
    let monitor = worker.monitor();
    let handle = worker.spawn();

    let app = Router::new()
        .route("/orders", post(create_order))
        .route("/healthz", get(healthz))
        .with_state(AppState {
            client: client.clone(),
            queue: queue.clone(),
            table: table.to_owned(),
            monitor: monitor.clone(),
        });
    let listener = TcpListener::bind(if demo {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:3000"
    })
    .await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr} (POST /orders, GET /healthz)");

    // One stop for the server and the worker.
    let stop = CancellationToken::new();
    let shutdown = stop.clone().cancelled_owned();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
    });

    let demo_result = if demo {
        let r = drive(addr, &monitor).await;
        stop.cancel();
        r
    } else {
        println!("press Ctrl-C to stop");
        shutdown_signal().await;
        stop.cancel();
        Ok(())
    };
    // The server first (no new orders), then the worker drains.
    server.await??;
    let report = handle.shutdown().await?;
    println!(
        "stopped: server closed, worker handled {}, released {}",
        report.handled, report.released
    );
    demo_result
}

/// Ctrl-C, or SIGTERM (what a container runtime sends).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

const DEMO_ORDERS: i64 = 20;

/// The demo's client: posts orders, reads /healthz, waits for the worker.
async fn drive(
    addr: std::net::SocketAddr,
    monitor: &Monitor,
) -> Result<(), Box<dyn std::error::Error>> {
    for id in 1..=DEMO_ORDERS {
        let body = serde_json::to_string(&Order {
            id,
            item: format!("book {id}"),
        })?;
        let status = http(addr, "POST", "/orders", &body).await?;
        if status != 202 {
            return Err(format!("POST /orders answered {status}").into());
        }
    }
    println!("posted {DEMO_ORDERS} orders");
    // Ready once the worker has claimed and acknowledged at least once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while monitor.acked() < DEMO_ORDERS as u64 {
        if tokio::time::Instant::now() > deadline {
            return Err("the worker did not handle every order within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = http(addr, "GET", "/healthz", "").await?;
    println!("GET /healthz: {status}");
    if status != 200 {
        return Err(format!("/healthz answered {status}").into());
    }
    Ok(())
}

/// One HTTP/1.1 request over a fresh connection; returns the status code.
async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> Result<u16, Box<dyn std::error::Error>> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).await?;
    let code = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {resp:?}"))?;
    Ok(code)
}
