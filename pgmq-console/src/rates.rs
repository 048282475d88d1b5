//! Rates in and out of each queue over the last minutes.
//!
//! A sampler task reads every queue's overview (the queues page's own
//! bounded query) every [`SAMPLE_EVERY`], as does every read of the queues
//! page (at most one sample a second), and keeps, per queue, the samples
//! of the last [`KEPT`]: when, how many messages the queue was ever sent
//! (its msg_id sequence), and its depth. Between two samples the rate in is
//! the messages sent per second, and the rate out those that left the
//! queue (deleted or archived: sent minus the depth's growth) per second.
//! The history lives in the console's process: it starts empty at start
//! and is lost at exit. Only the queues the queues page would show
//! (`queue_limit`, those needing attention first) are sampled.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use pgmq_client::{Client, QueueOverview};

use crate::options::ConsoleOptions;

/// How often the sampler reads the queues.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(10);

/// How long a sample is kept.
pub(crate) const KEPT: Duration = Duration::from_secs(15 * 60);

/// The least time between two samples of a queue: a page read sooner
/// after the last sample adds none.
const MIN_GAP: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    sent: i64,
    depth: i64,
    /// The depth reached the count cap: the rate out is unknown.
    capped: bool,
}

/// One interval's rates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rate {
    /// Seconds before now at the interval's end.
    pub(crate) ago_secs: f64,
    /// Messages sent per second.
    pub(crate) in_per_s: f64,
    /// Messages that left the queue per second; None when a depth was at
    /// the count cap.
    pub(crate) out_per_s: Option<f64>,
}

/// The samples of every queue sampled.
#[derive(Debug, Default)]
pub(crate) struct Rates {
    samples: Mutex<HashMap<String, VecDeque<Sample>>>,
}

impl Rates {
    /// Records a sample, taken at `at`, of each queue (name, messages ever
    /// sent, depth) whose sent count is known; drops samples older than
    /// [`KEPT`].
    pub(crate) fn record<'a>(
        &self,
        at: Instant,
        queues: impl IntoIterator<Item = (&'a str, Option<i64>, i64)>,
        cap: i64,
    ) {
        let mut all = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        for (name, sent, depth) in queues {
            let Some(sent) = sent else { continue };
            let kept = all.entry(name.to_owned()).or_default();
            if kept
                .back()
                .is_some_and(|s| at.saturating_duration_since(s.at) < MIN_GAP)
            {
                continue;
            }
            kept.push_back(Sample {
                at,
                sent,
                depth,
                capped: depth >= cap,
            });
            while kept
                .front()
                .is_some_and(|s| at.saturating_duration_since(s.at) > KEPT)
            {
                kept.pop_front();
            }
        }
    }

    /// The rates of `queue` between consecutive samples, oldest first.
    pub(crate) fn history(&self, queue: &str) -> Vec<Rate> {
        let all = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let Some(kept) = all.get(queue) else {
            return Vec::new();
        };
        let now = Instant::now();
        kept.iter()
            .zip(kept.iter().skip(1))
            .filter_map(|(a, b)| {
                let secs = b.at.saturating_duration_since(a.at).as_secs_f64();
                (secs > 0.0).then(|| {
                    // A queue dropped and created again restarts its
                    // sequence: no rate across that.
                    let sent = (b.sent - a.sent).max(0) as f64;
                    let left = sent - (b.depth - a.depth) as f64;
                    Rate {
                        ago_secs: now.saturating_duration_since(b.at).as_secs_f64(),
                        in_per_s: sent / secs,
                        out_per_s: (!a.capped && !b.capped).then(|| left.max(0.0) / secs),
                    }
                })
            })
            .collect()
    }
}

/// Samples the queues every [`SAMPLE_EVERY`] until `rates` is dropped (the
/// router and every clone of its state gone). A failed read is logged and
/// retried at the next tick.
pub(crate) async fn sample(client: Client, opts: Arc<ConsoleOptions>, rates: Weak<Rates>) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(rates) = rates.upgrade() else { return };
        match read(&client, &opts).await {
            Ok(queues) => rates.record(Instant::now(), of(&queues), opts.count_cap),
            Err(e) => tracing::debug!(error = %e, "pgmq-console: could not sample the queues"),
        }
    }
}

/// What a sample keeps of each queue's overview.
pub(crate) fn of(queues: &[QueueOverview]) -> impl Iterator<Item = (&str, Option<i64>, i64)> {
    queues
        .iter()
        .map(|q| (q.queue_name.as_str(), q.sent_total, q.depth))
}

/// The queues page's overview, in a bounded transaction of its own.
async fn read(
    client: &Client,
    opts: &ConsoleOptions,
) -> Result<Vec<QueueOverview>, pgmq_client::Error> {
    let mut conn = client.connection().await?;
    let tx = conn.transaction().await?;
    let pg = pgmq_client::Pgmq::on(&tx);
    pg.set_local_timeouts(opts.statement_timeout, opts.statement_timeout)
        .await?;
    let (queues, _) = pg
        .queue_overview(opts.queue_limit, None, opts.count_cap)
        .await?;
    Ok(queues)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overview(name: &str, depth: i64, sent: i64) -> (&str, Option<i64>, i64) {
        (name, Some(sent), depth)
    }

    #[test]
    fn rates_in_and_out_between_samples() {
        let r = Rates::default();
        let t0 = Instant::now();
        r.record(t0, [overview("q", 100, 1_000)], 100_000);
        // 10 s later: 500 sent, depth 100 -> 300, so 300 left.
        r.record(
            t0 + Duration::from_secs(10),
            [overview("q", 300, 1_500)],
            100_000,
        );
        let h = r.history("q");
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].in_per_s, 50.0);
        assert_eq!(h[0].out_per_s, Some(30.0));
        assert!(r.history("other").is_empty());
    }

    #[test]
    fn a_capped_depth_leaves_the_rate_out_unknown() {
        let r = Rates::default();
        let t0 = Instant::now();
        r.record(t0, [overview("q", 10, 0)], 10);
        r.record(t0 + Duration::from_secs(5), [overview("q", 10, 100)], 10);
        assert_eq!(r.history("q").last().unwrap().out_per_s, None);
        assert_eq!(r.history("q").last().unwrap().in_per_s, 20.0);
    }
}
