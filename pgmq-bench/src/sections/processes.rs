//! worker_processes: `--processes 1,2,4,8` separate worker processes draining
//! one queue. Operators size deployments in processes, not threads.
//!
//! Per run: a fresh queue of `--processes-messages` (400,000) is preloaded and vacuumed; the bench
//! starts N copies of its own binary (`pgmq-bench process-worker`, hidden),
//! each with its own SDK client, pool and worker of `--backlog-workers`
//! handlers (and, with `--handler db-write`, its own sink pool). Each child
//! connects, builds its worker and says `ready`; when all are ready the
//! parent says `go` to each, and each child's clock starts there. A child
//! stops when the queue is empty (`pgmq.metrics` queue length 0: every
//! message deleted, in flight included; asked only once its handlers went
//! quiet, so that the probe's table scans do not grow with the processes)
//! or after `--stall-timeout` without progress, shuts its worker down (acknowledgements drained), writes the ids
//! it handled to a file and says `report` with one JSON value: its handled
//! count, its seconds from `go` to its last handler's end, its worker
//! counters and peak RSS. The spec, the lines and the handshake are
//! pgmq-testkit's child protocol ([`pgmq_testkit::child`]), the fault
//! suite's too.
//!
//! The parent merges every child's ids into one ledger (a message handled by
//! two processes is a duplicate, and fails the run), and reports the combined
//! rate (distinct messages over the slowest child's seconds), each process's
//! rate, and how evenly the work was shared: each process's share of the
//! messages, the smallest share over the largest, and Jain's fairness index
//! `(Σx)² / (n·Σx²)` (1 when all handled the same number, 1/n when one did
//! everything).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgmq_client::QueueName;
use pgmq_testkit::child::{say_json, say_ready, spec_from_arg, wait_for_go, Line, Spawn, Stderr};
use serde::{Deserialize, Serialize};

use crate::document::{ClaimReadsArg, HandlerKind};
use crate::document::{LedgerReport, Percentiles, Rate, Runs, SectionRuns, WorkerCounters};
use crate::error::{Error, Result};
use crate::ledger::Ledger;
use crate::process::MemoryMeter;
use crate::sections::consume::{with_claim_reads, worker_on, Tally};
use crate::sections::{counters, Ctx, InBody, Sink};
use crate::stats::percentiles_us_to_ms;
use std::fmt::Write as _;

use futures::future::BoxFuture;

use crate::checks::{run_tag, Checks};
use crate::document::{Better, Document, Figure, Sample, Sections, TargetCheck};
use crate::figures::{check, counts_in_ids, measured, median_of, Figures};
use crate::report::{cell, definitions, figure_keys};
use crate::report::{fmt_value, thousands};
use crate::sections::{Round, Section};
use crate::config::Config;
use crate::sections::plan::{self, Plan};

/// The section's runs in the document.
pub(crate) const RUNS: Runs<ProcessesRun> = Runs::new("worker_processes");

/// A worker_processes run: N processes draining one queue.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct ProcessesRun {
    /// Round.
    pub round: u32,
    /// Warm-up or measured (always measured: the section does not warm up).
    pub warmup: bool,
    /// Worker processes.
    pub processes: u32,
    /// Handler concurrency of each process.
    pub workers_per_process: u32,
    /// `empty`, `db-write` or `db-write-tx`.
    #[schemars(with = "HandlerKind")]
    pub handler: String,
    /// Simulated I/O per handler call, milliseconds.
    pub handler_work_ms: u64,
    /// Combined: distinct messages handled over the slowest process's seconds
    /// (each from its `go` to its last handler's end).
    #[serde(flatten)]
    pub rate: Rate,
    /// Each process.
    pub per_process: Vec<ProcessShare>,
    /// The smallest process's message count over the largest's (1: even).
    pub min_over_max: f64,
    /// Jain's fairness index of the per-process counts: (Σx)² / (n·Σx²),
    /// 1 when even, 1/n when one process did everything.
    pub jain_index: f64,
    /// Every process's ids merged: a message handled by two processes is a duplicate.
    pub ledger: LedgerReport,
    /// Messages left after every process stopped (must be 0).
    pub remaining_after: i64,
    /// Seconds to preload the queue (not timed).
    pub preload_s: f64,
    /// Seconds of VACUUM (not timed).
    pub vacuum_s: f64,
    /// The database's own counters over the run (absent when unreadable,
    /// and in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ProcessesServer>,
}

