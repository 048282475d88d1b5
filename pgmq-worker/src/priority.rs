//! Priorities across queues: how a [`WorkerGroup`](crate::WorkerGroup)
//! divides one handler capacity among its queues.
//!
//! PGMQ has no message priorities; a group with a [`Priority`] policy gives
//! some of its queues precedence over others. The group holds one
//! capacity shared by all its workers, and the policy decides which
//! worker's claim loops may claim when some of it frees up:
//!
//! - [`Priority::strict`]: the worker of the highest rank that has
//!   messages ready gets all of it; a lower one claims only while every
//!   higher one has nothing ready (its last read came back short).
//! - [`Priority::weighted`]: each worker with messages ready gets a share
//!   in proportion to its weight (stride scheduling on the messages
//!   claimed: what a read was granted and did not return is not charged);
//!   a worker with nothing ready gives its share to the others.
//!
//! **Claims, not only handler starts.** The capacity is counted in
//! messages in flight (being read, queued in a claim queue, or running):
//! a claim loop asks the group's [`Gate`] before its read (after taking
//! room in its worker's claim queue) and reads only what it was granted;
//! what the read did not fill goes back at once, the rest when each
//! message's handling ends (the handler loop's [`Slot`]). So a queue whose
//! turn has not come holds no claimed message whose visibility timeout
//! runs while it waits, and with a backlog on every queue the claimed share
//! and the handled share are the same.
//!
//! **Runs and claims ahead.** At most `concurrency` handlers run at once
//! across the group: a handler loop that took a message waits for one of
//! the group's runs, a FIFO semaphore, so that runs start in the order the
//! messages were claimed. The claims may run ahead of the runs by what the
//! handlers start within a quarter of the shortest visibility timeout
//! among the workers (Little's law on the group's moving average of run
//! time, as a worker's own claim limit does; at most 3 × `concurrency`,
//! or what the handlers start during two reads when runs are shorter than
//! a read, at most 64 × `concurrency`; none until the first run ended,
//! [`claim_budget`]): with short handlers a read takes about as long as a
//! run or longer, and without claims ahead the handlers would idle while
//! the next ones are read. What is claimed ahead runs within the longer of
//! three runs and two reads.
//!
//! **Backlog, as the claim loops see it.** A worker counts as having
//! messages ready while one of its claim loops waits at the gate, or while
//! its last read came back full (its loop is reading again). Capacity freed
//! while the worker next in turn is between two reads is kept for it
//! (strict), or lent to another worker unless that one is already more than
//! a round of capacity ahead (weighted), so that the share follows the
//! policy without leaving the capacity idle for long.
//!
//! **A paused queue holds nothing.** A worker whose queue is paused
//! ([`crate::pause`]) counts as having nothing ready: its loops leave the
//! gate (a wait for a grant ends when the pause is seen, and a grant seen
//! after it goes back unread) and clear its backlog, so the others get its
//! share, under either policy. Once resumed, its loops ask for grants again
//! and it is ready as before.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// How a [`WorkerGroup`](crate::WorkerGroup) divides its handlers among
/// its queues: [`strict`](Self::strict) or
/// [`weighted`](Self::weighted) (the default), over a group-wide
/// [`concurrency`](Self::concurrency).
///
/// Each worker's number, given with
/// [`WorkerGroup::with_worker_priority`](crate::WorkerGroup::with_worker_priority),
/// is its weight (weighted) or its rank (strict, higher first); a worker
/// added with [`WorkerGroup::with_worker`](crate::WorkerGroup::with_worker)
/// to a prioritized group has 1.
///
/// ```no_run
/// # async fn f(client: pgmq_client::Client, high: pgmq_worker::Worker<u64>,
/// #   mid: pgmq_worker::Worker<u64>, low: pgmq_worker::Worker<u64>) -> Result<(), pgmq_worker::Error> {
/// use pgmq_worker::{Priority, WorkerGroup};
///
/// // With a backlog on every queue: 4/7, 2/7 and 1/7 of 8 handlers.
/// let group = WorkerGroup::new(client)
///     .priority(Priority::weighted().concurrency(8))
///     .with_worker_priority(high, 4)
///     .with_worker_priority(mid, 2)
///     .with_worker_priority(low, 1);
/// group.run_until_signal().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Priority {
    strict: bool,
    concurrency: Option<usize>,
}

