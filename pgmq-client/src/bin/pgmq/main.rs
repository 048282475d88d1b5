//! `pgmq`: a command-line tool for operating PGMQ queues.
//!
//! Built with `cargo build -p pgmq-client --features cli --bin pgmq`. The
//! database comes from `DATABASE_URL`, `--dsn-file` or `--dsn`, the password
//! from the DSN, `PGPASSWORD` or `~/.pgpass`. Output is JSON lines
//! (one JSON value per line, ready for `jq`), or with `--table` an aligned
//! table for people; errors go to stderr as `pgmq: error: ...` with the exit
//! status of their kind ([`out::Exit`]: 1 other, 2 usage, 3 not found,
//! 4 refused, 5 database unreachable).
//!
//! ```text
//! pgmq list [--table]                          queues with their metrics
//! pgmq peek <queue> [-n N] [--archive] [--table]   look without claiming
//! pgmq metrics [queue] [--table]  |  pgmq watch [--interval S] [--count N]
//! pgmq create <queue> [--unlogged | --partitioned [--partition-interval N] [--retention-interval N]]
//! pgmq drop <queue> --yes [--if-exists]  |  pgmq purge <queue> --yes
//! pgmq autovacuum <queue> [--show]           the queue table's autovacuum settings
//! pgmq send <queue> [--file F] [--envelope] [--delay S] [--batch N]   JSON lines in, ids out
//! pgmq read <queue> [-n N] [--vt S] [--poll S] [--filter JSON] [--table]
//! pgmq pop <queue> [-n N]                    print, then delete what was printed
//! pgmq delete <queue> <msg_id>...  |  pgmq archive <queue> <msg_id>...
//! pgmq archive list <queue> [-n N] [--table]  |  pgmq archive prune <queue> [--older-than 7d] [--keep N] [--batch N]
//! pgmq set-vt <queue> <msg_id> <seconds>
//! pgmq redrive <dead_letter_queue> [--to Q] [--batch N] [--limit N] [--dry-run]
//! pgmq move <from> <to> (--all | --id N... | --filter JSON | --header-filter JSON) [--batch N] [--limit N]
//! pgmq topic bind <pattern> <queue> | topic unbind <pattern> <queue> | topic list | topic test <key>
//! pgmq notify enable <queue> [--throttle-ms MS] | notify disable <queue> | notify list
//! pgmq install-sdk [--print]                 create or upgrade the pgmq_sdk schema
//! pgmq pause <queue> [--reason TEXT] | pgmq resume <queue> | pgmq paused
//! pgmq schedule list [--table] | schedule add <name> <queue> (--cron EXPR [--tz ZONE] | --every 5m)
//!     [--message JSON] [--headers JSON] [--catch-up N] | schedule pause|resume|remove <name> | schedule fire
//! pgmq completions <bash|zsh|fish|elvish|powershell>
//! ```

mod archive;
mod input;
mod move_msgs;
mod out;
mod redrive;
mod schedule;
mod watch;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{CommandFactory, Parser, Subcommand};
use pgmq_client::{Client, Message, QueueName, RawJson};
use serde_json::{json, Value};

use out::{col, json as json_col, time, Col};
pub(crate) use out::{fail, Exit, Failure, Out};

/// Operate PGMQ queues: list them and watch their metrics, look at messages
/// without claiming them (peek), create, drop and purge queues, send, read,
/// pop, delete and archive messages, change a message's visibility, list and
/// prune archives, redrive dead letters, bind topics, switch insert
/// notifications, install the pgmq_sdk schema, and pause or resume a queue
/// for every worker.
///
/// Output is JSON lines (pipe it into jq), or an aligned table with --table.
/// The database is --dsn-file, --dsn or DATABASE_URL; `sslmode` in the DSN
/// works as in libpq.
#[derive(Parser)]
#[command(name = "pgmq", version, after_help = out::EXIT_CODES)]
struct Cli {
    /// PostgreSQL DSN without the password, e.g.
    /// postgres://user@host:5432/db?sslmode=verify-full. The password comes
    /// from PGPASSWORD or ~/.pgpass (libpq's format), or put the whole DSN in
    /// DATABASE_URL or a file (--dsn-file): anything on the command line is
    /// visible to other local users. Default: DATABASE_URL.
    // DATABASE_URL is read in `connect`, not by clap (`env = ...`), so that
    // a DATABASE_URL merely set in the environment does not conflict with
    // --dsn-file.
    #[arg(long, global = true)]
    dsn: Option<String>,

    /// Read the DSN from this file (its first line that is not blank or a #
    /// comment). It must be a regular file with mode 0600 or stricter
    /// (no group or other permission bits); otherwise it is refused. Takes
    /// precedence over DATABASE_URL; conflicts only with an explicit --dsn.
    #[arg(long, global = true, value_name = "PATH", conflicts_with = "dsn")]
    dsn_file: Option<PathBuf>,

