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

    /// A task of the worker itself ended abnormally (a bug: please report it).
    #[error("worker task failed: {0}")]
    Task(String),
}
