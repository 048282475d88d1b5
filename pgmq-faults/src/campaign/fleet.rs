//! The campaign's fleet workload: what runs beside the core workload of
//! [`campaign`](super) in every seed, on queues of its own.
//!
//! - **Keyed producer** ([`FleetProducer`]): sends to the keyed queue with
//!   deduplication keys (`send_batch_keyed`) through the campaign's fault
//!   proxy, and retries every try whose outcome is unknown (or transient)
//!   with the same keys; each tick it also sends one key again: within the
//!   queue's life it must be answered "duplicate" with the key's first id,
//!   and after a `drop-queue` fault re-created the queue it must store a new
//!   message.
//! - **Fleet-limited workers**: two processes on the keyed queue under one
//!   `fleet_limit(FleetLimit::max_running(FLEET_PLACES))`, their handlers
//!   long enough that bursts of the producer fill the places; a fast
//!   sampler ([`FleetSampler`]) counts the claims running by the database's
//!   clock.
//! - **Prioritized group**: one process whose `WorkerGroup` runs a high and a
//!   low queue under `Priority::weighted()`; the producer keeps a backlog on
//!   the high queue in pressure windows, and sends to the low one steadily.
//! - **Claim windows** ([`ClaimWindow`]): the `pause`, `revoke-grants` and
//!   `pause-flag-locked` faults record when they took effect by the
//!   database's clock and watch the queue tables for claims made after
//!   that.
//! - **Extension cell** ([`extension_cell`]): after the last seed, `DROP
//!   EXTENSION pgmq CASCADE`, `CREATE EXTENSION pgmq` and
//!   `Client::install_sdk_schema`, then a fleet-limited worker must work
//!   again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use pgmq_client::{Client, DedupKey, Pgmq, QueueName, SendOptions, Sent};
use rand::rngs::StdRng;
use rand::Rng;
use tokio::sync::RwLock;

use super::model::{claim_bound, Role, PLACES_BOUND, ROLES, VT_SECS};
use super::workload::send_recorded;
use crate::ctx::{poll_until, sample_running, session, Ctx, FleetSamples};
use crate::job::{key_headers, Act, Job};
use crate::keyed::{self, Landed, Retry, Tries, Try, KEY_WINDOW};
use crate::ledger::{self, ProduceOutcome, Produced};
use crate::report::Check;
use crate::worker::{FaultSpec, Sabotage};
use crate::BoxError;

/// How long a keyed message's handler runs, milliseconds: long enough that
/// a burst fills the places.
const FLEET_RUN_MS: u64 = 150;
/// First key of the keyed queue.
pub(crate) const KEYED_BASE: i64 = 40_000_000;
/// First keys of the prioritized group's high and low queues.
const HIGH_BASE: i64 = 50_000_000;
const LOW_BASE: i64 = 60_000_000;
/// How long a message of the group's queues runs, milliseconds.
const PRIO_RUN_MS: u64 = 200;
/// In a pressure window the high queue is kept at this many messages.
const HIGH_BACKLOG: i64 = 20;
/// Producer ticks in and out of a pressure window (300 ms each): keyed
/// bursts, and the high queue's backlog.
const PRESSURE_ON: u64 = 27;
const PRESSURE_OFF: u64 = 13;
/// One keyed try's bound: past it, its outcome is unknown.
const TRY_TIMEOUT: Duration = Duration::from_secs(5);
/// How the keyed producer retries one call.
const RETRY: Retry = Retry {
    limit: Duration::from_secs(30),
    pause: Duration::from_millis(50),
};
/// Whether tick `n` is inside a pressure window.
fn pressure(n: u64) -> bool {
    n % (PRESSURE_ON + PRESSURE_OFF) < PRESSURE_ON
}

/// A message whose handler runs `ms`, then records its handling.
fn sleeping_job(key: i64, ms: u64) -> Job {
    Job::with(key, Act::sleep_ms(ms))
}

/// When a `pause`, `revoke-grants` or `pause-flag-locked` fault took
/// effect (database clock, read in the transaction that did it, before its
/// commit, or once its lock was granted), until when (read before the
/// clearing), which queues it stops, and the claims the fault's watcher
/// saw later than its kind's [`claim_bound`] after it took effect.
#[derive(Debug, Clone)]
pub(crate) struct ClaimWindow {
    pub kind: &'static str,
    pub roles: Vec<Role>,
    pub from: DateTime<Utc>,
    pub until: Option<DateTime<Utc>>,
    /// Queue, message id and `last_read_at` of each late claim seen.
    pub seen: Vec<(Role, i64, DateTime<Utc>)>,
}