    /// PEM file of CA certificates to trust for TLS (a private CA, e.g. a
    /// cloud provider's bundle); combine with sslmode=verify-full.
    #[arg(long, global = true, value_name = "PEM")]
    ca_file: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List queues with their metrics, one JSON object per queue.
    List {
        /// An aligned table for people instead of JSON lines.
        #[arg(long)]
        table: bool,
    },
    /// Look at a queue's messages without claiming them: neither their
    /// visibility (vt) nor their read count (read_ct) changes, and no worker
    /// is kept from them.
    ///
    /// Shows the first -n messages by msg_id, visible or not (those hidden
    /// are being handled or were sent with a delay: their vt is in the
    /// future). With --archive, the queue's archive instead (as
    /// `archive list`).
    Peek(PeekArgs),
    /// Metrics of one queue, or of every queue: length, visible length,
    /// age of the oldest and newest message in seconds, messages ever sent.
    Metrics {
        /// The queue (default: every queue).
        queue: Option<String>,
        /// An aligned table for people instead of JSON lines.
        #[arg(long)]
        table: bool,
    },
    /// A table of every queue, refreshed every --interval seconds until
    /// interrupted (or --count times).
    ///
    /// DEPTH: messages in the queue; VISIBLE: ready to be read; IN_FLIGHT:
    /// hidden until their vt (being handled, or sent with a delay);
    /// OLDEST_S: age of the oldest message in seconds; IN/S and OUT/S:
    /// messages per second sent, and deleted, archived or purged, since the
    /// last refresh; PAUSED: paused for every worker (`-` when the database
    /// has no pgmq_sdk schema).
    Watch {
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 2.0, value_name = "SECONDS", value_parser = positive_secs)]
        interval: f64,
        /// Stop after this many refreshes.
        #[arg(long)]
        count: Option<u64>,
    },
    /// Create a queue (a no-op when it exists).
    Create(CreateArgs),
    /// Give a queue's table the SDK's autovacuum settings (as `create`
    /// does for the tables it creates): vacuum once 1,000 rows are dead,
    /// unthrottled. Prints {"table", "owner", "caller_owns", "partitioned",
    /// "settings"} as they are now.
    ///
    /// Only the table's owner (a member of the owning role, or a
    /// superuser) may: for anyone else it is refused (exit status 4),
    /// naming the owner. A partitioned queue is refused too (exit status
    /// 2): its partitions get the settings from pg_partman's template
    /// table. See docs/operations-vacuum.md.
    Autovacuum {
        queue: String,
        /// Only print the table's owner and settings; change nothing.
        #[arg(long)]
        show: bool,
    },
    /// Drop a queue with its messages, its archive and its topic bindings.
    /// Refused without --yes (exit status 4), saying what would be removed.
    Drop {
        queue: String,
        /// Succeed when the queue does not exist.
        #[arg(long)]
        if_exists: bool,
        /// Drop it: without --yes nothing is removed.
        #[arg(long)]
        yes: bool,
    },
    /// Delete every message of a queue; prints {"purged": N}. Refused
    /// without --yes (exit status 4), saying how many would go.
    Purge {
        queue: String,
        /// Purge it: without --yes nothing is deleted.
        #[arg(long)]
        yes: bool,
    },
    /// Send messages read as JSON lines from stdin or --file; prints each new
    /// msg_id on a line.
    ///
    /// Each non-empty line is one message body. With --envelope each line is
    /// {"body": ..., "headers": {...}, "delay": 30 | "2030-01-01T00:00:00Z"}
    /// (headers and delay optional). Messages are sent in batches of --batch,
    /// each batch in one statement; on a bad line, the lines before it are
    /// sent and the error names the line.
    Send(SendArgs),
    /// Read messages and print them as JSON lines. Read messages stay in the
    /// queue, hidden for --vt seconds, and their read_ct goes up (to look
    /// without either, use peek).
    Read(ReadArgs),
    /// Take messages off a queue: print them as JSON lines, then delete them.
    ///
    /// The messages are read (hidden for 30 s, their read_ct counting this
    /// read), printed and flushed, and deleted only once every line was
    /// written to stdout. When writing fails (a closed pipe, as with
    /// `| head -1`, or a full disk) none is deleted and all are made
    /// visible again at once, so nothing is lost to the output failing
    /// (the lines that did get out will be delivered again). A line counts
    /// as written once the pipe took it, read or not: ask for no more than
    /// the reader takes.
    Pop {
        queue: String,
        #[arg(long, short = 'n', default_value_t = 1)]
        qty: usize,
    },
    /// Delete messages by id; prints the ids deleted.
    Delete {
        queue: String,
        #[arg(required = true)]
        msg_ids: Vec<i64>,
    },
    /// Move messages by id to the queue's archive (prints the ids
    /// archived), or list or prune an archive.
    ///
    /// `pgmq archive QUEUE MSG_ID...` archives; `pgmq archive list QUEUE`
    /// and `pgmq archive prune QUEUE --older-than AGE` work on the archive.
    /// To archive from a queue named `list` or `prune`, put `--` before
    /// it: `pgmq archive -- list 17`.
    Archive(ArchiveArgs),
    /// Set when a message becomes visible again: in SECONDS from now (0:
    /// at once). Prints the message as it is now.
    SetVt {
        queue: String,
        msg_id: i64,
        /// Seconds from now (0: visible at once).
        seconds: u64,
    },
    /// Move a dead-letter queue's messages back to their source queue.
    ///
    /// The target is --to, or else the message's `source_queue` header (set by
    /// pgmq-worker when it dead-letters). The worker's headers are replaced by
    /// the message's original headers. Each batch moves in one transaction:
    /// sent to the target and deleted from the dead-letter queue, or neither.
    /// Prints {"msg_id", "queue", "new_msg_id"} per message moved. Messages
    /// without a target, or whose `source_queue` names no existing queue,
    /// stay in the dead-letter queue untouched (their read_ct and visibility
    /// unchanged) and are counted in the summary on stderr. Without --to,
    /// messages naming more than one queue are moved only with --yes; --to
    /// may not name the dead-letter queue itself. The run handles the
    /// messages there when it began (dead letters arriving meanwhile wait
    /// for the next run). When the connection is lost during a batch's
    /// COMMIT, the error says the batch's outcome is unknown and names the
    /// msg_ids to check in the target and the dead-letter queue.
    Redrive(RedriveArgs),
    /// Move messages from one queue to another: --all, those with the
    /// given --id, or those whose body contains --filter and whose headers
    /// contain --header-filter (JSON containment).
    ///
    /// Each batch moves in one transaction: sent to the target and deleted
    /// from the source, or neither. Only visible messages move (one being
    /// handled stays where it is). A moved message keeps its body and
    /// headers exactly; it gets a new msg_id and starts with read_ct 0 in
    /// the target. Prints {"msg_id", "queue", "new_msg_id"} per message
    /// moved. The run handles the messages there when it began.
    Move(MoveArgs),
    /// Topic bindings: route messages sent to a routing key to every queue
    /// bound to a matching pattern (`*` one word, `#` zero or more).
    Topic {
        #[command(subcommand)]
        action: TopicAction,
    },
    /// Insert notifications (LISTEN channel pgmq.q_QUEUE.INSERT).
    Notify {
        #[command(subcommand)]
        action: NotifyAction,
    },
    /// Create the pgmq_sdk schema (idempotent sends, pause and resume,
    /// fleet-wide limits), or upgrade it; a no-op when it is current.
    /// Prints {"before": V, "now": V}.
    ///
    /// With --print, prints the SQL instead (for a migration tool) and
    /// connects to nothing.
    InstallSdk {
        #[arg(long)]
        print: bool,
    },
    /// Pause a queue for every pgmq-worker worker: they stop claiming from
    /// it within a poll interval; running handlers finish. Prints
    /// {"queue", "paused": true, "changed": bool}.
    Pause {
        queue: String,
        /// Why, kept beside the flag (shown by `pgmq paused`).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume a paused queue. Prints {"queue", "paused": false, "changed": bool}.
    Resume { queue: String },
    /// List paused queues, one JSON object per queue.
    Paused {
        /// An aligned table for people instead of JSON lines.
        #[arg(long)]
        table: bool,
    },
    /// Periodic sends: schedules that send a message to a queue on each
    /// tick of a cron expression or an interval, once for the fleet.
    Schedule {
        #[command(subcommand)]
        action: schedule::ScheduleAction,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish or
    /// powershell), e.g.
    /// `pgmq completions bash > /etc/bash_completion.d/pgmq`, or for zsh
    /// into a directory on $fpath as `_pgmq`, or for fish into
    /// ~/.config/fish/completions/pgmq.fish.
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// `--interval`: a number of seconds above zero.
fn positive_secs(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.01 => Ok(s),
        _ => Err(format!(
            "{text:?} is not a number of seconds of at least 0.01"
        )),
    }
}

// The arguments of `pgmq peek` (its help text is the variant's doc above).
#[derive(clap::Args)]
struct PeekArgs {
    queue: String,
    /// How many messages at most.
    #[arg(long, short = 'n', default_value_t = 10)]
    qty: usize,
    /// The queue's archive instead of the queue.
    #[arg(long)]
    archive: bool,
    /// An aligned table for people instead of JSON lines.
    #[arg(long)]
    table: bool,
}

// The arguments of `pgmq archive`: ids to archive, or a subcommand. A first
// word `list` or `prune` is the subcommand; `--` before it makes it a queue
// name (clap takes nothing after `--` as a subcommand).
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct ArchiveArgs {
    #[command(subcommand)]
    action: Option<ArchiveAction>,
    /// The queue to archive from.
    #[arg(required = true)]
    queue: Option<String>,
    /// The ids of the messages to archive.
    #[arg(required = true)]
    msg_ids: Vec<i64>,
}

#[derive(Subcommand)]
enum ArchiveAction {
    /// The first archived messages by msg_id, with when each was archived.
    List {
        queue: String,
        /// How many at most.
        #[arg(long, short = 'n', default_value_t = 10)]
        qty: usize,
        /// An aligned table for people instead of JSON lines.
        #[arg(long)]
        table: bool,
    },
    /// Delete archived messages archived longer ago than --older-than (on
    /// the database clock) and beyond the newest --keep (by msg_id): a row
    /// goes only when every limit given lets it go. In batches of --batch
    /// rows, the lowest msg_ids first, each batch its own short transaction
    /// that holds the queue's retention lock, so one process prunes a queue
    /// at a time; prints {"queue", "pruned": N, "busy": bool} (busy:
    /// another process was pruning it, and this run stopped).
    #[command(group(clap::ArgGroup::new("limit").required(true).multiple(true).args(["older_than", "keep"])))]
    Prune {
        queue: String,
        /// An age: a whole number and s, m, h, d or w (90s, 12h, 7d, 2w).
        #[arg(long, value_name = "AGE", value_parser = archive::parse_age)]
        older_than: Option<Duration>,
        /// Keep at least this many of the newest rows.
        #[arg(long, value_name = "N")]
        keep: Option<u64>,
        /// Rows deleted per transaction.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10000))]
        batch: u32,
    },
}

#[derive(Subcommand)]
enum TopicAction {
    /// Route routing keys matching PATTERN to QUEUE (e.g. `orders.*.eu`).
    Bind { pattern: String, queue: String },
    /// Remove a binding; prints {"pattern", "queue", "removed": bool}.
    Unbind { pattern: String, queue: String },
    /// The bindings, of every queue or of --queue.
    List {
        /// Only this queue's bindings.
        #[arg(long)]
        queue: Option<String>,
        /// An aligned table for people instead of JSON lines.
        #[arg(long)]
        table: bool,
    },
    /// The bindings a routing key would match (nothing is sent).
    Test {
        /// A routing key, e.g. orders.eu.created.
        routing_key: String,
        /// An aligned table for people instead of JSON lines.
        #[arg(long)]
        table: bool,
    },
}

// The arguments of `pgmq create` (its help text is the variant's doc above).
#[derive(clap::Args)]
struct CreateArgs {
    /// Queue name: printable ASCII, at most 47, none of $ ; -- ' (as PGMQ).
    queue: String,
    /// Unlogged tables: faster, emptied by a server crash.
    #[arg(long, conflicts_with = "partitioned")]
    unlogged: bool,
    /// Partitioned by pg_partman (the extension must be installed).
    #[arg(long)]
    partitioned: bool,
    /// Partition size: a message count ("10000") or an interval ("1 day").
    #[arg(long, default_value = "10000", requires = "partitioned")]
    partition_interval: String,
    /// Retention: a message count or an interval.
    #[arg(long, default_value = "100000", requires = "partitioned")]
    retention_interval: String,
}

// The arguments of `pgmq send` (its help text is the variant's doc above).
#[derive(clap::Args)]
struct SendArgs {
    queue: String,
    /// Read this file instead of stdin ("-" is stdin).
    #[arg(long, short)]
    file: Option<PathBuf>,
    /// Lines are {"body", "headers", "delay"} objects.
    #[arg(long)]
    envelope: bool,
    /// Delay in seconds for lines without their own.
    #[arg(long, value_name = "SECONDS")]
    delay: Option<u32>,
    /// Messages per statement.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10000))]
    batch: u32,
}

// The arguments of `pgmq read` (its help text is the variant's doc above).
#[derive(clap::Args)]
struct ReadArgs {
    queue: String,
    /// How many messages at most.
    #[arg(long, short = 'n', default_value_t = 1)]
    qty: usize,
    /// Seconds the messages stay hidden (0: visible again at once).
    #[arg(long, default_value_t = 30)]
    vt: u64,
    /// Wait up to this many seconds for a message when none is visible.
    #[arg(long, value_name = "SECONDS")]
    poll: Option<u64>,
    /// Only messages whose body contains this JSON (jsonb @>).
    #[arg(long, value_name = "JSON")]
    filter: Option<String>,
    /// An aligned table for people instead of JSON lines.
    #[arg(long)]
    table: bool,
}

// The arguments of `pgmq redrive` (its help text is the variant's doc above).
#[derive(clap::Args)]
struct RedriveArgs {
    /// The dead-letter queue.
    dead_letter_queue: String,
    /// Send every message to this queue instead of its `source_queue`.
    #[arg(long)]
    to: Option<String>,
    /// Messages per transaction.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10000))]
    batch: u32,
    /// Stop after this many messages.
    #[arg(long)]
    limit: Option<usize>,
    /// Show what would move, and move nothing.
    #[arg(long)]
    dry_run: bool,
    /// Move messages back to each of several source queues (without
    /// --to, redrive refuses when the messages name more than one).
    #[arg(long)]
    yes: bool,
}

// The arguments of `pgmq move` (its help text is the variant's doc above).
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true).multiple(true).args(["all", "id", "filter", "header_filter"])))]
struct MoveArgs {
    /// The queue the messages leave.
    from: String,
    /// The queue they go to.
    to: String,
    /// Every visible message.
    #[arg(long, conflicts_with_all = ["id", "filter", "header_filter"])]
    all: bool,
    /// A message id (repeat for more).
    #[arg(long, value_name = "MSG_ID", conflicts_with_all = ["filter", "header_filter"])]
    id: Vec<i64>,
    /// JSON the body must contain, e.g. '{"region":"eu"}'.
    #[arg(long, value_name = "JSON", value_parser = json_object)]
    filter: Option<Value>,
    /// JSON the headers must contain.
    #[arg(long, value_name = "JSON", value_parser = json_object)]
    header_filter: Option<Value>,
    /// Messages per transaction.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10000))]
    batch: u32,
    /// Stop after this many messages.
    #[arg(long)]
    limit: Option<usize>,
}

