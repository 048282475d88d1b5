//! Sending: `pgmq.send` and `pgmq.send_batch`, with delays and headers.

use std::error::Error as StdError;

use bytes::{BufMut, BytesMut};
use postgres_types::{IsNull, Kind, ToSql, Type};
use serde::Serialize;
use tokio_postgres::Row;

use crate::conn::args::check_batch;
use crate::conn::call::Params;
use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::rows::{col, col0s};
use crate::conn::statements::Stmt;
use crate::pgmq::message::{RawJson, SendOptions};
use crate::pgmq::queue_name::QueueName;
use crate::Pgmq;

/// The most bytes the JSON of one batch send (bodies and headers together)
/// may take. PostgreSQL refuses a Bind message of 1 GiB or more, and one
/// array value must stay under 1 GiB too; the margin is for the other
/// parameters and the arrays' per-element framing (see [`check_size`]).
pub(crate) const MAX_BATCH_BYTES: usize = (1 << 30) - (1 << 20);

/// Serializes a body (or headers, as `field` says) once, before any SQL
/// runs, refusing a NUL character, which PostgreSQL cannot store.
pub(crate) fn to_json<T: Serialize + ?Sized>(
    value: &T,
    field: &'static str,
) -> Result<RawJson, Error> {
    let raw = serde_json::value::to_raw_value(value).map_err(Error::Serialize)?;
    if has_nul_escape(raw.get().as_bytes()) {
        return Err(Error::unstorable(None, field));
    }
    Ok(RawJson::from_raw(raw))
}

/// Whether JSON text holds `\u0000`, which `jsonb` refuses. A backslash in
/// a string is itself escaped (`\\`), so each escape is stepped over whole:
/// `\\u0000` (a backslash, then the text `u0000`) is no NUL.
pub(crate) fn has_nul_escape(text: &[u8]) -> bool {
    let mut i = 0;
    while let Some(p) = text[i..].iter().position(|&b| b == b'\\') {
        let at = i + p;
        match text.get(at + 1) {
            Some(b'u') if text.get(at + 2..at + 6) == Some(b"0000") => return true,
            Some(_) => i = at + 2,
            None => return false,
        }
    }
    false
}

/// Refuses a batch whose JSON would not fit one Bind message: a typed error
/// before anything is sent or allocated for it.
fn check_size(bytes: usize, n: usize) -> Result<(), Error> {
    if bytes > MAX_BATCH_BYTES {
        return Err(Error::InvalidArgument(format!(
            "a batch of {n} messages takes {bytes} bytes of JSON or more, over the \
             {MAX_BATCH_BYTES} one statement can carry (PostgreSQL's 1 GiB message limit): \
             send it in smaller batches"
        )));
    }
    Ok(())
}

