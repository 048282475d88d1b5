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
//! connection the task checked out, within `db_timeout`. A call that does
//! not answer in time (a half-open connection, a blackholed network, a
//! server that stopped answering, a statement waiting on a lock) fails as a
//! lost connection of unknown outcome, and the connection is abandoned: marked
//! broken so that the pool discards it instead of handing it out again, and
//! a cancel request sent so that the server stops the statement too
//! (otherwise a statement waiting on a lock would keep its backend, and
//! every retry would add one more); the caller retries on a new one. A
//! late answer of the abandoned call can only be a fenced write that already
//! happened (the retry then matches nothing and is not counted twice) or a
//! read whose messages come back after their visibility timeout.
//!
//! **Kept.** The claim loops and the completer keep the connection of a
//! call for the next one while they have more to do ([`Kept`], the one
//! implementation of that for both): a checkout per call is client work on
//! the hot path. Kept connections go back to the pool before the task waits
//! for anything ([`Kept::idle`]), so an idle worker holds none, and a small
//! pool cannot deadlock the acknowledgements behind the claims or the other
//! way round.

use std::future::Future;
use std::time::Duration;

use pgmq_client::__private::{Params, Sealed, Stmt, TypedParams};
use pgmq_client::reexports::tokio_postgres::{self, Row};
use pgmq_client::{Client, ConnectionManager, Executor, Transaction};

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
        let kind = match &self.inner {
            Source::Client(_) => "client",
            #[cfg(feature = "deadpool")]
            Source::Deadpool { .. } => "deadpool",
        };
        f.debug_struct("ConnectionSource")
            .field("pool", &kind)
            .finish_non_exhaustive()
    }
}

impl From<Client> for ConnectionSource {
    fn from(client: Client) -> Self {
        ConnectionSource {
            inner: Source::Client(client),
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
            inner: Source::Deadpool { pool, listen: None },
        }
    }

    /// The DSN [`WakeUp::Notify`](crate::WakeUp::Notify) opens its
    /// dedicated LISTEN connection with (a pool does not tell its settings).
    /// Without it, a worker that wakes on notifications fails at start.
    pub fn listen_dsn(mut self, dsn: &str) -> Self {
        if let Source::Deadpool { listen, .. } = &mut self.inner {
            *listen = Some(std::sync::Arc::new(pgmq_client::ClientBuilder::new(dsn)));
        }
        self
    }
}

/// The pool behind a [`ConnectionSource`].
#[derive(Clone)]
pub(crate) enum Source {
    Client(Client),
    #[cfg(feature = "deadpool")]
    Deadpool {
        pool: deadpool_postgres::Pool,
        /// The settings of the LISTEN connection.
        listen: Option<std::sync::Arc<pgmq_client::ClientBuilder>>,
    },
}

impl Source {
    /// Checks out a connection within `limit`.
    pub(crate) async fn checkout(&self, limit: Duration) -> Result<Held, pgmq_client::Error> {
        let get = async {
            match self {
                Source::Client(c) => c.connection_owned().await.map(Held::Pool),
                #[cfg(feature = "deadpool")]
                Source::Deadpool { pool, .. } => match pool.get().await {
                    Ok(obj) => Ok(Held::Deadpool(DeadpoolHeld {
                        obj: Some(obj),
                        lost: std::sync::atomic::AtomicBool::new(false),
                    })),
                    Err(deadpool_postgres::PoolError::Backend(e)) => {
                        Err(pgmq_client::Error::Connect(e))
                    }
                    Err(deadpool_postgres::PoolError::Timeout(_)) => {
                        Err(pgmq_client::Error::PoolTimeout)
                    }
                    Err(e) => Err(pgmq_client::Error::Config(format!("deadpool: {e}"))),
                },
            }
        };
        match tokio::time::timeout(limit, get).await {
            Ok(r) => r,
            Err(_) => Err(pgmq_client::Error::PoolTimeout),
        }
    }

    /// The pool's largest number of connections.
    pub(crate) fn max_size(&self) -> Option<usize> {
        match self {
            Source::Client(c) => usize::try_from(c.pool().config().max_size).ok(),
            #[cfg(feature = "deadpool")]
            Source::Deadpool { pool, .. } => Some(pool.status().max_size),
        }
    }

    /// A dedicated LISTEN connection (outside the pool).
    pub(crate) async fn listener(&self) -> Result<pgmq_client::Listener, pgmq_client::Error> {
        match self {
            Source::Client(c) => c.listener().await,
            #[cfg(feature = "deadpool")]
            Source::Deadpool { listen, .. } => match listen {
                Some(b) => pgmq_client::Listener::connect(b).await,
                None => Err(pgmq_client::Error::Config(
                    "a worker on a deadpool pool needs ConnectionSource::listen_dsn to wake on notifications"
                        .into(),
                )),
            },
        }
    }

