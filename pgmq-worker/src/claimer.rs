//! Reads batches into the bounded claim queue.
//!
//! `claimers` loops (2 by default) run at once, each with one claim read in
//! flight, so the next claim never waits for the previous one, nor for any
//! acknowledgement. They share the free room of the claim queue through a
//! semaphore of `claim_capacity` permits that the claim queue owns
//! ([`Room`](crate::claim_queue::Room)): a loop takes up to `batch_size`
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
//! than a few milliseconds the limit is simply `claim_capacity`. With a batch
//! handler the average is its run time per message, and the floor is
//! `concurrency` full batches (`concurrency * batch max`), so that every
//! batch loop can fill its batch.
//!
//! **One connection per loop while the backlog lasts.** A loop keeps the
//! pooled connection of its last read for the next one ([`Kept`], as the
//! completer does), as long as it reads
//! back to back: a pool checkout per read is client work and a hand-off
//! between tasks that a busy claim path pays on every batch. The connection
//! goes back to the pool before the loop waits for anything else (room in
//! the claim queue, the poll timer, a wake-up) and after any failed read, so
//! an idle or blocked worker holds no connection and a small pool cannot
//! deadlock the acknowledgements behind the claims.
//!
//! **Bounded reads.** Each read (and the checkout before it) runs within
//! `db_timeout`; one that does not answer marks its connection broken, so
//! the pool discards it, and the loop backs off and reads on a new one. A
//! half-open connection therefore stalls one read, never the worker.
//!
//! **Reads that skip the deleted head.** Every message deleted since the
//! last VACUUM leaves a dead entry at the head of the queue's primary key,
//! and `pgmq.read` walks over all of them on every call: the walk grows
//! with every delete until VACUUM, and on a long draining backlog costs
//! more than the rest of the read. So
//! by default ([`ClaimReads::Bounded`]) the
//! loops read with a statement on the queue table that starts after the
//! highest `msg_id` any loop has read ([`Cursor`], shared by the loops), or
//! after the queue's claim frontier when that is higher
//! ([`ReadFrom::AfterFrontier`]: the highest `msg_id` among the newest
//! claims of any worker, one descent of the `vt` index in the same
//! statement). A worker sharing its queue with others would otherwise walk
//! over every row they claimed since its own last read, a heap fetch each
//! that fails the visibility test: about N - 1 batches per read with N
//! workers draining one backlog. The frontier only ever passes claimed
//! rows, so it skips nothing the worker's own bound would not have
//! skipped once the others' claims moved it. Messages below that bound that are
//! visible again (a retry, an expired claim, a row whose sending
//! transaction committed late) are found by a read from the start, made
//! when one is due ([`Cursor::plan`]): periodically (once per
//! `poll_interval` for a worker alone on its queue; see below for a fleet),
//! after any bounded read that came back short (the tail is drained: only
//! a read from the start can tell whether the queue is), and again at once
//! while reads from the start come back full below the bound (a backlog of
//! old messages is drained before the tail). Only a short read from the
//! start parks a loop. The statement needs the queue table's layout, checked
//! at start; without it the loops call `pgmq.read`.
//!
//! **A fleet reads from the start about as often as one worker.** A read
//! from the start walks every row below the bound that is claimed (by any
//! worker) or deleted and not yet vacuumed, so its cost grows with the
//! number of workers on the queue; if each of N workers made one per
//! interval, the database would pay about N² such walks. Each worker
//! therefore estimates how many share its queue from its own reads (the
//! `msg_id`s its bound moved over, per message it claimed:
//! [`Cursor::fleet_factor`]) and stretches its periodic interval by that
//! factor, at most 16 times. A message that becomes visible below the bound
//! while a backlog lasts is then claimed within about `poll_interval` by
//! one of the fleet, and within 16 `poll_interval`s at worst.
//!
//! **A fleet runs about as many claim loops as one worker.** The reads of
//! all workers on a queue start at the same frontier, and `FOR UPDATE SKIP
//! LOCKED` passes over the rows that every other read still in flight has
//! locked, one heap fetch and lock test each: a read's walk grows with the
//! number of reads in flight on the queue, not with what it returns, and on
//! a database with few cores reads beyond a couple in flight only wait for
//! CPU there. So a worker that sees others on its queue (the estimate
//! above, taken at each read from the start, and raised as soon as the
//! reads since then have claimed [`FLEET_SAMPLE`] messages: a fleet that
//! starts together on a backlog would otherwise run every loop until its
//! first read from the start, which the estimate itself puts off) runs
//! only `claimers` divided by that number of its loops, rounded up, at
//! least one
//! ([`Cursor::reading_loops`]); the others stand down, looking again once
//! per `poll_interval`, and read again when the estimate falls (the other
//! workers left) or when no loop of the worker started a read for two
//! poll intervals (the reading loop is stuck on a connection). Under a
//! fleet-wide limit of places every loop reads: `pgmq_sdk.read_limited`
//! locks the places it takes, never the queue, so the reads of a fleet run
//! side by side. Under a fleet-wide rate limit one loop reads, whatever the
//! estimate: the limited reads of a queue take turns on its token bucket,
//! and a wake-up that arrives during the read makes that loop read again at
//! once. Under a limit per key every loop reads through
//! `pgmq_sdk.read_key_limited`, which locks keys, never the queue.
//!
//! **A fleet's reads in flight start past each other.** The loops left
//! still read at one frontier, each process's own, and pass over the
//! batches the other processes' reads in flight are locking. So while a
//! backlog lasts (the last read after the bound was full) and others are
//! seen on the queue, a read takes its range of `msg_id`s from the
//! queue's claim cursor in the `pgmq_sdk` schema ([`ReadFrom::Ranged`]):
//! the cursor moves on by a batch with every range taken, so reads in
//! flight at once start at different places. The cursor is a hint: a
//! range starts no lower than the loops' own bound, a short read pulls
//! the cursor back to where it ended, and what a range passed over is
//! below the bound like anything else, found by the reads from the start.
//! A worker alone, or one following the tail, reads after the frontier;
//! without the schema (version 8) the loops say so once and read after
//! the frontier from then on.
//!
//! After a full read a loop reads again at once. After a short or empty read
//! it parks until a wake-up arrives or its own poll timer fires. Every loop
//! keeps its own timer, so that no single loop (stuck on a connection, say)
//! can stop the polling; a loop whose timer fires skips the read when
//! another loop started one less than a poll interval ago, so an idle worker
//! still polls about once per interval whatever the number of loops. Once
//! shutdown begins no loop starts a new read, nor once the queue is seen
//! paused ([`crate::pause`]): a loop looks at the pause flag right before
//! every read, after whatever it waited for (room, a priority grant, its
//! timer), and a wait for room or for a grant ends when the pause is seen. A wake-up is a notification from the
//! notifier, or any loop reading a full batch (the backlog is back). Wake-ups
//! are a counter in a watch channel, marked seen just before each read: one
//! that arrives during a read makes the loop read again instead of parking,
//! so none is lost.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgmq_client::{FleetLimit, Message, Pgmq, RawJson, ReadFrom, ReadOptions, Receipt};
use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::backoff::ErrorBackoff;
use crate::claim_queue::{ClaimQueue, Claimed};
use crate::db::Kept;
use crate::db::Source;
use crate::health::HealthState;
use crate::pause::Paused;
use crate::stats::{bump, micros, LocalHistograms, Stats};
use crate::supervise::{PanicOnce, Supervisor};
use crate::wake::Wake;

