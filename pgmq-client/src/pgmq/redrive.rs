//! Redrive: dead letters back to their source queue, one transaction per
//! batch (sent to the target and deleted from the dead-letter queue, or
//! neither). It is a move ([`Pgmq::move_batch`]) by ids, routed by each
//! message's `source_queue` header, that sends back its `original_headers`
//! ([`MoveHeaders::RestoreOriginal`](crate::MoveHeaders::RestoreOriginal)).
//! The `pgmq redrive` command and the operator console both run it.
//!
//! The dead letters are selected from the queue's table, not read with
//! `pgmq.read`: a batch locks its rows (`FOR UPDATE SKIP LOCKED`) without
//! claiming them, so the messages left in place keep their read_ct and
//! visibility, and nothing has to be given back at the end. Batches walk
//! msg_id upwards from a cursor and stop at the highest msg_id there was
//! when the run began, so the run ends even while new dead letters arrive
//! (they are for the next run).
//!
//! A message goes to [`RedriveOptions::to`] when set, else to the queue its
//! `source_queue` header names; one whose target is missing, is the
//! dead-letter queue itself or does not exist is left untouched, with the
//! reason ([`RedriveBatch::left`]). A batch whose COMMIT was lost is
//! [`Error::RedriveOutcomeUnknown`], naming what to check.

use std::collections::HashSet;

use serde_json::Value;
use tokio_postgres::GenericClient;

use crate::conn::error::{CommitOutcome, Error};
use crate::pgmq::message::RawJson;
use crate::pgmq::move_messages::{MoveBatch, MoveHeaders, MoveSelection};
use crate::pgmq::queue_name::QueueName;
use crate::{Client, Pgmq};

/// What a redrive moves and how: options with documented defaults.
///
/// ```
/// let opts = pgmq_client::RedriveOptions::new().batch(50).only(vec![7, 9]);
/// assert_eq!(opts.batch, 50);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedriveOptions {
    /// Send every message to this queue instead of its `source_queue`.
    /// Default: none.
    pub to: Option<QueueName>,
    /// Messages per transaction, 1 to [`MAX_BATCH`](crate::MAX_BATCH).
    /// Default: 100.
    pub batch: usize,
    /// Stop after this many messages (moved or left). Default: none.
    pub limit: Option<usize>,
    /// Describe what would move and move nothing. Default: false.
    pub dry_run: bool,
    /// Only these msg_ids of the dead-letter queue. Default: all.
    pub only: Option<Vec<i64>>,
}

impl Default for RedriveOptions {
    fn default() -> Self {
        RedriveOptions {
            to: None,
            batch: 100,
            limit: None,
            dry_run: false,
            only: None,
        }
    }
}

impl RedriveOptions {
    /// The defaults: every dead letter, to its source queue, 100 a batch.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets [`to`](Self::to).
    pub fn to(mut self, queue: QueueName) -> Self {
        self.to = Some(queue);
        self
    }
    /// Sets [`batch`](Self::batch).
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n;
        self
    }
    /// Sets [`limit`](Self::limit).
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = Some(n);
        self
    }
    /// Sets [`dry_run`](Self::dry_run).
    pub fn dry_run(mut self, yes: bool) -> Self {
        self.dry_run = yes;
        self
    }
    /// Sets [`only`](Self::only).
    pub fn only(mut self, ids: Vec<i64>) -> Self {
        self.only = Some(ids);
        self
    }
}

/// A message a redrive batch moved (or, in a dry run, would move).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedriveMoved {
    /// Its msg_id in the dead-letter queue.
    pub msg_id: i64,
    /// The queue it went to.
    pub queue: String,
    /// Its msg_id there (none in a dry run).
    pub new_msg_id: Option<i64>,
}

/// What one batch did: the messages moved and those left in place, with why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedriveBatch {
    /// The messages moved, in msg_id order per target queue.
    pub moved: Vec<RedriveMoved>,
    /// The messages left untouched, with the reason.
    pub left: Vec<(i64, String)>,
}

/// A redrive under way, batch by batch ([`Client::redrive`]).
///
/// ```no_run
/// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
/// let dlq = pgmq_client::QueueName::new("orders_dlq")?;
/// let mut run = client.redrive(&dlq, pgmq_client::RedriveOptions::new()).await?;
/// while let Some(batch) = run.next_batch().await? {
///     println!("{} moved, {} left", batch.moved.len(), batch.left.len());
/// }
/// # Ok(()) }
/// ```
pub struct Redrive<'c> {
    client: &'c Client,
    dlq: QueueName,
    opts: RedriveOptions,
    existing: HashSet<String>,
    after: i64,
    upto: i64,
    done: usize,
}

