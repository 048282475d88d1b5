//! send_batch_keyed: the cost of deduplication keys, keyed sends against
//! plain ones, batched and one per call. The runs, their order and the key
//! table's check are described once, in docs/benchmark-sections.md ("send_batch_keyed").

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::checks::Checks;
use crate::document::{Runs, SectionRuns, Better, Document, Rate, Sections};
use crate::error::Result;
use crate::figures::{measured, paired_ratios, Figures, RunKey};
use crate::report::{cell, definitions, fig};
use crate::kit::body::id_batches;
use crate::kit::Ctx;
use crate::sections::{Round, Rounds, Section};
use crate::config::Config;
use crate::sections::plan::{self, Plan};

/// The section's name, in the document and on the command line.
const NAME: &str = "send_batch_keyed";

/// The section\'s runs in the document.
const RUNS: Runs<KeyedSendRun> = Runs::new(NAME);

/// The ways of sending, in the order of an even round: each keyed mode
/// right after the plain one it is compared with.
const MODES: [&str; 4] = ["plain", "keyed", "single_plain", "single_keyed"];

/// The keyed modes and the plain mode each is compared with.
const PAIRS: [(&str, &str); 2] = [("keyed", "plain"), ("single_keyed", "single_plain")];

/// Whether `mode` sends one message per call.
fn is_single(mode: &str) -> bool {
    mode.starts_with("single_")
}

/// Whether `mode` sends under deduplication keys.
fn is_keyed(mode: &str) -> bool {
    mode.ends_with("keyed")
}

/// How long each key holds: longer than any run.
const WINDOW: Duration = Duration::from_secs(3600);

/// One run: `--batch-messages` sent in batches one way.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct KeyedSendRun {
    /// Round.
    pub round: u32,
    /// Warm-up or measured.
    pub warmup: bool,
    /// `plain` (`send_batch`), `keyed` (`send_batch_keyed`), `single_plain`
    /// (`send`) or `single_keyed` (`send_keyed`).
    pub mode: String,
    /// Messages per call (1 for the single modes).
    pub batch_size: u32,
    /// Messages sent over the seconds from the first call to the last reply.
    pub rate: Rate,
    /// Messages a keyed send answered as duplicates (must be 0: every key
    /// is fresh); 0 for the plain modes.
    pub duplicates: u64,
    /// Messages in the queue after the run (must be the count sent).
    pub in_queue_after: i64,
    /// The run's keys in `pgmq_sdk.queue_keys` after it (must be the count
    /// sent for the keyed modes, 0 for the plain ones).
    pub keys_after: i64,
    /// Peak RSS of the bench process during the run.
    pub peak_rss_bytes: u64,
}


/// The key of message `i`.
fn key_of(i: u64) -> String {
    format!("m{i}")
}

/// One run of `mode` into a fresh queue.
async fn run(ctx: &Ctx, mode: &str, round: u32, warmup: bool) -> Result<KeyedSendRun> {
    let q = ctx.guard.fresh(NAME).await?;
    let (n, size) = if is_single(mode) {
        (ctx.cfg.single_messages, 1)
    } else {
        (ctx.cfg.batch_messages, u64::from(ctx.cfg.batch_size))
    };
    let opts = pgmq_client::SendOptions::new();
    let mut bodies = Vec::with_capacity(size as usize);
    let mut keys: Vec<String> = Vec::with_capacity(size as usize);
    let mut duplicates = 0u64;
    ctx.meter.begin();
    let t = Instant::now();
    for ids in id_batches(n, size) {
        bodies.clear();
        bodies.extend(ids.clone().map(|i| ctx.body(i)));
        match mode {
            "keyed" => {
                keys.clear();
                keys.extend(ids.map(key_of));
                let sent = ctx
                    .client
                    .send_batch_keyed(&q, &keys, WINDOW, &bodies, &opts)
                    .await?;
                duplicates += sent.iter().filter(|s| s.duplicate).count() as u64;
            }
            "single_keyed" => {
                let key = pgmq_client::DedupKey::new(key_of(ids.start), WINDOW);
                let sent = ctx.client.send_keyed(&q, &key, &bodies[0]).await?;
                duplicates += u64::from(sent.duplicate);
            }
            "single_plain" => {
                ctx.client.send(&q, &bodies[0]).await?;
            }
            _ => {
                ctx.client.send_batch(&q, &bodies).await?;
            }
        }
    }
    let rate = Rate::new(n, t.elapsed().as_secs_f64());
    let peak_rss_bytes = ctx.meter.end();
    let name = q.as_str();
    let keys_after: i64 = ctx
        .admin
        .query_one(
            "SELECT count(*) FROM pgmq_sdk.queue_keys WHERE queue_relid = pgmq_sdk.queue_table($1)",
            &[&name],
        )
        .await?
        .get(0);
    ctx.admin
        .execute(
            "DELETE FROM pgmq_sdk.queue_keys WHERE queue_relid = pgmq_sdk.queue_table($1)",
            &[&name],
        )
        .await?;
    Ok(KeyedSendRun {
        round,
        warmup,
        mode: mode.to_owned(),
        batch_size: size as u32,
        rate,
        duplicates,
        in_queue_after: ctx.finish_queue(&q).await?,
        keys_after,
        peak_rss_bytes,
    })
}

