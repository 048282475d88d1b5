//! The worker's vacuum of its queue table: every `check_every` the worker
//! reads how many dead row versions the table holds
//! ([`Pgmq::queue_table_rows`]) and, past `dead_rows`, vacuums it
//! ([`Pgmq::vacuum_queue`], whose docs say how the `VACUUM` runs and why).
//! A queue the worker keeps busy then holds about `dead_rows` dead rows at
//! most, where autovacuum alone lets one naptime's churn pile up, and
//! every claim walks past them.
//!
//! Optional: off unless [`WorkerBuilder::vacuum`](crate::WorkerBuilder::vacuum)
//! sets it. It needs the worker's role to own the queue table; a worker
//! whose role does not logs that once and goes on without it. Several
//! workers of one queue may all run it: a vacuum that finds the table held
//! by another skips it. A failed round is logged and the next one tries
//! again; nothing else of the worker waits for it.

use std::sync::Arc;
use std::time::Duration;

use pgmq_client::{Error as ClientError, Pgmq, QueueName};
use tokio_util::sync::CancellationToken;

use crate::db::{self, Source};
use crate::supervise::Supervisor;

/// When the worker vacuums its queue table: the dead row versions that
/// start a vacuum, and how often it looks.
///
/// ```
/// use std::time::Duration;
/// use pgmq_worker::QueueVacuum;
/// let v = QueueVacuum::default();
/// assert_eq!(v.dead_rows, 10_000);
/// assert_eq!(v.check_every, Duration::from_secs(1));
/// let v = QueueVacuum::at_dead_rows(50_000).check_every(Duration::from_secs(5));
/// assert_eq!((v.dead_rows, v.check_every), (50_000, Duration::from_secs(5)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueVacuum {
    /// The dead row versions (as the server's statistics count them) at
    /// which a look starts a vacuum (default 10,000).
    pub dead_rows: u64,
    /// Time between two looks (default 1 s; at least 100 ms). The
    /// statistics lag the table by about a second, so looking more often
    /// sees the same counts.
    pub check_every: Duration,
    /// How long one vacuum may take before it is cancelled (default 5
    /// minutes; a cancelled vacuum keeps what it cleared).
    pub timeout: Duration,
}

impl Default for QueueVacuum {
    fn default() -> Self {
        QueueVacuum {
            dead_rows: 10_000,
            check_every: Duration::from_secs(1),
            timeout: Duration::from_secs(300),
        }
    }
}

impl QueueVacuum {
    /// Vacuums past `dead_rows` dead row versions, the other settings at
    /// their defaults.
    pub fn at_dead_rows(dead_rows: u64) -> Self {
        QueueVacuum {
            dead_rows,
            ..QueueVacuum::default()
        }
    }

    /// Sets the time between two looks.
    pub fn check_every(mut self, every: Duration) -> Self {
        self.check_every = every;
        self
    }

    /// Sets how long one vacuum may take.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

/// What the vacuum task reads.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub queue: QueueName,
    pub policy: QueueVacuum,
    /// The bound of a look.
    pub db_timeout: Duration,
}

/// The vacuum task: its settings and where its connections come from.
pub(crate) struct Vacuum {
    pub settings: Settings,
    pub source: Source,
}

/// Starts the supervised vacuum task; it runs until `stop`.
pub(crate) fn spawn(part: Vacuum, supervisor: &Supervisor, stop: &CancellationToken) {
    let (part, stop) = (Arc::new(part), stop.clone());
    supervisor.spawn("vacuum", move || run(Arc::clone(&part), stop.clone()));
}

async fn run(part: Arc<Vacuum>, stop: CancellationToken) {
    let cfg = &part.settings;
    let every = cfg.policy.check_every.max(Duration::from_millis(100));
    let mut warned = false;
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        match round(&part).await {
            Ok(_) => warned = false,
            Err(ClientError::NotTableOwner { table, owner }) => {
                tracing::warn!(
                    queue = %cfg.queue,
                    %table,
                    %owner,
                    "the worker's role does not own the queue table: it is not vacuumed by the worker"
                );
                return;
            }
            Err(e) if !warned => {
                warned = true;
                tracing::warn!(queue = %cfg.queue, error = %e, "queue table vacuum failed; trying again at the next look");
            }
            Err(e) => tracing::debug!(error = %e, "queue table vacuum failed"),
        }
    }
}

/// One look, and a vacuum when the dead rows are past the threshold;
/// returns whether it vacuumed.
async fn round(part: &Vacuum) -> Result<bool, ClientError> {
    let cfg = &part.settings;
    let look = db::Kept::new(part.source.clone(), 0, cfg.db_timeout);
    let rows = Pgmq::on(&look).queue_table_rows(&cfg.queue).await?;
    if u64::try_from(rows.dead).unwrap_or(0) < cfg.policy.dead_rows {
        return Ok(false);
    }
    let bound = cfg.policy.timeout.max(cfg.db_timeout);
    let vacuum = db::Kept::new(part.source.clone(), 0, bound);
    Pgmq::on(&vacuum).vacuum_queue(&cfg.queue).await?;
    tracing::debug!(queue = %cfg.queue, dead = rows.dead, "queue table vacuumed");
    Ok(true)
}
