//! Small helpers shared by the runnable examples of `pgmq-client` and
//! `pgmq-worker`, which live beside this crate as `[[example]]` targets:
//!
//! | example | shows |
//! | --- | --- |
//! | `quickstart` | create a queue, send, read, delete |
//! | `typed_worker` | a worker over a serde struct: retries, a dead-letter queue, Ctrl-C |
//! | `outbox` | a row and a message committed (or rolled back) together |
//! | `notify` | wake-up latency of a LISTEN/NOTIFY worker against a polling one |
//! | `topics_fifo` | fan-out with topic bindings, and FIFO groups |
//! | `metrics` | a worker's Prometheus metrics on `127.0.0.1:9898/metrics` |
//! | `axum_service` | an HTTP service: outbox producers, a worker, `/healthz`, one shutdown |
//! | `worker_group` | one `WorkerGroup` over several queues |
//! | `ledger` | a transactional handler booking a ledger, effectively once |
//! | `deadpool_shared` | producers and a worker on the service's deadpool pool |
//! | `fifo_consumer` | a worker over FIFO groups, each group in order |
//! | `schedules` | periodic sends: a schedule fired by two schedulers, each tick once |
//!
//! Run one with `cargo run -p pgmq-examples --example <name>`; each reads the
//! database from `DATABASE_URL` (default: the docker compose database of
//! `docker/`, `postgres://pgmq:pgmq@127.0.0.1:5432/pgmq`) and drops the queues
//! it created.

use pgmq_client::QueueName;

/// The DSN of the docker compose database in `docker/` (local development
/// credentials).
pub const DEFAULT_DSN: &str = "postgres://pgmq:pgmq@127.0.0.1:5432/pgmq";

/// `DATABASE_URL`, or [`DEFAULT_DSN`] when it is unset.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DSN.to_owned())
}

/// A queue name of its own for this process: `<prefix>_<pid>`, so that two
/// runs of an example (or an example and a test) never share a queue.
///
/// ```
/// let q = pgmq_examples::demo_queue("orders").unwrap();
/// assert!(q.as_str().starts_with("orders_"));
/// ```
pub fn demo_queue(prefix: &str) -> Result<QueueName, pgmq_client::Error> {
    QueueName::new(&format!("{prefix}_{}", std::process::id()))
}

/// Whether the example was started with `--demo` (or `PGMQ_EXAMPLES_DEMO=1`):
/// the examples that otherwise run until Ctrl-C then stop on their own once
/// their demo work is done, which is how `scripts/ci-extra.sh` runs them.
pub fn demo_mode() -> bool {
    std::env::args().skip(1).any(|a| a == "--demo")
        || std::env::var("PGMQ_EXAMPLES_DEMO").is_ok_and(|v| v == "1")
}

/// The workspace README's examples, compiled as doc tests (`cargo test
/// --doc`). They are tested here, in a crate that is not published, because
/// the README is outside the published packages (each of which tests its
/// own README).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct WorkspaceReadmeDoctests;
