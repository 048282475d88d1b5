//! Measures this SDK (pgmq-client, pgmq-worker) against the crates.io `pgmq`
//! crate (its sqlx-based `PGMQueueExt`) on one database, side by side:
//!
//! - `single_send`: one connection each, N sequential `send` calls;
//! - `batch_send`: one connection each, `send_batch` of 100 until the total;
//! - `consume_c1` / `consume_c8`: a preloaded, vacuumed backlog drained by
//!   the `pgmq` crate's simple consumer (read_batch 100 + delete_batch, 1 or
//!   8 tasks on a pool of that size) and by pgmq-worker's `Worker` (empty
//!   handler, concurrency 1 or 8, every other setting at its default).
//!
//! Rounds are interleaved (the two sides alternate which goes first: A B, B A,
//! ...) after one unrecorded warm-up round, and every round also records the
//! ratio SDK / pgmq crate, which cancels most of the drift of a shared machine.
//! Each consumed message is marked in a per-run bitmap: a run fails when any
//! id is missing, seen twice, or left in the queue.
//!
//! The DSN comes from `PGMQ_COMPARE_DSN` (never from the command line, so its
//! password stays out of process listings); the document records only its
//! host and port. Flags: `--rounds N`, `--single N`, `--batch-total N`,
//! `--backlog N`, `--output PATH`, `--quick` (1 round, small sizes, a smoke
//! test). Exit status 0 when every run counted every message exactly once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgmq::PGMQueueExt;
use pgmq_client::{Client, QueueName};
use pgmq_worker::{Outcome, Worker};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

/// The `pgmq` crate release measured (pinned in Cargo.toml).
const PGMQ_CRATE_VERSION: &str = "0.34.0-alpha.7";
/// Messages per `send_batch` and per read on the `pgmq` crate's consumer
/// (the worker's default batch size is the same).
const BATCH: usize = 100;
/// Visibility timeout of the `pgmq` crate's consumer reads, in seconds: far
/// longer than a run, so no message comes back while another task holds it.
const VT_S: i32 = 120;
/// Server-side preload, as pgmq-bench does it: ids g in first..=last.
const PRELOAD_SQL: &str = "SELECT count(*) FROM pgmq.send_batch($1::text, ARRAY(\
    SELECT jsonb_build_object('id', g, 'pad', $4::text) \
    FROM generate_series($2::bigint, $3::bigint) AS g))";
const PRELOAD_CHUNK: u64 = 10_000;

/// The body both sides send: about 100 bytes of JSON.
#[derive(Serialize)]
struct OutBody<'a> {
    id: u64,
    pad: &'a str,
}

/// What both consumers decode.
#[derive(Deserialize)]
struct InBody {
    id: u64,
}

struct Args {
    rounds: usize,
    single: u64,
    batch_total: u64,
    backlog: u64,
    output: Option<String>,
    quick: bool,
}

fn parse_args() -> Res<Args> {
    let mut a = Args {
        rounds: 3,
        single: 5_000,
        batch_total: 100_000,
        backlog: 100_000,
        output: None,
        quick: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--rounds" => a.rounds = val()?.parse()?,
            "--single" => a.single = val()?.parse()?,
            "--batch-total" => a.batch_total = val()?.parse()?,
            "--backlog" => a.backlog = val()?.parse()?,
            "--output" => a.output = Some(val()?),
            "--quick" => {
                a.quick = true;
                a.rounds = 1;
                a.single = 500;
                a.batch_total = 5_000;
                a.backlog = 5_000;
            }
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    if a.rounds == 0 {
        return Err("--rounds must be at least 1".into());
    }
    Ok(a)
}

/// Which implementation a run used.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    /// The crates.io `pgmq` crate.
    Crate,
    /// This SDK.
    Sdk,
}

impl Side {
    fn key(self) -> &'static str {
        match self {
            Side::Crate => "pgmq_crate",
            Side::Sdk => "sdk",
        }
    }
}

/// Everything a run needs.
struct Ctx {
    dsn: String,
    admin: tokio_postgres::Client,
    pad: String,
    seq: AtomicU64,
}

impl Ctx {
    /// A fresh, uniquely named queue.
    async fn fresh_queue(&self, what: &str) -> Res<QueueName> {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let q = QueueName::new(&format!("cmp_{}_{what}_{n}", std::process::id()))?;
        self.admin
            .query("SELECT pgmq.create($1::text)", &[&q.as_str()])
            .await?;
        Ok(q)
    }