/// The database's own counters over a worker_processes run, from the
/// processes' `go` to their exit: the queue table's statistics
/// (`pg_stat_user_tables`, `pg_statio_user_tables`) and the database's
/// transactions (`pg_stat_database`), per message handled. Unlike the rates
/// they do not depend on how loaded the machine was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct ProcessesServer {
    /// Shared buffers (hit or read) of the queue table and its indexes.
    pub buffers_per_msg: f64,
    /// Rows the queue table's index scans fetched (`idx_tup_fetch`): rows
    /// examined, the claimed and the skipped.
    pub index_rows_per_msg: f64,
    /// Committed and rolled-back transactions in the database (every
    /// statement of a worker is one).
    pub transactions_per_msg: f64,
    /// Rows updated in the queue table (claims, extensions).
    pub rows_updated: u64,
    /// Rows deleted from the queue table (acknowledgements).
    pub rows_deleted: u64,
    /// CPU of every process of the PostgreSQL cluster, microseconds per
    /// message (None: the server does not run on the bench's host, and in
    /// older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_us_per_msg: Option<f64>,
    /// CPU of the worker processes (user and system, from their start to
    /// their exit), microseconds per message (None in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers_cpu_us_per_msg: Option<f64>,
}

/// One process of a worker_processes run.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct ProcessShare {
    /// 0-based.
    pub index: u32,
    /// Its handler calls over its seconds.
    pub rate: Rate,
    /// Its fraction of all handler calls.
    pub share: f64,
    /// Whether it stopped on a stall rather than an empty queue.
    pub stalled: bool,
    /// Its worker's counters at shutdown.
    pub worker: WorkerCounters,
    /// Its handler durations.
    pub handler_ms: Percentiles,
    /// Its peak RSS, bytes.
    pub peak_rss_bytes: u64,
}

/// The settings of a worker process, which the section passes as the
/// hidden `process-worker` subcommand's one JSON argument
/// (pgmq-testkit's child protocol). The DSN is not among them: it comes in
/// [`DSN_ENV`], never on the command line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ChildSpec {
    /// The queue to drain.
    queue: String,
    /// Handler concurrency.
    workers: u32,
    /// Claim batch size.
    batch_size: u32,
    /// Visibility timeout, seconds.
    vt: u32,
    /// SDK pool size.
    pool_size: u32,
    /// What handlers do.
    handler: HandlerKind,
    /// Simulated I/O per handler call, milliseconds.
    handler_work_ms: u64,
    /// How the worker reads the queue (absent: the worker's default).
    claim_reads: Option<ClaimReadsArg>,
    /// Give up after this many seconds without progress.
    stall_timeout_s: f64,
    /// Where to write the handled ids (little-endian u64 each).
    ids_out: PathBuf,
    /// Places of a fleet-wide limit shared by every process (fleet_limit);
    /// absent: no limit.
    #[serde(default)]
    fleet_places: Option<u32>,
}

/// The environment variable that holds a worker process's DSN.
const DSN_ENV: &str = "PGMQ_BENCH_DSN";

/// A started worker process: its `report` line is a [`ChildReport`], it
/// writes no `stats`.
pub(crate) type WorkerChild = pgmq_testkit::child::Child<(), ChildReport>;

/// What a child says on its `report` line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildReport {
    /// Handler calls.
    pub handled: u64,
    /// Distinct ids handled.
    pub distinct: u64,
    /// Seconds from `go` to the end of its last handler call.
    pub elapsed_s: f64,
    /// Worker counters at shutdown.
    pub worker: WorkerCounters,
    /// Handler durations.
    pub handler_ms: Percentiles,
    /// Peak RSS from `go` to the end, bytes.
    pub peak_rss_bytes: u64,
    /// Whether it stopped on a stall instead of an empty queue.
    pub stalled: bool,
}

