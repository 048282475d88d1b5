//! How one call runs, on every executor: the checkout of a pooled
//! connection, the protocol (a cached prepared statement, SQL text prepared
//! once and cached, or unnamed in one round trip), what counts as "not
//! sent", a stale plan prepared again, and the time bound.
//!
//! [`Executor`](crate::Executor)'s implementations choose among these
//! functions; nothing here knows which executor calls it.
//!
//! **Not sent.** A failed call is [`CommitOutcome::NotSent`](crate::CommitOutcome::NotSent)
//! when its own request was certainly never written ([`failure`]): it failed
//! while preparing its statement (a request of its own, before the call's),
//! or its connection was already closed when the request started. Only such
//! a call is repeated on another pooled connection ([`on_pool`]).
//!
//! **Time bound.** [`bounded`] gives a call a limit; past it the connection
//! is abandoned and the call fails as a lost connection of unknown outcome.
//! The crate's own calls take the pool's `connection_timeout` for the
//! checkout and no bound of their own; [`KeptConnections`](crate::KeptConnections)
//! bounds every call.

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, Row, Statement};

use crate::conn::connection::{mark_lost, Connection, ConnectionManager, Transaction};
use crate::conn::error::{CommitOutcome, Error};
use crate::conn::statements::{StatementCache, Stmt};

