//! Crashes around a consuming worker: the server killed (1), the worker
//! SIGKILLed (2), its connections cut (3); two workers sharing a queue (8);
//! the worker killed in the middle of an acknowledgement batch (16).

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::run::{outage_tolerant, Run};
use crate::ctx::{sample_running, Ctx};
use crate::ledger::cross_process;
use crate::report::{Check, Row};
use crate::BoxError;

/// 1: `pg_ctl stop -m immediate` three times during a consume, restarting
/// each time. Each kill is made to land while an acknowledgement is in
/// flight: the suite locks the messages the worker holds, waits until
/// `pg_stat_activity` shows one of its acknowledgements waiting on that lock,
/// and kills the server then.
pub(crate) async fn server_killed(ctx: &Ctx) -> Result<Row, BoxError> {
    let mut run = Run::start(ctx, "1").await?;
    run.produce_plain(ctx.n).await;
    let mut args = outage_tolerant(run.worker_args());
    // Slow enough (8 handlers: about 400 a second) that a quarter of the
    // messages outlasts the restart and the lock's tries: with 1 ms
    // handlers on a loaded host, the worker could finish the rest between
    // the quarter being seen and the lock, leaving no acknowledgement to
    // block.
    args.sleep_ms = 20;
    let w = run.spawn(&args).await?;
    let mut kills = Vec::new();
    let mut landed = 0;
    for i in 1..=3 {
        let at = run.wait_quarter(i).await?;
        let (hold, tries) = super::run::block_an_ack(ctx, &run.qs.q, 5).await?;
        // Sampled at the kill: the acknowledgements running, and waiting.
        let (acks, waiting) = super::run::acks_in_flight(ctx).await?;
        let held = run.held_keys().await?;
        let t = Instant::now();
        ctx.cluster.kill().await?;
        drop(hold);
        if waiting > 0 {
            landed += 1;
        }
        run.allow_fault(&format!("kill {i}"), &held, &args);
        tokio::time::sleep(Duration::from_millis(1000)).await;
        ctx.cluster.restart_after_kill().await?;
        ctx.wait_server(Duration::from_secs(60)).await?;
        kills.push(format!(
            "kill {i} after {at} handlings with {acks} acknowledgement(s) in flight \
             ({waiting} waiting on the suite's lock; try {tries}), {} messages held; back in {} ms",
            held.len(),
            t.elapsed().as_millis()
        ));
    }
    run.check(
        "3 kills landed while acknowledgements were in flight",
        landed == 3,
        kills.join("; "),
    );
    Ok(run.finish("server killed 3x mid-ack", vec![w]).await?.row)
}

/// 2: the worker SIGKILLed twice while it holds claims, and restarted; its
/// claims come back after the visibility timeout, and only they can be
/// handled twice.
pub(crate) async fn worker_killed(ctx: &Ctx) -> Result<Row, BoxError> {
    let mut run = Run::start(ctx, "2").await?;
    // Slow enough (8 handlers: about 400 a second) that the messages left
    // after the first redelivery are still being worked when the second
    // kill lands.
    let args = run.plain_backlog(3, 20).await;
    let mut w = run.spawn(&args).await?;
    let mut notes = Vec::new();
    let mut holding = 0;
    for i in 1..=2 {
        let at = run.wait_handled(ctx.n as i64 * i / 3).await?;
        let (killed_at, exit, held) = kill_holding(&run, w).await?;
        if !held.is_empty() {
            holding += 1;
        }
        run.allow_held(&held, format!("SIGKILL {i}: {} claims held", held.len()));
        notes.push(format!(
            "SIGKILL {i} after {at} handlings ({}), holding {} claims",
            exit.status,
            held.len()
        ));
        w = run.spawn(&args).await?;
        // Its claims reappear only when their vt ends: the first redelivery
        // (read_ct > 1) read after the kill shows when.
        let limit = Duration::from_secs(args.vt_secs() + 10);
        notes.push(
            match first_redelivery(ctx, run.label, killed_at, limit).await {
                Some(after) => format!(
                    "first redelivery read {:.1} s after the kill (vt {} s)",
                    after.as_secs_f64(),
                    args.vt_secs()
                ),
                None => "no redelivery seen".into(),
            },
        );
    }
    run.check(
        "killed twice while holding claims",
        holding == 2,
        notes.join("; "),
    );
    let f = run.finish("worker SIGKILLed 2x", vec![w]).await?;
    let redelivered = f.handlings.iter().filter(|h| h.read_ct > 1).count();
    let mut row = f.row;
    row.push_check(Check::new(
        "killed worker's claims came back",
        redelivered > 0,
        format!("{redelivered} handlings of redelivered messages (read_ct > 1)"),
    ));
    Ok(row)
}

