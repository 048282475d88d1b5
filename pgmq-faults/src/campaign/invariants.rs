//! The campaign's invariants, judged from the ledger, the queues, the
//! sampler's observations, the faults as they happened and the workers'
//! shutdown reports. Each gives one [`Check`]; the names are stable (the
//! sabotage tests and docs/reliability-invariants.md refer to them).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::fleet::{ClaimWindow, KeyedLog, PlacesBack};
use super::model::{
    claim_bound, expires_once, FaultEvent, Plan, ProcExit, ProcKind, Role, Sample, DB_TIMEOUT,
    FIFO_SPAN, FLEET_PLACES, PLACES_BOUND, REQUEUE_BOUND, ROLES, STARVE_BOUND, VT_SECS,
};
use super::nemesis;
use crate::ctx::FleetSamples;
use crate::ledger::{most_at_once, Handling, ProduceOutcome, Produced, Start, Tally, Window};
use crate::report::Check;

/// Everything a seed's run left to judge.
pub(crate) struct Evidence<'a> {
    pub plans: &'a HashMap<i64, Plan>,
    /// Keys a `redrive` fault sent back from the dead-letter queue.
    pub redriven: &'a HashSet<i64>,
    /// Ledger rows per queue ([`Role::index`]).
    pub handlings: &'a [Vec<Handling>],
    /// Handler starts per queue ([`Role::index`]): recorded on the
    /// transactional and FIFO blocking queues, empty on the others.
    pub starts: &'a [Vec<Start>],
    /// Dead letters per queue: key and reason.
    pub dead: &'a [HashMap<i64, String>],
    pub tallies: &'a [Tally],
    pub events: &'a [FaultEvent],
    pub samples: &'a [Sample],
    pub exits: &'a [ProcExit],
    /// The queues some process consumed (the others got no messages).
    pub consumed: [bool; ROLES],
    pub drained: [bool; ROLES],
    pub drain_took: Duration,
    pub drain_bound: Duration,
    /// When the producer stopped (and every fault was over).
    pub produced_until: DateTime<Utc>,
    pub fleet: &'a FleetEvidence,
}

/// What the fleet workload ([`fleet`](super::fleet)) left to judge.
#[derive(Debug, Default)]
pub(crate) struct FleetEvidence {
    /// The keyed producer's tries and the keys it sent again.
    pub log: KeyedLog,
    /// The keyed queue's produces (those of a dropped queue's life left
    /// out unless their message was found).
    pub produced: Produced,
    /// The keyed queue's life at the end ([`FleetState::epoch`](super::fleet::FleetState)).
    pub final_epoch: u32,
    /// Per key of the keyed queue, the ids of the messages stored under it:
    /// handled (ledger), still in the queue, archived.
    pub stored: HashMap<i64, BTreeSet<i64>>,
    /// Keys of the keyed queue found in its dead-letter queue.
    pub dead: HashSet<i64>,
    /// The fleet limit's fast sampler.
    pub samples: FleetSamples,
    /// Every recorded run of the keyed queue (start, end).
    pub runs: Vec<Window>,
    /// The `pause`, `revoke-grants` and `pause-flag-locked` faults' windows.
    pub windows: Vec<ClaimWindow>,
    /// The claims held at each kill of a fleet-limited process.
    pub places: Vec<PlacesBack>,
    /// Each slot's process kind.
    pub kinds: Vec<ProcKind>,
}

/// How long after a fault clears the workers must be making progress again.
pub(crate) const PROGRESS_BOUND: Duration = Duration::from_secs(25);
/// How long after a fault that may hold backends the connection bound is
/// not judged.
const CONN_SETTLE: Duration = Duration::from_secs(6);

/// The invariants' names, in the order judged.
pub(crate) const NAMES: [&str; 22] = [
    "nothing lost",
    "transactional rows exactly once",
    "only the current delivery commits",
    "no dead letter for a message that succeeded",
    "dead letters only where planned",
    "FIFO successes in sequence",
    "FIFO runs never overlap",
    "no stall",
    "progress after every fault",
    "duplicates only under faults",
    "shutdown reports agree with the ledger",
    "connections within the configured maximum",
    "workers stayed up",
    "a requeued message comes back after its delay",
    "keyed sends store each key once",
    "a key sent after its queue's re-creation stores a new message",
    "never more runs than the fleet limit",
    "a killed process's places come back within its vt",
    "no claim after a pause took effect",
    "no claim while the pause flag cannot be read",
    "no queue of the weighted group starved",
    "no claim while the reads of the pause flag hang",
];

/// Every invariant, judged.
pub(crate) fn check_all(e: &Evidence) -> Vec<Check> {
    let mut out = vec![
        nothing_lost(e),
        exactly_once(e),
        current_delivery_commits(e),
        no_dead_success(e),
        dead_only_planned(e),
    ];
    let (order, overlap) = fifo(e);
    out.push(order);
    out.push(overlap);
    out.push(no_stall(e));
    out.push(progress(e));
    out.push(duplicates_under_faults(e));
    out.push(reports(e));
    out.push(connections(e));
    out.push(workers_up(e));
    out.push(requeue_delay(e));
    out.extend(keyed(e));
    out.push(fleet_limit(e));
    out.push(places_back(e));
    out.push(claim_windows(e, "pause", NAMES[18]));
    out.push(claim_windows(e, "revoke-grants", NAMES[19]));
    out.push(claim_windows(e, "pause-flag-locked", NAMES[21]));
    out.push(starvation(e));
    let errors: Vec<&String> = e.events.iter().filter_map(|x| x.error.as_ref()).collect();
    out.push(Check::new(
        "faults injected and cleared",
        errors.iter().all(|m| !m.contains(" clear: ")),
        format!(
            "{} faults, {} with an error{}",
            e.events.len(),
            errors.len(),
            sample(&errors)
        ),
    ));
    out
}

