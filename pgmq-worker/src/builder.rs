//! The builder, every setting and its default.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use pgmq_client::QueueName;

use crate::backoff::Backoff;
use crate::claimer::ClaimReads;
use crate::db::Source;
use crate::notifier::WakeUp;
use serde::de::DeserializeOwned;

use crate::batch_loop::{batch_spawner, transactional_batch_spawner};
use crate::error::Error;
use crate::handler::{
    BatchHandler, BlockingHandler, Handler, HandlerWithContext, TransactionalBatchHandler,
    TransactionalHandler,
};
use crate::handler_loop::{
    async_spawner, blocking_spawner, context_spawner, transactional_spawner, Spawner,
};
use crate::worker::Worker;
use crate::{
    claim_queue, claimer, completer, handler_loop, heartbeat, notifier, pause, preflight, runners,
    shutdown, supervise,
};

/// PGMQ's own default throttle for `enable_notify_insert`.
const DEFAULT_NOTIFY_THROTTLE: Duration = Duration::from_millis(250);

/// The settings of a worker, as the builder leaves them.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub queue: QueueName,
    pub concurrency: usize,
    pub batch_size: usize,
    pub claim_capacity: usize,
    pub claimers: usize,
    pub visibility_timeout: Duration,
    pub poll_interval: Duration,
    pub wake_up: WakeUp,
    pub notify_throttle: Duration,
    /// Whether `notify_throttle` was set by the caller (then it overrides
    /// the throttle of an existing trigger).
    pub notify_throttle_set: bool,
    pub max_attempts: u32,
    pub retry_backoff: Backoff,
    pub dead_letter_queue: Option<QueueName>,
    pub shutdown_grace: Duration,
    pub heartbeat: bool,
    pub presence: Option<Duration>,
    pub vacuum: Option<crate::vacuum::QueueVacuum>,
    pub ack_batch_size: usize,
    pub ack_flush_interval: Duration,
    pub ack_capacity: usize,
    pub ack_flushers: usize,
    pub ack_retry_timeout: Duration,
    pub ack_drain_timeout: Duration,
    pub check_queue: bool,
    pub handler_timeout: Option<Duration>,
    pub max_abandoned_blocking_threads: usize,
    pub max_deliveries: u32,
    pub retry_jitter: bool,
    pub db_timeout: Duration,
    /// How often the `metrics` feature publishes.
    pub metrics_interval: Duration,
    /// Hooks around each handler call, in the order added.
    pub hooks: crate::hooks::HookList,
    /// A batch handler's most messages per run and the window it waits
    /// for more after the first (None for the other handlers).
    pub handler_batch: Option<(usize, Duration)>,
    /// Test hook: the internal task that panics once, at its start.
    #[cfg(feature = "fault-injection")]
    pub panic_once_in: Option<&'static str>,
    /// Test hook: a handler's caught panic is raised again in its loop.
    #[cfg(feature = "fault-injection")]
    pub resume_panics: bool,
    /// Test hook: deletes and archives of successes are not fenced.
    #[cfg(feature = "fault-injection")]
    pub fence_off: bool,
    /// Test hook: a FIFO blocking loop does not wait for its abandoned run.
    #[cfg(feature = "fault-injection")]
    pub fifo_blocking_wait_off: bool,
    /// Test hook: the claim cursor is taken for a fence.
    #[cfg(feature = "fault-injection")]
    pub cursor_fence: bool,
    /// Test hook: reads that carry acknowledgements claim without places.
    #[cfg(feature = "fault-injection")]
    pub handoff_unplaced: bool,
    /// Test hook: a pause flag not read lately does not hold the claims.
    #[cfg(feature = "fault-injection")]
    pub stale_flag_trusted: bool,
    /// Test hook: a prioritized group's claims ahead are not bounded by
    /// this worker's visibility timeout.
    #[cfg(feature = "fault-injection")]
    pub ahead_past_vt: bool,
    pub claim_reads: ClaimReads,
    /// A limit shared by every process on the queue (None: none).
    pub fleet_limit: Option<pgmq_client::FleetLimit>,
    /// A scheduler of periodic sends run beside the worker (None: none).
    pub scheduler: Option<crate::scheduler::SchedulerConfig>,
    /// A limit per key shared by every process on the queue (None: none).
    pub key_limit: Option<pgmq_client::KeyLimit>,
}

/// What [`build`](WorkerBuilder::build) derives from the settings: each
/// part's own, holding only what that part reads. Adding a setting means a
/// builder method, a field of the part's `Settings`, and its line here.
#[derive(Debug)]
pub(crate) struct Plan {
    pub queue: QueueName,
    pub wake_up: WakeUp,
    pub preflight: preflight::Settings,
    pub claim_queue: claim_queue::Settings,
    pub claimer: claimer::Settings,
    pub pause: pause::Settings,
    pub handler_loop: handler_loop::Settings,
    pub runners: runners::Settings,
    pub completer: completer::Settings,
    /// None with the heartbeat off.
    pub heartbeat: Option<heartbeat::Settings>,
    /// None without a presence record.
    pub presence: Option<crate::presence::Settings>,
    /// None unless the worker vacuums its queue table.
    pub vacuum: Option<crate::vacuum::Settings>,
    /// None without [`WakeUp::Notify`].
    pub notifier: Option<notifier::Settings>,
    pub shutdown: shutdown::Settings,
    #[cfg(feature = "metrics")]
    pub metrics: crate::metrics::Settings,
    pub supervision: supervise::Settings,
    /// None without a scheduler.
    pub scheduler: Option<crate::scheduler::SchedulerConfig>,
    /// Test hook: a prioritized group's claims ahead are not bounded by
    /// this worker's visibility timeout.
    #[cfg(feature = "fault-injection")]
    pub ahead_past_vt: bool,
}

