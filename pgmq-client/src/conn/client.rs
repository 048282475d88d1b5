//! The pool-backed handle: connect, configure, and enter a caller's transaction.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres_rustls::MakeRustlsConnect;

use crate::conn::call::{self, Call, Params, TypedParams};
use crate::conn::connection::{ConnectionManager, DEFAULT_CONNECT_TIMEOUT};
use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::statements::Stmt;
use crate::conn::version::{self, PgmqInstall};

/// PGMQ calls over an [`Executor`].
///
/// Every call is written once and works on any executor: [`Client`] (the
/// pool), a pooled [`Connection`](crate::Connection), a [`Transaction`](crate::Transaction), or a
/// caller's own `tokio_postgres` client or transaction, through [`Pgmq::on`].
///
/// The calls are grouped by file the way PGMQ's docs group them, in the
/// crate's `pgmq/` folder: queues (`queue.rs`), sending (`send.rs`),
/// reading (`read.rs`), acknowledging (`ack.rs`), FIFO groups (`fifo.rs`),
/// notifications (`notify.rs`) and topics (`topics.rs`); the SDK's own
/// features are in `sdk/`.
#[derive(Clone, Debug)]
pub struct Pgmq<E = Pool> {
    ex: E,
}

/// The pool-backed client: `Pgmq` over a bb8 pool of [`Connection`](crate::Connection)s.
///
/// Cloning is cheap; clones share the pool.
pub type Client = Pgmq<Pool>;

impl<E: Executor> Pgmq<E> {
    /// Runs PGMQ calls on `ex`: a connection, a transaction, a pool.
    ///
    /// ```no_run
    /// # async fn f(pg: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// use pgmq_client::{Pgmq, QueueName};
    /// let q = QueueName::new("emails")?;
    /// let tx = pg.transaction().await?;
    /// tx.execute("UPDATE users SET invited = true WHERE id = 1", &[]).await?;
    /// Pgmq::on(&tx).send(&q, &serde_json::json!({"to": 1})).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub fn on(ex: E) -> Self {
        Pgmq { ex }
    }

    /// The executor.
    pub fn executor(&self) -> &E {
        &self.ex
    }

    /// Gives the executor back.
    pub fn into_inner(self) -> E {
        self.ex
    }

    /// Runs `stmt` on the executor, mapping a missing queue table to
    /// [`Error::QueueNotFound`].
    pub(crate) async fn run(
        &self,
        stmt: Stmt,
        queue: Option<&str>,
        params: Params<'_>,
    ) -> Result<Vec<tokio_postgres::Row>, Error> {
        let res = self.ex.query(stmt, params).await;
        match (res, queue) {
            (Err(e), Some(q)) => Err(e.in_queue(q)),
            (res, _) => res,
        }
    }

    /// Runs SQL text on the executor (`Executor::query_text`), mapping a
    /// missing queue table to [`Error::QueueNotFound`].
    pub(crate) async fn run_text(
        &self,
        sql: &str,
        queue: &str,
        params: TypedParams<'_>,
    ) -> Result<Vec<tokio_postgres::Row>, Error> {
        self.ex
            .query_text(sql, params)
            .await
            .map_err(|e| e.in_queue(queue))
    }
}

/// A bb8 pool of [`Connection`](crate::Connection)s, with what was found about PGMQ at connect.
#[derive(Clone)]
pub struct Pool {
    inner: bb8::Pool<ConnectionManager>,
    install: Option<Arc<PgmqInstall>>,
    /// The connection settings, for dedicated connections outside the pool
    /// (LISTEN); None for a pool handed to [`Client::from_pool`].
    dedicated: Option<Arc<(tokio_postgres::Config, MakeRustlsConnect)>>,
    /// Sends carry the current trace context in their headers (feature `otel`).
    trace_context: bool,
    /// When the pool's last housekeeping pass ran (see
    /// `Executor::housekeeping_due`).
    housekeeping: Arc<Housekeeping>,
}

