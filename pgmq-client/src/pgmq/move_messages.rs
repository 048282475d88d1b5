//! Moving messages from one queue to another: a batch sent to the target
//! and deleted from the source in one statement.
//!
//! The statement locks the batch's rows in the source queue (`FOR UPDATE
//! SKIP LOCKED`: rows another transaction holds are passed over, never
//! waited for), sends their `message` and `headers` to `pgmq.send_batch` on
//! the target as stored (never through the client, so the copy is exact),
//! and deletes them from the source. Being one statement it is one
//! transaction: a message is either in the target and gone from the source,
//! or left where it was; a connection cut at any point loses and doubles
//! nothing. Inside a caller's transaction ([`Pgmq::on`]) the batch commits
//! with it.
//!
//! Only visible messages move (`vt` not in the future): a message being
//! handled stays, so that no handler's work runs again in the target.
//! What a moved message keeps: its body and headers, exactly. What it does
//! not keep: its `msg_id` (the target gives a new one, returned beside the
//! old), its `read_ct` (0 in the target, as for any message sent: the
//! target's retry limit starts afresh), its `enqueued_at` (the move's time).

use serde_json::Value;
use tokio_postgres::types::Type;

use crate::conn::args::check_batch;
use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::pgmq::dead_letter::names_missing_queue;
use crate::pgmq::queue_name::QueueName;
use crate::Pgmq;

/// Which messages of the source queue a move takes.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum MoveSelection {
    /// Every visible message.
    All,
    /// The visible messages with these ids.
    Ids(Vec<i64>),
    /// The visible messages whose body contains `body` and whose headers
    /// contain `headers` (JSON containment, `@>`; `None` matches all).
    Matching {
        /// What the body must contain, e.g. `{"tenant": "acme"}`.
        body: Option<Value>,
        /// What the headers must contain.
        headers: Option<Value>,
    },
}

/// What the copies' headers are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MoveHeaders {
    /// The message's headers, exactly (the default).
    #[default]
    Keep,
    /// For a dead letter (headers with `source_queue` and
    /// `original_headers`, as [`Pgmq::dead_letter_fenced`] writes them):
    /// its `original_headers`; any other message's own headers. A JSON
    /// `null` becomes no headers. What `pgmq redrive` sends back.
    RestoreOriginal,
}

/// One batch of a move ([`Pgmq::move_batch`]): which messages, within
/// which msg_id range, how many at most, with which headers.
///
/// ```
/// use pgmq_client::{MoveBatch, MoveSelection};
/// let b = MoveBatch::new(MoveSelection::All).after(41).limit(500);
/// assert_eq!((b.after, b.upto, b.limit), (41, i64::MAX, 500));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct MoveBatch {
    /// Which messages.
    pub select: MoveSelection,
    /// Only msg_ids above this (a cursor; default 0).
    pub after: i64,
    /// Only msg_ids up to this (default `i64::MAX`): a run that stops at
    /// the highest msg_id there was when it began ends while new messages
    /// arrive.
    pub upto: i64,
    /// At most this many messages, the lowest msg_ids first (default 100;
    /// 1 to [`MAX_BATCH`](crate::MAX_BATCH)).
    pub limit: usize,
    /// The copies' headers (default [`MoveHeaders::Keep`]).
    pub headers: MoveHeaders,
}

impl MoveBatch {
    /// A batch of `select`, with the defaults above.
    pub fn new(select: MoveSelection) -> Self {
        MoveBatch {
            select,
            after: 0,
            upto: i64::MAX,
            limit: 100,
            headers: MoveHeaders::Keep,
        }
    }

    /// Only msg_ids above `id`.
    pub fn after(mut self, id: i64) -> Self {
        self.after = id;
        self
    }

    /// Only msg_ids up to `id`.
    pub fn upto(mut self, id: i64) -> Self {
        self.upto = id;
        self
    }

    /// At most `n` messages.
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = n;
        self
    }

    /// The copies' headers.
    pub fn headers(mut self, h: MoveHeaders) -> Self {
        self.headers = h;
        self
    }
}

/// A message moved: its id in the source and its id in the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Moved {
    /// Its msg_id in the source queue (gone from there).
    pub msg_id: i64,
    /// Its msg_id in the target queue.
    pub new_msg_id: i64,
}

/// The copies' headers, from the source row `p`.
fn headers_expr(h: MoveHeaders) -> &'static str {
    match h {
        MoveHeaders::Keep => "p.headers",
        MoveHeaders::RestoreOriginal => {
            "NULLIF(CASE WHEN pg_catalog.jsonb_typeof(p.headers) = 'object' \
             AND p.headers ? 'source_queue' AND p.headers ? 'original_headers' \
             THEN p.headers -> 'original_headers' ELSE p.headers END, 'null'::jsonb)"
        }
    }
}

