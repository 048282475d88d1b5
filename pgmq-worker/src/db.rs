//! Where the worker's connections come from, and database calls with a
//! bound: no call of the worker waits for ever.
//!
//! **One source.** Every task gets its connections from one
//! [`ConnectionSource`]: the client's bb8 pool, or a caller's
//! deadpool-postgres pool (feature `deadpool`), so that a service runs the
//! worker on the pool it already has. The source hands out [`Held`]
//! connections; notifications still get a dedicated connection of their own
//! ([`Source::listener`]), never a pooled one.
//!
//! **Bounded.** Every read, acknowledgement, heartbeat and release runs on a
//! connection the task checked out, within `db_timeout`
//! ([`pgmq_client::HeldConnection::bounded`]). A call that does not answer
//! in time (a half-open connection, a blackholed network, a server that
//! stopped answering, a statement waiting on a lock) fails as a lost
//! connection of unknown outcome, and the connection is abandoned: marked
//! broken so that the pool discards it instead of handing it out again, and
//! a cancel request sent so that the server stops the statement too
//! (otherwise a statement waiting on a lock would keep its backend, and
//! every retry would add one more); the caller retries on a new one. A
//! late answer of the abandoned call can only be a fenced write that already
//! happened (the retry then matches nothing and is not counted twice) or a
//! read whose messages come back after their visibility timeout.
//!
//! **Kept.** The claim loops and the completer keep the connection of a
//! call for the next one while they have more to do, and give it back
//! before they wait ([`Kept`]: the client's [`pgmq_client::KeptConnections`],
//! whose docs say why).
//!
//! The connection keeping and the bound are the client's public executors
//! (`pgmq_client::ConnectionPool`, `HeldConnection`, `KeptConnections`);
//! this module adds what only the worker needs: the LISTEN settings of a
//! deadpool source and PGMQ's detection on it.

use std::future::Future;
use std::time::Duration;

use pgmq_client::{Client, ConnectionPool, HeldConnection, KeptConnections};

/// Where a worker's connections come from: a [`Client`]'s pool, or (feature
/// `deadpool`) a caller's deadpool-postgres pool.
///
/// [`Worker::builder`](crate::Worker::builder) takes anything that converts
/// into one, so a [`Client`] works as before.
///
/// ```no_run
/// # #[cfg(feature = "deadpool")]
/// # async fn f(pool: deadpool_postgres::Pool) -> Result<(), pgmq_worker::Error> {
/// use pgmq_client::{Message, QueueName};
/// use pgmq_worker::{ConnectionSource, Outcome, WakeUp, Worker};
/// // The service's own pool; the LISTEN connection is opened from the DSN.
/// let conns = ConnectionSource::deadpool(pool).listen_dsn("postgres://app@db/app");
/// let worker: Worker<serde_json::Value> = Worker::builder(conns, QueueName::new("jobs")?)
///     .wake_up(WakeUp::Notify)
///     .handler(|_msg: Message<serde_json::Value>| async {
///         Ok(Outcome::Delete)
///     })
///     .build()?;
/// worker.run_until_signal().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ConnectionSource {
    pub(crate) inner: Source,
}

impl std::fmt::Debug for ConnectionSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.inner.pool {
            ConnectionPool::Client(_) => "client",
            #[cfg(feature = "deadpool")]
            ConnectionPool::Deadpool(_) => "deadpool",
            _ => "other",
        };
        f.debug_struct("ConnectionSource")
            .field("pool", &kind)
            .finish_non_exhaustive()
    }
}

impl From<Client> for ConnectionSource {
    fn from(client: Client) -> Self {
        ConnectionSource {
            inner: Source {
                pool: ConnectionPool::Client(client),
                #[cfg(feature = "deadpool")]
                listen: None,
            },
        }
    }
}

#[cfg(feature = "deadpool")]
impl From<deadpool_postgres::Pool> for ConnectionSource {
    fn from(pool: deadpool_postgres::Pool) -> Self {
        Self::deadpool(pool)
    }
}

