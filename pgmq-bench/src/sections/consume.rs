//! consume_scaling: the worker runtime draining a preloaded queue, once per
//! handler count.
//!
//! Per run: a fresh queue is loaded with ids `0..--messages` on the server and
//! vacuumed (`VACUUM (ANALYZE)`), so dead tuples from an earlier run never slow
//! `pgmq.read`. Then a worker with the given concurrency (every other setting
//! at its default, batch size and visibility timeout from the command line)
//! drains it; each handler records the body's id in the ledger and, with
//! `--handler-work-ms`, awaits a tokio sleep (simulated I/O).
//!
//! Elapsed runs from just before the worker is spawned to the end of the
//! handler that completed the last new id. The shutdown that follows drains
//! the batched deletes; it is timed separately (`ack_drain_s`) and verified
//! (`remaining_after` must be 0), but it is not inside the throughput interval.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use hdrhistogram::Histogram;
use pgmq_client::Message;
use pgmq_worker::{Outcome, Worker};
use tokio::sync::Notify;

use crate::document::{ConsumeRun, Rate, Runs, SectionRuns};
use crate::error::Result;
use crate::ledger::Ledger;
use crate::sections::{counters, Ctx, InBody, Sink};
use crate::stats::{percentiles_us_to_ms, us_histogram};
use std::fmt::Write as _;

use futures::future::BoxFuture;

use crate::checks::{run_tag, Checks};
use crate::document::{Document, Sections};
use crate::figures::{measured, Figures};
use crate::report::fmt_value;
use crate::report::{cell, definitions, fig, worker_counts};
use crate::sections::baseline::{self, neighbour, Loop};
use crate::sections::{Round, Section};
use crate::config::Config;
use crate::sections::plan::{self, Plan};

/// The section's runs in the document.
pub(crate) const RUNS: Runs<ConsumeRun> = Runs::new("consume_scaling");

/// What every handler call shares.
#[derive(Debug)]
pub(crate) struct Tally {
    pub(crate) ledger: Ledger,
    /// Distinct ids handled.
    pub(crate) distinct: AtomicU64,
    /// Distinct ids after which the run is complete (u64::MAX: open-ended).
    pub(crate) target: AtomicU64,
    /// When the handler completing the target finished.
    pub(crate) completed_at: OnceLock<Instant>,
    pub(crate) done: Notify,
    pub(crate) work: Duration,
    /// When the tally was made.
    pub(crate) base: Instant,
    /// Nanoseconds from `base` to the end of the latest handler call.
    pub(crate) last_done_ns: AtomicU64,
    /// When set (sustained): each handler call's queue wait.
    pub(crate) waits: Option<QueueWaits>,
}

/// Queue wait of each handler call: the message's `enqueued_at` (database
/// clock) to the handler's start (this host's clock, moved onto the
/// database's by `offset`), microseconds, for the caller to take per interval.
#[derive(Debug)]
pub(crate) struct QueueWaits {
    /// Database clock minus this host's clock, microseconds.
    offset_us: i64,
    hist: Mutex<Histogram<u64>>,
}

impl QueueWaits {
    pub(crate) fn new(offset_us: i64) -> QueueWaits {
        QueueWaits {
            offset_us,
            hist: Mutex::new(us_histogram()),
        }
    }

    fn record(&self, enqueued_at: DateTime<Utc>) {
        let waited = (Utc::now() - enqueued_at)
            .num_microseconds()
            .unwrap_or(i64::MAX)
            + self.offset_us;
        let mut h = self.hist.lock().unwrap_or_else(|p| p.into_inner());
        h.saturating_record(waited.max(0) as u64);
    }

    /// The waits recorded since the last call, and a fresh start.
    pub(crate) fn take(&self) -> Histogram<u64> {
        let mut h = self.hist.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut *h, us_histogram())
    }
}

