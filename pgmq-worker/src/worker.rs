//! Assembles the parts: start, run, stop.

use std::future::Future;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use futures::FutureExt;

use pgmq_client::{Pgmq, QueueName};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::builder::{ClaimReads, Config, WakeUp, WorkerBuilder};
use crate::claim_queue::ClaimQueue;
use crate::claimer::{self, Claims, HandlerTime, ReadPath};
use crate::completer;
use crate::db::{ConnectionSource, Kept, Source};
use crate::error::Error;
use crate::executor::{ExecContext, Spawner};
use crate::health::{Health, HealthState};
use crate::heartbeat::{self, HeartbeatSignals};
use crate::lease::Leases;
use crate::notifier;
use crate::shutdown::{Running, ShutdownHandle, ShutdownReport};
use crate::stats::{bump, Stats, StatsSnapshot};

/// What every task of one worker shares.
pub(crate) struct Shared {
    /// Where every task's connections come from.
    pub source: Source,
    pub config: Arc<Config>,
    pub stats: Arc<Stats>,
    /// The claim loops' room, cursor and wake-ups.
    pub claims: Claims,
    /// Moving average of handler run time, for the claim limit.
    pub handler_time: HandlerTime,
    /// The heartbeat's nudge and write lock.
    pub heartbeat: HeartbeatSignals,
    /// The deliveries held, from handler start until their acknowledgement
    /// is written: for the heartbeat, the completer and the report.
    pub leases: Leases,
    /// Claiming, acknowledging, connected, and whether an internal task
    /// failed for good (the worker then stops with an error).
    pub health: Arc<HealthState>,
    /// Test hook: set once the injected panic fired.
    #[cfg(feature = "fault-injection")]
    pub panicked_once: std::sync::atomic::AtomicBool,
}

impl Shared {
    /// The shared state of a worker about to start, its claims reading as
    /// `path`.
    fn new(
        source: Source,
        config: Arc<Config>,
        stats: Arc<Stats>,
        health: Arc<HealthState>,
        path: ReadPath,
    ) -> Self {
        Shared {
            source,
            claims: Claims::new(config.claim_capacity, path),
            config,
            stats,
            handler_time: HandlerTime::default(),
            heartbeat: HeartbeatSignals::default(),
            leases: Leases::default(),
            health,
            #[cfg(feature = "fault-injection")]
            panicked_once: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Test hook (feature `fault-injection`): panics the first time the
    /// task named in `panic_once_in` calls it.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn maybe_panic(&self, task: &str) {
        if self.config.panic_once_in == Some(task) && !self.panicked_once.swap(true, Relaxed) {
            panic!("injected panic in the {task}");
        }
    }
}

/// A worker for one queue, with its handler, ready to run.
///
/// Build it with [`Worker::builder`], then [`run_until`](Worker::run_until)
/// a shutdown signal, [`run_until_signal`](Worker::run_until_signal), or
/// [`spawn`](Worker::spawn) it in the background. See the crate docs for
/// what it does.
pub struct Worker<T> {
    health: Arc<HealthState>,
    source: Source,
    config: Arc<Config>,
    spawner: Box<dyn Spawner<T>>,
    stats: Arc<Stats>,
    stop: ShutdownHandle,
}

impl<T> std::fmt::Debug for Worker<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<T: DeserializeOwned + Send + 'static> Worker<T> {
    /// A builder for a worker on `queue` whose connections come from
    /// `conns`: a [`Client`](pgmq_client::Client), or any other
    /// [`ConnectionSource`] (a caller's deadpool pool, feature `deadpool`);
    /// see [`WorkerBuilder`] for the settings.
    pub fn builder(conns: impl Into<ConnectionSource>, queue: QueueName) -> WorkerBuilder<T> {
        WorkerBuilder::new(conns.into().inner, queue)
    }

    pub(crate) fn from_parts(
        source: Source,
        config: Arc<Config>,
        spawner: Box<dyn Spawner<T>>,
    ) -> Self {
        let stats = Arc::new(Stats::new(config.concurrency));
        Worker {
            health: Arc::new(HealthState::new()),
            source,
            config,
            spawner,
            stats,
            stop: ShutdownHandle::new(),
        }
    }