/// The `process-worker` subcommand: `spec` is the section's settings for
/// the child as JSON (pgmq-testkit's child protocol), its DSN in
/// `PGMQ_BENCH_DSN`. Drains until the queue is empty, reports, exits (2 when the
/// parent did not say `go`).
pub async fn child_main(spec: &str) -> Result<i32> {
    let a: ChildSpec = spec_from_arg(spec).map_err(|e| Error::Config(e.to_string()))?;
    let dsn = std::env::var(DSN_ENV)
        .map_err(|_| Error::Config(format!("process-worker needs {DSN_ENV}")))?;
    let q = QueueName::new(&a.queue)?;
    let ChildWorker {
        client,
        tally,
        worker: w,
    } = child_worker(&a, &dsn, &q).await?;
    let meter = MemoryMeter::start();
    say_ready();
    if !wait_for_go()
        .await
        .map_err(|e| Error::Config(format!("reading stdin: {e}")))?
    {
        return Ok(2);
    }
    meter.begin();
    let start = Instant::now();
    let start_ns = u64::try_from(start.duration_since(tally.base).as_nanos()).unwrap_or(0);
    let handle = w.spawn();
    let stall = Duration::from_secs_f64(a.stall_timeout_s);
    let stalled = drain_until_empty(&client, &q, &tally, stall).await?;
    let report = handle.shutdown().await?;
    let peak = meter.end();
    let last_ns = tally
        .last_done_ns
        .load(std::sync::atomic::Ordering::Acquire);
    let elapsed_s = last_ns.saturating_sub(start_ns) as f64 / 1e9;
    let ids = tally.ledger.ids();
    write_ids(&a.ids_out, &ids).await?;
    let out = ChildReport {
        handled: tally.ledger.handled(),
        distinct: ids.len() as u64,
        elapsed_s,
        worker: counters(&report.stats),
        handler_ms: percentiles_us_to_ms(&report.stats.handler_latency),
        peak_rss_bytes: peak,
        stalled,
    };
    say_json(Line::Report, &out).map_err(|e| Error::Config(format!("the child report: {e}")))?;
    Ok(0)
}

/// A child's own SDK client, the tally its handlers feed, and its worker
/// (built, not started).
struct ChildWorker {
    client: pgmq_client::Client,
    tally: Arc<Tally>,
    worker: pgmq_worker::Worker<InBody>,
}

/// Connects the child's client (and, with `--handler db-write`, its sink
/// pool) and builds its worker on `q` as the arguments say.
async fn child_worker(a: &ChildSpec, dsn: &str, q: &QueueName) -> Result<ChildWorker> {
    // The password where the parent found it (the DSN, PGPASSWORD or the
    // password file, all inherited).
    let target = crate::target::Target::resolve(dsn)?;
    let client = target
        .builder()
        .max_size(a.pool_size)
        .application_name("pgmq-bench-process")
        .connect()
        .await?;
    let sink = match a.handler {
        HandlerKind::DbWrite => Some(Sink::connect(&target, a.workers).await?),
        HandlerKind::DbWriteTx | HandlerKind::Empty => None,
    };
    let tally = Tally::new(u64::MAX, Duration::from_millis(a.handler_work_ms));
    let w = worker_on(
        client.clone(),
        q,
        a.workers,
        a.batch_size,
        Duration::from_secs(u64::from(a.vt)),
        &tally,
        sink,
        a.handler == HandlerKind::DbWriteTx,
    );
    let mut w = with_claim_reads(w, a.claim_reads);
    if let Some(places) = a.fleet_places {
        w = w.fleet_limit(pgmq_client::FleetLimit::max_running(places));
    }
    let worker = w.build()?;
    Ok(ChildWorker {
        client,
        tally,
        worker,
    })
}

/// Looks every 20 ms until `q` is empty (in flight included) or nothing was
/// handled for `stall`; true when it stopped on the stall.
///
/// It asks the database only once its handlers finished nothing for
/// [`QUIET`], and then at most once per [`QUIET`]: `pgmq.metrics` counts the
/// whole queue table (a scan of every page, dead ones included), and such a
/// probe per process every tick would load the database in proportion to
/// the number of processes, the very thing this section measures. A
/// process still handling messages is not done, and its clock stops at its
/// last handler's end, so a probe made later costs the figures nothing.
async fn drain_until_empty(
    client: &pgmq_client::Client,
    q: &QueueName,
    tally: &Tally,
    stall: Duration,
) -> Result<bool> {
    let (mut last, mut last_change) = (0u64, Instant::now());
    let mut last_probe = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = tally.ledger.handled();
        if now != last {
            (last, last_change) = (now, Instant::now());
            continue;
        }
        if last_change.elapsed() < QUIET || last_probe.elapsed() < QUIET {
            continue;
        }
        last_probe = Instant::now();
        if client.metrics(q).await?.queue_length == 0 {
            return Ok(false);
        }
        if last_change.elapsed() >= stall {
            return Ok(true);
        }
    }
}

/// How long a process's handlers must be quiet before it asks whether the
/// queue is empty, and how often it asks while they stay quiet.
const QUIET: Duration = Duration::from_millis(100);

