//! worker_processes: separate worker processes draining one queue
//! (`kit::child` starts them and collects their reports and ids), after
//! installing the `pgmq_sdk` schema (the workers' claim cursors). The runs,
//! the merged ledger and the fairness figures are described once, in docs/benchmark-sections.md
//! ("worker_processes").

use std::sync::Arc;
use std::time::Duration;


use crate::document::{
    HandlerKind, LedgerReport, Percentiles, Rate, Runs, SectionRuns, WorkerCounters,
};
use crate::error::Result;
use crate::kit::child::{ChildReport, Fleet};
use crate::kit::snapshot::DbSnapshot;
pub use crate::kit::snapshot::ProcessesServer;
use crate::kit::Ctx;
use crate::ledger::Ledger;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::checks::Checks;
use crate::document::{Better, Document, Figure, Sample, Sections, TargetCheck};
use crate::figures::{check, counts_in_ids, measured, median_of, Figures};
use crate::report::{cell, definitions, figure_keys};
use crate::report::{fmt_value, thousands};
use crate::sections::{Rounds, Round, Section};
use crate::config::Config;
use crate::sections::plan::{self, Plan};

/// The section's runs in the document.
pub(crate) const RUNS: Runs<ProcessesRun> = Runs::new("worker_processes");

/// A worker_processes run: N processes draining one queue.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct ProcessesRun {
    /// Round.
    pub round: u32,
    /// Warm-up or measured (always measured: the section does not warm up).
    pub warmup: bool,
    /// Worker processes.
    pub processes: u32,
    /// Handler concurrency of each process.
    pub workers_per_process: u32,
    /// `empty`, `db-write` or `db-write-tx`.
    #[schemars(with = "HandlerKind")]
    pub handler: String,
    /// Simulated I/O per handler call, milliseconds.
    pub handler_work_ms: u64,
    /// Combined: distinct messages handled over the slowest process's seconds
    /// (each from its `go` to its last handler's end).
    #[serde(flatten)]
    pub rate: Rate,
    /// Each process.
    pub per_process: Vec<ProcessShare>,
    /// The smallest process's message count over the largest's (1: even).
    pub min_over_max: f64,
    /// Jain's fairness index of the per-process counts: (Σx)² / (n·Σx²),
    /// 1 when even, 1/n when one process did everything.
    pub jain_index: f64,
    /// Every process's ids merged: a message handled by two processes is a duplicate.
    pub ledger: LedgerReport,
    /// Messages left after every process stopped (must be 0).
    pub remaining_after: i64,
    /// Seconds to preload the queue (not timed).
    pub preload_s: f64,
    /// Seconds of VACUUM (not timed).
    pub vacuum_s: f64,
    /// The database's own counters over the run (absent when unreadable,
    /// and in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ProcessesServer>,
}

/// One process of a worker_processes run.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct ProcessShare {
    /// 0-based.
    pub index: u32,
    /// Its handler calls over its seconds.
    pub rate: Rate,
    /// Its fraction of all handler calls.
    pub share: f64,
    /// Whether it stopped on a stall rather than an empty queue.
    pub stalled: bool,
    /// Its worker's counters at shutdown.
    pub worker: WorkerCounters,
    /// Its handler durations.
    pub handler_ms: Percentiles,
    /// Its peak RSS, bytes.
    pub peak_rss_bytes: u64,
}

/// One run with `n_proc` processes.
pub async fn run(ctx: &Arc<Ctx>, n_proc: u32, round: u32) -> Result<ProcessesRun> {
    let cfg = &ctx.cfg;
    let n = cfg.processes_messages;
    let (q, preload_s, vacuum_s) = ctx.fresh_loaded("processes", n).await?;
    let specs = (0..n_proc).map(|_| ctx.child_spec(&q));
    let mut fleet = Fleet::start(ctx, "processes", &format!("{round}-{n_proc}"), specs).await?;
    let before = DbSnapshot::read(ctx, &q).await;
    fleet.go().await?;
    let ledger = Ledger::new();
    let reports = fleet.collect(&ledger).await?;
    // The processes' backends report their statistics when they end, which
    // may follow the processes' exit by a moment: a second's wait first.
    // The cluster's CPU is read after that wait too: a backend ending while
    // it is read would be counted neither among the live processes nor
    // among those the postmaster reaped.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let server = before.processes(&DbSnapshot::read(ctx, &q).await, ledger.handled());
    let remaining_after = ctx.finish_queue(&q).await?;
    let ledger = ledger.report(n);
    let elapsed = reports.iter().map(|r| r.elapsed_s).fold(0.0, f64::max);
    let fairness = Fairness::of(&reports);
    Ok(ProcessesRun {
        round,
        warmup: false,
        processes: n_proc,
        workers_per_process: cfg.backlog_workers,
        handler: cfg.handler.name().to_owned(),
        handler_work_ms: cfg.handler_work_ms,
        rate: Rate::new(ledger.distinct, elapsed),
        per_process: reports
            .iter()
            .zip(fairness.shares)
            .enumerate()
            .map(|(i, (r, share))| ProcessShare {
                index: i as u32,
                rate: Rate::new(r.handled, r.elapsed_s),
                share,
                stalled: r.stalled,
                worker: r.worker.clone(),
                handler_ms: r.handler_ms,
                peak_rss_bytes: r.peak_rss_bytes,
            })
            .collect(),
        min_over_max: fairness.min_over_max,
        jain_index: fairness.jain_index,
        ledger,
        remaining_after,
        preload_s,
        vacuum_s,
        server,
    })
}

