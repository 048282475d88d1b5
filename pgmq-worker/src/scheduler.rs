//! The scheduler: fires the due schedules of periodic sends
//! ([`pgmq_client::Schedule`]), a pass every `poll_interval` or sooner.
//!
//! Any number of schedulers run at once, in workers
//! ([`WorkerBuilder::scheduler`](crate::WorkerBuilder::scheduler)) or on
//! their own ([`Scheduler::run`]); none is elected. Each pass reads the
//! due schedules and the database's clock and fires each schedule in one
//! fenced statement ([`Pgmq::fire`](pgmq_client::Pgmq::fire)): exactly one
//! scheduler of the fleet sends a tick, a scheduler that crashes or is cut
//! off before its statement commits sends nothing, and one that stalls
//! and wakes up late finds the schedule moved on and sends nothing. A
//! tick is sent at most about one `poll_interval` after it is due while
//! any scheduler runs (a pass starts sooner when the earliest next tick
//! comes before the interval ends); ticks missed while none ran are sent
//! under each schedule's catch-up bound when one runs again.
//!
//! A failed pass (the database away, a timeout, the `pgmq_sdk` schema not
//! installed) is logged (a warning for the first of a run of failures) and
//! the next pass tries again; nothing is lost, since a tick is only moved
//! past in the statement that sends it.

use std::time::Duration;

use pgmq_client::{FiringPass, Pgmq};
use tokio_util::sync::CancellationToken;

use crate::db::{ConnectionSource, Source};

/// What a [`Scheduler`] reads.
///
/// ```
/// use std::time::Duration;
/// let cfg = pgmq_worker::SchedulerConfig::default()
///     .poll_interval(Duration::from_millis(500))
///     .max_per_pass(50);
/// assert_eq!(cfg.db_timeout_value(), Duration::from_secs(5));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchedulerConfig {
    poll_interval: Duration,
    max_per_pass: usize,
    db_timeout: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            poll_interval: Duration::from_secs(1),
            max_per_pass: 100,
            db_timeout: Duration::from_secs(5),
        }
    }
}

impl SchedulerConfig {
    /// The longest wait between two passes. Default 1 s; a pass starts
    /// sooner when the earliest next tick comes first.
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d.max(Duration::from_millis(1));
        self
    }

    /// The most schedules one pass fires; a pass that found that many
    /// starts the next at once. Default 100.
    pub fn max_per_pass(mut self, n: usize) -> Self {
        self.max_per_pass = n.max(1);
        self
    }

    /// The bound on each step of a pass: the checkout, the firing of the
    /// due schedules (read and fired on one connection), the read of the
    /// next due time. Past it the statement in flight is cancelled on the
    /// server and what it would have sent is not sent (firings done before
    /// it stay done). Default 5 s.
    pub fn db_timeout(mut self, d: Duration) -> Self {
        self.db_timeout = d.max(Duration::from_millis(1));
        self
    }

    /// The bound on each step of a pass ([`SchedulerConfig::db_timeout`]).
    pub fn db_timeout_value(&self) -> Duration {
        self.db_timeout
    }
}

/// Fires the due schedules of periodic sends, as one of any number of
/// schedulers: each tick is sent once for the whole fleet, by whichever
/// scheduler's firing commits first ([`Pgmq::fire_due_schedules`](pgmq_client::Pgmq::fire_due_schedules)).
///
/// ```no_run
/// # async fn f(client: pgmq_client::Client) {
/// use pgmq_worker::{Scheduler, SchedulerConfig};
/// let stop = tokio_util::sync::CancellationToken::new();
/// let task = tokio::spawn(Scheduler::new(client, SchedulerConfig::default()).run(stop.clone()));
/// // ... at shutdown:
/// stop.cancel();
/// task.await.unwrap();
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Scheduler {
    source: SourceDebug,
    config: SchedulerConfig,
}

/// The connection source, shown by kind only.
#[derive(Clone)]
struct SourceDebug(Source);

impl std::fmt::Debug for SourceDebug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnectionSource")
    }
}

impl Scheduler {
    /// A scheduler on `source` (a [`pgmq_client::Client`], or any
    /// [`ConnectionSource`]); it uses one connection at a time.
    pub fn new(source: impl Into<ConnectionSource>, config: SchedulerConfig) -> Self {
        Scheduler {
            source: SourceDebug(source.into().inner),
            config,
        }
    }

    pub(crate) fn of(source: Source, config: SchedulerConfig) -> Self {
        Scheduler {
            source: SourceDebug(source),
            config,
        }
    }

    /// One pass: fires up to `max_per_pass` due schedules, each step
    /// bounded by `db_timeout`; returns what it did and how long the next
    /// pass may wait.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let s = pgmq_worker::Scheduler::new(client, Default::default());
    /// let (pass, _wait) = s.pass().await?;
    /// println!("{} ticks sent", pass.sent.len());
    /// # Ok(()) }
    /// ```
    pub async fn pass(&self) -> Result<(FiringPass, Duration), pgmq_client::Error> {
        let limit = self.config.db_timeout;
        let conn = self.source.0.checkout(limit).await?;
        let pg = Pgmq::on(&conn);
        let pass = conn
            .bounded(limit, pg.fire_due_schedules(self.config.max_per_pass))
            .await?;
        let poll = self.config.poll_interval;
        let wait = if pass.full {
            Duration::ZERO
        } else {
            let next = conn
                .bounded(limit, pg.next_schedule_due())
                .await?
                .map_or(poll, |d| d.min(poll));
            // A schedule that stays due without being fired (one whose
            // firing fails, or that another scheduler holds) must not make
            // the passes spin.
            if pass.sent.is_empty() {
                next.max(poll / 10)
            } else {
                next
            }
        };
        Ok((pass, wait))
    }

    /// Runs passes until `stop` is cancelled (a pass in flight is
    /// abandoned: its statement either committed, or is rolled back and
    /// sends nothing).
    pub async fn run(self, stop: CancellationToken) {
        // A run of failed passes (the database away, the pgmq_sdk schema
        // not installed) is logged once as a warning, then at debug level.
        let mut failing = false;
        loop {
            let wait = tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                res = self.pass() => match res {
                    Ok((pass, wait)) => {
                        if std::mem::take(&mut failing) {
                            tracing::info!("scheduler passes succeed again");
                        }
                        for (name, e) in &pass.failed {
                            tracing::warn!(schedule = %name, error = %e, "a schedule's firing failed");
                        }
                        if !pass.sent.is_empty() {
                            tracing::debug!(ticks = pass.sent.len(), "scheduled messages sent");
                        }
                        wait
                    }
                    Err(e) => {
                        if std::mem::replace(&mut failing, true) {
                            tracing::debug!(error = %e, "a scheduler pass failed; trying again");
                        } else {
                            tracing::warn!(error = %e, "a scheduler pass failed; trying again every poll interval");
                        }
                        self.config.poll_interval
                    }
                },
            };
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}
