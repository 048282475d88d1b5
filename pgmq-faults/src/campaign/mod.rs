//! The fault campaign (`pgmq-faults --campaign`): a seeded random
//! schedule of faults ([`nemesis`](super::nemesis)) over a mixed workload of
//! several worker processes on one database, checked against invariants
//! ([`invariants`](super::invariants)), reproducible from its seed.
//!
//! One seed's run: fresh queues (plain, transactional, FIFO groups with a
//! transactional handler, FIFO groups with a blocking handler, each with a
//! dead-letter queue); worker processes of several kinds, one of each with
//! the default `--processes` 6 (a context handler with hooks, a
//! transactional handler, a FIFO-groups transactional handler, a context
//! handler inside a `WorkerGroup`, a blocking handler, a FIFO-groups
//! blocking handler) connected through the suite's proxy; a producer
//! sending a mix of messages (plain, failing, retried, snoozed, slow,
//! hanging, panicking in the handler, in a hook or in `Deserialize`,
//! poison), some batches in a transaction; the faults of the schedule, one
//! after another; a sampler watching connections and held messages every
//! second. Then the producer stops, the queues must drain, the workers are
//! stopped gracefully, and every invariant is judged. The schedule is drawn
//! up front from the seed and printed; a failing seed prints the command
//! that replays it.
//!
//! The FIFO blocking queue is there for one defect: a blocking run
//! abandoned at `handler_timeout` goes on on its thread, and unless the
//! handler loop waits for it, its message's retry and its group's next
//! message run beside it. Every 30th message of each of its groups (from
//! the fourth) hangs 10-12 s on its first delivery, past the 8 s
//! `handler_timeout`; its run still records its handling when the hang
//! ends (a blocking handler cannot see its cancellation), so the FIFO
//! invariants see it overlap whatever ran meanwhile.
//!
//! The parts, each importing what they share from [`model`] (queues,
//! process kinds, keys, records) and none from this runner: [`plan`] (the
//! options and each seed's schedule), [`workload`] (the core producer),
//! [`fleet`] (the fleet workload: keyed sends, fleet limits, pauses,
//! priorities; and the kill and extension cells with what the cells
//! share), [`key_limits`], [`schedules`], [`retention`], [`moves`] and
//! [`ranged`] (the key, periodic-sends, retention, move and ranged-drain
//! cells), [`prio_short`] (the short-handler priority cell), [`slots`]
//! (the worker processes), [`nemesis`] (the fault kinds, one table, and
//! their injection), [`watch`] (the sampler), [`invariants`] (the
//! verdicts).
//! This module runs a seed through its phases, then the cells.

mod fleet;
mod invariants;
mod key_limits;
pub(crate) mod model;
mod moves;
mod nemesis;
pub(crate) mod plan;
mod prio_short;
mod ranged;
mod retention;
mod schedules;
mod slots;
mod watch;
mod workload;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use pgmq_client::QueueName;
use rand::rngs::StdRng;
use rand::SeedableRng;

use self::fleet::{FleetProducer, FleetState};
use self::invariants::{Evidence, FleetEvidence};
use self::model::{scenario_of, ProcKind, Role, SeedSummary, FLEET_PLACES, ROLES};
use self::nemesis::Nemesis;
use self::plan::{draw, print_schedule, process_kinds, Options};
use self::slots::Slots;
use self::workload::{connect_producer, every_tick, Producer, Workload};
use crate::ctx::{Ctx, FleetSamples, Queues};
use crate::ledger::{self, Handling, Start, Tally};
use crate::proxy::Proxy;
use crate::report::{Check, DupBound, Row};
use crate::worker::Sabotage;
use crate::BoxError;

/// One seed's result.
pub(crate) struct SeedRun {
    pub row: Row,
    pub summary: SeedSummary,
}

