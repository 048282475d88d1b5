//! Writes acknowledgements in batches.
//!
//! Handlers send one [`Ack`] per message into a bounded channel
//! (`ack_capacity`; a full channel makes handlers wait: backpressure). The
//! completer takes up to `ack_batch_size` at a time and writes each batch
//! with one call per kind, every one of them fenced on the delivery
//! ([`pgmq_client::Receipt`]): a delete, an archive, one requeue for the
//! retries, snoozes and releases (each with its own delay), and one
//! transaction for the dead letters. Up to `ack_flushers` batches are written
//! at once.
//!
//! **Fenced.** A write matches a message only as the read that claimed it
//! left it (`msg_id` and `last_read_at`). One that matches nothing means the
//! claim expired and another delivery holds the message: nothing is written
//! for it here, and it is counted in `claims_lost` (logged once, at WARN).
//! When an earlier try of the same write failed with an unknown outcome (the
//! connection broke after sending it, or it outlived `db_timeout`), a
//! message the retry no longer matches may have been written by that try,
//! or lost to another delivery meanwhile (the claim can expire while the
//! database is away). For a delete, an archive or a dead-letter move the
//! completer then asks which of those rows are still in the queue table:
//! such a write removes its row and message ids are never reused, so a row
//! still there is a lost claim (counted in `claims_lost`), and a row gone
//! was written by the earlier try (counted as written). A requeue leaves
//! its row either way, so such a requeue is counted neither way.
//!
//! **When a batch goes out.** When every writer is busy, acknowledgements
//! wait in the channel; as soon as a writer is free it takes what has
//! arrived (up to `ack_batch_size`) and writes it at once. Under load the
//! batch size so follows the rate times the time of one write, and a message
//! stays claimed-but-undeleted for about two writes. That matters beyond
//! latency: every claim read walks past the rows still waiting for their
//! delete, so the sooner they are deleted, the less work each claim does
//! than if every batch waited to fill. Only when a writer was free all along
//! (a low rate) does a partial batch wait, at most `ack_flush_interval`, for
//! more to arrive, looking every millisecond rather than being woken once
//! per acknowledgement.
//!
//! A write that fails transiently (including one that outlives `db_timeout`)
//! is retried with backoff for up to `ack_retry_timeout`; after that (or on
//! a permanent error) the batch is given up and counted in `acks_failed`:
//! those messages become visible again when their visibility timeout ends,
//! which is the at-least-once contract. Until then the heartbeat keeps
//! extending the deliveries whose delete, archive or dead-letter move waits,
//! so a slow database does not let their claims expire; being fenced, a
//! retried write can never touch a later delivery. When every handler is
//! done the channel closes and the completer writes what is left, then
//! ends.
//!
//! **Connections kept while acknowledgements keep coming.** The writes run
//! on [`Kept`] ([`pgmq_client::KeptConnections`], whose docs say why): up
//! to `ack_flushers` connections kept from one write to the next while the
//! completer has more to write, all given back when the ack channel runs
//! empty, before it waits.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use pgmq_client::{DeadLetter, Pgmq, QueueName, Receipt, Requeue};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use futures::FutureExt;
use tokio::task::JoinHandle;

use crate::backoff::ErrorBackoff;
use crate::db::{Kept, Source};
use crate::handoff::{self, Handoff};
use crate::health::HealthState;
use crate::heartbeat::HeartbeatSignals;
use crate::lease::Leases;
use crate::lease::State;
use crate::protocol::{archived_dead_letter_headers, retry_headers, ATTEMPTS_HEADER};
use crate::stats::{bump, Counters, Stats};
use crate::supervise::PanicOnce;
use crate::wake::Wake;

/// What the completer reads.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub queue: QueueName,
    pub dead_letter_queue: Option<QueueName>,
    /// The ack channel's size.
    pub ack_capacity: usize,
    pub ack_batch_size: usize,
    pub ack_flushers: usize,
    pub ack_flush_interval: Duration,
    pub ack_retry_timeout: Duration,
    pub db_timeout: Duration,
    /// Wake the claimers after each batch (group-ordered claims: a group's
    /// next message is claimable once its head is gone).
    pub wake_claimers: bool,
    /// Test hook: successes acknowledged without the delivery fence.
    pub fence_off: FenceOff,
}

