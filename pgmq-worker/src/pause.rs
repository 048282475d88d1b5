//! Pause and resume for the whole fleet: the pause watch.
//!
//! A queue is paused by a row in `pgmq_sdk.paused`
//! ([`Pgmq::pause`](pgmq_client::Pgmq::pause), `pgmq pause`). The watch
//! reads that flag once per `poll_interval`, on a fixed beat (and once
//! before the claim loops start, so a worker started while its queue is
//! paused starts paused). While the queue is paused the claim loops start
//! no read: they look at the flag right before every read, after whatever
//! they waited for (room in the claim queue, a priority grant, the poll
//! timer), and a wait for room or for a grant ends when the pause is seen.
//! A read already in flight finishes and its messages are handled, running
//! handlers finish, and their acknowledgements are written as usual. On
//! resume the watch wakes the claim loops.
//!
//! **The promise.** No claim read starts later than one `poll_interval`
//! plus one read of the flag after the pause committed (the first read of
//! the flag that starts after the commit sees it); only a claim read
//! already in flight then may still claim, so every claim's `last_read_at`
//! is within that bound plus one claim read. In a prioritized group a
//! paused queue holds no capacity for itself ([`crate::priority`]).
//!
//! Without the `pgmq_sdk` schema a queue cannot be paused: the watch then
//! asks the catalog whether the schema exists (a query that cannot fail,
//! so the server's log gets no error per poll) and reads the flag once it
//! does. A read that fails for any reason other than rights keeps the
//! last state read, for as long as that read is recent (below).
//!
//! **A flag the worker has not read lately fails closed.** Each claim read
//! starts only while the last read of the flag that succeeded started at
//! most one `poll_interval` plus [`STALE_GRACE`] ago; past that (the
//! database slow or away, the watch's connection waiting for the pool, the
//! machine overloaded), the claim loops hold their reads, the worker says
//! so once, and they go on when a read of the flag succeeds again. A read
//! of the flag that started after the pause committed sees it, so no claim
//! read starts later than one `poll_interval` plus [`STALE_GRACE`] after
//! the pause committed, however long the reads of the flag take. A worker
//! whose first read of the flag failed holds its claims until one succeeds.
//!
//! **A flag the worker may not read fails closed.** A worker that could
//! not read the flag would claim while the queue is paused, so a refusal
//! for want of a right (SQLSTATE 42501: the schema is there, but the
//! worker's role lacks USAGE on it or SELECT on the flag's table) is never
//! taken as "not paused". At start the worker refuses to start
//! ([`Error::PauseFlagUnreadable`], naming the grants). While running, the
//! watch treats the queue as paused (no new claims), says so in
//! `Health::pause_flag_unreadable` (the worker is then not healthy) and in
//! the `pgmq_worker_pause_flag_unreadable` gauge, and logs a warning when
//! it starts (and a line when it ends); the worker claims again once a
//! read of the flag succeeds.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgmq_client::{Pgmq, QueueName};
use tokio::sync::watch;
use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;

use crate::db::Source;
use crate::error::Error;
use crate::health::HealthState;
use crate::supervise::Supervisor;
use crate::wake::Wake;

/// What the pause watch reads.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub queue: QueueName,
    pub poll_interval: Duration,
    pub db_timeout: Duration,
    /// Test hook: a flag not read lately does not hold the claims.
    #[cfg(feature = "fault-injection")]
    pub stale_flag_trusted: bool,
}

/// The grants a worker's role needs to read the pause flag, as an
/// operator runs them.
pub(crate) const GRANTS: &str = pgmq_client::PAUSE_FLAG_GRANTS;

/// Whether `e` is the server refusing the read for want of a right.
fn denied(e: &pgmq_client::Error) -> bool {
    e.sqlstate() == Some(&SqlState::INSUFFICIENT_PRIVILEGE)
}

/// How long past one `poll_interval` a successful read of the pause flag
/// keeps the claims going: room for that read and the next one to take
/// their time on a loaded machine before the claims are held.
pub(crate) const STALE_GRACE: Duration = Duration::from_secs(1);

/// Whether claims are held, as the watch last made it out (the queue is
/// paused, or its flag may not be read), or because the watch has not read
/// the flag lately; the claim loops look at it before each read.
#[derive(Debug)]
pub(crate) struct Paused {
    tx: watch::Sender<bool>,
    /// The clock the read times below count from.
    epoch: Instant,
    /// When the last read of the flag that succeeded started, in
    /// nanoseconds after `epoch` plus one (0: none yet).
    fresh_ns: AtomicU64,
    /// How long such a read keeps the claims going.
    good_for: Duration,
    /// The hold for want of a recent read was said (once per episode).
    stale_said: AtomicBool,
}

