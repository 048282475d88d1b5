//! A benchmark run from start to document: refuse without an explicit
//! database, start `--local` if asked, connect, guard the queues, run the
//! rounds, evaluate, write the JSON, stop `--local`.

use std::path::Path;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use pgmq_client::{redact_dsn, Client};

use crate::cli::{HandlerKind, RunArgs, Section};
use crate::config::Config;
use crate::document::{
    ConsumeRun, Database, Document, Durability, Host, LedgerReport, MemorySummary, ProcessesRun,
    Protocol, RateSearch, RunOutcome, Sections, SustainedRun, Workload, SCHEMA,
};
use crate::error::{Error, Result};
use crate::figures::{self, TargetContext};
use crate::guard::Guard;
use crate::local_db::LocalDb;
use crate::metadata;
use crate::process::MemoryMeter;
use crate::progress::Progress;
use crate::sections::baseline::Loop;
use crate::sections::wakeup::Mode;
use crate::sections::{
    self, backlog, baseline, consume, idle, processes, send, sustained, wakeup, Ctx, Sink,
};
use crate::target::{self, Target};

/// Runs the benchmark; returns the exit status (0: every check passed,
/// 1: the document records a failure).
pub async fn run(args: RunArgs) -> Result<i32> {
    let cfg = Config::from_args(&args)?;
    if !args.local && args.dsn.is_none() && args.dsn_file.is_none() {
        return Err(Error::Refused(
            "no database given: set PGMQ_BENCH_DSN, or pass --dsn-file (or --dsn without its \
             password, which then comes from PGPASSWORD or ~/.pgpass) for a database the benchmark \
             may use, or --local for a throwaway cluster. It creates and drops pgmq_bench_* queues; \
             never point it at a shared, staging or production database"
                .into(),
        ));
    }
    if args.dsn.is_some() && args.dsn_file.is_some() {
        return Err(Error::Refused(
            "both --dsn-file and --dsn (or PGMQ_BENCH_DSN) name a database: give one".into(),
        ));
    }
    // Read and resolved before anything starts, so that a refused file or a
    // DSN that does not parse changes nothing.
    let given = if args.local {
        None
    } else {
        let dsn = match &args.dsn_file {
            Some(path) => target::read_dsn_file(path)?,
            None => args.dsn.clone().expect("checked above"),
        };
        Some(Target::resolve(&dsn)?)
    };
    if given.is_some() {
        eprintln!("{}", crate::cli::BEFORE_A_RUN);
    }
    let progress = Progress::new();
    let local = if args.local {
        progress.say(format!(
            "starting a throwaway cluster on port {}",
            args.local_port
        ));
        Some(LocalDb::start(args.local_port).await?)
    } else {
        None
    };
    let target = match (&local, given) {
        (Some(l), _) => l.target().clone(),
        (None, Some(t)) => t,
        (None, None) => unreachable!("checked above"),
    };
    let result = bench(cfg, target, local.is_some(), progress.clone()).await;
    if let Some(l) = local {
        progress.say("removing the throwaway cluster");
        if let Err(e) = l.stop().await {
            eprintln!("pgmq-bench: {e}");
        }
    }
    result
}

/// The command line with any DSN's password removed.
fn command_line() -> Vec<String> {
    let mut out = Vec::new();
    let mut after_dsn = false;
    for a in std::env::args() {
        if after_dsn {
            out.push(redact_dsn(&a));
            after_dsn = false;
        } else if a == "--dsn" {
            out.push(a);
            after_dsn = true;
        } else if let Some(v) = a.strip_prefix("--dsn=") {
            out.push(format!("--dsn={}", redact_dsn(v)));
        } else {
            out.push(a);
        }
    }
    out
}

/// What the document records about where and when the run took place,
/// gathered before the rounds start.
struct Conditions {
    started_at: DateTime<Utc>,
    host: Host,
    database: Database,
    durability: Durability,
    memory_method: String,
}