/// The `fence_off` test hook (feature `fault-injection`): successes
/// acknowledged without the delivery fence, to prove that the fence is
/// what keeps a stale delivery's acknowledgement out. Without the feature
/// it holds nothing, and every acknowledgement is fenced.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FenceOff(#[cfg(feature = "fault-injection")] pub(crate) bool);

impl FenceOff {
    /// Whether successes are acknowledged without the fence.
    pub(crate) fn unfenced(self) -> bool {
        #[cfg(feature = "fault-injection")]
        if self.0 {
            return true;
        }
        false
    }
}

/// The completer: its settings and the handles it touches.
pub(crate) struct Completer {
    pub settings: Settings,
    pub source: Source,
    pub stats: Arc<Stats>,
    pub leases: Arc<Leases>,
    pub heartbeat: Arc<HeartbeatSignals>,
    pub health: Arc<HealthState>,
    pub wake: Wake,
    pub panic_once: Arc<PanicOnce>,
    /// Under a fleet-wide limit of places: the claim loops' offer to carry
    /// the deletes with their next claim ([`crate::handoff`]).
    pub handoff: Option<Arc<Handoff>>,
}

/// The ack channel, of `ack_capacity`.
pub(crate) fn channel(settings: &Settings) -> (mpsc::Sender<Ack>, mpsc::Receiver<Ack>) {
    mpsc::channel(settings.ack_capacity)
}

/// Starts the completer. It is not restartable (it owns the
/// acknowledgements in flight): if it panics, the worker stops with an
/// error.
pub(crate) fn spawn(
    part: Completer,
    acks: mpsc::Receiver<Ack>,
    close: Arc<Close>,
) -> JoinHandle<()> {
    let health = Arc::clone(&part.health);
    let run = run(part, acks, close);
    tokio::spawn(async move {
        if let Err(p) = std::panic::AssertUnwindSafe(run).catch_unwind().await {
            let why = format!(
                "the completer panicked: {}",
                crate::handler::panic_text(&*p)
            );
            tracing::error!("{why}; stopping the worker");
            health.fail(why);
        }
    })
}

/// How often a partial batch looks for more acknowledgements.
const GATHER_TICK: Duration = Duration::from_millis(1);

/// One message's acknowledgement.
#[derive(Debug)]
pub(crate) struct Ack {
    /// The delivery it acknowledges.
    pub receipt: Receipt,
    /// The attempt that ran (1-based).
    pub attempt: u32,
    /// Its delivery count (`read_ct`) when handled.
    pub deliveries: u32,
    pub kind: AckKind,
}

/// What to write for a message.
#[derive(Debug)]
pub(crate) enum AckKind {
    Delete,
    Archive,
    /// Visible again after the delay, the attempt recorded in its headers.
    Retry(Duration),
    /// Visible again after the delay, the read undone, no attempt used.
    Snooze(Duration),
    DeadLetter {
        reason: String,
    },
    /// Give it back unstarted, the read undone.
    Release,
}

/// The shutdown's word to the completer: close the channel and drain, and
/// stop retrying failed writes at the drain's deadline.
pub(crate) struct Close {
    /// Cancelled to close (also when the running worker is dropped: then
    /// with no deadline).
    token: CancellationToken,
    deadline: OnceLock<Instant>,
}

impl Close {
    pub(crate) fn new(token: CancellationToken) -> Self {
        Close {
            token,
            deadline: OnceLock::new(),
        }
    }

    /// Closes the channel; retries of failed writes stop at `deadline`.
    pub(crate) fn close(&self, deadline: Instant) {
        let _ = self.deadline.set(deadline);
        self.token.cancel();
    }

    /// When retries of failed writes must stop, once closing.
    fn deadline(&self) -> Option<Instant> {
        self.deadline.get().copied()
    }
}

/// What every batch's write needs: the completer's settings and handles,
/// the connections kept between writes, and the close signal's deadline.
struct Writer {
    part: Completer,
    kept: Kept,
    close: Arc<Close>,
}

