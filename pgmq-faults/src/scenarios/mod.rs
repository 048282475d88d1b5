//! The scenarios of the fault suite, and the steps they share.
//!
//! [`SCENARIOS`] is the one list of them: each entry's number, row labels,
//! what it injects and when, what must hold, and the function that runs it.
//! `--scenarios` (its help, its check, the default of all) and
//! `--list-scenarios` read it; docs/reliability-scenarios.md's table must list the
//! same rows (a test checks it). Adding a scenario is one entry and its
//! function, in the file of its kind:
//!
//! | file | scenarios |
//! | --- | --- |
//! | `crash.rs` | 1 server killed, 2 worker SIGKILLed, 3 connections cut, 8 two workers, 16 killed mid-ack |
//! | `handlers.rs` | 4 poison payloads, 5 panics and failures, 6 handlers outliving their vt, 15 hung handlers, 19 edge-case bodies |
//! | `outages.rs` | 13 network blackhole, 14 paused worker, 17 database down, 18 database read-only |
//! | `shutdown.rs` | 7 graceful shutdown 20 times, 12 SIGTERM and a second SIGTERM |
//! | `inputs.rs` | 9 hostile queue names, 10 connect failures |
//! | `produce.rs` | 11 producers under connection cuts, plain (11) and keyed and retried (11b) |

mod crash;
mod handlers;
mod inputs;
mod outages;
mod produce;

mod run;
mod shutdown;

pub(crate) use outages::read_only;

use std::future::Future;
use std::pin::Pin;

use crate::ctx::Ctx;
use crate::report::Row;
use crate::BoxError;

/// What a scenario's function returns, boxed: its rows (most make one;
/// 6, 11 and 12 make two).
pub(crate) type Rows<'a> = Pin<Box<dyn Future<Output = Result<Vec<Row>, BoxError>> + Send + 'a>>;

/// A scenario's `run`: its row functions called in turn on the context,
/// each making one row.
macro_rules! rows {
    ($($row:expr),+ $(,)?) => {
        |ctx| Box::pin(async move { Ok(vec![$(($row)(ctx).await?),+]) })
    };
}

/// One scenario of the suite: what it does, what it checks, and the function
/// that runs it. The table [`SCENARIOS`] lists them all; `--scenarios`, its
/// help and the default selection come from it, and docs/reliability-scenarios.md's
/// table ("The scenarios") must list the same rows (a test checks it).
pub(crate) struct Scenario {
    /// Its number: what `--scenarios` names.
    pub number: u8,
    /// The labels of the rows it writes in the report (its number, or
    /// `6a` and `6b`).
    pub rows: &'static [&'static str],
    /// A short name.
    pub name: &'static str,
    /// The fault it injects (or the bad input it sends).
    pub injects: &'static str,
    /// When.
    pub when: &'static str,
    /// What must hold.
    pub checks: &'static str,
    /// Runs it on the suite's cluster.
    pub run: for<'a> fn(&'a Ctx) -> Rows<'a>,
}

