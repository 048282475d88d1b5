//! The one error type of this crate.

use std::fmt;

use tokio_postgres::error::SqlState;

/// Whether a failed call may still have taken effect on the server.
///
/// A producer that sees an error needs to know whether to send again. A call
/// that failed before its request left the process (no connection could be had,
/// the connection was already closed) certainly did nothing: [`CommitOutcome::NotSent`].
/// A call whose connection died after the request was written may have committed:
/// [`CommitOutcome::Unknown`]; an idempotent retry (or a check by id) is needed. A call
/// the server answered with an error did nothing: [`CommitOutcome::Rejected`].
///
/// (Not to be confused with `pgmq_worker::Outcome`, what a worker's handler
/// decides for a message.)
///
/// ```
/// use pgmq_client::{CommitOutcome, Error};
///
/// // A pool timeout happens before any request leaves: safe to send again.
/// assert_eq!(Error::PoolTimeout.outcome(), CommitOutcome::NotSent);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommitOutcome {
    /// The request never reached the server.
    NotSent,
    /// The server refused the request; nothing was committed.
    Rejected,
    /// The request may or may not have been applied.
    Unknown,
}

/// Errors returned by every call of this crate.
///
/// Branch on the variants; none of them ever carries a password or a payload.
/// Neither `Display` nor `Debug` prints the server's DETAIL or CONTEXT
/// fields, which can quote row values (a unique violation's key, say); ask
/// for them with [`Error::detail`].
///
/// ```
/// use pgmq_client::{Error, QueueName};
///
/// let err = QueueName::new("orders; drop table x").unwrap_err();
/// assert!(matches!(err, Error::InvalidQueueName { .. }));
/// ```
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The queue name is not one PGMQ accepts; no SQL was run.
    #[error("invalid queue name {name:?}: {reason}")]
    InvalidQueueName {
        /// The rejected name (truncated to 64 characters).
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// An argument other than the queue name was out of range; no SQL was run.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The queue does not exist (SQLSTATE 42P01 on its table).
    #[error("queue {queue:?} does not exist (create it with pgmq.create first)")]
    QueueNotFound {
        /// The queue name.
        queue: String,
    },

    /// The connected database has no PGMQ installed.
    #[error(
        "PGMQ is not installed in database {database:?}: run `CREATE EXTENSION pgmq` \
         (or load PGMQ's pgmq.sql on servers without the extension files)"
    )]
    PgmqMissing {
        /// The database connected to.
        database: String,
    },

    /// PGMQ is installed but older than this crate supports.
    #[error(
        "PGMQ {found} is older than the oldest supported version {minimum}: \
         run `ALTER EXTENSION pgmq UPDATE` (or load a newer pgmq.sql)"
    )]
    PgmqTooOld {
        /// The version found.
        found: String,
        /// The oldest version supported.
        minimum: String,
    },

    /// A call needs the SDK's own `pgmq_sdk` schema (idempotent sends,
    /// pause and resume, fleet-wide limits), which this database lacks or
    /// has in an older version: install it with `pgmq install-sdk` or
    /// [`Client::install_sdk_schema`](crate::Client::install_sdk_schema).
    /// Nothing was sent.
    #[error(
        "{feature} needs the pgmq_sdk schema, which this database lacks: run `pgmq install-sdk` \
         (or Client::install_sdk_schema, or apply pgmq_client::sdk_schema::sql())"
    )]
    SdkSchemaMissing {
        /// The feature that needs it.
        feature: &'static str,
    },

    /// The `pgmq_sdk` schema cannot be trusted, so nothing of it was run:
    /// it is owned by a role the connected user does not trust (not the
    /// user itself, a role it is a member of, a superuser, or the owner of
    /// the `pgmq` extension), or it holds an object another role owns, or
    /// another role may create objects in it. The install step
    /// ([`Client::install_sdk_schema`](crate::Client::install_sdk_schema))
    /// refuses such a schema too, and installs only into a schema the
    /// installing role owns. `reason` names the owner and what was found
    /// (role and object names only).
    #[error(
        "the pgmq_sdk schema cannot be trusted ({reason}); nothing of it was run: \
         drop it and install it with `pgmq install-sdk` as the role that should own it"
    )]
    SdkSchemaUntrusted {
        /// Who owns the schema and what in it another role owns.
        reason: String,
    },

    /// The call changes a queue's table (its autovacuum settings), which
    /// only the table's owner may do: the owning role, a member of it, or a
    /// superuser. Nothing was changed; connect as the owner to run it.
    #[error(
        "only the owner of table {table} (role {owner:?}), a member of that role or a superuser \
         may change its settings; the connected role is none of them, so nothing was changed"
    )]
    NotTableOwner {
        /// The table, `pgmq.q_<name>`.
        table: String,
        /// The role that owns it.
        owner: String,
    },

    /// A body, headers or text argument holds a character PostgreSQL cannot
    /// store: a NUL (`\u0000` in JSON, which `jsonb` refuses; a zero byte
    /// in text), or, refused by the server, one the database's encoding
    /// lacks.
    ///
    /// Found before sending, `index` names the message of a batch (None for
    /// a single send or headers common to the batch), `field` what held it,
    /// and nothing was sent. Refused by the server (SQLSTATE 22P05 or 22021),
    /// `index` and `field` are None, `source` is the server's error and
    /// [`Error::sqlstate`] its code.
    ///
    /// ```
    /// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) {
    /// use pgmq_client::Error;
    /// let bodies = [serde_json::json!("ok"), serde_json::json!("nul \u{0}")];
    /// match client.send_batch(&q, &bodies).await {
    ///     Err(Error::UnstorableText { index: Some(1), field: Some("body"), .. }) => {}
    ///     other => panic!("{other:?}"),
    /// }
    /// # }
    /// ```
    #[error("{}", unstorable_text(*.index, *.field, .source.as_ref()))]
    #[non_exhaustive]
    UnstorableText {
        /// The message of a batch that holds it (0-based), when known.
        index: Option<usize>,
        /// What holds it (`"body"`, `"headers"`, `"routing key"`), when known.
        field: Option<&'static str>,
        /// The server's refusal, when it came from the server.
        #[source]
        source: Option<tokio_postgres::Error>,
    },

    /// A payload or header could not be serialized to JSON; nothing was sent.
    #[error("could not serialize the message to JSON: {0}")]
    Serialize(#[source] serde_json::Error),

    /// A message body did not deserialize into the requested type.
    ///
    /// The message stays in the queue and becomes visible again when its
    /// visibility timeout ends; read it as `serde_json::Value` to inspect it.
    /// The error text keeps serde's reason and position but none of the
    /// body's values (`invalid type: string "…", expected u64 at line 1
    /// column 21`), so it can be logged.
    #[error("message {msg_id} does not deserialize into the requested type: {source}")]
    Deserialize {
        /// The message that failed.
        msg_id: i64,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },

    /// A message's headers did not deserialize into the type asked of
    /// [`Message::headers_as`](crate::Message::headers_as). As for
    /// [`Error::Deserialize`], the text keeps serde's reason and position
    /// but none of the headers' values.
    #[error("headers of message {msg_id} do not deserialize into the requested type: {source}")]
    DeserializeHeaders {
        /// The message whose headers failed.
        msg_id: i64,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },

    /// No pooled connection became free within the pool's connection timeout.
    #[error("timed out waiting for a database connection from the pool")]
    PoolTimeout,

    /// A connection could not be opened (unreachable host, wrong password, TLS).
    #[error("could not connect to the database: {}", pg_text(.0))]
    Connect(#[source] tokio_postgres::Error),

    /// The connection was lost while the call was in flight, or before it.
    #[error("database connection lost ({outcome}): {}", pg_text(.source))]
    ConnectionLost {
        /// Whether the call may have taken effect.
        outcome: CommitOutcome,
        /// The underlying error.
        #[source]
        source: tokio_postgres::Error,
    },

    /// The server answered with an error.
    #[error("database error{}: {}", fmt_code(.source), pg_text(.source))]
    Database {
        /// The underlying error; its SQLSTATE is [`Error::sqlstate`].
        #[source]
        source: tokio_postgres::Error,
    },

    /// A configuration value (TLS, pool) was not usable.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// The DSN does not parse as libpq parses it, or holds a value libpq
    /// would refuse or that this crate cannot honour. The error names byte
    /// offsets and keywords, never a value.
    ///
    /// ```
    /// # async fn f() {
    /// use pgmq_client::{Client, DsnError, Error};
    /// let err = Client::connect("postgres://app@db/app?sslmod=require").await.unwrap_err();
    /// assert!(matches!(err, Error::Dsn(DsnError::UnknownKeyword { .. })));
    /// # }
    /// ```
    #[error("invalid DSN: {0}")]
    Dsn(#[from] crate::conn::dsn::DsnError),

    /// A row the server returned did not have the shape this crate expects
    /// (a column of another type, an unexpected NULL, a missing column).
    ///
    /// The statement ran: its effect, if any, stands ([`CommitOutcome::Unknown`]).
    /// Never transient: the same call would get the same row again. It
    /// points at a server whose PGMQ differs from the one this crate was
    /// written for, or at a caller's own SQL (through `?` on a
    /// `Row::try_get` error).
    #[error("unexpected row from the server: {}", pg_text(.source))]
    UnexpectedRow {
        /// The decoding error (its text names the column, never its value).
        #[source]
        source: tokio_postgres::Error,
    },

    /// A redrive batch ([`Redrive::next_batch`](crate::Redrive::next_batch))
    /// lost its connection during COMMIT: its messages may have moved or
    /// not. The text names the target queues with the new msg_ids and the
    /// dead-letter queue with the old ones, to check by hand.
    #[error("{0}")]
    RedriveOutcomeUnknown(String),
}

/// What went wrong, in words: the server's message for a server error (not
/// its DETAIL, which can quote row values), else tokio-postgres' text and
/// its causes (`error connecting to server: Connection refused`).
fn pg_text(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {}", db.severity(), db.message());
    }
    let mut text = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        text.push_str(": ");
        text.push_str(&s.to_string());
        src = s.source();
    }
    text
}

