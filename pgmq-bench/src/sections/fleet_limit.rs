//! fleet_limit: worker processes draining one queue under one fleet-wide
//! limit (`WorkerBuilder::fleet_limit`), against the same places split
//! statically and a limit that never binds. The runs, the share of the
//! places used and why it is a floor are described once, in docs/benchmark-streams.md
//! ("fleet_limit"). The processes start as worker_processes starts them
//! (pgmq-bench's hidden `process-worker`); the `above` run's limit exceeds
//! what every process can hold at once, its handlers and its full claim
//! queue (`3 × --batch-size`, the default claim capacity).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use pgmq_client::QueueName;
use serde::{Deserialize, Serialize};

use crate::checks::Checks;
use crate::config::{pick, Apply, Profile};
use crate::document::{Runs, SectionRuns, Better, Document, Figure, LedgerReport, Rate, Sample, Sections, TargetCheck};
use crate::error::{Error, Result};
use crate::figures::{check, measured, median_of, paired_ratios, Figures, RunKey};
use crate::ledger::Ledger;
use crate::report::workload_if;
use crate::report::{cell, definitions};
use crate::kit::child::{limited as limited_spec, ChildReport, Fleet};
use crate::kit::snapshot::{DbSnapshot, ProcessesServer};
use crate::kit::Ctx;
use crate::sections::{at_least, within, Options, Round, Rounds, Section};
use crate::config::Config;
use crate::sections::plan::{self, Plan};

/// The section's name, in the document and on the command line.
const NAME: &str = "fleet_limit";

/// The section\'s runs in the document.
const RUNS: Runs<FleetLimitRun> = Runs::new(NAME);

/// The least share of the places a limited fleet uses with a backlog.
const USED_FLOOR: f64 = 0.9;

/// The least throughput of a fleet under a limit above its demand, over
/// the same fleet's without a limit.
const ABOVE_FLOOR: f64 = 0.95;

/// The modes of a round, in the order they run.
const MODES: [&str; 3] = ["limited", "static", "above"];

/// The fleet_limit options.
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
#[non_exhaustive]
pub struct FleetLimitOptions {
    /// fleet_limit: worker processes.
    #[arg(long, default_value_t = 4)]
    pub fleet_limit_processes: u32,

    /// fleet_limit: the limit's places (handlers running at once across
    /// every process).
    #[arg(long, default_value_t = 16)]
    pub fleet_limit_places: u32,

    /// fleet_limit: messages per run.
    #[arg(long, default_value_t = 1_600)]
    pub fleet_limit_messages: u64,

    /// fleet_limit: simulated I/O per handler call, milliseconds.
    #[arg(long, default_value_t = 100)]
    pub fleet_limit_work_ms: u64,
}

impl FleetLimitOptions {
    /// One handler call's work.
    pub fn work(&self) -> Duration {
        Duration::from_millis(self.fleet_limit_work_ms)
    }
}

impl Options for FleetLimitOptions {
    fn check(&self) -> Result<()> {
        let processes = within(self.fleet_limit_processes, 1..=64, "--fleet-limit-processes")?;
        // At least a place per process.
        within(self.fleet_limit_places, processes..=1024, "--fleet-limit-places")?;
        at_least(self.fleet_limit_work_ms, 1, "--fleet-limit-work-ms")?;
        at_least(self.fleet_limit_messages, 1, "--fleet-limit-messages")?;
        Ok(())
    }

    fn apply_profile(&mut self, p: &Apply<'_>) {
        match p.profile {
            Profile::Quick | Profile::Default => pick!(p, self.fleet_limit_messages, 1_600, 400),
            Profile::Standard | Profile::Full | Profile::Long => {}
        }
    }
}

