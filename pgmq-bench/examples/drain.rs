//! Drains a preloaded queue with the worker (default settings) and with a
//! plain one-connection `read(100)` + `delete(ids)` loop, and prints both
//! rates with where the time went (client and server CPU, index entries and
//! buffers per message, pg_stat_statements). A quick diagnostic while
//! developing; the `pgmq-bench` binary's sections are the measurement of
//! record.
//!
//! ```text
//! cargo run --release -p pgmq-bench --example drain -- [messages] [handler counts] [handler sleep ms]
//! cargo run --release -p pgmq-bench --example drain -- 100000 1,2,4,8 0
//! cargo run --release -p pgmq-bench --example drain -- 0       # idle: reads/s and CPU
//! cargo run --release -p pgmq-bench --example drain -- notify  # NOTIFY wake-up latency
//! cargo run --release -p pgmq-bench --example drain -- split 150000 3  # ceiling, see below
//! ```
//!
//! Environment knobs for the worker runs (unset means the worker's
//! defaults): `DRAIN_CLAIMERS`, `DRAIN_FLUSHERS`, `DRAIN_CAPACITY`,
//! `DRAIN_ACK_BATCH`, `DRAIN_FLUSH_US`, `DRAIN_CLAIM_READS`
//! (function | from-start | bounded), and `DRAIN_NO_BASELINE` (the worker
//! alone, e.g. to profile it).
//!
//! `split` measures what the connections alone allow, with no SDK at all:
//! the one-connection loop against a plain tokio-postgres program with two
//! claim connections (each reading back to back) feeding one delete
//! connection that deletes up to two read batches per call (the worker's
//! default layout), then the worker (8 handlers), each on a fresh preloaded
//! queue, for a number of rounds. The worker cannot beat the second figure;
//! how close it gets is its overhead.
//! The DSN comes from PGMQ_TEST_DSN (default: the throwaway cluster on 55432).
//!
//! Why it is kept beside the benchmark: its rates repeat the consume_scaling,
//! baseline, idle_worker and wakeup_latency sections (which are the figures
//! of record), but two things it does are in no section: where a drain's time
//! goes, per message (this process's and the server backends' CPU, index
//! entries and buffers touched, and the pg_stat_statements top statements),
//! and the `DRAIN_*` worker settings (claimers, flushers, capacity, ack batch,
//! flush delay), which the benchmark's workers do not expose. It is the tool
//! for profiling and tuning the worker's drain, not for measuring it.

use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use pgmq_client::{Client, Message, Pgmq, QueueName};
use pgmq_worker::{Worker, WorkerHandle};
use serde::de::IgnoredAny;
use tokio_postgres::NoTls;

async fn preload(
    client: &Client,
    q: &QueueName,
    n: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let _ = client.drop_queue(q).await;
    client.create(q).await?;
    let pad = "x".repeat(80);
    let mut i = 0;
    while i < n {
        let k = (n - i).min(1000);
        let bodies: Vec<_> = (i..i + k)
            .map(|id| serde_json::json!({ "id": id, "pad": pad }))
            .collect();
        client.send_batch(q, &bodies).await?;
        i += k;
    }
    let conn = client.connection().await?;
    conn.batch_execute(&format!("VACUUM ANALYZE {}", q.table()))
        .await?;
    Ok(())
}

/// CPU and commit counts at the start of a run, to report what the run
/// used.
struct Usage {
    cpu: Duration,
    server_cpu: Duration,
    machine: (u64, u64),
    commits: f64,
}

impl Usage {
    async fn start(client: &Client) -> Self {
        Usage {
            cpu: cpu_time().await,
            server_cpu: server_cpu_time(client).await,
            machine: sys_busy(),
            commits: commits(client).await,
        }
    }

