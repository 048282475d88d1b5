//! What the fixed scenarios share: a consuming scenario under way
//! ([`Run`]: its queues, what it produced, its checks, the duplicates its
//! faults explain) and the helpers that stop workers, find held keys and
//! hold an acknowledgement back.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::child::{Exit, WorkerProc};
use crate::ctx::{poll_until, session, Ctx, Queues};
use crate::job::Job;
use crate::ledger::{Handling, Produced};
use crate::report::{Check, DupBound, Row};
use crate::worker::FaultSpec;
use crate::BoxError;

/// How long a queue may take to drain once the faults are over.
pub(crate) fn drain_limit(ctx: &Ctx) -> Duration {
    Duration::from_secs(30 + (ctx.n as u64 / 500))
}

/// One consuming scenario under way: its queues, what it produced, its checks.
pub(crate) struct Run<'a> {
    pub ctx: &'a Ctx,
    pub label: &'static str,
    pub qs: Queues,
    pub produced: Produced,
    pub checks: Vec<Check>,
    /// Whether messages may end in the dead-letter queue here (poison,
    /// panics); elsewhere a dead letter is a message that was never handled.
    pub dead_letters_expected: bool,
    /// Duplicates the faults can explain, added up fault by fault
    /// ([`Run::allow_duplicates`]); without any, none are allowed.
    bound: Option<DupBound>,
    /// The keys each fault left held (claimed or unacknowledged), when the
    /// scenario can know them: every duplicated key must be one of them.
    suspects: Option<HashSet<i64>>,
    started: Instant,
}