impl Default for Priority {
    /// [`Priority::weighted`].
    fn default() -> Self {
        Priority::weighted()
    }
}

impl Priority {
    /// Strict priorities: a worker claims only while every worker of a
    /// higher rank has no message ready; workers of equal rank share
    /// equally.
    ///
    /// ```
    /// use pgmq_worker::Priority;
    /// let p = Priority::strict();
    /// assert!(p.is_strict());
    /// ```
    pub fn strict() -> Self {
        Priority {
            strict: true,
            concurrency: None,
        }
    }

    /// Weighted shares: with a backlog on every queue, each worker gets
    /// `weight / sum of weights` of the capacity (so weights 4, 2, 1 give
    /// 57 %, 29 %, 14 %), and no queue with messages ready is starved; a
    /// worker with nothing ready leaves its share to the others.
    ///
    /// ```
    /// use pgmq_worker::Priority;
    /// let p = Priority::weighted();
    /// assert!(!p.is_strict());
    /// assert_eq!(p, Priority::default());
    /// ```
    pub fn weighted() -> Self {
        Priority {
            strict: false,
            concurrency: None,
        }
    }

    /// The group's concurrency: the most handlers running at once across
    /// all its queues (0 counts as 1); the claims run ahead of it by what
    /// the handlers start within a quarter of the shortest visibility
    /// timeout, at most 3 × this many (or, with handlers shorter than a
    /// read, what they start during two reads, at most 64 × this many).
    /// Default: the smallest `concurrency` among the group's workers, so
    /// that any one of them can use all of it when the others have nothing
    /// ready. A worker never runs more handlers than its own
    /// `concurrency`: give each at least the group's.
    ///
    /// ```
    /// use pgmq_worker::Priority;
    /// let p = Priority::strict().concurrency(16);
    /// assert_eq!(p.capacity(), Some(16));
    /// ```
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = Some(n.max(1));
        self
    }

    /// Whether this is [`Priority::strict`].
    ///
    /// ```
    /// assert!(pgmq_worker::Priority::strict().is_strict());
    /// ```
    pub fn is_strict(&self) -> bool {
        self.strict
    }

    /// The capacity set with [`concurrency`](Self::concurrency), if any.
    ///
    /// ```
    /// assert_eq!(pgmq_worker::Priority::weighted().capacity(), None);
    /// ```
    pub fn capacity(&self) -> Option<usize> {
        self.concurrency
    }
}

/// Pass units per message granted at weight 1 (stride scheduling).
const SCALE: u64 = 1 << 20;

/// One worker's standing in the [`Policy`].
#[derive(Debug, Clone)]
struct Standing {
    /// Its weight (weighted) or rank (strict).
    level: u32,
    /// Virtual time: advances by `SCALE / weight` per message granted.
    pass: u64,
    /// Its last read came back full (its loop will be back at once), or it
    /// has not read yet (its messages are not known: a worker that starts
    /// late does not find the capacity taken by a lower priority).
    backlog: bool,
    /// Its claim loops waiting at the gate now.
    waiting: usize,
}

/// The policy's arithmetic, without clocks or locks: who claims next.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    strict: bool,
    /// How far (in pass units) a waiting worker may run ahead of the one
    /// in turn that is between reads before capacity is kept for the
    /// latter (weighted).
    slack: u64,
    members: Vec<Standing>,
}

impl Policy {
    /// A policy over workers of these levels (weights or ranks, 0 counts
    /// as 1), for a capacity of `capacity` messages.
    pub(crate) fn new(strict: bool, levels: &[u32], capacity: usize) -> Self {
        let total: u64 = levels.iter().map(|l| u64::from((*l).max(1))).sum();
        Policy {
            strict,
            // One round of the capacity at the average weight.
            slack: SCALE * capacity as u64 * levels.len().max(1) as u64 / total.max(1),
            members: levels
                .iter()
                .map(|l| Standing {
                    level: (*l).max(1),
                    pass: 0,
                    backlog: true,
                    waiting: 0,
                })
                .collect(),
        }
    }

    fn eligible(s: &Standing) -> bool {
        s.backlog || s.waiting > 0
    }