/// Writes the handled ids to `path` for the parent, little-endian u64 each.
async fn write_ids(path: &std::path::Path, ids: &[u64]) -> Result<()> {
    let mut bytes = Vec::with_capacity(ids.len() * 8);
    for id in ids {
        bytes.extend_from_slice(&id.to_le_bytes());
    }
    tokio::fs::write(path, bytes)
        .await
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// One run with `n_proc` processes.
pub async fn run(ctx: &Arc<Ctx>, n_proc: u32, round: u32) -> Result<ProcessesRun> {
    let cfg = &ctx.cfg;
    let n = cfg.processes_messages;
    let (q, preload_s, vacuum_s) = ctx.fresh_loaded("processes", n).await?;
    let exe = bench_exe()?;
    let dir = std::env::temp_dir().join(format!("pgmq-bench-processes-{}", std::process::id()));
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let mut children = Vec::new();
    for i in 0..n_proc {
        let ids_out = dir.join(format!("ids-{round}-{n_proc}-{i}.bin"));
        let child = spawn_child(ctx, &exe, &q, &ids_out, i).await?;
        children.push((child, ids_out));
    }
    let server_before = server_snapshot(ctx, &q).await;
    let cpu_before = (
        crate::sections::steady::cluster_cpu(&ctx.admin).await,
        crate::process::children_cpu_time(),
    );
    for (child, _) in &mut children {
        child
            .go()
            .await
            .map_err(|e| Error::Config(format!("starting a worker process: {e}")))?;
    }
    let ledger = Ledger::new();
    let mut reports = Vec::new();
    for (child, ids_out) in children {
        reports.push(collect_child(child, &ids_out, &ledger).await?);
    }
    let server = server_counters(ctx, &q, server_before, cpu_before, ledger.handled()).await;
    let _ = tokio::fs::remove_dir(&dir).await;
    let remaining_after = ctx.finish_queue(&q).await?;
    let ledger = ledger.report(n);
    let elapsed = reports.iter().map(|r| r.elapsed_s).fold(0.0, f64::max);
    let fairness = Fairness::of(&reports);
    Ok(ProcessesRun {
        round,
        warmup: false,
        processes: n_proc,
        workers_per_process: cfg.backlog_workers,
        handler: cfg.handler.name().to_owned(),
        handler_work_ms: cfg.handler_work.as_millis() as u64,
        rate: Rate::new(ledger.distinct, elapsed),
        per_process: reports
            .iter()
            .zip(fairness.shares)
            .enumerate()
            .map(|(i, (r, share))| ProcessShare {
                index: i as u32,
                rate: Rate::new(r.handled, r.elapsed_s),
                share,
                stalled: r.stalled,
                worker: r.worker.clone(),
                handler_ms: r.handler_ms,
                peak_rss_bytes: r.peak_rss_bytes,
            })
            .collect(),
        min_over_max: fairness.min_over_max,
        jain_index: fairness.jain_index,
        ledger,
        remaining_after,
        preload_s,
        vacuum_s,
        server,
    })
}

/// The queue table's and the database's counters at one moment:
/// `idx_tup_fetch`, `n_tup_upd`, `n_tup_del`, buffers, transactions.
type ServerSnapshot = [i64; 5];

const SERVER_SNAPSHOT_SQL: &str = "SELECT coalesce(t.idx_tup_fetch, 0)::int8, \
     coalesce(t.n_tup_upd, 0)::int8, coalesce(t.n_tup_del, 0)::int8, \
     (coalesce(io.heap_blks_hit, 0) + coalesce(io.heap_blks_read, 0) \
      + coalesce(io.idx_blks_hit, 0) + coalesce(io.idx_blks_read, 0))::int8, \
     (SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database \
      WHERE datname = current_database()) \
     FROM pg_stat_user_tables t JOIN pg_statio_user_tables io USING (relid) \
     WHERE t.schemaname = 'pgmq' AND t.relname = $1";

/// The counters now; None when they cannot be read.
async fn server_snapshot(ctx: &Ctx, q: &QueueName) -> Option<ServerSnapshot> {
    let table = format!("q_{}", q.as_str());
    let row = ctx
        .admin
        .query_opt(SERVER_SNAPSHOT_SQL, &[&table])
        .await
        .ok()??;
    let mut out = [0i64; 5];
    for (i, v) in out.iter_mut().enumerate() {
        *v = row.try_get::<_, i64>(i).ok()?;
    }
    Some(out)
}

/// The counters' growth since `before`, per message of `handled`, with
/// the CPU of the database cluster and of the worker processes since
/// `cpu_before` (the cluster's, when it runs on this host; the reaped
/// children's). The processes' backends report their statistics when they
/// end, which may follow the processes' exit by a moment: this waits a
/// second first. The cluster's CPU is read after that wait too: a backend
/// ending while it is read would be counted neither among the live
/// processes nor among those the postmaster reaped.
async fn server_counters(
    ctx: &Ctx,
    q: &QueueName,
    before: Option<ServerSnapshot>,
    cpu_before: (Option<Duration>, Duration),
    handled: u64,
) -> Option<ProcessesServer> {
    let before = before?;
    let workers = crate::process::children_cpu_time().saturating_sub(cpu_before.1);
    let us_per_msg = |d: Duration| d.as_secs_f64() * 1e6 / handled.max(1) as f64;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cluster = crate::sections::steady::cluster_cpu(&ctx.admin).await;
    let after = server_snapshot(ctx, q).await?;
    let d: Vec<u64> = after
        .iter()
        .zip(before)
        .map(|(a, b)| u64::try_from(a - b).unwrap_or(0))
        .collect();
    let per = |v: u64| v as f64 / handled.max(1) as f64;
    Some(ProcessesServer {
        index_rows_per_msg: per(d[0]),
        rows_updated: d[1],
        rows_deleted: d[2],
        buffers_per_msg: per(d[3]),
        transactions_per_msg: per(d[4]),
        server_cpu_us_per_msg: cpu_before
            .0
            .zip(cluster)
            .map(|(a, b)| us_per_msg(b.saturating_sub(a))),
        workers_cpu_us_per_msg: Some(us_per_msg(workers)),
    })
}

/// The binary the worker processes run.
pub(crate) fn bench_exe() -> Result<PathBuf> {
    // /proc/self/exe runs this very binary even when its file was replaced
    // or removed since it started (a rebuild in a shared target directory);
    // current_exe() would name the new file, or none.
    let proc_exe = std::path::Path::new("/proc/self/exe");
    if proc_exe.exists() {
        Ok(proc_exe.to_path_buf())
    } else {
        std::env::current_exe().map_err(|e| Error::io("finding the bench binary", e))
    }
}

/// Starts one `process-worker` child on `q` and waits for its `ready`.
async fn spawn_child(
    ctx: &Ctx,
    exe: &std::path::Path,
    q: &QueueName,
    ids_out: &std::path::Path,
    index: u32,
) -> Result<WorkerChild> {
    start_child(ctx, exe, child_spec(ctx, q, ids_out), index).await
}

/// A worker process's settings as the run's configuration says.
pub(crate) fn child_spec(ctx: &Ctx, q: &QueueName, ids_out: &std::path::Path) -> ChildSpec {
    let cfg = &ctx.cfg;
    ChildSpec {
        queue: q.as_str().to_owned(),
        workers: cfg.backlog_workers,
        batch_size: cfg.batch_size,
        vt: u32::try_from(cfg.vt.as_secs()).unwrap_or(u32::MAX),
        pool_size: cfg.pool_size,
        handler: cfg.handler,
        handler_work_ms: cfg.handler_work.as_millis() as u64,
        claim_reads: cfg.claim_reads,
        stall_timeout_s: cfg.stall_timeout.as_secs_f64(),
        ids_out: ids_out.to_path_buf(),
        fleet_places: None,
    }
}

impl ChildSpec {
    /// The same worker with `workers` handlers of `work` each, under a
    /// fleet-wide limit of `places`.
    pub(crate) fn limited(mut self, workers: u32, work: Duration, places: u32) -> Self {
        self.workers = workers;
        self.handler = HandlerKind::Empty;
        self.handler_work_ms = work.as_millis() as u64;
        self.fleet_places = Some(places);
        self
    }

    /// The same worker without the fleet-wide limit.
    pub(crate) fn without_limit(mut self) -> Self {
        self.fleet_places = None;
        self
    }
}

/// Starts a `process-worker` child running `spec` and waits for its `ready`.
pub(crate) async fn start_child(
    ctx: &Ctx,
    exe: &std::path::Path,
    spec: ChildSpec,
    index: u32,
) -> Result<WorkerChild> {
    let name = format!("worker process {index}");
    Spawn::new(exe, "process-worker", &spec, &name)
        .map_err(|e| Error::Config(e.to_string()))?
        .env(DSN_ENV, ctx.target.dsn_for_child_env())
        .stderr(Stderr::Inherit)
        .with_go()
        .start()
        .await
        .map_err(|e| Error::Config(format!("a worker process did not start: {e}")))
}

/// Waits for a child to exit, takes its report, and marks the ids it
/// handled in `ledger`.
pub(crate) async fn collect_child(
    child: WorkerChild,
    ids_out: &std::path::Path,
    ledger: &Ledger,
) -> Result<ChildReport> {
    let exit = child
        .wait_exit()
        .await
        .map_err(|e| Error::Config(format!("waiting for a worker process: {e}")))?;
    let status = exit.status;
    let report = match (exit.said.report, status.success()) {
        (Some(r), true) => r,
        (_, true) => {
            return Err(Error::Config(format!(
                "a worker process exited 0 without a report{}",
                exit.said
                    .garbled
                    .map_or(String::new(), |g| format!(" (it said {g})"))
            )))
        }
        _ => {
            return Err(Error::Config(format!(
                "a worker process failed ({status}); see its stderr"
            )))
        }
    };
    let bytes = tokio::fs::read(ids_out)
        .await
        .map_err(|e| Error::io(format!("reading {}", ids_out.display()), e))?;
    for c in bytes.chunks_exact(8) {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        ledger.mark(u64::from_le_bytes(b));
    }
    let _ = tokio::fs::remove_file(ids_out).await;
    Ok(report)
}

/// How evenly the processes shared the work.
struct Fairness {
    /// Each process's share of the messages handled.
    shares: Vec<f64>,
    /// The smallest handled count over the largest.
    min_over_max: f64,
    /// Jain's fairness index `(Σx)² / (n·Σx²)`.
    jain_index: f64,
}

impl Fairness {
    fn of(reports: &[ChildReport]) -> Self {
        let total: u64 = reports.iter().map(|r| r.handled).sum();
        let shares: Vec<f64> = reports
            .iter()
            .map(|r| {
                if total > 0 {
                    r.handled as f64 / total as f64
                } else {
                    0.0
                }
            })
            .collect();
        let (min, max) = reports.iter().fold((u64::MAX, 0u64), |(a, b), r| {
            (a.min(r.handled), b.max(r.handled))
        });
        let sum_sq: f64 = reports.iter().map(|r| (r.handled as f64).powi(2)).sum();
        let jain_index = if sum_sq > 0.0 {
            (total as f64).powi(2) / (reports.len() as f64 * sum_sq)
        } else {
            0.0
        };
        Fairness {
            shares,
            min_over_max: if max > 0 {
                min as f64 / max as f64
            } else {
                0.0
            },
            jain_index,
        }
    }
}

/// The worker_processes section: `--processes` separate worker processes
/// draining one queue. Its runs record each process's peak RSS, not the
/// bench process's, so it adds no memory figure.
pub(crate) struct WorkerProcesses;

impl Section for WorkerProcesses {
    fn runs(&self) -> &dyn SectionRuns {
        &RUNS
    }

    fn about(&self) -> &'static str {
        "Separate worker processes draining one queue (`--processes`)"
    }

    fn planned(&self, cfg: &Config) -> Plan {
        let each = plan::PROCESS_START + plan::drain(cfg.processes_messages, plan::DRAIN);
        Plan::work(cfg.processes.len() as f64 * each)
    }

    fn run_round<'a>(
        &'a self,
        ctx: &'a Arc<Ctx>,
        at: Round<'a>,
        s: &'a mut Sections,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(one_round(ctx, at, s))
    }

    fn check(&self, s: &Sections, out: &mut Checks) {
        for r in &RUNS.list(s) {
            let tag = format!(
                "worker_processes {} {}",
                r.processes,
                run_tag(r.round, r.warmup)
            );
            out.drained(&tag, r.rate.elapsed_s, &r.ledger, r.remaining_after);
            for pr in &r.per_process {
                if pr.stalled {
                    out.fail(format!("{tag}: process {} stalled", pr.index));
                }
                out.counters(&format!("{tag}: process {}", pr.index), &pr.worker);
            }
        }
    }

    fn figures(&self, s: &Sections, f: &mut Figures) {
        add_figures(f, s);
    }

    fn report(&self, d: &Document, out: &mut String) {
        report_part(out, d);
    }

    /// A fleet drains about as fast as one process, and shares the work.
    fn targets(&self, figures: &[Figure]) -> Vec<TargetCheck> {
        let fleet = fleet_counts(figures);
        let one = median_of(figures, "worker_processes.p1.throughput");
        let pace = one.filter(|v| *v > 0.0).and_then(|one| {
            fleet
                .iter()
                .filter_map(|n| median_of(figures, &format!("worker_processes.p{n}.throughput")))
                .map(|v| v / one)
                .reduce(f64::min)
        });
        let share = fleet
            .iter()
            .filter_map(|n| median_of(figures, &format!("worker_processes.p{n}.min_over_max")))
            .reduce(f64::min);
        vec![
            check(
                "fleet_keeps_pace",
                "Worker processes: every count of two or more drains at least 0.9x the rate of one process",
                pace,
                FLEET_FLOOR,
                "x",
                |v| v >= FLEET_FLOOR,
                Ok(()),
                "the smallest, over the process counts run, of the median combined rate over the median rate of one process (needs --processes with 1 and a larger count)",
            ),
            check(
                "fleet_shares_evenly",
                "Worker processes: the smallest process handles at least 0.9 of the largest's messages at every count",
                share,
                FLEET_FLOOR,
                "x",
                |v| v >= FLEET_FLOOR,
                Ok(()),
                "the smallest, over the process counts of two or more, of the median smallest / largest share",
            ),
        ]
    }
}

