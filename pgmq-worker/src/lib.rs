//! A worker runtime for [PGMQ](https://github.com/pgmq/pgmq): bounded claims,
//! batched acknowledgements, wake-ups and a graceful drain, on
//! [`pgmq_client`].
//!
//! ```no_run
//! use std::time::Duration;
//! use pgmq_client::{Client, Message, QueueName};
//! use pgmq_worker::{Outcome, Worker};
//!
//! #[derive(serde::Deserialize)]
//! struct Email { to: String }
//!
//! async fn send_mail(to: &str) -> std::io::Result<()> {
//!     println!("sending to {to}");
//!     Ok(())
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let client = Client::connect("postgres://pgmq:pgmq@127.0.0.1:5432/pgmq").await?;
//!     let queue = QueueName::new("emails")?;
//!     client.create(&queue).await?;
//!
//!     let worker: Worker<Email> = Worker::builder(client, queue)
//!         .concurrency(8)
//!         .visibility_timeout(Duration::from_secs(30))
//!         .handler(|msg: Message<Email>| async move {
//!             if msg.body.to.is_empty() {
//!                 return Ok(Outcome::DeadLetter("no recipient".into()));
//!             }
//!             // An error (`?` converts any std::error::Error) means
//!             // "retry with backoff".
//!             send_mail(&msg.body.to).await?;
//!             Ok(Outcome::Delete)
//!         })
//!         .build()?;
//!
//!     // Runs until SIGINT/SIGTERM, then drains gracefully (a second
//!     // signal stops at once).
//!     let report = worker.run_until_signal().await?;
//!     println!("handled {}, released {}", report.handled, report.released);
//!     Ok(())
//! }
//! ```
//!
//! # Behaviour
//!
//! - **At least once.** A message is deleted (or archived, retried,
//!   dead-lettered) only after its handler returned. Anything that goes wrong
//!   in between (a crash, a lost connection, an acknowledgement that cannot be
//!   written) leaves the message in the queue, and it comes back after its
//!   visibility timeout. Handlers must therefore be idempotent.
//! - **Bounded claims.** Claim loops (`claimers`, 2 by default, each with one
//!   read in flight) never read more than the free room of the claim
//!   queue (`claim_capacity`): memory does not grow with the backlog. With
//!   slow handlers they claim less: only what the handlers will start within
//!   a quarter of the visibility timeout (from a moving average of handler
//!   time), so claimed messages do not time out while waiting locally. After
//!   a full batch they read again at once; after a short or empty one they
//!   sleep `poll_interval` or until woken. Every loop keeps its own poll
//!   timer, and one whose timer fires skips its read when another loop read
//!   less than an interval ago: an idle worker makes about one read per
//!   `poll_interval` whatever the number of loops.
//! - **Claims that skip the deleted head.** By default ([`ClaimReads::Bounded`])
//!   the loops read with PGMQ's `read` statement prepared on the queue table
//!   (same visibility, locking and updates), starting after the highest
//!   `msg_id` they have read, so that a read does not walk over the dead
//!   entries of messages deleted since the last VACUUM; a read from the
//!   start at least once per `poll_interval`, and after every short bounded
//!   read, finds retried and expired messages below that bound. Claims are
//!   therefore not strictly `msg_id`-ordered across the bound; none is
//!   starved. Without a checked queue table layout the loops call `pgmq.read`.
//! - **Handlers.** `concurrency` long-lived handler loops take messages from
//!   the claim queue. A body that does not decode into `T` is dead-lettered
//!   at once, without calling the handler. A handler returns `Ok(())`
//!   (delete the message) or an [`Outcome`]:
//!   [`Delete`](Outcome::Delete), [`Archive`](Outcome::Archive),
//!   [`Retry`](Outcome::Retry) after a delay, or
//!   [`DeadLetter`](Outcome::DeadLetter), or [`Snooze`](Outcome::Snooze)
//!   (later, no attempt used). An error, a panic (caught, in the handler,
//!   a hook or the body's `Deserialize`; the worker keeps running) or a run past `handler_timeout` (60 s by default; cancelled)
//!   means retry after [`Backoff`] with jitter; past `max_attempts` the
//!   message is dead-lettered. Attempts are handler runs, recorded in the
//!   message's [`ATTEMPTS_HEADER`] with each retry, not PGMQ's `read_ct`: a
//!   claim lost in a crash before its handler ran uses none, and
//!   `max_deliveries` guards against a message that crashes the process
//!   every time. A message the worker gives back unstarted (at shutdown, or
//!   after waiting too long locally) has its read undone. A
//!   [`HandlerWithContext`] also gets a [`Context`]: cancellation (claim
//!   lost, timeout, immediate shutdown), deadline, attempt, queue.
//!   [`blocking_handler`](WorkerBuilder::blocking_handler) runs CPU-bound
//!   handlers on dedicated threads.
//! - **Batch handlers.** [`batch_handler`](WorkerBuilder::batch_handler)
//!   runs a [`BatchHandler`] on up to `max` messages at once (or what
//!   arrived within a short window) and takes a [`MessageResult`] per
//!   message: each keeps its own lease, attempts and outcome, so one
//!   failure retries that message alone.
//!   [`batch_handler_with_context`](WorkerBuilder::batch_handler_with_context)
//!   also gives it a [`BatchContext`]: the batch's cancellation and
//!   deadline, each message's attempt and deliveries.
//!   [`transactional_batch_handler`](WorkerBuilder::transactional_batch_handler)
//!   runs a [`TransactionalBatchHandler`] in one transaction per batch that
//!   locks the batch's rows (fenced on their deliveries) before the handler
//!   runs and commits the handler's writes with the fenced deletes of the
//!   successes: one commit per batch.
//! - **Archive retention.** [`run_retention`] prunes archives past an age
//!   and/or a count every [`RetentionConfig::every`], with pgmq-client's
//!   [`apply_retention`](pgmq_client::Pgmq::apply_retention): one process
//!   of the fleet prunes a queue at a time, in bounded batches.
//! - **Dead letters** move to the dead-letter queue and leave the source in
//!   one transaction, with headers `reason`, `attempts`, `deliveries`,
//!   `source_queue`, `original_msg_id` and `original_headers`. The copy is
//!   made in SQL, so body and original headers arrive exactly as stored
//!   (less the worker's own [`ATTEMPTS_HEADER`], so a redriven message gets
//!   `max_attempts` again). Without a dead-letter queue (or when it has been
//!   dropped) they are archived, with `dead_letter_reason` and `attempts`
//!   merged into their headers in PGMQ's archive table. The move is
//!   pgmq-client's [`Pgmq::dead_letter_fenced`](pgmq_client::Pgmq::dead_letter_fenced):
//!   like every statement the worker runs, its SQL is the client's, behind
//!   a named function; the worker holds none of its own.
//! - **Fenced writes.** Every write (delete, archive, retry, snooze,
//!   dead-letter move, heartbeat, release) matches the message *and the
//!   delivery that claimed it*; a write that matches nothing is a lost
//!   claim, counted in `claims_lost`. Why: the repository's
//!   docs/concepts.md, "Fencing".
//! - **Batched acknowledgements.** A completer writes outcomes with one
//!   fenced delete/archive/requeue per batch (flushed as soon as the writer
//!   is free, when full, or after 5 ms at low rates), retries transient failures, and makes handlers wait when it falls
//!   behind (bounded channel).
//! - **Heartbeat.** A delivery still held past half the visibility timeout
//!   (its handler runs, or its acknowledgement waits to be written) gets it
//!   extended (one fenced statement for all of them), so a live long job is
//!   not delivered twice. A claimed message that waited locally
//!   for 3/4 of its visibility timeout is not started (it is about to be
//!   visible again anyway): it is given back at once, its read undone.
//! - **Wake-ups.** With [`WakeUp::Notify`] a dedicated connection LISTENs on
//!   PGMQ's insert channel and wakes idle claimers at once, and once more one
//!   throttle interval later (PGMQ notifies at most once per throttle
//!   window, 250 ms by default); polling stays on, since PGMQ does not notify
//!   when delayed messages or expired visibility timeouts make messages
//!   visible.
//! - **Faults.** Every database call of the worker is bounded by
//!   `db_timeout` (10 s): a half-open connection is discarded, not waited
//!   on, and the abandoned statement is cancelled on the server. A failed read or
//!   acknowledgement is logged and retried with backoff; the pool opens new
//!   connections; internal tasks that panic are restarted; the worker
//!   resumes when the database is back. [`Worker::monitor`] gives
//!   [`Health`] for probes.
//! - **Shutdown** (a future resolving, a signal, [`WorkerHandle::shutdown`]
//!   or [`ShutdownHandle::graceful`]):
//!   stop claiming; release claimed-but-unstarted messages at once, their
//!   read undone (visible now, `read_ct` one lower); let in-flight handlers finish within
//!   `shutdown_grace` (later ones are abandoned and reported); drain the
//!   acknowledgements; return a [`ShutdownReport`] (whose docs list the
//!   steps). A second SIGINT/SIGTERM, [`ShutdownHandle::immediate`] or
//!   [`WorkerHandle::shutdown_now`] escalates: running handlers are
//!   abandoned at once (listed in [`ShutdownReport::abandoned`]; their
//!   messages come back after the visibility timeout), while unstarted
//!   claims are still released and finished acknowledgements still written,
//!   within about a second.
//! - **Observability.** `tracing` spans per read and acknowledgement batch
//!   (from `pgmq_client`) and per message (`pgmq_worker.handle`, debug
//!   level); no per-message events above debug, except a warning per
//!   dead-lettered message. [`WorkerHandle::stats`] is a
//!   cheap [`StatsSnapshot`] of counters and three latency histograms.
//!
//! # Testing a handler
//!
//! [`testing`] runs a handler as the worker would, without a database:
//!
//! ```
//! use pgmq_client::Message;
//! use pgmq_worker::{testing::run_handler, HandlerError, Outcome};
//!
//! async fn handle(msg: Message<String>) -> Result<Outcome, HandlerError> {
//!     if msg.body.is_empty() {
//!         return Ok(Outcome::DeadLetter("empty body".into()));
//!     }
//!     Ok(Outcome::Delete)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let outcome = run_handler(&handle, Message::new(1, String::new())).await.unwrap();
//! assert_eq!(outcome, Outcome::DeadLetter("empty body".into()));
//! # }
//! ```
//!
//! # Features
//!
//! - `metrics`: publishes the worker's counters, gauges and histograms
//!   through the [`metrics`](https://docs.rs/metrics) facade (their names:
//!   [Metrics](#metrics) below).
//! - `deadpool`: runs the worker on a caller's deadpool-postgres pool
//!   (`ConnectionSource::deadpool`).
//! - `otel`: continues the sender's trace: a message whose headers carry a
//!   W3C trace context (from a client built with
//!   `ClientBuilder::trace_context`, feature `otel` of `pgmq-client`) gets
//!   it as the parent of its `pgmq_worker.handle` span.
//! - `fault-injection`: test hooks that make internal tasks panic; not
//!   public API, not covered by semver, never in production.
//!
//! # Metrics
//!
#![doc = include_str!("../docs/metrics.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backoff;
mod batch_context;
mod batch_loop;
mod builder;
mod claim_queue;
mod claimer;
mod completer;
mod context;
mod db;
mod error;
mod fence;
mod group;
mod handle;
mod handler;
mod handler_loop;
mod handoff;
mod health;
mod heartbeat;
mod hooks;
mod lease;
#[cfg(feature = "metrics")]
mod metrics;
mod notifier;
mod pause;
mod preflight;
mod presence;
mod priority;
mod protocol;
mod retention;
mod runners;
mod scheduler;
mod shutdown;
mod stats;
mod supervise;
pub mod testing;
#[cfg(feature = "otel")]
mod trace;
mod vacuum;
mod wake;
mod worker;

pub use backoff::Backoff;
pub use batch_context::BatchContext;
pub use builder::WorkerBuilder;
pub use claimer::ClaimReads;
pub use context::Context;
pub use db::ConnectionSource;
pub use error::Error;
pub use group::{GroupShutdown, WorkerGroup};
pub use handle::{Monitor, WorkerHandle};
pub use handler::{
    BatchHandler, BatchHandlerWithContext, BlockingHandler, Handler, HandlerError,
    HandlerWithContext, MessageResult, Outcome, TransactionalBatchHandler, TransactionalHandler,
};
pub use health::Health;
pub use hooks::Hook;
pub use notifier::WakeUp;
pub use priority::Priority;
pub use protocol::{ATTEMPTS_HEADER, MAX_REASON_LEN};
pub use retention::{run_retention, RetentionConfig};
pub use scheduler::{Scheduler, SchedulerConfig};
pub use shutdown::{ShutdownHandle, ShutdownReport};
pub use stats::StatsSnapshot;
pub use vacuum::QueueVacuum;
pub use worker::Worker;

/// This crate's README (its crates.io page), compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// Re-exports used in this crate's public API.
pub mod reexports {
    pub use hdrhistogram;
    pub use pgmq_client;
    pub use tokio_util;
}
