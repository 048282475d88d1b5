//! `Message<T>`, raw JSON bodies, headers, delays and send options.

use std::error::Error as StdError;
use std::fmt;

use bytes::{BufMut, BytesMut};
use chrono::{DateTime, Utc};
use postgres_types::{FromSql, IsNull, ToSql, Type};
use serde::de::DeserializeOwned;
use tokio_postgres::Row;

use crate::conn::args::secs;
use crate::conn::error::Error;
use crate::conn::rows::{col, payload_free};
use crate::conn::statements::Stmt;

/// A message read from a queue.
///
/// `T` is the body type; `serde_json::Value` reads anything, and
/// [`RawJson`] keeps the body undecoded (what the worker runtime reads, so
/// that one malformed body does not fail a whole batch).
///
/// ```
/// # use pgmq_client::{Message, RawJson};
/// # fn f(m: Message<RawJson>) -> Result<(), pgmq_client::Error> {
/// #[derive(serde::Deserialize)]
/// struct Order { id: u64 }
/// let typed: Message<Order> = m.decode()?;
/// println!("order {} (read {} times)", typed.body.id, typed.read_ct);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Message<T = serde_json::Value> {
    /// The message id, unique within its queue.
    pub msg_id: i64,
    /// How many times the message was read (1 on first delivery).
    pub read_ct: i32,
    /// When it was sent, on the database clock.
    pub enqueued_at: DateTime<Utc>,
    /// When it was last read, on the database clock (None if never read, e.g. from `pop`).
    pub last_read_at: Option<DateTime<Utc>>,
    /// When it becomes visible again.
    pub vt: DateTime<Utc>,
    /// The body.
    pub body: T,
    /// The headers sent with it (a JSON object), if any.
    ///
    /// Headers nested deeper than serde_json's recursion limit (128 levels)
    /// cannot be a `serde_json::Value`; rather than failing the whole read
    /// (and every message after it in the queue), they are given as a JSON
    /// string holding their text.
    pub headers: Option<serde_json::Value>,
}

impl Message<RawJson> {
    /// Decodes the body into `T`; the message is consumed either way (see
    /// [`try_decode`](Self::try_decode) to keep it on failure).
    pub fn decode<T: DeserializeOwned>(self) -> Result<Message<T>, Error> {
        self.try_decode().map_err(Error::from)
    }

    /// Decodes the body into `T`, or gives the message back untouched.
    ///
    /// ```
    /// # use pgmq_client::{Message, RawJson};
    /// # fn f(m: Message<RawJson>) {
    /// match m.try_decode::<u64>() {
    ///     Ok(m) => println!("{}", m.body),
    ///     Err(bad) => println!("{bad}; {} bytes kept", bad.message.body.get().len()),
    /// }
    /// # }
    /// ```
    pub fn try_decode<T: DeserializeOwned>(self) -> Result<Message<T>, Undecoded> {
        match self.body.decode() {
            Ok(body) => Ok(self.with_body(body)),
            Err(e) => Err(Undecoded {
                message: self,
                error: std::sync::Arc::new(payload_free(&e)),
            }),
        }
    }
}

impl<T> Message<T> {
    /// A message as a first read would deliver it, for tests of code that
    /// handles messages (a worker's handler, say) without a database: id
    /// `msg_id`, `read_ct` 1, enqueued and read now, visible again in 30 s,
    /// no headers. Change fields with the `with_*` methods.
    ///
    /// ```
    /// use pgmq_client::Message;
    /// let m = Message::new(7, serde_json::json!({"to": "ada@example.com"}))
    ///     .with_read_ct(2)
    ///     .with_headers(serde_json::json!({"tenant": "a"}));
    /// assert_eq!((m.msg_id, m.read_ct), (7, 2));
    /// assert_eq!(m.header("tenant"), Some(&serde_json::json!("a")));
    /// ```
    pub fn new(msg_id: i64, body: T) -> Self {
        let now = Utc::now();
        Message {
            msg_id,
            read_ct: 1,
            enqueued_at: now,
            last_read_at: Some(now),
            vt: now + chrono::Duration::seconds(30),
            body,
            headers: None,
        }
    }

    /// The same message with these headers.
    pub fn with_headers(mut self, headers: serde_json::Value) -> Self {
        self.headers = Some(headers);
        self
    }

    /// The same message with this delivery count.
    pub fn with_read_ct(mut self, read_ct: i32) -> Self {
        self.read_ct = read_ct;
        self
    }

