//! The fenced dead-letter move: messages still held by their deliveries
//! go to a dead-letter queue and leave their queue, in one statement.
//!
//! The statement locks the rows that still hold each delivery (the fence of
//! [`Receipt`]), sends their `message` and `headers` to
//! `pgmq.send_batch` on the dead-letter queue as stored (never through the
//! client, so the copy is exact: numbers of any precision, any nesting),
//! and deletes them from the source queue. Being one statement it is one
//! transaction: a message is either moved and gone, or left where it was.
//! Each copy's headers say why and from where:
//! `{reason, attempts, deliveries, source_queue, original_msg_id,
//! original_headers}`.

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;

use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::pgmq::fenced::{written, Receipt};
use crate::pgmq::queue_name::QueueName;
use crate::Pgmq;

/// One message to move to a dead-letter queue
/// ([`Pgmq::dead_letter_fenced`]): its delivery, and what its dead letter's
/// headers say about it.
///
/// ```
/// use pgmq_client::{DeadLetter, Receipt};
/// # let receipt = Receipt { msg_id: 1, read_at: chrono::Utc::now() };
/// let d = DeadLetter::new(receipt, "payment declined").attempts(5).deliveries(6);
/// assert_eq!(d.attempts, 5);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The delivery that gives up on the message.
    pub receipt: Receipt,
    /// Why (the dead letter's `reason` header).
    pub reason: String,
    /// The attempts made (the `attempts` header).
    pub attempts: u32,
    /// The times the message was delivered (the `deliveries` header).
    pub deliveries: u32,
}

impl DeadLetter {
    /// The message of `receipt`, given up for `reason`; no attempts or
    /// deliveries counted.
    pub fn new(receipt: Receipt, reason: impl Into<String>) -> Self {
        DeadLetter {
            receipt,
            reason: reason.into(),
            attempts: 0,
            deliveries: 0,
        }
    }

    /// Sets the attempts made.
    pub fn attempts(mut self, n: u32) -> Self {
        self.attempts = n;
        self
    }

    /// Sets the times the message was delivered.
    pub fn deliveries(mut self, n: u32) -> Self {
        self.deliveries = n;
        self
    }
}

/// The move of `$2 ids, $3 read_ats` (with `$4 reasons, $5 attempts,
/// $6 deliveries`) from queue `$1` to queue `$7`, the keys `$8` left out of
/// `original_headers`; returns the source ids moved and the number of
/// copies sent. The copies go out in the order of the input.
fn dead_letter_sql(queue: &QueueName) -> String {
    format!(
        "\
WITH dead AS (
    SELECT * FROM ROWS FROM (pg_catalog.unnest($2::bigint[]), pg_catalog.unnest($3::timestamptz[]),
        pg_catalog.unnest($4::text[]), pg_catalog.unnest($5::integer[]), pg_catalog.unnest($6::integer[]))
        WITH ORDINALITY AS d(id, read_at, reason, attempts, deliveries, ord)
), locked AS (
    SELECT m.msg_id, m.message, m.headers, d.reason, d.attempts, d.deliveries, d.ord
    FROM {t} AS m JOIN dead d ON m.msg_id = d.id AND m.last_read_at = d.read_at
    WHERE m.msg_id = ANY($2::bigint[])
    FOR UPDATE OF m
), moved AS (
    SELECT pg_catalog.array_agg(l.message ORDER BY l.ord) AS bodies,
           pg_catalog.array_agg(pg_catalog.jsonb_build_object(
               'reason', l.reason, 'attempts', l.attempts, 'deliveries', l.deliveries,
               'source_queue', $1::text, 'original_msg_id', l.msg_id,
               'original_headers', CASE WHEN pg_catalog.jsonb_typeof(l.headers) = 'object'
                   THEN l.headers - $8::text[] ELSE l.headers END) ORDER BY l.ord) AS headers
    FROM locked l
    HAVING pg_catalog.count(*) > 0
), sent AS (
    SELECT pgmq.send_batch($7::text, moved.bodies, moved.headers, 0) AS id FROM moved
), removed AS (
    DELETE FROM {t} AS m USING locked l WHERE m.msg_id = l.msg_id RETURNING m.msg_id
)
SELECT (SELECT pg_catalog.array_agg(msg_id) FROM removed), (SELECT pg_catalog.count(*) FROM sent)",
        t = queue.quoted_table()
    )
}

