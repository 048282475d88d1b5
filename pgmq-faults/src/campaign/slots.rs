//! The campaign's worker processes: one slot per process, each of a
//! [`ProcKind`] with its settings ([`slot_args`]); the nemesis kills,
//! stops and restarts them, the sampler replaces those that crashed, and
//! the end stops them gracefully. Every exit is recorded.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::Mutex;

use super::model::{
    scenario_of, ProcExit, ProcKind, Role, BACKOFF_MAX_MS, BLOCKING_CAP, DB_TIMEOUT, FLEET_PLACES,
    GROUPS, HANDLER_TIMEOUT_MS, HIGH_WEIGHT, LOW_WEIGHT, POLL, ROLES, VT_SECS,
};
use crate::child::{Exit, WorkerProc};
use crate::ctx::{Ctx, Queues};
use crate::worker::{FaultSpec, PrioSpec, Sabotage};
use crate::BoxError;
use pgmq_testkit::spec::{BackoffSpec, ClaimReadsSpec, HandlerKind, WorkerSettings};

/// The dead row versions at which the plain queue's workers vacuum its
/// table (`WorkerBuilder::vacuum`): low, so that vacuums run all through a
/// seed.
const VACUUM_DEAD_ROWS: u64 = 500;

/// One worker process, as the campaign keeps it.
struct Slot {
    kind: ProcKind,
    args: FaultSpec,
    proc: Option<WorkerProc>,
    /// Emptied by a fault (kill, term): refilled only when it clears.
    held_down: bool,
    generation: u32,
}

/// The worker processes, for the nemesis, the sampler and the end.
pub(crate) struct Slots {
    slots: Mutex<Vec<Slot>>,
    exits: Mutex<Vec<ProcExit>>,
    log_dir: std::path::PathBuf,
    dsn: String,
    tag: String,
}

/// The `application_name` of every connection of a slot's process.
fn app_name(tag: &str, slot: usize, generation: u32) -> String {
    format!("pgmq-campaign-w{tag}s{slot}g{generation}")
}

impl Slots {
    /// A slot per process of `kinds` on the queues `qs` of the seed
    /// `label`, each process started, connected to `dsn` (the proxy).
    pub(crate) async fn start(
        ctx: &Ctx,
        dsn: &str,
        kinds: &[ProcKind],
        qs: &[Queues; ROLES],
        label: &str,
        sabotage: &[Sabotage],
    ) -> Result<Slots, BoxError> {
        let slots = Slots {
            slots: Mutex::new(
                kinds
                    .iter()
                    .map(|k| Slot {
                        kind: *k,
                        args: slot_args(*k, qs, &ctx.run_id, label, sabotage),
                        proc: None,
                        held_down: false,
                        generation: 0,
                    })
                    .collect(),
            ),
            exits: Mutex::new(Vec::new()),
            log_dir: ctx.log_dir.clone(),
            dsn: dsn.to_owned(),
            tag: label.to_owned(),
        };
        {
            let mut all = slots.slots.lock().await;
            for (i, s) in all.iter_mut().enumerate() {
                slots.spawn(s, i).await?;
            }
        }
        Ok(slots)
    }

    /// Every process's exit so far.
    pub(crate) async fn exits(&self) -> Vec<ProcExit> {
        self.exits.lock().await.clone()
    }

    async fn spawn(&self, slot: &mut Slot, i: usize) -> Result<(), BoxError> {
        slot.generation += 1;
        slot.args.worker.application_name = Some(app_name(&self.tag, i, slot.generation));
        let name = slot
            .args
            .app_name()
            .trim_start_matches("pgmq-campaign-")
            .to_owned();
        let p = crate::child::spawn(&self.log_dir, &name, &self.dsn, None, &slot.args).await?;
        slot.proc = Some(p);
        Ok(())
    }

    async fn record(&self, slot: &Slot, pid: u32, how: &'static str, exit: Option<Exit>) {
        self.exits.lock().await.push(ProcExit {
            kind: slot.kind,
            app_name: slot.args.app_name().to_owned(),
            pid,
            how,
            exit,
        });
    }

    /// The kind of process slot `i` runs.
    pub(crate) async fn kind(&self, i: usize) -> Option<ProcKind> {
        self.slots.lock().await.get(i).map(|s| s.kind)
    }

