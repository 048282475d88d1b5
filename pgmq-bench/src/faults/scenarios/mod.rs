//! Scenarios 1 to 12 of the fault suite, and the steps they share.
//!
//! | file | scenarios |
//! | --- | --- |
//! | `crash.rs` | 1 server killed, 2 worker SIGKILLed, 3 connections cut, 8 two workers |
//! | `handlers.rs` | 4 poison payloads, 5 panics and failures, 6 handlers outliving their vt |
//! | `shutdown.rs` | 7 graceful shutdown 20 times, 12 SIGTERM and a second SIGTERM |
//! | `inputs.rs` | 9 hostile queue names, 10 connect failures |
//! | `produce.rs` | 11 producers under connection cuts |

mod crash;
mod handlers;
mod inputs;
mod produce;
mod shutdown;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::child::{Exit, WorkerProc};
use super::ctx::{Ctx, Queues};
use super::job::Job;
use super::ledger::{Handling, Produced};
use super::report::{Check, Row};
use super::worker::WorkerArgs;
use super::BoxError;

/// All scenarios, in order.
pub(crate) const ALL: [u8; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];

/// The scenarios asked for (all when none were named).
pub(crate) fn selection(asked: &[u8]) -> Result<Vec<u8>, BoxError> {
    if asked.is_empty() {
        return Ok(ALL.to_vec());
    }
    let mut out = Vec::new();
    for s in asked {
        if !ALL.contains(s) {
            return Err(format!("no scenario {s}: scenarios are 1 to 12").into());
        }
        if !out.contains(s) {
            out.push(*s);
        }
    }
    Ok(out)
}

/// Runs one scenario; some produce two rows (6 and 12: a and b).
pub(crate) async fn run_one(ctx: &Ctx, s: u8) -> Result<Vec<Row>, BoxError> {
    Ok(match s {
        1 => vec![crash::server_killed(ctx).await?],
        2 => vec![crash::worker_killed(ctx).await?],
        3 => vec![crash::connections_cut(ctx).await?],
        4 => vec![handlers::poison(ctx).await?],
        5 => vec![handlers::panics_and_failures(ctx).await?],
        6 => vec![
            handlers::outliving_vt(ctx, false).await?,
            handlers::outliving_vt(ctx, true).await?,
        ],
        7 => vec![shutdown::graceful_repeated(ctx).await?],
        8 => vec![crash::two_workers(ctx).await?],
        9 => vec![inputs::hostile_names(ctx).await?],
        10 => vec![inputs::connect_failures(ctx).await?],
        11 => vec![produce::producers_under_cuts(ctx).await?],
        12 => vec![
            shutdown::sigterm_busy(ctx).await?,
            shutdown::second_sigterm(ctx).await?,
        ],
        _ => return Err(format!("no scenario {s}").into()),
    })
}

/// How long a queue may take to drain once the faults are over.
pub(crate) fn drain_limit(ctx: &Ctx) -> Duration {
    Duration::from_secs(30 + (ctx.n as u64 / 500))
}

/// One consuming scenario under way: its queues, what it produced, its checks.
pub(crate) struct Run<'a> {
    pub ctx: &'a Ctx,
    pub label: &'static str,
    pub qs: Queues,
    pub produced: Produced,
    pub checks: Vec<Check>,
    /// Whether messages may end in the dead-letter queue here (poison,
    /// panics); elsewhere a dead letter is a message that was never handled.
    pub dead_letters_expected: bool,
    started: Instant,
}