impl Paused {
    /// Nothing held yet; a read of the flag keeps the claims going for
    /// `poll_interval` plus [`STALE_GRACE`] after it started (with the
    /// `fault-injection` test hook `stale_flag_trusted`, for ever, and no
    /// read needed at all).
    pub(crate) fn new(settings: &Settings) -> Self {
        let good_for = settings.poll_interval + STALE_GRACE;
        #[cfg(feature = "fault-injection")]
        let (good_for, fresh) = match settings.stale_flag_trusted {
            true => (Duration::from_secs(u64::from(u32::MAX)), 1),
            false => (good_for, 0),
        };
        #[cfg(not(feature = "fault-injection"))]
        let fresh = 0;
        Paused {
            tx: watch::channel(false).0,
            epoch: Instant::now(),
            fresh_ns: AtomicU64::new(fresh),
            good_for,
            stale_said: AtomicBool::new(false),
        }
    }

    /// Whether claims are held now: the queue is paused, its flag may not
    /// be read, or no read of it that started within `good_for` has
    /// succeeded. The last one is seen here, by the claim loop about to
    /// read, and held in the channel like the others, so that
    /// [`wait_resumed`](Self::wait_resumed) waits for the next good read.
    pub(crate) fn is_paused(&self) -> bool {
        if *self.tx.borrow() {
            return true;
        }
        if !self.stale() {
            return false;
        }
        // Looked at again under the channel's lock, where the watch records
        // its reads: a read that landed meanwhile keeps the claims going.
        let mut held = false;
        self.tx.send_if_modified(|p| {
            held = *p || self.stale();
            let changed = !*p && held;
            *p = held;
            changed
        });
        held
    }

    /// Whether no read of the flag that started within `good_for` has
    /// succeeded.
    fn stale(&self) -> bool {
        let started = match self.fresh_ns.load(Relaxed) {
            0 => return true,
            n => self.epoch + Duration::from_nanos(n - 1),
        };
        started.elapsed() > self.good_for
    }

    /// Records that a read of the flag that started at `started`
    /// succeeded; true when the claims had been held for want of one.
    fn fresh(&self, started: Instant) -> bool {
        let n = started.saturating_duration_since(self.epoch).as_nanos();
        let n = u64::try_from(n).unwrap_or(u64::MAX - 1) + 1;
        self.fresh_ns.fetch_max(n, Relaxed);
        self.stale_said.swap(false, Relaxed)
    }

    /// Waits until the queue is resumed; true when `stop` fired first.
    pub(crate) async fn wait_resumed(&self, stop: &CancellationToken) -> bool {
        let mut rx = self.tx.subscribe();
        tokio::select! {
            biased;
            _ = stop.cancelled() => true,
            r = rx.wait_for(|paused| !*paused) => r.is_err(),
        }
    }

    /// Completes once claims are paused (at once if they are now).
    pub(crate) async fn until_paused(&self) {
        let mut rx = self.tx.subscribe();
        if rx.wait_for(|paused| *paused).await.is_err() {
            // The watch is gone: never paused from now on.
            std::future::pending::<()>().await;
        }
    }

    /// Records what the watch read; true when it changed.
    fn set(&self, paused: bool) -> bool {
        self.tx
            .send_if_modified(|p| std::mem::replace(p, paused) != paused)
    }
}

/// The pause watch: its settings and the handles it touches.
pub(crate) struct PauseWatch {
    pub settings: Settings,
    pub source: Source,
    pub paused: Arc<Paused>,
    pub health: Arc<HealthState>,
    pub wake: Wake,
    /// Whether the `pgmq_sdk` schema was there at the last look.
    schema: AtomicBool,
    /// The flag, as last read.
    flag: AtomicBool,
    /// The last read was refused for want of a right.
    unreadable: AtomicBool,
}

impl PauseWatch {
    pub(crate) fn new(
        settings: Settings,
        source: Source,
        paused: Arc<Paused>,
        health: Arc<HealthState>,
        wake: Wake,
    ) -> Self {
        PauseWatch {
            settings,
            source,
            paused,
            health,
            wake,
            schema: AtomicBool::new(false),
            flag: AtomicBool::new(false),
            unreadable: AtomicBool::new(false),
        }
    }

    /// The read before the claim loops start, within `limit`: as
    /// [`check`](Self::check), except that a refusal for want of a right
    /// fails the start.
    pub(crate) async fn first_check(&self, limit: Duration) -> Result<(), Error> {
        let started = Instant::now();
        match self.read(limit).await {
            Err(e) if denied(&e) => Err(Error::PauseFlagUnreadable {
                queue: self.settings.queue.to_string(),
                grants: GRANTS,
                source: e,
            }),
            res => {
                self.take(res, started);
                Ok(())
            }
        }
    }

