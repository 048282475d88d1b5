//! The worker process (`pgmq-faults worker`, hidden): a pgmq-worker
//! whose handler obeys each message's [`Act`] and records every successful
//! handling in the ledger before returning.
//!
//! It speaks pgmq-testkit's child protocol ([`pgmq_testkit::child`]): its
//! [`WorkerSpec`] is the subcommand's one JSON argument, its DSNs are in
//! [`DSN_ENV`] and [`LEDGER_DSN_ENV`]. On stdout: `ready <pid>` once the
//! worker runs, `stats <json>` every `stats_ms` (the worker's counters, so
//! that the suite sees when it notices a fault and when it resumes),
//! `draining` after the first SIGTERM (a graceful shutdown starts), `forced`
//! after a second SIGTERM (the shutdown is escalated with pgmq-worker's own
//! `ShutdownHandle::immediate`), then `report <json>` once the shutdown
//! returned: exit code 0 after a graceful shutdown, 3 after an escalated one.
//! It needs no `go`: the suite starts each worker on its own. Logs go to
//! stderr.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use pgmq_client::{Client, Message, QueueName};
use pgmq_testkit::child::{say, say_json, say_ready, spec_from_arg, Line};
use pgmq_worker::{
    Backoff, ClaimReads, Context, GroupShutdown, HandlerError, Hook, Monitor, Outcome, Priority,
    ShutdownReport, TransactionalHandler, WakeUp, Worker, WorkerBuilder, WorkerGroup, WorkerHandle,
};
use tokio::signal::unix::{signal, SignalKind};

use super::job::{Job, HOOK_PANIC_HEADER, REDRIVEN_HEADER};
use super::ledger::{INSERT_HANDLING, INSERT_START};
use super::BoxError;

/// Exit code of a worker whose shutdown a second SIGTERM escalated.
pub(crate) const FORCED_EXIT: u8 = 3;

/// The environment variable that holds the worker's DSN.
pub(crate) const DSN_ENV: &str = "PGMQ_FAULT_DSN";

/// The environment variable that holds the ledger's DSN (default: the
/// worker's).
pub(crate) const LEDGER_DSN_ENV: &str = "PGMQ_FAULT_LEDGER_DSN";

/// The settings of a worker process, which the suite passes as the `worker`
/// subcommand's one JSON argument. The DSNs are not among them: they come
/// in [`DSN_ENV`] and [`LEDGER_DSN_ENV`], so that they stay out of `ps`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct WorkerSpec {
    /// Queue to consume.
    pub(crate) queue: String,
    /// Dead-letter queue.
    pub(crate) dlq: String,
    /// Run id written to the ledger.
    pub(crate) run_id: String,
    /// Scenario label written to the ledger.
    pub(crate) scenario: String,
    /// Visibility timeout, seconds.
    pub(crate) vt_secs: u64,
    /// Concurrent handlers.
    pub(crate) concurrency: usize,
    /// Messages per read.
    pub(crate) batch_size: usize,
    /// Bounded claim queue.
    pub(crate) claim_capacity: usize,
    /// Attempts before dead-lettering.
    pub(crate) max_attempts: u32,
    /// First retry delay, milliseconds.
    pub(crate) backoff_ms: u64,
    /// Largest retry delay, milliseconds.
    pub(crate) backoff_max_ms: u64,
    /// Extend the visibility timeout of long handlers.
    pub(crate) heartbeat: bool,
    /// How long a graceful shutdown waits for running handlers, milliseconds.
    pub(crate) grace_ms: u64,
    /// Poll interval, milliseconds.
    pub(crate) poll_ms: u64,
    /// Extra sleep in every handler, milliseconds.
    pub(crate) sleep_ms: u64,
    /// `handler_timeout`, milliseconds (0: pgmq-worker's default).
    pub(crate) handler_timeout_ms: u64,
    /// `max_deliveries` (0: pgmq-worker's default).
    pub(crate) max_deliveries: u32,
    /// `max_abandoned_blocking_threads` (0: pgmq-worker's default).
    pub(crate) max_abandoned: u64,
    /// `db_timeout`, milliseconds (0: pgmq-worker's default).
    pub(crate) db_timeout_ms: u64,
    /// Build the worker with pgmq-worker's defaults for everything but the
    /// queue, the dead-letter queue and the visibility timeout (the options
    /// above that tune concurrency, batches, attempts, backoff, heartbeat,
    /// polling and grace are then ignored).
    pub(crate) sdk_defaults: bool,
    /// Also record each handler's start (`pgmq_fault_starts`), so that two
    /// handlers of one message running at once can be measured.
    pub(crate) record_starts: bool,
    /// How often to print the worker's counters, milliseconds.
    pub(crate) stats_ms: u64,
    /// Bugs planted on purpose, to prove that the suite goes red (those of
    /// the list that concern this process apply).
    pub(crate) sabotage: Vec<Sabotage>,
    /// Which kind of handler runs the queue.
    pub(crate) kind: HandlerKind,
    /// Claim in FIFO-group order (`ClaimReads::FifoGroups`).
    pub(crate) fifo: bool,
    /// Install the hook that panics where a message's `fault_hook_panic`
    /// header says (`before` or `after`, first attempt only).
    pub(crate) hooks: bool,
    /// Run the worker inside a `WorkerGroup` (of this one worker).
    pub(crate) group: bool,
    /// Connections of the worker's pool (the ledger's pool is separate).
    pub(crate) pool_size: u32,
    /// `application_name` of every connection of this process.
    pub(crate) app_name: String,
    /// Places of a fleet-wide limit (`WorkerBuilder::fleet_limit`) shared
    /// by every worker of the queue; 0: no limit.
    #[serde(default)]
    pub(crate) fleet_places: u32,
    /// A second queue: the worker of [`queue`](Self::queue) and one of this
    /// queue run in one `WorkerGroup` under a priority policy.
    #[serde(default)]
    pub(crate) prio: Option<PrioSpec>,
}

