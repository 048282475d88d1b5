//! baseline: the same loops with no SDK (`send_single`, `send_batch`,
//! `consume` and `consume_equal_layout`, in [`crate::kit::plain`]), the
//! reference of the SDK figures' ratios (`worker / equal-layout` is the
//! SDK's own overhead at the same parallelism). Described once, in docs/benchmark-sections.md
//! ("baseline").

use crate::document::{BaselineRun, Rate, Runs, SectionRuns, BASELINE_RUNS as RUNS};
use crate::error::Result;
use crate::kit::plain::{baseline_once, Loop};
use crate::kit::Ctx;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;


use crate::checks::Checks;
use crate::config::Config;
use crate::document::{Better, Document, Sample, Sections};
use crate::figures::{measured, Figures};
use crate::report::{cell, definitions, fig, worker_counts};
use crate::sections::{Round, Rounds, Section};
use crate::sections::plan::{self, Plan};

/// The baseline section: the loops on plain prepared statements. Beside an
/// SDK section its loop runs next to each SDK run (see `kit::plain::neighbour`);
/// alone, a round runs every loop once.
pub(crate) struct Baseline;

impl Rounds for Baseline {
    /// Each of the round's loops once (none beside an SDK section).
    async fn run_round(&self, ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
        for l in baseline_loops(&ctx.cfg) {
            baseline_once(ctx, l, at, s).await?;
        }
        Ok(())
    }
}

impl Section for Baseline {
    fn runs(&self) -> &dyn SectionRuns {
        &RUNS
    }

    fn about(&self) -> &'static str {
        "The same loops on plain prepared statements, one connection, no SDK"
    }

    fn planned(&self, cfg: &Config) -> Plan {
        // Beside an SDK section its runs are that section's; alone, a round
        // runs each loop once.
        if baseline_loops(cfg).is_empty() {
            return Plan::default();
        }
        Plan::work(
            plan::SETUP * 2.0
                + cfg.single_messages as f64 / plan::SINGLE_SENDS
                + cfg.batch_messages as f64 / plan::BATCH_SENDS
                + plan::drain(cfg.messages, plan::LOOP_DRAIN)
                + plan::drain(cfg.messages, plan::DRAIN),
        )
    }

    fn in_warmup(&self) -> bool {
        true
    }

    /// Short runs; a consuming loop's ledger and empty queue, a sending
    /// loop's messages all in the queue.
    fn check(&self, s: &Sections, out: &mut Checks) {
        out.each(&RUNS, s, |r| (r.kind.clone(), r.round, r.warmup), |out, tag, r| {
            out.short_run(tag, r.rate.elapsed_s);
            if let Some(l) = &r.ledger {
                if l.missing > 0 {
                    out.fail(format!("{tag}: {} messages never handled", l.missing));
                }
                out.ledger(tag, l);
                if r.in_queue_after != 0 {
                    out.fail(format!(
                        "{tag}: {} messages left in the queue",
                        r.in_queue_after
                    ));
                }
            } else if r.in_queue_after != r.rate.count as i64 {
                out.fail(format!(
                    "{tag}: sent {} but the queue holds {}",
                    r.rate.count, r.in_queue_after
                ));
            }
        });
    }

    /// The loops' rates, then the SDK sections' ratios to them.
    fn figures(&self, s: &Sections, f: &mut Figures) {
        baselines(f, s);
        ratios(f, s, &consume_counts(s));
    }


    /// The worker against the equal-layout loop (the loops' other figures
    /// are in the send and consume tables).
    fn report(&self, d: &Document, out: &mut String) {
        equal_layout_table(out, d);
    }
}