/// Every scenario, in the order a full run takes them. A new scenario is
/// one entry here and its function.
pub(crate) static SCENARIOS: &[Scenario] = &[
    Scenario {
        number: 1,
        rows: &["1"],
        name: "server killed 3x mid-ack",
        injects: "the server killed (pg_ctl stop -m immediate), started again after a second \
                  (handlers of 20 ms)",
        when: "at 25%, 50% and 75% of the handlings, once an acknowledgement waits on a lock \
               the suite holds on the worker's messages (up to 5 tries of 3 s)",
        checks: "each kill landed with an acknowledgement in flight; the worker survives and \
                 resumes; nothing lost; duplicates within the bound",
        run: rows![crash::server_killed],
    },
    Scenario {
        number: 2,
        rows: &["2"],
        name: "worker SIGKILLed 2x",
        injects: "SIGKILL to the worker (vt 3 s, handlers of 20 ms); a new one started at once",
        when: "at a third and at two thirds of the handlings, once it is seen holding claims",
        checks: "the killed worker held claims at each kill; they come back after their vt; \
                 duplicates only of those keys and no more than them",
        run: rows![crash::worker_killed],
    },
    Scenario {
        number: 3,
        rows: &["3"],
        name: "connections cut 3x (proxy)",
        injects: "the TCP proxy resets every live connection of the worker and refuses new \
                  ones for a second",
        when: "at 25%, 50% and 75% of the handlings",
        checks: "the worker survives and resumes; nothing lost; duplicates within the bound",
        run: rows![crash::connections_cut],
    },
    Scenario {
        number: 4,
        rows: &["4"],
        name: "poison payloads",
        injects: "10 of each poison among 10,000 good messages, sent as raw JSON by SQL: a key \
                  of the wrong type, no key, null, arrays nested 10,000 deep (body, field, \
                  headers), a 1 MiB body",
        when: "queued before the worker starts",
        checks: "undecodable bodies dead-lettered and never handled; the 1 MiB body handled; \
                 the deep headers handled or dead-lettered; the worker keeps running; every \
                 good message handled",
        run: rows![handlers::poison],
    },
    Scenario {
        number: 5,
        rows: &["5"],
        name: "handlers panic (1%) / fail until 3rd try",
        injects: "handlers that panic (1% of 10,000 messages) or fail (5%; max_attempts 5)",
        when: "panics on every delivery, failures on the first two",
        checks: "panics caught and counted; exactly the 1% dead-lettered; the failing 5% \
                 handled on delivery 3; nothing else lost",
        run: rows![handlers::panics_and_failures],
    },
    Scenario {
        number: 6,
        rows: &["6a", "6b"],
        name: "handler outlives vt, heartbeat off (a) and on (b)",
        injects: "seven handlers of 4.5 s under a vt of 2 s (max_deliveries 3)",
        when: "on every delivery of those seven messages; 6a without the heartbeat, 6b with it",
        checks: "6a: the slow messages are redelivered, their late acknowledgements fenced out \
                 (claims_lost > 0), only they dead-lettered (max_deliveries) and duplicated, \
                 at most once per delivery; 6b: no redelivery at all",
        run: rows! {
            |c| handlers::outliving_vt(c, false),
            |c| handlers::outliving_vt(c, true),
        },
    },
    Scenario {
        number: 7,
        rows: &["7"],
        name: "graceful shutdown under load 20x",
        injects: "SIGTERM to a worker under load (vt 30 s), 20 times in a row; then a last \
                  worker drains the rest",
        when: "0.4 s after each worker starts",
        checks: "every shutdown exits 0 with a report; after each, no message left invisible \
                 (released claims visible at once, not after the vt); no duplicates",
        run: rows![shutdown::graceful_repeated],
    },
    Scenario {
        number: 8,
        rows: &["8"],
        name: "two workers, one queue",
        injects: "a second worker process on the same queue",
        when: "both from the start",
        checks: "both consume; no key read by one while another's claim on it holds; no \
                 overlapping handling windows; no duplicates",
        run: rows![crash::two_workers],
    },
    Scenario {
        number: 9,
        rows: &["9"],
        name: "hostile queue names",
        injects: "17 hostile queue names (quotes, `;`, `--`, comments, 200 and 48 characters, \
                  non-Latin letters, emoji, control characters, `$`, empty)",
        when: "through QueueName::new, parse, TryFrom and serde",
        checks: "each refused with Error::InvalidQueueName before any SQL; pgmq.meta and the \
                 schema unchanged; the longest legal name (47) works",
        run: rows![inputs::hostile_names],
    },
    Scenario {
        number: 10,
        rows: &["10"],
        name: "bad password / closed port / silent server / no PGMQ",
        injects: "a wrong password, a closed port, a listener that never answers (LISTEN too), \
                  a database without PGMQ",
        when: "at connect (connect timeout 2 s)",
        checks: "a typed error (Connect, PgmqMissing) within the timeout, no hang, a text that \
                 says what happened, the password in neither Display nor Debug",
        run: rows![inputs::connect_failures],
    },
    Scenario {
        number: 11,
        rows: &["11", "11b"],
        name: "producers under connection cuts; keyed and retried through them (b)",
        injects: "the proxy resets every connection of four producers (send, send_batch of 10; \
                  11b: send_keyed, send_batch_keyed of 10, on the pgmq_sdk schema installed \
                  first) and every fifth time refuses new ones for 100 ms",
        when: "every 100 ms while they produce",
        checks: "11: every committed produce in the queue, no rejected one; each unknown one \
                 classified; a batch all there or all absent; 11b: every failed try retried \
                 with its keys until it succeeds, then every message in the queue exactly \
                 once under the id its send returned, a batch all new or all duplicate; \
                 both: then consumed, nothing lost or duplicated",
        run: rows![
            produce::producers_under_cuts,
            produce::keyed_producers_under_cuts
        ],
    },
    Scenario {
        number: 12,
        rows: &["12a", "12b"],
        name: "SIGTERM to a busy worker (a); a second SIGTERM while a handler hangs (b)",
        injects: "12a: SIGTERM to a busy worker; 12b: SIGTERM (grace 120 s) while a handler \
                  hangs, then a second SIGTERM",
        when: "12a: after a third of the messages; 12b: once the handler hangs",
        checks: "12a: it drains and exits 0, unstarted claims visible at once, no duplicates; \
                 12b: the second SIGTERM escalates (ShutdownHandle::immediate): a report within \
                 2 s, exit 3, the hung message handled once on a later delivery",
        run: rows![shutdown::sigterm_busy, shutdown::second_sigterm],
    },
    Scenario {
        number: 13,
        rows: &["13"],
        name: "network blackhole past the vt",
        injects: "the proxy blackholes every connection of the worker (vt 3 s, db_timeout 2 s), \
                  live and new, for 6 s; then 100 more messages",
        when: "at 25% of the handlings",
        checks: "the worker notices within db_timeout + 1 s, acknowledges again once the \
                 network is back, loses nothing; duplicates within the bound",
        run: rows![outages::blackhole],
    },
    Scenario {
        number: 14,
        rows: &["14"],
        name: "worker paused (SIGSTOP) past its vt",
        injects: "SIGSTOP to one of two workers (vt 3 s, heartbeat on) for 6 s, then SIGCONT",
        when: "at 25% of the handlings",
        checks: "the running worker takes the frozen one's claims over; the frozen one reports \
                 claims_lost > 0; nothing dead-lettered; duplicates only of the messages held \
                 at the SIGSTOP",
        run: rows![outages::paused_worker],
    },
    Scenario {
        number: 15,
        rows: &["15"],
        name: "handlers hang (16), handler_timeout 1 s",
        injects: "16 handlers that hang (handler_timeout 1 s, heartbeat on, max_attempts 3)",
        when: "on every delivery of those 16 messages",
        checks: "each hung run cancelled at the timeout and counted (timed_out = 48); each hung \
                 message dead-lettered with `handler timed out`, never handled; the others flow",
        run: rows![handlers::hung_handlers],
    },
    Scenario {
        number: 16,
        rows: &["16"],
        name: "worker killed mid-ack batch",
        injects: "SIGKILL to the worker (vt 3 s); a new worker drains",
        when: "once its acknowledgement batch waits on a lock the suite holds on its messages",
        checks: "the kill landed mid-batch every time; nothing lost; duplicates only of the \
                 messages held then",
        run: rows![crash::killed_mid_ack],
    },
    Scenario {
        number: 17,
        rows: &["17"],
        name: "database down past the vt, default settings",
        injects: "the server killed and kept down for 6 s, under a worker with pgmq-worker's \
                  defaults (vt 3 s); then 100 more messages",
        when: "at 25% of the handlings",
        checks: "the worker keeps running, acknowledges again after the restart, loses \
                 nothing, dead-letters nothing; duplicates within the bound",
        run: rows![outages::database_down],
    },
    Scenario {
        number: 18,
        rows: &["18"],
        name: "database refuses writes",
        injects: "the cluster read-only (default_transaction_read_only = on) for 6 s under a \
                  worker (vt 3 s); then 100 more messages",
        when: "at 25% of the handlings",
        checks: "failed reads retried with backoff, refused ledger writes retried, \
                 acknowledgements again once writes are back; nothing lost or dead-lettered",
        run: rows![outages::read_only_database],
    },
    Scenario {
        number: 19,
        rows: &["19"],
        name: "edge-case bodies",
        injects: "edge-case bodies among good messages: null, an array, 1e400, a key beyond \
                  i64, `\\u0000`, `\\u0001`, 16 MiB, nesting 100 and 200 deep",
        when: "queued before the worker starts",
        checks: "`\\u0000` refused at the send; the storable ones handled; the undecodable \
                 ones dead-lettered undecoded; never a crash, nothing else lost",
        run: rows![handlers::bodies],
    },
    Scenario {
        number: 20,
        rows: &["20"],
        name: "fleet limit: worker SIGKILLed holding places",
        injects: "SIGKILL to a worker under a fleet-wide limit of 4 places (8 handlers of 10 ms, \
                  vt 3 s); a second worker with the same limit started at once",
        when: "at a third of the handlings, once it is seen holding places",
        checks: "never more than 4 claims running (the queue table sampled every 10 ms); the \
                 dead worker's places freed within its vt; nothing lost; duplicates only of \
                 the places it held",
        run: rows![crash::fleet_limit_killed],
    },
];

