//! The fault and bad-input suite behind the `pgmq-faults` binary.
//!
//! It proves that nothing is lost and nothing crashes by really breaking
//! things: the suite starts its own throwaway cluster (port 55433 by default,
//! never the development cluster on 55432), runs the worker as a separate OS
//! process (this same binary, re-executed with the hidden `worker`
//! subcommand) so that it can be SIGKILLed or SIGTERMed, puts a TCP proxy it
//! controls between clients and server to cut connections, and kills and
//! restarts the server with `pg_ctl stop -m immediate`.
//!
//! Every produced message carries a unique key (in its body and in a
//! `fault_key` header). Each produce is recorded as committed, rejected or
//! unknown from [`pgmq_client::Error::outcome`]; each handling is recorded by
//! the worker's handler as one row of the ledger table `pgmq_fault_ledger`
//! (no unique constraint, so duplicates are counted). Lost, duplicated,
//! unexpected and dead-lettered messages are then counted exactly, per key.
//!
//! Files: `ledger.rs` (ledger tables and the per-key accounting), `child.rs` (the
//! worker process, seen from the suite), `worker.rs` (the worker process
//! itself; `scheduled.rs`, its scheduler of periodic sends and the
//! sabotaged one), `report.rs` (the table), `scenarios/` (the fixed scenarios 1 to
//! 20), the randomized campaign (`--campaign`) in `campaign/` (its parts
//! are listed in `campaign/mod.rs`), and `cli.rs` (the command line of the
//! binary). The suite's own cluster and the TCP proxy are
//! pgmq-testkit's ([`pgmq_testkit::cluster`], [`pgmq_testkit::proxy`]),
//! shared with the benchmark.
//!
//! ```text
//! pgmq-faults --root . --quick --scenarios 2,9,10
//! pgmq-faults --root . --campaign --seed 1234 --duration 90s
//! ```

mod campaign;
mod child;
pub mod cli;
mod ctx;
mod job;
mod keyed;
mod ledger;
mod report;
mod scenarios;
mod scheduled;
mod worker;

use std::path::PathBuf;
use std::time::{Duration, Instant};

// The suite's cluster and proxy, under the names the modules use
// (`super::proxy::Proxy`, `super::cluster::Cluster`).
use pgmq_testkit::{cluster, proxy};

pub use worker::{worker_main, Sabotage};

/// The error type of the suite's entry points: any failure of the harness
/// itself (a scenario's verdict is reported in the table, not as an error).
pub use pgmq_testkit::BoxError;

/// Options of `pgmq-faults` (the suite, or with `--campaign` the campaign).
#[derive(Debug, Clone, clap::Args)]
#[non_exhaustive]
pub struct FaultsArgs {
    /// Workspace root: the folder holding scripts/db-start.sh (defaults to the
    /// current folder, then to the workspace this binary was built from).
    #[arg(long)]
    pub root: Option<PathBuf>,

    /// Port of the suite's own throwaway cluster (55433-55435; never 55432).
    #[arg(long, default_value_t = 55433)]
    pub port: u16,

    /// Port of the suite's TCP proxy.
    #[arg(long, default_value_t = 55434)]
    pub proxy_port: u16,

    /// Messages per scenario (default 10,000; 1,000 with --quick).
    #[arg(long)]
    pub messages: Option<usize>,

    /// Fewer messages and repetitions, for a quick check (not for the record).
    #[arg(long)]
    pub quick: bool,

    /// Scenarios to run, e.g. `1,2,11` (default: all). The help, the
    /// numbers accepted and the default come from the scenarios' table.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = scenarios::parse_number,
        help = scenarios::help(),
        long_help = scenarios::long_help()
    )]
    pub scenarios: Vec<u8>,

    /// Print the scenarios (number, rows, what each injects and when, what
    /// must hold) as a Markdown table, and exit.
    #[arg(long)]
    pub list_scenarios: bool,

    /// Also write the table as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Leave the suite's cluster running at the end (default: stop and remove it).
    #[arg(long)]
    pub keep_cluster: bool,

    /// Folder for the worker processes' logs, kept after the run (default: a
    /// new folder in the system temp folder, printed at the start, removed
    /// when every check passed and kept when one failed).
    #[arg(long)]
    pub log_dir: Option<PathBuf>,

    /// Plant bugs, a comma-separated list (`--help` lists the values and
    /// what each plants; `none`, the default, for none).
    /// The run must then fail: this is how the suite is seen to go red.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub sabotage: Vec<Sabotage>,

    /// Run the randomized fault campaign instead of the fixed scenarios: a
    /// seeded schedule of faults over a mixed workload of several worker
    /// processes, checked against invariants (see docs/reliability-campaign.md).
    #[arg(long)]
    pub campaign: bool,

    /// Campaign seeds, e.g. `1,2,77` (default: one fresh seed, printed;
    /// with --quick the fixed seeds 1 and 2 and a fresh one).
    #[arg(long, value_delimiter = ',')]
    pub seed: Vec<u64>,

    /// How long each seed's faults and producers run (default 25s with
    /// --quick, 30m otherwise); the drain and the checks come after.
    #[arg(long, value_parser = pgmq_testkit::parse_duration)]
    pub duration: Option<Duration>,

    /// Worker processes of the campaign (kinds in turn: context handler,
    /// transactional, FIFO groups, WorkerGroup, blocking, FIFO groups with
    /// a blocking handler).
    #[arg(long, default_value_t = campaign::model::DEFAULT_PROCESSES)]
    pub processes: usize,

    /// Campaign fault kinds to draw from (default all; `none` for a run
    /// without faults), e.g. `kill,pg-crash,blackhole`.
    #[arg(long, value_delimiter = ',')]
    pub fault_kinds: Vec<String>,
}