/// The floor of both fleet targets.
const FLEET_FLOOR: f64 = 0.9;

/// The process counts of two or more that the figures hold.
fn fleet_counts(figures: &[Figure]) -> Vec<u64> {
    let mut v = counts_in_ids(figures, "worker_processes.p", ".throughput");
    v.retain(|n| *n > 1);
    v
}

/// One round of worker_processes: a run at each process count.
async fn one_round(ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
    let tag = at.tag;
    for n in &ctx.cfg.processes {
        let r = run(ctx, *n, at.index).await?;
        ctx.progress.say(format!(
            "{tag} worker_processes {n}: {:.0} msg/s combined, min/max share {:.2}",
            r.rate.rate_per_s, r.min_over_max
        ));
        RUNS.record(s, &r)?;
    }
    Ok(())
}

const DEF_PROC_RATE: &str = "N separate worker processes (the bench binary's process-worker, --backlog-workers \
    handlers each, own pools) draining one preloaded, vacuumed queue of --processes-messages: distinct messages handled by \
    all of them divided by the slowest process's seconds from its start signal to its last handler's end.";

const DEF_PROC_EVEN: &str =
    "The smallest process's handled count divided by the largest's: 1 when the work \
    was shared evenly (Jain's index is in the run record).";

/// worker_processes: combined rate and evenness per process count.
fn add_figures(f: &mut Figures, s: &Sections) {
    let mut procs: Vec<u32> = RUNS.list(s).iter().map(|r| r.processes).collect();
    procs.sort_unstable();
    procs.dedup();
    let all = RUNS.list(s);
    let wp = || measured(&all, |r| r.warmup);
    for n in &procs {
        f.rate(
            &format!("worker_processes.p{n}.throughput"),
            "worker_processes",
            &format!("Combined drain rate, {n} processes"),
            DEF_PROC_RATE,
            wp().filter(|r| r.processes == *n)
                .map(|r| (r.round, &r.rate)),
        );
        f.add(
            format!("worker_processes.p{n}.min_over_max"),
            "worker_processes",
            format!("Work share, smallest / largest process, {n} processes"),
            "x",
            Better::None,
            DEF_PROC_EVEN,
            wp().filter(|r| r.processes == *n)
                .map(|r| Sample::value(r.round, r.min_over_max))
                .collect(),
        );
    }
}