async fn bench(cfg: Config, target: Target, local: bool, progress: Progress) -> Result<i32> {
    let started_at = Utc::now();
    progress.say(format!(
        "connecting to {} (password: {})",
        target.redacted(),
        target.password_source().describe()
    ));
    let client = target
        .builder()
        .max_size(cfg.pool_size)
        .application_name("pgmq-bench")
        .connect()
        .await?;
    let (admin, _notifications) = target
        .builder()
        .application_name("pgmq-bench-admin")
        .connect_dedicated()
        .await?;
    let (guard, cleaned) = Guard::acquire(client.clone(), cfg.clean, cfg.unlogged).await?;
    if !cleaned.is_empty() {
        eprintln!(
            "pgmq-bench: dropped leftover queues: {}",
            cleaned.join(", ")
        );
    }
    let (host, database, durability) = environment(&admin, &client, &target, local, &cfg).await?;
    say_versions(&progress, &database, &cfg);
    let meter = MemoryMeter::start();
    let conditions = Conditions {
        started_at,
        host,
        database,
        durability,
        memory_method: meter.method().as_str().to_owned(),
    };
    let sink = open_sink(&cfg, &admin, &target).await?;
    let ctx = Arc::new(Ctx {
        sink,
        pad: sections::padding(cfg.payload_bytes),
        cfg,
        target,
        client,
        admin,
        guard: guard.clone(),
        meter,
        progress: progress.clone(),
    });
    let body_ctx = ctx.clone();
    let sections = guard.run(async move { rounds(&body_ctx).await }).await;
    if ctx.cfg.handler != HandlerKind::Empty {
        Sink::drop_table(&ctx.admin).await?;
    }
    let sections = sections?;
    let doc = document(&ctx, sections, conditions).await;
    write_and_report(&doc, &ctx.cfg, &progress).await
}

/// The host, the database and its durability settings, read before the
/// rounds so that the document describes what the runs ran on.
async fn environment(
    admin: &tokio_postgres::Client,
    client: &Client,
    target: &Target,
    local: bool,
    cfg: &Config,
) -> Result<(Host, Database, Durability)> {
    let host = metadata::host().await;
    let database =
        metadata::database(admin, target.redacted().to_owned(), local, client.install()).await?;
    let durability = metadata::durability(admin, cfg.unlogged).await?;
    Ok((host, database, durability))
}

/// The progress line naming the server, PGMQ, the build and the sections.
fn say_versions(progress: &Progress, database: &Database, cfg: &Config) {
    progress.say(format!(
        "PostgreSQL {}, PGMQ {}, {} build; sections: {}",
        database.server_version_num,
        database.pgmq_version,
        metadata::build().profile,
        cfg.sections
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(",")
    ));
}

/// The `--handler db-write*` table and, for `db-write`, the handlers' own
/// connections (enough for the largest handler count of any section).
async fn open_sink(
    cfg: &Config,
    admin: &tokio_postgres::Client,
    target: &Target,
) -> Result<Option<Arc<Sink>>> {
    Ok(match cfg.handler {
        HandlerKind::DbWrite => {
            Sink::create_table(admin).await?;
            let most = cfg.workers.iter().copied().max().unwrap_or(1);
            Some(Sink::connect(target, most.max(cfg.sustained_workers)).await?)
        }
        HandlerKind::DbWriteTx => {
            Sink::create_table(admin).await?;
            None
        }
        HandlerKind::Empty => None,
    })
}

/// The run's document: figures, targets and outcome from the sections,
/// with the conditions gathered before the rounds and the end-of-run load.
async fn document(ctx: &Ctx, sections: Sections, c: Conditions) -> Document {
    let cfg = &ctx.cfg;
    let figures = figures::build(&sections);
    let targets = figures::targets(
        &figures,
        TargetContext {
            handler: cfg.handler,
            handler_work_ms: cfg.handler_work.as_millis() as u64,
            idle_poll_ms: cfg.idle_poll.as_millis() as u64,
            messages: cfg.messages,
        },
    );
    let outcome = evaluate(&sections, &metadata::build().profile);
    let mut host = c.host;
    host.load_average_end = metadata::load_average().await;
    Document {
        schema: SCHEMA.to_owned(),
        outcome,
        durability: c.durability,
        metadata: crate::document::Metadata {
            started_at: c.started_at,
            finished_at: Utc::now(),
            sdk: metadata::sdk(),
            build: metadata::build(),
            host,
            database: c.database,
            workload: workload(cfg),
            command: command_line(),
            runtime: metadata::runtime(),
        },
        protocol: protocol(cfg, c.memory_method),
        memory: MemorySummary {
            method: ctx.meter.method().as_str().to_owned(),
            overall_peak_rss_bytes: ctx.meter.overall(),
            per_section: figures::section_peaks(&sections),
        },
        figures,
        sections,
        targets,
        invocations: Vec::new(),
    }
}

