//! Looks at the catalogs about a queue's table, and the transaction-local
//! timeouts for DDL on it: what a consumer's start-up checks ask before it
//! relies on the table (its columns), and what a DDL step on the table
//! (enabling the insert trigger, say) needs to wait only briefly for its
//! lock and to name who holds it when it cannot get it.
//!
//! The table is passed as a parameter, its quoted name from a validated
//! [`QueueName`] ([`QueueName::quoted_table`]), to
//! `pg_catalog.to_regclass`: a missing table is no error, it has no
//! columns and no lock holders.

use std::time::Duration;

use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::rows::col;
use crate::conn::statements::Stmt;
use crate::pgmq::queue_name::QueueName;
use crate::Pgmq;

/// A column of a queue's table, as [`Pgmq::queue_table_columns`] lists it.
///
/// ```no_run
/// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
/// for c in client.queue_table_columns(&q).await? {
///     println!("{} {}", c.name, c.type_name);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableColumn {
    /// The column's name.
    pub name: String,
    /// Its type as PostgreSQL writes it (`format_type`): `bigint`,
    /// `timestamp with time zone`, `jsonb`.
    pub type_name: String,
}

/// A session holding a lock on a queue's table, as
/// [`Pgmq::queue_table_lock_holders`] lists it: who it is and since when
/// its transaction is open, never its query text (which may quote data).
///
/// ```no_run
/// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
/// for h in client.queue_table_lock_holders(&q, 5).await? {
///     println!("pid {} ({}) holds {} for {:?}", h.pid, h.application_name, h.mode, h.transaction_open);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockHolder {
    /// The backend's process id.
    pub pid: i32,
    /// Its `application_name` (empty when unset).
    pub application_name: String,
    /// Its state (`active`, `idle in transaction`, ...; empty when unknown).
    pub state: String,
    /// The lock mode it holds (`RowExclusiveLock`, ...).
    pub mode: String,
    /// How long its transaction has been open.
    pub transaction_open: Duration,
}

/// A duration as a `lock_timeout` or `statement_timeout` setting.
fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

impl<E: Executor> Pgmq<E> {
    /// The columns of `queue`'s table with their types, in no particular
    /// order; none when the table does not exist.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// let cols = client.queue_table_columns(&q).await?;
    /// let has_headers = cols.iter().any(|c| c.name == "headers" && c.type_name == "jsonb");
    /// # Ok(()) }
    /// ```
    pub async fn queue_table_columns(&self, queue: &QueueName) -> Result<Vec<TableColumn>, Error> {
        let table = queue.quoted_table();
        let rows = self.run(Stmt::QueueTableColumns, None, &[&table]).await?;
        rows.iter()
            .map(|r| {
                Ok(TableColumn {
                    name: col(r, 0)?,
                    type_name: col(r, 1)?,
                })
            })
            .collect()
    }

    /// Up to `max` other sessions holding a granted lock on `queue`'s
    /// table, the longest-open transaction first: for telling an operator
    /// who keeps a DDL step on the table waiting.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// let holders = client.queue_table_lock_holders(&q, 5).await?;
    /// # Ok(()) }
    /// ```
    pub async fn queue_table_lock_holders(
        &self,
        queue: &QueueName,
        max: usize,
    ) -> Result<Vec<LockHolder>, Error> {
        let table = queue.quoted_table();
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        let rows = self
            .run(Stmt::QueueTableLockHolders, None, &[&table, &max])
            .await?;
        rows.iter()
            .map(|r| {
                let open: f64 = col(r, 4)?;
                Ok(LockHolder {
                    pid: col(r, 0)?,
                    application_name: col(r, 1)?,
                    state: col(r, 2)?,
                    mode: col(r, 3)?,
                    transaction_open: Duration::try_from_secs_f64(open).unwrap_or_default(),
                })
            })
            .collect()
    }

    /// Sets `lock_timeout` and `statement_timeout` for the rest of the
    /// current transaction (`set_config(..., true)`, as `SET LOCAL`), to
    /// the millisecond: a DDL step that follows then gives up waiting for
    /// its lock after `lock_timeout` (SQLSTATE 55P03) instead of making
    /// every reader and writer of the table queue up behind it. Run it on a
    /// [`Transaction`](crate::Transaction); on an autocommit executor the
    /// settings end with the call.
    ///
    /// ```no_run
    /// # async fn f(conn: &mut pgmq_client::Connection, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// use std::time::Duration;
    /// let tx = conn.transaction().await?;
    /// let pg = pgmq_client::Pgmq::on(&tx);
    /// pg.set_local_timeouts(Duration::from_millis(500), Duration::from_secs(5)).await?;
    /// pg.enable_notify_insert(&q, Duration::from_millis(250)).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn set_local_timeouts(
        &self,
        lock_timeout: Duration,
        statement_timeout: Duration,
    ) -> Result<(), Error> {
        let (lock, statement) = (ms(lock_timeout), ms(statement_timeout));
        self.run(Stmt::SetLocalTimeouts, None, &[&lock, &statement])
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_set_in_milliseconds() {
        assert_eq!(ms(Duration::from_millis(500)), "500ms");
        assert_eq!(ms(Duration::from_secs(5)), "5000ms");
    }
}
