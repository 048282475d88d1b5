//! batch_handler: the db-write handler three ways on the same preloaded
//! queue (`per_message`, `per_message_tx`, `batch_tx`, whose batch's rows
//! go in with one `INSERT ... SELECT unnest($1)`), one run each per round,
//! so that transactional batches can be set against the paths they
//! replace. The runs, the sink's count and the database's counters are
//! described once, in docs/benchmark-sections.md ("batch_handler").

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use pgmq_client::{Message, Transaction};
use pgmq_worker::{HandlerError, MessageResult, Outcome, TransactionalBatchHandler};
use serde::{Deserialize, Serialize};

use crate::config::{pick, Apply, Profile};
use crate::checks::Checks;
use crate::document::{Runs, SectionRuns, Better, Document, LedgerReport, Rate, Sample, Sections, WorkerCounters};
use crate::error::Result;
use crate::figures::{measured, paired_ratios, Figures, RunKey};
use crate::report::workload_if;
use crate::report::{fmt_value, thousands};
use crate::report::{cell, definitions, fig};
use crate::cli::HandlerKind;
use crate::kit::body::InBody;
use crate::kit::drain;
use crate::kit::sink::{Sink, SINK_TABLE};
use crate::kit::tally::Tally;
use crate::kit::worker::{builder, counters, handler_kind, worker_on};
use crate::kit::Ctx;
use crate::sections::{at_least, within, Options, Round, Rounds, Section};
use crate::config::Config;
use crate::sections::plan::{self, Plan};

/// The section's name, in the document and on the command line.
const NAME: &str = "batch_handler";

/// The section\'s runs in the document.
const RUNS: Runs<BatchHandlerRun> = Runs::new(NAME);

/// The pool's application name, to wait for its sessions' end.
const APP: &str = "pgmq-bench-batch-handler";

/// The three ways of running the db-write handler, in the order a round
/// runs them.
const MODES: [&str; 3] = ["per_message", "per_message_tx", "batch_tx"];

/// The batch_handler options.
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
#[non_exhaustive]
pub struct BatchHandlerOptions {
    /// batch_handler: messages per run (each of the three runs of a round).
    #[arg(long, default_value_t = 60_000)]
    pub batch_handler_messages: u64,

    /// batch_handler: handlers (concurrent batches for batch_tx) of every run.
    #[arg(long, default_value_t = 8)]
    pub batch_handler_workers: u32,

    /// batch_handler: the most messages of one batch_tx batch.
    #[arg(long, default_value_t = 100)]
    pub batch_handler_max: u32,

    /// batch_handler: how long a batch_tx batch waits for more messages
    /// after its first, milliseconds.
    #[arg(long, default_value_t = 5)]
    pub batch_handler_window_ms: u64,
}

impl Options for BatchHandlerOptions {
    fn check(&self) -> Result<()> {
        at_least(self.batch_handler_messages, 1, "--batch-handler-messages")?;
        within(self.batch_handler_workers, 1..=256, "--batch-handler-workers")?;
        within(self.batch_handler_max, 1..=10_000, "--batch-handler-max")?;
        Ok(())
    }

    fn apply_profile(&mut self, p: &Apply<'_>) {
        match p.profile {
            Profile::Quick | Profile::Default => {
                pick!(p, self.batch_handler_messages, 60_000, 5_000)
            }
            Profile::Standard => pick!(p, self.batch_handler_messages, 60_000, 20_000),
            Profile::Full | Profile::Long => {}
        }
    }
}