/// How evenly the processes shared the work.
struct Fairness {
    /// Each process's share of the messages handled.
    shares: Vec<f64>,
    /// The smallest handled count over the largest.
    min_over_max: f64,
    /// Jain's fairness index `(Σx)² / (n·Σx²)`.
    jain_index: f64,
}

impl Fairness {
    fn of(reports: &[ChildReport]) -> Self {
        let total: u64 = reports.iter().map(|r| r.handled).sum();
        let shares: Vec<f64> = reports
            .iter()
            .map(|r| {
                if total > 0 {
                    r.handled as f64 / total as f64
                } else {
                    0.0
                }
            })
            .collect();
        let (min, max) = reports.iter().fold((u64::MAX, 0u64), |(a, b), r| {
            (a.min(r.handled), b.max(r.handled))
        });
        let sum_sq: f64 = reports.iter().map(|r| (r.handled as f64).powi(2)).sum();
        let jain_index = if sum_sq > 0.0 {
            (total as f64).powi(2) / (reports.len() as f64 * sum_sq)
        } else {
            0.0
        };
        Fairness {
            shares,
            min_over_max: if max > 0 {
                min as f64 / max as f64
            } else {
                0.0
            },
            jain_index,
        }
    }
}

/// The worker_processes section: `--processes` separate worker processes
/// draining one queue. Its runs record each process's peak RSS, not the
/// bench process's, so it adds no memory figure.
pub(crate) struct WorkerProcesses;

impl Section for WorkerProcesses {
    fn runs(&self) -> &dyn SectionRuns {
        &RUNS
    }

