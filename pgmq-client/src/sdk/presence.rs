//! Worker presence: a row per worker in `pgmq_sdk.workers`, written by the
//! worker every interval (pgmq-worker's `WorkerBuilder::presence`) and read
//! by the operator console's fleet page. Where it runs (host, pid), what it
//! serves (queue, concurrency), its counts and rates, whether it is paused
//! or under a fleet limit, and when the server last saw it. A worker that
//! stopped cleanly says when; one that stopped reporting is told by its
//! `seen_at` growing old.
//!
//! Writing needs UPDATE on the queue's table (what consuming needs
//! anyway); reading needs SELECT on it (row-level security).

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;

use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::rows::col;
use crate::pgmq::queue_name::QueueName;
use crate::Pgmq;

const FEATURE: &str = "worker presence";

/// Rows of workers not seen for this long are deleted by the next report
/// of a worker of the same queue.
pub const PRESENCE_KEPT_SECS: i64 = 86_400;

/// A worker's presence record, as it reports it ([`Pgmq::report_presence`])
/// and as [`Pgmq::fleet`] lists it.
///
/// ```
/// let p = pgmq_client::WorkerPresence::new("host-1:42:orders", "orders", "host-1", 42);
/// assert_eq!(p.concurrency, 1);
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct WorkerPresence {
    /// Unique per worker: the host, the pid, the queue and a number.
    pub worker_id: String,
    /// The queue it consumes.
    pub queue_name: String,
    /// The host it runs on.
    pub host: String,
    /// Its process id.
    pub pid: i32,
    /// Handlers at most at once.
    pub concurrency: i32,
    /// Messages claimed since it started.
    pub claimed: i64,
    /// Acknowledgements written since it started (deleted, archived,
    /// dead-lettered).
    pub acked: i64,
    /// Handler runs that failed since it started.
    pub failed: i64,
    /// Claims per second over the last interval.
    pub claims_per_sec: f64,
    /// Acknowledgements per second over the last interval.
    pub acks_per_sec: f64,
    /// Claims paused (the queue's pause flag).
    pub paused: bool,
    /// Claims under a fleet-wide limit.
    pub limited: bool,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// When the server last saw it (set by the server; ignored on report).
    pub seen_at: Option<DateTime<Utc>>,
    /// Seconds since then, on the server's clock (ignored on report).
    pub seen_secs_ago: Option<f64>,
    /// When it stopped cleanly (set when it reports with `stopping`).
    pub stopped_at: Option<DateTime<Utc>>,
}

impl WorkerPresence {
    /// A record with zero counts, concurrency 1, not paused or limited,
    /// started now.
    pub fn new(worker_id: &str, queue_name: &str, host: &str, pid: i32) -> Self {
        WorkerPresence {
            worker_id: worker_id.to_owned(),
            queue_name: queue_name.to_owned(),
            host: host.to_owned(),
            pid,
            concurrency: 1,
            claimed: 0,
            acked: 0,
            failed: 0,
            claims_per_sec: 0.0,
            acks_per_sec: 0.0,
            paused: false,
            limited: false,
            started_at: Utc::now(),
            seen_at: None,
            seen_secs_ago: None,
            stopped_at: None,
        }
    }
}

/// The upsert of a report; `$14` true marks the worker stopped. The same
/// statement deletes rows of the queue not seen for `$15` seconds.
const REPORT: &str = "WITH gone AS (DELETE FROM pgmq_sdk.workers \
     WHERE queue_relid = pgmq_sdk.queue_table($2) \
       AND seen_at < pg_catalog.clock_timestamp() - pg_catalog.make_interval(secs => $15) \
       AND worker_id <> $1) \
     INSERT INTO pgmq_sdk.workers (worker_id, queue_relid, queue_name, host, pid, concurrency, \
       claimed, acked, failed, claims_per_sec, acks_per_sec, paused, limited, started_at, \
       seen_at, stopped_at) \
     VALUES ($1, pgmq_sdk.queue_table($2), pg_catalog.lower($2), $3, $4, $5, $6, $7, $8, $9, \
       $10, $11, $12, $13, pg_catalog.clock_timestamp(), \
       CASE WHEN $14 THEN pg_catalog.clock_timestamp() END) \
     ON CONFLICT (queue_relid, worker_id) DO UPDATE SET concurrency = EXCLUDED.concurrency, \
       claimed = EXCLUDED.claimed, acked = EXCLUDED.acked, failed = EXCLUDED.failed, \
       claims_per_sec = EXCLUDED.claims_per_sec, acks_per_sec = EXCLUDED.acks_per_sec, \
       paused = EXCLUDED.paused, limited = EXCLUDED.limited, seen_at = EXCLUDED.seen_at, \
       stopped_at = EXCLUDED.stopped_at";