/// One run of the section: one mode draining one queue.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct BatchHandlerRun {
    /// Round.
    pub round: u32,
    /// Warm-up or measured.
    pub warmup: bool,
    /// `per_message`, `per_message_tx` or `batch_tx`.
    pub mode: String,
    /// Handlers (concurrent batches for `batch_tx`).
    pub workers: u32,
    /// The most messages of a batch (1 for the per-message modes).
    pub batch_max: u32,
    /// Distinct messages handled over the seconds from spawning the worker
    /// to the end of the handler call that completed the last one.
    pub rate: Rate,
    /// Seconds of the shutdown after that (the last acknowledgements).
    pub ack_drain_s: f64,
    /// Messages left in the queue after the shutdown (must be 0).
    pub remaining_after: i64,
    /// Every id handled once.
    pub ledger: LedgerReport,
    /// Rows of the sink table after the run (must be the messages sent).
    pub sink_rows: i64,
    /// Distinct ids among them.
    pub sink_distinct: i64,
    /// The worker's counters at shutdown.
    pub worker: WorkerCounters,
    /// The database's counters over the run, per message (None when they
    /// could not be read).
    pub server: Option<BatchHandlerServer>,
    /// Seconds to preload the queue.
    pub preload_s: f64,
    /// Seconds to vacuum it.
    pub vacuum_s: f64,
    /// Peak RSS of the bench process during the run.
    pub peak_rss_bytes: u64,
}

/// The database's counters over one run, per message handled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct BatchHandlerServer {
    /// Committed and rolled-back transactions of the database
    /// (`pg_stat_database`): every statement outside a transaction is one.
    pub transactions_per_msg: f64,
    /// WAL written (`pg_stat_wal.wal_bytes`, the whole cluster).
    pub wal_bytes_per_msg: f64,
    /// WAL flushes to disk (`pg_stat_wal.wal_sync`): a durable commit
    /// waits for one, and concurrent commits share it.
    pub wal_syncs_per_msg: f64,
}

/// The batch_handler section (see the module docs).
pub(crate) struct BatchHandlerSection;

impl Section for BatchHandlerSection {
    fn runs(&self) -> &dyn SectionRuns {
        &RUNS
    }

    fn about(&self) -> &'static str {
        "The db-write handler per message, per message in a transaction, and in transactional batches"
    }

    fn planned(&self, cfg: &Config) -> Plan {
        // per_message, per_message_tx and batch_tx, each on a fresh queue.
        let n = cfg.options.batch_handler.batch_handler_messages;
        let rates = [4_000.0, 2_500.0, 25_000.0];
        Plan::work(rates.iter().map(|r| plan::drain(n, *r)).sum())
    }

    fn in_warmup(&self) -> bool {
        true
    }

    fn check(&self, s: &Sections, out: &mut Checks) {
        out.each(&RUNS, s, |r| (r.mode.clone(), r.round, r.warmup), |out, tag, r| {
            out.drained(tag, r.rate.elapsed_s, &r.ledger, r.remaining_after);
            out.counters(tag, &r.worker);
            let sent = r.ledger.expected as i64;
            if (r.sink_rows, r.sink_distinct) != (sent, sent) {
                out.fail(format!(
                    "{tag}: {} sink rows, {} distinct ids, for {sent} messages: an effect missing or written twice",
                    r.sink_rows, r.sink_distinct
                ));
            }
        });
    }

    fn figures(&self, s: &Sections, f: &mut Figures) {
        add_figures(f, &RUNS.list(s));
    }

    /// The section's table: per mode, the rate and the database's counters,
    /// then the ratios.
    fn report(&self, d: &Document, out: &mut String) {
        let Some(w) = workload_if::<BatchHandlerOptions>(d, &id("batch_tx", "throughput")) else {
            return;
        };
        let _ = writeln!(
            out,
            "## Batch handlers (batch_handler)\n\n\
             The db-write handler, {} messages a run, {} handlers; batch_tx batches of up to {} \
             gathered within {} ms.\n\n\
             | Mode | Throughput (msg/s) | Transactions/msg | WAL bytes/msg | WAL syncs/msg |\n\
             | --- | --- | --- | --- | --- |",
            thousands(w.batch_handler_messages as f64),
            w.batch_handler_workers,
            w.batch_handler_max,
            w.batch_handler_window_ms
        );
        let mut ids = Vec::new();
        for mode in MODES {
            let val = |what: &str| {
                fig(d, &id(mode, what))
                    .map(|f| fmt_value(f.median, "1/msg"))
                    .unwrap_or_else(|| "–".into())
            };
            let _ = writeln!(
                out,
                "| {mode} | {} | {} | {} | {} |",
                cell(d, &id(mode, "throughput")),
                val("transactions_per_msg"),
                fig(d, &id(mode, "wal_bytes_per_msg"))
                    .map(|f| format!("{:.0}", f.median))
                    .unwrap_or_else(|| "–".into()),
                val("wal_syncs_per_msg")
            );
            ids.push(id(mode, "throughput"));
        }
        let _ = writeln!(
            out,
            "\nbatch_tx ÷ per_message: {} (target: at least 0.8); per_message_tx ÷ per_message: {}.\n",
            cell(d, &format!("{NAME}.batch_tx_vs_per_message")),
            cell(d, &format!("{NAME}.per_message_tx_vs_per_message"))
        );
        ids.extend([
            format!("{NAME}.batch_tx_vs_per_message"),
            format!("{NAME}.per_message_tx_vs_per_message"),
            id("batch_tx", "transactions_per_msg"),
            id("batch_tx", "wal_bytes_per_msg"),
            id("batch_tx", "wal_syncs_per_msg"),
        ]);
        definitions(out, d, &ids);
    }
}

