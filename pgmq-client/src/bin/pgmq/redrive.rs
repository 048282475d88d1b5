//! `pgmq redrive`: dead letters back to their source queue, one
//! transaction per batch (sent to the target and deleted from the
//! dead-letter queue, or neither). It is a move
//! ([`Pgmq::move_batch`]) by ids, routed by each message's `source_queue`
//! header and sending back its `original_headers`
//! ([`MoveHeaders::RestoreOriginal`]).
//!
//! The dead letters are selected from the queue's table, not read with
//! `pgmq.read`: a batch locks its rows (`FOR UPDATE SKIP LOCKED`) without
//! claiming them, so the messages left in place keep their read_ct and
//! visibility, and nothing has to be given back at the end. Batches walk
//! msg_id upwards from a cursor and stop at the highest msg_id there was
//! when the run began, so the run ends even while new dead letters arrive
//! (they are for the next run).

use pgmq_client::{Client, CommitOutcome, MoveBatch, MoveHeaders, MoveSelection, Pgmq, QueueName};
use serde_json::{json, Value};
use tokio_postgres::GenericClient;

use crate::{fail, Exit, Failure, Out};

pub(crate) struct Opts {
    pub dlq: QueueName,
    pub to: Option<QueueName>,
    pub batch: usize,
    pub limit: Option<usize>,
    pub dry_run: bool,
    /// Move to several source queues without asking.
    pub yes: bool,
}

/// The queues that exist, by name: a `source_queue` header must name one.
type Existing = std::collections::HashSet<String>;

/// A dead letter as selected from the queue's table: what routes it.
struct Dead {
    msg_id: i64,
    headers: Option<Value>,
}

impl Dead {
    fn header(&self, key: &str) -> Option<&Value> {
        self.headers.as_ref()?.get(key)
    }
}

/// Where a dead letter goes, or why it stays.
fn target(m: &Dead, opts: &Opts, existing: &Existing) -> Result<QueueName, String> {
    if let Some(to) = &opts.to {
        return Ok(to.clone());
    }
    let Some(source) = m.header("source_queue").and_then(Value::as_str) else {
        return Err("no source_queue header (use --to)".to_owned());
    };
    let q = QueueName::new(source).map_err(|e| e.to_string())?;
    if q == opts.dlq {
        return Err("source_queue is the dead-letter queue itself".to_owned());
    }
    if !existing.contains(q.as_str()) {
        return Err(format!("source_queue {q} does not exist (use --to)"));
    }
    Ok(q)
}

/// The next dead letters of `opts.dlq`: visible ones with msg_id in
/// (`after`, `upto`], at most `want`, by msg_id. With `lock` (inside a
/// batch's transaction) the rows are locked, and rows another transaction
/// holds are passed over.
async fn select<C: GenericClient>(
    pg: &C,
    opts: &Opts,
    (after, upto): (i64, i64),
    want: usize,
    lock: bool,
) -> Result<Vec<Dead>, Failure> {
    // The table name comes from a validated QueueName: [a-z0-9_] only.
    let sql = format!(
        "SELECT msg_id, headers FROM {} \
         WHERE msg_id > $1 AND msg_id <= $2 AND vt <= clock_timestamp() \
         ORDER BY msg_id LIMIT $3{}",
        opts.dlq.quoted_table(),
        if lock { " FOR UPDATE SKIP LOCKED" } else { "" }
    );
    let rows = pg
        .query(&sql, &[&after, &upto, &(want as i64)])
        .await
        .map_err(pgmq_client::Error::from)?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let headers: Option<pgmq_client::RawJson> =
            r.try_get(1).map_err(pgmq_client::Error::from)?;
        out.push(Dead {
            msg_id: r.try_get(0).map_err(pgmq_client::Error::from)?,
            headers: headers.map(|h| h.decode()).transpose()?,
        });
    }
    Ok(out)
}

/// A batch sorted out: runs of consecutive messages with the same target
/// (one move each, in msg_id order, so each target gets its messages back
/// in their order), how many stay, and the highest msg_id seen.
struct Plan {
    runs: Vec<(QueueName, Vec<i64>)>,
    skipped: usize,
    last: i64,
}

