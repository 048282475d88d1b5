//! wakeup_latency: how long one message sent to an idle worker takes to reach
//! its handler, polling only and with LISTEN/NOTIFY. What one sample
//! includes and how the sends are spread over the poll timer are described
//! once, in docs/benchmark-streams.md ("wakeup_latency").

use std::time::{Duration, Instant};

use clap::Args;
use pgmq_client::Message;
use serde::{Deserialize, Serialize};
use pgmq_testkit::spec::WakeUpSpec;
use pgmq_worker::{Outcome, Worker};
use tokio::sync::mpsc;

use crate::document::{Percentiles, Runs, SectionRuns, WorkerCounters};
use crate::error::{Error, Result};
use crate::kit::body::InBody;
use crate::kit::worker::{builder, counters};
use crate::kit::Ctx;
use crate::stats::percentiles_of;
use std::fmt::Write as _;


use crate::document::{Document, Sections};
use crate::figures::{measured, Figures};
use crate::report::{cell, definitions, fig};
use crate::sections::{at_least, Options, Round, Rounds, Section};
use crate::config::Config;
use crate::sections::plan::{self, Plan};
use std::sync::Arc;

/// The section's runs in the document.
pub(crate) const RUNS: Runs<WakeupRun> = Runs::new("wakeup_latency");

/// A wake-up latency run of one mode.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct WakeupRun {
    /// Round.
    pub round: u32,
    /// Warm-up or measured.
    pub warmup: bool,
    /// `poll` (polling only) or `notify` (LISTEN/NOTIFY with polling fallback).
    pub mode: String,
    /// Poll interval (the fallback for `notify`), milliseconds.
    pub poll_interval_ms: u64,
    /// For `notify`: the queue's PGMQ notify throttle, milliseconds; samples
    /// are spaced further apart than this.
    pub notify_throttle_ms: Option<i64>,
    /// Each sample: send call start to handler start, milliseconds.
    pub samples_ms: Vec<f64>,
    /// Their distribution.
    pub latency_ms: Percentiles,
    /// Worker counters over the run.
    pub worker: WorkerCounters,
    /// Peak RSS during the run, bytes.
    pub peak_rss_bytes: u64,
}

/// The fewest wake-up samples per mode.
pub(crate) const MIN_WAKEUP_SAMPLES: u32 = 20;

/// The wakeup_latency options.
#[derive(Debug, Clone, Args, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct WakeupOptions {
    /// wakeup_latency samples per mode (at least 20).
    #[arg(long, default_value_t = 20)]
    pub wakeup_samples: u32,

    /// wakeup_latency poll interval, and the NOTIFY mode's polling fallback, milliseconds.
    #[arg(long, default_value_t = 500)]
    pub wakeup_poll_ms: u64,
}

impl WakeupOptions {
    /// The poll interval (and the NOTIFY mode's fallback).
    pub fn poll(&self) -> Duration {
        Duration::from_millis(self.wakeup_poll_ms)
    }
}

impl Options for WakeupOptions {
    fn check(&self) -> Result<()> {
        at_least(self.wakeup_samples, MIN_WAKEUP_SAMPLES, "--wakeup-samples")?;
        at_least(self.wakeup_poll_ms, 1, "--wakeup-poll-ms")?;
        Ok(())
    }
}

/// Polling only, or LISTEN/NOTIFY.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `WakeUp::Poll`.
    Poll,
    /// `WakeUp::Notify`.
    Notify,
}

impl Mode {
    /// The name in the document.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Poll => "poll",
            Mode::Notify => "notify",
        }
    }
}

/// A small xorshift generator: reproducible sample phases without a dependency.
struct Phases(u64);