/// Whether `e` says the queue `dlq` a move sends to is missing: PostgreSQL's
/// "relation does not exist" for its table, named exactly
/// (`relation "pgmq.q_jobs_dlq" does not exist` names `jobs_dlq`, not
/// `jobs`), or PGMQ's own exception from `send_batch` (the only PGMQ
/// function the moves call, so the only one that can raise it).
pub(crate) fn names_missing_queue(e: &Error, dlq: &QueueName) -> bool {
    use tokio_postgres::error::SqlState;
    let Error::Database { source } = e else {
        return false;
    };
    let Some(db) = source.as_db_error() else {
        return false;
    };
    let msg = db.message();
    (*db.code() == SqlState::UNDEFINED_TABLE
        && msg.contains(&format!("\"pgmq.{}\"", dlq.table_name())))
        || (*db.code() == SqlState::RAISE_EXCEPTION
            && msg.contains("does not exist")
            && msg.contains(dlq.as_str()))
}

impl<E: Executor> Pgmq<E> {
    /// Moves the messages still held by these deliveries from `queue` to
    /// `dead_letter_queue` in one statement (see the module docs); returns
    /// the ids moved (their ids in `queue`). A delivery whose message was
    /// read again since, or is gone, is left alone and missing from the
    /// result. Each dead letter's headers are `{reason, attempts,
    /// deliveries, source_queue, original_msg_id, original_headers}`, where
    /// `original_headers` are the message's headers less the keys in
    /// `leave_out` (headers of the caller's own bookkeeping, say, so that a
    /// dead letter sent back with its original headers starts afresh).
    ///
    /// Give each delivery once: a receipt listed twice is sent twice. A
    /// missing queue is [`Error::QueueNotFound`] naming it, the source or
    /// the dead-letter queue.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use std::time::Duration;
    /// use pgmq_client::{DeadLetter, QueueName};
    /// let (q, dlq) = (QueueName::new("orders")?, QueueName::new("orders_dlq")?);
    /// let msgs = client.read_raw(&q, Duration::from_secs(30), 10).await?;
    /// let dead: Vec<DeadLetter> = msgs
    ///     .iter()
    ///     .filter(|m| m.read_ct > 5)
    ///     .filter_map(|m| m.receipt())
    ///     .map(|r| DeadLetter::new(r, "too many deliveries"))
    ///     .collect();
    /// let moved = client.dead_letter_fenced(&q, &dlq, &dead, &[]).await?;
    /// println!("{} moved to {dlq}", moved.len());
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.dead_letter_fenced", skip_all, fields(queue = %queue, dead_letter_queue = %dead_letter_queue, batch = letters.len()))]
    pub async fn dead_letter_fenced(
        &self,
        queue: &QueueName,
        dead_letter_queue: &QueueName,
        letters: &[DeadLetter],
        leave_out: &[&str],
    ) -> Result<Vec<i64>, Error> {
        if letters.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = letters.iter().map(|d| d.receipt.msg_id).collect();
        let reads: Vec<DateTime<Utc>> = letters.iter().map(|d| d.receipt.read_at).collect();
        let reasons: Vec<&str> = letters.iter().map(|d| d.reason.as_str()).collect();
        let attempts: Vec<i32> = letters.iter().map(|d| to_i32(d.attempts)).collect();
        let deliveries: Vec<i32> = letters.iter().map(|d| to_i32(d.deliveries)).collect();
        let (q, dlq) = (queue.as_str(), dead_letter_queue.as_str());
        let rows = self
            .executor()
            .query_text(
                &dead_letter_sql(queue),
                &[
                    (&q, Type::TEXT),
                    (&ids, Type::INT8_ARRAY),
                    (&reads, Type::TIMESTAMPTZ_ARRAY),
                    (&reasons, Type::TEXT_ARRAY),
                    (&attempts, Type::INT4_ARRAY),
                    (&deliveries, Type::INT4_ARRAY),
                    (&dlq, Type::TEXT),
                    (&leave_out, Type::TEXT_ARRAY),
                ],
            )
            .await
            .map_err(|e| {
                if names_missing_queue(&e, dead_letter_queue) {
                    Error::QueueNotFound {
                        queue: dlq.to_owned(),
                    }
                } else {
                    e.in_queue(q)
                }
            })?;
        written(&rows)
    }
}

fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_move_names_the_quoted_table_and_fences_each_delivery() {
        let q = QueueName::new("jobs").unwrap();
        let sql = dead_letter_sql(&q);
        assert!(sql.contains("FROM pgmq.\"q_jobs\" AS m"));
        assert!(sql.contains("DELETE FROM pgmq.\"q_jobs\" AS m"));
        assert!(sql.contains("m.last_read_at = d.read_at"));
        assert!(sql.contains("pgmq.send_batch($7::text"));
    }

    #[test]
    fn counts_past_i32_are_capped() {
        assert_eq!(to_i32(u32::MAX), i32::MAX);
        assert_eq!(to_i32(3), 3);
    }
}
