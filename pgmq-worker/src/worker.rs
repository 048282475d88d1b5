//! Assembles the parts: start, run, stop.

use std::future::Future;
use std::sync::Arc;

use pgmq_client::QueueName;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::builder::{Plan, WorkerBuilder};
use crate::claim_queue::ClaimQueue;
use crate::claimer::{self, Claimer, Claims};
use crate::completer::{self, Completer};
use crate::db::{ConnectionSource, Source};
use crate::error::Error;
use crate::handle::{Monitor, WorkerHandle};
use crate::handler_loop::{HandlerLoops, Spawner};
use crate::health::HealthState;
use crate::heartbeat::{self, Heartbeat, HeartbeatSignals};
use crate::lease::Leases;
use crate::notifier::{self, Notifier, WakeUp};
use crate::preflight;
use crate::priority::Share;
use crate::runners::RunEnv;
use crate::shutdown::Signals;
use crate::shutdown::{Running, Shutdown, ShutdownHandle, ShutdownReport};
use crate::stats::Stats;
use crate::supervise::{PanicOnce, Supervisor};
use crate::wake::Wake;

/// The handles the parts share, made at start; each part is given the
/// ones it touches.
struct Handles {
    /// Where every task's connections come from.
    source: Source,
    stats: Arc<Stats>,
    /// Wakes the parked claim loops.
    wake: Wake,
    /// The heartbeat's nudge and write lock.
    heartbeat: Arc<HeartbeatSignals>,
    /// The deliveries held, from handler start until their acknowledgement
    /// is written: for the heartbeat, the completer and the report.
    leases: Arc<Leases>,
    /// Claiming, acknowledging, connected, and whether an internal task
    /// failed for good (the worker then stops with an error).
    health: Arc<HealthState>,
    /// Restarts the internal tasks that panic.
    supervisor: Supervisor,
    /// Test hook (feature `fault-injection`): the task that panics once.
    panic_once: Arc<PanicOnce>,
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
    plan: Plan,
    spawner: Box<dyn Spawner<T>>,
    stats: Arc<Stats>,
    stop: ShutdownHandle,
    /// Its share of a prioritized group's capacity (`priority.rs`).
    share: Option<Share>,
}

