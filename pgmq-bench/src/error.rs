//! The one error type of this crate.

/// Everything that can stop a benchmark, a report or a comparison.
///
/// [`Error::exit_code`] maps each to the process exit status the binary uses.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A refusal to run: no explicit DSN, leftover `pgmq_bench_*` queues,
    /// mixing durable and non-durable results. Nothing was changed.
    #[error("refused: {0}")]
    Refused(String),

    /// A command-line or configuration value that cannot work.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// A PGMQ client call failed.
    #[error("pgmq client: {0}")]
    Client(#[from] pgmq_client::Error),

    /// The worker runtime failed.
    #[error("pgmq worker: {0}")]
    Worker(#[from] pgmq_worker::Error),

    /// A plain tokio-postgres call (baseline loops, metadata) failed.
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),

    /// Reading or writing a file, or running a helper script, failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        source: std::io::Error,
    },

    /// A benchmark document could not be encoded or decoded.
    #[error("{context}: {source}")]
    Json {
        /// Which document.
        context: String,
        /// The cause.
        source: serde_json::Error,
    },

    /// The throwaway local cluster could not be started or stopped.
    #[error("local database: {0}")]
    Local(String),

    /// A section made no progress for too long.
    #[error("timed out: {0}")]
    Timeout(String),

    /// The benchmark body panicked (the queues were still dropped).
    #[error("the benchmark panicked: {0}")]
    Panicked(String),

    /// Ctrl-C or SIGTERM arrived (the queues were still dropped).
    #[error("interrupted")]
    Interrupted,
}

impl Error {
    /// The exit status for this error: 2 for refusals and bad configuration,
    /// 130 for an interruption, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Refused(_) | Error::Config(_) => 2,
            Error::Interrupted => 130,
            _ => 1,
        }
    }

    /// An I/O error with what was being done.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// A JSON error with which document.
    pub(crate) fn json(context: impl Into<String>, source: serde_json::Error) -> Self {
        Error::Json {
            context: context.into(),
            source,
        }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