    /// A handle that shuts this worker down, gracefully or at once, once it
    /// runs (or as soon as it starts, if called before): for code that
    /// cannot pass a future to [`run_until`](Worker::run_until), and to
    /// escalate a graceful shutdown. See [`ShutdownHandle`].
    ///
    /// ```no_run
    /// # async fn f(worker: pgmq_worker::Worker<serde_json::Value>) -> Result<(), pgmq_worker::Error> {
    /// let stop = worker.shutdown_handle();
    /// let token = tokio_util::sync::CancellationToken::new();
    /// let watchdog = stop.clone();
    /// tokio::spawn(async move {
    ///     // ... when something decides the process must stop now:
    ///     watchdog.immediate();
    /// });
    /// let report = worker.run_until(token.cancelled_owned()).await?;
    /// # Ok(()) }
    /// ```
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.stop.clone()
    }

    /// Whether this worker wakes on notifications ([`WakeUp::Notify`]).
    pub(crate) fn notified(&self) -> bool {
        self.config.wake_up == WakeUp::Notify
    }

    /// The queue this worker consumes.
    pub fn queue(&self) -> &QueueName {
        &self.config.queue
    }

    /// Runs until `signal` completes (its output is ignored), then shuts down
    /// gracefully and returns the report. A [`ShutdownHandle`] from
    /// [`shutdown_handle`](Worker::shutdown_handle) starts the shutdown too,
    /// and can escalate it ([`ShutdownHandle::immediate`]).
    ///
    /// Fails at start when the queue or the dead-letter queue does not exist
    /// (with `check_queue`, the default), when the queue's table is not the
    /// layout this crate writes to, or when [`WakeUp::Notify`] cannot open its
    /// listener for good (a client from [`Client::from_pool`](pgmq_client::Client::from_pool) has no DSN to
    /// open it with). Database faults while running are retried, never
    /// returned; an internal task that fails for good (the completer
    /// panicked: a bug) stops the worker, which then returns
    /// [`Error::Task`] after its shutdown.
    ///
    /// ```no_run
    /// # async fn f(worker: pgmq_worker::Worker<serde_json::Value>) -> Result<(), pgmq_worker::Error> {
    /// let token = tokio_util::sync::CancellationToken::new();
    /// let report = worker.run_until(token.clone().cancelled_owned()).await?;
    /// println!("handled {}, released {}", report.handled, report.released);
    /// # Ok(()) }
    /// ```
    pub async fn run_until<F: Future>(self, signal: F) -> Result<ShutdownReport, Error> {
        self.run_with(signal, None).await
    }

    /// [`run_until`](Self::run_until), with notifications from a group's
    /// shared LISTEN connection when `hub` is given.
    pub(crate) async fn run_with<F: Future>(
        self,
        signal: F,
        hub: Option<tokio::sync::mpsc::UnboundedReceiver<notifier::HubEvent>>,
    ) -> Result<ShutdownReport, Error> {
        let stop = self.stop.clone();
        let running = self.start(hub).await?;
        // If this future is dropped (say, its runtime shuts down) every task
        // stops: claimed messages then come back after their visibility
        // timeout instead of being released.
        let guard = running.root.clone().drop_guard();
        let health = Arc::clone(&running.shared.health);
        tokio::select! {
            _ = signal => {}
            _ = stop.requested() => {}
            _ = health.failed() => {}
        }
        let report = running.shutdown(&stop).await;
        guard.disarm();
        match health.failure() {
            Some(why) => Err(Error::Task(why)),
            None => Ok(report),
        }
    }

    /// Runs until SIGINT or SIGTERM (Ctrl-C on other platforms), then shuts
    /// down gracefully; a second SIGINT or SIGTERM during that shutdown
    /// escalates it ([`ShutdownHandle::immediate`]): running handlers are
    /// abandoned at once, unstarted claims are still given back and finished
    /// handlers' acknowledgements still written, all within about a second,
    /// and the report returns.
    ///
    /// The signal handlers are installed when this is called and stay
    /// installed for the life of the process (tokio's way): SIGINT and
    /// SIGTERM no longer end the process by themselves.
    pub async fn run_until_signal(self) -> Result<ShutdownReport, Error> {
        let stop = self.stop.clone();
        let mut signals = Signals::install();
        let escalation = async {
            signals.recv().await;
            tracing::info!("signal received: stopping gracefully (a second one stops at once)");
            stop.graceful();
            signals.recv().await;
            tracing::warn!("second signal: stopping at once, abandoning running handlers");
            stop.immediate();
        };
        let run = self.run_until(std::future::pending::<()>());
        tokio::pin!(run);
        tokio::select! {
            res = &mut run => res,
            () = escalation => run.await,
        }
    }

    /// Runs in the background; the handle gives statistics and shuts down.
    ///
    /// ```no_run
    /// # async fn f(worker: pgmq_worker::Worker<serde_json::Value>) -> Result<(), pgmq_worker::Error> {
    /// let handle = worker.spawn();
    /// tokio::time::sleep(std::time::Duration::from_secs(10)).await;
    /// println!("{} handled so far", handle.stats().handled);
    /// let report = handle.shutdown().await?;
    /// # Ok(()) }
    /// ```
    pub fn spawn(self) -> WorkerHandle {
        let stop = self.stop.clone();
        let monitor = self.monitor();
        let join = tokio::spawn(self.run_until(std::future::pending::<()>()));
        WorkerHandle {
            stop,
            join,
            monitor,
        }
    }

    /// A handle on this worker's statistics and health, usable while
    /// [`run_until_signal`](Worker::run_until_signal) or
    /// [`run_until`](Worker::run_until) runs (take it before calling them).
    ///
    /// ```no_run
    /// # async fn f(worker: pgmq_worker::Worker<serde_json::Value>) -> Result<(), pgmq_worker::Error> {
    /// let monitor = worker.monitor();
    /// tokio::spawn(async move {
    ///     loop {
    ///         tokio::time::sleep(std::time::Duration::from_secs(10)).await;
    ///         println!("{} handled, healthy: {}", monitor.stats().handled, monitor.health().is_healthy());
    ///     }
    /// });
    /// worker.run_until_signal().await?;
    /// # Ok(()) }
    /// ```
    pub fn monitor(&self) -> Monitor {
        Monitor {
            stats: Arc::clone(&self.stats),
            health: Arc::clone(&self.health),
        }
    }

    /// Checks the queues, then starts every task; with `hub`, notifications
    /// come from a [`WorkerGroup`](crate::WorkerGroup)'s shared LISTEN
    /// connection instead of one of its own.
    pub(crate) async fn start(
        self,
        hub: Option<tokio::sync::mpsc::UnboundedReceiver<notifier::HubEvent>>,
    ) -> Result<Running, Error> {
        let cfg = Arc::clone(&self.config);
        let path = check_queues(&self.source, &cfg).await?;
        let (notify_throttle, listener) = prepare_notify(&self.source, &cfg, hub.is_none()).await?;
        let shared = Arc::new(Shared::new(
            self.source,
            Arc::clone(&cfg),
            self.stats,
            Arc::clone(&self.health),
            path,
        ));
        // One root, so that dropping a running worker stops every task.
        let root = CancellationToken::new();
        let stop = root.child_token();
        let hb_stop = root.child_token();
        let completer_close = Arc::new(completer::Close::new(root.child_token()));

        let (ack_tx, ack_rx) = mpsc::channel(cfg.ack_capacity);
        let completer = spawn_completer(&shared, ack_rx, Arc::clone(&completer_close));

        let claim_queue = Arc::new(ClaimQueue::new(cfg.claim_capacity, cfg.concurrency));
        let exec = Arc::new(ExecContext {
            shared: Arc::clone(&shared),
            queue: Arc::clone(&claim_queue),
            acks: ack_tx,
            stop: stop.clone(),
            queue_name: Arc::new(cfg.queue.clone()),
        });
        let handlers = self.spawner.spawn(exec);

        let claimers = spawn_claimers(&shared, &claim_queue, &stop);

        let heartbeat = cfg.heartbeat.then(|| spawn_heartbeat(&shared, &hb_stop));
        let notifier = (cfg.wake_up == WakeUp::Notify)
            .then(|| spawn_notifier(&shared, notify_throttle, hub, listener, &stop));
        #[cfg(feature = "metrics")]
        spawn_metrics(&shared, &claim_queue, &stop);
        shared.health.set_running(true);
        tracing::info!(
            queue = %cfg.queue,
            concurrency = cfg.concurrency,
            batch_size = cfg.batch_size,
            claimers = cfg.claimers,
            wake_up = ?cfg.wake_up,
            "worker started"
        );
        Ok(Running {
            shared,
            root,
            stop,
            hb_stop,
            claim_queue,
            claimers,
            handlers,
            heartbeat,
            notifier,
            completer,
            completer_close,
        })
    }
}

