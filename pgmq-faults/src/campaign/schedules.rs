//! The periodic-sends cell, after the last seed: a schedule ticking every
//! second, fired by three worker processes that each run a scheduler
//! (pgmq-worker's `Scheduler`, beside the worker), through a SIGKILL of
//! one (started again a second later), a SIGSTOP of another (continued
//! two seconds later) and a PostgreSQL crash (down two seconds, so no
//! scheduler can send and ticks are missed). Then the schedule is paused
//! and the target queue's messages judged by their tick header
//! ([`pgmq_client::TICK_HEADER`]):
//!
//! - **each tick sent once**: no tick has two messages;
//! - **no tick lost once a scheduler runs again**: the ticks run a second
//!   apart without a gap, from the first tick after the schedule was
//!   created to within two seconds of the pause (the missed ticks are
//!   caught up, under a catch-up bound larger than the gap).
//!
//! With `schedule-unfenced` the schedulers send a tick outside the
//! statement that moves the schedule past it: ticks are sent twice.

use std::time::Duration;

use chrono::{DateTime, Utc};
use pgmq_client::{Cadence, Schedule, TICK_HEADER};

use crate::child::WorkerProc;
use crate::ctx::Ctx;
use crate::report::Check;
use crate::worker::{FaultSpec, Sabotage};
use crate::BoxError;

/// The schedule's interval.
const TICK: Duration = Duration::from_secs(1);

/// How far before the pause the last tick may be: one tick, a scheduler's
/// pass, and a loaded machine.
const LAST_TICK_SLACK: chrono::Duration = chrono::Duration::milliseconds(2500);

/// The cell's verdicts.
pub(crate) async fn schedule_cell(ctx: &Ctx, sabotage: &[Sabotage]) -> Vec<Check> {
    match run(ctx, sabotage).await {
        Ok(ticks) => judge(&ticks),
        Err(e) => vec![Check::could_not_run(
            "each tick sent once",
            "the periodic-sends cell",
            e,
        )],
    }
}

/// What the cell ran: the ticks of the target queue's messages (in id
/// order), when the schedule was created and when it was paused, by the
/// database's clock.
struct Ticks {
    ticks: Vec<DateTime<Utc>>,
    created: DateTime<Utc>,
    paused: DateTime<Utc>,
}

