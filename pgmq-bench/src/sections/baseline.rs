//! baseline: the same loops with no SDK — plain tokio-postgres prepared
//! statements on one dedicated connection, one statement in flight, the same
//! bodies, batch size, queue state and accounting.
//!
//! - `send_single`: `SELECT * FROM pgmq.send($1, $2)` per message.
//! - `send_batch`: `SELECT * FROM pgmq.send_batch($1, $2::jsonb[])` per batch.
//! - `consume`: `SELECT * FROM pgmq.read($1, $2, $3)` then
//!   `SELECT * FROM pgmq.delete($1, $2::bigint[])` per batch, on a fresh
//!   preloaded and vacuumed queue; every body's id goes into a ledger. Timed
//!   from the first read to the last delete's reply.
//!
//! - `consume_equal_layout`: the worker's connection layout on plain
//!   tokio-postgres: two claim connections each looping
//!   `pgmq.read($1, $2, $3)` (batch `--batch-size`) and handing the ids to one
//!   delete connection, which deletes whatever has arrived in one
//!   `pgmq.delete($1, $2::bigint[])` at a time (while one delete is in
//!   flight the next batch gathers). Same preload, ledger and timing as
//!   `consume`; `worker / equal-layout` is then the SDK's own overhead at the
//!   same parallelism.
//!
//! Each SDK figure is divided by its loop's figure of the same round: the
//! ratio is the SDK's overhead (below 1) or gain (above 1), and unlike the
//! absolute rates it carries across machines.

use std::time::Instant;

use tokio_postgres::types::Json;

use crate::document::{BaselineRun, Rate, Runs, SectionRuns};
use crate::error::Result;
use crate::ledger::Ledger;
use crate::sections::{id_batches, Ctx, InBody};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::checks::{run_tag, Checks};
use crate::config::Config;
use crate::document::{Better, Document, Sample, Sections};
use crate::figures::{measured, Figures};
use crate::report::{cell, definitions, fig, worker_counts};
use crate::sections::consume::{self, consume_counts, ConsumeScaling};
use crate::sections::send::{self, SendBatch, SendSingle};
use crate::sections::{Round, Section};
use crate::sections::plan::{self, Plan};

/// The section's runs in the document.
pub(crate) const RUNS: Runs<BaselineRun> = Runs::new("baseline");

/// Which loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loop {
    /// One send per message.
    SendSingle,
    /// One send_batch per batch.
    SendBatch,
    /// read + delete per batch.
    Consume,
    /// The worker's connection layout without the SDK: two claim
    /// connections reading batches, one delete connection deleting them.
    ConsumeEqualLayout,
}

impl Loop {
    /// The `kind` in the document.
    pub fn name(self) -> &'static str {
        match self {
            Loop::SendSingle => "send_single",
            Loop::SendBatch => "send_batch",
            Loop::Consume => "consume",
            Loop::ConsumeEqualLayout => "consume_equal_layout",
        }
    }
}

async fn connect(ctx: &Ctx) -> Result<tokio_postgres::Client> {
    let (pg, _notifications) = ctx
        .target
        .builder()
        .application_name("pgmq-bench-baseline")
        .connect_dedicated()
        .await?;
    Ok(pg)
}

/// What one loop measured, before the queue is released.
struct Measured {
    q: pgmq_client::QueueName,
    count: u64,
    elapsed: f64,
    peak: u64,
    preload_s: f64,
    vacuum_s: f64,
    ledger: Option<crate::document::LedgerReport>,
}

impl Measured {
    /// A consume loop's measurement: `ledger` against the `n` preloaded
    /// messages, with the seconds the preload and its vacuum took.
    fn drained(
        q: pgmq_client::QueueName,
        ledger: &Ledger,
        n: u64,
        elapsed: f64,
        peak: u64,
        (preload_s, vacuum_s): (f64, f64),
    ) -> Self {
        Measured {
            q,
            count: ledger.handled(),
            elapsed,
            peak,
            preload_s,
            vacuum_s,
            ledger: Some(ledger.report(n)),
        }
    }

    /// A send loop's measurement: no preload, no ledger.
    fn sent(q: pgmq_client::QueueName, count: u64, elapsed: f64, peak: u64) -> Self {
        Measured {
            q,
            count,
            elapsed,
            peak,
            preload_s: 0.0,
            vacuum_s: 0.0,
            ledger: None,
        }
    }
}

