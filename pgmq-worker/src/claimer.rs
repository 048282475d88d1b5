//! Reads batches into the bounded claim queue.
//!
//! `claimers` loops (2 by default) run at once, each with one `pgmq.read` in
//! flight, so the next claim never waits for the previous one, nor for any
//! acknowledgement. They share the free room of the claim queue through a
//! semaphore of `claim_capacity` permits ([`Room`]): a loop takes up to `batch_size`
//! permits (waiting for at least half a batch, so a nearly full queue is not
//! refilled one message at a time), reads that many, and gives back what the
//! read did not fill. A handler returns a permit when it takes a message. The
//! claim queue therefore never holds more than `claim_capacity` messages, and
//! memory does not grow with the backlog.
//!
//! **Claims the handlers can start in time.** A claimed message's visibility
//! timeout runs while it waits locally. With slow handlers a full claim queue
//! would take longer to work through than the timeout allows (300 messages at
//! 8 handlers of 1 s each: 37 s), and its tail would become visible again, be
//! claimed a second time and have its `read_ct` raised without running. So
//! the room actually offered is limited to what the handlers start within a
//! quarter of the visibility timeout, by Little's law: `concurrency * (vt /
//! 4) / average handler time` (a moving average), kept between `concurrency`
//! and `claim_capacity`. Until the first handler finishes the average is
//! unknown and only `concurrency` messages are claimed. For handlers faster
//! than a few milliseconds the limit is simply `claim_capacity`.
//!
//! **One connection per loop while the backlog lasts.** A loop keeps the
//! pooled connection of its last read for the next one, as long as it reads
//! back to back: a pool checkout per read is client work and a hand-off
//! between tasks that a busy claim path pays on every batch. The connection
//! goes back to the pool before the loop waits for anything else (room in
//! the claim queue, the poll timer, a wake-up) and after any failed read, so
//! an idle or blocked worker holds no connection and a small pool cannot
//! deadlock the acknowledgements behind the claims.
//!
//! After a full read a loop reads again at once. After a short or empty read
//! it parks: loop 0 until the poll interval passes or a wake-up arrives, the
//! others until a wake-up only, so an idle worker polls once per interval
//! whatever the number of loops. A wake-up is a notification from the
//! notifier, or any loop reading a full batch (the backlog is back). Wake-ups
//! are a counter in a watch channel, marked seen just before each read: one
//! that arrives during a read makes the loop read again instead of parking,
//! so none is lost.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pgmq_client::{ConnectionManager, Message, Pgmq, RawJson};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::claim_queue::ClaimQueue;
use crate::stats::{bump, micros, record, LocalHistograms};
use crate::worker::Shared;

/// A message in the claim queue.
pub(crate) struct Claimed {
    pub msg: Message<RawJson>,
    /// When the read that claimed it returned.
    pub claimed_at: Instant,
}

/// Backoff after failed reads: 50 ms doubling to 5 s.
pub(crate) struct ErrorBackoff {
    next: Duration,
    min: Duration,
    max: Duration,
}

impl ErrorBackoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        ErrorBackoff {
            next: min,
            min,
            max,
        }
    }

    pub(crate) fn reset(&mut self) {
        self.next = self.min;
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }
}

/// The free room of the claim queue, in messages.
///
/// A semaphore of `claim_capacity` permits, of which `withheld` are kept
/// back (acquired and forgotten) to lower the room to the current claim
/// limit; they are handed back when the limit rises.
pub(crate) struct Room {
    sem: Arc<Semaphore>,
    capacity: usize,
    withheld: Mutex<usize>,
}

impl Room {
    pub(crate) fn new(capacity: usize) -> Self {
        Room {
            sem: Arc::new(Semaphore::new(capacity)),
            capacity,
            withheld: Mutex::new(0),
        }
    }

    /// Messages left the claim queue (a handler took one, or they were released).
    pub(crate) fn free(&self, n: usize) {
        self.sem.add_permits(n);
    }

    /// Moves the room towards `limit` messages in all (queued + free).
    fn limit_to(&self, limit: usize) {
        let target = self.capacity - limit.clamp(1, self.capacity);
        let mut withheld = self.withheld.lock().unwrap_or_else(|p| p.into_inner());
        if *withheld > target {
            self.sem.add_permits(*withheld - target);
            *withheld = target;
        } else if *withheld < target {
            // Only what is free now; the rest on later calls, as handlers
            // take messages.
            let take = (target - *withheld).min(self.sem.available_permits());
            if take > 0 {
                if let Ok(p) = self.sem.try_acquire_many(take as u32) {
                    p.forget();
                    *withheld += take;
                }
            }
        }
    }
}

/// How many messages may wait in the claim queue now (see the module docs).
pub(crate) fn claim_limit(shared: &Shared) -> usize {
    let cfg = &shared.config;
    let floor = cfg.concurrency.clamp(1, cfg.claim_capacity);
    let avg_us = shared.handler_avg_us.load(Relaxed);
    if avg_us == 0 {
        return floor;
    }
    let budget_us = micros(cfg.visibility_timeout) / 4;
    let limit = (cfg.concurrency as u64).saturating_mul(budget_us) / avg_us;
    usize::try_from(limit)
        .unwrap_or(usize::MAX)
        .clamp(floor, cfg.claim_capacity)
}