    /// Prints this process's and the server's CPU per message and how busy
    /// the whole machine was since [`Usage::start`].
    async fn print_cpu(&self, client: &Client, n: usize) {
        let cpu = cpu_time().await - self.cpu;
        let srv = server_cpu_time(client)
            .await
            .saturating_sub(self.server_cpu);
        let (busy1, total1) = sys_busy();
        let (busy0, total0) = self.machine;
        eprintln!(
            "    client CPU {:.2} us/msg, server CPU {:.1} us/msg, machine busy {:.0}%",
            cpu.as_secs_f64() * 1e6 / n as f64,
            srv.as_secs_f64() * 1e6 / n as f64,
            100.0 * (busy1 - busy0) as f64 / ((total1 - total0).max(1)) as f64
        );
    }
}

async fn baseline(
    client: &Client,
    q: &QueueName,
    n: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let conn = client.connection().await?;
    let pg = Pgmq::on(&*conn);
    let start = Instant::now();
    let usage = Usage::start(client).await;
    let mut done = 0;
    loop {
        let msgs = pg.read_raw(q, Duration::from_secs(30), 100).await?;
        if msgs.is_empty() {
            break;
        }
        let ids: Vec<i64> = msgs.iter().map(|m| m.msg_id).collect();
        done += pg.delete_batch(q, &ids).await?.len();
    }
    assert_eq!(done, n);
    let rate = n as f64 / start.elapsed().as_secs_f64();
    usage.print_cpu(client, n).await;
    eprintln!("    {}", table_work(client, q, n, &usage).await);
    Ok(rate)
}

/// Drains the queue with a worker of `handlers` handlers that each sleep
/// `sleep`; prints where the time went and returns messages per second.
async fn worker(
    client: &Client,
    q: &QueueName,
    n: usize,
    handlers: usize,
    sleep: Duration,
) -> Result<f64, Box<dyn std::error::Error>> {
    let w = drain_worker(client, q, handlers, sleep)?;
    let start = Instant::now();
    let usage = Usage::start(client).await;
    statements_reset(client).await;
    let handle = w.spawn();
    let tenths = rate_by_tenth(&handle, n, start).await;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    usage.print_cpu(client, n).await;
    let report = handle.shutdown().await?;
    eprintln!("    {}", table_work(client, q, n, &usage).await);
    eprintln!("    msg/s by tenth of the drain: {}", tenths.join(" "));
    eprintln!("{}", statements(client, n).await);
    eprintln!(
        "    reads {} (empty {}), handler p50 {} us, claim->start p50 {} us",
        report.stats.reads,
        report.stats.empty_reads,
        report.stats.handler_latency.value_at_quantile(0.5),
        report.stats.queue_wait_local.value_at_quantile(0.5)
    );
    Ok(rate)
}

/// The worker under test: default settings except those the `DRAIN_*`
/// variables set.
fn drain_worker(
    client: &Client,
    q: &QueueName,
    handlers: usize,
    sleep: Duration,
) -> Result<Worker<IgnoredAny>, Box<dyn std::error::Error>> {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
    let mut b = Worker::builder(client.clone(), q.clone()).concurrency(handlers);
    if let Some(v) = env("DRAIN_CLAIMERS") {
        b = b.claimers(v);
    }
    if let Some(v) = env("DRAIN_FLUSHERS") {
        b = b.ack_flushers(v);
    }
    if let Some(v) = env("DRAIN_CAPACITY") {
        b = b.claim_capacity(v);
    }
    if let Some(v) = env("DRAIN_ACK_BATCH") {
        b = b.ack_batch_size(v);
    }
    if let Some(v) = env("DRAIN_FLUSH_US") {
        b = b.ack_flush_interval(Duration::from_micros(v as u64));
    }
    Ok(b.claim_reads(claim_reads()?)
        .handler(move |_m: Message<IgnoredAny>| async move {
            if !sleep.is_zero() {
                tokio::time::sleep(sleep).await;
            }
            Ok(())
        })
        .build()?)
}

