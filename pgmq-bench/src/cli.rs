//! Command-line arguments of every subcommand (clap derive types).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValue, PossibleValuesParser};
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::local_db;

/// The values of `--handler` and `--claim-reads`, as the document records them.
pub use crate::document::{ClaimReadsArg, HandlerKind};

/// `pgmq-bench`: benchmark, report and compare pgmq-client and pgmq-worker.
///
/// Without a subcommand it runs the benchmark (the same as `pgmq-bench run`).
/// Parse it with [`Cli::parse_args`] (or [`Cli::try_parse_args`]), which
/// records the options given, so that a profile leaves them alone.
#[derive(Debug, Parser)]
#[command(
    name = "pgmq-bench",
    version,
    about = "Benchmark pgmq-client and pgmq-worker on a real PostgreSQL/PGMQ database",
    after_help = BEFORE_A_RUN,
    args_conflicts_with_subcommands = true
)]
#[non_exhaustive]
pub struct Cli {
    /// A subcommand; none runs the benchmark.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Benchmark options (when no subcommand is given).
    #[command(flatten)]
    pub run: RunArgs,
}

/// What a run against a database of one's own needs and costs: printed by
/// `--help` and at the start of such a run.
pub const BEFORE_A_RUN: &str = "\
Profiles: without a profile flag every section runs at small sizes, 2 rounds,
in about 3 minutes on 2 cores (under 5 with other work on them); --full is
the release run (the option defaults --help shows), --long longer still,
--standard in between, --quick a smoke test. A profile replaces only the
options not given on the command line.

