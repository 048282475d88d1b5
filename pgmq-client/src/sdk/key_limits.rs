//! Claims under a limit per key: each message's key is read from its
//! headers or its body, and a key may have at most N claims running at once
//! and take at most R claims per second, across every process that reads
//! the queue with the same [`KeyLimit`].
//!
//! `pgmq_sdk.read_key_limited` does it in one call: it finds the keys at a
//! limit, reads the first visible messages whose key is not one of them
//! (FOR UPDATE SKIP LOCKED, as `pgmq.read`), tries a transaction advisory
//! lock on each of their keys (passing over keys another claim holds, never
//! waiting), and claims each key's messages that fit under its limit. The
//! messages of a key at its limit stay in the queue unchanged, for a later
//! claim: they never stand in front of other keys' messages, and are never
//! claimed to be put back. A claim counts as running the way a
//! [`FleetLimit`]'s does: while its message is in the queue with the same
//! delivery and a visibility timeout still ahead, so a killed process's
//! places come back within its visibility timeout.
//!
//! A message without the key (no such header, no such field, a JSON
//! `null`) is not limited. Keys are compared as text: the JSON string
//! `"7"` and the number `7` are one key.

use crate::conn::args::{qty, secs};
use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::statements::Stmt;
use crate::pgmq::message::{raw_from_row, Message, RawJson};
use crate::pgmq::queue_name::QueueName;
use crate::pgmq::read::ReadOptions;
use crate::sdk::limits::FleetLimit;
use crate::Pgmq;

const FEATURE: &str = "a limit per key";

/// The most fields a key's path may name.
pub const MAX_KEY_PATH: usize = 16;

/// Where a message's key is: a path of fields (or array positions) into its
/// headers or its body, read with PostgreSQL's `#>>` operator. The path is
/// passed as a parameter, never written into SQL.
///
/// ```
/// use pgmq_client::KeyFrom;
/// let by_customer = KeyFrom::header("customer").unwrap();
/// let by_account = KeyFrom::body(["account", "id"]).unwrap();
/// assert_eq!(by_account.path(), ["account", "id"]);
/// assert!(KeyFrom::body(Vec::<String>::new()).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyFrom {
    /// A path into the message's headers.
    Headers(Vec<String>),
    /// A path into the message's body.
    Body(Vec<String>),
}

impl KeyFrom {
    /// The key is the header `name` (a top-level field of the headers).
    pub fn header(name: impl Into<String>) -> Result<Self, Error> {
        Self::checked(KeyFrom::Headers(vec![name.into()]))
    }

    /// The key is the body's value at `path` (`["account", "id"]` is
    /// `message -> 'account' ->> 'id'`; a number names an array position).
    pub fn body<I, S>(path: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::checked(KeyFrom::Body(path.into_iter().map(Into::into).collect()))
    }

    /// The path into the headers or the body.
    pub fn path(&self) -> &[String] {
        match self {
            KeyFrom::Headers(p) | KeyFrom::Body(p) => p,
        }
    }

    /// Whether the path is into the headers.
    pub fn in_headers(&self) -> bool {
        matches!(self, KeyFrom::Headers(_))
    }

    /// Refuses an empty path, an empty field name, a NUL byte, or a path of
    /// more than [`MAX_KEY_PATH`] fields.
    pub fn check(&self) -> Result<(), Error> {
        let p = self.path();
        if p.is_empty() || p.len() > MAX_KEY_PATH {
            return Err(Error::InvalidArgument(format!(
                "a key's path has {} fields: give 1 to {MAX_KEY_PATH}",
                p.len()
            )));
        }
        if p.iter().any(|f| f.is_empty() || f.contains('\0')) {
            return Err(Error::InvalidArgument(
                "a key's path has an empty field or a NUL byte".into(),
            ));
        }
        Ok(())
    }

    fn checked(self) -> Result<Self, Error> {
        self.check()?;
        Ok(self)
    }
}

