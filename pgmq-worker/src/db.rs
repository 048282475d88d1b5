//! Database calls with a bound: no call of the worker waits for ever.
//!
//! Every read, acknowledgement, heartbeat and release runs on a connection
//! the task checked out, within `db_timeout`. A call that does not answer in
//! time (a half-open connection, a blackholed network, a server that
//! stopped answering) fails as a lost connection of unknown outcome, and the
//! connection is marked broken so that the pool discards it instead of
//! handing it out again; the caller retries on a new one. A late answer of
//! the abandoned call can only be a fenced write that already happened (the
//! retry then matches nothing and is not counted twice) or a read whose
//! messages come back after their visibility timeout.

use std::future::Future;
use std::time::Duration;

use pgmq_client::{Client, Connection, ConnectionManager};

/// A pooled connection a task keeps between calls.
pub(crate) type Held = pgmq_client::reexports::bb8::PooledConnection<'static, ConnectionManager>;

/// Checks out a connection within `limit`.
pub(crate) async fn checkout(client: &Client, limit: Duration) -> Result<Held, pgmq_client::Error> {
    match tokio::time::timeout(limit, client.connection_owned()).await {
        Ok(r) => r,
        Err(_) => Err(pgmq_client::Error::PoolTimeout),
    }
}

/// Runs `call` (made on `conn`) within `limit`; past it, marks `conn`
/// broken and fails with [`pgmq_client::Error::timed_out`].
pub(crate) async fn bounded<T>(
    limit: Duration,
    conn: &Connection,
    call: impl Future<Output = Result<T, pgmq_client::Error>>,
) -> Result<T, pgmq_client::Error> {
    match tokio::time::timeout(limit, call).await {
        Ok(r) => r,
        Err(_) => {
            conn.mark_broken();
            Err(pgmq_client::Error::timed_out())
        }
    }
}
