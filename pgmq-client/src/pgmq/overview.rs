//! Read-only looks for an operator (the console's pages): the queues with
//! their depth, in flight, oldest age and archive size; a queue's messages
//! filtered by JSON; a dead-letter queue's letters grouped by reason.
//!
//! Every statement here is a plain, bounded SELECT: it changes no `vt` or
//! `read_ct` and locks nothing, counts stop at a cap (a queue of millions is
//! shown as "at least the cap"), and lists take a row limit. Run them in a
//! transaction with [`set_local_timeouts`](crate::Pgmq::set_local_timeouts)
//! to bound their time too. The tables are named from validated
//! [`QueueName`]s, quoted.

use tokio_postgres::types::Type;

use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::rows::col;
use crate::pgmq::message::{raw_from_row, Message, RawJson};
use crate::pgmq::queue_name::QueueName;
use crate::Pgmq;

/// A queue at a glance ([`Pgmq::queue_overview`]). Counts stop at the cap
/// the call was given: a count equal to it means "at least".
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct QueueOverview {
    /// The queue's name.
    pub queue_name: String,
    /// Messages in the queue, visible or not (at most the cap).
    pub depth: i64,
    /// Messages whose visibility timeout is in the future: being worked on
    /// (or delayed). At most the cap.
    pub in_flight: i64,
    /// Seconds since the oldest message (the lowest msg_id) was sent; None
    /// when the queue is empty.
    pub oldest_age_secs: Option<f64>,
    /// Rows in the queue's archive (at most the cap).
    pub archive_size: i64,
    /// Messages ever sent to the queue: the last value of its msg_id
    /// sequence (not capped). None when no message was sent yet, or when
    /// the role may not read the sequence. Two of these some seconds apart
    /// give the rate in; with the depths, the rate out.
    pub sent_total: Option<i64>,
}

/// The dead letters of one reason ([`Pgmq::dead_letter_reasons`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct DeadLetterReason {
    /// The `reason` header; None for letters without one.
    pub reason: Option<String>,
    /// How many letters give it (among those looked at).
    pub count: i64,
    /// The lowest msg_id with it.
    pub first_msg_id: i64,
    /// The highest msg_id with it.
    pub last_msg_id: i64,
}

/// The queue names by attention, `$1` at most: the largest queue tables
/// first by the statistics collector's live-row count (no table is
/// scanned; one stats call per queue table, not the whole
/// `pg_stat_user_tables` view), then by name; with `$2`, only names
/// containing it. The second column is how many queues match in all.
const QUEUES_BY_ATTENTION: &str = "SELECT m.queue_name::text, pg_catalog.count(*) OVER () \
     FROM pgmq.meta m \
     LEFT JOIN pg_catalog.pg_class c \
       ON c.relnamespace = 'pgmq'::regnamespace AND c.relname = 'q_' || m.queue_name \
     WHERE $2::text IS NULL OR pg_catalog.strpos(m.queue_name, $2) > 0 \
     ORDER BY coalesce(pg_catalog.pg_stat_get_live_tuples(c.oid), 0) DESC, m.queue_name \
     LIMIT $1";

/// Depth, in flight, oldest age and archive size of one queue, each count
/// stopped at `$1` rows, and the last value of its msg_id sequence (`$2`:
/// the queue's table, quoted; NULL when the role may not read it) (the `vt` and `msg_id` indexes PGMQ creates serve
/// the in-flight count and the oldest message). The time is the
/// statement's (`statement_timestamp()`, stable): with the volatile
/// `clock_timestamp()` the `vt` condition cannot use the index and walks
/// all of it.
fn overview_sql(queue: &QueueName) -> String {
    let (q, a) = (queue.quoted_table(), queue.quoted_archive_table());
    format!(
        "SELECT (SELECT pg_catalog.count(*) FROM (SELECT 1 FROM {q} LIMIT $1) t), \
         (SELECT pg_catalog.count(*) FROM (SELECT 1 FROM {q} \
           WHERE vt > pg_catalog.statement_timestamp() LIMIT $1) t), \
         (SELECT extract(epoch FROM pg_catalog.statement_timestamp() - enqueued_at)::float8 \
           FROM {q} ORDER BY msg_id LIMIT 1), \
         (SELECT pg_catalog.count(*) FROM (SELECT 1 FROM {a} LIMIT $1) t), \
         (SELECT CASE WHEN pg_catalog.has_sequence_privilege(s.seq, 'SELECT') \
           THEN pg_catalog.pg_sequence_last_value(s.seq) END \
           FROM (SELECT pg_catalog.pg_get_serial_sequence($2::text, 'msg_id')::regclass AS seq) s)"
    )
}

/// At most `$3` messages whose body or headers contain `$2` (jsonb `@>`;
/// every message when NULL) among the `$4` messages with msg_id above
/// `$1`, by msg_id: a filter that matches nothing reads `$4` rows, not the
/// whole queue.
fn look_sql(queue: &QueueName) -> String {
    format!(
        "SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers FROM \
         (SELECT * FROM {} WHERE msg_id > $1 ORDER BY msg_id LIMIT $4) w \
         WHERE $2::jsonb IS NULL OR message @> $2 OR headers @> $2 \
         ORDER BY msg_id LIMIT $3",
        queue.quoted_table()
    )
}

/// The letters among the first `$1` by msg_id, grouped by their `reason`
/// header, the largest groups first, `$2` groups at most.
fn reasons_sql(queue: &QueueName) -> String {
    format!(
        "SELECT headers->>'reason', pg_catalog.count(*), pg_catalog.min(msg_id), \
         pg_catalog.max(msg_id) FROM (SELECT msg_id, headers FROM {} ORDER BY msg_id LIMIT $1) t \
         GROUP BY 1 ORDER BY 2 DESC, 1 NULLS LAST LIMIT $2",
        queue.quoted_table()
    )
}