impl Phases {
    fn next_fraction(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Waits for the handler to start on `id`; `None` after `limit`.
async fn wait_for(
    rx: &mut mpsc::UnboundedReceiver<(u64, Instant)>,
    id: u64,
    limit: Duration,
) -> Option<Instant> {
    let fut = async {
        while let Some((got, at)) = rx.recv().await {
            if got == id {
                return Some(at);
            }
        }
        None
    };
    tokio::time::timeout(limit, fut).await.ok().flatten()
}

/// The id of the unmeasured first message.
const SETTLE_ID: u64 = u64::MAX >> 1;

/// One run of one mode.
pub async fn run(ctx: &Ctx, mode: Mode, round: u32, warmup: bool) -> Result<WakeupRun> {
    let q = ctx.guard.fresh(&format!("wakeup_{}", mode.name())).await?;
    let poll = ctx.cfg.options.wakeup.poll();
    let (tx, mut rx) = mpsc::unbounded_channel::<(u64, Instant)>();
    let w = build_worker(ctx, &q, mode, tx)?;
    ctx.meter.begin();
    let handle = w.spawn();
    let limit = poll * 4 + Duration::from_secs(10);
    ctx.client.send(&q, &ctx.body(SETTLE_ID)).await?;
    let settled = wait_for(&mut rx, SETTLE_ID, limit).await;
    if settled.is_none() {
        return abandon(ctx, handle, &q, mode, "the first message", limit).await;
    }
    let throttle_ms = notify_throttle_ms(ctx, &q, mode).await?;
    let min_gap = Duration::from_millis(100).max(Duration::from_millis(
        throttle_ms.unwrap_or(0).max(0) as u64 + 50,
    ));
    let pacing = Pacing {
        mode,
        poll,
        min_gap,
        limit,
        round,
    };
    let samples = match take_samples(ctx, &q, &mut rx, &pacing).await? {
        Ok(samples) => samples,
        Err(id) => return abandon(ctx, handle, &q, mode, &format!("sample {id}"), limit).await,
    };
    let report = handle.shutdown().await?;
    let peak = ctx.meter.end();
    ctx.guard.release(&q).await?;
    Ok(WakeupRun {
        round,
        warmup,
        mode: mode.name().to_owned(),
        poll_interval_ms: poll.as_millis() as u64,
        notify_throttle_ms: throttle_ms,
        latency_ms: percentiles_of(&samples).unwrap_or_default(),
        samples_ms: samples,
        worker: counters(&report.stats),
        peak_rss_bytes: peak,
    })
}

/// A worker of one handler on `q`, woken as `mode` says, whose handler
/// sends each message's id and the instant it started on it to `tx`.
fn build_worker(
    ctx: &Ctx,
    q: &pgmq_client::QueueName,
    mode: Mode,
    tx: mpsc::UnboundedSender<(u64, Instant)>,
) -> Result<Worker<InBody>> {
    let mut spec = ctx.worker_spec(q, 1);
    spec.settings.poll_interval_ms = Some(ctx.cfg.options.wakeup.wakeup_poll_ms);
    spec.settings.wake_up = Some(match mode {
        Mode::Poll => WakeUpSpec::Poll,
        Mode::Notify => WakeUpSpec::Notify,
    });
    let w = builder(ctx.client.clone(), &spec)?
        .handler(move |msg: Message<InBody>| {
            let started = Instant::now();
            let _ = tx.send((msg.body.id, started));
            async { Ok(Outcome::Delete) }
        })
        .build()?;
    Ok(w)
}

/// Stops the worker and drops the queue, then fails the run: `what` did not
/// reach the handler within `limit`.
async fn abandon<T>(
    ctx: &Ctx,
    handle: pgmq_worker::WorkerHandle,
    q: &pgmq_client::QueueName,
    mode: Mode,
    what: &str,
    limit: Duration,
) -> Result<T> {
    handle.shutdown().await?;
    ctx.guard.release(q).await?;
    Err(Error::Timeout(format!(
        "wakeup_latency ({}): {what} did not reach the handler within {limit:?}",
        mode.name()
    )))
}

/// With NOTIFY, the queue's notify throttle in milliseconds (None when
/// polling, or when the queue has none).
async fn notify_throttle_ms(
    ctx: &Ctx,
    q: &pgmq_client::QueueName,
    mode: Mode,
) -> Result<Option<i64>> {
    // PGMQ sends at most one notification per throttle window: samples are
    // spaced past it, so that each one measures a notification of its own.
    Ok(match mode {
        Mode::Poll => None,
        Mode::Notify => ctx
            .client
            .list_notify_insert_throttles()
            .await?
            .into_iter()
            .find(|t| t.queue_name == q.as_str())
            .map(|t| i64::from(t.throttle_interval_ms)),
    })
}

/// How the samples of one run are spaced.
struct Pacing {
    mode: Mode,
    /// The worker's poll interval.
    poll: Duration,
    /// The least time between two sends.
    min_gap: Duration,
    /// How long a message may take to reach the handler.
    limit: Duration,
    /// The round, which seeds the sample phases.
    round: u32,
}

/// Sends `--wakeup-samples` messages, each after a pseudo-random gap, and
/// measures each one's send-to-handler latency in milliseconds; `Err(id)`
/// when message `id` did not reach the handler within the limit.
async fn take_samples(
    ctx: &Ctx,
    q: &pgmq_client::QueueName,
    rx: &mut mpsc::UnboundedReceiver<(u64, Instant)>,
    p: &Pacing,
) -> Result<std::result::Result<Vec<f64>, u64>> {
    let mut phases = Phases(
        0x9E37_79B9_7F4A_7C15 ^ (u64::from(p.round) + 1).wrapping_mul(0x2545_F491_4F6C_DD1D),
    );
    let mut samples = Vec::with_capacity(ctx.cfg.options.wakeup.wakeup_samples as usize);
    for id in 0..u64::from(ctx.cfg.options.wakeup.wakeup_samples) {
        // Then a random phase: of the poll timer when polling; NOTIFY does
        // not wait for the timer.
        let spread = match p.mode {
            Mode::Poll => p.poll,
            Mode::Notify => p.poll.min(Duration::from_millis(100)),
        };
        let gap = p.min_gap + spread.mul_f64(phases.next_fraction());
        tokio::time::sleep(gap).await;
        let sent = Instant::now();
        ctx.client.send(q, &ctx.body(id)).await?;
        match wait_for(rx, id, p.limit).await {
            Some(at) => samples.push(at.duration_since(sent).as_secs_f64() * 1000.0),
            None => return Ok(Err(id)),
        }
    }
    Ok(Ok(samples))
}

/// The wakeup_latency section: send-to-handler latency, polling only and
/// with LISTEN/NOTIFY.
pub(crate) struct WakeupLatency;

impl Section for WakeupLatency {
    fn runs(&self) -> &dyn SectionRuns {
        &RUNS
    }

    fn about(&self) -> &'static str {
        "Send-to-handler latency, polling only and LISTEN/NOTIFY"
    }

    fn planned(&self, cfg: &Config) -> Plan {
        // Polling: a gap of at least 100 ms plus a random share of the
        // interval, then about half an interval's wait; NOTIFY: the
        // throttle's gap and a few milliseconds.
        let o = &cfg.options.wakeup;
        let samples = f64::from(o.wakeup_samples);
        Plan::fixed(samples * (0.1 + o.poll().as_secs_f64()) + samples * 0.35)
            + Plan::work(2.0 * plan::SETUP)
    }

    /// wakeup_latency: percentiles per mode.
    fn figures(&self, s: &Sections, f: &mut Figures) {
        for mode in ["poll", "notify"] {
            let label = if mode == "poll" {
                "Wake-up, polling only,"
            } else {
                "Wake-up, LISTEN/NOTIFY,"
            };
            f.percentiles(
                &format!("wakeup_latency.{mode}"),
                "wakeup_latency",
                label,
                DEF_WAKEUP,
                measured(&RUNS.list(s), |r| r.warmup)
                    .filter(|r| r.mode == mode)
                    .map(|r| (r.round, &r.latency_ms)),
            );
        }
    }

    /// wakeup_latency: send-to-handler latency, polling and NOTIFY.
    fn report(&self, d: &Document, out: &mut String) {
        if fig(d, "wakeup_latency.poll.p50_ms").is_none()
            && fig(d, "wakeup_latency.notify.p50_ms").is_none()
        {
            return;
        }
        let Ok(w) = d.metadata.workload.options_of::<WakeupOptions>() else {
            return;
        };
        let _ = writeln!(
            out,
            "## Wake-up latency\n\n{} samples per mode and round, poll interval (and NOTIFY fallback) {} ms.\n\n\
             | Mode | p50 (ms) | p95 (ms) | p99 (ms) | max (ms) |\n| --- | --- | --- | --- | --- |",
            w.wakeup_samples, w.wakeup_poll_ms
        );
        for (mode, label) in [("poll", "Polling only"), ("notify", "LISTEN/NOTIFY")] {
            let _ = writeln!(
                out,
                "| {label} | {} | {} | {} | {} |",
                cell(d, &format!("wakeup_latency.{mode}.p50_ms")),
                cell(d, &format!("wakeup_latency.{mode}.p95_ms")),
                cell(d, &format!("wakeup_latency.{mode}.p99_ms")),
                cell(d, &format!("wakeup_latency.{mode}.max_ms"))
            );
        }
        out.push('\n');
        definitions(out, d, &["wakeup_latency.poll.p50_ms".into()]);
    }
}

impl Rounds for WakeupLatency {
    /// One round of wakeup_latency: polling, then notifications.
    async fn run_round(&self, ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
        let tag = at.tag;
        for mode in [Mode::Poll, Mode::Notify] {
            let r = run(ctx, mode, at.index, at.warm).await?;
            ctx.progress.say(format!(
                "{tag} wakeup_latency {}: p50 {:.2} ms",
                r.mode, r.latency_ms.p50
            ));
            RUNS.record(s, &r)?;
        }
        Ok(())
    }
}

const DEF_WAKEUP: &str =
    "Send call start to handler start for one message sent to an idle worker, monotonic \
    clock; the figure is the percentile over one run's samples, median over runs.";