/// The baseline loops the `baseline` slot of a round runs: all three when
/// only `baseline` is selected. Beside an SDK section, its loop runs next to
/// it instead (see `kit::plain::neighbour`).
fn baseline_loops(cfg: &Config) -> Vec<Loop> {
    let sdk = ["send_single", "send_batch", "consume_scaling"];
    if sdk.iter().any(|s| cfg.has(s)) {
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

const DEF_RATIO: &str =
    "SDK figure divided by the baseline loop's figure (plain prepared statements on one \
    connection, no SDK) of the same round: the mean of the loop runs made just before and just after \
    the SDK run when both sections run (for the worker, those around that worker run): \
    above 1 the SDK is faster than the hand-written loop.";

const DEF_BASE_SINGLE: &str =
    "No SDK: SELECT * FROM pgmq.send($1, $2) prepared once, one connection, one \
    call at a time: messages divided by the seconds from the first call to the last reply.";

const DEF_BASE_BATCH: &str =
    "No SDK: SELECT * FROM pgmq.send_batch($1, $2::jsonb[]) prepared once, one \
    connection, one call at a time.";

const DEF_BASE_CONSUME: &str = "No SDK: pgmq.read($1, $2, $3) then pgmq.delete($1, $2::bigint[]) per batch, \
    prepared once, one connection, on a preloaded, vacuumed queue of the same size: messages divided by the \
    seconds from the first read to the last delete's reply. Run beside consume_scaling, once before each \
    worker run; a round's figure is then all its runs' messages over all their seconds.";

const DEF_BASE_EQUAL: &str = "No SDK, the worker's connection layout: two connections each looping \
    pgmq.read($1, $2, $3) of --batch-size and handing the ids to a third that deletes whatever has arrived with \
    one pgmq.delete($1, $2::bigint[]) at a time; plain tokio-postgres prepared statements, a preloaded, vacuumed \
    queue of the same size: messages divided by the seconds from the first read to the last delete's reply. \
    Run once before the first worker run of a round and once after the last.";

const DEF_RATIO_EQUAL: &str = "Worker throughput divided by the mean of the round's equal-layout loop runs \
    (same connections: two claiming, one deleting; no SDK): the SDK's own overhead at equal parallelism, \
    below 1 a cost, above 1 a gain.";

/// The measured baseline runs of one loop.
fn baseline_runs(s: &Sections, kind: &'static str) -> Vec<BaselineRun> {
    measured(&RUNS.list(s), |r| r.warmup)
        .filter(|r| r.kind == kind)
        .cloned()
        .collect()
}

/// The baseline loops: one rate per loop and round.
fn baselines(f: &mut Figures, s: &Sections) {
    let base = |kind: &'static str| baseline_runs(s, kind);
    // One value per round: a round with several runs of a loop (the
    // consume loop beside each worker run) counts their messages over their
    // seconds together.
    for (kind, label, def) in [
        ("send_single", "Baseline single send", DEF_BASE_SINGLE),
        ("send_batch", "Baseline batch send", DEF_BASE_BATCH),
        ("consume", "Baseline read + delete", DEF_BASE_CONSUME),
        (
            "consume_equal_layout",
            "Equal-layout read + delete (2 claim, 1 delete connection)",
            DEF_BASE_EQUAL,
        ),
    ] {
        let mut per_round: BTreeMap<u32, (u64, f64)> = BTreeMap::new();
        for r in base(kind) {
            let e = per_round.entry(r.round).or_default();
            e.0 += r.rate.count;
            e.1 += r.rate.elapsed_s;
        }
        let rates: Vec<(u32, Rate)> = per_round
            .into_iter()
            .map(|(round, (count, secs))| (round, Rate::new(count, secs)))
            .collect();
        f.rate(
            &format!("baseline.{kind}.rate"),
            "baseline",
            label,
            def,
            rates.iter().map(|(round, rate)| (*round, rate)),
        );
    }
}

/// What the ratios read of an SDK section's run, found by the section's
/// name: its round and rate, and a consume run's handler count.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct SdkRun {
    round: u32,
    warmup: bool,
    #[serde(default)]
    workers: u32,
    #[serde(flatten)]
    rate: Rate,
}

const SDK_SINGLE: Runs<SdkRun> = Runs::new("send_single");
const SDK_BATCH: Runs<SdkRun> = Runs::new("send_batch");
const SDK_CONSUME: Runs<SdkRun> = Runs::new("consume_scaling");

/// The handler counts of the consume_scaling runs, ascending.
fn consume_counts(s: &Sections) -> Vec<u32> {
    let mut counts: Vec<u32> = SDK_CONSUME.list(s).iter().map(|r| r.workers).collect();
    counts.sort_unstable();
    counts.dedup();
    counts
}

/// Every SDK figure over its reference loop: sends, and the worker per
/// handler count against the consume loop and the equal-layout loop.
fn ratios(f: &mut Figures, s: &Sections, worker_counts: &[u32]) {
    let ratio = |sdk: Vec<(u32, f64)>, kind: &'static str, workers: Option<u32>| -> Vec<Sample> {
        sdk.into_iter()
            .filter_map(|(round, v)| {
                reference_rate(s, kind, round, workers).map(|b| Sample::value(round, v / b))
            })
            .collect()
    };
    let sdk_single = measured(&SDK_SINGLE.list(s), |r| r.warmup)
        .map(|r| (r.round, r.rate.rate_per_s))
        .collect();
    f.add(
        "send_single.vs_baseline".into(),
        "send_single",
        "Single send vs baseline".into(),
        "x",
        Better::Higher,
        DEF_RATIO,
        ratio(sdk_single, "send_single", None),
    );
    let sdk_batch = measured(&SDK_BATCH.list(s), |r| r.warmup)
        .map(|r| (r.round, r.rate.rate_per_s))
        .collect();
    f.add(
        "send_batch.vs_baseline".into(),
        "send_batch",
        "Batch send vs baseline".into(),
        "x",
        Better::Higher,
        DEF_RATIO,
        ratio(sdk_batch, "send_batch", None),
    );
    for w in worker_counts {
        let sdk = measured(&SDK_CONSUME.list(s), |r| r.warmup)
            .filter(|r| r.workers == *w)
            .map(|r| (r.round, r.rate.rate_per_s))
            .collect();
        f.add(
            format!("consume_scaling.w{w}.vs_baseline"),
            "consume_scaling",
            format!("Worker, {w} handlers, vs baseline read + delete"),
            "x",
            Better::Higher,
            DEF_RATIO,
            ratio(sdk, "consume", Some(*w)),
        );
        let sdk = measured(&SDK_CONSUME.list(s), |r| r.warmup)
            .filter(|r| r.workers == *w)
            .map(|r| (r.round, r.rate.rate_per_s))
            .collect();
        f.add(
            format!("consume_scaling.w{w}.vs_equal_layout"),
            "consume_scaling",
            format!("Worker, {w} handlers, vs equal-layout no-SDK loop (SDK overhead)"),
            "x",
            Better::Higher,
            DEF_RATIO_EQUAL,
            ratio(sdk, "consume_equal_layout", None),
        );
    }
}

