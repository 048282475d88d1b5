//! The ledger: what was produced (with each produce's outcome) and every
//! handling, one row each, so that lost, duplicated and unexpected messages
//! are counted per key.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use pgmq_client::{Client, CommitOutcome, QueueName};
use serde::Serialize;

use super::job::KEY_HEADER;
use super::BoxError;

/// What identifies one handling of a message, in the ledger and in the
/// starts table alike.
const HANDLING_COLUMNS: &str = "
    run_id text not null,
    scenario text not null,
    key bigint not null,
    msg_id bigint not null,
    worker_pid integer not null,
    read_ct integer not null,
    attempts integer,";

/// The ledger tables. No unique constraint on purpose: a second handling of
/// the same key is a second row, and is counted as a duplicate.
pub(crate) fn schema() -> String {
    format!(
        "
create table if not exists pgmq_fault_ledger ({HANDLING_COLUMNS}
    read_at timestamptz,
    vt timestamptz not null,
    started_at timestamptz not null,
    handled_at timestamptz not null default clock_timestamp()
);
alter table pgmq_fault_ledger add column if not exists attempts integer;
create index if not exists pgmq_fault_ledger_run on pgmq_fault_ledger (run_id, scenario, key);
create table if not exists pgmq_fault_produced (
    run_id text not null,
    scenario text not null,
    key bigint not null,
    msg_id bigint,
    outcome text not null,
    recovered boolean,
    recorded_at timestamptz not null default clock_timestamp()
);
create index if not exists pgmq_fault_produced_run on pgmq_fault_produced (run_id, scenario);
create table if not exists pgmq_fault_starts ({HANDLING_COLUMNS}
    started_at timestamptz not null default clock_timestamp()
);
alter table pgmq_fault_starts add column if not exists attempts integer;
create index if not exists pgmq_fault_starts_run on pgmq_fault_starts (run_id, scenario, key);
"
    )
}

/// A handler's start, written first thing when the worker runs with
/// `record_starts` (server clock, like the ledger's `handled_at`).
pub(crate) const INSERT_START: &str = "insert into pgmq_fault_starts \
    (run_id, scenario, key, msg_id, worker_pid, read_ct, attempts) \
    values ($1, $2, $3, $4, $5, $6, $7)";

/// One handling, written by the handler before it returns success.
pub(crate) const INSERT_HANDLING: &str = "insert into pgmq_fault_ledger \
    (run_id, scenario, key, msg_id, worker_pid, read_ct, attempts, read_at, vt, started_at) \
    values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// What became of one produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ProduceOutcome {
    /// The call returned the message id.
    Committed,
    /// The call failed before its request left the process.
    NotSent,
    /// The server refused the call.
    Rejected,
    /// The connection died with the request in flight.
    Unknown,
}

impl ProduceOutcome {
    fn as_str(self) -> &'static str {
        match self {
            ProduceOutcome::Committed => "committed",
            ProduceOutcome::NotSent => "not_sent",
            ProduceOutcome::Rejected => "rejected",
            ProduceOutcome::Unknown => "unknown",
        }
    }

    /// From a failed produce call.
    pub(crate) fn of_error(e: &pgmq_client::Error) -> ProduceOutcome {
        match e.outcome() {
            CommitOutcome::NotSent => ProduceOutcome::NotSent,
            CommitOutcome::Rejected => ProduceOutcome::Rejected,
            _ => ProduceOutcome::Unknown,
        }
    }
}

/// One produced message.
#[derive(Debug, Clone)]
pub(crate) struct ProduceRecord {
    pub key: i64,
    pub outcome: ProduceOutcome,
    pub msg_id: Option<i64>,
    /// For unknown outcomes: whether the key was found in the queue afterwards.
    pub recovered: Option<bool>,
    /// Which produce call it was part of (batches share one).
    pub call: u64,
}

/// Every produce of a scenario.
#[derive(Debug, Default)]
pub(crate) struct Produced {
    pub records: Vec<ProduceRecord>,
    /// Failed calls by error kind (`ConnectionLost(outcome unknown)`, `PoolTimeout`, ...).
    pub errors: BTreeMap<String, u64>,
    calls: u64,
}