impl Rounds for BatchHandlerSection {
    /// One round: the three modes, each on a fresh queue.
    async fn run_round(&self, ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
        Sink::create_table(&ctx.admin).await?;
        let mut rates = Vec::new();
        for mode in MODES {
            let r = run(ctx, mode, at.index, at.warm).await?;
            ctx.progress.say(format!(
                "{} {NAME} {mode}: {:.0} msg/s, {:.3} transactions/msg",
                at.tag,
                r.rate.rate_per_s,
                r.server.as_ref().map_or(f64::NAN, |v| v.transactions_per_msg)
            ));
            rates.push(r.rate.rate_per_s);
            RUNS.record(s, &r)?;
        }
        if rates[0] > 0.0 {
            ctx.progress.say(format!(
                "{} {NAME}: batch_tx / per_message = {:.2}, per_message_tx / per_message = {:.2}",
                at.tag,
                rates[2] / rates[0],
                rates[1] / rates[0]
            ));
        }
        if ctx.cfg.handler == crate::document::HandlerKind::Empty {
            // The run's end drops it only for the db-write handlers.
            Sink::drop_table(&ctx.admin).await?;
        }
        Ok(())
    }
}

/// `--handler db-write` as a transactional batch: the batch's rows with one
/// statement, in the worker's transaction that also deletes the batch.
struct TxBatchSink(Arc<Tally>);

/// The insert of one batch, into [`SINK_TABLE`].
const BATCH_INSERT: &str = "INSERT INTO pgmq_bench_handler_sink (id) SELECT unnest($1::bigint[])";

impl TransactionalBatchHandler<InBody> for TxBatchSink {
    async fn handle(
        &self,
        batch: Vec<Message<InBody>>,
        tx: &Transaction<'_>,
    ) -> std::result::Result<Vec<MessageResult>, HandlerError> {
        let ids: Vec<i64> = batch
            .iter()
            .map(|m| {
                self.0.started(m.enqueued_at);
                m.body.id as i64
            })
            .collect();
        tx.query_typed(
            BATCH_INSERT,
            &[(&ids, tokio_postgres::types::Type::INT8_ARRAY)],
        )
        .await?;
        for m in &batch {
            self.0.handle(m.body.id).await;
        }
        Ok(batch.iter().map(|_| Ok(Outcome::Delete)).collect())
    }
}