/// How the run was measured and summarised, as the document states it.
fn protocol(cfg: &Config, memory_method: String) -> Protocol {
    Protocol {
        warmup: cfg.warmup,
        repeat: cfg.repeat,
        order: "round_robin: each round runs every selected section once; the first `warmup` rounds \
                run only the throughput sections (send_single, send_batch, consume_scaling, baseline) and \
                are discarded"
            .into(),
        statistic: "median over measured rounds".into(),
        spread: "min and max over measured rounds, each round's value kept in figures[].runs".into(),
        memory_method,
        queue_state: "a fresh queue per run; consuming runs preload it on the server and run \
                      VACUUM (ANALYZE) on its table before the timed interval"
            .into(),
        min_timed_seconds: 1.0,
        invocations: None,
    }
}

/// Writes the document, prints its failures and the closing progress line;
/// the exit status (0: ok, 1: the document records a failure).
async fn write_and_report(doc: &Document, cfg: &Config, progress: &Progress) -> Result<i32> {
    write_document(doc, &cfg.output).await?;
    for f in &doc.outcome.failures {
        eprintln!("pgmq-bench: FAILED: {f}");
    }
    progress.say(format!(
        "wrote {} ({})",
        cfg.output.display(),
        if doc.outcome.ok { "ok" } else { "FAILED" }
    ));
    Ok(if doc.outcome.ok { 0 } else { 1 })
}

fn workload(cfg: &Config) -> Workload {
    Workload {
        sections: cfg.sections.iter().map(|s| s.name().to_owned()).collect(),
        messages: cfg.messages,
        batch_messages: cfg.batch_messages,
        single_messages: cfg.single_messages,
        batch_size: cfg.batch_size,
        visibility_timeout_s: cfg.vt.as_secs() as u32,
        payload_bytes: cfg.payload_bytes,
        workers: cfg.workers.clone(),
        handler_work_ms: cfg.handler_work.as_millis() as u64,
        unlogged: cfg.unlogged,
        pool_size: cfg.pool_size,
        idle_seconds: cfg.idle.as_secs_f64(),
        idle_poll_ms: cfg.idle_poll.as_millis() as u64,
        wakeup_samples: cfg.wakeup_samples,
        wakeup_poll_ms: cfg.wakeup_poll.as_millis() as u64,
        sustained_duration_s: cfg.duration.as_secs_f64(),
        sustained_warmup_s: cfg.sustained_warmup.as_secs_f64(),
        sustained_rate: cfg.rate,
        sustained_producers: cfg.producers,
        sustained_workers: cfg.sustained_workers,
        handler: Some(cfg.handler.name().to_owned()),
        backlog_sizes: Some(cfg.backlog_sizes.clone()),
        backlog_workers: Some(cfg.backlog_workers),
        processes: Some(cfg.processes.clone()),
        claim_reads: cfg.claim_reads_name().map(str::to_owned),
        rate_search: Some(RateSearch {
            enabled: cfg.rate_search,
            step: cfg.rate_step,
            steps_max: cfg.rate_steps_max,
        }),
    }
}