    fn about(&self) -> &'static str {
        "Separate worker processes draining one queue (`--processes`)"
    }

    fn planned(&self, cfg: &Config) -> Plan {
        let each = plan::PROCESS_START + plan::drain(cfg.processes_messages, plan::DRAIN);
        Plan::work(cfg.processes.len() as f64 * each)
    }

    fn check(&self, s: &Sections, out: &mut Checks) {
        let at = |r: &ProcessesRun| (r.processes, r.round, r.warmup);
        out.each(&RUNS, s, at, |out, tag, r| {
            out.drained(tag, r.rate.elapsed_s, &r.ledger, r.remaining_after);
            for pr in &r.per_process {
                if pr.stalled {
                    out.fail(format!("{tag}: process {} stalled", pr.index));
                }
                out.counters(&format!("{tag}: process {}", pr.index), &pr.worker);
            }
        });
    }

    /// worker_processes: combined rate and evenness per process count.
    fn figures(&self, s: &Sections, f: &mut Figures) {
        let mut procs: Vec<u32> = RUNS.list(s).iter().map(|r| r.processes).collect();
        procs.sort_unstable();
        procs.dedup();
        let all = RUNS.list(s);
        let wp = || measured(&all, |r| r.warmup);
        for n in &procs {
            f.rate(
                &format!("worker_processes.p{n}.throughput"),
                "worker_processes",
                &format!("Combined drain rate, {n} processes"),
                DEF_PROC_RATE,
                wp().filter(|r| r.processes == *n)
                    .map(|r| (r.round, &r.rate)),
            );
            f.add(
                format!("worker_processes.p{n}.min_over_max"),
                "worker_processes",
                format!("Work share, smallest / largest process, {n} processes"),
                "x",
                Better::None,
                DEF_PROC_EVEN,
                wp().filter(|r| r.processes == *n)
                    .map(|r| Sample::value(r.round, r.min_over_max))
                    .collect(),
            );
        }
    }

    /// worker_processes: the combined rate per process count, each process's
    /// own rate, and how evenly they shared the work.
    fn report(&self, d: &Document, out: &mut String) {
        let counts = figure_keys(d, "worker_processes.p", ".throughput");
        if counts.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "## Worker processes (worker_processes)\n\n\
             | Processes | Combined rate (msg/s) | Of 1 process | Per-process rates (msg/s), per round | Smallest / largest | Jain's index |\n\
             | --- | --- | --- | --- | --- | --- |"
        );
        let one = median_rate(d, 1);
        let mut ids = Vec::new();
        for n in &counts {
            let all = RUNS.list(&d.sections);
            let runs: Vec<_> = all
                .iter()
                .filter(|r| !r.warmup && u64::from(r.processes) == *n)
                .collect();
            let per_process = runs
                .iter()
                .map(|r| {
                    r.per_process
                        .iter()
                        .map(|p| thousands(p.rate.rate_per_s))
                        .collect::<Vec<_>>()
                        .join(" / ")
                })
                .collect::<Vec<_>>()
                .join("; ");
            let jain: Vec<f64> = runs.iter().map(|r| r.jain_index).collect();
            let rate = format!("worker_processes.p{n}.throughput");
            let even = format!("worker_processes.p{n}.min_over_max");
            let of_one = match (median_rate(d, *n), one) {
                (Some(r), Some(one)) if one > 0.0 => format!("{:.2}x", r / one),
                _ => "–".to_owned(),
            };
            let _ = writeln!(
                out,
                "| {n} | {} | {of_one} | {} | {} | {} |",
                cell(d, &rate),
                if per_process.is_empty() {
                    "–".to_owned()
                } else {
                    per_process
                },
                cell(d, &even),
                crate::stats::median_min_max(&jain)
                    .map_or("–".to_owned(), |(med, _, _)| fmt_value(med, "x"))
            );
            ids.extend([rate, even]);
        }
        let _ = writeln!(
            out,
            "\nOf 1 process is the median combined rate over the median with one process, measured in the same \
             document. Jain's index is (Σx)² / (n·Σx²) of the processes' handled counts, median over rounds: 1 when \
             even, 1/n when one process did everything.\n"
        );
        processes_server(out, d, &counts);
        definitions(out, d, &ids);
    }

    /// A fleet drains about as fast as one process, and shares the work.
    fn targets(&self, figures: &[Figure]) -> Vec<TargetCheck> {
        let fleet = fleet_counts(figures);
        let one = median_of(figures, "worker_processes.p1.throughput");
        let pace = one.filter(|v| *v > 0.0).and_then(|one| {
            fleet
                .iter()
                .filter_map(|n| median_of(figures, &format!("worker_processes.p{n}.throughput")))
                .map(|v| v / one)
                .reduce(f64::min)
        });
        let share = fleet
            .iter()
            .filter_map(|n| median_of(figures, &format!("worker_processes.p{n}.min_over_max")))
            .reduce(f64::min);
        vec![
            check(
                "fleet_keeps_pace",
                "Worker processes: every count of two or more drains at least 0.9x the rate of one process",
                pace,
                FLEET_FLOOR,
                "x",
                |v| v >= FLEET_FLOOR,
                Ok(()),
                "the smallest, over the process counts run, of the median combined rate over the median rate of one process (needs --processes with 1 and a larger count)",
            ),
            check(
                "fleet_shares_evenly",
                "Worker processes: the smallest process handles at least 0.9 of the largest's messages at every count",
                share,
                FLEET_FLOOR,
                "x",
                |v| v >= FLEET_FLOOR,
                Ok(()),
                "the smallest, over the process counts of two or more, of the median smallest / largest share",
            ),
        ]
    }
}

/// The floor of both fleet targets.
const FLEET_FLOOR: f64 = 0.9;

/// The process counts of two or more that the figures hold.
fn fleet_counts(figures: &[Figure]) -> Vec<u64> {
    let mut v = counts_in_ids(figures, "worker_processes.p", ".throughput");
    v.retain(|n| *n > 1);
    v
}

impl Rounds for WorkerProcesses {
    /// One round of worker_processes: a run at each process count.
    async fn run_round(&self, ctx: &Arc<Ctx>, at: Round<'_>, s: &mut Sections) -> Result<()> {
        let tag = at.tag;
        // A fleet's claim reads take their ranges from the claim cursor of
        // the `pgmq_sdk` schema, as in a deployment that installed it.
        ctx.client.install_sdk_schema().await?;
        for n in &ctx.cfg.processes {
            let r = run(ctx, *n, at.index).await?;
            ctx.progress.say(format!(
                "{tag} worker_processes {n}: {:.0} msg/s combined, min/max share {:.2}",
                r.rate.rate_per_s, r.min_over_max
            ));
            RUNS.record(s, &r)?;
        }
        Ok(())
    }
}

