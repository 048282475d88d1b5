//! `pgmq redrive`: dead letters back to their source queue, one
//! transaction per batch (sent to the target and deleted from the
//! dead-letter queue, or neither).

use std::time::Duration;

use pgmq_client::{Client, Executor, Message, Pgmq, QueueName, RawJson, SendOptions, Transaction};
use serde_json::{json, Value};

use crate::{Failure, Out};

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

/// How long messages being moved stay hidden from other readers; a batch
/// commits well within it.
const HOLD: Duration = Duration::from_secs(60);

/// Where a dead letter goes, or why it stays.
fn target(m: &Message<RawJson>, opts: &Opts, existing: &Existing) -> Result<QueueName, String> {
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

/// The headers to send with: the original ones when the worker kept them
/// under `original_headers`, else the message's own.
fn restored_headers(m: &Message<RawJson>) -> Option<Value> {
    let h = m.headers.as_ref()?;
    let h = match h.get("original_headers") {
        Some(original) if h.get("source_queue").is_some() => original,
        _ => h,
    };
    (!h.is_null()).then(|| h.clone())
}

type Group = Vec<(i64, RawJson, Option<Value>)>;

/// Moves one batch on `pg` (inside the caller's transaction); returns the
/// lines to print, or None when the dead-letter queue had nothing left.
async fn one_batch<E: Executor>(
    pg: &Pgmq<E>,
    opts: &Opts,
    want: usize,
    skipped: &mut Vec<i64>,
    existing: &Existing,
) -> Result<Option<Vec<Value>>, Failure> {
    let mut msgs: Vec<Message<RawJson>> = pg.read_raw(&opts.dlq, HOLD, want).await?;
    if msgs.is_empty() {
        return Ok(None);
    }
    msgs.sort_by_key(|m| m.msg_id);
    // Runs of consecutive messages with the same target and the same
    // presence of headers: one send each, in msg_id order, so each target
    // gets its messages back in their order.
    let mut runs: Vec<((QueueName, bool), Group)> = Vec::new();
    for m in msgs {
        match target(&m, opts, existing) {
            Ok(q) => {
                let headers = restored_headers(&m);
                let key = (q, headers.is_some());
                match runs.last_mut() {
                    Some((k, run)) if *k == key => run.push((m.msg_id, m.body, headers)),
                    _ => runs.push((key, vec![(m.msg_id, m.body, headers)])),
                }
            }
            Err(why) => {
                eprintln!("pgmq: redrive: message {} stays: {why}", m.msg_id);
                skipped.push(m.msg_id);
            }
        }
    }
    let mut lines = Vec::new();
    let mut moved_ids = Vec::new();
    for ((q, with_headers), group) in runs {
        let bodies: Vec<&RawJson> = group.iter().map(|(_, b, _)| b).collect();
        let mut send = SendOptions::new();
        send.headers_each =
            with_headers.then(|| group.iter().filter_map(|(_, _, h)| h.clone()).collect());
        let new_ids = pg
            .send_batch_with(&q, &bodies, &send)
            .await
            .map_err(|e| Failure(format!("sending to {q}: {e}")))?;
        for ((old, _, _), new) in group.iter().zip(new_ids) {
            moved_ids.push(*old);
            lines.push(if opts.dry_run {
                json!({"msg_id": old, "queue": q.as_str()})
            } else {
                json!({"msg_id": old, "queue": q.as_str(), "new_msg_id": new})
            });
        }
    }
    pg.delete_batch(&opts.dlq, &moved_ids).await?;
    Ok(Some(lines))
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
    let existing = existing_queues(client).await?;
    if opts.to.is_none() && !opts.yes {
        refuse_several_sources(client, opts, &existing).await?;
    }
    let mut moved = 0usize;
    let mut skipped: Vec<i64> = Vec::new();
    // A dry run reads every batch in one transaction (each read hides what
    // it read from the next) and rolls it back.
    let mut dry_conn = if opts.dry_run {
        Some(client.connection().await?)
    } else {
        None
    };
    let dry_tx = match dry_conn.as_mut() {
        Some(c) => Some(c.transaction().await?),
        None => None,
    };
    let result = loop {
        let Some(want) = batch_size(opts, moved + skipped.len()) else {
            break Ok(());
        };
        let lines = match &dry_tx {
            Some(tx) => one_batch(&Pgmq::on(tx), opts, want, &mut skipped, &existing).await,
            None => {
                let mut conn = client.connection().await?;
                let tx = conn.transaction().await?;
                committed_batch(tx, opts, want, &mut skipped, &existing).await
            }
        };
        match lines {
            Ok(Some(lines)) => {
                moved += lines.len();
                for l in &lines {
                    out.line(l).await?;
                }
                out.flush().await?;
            }
            Ok(None) => break Ok(()),
            Err(Failure(e)) => {
                break Err(Failure(format!(
                    "{e}; nothing of this batch was moved ({moved} moved before)"
                )))
            }
        }
    };
    match dry_tx {
        Some(tx) => tx.rollback().await?,
        None => give_back(client, opts, &skipped).await?,
    }
    result?;
    report(opts, moved, skipped.len());
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
        return Err(Failure(format!(
            "the messages name {} source queues ({}): pass --yes to move each back to its own, \
             or --to QUEUE to send them all to one",
            names.len(),
            names.join(", ")
        )));
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

/// One batch in `tx`, a transaction of its own, committed when it moved.
async fn committed_batch(
    tx: Transaction<'_>,
    opts: &Opts,
    want: usize,
    skipped: &mut Vec<i64>,
    existing: &Existing,
) -> Result<Option<Vec<Value>>, Failure> {
    let lines = one_batch(&Pgmq::on(&tx), opts, want, skipped, existing).await?;
    tx.commit().await?;
    Ok(lines)
}

/// Makes the messages left in place visible again: the reads hid them.
async fn give_back(client: &Client, opts: &Opts, skipped: &[i64]) -> Result<(), Failure> {
    if !skipped.is_empty() {
        client
            .set_vt_batch(&opts.dlq, skipped, Duration::ZERO)
            .await?;
    }
    Ok(())
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