/// A short name for an error: its variant, with the outcome of a lost connection.
fn error_kind(e: &pgmq_client::Error) -> String {
    use pgmq_client::Error as E;
    match e {
        E::ConnectionLost { outcome, .. } => format!("ConnectionLost({outcome})"),
        E::PoolTimeout => "PoolTimeout".into(),
        E::Connect(_) => "Connect".into(),
        E::Database { .. } => "Database".into(),
        other => format!("{other:?}")
            .chars()
            .take_while(|c| c.is_alphanumeric())
            .collect(),
    }
}

impl Produced {
    /// Records one call's result for `keys` (ids in order on success).
    pub(crate) fn record(&mut self, keys: &[i64], result: &Result<Vec<i64>, pgmq_client::Error>) {
        match result {
            Ok(ids) => {
                self.calls += 1;
                let call = self.calls;
                for (i, key) in keys.iter().enumerate() {
                    self.records.push(ProduceRecord {
                        key: *key,
                        outcome: ProduceOutcome::Committed,
                        msg_id: ids.get(i).copied(),
                        recovered: None,
                        call,
                    });
                }
            }
            Err(e) => {
                self.note_error(e);
                self.record_as(keys, ProduceOutcome::of_error(e));
            }
        }
    }

    /// Counts a failed call by its kind, without recording a produce (a
    /// try that is retried).
    pub(crate) fn note_error(&mut self, e: &pgmq_client::Error) {
        *self.errors.entry(error_kind(e)).or_default() += 1;
    }

    /// Records a produce call without message ids: one that shared another
    /// call's outcome (a second queue's sends in one transaction), or failed.
    pub(crate) fn record_as(&mut self, keys: &[i64], outcome: ProduceOutcome) {
        self.calls += 1;
        for key in keys {
            self.records.push(ProduceRecord {
                key: *key,
                outcome,
                msg_id: None,
                recovered: None,
                call: self.calls,
            });
        }
    }

    /// Records a produce whose call was given up in flight (it timed out):
    /// its outcome is unknown, as after a lost connection.
    pub(crate) fn record_unknown(&mut self, keys: &[i64]) {
        *self.errors.entry("Timeout".into()).or_default() += 1;
        self.record_as(keys, ProduceOutcome::Unknown);
    }

    /// Records a produce the server refused (a raw send, say).
    pub(crate) fn record_rejected(&mut self, key: i64) {
        self.calls += 1;
        *self.errors.entry("Database".into()).or_default() += 1;
        self.records.push(ProduceRecord {
            key,
            outcome: ProduceOutcome::Rejected,
            msg_id: None,
            recovered: None,
            call: self.calls,
        });
    }

    /// The keys of rejected produces.
    pub(crate) fn rejected_keys(&self) -> HashSet<i64> {
        self.records
            .iter()
            .filter(|r| r.outcome == ProduceOutcome::Rejected)
            .map(|r| r.key)
            .collect()
    }

    /// Appends another producer's records.
    pub(crate) fn merge(&mut self, other: Produced) {
        let base = self.calls;
        for (k, n) in other.errors {
            *self.errors.entry(k).or_default() += n;
        }
        for mut r in other.records {
            r.call += base;
            self.records.push(r);
        }
        self.calls += other.calls;
    }

    pub(crate) fn count(&self, o: ProduceOutcome) -> u64 {
        self.records.iter().filter(|r| r.outcome == o).count() as u64
    }

    /// Marks each unknown produce recovered when its key is in `present`.
    pub(crate) fn classify_unknown(&mut self, present: &HashSet<i64>) {
        for r in &mut self.records {
            if r.outcome == ProduceOutcome::Unknown {
                r.recovered = Some(present.contains(&r.key));
            }
        }
    }

    /// The keys that must be handled or dead-lettered: committed ones and
    /// unknown ones that turned out to be in the queue.
    pub(crate) fn expected(&self) -> HashSet<i64> {
        self.records
            .iter()
            .filter(|r| r.outcome == ProduceOutcome::Committed || r.recovered == Some(true))
            .map(|r| r.key)
            .collect()
    }

