//! key_limits: what a limit per key (`WorkerBuilder::key_limit`) costs the
//! keys that are not at their limit, one hot key beside many cold ones (the
//! key in the header `k`). The runs and the figures are described once, in
//! docs/benchmark-streams.md ("key_limits").

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use pgmq_client::{Message, QueueName};
use pgmq_testkit::spec::KeyLimitSpec;
use pgmq_worker::Outcome;
use serde::{Deserialize, Serialize};

use crate::checks::Checks;
use crate::config::{pick, Apply, Config, Profile};
use crate::document::{
    Better, Document, Figure, LedgerReport, Rate, Runs, Sample, SectionRuns, Sections, TargetCheck,
};
use crate::error::Result;
use crate::figures::{check, measured, median_of, paired_ratios, Figures, RunKey};
use crate::kit::body::InBody;
use crate::kit::drain::timed;
use crate::kit::tally::Tally;
use crate::kit::worker::builder;
use crate::kit::Ctx;
use crate::report::workload_if;
use crate::report::{cell, definitions};
use crate::sections::plan::{self, Plan};
use crate::sections::{at_least, within, Options, Round, Rounds, Section};

/// The section's name, in the document and on the command line.
const NAME: &str = "key_limits";

/// The section's runs in the document.
const RUNS: Runs<KeyLimitsRun> = Runs::new(NAME);

/// The least cold-key throughput under a limit per key, over the same
/// worker's without one.
const COLD_FLOOR: f64 = 0.9;

/// The modes of a round, in the order they run.
const MODES: [&str; 3] = ["unlimited", "limited", "cold_only"];

/// The header holding each message's key.
const KEY_HEADER: &str = "k";

/// Every `HOT_EVERY`-th message is the hot key's.
const HOT_EVERY: u64 = 5;

/// Loads the messages at positions `$2..=$3` (1-based) of queue `$1`: a
/// hot message at every fifth position, its id `$4` (the cold messages'
/// count) plus its rank among the hot ones; a cold one's id its rank among
/// the cold ones, its key that rank modulo `$5`; bodies padded with `$6`.
const LOAD_SQL: &str = "SELECT count(*) FROM pgmq.send_batch($1::text, \
    ARRAY(SELECT jsonb_build_object('id', CASE WHEN g % 5 = 0 THEN $4::bigint + g / 5 - 1 \
                                          ELSE g - g / 5 - 1 END, 'pad', $6::text) \
          FROM generate_series($2::bigint, $3::bigint) AS g ORDER BY g), \
    ARRAY(SELECT jsonb_build_object('k', CASE WHEN g % 5 = 0 THEN 'hot' \
                                         ELSE 'c' || ((g - g / 5 - 1) % $5::bigint) END) \
          FROM generate_series($2::bigint, $3::bigint) AS g ORDER BY g), 0)";

/// Positions per load statement.
const LOAD_CHUNK: u64 = 5_000;

/// The key_limits options.
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
#[non_exhaustive]
pub struct KeyLimitsOptions {
    /// key_limits: messages per run (a fifth of them the hot key's).
    #[arg(long, default_value_t = 20_000)]
    pub key_limits_messages: u64,

    /// key_limits: cold keys.
    #[arg(long, default_value_t = 1_000)]
    pub key_limits_cold_keys: u64,

    /// key_limits: the limit's places per key.
    #[arg(long, default_value_t = 1)]
    pub key_limits_places: u32,

    /// key_limits: simulated I/O per handler call, milliseconds.
    #[arg(long, default_value_t = 1)]
    pub key_limits_work_ms: u64,
}

impl KeyLimitsOptions {
    /// The cold keys' messages of a run.
    fn cold(&self) -> u64 {
        self.key_limits_messages - self.key_limits_messages / HOT_EVERY
    }

    /// One handler call's work.
    fn work(&self) -> Duration {
        Duration::from_millis(self.key_limits_work_ms)
    }
}

impl Options for KeyLimitsOptions {
    fn check(&self) -> Result<()> {
        at_least(self.key_limits_messages, HOT_EVERY, "--key-limits-messages")?;
        within(self.key_limits_cold_keys, 1..=1_000_000, "--key-limits-cold-keys")?;
        within(self.key_limits_places, 1..=1024, "--key-limits-places")?;
        Ok(())
    }

    fn apply_profile(&mut self, p: &Apply<'_>) {
        match p.profile {
            Profile::Quick | Profile::Default => pick!(p, self.key_limits_messages, 20_000, 5_000),
            Profile::Standard | Profile::Full | Profile::Long => {}
        }
    }
}

