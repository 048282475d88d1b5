//! Sending: `pgmq.send` and `pgmq.send_batch`, with delays and headers.

use std::error::Error as StdError;

use bytes::{BufMut, BytesMut};
use postgres_types::{IsNull, Kind, ToSql, Type};
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

/// The JSON texts of a batch (bodies or headers), serialized once before any
/// SQL runs, into one buffer: one allocation per batch instead of one per
/// message. Sent as a `jsonb[]` parameter, written straight from the buffer
/// in PostgreSQL's binary array format.
pub(crate) struct JsonBatch {
    text: Vec<u8>,
    /// Where each element's text ends in `text`.
    ends: Vec<usize>,
}

impl JsonBatch {
    /// Serializes each of `values`.
    fn new<T: Serialize>(values: &[T]) -> Result<Self, Error> {
        let mut batch = JsonBatch {
            text: Vec::new(),
            ends: Vec::with_capacity(values.len()),
        };
        for v in values {
            serde_json::to_writer(&mut batch.text, v).map_err(Error::Serialize)?;
            batch.ends.push(batch.text.len());
            if batch.ends.len() == 1 {
                // Reserve for the rest at the first element's size.
                batch.text.reserve(batch.text.len() * (values.len() - 1));
            }
        }
        Ok(batch)
    }

    /// The bodies and optional headers of a batch send, checked (size,
    /// one header per body) and serialized; None for an empty batch.
    pub(crate) fn bodies_and_headers<T: Serialize>(
        bodies: &[T],
        headers: Option<&[serde_json::Value]>,
    ) -> Result<Option<(JsonBatch, Option<JsonBatch>)>, Error> {
        if bodies.is_empty() {
            return Ok(None);
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
        let headers = headers.map(JsonBatch::new).transpose()?;
        Ok(Some((JsonBatch::new(bodies)?, headers)))
    }

    fn elements(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(self.ends.iter().copied())
            .map(|(a, b)| &self.text[a..b])
    }
}

impl std::fmt::Debug for JsonBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Bodies may be private: sizes only.
        write!(
            f,
            "JsonBatch({} elements, {} bytes)",
            self.ends.len(),
            self.text.len()
        )
    }
}

/// PostgreSQL's binary array format: one dimension, no NULLs.
impl ToSql for JsonBatch {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        let Kind::Array(member) = ty.kind() else {
            return Err(format!("JSON batch sent as {ty}").into());
        };
        let jsonb = *member == Type::JSONB;
        let len = |n: usize| i32::try_from(n).map_err(|_| "JSON batch too large");
        out.reserve(20 + self.text.len() + self.ends.len() * 5);
        out.put_i32(1); // dimensions
        out.put_i32(0); // no NULLs
        out.put_u32(member.oid());
        out.put_i32(len(self.ends.len())?);
        out.put_i32(1); // lower bound
        for text in self.elements() {
            if jsonb {
                out.put_i32(len(text.len() + 1)?);
                out.put_u8(1); // jsonb's binary format version
            } else {
                out.put_i32(len(text.len())?);
            }
            out.put_slice(text);
        }
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        matches!(ty.kind(), Kind::Array(m) if *m == Type::JSONB || *m == Type::JSON)
    }

    postgres_types::to_sql_checked!();
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
        let headers = opts.headers.as_ref().map(to_json).transpose()?;
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
        let Some((bodies, headers)) = JsonBatch::bodies_and_headers(bodies, headers)? else {
            return Ok(Vec::new());
        };
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