    /// The same message with another body.
    pub fn with_body<U>(self, body: U) -> Message<U> {
        Message {
            msg_id: self.msg_id,
            read_ct: self.read_ct,
            enqueued_at: self.enqueued_at,
            last_read_at: self.last_read_at,
            vt: self.vt,
            body,
            headers: self.headers,
        }
    }

    /// A header value by key, if the headers are an object holding it.
    ///
    /// ```
    /// use pgmq_client::Message;
    /// let m = Message::new(1, ()).with_headers(serde_json::json!({"tenant": "a"}));
    /// assert_eq!(m.header("tenant"), Some(&serde_json::json!("a")));
    /// assert_eq!(m.header("trace"), None);
    /// ```
    pub fn header(&self, key: &str) -> Option<&serde_json::Value> {
        self.headers.as_ref()?.get(key)
    }

    /// The headers decoded into a type of yours: None when the message has
    /// no headers, [`Error::DeserializeHeaders`] when they do not fit `H`
    /// (its text names serde's reason, never the headers' values).
    ///
    /// ```
    /// use pgmq_client::Message;
    ///
    /// #[derive(serde::Deserialize, Debug, PartialEq)]
    /// struct Meta {
    ///     tenant: String,
    ///     #[serde(default)]
    ///     priority: u8,
    /// }
    ///
    /// let m = Message::new(1, "body").with_headers(serde_json::json!({"tenant": "acme"}));
    /// let meta: Option<Meta> = m.headers_as()?;
    /// assert_eq!(meta, Some(Meta { tenant: "acme".into(), priority: 0 }));
    /// assert_eq!(Message::new(2, "body").headers_as::<Meta>()?, None);
    /// # Ok::<(), pgmq_client::Error>(())
    /// ```
    pub fn headers_as<H: DeserializeOwned>(&self) -> Result<Option<H>, Error> {
        let Some(headers) = &self.headers else {
            return Ok(None);
        };
        H::deserialize(headers)
            .map(Some)
            .map_err(|e| Error::DeserializeHeaders {
                msg_id: self.msg_id,
                source: payload_free(&e),
            })
    }
}

/// Decodes a row of `pgmq.message_record` with the body kept raw; a column of
/// an unexpected type or NULL is [`Error::UnexpectedRow`].
pub(crate) fn raw_from_row(row: &Row) -> Result<Message<RawJson>, Error> {
    Ok(Message {
        msg_id: col(row, 0)?,
        read_ct: col(row, 1)?,
        enqueued_at: col(row, 2)?,
        last_read_at: col(row, 3)?,
        vt: col(row, 4)?,
        body: col::<Option<RawJson>>(row, 5)?.unwrap_or_else(RawJson::null),
        headers: col::<Option<RawJson>>(row, 6)?.map(headers_value),
    })
}

/// Headers as a JSON value; text serde_json cannot represent (nested past its
/// recursion limit) becomes a JSON string holding the text, so that one
/// message cannot fail a whole batch.
fn headers_value(raw: RawJson) -> serde_json::Value {
    match serde_json::from_str(raw.get()) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "message headers kept as text: they do not decode into a JSON value");
            serde_json::Value::String(raw.0.into())
        }
    }
}

/// Decodes rows of `pgmq.message_record` into typed messages, one result
/// per message: a body that does not decode into `T` is given back raw.
pub(crate) fn decode_rows<T: DeserializeOwned>(rows: &[Row]) -> Result<Vec<Decoded<T>>, Error> {
    rows.iter()
        .map(|r| Ok(raw_from_row(r)?.try_decode()))
        .collect()
}

/// One message of a typed read or pop: decoded, or given back raw.
///
/// Typed reads ([`read`](crate::Pgmq::read), [`pop`](crate::Pgmq::pop), the
/// grouped reads) decode each message on its own, so one body that does not
/// decode into `T` never fails the others. `?` turns an [`Undecoded`] into
/// [`Error::Deserialize`].
///
/// ```no_run
/// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
/// use std::time::Duration;
/// #[derive(serde::Deserialize)]
/// struct Order { id: u64 }
/// for m in client.read::<Order>(&q, Duration::from_secs(30), 10).await? {
///     match m {
///         Ok(m) => println!("order {}", m.body.id),
///         // Still in the queue; park it where a person can look at it.
///         Err(bad) => { client.archive(&q, bad.message.msg_id).await?; }
///     }
/// }
/// # Ok(()) }
/// ```
pub type Decoded<T> = Result<Message<T>, Undecoded>;