    /// Worker `i`'s loop starts waiting for a grant. A worker that had
    /// nothing ready starts at the pass of those that did, so that time
    /// without messages earns it no burst afterwards.
    pub(crate) fn enter(&mut self, i: usize) {
        if !Self::eligible(&self.members[i]) {
            let floor = self
                .members
                .iter()
                .enumerate()
                .filter(|(j, s)| *j != i && Self::eligible(s))
                .map(|(_, s)| s.pass)
                .min();
            if let Some(floor) = floor {
                let me = &mut self.members[i];
                me.pass = me.pass.max(floor);
            }
        }
        let me = &mut self.members[i];
        me.waiting += 1;
        me.backlog = true;
    }

    /// Worker `i`'s loop stops waiting (granted, or stopped).
    pub(crate) fn leave(&mut self, i: usize) {
        let me = &mut self.members[i];
        me.waiting = me.waiting.saturating_sub(1);
    }

    /// Worker `i` was granted `n` messages.
    pub(crate) fn granted(&mut self, i: usize, n: usize) {
        let cost = self.cost(i, n);
        let me = &mut self.members[i];
        me.pass = me.pass.saturating_add(cost);
    }

    /// What `n` messages move worker `i`'s pass: `SCALE / weight` each
    /// (weighted), `SCALE` each (strict).
    fn cost(&self, i: usize, n: usize) -> u64 {
        let stride = if self.strict {
            SCALE
        } else {
            SCALE / u64::from(self.members[i].level)
        };
        stride.saturating_mul(n as u64)
    }

    /// Worker `i` gave back `n` of the messages it was granted (its read
    /// came back short, failed, or was not made): they are not charged, so
    /// that the pass counts the messages claimed. A worker whose reads come
    /// back short (a queue with a trickle of messages) would otherwise run
    /// ahead of its weight on messages it never had, and then wait behind
    /// lower weights when its messages come.
    pub(crate) fn returned(&mut self, i: usize, n: usize) {
        let cost = self.cost(i, n);
        let me = &mut self.members[i];
        me.pass = me.pass.saturating_sub(cost);
    }

    /// Worker `i`'s share of `budget` messages: all of it when strict (one
    /// rank claims at a time), else in proportion to its weight among all
    /// the workers' weights.
    pub(crate) fn share(&self, i: usize, budget: usize) -> usize {
        if self.strict {
            return budget;
        }
        let total: u64 = self.members.iter().map(|s| u64::from(s.level)).sum();
        let mine = u64::from(self.members[i].level);
        usize::try_from((budget as u64).saturating_mul(mine) / total.max(1)).unwrap_or(budget)
    }

    /// Worker `i` claims nothing for now (its queue is paused): it has no
    /// messages ready until one of its loops next waits for a grant, so it
    /// holds no capacity for itself meanwhile.
    pub(crate) fn idle(&mut self, i: usize) {
        self.members[i].backlog = false;
    }

    /// Worker `i`'s read of `asked` messages returned `got`: short means
    /// nothing more is ready for now, unless it read only the `tail` of
    /// the queue (after its bound; a read from the start follows).
    pub(crate) fn read(&mut self, i: usize, asked: usize, got: usize, tail: bool) {
        self.members[i].backlog = got >= asked || tail;
    }

    /// Whether any loop waits.
    pub(crate) fn anyone_waiting(&self) -> bool {
        self.members.iter().any(|s| s.waiting > 0)
    }

    /// The waiting worker that may claim now, if any: among the workers
    /// with messages ready (of the highest rank, when strict), the one
    /// furthest behind (lowest pass); when that one is between reads, a
    /// waiting worker of the same rank within `slack` of it (weighted
    /// only), else nobody (the capacity is kept for it).
    pub(crate) fn next(&self) -> Option<usize> {
        let top = if self.strict {
            self.members
                .iter()
                .filter(|s| Self::eligible(s))
                .map(|s| s.level)
                .max()?
        } else {
            0
        };
        let candidates = || {
            self.members
                .iter()
                .enumerate()
                .filter(move |(_, s)| Self::eligible(s) && (!self.strict || s.level == top))
        };
        let (due, due_s) = candidates().min_by_key(|(j, s)| (s.pass, *j))?;
        if due_s.waiting > 0 {
            return Some(due);
        }
        let (other, other_s) = candidates()
            .filter(|(_, s)| s.waiting > 0)
            .min_by_key(|(j, s)| (s.pass, *j))?;
        let slack = if self.strict { 0 } else { self.slack };
        (other_s.pass - due_s.pass <= slack).then_some(other)
    }
}