/// The baseline loops the `baseline` slot of a round runs: all three when
/// only `baseline` is selected. Beside an SDK section, its loop runs next to
/// it instead (see `rounds`).
fn baseline_loops(cfg: &Config) -> Vec<Loop> {
    let sdk = [
        Section::SendSingle,
        Section::SendBatch,
        Section::ConsumeScaling,
    ];
    if sdk.iter().any(|s| cfg.has(*s)) {
        Vec::new()
    } else {
        vec![
            Loop::SendSingle,
            Loop::SendBatch,
            Loop::Consume,
            Loop::ConsumeEqualLayout,
        ]
    }
}

/// The round a run belongs to: its index among warm-up or measured rounds,
/// whether it is a warm-up round, and the tag naming it in progress lines.
#[derive(Clone, Copy)]
struct Round<'a> {
    index: u32,
    warm: bool,
    tag: &'a str,
}

/// A baseline run made next to the SDK run it is a reference of (one just
/// before it and one just after, the ratio taking their mean): on a shared
/// host the load moves within seconds, and a loop run a minute apart would
/// put that movement into the ratio.
async fn neighbour(
    ctx: &Ctx,
    which: Loop,
    at: Round<'_>,
    s: &mut Sections,
) -> Result<Option<usize>> {
    if !ctx.cfg.has(Section::Baseline) {
        return Ok(None);
    }
    baseline_once(ctx, which, at, s).await.map(Some)
}

/// One run of a baseline loop, recorded; its index in `s.baseline`.
async fn baseline_once(ctx: &Ctx, which: Loop, at: Round<'_>, s: &mut Sections) -> Result<usize> {
    let tag = at.tag;
    let r = baseline::run(ctx, which, at.index, at.warm).await?;
    ctx.progress.say(format!(
        "{tag} baseline {}: {:.0} msg/s",
        r.kind, r.rate.rate_per_s
    ));
    s.baseline.push(r);
    Ok(s.baseline.len() - 1)
}

async fn rounds(ctx: &Arc<Ctx>) -> Result<Sections> {
    let cfg = &ctx.cfg;
    let mut s = Sections::default();
    let p = &ctx.progress;
    for i in 0..cfg.warmup + cfg.repeat {
        let warm = i < cfg.warmup;
        let round = if warm { i } else { i - cfg.warmup };
        let tag = if warm {
            format!("warm-up {}/{}", round + 1, cfg.warmup)
        } else {
            format!("round {}/{}", round + 1, cfg.repeat)
        };
        let at = Round {
            index: round,
            warm,
            tag: &tag,
        };
        for section in &cfg.sections {
            if warm && !section.in_warmup() {
                continue;
            }
            match section {
                Section::SendSingle => {
                    // Between two loop runs: the ratio's reference is their mean.
                    neighbour(ctx, Loop::SendSingle, at, &mut s).await?;
                    let r = send::single(ctx, round, warm).await?;
                    p.say(format!("{tag} send_single: {:.0} msg/s", r.rate.rate_per_s));
                    s.send_single.push(r);
                    neighbour(ctx, Loop::SendSingle, at, &mut s).await?;
                }
                Section::SendBatch => {
                    neighbour(ctx, Loop::SendBatch, at, &mut s).await?;
                    let r = send::batch(ctx, round, warm).await?;
                    p.say(format!("{tag} send_batch: {:.0} msg/s", r.rate.rate_per_s));
                    s.send_batch.push(r);
                    neighbour(ctx, Loop::SendBatch, at, &mut s).await?;
                }
                Section::ConsumeScaling => {
                    consume_scaling(ctx, at, &mut s).await?;
                }
                Section::Baseline => {
                    for l in baseline_loops(cfg) {
                        baseline_once(ctx, l, at, &mut s).await?;
                    }
                }
                Section::BacklogScaling => backlog_scaling(ctx, at, &mut s).await?,
                Section::WorkerProcesses => worker_processes(ctx, at, &mut s).await?,
                Section::IdleWorker => idle_worker(ctx, at, &mut s).await?,
                Section::WakeupLatency => wakeup_latency(ctx, at, &mut s).await?,
                Section::Sustained if cfg.rate_search => {
                    sustained_rate_search(ctx, at, &mut s.sustained).await?;
                }
                Section::Sustained => sustained_once(ctx, at, &mut s).await?,
            }
        }
    }
    Ok(s)
}

