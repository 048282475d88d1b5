//! The machinery the sections measure with, one file per concept. Sections
//! use it and never each other; it uses the modules below it (`ledger`,
//! `process`, `guard`, `target`, `document`'s run types) and never a
//! section.
//!
//! - [`ctx`]: the run context ([`Ctx`]) and a run's queue around the
//!   measured part (fresh, vacuumed, what is left at the end);
//! - [`body`]: the message bodies and their ids;
//! - [`load`]: the server-side preload;
//! - [`sink`]: `--handler db-write`'s table and connections;
//! - [`tally`]: the handled ids of an in-process worker and each call's
//!   queue wait;
//! - [`worker`]: a worker described by pgmq-testkit's `WorkerSpec`, its
//!   handlers of the `--handler` kind, its counters;
//! - [`drain`]: a timed drain until a tally's target or a stall, and a
//!   worker process's wait for an empty queue;
//! - [`snapshot`]: the database's counters, dead tuples, the cluster's CPU
//!   and the database's clock;
//! - [`stream`]: a paced stream (a worker on a client of its own, a
//!   producer feeding its queue) and its measured windows;
//! - [`plain`]: the same sends and drains with no SDK, the reference of
//!   the SDK sections' ratios;
//! - [`child`]: worker processes (the spec, the child's side, starting them,
//!   `go`, collecting their reports and ids).

pub(crate) mod body;
pub(crate) mod child;
pub(crate) mod ctx;
pub(crate) mod drain;
pub(crate) mod load;
pub(crate) mod plain;
pub(crate) mod sink;
pub(crate) mod snapshot;
pub(crate) mod stream;
pub(crate) mod tally;
pub(crate) mod worker;

pub(crate) use ctx::Ctx;
