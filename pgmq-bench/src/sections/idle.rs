//! idle_worker: a worker on an empty queue, polling only (`--idle-poll-ms`,
//! 250 ms by default), no notifications, for `--idle` (3 s by default).
//!
//! The window opens once the worker has run for two poll intervals (start-up
//! excluded). Over it: process CPU time from getrusage(2) (user + system, all
//! threads of this process, which holds nothing else at that moment) divided
//! by wall time, as percent of one core; the worker's own read, empty-read and
//! wake-up counters divided by the same wall time.

use std::time::{Duration, Instant};

use clap::Args;
use pgmq_testkit::spec::WakeUpSpec;
use serde::{Deserialize, Serialize};

use crate::document::{Rate, Runs, SectionRuns};
use crate::error::{Error, Result};
use crate::process::cpu_time;
use crate::kit::tally::Tally;
use crate::kit::worker::ms;
use crate::kit::Ctx;
use std::fmt::Write as _;


use crate::document::{Better, Document, Sample, Sections};
use crate::figures::{measured, Figures};
use crate::report::workload_if;
use crate::report::{cell, definitions};
use crate::sections::{at_least, Options, Round, Rounds, Section};
use crate::config::Config;
use crate::sections::plan::{self, Plan};
use std::sync::Arc;

/// The section's runs in the document.
pub(crate) const RUNS: Runs<IdleRun> = Runs::new("idle_worker");

/// An idle-worker run.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct IdleRun {
    /// Round.
    pub round: u32,
    /// Warm-up or measured.
    pub warmup: bool,
    /// Poll interval, milliseconds (notifications off).
    pub poll_interval_ms: u64,
    /// Wall-clock seconds of the window.
    pub elapsed_s: f64,
    /// Process CPU seconds (user + system, all threads) over the window.
    pub cpu_s: f64,
    /// `cpu_s / elapsed_s * 100`: percent of one core.
    pub cpu_percent: f64,
    /// `pgmq.read` calls over the window.
    pub reads: Rate,
    /// Reads that returned nothing.
    pub empty_reads: Rate,
    /// Claim-loop wake-ups (poll timer plus NOTIFY).
    pub wakeups: Rate,
    /// Peak RSS during the run, bytes.
    pub peak_rss_bytes: u64,
}

/// The idle_worker options.
#[derive(Debug, Clone, Args, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct IdleOptions {
    /// idle_worker window (in the workload: seconds).
    #[arg(long, default_value = "3s", value_parser = pgmq_testkit::parse_duration)]
    #[serde(rename = "idle_seconds", with = "crate::sections::secs")]
    #[schemars(rename = "idle_seconds", with = "f64")]
    pub idle: Duration,

    /// idle_worker poll interval, milliseconds.
    #[arg(long, default_value_t = 250)]
    pub idle_poll_ms: u64,
}

impl IdleOptions {
    /// The worker's poll interval.
    pub fn poll(&self) -> Duration {
        Duration::from_millis(self.idle_poll_ms)
    }
}

impl Options for IdleOptions {
    fn check(&self) -> Result<()> {
        if self.idle.is_zero() {
            return Err(Error::Config("--idle must be longer than zero".into()));
        }
        at_least(self.idle_poll_ms, 1, "--idle-poll-ms")?;
        Ok(())
    }
}

/// One idle run.
pub async fn run(ctx: &Ctx, round: u32, warmup: bool) -> Result<IdleRun> {
    let q = ctx.guard.fresh("idle").await?;
    let tally = Tally::new(u64::MAX, ctx.cfg.handler_work());
    let poll = ctx.cfg.options.idle.poll();
    let mut spec = ctx.worker_spec(&q, 1);
    spec.settings.poll_interval_ms = Some(ms(poll));
    spec.settings.wake_up = Some(WakeUpSpec::Poll);
    let w = ctx.worker(&spec, &tally)?;
    ctx.meter.begin();
    let handle = w.spawn();
    tokio::time::sleep(poll * 2).await;
    let s0 = handle.stats();
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    tokio::time::sleep(ctx.cfg.options.idle.idle).await;
    let s1 = handle.stats();
    let cpu1 = cpu_time();
    let elapsed = t0.elapsed().as_secs_f64();
    handle.shutdown().await?;
    let peak = ctx.meter.end();
    ctx.guard.release(&q).await?;
    let cpu_s = (cpu1.saturating_sub(cpu0)).as_secs_f64();
    let wakeups = (s1.wakeups_poll + s1.wakeups_notify) - (s0.wakeups_poll + s0.wakeups_notify);
    Ok(IdleRun {
        round,
        warmup,
        poll_interval_ms: poll.as_millis() as u64,
        elapsed_s: elapsed,
        cpu_s,
        cpu_percent: cpu_s / elapsed * 100.0,
        reads: Rate::new(s1.reads - s0.reads, elapsed),
        empty_reads: Rate::new(s1.empty_reads - s0.empty_reads, elapsed),
        wakeups: Rate::new(wakeups, elapsed),
        peak_rss_bytes: peak,
    })
}

