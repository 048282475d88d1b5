//! Stopping workers: graceful shutdown under load 20 times (7), SIGTERM to a
//! busy worker and a second SIGTERM while a handler hangs (12).

use std::time::{Duration, Instant};

use pgmq_client::QueueName;

use super::run::Run;
use crate::child::WorkerProc;
use crate::ctx::{poll_until, Ctx};
use crate::job::{Act, Job};
use crate::report::{Check, Row};
use crate::BoxError;

/// Messages of `q` that are invisible right now (claimed and not released).
async fn hidden(ctx: &Ctx, q: &QueueName) -> Result<i64, BoxError> {
    let conn = ctx.client.connection().await?;
    let sql = format!(
        "select count(*) from {} where vt > clock_timestamp()",
        q.quoted_table()
    );
    Ok(conn.query_one(sql.as_str(), &[]).await?.get(0))
}

/// Polls until no message of `q` is invisible; returns how long it took.
async fn until_all_visible(ctx: &Ctx, q: &QueueName, limit: Duration) -> Option<Duration> {
    let every = Duration::from_millis(5);
    poll_until(limit, every, || async {
        hidden(ctx, q).await.ok() == Some(0)
    })
    .await
}

/// 7: a worker under load stopped with SIGTERM, 20 times in a row; after each
/// stop every message it claimed but did not start is visible at once to the
/// next worker (the vt is 30 s, so an unreleased claim would show).
pub(crate) async fn graceful_repeated(ctx: &Ctx) -> Result<Row, BoxError> {
    let mut run = Run::start(ctx, "7").await?;
    let rounds = if ctx.quick { 5 } else { 20 };
    // Slow enough that the backlog lasts all rounds.
    let args = run.plain_backlog(30, if ctx.quick { 40 } else { 10 }).await;
    let mut clean = 0;
    let mut released = 0u64;
    let mut worst_visible = Duration::ZERO;
    let mut worst_stop = Duration::ZERO;
    let mut problems = Vec::new();
    for round in 1..=rounds {
        let w = run.spawn(&args).await?;
        tokio::time::sleep(Duration::from_millis(400)).await;
        let exit = w.stop(Duration::from_secs(30)).await?;
        worst_stop = worst_stop.max(exit.took);
        if exit.clean() {
            clean += 1;
        } else {
            problems.push(format!("round {round}: {}", exit.describe()));
        }
        released += exit
            .said
            .report
            .as_ref()
            .and_then(|r| r["released"].as_u64())
            .unwrap_or(0);
        match until_all_visible(ctx, &run.qs.q, Duration::from_secs(5)).await {
            Some(d) => worst_visible = worst_visible.max(d),
            None => problems.push(format!(
                "round {round}: claims still hidden 5 s after the exit"
            )),
        }
    }
    let before_drain = ctx.progress(run.label).await.unwrap_or(0);
    run.check(
        "every shutdown clean, claims visible at once",
        clean == rounds && problems.is_empty() && worst_visible < Duration::from_millis(500),
        format!(
            "{clean} of {rounds} exited 0 with a report, slowest SIGTERM-to-exit {} ms; \
             {released} unstarted claims released, all visible again at most {} ms after the exit (vt 30 s); \
             {before_drain} handled before a last worker drained the rest{}",
            worst_stop.as_millis(),
            worst_visible.as_millis(),
            if problems.is_empty() { String::new() } else { format!(" ({})", problems.join("; ")) }
        ),
    );
    let title = format!("graceful shutdown under load {rounds}x");
    Ok(run.finish_by(&title, &args).await?.row)
}

/// 12a: SIGTERM to a busy worker: it drains and exits 0; nothing is handled twice.
pub(crate) async fn sigterm_busy(ctx: &Ctx) -> Result<Row, BoxError> {
    let mut run = Run::start(ctx, "12a").await?;
    let args = run.plain_backlog(30, 2).await;
    let w = run.spawn(&args).await?;
    run.wait_handled(ctx.n as i64 / 3).await?;
    let exit = w.stop(Duration::from_secs(30)).await?;
    let visible = until_all_visible(ctx, &run.qs.q, Duration::from_secs(5)).await;
    run.check(
        "SIGTERM: drained and exited 0",
        exit.clean(),
        format!(
            "{}; report {}",
            exit.describe(),
            exit.said.report.clone().unwrap_or_default()
        ),
    );
    run.check(
        "unstarted claims released",
        visible.is_some(),
        match visible {
            Some(d) => format!("all visible {} ms after the exit (vt 30 s)", d.as_millis()),
            None => "claims still hidden 5 s after the exit".into(),
        },
    );
    Ok(run.finish_by("SIGTERM to a busy worker", &args).await?.row)
}