/// Runs every seed, then the cells (the kill cell when the campaign kills,
/// the key cell, the extension cell); returns one row per seed and one per cell.
pub(crate) async fn run(ctx: &Ctx, opts: &Options) -> Result<(Vec<SeedRun>, Vec<Row>), BoxError> {
    let proxy = ctx.start_proxy().await?;
    let mut out = Vec::new();
    for (i, seed) in opts.seeds.iter().enumerate() {
        let t = Instant::now();
        eprintln!(
            "campaign: seed {seed} ({} of {}) ...",
            i + 1,
            opts.seeds.len()
        );
        let run = run_seed(ctx, &proxy, opts, *seed, i).await?;
        eprintln!(
            "campaign: seed {seed} {} in {:.0} s",
            if run.row.pass { "passed" } else { "FAILED" },
            t.elapsed().as_secs_f64()
        );
        if !run.row.pass {
            eprintln!("campaign: replay with: {}", run.summary.replay);
        }
        out.push(run);
    }
    let mut cells = Vec::new();
    if opts.kinds.iter().any(|k| k.name == "kill") {
        let t = Instant::now();
        eprintln!("campaign: kill cell (a fleet-limited process killed holding every place) ...");
        let checks = fleet::kill_cell(ctx, &opts.sabotage).await;
        cells.push(cell_row(
            "kill cell",
            "a worker process under a fleet limit killed while it runs a handler in every \
             place, then a second process under the same limit",
            checks,
            t,
        ));
    }
    if runs_cell(opts, &[Sabotage::ScheduleUnfenced]) {
        let t = Instant::now();
        eprintln!("campaign: periodic-sends cell (schedulers through a kill, a SIGSTOP and a PostgreSQL crash) ...");
        let checks = schedules::schedule_cell(ctx, &opts.sabotage).await;
        cells.push(cell_row(
            "periodic sends",
            "a schedule ticking every second, fired by three processes through a SIGKILL, a \
             SIGSTOP and a PostgreSQL crash",
            checks,
            t,
        ));
    }
    if runs_cell(opts, &[Sabotage::RetentionYoung]) {
        let t = Instant::now();
        eprintln!("campaign: retention cell (pruners at once, one through cut connections) ...");
        let checks = retention::retention_cell(ctx, &proxy, &opts.sabotage).await;
        cells.push(cell_row(
            "retention cell",
            "an archive pruned past an age by three pruners at once, one through a proxy cutting \
             its connections, while fresh messages are archived",
            checks,
            t,
        ));
    }
    if runs_cell(opts, &[Sabotage::MoveSplit]) {
        let t = Instant::now();
        eprintln!("campaign: move cell (a move through a proxy cutting every other batch) ...");
        let checks = moves::move_cell(ctx, &proxy, &opts.sabotage).await;
        cells.push(cell_row(
            "move cell",
            "messages moved between queues in batches through a proxy cutting the connection \
             before, during or after every other batch",
            checks,
            t,
        ));
    }
    if runs_cell(opts, &[Sabotage::KeyLimitIgnored, Sabotage::FleetLongVt]) {
        let t = Instant::now();
        eprintln!(
            "campaign: key cell (workers under a limit per key; a holder of a key's places killed) ..."
        );
        let checks = key_limits::key_cell(ctx, &opts.sabotage).await;
        cells.push(cell_row(
            "key limits",
            "two worker processes under a limit per key over a hot key's backlog and cold keys, \
             then a process holding every place of a key killed",
            checks,
            t,
        ));
    }
    if runs_cell(opts, &[Sabotage::CursorFence]) {
        let t = Instant::now();
        eprintln!("campaign: ranged-drain cell (processes draining a backlog with retries) ...");
        let checks = ranged::ranged_cell(ctx, &opts.sabotage).await;
        cells.push(cell_row(
            "ranged drain",
            "three worker processes draining one backlog with ranges of the claim cursor, \
             every tenth message failing its first attempt",
            checks,
            t,
        ));
    }
    if runs_cell(opts, &[Sabotage::PrioAheadPastVt]) {
        let t = Instant::now();
        eprintln!("campaign: short-handler priority cell (a weighted group, reads far longer than its runs) ...");
        let checks = prio_short::prio_short_cell(ctx, &opts.sabotage).await;
        cells.push(cell_row(
            "short-handler priorities",
            "a weighted group of two queues with a backlog each, its handlers far shorter than \
             its reads (each made to wait 1 s), under a visibility timeout of 1 s",
            checks,
            t,
        ));
    }
    // After the last seed: re-creating PGMQ drops every queue, so no
    // seed's workload can share it, and until install-sdk has repaired the
    // pgmq_sdk schema no later seed could use its fleet limit.
    let t = Instant::now();
    eprintln!("campaign: extension cell (DROP EXTENSION pgmq CASCADE, CREATE EXTENSION pgmq, install-sdk) ...");
    let checks = fleet::extension_cell(ctx, &opts.sabotage).await;
    cells.push(cell_row(
        "extension re-created",
        "PGMQ dropped (CASCADE) and created again, the pgmq_sdk schema installed again, then a \
         worker under a fleet limit",
        checks,
        t,
    ));
    Ok((out, cells))
}

/// Whether a cell of a feature runs: in every campaign without sabotage,
/// and in a sabotaged one only when a sabotage of its own is planted. A
/// sabotage test of another feature then does not pay for it.
fn runs_cell(opts: &Options, own: &[Sabotage]) -> bool {
    let planted: Vec<&Sabotage> = opts
        .sabotage
        .iter()
        .filter(|s| **s != Sabotage::None)
        .collect();
    planted.is_empty() || planted.iter().any(|s| own.contains(s))
}

