//! The campaign's key cell, after the last seed: workers under a limit per
//! key (`WorkerBuilder::key_limit`), judged on two invariants.
//!
//! - **Per-key limits never exceeded**: two worker processes under a limit
//!   of [`KEY_PLACES`] places per key (the key the header
//!   [`LIMIT_KEY_HEADER`]) drain a hot key's backlog, at the head of the
//!   queue, and [`COLD`] keys of one message each. The database's clock
//!   (a sampler counting each key's running claims every 20 ms, as the
//!   limit counts them) and the workers' own start and end records (per
//!   key, the most runs at once) must both stay within the limit, and
//!   every message must be handled.
//! - **A killed holder's places back within its vt**: a process running a
//!   handler in each of a key's places is killed (SIGKILL); a second
//!   process under the same limit must start both messages again within
//!   [`PLACES_BOUND`] of the kill, by the database's clock.
//!
//! `key-limit-ignored` runs the workers without the limit (plain reads):
//! the hot key's runs pass its limit and the first check fails.

use std::collections::HashMap;
use std::time::Duration;

use super::fleet::{
    cell_spec, killed_places, most_at_once, produce_under, Limit, LIMIT_KEY_HEADER,
};
use super::model::PLACES_BOUND;
use crate::ctx::{sample_per_key, Ctx, FleetSamples};
use crate::job::{Act, Job};
use crate::ledger;
use crate::report::Check;
use crate::worker::Sabotage;
use crate::BoxError;

/// Places per key.
const KEY_PLACES: u32 = 2;
/// The hot key's messages, at the head of the queue.
const HOT: i64 = 16;
/// Cold keys, one message each, after the hot key's.
const COLD: i64 = 24;
/// How long each handler runs, milliseconds.
const RUN_MS: u64 = 100;

/// A job's key under the limit: the first [`HOT`] fault keys share one.
fn limit_key(key: i64) -> String {
    if key < HOT {
        "hot".to_owned()
    } else {
        format!("cold{key}")
    }
}

/// The key cell's checks (see the module docs).
pub(crate) async fn key_cell(ctx: &Ctx, sabotage: &[Sabotage]) -> Vec<Check> {
    let name = "per-key limits never exceeded";
    let first = match limited_per_key(ctx, sabotage).await {
        Ok(r) => {
            let worst = r.per_key.values().copied().max().unwrap_or(0);
            let hottest = r
                .per_key
                .iter()
                .max_by_key(|(_, n)| **n)
                .map_or("none", |(k, _)| k.as_str());
            Check::new(
                name,
                r.handled >= HOT + COLD
                    && r.samples.most <= i64::from(KEY_PLACES)
                    && worst <= KEY_PLACES as usize,
                format!(
                    "two processes under a limit of {KEY_PLACES} places per key, a hot key's \
                     {HOT} messages ahead of {COLD} cold keys': {} of {} handled; at most {} \
                     claims of one key running in {} samples (database clock{}), and {worst} \
                     runs of one key at once in the workers' records (key {hottest})",
                    r.handled,
                    HOT + COLD,
                    r.samples.most,
                    r.samples.samples,
                    match r.samples.over.first() {
                        Some((at, n)) => format!(", {n} at {at}"),
                        None => String::new(),
                    },
                ),
            )
        }
        Err(e) => Check::new(
            name,
            false,
            format!("the limited workers could not run: {e}"),
        ),
    };
    let name = "a killed holder's places per key come back within its vt";
    let bound = PLACES_BOUND.as_millis();
    let second =
        match killed_places(ctx, KEY_PLACES, sabotage, Limit::PerKey(|_| "one".into())).await {
            Ok(Some(took)) => Check::new(
                name,
                took <= PLACES_BOUND,
                format!(
                    "a process running a handler in each of one key's {KEY_PLACES} places killed; \
                 both messages started again by a second process {} ms after the kill (bound \
                 {bound} ms)",
                    took.as_millis()
                ),
            ),
            Ok(None) => Check::new(
                name,
                false,
                format!(
                    "a process running a handler in each of one key's {KEY_PLACES} places killed; \
                 both messages not started again by a second process in time (bound {bound} ms)"
                ),
            ),
            Err(e) => Check::new(name, false, format!("the kill could not run: {e}")),
        };
    vec![first, second]
}

/// What the limited drain saw.
struct PerKeyRun {
    handled: i64,
    samples: FleetSamples,
    /// Per key, the most runs at once in the workers' records.
    per_key: HashMap<String, usize>,
}

/// Two processes under the limit per key drain the hot and cold keys.
async fn limited_per_key(ctx: &Ctx, sabotage: &[Sabotage]) -> Result<PerKeyRun, BoxError> {
    let scenario = "kl";
    let qs = ctx.queues(scenario).await?;
    let result = async {
        let jobs: Vec<Job> = (0..HOT + COLD)
            .map(|k| Job::with(k, Act::sleep_ms(RUN_MS)))
            .collect();
        produce_under(ctx, &qs.q, &jobs, Limit::PerKey(limit_key)).await?;
        let mut spec = cell_spec(
            ctx,
            &qs,
            scenario,
            KEY_PLACES,
            4,
            "pgmq-campaign-key-cell",
            Limit::PerKey(limit_key),
        );
        spec.sabotage = sabotage.to_vec();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let sampler = sample_per_key(
            ctx.cluster.dsn(),
            qs.q.table(),
            LIMIT_KEY_HEADER,
            i64::from(KEY_PLACES),
            Duration::from_millis(20),
            stop_rx,
        );
        let a = ctx.spawn_worker(&spec).await?;
        let b = ctx.spawn_worker(&spec).await?;
        // Short of all of them within the bound, the count says how many.
        let _ = ctx
            .wait_progress(scenario, HOT + COLD, Duration::from_secs(30))
            .await;
        let handled = ledger::handled_count(&ctx.client, &ctx.run_id, scenario).await?;
        let _ = a.stop(Duration::from_secs(10)).await;
        let _ = b.stop(Duration::from_secs(10)).await;
        let _ = stop_tx.send(true);
        let samples = sampler.await?;
        let windows = ledger::windows(&ctx.client, &ctx.run_id, scenario).await?;
        let mut by_key: HashMap<String, Vec<ledger::Window>> = HashMap::new();
        for w in windows {
            by_key.entry(limit_key(w.key)).or_default().push(w);
        }
        let per_key = by_key
            .into_iter()
            .map(|(k, ws)| (k, most_at_once(&ws).0))
            .collect();
        Ok(PerKeyRun {
            handled,
            samples,
            per_key,
        })
    }
    .await;
    ctx.drop_queues(&qs).await;
    result
}
