//! Vacuuming a queue table on demand: how many dead row versions its
//! table holds now, and a `VACUUM` of it that never waits.
//!
//! Every message leaves two dead row versions in its queue table (the
//! claim's update, then the delete or archive). Autovacuum clears them on
//! its visits, at most one per `autovacuum_naptime` per database (see
//! [`QUEUE_TABLE_AUTOVACUUM`](crate::QUEUE_TABLE_AUTOVACUUM) for the
//! settings the SDK gives a queue table), so a fast queue piles up about
//! one naptime's churn between two visits, and every claim walks past it.
//! A caller that owns the table can vacuum it as often as the churn asks
//! instead, with the server's settings left as they are: pgmq-worker's
//! `WorkerBuilder::vacuum` does it when the dead rows pass a threshold.
//!
//! `VACUUM` runs here with `SKIP_LOCKED` (a table another vacuum holds is
//! skipped, not waited for, so several workers of one queue never queue up
//! behind each other or autovacuum) and `TRUNCATE false` (the tail of the
//! table is left to autovacuum: truncating it takes a lock that the
//! queue's readers and writers would wait for). Only the table's owner (a
//! member of the owning role, or a superuser) may vacuum it: the call looks
//! first and refuses with [`Error::NotTableOwner`], where `VACUUM` itself
//! would only warn and do nothing.

use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::rows::col;
use crate::conn::statements::Stmt;
use crate::pgmq::queue_name::QueueName;
use crate::Pgmq;

/// The row versions the server's statistics count in a queue's table, as
/// [`Pgmq::queue_table_rows`] reads them. The counts lag the table by up
/// to about a second (each backend reports its counts at most once a
/// second) and are estimates, good for deciding when to vacuum.
///
/// ```no_run
/// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
/// let rows = client.queue_table_rows(&q).await?;
/// println!("{q}: {} live, {} dead", rows.live, rows.dead);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct TableRows {
    /// Dead row versions not yet vacuumed.
    pub dead: i64,
    /// Live rows.
    pub live: i64,
}

/// `VACUUM (SKIP_LOCKED, TRUNCATE false) <table>`.
fn vacuum_sql(queue: &QueueName) -> String {
    format!(
        "VACUUM (SKIP_LOCKED, TRUNCATE false) {}",
        queue.quoted_table()
    )
}

impl<E: Executor> Pgmq<E> {
    /// The live and dead row versions of `queue`'s table (summed over its
    /// partitions for a partitioned queue), from the server's statistics.
    /// [`Error::QueueNotFound`] when the table does not exist.
    pub async fn queue_table_rows(&self, queue: &QueueName) -> Result<TableRows, Error> {
        let table = queue.quoted_table();
        let rows = self.run(Stmt::QueueTableDeadRows, None, &[&table]).await?;
        let row = rows.first().ok_or_else(|| Error::QueueNotFound {
            queue: queue.as_str().to_owned(),
        })?;
        match (col::<Option<i64>>(row, 0)?, col::<Option<i64>>(row, 1)?) {
            (Some(dead), Some(live)) => Ok(TableRows { dead, live }),
            _ => Err(Error::QueueNotFound {
                queue: queue.as_str().to_owned(),
            }),
        }
    }

    /// Vacuums `queue`'s table (and its partitions) with
    /// `VACUUM (SKIP_LOCKED, TRUNCATE false)`: a table another vacuum holds
    /// (autovacuum, another worker) is skipped at once rather than waited
    /// for, and the table's empty tail is left to autovacuum, because
    /// truncating it takes a lock every read and send of the queue would
    /// wait for. Refused with [`Error::NotTableOwner`] when the connected
    /// role does not own the table (`VACUUM` itself would only warn and do
    /// nothing). `VACUUM` cannot run in a transaction: call it on a
    /// [`Client`](crate::Client) or a connection, not a
    /// [`Transaction`](crate::Transaction).
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// if client.queue_table_rows(&q).await?.dead > 10_000 {
    ///     client.vacuum_queue(&q).await?;
    /// }
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.vacuum_queue", skip_all, fields(queue = %queue))]
    pub async fn vacuum_queue(&self, queue: &QueueName) -> Result<(), Error> {
        self.queue_table_autovacuum(queue).await?.owned()?;
        self.run_text(&vacuum_sql(queue), queue.as_str(), &[])
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vacuum_names_the_quoted_table_and_never_waits() {
        let q = QueueName::new("Orders").unwrap();
        assert_eq!(
            vacuum_sql(&q),
            "VACUUM (SKIP_LOCKED, TRUNCATE false) pgmq.\"q_orders\""
        );
    }
}
