//! A database connection with its prepared-statement cache, the bb8 manager that
//! makes them, and transactions that keep using the cache.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use std::net::IpAddr;

use bb8_postgres::PostgresConnectionManager;
use tokio_postgres::config::{Host, LoadBalanceHosts};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::conn::error::Error;
use crate::conn::statements::StatementCache;

/// A `tokio_postgres::Client` with a cache of PGMQ's prepared statements.
///
/// It dereferences to the client, so a caller can run its own SQL on it.
pub struct Connection {
    client: tokio_postgres::Client,
    cache: StatementCache,
    /// Set when a call on it lost the connection: the pool then discards it
    /// even if the client has not noticed the socket closing yet.
    lost: AtomicBool,
    /// The TLS connector a cancel request opens its connection with (the
    /// one this connection was opened with; None: plain TCP).
    cancel_tls: Option<MakeRustlsConnect>,
}

impl Connection {
    /// Wraps an open client (its connection task must already be spawned).
    pub fn new(client: tokio_postgres::Client) -> Self {
        Self::with_statements(client, true)
    }

    /// Wraps an open client; with `prepared` false every call runs as an
    /// unnamed statement (`query_typed`, one round trip, planned each
    /// time), which PgBouncer's transaction mode before 1.21 can carry.
    pub fn with_statements(client: tokio_postgres::Client, prepared: bool) -> Self {
        Connection {
            client,
            cache: StatementCache::new(!prepared),
            lost: AtomicBool::new(false),
            cancel_tls: None,
        }
    }

    /// Sends [`abandon`](Self::abandon)'s cancel requests through `tls`
    /// (the connector the connection was opened with), as a server that
    /// takes only TLS connections needs.
    pub(crate) fn cancelling_with(mut self, tls: Option<MakeRustlsConnect>) -> Self {
        self.cancel_tls = tls;
        self
    }

    /// Whether the connection is closed, or a call on it lost it.
    pub fn is_broken(&self) -> bool {
        self.lost.load(Ordering::Relaxed) || self.client.is_closed()
    }

    pub(crate) fn lost_flag(&self) -> &AtomicBool {
        &self.lost
    }

    /// Marks the connection as broken, so that the pool discards it instead
    /// of handing it out again: for a caller that gave up waiting on a call
    /// (a timeout), after which the connection's state is unknown (a reply
    /// may still come, or the network may be gone).
    pub fn mark_broken(&self) {
        self.lost.store(true, Ordering::Relaxed);
    }

    /// Gives up on the call in flight: marks the connection broken (as
    /// [`mark_broken`](Self::mark_broken)) and asks the server to cancel
    /// the statement it runs for it, so that an abandoned call does not go on
    /// on the server (waiting on a lock, say) after its connection was
    /// discarded. The cancel request goes out in the background on a
    /// connection of its own (PostgreSQL's cancel protocol), with the TLS
    /// connector this connection was opened with; it is best effort, and
    /// cancels nothing when the statement already ended.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let conn = client.connection().await?;
    /// let slow = conn.simple_query("SELECT pg_sleep(60)");
    /// if tokio::time::timeout(std::time::Duration::from_secs(1), slow).await.is_err() {
    ///     conn.abandon(); // the server stops the sleep; the pool drops the connection
    /// }
    /// # Ok(()) }
    /// ```
    pub fn abandon(&self) {
        self.mark_broken();
        cancel_in_background(&self.client, self.cancel_tls.clone());
    }

    /// The underlying client.
    pub fn client(&self) -> &tokio_postgres::Client {
        &self.client
    }

    pub(crate) fn cache(&self) -> &StatementCache {
        &self.cache
    }

    /// Forgets the prepared statements, e.g. after PGMQ was dropped and
    /// re-installed in the database (its functions then have new oids).
    pub fn clear_statement_cache(&mut self) {
        self.cache.clear();
    }

    /// Starts a transaction in which PGMQ calls still use this connection's
    /// prepared statements. Dereferences to `tokio_postgres::Transaction` for
    /// the caller's own SQL; commit or roll back as usual.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), Box<dyn std::error::Error>> {
    /// use pgmq_client::Pgmq;
    /// let mut conn = client.connection().await?;
    /// let tx = conn.transaction().await?;
    /// tx.execute("INSERT INTO orders (id) VALUES (42)", &[]).await?;
    /// Pgmq::on(&tx).send(&q, &serde_json::json!({"order": 42})).await?;
    /// tx.commit().await?; // the row and the message, or neither
    /// # Ok(()) }
    /// ```
    pub async fn transaction(&mut self) -> Result<Transaction<'_>, Error> {
        let tx = self
            .client
            .transaction()
            .await
            .map_err(|e| mark_lost(&self.lost, Error::from_pg(e)))?;
        Ok(Transaction {
            tx,
            cache: &self.cache,
            lost: &self.lost,
        })
    }
}