/// worker_processes: the combined rate per process count, each process's
/// own rate, and how evenly they shared the work.
fn report_part(out: &mut String, d: &Document) {
    let counts = figure_keys(d, "worker_processes.p", ".throughput");
    if counts.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "## Worker processes (worker_processes)\n\n\
         | Processes | Combined rate (msg/s) | Of 1 process | Per-process rates (msg/s), per round | Smallest / largest | Jain's index |\n\
         | --- | --- | --- | --- | --- | --- |"
    );
    let one = median_rate(d, 1);
    let mut ids = Vec::new();
    for n in &counts {
        let all = RUNS.list(&d.sections);
        let runs: Vec<_> = all
            .iter()
            .filter(|r| !r.warmup && u64::from(r.processes) == *n)
            .collect();
        let per_process = runs
            .iter()
            .map(|r| {
                r.per_process
                    .iter()
                    .map(|p| thousands(p.rate.rate_per_s))
                    .collect::<Vec<_>>()
                    .join(" / ")
            })
            .collect::<Vec<_>>()
            .join("; ");
        let jain: Vec<f64> = runs.iter().map(|r| r.jain_index).collect();
        let rate = format!("worker_processes.p{n}.throughput");
        let even = format!("worker_processes.p{n}.min_over_max");
        let of_one = match (median_rate(d, *n), one) {
            (Some(r), Some(one)) if one > 0.0 => format!("{:.2}x", r / one),
            _ => "–".to_owned(),
        };
        let _ = writeln!(
            out,
            "| {n} | {} | {of_one} | {} | {} | {} |",
            cell(d, &rate),
            if per_process.is_empty() {
                "–".to_owned()
            } else {
                per_process
            },
            cell(d, &even),
            crate::stats::median_min_max(&jain)
                .map_or("–".to_owned(), |(med, _, _)| fmt_value(med, "x"))
        );
        ids.extend([rate, even]);
    }
    let _ = writeln!(
        out,
        "\nOf 1 process is the median combined rate over the median with one process, measured in the same \
         document. Jain's index is (Σx)² / (n·Σx²) of the processes' handled counts, median over rounds: 1 when \
         even, 1/n when one process did everything.\n"
    );
    processes_server(out, d, &counts);
    definitions(out, d, &ids);
}