    /// Writes the records to `pgmq_fault_produced`.
    pub(crate) async fn persist(
        &self,
        client: &Client,
        run_id: &str,
        scenario: &str,
    ) -> Result<(), BoxError> {
        let conn = client.connection().await?;
        for chunk in self.records.chunks(5_000) {
            let keys: Vec<i64> = chunk.iter().map(|r| r.key).collect();
            let ids: Vec<Option<i64>> = chunk.iter().map(|r| r.msg_id).collect();
            let outcomes: Vec<&str> = chunk.iter().map(|r| r.outcome.as_str()).collect();
            let recovered: Vec<Option<bool>> = chunk.iter().map(|r| r.recovered).collect();
            conn.execute(
                "insert into pgmq_fault_produced (run_id, scenario, key, msg_id, outcome, recovered) \
                 select $1, $2, k, i, o, r \
                 from unnest($3::bigint[], $4::bigint[], $5::text[], $6::bool[]) as t(k, i, o, r)",
                &[&run_id, &scenario, &keys, &ids, &outcomes, &recovered],
            )
            .await?;
        }
        Ok(())
    }
}

/// One row of the ledger.
#[derive(Debug, Clone)]
pub(crate) struct Handling {
    pub key: i64,
    pub msg_id: i64,
    pub worker_pid: i32,
    pub read_ct: i32,
    /// The attempts the message's header said were used before this
    /// delivery (the worker's retries write it; 0 without one).
    pub attempts: i32,
    pub read_at: Option<DateTime<Utc>>,
    pub vt: DateTime<Utc>,
    pub started_at: DateTime<Utc>,
    pub handled_at: DateTime<Utc>,
}

/// The rows of `sql` for one scenario (`$1` the run id, `$2` the
/// scenario), each made a `T` by `row`.
async fn of_scenario<T>(
    client: &Client,
    run_id: &str,
    scenario: &str,
    sql: &str,
    row: impl Fn(&tokio_postgres::Row) -> T,
) -> Result<Vec<T>, BoxError> {
    let conn = client.connection().await?;
    let rows = conn.query(sql, &[&run_id, &scenario]).await?;
    Ok(rows.iter().map(row).collect())
}

/// Every handling of a scenario.
pub(crate) async fn handlings(
    client: &Client,
    run_id: &str,
    scenario: &str,
) -> Result<Vec<Handling>, BoxError> {
    of_scenario(
        client,
        run_id,
        scenario,
        "select key, msg_id, worker_pid, read_ct, read_at, vt, started_at, handled_at, \
                    coalesce(attempts, 0) \
             from pgmq_fault_ledger where run_id = $1 and scenario = $2 order by handled_at",
        |r| Handling {
            key: r.get(0),
            msg_id: r.get(1),
            worker_pid: r.get(2),
            read_ct: r.get(3),
            read_at: r.get(4),
            vt: r.get(5),
            started_at: r.get(6),
            handled_at: r.get(7),
            attempts: r.get(8),
        },
    )
    .await
}

/// One handler run as `record_starts` and the ledger saw it: its start and,
/// when it completed, its end (both by the server's clock).
#[derive(Debug, Clone)]
pub(crate) struct Window {
    pub key: i64,
    pub worker_pid: i32,
    pub start: DateTime<Utc>,
    pub end: Option<DateTime<Utc>>,
}

/// Every recorded handler start of a scenario, with the end its ledger row
/// gives (same key, process and delivery).
pub(crate) async fn windows(
    client: &Client,
    run_id: &str,
    scenario: &str,
) -> Result<Vec<Window>, BoxError> {
    of_scenario(
        client,
        run_id,
        scenario,
        "select s.key, s.worker_pid, s.started_at, \
                    (select min(l.handled_at) from pgmq_fault_ledger l \
                      where l.run_id = s.run_id and l.scenario = s.scenario and l.key = s.key \
                        and l.worker_pid = s.worker_pid and l.read_ct = s.read_ct) \
             from pgmq_fault_starts s where s.run_id = $1 and s.scenario = $2",
        |r| Window {
            key: r.get(0),
            worker_pid: r.get(1),
            start: r.get(2),
            end: r.get(3),
        },
    )
    .await
}

/// One recorded handler start (`record_starts`): which delivery of which
/// key began when (server clock).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start {
    pub key: i64,
    pub worker_pid: i32,
    pub read_ct: i32,
    /// The attempts used before this delivery (see [`Handling::attempts`]).
    pub attempts: i32,
    pub started_at: DateTime<Utc>,
}