/// The verdict of an invariant that holds when nothing is found against
/// it: `detail`, then a few of the cases `bad` found.
fn verdict<T: std::fmt::Debug>(name: &str, bad: &[T], detail: String) -> Check {
    Check::new(name, bad.is_empty(), format!("{detail}{}", sample(bad)))
}

/// A few of `xs`, to follow a count in a check's detail.
fn sample<T: std::fmt::Debug>(xs: &[T]) -> String {
    if xs.is_empty() {
        String::new()
    } else {
        format!(", e.g. {:?}", &xs[..xs.len().min(4)])
    }
}

fn nothing_lost(e: &Evidence) -> Check {
    let lost: u64 = e.tallies.iter().map(|t| t.lost).sum();
    let unexpected: u64 = e.tallies.iter().map(|t| t.unexpected).sum();
    let samples: Vec<i64> = e
        .tallies
        .iter()
        .flat_map(|t| t.lost_sample.iter().copied())
        .collect();
    Check::new(
        NAMES[0],
        lost == 0 && unexpected == 0,
        format!(
            "{lost} committed messages neither handled nor dead-lettered, {unexpected} never sent{}",
            sample(&samples)
        ),
    )
}

fn exactly_once(e: &Evidence) -> Check {
    let mut twice = Vec::new();
    let mut rows = 0;
    for role in [Role::Tx, Role::Fifo] {
        let mut n: HashMap<i64, u32> = HashMap::new();
        for h in &e.handlings[role.index()] {
            *n.entry(h.key).or_default() += 1;
            rows += 1;
        }
        twice.extend(n.into_iter().filter(|(_, c)| *c > 1).map(|(k, _)| k));
    }
    twice.sort_unstable();
    verdict(
        NAMES[1],
        &twice,
        format!(
            "{rows} rows written in handlers' transactions, {} keys with more than one",
            twice.len()
        ),
    )
}

/// A transactional row commits with its delivery's fenced delete, which
/// matches only while no later delivery has read the message: so no row
/// may have been written after a later delivery of its key (a higher
/// `read_ct`) had started. Such a row is a stale delivery's
/// acknowledgement that landed.
fn current_delivery_commits(e: &Evidence) -> Check {
    let tx_starts = &e.starts[Role::Tx.index()];
    let mut later: HashMap<i64, Vec<&Start>> = HashMap::new();
    for s in tx_starts {
        later.entry(s.key).or_default().push(s);
    }
    let mut stale: Vec<String> = e.handlings[Role::Tx.index()]
        .iter()
        .filter_map(|h| {
            let next = later
                .get(&h.key)?
                .iter()
                .filter(|s| s.read_ct > h.read_ct && s.started_at < h.handled_at)
                .min_by_key(|s| s.started_at)?;
            Some(format!(
                "{}: the row of delivery {} written {} ms after delivery {} started",
                h.key,
                h.read_ct,
                (h.handled_at - next.started_at).num_milliseconds(),
                next.read_ct
            ))
        })
        .collect();
    stale.sort();
    verdict(
        NAMES[2],
        &stale,
        format!(
            "{} rows of the transactional queue judged against {} recorded starts, {} committed by a stale delivery",
            e.handlings[Role::Tx.index()].len(),
            tx_starts.len(),
            stale.len()
        ),
    )
}

fn no_dead_success(e: &Evidence) -> Check {
    let mut bad = Vec::new();
    for role in Role::ALL {
        let handled: HashSet<i64> = e.handlings[role.index()].iter().map(|h| h.key).collect();
        for (k, reason) in &e.dead[role.index()] {
            if handled.contains(k) {
                bad.push(format!("{k}: {reason}"));
            }
        }
    }
    bad.sort();
    verdict(
        NAMES[3],
        &bad,
        format!(
            "{} keys both in the ledger and in a dead-letter queue",
            bad.len()
        ),
    )
}

fn dead_only_planned(e: &Evidence) -> Check {
    let mut bad = Vec::new();
    let mut planned_dead = 0;
    let mut dead_total = 0;
    for role in Role::ALL {
        for (k, reason) in &e.dead[role.index()] {
            dead_total += 1;
            match e.plans.get(k) {
                Some(p) if p.until_redriven && e.redriven.contains(k) => {
                    bad.push(format!("{k} (redriven): {reason}"))
                }
                Some(p) if p.dead_letter => planned_dead += 1,
                _ => bad.push(format!("{k}: {reason}")),
            }
        }
    }
    bad.sort();
    verdict(
        NAMES[4],
        &bad,
        format!(
            "{dead_total} dead letters, {planned_dead} of poison or undecodable messages, {} of messages meant to succeed (or redriven: {} redriven)",
            bad.len(),
            e.redriven.len()
        ),
    )
}

