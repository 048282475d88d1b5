//! The short-handler priority cell, after the last seed: one worker
//! process runs a `WorkerGroup` of a high and a low queue under
//! `Priority::weighted()` (weights 3 and 1, 8 handlers, a visibility
//! timeout of 1 s) over a backlog on both queues, its handlers far shorter
//! than its reads. A trigger on each queue table makes every claim read
//! wait [`READ_WAIT_MS`] before it claims (the rows it claims get their
//! visibility timeout after the wait), so that the group's claims ahead of
//! its runs, what the handlers start during two reads, are bounded by a
//! quarter of the visibility timeout instead. A second trigger records
//! every delivery the database makes (a message's `read_ct` rising) with
//! its `last_read_at`.
//!
//! The invariant: every delivery the database recorded ran (its ledger row
//! carries that delivery's `last_read_at`), and the backlog drained. A
//! claim that waited locally for most of its visibility timeout would not
//! run: the worker gives it back unrun (its read undone) rather than start
//! a message another delivery may take, and the message is delivered
//! again.
//!
//! Its sabotage (`prio-ahead-past-vt`) drops the quarter of the visibility
//! timeout from the group's claims ahead: they then cover two reads of 1 s,
//! and the claims at their tail wait locally past three quarters of it.

use std::time::Duration;

use crate::ctx::{Ctx, Queues};
use crate::job::{Act, Job};
use crate::ledger;
use crate::report::Check;
use crate::worker::{FaultSpec, PrioSpec, Sabotage};
use crate::BoxError;

/// The invariant's name, as the campaign's document shows it.
pub(crate) const NAME: &str = "every claim of a short-handler group runs";

/// Messages of the backlog on the high and on the low queue: in the
/// weights' proportion, so that both last until the end of the drain.
const N: [i64; 2] = [450, 150];
/// How long a handler runs, milliseconds: far shorter than a read.
const RUN_MS: u64 = 35;
/// How long each claim read waits before it claims, milliseconds.
const READ_WAIT_MS: u64 = 1_000;
/// The group's visibility timeout, seconds.
const VT_SECS: u64 = 1;
/// How long the drain may take.
const LIMIT: Duration = Duration::from_secs(20);
/// The group's handler runs at once.
const GROUP_CONCURRENCY: usize = 8;
/// Each worker's handler loops and claim queue: far more than the
/// group's (its docs ask for at least as many), so that each worker's own
/// bound on its claims, a quarter of the visibility timeout at its own
/// concurrency, allows more than the group runs in that time, and the
/// group's bound is the one that holds its claims ahead.
const WORKER_CONCURRENCY: usize = 64;
const CLAIM_CAPACITY: usize = 400;
/// Each worker's claim loops: enough that while some read, another waits
/// at the group's gate for a grant.
const CLAIMERS: usize = 4;
/// The keys of the low queue's messages start here.
const LOW_BASE: i64 = 1_000_000;

/// Runs the cell; its check (failed when it could not run).
pub(crate) async fn prio_short_cell(ctx: &Ctx, sabotage: &[Sabotage]) -> Vec<Check> {
    let check = match run(ctx, sabotage).await {
        Ok(seen) => Check::new(
            NAME,
            seen.unrun.is_empty() && seen.handled.iter().zip(N).all(|(h, n)| *h >= n),
            format!(
                "a weighted group (3:1, {GROUP_CONCURRENCY} handlers of {RUN_MS} ms, reads waiting \
                 {READ_WAIT_MS} ms, vt {VT_SECS} s) drained {} of {} high and {} of {} low \
                 messages within {} s, the longest wait from a claim to its run {} ms; {} \
                 deliveries, {} of which never ran{}",
                seen.handled[0],
                N[0],
                seen.handled[1],
                N[1],
                LIMIT.as_secs(),
                seen.longest_wait_ms,
                seen.reads,
                seen.unrun.len(),
                if seen.unrun.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", e.g. messages {:?}",
                        &seen.unrun[..seen.unrun.len().min(4)]
                    )
                }
            ),
        ),
        Err(e) => Check::could_not_run(NAME, "the short-handler group", e),
    };
    vec![check]
}

/// What the cell saw: messages handled per queue (high, low), deliveries
/// the database made, and those that never ran (queue's scenario, message
/// id).
struct Seen {
    handled: [i64; 2],
    /// The longest time from a run's claim (`last_read_at`) to its start.
    longest_wait_ms: i64,
    reads: i64,
    unrun: Vec<(String, i64)>,
}

/// The ledger's scenarios of the high and the low queue.
const SCENARIOS: [&str; 2] = ["sh", "sl"];

async fn run(ctx: &Ctx, sabotage: &[Sabotage]) -> Result<Seen, BoxError> {
    let high = ctx.queues(SCENARIOS[0]).await?;
    let low = match ctx.queues(SCENARIOS[1]).await {
        Ok(q) => q,
        Err(e) => {
            ctx.drop_queues(&high).await;
            return Err(e);
        }
    };
    let result = drain(ctx, [&high, &low], sabotage).await;
    ctx.drop_queues(&high).await;
    ctx.drop_queues(&low).await;
    result
}