/// Every recorded handler start of a scenario.
pub(crate) async fn starts(
    client: &Client,
    run_id: &str,
    scenario: &str,
) -> Result<Vec<Start>, BoxError> {
    of_scenario(
        client,
        run_id,
        scenario,
        "select key, worker_pid, read_ct, started_at, coalesce(attempts, 0) \
             from pgmq_fault_starts where run_id = $1 and scenario = $2",
        |r| Start {
            key: r.get(0),
            worker_pid: r.get(1),
            read_ct: r.get(2),
            started_at: r.get(3),
            attempts: r.get(4),
        },
    )
    .await
}

/// Pairs of handler runs of one key, in two processes, whose windows overlap
/// in time: the message was being handled by both at once.
pub(crate) fn overlapping(windows: &[Window]) -> Vec<(&Window, &Window)> {
    // A run that never recorded its end is taken as still running: it
    // overlaps everything that started after it.
    let far = DateTime::<Utc>::MAX_UTC;
    pairs_across_processes(windows, |w| w.key, |w| w.worker_pid)
        .into_iter()
        .filter(|(a, b)| a.start < b.end.unwrap_or(far) && b.start < a.end.unwrap_or(far))
        .collect()
}

/// The most runs at once among `windows` (start to end; runs without an
/// end are left out, their end unknown), and when.
pub(crate) fn most_at_once(windows: &[Window]) -> (usize, Option<DateTime<Utc>>) {
    let mut edges: Vec<(DateTime<Utc>, i32)> = Vec::new();
    for w in windows {
        if let Some(end) = w.end {
            edges.push((w.start, 1));
            edges.push((end, -1));
        }
    }
    // An end before a start at the same instant.
    edges.sort();
    let (mut now, mut most, mut at) = (0i32, 0i32, None);
    for (t, d) in edges {
        now += d;
        if now > most {
            most = now;
            at = Some(t);
        }
    }
    (most.max(0) as usize, at)
}

/// Every pair of `items` of the same key from two different processes,
/// each pair once.
fn pairs_across_processes<T, P: PartialEq>(
    items: &[T],
    key: impl Fn(&T) -> i64,
    pid: impl Fn(&T) -> P,
) -> Vec<(&T, &T)> {
    let mut by_key: HashMap<i64, Vec<&T>> = HashMap::new();
    for x in items {
        by_key.entry(key(x)).or_default().push(x);
    }
    let mut out = Vec::new();
    for xs in by_key.values() {
        for (i, a) in xs.iter().enumerate() {
            for b in &xs[i + 1..] {
                if pid(a) != pid(b) {
                    out.push((*a, *b));
                }
            }
        }
    }
    out
}

/// Handlings of a scenario so far (progress while it runs).
pub(crate) async fn handled_count(
    client: &Client,
    run_id: &str,
    scenario: &str,
) -> Result<i64, BoxError> {
    let conn = client.connection().await?;
    let row = conn
        .query_one(
            "select count(*) from pgmq_fault_ledger where run_id = $1 and scenario = $2",
            &[&run_id, &scenario],
        )
        .await?;
    Ok(row.get(0))
}

/// Whether the worker process `pid` of the run is in a handler now: it
/// recorded a start (`record_starts`) that it has not recorded as handled.
pub(crate) async fn in_handler(client: &Client, run_id: &str, pid: u32) -> Result<bool, BoxError> {
    let conn = client.connection().await?;
    let pid = i32::try_from(pid)?;
    let row = conn
        .query_one(
            "select exists (select 1 from pgmq_fault_starts s \
               where s.run_id = $1 and s.worker_pid = $2 \
                 and not exists (select 1 from pgmq_fault_ledger l \
                   where l.run_id = s.run_id and l.scenario = s.scenario and l.key = s.key \
                     and l.worker_pid = s.worker_pid and l.read_ct = s.read_ct))",
            &[&run_id, &pid],
        )
        .await?;
    Ok(row.get(0))
}