/// One round of backlog_scaling: a run at each backlog size.
async fn backlog_scaling(ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
    let tag = at.tag;
    for n in &ctx.cfg.backlog_sizes {
        let r = backlog::run(ctx, *n, at.index).await?;
        ctx.progress.say(format!(
            "{tag} backlog_scaling {n}: {:.0} msg/s",
            r.rate.rate_per_s
        ));
        s.backlog_scaling.push(r);
    }
    Ok(())
}

/// One round of worker_processes: a run at each process count.
async fn worker_processes(ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
    let tag = at.tag;
    for n in &ctx.cfg.processes {
        let r = processes::run(ctx, *n, at.index).await?;
        ctx.progress.say(format!(
            "{tag} worker_processes {n}: {:.0} msg/s combined, min/max share {:.2}",
            r.rate.rate_per_s, r.min_over_max
        ));
        s.worker_processes.push(r);
    }
    Ok(())
}

/// One round of idle_worker.
async fn idle_worker(ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
    let tag = at.tag;
    let r = idle::run(ctx, at.index, at.warm).await?;
    ctx.progress.say(format!(
        "{tag} idle_worker: {:.2}% CPU, {:.1} empty reads/s",
        r.cpu_percent, r.empty_reads.rate_per_s
    ));
    s.idle_worker.push(r);
    Ok(())
}

/// One round of wakeup_latency: polling, then notifications.
async fn wakeup_latency(ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
    let tag = at.tag;
    for mode in [Mode::Poll, Mode::Notify] {
        let r = wakeup::run(ctx, mode, at.index, at.warm).await?;
        ctx.progress.say(format!(
            "{tag} wakeup_latency {}: p50 {:.2} ms",
            r.mode, r.latency_ms.p50
        ));
        s.wakeup_latency.push(r);
    }
    Ok(())
}

/// One round of sustained without `--rate-search`: one run at `--rate`.
async fn sustained_once(ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
    let tag = at.tag;
    let r = sustained::run(ctx, at.index, at.warm).await?;
    ctx.progress.say(format!(
        "{tag} sustained: {:.0} produced/s, {:.0} handled/s, slope {:.1}, {}",
        r.produced.rate_per_s,
        r.handled.rate_per_s,
        r.backlog_slope_per_s.unwrap_or(f64::NAN),
        if r.verdict.pass { "pass" } else { "FAIL" }
    ));
    s.sustained.push(r);
    Ok(())
}

/// One round of consume_scaling: the worker at each handler count, each
/// between two consume loops.
async fn consume_scaling(ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
    let tag = at.tag;
    let p = &ctx.progress;
    // A consume loop before each worker run and one after the last: every
    // worker run sits between two loops, and its ratio's reference is their
    // mean. The equal-layout loop once before the first worker run and once
    // after the last: the reference of `vs_equal_layout` is the mean of the
    // two.
    neighbour(ctx, Loop::ConsumeEqualLayout, at, s).await?;
    let mut before: Option<u32> = None;
    for w in &ctx.cfg.workers {
        if let Some(i) = neighbour(ctx, Loop::Consume, at, s).await? {
            s.baseline[i].paired_workers = Some(*w);
            s.baseline[i].follows_workers = before;
        }
        before = Some(*w);
        let r = consume::run(ctx, *w, at.index, at.warm).await?;
        p.say(format!(
            "{tag} consume_scaling w={w}: {:.0} msg/s, handler p99 {:.3} ms",
            r.rate.rate_per_s, r.handler_ms.p99
        ));
        s.consume_scaling.push(r);
    }
    if let Some(w) = before {
        if let Some(i) = neighbour(ctx, Loop::Consume, at, s).await? {
            s.baseline[i].follows_workers = Some(w);
        }
    }
    neighbour(ctx, Loop::ConsumeEqualLayout, at, s).await?;
    Ok(())
}