    /// What is known about PGMQ: the client's detection at connect, or a
    /// detection now on a pooled connection (None when that fails).
    pub(crate) async fn install(&self, limit: Duration) -> Option<pgmq_client::PgmqInstall> {
        #[cfg(not(feature = "deadpool"))]
        let _ = limit;
        match self {
            Source::Client(c) => c.install().cloned(),
            #[cfg(feature = "deadpool")]
            Source::Deadpool { .. } => {
                let conn = self.checkout(limit).await.ok()?;
                bounded(limit, &conn, pgmq_client::detect_pgmq(conn.pg()))
                    .await
                    .ok()
            }
        }
    }
}

/// Calls on the source itself check out a connection per call: for the
/// calls off the hot path (start checks, the shutdown's release, metrics).
// pgmq-client's executor internals (`__private`, not its stable API):
// the worker and the client are released together.
impl Sealed for Source {}

impl Executor for Source {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, pgmq_client::Error> {
        match self {
            Source::Client(c) => c.executor().query(stmt, params).await,
            #[cfg(feature = "deadpool")]
            Source::Deadpool { pool, .. } => pool.query(stmt, params).await,
        }
    }

    async fn query_text(
        &self,
        sql: &str,
        params: TypedParams<'_>,
    ) -> Result<Vec<Row>, pgmq_client::Error> {
        match self {
            Source::Client(c) => c.executor().query_text(sql, params).await,
            #[cfg(feature = "deadpool")]
            Source::Deadpool { pool, .. } => pool.query_text(sql, params).await,
        }
    }

    fn autocommit(&self) -> bool {
        true
    }
}

/// A pooled connection a task keeps between calls.
pub(crate) enum Held {
    Pool(pgmq_client::reexports::bb8::PooledConnection<'static, ConnectionManager>),
    #[cfg(feature = "deadpool")]
    Deadpool(DeadpoolHeld),
}

/// A deadpool connection, taken out of its pool when dropped broken (deadpool
/// itself only notices a connection the server closed).
#[cfg(feature = "deadpool")]
pub(crate) struct DeadpoolHeld {
    obj: Option<deadpool_postgres::Object>,
    lost: std::sync::atomic::AtomicBool,
}

#[cfg(feature = "deadpool")]
impl DeadpoolHeld {
    fn obj(&self) -> &deadpool_postgres::Object {
        self.obj.as_ref().expect("present until dropped")
    }

    /// Notes a call that lost the connection.
    fn noting<T>(&self, res: Result<T, pgmq_client::Error>) -> Result<T, pgmq_client::Error> {
        if let Err(pgmq_client::Error::ConnectionLost { .. }) = &res {
            self.lost.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        res
    }
}

#[cfg(feature = "deadpool")]
impl Drop for DeadpoolHeld {
    fn drop(&mut self) {
        if let Some(obj) = self.obj.take() {
            if self.lost.load(std::sync::atomic::Ordering::Relaxed) || obj.is_closed() {
                // Out of the pool: the client (and its connection) closes here.
                drop(deadpool_postgres::Object::take(obj));
            }
        }
    }
}

impl Held {
    /// Whether the connection is closed, or a call on it lost it.
    pub(crate) fn is_broken(&self) -> bool {
        match self {
            Held::Pool(c) => c.is_broken(),
            #[cfg(feature = "deadpool")]
            Held::Deadpool(d) => {
                d.lost.load(std::sync::atomic::Ordering::Relaxed) || d.obj().is_closed()
            }
        }
    }

    /// Gives up on the call in flight: marks it broken and asks the server
    /// to cancel the statement (see the module docs, "Bounded").
    pub(crate) fn abandon(&self) {
        match self {
            Held::Pool(c) => c.abandon(),
            #[cfg(feature = "deadpool")]
            Held::Deadpool(d) => {
                // Broken: the pool discards it rather than handing it out again.
                d.lost.store(true, std::sync::atomic::Ordering::Relaxed);
                // deadpool does not tell its TLS connector: a plain cancel
                // request, which a server that takes only TLS refuses (its
                // statement_timeout then ends the statement).
                pgmq_client::__private::cancel_in_background(d.obj(), None);
            }
        }
    }

    /// The client, for SQL of the worker's own.
    pub(crate) fn pg(&self) -> &tokio_postgres::Client {
        match self {
            Held::Pool(c) => c.client(),
            #[cfg(feature = "deadpool")]
            Held::Deadpool(d) => d.obj(),
        }
    }

