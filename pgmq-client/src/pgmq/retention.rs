//! Archive retention: a queue's archive pruned past an age and/or a count,
//! by one process of the fleet at a time, in bounded batches.
//!
//! Each batch is one statement: it takes the queue's retention lock
//! (`pg_try_advisory_xact_lock` on a key derived from the queue's name,
//! held until the statement's transaction ends), and only when it got the
//! lock deletes at most `batch` archived rows, the lowest msg_ids first.
//! A process that finds the lock taken deletes nothing and says so
//! ([`Pruned::busy`]): another process is pruning that queue. No batch
//! waits for a lock or holds one past its own short transaction, so a
//! prune never blocks archiving, reading or another prune for long.
//!
//! The rows of a batch are locked before they are deleted (`FOR UPDATE
//! SKIP LOCKED`): a row another batch deleted after this statement's
//! snapshot was taken is passed over and the batch takes the next one, so
//! a batch comes back short only when fewer rows were left to prune.
//!
//! A row is deleted only when every limit of the [`ArchiveRetention`]
//! lets it go: with `older_than`, only rows archived longer ago than that
//! on the database clock (`archived_at` against `clock_timestamp()` when
//! the statement runs: the hosts' clocks play no part); with `keep`, never
//! the `keep` rows with the highest msg_ids. Both are floors of what stays.

use std::time::Duration;

use tokio_postgres::types::Type;

use crate::conn::args::{check_batch, secs};
use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::pgmq::queue_name::QueueName;
use crate::Pgmq;

/// What a queue's archive keeps; the rest is pruned.
///
/// ```
/// use std::time::Duration;
/// use pgmq_client::ArchiveRetention;
/// let r = ArchiveRetention::older_than(Duration::from_secs(7 * 86_400)).keep(1000);
/// assert_eq!(r.batch, 1000);
/// assert_eq!(r.keep, Some(1000));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArchiveRetention {
    /// Keep every row archived less than this long ago (whole seconds,
    /// rounded up; None: no age limit).
    pub older_than: Option<Duration>,
    /// Keep the newest this many rows, by msg_id (None: no count limit).
    pub keep: Option<u64>,
    /// Rows deleted per statement, each its own short transaction (default
    /// 1000; 1 to [`MAX_BATCH`](crate::MAX_BATCH)).
    pub batch: usize,
}

impl ArchiveRetention {
    /// Prune rows archived longer ago than `age`.
    pub fn older_than(age: Duration) -> Self {
        ArchiveRetention {
            older_than: Some(age),
            keep: None,
            batch: 1000,
        }
    }

    /// Prune all but the newest `n` rows.
    pub fn keeping(n: u64) -> Self {
        ArchiveRetention {
            older_than: None,
            keep: Some(n),
            batch: 1000,
        }
    }

    /// Also keep the newest `n` rows.
    pub fn keep(mut self, n: u64) -> Self {
        self.keep = Some(n);
        self
    }

    /// Rows deleted per statement.
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n;
        self
    }

    fn check(&self) -> Result<(), Error> {
        check_batch(self.batch, "retention batch")?;
        if self.batch == 0 {
            return Err(Error::InvalidArgument("a retention batch of 0 rows".into()));
        }
        if self.older_than.is_none() && self.keep.is_none() {
            return Err(Error::InvalidArgument(
                "a retention with neither an age nor a count would prune everything".into(),
            ));
        }
        Ok(())
    }
}

/// What a prune did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Pruned {
    /// Rows deleted.
    pub pruned: u64,
    /// Whether it stopped because another process held the queue's
    /// retention lock (that process is pruning the queue).
    pub busy: bool,
}

/// One batch: `$1` the queue (the lock's key), `$2` the age in seconds or
/// null, `$3` the rows kept by count or null, `$4` the batch. Returns
/// whether the lock was taken and how many rows went.
fn retention_sql(archive: &str) -> String {
    format!(
        "\
WITH lock AS MATERIALIZED (
    SELECT pg_catalog.pg_try_advisory_xact_lock(
        pg_catalog.hashtextextended('pgmq archive retention ' || $1::text, 0)) AS got
), kept_from AS (
    SELECT a.msg_id FROM {archive} AS a ORDER BY a.msg_id DESC OFFSET $3::bigint LIMIT 1
), victims AS (
    SELECT a.msg_id FROM {archive} AS a
    WHERE (SELECT got FROM lock)
      AND ($2::float8 IS NULL
           OR a.archived_at < pg_catalog.clock_timestamp() - pg_catalog.make_interval(secs => $2::float8))
      AND ($3::bigint IS NULL OR a.msg_id <= (SELECT msg_id FROM kept_from))
    ORDER BY a.msg_id LIMIT $4
    FOR UPDATE OF a SKIP LOCKED
), pruned AS (
    DELETE FROM {archive} AS a USING victims v WHERE a.msg_id = v.msg_id RETURNING 1
)
SELECT (SELECT got FROM lock), (SELECT pg_catalog.count(*) FROM pruned)"
    )
}