impl Tally {
    pub(crate) fn new(target: u64, work: Duration) -> Arc<Tally> {
        Arc::new(Tally {
            ledger: Ledger::new(),
            distinct: AtomicU64::new(0),
            target: AtomicU64::new(target),
            completed_at: OnceLock::new(),
            done: Notify::new(),
            work,
            base: Instant::now(),
            last_done_ns: AtomicU64::new(0),
            waits: None,
        })
    }

    /// A tally that also records each handler call's queue wait.
    pub(crate) fn with_waits(target: u64, work: Duration, waits: QueueWaits) -> Arc<Tally> {
        let mut t = Arc::into_inner(Tally::new(target, work)).expect("not shared yet");
        t.waits = Some(waits);
        Arc::new(t)
    }

    /// Called first in each handler call.
    pub(crate) fn started(&self, enqueued_at: DateTime<Utc>) {
        if let Some(w) = &self.waits {
            w.record(enqueued_at);
        }
    }

    /// The handler body: simulated work, then the ledger.
    pub(crate) async fn handle(&self, id: u64) {
        if !self.work.is_zero() {
            tokio::time::sleep(self.work).await;
        }
        if self.ledger.mark(id) {
            let d = self.distinct.fetch_add(1, Ordering::AcqRel) + 1;
            self.check(d);
        }
        let ns = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_done_ns.fetch_max(ns, Ordering::AcqRel);
    }

    /// Marks completion once `distinct` reaches the target.
    pub(crate) fn check(&self, distinct: u64) {
        if distinct >= self.target.load(Ordering::Acquire)
            && self.completed_at.set(Instant::now()).is_ok()
        {
            self.done.notify_one();
        }
    }

    pub(crate) fn distinct(&self) -> u64 {
        self.distinct.load(Ordering::Acquire)
    }

    /// Waits until the target is reached, or no new id arrives for `stall`.
    /// Returns false on a stall.
    pub(crate) async fn wait(&self, stall: Duration) -> bool {
        let mut last = self.distinct();
        let mut last_change = Instant::now();
        loop {
            if self.completed_at.get().is_some() {
                return true;
            }
            tokio::select! {
                () = self.done.notified() => {}
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
            let now = self.distinct();
            if now != last {
                last = now;
                last_change = Instant::now();
            } else if last_change.elapsed() >= stall {
                return self.completed_at.get().is_some();
            }
        }
    }
}

/// A worker whose handlers feed `tally`, reading as `--claim-reads` says.
pub(crate) fn worker(
    ctx: &Ctx,
    q: &pgmq_client::QueueName,
    concurrency: u32,
    tally: &Arc<Tally>,
) -> pgmq_worker::WorkerBuilder<InBody> {
    let b = worker_on(
        ctx.client.clone(),
        q,
        concurrency,
        ctx.cfg.batch_size,
        ctx.cfg.vt,
        tally,
        ctx.sink.clone(),
        ctx.cfg.handler == crate::document::HandlerKind::DbWriteTx,
    );
    with_claim_reads(b, ctx.cfg.claim_reads)
}

/// `b` reading as `--claim-reads` says (unchanged when it was not given:
/// the worker's default).
pub(crate) fn with_claim_reads<T: serde::de::DeserializeOwned + Send + 'static>(
    b: pgmq_worker::WorkerBuilder<T>,
    how: Option<crate::document::ClaimReadsArg>,
) -> pgmq_worker::WorkerBuilder<T> {
    match how {
        Some(how) => b.claim_reads(how.into()),
        None => b,
    }
}

