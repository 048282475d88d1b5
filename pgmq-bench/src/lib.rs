//! The benchmark harness behind the `pgmq-bench` binary: it measures
//! pgmq-client and pgmq-worker on a real PostgreSQL/PGMQ database and writes a
//! `pgmq-bench.benchmark.v1` JSON document ([`document`]), which `report`,
//! `compare` and `check` read back.
//!
//! ```text
//! pgmq-bench --local --output benchmark.json          # throwaway cluster, all sections
//! PGMQ_BENCH_DSN=postgres://bench@db/bench pgmq-bench --sections consume_scaling,baseline --workers 1,8
//! pgmq-bench --dsn-file ~/.config/bench.dsn   # a mode-0600 file holding the DSN
//! pgmq-bench report benchmark.json --svg scaling.svg
//! pgmq-bench compare old.json new.json --threshold 10
//! ```
//!
//! The same run from code:
//!
//! ```no_run
//! # async fn f() -> Result<(), pgmq_bench::Error> {
//! use clap::Parser;
//! let cli = pgmq_bench::cli::Cli::parse_from(["pgmq-bench", "--local", "--sections", "send_batch"]);
//! let exit_code = pgmq_bench::run::run(cli.run).await?;
//! # Ok(()) }
//! ```
//!
//! Table of contents:
//! - [`cli`], `config`: the command line and its validated settings;
//!   [`target`]: the database, its password resolved once (never in argv);
//! - [`run`]: one run from start to document; [`sections`]: the sections,
//!   one file each (its run, checks, figures and report part), listed in
//!   one registry; `kit`: the machinery they measure with (drains,
//!   tallies, workers, snapshots, worker processes); `checks`: the checks they share and the run's outcome;
//! - [`document`]: the benchmark.v1 types; `figures`: runs to figures and
//!   targets; [`metadata`]: build, machine and server facts;
//! - [`guard`]: the `pgmq_bench_*` queue guard; [`ledger`]: handled-id
//!   accounting; `process`: peak RSS and CPU time; `local_db`: `--local`;
//! - [`report`]: Markdown, SVG, compare, check; [`commands`]: their entry points.
//!
//! The fault and bad-input suite is the crate pgmq-faults (binary
//! `pgmq-faults`); what the two share (the throwaway cluster behind
//! `--local`, the environment metadata, `parse_duration`) is in
//! pgmq-testkit.

pub(crate) mod checks;
pub mod cli;
pub mod commands;
pub(crate) mod config;
pub mod document;
mod error;
pub(crate) mod figures;
pub mod guard;
pub(crate) mod kit;
pub mod ledger;
pub(crate) mod local_db;
pub mod metadata;
pub(crate) mod process;
pub(crate) mod progress;
pub mod report;
pub mod run;
pub mod sections;
pub mod stats;
pub mod target;

pub use error::{Error, Result};

/// Logs to stderr, filtered by `RUST_LOG` (default: warnings only).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
