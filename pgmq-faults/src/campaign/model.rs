//! What the campaign's parts share: the queues of a seed's run ([`Role`])
//! and the worker processes' kinds ([`ProcKind`]), the keys and settings
//! every part agrees on, and the records that pass from one part to
//! another (the schedule, the faults as they happened, the sampler's
//! samples, the processes' exits, a seed's summary). Every part of the
//! campaign imports these from here, and none from the runner.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::child::Exit;

/// FIFO groups of the FIFO queue.
pub(crate) const GROUPS: i64 = 6;
/// First key of the transactional queue.
pub(crate) const TX_BASE: i64 = 10_000_000;
/// One transactional message in this many has its first claim expire
/// under its running handler ([`Act::expire_once`]).
pub(crate) const EXPIRE_EVERY: i64 = 40;
/// Whether the transactional message `key` has [`Act::expire_once`].
pub(crate) fn expires_once(key: i64) -> bool {
    (TX_BASE..FIFO_BASE).contains(&key) && (key - TX_BASE) % EXPIRE_EVERY == EXPIRE_EVERY / 2
}
/// First key of the FIFO queue; key = FIFO_BASE + group * FIFO_SPAN + seq.
pub(crate) const FIFO_BASE: i64 = 20_000_000;
pub(crate) const FIFO_SPAN: i64 = 100_000;
/// First key of the FIFO blocking queue (groups as on the FIFO queue).
pub(crate) const FIFO_BLOCKING_BASE: i64 = 30_000_000;
/// `handler_timeout` of every campaign worker, milliseconds.
pub(crate) const HANDLER_TIMEOUT_MS: u64 = 8_000;
/// Visibility timeout of every campaign worker, seconds.
pub(crate) const VT_SECS: u64 = 4;
/// Bound of every database call of the workers.
pub(crate) const DB_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest retry delay of every campaign worker, milliseconds.
pub(crate) const BACKOFF_MAX_MS: u64 = 1_500;
/// How far out a message handed back by a requeue (retry, snooze, release)
/// may have its visibility timeout: the longest delay a campaign worker
/// requeues with ([`BACKOFF_MAX_MS`] plus pgmq-worker's 20 % jitter; a
/// snooze is 200 ms, a release 0) and a margin of 1 s, less than one
/// visibility timeout, so that an extension of the ended delivery landing
/// after the requeue is seen.
pub(crate) const REQUEUE_BOUND: Duration = Duration::from_millis(BACKOFF_MAX_MS * 6 / 5 + 1_000);

/// How many queues a seed's run has.
pub(crate) const ROLES: usize = 7;

/// Places of the keyed queue's fleet-wide limit.
pub(crate) const FLEET_PLACES: u32 = 3;
/// The weights of the group's high and low queues.
pub(crate) const HIGH_WEIGHT: u32 = 3;
pub(crate) const LOW_WEIGHT: u32 = 1;
/// `poll_interval` of every campaign worker.
pub(crate) const POLL: Duration = Duration::from_millis(100);
/// How long after a pause (or a revocation of the workers' grants) took
/// effect a claim may still be made: one poll interval (the pause watch
/// reads the flag once per poll interval, and a claim loop looks at it
/// right before every read), and 1 s for that flag read and the read
/// itself, which take milliseconds while no other fault is active (faults
/// come one at a time), on a loaded machine.
pub(crate) const CLAIM_BOUND: Duration = Duration::from_millis(POLL.as_millis() as u64 + 1_000);
/// How long after the pause flag's table was locked (every read of the
/// flag hanging) a claim may still be made: one poll interval and
/// pgmq-worker's `STALE_GRACE` of 1 s (the last read of the flag that
/// succeeded may have started right before the lock, and keeps the claims
/// going that long), and 1 s for a claim read started then.
pub(crate) const FLAG_HANG_BOUND: Duration = Duration::from_millis(POLL.as_millis() as u64 + 2_000);
/// The bound of a claim window of the fault `kind`: [`FLAG_HANG_BOUND`]
/// for `pause-flag-locked`, [`CLAIM_BOUND`] for a pause or a revocation.
pub(crate) fn claim_bound(kind: &str) -> Duration {
    match kind {
        "pause-flag-locked" => FLAG_HANG_BOUND,
        _ => CLAIM_BOUND,
    }
}
/// A queue of the prioritized group with messages ready must have one
/// claimed within this long.
pub(crate) const STARVE_BOUND: Duration = Duration::from_secs(3);
/// How long after a kill the places it held must be back: the visibility
/// timeout, and 5 s.
pub(crate) const PLACES_BOUND: Duration = Duration::from_secs(VT_SECS + 5);