/// One round of sustained with `--rate-search`: its runs go to `runs`.
async fn sustained_rate_search(
    ctx: &Arc<Ctx>,
    at: Round<'_>,
    runs: &mut Vec<SustainedRun>,
) -> Result<()> {
    let tag = at.tag;
    let cfg = &ctx.cfg;
    // Step the rate up until the slope verdict fails.
    let base = cfg.rate.unwrap_or(1.0);
    for k in 0..cfg.rate_steps_max {
        let rate = base * cfg.rate_step.powi(k as i32);
        let mut r = sustained::run_at(ctx, Some(rate), at.index, at.warm).await?;
        r.rate_search_step = Some(k);
        let pass = r.verdict.pass;
        ctx.progress.say(format!(
            "{tag} sustained rate search step {k}: {rate:.0} msg/s target, {:.0} handled/s, slope {:.1}, {}",
            r.handled.rate_per_s,
            r.backlog_slope_per_s.unwrap_or(f64::NAN),
            if pass { "pass" } else { "fail: search ends" }
        ));
        runs.push(r);
        if !pass {
            break;
        }
    }
    Ok(())
}

fn run_tag(round: u32, warmup: bool) -> String {
    if warmup {
        format!("warm-up round {round}")
    } else {
        format!("round {round}")
    }
}

/// The run's own checks: every message accounted for, every drain verified,
/// sustained verdicts; and warnings about weak numbers.
pub fn evaluate(s: &Sections, profile: &str) -> RunOutcome {
    let mut failures = Vec::new();
    let mut warnings = Vec::new();
    send_checks(&mut failures, &mut warnings, s);
    drained_checks(&mut failures, &mut warnings, s);
    baseline_checks(&mut failures, &mut warnings, s);
    sustained_checks(&mut failures, &mut warnings, s);
    if profile != "release" {
        warnings
            .push("debug build: numbers show correctness, not representative throughput".into());
    }
    RunOutcome {
        ok: failures.is_empty(),
        failures,
        warnings,
    }
}

/// send_single and send_batch: short runs, and every message sent in the
/// queue afterwards.
fn send_checks(failures: &mut Vec<String>, warnings: &mut Vec<String>, s: &Sections) {
    for (name, runs) in [
        ("send_single", &s.send_single),
        ("send_batch", &s.send_batch),
    ] {
        for r in runs {
            let tag = run_tag(r.round, r.warmup);
            short_run_warning(warnings, &format!("{name} {tag}"), r.rate.elapsed_s);
            if r.in_queue_after != r.rate.count as i64 {
                failures.push(format!(
                    "{name} {tag}: sent {} but the queue holds {}",
                    r.rate.count, r.in_queue_after
                ));
            }
        }
    }
}

/// consume_scaling, backlog_scaling and worker_processes: the drain checks
/// and worker counters of each run (of each process for worker_processes).
fn drained_checks(failures: &mut Vec<String>, warnings: &mut Vec<String>, s: &Sections) {
    let consume = s
        .consume_scaling
        .iter()
        .map(|r| (format!("consume_scaling w={}", r.workers), r));
    let backlog = s
        .backlog_scaling
        .iter()
        .map(|r| (format!("backlog_scaling {}", r.ledger.expected), r));
    for (what, r) in consume.chain(backlog) {
        let tag = format!("{what} {}", run_tag(r.round, r.warmup));
        drained(failures, warnings, &tag, r);
        counter_failures(failures, &tag, &r.worker);
    }
    for r in &s.worker_processes {
        let tag = format!(
            "worker_processes {} {}",
            r.processes,
            run_tag(r.round, r.warmup)
        );
        drained(failures, warnings, &tag, r);
        for pr in &r.per_process {
            if pr.stalled {
                failures.push(format!("{tag}: process {} stalled", pr.index));
            }
            let who = format!("{tag}: process {}", pr.index);
            counter_failures(failures, &who, &pr.worker);
        }
    }
}

