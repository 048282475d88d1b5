//! The campaign's fault kinds, as one table: what each injects, how it is
//! cleared, how long it may last, and whether it aims at a worker process.
//! A new kind is one entry of [`KINDS`] and one arm in [`Nemesis::inject`]
//! and [`Nemesis::clear`].

use std::sync::atomic::Ordering;
use std::time::Duration;

use std::time::Instant;

use chrono::Utc;

use super::fleet::{FleetState, Watching};
use super::model::{FaultEvent, Planned, ProcKind, Role, PROBE_DECODE, PROBE_HANG, PROBE_HOOK};
use super::slots::Slots;
use super::workload::Workload;
use crate::ctx::{session, Ctx};
use crate::ledger;
use crate::proxy::Proxy;
use crate::BoxError;

/// One fault kind.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kind {
    pub name: &'static str,
    pub injects: &'static str,
    pub clears: &'static str,
    /// Shortest and longest duration, milliseconds.
    pub min_ms: u64,
    pub max_ms: u64,
    /// Aims at one worker process (drawn at random).
    pub at_process: bool,
    /// Aims at one queue (drawn at random).
    pub at_queue: bool,
    /// While it lasts (and shortly after), server backends of connections
    /// the workers closed may linger: the proxy holds them open, or the
    /// server has not noticed yet. The connection bound is not judged then.
    pub holds_backends: bool,
    /// It disturbs every worker process (the server, the network, the
    /// grants): a process's own pace is not judged while it lasts.
    pub disturbs: bool,
}

