//! Reading: `pgmq.read` (optionally filtered), `pgmq.read_with_poll` and
//! `pgmq.pop`; [`ReadOptions`], what a read takes.
//!
//! Typed reads decode each message on its own ([`Decoded`]): one body that
//! does not decode never fails the batch, and a popped message is never lost.
//! Each read has a `_raw` twin that leaves bodies undecoded.

use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::conn::args::{millis, qty, secs};
use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::statements::Stmt;
use crate::pgmq::message::{decode_rows, raw_from_row, Decoded, Message, RawJson};
use crate::pgmq::queue_name::QueueName;
use crate::Pgmq;

/// How a read claims messages: for how long it hides them (`vt`), how many
/// it takes (`qty`, 1 unless set), and optionally a JSON filter on the body
/// and a server-side wait while nothing is visible.
///
/// Taken by [`read_with`](crate::Pgmq::read_with),
/// [`read_grouped`](crate::Pgmq::read_grouped) and
/// [`read_from`](crate::Pgmq::read_from) and their `_raw` twins;
/// [`read`](crate::Pgmq::read) is the short form for `vt` and `qty` alone.
/// `vt` and `max_poll` are rounded up to whole seconds, `poll_interval` to
/// whole milliseconds; `qty` is at most [`MAX_BATCH`](crate::MAX_BATCH). The filter is
/// `pgmq.read`'s (JSONB `@>`); grouped reads and `read_from` take neither a
/// filter nor (for `read_from`) a wait, and refuse one with
/// [`Error::InvalidArgument`] before any SQL runs.
///
/// ```no_run
/// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
/// use pgmq_client::ReadOptions;
/// use std::time::Duration;
/// let opts = ReadOptions::new(Duration::from_secs(30))
///     .qty(100)
///     .filter(serde_json::json!({"region": "eu"}))
///     .poll(Duration::from_secs(5), Duration::from_millis(100));
/// let batch = client.read_with::<serde_json::Value>(&q, &opts).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ReadOptions {
    /// How long the messages read stay hidden.
    pub vt: Duration,
    /// The most messages to read (default 1).
    pub qty: usize,
    /// Only messages whose body contains this JSON (`@>`).
    pub filter: Option<serde_json::Value>,
    /// While nothing is visible, wait on the server up to this long
    /// (`pgmq.read_with_poll`); None returns at once.
    pub max_poll: Option<Duration>,
    /// How often the server looks again while waiting (default 100 ms).
    pub poll_interval: Duration,
}

impl ReadOptions {
    /// Reads one message and hides it for `vt`, without a filter or a wait.
    ///
    /// ```
    /// use std::time::Duration;
    /// let opts = pgmq_client::ReadOptions::new(Duration::from_secs(30));
    /// assert_eq!((opts.qty, opts.max_poll), (1, None));
    /// ```
    pub fn new(vt: Duration) -> Self {
        ReadOptions {
            vt,
            qty: 1,
            filter: None,
            max_poll: None,
            poll_interval: Duration::from_millis(100),
        }
    }

    /// Sets how many messages to read at most.
    ///
    /// ```
    /// use std::time::Duration;
    /// let opts = pgmq_client::ReadOptions::new(Duration::from_secs(30)).qty(100);
    /// assert_eq!(opts.qty, 100);
    /// ```
    pub fn qty(mut self, qty: usize) -> Self {
        self.qty = qty;
        self
    }

    /// Reads only messages whose body contains `filter` (JSONB `@>`).
    ///
    /// ```
    /// use std::time::Duration;
    /// let eu = pgmq_client::ReadOptions::new(Duration::from_secs(30))
    ///     .filter(serde_json::json!({"region": "eu"}));
    /// assert!(eu.filter.is_some());
    /// ```
    pub fn filter(mut self, filter: serde_json::Value) -> Self {
        self.filter = Some(filter);
        self
    }

    /// While nothing is visible, waits on the server up to `max_poll`,
    /// looking again every `interval`. The connection is held for the wait.
    ///
    /// ```
    /// use std::time::Duration;
    /// let opts = pgmq_client::ReadOptions::new(Duration::from_secs(30))
    ///     .poll(Duration::from_secs(5), Duration::from_millis(250));
    /// assert_eq!(opts.max_poll, Some(Duration::from_secs(5)));
    /// assert_eq!(opts.poll_interval, Duration::from_millis(250));
    /// ```
    pub fn poll(mut self, max_poll: Duration, interval: Duration) -> Self {
        self.max_poll = Some(max_poll);
        self.poll_interval = interval;
        self
    }

    /// Refuses what a read that takes no filter or no wait was given.
    pub(crate) fn refuse(&self, call: &str, poll: bool) -> Result<(), Error> {
        if self.filter.is_some() {
            return Err(Error::InvalidArgument(format!("{call} takes no filter")));
        }
        if !poll && self.max_poll.is_some() {
            return Err(Error::InvalidArgument(format!("{call} takes no poll")));
        }
        Ok(())
    }
}

fn raw_rows(rows: Vec<tokio_postgres::Row>) -> Result<Vec<Message<RawJson>>, Error> {
    rows.iter().map(raw_from_row).collect()
}