#[cfg(feature = "deadpool")]
impl ConnectionSource {
    /// A caller's deadpool-postgres pool (feature `deadpool`). Size it for
    /// the worker as for a [`Client`]: `claimers` + `ack_flushers` + 1, plus
    /// `concurrency` with a transactional handler. PGMQ calls use deadpool's
    /// statement cache; a connection whose call outlived `db_timeout` is
    /// taken out of the pool rather than handed out again.
    pub fn deadpool(pool: deadpool_postgres::Pool) -> Self {
        ConnectionSource {
            inner: Source {
                pool: ConnectionPool::Deadpool(pool),
                listen: None,
            },
        }
    }

    /// The DSN [`WakeUp::Notify`](crate::WakeUp::Notify) opens its
    /// dedicated LISTEN connection with (a pool does not tell its settings).
    /// Without it, a worker that wakes on notifications fails at start.
    pub fn listen_dsn(mut self, dsn: &str) -> Self {
        if let ConnectionPool::Deadpool(_) = &self.inner.pool {
            self.inner.listen = Some(std::sync::Arc::new(pgmq_client::ClientBuilder::new(dsn)));
        }
        self
    }
}

/// The pool behind a [`ConnectionSource`], and the LISTEN settings of a
/// deadpool pool (a pool does not tell its settings).
#[derive(Clone)]
pub(crate) struct Source {
    pool: ConnectionPool,
    #[cfg(feature = "deadpool")]
    listen: Option<std::sync::Arc<pgmq_client::ClientBuilder>>,
}

/// A pooled connection a task holds, its calls bounded.
pub(crate) type Held = HeldConnection;

/// Up to a number of connections kept between calls while the owner is
/// busy, every call bounded (see the module docs).
pub(crate) type Kept = KeptConnections;

impl From<Source> for ConnectionPool {
    fn from(source: Source) -> Self {
        source.pool
    }
}

impl Source {
    /// The pool, as an executor that checks out a connection per call: for
    /// the calls off the hot path (start checks, the shutdown's release).
    pub(crate) fn pool(&self) -> &ConnectionPool {
        &self.pool
    }

    /// Checks out a connection within `limit`.
    pub(crate) async fn checkout(&self, limit: Duration) -> Result<Held, pgmq_client::Error> {
        self.pool.checkout(limit).await
    }

    /// The pool's largest number of connections.
    pub(crate) fn max_size(&self) -> Option<usize> {
        Some(self.pool.max_size())
    }

    /// A dedicated LISTEN connection (outside the pool).
    pub(crate) async fn listener(&self) -> Result<pgmq_client::Listener, pgmq_client::Error> {
        match &self.pool {
            #[cfg(feature = "deadpool")]
            ConnectionPool::Deadpool(_) => match &self.listen {
                Some(b) => pgmq_client::Listener::connect(b).await,
                None => Err(pgmq_client::Error::Config(
                    "a worker on a deadpool pool needs ConnectionSource::listen_dsn to wake on notifications"
                        .into(),
                )),
            },
            ConnectionPool::Client(c) => c.listener().await,
            _ => Err(pgmq_client::Error::Config(
                "this kind of pool cannot open a LISTEN connection".into(),
            )),
        }
    }

    /// What is known about PGMQ: the client's detection at connect, or a
    /// detection now on a pooled connection (None when that fails).
    pub(crate) async fn install(&self, limit: Duration) -> Option<pgmq_client::PgmqInstall> {
        if let ConnectionPool::Client(c) = &self.pool {
            return c.install().cloned();
        }
        let conn = self.checkout(limit).await.ok()?;
        bounded(limit, &conn, pgmq_client::detect_pgmq(conn.client()))
            .await
            .ok()
    }
}

/// Runs `call` (made on `conn`) within `limit`; past it, abandons `conn`
/// (marks it broken and cancels the statement on the server) and fails
/// with [`pgmq_client::Error::timed_out`].
pub(crate) async fn bounded<T>(
    limit: Duration,
    conn: &Held,
    call: impl Future<Output = Result<T, pgmq_client::Error>>,
) -> Result<T, pgmq_client::Error> {
    conn.bounded(limit, call).await
}
