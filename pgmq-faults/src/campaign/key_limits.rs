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
//!   [`PLACES_BOUND`](super::model::PLACES_BOUND) of the kill, by the database's clock.
//!
//! `key-limit-ignored` runs the workers without the limit (plain reads):
//! the hot key's runs pass its limit and the first check fails.

use std::collections::HashMap;
use std::time::Duration;

use super::fleet::{killed_places, limited_drain, places_back_check, Limit};
use crate::ctx::{Ctx, FleetSamples};
use crate::job::{Act, Job};
use crate::ledger::{self, most_at_once};
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
        Err(e) => Check::could_not_run(name, "the limited workers", e),
    };
    let second = places_back_check(
        "a killed holder's places per key come back within its vt",
        &format!("each of one key's {KEY_PLACES} places"),
        killed_places(ctx, KEY_PLACES, sabotage, Limit::PerKey(|_| "one".into())).await,
    );
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
    let jobs: Vec<Job> = (0..HOT + COLD)
        .map(|k| Job::with(k, Act::sleep_ms(RUN_MS)))
        .collect();
    let limit = (Limit::PerKey(limit_key), KEY_PLACES);
    let wait = Duration::from_secs(30);
    let d = limited_drain(ctx, ("kl", &jobs), limit, 2, sabotage, wait).await?;
    let mut by_key: HashMap<String, Vec<ledger::Window>> = HashMap::new();
    for w in d.windows {
        by_key.entry(limit_key(w.key)).or_default().push(w);
    }
    let per_key = by_key
        .into_iter()
        .map(|(k, ws)| (k, most_at_once(&ws).0))
        .collect();
    Ok(PerKeyRun {
        handled: d.handled,
        samples: d.samples,
        per_key,
    })
}