/// One run of `mode` on a fresh queue.
async fn run(ctx: &Ctx, mode: &'static str, round: u32, warmup: bool) -> Result<BatchHandlerRun> {
    let opts = &ctx.cfg.options.batch_handler;
    let n = opts.batch_handler_messages;
    let (q, preload_s, vacuum_s) = ctx.fresh_loaded("batch_handler", n).await?;
    ctx.admin
        .batch_execute(&format!("TRUNCATE {SINK_TABLE}"))
        .await?;
    // Its own pool: each running transaction holds a connection, plus the
    // worker's claimers, flusher and heartbeat.
    let client = ctx
        .target
        .builder()
        .max_size(opts.batch_handler_workers + 6)
        .application_name(APP)
        .connect()
        .await?;
    let sink = match mode {
        "per_message" => Some(Sink::connect(&ctx.target, opts.batch_handler_workers).await?),
        _ => None,
    };
    // Work per message would be awaited once per message of a batch: none.
    let tally = Tally::new(n, Duration::ZERO);
    let mut spec = ctx.worker_spec(&q, opts.batch_handler_workers);
    spec.handler = handler_kind(if mode == "per_message_tx" {
        HandlerKind::DbWriteTx
    } else {
        HandlerKind::Empty
    });
    let b = match mode {
        "per_message" | "per_message_tx" => {
            worker_on(client.clone(), &spec, &tally, sink.clone(), Outcome::Delete)?
        }
        _ => {
            let b = (3 * ctx.cfg.batch_size as usize).max(2 * opts.batch_handler_max as usize);
            spec.settings.claim_capacity = Some(b);
            builder(client.clone(), &spec)?.transactional_batch_handler(
                opts.batch_handler_max as usize,
                Duration::from_millis(opts.batch_handler_window_ms),
                TxBatchSink(Arc::clone(&tally)),
            )
        }
    };
    let w = b.build()?;
    let before = server_snapshot(ctx).await;
    let d = drain::timed(ctx, w, &tally).await?;
    drop(client);
    drop(sink);
    let server = match before {
        Some(b) => server_counters(ctx, b, tally.distinct()).await,
        None => None,
    };
    let sink_row = ctx
        .admin
        .query_one(
            &format!("SELECT count(*), count(DISTINCT id) FROM {SINK_TABLE}"),
            &[],
        )
        .await?;
    let remaining_after = ctx.finish_queue(&q).await?;
    Ok(BatchHandlerRun {
        round,
        warmup,
        mode: mode.to_owned(),
        workers: opts.batch_handler_workers,
        batch_max: if mode == "batch_tx" { opts.batch_handler_max } else { 1 },
        rate: Rate::new(tally.distinct(), d.elapsed_s),
        ack_drain_s: d.ack_drain_s,
        remaining_after,
        ledger: tally.ledger.report(n),
        sink_rows: sink_row.get(0),
        sink_distinct: sink_row.get(1),
        worker: counters(&d.report.stats),
        server,
        preload_s,
        vacuum_s,
        peak_rss_bytes: d.peak_rss_bytes,
    })
}

/// The database's transactions, WAL bytes and WAL syncs.
type ServerSnapshot = [i64; 3];

const SERVER_SNAPSHOT_SQL: &str = "SELECT \
     (SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database \
      WHERE datname = current_database()), \
     w.wal_bytes::int8, w.wal_sync::int8 FROM pg_stat_wal w";

async fn server_snapshot(ctx: &Ctx) -> Option<ServerSnapshot> {
    let row = ctx.admin.query_opt(SERVER_SNAPSHOT_SQL, &[]).await.ok()??;
    let mut out = [0i64; 3];
    for (i, v) in out.iter_mut().enumerate() {
        *v = row.try_get::<_, i64>(i).ok()?;
    }
    Some(out)
}

/// The counters' growth since `before`, per message of `handled`, once
/// every session of the run ended (a backend reports its statistics when
/// it ends; an idle one may hold them for seconds). The sink's own
/// connections of `--handler db-write` stay open.
async fn server_counters(
    ctx: &Ctx,
    before: ServerSnapshot,
    handled: u64,
) -> Option<BatchHandlerServer> {
    let kept_sink = ctx.sink.as_ref().map_or(0, |s| s.conns.len() as i64);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let row = ctx
            .admin
            .query_one(
                "SELECT count(*) FILTER (WHERE application_name = $1), \
                 count(*) FILTER (WHERE application_name = 'pgmq-bench-handler-sink') \
                 FROM pg_stat_activity",
                &[&APP],
            )
            .await
            .ok()?;
        let (ours, sinks): (i64, i64) = (row.get(0), row.get(1));
        if (ours == 0 && sinks <= kept_sink) || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = server_snapshot(ctx).await?;
    let per = |i: usize| (after[i] - before[i]).max(0) as f64 / handled.max(1) as f64;
    Some(BatchHandlerServer {
        transactions_per_msg: per(0),
        wal_bytes_per_msg: per(1),
        wal_syncs_per_msg: per(2),
    })
}

