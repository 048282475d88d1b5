//! `pgmq-faults`: parse, dispatch, exit. Everything else is in the library.
//!
//! Exit codes of the suite: 0 when every verdict passed, 1 when one failed,
//! 2 when the suite itself could not run (no cluster, say).

use clap::Parser;
use pgmq_faults::cli::{Cli, Command};

fn main() {
    let cli = Cli::parse();
    // The worker process sets up its own logging.
    if cli.command.is_none() {
        init_tracing();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pgmq-faults: cannot start the async runtime: {e}");
            std::process::exit(2);
        }
    };
    let code = runtime.block_on(async move {
        match cli.command {
            // 1: a scenario failed; 2: the suite itself could not run.
            None => pgmq_faults::run(cli.suite).await.unwrap_or_else(|e| {
                eprintln!("pgmq-faults: {e}");
                2
            }),
            Some(Command::Worker { spec }) => {
                pgmq_faults::worker_main(&spec).await.unwrap_or_else(|e| {
                    eprintln!("pgmq-faults worker: {e}");
                    1
                })
            }
        }
    });
    drop(runtime);
    std::process::exit(code);
}

/// Logs to stderr, filtered by `RUST_LOG` (default: warnings only).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