/// The second queue of a prioritized group ([`WorkerSpec::prio`]) and the
/// policy: [`WorkerSpec::queue`] has `weight`, this queue `other_weight`,
/// under `Priority::weighted()` (`Priority::strict()` with the
/// `prio-strict` sabotage).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct PrioSpec {
    pub(crate) queue: String,
    pub(crate) dlq: String,
    /// Its ledger's scenario label.
    pub(crate) scenario: String,
    pub(crate) weight: u32,
    pub(crate) other_weight: u32,
}

/// The handler a fault worker runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum HandlerKind {
    /// An async handler with a `Context`; the ledger row is written on a
    /// pool of its own before the handler returns.
    #[default]
    Context,
    /// A `TransactionalHandler`: the ledger row is written in the handler's
    /// transaction, which commits with the message's delete.
    Transactional,
    /// A `BlockingHandler` on a dedicated thread.
    Blocking,
}

/// A deliberate bug in the fault worker's handler (`--sabotage`).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Sabotage {
    /// The handler is correct.
    #[default]
    None,
    /// One message in a thousand (keys ending in 999) is acknowledged
    /// without its ledger row: exactly what a lost message looks like.
    SkipLedger,
    /// The worker runs without its heartbeat, whatever `heartbeat` says:
    /// a handler outliving its visibility timeout is delivered twice.
    HeartbeatOff,
    /// A `fifo` worker claims with plain reads: FIFO groups unordered.
    FifoUnordered,
    /// A handler's panic is not caught: it ends the handler loop (needs the
    /// `fault-injection` feature, which passes it to pgmq-worker).
    PanicUncaught,
    /// The worker's deletes and archives of successes do not check the
    /// delivery fence: a stale delivery's acknowledgement lands (needs the
    /// `fault-injection` feature).
    FenceOff,
    /// A `fifo` blocking worker acknowledges a run abandoned at
    /// `handler_timeout` without waiting for its thread to return: the
    /// retry and the group's next message run beside it (needs the
    /// `fault-injection` feature).
    FifoBlockingOverlap,
    /// The campaign's keyed producer retries a send of unknown outcome, and
    /// sends a key again, under a fresh deduplication key: a key stored
    /// twice.
    KeyedFreshKeys,
    /// The campaign's fleet-limited workers run under a limit four times
    /// theirs: more runs at once than the limit.
    FleetOver,
    /// The campaign's fleet-limited workers take a visibility timeout of
    /// 40 s instead of the campaign's: a killed process's places come back
    /// that much later.
    FleetLongVt,
    /// The campaign's `pause` fault records a pause but never sets the
    /// flag: to the invariant, workers that go on claiming from a paused
    /// queue.
    PauseIgnored,
    /// The campaign's prioritized group runs under `Priority::strict()`
    /// instead of `Priority::weighted()`: its low queue starves while the
    /// high one has a backlog.
    PrioStrict,
    /// The campaign's `drop-queue` fault puts the dropped queue's
    /// deduplication keys back after the re-creation: sends under them are
    /// answered "duplicate" with the dropped messages' ids.
    StaleKeys,
    /// The campaign's extension cell drops the `pgmq_sdk` schema with PGMQ
    /// (as a CASCADE that reached it would) and does not install it again:
    /// the fleet limit has no function to call.
    SdkNotReinstalled,
    /// The campaign's `revoke-grants` fault records a revocation but never
    /// revokes: to the invariant, workers that go on claiming while they
    /// cannot read the pause flag.
    RevokeSkipped,
}