/// Runs until the channel is closed (every sender dropped, or `close`
/// given) and every batch is written.
async fn run(part: Completer, mut rx: mpsc::Receiver<Ack>, close: Arc<Close>) {
    part.panic_once.maybe_panic("completer");
    let cfg = part.settings.clone();
    let batch = cfg.ack_batch_size;
    let kept = Kept::new(part.source.clone(), cfg.ack_flushers, cfg.db_timeout);
    let closing = close.token.clone();
    let writer = Arc::new(Writer { part, kept, close });
    let kept = &writer.kept;
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
        flushes.spawn(flush(Arc::clone(&writer), buf));
    }
    while flushes.join_next().await.is_some() {}
    kept.idle();
}

/// What one fenced write did: the ids it wrote, and whether an earlier try
/// of it may have written some others (its outcome was unknown).
struct Written {
    ids: Vec<i64>,
    ambiguous: bool,
}

impl Written {
    /// The ids of `asked` this write did not match: claims lost to another
    /// delivery, unless an earlier try had an unknown outcome (that try may
    /// have written them; [`Writer::removed`] tells them apart).
    fn unmatched(&self, asked: &[Receipt]) -> Vec<i64> {
        if self.ids.len() >= asked.len() {
            return Vec::new();
        }
        let wrote: std::collections::HashSet<i64> = self.ids.iter().copied().collect();
        asked
            .iter()
            .map(|r| r.msg_id)
            .filter(|id| !wrote.contains(id))
            .collect()
    }
}

/// One batch, sorted by the write each acknowledgement needs.
#[derive(Default)]
struct Sorted<'c> {
    deletes: Vec<Receipt>,
    archives: Vec<Receipt>,
    /// Retries, snoozes and releases, each with the counter it counts in.
    requeues: Vec<(Requeue, &'c AtomicU64)>,
    dead: Vec<DeadLetter>,
}

impl<'c> Sorted<'c> {
    fn new(acks: Vec<Ack>, c: &'c Counters) -> Self {
        let mut batch = Sorted::default();
        for ack in acks {
            let r = ack.receipt;
            match ack.kind {
                AckKind::Delete => batch.deletes.push(r),
                AckKind::Archive => batch.archives.push(r),
                AckKind::Retry(d) => batch.requeues.push((
                    Requeue::new(r, d).merge_headers(retry_headers(ack.attempt)),
                    &c.retried,
                )),
                AckKind::Snooze(d) => batch
                    .requeues
                    .push((Requeue::new(r, d).undo_read(), &c.snoozed)),
                AckKind::Release => batch.requeues.push((
                    Requeue::new(r, Duration::ZERO).undo_read(),
                    &c.expired_released,
                )),
                AckKind::DeadLetter { reason } => batch.dead.push(
                    DeadLetter::new(r, reason)
                        .attempts(ack.attempt)
                        .deliveries(ack.deliveries),
                ),
            }
        }
        batch
    }
}

/// Writes one batch: deletes, archives, requeues, dead letters; then drops
/// the batch's leases and counts the claims found lost.
#[tracing::instrument(name = "pgmq_worker.flush", level = "debug", skip_all, fields(acks = acks.len()))]
async fn flush(w: Arc<Writer>, acks: Vec<Ack>) {
    let part = &w.part;
    let all: Vec<Receipt> = acks.iter().map(|a| a.receipt).collect();
    let mut batch = Sorted::new(acks, &part.stats.c);
    if !batch.requeues.is_empty() {
        // These set the visibility themselves: the heartbeat stops extending
        // them, and any extension already on its way lands first.
        part.leases.set_state(
            batch.requeues.iter().map(|(r, _)| r.receipt),
            State::Settling,
        );
        part.heartbeat.after_write().await;
    }
    let mut lost = Vec::new();
    let carried = w.delete(&mut batch.deletes, &mut lost).await;
    w.archive(&batch.archives, &mut lost).await;
    w.requeue(&batch.requeues, &mut lost).await;
    w.dead_letter(&batch.dead, &mut lost).await;
    // Deletes a claim read carried freed no place that read did not take.
    let freed = !carried
        || !batch.archives.is_empty()
        || !batch.requeues.is_empty()
        || !batch.dead.is_empty();
    w.finish(all, lost, freed);
}