/// A dead letter as selected from the queue's table.
struct Dead {
    msg_id: i64,
    body: RawJson,
    headers: Option<Value>,
}

/// Where a dead letter goes, or why it stays.
fn target(
    headers: Option<&Value>,
    dlq: &QueueName,
    to: Option<&QueueName>,
    existing: &HashSet<String>,
) -> Result<QueueName, String> {
    if let Some(to) = to {
        return Ok(to.clone());
    }
    let Some(source) = headers
        .and_then(|h| h.get("source_queue"))
        .and_then(Value::as_str)
    else {
        return Err("no source_queue header (use --to)".to_owned());
    };
    let q = QueueName::new(source).map_err(|e| e.to_string())?;
    if &q == dlq {
        return Err("source_queue is the dead-letter queue itself".to_owned());
    }
    if !existing.contains(q.as_str()) {
        return Err(format!("source_queue {q} does not exist (use --to)"));
    }
    Ok(q)
}

/// The headers to send with: the original ones when the worker kept them
/// under `original_headers`, else the message's own.
fn restored_headers(h: Option<&Value>) -> Option<Value> {
    let h = h?;
    let h = match h.get("original_headers") {
        Some(original) if h.get("source_queue").is_some() => original,
        _ => h,
    };
    (!h.is_null()).then(|| h.clone())
}

/// The visible rows of `dlq` with msg_id in (`$1`, `$2`], among `$4` when
/// it is not NULL, at most `$3`, by msg_id; locked (passing over rows
/// another transaction holds) with `lock`.
fn select_sql(dlq: &QueueName, lock: bool) -> String {
    format!(
        "SELECT msg_id, message, headers FROM {} \
         WHERE msg_id > $1 AND msg_id <= $2 AND vt <= clock_timestamp() \
         AND ($4::bigint[] IS NULL OR msg_id = ANY($4)) \
         ORDER BY msg_id LIMIT $3{}",
        dlq.quoted_table(),
        if lock { " FOR UPDATE SKIP LOCKED" } else { "" }
    )
}

type Group = Vec<(i64, RawJson, Option<Value>)>;

impl Pgmq<crate::conn::client::Pool> {
    /// Starts a redrive of the dead letters of `dlq` ([`Redrive`]): checks
    /// that the queues exist and notes the highest msg_id there is now.
    /// `opts.to` naming `dlq` itself is [`Error::InvalidArgument`]; a queue
    /// that does not exist is [`Error::QueueNotFound`].
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let dlq = pgmq_client::QueueName::new("orders_dlq")?;
    /// let opts = pgmq_client::RedriveOptions::new().only(vec![42]);
    /// let mut run = client.redrive(&dlq, opts).await?;
    /// while run.next_batch().await?.is_some() {}
    /// # Ok(()) }
    /// ```
    pub async fn redrive(
        &self,
        dlq: &QueueName,
        opts: RedriveOptions,
    ) -> Result<Redrive<'_>, Error> {
        crate::conn::args::check_batch(opts.batch, "batch")?;
        if opts.batch == 0 {
            return Err(Error::InvalidArgument("a redrive batch of 0".into()));
        }
        if opts.to.as_ref() == Some(dlq) {
            return Err(Error::InvalidArgument(format!(
                "--to {dlq} is the dead-letter queue itself: name the queue the messages go back to"
            )));
        }
        let existing: HashSet<String> = self
            .list_queues()
            .await?
            .into_iter()
            .map(|q| q.queue_name)
            .collect();
        for q in std::iter::once(dlq).chain(&opts.to) {
            if !existing.contains(q.as_str()) {
                return Err(Error::QueueNotFound {
                    queue: q.as_str().to_owned(),
                });
            }
        }
        // The table name comes from a validated QueueName, quoted.
        let sql = format!(
            "SELECT coalesce(max(msg_id), 0) FROM {}",
            dlq.quoted_table()
        );
        let conn = self.connection().await?;
        let row = conn.query_one(&sql, &[]).await.map_err(Error::from)?;
        let upto: i64 = row.try_get(0).map_err(Error::from)?;
        Ok(Redrive {
            client: self,
            dlq: dlq.clone(),
            opts,
            existing,
            after: 0,
            upto,
            done: 0,
        })
    }
}