/// A JSON value given on the command line.
fn json_object(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))
}

#[derive(Subcommand)]
enum NotifyAction {
    /// Notify on insert, at most once per --throttle-ms (0: every insert).
    Enable {
        queue: String,
        #[arg(long, default_value_t = 250)]
        throttle_ms: u64,
    },
    /// Stop notifying.
    Disable { queue: String },
    /// Queues that notify, with their throttles.
    List {
        /// An aligned table for people instead of JSON lines.
        #[arg(long)]
        table: bool,
    },
}

pub(crate) fn queue(name: &str) -> Result<QueueName, Failure> {
    Ok(QueueName::new(name)?)
}

/// A message as `read`, `pop`, `peek` and `set-vt` print it.
#[derive(serde::Serialize)]
struct MessageOut<'a> {
    msg_id: i64,
    read_ct: i32,
    enqueued_at: DateTime<Utc>,
    last_read_at: Option<DateTime<Utc>>,
    vt: DateTime<Utc>,
    body: &'a RawJson,
    headers: &'a Option<Value>,
}

impl<'a> From<&'a Message<RawJson>> for MessageOut<'a> {
    fn from(m: &'a Message<RawJson>) -> Self {
        MessageOut {
            msg_id: m.msg_id,
            read_ct: m.read_ct,
            enqueued_at: m.enqueued_at,
            last_read_at: m.last_read_at,
            vt: m.vt,
            body: &m.body,
            headers: &m.headers,
        }
    }
}

