//! The one error type of this crate.

use std::fmt;

use tokio_postgres::error::SqlState;

/// Whether a failed call may still have taken effect on the server.
///
/// A producer that sees an error needs to know whether to send again. A call
/// that failed before its request left the process (no connection could be had,
/// the connection was already closed) certainly did nothing: [`Outcome::NotSent`].
/// A call whose connection died after the request was written may have committed:
/// [`Outcome::Unknown`]; an idempotent retry (or a check by id) is needed. A call
/// the server answered with an error did nothing: [`Outcome::Rejected`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
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
///
/// ```
/// use pgmq_client::{Error, QueueName};
///
/// let err = QueueName::new("orders; drop table x").unwrap_err();
/// assert!(matches!(err, Error::InvalidQueueName { .. }));
/// ```
#[derive(Debug, thiserror::Error)]
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
        outcome: Outcome,
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

    /// A configuration value (DSN, TLS, pool) was not usable.
    #[error("invalid configuration: {0}")]
    Config(String),
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
            _ => None,
        }
    }

    /// Whether the failed call may have been applied on the server.
    ///
    /// Errors raised before any SQL ran (invalid input, pool timeout, failed
    /// connect) are [`Outcome::NotSent`]; a server error is
    /// [`Outcome::Rejected`]; a connection lost mid-call is [`Outcome::Unknown`].
    pub fn outcome(&self) -> Outcome {
        match self {
            Error::ConnectionLost { outcome, .. } => *outcome,
            Error::Database { .. }
            | Error::QueueNotFound { .. }
            | Error::PgmqMissing { .. }
            | Error::PgmqTooOld { .. } => Outcome::Rejected,
            Error::Deserialize { .. } => Outcome::Unknown,
            _ => Outcome::NotSent,
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
                None => true,
            },
            _ => false,
        }
    }

    /// The error for a call its caller stopped waiting for (a timeout of
    /// the caller's own): a lost connection whose outcome is unknown, so
    /// transient. Discard the connection it ran on
    /// ([`Connection::mark_broken`](crate::Connection::mark_broken)).
    pub fn timed_out() -> Error {
        Error::ConnectionLost {
            outcome: Outcome::Unknown,
            source: tokio_postgres::Error::__private_api_timeout(),
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
                    outcome: Outcome::Unknown,
                    source: e,
                };
            }
            return Error::Database { source: e };
        }
        if e.is_closed() || is_io(&e) {
            return Error::ConnectionLost {
                outcome: Outcome::Unknown,
                source: e,
            };
        }
        Error::Database { source: e }
    }

    /// Marks a lost connection as "not sent": used where the failure happened
    /// before the call's own request was written.
    pub(crate) fn not_sent(self) -> Error {
        match self {
            Error::ConnectionLost { source, .. } => Error::ConnectionLost {
                outcome: Outcome::NotSent,
                source,
            },
            other => other,
        }
    }

    /// Turns "relation pgmq.q_<queue> does not exist" (and PGMQ's own
    /// "Queue ... does not exist" exceptions) into [`Error::QueueNotFound`].
    pub(crate) fn in_queue(self, queue: &str) -> Error {
        if let Error::Database { source } = &self {
            if let Some(db) = source.as_db_error() {
                let table = format!("q_{queue}");
                let missing_table = *db.code() == SqlState::UNDEFINED_TABLE
                    && (db.message().contains(&table)
                        || db.message().contains(&format!("a_{queue}")));
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

/// The same decoding error, its text without any value taken from the body.
///
/// serde quotes offending values (`invalid type: string "4111 1111"`,
/// ``unknown variant `x` ``); those are replaced by `…`. What follows
/// `, expected` describes the target type and is kept, as are the names in
/// `missing field` (they come from the type too).
pub(crate) fn payload_free(e: &serde_json::Error) -> serde_json::Error {
    let text = e.to_string();
    // serde_json appends " at line L column C"; keep the position separately.
    let reason = match text.rfind(" at line ") {
        Some(i) if e.line() > 0 => &text[..i],
        _ => text.as_str(),
    };
    let (about_body, about_type) = match reason.find(", expected") {
        Some(i) => reason.split_at(i),
        None => (reason, ""),
    };
    let about_body = if about_body.starts_with("missing field") {
        about_body.to_owned()
    } else {
        blank_quoted(about_body)
    };
    let msg = if e.line() > 0 {
        format!(
            "{about_body}{about_type} at line {} column {}",
            e.line(),
            e.column()
        )
    } else {
        format!("{about_body}{about_type}")
    };
    <serde_json::Error as serde::de::Error>::custom(msg)
}

/// Replaces the contents of `"..."` and `` `...` `` spans by `…`.
fn blank_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' | '`' => {
                out.push(c);
                out.push('…');
                let mut escaped = false;
                for d in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if d == '\\' && c == '"' {
                        escaped = true;
                    } else if d == c {
                        out.push(c);
                        break;
                    }
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// Shorthand for `Result<T, pgmq_client::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Truncates a user-supplied string for an error message.
pub(crate) fn shorten(s: &str) -> String {
    let mut out: String = s.chars().take(64).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::NotSent => "not sent",
            Outcome::Rejected => "rejected",
            Outcome::Unknown => "outcome unknown",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_of_local_errors() {
        assert_eq!(Error::PoolTimeout.outcome(), Outcome::NotSent);
        assert!(Error::PoolTimeout.is_transient());
        let e = Error::InvalidArgument("x".into());
        assert_eq!(e.outcome(), Outcome::NotSent);
        assert!(!e.is_transient());
        let e = Error::QueueNotFound { queue: "q".into() };
        assert_eq!(e.outcome(), Outcome::Rejected);
        assert!(e.to_string().contains("pgmq.create"));
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

    #[test]
    fn decoding_errors_lose_the_values() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct S {
            id: u64,
            kind: K,
        }
        #[derive(Debug, serde::Deserialize)]
        enum K {
            A,
        }
        for (body, secret, kept) in [
            (
                r#"{"id": "4111 1111", "kind": "A"}"#,
                "4111",
                "expected u64",
            ),
            (r#"{"id": 1, "kind": "Zsecret"}"#, "Zsecret", "expected `A`"),
            (r#"{"id": -77123, "kind": "A"}"#, "77123", "expected u64"),
            (r#"{"id": 1.5e300, "kind": "A"}"#, "1.5", "expected u64"),
            (r#"{"kind": "A"}"#, "\u{0}", "missing field `id`"),
            (r#"{"id": 1, "kind": "A""#, "\u{0}", "EOF"),
        ] {
            let e = serde_json::from_str::<S>(body).unwrap_err();
            let clean = payload_free(&e);
            let text = clean.to_string();
            assert!(!text.contains(secret), "{text}");
            assert!(!format!("{clean:?}").contains(secret), "{clean:?}");
            assert!(text.contains(kept), "{text}");
            assert!(text.contains("line 1 column"), "{text}");
        }
        assert_eq!(blank_quoted(r#"a "x\"y" b `z` c"#), "a \"…\" b `…` c");
    }

    #[test]
    fn shorten_long_input() {
        let long = "x".repeat(200);
        assert_eq!(shorten(&long).chars().count(), 65);
        assert_eq!(shorten("abc"), "abc");
    }
}