/// What the claim loops read.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub queue: pgmq_client::QueueName,
    /// How many claim loops run.
    pub claimers: usize,
    pub batch_size: usize,
    pub claim_capacity: usize,
    /// The number of handler loops (the floor of the claim limit).
    pub concurrency: usize,
    /// The most messages one handler run takes: a batch handler's batch
    /// size, 1 otherwise (the floor is `concurrency` runs of it).
    pub run_size: usize,
    pub visibility_timeout: Duration,
    pub poll_interval: Duration,
    pub db_timeout: Duration,
    /// The fleet-wide limit the reads take part in (None: none).
    pub fleet_limit: Option<FleetLimit>,
    /// The limit per key the reads take part in (None: none).
    pub key_limit: Option<pgmq_client::KeyLimit>,
    /// Test hook: reads from the start take a range once one was taken.
    #[cfg(feature = "fault-injection")]
    pub cursor_fence: bool,
    /// Test hook: reads that carry acknowledgements claim without places.
    #[cfg(feature = "fault-injection")]
    pub handoff_unplaced: bool,
}

/// The claim loops: their settings, their shared cursor, and the handles
/// they touch.
pub(crate) struct Claimer {
    pub settings: Settings,
    pub claims: Claims,
    pub source: Source,
    pub queue: Arc<ClaimQueue<Claimed>>,
    pub wake: Wake,
    pub stats: Arc<Stats>,
    pub health: Arc<HealthState>,
    pub panic_once: Arc<PanicOnce>,
    /// Whether the queue is paused for the fleet ([`crate::pause`]).
    pub paused: Arc<Paused>,
    /// In a prioritized group: the policy's say on how much to claim.
    pub share: Option<crate::priority::Share>,
    /// Under a fleet-wide limit of places: deletes the completer offers
    /// to carry with the next limited read ([`crate::handoff`]).
    pub handoff: Option<Arc<crate::handoff::Handoff>>,
}

/// Starts the `claimers` supervised claim loops; they run until `stop`.
pub(crate) fn spawn(
    part: Claimer,
    supervisor: &Supervisor,
    stop: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    let part = Arc::new(part);
    (0..part.settings.claimers)
        .map(|i| {
            let (part, stop) = (Arc::clone(&part), stop.clone());
            supervisor.spawn("claim loop", move || {
                run(Arc::clone(&part), i, stop.clone())
            })
        })
        .collect()
}

/// How the claimers read the queue. The default suits every queue; the
/// others exist for PGMQ installations this crate does not know and for
/// comparing the paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ClaimReads {
    /// A statement on the queue table ([`Pgmq::read_from`]) that continues
    /// after the highest `msg_id` the claimers have read (or after the
    /// queue's claim frontier when other workers claimed past it), so that
    /// a read walks neither over the deleted head of a draining queue nor
    /// over the rows other workers claimed, with reads
    /// from the start once per `poll_interval` (stretched by the number of
    /// workers it sees sharing the queue, at most 16 times, so that a fleet
    /// makes about as many as one worker) and whenever a
    /// bounded read comes back short (see the crate docs for the ordering
    /// this gives). Falls back to [`Function`](Self::Function) when the
    /// queue table's layout could not be checked at start (`check_queue`
    /// off, a transient error) or the PGMQ version is not one this crate knows.
    ///
    /// [`Pgmq::read_from`]: pgmq_client::Pgmq::read_from
    #[default]
    Bounded,
    /// The same statement, always from the start (as `pgmq.read` scans).
    FromStart,
    /// PGMQ's `pgmq.read` function.
    Function,
    /// Group-ordered (FIFO groups, PGMQ 1.13's `x-pgmq-group` header):
    /// `pgmq.read_grouped_head`, which claims only the oldest message of
    /// each group, and only while it is visible. Messages of one group are
    /// therefore handled one at a time in `msg_id` order, different groups
    /// in parallel up to `concurrency`, and a group's next message is
    /// claimed only once its head was deleted or archived: a retried,
    /// snoozed or running head holds the rest of its group back. Messages
    /// without the header form one group of their own. Create the FIFO
    /// index (`Pgmq::create_fifo_index`) on busy queues.
    FifoGroups,
}

/// The claim loops' shared state: their read cursor and the clock of
/// their read times.
pub(crate) struct Claims {
    /// How the claim loops read, and their shared bound on `msg_id`.
    pub cursor: Cursor,
    /// When the last read started ([`now_us`](Self::now_us)): idle loops
    /// skip a poll that another loop just made.
    pub last_read_start_us: AtomicU64,
    /// The origin of the loops' read times.
    epoch: Instant,
}

