//! Outages a worker must ride out without losing anything: the network
//! silently dropping everything (13), the worker's process frozen past its
//! visibility timeout while another runs (14), the database down past the
//! visibility timeout (17), and the database refusing writes (18).

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::run::{outage_tolerant, Finished, Run};
use crate::child::WorkerProc;
use crate::ctx::{poll_until, session, Ctx};
use crate::ledger;
use crate::report::{Check, Row};
use crate::worker::FaultSpec;
use crate::BoxError;

/// Waits until the worker's `counter` (from its `stats` lines) exceeds
/// `above`; how long that took, or None after `limit`.
async fn until_counter(
    w: &WorkerProc,
    counter: &str,
    above: u64,
    limit: Duration,
) -> Option<Duration> {
    let every = Duration::from_millis(20);
    poll_until(limit, every, || async { w.said().stat(counter) > above }).await
}

/// Messages sent once a fault is over, to prove the worker resumed.
const RESUME_PROBE: usize = 100;

/// Sends [`RESUME_PROBE`] fresh messages, then waits (up to 60 s) for the
/// worker's `deleted` counter to rise above `deleted`. The worker may have
/// acknowledged every message of the scenario before the fault landed
/// (1,000 messages can drain in a few milliseconds); messages sent after the
/// fault must be claimed and acknowledged whatever the timing, so the check
/// can only pass if the worker really resumed.
async fn resumed_after_fault(run: &mut Run<'_>, w: &WorkerProc, deleted: u64) -> Option<Duration> {
    run.produce_after_fault(RESUME_PROBE).await;
    until_counter(w, "deleted", deleted, Duration::from_secs(60)).await
}

/// The worker's count of failed database calls (reads and acknowledgements).
fn errors_seen(w: &WorkerProc) -> u64 {
    let s = w.said();
    s.stat("read_errors") + s.stat("ack_retries") + s.stat("acks_failed")
}