impl Sabotage {
    /// The command-line spelling.
    pub(crate) fn as_arg(self) -> &'static str {
        match self {
            Sabotage::None => "none",
            Sabotage::SkipLedger => "skip-ledger",
            Sabotage::HeartbeatOff => "heartbeat-off",
            Sabotage::FifoUnordered => "fifo-unordered",
            Sabotage::PanicUncaught => "panic-uncaught",
            Sabotage::FenceOff => "fence-off",
            Sabotage::FifoBlockingOverlap => "fifo-blocking-overlap",
            Sabotage::KeyedFreshKeys => "keyed-fresh-keys",
            Sabotage::FleetOver => "fleet-over",
            Sabotage::FleetLongVt => "fleet-long-vt",
            Sabotage::PauseIgnored => "pause-ignored",
            Sabotage::PrioStrict => "prio-strict",
            Sabotage::StaleKeys => "stale-keys",
            Sabotage::SdkNotReinstalled => "sdk-not-reinstalled",
            Sabotage::RevokeSkipped => "revoke-skipped",
        }
    }

    /// The command-line spelling of a list (`none` for an empty one).
    pub(crate) fn list_arg(list: &[Sabotage]) -> String {
        let names: Vec<&str> = list
            .iter()
            .filter(|s| **s != Sabotage::None)
            .map(|s| s.as_arg())
            .collect();
        if names.is_empty() {
            "none".into()
        } else {
            names.join(",")
        }
    }
}

/// Whether `--sabotage skip-ledger` drops this key's ledger row.
pub(crate) fn skipped_by_sabotage(key: i64) -> bool {
    key.rem_euclid(1000) == 999
}

impl WorkerSpec {
    /// Defaults for a queue of a scenario (the DSN is passed by environment).
    pub(crate) fn for_queue(
        queue: &QueueName,
        dlq: &QueueName,
        run_id: &str,
        scenario: &str,
    ) -> Self {
        WorkerSpec {
            queue: queue.as_str().to_owned(),
            dlq: dlq.as_str().to_owned(),
            run_id: run_id.to_owned(),
            scenario: scenario.to_owned(),
            vt_secs: 5,
            concurrency: 8,
            batch_size: 100,
            claim_capacity: 200,
            max_attempts: 5,
            backoff_ms: 1000,
            backoff_max_ms: 2000,
            heartbeat: false,
            grace_ms: 10_000,
            poll_ms: 100,
            sleep_ms: 0,
            handler_timeout_ms: 0,
            max_deliveries: 0,
            max_abandoned: 0,
            db_timeout_ms: 0,
            sdk_defaults: false,
            record_starts: false,
            stats_ms: 200,
            sabotage: Vec::new(),
            kind: HandlerKind::Context,
            fifo: false,
            hooks: false,
            group: false,
            pool_size: 4,
            app_name: "pgmq-fault-worker".to_owned(),
            fleet_places: 0,
            prio: None,
        }
    }
}

/// What every handler needs.
struct HandlerCtx {
    ledger: Client,
    /// The queue handled, for an act that makes its own claim expire.
    queue: QueueName,
    run_id: String,
    scenario: String,
    pid: i32,
    sleep: Duration,
    record_starts: bool,
    /// Whether `--sabotage skip-ledger` drops some rows.
    skip_ledger: bool,
    /// Ledger rows this process committed outside a handler's transaction.
    ledger_rows: AtomicU64,
    /// Ledger inserts outside a transaction begun and never seen to
    /// succeed: they failed (a reply lost to a fault) or their run was
    /// dropped while they were in flight (at `handler_timeout`). The row
    /// may have been written all the same, so the ledger may hold up to
    /// this many rows more than `ledger_rows`.
    ledger_unsure: AtomicU64,
    /// Snoozes returned (successes without a ledger row).
    snoozed: AtomicU64,
    /// The runtime, for the blocking handler's thread.
    rt: tokio::runtime::Handle,
}

/// The worker as it runs: alone, or as the members of a `WorkerGroup`.
enum Running {
    One(WorkerHandle),
    Group {
        monitors: Vec<Monitor>,
        stop: GroupShutdown,
        task: tokio::task::JoinHandle<Result<Vec<ShutdownReport>, pgmq_worker::Error>>,
    },
}

impl Running {
    /// The counters the suite reads, as JSON (a group's summed).
    fn stats(&self) -> serde_json::Value {
        match self {
            Running::One(h) => stats_json(&h.stats()),
            Running::Group { monitors, .. } => monitors
                .iter()
                .map(|m| stats_json(&m.stats()))
                .fold(serde_json::json!({}), merge_json),
        }
    }

    /// What escalates the shutdown (`immediate`).
    fn escalate(&self) -> Box<dyn FnOnce() + Send> {
        match self {
            Running::One(h) => {
                let s = h.shutdown_handle();
                Box::new(move || s.immediate())
            }
            Running::Group { stop, .. } => {
                let s = stop.clone();
                Box::new(move || s.immediate())
            }
        }
    }