/// Checks the queue (and the dead-letter queue) when `check_queue` is set,
/// and picks how the claim loops read: the table statements need a layout
/// that was checked, on a PGMQ whose `read` this crate knows.
async fn check_queues(source: &Source, cfg: &Config) -> Result<ReadPath, Error> {
    if cfg.check_queue {
        check_queue(source, &cfg.queue, cfg.db_timeout).await?;
        if let Some(dlq) = &cfg.dead_letter_queue {
            check_queue(source, dlq, cfg.db_timeout).await?;
        }
    }
    let layout_known = cfg.check_queue && check_layout(source, cfg).await?;
    Ok(match cfg.claim_reads {
        ClaimReads::Function => ReadPath::Function,
        ClaimReads::FifoGroups => ReadPath::Grouped,
        _ if !layout_known || !known_read(source, cfg.db_timeout).await => {
            tracing::info!(queue = %cfg.queue, "claims call pgmq.read: the queue table's layout or the PGMQ version is not one this worker knows");
            ReadPath::Function
        }
        ClaimReads::FromStart => ReadPath::FromStart,
        _ => ReadPath::Bounded,
    })
}

/// With [`WakeUp::Notify`]: enables the queue's insert trigger (returning its
/// throttle) and, when `listen`, opens the LISTEN connection. Without it:
/// a zero throttle and no connection.
async fn prepare_notify(
    source: &Source,
    cfg: &Config,
    listen: bool,
) -> Result<(std::time::Duration, Option<pgmq_client::Listener>), Error> {
    if cfg.wake_up != WakeUp::Notify {
        return Ok((std::time::Duration::ZERO, None));
    }
    let throttle = ensure_notify_trigger(source, cfg).await?;
    if !listen {
        return Ok((throttle, None));
    }
    // A setup that can never listen fails now; a database that is away
    // only delays the LISTEN connection (polling meanwhile).
    match notifier::listen(source, &cfg.queue).await {
        Ok(l) => Ok((throttle, Some(l))),
        Err(e) if e.is_transient() => {
            tracing::warn!(error = %e, "LISTEN connection failed; polling until it opens");
            Ok((throttle, None))
        }
        Err(e) => Err(e.into()),
    }
}

