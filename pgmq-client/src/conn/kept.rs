//! Connections a long-running task keeps between calls, and every call on
//! them bounded in time: the executors a worker's loops run PGMQ calls on.
//!
//! **One pool.** A [`ConnectionPool`] is a [`Client`]'s bb8 pool or (feature
//! `deadpool`) a caller's deadpool-postgres pool; [`ConnectionPool::checkout`]
//! hands out a [`HeldConnection`].
//!
//! **Bounded.** [`HeldConnection::bounded`] runs a call within a limit. A
//! call that does not answer in time (a half-open connection, a blackholed
//! network, a statement waiting on a lock) fails with [`Error::timed_out`],
//! a lost connection of unknown outcome, and the connection is abandoned
//! ([`HeldConnection::abandon`]): marked broken so that its pool discards it,
//! and a cancel request sent so that the server stops the statement too.
//!
//! **Kept.** [`KeptConnections`]: connections kept from one call to the
//! next while their owner is busy, given back when it goes idle (why: on
//! the type), every call and checkout bounded.

use std::future::Future;
#[cfg(feature = "deadpool")]
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_postgres::Row;

use crate::conn::call::{self, Call, Params, TypedParams};
use crate::conn::client::Client;
#[cfg(feature = "deadpool")]
use crate::conn::connection::{cancel_in_background, mark_lost};
use crate::conn::connection::{ConnectionManager, Transaction};
use crate::conn::error::Error;
use crate::conn::executor::{Executor, Sealed};
use crate::conn::statements::Stmt;

/// The pool [`HeldConnection`]s are checked out of: a [`Client`]'s, or
/// (feature `deadpool`) a caller's deadpool-postgres pool.
///
/// As an [`Executor`] it checks out a connection per call, unbounded, for
/// calls off a hot path; its sends carry no trace context.
///
/// ```no_run
/// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
/// use pgmq_client::{ConnectionPool, Pgmq};
/// use std::time::Duration;
/// let pool = ConnectionPool::from(client);
/// let conn = pool.checkout(Duration::from_secs(5)).await?;
/// let rows = conn
///     .bounded(Duration::from_secs(5), async { Ok(conn.client().query("SELECT 1", &[]).await?) })
///     .await?;
/// Pgmq::on(&pool).send(&q, &serde_json::json!({"rows": rows.len()})).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ConnectionPool {
    /// A [`Client`]'s bb8 pool.
    Client(Client),
    /// A caller's deadpool-postgres pool (feature `deadpool`).
    #[cfg(feature = "deadpool")]
    Deadpool(deadpool_postgres::Pool),
}

impl From<Client> for ConnectionPool {
    fn from(client: Client) -> Self {
        ConnectionPool::Client(client)
    }
}

#[cfg(feature = "deadpool")]
impl From<deadpool_postgres::Pool> for ConnectionPool {
    fn from(pool: deadpool_postgres::Pool) -> Self {
        ConnectionPool::Deadpool(pool)
    }
}

impl ConnectionPool {
    /// Checks out a connection, waiting at most `limit` (past it,
    /// [`Error::PoolTimeout`]).
    ///
    /// ```no_run
    /// # async fn f(pool: pgmq_client::ConnectionPool) -> Result<(), pgmq_client::Error> {
    /// let conn = pool.checkout(std::time::Duration::from_secs(5)).await?;
    /// assert!(!conn.is_broken());
    /// # Ok(()) }
    /// ```
    pub async fn checkout(&self, limit: Duration) -> Result<HeldConnection, Error> {
        let get = async {
            match self {
                ConnectionPool::Client(c) => c.connection_owned().await.map(Held::Pool),
                #[cfg(feature = "deadpool")]
                ConnectionPool::Deadpool(pool) => match pool.get().await {
                    Ok(obj) => Ok(Held::Deadpool(DeadpoolHeld {
                        obj: Some(obj),
                        lost: AtomicBool::new(false),
                    })),
                    Err(e) => Err(call::from_deadpool(e)),
                },
            }
        };
        match tokio::time::timeout(limit, get).await {
            Ok(held) => held.map(|inner| HeldConnection { inner }),
            Err(_) => Err(Error::PoolTimeout),
        }
    }