impl Claims {
    pub(crate) fn new(path: ReadPath) -> Self {
        Claims {
            cursor: Cursor::new(path),
            last_read_start_us: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Now, in µs since these claims began: the clock of the loops' read
    /// times, which they keep in atomics.
    pub(crate) fn now_us(&self) -> u64 {
        micros(self.epoch.elapsed())
    }
}

/// How a claim loop reads (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadPath {
    /// `pgmq.read`.
    Function,
    /// `pgmq.read_grouped_head`: one message per FIFO group, its head.
    Grouped,
    /// The table statement, always from the start.
    FromStart,
    /// The table statement after [`Cursor`]'s bound, from the start when due.
    Bounded,
    /// `pgmq_sdk.read_limited`: `pgmq.read` under the fleet-wide limit.
    Limited,
    /// `pgmq_sdk.read_key_limited`: claims under the limit per key.
    KeyLimited,
}

/// One read to make: where it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    Function,
    Grouped,
    Limited,
    KeyLimited,
    Table(ReadFrom),
}

/// The most a worker stretches its interval between reads from the start
/// for the other workers on its queue (see [`Cursor::fleet_factor`]): it
/// bounds how long a message that became visible below the bound waits
/// while a backlog lasts, whatever the share estimate says.
const MAX_FLEET_FACTOR: u64 = 16;

/// How many messages a window of reads since the last read from the start
/// must have claimed before its share estimate may raise the number of
/// workers seen ([`Cursor::done`]): a few full batches, so that one read
/// that happened to follow another worker's does not halve the loops.
const FLEET_SAMPLE: u64 = 400;

/// The claim loops' shared lower bound on `msg_id` and when a read from the
/// start is due (see the module docs).
pub(crate) struct Cursor {
    path: ReadPath,
    /// The highest `msg_id` read so far; 0 before the first message.
    after: AtomicI64,
    /// When the last read from the start began ([`Claims::now_us`]).
    last_start_us: AtomicU64,
    /// A read from the start is due now.
    start_due: AtomicBool,
    /// `after` when the last read from the start was planned.
    after_at_start: AtomicI64,
    /// Messages these loops claimed since the last read from the start.
    claimed_since_start: AtomicU64,
    /// How many workers share the queue, as last seen:
    /// [`fleet_factor`](Self::fleet_factor) when the last read from the
    /// start was planned after claims (1 until then).
    fleet: AtomicU64,
    /// The last read after a bound came back full: a backlog lasts.
    backlog: AtomicBool,
    /// Ranged reads may be made: false once the `pgmq_sdk` schema was
    /// found missing (or not to be trusted) for them.
    ranges: AtomicBool,
}

impl Cursor {
    pub(crate) fn new(path: ReadPath) -> Self {
        Cursor {
            path,
            after: AtomicI64::new(0),
            last_start_us: AtomicU64::new(0),
            start_due: AtomicBool::new(false),
            after_at_start: AtomicI64::new(0),
            claimed_since_start: AtomicU64::new(0),
            fleet: AtomicU64::new(1),
            backlog: AtomicBool::new(false),
            ranges: AtomicBool::new(true),
        }
    }

    /// Where the next read starts, at `now_us`; a read from the start
    /// marks itself made, so that concurrent loops do not all make one.
    fn plan(&self, now_us: u64, interval_us: u64) -> Plan {
        match self.path {
            ReadPath::Function => return Plan::Function,
            ReadPath::Grouped => return Plan::Grouped,
            ReadPath::Limited => return Plan::Limited,
            ReadPath::KeyLimited => return Plan::KeyLimited,
            ReadPath::FromStart => return Plan::Table(ReadFrom::Start),
            ReadPath::Bounded => {}
        }
        let after = self.after.load(Relaxed);
        let since = now_us.saturating_sub(self.last_start_us.load(Relaxed));
        let periodic = interval_us.saturating_mul(self.fleet_factor(after));
        if after == 0 || self.start_due.swap(false, Relaxed) || since >= periodic {
            if self.claimed_since_start.load(Relaxed) > 0 {
                self.fleet.store(self.fleet_factor(after), Relaxed);
            }
            self.last_start_us.store(now_us, Relaxed);
            self.after_at_start.store(after, Relaxed);
            self.claimed_since_start.store(0, Relaxed);
            return Plan::Table(ReadFrom::Start);
        }
        if self.ranged() {
            // Other workers read this backlog too: a range of its own from
            // the queue's claim cursor, past their reads in flight.
            return Plan::Table(ReadFrom::Ranged(after));
        }
        Plan::Table(ReadFrom::AfterFrontier(after))
    }

    /// Whether the next read after the bound takes a range from the
    /// queue's claim cursor: while a backlog lasts and other workers are
    /// seen on the queue (a worker alone needs no range: its loops share
    /// one bound), unless the schema was found missing for them.
    fn ranged(&self) -> bool {
        self.fleet.load(Relaxed) > 1 && self.backlog.load(Relaxed) && self.ranges.load(Relaxed)
    }

    /// Ranged reads are off from now on: the schema they need is missing
    /// or not to be trusted.
    fn ranges_off(&self) {
        self.ranges.store(false, Relaxed);
    }

    /// How many workers read this queue, as this one sees it: the `msg_id`s
    /// its bound moved over since the last read from the start, over the
    /// messages it claimed meanwhile (1 alone; about N when N workers drain
    /// one backlog, since the others claim the ids in between; rounded to
    /// the nearest), between 1 and [`MAX_FLEET_FACTOR`].
    ///
    /// The periodic read from the start is stretched by this factor, so that
    /// a fleet of N workers makes about one per `poll_interval` together, as
    /// one worker does, rather than N. It matters because such a read walks
    /// every claimed and deleted row below the bound, and the claimed ones
    /// are those of the whole fleet: N workers each reading from the start
    /// once per interval would cost the database about N² walks.
    fn fleet_factor(&self, after: i64) -> u64 {
        let spanned = after.saturating_sub(self.after_at_start.load(Relaxed));
        let claimed = self.claimed_since_start.load(Relaxed);
        match (u64::try_from(spanned), claimed) {
            (Ok(spanned), claimed) if claimed > 0 => {
                (spanned.saturating_add(claimed / 2) / claimed).clamp(1, MAX_FLEET_FACTOR)
            }
            _ => 1,
        }
    }

