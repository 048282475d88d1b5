//! Reading: `pgmq.read` (optionally filtered), `pgmq.read_with_poll` and `pgmq.pop`.

use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::executor::Executor;
use crate::message::{decode_rows, raw_from_row, Message, RawJson};
use crate::queue_name::QueueName;
use crate::statements::Stmt;
use crate::Pgmq;

/// Whole seconds of `d` as PGMQ's integer arguments take them.
pub(crate) fn secs(d: Duration, what: &str) -> Result<i32, Error> {
    i32::try_from(d.as_secs())
        .map_err(|_| Error::InvalidArgument(format!("{what} of {d:?} is too long")))
}

/// Milliseconds of `d` as an integer argument.
pub(crate) fn millis(d: Duration, what: &str) -> Result<i32, Error> {
    i32::try_from(d.as_millis())
        .map_err(|_| Error::InvalidArgument(format!("{what} of {d:?} is too long")))
}

pub(crate) fn qty(n: usize) -> Result<i32, Error> {
    i32::try_from(n).map_err(|_| Error::InvalidArgument(format!("quantity {n} is too large")))
}

impl<E: Executor> Pgmq<E> {
    /// Reads up to `qty` visible messages and hides them for `vt` (whole seconds).
    ///
    /// A body that does not decode into `T` fails the call with
    /// [`Error::Deserialize`]; the messages stay in the queue and reappear when
    /// `vt` ends. Use [`read_raw`](Self::read_raw) to decode one by one.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use std::time::Duration;
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// for m in client.read::<serde_json::Value>(&q, Duration::from_secs(30), 10).await? {
    ///     println!("{}: {}", m.msg_id, m.body);
    ///     client.delete(&q, m.msg_id).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn read<T: DeserializeOwned>(
        &self,
        queue: &QueueName,
        vt: Duration,
        qty: usize,
    ) -> Result<Vec<Message<T>>, Error> {
        let rows = self.read_rows(queue, vt, qty, None).await?;
        decode_rows(&rows)
    }

    /// Like [`read`](Self::read), bodies left undecoded.
    pub async fn read_raw(
        &self,
        queue: &QueueName,
        vt: Duration,
        qty: usize,
    ) -> Result<Vec<Message<RawJson>>, Error> {
        let rows = self.read_rows(queue, vt, qty, None).await?;
        rows.iter().map(raw_from_row).collect()
    }

    /// Reads only messages whose body contains `filter` (JSONB `@>`).
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use std::time::Duration;
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// let eu = client
    ///     .read_where::<serde_json::Value>(&q, Duration::from_secs(30), 10, &serde_json::json!({"region": "eu"}))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn read_where<T: DeserializeOwned>(
        &self,
        queue: &QueueName,
        vt: Duration,
        qty: usize,
        filter: &serde_json::Value,
    ) -> Result<Vec<Message<T>>, Error> {
        let rows = self.read_rows(queue, vt, qty, Some(filter)).await?;
        decode_rows(&rows)
    }

    #[tracing::instrument(name = "pgmq.read", skip_all, fields(queue = %queue, qty = qty))]
    async fn read_rows(
        &self,
        queue: &QueueName,
        vt: Duration,
        qty: usize,
        filter: Option<&serde_json::Value>,
    ) -> Result<Vec<tokio_postgres::Row>, Error> {
        let q = queue.as_str();
        let vt = secs(vt, "visibility timeout")?;
        let n = self::qty(qty)?;
        match filter {
            None => self.run(Stmt::Read, Some(q), &[&q, &vt, &n]).await,
            Some(f) => {
                let f = postgres_types::Json(f);
                self.run(Stmt::ReadWhere, Some(q), &[&q, &vt, &n, &f]).await
            }
        }
    }

    /// Reads like [`read`](Self::read), but when nothing is visible the server
    /// polls every `poll_interval` for up to `max_poll` before returning empty.
    /// The connection is held for the whole wait.
    #[tracing::instrument(name = "pgmq.read_with_poll", skip_all, fields(queue = %queue, qty = qty))]
    pub async fn read_with_poll<T: DeserializeOwned>(
        &self,
        queue: &QueueName,
        vt: Duration,
        qty: usize,
        max_poll: Duration,
        poll_interval: Duration,
        filter: Option<&serde_json::Value>,
    ) -> Result<Vec<Message<T>>, Error> {
        let q = queue.as_str();
        let vt = secs(vt, "visibility timeout")?;
        let n = self::qty(qty)?;
        let max_poll = secs(max_poll, "max_poll")?;
        let interval = millis(poll_interval, "poll_interval")?;
        let empty = serde_json::json!({});
        let f = postgres_types::Json(filter.unwrap_or(&empty));
        let rows = self
            .run(
                Stmt::ReadWithPoll,
                Some(q),
                &[&q, &vt, &n, &max_poll, &interval, &f],
            )
            .await?;
        decode_rows(&rows)
    }

    /// Reads and deletes up to `qty` messages at once (at-most-once delivery).
    #[tracing::instrument(name = "pgmq.pop", skip_all, fields(queue = %queue, qty = qty))]
    pub async fn pop<T: DeserializeOwned>(
        &self,
        queue: &QueueName,
        qty: usize,
    ) -> Result<Vec<Message<T>>, Error> {
        let q = queue.as_str();
        let n = self::qty(qty)?;
        let rows = self.run(Stmt::Pop, Some(q), &[&q, &n]).await?;
        decode_rows(&rows)
    }
}