/// The reference of a ratio: for a worker run, the mean of the consume
/// loops run just before and just after it (either alone when the other is
/// missing, as in older documents); for a send run, the mean of the round's
/// runs of its loop (one before and one after it). None when the loop did
/// not run in that round or measured nothing.
fn reference_rate(
    s: &Sections,
    kind: &'static str,
    round: u32,
    workers: Option<u32>,
) -> Option<f64> {
    let of_round = || baseline_runs(s, kind).into_iter().filter(move |r| r.round == round);
    let mean_rate = |keep: &dyn Fn(&BaselineRun) -> bool| {
        let (n, sum) = of_round()
            .filter(|r| keep(r))
            .fold((0u32, 0.0), |(n, sum), r| (n + 1, sum + r.rate.rate_per_s));
        (n > 0).then(|| sum / f64::from(n))
    };
    let bracket = workers
        .and_then(|w| mean_rate(&|r| r.paired_workers == Some(w) || r.follows_workers == Some(w)));
    bracket
        .or_else(|| mean_rate(&|r| r.paired_workers.is_none() && r.follows_workers.is_none()))
        .or_else(|| of_round().next().map(|r| r.rate.rate_per_s))
        .filter(|v| *v > 0.0)
}

/// The worker against the no-SDK loop on its own connection layout, per
/// handler count: what the SDK costs or gains at equal parallelism.
fn equal_layout_table(out: &mut String, d: &Document) {
    let ids: Vec<String> = worker_counts(d)
        .iter()
        .map(|w| format!("consume_scaling.w{w}.vs_equal_layout"))
        .filter(|id| fig(d, id).is_some())
        .collect();
    if ids.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "## Worker vs the equal-layout loop\n\n\
         Equal-layout read + delete (2 claim connections, 1 delete connection, no SDK): {} msg/s.\n\n\
         | Handlers | Worker / equal layout |\n| --- | --- |",
        cell(d, "baseline.consume_equal_layout.rate")
    );
    for id in &ids {
        let w = id
            .strip_prefix("consume_scaling.w")
            .and_then(|s| s.strip_suffix(".vs_equal_layout"))
            .unwrap_or("?");
        let _ = writeln!(out, "| {w} | {} |", cell(d, id));
    }
    out.push('\n');
    let mut defs = ids;
    defs.push("baseline.consume_equal_layout.rate".into());
    definitions(out, d, &defs);
}