/// Parameters of one call.
pub type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// Parameters of a call run as SQL text, each with its type.
pub type TypedParams<'a> = &'a [(&'a (dyn ToSql + Sync), Type)];

/// The one rule for "not sent": a failure of `e` with `before_request`
/// (the call's own request was not written yet) is
/// [`CommitOutcome::NotSent`]; otherwise the outcome is the one
/// [`Error::from_pg`] gives (a connection lost mid-call: unknown).
pub(crate) fn failure(e: tokio_postgres::Error, before_request: bool) -> Error {
    let err = Error::from_pg(e);
    if before_request {
        err.not_sent()
    } else {
        err
    }
}

/// Prepares the call's statement: a failure here happened before the call's
/// own request, so it was not sent.
async fn prepare(
    prepare: impl Future<Output = Result<Statement, tokio_postgres::Error>>,
) -> Result<Statement, Error> {
    prepare.await.map_err(|e| failure(e, true))
}

/// Sends the call's request (`request`, not yet polled) on `client`: on a
/// connection found closed before it started, not sent.
async fn request<C: GenericClient + Sync>(
    client: &C,
    request: impl Future<Output = Result<Vec<Row>, tokio_postgres::Error>>,
) -> Result<Vec<Row>, Error> {
    let closed_before = client.client().is_closed();
    request.await.map_err(|e| failure(e, closed_before))
}

/// Whether `e` is PostgreSQL's "cached plan must not change result type"
/// (SQLSTATE 0A000): the result columns of something a prepared statement
/// reads changed under it (`ALTER EXTENSION pgmq UPDATE` adding a field to a
/// type PGMQ returns, say). The statement did not run; preparing it again
/// fixes it.
fn is_stale_plan(e: &Error) -> bool {
    e.sqlstate() == Some(&tokio_postgres::error::SqlState::FEATURE_NOT_SUPPORTED)
        && e.to_string()
            .contains("cached plan must not change result type")
}

/// Runs `attempt`; after a stale plan ([`is_stale_plan`]) calls `forget`
/// and, with `retry`, runs `attempt` once more. A retry that finds the
/// connection inside a failed transaction (one the caller opened with its
/// own `BEGIN`) returns the first error.
async fn fresh_on_stale<F, Fut>(
    attempt: F,
    forget: impl FnOnce(),
    retry: bool,
) -> Result<Vec<Row>, Error>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Vec<Row>, Error>>,
{
    let first = match attempt().await {
        Err(e) if is_stale_plan(&e) => e,
        res => return res,
    };
    forget();
    if !retry {
        return Err(first);
    }
    tracing::debug!(error = %first, "a prepared statement went stale; preparing it again");
    match attempt().await {
        Err(e)
            if e.sqlstate()
                == Some(&tokio_postgres::error::SqlState::IN_FAILED_SQL_TRANSACTION) =>
        {
            Err(first)
        }
        res => res,
    }
}

/// Runs `stmt` on a connection of this crate with its cached prepared
/// statement: one round trip (or unnamed, when the cache keeps nothing). A
/// stale plan makes the cache forget the statement, and with `retry`
/// (outside a transaction, where the failed call aborted nothing) prepares
/// and runs it once more. A call that loses the connection sets `lost`.
async fn cached<C: GenericClient + Sync>(
    client: &C,
    cache: &StatementCache,
    lost: &AtomicBool,
    stmt: Stmt,
    params: Params<'_>,
    retry: bool,
) -> Result<Vec<Row>, Error> {
    if stmt.is_sdk() {
        trust_sdk(client, cache, lost).await?;
    }
    let once = || async {
        if cache.unnamed {
            let typed: Vec<(&(dyn ToSql + Sync), Type)> = params
                .iter()
                .copied()
                .zip(stmt.param_types().iter().cloned())
                .collect();
            return unnamed(client, stmt.sql(), &typed).await;
        }
        let prepared = prepare(cache.get(client.client(), stmt)).await?;
        request(client, client.query(&prepared, params)).await
    };
    fresh_on_stale(once, || cache.forget(stmt), retry)
        .await
        .map_err(|e| mark_lost(lost, e))
}

/// Checks, once per connection, that the `pgmq_sdk` schema may be run
/// ([`crate::conn::sdk_trust::check`]) before the connection first runs a
/// statement that names it.
async fn trust_sdk<C: GenericClient + Sync>(
    client: &C,
    cache: &StatementCache,
    lost: &AtomicBool,
) -> Result<(), Error> {
    if !cache.sdk_trusted.load(std::sync::atomic::Ordering::Relaxed) {
        crate::conn::sdk_trust::check(client)
            .await
            .map_err(|e| mark_lost(lost, e))?;
        cache
            .sdk_trusted
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(())
}

/// Whether SQL text names an object of the `pgmq_sdk` schema (the keyed
/// sends' statements do): such text runs only where the schema is trusted,
/// as the schema's functions do.
pub(crate) fn names_sdk(sql: &str) -> bool {
    sql.contains("pgmq_sdk.")
}

/// Runs SQL text on a connection of this crate: prepared once per
/// connection (cached by its text), then one round trip per call; a stale
/// plan as in [`cached`]. Text naming the `pgmq_sdk` schema ([`names_sdk`])
/// first checks that the schema may be run.
async fn cached_text<C: GenericClient + Sync>(
    client: &C,
    cache: &StatementCache,
    lost: &AtomicBool,
    sql: &str,
    params: TypedParams<'_>,
    retry: bool,
) -> Result<Vec<Row>, Error> {
    if names_sdk(sql) {
        trust_sdk(client, cache, lost).await?;
    }
    if cache.unnamed {
        return unnamed(client, sql, params)
            .await
            .map_err(|e| mark_lost(lost, e));
    }
    let (types, values) = split(params);
    let once = || async {
        let prepared = prepare(cache.get_text(client.client(), sql, &types)).await?;
        request(client, client.query(&prepared, &values)).await
    };
    fresh_on_stale(once, || cache.forget_text(sql), retry)
        .await
        .map_err(|e| mark_lost(lost, e))
}

/// Runs `stmt` on a caller's own client, with no cache to keep it in: it is
/// prepared first (two round trips).
pub(crate) async fn uncached<C: GenericClient + Sync>(
    client: &C,
    stmt: Stmt,
    params: Params<'_>,
) -> Result<Vec<Row>, Error> {
    if stmt.is_sdk() {
        crate::conn::sdk_trust::check(client).await?;
    }
    let prepared = prepare(client.prepare(stmt.sql())).await?;
    request(client, client.query(&prepared, params)).await
}

/// Runs SQL text unprepared, in one round trip (`query_typed`): on a
/// caller's own client, or a connection that keeps no statements.
pub(crate) async fn unnamed<C: GenericClient + Sync>(
    client: &C,
    sql: &str,
    params: TypedParams<'_>,
) -> Result<Vec<Row>, Error> {
    request(client, client.query_typed(sql, params)).await
}

/// The types and the values of `params`.
fn split<'a>(params: TypedParams<'a>) -> (Vec<Type>, Vec<&'a (dyn ToSql + Sync)>) {
    params.iter().map(|(v, t)| (t.clone(), *v)).unzip()
}

/// The time bound of a call: `call` within `limit`; past it, `abandon`
/// is called (the connection's state is unknown: a reply may still come)
/// and the call fails with [`Error::timed_out`], a lost connection whose
/// outcome is unknown.
pub(crate) async fn bounded<T>(
    limit: Duration,
    abandon: impl FnOnce(),
    call: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(limit, call).await {
        Ok(res) => res,
        Err(_) => {
            abandon();
            Err(Error::timed_out())
        }
    }
}

/// One call on a pooled connection: a prepared statement or SQL text.
#[derive(Clone, Copy)]
pub(crate) enum Call<'a> {
    Stmt(Stmt, Params<'a>),
    Text(&'a str, TypedParams<'a>),
}

/// Runs `call` on a connection of this crate, outside a transaction: a
/// stale plan is prepared and run once more.
pub(crate) async fn on_connection(conn: &Connection, call: Call<'_>) -> Result<Vec<Row>, Error> {
    let (client, cache, lost) = (conn.client(), conn.cache(), conn.lost_flag());
    match call {
        Call::Stmt(stmt, params) => cached(client, cache, lost, stmt, params, true).await,
        Call::Text(sql, params) => cached_text(client, cache, lost, sql, params, true).await,
    }
}

/// Runs `call` in a transaction on a connection of this crate: a stale plan
/// aborted the transaction, so the statement is forgotten (the next call
/// prepares it again) and the error returned.
pub(crate) async fn in_transaction(
    tx: &Transaction<'_>,
    call: Call<'_>,
) -> Result<Vec<Row>, Error> {
    let (client, cache, lost) = (tx.client(), tx.cache(), tx.lost_flag());
    match call {
        Call::Stmt(stmt, params) => cached(client, cache, lost, stmt, params, false).await,
        Call::Text(sql, params) => cached_text(client, cache, lost, sql, params, false).await,
    }
}

/// Runs `call` on a connection of `pool` checked out for it. A call that
/// lost its connection before it was sent ([`failure`]) is safe to repeat,
/// and is repeated once on another connection.
pub(crate) async fn on_pool(
    pool: &bb8::Pool<ConnectionManager>,
    call: Call<'_>,
) -> Result<Vec<Row>, Error> {
    let mut retried = false;
    loop {
        let conn = checkout(pool, || pool.get()).await?;
        match on_connection(&conn, call).await {
            Err(e) if !retried && e.outcome() == CommitOutcome::NotSent && e.is_lost() => {
                tracing::debug!("connection lost before the call was sent; once more");
                retried = true;
            }
            res => return res,
        }
    }
}

/// Checks a connection out of `pool`, passing over connections already
/// known to be closed (the server restarted, or ended them while idle): that
/// costs no round trip, and spares a call a connection that cannot work. After
/// as many closed ones as were open at the start the next is returned as is,
/// and a call on it fails with [`Error::ConnectionLost`] and
/// [`CommitOutcome::NotSent`].
///
/// The checkout as a whole is bounded by the pool's `connection_timeout`,
/// and a waiting checkout asks the pool again after pauses that double from
/// [`ASK_AGAIN_FIRST`] to [`ASK_AGAIN_MAX`]. A checkout that finds no idle
/// connection makes bb8 start one connection attempt; when that attempt
/// fails (the server is down or restarting), bb8 starts no other for it, and
/// the checkout would wait out its whole timeout even with the server back a
/// second later. Asking again starts a new attempt whenever the pool has room
/// for one (bb8 never has more attempts pending than checkouts waiting), so a
/// call made during an outage goes through within [`ASK_AGAIN_MAX`] of the
/// server's return. While every connection is busy, asking again only
/// queues the checkout anew.
pub(crate) async fn checkout<'a, F, Fut>(
    pool: &bb8::Pool<ConnectionManager>,
    get: F,
) -> Result<bb8::PooledConnection<'a, ConnectionManager>, Error>
where
    F: Fn() -> Fut,
    Fut: Future<
        Output = Result<
            bb8::PooledConnection<'a, ConnectionManager>,
            bb8::RunError<tokio_postgres::Error>,
        >,
    >,
{
    let deadline = tokio::time::Instant::now() + pool.config().connection_timeout;
    let ask = async || {
        let mut pause = ASK_AGAIN_FIRST;
        loop {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(Error::PoolTimeout);
            }
            match tokio::time::timeout_at(deadline.min(now + pause), get()).await {
                Ok(got) => return got.map_err(Error::from),
                Err(_) => pause = (pause * 2).min(ASK_AGAIN_MAX),
            }
        }
    };
    for _ in 0..pool.state().connections {
        let conn = ask().await?;
        if !conn.is_broken() {
            return Ok(conn);
        }
        // Dropped: bb8 sees `has_broken` and discards it.
        tracing::debug!("passing over a closed pooled connection");
    }
    ask().await
}