impl Redrive<'_> {
    /// The existing queues other than the dead-letter queue that the
    /// messages to move (the first [`limit`](RedriveOptions::limit) of them
    /// by msg_id) name in `source_queue`, by name: more than one means the
    /// run sends to several queues.
    pub async fn source_queues(&self) -> Result<Vec<String>, Error> {
        // The table name comes from a validated QueueName, quoted.
        let sql = format!(
            "SELECT DISTINCT s FROM (SELECT headers->>'source_queue' AS s FROM {} \
             WHERE ($2::bigint[] IS NULL OR msg_id = ANY($2)) \
             ORDER BY msg_id LIMIT $1) AS t WHERE s IS NOT NULL ORDER BY s",
            self.dlq.quoted_table()
        );
        let limit = self.opts.limit.map_or(i64::MAX, |l| l as i64);
        let conn = self.client.connection().await?;
        let rows = conn
            .query(&sql, &[&limit, &self.opts.only])
            .await
            .map_err(Error::from)?;
        let mut names = Vec::new();
        for r in rows {
            let s: String = r.try_get(0).map_err(Error::from)?;
            if self.existing.contains(&s) && s != self.dlq.as_str() {
                names.push(s);
            }
        }
        Ok(names)
    }

    /// How many messages the next batch reads; None once the limit is
    /// reached.
    fn want(&self) -> Option<usize> {
        match self.opts.limit {
            Some(limit) if self.done >= limit => None,
            Some(limit) => Some(self.opts.batch.min(limit - self.done)),
            None => Some(self.opts.batch),
        }
    }

    /// The next batch, in a transaction of its own: selected, sent to the
    /// targets, deleted from the dead-letter queue, committed (in a dry run,
    /// selected without locking and only described). None when nothing is
    /// left. An error leaves the batch unmoved, except
    /// [`Error::RedriveOutcomeUnknown`].
    pub async fn next_batch(&mut self) -> Result<Option<RedriveBatch>, Error> {
        let Some(want) = self.want() else {
            return Ok(None);
        };
        let mut conn = self.client.connection().await?;
        let range = (self.after, self.upto);
        if self.opts.dry_run {
            let msgs = self.select(&**conn, range, want, false).await?;
            let Some(last) = msgs.last().map(|m| m.msg_id) else {
                return Ok(None);
            };
            let (runs, left) = self.plan(msgs);
            let moved = runs
                .iter()
                .flat_map(|((q, _), g)| {
                    g.iter().map(move |(old, _, _)| RedriveMoved {
                        msg_id: *old,
                        queue: q.as_str().to_owned(),
                        new_msg_id: None,
                    })
                })
                .collect();
            return Ok(Some(self.advance(last, RedriveBatch { moved, left })));
        }
        let tx = conn.transaction().await?;
        let msgs = self.select(&*tx, range, want, true).await?;
        let Some(last) = msgs.last().map(|m| m.msg_id) else {
            return Ok(None);
        };
        let (runs, left) = self.plan(msgs);
        let pg = Pgmq::on(&tx);
        let mut batch = RedriveBatch {
            moved: Vec::new(),
            left,
        };
        let mut moved_ids = Vec::new();
        // Per target queue, the new msg_ids: what to check when COMMIT is lost.
        let mut sent: Vec<(QueueName, Vec<i64>)> = Vec::new();
        for ((q, _), group) in runs {
            let ids: Vec<i64> = group.iter().map(|(old, _, _)| *old).collect();
            let one_move = MoveBatch::new(MoveSelection::Ids(ids))
                .limit(group.len())
                .headers(MoveHeaders::RestoreOriginal);
            let moved = pg.move_batch(&self.dlq, &q, &one_move).await?;
            let mut new_ids = Vec::with_capacity(moved.len());
            for m in moved {
                moved_ids.push(m.msg_id);
                new_ids.push(m.new_msg_id);
                batch.moved.push(RedriveMoved {
                    msg_id: m.msg_id,
                    queue: q.as_str().to_owned(),
                    new_msg_id: Some(m.new_msg_id),
                });
            }
            match sent.iter_mut().find(|(t, _)| *t == q) {
                Some((_, ids)) => ids.extend(new_ids),
                None => sent.push((q, new_ids)),
            }
        }
        match tx.commit().await {
            Ok(()) => Ok(Some(self.advance(last, batch))),
            Err(e) if e.outcome() == CommitOutcome::Unknown && !moved_ids.is_empty() => {
                let targets: Vec<String> = sent
                    .iter()
                    .map(|(q, ids)| format!("{q} for new msg_ids {}", join(ids)))
                    .collect();
                Err(Error::RedriveOutcomeUnknown(format!(
                    "{e}: the outcome of this batch is unknown (the connection was lost during \
                     COMMIT): check the target queue {} and the dead-letter queue {} for msg_ids \
                     {} (a message that moved is in the first and gone from the second)",
                    targets.join(", "),
                    self.dlq,
                    join(&moved_ids)
                )))
            }
            Err(e) => Err(e),
        }
    }

    /// Moves the cursor past a batch whose highest msg_id was `last`.
    fn advance(&mut self, last: i64, b: RedriveBatch) -> RedriveBatch {
        self.after = last;
        self.done += b.moved.len() + b.left.len();
        b
    }

    async fn select<C: GenericClient>(
        &self,
        pg: &C,
        (after, upto): (i64, i64),
        want: usize,
        lock: bool,
    ) -> Result<Vec<Dead>, Error> {
        let rows = pg
            .query(
                &select_sql(&self.dlq, lock),
                &[&after, &upto, &(want as i64), &self.opts.only],
            )
            .await
            .map_err(Error::from)?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let body: Option<RawJson> = r.try_get(1).map_err(Error::from)?;
            let headers: Option<RawJson> = r.try_get(2).map_err(Error::from)?;
            let msg_id: i64 = r.try_get(0).map_err(Error::from)?;
            let headers = headers
                .map(|h| h.decode())
                .transpose()
                .map_err(|source| Error::DeserializeHeaders { msg_id, source })?;
            out.push(Dead {
                msg_id,
                body: body.unwrap_or_else(RawJson::null),
                headers,
            });
        }
        Ok(out)
    }

    /// A batch sorted out: runs of consecutive messages with the same target
    /// and the same presence of headers (one send each, in msg_id order, so
    /// each target gets its messages back in their order), and those that
    /// stay, with why.
    #[allow(clippy::type_complexity)]
    fn plan(&self, msgs: Vec<Dead>) -> (Vec<((QueueName, bool), Group)>, Vec<(i64, String)>) {
        let mut runs: Vec<((QueueName, bool), Group)> = Vec::new();
        let mut left = Vec::new();
        for m in msgs {
            match target(
                m.headers.as_ref(),
                &self.dlq,
                self.opts.to.as_ref(),
                &self.existing,
            ) {
                Ok(q) => {
                    let headers = restored_headers(m.headers.as_ref());
                    let key = (q, headers.is_some());
                    match runs.last_mut() {
                        Some((k, run)) if *k == key => run.push((m.msg_id, m.body, headers)),
                        _ => runs.push((key, vec![(m.msg_id, m.body, headers)])),
                    }
                }
                Err(why) => left.push((m.msg_id, why)),
            }
        }
        (runs, left)
    }
}