    /// The pid of the process slot `i` runs, if one runs.
    pub(crate) async fn pid(&self, i: usize) -> Option<u32> {
        self.slots
            .lock()
            .await
            .get(i)
            .and_then(|s| s.proc.as_ref().map(WorkerProc::pid))
    }

    /// SIGKILL (the slot stays empty until [`respawn`](Self::respawn)).
    pub(crate) async fn kill(&self, i: usize) -> Result<(), BoxError> {
        let mut slots = self.slots.lock().await;
        let slot = &mut slots[i];
        let p = slot.proc.take().ok_or("no process in the slot")?;
        slot.held_down = true;
        let pid = p.pid();
        let exit = p.sigkill().await?;
        self.record(slot, pid, "kill", Some(exit)).await;
        Ok(())
    }

    /// SIGTERM and wait for the graceful shutdown's end.
    pub(crate) async fn term(&self, i: usize) -> Result<(), BoxError> {
        let p = {
            let mut slots = self.slots.lock().await;
            let p = slots[i].proc.take().ok_or("no process in the slot")?;
            slots[i].held_down = true;
            p
        };
        let pid = p.pid();
        let exit = p.stop(Duration::from_secs(30)).await;
        let slots = self.slots.lock().await;
        self.record(&slots[i], pid, "term", exit.ok()).await;
        Ok(())
    }

    /// Sends a signal (STOP, CONT) to the slot's process.
    pub(crate) async fn signal(&self, i: usize, sig: &str) -> Result<(), BoxError> {
        let slots = self.slots.lock().await;
        let p = slots[i].proc.as_ref().ok_or("no process in the slot")?;
        match sig {
            "STOP" => p.sigstop().await,
            _ => p.sigcont().await,
        }
    }

    /// Starts a new process in an empty slot.
    pub(crate) async fn respawn(&self, i: usize) -> Result<(), BoxError> {
        let mut slots = self.slots.lock().await;
        slots[i].held_down = false;
        if slots[i].proc.is_some() {
            return Ok(());
        }
        let slot = &mut slots[i];
        self.spawn(slot, i).await
    }

    /// Processes that ended on their own are recorded as crashed and
    /// replaced; empty slots (a failed respawn) are filled.
    pub(crate) async fn tend(&self) {
        let mut slots = self.slots.lock().await;
        for (i, slot) in slots.iter_mut().enumerate() {
            let crashed = slot.proc.as_mut().is_some_and(|p| !p.running());
            if crashed {
                if let Some(p) = slot.proc.take() {
                    let pid = p.pid();
                    let exit = p.wait(Duration::from_secs(5)).await.ok();
                    self.record(slot, pid, "crashed", exit).await;
                }
            }
            if slot.proc.is_none() && !slot.held_down {
                if let Err(e) = self.spawn(slot, i).await {
                    eprintln!("campaign: could not restart worker slot {i}: {e}");
                }
            }
        }
    }

    /// The most connections each live process may hold, by application name.
    pub(crate) async fn limits(&self) -> HashMap<String, i64> {
        let slots = self.slots.lock().await;
        slots
            .iter()
            .map(|s| (s.args.app_name().to_owned(), max_connections(&s.args)))
            .collect()
    }

    /// Stops every process gracefully (the end of the run).
    pub(crate) async fn stop_all(&self) {
        let mut slots = self.slots.lock().await;
        let mut stops = Vec::new();
        for (i, slot) in slots.iter_mut().enumerate() {
            if let Some(p) = slot.proc.take() {
                let pid = p.pid();
                // A stopped process cannot drain.
                let _ = p.sigcont().await;
                stops.push((i, pid, p.stop(Duration::from_secs(30))));
            }
        }
        let (meta, futs): (Vec<_>, Vec<_>) =
            stops.into_iter().map(|(i, pid, f)| ((i, pid), f)).unzip();
        let exits = futures::future::join_all(futs).await;
        for ((i, pid), exit) in meta.into_iter().zip(exits) {
            self.record(&slots[i], pid, "end", exit.ok()).await;
        }
    }
}

/// The connections a worker process may hold: its pool and its ledger's.
pub(crate) fn max_connections(a: &FaultSpec) -> i64 {
    i64::from(a.worker.pool_size.unwrap_or(0)) + a.concurrency() as i64 + 1
}