/// SIGKILLs `w` while it holds claims (it is looked at until it does,
/// between two reads it may hold none for a moment, for at most a second);
/// returns when, how it exited, and the keys it held: the invisible
/// messages once a read it left in flight has had time to finish in the
/// server (their vt is 3 s, so none has expired yet), before the next
/// worker claims any.
async fn kill_holding(
    run: &Run<'_>,
    w: crate::child::WorkerProc,
) -> Result<
    (
        DateTime<Utc>,
        pgmq_testkit::child::Exit<serde_json::Value, serde_json::Value>,
        Vec<i64>,
    ),
    BoxError,
> {
    for _ in 0..200 {
        if !run.held_keys().await?.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let killed_at = Utc::now();
    let exit = w.sigkill().await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok((killed_at, exit, run.held_keys().await?))
}

/// How long after `since` a redelivered message (read_ct > 1) was first
/// read again, as the ledger shows once it is handled.
async fn first_redelivery(
    ctx: &Ctx,
    label: &str,
    since: DateTime<Utc>,
    limit: Duration,
) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if let Ok(conn) = ctx.client.connection().await {
            let row = conn
                .query_one(
                    "select min(read_at) from pgmq_fault_ledger \
                     where run_id = $1 and scenario = $2 and read_ct > 1 and read_at > $3",
                    &[&ctx.run_id, &label, &since],
                )
                .await;
            if let Ok(Some(at)) = row.map(|r| r.get::<_, Option<DateTime<Utc>>>(0)) {
                return (at - since).to_std().ok();
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// 3: every connection of the worker cut by the proxy three times, with new
/// connections refused for a second each time.
pub(crate) async fn connections_cut(ctx: &Ctx) -> Result<Row, BoxError> {
    let mut run = Run::start(ctx, "3").await?;
    run.produce_plain(ctx.n).await;
    let proxy = ctx.start_proxy().await?;
    let args = outage_tolerant(run.worker_args());
    let w = ctx
        .spawn_worker_via(&args, &ctx.proxied_dsn(&proxy), None)
        .await?;
    let mut notes = Vec::new();
    for i in 1..=3 {
        run.wait_quarter(i).await?;
        let held = run.held_keys().await?;
        run.allow_fault(&format!("cut {i}"), &held, &args);
        proxy.set_accepting(false);
        let cut = proxy.cut_all();
        tokio::time::sleep(Duration::from_secs(1)).await;
        proxy.set_accepting(true);
        notes.push(format!("cut {i}: {cut} connections"));
    }
    let (cut_total, refused) = proxy.totals();
    run.check(
        "connections cut 3 times mid-consume",
        cut_total > 0,
        format!(
            "{}; {refused} connection attempts refused meanwhile",
            notes.join(", ")
        ),
    );
    let row = run.finish("connections cut 3x (proxy)", vec![w]).await?.row;
    drop(proxy);
    Ok(row)
}

/// 8: two worker processes on one queue: no message held by both at once.
pub(crate) async fn two_workers(ctx: &Ctx) -> Result<Row, BoxError> {
    let mut run = Run::start(ctx, "8").await?;
    run.produce_plain(ctx.n).await;
    let mut args = run.worker_args();
    args.sleep_ms = 1;
    let a = run.spawn(&args).await?;
    let b = run.spawn(&args).await?;
    let pids = [a.pid() as i32, b.pid() as i32];
    let f = run.finish("two workers, one queue", vec![a, b]).await?;
    let per = pids.map(|p| f.handlings.iter().filter(|h| h.worker_pid == p).count());
    let x = cross_process(&f.handlings);
    let mut row = f.row;
    row.push_check(Check::new(
        "both workers consumed",
        per[0] > 0 && per[1] > 0,
        format!("{} and {} handlings", per[0], per[1]),
    ));
    row.push_check(Check::new(
        "no message held by both within its vt",
        x.read_inside_vt == 0 && x.windows_overlap == 0,
        format!(
            "{} reads inside another process's vt, {} overlapping handling windows",
            x.read_inside_vt, x.windows_overlap
        ),
    ));
    Ok(row)
}

/// 16: the worker SIGKILLed while an acknowledgement batch of its waits on a
/// row lock (held by the suite), made deterministic: the kill lands in the
/// middle of the batch every time. The batch's messages are handled and not
/// yet deleted; they come back after their vt (or the orphaned delete
/// finishes once the lock goes), and none is lost.
pub(crate) async fn killed_mid_ack(ctx: &Ctx) -> Result<Row, BoxError> {
    let mut run = Run::start(ctx, "16").await?;
    let args = run.plain_backlog(3, 1).await;
    let w = run.spawn(&args).await?;
    run.wait_quarter(1).await?;
    let (hold, tries) = super::run::block_an_ack(ctx, &run.qs.q, 5).await?;
    let (acks, waiting) = super::run::acks_in_flight(ctx).await?;
    let exit = w.sigkill().await?;
    // The worker is gone; its delete still waits in the server. Everything it
    // held is what may come back and be handled again.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut held = run.held_keys().await?;
    held.extend(hold.keys.iter().copied());
    held.sort_unstable();
    held.dedup();
    let locked = hold.keys.len();
    hold.release().await;
    run.allow_held(
        &held,
        format!("SIGKILL mid-ack: {} messages held", held.len()),
    );
    run.check(
        "killed while an acknowledgement batch waited",
        waiting > 0,
        format!(
            "{acks} acknowledgement(s) in flight at the SIGKILL, {waiting} waiting on the lock \
             over {locked} held messages (try {tries}); {}",
            exit.status
        ),
    );
    Ok(run
        .finish_by("worker killed mid-ack batch", &args)
        .await?
        .row)
}

/// 20: one worker under a fleet-wide limit of 4 places (8 handlers of 10
/// ms, vt 3 s) SIGKILLed at a third of the handlings while it holds
/// places; a second worker with the same limit started at once. The
/// queue table is sampled every 10 ms for the claims running.
pub(crate) async fn fleet_limit_killed(ctx: &Ctx) -> Result<Row, BoxError> {
    const PLACES: u32 = 4;
    ctx.client.install_sdk_schema().await?;
    let mut run = Run::start(ctx, "20").await?;
    // 4 places of 10 ms each: about 400 handlings a second.
    let n = ctx.n.min(2_000);
    run.produce_plain(n).await;
    let mut args = run.worker_args();
    args.set_vt_secs(3);
    args.sleep_ms = 10;
    args.worker.settings.fleet_limit = Some(PLACES);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let sampler = sample_running(
        ctx.cluster.dsn(),
        (run.qs.q.quoted_table(), None),
        i64::from(PLACES),
        Duration::from_millis(10),
        stopped,
    );
    let w = run.spawn(&args).await?;
    let at = run.wait_handled(n as i64 / 3).await?;
    let (killed_at, exit, held) = kill_holding(&run, w).await?;
    run.allow_held(&held, format!("SIGKILL: {} places held", held.len()));
    let w = run.spawn(&args).await?;
    let freed = first_redelivery(
        ctx,
        run.label,
        killed_at,
        Duration::from_secs(args.vt_secs() + 10),
    )
    .await;
    run.check(
        "killed while holding places",
        !held.is_empty(),
        format!(
            "SIGKILL after {at} handlings ({}), holding {} places",
            exit.status,
            held.len()
        ),
    );
    run.check(
        "the dead worker's places freed within its vt",
        freed.is_some_and(|d| d <= Duration::from_secs(args.vt_secs() + 2)),
        match freed {
            Some(d) => format!(
                "its first message read again {:.1} s after the kill (vt {} s)",
                d.as_secs_f64(),
                args.vt_secs()
            ),
            None => "no message of the dead worker read again".into(),
        },
    );
    let f = run
        .finish("fleet limit: worker SIGKILLed holding places", vec![w])
        .await?;
    let _ = stop.send(true);
    let most = sampler.await.map_or(i64::MAX, |s| s.most);
    let mut row = f.row;
    row.push_check(Check::new(
        "never more claims running than the limit",
        most <= i64::from(PLACES),
        format!("at most {most} running in the 10 ms samples (limit {PLACES})"),
    ));
    Ok(row)
}