/// One run of one loop.
pub async fn run(ctx: &Ctx, which: Loop, round: u32, warmup: bool) -> Result<BaselineRun> {
    let pg = connect(ctx).await?;
    let batch = ctx.cfg.batch_size;
    let m = match which {
        Loop::SendSingle => send_single(ctx, &pg).await?,
        Loop::SendBatch => send_batch(ctx, &pg).await?,
        Loop::ConsumeEqualLayout => consume_equal_layout(ctx).await?,
        Loop::Consume => consume(ctx, &pg).await?,
    };
    let in_queue_after = ctx.finish_queue(&m.q).await?;
    Ok(BaselineRun {
        round,
        warmup,
        kind: which.name().to_owned(),
        rate: Rate::new(m.count, m.elapsed),
        batch_size: if which == Loop::SendSingle { 1 } else { batch },
        ledger: m.ledger,
        in_queue_after,
        preload_s: m.preload_s,
        vacuum_s: m.vacuum_s,
        peak_rss_bytes: m.peak,
        paired_workers: None,
        follows_workers: None,
    })
}

/// `pgmq.send` per message.
async fn send_single(ctx: &Ctx, pg: &tokio_postgres::Client) -> Result<Measured> {
    let q = ctx.guard.fresh("baseline_send_single").await?;
    let stmt = pg
        .prepare("SELECT * FROM pgmq.send($1::text, $2::jsonb)")
        .await?;
    let n = ctx.cfg.single_messages;
    ctx.meter.begin();
    let t = Instant::now();
    for id in 0..n {
        pg.query(&stmt, &[&q.as_str(), &Json(ctx.body(id))]).await?;
    }
    let elapsed = t.elapsed().as_secs_f64();
    Ok(Measured::sent(q, n, elapsed, ctx.meter.end()))
}

/// `pgmq.send_batch` per batch of `--batch-size`.
async fn send_batch(ctx: &Ctx, pg: &tokio_postgres::Client) -> Result<Measured> {
    let q = ctx.guard.fresh("baseline_send_batch").await?;
    let stmt = pg
        .prepare("SELECT * FROM pgmq.send_batch($1::text, $2::jsonb[])")
        .await?;
    let n = ctx.cfg.batch_messages;
    let size = u64::from(ctx.cfg.batch_size);
    let mut bodies = Vec::with_capacity(size as usize);
    ctx.meter.begin();
    let t = Instant::now();
    for ids in id_batches(n, size) {
        bodies.clear();
        bodies.extend(ids.map(|i| Json(ctx.body(i))));
        pg.query(&stmt, &[&q.as_str(), &bodies]).await?;
    }
    let elapsed = t.elapsed().as_secs_f64();
    Ok(Measured::sent(q, n, elapsed, ctx.meter.end()))
}

/// The worker's connection layout on a fresh preloaded queue.
async fn consume_equal_layout(ctx: &Ctx) -> Result<Measured> {
    let n = ctx.cfg.messages;
    let (q, preload_s, vacuum_s) = ctx.fresh_loaded("baseline_equal_layout", n).await?;
    ctx.meter.begin();
    let (ledger, elapsed) = equal_layout(ctx, &q, n).await?;
    let peak = ctx.meter.end();
    Ok(Measured::drained(
        q,
        &ledger,
        n,
        elapsed,
        peak,
        (preload_s, vacuum_s),
    ))
}

/// `pgmq.read` then `pgmq.delete` per batch on one connection, on a fresh
/// preloaded queue.
async fn consume(ctx: &Ctx, pg: &tokio_postgres::Client) -> Result<Measured> {
    let n = ctx.cfg.messages;
    let batch = ctx.cfg.batch_size;
    let (q, preload_s, vacuum_s) = ctx.fresh_loaded("baseline_consume", n).await?;
    let read = pg
        .prepare("SELECT * FROM pgmq.read($1::text, $2::integer, $3::integer)")
        .await?;
    let delete = pg
        .prepare("SELECT * FROM pgmq.delete($1::text, $2::bigint[])")
        .await?;
    let vt = i32::try_from(ctx.cfg.vt.as_secs()).unwrap_or(i32::MAX);
    let qty = batch as i32;
    let ledger = Ledger::new();
    let mut ids: Vec<i64> = Vec::with_capacity(batch as usize);
    ctx.meter.begin();
    let t = Instant::now();
    while ledger.handled() < n {
        let rows = pg.query(&read, &[&q.as_str(), &vt, &qty]).await?;
        if rows.is_empty() {
            // Nothing visible although messages are unaccounted for:
            // the ledger reports them as missing.
            break;
        }
        ids.clear();
        for row in &rows {
            ids.push(row.try_get("msg_id")?);
            let Json(body): Json<InBody> = row.try_get("message")?;
            ledger.mark(body.id);
        }
        pg.query(&delete, &[&q.as_str(), &ids]).await?;
    }
    let elapsed = t.elapsed().as_secs_f64();
    let peak = ctx.meter.end();
    Ok(Measured::drained(
        q,
        &ledger,
        n,
        elapsed,
        peak,
        (preload_s, vacuum_s),
    ))
}

