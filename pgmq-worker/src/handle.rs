//! The handles on a worker that runs: [`WorkerHandle`] (statistics,
//! health, shutdown of a spawned worker) and [`Monitor`] (statistics and
//! health, from anywhere).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::error::Error;
use crate::health::{Health, HealthState};
use crate::shutdown::{ShutdownHandle, ShutdownReport};
use crate::stats::{Stats, StatsSnapshot};

/// A worker running in the background (from [`Worker::spawn`](crate::Worker::spawn)).
///
/// Dropping the handle does not stop the worker (like dropping a tokio
/// `JoinHandle`): call [`shutdown`](WorkerHandle::shutdown).
#[derive(Debug)]
pub struct WorkerHandle {
    pub(crate) stop: ShutdownHandle,
    pub(crate) join: JoinHandle<Result<ShutdownReport, Error>>,
    pub(crate) monitor: Monitor,
}

/// Statistics and health of a worker, readable from anywhere while it runs
/// (from [`Worker::monitor`](crate::Worker::monitor)); cheap to clone.
#[derive(Debug, Clone)]
pub struct Monitor {
    pub(crate) stats: Arc<Stats>,
    pub(crate) health: Arc<HealthState>,
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