impl Deref for Connection {
    type Target = tokio_postgres::Client;
    fn deref(&self) -> &tokio_postgres::Client {
        &self.client
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("closed", &self.client.is_closed())
            .finish_non_exhaustive()
    }
}

/// A transaction on a [`Connection`] that keeps using its statement cache.
pub struct Transaction<'a> {
    tx: tokio_postgres::Transaction<'a>,
    cache: &'a StatementCache,
    lost: &'a AtomicBool,
}

impl<'a> Transaction<'a> {
    /// Starts a transaction on a caller's own client (one of a deadpool
    /// pool, say), in which PGMQ calls run as unnamed statements: one round
    /// trip each, with no statement cache to keep. A call that finds the
    /// connection lost sets `lost`, for the caller to discard it.
    ///
    /// ```no_run
    /// # async fn f(mut pg: tokio_postgres::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::{Pgmq, Transaction};
    /// let lost = std::sync::atomic::AtomicBool::new(false);
    /// let tx = Transaction::begin_unprepared(&mut pg, &lost).await?;
    /// Pgmq::on(&tx).send(&q, &serde_json::json!({"order": 42})).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn begin_unprepared(
        client: &'a mut tokio_postgres::Client,
        lost: &'a AtomicBool,
    ) -> Result<Transaction<'a>, Error> {
        static UNNAMED: std::sync::OnceLock<StatementCache> = std::sync::OnceLock::new();
        let tx = client
            .transaction()
            .await
            .map_err(|e| mark_lost(lost, Error::from_pg(e)))?;
        Ok(Transaction {
            tx,
            cache: UNNAMED.get_or_init(|| StatementCache::new(true)),
            lost,
        })
    }

    /// Commits.
    pub async fn commit(self) -> Result<(), Error> {
        let lost = self.lost;
        self.tx
            .commit()
            .await
            .map_err(|e| mark_lost(lost, Error::from_pg(e)))
    }

    /// Rolls back (dropping the transaction does too).
    pub async fn rollback(self) -> Result<(), Error> {
        let lost = self.lost;
        self.tx
            .rollback()
            .await
            .map_err(|e| mark_lost(lost, Error::from_pg(e)))
    }

    pub(crate) fn client(&self) -> &tokio_postgres::Transaction<'a> {
        &self.tx
    }

    pub(crate) fn cache(&self) -> &StatementCache {
        self.cache
    }

    pub(crate) fn lost_flag(&self) -> &AtomicBool {
        self.lost
    }
}

impl<'a> Deref for Transaction<'a> {
    type Target = tokio_postgres::Transaction<'a>;
    fn deref(&self) -> &tokio_postgres::Transaction<'a> {
        &self.tx
    }
}

/// Asks the server to cancel what `client`'s session is running: in the
/// background (a cancel request opens a connection of its own), bounded by
/// [`DEFAULT_CONNECT_TIMEOUT`], through `tls` when given (plain TCP
/// otherwise, which a server that requires TLS refuses). Outside a tokio
/// runtime nothing is sent.
pub fn cancel_in_background(client: &tokio_postgres::Client, tls: Option<MakeRustlsConnect>) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let token = client.cancel_token();
    rt.spawn(async move {
        let sent = async {
            match tls {
                Some(tls) => token.cancel_query(tls).await,
                None => token.cancel_query(tokio_postgres::NoTls).await,
            }
        };
        match tokio::time::timeout(DEFAULT_CONNECT_TIMEOUT, sent).await {
            Ok(Ok(())) => tracing::debug!("cancel request sent for an abandoned call"),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cancel request for an abandoned call failed")
            }
            Err(_) => tracing::debug!("cancel request for an abandoned call timed out"),
        }
    });
}

/// Records on `lost` that the connection is gone when `err` says so.
pub(crate) fn mark_lost(lost: &AtomicBool, err: Error) -> Error {
    if err.is_lost() {
        lost.store(true, Ordering::Relaxed);
    }
    err
}