/// The baseline loops: short runs; a consuming loop's ledger and empty
/// queue, a sending loop's messages all in the queue.
fn baseline_checks(failures: &mut Vec<String>, warnings: &mut Vec<String>, s: &Sections) {
    for r in &s.baseline {
        let tag = format!("baseline {} {}", r.kind, run_tag(r.round, r.warmup));
        short_run_warning(warnings, &tag, r.rate.elapsed_s);
        if let Some(l) = &r.ledger {
            if l.missing > 0 {
                failures.push(format!("{tag}: {} messages never handled", l.missing));
            }
            ledger_failures(failures, &tag, l);
            if r.in_queue_after != 0 {
                failures.push(format!(
                    "{tag}: {} messages left in the queue",
                    r.in_queue_after
                ));
            }
        } else if r.in_queue_after != r.rate.count as i64 {
            failures.push(format!(
                "{tag}: sent {} but the queue holds {}",
                r.rate.count, r.in_queue_after
            ));
        }
    }
}

/// sustained: a slope too coarse to judge, the verdict (only lost messages
/// for a rate-search step), the ledger and the worker counters.
fn sustained_checks(failures: &mut Vec<String>, warnings: &mut Vec<String>, s: &Sections) {
    for r in &s.sustained {
        let tag = format!("sustained {}", run_tag(r.round, r.warmup));
        if let Some(se) = r.backlog_slope_stderr_per_s {
            if se > r.verdict.slope_limit_per_s / 2.0 {
                warnings.push(format!(
                    "{tag}: the backlog slope's standard error is {se:.1} msg/s, too coarse to judge the \
                     {} msg/s limit; use a longer --duration",
                    r.verdict.slope_limit_per_s
                ));
            }
        }
        if r.rate_search_step.is_some() {
            // A rate search ends on a failing step by design: only messages
            // not accounted for fail the run.
            if r.ledger.missing > 0 {
                failures.push(format!(
                    "{tag} (rate search step): {} messages never handled",
                    r.ledger.missing
                ));
            }
        } else if !r.verdict.pass {
            failures.push(format!("{tag}: {}", r.verdict.reasons.join("; ")));
        }
        ledger_failures(failures, &tag, &r.ledger);
        counter_failures(failures, &tag, &r.worker);
    }
}

/// A warning for a timed run under one second.
fn short_run_warning(warnings: &mut Vec<String>, what: &str, elapsed: f64) {
    if elapsed < 1.0 {
        warnings.push(format!(
            "{what} lasted {elapsed:.3} s, under 1 s: the rate measures start-up as much as steady state"
        ));
    }
}

/// A worker run that drained a preloaded queue.
trait Drained {
    /// Its timed seconds, its ledger and the messages left after it.
    fn drain(&self) -> (f64, &LedgerReport, i64);
}

impl Drained for ConsumeRun {
    fn drain(&self) -> (f64, &LedgerReport, i64) {
        (self.rate.elapsed_s, &self.ledger, self.remaining_after)
    }
}

impl Drained for ProcessesRun {
    fn drain(&self) -> (f64, &LedgerReport, i64) {
        (self.rate.elapsed_s, &self.ledger, self.remaining_after)
    }
}

/// The checks of a worker run that drained a preloaded queue: a warning
/// when it was short, and its drain checks.
fn drained(failures: &mut Vec<String>, warnings: &mut Vec<String>, tag: &str, r: &impl Drained) {
    let (elapsed, l, remaining_after) = r.drain();
    short_run_warning(warnings, tag, elapsed);
    drain_failures(failures, tag, l, remaining_after);
}

/// The worker's counters that do not add up, each a failure of `tag`.
fn counter_failures(failures: &mut Vec<String>, tag: &str, w: &crate::document::WorkerCounters) {
    for i in w.inconsistencies() {
        failures.push(format!("{tag}: {i}"));
    }
}

/// The checks of a run that drained a preloaded queue: every message handled
/// once, and nothing left in the queue once the workers stopped.
fn drain_failures(failures: &mut Vec<String>, tag: &str, l: &LedgerReport, remaining_after: i64) {
    if l.missing > 0 {
        failures.push(format!(
            "{tag}: {} of {} messages never handled (first: {:?})",
            l.missing, l.expected, l.missing_ids
        ));
    }
    if remaining_after != 0 {
        failures.push(format!(
            "{tag}: {remaining_after} messages still in the queue after the workers stopped (acknowledgements not drained)"
        ));
    }
    ledger_failures(failures, tag, l);
}