/// Per FIFO group of each FIFO queue: successes (ledger rows, in the order
/// written) in sequence order, and none starting before the previous one's
/// row was written. On the transactional FIFO queue a row commits with its
/// delivery's fenced delete, so every pair counts. On the FIFO blocking
/// queue rows are written outside any transaction (at least once: a
/// message may have two, in sequence), and a pair counts only when the
/// worker wrote the retry of the run of the two that began first
/// ([`retry_written`]): a run abandoned at `handler_timeout` is
/// acknowledged with a retry, and the loop must wait for the run to end
/// before it writes it. Any other such pair is explained, reported and not
/// failed: the run lost its claim (its visibility timeout ran out under a
/// fault), which a blocking handler cannot see, and ran on beside the
/// message's next delivery.
fn fifo(e: &Evidence) -> (Check, Check) {
    let mut out_of_order = Vec::new();
    let mut overlaps = Vec::new();
    let mut explained = Vec::new();
    let mut counts = Vec::new();
    for role in Role::ALL.into_iter().filter(|r| e.consumed[r.index()]) {
        let Some(base) = role.fifo_base() else {
            continue;
        };
        let rows = &e.handlings[role.index()];
        let starts = &e.starts[role.index()];
        let excused = |h: &Handling| role == Role::FifoBlocking && !retry_written(h, starts, rows);
        let mut groups: HashMap<i64, Vec<&Handling>> = HashMap::new();
        for h in rows {
            groups
                .entry((h.key - base) / FIFO_SPAN)
                .or_default()
                .push(h);
        }
        for (g, hs) in groups.iter_mut() {
            hs.sort_by_key(|h| h.handled_at);
            for w in hs.windows(2) {
                let first = if w[1].started_at < w[0].started_at {
                    w[1]
                } else {
                    w[0]
                };
                if w[1].key < w[0].key {
                    let what = format!("{role:?} group {g}: {} after {}", w[1].key, w[0].key);
                    if excused(first) {
                        explained.push(what);
                    } else {
                        out_of_order.push(what);
                    }
                }
                if w[1].started_at < w[0].handled_at {
                    let what = format!(
                        "{role:?} group {g}: {} (delivery {}) started {} ms before {} (delivery {}) ended",
                        w[1].key,
                        w[1].read_ct,
                        (w[0].handled_at - w[1].started_at).num_milliseconds(),
                        w[0].key,
                        w[0].read_ct
                    );
                    if excused(first) {
                        explained.push(what);
                    } else {
                        overlaps.push(what);
                    }
                }
            }
        }
        let mut per_key: HashMap<i64, u32> = HashMap::new();
        for h in rows {
            *per_key.entry(h.key).or_default() += 1;
        }
        let repeated = per_key.values().filter(|n| **n > 1).count();
        counts.push(format!(
            "{role:?}: {} successes of {} keys ({repeated} more than once) in {} groups",
            rows.len(),
            per_key.len(),
            groups.len()
        ));
    }
    let explained = if explained.is_empty() {
        String::new()
    } else {
        format!(
            "; {} pairs explained by a claim lost under a blocking run{}",
            explained.len(),
            sample(&explained)
        )
    };
    (
        Check::new(
            NAMES[5],
            out_of_order.is_empty(),
            format!(
                "{}, {} out of sequence{}{explained}",
                counts.join(", "),
                out_of_order.len(),
                sample(&out_of_order)
            ),
        ),
        Check::new(
            NAMES[6],
            overlaps.is_empty(),
            format!(
                "{} successes of a group that began before the previous one ended{}{explained}",
                overlaps.len(),
                sample(&overlaps)
            ),
        ),
    )
}

/// Whether the worker wrote the retry of the delivery that wrote `h`: the
/// next delivery of its message (a recorded start or a ledger row with a
/// `read_ct` one higher; a retry keeps the read, a release or snooze undoes
/// it) began with more attempts used. A retry is fenced on its delivery, so
/// only the worker handling that delivery wrote it, when it acknowledged
/// the run. Otherwise (as many attempts: the message came back on its own,
/// its claim lost under the run; or the next delivery not recorded, its
/// start refused by a fault too) nothing says the worker let the message
/// go while the run went on.
fn retry_written(h: &Handling, starts: &[Start], rows: &[Handling]) -> bool {
    starts
        .iter()
        .map(|s| (s.key, s.read_ct, s.attempts))
        .chain(rows.iter().map(|r| (r.key, r.read_ct, r.attempts)))
        .any(|(key, read_ct, attempts)| {
            key == h.key && read_ct == h.read_ct + 1 && attempts > h.attempts
        })
}

/// Every queue drained once the faults were over; no visibility timeout
/// ever set past what a worker sets; no message held by one delivery for
/// over 30 s while no fault was active or had just cleared.
fn no_stall(e: &Evidence) -> Check {
    let quiet_after = Duration::from_secs(15);
    let far: i64 = e.samples.iter().map(|s| s.far_vt.iter().sum::<i64>()).sum();
    let held: Vec<String> = e
        .samples
        .iter()
        .filter(|s| quiet(e.events, s.at, quiet_after))
        .filter(|s| s.held_long.iter().any(|n| *n > 0))
        .map(|s| {
            format!(
                "{} held > 30 s at {}",
                s.held_long.iter().sum::<i64>(),
                s.at.format("%H:%M:%S")
            )
        })
        .collect();
    let undrained: Vec<Role> = Role::ALL
        .into_iter()
        .filter(|r| !e.drained[r.index()])
        .collect();
    Check::new(
        NAMES[7],
        undrained.is_empty() && far == 0 && held.is_empty(),
        format!(
            "{}; {far} samples of a visibility timeout beyond now + 15 s; {} quiet samples with a message held past 30 s{}",
            if undrained.is_empty() {
                format!("every queue drained {:.1} s after the last fault", e.drain_took.as_secs_f64())
            } else {
                format!("{undrained:?} not drained {} s after the last fault", e.drain_bound.as_secs())
            },
            held.len(),
            sample(&held)
        ),
    )
}

/// Whether no fault was active at `t` nor cleared within `after` before it.
fn quiet(events: &[FaultEvent], t: DateTime<Utc>, after: Duration) -> bool {
    let after = chrono::Duration::from_std(after).unwrap_or_default();
    !events.iter().any(|f| f.start <= t && t <= f.end + after)
}