/// A message whose body did not decode into the requested type, given back
/// whole with its body undecoded, so nothing is lost (after a
/// [`pop`](crate::Pgmq::pop) this is the only copy left).
///
/// Its `Display` gives the message id and serde's reason without any value
/// from the body, so it can be logged.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Undecoded {
    /// The message, body kept as JSON text.
    pub message: Message<RawJson>,
    /// Why it did not decode (serde's reason and position; the body's values
    /// are blanked out).
    pub error: std::sync::Arc<serde_json::Error>,
}

impl fmt::Display for Undecoded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "message {} does not deserialize into the requested type: {}",
            self.message.msg_id, self.error
        )
    }
}

impl StdError for Undecoded {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.error)
    }
}

/// The message is dropped; only its id and the reason are kept.
impl From<Undecoded> for Error {
    fn from(u: Undecoded) -> Self {
        Error::Deserialize {
            msg_id: u.message.msg_id,
            source: payload_free(&u.error),
        }
    }
}

/// A JSON body kept as text, not yet decoded.
///
/// Reading into `RawJson` costs one copy of the bytes; decode later with
/// [`RawJson::decode`] (or [`Message::decode`]).
#[derive(Clone, PartialEq, Eq)]
pub struct RawJson(Box<str>);

impl RawJson {
    /// The JSON text.
    pub fn get(&self) -> &str {
        &self.0
    }

    /// Decodes the text into `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.0)
    }

    /// Wraps JSON text; returns an error when it is not valid JSON.
    pub fn from_text(text: impl Into<String>) -> Result<Self, serde_json::Error> {
        let s = text.into();
        serde_json::from_str::<serde::de::IgnoredAny>(&s)?;
        Ok(RawJson(s.into_boxed_str()))
    }

    pub(crate) fn null() -> Self {
        RawJson("null".into())
    }

    pub(crate) fn from_raw(raw: Box<serde_json::value::RawValue>) -> Self {
        RawJson(raw.into())
    }
}

impl ToSql for RawJson {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        if *ty == Type::JSONB {
            out.put_u8(1);
        }
        out.put_slice(self.0.as_bytes());
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON
    }

    postgres_types::to_sql_checked!();
}

/// Serializes as the JSON text itself, unchanged: forwarding a raw body
/// (`send(&q, &message.body)`) keeps it exactly, numbers of any precision
/// included.
///
/// ```
/// let raw = pgmq_client::RawJson::from_text(r#"{"amount": 12345678901234567890.123456789}"#)?;
/// assert_eq!(serde_json::to_string(&raw)?, r#"{"amount": 12345678901234567890.123456789}"#);
/// # Ok::<(), serde_json::Error>(())
/// ```
impl serde::Serialize for RawJson {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let raw: &serde_json::value::RawValue =
            serde_json::from_str(&self.0).map_err(serde::ser::Error::custom)?;
        raw.serialize(s)
    }
}

impl fmt::Debug for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RawJson({} bytes)", self.0.len())
    }
}

impl<'a> FromSql<'a> for RawJson {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn StdError + Sync + Send>> {
        let text = if *ty == Type::JSONB {
            match raw.split_first() {
                Some((1, rest)) => rest,
                _ => return Err("unsupported JSONB encoding version".into()),
            }
        } else {
            raw
        };
        Ok(RawJson(std::str::from_utf8(text)?.into()))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON
    }
}

/// When a message becomes visible: this long from now, or at a point in
/// time. The one delay type of this crate: a send's delay
/// ([`SendOptions::delay`]) and a new visibility timeout
/// ([`set_vt`](crate::Pgmq::set_vt), [`set_vt_batch`](crate::Pgmq::set_vt_batch)).
///
/// A `Duration` is rounded up to whole seconds, as PGMQ takes them (500 ms
/// is 1 s; zero is at once), and may be at most
/// [`MAX_SECONDS`](crate::MAX_SECONDS): longer is refused with
/// [`Error::InvalidArgument`] before any SQL runs. `Duration` and
/// `DateTime<Utc>` convert into it, so calls take either.
///
/// ```
/// use pgmq_client::Delay;
/// use std::time::Duration;
///
/// assert_eq!(Delay::default(), Delay::NONE);
/// assert_eq!(Delay::from(Duration::from_secs(30)), Delay::After(Duration::from_secs(30)));
/// let at = chrono::Utc::now() + chrono::Duration::minutes(5);
/// assert_eq!(Delay::from(at), Delay::At(at));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Delay {
    /// This long from now (rounded up to whole seconds; zero: at once).
    After(std::time::Duration),
    /// At this time (database clock).
    At(DateTime<Utc>),
}

