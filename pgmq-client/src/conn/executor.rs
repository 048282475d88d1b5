//! The one path every call runs on: a pool, a pooled connection, a transaction,
//! or a caller's own `tokio_postgres` client or transaction.
//!
//! Each PGMQ call is written once, against [`Executor`]; [`Pgmq::on`](crate::Pgmq::on)
//! puts any executor behind the same methods. On this crate's own connections
//! statements come from the connection's cache (prepared once, one round trip
//! per call). On a caller's own `tokio_postgres::Client` or `Transaction`
//! there is no cache to keep, so each call prepares its statement first (two
//! round trips); use [`Connection::transaction`](crate::Connection::transaction)
//! to keep the cache inside a transaction.

use std::future::Future;

use tokio_postgres::Row;

use crate::conn::call::{self, Call, Params, TypedParams};
use crate::conn::connection::{Connection, ConnectionManager, Transaction};
use crate::conn::error::Error;
use crate::conn::statements::Stmt;

/// Something PGMQ calls can run on: pass one to [`Pgmq::on`](crate::Pgmq::on).
///
/// Implemented for [`Pool`](crate::Pool) (checks out a connection per call),
/// [`Connection`], [`Transaction`], bb8's pooled connection,
/// `tokio_postgres::Client` and `tokio_postgres::Transaction`, with the
/// `deadpool` feature deadpool-postgres' `Pool` and `Object`,
/// [`ConnectionPool`](crate::ConnectionPool),
/// [`HeldConnection`](crate::HeldConnection) and
/// [`KeptConnections`](crate::KeptConnections), and references to any of
/// them.
///
/// The trait is sealed: no type outside this crate can implement it, and
/// its hidden methods (the statements it prepares and how it runs them) are
/// not part of the stable API; [`Executor::query_text`] runs SQL of your
/// own on the same call path. For connections kept between calls and calls bounded in time, use
/// [`KeptConnections`](crate::KeptConnections) and
/// [`HeldConnection`](crate::HeldConnection), which are executors too.
///
/// ```no_run
/// # async fn f(pg: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
/// use pgmq_client::{Executor, Pgmq, QueueName};
///
/// // Any executor runs the same calls.
/// async fn enqueue<E: Executor>(pg: &Pgmq<E>, q: &QueueName) -> Result<i64, pgmq_client::Error> {
///     pg.send(q, &serde_json::json!({"job": 1})).await
/// }
///
/// let q = QueueName::new("jobs")?;
/// let tx = pg.transaction().await?;
/// enqueue(&Pgmq::on(&tx), &q).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub trait Executor: Sealed + Send + Sync {
    /// Runs one statement and returns its rows.
    #[doc(hidden)]
    fn query(
        &self,
        stmt: Stmt,
        params: Params<'_>,
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send;

    /// Whether each call runs in a transaction of its own, so that a failed
    /// call can be repeated without touching a caller's transaction. True for
    /// [`Pool`](crate::Pool); false (the default) for connections and
    /// transactions, where an error aborts the caller's transaction.
    #[doc(hidden)]
    fn autocommit(&self) -> bool {
        false
    }

    /// Whether a housekeeping pass (deleting expired deduplication keys)
    /// should run now, in a transaction of its own: true at most once a
    /// second on a [`Pool`](crate::Pool), never elsewhere (a caller's
    /// transaction would hold the deleted keys' locks until it commits).
    #[doc(hidden)]
    fn housekeeping_due(&self) -> bool {
        false
    }

    /// Whether sends on it put the current trace context into the
    /// messages' headers ([`ClientBuilder::trace_context`](crate::ClientBuilder),
    /// feature `otel`). False (the default) but for a [`Pool`](crate::Pool)
    /// built with it.
    fn trace_context(&self) -> bool {
        false
    }

    /// Runs SQL text of the caller's own, each parameter with its type, on
    /// the same call path as PGMQ's functions: on this crate's connections
    /// and transactions the text is prepared once per connection and cached
    /// by its text; on a caller's own `tokio_postgres` client it runs
    /// unprepared in one round trip (`query_typed`). A failure is classified
    /// like any call's ([`Error::is_transient`], [`CommitOutcome`](crate::CommitOutcome)),
    /// and on [`KeptConnections`](crate::KeptConnections) the call is bounded
    /// by its time limit.
    ///
    /// This crate uses it for the statements that are not PGMQ functions and
    /// therefore name a queue's table ([`Pgmq::release_batch`](crate::Pgmq::release_batch),
    /// [`Pgmq::read_from`](crate::Pgmq::read_from), the fenced writes and
    /// locks of [`Receipt`](crate::Receipt), the dead-letter move
    /// [`Pgmq::dead_letter_fenced`](crate::Pgmq::dead_letter_fenced)).
    /// Build a table's name only from a validated
    /// [`QueueName`](crate::QueueName) ([`QueueName::quoted_table`](crate::QueueName::quoted_table)),
    /// never from unchecked text.
    ///
    /// ```no_run
    /// # async fn f(client: &pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::reexports::tokio_postgres::types::Type;
    /// use pgmq_client::{Executor, QueueName};
    ///
    /// let q = QueueName::new("orders")?;
    /// let sql = format!("SELECT count(*) FROM {} WHERE read_ct > $1", q.quoted_table());
    /// let rows = client.executor().query_text(&sql, &[(&3i32, Type::INT4)]).await?;
    /// let retried: i64 = rows[0].get(0);
    /// # Ok(()) }
    /// ```
    fn query_text(
        &self,
        sql: &str,
        params: TypedParams<'_>,
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send;
}

/// Seals [`Executor`]: only this crate's executors implement it (the trait
/// is public in a private module, so no other crate can name it).
pub trait Sealed {}

impl<E: Sealed + ?Sized> Sealed for &E {}
impl Sealed for Connection {}
impl Sealed for bb8::PooledConnection<'_, ConnectionManager> {}
impl Sealed for Transaction<'_> {}
impl Sealed for tokio_postgres::Client {}
impl Sealed for tokio_postgres::Transaction<'_> {}
#[cfg(feature = "deadpool")]
impl Sealed for deadpool_postgres::Pool {}
#[cfg(feature = "deadpool")]
impl Sealed for deadpool_postgres::Object {}

impl<E: Executor + ?Sized> Executor for &E {
    fn query(
        &self,
        stmt: Stmt,
        params: Params<'_>,
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send {
        (**self).query(stmt, params)
    }

    fn query_text(
        &self,
        sql: &str,
        params: TypedParams<'_>,
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send {
        (**self).query_text(sql, params)
    }

    fn autocommit(&self) -> bool {
        (**self).autocommit()
    }

    fn housekeeping_due(&self) -> bool {
        (**self).housekeeping_due()
    }

    fn trace_context(&self) -> bool {
        (**self).trace_context()
    }
}

// Outside a transaction a stale plan aborted nothing: the call is prepared
// and run once more (see `call::on_connection`).
impl Executor for Connection {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, Error> {
        call::on_connection(self, Call::Stmt(stmt, params)).await
    }

    async fn query_text(&self, sql: &str, params: TypedParams<'_>) -> Result<Vec<Row>, Error> {
        call::on_connection(self, Call::Text(sql, params)).await
    }
}

impl Executor for bb8::PooledConnection<'_, ConnectionManager> {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, Error> {
        call::on_connection(self, Call::Stmt(stmt, params)).await
    }

    async fn query_text(&self, sql: &str, params: TypedParams<'_>) -> Result<Vec<Row>, Error> {
        call::on_connection(self, Call::Text(sql, params)).await
    }
}

// In a transaction a stale plan aborted it: the statement is forgotten, so
// that the next call prepares it again, and the error is returned.
impl Executor for Transaction<'_> {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, Error> {
        call::in_transaction(self, Call::Stmt(stmt, params)).await
    }

    async fn query_text(&self, sql: &str, params: TypedParams<'_>) -> Result<Vec<Row>, Error> {
        call::in_transaction(self, Call::Text(sql, params)).await
    }
}

