//! The campaign's core workload: the producer of the plain,
//! transactional and FIFO queues (a mix of messages that succeed, fail,
//! retry, snooze, hang, panic in the handler, in a hook or in
//! `Deserialize`, or are poison; some batches in one transaction across two
//! queues), and what the faults change in it ([`Workload`]: the probes, the
//! redrive of dead letters). The fleet workload ([`fleet`](super::fleet))
//! runs beside it on queues of its own.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgmq_client::{Client, Pgmq, QueueName, SendOptions, FIFO_GROUP_HEADER};
use rand::rngs::StdRng;
use rand::Rng;

use super::model::{
    expires_once, Plan, Role, FIFO_BASE, FIFO_BLOCKING_BASE, FIFO_SPAN, GROUPS, PROBE_DECODE,
    PROBE_HANG, PROBE_HOOK, ROLES, STORM_HANG_MS, TX_BASE,
};
use crate::ctx::Ctx;
use crate::job::{key_headers, Act, Boom, Job, HOOK_PANIC_HEADER, KEY_HEADER, REDRIVEN_HEADER};
use crate::ledger::{self, Produced};
use crate::BoxError;

/// On the FIFO blocking queue, the message of each group with this
/// sequence number modulo [`HANG_EVERY`] (the first of its burst) hangs on
/// its first delivery past `handler_timeout`: the fourth of each group
/// first, so that a short run has a hang in most groups.
const HANG_AT: i64 = 3;
const HANG_EVERY: i64 = 30;
/// How long those hangs last, milliseconds (drawn per message): past
/// [`HANDLER_TIMEOUT_MS`], and short enough that the group's backlog and
/// the drain stay small.
const FIFO_HANG_MS: std::ops::RangeInclusive<u64> = 10_000..=12_000;

/// What the faults change in the workload: the producer's probes, and the
/// keys sent back from the dead-letter queue.
pub(crate) struct Workload {
    pub probes: std::sync::atomic::AtomicU8,
    pub redriven: std::sync::Mutex<std::collections::HashSet<i64>>,
    /// The plain queue and its dead-letter queue.
    pub plain: (QueueName, QueueName),
}

impl Workload {
    /// No probe on, nothing redriven yet; `plain` is the plain queue and
    /// its dead-letter queue.
    pub(crate) fn new(plain: (QueueName, QueueName)) -> Workload {
        Workload {
            probes: std::sync::atomic::AtomicU8::new(0),
            redriven: std::sync::Mutex::new(std::collections::HashSet::new()),
            plain,
        }
    }