    /// Every member's report, in the order the members were added.
    async fn shutdown(self) -> Result<Vec<ShutdownReport>, BoxError> {
        match self {
            Running::One(h) => Ok(vec![h.shutdown().await?]),
            Running::Group { stop, task, .. } => {
                stop.graceful();
                let reports = task.await??;
                if reports.is_empty() {
                    return Err("the group returned no report".into());
                }
                Ok(reports)
            }
        }
    }
}

/// Adds `b` into `a`: numbers summed, arrays appended, booleans or-ed, the
/// rest kept from `a` (or taken from `b` where `a` has none). A process
/// running several workers reports their counters as one.
fn merge_json(mut a: serde_json::Value, b: serde_json::Value) -> serde_json::Value {
    use serde_json::Value as V;
    if let (V::Object(am), V::Object(bm)) = (&mut a, b) {
        for (k, bv) in bm {
            let merged = match (am.remove(&k), bv) {
                (None, bv) => bv,
                (Some(V::Number(x)), V::Number(y)) => match (x.as_u64(), y.as_u64()) {
                    (Some(x), Some(y)) => V::from(x + y),
                    _ => V::from(x.as_f64().unwrap_or(0.0) + y.as_f64().unwrap_or(0.0)),
                },
                (Some(V::Array(mut x)), V::Array(y)) => {
                    x.extend(y);
                    V::Array(x)
                }
                (Some(V::Bool(x)), V::Bool(y)) => V::Bool(x || y),
                (Some(x), _) => x,
            };
            am.insert(k, merged);
        }
    }
    a
}

/// Builds the worker of one queue of the process, its handler obeying each
/// message's act and recording in `h`'s ledger scenario.
fn build_worker(
    client: &Client,
    queue: QueueName,
    dlq: QueueName,
    args: &WorkerSpec,
    h: Arc<HandlerCtx>,
) -> Result<Worker<Job>, BoxError> {
    // The suite sizes pools on purpose: the campaign's transactional
    // process gets fewer connections than its handlers' transactions need,
    // to prove that a checkout timeout uses no attempt.
    let builder = Worker::<Job>::builder(client.clone(), queue)
        .visibility_timeout(Duration::from_secs(args.vt_secs))
        .dead_letter_queue(dlq)
        .allow_small_pool(true);
    let builder = sabotaged(tuned(builder, args), args)?;
    let builder = if args.hooks {
        builder.hook(FaultHook::default())
    } else {
        builder
    };
    let builder = match args.kind {
        HandlerKind::Context => builder
            .handler_with_context(move |msg: Message<Job>, cx: Context| handle(h.clone(), msg, cx)),
        HandlerKind::Transactional => builder.transactional_handler(TxHandler(h)),
        HandlerKind::Blocking => builder.blocking_handler(move |msg: Message<Job>| {
            let h2 = h.clone();
            h.rt.block_on(obey_and_record(&h2, msg, None, None))
        }),
    };
    Ok(builder.build()?)
}

