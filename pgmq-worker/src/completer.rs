//! Writes acknowledgements in batches.
//!
//! Handlers send one [`Ack`] per message into a bounded channel
//! (`ack_capacity`; a full channel makes handlers wait: backpressure). The
//! completer takes up to `ack_batch_size` at a time and writes each batch
//! with one call per kind: `pgmq.delete(ids)`, `pgmq.archive(ids)`, `pgmq.set_vt(ids)`
//! per delay, one transaction for the dead letters, and
//! `Pgmq::release_batch` for claims that expired unstarted (given back with
//! their read undone). Up to `ack_flushers`
//! batches are written at once.
//!
//! **When a batch goes out.** When every writer is busy, acknowledgements
//! wait in the channel; as soon as a writer is free it takes what has
//! arrived (up to `ack_batch_size`) and writes it at once. Under load the
//! batch size so follows the rate times the time of one write, and a message
//! stays claimed-but-undeleted for about two writes. That matters beyond
//! latency: every `pgmq.read` walks past the rows still waiting for their
//! delete, so fewer of them is less work for the claims (measured with the
//! `drain` example, 150,000 messages, its preload included: 37.9 buffer
//! accesses and 6.1 tuple fetches per message, against 40.1 and 7.8 when
//! each batch first waited to fill). Only when a writer was free all along
//! (a low rate) does a partial batch wait, at most `ack_flush_interval`, for
//! more to arrive, looking every millisecond rather than being woken once
//! per acknowledgement.
//!
//! A write that fails transiently is retried
//! with backoff for up to `ack_retry_timeout`; after that (or on a permanent
//! error) the batch is given up and counted in `acks_failed`: those messages
//! become visible again when their visibility timeout ends, which is the
//! at-least-once contract. When every handler is done the channel closes and
//! the completer writes what is left, then ends.
//!
//! **Connections kept while acknowledgements keep coming.** The writes run on
//! [`Kept`]: up to `ack_flushers` pooled connections that stay checked out
//! from one write to the next as long as the completer has more to write (a
//! checkout per write is client work on the hot path, and keeps the deletes
//! on the same server backends). When the ack channel runs empty they all go
//! back to the pool before the completer waits, so an idle worker holds
//! none, and a small pool cannot deadlock the claims behind the acknowledgements.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pgmq_client::reexports::tokio_postgres::Row;
use pgmq_client::{Client, ConnectionManager, Params, Pgmq, Stmt, TypedParams, VisibleAt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::claimer::ErrorBackoff;
use crate::stats::bump;
use crate::worker::Shared;

/// How often a partial batch looks for more acknowledgements.
const GATHER_TICK: Duration = Duration::from_millis(1);

/// One message's acknowledgement.
#[derive(Debug)]
pub(crate) struct Ack {
    pub msg_id: i64,
    /// Its delivery count when handled.
    pub attempts: u32,
    pub kind: AckKind,
}

/// What to write for a message.
#[derive(Debug)]
pub(crate) enum AckKind {
    Delete,
    Archive,
    Retry(Duration),
    DeadLetter {
        reason: String,
    },
    /// Give it back unstarted, undoing the read that returned this `read_ct`.
    Release {
        read_ct: i32,
    },
}

/// Runs until the channel is closed (every sender dropped, or `closing`
/// cancelled) and every batch is written.
pub(crate) async fn run(
    shared: Arc<Shared>,
    mut rx: mpsc::Receiver<Ack>,
    closing: CancellationToken,
) {
    let cfg = &shared.config;
    let batch = cfg.ack_batch_size;
    let kept = Arc::new(Kept::new(shared.client.clone(), cfg.ack_flushers));
    let mut flushes = JoinSet::new();
    let mut closed = false;
    loop {
        // A free writer first: acknowledgements that arrive while every
        // writer is busy wait in the channel, and the next batch takes them.
        while flushes.try_join_next().is_some() {}
        let mut waited = false;
        while flushes.len() >= cfg.ack_flushers {
            flushes.join_next().await;
            waited = true;
        }
        let mut buf = Vec::with_capacity(batch);
        if rx.is_empty() {
            // Nothing to write: give the kept connections back before waiting.
            kept.idle();
        }
        let n = tokio::select! {
            n = rx.recv_many(&mut buf, batch) => n,
            _ = closing.cancelled(), if !closed => {
                // Abandoned blocking handlers may still hold senders: stop
                // accepting, write what is buffered, end.
                rx.close();
                closed = true;
                continue;
            }
        };
        if n == 0 {
            break;
        }
        kept.busy();
        if buf.len() < batch && !waited {
            // Gather the rest of the batch by looking every GATHER_TICK,
            // rather than being woken by every acknowledgement as it arrives
            // (a task wake-up per message is client CPU the database needs).
            let deadline = tokio::time::Instant::now() + cfg.ack_flush_interval;
            'gather: loop {
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    break;
                }
                tokio::time::sleep_until(deadline.min(now + GATHER_TICK)).await;
                while buf.len() < batch {
                    match rx.try_recv() {
                        Ok(ack) => buf.push(ack),
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        Err(mpsc::error::TryRecvError::Disconnected) => break 'gather,
                    }
                }
                if buf.len() >= batch || closing.is_cancelled() {
                    break;
                }
            }
        }
        flushes.spawn(flush(Arc::clone(&shared), Arc::clone(&kept), buf));
    }
    while flushes.join_next().await.is_some() {}
    kept.idle();
}