impl Executor for tokio_postgres::Client {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, Error> {
        call::uncached(self, stmt, params).await
    }

    async fn query_text(&self, sql: &str, params: TypedParams<'_>) -> Result<Vec<Row>, Error> {
        call::unnamed(self, sql, params).await
    }
}

impl Executor for tokio_postgres::Transaction<'_> {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, Error> {
        call::uncached(self, stmt, params).await
    }

    async fn query_text(&self, sql: &str, params: TypedParams<'_>) -> Result<Vec<Row>, Error> {
        call::unnamed(self, sql, params).await
    }
}

/// A caller's deadpool-postgres pool (feature `deadpool`): each call checks
/// out a connection, and statements are prepared once per connection in
/// deadpool's own cache (`prepare_cached`), so a service that already has a
/// deadpool pool needs no second one.
///
/// ```no_run
/// # async fn f(pool: deadpool_postgres::Pool, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
/// use pgmq_client::Pgmq;
/// let pgmq = Pgmq::on(pool);
/// pgmq.send(&q, &serde_json::json!({"order": 42})).await?;
/// # Ok(()) }
/// ```
#[cfg(feature = "deadpool")]
impl Executor for deadpool_postgres::Pool {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, Error> {
        let conn = self.get().await.map_err(call::from_deadpool)?;
        if stmt.is_sdk() {
            crate::conn::sdk_trust::check(&**conn).await?;
        }
        call::deadpool(&conn, stmt.sql(), None, params).await
    }

    async fn query_text(&self, sql: &str, params: TypedParams<'_>) -> Result<Vec<Row>, Error> {
        let conn = self.get().await.map_err(call::from_deadpool)?;
        call::deadpool_text(&conn, sql, params).await
    }

    fn autocommit(&self) -> bool {
        true
    }
}

/// One connection of a caller's deadpool-postgres pool (feature
/// `deadpool`), with deadpool's statement cache; inside the caller's
/// transaction when it opened one on it.
#[cfg(feature = "deadpool")]
impl Executor for deadpool_postgres::Object {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, Error> {
        if stmt.is_sdk() {
            crate::conn::sdk_trust::check(&***self).await?;
        }
        call::deadpool(self, stmt.sql(), None, params).await
    }

    async fn query_text(&self, sql: &str, params: TypedParams<'_>) -> Result<Vec<Row>, Error> {
        call::deadpool_text(self, sql, params).await
    }
}