/// An archived message as `archive list` prints it.
#[derive(serde::Serialize)]
struct ArchivedOut<'a> {
    #[serde(flatten)]
    message: MessageOut<'a>,
    archived_at: DateTime<Utc>,
}

/// The table of messages (`read`, `peek`).
const MESSAGE_COLS: [Col; 5] = [
    col("MSG_ID", "msg_id"),
    col("READ_CT", "read_ct"),
    time("ENQUEUED_AT", "enqueued_at"),
    time("VT", "vt"),
    json_col("BODY", "body"),
];

/// The table of archived messages (`archive list`, `peek --archive`).
const ARCHIVE_COLS: [Col; 5] = [
    col("MSG_ID", "msg_id"),
    col("READ_CT", "read_ct"),
    time("ENQUEUED_AT", "enqueued_at"),
    time("ARCHIVED_AT", "archived_at"),
    json_col("BODY", "body"),
];

/// The table of `list`: that of `metrics`, and the kind of queue.
const LIST_COLS: [Col; 7] = [
    col("QUEUE", "queue_name"),
    col("LENGTH", "queue_length"),
    col("VISIBLE", "queue_visible_length"),
    col("OLDEST_S", "oldest_msg_age_sec"),
    col("NEWEST_S", "newest_msg_age_sec"),
    col("TOTAL", "total_messages"),
    col("KIND", "kind"),
];