/// A worker whose handlers write to `sink` (when given), then feed `tally`;
/// with `transactional`, whose handlers insert into the sink table in the
/// worker's transaction that also deletes the message.
#[allow(clippy::too_many_arguments)]
pub(crate) fn worker_on(
    client: pgmq_client::Client,
    q: &pgmq_client::QueueName,
    concurrency: u32,
    batch_size: u32,
    vt: Duration,
    tally: &Arc<Tally>,
    sink: Option<Arc<Sink>>,
    transactional: bool,
) -> pgmq_worker::WorkerBuilder<InBody> {
    let t = tally.clone();
    let b = Worker::<InBody>::builder(client, q.clone())
        .concurrency(concurrency as usize)
        .batch_size(batch_size as usize)
        .visibility_timeout(vt);
    if transactional {
        return b.transactional_handler(TxSink(t));
    }
    b.handler(move |msg: Message<InBody>| {
        let t = t.clone();
        let sink = sink.clone();
        async move {
            t.started(msg.enqueued_at);
            if let Some(s) = &sink {
                s.write(msg.body.id).await?;
            }
            t.handle(msg.body.id).await;
            Ok(Outcome::Delete)
        }
    })
}

/// `--handler db-write-tx`: the sink insert in the worker's transaction.
struct TxSink(Arc<Tally>);

impl pgmq_worker::TransactionalHandler<InBody> for TxSink {
    async fn handle(
        &self,
        msg: Message<InBody>,
        tx: &pgmq_client::Transaction<'_>,
        _ctx: pgmq_worker::Context,
    ) -> std::result::Result<Outcome, pgmq_worker::HandlerError> {
        // Unprepared with its type given: one round trip, as the db-write
        // sink's prepared insert.
        self.0.started(msg.enqueued_at);
        let id = msg.body.id as i64;
        tx.query_typed(TX_INSERT, &[(&id, tokio_postgres::types::Type::INT8)])
            .await?;
        self.0.handle(msg.body.id).await;
        Ok(Outcome::Delete)
    }
}

/// The insert of `--handler db-write-tx`, into [`SINK_TABLE`](crate::sections::SINK_TABLE).
const TX_INSERT: &str = "INSERT INTO pgmq_bench_handler_sink (id) VALUES ($1)";

/// One run at `workers` handlers.
pub async fn run(ctx: &Ctx, workers: u32, round: u32, warmup: bool) -> Result<ConsumeRun> {
    drain(ctx, "consume", ctx.cfg.messages, workers, round, warmup).await
}

/// A worker with `workers` handlers draining a fresh, vacuumed queue of `n`
/// messages (queue `pgmq_bench_<suffix>`).
pub async fn drain(
    ctx: &Ctx,
    suffix: &str,
    n: u64,
    workers: u32,
    round: u32,
    warmup: bool,
) -> Result<ConsumeRun> {
    let (q, preload_s, vacuum_s) = ctx.fresh_loaded(suffix, n).await?;
    let tally = Tally::new(n, ctx.cfg.handler_work);
    let w = worker(ctx, &q, workers, &tally).build()?;
    ctx.meter.begin();
    let start = Instant::now();
    let handle = w.spawn();
    tally.wait(ctx.cfg.stall_timeout).await;
    let completed = tally.completed_at.get().copied();
    let report = handle.shutdown().await?;
    let shut = Instant::now();
    let peak = ctx.meter.end();
    let end = completed.unwrap_or(shut);
    let elapsed = end.duration_since(start).as_secs_f64();
    let stats = &report.stats;
    let remaining_after = ctx.finish_queue(&q).await?;
    Ok(ConsumeRun {
        round,
        warmup,
        workers,
        rate: Rate::new(tally.distinct(), elapsed),
        handler_work_ms: ctx.cfg.handler_work.as_millis() as u64,
        handler_ms: percentiles_us_to_ms(&stats.handler_latency),
        queue_wait_db_ms: percentiles_us_to_ms(&stats.queue_wait_db),
        queue_wait_local_ms: percentiles_us_to_ms(&stats.queue_wait_local),
        ack_drain_s: shut.duration_since(end).as_secs_f64(),
        remaining_after,
        ledger: tally.ledger.report(n),
        worker: counters(stats),
        preload_s,
        vacuum_s,
        peak_rss_bytes: peak,
        handler: Some(ctx.cfg.handler.name().to_owned()),
    })
}

