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
//! Each SDK figure is divided by its loop's figure of the same round: the
//! ratio is the SDK's overhead (below 1) or gain (above 1), and unlike the
//! absolute rates it carries across machines.

use std::time::Instant;

use tokio_postgres::types::Json;

use crate::document::{BaselineRun, Rate};
use crate::error::Result;
use crate::ledger::Ledger;
use crate::scenarios::{id_batches, Ctx, InBody};

/// Which loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loop {
    /// One send per message.
    SendSingle,
    /// One send_batch per batch.
    SendBatch,
    /// read + delete per batch.
    Consume,
}

impl Loop {
    /// The `kind` in the document.
    pub fn name(self) -> &'static str {
        match self {
            Loop::SendSingle => "send_single",
            Loop::SendBatch => "send_batch",
            Loop::Consume => "consume",
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

/// One run of one loop.
pub async fn run(ctx: &Ctx, which: Loop, round: u32, warmup: bool) -> Result<BaselineRun> {
    let pg = connect(ctx).await?;
    let batch = ctx.cfg.batch_size;
    let mut preload_s = 0.0;
    let mut vacuum_s = 0.0;
    let mut ledger_report = None;
    let (q, count, elapsed, peak) = match which {
        Loop::SendSingle => {
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
            (q, n, elapsed, ctx.meter.end())
        }
        Loop::SendBatch => {
            let q = ctx.guard.fresh("baseline_send_batch").await?;
            let stmt = pg
                .prepare("SELECT * FROM pgmq.send_batch($1::text, $2::jsonb[])")
                .await?;
            let n = ctx.cfg.batch_messages;
            let size = u64::from(batch);
            let mut bodies = Vec::with_capacity(size as usize);
            ctx.meter.begin();
            let t = Instant::now();
            for ids in id_batches(n, size) {
                bodies.clear();
                bodies.extend(ids.map(|i| Json(ctx.body(i))));
                pg.query(&stmt, &[&q.as_str(), &bodies]).await?;
            }
            let elapsed = t.elapsed().as_secs_f64();
            (q, n, elapsed, ctx.meter.end())
        }
        Loop::Consume => {
            let n = ctx.cfg.messages;
            let (q, p, v) = ctx.fresh_loaded("baseline_consume", n).await?;
            preload_s = p;
            vacuum_s = v;
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
            ledger_report = Some(ledger.report(n));
            (q, ledger.handled(), elapsed, peak)
        }
    };
    let in_queue_after = ctx.finish_queue(&q).await?;
    Ok(BaselineRun {
        round,
        warmup,
        kind: which.name().to_owned(),
        rate: Rate::new(count, elapsed),
        batch_size: if which == Loop::SendSingle { 1 } else { batch },
        ledger: ledger_report,
        in_queue_after,
        preload_s,
        vacuum_s,
        peak_rss_bytes: peak,
        paired_workers: None,
        follows_workers: None,
    })
}