impl Writer {
    /// The fenced delete, in ascending ids (the deletes walk the primary
    /// key in order); true when a claim read carried it ([`crate::handoff`]).
    async fn delete(&self, deletes: &mut [Receipt], lost: &mut Vec<i64>) -> bool {
        if deletes.is_empty() {
            return false;
        }
        deletes.sort_unstable_by_key(|r| r.msg_id);
        let deletes = &*deletes;
        let mut unknown = false;
        if let Some(h) = &self.part.handoff {
            match h.offer(deletes).await {
                Some(handoff::Outcome::Written(ids)) => {
                    self.part.health.ack_ok();
                    let written = Some(Written {
                        ids,
                        ambiguous: false,
                    });
                    self.note(written, deletes, &self.part.stats.c.deleted, lost)
                        .await;
                    return true;
                }
                // Written here instead; after an unknown outcome, what the
                // write no longer matches is looked up.
                Some(handoff::Outcome::Failed { unknown: u }) => unknown = u,
                None => {}
            }
        }
        let pg = Pgmq::on(&self.kept);
        let mut written = self
            .write("delete", deletes.len(), || {
                acknowledge(
                    &pg,
                    &self.part.settings.queue,
                    self.part.settings.fence_off.unfenced(),
                    false,
                    deletes,
                )
            })
            .await;
        if let Some(w) = &mut written {
            w.ambiguous |= unknown;
        }
        self.note(written, deletes, &self.part.stats.c.deleted, lost)
            .await;
        false
    }

    /// The fenced archive.
    async fn archive(&self, archives: &[Receipt], lost: &mut Vec<i64>) {
        if archives.is_empty() {
            return;
        }
        let pg = Pgmq::on(&self.kept);
        let written = self
            .write("archive", archives.len(), || {
                acknowledge(
                    &pg,
                    &self.part.settings.queue,
                    self.part.settings.fence_off.unfenced(),
                    true,
                    archives,
                )
            })
            .await;
        self.note(written, archives, &self.part.stats.c.archived, lost)
            .await;
    }

    /// One fenced requeue for retries, snoozes and releases, each one
    /// written counted in its own counter.
    async fn requeue(&self, requeues: &[(Requeue, &AtomicU64)], lost: &mut Vec<i64>) {
        if requeues.is_empty() {
            return;
        }
        let (pg, q) = (Pgmq::on(&self.kept), &self.part.settings.queue);
        let items: Vec<Requeue> = requeues.iter().map(|(r, _)| r.clone()).collect();
        let asked: Vec<Receipt> = items.iter().map(|r| r.receipt).collect();
        let Some(written) = self
            .write("requeue", items.len(), || pg.requeue_fenced(q, &items))
            .await
        else {
            return;
        };
        let wrote: std::collections::HashSet<i64> = written.ids.iter().copied().collect();
        for (r, counter) in requeues {
            if wrote.contains(&r.receipt.msg_id) {
                bump(counter, 1);
            }
        }
        if !written.ambiguous {
            lost.extend(written.unmatched(&asked));
        }
    }

    /// The dead letters, moved in one statement ([`dead_letter`]).
    async fn dead_letter(&self, dead: &[DeadLetter], lost: &mut Vec<i64>) {
        if dead.is_empty() {
            return;
        }
        let asked: Vec<Receipt> = dead.iter().map(|d| d.receipt).collect();
        let written = self
            .write("dead-letter", dead.len(), || {
                dead_letter(&self.part.settings, &self.kept, dead)
            })
            .await;
        self.note(written, &asked, &self.part.stats.c.dead_lettered, lost)
            .await;
    }

    /// Counts what a terminal write (delete, archive, dead-letter move) of
    /// `asked` wrote in `done`, and adds the claims it found lost to `lost`:
    /// what it did not match, or, after a try with an unknown outcome, what
    /// it did not match and is still in the queue table ([`Self::removed`]).
    async fn note(
        &self,
        written: Option<Written>,
        asked: &[Receipt],
        done: &AtomicU64,
        lost: &mut Vec<i64>,
    ) {
        let Some(w) = written else { return };
        bump(done, w.ids.len() as u64);
        let unmatched = w.unmatched(asked);
        if unmatched.is_empty() {
            return;
        }
        if !w.ambiguous {
            lost.extend(unmatched);
            return;
        }
        match self.still_queued(&unmatched).await {
            Some(present) => {
                bump(done, (unmatched.len() - present.len()) as u64);
                lost.extend(present);
            }
            None => tracing::warn!(
                queue = %self.part.settings.queue, messages = unmatched.len(),
                "could not tell whether an acknowledgement with an unknown outcome was written or its claims were lost; counted neither way"
            ),
        }
    }