fn unstorable_text(
    index: Option<usize>,
    field: Option<&'static str>,
    source: Option<&tokio_postgres::Error>,
) -> String {
    if let Some(e) = source {
        return format!(
            "the server cannot store a text or JSON value{}: {} (a NUL character, \\u0000, \
             or one the database's encoding lacks); nothing was stored",
            fmt_code(e),
            pg_text(e)
        );
    }
    let what = field.unwrap_or("a value");
    let place = match index {
        Some(i) => format!("message {i} of the batch: its {what}"),
        None => format!("the {what}"),
    };
    format!(
        "{place} holds a NUL character (\\u0000), which PostgreSQL cannot store; nothing was sent"
    )
}

fn fmt_code(e: &tokio_postgres::Error) -> String {
    match e.code() {
        Some(c) => format!(" [{}]", c.code()),
        None => String::new(),
    }
}

impl Error {
    /// The SQLSTATE of a database error, when the server sent one.
    pub fn sqlstate(&self) -> Option<&SqlState> {
        match self {
            Error::Database { source } | Error::ConnectionLost { source, .. } => source.code(),
            Error::Connect(source) => source.code(),
            Error::UnstorableText {
                source: Some(source),
                ..
            } => source.code(),
            _ => None,
        }
    }

    /// The server's DETAIL field of a database error, when it sent one.
    ///
    /// Kept out of `Display` and `Debug` because it can quote row values
    /// (`Key (email)=(ada@example.com) already exists.`): print it only
    /// where those may be shown.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) {
    /// if let Err(e) = client.create(&q).await {
    ///     eprintln!("{e}"); // no DETAIL
    ///     if let Some(detail) = e.detail() {
    ///         eprintln!("detail: {detail}"); // only where row values may appear
    ///     }
    /// }
    /// # }
    /// ```
    pub fn detail(&self) -> Option<&str> {
        self.db_error()?.detail()
    }