    /// Reads the flag once, within `limit`, and records it (see the module
    /// docs): a refusal for want of a right holds the claims, any other
    /// failure changes nothing.
    pub(crate) async fn check(&self, limit: Duration) {
        let started = Instant::now();
        let res = self.read(limit).await;
        self.take(res, started);
    }

    /// Records the result of a read of the flag that started at `started`.
    fn take(&self, res: Result<bool, pgmq_client::Error>, started: Instant) {
        match res {
            Ok(paused) => {
                if self.paused.fresh(started) {
                    tracing::info!(queue = %self.settings.queue, "the pause flag was read again");
                }
                self.record(Ok(paused));
            }
            Err(e) if denied(&e) => self.record(Err(&e)),
            Err(e) => {
                tracing::debug!(error = %e, queue = %self.settings.queue, "could not read whether the queue is paused");
                // A failed read of the flag is a failed read in the
                // worker's health: while the hold below keeps the claim
                // loops from reading, it is what tells the database is
                // away. Only a claim read that succeeds clears the count.
                self.health.read_failed();
                self.say_stale();
            }
        }
    }

    /// Says once per episode that the claims are held for want of a
    /// recent read of the flag.
    fn say_stale(&self) {
        let p = &self.paused;
        if p.stale() && !p.stale_said.swap(true, Relaxed) {
            tracing::warn!(
                queue = %self.settings.queue,
                "the pause flag could not be read for {:?}: no new claims until it is",
                p.good_for
            );
        }
    }

    async fn read(&self, limit: Duration) -> Result<bool, pgmq_client::Error> {
        let conn = self.source.checkout(limit).await?;
        let pg = Pgmq::on(&conn);
        if !self.schema.load(Relaxed) {
            if !conn.bounded(limit, pg.sdk_schema_present()).await? {
                return Ok(false);
            }
            self.schema.store(true, Relaxed);
        }
        match conn
            .bounded(limit, pg.is_paused(&self.settings.queue))
            .await
        {
            Err(pgmq_client::Error::SdkSchemaMissing { .. }) => {
                self.schema.store(false, Relaxed);
                Ok(false)
            }
            res => res,
        }
    }

    /// Records a read of the flag: its value, or the refusal that makes
    /// the watch hold the claims; logs each change once.
    fn record(&self, read: Result<bool, &pgmq_client::Error>) {
        let queue = &self.settings.queue;
        match read {
            Ok(paused) => {
                if self.unreadable.swap(false, Relaxed) {
                    self.health.set_pause_flag_unreadable(false);
                    tracing::info!(%queue, "the pause flag is readable again");
                }
                if self.flag.swap(paused, Relaxed) != paused {
                    self.health.set_paused(paused);
                    if paused {
                        tracing::info!(%queue, "queue paused: no new claims until it is resumed");
                    } else {
                        tracing::info!(%queue, "queue resumed");
                    }
                }
            }
            Err(e) => {
                if !self.unreadable.swap(true, Relaxed) {
                    self.health.set_pause_flag_unreadable(true);
                    tracing::warn!(%queue, error = %e, grants = GRANTS, "this worker's role may not read whether the queue is paused: no new claims until it may");
                }
            }
        }
        let hold = self.flag.load(Relaxed) || self.unreadable.load(Relaxed);
        if self.paused.set(hold) && !hold {
            tracing::info!(%queue, "claiming again");
            self.wake.wake();
        }
    }
}

/// The bound on the read before the claim loops start: a database that is
/// away at start delays the start by this at most (the claim loops then
/// start held, and claim once a read of the flag succeeds; the watch reads
/// again one poll interval later).
pub(crate) const FIRST_CHECK_LIMIT: Duration = Duration::from_secs(2);

/// Starts the supervised watch; it runs until `stop`.
pub(crate) fn spawn(part: Arc<PauseWatch>, supervisor: &Supervisor, stop: &CancellationToken) {
    let stop = stop.clone();
    supervisor.spawn("pause watch", move || run(Arc::clone(&part), stop.clone()));
}

/// Reads the flag once per `poll_interval`, the reads starting on a fixed
/// beat (not an interval after the last read ended), so that a pause
/// committed at any moment is read by a read that starts within one
/// interval of it.
async fn run(part: Arc<PauseWatch>, stop: CancellationToken) {
    let every = part.settings.poll_interval;
    let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = beat.tick() => {}
        }
        part.say_stale();
        part.check(part.settings.db_timeout).await;
    }
}
