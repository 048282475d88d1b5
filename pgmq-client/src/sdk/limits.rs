//! Reads under a fleet-wide limit: at most N messages of a queue running
//! at once, and at most R claims per second, across every process that
//! reads the queue with the same [`FleetLimit`].
//!
//! The state is in the `pgmq_sdk` schema ([`crate::sdk::sdk_schema`]): a
//! row per place of the limit (`pgmq_sdk.limit_places`), holding the claim
//! that took it last. `pgmq_sdk.read_limited` locks the free places it can
//! take, passing over those another read holds (a place is free while its
//! claim's message is not in the queue with the same delivery,
//! `last_read_at`, and a visibility timeout still ahead), refills the
//! queue's token bucket (a row lock: rate-limited reads take turns), and
//! reads at most what both allow with PGMQ's own `pgmq.read`, writing each
//! claim into its place in the same transaction. A claim stops counting
//! as soon as its message is deleted, archived, retried or released (each
//! ends the delivery), and a crashed process's claims when their
//! visibility timeout passes: no process has to be told about another.
//!
//! Only reads made through [`Pgmq::read_limited_raw`] (pgmq-worker's
//! workers with a fleet limit) take part: a plain `pgmq.read` of the same
//! queue is neither counted nor limited.

use std::time::Duration;

use crate::conn::args::{qty, secs};
use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::rows::{col, first_col};
use crate::conn::statements::Stmt;
use crate::pgmq::fenced::Receipt;
use crate::pgmq::message::{raw_from_row, Message, RawJson};
use crate::pgmq::queue_name::QueueName;
use crate::pgmq::read::ReadOptions;
use crate::Pgmq;

const FEATURE: &str = "a fleet-wide limit";

/// A limit that holds across every process reading a queue with it.
///
/// | field | default | meaning |
/// | --- | --- | --- |
/// | `max_running` | none | at most this many messages claimed through limited reads and not yet acknowledged (or past their visibility timeout) |
/// | `per_second` | none | at most this many claims per second, as a token bucket |
/// | `burst` | `per_second / 10`, at least 1 | how many claims the bucket holds after an idle spell |
///
/// ```
/// use pgmq_client::FleetLimit;
/// let limit = FleetLimit::max_running(10).with_per_second(50.0);
/// assert_eq!(limit.max_running, Some(10));
/// assert_eq!(limit.burst(), Some(5.0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct FleetLimit {
    /// At most this many claims running at once across the fleet.
    pub max_running: Option<u32>,
    /// At most this many claims per second across the fleet.
    pub per_second: Option<f64>,
    /// The rate limit's bucket size (see [`FleetLimit::burst`]).
    pub burst: Option<f64>,
}

impl FleetLimit {
    /// At most `n` messages running at once across the fleet.
    pub fn max_running(n: u32) -> Self {
        FleetLimit {
            max_running: Some(n),
            ..FleetLimit::default()
        }
    }

    /// At most `rate` claims per second across the fleet.
    ///
    /// ```
    /// let limit = pgmq_client::FleetLimit::per_second(200.0);
    /// assert_eq!(limit.burst(), Some(20.0));
    /// ```
    pub fn per_second(rate: f64) -> Self {
        FleetLimit {
            per_second: Some(rate),
            ..FleetLimit::default()
        }
    }

    /// Adds a concurrency limit.
    pub fn with_max_running(mut self, n: u32) -> Self {
        self.max_running = Some(n);
        self
    }

    /// Adds a rate limit.
    pub fn with_per_second(mut self, rate: f64) -> Self {
        self.per_second = Some(rate);
        self
    }

    /// Sets the rate limit's bucket size: how many claims may be made at
    /// once after an idle spell.
    pub fn with_burst(mut self, burst: f64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// The bucket size in effect: `burst`, or a tenth of a second's worth
    /// of claims (at least 1); None without a rate limit.
    pub fn burst(&self) -> Option<f64> {
        self.per_second
            .map(|r| self.burst.unwrap_or((r / 10.0).max(1.0)))
    }

    /// Whether the limit limits anything.
    pub fn is_limited(&self) -> bool {
        self.max_running.is_some() || self.per_second.is_some()
    }

    /// Refuses a limit that cannot work: zero places, a rate that is not a
    /// positive number, a bucket smaller than one claim.
    ///
    /// ```
    /// assert!(pgmq_client::FleetLimit::max_running(0).check().is_err());
    /// assert!(pgmq_client::FleetLimit::per_second(f64::NAN).check().is_err());
    /// ```
    pub fn check(&self) -> Result<(), Error> {
        if self.max_running == Some(0) || self.max_running.is_some_and(|n| n > i32::MAX as u32) {
            return Err(Error::InvalidArgument(format!(
                "max_running is {:?}: give 1 or more",
                self.max_running
            )));
        }
        if let Some(r) = self.per_second {
            if !(r.is_finite() && r > 0.0) {
                return Err(Error::InvalidArgument(format!(
                    "per_second is {r}: give a positive rate"
                )));
            }
        }
        if let Some(b) = self.burst() {
            if !(b.is_finite() && b >= 1.0) {
                return Err(Error::InvalidArgument(format!(
                    "burst is {b}: give 1 or more"
                )));
            }
        }
        Ok(())
    }

    /// How long a reader that the rate limit turned away waits before it
    /// asks again: the time one token takes, at least 1 ms (None without a
    /// rate limit).
    pub fn token_interval(&self) -> Option<Duration> {
        self.per_second
            .map(|r| Duration::from_secs_f64(1.0 / r).max(Duration::from_millis(1)))
    }
}

impl<E: Executor> Pgmq<E> {
    /// Reads up to `opts.qty` messages as `pgmq.read` does, but no more than
    /// `limit` leaves room for across every process reading the queue with
    /// it (see the module docs); fewer, or none, when the fleet is at its
    /// limit. `opts.filter` and `opts.max_poll` are not supported here.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::{FleetLimit, QueueName, ReadOptions};
    /// use std::time::Duration;
    /// let q = QueueName::new("emails")?;
    /// let limit = FleetLimit::max_running(4);
    /// let opts = ReadOptions::new(Duration::from_secs(30)).qty(10);
    /// let msgs = client.read_limited_raw(&q, &limit, &opts).await?; // at most 4
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq_sdk.read_limited", skip_all, fields(queue = %queue, qty = opts.qty))]
    pub async fn read_limited_raw(
        &self,
        queue: &QueueName,
        limit: &FleetLimit,
        opts: &ReadOptions,
    ) -> Result<Vec<Message<RawJson>>, Error> {
        let q = queue.as_str();
        let (vt, n, max_running) = limited_args(limit, opts)?;
        let rows = self
            .run(
                Stmt::ReadLimited,
                Some(q),
                &[&q, &vt, &n, &max_running, &limit.per_second, &limit.burst()],
            )
            .await
            .map_err(|e| e.in_sdk(FEATURE))?;
        rows.iter().map(raw_from_row).collect()
    }