async fn run(ctx: &Ctx, sabotage: &[Sabotage]) -> Result<Ticks, BoxError> {
    let scenario = "cs";
    let qs = ctx.queues(scenario).await?;
    let target = ctx.queues("cst").await?;
    let name = format!("campaign-{}", ctx.run_id);
    let result = async {
        ctx.client.install_sdk_schema().await?;
        let schedule = Schedule::new(&name, target.q.clone(), Cadence::every(TICK)?)?
            .message(serde_json::json!({"cell": "periodic sends"}))
            .catch_up(1000);
        ctx.client.put_schedule(&schedule).await?;
        let created = ctx
            .client
            .schedules()
            .await?
            .into_iter()
            .find(|s| s.name == name)
            .ok_or("the schedule is not listed")?
            .changed_at;
        let mut spec = FaultSpec::for_queue(&qs.q, &qs.dlq, &ctx.run_id, scenario);
        spec.scheduler_poll_ms = Some(100);
        spec.worker.settings.concurrency = Some(1);
        spec.worker.application_name = Some("pgmq-campaign-scheduler".into());
        if sabotage.contains(&Sabotage::ScheduleUnfenced) {
            spec.sabotage = vec![Sabotage::ScheduleUnfenced];
        }
        let mut procs: Vec<WorkerProc> = Vec::new();
        for _ in 0..3 {
            procs.push(ctx.spawn_worker(&spec).await?);
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // A scheduler killed, another started a second later.
        let killed = procs.remove(0);
        killed.sigkill().await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        procs.push(ctx.spawn_worker(&spec).await?);
        // A scheduler frozen for two seconds.
        procs[0].sigstop().await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        procs[0].sigcont().await?;
        // The server crashes and stays down two seconds.
        ctx.cluster.kill().await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        ctx.cluster.restart_after_kill().await?;
        ctx.wait_server(Duration::from_secs(60)).await?;
        tokio::time::sleep(Duration::from_millis(3000)).await;
        ctx.client.pause_schedule(&name).await?;
        let paused = now(ctx).await?;
        for p in procs {
            let _ = p.stop(Duration::from_secs(10)).await;
        }
        let ticks = ticks_of(ctx, &target.q).await?;
        Ok::<_, BoxError>(Ticks {
            ticks,
            created,
            paused,
        })
    }
    .await;
    let _ = ctx.client.remove_schedule(&name).await;
    ctx.drop_queues(&qs).await;
    ctx.drop_queues(&target).await;
    result
}

/// The database's clock.
async fn now(ctx: &Ctx) -> Result<DateTime<Utc>, BoxError> {
    let conn = ctx.client.connection().await?;
    Ok(conn
        .query_one("select clock_timestamp()", &[])
        .await?
        .get(0))
}

/// The tick header of every message of `q`, by message id.
async fn ticks_of(ctx: &Ctx, q: &pgmq_client::QueueName) -> Result<Vec<DateTime<Utc>>, BoxError> {
    let msgs = ctx.client.peek_raw(q, 10_000).await?;
    let mut out = Vec::with_capacity(msgs.len());
    for m in msgs {
        let tick = m
            .headers
            .as_ref()
            .and_then(|h| h.get(TICK_HEADER))
            .and_then(|t| t.as_str())
            .ok_or("a message without its tick header")?;
        out.push(DateTime::parse_from_rfc3339(tick)?.with_timezone(&Utc));
    }
    Ok(out)
}

/// The cell's two checks on what it ran.
fn judge(t: &Ticks) -> Vec<Check> {
    let mut sorted = t.ticks.clone();
    sorted.sort();
    let n = sorted.len();
    let mut twice: Vec<DateTime<Utc>> = sorted
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    twice.dedup();
    sorted.dedup();
    let step = chrono::Duration::from_std(TICK).unwrap_or_default();
    let gaps = sorted.windows(2).filter(|w| w[1] - w[0] != step).count();
    let first_ok = sorted
        .first()
        .is_some_and(|f| *f > t.created && *f <= t.created + step);
    let last_ok = sorted
        .last()
        .is_some_and(|l| *l >= t.paused - LAST_TICK_SLACK);
    vec![
        Check::new(
            "each tick sent once",
            twice.is_empty() && n > 0,
            format!(
                "{n} messages for {} ticks across a SIGKILL, a SIGSTOP and a PostgreSQL crash; \
                 {} ticks sent more than once{}",
                sorted.len(),
                twice.len(),
                twice
                    .first()
                    .map(|d| format!(" (the first {})", pgmq_client::tick_key(*d)))
                    .unwrap_or_default()
            ),
        ),
        Check::new(
            "no tick lost once a scheduler runs again",
            gaps == 0 && first_ok && last_ok,
            format!(
                "ticks from {} to {} (schedule created {}, paused {}); {gaps} gaps between \
                 ticks; first tick the first after the creation: {first_ok}; last within \
                 {} ms of the pause: {last_ok}",
                sorted
                    .first()
                    .map(|d| pgmq_client::tick_key(*d))
                    .unwrap_or_default(),
                sorted
                    .last()
                    .map(|d| pgmq_client::tick_key(*d))
                    .unwrap_or_default(),
                pgmq_client::tick_key(t.created),
                pgmq_client::tick_key(t.paused),
                LAST_TICK_SLACK.num_milliseconds()
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    fn verdicts(ticks: &[i64]) -> Vec<bool> {
        judge(&Ticks {
            ticks: ticks.iter().map(|s| at(*s)).collect(),
            created: at(0) - chrono::Duration::milliseconds(300),
            paused: at(*ticks.last().unwrap_or(&0)) + chrono::Duration::milliseconds(500),
        })
        .iter()
        .map(|c| c.pass)
        .collect()
    }

    #[test]
    fn a_tick_twice_or_a_gap_fails() {
        assert_eq!(verdicts(&[0, 1, 2, 3]), [true, true]);
        assert_eq!(verdicts(&[0, 1, 1, 2]), [false, true]);
        assert_eq!(verdicts(&[0, 1, 3]), [true, false]);
        assert_eq!(verdicts(&[1, 2, 3]), [true, false]);
        assert_eq!(verdicts(&[]), [false, false]);
    }
}