/// Waits until the worker has acknowledged `n` messages; returns the rate
/// of each tenth of the drain, to show how it changes as the deleted head
/// of the queue grows.
async fn rate_by_tenth(handle: &WorkerHandle, n: usize, start: Instant) -> Vec<String> {
    let step = (n as u64 / 10).max(1);
    let (mut next, mut last) = (step, start);
    let mut tenths = Vec::new();
    while handle.acked() < n as u64 {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let acked = handle.acked();
        if acked >= next {
            let now = Instant::now();
            tenths.push(format!(
                "{:.0}",
                (acked - (next - step)) as f64 / (now - last).as_secs_f64()
            ));
            (next, last) = (acked + step - acked % step, now);
        }
    }
    tenths
}

/// DRAIN_CLAIM_READS: function | from-start | bounded (the default).
fn claim_reads() -> Result<pgmq_worker::ClaimReads, Box<dyn std::error::Error>> {
    use pgmq_worker::ClaimReads;
    match std::env::var("DRAIN_CLAIM_READS").as_deref() {
        Ok("function") => Ok(ClaimReads::Function),
        Ok("from-start") => Ok(ClaimReads::FromStart),
        Ok("bounded") | Err(_) => Ok(ClaimReads::Bounded),
        Ok(other) => Err(format!("DRAIN_CLAIM_READS={other}?").into()),
    }
}

/// CPU time of this process so far (user + system), from /proc.
async fn cpu_time() -> Duration {
    let stat = tokio::fs::read_to_string("/proc/self/stat")
        .await
        .unwrap_or_default();
    // Fields after the command name (which is in parentheses).
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|s| s.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|s| s.parse().ok()).unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// CPU time of this run's own server backends (the connections whose
/// application_name is this process's), from /proc: the database's work for
/// these calls, without other clients of the shared cluster.
async fn server_cpu_time(client: &Client) -> Duration {
    let Ok(conn) = client.connection().await else {
        return Duration::ZERO;
    };
    let Ok(rows) = conn
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
            &[&app_name()],
        )
        .await
    else {
        return Duration::ZERO;
    };
    let mut total = 0u64;
    for row in rows {
        let pid: i32 = row.get(0);
        let Ok(stat) = tokio::fs::read_to_string(format!("/proc/{pid}/stat")).await else {
            continue;
        };
        let rest = stat.rsplit(')').next().unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        total += f.get(11).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    }
    Duration::from_millis(total * 10)
}

/// Busy and total jiffies of the whole machine, from /proc/stat.
fn sys_busy() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = s
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = f.iter().take(8).sum();
    let idle = f.get(3).copied().unwrap_or(0) + f.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// Transactions committed in this database so far.
async fn commits(client: &Client) -> f64 {
    let Ok(conn) = client.connection().await else {
        return 0.0;
    };
    let _ = conn.batch_execute("SELECT pg_stat_clear_snapshot()").await;
    conn.query_one(
        "SELECT xact_commit::float8 FROM pg_stat_database WHERE datname = current_database()",
        &[],
    )
    .await
    .map(|r| r.get(0))
    .unwrap_or(0.0)
}

/// Work the server did on the queue table, per message: index entries
/// read and buffer hits (heap + index), from the statistics views, and
/// commits since `usage` started. Unlike timings these do not depend on what
/// else runs on the machine.
async fn table_work(client: &Client, q: &QueueName, n: usize, usage: &Usage) -> String {
    // Backends publish their table statistics within about a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let Ok(conn) = client.connection().await else {
        return String::new();
    };
    let table = q.table();
    let rel = table.trim_start_matches("pgmq.");
    let _ = conn.batch_execute("SELECT pg_stat_clear_snapshot()").await;
    let row = conn
        .query_one(
            "SELECT (SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes \
                     WHERE schemaname = 'pgmq' AND relname = $1)::float8, \
                    (SELECT coalesce(heap_blks_hit, 0) + coalesce(idx_blks_hit, 0) \
                     FROM pg_statio_user_tables WHERE schemaname = 'pgmq' AND relname = $1)::float8",
            &[&rel],
        )
        .await;
    match row {
        Ok(r) => {
            let (tup, hits): (f64, f64) = (r.get(0), r.get(1));
            let commits = commits(client).await - usage.commits;
            format!(
                "index entries read {:.1}/msg, buffer hits {:.1}/msg, commits per 100 msg {:.2}",
                tup / n as f64,
                hits / n as f64,
                commits * 100.0 / n as f64
            )
        }
        Err(e) => format!("no table statistics: {e}"),
    }
}

