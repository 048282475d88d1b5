//! Turns the measured runs of every section into the document's flat list of
//! figures, each with its definition, and evaluates the worker's targets.

use std::collections::BTreeMap;

use crate::document::HandlerKind;
use crate::document::{Better, Figure, Percentiles, Rate, Sample, TargetCheck, UNITS};

const MIB: f64 = 1024.0 * 1024.0;

/// Collects figures; runs with no measured values add nothing.
#[derive(Debug, Default)]
pub(crate) struct Figures(Vec<Figure>);

impl Figures {
    /// The figures collected.
    pub(crate) fn into_figures(self) -> Vec<Figure> {
        self.0
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add(
        &mut self,
        id: String,
        section: &str,
        label: String,
        unit: &str,
        better: Better,
        definition: &str,
        runs: Vec<Sample>,
    ) {
        debug_assert!(UNITS.contains(&unit), "{id}: unit {unit} is not in UNITS");
        if let Some(f) = Figure::from_runs(id, section, label, unit, better, definition, runs) {
            self.0.push(f);
        }
    }

    pub(crate) fn rate<'a>(
        &mut self,
        id: &str,
        section: &str,
        label: &str,
        definition: &str,
        runs: impl Iterator<Item = (u32, &'a Rate)>,
    ) {
        let samples = runs.map(|(r, rate)| Sample::rate(r, rate)).collect();
        self.add(
            id.to_owned(),
            section,
            label.to_owned(),
            "msg/s",
            Better::Higher,
            definition,
            samples,
        );
    }

    pub(crate) fn percentiles<'a>(
        &mut self,
        prefix: &str,
        section: &str,
        label: &str,
        definition: &str,
        runs: impl Iterator<Item = (u32, &'a Percentiles)>,
    ) {
        let runs: Vec<(u32, &Percentiles)> = runs.collect();
        type Pick = fn(&Percentiles) -> f64;
        let picks: [(&str, Pick); 4] = [
            ("p50", |p| p.p50),
            ("p95", |p| p.p95),
            ("p99", |p| p.p99),
            ("max", |p| p.max),
        ];
        for (name, pick) in picks {
            let samples = runs
                .iter()
                .map(|(r, p)| Sample::value(*r, pick(p)))
                .collect();
            self.add(
                format!("{prefix}.{name}_ms"),
                section,
                format!("{label} {name}"),
                "ms",
                Better::Lower,
                definition,
                samples,
            );
        }
    }
}

const DEF_MEM: &str =
    "Peak resident set size of the bench process during the section's runs (largest run of \
    the round); see protocol.memory_method.";

/// A run's round, whether it is a warm-up run, its mode and its rate.
pub(crate) type RunKey<T> = fn(&T) -> (u32, bool, &str, f64);

/// Per measured round, the rate of the run of mode `mode` ÷ the rate of
/// the run of mode `base` of the same round (none where the latter is 0).
pub(crate) fn paired_ratios<T>(runs: &[T], key: RunKey<T>, mode: &str, base: &str) -> Vec<Sample> {
    let measured = || runs.iter().map(key).filter(|k| !k.1);
    measured()
        .filter(|k| k.2 == mode)
        .filter_map(|(round, _, _, rate)| {
            let (_, _, _, b) = measured().find(|b| b.0 == round && b.2 == base)?;
            (b > 0.0).then(|| Sample::value(round, rate / b))
        })
        .collect()
}

/// The runs of `runs` that are not warm-up runs.
pub(crate) fn measured<T>(runs: &[T], warmup: impl Fn(&T) -> bool) -> impl Iterator<Item = &T> {
    runs.iter().filter(move |r| !warmup(r))
}

/// Each run's peak RSS as (round, warm-up, bytes).
pub(crate) type RunPeaks = Vec<(u32, bool, u64)>;

/// Each section's run peaks: its name and its runs'.
pub(crate) type Peaks = [(&'static str, RunPeaks)];

/// Peak RSS per section and round.
pub(crate) fn memory(f: &mut Figures, peaks: &Peaks) {
    for (section, peaks) in peaks_by_round(peaks) {
        f.add(
            format!("memory.{section}.peak_rss_mib"),
            section,
            format!("Peak RSS, {section}"),
            "MiB",
            Better::Lower,
            DEF_MEM,
            peaks
                .into_iter()
                .map(|(round, b)| Sample::value(round, b as f64 / MIB))
                .collect(),
        );
    }
}

/// Per section, per measured round: the largest run peak.
fn peaks_by_round(peaks: &Peaks) -> BTreeMap<&'static str, Vec<(u32, u64)>> {
    let mut out: BTreeMap<&'static str, BTreeMap<u32, u64>> = BTreeMap::new();
    for (section, runs) in peaks {
        for &(round, warmup, peak) in runs {
            if !warmup {
                let e = out.entry(section).or_default().entry(round).or_default();
                *e = (*e).max(peak);
            }
        }
    }
    out.into_iter()
        .map(|(k, v)| (k, v.into_iter().collect()))
        .collect()
}

/// Largest run peak per section, warm-up runs included.
pub(crate) fn section_peaks(peaks: &Peaks) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (section, runs) in peaks {
        for &(_, _, peak) in runs {
            let e = out.entry((*section).to_owned()).or_insert(0u64);
            *e = (*e).max(peak);
        }
    }
    out
}

/// The inputs of the target checks that are not figures.
#[derive(Debug, Clone, Copy)]
pub struct TargetContext {
    /// `--handler`: what each handler call did.
    pub handler: HandlerKind,
    /// `--handler-work-ms`.
    pub handler_work_ms: u64,
    /// `--idle-poll-ms`.
    pub idle_poll_ms: u64,
    /// `--messages`.
    pub messages: u64,
}

/// One target's verdict: `observed` against `limit` by `pass`, or none
/// with the reason when it does not apply or was not measured.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check(
    id: &str,
    description: &str,
    observed: Option<f64>,
    limit: f64,
    unit: &str,
    pass: impl Fn(f64) -> bool,
    applies: Result<(), String>,
    note: &str,
) -> TargetCheck {
    let (observed, pass, note) = match (applies, observed) {
        (Err(why), _) => (None, None, why),
        (Ok(()), None) => (None, None, "not measured in this run".to_owned()),
        (Ok(()), Some(v)) => (Some(v), Some(pass(v)), note.to_owned()),
    };
    TargetCheck {
        id: id.to_owned(),
        description: description.to_owned(),
        observed,
        limit,
        unit: unit.to_owned(),
        pass,
        note,
    }
}