/// One run: the worker draining the cold keys beside the hot one, with or
/// without a limit per key.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct KeyLimitsRun {
    /// Round.
    pub round: u32,
    /// Warm-up or measured.
    pub warmup: bool,
    /// `unlimited`, `limited` or `cold_only`.
    pub mode: String,
    /// Messages in the queue at the start.
    pub messages: u64,
    /// Cold keys.
    pub cold_keys: u64,
    /// The limit's places per key (none: no limit).
    #[serde(default)]
    pub places: Option<u32>,
    /// Handlers of the worker.
    pub workers: u32,
    /// Simulated I/O per handler call, milliseconds.
    pub work_ms: u64,
    /// Cold messages handled over the seconds to the last one's end.
    pub cold: Rate,
    /// The hot key's messages handled meanwhile.
    pub hot_handled: u64,
    /// Every cold message handled once?
    pub ledger: LedgerReport,
}

/// Loads a run's messages into `q` (see [`LOAD_SQL`]).
async fn load(ctx: &Ctx, q: &QueueName, c: &KeyLimitsOptions) -> Result<()> {
    let cold = c.cold() as i64;
    let mut first = 1u64;
    while first <= c.key_limits_messages {
        let last = (first + LOAD_CHUNK - 1).min(c.key_limits_messages);
        ctx.admin
            .query_one(
                LOAD_SQL,
                &[
                    &q.as_str(),
                    &(first as i64),
                    &(last as i64),
                    &cold,
                    &(c.key_limits_cold_keys as i64),
                    &ctx.pad,
                ],
            )
            .await?;
        first = last + 1;
    }
    Ok(())
}

/// One run of `mode` on a fresh queue.
async fn run(ctx: &Arc<Ctx>, mode: &str, round: u32, warmup: bool) -> Result<KeyLimitsRun> {
    let o = &ctx.cfg.options.key_limits;
    let workers = ctx.cfg.backlog_workers;
    let (q, _, _) = ctx.fresh_loaded(NAME, 0).await?;
    load(ctx, &q, o).await?;
    if mode == "cold_only" {
        // `QueueName` admits only [a-z0-9_], so the table name is a plain identifier.
        let sql = format!("DELETE FROM {} WHERE headers ->> '{KEY_HEADER}' = 'hot'", q.table());
        ctx.admin.execute(&sql, &[]).await?;
    }
    ctx.vacuum(&q).await?;
    let mut spec = ctx.worker_spec(&q, workers);
    let places = (mode == "limited").then_some(o.key_limits_places);
    spec.settings.key_limit = places.map(|max_running| KeyLimitSpec {
        header: KEY_HEADER.to_owned(),
        max_running,
    });
    let tally = Tally::new(o.cold(), o.work());
    let hot = Arc::new(AtomicU64::new(0));
    let (t, h, work) = (Arc::clone(&tally), Arc::clone(&hot), o.work());
    let w = builder(ctx.client.clone(), &spec)?
        .handler(move |msg: Message<InBody>| {
            let (t, h) = (Arc::clone(&t), Arc::clone(&h));
            async move {
                let is_hot = msg
                    .headers
                    .as_ref()
                    .and_then(|v| v.get(KEY_HEADER))
                    .is_some_and(|k| k == "hot");
                if is_hot {
                    tokio::time::sleep(work).await;
                    h.fetch_add(1, Ordering::Relaxed);
                } else {
                    t.handle(msg.body.id).await;
                }
                Ok(Outcome::Delete)
            }
        })
        .build()?;
    let d = timed(ctx, w, &tally).await?;
    ctx.finish_queue(&q).await?;
    Ok(KeyLimitsRun {
        round,
        warmup,
        mode: mode.to_owned(),
        messages: o.key_limits_messages,
        cold_keys: o.key_limits_cold_keys,
        places,
        workers,
        work_ms: o.key_limits_work_ms,
        cold: Rate::new(tally.distinct(), d.elapsed_s),
        hot_handled: hot.load(Ordering::Relaxed),
        ledger: tally.ledger.report(o.cold()),
    })
}

/// The key_limits section.
pub(crate) struct KeyLimits;

impl Section for KeyLimits {
    fn runs(&self) -> &dyn SectionRuns {
        &RUNS
    }