    /// How many of the worker's `claimers` loops read (see the module
    /// docs): `claimers` divided by the number of workers last seen on the
    /// queue, rounded up, at least 1, and under a fleet-wide rate limit 1;
    /// the others stand down meanwhile.
    fn reading_loops(&self, claimers: usize, rated: bool) -> usize {
        if rated {
            // Rate-limited reads of a queue take turns on its token
            // bucket: a second loop's read mostly waits for it to find no
            // token left.
            return 1;
        }
        let fleet = usize::try_from(self.fleet.load(Relaxed)).unwrap_or(1);
        claimers.div_ceil(fleet.max(1)).max(1)
    }

    /// Records a read made as `plan` that returned `n` of the `qty` messages
    /// asked for, the highest `msg_id` among them `top`; true when the queue
    /// may be drained (the loop may park): only a short read from the start
    /// (or by `pgmq.read`) says so.
    fn done(&self, plan: Plan, qty: usize, n: usize, top: i64) -> bool {
        let full = n >= qty;
        let Plan::Table(from) = plan else {
            return !full;
        };
        if self.path != ReadPath::Bounded {
            return !full;
        }
        let claimed = self.claimed_since_start.fetch_add(n as u64, Relaxed) + n as u64;
        let before = self.after.fetch_max(top, Relaxed);
        if !matches!(from, ReadFrom::Start) {
            self.backlog.store(full, Relaxed);
        }
        if claimed >= FLEET_SAMPLE
            && matches!(from, ReadFrom::AfterFrontier(_) | ReadFrom::Ranged(_))
        {
            // Enough of this window to see others: fewer loops read from
            // now on, rather than from the next read from the start (which
            // the estimate itself puts off).
            self.fleet
                .fetch_max(self.fleet_factor(before.max(top)), Relaxed);
        }
        match from {
            // A full batch entirely below the bound: older messages are
            // waiting; keep reading from the start until they are drained.
            ReadFrom::Start if full && top <= before => {
                self.start_due.store(true, Relaxed);
                false
            }
            ReadFrom::Start => !full,
            // A read after a bound came back short: the tail beyond the
            // bound is drained for now; whether the queue is, only a read
            // from the start can tell.
            _ if !full => {
                self.start_due.store(true, Relaxed);
                false
            }
            _ => false,
        }
    }
}

/// How many messages may wait in the claim queue now, at the handlers'
/// average run time `avg_us` (see the module docs).
fn claim_limit(cfg: &Settings, avg_us: u64) -> usize {
    let floor = cfg
        .concurrency
        .saturating_mul(cfg.run_size.max(1))
        .clamp(1, cfg.claim_capacity);
    if avg_us == 0 {
        return floor;
    }
    let budget_us = micros(cfg.visibility_timeout) / 4;
    let limit = (cfg.concurrency as u64).saturating_mul(budget_us) / avg_us;
    usize::try_from(limit)
        .unwrap_or(usize::MAX)
        .clamp(floor, cfg.claim_capacity)
}

/// One read of up to `qty` messages as `plan` says, on the loop's kept
/// connection (checked out first when there is none, or when the last one
/// broke), all within `db_timeout`.
async fn read(
    cfg: &Settings,
    kept: &Kept,
    qty: usize,
    plan: Plan,
) -> Result<Vec<Message<RawJson>>, pgmq_client::Error> {
    kept.busy();
    let pg = Pgmq::on(kept);
    let q = &cfg.queue;
    let opts = ReadOptions::new(cfg.visibility_timeout).qty(qty);
    match plan {
        Plan::Function => pg.read_with_raw(q, &opts).await,
        Plan::Grouped => {
            pg.read_grouped_raw(q, pgmq_client::GroupStrategy::Head, &opts)
                .await
        }
        Plan::Table(from) => pg.read_from_raw(q, from, &opts).await,
        Plan::Limited => {
            let limit = cfg.fleet_limit.unwrap_or_default();
            pg.read_limited_raw(q, &limit, &opts).await
        }
        Plan::KeyLimited => match &cfg.key_limit {
            Some(limit) => pg.read_key_limited_raw(q, limit, &opts).await,
            None => pg.read_with_raw(q, &opts).await,
        },
    }
}

/// One claim loop; runs until `stop`. A read in flight when `stop` fires is
/// finished and its messages queued, for the shutdown to release.
async fn run(part: Arc<Claimer>, index: usize, stop: CancellationToken) {
    part.panic_once.maybe_panic("claim loop");
    let mut lp = ClaimLoop::new(part, index);
    loop {
        if lp.part.paused.is_paused() {
            // Paused for the fleet: no read until resumed, no connection
            // held meanwhile, and in a prioritized group nothing held for
            // this queue.
            lp.kept.idle();
            if let Some(share) = &lp.part.share {
                share.pause();
            }
            if lp.part.paused.wait_resumed(&stop).await {
                break;
            }
            continue;
        }
        if lp.stands_down() {
            if lp.stand_down(&stop).await {
                break;
            }
            continue;
        }
        let permits = match lp.take_room(&stop).await {
            Room::Taken(p) => p,
            Room::Paused => continue,
            Room::Stopped => break,
        };
        if stop.is_cancelled() {
            // Shutdown began: no new read.
            break;
        }
        let qty = permits.num_permits();
        if lp.part.paused.is_paused() {
            // Seen once more after the waits for room and for a grant,
            // right before the read: no read starts once the pause is
            // seen. The room and the grant go back.
            if let Some(share) = &lp.part.share {
                share.forgo(qty);
            }
            drop(permits);
            continue;
        }
        let sent_at = Instant::now();
        let (plan, res) = lp.read(qty).await;
        if let Some(share) = &lp.part.share {
            // A short read after the bound ran out of the tail only; one
            // from the start follows at once.
            let tail = res.is_ok()
                && !matches!(
                    plan,
                    Plan::Table(ReadFrom::Start) | Plan::Function | Plan::Grouped
                );
            share.read(
                qty,
                res.as_ref().map_or(0, Vec::len),
                tail,
                res.is_ok().then(|| sent_at.elapsed()),
            );
        }
        let msgs = match res {
            Ok(msgs) => msgs,
            Err(e) => {
                drop(permits);
                if lp.read_failed(e, &stop).await {
                    break;
                }
                continue;
            }
        };
        match lp.enqueue(msgs, permits, plan, qty, sent_at) {
            After::ReadAgain => continue,
            After::Park => {}
            // Closed only when the worker is being torn down.
            After::Closed => return,
        }
        // Short read: the queue is drained for now, or the fleet is at its
        // limit. Park, without a connection.
        lp.kept.idle();
        if park(
            &lp.part,
            &mut lp.wake,
            &stop,
            park_interval(&lp.part.settings),
        )
        .await
        {
            break;
        }
    }
    lp.local.merge(&lp.part.stats, Instant::now());
}

