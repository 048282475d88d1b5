//! Acknowledging: `pgmq.delete`, `pgmq.archive` and `pgmq.set_vt`, single and batch.

use crate::conn::args::check_batch;
use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::rows::{col0s, first_col};
use crate::conn::statements::Stmt;
use crate::pgmq::message::{raw_from_row, Delay, Message, RawJson};
use crate::pgmq::queue_name::QueueName;
use crate::Pgmq;
use tokio_postgres::types::Type;

impl<E: Executor> Pgmq<E> {
    /// Deletes a message; false when there was no such message.
    #[tracing::instrument(name = "pgmq.delete", skip_all, fields(queue = %queue))]
    pub async fn delete(&self, queue: &QueueName, msg_id: i64) -> Result<bool, Error> {
        self.ack_one(Stmt::Delete, queue, msg_id).await
    }

    /// Deletes messages; returns the ids that existed and were deleted.
    #[tracing::instrument(name = "pgmq.delete_batch", skip_all, fields(queue = %queue, batch = msg_ids.len()))]
    pub async fn delete_batch(
        &self,
        queue: &QueueName,
        msg_ids: &[i64],
    ) -> Result<Vec<i64>, Error> {
        self.ack_batch(Stmt::DeleteBatch, queue, msg_ids).await
    }

    /// Moves a message to the queue's archive table; false when there was no such message.
    #[tracing::instrument(name = "pgmq.archive", skip_all, fields(queue = %queue))]
    pub async fn archive(&self, queue: &QueueName, msg_id: i64) -> Result<bool, Error> {
        self.ack_one(Stmt::Archive, queue, msg_id).await
    }

    /// Archives messages; returns the ids archived.
    #[tracing::instrument(name = "pgmq.archive_batch", skip_all, fields(queue = %queue, batch = msg_ids.len()))]
    pub async fn archive_batch(
        &self,
        queue: &QueueName,
        msg_ids: &[i64],
    ) -> Result<Vec<i64>, Error> {
        self.ack_batch(Stmt::ArchiveBatch, queue, msg_ids).await
    }

    /// Deletes or archives one message (`stmt` is `Delete` or `Archive`,
    /// which answer one boolean); false when there was no such message.
    async fn ack_one(&self, stmt: Stmt, queue: &QueueName, msg_id: i64) -> Result<bool, Error> {
        let q = queue.as_str();
        let rows = self.run(stmt, Some(q), &[&q, &msg_id]).await?;
        Ok(first_col::<Option<bool>>(&rows, 0, None)?.unwrap_or(false))
    }

    /// Deletes or archives messages (`stmt` is `DeleteBatch` or
    /// `ArchiveBatch`, which answer a row per id acted on); returns those
    /// ids. An empty batch makes no round trip.
    async fn ack_batch(
        &self,
        stmt: Stmt,
        queue: &QueueName,
        msg_ids: &[i64],
    ) -> Result<Vec<i64>, Error> {
        if msg_ids.is_empty() {
            return Ok(Vec::new());
        }
        check_batch(msg_ids.len(), "batch of")?;
        let q = queue.as_str();
        let rows = self.run(stmt, Some(q), &[&q, &msg_ids]).await?;
        col0s(&rows)
    }

