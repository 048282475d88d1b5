//! Sending: `pgmq.send` and `pgmq.send_batch`, with delays and headers.

use serde::Serialize;

use crate::error::{col, col0s, Error};
use crate::executor::Executor;
use crate::message::{Delay, RawJson, SendOptions};
use crate::queue_name::QueueName;
use crate::read::{check_batch, secs};
use crate::statements::Stmt;
use crate::Pgmq;

/// Serializes a body (or headers) once, before any SQL runs.
pub(crate) fn to_json<T: Serialize + ?Sized>(value: &T) -> Result<RawJson, Error> {
    let raw = serde_json::value::to_raw_value(value).map_err(Error::Serialize)?;
    Ok(RawJson::from_raw(raw))
}

/// The headers of a single send: `headers_each` is for batches.
pub(crate) fn one_headers(opts: &SendOptions) -> Result<Option<RawJson>, Error> {
    if opts.headers_each.is_some() {
        return Err(Error::InvalidArgument(
            "headers_each is for batch sends; a single send takes headers".into(),
        ));
    }
    opts.headers.as_ref().map(to_json).transpose()
}

/// The headers of a batch of `n`: the same object for each, or one per
/// message; at most one of the two.
pub(crate) fn batch_headers(opts: &SendOptions, n: usize) -> Result<Option<Vec<RawJson>>, Error> {
    match (&opts.headers, &opts.headers_each) {
        (None, None) => Ok(None),
        (Some(h), None) => Ok(Some(vec![to_json(h)?; n])),
        (None, Some(each)) if each.len() == n => each
            .iter()
            .map(to_json)
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        (None, Some(each)) => Err(Error::InvalidArgument(format!(
            "{} headers for {n} messages",
            each.len()
        ))),
        (Some(_), Some(_)) => Err(Error::InvalidArgument(
            "headers and headers_each are both set; give one".into(),
        )),
    }
}

impl<E: Executor> Pgmq<E> {
    /// Sends one message; returns its id.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// let id = client.send(&q, &serde_json::json!({"order": 1})).await?;
    /// # Ok(()) }
    /// ```
    pub async fn send<T: Serialize + ?Sized + Sync>(
        &self,
        queue: &QueueName,
        body: &T,
    ) -> Result<i64, Error> {
        self.send_with(queue, body, &SendOptions::default()).await
    }

    /// Sends one message with a delay and/or headers; returns its id.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::{QueueName, SendOptions};
    /// use std::time::Duration;
    /// let q = QueueName::new("reminders")?;
    /// let opts = SendOptions::new()
    ///     .delay(Duration::from_secs(60))
    ///     .headers(serde_json::json!({"tenant": "acme"}));
    /// client.send_with(&q, &serde_json::json!({"remind": "me"}), &opts).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.send", skip_all, fields(queue = %queue))]
    pub async fn send_with<T: Serialize + ?Sized + Sync>(
        &self,
        queue: &QueueName,
        body: &T,
        opts: &SendOptions,
    ) -> Result<i64, Error> {
        let body = to_json(body)?;
        let headers = one_headers(opts)?;
        let q = queue.as_str();
        let rows = match opts.delay {
            Delay::At(at) => {
                self.run(Stmt::SendAt, Some(q), &[&q, &body, &headers, &at])
                    .await?
            }
            Delay::After(d) => {
                let s = secs(d, "delay")?;
                self.run(Stmt::Send, Some(q), &[&q, &body, &headers, &s])
                    .await?
            }
        };
        match rows.first() {
            Some(r) => col::<i64>(r, 0),
            None => Err(Error::InvalidArgument("pgmq.send returned no id".into())),
        }
    }

    /// Sends many messages in one statement; returns their ids in order.
    /// An empty slice sends nothing and returns an empty list.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// let ids = client.send_batch(&q, &[1, 2, 3]).await?;
    /// assert_eq!(ids.len(), 3);
    /// # Ok(()) }
    /// ```
    pub async fn send_batch<T: Serialize + Sync>(
        &self,
        queue: &QueueName,
        bodies: &[T],
    ) -> Result<Vec<i64>, Error> {
        self.send_batch_with(queue, bodies, &SendOptions::default())
            .await
    }

    /// Sends many messages with a delay and headers (the same for each, or
    /// one per message with [`SendOptions::headers_each`]); returns their
    /// ids in order.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::{QueueName, SendOptions, FIFO_GROUP_HEADER};
    /// use serde_json::json;
    /// use std::time::Duration;
    /// let q = QueueName::new("ledger")?;
    /// let opts = SendOptions::new()
    ///     .delay(Duration::from_secs(5))
    ///     .headers_each(vec![json!({ FIFO_GROUP_HEADER: "a" }), json!({ FIFO_GROUP_HEADER: "b" })]);
    /// let ids = client.send_batch_with(&q, &[json!({"debit": 1}), json!({"debit": 2})], &opts).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.send_batch", skip_all, fields(queue = %queue, batch = bodies.len()))]
    pub async fn send_batch_with<T: Serialize + Sync>(
        &self,
        queue: &QueueName,
        bodies: &[T],
        opts: &SendOptions,
    ) -> Result<Vec<i64>, Error> {
        if bodies.is_empty() {
            return Ok(Vec::new());
        }
        check_batch(bodies.len(), "batch of")?;
        let headers = batch_headers(opts, bodies.len())?;
        let bodies = bodies.iter().map(to_json).collect::<Result<Vec<_>, _>>()?;
        let q = queue.as_str();
        let rows = match opts.delay {
            Delay::At(at) => {
                self.run(Stmt::SendBatchAt, Some(q), &[&q, &bodies, &headers, &at])
                    .await?
            }
            Delay::After(d) => {
                let s = secs(d, "delay")?;
                self.run(Stmt::SendBatch, Some(q), &[&q, &bodies, &headers, &s])
                    .await?
            }
        };
        col0s::<i64>(&rows)
    }
}