fn join(ids: &[i64]) -> String {
    ids.iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_locks_only_what_it_moves() {
        let q = QueueName::new("jobs_dlq").unwrap();
        let sql = select_sql(&q, true);
        assert!(sql.contains("FROM pgmq.\"q_jobs_dlq\""));
        assert!(sql.ends_with("LIMIT $3 FOR UPDATE SKIP LOCKED"));
        assert!(!select_sql(&q, false).contains("FOR UPDATE"));
    }

    #[test]
    fn a_message_stays_when_its_source_cannot_take_it() {
        let dlq = QueueName::new("dlq").unwrap();
        let existing: HashSet<String> = ["dlq".to_owned(), "jobs".to_owned()].into();
        let h = serde_json::json!({"source_queue": "jobs", "original_headers": {"a": 1}});
        assert_eq!(
            target(Some(&h), &dlq, None, &existing).unwrap().as_str(),
            "jobs"
        );
        assert_eq!(
            restored_headers(Some(&h)),
            Some(serde_json::json!({"a": 1}))
        );
        let gone = serde_json::json!({"source_queue": "gone"});
        assert!(target(Some(&gone), &dlq, None, &existing)
            .unwrap_err()
            .contains("does not exist"));
        let itself = serde_json::json!({"source_queue": "dlq"});
        assert!(target(Some(&itself), &dlq, None, &existing).is_err());
        assert!(target(None, &dlq, None, &existing).is_err());
    }
}
