//! send_single and send_batch: sequential SDK sends into a fresh queue.
//!
//! Timed from the first call to the last reply; each call is awaited before
//! the next (one call in flight). Afterwards the queue length must equal the
//! count sent, or the run fails.

use std::time::Instant;

use crate::document::{Rate, SendRun};
use crate::error::Result;
use crate::sections::{id_batches, Ctx};

/// One send_single run: `--single-messages` calls of `Client::send`.
pub async fn single(ctx: &Ctx, round: u32, warmup: bool) -> Result<SendRun> {
    let q = ctx.guard.fresh("send_single").await?;
    let n = ctx.cfg.single_messages;
    ctx.meter.begin();
    let t = Instant::now();
    for id in 0..n {
        ctx.client.send(&q, &ctx.body(id)).await?;
    }
    finish(
        ctx,
        &q,
        Rate::new(n, t.elapsed().as_secs_f64()),
        1,
        round,
        warmup,
    )
    .await
}

/// Ends a send run: peak RSS, the queue length check, the queue dropped.
async fn finish(
    ctx: &Ctx,
    q: &pgmq_client::QueueName,
    rate: Rate,
    batch_size: u32,
    round: u32,
    warmup: bool,
) -> Result<SendRun> {
    let peak_rss_bytes = ctx.meter.end();
    Ok(SendRun {
        round,
        warmup,
        rate,
        batch_size,
        in_queue_after: ctx.finish_queue(q).await?,
        peak_rss_bytes,
    })
}

/// One send_batch run: `--messages` in calls of `Client::send_batch` of `--batch-size`.
pub async fn batch(ctx: &Ctx, round: u32, warmup: bool) -> Result<SendRun> {
    let q = ctx.guard.fresh("send_batch").await?;
    let n = ctx.cfg.batch_messages;
    let size = u64::from(ctx.cfg.batch_size);
    let mut bodies = Vec::with_capacity(size as usize);
    ctx.meter.begin();
    let t = Instant::now();
    for ids in id_batches(n, size) {
        bodies.clear();
        bodies.extend(ids.map(|i| ctx.body(i)));
        ctx.client.send_batch(&q, &bodies).await?;
    }
    let rate = Rate::new(n, t.elapsed().as_secs_f64());
    finish(ctx, &q, rate, ctx.cfg.batch_size, round, warmup).await
}