/// 13: the proxy blackholes the worker's queue connections (nothing
/// forwarded either way, nothing closed) for longer than the visibility
/// timeout, then forwards again. The ledger's connection goes straight to
/// the server, so that only the queue's path is cut.
pub(crate) async fn blackhole(ctx: &Ctx) -> Result<Row, BoxError> {
    let mut run = Run::start(ctx, "13").await?;
    run.produce_plain(ctx.n).await;
    let proxy = ctx.start_proxy().await?;
    let mut args = outage_tolerant(run.worker_args());
    args.set_vt_secs(3);
    args.stats_ms = 50;
    // pgmq-worker's bound on every database call (10 s by default), shorter
    // here so that a blackhole twice as long fits the suite's time.
    args.worker.settings.db_timeout_ms = Some(2_000);
    let db_timeout = Duration::from_millis(args.worker.settings.db_timeout_ms.unwrap_or(0));
    let w = ctx
        .spawn_worker_via(&args, &ctx.proxied_dsn(&proxy), Some(&ctx.cluster.dsn()))
        .await?;
    run.wait_quarter(1).await?;
    let held = run.held_keys().await?;
    run.allow_fault("blackhole", &held, &args);
    let errors_before = errors_seen(&w);
    let hold = Duration::from_secs(args.vt_secs() + 3).max(db_timeout * 3);
    proxy.set_blackhole(true);
    let t = Instant::now();
    let mut noticed = None;
    while t.elapsed() < hold {
        if noticed.is_none() && errors_seen(&w) > errors_before {
            noticed = Some(t.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let open = proxy.live();
    let deleted = w.said().stat("deleted");
    proxy.set_blackhole(false);
    let resumed = resumed_after_fault(&mut run, &w, deleted).await;
    // Noticed: a call failed within its db_timeout (plus a second of slack
    // for a loaded machine), not after the kernel's retransmission timeout.
    let in_time = noticed.is_some_and(|d| d <= db_timeout + Duration::from_secs(1));
    run.check(
        "noticed within db_timeout, resumed after the blackhole",
        in_time && resumed.is_some() && open > 0,
        format!(
            "blackholed {} s (vt {} s, db_timeout {} ms) with {open} connections held open; {}; {}",
            hold.as_secs(),
            args.vt_secs(),
            args.worker.settings.db_timeout_ms.unwrap_or(0),
            match noticed {
                Some(d) => format!(
                    "the worker noticed (a failed call) after {:.1} s",
                    d.as_secs_f64()
                ),
                None => "the worker saw no failed call during the blackhole".into(),
            },
            match resumed {
                Some(d) => format!(
                    "acknowledging again {:.2} s after the network came back",
                    d.as_secs_f64()
                ),
                None => "no acknowledgement within 60 s of the network coming back".into(),
            }
        ),
    );
    let row = run
        .finish("network blackhole past the vt", vec![w])
        .await?
        .row;
    drop(proxy);
    Ok(row)
}

/// 14: two workers on one queue; one is frozen with SIGSTOP (a paused VM or
/// container) for longer than the visibility timeout, then SIGCONT. The
/// other takes over its claims. Each handler's start and end is in the
/// ledger, so that two handlers of one message running at once are seen.
pub(crate) async fn paused_worker(ctx: &Ctx) -> Result<Row, BoxError> {
    let mut run = Run::start(ctx, "14").await?;
    let mut args = run.plain_backlog(3, 2).await;
    args.worker.settings.heartbeat = Some(true);
    args.record_starts = true;
    let a = run.spawn(&args).await?;
    let b = run.spawn(&args).await?;
    let (pa, pb) = (a.pid() as i32, b.pid() as i32);
    run.wait_quarter(1).await?;
    let pause = pause_past_vt(&mut run, &a, args.vt_secs()).await?;
    let f = run
        .finish("worker paused (SIGSTOP) past its vt", vec![a, b])
        .await?;
    let windows = ledger::windows(&ctx.client, &ctx.run_id, "14").await?;
    let checks = [
        claims_lost_check(&f, pa),
        takeover_check(&f, pb, &pause),
        live_overlap_check(&windows, pa, &pause),
        dead_letter_check(&f, pb),
    ];
    let mut row = f.row;
    for c in checks {
        row.push_check(c);
    }
    Ok(row)
}

/// How scenario 14 froze its first worker.
struct Pause {
    /// When the frozen worker's last read had surely finished in the server.
    stopped_at: DateTime<Utc>,
    /// Taken just before the SIGCONT.
    resumed_at: DateTime<Utc>,
    /// How long the worker was frozen.
    length: Duration,
    /// Messages held by both workers at the SIGSTOP.
    held: usize,
    vt_secs: u64,
}

/// SIGSTOPs worker `a` for the visibility timeout and 3 s, allows the
/// duplicates of the messages held then, and SIGCONTs it.
async fn pause_past_vt(run: &mut Run<'_>, a: &WorkerProc, vt_secs: u64) -> Result<Pause, BoxError> {
    a.sigstop().await?;
    // Every message the frozen worker holds, once a read it left in flight
    // has finished in the server (the other worker's claims are in it too:
    // an upper bound). From then on nothing it sent before the signal is
    // still being executed: a handler start recorded before this instant
    // belongs to a handler the SIGSTOP froze.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stopped_at = Utc::now();
    let held = run.held_keys().await?;
    run.allow_held(
        &held,
        format!("SIGSTOP: {} messages held by both workers", held.len()),
    );
    let length = Duration::from_secs(vt_secs + 3);
    tokio::time::sleep(length.saturating_sub(Duration::from_millis(200))).await;
    // Taken before the signal: the frozen handlers end as soon as it lands.
    let resumed_at = Utc::now();
    a.sigcont().await?;
    Ok(Pause {
        stopped_at,
        resumed_at,
        length,
        held: held.len(),
        vt_secs,
    })
}

/// The paused worker (`pa`) reports lost claims in its shutdown report.
fn claims_lost_check(f: &Finished, pa: i32) -> Check {
    let lost_claims = f
        .exits
        .iter()
        .filter_map(|e| e.said.report.as_ref())
        .find(|r| r["pid"].as_i64() == Some(i64::from(pa)))
        .map(|r| r["claims_lost"].as_u64().unwrap_or(0));
    Check::new(
        "the paused worker reports its claims lost",
        lost_claims.is_some_and(|n| n > 0),
        match lost_claims {
            Some(n) => format!("claims_lost {n} in its shutdown report"),
            None => "no shutdown report from the paused worker".into(),
        },
    )
}

/// The running worker (`pb`) handled redelivered messages.
fn takeover_check(f: &Finished, pb: i32, pause: &Pause) -> Check {
    let taken_over = f
        .handlings
        .iter()
        .filter(|h| h.worker_pid == pb && h.read_ct > 1)
        .count();
    Check::new(
        "the running worker took over the frozen one's claims",
        taken_over > 0,
        format!(
            "{} s frozen (vt {} s), {} messages held then; {taken_over} redelivered messages handled by the running worker",
            pause.length.as_secs(),
            pause.vt_secs,
            pause.held
        ),
    )
}

/// No two handler windows of one message overlap, except those of a handler
/// of the paused worker (`pa`) frozen mid-run.
fn live_overlap_check(windows: &[ledger::Window], pa: i32, pause: &Pause) -> Check {
    let Pause {
        stopped_at,
        resumed_at,
        ..
    } = *pause;
    let pairs = ledger::overlapping(windows);
    // A handler of the paused worker frozen mid-run (started before the
    // SIGSTOP, ended after the SIGCONT) overlaps whoever took its message
    // over: nothing a worker can prevent in a process that is not running.
    // Any other overlap means two live handlers held one message.
    let frozen = |w: &ledger::Window| {
        w.worker_pid == pa && w.start < stopped_at && w.end.is_none_or(|e| e > resumed_at)
    };
    let others: Vec<String> = pairs
        .iter()
        .filter(|(x, y)| !frozen(x) && !frozen(y))
        .map(|(x, y)| {
            let at = |w: &ledger::Window| {
                format!(
                    "pid {} {:+} to {} ms",
                    w.worker_pid,
                    (w.start - stopped_at).num_milliseconds(),
                    w.end.map_or("-".into(), |e| format!(
                        "{:+}",
                        (e - stopped_at).num_milliseconds()
                    ))
                )
            };
            format!("key {}: {} / {}", x.key, at(x), at(y))
        })
        .collect();
    let other = others.len();
    let unended = windows.iter().filter(|w| w.end.is_none()).count();
    Check::new(
        "no message run by two live handlers at once",
        other == 0,
        format!(
            "{} handler starts recorded ({unended} without an end); {} overlapping pairs, {} of them \
             a handler frozen mid-run by the SIGSTOP, {other} others{}",
            windows.len(),
            pairs.len(),
            pairs.len() - other,
            if others.is_empty() {
                String::new()
            } else {
                format!(" (times from the SIGSTOP: {})", others.join("; "))
            }
        ),
    )
}

/// Nothing the running worker (`pb`) handled ended in the dead-letter queue.
fn dead_letter_check(f: &Finished, pb: i32) -> Check {
    let handled_by_b: std::collections::HashSet<i64> = f
        .handlings
        .iter()
        .filter(|h| h.worker_pid == pb)
        .map(|h| h.key)
        .collect();
    let dead_and_b = f.dead.iter().filter(|k| handled_by_b.contains(k)).count();
    Check::new(
        "nothing dead-lettered that the running worker handled",
        dead_and_b == 0,
        format!(
            "{dead_and_b} of {} dead letters were handled by the running worker",
            f.dead.len()
        ),
    )
}

/// 17: the database killed and kept down for longer than the visibility
/// timeout, under a worker with pgmq-worker's default settings (except the
/// visibility timeout, 3 s instead of 30 s so that the outage fits the
/// suite's time).
pub(crate) async fn database_down(ctx: &Ctx) -> Result<Row, BoxError> {
    let mut run = Run::start(ctx, "17").await?;
    run.produce_plain(ctx.n).await;
    let mut args = run.worker_args();
    args.worker.settings = FaultSpec::sdk_defaults(3_000, &run.qs.dlq);
    args.stats_ms = 50;
    let mut w = run.spawn(&args).await?;
    run.wait_quarter(1).await?;
    let held = run.held_keys().await?;
    run.allow_fault("database down", &held, &args);
    let down = Duration::from_secs(args.vt_secs() + 3);
    let t = Instant::now();
    ctx.cluster.kill().await?;
    tokio::time::sleep(down).await;
    let deleted = w.said().stat("deleted");
    ctx.cluster.restart_after_kill().await?;
    ctx.wait_server(Duration::from_secs(60)).await?;
    let back = t.elapsed();
    let resumed = resumed_after_fault(&mut run, &w, deleted).await;
    let alive = w.running();
    run.check(
        "rode out the outage and resumed",
        alive && resumed.is_some(),
        format!(
            "down {:.1} s (vt {} s, worker defaults otherwise), {} messages held at the kill; \
             worker running: {alive}; {}",
            back.as_secs_f64(),
            args.vt_secs(),
            held.len(),
            match resumed {
                Some(d) => format!(
                    "acknowledging again {:.2} s after the server was back",
                    d.as_secs_f64()
                ),
                None => "no acknowledgement within 60 s of the server coming back".into(),
            }
        ),
    );
    Ok(run
        .finish("database down past the vt, default settings", vec![w])
        .await?
        .row)
}

/// Turns `default_transaction_read_only` on or off for the whole cluster
/// (`ALTER SYSTEM` and a reload: every session's next transaction sees it).
pub(crate) async fn read_only(ctx: &Ctx, on: bool) -> Result<(), BoxError> {
    let admin = session(&ctx.cluster.dsn(), "pgmq-faults-admin").await?;
    // This session stays writable whatever the cluster's default.
    admin
        .batch_execute("set default_transaction_read_only = off")
        .await?;
    let sql = if on {
        "alter system set default_transaction_read_only = on"
    } else {
        "alter system reset default_transaction_read_only"
    };
    admin.batch_execute(sql).await?;
    admin.batch_execute("select pg_reload_conf()").await?;
    Ok(())
}

/// 18: the database refuses every write (`default_transaction_read_only`
/// on, as a failover to a read-only standby or an operator's emergency
/// switch would) for longer than the visibility timeout, then accepts them
/// again.
pub(crate) async fn read_only_database(ctx: &Ctx) -> Result<Row, BoxError> {
    let mut run = Run::start(ctx, "18").await?;
    run.produce_plain(ctx.n).await;
    let mut args = outage_tolerant(run.worker_args());
    args.set_vt_secs(3);
    args.stats_ms = 50;
    let w = run.spawn(&args).await?;
    run.wait_quarter(1).await?;
    let held = run.held_keys().await?;
    run.allow_fault("read-only", &held, &args);
    let before = w.said();
    let window = Duration::from_secs(args.vt_secs() + 3);
    read_only(ctx, true).await?;
    tokio::time::sleep(window).await;
    let during = w.said();
    let deleted = during.stat("deleted");
    let restored = read_only(ctx, false).await;
    // Restore first, fail after: the rest of the suite needs a writable server.
    restored?;
    let resumed = resumed_after_fault(&mut run, &w, deleted).await;
    let read_errors = during.stat("read_errors") - before.stat("read_errors");
    let ack_retries = during.stat("ack_retries") - before.stat("ack_retries");
    let failed = during.stat("failed") - before.stat("failed");
    run.check(
        "refused writes retried, then resumed",
        read_errors + ack_retries > 0 && resumed.is_some(),
        format!(
            "read-only for {} s (vt {} s): {read_errors} failed reads ({:.1}/s: backed off), \
             {ack_retries} acknowledgement retries, {failed} handler runs failed (their ledger \
             write refused); {}",
            window.as_secs(),
            args.vt_secs(),
            read_errors as f64 / window.as_secs_f64(),
            match resumed {
                Some(d) => format!(
                    "acknowledging again {:.2} s after writes came back",
                    d.as_secs_f64()
                ),
                None => "no acknowledgement within 60 s of writes coming back".into(),
            }
        ),
    );
    Ok(run.finish("database refuses writes", vec![w]).await?.row)
}