    fn about(&self) -> &'static str {
        "One hot key at its limit beside many cold keys: the cold keys' throughput under a limit per key"
    }

    fn planned(&self, cfg: &Config) -> Plan {
        let o = &cfg.options.key_limits;
        let runs = MODES.len() as f64;
        Plan::work(runs * (plan::SETUP + 2.0 * plan::drain(o.key_limits_messages, plan::DRAIN)))
    }

    /// Every cold message handled once (the hot key's backlog is left).
    fn check(&self, s: &Sections, out: &mut Checks) {
        out.each(&RUNS, s, |r| (r.mode.clone(), r.round, r.warmup), |out, tag, r| {
            out.short_run(tag, r.cold.elapsed_s);
            if r.ledger.missing > 0 {
                out.fail(format!(
                    "{tag}: {} of {} cold messages never handled",
                    r.ledger.missing, r.ledger.expected
                ));
            }
            out.ledger(tag, &r.ledger);
        });
    }

    fn figures(&self, s: &Sections, f: &mut Figures) {
        add_figures(f, &RUNS.list(s));
    }

    fn report(&self, d: &Document, out: &mut String) {
        let Some(w) = workload_if::<KeyLimitsOptions>(d, COLD_RATIO) else {
            return;
        };
        let _ = writeln!(
            out,
            "## Limits per key\n\n{} messages per run, a fifth of them one hot key's, the rest over {} cold keys; \
             {} place(s) per key; {} ms of simulated I/O per call.\n\n\
             | | Cold keys' msg/s |\n| --- | --- |\n\
             | without a limit per key | {} |\n| under a limit per key | {} (÷ without: {}; ÷ cold keys alone: {}) |\n\
             | the cold keys alone, without a limit | {} |\n",
            w.key_limits_messages,
            w.key_limits_cold_keys,
            w.key_limits_places,
            w.key_limits_work_ms,
            cell(d, "key_limits.unlimited.cold_throughput"),
            cell(d, "key_limits.limited.cold_throughput"),
            cell(d, COLD_RATIO),
            cell(d, ALONE_RATIO),
            cell(d, "key_limits.cold_only.cold_throughput"),
        );
        definitions(
            out,
            d,
            &[
                "key_limits.limited.cold_throughput".into(),
                COLD_RATIO.into(),
                ALONE_RATIO.into(),
            ],
        );
    }

    fn targets(&self, figures: &[Figure]) -> Vec<TargetCheck> {
        vec![check(
            "key_limits_cold",
            "Limits per key: beside one hot key at its limit, the cold keys keep at least 0.9 of their throughput without a limit per key",
            median_of(figures, COLD_RATIO),
            COLD_FLOOR,
            "x",
            |v| v >= COLD_FLOOR,
            Ok(()),
            "the median, over rounds, of the limited run's cold-key throughput over the unlimited run's",
        )]
    }
}

impl Rounds for KeyLimits {
    /// One round: the unlimited run, the limited one, the cold keys alone.
    async fn run_round(&self, ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
        ctx.client.install_sdk_schema().await?;
        for mode in MODES {
            let r = run(ctx, mode, at.index, at.warm).await?;
            ctx.progress.say(format!(
                "{} {NAME} {mode}: cold keys {:.0} msg/s, {} of the hot key's handled meanwhile",
                at.tag, r.cold.rate_per_s, r.hot_handled
            ));
            RUNS.record(s, &r)?;
        }
        Ok(())
    }
}

const DEF_COLD: &str = "Cold messages handled over the seconds from the worker's start to the end \
    of the last cold message's handler.";

const DEF_RATIO: &str = "The limited run's cold-key throughput over the unlimited run's in the \
    same round: what a limit per key costs the keys not at their limit.";

const DEF_ALONE: &str = "The limited run's cold-key throughput over the cold_only run's (the \
    cold keys' messages alone, no limit) in the same round: the claim path's cost with nothing \
    of the hot key's in the way.";

/// The id of the limited ÷ cold_only ratio.
const ALONE_RATIO: &str = "key_limits.limited.vs_cold_only";

/// The id of the limited ÷ unlimited ratio.
const COLD_RATIO: &str = "key_limits.limited.vs_unlimited";

fn add_figures(f: &mut Figures, runs: &[KeyLimitsRun]) {
    for mode in MODES {
        f.add(
            format!("{NAME}.{mode}.cold_throughput"),
            NAME,
            format!("Cold keys' throughput, {mode}"),
            "msg/s",
            Better::Higher,
            DEF_COLD,
            measured(runs, |r| r.warmup)
                .filter(|r| r.mode == mode)
                .map(|r| Sample::rate(r.round, &r.cold))
                .collect(),
        );
    }
    let key: RunKey<KeyLimitsRun> = |r| (r.round, r.warmup, r.mode.as_str(), r.cold.rate_per_s);
    f.add(
        COLD_RATIO.into(),
        NAME,
        "Cold keys, limited ÷ unlimited".into(),
        "x",
        Better::Higher,
        DEF_RATIO,
        paired_ratios(runs, key, "limited", "unlimited"),
    );
    f.add(
        ALONE_RATIO.into(),
        NAME,
        "Cold keys, limited ÷ cold keys alone".into(),
        "x",
        Better::Higher,
        DEF_ALONE,
        paired_ratios(runs, key, "limited", "cold_only"),
    );
}