/// What a claim loop's wait for room (and a grant) ended with.
enum Room {
    /// The permits of the room (and grant) to read with.
    Taken(OwnedSemaphorePermit),
    /// The queue was seen paused: nothing taken.
    Paused,
    /// `stop` fired, or the claim queue closed.
    Stopped,
}

/// What a claim loop does once a read's messages are queued.
enum After {
    /// The backlog is there, or only the tail ran out: read again at once.
    ReadAgain,
    /// The queue is drained for now.
    Park,
    /// The claim queue refused them: the worker is being torn down.
    Closed,
}

/// One claim loop's own state.
struct ClaimLoop {
    part: Arc<Claimer>,
    queue: Arc<ClaimQueue<Claimed>>,
    /// Which loop this is, for the logs.
    index: usize,
    /// The connection kept between back-to-back reads (see the module docs).
    kept: Kept,
    wake: watch::Receiver<u64>,
    backoff: ErrorBackoff,
    local: LocalHistograms,
    /// The most one read asks for.
    batch: usize,
    /// The least room a read waits for: half a batch.
    at_least: usize,
}

impl ClaimLoop {
    fn new(part: Arc<Claimer>, index: usize) -> Self {
        let cfg = &part.settings;
        let batch = cfg.batch_size.min(cfg.claim_capacity);
        ClaimLoop {
            index,
            kept: Kept::new(part.source.clone(), 1, cfg.db_timeout),
            wake: part.wake.subscribe(),
            backoff: ErrorBackoff::new(Duration::from_millis(50), Duration::from_secs(5)),
            local: LocalHistograms::new(),
            batch,
            at_least: (batch / 2).max(1),
            queue: Arc::clone(&part.queue),
            part,
        }
    }

    /// Whether this loop is one of those a fleet does not need (see the
    /// module docs): its index is past [`Cursor::reading_loops`], and
    /// another loop started a read less than two poll intervals ago (so a
    /// loop stuck on its read does not leave the worker without a reader).
    fn stands_down(&self) -> bool {
        let part = &self.part;
        let rated = part
            .settings
            .fleet_limit
            .is_some_and(|l| l.per_second.is_some());
        if self.index
            < part
                .claims
                .cursor
                .reading_loops(part.settings.claimers, rated)
        {
            return false;
        }
        let since = part
            .claims
            .now_us()
            .saturating_sub(part.claims.last_read_start_us.load(Relaxed));
        since < micros(part.settings.poll_interval).saturating_mul(2)
    }

    /// Waits one poll interval without a connection, then the loop looks
    /// again; true when `stop` fired meanwhile.
    async fn stand_down(&self, stop: &CancellationToken) -> bool {
        self.kept.idle();
        tokio::select! {
            biased;
            _ = stop.cancelled() => true,
            _ = tokio::time::sleep(self.part.settings.poll_interval) => false,
        }
    }

