//! The worker process (`pgmq-faults worker`, hidden): a pgmq-worker
//! whose handler obeys each message's [`Act`] and records every successful
//! handling in the ledger before returning.
//!
//! It speaks pgmq-testkit's child protocol ([`pgmq_testkit::child`]): its
//! [`FaultSpec`] (a [`WorkerSpec`] and the suite's own fields) is the
//! subcommand's one JSON argument, its DSNs are in [`DSN_ENV`] and
//! [`LEDGER_DSN_ENV`]. On stdout: `ready <pid>` once the
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
use pgmq_testkit::spec::{
    BackoffSpec, ClaimReadsSpec, HandlerKind, WakeUpSpec, WorkerSettings, WorkerSpec,
};
use pgmq_worker::{
    Context, GroupShutdown, HandlerError, Hook, Monitor, Outcome, Priority, ShutdownReport,
    TransactionalHandler, Worker, WorkerBuilder, WorkerGroup, WorkerHandle,
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

/// A fault worker process, which the suite passes as the `worker`
/// subcommand's one JSON argument: the worker ([`WorkerSpec`]: its queue,
/// handler kind, every builder setting, pool and `application_name`) and
/// what only the suite's handler and process need. The DSNs are not among
/// them: they come in [`DSN_ENV`] and [`LEDGER_DSN_ENV`], so that they stay
/// out of `ps`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct FaultSpec {
    /// The worker. Its dead-letter queue is a setting
    /// ([`WorkerSettings::dead_letter_queue`]); a setting left empty is
    /// pgmq-worker's default.
    pub(crate) worker: WorkerSpec,
    /// Run id written to the ledger.
    pub(crate) run_id: String,
    /// Scenario label written to the ledger.
    pub(crate) scenario: String,
    /// Extra sleep in every handler, milliseconds.
    pub(crate) sleep_ms: u64,
    /// Also record each handler's start (`pgmq_fault_starts`), so that two
    /// handlers of one message running at once can be measured.
    pub(crate) record_starts: bool,
    /// How often to print the worker's counters, milliseconds.
    pub(crate) stats_ms: u64,
    /// Bugs planted on purpose, to prove that the suite goes red (those of
    /// the list that concern this process apply).
    pub(crate) sabotage: Vec<Sabotage>,
    /// Install the hook that panics where a message's `fault_hook_panic`
    /// header says (`before` or `after`, first attempt only).
    pub(crate) hooks: bool,
    /// Run the worker inside a `WorkerGroup` (of this one worker).
    pub(crate) group: bool,
    /// A second queue: the worker of the spec's queue and one of this
    /// queue run in one `WorkerGroup` under a priority policy.
    #[serde(default)]
    pub(crate) prio: Option<PrioSpec>,
    /// Run a scheduler of periodic sends beside the worker, a pass every
    /// this many milliseconds (the sabotaged one with `schedule-unfenced`).
    #[serde(default)]
    pub(crate) scheduler_poll_ms: Option<u64>,
}