/// The queues of a seed's run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Role {
    Plain,
    Tx,
    /// FIFO groups, transactional handler.
    Fifo,
    /// FIFO groups, blocking handler.
    FifoBlocking,
    /// Keyed sends through the proxy; fleet-limited workers.
    Keyed,
    /// The prioritized group's high and low queues.
    High,
    Low,
}

impl Role {
    pub(crate) const ALL: [Role; ROLES] = [
        Role::Plain,
        Role::Tx,
        Role::Fifo,
        Role::FifoBlocking,
        Role::Keyed,
        Role::High,
        Role::Low,
    ];

    pub(crate) fn index(self) -> usize {
        match self {
            Role::Plain => 0,
            Role::Tx => 1,
            Role::Fifo => 2,
            Role::FifoBlocking => 3,
            Role::Keyed => 4,
            Role::High => 5,
            Role::Low => 6,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Role::Plain => "p",
            Role::Tx => "t",
            Role::Fifo => "f",
            Role::FifoBlocking => "b",
            Role::Keyed => "k",
            Role::High => "h",
            Role::Low => "l",
        }
    }

    /// The first key of a FIFO-groups queue (key = base + group *
    /// [`FIFO_SPAN`] + sequence number); None for the others.
    pub(crate) fn fifo_base(self) -> Option<i64> {
        match self {
            Role::Fifo => Some(FIFO_BASE),
            Role::FifoBlocking => Some(FIFO_BLOCKING_BASE),
            _ => None,
        }
    }
}

/// The worker processes' kinds, in the order slots take them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ProcKind {
    /// Context handler with hooks, on the plain queue.
    Plain,
    /// Transactional handler.
    Tx,
    /// FIFO-groups claims, transactional handler.
    Fifo,
    /// Context handler with hooks, inside a `WorkerGroup`.
    Group,
    /// Blocking handler with hooks, on the plain queue.
    Blocking,
    /// FIFO-groups claims, blocking handler, on the FIFO blocking queue.
    FifoBlocking,
    /// Context handler under a fleet-wide limit, on the keyed queue (two of
    /// them share the limit).
    Fleet,
    /// A `WorkerGroup` of the high and low queues under
    /// `Priority::weighted()`.
    Prio,
}

pub(crate) const PROC_ORDER: [ProcKind; 9] = [
    ProcKind::Plain,
    ProcKind::Tx,
    ProcKind::Fifo,
    ProcKind::Group,
    ProcKind::Blocking,
    ProcKind::FifoBlocking,
    ProcKind::Fleet,
    ProcKind::Fleet,
    ProcKind::Prio,
];

/// `--processes` by default: one of each kind (two fleet-limited ones).
pub(crate) const DEFAULT_PROCESSES: usize = PROC_ORDER.len();

impl ProcKind {
    pub(crate) fn role(self) -> Role {
        match self {
            ProcKind::Tx => Role::Tx,
            ProcKind::Fifo => Role::Fifo,
            ProcKind::FifoBlocking => Role::FifoBlocking,
            ProcKind::Fleet => Role::Keyed,
            ProcKind::Prio => Role::High,
            ProcKind::Plain | ProcKind::Group | ProcKind::Blocking => Role::Plain,
        }
    }