/// The equal-layout loop: two claimers, one deleter; returns the ledger and
/// the seconds from the first read to the last delete's reply.
async fn equal_layout(
    ctx: &Ctx,
    q: &pgmq_client::QueueName,
    n: u64,
) -> Result<(std::sync::Arc<Ledger>, f64)> {
    use std::sync::Arc;
    let ledger = Arc::new(Ledger::new());
    let vt = i32::try_from(ctx.cfg.vt.as_secs()).unwrap_or(i32::MAX);
    let qty = ctx.cfg.batch_size as i32;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<i64>>();
    let mut claimers = Vec::new();
    let mut conns = Vec::new();
    for _ in 0..2 {
        let pg = connect(ctx).await?;
        let read = pg
            .prepare("SELECT * FROM pgmq.read($1::text, $2::integer, $3::integer)")
            .await?;
        conns.push((pg, read));
    }
    let del = connect(ctx).await?;
    let delete = del
        .prepare("SELECT * FROM pgmq.delete($1::text, $2::bigint[])")
        .await?;
    let t = Instant::now();
    for (pg, read) in conns {
        let claimer = Claimer {
            pg,
            read,
            queue: q.as_str().to_owned(),
            vt,
            qty,
            n,
            stall: ctx.cfg.stall_timeout,
        };
        claimers.push(tokio::spawn(claimer.run(ledger.clone(), tx.clone())));
    }
    drop(tx);
    let mut deleted = 0u64;
    let mut batch: Vec<i64> = Vec::new();
    while let Some(first) = rx.recv().await {
        batch.clear();
        batch.extend(first);
        while let Ok(more) = rx.try_recv() {
            batch.extend(more);
        }
        del.query(&delete, &[&q.as_str(), &batch]).await?;
        deleted += batch.len() as u64;
        if deleted >= n {
            break;
        }
    }
    let elapsed = t.elapsed().as_secs_f64();
    for c in claimers {
        match c.await {
            Ok(r) => r?,
            Err(e) => {
                return Err(crate::error::Error::Config(format!(
                    "a claimer task failed: {e}"
                )))
            }
        }
    }
    Ok((ledger, elapsed))
}

/// One claim connection of the equal-layout loop.
struct Claimer {
    pg: tokio_postgres::Client,
    read: tokio_postgres::Statement,
    queue: String,
    vt: i32,
    qty: i32,
    /// Messages in the queue: the loop ends once the ledger has them all.
    n: u64,
    /// How long empty reads may go on before the loop gives up.
    stall: std::time::Duration,
}

impl Claimer {
    /// Reads batches back to back, marks each body in the ledger and hands
    /// the ids to the delete connection.
    async fn run(
        self,
        ledger: std::sync::Arc<Ledger>,
        tx: tokio::sync::mpsc::UnboundedSender<Vec<i64>>,
    ) -> std::result::Result<(), tokio_postgres::Error> {
        let mut last_rows = Instant::now();
        while ledger.handled() < self.n {
            let rows = self
                .pg
                .query(&self.read, &[&self.queue, &self.vt, &self.qty])
                .await?;
            if rows.is_empty() {
                if last_rows.elapsed() >= self.stall {
                    // Messages unaccounted for and none visible: the
                    // ledger reports them as missing.
                    break;
                }
                // Everything is claimed (by the other claimer, or all
                // handled): look again shortly, as a polling worker would.
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                continue;
            }
            last_rows = Instant::now();
            let mut ids = Vec::with_capacity(rows.len());
            for row in &rows {
                ids.push(row.try_get::<_, i64>("msg_id")?);
                let Json(body): Json<InBody> = row.try_get("message")?;
                ledger.mark(body.id);
            }
            if tx.send(ids).is_err() {
                break;
            }
        }
        Ok(())
    }
}