/// A limit per key: where the key is, and the limit each key has, across
/// every process that reads the queue with it.
///
/// | field | meaning |
/// | --- | --- |
/// | `key` | where each message's key is ([`KeyFrom`]) |
/// | `limit` | each key's limit: `max_running`, `per_second`, `burst` as [`FleetLimit`] documents them, defaults included |
///
/// ```
/// use pgmq_client::{FleetLimit, KeyFrom, KeyLimit};
/// // At most 2 running and 10 a second per customer.
/// let limit = KeyLimit::new(
///     KeyFrom::header("customer").unwrap(),
///     FleetLimit::max_running(2).with_per_second(10.0),
/// );
/// assert!(limit.check().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct KeyLimit {
    /// Where each message's key is.
    pub key: KeyFrom,
    /// Each key's limit.
    pub limit: FleetLimit,
}

impl KeyLimit {
    /// Each key of `key` limited by `limit`.
    pub fn new(key: KeyFrom, limit: FleetLimit) -> Self {
        KeyLimit { key, limit }
    }

    /// Refuses a path [`KeyFrom::check`] refuses, a limit
    /// [`FleetLimit::check`] refuses, or a limit that limits nothing.
    ///
    /// ```
    /// use pgmq_client::{FleetLimit, KeyFrom, KeyLimit};
    /// let none = KeyLimit::new(KeyFrom::header("k").unwrap(), FleetLimit::default());
    /// assert!(none.check().is_err());
    /// ```
    pub fn check(&self) -> Result<(), Error> {
        self.key.check()?;
        self.limit.check()?;
        if !self.limit.is_limited() {
            return Err(Error::InvalidArgument(
                "a limit per key needs max_running or per_second".into(),
            ));
        }
        Ok(())
    }
}

impl<E: Executor> Pgmq<E> {
    /// Claims up to `opts.qty` visible messages as `pgmq.read` does, passing
    /// over the messages whose key is at its limit across every process
    /// reading the queue with `limit` (see the module docs); fewer, or none,
    /// when every visible message's key is at its limit. `opts.filter` and
    /// `opts.max_poll` are not supported here.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::{FleetLimit, KeyFrom, KeyLimit, QueueName, ReadOptions};
    /// use std::time::Duration;
    /// let q = QueueName::new("emails")?;
    /// let limit = KeyLimit::new(KeyFrom::header("tenant")?, FleetLimit::max_running(2));
    /// let opts = ReadOptions::new(Duration::from_secs(30)).qty(10);
    /// let msgs = client.read_key_limited_raw(&q, &limit, &opts).await?; // at most 2 a tenant
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq_sdk.read_key_limited", skip_all, fields(queue = %queue, qty = opts.qty))]
    pub async fn read_key_limited_raw(
        &self,
        queue: &QueueName,
        limit: &KeyLimit,
        opts: &ReadOptions,
    ) -> Result<Vec<Message<RawJson>>, Error> {
        limit.check()?;
        if opts.filter.is_some() || opts.max_poll.is_some() {
            return Err(Error::InvalidArgument(
                "a read limited per key takes no filter and no max_poll".into(),
            ));
        }
        let q = queue.as_str();
        let vt = secs(opts.vt, "visibility timeout")?;
        let n = qty(opts.qty)?;
        let in_headers = limit.key.in_headers();
        let path = limit.key.path();
        let l = &limit.limit;
        let max_running = l.max_running.map(|m| m as i32);
        let rows = self
            .run(
                Stmt::ReadKeyLimited,
                Some(q),
                &[
                    &q,
                    &vt,
                    &n,
                    &in_headers,
                    &path,
                    &max_running,
                    &l.per_second,
                    &l.burst(),
                ],
            )
            .await
            .map_err(|e| e.in_sdk(FEATURE))?;
        rows.iter().map(raw_from_row).collect()
    }

    /// Whether the `pgmq_sdk` schema's read under a limit per key
    /// ([`read_key_limited_raw`](Self::read_key_limited_raw)) is installed
    /// on this database: a catalog look, for a start-up check.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// if !client.key_limit_available().await? {
    ///     println!("run `pgmq install-sdk` to limit reads per key");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn key_limit_available(&self) -> Result<bool, Error> {
        self.sdk_function_present(READ_KEY_LIMITED_SIGNATURE).await
    }
}

/// The signature of `pgmq_sdk.read_key_limited`, as `to_regprocedure` takes it.
const READ_KEY_LIMITED_SIGNATURE: &str = "pgmq_sdk.read_key_limited(text, integer, integer, boolean, text[], integer, double precision, double precision)";