/// The median combined rate of the measured runs with `n` processes.
fn median_rate(d: &Document, n: u64) -> Option<f64> {
    let rates: Vec<f64> = RUNS
        .list(&d.sections)
        .iter()
        .filter(|r| !r.warmup && u64::from(r.processes) == n)
        .map(|r| r.rate.rate_per_s)
        .collect();
    crate::stats::median_min_max(&rates).map(|(med, _, _)| med)
}

/// worker_processes: the database's own counters per message, per process
/// count and round (why the rates are what they are).
fn processes_server(out: &mut String, d: &Document, counts: &[u64]) {
    let all = RUNS.list(&d.sections);
    let runs: Vec<_> = all
        .iter()
        .filter(|r| !r.warmup && counts.contains(&u64::from(r.processes)))
        .filter_map(|r| r.server.as_ref().map(|s| (r, s)))
        .collect();
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "The database's own counters per message handled (queue table and its indexes; \
         transactions in the database):\n\n\
         | Processes | Round | Shared buffers | Index rows fetched | Transactions | Server CPU (µs) | Worker processes' CPU (µs) | Reads per process |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for (r, s) in runs {
        let reads = r
            .per_process
            .iter()
            .map(|p| thousands(p.worker.reads as f64))
            .collect::<Vec<_>>()
            .join(" / ");
        let cpu = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.1}"));
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.2} | {:.3} | {} | {} | {reads} |",
            r.processes,
            r.round,
            s.buffers_per_msg,
            s.index_rows_per_msg,
            s.transactions_per_msg,
            cpu(s.server_cpu_us_per_msg),
            cpu(s.workers_cpu_us_per_msg),
        );
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure(id: &str, value: f64) -> Figure {
        Figure::from_runs(
            id,
            "worker_processes",
            id,
            "x",
            Better::None,
            "",
            vec![Sample::value(0, value)],
        )
        .unwrap()
    }

    fn fleet(rates: &[(u32, f64)], shares: &[(u32, f64)]) -> Vec<TargetCheck> {
        let mut f: Vec<Figure> = rates
            .iter()
            .map(|(n, v)| figure(&format!("worker_processes.p{n}.throughput"), *v))
            .collect();
        f.extend(
            shares
                .iter()
                .map(|(n, v)| figure(&format!("worker_processes.p{n}.min_over_max"), *v)),
        );
        WorkerProcesses.targets(&f)
    }

    #[test]
    fn the_fleet_targets_take_the_worst_count() {
        let t = fleet(
            &[(1, 100.0), (2, 98.0), (4, 95.0), (8, 85.0)],
            &[(1, 1.0), (2, 0.99), (4, 0.91), (8, 0.95)],
        );
        let pace = t.iter().find(|t| t.id == "fleet_keeps_pace").unwrap();
        assert!((pace.observed.unwrap() - 0.85).abs() < 1e-9);
        assert_eq!(pace.pass, Some(false));
        let share = t.iter().find(|t| t.id == "fleet_shares_evenly").unwrap();
        assert!((share.observed.unwrap() - 0.91).abs() < 1e-9);
        assert_eq!(share.pass, Some(true));
    }

    #[test]
    fn the_fleet_targets_need_one_process_and_a_fleet() {
        for t in fleet(&[(2, 98.0), (4, 95.0)], &[])
            .iter()
            .chain(&fleet(&[(1, 100.0)], &[(1, 1.0)]))
        {
            if t.id == "fleet_keeps_pace" || t.id == "fleet_shares_evenly" {
                assert_eq!(t.pass, None, "{t:?}");
            }
        }
        let t = fleet(&[(1, 100.0), (2, 95.0)], &[(2, 0.97)]);
        assert!(t.iter().all(|t| t.pass == Some(true)), "{t:?}");
    }
}