    fn db_error(&self) -> Option<&tokio_postgres::error::DbError> {
        match self {
            Error::Database { source }
            | Error::ConnectionLost { source, .. }
            | Error::Connect(source) => source.as_db_error(),
            Error::UnstorableText {
                source: Some(source),
                ..
            } => source.as_db_error(),
            _ => None,
        }
    }

    /// Whether the failed call may have been applied on the server.
    ///
    /// Errors raised before any SQL ran (invalid input, pool timeout, failed
    /// connect) are [`CommitOutcome::NotSent`]; a server error is
    /// [`CommitOutcome::Rejected`]; a connection lost mid-call is [`CommitOutcome::Unknown`].
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::CommitOutcome;
    /// match client.send(&q, &serde_json::json!({"order": 1})).await {
    ///     Ok(id) => println!("sent {id}"),
    ///     // Nothing was stored: the caller may send it again.
    ///     Err(e) if e.outcome() != CommitOutcome::Unknown => return Err(e),
    ///     // May have been stored: look it up, or send idempotently.
    ///     Err(e) => eprintln!("unknown: {e}"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn outcome(&self) -> CommitOutcome {
        match self {
            Error::ConnectionLost { outcome, .. } => *outcome,
            Error::Database { .. }
            | Error::QueueNotFound { .. }
            | Error::PgmqMissing { .. }
            | Error::PgmqTooOld { .. }
            | Error::SdkSchemaMissing { .. }
            | Error::UnstorableText {
                source: Some(_), ..
            } => CommitOutcome::Rejected,
            Error::Deserialize { .. }
            | Error::DeserializeHeaders { .. }
            | Error::UnexpectedRow { .. }
            | Error::RedriveOutcomeUnknown(_) => CommitOutcome::Unknown,
            _ => CommitOutcome::NotSent,
        }
    }

    /// Whether retrying the same call later may succeed: a lost connection, a
    /// pool timeout, an unreachable server, or a server-side transient state
    /// (serialization failure, deadlock, shutdown in progress, too many clients).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::PoolTimeout | Error::ConnectionLost { .. } => true,
            Error::Connect(e) => !matches!(
                e.code(),
                Some(c) if *c == SqlState::INVALID_PASSWORD
                    || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
                    || *c == SqlState::INVALID_CATALOG_NAME
            ),
            Error::Database { source } => match source.code() {
                Some(c) => {
                    *c == SqlState::T_R_SERIALIZATION_FAILURE
                        || *c == SqlState::T_R_DEADLOCK_DETECTED
                        || *c == SqlState::ADMIN_SHUTDOWN
                        || *c == SqlState::CRASH_SHUTDOWN
                        || *c == SqlState::CANNOT_CONNECT_NOW
                        || *c == SqlState::TOO_MANY_CONNECTIONS
                        || c.code().starts_with("08")
                }
                // No SQLSTATE and not a lost connection: a failure on this
                // side (encoding a parameter, parsing a reply), which a
                // retry would meet again.
                None => false,
            },
            _ => false,
        }
    }

    /// The error for a call its caller stopped waiting for (a timeout of
    /// the caller's own): a lost connection whose outcome is unknown, so
    /// transient. Discard the connection it ran on
    /// ([`Connection::mark_broken`](crate::Connection::mark_broken)).
    ///
    /// ```
    /// let e = pgmq_client::Error::timed_out();
    /// assert!(e.is_transient());
    /// assert_eq!(e.outcome(), pgmq_client::CommitOutcome::Unknown);
    /// ```
    pub fn timed_out() -> Error {
        Error::ConnectionLost {
            outcome: CommitOutcome::Unknown,
            source: timeout(),
        }
    }

    /// Whether this is [`Error::ConnectionLost`].
    pub(crate) fn is_lost(&self) -> bool {
        matches!(self, Error::ConnectionLost { .. })
    }

    /// Classifies a `tokio_postgres` error.
    pub(crate) fn from_pg(e: tokio_postgres::Error) -> Error {
        if let Some(db) = e.as_db_error() {
            // The server is going away: the statement may not have committed.
            if db.code().code().starts_with("57P") {
                return Error::ConnectionLost {
                    outcome: CommitOutcome::Unknown,
                    source: e,
                };
            }
            let code = db.code();
            if *code == SqlState::UNTRANSLATABLE_CHARACTER
                || *code == SqlState::CHARACTER_NOT_IN_REPERTOIRE
            {
                return Error::UnstorableText {
                    index: None,
                    field: None,
                    source: Some(e),
                };
            }
            return Error::Database { source: e };
        }
        if e.is_closed() || is_io(&e) {
            return Error::ConnectionLost {
                outcome: CommitOutcome::Unknown,
                source: e,
            };
        }
        if is_row_error(&e) {
            return Error::UnexpectedRow { source: e };
        }
        Error::Database { source: e }
    }

    /// A NUL character found before sending: in `field` of message `index`
    /// of a batch (None: a single send, or headers common to the batch).
    pub(crate) fn unstorable(index: Option<usize>, field: &'static str) -> Error {
        Error::UnstorableText {
            index,
            field: Some(field),
            source: None,
        }
    }

    /// Marks a lost connection as "not sent": used where the failure happened
    /// before the call's own request was written.
    pub(crate) fn not_sent(self) -> Error {
        match self {
            Error::ConnectionLost { source, .. } => Error::ConnectionLost {
                outcome: CommitOutcome::NotSent,
                source,
            },
            other => other,
        }
    }

    /// Turns a missing `pgmq_sdk` schema, function or table into
    /// [`Error::SdkSchemaMissing`] for `feature`.
    pub(crate) fn in_sdk(self, feature: &'static str) -> Error {
        if let Error::Database { source } = &self {
            if let Some(db) = source.as_db_error() {
                let code = db.code();
                let missing = *code == SqlState::INVALID_SCHEMA_NAME
                    || *code == SqlState::UNDEFINED_FUNCTION
                    || *code == SqlState::UNDEFINED_TABLE;
                if missing && db.message().contains("pgmq_sdk") {
                    return Error::SdkSchemaMissing { feature };
                }
            }
        }
        self
    }

    /// Turns "relation pgmq.q_<queue> does not exist" (and PGMQ's own
    /// "Queue ... does not exist" exceptions) into [`Error::QueueNotFound`].
    pub(crate) fn in_queue(self, queue: &str) -> Error {
        if let Error::Database { source } = &self {
            if let Some(db) = source.as_db_error() {
                // PGMQ folds the table name (see `QueueName::table_name`).
                let folded = queue.to_ascii_lowercase();
                let missing_table = *db.code() == SqlState::UNDEFINED_TABLE
                    && (db.message().contains(&format!("q_{folded}"))
                        || db.message().contains(&format!("a_{folded}")));
                let pgmq_says = *db.code() == SqlState::RAISE_EXCEPTION
                    && db.message().contains("does not exist")
                    && db.message().contains(queue);
                if missing_table || pgmq_says {
                    return Error::QueueNotFound {
                        queue: queue.to_owned(),
                    };
                }
            }
        }
        self
    }
}

