//! A queue table's autovacuum settings: the storage parameters the SDK
//! gives every queue table it creates, and applies to an existing one on
//! request, so that autovacuum clears a busy queue's dead row versions on
//! every visit to the database, with the server's settings left as they are.
//!
//! Each message leaves dead row versions in its queue table (the claim's
//! update, then the delete or archive). PostgreSQL's defaults vacuum a
//! table once `50 + 0.2 x its live rows` are dead, throttled by
//! `autovacuum_vacuum_cost_delay`: a queue with a backlog waits for a fifth
//! of it to be dead, and a throttled vacuum of a fast queue falls behind
//! its churn. With a threshold on the dead-row count alone and no
//! throttling, each autovacuum visit (one per `autovacuum_naptime` per
//! database) vacuums the table at once and finishes quickly, so the dead
//! rows never exceed about one naptime's churn. Only the table's owner (a
//! member of the owning role, or a superuser) may change its storage
//! parameters: the calls here look first and say so.

use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::rows::col;
use crate::conn::statements::Stmt;
use crate::pgmq::queue_name::QueueName;
use crate::Pgmq;

/// The storage parameters the SDK sets on a queue table, name and value:
/// vacuum on the dead-row count alone (no share of the live rows), at
/// 1,000 dead rows, unthrottled (a healthy queue table is small, and a
/// throttled vacuum of a busy one falls behind).
pub const QUEUE_TABLE_AUTOVACUUM: &[(&str, &str)] = &[
    ("autovacuum_vacuum_scale_factor", "0"),
    ("autovacuum_vacuum_threshold", "1000"),
    ("autovacuum_vacuum_cost_delay", "0"),
];

/// A queue table's owner and autovacuum settings, as
/// [`Pgmq::queue_table_autovacuum`] reads them.
///
/// ```no_run
/// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
/// let t = client.queue_table_autovacuum(&q).await?;
/// if !t.caller_owns {
///     println!("ask {} to run `pgmq autovacuum {q}`", t.owner);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct TableAutovacuum {
    /// The queue table, `pgmq.q_<name>`.
    pub table: String,
    /// The role that owns it.
    pub owner: String,
    /// Whether the connected role may change its storage parameters: it
    /// is the owner, a member of the owning role, or a superuser.
    pub caller_owns: bool,
    /// A partitioned queue's parent table, which holds no rows: its
    /// partitions are what autovacuum visits.
    pub partitioned: bool,
    /// Its `autovacuum_*` storage parameters, `name=value`, as the
    /// catalog lists them (empty: the server's settings apply).
    pub settings: Vec<String>,
}

impl TableAutovacuum {
    /// The table, when the connected role may change it (vacuum it, set
    /// its parameters); [`Error::NotTableOwner`] otherwise.
    pub(crate) fn owned(self) -> Result<TableAutovacuum, Error> {
        if self.caller_owns {
            Ok(self)
        } else {
            Err(Error::NotTableOwner {
                table: self.table,
                owner: self.owner,
            })
        }
    }
}

/// `ALTER TABLE <table> SET (<QUEUE_TABLE_AUTOVACUUM>)`.
fn alter_sql(queue: &QueueName) -> String {
    let settings: Vec<String> = QUEUE_TABLE_AUTOVACUUM
        .iter()
        .map(|(name, value)| format!("{name} = {value}"))
        .collect();
    format!(
        "ALTER TABLE {} SET ({})",
        queue.quoted_table(),
        settings.join(", ")
    )
}

impl<E: Executor> Pgmq<E> {
    /// `queue`'s table: its owner, whether the connected role may change
    /// it, and its `autovacuum_*` storage parameters.
    /// [`Error::QueueNotFound`] when the table does not exist.
    pub async fn queue_table_autovacuum(
        &self,
        queue: &QueueName,
    ) -> Result<TableAutovacuum, Error> {
        let table = queue.quoted_table();
        let rows = self
            .run(Stmt::QueueTableAutovacuum, None, &[&table])
            .await?;
        let row = rows.first().ok_or_else(|| Error::QueueNotFound {
            queue: queue.as_str().to_owned(),
        })?;
        Ok(TableAutovacuum {
            table: queue.table(),
            owner: col(row, 0)?,
            caller_owns: col(row, 1)?,
            partitioned: col(row, 2)?,
            settings: col::<Vec<String>>(row, 3)?
                .into_iter()
                .filter(|o| o.starts_with("autovacuum_"))
                .collect(),
        })
    }

    /// Sets [`QUEUE_TABLE_AUTOVACUUM`] on `queue`'s table (replacing those
    /// three parameters where they were set; others stay) and returns the
    /// table as it is now. [`Pgmq::create`] and [`Pgmq::create_unlogged`]
    /// do it for the tables they create; this is for queues created
    /// before, or by another client.
    ///
    /// Refused with [`Error::NotTableOwner`] when the connected role may
    /// not change the table (only its owner, a member of the owning role
    /// or a superuser may), and with [`Error::InvalidArgument`] for a
    /// partitioned queue (its parent table holds no rows; set the
    /// parameters on pg_partman's template table so that new partitions
    /// get them). `ALTER TABLE ... SET` for these parameters takes a lock
    /// that lets reads and writes go on but waits for a running vacuum of
    /// the table; to bound that wait, run it on a
    /// [`Transaction`](crate::Transaction) after
    /// [`Pgmq::set_local_timeouts`].
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// let t = client.tune_autovacuum(&q).await?;
    /// println!("{}: {}", t.table, t.settings.join(", "));
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.tune_autovacuum", skip_all, fields(queue = %queue))]
    pub async fn tune_autovacuum(&self, queue: &QueueName) -> Result<TableAutovacuum, Error> {
        let t = self.queue_table_autovacuum(queue).await?;
        if t.partitioned {
            return Err(Error::InvalidArgument(format!(
                "queue {queue} is partitioned: set the autovacuum parameters on pg_partman's \
                 template table for {}, so that its partitions get them",
                t.table
            )));
        }
        t.owned()?;
        self.run_text(&alter_sql(queue), queue.as_str(), &[])
            .await?;
        self.queue_table_autovacuum(queue).await
    }

    /// After a create: sets [`QUEUE_TABLE_AUTOVACUUM`] on `queue`'s table
    /// when the connected role may and the table has no `autovacuum_*`
    /// parameters yet, so that creating a queue that exists never undoes
    /// an operator's own settings, and a role that does not own the table
    /// still creates (a no-op) without an error.
    pub(crate) async fn tune_new_queue(&self, queue: &QueueName) -> Result<(), Error> {
        let t = self.queue_table_autovacuum(queue).await?;
        if t.partitioned || !t.settings.is_empty() {
            return Ok(());
        }
        if !t.caller_owns {
            tracing::debug!(
                table = %t.table,
                owner = %t.owner,
                "not the queue table's owner: its autovacuum settings are left as they are"
            );
            return Ok(());
        }
        self.run_text(&alter_sql(queue), queue.as_str(), &[])
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alter_names_the_quoted_table_and_every_parameter() {
        let q = QueueName::new("Orders").unwrap();
        assert_eq!(
            alter_sql(&q),
            "ALTER TABLE pgmq.\"q_orders\" SET (autovacuum_vacuum_scale_factor = 0, \
             autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0)"
        );
    }
}