/// Spaces the housekeeping passes a pool runs after keyed sends (deleting
/// expired deduplication keys, in a transaction of their own) at least
/// [`Housekeeping::EVERY`] apart.
#[derive(Debug)]
pub(crate) struct Housekeeping {
    start: std::time::Instant,
    /// Milliseconds after `start` of the last pass; `u64::MAX` before the
    /// first.
    last_ms: std::sync::atomic::AtomicU64,
}

impl Housekeeping {
    const EVERY: Duration = Duration::from_secs(1);

    fn new() -> Arc<Self> {
        Arc::new(Housekeeping {
            start: std::time::Instant::now(),
            last_ms: std::sync::atomic::AtomicU64::new(u64::MAX),
        })
    }

    /// True for one caller at most once per [`Housekeeping::EVERY`].
    fn due(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let now = self.start.elapsed().as_millis() as u64;
        let last = self.last_ms.load(Relaxed);
        if last != u64::MAX && now.saturating_sub(last) < Self::EVERY.as_millis() as u64 {
            return false;
        }
        self.last_ms
            .compare_exchange(last, now, Relaxed, Relaxed)
            .is_ok()
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("state", &self.inner.state())
            .field("install", &self.install)
            .finish()
    }
}

impl Pool {
    /// The settings of the dedicated connections opened outside the pool
    /// (LISTEN); None for a pool handed to [`Client::from_pool`].
    pub(crate) fn dedicated(&self) -> Option<&(tokio_postgres::Config, MakeRustlsConnect)> {
        self.dedicated.as_deref()
    }
}

impl crate::conn::executor::Sealed for Pool {}

impl Executor for Pool {
    async fn query(
        &self,
        stmt: Stmt,
        params: Params<'_>,
    ) -> Result<Vec<tokio_postgres::Row>, Error> {
        call::on_pool(&self.inner, Call::Stmt(stmt, params)).await
    }

    fn autocommit(&self) -> bool {
        true
    }

    fn housekeeping_due(&self) -> bool {
        self.housekeeping.due()
    }

    fn trace_context(&self) -> bool {
        self.trace_context
    }

    async fn query_text(
        &self,
        sql: &str,
        params: TypedParams<'_>,
    ) -> Result<Vec<tokio_postgres::Row>, Error> {
        call::on_pool(&self.inner, Call::Text(sql, params)).await
    }
}

impl Client {
    /// Connects to `dsn` with the default settings (see [`ClientBuilder`]),
    /// checking that PGMQ is installed and supported.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), pgmq_client::Error> {
    /// let client = pgmq_client::Client::connect("postgres://app@localhost/app").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(dsn: &str) -> Result<Client, Error> {
        ClientBuilder::new(dsn).connect().await
    }

    /// A builder for custom pool, timeout and TLS settings.
    pub fn builder(dsn: &str) -> ClientBuilder {
        ClientBuilder::new(dsn)
    }

    /// Uses a bb8 pool you configured yourself, checking PGMQ on one of its connections.
    ///
    /// ```no_run
    /// # async fn f(config: tokio_postgres::Config, tls: tokio_postgres_rustls::MakeRustlsConnect) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::{Client, ConnectionManager};
    /// let pool = bb8::Pool::builder()
    ///     .max_size(4)
    ///     .build_unchecked(ConnectionManager::new(config, tls));
    /// let client = Client::from_pool(pool).await?;
    /// # Ok(()) }
    /// ```
    pub async fn from_pool(pool: bb8::Pool<ConnectionManager>) -> Result<Client, Error> {
        let install = {
            let conn = pool.get().await?;
            version::detect(conn.client()).await?
        };
        Ok(Pgmq::on(Pool {
            inner: pool,
            install: Some(Arc::new(install)),
            dedicated: None,
            trace_context: false,
            housekeeping: Housekeeping::new(),
        }))
    }

    /// Checks out a pooled connection, e.g. to open a
    /// [`transaction`](crate::Connection::transaction).
    pub async fn connection(&self) -> Result<bb8::PooledConnection<'_, ConnectionManager>, Error> {
        let pool = &self.executor().inner;
        call::checkout(pool, || pool.get()).await
    }

    /// Checks out a pooled connection that does not borrow the client.
    pub async fn connection_owned(
        &self,
    ) -> Result<bb8::PooledConnection<'static, ConnectionManager>, Error> {
        let pool = &self.executor().inner;
        call::checkout(pool, || pool.get_owned()).await
    }

    /// The bb8 pool.
    pub fn pool(&self) -> &bb8::Pool<ConnectionManager> {
        &self.executor().inner
    }

    /// What was found about PGMQ at connect (None when the check was skipped).
    pub fn install(&self) -> Option<&PgmqInstall> {
        self.executor().install.as_deref()
    }
}