/// The baseline section: the loops on plain prepared statements. Beside an
/// SDK section its loop runs next to each SDK run (see [`neighbour`]);
/// alone, a round runs every loop once.
pub(crate) struct Baseline;

impl Section for Baseline {
    fn runs(&self) -> &dyn SectionRuns {
        &RUNS
    }

    fn about(&self) -> &'static str {
        "The same loops on plain prepared statements, one connection, no SDK"
    }

    fn planned(&self, cfg: &Config) -> Plan {
        // Beside an SDK section its runs are that section's; alone, a round
        // runs each loop once.
        if baseline_loops(cfg).is_empty() {
            return Plan::default();
        }
        Plan::work(
            plan::SETUP * 2.0
                + cfg.single_messages as f64 / plan::SINGLE_SENDS
                + cfg.batch_messages as f64 / plan::BATCH_SENDS
                + plan::drain(cfg.messages, plan::LOOP_DRAIN)
                + plan::drain(cfg.messages, plan::DRAIN),
        )
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
        Box::pin(async move {
            for l in baseline_loops(&ctx.cfg) {
                baseline_once(ctx, l, at, s).await?;
            }
            Ok(())
        })
    }

    /// Short runs; a consuming loop's ledger and empty queue, a sending
    /// loop's messages all in the queue.
    fn check(&self, s: &Sections, out: &mut Checks) {
        for r in &RUNS.list(s) {
            let tag = format!("baseline {} {}", r.kind, run_tag(r.round, r.warmup));
            out.short_run(&tag, r.rate.elapsed_s);
            if let Some(l) = &r.ledger {
                if l.missing > 0 {
                    out.fail(format!("{tag}: {} messages never handled", l.missing));
                }
                out.ledger(&tag, l);
                if r.in_queue_after != 0 {
                    out.fail(format!(
                        "{tag}: {} messages left in the queue",
                        r.in_queue_after
                    ));
                }
            } else if r.in_queue_after != r.rate.count as i64 {
                out.fail(format!(
                    "{tag}: sent {} but the queue holds {}",
                    r.rate.count, r.in_queue_after
                ));
            }
        }
    }

    /// The loops' rates, then the SDK sections' ratios to them.
    fn figures(&self, s: &Sections, f: &mut Figures) {
        baselines(f, s);
        ratios(f, s, &consume_counts(s));
    }

    fn peaks(&self, s: &Sections) -> Vec<(u32, bool, u64)> {
        RUNS.list(s)
            .iter()
            .map(|r| (r.round, r.warmup, r.peak_rss_bytes))
            .collect()
    }

    /// The worker against the equal-layout loop (the loops' other figures
    /// are in the send and consume tables).
    fn report(&self, d: &Document, out: &mut String) {
        equal_layout_table(out, d);
    }
}

/// The baseline loops the `baseline` slot of a round runs: all three when
/// only `baseline` is selected. Beside an SDK section, its loop runs next to
/// it instead (see [`neighbour`]).
fn baseline_loops(cfg: &Config) -> Vec<Loop> {
    let sdk = [SendSingle.name(), SendBatch.name(), ConsumeScaling.name()];
    if sdk.iter().any(|s| cfg.has(s)) {
        Vec::new()
    } else {
        vec![
            Loop::SendSingle,
            Loop::SendBatch,
            Loop::Consume,
            Loop::ConsumeEqualLayout,
        ]
    }
}

/// A baseline run made next to the SDK run it is a reference of (one just
/// before it and one just after, the ratio taking their mean): on a shared
/// host the load moves within seconds, and a loop run a minute apart would
/// put that movement into the ratio.
pub(crate) async fn neighbour(
    ctx: &Ctx,
    which: Loop,
    at: Round<'_>,
    s: &mut Sections,
) -> Result<Option<usize>> {
    if !ctx.cfg.has(Baseline.name()) {
        return Ok(None);
    }
    baseline_once(ctx, which, at, s).await.map(Some)
}