/// The idle_worker section: a worker on an empty queue for `--idle`.
pub(crate) struct IdleWorker;

impl Section for IdleWorker {
    fn runs(&self) -> &dyn SectionRuns {
        &RUNS
    }

    fn about(&self) -> &'static str {
        "The worker with no work: CPU, empty reads, wake-ups"
    }

    fn planned(&self, cfg: &Config) -> Plan {
        let o = &cfg.options.idle;
        Plan::fixed((o.idle + o.poll() * 2).as_secs_f64()) + Plan::work(plan::SETUP)
    }

    /// idle_worker: CPU, empty reads and wake-ups.
    fn figures(&self, s: &Sections, f: &mut Figures) {
        let all = RUNS.list(s);
        let idle = || measured(&all, |r| r.warmup);
        f.add(
            "idle_worker.cpu_percent".into(),
            "idle_worker",
            "Idle process CPU".into(),
            "%",
            Better::Lower,
            DEF_IDLE_CPU,
            idle()
                .map(|r| Sample::value(r.round, r.cpu_percent))
                .collect(),
        );
        f.add(
            "idle_worker.empty_reads_per_s".into(),
            "idle_worker",
            "Idle empty reads".into(),
            "1/s",
            Better::None,
            DEF_IDLE_EMPTY,
            idle()
                .map(|r| Sample::rate(r.round, &r.empty_reads))
                .collect(),
        );
        f.add(
            "idle_worker.wakeups_per_s".into(),
            "idle_worker",
            "Idle wake-ups".into(),
            "1/s",
            Better::None,
            DEF_IDLE_WAKE,
            idle().map(|r| Sample::rate(r.round, &r.wakeups)).collect(),
        );
    }

    /// idle_worker: CPU, empty reads and wake-ups of a worker with no work.
    fn report(&self, d: &Document, out: &mut String) {
        let Some(w) = workload_if::<IdleOptions>(d, "idle_worker.cpu_percent") else {
            return;
        };
        let _ = writeln!(
            out,
            "## Idle worker\n\n{} s window, {} ms polling, notifications off.\n\n\
             | Process CPU (% of one core) | Empty reads/s | Wake-ups/s |\n| --- | --- | --- |\n| {} | {} | {} |\n",
            w.idle.as_secs_f64(),
            w.idle_poll_ms,
            cell(d, "idle_worker.cpu_percent"),
            cell(d, "idle_worker.empty_reads_per_s"),
            cell(d, "idle_worker.wakeups_per_s")
        );
        definitions(
            out,
            d,
            &[
                "idle_worker.cpu_percent".into(),
                "idle_worker.empty_reads_per_s".into(),
                "idle_worker.wakeups_per_s".into(),
            ],
        );
    }
}

impl Rounds for IdleWorker {
    /// One round of idle_worker.
    async fn run_round(&self, ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
        let tag = at.tag;
        let r = run(ctx, at.index, at.warm).await?;
        ctx.progress.say(format!(
            "{tag} idle_worker: {:.2}% CPU, {:.1} empty reads/s",
            r.cpu_percent, r.empty_reads.rate_per_s
        ));
        RUNS.record(s, &r)?;
        Ok(())
    }
}

const DEF_IDLE_CPU: &str =
    "Process CPU time (getrusage: user + system, all threads) over the idle window \
    divided by its wall time, in percent of one core; several busy threads could exceed 100.";

const DEF_IDLE_EMPTY: &str =
    "pgmq.read calls that returned nothing, per second of the idle window (worker counter).";

const DEF_IDLE_WAKE: &str =
    "Claim-loop wake-ups (poll timer plus NOTIFY) per second of the idle window.";