/// The second queue of a prioritized group ([`FaultSpec::prio`]) and the
/// policy: the spec's queue has `weight`, this queue `other_weight`,
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
    /// The group's concurrency (`Priority::concurrency`); None for the
    /// default, the smaller of the two workers'.
    #[serde(default)]
    pub(crate) concurrency: Option<usize>,
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
    /// The campaign's schedulers of periodic sends send a due tick on
    /// their own, outside the statement that moves the schedule past it,
    /// and move it 300 ms later: a tick another scheduler reads meanwhile
    /// is sent twice.
    ScheduleUnfenced,
    /// The campaign's retention cell prunes with its age read in the wrong
    /// unit (seconds for hours): messages younger than the age go.
    RetentionYoung,
    /// The campaign's move cell moves in two transactions (send, then
    /// delete), its connection cut between them: a batch tried again is
    /// sent twice.
    MoveSplit,
    /// The campaign's workers under a limit per key claim without it
    /// (plain reads): more runs of a key at once than its limit.
    KeyLimitIgnored,
    /// The workers take the claim cursor for a fence: their reads from
    /// the start take a range instead, and a retry below the cursor is
    /// never claimed (needs the `fault-injection` feature).
    CursorFence,
    /// The fleet-limited workers' claim reads that carry acknowledgements
    /// claim with a plain `pgmq.read`, taking no place: more runs at once
    /// than the limit (needs the `fault-injection` feature).
    HandoffUnplaced,
    /// The workers trust the last state of the pause flag they read however
    /// old it is: while their reads of the flag hang they go on claiming
    /// (needs the `fault-injection` feature).
    PauseStaleTrusted,
    /// The short-handler priority cell's group claims ahead of its runs
    /// without the bound of a quarter of its visibility timeout: claims
    /// wait locally past it (needs the `fault-injection` feature).
    PrioAheadPastVt,
}