/// The keys of the messages in a queue's table right now (visible or not),
/// without reading them (no `read_ct` change). The key is the `fault_key`
/// header, or for a dead letter the one pgmq-worker keeps in
/// `original_headers`, else the body's numeric `key`; it is extracted in SQL,
/// so that bodies and headers of any size and depth are fine. Messages
/// without a key are counted separately.
pub(crate) async fn keys_in_queue(
    client: &Client,
    queue: &QueueName,
) -> Result<(Vec<i64>, u64), BoxError> {
    let (rows, unkeyed) = ids_in_table(client, &queue.quoted_table()).await?;
    Ok((rows.into_iter().map(|(k, _)| k).collect(), unkeyed))
}

/// [`keys_in_queue`] with each message's id, of a queue's table or its
/// archive's ([`QueueName::quoted_table`],
/// [`QueueName::quoted_archive_table`]):
/// `(key, msg_id)` per keyed message, and how many have no key.
pub(crate) async fn ids_in_table(
    client: &Client,
    table: &str,
) -> Result<(Vec<(i64, i64)>, u64), BoxError> {
    let conn = client.connection().await?;
    let sql = format!(
        "select coalesce(
             case when jsonb_typeof(headers->'{h}') = 'number' then (headers->>'{h}')::bigint end,
             case when jsonb_typeof(headers->'original_headers'->'{h}') = 'number'
                  then (headers->'original_headers'->>'{h}')::bigint end,
             case when jsonb_typeof(message) = 'object' and jsonb_typeof(message->'key') = 'number'
                  then (message->>'key')::bigint end),
             msg_id
         from {table}",
        h = KEY_HEADER,
    );
    let rows = conn.query(sql.as_str(), &[]).await?;
    let mut keys = Vec::with_capacity(rows.len());
    let mut unkeyed = 0;
    for r in &rows {
        match r.get::<_, Option<i64>>(0) {
            Some(k) => keys.push((k, r.get(1))),
            None => unkeyed += 1,
        }
    }
    Ok((keys, unkeyed))
}

/// The `reason` pgmq-worker wrote on each keyed dead letter of `dlq`.
pub(crate) async fn dead_reasons(
    client: &Client,
    dlq: &QueueName,
) -> Result<HashMap<i64, String>, BoxError> {
    let conn = client.connection().await?;
    let sql = format!(
        "select (headers->'original_headers'->>'{h}')::bigint, coalesce(headers->>'reason', '') \
         from {} where jsonb_typeof(headers->'original_headers'->'{h}') = 'number'",
        dlq.quoted_table(),
        h = KEY_HEADER,
    );
    let rows = conn.query(sql.as_str(), &[]).await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// What a scenario left, read the one way the suite and the campaign read
/// it: its ledger rows, its dead letters (keys, how many have none, and the
/// reason written on each keyed one) and the messages still in its queue
/// (`(key, msg_id)`, and how many have no key).
pub(crate) struct End {
    pub handlings: Vec<Handling>,
    pub dead: (Vec<i64>, u64),
    pub dead_reasons: HashMap<i64, String>,
    pub left: (Vec<(i64, i64)>, u64),
}

/// Reads what scenario `scenario` of run `run_id` left in the ledger and in
/// its queue `q` and dead-letter queue `dlq`.
pub(crate) async fn end_of(
    client: &Client,
    (run_id, scenario): (&str, &str),
    (q, dlq): (&QueueName, &QueueName),
) -> Result<End, BoxError> {
    Ok(End {
        handlings: handlings(client, run_id, scenario).await?,
        dead: keys_in_queue(client, dlq).await?,
        dead_reasons: dead_reasons(client, dlq).await?,
        left: ids_in_table(client, &q.quoted_table()).await?,
    })
}

impl End {
    /// The keys still in the queue.
    pub(crate) fn left_keys(&self) -> Vec<i64> {
        self.left.0.iter().map(|(k, _)| *k).collect()
    }

    /// The scenario's [`tally`] against what was `produced`.
    pub(crate) fn tally(&self, produced: &Produced) -> Tally {
        let left = self.left.0.len() as u64 + self.left.1;
        tally(produced, &self.handlings, &self.dead.0, self.dead.1, left)
    }
}

/// The per-key accounting of one scenario.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Tally {
    pub committed: u64,
    pub not_sent: u64,
    pub rejected: u64,
    pub unknown: u64,
    pub unknown_recovered: u64,
    /// Distinct keys handled.
    pub handled: u64,
    /// Ledger rows (handlings), duplicates included.
    pub handlings: u64,
    /// Expected keys neither handled nor dead-lettered.
    pub lost: u64,
    /// Handlings beyond the first per key.
    pub duplicated: u64,
    /// Keys handled or dead-lettered that no successful (or recovered) produce sent.
    pub unexpected: u64,
    /// Keys found in the dead-letter queue.
    pub dead_lettered: u64,
    /// Messages still in the queue at the end (part of `lost`).
    pub left_in_queue: u64,
    /// Dead-lettered messages without any key.
    pub dead_lettered_unkeyed: u64,
    /// A few lost keys, to start an investigation with.
    pub lost_sample: Vec<i64>,
    /// A few unexpected keys.
    pub unexpected_sample: Vec<i64>,
}