/// Settings of a [`Client`], with documented defaults.
///
/// | setting | default | why |
/// | --- | --- | --- |
/// | `max_size` | 10 | room for a worker's claimer, completer and heartbeat plus producers |
/// | `min_idle` | none | connections open on demand |
/// | `pool_timeout` | 10 s | how long a call waits for a free connection; one waiting through an outage asks again at least every second, so it goes through within about a second of the server's return instead of waiting out the timeout |
/// | `connect_timeout` | 10 s (unless the DSN sets it) | bound on each attempt (TCP, TLS, authentication), per host and address as in libpq: a host that drops packets is given up for the next one; no hang on a dead host |
/// | TCP keepalive | idle 10 s, then every 5 s, 3 probes (unless the DSN sets `keepalives_idle`) | an idle connection to a host that vanished is dropped within about 25 s instead of the kernel's two hours |
/// | `tcp_user_timeout` | 30 s (unless the DSN sets it) | a connection whose sent data stays unacknowledged that long (a blackholed network) is closed by the kernel; callers with their own bound (the worker's `db_timeout`) notice sooner |
/// | connection order | most recently used first (bb8's LIFO) | calls made one after another run on the same backend, whose caches are warm, rather than rotating through every idle connection (bb8's default FIFO); the connections left idle are the ones bb8 closes after its 10-minute idle timeout |
/// | `test_on_check_out` | false | a `SELECT` per checkout costs a round trip per call; connections known closed, or lost by a call, are passed over and discarded without a round trip; callers retry transient errors |
/// | `application_name` | `pgmq-client` | shows in `pg_stat_activity` |
/// | TLS | rustls, as the DSN's `sslmode` and `sslrootcert` say, following libpq: `disable`; `allow`, `prefer` (default) and `require` encrypt and check the chain only when a root certificate is configured; `verify-ca` checks the chain and `verify-full` chain and host name against `sslrootcert` (a file, or `system`) or `~/.postgresql/root.crt`, never a built-in list | `verify-full` authenticates the server; `channel_binding=require` keeps the password from a man in the middle; see the [`tls`](crate::conn::tls) module |
/// | `check_pgmq` | true | refuse to start without a supported PGMQ |
///
/// ```no_run
/// # async fn f() -> Result<(), pgmq_client::Error> {
/// use std::time::Duration;
/// let client = pgmq_client::Client::builder("postgres://app@db/app?sslmode=require")
///     .max_size(16)
///     .pool_timeout(Duration::from_secs(2))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use]
pub struct ClientBuilder {
    dsn: String,
    max_size: u32,
    min_idle: Option<u32>,
    pool_timeout: Duration,
    connect_timeout: Duration,
    test_on_check_out: bool,
    application_name: String,
    tls: Option<Arc<rustls::ClientConfig>>,
    check_pgmq: bool,
    trace_context: bool,
    libpq_password: bool,
    password: Option<Vec<u8>>,
    prepared_statements: bool,
    listen_dsn: Option<String>,
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("dsn", &crate::conn::dsn::redact(&self.dsn))
            .field("max_size", &self.max_size)
            .field("pool_timeout", &self.pool_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// Defaults for `dsn` (a `postgres://` URL or `key=value` string).
    pub fn new(dsn: &str) -> Self {
        ClientBuilder {
            dsn: dsn.to_owned(),
            max_size: 10,
            min_idle: None,
            pool_timeout: Duration::from_secs(10),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            test_on_check_out: false,
            application_name: "pgmq-client".to_owned(),
            tls: None,
            check_pgmq: true,
            trace_context: false,
            libpq_password: false,
            password: None,
            prepared_statements: true,
            listen_dsn: None,
        }
    }

    /// Whether connections prepare each statement once and keep it (the
    /// default), or run every call as an unnamed statement: one round trip
    /// with the parameter types given (`query_typed`), planned by the server
    /// each time. Turn it off behind PgBouncer in transaction pooling mode
    /// before 1.21 (Debian 12 ships 1.18), which cannot carry named prepared
    /// statements: a statement prepared on one server connection is not
    /// there on the next. The price is a plan per call instead of one per
    /// connection; docs/operations-connections.md, "Behind PgBouncer", says what that
    /// costs.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), pgmq_client::Error> {
    /// let client = pgmq_client::Client::builder("postgres://app@pgbouncer:6432/app")
    ///     .prepared_statements(false)
    ///     // LISTEN cannot go through transaction pooling: a direct DSN for it.
    ///     .listen_dsn("postgres://app@db:5432/app")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn prepared_statements(mut self, yes: bool) -> Self {
        self.prepared_statements = yes;
        self
    }