    /// Starts a transaction in which PGMQ calls still run on this
    /// connection (with its statement cache on the client's pool; as
    /// unnamed statements on a deadpool connection).
    pub(crate) async fn transaction(&mut self) -> Result<Transaction<'_>, pgmq_client::Error> {
        match self {
            Held::Pool(c) => c.transaction().await,
            #[cfg(feature = "deadpool")]
            Held::Deadpool(d) => {
                let obj = d.obj.as_mut().expect("present until dropped");
                let client: &mut tokio_postgres::Client = obj;
                Transaction::begin_unprepared(client, &d.lost).await
            }
        }
    }
}

// pgmq-client's executor internals (`__private`, not its stable API):
// the worker and the client are released together.
impl Sealed for Held {}

impl Executor for Held {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, pgmq_client::Error> {
        match self {
            Held::Pool(c) => c.query(stmt, params).await,
            #[cfg(feature = "deadpool")]
            Held::Deadpool(d) => d.noting(d.obj().query(stmt, params).await),
        }
    }

    async fn query_text(
        &self,
        sql: &str,
        params: TypedParams<'_>,
    ) -> Result<Vec<Row>, pgmq_client::Error> {
        match self {
            Held::Pool(c) => c.query_text(sql, params).await,
            #[cfg(feature = "deadpool")]
            Held::Deadpool(d) => d.noting(d.obj().query_text(sql, params).await),
        }
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
    match tokio::time::timeout(limit, call).await {
        Ok(r) => r,
        Err(_) => {
            conn.abandon();
            Err(pgmq_client::Error::timed_out())
        }
    }
}

/// Up to `max` connections of a source, kept from one call to the next
/// while the task that owns them is busy (see the module docs); a
/// [`pgmq_client::Executor`] whose every call (and checkout) runs within
/// `limit`. A call that fails drops its connection; one that succeeds gives
/// it back to be kept.
pub(crate) struct Kept {
    source: Source,
    max: usize,
    /// The bound on each call (`db_timeout`).
    limit: Duration,
    state: std::sync::Mutex<KeptState>,
}

struct KeptState {
    conns: Vec<Held>,
    /// The owner is waiting for work: keep nothing.
    idle: bool,
}

impl Kept {
    /// Keeps up to `max` connections (0: a checkout per call).
    pub(crate) fn new(source: Source, max: usize, limit: Duration) -> Self {
        Kept {
            source,
            max,
            limit,
            state: std::sync::Mutex::new(KeptState {
                conns: Vec::with_capacity(max),
                idle: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KeptState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives every kept connection back; later returns are not kept.
    pub(crate) fn idle(&self) {
        let mut st = self.lock();
        st.idle = true;
        st.conns.clear();
    }

    /// More work arrived: keep connections again.
    pub(crate) fn busy(&self) {
        self.lock().idle = false;
    }

    async fn take(&self) -> Result<Held, pgmq_client::Error> {
        loop {
            let Some(conn) = self.lock().conns.pop() else {
                break;
            };
            if !conn.is_broken() {
                return Ok(conn);
            }
        }
        self.source.checkout(self.limit).await
    }

    /// A connection whose call succeeded: kept unless the owner is idle
    /// (checked under the same lock as [`idle`](Self::idle), so none slips
    /// past it).
    fn give_back(&self, conn: Held) {
        let mut st = self.lock();
        if !st.idle && st.conns.len() < self.max && !conn.is_broken() {
            st.conns.push(conn);
        }
    }

    /// The end of a call on `conn`: kept after a success, dropped after a
    /// failure (its state is unknown).
    fn settle<T>(
        &self,
        conn: Held,
        res: Result<T, pgmq_client::Error>,
    ) -> Result<T, pgmq_client::Error> {
        if res.is_ok() {
            self.give_back(conn);
        }
        res
    }
}

// pgmq-client's executor internals (`__private`, not its stable API):
// the worker and the client are released together.
impl Sealed for Kept {}

impl Executor for Kept {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, pgmq_client::Error> {
        let conn = self.take().await?;
        let res = bounded(self.limit, &conn, conn.query(stmt, params)).await;
        self.settle(conn, res)
    }

    async fn query_text(
        &self,
        sql: &str,
        params: TypedParams<'_>,
    ) -> Result<Vec<Row>, pgmq_client::Error> {
        let conn = self.take().await?;
        let res = bounded(self.limit, &conn, conn.query_text(sql, params)).await;
        self.settle(conn, res)
    }

    fn autocommit(&self) -> bool {
        true
    }
}