    /// Sets a message's visibility timeout: visible again after a
    /// `Duration`, or at a time ([`Delay`]); returns the updated message, or
    /// None when there was no such message.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// use std::time::Duration;
    /// // Hide message 42 for another minute.
    /// client.set_vt(&q, 42, Duration::from_secs(60)).await?;
    /// // Or until a given time.
    /// client.set_vt(&q, 42, chrono::Utc::now() + chrono::Duration::hours(1)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn set_vt(
        &self,
        queue: &QueueName,
        msg_id: i64,
        vt: impl Into<Delay>,
    ) -> Result<Option<Message<serde_json::Value>>, Error> {
        self.set_vt_raw(queue, msg_id, vt)
            .await?
            .map(Message::decode)
            .transpose()
    }

    /// Like [`set_vt`](Self::set_vt), the body left undecoded: for code that
    /// only forwards messages (moving them to a dead-letter queue, say), so
    /// that any body the server holds, however deep, comes back intact.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::Delay;
    /// if let Some(m) = client.set_vt_raw(&q, 42, Delay::NONE).await? {
    ///     println!("{} bytes of JSON", m.body.get().len());
    /// }
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.set_vt", skip_all, fields(queue = %queue))]
    pub async fn set_vt_raw(
        &self,
        queue: &QueueName,
        msg_id: i64,
        vt: impl Into<Delay>,
    ) -> Result<Option<Message<RawJson>>, Error> {
        let q = queue.as_str();
        let vt = vt
            .into()
            .arg("visibility timeout", Stmt::SetVt, Stmt::SetVtAt)?;
        let rows = self
            .run(vt.stmt(), Some(q), &[&q, &msg_id, vt.value()])
            .await?;
        rows.first().map(raw_from_row).transpose()
    }

    /// Sets the visibility timeout of many messages ([`Delay`], as for
    /// [`set_vt`](Self::set_vt)); returns the ids updated.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::Delay;
    /// // Make them visible again at once.
    /// let ids = client.set_vt_batch(&q, &[1, 2, 3], Delay::NONE).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.set_vt_batch", skip_all, fields(queue = %queue, batch = msg_ids.len()))]
    pub async fn set_vt_batch(
        &self,
        queue: &QueueName,
        msg_ids: &[i64],
        vt: impl Into<Delay>,
    ) -> Result<Vec<i64>, Error> {
        if msg_ids.is_empty() {
            return Ok(Vec::new());
        }
        check_batch(msg_ids.len(), "batch of")?;
        let q = queue.as_str();
        let vt = vt
            .into()
            .arg("visibility timeout", Stmt::SetVtBatch, Stmt::SetVtBatchAt)?;
        let rows = self
            .run(vt.stmt(), Some(q), &[&q, &msg_ids, vt.value()])
            .await?;
        col0s(&rows)
    }

    /// Gives claimed messages back unhandled: undoes their read.
    ///
    /// **Not a PGMQ function**: an `UPDATE` on the queue table (PGMQ has no
    /// call that lowers `read_ct`). For each `(msg_id, read_ct)` pair, with
    /// `read_ct` as the read returned it, a message that still has that
    /// `read_ct` becomes visible now (`vt = clock_timestamp()`) and gets its
    /// `read_ct` lowered by one (never below 0), in one statement. So a
    /// message read and given back without running does not use up an
    /// attempt: a consumer that counts attempts by `read_ct` (retry limits,
    /// dead-lettering) sees it as never delivered. `last_read_at` keeps the
    /// time of that read.
    ///
    /// A message whose `read_ct` differs was read again since (its
    /// visibility timeout ended and another consumer took it: it is theirs
    /// now) and is left alone, as is one already deleted. Returns the ids
    /// released.
    ///
    /// The SQL names the table `pgmq."q_<name>"`, built only from the
    /// validated [`QueueName`]. It runs on every executor of this crate.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// use std::time::Duration;
    /// let claimed = client.read_raw(&q, Duration::from_secs(30), 10).await?;
    /// // Stopping before handling them: give them back, attempts unused.
    /// let reads: Vec<(i64, i32)> = claimed.iter().map(|m| (m.msg_id, m.read_ct)).collect();
    /// let released = client.release_batch(&q, &reads).await?;
    /// println!("{} released", released.len());
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.release_batch", skip_all, fields(queue = %queue, batch = reads.len()))]
    pub async fn release_batch(
        &self,
        queue: &QueueName,
        reads: &[(i64, i32)],
    ) -> Result<Vec<i64>, Error> {
        if reads.is_empty() {
            return Ok(Vec::new());
        }
        check_batch(reads.len(), "batch of")?;
        let (ids, read_cts): (Vec<i64>, Vec<i32>) = reads.iter().copied().unzip();
        let sql = format!(
            "UPDATE {} AS m \
             SET vt = pg_catalog.clock_timestamp(), read_ct = GREATEST(m.read_ct - 1, 0) \
             FROM ROWS FROM (pg_catalog.unnest($1::bigint[]), pg_catalog.unnest($2::integer[])) \
                 AS r(msg_id, read_ct) \
             WHERE m.msg_id = r.msg_id AND m.read_ct = r.read_ct \
             RETURNING m.msg_id",
            queue.quoted_table()
        );
        let rows = self
            .run_text(
                &sql,
                queue.as_str(),
                &[(&ids, Type::INT8_ARRAY), (&read_cts, Type::INT4_ARRAY)],
            )
            .await?;
        col0s(&rows)
    }
}