impl<E: Executor> Pgmq<E> {
    /// Reads up to `qty` visible messages and hides them for `vt`.
    ///
    /// Each message comes decoded into `T` or, when its body does not decode,
    /// as an [`Undecoded`](crate::Undecoded) holding it raw ([`Decoded`]): one
    /// bad body never fails the batch. Either way the message stays in the
    /// queue until deleted or archived, and reappears when `vt` ends.
    ///
    /// `vt` is rounded up to whole seconds (500 ms hides for 1 s); `qty` is
    /// at most [`MAX_BATCH`](crate::MAX_BATCH). For a filter or a server-side wait, see
    /// [`read_with`](Self::read_with).
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use std::time::Duration;
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// for m in client.read::<serde_json::Value>(&q, Duration::from_secs(30), 10).await? {
    ///     let m = m?; // or handle the undecodable message
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
    ) -> Result<Vec<Decoded<T>>, Error> {
        let rows = self.read_rows(queue, vt, qty, None).await?;
        decode_rows(&rows)
    }

    /// Like [`read`](Self::read), bodies left undecoded.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// use std::time::Duration;
    /// for m in client.read_raw(&q, Duration::from_secs(30), 10).await? {
    ///     println!("{}: {} bytes", m.msg_id, m.body.get().len());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn read_raw(
        &self,
        queue: &QueueName,
        vt: Duration,
        qty: usize,
    ) -> Result<Vec<Message<RawJson>>, Error> {
        raw_rows(self.read_rows(queue, vt, qty, None).await?)
    }

    /// Reads as [`ReadOptions`] say: `qty` messages hidden for `vt`,
    /// optionally only those whose body contains a filter, optionally
    /// waiting on the server while nothing is visible
    /// (`pgmq.read_with_poll`). Decoded per message as [`read`](Self::read)
    /// does.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::ReadOptions;
    /// use std::time::Duration;
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// let opts = ReadOptions::new(Duration::from_secs(30))
    ///     .qty(10)
    ///     .filter(serde_json::json!({"region": "eu"}))
    ///     .poll(Duration::from_secs(5), Duration::from_millis(100));
    /// for m in client.read_with::<serde_json::Value>(&q, &opts).await? {
    ///     println!("{}", m?.body);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn read_with<T: DeserializeOwned>(
        &self,
        queue: &QueueName,
        opts: &ReadOptions,
    ) -> Result<Vec<Decoded<T>>, Error> {
        let rows = self.read_with_rows(queue, opts).await?;
        decode_rows(&rows)
    }

    /// Like [`read_with`](Self::read_with), bodies left undecoded.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::ReadOptions;
    /// use std::time::Duration;
    /// let opts = ReadOptions::new(Duration::from_secs(30)).qty(10);
    /// for m in client.read_with_raw(&q, &opts).await? {
    ///     println!("{}: {}", m.msg_id, m.body.get());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn read_with_raw(
        &self,
        queue: &QueueName,
        opts: &ReadOptions,
    ) -> Result<Vec<Message<RawJson>>, Error> {
        raw_rows(self.read_with_rows(queue, opts).await?)
    }

    async fn read_with_rows(
        &self,
        queue: &QueueName,
        opts: &ReadOptions,
    ) -> Result<Vec<tokio_postgres::Row>, Error> {
        match opts.max_poll {
            None => {
                self.read_rows(queue, opts.vt, opts.qty, opts.filter.as_ref())
                    .await
            }
            Some(max_poll) => self.poll_rows(queue, opts, max_poll).await,
        }
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

    #[tracing::instrument(name = "pgmq.read_with_poll", skip_all, fields(queue = %queue, qty = opts.qty))]
    async fn poll_rows(
        &self,
        queue: &QueueName,
        opts: &ReadOptions,
        max_poll: Duration,
    ) -> Result<Vec<tokio_postgres::Row>, Error> {
        let q = queue.as_str();
        let vt = secs(opts.vt, "visibility timeout")?;
        let n = self::qty(opts.qty)?;
        let max_poll = secs(max_poll, "max_poll")?;
        let interval = millis(opts.poll_interval, "poll_interval")?;
        let empty = serde_json::json!({});
        let f = postgres_types::Json(opts.filter.as_ref().unwrap_or(&empty));
        self.run(
            Stmt::ReadWithPoll,
            Some(q),
            &[&q, &vt, &n, &max_poll, &interval, &f],
        )
        .await
    }

    /// Reads and deletes up to `qty` messages at once (at-most-once delivery).
    ///
    /// The messages are gone from the queue when this returns, so none is
    /// dropped here: a body that does not decode into `T` comes back as an
    /// [`Undecoded`](crate::Undecoded) holding the message raw, next to the
    /// decoded ones. `qty` is at most [`MAX_BATCH`](crate::MAX_BATCH).
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName, dlq: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// for m in client.pop::<serde_json::Value>(&q, 10).await? {
    ///     match m {
    ///         Ok(m) => println!("{}", m.body),
    ///         // The only copy left: keep it somewhere.
    ///         Err(bad) => { client.send(&dlq, &bad.message.body).await?; }
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn pop<T: DeserializeOwned>(
        &self,
        queue: &QueueName,
        qty: usize,
    ) -> Result<Vec<Decoded<T>>, Error> {
        let rows = self.pop_rows(queue, qty).await?;
        decode_rows(&rows)
    }

    /// Like [`pop`](Self::pop), bodies left undecoded.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// for m in client.pop_raw(&q, 10).await? {
    ///     println!("{}: {}", m.msg_id, m.body.get());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn pop_raw(
        &self,
        queue: &QueueName,
        qty: usize,
    ) -> Result<Vec<Message<RawJson>>, Error> {
        raw_rows(self.pop_rows(queue, qty).await?)
    }

    #[tracing::instrument(name = "pgmq.pop", skip_all, fields(queue = %queue, qty = qty))]
    async fn pop_rows(
        &self,
        queue: &QueueName,
        qty: usize,
    ) -> Result<Vec<tokio_postgres::Row>, Error> {
        let q = queue.as_str();
        let n = self::qty(qty)?;
        self.run(Stmt::Pop, Some(q), &[&q, &n]).await
    }
}
