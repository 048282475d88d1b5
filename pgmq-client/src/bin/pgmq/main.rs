//! `pgmq`: a command-line tool for operating PGMQ queues.
//!
//! Built with `cargo build -p pgmq-client --features cli --bin pgmq`. The
//! database comes from `DATABASE_URL`, `--dsn-file` or `--dsn`, the password
//! from the DSN, `PGPASSWORD` or `~/.pgpass`. Output is JSON lines
//! (one JSON value per line, ready for `jq`); errors go to stderr as
//! `pgmq: error: ...` with exit status 1 (2 for a bad command line).
//!
//! ```text
//! pgmq list [--table]                          queues with their metrics
//! pgmq create <queue> [--unlogged | --partitioned [--partition-interval N] [--retention-interval N]]
//! pgmq drop <queue> [--if-exists]
//! pgmq purge <queue>
//! pgmq send <queue> [--file F] [--envelope] [--delay S] [--batch N]   JSON lines in, ids out
//! pgmq read <queue> [-n N] [--vt S] [--poll S] [--filter JSON]       messages out
//! pgmq pop <queue> [-n N]                    print, then delete what was printed
//! pgmq delete <queue> <msg_id>...  |  pgmq archive <queue> <msg_id>...
//! pgmq redrive <dead_letter_queue> [--to Q] [--batch N] [--limit N] [--dry-run]
//! pgmq notify enable <queue> [--throttle-ms MS] | notify disable <queue> | notify list
//! pgmq install-sdk [--print]                 create or upgrade the pgmq_sdk schema
//! pgmq pause <queue> [--reason TEXT] | pgmq resume <queue> | pgmq paused
//! ```

mod input;
mod redrive;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand};
use pgmq_client::{Client, Message, QueueName, RawJson};
use serde_json::{json, Value};
use tokio::io::{AsyncWriteExt, BufWriter, Stdout};

/// Operate PGMQ queues: list, create, drop, purge, send, read, pop, delete,
/// archive, redrive dead letters, switch insert notifications, install the
/// pgmq_sdk schema, and pause or resume a queue for every worker.
///
/// Output is JSON lines (pipe it into jq). The database is `--dsn` or
/// `DATABASE_URL`; `sslmode` in the DSN works as in libpq.
#[derive(Parser)]
#[command(name = "pgmq", version)]
struct Cli {
    /// PostgreSQL DSN without the password, e.g.
    /// postgres://user@host:5432/db?sslmode=verify-full. The password comes
    /// from PGPASSWORD or ~/.pgpass (libpq's format), or put the whole DSN in
    /// DATABASE_URL or a file (--dsn-file): anything on the command line is
    /// visible to other local users. Default: DATABASE_URL (read in
    /// `connect`, not by clap, so that a DATABASE_URL merely set in the
    /// environment does not conflict with --dsn-file).
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
    /// Create a queue (a no-op when it exists).
    Create(CreateArgs),
    /// Drop a queue, its archive and its bindings.
    Drop {
        queue: String,
        /// Succeed when the queue does not exist.
        #[arg(long)]
        if_exists: bool,
    },
    /// Delete every message of a queue; prints {"purged": N}.
    Purge { queue: String },
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
    /// queue, hidden for --vt seconds, and their read_ct goes up.
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
    /// Move messages by id to the queue's archive table; prints the ids archived.
    Archive {
        queue: String,
        #[arg(required = true)]
        msg_ids: Vec<i64>,
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
    Paused,
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
    List,
}

/// A failure to report: the message printed after `pgmq: error: `.
#[derive(Debug)]
pub(crate) struct Failure(String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string())
    }
}

pub(crate) fn fail<T>(msg: impl Into<String>) -> Result<T, Failure> {
    Err(Failure(msg.into()))
}

/// Buffered JSON-lines output on stdout.
pub(crate) struct Out(BufWriter<Stdout>);

impl Out {
    pub(crate) async fn line(&mut self, v: &impl serde::Serialize) -> Result<(), Failure> {
        let mut text = serde_json::to_vec(v)?;
        text.push(b'\n');
        self.0
            .write_all(&text)
            .await
            .map_err(|e| Failure(format!("writing output: {e}")))
    }

    pub(crate) async fn flush(&mut self) -> Result<(), Failure> {
        self.0
            .flush()
            .await
            .map_err(|e| Failure(format!("writing output: {e}")))
    }
}

pub(crate) fn queue(name: &str) -> Result<QueueName, Failure> {
    Ok(QueueName::new(name)?)
}

