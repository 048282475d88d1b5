//! FIFO groups: PGMQ's `read_grouped` family.
//!
//! Messages carrying the header `x-pgmq-group` ([`FIFO_GROUP_HEADER`]) belong
//! to that group (others to one default group). Within a group, a message is
//! delivered only after every earlier one was deleted or archived.

use serde::de::DeserializeOwned;

use crate::conn::args::{millis, qty, secs};
use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::statements::Stmt;
use crate::pgmq::message::{decode_rows, raw_from_row, Decoded, Message, RawJson};
use crate::pgmq::queue_name::QueueName;
use crate::pgmq::read::ReadOptions;
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
    /// Reads up to `opts.qty` messages in FIFO-group order, decoded per
    /// message ([`Decoded`]): a body that does not decode into `T` comes
    /// back raw in its place, so it neither fails the batch nor blocks its
    /// group (archive or delete it to let the group advance).
    ///
    /// With [`ReadOptions::poll`] the server waits while nothing is visible
    /// (PGMQ's `read_grouped*_with_poll`). Grouped reads take no filter: one
    /// is refused with [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::{GroupStrategy, QueueName, ReadOptions, SendOptions, FIFO_GROUP_HEADER};
    /// use std::time::Duration;
    /// let q = QueueName::new("ledger")?;
    /// let opts = SendOptions::new().headers(serde_json::json!({ FIFO_GROUP_HEADER: "account-7" }));
    /// client.send_with(&q, &serde_json::json!({"debit": 5}), &opts).await?;
    /// let read = ReadOptions::new(Duration::from_secs(30)).qty(10);
    /// let batch = client
    ///     .read_grouped::<serde_json::Value>(&q, GroupStrategy::RoundRobin, &read)
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn read_grouped<T: DeserializeOwned>(
        &self,
        queue: &QueueName,
        strategy: GroupStrategy,
        opts: &ReadOptions,
    ) -> Result<Vec<Decoded<T>>, Error> {
        let rows = self.grouped_rows(queue, strategy, opts).await?;
        Ok(strategy.arrange(decode_rows(&rows)?, decoded_id))
    }

    /// Like [`read_grouped`](Self::read_grouped), bodies left undecoded.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::{GroupStrategy, ReadOptions};
    /// use std::time::Duration;
    /// let read = ReadOptions::new(Duration::from_secs(30))
    ///     .qty(10)
    ///     .poll(Duration::from_secs(5), Duration::from_millis(100));
    /// let heads = client.read_grouped_raw(&q, GroupStrategy::Head, &read).await?;
    /// # Ok(()) }
    /// ```
    pub async fn read_grouped_raw(
        &self,
        queue: &QueueName,
        strategy: GroupStrategy,
        opts: &ReadOptions,
    ) -> Result<Vec<Message<RawJson>>, Error> {
        let rows = self.grouped_rows(queue, strategy, opts).await?;
        let batch = rows.iter().map(raw_from_row).collect::<Result<_, _>>()?;
        Ok(strategy.arrange(batch, |m: &Message<RawJson>| m.msg_id))
    }

    #[tracing::instrument(name = "pgmq.read_grouped", skip_all, fields(queue = %queue, qty = opts.qty))]
    async fn grouped_rows(
        &self,
        queue: &QueueName,
        strategy: GroupStrategy,
        opts: &ReadOptions,
    ) -> Result<Vec<tokio_postgres::Row>, Error> {
        opts.refuse("a grouped read", true)?;
        let q = queue.as_str();
        let vt = secs(opts.vt, "visibility timeout")?;
        let n = qty(opts.qty)?;
        match opts.max_poll {
            None => self.run(strategy.stmts().0, Some(q), &[&q, &vt, &n]).await,
            Some(max_poll) => {
                let max_poll = secs(max_poll, "max_poll")?;
                let interval = millis(opts.poll_interval, "poll_interval")?;
                self.run(
                    strategy.stmts().1,
                    Some(q),
                    &[&q, &vt, &n, &max_poll, &interval],
                )
                .await
            }
        }
    }

    /// Adds PGMQ's GIN index on headers, which speeds up grouped reads.
    pub async fn create_fifo_index(&self, queue: &QueueName) -> Result<(), Error> {
        let q = queue.as_str();
        self.run(Stmt::CreateFifoIndex, Some(q), &[&q])
            .await
            .map(drop)
    }
}