/// Whether the targets stated for an empty handler apply: the handler does
/// nothing (`--handler empty`) and awaits nothing (`--handler-work-ms 0`).
fn empty_handler(ctx: TargetContext) -> Result<(), String> {
    match (ctx.handler, ctx.handler_work_ms) {
        (HandlerKind::Empty, 0) => Ok(()),
        (HandlerKind::Empty, ms) => Err(format!(
            "needs an empty handler (this run used --handler-work-ms {ms})"
        )),
        (kind, _) => Err(format!(
            "needs an empty handler (this run used --handler {})",
            kind.name()
        )),
    }
}

/// The lowest 8-handler / 1-handler throughput ratio that counts as "not
/// below". With an empty handler the claimers set the pace whatever the
/// handler count, so the two medians are the same figure twice up to the
/// rounds' own spread, and a strict `>= 1.0` would fail on that spread
/// alone; the fall the target guards against is far larger than this
/// margin (docs/benchmark-targets.md, "The worker's performance targets").
pub const W8_NOISE_FLOOR: f64 = 0.95;

/// The pgmq-worker performance targets that are not a section's own,
/// evaluated on the medians of one document (`sections::targets` adds the
/// sections'). The memory target needs two documents: `check-memory`.
pub fn worker_targets(figures: &[Figure], ctx: TargetContext) -> Vec<TargetCheck> {
    let empty_handler = empty_handler(ctx);
    let mut checks = handler_count_checks(figures, ctx, &empty_handler);
    checks.extend(idle_and_wakeup_checks(figures, ctx));
    checks.extend(rate_and_memory_checks(figures, ctx, &empty_handler));
    checks
}

/// The median of the figure `id`, if the document has it.
pub(crate) fn median_of(figures: &[Figure], id: &str) -> Option<f64> {
    figures.iter().find(|f| f.id == id).map(|f| f.median)
}