/// The headers of a single send: `headers_each` is for batches.
pub(crate) fn one_headers(opts: &SendOptions) -> Result<Option<RawJson>, Error> {
    if opts.headers_each.is_some() {
        return Err(Error::InvalidArgument(
            "headers_each is for batch sends; a single send takes headers".into(),
        ));
    }
    opts.headers
        .as_ref()
        .map(|h| to_json(h, "headers"))
        .transpose()
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
    /// Serializes each of `values` (the `field` of each message: bodies or
    /// headers), refusing a NUL character (naming the message) and a batch
    /// past [`MAX_BATCH_BYTES`] (with `before`, the bytes of the batch's
    /// other JSON). The buffer grows as the texts come: their sizes are
    /// unknown until serialized, and one large element says nothing of the
    /// others.
    fn new<T: Serialize>(values: &[T], field: &'static str, before: usize) -> Result<Self, Error> {
        let mut batch = JsonBatch {
            text: Vec::new(),
            ends: Vec::with_capacity(values.len()),
        };
        for (i, v) in values.iter().enumerate() {
            let start = batch.text.len();
            serde_json::to_writer(&mut batch.text, v).map_err(Error::Serialize)?;
            if has_nul_escape(&batch.text[start..]) {
                return Err(Error::unstorable(Some(i), field));
            }
            check_size(before + batch.text.len(), values.len())?;
            batch.ends.push(batch.text.len());
        }
        Ok(batch)
    }

    /// The same JSON text `n` times (a batch's common headers), serialized
    /// once.
    fn repeated<T: Serialize>(value: &T, n: usize) -> Result<Self, Error> {
        let one = serde_json::to_vec(value).map_err(Error::Serialize)?;
        if has_nul_escape(&one) {
            return Err(Error::unstorable(None, "headers"));
        }
        check_size(one.len().saturating_mul(n), n)?;
        let mut batch = JsonBatch {
            text: Vec::with_capacity(one.len() * n),
            ends: Vec::with_capacity(n),
        };
        for _ in 0..n {
            batch.text.extend_from_slice(&one);
            batch.ends.push(batch.text.len());
        }
        Ok(batch)
    }

    /// The bodies and headers of a batch send, checked (size; the same
    /// headers for each message, or one per message, at most one of the two)
    /// and serialized; None for an empty batch.
    pub(crate) fn bodies_and_headers<T: Serialize>(
        bodies: &[T],
        opts: &SendOptions,
        trace: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Option<(JsonBatch, Option<JsonBatch>)>, Error> {
        if bodies.is_empty() {
            return Ok(None);
        }
        let n = bodies.len();
        check_batch(n, "batch of")?;
        let with_trace = |h: Option<&serde_json::Value>| crate::pgmq::trace::merged(h, trace);
        let headers = match (&opts.headers, &opts.headers_each) {
            (None, None) => with_trace(None)
                .map(|h| JsonBatch::repeated(&h, n))
                .transpose()?,
            (Some(h), None) => match with_trace(Some(h)) {
                Some(h) => Some(JsonBatch::repeated(&h, n)?),
                None => None,
            },
            (None, Some(each)) if each.len() == n && trace.is_empty() => {
                Some(JsonBatch::new(each, "headers", 0)?)
            }
            (None, Some(each)) if each.len() == n => {
                let each: Vec<_> = each.iter().filter_map(|h| with_trace(Some(h))).collect();
                Some(JsonBatch::new(&each, "headers", 0)?)
            }
            (None, Some(each)) => {
                return Err(Error::InvalidArgument(format!(
                    "{} headers for {n} messages",
                    each.len()
                )))
            }
            (Some(_), Some(_)) => {
                return Err(Error::InvalidArgument(
                    "headers and headers_each are both set; give one".into(),
                ))
            }
        };
        let before = headers.as_ref().map_or(0, |h| h.text.len());
        Ok(Some((JsonBatch::new(bodies, "body", before)?, headers)))
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

impl<E: Executor> Pgmq<E> {
    /// Runs a batch send, one statement of the pair `(after, at)` as the
    /// delay says (seconds from now, or a time: `Delay::arg`), with the
    /// arguments `lead`, then the batch's bodies and headers as `jsonb[]`
    /// ([`JsonBatch::bodies_and_headers`], with the current trace context)
    /// and its delay, then `tail`; returns its rows. An empty batch sends
    /// nothing and returns none.
    pub(crate) async fn run_batch_send<T: Serialize>(
        &self,
        (after, at): (Stmt, Stmt),
        queue: Option<&str>,
        lead: Params<'_>,
        bodies: &[T],
        opts: &SendOptions,
        tail: Params<'_>,
    ) -> Result<Vec<Row>, Error> {
        let Some((bodies, headers)) =
            JsonBatch::bodies_and_headers(bodies, opts, &self.trace_headers())?
        else {
            return Ok(Vec::new());
        };
        let delay = opts.delay.arg("delay", after, at)?;
        let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(lead.len() + 3 + tail.len());
        params.extend_from_slice(lead);
        params.extend([&bodies as _, &headers as _, delay.value()]);
        params.extend_from_slice(tail);
        self.run(delay.stmt(), queue, &params).await
    }

    /// The trace context to merge into the headers of a send: the current
    /// one when the executor carries it ([`crate::pgmq::trace`]), else empty.
    pub(crate) fn trace_headers(&self) -> serde_json::Map<String, serde_json::Value> {
        if self.executor().trace_context() {
            crate::pgmq::trace::current()
        } else {
            serde_json::Map::new()
        }
    }

    /// One message's headers as sent: the caller's, with the current trace
    /// context merged in when the executor carries it.
    pub(crate) fn headers_json(&self, opts: &SendOptions) -> Result<Option<RawJson>, Error> {
        let trace = self.trace_headers();
        if trace.is_empty() {
            return one_headers(opts);
        }
        one_headers(opts)?;
        crate::pgmq::trace::merged(opts.headers.as_ref(), &trace)
            .as_ref()
            .map(|h| to_json(h, "headers"))
            .transpose()
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
        let body = to_json(body, "body")?;
        let headers = self.headers_json(opts)?;
        let q = queue.as_str();
        let delay = opts.delay.arg("delay", Stmt::Send, Stmt::SendAt)?;
        let rows = self
            .run(delay.stmt(), Some(q), &[&q, &body, &headers, delay.value()])
            .await?;
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
        let q = queue.as_str();
        let send = (Stmt::SendBatch, Stmt::SendBatchAt);
        let rows = self
            .run_batch_send(send, Some(q), &[&q], bodies, opts, &[])
            .await?;
        col0s::<i64>(&rows)
    }
}