/// A queue as `list` prints it.
#[derive(serde::Serialize)]
struct QueueOut {
    queue_name: String,
    queue_length: Option<i64>,
    queue_visible_length: Option<i64>,
    oldest_msg_age_sec: Option<i32>,
    newest_msg_age_sec: Option<i32>,
    total_messages: Option<i64>,
    is_partitioned: bool,
    is_unlogged: bool,
    created_at: DateTime<Utc>,
}

async fn connect(cli: &Cli) -> Result<Client, Failure> {
    let from_file = match &cli.dsn_file {
        // Checked on the opened file: a regular file, mode 0600 or stricter.
        Some(path) => Some(
            pgmq_client::read_dsn_file(path, "--dsn-file")
                .map_err(|e| Failure::new(Exit::Other, e.to_string()))?,
        ),
        None => None,
    };
    // --dsn-file, else --dsn, else DATABASE_URL (clap refuses --dsn with
    // --dsn-file; the environment conflicts with neither).
    let from_env = std::env::var("DATABASE_URL").ok().filter(|d| !d.is_empty());
    let Some(dsn) = from_file
        .as_deref()
        .or(cli.dsn.as_deref())
        .or(from_env.as_deref())
    else {
        return Err(Failure::new(
            Exit::Usage,
            "no database: set DATABASE_URL, or pass --dsn-file or --dsn",
        ));
    };
    let mut builder = Client::builder(dsn).max_size(2).libpq_password(true);
    if let Some(path) = &cli.ca_file {
        builder = builder.tls(tls_trusting(path).await?);
    }
    Ok(builder.connect().await?)
}