/// After each fault clears, every queue a process consumes handles a
/// message within [`PROGRESS_BOUND`], not counting time spent in the next
/// faults.
fn progress(e: &Evidence) -> Check {
    let bound = chrono::Duration::from_std(PROGRESS_BOUND).unwrap_or_default();
    let mut stuck = Vec::new();
    let mut worst = chrono::Duration::zero();
    for role in Role::ALL.into_iter().filter(|r| e.consumed[r.index()]) {
        let mut done: Vec<DateTime<Utc>> = e.handlings[role.index()]
            .iter()
            .map(|h| h.handled_at)
            .collect();
        done.sort_unstable();
        for (i, f) in e.events.iter().enumerate() {
            let c = f.end;
            if c + bound > e.produced_until {
                // Too close to the end for a verdict: the drain judges it.
                continue;
            }
            let first = done.iter().find(|t| **t > c).copied();
            let Some(first) = first else {
                stuck.push(format!(
                    "{role:?} after {} at {}: nothing handled since",
                    f.kind,
                    c.format("%H:%M:%S")
                ));
                continue;
            };
            // Time inside later faults does not count.
            let faulted: chrono::Duration = e.events[i + 1..]
                .iter()
                .filter(|g| g.start < first)
                .map(|g| g.end.min(first) - g.start)
                .fold(chrono::Duration::zero(), |a, b| a + b);
            let took = first - c - faulted;
            worst = worst.max(took);
            if took > bound {
                stuck.push(format!(
                    "{role:?} after {} cleared at {}: first handling {} ms later",
                    f.kind,
                    c.format("%H:%M:%S"),
                    took.num_milliseconds()
                ));
            }
        }
    }
    verdict(
        NAMES[8],
        &stuck,
        format!(
            "slowest resumption {} ms (bound {} s, per queue) over {} faults; {} late",
            worst.num_milliseconds(),
            PROGRESS_BOUND.as_secs(),
            e.events.len(),
            stuck.len()
        ),
    )
}

/// A message of the plain or FIFO blocking queue (whose handlers write
/// their rows outside any transaction) handled twice must have had its
/// first handling near a fault (its acknowledgement could then be lost, or
/// its claim expire), unless its plan allows a repeat.
fn duplicates_under_faults(e: &Evidence) -> Check {
    let slack = chrono::Duration::seconds(VT_SECS as i64 + 4);
    let mut first: HashMap<i64, &Handling> = HashMap::new();
    let mut unexplained = Vec::new();
    let mut dups = 0;
    let rows = [Role::Plain, Role::FifoBlocking]
        .into_iter()
        .flat_map(|r| &e.handlings[r.index()]);
    for h in rows {
        let Some(f) = first.get(&h.key) else {
            first.insert(h.key, h);
            continue;
        };
        dups += 1;
        if e.plans.get(&h.key).is_some_and(|p| p.may_repeat) {
            continue;
        }
        let near = e
            .events
            .iter()
            .any(|x| x.start <= f.handled_at + slack && f.started_at <= x.end + slack);
        if !near {
            unexplained.push(h.key);
        }
    }
    unexplained.sort_unstable();
    verdict(
        NAMES[9],
        &unexplained,
        format!(
            "{dups} repeated handlings on the plain and FIFO blocking queues, {} with no fault near the first",
            unexplained.len()
        ),
    )
}

/// A process's (`who`) `n` ledger rows against the count its report says
/// (and how it says it), plus at most the number of those whose outcome it
/// could not know (and what they are): what is wrong, if anything.
fn rows_mismatch(
    who: &str,
    n: u64,
    (counted, counted_as): (u64, String),
    (unsure, unsure_as): (u64, &str),
) -> Option<String> {
    (!(counted..=counted + unsure).contains(&n))
        .then(|| format!("{who}: {n} ledger rows, {counted_as} (+ up to {unsure} {unsure_as})"))
}