fn plan(msgs: Vec<Dead>, opts: &Opts, existing: &Existing) -> Plan {
    let mut p = Plan {
        runs: Vec::new(),
        skipped: 0,
        last: msgs.last().map_or(0, |m| m.msg_id),
    };
    for m in msgs {
        match target(&m, opts, existing) {
            Ok(q) => match p.runs.last_mut() {
                Some((k, run)) if *k == q => run.push(m.msg_id),
                _ => p.runs.push((q, vec![m.msg_id])),
            },
            Err(why) => {
                eprintln!("pgmq: redrive: message {} stays: {why}", m.msg_id);
                p.skipped += 1;
            }
        }
    }
    p
}

/// What a batch did (or, in a dry run, would do).
struct Batch {
    /// A line per message moved.
    lines: Vec<Value>,
    skipped: usize,
    /// The highest msg_id the batch saw: the next one starts after it.
    last: i64,
}

/// Why a run stopped in a batch.
enum Stop {
    /// The batch's transaction did not commit.
    NotMoved(String),
    /// The connection was lost during COMMIT: the batch may have moved.
    Unknown(String),
}

impl<E: std::fmt::Display> From<E> for Stop {
    fn from(e: E) -> Self {
        Stop::NotMoved(e.to_string())
    }
}

/// One batch in a transaction of its own: selected, sent to the targets,
/// deleted from the dead-letter queue, committed. In a dry run, selected
/// without locking and only described. None when nothing was left.
async fn one_batch(
    client: &Client,
    opts: &Opts,
    range: (i64, i64),
    want: usize,
    existing: &Existing,
) -> Result<Option<Batch>, Stop> {
    let mut conn = client.connection().await?;
    if opts.dry_run {
        let msgs = select(&**conn, opts, range, want, false)
            .await
            .map_err(|f| f.msg)?;
        return Ok((!msgs.is_empty()).then(|| described(plan(msgs, opts, existing))));
    }
    let tx = conn.transaction().await?;
    let msgs = select(&*tx, opts, range, want, true)
        .await
        .map_err(|f| f.msg)?;
    if msgs.is_empty() {
        return Ok(None);
    }
    let p = plan(msgs, opts, existing);
    let pg = Pgmq::on(&tx);
    let mut lines = Vec::new();
    let mut moved_ids = Vec::new();
    // Per target queue, the new msg_ids: what to check when COMMIT is lost.
    let mut sent: Vec<(QueueName, Vec<i64>)> = Vec::new();
    for (q, ids) in p.runs {
        let batch = MoveBatch::new(MoveSelection::Ids(ids))
            .limit(want)
            .headers(MoveHeaders::RestoreOriginal);
        let moved = pg
            .move_batch(&opts.dlq, &q, &batch)
            .await
            .map_err(|e| Stop::NotMoved(format!("moving to {q}: {e}")))?;
        for m in &moved {
            moved_ids.push(m.msg_id);
            lines
                .push(json!({"msg_id": m.msg_id, "queue": q.as_str(), "new_msg_id": m.new_msg_id}));
        }
        let new_ids = moved.iter().map(|m| m.new_msg_id);
        match sent.iter_mut().find(|(t, _)| *t == q) {
            Some((_, ids)) => ids.extend(new_ids),
            None => sent.push((q, new_ids.collect())),
        }
    }
    match tx.commit().await {
        Ok(()) => Ok(Some(Batch {
            lines,
            skipped: p.skipped,
            last: p.last,
        })),
        Err(e) if e.outcome() == CommitOutcome::Unknown && !moved_ids.is_empty() => {
            let targets: Vec<String> = sent
                .iter()
                .map(|(q, ids)| format!("{q} for new msg_ids {}", join(ids)))
                .collect();
            Err(Stop::Unknown(format!(
                "{e}: the outcome of this batch is unknown (the connection was lost during \
                 COMMIT): check the target queue {} and the dead-letter queue {} for msg_ids \
                 {} (a message that moved is in the first and gone from the second)",
                targets.join(", "),
                opts.dlq,
                join(&moved_ids)
            )))
        }
        Err(e) => Err(e.into()),
    }
}

/// A dry run's batch: a line per message that would move.
fn described(p: Plan) -> Batch {
    let lines = p
        .runs
        .iter()
        .flat_map(|(q, ids)| {
            ids.iter()
                .map(move |old| json!({"msg_id": old, "queue": q.as_str()}))
        })
        .collect();
    Batch {
        lines,
        skipped: p.skipped,
        last: p.last,
    }
}

