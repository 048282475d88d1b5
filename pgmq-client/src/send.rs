//! Sending: `pgmq.send` and `pgmq.send_batch`, with delays and headers.

use serde::Serialize;

use crate::error::{col, col0s, Error};
use crate::executor::Executor;
use crate::message::{Delay, RawJson, SendOptions};
use crate::queue_name::QueueName;
use crate::read::check_batch;
use crate::statements::Stmt;
use crate::Pgmq;

/// Serializes a body (or headers) once, before any SQL runs.
pub(crate) fn to_json<T: Serialize + ?Sized>(value: &T) -> Result<RawJson, Error> {
    let raw = serde_json::value::to_raw_value(value).map_err(Error::Serialize)?;
    Ok(RawJson::from_raw(raw))
}

impl<E: Executor> Pgmq<E> {
    /// One message's headers as sent: the caller's, with the current trace
    /// context merged in when the executor carries it ([`crate::trace`]).
    pub(crate) fn headers_json(
        &self,
        headers: Option<&serde_json::Value>,
    ) -> Result<Option<RawJson>, Error> {
        if self.executor().trace_context() {
            let trace = crate::trace::current();
            return crate::trace::merged(headers, &trace)
                .as_ref()
                .map(to_json)
                .transpose();
        }
        headers.map(to_json).transpose()
    }

    /// A batch's headers as sent ([`headers_json`](Self::headers_json) for
    /// each of `n` messages).
    pub(crate) fn batch_headers_json(
        &self,
        headers: Option<&[serde_json::Value]>,
        n: usize,
    ) -> Result<Option<Vec<RawJson>>, Error> {
        let trace = if self.executor().trace_context() {
            crate::trace::current()
        } else {
            serde_json::Map::new()
        };
        match headers {
            Some(h) => h
                .iter()
                .map(|v| match crate::trace::merged(Some(v), &trace) {
                    Some(m) => to_json(&m),
                    None => to_json(v),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            None if trace.is_empty() => Ok(None),
            None => Ok(Some(vec![to_json(&serde_json::Value::Object(trace))?; n])),
        }
    }
}

fn delay_secs(secs: u32) -> Result<i32, Error> {
    i32::try_from(secs)
        .map_err(|_| Error::InvalidArgument(format!("delay of {secs} s is too long")))
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
        let headers = self.headers_json(opts.headers.as_ref())?;
        let q = queue.as_str();
        let rows = match opts.delay {
            Delay::At(at) => {
                self.run(Stmt::SendAt, Some(q), &[&q, &body, &headers, &at])
                    .await?
            }
            Delay::None => {
                self.run(Stmt::Send, Some(q), &[&q, &body, &headers, &0i32])
                    .await?
            }
            Delay::Seconds(s) => {
                let s = delay_secs(s)?;
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
    pub async fn send_batch<T: Serialize + Sync>(
        &self,
        queue: &QueueName,
        bodies: &[T],
    ) -> Result<Vec<i64>, Error> {
        self.send_batch_with(queue, bodies, None, Delay::None).await
    }

    /// Sends many messages with per-message headers (same length as `bodies`)
    /// and one delay for all.
    #[tracing::instrument(name = "pgmq.send_batch", skip_all, fields(queue = %queue, batch = bodies.len()))]
    pub async fn send_batch_with<T: Serialize + Sync>(
        &self,
        queue: &QueueName,
        bodies: &[T],
        headers: Option<&[serde_json::Value]>,
        delay: Delay,
    ) -> Result<Vec<i64>, Error> {
        if bodies.is_empty() {
            return Ok(Vec::new());
        }
        check_batch(bodies.len(), "batch of")?;
        if let Some(h) = headers {
            if h.len() != bodies.len() {
                return Err(Error::InvalidArgument(format!(
                    "{} headers for {} messages",
                    h.len(),
                    bodies.len()
                )));
            }
        }
        let headers = self.batch_headers_json(headers, bodies.len())?;
        let bodies = bodies.iter().map(to_json).collect::<Result<Vec<_>, _>>()?;
        let q = queue.as_str();
        let rows = match delay {
            Delay::At(at) => {
                self.run(Stmt::SendBatchAt, Some(q), &[&q, &bodies, &headers, &at])
                    .await?
            }
            Delay::None => {
                self.run(Stmt::SendBatch, Some(q), &[&q, &bodies, &headers, &0i32])
                    .await?
            }
            Delay::Seconds(s) => {
                let s = delay_secs(s)?;
                self.run(Stmt::SendBatch, Some(q), &[&q, &bodies, &headers, &s])
                    .await?
            }
        };
        col0s::<i64>(&rows)
    }
}