/// Duplicates and unexpected ids in a ledger fail the run: with a
/// visibility timeout longer than a run and a drained queue, a message
/// handled twice or an id the bench never sent is a fault, not noise.
fn ledger_failures(failures: &mut Vec<String>, tag: &str, l: &LedgerReport) {
    if l.duplicates > 0 {
        failures.push(format!(
            "{tag}: {} duplicate deliveries (first: {:?})",
            l.duplicates, l.duplicate_ids
        ));
    }
    if l.unexpected > 0 {
        failures.push(format!(
            "{tag}: {} handled ids outside the ids sent",
            l.unexpected
        ));
    }
}

/// Writes the document next to `path` and renames it into place.
pub async fn write_document(doc: &Document, path: &Path) -> Result<()> {
    let text = serde_json::to_string_pretty(doc).map_err(|e| Error::json("the document", e))?;
    let tmp = path.with_extension("json.tmp");
    tokio::fs::write(&tmp, text + "\n")
        .await
        .map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
    tokio::fs::rename(&tmp, path)
        .await
        .map_err(|e| Error::io(format!("renaming {} into place", tmp.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sections of a committed document, with a backlog_scaling run
    /// and a worker_processes run made from its first consume run.
    fn sections() -> Sections {
        let mut v: serde_json::Value =
            serde_json::from_str(include_str!("../../docs/results/dev-machine-fbd4125.json"))
                .unwrap();
        let s = &mut v["sections"];
        let consume = s["consume_scaling"][0].clone();
        s["backlog_scaling"] = serde_json::json!([consume.clone()]);
        s["worker_processes"] = serde_json::json!([{
            "round": 0, "warmup": false, "processes": 2, "workers_per_process": 2,
            "handler": "empty", "handler_work_ms": 0,
            "count": consume["count"], "elapsed_s": 2.0, "rate_per_s": 1.0,
            "per_process": [{
                "index": 1, "rate": {"count": 1, "elapsed_s": 2.0, "rate_per_s": 0.5},
                "share": 1.0, "stalled": false, "worker": consume["worker"],
                "handler_ms": consume["handler_ms"], "peak_rss_bytes": 1
            }],
            "min_over_max": 1.0, "jain_index": 1.0,
            "ledger": consume["ledger"], "remaining_after": 0, "preload_s": 0.1, "vacuum_s": 0.1
        }]);
        serde_json::from_value(v["sections"].clone()).unwrap()
    }

    /// Every drained run is checked the same way, its failures named by
    /// section, size or count, and round.
    #[test]
    fn drained_runs_fail_on_what_they_lost_or_left() {
        let clean = evaluate(&sections(), "release");
        assert!(clean.ok, "{:?}", clean.failures);
        let mut s = sections();
        s.consume_scaling[0].ledger.missing = 3;
        s.backlog_scaling[0].remaining_after = 5;
        s.backlog_scaling[0].worker.deleted += 1;
        s.worker_processes[0].per_process[0].worker.failed = 1;
        s.worker_processes[0].per_process[0].stalled = true;
        let expected = s.backlog_scaling[0].ledger.expected;
        let out = evaluate(&s, "release");
        let has = |needle: &str| out.failures.iter().any(|f| f.starts_with(needle));
        assert!(!out.ok);
        assert!(
            has("consume_scaling w=1 warm-up round 0: 3 of"),
            "{:?}",
            out.failures
        );
        assert!(
            has(&format!(
                "backlog_scaling {expected} warm-up round 0: 5 messages still in the queue"
            )),
            "{:?}",
            out.failures
        );
        assert!(
            has(&format!(
                "backlog_scaling {expected} warm-up round 0: worker counters do not add up"
            )),
            "{:?}",
            out.failures
        );
        assert!(
            has("worker_processes 2 round 0: process 1 stalled"),
            "{:?}",
            out.failures
        );
        assert!(
            has("worker_processes 2 round 0: process 1: worker counters: 1 failed"),
            "{:?}",
            out.failures
        );
    }
}