/// What the fleet workload shares with the nemesis.
pub(crate) struct FleetState {
    /// Every queue of the seed, by [`Role::index`].
    pub queues: [QueueName; ROLES],
    /// The queues some process consumes.
    pub consumed: [bool; ROLES],
    /// The keyed queue's life: bumped by each re-creation. The producer
    /// holds it shared for each try; `drop-queue` holds it exclusively.
    pub epoch: RwLock<u32>,
    pub windows: Arc<std::sync::Mutex<Vec<ClaimWindow>>>,
    /// After each SIGKILL of a fleet-limited process, the claims then held
    /// and when they came back ([`FleetState::watch_places`]).
    pub places: Arc<std::sync::Mutex<Vec<PlacesBack>>>,
    pub place_watchers: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    pub sabotage: Vec<Sabotage>,
}

/// The keyed queue's claims running when a fleet-limited process was
/// killed (the dead process's among them), and the last look that saw one
/// of them still holding its place (its delivery not ended: not
/// acknowledged, requeued or read again, and its visibility timeout still
/// ahead). Database clock.
#[derive(Debug, Clone)]
pub(crate) struct PlacesBack {
    pub at: DateTime<Utc>,
    pub held: usize,
    pub last_held: Option<DateTime<Utc>>,
}

/// A pause, revocation or lock of the pause flag as the nemesis holds it:
/// its window's index, the watcher, and the session holding the lock.
pub(crate) struct Watching {
    index: usize,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    queue: Option<QueueName>,
    lock: Option<tokio_postgres::Client>,
}

impl FleetState {
    /// The state of a seed's fleet workload on `queues`, those some
    /// process consumes: the keyed queue in its first life, nothing
    /// recorded yet.
    pub(crate) fn new(
        queues: [QueueName; ROLES],
        consumed: [bool; ROLES],
        sabotage: &[Sabotage],
    ) -> FleetState {
        FleetState {
            queues,
            consumed,
            epoch: RwLock::new(0),
            windows: Default::default(),
            places: Default::default(),
            place_watchers: Default::default(),
            sabotage: sabotage.to_vec(),
        }
    }

    /// `pause`: pauses `role`'s queue (unless sabotaged) and watches it.
    pub(crate) async fn pause(&self, dsn: &str, role: Role) -> Result<Watching, BoxError> {
        let q = self.queues[role.index()].clone();
        let c = session(dsn, "pgmq-campaign-nemesis").await?;
        c.batch_execute("begin").await?;
        if !self.sabotage.contains(&Sabotage::PauseIgnored) {
            Pgmq::on(&c).pause(&q, Some("campaign")).await?;
        }
        let from = effect_time(&c).await?;
        Ok(self.watch(dsn, "pause", vec![role], from, Some(q)))
    }

    /// `revoke-grants`: revokes the use of the `pgmq_sdk` schema, where the
    /// pause flag is, from the workers' role and from PUBLIC (unless
    /// sabotaged), and watches every queue consumed.
    pub(crate) async fn revoke(&self, dsn: &str) -> Result<Watching, BoxError> {
        let c = session(dsn, "pgmq-campaign-nemesis").await?;
        c.batch_execute("begin").await?;
        if !self.sabotage.contains(&Sabotage::RevokeSkipped) {
            c.batch_execute("revoke usage on schema pgmq_sdk from public, current_user")
                .await?;
        }
        let from = effect_time(&c).await?;
        let roles = Role::ALL
            .into_iter()
            .filter(|r| self.consumed[r.index()])
            .collect();
        Ok(self.watch(dsn, "revoke-grants", roles, from, None))
    }

    /// `pause-flag-locked`: a session of the flag's owner takes `ACCESS
    /// EXCLUSIVE` on `pgmq_sdk.paused` and holds it, so that every read of
    /// the pause flag waits (until the reader's `db_timeout`), and watches
    /// every queue consumed: a worker that has not read the flag lately
    /// must hold its claims.
    pub(crate) async fn lock_flag(&self, dsn: &str) -> Result<Watching, BoxError> {
        let c = session(dsn, "pgmq-campaign-nemesis").await?;
        c.batch_execute(
            "set lock_timeout = '5s'; begin; \
             lock table pgmq_sdk.paused in access exclusive mode",
        )
        .await?;
        let from: DateTime<Utc> = c.query_one("select clock_timestamp()", &[]).await?.get(0);
        let roles = Role::ALL
            .into_iter()
            .filter(|r| self.consumed[r.index()])
            .collect();
        let mut w = self.watch(dsn, "pause-flag-locked", roles, from, None);
        w.lock = Some(c);
        Ok(w)
    }