/// A cell's row, and its verdict on stderr.
fn cell_row(scenario: &str, title: &str, checks: Vec<Check>, started: Instant) -> Row {
    let row = Row::new(
        scenario,
        title,
        Tally::default(),
        None,
        checks,
        started.elapsed(),
    );
    eprintln!(
        "campaign: {scenario} {} in {:.0} s",
        if row.pass { "passed" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    row
}

/// One seed's run, phase after phase: the queues, the worker processes,
/// the sampler, the producers, the faults of the schedule; then the
/// producers stop, the queues drain, the processes stop, and what the
/// ledger and the queues hold is judged.
async fn run_seed(
    ctx: &Ctx,
    proxy: &Proxy,
    opts: &Options,
    seed: u64,
    index: usize,
) -> Result<SeedRun, BoxError> {
    let started = Instant::now();
    let schedule = draw(seed, opts.duration, &opts.kinds, opts.processes);
    let kinds = process_kinds(opts.processes);
    print_schedule(seed, opts.duration, &kinds, &schedule);
    let label = index.to_string();
    let consumed = Role::ALL.map(|r| kinds.iter().any(|k| k.roles().contains(&r)));
    let qs = prepare_queues(ctx, &label).await?;
    let queue_names: [QueueName; ROLES] = std::array::from_fn(|i| qs[i].q.clone());
    let proxied = ctx.proxied_dsn(proxy);
    let slots = Arc::new(Slots::start(ctx, &proxied, &kinds, &qs, &label, &opts.sabotage).await?);
    let (watch_stop, watch_stopped) = tokio::sync::watch::channel(false);
    let sampler = watch::sample(
        slots.clone(),
        ctx.cluster.dsn(),
        queue_names.clone(),
        watch_stopped.clone(),
    );
    let fleet_sampler = crate::ctx::sample_running(
        ctx.cluster.dsn(),
        (queue_names[Role::Keyed.index()].quoted_table(), None),
        i64::from(FLEET_PLACES),
        Duration::from_millis(100),
        watch_stopped,
    );
    let producing = start_producers(ctx, &proxied, opts, seed, &qs, consumed, started).await?;
    let nemesis = Nemesis {
        ctx,
        proxy,
        slots: &slots,
        workload: &producing.workload,
        fleet: &producing.fleet,
    };
    let events = nemesis.play(&schedule, started).await?;
    tokio::time::sleep_until((started + opts.duration).into()).await;
    let mut produced = producing.stop().await?;
    let drain = drain(ctx, &queue_names).await;
    let _ = watch_stop.send(true);
    let samples = sampler.await?;
    let fleet_samples = fleet_sampler.await?;
    slots.stop_all().await;
    let mut fleet_evidence = produced.fleet_evidence(kinds.clone(), fleet_samples).await;
    let accounts = account(ctx, &label, &qs, &mut produced, &mut fleet_evidence).await?;
    for q in &qs {
        ctx.drop_queues(q).await;
    }
    let exits = slots.exits().await;
    let redriven = produced.workload.redriven();
    let evidence = Evidence {
        redriven: &redriven,
        plans: &produced.core.plans,
        handlings: &accounts.handlings,
        starts: &accounts.starts,
        dead: &accounts.dead,
        tallies: &accounts.tallies,
        events: &events,
        samples: &samples,
        exits: &exits,
        consumed,
        drained: drain.drained,
        drain_took: drain.took,
        drain_bound: drain.bound,
        produced_until: produced.until,
        fleet: &fleet_evidence,
    };
    let checks = invariants::check_all(&evidence);
    let row = seed_row(seed, opts, events.len(), &accounts.tallies, checks, started);
    let mut faults_by_kind = BTreeMap::new();
    for e in &events {
        *faults_by_kind.entry(e.kind.to_owned()).or_insert(0) += 1;
    }
    let summary = SeedSummary {
        seed,
        duration_s: opts.duration.as_secs(),
        processes: kinds,
        schedule,
        faults_by_kind,
        fault_errors: events.iter().filter_map(|e| e.error.clone()).collect(),
        pass: row.pass,
        replay: format!("pgmq-faults --campaign --seed {seed} {}", opts.replay_tail),
    };
    Ok(SeedRun { row, summary })
}

/// The queues of a seed's run, one pair (queue, dead-letter queue) per
/// role, with the `pgmq_sdk` schema (keyed sends, pauses, fleet limits)
/// and the FIFO queues' index.
async fn prepare_queues(ctx: &Ctx, label: &str) -> Result<[Queues; ROLES], BoxError> {
    ctx.client.install_sdk_schema().await?;
    let mut made = Vec::new();
    for role in Role::ALL {
        made.push(ctx.queues(&scenario_of(label, role)).await?);
    }
    let qs: [Queues; ROLES] = made.try_into().map_err(|_| "one queue pair per role")?;
    for role in Role::ALL {
        if role.fifo_base().is_some() {
            ctx.client.create_fifo_index(&qs[role.index()].q).await?;
        }
    }
    Ok(qs)
}

/// The producers as they run, until [`stop`](Self::stop).
struct Producing {
    workload: Arc<Workload>,
    fleet: Arc<FleetState>,
    stop: tokio::sync::watch::Sender<bool>,
    core: tokio::task::JoinHandle<Producer>,
    keyed: tokio::task::JoinHandle<FleetProducer>,
}

/// The producers once stopped, and what they sent.
struct Produced {
    workload: Arc<Workload>,
    fleet: Arc<FleetState>,
    core: Producer,
    keyed: FleetProducer,
    /// When the producers stopped (and every fault was over).
    until: DateTime<Utc>,
}

/// Starts the core producer (the plain, transactional and FIFO queues),
/// the fleet workload's producer (keyed sends through the proxy, the
/// prioritized group's queues).
async fn start_producers(
    ctx: &Ctx,
    proxied: &str,
    opts: &Options,
    seed: u64,
    qs: &[Queues; ROLES],
    consumed: [bool; ROLES],
    started: Instant,
) -> Result<Producing, BoxError> {
    let queue_names: [QueueName; ROLES] = std::array::from_fn(|i| qs[i].q.clone());
    let producer_client = connect_producer(&ctx.cluster.dsn(), 4, "pgmq-campaign-producer").await?;
    let direct_client = producer_client.clone();
    let workload = Arc::new(Workload::new((qs[0].q.clone(), qs[0].dlq.clone())));
    let producer = Producer::new(
        producer_client,
        workload.clone(),
        StdRng::seed_from_u64(seed ^ 0x9E37_79B9_7F4A_7C15),
        queue_names.clone(),
        consumed,
        started + opts.duration,
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let core = every_tick(producer, stopped.clone(), |p, n| Box::pin(p.tick(n)));
    let fleet = Arc::new(FleetState::new(
        queue_names.clone(),
        consumed,
        &opts.sabotage,
    ));
    let keyed_client = connect_producer(proxied, 2, "pgmq-campaign-keyed").await?;
    let fleet_producer = FleetProducer::new(
        keyed_client,
        direct_client,
        fleet.clone(),
        StdRng::seed_from_u64(seed ^ 0x5851_F42D_4C95_7F2D),
    );
    let keyed = every_tick(fleet_producer, stopped, |p, n| Box::pin(p.tick(n)));
    Ok(Producing {
        workload,
        fleet,
        stop,
        core,
        keyed,
    })
}

impl Producing {
    /// Stops both producers and gives them back.
    async fn stop(self) -> Result<Produced, BoxError> {
        let _ = self.stop.send(true);
        let core = self.core.await?;
        let keyed = self.keyed.await?;
        Ok(Produced {
            workload: self.workload,
            fleet: self.fleet,
            core,
            keyed,
            until: Utc::now(),
        })
    }
}

impl Produced {
    /// What the fleet workload recorded, for the invariants: the keyed
    /// queue's life, the claim windows and the places back after kills (a
    /// kill's watch still going is judged as far as it looked), with the
    /// fleet limit's fast `samples`.
    async fn fleet_evidence(
        &mut self,
        kinds: Vec<ProcKind>,
        samples: FleetSamples,
    ) -> FleetEvidence {
        let final_epoch = *self.fleet.epoch.read().await;
        for w in self
            .fleet
            .place_watchers
            .lock()
            .map(|mut w| std::mem::take(&mut *w))
            .unwrap_or_default()
        {
            w.abort();
        }
        FleetEvidence {
            final_epoch,
            kinds,
            samples,
            windows: self
                .fleet
                .windows
                .lock()
                .map(|w| w.clone())
                .unwrap_or_default(),
            places: self
                .fleet
                .places
                .lock()
                .map(|p| p.clone())
                .unwrap_or_default(),
            log: std::mem::take(&mut self.keyed.log),
            ..FleetEvidence::default()
        }
    }
}

/// How the queues drained after the producers stopped.
struct Drain {
    drained: [bool; ROLES],
    took: Duration,
    bound: Duration,
}

/// Every fault is over: waits, at most 60 s, for every queue to be empty.
async fn drain(ctx: &Ctx, queues: &[QueueName; ROLES]) -> Drain {
    let bound = Duration::from_secs(60);
    let t = Instant::now();
    let mut drained = [false; ROLES];
    while t.elapsed() < bound && !drained.iter().all(|d| *d) {
        for (i, q) in queues.iter().enumerate() {
            if !drained[i] {
                drained[i] = matches!(ctx.client.metrics(q).await, Ok(m) if m.queue_length == 0);
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Drain {
        drained,
        took: t.elapsed(),
        bound,
    }
}

/// What the ledger and the queues hold at the end, per queue
/// ([`Role::index`]).
struct Accounts {
    handlings: Vec<Vec<Handling>>,
    starts: Vec<Vec<Start>>,
    dead: Vec<HashMap<i64, String>>,
    tallies: Vec<Tally>,
}

/// Accounts for every queue: the ledger's handlings and starts, the dead
/// letters, what is left; each produced key classified and persisted. The
/// keyed queue's stored messages, dead letters and runs go to
/// `fleet_evidence`, with its produces (those of a dropped queue's life
/// left out unless their message was found).
async fn account(
    ctx: &Ctx,
    label: &str,
    qs: &[Queues; ROLES],
    produced: &mut Produced,
    fleet_evidence: &mut FleetEvidence,
) -> Result<Accounts, BoxError> {
    for role in [Role::Keyed, Role::High, Role::Low] {
        let i = role.index();
        produced.core.produced[i].merge(std::mem::take(&mut produced.keyed.produced[i]));
    }
    let final_epoch = fleet_evidence.final_epoch;
    let mut accounts = Accounts {
        handlings: Vec::new(),
        starts: Vec::new(),
        dead: Vec::new(),
        tallies: Vec::new(),
    };
    for role in Role::ALL {
        let i = role.index();
        let scenario = scenario_of(label, role);
        let at = (ctx.run_id.as_str(), scenario.as_str());
        let end = ledger::end_of(&ctx.client, at, (&qs[i].q, &qs[i].dlq)).await?;
        let mut present: HashSet<i64> = end.handlings.iter().map(|h| h.key).collect();
        present.extend(end.dead.0.iter().copied());
        present.extend(end.left_keys());
        let produced_here = &mut produced.core.produced[i];
        if role == Role::Keyed {
            // A dropped queue's messages went with it: only those found
            // must be accounted for.
            let epochs = &fleet_evidence.log.epochs;
            produced_here.records.retain(|r| {
                epochs.get(&r.key).is_none_or(|e| *e == final_epoch) || present.contains(&r.key)
            });
            let (archived, _) =
                ledger::ids_in_table(&ctx.client, &qs[i].q.quoted_archive_table()).await?;
            for (k, id) in end
                .handlings
                .iter()
                .map(|h| (h.key, h.msg_id))
                .chain(end.left.0.iter().copied())
                .chain(archived)
            {
                fleet_evidence.stored.entry(k).or_default().insert(id);
            }
            fleet_evidence.dead = end.dead.0.iter().copied().collect();
            fleet_evidence.runs = ledger::windows(&ctx.client, &ctx.run_id, &scenario).await?;
        }
        produced_here.classify_unknown(&present);
        produced_here
            .persist(&ctx.client, &ctx.run_id, &scenario)
            .await?;
        accounts.tallies.push(end.tally(produced_here));
        accounts.dead.push(end.dead_reasons);
        accounts.handlings.push(end.handlings);
    }
    for role in Role::ALL {
        accounts
            .starts
            .push(ledger::starts(&ctx.client, &ctx.run_id, &scenario_of(label, role)).await?);
    }
    fleet_evidence.produced = std::mem::take(&mut produced.core.produced[Role::Keyed.index()]);
    Ok(accounts)
}

/// A seed's row: the queues' tallies summed, the invariants' checks.
fn seed_row(
    seed: u64,
    opts: &Options,
    faults: usize,
    tallies: &[Tally],
    checks: Vec<Check>,
    started: Instant,
) -> Row {
    let tally = Tally::sum(tallies);
    let bound = DupBound {
        max: tally.handlings,
        why: "plain and FIFO blocking queues: at least once under faults, each duplicate \
              judged by 'duplicates only under faults'; transactional queues: exactly once"
            .into(),
    };
    Row::new(
        &format!("seed {seed}"),
        &format!(
            "campaign, {faults} faults over {} s",
            opts.duration.as_secs()
        ),
        tally,
        Some(bound),
        checks,
        started.elapsed(),
    )
}