/// Starts the completer. It is not restartable (it owns the
/// acknowledgements in flight): if it panics, the worker stops with an
/// error.
fn spawn_completer(
    shared: &Arc<Shared>,
    acks: mpsc::Receiver<completer::Ack>,
    close: Arc<completer::Close>,
) -> JoinHandle<()> {
    let shared = Arc::clone(shared);
    let run = completer::run(Arc::clone(&shared), acks, close);
    tokio::spawn(async move {
        if let Err(p) = std::panic::AssertUnwindSafe(run).catch_unwind().await {
            let why = format!(
                "the completer panicked: {}",
                crate::handler::panic_text(&*p)
            );
            tracing::error!("{why}; stopping the worker");
            shared.health.fail(why);
        }
    })
}

/// Starts the `claimers` supervised claim loops.
fn spawn_claimers(
    shared: &Arc<Shared>,
    claim_queue: &Arc<ClaimQueue<claimer::Claimed>>,
    stop: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    (0..shared.config.claimers)
        .map(|i| {
            let (shared2, queue, stop) =
                (Arc::clone(shared), Arc::clone(claim_queue), stop.clone());
            supervised(shared, "claim loop", move || {
                claimer::run(Arc::clone(&shared2), Arc::clone(&queue), i, stop.clone())
            })
        })
        .collect()
}

/// Starts the supervised heartbeat; it runs until `stop`.
fn spawn_heartbeat(shared: &Arc<Shared>, stop: &CancellationToken) -> JoinHandle<()> {
    let (shared2, stop) = (Arc::clone(shared), stop.clone());
    supervised(shared, "heartbeat", move || {
        heartbeat::run(Arc::clone(&shared2), stop.clone())
    })
}

/// Starts the supervised publisher of the `metrics` feature; it runs until
/// `stop`.
#[cfg(feature = "metrics")]
fn spawn_metrics(
    shared: &Arc<Shared>,
    claim_queue: &Arc<ClaimQueue<claimer::Claimed>>,
    stop: &CancellationToken,
) {
    let (shared2, queue, stop) = (Arc::clone(shared), Arc::clone(claim_queue), stop.clone());
    supervised(shared, "metrics", move || {
        crate::metrics::run(Arc::clone(&shared2), Arc::clone(&queue), stop.clone())
    });
}