/// The consume_scaling section: the worker draining a preloaded queue at
/// each `--workers` handler count, each run between two consume loops.
pub(crate) struct ConsumeScaling;

impl Section for ConsumeScaling {
    fn runs(&self) -> &dyn SectionRuns {
        &RUNS
    }

    fn about(&self) -> &'static str {
        "The worker draining a preloaded queue at each handler count"
    }

    fn planned(&self, cfg: &Config) -> Plan {
        let (n, w) = (cfg.messages, cfg.workers.len() as f64);
        // Around the worker runs: a consume loop before each and after the
        // last, the equal-layout loop before the first and after the last.
        let loops = (w + 1.0) * plan::drain(n, plan::LOOP_DRAIN) + 2.0 * plan::drain(n, plan::DRAIN);
        Plan::work(w * plan::drain(n, plan::DRAIN) + plan::loops_around(cfg, 1) * loops)
    }

    fn in_warmup(&self) -> bool {
        true
    }

    fn run_round<'a>(
        &'a self,
        ctx: &'a Arc<Ctx>,
        at: Round<'a>,
        s: &'a mut Sections,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(one_round(ctx, at, s))
    }

    fn check(&self, s: &Sections, out: &mut Checks) {
        for r in &RUNS.list(s) {
            let tag = format!(
                "consume_scaling w={} {}",
                r.workers,
                run_tag(r.round, r.warmup)
            );
            out.drained(&tag, r.rate.elapsed_s, &r.ledger, r.remaining_after);
            out.counters(&tag, &r.worker);
        }
    }

    fn figures(&self, s: &Sections, f: &mut Figures) {
        add_figures(f, s, &consume_counts(s));
    }

    fn peaks(&self, s: &Sections) -> Vec<(u32, bool, u64)> {
        RUNS.list(s)
            .iter()
            .map(|r| (r.round, r.warmup, r.peak_rss_bytes))
            .collect()
    }

    fn report(&self, d: &Document, out: &mut String) {
        report_part(out, d);
    }
}

/// One round of consume_scaling: the worker at each handler count, each
/// between two consume loops.
async fn one_round(ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
    let tag = at.tag;
    let p = &ctx.progress;
    // A consume loop before each worker run and one after the last: every
    // worker run sits between two loops, and its ratio's reference is their
    // mean. The equal-layout loop once before the first worker run and once
    // after the last: the reference of `vs_equal_layout` is the mean of the
    // two.
    neighbour(ctx, Loop::ConsumeEqualLayout, at, s).await?;
    let mut before: Option<u32> = None;
    for w in &ctx.cfg.workers {
        if let Some(i) = neighbour(ctx, Loop::Consume, at, s).await? {
            baseline::RUNS.update(s, |runs| {
                runs[i].paired_workers = Some(*w);
                runs[i].follows_workers = before;
            })?;
        }
        before = Some(*w);
        let r = run(ctx, *w, at.index, at.warm).await?;
        p.say(format!(
            "{tag} consume_scaling w={w}: {:.0} msg/s, handler p99 {:.3} ms",
            r.rate.rate_per_s, r.handler_ms.p99
        ));
        RUNS.record(s, &r)?;
    }
    if let Some(w) = before {
        if let Some(i) = neighbour(ctx, Loop::Consume, at, s).await? {
            baseline::RUNS.update(s, |runs| runs[i].follows_workers = Some(w))?;
        }
    }
    neighbour(ctx, Loop::ConsumeEqualLayout, at, s).await?;
    Ok(())
}

const DEF_THROUGHPUT: &str = "Worker runtime draining a preloaded, vacuumed queue with N handlers: distinct \
    messages handled divided by the seconds from spawning the worker to the end of the handler that completed \
    the last one. The final acknowledgement drain is verified afterwards and not included.";

const DEF_HANDLER: &str =
    "Handler duration from the worker's histogram: handler start to handler end, \
    acknowledgement excluded (microsecond histogram, two significant digits).";