/// The group's capacity and its policy, shared by every member's claim
/// loops and handler loops.
pub(crate) struct Gate {
    state: Mutex<State>,
    /// Handler runs across the group: `concurrency` permits, taken in the
    /// order the messages were taken from the claim queues (FIFO), so that
    /// the running share follows the claimed share.
    running: Arc<Semaphore>,
    /// The most one run takes of `running`.
    concurrency: usize,
    /// Loops waiting at the gate look again.
    changed: Notify,
    /// How long a claimed message may wait for its run: a quarter of the
    /// shortest visibility timeout among the group's workers, in µs.
    ahead_us: u64,
}

struct State {
    /// Messages granted and not yet finished (being read, queued or
    /// running).
    in_flight: usize,
    /// The moving average of a run's time per message, in µs (0 until the
    /// first run ends).
    avg_run_us: u64,
    /// The moving average of a read's time (from its start to its rows),
    /// in µs (0 until the first read returns).
    avg_read_us: u64,
    policy: Policy,
}

/// How many messages a group keeps in flight (claimed, queued or running):
/// its `concurrency`, plus the claims ahead of the runs, and nothing ahead
/// until the first run ended. The claims ahead are what the handlers start
/// within `ahead_us` at the average run time `avg_run_us` (Little's law, as
/// the claimers' own claim limit), at most `CLAIM_AHEAD - 1` times
/// `concurrency`, or, when runs are shorter than a read, what they start
/// during [`READS_AHEAD`] reads of the average read time `avg_read_us`, at
/// most [`SHORT_AHEAD`] times `concurrency`. The messages beyond the
/// running ones wait, already claimed, for a run, so that the handlers do
/// not idle while the next claims are read; a message of a higher queue
/// waits behind them for at most the longer of `CLAIM_AHEAD - 1` runs and
/// `READS_AHEAD` reads.
pub(crate) fn claim_budget(
    concurrency: usize,
    ahead_us: u64,
    avg_run_us: u64,
    avg_read_us: u64,
) -> usize {
    let c = concurrency as u64;
    // Nothing ahead while the run time is not known (0).
    let Some(within) = c.saturating_mul(ahead_us).checked_div(avg_run_us) else {
        return concurrency;
    };
    let during_reads = c
        .saturating_mul(READS_AHEAD)
        .saturating_mul(avg_read_us)
        .checked_div(avg_run_us)
        .unwrap_or(0);
    let most = during_reads.clamp(
        c * (CLAIM_AHEAD as u64 - 1),
        c * (SHORT_AHEAD as u64).max(CLAIM_AHEAD as u64 - 1),
    );
    concurrency + usize::try_from(within.min(most)).unwrap_or(usize::MAX)
}

impl Gate {
    /// A gate of `concurrency` handler runs and of the claims
    /// [`claim_budget`] allows, over workers of these levels, the shortest
    /// of whose visibility timeouts is `visibility`.
    pub(crate) fn new(
        policy: &Priority,
        levels: &[u32],
        concurrency: usize,
        visibility: Duration,
    ) -> Arc<Gate> {
        let concurrency = concurrency.max(1);
        Arc::new(Gate {
            state: Mutex::new(State {
                in_flight: 0,
                avg_run_us: 0,
                avg_read_us: 0,
                policy: Policy::new(policy.strict, levels, concurrency * GRANT),
            }),
            running: Arc::new(Semaphore::new(concurrency)),
            concurrency,
            changed: Notify::new(),
            ahead_us: u64::try_from(visibility.as_micros() / 4).unwrap_or(u64::MAX),
        })
    }

    /// The most in flight now ([`claim_budget`]).
    fn budget(&self, st: &State) -> usize {
        claim_budget(
            self.concurrency,
            self.ahead_us,
            st.avg_run_us,
            st.avg_read_us,
        )
    }

    /// What may be granted now.
    fn free(&self, st: &State) -> usize {
        self.budget(st).saturating_sub(st.in_flight)
    }

