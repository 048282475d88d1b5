//! What unnamed statements (`ClientBuilder::prepared_statements(false)`, for
//! PgBouncer's transaction mode) cost next to the cached prepared ones:
//! single sends and read(1) + delete round trips, alternating the two modes
//! in rounds, directly against PostgreSQL (`PGMQ_TEST_DSN`, else
//! `DATABASE_URL`).
//!
//! `cargo run --release -p pgmq-client --example statement_modes -- [calls] [rounds]`
//! (default 2000 calls, 3 rounds; `scripts/ci-extra.sh` runs it with a few
//! calls and one round, so that both modes keep working).

use std::time::{Duration, Instant};

use pgmq_client::{Client, QueueName};

async fn round(
    prepared: bool,
    dsn: &str,
    calls: usize,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let client = Client::builder(dsn)
        .prepared_statements(prepared)
        .max_size(1)
        .connect()
        .await?;
    // A queue of this process's own, named after the example: two runs never
    // share one, and one left behind is easy to trace.
    let q = QueueName::new(&format!(
        "statement_modes_{}_{}",
        u8::from(prepared),
        std::process::id()
    ))?;
    client.create(&q).await?;
    let body = serde_json::json!({"pad": "x".repeat(80)});
    let t = Instant::now();
    for _ in 0..calls {
        client.send(&q, &body).await?;
    }
    let sends = calls as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    for _ in 0..calls {
        for m in client.read_raw(&q, Duration::from_secs(30), 1).await? {
            client.delete(&q, m.msg_id).await?;
        }
    }
    let reads = calls as f64 / t.elapsed().as_secs_f64();
    client.drop_queue(&q).await?;
    Ok((sends, reads))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dsn = std::env::var("PGMQ_TEST_DSN")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .map_err(|_| "set PGMQ_TEST_DSN or DATABASE_URL")?;
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let calls = args.first().copied().unwrap_or(2000);
    let rounds = args.get(1).copied().unwrap_or(3);
    let mut ratios = (Vec::new(), Vec::new());
    for r in 1..=rounds {
        let p = round(true, &dsn, calls).await?;
        let u = round(false, &dsn, calls).await?;
        println!(
            "round {r}: send {:.0}/s prepared, {:.0}/s unnamed ({:.2}x); read+delete {:.0}/s prepared, {:.0}/s unnamed ({:.2}x)",
            p.0, u.0, u.0 / p.0, p.1, u.1, u.1 / p.1
        );
        ratios.0.push(u.0 / p.0);
        ratios.1.push(u.1 / p.1);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    println!(
        "median unnamed/prepared: send {:.2}x, read+delete {:.2}x",
        median(&mut ratios.0),
        median(&mut ratios.1)
    );
    Ok(())
}