    /// The pool's largest number of connections.
    ///
    /// ```no_run
    /// # fn f(client: pgmq_client::Client) {
    /// let pool = pgmq_client::ConnectionPool::from(client);
    /// assert!(pool.max_size() >= 1);
    /// # }
    /// ```
    pub fn max_size(&self) -> usize {
        match self {
            ConnectionPool::Client(c) => {
                usize::try_from(c.pool().config().max_size).unwrap_or(usize::MAX)
            }
            #[cfg(feature = "deadpool")]
            ConnectionPool::Deadpool(pool) => pool.status().max_size,
        }
    }
}

impl Sealed for ConnectionPool {}

impl Executor for ConnectionPool {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, Error> {
        match self {
            ConnectionPool::Client(c) => c.executor().query(stmt, params).await,
            #[cfg(feature = "deadpool")]
            ConnectionPool::Deadpool(pool) => pool.query(stmt, params).await,
        }
    }

    async fn query_text(&self, sql: &str, params: TypedParams<'_>) -> Result<Vec<Row>, Error> {
        match self {
            ConnectionPool::Client(c) => c.executor().query_text(sql, params).await,
            #[cfg(feature = "deadpool")]
            ConnectionPool::Deadpool(pool) => pool.query_text(sql, params).await,
        }
    }

    fn autocommit(&self) -> bool {
        true
    }
}

/// One connection checked out of a [`ConnectionPool`], back in the pool
/// when dropped (unless it broke: then the pool discards it).
///
/// ```no_run
/// # async fn f(pool: pgmq_client::ConnectionPool, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
/// use pgmq_client::Pgmq;
/// use std::time::Duration;
/// let mut conn = pool.checkout(Duration::from_secs(5)).await?;
/// let tx = conn.transaction().await?;
/// Pgmq::on(&tx).send(&q, &serde_json::json!({"order": 42})).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub struct HeldConnection {
    inner: Held,
}

enum Held {
    Pool(bb8::PooledConnection<'static, ConnectionManager>),
    #[cfg(feature = "deadpool")]
    Deadpool(DeadpoolHeld),
}

impl std::fmt::Debug for HeldConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldConnection")
            .field("broken", &self.is_broken())
            .finish_non_exhaustive()
    }
}

/// A deadpool connection, taken out of its pool when dropped broken (deadpool
/// itself only notices a connection the server closed).
#[cfg(feature = "deadpool")]
struct DeadpoolHeld {
    obj: Option<deadpool_postgres::Object>,
    lost: AtomicBool,
}

#[cfg(feature = "deadpool")]
impl DeadpoolHeld {
    fn obj(&self) -> &deadpool_postgres::Object {
        self.obj.as_ref().expect("present until dropped")
    }
}

#[cfg(feature = "deadpool")]
impl Drop for DeadpoolHeld {
    fn drop(&mut self) {
        if let Some(obj) = self.obj.take() {
            if self.lost.load(Ordering::Relaxed) || obj.is_closed() {
                // Out of the pool: the client (and its connection) closes here.
                drop(deadpool_postgres::Object::take(obj));
            }
        }
    }
}

impl HeldConnection {
    /// Whether the connection is closed, or a call on it lost it.
    ///
    /// ```no_run
    /// # async fn f(pool: pgmq_client::ConnectionPool) -> Result<(), pgmq_client::Error> {
    /// let conn = pool.checkout(std::time::Duration::from_secs(5)).await?;
    /// conn.abandon();
    /// assert!(conn.is_broken());
    /// # Ok(()) }
    /// ```
    pub fn is_broken(&self) -> bool {
        match &self.inner {
            Held::Pool(c) => c.is_broken(),
            #[cfg(feature = "deadpool")]
            Held::Deadpool(d) => d.lost.load(Ordering::Relaxed) || d.obj().is_closed(),
        }
    }

    /// Gives up on the call in flight: marks the connection broken, so that
    /// its pool discards it, and asks the server to cancel the statement
    /// (see [`Connection::abandon`](crate::Connection::abandon)). On a
    /// deadpool connection the cancel request goes out without TLS (deadpool
    /// does not tell its connector), which a server that takes only TLS
    /// refuses; its `statement_timeout` then ends the statement.
    ///
    /// ```no_run
    /// # async fn f(pool: pgmq_client::ConnectionPool) -> Result<(), pgmq_client::Error> {
    /// let conn = pool.checkout(std::time::Duration::from_secs(5)).await?;
    /// conn.abandon(); // dropped now, it leaves the pool
    /// # Ok(()) }
    /// ```
    pub fn abandon(&self) {
        match &self.inner {
            Held::Pool(c) => c.abandon(),
            #[cfg(feature = "deadpool")]
            Held::Deadpool(d) => {
                d.lost.store(true, Ordering::Relaxed);
                cancel_in_background(d.obj(), None);
            }
        }
    }