    /// The keys a `redrive` fault sent back so far.
    pub(crate) fn redriven(&self) -> std::collections::HashSet<i64> {
        self.redriven.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Sends the plain queue's dead letters back with their original
    /// headers (and [`REDRIVEN_HEADER`]), each deleted from the dead-letter
    /// queue in the same transaction: what an operator's redrive does.
    pub(crate) async fn redrive(&self, ctx: &Ctx) -> Result<(), BoxError> {
        let (q, dlq) = &self.plain;
        let msgs = ctx
            .client
            .read_raw(dlq, Duration::from_secs(30), 200)
            .await?;
        if msgs.is_empty() {
            return Ok(());
        }
        let mut conn = ctx.client.connection().await?;
        let tx = conn.transaction().await?;
        let pg = Pgmq::on(&tx);
        let mut keys = Vec::new();
        for m in &msgs {
            let mut headers = m
                .headers
                .as_ref()
                .and_then(|h| h.get("original_headers"))
                .cloned()
                .filter(serde_json::Value::is_object)
                .unwrap_or_else(|| serde_json::json!({}));
            if let Some(k) = headers[KEY_HEADER].as_i64() {
                keys.push(k);
            }
            headers[REDRIVEN_HEADER] = true.into();
            pg.send_with(q, &m.body, &SendOptions::new().headers(headers))
                .await?;
            pg.delete(dlq, m.msg_id).await?;
        }
        tx.commit().await?;
        if let Ok(mut r) = self.redriven.lock() {
            r.extend(keys);
        }
        Ok(())
    }
}

/// The producer: a mix of messages to the four queues, every 300 ms, some
/// batches in one transaction across two queues.
pub(crate) struct Producer {
    client: Client,
    probes: Arc<Workload>,
    rng: StdRng,
    queues: [QueueName; ROLES],
    /// What was sent, per queue ([`Role::index`]).
    pub(crate) produced: [Produced; ROLES],
    /// What each key was sent to do.
    pub(crate) plans: HashMap<i64, Plan>,
    /// The next key of the plain and transactional queues.
    next: [i64; 2],
    /// The next sequence number per group of the FIFO queue and of the
    /// FIFO blocking queue.
    fifo_seq: [[i64; GROUPS as usize]; 2],
    /// The queues some process consumes.
    consumed: [bool; ROLES],
    /// From then on, the calm tail ([`CALM_TAIL`]).
    calm_from: Instant,
}

/// The last seconds of a seed's production send only messages that
/// succeed at once (no act, no panicking hook, no poison): the drain after
/// the producer stops then waits for what was sent before, not for a hang
/// or a slow handler sent at the last moment. Faults go on meanwhile.
const CALM_TAIL: Duration = Duration::from_secs(5);

/// `batch` with every message made one that succeeds at once.
fn calmed(batch: Vec<(Job, serde_json::Value, Plan)>) -> Vec<(Job, serde_json::Value, Plan)> {
    batch
        .into_iter()
        .map(|(mut job, mut headers, _)| {
            job.act = None;
            job.boom = None;
            if let Some(h) = headers.as_object_mut() {
                h.remove(HOOK_PANIC_HEADER);
            }
            let plan = Plan::default();
            (job, headers, plan)
        })
        .collect()
}

impl Producer {
    /// A producer on `client` of the queues `queues`, those some process
    /// consumes, drawing from `rng`; its last [`CALM_TAIL`] before `end`
    /// is calm.
    pub(crate) fn new(
        client: Client,
        probes: Arc<Workload>,
        rng: StdRng,
        queues: [QueueName; ROLES],
        consumed: [bool; ROLES],
        end: Instant,
    ) -> Producer {
        Producer {
            client,
            probes,
            rng,
            queues,
            produced: Default::default(),
            plans: HashMap::new(),
            next: [1, TX_BASE],
            fifo_seq: [[0; GROUPS as usize]; 2],
            consumed,
            calm_from: end.checked_sub(CALM_TAIL).unwrap_or(end),
        }
    }

    fn plain_job(&mut self) -> (Job, serde_json::Value, Plan) {
        let key = self.next[0];
        self.next[0] += 1;
        let r: u32 = self.rng.gen_range(0..100);
        let mut headers = key_headers(key);
        let mut plan = Plan::default();
        let probes = self.probes.probes.load(std::sync::atomic::Ordering::SeqCst);
        let mut job = Job::plain(key);
        match r {
            0..=69 if probes & PROBE_HANG != 0 => {
                job.act = Some(Act {
                    hang_before: 2,
                    hang_ms: STORM_HANG_MS,
                    ..Act::default()
                });
                // A blocking run given up at the timeout still records
                // its handling when the hang ends.
                plan.may_repeat = true;
            }
            0..=69 => {}
            70..=74 => job.act = Some(Act::fail_before(3)),
            75..=78 => job.act = Some(Act::panic_before(2)),
            79..=82 => job.act = Some(Act::snooze_ms(600)),
            83..=85 => job.act = Some(Act::sleep_ms(6_000)),
            86..=87 => job.act = Some(Act::hang_before(2)),
            88..=90 if probes & PROBE_HOOK != 0 => headers[HOOK_PANIC_HEADER] = "before".into(),
            91..=93 if probes & PROBE_HOOK != 0 => {
                headers[HOOK_PANIC_HEADER] = "after".into();
                plan.may_repeat = true;
            }
            94..=96 if probes & PROBE_DECODE != 0 => {
                job.boom = Some(Boom);
                plan.dead_letter = true;
            }
            88..=97 => {}
            98 => {
                job.act = Some(Act::fail_unless_redriven());
                plan.dead_letter = true;
                plan.until_redriven = true;
            }
            _ => {
                job.act = Some(Act::fail_before(i32::MAX));
                plan.dead_letter = true;
            }
        }
        (job, headers, plan)
    }