/// 12b: a second SIGTERM while a handler hangs forces the exit; the hung
/// message comes back after its vt and is handled by the next worker.
pub(crate) async fn second_sigterm(ctx: &Ctx) -> Result<Row, BoxError> {
    let mut run = Run::start(ctx, "12b").await?;
    let plain = (ctx.n / 10).max(100);
    let hang_key = plain as i64;
    let mut jobs = ctx.plain_jobs(plain);
    jobs.push(Job::with(hang_key, Act::hang_before(2)));
    run.produce(&jobs).await;
    let mut args = run.worker_args();
    args.set_vt_secs(3);
    // Longer than the test: only the second SIGTERM can end this shutdown.
    args.worker.settings.shutdown_grace_ms = Some(120_000);
    let w = run.spawn(&args).await?;
    run.wait_handled(plain as i64).await?;
    sigterm_twice(&mut run, w, args.vt_secs()).await?;
    let f = run
        .finish_by("second SIGTERM while a handler hangs", &args)
        .await?;
    let hung: Vec<i32> = f
        .handlings
        .iter()
        .filter(|h| h.key == hang_key)
        .map(|h| h.read_ct)
        .collect();
    let mut row = f.row;
    row.push_check(Check::new(
        "hung message handled once, on a later attempt",
        hung.len() == 1 && hung[0] >= 2,
        format!("{} handling(s), read_ct {hung:?}", hung.len()),
    ));
    Ok(row)
}

/// 12b's faults: a SIGTERM to `w` (whose handler hangs), a second one 1.5 s
/// later, then the hung message's return; checks each step.
async fn sigterm_twice(run: &mut Run<'_>, mut w: WorkerProc, vt_secs: u64) -> Result<(), BoxError> {
    let ctx = run.ctx;
    w.sigterm().await?;
    let draining = w.wait_draining(Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let still_waiting = w.running();
    let t = Instant::now();
    w.sigterm().await?;
    let exit = w.wait(Duration::from_secs(10)).await?;
    let forced_in = t.elapsed();
    let back = wait_visible(ctx, &run.qs.q, Duration::from_secs(vt_secs + 10)).await;
    run.check(
        "first SIGTERM waits for the hung handler",
        draining && still_waiting,
        format!("draining: {draining}; still running 1.5 s later: {still_waiting}"),
    );
    // The escalation is pgmq-worker's own (`ShutdownHandle::immediate` on
    // the second SIGTERM): the shutdown returns its report with the hung
    // handler abandoned, and only then does the process exit (code 3).
    let report = exit.said.report.clone().unwrap_or_default();
    let abandoned = report["abandoned"].as_array().map_or(0, Vec::len);
    run.check(
        "second SIGTERM escalates the SDK's shutdown",
        crate::child::forced(&exit) && abandoned == 1 && forced_in < Duration::from_secs(2),
        format!(
            "{} {} ms after the second SIGTERM; report: immediate {}, abandoned {abandoned} \
             handler(s), {} released, {} acked",
            exit.status,
            forced_in.as_millis(),
            report["immediate"],
            report["released"],
            report["acked"]
        ),
    );
    run.check(
        "hung message back after its vt",
        back.is_some(),
        match back {
            Some(d) => format!(
                "visible again {:.1} s after the forced exit (vt {} s)",
                d.as_secs_f64(),
                vt_secs
            ),
            None => "not visible again".into(),
        },
    );
    Ok(())
}

/// Polls until some message of `q` is visible.
async fn wait_visible(ctx: &Ctx, q: &QueueName, limit: Duration) -> Option<Duration> {
    poll_until(limit, Duration::from_millis(20), || async {
        ctx.client
            .metrics(q)
            .await
            .is_ok_and(|m| m.queue_visible_length > 0)
    })
    .await
}