/// One run of a baseline loop, recorded; its index in `RUNS.list(s)`.
async fn baseline_once(ctx: &Ctx, which: Loop, at: Round<'_>, s: &mut Sections) -> Result<usize> {
    let tag = at.tag;
    let r = run(ctx, which, at.index, at.warm).await?;
    ctx.progress.say(format!(
        "{tag} baseline {}: {:.0} msg/s",
        r.kind, r.rate.rate_per_s
    ));
    RUNS.record(s, &r)?;
    Ok(RUNS.of(s)?.len() - 1)
}

const DEF_RATIO: &str =
    "SDK figure divided by the baseline loop's figure (plain prepared statements on one \
    connection, no SDK) of the same round: the mean of the loop runs made just before and just after \
    the SDK run when both sections run (for the worker, those around that worker run): \
    above 1 the SDK is faster than the hand-written loop.";

const DEF_BASE_SINGLE: &str =
    "No SDK: SELECT * FROM pgmq.send($1, $2) prepared once, one connection, one \
    call at a time: messages divided by the seconds from the first call to the last reply.";

const DEF_BASE_BATCH: &str =
    "No SDK: SELECT * FROM pgmq.send_batch($1, $2::jsonb[]) prepared once, one \
    connection, one call at a time.";

const DEF_BASE_CONSUME: &str = "No SDK: pgmq.read($1, $2, $3) then pgmq.delete($1, $2::bigint[]) per batch, \
    prepared once, one connection, on a preloaded, vacuumed queue of the same size: messages divided by the \
    seconds from the first read to the last delete's reply. Run beside consume_scaling, once before each \
    worker run; a round's figure is then all its runs' messages over all their seconds.";

const DEF_BASE_EQUAL: &str = "No SDK, the worker's connection layout: two connections each looping \
    pgmq.read($1, $2, $3) of --batch-size and handing the ids to a third that deletes whatever has arrived with \
    one pgmq.delete($1, $2::bigint[]) at a time; plain tokio-postgres prepared statements, a preloaded, vacuumed \
    queue of the same size: messages divided by the seconds from the first read to the last delete's reply. \
    Run once before the first worker run of a round and once after the last.";

const DEF_RATIO_EQUAL: &str = "Worker throughput divided by the mean of the round's equal-layout loop runs \
    (same connections: two claiming, one deleting; no SDK): the SDK's own overhead at equal parallelism, \
    below 1 a cost, above 1 a gain.";

/// The measured baseline runs of one loop.
fn baseline_runs(s: &Sections, kind: &'static str) -> Vec<BaselineRun> {
    measured(&RUNS.list(s), |r| r.warmup)
        .filter(|r| r.kind == kind)
        .cloned()
        .collect()
}

/// The baseline loops: one rate per loop and round.
fn baselines(f: &mut Figures, s: &Sections) {
    let base = |kind: &'static str| baseline_runs(s, kind);
    // One value per round: a round with several runs of a loop (the
    // consume loop beside each worker run) counts their messages over their
    // seconds together.
    for (kind, label, def) in [
        ("send_single", "Baseline single send", DEF_BASE_SINGLE),
        ("send_batch", "Baseline batch send", DEF_BASE_BATCH),
        ("consume", "Baseline read + delete", DEF_BASE_CONSUME),
        (
            "consume_equal_layout",
            "Equal-layout read + delete (2 claim, 1 delete connection)",
            DEF_BASE_EQUAL,
        ),
    ] {
        let mut per_round: BTreeMap<u32, (u64, f64)> = BTreeMap::new();
        for r in base(kind) {
            let e = per_round.entry(r.round).or_default();
            e.0 += r.rate.count;
            e.1 += r.rate.elapsed_s;
        }
        let rates: Vec<(u32, Rate)> = per_round
            .into_iter()
            .map(|(round, (count, secs))| (round, Rate::new(count, secs)))
            .collect();
        f.rate(
            &format!("baseline.{kind}.rate"),
            "baseline",
            label,
            def,
            rates.iter().map(|(round, rate)| (*round, rate)),
        );
    }
}