    /// The least a grant gives (unless the loop asked for less), so that a
    /// claim is not one read per message: half the budget, at most
    /// [`GRANT`] × `concurrency`.
    fn at_least(&self, st: &State) -> usize {
        let half = self.budget(st) / 2;
        half.min(GRANT * self.concurrency).max(1)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `n` messages no longer in flight; `run_us` per message when they
    /// ran (folded into the average, weight 1/8). The waiting loops look
    /// again when a grant's least is free, or when something is free after
    /// nothing was (for a loop that asks for less): every run's end would
    /// otherwise wake every one of them to find too little.
    fn give_back(&self, n: usize, run_us: Option<u64>) {
        if n == 0 {
            return;
        }
        let wake = {
            let mut st = self.lock();
            let none_free = self.free(&st) == 0;
            st.in_flight = st.in_flight.saturating_sub(n);
            if let Some(us) = run_us {
                let us = us.max(1);
                st.avg_run_us = match st.avg_run_us {
                    0 => us,
                    old => (old * 7 + us) / 8,
                };
            }
            let free = self.free(&st);
            st.policy.anyone_waiting() && (none_free || free >= self.at_least(&st))
        };
        if wake {
            self.changed.notify_waiters();
        }
    }
}

/// The most a group keeps in flight, in multiples of its `concurrency`
/// ([`claim_budget`]): with short handlers, a read takes about as long as
/// a run, and claims of less than this leave handlers idle. Kept small:
/// what a group holds claimed is out of its priorities' reach (a message
/// of a higher queue arriving now waits behind it), and out of the other
/// processes' reach.
const CLAIM_AHEAD: usize = 4;

/// The reads whose time the claims ahead may cover when runs are shorter
/// than a read ([`claim_budget`]): with empty handlers the group is bounded
/// by its reads, and claims ahead of one read's worth leave the handlers
/// idle between two reads.
const READS_AHEAD: u64 = 2;

/// The most the claims ahead reach when runs are shorter than a read, in
/// multiples of the group's `concurrency` ([`claim_budget`]); what they
/// hold is run within [`READS_AHEAD`] reads.
const SHORT_AHEAD: usize = 64;

/// The most a grant waits for, in multiples of the group's `concurrency`
/// ([`Gate::at_least`]): enough for a read to claim a batch's worth, few
/// enough that the weights are followed grant by grant.
const GRANT: usize = 4;

/// One member's handle on its group's [`Gate`].
#[derive(Clone)]
pub(crate) struct Share {
    gate: Arc<Gate>,
    index: usize,
}

impl Share {
    pub(crate) fn new(gate: &Arc<Gate>, index: usize) -> Self {
        Share {
            gate: Arc::clone(gate),
            index,
        }
    }

    /// A grant of up to `want` messages (at least one) if this worker may
    /// claim now; else None, and the loop must [`claim`](Self::claim).
    pub(crate) fn try_claim(&self, want: usize) -> Option<usize> {
        let mut st = self.gate.lock();
        st.policy.enter(self.index);
        let got = self.grant(&mut st, want);
        if got.is_none() {
            st.policy.leave(self.index);
        }
        got
    }

    /// Under the lock: grants up to `want` (at most this worker's share of
    /// the budget, or the least grant when that is more) when this worker
    /// is next and enough capacity is free.
    fn grant(&self, st: &mut State, want: usize) -> Option<usize> {
        // At most this worker's share of the budget (weighted), so that a
        // large budget does not make the grants coarser than the weights.
        let most = st
            .policy
            .share(self.index, self.gate.budget(st))
            .max(self.gate.at_least(st));
        let want = want.clamp(1, most);
        let free = self.gate.free(st);
        if st.policy.next() != Some(self.index) || free < want.min(self.gate.at_least(st)) {
            return None;
        }
        let n = want.min(free);
        st.in_flight += n;
        st.policy.granted(self.index, n);
        st.policy.leave(self.index);
        Some(n)
    }

    /// Waits for a grant of up to `want` messages (at least one); None when
    /// `stop` fired first.
    pub(crate) async fn claim(&self, want: usize, stop: &CancellationToken) -> Option<usize> {
        let gate = &*self.gate;
        gate.lock().policy.enter(self.index);
        // Leaves the queue of waiters however this future ends.
        let mut waiting = Waiting {
            share: self,
            armed: true,
        };
        loop {
            let notified = gate.changed.notified();
            tokio::pin!(notified);
            // Registered before looking, so a change after the look wakes it.
            notified.as_mut().enable();
            let got = self.grant(&mut gate.lock(), want);
            if let Some(n) = got {
                waiting.armed = false;
                // Another worker may be next now.
                gate.changed.notify_waiters();
                return Some(n);
            }
            tokio::select! {
                biased;
                _ = stop.cancelled() => return None,
                _ = notified => {}
            }
        }
    }