    /// The tokio-postgres client, for SQL of the caller's own.
    ///
    /// ```no_run
    /// # async fn f(pool: pgmq_client::ConnectionPool) -> Result<(), Box<dyn std::error::Error>> {
    /// let conn = pool.checkout(std::time::Duration::from_secs(5)).await?;
    /// conn.client().execute("SET application_name = 'jobs'", &[]).await?;
    /// # Ok(()) }
    /// ```
    pub fn client(&self) -> &tokio_postgres::Client {
        match &self.inner {
            Held::Pool(c) => c.client(),
            #[cfg(feature = "deadpool")]
            Held::Deadpool(d) => d.obj(),
        }
    }

    /// Starts a transaction in which PGMQ calls run on this connection
    /// (with its statement cache on a [`Client`]'s pool; as unnamed
    /// statements on a deadpool connection). A call in it that loses the
    /// connection marks this one broken.
    ///
    /// ```no_run
    /// # async fn f(pool: pgmq_client::ConnectionPool, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// let mut conn = pool.checkout(std::time::Duration::from_secs(5)).await?;
    /// let tx = conn.transaction().await?;
    /// pgmq_client::Pgmq::on(&tx).delete(&q, 1).await?;
    /// tx.rollback().await?;
    /// # Ok(()) }
    /// ```
    pub async fn transaction(&mut self) -> Result<Transaction<'_>, Error> {
        match &mut self.inner {
            Held::Pool(c) => c.transaction().await,
            #[cfg(feature = "deadpool")]
            Held::Deadpool(d) => {
                let obj = d.obj.as_mut().expect("present until dropped");
                let client: &mut tokio_postgres::Client = obj;
                Transaction::begin_unprepared(client, &d.lost).await
            }
        }
    }

    /// Runs `call`, made on this connection, within `limit`; past it,
    /// abandons the connection ([`abandon`](Self::abandon)) and fails with
    /// [`Error::timed_out`].
    ///
    /// ```no_run
    /// # async fn f(pool: pgmq_client::ConnectionPool) -> Result<(), pgmq_client::Error> {
    /// use std::time::Duration;
    /// let conn = pool.checkout(Duration::from_secs(5)).await?;
    /// let slow = async { Ok(conn.client().simple_query("SELECT pg_sleep(60)").await?) };
    /// let err = conn.bounded(Duration::from_secs(1), slow).await.unwrap_err();
    /// assert!(err.is_transient() && conn.is_broken());
    /// # Ok(()) }
    /// ```
    pub async fn bounded<T>(
        &self,
        limit: Duration,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        call::bounded(limit, || self.abandon(), call).await
    }
}

impl Sealed for HeldConnection {}

impl Executor for HeldConnection {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, Error> {
        match &self.inner {
            Held::Pool(c) => call::on_connection(c, Call::Stmt(stmt, params)).await,
            #[cfg(feature = "deadpool")]
            Held::Deadpool(d) => call::deadpool(d.obj(), stmt.sql(), None, params)
                .await
                .map_err(|e| mark_lost(&d.lost, e)),
        }
    }

    async fn query_text(&self, sql: &str, params: TypedParams<'_>) -> Result<Vec<Row>, Error> {
        match &self.inner {
            Held::Pool(c) => call::on_connection(c, Call::Text(sql, params)).await,
            #[cfg(feature = "deadpool")]
            Held::Deadpool(d) => call::deadpool_text(d.obj(), sql, params)
                .await
                .map_err(|e| mark_lost(&d.lost, e)),
        }
    }
}

