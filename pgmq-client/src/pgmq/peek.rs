//! Looks that change nothing, and archive retention: statements on a
//! queue's own tables for which PGMQ has no function.
//!
//! `pgmq.read` hides every message it returns and counts the read in its
//! `read_ct`: a look at a queue through it delays the messages and brings a
//! worker's retry limit closer. [`peek_raw`](crate::Pgmq::peek_raw) and
//! [`peek_archive_raw`](crate::Pgmq::peek_archive_raw) are plain SELECTs of
//! the queue table and the archive table, by `msg_id`, bounded: nothing
//! they return is locked, hidden or counted.
//!
//! Archives keep every archived message until someone deletes them;
//! [`prune_archive_batch`](crate::Pgmq::prune_archive_batch) deletes the
//! oldest archived rows, a bounded batch per call, so that a large prune
//! is many short transactions rather than one long one holding locks and
//! keeping vacuum from the table.
//!
//! The statements name the tables (`pgmq."q_<name>"`, `pgmq."a_<name>"`)
//! from a validated [`QueueName`], as quoted identifiers.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;

use crate::conn::args::{check_batch, qty, secs};
use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::rows::{col, first_col};
use crate::pgmq::message::{raw_from_row, Message, RawJson};
use crate::pgmq::queue_name::QueueName;
use crate::Pgmq;

/// A row of a queue's archive table: the message as it was when archived,
/// and when that was.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ArchivedMessage {
    /// The message (its `vt` and `read_ct` as they were when archived).
    pub message: Message<RawJson>,
    /// When it was archived, on the database clock.
    pub archived_at: DateTime<Utc>,
}

/// The first `$1` rows of `table` by `msg_id`, with `extra` columns after
/// those of `pgmq.message_record`.
fn peek_sql(table: &str, extra: &str) -> String {
    format!(
        "SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers{extra} \
         FROM {table} ORDER BY msg_id LIMIT $1"
    )
}

/// Deletes at most `$2` rows of `archive` archived more than `$1` seconds
/// ago, oldest first (by the `archived_at` index PGMQ creates), and counts
/// them.
fn prune_sql(archive: &str) -> String {
    format!(
        "WITH pruned AS (DELETE FROM {archive} WHERE msg_id = ANY(ARRAY(\
         SELECT msg_id FROM {archive} \
         WHERE archived_at < pg_catalog.clock_timestamp() - pg_catalog.make_interval(secs => $1) \
         ORDER BY archived_at LIMIT $2)) RETURNING 1) \
         SELECT pg_catalog.count(*) FROM pruned"
    )
}

impl<E: Executor> Pgmq<E> {
    /// The first `qty` messages of `queue` by `msg_id`, visible or not, as
    /// they are: a plain SELECT of the queue table that changes neither
    /// their `vt` nor their `read_ct` and locks nothing (unlike
    /// [`read`](Self::read), which hides and counts what it returns).
    /// Bodies are left undecoded. A queue that does not exist is
    /// [`Error::QueueNotFound`]; `qty` above [`MAX_BATCH`](crate::MAX_BATCH)
    /// is [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// for m in client.peek_raw(&q, 10).await? {
    ///     println!("{} read {} times: {}", m.msg_id, m.read_ct, m.body.get());
    /// }
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.peek", skip_all, fields(queue = %queue, qty))]
    pub async fn peek_raw(
        &self,
        queue: &QueueName,
        qty: usize,
    ) -> Result<Vec<Message<RawJson>>, Error> {
        let rows = self
            .peek_rows(queue, &queue.quoted_table(), "", qty)
            .await?;
        rows.iter().map(raw_from_row).collect()
    }

