//! A typed, fast async client for [PGMQ](https://github.com/pgmq/pgmq), the
//! Postgres Message Queue, on tokio-postgres and bb8.
//!
//! ```no_run
//! use std::time::Duration;
//! use pgmq_client::{Client, QueueName};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Email { to: String }
//!
//! # async fn run() -> Result<(), pgmq_client::Error> {
//! let client = Client::connect("postgres://pgmq:pgmq@127.0.0.1:5432/pgmq").await?;
//! let q = QueueName::new("emails")?;
//! client.create(&q).await?;
//! client.send(&q, &Email { to: "ada@example.com".into() }).await?;
//! for m in client.read::<Email>(&q, Duration::from_secs(30), 10).await? {
//!     let m = m?; // a body that is not an Email: Error::Deserialize
//!     println!("send to {}", m.body.to);
//!     client.delete(&q, m.msg_id).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! # Behaviour
//!
//! - **One path for every call.** Each PGMQ function is written once, on
//!   [`Pgmq<E>`] over an [`Executor`]. [`Client`] is `Pgmq` over a pool; wrap a
//!   pooled [`Connection`], a [`Transaction`], or your own
//!   `tokio_postgres::Transaction` with [`Pgmq::on`] to run the same call in
//!   your transaction (the outbox pattern: your row and the message commit
//!   together or not at all). How a call runs on each (checkout, protocol,
//!   what counts as not sent) is one module's business: see
//!   `docs/architecture.md`, "pgmq-client, module by module".
//! - **Kept and bounded, for long-running loops.** [`KeptConnections`] keeps
//!   pooled connections between calls while its owner is busy (why: on the
//!   type); each of its calls, like [`HeldConnection::bounded`], runs within
//!   a limit, past which the connection is abandoned (discarded, its
//!   statement cancelled on the server) and the call fails with
//!   [`Error::timed_out`]. They work on a [`Client`]'s pool or a deadpool
//!   pool ([`ConnectionPool`]); pgmq-worker runs on them.
//! - **Prepared once.** Every call's SQL is prepared on first use on each
//!   pooled connection and reused; a call is one round trip.
//! - **Names are checked, never spliced unchecked.** [`QueueName`] accepts
//!   the names PGMQ 1.13 accepts (so queues other PGMQ clients made, such as
//!   `Orders-EU.v2`, can be used) less those it cannot address safely
//!   (non-ASCII, control characters), refusing the rest with the rule
//!   broken, before any SQL runs; names travel as bound parameters. The
//!   calls that are statements on PGMQ's tables rather than PGMQ functions
//!   ([`Pgmq::read_from`], the fenced writes [`Pgmq::delete_fenced`],
//!   [`Pgmq::archive_fenced`], [`Pgmq::requeue_fenced`] and
//!   [`Pgmq::dead_letter_fenced`], the move [`Pgmq::move_batch`], the locks [`Pgmq::lock_fenced`] and
//!   [`Pgmq::lock_batch`], [`Pgmq::release_batch`], the looks
//!   [`Pgmq::peek_raw`], [`Pgmq::peek_archive_raw`] and
//!   [`Pgmq::still_queued`], [`Pgmq::prune_archive_batch`] and
//!   [`Pgmq::retention_batch`]) name the
//!   queue's tables in their SQL as PGMQ folds them (lowercase), always as
//!   quoted identifiers ([`quote_ident`]).
//! - **Catalog functions qualified.** The SQL this crate writes itself calls
//!   `pg_catalog.count`, `pg_catalog.clock_timestamp`, `pg_catalog.unnest`
//!   and so on, so a function of the same name in a schema earlier on the
//!   `search_path` is never called in their place.
//! - **Typed errors.** [`Error`] tells a missing queue, a missing or too-old
//!   PGMQ, a bad payload, a pool timeout, a lost connection (with whether the
//!   call may have been applied: [`Error::outcome`]) and a server error with its
//!   SQLSTATE apart.
//! - **PGMQ detection.** [`Client::connect`] finds PGMQ installed as an
//!   extension or as plain SQL (managed servers) and refuses versions older than
//!   [`MIN_SUPPORTED`].
//! - **Quiet about secrets.** Tracing spans name the call, the queue and batch
//!   sizes; payloads and passwords are never logged ([`redact_dsn`]).
//! - **Pool checkout.** `test_on_check_out` is off by default: testing each
//!   checkout would cost a round trip per call. Instead the pool passes over
//!   connections already known closed (a server restart, an idle connection
//!   ended by the server) and discards a connection once a call on it lost it.
//!   A pool call that failed before its request was sent is repeated once on
//!   another connection; a call that hits a connection lost mid-flight returns
//!   [`Error::ConnectionLost`] with [`CommitOutcome::Unknown`], which
//!   [`Error::is_transient`] reports as retryable. A checkout that waits
//!   through an outage asks the pool again at least every second, so the
//!   call goes through within about a second of the server's return rather
//!   than at its `pool_timeout`.
//! - **Connection order.** The pool hands out the most recently returned
//!   connection first, so calls made one after another stay on one warm
//!   backend instead of rotating through every idle connection.
//! - **SDK objects only by an explicit step.** Idempotent sends
//!   ([`Pgmq::send_keyed`]), pausing a queue ([`Pgmq::pause`]) and
//!   fleet-wide limits ([`FleetLimit`]) keep their state in the SDK's own
//!   schema `pgmq_sdk`, never in PGMQ's tables, created by
//!   [`Client::install_sdk_schema`] or `pgmq install-sdk` (see
//!   [`sdk_schema`]); without it they fail with [`Error::SdkSchemaMissing`].
//! - **TLS as libpq.** The DSN's `sslmode` and `sslrootcert` decide, as in
//!   libpq's table: `disable`; `allow`, `prefer` (the default) and `require`
//!   encrypt and check the chain only when a root certificate is configured;
//!   `verify-ca` checks the chain, `verify-full` chain and host name, against
//!   `sslrootcert` (a PEM file, or `system` for the system's store) or
//!   `~/.postgresql/root.crt`, never a built-in list; or your rustls
//!   configuration via [`ClientBuilder::tls`]. `channel_binding=require`
//!   keeps the password from a man in the middle. See the [`tls`] module.
//!
//! # Features
//!
//! - `cli`: the `pgmq` command-line tool (below).
//! - `deadpool`: PGMQ calls on a caller's deadpool-postgres pool or
//!   connection (`Pgmq::on(pool)`).
//! - `otel`: sends carry the current trace context in their headers (W3C
//!   `traceparent`), with `ClientBuilder::trace_context(true)`; see the
//!   [`trace`] module.
//!
//! # Command-line tool
//!
//! With the `cli` feature the crate builds `pgmq`, a tool for operators: list
//! queues with metrics and watch them refresh, look at messages without
//! claiming them (`peek`), create, drop, purge, send JSON lines from stdin or
//! a file, read or pop as JSON lines, delete or archive by id, change a
//! message's visibility (`set-vt`), list and prune archives, move dead
//! letters back to their source queue (`redrive`), bind topics, switch
//! insert notifications, install the `pgmq_sdk` schema (`install-sdk`), and
//! pause or resume a queue for every worker. Lists print as JSON lines, or
//! as a table with `--table`; the exit status tells a bad command line (2),
//! a missing queue (3), a refusal (4) and an unreachable database (5) apart.
//! `pgmq --help` describes each command.
//!
//! ```text
//! cargo install --path pgmq-client --features cli
//! export DATABASE_URL=postgres://app@db/app   # password from PGPASSWORD or ~/.pgpass
//! pgmq list --table
//! pgmq peek orders -n 5                       # changes neither vt nor read_ct
//! jq -c '.[]' orders.json | pgmq send orders
//! pgmq read orders -n 10 | jq .body
//! pgmq redrive orders_dlq --dry-run
//! ```
//!
//! How the crate is laid out, module by module, is in the repository's
//! `docs/architecture.md`.

