//! Queues: create (plain, unlogged, partitioned), drop, purge, list, metrics.

use chrono::{DateTime, Utc};
use tokio_postgres::error::SqlState;

use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::rows::{col, first_col};
use crate::conn::statements::Stmt;
use crate::pgmq::queue_name::QueueName;
use crate::Pgmq;

/// A row of `pgmq.list_queues()`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct QueueInfo {
    /// The queue's name.
    pub queue_name: String,
    /// Created with `create_partitioned`.
    pub is_partitioned: bool,
    /// Created with `create_unlogged` (lost on a crash).
    pub is_unlogged: bool,
    /// When it was created.
    pub created_at: DateTime<Utc>,
}

/// A row of `pgmq.metrics()`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct QueueMetrics {
    /// The queue's name.
    pub queue_name: String,
    /// Messages in the queue, visible or not.
    pub queue_length: i64,
    /// Messages visible now.
    pub queue_visible_length: i64,
    /// Age of the newest message, seconds (None when empty).
    pub newest_msg_age_sec: Option<i32>,
    /// Age of the oldest message, seconds (None when empty).
    pub oldest_msg_age_sec: Option<i32>,
    /// Messages ever sent (the id sequence's position).
    pub total_messages: i64,
    /// When the metrics were taken (database clock).
    pub scrape_time: DateTime<Utc>,
    /// Partitioned queues: estimated rows in the default partitions (non-zero
    /// means pg_partman maintenance is failing). PGMQ 1.13 and later.
    pub default_partition_length: Option<i64>,
}

fn metrics_from_row(r: &tokio_postgres::Row) -> Result<QueueMetrics, Error> {
    let pg = Error::from_pg;
    Ok(QueueMetrics {
        queue_name: r.try_get("queue_name").map_err(pg)?,
        queue_length: r.try_get("queue_length").map_err(pg)?,
        queue_visible_length: r.try_get("queue_visible_length").map_err(pg)?,
        newest_msg_age_sec: r.try_get("newest_msg_age_sec").map_err(pg)?,
        oldest_msg_age_sec: r.try_get("oldest_msg_age_sec").map_err(pg)?,
        total_messages: r.try_get("total_messages").map_err(pg)?,
        scrape_time: r.try_get("scrape_time").map_err(pg)?,
        default_partition_length: r.try_get("default_partition_length").unwrap_or(None),
    })
}

impl<E: Executor> Pgmq<E> {
    /// Creates a queue (and its archive table), and gives the queue table
    /// the SDK's autovacuum settings ([`QUEUE_TABLE_AUTOVACUUM`](crate::QUEUE_TABLE_AUTOVACUUM)) when the
    /// connected role owns it and it has no `autovacuum_*` parameters yet
    /// (see [`Pgmq::tune_autovacuum`]). Creating an existing queue is
    /// otherwise a no-op.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// client.create(&q).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.create", skip_all, fields(queue = %queue))]
    pub async fn create(&self, queue: &QueueName) -> Result<(), Error> {
        let q = queue.as_str();
        self.run(Stmt::Create, None, &[&q]).await?;
        self.tune_new_queue(queue).await
    }

    /// Creates an unlogged queue: faster, but emptied by a server crash. Its
    /// table gets the autovacuum settings as [`Pgmq::create`] gives them.
    #[tracing::instrument(name = "pgmq.create_unlogged", skip_all, fields(queue = %queue))]
    pub async fn create_unlogged(&self, queue: &QueueName) -> Result<(), Error> {
        let q = queue.as_str();
        self.run(Stmt::CreateUnlogged, None, &[&q]).await?;
        self.tune_new_queue(queue).await
    }

    /// Creates a queue partitioned by pg_partman. `partition_interval` and
    /// `retention_interval` are message counts (`"10000"`) or time intervals
    /// (`"1 day"`). Needs the pg_partman extension in the database.
    #[tracing::instrument(name = "pgmq.create_partitioned", skip_all, fields(queue = %queue))]
    pub async fn create_partitioned(
        &self,
        queue: &QueueName,
        partition_interval: &str,
        retention_interval: &str,
    ) -> Result<(), Error> {
        let q = queue.as_str();
        self.run(
            Stmt::CreatePartitioned,
            None,
            &[&q, &partition_interval, &retention_interval],
        )
        .await
        .map(drop)
    }

    /// Drops a queue, its archive and its notify trigger; false when it did not exist.
    #[tracing::instrument(name = "pgmq.drop_queue", skip_all, fields(queue = %queue))]
    pub async fn drop_queue(&self, queue: &QueueName) -> Result<bool, Error> {
        if !self.queue_exists(queue).await? {
            return Ok(false);
        }
        let q = queue.as_str();
        let rows = self.run(Stmt::DropQueue, Some(q), &[&q]).await?;
        Ok(first_col::<Option<bool>>(&rows, 0, None)?.unwrap_or(false))
    }