    /// Room in the claim queue: at least half a batch (or half the claim
    /// limit when smaller), topped up to a batch, and in a prioritized
    /// group the policy's grant; waits for them without holding a
    /// connection, until `stop` fires or the queue is seen paused.
    async fn take_room(&self, stop: &CancellationToken) -> Room {
        let paused = &self.part.paused;
        let room = self.queue.room();
        let limit = claim_limit(&self.part.settings, self.queue.average_run_us());
        room.limit_to(limit);
        let first = self.at_least.min((limit / 2).max(1));
        let mut permits = match room.try_take(first) {
            Some(p) => p,
            None => {
                self.kept.idle();
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => return Room::Stopped,
                    () = paused.until_paused() => return Room::Paused,
                    p = room.take(first) => match p {
                        Some(p) => p,
                        None => return Room::Stopped,
                    },
                }
            }
        };
        room.top_up(&mut permits, self.batch - first);
        if let Some(share) = &self.part.share {
            // A prioritized group: claim only what the policy grants now.
            let n = permits.num_permits();
            let granted = match share.try_claim(n) {
                Some(g) => g,
                None => {
                    self.kept.idle();
                    // A pause seen while waiting leaves the gate (the
                    // wait's end takes this loop out of the waiters).
                    tokio::select! {
                        biased;
                        () = paused.until_paused() => return Room::Paused,
                        g = share.claim(n, stop) => match g {
                            Some(g) => g,
                            None => return Room::Stopped,
                        },
                    }
                }
            };
            drop(permits.split(n - granted));
        }
        Room::Taken(permits)
    }

    /// Plans where the read starts (recording when it started) and reads up
    /// to `qty` messages.
    async fn read(
        &mut self,
        qty: usize,
    ) -> (Plan, Result<Vec<Message<RawJson>>, pgmq_client::Error>) {
        let claims = &self.part.claims;
        // Anything announced from here on is not missed: it marks `wake` changed.
        self.wake.borrow_and_update();
        let now_us = claims.now_us();
        claims.last_read_start_us.store(now_us, Relaxed);
        let cursor = &claims.cursor;
        let plan = cursor.plan(now_us, micros(self.part.settings.poll_interval));
        // (The test hook reads a range where a read from the start was
        // planned, from the first read on, and counts it as one: a short
        // one parks the loop. Whatever falls below the bound is then never
        // claimed, whether or not the fleet was seen yet.)
        #[cfg(feature = "fault-injection")]
        let read_plan = match plan {
            Plan::Table(ReadFrom::Start) if self.part.settings.cursor_fence => {
                Plan::Table(ReadFrom::Ranged(cursor.after.load(Relaxed)))
            }
            plan => plan,
        };
        #[cfg(not(feature = "fault-injection"))]
        let read_plan = plan;
        if read_plan == Plan::Limited {
            if let Some(taken) = self.part.handoff.as_ref().and_then(|h| h.take()) {
                return (plan, self.ack_and_read(taken, qty).await);
            }
        }
        let res = read(&self.part.settings, &self.kept, qty, read_plan).await;
        match (plan, res) {
            (
                Plan::Table(ReadFrom::Ranged(after)),
                Err(
                    e @ (pgmq_client::Error::SdkSchemaMissing { .. }
                    | pgmq_client::Error::SdkSchemaUntrusted { .. }),
                ),
            ) => {
                // Nothing was claimed: the same read after the frontier.
                tracing::info!(error = %e, "claim cursors unavailable: reads after the frontier");
                cursor.ranges_off();
                let plan = Plan::Table(ReadFrom::AfterFrontier(after));
                (plan, read(&self.part.settings, &self.kept, qty, plan).await)
            }
            (plan, res) => (plan, res),
        }
    }

    /// Counts and logs a failed read and backs off; true when `stop` fired
    /// meanwhile.
    /// A limited read that carries the completer's deletes `taken`
    /// ([`crate::handoff`]): tells the completer what became of them. When
    /// the database cannot run it (its `pgmq_sdk` schema lacks the
    /// function, say), the handoff is turned off and the plain limited
    /// read follows.
    async fn ack_and_read(
        &mut self,
        taken: crate::handoff::Taken,
        qty: usize,
    ) -> Result<Vec<Message<RawJson>>, pgmq_client::Error> {
        use crate::handoff::Outcome;
        let cfg = &self.part.settings;
        self.kept.busy();
        let opts = ReadOptions::new(cfg.visibility_timeout).qty(qty);
        let limit = cfg.fleet_limit.unwrap_or_default();
        let pg = Pgmq::on(&self.kept);
        #[cfg(feature = "fault-injection")]
        let res = if cfg.handoff_unplaced {
            // The test hook: a fenced delete, then a read that takes no place.
            match pg.delete_fenced(&cfg.queue, &taken.acks).await {
                Ok(d) => pg.read_with_raw(&cfg.queue, &opts).await.map(|m| (d, m)),
                Err(e) => Err(e),
            }
        } else {
            pg.ack_read_limited_raw(&cfg.queue, &taken.acks, &limit, &opts)
                .await
        };
        #[cfg(not(feature = "fault-injection"))]
        let res = pg
            .ack_read_limited_raw(&cfg.queue, &taken.acks, &limit, &opts)
            .await;
        match res {
            Ok((deleted, msgs)) => {
                taken.reply(Outcome::Written(deleted));
                Ok(msgs)
            }
            Err(e) => {
                let unknown = e.outcome() == pgmq_client::CommitOutcome::Unknown;
                taken.reply(Outcome::Failed { unknown });
                if e.is_transient() || unknown {
                    return Err(e);
                }
                tracing::warn!(error = %e, queue = %cfg.queue, "acknowledgements and claims in one statement unavailable: each written on its own");
                if let Some(h) = &self.part.handoff {
                    h.turn_off();
                }
                read(cfg, &self.kept, qty, Plan::Limited).await
            }
        }
    }

    async fn read_failed(&mut self, e: pgmq_client::Error, stop: &CancellationToken) -> bool {
        // The failed read's connection is already dropped.
        self.kept.idle();
        bump(&self.part.stats.c.read_errors, 1);
        self.part.health.read_failed();
        let delay = self.backoff.next_delay();
        let claimer = self.index;
        if e.is_transient() {
            tracing::warn!(error = %e, retry_in = ?delay, claimer, "read failed");
        } else {
            tracing::error!(error = %e, retry_in = ?delay, claimer, "read failed");
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => true,
            _ = tokio::time::sleep(delay) => false,
        }
    }

    /// Queues what a read as `plan` for `qty` messages, sent at
    /// `sent_at`, returned, with their permits (the rest go back), and
    /// says what the loop does next.
    fn enqueue(
        &mut self,
        msgs: Vec<Message<RawJson>>,
        mut permits: OwnedSemaphorePermit,
        plan: Plan,
        qty: usize,
        sent_at: Instant,
    ) -> After {
        let part = &self.part;
        self.backoff.reset();
        part.health.read_ok();
        let now = Instant::now();
        let n = msgs.len();
        let top = msgs.iter().map(|m| m.msg_id).max().unwrap_or(0);
        let drained = part.claims.cursor.done(plan, qty, n, top);
        bump(&part.stats.c.reads, 1);
        if plan == Plan::Table(ReadFrom::Start) {
            bump(&part.stats.c.reads_from_start, 1);
        }
        bump(&part.stats.c.claimed, n as u64);
        // The permits of the messages travel with them; a handler gives each
        // back when it takes the message. The rest go back now.
        if let Some(taken) = permits.split(n) {
            taken.forget();
        }
        drop(permits);
        for msg in &msgs {
            if let Some(read_at) = msg.last_read_at {
                let waited = (read_at - msg.enqueued_at).num_microseconds().unwrap_or(0);
                self.local.h.queue_wait_db.record(waited.max(0) as u64);
            }
        }
        // The whole batch at once; every message in the queue holds a permit
        // of the room, so it never holds more than `claim_capacity`.
        let batch = msgs.into_iter().map(|msg| Claimed {
            // A read always sets last_read_at; enqueued_at only stands in
            // for a row that has none (it then matches no fenced write).
            receipt: msg.receipt().unwrap_or(Receipt {
                msg_id: msg.msg_id,
                read_at: msg.enqueued_at,
            }),
            msg,
            claimed_at: now,
            sent_at,
        });
        if !self.queue.push_batch(batch) {
            return After::Closed;
        }
        self.local.maybe_merge(&part.stats, now);
        if n == qty {
            // The backlog is there: wake the other loops if parked.
            part.wake.wake();
            return After::ReadAgain;
        }
        if !drained {
            // A short read after the bound: read from the start next.
            return After::ReadAgain;
        }
        if n == 0 {
            bump(&part.stats.c.empty_reads, 1);
        }
        self.local.merge(&part.stats, now);
        After::Park
    }
}