    /// The first `qty` rows of `queue`'s archive by `msg_id`, with when each
    /// was archived: a plain SELECT of the archive table. A queue that does
    /// not exist is [`Error::QueueNotFound`].
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// for a in client.peek_archive_raw(&q, 10).await? {
    ///     println!("{} archived at {}", a.message.msg_id, a.archived_at);
    /// }
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.peek_archive", skip_all, fields(queue = %queue, qty))]
    pub async fn peek_archive_raw(
        &self,
        queue: &QueueName,
        qty: usize,
    ) -> Result<Vec<ArchivedMessage>, Error> {
        let rows = self
            .peek_rows(queue, &queue.quoted_archive_table(), ", archived_at", qty)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(ArchivedMessage {
                    message: raw_from_row(r)?,
                    archived_at: col(r, 7)?,
                })
            })
            .collect()
    }

    /// The first `qty` rows of `table` (one of `queue`'s), by [`peek_sql`].
    async fn peek_rows(
        &self,
        queue: &QueueName,
        table: &str,
        extra: &str,
        qty: usize,
    ) -> Result<Vec<tokio_postgres::Row>, Error> {
        let n = i64::from(self::qty(qty)?);
        self.run_text(&peek_sql(table, extra), queue.as_str(), &[(&n, Type::INT8)])
            .await
    }

    /// Deletes up to `batch` rows of `queue`'s archive that were archived
    /// more than `older_than` ago (whole seconds, rounded up), oldest
    /// first; returns how many it deleted.
    ///
    /// One call is one statement: on a [`Client`](crate::Client) its own
    /// short transaction. To prune everything that old, call it until it
    /// returns less than `batch`; each batch commits on its own, so an
    /// interrupted prune keeps what it deleted. Inside a caller's
    /// transaction every batch commits with it. `batch` is 1 to
    /// [`MAX_BATCH`](crate::MAX_BATCH); a queue that does not exist is
    /// [`Error::QueueNotFound`].
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use std::time::Duration;
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// let week = Duration::from_secs(7 * 24 * 3600);
    /// let mut pruned = 0;
    /// loop {
    ///     let n = client.prune_archive_batch(&q, week, 1000).await?;
    ///     pruned += n;
    ///     if n < 1000 {
    ///         break;
    ///     }
    /// }
    /// println!("{pruned} archived messages deleted");
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.prune_archive", skip_all, fields(queue = %queue, batch))]
    pub async fn prune_archive_batch(
        &self,
        queue: &QueueName,
        older_than: Duration,
        batch: usize,
    ) -> Result<u64, Error> {
        check_batch(batch, "batch")?;
        if batch == 0 {
            return Err(Error::InvalidArgument("a prune batch of 0 rows".into()));
        }
        let age = f64::from(secs(older_than, "age")?);
        let n = batch as i64;
        let rows = self
            .run_text(
                &prune_sql(&queue.quoted_archive_table()),
                queue.as_str(),
                &[(&age, Type::FLOAT8), (&n, Type::INT8)],
            )
            .await?;
        let pruned: i64 = first_col(&rows, 0, 0)?;
        Ok(pruned.max(0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peeks_are_plain_selects_of_the_quoted_tables() {
        let q = QueueName::new("Jobs.eu").unwrap();
        let sql = peek_sql(&q.quoted_table(), "");
        assert_eq!(
            sql,
            "SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers \
             FROM pgmq.\"q_jobs.eu\" ORDER BY msg_id LIMIT $1"
        );
        let sql = peek_sql(&q.quoted_archive_table(), ", archived_at");
        assert!(sql.contains("headers, archived_at FROM pgmq.\"a_jobs.eu\""));
        for sql in [sql, prune_sql(&q.quoted_archive_table())] {
            assert!(!sql.contains("FOR UPDATE") && !sql.contains("UPDATE "));
        }
    }

    #[test]
    fn a_prune_is_one_bounded_delete_of_the_archive() {
        let q = QueueName::new("jobs").unwrap();
        let sql = prune_sql(&q.quoted_archive_table());
        assert!(sql.starts_with("WITH pruned AS (DELETE FROM pgmq.\"a_jobs\" WHERE"));
        assert!(sql.contains("ORDER BY archived_at LIMIT $2"));
        assert!(sql.ends_with("SELECT pg_catalog.count(*) FROM pruned"));
        assert!(!sql.contains("q_jobs"));
    }
}
