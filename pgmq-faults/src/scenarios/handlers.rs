//! Bad messages and bad handlers: poison payloads (4), panics and failing
//! handlers (5), handlers that outlive their visibility timeout (6).

use std::collections::{HashMap, HashSet};

use super::run::{Finished, Run};
use crate::ctx::Ctx;
use crate::job::{key_headers, Act, Job};
use crate::ledger::Handling;
use crate::report::{Check, Row};
use crate::BoxError;

/// What must become of a poison payload.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// The handler's type decodes it: handled once.
    Handled,
    /// It cannot be decoded: dead-lettered, never handled.
    DeadLettered,
    /// Either, once; what matters is that it does not wedge the queue.
    Either,
    /// PostgreSQL refuses to store it: the send fails, nothing is queued.
    Refused,
}

/// A poison payload: its name, its body and headers as JSON text (built from the key).
struct Poison {
    kind: &'static str,
    expect: Expect,
    body: fn(i64) -> String,
    headers: fn(i64) -> String,
}

fn nested(depth: usize) -> String {
    let mut s = String::with_capacity(depth * 2);
    s.extend(std::iter::repeat_n('[', depth));
    s.extend(std::iter::repeat_n(']', depth));
    s
}

fn plain_headers(k: i64) -> String {
    key_headers(k).to_string()
}