impl<'a> Run<'a> {
    /// Fresh queues for scenario `label`.
    pub(crate) async fn start(ctx: &'a Ctx, label: &'static str) -> Result<Run<'a>, BoxError> {
        Ok(Run {
            ctx,
            label,
            qs: ctx.queues(&format!("s{label}")).await?,
            produced: Produced::default(),
            checks: Vec::new(),
            dead_letters_expected: false,
            bound: None,
            suspects: None,
            started: Instant::now(),
        })
    }

    /// Produces `jobs` (unfaulted).
    pub(crate) async fn produce(&mut self, jobs: &[Job]) {
        let p = self.ctx.produce(&self.qs.q, jobs).await;
        self.produced.merge(p);
    }

    /// Produces `n` plain jobs, keys `0..n`.
    pub(crate) async fn produce_plain(&mut self, n: usize) {
        let jobs = self.ctx.plain_jobs(n);
        self.produce(&jobs).await;
    }

    /// Produces the scenario's `ctx.n` plain jobs and returns the args of
    /// its worker, whose handlers sleep `sleep_ms` under a visibility
    /// timeout of `vt_secs`.
    pub(crate) async fn plain_backlog(&mut self, vt_secs: u64, sleep_ms: u64) -> FaultSpec {
        self.produce_plain(self.ctx.n).await;
        let mut args = self.worker_args();
        args.set_vt_secs(vt_secs);
        args.sleep_ms = sleep_ms;
        args
    }

    /// Produces `k` more plain jobs after the scenario's first `ctx.n`
    /// (keys `ctx.n..ctx.n + k`), sent once a fault is over.
    pub(crate) async fn produce_after_fault(&mut self, k: usize) {
        let first = self.ctx.n as i64;
        let jobs: Vec<Job> = (first..first + k as i64).map(Job::plain).collect();
        self.produce(&jobs).await;
    }

    /// Default worker settings for this scenario.
    pub(crate) fn worker_args(&self) -> FaultSpec {
        self.ctx.worker_args(&self.qs, self.label)
    }

    /// Starts a worker process straight on the cluster.
    pub(crate) async fn spawn(&self, args: &FaultSpec) -> Result<WorkerProc, BoxError> {
        self.ctx.spawn_worker(args).await
    }

    /// Allows `n` more duplicates, with what explains them (one fault).
    pub(crate) fn allow_duplicates(&mut self, n: u64, why: impl Into<String>) {
        let why = why.into();
        match &mut self.bound {
            Some(b) => {
                b.max += n;
                b.why.push_str("; ");
                b.why.push_str(&why);
            }
            None => self.bound = Some(DupBound { max: n, why }),
        }
    }

    /// Records keys a fault left held: duplicates may only be among them.
    pub(crate) fn suspect(&mut self, keys: impl IntoIterator<Item = i64>) {
        self.suspects.get_or_insert_with(HashSet::new).extend(keys);
    }

    /// Allows a duplicate for each key `held` by a fault that `why`
    /// explains, and only among those keys.
    pub(crate) fn allow_held(&mut self, held: &[i64], why: String) {
        self.allow_duplicates(held.len() as u64, why);
        self.suspect(held.iter().copied());
    }

    /// The keys of the messages invisible right now: claimed by some worker
    /// (running, queued for a handler, or handled and not yet acknowledged).
    pub(crate) async fn held_keys(&self) -> Result<Vec<i64>, BoxError> {
        held_keys(self.ctx, &self.qs.q).await
    }

    /// Allows, for one fault, the messages held then plus one read batch per
    /// claim loop that may have been in flight (its claims not yet visible
    /// in the table when it was sampled), and records the held keys.
    pub(crate) fn allow_fault(&mut self, fault: &str, held: &[i64], args: &FaultSpec) {
        let batch = args.batch_size();
        self.allow_duplicates(
            held.len() as u64 + CLAIM_LOOPS * batch as u64,
            format!(
                "{fault}: {} held + {CLAIM_LOOPS} reads x {batch} in flight",
                held.len()
            ),
        );
    }

    /// Adds a check.
    pub(crate) fn check(&mut self, name: &str, pass: bool, detail: impl Into<String>) {
        self.checks.push(Check::new(name, pass, detail));
    }

    /// Waits until `i` quarters of the messages were handled; returns the
    /// handlings counted then.
    pub(crate) async fn wait_quarter(&self, i: i64) -> Result<i64, BoxError> {
        self.wait_handled(self.ctx.n as i64 * i / 4).await
    }

    /// Waits until `rows` handlings are in the ledger; returns the count then.
    pub(crate) async fn wait_handled(&self, rows: i64) -> Result<i64, BoxError> {
        self.ctx
            .wait_progress(self.label, rows, Duration::from_secs(120))
            .await?;
        Ok(self.ctx.progress(self.label).await.unwrap_or(rows))
    }

    /// Waits for the queue to drain (the worker keeps running).
    pub(crate) async fn wait_drained(&self) -> bool {
        self.ctx
            .wait_drained(&self.qs.q, drain_limit(self.ctx))
            .await
    }

    /// The end of a scenario whose messages one worker of `args`, started
    /// now, consumes: [`Run::finish`] with that worker.
    pub(crate) async fn finish_by(
        self,
        title: &str,
        args: &FaultSpec,
    ) -> Result<Finished, BoxError> {
        let w = self.spawn(args).await?;
        self.finish(title, vec![w]).await
    }

    /// The end of every consuming scenario: wait for the queue to drain,
    /// stop the workers gracefully, count, drop the queues, make the row.
    pub(crate) async fn finish(
        mut self,
        title: &str,
        workers: Vec<WorkerProc>,
    ) -> Result<Finished, BoxError> {
        let ctx = self.ctx;
        let exits = self.drain_and_stop(workers).await;
        let acc = ctx.account(self.label, &self.qs, &self.produced).await?;
        ctx.drop_queues(&self.qs).await;
        if !self.dead_letters_expected {
            let n = acc.dead.len();
            self.check(
                "nothing dead-lettered",
                n == 0,
                format!("{n} messages in the dead-letter queue, none of which ever failed"),
            );
        }
        if let Some(suspects) = &self.suspects {
            let check = suspects_check(&acc.handlings, suspects);
            self.checks.push(check);
        }
        let row = Row::new(
            self.label,
            title,
            acc.tally,
            self.bound,
            self.checks,
            self.started.elapsed(),
        );
        Ok(Finished {
            dead_reasons: acc.dead_reasons,
            row,
            handlings: acc.handlings,
            dead: acc.dead,
            exits: exits.into_iter().filter_map(Result::ok).collect(),
        })
    }

    /// Waits for the queue to drain, checks that every worker is still
    /// running, then stops them all and checks that each stopped cleanly.
    async fn drain_and_stop(
        &mut self,
        mut workers: Vec<WorkerProc>,
    ) -> Vec<Result<Exit, BoxError>> {
        let drained = self.wait_drained().await;
        let detail = if drained {
            format!(
                "empty {:.1} s after the start",
                self.started.elapsed().as_secs_f64()
            )
        } else {
            format!("not empty after {} s", drain_limit(self.ctx).as_secs())
        };
        self.check("queue drained", drained, detail);
        let alive = workers
            .iter_mut()
            .map(|w| w.running())
            .filter(|r| *r)
            .count();
        self.check(
            "workers ran to the end",
            alive == workers.len(),
            format!(
                "{alive} of {} worker processes still running (none crashed)",
                workers.len()
            ),
        );
        let exits = stop_all(workers).await;
        let clean = exits
            .iter()
            .filter(|e| e.as_ref().is_ok_and(|e| e.clean()))
            .count();
        self.check(
            "workers stopped cleanly",
            clean == exits.len(),
            format!(
                "{clean} of {} exited 0 after SIGTERM with a shutdown report{}",
                exits.len(),
                describe_exits(&exits)
            ),
        );
        exits
    }
}