/// Clears pg_stat_statements, when the extension is there (with
/// `pg_stat_statements.track = all` it also sees the statements that PGMQ's
/// functions run).
async fn statements_reset(client: &Client) {
    if let Ok(conn) = client.connection().await {
        let _ = conn
            .batch_execute("SELECT pg_stat_statements_reset()")
            .await;
    }
}

/// The statements on the queue since [`statements_reset`], per message:
/// server time and shared buffers touched, from pg_stat_statements.
async fn statements(client: &Client, n: usize) -> String {
    let Ok(conn) = client.connection().await else {
        return String::new();
    };
    let Ok(rows) = conn
        .query(
            "SELECT calls::float8, rows::float8, total_exec_time, \
                    (shared_blks_hit + shared_blks_read)::float8, \
                    regexp_replace(left(query, 90), '\\s+', ' ', 'g') \
             FROM pg_stat_statements WHERE calls > 10 AND query ~* '(pgmq\\.|q_)' \
             ORDER BY total_exec_time DESC LIMIT 6",
            &[],
        )
        .await
    else {
        return "    (no pg_stat_statements)".to_owned();
    };
    let n = n as f64;
    rows.iter()
        .map(|r| {
            let (calls, rws, ms, blks, q): (f64, f64, f64, f64, String) =
                (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
            format!(
                "    {calls:.0} calls, {rws:.0} rows, {:.1} us/msg, {:.1} buffers/msg, {:.2} ms/call: {q}",
                ms * 1000.0 / n,
                blks / n,
                ms / calls
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn app_name() -> String {
    format!("pgmq-drain-{}", std::process::id())
}

/// An idle worker (default settings) on an empty queue for 10 s: reads a
/// second and CPU used.
async fn idle(client: &Client, q: &QueueName) -> Result<(), Box<dyn std::error::Error>> {
    preload(client, q, 0).await?;
    let w: Worker<IgnoredAny> = Worker::builder(client.clone(), q.clone())
        .handler(|_m: Message<IgnoredAny>| async { Ok(()) })
        .build()?;
    let handle = w.spawn();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (cpu0, reads0, t0) = (cpu_time().await, handle.stats().reads, Instant::now());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (cpu1, reads1, t1) = (cpu_time().await, handle.stats().reads, Instant::now());
    handle.shutdown().await?;
    let secs = (t1 - t0).as_secs_f64();
    println!(
        "idle: {:.1} reads/s, {:.2}% of one core",
        (reads1 - reads0) as f64 / secs,
        (cpu1 - cpu0).as_secs_f64() / secs * 100.0
    );
    Ok(())
}

/// Send-to-handler latency of single messages to an idle worker woken by
/// NOTIFY (polling at 500 ms as the fallback): median and max of 50.
async fn notify_latency(client: &Client, q: &QueueName) -> Result<(), Box<dyn std::error::Error>> {
    preload(client, q, 0).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let w: Worker<IgnoredAny> = Worker::builder(client.clone(), q.clone())
        .wake_up(pgmq_worker::WakeUp::Notify)
        .poll_interval(Duration::from_millis(500))
        .claim_reads(claim_reads()?)
        .handler(move |_m: Message<IgnoredAny>| {
            let _ = tx.send(Instant::now());
            async { Ok(()) }
        })
        .build()?;
    let handle = w.spawn();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut samples = Vec::new();
    for i in 0..51 {
        tokio::time::sleep(Duration::from_millis(20 + (i * 7) % 50)).await;
        let sent = Instant::now();
        client.send(q, &serde_json::json!({ "i": i })).await?;
        let got = rx.recv().await.ok_or("worker stopped")?;
        if i > 0 {
            samples.push(got - sent);
        }
    }
    handle.shutdown().await?;
    samples.sort();
    println!(
        "notify wake-up: median {:?}, p90 {:?}, max {:?}",
        samples[samples.len() / 2],
        samples[samples.len() * 9 / 10],
        samples[samples.len() - 1]
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    match arg(1) {
        Some("notify") => {
            let (_, client, q) = setup().await?;
            notify_latency(&client, &q).await?;
            client.drop_queue(&q).await?;
            Ok(())
        }
        Some("split") => {
            let n = arg(2).map(str::parse).transpose()?.unwrap_or(150_000);
            let rounds = arg(3).map(str::parse).transpose()?.unwrap_or(3);
            split(n, rounds).await
        }
        _ => {
            let n = arg(1).map(str::parse).transpose()?.unwrap_or(100_000);
            let counts: Vec<usize> = arg(2)
                .map(|s| s.split(',').map(str::parse).collect::<Result<_, _>>())
                .transpose()?
                .unwrap_or_else(|| vec![1, 8]);
            let sleep = Duration::from_millis(arg(3).map(str::parse).transpose()?.unwrap_or(0));
            drain(n, &counts, sleep).await
        }
    }
}

/// The default mode: for each handler count, a baseline drain and a worker
/// drain of `n` messages (or, with `n` 0, an idle worker).
async fn drain(
    n: usize,
    counts: &[usize],
    sleep: Duration,
) -> Result<(), Box<dyn std::error::Error>> {
    let (_, client, q) = setup().await?;
    if n == 0 {
        idle(&client, &q).await?;
        client.drop_queue(&q).await?;
        return Ok(());
    }
    // Each worker run is paired with a baseline run just before it: the
    // machine is shared, so only ratios measured side by side mean much.
    for &h in counts {
        let base = if std::env::var_os("DRAIN_NO_BASELINE").is_some() {
            f64::NAN
        } else {
            preload(&client, &q, n).await?;
            baseline(&client, &q, n).await?
        };
        println!("baseline read(100)+delete loop: {base:.0} msg/s");
        preload(&client, &q, n).await?;
        let rate = worker(&client, &q, n, h, sleep).await?;
        println!(
            "worker, {h} handler(s), sleep {sleep:?}: {rate:.0} msg/s ({:.2}x baseline)",
            rate / base
        );
    }
    client.drop_queue(&q).await?;
    Ok(())
}

/// The DSN (PGMQ_TEST_DSN, or the throwaway cluster on 55432), a client
/// whose connections carry this process's application name, and this
/// process's queue name.
async fn setup() -> Result<(String, Client, QueueName), Box<dyn std::error::Error>> {
    let dsn = std::env::var("PGMQ_TEST_DSN")
        .unwrap_or_else(|_| "postgres://pgmq:pgmq@127.0.0.1:55432/pgmq".to_owned());
    let client = Client::builder(&dsn)
        .application_name(&app_name())
        .connect()
        .await?;
    let q = QueueName::new(&format!("drain_{}", std::process::id()))?;
    Ok((dsn, client, q))
}

/// `split` mode (see the file's docs): no-SDK loops beside the worker.
async fn split(n: usize, rounds: usize) -> Result<(), Box<dyn std::error::Error>> {
    let (dsn, client, q) = setup().await?;
    for round in 1..=rounds {
        preload(&client, &q, n).await?;
        let one = plain_loops(&dsn, &q, 1, 0).await?;
        preload(&client, &q, n).await?;
        let two = plain_loops(&dsn, &q, 2, 1).await?;
        preload(&client, &q, n).await?;
        let w = worker(&client, &q, n, 8, Duration::ZERO).await?;
        println!(
            "round {round}: one connection {one:.0} msg/s; 2 claim + 1 delete connections {two:.0} msg/s ({:.2}x); worker, 8 handlers {w:.0} msg/s ({:.2}x)",
            two / one,
            w / one
        );
    }
    client.drop_queue(&q).await?;
    Ok(())
}

const PLAIN_READ: &str = "SELECT * FROM pgmq.read($1::text, 30, 100)";
const PLAIN_DELETE: &str = "SELECT * FROM pgmq.delete($1::text, $2::bigint[])";

async fn plain_connect(dsn: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (c, conn) = tokio_postgres::connect(dsn, NoTls).await?;
    tokio::spawn(conn);
    Ok(c)
}

/// Drains the queue with plain tokio-postgres prepared statements, no SDK:
/// with `deleters` 0, one connection reading and deleting in turn; otherwise
/// `claimers` connections reading back to back, their batches of ids handed
/// to `deleters` connections that delete them, up to two batches per call.
/// Returns messages per second.
async fn plain_loops(
    dsn: &str,
    q: &QueueName,
    claimers: usize,
    deleters: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let name = q.as_str().to_owned();
    let start = Instant::now();
    let done = if deleters == 0 {
        plain_one_connection(dsn, &name).await?
    } else {
        plain_split(dsn, &name, claimers, deleters).await?
    };
    Ok(done as f64 / start.elapsed().as_secs_f64())
}

/// One connection that reads a batch, deletes it, and reads again.
async fn plain_one_connection(dsn: &str, name: &str) -> Result<usize, tokio_postgres::Error> {
    let c = plain_connect(dsn).await?;
    let (r, d) = (c.prepare(PLAIN_READ).await?, c.prepare(PLAIN_DELETE).await?);
    let mut done = 0;
    loop {
        let rows = c.query(&r, &[&name]).await?;
        if rows.is_empty() {
            return Ok(done);
        }
        let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        done += c.query(&d, &[&name, &ids]).await?.len();
    }
}

/// Claim connections reading back to back into a channel of id batches,
/// delete connections emptying it; returns the messages deleted.
async fn plain_split(
    dsn: &str,
    name: &str,
    claimers: usize,
    deleters: usize,
) -> Result<usize, Box<dyn std::error::Error>> {
    let (tx, rx) = async_channel::bounded::<Vec<i64>>(8);
    let mut tasks: JoinSet<Result<usize, tokio_postgres::Error>> = JoinSet::new();
    for _ in 0..claimers {
        let (c, tx, name) = (plain_connect(dsn).await?, tx.clone(), name.to_owned());
        tasks.spawn(async move {
            let r = c.prepare(PLAIN_READ).await?;
            loop {
                let rows = c.query(&r, &[&name]).await?;
                if rows.is_empty() {
                    return Ok(0);
                }
                let _ = tx.send(rows.iter().map(|r| r.get(0)).collect()).await;
            }
        });
    }
    drop(tx);
    for _ in 0..deleters {
        let (c, rx, name) = (plain_connect(dsn).await?, rx.clone(), name.to_owned());
        tasks.spawn(async move {
            let d = c.prepare(PLAIN_DELETE).await?;
            let mut done = 0;
            while let Ok(mut ids) = rx.recv().await {
                // Up to two read batches per delete, as the worker's
                // completer writes twice the claim batch.
                if let Ok(more) = rx.try_recv() {
                    ids.extend(more);
                }
                done += c.query(&d, &[&name, &ids]).await?.len();
            }
            Ok(done)
        });
    }
    let mut done = 0;
    while let Some(r) = tasks.join_next().await {
        done += r??;
    }
    Ok(done)
}