/// The settings of a slot's process.
fn slot_args(
    kind: ProcKind,
    qs: &[Queues; ROLES],
    run_id: &str,
    scenario: &str,
    sabotage: &[Sabotage],
) -> FaultSpec {
    let role = kind.role();
    let q = &qs[role.index()];
    let mut a = FaultSpec::for_queue(&q.q, &q.dlq, run_id, &scenario_of(scenario, role));
    let fifo = role.fifo_base().is_some();
    a.worker.settings = WorkerSettings {
        visibility_timeout_ms: Some(VT_SECS * 1000),
        // The FIFO processes have a handler per group.
        concurrency: Some(if fifo { GROUPS as usize } else { 4 }),
        batch_size: Some(20),
        claim_capacity: Some(40),
        // The context handlers' ledger writes fail under faults (read-only,
        // outages), each a used attempt: the plain queue's and the fleet
        // workload's have more.
        max_attempts: Some(match role {
            Role::Plain | Role::Keyed | Role::High | Role::Low => 8,
            Role::Tx | Role::Fifo | Role::FifoBlocking => 5,
        }),
        retry_backoff: Some(BackoffSpec {
            base_ms: 300,
            max_ms: BACKOFF_MAX_MS,
        }),
        heartbeat: Some(true),
        shutdown_grace_ms: Some(3_000),
        poll_interval_ms: Some(POLL.as_millis() as u64),
        handler_timeout_ms: Some(HANDLER_TIMEOUT_MS),
        db_timeout_ms: Some(DB_TIMEOUT.as_millis() as u64),
        claim_reads: fifo.then_some(ClaimReadsSpec::FifoGroups),
        max_abandoned_blocking_threads: (kind == ProcKind::Blocking).then_some(BLOCKING_CAP),
        // The plain queue's workers vacuum its table as they go, so that
        // every fault meets a vacuum running beside the claims.
        vacuum: (role == Role::Plain).then_some(VACUUM_DEAD_ROWS),
        ..a.worker.settings
    };
    a.stats_ms = 1_000;
    a.sabotage = sabotage.to_vec();
    // The transactional process's pool is smaller than its 4 handlers'
    // transactions and the worker's own 4 connections need: checkouts then
    // wait, and must not be counted as attempts. The FIFO processes have a
    // handler per group; the transactional one a pool for all of them, the
    // blocking one (whose handlers write on the ledger's pool) the
    // worker's own 4.
    a.worker.pool_size = Some(match role {
        Role::Plain | Role::FifoBlocking | Role::Keyed => 4,
        Role::Tx => 6,
        Role::Fifo => 4 + GROUPS as u32,
        // Two workers' claim loops, acknowledgements and pause watches.
        Role::High | Role::Low => 6,
    });
    a.worker.handler = match kind {
        ProcKind::Tx | ProcKind::Fifo => HandlerKind::Transactional,
        ProcKind::Blocking | ProcKind::FifoBlocking => HandlerKind::Blocking,
        ProcKind::Plain | ProcKind::Group | ProcKind::Fleet | ProcKind::Prio => {
            HandlerKind::Context
        }
    };
    // The transactional queue's starts judge which delivery committed; the
    // FIFO blocking queue's, which runs lost their claim.
    a.record_starts = matches!(role, Role::Tx | Role::FifoBlocking);
    a.hooks = role == Role::Plain;
    a.group = kind == ProcKind::Group;
    if kind == ProcKind::Fleet {
        // The starts judge the runs at once and the places a killed
        // process held.
        a.worker.settings.fleet_limit = Some(FLEET_PLACES);
        a.record_starts = true;
        if sabotage.contains(&Sabotage::FleetLongVt) {
            a.set_vt_secs(40);
        }
    }
    if kind == ProcKind::Prio {
        let low = &qs[Role::Low.index()];
        a.prio = Some(PrioSpec {
            queue: low.q.as_str().to_owned(),
            dlq: low.dlq.as_str().to_owned(),
            scenario: scenario_of(scenario, Role::Low),
            weight: HIGH_WEIGHT,
            other_weight: LOW_WEIGHT,
            concurrency: None,
        });
    }
    a
}