/// Each shutdown report against the ledger: the rows a process wrote are
/// what its report counts; an abandoned transactional handler left no row;
/// after a clean graceful shutdown, nothing the process handled came back.
fn reports(e: &Evidence) -> Check {
    let mut by_pid: HashMap<i32, Vec<&Handling>> = HashMap::new();
    for h in e.handlings.iter().flatten() {
        by_pid.entry(h.worker_pid).or_default().push(h);
    }
    let mut reads: HashMap<i64, Vec<DateTime<Utc>>> = HashMap::new();
    for h in e.handlings.iter().flatten() {
        if let Some(r) = h.read_at {
            reads.entry(h.key).or_default().push(r);
        }
    }
    let mut bad = Vec::new();
    let mut judged = 0;
    for x in e.exits {
        let Some(report) = x.exit.as_ref().and_then(|ex| ex.said.report.as_ref()) else {
            continue;
        };
        judged += 1;
        let pid = x.pid as i32;
        let rows = by_pid.get(&pid).map(Vec::as_slice).unwrap_or(&[]);
        let n = rows.len() as u64;
        let get = |k: &str| report[k].as_u64().unwrap_or(0);
        // Runs the worker gave up on: timed out, or abandoned at the shutdown.
        let given_up =
            get("timed_out") + report["abandoned"].as_array().map_or(0, |a| a.len() as u64);
        let who = format!("{} ({})", x.app_name, x.how);
        // Plain and FIFO blocking: rows written on the ledger's own pool.
        if !x.kind.transactional() {
            // Rows the handler committed outside a transaction, as it
            // counted them: the ledger holds those, plus at most one per
            // insert whose reply a fault cut off (it cannot know).
            let counted = get("ledger_rows");
            bad.extend(rows_mismatch(
                &who,
                n,
                (counted, format!("its handler counted {counted}")),
                (get("ledger_unsure"), "unsure"),
            ));
            // Every row and snooze is a success the worker counted,
            // but for runs it gave up on (timed out, abandoned at the
            // shutdown, or, for a blocking handler, cancelled when its
            // claim was lost) whose handler still finished: a blocking
            // handler cannot see its cancellation. And a run whose
            // handler succeeded but whose hook's `after` panicked is a
            // failed attempt by the worker's contract (counted in
            // `panicked`, retried), though its row was written.
            let lost = match x.kind {
                ProcKind::Blocking | ProcKind::FifoBlocking => get("claims_lost"),
                _ => 0,
            };
            let given_up = given_up + lost + get("panicked");
            if get("succeeded") + given_up < get("ledger_rows") + get("snoozed") {
                bad.push(format!(
                    "{} ({}): {} successes reported (+ {given_up} given up), {} rows + {} snoozes",
                    x.app_name,
                    x.how,
                    get("succeeded"),
                    get("ledger_rows"),
                    get("snoozed")
                ));
            }
        } else {
            // A row per delete that committed in a handler's
            // transaction, plus at most one per transaction whose
            // COMMIT outcome the worker could not know (counted in
            // `tx_unavailable`, with its other infrastructure failures:
            // the reply was lost, the commit may have landed).
            let deleted = get("deleted");
            bad.extend(rows_mismatch(
                &who,
                n,
                (deleted, format!("{deleted} deletes reported")),
                (get("tx_unavailable"), "with no database"),
            ));
            let abandoned: HashSet<i64> = report["abandoned"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_i64()).collect())
                .unwrap_or_default();
            let with_rows: Vec<i64> = rows
                .iter()
                .filter(|h| abandoned.contains(&h.msg_id))
                .map(|h| h.msg_id)
                .collect();
            if !with_rows.is_empty() {
                bad.push(format!(
                    "{}: abandoned messages {with_rows:?} have committed rows",
                    x.app_name
                ));
            }
        }
        // A clean graceful shutdown: every acknowledgement written and none
        // lost to another worker (but the planned ones: first deliveries of
        // messages whose claim expires under their handler), so nothing it
        // handled is delivered again.
        let planned_lost = e
            .starts
            .iter()
            .flatten()
            .filter(|s| s.worker_pid == pid && s.read_ct == 1 && expires_once(s.key))
            .count() as u64;
        let clean = x.exit.as_ref().is_some_and(|ex| ex.clean())
            && report["immediate"] == false
            && get("acks_failed") == 0
            && get("claims_lost") <= planned_lost;
        if clean {
            let again: Vec<i64> = rows
                .iter()
                .filter(|h| !e.plans.get(&h.key).is_some_and(|p| p.may_repeat))
                .filter(|h| {
                    reads
                        .get(&h.key)
                        .is_some_and(|rs| rs.iter().any(|r| *r > h.handled_at))
                })
                .map(|h| h.key)
                .collect();
            // A ledger insert whose reply a fault cut off may have committed
            // while the handler saw an error: that run failed, its message
            // was delivered again, and the process counted it in
            // `ledger_unsure`. A claim lost to a fault (a database down
            // past the vt while its acknowledgement waited: counted in
            // `claims_lost`, which the planned expiries may leave within
            // their bound) and a run given up (`timed_out`, `abandoned`)
            // leave a written row whose message is delivered again too.
            // Up to that many such rows are explained.
            let explained = get("ledger_unsure") + get("claims_lost") + given_up;
            if again.len() as u64 > explained {
                bad.extend(again.iter().map(|key| {
                    format!(
                        "{} ({}): key {key} handled and acknowledged, delivered again \
                         ({} ledger inserts unsure, {} claims lost, {} runs given up)",
                        x.app_name,
                        x.how,
                        get("ledger_unsure"),
                        get("claims_lost"),
                        given_up
                    )
                }));
            }
        }
    }
    verdict(
        NAMES[10],
        &bad,
        format!(
            "{judged} shutdown reports judged, {} disagreements",
            bad.len()
        ),
    )
}

/// Connections of each worker process never above its pools' size, except
/// while a fault that holds backends lasts (and shortly after) and while a
/// database call may still be within its timeout of a fault's start.
fn connections(e: &Evidence) -> Check {
    let settle = chrono::Duration::from_std(CONN_SETTLE).unwrap_or_default();
    let grace = chrono::Duration::from_std(DB_TIMEOUT + Duration::from_secs(2)).unwrap_or_default();
    let mut over = Vec::new();
    let mut judged = 0;
    let mut most = 0i64;
    for s in e.samples {
        let exempt = e.events.iter().any(|f| {
            (f.holds_backends && f.start <= s.at && s.at <= f.end + settle)
                || (f.start <= s.at && s.at <= f.start + grace)
        });
        if exempt {
            continue;
        }
        judged += 1;
        for (name, n, max) in &s.conns {
            most = most.max(*n - *max);
            if n > max {
                over.push(format!(
                    "{name}: {n} > {max} at {}",
                    s.at.format("%H:%M:%S")
                ));
            }
        }
    }
    verdict(
        NAMES[11],
        &over,
        format!(
            "{judged} samples judged, {} above a process's maximum",
            over.len()
        ),
    )
}