fn join(ids: &[i64]) -> String {
    ids.iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
/// The existing queues the messages to move name in `source_queue` (the
/// first `--limit` of them by id), read from the table without hiding any.
async fn named_queues(
    client: &Client,
    opts: &Opts,
    existing: &Existing,
) -> Result<Vec<String>, Failure> {
    // The table name comes from a validated QueueName, quoted (quote_ident).
    let sql = format!(
        "SELECT DISTINCT s FROM (SELECT headers->>'source_queue' AS s FROM {} \
         ORDER BY msg_id LIMIT $1) AS t WHERE s IS NOT NULL ORDER BY s",
        opts.dlq.quoted_table()
    );
    let limit = opts.limit.map_or(i64::MAX, |l| l as i64);
    let conn = client.connection().await?;
    let pg: &tokio_postgres::Client = &conn;
    let rows = pg
        .query(&sql, &[&limit])
        .await
        .map_err(pgmq_client::Error::from)?;
    let mut names = Vec::new();
    for r in rows {
        let s: String = r.try_get(0).map_err(pgmq_client::Error::from)?;
        if existing.contains(&s) && s != opts.dlq.as_str() {
            names.push(s);
        }
    }
    Ok(names)
}

/// Moves the dead letters of `opts.dlq` back, batch by batch, printing a line
/// per message moved and a summary on stderr.
pub(crate) async fn run(client: &Client, opts: &Opts, out: &mut Out) -> Result<(), Failure> {
    if opts.to.as_ref() == Some(&opts.dlq) {
        return Err(Failure::new(
            Exit::Usage,
            format!(
                "--to {} is the dead-letter queue itself: name the queue the messages go back to",
                opts.dlq
            ),
        ));
    }
    let existing = existing_queues(client).await?;
    for q in std::iter::once(&opts.dlq).chain(&opts.to) {
        if !existing.contains(q.as_str()) {
            return Err(Failure::new(
                Exit::NotFound,
                format!("queue {q} does not exist"),
            ));
        }
    }
    if opts.to.is_none() && !opts.yes {
        refuse_several_sources(client, opts, &existing).await?;
    }
    let upto = crate::move_msgs::highest_id(client, &opts.dlq).await?;
    let (mut after, mut moved, mut skipped) = (0i64, 0usize, 0usize);
    while let Some(want) = batch_size(opts, moved + skipped) {
        match one_batch(client, opts, (after, upto), want, &existing).await {
            Ok(Some(b)) => {
                after = b.last;
                moved += b.lines.len();
                skipped += b.skipped;
                for l in &b.lines {
                    out.line(l).await?;
                }
                out.flush().await?;
            }
            Ok(None) => break,
            Err(Stop::NotMoved(e)) => {
                return fail(format!(
                    "{e}; nothing of this batch was moved ({moved} moved before)"
                ))
            }
            Err(Stop::Unknown(e)) => return fail(format!("{e}; {moved} moved before")),
        }
    }
    report(opts, moved, skipped);
    Ok(())
}

/// The names of the queues that exist.
async fn existing_queues(client: &Client) -> Result<Existing, Failure> {
    Ok(client
        .list_queues()
        .await?
        .into_iter()
        .map(|q| q.queue_name)
        .collect())
}

/// Without `--to` or `--yes`, refuses to move messages that name more than
/// one source queue.
async fn refuse_several_sources(
    client: &Client,
    opts: &Opts,
    existing: &Existing,
) -> Result<(), Failure> {
    let names = named_queues(client, opts, existing).await?;
    if names.len() > 1 {
        return Err(Failure::new(
            Exit::Refused,
            format!(
                "the messages name {} source queues ({}): pass --yes to move each back to its \
                 own, or --to QUEUE to send them all to one",
                names.len(),
                names.join(", ")
            ),
        ));
    }
    Ok(())
}

/// How many messages the next batch reads, `done` having been moved or
/// skipped; None once `--limit` is reached.
fn batch_size(opts: &Opts, done: usize) -> Option<usize> {
    match opts.limit {
        Some(limit) if done >= limit => None,
        Some(limit) => Some(opts.batch.min(limit - done)),
        None => Some(opts.batch),
    }
}

/// The summary on stderr: how many moved (or would), how many stay.
fn report(opts: &Opts, moved: usize, skipped: usize) {
    let verb = if opts.dry_run { "would move" } else { "moved" };
    let left = if skipped == 0 {
        String::new()
    } else {
        format!("; {skipped} left in place")
    };
    eprintln!(
        "pgmq: redrive: {verb} {moved} message(s) from {}{left}",
        opts.dlq
    );
}