const DEF_WAIT_DB: &str =
    "Queue wait, database segment: enqueued_at to last_read_at of each claimed message, \
    both stamped by the database clock (no host/database clock skew).";

const DEF_WAIT_LOCAL: &str =
    "Queue wait, local segment: claim registered in the worker to handler start, \
    on the monotonic clock. The reply's transit between the two segments is in neither.";

/// The handler counts of consume_scaling, ascending.
pub(crate) fn consume_counts(s: &Sections) -> Vec<u32> {
    let mut worker_counts: Vec<u32> = RUNS.list(s).iter().map(|r| r.workers).collect();
    worker_counts.sort_unstable();
    worker_counts.dedup();
    worker_counts
}

/// consume_scaling: throughput and latency percentiles per handler count.
fn add_figures(f: &mut Figures, s: &Sections, worker_counts: &[u32]) {
    for w in worker_counts {
        let all = RUNS.list(s);
        let runs = || measured(&all, |r| r.warmup).filter(move |r| r.workers == *w);
        let p = format!("consume_scaling.w{w}");
        f.rate(
            &format!("{p}.throughput"),
            "consume_scaling",
            &format!("Worker throughput, {w} handlers"),
            DEF_THROUGHPUT,
            runs().map(|r| (r.round, &r.rate)),
        );
        f.percentiles(
            &format!("{p}.handler"),
            "consume_scaling",
            &format!("Handler duration, {w} handlers,"),
            DEF_HANDLER,
            runs().map(|r| (r.round, &r.handler_ms)),
        );
        f.percentiles(
            &format!("{p}.queue_wait_db"),
            "consume_scaling",
            &format!("Queue wait (database), {w} handlers,"),
            DEF_WAIT_DB,
            runs().map(|r| (r.round, &r.queue_wait_db_ms)),
        );
        f.percentiles(
            &format!("{p}.queue_wait_local"),
            "consume_scaling",
            &format!("Queue wait (local), {w} handlers,"),
            DEF_WAIT_LOCAL,
            runs().map(|r| (r.round, &r.queue_wait_local_ms)),
        );
    }
}

/// consume_scaling: throughput, its ratio to the baseline loop and the
/// latency percentiles per handler count.
fn report_part(out: &mut String, d: &Document) {
    let counts = worker_counts(d);
    if counts.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "## Worker scaling (consume_scaling)\n\n\
         | Handlers | Throughput (msg/s) | vs baseline | Handler p50 / p95 / p99 / max (ms) | \
         Queue wait, database p50 / p95 / p99 / max (ms) | Queue wait, local p50 / p95 / p99 / max (ms) |\n\
         | --- | --- | --- | --- | --- | --- |"
    );
    let mut ids = Vec::new();
    for w in &counts {
        let p = format!("consume_scaling.w{w}");
        let pct = |what: &str| {
            ["p50", "p95", "p99", "max"]
                .iter()
                .map(|q| {
                    fig(d, &format!("{p}.{what}.{q}_ms"))
                        .map(|f| fmt_value(f.median, "ms"))
                        .unwrap_or_else(|| "–".into())
                })
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let _ = writeln!(
            out,
            "| {w} | {} | {} | {} | {} | {} |",
            cell(d, &format!("{p}.throughput")),
            cell(d, &format!("{p}.vs_baseline")),
            pct("handler"),
            pct("queue_wait_db"),
            pct("queue_wait_local")
        );
        ids.extend([
            format!("{p}.throughput"),
            format!("{p}.vs_baseline"),
            format!("{p}.handler.p50_ms"),
            format!("{p}.queue_wait_db.p50_ms"),
            format!("{p}.queue_wait_local.p50_ms"),
        ]);
    }
    let _ = writeln!(
        out,
        "\nBaseline read + delete on one connection: {} msg/s. Latency columns show medians over rounds.\n",
        cell(d, "baseline.consume.rate")
    );
    ids.push("baseline.consume.rate".into());
    definitions(out, d, &ids);
}