impl<'a> Run<'a> {
    /// Fresh queues for scenario `label`.
    pub(crate) async fn start(ctx: &'a Ctx, label: &'static str) -> Result<Run<'a>, BoxError> {
        Ok(Run {
            ctx,
            label,
            qs: ctx.queues(&format!("s{label}")).await?,
            produced: Produced::default(),
            checks: Vec::new(),
            dead_letters_expected: false,
            started: Instant::now(),
        })
    }

    /// Produces `jobs` (unfaulted).
    pub(crate) async fn produce(&mut self, jobs: &[Job]) {
        let p = self.ctx.produce(&self.qs.q, jobs).await;
        self.produced.merge(p);
    }

    /// Produces `n` plain jobs, keys `0..n`.
    pub(crate) async fn produce_plain(&mut self, n: usize) {
        let jobs = self.ctx.plain_jobs(n);
        self.produce(&jobs).await;
    }

    /// Default worker settings for this scenario.
    pub(crate) fn worker_args(&self) -> WorkerArgs {
        self.ctx.worker_args(&self.qs, self.label)
    }

    /// Starts a worker process straight on the cluster.
    pub(crate) async fn spawn(&self, args: &WorkerArgs) -> Result<WorkerProc, BoxError> {
        self.ctx.spawn_worker(args).await
    }

    /// Adds a check.
    pub(crate) fn check(&mut self, name: &str, pass: bool, detail: impl Into<String>) {
        self.checks.push(Check::new(name, pass, detail));
    }

    /// Waits until `i` quarters of the messages were handled; returns the
    /// handlings counted then.
    pub(crate) async fn wait_quarter(&self, i: i64) -> Result<i64, BoxError> {
        self.wait_handled(self.ctx.n as i64 * i / 4).await
    }

    /// Waits until `rows` handlings are in the ledger; returns the count then.
    pub(crate) async fn wait_handled(&self, rows: i64) -> Result<i64, BoxError> {
        self.ctx
            .wait_progress(self.label, rows, Duration::from_secs(120))
            .await?;
        Ok(self.ctx.progress(self.label).await.unwrap_or(rows))
    }

    /// Waits for the queue to drain (the worker keeps running).
    pub(crate) async fn wait_drained(&self) -> bool {
        self.ctx
            .wait_drained(&self.qs.q, drain_limit(self.ctx))
            .await
    }

    /// The end of every consuming scenario: wait for the queue to drain,
    /// stop the workers gracefully, count, drop the queues, make the row.
    pub(crate) async fn finish(
        mut self,
        title: &str,
        mut workers: Vec<WorkerProc>,
        duplicates_allowed: bool,
    ) -> Result<Finished, BoxError> {
        let ctx = self.ctx;
        let drained = self.wait_drained().await;
        let detail = if drained {
            format!(
                "empty {:.1} s after the start",
                self.started.elapsed().as_secs_f64()
            )
        } else {
            format!("not empty after {} s", drain_limit(ctx).as_secs())
        };
        self.check("queue drained", drained, detail);
        let alive = workers
            .iter_mut()
            .map(|w| w.running())
            .filter(|r| *r)
            .count();
        self.check(
            "workers ran to the end",
            alive == workers.len(),
            format!(
                "{alive} of {} worker processes still running (none crashed)",
                workers.len()
            ),
        );
        let exits = stop_all(workers).await;
        let clean = exits
            .iter()
            .filter(|e| e.as_ref().is_ok_and(|e| e.clean()))
            .count();
        self.check(
            "workers stopped cleanly",
            clean == exits.len(),
            format!(
                "{clean} of {} exited 0 after SIGTERM with a shutdown report{}",
                exits.len(),
                describe_exits(&exits)
            ),
        );
        let acc = ctx.account(self.label, &self.qs, &self.produced).await?;
        ctx.drop_queues(&self.qs).await;
        if !self.dead_letters_expected {
            let n = acc.dead.len();
            self.check(
                "nothing dead-lettered",
                n == 0,
                format!("{n} messages in the dead-letter queue, none of which ever failed"),
            );
        }
        let row = Row::new(
            self.label,
            title,
            acc.tally,
            duplicates_allowed,
            self.checks,
            self.started.elapsed(),
        );
        Ok(Finished {
            row,
            handlings: acc.handlings,
            dead: acc.dead,
            exits: exits.into_iter().filter_map(Result::ok).collect(),
        })
    }
}

/// What [`Run::finish`] found.
pub(crate) struct Finished {
    pub row: Row,
    pub handlings: Vec<Handling>,
    /// Keys in the dead-letter queue.
    pub dead: HashSet<i64>,
    /// The workers' exits (those that could be waited for).
    pub exits: Vec<Exit>,
}

impl Finished {
    /// The shutdown report of the first worker that gave one.
    pub(crate) fn report(&self) -> Option<&serde_json::Value> {
        self.exits.iter().find_map(|e| e.said.report.as_ref())
    }
}

/// SIGTERMs every worker at once and waits for them.
pub(crate) async fn stop_all(workers: Vec<WorkerProc>) -> Vec<Result<Exit, BoxError>> {
    let stops = workers.into_iter().map(|w| w.stop(Duration::from_secs(30)));
    futures::future::join_all(stops).await
}

fn describe_exits(exits: &[Result<Exit, BoxError>]) -> String {
    let bad: Vec<String> = exits
        .iter()
        .filter_map(|e| match e {
            Ok(e) if e.clean() => None,
            Ok(e) => Some(e.describe()),
            Err(e) => Some(e.to_string()),
        })
        .collect();
    if bad.is_empty() {
        String::new()
    } else {
        format!(" ({})", bad.join("; "))
    }
}