impl Sabotage {
    /// The command-line spelling (clap's, from the variant's name).
    pub(crate) fn as_arg(self) -> String {
        use clap::ValueEnum;
        self.to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned())
    }

    /// The command-line spelling of a list (`none` for an empty one).
    pub(crate) fn list_arg(list: &[Sabotage]) -> String {
        let names: Vec<String> = list
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

impl FaultSpec {
    /// The suite's defaults for a queue of a scenario (the DSN is passed
    /// by environment).
    pub(crate) fn for_queue(
        queue: &QueueName,
        dlq: &QueueName,
        run_id: &str,
        scenario: &str,
    ) -> Self {
        FaultSpec {
            worker: WorkerSpec {
                settings: WorkerSettings {
                    concurrency: Some(8),
                    batch_size: Some(100),
                    claim_capacity: Some(200),
                    poll_interval_ms: Some(100),
                    wake_up: Some(WakeUpSpec::Poll),
                    max_attempts: Some(5),
                    retry_backoff: Some(BackoffSpec {
                        base_ms: 1000,
                        max_ms: 2000,
                    }),
                    shutdown_grace_ms: Some(10_000),
                    heartbeat: Some(false),
                    ..FaultSpec::sdk_defaults(5_000, dlq)
                },
                pool_size: Some(4),
                application_name: Some("pgmq-fault-worker".to_owned()),
                ..WorkerSpec::new(queue.as_str())
            },
            run_id: run_id.to_owned(),
            scenario: scenario.to_owned(),
            sleep_ms: 0,
            record_starts: false,
            stats_ms: 200,
            sabotage: Vec::new(),
            hooks: false,
            group: false,
            prio: None,
            scheduler_poll_ms: None,
        }
    }

    /// pgmq-worker's defaults but for the visibility timeout `vt_ms` and
    /// the dead-letter queue `dlq`: every other setting left empty. The
    /// suite sizes pools on purpose (the campaign's transactional process
    /// gets fewer connections than its handlers' transactions need, to
    /// prove that a checkout timeout uses no attempt), so a small pool is
    /// allowed.
    pub(crate) fn sdk_defaults(vt_ms: u64, dlq: &QueueName) -> WorkerSettings {
        WorkerSettings {
            visibility_timeout_ms: Some(vt_ms),
            dead_letter_queue: Some(dlq.as_str().to_owned()),
            allow_small_pool: Some(true),
            ..WorkerSettings::default()
        }
    }

    /// The visibility timeout, whole seconds.
    pub(crate) fn vt_secs(&self) -> u64 {
        self.worker.settings.visibility_timeout_ms.unwrap_or(0) / 1000
    }

    /// Sets the visibility timeout, whole seconds.
    pub(crate) fn set_vt_secs(&mut self, secs: u64) {
        self.worker.settings.visibility_timeout_ms = Some(secs * 1000);
    }

    /// Retries a failed message up to `max_attempts` attempts, after a
    /// backoff from `base_ms` doubling up to `max_ms`.
    pub(crate) fn set_retries(&mut self, max_attempts: u32, base_ms: u64, max_ms: u64) {
        self.worker.settings.max_attempts = Some(max_attempts);
        self.worker.settings.retry_backoff = Some(BackoffSpec { base_ms, max_ms });
    }

    /// Concurrent handlers (those of the suite's defaults when left to
    /// pgmq-worker's).
    pub(crate) fn concurrency(&self) -> usize {
        self.worker.settings.concurrency.unwrap_or(8)
    }

    /// Messages per read (pgmq-worker's default, 100, when left to it).
    pub(crate) fn batch_size(&self) -> usize {
        self.worker.settings.batch_size.unwrap_or(100)
    }

    /// The `application_name` of the process's connections.
    pub(crate) fn app_name(&self) -> &str {
        self.worker
            .application_name
            .as_deref()
            .unwrap_or("pgmq-fault-worker")
    }

    /// Whether it claims in FIFO-group order.
    pub(crate) fn fifo(&self) -> bool {
        self.worker.settings.claim_reads == Some(ClaimReadsSpec::FifoGroups)
    }

    /// The worker's settings with the sabotages that change a builder
    /// setting planted: no heartbeat (`heartbeat-off`), plain reads for a
    /// FIFO worker (`fifo-unordered`), a fleet limit four times the
    /// fleet's (`fleet-over`), no limit per key (`key-limit-ignored`).
    fn sabotaged_settings(&self) -> WorkerSettings {
        let mut s = self.worker.settings.clone();
        for sabotage in &self.sabotage {
            match sabotage {
                Sabotage::HeartbeatOff => s.heartbeat = Some(false),
                Sabotage::FifoUnordered if self.fifo() => {
                    s.claim_reads = Some(ClaimReadsSpec::Bounded)
                }
                Sabotage::FleetOver => s.fleet_limit = s.fleet_limit.map(|n| n * 4),
                Sabotage::KeyLimitIgnored => s.key_limit = None,
                _ => {}
            }
        }
        s
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
    /// Runs `group`, whose members' monitors are `monitors`, until its
    /// shutdown.
    fn group(group: WorkerGroup, monitors: Vec<Monitor>) -> Running {
        let stop = group.shutdown_handle();
        let task = tokio::spawn(group.run_until(std::future::pending::<()>()));
        Running::Group {
            monitors,
            stop,
            task,
        }
    }

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

/// Builds the worker of one queue of the process (`queue`, its
/// dead-letter queue `dlq`) with the spec's settings, its handler obeying
/// each message's act and recording in `h`'s ledger scenario.
fn build_worker(
    client: &Client,
    queue: &str,
    dlq: &str,
    args: &FaultSpec,
    h: Arc<HandlerCtx>,
) -> Result<Worker<Job>, BoxError> {
    let worker = WorkerSpec {
        queue: queue.to_owned(),
        settings: WorkerSettings {
            dead_letter_queue: Some(dlq.to_owned()),
            ..args.sabotaged_settings()
        },
        ..args.worker.clone()
    };
    let builder = injected(worker.builder::<Job>(client.clone())?, args)?;
    let builder = if args.hooks {
        builder.hook(FaultHook::default())
    } else {
        builder
    };
    let builder = match args.scheduler_poll_ms {
        Some(ms) if !args.sabotage.contains(&Sabotage::ScheduleUnfenced) => {
            builder.scheduler(crate::scheduled::config(Duration::from_millis(ms)))
        }
        _ => builder,
    };
    let builder = match args.worker.handler {
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
/// `spec` is the suite's `FaultSpec` as JSON; the DSNs are read from
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
    let args: FaultSpec = spec_from_arg(spec)?;
    let dsn = std::env::var(DSN_ENV).map_err(|_| format!("the worker needs {DSN_ENV}"))?;
    let ledger_dsn = std::env::var(LEDGER_DSN_ENV).ok();
    let queue = QueueName::new(&args.worker.queue)?;
    let dlq = args
        .worker
        .settings
        .dead_letter_queue
        .clone()
        .ok_or("the worker needs a dead-letter queue")?;
    let pool_size = args.worker.pool_size.unwrap_or(4);
    let client = connect_retrying(&dsn, pool_size, true, args.app_name()).await?;
    let ledger_dsn = ledger_dsn.as_deref().unwrap_or(&dsn);
    let ledger = connect_retrying(
        ledger_dsn,
        args.concurrency() as u32 + 1,
        false,
        args.app_name(),
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
    let worker = build_worker(&client, queue.as_str(), &dlq, &args, hctxs[0].clone())?;
    if let Some(ms) = args.scheduler_poll_ms {
        if args.sabotage.contains(&Sabotage::ScheduleUnfenced) {
            tokio::spawn(crate::scheduled::unfenced(
                client.clone(),
                Duration::from_millis(ms),
            ));
        }
    }
    let running = if let Some(p) = &args.prio {
        // Two queues in one group under a priority policy.
        hctxs.push(handler_ctx(&QueueName::new(&p.queue)?, &p.scenario));
        let other = build_worker(&client, &p.queue, &p.dlq, &args, hctxs[1].clone())?;
        let policy = if args.sabotage.contains(&Sabotage::PrioStrict) {
            Priority::strict()
        } else {
            Priority::weighted()
        };
        let policy = match p.concurrency {
            Some(n) => policy.concurrency(n),
            None => policy,
        };
        let monitors = vec![worker.monitor(), other.monitor()];
        let group = WorkerGroup::new(client)
            .priority(policy)
            .with_worker_priority(worker, p.weight)
            .with_worker_priority(other, p.other_weight);
        Running::group(group, monitors)
    } else if args.group {
        let monitors = vec![worker.monitor()];
        Running::group(WorkerGroup::new(client).with_worker(worker), monitors)
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

/// Plants the fault-injection sabotages of `args`, pgmq-worker's testing
/// switches (those that change a setting are planted in the settings, by
/// [`FaultSpec::sabotaged_settings`]; the handler's own, `skip-ledger`, is
/// in [`obey_and_record`]).
fn injected(builder: WorkerBuilder<Job>, args: &FaultSpec) -> Result<WorkerBuilder<Job>, BoxError> {
    let mut builder = builder;
    for s in &args.sabotage {
        builder = match s {
            #[cfg(feature = "fault-injection")]
            Sabotage::PanicUncaught => builder.resume_handler_panics(),
            #[cfg(feature = "fault-injection")]
            Sabotage::FenceOff => builder.fence_off(),
            #[cfg(feature = "fault-injection")]
            Sabotage::FifoBlockingOverlap => builder.fifo_blocking_wait_off(),
            #[cfg(feature = "fault-injection")]
            Sabotage::CursorFence => builder.claim_cursor_fence(),
            #[cfg(feature = "fault-injection")]
            Sabotage::HandoffUnplaced => builder.claim_handoff_unplaced(),
            #[cfg(feature = "fault-injection")]
            Sabotage::PauseStaleTrusted => builder.trust_stale_pause_flag(),
            #[cfg(feature = "fault-injection")]
            Sabotage::PrioAheadPastVt => builder.claims_ahead_past_vt(),
            #[cfg(not(feature = "fault-injection"))]
            Sabotage::PanicUncaught
            | Sabotage::FenceOff
            | Sabotage::FifoBlockingOverlap
            | Sabotage::CursorFence
            | Sabotage::HandoffUnplaced
            | Sabotage::PauseStaleTrusted
            | Sabotage::PrioAheadPastVt => {
                return Err(format!(
                    "--sabotage {} needs pgmq-faults built with --features fault-injection",
                    s.as_arg()
                )
                .into())
            }
            // The settings' (in `sabotaged_settings`), the handler's own
            // (skip-ledger), the group's (in `worker_main`), and the
            // campaign's own producer, nemesis and extension cell.
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
    let mut json = stats_json(&report.stats);
    let shutdown = serde_json::json!({
        "handled": report.handled,
        "acked": report.acked,
        "released": report.released,
        "still_running_at_deadline": report.still_running_at_deadline,
        "abandoned": report.abandoned,
        "immediate": report.immediate,
        "acks_failed": report.acks_failed,
        "claims_lost": report.claims_lost,
        "pid": std::process::id(),
        "release_failed": report.release_failed,
        "ledger_rows": h.ledger_rows.load(Ordering::Relaxed),
        "ledger_unsure": h.ledger_unsure.load(Ordering::Relaxed),
        "snoozed": h.snoozed.load(Ordering::Relaxed),
        "shutdown_ms": report.elapsed.as_millis() as u64,
    });
    // The shutdown's values replace the final counters of the same name.
    if let (serde_json::Value::Object(m), serde_json::Value::Object(x)) = (&mut json, shutdown) {
        m.extend(x);
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

    /// The suite's defaults for queue `q` of scenario 7.
    fn spec() -> FaultSpec {
        let q = QueueName::new("q").unwrap();
        let d = QueueName::new("q_dlq").unwrap();
        FaultSpec::for_queue(&q, &d, "run", "7")
    }

    #[test]
    fn the_spec_round_trips_as_json() {
        let mut a = spec();
        a.worker.settings.heartbeat = Some(true);
        a.set_vt_secs(3);
        a.record_starts = true;
        a.sabotage = vec![Sabotage::SkipLedger];
        a.worker.handler = HandlerKind::Transactional;
        a.worker.settings.claim_reads = Some(ClaimReadsSpec::FifoGroups);
        a.group = true;
        a.worker.pool_size = Some(6);
        a.worker.application_name = Some("pgmq-campaign-w0s1g2".into());
        let json = serde_json::to_string(&a).unwrap();
        assert!(!json.contains("postgres"), "no DSN in the spec: {json}");
        assert!(json.contains(r#""sabotage":["skip-ledger"]"#), "{json}");
        let parsed: FaultSpec = spec_from_arg(&json).unwrap();
        assert_eq!(parsed.worker, a.worker);
        assert_eq!(parsed.vt_secs(), 3);
        assert_eq!(parsed.scenario, "7");
        assert!(parsed.record_starts);
        assert_eq!(parsed.sabotage, [Sabotage::SkipLedger]);
        assert!(parsed.fifo() && parsed.group && !parsed.hooks);
        assert_eq!(parsed.app_name(), "pgmq-campaign-w0s1g2");
        assert_eq!(serde_json::to_string(&parsed).unwrap(), json);
    }

    #[test]
    fn a_sabotage_is_spelled_alike_on_the_command_line_and_in_the_spec() {
        use clap::ValueEnum;
        for s in Sabotage::value_variants() {
            let json = serde_json::to_string(s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_arg()));
        }
    }

    #[test]
    fn sabotages_rewrite_the_settings_they_concern() {
        let mut a = spec();
        a.worker.settings.heartbeat = Some(true);
        a.worker.settings.fleet_limit = Some(3);
        a.worker.settings.claim_reads = Some(ClaimReadsSpec::FifoGroups);
        assert_eq!(a.sabotaged_settings(), a.worker.settings);
        a.sabotage = vec![
            Sabotage::HeartbeatOff,
            Sabotage::FleetOver,
            Sabotage::FifoUnordered,
        ];
        let s = a.sabotaged_settings();
        assert_eq!(s.heartbeat, Some(false));
        assert_eq!(s.fleet_limit, Some(12));
        assert_eq!(s.claim_reads, Some(ClaimReadsSpec::Bounded));
    }
}