const POISONS: [Poison; 7] = [
    Poison {
        kind: "key of the wrong type",
        expect: Expect::DeadLettered,
        body: |k| format!(r#"{{"key": "k{k}"}}"#),
        headers: plain_headers,
    },
    Poison {
        kind: "no key field",
        expect: Expect::DeadLettered,
        body: |k| format!(r#"{{"id": {k}, "note": "not a job"}}"#),
        headers: plain_headers,
    },
    Poison {
        kind: "JSON null",
        expect: Expect::DeadLettered,
        body: |_| "null".to_owned(),
        headers: plain_headers,
    },
    Poison {
        kind: "10,000-deep nested array",
        expect: Expect::DeadLettered,
        body: |_| nested(10_000),
        headers: plain_headers,
    },
    Poison {
        kind: "10,000-deep nested array in a field",
        expect: Expect::DeadLettered,
        body: |k| format!(r#"{{"key": {k}, "data": {}}}"#, nested(10_000)),
        headers: plain_headers,
    },
    Poison {
        kind: "1 MiB body",
        expect: Expect::Handled,
        body: |k| format!(r#"{{"key": {k}, "data": "{}"}}"#, "x".repeat(1 << 20)),
        headers: plain_headers,
    },
    Poison {
        kind: "10,000-deep nested array in the headers",
        expect: Expect::Either,
        body: |k| format!(r#"{{"key": {k}}}"#),
        headers: |k| format!(r#"{{"fault_key": {k}, "trace": {}}}"#, nested(10_000)),
    },
];

/// Sends raw JSON text, as a producer in another language might. A send the
/// server refuses (a database error) is recorded as rejected; a connection
/// failure fails the scenario.
async fn send_raw(run: &mut Run<'_>, key: i64, body: &str, headers: &str) -> Result<(), BoxError> {
    let conn = run.ctx.client.connection().await?;
    let res = conn
        .query_one(
            "select pgmq.send($1, $2::text::jsonb, $3::text::jsonb, 0)",
            &[&run.qs.q.as_str(), &body, &headers],
        )
        .await;
    match res {
        Ok(row) => run.produced.record(&[key], &Ok(vec![row.get::<_, i64>(0)])),
        Err(e) if e.as_db_error().is_some() => run.produced.record_rejected(key),
        Err(e) => return Err(format!("sending payload {key}: {e}").into()),
    }
    Ok(())
}

/// Messages that succeed or fail in a planned way: `act(key)` for each key.
fn jobs_with(n: usize, act: impl Fn(i64) -> Option<Act>) -> Vec<Job> {
    (0..n as i64)
        .map(|k| match act(k) {
            Some(a) => Job::with(k, a),
            None => Job::plain(k),
        })
        .collect()
}

/// 4: poison payloads mixed into good messages.
pub(crate) async fn poison(ctx: &Ctx) -> Result<Row, BoxError> {
    let per_kind = if ctx.quick { 3 } else { 10 };
    payloads(ctx, "4", "poison payloads", &POISONS, |_| per_kind).await
}

/// Bodies at the edges of what JSON, jsonb and serde allow (19).
const BODIES: [Poison; 9] = [
    Poison {
        kind: "JSON null body",
        expect: Expect::DeadLettered,
        body: |_| "null".to_owned(),
        headers: plain_headers,
    },
    Poison {
        kind: "array body",
        expect: Expect::DeadLettered,
        body: |k| format!("[{k}, 1, 2]"),
        headers: plain_headers,
    },
    Poison {
        // jsonb keeps it exactly (numeric); f64 cannot hold it.
        kind: "number beyond f64 (1e400) in a field",
        expect: Expect::Either,
        body: |k| format!(r#"{{"key": {k}, "data": 1e400}}"#),
        headers: plain_headers,
    },
    Poison {
        kind: "key beyond i64",
        expect: Expect::DeadLettered,
        body: |_| r#"{"key": 123456789012345678901234567890}"#.to_owned(),
        headers: plain_headers,
    },
    Poison {
        // PostgreSQL refuses \u0000 in jsonb ("unsupported Unicode escape
        // sequence"): the producer gets the error, nothing is queued.
        kind: "string with a NUL escape (\\u0000)",
        expect: Expect::Refused,
        body: |k| format!(r#"{{"key": {k}, "data": "a\u0000b"}}"#),
        headers: plain_headers,
    },
    Poison {
        // What is storable: other control characters, and the escape as text.
        kind: "string with \\u0001 and a literal \\\\u0000",
        expect: Expect::Handled,
        body: |k| format!(r#"{{"key": {k}, "data": "a\u0001b\\u0000c"}}"#),
        headers: plain_headers,
    },
    Poison {
        kind: "16 MiB body",
        expect: Expect::Handled,
        body: |k| format!(r#"{{"key": {k}, "data": "{}"}}"#, "x".repeat(16 << 20)),
        headers: plain_headers,
    },
    Poison {
        kind: "nested 100 deep in a field (under serde's 128)",
        expect: Expect::Handled,
        body: |k| format!(r#"{{"key": {k}, "data": {}}}"#, nested(100)),
        headers: plain_headers,
    },
    Poison {
        kind: "nested 200 deep in a field (over serde's 128)",
        expect: Expect::DeadLettered,
        body: |k| format!(r#"{{"key": {k}, "data": {}}}"#, nested(200)),
        headers: plain_headers,
    },
];

/// 19: bodies at the edges of JSON mixed into good messages: each is
/// handled, dead-lettered or refused at the send, never a crash, never a
/// lost batch.
pub(crate) async fn bodies(ctx: &Ctx) -> Result<Row, BoxError> {
    // One 16 MiB body is enough (it is 16 MiB in every read of its batch).
    payloads(ctx, "19", "edge-case bodies", &BODIES, |p| {
        if p.kind.starts_with("16 MiB") {
            1
        } else {
            3
        }
    })
    .await
}

/// Good messages with `per_kind(p)` of each payload `p` sent raw among them;
/// then checks what became of each kind.
async fn payloads(
    ctx: &Ctx,
    label: &'static str,
    title: &str,
    list: &[Poison],
    per_kind: impl Fn(&Poison) -> usize,
) -> Result<Row, BoxError> {
    let mut run = Run::start(ctx, label).await?;
    run.dead_letters_expected = true;
    let goods = ctx.plain_jobs(ctx.n);
    let (first, second) = goods.split_at(ctx.n / 2);
    run.produce(first).await;
    let mut kinds: HashMap<i64, usize> = HashMap::new();
    let mut key = ctx.n as i64;
    let rounds = list.iter().map(&per_kind).max().unwrap_or(0);
    for round in 0..rounds {
        for (i, p) in list.iter().enumerate() {
            if round >= per_kind(p) {
                continue;
            }
            send_raw(&mut run, key, &(p.body)(key), &(p.headers)(key)).await?;
            kinds.insert(key, i);
            key += 1;
        }
        if round == rounds / 2 {
            run.produce(second).await;
        }
    }
    let rejected: HashSet<i64> = run.produced.rejected_keys();
    let mut args = run.worker_args();
    args.set_retries(3, 100, 200);
    let f = run.finish_by(title, &args).await?;
    let handled: HashSet<i64> = f.handlings.iter().map(|h| h.key).collect();
    let mut row = f.row.clone();
    for (i, p) in list.iter().enumerate() {
        let keys: Vec<i64> = kinds
            .iter()
            .filter(|(_, k)| **k == i)
            .map(|(k, _)| *k)
            .collect();
        let h = keys.iter().filter(|k| handled.contains(k)).count();
        let d = keys.iter().filter(|k| f.dead.contains(k)).count();
        let r = keys.iter().filter(|k| rejected.contains(k)).count();
        let ok = match p.expect {
            Expect::Handled => h == keys.len() && d == 0 && r == 0,
            Expect::DeadLettered => h == 0 && d == keys.len() && r == 0,
            Expect::Either => h + d == keys.len() && r == 0,
            Expect::Refused => r == keys.len() && h == 0 && d == 0,
        };
        let detail = format!(
            "{h} of {} handled, {d} dead-lettered, {r} refused at the send",
            keys.len()
        );
        row.push_check(Check::new(p.kind, ok, detail));
    }
    if let Some(r) = f.report() {
        row.push_check(Check::new(
            "worker counted decode failures",
            r["decode_failures"].as_u64().unwrap_or(0) > 0,
            format!("shutdown report: {r}"),
        ));
    }
    Ok(row)
}

/// 5: handlers that panic on 1% of messages (every attempt: dead-lettered
/// after max_attempts), and handlers that fail until their third attempt
/// (handled on the third).
pub(crate) async fn panics_and_failures(ctx: &Ctx) -> Result<Row, BoxError> {
    let mut run = Run::start(ctx, "5").await?;
    run.dead_letters_expected = true;
    let panics = |k: i64| k % 100 == 0;
    let fails = |k: i64| k % 20 == 7;
    let jobs = jobs_with(ctx.n, |k| {
        if panics(k) {
            Some(Act::panic_before(i32::MAX))
        } else if fails(k) {
            Some(Act::fail_before(3))
        } else {
            None
        }
    });
    run.produce(&jobs).await;
    let mut args = run.worker_args();
    args.set_retries(5, 100, 400);
    let f = run
        .finish_by("handlers panic (1%) / fail until 3rd try", &args)
        .await?;
    let panicking: HashSet<i64> = (0..ctx.n as i64).filter(|k| panics(*k)).collect();
    let failing = (0..ctx.n as i64).filter(|k| fails(*k)).count();
    let panicked_handled = f.handlings.iter().filter(|h| panics(h.key)).count();
    let failing_rows: Vec<&Handling> = f.handlings.iter().filter(|h| fails(h.key)).collect();
    let on_third = failing_rows.iter().filter(|h| h.read_ct == 3).count();
    let mut row = f.row.clone();
    row.push_check(Check::new(
        "1% panicking messages dead-lettered",
        f.dead == panicking && panicked_handled == 0,
        format!(
            "{} dead-lettered of {} that always panic",
            f.dead.len(),
            panicking.len()
        ),
    ));
    row.push_check(Check::new(
        "fail-until-3rd handled on attempt 3",
        on_third == failing && failing_rows.len() == failing,
        format!(
            "{on_third} of {failing} handled with read_ct 3 ({} handlings)",
            failing_rows.len()
        ),
    ));
    if let Some(r) = f.report() {
        row.push_check(Check::new(
            "panics caught and counted",
            r["panicked"].as_u64().unwrap_or(0) >= panicking.len() as u64,
            format!("shutdown report: {r}"),
        ));
    }
    Ok(row)
}

/// 15: handlers that never return on 16 keys, under
/// `handler_timeout` (1 s): each run is cancelled at the timeout and the
/// message retried, then dead-lettered with the timeout as the reason after
/// `max_attempts`; the other messages flow meanwhile.
pub(crate) async fn hung_handlers(ctx: &Ctx) -> Result<Row, BoxError> {
    let mut run = Run::start(ctx, "15").await?;
    run.dead_letters_expected = true;
    // 16 of them, whatever the size: each ties a handler slot up for
    // max_attempts x 1 s.
    let every = (ctx.n as i64 / 16).max(1);
    let hangs = |k: i64| k % every == every / 2;
    let jobs = jobs_with(ctx.n, |k| hangs(k).then_some(Act::hang_before(i32::MAX)));
    run.produce(&jobs).await;
    let mut args = run.worker_args();
    args.worker.settings.handler_timeout_ms = Some(1_000);
    args.worker.settings.heartbeat = Some(true);
    args.set_retries(3, 100, 200);
    let f = run
        .finish_by("handlers hang (16), handler_timeout 1 s", &args)
        .await?;
    let hung: HashSet<i64> = (0..ctx.n as i64).filter(|k| hangs(*k)).collect();
    let reasons = &f.dead_reasons;
    let by_timeout = hung
        .iter()
        .filter(|k| {
            reasons
                .get(k)
                .is_some_and(|r| r.contains("max_attempts") && r.contains("timed out"))
        })
        .count();
    let hung_handled = f.handlings.iter().filter(|h| hangs(h.key)).count();
    let sample = hung
        .iter()
        .find_map(|k| reasons.get(k))
        .cloned()
        .unwrap_or_default();
    let mut row = f.row.clone();
    row.push_check(Check::new(
        "hung messages dead-lettered for the timeout",
        f.dead == hung && by_timeout == hung.len() && hung_handled == 0,
        format!(
            "{} dead-lettered of {} that always hang, {by_timeout} with the timeout as the reason \
             (\"{sample}\"), {hung_handled} handled",
            f.dead.len(),
            hung.len()
        ),
    ));
    if let Some(r) = f.report() {
        let timed_out = r["timed_out"].as_u64().unwrap_or(0);
        let expected =
            hung.len() as u64 * u64::from(args.worker.settings.max_attempts.unwrap_or(0));
        row.push_check(Check::new(
            "every hung run timed out and was counted",
            timed_out == expected,
            format!(
                "timed_out {timed_out}, {} hung messages x {} attempts = {expected}",
                hung.len(),
                args.worker.settings.max_attempts.unwrap_or(0)
            ),
        ));
    }
    Ok(row)
}

/// 6: a handler outliving its visibility timeout, heartbeat off or on.
///
/// Off (6a, the control for 6b): each slow message is read again while its
/// handler runs, so every delivery's acknowledgement arrives after the next
/// delivery's read and is fenced out (counted in `claims_lost`, nothing
/// written); the message is run again and again until `max_deliveries` (3
/// here) dead-letters it, unless a late acknowledgement happens to land
/// before the next read. On (6b): the heartbeat keeps each claim, no
/// redelivery at all.
pub(crate) async fn outliving_vt(ctx: &Ctx, heartbeat: bool) -> Result<Row, BoxError> {
    let mut run = Run::start(ctx, if heartbeat { "6b" } else { "6a" }).await?;
    run.dead_letters_expected = !heartbeat;
    let max_deliveries = 3u32;
    let vt = 2u64;
    let slow = Slow {
        every: (ctx.n as i64 / 6).max(1),
        ms: 4_500,
    };
    let jobs = jobs_with(ctx.n, |k| slow.is(k).then_some(Act::sleep_ms(slow.ms)));
    run.produce(&jobs).await;
    let mut args = run.worker_args();
    args.set_vt_secs(vt);
    args.worker.settings.heartbeat = Some(heartbeat);
    // No handler fails here; max_deliveries may not be below max_attempts.
    args.worker.settings.max_attempts = Some(max_deliveries);
    args.worker.settings.max_deliveries = Some(max_deliveries);
    args.worker.settings.shutdown_grace_ms = Some(15_000);
    let w = run.spawn(&args).await?;
    let title = if heartbeat {
        "handler outlives vt, heartbeat on"
    } else {
        "handler outlives vt, heartbeat off"
    };
    let slow_keys: Vec<i64> = (0..ctx.n as i64).filter(|k| slow.is(*k)).collect();
    if !heartbeat {
        allow_redeliveries(&mut run, &slow_keys, max_deliveries);
    }
    let f = run.finish(title, vec![w]).await?;
    let counts = SlowCounts::of(&f, slow, slow_keys.len());
    let detail = format!(
        "{} slow messages ({} ms each, vt {vt} s): {} handlings, \
         {} handlings of them redelivered",
        counts.keys, slow.ms, counts.rows, counts.redelivered
    );
    let checks = if heartbeat {
        vec![Check::new(
            "no redelivery with the heartbeat",
            counts.redelivered_any == 0 && counts.rows == counts.keys,
            detail,
        )]
    } else {
        without_heartbeat_checks(&f, ctx.n, slow, &counts, detail)
    };
    let mut row = f.row;
    for c in checks {
        row.push_check(c);
    }
    Ok(row)
}

/// Scenario 6's slow messages: one key in `every` sleeps `ms` in its handler.
#[derive(Clone, Copy)]
struct Slow {
    every: i64,
    ms: u64,
}

impl Slow {
    /// Whether key `k` is a slow message.
    fn is(self, k: i64) -> bool {
        k % self.every == 0
    }
}

/// 6a: allows every slow message to be run once more per further delivery.
fn allow_redeliveries(run: &mut Run<'_>, slow_keys: &[i64], max_deliveries: u32) {
    // Each slow message runs at most once per delivery, and at most
    // max_deliveries deliveries run.
    let per_key = u64::from(max_deliveries - 1);
    run.allow_duplicates(
        slow_keys.len() as u64 * per_key,
        format!(
            "{} slow messages x {per_key} more deliveries (max_deliveries {max_deliveries})",
            slow_keys.len()
        ),
    );
    run.suspect(slow_keys.iter().copied());
}

/// What scenario 6's ledger says of the slow messages.
struct SlowCounts {
    /// Slow messages produced.
    keys: usize,
    /// Their handlings.
    rows: usize,
    /// Their handlings on a second or later delivery.
    redelivered: usize,
    /// Handlings of any message on a second or later delivery (6b: none).
    redelivered_any: usize,
}

impl SlowCounts {
    /// Counts the handlings of `f`.
    fn of(f: &Finished, slow: Slow, keys: usize) -> SlowCounts {
        SlowCounts {
            keys,
            rows: f.handlings.iter().filter(|h| slow.is(h.key)).count(),
            redelivered: f
                .handlings
                .iter()
                .filter(|h| h.read_ct > 1 && slow.is(h.key))
                .count(),
            redelivered_any: f.handlings.iter().filter(|h| h.read_ct > 1).count(),
        }
    }
}

/// 6a's checks: the slow messages really were redelivered, their late
/// acknowledgements fenced out, and only they dead-lettered, by
/// `max_deliveries`.
fn without_heartbeat_checks(
    f: &Finished,
    n: usize,
    slow: Slow,
    counts: &SlowCounts,
    detail: String,
) -> Vec<Check> {
    let slow_keys = counts.keys;
    let mut checks = Vec::new();
    // The control for 6b: without the heartbeat the slow messages must
    // really be redelivered, or 6b's "none" would prove nothing.
    checks.push(Check::new(
        "redelivered without the heartbeat",
        counts.redelivered > 0 && counts.rows > slow_keys,
        detail,
    ));
    let lost_claims = f
        .report()
        .and_then(|r| r["claims_lost"].as_u64())
        .unwrap_or(0);
    checks.push(Check::new(
        "late acknowledgements fenced out",
        lost_claims > 0,
        format!("claims_lost {lost_claims}: acknowledgements of deliveries already read again, not written"),
    ));
    let dead = &f.dead;
    let reasons = &f.dead_reasons;
    let slow_set: HashSet<i64> = (0..n as i64).filter(|k| slow.is(*k)).collect();
    let by_limit = dead
        .iter()
        .filter(|k| {
            slow_set.contains(k) && reasons.get(k).is_some_and(|r| r.contains("max_deliveries"))
        })
        .count();
    checks.push(Check::new(
        "only slow messages dead-lettered, by max_deliveries",
        by_limit == dead.len(),
        format!(
            "{} of {slow_keys} slow messages dead-lettered ({by_limit} for max_deliveries), the rest deleted by an acknowledgement that landed before the next read; {} other messages dead-lettered",
            by_limit,
            dead.len() - by_limit
        ),
    ));
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poison_bodies_are_what_they_say() {
        for p in &POISONS {
            let h: serde_json::Value = serde_json::from_str(&(p.headers)(3)).unwrap_or_default();
            assert!(h.is_null() || h["fault_key"] == 3 || p.expect == Expect::Either);
        }
        let null = (POISONS[2].body)(1);
        assert_eq!(null, "null");
        let deep = (POISONS[3].body)(1);
        assert_eq!(deep.len(), 20_000);
        // serde_json refuses this depth: a typed error, not a stack overflow.
        assert!(serde_json::from_str::<serde_json::Value>(&deep).is_err());
        let in_field = (POISONS[4].body)(7);
        assert!(serde_json::from_str::<Job>(&in_field).is_err());
        let big = (POISONS[5].body)(7);
        assert!(big.len() > 1 << 20);
        assert_eq!(serde_json::from_str::<Job>(&big).unwrap().key, 7);
        assert!(serde_json::from_str::<Job>(&(POISONS[0].body)(7)).is_err());
        assert!(serde_json::from_str::<Job>(&(POISONS[1].body)(7)).is_err());
    }
}