impl<E: Executor> Pgmq<E> {
    /// At most `limit` queues, those that need attention first (the
    /// largest by the statistics' estimate), with `name_contains` only those
    /// whose name contains it; each with its exact counts stopped at `cap`
    /// rows. Returns the queues and how many matched in all.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let (queues, total) = client.queue_overview(100, None, 100_000).await?;
    /// for q in &queues {
    ///     println!("{}: {} messages, {} in flight", q.queue_name, q.depth, q.in_flight);
    /// }
    /// println!("{} of {total} queues", queues.len());
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.queue_overview", skip_all, fields(limit, cap))]
    pub async fn queue_overview(
        &self,
        limit: usize,
        name_contains: Option<&str>,
        cap: i64,
    ) -> Result<(Vec<QueueOverview>, i64), Error> {
        let limit = limit as i64;
        let rows = self
            .executor()
            .query_text(
                QUEUES_BY_ATTENTION,
                &[(&limit, Type::INT8), (&name_contains, Type::TEXT)],
            )
            .await?;
        let total = match rows.first() {
            Some(r) => col(r, 1)?,
            None => 0,
        };
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let name: String = col(r, 0)?;
            let Ok(queue) = QueueName::new(&name) else {
                continue;
            };
            match self.queue_overview_one(&queue, cap).await {
                Ok(o) => out.push(o),
                // Dropped since it was listed.
                Err(Error::QueueNotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok((out, total))
    }

    /// One queue's overview, counts stopped at `cap` rows.
    /// [`Error::QueueNotFound`] for a queue that does not exist.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// let o = client.queue_overview_one(&q, 100_000).await?;
    /// println!("oldest: {:?} s", o.oldest_age_secs);
    /// # Ok(()) }
    /// ```
    pub async fn queue_overview_one(
        &self,
        queue: &QueueName,
        cap: i64,
    ) -> Result<QueueOverview, Error> {
        let table = queue.quoted_table();
        let rows = self
            .run_text(
                &overview_sql(queue),
                queue.as_str(),
                &[(&cap, Type::INT8), (&table, Type::TEXT)],
            )
            .await?;
        let r = rows
            .first()
            .ok_or_else(|| Error::InvalidArgument("no overview row".into()))?;
        Ok(QueueOverview {
            queue_name: queue.as_str().to_owned(),
            depth: col(r, 0)?,
            in_flight: col(r, 1)?,
            oldest_age_secs: col(r, 2)?,
            archive_size: col(r, 3)?,
            sent_total: col(r, 4)?,
        })
    }

    /// At most `qty` messages of `queue`, by msg_id, whose body or headers
    /// contain `filter` (jsonb containment: `{"reason": "timeout"}` matches
    /// a dead letter's headers), among the `window` messages with msg_id
    /// above `after` (so a filter that matches nothing reads `window` rows,
    /// not the whole queue). A plain SELECT: nothing is hidden, counted or
    /// locked. `qty` above [`MAX_BATCH`](crate::MAX_BATCH) is
    /// [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let q = pgmq_client::QueueName::new("orders_dlq")?;
    /// let f = serde_json::json!({"reason": "timeout"});
    /// for m in client.look(&q, 0, Some(&f), 50, 100_000).await? {
    ///     println!("{} {}", m.msg_id, m.body.get());
    /// }
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.look", skip_all, fields(queue = %queue, qty))]
    pub async fn look(
        &self,
        queue: &QueueName,
        after: i64,
        filter: Option<&serde_json::Value>,
        qty: usize,
        window: i64,
    ) -> Result<Vec<Message<RawJson>>, Error> {
        let n = i64::from(crate::conn::args::qty(qty)?);
        let rows = self
            .run_text(
                &look_sql(queue),
                queue.as_str(),
                &[
                    (&after, Type::INT8),
                    (&filter, Type::JSONB),
                    (&n, Type::INT8),
                    (&window, Type::INT8),
                ],
            )
            .await?;
        rows.iter().map(raw_from_row).collect()
    }

    /// The letters of dead-letter queue `queue` (its first `scan` by
    /// msg_id) grouped by their `reason` header, the largest groups first,
    /// at most `groups`.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let dlq = pgmq_client::QueueName::new("orders_dlq")?;
    /// for g in client.dead_letter_reasons(&dlq, 100_000, 50).await? {
    ///     println!("{:?}: {}", g.reason, g.count);
    /// }
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.dead_letter_reasons", skip_all, fields(queue = %queue))]
    pub async fn dead_letter_reasons(
        &self,
        queue: &QueueName,
        scan: i64,
        groups: i64,
    ) -> Result<Vec<DeadLetterReason>, Error> {
        let rows = self
            .run_text(
                &reasons_sql(queue),
                queue.as_str(),
                &[(&scan, Type::INT8), (&groups, Type::INT8)],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(DeadLetterReason {
                    reason: col(r, 0)?,
                    count: col(r, 1)?,
                    first_msg_id: col(r, 2)?,
                    last_msg_id: col(r, 3)?,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_looks_are_bounded_selects() {
        let q = QueueName::new("jobs").unwrap();
        for sql in [overview_sql(&q), look_sql(&q), reasons_sql(&q)] {
            assert!(sql.contains("pgmq.\"q_jobs\""));
            assert!(sql.contains("LIMIT $"));
            assert!(!sql.contains("UPDATE") && !sql.contains("DELETE"));
        }
        assert!(overview_sql(&q).contains("pgmq.\"a_jobs\""));
        assert!(QUEUES_BY_ATTENTION.ends_with("LIMIT $1"));
    }
}