/// Every key handled more than once must be one a fault left held.
fn suspects_check(handlings: &[Handling], suspects: &HashSet<i64>) -> Check {
    let mut seen = HashSet::new();
    let odd: Vec<i64> = handlings
        .iter()
        .filter(|h| !seen.insert(h.key) && !suspects.contains(&h.key))
        .map(|h| h.key)
        .collect();
    Check::new(
        "duplicates only of messages held at a fault",
        odd.is_empty(),
        format!(
            "{} duplicated handlings of keys no fault left held (e.g. {:?}); {} keys held at the faults",
            odd.len(),
            &odd[..odd.len().min(5)],
            suspects.len()
        ),
    )
}

/// What [`Run::finish`] found.
pub(crate) struct Finished {
    pub row: Row,
    pub handlings: Vec<Handling>,
    /// Keys in the dead-letter queue.
    pub dead: HashSet<i64>,
    /// The reason pgmq-worker wrote on each keyed dead letter.
    pub dead_reasons: std::collections::HashMap<i64, String>,
    /// The workers' exits (those that could be waited for).
    pub exits: Vec<Exit>,
}

impl Finished {
    /// The shutdown report of the first worker that gave one.
    pub(crate) fn report(&self) -> Option<&serde_json::Value> {
        self.exits.iter().find_map(|e| e.said.report.as_ref())
    }
}

/// Claim loops per worker (pgmq-worker's default, which the fault worker keeps).
pub(crate) const CLAIM_LOOPS: u64 = 2;