/// Runs the worker process until SIGTERM (graceful: returns exit code 0); a
/// second SIGTERM during that shutdown escalates it with
/// [`ShutdownHandle::immediate`](pgmq_worker::ShutdownHandle::immediate)
/// (running handlers abandoned; returns exit code 3 once the report is out).
///
/// `spec` is the suite's `WorkerSpec` as JSON; the DSNs are read from
/// `PGMQ_FAULT_DSN` and `PGMQ_FAULT_LEDGER_DSN`.
///
/// ```no_run
/// # async fn f(spec: &str) -> Result<(), pgmq_faults::BoxError> {
/// let code = pgmq_faults::worker_main(spec).await?;
/// # let _ = code; Ok(()) }
/// ```
pub async fn worker_main(spec: &str) -> Result<i32, BoxError> {
    init_logging();
    // Registered first, so that a SIGTERM arriving during start-up is not lost.
    let mut term = signal(SignalKind::terminate())?;
    let args: WorkerSpec = spec_from_arg(spec)?;
    let dsn = std::env::var(DSN_ENV).map_err(|_| format!("the worker needs {DSN_ENV}"))?;
    let ledger_dsn = std::env::var(LEDGER_DSN_ENV).ok();
    let queue = QueueName::new(&args.queue)?;
    let dlq = QueueName::new(&args.dlq)?;
    let client = connect_retrying(&dsn, args.pool_size, true, &args.app_name).await?;
    let ledger_dsn = ledger_dsn.as_deref().unwrap_or(&dsn);
    let ledger = connect_retrying(
        ledger_dsn,
        args.concurrency as u32 + 1,
        false,
        &args.app_name,
    )
    .await?;
    let pid = std::process::id() as i32;
    let rt = tokio::runtime::Handle::current();
    let handler_ctx = |queue: &QueueName, scenario: &str| {
        Arc::new(HandlerCtx {
            ledger: ledger.clone(),
            queue: queue.clone(),
            run_id: args.run_id.clone(),
            scenario: scenario.to_owned(),
            pid,
            sleep: Duration::from_millis(args.sleep_ms),
            record_starts: args.record_starts,
            skip_ledger: args.sabotage.contains(&Sabotage::SkipLedger),
            ledger_rows: AtomicU64::new(0),
            ledger_unsure: AtomicU64::new(0),
            snoozed: AtomicU64::new(0),
            rt: rt.clone(),
        })
    };
    let mut hctxs = vec![handler_ctx(&queue, &args.scenario)];
    let worker = build_worker(&client, queue, dlq, &args, hctxs[0].clone())?;
    let running = if let Some(p) = &args.prio {
        // Two queues in one group under a priority policy.
        let (q2, dlq2) = (QueueName::new(&p.queue)?, QueueName::new(&p.dlq)?);
        hctxs.push(handler_ctx(&q2, &p.scenario));
        let other = build_worker(&client, q2, dlq2, &args, hctxs[1].clone())?;
        let policy = if args.sabotage.contains(&Sabotage::PrioStrict) {
            Priority::strict()
        } else {
            Priority::weighted()
        };
        let monitors = vec![worker.monitor(), other.monitor()];
        let group = WorkerGroup::new(client)
            .priority(policy)
            .with_worker_priority(worker, p.weight)
            .with_worker_priority(other, p.other_weight);
        let stop = group.shutdown_handle();
        let task = tokio::spawn(group.run_until(std::future::pending::<()>()));
        Running::Group {
            monitors,
            stop,
            task,
        }
    } else if args.group {
        let monitors = vec![worker.monitor()];
        let group = WorkerGroup::new(client).with_worker(worker);
        let stop = group.shutdown_handle();
        let task = tokio::spawn(group.run_until(std::future::pending::<()>()));
        Running::Group {
            monitors,
            stop,
            task,
        }
    } else {
        Running::One(worker.spawn())
    };
    let escalate = running.escalate();
    say_ready();

    // The counters, printed until the process ends.
    let stats_every = Duration::from_millis(args.stats_ms.max(10));
    let stats = print_stats(running, stats_every);

    term.recv().await;
    say(Line::Draining);
    let (tx, task) = stats;
    let _ = tx.send(());
    let running = task.await?;
    // A second SIGTERM escalates the shutdown through the SDK (running
    // handlers abandoned, unstarted claims still released, finished handlers'
    // acknowledgements still written, within about a second); the report
    // still comes back, and the process exits 3 to say it was cut short.
    let escalation = tokio::spawn(async move {
        term.recv().await;
        say(Line::Forced);
        escalate();
    });
    let reports = running.shutdown().await?;
    escalation.abort();
    let immediate = reports.iter().any(|r| r.immediate);
    let json = reports
        .iter()
        .zip(&hctxs)
        .map(|(r, h)| report_json(r, h))
        .fold(serde_json::json!({}), merge_json);
    say_json(Line::Report, &json)?;
    Ok(if immediate { i32::from(FORCED_EXIT) } else { 0 })
}

/// Logs to stderr (stdout is the protocol with the suite), `info` unless
/// `RUST_LOG` says otherwise.
fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init();
}

/// Applies the tuning options of `args` (all ignored with `sdk_defaults`,
/// except the handler timeout, `max_deliveries` and `db_timeout`).
fn tuned(builder: WorkerBuilder<Job>, args: &WorkerSpec) -> WorkerBuilder<Job> {
    let builder = if args.sdk_defaults {
        builder
    } else {
        builder
            .concurrency(args.concurrency)
            .batch_size(args.batch_size)
            .claim_capacity(args.claim_capacity)
            .poll_interval(Duration::from_millis(args.poll_ms))
            .wake_up(WakeUp::Poll)
            .max_attempts(args.max_attempts)
            .retry_backoff(Backoff::exponential(
                Duration::from_millis(args.backoff_ms),
                Duration::from_millis(args.backoff_max_ms),
            ))
            .shutdown_grace(Duration::from_millis(args.grace_ms))
            .heartbeat(args.heartbeat)
    };
    let builder = if args.fifo {
        builder.claim_reads(ClaimReads::FifoGroups)
    } else {
        builder
    };
    let builder = match args.fleet_places {
        0 => builder,
        // The planted bug: a limit four times the fleet's.
        n if args.sabotage.contains(&Sabotage::FleetOver) => {
            builder.fleet_limit(pgmq_client::FleetLimit::max_running(n * 4))
        }
        n => builder.fleet_limit(pgmq_client::FleetLimit::max_running(n)),
    };
    let builder = match args.handler_timeout_ms {
        0 => builder,
        ms => builder.handler_timeout(Duration::from_millis(ms)),
    };
    let builder = match args.max_deliveries {
        0 => builder,
        n => builder.max_deliveries(n),
    };
    let builder = match args.max_abandoned {
        0 => builder,
        n => builder.max_abandoned_blocking_threads(usize::try_from(n).unwrap_or(usize::MAX)),
    };
    match args.db_timeout_ms {
        0 => builder,
        ms => builder.db_timeout(Duration::from_millis(ms)),
    }
}

