//! The PGMQ 1.13 functions not grouped elsewhere: the non-partitioned
//! creation PGMQ's `create` delegates to, converting an archive to
//! pg_partman partitions, FIFO indexes on every queue, PGMQ's own name,
//! routing-key and pattern checks, and its per-queue transaction lock.
//!
//! With these, every public function of PGMQ 1.13 has a wrapper. Left out:
//! `pgmq.notify_queue_listeners` (a trigger function, not callable) and the
//! `pgmq._*` helpers (PGMQ's internals).

use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::rows::first_col;
use crate::conn::statements::Stmt;
use crate::pgmq::queue_name::QueueName;
use crate::Pgmq;

impl<E: Executor> Pgmq<E> {
    /// `pgmq.create_non_partitioned`: creates a plain (logged, not
    /// partitioned) queue, the call [`create`](Self::create) makes for you.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// client.create_non_partitioned(&q).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.create_non_partitioned", skip_all, fields(queue = %queue))]
    pub async fn create_non_partitioned(&self, queue: &QueueName) -> Result<(), Error> {
        let q = queue.as_str();
        self.run(Stmt::CreateNonPartitioned, None, &[&q])
            .await
            .map(drop)
    }

    /// `pgmq.convert_archive_partitioned`: turns a queue's archive table
    /// into a pg_partman-partitioned one (the old table is kept as
    /// `a_<queue>_old`). `partition_interval` and `retention_interval` are
    /// message counts (`"10000"`) or time intervals (`"1 day"`), as for
    /// [`create_partitioned`](Self::create_partitioned); PGMQ's defaults
    /// are `"10000"`, `"100000"` and 10 leading partitions. An archive
    /// already partitioned is left as it is. Needs the pg_partman extension.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// client.convert_archive_partitioned(&q, "10000", "100000", 10).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.convert_archive_partitioned", skip_all, fields(queue = %queue))]
    pub async fn convert_archive_partitioned(
        &self,
        queue: &QueueName,
        partition_interval: &str,
        retention_interval: &str,
        leading_partition: i32,
    ) -> Result<(), Error> {
        let q = queue.as_str();
        self.run(
            Stmt::ConvertArchivePartitioned,
            Some(q),
            &[
                &q,
                &partition_interval,
                &retention_interval,
                &leading_partition,
            ],
        )
        .await
        .map(drop)
    }

    /// `pgmq.create_fifo_indexes_all`: [`create_fifo_index`](Self::create_fifo_index)
    /// on every queue.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// client.create_fifo_indexes_all().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.create_fifo_indexes_all", skip_all)]
    pub async fn create_fifo_indexes_all(&self) -> Result<(), Error> {
        self.run(Stmt::CreateFifoIndexesAll, None, &[])
            .await
            .map(drop)
    }

    /// `pgmq.validate_queue_name`: PGMQ's own check of a queue name's
    /// length, on the server. A name it refuses is an [`Error::Database`]
    /// (SQLSTATE P0001). [`QueueName::new`] checks more, locally.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) {
    /// assert!(client.validate_queue_name(&"x".repeat(48)).await.is_err());
    /// # }
    /// ```
    pub async fn validate_queue_name(&self, name: &str) -> Result<(), Error> {
        self.run(Stmt::ValidateQueueName, None, &[&name])
            .await
            .map(drop)
    }

    /// `pgmq.format_table_name`: the table name PGMQ derives from a queue
    /// name and a prefix (`"q"` for the queue, `"a"` for its archive).
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// assert_eq!(client.format_table_name("Orders", "q").await?, "q_orders");
    /// # Ok(()) }
    /// ```
    pub async fn format_table_name(&self, name: &str, prefix: &str) -> Result<String, Error> {
        let rows = self
            .run(Stmt::FormatTableName, None, &[&name, &prefix])
            .await?;
        first_col::<Option<String>>(&rows, 0, None)?
            .ok_or_else(|| Error::InvalidArgument("pgmq.format_table_name returned nothing".into()))
    }

    /// `pgmq.validate_routing_key`: whether PGMQ accepts `key` as a
    /// [`send_topic`](Self::send_topic) routing key. A key it refuses is an
    /// [`Error::Database`] naming the reason.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// assert!(client.validate_routing_key("orders.eu.created").await?);
    /// assert!(client.validate_routing_key("orders..created").await.is_err());
    /// # Ok(()) }
    /// ```
    pub async fn validate_routing_key(&self, key: &str) -> Result<bool, Error> {
        let rows = self.run(Stmt::ValidateRoutingKey, None, &[&key]).await?;
        Ok(first_col::<Option<bool>>(&rows, 0, None)?.unwrap_or(false))
    }

    /// `pgmq.validate_topic_pattern`: whether PGMQ accepts `pattern` for
    /// [`bind_topic`](Self::bind_topic). A pattern it refuses is an
    /// [`Error::Database`] naming the reason.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// assert!(client.validate_topic_pattern("orders.*.created").await?);
    /// # Ok(()) }
    /// ```
    pub async fn validate_topic_pattern(&self, pattern: &str) -> Result<bool, Error> {
        let rows = self
            .run(Stmt::ValidateTopicPattern, None, &[&pattern])
            .await?;
        Ok(first_col::<Option<bool>>(&rows, 0, None)?.unwrap_or(false))
    }

    /// `pgmq.acquire_queue_lock`: takes PGMQ's transaction-scoped advisory
    /// lock of the queue (the one its queue creation and dropping take),
    /// waiting for it. Released when the transaction ends, so use it on a
    /// [`Transaction`](crate::Transaction): on the pool each call is its own
    /// transaction and the lock is gone when the call returns.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::Pgmq;
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// let mut conn = client.connection().await?;
    /// let tx = conn.transaction().await?;
    /// Pgmq::on(&tx).acquire_queue_lock(&q).await?;
    /// // ... no one creates or drops the queue until commit
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn acquire_queue_lock(&self, queue: &QueueName) -> Result<(), Error> {
        let q = queue.as_str();
        self.run(Stmt::AcquireQueueLock, None, &[&q])
            .await
            .map(drop)
    }
}