/// The scenario numbered `n`.
fn scenario(n: u8) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.number == n)
}

/// The scenarios' numbers for a message: `1 to 19` while they run on
/// without a gap, else the list.
fn numbers() -> String {
    let mut ns: Vec<u8> = SCENARIOS.iter().map(|s| s.number).collect();
    ns.sort_unstable();
    match (ns.first(), ns.last()) {
        (Some(a), Some(b)) if usize::from(b - a) + 1 == ns.len() => format!("{a} to {b}"),
        _ => ns.iter().map(u8::to_string).collect::<Vec<_>>().join(", "),
    }
}

/// `--scenarios`'s help.
pub(crate) fn help() -> String {
    format!(
        "Scenarios to run, e.g. `1,2,11` (default: all, {})",
        numbers()
    )
}

/// `--scenarios`'s long help (`--help`): the help and every scenario's name.
pub(crate) fn long_help() -> String {
    let mut s = format!("{}:", help());
    for sc in SCENARIOS {
        s.push_str(&format!("\n{:>4}  {}", sc.number, sc.name));
    }
    s
}

/// `--list-scenarios`: the table as Markdown, one row per scenario.
pub(crate) fn markdown() -> String {
    let mut s = String::from(
        "| # | rows | scenario | injects | when | what must hold |\n| ---: | --- | --- | --- | --- | --- |\n",
    );
    for sc in SCENARIOS {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            sc.number,
            sc.rows.join(", "),
            sc.name,
            sc.injects,
            sc.when,
            sc.checks
        ));
    }
    s
}