/// A message a requeue handed back (retry, snooze, release) is invisible
/// for its delay only: in no sample is its visibility timeout beyond now +
/// [`REQUEUE_BOUND`], under a visibility timeout. One further out is an
/// extension of the ended delivery (a heartbeat write that landed after
/// the requeue) holding the message while nobody handles it.
fn requeue_delay(e: &Evidence) -> Check {
    let judged: i64 = e
        .samples
        .iter()
        .map(|s| s.requeued.iter().sum::<i64>())
        .sum();
    let far: Vec<String> = e
        .samples
        .iter()
        .flat_map(|s| {
            s.requeued_far.iter().map(move |(role, id, ms)| {
                format!(
                    "{role:?} message {id}: {ms} ms out at {}",
                    s.at.format("%H:%M:%S")
                )
            })
        })
        .collect();
    verdict(
        NAMES[13],
        &far,
        format!(
            "{judged} sightings of a requeued message, {} with a visibility timeout beyond now + {} ms",
            far.len(),
            REQUEUE_BOUND.as_millis()
        ),
    )
}

/// No worker process ended on its own.
fn workers_up(e: &Evidence) -> Check {
    let crashed: Vec<String> = e
        .exits
        .iter()
        .filter(|x| x.how == "crashed")
        .map(|x| {
            format!(
                "{} ({:?}) {}",
                x.app_name,
                x.kind,
                x.exit.as_ref().map(|ex| ex.describe()).unwrap_or_default()
            )
        })
        .collect();
    let unclean_end: Vec<String> = e
        .exits
        .iter()
        .filter(|x| x.how == "end" && !x.exit.as_ref().is_some_and(|ex| ex.clean()))
        .map(|x| x.app_name.clone())
        .collect();
    let kinds: HashSet<ProcKind> = e.exits.iter().map(|x| x.kind).collect();
    Check::new(
        NAMES[12],
        crashed.is_empty() && unclean_end.is_empty(),
        format!(
            "{} crashed, {} did not stop cleanly at the end, {} kinds of process{}{}",
            crashed.len(),
            unclean_end.len(),
            kinds.len(),
            sample(&crashed),
            sample(&unclean_end)
        ),
    )
}

/// Keyed sends (the keyed queue, through the proxy, each try of unknown
/// outcome retried with the same key): every key's messages, counted by
/// id from the ledger, the queue and its archive, are at most one (one
/// per key and queue life: a key sent again after a re-creation has a new
/// fault key), and the id each send returned, new or duplicate, is that
/// message's; a key sent again within the queue's life is answered
/// duplicate with its first id. Then: every key sent again after the
/// queue's re-creation stored a new message (no "duplicate" answer, whose
/// id would be a dropped message's).
fn keyed(e: &Evidence) -> [Check; 2] {
    let f = e.fleet;
    let mut twice: Vec<String> = f
        .stored
        .iter()
        .filter(|(_, ids)| ids.len() > 1)
        .map(|(k, ids)| format!("key {k} stored as {ids:?}"))
        .collect();
    twice.sort();
    let mut wrong_id = Vec::new();
    let mut committed = 0;
    for r in &f.produced.records {
        let (ProduceOutcome::Committed, Some(id)) = (r.outcome, r.msg_id) else {
            continue;
        };
        committed += 1;
        match f.stored.get(&r.key) {
            Some(ids) if !ids.contains(&id) => {
                wrong_id.push(format!("key {} sent as {id}, stored as {ids:?}", r.key))
            }
            _ => {}
        }
    }
    let mut again_wrong = Vec::new();
    let (mut again, mut fresh, mut stale) = (0, 0, Vec::new());
    for r in &f.log.resends {
        let Some(got) = r.got else { continue };
        if r.fresh {
            fresh += 1;
            // A duplicate is right when an earlier try of the same call
            // (an unknown outcome, retried) stored this very key in the
            // queue's new life: the id is then that message's.
            let own = f
                .stored
                .get(&r.key)
                .is_some_and(|ids| ids.contains(&got.msg_id));
            if got.duplicate && !own {
                stale.push(format!(
                    "{} (as key {}): answered duplicate with id {}",
                    r.dedup, r.key, got.msg_id
                ));
            }
        } else {
            again += 1;
            if !got.duplicate || Some(got.msg_id) != r.first_id {
                again_wrong.push(format!(
                    "{} (key {}): first id {:?}, sent again: {got:?}",
                    r.dedup, r.key, r.first_id
                ));
            }
        }
    }
    wrong_id.sort();
    let log = &f.log;
    [
        Check::new(
            NAMES[14],
            twice.is_empty() && wrong_id.is_empty() && again_wrong.is_empty(),
            format!(
                "{} keys stored ({committed} sends committed) over {} tries, {} of unknown \
                 outcome retried with their keys, {} calls given up, {} given up at a \
                 re-creation (failed tries: {:?}); {} keys stored more than once{}; {} sends \
                 answered with another message's id{}; {again} keys sent again, {} not answered \
                 duplicate with their first id{}",
                f.stored.len(),
                log.tries.tries,
                log.tries.unknown,
                log.tries.gave_up,
                log.tries.stopped,
                f.produced.errors,
                twice.len(),
                sample(&twice),
                wrong_id.len(),
                sample(&wrong_id),
                again_wrong.len(),
                sample(&again_wrong)
            ),
        ),
        verdict(
            NAMES[15],
            &stale,
            format!(
                "{} re-creations of the keyed queue; {fresh} keys of a dropped queue sent \
                 again, {} answered duplicate",
                f.final_epoch,
                stale.len()
            ),
        ),
    ]
}