    /// Ends a pause (resume), a revocation (grant) or a lock of the flag
    /// (its transaction rolls back), recording when; the server may be
    /// busy, so a few tries.
    pub(crate) async fn unwatch(&self, dsn: &str, w: Watching) -> Result<(), BoxError> {
        let _ = w.stop.send(());
        let _ = w.task.await;
        if let Some(c) = w.lock {
            // The lock's own session, still inside its transaction, reads
            // the clock; without an answer, this process's clock stands in.
            let until = match c.query_one("select clock_timestamp()", &[]).await {
                Ok(r) => r.get(0),
                Err(_) => Utc::now(),
            };
            if let Ok(mut ws) = self.windows.lock() {
                ws[w.index].until = Some(until);
            }
            // Dropping the session ends the transaction too.
            return c.batch_execute("rollback").await.map_err(Into::into);
        }
        let mut last = None;
        for _ in 0..20 {
            match self.end_window(dsn, w.index, w.queue.as_ref()).await {
                Ok(()) => return Ok(()),
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(last.unwrap_or_else(|| "not cleared".into()))
    }

    async fn end_window(
        &self,
        dsn: &str,
        index: usize,
        queue: Option<&QueueName>,
    ) -> Result<(), BoxError> {
        let c = session(dsn, "pgmq-campaign-nemesis").await?;
        let until: DateTime<Utc> = c.query_one("select clock_timestamp()", &[]).await?.get(0);
        if let Ok(mut ws) = self.windows.lock() {
            ws[index].until = Some(until);
        }
        match queue {
            Some(q) => {
                Pgmq::on(&c).resume(q).await?;
            }
            None => {
                c.batch_execute("grant usage on schema pgmq_sdk to public, current_user")
                    .await?
            }
        }
        Ok(())
    }

    /// Records the window and starts its watcher: every 100 ms, the claims
    /// of its queues later than the kind's [`claim_bound`] after `from`.
    fn watch(
        &self,
        dsn: &str,
        kind: &'static str,
        roles: Vec<Role>,
        from: DateTime<Utc>,
        queue: Option<QueueName>,
    ) -> Watching {
        let index = {
            let mut ws = self.windows.lock().unwrap_or_else(|e| e.into_inner());
            ws.push(ClaimWindow {
                kind,
                roles: roles.clone(),
                from,
                until: None,
                seen: Vec::new(),
            });
            ws.len() - 1
        };
        let late = from + chrono::Duration::from_std(claim_bound(kind)).unwrap_or_default();
        let tables: Vec<(Role, String)> = roles
            .iter()
            .map(|r| (*r, self.queues[r.index()].quoted_table()))
            .collect();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let dsn = dsn.to_owned();
        let windows = self.windows.clone();
        let task = tokio::spawn(async move {
            let mut conn: Option<tokio_postgres::Client> = None;
            loop {
                if conn.as_ref().is_none_or(|c| c.is_closed()) {
                    conn = session(&dsn, "pgmq-campaign-watch").await.ok();
                }
                for (role, table) in &tables {
                    let Some(c) = &conn else { break };
                    let sql =
                        format!("select msg_id, last_read_at from {table} where last_read_at > $1");
                    let Ok(rows) = c.query(sql.as_str(), &[&late]).await else {
                        continue;
                    };
                    let mut ws = windows.lock().unwrap_or_else(|e| e.into_inner());
                    let seen = &mut ws[index].seen;
                    for r in rows {
                        let x = (*role, r.get::<_, i64>(0), r.get(1));
                        if !seen.contains(&x) {
                            seen.push(x);
                        }
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = &mut stopped => break,
                }
            }
        });
        Watching {
            index,
            stop,
            task,
            queue,
            lock: None,
        }
    }
}

/// The database's clock inside the fault's transaction, which then commits.
async fn effect_time(c: &tokio_postgres::Client) -> Result<DateTime<Utc>, BoxError> {
    let at: DateTime<Utc> = c.query_one("select clock_timestamp()", &[]).await?.get(0);
    c.batch_execute("commit").await?;
    Ok(at)
}

impl FleetState {
    /// After a SIGKILL of a fleet-limited process: records the keyed
    /// queue's running claims and watches, every 250 ms, until none of them
    /// holds its place any more, or until [`PLACES_BOUND`] and 10 s (for a
    /// server down meanwhile) have passed.
    pub(crate) async fn watch_places(&self, dsn: &str) {
        let table = self.queues[Role::Keyed.index()].quoted_table();
        let Ok(c) = session(dsn, "pgmq-campaign-watch").await else {
            return;
        };
        let held_sql = format!(
            "select array_agg(msg_id), array_agg(last_read_at), clock_timestamp() from {table} \
             where vt > clock_timestamp() and last_read_at is not null"
        );
        let Ok(row) = c.query_one(held_sql.as_str(), &[]).await else {
            return;
        };
        let ids: Vec<i64> = row.get::<_, Option<Vec<i64>>>(0).unwrap_or_default();
        let reads: Vec<DateTime<Utc>> = row.get::<_, Option<_>>(1).unwrap_or_default();
        let at: DateTime<Utc> = row.get(2);
        let index = {
            let mut p = self.places.lock().unwrap_or_else(|e| e.into_inner());
            p.push(PlacesBack {
                at,
                held: ids.len(),
                last_held: None,
            });
            p.len() - 1
        };
        let places = self.places.clone();
        let deadline = at
            + chrono::Duration::from_std(PLACES_BOUND + Duration::from_secs(10))
                .unwrap_or_default();
        let still_sql = format!(
            "select count(*), clock_timestamp() from {table} m \
             join unnest($1::bigint[], $2::timestamptz[]) h(id, read_at) \
               on m.msg_id = h.id and m.last_read_at = h.read_at \
             where m.vt > clock_timestamp()"
        );
        let dsn = dsn.to_owned();
        let task = tokio::spawn(async move {
            let mut conn = Some(c);
            loop {
                if conn.as_ref().is_none_or(|c| c.is_closed()) {
                    conn = session(&dsn, "pgmq-campaign-watch").await.ok();
                }
                if let Some(c) = &conn {
                    if let Ok(r) = c.query_one(still_sql.as_str(), &[&ids, &reads]).await {
                        let (n, now): (i64, DateTime<Utc>) = (r.get(0), r.get(1));
                        if n == 0 {
                            return;
                        }
                        let mut p = places.lock().unwrap_or_else(|e| e.into_inner());
                        p[index].last_held = Some(now);
                        if now > deadline {
                            return;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        if let Ok(mut w) = self.place_watchers.lock() {
            w.push(task);
        }
    }

    /// `drop-queue`: drops the keyed queue and creates it again (its
    /// messages are lost, as with any drop), between two tries of the keyed
    /// producer. With `stale-keys`, the dropped queue's deduplication keys
    /// are put back afterwards, under the new queue's table.
    pub(crate) async fn recreate(&self, ctx: &Ctx) -> Result<(), BoxError> {
        let q = &self.queues[Role::Keyed.index()];
        let table = q.table();
        let mut epoch = self.epoch.write().await;
        let stale = self.sabotage.contains(&Sabotage::StaleKeys);
        let conn = ctx.client.connection().await?;
        let keys: Option<serde_json::Value> = if stale {
            let row = conn
                .query_one(
                    "select coalesce(jsonb_agg(to_jsonb(k)), '[]') from pgmq_sdk.queue_keys k \
                     where k.queue_relid = $1::text::regclass",
                    &[&table],
                )
                .await?;
            Some(row.get(0))
        } else {
            None
        };
        ctx.client.drop_queue(q).await?;
        ctx.client.create(q).await?;
        if let Some(keys) = keys {
            conn.execute(
                "insert into pgmq_sdk.queue_keys \
                 select * from jsonb_populate_recordset(null::pgmq_sdk.queue_keys, \
                     (select coalesce(jsonb_agg(jsonb_set(k, '{queue_relid}', \
                                 to_jsonb($2::text::regclass::oid))), '[]') \
                      from jsonb_array_elements($1) k)) \
                 on conflict do nothing",
                &[&keys, &table],
            )
            .await?;
        }
        *epoch += 1;
        Ok(())
    }
}

/// A keyed message the producer sent and saw committed.
#[derive(Debug, Clone)]
struct KeyedEntry {
    key: i64,
    dedup: String,
    epoch: u32,
    msg_id: i64,
}

/// A deduplication key sent again, and its answer.
#[derive(Debug, Clone)]
pub(crate) struct Resend {
    /// The fault key of the message sent.
    pub key: i64,
    pub dedup: String,
    /// Sent after the key's queue was re-created: a new message is due.
    pub fresh: bool,
    /// Otherwise, the id the key's first send returned.
    pub first_id: Option<i64>,
    /// The answer (None: the call failed).
    pub got: Option<Sent>,
}

/// What the keyed producer's calls came to.
#[derive(Debug, Default)]
pub(crate) struct KeyedLog {
    /// Its tries; a call is stopped when the queue was re-created between
    /// two of its tries.
    pub tries: Tries,
    pub resends: Vec<Resend>,
    /// The queue's life each fault key was sent in.
    pub epochs: HashMap<i64, u32>,
}

/// The fleet workload's producer (see the module docs).
pub(crate) struct FleetProducer {
    /// Through the campaign's fault proxy.
    pub keyed_client: Client,
    /// Straight to the cluster.
    pub client: Client,
    pub state: Arc<FleetState>,
    pub rng: StdRng,
    /// Per queue ([`Role::index`]): the keyed, high and low queues'.
    pub produced: [Produced; ROLES],
    pub log: KeyedLog,
    next: [i64; 3],
    committed: Vec<KeyedEntry>,
}

impl FleetProducer {
    pub(crate) fn new(
        keyed_client: Client,
        client: Client,
        state: Arc<FleetState>,
        rng: StdRng,
    ) -> Self {
        FleetProducer {
            keyed_client,
            client,
            state,
            rng,
            produced: Default::default(),
            log: KeyedLog::default(),
            next: [KEYED_BASE, HIGH_BASE, LOW_BASE],
            committed: Vec::new(),
        }
    }

    /// One tick: a keyed batch (bigger in a pressure window) and one key
    /// sent again; a message to the low queue, and to the high queue one or,
    /// in a pressure window, what keeps its backlog.
    pub(crate) async fn tick(&mut self, n: u64) {
        if self.state.consumed[Role::Keyed.index()] {
            self.keyed_tick(n).await;
        }
        if self.state.consumed[Role::High.index()] {
            self.prio_tick(n).await;
        }
    }

    fn next_key(&mut self, i: usize) -> i64 {
        let k = self.next[i];
        self.next[i] += 1;
        k
    }

    async fn keyed_tick(&mut self, n: u64) {
        let epoch = *self.state.epoch.read().await;
        let size = if pressure(n) { 8 } else { 2 };
        let items: Vec<(i64, String)> = (0..size)
            .map(|_| {
                let k = self.next_key(0);
                (k, format!("k{k}"))
            })
            .collect();
        let keys: Vec<i64> = items.iter().map(|(k, _)| *k).collect();
        for k in &keys {
            self.log.epochs.insert(*k, epoch);
        }
        let p = Role::Keyed.index();
        let res = self.send_keyed(&items, epoch).await;
        keyed::record(&mut self.produced[p], &keys, &res);
        if let Ok(landed) = res {
            for ((key, dedup), s) in items.into_iter().zip(landed.sent) {
                self.committed.push(KeyedEntry {
                    key,
                    dedup,
                    epoch,
                    msg_id: s.msg_id,
                });
            }
        }
        if self.committed.is_empty() {
            return;
        }
        // One key sent again: within the queue's life, the same message
        // (answered duplicate); after its re-creation, a new one.
        let i = self.rng.gen_range(0..self.committed.len());
        let e = self.committed[i].clone();
        if e.epoch == epoch {
            let dedup = if self.state.sabotage.contains(&Sabotage::KeyedFreshKeys) {
                format!("{}-again{n}", e.dedup)
            } else {
                e.dedup.clone()
            };
            let got = self.send_keyed(&[(e.key, dedup)], epoch).await;
            self.log.resends.push(Resend {
                key: e.key,
                dedup: e.dedup,
                fresh: false,
                first_id: Some(e.msg_id),
                got: got.ok().and_then(|l| l.sent.first().copied()),
            });
        } else {
            let k = self.next_key(0);
            self.log.epochs.insert(k, epoch);
            let res = self.send_keyed(&[(k, e.dedup.clone())], epoch).await;
            let got = res.as_ref().ok().and_then(|l| l.sent.first().copied());
            match (res, got) {
                (Ok(_), Some(s)) if !s.duplicate => {
                    self.produced[p].record(&[k], &Ok(vec![s.msg_id]));
                    self.committed[i] = KeyedEntry {
                        key: k,
                        dedup: e.dedup.clone(),
                        epoch,
                        msg_id: s.msg_id,
                    };
                }
                // Answered "duplicate": either an earlier try of this call
                // (an unknown outcome, retried) stored `k` and the answer
                // names it, or nothing was stored under `k` (a stale key,
                // which the keyed check judges). Unknown either way, so
                // that `k` may be found in the ledger or not.
                (Ok(_), _) => self.produced[p].record_as(&[k], ProduceOutcome::Unknown),
                (Err(o), _) => self.produced[p].record_as(&[k], o),
            }
            self.log.resends.push(Resend {
                key: k,
                dedup: e.dedup,
                fresh: true,
                first_id: None,
                got,
            });
        }
    }

    /// Sends `items` (fault key, deduplication key) through the proxy, one
    /// item with `send_keyed_with` (the resends: a single send meeting its
    /// taken key), more in one keyed batch, retried
    /// ([`keyed::send_retrying`]) with the same keys (but with
    /// `keyed-fresh-keys`); stopped when the queue is re-created between
    /// two tries (the call's key may belong to the dropped queue). On
    /// failure, the outcome to record.
    async fn send_keyed(
        &mut self,
        items: &[(i64, String)],
        epoch: u32,
    ) -> Result<Landed, ProduceOutcome> {
        let q = self.state.queues[Role::Keyed.index()].clone();
        let jobs: Vec<Job> = items
            .iter()
            .map(|(k, _)| sleeping_job(*k, FLEET_RUN_MS))
            .collect();
        let opts =
            SendOptions::new().headers_each(items.iter().map(|(k, _)| key_headers(*k)).collect());
        let fresh_keys = self.state.sabotage.contains(&Sabotage::KeyedFreshKeys);
        let (state, client) = (&self.state, &self.keyed_client);
        let (q, jobs, opts) = (&q, &jobs, &opts);
        let produced = &mut self.produced[Role::Keyed.index()];
        keyed::send_retrying(RETRY, &mut self.log.tries, produced, |n| async move {
            let guard = state.epoch.read().await;
            if *guard != epoch {
                return Try::Stopped;
            }
            let dedup: Vec<String> = items
                .iter()
                .map(|(_, d)| match n {
                    n if fresh_keys && n > 0 => format!("{d}-retry{n}"),
                    _ => d.clone(),
                })
                .collect();
            let call = async {
                match (&dedup[..], &jobs[..]) {
                    ([key], [job]) => {
                        let one = SendOptions::new().headers(key_headers(items[0].0));
                        let key = DedupKey::new(key.clone(), KEY_WINDOW);
                        client
                            .send_keyed_with(q, &key, job, &one)
                            .await
                            .map(|s| vec![s])
                    }
                    _ => {
                        client
                            .send_batch_keyed(q, &dedup, KEY_WINDOW, jobs, opts)
                            .await
                    }
                }
            };
            match tokio::time::timeout(TRY_TIMEOUT, call).await {
                Ok(res) => Try::Answered(res),
                Err(_) => Try::TimedOut,
            }
        })
        .await
    }

    async fn prio_tick(&mut self, n: u64) {
        let (high, low) = (Role::High, Role::Low);
        let lq = self.state.queues[low.index()].clone();
        let key = self.next_key(2);
        let job = sleeping_job(key, PRIO_RUN_MS);
        send_recorded(
            &self.client,
            &lq,
            &[&job],
            vec![key_headers(key)],
            &mut self.produced[low.index()],
        )
        .await;
        let hq = self.state.queues[high.index()].clone();
        let count = if pressure(n) {
            match self.client.metrics(&hq).await {
                Ok(m) => (HIGH_BACKLOG - m.queue_length).clamp(0, 2 * HIGH_BACKLOG),
                Err(_) => 1,
            }
        } else {
            1
        };
        let keys: Vec<i64> = (0..count).map(|_| self.next_key(1)).collect();
        if keys.is_empty() {
            return;
        }
        let jobs: Vec<Job> = keys.iter().map(|k| sleeping_job(*k, PRIO_RUN_MS)).collect();
        let refs: Vec<&Job> = jobs.iter().collect();
        let headers = keys.iter().map(|k| key_headers(*k)).collect();
        send_recorded(
            &self.client,
            &hq,
            &refs,
            headers,
            &mut self.produced[high.index()],
        )
        .await;
    }
}

/// The extension cell, after the last seed: `DROP EXTENSION pgmq CASCADE`
/// (every queue goes, so no seed's workload can share it), `CREATE
/// EXTENSION pgmq`, `Client::install_sdk_schema` (with
/// `sdk-not-reinstalled`, the `pgmq_sdk` schema dropped instead), then a worker process under a fleet limit of 2
/// places drains 24 messages of 100 ms: every one handled, never more
/// than 2 running (sampled every 20 ms and from the handlers' start and
/// end records).
pub(crate) async fn extension_cell(ctx: &Ctx, sabotage: &[Sabotage]) -> Vec<Check> {
    const PLACES: u32 = 2;
    const N: usize = 24;
    let name = "the fleet limit works again after PGMQ is re-created";
    let recreate = async {
        let conn = ctx.client.connection().await?;
        conn.batch_execute("drop extension pgmq cascade; create extension pgmq")
            .await?;
        if sabotage.contains(&Sabotage::SdkNotReinstalled) {
            // The planted bug: the pgmq_sdk schema gone with PGMQ (as a
            // CASCADE that reached it would leave it) and not installed
            // again.
            conn.batch_execute("drop schema pgmq_sdk cascade").await?;
        } else {
            ctx.client.install_sdk_schema().await?;
        }
        Ok::<_, BoxError>(())
    };
    if let Err(e) = recreate.await {
        return vec![Check::new(
            name,
            false,
            format!("re-creating PGMQ failed: {e}"),
        )];
    }
    let jobs: Vec<Job> = (0..N as i64).map(|k| sleeping_job(k, 100)).collect();
    let wait = Duration::from_secs(15);
    match limited_drain(ctx, ("cx", &jobs), (Limit::Fleet, PLACES), 1, &[], wait).await {
        Ok(d) => {
            let runs = ledger::most_at_once(&d.windows).0;
            vec![Check::new(
                name,
                d.handled >= N as i64
                    && d.samples.most <= i64::from(PLACES)
                    && runs <= PLACES as usize,
                format!(
                    "extension dropped and created again, pgmq_sdk {}; {} of {N} messages \
                     handled; at most {} claims running in {} samples and {runs} runs at once \
                     (limit {PLACES})",
                    if sabotage.contains(&Sabotage::SdkNotReinstalled) {
                        "not installed again (sabotage)"
                    } else {
                        "installed again"
                    },
                    d.handled,
                    d.samples.most,
                    d.samples.samples
                ),
            )]
        }
        Err(e) => vec![Check::could_not_run(name, "the limited worker", e)],
    }
}

/// The kill cell, after the last seed of a campaign that kills: a worker
/// process under a fleet limit of 2 places is killed (SIGKILL) while a
/// handler runs in each place (each hangs on its first delivery); a second
/// process under the same limit must start both messages again within
/// [`PLACES_BOUND`] of the kill, by the database's clock: the dead
/// process's places came back within its visibility timeout. The seeds'
/// kills judge the same of whatever the killed process held; this cell
/// kills a process known to hold every place.
pub(crate) async fn kill_cell(ctx: &Ctx, sabotage: &[Sabotage]) -> Vec<Check> {
    const PLACES: u32 = 2;
    vec![places_back_check(
        "a killed process's places come back within its vt",
        &format!("each of the {PLACES} places of a fleet limit"),
        killed_places(ctx, PLACES, sabotage, Limit::Fleet).await,
    )]
}

/// The verdict on a [`killed_places`] run: a process running a handler in
/// `places` (what they were) killed, and how long the second process took
/// to start every message again.
pub(crate) fn places_back_check(
    name: &str,
    places: &str,
    took: Result<Option<Duration>, BoxError>,
) -> Check {
    let bound = PLACES_BOUND.as_millis();
    let killed = format!("a process running a handler in {places} killed; both messages");
    match took {
        Ok(Some(took)) => Check::new(
            name,
            took <= PLACES_BOUND,
            format!(
                "{killed} started again by a second process {} ms after the kill (bound \
                 {bound} ms)",
                took.as_millis()
            ),
        ),
        Ok(None) => Check::new(
            name,
            false,
            format!(
                "{killed} not started again by a second process within {} ms (bound {bound} ms)",
                (PLACES_BOUND + KILL_CELL_GRACE).as_millis()
            ),
        ),
        Err(e) => Check::could_not_run(name, "the kill", e),
    }
}

/// How long past [`PLACES_BOUND`] the kill cell waits before it calls the
/// places lost.
const KILL_CELL_GRACE: Duration = Duration::from_secs(5);

/// Which limit a cell's workers take.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Limit {
    /// A fleet-wide limit.
    Fleet,
    /// A limit per key, the key the header [`LIMIT_KEY_HEADER`], each job's
    /// `limit_key` of its fault key.
    PerKey(fn(i64) -> String),
}

/// The header that holds a message's key under a cell's limit per key.
pub(crate) const LIMIT_KEY_HEADER: &str = "limit_key";

/// The kill cell's run: how long after the kill the second process started
/// the last of the messages the first held, if within the bound and
/// [`KILL_CELL_GRACE`]. Under `Limit::PerKey` every message has one key.
pub(crate) async fn killed_places(
    ctx: &Ctx,
    places: u32,
    sabotage: &[Sabotage],
    limit: Limit,
) -> Result<Option<Duration>, BoxError> {
    let scenario = match limit {
        Limit::Fleet => "ck",
        Limit::PerKey(_) => "kk",
    };
    ctx.with_queues(scenario, async |qs| {
        // Hang on the first delivery (read_ct 1), succeed on the next.
        let hang = Act::hang_before(2);
        let jobs: Vec<Job> = (0..i64::from(places)).map(|k| Job::with(k, hang)).collect();
        produce_under(ctx, &qs.q, &jobs, limit).await?;
        let vt = if sabotage.contains(&Sabotage::FleetLongVt) {
            40
        } else {
            VT_SECS
        };
        let spec = cell_spec(
            ctx,
            qs,
            scenario,
            places,
            vt,
            "pgmq-campaign-kill-cell",
            limit,
        );
        let first = ctx.spawn_worker(&spec).await?;
        let all_started = poll_until(
            Duration::from_secs(15),
            Duration::from_millis(50),
            || async {
                ledger::starts(&ctx.client, &ctx.run_id, scenario)
                    .await
                    .is_ok_and(|s| s.len() >= places as usize)
            },
        )
        .await;
        if all_started.is_none() {
            let _ = first.sigkill().await;
            let started = ledger::starts(&ctx.client, &ctx.run_id, scenario).await?;
            return Err(format!(
                "the first process started {} of {places} messages in 15 s",
                started.len()
            )
            .into());
        }
        let first_pid = i32::try_from(first.pid())?;
        first.sigkill().await?;
        let killed_at: DateTime<Utc> = {
            let conn = ctx.client.connection().await?;
            conn.query_one("select clock_timestamp()", &[])
                .await?
                .get(0)
        };
        let second = ctx.spawn_worker(&spec).await?;
        // The starts of the messages again, by another process than the first.
        let again = async || -> Result<Vec<DateTime<Utc>>, BoxError> {
            let windows = ledger::windows(&ctx.client, &ctx.run_id, scenario).await?;
            Ok(windows
                .iter()
                .filter(|w| w.worker_pid != first_pid)
                .map(|w| w.start)
                .collect())
        };
        let limit = PLACES_BOUND + KILL_CELL_GRACE;
        let all_again = poll_until(limit, Duration::from_millis(100), || async {
            again().await.is_ok_and(|a| a.len() >= places as usize)
        })
        .await;
        let took = match all_again {
            Some(_) => again()
                .await?
                .into_iter()
                .max()
                .map(|last| (last - killed_at).to_std().unwrap_or_default()),
            None => None,
        };
        let _ = second.stop(Duration::from_secs(10)).await;
        Ok(took)
    })
    .await
}

/// Sends `jobs` to `q`, each with its fault key's header and, under a limit
/// per key, its key's.
pub(crate) async fn produce_under(
    ctx: &Ctx,
    q: &QueueName,
    jobs: &[Job],
    limit: Limit,
) -> Result<(), BoxError> {
    let produced = ctx
        .produce_headed(q, jobs, |k| {
            let mut h = key_headers(k);
            if let Limit::PerKey(limit_key) = limit {
                h[LIMIT_KEY_HEADER] = limit_key(k).into();
            }
            h
        })
        .await;
    match produced.errors.keys().next() {
        Some(e) => Err(format!("a send failed: {e}").into()),
        None => Ok(()),
    }
}

/// A cell's worker: `places` of `limit`, 4 handlers, start records, a 50 ms
/// poll and a visibility timeout of `vt_secs`.
pub(crate) fn cell_spec(
    ctx: &Ctx,
    qs: &crate::ctx::Queues,
    scenario: &str,
    places: u32,
    vt_secs: u64,
    app_name: &str,
    limit: Limit,
) -> FaultSpec {
    let mut spec = FaultSpec::for_queue(&qs.q, &qs.dlq, &ctx.run_id, scenario);
    match limit {
        Limit::Fleet => spec.worker.settings.fleet_limit = Some(places),
        Limit::PerKey(_) => {
            spec.worker.settings.key_limit = Some(pgmq_testkit::spec::KeyLimitSpec {
                header: LIMIT_KEY_HEADER.to_owned(),
                max_running: places,
            })
        }
    }
    spec.record_starts = true;
    spec.worker.settings.concurrency = Some(4);
    spec.worker.settings.poll_interval_ms = Some(50);
    spec.set_vt_secs(vt_secs);
    spec.worker.application_name = Some(app_name.into());
    spec
}

/// What a cell's limited drain saw: the messages handled, the sampler's
/// view (every 20 ms, counting as the limit counts) and the workers' runs.
pub(crate) struct Drained {
    pub handled: i64,
    pub samples: FleetSamples,
    pub windows: Vec<ledger::Window>,
}

/// `processes` worker processes under `places` of `limit` (a visibility
/// timeout of 4 s, the sabotages `sabotage` planted) drain `jobs` on fresh
/// queues of `scenario`, for up to `wait`.
pub(crate) async fn limited_drain(
    ctx: &Ctx,
    (scenario, jobs): (&str, &[Job]),
    (limit, places): (Limit, u32),
    processes: usize,
    sabotage: &[Sabotage],
    wait: Duration,
) -> Result<Drained, BoxError> {
    ctx.with_queues(scenario, async |qs| {
        produce_under(ctx, &qs.q, jobs, limit).await?;
        let app = match limit {
            Limit::Fleet => "pgmq-campaign-cell",
            Limit::PerKey(_) => "pgmq-campaign-key-cell",
        };
        let mut spec = cell_spec(ctx, qs, scenario, places, 4, app, limit);
        spec.sabotage = sabotage.to_vec();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let per_key = matches!(limit, Limit::PerKey(_)).then_some(LIMIT_KEY_HEADER);
        let sampler = sample_running(
            ctx.cluster.dsn(),
            (qs.q.quoted_table(), per_key),
            i64::from(places),
            Duration::from_millis(20),
            stop_rx,
        );
        let mut workers = Vec::new();
        for _ in 0..processes {
            workers.push(ctx.spawn_worker(&spec).await?);
        }
        // Short of all of them within the bound, the count says how many.
        let _ = ctx.wait_progress(scenario, jobs.len() as i64, wait).await;
        let handled = ledger::handled_count(&ctx.client, &ctx.run_id, scenario).await?;
        for w in workers {
            let _ = w.stop(Duration::from_secs(10)).await;
        }
        let _ = stop_tx.send(true);
        let samples = sampler.await?;
        let windows = ledger::windows(&ctx.client, &ctx.run_id, scenario).await?;
        Ok(Drained {
            handled,
            samples,
            windows,
        })
    })
    .await
}