    async fn drop_queue(&self, q: &QueueName) -> Res<()> {
        self.admin
            .query("SELECT pgmq.drop_queue($1::text)", &[&q.as_str()])
            .await?;
        Ok(())
    }

    async fn queue_length(&self, q: &QueueName) -> Res<i64> {
        // QueueName admits only [a-z0-9_]: a plain identifier.
        let row = self
            .admin
            .query_one(&format!("SELECT count(*) FROM {}", q.table()), &[])
            .await?;
        Ok(row.get(0))
    }

    /// Loads ids 0..n on the server, then VACUUM (ANALYZE) so dead tuples of
    /// an earlier run never slow `pgmq.read`.
    async fn preload(&self, q: &QueueName, n: u64) -> Res<()> {
        let mut first = 0u64;
        while first < n {
            let last = (first + PRELOAD_CHUNK).min(n) - 1;
            self.admin
                .query_one(
                    PRELOAD_SQL,
                    &[&q.as_str(), &(first as i64), &(last as i64), &self.pad],
                )
                .await?;
            first = last + 1;
        }
        self.admin
            .batch_execute(&format!("VACUUM (ANALYZE) {}", q.table()))
            .await?;
        Ok(())
    }
}

/// One id bitmap per consume run: counts each id once, and duplicates.
struct Ledger {
    seen: Vec<AtomicBool>,
    distinct: AtomicU64,
    duplicates: AtomicU64,
    unexpected: AtomicU64,
}

impl Ledger {
    fn new(n: u64) -> Ledger {
        Ledger {
            seen: (0..n).map(|_| AtomicBool::new(false)).collect(),
            distinct: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            unexpected: AtomicU64::new(0),
        }
    }

    fn mark(&self, id: u64) {
        match self.seen.get(id as usize) {
            Some(b) if !b.swap(true, Ordering::AcqRel) => {
                self.distinct.fetch_add(1, Ordering::AcqRel);
            }
            Some(_) => {
                self.duplicates.fetch_add(1, Ordering::AcqRel);
            }
            None => {
                self.unexpected.fetch_add(1, Ordering::AcqRel);
            }
        }
    }
}

/// One measured run.
#[derive(Serialize, Clone)]
struct Run {
    round: usize,
    side: &'static str,
    messages: u64,
    elapsed_s: f64,
    msgs_per_s: f64,
    /// single_send only: per-call latency percentiles, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    latency_ms: Option<Value>,
    /// consume only: the exactly-once check and the queue after the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    check: Option<Value>,
    load_1m: f64,
}