/// The bb8 connection manager: each connection opened host by host and
/// address by address as libpq does (see [`ConnectionManager::new`]),
/// wrapped in a [`Connection`] with its statement cache.
///
/// Build one to configure a bb8 pool yourself and hand it to
/// [`Client::from_pool`](crate::Client::from_pool).
pub struct ConnectionManager {
    source: Source,
    /// Whether connections prepare and cache their statements (see
    /// [`Connection::with_statements`]).
    prepared: bool,
}

enum Source {
    Own {
        config: tokio_postgres::Config,
        tls: MakeRustlsConnect,
    },
    Bb8(PostgresConnectionManager<MakeRustlsConnect>),
}

impl ConnectionManager {
    /// A manager for `config`, negotiating TLS with `tls` when the config's
    /// `sslmode` asks for it. The config's `connect_timeout` bounds each
    /// attempt's whole setup (TCP, TLS, authentication), not only the TCP
    /// connect as in tokio-postgres, and applies per host and per address
    /// as in libpq: a server that accepts the connection and never answers
    /// fails its attempt in time, and the next host is tried.
    pub fn new(config: tokio_postgres::Config, tls: MakeRustlsConnect) -> Self {
        ConnectionManager {
            source: Source::Own { config, tls },
            prepared: true,
        }
    }

    /// Wraps an existing bb8-postgres manager (its connection setup is
    /// bounded only as its config says).
    pub fn from_postgres_manager(inner: PostgresConnectionManager<MakeRustlsConnect>) -> Self {
        ConnectionManager {
            source: Source::Bb8(inner),
            prepared: true,
        }
    }
}

impl ConnectionManager {
    /// With `false`, connections run every call as an unnamed statement
    /// (see [`ClientBuilder::prepared_statements`](crate::ClientBuilder::prepared_statements)).
    pub fn prepared_statements(mut self, yes: bool) -> Self {
        self.prepared = yes;
        self
    }
}