impl Tally {
    /// The sum of several scenarios' (or queues') tallies; the samples
    /// keep a few keys of each.
    pub(crate) fn sum(ts: &[Tally]) -> Tally {
        let mut t = Tally::default();
        macro_rules! add {
            ($x:ident: $($count:ident),*) => {
                $(t.$count += $x.$count;)*
            };
        }
        for x in ts {
            add!(x: committed, not_sent, rejected, unknown, unknown_recovered, handled, handlings,
                lost, duplicated, unexpected, dead_lettered, left_in_queue, dead_lettered_unkeyed);
            t.lost_sample.extend(x.lost_sample.iter().take(4));
            t.unexpected_sample
                .extend(x.unexpected_sample.iter().take(4));
        }
        t
    }
}

/// Counts everything per key.
pub(crate) fn tally(
    produced: &Produced,
    handlings: &[Handling],
    dead: &[i64],
    dead_unkeyed: u64,
    left_in_queue: u64,
) -> Tally {
    let expected = produced.expected();
    let mut per_key: HashMap<i64, u64> = HashMap::new();
    for h in handlings {
        *per_key.entry(h.key).or_default() += 1;
    }
    let dead: HashSet<i64> = dead.iter().copied().collect();
    let mut lost: Vec<i64> = expected
        .iter()
        .filter(|k| !per_key.contains_key(k) && !dead.contains(k))
        .copied()
        .collect();
    lost.sort_unstable();
    let mut unexpected: Vec<i64> = per_key
        .keys()
        .chain(dead.iter())
        .filter(|k| !expected.contains(k))
        .copied()
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    unexpected.sort_unstable();
    Tally {
        committed: produced.count(ProduceOutcome::Committed),
        not_sent: produced.count(ProduceOutcome::NotSent),
        rejected: produced.count(ProduceOutcome::Rejected),
        unknown: produced.count(ProduceOutcome::Unknown),
        unknown_recovered: produced
            .records
            .iter()
            .filter(|r| r.recovered == Some(true))
            .count() as u64,
        handled: per_key.len() as u64,
        handlings: handlings.len() as u64,
        lost: lost.len() as u64,
        duplicated: per_key.values().map(|n| n - 1).sum(),
        unexpected: unexpected.len() as u64,
        dead_lettered: dead.len() as u64,
        left_in_queue,
        dead_lettered_unkeyed: dead_unkeyed,
        lost_sample: lost.into_iter().take(10).collect(),
        unexpected_sample: unexpected.into_iter().take(10).collect(),
    }
}

/// Handlings of one key by two different processes, counted two ways.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct CrossProcess {
    /// The later claim was read before the earlier claim's visibility timeout
    /// ended: two processes held the message at once (a violation).
    pub read_inside_vt: u64,
    /// The two handling windows overlapped in time (only legitimate after a
    /// visibility timeout ran out under a handler).
    pub windows_overlap: u64,
}