/// Methods of a [`Kind`] that each set the flag they are named after.
macro_rules! flags {
    ($($(#[$doc:meta])* $flag:ident;)*) => {
        $(
            $(#[$doc])*
            const fn $flag(self) -> Kind {
                Kind {
                    $flag: true,
                    ..self
                }
            }
        )*
    };
}

impl Kind {
    /// A kind named `name` that lasts `ms` milliseconds (drawn in the
    /// range), aimed at nothing in particular, holding no backend and
    /// disturbing no process.
    const fn new(
        name: &'static str,
        injects: &'static str,
        clears: &'static str,
        ms: std::ops::RangeInclusive<u64>,
    ) -> Kind {
        Kind {
            name,
            injects,
            clears,
            min_ms: *ms.start(),
            max_ms: *ms.end(),
            at_process: false,
            at_queue: false,
            holds_backends: false,
            disturbs: false,
        }
    }

    flags! {
        /// It aims at one worker process.
        at_process;
        /// It aims at one queue.
        at_queue;
        /// Backends may linger while it lasts.
        holds_backends;
        /// It disturbs every worker process.
        disturbs;
    }
}

/// Every fault kind of the campaign.
pub(crate) const KINDS: &[Kind] = &[
    Kind::new(
        "kill",
        "SIGKILL of a worker process",
        "a new worker process in its place",
        500..=5_000,
    )
    .at_process()
    .holds_backends(),
    Kind::new(
        "stop",
        "SIGSTOP of a worker process (frozen, past its visibility timeout at times)",
        "SIGCONT",
        500..=8_000,
    )
    .at_process(),
    Kind::new(
        "term",
        "SIGTERM of a busy worker process: a graceful drain, its report kept",
        "a new worker process in its place",
        0..=3_000,
    )
    .at_process(),
    Kind::new(
        "pg-crash",
        "PostgreSQL killed (pg_ctl stop -m immediate)",
        "PostgreSQL started again (crash recovery)",
        300..=5_000,
    )
    .holds_backends()
    .disturbs(),
    Kind::new(
        "terminate-backend",
        "pg_terminate_backend of half the workers' backends, every 500 ms",
        "stops terminating",
        0..=4_000,
    )
    .holds_backends()
    .disturbs(),
    Kind::new(
        "blackhole",
        "the proxy forwards nothing, connections stay open",
        "the proxy forwards again",
        500..=8_000,
    )
    .holds_backends()
    .disturbs(),
    Kind::new(
        "latency",
        "the proxy delays every chunk, either way, by 30-300 ms (heartbeat extensions, retries and acknowledgements land late)",
        "the proxy forwards at once again",
        1_000..=8_000,
    )
    .holds_backends()
    .disturbs(),
    Kind::new(
        "reset",
        "the proxy resets every connection and refuses new ones",
        "the proxy accepts again",
        200..=3_000,
    )
    .holds_backends()
    .disturbs(),
    Kind::new(
        "lock-table",
        "LOCK TABLE (ACCESS EXCLUSIVE) on a queue's table, held",
        "the locking transaction rolls back",
        1_000..=8_000,
    )
    .at_queue(),
    Kind::new(
        "xmin-pin",
        "an idle-in-transaction session holding a snapshot (xmin horizon pinned)",
        "the session rolls back",
        2_000..=10_000,
    )
    .at_queue(),
    Kind::new(
        "rr-reader",
        "a REPEATABLE READ transaction reading a queue's table every 200 ms",
        "the transaction commits",
        2_000..=10_000,
    )
    .at_queue(),
    Kind::new(
        "pool-exhaustion",
        "idle connections opened until the server refuses more (max_connections)",
        "the connections are closed",
        1_000..=6_000,
    )
    .disturbs(),
    Kind::new(
        "hook-panic",
        "plain messages whose hook panics (Hook::before or Hook::after, first attempt)",
        "the producer stops sending them",
        1_000..=5_000,
    ),
    Kind::new(
        "decode-panic",
        "plain messages whose body's Deserialize panics",
        "the producer stops sending them",
        1_000..=5_000,
    ),
    Kind::new(
        "blocking-hangs",
        "most plain messages hang 60 s on their first attempt (past handler_timeout; more than the blocking process's max_abandoned_blocking_threads of 4)",
        "the producer stops sending them",
        1_000..=4_000,
    ),
    Kind::new(
        "redrive",
        "the plain queue's dead letters sent back with their original headers",
        "nothing to clear",
        0..=1_000,
    ),
    Kind::new(
        "read-only",
        "default_transaction_read_only on for the whole cluster",
        "default_transaction_read_only reset",
        1_000..=6_000,
    )
    .disturbs(),
    Kind::new(
        "pause",
        "a queue paused (Pgmq::pause) for every worker",
        "the queue resumed",
        5_000..=8_000,
    )
    .at_queue(),
    Kind::new(
        "drop-queue",
        "the keyed queue dropped and created again under its keyed producer (its messages lost)",
        "nothing to clear",
        0..=1_000,
    ),
    Kind::new(
        "revoke-grants",
        "the workers' role's USAGE on the pgmq_sdk schema revoked: no worker can read the pause flag",
        "the grant restored",
        5_000..=8_000,
    )
    .disturbs(),
    Kind::new(
        "pause-flag-locked",
        "ACCESS EXCLUSIVE lock on pgmq_sdk.paused, held: every read of the pause flag hangs",
        "the locking transaction rolls back",
        4_000..=7_000,
    )
    .disturbs(),
];

/// The kind named `name`.
pub(crate) fn kind(name: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.name == name)
}

/// The kinds asked for: every kind when none is named, no kind for `none`.
pub(crate) fn selection(asked: &[String]) -> Result<Vec<&'static Kind>, BoxError> {
    if asked.is_empty() {
        return Ok(KINDS.iter().collect());
    }
    if asked.len() == 1 && asked[0] == "none" {
        return Ok(Vec::new());
    }
    asked
        .iter()
        .map(|a| {
            kind(a).ok_or_else(|| {
                let names: Vec<&str> = KINDS.iter().map(|k| k.name).collect();
                format!(
                    "no fault kind {a:?}: kinds are {}, or none",
                    names.join(", ")
                )
                .into()
            })
        })
        .collect()
}

/// What a fault holds while it lasts, to clear it.
pub(crate) enum Held {
    Nothing,
    /// A session whose open transaction is the fault (lock, snapshot).
    Session(tokio_postgres::Client),
    /// A task doing the fault until told to stop.
    Task(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ),
    /// Idle sessions filling the server.
    Sessions(Vec<tokio_postgres::Client>),
    /// A pause, a revocation or a lock of the pause flag, and the watcher
    /// of its queues.
    Watching(Watching),
}

/// How long a kill of a fleet-limited process waits for it to run a
/// handler ([`Nemesis::await_handler`]).
pub(crate) const KILL_AIM: Duration = Duration::from_secs(1);

/// Injects and clears faults on the campaign's cluster, proxy and workers.
pub(crate) struct Nemesis<'a> {
    pub ctx: &'a Ctx,
    pub proxy: &'a Proxy,
    pub slots: &'a Slots,
    pub workload: &'a Workload,
    pub fleet: &'a FleetState,
}

