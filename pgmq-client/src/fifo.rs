//! FIFO groups: PGMQ's `read_grouped` family.
//!
//! Messages carrying the header `x-pgmq-group` ([`FIFO_GROUP_HEADER`]) belong
//! to that group (others to one default group). Within a group, a message is
//! delivered only after every earlier one was deleted or archived.

use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::executor::Executor;
use crate::message::{decode_rows, raw_from_row, Decoded, Message, RawJson};
use crate::queue_name::QueueName;
use crate::read::{millis, qty, secs};
use crate::statements::Stmt;
use crate::Pgmq;

/// The header naming a message's FIFO group.
pub const FIFO_GROUP_HEADER: &str = "x-pgmq-group";

/// How a grouped read picks messages across groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum GroupStrategy {
    /// `read_grouped`: fill the batch from the group with the oldest message
    /// first, like SQS FIFO. The batch comes back in `msg_id` order.
    #[default]
    Fill,
    /// `read_grouped_rr`: interleave groups round-robin, oldest first in each.
    /// The batch comes back in that interleaved order. PGMQ takes an advisory
    /// lock per group *name* (database-wide) and passes over a group that
    /// another transaction is reading at that moment, on any queue: make
    /// group names unique across queues.
    RoundRobin,
    /// `read_grouped_head`: at most the head message of each group, in
    /// `msg_id` order.
    Head,
}

impl GroupStrategy {
    /// PGMQ returns `UPDATE ... RETURNING` rows, whose order SQL does not
    /// promise; for Fill and Head, `msg_id` order is the order to handle them
    /// in (it keeps each group's order). Round robin's order is its own.
    fn arrange<T>(self, mut batch: Vec<T>, id: impl Fn(&T) -> i64) -> Vec<T> {
        if self != GroupStrategy::RoundRobin {
            batch.sort_by_key(|m| id(m));
        }
        batch
    }

    fn stmts(self) -> (Stmt, Stmt) {
        match self {
            GroupStrategy::Fill => (Stmt::ReadGrouped, Stmt::ReadGroupedWithPoll),
            GroupStrategy::RoundRobin => (Stmt::ReadGroupedRr, Stmt::ReadGroupedRrWithPoll),
            GroupStrategy::Head => (Stmt::ReadGroupedHead, Stmt::ReadGroupedHeadWithPoll),
        }
    }
}

fn decoded_id<T>(m: &Decoded<T>) -> i64 {
    match m {
        Ok(m) => m.msg_id,
        Err(u) => u.message.msg_id,
    }
}

impl<E: Executor> Pgmq<E> {
    /// Reads up to `qty` messages in FIFO-group order, decoded per message
    /// ([`Decoded`]): a body that does not decode into `T` comes back raw in
    /// its place, so it neither fails the batch nor blocks its group (archive
    /// or delete it to let the group advance). `vt` is rounded up to whole
    /// seconds; `n` is at most [`MAX_BATCH`](crate::MAX_BATCH).
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::{GroupStrategy, QueueName, SendOptions, FIFO_GROUP_HEADER};
    /// use std::time::Duration;
    /// let q = QueueName::new("ledger")?;
    /// let opts = SendOptions::new().headers(serde_json::json!({ FIFO_GROUP_HEADER: "account-7" }));
    /// client.send_with(&q, &serde_json::json!({"debit": 5}), &opts).await?;
    /// let batch = client
    ///     .read_grouped::<serde_json::Value>(&q, GroupStrategy::RoundRobin, Duration::from_secs(30), 10)
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn read_grouped<T: DeserializeOwned>(
        &self,
        queue: &QueueName,
        strategy: GroupStrategy,
        vt: Duration,
        n: usize,
    ) -> Result<Vec<Decoded<T>>, Error> {
        let rows = self.grouped_rows(queue, strategy, vt, n).await?;
        Ok(strategy.arrange(decode_rows(&rows)?, decoded_id))
    }

    /// Like [`read_grouped`](Self::read_grouped), bodies left undecoded.
    pub async fn read_grouped_raw(
        &self,
        queue: &QueueName,
        strategy: GroupStrategy,
        vt: Duration,
        n: usize,
    ) -> Result<Vec<Message<RawJson>>, Error> {
        let rows = self.grouped_rows(queue, strategy, vt, n).await?;
        let batch = rows.iter().map(raw_from_row).collect::<Result<_, _>>()?;
        Ok(strategy.arrange(batch, |m: &Message<RawJson>| m.msg_id))
    }

    #[tracing::instrument(name = "pgmq.read_grouped", skip_all, fields(queue = %queue, qty = n))]
    async fn grouped_rows(
        &self,
        queue: &QueueName,
        strategy: GroupStrategy,
        vt: Duration,
        n: usize,
    ) -> Result<Vec<tokio_postgres::Row>, Error> {
        let q = queue.as_str();
        let vt = secs(vt, "visibility timeout")?;
        let n = qty(n)?;
        self.run(strategy.stmts().0, Some(q), &[&q, &vt, &n]).await
    }

    /// [`read_grouped`](Self::read_grouped), polling on the server for up to
    /// `max_poll` while nothing is visible.
    pub async fn read_grouped_with_poll<T: DeserializeOwned>(
        &self,
        queue: &QueueName,
        strategy: GroupStrategy,
        vt: Duration,
        n: usize,
        max_poll: Duration,
        poll_interval: Duration,
    ) -> Result<Vec<Decoded<T>>, Error> {
        let rows = self
            .grouped_poll_rows(queue, strategy, vt, n, max_poll, poll_interval)
            .await?;
        Ok(strategy.arrange(decode_rows(&rows)?, decoded_id))
    }

    /// Like [`read_grouped_with_poll`](Self::read_grouped_with_poll), bodies
    /// left undecoded.
    pub async fn read_grouped_with_poll_raw(
        &self,
        queue: &QueueName,
        strategy: GroupStrategy,
        vt: Duration,
        n: usize,
        max_poll: Duration,
        poll_interval: Duration,
    ) -> Result<Vec<Message<RawJson>>, Error> {
        let rows = self
            .grouped_poll_rows(queue, strategy, vt, n, max_poll, poll_interval)
            .await?;
        let batch = rows.iter().map(raw_from_row).collect::<Result<_, _>>()?;
        Ok(strategy.arrange(batch, |m: &Message<RawJson>| m.msg_id))
    }

    #[tracing::instrument(name = "pgmq.read_grouped_with_poll", skip_all, fields(queue = %queue, qty = n))]
    async fn grouped_poll_rows(
        &self,
        queue: &QueueName,
        strategy: GroupStrategy,
        vt: Duration,
        n: usize,
        max_poll: Duration,
        poll_interval: Duration,
    ) -> Result<Vec<tokio_postgres::Row>, Error> {
        let q = queue.as_str();
        let vt = secs(vt, "visibility timeout")?;
        let n = qty(n)?;
        let max_poll = secs(max_poll, "max_poll")?;
        let interval = millis(poll_interval, "poll_interval")?;
        self.run(
            strategy.stmts().1,
            Some(q),
            &[&q, &vt, &n, &max_poll, &interval],
        )
        .await
    }

    /// Adds PGMQ's GIN index on headers, which speeds up grouped reads.
    pub async fn create_fifo_index(&self, queue: &QueueName) -> Result<(), Error> {
        let q = queue.as_str();
        self.run(Stmt::CreateFifoIndex, Some(q), &[&q])
            .await
            .map(drop)
    }
}