    /// Deletes the messages these deliveries still hold (fenced as
    /// [`delete_fenced`](Self::delete_fenced) is), then reads as
    /// [`read_limited_raw`](Self::read_limited_raw) does, in one
    /// transaction: the read sees the places the deletes freed. Returns
    /// the ids deleted and the messages claimed. One round trip and one
    /// commit where a delete and a limited read take one each: a worker
    /// under a limit of places uses it to start the next runs sooner.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, done: Vec<pgmq_client::Receipt>) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::{FleetLimit, QueueName, ReadOptions};
    /// use std::time::Duration;
    /// let q = QueueName::new("emails")?;
    /// let opts = ReadOptions::new(Duration::from_secs(30)).qty(10);
    /// let (deleted, next) = client
    ///     .ack_read_limited_raw(&q, &done, &FleetLimit::max_running(4), &opts)
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq_sdk.ack_read_limited", skip_all, fields(queue = %queue, acks = acks.len(), qty = opts.qty))]
    pub async fn ack_read_limited_raw(
        &self,
        queue: &QueueName,
        acks: &[Receipt],
        limit: &FleetLimit,
        opts: &ReadOptions,
    ) -> Result<(Vec<i64>, Vec<Message<RawJson>>), Error> {
        let q = queue.as_str();
        let (vt, n, max_running) = limited_args(limit, opts)?;
        let ids: Vec<i64> = acks.iter().map(|r| r.msg_id).collect();
        let reads: Vec<chrono::DateTime<chrono::Utc>> = acks.iter().map(|r| r.read_at).collect();
        let rows = self
            .run(
                Stmt::AckReadLimited,
                Some(q),
                &[
                    &q,
                    &ids,
                    &reads,
                    &vt,
                    &n,
                    &max_running,
                    &limit.per_second,
                    &limit.burst(),
                ],
            )
            .await
            .map_err(|e| e.in_sdk(FEATURE))?;
        let mut deleted = Vec::new();
        let mut claimed = Vec::with_capacity(rows.len());
        for row in &rows {
            if col::<bool>(row, 7)? {
                deleted.push(col::<i64>(row, 0)?);
            } else {
                claimed.push(raw_from_row(row)?);
            }
        }
        Ok((deleted, claimed))
    }

    /// Whether the `pgmq_sdk` schema's limited read
    /// ([`read_limited_raw`](Self::read_limited_raw)) is installed on this
    /// database: a catalog look that runs nothing of the schema and cannot
    /// fail for its absence, for a start-up check before reads under a
    /// [`FleetLimit`] begin.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// if !client.fleet_limit_available().await? {
    ///     println!("run `pgmq install-sdk` to limit reads across the fleet");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn fleet_limit_available(&self) -> Result<bool, Error> {
        self.sdk_function_present(READ_LIMITED_SIGNATURE).await
    }

    /// Whether the function of `signature` (as `to_regprocedure` takes it)
    /// exists: a catalog look that runs nothing of the schema.
    pub(crate) async fn sdk_function_present(&self, signature: &str) -> Result<bool, Error> {
        let rows = self.run(Stmt::SdkPresent, None, &[&signature]).await?;
        first_col::<bool>(&rows, 0, false)
    }
}

/// A limited read's checked arguments: the visibility timeout in seconds,
/// the quantity, and the places (None: no limit of places).
fn limited_args(limit: &FleetLimit, opts: &ReadOptions) -> Result<(i32, i32, Option<i32>), Error> {
    limit.check()?;
    if opts.filter.is_some() || opts.max_poll.is_some() {
        return Err(Error::InvalidArgument(
            "a limited read takes no filter and no max_poll".into(),
        ));
    }
    let vt = secs(opts.vt, "visibility timeout")?;
    let n = qty(opts.qty)?;
    Ok((vt, n, limit.max_running.map(|m| m as i32)))
}

/// The signature of `pgmq_sdk.read_limited`, as `to_regprocedure` takes it.
const READ_LIMITED_SIGNATURE: &str =
    "pgmq_sdk.read_limited(text, integer, integer, integer, double precision, double precision)";
