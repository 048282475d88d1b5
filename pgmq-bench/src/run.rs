//! A benchmark run from start to document: refuse without an explicit
//! database, start `--local` if asked, connect, guard the queues, run the
//! rounds, evaluate, write the JSON, stop `--local`.

use std::path::Path;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use pgmq_client::{redact_dsn, Client};

use crate::cli::{HandlerKind, RunArgs};
use crate::config::Config;
use crate::document::{
    Database, Document, Durability, Host, MemorySummary, Protocol, RateSearch, Sections, Workload,
    SCHEMA,
};
use crate::error::{Error, Result};
use crate::figures::TargetContext;
use crate::guard::Guard;
use crate::kit::sink::Sink;
use crate::kit::Ctx;
use crate::local_db::LocalDb;
use crate::metadata;
use crate::process::MemoryMeter;
use crate::progress::{about, Progress, Steps};
use crate::report::count;
use crate::sections::plan::Plan;
use crate::sections::{self, Round, Section};
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
    if cfg.output.exists() {
        progress.say(format!(
            "{} exists: this run replaces it when it writes its document",
            cfg.output.display()
        ));
    }
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
        pad: crate::kit::body::padding(cfg.payload_bytes),
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
        cfg.section_names().join(",")
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
    let figures = sections::figures(&sections);
    let targets = sections::targets(
        &figures,
        TargetContext {
            handler: cfg.handler,
            handler_work_ms: cfg.handler_work_ms,
            idle_poll_ms: cfg.options.idle.idle_poll_ms,
            messages: cfg.messages,
        },
    );
    let outcome = sections::evaluate(&sections, &metadata::build().profile);
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
            per_section: sections::section_peaks(&sections),
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

/// Writes the document, prints its failures and the closing progress line,
/// then on stdout its short summary, its path and the command for the full
/// report; the exit status (0: ok, 1: the document records a failure).
async fn write_and_report(doc: &Document, cfg: &Config, progress: &Progress) -> Result<i32> {
    let replaces = cfg.output.exists();
    write_document(doc, &cfg.output).await?;
    for f in &doc.outcome.failures {
        eprintln!("pgmq-bench: FAILED: {f}");
    }
    progress.say(format!(
        "wrote {}{} ({})",
        cfg.output.display(),
        if replaces {
            ", replacing the earlier document"
        } else {
            ""
        },
        if doc.outcome.ok { "ok" } else { "FAILED" }
    ));
    let program = std::env::args()
        .next()
        .unwrap_or_else(|| "pgmq-bench".into());
    let path = cfg.output.display();
    println!(
        "{}\nDocument: {path}\nFull report: {program} report {path}",
        crate::report::summary::markdown(doc)
    );
    Ok(if doc.outcome.ok { 0 } else { 1 })
}

fn workload(cfg: &Config) -> Workload {
    Workload {
        profile: Some(cfg.profile.name().to_owned()),
        sections: cfg.section_names().into_iter().map(str::to_owned).collect(),
        messages: cfg.messages,
        batch_messages: cfg.batch_messages,
        single_messages: cfg.single_messages,
        batch_size: cfg.batch_size,
        visibility_timeout_s: cfg.visibility_timeout,
        payload_bytes: cfg.payload_bytes,
        workers: cfg.workers.clone(),
        handler_work_ms: cfg.handler_work_ms,
        unlogged: cfg.unlogged,
        pool_size: cfg.pool_size,
        options: cfg.options.workload(),
        sustained_duration_s: cfg.duration.as_secs_f64(),
        sustained_warmup_s: cfg.sustained_warmup.as_secs_f64(),
        sustained_rate: cfg.sustained_rate(),
        sustained_producers: cfg.producers,
        sustained_workers: cfg.sustained_workers,
        handler: Some(cfg.handler.name().to_owned()),
        backlog_sizes: Some(cfg.backlog_sizes().to_vec()),
        backlog_workers: Some(cfg.backlog_workers),
        processes: Some(cfg.processes.clone()),
        processes_messages: Some(cfg.processes_messages),
        claim_reads: cfg.claim_reads_name().map(str::to_owned),
        rate_search: Some(RateSearch {
            enabled: cfg.rate_search,
            step: cfg.rate_step,
            steps_max: cfg.rate_steps_max,
        }),
    }
}

/// The warm-up rounds, then the measured ones: each runs every selected
/// section once, in the registry's order (warm-up rounds only those that
/// warm up). Each such step starts with a progress line `[k/N]` and an
/// estimate of the time left; a section whose round runs nothing of its
/// own (a plan of 0 s) is not a step.
async fn rounds(ctx: &Arc<Ctx>) -> Result<Sections> {
    let cfg = &ctx.cfg;
    let plan: Vec<(u32, &'static dyn Section, Plan)> = (0..cfg.warmup + cfg.repeat)
        .flat_map(|i| {
            cfg.sections
                .iter()
                .filter(move |s| i >= cfg.warmup || s.in_warmup())
                .map(move |s| (i, *s, s.planned(cfg)))
        })
        .collect();
    let mut steps = Steps::new(
        plan.iter()
            .map(|(_, _, planned)| *planned)
            .filter(|planned| planned.total_s() > 0.0)
            .collect(),
    );
    ctx.progress.say(format!(
        "profile {}: {}, {} and {}, {}; {} in all (an estimate)",
        cfg.profile.name(),
        count(cfg.sections.len() as u32, "section"),
        count(cfg.warmup, "warm-up round"),
        count(cfg.repeat, "measured round"),
        count(steps.len() as u32, "step"),
        about(steps.planned_s())
    ));
    let mut s = Sections::default();
    for (i, section, planned) in plan {
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
        if planned.total_s() > 0.0 {
            let (k, left) = steps.start_next();
            ctx.progress.say(format!(
                "[{k}/{}] {tag} {}: {} left (an estimate)",
                steps.len(),
                section.name(),
                about(left)
            ));
        }
        section.boxed_round(ctx, at, &mut s).await?;
    }
    Ok(s)
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