/// A message as `read` and `pop` print it.
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
            pgmq_client::read_dsn_file(path, "--dsn-file").map_err(|e| Failure(e.to_string()))?,
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
        return fail("no database: set DATABASE_URL, or pass --dsn-file or --dsn");
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
        .map_err(|e| Failure(format!("reading {}: {e}", path.display())))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| Failure(format!("{}: {e}", path.display())))?;
        roots
            .add(cert)
            .map_err(|e| Failure(format!("{}: {e}", path.display())))?;
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
    let mut out = Out(BufWriter::new(tokio::io::stdout()));
    if let Command::InstallSdk { print: true } = cli.command {
        use tokio::io::AsyncWriteExt as _;
        out.0
            .write_all(pgmq_client::sdk_schema::sql().as_bytes())
            .await
            .map_err(|e| format!("writing stdout: {e}"))?;
        return out.flush().await;
    }
    let client = connect(&cli).await?;
    match cli.command {
        Command::List { table } => list(&client, table, &mut out).await?,
        Command::Create(args) => create(&client, args).await?,
        Command::Drop {
            queue: name,
            if_exists,
        } => drop_queue(&client, &queue(&name)?, if_exists).await?,
        Command::Purge { queue: name } => {
            let n = client.purge_queue(&queue(&name)?).await?;
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
        Command::Archive {
            queue: name,
            msg_ids,
        } => {
            let ids = client.archive_batch(&queue(&name)?, &msg_ids).await?;
            print_ids(&ids, &mut out).await?;
        }
        Command::Redrive(args) => redrive(&client, args, &mut out).await?,
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
        Command::Paused => {
            for p in client.paused_queues().await? {
                out.line(&json!({
                    "queue": p.queue_name,
                    "paused_at": p.paused_at,
                    "reason": p.reason,
                }))
                .await?;
            }
        }
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

/// `pgmq drop`: a queue that does not exist is an error unless `--if-exists`.
async fn drop_queue(client: &Client, q: &QueueName, if_exists: bool) -> Result<(), Failure> {
    if !client.drop_queue(q).await? && !if_exists {
        return fail(format!("queue {q} does not exist"));
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
                .map_err(|e| Failure(format!("opening {}: {e}", path.display())))?;
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
            serde_json::from_str(&f).map_err(|e| Failure(format!("--filter is not JSON: {e}")))?,
        ),
        None => None,
    };
    if let Some(secs) = args.poll {
        opts = opts.poll(Duration::from_secs(secs), Duration::from_millis(100));
    }
    let msgs = client.read_with_raw(&q, &opts).await?;
    print_messages(&msgs, out).await
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
    let printed = match print_messages(&msgs, out).await {
        Ok(()) => out.flush().await,
        Err(e) => Err(e),
    };
    if let Err(Failure(e)) = printed {
        let back = match client.set_vt_batch(q, &ids, Duration::ZERO).await {
            Ok(_) => "visible again now".to_owned(),
            Err(err) => format!(
                "visible again within {} s (making them visible at once failed: {err})",
                POP_HOLD.as_secs()
            ),
        };
        return fail(format!(
            "{e}; no message was deleted: the {} read are {back}",
            ids.len()
        ));
    }
    client.delete_batch(q, &ids).await.map_err(|e| {
        Failure(format!(
            "{e}; the {} message(s) printed may not have been deleted: those that were not \
             are visible again within {} s",
            ids.len(),
            POP_HOLD.as_secs()
        ))
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
        NotifyAction::List => {
            for t in client.list_notify_insert_throttles().await? {
                out.line(&t).await?;
            }
        }
    }
    Ok(())
}

/// Messages as JSON lines (`read`, `pop`).
async fn print_messages(msgs: &[Message<RawJson>], out: &mut Out) -> Result<(), Failure> {
    for m in msgs {
        out.line(&MessageOut::from(m)).await?;
    }
    Ok(())
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
        for r in &rows {
            out.line(r).await?;
        }
        return Ok(());
    }
    let opt = |v: Option<i64>| v.map_or("-".to_owned(), |v| v.to_string());
    let mut cells = vec![[
        "QUEUE", "LENGTH", "VISIBLE", "OLDEST_S", "NEWEST_S", "TOTAL", "KIND",
    ]
    .map(str::to_owned)];
    for r in &rows {
        let kind = match (r.is_partitioned, r.is_unlogged) {
            (true, _) => "partitioned",
            (_, true) => "unlogged",
            _ => "logged",
        };
        cells.push([
            r.queue_name.clone(),
            opt(r.queue_length),
            opt(r.queue_visible_length),
            opt(r.oldest_msg_age_sec.map(i64::from)),
            opt(r.newest_msg_age_sec.map(i64::from)),
            opt(r.total_messages),
            kind.to_owned(),
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|i| cells.iter().map(|row| row[i].len()).max().unwrap_or(0))
        .collect();
    let mut text = String::new();
    for row in &cells {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        text.push_str(line.join("  ").trim_end());
        text.push('\n');
    }
    out.0
        .write_all(text.as_bytes())
        .await
        .map_err(|e| Failure(format!("writing output: {e}")))
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
        Err(Failure(msg)) => {
            eprintln!("pgmq: error: {msg}");
            ExitCode::FAILURE
        }
    }
}