Before a run against your own database (--dsn-file, PGMQ_BENCH_DSN):
  needs   a role that may create and drop PGMQ queues (CREATE in schema pgmq),
          VACUUM and ANALYZE their tables (their owner), and create triggers
          (wakeup_latency enables PGMQ's insert notifications); --handler
          db-write also creates the table pgmq_bench_handler_sink
  costs   the default run sends and deletes about two million messages; a
          --full run takes about 26 minutes on 2 cores and writes the WAL of
          several million (the 1,000,000-message backlog most of them)
  touches only queues named pgmq_bench_*; it refuses to start while any
          exist, and --clean drops them first, including those of a run
          still going on the same database";

impl Cli {
    /// Parses the process's arguments ([`Cli::try_parse_args`]); prints the
    /// error or help and exits as clap does.
    pub fn parse_args() -> Cli {
        Cli::try_parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// Parses `argv` as [`Parser::try_parse_from`] does, and records in the
    /// benchmark's [`RunArgs::given`] the options the command line or the
    /// environment set: a profile replaces only the others. (A `Cli` parsed
    /// otherwise records none, and a profile then replaces every option
    /// that holds its default value.)
    ///
    /// ```
    /// use pgmq_bench::cli::Cli;
    /// let cli = Cli::try_parse_args(["pgmq-bench", "--repeat", "3", "--quick"]).unwrap();
    /// assert!(cli.run.given.contains("repeat") && !cli.run.given.contains("messages"));
    /// ```
    pub fn try_parse_args<I, T>(argv: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let matches = Cli::command().try_get_matches_from(argv)?;
        let mut cli = Cli::from_arg_matches(&matches)?;
        match (&mut cli.command, matches.subcommand()) {
            (Some(Command::Run(args)), Some((_, sub))) => args.given = given(sub),
            _ => cli.run.given = given(&matches),
        }
        Ok(cli)
    }
}

/// The ids of the options in `m` that the command line or the environment
/// set (not their defaults).
fn given(m: &ArgMatches) -> BTreeSet<String> {
    m.ids()
        .filter(|id| {
            matches!(
                m.value_source(id.as_str()),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        })
        .map(|id| id.as_str().to_owned())
        .collect()
}

/// The subcommands.
// One value per process, parsed once: `Run`'s size beside the small
// variants costs nothing worth a `Box`.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the benchmark and write a benchmark.v1 JSON document.
    Run(RunArgs),
    /// Compare two documents: a Markdown table and a verdict per figure
    /// (with --markdown one verdict line per headline figure); exit 1 on a
    /// regression beyond the threshold.
    Compare(CompareArgs),
    /// Print a Markdown summary of a document, and optionally an SVG chart.
    Report(ReportArgs),
    /// Evaluate the worker's performance targets on a document; exit 1 when one is missed.
    Check(CheckArgs),
    /// Check the memory target from two documents (e.g. 100,000 and 1,000,000 messages).
    CheckMemory(CheckMemoryArgs),
    /// One worker process of the worker_processes section (started by the
    /// benchmark, not by hand).
    #[command(hide = true)]
    ProcessWorker {
        /// Its settings, as JSON (pgmq-testkit's child protocol).
        spec: String,
    },
    /// Merge the documents of N invocations into one aggregate document that
    /// keeps every run; its figures hold one median per invocation.
    Aggregate(AggregateArgs),
    /// Write a document's summary: with --markdown at most 25 lines for a
    /// release note (versions, machine, profile, the headline figures, the
    /// targets); else JSON (schema pgmq-bench.summary.v1, described by
    /// docs/benchmark-summary.v1.schema.json: every figure's median and
    /// range, the targets, outcome, SDK, server and host; no runs).
    Summary(SummaryArgs),
    /// Print the JSON Schema of the benchmark.v1 document, generated from
    /// the document's types and the registered sections' runs (what
    /// docs/benchmark.v1.schema.json holds).
    Schema,
}

impl From<ClaimReadsArg> for pgmq_worker::ClaimReads {
    fn from(a: ClaimReadsArg) -> Self {
        match a {
            ClaimReadsArg::Bounded => pgmq_worker::ClaimReads::Bounded,
            ClaimReadsArg::FromStart => pgmq_worker::ClaimReads::FromStart,
            ClaimReadsArg::Function => pgmq_worker::ClaimReads::Function,
        }
    }
}

/// Options of `summary`.
#[derive(Debug, Clone, Args)]
#[non_exhaustive]
pub struct SummaryArgs {
    /// The document.
    pub run: PathBuf,
    /// Where to write the summary (default: standard output).
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Write the short Markdown summary instead of the JSON (at most 25
    /// lines: versions, machine, profile, one row per headline figure,
    /// the targets met and missed): what a release note pastes.
    #[arg(long)]
    pub markdown: bool,
}

/// Options of `aggregate`.
#[derive(Debug, Clone, Args)]
#[non_exhaustive]
pub struct AggregateArgs {
    /// The invocations' documents (at least 2).
    #[arg(required = true, num_args = 2..)]
    pub runs: Vec<PathBuf>,
    /// Where to write the aggregate document.
    #[arg(long, short = 'o')]
    pub output: PathBuf,
}

/// The `--sections` parser: the names of the registered sections, each with
/// its one-line help.
fn section_names() -> PossibleValuesParser {
    PossibleValuesParser::new(
        crate::sections::REGISTRY
            .iter()
            .map(|s| PossibleValue::new(s.name()).help(s.about())),
    )
}

/// Every registered section's name, in the order a round runs them.
fn all_sections() -> Vec<String> {
    crate::sections::names().map(str::to_owned).collect()
}

/// Parses `30`, `30s`, `500ms`, `5m`, `1h` into a duration (the fault
/// suite's `--duration` takes the same).
pub use pgmq_testkit::parse_duration;

/// Options of a benchmark run.
///
/// The defaults shown are the full profile's (`--full`), sized so that a
/// timed run lasts long enough for its rate to measure steady state rather
/// than start-up, even on a small machine (a run under one second is named
/// in the document's warnings); without a profile flag the default
/// profile's smaller values replace those not given (see the `config`
/// module and docs/benchmark-options.md).
#[derive(Debug, Clone, Args)]
#[non_exhaustive]
pub struct RunArgs {
    /// PostgreSQL DSN of a database with PGMQ that the benchmark may use
    /// (never a shared, staging or production database). Required unless
    /// --dsn-file or --local. Keep the password off the command line (other
    /// local users can read it there): give a DSN without it and set
    /// PGPASSWORD or a ~/.pgpass line (libpq's format, mode 0600), or put the
    /// whole DSN in PGMQ_BENCH_DSN or a --dsn-file.
    #[arg(long, env = "PGMQ_BENCH_DSN", hide_env_values = true)]
    pub dsn: Option<String>,

    /// Read the DSN from this file: its first line that is neither blank nor
    /// a # comment. Refused unless only its owner may read it (chmod 0600),
    /// and together with --dsn or PGMQ_BENCH_DSN.
    #[arg(long, value_name = "PATH")]
    pub dsn_file: Option<PathBuf>,

    /// Start a throwaway local cluster (scripts/db-start.sh on --local-port),
    /// run against it, and remove it afterwards.
    #[arg(long)]
    pub local: bool,

    /// Port of the --local cluster (never 55432, the shared development cluster).
    #[arg(long, env = "PGMQ_BENCH_LOCAL_PORT", default_value_t = local_db::DEFAULT_PORT)]
    pub local_port: u16,

    /// Where to write the benchmark.v1 JSON document.
    #[arg(long, short = 'o', default_value = "benchmark.json")]
    pub output: PathBuf,

    /// Sections to run (comma-separated; default all).
    #[arg(long, value_delimiter = ',', value_parser = section_names(), default_values_t = all_sections())]
    pub sections: Vec<String>,

    /// Messages per consume run (consume_scaling and the baseline read + delete loop).
    #[arg(long, default_value_t = 150_000)]
    pub messages: u64,

    /// Messages per batch-send run, in every section that sends in
    /// batches (send_batch and its baseline loop, send_batch_keyed, ...).
    #[arg(long, default_value_t = 250_000)]
    pub batch_messages: u64,

    /// Messages per single-send run (send_single and its baseline loop, send_batch_keyed).
    #[arg(long, default_value_t = 10_000)]
    pub single_messages: u64,

    /// Messages per batch send and per claim (pgmq.read qty).
    #[arg(long, default_value_t = 100)]
    pub batch_size: u32,

    /// Visibility timeout, seconds.
    #[arg(long = "vt", default_value_t = 30)]
    pub visibility_timeout: u32,

    /// Approximate JSON body size, bytes.
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: u32,

    /// Handler counts of consume_scaling (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1u32, 2, 4, 8])]
    pub workers: Vec<u32>,

    /// Simulated asynchronous I/O per handler call (a tokio sleep), milliseconds.
    #[arg(long, default_value_t = 0)]
    pub handler_work_ms: u64,

    /// Measured rounds (every section once per round).
    #[arg(long, default_value_t = 3)]
    pub repeat: u32,

    /// Warm-up rounds run first and discarded.
    #[arg(long, default_value_t = 1)]
    pub warmup: u32,

    /// SDK client connection pool size.
    #[arg(long, default_value_t = 10)]
    pub pool_size: u32,

    /// The options the sections declare (each in its own file).
    #[command(flatten)]
    pub options: crate::sections::SectionArgs,

    /// sustained: how long producers run (30s, 5m, 30m).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub duration: Duration,

    /// sustained: seconds at the start left out of the backlog-slope fit.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub sustained_warmup: Duration,

    /// sustained: total producer rate, messages/s (0: unpaced, as fast as they can).
    #[arg(long, default_value_t = 5_000.0)]
    pub rate: f64,

    /// sustained: producer tasks.
    #[arg(long, default_value_t = 2)]
    pub producers: u32,

    /// sustained: handler concurrency.
    #[arg(long, default_value_t = 4)]
    pub sustained_workers: u32,

    /// Create the queues unlogged (faster, emptied by a crash): the result is
    /// marked non-durable and never compared with durable ones.
    #[arg(long)]
    pub unlogged: bool,

    /// Drop leftover pgmq_bench_* queues before starting instead of refusing.
    #[arg(long)]
    pub clean: bool,

    /// Give up on a section that makes no progress for this long.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub stall_timeout: Duration,

    /// The quick profile, a smoke test: 1 round, no warm-up, small runs
    /// (20,000 consumed and batch-sent messages, 2,000 single sends, backlogs
    /// of 20,000 and 100,000, processes 1,2, a 20 s sustained window);
    /// options not given take the profile's value.
    #[arg(long, conflicts_with_all = ["standard", "full", "long"])]
    pub quick: bool,

    /// The standard profile, between the default and --full: 2 rounds
    /// after 1 warm-up, 50,000 consumed and 100,000 batch-sent messages,
    /// 5,000 single sends, one backlog of 100,000 (no 1,000,000: most of a
    /// full run's time and WAL), processes 1,2, a 20 s sustained window;
    /// options not given take the profile's value.
    #[arg(long, conflicts_with_all = ["quick", "full", "long"])]
    pub standard: bool,

    /// The full profile, the release run (about 26 minutes on 2 cores):
    /// the option defaults shown here, 3 rounds after 1 warm-up, a
    /// 1,000,000-message backlog. Without a profile flag the default
    /// profile runs every section at small sizes, 2 rounds and no warm-up
    /// (20,000 consumed and batch-sent messages, 1,000 single sends,
    /// backlogs of 20,000 and 100,000, processes 1,2, a 10 s sustained
    /// window), in about 3 minutes.
    #[arg(long, conflicts_with_all = ["quick", "standard", "long"])]
    pub full: bool,

    /// backlog_scaling: backlog sizes (comma-separated; 100000,1000000 with
    /// --full and --long, 100000 with --standard, else 20000,100000).
    #[arg(long, value_delimiter = ',')]
    pub backlog_sizes: Option<Vec<u64>>,

    /// backlog_scaling: also drain a 10,000,000-message backlog (a long
    /// preload and drain, and a queue table of gigabytes).
    #[arg(long)]
    pub backlog_10m: bool,

    /// backlog_scaling and worker_processes: handler concurrency (per process).
    #[arg(long, default_value_t = 8)]
    pub backlog_workers: u32,

    /// worker_processes: numbers of worker processes (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1u32, 2, 4, 8])]
    pub processes: Vec<u32>,

    /// worker_processes: messages in the queue each run drains (longer than
    /// a consume run's, so that at 8 processes each still makes hundreds of
    /// reads and the shares measure the claiming, not read-count noise).
    #[arg(long, default_value_t = 400_000)]
    pub processes_messages: u64,

    /// What handlers do in consume_scaling, sustained and worker_processes.
    #[arg(long, value_enum, default_value_t = HandlerKind::Empty)]
    pub handler: HandlerKind,

    /// How every worker the benchmark starts reads the queue: `bounded`
    /// (continues after the last batch), `from-start` (the same statement
    /// from the lowest msg_id) or `function` (PGMQ's pgmq.read). Default:
    /// the worker's default (recorded in the document either way).
    #[arg(long, value_enum)]
    pub claim_reads: Option<ClaimReadsArg>,

    /// sustained: search the highest producer rate whose backlog slope
    /// passes, stepping up from --rate by --rate-step until a step fails.
    #[arg(long)]
    pub rate_search: bool,

    /// sustained --rate-search: factor between steps.
    #[arg(long, default_value_t = 1.5)]
    pub rate_step: f64,

    /// sustained --rate-search: most steps.
    #[arg(long, default_value_t = 8)]
    pub rate_steps_max: u32,

    /// The long profile, for publishable figures: 5 rounds after 1 warm-up,
    /// 300,000 consumed and 500,000 batch-sent messages, 20,000 single
    /// sends, a sustained window of at least 5 minutes (30 s left out of the
    /// fit); options not given take the profile's value.
    #[arg(long, conflicts_with_all = ["quick", "standard", "full"])]
    pub long: bool,

    /// The ids of the options given on the command line or in the
    /// environment (filled by [`Cli::try_parse_args`]): a profile leaves
    /// them alone.
    #[arg(skip)]
    pub given: BTreeSet<String>,
}

/// Options of `compare`.
#[derive(Debug, Clone, Args)]
#[non_exhaustive]
pub struct CompareArgs {
    /// The reference document.
    pub old: PathBuf,
    /// The document under test.
    pub new: PathBuf,
    /// Percent change beyond which a non-overlapping change counts.
    #[arg(long, default_value_t = 10.0)]
    pub threshold: f64,
    /// Print one verdict line per headline figure (the rows of `summary
    /// --markdown`) and the verdict over every figure, instead of the
    /// table of every figure; the exit status is the same.
    #[arg(long)]
    pub markdown: bool,
}

/// Options of `report`.
#[derive(Debug, Clone, Args)]
#[non_exhaustive]
pub struct ReportArgs {
    /// The document.
    pub run: PathBuf,
    /// Also write an SVG chart of worker scaling and latency percentiles.
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

/// Options of `check`.
#[derive(Debug, Clone, Args)]
#[non_exhaustive]
pub struct CheckArgs {
    /// The document.
    pub run: PathBuf,
    /// Fail also when a listed target was not measured (comma-separated ids).
    #[arg(long, value_delimiter = ',')]
    pub require: Vec<String>,
}

/// Options of `check-memory`.
#[derive(Debug, Clone, Args)]
#[non_exhaustive]
pub struct CheckMemoryArgs {
    /// The document with the smaller backlog (e.g. 100,000 messages).
    pub small: PathBuf,
    /// The document with the larger backlog (e.g. 1,000,000 messages).
    pub large: PathBuf,
    /// Largest allowed consume_scaling peak RSS of the larger run, MiB.
    #[arg(long, default_value_t = 64.0)]
    pub max_mib: f64,
    /// Largest allowed growth from the smaller run to the larger, percent.
    #[arg(long, default_value_t = 10.0)]
    pub tolerance_pct: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse() {
        let cli = Cli::try_parse_from(["pgmq-bench"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.run.sections.len(), crate::sections::REGISTRY.len());
        assert_eq!(cli.run.workers, vec![1, 2, 4, 8]);
        let cli = Cli::try_parse_from([
            "pgmq-bench",
            "--sections",
            "send_single,consume_scaling",
            "--workers",
            "1,8",
        ])
        .unwrap();
        assert_eq!(cli.run.sections, vec!["send_single", "consume_scaling"]);
        assert!(Cli::try_parse_from(["pgmq-bench", "--sections", "send_twice"]).is_err());
        assert_eq!(cli.run.workers, vec![1, 8]);
        let cli = Cli::try_parse_from(["pgmq-bench", "compare", "a.json", "b.json"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Compare(_))));
    }
}
