//! The one error type of this crate.

/// Errors of building or running a [`Worker`](crate::Worker).
///
/// Faults while running (a lost connection, a server restart, a failed
/// acknowledgement) are not errors: the worker logs them, backs off and
/// resumes, and counts them in its [`StatsSnapshot`](crate::StatsSnapshot).
/// Only what stops a worker from starting is returned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting is out of range or missing (no handler, zero concurrency).
    #[error("invalid worker configuration: {0}")]
    Config(String),

    /// A database call failed in a way retrying will not fix (the queue does
    /// not exist, PGMQ is missing, permission denied).
    #[error(transparent)]
    Client(#[from] pgmq_client::Error),

    /// The connection pool cannot hold the transactions of a
    /// [`transactional_handler`](crate::WorkerBuilder::transactional_handler)'s
    /// `concurrency` handlers plus the worker's own connections (`claimers` +
    /// `ack_flushers` + 1); from [`build`](crate::WorkerBuilder::build).
    /// Raise the pool's `max_size`, lower `concurrency`, or opt out with
    /// [`allow_small_pool`](crate::WorkerBuilder::allow_small_pool).
    #[error("the connection pool holds {size} connections, but {concurrency} handler transactions and the worker's own {own} need {needed}: raise the pool's max_size, lower concurrency, or call allow_small_pool(true)")]
    #[non_exhaustive]
    PoolTooSmall {
        /// The pool's `max_size`.
        size: usize,
        /// `concurrency` + the worker's own.
        needed: usize,
        /// The handlers, each holding a connection for its transaction.
        concurrency: usize,
        /// The worker's own connections: `claimers` + `ack_flushers` + 1.
        own: usize,
    },

    /// The start-up DDL on the queue table (enabling the insert trigger
    /// for [`WakeUp::Notify`](crate::WakeUp::Notify)) could not take its
    /// lock: other sessions held locks on the table through every try (a
    /// long transaction, say). The worker does not wait behind them, since
    /// every reader and producer of the queue would then wait behind the
    /// worker; it fails the start instead, naming them.
    #[error("could not change the insert trigger of {table}: sessions holding locks on it kept it from taking its lock through every try: {holders}")]
    #[non_exhaustive]
    Locked {
        /// The queue table.
        table: String,
        /// The sessions holding locks on it (pid, application name, state,
        /// how long their transaction has been open).
        holders: String,
    },

    /// The worker's role may not read whether its queue is paused: the
    /// `pgmq_sdk` schema is there, but reading its pause flag failed with
    /// SQLSTATE 42501 (insufficient privilege). Such a worker would claim
    /// while the queue is paused, so it does not start; `grants` are the
    /// statements that give the role what it lacks. (A right revoked while
    /// the worker runs makes it stop claiming instead, see
    /// [`Health::pause_flag_unreadable`](crate::Health::pause_flag_unreadable).)
    #[error("the worker's role may not read whether queue {queue} is paused ({source}); it would claim while the queue is paused, so it does not start: {grants}")]
    #[non_exhaustive]
    PauseFlagUnreadable {
        /// The queue.
        queue: String,
        /// The grants the role lacks, as an operator runs them.
        grants: &'static str,
        /// The refused read.
        source: pgmq_client::Error,
    },

    /// A task of the worker itself ended abnormally (a bug: please report it).
    #[error("worker task failed: {0}")]
    Task(String),
}