impl Delay {
    /// At once: no delay.
    ///
    /// ```
    /// assert_eq!(pgmq_client::Delay::NONE, pgmq_client::Delay::After(std::time::Duration::ZERO));
    /// ```
    pub const NONE: Delay = Delay::After(std::time::Duration::ZERO);

    /// The argument of a statement that comes in two forms, one taking
    /// whole seconds from now (`after`) and one a time (`at`): which of the
    /// two runs, and its argument. `what` names the delay in an error (a
    /// delay longer than PGMQ's `integer` seconds).
    pub(crate) fn arg(self, what: &str, after: Stmt, at: Stmt) -> Result<DelayArg, Error> {
        Ok(match self {
            Delay::After(d) => DelayArg::Secs(after, secs(d, what)?),
            Delay::At(t) => DelayArg::At(at, t),
        })
    }
}

/// A [`Delay`] as a statement's argument ([`Delay::arg`]).
pub(crate) enum DelayArg {
    Secs(Stmt, i32),
    At(Stmt, DateTime<Utc>),
}

impl DelayArg {
    /// The statement to run.
    pub(crate) fn stmt(&self) -> Stmt {
        match self {
            DelayArg::Secs(s, _) | DelayArg::At(s, _) => *s,
        }
    }

    /// The argument to bind.
    pub(crate) fn value(&self) -> &(dyn ToSql + Sync) {
        match self {
            DelayArg::Secs(_, secs) => secs,
            DelayArg::At(_, t) => t,
        }
    }
}

/// [`Delay::NONE`].
impl Default for Delay {
    fn default() -> Self {
        Delay::NONE
    }
}

impl From<std::time::Duration> for Delay {
    fn from(d: std::time::Duration) -> Self {
        Delay::After(d)
    }
}

impl From<DateTime<Utc>> for Delay {
    fn from(t: DateTime<Utc>) -> Self {
        Delay::At(t)
    }
}

/// Options of a send, single or batch, to a queue or a topic: a delay and
/// headers. The default sends at once, without headers.
///
/// Headers are given once for every message of the call
/// ([`headers`](Self::headers), or [`headers_from`](Self::headers_from) for
/// a type of yours), or, for a batch, one object per message
/// ([`headers_each`](Self::headers_each)); setting both, or `headers_each`
/// on a single send, is refused with [`Error::InvalidArgument`] before any
/// SQL runs.
///
/// ```
/// use pgmq_client::SendOptions;
/// use std::time::Duration;
///
/// // One message, or every message of a batch: the same headers.
/// let opts = SendOptions::new()
///     .delay(Duration::from_secs(30))
///     .headers(serde_json::json!({"trace_id": "abc"}));
/// # let _ = opts;
/// // A batch of two, each with its own headers.
/// let opts = SendOptions::new().headers_each(vec![
///     serde_json::json!({"x-pgmq-group": "a"}),
///     serde_json::json!({"x-pgmq-group": "b"}),
/// ]);
/// # let _ = opts;
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct SendOptions {
    /// When the messages become visible.
    pub delay: Delay,
    /// Headers (a JSON object stored beside the body) of every message sent.
    pub headers: Option<serde_json::Value>,
    /// A batch's headers, one per message in the order of the bodies.
    pub headers_each: Option<Vec<serde_json::Value>>,
}

impl SendOptions {
    /// Sends at once, without headers.
    ///
    /// ```
    /// let opts = pgmq_client::SendOptions::new();
    /// assert_eq!(opts.delay, pgmq_client::Delay::NONE);
    /// assert!(opts.headers.is_none() && opts.headers_each.is_none());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the delay (a `Duration`, a `DateTime<Utc>` or a [`Delay`]).
    ///
    /// ```
    /// use pgmq_client::{Delay, SendOptions};
    /// use std::time::Duration;
    /// let opts = SendOptions::new().delay(Duration::from_secs(60));
    /// assert_eq!(opts.delay, Delay::After(Duration::from_secs(60)));
    /// ```
    pub fn delay(mut self, delay: impl Into<Delay>) -> Self {
        self.delay = delay.into();
        self
    }

    /// Sets the headers of every message sent.
    ///
    /// ```
    /// let opts = pgmq_client::SendOptions::new().headers(serde_json::json!({"tenant": "acme"}));
    /// assert_eq!(opts.headers, Some(serde_json::json!({"tenant": "acme"})));
    /// ```
    pub fn headers(mut self, headers: serde_json::Value) -> Self {
        self.headers = Some(headers);
        self
    }