/// Runs the suite and prints the table (Markdown on stdout).
///
/// Returns the process exit code: 0 when every scenario's verdict passed, 1
/// otherwise; an `Err` means the harness itself could not run (no cluster,
/// say), for which `main` exits 2.
///
/// ```no_run
/// # async fn f(args: pgmq_faults::FaultsArgs) -> Result<(), pgmq_faults::BoxError> {
/// let code = pgmq_faults::run(args).await?;
/// # let _ = code; Ok(()) }
/// ```
pub async fn run(args: FaultsArgs) -> Result<i32, BoxError> {
    if args.list_scenarios {
        print!("{}", scenarios::markdown());
        return Ok(0);
    }
    if args.campaign {
        return run_campaign(args).await;
    }
    let started = Instant::now();
    let selected = scenarios::selection(&args.scenarios)?;
    let ctx = setup(&args, "faults", |ctx| {
        format!(" ({} messages per scenario)", ctx.n)
    })
    .await?;
    let mut rows = Vec::new();
    for s in selected {
        let t = Instant::now();
        eprintln!("faults: scenario {} ({}) ...", s.number, s.name);
        match (s.run)(&ctx).await {
            Ok(mut r) => rows.append(&mut r),
            Err(e) => rows.push(report::Row::harness_failure(s.number, &e.to_string())),
        }
        eprintln!(
            "faults: scenario {} done in {:.1} s",
            s.number,
            t.elapsed().as_secs_f64()
        );
    }
    let doc = report::Document::new(&ctx, rows, started.elapsed());
    finish(&ctx, &args, doc).await
}

/// `--campaign`: every seed on the suite's cluster, one row each.
async fn run_campaign(args: FaultsArgs) -> Result<i32, BoxError> {
    let started = Instant::now();
    let opts = campaign::plan::Options::from_args(&args)?;
    let ctx = setup(&args, "campaign", |_| {
        format!(
            ", seeds {:?} ({} s each, {} processes)",
            opts.seeds,
            opts.duration.as_secs(),
            opts.processes
        )
    })
    .await?;
    let runs = match campaign::run(&ctx, &opts).await {
        Ok(r) => r,
        Err(e) => {
            ctx.teardown(args.keep_cluster).await;
            return Err(e);
        }
    };
    let (runs, cells) = runs;
    let mut rows = Vec::new();
    let mut seeds = Vec::new();
    for r in runs {
        rows.push(r.row);
        seeds.push(r.summary);
    }
    rows.extend(cells);
    let mut doc = report::Document::new(&ctx, rows, started.elapsed());
    doc.campaign = Some(seeds);
    finish(&ctx, &args, doc).await
}

/// Sets up the suite's cluster and says on stderr, after `label`, where the
/// run goes: its id, the cluster, what `what` says it runs, and the folder
/// of the worker logs.
async fn setup(
    args: &FaultsArgs,
    label: &str,
    what: impl FnOnce(&ctx::Ctx) -> String,
) -> Result<ctx::Ctx, BoxError> {
    let ctx = ctx::Ctx::setup(args).await?;
    eprintln!(
        "{label}: run {} on {}{}, logs in {}",
        ctx.run_id,
        pgmq_client::redact_dsn(&ctx.cluster.dsn()),
        what(&ctx),
        ctx.log_dir.display()
    );
    Ok(ctx)
}

/// Prints and writes the document, removes the cluster and the logs of a
/// run that passed; the exit code.
async fn finish(ctx: &ctx::Ctx, args: &FaultsArgs, doc: report::Document) -> Result<i32, BoxError> {
    let all_pass = doc.pass;
    print!("{}", doc.markdown());
    if let Some(path) = &args.json {
        tokio::fs::write(path, serde_json::to_vec_pretty(&doc)?).await?;
        eprintln!("faults: wrote {}", path.display());
    }
    ctx.teardown(args.keep_cluster).await;
    // The worker logs in a folder the suite made are for diagnosing a
    // failure: removed when every check passed, kept (and named) otherwise.
    // A --log-dir of the caller's is always kept.
    if all_pass && args.log_dir.is_none() {
        let _ = tokio::fs::remove_dir_all(&ctx.log_dir).await;
    } else {
        eprintln!("faults: worker logs kept in {}", ctx.log_dir.display());
    }
    Ok(if all_pass { 0 } else { 1 })
}
