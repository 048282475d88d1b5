//! Loading a queue: the server-side preload of a fresh queue, and a
//! producer that keeps sending into a queue at a depth or a rate while a
//! worker drains it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgmq_client::QueueName;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::kit::body::{id_batches, OutBody};
use crate::kit::tally::Tally;
use crate::kit::Ctx;
use crate::report::thousands;

/// Server-side preload: one `pgmq.send_batch` per chunk, bodies built by
/// `generate_series`, so the client does no work and holds no memory.
const PRELOAD_SQL: &str = "SELECT count(*) FROM pgmq.send_batch($1::text, ARRAY(\
    SELECT jsonb_build_object('id', g, 'pad', $4::text) \
    FROM generate_series($2::bigint, $3::bigint) AS g))";

const PRELOAD_CHUNK: u64 = 10_000;

/// A preload of at least this many messages is announced with its count.
const PRELOAD_SAID: u64 = 100_000;

/// How often a long preload says how far it got.
const PRELOAD_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl Ctx {
    /// Loads ids `0..n` into `q` on the server; returns the seconds taken.
    /// A large preload is announced, and a long one says every few seconds
    /// how many messages it has written.
    pub(crate) async fn preload(&self, q: &QueueName, n: u64) -> Result<f64> {
        let t = Instant::now();
        let mut said = t;
        if n >= PRELOAD_SAID {
            self.progress.say(format!(
                "preloading {} messages into {q}",
                thousands(n as f64)
            ));
        }
        for ids in id_batches(n, PRELOAD_CHUNK) {
            let (first, last) = (ids.start as i64, ids.end as i64 - 1);
            self.admin
                .query_one(PRELOAD_SQL, &[&q.as_str(), &first, &last, &self.pad])
                .await?;
            if said.elapsed() >= PRELOAD_EVERY && ids.end < n {
                said = Instant::now();
                self.progress.say(format!(
                    "preloaded {} of {} messages ({} msg/s)",
                    thousands(ids.end as f64),
                    thousands(n as f64),
                    thousands(ids.end as f64 / t.elapsed().as_secs_f64())
                ));
            }
        }
        Ok(t.elapsed().as_secs_f64())
    }
}

/// A stream of messages into a queue and the tally of the worker draining
/// it: what a paced producer and the samples of its run share.
pub(crate) struct Stream {
    /// Messages sent so far (each body's id is its number).
    pub(crate) sent: AtomicU64,
    /// The worker's handled ids.
    pub(crate) tally: Arc<Tally>,
}

impl Stream {
    /// A stream of nothing sent yet into the worker of `tally`.
    pub(crate) fn new(tally: Arc<Tally>) -> Arc<Stream> {
        Arc::new(Stream {
            sent: AtomicU64::new(0),
            tally,
        })
    }

    /// Messages sent so far.
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Acquire)
    }

    /// Messages sent whose handler has not finished.
    pub(crate) fn backlog(&self) -> u64 {
        self.sent().saturating_sub(self.tally.distinct())
    }
}

/// The most messages of one top-up of the streams' producers.
pub(crate) const TOP_UP_MOST: u64 = 1_000;

/// How a producer paces its sends: each top-up is one `send_batch` of as
/// many messages as both limits allow, at most `most`; below `least` it
/// naps instead.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pace {
    /// Keep the backlog at most this deep (None: whatever the backlog).
    pub(crate) depth: Option<u64>,
    /// At most this many messages a second since the producer started
    /// (None: as fast as the depth allows).
    pub(crate) rate: Option<f64>,
    /// The fewest messages of a top-up.
    pub(crate) least: u64,
    /// The most messages of a top-up.
    pub(crate) most: u64,
    /// How long it waits when it may not send.
    pub(crate) nap: Duration,
}

/// Sends bodies padded with `pad` into `q` as `pace` says, counting them in
/// `stream`, until `stop`.
pub(crate) async fn produce(
    ctx: Arc<Ctx>,
    q: QueueName,
    pad: String,
    pace: Pace,
    stream: Arc<Stream>,
    stop: CancellationToken,
) -> Result<()> {
    let start = tokio::time::Instant::now();
    let first = stream.sent();
    let mut bodies = Vec::new();
    while !stop.is_cancelled() {
        let sent = stream.sent();
        let below = pace
            .depth
            .map_or(u64::MAX, |d| d.saturating_sub(stream.backlog()));
        let allowed = pace.rate.map_or(u64::MAX, |r| {
            ((start.elapsed().as_secs_f64() * r) as u64).saturating_sub(sent - first)
        });
        let n = below.min(allowed).min(pace.most);
        if n == 0 || n < pace.least {
            tokio::select! {
                () = tokio::time::sleep(pace.nap) => {}
                () = stop.cancelled() => break,
            }
            continue;
        }
        bodies.clear();
        bodies.extend((sent..sent + n).map(|id| OutBody { id, pad: &pad }));
        ctx.client.send_batch(&q, &bodies).await?;
        stream.sent.fetch_add(n, Ordering::AcqRel);
    }
    Ok(())
}