    fn tx_job(&mut self) -> (Job, serde_json::Value, Plan) {
        let key = self.next[1];
        self.next[1] += 1;
        let r: u32 = self.rng.gen_range(0..100);
        let act = match r {
            // Every 40th message, whatever the draw: its first delivery's
            // claim expires under its handler (a stale acknowledgement).
            _ if expires_once(key) => Some(Act::expire_once()),
            0..=84 => None,
            85..=93 => Some(Act::fail_before(2)),
            94..=96 => Some(Act::sleep_ms(6_000)),
            _ => Some(Act::panic_before(2)),
        };
        let job = Job {
            act,
            ..Job::plain(key)
        };
        let plan = Plan::default();
        (job, key_headers(key), plan)
    }

    /// A burst of three consecutive messages of one group, to the FIFO
    /// queue or the FIFO blocking queue.
    fn fifo_jobs(&mut self, role: Role) -> Vec<(Job, serde_json::Value, Plan)> {
        let (base, seqs) = match role {
            Role::FifoBlocking => (FIFO_BLOCKING_BASE, 1),
            _ => (FIFO_BASE, 0),
        };
        let g = self.rng.gen_range(0..GROUPS);
        (0..3)
            .map(|_| {
                let seq = self.fifo_seq[seqs][g as usize];
                self.fifo_seq[seqs][g as usize] += 1;
                let key = base + g * FIFO_SPAN + seq;
                let r: u32 = self.rng.gen_range(0..100);
                let mut plan = Plan::default();
                let act = if role == Role::FifoBlocking {
                    if seq % HANG_EVERY == HANG_AT {
                        // Abandoned at the timeout, its run goes on and
                        // records its handling when the hang ends; the
                        // retry records another. The loop must wait for
                        // the first before the retry (or the group's next
                        // message) runs.
                        plan.may_repeat = true;
                        Some(Act {
                            hang_before: 2,
                            hang_ms: self.rng.gen_range(FIFO_HANG_MS),
                            ..Act::default()
                        })
                    } else if r >= 97 {
                        Some(Act::fail_before(2))
                    } else {
                        None
                    }
                } else {
                    match r {
                        0..=93 => None,
                        94..=96 => Some(Act::fail_before(2)),
                        97..=98 => Some(Act::sleep_ms(5_000)),
                        _ => Some(Act::hang_before(2)),
                    }
                };
                let job = Job {
                    act,
                    ..Job::plain(key)
                };
                let headers =
                    serde_json::json!({ KEY_HEADER: key, FIFO_GROUP_HEADER: format!("g{g}") });
                (job, headers, plan)
            })
            .collect()
    }

    /// One tick: a batch to the plain and transactional queues (every
    /// fourth tick in one transaction), and a burst to a FIFO queue (whose
    /// groups are handled one message at a time): the FIFO queue on even
    /// ticks, the FIFO blocking queue on odd ones.
    /// Queues no process consumes (fewer `--processes` than kinds) get
    /// nothing: the plain queue always has one (the first kind).
    pub(crate) async fn tick(&mut self, n: u64) {
        let mut plain: Vec<_> = (0..4).map(|_| self.plain_job()).collect();
        let mut tx: Vec<_> = if self.consumed[Role::Tx.index()] {
            (0..3).map(|_| self.tx_job()).collect()
        } else {
            Vec::new()
        };
        let fifo_role = if n.is_multiple_of(2) {
            Role::Fifo
        } else {
            Role::FifoBlocking
        };
        let mut fifo = if self.consumed[fifo_role.index()] {
            self.fifo_jobs(fifo_role)
        } else {
            Vec::new()
        };
        if Instant::now() >= self.calm_from {
            plain = calmed(plain);
            tx = calmed(tx);
            fifo = calmed(fifo);
        }
        for (job, _, plan) in plain.iter().chain(&tx).chain(&fifo) {
            self.plans.insert(job.key, *plan);
        }
        if tx.is_empty() {
            self.send(Role::Plain, &plain).await;
        } else if n % 4 == 3 {
            self.send_in_transaction(&plain, &tx).await;
        } else {
            self.send(Role::Plain, &plain).await;
            self.send(Role::Tx, &tx).await;
        }
        if !fifo.is_empty() {
            self.send(fifo_role, &fifo).await;
        }
    }