/// tokio-postgres' error for a call or a connection setup that took too
/// long: an I/O error of kind `TimedOut`, "timed out waiting for the
/// server". tokio-postgres makes its errors only itself, so this one comes
/// from a connection startup over a stream that fails its first write with
/// that I/O error: nothing leaves the process, and the startup never waits
/// (so one poll finishes it).
pub(crate) fn timeout() -> tokio_postgres::Error {
    use std::future::Future;
    use std::io;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    struct TimedOut;
    fn err() -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, "timed out waiting for the server")
    }
    impl tokio::io::AsyncRead for TimedOut {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Ready(Err(err()))
        }
    }
    impl tokio::io::AsyncWrite for TimedOut {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Ready(Err(err()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Err(err()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    let mut config = tokio_postgres::Config::new();
    config
        .user("pgmq")
        .ssl_mode(tokio_postgres::config::SslMode::Disable);
    let startup = config.connect_raw(TimedOut, tokio_postgres::NoTls);
    let mut startup = std::pin::pin!(startup);
    match startup
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(Err(e)) => e,
        // The stream fails every write at once: the startup cannot succeed
        // or wait (the unit test `timeouts_are_lost_connections` holds it).
        _ => unreachable!("a startup over a failing stream ended otherwise"),
    }
}

/// Whether `e` is a failure to read a returned row: `Row::try_get` on a column
/// of another type, a NULL, a missing column, or a `query_one` that got no
/// row. tokio-postgres does not expose its error kinds, only their text.
fn is_row_error(e: &tokio_postgres::Error) -> bool {
    let text = e.to_string();
    text.starts_with("error deserializing column")
        || text.starts_with("invalid column")
        || text.starts_with("query returned an unexpected number of")
}

/// Debug without the server's DETAIL and CONTEXT (see [`Error::detail`]).
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidQueueName { name, reason } => f
                .debug_struct("InvalidQueueName")
                .field("name", name)
                .field("reason", reason)
                .finish(),
            Error::InvalidArgument(s) => f.debug_tuple("InvalidArgument").field(s).finish(),
            Error::QueueNotFound { queue } => f
                .debug_struct("QueueNotFound")
                .field("queue", queue)
                .finish(),
            Error::PgmqMissing { database } => f
                .debug_struct("PgmqMissing")
                .field("database", database)
                .finish(),
            Error::PgmqTooOld { found, minimum } => f
                .debug_struct("PgmqTooOld")
                .field("found", found)
                .field("minimum", minimum)
                .finish(),
            Error::SdkSchemaMissing { feature } => f
                .debug_struct("SdkSchemaMissing")
                .field("feature", feature)
                .finish(),
            Error::SdkSchemaUntrusted { reason } => f
                .debug_struct("SdkSchemaUntrusted")
                .field("reason", reason)
                .finish(),
            Error::NotTableOwner { table, owner } => f
                .debug_struct("NotTableOwner")
                .field("table", table)
                .field("owner", owner)
                .finish(),
            Error::Serialize(e) => f.debug_tuple("Serialize").field(e).finish(),
            Error::Deserialize { msg_id, source } => f
                .debug_struct("Deserialize")
                .field("msg_id", msg_id)
                .field("source", source)
                .finish(),
            Error::DeserializeHeaders { msg_id, source } => f
                .debug_struct("DeserializeHeaders")
                .field("msg_id", msg_id)
                .field("source", source)
                .finish(),
            Error::PoolTimeout => f.write_str("PoolTimeout"),
            Error::Connect(e) => f.debug_tuple("Connect").field(&PgDebug(e)).finish(),
            Error::ConnectionLost { outcome, source } => f
                .debug_struct("ConnectionLost")
                .field("outcome", outcome)
                .field("source", &PgDebug(source))
                .finish(),
            Error::Database { source } => f
                .debug_struct("Database")
                .field("source", &PgDebug(source))
                .finish(),
            Error::Config(s) => f.debug_tuple("Config").field(s).finish(),
            Error::RedriveOutcomeUnknown(s) => {
                f.debug_tuple("RedriveOutcomeUnknown").field(s).finish()
            }
            Error::Dsn(e) => f.debug_tuple("Dsn").field(e).finish(),
            Error::UnexpectedRow { source } => f
                .debug_struct("UnexpectedRow")
                .field("source", &PgDebug(source))
                .finish(),
            Error::UnstorableText {
                index,
                field,
                source,
            } => f
                .debug_struct("UnstorableText")
                .field("index", index)
                .field("field", field)
                .field("source", &source.as_ref().map(PgDebug))
                .finish(),
        }
    }
}