/// Plants `--sabotage`'s bug in the worker's settings (the handler's own
/// sabotage, `skip-ledger`, is in [`obey_and_record`]).
fn sabotaged(
    builder: WorkerBuilder<Job>,
    args: &WorkerSpec,
) -> Result<WorkerBuilder<Job>, BoxError> {
    let mut builder = builder;
    for s in &args.sabotage {
        builder = match s {
            Sabotage::HeartbeatOff => builder.heartbeat(false),
            Sabotage::FifoUnordered if args.fifo => builder.claim_reads(ClaimReads::Bounded),
            #[cfg(feature = "fault-injection")]
            Sabotage::PanicUncaught => builder.resume_handler_panics(),
            #[cfg(feature = "fault-injection")]
            Sabotage::FenceOff => builder.fence_off(),
            #[cfg(feature = "fault-injection")]
            Sabotage::FifoBlockingOverlap => builder.fifo_blocking_wait_off(),
            #[cfg(not(feature = "fault-injection"))]
            Sabotage::PanicUncaught | Sabotage::FenceOff | Sabotage::FifoBlockingOverlap => {
                return Err(format!(
                    "--sabotage {} needs pgmq-faults built with --features fault-injection",
                    s.as_arg()
                )
                .into())
            }
            // The handler's own (skip-ledger), the fleet limit's and the
            // group's (in `tuned` and `worker_main`), and the campaign's
            // own producer, nemesis and extension cell.
            _ => builder,
        };
    }
    Ok(builder)
}

/// Prints the worker's counters every `every` until the sender is used (or
/// dropped); the task then gives the running worker back.
fn print_stats(
    handle: Running,
    every: Duration,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Running>,
) {
    let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        loop {
            let _ = say_json(Line::Stats, &handle.stats());
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = &mut rx => return handle,
            }
        }
    });
    (tx, task)
}

/// The shutdown report the suite reads: the final counters and what the
/// shutdown did, as JSON.
fn report_json(report: &ShutdownReport, h: &HandlerCtx) -> serde_json::Value {
    let st = &report.stats;
    let mut json = stats_json(st);
    if let serde_json::Value::Object(m) = &mut json {
        for (k, v) in [
            ("handled", serde_json::json!(report.handled)),
            ("acked", serde_json::json!(report.acked)),
            ("released", serde_json::json!(report.released)),
            (
                "still_running_at_deadline",
                serde_json::json!(report.still_running_at_deadline),
            ),
            ("abandoned", serde_json::json!(report.abandoned)),
            ("immediate", serde_json::json!(report.immediate)),
            ("acks_failed", serde_json::json!(report.acks_failed)),
            ("claims_lost", serde_json::json!(report.claims_lost)),
            ("pid", serde_json::json!(std::process::id())),
            ("release_failed", serde_json::json!(report.release_failed)),
            (
                "ledger_rows",
                serde_json::json!(h.ledger_rows.load(Ordering::Relaxed)),
            ),
            (
                "ledger_unsure",
                serde_json::json!(h.ledger_unsure.load(Ordering::Relaxed)),
            ),
            (
                "snoozed",
                serde_json::json!(h.snoozed.load(Ordering::Relaxed)),
            ),
            (
                "shutdown_ms",
                serde_json::json!(report.elapsed.as_millis() as u64),
            ),
        ] {
            m.insert(k.to_owned(), v);
        }
    }
    json
}

/// The counters the suite reads, as JSON.
fn stats_json(st: &pgmq_worker::StatsSnapshot) -> serde_json::Value {
    serde_json::json!({
        "claimed": st.claimed,
        "handled": st.handled,
        "succeeded": st.succeeded,
        "panicked": st.panicked,
        "decode_failures": st.decode_failures,
        "dead_lettered": st.dead_lettered,
        "deleted": st.deleted,
        "failed": st.failed,
        "retried": st.retried,
        "released": st.released,
        "reads": st.reads,
        "read_errors": st.read_errors,
        "acks_pending": st.acks_pending,
        "acks_failed": st.acks_failed,
        "ack_retries": st.ack_retries,
        "expired_unstarted": st.expired_unstarted,
        "heartbeats": st.heartbeats,
        "claims_lost": st.claims_lost,
        "timed_out": st.timed_out,
        "tx_unavailable": st.tx_unavailable,
    })
}

