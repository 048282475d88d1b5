//! Worker processes: copies of the bench's own binary (`pgmq-bench
//! process-worker`, hidden), each with its own SDK client, pool and worker,
//! started by a section, told `go` together, and collected with the ids
//! they handled.
//!
//! A child's JSON argument is a [`ChildSpec`]: pgmq-testkit's
//! [`WorkerSpec`] for everything that is a worker setting, and the
//! benchmark's own workload (what the handler does, where the handled ids
//! go, when to give up). The child connects, builds its worker from the
//! spec and says `ready`; on `go` its clock starts. It stops when the queue
//! is empty ([`drain::until_empty`]) or after the stall timeout, shuts its
//! worker down (acknowledgements drained), writes the ids it handled to a
//! file and says `report` with one [`ChildReport`]. The lines and the
//! handshake are pgmq-testkit's child protocol ([`pgmq_testkit::child`]),
//! the fault suite's too.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pgmq_client::QueueName;
use pgmq_testkit::child::{say_json, say_ready, spec_from_arg, wait_for_go, Line, Spawn, Stderr};
use pgmq_testkit::spec::{WorkerSettings, WorkerSpec};
use pgmq_worker::Outcome;
use serde::{Deserialize, Serialize};

use crate::document::HandlerKind;
use crate::document::{Percentiles, WorkerCounters};
use crate::error::{Error, Result};
use crate::kit::drain;
use crate::kit::sink::Sink;
use crate::kit::tally::Tally;
use crate::kit::worker::{counters, ms, worker_on};
use crate::kit::Ctx;
use crate::ledger::Ledger;
use crate::process::MemoryMeter;
use crate::stats::percentiles_us_to_ms;

/// A worker process's argument. The DSN is not in it: it comes in
/// [`DSN_ENV`], never on the command line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChildSpec {
    /// The worker: its queue, handler kind, settings and pool.
    pub(crate) worker: WorkerSpec,
    /// What its handlers do (`--handler`).
    pub(crate) handler: HandlerKind,
    /// Simulated I/O per handler call, milliseconds.
    pub(crate) handler_work_ms: u64,
    /// Give up after this many seconds without progress.
    pub(crate) stall_timeout_s: f64,
    /// Where to write the handled ids (little-endian u64 each); set by
    /// [`Fleet::start`].
    #[serde(default)]
    pub(crate) ids_out: PathBuf,
}

/// The environment variable that holds a worker process's DSN.
const DSN_ENV: &str = "PGMQ_BENCH_DSN";

/// The `application_name` of a worker process's pool.
const APP: &str = "pgmq-bench-process";

impl Ctx {
    /// A worker process's spec as the run's settings say: a worker of
    /// `--backlog-workers` handlers on `q` ([`Ctx::worker_spec`]) on a pool
    /// of `--pool-size`, and the run's handler.
    pub(crate) fn child_spec(&self, q: &QueueName) -> ChildSpec {
        let cfg = &self.cfg;
        let mut worker = self.worker_spec(q, cfg.backlog_workers);
        worker.pool_size = Some(cfg.pool_size);
        worker.application_name = Some(APP.to_owned());
        ChildSpec {
            worker,
            handler: cfg.handler,
            handler_work_ms: cfg.handler_work_ms,
            stall_timeout_s: cfg.stall_timeout.as_secs_f64(),
            ids_out: PathBuf::new(),
        }
    }
}

/// A started worker process: its `report` line is a [`ChildReport`], it
/// writes no `stats`.
type WorkerChild = pgmq_testkit::child::Child<(), ChildReport>;

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

/// The `process-worker` subcommand: `spec` is the section's `ChildSpec` as JSON
/// (pgmq-testkit's child protocol), its DSN in `PGMQ_BENCH_DSN`. Drains
/// until the queue is empty, reports, exits (2 when the parent did not say
/// `go`).
pub async fn child_main(spec: &str) -> Result<i32> {
    let a: ChildSpec = spec_from_arg(spec).map_err(|e| Error::Config(e.to_string()))?;
    let dsn = std::env::var(DSN_ENV)
        .map_err(|_| Error::Config(format!("process-worker needs {DSN_ENV}")))?;
    let q = QueueName::new(&a.worker.queue)?;
    let ChildWorker {
        client,
        tally,
        worker: w,
    } = child_worker(&a, &dsn).await?;
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
    let stalled = drain::until_empty(&client, &q, &tally, stall).await?;
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
    tally: std::sync::Arc<Tally>,
    worker: pgmq_worker::Worker<crate::kit::body::InBody>,
}