/// The first pause before a waiting checkout asks the pool again.
const ASK_AGAIN_FIRST: Duration = Duration::from_millis(100);
/// The longest pause between two asks: how long after the server is back,
/// at most, a waiting checkout starts a connection attempt that can work.
const ASK_AGAIN_MAX: Duration = Duration::from_secs(1);

/// Runs `sql` on a connection of a caller's deadpool pool with deadpool's
/// statement cache (`types`: prepared with those parameter types); a stale
/// plan removes the statement from that cache and prepares and runs it once
/// more (a retry inside a caller's failed transaction returns the first
/// error).
#[cfg(feature = "deadpool")]
pub(crate) async fn deadpool(
    conn: &deadpool_postgres::Object,
    sql: &str,
    types: Option<&[Type]>,
    params: Params<'_>,
) -> Result<Vec<Row>, Error> {
    let client: &tokio_postgres::Client = conn;
    let once = || async {
        let prepared = prepare(async {
            match types {
                None => conn.prepare_cached(sql).await,
                Some(t) => conn.prepare_typed_cached(sql, t).await,
            }
        })
        .await?;
        request(client, client.query(&prepared, params)).await
    };
    let forget = || {
        conn.statement_cache.remove(sql, types.unwrap_or(&[]));
    };
    fresh_on_stale(once, forget, true).await
}

/// SQL text on a deadpool connection, prepared with its parameters' types
/// (see [`deadpool`]).
#[cfg(feature = "deadpool")]
pub(crate) async fn deadpool_text(
    conn: &deadpool_postgres::Object,
    sql: &str,
    params: TypedParams<'_>,
) -> Result<Vec<Row>, Error> {
    if names_sdk(sql) {
        crate::conn::sdk_trust::check(&***conn).await?;
    }
    let (types, values) = split(params);
    deadpool(conn, sql, Some(&types), &values).await
}

/// A deadpool checkout's failure as this crate's error.
#[cfg(feature = "deadpool")]
pub(crate) fn from_deadpool(e: deadpool_postgres::PoolError) -> Error {
    match e {
        deadpool_postgres::PoolError::Backend(e) => Error::Connect(e),
        deadpool_postgres::PoolError::Timeout(_) => Error::PoolTimeout,
        other => Error::Config(format!("deadpool: {other}")),
    }
}