impl<T> std::fmt::Debug for Worker<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("config", &self.plan)
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

    pub(crate) fn from_parts(source: Source, plan: Plan, spawner: Box<dyn Spawner<T>>) -> Self {
        let stats = Arc::new(Stats::new(plan.handler_loop.concurrency));
        Worker {
            health: Arc::new(HealthState::new()),
            source,
            plan,
            spawner,
            stats,
            stop: ShutdownHandle::new(),
            share: None,
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
    /// Its handler loops, for a prioritized group's default capacity.
    pub(crate) fn concurrency(&self) -> usize {
        self.plan.handler_loop.concurrency
    }

    /// Its visibility timeout, for a prioritized group's claims ahead (with
    /// the `fault-injection` test hook `ahead_past_vt`, endless: the claims
    /// ahead are then bounded by the runs' and the reads' time only).
    pub(crate) fn visibility_timeout(&self) -> std::time::Duration {
        #[cfg(feature = "fault-injection")]
        if self.plan.ahead_past_vt {
            return std::time::Duration::MAX;
        }
        self.plan.claimer.visibility_timeout
    }

    /// Claims and handles within a prioritized group's capacity.
    pub(crate) fn with_share(mut self, share: Option<Share>) -> Self {
        self.share = share;
        self
    }

    pub(crate) fn notified(&self) -> bool {
        self.plan.wake_up == WakeUp::Notify
    }

    /// The queue this worker consumes.
    pub fn queue(&self) -> &QueueName {
        &self.plan.queue
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
    /// open it with), or when the worker's role may not read whether the
    /// queue is paused ([`Error::PauseFlagUnreadable`]). Database faults
    /// while running are retried, never
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
        let health = Arc::clone(&running.part.health);
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
        let plan = self.plan;
        let path = preflight::check_queues(&self.source, &plan.preflight).await?;
        let (notify_throttle, listener) =
            preflight::prepare_notify(&self.source, &plan.preflight, hub.is_none()).await?;
        let shared = Handles {
            source: self.source,
            supervisor: Supervisor::new(
                Arc::clone(&self.stats),
                Arc::clone(&self.health),
                &plan.supervision,
            ),
            panic_once: Arc::new(PanicOnce::new(&plan.supervision)),
            stats: self.stats,
            wake: Wake::default(),
            heartbeat: Arc::default(),
            leases: Arc::new(Leases::new(plan.handler_loop.fence)),
            health: Arc::clone(&self.health),
        };
        // The pause flag is read once before any task starts: a worker
        // started while its queue is paused starts paused, and one whose
        // role may not read the flag does not start.
        let paused = Arc::new(crate::pause::Paused::new(&plan.pause));
        let watch = Arc::new(crate::pause::PauseWatch::new(
            plan.pause,
            shared.source.clone(),
            Arc::clone(&paused),
            Arc::clone(&shared.health),
            shared.wake.clone(),
        ));
        watch
            .first_check(crate::pause::FIRST_CHECK_LIMIT.min(watch.settings.db_timeout))
            .await?;
        // One root, so that dropping a running worker stops every task.
        let root = CancellationToken::new();
        let stop = root.child_token();
        let hb_stop = root.child_token();
        let completer_close = Arc::new(completer::Close::new(root.child_token()));

        let (ack_tx, ack_rx) = completer::channel(&plan.completer);
        // Under a limit of places, the claim loops carry the deletes with
        // their next read (handoff.rs): not in a prioritized group (its
        // gate decides when a loop reads), nor under the fence sabotage.
        let handoff = (path == crate::claimer::ReadPath::Limited
            && plan
                .claimer
                .fleet_limit
                .is_some_and(|l| l.max_running.is_some())
            && self.share.is_none()
            && !plan.completer.fence_off.unfenced())
        .then(|| Arc::new(crate::handoff::Handoff::default()));
        let part = Completer {
            handoff: handoff.clone(),
            settings: plan.completer,
            source: shared.source.clone(),
            stats: Arc::clone(&shared.stats),
            leases: Arc::clone(&shared.leases),
            heartbeat: Arc::clone(&shared.heartbeat),
            health: Arc::clone(&shared.health),
            wake: shared.wake.clone(),
            panic_once: Arc::clone(&shared.panic_once),
        };
        let completer = completer::spawn(part, ack_rx, Arc::clone(&completer_close));

        let claim_queue = Arc::new(ClaimQueue::with(&plan.claim_queue));
        let loops = HandlerLoops {
            settings: plan.handler_loop,
            runs: RunEnv {
                settings: plan.runners,
                source: shared.source.clone(),
                health: Arc::clone(&shared.health),
            },
            queue: Arc::clone(&claim_queue),
            acks: ack_tx,
            stop: stop.clone(),
            stats: Arc::clone(&shared.stats),
            leases: Arc::clone(&shared.leases),
            heartbeat: Arc::clone(&shared.heartbeat),
            wake: shared.wake.clone(),
            supervisor: shared.supervisor.clone(),
            panic_once: Arc::clone(&shared.panic_once),
            share: self.share.clone(),
        };
        let handlers = self.spawner.spawn(Arc::new(loops));

        crate::pause::spawn(watch, &shared.supervisor, &stop);
        if let Some(cfg) = &plan.scheduler {
            let scheduler = crate::scheduler::Scheduler::of(shared.source.clone(), cfg.clone());
            let stop = stop.clone();
            shared
                .supervisor
                .spawn("scheduler", move || scheduler.clone().run(stop.clone()));
        }

        let part = Claimer {
            paused: Arc::clone(&paused),
            settings: plan.claimer.clone(),
            claims: Claims::new(path),
            source: shared.source.clone(),
            queue: Arc::clone(&claim_queue),
            wake: shared.wake.clone(),
            stats: Arc::clone(&shared.stats),
            health: Arc::clone(&shared.health),
            panic_once: Arc::clone(&shared.panic_once),
            share: self.share,
            handoff,
        };
        let claimers = claimer::spawn(part, &shared.supervisor, &stop);

        let heartbeat = plan.heartbeat.map(|settings| {
            let hb = Heartbeat {
                settings,
                source: shared.source.clone(),
                leases: Arc::clone(&shared.leases),
                signals: Arc::clone(&shared.heartbeat),
                stats: Arc::clone(&shared.stats),
                panic_once: Arc::clone(&shared.panic_once),
            };
            heartbeat::spawn(hb, &shared.supervisor, &hb_stop)
        });
        if let Some(settings) = plan.presence {
            let part = crate::presence::Presence {
                settings,
                source: shared.source.clone(),
                stats: Arc::clone(&shared.stats),
                paused: Arc::clone(&paused),
            };
            crate::presence::spawn(part, &shared.supervisor, &hb_stop);
        }
        if let Some(settings) = plan.vacuum {
            let part = crate::vacuum::Vacuum {
                settings,
                source: shared.source.clone(),
            };
            crate::vacuum::spawn(part, &shared.supervisor, &stop);
        }
        let notifier = plan.notifier.map(|settings| {
            let n = Notifier {
                settings,
                source: shared.source.clone(),
                stats: Arc::clone(&shared.stats),
                wake: shared.wake.clone(),
            };
            notifier::spawn(n, &shared.supervisor, notify_throttle, hub, listener, &stop)
        });
        #[cfg(feature = "metrics")]
        {
            let part = crate::metrics::Metrics {
                settings: plan.metrics,
                source: shared.source.clone(),
                stats: Arc::clone(&shared.stats),
                leases: Arc::clone(&shared.leases),
                health: Arc::clone(&shared.health),
                queue: Arc::clone(&claim_queue),
            };
            crate::metrics::spawn(part, &shared.supervisor, &stop);
        }
        shared.health.set_running(true);
        tracing::info!(
            queue = %plan.queue,
            concurrency = plan.claimer.concurrency,
            batch_size = plan.claimer.batch_size,
            claimers = plan.claimer.claimers,
            wake_up = ?plan.wake_up,
            "worker started"
        );
        Ok(Running {
            part: Shutdown {
                settings: plan.shutdown,
                source: shared.source.clone(),
                stats: Arc::clone(&shared.stats),
                leases: Arc::clone(&shared.leases),
                heartbeat: Arc::clone(&shared.heartbeat),
                health: Arc::clone(&shared.health),
            },
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