/// Connects the child's client (and, with `--handler db-write`, its sink
/// pool) and builds its worker as the spec says.
async fn child_worker(a: &ChildSpec, dsn: &str) -> Result<ChildWorker> {
    // The password where the parent found it (the DSN, PGPASSWORD or the
    // password file, all inherited).
    let target = crate::target::Target::resolve(dsn)?;
    let mut b = target.builder();
    if let Some(size) = a.worker.pool_size {
        b = b.max_size(size);
    }
    if let Some(app) = &a.worker.application_name {
        b = b.application_name(app);
    }
    let client = b.connect().await?;
    let sink = match a.handler {
        HandlerKind::DbWrite => {
            let handlers = a.worker.settings.concurrency.unwrap_or(1);
            Some(Sink::connect(&target, u32::try_from(handlers).unwrap_or(u32::MAX)).await?)
        }
        HandlerKind::DbWriteTx | HandlerKind::Empty => None,
    };
    let tally = Tally::new(u64::MAX, Duration::from_millis(a.handler_work_ms));
    let worker = worker_on(client.clone(), &a.worker, &tally, sink, Outcome::Delete)?.build()?;
    Ok(ChildWorker {
        client,
        tally,
        worker,
    })
}

/// Writes the handled ids to `path` for the parent, little-endian u64 each.
async fn write_ids(path: &Path, ids: &[u64]) -> Result<()> {
    let mut bytes = Vec::with_capacity(ids.len() * 8);
    for id in ids {
        bytes.extend_from_slice(&id.to_le_bytes());
    }
    tokio::fs::write(path, bytes)
        .await
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// The binary the worker processes run.
fn bench_exe() -> Result<PathBuf> {
    // /proc/self/exe runs this very binary even when its file was replaced
    // or removed since it started (a rebuild in a shared target directory);
    // current_exe() would name the new file, or none.
    let proc_exe = Path::new("/proc/self/exe");
    if proc_exe.exists() {
        Ok(proc_exe.to_path_buf())
    } else {
        std::env::current_exe().map_err(|e| Error::io("finding the bench binary", e))
    }
}

/// Worker processes started and waiting for `go`, each with the file it
/// writes its handled ids to.
pub(crate) struct Fleet {
    /// The directory of the id files.
    dir: PathBuf,
    children: Vec<(WorkerChild, PathBuf)>,
}

impl Fleet {
    /// Starts one worker process per spec, in order, each waited for until
    /// it says `ready`. Their id files are `ids-<tag>-<index>.bin` in a
    /// directory `pgmq-bench-<name>-<pid>` of the temporary directory.
    pub(crate) async fn start(
        ctx: &Ctx,
        name: &str,
        tag: &str,
        specs: impl IntoIterator<Item = ChildSpec>,
    ) -> Result<Fleet> {
        let exe = bench_exe()?;
        let dir = std::env::temp_dir().join(format!("pgmq-bench-{name}-{}", std::process::id()));
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let mut children = Vec::new();
        for (i, mut spec) in specs.into_iter().enumerate() {
            spec.ids_out = dir.join(format!("ids-{tag}-{i}.bin"));
            let child = Spawn::new(
                &exe,
                "process-worker",
                &spec,
                &format!("worker process {i}"),
            )
            .map_err(|e| Error::Config(e.to_string()))?
            .env(DSN_ENV, ctx.target.dsn_for_child_env())
            .stderr(Stderr::Inherit)
            .with_go()
            .start()
            .await
            .map_err(|e| Error::Config(format!("a worker process did not start: {e}")))?;
            children.push((child, spec.ids_out));
        }
        Ok(Fleet { dir, children })
    }

    /// Says `go` to every process, in order.
    pub(crate) async fn go(&mut self) -> Result<()> {
        for (child, _) in &mut self.children {
            child
                .go()
                .await
                .map_err(|e| Error::Config(format!("starting a worker process: {e}")))?;
        }
        Ok(())
    }

    /// Waits for every process to exit, in order: their reports, the ids
    /// they handled marked in `ledger`.
    pub(crate) async fn collect(self, ledger: &Ledger) -> Result<Vec<ChildReport>> {
        let mut reports = Vec::new();
        for (child, ids_out) in self.children {
            reports.push(collect_child(child, &ids_out, ledger).await?);
        }
        let _ = tokio::fs::remove_dir(&self.dir).await;
        Ok(reports)
    }
}

/// Waits for a child to exit, takes its report, and marks the ids it
/// handled in `ledger`.
async fn collect_child(child: WorkerChild, ids_out: &Path, ledger: &Ledger) -> Result<ChildReport> {
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

/// `spec` with `handlers` handlers of `work` each that do nothing else,
/// under a fleet-wide limit of `places` (none when `None`).
pub(crate) fn limited(
    mut spec: ChildSpec,
    handlers: u32,
    work: Duration,
    places: Option<u32>,
) -> ChildSpec {
    spec.handler = HandlerKind::Empty;
    spec.handler_work_ms = ms(work);
    spec.worker.handler = crate::kit::worker::handler_kind(HandlerKind::Empty);
    spec.worker.settings = WorkerSettings {
        concurrency: Some(handlers as usize),
        fleet_limit: places,
        ..spec.worker.settings
    };
    spec
}