    /// Which of `ids` are still rows of the queue table
    /// ([`Pgmq::still_queued`]), asked within the acknowledgement's retry
    /// time; None when that cannot be known.
    async fn still_queued(&self, ids: &[i64]) -> Option<Vec<i64>> {
        let (pg, q) = (Pgmq::on(&self.kept), &self.part.settings.queue);
        self.retrying(|| pg.still_queued(q, ids), |_, _| {}).await
    }

    /// The batch is written: drops its leases, counts its lost claims (not
    /// those the heartbeat already reported), and with group-ordered claims
    /// or under a limit wakes the claimers, when `freed` says the batch
    /// freed something no claim took yet.
    fn finish(&self, all: Vec<Receipt>, mut lost: Vec<i64>, freed: bool) {
        let part = &self.part;
        let n = all.len() as u64;
        let already = part.leases.finish(all);
        lost.retain(|id| !already.contains(id));
        if !lost.is_empty() {
            bump(&part.stats.c.claims_lost, lost.len() as u64);
            for id in &lost {
                tracing::warn!(queue = %part.settings.queue, msg_id = id, "claim lost: the message was delivered again since this worker claimed it; its outcome was not written here");
            }
        }
        bump(&part.stats.acks_resolved, n);
        if part.settings.wake_claimers && freed {
            // The groups' next messages (the places) are claimable now.
            part.wake.wake();
        }
    }

