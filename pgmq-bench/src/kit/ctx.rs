//! The run context every section measures with (and the round a run
//! belongs to): the settings, the
//! database, the SDK client, an admin connection, the queue guard, the
//! memory meter and the progress lines, and what a run does with its
//! queue around the measured part (a fresh queue, its vacuum, what is left
//! in it at the end).

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use pgmq_client::{Client, QueueName};

use crate::config::Config;
use crate::error::Result;
use crate::guard::Guard;
use crate::kit::body::{id_batches, OutBody};
use crate::kit::sink::Sink;
use crate::process::MemoryMeter;
use crate::progress::Progress;

/// The round a run belongs to: its index among warm-up or measured rounds,
/// whether it is a warm-up round, and the tag naming it in progress lines.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Round<'a> {
    /// Index among the warm-up rounds, or among the measured ones.
    pub(crate) index: u32,
    /// A warm-up round (its runs are recorded but not in the figures).
    pub(crate) warm: bool,
    /// `warm-up 1/1` or `round 2/3`.
    pub(crate) tag: &'a str,
}

/// Everything a section needs.
#[derive(Debug)]
pub(crate) struct Ctx {
    /// The settings.
    pub(crate) cfg: Config,
    /// The database (its password resolved once; never printed).
    pub(crate) target: crate::target::Target,
    /// The SDK client (pool).
    pub(crate) client: Client,
    /// A dedicated plain connection for preloads, VACUUM and metadata.
    pub(crate) admin: tokio_postgres::Client,
    /// The owned-queue registry.
    pub(crate) guard: Guard,
    /// Per-run peak RSS.
    pub(crate) meter: MemoryMeter,
    /// Progress lines.
    pub(crate) progress: Progress,
    /// The padding string of every body.
    pub(crate) pad: String,
    /// With `--handler db-write`: the handlers' own connections.
    pub(crate) sink: Option<Arc<Sink>>,
}

impl Ctx {
    /// A body.
    pub(crate) fn body(&self, id: u64) -> OutBody<'_> {
        OutBody { id, pad: &self.pad }
    }

    /// Sends the ids `0..n` in batches of `size`, each batch's bodies made
    /// by `wrap` and handed to `send`, each call awaited before the next,
    /// with the memory meter begun: the seconds from the first call to the
    /// last reply. `send` hands its batch back so that every batch reuses
    /// one allocation.
    pub(crate) async fn timed_batches<'c, B, F, Fut>(
        &'c self,
        n: u64,
        size: u64,
        wrap: impl Fn(OutBody<'c>) -> B,
        mut send: F,
    ) -> Result<f64>
    where
        F: FnMut(Vec<B>) -> Fut,
        Fut: Future<Output = Result<Vec<B>>>,
    {
        let mut bodies = Vec::with_capacity(size as usize);
        self.meter.begin();
        let t = Instant::now();
        for ids in id_batches(n, size) {
            bodies.clear();
            bodies.extend(ids.map(|i| wrap(self.body(i))));
            bodies = send(bodies).await?;
        }
        Ok(t.elapsed().as_secs_f64())
    }

    /// `VACUUM (ANALYZE)` of the queue table; returns the seconds taken.
    pub(crate) async fn vacuum(&self, q: &QueueName) -> Result<f64> {
        let t = Instant::now();
        // `QueueName` admits only [a-z0-9_], so the table name is a plain identifier.
        self.admin
            .batch_execute(&format!("VACUUM (ANALYZE) {}", q.table()))
            .await?;
        Ok(t.elapsed().as_secs_f64())
    }

    /// A fresh queue holding ids `0..n`, vacuumed: (queue, preload s, vacuum s).
    pub(crate) async fn fresh_loaded(&self, suffix: &str, n: u64) -> Result<(QueueName, f64, f64)> {
        let q = self.guard.fresh(suffix).await?;
        let preload_s = self.preload(&q, n).await?;
        let vacuum_s = self.vacuum(&q).await?;
        Ok((q, preload_s, vacuum_s))
    }

    /// Messages left in `q`, then drops it (the run is over).
    pub(crate) async fn finish_queue(&self, q: &QueueName) -> Result<i64> {
        let left = self.queue_length(q).await?;
        self.guard.release(q).await?;
        Ok(left)
    }

    /// Messages in `q` (visible or not).
    pub(crate) async fn queue_length(&self, q: &QueueName) -> Result<i64> {
        Ok(self.client.metrics(q).await?.queue_length)
    }
}