/// Starts the supervised notifier: on a group's shared LISTEN connection
/// (`hub`) or on a connection of its own (starting with `listener`, when
/// one was opened). Either is taken by the first run; a restart after a
/// panic opens a connection of its own. `throttle` is the insert trigger's:
/// the notifier reads once more this long after each notification.
fn spawn_notifier(
    shared: &Arc<Shared>,
    throttle: std::time::Duration,
    hub: Option<mpsc::UnboundedReceiver<notifier::HubEvent>>,
    listener: Option<pgmq_client::Listener>,
    stop: &CancellationToken,
) -> JoinHandle<()> {
    let (shared2, stop) = (Arc::clone(shared), stop.clone());
    let first = std::sync::Mutex::new(Some((hub, listener)));
    supervised(shared, "notifier", move || {
        let taken = first.lock().unwrap_or_else(|p| p.into_inner()).take();
        let (shared, stop) = (Arc::clone(&shared2), stop.clone());
        async move {
            match taken {
                Some((Some(events), _)) => {
                    notifier::run_shared(shared, throttle, events, stop).await
                }
                Some((None, listener)) => notifier::run(shared, throttle, listener, stop).await,
                None => notifier::run(shared, throttle, None, stop).await,
            }
        }
    })
}

/// Runs the task that `make` builds until it returns; after a panic, logs
/// it, counts it in `task_restarts`, records it in the health
/// ([`Health::task_restarts`], [`Health::last_restart`]) and runs a new one
/// (after a short pause, so that a task that panics at once does not spin).
pub(crate) fn supervised<F, Fut>(
    shared: &Arc<Shared>,
    name: &'static str,
    make: F,
) -> JoinHandle<()>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        loop {
            match std::panic::AssertUnwindSafe(make()).catch_unwind().await {
                Ok(()) => return,
                Err(p) => {
                    // The campaign's panic-uncaught sabotage models a worker
                    // without this supervision: the loop stays dead.
                    #[cfg(feature = "fault-injection")]
                    if shared.config.resume_panics {
                        return;
                    }
                    bump(&shared.stats.c.task_restarts, 1);
                    let why = crate::handler::panic_text_of(name, &*p);
                    tracing::error!(task = name, panic = %why, "internal task panicked; restarting it");
                    shared.health.restarted(why);
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    })
}

/// The columns of PGMQ's queue table that the fenced writes use, with their
/// types: the same from PGMQ 1.11 (the oldest supported) to 1.13.
const LAYOUT: &[(&str, &str)] = &[
    ("msg_id", "bigint"),
    ("read_ct", "integer"),
    ("enqueued_at", "timestamp with time zone"),
    ("last_read_at", "timestamp with time zone"),
    ("vt", "timestamp with time zone"),
    ("message", "jsonb"),
    ("headers", "jsonb"),
];

/// Whether the detected PGMQ's `read` is the one the claim statement
/// repeats (1.x from [`MIN_SUPPORTED`](pgmq_client::MIN_SUPPORTED) on); a
/// client that skipped detection does not say.
async fn known_read(source: &Source, limit: std::time::Duration) -> bool {
    source
        .install(limit)
        .await
        .is_some_and(|i| i.version.major == 1 && i.version >= pgmq_client::MIN_SUPPORTED)
}

/// Fails when the queue table lacks a column the fenced writes use (a PGMQ
/// whose layout this crate does not know); true when the layout was
/// checked, false when a transient error kept it from being checked (that
/// only warns).
async fn check_layout(source: &Source, cfg: &Config) -> Result<bool, Error> {
    let queue = &cfg.queue;
    let sql = "SELECT a.attname::text, pg_catalog.format_type(a.atttypid, a.atttypmod)                FROM pg_catalog.pg_attribute a                WHERE a.attrelid = pg_catalog.to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped";
    let rows = match query_on_table(source, cfg, sql).await {
        Ok(rows) => rows,
        Err(e) if e.is_transient() => {
            tracing::warn!(error = %e, queue = %queue, "could not check the queue table's layout; starting anyway");
            return Ok(false);
        }
        Err(e) => {
            return Err(Error::Config(format!(
                "could not read the queue table's layout: {e}"
            )))
        }
    };
    let have: Vec<(String, String)> = rows
        .iter()
        .filter_map(|r| Some((r.try_get(0).ok()?, r.try_get(1).ok()?)))
        .collect();
    for (col, ty) in LAYOUT {
        if !have.iter().any(|(c, t)| c == col && t == ty) {
            return Err(Error::Config(format!(
                "the table of queue {queue} has no column {col} of type {ty}: this PGMQ's layout is not one this worker writes to"
            )));
        }
    }
    Ok(true)
}