/// Up to `max` connections of a [`ConnectionPool`], kept from one call to
/// the next while their owner is busy; an [`Executor`] whose every call,
/// and its checkout, runs within `limit` ([`HeldConnection::bounded`]).
///
/// **Why kept.** A loop that calls again and again (claims, batched
/// acknowledgements) would otherwise pay a checkout per call, client work
/// on the hot path, and move from server backend to backend. **Why given
/// back.** Before its owner waits for anything (more work, room, a retry)
/// it says [`idle`](Self::idle) and every kept connection goes back to the
/// pool, so an idle task holds none; and since no task holds a connection
/// while it waits, tasks sharing a small pool only slow each other down,
/// they never deadlock (a claim loop waiting on acknowledgements that wait
/// on its connection). [`busy`](Self::busy) keeps connections again. A
/// call that fails drops its connection (its state is unknown); one that
/// succeeds gives it back to be kept. With `max` 0 it is a checkout per
/// call, bounded.
///
/// ```no_run
/// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
/// use pgmq_client::{KeptConnections, Pgmq};
/// use std::time::Duration;
/// let kept = KeptConnections::new(client, 1, Duration::from_secs(5));
/// let pg = Pgmq::on(&kept);
/// loop {
///     kept.busy();
///     let batch = pg.read_raw(&q, Duration::from_secs(30), 100).await?;
///     if batch.is_empty() {
///         kept.idle(); // nothing held while waiting
///         tokio::time::sleep(Duration::from_secs(1)).await;
///         continue;
///     }
///     let ids: Vec<i64> = batch.iter().map(|m| m.msg_id).collect();
///     pg.delete_batch(&q, &ids).await?; // on the connection of the read
/// }
/// # }
/// ```
pub struct KeptConnections {
    pool: ConnectionPool,
    max: usize,
    limit: Duration,
    state: std::sync::Mutex<KeptState>,
}

struct KeptState {
    conns: Vec<HeldConnection>,
    /// The owner is waiting for work: keep nothing.
    idle: bool,
}

impl std::fmt::Debug for KeptConnections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptConnections")
            .field("max", &self.max)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl KeptConnections {
    /// Keeps up to `max` connections of `pool` (0: a checkout per call),
    /// each call and checkout bounded by `limit`.
    ///
    /// ```no_run
    /// # fn f(client: pgmq_client::Client) {
    /// let kept = pgmq_client::KeptConnections::new(client, 2, std::time::Duration::from_secs(5));
    /// # }
    /// ```
    pub fn new(pool: impl Into<ConnectionPool>, max: usize, limit: Duration) -> Self {
        KeptConnections {
            pool: pool.into(),
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

    /// Gives every kept connection back to the pool; connections of later
    /// calls are not kept until [`busy`](Self::busy).
    ///
    /// ```no_run
    /// # fn f(kept: pgmq_client::KeptConnections) {
    /// kept.idle(); // before the owner waits for work
    /// # }
    /// ```
    pub fn idle(&self) {
        let mut st = self.lock();
        st.idle = true;
        st.conns.clear();
    }

    /// More work arrived: keep connections again.
    ///
    /// ```no_run
    /// # fn f(kept: pgmq_client::KeptConnections) {
    /// kept.busy(); // the next calls keep their connection
    /// # }
    /// ```
    pub fn busy(&self) {
        self.lock().idle = false;
    }

    async fn take(&self) -> Result<HeldConnection, Error> {
        loop {
            let Some(conn) = self.lock().conns.pop() else {
                break;
            };
            if !conn.is_broken() {
                return Ok(conn);
            }
        }
        self.pool.checkout(self.limit).await
    }

    /// The end of a call on `conn`: kept after a success unless the owner
    /// is idle (checked under the same lock as [`idle`](Self::idle), so none
    /// slips past it), dropped after a failure.
    fn settle<T>(&self, conn: HeldConnection, res: Result<T, Error>) -> Result<T, Error> {
        if res.is_ok() {
            let mut st = self.lock();
            if !st.idle && st.conns.len() < self.max && !conn.is_broken() {
                st.conns.push(conn);
            }
        }
        res
    }
}

impl Sealed for KeptConnections {}

impl Executor for KeptConnections {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, Error> {
        let conn = self.take().await?;
        let res = conn.bounded(self.limit, conn.query(stmt, params)).await;
        self.settle(conn, res)
    }

    async fn query_text(&self, sql: &str, params: TypedParams<'_>) -> Result<Vec<Row>, Error> {
        let conn = self.take().await?;
        let res = conn.bounded(self.limit, conn.query_text(sql, params)).await;
        self.settle(conn, res)
    }

    fn autocommit(&self) -> bool {
        true
    }
}