impl Plan {
    fn of(c: Config) -> Self {
        let fifo = c.claim_reads == ClaimReads::FifoGroups;
        // Under a fleet-wide limit, an acknowledgement frees a place the
        // claim loops may fill at once.
        let wake_claimers = fifo || c.fleet_limit.is_some() || c.key_limit.is_some();
        let (batch_max, batch_window) = c.handler_batch.unwrap_or((1, Duration::ZERO));
        #[cfg(feature = "fault-injection")]
        let fence_off = completer::FenceOff(c.fence_off);
        #[cfg(not(feature = "fault-injection"))]
        let fence_off = completer::FenceOff::default();
        // Under a limit of places, runs stop when their claims may have
        // ended (fence.rs).
        let fence = c
            .fleet_limit
            .or(c.key_limit.as_ref().map(|k| k.limit))
            .and_then(|l| l.max_running)
            .map(|_| crate::fence::margin(c.visibility_timeout));
        // Under a limit of places, an acknowledgement waiting for its batch
        // to fill holds a place of the fleet idle: it goes out at once.
        let ack_flush_interval = if fence.is_some() {
            Duration::ZERO
        } else {
            c.ack_flush_interval
        };
        Plan {
            preflight: preflight::Settings {
                queue: c.queue.clone(),
                dead_letter_queue: c.dead_letter_queue.clone(),
                check_queue: c.check_queue,
                claim_reads: c.claim_reads,
                fleet_limit: c.fleet_limit.is_some(),
                key_limit: c.key_limit.is_some(),
                db_timeout: c.db_timeout,
                notify: c.wake_up == WakeUp::Notify,
                notify_throttle: c.notify_throttle,
                notify_throttle_set: c.notify_throttle_set,
            },
            claim_queue: claim_queue::Settings {
                capacity: c.claim_capacity,
                handlers: c.concurrency,
            },
            claimer: claimer::Settings {
                queue: c.queue.clone(),
                claimers: c.claimers,
                batch_size: c.batch_size,
                claim_capacity: c.claim_capacity,
                concurrency: c.concurrency,
                run_size: batch_max,
                visibility_timeout: c.visibility_timeout,
                poll_interval: c.poll_interval,
                db_timeout: c.db_timeout,
                fleet_limit: c.fleet_limit,
                key_limit: c.key_limit.clone(),
                #[cfg(feature = "fault-injection")]
                cursor_fence: c.cursor_fence,
                #[cfg(feature = "fault-injection")]
                handoff_unplaced: c.handoff_unplaced,
            },
            pause: pause::Settings {
                queue: c.queue.clone(),
                poll_interval: c.poll_interval,
                db_timeout: c.db_timeout,
                #[cfg(feature = "fault-injection")]
                stale_flag_trusted: c.stale_flag_trusted,
            },
            scheduler: c.scheduler.clone(),
            handler_loop: handler_loop::Settings {
                queue: Arc::new(c.queue.clone()),
                concurrency: c.concurrency,
                visibility_timeout: c.visibility_timeout,
                handler_timeout: c.handler_timeout,
                max_attempts: c.max_attempts,
                max_deliveries: c.max_deliveries,
                retry_backoff: c.retry_backoff,
                retry_jitter: c.retry_jitter,
                hooks: c.hooks.clone(),
                wake_claimers,
                batch_max,
                batch_window,
                fence,
                #[cfg(feature = "fault-injection")]
                resume_panics: c.resume_panics,
            },
            runners: runners::Settings {
                queue: c.queue.clone(),
                db_timeout: c.db_timeout,
                fifo_groups: fifo,
                fenced: fence.is_some(),
                max_abandoned_blocking_threads: c.max_abandoned_blocking_threads,
                fence_off,
                #[cfg(feature = "fault-injection")]
                fifo_blocking_wait_off: c.fifo_blocking_wait_off,
            },
            completer: completer::Settings {
                queue: c.queue.clone(),
                dead_letter_queue: c.dead_letter_queue.clone(),
                ack_capacity: c.ack_capacity,
                ack_batch_size: c.ack_batch_size,
                ack_flushers: c.ack_flushers,
                ack_flush_interval,
                ack_retry_timeout: c.ack_retry_timeout,
                db_timeout: c.db_timeout,
                wake_claimers,
                fence_off,
            },
            heartbeat: c.heartbeat.then(|| heartbeat::Settings {
                queue: c.queue.clone(),
                visibility_timeout: c.visibility_timeout,
                db_timeout: c.db_timeout,
            }),
            presence: c.presence.map(|interval| crate::presence::Settings {
                queue: c.queue.clone(),
                interval: interval.max(Duration::from_millis(100)),
                db_timeout: c.db_timeout,
                concurrency: c.concurrency,
                limited: c.fleet_limit.is_some(),
            }),
            vacuum: c.vacuum.map(|policy| crate::vacuum::Settings {
                queue: c.queue.clone(),
                policy,
                db_timeout: c.db_timeout,
            }),
            notifier: (c.wake_up == WakeUp::Notify).then(|| notifier::Settings {
                queue: c.queue.clone(),
                poll_interval: c.poll_interval,
            }),
            shutdown: shutdown::Settings {
                queue: c.queue.clone(),
                shutdown_grace: c.shutdown_grace,
                ack_drain_timeout: c.ack_drain_timeout,
                release_batch: c.batch_size,
                db_timeout: c.db_timeout,
            },
            #[cfg(feature = "metrics")]
            metrics: crate::metrics::Settings {
                queue: c.queue.clone(),
                interval: c.metrics_interval,
                db_timeout: c.db_timeout,
            },
            supervision: supervise::Settings {
                #[cfg(feature = "fault-injection")]
                panic_once_in: c.panic_once_in,
                #[cfg(feature = "fault-injection")]
                resume_panics: c.resume_panics,
            },
            wake_up: c.wake_up,
            #[cfg(feature = "fault-injection")]
            ahead_past_vt: c.ahead_past_vt,
            queue: c.queue,
        }
    }
}

/// Builds a [`Worker`]. Every setting has a default; only the handler is required.
///
/// Each method says what its setting does and why the default is what it
/// is; [Every setting](#every-setting) below lists them all in one table,
/// with their defaults and when to change them.
///
/// The pool needs room for `claimers` + `ack_flushers` + 1 connections
/// (plus `concurrency` with a transactional handler); the LISTEN connection
/// of [`WakeUp::Notify`] is opened outside the pool. While busy, the claim
/// loops and the completer keep their connections from one call to the
/// next; they give them back before waiting, so an idle worker holds none
/// and a smaller pool slows the worker without deadlocking it.
///
/// ```no_run
/// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_worker::Error> {
/// use std::time::Duration;
/// use pgmq_client::{Message, QueueName};
/// use pgmq_worker::{Backoff, Outcome, WakeUp, Worker};
///
/// #[derive(serde::Deserialize)]
/// struct Order { id: u64 }
///
/// let worker: Worker<Order> = Worker::builder(client, QueueName::new("orders")?)
///     .concurrency(4)
///     .wake_up(WakeUp::Notify)
///     .max_attempts(3)
///     .retry_backoff(Backoff::exponential(Duration::from_secs(2), Duration::from_secs(60)))
///     .dead_letter_queue(QueueName::new("orders_dlq")?)
///     .handler(|msg: Message<Order>| async move {
///         println!("order {}", msg.body.id);
///         Ok(Outcome::Delete)
///     })
///     .build()?;
/// # Ok(()) }
/// ```
///
/// # Every setting
///
#[doc = include_str!("../docs/settings.md")]
#[must_use]
pub struct WorkerBuilder<T> {
    source: Source,
    config: Config,
    claim_capacity: Option<usize>,
    ack_batch_size: Option<usize>,
    ack_capacity: Option<usize>,
    ack_retry_timeout: Option<Duration>,
    max_deliveries: Option<u32>,
    spawner: Option<Box<dyn Spawner<T>>>,
    /// The handler is a transactional one (each run holds a connection).
    transactional: bool,
    /// Build even when the pool cannot hold what the worker needs.
    allow_small_pool: bool,
    _t: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for WorkerBuilder<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("config", &self.config)
            .field("has_handler", &self.spawner.is_some())
            .field("allow_small_pool", &self.allow_small_pool)
            .finish_non_exhaustive()
    }
}