/// One run: a fleet draining one queue, limited or split statically.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct FleetLimitRun {
    /// Round.
    pub round: u32,
    /// Warm-up or measured.
    pub warmup: bool,
    /// `limited`, `static` or `above`.
    pub mode: String,
    /// Worker processes.
    pub processes: u32,
    /// The places (the limit of a limited run, or the handlers of all
    /// processes together).
    pub places: u32,
    /// The fleet-wide limit's places (none: no limit).
    #[serde(default)]
    pub limit: Option<u32>,
    /// Handlers per process.
    pub workers_per_process: u32,
    /// Simulated I/O per handler call, milliseconds.
    pub work_ms: u64,
    /// Distinct messages over the slowest process's seconds.
    pub rate: Rate,
    /// Messages x work over places x seconds.
    pub used: f64,
    /// The most claims running at once the queue table showed (sampled every
    /// 10 ms; runs under a limit only).
    pub most_running_seen: Option<i64>,
    /// Every message handled once?
    pub ledger: LedgerReport,
    /// Messages left in the queue after the run.
    pub remaining_after: i64,
    /// Where a place's time went, per message (limited runs only; None in
    /// older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cycle: Option<PlaceCycle>,
}

/// Where a place of a limited run spent its time, per message: a place is
/// taken from a message's claim until its acknowledgement commits, so what
/// is not a handler's run is the claim path's.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct PlaceCycle {
    /// Places × the run's time ÷ messages, milliseconds: how long each
    /// message kept a place, on average.
    pub place_ms: f64,
    /// The handlers' own run, milliseconds, the mean over every process
    /// (the simulated I/O and the timer's rounding of it).
    pub handler_ms: f64,
    /// The rest, milliseconds: from a handler's end to the next start on
    /// its place (the acknowledgement written and committed, the place
    /// seen free, the next claim read and its reply), with the run's ramp
    /// and tail.
    pub between_ms: f64,
    /// Claim reads per message, every process's (a read that found no
    /// free place counts too).
    pub reads_per_msg: f64,
    /// The database's transactions over the run per message, less the
    /// sampler's own (None: not readable): each message's claim and
    /// acknowledgement commit on their own, and so does every read.
    pub transactions_per_msg: Option<f64>,
}

impl PlaceCycle {
    /// The cycle of a run of `places` over `elapsed_s` that handled
    /// `distinct` messages, as the processes' `reports` measured it, with
    /// the database's transactions (`server`) less the sampler's
    /// `sampled` queries.
    fn of(
        places: u32,
        elapsed_s: f64,
        distinct: u64,
        reports: &[ChildReport],
        server: Option<ProcessesServer>,
        sampled: u64,
    ) -> PlaceCycle {
        let n = distinct.max(1) as f64;
        let handled: u64 = reports.iter().map(|r| r.handled).sum();
        let handler_ms = reports
            .iter()
            .map(|r| r.handler_ms.mean * r.handled as f64)
            .sum::<f64>()
            / handled.max(1) as f64;
        let place_ms = f64::from(places) * elapsed_s * 1000.0 / n;
        PlaceCycle {
            place_ms,
            handler_ms,
            between_ms: place_ms - handler_ms,
            reads_per_msg: reports.iter().map(|r| r.worker.reads).sum::<u64>() as f64 / n,
            transactions_per_msg: server
                .map(|s| (s.transactions_per_msg - sampled as f64 / n).max(0.0)),
        }
    }
}