/// Runs `sql`, whose one parameter `$1` is the queue's quoted table name,
/// on a connection of its own within `db_timeout` (abandoned past it);
/// unnamed, in one round trip, so that it works behind PgBouncer's
/// transaction mode too.
async fn query_on_table(
    source: &Source,
    cfg: &Config,
    sql: &str,
) -> Result<Vec<pgmq_client::reexports::tokio_postgres::Row>, pgmq_client::Error> {
    use pgmq_client::reexports::tokio_postgres::types::{ToSql, Type};
    let table = cfg.queue.quoted_table();
    let conn = source.checkout(cfg.db_timeout).await?;
    let params = [(&table as &(dyn ToSql + Sync), Type::TEXT)];
    let query = async { Ok(conn.pg().query_typed(sql, &params).await?) };
    crate::db::bounded(cfg.db_timeout, &conn, query).await
}

/// Fails when `queue` does not exist; a transient error only warns (the
/// worker retries once running).
async fn check_queue(
    source: &Source,
    queue: &QueueName,
    limit: std::time::Duration,
) -> Result<(), Error> {
    match Pgmq::on(Kept::new(source.clone(), 0, limit))
        .queue_exists(queue)
        .await
    {
        Ok(true) => Ok(()),
        Ok(false) => Err(Error::Client(pgmq_client::Error::QueueNotFound {
            queue: queue.as_str().to_owned(),
        })),
        Err(e) if e.is_transient() => {
            tracing::warn!(error = %e, queue = %queue, "could not check the queue; starting anyway");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Enables PGMQ's insert trigger on the queue unless it already is; sets
/// the throttle of an existing trigger only when the builder was given one.
/// Returns the trigger's throttle (the configured one when it cannot be
/// looked up).
async fn ensure_notify_trigger(
    source: &Source,
    cfg: &Config,
) -> Result<std::time::Duration, Error> {
    let client = Pgmq::on(Kept::new(source.clone(), 0, cfg.db_timeout));
    let wanted = cfg.notify_throttle;
    let existing = match client.list_notify_insert_throttles().await {
        Ok(list) => list
            .into_iter()
            .find(|t| t.queue_name == cfg.queue.as_str())
            .map(|t| {
                std::time::Duration::from_millis(u64::try_from(t.throttle_interval_ms).unwrap_or(0))
            }),
        Err(e) if e.is_transient() => {
            tracing::warn!(error = %e, "could not check the insert trigger; relying on polling");
            return Ok(wanted);
        }
        Err(e) => return Err(e.into()),
    };
    match existing {
        None => {
            trigger_ddl(source, cfg, TriggerDdl::Enable).await?;
            tracing::info!(queue = %cfg.queue, throttle = ?wanted, "enabled PGMQ's insert notifications");
            Ok(wanted)
        }
        Some(current) if cfg.notify_throttle_set && current != wanted => {
            trigger_ddl(source, cfg, TriggerDdl::Update).await?;
            tracing::info!(queue = %cfg.queue, from = ?current, to = ?wanted, "changed the insert trigger's throttle");
            Ok(wanted)
        }
        Some(current) => Ok(current),
    }
}

/// How long one try of the start-up DDL waits for its lock on the queue
/// table (at most half of `db_timeout`). Producers and readers of the queue
/// queue up behind a DDL statement waiting for its lock, so the wait is
/// kept short, and retried.
const DDL_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

/// Tries of the start-up DDL before the start fails with [`Error::Locked`]
/// (pauses of 0.5, 1, 2 and 4 s between them).
const DDL_TRIES: u32 = 5;

/// The start-up DDL on the queue's insert trigger.
#[derive(Clone, Copy)]
enum TriggerDdl {
    /// `enable_notify_insert` (which drops and creates the trigger).
    Enable,
    /// `update_notify_insert`.
    Update,
}

/// Runs `ddl` in a transaction with a short `lock_timeout`
/// ([`DDL_LOCK_TIMEOUT`]), so that a long transaction holding a lock on the
/// queue table does not make it wait, with every reader and producer of
/// the queue waiting behind it; retries with a growing pause; after
/// [`DDL_TRIES`] fails with [`Error::Locked`], naming the sessions that hold
/// locks on the table.
async fn trigger_ddl(source: &Source, cfg: &Config, ddl: TriggerDdl) -> Result<(), Error> {
    let lock_timeout = DDL_LOCK_TIMEOUT.min(cfg.db_timeout / 2);
    let mut pause = lock_timeout;
    for attempt in 1..=DDL_TRIES {
        match trigger_ddl_once(source, cfg, ddl, lock_timeout).await {
            Ok(()) => return Ok(()),
            Err(e) if is_lock_timeout(&e) => {
                tracing::warn!(queue = %cfg.queue, attempt, "the insert trigger's DDL could not take its lock on the queue table in time (a long transaction holds one); trying again");
            }
            Err(e) => return Err(e.into()),
        }
        if attempt < DDL_TRIES {
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }
    Err(Error::Locked {
        table: cfg.queue.table(),
        holders: lock_holders(source, cfg).await,
    })
}

/// Whether `e` is PostgreSQL's `lock_timeout` (55P03, lock_not_available).
fn is_lock_timeout(e: &pgmq_client::Error) -> bool {
    e.sqlstate()
        == Some(&pgmq_client::reexports::tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE)
}

/// One try of [`trigger_ddl`], bounded by `db_timeout` (and server-side by
/// the same `statement_timeout`).
async fn trigger_ddl_once(
    source: &Source,
    cfg: &Config,
    ddl: TriggerDdl,
    lock_timeout: std::time::Duration,
) -> Result<(), pgmq_client::Error> {
    let mut conn = source.checkout(cfg.db_timeout).await?;
    let run = async {
        let tx = conn.transaction().await?;
        let ms = |d: std::time::Duration| format!("{}ms", d.as_millis());
        tx.execute(
            "SELECT pg_catalog.set_config('lock_timeout', $1, true), pg_catalog.set_config('statement_timeout', $2, true)",
            &[&ms(lock_timeout), &ms(cfg.db_timeout)],
        )
        .await?;
        let pg = Pgmq::on(&tx);
        match ddl {
            TriggerDdl::Enable => {
                pg.enable_notify_insert(&cfg.queue, cfg.notify_throttle)
                    .await?
            }
            TriggerDdl::Update => {
                pg.update_notify_insert(&cfg.queue, cfg.notify_throttle)
                    .await?
            }
        }
        tx.commit().await
    };
    match tokio::time::timeout(cfg.db_timeout, run).await {
        Ok(r) => r,
        Err(_) => {
            conn.abandon();
            Err(pgmq_client::Error::timed_out())
        }
    }
}

/// The sessions holding a lock on the queue's table, for [`Error::Locked`]:
/// their pid, application name, state and how long their transaction has
/// been open (never their query text, which may quote data).
async fn lock_holders(source: &Source, cfg: &Config) -> String {
    let sql = "SELECT a.pid, coalesce(a.application_name, ''), coalesce(a.state, ''), l.mode, \
               coalesce(extract(epoch FROM now() - a.xact_start)::float8, 0) \
               FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
               WHERE l.locktype = 'relation' AND l.granted \
               AND l.relation = pg_catalog.to_regclass($1) AND a.pid <> pg_catalog.pg_backend_pid() \
               ORDER BY a.xact_start LIMIT 5";
    let rows = query_on_table(source, cfg, sql).await;
    match rows {
        Ok(rows) if !rows.is_empty() => rows
            .iter()
            .map(|r| {
                let pid: i32 = r.get(0);
                let app: String = r.get(1);
                let state: String = r.get(2);
                let mode: String = r.get(3);
                let open: f64 = r.get(4);
                format!("pid {pid} (application_name '{app}', {state}, transaction open {open:.0} s, holding {mode})")
            })
            .collect::<Vec<_>>()
            .join(", "),
        Ok(_) => "no session any more".to_owned(),
        Err(e) => format!("unknown sessions (could not look them up: {e})"),
    }
}

/// SIGINT and SIGTERM (Ctrl-C only, off Unix), installed once and received
/// as often as they come.
pub(crate) struct Signals {
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    pub(crate) fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let install = |kind: SignalKind, name: &str| match signal(kind) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::error!(error = %e, "could not install a {name} handler; it will not stop the worker");
                    None
                }
            };
            Signals {
                int: install(SignalKind::interrupt(), "SIGINT"),
                term: install(SignalKind::terminate(), "SIGTERM"),
            }
        }
        #[cfg(not(unix))]
        {
            Signals {}
        }
    }

    /// Resolves on the next signal.
    pub(crate) async fn recv(&mut self) {
        #[cfg(unix)]
        {
            async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
                if let Some(s) = s {
                    if s.recv().await.is_some() {
                        return;
                    }
                }
                std::future::pending().await
            }
            tokio::select! {
                () = next(&mut self.int) => {}
                () = next(&mut self.term) => {}
            }
        }
        #[cfg(not(unix))]
        {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// A worker running in the background (from [`Worker::spawn`]).
///
/// Dropping the handle does not stop the worker (like dropping a tokio
/// `JoinHandle`): call [`shutdown`](WorkerHandle::shutdown).
#[derive(Debug)]
pub struct WorkerHandle {
    stop: ShutdownHandle,
    join: JoinHandle<Result<ShutdownReport, Error>>,
    monitor: Monitor,
}

/// Statistics and health of a worker, readable from anywhere while it runs
/// (from [`Worker::monitor`]); cheap to clone.
#[derive(Debug, Clone)]
pub struct Monitor {
    stats: Arc<Stats>,
    health: Arc<HealthState>,
}

impl Monitor {
    /// What the worker did so far (cheap: atomics and a short lock).
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Whether it is claiming, acknowledging and connected (see [`Health`]).
    pub fn health(&self) -> Health {
        self.health.snapshot()
    }

    /// Messages acknowledged so far (deleted, archived, retried, snoozed or
    /// dead-lettered): the sum of those counters of [`stats`](Self::stats),
    /// read without a lock or a copy of the histograms, for progress loops
    /// that ask often.
    pub fn acked(&self) -> u64 {
        let c = &self.stats.c;
        [
            &c.deleted,
            &c.archived,
            &c.retried,
            &c.snoozed,
            &c.dead_lettered,
        ]
        .iter()
        .map(|a| a.load(Relaxed))
        .sum()
    }
}

impl WorkerHandle {
    /// What the worker did so far (cheap: atomics and a short lock).
    pub fn stats(&self) -> StatsSnapshot {
        self.monitor.stats()
    }

    /// Whether the worker is claiming, acknowledging and connected.
    pub fn health(&self) -> Health {
        self.monitor.health()
    }

    /// A handle on the statistics and health that outlives this one.
    pub fn monitor(&self) -> Monitor {
        self.monitor.clone()
    }

    /// Messages acknowledged so far (deleted, archived, retried, snoozed or
    /// dead-lettered), read without a lock: see [`Monitor::acked`].
    ///
    /// ```no_run
    /// # async fn f(handle: pgmq_worker::WorkerHandle) {
    /// while handle.acked() < 1_000 {
    ///     tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    /// }
    /// # }
    /// ```
    pub fn acked(&self) -> u64 {
        self.monitor.acked()
    }

    /// Whether the worker has stopped (after a shutdown, or a failed start).
    pub fn is_finished(&self) -> bool {
        self.join.is_finished()
    }

    /// A handle that starts or escalates the shutdown from elsewhere, say
    /// while [`shutdown`](WorkerHandle::shutdown) is awaited: see
    /// [`ShutdownHandle`].
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.stop.clone()
    }

    /// Stops the worker gracefully (see the crate docs) and returns its
    /// report. A [`ShutdownHandle::immediate`] meanwhile cuts it short.
    pub async fn shutdown(self) -> Result<ShutdownReport, Error> {
        self.stop.graceful();
        self.join().await
    }

    /// Stops the worker at once ([`ShutdownHandle::immediate`]): running
    /// handlers are abandoned (their messages come back after their
    /// visibility timeout; [`ShutdownReport::abandoned`] lists them),
    /// unstarted claims are given back and finished handlers'
    /// acknowledgements written, all within about a second; returns the
    /// report.
    pub async fn shutdown_now(self) -> Result<ShutdownReport, Error> {
        self.stop.immediate();
        self.join().await
    }

    async fn join(self) -> Result<ShutdownReport, Error> {
        self.join
            .await
            .map_err(|e| Error::Task(format!("worker task ended abnormally: {e}")))?
    }
}
