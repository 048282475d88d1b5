//! `pgmq-console`: serves the operator console.
//!
//! ```text
//! pgmq-console [--listen 127.0.0.1:8080] [--dsn DSN | --dsn-file PATH]
//!              [--token TOKEN] [--read-only] [--row-limit N]
//! ```
//!
//! The database is --dsn-file, --dsn or DATABASE_URL, as for the `pgmq`
//! tool; the password from the DSN, PGPASSWORD or ~/.pgpass.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use pgmq_console::ConsoleOptions;

/// Serves the PGMQ operator console: queues, messages, dead letters.
#[derive(Parser)]
#[command(name = "pgmq-console", version)]
struct Args {
    /// Address to listen on. A non-loopback address is refused unless
    /// --token or --read-only is given.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// PostgreSQL DSN (prefer DATABASE_URL or --dsn-file: a command line is
    /// visible to other local users). Default: DATABASE_URL.
    #[arg(long)]
    dsn: Option<String>,
    /// Read the DSN from this file (mode 0600 or stricter).
    #[arg(long, value_name = "PATH", conflicts_with = "dsn")]
    dsn_file: Option<PathBuf>,
    /// Access token every request must carry (open /login?token=... once
    /// in the browser). 16 to 256 characters of A-Z a-z 0-9 - _ . ~
    #[arg(long, env = "PGMQ_CONSOLE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Show everything, change nothing: no pause, redrive or delete.
    #[arg(long)]
    read_only: bool,
    /// Rows at most in any list.
    #[arg(long, default_value_t = 100)]
    row_limit: usize,
    /// Queues at most on the queues page.
    #[arg(long, default_value_t = 200)]
    queue_limit: usize,
    /// Show a worker as gone when its presence record is this many seconds
    /// old.
    #[arg(long, default_value_t = 60)]
    gone_after_secs: u64,
    /// A benchmark.v1 document for the benchmark page (give it twice to
    /// compare two).
    #[arg(long, value_name = "PATH")]
    bench_doc: Vec<PathBuf>,
    /// Each page's statement timeout, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    statement_timeout_ms: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pgmq-console: error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut opts = ConsoleOptions::new()
        .read_only(args.read_only)
        .row_limit(args.row_limit)
        .queue_limit(args.queue_limit)
        .statement_timeout(Duration::from_millis(args.statement_timeout_ms))
        .gone_after(Duration::from_secs(args.gone_after_secs));
    opts.token = args.token;
    for path in &args.bench_doc {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        opts = opts
            .bench_document(&name, &text)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    pgmq_console::check_listen(args.listen, &opts)?;
    let from_file = match &args.dsn_file {
        Some(path) => Some(pgmq_client::read_dsn_file(path, "--dsn-file")?),
        None => None,
    };
    let from_env = std::env::var("DATABASE_URL").ok().filter(|d| !d.is_empty());
    let dsn = from_file
        .or(args.dsn)
        .or(from_env)
        .ok_or("no database: set DATABASE_URL, or pass --dsn-file or --dsn")?;
    let client = pgmq_client::Client::builder(&dsn)
        .max_size(4)
        .libpq_password(true)
        .application_name("pgmq-console")
        .connect()
        .await?;
    let app = pgmq_console::router(client, opts);
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    eprintln!(
        "pgmq-console: listening on http://{}",
        listener.local_addr()?
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