/// One run of `mode` on a fresh queue.
async fn run(ctx: &Arc<Ctx>, mode: &str, round: u32, warmup: bool) -> Result<FleetLimitRun> {
    let o = &ctx.cfg.options.fleet_limit;
    let (processes, messages, work) = (o.fleet_limit_processes, o.fleet_limit_messages, o.work());
    let (workers, places) = match mode {
        "limited" => (o.fleet_limit_places, Some(o.fleet_limit_places)),
        "above" => {
            let handlers = o.fleet_limit_places / processes;
            let claim_capacity = 3 * ctx.cfg.batch_size;
            (handlers, Some(processes * (handlers + claim_capacity)))
        }
        _ => (o.fleet_limit_places / processes, None),
    };
    let limited = places.is_some();
    let (q, _, _) = ctx.fresh_loaded(NAME, messages).await?;
    let specs = (0..processes).map(|_| limited_spec(ctx.child_spec(&q), workers, work, places));
    let tag = format!("{round}-{mode}");
    let mut fleet = Fleet::start(ctx, "fleet-limit", &tag, specs).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicI64::new(0));
    let before = DbSnapshot::read(ctx, &q).await;
    let sampler = limited.then(|| {
        tokio::spawn(sample_running(
            Arc::clone(ctx),
            q.clone(),
            Arc::clone(&stop),
            Arc::clone(&most),
        ))
    });
    fleet.go().await?;
    let ledger = Ledger::new();
    let reports = fleet.collect(&ledger).await?;
    let elapsed = reports.iter().map(|r| r.elapsed_s).fold(0.0f64, f64::max);
    stop.store(true, Ordering::Relaxed);
    let sampled = match sampler {
        Some(s) => s
            .await
            .map_err(|e| Error::Config(format!("the sampler failed: {e}")))??,
        None => 0,
    };
    let server = before.processes(&DbSnapshot::read(ctx, &q).await, messages);
    let remaining_after = ctx.finish_queue(&q).await?;
    let ledger = ledger.report(messages);
    let work_s = work.as_secs_f64();
    Ok(FleetLimitRun {
        round,
        warmup,
        mode: mode.to_owned(),
        processes,
        places: o.fleet_limit_places,
        limit: places,
        workers_per_process: workers,
        work_ms: o.fleet_limit_work_ms,
        rate: Rate::new(ledger.distinct, elapsed),
        used: ledger.distinct as f64 * work_s
            / (f64::from(o.fleet_limit_places) * elapsed.max(1e-9)),
        most_running_seen: limited.then(|| most.load(Ordering::Relaxed)),
        cycle: (mode == "limited").then(|| {
            PlaceCycle::of(o.fleet_limit_places, elapsed, ledger.distinct, &reports, server, sampled)
        }),
        ledger,
        remaining_after,
    })
}