const DEF_RATE: &str = "The db-write handler draining a preloaded, vacuumed queue: distinct messages \
    handled ÷ seconds from spawning the worker to the end of the handler call that completed the \
    last one (the final acknowledgement drain is verified afterwards, not timed). per_message: a \
    plain handler inserting its row through a sink pool of its own, deletes batched; \
    per_message_tx: the insert and the fenced delete in one transaction per message; batch_tx: \
    a transactional batch handler, the batch's rows in one statement and the fenced deletes of the \
    batch in one transaction per batch.";

const DEF_RATIO: &str = "batch_tx throughput ÷ per_message throughput of the same round (target: \
    at least 0.8).";

const DEF_RATIO_TX: &str = "per_message_tx throughput ÷ per_message throughput of the same round.";

const DEF_TX: &str = "Transactions of the database (pg_stat_database xact_commit + xact_rollback) \
    over the run ÷ messages handled, read once every session of the run ended.";

const DEF_WAL: &str = "WAL bytes of the cluster (pg_stat_wal.wal_bytes) over the run ÷ messages handled.";

const DEF_SYNC: &str = "WAL flushes to disk (pg_stat_wal.wal_sync) over the run ÷ messages handled: \
    each durable commit waits for one; concurrent commits share one.";

/// The figure id of `what` for `mode`.
fn id(mode: &str, what: &str) -> String {
    format!("{NAME}.{mode}.{what}")
}

/// Rates and database counters per mode, and the ratios per round.
fn add_figures(f: &mut Figures, runs: &[BatchHandlerRun]) {
    for mode in MODES {
        let of = || measured(runs, |r| r.warmup).filter(move |r| r.mode == mode);
        f.rate(
            &id(mode, "throughput"),
            NAME,
            &format!("db-write, {mode}"),
            DEF_RATE,
            of().map(|r| (r.round, &r.rate)),
        );
        type Pick = fn(&BatchHandlerServer) -> f64;
        let picks: [(&str, &str, &str, &str, Pick); 3] = [
            (
                "transactions_per_msg",
                "transactions per message",
                "1/msg",
                DEF_TX,
                |s| s.transactions_per_msg,
            ),
            (
                "wal_bytes_per_msg",
                "WAL bytes per message",
                "B/msg",
                DEF_WAL,
                |s| s.wal_bytes_per_msg,
            ),
            (
                "wal_syncs_per_msg",
                "WAL syncs per message",
                "1/msg",
                DEF_SYNC,
                |s| s.wal_syncs_per_msg,
            ),
        ];
        for (what, label, unit, def, pick) in picks {
            f.add(
                id(mode, what),
                NAME,
                format!("{mode}, {label}"),
                unit,
                Better::None,
                def,
                of().filter_map(|r| r.server.as_ref().map(|s| Sample::value(r.round, pick(s))))
                    .collect(),
            );
        }
    }
    for (mode, what, def) in [
        ("batch_tx", "batch_tx_vs_per_message", DEF_RATIO),
        ("per_message_tx", "per_message_tx_vs_per_message", DEF_RATIO_TX),
    ] {
        let key: RunKey<BatchHandlerRun> =
            |r| (r.round, r.warmup, r.mode.as_str(), r.rate.rate_per_s);
        let samples = paired_ratios(runs, key, mode, "per_message");
        f.add(
            format!("{NAME}.{what}"),
            NAME,
            format!("{mode} ÷ per_message"),
            "x",
            Better::Higher,
            def,
            samples,
        );
    }
}