    /// Runs `call` until it succeeds, fails permanently, or the retry time
    /// runs out (`ack_retry_timeout`, or the shutdown's drain deadline when
    /// sooner); returns what it wrote (None when given up, counted in
    /// `acks_failed`).
    async fn write<F, Fut>(&self, what: &'static str, count: usize, call: F) -> Option<Written>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Vec<i64>, pgmq_client::Error>>,
    {
        let part = &self.part;
        let mut ambiguous = false;
        let ids = self
            .retrying(call, |e, retry_in| {
                part.health.ack_failed();
                ambiguous |= e.outcome() == pgmq_client::CommitOutcome::Unknown;
                match retry_in {
                    Some(delay) => {
                        bump(&part.stats.c.ack_retries, 1);
                        tracing::warn!(error = %e, messages = count, action = what, retry_in = ?delay, "acknowledgement failed; retrying");
                    }
                    None => {
                        bump(&part.stats.c.acks_failed, count as u64);
                        tracing::error!(
                            error = %e, messages = count, action = what,
                            "acknowledgement given up; the messages come back after their visibility timeout"
                        );
                    }
                }
            })
            .await?;
        part.health.ack_ok();
        Some(Written { ids, ambiguous })
    }

    /// Runs `call` until it succeeds (its result), fails permanently or the
    /// retry time runs out (None): `ack_retry_timeout`, or the shutdown's
    /// drain deadline when sooner, with backoff between tries. `failed` sees
    /// each error with the delay before the next try, or None when it was
    /// the last.
    async fn retrying<T, F, Fut>(
        &self,
        mut call: F,
        mut failed: impl FnMut(&pgmq_client::Error, Option<Duration>),
    ) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, pgmq_client::Error>>,
    {
        let give_up = Instant::now() + self.part.settings.ack_retry_timeout;
        let mut backoff = ErrorBackoff::new(Duration::from_millis(50), Duration::from_secs(2));
        loop {
            match call().await {
                Ok(v) => return Some(v),
                Err(e) => {
                    let delay = backoff.next_delay();
                    let deadline = self.close.deadline().map_or(give_up, |d| d.min(give_up));
                    if !e.is_transient() || Instant::now() + delay >= deadline {
                        failed(&e, None);
                        return None;
                    }
                    failed(&e, Some(delay));
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }
}

/// Moves messages to the dead-letter queue in one statement, fenced
/// ([`Pgmq::dead_letter_fenced`]), with headers `{reason, attempts,
/// deliveries, source_queue, original_msg_id, original_headers}`. The one
/// header the worker itself wrote into them, [`ATTEMPTS_HEADER`], is left
/// out of `original_headers`: a dead letter sent back with its original
/// headers (`pgmq redrive`) starts again with all of `max_attempts`.
/// Without a dead-letter queue, or when it no longer exists (dropped while
/// the worker runs), they are archived instead, with
/// `{"dead_letter_reason": reason, "attempts": n}` merged into their
/// headers, so that a missing queue never sends them round again.
async fn dead_letter(
    cfg: &Settings,
    kept: &Kept,
    dead: &[DeadLetter],
) -> Result<Vec<i64>, pgmq_client::Error> {
    for d in dead {
        tracing::warn!(msg_id = d.receipt.msg_id, attempts = d.attempts, reason = %d.reason, queue = %cfg.queue, "dead-lettering");
    }
    let Some(dlq) = &cfg.dead_letter_queue else {
        return archive_dead(kept, &cfg.queue, dead).await;
    };
    let dead = newest_per_id(dead);
    match Pgmq::on(kept)
        .dead_letter_fenced(&cfg.queue, dlq, &dead, &[ATTEMPTS_HEADER])
        .await
    {
        Err(e) if names_missing_table(&e, dlq) => {
            tracing::error!(queue = %cfg.queue, dead_letter_queue = %dlq, "the dead-letter queue does not exist (dropped?): archiving dead letters with their reason instead");
            archive_dead(kept, &cfg.queue, &dead).await
        }
        res => res,
    }
}

/// One dead letter per message id, whatever the batch holds (the move
/// sends one copy per delivery it is given): of two deliveries of one
/// message that meet in a batch (the first one's claim expired and the
/// message was read again), the newest, the only one whose fence can still
/// match.
fn newest_per_id(dead: &[DeadLetter]) -> Vec<DeadLetter> {
    let mut newest: std::collections::HashMap<i64, &DeadLetter> =
        std::collections::HashMap::with_capacity(dead.len());
    for d in dead {
        newest
            .entry(d.receipt.msg_id)
            .and_modify(|kept| {
                if d.receipt.read_at > kept.receipt.read_at {
                    *kept = d;
                }
            })
            .or_insert(d);
    }
    // In batch order, as the move sends them.
    dead.iter()
        .filter(|d| {
            newest
                .get(&d.receipt.msg_id)
                .is_some_and(|n| std::ptr::eq(*n, *d))
        })
        .cloned()
        .collect()
}

/// Whether `e` says that `queue` does not exist (the dead-letter move
/// names the missing queue, the source or the dead-letter queue).
fn names_missing_table(e: &pgmq_client::Error, queue: &QueueName) -> bool {
    matches!(e, pgmq_client::Error::QueueNotFound { queue: q } if q == queue.as_str())
}

/// The fenced delete (or with `archive`, archive) of a success's
/// deliveries on `pg`; returns the ids written. `unfenced` (only ever true
/// with the `fence_off` test hook of feature `fault-injection`) writes by
/// message id alone.
pub(crate) async fn acknowledge<E: pgmq_client::Executor>(
    pg: &Pgmq<E>,
    queue: &QueueName,
    unfenced: bool,
    archive: bool,
    receipts: &[Receipt],
) -> Result<Vec<i64>, pgmq_client::Error> {
    if unfenced {
        let ids: Vec<i64> = receipts.iter().map(|r| r.msg_id).collect();
        return if archive {
            pg.archive_batch(queue, &ids).await
        } else {
            pg.delete_batch(queue, &ids).await
        };
    }
    if archive {
        pg.archive_fenced(queue, receipts).await
    } else {
        pg.delete_fenced(queue, receipts).await
    }
}

/// Archives dead letters (fenced), their reason merged into their headers.
async fn archive_dead(
    kept: &Kept,
    queue: &QueueName,
    dead: &[DeadLetter],
) -> Result<Vec<i64>, pgmq_client::Error> {
    let items: Vec<(Receipt, Option<serde_json::Value>)> = dead
        .iter()
        .map(|d| {
            (
                d.receipt,
                Some(archived_dead_letter_headers(&d.reason, d.attempts)),
            )
        })
        .collect();
    Pgmq::on(kept)
        .archive_fenced_with_headers(queue, &items)
        .await
}