    /// Deletes every message of a queue (TRUNCATE); returns how many there
    /// were. When the `pgmq_sdk` schema is installed it also forgets the
    /// queue's deduplication keys ([`Pgmq::send_keyed`]): they named
    /// messages that are gone, and a producer sending one again after the
    /// purge means it to be stored. (PGMQ's own `pgmq.purge_queue`, called
    /// directly, leaves the keys.) Inside a caller's transaction both
    /// commit together.
    #[tracing::instrument(name = "pgmq.purge_queue", skip_all, fields(queue = %queue))]
    pub async fn purge_queue(&self, queue: &QueueName) -> Result<i64, Error> {
        let q = queue.as_str();
        let rows = self.run(Stmt::PurgeQueue, Some(q), &[&q]).await?;
        let purged = first_col::<Option<i64>>(&rows, 0, None)?.unwrap_or(0);
        let probe = "pgmq_sdk.forget_queue_keys(text)";
        let present = self.run(Stmt::SdkPresent, None, &[&probe]).await?;
        if first_col::<bool>(&present, 0, false)? {
            self.run(Stmt::ForgetQueueKeys, Some(q), &[&q])
                .await
                .map_err(|e| e.in_sdk("forgetting a purged queue's keys"))?;
        }
        Ok(purged)
    }

    /// Deprecated by PGMQ (a no-op since 1.10; archives are kept on drop): kept
    /// for completeness.
    pub async fn detach_archive(&self, queue: &QueueName) -> Result<(), Error> {
        let q = queue.as_str();
        self.run(Stmt::DetachArchive, Some(q), &[&q])
            .await
            .map(drop)
    }

    /// Whether a queue exists (a row in `pgmq.meta`).
    pub async fn queue_exists(&self, queue: &QueueName) -> Result<bool, Error> {
        let q = queue.as_str();
        let rows = self.run(Stmt::QueueExists, None, &[&q]).await?;
        first_col(&rows, 0, false)
    }

    /// Every queue.
    pub async fn list_queues(&self) -> Result<Vec<QueueInfo>, Error> {
        let rows = self.run(Stmt::ListQueues, None, &[]).await?;
        rows.iter()
            .map(|r| {
                Ok(QueueInfo {
                    queue_name: col(r, 0)?,
                    is_partitioned: col(r, 1)?,
                    is_unlogged: col(r, 2)?,
                    created_at: col(r, 3)?,
                })
            })
            .collect()
    }

    /// Length, visible length, ages and total count of one queue.
    #[tracing::instrument(name = "pgmq.metrics", skip_all, fields(queue = %queue))]
    pub async fn metrics(&self, queue: &QueueName) -> Result<QueueMetrics, Error> {
        let q = queue.as_str();
        let rows = self.run(Stmt::Metrics, Some(q), &[&q]).await?;
        let row = rows.first().ok_or_else(|| Error::QueueNotFound {
            queue: q.to_owned(),
        })?;
        metrics_from_row(row)
    }

    /// Metrics of every queue.
    ///
    /// PGMQ's `metrics_all` fails with SQLSTATE 42P01 when a queue is dropped
    /// while it runs (and can be chosen as a deadlock victim, 40P01, when a
    /// transaction holds locks on queue tables). On the pool the call is then
    /// repeated, and if it fails again, the queues are listed and each one's
    /// `pgmq.metrics` is read on its own, passing over those dropped
    /// meanwhile. Inside a transaction the
    /// error is returned (and aborts the transaction, as any error does);
    /// there it also holds a share lock on every queue table until the
    /// transaction ends, which blocks purges and drops meanwhile: call it
    /// outside, or under a savepoint that is rolled back.
    #[tracing::instrument(name = "pgmq.metrics_all", skip_all)]
    pub async fn metrics_all(&self) -> Result<Vec<QueueMetrics>, Error> {
        let retryable = |e: &Error| {
            self.executor().autocommit()
                && matches!(
                    e.sqlstate(),
                    Some(c) if *c == SqlState::UNDEFINED_TABLE
                        || *c == SqlState::T_R_DEADLOCK_DETECTED
                )
        };
        for attempt in 1..=2 {
            match self.run(Stmt::MetricsAll, None, &[]).await {
                Ok(rows) => return rows.iter().map(metrics_from_row).collect(),
                Err(e) if retryable(&e) => {
                    tracing::debug!(attempt, error = %e, "metrics_all failed; again");
                }
                Err(e) => return Err(e),
            }
        }
        // Queues come and go faster than one metrics_all runs: one by one.
        let mut all = Vec::new();
        for q in self.list_queues().await? {
            let name = q.queue_name.as_str();
            match self.run(Stmt::Metrics, Some(name), &[&name]).await {
                Ok(rows) => all.extend(rows.iter().map(metrics_from_row)),
                Err(Error::QueueNotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        all.into_iter().collect()
    }
}