/// The most recently seen `$1` workers the caller may read about.
const FLEET: &str = "SELECT worker_id, queue_name, host, pid, concurrency, claimed, acked, \
     failed, claims_per_sec, acks_per_sec, paused, limited, started_at, seen_at, \
     extract(epoch FROM pg_catalog.clock_timestamp() - seen_at)::float8, stopped_at \
     FROM pgmq_sdk.workers ORDER BY seen_at DESC, worker_id LIMIT $1";

impl<E: Executor> Pgmq<E> {
    /// Writes `p` as its worker's presence record, seen now (`stopping`:
    /// and stopped now). [`Error::SdkSchemaMissing`] without the
    /// `pgmq_sdk` schema (version 4 or later), [`Error::QueueNotFound`]
    /// for a queue that does not exist.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let p = pgmq_client::WorkerPresence::new("web-1:4242:orders:0", "orders", "web-1", 4242);
    /// client.report_presence(&p, false).await?;
    /// # Ok(()) }
    /// ```
    pub async fn report_presence(&self, p: &WorkerPresence, stopping: bool) -> Result<(), Error> {
        let kept = PRESENCE_KEPT_SECS as f64;
        let q = p.queue_name.as_str();
        QueueName::new(q)?;
        self.executor()
            .query_text(
                REPORT,
                &[
                    (&p.worker_id, Type::TEXT),
                    (&q, Type::TEXT),
                    (&p.host, Type::TEXT),
                    (&p.pid, Type::INT4),
                    (&p.concurrency, Type::INT4),
                    (&p.claimed, Type::INT8),
                    (&p.acked, Type::INT8),
                    (&p.failed, Type::INT8),
                    (&p.claims_per_sec, Type::FLOAT8),
                    (&p.acks_per_sec, Type::FLOAT8),
                    (&p.paused, Type::BOOL),
                    (&p.limited, Type::BOOL),
                    (&p.started_at, Type::TIMESTAMPTZ),
                    (&stopping, Type::BOOL),
                    (&kept, Type::FLOAT8),
                ],
            )
            .await
            .map_err(|e| e.in_queue(q).in_sdk(FEATURE))?;
        Ok(())
    }

    /// The `limit` most recently seen workers whose queues the caller may
    /// read, the latest first.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// for w in client.fleet(100).await? {
    ///     println!("{} on {}: {:?} s ago", w.queue_name, w.host, w.seen_secs_ago);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn fleet(&self, limit: usize) -> Result<Vec<WorkerPresence>, Error> {
        let n = limit as i64;
        let rows = self
            .executor()
            .query_text(FLEET, &[(&n, Type::INT8)])
            .await
            .map_err(|e| e.in_sdk(FEATURE))?;
        rows.iter()
            .map(|r| {
                Ok(WorkerPresence {
                    worker_id: col(r, 0)?,
                    queue_name: col(r, 1)?,
                    host: col(r, 2)?,
                    pid: col(r, 3)?,
                    concurrency: col(r, 4)?,
                    claimed: col(r, 5)?,
                    acked: col(r, 6)?,
                    failed: col(r, 7)?,
                    claims_per_sec: col(r, 8)?,
                    acks_per_sec: col(r, 9)?,
                    paused: col(r, 10)?,
                    limited: col(r, 11)?,
                    started_at: col(r, 12)?,
                    seen_at: col(r, 13)?,
                    seen_secs_ago: col(r, 14)?,
                    stopped_at: col(r, 15)?,
                })
            })
            .collect()
    }
}
