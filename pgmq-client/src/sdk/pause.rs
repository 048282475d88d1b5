//! Pausing a queue for every worker: a flag in the `pgmq_sdk` schema
//! ([`crate::sdk::sdk_schema`]) that pgmq-worker's workers read at least once
//! per poll interval, and stop claiming from the queue while it is set
//! (running handlers finish and their acknowledgements are written). A
//! worker started while its queue is paused starts paused.
//!
//! Pausing touches none of PGMQ's objects: senders keep sending, and a
//! plain `pgmq.read` (another client's, say) still reads.
//!
//! The flag is kept per queue table, so every spelling of a queue's name
//! (`Orders`, `orders`) is the same queue, and a queue dropped and created
//! again starts resumed. Pausing and resuming need UPDATE on the queue's
//! table (the right that already lets a role hide every message by moving
//! its visibility timeout); reading the flag needs SELECT on it, and a role
//! without it gets a permission error (SQLSTATE 42501), never "not paused".

use chrono::{DateTime, Utc};

use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::rows::{col, first_col};
use crate::conn::statements::Stmt;
use crate::pgmq::queue_name::QueueName;
use crate::Pgmq;

const FEATURE: &str = "pausing a queue";

/// The grants a role needs to read a queue's pause flag
/// ([`Pgmq::is_paused`]), as an operator runs them: for an error message
/// that tells how to fix a read refused with SQLSTATE 42501.
///
/// ```
/// assert!(pgmq_client::PAUSE_FLAG_GRANTS.starts_with("GRANT SELECT ON"));
/// ```
pub const PAUSE_FLAG_GRANTS: &str = "GRANT SELECT ON pgmq.q_<queue> TO <the worker's role> \
     (the flag is readable by whoever may read the queue; the rest of pgmq_sdk is granted to \
     PUBLIC by `pgmq install-sdk`: run it again if a grant on pgmq_sdk was revoked)";

/// A paused queue, as [`Pgmq::paused_queues`] lists it.
///
/// ```no_run
/// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
/// for p in client.paused_queues().await? {
///     println!("{} paused since {} ({:?})", p.queue_name, p.paused_at, p.reason);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PausedQueue {
    /// The queue.
    pub queue_name: String,
    /// When it was paused.
    pub paused_at: DateTime<Utc>,
    /// Why, as the pauser said.
    pub reason: Option<String>,
}

impl<E: Executor> Pgmq<E> {
    /// Pauses `queue` for every worker; true when it was not paused
    /// already. [`Error::QueueNotFound`] for a queue that does not exist,
    /// [`Error::SdkSchemaMissing`] without the `pgmq_sdk` schema, a
    /// database error with SQLSTATE 42501 for a role without UPDATE on the
    /// queue's table.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// client.pause(&q, Some("migrating the orders table")).await?;
    /// // ... every worker on `orders` stops claiming within a poll interval ...
    /// client.resume(&q).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq_sdk.pause", skip_all, fields(queue = %queue))]
    pub async fn pause(&self, queue: &QueueName, reason: Option<&str>) -> Result<bool, Error> {
        let q = queue.as_str();
        if reason.is_some_and(|r| r.contains('\0')) {
            return Err(Error::unstorable(None, "reason"));
        }
        let rows = self
            .run(Stmt::PauseQueue, Some(q), &[&q, &reason])
            .await
            .map_err(|e| e.in_sdk(FEATURE))?;
        Ok(first_col::<Option<bool>>(&rows, 0, None)?.unwrap_or(false))
    }

    /// Resumes `queue`; true when it was paused.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// if !client.resume(&q).await? {
    ///     println!("orders was not paused");
    /// }
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq_sdk.resume", skip_all, fields(queue = %queue))]
    pub async fn resume(&self, queue: &QueueName) -> Result<bool, Error> {
        let q = queue.as_str();
        let rows = self
            .run(Stmt::ResumeQueue, Some(q), &[&q])
            .await
            .map_err(|e| e.in_sdk(FEATURE))?;
        Ok(first_col::<Option<bool>>(&rows, 0, None)?.unwrap_or(false))
    }

    /// Whether `queue` is paused. A role without SELECT on the queue's
    /// table gets a database error with SQLSTATE 42501.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// println!("paused: {}", client.is_paused(&q).await?);
    /// # Ok(()) }
    /// ```
    pub async fn is_paused(&self, queue: &QueueName) -> Result<bool, Error> {
        let q = queue.as_str();
        let rows = self
            .run(Stmt::QueuePaused, Some(q), &[&q])
            .await
            .map_err(|e| e.in_sdk(FEATURE))?;
        Ok(first_col::<Option<bool>>(&rows, 0, None)?.unwrap_or(false))
    }

    /// Every paused queue the caller may read (SELECT on its table), by
    /// name.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let paused = client.paused_queues().await?;
    /// # Ok(()) }
    /// ```
    pub async fn paused_queues(&self) -> Result<Vec<PausedQueue>, Error> {
        let rows = self
            .run(Stmt::ListPaused, None, &[])
            .await
            .map_err(|e| e.in_sdk(FEATURE))?;
        rows.iter()
            .map(|r| {
                Ok(PausedQueue {
                    queue_name: col(r, 0)?,
                    paused_at: col(r, 1)?,
                    reason: col(r, 2)?,
                })
            })
            .collect()
    }

    /// Whether the `pgmq_sdk` schema's pause flag can be asked for on this
    /// database: a catalog look that cannot fail (so a worker polling it
    /// leaves no error in the server's log while the schema is missing).
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// if !client.sdk_schema_present().await? {
    ///     println!("run `pgmq install-sdk` to pause queues");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn sdk_schema_present(&self) -> Result<bool, Error> {
        let probe = "pgmq_sdk.queue_paused(text)";
        let rows = self.run(Stmt::SdkPresent, None, &[&probe]).await?;
        first_col::<bool>(&rows, 0, false)
    }
}