    /// A read granted `asked` messages and returned `got`: the rest go back,
    /// and a short read means this worker has nothing more ready for now,
    /// unless it read only the `tail` of the queue (after the claim loops'
    /// bound: a read from the start follows at once). `took` is the read's
    /// round trip when it succeeded, folded into the group's average read
    /// time (weight 1/8) that sizes the claims ahead of short runs.
    pub(crate) fn read(&self, asked: usize, got: usize, tail: bool, took: Option<Duration>) {
        let got = got.min(asked);
        {
            let mut st = self.gate.lock();
            st.policy.read(self.index, asked, got, tail);
            st.policy.returned(self.index, asked - got);
            if let Some(took) = took {
                let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
                st.avg_read_us = match st.avg_read_us {
                    0 => us,
                    old => (old * 7 + us) / 8,
                };
            }
        }
        self.gate.give_back(asked - got, None);
        // A worker that just ran out may have been the one in turn.
        if got < asked {
            self.gate.changed.notify_waiters();
        }
    }

    /// This worker's queue is paused: it claims nothing until resumed, so
    /// it leaves the workers with messages ready (as one whose last read
    /// came back empty) and the others get its share; it is ready again
    /// when one of its loops next asks for a grant.
    pub(crate) fn pause(&self) {
        self.gate.lock().policy.idle(self.index);
        self.gate.changed.notify_waiters();
    }

    /// A grant of `granted` messages the loop did not read with (it saw
    /// its queue paused after the grant): it goes back, and this worker
    /// counts as having nothing ready.
    pub(crate) fn forgo(&self, granted: usize) {
        self.read(granted, 0, false, None);
    }

    /// `n` messages a handler loop took, once the group lets them run
    /// (waiting for a run of its `concurrency`, in turn); their claim and
    /// their run go back to the group when the slot is dropped (their
    /// handling ended).
    pub(crate) async fn start(&self, n: usize) -> Slot {
        let runs = n.clamp(1, self.gate.concurrency) as u32;
        let run = Arc::clone(&self.gate.running)
            .acquire_many_owned(runs)
            .await
            .ok();
        Slot {
            gate: Arc::clone(&self.gate),
            n,
            started: Instant::now(),
            _run: run,
        }
    }
}

/// Takes a loop out of the waiters when its wait ends without a grant.
struct Waiting<'a> {
    share: &'a Share,
    armed: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.share.gate.lock().policy.leave(self.share.index);
            self.share.gate.changed.notify_waiters();
        }
    }
}