    /// The DSN of the dedicated connections opened outside the pool, for
    /// LISTEN (`Client::listener`, a worker's
    /// `WakeUp::Notify`); default: the pool's DSN. Point it straight at
    /// PostgreSQL when the pool goes through PgBouncer in transaction mode,
    /// which cannot carry LISTEN. The password comes from the same sources as
    /// the pool's.
    pub fn listen_dsn(mut self, dsn: &str) -> Self {
        self.listen_dsn = Some(dsn.to_owned());
        self
    }

    /// Uses this password in place of any the DSN holds (and of
    /// [`libpq_password`](Self::libpq_password)'s sources): for a program that
    /// resolved the password once, from a secret store or a prompt, and keeps
    /// it out of the DSN strings it passes around. Never shown by `Debug`.
    ///
    /// ```no_run
    /// # async fn f(secret: String) -> Result<(), pgmq_client::Error> {
    /// let client = pgmq_client::Client::builder("postgres://app@db:5432/app")
    ///     .password(secret)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn password(mut self, password: impl Into<Vec<u8>>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// When the DSN holds no password, take it where libpq does: the
    /// `PGPASSWORD` environment variable, else the password file
    /// (`PGPASSFILE`, or `~/.pgpass`; see [`pgpass_lookup`](crate::pgpass_lookup)).
    /// Off by default; command-line tools turn it on so that no password has
    /// to appear on their command line.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), pgmq_client::Error> {
    /// // PGPASSWORD=... or a ~/.pgpass line for db:5432:app:app
    /// let client = pgmq_client::Client::builder("postgres://app@db:5432/app")
    ///     .libpq_password(true)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn libpq_password(mut self, yes: bool) -> Self {
        self.libpq_password = yes;
        self
    }

    /// Largest number of open connections.
    pub fn max_size(mut self, n: u32) -> Self {
        self.max_size = n.max(1);
        self
    }

    /// Connections kept open while idle.
    pub fn min_idle(mut self, n: Option<u32>) -> Self {
        self.min_idle = n;
        self
    }

    /// How long a call waits for a free pooled connection.
    pub fn pool_timeout(mut self, d: Duration) -> Self {
        self.pool_timeout = d;
        self
    }

    /// Bound on each connection attempt (TCP, TLS and authentication), per
    /// host and address as in libpq: when it runs out the next host of the
    /// DSN's list (or the next address of the host's name) is tried, with
    /// the same bound. Used when the DSN sets no `connect_timeout` of its
    /// own (the DSN's, in whole seconds, at least 2, 0 for none, wins).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Whether bb8 runs a query on every checkout to test the connection.
    pub fn test_on_check_out(mut self, yes: bool) -> Self {
        self.test_on_check_out = yes;
        self
    }

    /// The `application_name` the server shows.
    pub fn application_name(mut self, name: &str) -> Self {
        self.application_name = name.to_owned();
        self
    }

    /// Uses this rustls configuration for TLS (client certificates, private
    /// CAs), and TLS always: `sslmode` `allow` and `prefer` (or none) become
    /// `require`, so a server or proxy that refuses TLS is refused and never
    /// sees the password, and `disable` is refused as a contradiction. It decides
    /// how the server's certificate is checked, in place of `sslmode`'s
    /// checks and `sslrootcert` (a configuration built with root
    /// certificates checks chain and host name, as `verify-full` does).
    ///
    /// ```no_run
    /// # async fn f(ca_pem: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
    /// use pgmq_client::reexports::rustls;
    /// let mut roots = rustls::RootCertStore::empty();
    /// for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(ca_pem) {
    ///     roots.add(cert?)?;
    /// }
    /// let tls = rustls::ClientConfig::builder_with_provider(
    ///     rustls::crypto::ring::default_provider().into(),
    /// )
    /// .with_safe_default_protocol_versions()?
    /// .with_root_certificates(roots)
    /// .with_no_client_auth();
    /// let client = pgmq_client::Client::builder("postgres://app@db.internal/app?sslmode=verify-full")
    ///     .tls(tls)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn tls(mut self, config: rustls::ClientConfig) -> Self {
        self.tls = Some(Arc::new(config));
        self
    }

    /// Whether to check PGMQ's presence and version at connect (default true).
    pub fn check_pgmq(mut self, yes: bool) -> Self {
        self.check_pgmq = yes;
        self
    }

    /// The DSN parsed, as libpq parses it ([`ConnInfo`](crate::ConnInfo)).
    fn conninfo(&self) -> Result<crate::ConnInfo, Error> {
        Ok(crate::ConnInfo::parse(&self.dsn)?)
    }

    /// The TLS settings of the DSN, and of [`tls`](Self::tls) when given.
    fn tls_settings(&self, info: &crate::ConnInfo) -> Result<crate::conn::tls::TlsSettings, Error> {
        crate::conn::tls::TlsSettings::from_conninfo(info, self.tls.is_some())
    }

    /// The `tokio_postgres::Config` of the DSN (parsed once, as libpq does,
    /// and set through tokio-postgres' setters), with this builder's
    /// defaults where the DSN says nothing: `connect_timeout`, keepalives,
    /// `tcp_user_timeout`, `application_name`, and the password of
    /// [`password`](Self::password) or [`libpq_password`](Self::libpq_password).
    /// Fails with [`Error::Dsn`] when the DSN does not parse, holds a value
    /// libpq would refuse, or sets a keyword tokio-postgres cannot honour.
    pub fn pg_config(&self) -> Result<tokio_postgres::Config, Error> {
        let info = self.conninfo()?;
        let tls = self.tls_settings(&info)?;
        let dsn = crate::conn::dsn::config::settings(&info)?;
        let mut config = dsn.config;
        config.ssl_mode(tls.wire_mode());
        // The DSN's own connect_timeout (0: none) wins over the builder's.
        match dsn.connect_timeout {
            Some(Some(d)) => {
                config.connect_timeout(d);
            }
            Some(None) => {}
            None => {
                config.connect_timeout(self.connect_timeout);
            }
        }
        // A dead peer is noticed by TCP within about half a minute instead of
        // the kernel's two hours, unless the DSN says otherwise.
        if !dsn.keepalives_set {
            config.keepalives_idle(Duration::from_secs(10));
            config.keepalives_interval(Duration::from_secs(5));
            config.keepalives_retries(3);
        }
        if !dsn.tcp_user_timeout_set {
            config.tcp_user_timeout(Duration::from_secs(30));
        }
        if let Some(pw) = &self.password {
            config.password(pw);
        } else if self.libpq_password && config.get_password().is_none() {
            if let Some(pw) = crate::conn::dsn::libpq_password(&config, dsn.passfile.as_deref()) {
                config.password(pw);
            }
        }
        if config.get_application_name().is_none() {
            config.application_name(&self.application_name);
        }
        Ok(config)
    }

    /// The TLS connector: the configuration given with [`tls`](Self::tls),
    /// or one that checks the server's certificate as the DSN's `sslmode`
    /// and `sslrootcert` say (see the table above). Fails when the DSN
    /// cannot be read, when `sslrootcert` names a file that holds no
    /// readable certificate, or when `verify-ca`/`verify-full` has no root
    /// certificate to check against.
    pub fn make_tls(&self) -> Result<MakeRustlsConnect, Error> {
        let settings = self.tls_settings(&self.conninfo()?)?;
        let config = match &self.tls {
            Some(c) => (**c).clone(),
            None => settings.client_config()?,
        };
        Ok(MakeRustlsConnect::new(config))
    }

    /// Puts the current trace context into the headers of every message
    /// this client sends (single, batch and topic sends), as W3C
    /// `traceparent`/`tracestate` through OpenTelemetry's global propagator
    /// (feature `otel`; default off). They are merged into the caller's
    /// headers, whose own keys win; without an active trace nothing is
    /// added. A worker with the same feature continues the trace. See the
    /// [`trace`](crate::pgmq::trace) module.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), pgmq_client::Error> {
    /// use opentelemetry_sdk::propagation::TraceContextPropagator;
    /// opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    /// let client = pgmq_client::Client::builder("postgres://app@db/app")
    ///     .trace_context(true)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "otel")]
    pub fn trace_context(mut self, yes: bool) -> Self {
        self.trace_context = yes;
        self
    }

    /// Opens the pool (one connection, to check PGMQ) and returns the client.
    pub async fn connect(self) -> Result<Client, Error> {
        let config = self.pg_config()?;
        let tls = self.make_tls()?;
        let dedicated = match &self.listen_dsn {
            None => Some(Arc::new((config.clone(), tls.clone()))),
            Some(dsn) => {
                let mut listen = self.clone();
                listen.dsn = dsn.clone();
                Some(Arc::new((listen.pg_config()?, listen.make_tls()?)))
            }
        };
        let manager =
            ConnectionManager::new(config, tls).prepared_statements(self.prepared_statements);
        // Open the first connection directly, so that a wrong password or an
        // unreachable host surfaces as its own error rather than a pool timeout.
        let first = bb8::ManageConnection::connect(&manager)
            .await
            .map_err(Error::Connect)?;
        let install = if self.check_pgmq {
            Some(Arc::new(version::detect(first.client()).await?))
        } else {
            None
        };
        let pool = bb8::Pool::builder()
            .max_size(self.max_size)
            .min_idle(self.min_idle)
            .connection_timeout(self.pool_timeout)
            .test_on_check_out(self.test_on_check_out)
            // Most recently used first: a sequential caller keeps one warm
            // backend instead of rotating through every idle connection.
            .queue_strategy(bb8::QueueStrategy::Lifo)
            .retry_connection(false)
            .build_unchecked(manager);
        pool.add(first)
            .map_err(|_| Error::Config("the pool refused its first connection".into()))?;
        Ok(Pgmq::on(Pool {
            inner: pool,
            install,
            dedicated,
            trace_context: self.trace_context,
            housekeeping: Housekeeping::new(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::ClientBuilder;

    #[test]
    fn an_explicit_password_wins_and_stays_out_of_debug() {
        let b = ClientBuilder::new("postgres://app@db:5432/app").password("s3cr:et/@");
        assert_eq!(
            b.pg_config().unwrap().get_password(),
            Some(&b"s3cr:et/@"[..])
        );
        assert!(!format!("{b:?}").contains("s3cr"));
        // In place of the DSN's own, even with libpq's sources turned on.
        let b = ClientBuilder::new("host=db user=app password=old")
            .libpq_password(true)
            .password("new");
        assert_eq!(b.pg_config().unwrap().get_password(), Some(&b"new"[..]));
        let b = ClientBuilder::new("postgres://app:old@db/app");
        assert_eq!(b.pg_config().unwrap().get_password(), Some(&b"old"[..]));
    }
}