/// A tokio-postgres error in Debug form: SQLSTATE, severity and message of
/// a server error (its DETAIL and CONTEXT left out), else the error's text.
struct PgDebug<'a>(&'a tokio_postgres::Error);

impl fmt::Debug for PgDebug<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_db_error() {
            Some(db) => f
                .debug_struct("DbError")
                .field("code", &db.code().code())
                .field("severity", &db.severity())
                .field("message", &db.message())
                .field("has_detail", &db.detail().is_some())
                .finish_non_exhaustive(),
            None => f.write_str(&pg_text(self.0)),
        }
    }
}

fn is_io(e: &tokio_postgres::Error) -> bool {
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = src {
        if s.is::<std::io::Error>() {
            return true;
        }
        src = s.source();
    }
    // tokio-postgres reports an unexpected EOF without a source.
    let text = e.to_string();
    text.contains("connection closed") || text.contains("unexpected EOF")
}

/// Classifies an error of the caller's own SQL, run on a pooled
/// [`Connection`](crate::Connection) or a [`Transaction`](crate::Transaction)
/// next to PGMQ calls, the way this crate classifies its own: a connection
/// lost mid-call (or a server shutting down) is [`Error::ConnectionLost`]
/// (transient, outcome unknown), an answer from the server is
/// [`Error::Database`] with its SQLSTATE. So `?` works in such code.
///
/// ```no_run
/// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
/// let mut conn = client.connection().await?;
/// let tx = conn.transaction().await?;
/// tx.execute("UPDATE orders SET sent = true WHERE id = $1", &[&42_i64]).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        Error::from_pg(e)
    }
}