/// A pooled connection kept between writes.
type Held = pgmq_client::reexports::bb8::PooledConnection<'static, ConnectionManager>;

/// The completer's connections, kept between back-to-back writes (see the
/// module docs); a [`pgmq_client::Executor`] over the client's pool.
pub(crate) struct Kept {
    client: Client,
    max: usize,
    state: std::sync::Mutex<KeptState>,
}

struct KeptState {
    conns: Vec<Held>,
    /// The completer is waiting for acknowledgements: keep nothing.
    idle: bool,
}

impl Kept {
    fn new(client: Client, max: usize) -> Self {
        Kept {
            client,
            max,
            state: std::sync::Mutex::new(KeptState {
                conns: Vec::with_capacity(max),
                idle: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KeptState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives every kept connection back; later returns are not kept.
    fn idle(&self) {
        let mut st = self.lock();
        st.idle = true;
        st.conns.clear();
    }

    /// More acknowledgements arrived: keep connections again.
    fn busy(&self) {
        self.lock().idle = false;
    }

    async fn take(&self) -> Result<Held, pgmq_client::Error> {
        loop {
            let Some(conn) = self.lock().conns.pop() else {
                break;
            };
            if !conn.is_broken() {
                return Ok(conn);
            }
        }
        self.client.connection_owned().await
    }

    /// A connection whose call succeeded: kept unless the completer is idle
    /// (checked under the same lock as [`idle`](Self::idle), so none slips
    /// past it).
    fn give_back(&self, conn: Held) {
        let mut st = self.lock();
        if !st.idle && st.conns.len() < self.max && !conn.is_broken() {
            st.conns.push(conn);
        }
    }
}

// Not imported: `Executor::query` would shadow `Transaction::query` below.
impl pgmq_client::Executor for Kept {
    async fn query(&self, stmt: Stmt, params: Params<'_>) -> Result<Vec<Row>, pgmq_client::Error> {
        let conn = self.take().await?;
        let res = pgmq_client::Executor::query(&conn, stmt, params).await;
        if res.is_ok() {
            self.give_back(conn);
        }
        res
    }

    async fn query_text(
        &self,
        sql: &str,
        params: TypedParams<'_>,
    ) -> Result<Vec<Row>, pgmq_client::Error> {
        let conn = self.take().await?;
        let res = pgmq_client::Executor::query_text(&conn, sql, params).await;
        if res.is_ok() {
            self.give_back(conn);
        }
        res
    }

    fn autocommit(&self) -> bool {
        true
    }
}

/// Writes one batch: deletes, archives, retries, dead letters.
#[tracing::instrument(name = "pgmq_worker.flush", level = "debug", skip_all, fields(acks = acks.len()))]
async fn flush(shared: Arc<Shared>, kept: Arc<Kept>, acks: Vec<Ack>) {
    let pg = Pgmq::on(&*kept);
    let n = acks.len() as u64;
    let mut deletes = Vec::new();
    let mut archives = Vec::new();
    let mut retries: Vec<(u64, i64)> = Vec::new();
    let mut dead = Vec::new();
    let mut releases = Vec::new();
    for ack in acks {
        match ack.kind {
            AckKind::Delete => deletes.push(ack.msg_id),
            AckKind::Archive => archives.push(ack.msg_id),
            AckKind::Retry(d) => retries.push((ceil_secs(d), ack.msg_id)),
            AckKind::DeadLetter { reason } => dead.push((ack.msg_id, ack.attempts, reason)),
            AckKind::Release { read_ct } => releases.push((ack.msg_id, read_ct)),
        }
    }
    let q = &shared.config.queue;
    let c = &shared.stats.c;
    if !deletes.is_empty() {
        // Ascending ids: the deletes walk the primary key in order.
        deletes.sort_unstable();
        // Counted, not listed: one reply row instead of one per id.
        write(&shared, "delete", deletes.len(), &c.deleted, || {
            pg.delete_batch_count(q, &deletes)
        })
        .await;
    }
    if !archives.is_empty() {
        write(&shared, "archive", archives.len(), &c.archived, || {
            pg.archive_batch_count(q, &archives)
        })
        .await;
    }
    if !retries.is_empty() || !releases.is_empty() {
        // After any heartbeat extension in flight for these messages, which
        // would otherwise overwrite their delay.
        shared.after_heartbeat().await;
    }
    if !releases.is_empty() {
        write(
            &shared,
            "release",
            releases.len(),
            &c.expired_released,
            || count(pg.release_batch(q, &releases)),
        )
        .await;
    }
    if !retries.is_empty() {
        retries.sort_unstable();
        for group in retries.chunk_by(|a, b| a.0 == b.0) {
            let secs = group[0].0;
            let ids: Vec<i64> = group.iter().map(|r| r.1).collect();
            write(&shared, "retry", ids.len(), &c.retried, || {
                count(pg.set_vt_batch(q, &ids, VisibleAt::After(Duration::from_secs(secs))))
            })
            .await;
        }
    }
    if !dead.is_empty() {
        write(&shared, "dead-letter", dead.len(), &c.dead_lettered, || {
            count(dead_letter(&shared, &dead))
        })
        .await;
    }
    bump(&shared.stats.acks_resolved, n);
}

/// How many a listing call wrote.
async fn count<T>(
    call: impl std::future::Future<Output = Result<Vec<T>, pgmq_client::Error>>,
) -> Result<u64, pgmq_client::Error> {
    call.await.map(|v| v.len() as u64)
}

/// Whole seconds, rounded up (PGMQ's visibility delays are whole seconds),
/// clamped to the longest delay PGMQ takes ([`pgmq_client::MAX_SECONDS`]),
/// so `Outcome::Retry(Duration::MAX)` neither overflows nor is refused.
fn ceil_secs(d: Duration) -> u64 {
    let up = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
    up.min(pgmq_client::MAX_SECONDS.as_secs())
}

/// Runs `call` until it succeeds, fails permanently, or the retry time runs
/// out; counts what was written into `done`, what was given up into `acks_failed`.
async fn write<F, Fut>(
    shared: &Shared,
    what: &'static str,
    count: usize,
    done: &std::sync::atomic::AtomicU64,
    mut call: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64, pgmq_client::Error>>,
{
    let give_up = Instant::now() + shared.config.ack_retry_timeout;
    let mut backoff = ErrorBackoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        match call().await {
            Ok(written) => {
                bump(done, written);
                return;
            }
            Err(e) => {
                let delay = backoff.next_delay();
                let deadline = shared.ack_deadline().map_or(give_up, |d| d.min(give_up));
                if !e.is_transient() || Instant::now() + delay >= deadline {
                    bump(&shared.stats.c.acks_failed, count as u64);
                    tracing::error!(
                        error = %e, messages = count, action = what,
                        "acknowledgement given up; the messages come back after their visibility timeout"
                    );
                    return;
                }
                bump(&shared.stats.c.ack_retries, 1);
                tracing::warn!(error = %e, messages = count, action = what, retry_in = ?delay, "acknowledgement failed; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Copies messages to the dead-letter queue, server-side: the rows are
/// row-locked through `pgmq.set_vt` (skipping those already gone), and their
/// `message` and `headers` go to `pgmq.send_batch` as they are, never through
/// the client, so the copy is exact (numbers of any precision, any nesting).
/// Returns the source ids copied, in the order given.
const DEAD_LETTER_SQL: &str = "\
WITH dead AS (
    SELECT * FROM ROWS FROM (pg_catalog.unnest($2::bigint[]), pg_catalog.unnest($3::text[]),
                            pg_catalog.unnest($4::integer[]))
        WITH ORDINALITY AS d(id, reason, attempts, ord)
), locked AS (
    SELECT m.msg_id, m.message, m.headers FROM pgmq.set_vt($1::text, $2::bigint[], 0) AS m
), moved AS (
    SELECT pg_catalog.array_agg(l.msg_id ORDER BY d.ord) AS ids,
           pg_catalog.array_agg(l.message ORDER BY d.ord) AS bodies,
           pg_catalog.array_agg(pg_catalog.jsonb_build_object(
               'reason', d.reason, 'attempts', d.attempts, 'source_queue', $1::text,
               'original_msg_id', l.msg_id, 'original_headers', l.headers) ORDER BY d.ord) AS headers
    FROM locked l JOIN dead d ON d.id = l.msg_id
    HAVING pg_catalog.count(*) > 0
)
SELECT moved.ids, ARRAY(SELECT pgmq.send_batch($5::text, moved.bodies, moved.headers, 0))
FROM moved";

/// Moves messages to the dead-letter queue in one transaction: the rows still
/// in the source queue are copied to the dead-letter queue with headers
/// `{reason, attempts, source_queue, original_msg_id, original_headers}`
/// ([`DEAD_LETTER_SQL`]; body and original headers byte-for-byte as stored),
/// then deleted. Messages already gone (acknowledged by someone else) are
/// skipped. Without a dead-letter queue the messages are archived.
async fn dead_letter(
    shared: &Shared,
    dead: &[(i64, u32, String)],
) -> Result<Vec<i64>, pgmq_client::Error> {
    let cfg = &shared.config;
    for (id, attempts, reason) in dead {
        tracing::warn!(msg_id = id, attempts, %reason, queue = %cfg.queue, "dead-lettering");
    }
    let Some(dlq) = &cfg.dead_letter_queue else {
        let ids: Vec<i64> = dead.iter().map(|d| d.0).collect();
        return shared.client.archive_batch(&cfg.queue, &ids).await;
    };
    // One copy per id, whatever the batch holds.
    let mut seen = std::collections::HashSet::with_capacity(dead.len());
    let mut ids = Vec::with_capacity(dead.len());
    let mut reasons = Vec::with_capacity(dead.len());
    let mut attempts = Vec::with_capacity(dead.len());
    for (id, n, reason) in dead {
        if seen.insert(*id) {
            ids.push(*id);
            reasons.push(reason.as_str());
            attempts.push(i32::try_from(*n).unwrap_or(i32::MAX));
        }
    }
    let mut conn = shared.client.connection().await?;
    let tx = conn.transaction().await?;
    let rows = tx
        .query(
            DEAD_LETTER_SQL,
            &[
                &cfg.queue.as_str(),
                &ids,
                &reasons,
                &attempts,
                &dlq.as_str(),
            ],
        )
        .await?;
    let moved: Vec<i64> = match rows.first() {
        Some(r) => r.try_get(0)?,
        None => Vec::new(),
    };
    // The copied rows are locked by this transaction: all of them delete.
    let deleted = Pgmq::on(&tx).delete_batch(&cfg.queue, &moved).await?;
    tx.commit().await?;
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_round_up_to_whole_seconds() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
        assert_eq!(ceil_secs(Duration::MAX), i32::MAX as u64);
        assert_eq!(ceil_secs(pgmq_client::MAX_SECONDS * 2), i32::MAX as u64);
    }
}