/// A pooled connection a claim loop keeps between reads.
type Held = pgmq_client::reexports::bb8::PooledConnection<'static, ConnectionManager>;

/// One `pgmq.read` of up to `qty` messages, on the kept connection (checked
/// out first when there is none, or when the last one broke).
async fn read(
    shared: &Shared,
    conn: &mut Option<Held>,
    qty: usize,
) -> Result<Vec<Message<RawJson>>, pgmq_client::Error> {
    let cfg = &shared.config;
    if conn.as_ref().is_some_and(|c| c.is_broken()) {
        *conn = None;
    }
    let c = match conn {
        Some(c) => c,
        None => conn.insert(shared.client.connection_owned().await?),
    };
    Pgmq::on(&**c)
        .read_raw(&cfg.queue, cfg.visibility_timeout, qty)
        .await
}

/// One claim loop; runs until `stop`. A read in flight when `stop` fires is
/// finished and its messages queued, for the shutdown to release.
pub(crate) async fn run(
    shared: Arc<Shared>,
    queue: Arc<ClaimQueue<Claimed>>,
    index: usize,
    stop: CancellationToken,
) {
    let cfg = &shared.config;
    let batch = cfg.batch_size.min(cfg.claim_capacity);
    let at_least = (batch / 2).max(1);
    let mut wake = shared.wake.subscribe();
    let mut backoff = ErrorBackoff::new(Duration::from_millis(50), Duration::from_secs(5));
    let mut local = LocalHistograms::new();
    let room = &shared.room;
    // The connection kept between back-to-back reads (see the module docs).
    let mut conn: Option<Held> = None;
    loop {
        // Room in the claim queue: at least half a batch (or half the claim
        // limit when smaller), topped up to a batch.
        let limit = claim_limit(&shared);
        room.limit_to(limit);
        let first = at_least.min((limit / 2).max(1));
        let mut permits = match room.sem.clone().try_acquire_many_owned(first as u32) {
            Ok(p) => p,
            Err(_) => {
                // No room yet: wait without holding a connection.
                conn = None;
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => break,
                    p = room.sem.clone().acquire_many_owned(first as u32) => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                }
            }
        };
        let extra = room.sem.available_permits().min(batch - first);
        if extra > 0 {
            if let Ok(more) = room.sem.clone().try_acquire_many_owned(extra as u32) {
                permits.merge(more);
            }
        }
        let qty = permits.num_permits();
        // Anything announced from here on is not missed: it marks `wake` changed.
        wake.borrow_and_update();
        let res = read(&shared, &mut conn, qty).await;
        let msgs = match res {
            Ok(msgs) => msgs,
            Err(e) => {
                conn = None;
                drop(permits);
                bump(&shared.stats.c.read_errors, 1);
                let delay = backoff.next_delay();
                if e.is_transient() {
                    tracing::warn!(error = %e, retry_in = ?delay, claimer = index, "read failed");
                } else {
                    tracing::error!(error = %e, retry_in = ?delay, claimer = index, "read failed");
                }
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(delay) => continue,
                }
            }
        };
        backoff.reset();
        let now = Instant::now();
        let n = msgs.len();
        bump(&shared.stats.c.reads, 1);
        bump(&shared.stats.c.claimed, n as u64);
        // The permits of the messages travel with them; a handler gives each
        // back when it takes the message. The rest go back now.
        if let Some(taken) = permits.split(n) {
            taken.forget();
        }
        drop(permits);
        for msg in &msgs {
            if let Some(read_at) = msg.last_read_at {
                let waited = (read_at - msg.enqueued_at).num_microseconds().unwrap_or(0);
                record(&mut local.h.queue_wait_db, waited.max(0) as u64);
            }
        }
        // The whole batch at once; every message in the queue holds a permit
        // of the room, so it never holds more than `claim_capacity`.
        let batch = msgs.into_iter().map(|msg| Claimed {
            msg,
            claimed_at: now,
        });
        let loops =
            crate::claim_queue::loops_for(n, shared.handler_avg_us.load(Relaxed), cfg.concurrency);
        if !queue.push_batch(batch, loops) {
            // Closed only when the worker is being torn down.
            return;
        }
        local.maybe_merge(&shared.stats, now);
        if n == qty {
            // The backlog is there: wake the other loops if parked.
            shared.wake_claimers();
            continue;
        }
        if n == 0 {
            bump(&shared.stats.c.empty_reads, 1);
        }
        local.merge(&shared.stats, now);
        // Short read: the queue is drained for now. Park, without a connection.
        conn = None;
        let timer = async {
            if index == 0 {
                tokio::time::sleep(cfg.poll_interval).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let stopped = tokio::select! {
            biased;
            _ = stop.cancelled() => true,
            _ = wake.changed() => false,
            _ = timer => {
                bump(&shared.stats.c.wakeups_poll, 1);
                false
            }
        };
        if stopped {
            break;
        }
    }
    local.merge(&shared.stats, Instant::now());
}