/// The move of at most `$6` visible messages of `from` with msg_id in
/// (`$1`, `$2`], among the ids `$3` (when not null), bodies containing `$4`
/// and headers containing `$5` (when not null), to queue `$7`; returns the
/// source ids deleted and the target ids sent, each ascending (the copies
/// are sent in msg_id order, and the target's ids rise in the order sent).
fn move_sql(from: &QueueName, headers: MoveHeaders) -> String {
    format!(
        "\
WITH picked AS (
    SELECT m.msg_id, m.message, m.headers FROM {t} AS m
    WHERE m.msg_id > $1 AND m.msg_id <= $2 AND m.vt <= pg_catalog.clock_timestamp()
      AND ($3::bigint[] IS NULL OR m.msg_id = ANY($3::bigint[]))
      AND ($4::jsonb IS NULL OR m.message @> $4::jsonb)
      AND ($5::jsonb IS NULL OR m.headers @> $5::jsonb)
    ORDER BY m.msg_id LIMIT $6
    FOR UPDATE OF m SKIP LOCKED
), batch AS (
    SELECT pg_catalog.array_agg(p.message ORDER BY p.msg_id) AS bodies,
           pg_catalog.array_agg({h} ORDER BY p.msg_id) AS headers
    FROM picked p
    HAVING pg_catalog.count(*) > 0
), sent AS (
    SELECT s.id FROM batch b, LATERAL pgmq.send_batch($7::text, b.bodies, b.headers, 0) AS s(id)
), removed AS (
    DELETE FROM {t} AS m USING picked p WHERE m.msg_id = p.msg_id RETURNING m.msg_id
)
SELECT (SELECT pg_catalog.array_agg(msg_id ORDER BY msg_id) FROM removed),
       (SELECT pg_catalog.array_agg(id ORDER BY id) FROM sent)",
        t = from.quoted_table(),
        h = headers_expr(headers),
    )
}

impl<E: Executor> Pgmq<E> {
    /// Moves one batch of messages from `from` to `to` in one statement
    /// (see the module docs: exact copies, visible messages only, rows
    /// other transactions hold passed over, `read_ct` starting at 0 in the
    /// target); returns each message moved with its new id, by msg_id.
    /// Fewer than `batch.limit` (or none) when fewer matched.
    ///
    /// To move everything that matches, call it again with `after` set to
    /// the last msg_id moved until it returns nothing (`pgmq move` does,
    /// stopping at the highest msg_id there was when it began). A missing
    /// queue is [`Error::QueueNotFound`] naming it; `from == to` is
    /// [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::{MoveBatch, MoveSelection, QueueName};
    /// let (from, to) = (QueueName::new("orders")?, QueueName::new("orders_eu")?);
    /// let select = MoveSelection::Matching {
    ///     body: Some(serde_json::json!({"region": "eu"})),
    ///     headers: None,
    /// };
    /// let mut batch = MoveBatch::new(select).limit(500);
    /// loop {
    ///     let moved = client.move_batch(&from, &to, &batch).await?;
    ///     let Some(last) = moved.last() else { break };
    ///     batch = batch.after(last.msg_id);
    /// }
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.move_batch", skip_all, fields(queue = %from, to = %to, batch = batch.limit))]
    pub async fn move_batch(
        &self,
        from: &QueueName,
        to: &QueueName,
        batch: &MoveBatch,
    ) -> Result<Vec<Moved>, Error> {
        if from == to {
            return Err(Error::InvalidArgument(format!(
                "a move from {from} to itself"
            )));
        }
        check_batch(batch.limit, "move batch")?;
        if batch.limit == 0 {
            return Ok(Vec::new());
        }
        let (ids, body, headers): (Option<&[i64]>, Option<&Value>, Option<&Value>) = match &batch
            .select
        {
            MoveSelection::All => (None, None, None),
            MoveSelection::Ids(ids) if ids.is_empty() => return Ok(Vec::new()),
            MoveSelection::Ids(ids) => (Some(ids), None, None),
            MoveSelection::Matching { body, headers } => (None, body.as_ref(), headers.as_ref()),
        };
        let limit = batch.limit as i64;
        let target = to.as_str();
        let rows = self
            .executor()
            .query_text(
                &move_sql(from, batch.headers),
                &[
                    (&batch.after, Type::INT8),
                    (&batch.upto, Type::INT8),
                    (&ids, Type::INT8_ARRAY),
                    (&body, Type::JSONB),
                    (&headers, Type::JSONB),
                    (&limit, Type::INT8),
                    (&target, Type::TEXT),
                ],
            )
            .await
            .map_err(|e| {
                if names_missing_queue(&e, to) {
                    Error::QueueNotFound {
                        queue: target.to_owned(),
                    }
                } else {
                    e.in_queue(from.as_str())
                }
            })?;
        let Some(row) = rows.first() else {
            return Ok(Vec::new());
        };
        let old: Option<Vec<i64>> = row.try_get(0).map_err(Error::from_pg)?;
        let new: Option<Vec<i64>> = row.try_get(1).map_err(Error::from_pg)?;
        let (old, new) = (old.unwrap_or_default(), new.unwrap_or_default());
        if old.len() != new.len() {
            return Err(Error::InvalidArgument(format!(
                "a move deleted {} message(s) from {from} and sent {} to {to}",
                old.len(),
                new.len()
            )));
        }
        Ok(old
            .into_iter()
            .zip(new)
            .map(|(msg_id, new_msg_id)| Moved { msg_id, new_msg_id })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_move_locks_sends_and_deletes_in_one_statement() {
        let q = QueueName::new("jobs").unwrap();
        let sql = move_sql(&q, MoveHeaders::Keep);
        assert!(sql.contains("FROM pgmq.\"q_jobs\" AS m"));
        assert!(sql.contains("FOR UPDATE OF m SKIP LOCKED"));
        assert!(sql.contains("DELETE FROM pgmq.\"q_jobs\" AS m USING picked"));
        assert!(sql.contains("pgmq.send_batch($7::text"));
        assert!(sql.contains("m.vt <= pg_catalog.clock_timestamp()"));
        assert!(!sql.contains("original_headers"));
        let sql = move_sql(&q, MoveHeaders::RestoreOriginal);
        assert!(sql.contains("p.headers -> 'original_headers'"));
    }
}