impl<E: Executor> Pgmq<E> {
    /// One batch of `retention` on `queue`'s archive (see the module docs):
    /// deletes up to `retention.batch` rows that every limit lets go, the
    /// lowest msg_ids first, if no other process holds the queue's
    /// retention lock. On a [`Client`](crate::Client) its own short
    /// transaction; inside a caller's transaction the lock is held until
    /// that transaction ends.
    #[tracing::instrument(name = "pgmq.retention_batch", skip_all, fields(queue = %queue, batch = retention.batch))]
    pub async fn retention_batch(
        &self,
        queue: &QueueName,
        retention: &ArchiveRetention,
    ) -> Result<Pruned, Error> {
        retention.check()?;
        let age = retention
            .older_than
            .map(|d| secs(d, "age").map(f64::from))
            .transpose()?;
        let keep = retention.keep.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
        let n = retention.batch as i64;
        let q = queue.as_str();
        let rows = self
            .run_text(
                &retention_sql(&queue.quoted_archive_table()),
                q,
                &[
                    (&q, Type::TEXT),
                    (&age, Type::FLOAT8),
                    (&keep, Type::INT8),
                    (&n, Type::INT8),
                ],
            )
            .await?;
        let Some(row) = rows.first() else {
            return Ok(Pruned::default());
        };
        let got: bool = row.try_get(0).map_err(Error::from_pg)?;
        let pruned: i64 = row.try_get(1).map_err(Error::from_pg)?;
        Ok(Pruned {
            pruned: pruned.max(0) as u64,
            busy: !got,
        })
    }

    /// Applies `retention` to `queue`'s archive: batches
    /// ([`retention_batch`](Self::retention_batch)), each its own short
    /// transaction, until one comes back short or finds another process
    /// pruning the queue. What `pgmq archive prune` and pgmq-worker's
    /// retention task run. When a batch fails, the batches before it stay
    /// deleted.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use std::time::Duration;
    /// use pgmq_client::{ArchiveRetention, QueueName};
    /// let q = QueueName::new("orders")?;
    /// let week = ArchiveRetention::older_than(Duration::from_secs(7 * 86_400)).keep(10_000);
    /// let done = client.apply_retention(&q, &week).await?;
    /// println!("{} archived messages deleted (busy: {})", done.pruned, done.busy);
    /// # Ok(()) }
    /// ```
    pub async fn apply_retention(
        &self,
        queue: &QueueName,
        retention: &ArchiveRetention,
    ) -> Result<Pruned, Error> {
        let mut total = Pruned::default();
        loop {
            let b = self.retention_batch(queue, retention).await?;
            total.pruned += b.pruned;
            total.busy = b.busy;
            if b.busy || b.pruned < retention.batch as u64 {
                return Ok(total);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_one_locked_bounded_delete_of_the_archive() {
        let q = QueueName::new("jobs").unwrap();
        let sql = retention_sql(&q.quoted_archive_table());
        assert!(sql.contains("pg_try_advisory_xact_lock"));
        assert!(sql.contains("DELETE FROM pgmq.\"a_jobs\" AS a USING victims"));
        assert!(sql.contains("ORDER BY a.msg_id LIMIT $4"));
        assert!(sql.contains("a.archived_at < pg_catalog.clock_timestamp()"));
        assert!(!sql.contains("q_jobs"));
    }

    #[test]
    fn a_retention_needs_a_limit_and_a_batch() {
        let none = ArchiveRetention::keeping(1);
        assert!(none.check().is_ok());
        let none = ArchiveRetention {
            keep: None,
            ..ArchiveRetention::keeping(1)
        };
        assert!(none.check().is_err());
        assert!(ArchiveRetention::keeping(1).batch(0).check().is_err());
    }
}