/// The triggers: each claim read waits, each delivery is recorded.
fn triggers(table: &str) -> String {
    format!(
        "create table if not exists pgmq_fault_cell_reads (
             tbl text not null, msg_id bigint not null, read_ct integer not null,
             read_at timestamptz);
         grant insert on pgmq_fault_cell_reads to public;
         create or replace function pgmq_fault_slow_read() returns trigger
             language plpgsql as $$ begin
                 perform pg_catalog.pg_sleep({wait});
                 return null;
             end $$;
         create or replace function pgmq_fault_log_read() returns trigger
             language plpgsql set search_path from current as $$ begin
                 insert into pgmq_fault_cell_reads
                 values (tg_table_name, new.msg_id, new.read_ct, new.last_read_at);
                 return null;
             end $$;
         create trigger slow_read before update on {table}
             for each statement execute function pgmq_fault_slow_read();
         create trigger log_read after update on {table}
             for each row when (new.read_ct > old.read_ct)
             execute function pgmq_fault_log_read();",
        wait = READ_WAIT_MS as f64 / 1000.0
    )
}

async fn drain(
    ctx: &Ctx,
    [high, low]: [&Queues; 2],
    sabotage: &[Sabotage],
) -> Result<Seen, BoxError> {
    ctx.client.install_sdk_schema().await?;
    let high_jobs: Vec<Job> = (0..N[0])
        .map(|k| Job::with(k, Act::sleep_ms(RUN_MS)))
        .collect();
    let low_jobs: Vec<Job> = (0..N[1])
        .map(|k| Job::with(LOW_BASE + k, Act::sleep_ms(RUN_MS)))
        .collect();
    ctx.produce(&high.q, &high_jobs).await;
    ctx.produce(&low.q, &low_jobs).await;
    {
        let conn = ctx.client.connection().await?;
        for qs in [high, low] {
            conn.batch_execute(&triggers(&qs.q.quoted_table())).await?;
        }
    }
    let mut spec = FaultSpec::for_queue(&high.q, &high.dlq, &ctx.run_id, SCENARIOS[0]);
    spec.set_vt_secs(VT_SECS);
    spec.worker.settings.concurrency = Some(WORKER_CONCURRENCY);
    spec.worker.settings.claimers = Some(CLAIMERS);
    spec.worker.settings.claim_capacity = Some(CLAIM_CAPACITY);
    spec.worker.pool_size = Some(6);
    spec.worker.application_name = Some("pgmq-campaign-prio-cell".into());
    spec.prio = Some(PrioSpec {
        queue: low.q.as_str().to_owned(),
        dlq: low.dlq.as_str().to_owned(),
        scenario: SCENARIOS[1].to_owned(),
        weight: 3,
        other_weight: 1,
        concurrency: Some(GROUP_CONCURRENCY),
    });
    spec.sabotage = sabotage
        .iter()
        .copied()
        .filter(|s| *s == Sabotage::PrioAheadPastVt)
        .collect();
    let worker = ctx.spawn_worker(&spec).await?;
    let _ = crate::ctx::poll_until(LIMIT, Duration::from_millis(100), || async {
        let mut all = true;
        for (s, n) in SCENARIOS.into_iter().zip(N) {
            all &= ledger::handled_count(&ctx.client, &ctx.run_id, s)
                .await
                .is_ok_and(|h| h >= n);
        }
        all
    })
    .await;
    let _ = worker.stop(Duration::from_secs(10)).await;
    let mut seen = Seen {
        handled: [0; 2],
        longest_wait_ms: 0,
        reads: 0,
        unrun: Vec::new(),
    };
    let conn = ctx.client.connection().await?;
    for (i, (qs, scenario)) in [high, low].into_iter().zip(SCENARIOS).enumerate() {
        let runs = ledger::handlings(&ctx.client, &ctx.run_id, scenario).await?;
        seen.handled[i] = runs.len() as i64;
        for h in &runs {
            if let Some(read_at) = h.read_at {
                let waited = (h.started_at - read_at).num_milliseconds();
                seen.longest_wait_ms = seen.longest_wait_ms.max(waited);
            }
        }
        let table = qs.q.table_name();
        let row = conn
            .query_one(
                "select count(*), coalesce(array_agg(r.msg_id order by r.msg_id) \
                     filter (where not exists (select 1 from pgmq_fault_ledger l \
                         where l.run_id = $1 and l.scenario = $2 and l.msg_id = r.msg_id \
                           and l.read_at = r.read_at)), '{}') \
                 from pgmq_fault_cell_reads r where r.tbl = $3",
                &[&ctx.run_id, &scenario, &table],
            )
            .await?;
        seen.reads += row.get::<_, i64>(0);
        let unrun: Vec<i64> = row.get(1);
        seen.unrun
            .extend(unrun.into_iter().map(|id| (scenario.to_owned(), id)));
    }
    conn.execute(
        "delete from pgmq_fault_cell_reads where tbl = any($1)",
        &[&vec![high.q.table_name(), low.q.table_name()]],
    )
    .await?;
    Ok(seen)
}