/// At no instant more claims of the keyed queue running than the fleet
/// limit: by the database's clock (the fast sampler), and by the handlers'
/// own records (each run from its start to its ledger row, both inside the
/// time its claim held a place; runs without a row are left out), counted
/// per life of the queue: a queue dropped and created again is a new
/// table whose places start free, and the runs of the dropped queue's
/// messages still going then are not counted against it.
fn fleet_limit(e: &Evidence) -> Check {
    let f = e.fleet;
    let mut lives: std::collections::BTreeMap<u32, Vec<Window>> = Default::default();
    for w in &f.runs {
        let life = f.log.epochs.get(&w.key).copied().unwrap_or(0);
        lives.entry(life).or_default().push(w.clone());
    }
    let (runs, at) = lives
        .values()
        .map(|ws| most_at_once(ws))
        .max_by_key(|(n, _)| *n)
        .unwrap_or((0, None));
    let over: Vec<String> = f
        .samples
        .over
        .iter()
        .map(|(t, n)| format!("{n} at {}", t.format("%H:%M:%S%.3f")))
        .collect();
    let ended = f.runs.iter().filter(|w| w.end.is_some()).count();
    Check::new(
        NAMES[16],
        over.is_empty() && runs <= FLEET_PLACES as usize,
        format!(
            "limit {FLEET_PLACES}: at most {} claims running in {} samples every 100 ms ({} \
             above{}); at most {runs} of {ended} recorded runs at once{}",
            f.samples.most,
            f.samples.samples,
            over.len(),
            sample(&over),
            at.map(|t| format!(" (at {})", t.format("%H:%M:%S%.3f")))
                .unwrap_or_default()
        ),
    )
}

/// After a SIGKILL of a fleet-limited process, every claim of the keyed
/// queue then running (the dead process's among them) stopped holding its
/// place (its delivery ended, or its visibility timeout passed) within
/// [`PLACES_BOUND`], by the database's clock, not counting time the server
/// was down (no look could be made): the dead process's places came back,
/// and *progress after every fault* says the queue kept draining. A
/// `drop-queue` meanwhile ends the claims with the queue.
fn places_back(e: &Evidence) -> Check {
    let bound = chrono::Duration::from_std(PLACES_BOUND).unwrap_or_default();
    let crashes: Vec<FaultEvent> = e
        .events
        .iter()
        .filter(|f| f.kind == "pg-crash")
        .cloned()
        .collect();
    let mut late = Vec::new();
    let held: usize = e.fleet.places.iter().map(|p| p.held).sum();
    for p in &e.fleet.places {
        let Some(last) = p.last_held else { continue };
        let took = last - p.at - faulted_between(&crashes, p.at, last);
        if took > bound {
            late.push(format!(
                "of {} claims held at {}, some still held {} ms later",
                p.held,
                p.at.format("%H:%M:%S"),
                took.num_milliseconds()
            ));
        }
    }
    verdict(
        NAMES[17],
        &late,
        format!(
            "{} kills of a fleet-limited process, {held} claims running at them; {} with a \
             place not back within {} s",
            e.fleet.places.len(),
            late.len(),
            bound.num_seconds()
        ),
    )
}