/// Compares every pair of handlings of the same key by different processes.
pub(crate) fn cross_process(handlings: &[Handling]) -> CrossProcess {
    let mut out = CrossProcess::default();
    for (a, b) in pairs_across_processes(handlings, |h| h.key, |h| h.worker_pid) {
        let (first, second) = if a.read_at <= b.read_at {
            (a, b)
        } else {
            (b, a)
        };
        if second.read_at.is_some_and(|r| r < first.vt) {
            out.read_inside_vt += 1;
        }
        if a.started_at < b.handled_at && b.started_at < a.handled_at {
            out.windows_overlap += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(key: i64, pid: i32, read_s: i64, vt_s: i64, start_s: i64, end_s: i64) -> Handling {
        let t = |s: i64| DateTime::<Utc>::from_timestamp(1_700_000_000 + s, 0).unwrap();
        Handling {
            key,
            msg_id: key,
            worker_pid: pid,
            read_ct: 1,
            attempts: 0,
            read_at: Some(t(read_s)),
            vt: t(vt_s),
            started_at: t(start_s),
            handled_at: t(end_s),
        }
    }

    #[test]
    fn counts_lost_duplicated_unexpected() {
        let mut p = Produced::default();
        p.record(&[1, 2, 3], &Ok(vec![10, 11, 12]));
        p.record(&[4], &Err(pgmq_client::Error::PoolTimeout));
        let hs = vec![
            h(1, 1, 0, 5, 0, 1),
            h(1, 1, 6, 11, 6, 7),
            h(4, 1, 0, 5, 0, 1),
            h(9, 1, 0, 5, 0, 1),
        ];
        let t = tally(&p, &hs, &[2], 0, 0);
        assert_eq!(t.committed, 3);
        assert_eq!(t.not_sent, 1);
        assert_eq!(t.handled, 3);
        assert_eq!(t.duplicated, 1);
        assert_eq!(t.lost, 1, "key 3 was neither handled nor dead-lettered");
        assert_eq!(t.lost_sample, vec![3]);
        assert_eq!(t.unexpected, 2, "4 was not sent, 9 never produced");
        assert_eq!(t.dead_lettered, 1);
    }

    #[test]
    fn recovered_unknowns_are_expected() {
        let mut p = Produced::default();
        p.record(&[7, 8], &Ok(vec![1, 2]));
        let mut unknown = Produced::default();
        unknown.record(
            &[5, 6],
            &Err(pgmq_client::Error::InvalidArgument("x".into())),
        );
        for r in &mut unknown.records {
            r.outcome = ProduceOutcome::Unknown;
        }
        p.merge(unknown);
        p.classify_unknown(&[5].into_iter().collect());
        assert_eq!(p.expected(), [5, 7, 8].into_iter().collect());
        let t = tally(&p, &[], &[], 0, 0);
        assert_eq!((t.unknown, t.unknown_recovered, t.lost), (2, 1, 3));
    }

    #[test]
    fn overlapping_windows() {
        let t = |s: i64| DateTime::<Utc>::from_timestamp(1_700_000_000 + s, 0).unwrap();
        let w = |key, pid, a, b: Option<i64>| Window {
            key,
            worker_pid: pid,
            start: t(a),
            end: b.map(t),
        };
        let ws = [
            w(1, 1, 0, Some(5)),
            w(1, 2, 6, Some(7)), // after: fine
            w(2, 1, 0, Some(5)),
            w(2, 2, 4, Some(6)), // overlaps
            w(3, 1, 0, None),
            w(3, 2, 9, Some(10)), // the first never ended: overlaps
            w(4, 1, 0, Some(5)),
            w(4, 1, 1, Some(6)), // same process: not counted
        ];
        let keys: HashSet<i64> = overlapping(&ws).iter().map(|(a, _)| a.key).collect();
        assert_eq!(keys, [2, 3].into_iter().collect());
    }

    #[test]
    fn cross_process_claims() {
        // Same key, two processes, second read before the first's vt ended.
        let c = cross_process(&[h(1, 1, 0, 10, 0, 1), h(1, 2, 5, 15, 5, 6)]);
        assert_eq!((c.read_inside_vt, c.windows_overlap), (1, 0));
        // Read after the vt ended while the first handler still ran.
        let c = cross_process(&[h(1, 1, 0, 10, 0, 12), h(1, 2, 11, 20, 11, 13)]);
        assert_eq!((c.read_inside_vt, c.windows_overlap), (0, 1));
        // Apart in time: fine.
        let c = cross_process(&[h(1, 1, 0, 10, 0, 1), h(1, 2, 11, 20, 11, 12)]);
        assert_eq!(c, CrossProcess::default());
        // Same process: not a cross-process pair.
        let c = cross_process(&[h(1, 1, 0, 10, 0, 1), h(1, 1, 5, 15, 5, 6)]);
        assert_eq!(c, CrossProcess::default());
    }
}