const DEF_PROC_RATE: &str = "N separate worker processes (the bench binary's process-worker, --backlog-workers \
    handlers each, own pools) draining one preloaded, vacuumed queue of --processes-messages: distinct messages handled by \
    all of them divided by the slowest process's seconds from its start signal to its last handler's end.";

const DEF_PROC_EVEN: &str =
    "The smallest process's handled count divided by the largest's: 1 when the work \
    was shared evenly (Jain's index is in the run record).";

/// The median combined rate of the measured runs with `n` processes.
fn median_rate(d: &Document, n: u64) -> Option<f64> {
    let rates: Vec<f64> = RUNS
        .list(&d.sections)
        .iter()
        .filter(|r| !r.warmup && u64::from(r.processes) == n)
        .map(|r| r.rate.rate_per_s)
        .collect();
    crate::stats::median_min_max(&rates).map(|(med, _, _)| med)
}

/// worker_processes: the database's own counters per message, per process
/// count and round (why the rates are what they are).
fn processes_server(out: &mut String, d: &Document, counts: &[u64]) {
    let all = RUNS.list(&d.sections);
    let runs: Vec<_> = all
        .iter()
        .filter(|r| !r.warmup && counts.contains(&u64::from(r.processes)))
        .filter_map(|r| r.server.as_ref().map(|s| (r, s)))
        .collect();
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "The database's own counters per message handled (queue table and its indexes; \
         transactions in the database):\n\n\
         | Processes | Round | Shared buffers | Index rows fetched | Transactions | Server CPU (µs) | Worker processes' CPU (µs) | Reads per process |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for (r, s) in runs {
        let reads = r
            .per_process
            .iter()
            .map(|p| thousands(p.worker.reads as f64))
            .collect::<Vec<_>>()
            .join(" / ");
        let cpu = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.1}"));
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.2} | {:.3} | {} | {} | {reads} |",
            r.processes,
            r.round,
            s.buffers_per_msg,
            s.index_rows_per_msg,
            s.transactions_per_msg,
            cpu(s.server_cpu_us_per_msg),
            cpu(s.workers_cpu_us_per_msg),
        );
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure(id: &str, value: f64) -> Figure {
        Figure::from_runs(
            id,
            "worker_processes",
            id,
            "x",
            Better::None,
            "",
            vec![Sample::value(0, value)],
        )
        .unwrap()
    }

    fn fleet(rates: &[(u32, f64)], shares: &[(u32, f64)]) -> Vec<TargetCheck> {
        let mut f: Vec<Figure> = rates
            .iter()
            .map(|(n, v)| figure(&format!("worker_processes.p{n}.throughput"), *v))
            .collect();
        f.extend(
            shares
                .iter()
                .map(|(n, v)| figure(&format!("worker_processes.p{n}.min_over_max"), *v)),
        );
        WorkerProcesses.targets(&f)
    }

    #[test]
    fn the_fleet_targets_take_the_worst_count() {
        let t = fleet(
            &[(1, 100.0), (2, 98.0), (4, 95.0), (8, 85.0)],
            &[(1, 1.0), (2, 0.99), (4, 0.91), (8, 0.95)],
        );
        let pace = t.iter().find(|t| t.id == "fleet_keeps_pace").unwrap();
        assert!((pace.observed.unwrap() - 0.85).abs() < 1e-9);
        assert_eq!(pace.pass, Some(false));
        let share = t.iter().find(|t| t.id == "fleet_shares_evenly").unwrap();
        assert!((share.observed.unwrap() - 0.91).abs() < 1e-9);
        assert_eq!(share.pass, Some(true));
    }

    #[test]
    fn the_fleet_targets_need_one_process_and_a_fleet() {
        for t in fleet(&[(2, 98.0), (4, 95.0)], &[])
            .iter()
            .chain(&fleet(&[(1, 100.0)], &[(1, 1.0)]))
        {
            if t.id == "fleet_keeps_pace" || t.id == "fleet_shares_evenly" {
                assert_eq!(t.pass, None, "{t:?}");
            }
        }
        let t = fleet(&[(1, 100.0), (2, 95.0)], &[(2, 0.97)]);
        assert!(t.iter().all(|t| t.pass == Some(true)), "{t:?}");
    }
}