/// Connects, retrying for up to 30 s (the server may be restarting).
async fn connect_retrying(
    dsn: &str,
    max_size: u32,
    check_pgmq: bool,
    app_name: &str,
) -> Result<Client, BoxError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let res = Client::builder(dsn)
            .max_size(max_size)
            .connect_timeout(Duration::from_secs(5))
            .pool_timeout(Duration::from_secs(5))
            .application_name(app_name)
            .check_pgmq(check_pgmq)
            .connect()
            .await;
        match res {
            Ok(c) => return Ok(c),
            Err(e) if e.is_transient() && tokio::time::Instant::now() < deadline => {
                tracing::warn!(error = %e, "connect failed; retrying");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The context handler: obey the message's act, then record the handling,
/// unless its delivery was cancelled meanwhile (claim lost, timed out,
/// immediate shutdown): a well-behaved handler does not commit its side
/// effect then. Acts count deliveries (`read_ct`), so that a message whose
/// handler was abandoned by a crash behaves differently on its next delivery.
async fn handle(
    h: Arc<HandlerCtx>,
    msg: Message<Job>,
    cx: Context,
) -> Result<Outcome, HandlerError> {
    obey_and_record(&h, msg, Some(&cx), None).await
}

/// The transactional handler: the same acts, its ledger row written in the
/// handler's transaction (so it commits only with the message's delete).
struct TxHandler(Arc<HandlerCtx>);

impl TransactionalHandler<Job> for TxHandler {
    async fn handle(
        &self,
        msg: Message<Job>,
        tx: &pgmq_client::Transaction<'_>,
        cx: Context,
    ) -> Result<Outcome, HandlerError> {
        obey_and_record(&self.0, msg, Some(&cx), Some(tx)).await
    }
}

/// Obeys the message's act (hang, panic, fail, snooze, sleep), then writes
/// its ledger row: in `tx` when given, else on the ledger's own pool.
async fn obey_and_record(
    h: &HandlerCtx,
    msg: Message<Job>,
    cx: Option<&Context>,
    tx: Option<&pgmq_client::Transaction<'_>>,
) -> Result<Outcome, HandlerError> {
    let started_at = Utc::now();
    let attempt = msg.read_ct;
    let act = msg.body.act.unwrap_or_default();
    // The attempts the worker's retries recorded before this delivery: a
    // later delivery with as many came back without a retry (its claim
    // expired or was lost), one with more after a retry.
    let attempts = msg
        .header(pgmq_worker::ATTEMPTS_HEADER)
        .and_then(serde_json::Value::as_i64)
        .map_or(0, |n| i32::try_from(n).unwrap_or(i32::MAX));
    // The ledger row's values; a start record takes the first seven.
    let row: [&(dyn tokio_postgres::types::ToSql + Sync); 10] = [
        &h.run_id,
        &h.scenario,
        &msg.body.key,
        &msg.msg_id,
        &h.pid,
        &msg.read_ct,
        &attempts,
        &msg.last_read_at,
        &msg.vt,
        &started_at,
    ];
    if h.record_starts {
        let conn = h.ledger.connection().await?;
        conn.execute(INSERT_START, &row[..7]).await?;
    }
    if attempt < act.hang_before {
        tracing::info!(key = msg.body.key, "planned hang");
        let hang = match act.hang_ms {
            0 => Duration::from_secs(3600),
            ms => Duration::from_millis(ms),
        };
        tokio::time::sleep(hang).await;
    }
    if attempt < act.panic_before {
        panic!("planned panic on key {} attempt {attempt}", msg.body.key);
    }
    if attempt < act.fail_before {
        return Err(format!("planned failure on key {} attempt {attempt}", msg.body.key).into());
    }
    if act.fail_unless_redriven && msg.header(REDRIVEN_HEADER).is_none() {
        return Err(format!("planned failure on key {} until redriven", msg.body.key).into());
    }
    let age = Utc::now() - msg.enqueued_at;
    if act.snooze_ms > 0 && age.num_milliseconds() < act.snooze_ms as i64 {
        h.snoozed.fetch_add(1, Ordering::Relaxed);
        return Ok(Outcome::Snooze(Duration::from_millis(200)));
    }
    if act.expire_once {
        expire_once(h, &msg).await?;
    }
    let sleep = h.sleep + Duration::from_millis(act.sleep_ms);
    if !sleep.is_zero() {
        tokio::time::sleep(sleep).await;
    }
    if cx.is_some_and(Context::is_cancelled) {
        return Err(format!("key {}: delivery cancelled before its record", msg.body.key).into());
    }
    if h.skip_ledger && skipped_by_sabotage(msg.body.key) {
        // The planted bug: acknowledged, never recorded.
        return Ok(Outcome::Delete);
    }
    match tx {
        Some(tx) => {
            tx.execute(INSERT_HANDLING, &row).await?;
        }
        None => {
            let conn = h.ledger.connection().await?;
            // Unsure until the insert returns: should it fail, or should the
            // run be dropped meanwhile (the worker drops an async handler's
            // future at handler_timeout), the row may be there all the same.
            h.ledger_unsure.fetch_add(1, Ordering::Relaxed);
            conn.execute(INSERT_HANDLING, &row).await?;
            // Counted before it stops being unsure: a report read between
            // the two counts the row at most twice, never not at all.
            h.ledger_rows.fetch_add(1, Ordering::Relaxed);
            h.ledger_unsure.fetch_sub(1, Ordering::Relaxed);
        }
    }
    Ok(Outcome::Delete)
}

/// [`Act::expire_once`]: on a message's first delivery, its claim expires
/// under the running handler (its visibility set to now, as a heartbeat
/// that came too late would leave it), and the handler waits, up to 3 s,
/// until the next delivery has started (`record_starts`) before it goes
/// on to record and succeed: its acknowledgement is then a stale one, which
/// the delivery fence must refuse. Later deliveries wait 1 s, so that the
/// stale acknowledgement comes first.
async fn expire_once(h: &HandlerCtx, msg: &Message<Job>) -> Result<(), HandlerError> {
    if msg.read_ct > 1 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        return Ok(());
    }
    tracing::info!(key = msg.body.key, "planned claim expiry");
    h.ledger
        .set_vt(&h.queue, msg.msg_id, Duration::ZERO)
        .await?;
    let conn = h.ledger.connection().await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < deadline {
        let next = conn
            .query_opt(
                "select 1 from pgmq_fault_starts where run_id = $1 and scenario = $2 \
                 and key = $3 and read_ct > $4 limit 1",
                &[&h.run_id, &h.scenario, &msg.body.key, &msg.read_ct],
            )
            .await?;
        if next.is_some() {
            tracing::info!(key = msg.body.key, "the next delivery started");
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// A hook that panics where a message's [`HOOK_PANIC_HEADER`] says, on its
/// first attempt: in `before`, or in `after` (remembered by message id from
/// `before`, which sees the headers).
#[derive(Default)]
struct FaultHook {
    panic_after: std::sync::Mutex<HashSet<i64>>,
}

impl Hook for FaultHook {
    fn before(
        &self,
        ctx: &Context,
        headers: Option<&serde_json::Value>,
    ) -> Result<(), HandlerError> {
        if ctx.attempt() != 1 {
            return Ok(());
        }
        match headers
            .and_then(|h| h.get(HOOK_PANIC_HEADER))
            .and_then(serde_json::Value::as_str)
        {
            Some("before") => panic!("planned panic in Hook::before, message {}", ctx.msg_id()),
            Some("after") => {
                if let Ok(mut set) = self.panic_after.lock() {
                    set.insert(ctx.msg_id());
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn after(&self, ctx: &Context, _result: &Result<Outcome, String>, _took: Duration) {
        let planned = self
            .panic_after
            .lock()
            .map(|mut set| set.remove(&ctx.msg_id()))
            .unwrap_or(false);
        if planned {
            panic!("planned panic in Hook::after, message {}", ctx.msg_id());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_round_trips_as_json() {
        let q = QueueName::new("q").unwrap();
        let d = QueueName::new("q_dlq").unwrap();
        let mut a = WorkerSpec::for_queue(&q, &d, "run", "7");
        a.heartbeat = true;
        a.vt_secs = 3;
        a.record_starts = true;
        a.sabotage = vec![Sabotage::SkipLedger];
        a.kind = HandlerKind::Transactional;
        a.fifo = true;
        a.group = true;
        a.pool_size = 6;
        a.app_name = "pgmq-campaign-w0s1g2".into();
        let json = serde_json::to_string(&a).unwrap();
        assert!(!json.contains("postgres"), "no DSN in the spec: {json}");
        assert!(json.contains(r#""sabotage":["skip-ledger"]"#), "{json}");
        let parsed: WorkerSpec = spec_from_arg(&json).unwrap();
        assert!(parsed.heartbeat);
        assert_eq!(parsed.vt_secs, 3);
        assert_eq!(parsed.scenario, "7");
        assert!(parsed.record_starts && !parsed.sdk_defaults);
        assert_eq!(parsed.sabotage, [Sabotage::SkipLedger]);
        assert_eq!(parsed.kind, HandlerKind::Transactional);
        assert!(parsed.fifo && parsed.group && !parsed.hooks);
        assert_eq!(
            (parsed.pool_size, parsed.app_name.as_str()),
            (6, "pgmq-campaign-w0s1g2")
        );
        assert_eq!(serde_json::to_string(&parsed).unwrap(), json);
    }
}