impl From<bb8::RunError<tokio_postgres::Error>> for Error {
    fn from(e: bb8::RunError<tokio_postgres::Error>) -> Self {
        match e {
            bb8::RunError::TimedOut => Error::PoolTimeout,
            bb8::RunError::User(e) => Error::Connect(e),
        }
    }
}

/// Shorthand for `Result<T, pgmq_client::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl fmt::Display for CommitOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CommitOutcome::NotSent => "not sent",
            CommitOutcome::Rejected => "rejected",
            CommitOutcome::Unknown => "outcome unknown",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_of_local_errors() {
        assert_eq!(Error::PoolTimeout.outcome(), CommitOutcome::NotSent);
        assert!(Error::PoolTimeout.is_transient());
        let e = Error::InvalidArgument("x".into());
        assert_eq!(e.outcome(), CommitOutcome::NotSent);
        assert!(!e.is_transient());
        let e = Error::QueueNotFound { queue: "q".into() };
        assert_eq!(e.outcome(), CommitOutcome::Rejected);
        assert!(e.to_string().contains("pgmq.create"));
    }

    #[test]
    fn timeouts_are_lost_connections() {
        let e = Error::timed_out();
        assert!(matches!(
            e,
            Error::ConnectionLost {
                outcome: CommitOutcome::Unknown,
                ..
            }
        ));
        assert!(e.is_transient() && e.is_lost());
        assert!(
            e.to_string().contains("timed out waiting for the server"),
            "{e}"
        );
        // The same error through the classification of tokio-postgres' errors.
        assert!(Error::from_pg(timeout()).is_lost());
    }

    #[test]
    fn fixes_are_named() {
        let e = Error::PgmqMissing {
            database: "app".into(),
        };
        assert!(e.to_string().contains("CREATE EXTENSION pgmq"));
        let e = Error::PgmqTooOld {
            found: "1.2.0".into(),
            minimum: "1.11.0".into(),
        };
        assert!(e.to_string().contains("ALTER EXTENSION pgmq UPDATE"));
    }
}