/// Every 10 ms until `stop`, the messages of `q` claimed and not yet
/// acknowledged; keeps the most seen in `most`, and returns how many
/// samples it took (each a transaction of its own).
async fn sample_running(
    ctx: Arc<Ctx>,
    q: QueueName,
    stop: Arc<AtomicBool>,
    most: Arc<AtomicI64>,
) -> Result<u64> {
    let mut samples = 0;
    let sql = format!(
        "SELECT count(*) FROM {} WHERE last_read_at IS NOT NULL AND vt > pg_catalog.clock_timestamp()",
        q.table()
    );
    while !stop.load(Ordering::Relaxed) {
        let n: i64 = ctx.admin.query_one(&sql, &[]).await?.get(0);
        most.fetch_max(n, Ordering::Relaxed);
        samples += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(samples)
}

/// The fleet_limit section.
pub(crate) struct FleetLimit;

impl Section for FleetLimit {
    fn runs(&self) -> &dyn SectionRuns {
        &RUNS
    }

    fn about(&self) -> &'static str {
        "Worker processes under one fleet-wide limit: the limit holds, and the share of it used"
    }

    fn planned(&self, cfg: &Config) -> Plan {
        // Each mode: the handlers' simulated I/O over the places, at about
        // half of them used.
        let o = &cfg.options.fleet_limit;
        let messages = o.fleet_limit_messages;
        let io = messages as f64 * o.work().as_secs_f64() / f64::from(o.fleet_limit_places.max(1));
        let runs = MODES.len() as f64;
        Plan::fixed(runs * io / 0.5)
            + Plan::work(runs * (plan::PROCESS_START + plan::drain(messages, f64::INFINITY)))
    }

    fn check(&self, s: &Sections, out: &mut Checks) {
        out.each(&RUNS, s, |r| (r.mode.clone(), r.round, r.warmup), |out, tag, r| {
            out.drained(tag, r.rate.elapsed_s, &r.ledger, r.remaining_after);
            let limit = r.limit.unwrap_or(r.places);
            if let Some(most) = r.most_running_seen {
                if most > i64::from(limit) {
                    out.fail(format!(
                        "{tag}: the queue table showed {most} claims running, over the limit of {limit}"
                    ));
                }
            }
        });
    }

    fn figures(&self, s: &Sections, f: &mut Figures) {
        add_figures(f, &RUNS.list(s));
    }

    fn report(&self, d: &Document, out: &mut String) {
        let Some(w) = workload_if::<FleetLimitOptions>(d, "fleet_limit.limited.used") else {
            return;
        };
        let _ = writeln!(
            out,
            "## Fleet limit\n\n{} worker processes, {} places, {} messages per run, {} ms of simulated I/O per call.\n\n\
             | | Places used | msg/s | Most running seen |\n| --- | --- | --- | --- |\n\
             | under one limit | {} | {} | {} |\n| split statically | {} | {} | |\n\
             | split statically, under a limit above its demand | {} | {} (÷ static: {}) | |\n\n\
             Under the limit, a place per message: {} ms = handler run {} + between runs {} \
             ({} claim reads and {} transactions per message).\n",
            w.fleet_limit_processes,
            w.fleet_limit_places,
            w.fleet_limit_messages,
            w.fleet_limit_work_ms,
            cell(d, "fleet_limit.limited.used"),
            cell(d, "fleet_limit.limited.throughput"),
            cell(d, "fleet_limit.limited.most_running_seen"),
            cell(d, "fleet_limit.static.used"),
            cell(d, "fleet_limit.static.throughput"),
            cell(d, "fleet_limit.above.used"),
            cell(d, "fleet_limit.above.throughput"),
            cell(d, ABOVE_RATIO),
            cell(d, "fleet_limit.limited.place_ms"),
            cell(d, "fleet_limit.limited.handler_ms"),
            cell(d, "fleet_limit.limited.between_ms"),
            cell(d, "fleet_limit.limited.reads_per_msg"),
            cell(d, "fleet_limit.limited.transactions_per_msg"),
        );
        definitions(
            out,
            d,
            &[
                "fleet_limit.limited.used".into(),
                "fleet_limit.limited.throughput".into(),
                "fleet_limit.limited.most_running_seen".into(),
                ABOVE_RATIO.into(),
                "fleet_limit.limited.between_ms".into(),
            ],
        );
    }

    fn targets(&self, figures: &[Figure]) -> Vec<TargetCheck> {
        vec![
            check(
                "fleet_limit_used",
                "Fleet limit: with a backlog, a fleet of worker processes under one limit uses at least 0.9 of its places",
                median_of(figures, "fleet_limit.limited.used"),
                USED_FLOOR,
                "x",
                |v| v >= USED_FLOOR,
                Ok(()),
                "the median, over rounds, of messages x work per call over places x the run's time",
            ),
            check(
                "fleet_limit_above_demand",
                "Fleet limit: a limit above the fleet's demand keeps at least 0.95 of its throughput without one",
                median_of(figures, ABOVE_RATIO),
                ABOVE_FLOOR,
                "x",
                |v| v >= ABOVE_FLOOR,
                Ok(()),
                "the median, over rounds, of the above run's throughput over the static run's; short calls (1 ms) are the case it is stated for",
            ),
        ]
    }
}

impl Rounds for FleetLimit {
    /// One round: the limited run, the static split, then the static
    /// split under a limit above its demand.
    async fn run_round(&self, ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
        ctx.client.install_sdk_schema().await?;
        for mode in MODES {
            let r = run(ctx, mode, at.index, at.warm).await?;
            let seen = r
                .most_running_seen
                .map_or(String::new(), |m| format!(", at most {m} running seen"));
            let cycle = r.cycle.as_ref().map_or(String::new(), |c| {
                format!(
                    "; a place per message {:.1} ms: handler {:.1}, between runs {:.1}, \
                     {:.2} reads and {} transactions per message",
                    c.place_ms,
                    c.handler_ms,
                    c.between_ms,
                    c.reads_per_msg,
                    c.transactions_per_msg.map_or("?".into(), |t| format!("{t:.2}"))
                )
            });
            ctx.progress.say(format!(
                "{} {NAME} {mode}: {:.0} msg/s, {:.3} of {} places used{seen}{cycle}",
                at.tag, r.rate.rate_per_s, r.used, r.places
            ));
            RUNS.record(s, &r)?;
        }
        Ok(())
    }
}

