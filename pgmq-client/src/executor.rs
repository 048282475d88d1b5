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

use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::connection::{run_cached, Connection, ConnectionManager, Transaction};
use crate::error::Error;
use crate::statements::Stmt;

/// Parameters of one call.
pub type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// Something PGMQ calls can run on.
///
/// Implemented for [`Pool`](crate::Pool) (checks out a connection per call),
/// [`Connection`], [`Transaction`], bb8's pooled connection,
/// `tokio_postgres::Client` and `tokio_postgres::Transaction`, and references
/// to any of them.
pub trait Executor: Send + Sync {
    /// Runs one statement and returns its rows.
    fn query(
        &self,
        stmt: Stmt,
        params: Params<'_>,
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send;

    /// Whether each call runs in a transaction of its own, so that a failed
    /// call can be repeated without touching a caller's transaction. True for
    /// [`Pool`](crate::Pool); false (the default) for connections and
    /// transactions, where an error aborts the caller's transaction.
    fn autocommit(&self) -> bool {
        false
    }
}

impl<E: Executor + ?Sized> Executor for &E {
    fn query(
        &self,
        stmt: Stmt,
        params: Params<'_>,
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send {
        (**self).query(stmt, params)
    }

    fn autocommit(&self) -> bool {
        (**self).autocommit()
    }
}

impl Executor for Connection {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, Error> {
        run_cached(self.client(), self.cache(), self.lost_flag(), stmt, params).await
    }
}

impl Executor for bb8::PooledConnection<'_, ConnectionManager> {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, Error> {
        let conn: &Connection = self;
        conn.query(stmt, params).await
    }
}

impl Executor for Transaction<'_> {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, Error> {
        run_cached(self.client(), self.cache(), self.lost_flag(), stmt, params).await
    }
}

impl Executor for tokio_postgres::Client {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, Error> {
        run_uncached(self, stmt, params).await
    }
}

impl Executor for tokio_postgres::Transaction<'_> {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, Error> {
        run_uncached(self, stmt, params).await
    }
}

async fn run_uncached<C: tokio_postgres::GenericClient + Sync>(
    client: &C,
    stmt: Stmt,
    params: Params<'_>,
) -> Result<Vec<Row>, Error> {
    let prepared = client
        .prepare(stmt.sql())
        .await
        // Nothing of the call itself was sent yet.
        .map_err(|e| Error::from_pg(e).not_sent())?;
    client
        .query(&prepared, params)
        .await
        .map_err(Error::from_pg)
}