/// Runs a connection setup within `limit` (when set); past it, fails with
/// an I/O error of kind `TimedOut` ("timed out waiting for the server").
async fn bounded_setup<T>(
    limit: Option<Duration>,
    setup: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, tokio_postgres::Error> {
    match limit {
        Some(limit) => tokio::time::timeout(limit, setup)
            .await
            // tokio-postgres bounds only the TCP connect; past the bound on
            // the whole setup, the same error as a call that timed out.
            .unwrap_or_else(|_| Err(crate::conn::error::timeout())),
        None => setup.await,
    }
}

/// A connection and the task that drives it.
pub(crate) type Opened = (
    tokio_postgres::Client,
    tokio_postgres::Connection<
        tokio_postgres::Socket,
        <MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>>::Stream,
    >,
);

/// One place to connect to: a host (name or socket directory), the
/// address to use for it, and the port.
struct Target {
    host: Option<Host>,
    addr: Option<IpAddr>,
    port: u16,
}

/// `config` with only `target` as its host, every other setting kept.
fn single(config: &tokio_postgres::Config, target: &Target) -> tokio_postgres::Config {
    let mut c = tokio_postgres::Config::new();
    if let Some(u) = config.get_user() {
        c.user(u);
    }
    if let Some(p) = config.get_password() {
        c.password(p);
    }
    if let Some(d) = config.get_dbname() {
        c.dbname(d);
    }
    if let Some(o) = config.get_options() {
        c.options(o);
    }
    if let Some(a) = config.get_application_name() {
        c.application_name(a);
    }
    if let Some(t) = config.get_connect_timeout() {
        c.connect_timeout(*t);
    }
    if let Some(t) = config.get_tcp_user_timeout() {
        c.tcp_user_timeout(*t);
    }
    if let Some(i) = config.get_keepalives_interval() {
        c.keepalives_interval(i);
    }
    if let Some(r) = config.get_keepalives_retries() {
        c.keepalives_retries(r);
    }
    c.ssl_mode(config.get_ssl_mode())
        .ssl_negotiation(config.get_ssl_negotiation())
        .keepalives(config.get_keepalives())
        .keepalives_idle(config.get_keepalives_idle())
        .target_session_attrs(config.get_target_session_attrs())
        .channel_binding(config.get_channel_binding())
        .port(target.port);
    match &target.host {
        Some(Host::Tcp(h)) => {
            c.host(h);
        }
        #[cfg(unix)]
        Some(Host::Unix(p)) => {
            c.host_path(p);
        }
        None => {}
    }
    if let Some(a) = target.addr {
        c.hostaddr(a);
    }
    c
}

/// A random order of `items` (`load_balance_hosts=random`).
fn shuffle<T>(items: &mut [T]) {
    use std::hash::{BuildHasher, Hasher};
    let mut seed = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    for i in (1..items.len()).rev() {
        // xorshift64: enough to spread connections over hosts.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        items.swap(i, (seed % (i as u64 + 1)) as usize);
    }
}

/// Opens a connection as libpq does with a host list: each host in turn
/// (in a random order with `load_balance_hosts=random`), each address of a
/// host name in turn, every attempt bounded by the config's
/// `connect_timeout` over its whole setup (TCP, TLS, authentication and the
/// `target_session_attrs` check). The first attempt that succeeds wins; when
/// all fail, the last error is returned.
pub(crate) async fn connect_each(
    config: &tokio_postgres::Config,
    tls: &MakeRustlsConnect,
) -> Result<Opened, tokio_postgres::Error> {
    let limit = config.get_connect_timeout().copied();
    let (hosts, addrs, ports) = (
        config.get_hosts(),
        config.get_hostaddrs(),
        config.get_ports(),
    );
    let count = hosts.len().max(addrs.len());
    let consistent = count > 0
        && (hosts.is_empty() || addrs.is_empty() || hosts.len() == addrs.len())
        && (ports.len() <= 1 || ports.len() == count);
    if !consistent {
        // tokio-postgres refuses it, with its own error.
        return bounded_setup(limit, config.connect(tls.clone())).await;
    }
    let random = config.get_load_balance_hosts() == LoadBalanceHosts::Random;
    let mut order: Vec<usize> = (0..count).collect();
    if random {
        shuffle(&mut order);
    }
    let mut last = None;
    for i in order {
        let host = hosts.get(i).cloned();
        let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        let mut targets = Vec::new();
        match (&host, addrs.get(i)) {
            (_, Some(addr)) => targets.push(Target {
                host,
                addr: Some(*addr),
                port,
            }),
            (Some(Host::Tcp(name)), None) if name.parse::<IpAddr>().is_err() => {
                // Resolved here, so that each address gets its own attempt.
                let resolved = match limit {
                    Some(l) => {
                        tokio::time::timeout(l, tokio::net::lookup_host((name.as_str(), port)))
                            .await
                            .ok()
                    }
                    None => Some(tokio::net::lookup_host((name.as_str(), port)).await),
                };
                if let Some(Ok(found)) = resolved {
                    let mut found: Vec<IpAddr> = found.map(|a| a.ip()).collect();
                    found.dedup();
                    if random {
                        shuffle(&mut found);
                    }
                    targets.extend(found.into_iter().map(|addr| Target {
                        host: host.clone(),
                        addr: Some(addr),
                        port,
                    }));
                }
                // Not resolved: tokio-postgres resolves it again and says why not.
                if targets.is_empty() {
                    targets.push(Target {
                        host: hosts.get(i).cloned(),
                        addr: None,
                        port,
                    });
                }
            }
            _ => targets.push(Target {
                host,
                addr: None,
                port,
            }),
        }
        for target in targets {
            let attempt = single(config, &target);
            match bounded_setup(limit, attempt.connect(tls.clone())).await {
                Ok(opened) => return Ok(opened),
                Err(e) => {
                    tracing::debug!(error = %e, host = i, "connection attempt failed; next host");
                    last = Some(e);
                }
            }
        }
    }
    match last {
        Some(e) => Err(e),
        None => bounded_setup(limit, config.connect(tls.clone())).await,
    }
}

impl bb8::ManageConnection for ConnectionManager {
    type Connection = Connection;
    type Error = tokio_postgres::Error;

    async fn connect(&self) -> Result<Connection, tokio_postgres::Error> {
        let (client, cancel_tls) = match &self.source {
            Source::Own { config, tls } => {
                let (client, connection) = connect_each(config, tls).await?;
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!(error = %e, "pooled connection ended");
                    }
                });
                (client, Some(tls.clone()))
            }
            // A wrapped manager's connector is not known: its abandoned
            // calls are not cancelled on the server (see Connection::abandon).
            Source::Bb8(inner) => (inner.connect().await?, None),
        };
        Ok(Connection::with_statements(client, self.prepared).cancelling_with(cancel_tls))
    }

    async fn is_valid(&self, conn: &mut Connection) -> Result<(), tokio_postgres::Error> {
        conn.client.simple_query("").await.map(|_| ())
    }

    fn has_broken(&self, conn: &mut Connection) -> bool {
        conn.is_broken()
    }
}

impl std::fmt::Debug for ConnectionManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The inner config holds the password: never print it.
        f.write_str("ConnectionManager { .. }")
    }
}

/// How long a caller waits for TCP connect + authentication by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