async fn tls_trusting(
    path: &PathBuf,
) -> Result<pgmq_client::reexports::rustls::ClientConfig, Failure> {
    use pgmq_client::reexports::rustls;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let pem = tokio::fs::read(path)
        .await
        .map_err(|e| format!("reading {}: {e}", path.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("{}: {e}", path.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if roots.is_empty() {
        return fail(format!("{}: no PEM certificates found", path.display()));
    }
    Ok(
        rustls::ClientConfig::builder_with_provider(
            rustls::crypto::ring::default_provider().into(),
        )
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let mut out = Out::stdout();
    // What needs no database.
    match &cli.command {
        Command::InstallSdk { print: true } => {
            out.text(&pgmq_client::sdk_schema::sql()).await?;
            return out.flush().await;
        }
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut Cli::command(), "pgmq", &mut script);
            out.text(&String::from_utf8_lossy(&script)).await?;
            return out.flush().await;
        }
        _ => {}
    }
    let client = connect(&cli).await?;
    match cli.command {
        Command::List { table } => list(&client, table, &mut out).await?,
        Command::Peek(args) => peek(&client, args, &mut out).await?,
        Command::Metrics { queue: name, table } => {
            let metrics = match name {
                Some(name) => vec![client.metrics(&queue(&name)?).await?],
                None => client.metrics_all().await?,
            };
            // The table of `list` less its KIND.
            let cols = &LIST_COLS[..LIST_COLS.len() - 1];
            out.rows(table, cols, &metrics).await?;
        }
        Command::Watch { interval, count } => {
            watch::run(&client, Duration::from_secs_f64(interval), count, &mut out).await?
        }
        Command::Create(args) => create(&client, args).await?,
        Command::Autovacuum { queue: name, show } => {
            let q = queue(&name)?;
            let t = if show {
                client.queue_table_autovacuum(&q).await?
            } else {
                client.tune_autovacuum(&q).await?
            };
            out.line(&t).await?;
        }
        Command::Drop {
            queue: name,
            if_exists,
            yes,
        } => drop_queue(&client, &queue(&name)?, if_exists, yes).await?,
        Command::Purge { queue: name, yes } => {
            let q = queue(&name)?;
            if !yes {
                let m = client.metrics(&q).await?;
                return Err(Failure::new(
                    Exit::Refused,
                    format!(
                        "not purging queue {q} without --yes: it would delete its {} message(s) \
                         ({} visible, {} in flight)",
                        m.queue_length,
                        m.queue_visible_length,
                        m.queue_length - m.queue_visible_length
                    ),
                ));
            }
            let n = client.purge_queue(&q).await?;
            out.line(&json!({ "purged": n })).await?;
        }
        Command::Send(args) => send(&client, args, &mut out).await?,
        Command::Read(args) => read(&client, args, &mut out).await?,
        Command::Pop { queue: name, qty } => pop(&client, &queue(&name)?, qty, &mut out).await?,
        Command::Delete {
            queue: name,
            msg_ids,
        } => {
            let ids = client.delete_batch(&queue(&name)?, &msg_ids).await?;
            print_ids(&ids, &mut out).await?;
        }
        Command::Archive(args) => archive_cmd(&client, args, &mut out).await?,
        Command::SetVt {
            queue: name,
            msg_id,
            seconds,
        } => {
            let q = queue(&name)?;
            match client
                .set_vt_raw(&q, msg_id, Duration::from_secs(seconds))
                .await?
            {
                Some(m) => out.line(&MessageOut::from(&m)).await?,
                None => {
                    return Err(Failure::new(
                        Exit::NotFound,
                        format!("message {msg_id} is not in queue {q}"),
                    ))
                }
            }
        }
        Command::Redrive(args) => redrive(&client, args, &mut out).await?,
        Command::Move(args) => move_cmd(&client, args, &mut out).await?,
        Command::Topic { action } => topic(&client, action, &mut out).await?,
        Command::Notify { action } => notify(&client, action, &mut out).await?,
        Command::InstallSdk { .. } => {
            let done = client.install_sdk_schema().await?;
            out.line(&json!({ "before": done.before, "now": done.now, "repaired": done.repaired }))
                .await?;
        }
        Command::Pause {
            queue: name,
            reason,
        } => {
            let changed = client.pause(&queue(&name)?, reason.as_deref()).await?;
            out.line(&json!({ "queue": name, "paused": true, "changed": changed }))
                .await?;
        }
        Command::Resume { queue: name } => {
            let changed = client.resume(&queue(&name)?).await?;
            out.line(&json!({ "queue": name, "paused": false, "changed": changed }))
                .await?;
        }
        Command::Paused { table } => {
            let rows: Vec<Value> = client
                .paused_queues()
                .await?
                .into_iter()
                .map(|p| {
                    json!({
                        "queue": p.queue_name,
                        "paused_at": p.paused_at,
                        "reason": p.reason,
                    })
                })
                .collect();
            let cols = [
                col("QUEUE", "queue"),
                time("PAUSED_AT", "paused_at"),
                col("REASON", "reason"),
            ];
            out.rows(table, &cols, &rows).await?;
        }
        Command::Schedule { action } => schedule::run(&client, action, &mut out).await?,
        Command::Completions { .. } => unreachable!("answered before connecting"),
    }
    out.flush().await
}

/// `pgmq create`: a partitioned, an unlogged or a plain queue.
async fn create(client: &Client, args: CreateArgs) -> Result<(), Failure> {
    let q = queue(&args.queue)?;
    if args.partitioned {
        client
            .create_partitioned(&q, &args.partition_interval, &args.retention_interval)
            .await?;
    } else if args.unlogged {
        client.create_unlogged(&q).await?;
    } else {
        client.create(&q).await?;
    }
    Ok(())
}

/// `pgmq drop`: a queue that does not exist is an error unless
/// `--if-exists`; one that does is dropped only with `--yes`.
async fn drop_queue(
    client: &Client,
    q: &QueueName,
    if_exists: bool,
    yes: bool,
) -> Result<(), Failure> {
    let missing = || Failure::new(Exit::NotFound, format!("queue {q} does not exist"));
    if !yes {
        if !client.queue_exists(q).await? {
            return if if_exists { Ok(()) } else { Err(missing()) };
        }
        let m = client.metrics(q).await?;
        return Err(Failure::new(
            Exit::Refused,
            format!(
                "not dropping queue {q} without --yes: it would remove the queue and its {} \
                 message(s), its archive {} with every archived message, and its topic bindings",
                m.queue_length,
                q.archive_table()
            ),
        ));
    }
    if !client.drop_queue(q).await? && !if_exists {
        return Err(missing());
    }
    Ok(())
}

/// `pgmq send`: JSON lines from `--file` (`-` or none: stdin) to the queue.
async fn send(client: &Client, args: SendArgs, out: &mut Out) -> Result<(), Failure> {
    let q = queue(&args.queue)?;
    let opts = input::SendOpts {
        envelope: args.envelope,
        delay: args.delay,
        batch: args.batch as usize,
    };
    match args.file.filter(|f| f.as_os_str() != "-") {
        Some(path) => {
            let f = tokio::fs::File::open(&path)
                .await
                .map_err(|e| format!("opening {}: {e}", path.display()))?;
            input::send_lines(client, &q, f, &opts, out).await
        }
        None => input::send_lines(client, &q, tokio::io::stdin(), &opts, out).await,
    }
}

/// `pgmq read`: one read, filtered and polling as asked.
async fn read(client: &Client, args: ReadArgs, out: &mut Out) -> Result<(), Failure> {
    let q = queue(&args.queue)?;
    let mut opts = pgmq_client::ReadOptions::new(Duration::from_secs(args.vt)).qty(args.qty);
    opts.filter = match args.filter {
        Some(f) => Some(
            serde_json::from_str(&f)
                .map_err(|e| Failure::new(Exit::Usage, format!("--filter is not JSON: {e}")))?,
        ),
        None => None,
    };
    if let Some(secs) = args.poll {
        opts = opts.poll(Duration::from_secs(secs), Duration::from_millis(100));
    }
    let msgs = client.read_with_raw(&q, &opts).await?;
    print_messages(&msgs, args.table, out).await
}

/// `pgmq peek`: the first messages of a queue or its archive, as they are.
async fn peek(client: &Client, args: PeekArgs, out: &mut Out) -> Result<(), Failure> {
    let q = queue(&args.queue)?;
    if args.archive {
        return archive_list(client, &q, args.qty, args.table, out).await;
    }
    let msgs = client.peek_raw(&q, args.qty).await?;
    print_messages(&msgs, args.table, out).await
}

/// `pgmq archive`: ids archived, or `list`, or `prune`.
async fn archive_cmd(client: &Client, args: ArchiveArgs, out: &mut Out) -> Result<(), Failure> {
    match args.action {
        Some(ArchiveAction::List {
            queue: name,
            qty,
            table,
        }) => archive_list(client, &queue(&name)?, qty, table, out).await,
        Some(ArchiveAction::Prune {
            queue: name,
            older_than,
            keep,
            batch,
        }) => {
            let mut retention = pgmq_client::ArchiveRetention::keeping(0).batch(batch as usize);
            retention.older_than = older_than;
            retention.keep = keep;
            archive::prune(client, &queue(&name)?, &retention, out).await
        }
        None => {
            // clap requires both without a subcommand.
            let name = args.queue.unwrap_or_default();
            let ids = client.archive_batch(&queue(&name)?, &args.msg_ids).await?;
            print_ids(&ids, out).await
        }
    }
}

/// The first `qty` rows of `q`'s archive (`archive list`, `peek --archive`).
async fn archive_list(
    client: &Client,
    q: &QueueName,
    qty: usize,
    table: bool,
    out: &mut Out,
) -> Result<(), Failure> {
    let archived = client.peek_archive_raw(q, qty).await?;
    let rows: Vec<ArchivedOut> = archived
        .iter()
        .map(|a| ArchivedOut {
            message: MessageOut::from(&a.message),
            archived_at: a.archived_at,
        })
        .collect();
    out.rows(table, &ARCHIVE_COLS, &rows).await
}

/// How long `pop` hides what it read before deleting it: when the process
/// dies in between, the messages are visible again after this.
const POP_HOLD: Duration = Duration::from_secs(30);

/// `pgmq pop`: read (hidden for [`POP_HOLD`]), print and flush, then delete
/// what was printed. When stdout fails, nothing is deleted and the messages
/// are made visible again at once.
async fn pop(client: &Client, q: &QueueName, qty: usize, out: &mut Out) -> Result<(), Failure> {
    let msgs = client.read_raw(q, POP_HOLD, qty).await?;
    let ids: Vec<i64> = msgs.iter().map(|m| m.msg_id).collect();
    let printed = match print_messages(&msgs, false, out).await {
        Ok(()) => out.flush().await,
        Err(e) => Err(e),
    };
    if let Err(f) = printed {
        let back = match client.set_vt_batch(q, &ids, Duration::ZERO).await {
            Ok(_) => "visible again now".to_owned(),
            Err(err) => format!(
                "visible again within {} s (making them visible at once failed: {err})",
                POP_HOLD.as_secs()
            ),
        };
        return Err(f.map_msg(|e| {
            format!(
                "{e}; no message was deleted: the {} read are {back}",
                ids.len()
            )
        }));
    }
    client.delete_batch(q, &ids).await.map_err(|e| {
        Failure::from(e).map_msg(|e| {
            format!(
                "{e}; the {} message(s) printed may not have been deleted: those that were not \
                 are visible again within {} s",
                ids.len(),
                POP_HOLD.as_secs()
            )
        })
    })?;
    Ok(())
}

/// `pgmq redrive`: the names checked, then [`redrive::run`].
async fn redrive(client: &Client, args: RedriveArgs, out: &mut Out) -> Result<(), Failure> {
    let opts = redrive::Opts {
        dlq: queue(&args.dead_letter_queue)?,
        to: args.to.as_deref().map(queue).transpose()?,
        batch: args.batch as usize,
        limit: args.limit,
        dry_run: args.dry_run,
        yes: args.yes,
    };
    redrive::run(client, &opts, out).await
}

/// `pgmq move`: the names and the selection checked, then [`move_msgs::run`].
async fn move_cmd(client: &Client, args: MoveArgs, out: &mut Out) -> Result<(), Failure> {
    let select = if args.all {
        pgmq_client::MoveSelection::All
    } else if !args.id.is_empty() {
        pgmq_client::MoveSelection::Ids(args.id)
    } else {
        pgmq_client::MoveSelection::Matching {
            body: args.filter,
            headers: args.header_filter,
        }
    };
    let opts = move_msgs::Opts {
        from: queue(&args.from)?,
        to: queue(&args.to)?,
        select,
        batch: args.batch as usize,
        limit: args.limit,
    };
    move_msgs::run(client, &opts, out).await
}

/// `pgmq topic bind | unbind | list | test`.
async fn topic(client: &Client, action: TopicAction, out: &mut Out) -> Result<(), Failure> {
    const BINDING_COLS: [Col; 3] = [
        col("PATTERN", "pattern"),
        col("QUEUE", "queue_name"),
        time("BOUND_AT", "bound_at"),
    ];
    match action {
        TopicAction::Bind {
            pattern,
            queue: name,
        } => {
            client.bind_topic(&pattern, &queue(&name)?).await?;
            out.line(&json!({ "pattern": pattern, "queue": name }))
                .await
        }
        TopicAction::Unbind {
            pattern,
            queue: name,
        } => {
            let removed = client.unbind_topic(&pattern, &queue(&name)?).await?;
            out.line(&json!({ "pattern": pattern, "queue": name, "removed": removed }))
                .await
        }
        TopicAction::List { queue: name, table } => {
            let q = name.as_deref().map(queue).transpose()?;
            let bindings = client.list_topic_bindings(q.as_ref()).await?;
            out.rows(table, &BINDING_COLS, &bindings).await
        }
        TopicAction::Test { routing_key, table } => {
            let matches = client.test_routing(&routing_key).await?;
            let cols = [col("PATTERN", "pattern"), col("QUEUE", "queue_name")];
            out.rows(table, &cols, &matches).await
        }
    }
}

/// `pgmq notify enable | disable | list`.
async fn notify(client: &Client, action: NotifyAction, out: &mut Out) -> Result<(), Failure> {
    match action {
        NotifyAction::Enable {
            queue: name,
            throttle_ms,
        } => {
            client
                .enable_notify_insert(&queue(&name)?, Duration::from_millis(throttle_ms))
                .await?
        }
        NotifyAction::Disable { queue: name } => {
            client.disable_notify_insert(&queue(&name)?).await?
        }
        NotifyAction::List { table } => {
            let throttles = client.list_notify_insert_throttles().await?;
            let cols = [
                col("QUEUE", "queue_name"),
                col("THROTTLE_MS", "throttle_interval_ms"),
                time("LAST_NOTIFIED_AT", "last_notified_at"),
            ];
            out.rows(table, &cols, &throttles).await?;
        }
    }
    Ok(())
}

/// Messages as JSON lines or a table (`read`, `pop`, `peek`).
async fn print_messages(
    msgs: &[Message<RawJson>],
    table: bool,
    out: &mut Out,
) -> Result<(), Failure> {
    let rows: Vec<MessageOut> = msgs.iter().map(MessageOut::from).collect();
    out.rows(table, &MESSAGE_COLS, &rows).await
}

/// Message ids, one per line (`delete`, `archive`).
async fn print_ids(ids: &[i64], out: &mut Out) -> Result<(), Failure> {
    for id in ids {
        out.line(id).await?;
    }
    Ok(())
}

async fn list(client: &Client, table: bool, out: &mut Out) -> Result<(), Failure> {
    let queues = client.list_queues().await?;
    let metrics = client.metrics_all().await?;
    let rows: Vec<QueueOut> = queues
        .into_iter()
        .map(|info| {
            // A queue created after metrics_all ran has no metrics: nulls.
            let m = metrics.iter().find(|m| m.queue_name == info.queue_name);
            QueueOut {
                queue_length: m.map(|m| m.queue_length),
                queue_visible_length: m.map(|m| m.queue_visible_length),
                oldest_msg_age_sec: m.and_then(|m| m.oldest_msg_age_sec),
                newest_msg_age_sec: m.and_then(|m| m.newest_msg_age_sec),
                total_messages: m.map(|m| m.total_messages),
                queue_name: info.queue_name,
                is_partitioned: info.is_partitioned,
                is_unlogged: info.is_unlogged,
                created_at: info.created_at,
            }
        })
        .collect();
    if !table {
        return out.rows(false, &LIST_COLS, &rows).await;
    }
    let mut values = Vec::with_capacity(rows.len());
    for r in &rows {
        let mut v = serde_json::to_value(r)?;
        v["kind"] = json!(match (r.is_partitioned, r.is_unlogged) {
            (true, _) => "partitioned",
            (_, true) => "unlogged",
            _ => "logged",
        });
        values.push(v);
    }
    out.rows(true, &LIST_COLS, &values).await
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pgmq: error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("pgmq: error: {}", f.msg);
            ExitCode::from(f.code as u8)
        }
    }
}