/// The numbers `N` of the figures whose ids are `{prefix}N{suffix}`,
/// ascending, each once.
pub(crate) fn counts_in_ids(figures: &[Figure], prefix: &str, suffix: &str) -> Vec<u64> {
    let mut v: Vec<u64> = figures
        .iter()
        .filter_map(|f| {
            f.id.strip_prefix(prefix)?
                .strip_suffix(suffix)?
                .parse()
                .ok()
        })
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The smallest median worker / one-connection-loop ratio over the handler
/// counts run.
fn min_vs_baseline(figures: &[Figure]) -> Option<f64> {
    counts_in_ids(figures, "consume_scaling.w", ".vs_baseline")
        .iter()
        .filter_map(|w| median_of(figures, &format!("consume_scaling.w{w}.vs_baseline")))
        .reduce(f64::min)
}

/// Whether the backlog targets apply: the smallest backlog drained is 100,000.
fn backlog_from_100k(figures: &[Figure]) -> Result<(), String> {
    let smallest_backlog = figures
        .iter()
        .filter_map(|f| {
            f.id.strip_prefix("backlog_scaling.n")?
                .strip_suffix(".throughput")?
                .parse::<u64>()
                .ok()
        })
        .min();
    match smallest_backlog {
        Some(100_000) => Ok(()),
        _ => Err("needs backlog_scaling with sizes 100000 and 1000000".to_owned()),
    }
}

/// The targets on how the worker's rate grows with its handler count.
fn handler_count_checks(
    figures: &[Figure],
    ctx: TargetContext,
    empty_handler: &Result<(), String>,
) -> Vec<TargetCheck> {
    let med = |id: &str| median_of(figures, id);
    let min_ratio = min_vs_baseline(figures);
    let t1 = med("consume_scaling.w1.throughput");
    let t8 = med("consume_scaling.w8.throughput");
    let w8_over_w1 = t1.zip(t8).filter(|(a, _)| *a > 0.0).map(|(a, b)| b / a);
    vec![
        check(
            "worker_vs_baseline",
            "Worker with default settings reaches at least 1.4x the one-connection read + delete loop at every handler count",
            min_ratio,
            1.4,
            "x",
            |v| v >= 1.4,
            empty_handler.clone(),
            "smallest median ratio over the handler counts run",
        ),
        check(
            "w8_not_below_w1",
            "8 handlers never fall below the 1-handler throughput",
            w8_over_w1,
            W8_NOISE_FLOOR,
            "x",
            |v| v >= W8_NOISE_FLOOR,
            empty_handler.clone(),
            "median throughput at 8 handlers divided by the median at 1; with an empty handler both drain at the claimers' pace, so a ratio down to 0.95 is run-to-run noise, not a fall (the collapse this guards against, a polling connection per handler, is a drop by half or more)",
        ),
        check(
            "handler_1ms_w8_7x",
            "With a handler that awaits 1 ms, 8 handlers reach at least 7x the 1-handler rate",
            w8_over_w1,
            7.0,
            "x",
            |v| v >= 7.0,
            if ctx.handler == HandlerKind::Empty && ctx.handler_work_ms == 1 {
                Ok(())
            } else {
                Err("needs --handler empty with --handler-work-ms 1".to_owned())
            },
            "median throughput at 8 handlers divided by the median at 1",
        ),
    ]
}

/// The targets on the idle worker's cost and its NOTIFY wake-up.
fn idle_and_wakeup_checks(figures: &[Figure], ctx: TargetContext) -> Vec<TargetCheck> {
    let med = |id: &str| median_of(figures, id);
    let poll_250 = if ctx.idle_poll_ms == 250 {
        Ok(())
    } else {
        Err(format!(
            "needs --idle-poll-ms 250 (this run used {})",
            ctx.idle_poll_ms
        ))
    };
    vec![
        check(
            "idle_cpu",
            "Idle with 250 ms polling: at most 1% of one core",
            med("idle_worker.cpu_percent"),
            1.0,
            "%",
            |v| v <= 1.0,
            poll_250.clone(),
            "median over runs",
        ),
        check(
            "idle_empty_reads",
            "Idle with 250 ms polling: about 4 empty reads a second (3 to 5 accepted)",
            med("idle_worker.empty_reads_per_s"),
            4.0,
            "1/s",
            |v| (3.0..=5.0).contains(&v),
            poll_250,
            "median over runs",
        ),
        check(
            "notify_wakeup_p50",
            "A NOTIFY wake-up reaches the handler within 5 ms at the median",
            med("wakeup_latency.notify.p50_ms"),
            5.0,
            "ms",
            |v| v <= 5.0,
            Ok(()),
            "median over runs of each run's p50",
        ),
    ]
}

/// The targets against the equal-layout reference, on batch sends, on the
/// large backlog and on memory.
fn rate_and_memory_checks(
    figures: &[Figure],
    ctx: TargetContext,
    empty_handler: &Result<(), String>,
) -> Vec<TargetCheck> {
    let med = |id: &str| median_of(figures, id);
    vec![
        check(
            "consume_w8_vs_equal_layout",
            "With 8 handlers the worker reaches at least 1.1x the equal-layout reference (the worker's connection layout without the SDK, on PGMQ's functions)",
            med("consume_scaling.w8.vs_equal_layout"),
            1.1,
            "x",
            |v| v >= 1.1,
            empty_handler.clone(),
            "median over rounds of the worker's rate divided by the mean of the round's equal-layout runs",
        ),
        check(
            "send_batch_vs_baseline",
            "Batch sends reach at least 0.95x the no-SDK batch loop",
            med("send_batch.vs_baseline"),
            0.95,
            "x",
            |v| v >= 0.95,
            Ok(()),
            "median over rounds of the per-round ratio",
        ),
        check(
            "backlog_1m_vs_100k",
            "Draining 1,000,000 messages runs at least 0.85x the rate of draining 100,000",
            med("backlog_scaling.n1000000.vs_smallest"),
            0.85,
            "x",
            |v| v >= 0.85,
            backlog_from_100k(figures),
            "median over rounds of the 1,000,000 drain rate divided by the same round's 100,000 drain rate",
        ),
        check(
            "consume_peak_rss",
            "Peak RSS while draining the backlog at most 64 MiB (the target names 1,000,000 messages; check-memory compares two sizes)",
            med("memory.consume_scaling.peak_rss_mib"),
            64.0,
            "MiB",
            |v| v <= 64.0,
            Ok(()),
            &format!("median over runs, backlog of {} messages", ctx.messages),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ratio(id: &str, v: f64) -> Figure {
        Figure::from_runs(
            id,
            "consume_scaling",
            id,
            "x",
            Better::Higher,
            "a ratio",
            vec![Sample::value(0, v)],
        )
        .unwrap()
    }

    fn ctx(handler: HandlerKind, handler_work_ms: u64) -> TargetContext {
        TargetContext {
            handler,
            handler_work_ms,
            idle_poll_ms: 250,
            messages: 1000,
        }
    }

    /// The targets stated for an empty handler are judged only on runs
    /// whose handler does nothing and awaits nothing.
    #[test]
    fn empty_handler_targets_need_an_empty_handler_kind_and_no_work() {
        let figures = [
            ratio("consume_scaling.w1.vs_baseline", 2.0),
            ratio("consume_scaling.w8.vs_baseline", 2.0),
            ratio("consume_scaling.w8.vs_equal_layout", 1.5),
            ratio("consume_scaling.w1.throughput", 100.0),
            ratio("consume_scaling.w8.throughput", 800.0),
        ];
        let judged = |c: TargetContext| -> Vec<(String, Option<bool>, String)> {
            worker_targets(&figures, c)
                .into_iter()
                .filter(|t| {
                    ["worker_vs_baseline", "consume_w8_vs_equal_layout"].contains(&t.id.as_str())
                })
                .map(|t| (t.id, t.pass, t.note))
                .collect()
        };
        let empty = judged(ctx(HandlerKind::Empty, 0));
        assert_eq!(empty.len(), 2);
        assert!(
            empty.iter().all(|(_, pass, _)| *pass == Some(true)),
            "{empty:?}"
        );
        for kind in [HandlerKind::DbWrite, HandlerKind::DbWriteTx] {
            for (id, pass, note) in judged(ctx(kind, 0)) {
                assert_eq!(pass, None, "{id} judged with --handler {}", kind.name());
                assert!(note.contains(kind.name()), "{id}: {note}");
            }
        }
        for (id, pass, note) in judged(ctx(HandlerKind::Empty, 1)) {
            assert_eq!(pass, None, "{id} judged with --handler-work-ms 1");
            assert!(note.contains("--handler-work-ms 1"), "{id}: {note}");
        }
        let one_ms = |c: TargetContext| {
            let t = worker_targets(&figures, c)
                .into_iter()
                .find(|t| t.id == "handler_1ms_w8_7x")
                .unwrap();
            (t.pass, t.note)
        };
        assert_eq!(one_ms(ctx(HandlerKind::Empty, 1)).0, Some(true));
        let (pass, note) = one_ms(ctx(HandlerKind::DbWrite, 1));
        assert_eq!(pass, None);
        assert!(note.starts_with("needs --handler empty"), "{note}");
    }
}