    async fn send(&mut self, role: Role, batch: &[(Job, serde_json::Value, Plan)]) {
        let jobs: Vec<&Job> = batch.iter().map(|b| &b.0).collect();
        let headers: Vec<serde_json::Value> = batch.iter().map(|b| b.1.clone()).collect();
        let q = &self.queues[role.index()];
        send_recorded(
            &self.client,
            q,
            &jobs,
            headers,
            &mut self.produced[role.index()],
        )
        .await;
    }

    async fn send_in_transaction(
        &mut self,
        plain: &[(Job, serde_json::Value, Plan)],
        tx: &[(Job, serde_json::Value, Plan)],
    ) {
        let pk: Vec<i64> = plain.iter().map(|b| b.0.key).collect();
        let tk: Vec<i64> = tx.iter().map(|b| b.0.key).collect();
        let call = async {
            let mut conn = self.client.connection().await.map_err(|_| Phase::Before)?;
            let t = conn.transaction().await.map_err(|_| Phase::Before)?;
            let pg = Pgmq::on(&t);
            for (role, batch) in [(Role::Plain, plain), (Role::Tx, tx)] {
                let jobs: Vec<&Job> = batch.iter().map(|b| &b.0).collect();
                let headers: Vec<serde_json::Value> = batch.iter().map(|b| b.1.clone()).collect();
                pg.send_batch_with(
                    &self.queues[role.index()],
                    &jobs,
                    &SendOptions::new().headers_each(headers),
                )
                .await
                .map_err(|_| Phase::Before)?;
            }
            t.commit().await.map_err(Phase::Commit)
        };
        let res = tokio::time::timeout(Duration::from_secs(20), call).await;
        let (p, t) = {
            let [p, t, ..] = &mut self.produced;
            (p, t)
        };
        match res {
            Ok(Ok(())) => {
                // The ids are not needed: the key is in the headers.
                p.record(&pk, &Ok(Vec::new()));
                t.record(&tk, &Ok(Vec::new()));
            }
            Ok(Err(Phase::Before)) => {
                // Never committed: the transaction was not sent to commit.
                for k in &pk {
                    p.record_rejected(*k);
                }
                for k in &tk {
                    t.record_rejected(*k);
                }
            }
            Ok(Err(Phase::Commit(e))) => {
                let outcome = ledger::ProduceOutcome::of_error(&e);
                p.record(&pk, &Err(e));
                t.record_as(&tk, outcome);
            }
            Err(_) => {
                p.record_unknown(&pk);
                t.record_unknown(&tk);
            }
        }
    }
}

/// A producer's pool of `max_size` connections to `dsn`.
pub(crate) async fn connect_producer(
    dsn: &str,
    max_size: u32,
    app: &str,
) -> Result<Client, BoxError> {
    Ok(Client::builder(dsn)
        .max_size(max_size)
        .connect_timeout(Duration::from_secs(3))
        .pool_timeout(Duration::from_secs(5))
        .application_name(app)
        .connect()
        .await?)
}

/// Runs `tick(producer, n)` for n = 0, 1, ... every 300 ms (after each
/// tick) until `stop`; gives the producer back.
pub(crate) fn every_tick<P: Send + 'static>(
    mut producer: P,
    mut stop: tokio::sync::watch::Receiver<bool>,
    tick: for<'a> fn(&'a mut P, u64) -> futures::future::BoxFuture<'a, ()>,
) -> tokio::task::JoinHandle<P> {
    tokio::spawn(async move {
        let mut n = 0u64;
        while !*stop.borrow() {
            tick(&mut producer, n).await;
            n += 1;
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(300)) => {}
                _ = stop.changed() => {}
            }
        }
        producer
    })
}

/// Sends `jobs` (with their headers) in one batch and records the outcome
/// for their keys; a call still running after 20 s is recorded unknown.
pub(crate) async fn send_recorded(
    client: &Client,
    q: &QueueName,
    jobs: &[&Job],
    headers: Vec<serde_json::Value>,
    produced: &mut Produced,
) {
    let keys: Vec<i64> = jobs.iter().map(|j| j.key).collect();
    let opts = SendOptions::new().headers_each(headers);
    let call = client.send_batch_with(q, jobs, &opts);
    match tokio::time::timeout(Duration::from_secs(20), call).await {
        Ok(res) => produced.record(&keys, &res),
        Err(_) => produced.record_unknown(&keys),
    }
}

/// Where a transactional produce failed.
enum Phase {
    Before,
    Commit(pgmq_client::Error),
}