/// How long a loop parks after a short read: `poll_interval`, or under a
/// rate limit the time one claim's token takes when that is shorter (the
/// read was short because the bucket ran dry). Under a concurrency limit
/// the loop is woken when the worker's own acknowledgements free places,
/// and sees places freed by other processes at its poll timer.
fn park_interval(cfg: &Settings) -> Duration {
    let limit = cfg.fleet_limit.or(cfg.key_limit.as_ref().map(|k| k.limit));
    match limit.and_then(|l| l.token_interval()) {
        Some(token) => token.min(cfg.poll_interval),
        None => cfg.poll_interval,
    }
}

/// Parks an idle loop until a wake-up, a batch of acknowledgements offered
/// to carry ([`crate::handoff`]; one loop per offer) or its poll timer of
/// `interval` (see the module docs); true when `stop` fired instead.
async fn park(
    part: &Claimer,
    wake: &mut tokio::sync::watch::Receiver<u64>,
    stop: &CancellationToken,
    interval: Duration,
) -> bool {
    let interval_us = micros(interval);
    let mut sleep_for = interval;
    let offered = async {
        match &part.handoff {
            Some(h) => h.offered().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(offered);
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return true,
            _ = wake.changed() => return false,
            () = &mut offered => return false,
            _ = tokio::time::sleep(sleep_for) => {}
        }
        // Another loop read recently: its read covered this interval.
        let since = part
            .claims
            .now_us()
            .saturating_sub(part.claims.last_read_start_us.load(Relaxed));
        if since >= interval_us.saturating_sub(interval_us / 20) {
            bump(&part.stats.c.wakeups_poll, 1);
            return false;
        }
        sleep_for = Duration::from_micros(interval_us - since);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IV: u64 = 250_000;

    fn bounded() -> Cursor {
        Cursor::new(ReadPath::Bounded)
    }

    #[test]
    fn the_first_read_is_from_the_start_then_after_the_highest_id() {
        let c = bounded();
        let p = c.plan(1_000, IV);
        assert_eq!(p, Plan::Table(ReadFrom::Start));
        assert!(!c.done(p, 100, 100, 600));
        assert_eq!(c.plan(2_000, IV), Plan::Table(ReadFrom::AfterFrontier(600)));
        // Another loop's batch moved the bound; a lower top does not lower it.
        assert!(!c.done(Plan::Table(ReadFrom::AfterFrontier(600)), 100, 100, 800));
        assert!(!c.done(Plan::Table(ReadFrom::AfterFrontier(600)), 100, 100, 700));
        assert_eq!(c.plan(3_000, IV), Plan::Table(ReadFrom::AfterFrontier(800)));
    }

    #[test]
    fn a_read_from_the_start_is_due_once_per_interval() {
        let c = bounded();
        let p = c.plan(1_000, IV);
        c.done(p, 100, 100, 100);
        assert_eq!(
            c.plan(1_000 + IV - 1, IV),
            Plan::Table(ReadFrom::AfterFrontier(100))
        );
        assert_eq!(c.plan(1_000 + IV, IV), Plan::Table(ReadFrom::Start));
        // Made: the next loop reads after the bound again.
        assert_eq!(
            c.plan(1_000 + IV + 1, IV),
            Plan::Table(ReadFrom::AfterFrontier(100))
        );
    }

    #[test]
    fn only_a_short_read_from_the_start_parks() {
        let c = bounded();
        let p = c.plan(1_000, IV);
        c.done(p, 100, 100, 100);
        // The tail ran out: not drained, and the next read is from the start.
        let p = c.plan(2_000, IV);
        assert_eq!(p, Plan::Table(ReadFrom::AfterFrontier(100)));
        assert!(!c.done(p, 100, 3, 103));
        let p = c.plan(3_000, IV);
        assert_eq!(p, Plan::Table(ReadFrom::Start));
        assert!(c.done(p, 100, 40, 90));
        assert!(c.done(p, 100, 0, 0));
    }

    #[test]
    fn full_reads_below_the_bound_keep_reading_from_the_start() {
        let c = bounded();
        let p = c.plan(1_000, IV);
        c.done(p, 100, 100, 5_000);
        // (100 claimed over 5,000 ids looks like a fleet: the periodic read
        // from the start comes at the longest stretch.)
        let t = 1_000 + MAX_FLEET_FACTOR * IV;
        // Retries below the bound fill a read from the start: read from the
        // start again at once, until one reaches past the bound.
        let p = c.plan(t, IV);
        assert_eq!(p, Plan::Table(ReadFrom::Start));
        assert!(!c.done(p, 100, 100, 400));
        let p = c.plan(t + 1, IV);
        assert_eq!(p, Plan::Table(ReadFrom::Start));
        assert!(!c.done(p, 100, 100, 5_100));
        assert_eq!(
            c.plan(t + 2, IV),
            Plan::Table(ReadFrom::AfterFrontier(5_100))
        );
    }

    #[test]
    fn a_worker_sharing_the_backlog_stretches_its_reads_from_the_start() {
        let c = bounded();
        let p = c.plan(1_000, IV);
        assert_eq!(p, Plan::Table(ReadFrom::Start));
        c.done(p, 100, 100, 100);
        // Three others claim the ids in between: each bounded read of 100
        // moves the bound over 400 ids.
        for top in [500, 900, 1_300] {
            let p = c.plan(2_000, IV);
            assert_eq!(p, Plan::Table(ReadFrom::AfterFrontier(top - 400)));
            c.done(p, 100, 100, top);
        }
        // 1,200 ids over 400 claimed since the read from the start: 3 workers.
        assert_eq!(c.fleet_factor(1_300), 3);
        // (Seen with others on a backlog: the read takes a range.)
        assert_eq!(
            c.plan(1_000 + 2 * IV, IV),
            Plan::Table(ReadFrom::Ranged(1_300))
        );
        assert_eq!(c.plan(1_000 + 3 * IV, IV), Plan::Table(ReadFrom::Start));
        // The estimate starts over at each read from the start.
        assert_eq!(c.fleet_factor(1_300), 1);
    }

    #[test]
    fn a_fleet_on_a_backlog_takes_ranges_and_a_short_one_ends_them() {
        let c = bounded();
        let p = c.plan(1_000, IV);
        c.done(p, 100, 100, 100);
        // Alone so far: reads after the frontier, whatever the backlog.
        let p = c.plan(2_000, IV);
        assert_eq!(p, Plan::Table(ReadFrom::AfterFrontier(100)));
        // Others claim the ids in between: once FLEET_SAMPLE messages say
        // so, full reads take ranges from the cursor.
        for top in [500, 900, 1_300] {
            let p = c.plan(2_000, IV);
            assert_eq!(p, Plan::Table(ReadFrom::AfterFrontier(top - 400)));
            assert!(!c.done(p, 100, 100, top));
        }
        let p = c.plan(2_000, IV);
        assert_eq!(p, Plan::Table(ReadFrom::Ranged(1_300)));
        assert!(!c.done(p, 100, 100, 1_700));
        // A short ranged read: the tail ran out. The next read is from the
        // start (what the range skipped is claimed there), and no range is
        // taken until a read after the bound is full again.
        let p = c.plan(2_000, IV);
        assert_eq!(p, Plan::Table(ReadFrom::Ranged(1_700)));
        assert!(!c.done(p, 100, 7, 1_707));
        assert_eq!(c.plan(2_000, IV), Plan::Table(ReadFrom::Start));
        let p = c.plan(2_000, IV);
        assert_eq!(p, Plan::Table(ReadFrom::AfterFrontier(1_707)));
        assert!(!c.done(p, 100, 100, 1_900));
        assert_eq!(c.plan(2_000, IV), Plan::Table(ReadFrom::Ranged(1_900)));
        // Without the schema: after the frontier from then on.
        c.ranges_off();
        assert_eq!(
            c.plan(2_000, IV),
            Plan::Table(ReadFrom::AfterFrontier(1_900))
        );
    }

    #[test]
    fn the_stretch_is_capped() {
        let c = bounded();
        let p = c.plan(1_000, IV);
        c.done(p, 100, 100, 100);
        let p = c.plan(2_000, IV);
        c.done(p, 100, 100, 1_000_000);
        assert_eq!(c.fleet_factor(1_000_000), MAX_FLEET_FACTOR);
        assert_eq!(
            c.plan(1_000 + MAX_FLEET_FACTOR * IV, IV),
            Plan::Table(ReadFrom::Start)
        );
    }

    #[test]
    fn the_fleet_seen_sets_the_reading_loops() {
        let c = bounded();
        // Alone (nothing measured yet): every loop reads.
        assert_eq!(c.reading_loops(2, false), 2);
        let p = c.plan(1_000, IV);
        c.done(p, 100, 100, 100);
        // Three others claim the ids in between each bounded read. Below
        // FLEET_SAMPLE messages claimed the window says nothing yet...
        for top in [500, 900] {
            let p = c.plan(2_000, IV);
            c.done(p, 100, 100, top);
        }
        assert_eq!(c.reading_loops(2, false), 2);
        // ...from there on it does, before any read from the start.
        let p = c.plan(2_000, IV);
        c.done(p, 100, 100, 1_300);
        assert_eq!(c.reading_loops(2, false), 1);
        // Read from the start (a short bounded read asked for one): the
        // estimate of that window is kept, 1,310 ids over 410 claimed: 3.
        let p = c.plan(3_000, IV);
        assert!(!c.done(p, 100, 10, 1_310));
        assert_eq!(c.plan(4_000, IV), Plan::Table(ReadFrom::Start));
        assert_eq!(c.reading_loops(2, false), 1);
        assert_eq!(c.reading_loops(8, false), 3);
        assert_eq!(c.reading_loops(1, false), 1);
        // Alone again: the next window says 1, and both loops read.
        let p = c.plan(5_000, IV);
        c.done(p, 100, 100, 1_410);
        c.start_due.store(true, Relaxed);
        assert_eq!(c.plan(6_000, IV), Plan::Table(ReadFrom::Start));
        assert_eq!(c.reading_loops(2, false), 2);
    }

    #[test]
    fn the_share_estimate_rounds_to_the_nearest() {
        // One window from a read from the start at id 100 to a read
        // reaching `top`, 100 messages claimed.
        let window = |top| {
            let c = bounded();
            let p = c.plan(1_000, IV);
            c.done(p, 100, 100, 100);
            c.start_due.store(true, Relaxed);
            let p = c.plan(2_000, IV);
            assert_eq!(p, Plan::Table(ReadFrom::Start));
            c.done(p, 100, 100, top);
            c.fleet_factor(top)
        };
        // 190 ids over 100 claimed: 2 workers; 140: 1.
        assert_eq!(window(290), 2);
        assert_eq!(window(240), 1);
    }

    #[test]
    fn the_other_paths_never_use_a_bound() {
        let f = Cursor::new(ReadPath::Function);
        assert_eq!(f.plan(1, IV), Plan::Function);
        assert!(!f.done(Plan::Function, 100, 100, 100));
        assert!(f.done(Plan::Function, 100, 99, 100));
        let s = Cursor::new(ReadPath::FromStart);
        let p = s.plan(1, IV);
        s.done(p, 100, 100, 100);
        assert_eq!(s.plan(2, IV), Plan::Table(ReadFrom::Start));
        assert!(s.done(p, 100, 5, 100));
    }
}