#![cfg_attr(docsrs, feature(doc_cfg))]

// The layers, each on the ones before it: the connection and call path,
// PGMQ's functions and tables, the SDK's own schema features. The public
// API is the items re-exported here.
mod conn;
mod pgmq;
mod sdk;

#[doc(inline)]
pub use conn::tls;
#[doc(inline)]
pub use pgmq::trace;
#[doc(inline)]
pub use sdk::sdk_schema;

pub use conn::{
    detect_pgmq, pgpass_lookup, read_dsn_file, redact_dsn, Client, ClientBuilder, CommitOutcome,
    ConnInfo, Connection, ConnectionManager, ConnectionPool, DsnError, DsnFileError, Error,
    Executor, HeldConnection, InstallMode, KeptConnections, Pgmq, PgmqInstall, Pool, Result,
    Transaction, TypedParams, Version, DEFAULT_CONNECT_TIMEOUT, DSN_RAW_CREDENTIALS, MAX_BATCH,
    MAX_SECONDS, MIN_SUPPORTED,
};
pub use pgmq::{
    quote_ident, ArchiveRetention, ArchivedMessage, DeadLetter, DeadLetterReason, Decoded, Delay,
    GroupStrategy, Listener, LockHolder, Message, MoveBatch, MoveHeaders, MoveSelection, Moved,
    Notification, NotificationStream, NotifyThrottle, Pruned, QueueInfo, QueueMetrics, QueueName,
    QueueOverview, RawJson, ReadFrom, ReadOptions, Receipt, Redrive, RedriveBatch, RedriveMoved,
    RedriveOptions, Requeue, RouteMatch, SendOptions, TableAutovacuum, TableColumn, TableRows,
    TopicBinding, Undecoded, FIFO_GROUP_HEADER, MAX_DELAY, MAX_QUEUE_NAME_LEN, NOTIFY_KEEPS_CASE,
    QUEUE_TABLE_AUTOVACUUM,
};
pub use sdk::{
    tick_key, Cadence, DedupKey, DueSchedule, FiredTick, FiringPass, FleetLimit, KeyFrom, KeyLimit,
    PausedQueue, Schedule, ScheduleInfo, Sent, TopicSent, WorkerPresence, DEFAULT_CATCH_UP,
    MAX_CATCH_UP, MAX_DEDUP_KEY_LEN, MAX_KEY_PATH, MAX_SCHEDULE_NAME_LEN, PAUSE_FLAG_GRANTS,
    PRESENCE_KEPT_SECS, SCHEDULE_HEADER, TICK_HEADER,
};

/// This crate's README (its crates.io page), compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// Re-exports of the crates in this crate's public API.
pub mod reexports {
    pub use bb8;
    pub use rustls;
    pub use tokio_postgres;
    pub use tokio_postgres_rustls;
}
