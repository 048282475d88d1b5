//! The connection and call path: connecting (DSN, TLS, PGMQ's detection),
//! the pools and connections, the executors every call runs on, how one
//! call runs (prepared statements, SQL text, the time bound, what counts as
//! not sent, the `pgmq_sdk` trust check before a connection's first SDK
//! statement), every statement's SQL ([`statements`]), and the errors and
//! row decoding all layers share. Nothing here knows a PGMQ function or an
//! SDK feature beyond the SQL text it runs for them.

pub(crate) mod args;
pub(crate) mod call;
pub(crate) mod client;
pub(crate) mod connection;
pub(crate) mod dsn;
pub(crate) mod error;
pub(crate) mod executor;
pub(crate) mod kept;
pub(crate) mod rows;
pub(crate) mod sdk_trust;
pub(crate) mod statements;
pub mod tls;
pub(crate) mod version;

pub use args::{MAX_BATCH, MAX_SECONDS};
pub use call::TypedParams;
pub use client::{Client, ClientBuilder, Pgmq, Pool};
pub use connection::{Connection, ConnectionManager, Transaction, DEFAULT_CONNECT_TIMEOUT};
pub use dsn::{
    pgpass_lookup, read_dsn_file, redact as redact_dsn, ConnInfo, DsnError, DsnFileError,
    RAW_CREDENTIALS as DSN_RAW_CREDENTIALS,
};
pub use error::{CommitOutcome, Error, Result};
pub use executor::Executor;
pub use kept::{ConnectionPool, HeldConnection, KeptConnections};
pub use version::{detect as detect_pgmq, InstallMode, PgmqInstall, Version, MIN_SUPPORTED};