/// Messages a handler loop holds; their capacity goes back to the group
/// when it is dropped.
pub(crate) struct Slot {
    gate: Arc<Gate>,
    n: usize,
    /// When its run started.
    started: Instant,
    /// The handler runs it holds (never closed, so always `Some`).
    _run: Option<OwnedSemaphorePermit>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let us = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.gate.give_back(self.n, Some(us / self.n.max(1) as u64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every member always has a backlog and a loop waiting; grants of one
    /// message go to whoever is next. Returns the messages each got.
    fn backlogged(strict: bool, levels: &[u32], grants: usize) -> Vec<usize> {
        let mut p = Policy::new(strict, levels, 8);
        for i in 0..levels.len() {
            p.enter(i);
        }
        let mut got = vec![0; levels.len()];
        for _ in 0..grants {
            let i = p.next().expect("someone is waiting");
            p.granted(i, 1);
            got[i] += 1;
        }
        got
    }

    #[test]
    fn a_short_read_is_charged_only_what_it_claimed() {
        // Weights 4 and 1, both with messages ready.
        let mut p = Policy::new(false, &[4, 1], 8);
        // The heavier worker is granted 100 and its read returns 5 (a
        // trickle); the lighter one claims 10 meanwhile.
        p.enter(0);
        p.granted(0, 100);
        p.leave(0);
        p.read(0, 100, 5, false);
        p.returned(0, 95);
        p.enter(1);
        p.granted(1, 10);
        p.leave(1);
        // Both wait again: the heavier one has claimed 5 at weight 4, the
        // lighter 10 at weight 1, so the heavier one is due first.
        p.enter(0);
        p.enter(1);
        assert_eq!(p.next(), Some(0));
        // Given back in full, a grant costs nothing.
        let mut q = Policy::new(false, &[1, 1], 8);
        q.granted(0, 50);
        q.returned(0, 50);
        q.granted(1, 1);
        q.enter(0);
        q.enter(1);
        assert_eq!(q.next(), Some(0));
    }

    #[test]
    fn weighted_shares_follow_the_weights_exactly() {
        assert_eq!(
            backlogged(false, &[4, 2, 1], 7_000),
            vec![4_000, 2_000, 1_000]
        );
        assert_eq!(backlogged(false, &[1, 1], 1_000), vec![500, 500]);
        // Weight 0 counts as 1.
        assert_eq!(backlogged(false, &[4, 0], 500), vec![400, 100]);
    }

    #[test]
    fn weighted_grants_interleave() {
        // Within any window of 7 grants, 4:2:1 within one message.
        let mut p = Policy::new(false, &[4, 2, 1], 8);
        (0..3).for_each(|i| p.enter(i));
        let order: Vec<usize> = (0..70)
            .map(|_| {
                let i = p.next().unwrap();
                p.granted(i, 1);
                i
            })
            .collect();
        for w in order.windows(7) {
            let c = |k| w.iter().filter(|&&i| i == k).count();
            assert!((3..=5).contains(&c(0)), "{w:?}");
            assert!((1..=3).contains(&c(1)), "{w:?}");
            assert!(c(2) <= 2, "{w:?}");
        }
    }

    #[test]
    fn strict_serves_the_highest_rank_with_messages_ready() {
        assert_eq!(backlogged(true, &[1, 5, 3], 500), vec![0, 500, 0]);
        // Equal ranks share equally.
        assert_eq!(backlogged(true, &[2, 2, 1], 500), vec![250, 250, 0]);
    }

    #[test]
    fn strict_falls_through_once_the_higher_rank_runs_out() {
        let mut p = Policy::new(true, &[2, 1], 8);
        p.enter(0);
        p.enter(1);
        assert_eq!(p.next(), Some(0));
        p.granted(0, 8);
        p.leave(0);
        // High is reading (its last read was full): the capacity is kept
        // for it, not given to low.
        assert_eq!(p.next(), None);
        // A short read of the tail only (after the bound): a read from the
        // start follows, so high still counts as ready.
        p.read(0, 8, 3, true);
        assert_eq!(p.next(), None);
        // Its read from the start came back short: low's turn.
        p.read(0, 8, 3, false);
        assert_eq!(p.next(), Some(1));
        // High has messages again: it goes first.
        p.enter(0);
        assert_eq!(p.next(), Some(0));
    }

    #[test]
    fn a_paused_worker_holds_no_capacity_for_itself() {
        for strict in [true, false] {
            let mut p = Policy::new(strict, &[4, 1], 8);
            p.enter(1);
            // The heavy worker has not read yet (or its last read was
            // full): while it is between reads, the capacity is kept for
            // it (weighted: beyond the slack).
            assert_eq!(p.next(), if strict { None } else { Some(1) });
            for _ in 0..50 {
                p.granted(1, 1);
            }
            assert_eq!(p.next(), None, "strict {strict}");
            // Paused: the other gets everything.
            p.idle(0);
            for _ in 0..100 {
                assert_eq!(p.next(), Some(1), "strict {strict}");
                p.granted(1, 1);
            }
            // Resumed: its loop asks again, and it is ready as before.
            p.enter(0);
            assert_eq!(p.next(), Some(0), "strict {strict}");
        }
    }

    #[test]
    fn a_worker_with_nothing_ready_gives_its_share_away() {
        let mut p = Policy::new(false, &[4, 1], 8);
        // Until its first read, the heavy worker's capacity is kept for it
        // (beyond the slack).
        p.enter(1);
        p.granted(1, 9);
        assert_eq!(p.next(), None);
        // Its first read finds nothing.
        p.read(0, 8, 0, false);
        // Only the low-weight worker has messages: it gets every grant.
        for _ in 0..100 {
            assert_eq!(p.next(), Some(1));
            p.granted(1, 1);
        }
        // The heavy worker comes back: no credit for its idle time beyond
        // the other's pass, so it does not monopolize; shares resume 4:1.
        p.enter(0);
        let mut got = [0usize; 2];
        for _ in 0..500 {
            let i = p.next().unwrap();
            p.granted(i, 1);
            got[i] += 1;
        }
        assert_eq!(got, [400, 100]);
    }

    #[test]
    fn weighted_lends_capacity_within_the_slack_only() {
        // Capacity 8, two workers of weight 1: slack is 8 messages.
        let mut p = Policy::new(false, &[1, 1], 8);
        p.enter(0);
        p.enter(1);
        p.leave(0); // worker 0 is reading; its last read was full
                    // Worker 1 may run ahead of it by up to 8 messages.
        let mut lent = 0;
        while p.next() == Some(1) {
            p.granted(1, 1);
            lent += 1;
        }
        assert_eq!(lent, 9);
        assert_eq!(p.next(), None);
        // Worker 0 is back: its turn.
        p.enter(0);
        assert_eq!(p.next(), Some(0));
    }

    #[test]
    fn a_weighted_share_of_the_budget_follows_the_weight() {
        let p = Policy::new(false, &[4, 2, 1], 8);
        assert_eq!(
            (0..3).map(|i| p.share(i, 700)).collect::<Vec<_>>(),
            [400, 200, 100]
        );
        // Strict: one rank claims at a time, so all of it.
        let p = Policy::new(true, &[4, 2, 1], 8);
        assert_eq!(p.share(2, 700), 700);
    }

    #[test]
    fn the_claims_ahead_follow_the_run_time() {
        // Not known yet: only the runs themselves.
        assert_eq!(claim_budget(8, 7_500_000, 0, 0), 8);
        // Short runs: three times the concurrency ahead at most.
        assert_eq!(claim_budget(8, 7_500_000, 1_500, 2_000), 32);
        // 10 s runs, a 30 s visibility timeout: what starts within 7.5 s.
        assert_eq!(claim_budget(8, 7_500_000, 10_000_000, 2_000), 14);
        // 60 s runs: one ahead; 80 s runs: nothing.
        assert_eq!(claim_budget(8, 7_500_000, 60_000_000, 2_000), 9);
        assert_eq!(claim_budget(8, 7_500_000, 80_000_000, 2_000), 8);
        // Runs shorter than a read: what starts during two reads, at most
        // 64 times the concurrency ahead.
        assert_eq!(claim_budget(8, 7_500_000, 250, 2_000), 8 + 128);
        assert_eq!(claim_budget(8, 7_500_000, 1_000, 2_000), 8 + 32);
        assert_eq!(claim_budget(8, 7_500_000, 1, 2_000), 8 + 512);
        // ...and never beyond the visibility bound: 8 runs of 1 s within
        // 7.5 s.
        assert_eq!(claim_budget(8, 7_500_000, 1_000_000, 600_000), 8 + 24);
        assert_eq!(claim_budget(8, 10_000, 1_000, 50_000), 8 + 80);
    }

    #[tokio::test]
    async fn the_gate_grants_capacity_and_takes_it_back() {
        // 4 runs at once; until a run ended, 4 claims in flight.
        let gate = Gate::new(&Priority::weighted(), &[1], 4, Duration::from_secs(30));
        let share = Share::new(&gate, 0);
        assert_eq!(share.try_claim(5), Some(4));
        share.read(4, 1, false, None);
        // Three went back.
        assert_eq!(share.try_claim(100), Some(3));
        share.read(3, 3, false, None);
        // Nothing free: waits until a run ends.
        assert_eq!(share.try_claim(1), None);
        // Runs: four at once; a fifth waits for one to end.
        let four: Vec<Slot> = futures::future::join_all((0..4).map(|_| share.start(1))).await;
        let fifth = {
            let share = share.clone();
            tokio::spawn(async move { share.start(1).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!fifth.is_finished());
        drop(four);
        let fifth = fifth.await.unwrap();
        // Four runs of about 20 ms ended: their claims went back, and the
        // budget now holds what starts within 7.5 s ahead (at most 3 x 4).
        assert_eq!(share.try_claim(100), Some(16));
        share.read(16, 16, false, None);
        let stop = CancellationToken::new();
        let waiter = {
            let share = share.clone();
            let stop = stop.clone();
            tokio::spawn(async move { share.claim(1, &stop).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(fifth);
        assert_eq!(waiter.await.unwrap(), Some(1));
        // A stopped wait leaves the waiters.
        stop.cancel();
        assert_eq!(share.claim(1, &stop).await, None);
        assert!(!gate.lock().policy.anyone_waiting());
    }
}
