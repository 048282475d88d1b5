//! The plain loops: the benchmark's sends and drains with no SDK (plain
//! tokio-postgres prepared statements, the same bodies, batch size, queue
//! state and accounting), the reference of the SDK sections' ratios. The
//! baseline section runs them alone; beside an SDK section each runs next
//! to that section's runs ([`neighbour`]).

use std::sync::Arc;
use std::time::Instant;

use tokio_postgres::types::Json;

use crate::document::{BaselineRun, Rate, Sections, BASELINE_RUNS};
use crate::error::Result;
use crate::kit::body::InBody;
use crate::kit::ctx::Round;
use crate::kit::Ctx;
use crate::ledger::Ledger;

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
        Loop::ConsumeEqualLayout => consume(ctx, "baseline_equal_layout", None).await?,
        Loop::Consume => consume(ctx, "baseline_consume", Some(&pg)).await?,
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
    let (stmt, name) = (&stmt, q.as_str());
    let elapsed = ctx
        .timed_batches(n, size, Json, |bodies| async move {
            pg.query(stmt, &[&name, &bodies]).await?;
            Ok(bodies)
        })
        .await?;
    Ok(Measured::sent(q, n, elapsed, ctx.meter.end()))
}

/// A consume loop on a fresh queue of `--messages` preloaded messages
/// (`pgmq_bench_<suffix>`): the worker's connection layout without `pg`,
/// else read + delete on `pg`.
async fn consume(ctx: &Ctx, suffix: &str, pg: Option<&tokio_postgres::Client>) -> Result<Measured> {
    let n = ctx.cfg.messages;
    let (q, preload_s, vacuum_s) = ctx.fresh_loaded(suffix, n).await?;
    let (ledger, elapsed, peak) = match pg {
        None => {
            ctx.meter.begin();
            let (ledger, elapsed) = equal_layout(ctx, &q, n).await?;
            (ledger, elapsed, ctx.meter.end())
        }
        Some(pg) => read_delete(ctx, pg, &q, n).await?,
    };
    Ok(Measured::drained(
        q,
        &ledger,
        n,
        elapsed,
        peak,
        (preload_s, vacuum_s),
    ))
}

/// `pgmq.read` then `pgmq.delete` per batch on one connection: the
/// ledger, the seconds from the first read to the last delete's reply,
/// and the peak RSS.
async fn read_delete(
    ctx: &Ctx,
    pg: &tokio_postgres::Client,
    q: &pgmq_client::QueueName,
    n: u64,
) -> Result<(Arc<Ledger>, f64, u64)> {
    let batch = ctx.cfg.batch_size;
    let read = pg
        .prepare("SELECT * FROM pgmq.read($1::text, $2::integer, $3::integer)")
        .await?;
    let delete = pg
        .prepare("SELECT * FROM pgmq.delete($1::text, $2::bigint[])")
        .await?;
    let vt = i32::try_from(ctx.cfg.visibility_timeout).unwrap_or(i32::MAX);
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
    Ok((Arc::new(ledger), elapsed, peak))
}

/// The equal-layout loop: two claimers, one deleter; returns the ledger and
/// the seconds from the first read to the last delete's reply.
async fn equal_layout(ctx: &Ctx, q: &pgmq_client::QueueName, n: u64) -> Result<(Arc<Ledger>, f64)> {
    let ledger = Arc::new(Ledger::new());
    let vt = i32::try_from(ctx.cfg.visibility_timeout).unwrap_or(i32::MAX);
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
        ledger: Arc<Ledger>,
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
    if !ctx.cfg.has("baseline") {
        return Ok(None);
    }
    baseline_once(ctx, which, at, s).await.map(Some)
}

/// One run of a baseline loop, recorded; its index in the baseline's runs.
pub(crate) async fn baseline_once(
    ctx: &Ctx,
    which: Loop,
    at: Round<'_>,
    s: &mut Sections,
) -> Result<usize> {
    let tag = at.tag;
    let r = run(ctx, which, at.index, at.warm).await?;
    ctx.progress.say(format!(
        "{tag} baseline {}: {:.0} msg/s",
        r.kind, r.rate.rate_per_s
    ));
    BASELINE_RUNS.record(s, &r)?;
    Ok(BASELINE_RUNS.of(s)?.len() - 1)
}