/// Every SDK figure over its reference loop: sends, and the worker per
/// handler count against the consume loop and the equal-layout loop.
fn ratios(f: &mut Figures, s: &Sections, worker_counts: &[u32]) {
    let ratio = |sdk: Vec<(u32, f64)>, kind: &'static str, workers: Option<u32>| -> Vec<Sample> {
        sdk.into_iter()
            .filter_map(|(round, v)| {
                reference_rate(s, kind, round, workers).map(|b| Sample::value(round, v / b))
            })
            .collect()
    };
    let sdk_single = measured(&send::SINGLE.list(s), |r| r.warmup)
        .map(|r| (r.round, r.rate.rate_per_s))
        .collect();
    f.add(
        "send_single.vs_baseline".into(),
        "send_single",
        "Single send vs baseline".into(),
        "x",
        Better::Higher,
        DEF_RATIO,
        ratio(sdk_single, "send_single", None),
    );
    let sdk_batch = measured(&send::BATCH.list(s), |r| r.warmup)
        .map(|r| (r.round, r.rate.rate_per_s))
        .collect();
    f.add(
        "send_batch.vs_baseline".into(),
        "send_batch",
        "Batch send vs baseline".into(),
        "x",
        Better::Higher,
        DEF_RATIO,
        ratio(sdk_batch, "send_batch", None),
    );
    for w in worker_counts {
        let sdk = measured(&consume::RUNS.list(s), |r| r.warmup)
            .filter(|r| r.workers == *w)
            .map(|r| (r.round, r.rate.rate_per_s))
            .collect();
        f.add(
            format!("consume_scaling.w{w}.vs_baseline"),
            "consume_scaling",
            format!("Worker, {w} handlers, vs baseline read + delete"),
            "x",
            Better::Higher,
            DEF_RATIO,
            ratio(sdk, "consume", Some(*w)),
        );
        let sdk = measured(&consume::RUNS.list(s), |r| r.warmup)
            .filter(|r| r.workers == *w)
            .map(|r| (r.round, r.rate.rate_per_s))
            .collect();
        f.add(
            format!("consume_scaling.w{w}.vs_equal_layout"),
            "consume_scaling",
            format!("Worker, {w} handlers, vs equal-layout no-SDK loop (SDK overhead)"),
            "x",
            Better::Higher,
            DEF_RATIO_EQUAL,
            ratio(sdk, "consume_equal_layout", None),
        );
    }
}

/// The reference of a ratio: for a worker run, the mean of the consume
/// loops run just before and just after it (either alone when the other is
/// missing, as in older documents); for a send run, the mean of the round's
/// runs of its loop (one before and one after it). None when the loop did
/// not run in that round or measured nothing.
fn reference_rate(
    s: &Sections,
    kind: &'static str,
    round: u32,
    workers: Option<u32>,
) -> Option<f64> {
    let of_round = || baseline_runs(s, kind).into_iter().filter(move |r| r.round == round);
    let mean_rate = |keep: &dyn Fn(&BaselineRun) -> bool| {
        let (n, sum) = of_round()
            .filter(|r| keep(r))
            .fold((0u32, 0.0), |(n, sum), r| (n + 1, sum + r.rate.rate_per_s));
        (n > 0).then(|| sum / f64::from(n))
    };
    let bracket = workers
        .and_then(|w| mean_rate(&|r| r.paired_workers == Some(w) || r.follows_workers == Some(w)));
    bracket
        .or_else(|| mean_rate(&|r| r.paired_workers.is_none() && r.follows_workers.is_none()))
        .or_else(|| of_round().next().map(|r| r.rate.rate_per_s))
        .filter(|v| *v > 0.0)
}

/// The worker against the no-SDK loop on its own connection layout, per
/// handler count: what the SDK costs or gains at equal parallelism.
fn equal_layout_table(out: &mut String, d: &Document) {
    let ids: Vec<String> = worker_counts(d)
        .iter()
        .map(|w| format!("consume_scaling.w{w}.vs_equal_layout"))
        .filter(|id| fig(d, id).is_some())
        .collect();
    if ids.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "## Worker vs the equal-layout loop\n\n\
         Equal-layout read + delete (2 claim connections, 1 delete connection, no SDK): {} msg/s.\n\n\
         | Handlers | Worker / equal layout |\n| --- | --- |",
        cell(d, "baseline.consume_equal_layout.rate")
    );
    for id in &ids {
        let w = id
            .strip_prefix("consume_scaling.w")
            .and_then(|s| s.strip_suffix(".vs_equal_layout"))
            .unwrap_or("?");
        let _ = writeln!(out, "| {w} | {} |", cell(d, id));
    }
    out.push('\n');
    let mut defs = ids;
    defs.push("baseline.consume_equal_layout.rate".into());
    definitions(out, d, &defs);
}