    /// Sets the headers of every message sent from a type of yours: the
    /// sending side of [`Message::headers_as`]. Serialized at once, so a
    /// value that is not JSON is [`Error::Serialize`] here, before any send.
    ///
    /// ```
    /// use pgmq_client::SendOptions;
    ///
    /// #[derive(serde::Serialize)]
    /// struct Meta {
    ///     tenant: String,
    ///     priority: u8,
    /// }
    ///
    /// let opts = SendOptions::new().headers_from(&Meta { tenant: "acme".into(), priority: 2 })?;
    /// assert_eq!(opts.headers, Some(serde_json::json!({"tenant": "acme", "priority": 2})));
    /// # Ok::<(), pgmq_client::Error>(())
    /// ```
    pub fn headers_from<H: serde::Serialize + ?Sized>(self, headers: &H) -> Result<Self, Error> {
        let headers = serde_json::to_value(headers).map_err(Error::Serialize)?;
        Ok(self.headers(headers))
    }

    /// Sets a batch's headers, one per message (as many as the bodies).
    ///
    /// ```
    /// use serde_json::json;
    /// let opts = pgmq_client::SendOptions::new().headers_each(vec![json!({"i": 0}), json!({"i": 1})]);
    /// assert_eq!(opts.headers_each.map(|h| h.len()), Some(2));
    /// ```
    pub fn headers_each(mut self, headers: Vec<serde_json::Value>) -> Self {
        self.headers_each = Some(headers);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_json_reads_jsonb_and_json() {
        let mut jsonb = vec![1u8];
        jsonb.extend_from_slice(br#"{"a":1}"#);
        let r = RawJson::from_sql(&Type::JSONB, &jsonb).unwrap();
        assert_eq!(r.get(), r#"{"a":1}"#);
        let v: serde_json::Value = r.decode().unwrap();
        assert_eq!(v["a"], 1);
        let r = RawJson::from_sql(&Type::JSON, br#"[1,2]"#).unwrap();
        assert_eq!(r.get(), "[1,2]");
        assert!(RawJson::from_sql(&Type::JSONB, &[2, b'1']).is_err());
        assert!(RawJson::from_text("{nope").is_err());
    }

    #[test]
    fn delay_from_duration() {
        assert_eq!(Delay::from(std::time::Duration::ZERO), Delay::NONE);
        assert_eq!(
            Delay::from(std::time::Duration::from_millis(2500)),
            Delay::After(std::time::Duration::from_millis(2500))
        );
    }

    #[test]
    fn headers_decode_into_a_type_or_fail_without_their_values() {
        #[derive(Debug, PartialEq, serde::Deserialize)]
        struct H {
            n: u32,
        }
        let m = Message::new(9, ()).with_headers(serde_json::json!({"n": 3}));
        assert_eq!(m.headers_as::<H>().unwrap(), Some(H { n: 3 }));
        assert_eq!(Message::new(9, ()).headers_as::<H>().unwrap(), None);
        let bad = Message::new(9, ()).with_headers(serde_json::json!({"n": "secret-value"}));
        let e = bad.headers_as::<H>().unwrap_err();
        assert!(
            matches!(e, Error::DeserializeHeaders { msg_id: 9, .. }),
            "{e:?}"
        );
        assert!(!e.to_string().contains("secret-value"), "{e}");
        assert!(!format!("{e:?}").contains("secret-value"), "{e:?}");
    }

    #[test]
    fn headers_from_a_type_or_a_serialize_error() {
        #[derive(serde::Serialize)]
        struct H {
            n: u32,
        }
        let opts = SendOptions::new().headers_from(&H { n: 3 }).unwrap();
        assert_eq!(opts.headers, Some(serde_json::json!({"n": 3})));
        // A map with keys that are not strings is not JSON.
        let not_json = std::collections::BTreeMap::from([((1, 2), 3)]);
        let e = SendOptions::new().headers_from(&not_json).unwrap_err();
        assert!(matches!(e, Error::Serialize(_)), "{e:?}");
    }

    #[test]
    fn decode_failure_is_typed() {
        let m = Message {
            msg_id: 7,
            read_ct: 1,
            enqueued_at: Utc::now(),
            last_read_at: None,
            vt: Utc::now(),
            body: RawJson::from_text("null").unwrap(),
            headers: None,
        };
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct S {
            a: u32,
        }
        let e = m.decode::<S>().unwrap_err();
        assert!(matches!(e, Error::Deserialize { msg_id: 7, .. }));
    }
}