impl Nemesis<'_> {
    /// Plays `schedule`, one fault after another, each at its time from
    /// `started`: injects it, holds it for its duration, clears it (a
    /// failed injection may have half happened: it is cleared anyway).
    /// Returns the faults as they happened.
    pub(crate) async fn play(
        &self,
        schedule: &[Planned],
        started: Instant,
    ) -> Result<Vec<FaultEvent>, BoxError> {
        let mut events = Vec::new();
        for p in schedule {
            let at = started + Duration::from_millis(p.at_ms);
            tokio::time::sleep_until(at.into()).await;
            let kind = kind(p.kind).ok_or("unknown fault kind")?;
            let start = Utc::now();
            let mut error = None;
            let held = match self
                .inject(
                    kind,
                    p.process,
                    p.queue,
                    Duration::from_millis(p.duration_ms),
                )
                .await
            {
                Ok(h) => h,
                Err(e) => {
                    error = Some(format!("{} inject: {e}", p.kind));
                    Held::Nothing
                }
            };
            tokio::time::sleep_until((at + Duration::from_millis(p.duration_ms)).into()).await;
            if let Err(e) = self.clear(kind, p.process, held).await {
                let msg = format!("{} clear: {e}", p.kind);
                eprintln!("campaign: {msg}");
                error = Some(error.map_or(msg.clone(), |x| format!("{x}; {msg}")));
            }
            events.push(FaultEvent {
                kind: kind.name,
                process: p.process,
                queue: p.queue,
                start,
                end: Utc::now(),
                error,
                holds_backends: kind.holds_backends,
            });
        }
        Ok(events)
    }

    /// Before a SIGKILL of a fleet-limited process: waits, at most
    /// [`KILL_AIM`], until it runs a handler, so that the kill catches it
    /// holding places and *a killed process's places come back within its
    /// vt* is judged on places really held. A process idle past the bound
    /// (no burst of the producer meanwhile) is killed all the same.
    async fn await_handler(&self, process: usize) {
        let Some(pid) = self.slots.pid(process).await else {
            return;
        };
        let until = tokio::time::Instant::now() + KILL_AIM;
        while tokio::time::Instant::now() < until {
            if let Ok(true) = ledger::in_handler(&self.ctx.client, &self.ctx.run_id, pid).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts the fault; `process` and `queue` are the drawn targets, and
    /// `duration` its drawn length (a latency fault's delay derives from it,
    /// so that the seed fixes the delay too).
    pub(crate) async fn inject(
        &self,
        kind: &Kind,
        process: usize,
        role: Role,
        duration: Duration,
    ) -> Result<Held, BoxError> {
        let queue = &self.fleet.queues[role.index()];
        Ok(match kind.name {
            "kill" => {
                let fleet = self.slots.kind(process).await == Some(ProcKind::Fleet);
                if fleet {
                    self.await_handler(process).await;
                }
                self.slots.kill(process).await?;
                if fleet {
                    self.fleet.watch_places(&self.ctx.cluster.dsn()).await;
                }
                Held::Nothing
            }
            "stop" => {
                self.slots.signal(process, "STOP").await?;
                Held::Nothing
            }
            "term" => {
                self.slots.term(process).await?;
                Held::Nothing
            }
            "pg-crash" => {
                self.ctx.cluster.kill().await?;
                Held::Nothing
            }
            "terminate-backend" => {
                let dsn = self.ctx.cluster.dsn();
                task(move |n| {
                    let dsn = dsn.clone();
                    async move {
                        // Every other backend, alternating which half each time.
                        let sql = "select pg_terminate_backend(pid) from pg_stat_activity \
                                   where application_name like 'pgmq-campaign-w%' \
                                     and pid % 2 = $1";
                        if let Ok(c) = session(&dsn, "pgmq-campaign-nemesis").await {
                            let _ = c.execute(sql, &[&((n % 2) as i32)]).await;
                        }
                    }
                })
            }
            "blackhole" => {
                self.proxy.set_blackhole(true);
                Held::Nothing
            }
            "latency" => {
                let ms = 30 + duration.as_millis() as u64 % 271;
                self.proxy.set_latency(Duration::from_millis(ms));
                Held::Nothing
            }
            "reset" => {
                self.proxy.set_accepting(false);
                self.proxy.cut_all();
                Held::Nothing
            }
            "lock-table" => {
                self.open_transaction(&format!(
                    "begin; lock table {} in access exclusive mode",
                    queue.quoted_table()
                ))
                .await?
            }
            "xmin-pin" => {
                self.open_transaction(&format!(
                    "begin isolation level repeatable read; select count(*) from {}",
                    queue.quoted_table()
                ))
                .await?
            }
            "rr-reader" => {
                let dsn = self.ctx.cluster.dsn();
                let table = queue.quoted_table();
                let c = session(&dsn, "pgmq-campaign-nemesis").await?;
                c.batch_execute("begin isolation level repeatable read")
                    .await?;
                let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
                let handle = tokio::spawn(async move {
                    let sql = format!("select count(*), max(msg_id) from {table}");
                    loop {
                        let _ = c.batch_execute(&sql).await;
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                            _ = &mut rx => break,
                        }
                    }
                    let _ = c.batch_execute("commit").await;
                });
                Held::Task(tx, handle)
            }
            "pool-exhaustion" => {
                let dsn = self.ctx.cluster.dsn();
                let mut held = Vec::new();
                while held.len() < 400 {
                    match session(&dsn, "pgmq-campaign-hog").await {
                        Ok(c) => held.push(c),
                        Err(_) => break,
                    }
                }
                Held::Sessions(held)
            }
            "read-only" => {
                crate::scenarios::read_only(self.ctx, true).await?;
                Held::Nothing
            }
            "hook-panic" => {
                self.workload.probes.fetch_or(PROBE_HOOK, Ordering::SeqCst);
                Held::Nothing
            }
            "decode-panic" => {
                self.workload
                    .probes
                    .fetch_or(PROBE_DECODE, Ordering::SeqCst);
                Held::Nothing
            }
            "redrive" => {
                self.workload.redrive(self.ctx).await?;
                Held::Nothing
            }
            "blocking-hangs" => {
                self.workload.probes.fetch_or(PROBE_HANG, Ordering::SeqCst);
                Held::Nothing
            }
            "pause" => Held::Watching(self.fleet.pause(&self.ctx.cluster.dsn(), role).await?),
            "drop-queue" => {
                self.fleet.recreate(self.ctx).await?;
                Held::Nothing
            }
            "revoke-grants" => Held::Watching(self.fleet.revoke(&self.ctx.cluster.dsn()).await?),
            "pause-flag-locked" => {
                Held::Watching(self.fleet.lock_flag(&self.ctx.cluster.dsn()).await?)
            }
            other => return Err(format!("fault kind {other} has no injection").into()),
        })
    }

    /// A session of its own left inside the transaction `sql` opens.
    async fn open_transaction(&self, sql: &str) -> Result<Held, BoxError> {
        let c = session(&self.ctx.cluster.dsn(), "pgmq-campaign-nemesis").await?;
        c.batch_execute(sql).await?;
        Ok(Held::Session(c))
    }

    /// Ends the fault.
    pub(crate) async fn clear(
        &self,
        kind: &Kind,
        process: usize,
        held: Held,
    ) -> Result<(), BoxError> {
        match held {
            Held::Nothing => {}
            Held::Session(c) => {
                let _ = c.batch_execute("rollback").await;
            }
            Held::Task(stop, handle) => {
                let _ = stop.send(());
                let _ = handle.await;
            }
            Held::Sessions(v) => drop(v),
            Held::Watching(w) => self.fleet.unwatch(&self.ctx.cluster.dsn(), w).await?,
        }
        match kind.name {
            "kill" | "term" => self.slots.respawn(process).await?,
            "stop" => self.slots.signal(process, "CONT").await?,
            "pg-crash" => {
                self.ctx.cluster.restart_after_kill().await?;
                self.ctx.wait_server(Duration::from_secs(60)).await?;
            }
            "blackhole" => self.proxy.set_blackhole(false),
            "latency" => self.proxy.set_latency(Duration::ZERO),
            "hook-panic" => {
                self.workload
                    .probes
                    .fetch_and(!PROBE_HOOK, Ordering::SeqCst);
            }
            "decode-panic" => {
                self.workload
                    .probes
                    .fetch_and(!PROBE_DECODE, Ordering::SeqCst);
            }
            "blocking-hangs" => {
                self.workload
                    .probes
                    .fetch_and(!PROBE_HANG, Ordering::SeqCst);
            }
            "reset" => self.proxy.set_accepting(true),
            "read-only" => {
                // The server may have been busy: try a few times.
                let mut last = None;
                for _ in 0..20 {
                    match crate::scenarios::read_only(self.ctx, false).await {
                        Ok(()) => return Ok(()),
                        Err(e) => last = Some(e),
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                return Err(last.unwrap_or_else(|| "read-only not cleared".into()));
            }
            _ => {}
        }
        Ok(())
    }
}

/// Runs `f(n)` every 500 ms (n = 0, 1, ...) until the fault is cleared.
fn task<F, Fut>(f: F) -> Held
where
    F: Fn(u64) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(async move {
        let mut n = 0;
        loop {
            f(n).await;
            n += 1;
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = &mut rx => break,
            }
        }
    });
    Held::Task(tx, handle)
}