/// The time inside faults that started after `from` and before `to`.
fn faulted_between(
    events: &[FaultEvent],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> chrono::Duration {
    events
        .iter()
        .filter(|g| g.start > from && g.start < to)
        .map(|g| g.end.min(to) - g.start)
        .fold(chrono::Duration::zero(), |a, b| a + b)
}

/// No claim of a queue stopped by a fault of `kind` (a `pause` of one
/// queue; a `revoke-grants`, after which no worker can read the pause flag
/// and every queue must stop; a `pause-flag-locked`, under which no read of
/// the flag answers and every queue must stop once the last good read is
/// too old) later than the kind's [`claim_bound`] after the fault took
/// effect and before it was cleared: by the database's timestamps of each
/// delivery (`last_read_at`), from the ledger and from the fault's watcher,
/// which saw the queue tables every 100 ms.
fn claim_windows(e: &Evidence, kind: &str, name: &str) -> Check {
    let bound = chrono::Duration::from_std(claim_bound(kind)).unwrap_or_default();
    let mut late: Vec<String> = Vec::new();
    let mut n = 0;
    for w in e.fleet.windows.iter().filter(|w| w.kind == kind) {
        n += 1;
        let Some(until) = w.until else { continue };
        let from = w.from + bound;
        let mut seen: BTreeSet<(Role, i64, DateTime<Utc>)> = w.seen.iter().copied().collect();
        for role in &w.roles {
            for h in &e.handlings[role.index()] {
                if let Some(r) = h.read_at.filter(|r| *r > from && *r < until) {
                    seen.insert((*role, h.msg_id, r));
                }
            }
        }
        late.extend(seen.iter().map(|(role, id, at)| {
            format!(
                "{role:?} message {id} read {} ms after the {kind} took effect",
                (*at - w.from).num_milliseconds()
            )
        }));
    }
    verdict(
        name,
        &late,
        format!(
            "{n} {kind} faults; {} claims later than {} ms after one took effect",
            late.len(),
            claim_bound(kind).as_millis()
        ),
    )
}

/// Under `Priority::weighted()`, each queue of the group that had messages
/// ready in a sample had one claimed (a ledger row's `last_read_at`)
/// within [`STARVE_BOUND`] after it: neither a backlog of the other queue,
/// nor its pause, nor its emptiness holds it. Not judged while the queue
/// itself is paused, nor within 10 s after a fault that disturbs the
/// group's process: one aimed at it, at a table of the group's queues, or
/// at the server, the network or the grants.
fn starvation(e: &Evidence) -> Check {
    let bound = chrono::Duration::from_std(STARVE_BOUND).unwrap_or_default();
    let settle = chrono::Duration::seconds(10);
    let prio_slots: Vec<usize> = (0..e.fleet.kinds.len())
        .filter(|i| e.fleet.kinds[*i] == ProcKind::Prio)
        .collect();
    let mut starved = Vec::new();
    let mut judged = 0;
    for role in [Role::High, Role::Low] {
        if !e.consumed[role.index()] || prio_slots.is_empty() {
            continue;
        }
        let mut reads: Vec<DateTime<Utc>> = e.handlings[role.index()]
            .iter()
            .filter_map(|h| h.read_at)
            .collect();
        reads.sort_unstable();
        for s in e.samples.iter().filter(|s| s.ready[role.index()] > 0) {
            let (a, b) = (s.at - settle, s.at + bound);
            let disturbed = e.events.iter().any(|f| {
                let k = nemesis::kind(f.kind);
                // A lock or snapshot on either queue of the group, or a
                // pause of this one.
                let group_queue = matches!(f.queue, Role::High | Role::Low);
                let aimed = k.is_some_and(|k| {
                    k.disturbs
                        || (k.at_process && prio_slots.contains(&f.process))
                        || (k.at_queue && group_queue && (f.kind != "pause" || f.queue == role))
                });
                aimed && f.start <= b && a <= f.end
            });
            if disturbed || s.at + bound > e.produced_until {
                continue;
            }
            judged += 1;
            let claimed = reads.iter().any(|r| *r >= s.at && *r <= b);
            if !claimed {
                starved.push(format!(
                    "{role:?}: {} ready at {}, none claimed within {} s",
                    s.ready[role.index()],
                    s.at.format("%H:%M:%S"),
                    STARVE_BOUND.as_secs()
                ));
            }
        }
    }
    verdict(
        NAMES[20],
        &starved,
        format!(
            "{judged} samples of a group queue with messages ready judged, {} starved",
            starved.len()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::super::model::FIFO_BLOCKING_BASE;
    use super::*;

    fn t(ms: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp_millis(1_700_000_000_000 + ms).unwrap()
    }

    /// A row of the FIFO blocking queue, group 0.
    fn row(seq: i64, read_ct: i32, attempts: i32, start_ms: i64, end_ms: i64) -> Handling {
        Handling {
            key: FIFO_BLOCKING_BASE + seq,
            msg_id: seq,
            worker_pid: 1,
            read_ct,
            attempts,
            read_at: Some(t(start_ms)),
            vt: t(start_ms + 4_000),
            started_at: t(start_ms),
            handled_at: t(end_ms),
        }
    }

    fn start(h: &Handling) -> Start {
        Start {
            key: h.key,
            worker_pid: h.worker_pid,
            read_ct: h.read_ct,
            attempts: h.attempts,
            started_at: h.started_at,
        }
    }

    /// The FIFO checks over these rows of the FIFO blocking queue (each
    /// with its recorded start), both asserted to pass (`pass`) or fail.
    fn judge(pass: bool, rows: Vec<Handling>) -> (Check, Check) {
        let starts: Vec<Start> = rows.iter().map(start).collect();
        let mut handlings = vec![Vec::new(); ROLES];
        handlings[Role::FifoBlocking.index()] = rows;
        let mut all_starts = vec![Vec::new(); ROLES];
        all_starts[Role::FifoBlocking.index()] = starts;
        let e = Evidence {
            plans: &HashMap::new(),
            redriven: &HashSet::new(),
            handlings: &handlings,
            starts: &all_starts,
            dead: &[],
            tallies: &[],
            events: &[],
            samples: &[],
            exits: &[],
            consumed: [true; ROLES],
            drained: [true; ROLES],
            drain_took: Duration::ZERO,
            drain_bound: Duration::ZERO,
            produced_until: t(0),
            fleet: &FleetEvidence::default(),
        };
        let (order, overlap) = fifo(&e);
        assert_eq!(order.pass, pass, "{}", order.detail);
        assert_eq!(overlap.pass, pass, "{}", overlap.detail);
        (order, overlap)
    }

    /// Message 3's first run from 20 ms to 11 s, then `next` (a later
    /// delivery of it) and message 4 at 8.42 s.
    fn after_a_long_run(next: Handling) -> Vec<Handling> {
        vec![row(3, 1, 0, 20, 11_020), next, row(4, 1, 0, 8_420, 8_430)]
    }

    #[test]
    fn a_run_abandoned_at_the_timeout_is_waited_for() {
        // Message 3 hangs 11 s; abandoned at 8 s, its run records at 11 s;
        // the loop waits for it, then the retry (one more attempt) and
        // message 4 run: two rows of 3, in sequence, none overlapping.
        let (order, _) = judge(
            true,
            vec![
                row(2, 1, 0, 0, 10),
                row(3, 1, 0, 20, 11_020),
                row(3, 2, 1, 11_400, 11_410),
                row(4, 1, 0, 11_420, 11_430),
            ],
        );
        assert!(
            order.detail.contains("1 more than once"),
            "{}",
            order.detail
        );
    }

    #[test]
    fn a_run_abandoned_at_the_timeout_and_not_waited_for_fails() {
        // The retry (one more attempt) and message 4 run at 8.4 s while
        // the abandoned run goes on until 11 s.
        judge(false, after_a_long_run(row(3, 2, 1, 8_400, 8_410)));
    }

    #[test]
    fn a_run_whose_claim_lapsed_explains_its_overlap() {
        // The claim ran out under the run (a frozen process, a network
        // cut): delivered again with as many attempts, no retry written.
        let (_, overlap) = judge(true, after_a_long_run(row(3, 2, 0, 8_400, 8_410)));
        assert!(overlap.detail.contains("explained"), "{}", overlap.detail);
        // The same, its next delivery unrecorded (failed before its start
        // was written) and retried: the third delivery's attempt is that
        // retry's, not the first run's.
        judge(true, after_a_long_run(row(3, 3, 1, 8_400, 8_410)));
    }
}