    /// Every queue it consumes.
    pub(crate) fn roles(self) -> Vec<Role> {
        match self {
            ProcKind::Prio => vec![Role::High, Role::Low],
            k => vec![k.role()],
        }
    }

    /// Whether its handler writes its ledger row in the handler's
    /// transaction (with the message's delete) rather than on a pool of
    /// its own, where the handler counts the rows it wrote.
    pub(crate) fn transactional(self) -> bool {
        matches!(self, ProcKind::Tx | ProcKind::Fifo)
    }
}

/// Producer flag: some plain messages ask the hook to panic.
pub(crate) const PROBE_HOOK: u8 = 1;
/// Producer flag: some plain messages have a body whose decoding panics.
pub(crate) const PROBE_DECODE: u8 = 2;
/// Producer flag: most plain messages hang for [`STORM_HANG_MS`] on their
/// first attempt (past `handler_timeout`).
pub(crate) const PROBE_HANG: u8 = 4;
/// How long the hangs of a `blocking-hangs` fault last: long enough that
/// a message held while they run is seen held past 30 s.
pub(crate) const STORM_HANG_MS: u64 = 60_000;
/// `max_abandoned_blocking_threads` of the blocking process: small, so
/// that a `blocking-hangs` fault goes past it.
pub(crate) const BLOCKING_CAP: usize = 4;

/// One fault of the schedule.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Planned {
    /// From the start of the run.
    pub at_ms: u64,
    pub kind: &'static str,
    pub duration_ms: u64,
    pub process: usize,
    pub queue: Role,
}

/// A fault as it happened.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FaultEvent {
    pub kind: &'static str,
    pub process: usize,
    pub queue: Role,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// The injection's or clearing's error, when it failed.
    pub error: Option<String>,
    pub holds_backends: bool,
}

/// What a key was sent to do (by default: succeed, once).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Plan {
    /// It can only end in the dead-letter queue (poison, a body that never
    /// decodes).
    pub dead_letter: bool,
    /// A second handling is not a fault's doing (a hook panicking after the
    /// handler succeeded may have the run retried).
    pub may_repeat: bool,
    /// It fails until redriven: a dead letter unless a `redrive` fault sent
    /// it back, after which it must succeed.
    pub until_redriven: bool,
}

/// How a worker process ended.
#[derive(Debug, Clone)]
pub(crate) struct ProcExit {
    pub kind: ProcKind,
    pub app_name: String,
    pub pid: u32,
    /// `kill`, `term`, `crashed` or `end` (the final graceful stop).
    pub how: &'static str,
    pub exit: Option<Exit>,
}

/// The ledger's scenario label of a queue of a seed's run.
pub(crate) fn scenario_of(seed_label: &str, role: Role) -> String {
    format!("c{seed_label}{}", role.label())
}

/// What the sampler saw once.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub at: DateTime<Utc>,
    /// Connections per application name of the live worker processes.
    pub conns: Vec<(String, i64, i64)>,
    /// Messages per queue with a visibility timeout beyond now + 15 s.
    pub far_vt: [i64; ROLES],
    /// Messages per queue invisible under a delivery older than 30 s.
    pub held_long: [i64; ROLES],
    /// Messages per queue ready to be read (visible).
    pub ready: [i64; ROLES],
    /// Invisible messages per queue that a requeue handed back (see
    /// [`Watch::requeued`]).
    pub requeued: [i64; ROLES],
    /// Those of them whose visibility timeout was beyond now +
    /// [`REQUEUE_BOUND`]: queue, message id and how far out, ms.
    pub requeued_far: Vec<(Role, i64, i64)>,
}

/// What the campaign document records of a seed.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SeedSummary {
    pub seed: u64,
    pub duration_s: u64,
    pub processes: Vec<ProcKind>,
    pub schedule: Vec<Planned>,
    /// Faults injected, by kind.
    pub faults_by_kind: std::collections::BTreeMap<String, u64>,
    pub fault_errors: Vec<String>,
    pub pass: bool,
    pub replay: String,
}