const DEF_USED: &str = "Messages handled times the simulated I/O of one call, over the places \
    times the run's time (from go to the last handler's end in any process): the share of the \
    places kept busy, ramp and tail included.";

const DEF_RATE: &str = "Distinct messages handled over the run's time.";

const DEF_PLACE_MS: &str = "The limited run's places times its time over the messages handled: \
    how long each message kept a place, on average, from its claim to its acknowledgement's commit.";

const DEF_HANDLER_MS: &str = "The limited run's handler calls, the mean over every process: the \
    simulated I/O and the timer's rounding of it.";

const DEF_BETWEEN: &str = "A place per message less the handler run: from a handler's end to \
    the next start on its place (the acknowledgement written and committed, the place seen free, \
    the next claim read and its reply), with the run's ramp and tail.";

const DEF_READS: &str = "The limited run's claim reads, every process's, over the messages \
    handled (reads that found no free place included).";

const DEF_XACTS: &str = "The database's transactions over the limited run, less the sampler's \
    own, over the messages handled: claims, acknowledgements and empty reads each commit.";

const DEF_MOST: &str = "The most messages of the queue claimed and not yet acknowledged at once, \
    as the queue table showed them to a sample every 10 ms during the limited run.";

const DEF_ABOVE: &str = "The throughput of the static split's handlers under a limit above all the \
    processes hold at once (handlers and full claim queues) over the static run's in the same round.";

/// The id of the above ÷ static ratio.
const ABOVE_RATIO: &str = "fleet_limit.above.vs_static";

fn add_figures(f: &mut Figures, runs: &[FleetLimitRun]) {
    for mode in MODES {
        let of = || measured(runs, |r| r.warmup).filter(move |r| r.mode == mode);
        f.add(
            format!("{NAME}.{mode}.used"),
            NAME,
            format!("Places used, {mode}"),
            "x",
            Better::Higher,
            DEF_USED,
            of().map(|r| Sample::value(r.round, r.used)).collect(),
        );
        f.add(
            format!("{NAME}.{mode}.throughput"),
            NAME,
            format!("Throughput, {mode}"),
            "msg/s",
            Better::Higher,
            DEF_RATE,
            of().map(|r| Sample::rate(r.round, &r.rate)).collect(),
        );
    }
    let limited = || measured(runs, |r| r.warmup).filter(|r| r.mode == "limited");
    f.add(
        format!("{NAME}.limited.most_running_seen"),
        NAME,
        "Most running seen, limited".into(),
        "msg",
        Better::Lower,
        DEF_MOST,
        limited()
            .filter_map(|r| r.most_running_seen.map(|m| Sample::value(r.round, m as f64)))
            .collect(),
    );
    let cycle = [
        ("place_ms", "A place per message", "ms", DEF_PLACE_MS, (|c| Some(c.place_ms)) as fn(&PlaceCycle) -> Option<f64>),
        ("handler_ms", "Handler run", "ms", DEF_HANDLER_MS, |c| Some(c.handler_ms)),
        ("between_ms", "Between handler runs on a place", "ms", DEF_BETWEEN, |c| Some(c.between_ms)),
        ("reads_per_msg", "Claim reads per message", "x", DEF_READS, |c| Some(c.reads_per_msg)),
        ("transactions_per_msg", "Transactions per message", "x", DEF_XACTS, |c| c.transactions_per_msg),
    ];
    for (name, title, unit, def, get) in cycle {
        f.add(
            format!("{NAME}.limited.{name}"),
            NAME,
            format!("{title}, limited"),
            unit,
            Better::Lower,
            def,
            limited()
                .filter_map(|r| r.cycle.as_ref().and_then(get).map(|v| Sample::value(r.round, v)))
                .collect(),
        );
    }
    let key: RunKey<FleetLimitRun> = |r| (r.round, r.warmup, r.mode.as_str(), r.rate.rate_per_s);
    f.add(
        ABOVE_RATIO.into(),
        NAME,
        "Above demand ÷ static".into(),
        "x",
        Better::Higher,
        DEF_ABOVE,
        paired_ratios(runs, key, "above", "static"),
    );
}