/// The keys of the messages of `q` invisible right now (claimed and not yet
/// deleted, released or expired), read from the table without reading them.
pub(crate) async fn held_keys(ctx: &Ctx, q: &pgmq_client::QueueName) -> Result<Vec<i64>, BoxError> {
    let conn = ctx.client.connection().await?;
    let sql = format!(
        "select coalesce((headers->>'{}')::bigint, -1) from {} where vt > clock_timestamp()",
        crate::job::KEY_HEADER,
        q.quoted_table()
    );
    let rows = conn.query(sql.as_str(), &[]).await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// SIGTERMs every worker at once and waits for them.
pub(crate) async fn stop_all(workers: Vec<WorkerProc>) -> Vec<Result<Exit, BoxError>> {
    let stops = workers.into_iter().map(|w| w.stop(Duration::from_secs(30)));
    futures::future::join_all(stops).await
}

fn describe_exits(exits: &[Result<Exit, BoxError>]) -> String {
    let bad: Vec<String> = exits
        .iter()
        .filter_map(|e| match e {
            Ok(e) if e.clean() => None,
            Ok(e) => Some(e.describe()),
            Err(e) => Some(e.to_string()),
        })
        .collect();
    if bad.is_empty() {
        String::new()
    } else {
        format!(" ({})", bad.join("; "))
    }
}

/// A transaction of the suite's own that holds row locks on every message
/// held by a worker right now: an acknowledgement (delete, archive, set_vt)
/// of any of them then waits on the lock, so that a crash can be made to
/// land in the middle of one. Rolled back when dropped or when its server
/// dies.
pub(crate) struct AckHold {
    conn: tokio_postgres::Client,
    /// The keys locked.
    pub keys: Vec<i64>,
}

impl AckHold {
    /// Locks the held (invisible) messages of `q`.
    pub(crate) async fn lock(ctx: &Ctx, q: &pgmq_client::QueueName) -> Result<AckHold, BoxError> {
        let conn = session(&ctx.cluster.dsn(), "pgmq-faults-lock").await?;
        conn.batch_execute("begin").await?;
        let sql = format!(
            "select coalesce((headers->>'{}')::bigint, -1) from {} \
             where vt > clock_timestamp() for update",
            crate::job::KEY_HEADER,
            q.quoted_table()
        );
        let keys = conn
            .query(sql.as_str(), &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        Ok(AckHold { conn, keys })
    }

    /// Lets the waiting acknowledgements through.
    pub(crate) async fn release(self) {
        let _ = self.conn.batch_execute("rollback").await;
    }
}

/// How many of the fault workers' acknowledgements (delete, archive,
/// set_vt: the ledger's inserts and the reads do not match) are running in
/// the server right now, and how many of those wait on a lock.
pub(crate) async fn acks_in_flight(ctx: &Ctx) -> Result<(i64, i64), BoxError> {
    let conn = ctx.client.connection().await?;
    let row = conn
        .query_one(
            "select count(*), count(*) filter (where wait_event_type = 'Lock') \
             from pg_stat_activity \
             where application_name = 'pgmq-fault-worker' and state = 'active' \
               and query ~* '(delete|archive|set_vt)'",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// Polls until an acknowledgement waits on a lock; false after `limit`.
pub(crate) async fn wait_ack_blocked(ctx: &Ctx, limit: Duration) -> bool {
    poll_until(limit, Duration::from_millis(20), || async {
        matches!(acks_in_flight(ctx).await, Ok((_, n)) if n > 0)
    })
    .await
    .is_some()
}

/// Locks the held messages until an acknowledgement waits on the lock,
/// trying up to `tries` times (a try fails when no acknowledgement reached
/// the locked rows within 3 s); returns the hold and the try that worked.
pub(crate) async fn block_an_ack(
    ctx: &Ctx,
    q: &pgmq_client::QueueName,
    tries: u32,
) -> Result<(AckHold, u32), BoxError> {
    let mut locked = Vec::new();
    for i in 1..=tries {
        let hold = AckHold::lock(ctx, q).await?;
        if wait_ack_blocked(ctx, Duration::from_secs(3)).await {
            return Ok((hold, i));
        }
        locked.push(hold.keys.len().to_string());
        hold.release().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "no acknowledgement waited on the locked messages in {tries} tries \
         (messages locked at each try: {})",
        locked.join(", ")
    )
    .into())
}

/// Settings for a worker that must ride out an outage: handlers fail while
/// the server is unreachable, and that must not exhaust the attempts.
pub(crate) fn outage_tolerant(mut args: FaultSpec) -> FaultSpec {
    args.set_retries(1000, 200, 1000);
    args.sleep_ms = 1;
    args
}