fn rate(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

fn loadavg() -> (f64, f64, f64) {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let v: Vec<f64> = s
        .split_whitespace()
        .take(3)
        .filter_map(|x| x.parse().ok())
        .collect();
    (
        v.first().copied().unwrap_or(f64::NAN),
        v.get(1).copied().unwrap_or(f64::NAN),
        v.get(2).copied().unwrap_or(f64::NAN),
    )
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn latency_summary(mut lat_ms: Vec<f64>) -> Value {
    lat_ms.sort_by(f64::total_cmp);
    json!({
        "p50": pct(&lat_ms, 50.0),
        "p99": pct(&lat_ms, 99.0),
        "max": lat_ms.last().copied().unwrap_or(f64::NAN),
    })
}

// ---- sends (both sides through the same loops) ------------------------------

/// `n` sequential single sends into a fresh queue; returns the elapsed time
/// and per-call latency percentiles. The queue is checked and dropped after.
async fn single_loop(
    ctx: &Ctx,
    what: &str,
    n: u64,
    mut send: impl AsyncFnMut(&QueueName, &OutBody<'_>) -> Res<()>,
) -> Res<(Duration, Value)> {
    let q = ctx.fresh_queue(what).await?;
    let mut lat = Vec::with_capacity(n as usize);
    let start = Instant::now();
    for id in 0..n {
        let t = Instant::now();
        send(&q, &OutBody { id, pad: &ctx.pad }).await?;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let d = start.elapsed();
    check_length(ctx, &q, n as i64).await?;
    ctx.drop_queue(&q).await?;
    Ok((d, latency_summary(lat)))
}

/// Sequential batches of [`BATCH`] until `total`, into a fresh queue; `send`
/// returns how many ids the batch got back. The queue is checked and dropped after.
async fn batch_loop(
    ctx: &Ctx,
    what: &str,
    total: u64,
    mut send: impl AsyncFnMut(&QueueName, &[OutBody<'_>]) -> Res<usize>,
) -> Res<Duration> {
    let q = ctx.fresh_queue(what).await?;
    let start = Instant::now();
    let mut first = 0u64;
    while first < total {
        let end = (first + BATCH as u64).min(total);
        let bodies: Vec<OutBody> = (first..end)
            .map(|id| OutBody { id, pad: &ctx.pad })
            .collect();
        if send(&q, &bodies).await? != bodies.len() {
            return Err("send_batch returned fewer ids than it was given".into());
        }
        first = end;
    }
    let d = start.elapsed();
    check_length(ctx, &q, total as i64).await?;
    ctx.drop_queue(&q).await?;
    Ok(d)
}

async fn crate_single(ctx: &Ctx, n: u64) -> Res<(Duration, Value)> {
    let pq = PGMQueueExt::new(ctx.dsn.clone(), 1).await?;
    let r = single_loop(ctx, "cs", n, async |q, body| {
        pq.send(q.as_str(), body).await?;
        Ok(())
    })
    .await;
    pq.connection.close().await;
    r
}

async fn crate_batch(ctx: &Ctx, total: u64) -> Res<Duration> {
    let pq = PGMQueueExt::new(ctx.dsn.clone(), 1).await?;
    let r = batch_loop(ctx, "cb", total, async |q, bodies| {
        Ok(pq.send_batch(q.as_str(), bodies).await?.len())
    })
    .await;
    pq.connection.close().await;
    r
}

async fn sdk_client(ctx: &Ctx, pool: u32) -> Res<Client> {
    Ok(Client::builder(&ctx.dsn).max_size(pool).connect().await?)
}

async fn sdk_single(ctx: &Ctx, n: u64) -> Res<(Duration, Value)> {
    let client = sdk_client(ctx, 1).await?;
    single_loop(ctx, "ss", n, async |q, body| {
        client.send(q, body).await?;
        Ok(())
    })
    .await
}

async fn sdk_batch(ctx: &Ctx, total: u64) -> Res<Duration> {
    let client = sdk_client(ctx, 1).await?;
    batch_loop(ctx, "sb", total, async |q, bodies| {
        Ok(client.send_batch(q, bodies).await?.len())
    })
    .await
}

// ---- consumers ----------------------------------------------------------------

/// The `pgmq` crate's simple consumer: `tasks` tasks on a pool of `tasks`
/// connections, each reading batches of 100 and deleting each batch with one
/// `delete_batch`, until a read comes back empty (the visibility timeout is
/// far longer than the run, so an empty read means nothing is left to claim).
async fn crate_consume(
    ctx: &Ctx,
    q: &QueueName,
    n: u64,
    tasks: usize,
) -> Res<(Duration, Arc<Ledger>)> {
    let pq = PGMQueueExt::new(ctx.dsn.clone(), tasks as u32).await?;
    let ledger = Arc::new(Ledger::new(n));
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..tasks {
        let pq = pq.clone();
        let q = q.as_str().to_owned();
        let ledger = ledger.clone();
        set.spawn(async move {
            loop {
                let msgs = pq
                    .read_batch::<InBody, Value>(&q, VT_S, BATCH as i32)
                    .await?;
                if msgs.is_empty() {
                    return Ok::<_, pgmq::PgmqError>(());
                }
                let ids: Vec<i64> = msgs.iter().map(|m| m.msg_id).collect();
                for m in &msgs {
                    ledger.mark(m.message.id);
                }
                pq.delete_batch(&q, &ids).await?;
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let d = start.elapsed();
    pq.connection.close().await;
    Ok((d, ledger))
}

/// pgmq-worker's `Worker` with an empty handler (it marks the id and deletes)
/// at `concurrency`, every other setting at its default, on a client with the
/// default pool. Elapsed runs from spawn until `shutdown` has returned, i.e.
/// until the batched deletes of every message are written, the same end point
/// as the `pgmq` crate's loop (which deletes each batch before it reads the
/// next). The time to the last handler is recorded too.
async fn sdk_consume(
    ctx: &Ctx,
    q: &QueueName,
    n: u64,
    concurrency: usize,
) -> Res<(Duration, Duration, Arc<Ledger>)> {
    let client = Client::connect(&ctx.dsn).await?;
    let ledger = Arc::new(Ledger::new(n));
    let done = Arc::new(tokio::sync::Notify::new());
    let l = ledger.clone();
    let dn = done.clone();
    let worker = Worker::<InBody>::builder(client, q.clone())
        .concurrency(concurrency)
        .handler(move |msg: pgmq_client::Message<InBody>| {
            let l = l.clone();
            let dn = dn.clone();
            async move {
                l.mark(msg.body.id);
                if l.distinct.load(Ordering::Acquire) >= l.seen.len() as u64 {
                    dn.notify_one();
                }
                Ok(Outcome::Delete)
            }
        })
        .build()?;
    let start = Instant::now();
    let handle = worker.spawn();
    // Every id handled, or nothing new for 30 s (then the check fails).
    let mut last = 0;
    loop {
        if ledger.distinct.load(Ordering::Acquire) >= n {
            break;
        }
        let _ = tokio::time::timeout(Duration::from_secs(30), done.notified()).await;
        let now = ledger.distinct.load(Ordering::Acquire);
        if now == last && now < n {
            break;
        }
        last = now;
    }
    let handled = start.elapsed();
    handle.shutdown().await?;
    Ok((start.elapsed(), handled, ledger))
}

// ---- runs -----------------------------------------------------------------

async fn check_length(ctx: &Ctx, q: &QueueName, want: i64) -> Res<()> {
    let got = ctx.queue_length(q).await?;
    if got != want {
        return Err(format!("queue {q} holds {got} messages, expected {want}").into());
    }
    Ok(())
}

async fn run_one(ctx: &Ctx, scenario: &str, side: Side, round: usize, a: &Args) -> Res<Run> {
    let mut run = Run {
        round,
        side: side.key(),
        messages: 0,
        elapsed_s: 0.0,
        msgs_per_s: 0.0,
        latency_ms: None,
        check: None,
        load_1m: loadavg().0,
    };
    let (n, d) = match scenario {
        "single_send" => {
            let (d, lat) = match side {
                Side::Crate => crate_single(ctx, a.single).await?,
                Side::Sdk => sdk_single(ctx, a.single).await?,
            };
            run.latency_ms = Some(lat);
            (a.single, d)
        }
        "batch_send" => {
            let d = match side {
                Side::Crate => crate_batch(ctx, a.batch_total).await?,
                Side::Sdk => sdk_batch(ctx, a.batch_total).await?,
            };
            (a.batch_total, d)
        }
        "consume_c1" | "consume_c8" => {
            let c = if scenario == "consume_c1" { 1 } else { 8 };
            let n = a.backlog;
            let q = ctx
                .fresh_queue(if side == Side::Crate { "cc" } else { "sc" })
                .await?;
            ctx.preload(&q, n).await?;
            let (d, handled, ledger) = match side {
                Side::Crate => {
                    let (d, l) = crate_consume(ctx, &q, n, c).await?;
                    (d, d, l)
                }
                Side::Sdk => sdk_consume(ctx, &q, n, c).await?,
            };
            let remaining = ctx.queue_length(&q).await?;
            ctx.drop_queue(&q).await?;
            let distinct = ledger.distinct.load(Ordering::Acquire);
            let duplicates = ledger.duplicates.load(Ordering::Acquire);
            let unexpected = ledger.unexpected.load(Ordering::Acquire);
            let ok = distinct == n && duplicates == 0 && unexpected == 0 && remaining == 0;
            run.check = Some(json!({
                "distinct": distinct,
                "missing": n - distinct,
                "duplicates": duplicates,
                "unexpected": unexpected,
                "remaining_after": remaining,
                "last_handler_s": handled.as_secs_f64(),
                "exactly_once": ok,
            }));
            if !ok {
                return Err(format!(
                    "{scenario} {}: distinct {distinct} of {n}, duplicates {duplicates}, \
                     unexpected {unexpected}, remaining {remaining}",
                    side.key()
                )
                .into());
            }
            (n, d)
        }
        _ => unreachable!("unknown scenario {scenario}"),
    };
    run.messages = n;
    run.elapsed_s = d.as_secs_f64();
    run.msgs_per_s = rate(n, d);
    Ok(run)
}

const SCENARIOS: [&str; 4] = ["single_send", "batch_send", "consume_c1", "consume_c8"];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn summary(v: &[f64]) -> Value {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    json!({ "median": median(v.to_vec()), "min": min, "max": max, "rounds": v.len(), "values": v })
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_default()
}

#[tokio::main]
async fn main() {
    match real_main().await {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("compare-pgmq-crate: {e}");
            std::process::exit(2);
        }
    }
}

async fn real_main() -> Res<bool> {
    let a = parse_args()?;
    let dsn = std::env::var("PGMQ_COMPARE_DSN").map_err(|_| "set PGMQ_COMPARE_DSN")?;
    let cfg: tokio_postgres::Config = dsn.parse()?;
    let host = match cfg.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => String::new(),
    };
    // Host and port only: the DSN's password never reaches the document.
    let target = format!(
        "{host}:{}",
        cfg.get_ports().first().copied().unwrap_or(5432)
    );
    let (admin, conn) = cfg.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            eprintln!("admin connection: {e}");
        }
    });
    let server_version: String = admin.query_one("SHOW server_version", &[]).await?.get(0);
    let pgmq_version: String = admin
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'pgmq'",
            &[],
        )
        .await?
        .get(0);
    // ~100-byte bodies, as pgmq-bench sends: {"id": n, "pad": "xxx..."}.
    let ctx = Ctx {
        dsn,
        admin,
        pad: "x".repeat(80),
        seq: AtomicU64::new(0),
    };
    let load_start = loadavg();
    let started = Instant::now();

    // Warm-up: both sides once at a tenth of the sizes (at least 1,000), not recorded.
    if !a.quick {
        let w = Args {
            rounds: 1,
            single: (a.single / 10).max(1_000),
            batch_total: (a.batch_total / 10).max(1_000),
            backlog: (a.backlog / 10).max(1_000),
            output: None,
            quick: false,
        };
        eprintln!("warm-up ...");
        for s in SCENARIOS {
            for side in [Side::Crate, Side::Sdk] {
                run_one(&ctx, s, side, 0, &w).await?;
            }
        }
    }

    let mut runs: BTreeMap<&str, Vec<Run>> = BTreeMap::new();
    let mut failed = false;
    for round in 1..=a.rounds {
        // Odd rounds: the pgmq crate first; even rounds: this SDK first.
        let order = if round % 2 == 1 {
            [Side::Crate, Side::Sdk]
        } else {
            [Side::Sdk, Side::Crate]
        };
        for s in SCENARIOS {
            for side in order {
                match run_one(&ctx, s, side, round, &a).await {
                    Ok(r) => {
                        eprintln!(
                            "round {round} {s:<12} {:<10} {:>10.0} msg/s  ({:.2} s, load {:.2})",
                            r.side, r.msgs_per_s, r.elapsed_s, r.load_1m
                        );
                        runs.entry(s).or_default().push(r);
                    }
                    Err(e) => {
                        eprintln!("round {round} {s} {}: FAILED: {e}", side.key());
                        failed = true;
                    }
                }
            }
        }
    }
    let load_end = loadavg();

    let mut figures = serde_json::Map::new();
    let mut table = Vec::new();
    for s in SCENARIOS {
        let rs = runs.get(s).cloned().unwrap_or_default();
        let of = |side: Side| -> Vec<f64> {
            rs.iter()
                .filter(|r| r.side == side.key())
                .map(|r| r.msgs_per_s)
                .collect()
        };
        let (c, k) = (of(Side::Crate), of(Side::Sdk));
        // Ratio within each round: SDK / pgmq crate.
        let ratios: Vec<f64> = (1..=a.rounds)
            .filter_map(|round| {
                let get = |side: Side| {
                    rs.iter()
                        .find(|r| r.round == round && r.side == side.key())
                        .map(|r| r.msgs_per_s)
                };
                Some(get(Side::Sdk)? / get(Side::Crate)?)
            })
            .collect();
        figures.insert(
            s.to_owned(),
            json!({
                "unit": "messages/s",
                "pgmq_crate": summary(&c),
                "sdk": summary(&k),
                "ratio_sdk_over_crate": summary(&ratios),
                "runs": rs,
            }),
        );
        table.push((s, summary(&c), summary(&k), summary(&ratios)));
    }

    let commit = std::env::var("COMPARE_GIT_COMMIT").unwrap_or_default();
    let doc = json!({
        "schema": "compare-pgmq-crate.v1",
        "conditions": {
            "git_commit": commit,
            "git_dirty": std::env::var("COMPARE_GIT_DIRTY").ok().map(|v| v == "1"),
            "started_unix_s": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64() - started.elapsed().as_secs_f64())
                .unwrap_or_default(),
            "wall_s": started.elapsed().as_secs_f64(),
            "versions": {
                "pgmq_crate": PGMQ_CRATE_VERSION,
                "pgmq_crate_backend": "sqlx (PGMQueueExt, default features)",
                "sqlx": std::env::var("COMPARE_SQLX_VERSION").unwrap_or_default(),
                "sdk": std::env::var("COMPARE_SDK_VERSION").unwrap_or_default(),
                "rustc": std::env::var("COMPARE_RUSTC").unwrap_or_default(),
                "postgresql": server_version,
                "pgmq_extension": pgmq_version,
            },
            "database": target,
            "machine": {
                "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
                "cpu_model": cpu_model(),
                "note": "database server on the same machine, over 127.0.0.1; other jobs may share the CPUs (see load)",
            },
            "load_avg_start": [load_start.0, load_start.1, load_start.2],
            "load_avg_end": [load_end.0, load_end.1, load_end.2],
            "sizes": {
                "single_send_messages": a.single,
                "batch_send_messages": a.batch_total,
                "batch_size": BATCH,
                "backlog_messages": a.backlog,
                "body_bytes_approx": 100,
            },
            "method": {
                "rounds": a.rounds,
                "warmup": if a.quick { "none" } else { "one unrecorded round of both sides at a tenth of the sizes" },
                "order": "interleaved; odd rounds pgmq crate first, even rounds SDK first",
                "single_send": "one pooled connection each (pgmq crate: PGMQueueExt pool of 1; SDK: Client pool of 1), sequential send() calls, fresh queue",
                "batch_send": "one pooled connection each, sequential send_batch() of 100, fresh queue",
                "consume": "fresh queue preloaded server-side and VACUUM (ANALYZE)ed; pgmq crate: N tasks on a PGMQueueExt pool of N, each read_batch(vt 120 s, 100) + delete_batch until an empty read; SDK: pgmq-worker Worker, concurrency N, default settings (batch 100), empty handler returning Outcome::Delete, Client::connect default pool; elapsed ends when every message is deleted (SDK: shutdown() returned); each id counted in a bitmap, run fails on a missing id, a duplicate, or a message left in the queue",
                "ratio": "per round, SDK msgs/s divided by pgmq crate msgs/s",
            },
        },
        "figures": figures,
        "all_exactly_once": !failed,
    });

    let text = serde_json::to_string_pretty(&doc)?;
    if let Some(path) = &a.output {
        std::fs::write(path, text + "\n")?;
    } else {
        println!("{text}");
    }

    println!(
        "| scenario | pgmq crate {PGMQ_CRATE_VERSION}, msg/s | this SDK, msg/s | SDK / crate | per-round SDK / crate, min-max |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for (s, c, k, r) in table {
        let med = |v: &Value, key: &str| v[key].as_f64().unwrap_or(f64::NAN);
        println!(
            "{}",
            table_row(
                s,
                med(&c, "median"),
                med(&k, "median"),
                (med(&r, "min"), med(&r, "max"))
            )
        );
    }
    println!(
        "\nrates: medians of {} interleaved rounds; SDK / crate: the ratio of those two medians \
         (so the columns agree); the last column: the range of the ratios taken within each \
         round; load average {:.2} at start, {:.2} at end",
        a.rounds, load_start.0, load_end.0
    );
    Ok(!failed)
}

/// One row of the printed table. The ratio column is computed from the two
/// rates as printed (whole messages/s), so that a reader who
/// divides the columns gets the ratio shown; the per-round ratios, which
/// cancel most of a shared machine's drift, are given as a range beside it.
fn table_row(scenario: &str, crate_rate: f64, sdk_rate: f64, per_round: (f64, f64)) -> String {
    let (c, k) = (crate_rate.round(), sdk_rate.round());
    format!(
        "| {scenario} | {c:.0} | {k:.0} | {:.2}x | {:.2}-{:.2} |",
        k / c,
        per_round.0,
        per_round.1
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ratio_column_is_the_ratio_of_the_rate_columns() {
        // The README's old rows, whose ratio column (1.12x, 0.87x) was the
        // median of per-round ratios and disagreed with the rates shown.
        let row = table_row("single send", 169.0, 237.0, (1.00, 1.71));
        assert_eq!(row, "| single send | 169 | 237 | 1.40x | 1.00-1.71 |");
        let row = table_row("drain, 8 consumers", 19_114.2, 18_534.4, (0.70, 1.09));
        assert_eq!(row, "| drain, 8 consumers | 19114 | 18534 | 0.97x | 0.70-1.09 |");
    }
}