/// `--scenarios`'s parser: a number of the table.
pub(crate) fn parse_number(s: &str) -> Result<u8, String> {
    let n: u8 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a scenario number ({})", numbers()))?;
    match scenario(n) {
        Some(_) => Ok(n),
        None => Err(format!("no scenario {n}: scenarios are {}", numbers())),
    }
}

/// The scenarios asked for (all when none were named), each once, in the
/// order asked.
pub(crate) fn selection(asked: &[u8]) -> Result<Vec<&'static Scenario>, BoxError> {
    if asked.is_empty() {
        return Ok(SCENARIOS.iter().collect());
    }
    let mut out: Vec<&'static Scenario> = Vec::new();
    for &n in asked {
        let s =
            scenario(n).ok_or_else(|| format!("no scenario {n}: scenarios are {}", numbers()))?;
        if !out.iter().any(|o| o.number == n) {
            out.push(s);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn numbers_and_row_labels_are_unique_and_complete() {
        let mut numbers = HashSet::new();
        let mut labels = HashSet::new();
        for s in SCENARIOS {
            assert!(numbers.insert(s.number), "scenario {} twice", s.number);
            assert!(!s.rows.is_empty(), "scenario {} writes no row", s.number);
            for r in s.rows {
                assert!(labels.insert(*r), "row {r} twice");
                // A row's label is its scenario's number, or that and a letter.
                let digits = r.trim_end_matches(|c: char| c.is_ascii_lowercase());
                assert_eq!(
                    digits,
                    s.number.to_string(),
                    "row {r} of scenario {}",
                    s.number
                );
            }
            for (what, text) in [
                ("name", s.name),
                ("injects", s.injects),
                ("when", s.when),
                ("checks", s.checks),
            ] {
                assert!(!text.trim().is_empty(), "scenario {}: no {what}", s.number);
                // One cell of a Markdown table (--list-scenarios).
                assert!(!text.contains('|'), "scenario {}: `|` in {what}", s.number);
            }
        }
    }

    #[test]
    fn the_selection_and_the_help_come_from_the_table() {
        let all: Vec<u8> = selection(&[]).unwrap().iter().map(|s| s.number).collect();
        let table: Vec<u8> = SCENARIOS.iter().map(|s| s.number).collect();
        assert_eq!(all, table);
        let some: Vec<u8> = selection(&[12, 2, 12])
            .unwrap()
            .iter()
            .map(|s| s.number)
            .collect();
        assert_eq!(some, vec![12, 2]);
        let last = SCENARIOS.iter().map(|s| s.number).max().unwrap();
        assert!(selection(&[last + 1]).is_err());
        assert!(parse_number(&(last + 1).to_string()).is_err());
        assert!(parse_number("0").is_err() && parse_number("x").is_err());
        assert_eq!(parse_number(" 2"), Ok(2));
        assert_eq!(numbers(), format!("1 to {last}"));
        assert!(help().contains(&format!("1 to {last}")), "{}", help());
        assert_eq!(long_help().lines().count(), SCENARIOS.len() + 1);
        assert_eq!(markdown().lines().count(), SCENARIOS.len() + 2);
    }

    /// The table of docs/reliability-scenarios.md ("The scenarios") lists exactly the
    /// rows of [`SCENARIOS`], in the same order.
    #[test]
    fn reliability_md_lists_exactly_the_scenarios() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs/reliability-scenarios.md");
        let text = std::fs::read_to_string(&path).unwrap();
        let section = text
            .split("\n## The scenarios\n")
            .nth(1)
            .expect("docs/reliability-scenarios.md has a section \"The scenarios\"");
        let section = section.split("\n## ").next().unwrap_or(section);
        let documented: Vec<&str> = section
            .lines()
            .filter_map(|l| l.strip_prefix('|')?.split('|').next())
            .map(str::trim)
            .filter(|c| c.starts_with(|ch: char| ch.is_ascii_digit()))
            .collect();
        let table: Vec<&str> = SCENARIOS
            .iter()
            .flat_map(|s| s.rows.iter().copied())
            .collect();
        assert_eq!(
            documented, table,
            "docs/reliability-scenarios.md's scenario table and SCENARIOS differ"
        );
        let mut numbers: Vec<u8> = documented
            .iter()
            .map(|l| {
                l.trim_end_matches(|c: char| c.is_ascii_lowercase())
                    .parse()
                    .unwrap()
            })
            .collect();
        numbers.dedup();
        let table: Vec<u8> = SCENARIOS.iter().map(|s| s.number).collect();
        assert_eq!(numbers, table);
    }
}