impl<T: DeserializeOwned + Send + 'static> WorkerBuilder<T> {
    pub(crate) fn new(source: Source, queue: QueueName) -> Self {
        WorkerBuilder {
            source,
            config: Config {
                queue,
                concurrency: 8,
                batch_size: 100,
                claim_capacity: 300,
                claimers: 2,
                visibility_timeout: Duration::from_secs(30),
                poll_interval: Duration::from_millis(250),
                wake_up: WakeUp::Poll,
                notify_throttle: DEFAULT_NOTIFY_THROTTLE,
                notify_throttle_set: false,
                max_attempts: 5,
                retry_backoff: Backoff::default(),
                dead_letter_queue: None,
                shutdown_grace: Duration::from_secs(30),
                heartbeat: true,
                presence: None,
                vacuum: None,
                ack_batch_size: 200,
                ack_flush_interval: Duration::from_millis(5),
                ack_capacity: 400,
                ack_flushers: 1,
                ack_retry_timeout: Duration::from_secs(30),
                ack_drain_timeout: Duration::from_secs(10),
                check_queue: true,
                handler_timeout: Some(Duration::from_secs(60)),
                max_abandoned_blocking_threads: 16,
                max_deliveries: 0,
                retry_jitter: true,
                db_timeout: Duration::from_secs(10),
                metrics_interval: Duration::from_secs(5),
                hooks: crate::hooks::HookList::default(),
                handler_batch: None,
                #[cfg(feature = "fault-injection")]
                panic_once_in: None,
                #[cfg(feature = "fault-injection")]
                resume_panics: false,
                #[cfg(feature = "fault-injection")]
                fence_off: false,
                #[cfg(feature = "fault-injection")]
                fifo_blocking_wait_off: false,
                #[cfg(feature = "fault-injection")]
                cursor_fence: false,
                #[cfg(feature = "fault-injection")]
                handoff_unplaced: false,
                #[cfg(feature = "fault-injection")]
                stale_flag_trusted: false,
                #[cfg(feature = "fault-injection")]
                ahead_past_vt: false,
                claim_reads: ClaimReads::Bounded,
                fleet_limit: None,
                scheduler: None,
                key_limit: None,
            },
            max_deliveries: None,
            claim_capacity: None,
            ack_batch_size: None,
            ack_capacity: None,
            ack_retry_timeout: None,
            spawner: None,
            transactional: false,
            allow_small_pool: false,
            _t: PhantomData,
        }
    }

    /// Number of handlers running at once (default 8): async handlers
    /// mostly wait on I/O, and 8 covers a 2-4 core host without queueing
    /// much work locally.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.config.concurrency = n;
        self
    }

    /// The most messages one read claims (default 100, at most
    /// [`pgmq_client::MAX_BATCH`]): a round trip per batch rather than per
    /// message, while a read's row locks and the messages it hides behind a
    /// busy worker stay few.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.config.batch_size = n;
        self
    }

    /// The most claimed-but-unstarted messages held locally (default
    /// `3 * batch_size`): room for a read in flight per claimer plus a batch
    /// being handled, so a claim never waits on the acknowledgement of the
    /// last; bounded, so memory does not grow with the backlog. Slow
    /// handlers get less: only what they start within a quarter of the
    /// visibility timeout (see the crate docs).
    pub fn claim_capacity(mut self, n: usize) -> Self {
        self.claim_capacity = Some(n);
        self
    }

    /// Number of concurrent claim loops, each with one read in flight
    /// (default 2): two claim connections drain faster than one while
    /// each waits on its round trip; more mostly add lock contention on the
    /// same rows. A worker that sees N workers on its queue lets only
    /// `n / N` of them read (rounded up, at least one), so that a fleet
    /// keeps about as many reads in flight as one worker; under a
    /// [`fleet_limit`](Self::fleet_limit) with a rate one of them reads.
    pub fn claimers(mut self, n: usize) -> Self {
        self.config.claimers = n;
        self
    }

    /// How long a claimed message stays invisible (whole seconds, at least
    /// 1; default 30 s). The heartbeat extends it for long handlers.
    pub fn visibility_timeout(mut self, d: Duration) -> Self {
        self.config.visibility_timeout = d;
        self
    }

    /// The pause after an empty or short read (default 250 ms).
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.config.poll_interval = d;
        self
    }

    /// Polling only, or LISTEN/NOTIFY with polling as the fallback (default
    /// [`WakeUp::Poll`]: no trigger is installed unless asked for).
    pub fn wake_up(mut self, mode: WakeUp) -> Self {
        self.config.wake_up = mode;
        self
    }

    /// PGMQ's insert-trigger throttle for [`WakeUp::Notify`] (default 250 ms,
    /// PGMQ's own): at most one notification per window. Set explicitly, it
    /// also replaces the throttle of a trigger that is already enabled;
    /// left alone, an existing trigger keeps its throttle.
    ///
    /// Zero notifies on every insert (lowest latency), but then every insert
    /// updates PGMQ's shared throttle row, and concurrent producer
    /// transactions on the queue wait for each other's commit. With a
    /// throttle only one insert per window does; messages sent inside a
    /// window are found by the re-read one throttle after the notification
    /// (see [`WakeUp::Notify`]).
    pub fn notify_throttle(mut self, d: Duration) -> Self {
        self.config.notify_throttle = d;
        self.config.notify_throttle_set = true;
        self
    }

    /// Handler runs that fail (an error, a panic, a timeout, or
    /// [`Outcome::Retry`](crate::Outcome::Retry)) before the message is
    /// dead-lettered (at least 1; default 5). Attempts are counted in the
    /// message's `x-pgmq-worker-attempts` header, written with each retry,
    /// not by PGMQ's `read_ct`: claims given back unstarted, snoozes, and
    /// claims lost in a crash before their handler ran use none.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.config.max_attempts = n;
        self
    }

    /// The delay before a failed message is tried again (default
    /// exponential, 1 s to 5 min).
    pub fn retry_backoff(mut self, b: Backoff) -> Self {
        self.config.retry_backoff = b;
        self
    }

    /// Where messages go after `max_attempts`, on [`Outcome::DeadLetter`](crate::Outcome::DeadLetter)
    /// and when their body does not decode. Without one they are archived.
    pub fn dead_letter_queue(mut self, queue: QueueName) -> Self {
        self.config.dead_letter_queue = Some(queue);
        self
    }

    /// How long in-flight handlers may run after shutdown begins (default 30 s).
    pub fn shutdown_grace(mut self, d: Duration) -> Self {
        self.config.shutdown_grace = d;
        self
    }

    /// Keep a presence record in the `pgmq_sdk` schema, written every
    /// `interval` (at least 100 ms) and once more at shutdown: host, pid,
    /// queue, concurrency, claims/s, acks/s, failures, paused or limited,
    /// last seen; the operator console's fleet page shows it. Default:
    /// none (no record). Optional: without the schema (version 4) the
    /// writes fail, are logged once, and nothing else changes.
    ///
    /// ```
    /// # use pgmq_worker::WorkerBuilder;
    /// # fn f(b: WorkerBuilder<u64>) -> WorkerBuilder<u64> {
    /// b.presence(Some(std::time::Duration::from_secs(10)))
    /// # }
    /// ```
    pub fn presence(mut self, interval: Option<Duration>) -> Self {
        self.config.presence = interval;
        self
    }

    /// Vacuum the queue table when its dead row versions pass
    /// [`QueueVacuum::dead_rows`](crate::QueueVacuum), looked at every
    /// [`QueueVacuum::check_every`](crate::QueueVacuum), so that a busy
    /// queue's table holds a bounded number of dead rows between
    /// autovacuum's visits. Default: none (autovacuum alone). Needs the
    /// worker's role to own the queue table; without it the worker logs
    /// that once and runs on without vacuuming. See docs/settings.md.
    ///
    /// ```
    /// # use pgmq_worker::{QueueVacuum, WorkerBuilder};
    /// # fn f(b: WorkerBuilder<u64>) -> WorkerBuilder<u64> {
    /// b.vacuum(Some(QueueVacuum::at_dead_rows(20_000)))
    /// # }
    /// ```
    pub fn vacuum(mut self, policy: Option<crate::vacuum::QueueVacuum>) -> Self {
        self.config.vacuum = policy;
        self
    }

    /// Whether long handlers get their visibility timeout extended (default
    /// true), so that a live long job is not delivered twice.
    pub fn heartbeat(mut self, on: bool) -> Self {
        self.config.heartbeat = on;
        self
    }

    /// The most ids in one fenced delete, archive or requeue (default
    /// `2 * batch_size`, capped at [`pgmq_client::MAX_BATCH`]): each call is
    /// one statement plus a commit, so larger batches cost the database less
    /// per message, and one writer keeps up with two claimers.
    pub fn ack_batch_size(mut self, n: usize) -> Self {
        self.ack_batch_size = Some(n);
        self
    }

    /// The longest an acknowledgement waits for its batch to fill (default
    /// 5 ms). Only partial batches gathered while the writer is free wait;
    /// acknowledgements that arrived while it was busy go out as soon as it
    /// is free. Under a [`fleet_limit`](Self::fleet_limit) of places none
    /// waits: each holds a place of the fleet until it is written.
    pub fn ack_flush_interval(mut self, d: Duration) -> Self {
        self.config.ack_flush_interval = d;
        self
    }

    /// Acknowledgements queued before handlers wait (default `4 * batch_size`).
    pub fn ack_capacity(mut self, n: usize) -> Self {
        self.ack_capacity = Some(n);
        self
    }

    /// Acknowledgement batches written concurrently (default 1). One writer
    /// of large batches leaves the database's CPU to the claims; raise it
    /// when a single write is often slow (a remote or overloaded database),
    /// so that one slow flush does not stall the next.
    pub fn ack_flushers(mut self, n: usize) -> Self {
        self.config.ack_flushers = n;
        self
    }

    /// How long a failing acknowledgement is retried (default: the
    /// visibility timeout); after that the message is visible again anyway,
    /// and is counted in `acks_failed`.
    pub fn ack_retry_timeout(mut self, d: Duration) -> Self {
        self.ack_retry_timeout = Some(d);
        self
    }

    /// At shutdown, how long queued acknowledgements may take to be written
    /// after the handlers stopped (default 10 s).
    pub fn ack_drain_timeout(mut self, d: Duration) -> Self {
        self.config.ack_drain_timeout = d;
        self
    }

    /// How long a handler may run (default 60 s). One still running after
    /// this is cancelled (its [`Context`](crate::Context) fires, an async
    /// handler's future is dropped), counted in `timed_out`, and its message
    /// retried with backoff, an attempt used; `None` turns it off (then only
    /// the heartbeat's extensions bound a run).
    pub fn handler_timeout(mut self, d: impl Into<Option<Duration>>) -> Self {
        self.config.handler_timeout = d.into();
        self
    }

    /// The most threads of [`blocking_handler`](Self::blocking_handler)
    /// runs abandoned at `handler_timeout` (or on a lost claim) that may
    /// still be running, over all handler loops (default 16). A blocking
    /// run cannot be stopped: its thread goes on until the handler returns,
    /// and the loop starts a new thread for its next message. Once this
    /// many abandoned threads still run, a loop whose run is abandoned
    /// writes that run's retry (the message is not held meanwhile) and
    /// then waits for one of them to end before it takes another message,
    /// and
    /// [`Health::blocking_runs_waiting`](crate::Health::blocking_runs_waiting)
    /// counts it; so a handler that always hangs holds at most
    /// `concurrency` + this many threads. With
    /// [`ClaimReads::FifoGroups`] no run is left behind: the loop waits for
    /// its abandoned run's thread to return before the message is retried,
    /// so that its group never has two runs at once.
    pub fn max_abandoned_blocking_threads(mut self, n: usize) -> Self {
        self.config.max_abandoned_blocking_threads = n;
        self
    }

    /// Deliveries (PGMQ's `read_ct`, less releases and snoozes) after which
    /// a message is dead-lettered without running (default
    /// `max(20, 2 * max_attempts)`; at least `max_attempts`): the guard for a
    /// message whose handler crashes the process every time, so that no
    /// attempt is ever recorded.
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = Some(n);
        self
    }

    /// Whether retry delays get a random spread of ±20% (default true), so
    /// that messages that failed together do not all return at once.
    pub fn retry_jitter(mut self, on: bool) -> Self {
        self.config.retry_jitter = on;
        self
    }

    /// Adds a [`Hook`](crate::Hook) around every handler call; hooks compose
    /// in the order added (see [`Hook`](crate::Hook)).
    pub fn hook(mut self, hook: impl crate::Hook) -> Self {
        self.config.hooks.0.push(std::sync::Arc::new(hook));
        self
    }

    /// How often the `metrics` feature publishes counters and gauges and
    /// samples `pgmq.metrics` (default 5 s; see [Metrics](crate#metrics)).
    pub fn metrics_interval(mut self, d: Duration) -> Self {
        self.config.metrics_interval = d;
        self
    }

    /// The bound on every database call of the worker: read,
    /// acknowledgement, heartbeat, release, pool checkout (default 10 s).
    /// Past it the connection is discarded and the call retried, so a
    /// half-open connection or a blackholed network is noticed within this
    /// time.
    pub fn db_timeout(mut self, d: Duration) -> Self {
        self.config.db_timeout = d;
        self
    }

    /// Test hook (feature `fault-injection`): makes the named internal task
    /// (`"claim loop"`, `"heartbeat"`, `"notifier"`, `"completer"`) panic
    /// once, when it starts, to exercise the supervision.
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn panic_once_in(mut self, task: &'static str) -> Self {
        self.config.panic_once_in = Some(task);
        self
    }

    /// Test hook (feature `fault-injection`): a handler's panic is raised
    /// again in its handler loop once caught, as if it had not been caught,
    /// to prove that a fault campaign sees a dead handler loop.
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn resume_handler_panics(mut self) -> Self {
        self.config.resume_panics = true;
        self
    }

    /// Test hook (feature `fault-injection`): the deletes and archives that
    /// acknowledge a success (the completer's, and those in a transactional
    /// handler's transaction) go by message id alone, without the delivery
    /// fence, so that a stale delivery's acknowledgement lands; to prove
    /// that a fault campaign sees it.
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn fence_off(mut self) -> Self {
        self.config.fence_off = true;
        self
    }

    /// Test hook (feature `fault-injection`): with
    /// [`ClaimReads::FifoGroups`] and a blocking handler, a run abandoned
    /// at `handler_timeout` is acknowledged at once instead of after its
    /// thread returned (the behaviour before the fix), so that its message's
    /// retry and its group's next message run beside it; to prove that a
    /// fault campaign sees it.
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn fifo_blocking_wait_off(mut self) -> Self {
        self.config.fifo_blocking_wait_off = true;
        self
    }

    /// Test hook (feature `fault-injection`): the claim loops' reads from
    /// the start take a range of the queue's claim cursor instead, as if
    /// the cursor were a fence, so that a message made visible again below
    /// it is never claimed; to prove that a fault campaign sees it.
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn claim_cursor_fence(mut self) -> Self {
        self.config.cursor_fence = true;
        self
    }

    /// Test hook (feature `fault-injection`): under a fleet-wide limit of
    /// places, a claim read that carries acknowledgements (handoff.rs)
    /// deletes them, then claims with a plain `pgmq.read` that takes no
    /// place, so that the fleet runs more than its limit; to prove that a
    /// fault campaign sees it.
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn claim_handoff_unplaced(mut self) -> Self {
        self.config.handoff_unplaced = true;
        self
    }

    /// Test hook (feature `fault-injection`): the claim loops go on
    /// claiming while no read of the pause flag has succeeded lately (the
    /// last state read is trusted however old), so that a worker whose
    /// reads of the flag hang claims from a queue that may have been paused
    /// meanwhile; to prove that a fault campaign sees it.
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn trust_stale_pause_flag(mut self) -> Self {
        self.config.stale_flag_trusted = true;
        self
    }

    /// Test hook (feature `fault-injection`): in a prioritized group, this
    /// worker's visibility timeout does not bound the claims ahead of the
    /// runs (as if it were endless), so that with handlers shorter than a
    /// read the group claims ahead what they start during two reads however
    /// long that is, and claims wait locally past their visibility timeout;
    /// to prove that a fault campaign sees it.
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn claims_ahead_past_vt(mut self) -> Self {
        self.config.ahead_past_vt = true;
        self
    }

    /// How the claimers read (default [`ClaimReads::Bounded`]: claims
    /// continue after the last batch, so that they do not slow down as
    /// deleted messages pile up at the head of a draining queue).
    pub fn claim_reads(mut self, how: ClaimReads) -> Self {
        self.config.claim_reads = how;
        self
    }

    /// A limit that holds across every process on the queue (default none):
    /// at most `max_running` messages claimed and not yet acknowledged, and
    /// at most `per_second` claims per second, counted in the database
    /// (see [`FleetLimit`](pgmq_client::FleetLimit) and
    /// [`Pgmq::read_limited_raw`](pgmq_client::Pgmq::read_limited_raw)).
    /// Give every process the same limit; a process joins or leaves with no
    /// other setting, and a crashed process's places are freed within its
    /// visibility timeout. Under `max_running` a handler run stops once
    /// its claim may have ended without being extended (a process stopped
    /// or cut off for about a visibility timeout), so that it never runs
    /// beside the process that took its place; a blocking handler's thread
    /// cannot be stopped (docs/fleet-limits.md says
    /// what holds). Needs the `pgmq_sdk` schema (`pgmq
    /// install-sdk`; the start fails without it) and claims with
    /// `pgmq.read` under a lock per queue, so use it where the limit, not
    /// the claim path, bounds the pace. Not with [`ClaimReads::FifoGroups`].
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_worker::Error> {
    /// use pgmq_client::{FleetLimit, Message, QueueName};
    /// use pgmq_worker::{Outcome, Worker};
    ///
    /// // At most 10 calls to the partner's API at once, 50 a second, from
    /// // however many processes run this worker.
    /// let worker: Worker<serde_json::Value> = Worker::builder(client, QueueName::new("partner_calls")?)
    ///     .fleet_limit(FleetLimit::max_running(10).with_per_second(50.0))
    ///     .handler(|_m: Message<serde_json::Value>| async move { Ok(Outcome::Delete) })
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn fleet_limit(mut self, limit: pgmq_client::FleetLimit) -> Self {
        self.config.fleet_limit = limit.is_limited().then_some(limit);
        self
    }

    /// Runs a scheduler of periodic sends ([`Scheduler`](crate::Scheduler))
    /// beside the worker, on its connection source, until the worker stops
    /// (default: none). Any number of workers may run one: each tick is
    /// sent once for the fleet. It takes one connection of the pool at a
    /// time, beside the worker's own.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_worker::Error> {
    /// use pgmq_client::{Message, QueueName};
    /// use pgmq_worker::{Outcome, SchedulerConfig, Worker};
    /// let worker = Worker::<serde_json::Value>::builder(client, QueueName::new("jobs")?)
    ///     .scheduler(SchedulerConfig::default())
    ///     .handler(|_m: Message<serde_json::Value>| async move { Ok(Outcome::Delete) })
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn scheduler(mut self, config: crate::scheduler::SchedulerConfig) -> Self {
        self.config.scheduler = Some(config);
        self
    }

    /// A limit per key that holds across every process on the queue
    /// (default none): each message's key is read from its headers or its
    /// body ([`KeyFrom`](pgmq_client::KeyFrom)), and each key has at most
    /// `max_running` messages claimed and not yet acknowledged and at most
    /// `per_second` claims a second, counted in the database (see
    /// [`KeyLimit`](pgmq_client::KeyLimit) and
    /// [`Pgmq::read_key_limited_raw`](pgmq_client::Pgmq::read_key_limited_raw)).
    /// The claim passes over the messages of a key at its limit in the
    /// database: they stay in the queue for a later claim, and other keys'
    /// messages go at the queue's full rate. A message without the key is
    /// not limited. Give every process the same limit; a crashed process's
    /// places are freed within its visibility timeout, and under
    /// `max_running` a handler run stops once its claim may have ended, as
    /// under a [`fleet_limit`](Self::fleet_limit). Needs the `pgmq_sdk`
    /// schema (`pgmq install-sdk`; the start fails without it). Not with
    /// [`ClaimReads::FifoGroups`] nor with a `fleet_limit`.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// use pgmq_client::{FleetLimit, KeyFrom, KeyLimit, Message, QueueName};
    /// use pgmq_worker::{Outcome, Worker};
    ///
    /// // At most 2 jobs per customer at once, from however many processes.
    /// let per_customer = KeyLimit::new(KeyFrom::header("customer")?, FleetLimit::max_running(2));
    /// let worker: Worker<serde_json::Value> = Worker::builder(client, QueueName::new("jobs")?)
    ///     .key_limit(per_customer)
    ///     .handler(|_m: Message<serde_json::Value>| async move { Ok(Outcome::Delete) })
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn key_limit(mut self, limit: pgmq_client::KeyLimit) -> Self {
        self.config.key_limit = Some(limit);
        self
    }

    /// Whether to check at start that the queue and dead-letter queue exist
    /// (default true). It also checks the queue table's layout, which the
    /// default claim reads need; without the check claims call `pgmq.read`.
    pub fn check_queue(mut self, on: bool) -> Self {
        self.config.check_queue = on;
        self
    }

    /// The async handler: an `async fn` or closure over `Message<T>`, or any
    /// [`Handler`].
    pub fn handler<H: Handler<T>>(mut self, handler: H) -> Self {
        self.spawner = Some(async_spawner(handler));
        self.config.handler_batch = None;
        self.transactional = false;
        self
    }

    /// An async handler that also takes the run's [`Context`](crate::Context)
    /// (cancellation, deadline, attempt): see [`HandlerWithContext`].
    ///
    /// ```no_run
    /// # fn f(client: pgmq_client::Client) -> Result<(), pgmq_worker::Error> {
    /// use pgmq_client::{Message, QueueName};
    /// use pgmq_worker::{Context, Outcome, Worker};
    /// let worker: Worker<serde_json::Value> = Worker::builder(client, QueueName::new("jobs")?)
    ///     .handler_with_context(|msg: Message<serde_json::Value>, ctx: Context| async move {
    ///         if ctx.attempt() > 1 {
    ///             println!("message {} again, attempt {}", msg.msg_id, ctx.attempt());
    ///         }
    ///         Ok(Outcome::Delete)
    ///     })
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn handler_with_context<H: HandlerWithContext<T>>(mut self, handler: H) -> Self {
        self.spawner = Some(context_spawner(handler));
        self.config.handler_batch = None;
        self.transactional = false;
        self
    }

    /// A handler whose database writes commit in one transaction with the
    /// message's delete or archive (see [`TransactionalHandler`]). Each
    /// running handler holds a pooled connection: the pool needs
    /// `concurrency` + `claimers` + `ack_flushers` + 1 connections, and
    /// [`build`](Self::build) refuses a smaller one
    /// ([`Error::PoolTooSmall`]) unless [`allow_small_pool`](Self::allow_small_pool)
    /// says otherwise. With the defaults (concurrency 8, claimers 2, one
    /// flusher) that is 12, above the client's default `max_size` of 10.
    ///
    /// A failure of the worker's own database work around the handler (no
    /// connection within `db_timeout`, BEGIN, the acknowledgement in the
    /// transaction or COMMIT losing its connection or timing out) is not the
    /// handler's: the message is snoozed for the first retry delay without
    /// using an attempt (nor a delivery), and counted in `tx_unavailable`.
    /// Each of those calls is bounded by `db_timeout`, and a connection
    /// whose call was cut off (by `db_timeout`, `handler_timeout` or an
    /// immediate shutdown) is discarded, its statement cancelled on the
    /// server, never handed out again.
    pub fn transactional_handler<H: TransactionalHandler<T>>(mut self, handler: H) -> Self {
        self.spawner = Some(transactional_spawner(handler));
        self.config.handler_batch = None;
        self.transactional = true;
        self
    }

    /// Builds a worker with a [`transactional_handler`](Self::transactional_handler)
    /// even when its pool is smaller than `concurrency` + `claimers` +
    /// `ack_flushers` + 1 (default false: [`build`](Self::build) refuses
    /// it, since handlers then wait for connections, and the claims,
    /// acknowledgements and heartbeat for theirs, each up to `db_timeout`).
    /// With true it only warns.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use pgmq_client::{Client, Message, QueueName, Transaction};
    /// use pgmq_worker::{Context, Error, HandlerError, Outcome, TransactionalHandler, Worker};
    ///
    /// struct Ledger;
    /// impl TransactionalHandler<serde_json::Value> for Ledger {
    ///     async fn handle(&self, _m: Message<serde_json::Value>, _tx: &Transaction<'_>, _c: Context)
    ///         -> Result<Outcome, HandlerError> { Ok(Outcome::Delete) }
    /// }
    ///
    /// // The default pool (10) cannot hold 8 transactions and the worker's own 4.
    /// let client = Client::connect("postgres://app@db/app").await?;
    /// let q = QueueName::new("payments")?;
    /// let refused = Worker::<serde_json::Value>::builder(client.clone(), q.clone())
    ///     .transactional_handler(Ledger)
    ///     .build();
    /// assert!(matches!(refused, Err(Error::PoolTooSmall { needed: 12, .. })));
    /// // Sized on purpose: build it anyway (a warning is logged).
    /// let worker = Worker::<serde_json::Value>::builder(client, q)
    ///     .allow_small_pool(true)
    ///     .transactional_handler(Ledger)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn allow_small_pool(mut self, yes: bool) -> Self {
        self.allow_small_pool = yes;
        self
    }

    /// A blocking handler, for CPU-bound work: each of the `concurrency`
    /// handler loops hands its messages to a dedicated thread of its own
    /// (a plain thread, not tokio's blocking pool), off the async runtime.
    /// A run past `handler_timeout` is abandoned: its thread is left to
    /// finish on its own (its result is ignored) and the loop starts a new
    /// one, up to [`max_abandoned_blocking_threads`](Self::max_abandoned_blocking_threads)
    /// such threads; at process exit such a thread is simply ended, so a hung
    /// blocking handler never keeps the process alive.
    ///
    /// ```no_run
    /// # fn f(client: pgmq_client::Client) -> Result<(), pgmq_worker::Error> {
    /// use pgmq_client::{Message, QueueName};
    /// use pgmq_worker::{Outcome, Worker};
    /// let worker: Worker<Vec<u64>> = Worker::builder(client, QueueName::new("sums")?)
    ///     .concurrency(2)
    ///     .blocking_handler(|msg: Message<Vec<u64>>| {
    ///         let total: u64 = msg.body.iter().sum();
    ///         println!("{total}");
    ///         Ok(Outcome::Delete)
    ///     })
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn blocking_handler<H: BlockingHandler<T>>(mut self, handler: H) -> Self {
        self.spawner = Some(blocking_spawner(handler));
        self.config.handler_batch = None;
        self.transactional = false;
        self
    }

    /// A batch handler: each run takes up to `max` messages, or what arrived
    /// within `window` of the first (zero: what is claimed and waiting at
    /// that moment), and returns a result per message (see
    /// [`BatchHandler`]). For work that is cheaper in bulk: a multi-row
    /// insert, an API that takes batches. `concurrency` batches run at
    /// once.
    ///
    /// Each message keeps its own lease, attempts and outcome: one
    /// message's `Err` retries it alone, with backoff, and its `Delete`
    /// joins the batched acknowledgements. An `Err` for the whole batch, a
    /// panic or a run past `handler_timeout` fails every message of the
    /// batch (an attempt each). Hooks run around each message (a `before`
    /// that refuses one keeps it out of the batch, failed). `build` refuses
    /// a `max` of 0 or above `claim_capacity` (the batch could never
    /// fill), and a `window` of a quarter of the visibility timeout or
    /// more.
    ///
    /// ```no_run
    /// # fn f(client: pgmq_client::Client) -> Result<(), pgmq_worker::Error> {
    /// use std::time::Duration;
    /// use pgmq_client::{Message, QueueName};
    /// use pgmq_worker::{MessageResult, Outcome, Worker};
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Event { name: String }
    ///
    /// let worker: Worker<Event> = Worker::builder(client, QueueName::new("events")?)
    ///     // Up to 100 at once; after the first, wait 20 ms at most for more.
    ///     .batch_handler(100, Duration::from_millis(20), |batch: Vec<Message<Event>>| async move {
    ///         let names: Vec<&str> = batch.iter().map(|m| m.body.name.as_str()).collect();
    ///         println!("one call for {} events: {names:?}", batch.len());
    ///         Ok(batch.iter().map(|_| Ok(Outcome::Delete)).collect::<Vec<MessageResult>>())
    ///     })
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn batch_handler<H: BatchHandler<T>>(
        mut self,
        max: usize,
        window: Duration,
        handler: H,
    ) -> Self {
        self.spawner = Some(batch_spawner(handler));
        self.config.handler_batch = Some((max, window));
        self.transactional = false;
        self
    }

    /// A batch handler that also gets a [`BatchContext`](crate::BatchContext)
    /// (the batch's cancellation and deadline, each message's attempt and
    /// deliveries): otherwise as [`batch_handler`](Self::batch_handler).
    ///
    /// ```no_run
    /// # fn f(client: pgmq_client::Client) -> Result<(), pgmq_worker::Error> {
    /// use std::time::Duration;
    /// use pgmq_client::{Message, QueueName};
    /// use pgmq_worker::{BatchContext, MessageResult, Outcome, Worker};
    ///
    /// let worker: Worker<serde_json::Value> = Worker::builder(client, QueueName::new("events")?)
    ///     .batch_handler_with_context(100, Duration::from_millis(20), |batch: Vec<Message<serde_json::Value>>, ctx: BatchContext| async move {
    ///         // A message on its fourth attempt or later is set aside.
    ///         Ok((0..batch.len())
    ///             .map(|i| if ctx.attempt(i) > Some(3) { Ok(Outcome::Archive) } else { Ok(Outcome::Delete) })
    ///             .collect::<Vec<MessageResult>>())
    ///     })
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn batch_handler_with_context<H: crate::BatchHandlerWithContext<T>>(
        mut self,
        max: usize,
        window: Duration,
        handler: H,
    ) -> Self {
        self.spawner = Some(crate::batch_loop::batch_with_context_spawner(handler));
        self.config.handler_batch = Some((max, window));
        self.transactional = false;
        self
    }

    /// A batch handler whose database writes commit in one transaction
    /// with the deletes (or archives) of the batch's successes: the batch
    /// of [`batch_handler`](Self::batch_handler), the guarantee of
    /// [`transactional_handler`](Self::transactional_handler), one commit
    /// per batch (see [`TransactionalBatchHandler`]).
    ///
    /// The batch's rows are locked in the transaction, fenced on their
    /// deliveries, before the handler runs: it gets only the messages this
    /// worker still owns (one whose claim was lost is left out and counted
    /// in `claims_lost`), and no claim can be lost while it runs. The
    /// transaction commits the handler's writes whenever one message
    /// succeeded: write only for the messages whose result is a success.
    /// Each running batch holds a pooled connection: the pool needs
    /// `concurrency` + `claimers` + `ack_flushers` + 1 connections, checked
    /// by [`build`](Self::build) as for a transactional handler. The worker's
    /// own database work failing (checkout, BEGIN, the lock, the
    /// acknowledgement or COMMIT losing its connection or timing out)
    /// snoozes the batch without using an attempt (`tx_unavailable`).
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use pgmq_client::{Client, Message, QueueName, Transaction};
    /// use pgmq_worker::{HandlerError, MessageResult, Outcome, TransactionalBatchHandler, Worker};
    ///
    /// struct Rows;
    /// impl TransactionalBatchHandler<i64> for Rows {
    ///     async fn handle(&self, batch: Vec<Message<i64>>, tx: &Transaction<'_>)
    ///         -> Result<Vec<MessageResult>, HandlerError>
    ///     {
    ///         let values: Vec<i64> = batch.iter().map(|m| m.body).collect();
    ///         tx.execute("INSERT INTO rows (v) SELECT unnest($1::bigint[])", &[&values]).await?;
    ///         Ok(batch.iter().map(|_| Ok(Outcome::Delete)).collect())
    ///     }
    /// }
    ///
    /// let client = Client::builder("postgres://app@db/app").max_size(16).connect().await?;
    /// let worker: Worker<i64> = Worker::builder(client, QueueName::new("rows")?)
    ///     .concurrency(4)
    ///     .transactional_batch_handler(200, Duration::from_millis(10), Rows)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn transactional_batch_handler<H: TransactionalBatchHandler<T>>(
        mut self,
        max: usize,
        window: Duration,
        handler: H,
    ) -> Self {
        self.spawner = Some(transactional_batch_spawner(handler));
        self.config.handler_batch = Some((max, window));
        self.transactional = true;
        self
    }

    /// Checks the settings and returns the worker (nothing runs yet).
    pub fn build(self) -> Result<Worker<T>, Error> {
        let mut c = self.config;
        let bad = |m: &str| Err(Error::Config(m.to_owned()));
        if c.concurrency == 0 {
            return bad("concurrency must be at least 1");
        }
        if c.batch_size == 0 {
            return bad("batch_size must be at least 1");
        }
        if c.batch_size > pgmq_client::MAX_BATCH {
            return bad("batch_size must be at most pgmq_client::MAX_BATCH (10 000)");
        }
        if c.claimers == 0 {
            return bad("claimers must be at least 1");
        }
        if c.max_attempts == 0 {
            return bad("max_attempts must be at least 1");
        }
        if c.visibility_timeout < Duration::from_secs(1) {
            return bad("visibility_timeout must be at least 1 s (PGMQ counts whole seconds)");
        }
        if c.ack_flushers == 0 {
            return bad("ack_flushers must be at least 1");
        }
        if c.poll_interval.is_zero() {
            return bad("poll_interval must be above zero");
        }
        if let Some(limit) = &c.fleet_limit {
            if let Err(e) = limit.check() {
                return Err(Error::Config(format!("fleet_limit: {e}")));
            }
            if c.claim_reads == ClaimReads::FifoGroups {
                return bad("fleet_limit does not combine with ClaimReads::FifoGroups");
            }
        }
        if let Some(limit) = &c.key_limit {
            if let Err(e) = limit.check() {
                return Err(Error::Config(format!("key_limit: {e}")));
            }
            if c.claim_reads == ClaimReads::FifoGroups {
                return bad("key_limit does not combine with ClaimReads::FifoGroups");
            }
            if c.fleet_limit.is_some() {
                return bad("key_limit does not combine with fleet_limit");
            }
        }
        c.claim_capacity = self.claim_capacity.unwrap_or(3 * c.batch_size);
        if c.claim_capacity == 0 {
            return bad("claim_capacity must be at least 1");
        }
        c.ack_batch_size = self
            .ack_batch_size
            .unwrap_or(2 * c.batch_size)
            .clamp(1, pgmq_client::MAX_BATCH);
        c.ack_capacity = self.ack_capacity.unwrap_or(4 * c.batch_size).max(1);
        c.ack_retry_timeout = self.ack_retry_timeout.unwrap_or(c.visibility_timeout);
        c.max_deliveries = self
            .max_deliveries
            .unwrap_or_else(|| c.max_attempts.saturating_mul(2).max(20));
        if c.max_deliveries < c.max_attempts {
            return bad("max_deliveries must be at least max_attempts");
        }
        if c.handler_timeout.is_some_and(|d| d.is_zero()) {
            return bad("handler_timeout must be above zero (None turns it off)");
        }
        if c.metrics_interval.is_zero() {
            return bad("metrics_interval must be above zero");
        }
        if c.db_timeout < Duration::from_millis(100) {
            return bad("db_timeout must be at least 100 ms");
        }
        if let Some((max, window)) = c.handler_batch {
            if max == 0 {
                return bad("a batch handler's max must be at least 1");
            }
            if max > c.claim_capacity {
                return bad("a batch handler's max must be at most claim_capacity (raise claim_capacity): the batch could never fill");
            }
            if window >= c.visibility_timeout / 4 {
                return bad("a batch handler's window must be shorter than a quarter of visibility_timeout (its messages wait in it)");
            }
        }
        if c.dead_letter_queue.as_ref() == Some(&c.queue) {
            return bad("the dead-letter queue must not be the queue itself (messages would loop)");
        }
        let Some(spawner) = self.spawner else {
            return bad(
                "no handler: call .handler(..), .blocking_handler(..) or .batch_handler(..)",
            );
        };
        check_pool(&self.source, &c, self.transactional, self.allow_small_pool)?;
        Ok(Worker::from_parts(self.source, Plan::of(c), spawner))
    }
}

/// Checks the pool's size against what the worker holds at once: its own
/// `claimers` + `ack_flushers` + 1 (heartbeat) connections, plus one per
/// handler with a transactional handler. A transactional worker on a
/// smaller pool is refused (unless `allow_small`: then it warns): its
/// handlers and its own tasks would wait on each other for connections. A
/// plain worker's tasks give their connections back before waiting, so a
/// smaller pool only slows it: that warns.
fn check_pool(
    source: &Source,
    c: &Config,
    transactional: bool,
    allow_small: bool,
) -> Result<(), Error> {
    let Some(size) = source.max_size() else {
        return Ok(());
    };
    let own = c.claimers + c.ack_flushers + 1;
    let needed = own + if transactional { c.concurrency } else { 0 };
    if size >= needed {
        return Ok(());
    }
    if transactional && !allow_small {
        return Err(Error::PoolTooSmall {
            size,
            needed,
            concurrency: c.concurrency,
            own,
        });
    }
    tracing::warn!(
        pool = size,
        needed,
        queue = %c.queue,
        "the connection pool is smaller than the worker's connections at once; it will wait for connections"
    );
    Ok(())
}