/// The send_batch_keyed section (see the module docs).
pub(crate) struct SendBatchKeyed;

const DEF_RATE: &str = "--batch-messages sent in calls of --batch-size, each awaited before the \
    next, into a fresh queue: messages ÷ seconds from the first call to the last reply. plain: \
    Client::send_batch; keyed: Client::send_batch_keyed, every message under a fresh key \
    (window 1 h), its key row written in the send's transaction.";

const DEF_RATIO: &str = "keyed throughput ÷ plain throughput of the same round: what keys cost \
    a batch send (1: nothing).";

const DEF_SINGLE_RATE: &str = "--single-messages sent one per call, each awaited before the \
    next, into a fresh queue: messages ÷ seconds from the first call to the last reply. \
    single_plain: Client::send; single_keyed: Client::send_keyed, every message under a fresh \
    key (window 1 h), its key row written in the send's transaction.";

const DEF_SINGLE_RATIO: &str = "single_keyed throughput ÷ single_plain throughput of the same \
    round: what a key costs a single send (1: nothing).";

impl Rounds for SendBatchKeyed {
    /// Both modes, their order swapped every other round.
    async fn run_round(&self, ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
        ctx.client.install_sdk_schema().await?;
        let mut modes = MODES;
        if at.index % 2 == 1 {
            modes.reverse();
        }
        for mode in modes {
            let r = run(ctx, mode, at.index, at.warm).await?;
            ctx.progress.say(format!(
                "{} {NAME} {mode}: {:.0} msg/s",
                at.tag, r.rate.rate_per_s
            ));
            RUNS.record(s, &r)?;
        }
        Ok(())
    }
}

impl Section for SendBatchKeyed {
    fn runs(&self) -> &dyn SectionRuns {
        &RUNS
    }

    fn about(&self) -> &'static str {
        "Batch and single sends with deduplication keys against the same sends without"
    }

    fn planned(&self, cfg: &Config) -> Plan {
        // A keyed run takes at most about as long as three plain ones.
        let n = cfg.batch_messages as f64;
        let single = cfg.single_messages as f64;
        Plan::work(
            4.0 * plan::SETUP + 4.0 * n / plan::BATCH_SENDS + 4.0 * single / plan::SINGLE_SENDS,
        )
    }

    fn in_warmup(&self) -> bool {
        true
    }

    fn check(&self, s: &Sections, out: &mut Checks) {
        out.each(&RUNS, s, |r| (r.mode.clone(), r.round, r.warmup), |out, tag, r| {
            out.short_run(tag, r.rate.elapsed_s);
            let sent = r.rate.count as i64;
            let keys = if is_keyed(&r.mode) { sent } else { 0 };
            if r.in_queue_after != sent || r.keys_after != keys || r.duplicates != 0 {
                out.fail(format!(
                    "{tag}: sent {sent} but the queue holds {}, the key table {} of its keys \
                     (expected {keys}), {} answered as duplicates",
                    r.in_queue_after, r.keys_after, r.duplicates
                ));
            }
        });
    }

    fn figures(&self, s: &Sections, f: &mut Figures) {
        let Ok(runs) = RUNS.of(s) else {
            return;
        };
        for mode in MODES {
            let (label, def) = if is_single(mode) {
                ("Single send", DEF_SINGLE_RATE)
            } else {
                ("Batch send", DEF_RATE)
            };
            f.rate(
                &format!("{NAME}.{mode}.rate"),
                NAME,
                &format!("{label}, {mode}"),
                def,
                measured(&runs, |r| r.warmup)
                    .filter(|r| r.mode == mode)
                    .map(|r| (r.round, &r.rate)),
            );
        }
        let key: RunKey<KeyedSendRun> =
            |r| (r.round, r.warmup, r.mode.as_str(), r.rate.rate_per_s);
        for (mode, base) in PAIRS {
            let def = if is_single(mode) { DEF_SINGLE_RATIO } else { DEF_RATIO };
            f.add(
                format!("{NAME}.{mode}_vs_plain"),
                NAME,
                format!("{mode} ÷ {base}"),
                "x",
                Better::Higher,
                def,
                paired_ratios(&runs, key, mode, base),
            );
        }
    }

    fn report(&self, d: &Document, out: &mut String) {
        let ids: Vec<String> = [
            "plain.rate",
            "keyed.rate",
            "keyed_vs_plain",
            "single_plain.rate",
            "single_keyed.rate",
            "single_keyed_vs_plain",
        ]
        .iter()
        .map(|w| format!("{NAME}.{w}"))
        .collect();
        if fig(d, &ids[2]).is_none() {
            return;
        }
        out.push_str(
            "## Keyed sends (send_batch_keyed)\n\n\
             | calls | plain (msg/s) | keyed (msg/s) | keyed ÷ plain |\n\
             | --- | --- | --- | --- |\n",
        );
        for (calls, row) in [("batch", &ids[..3]), ("single", &ids[3..])] {
            let _ = writeln!(
                out,
                "| {calls} | {} | {} | {} |",
                cell(d, &row[0]),
                cell(d, &row[1]),
                cell(d, &row[2])
            );
        }
        out.push('\n');
        definitions(out, d, &ids);
    }
}
