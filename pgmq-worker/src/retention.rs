//! Archive retention, run periodically: each queue's archive pruned past an
//! age and/or a count by pgmq-client's
//! [`Pgmq::apply_retention`](pgmq_client::Pgmq::apply_retention), the
//! code `pgmq archive prune` runs once.
//!
//! Run it in as many processes as you like: each batch takes the queue's
//! retention lock in the database, so one process prunes a queue at a time
//! and the others skip it that round (bounded batches, short
//! transactions, no lock held between them). Ages are judged by the
//! database clock. A round that fails for a queue is logged and tried again
//! at the next round; the task ends when its token is cancelled.

use std::time::Duration;

use pgmq_client::{ArchiveRetention, Client, QueueName};
use tokio_util::sync::CancellationToken;

/// What the retention task reads: the queues, what their archives keep, and
/// how often it prunes.
///
/// ```
/// use std::time::Duration;
/// use pgmq_client::{ArchiveRetention, QueueName};
/// use pgmq_worker::RetentionConfig;
/// let config = RetentionConfig::new(
///     vec![QueueName::new("orders").unwrap()],
///     ArchiveRetention::older_than(Duration::from_secs(7 * 86_400)),
/// );
/// assert_eq!(config.every, Duration::from_secs(300));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RetentionConfig {
    /// The queues whose archives are pruned.
    pub queues: Vec<QueueName>,
    /// What each archive keeps (the age, the count, the batch).
    pub retention: ArchiveRetention,
    /// Time between the starts of two rounds (default 5 minutes; the first
    /// round runs at once).
    pub every: Duration,
}

impl RetentionConfig {
    /// `retention` for `queues`, a round every 5 minutes.
    pub fn new(queues: Vec<QueueName>, retention: ArchiveRetention) -> Self {
        RetentionConfig {
            queues,
            retention,
            every: Duration::from_secs(300),
        }
    }

    /// Sets the time between rounds.
    pub fn every(mut self, every: Duration) -> Self {
        self.every = every;
        self
    }
}

/// Runs retention rounds until `stop` is cancelled; returns the rows it
/// pruned in all. Spawn it beside a worker.
///
/// ```no_run
/// # async fn f(client: pgmq_client::Client, config: pgmq_worker::RetentionConfig) {
/// let stop = tokio_util::sync::CancellationToken::new();
/// let task = tokio::spawn(pgmq_worker::run_retention(client, config, stop.clone()));
/// // ... run the worker; at shutdown:
/// stop.cancel();
/// let pruned = task.await.unwrap();
/// # }
/// ```
pub async fn run_retention(
    client: Client,
    config: RetentionConfig,
    stop: CancellationToken,
) -> u64 {
    let mut total = 0;
    let mut tick = tokio::time::interval(config.every.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return total,
            _ = tick.tick() => {}
        }
        for q in &config.queues {
            let round = tokio::select! {
                _ = stop.cancelled() => return total,
                r = client.apply_retention(q, &config.retention) => r,
            };
            match round {
                Ok(done) => {
                    total += done.pruned;
                    tracing::debug!(queue = %q, pruned = done.pruned, busy = done.busy, "archive retention");
                }
                Err(e) => {
                    tracing::warn!(queue = %q, error = %e, "archive retention failed; trying again next round")
                }
            }
        }
    }
}
