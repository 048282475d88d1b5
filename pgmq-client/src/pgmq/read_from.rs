//! Reads as a statement on the queue table, optionally starting after a
//! given `msg_id`: [`read_from`](crate::Pgmq::read_from).
//!
//! `pgmq.read` scans the queue's primary key from its lowest entry. Every
//! message deleted since the last VACUUM leaves a dead entry there, and each
//! read walks over all of them before it reaches a live row: on a queue
//! draining a large backlog that walk, not the rows returned, becomes most
//! of the read's cost. A read with a lower bound on `msg_id`
//! ([`ReadFrom::After`]) descends the index straight to the bound and skips
//! the deleted head. The price is that it does not see visible messages
//! below the bound (retries, expired claims, rows whose sending transaction
//! committed late), so a consumer that reads after a bound must also read
//! from the start ([`ReadFrom::Start`]) now and then; see the worker's
//! claimer for one way to do that. A consumer sharing the queue with others
//! can start after the queue's claim frontier instead
//! ([`ReadFrom::AfterFrontier`]), and so also skip the rows the others
//! claimed since its own last read.
//!
//! The statement is PGMQ 1.13's own `read` (without its JSON filter): the
//! same visibility test (`vt <= clock_timestamp()`), order (`msg_id`),
//! locking (`FOR UPDATE SKIP LOCKED`), updates (`read_ct + 1`,
//! `last_read_at = clock_timestamp()`, `vt = clock_timestamp() + vt`) and
//! returned columns (`pgmq.message_record`), plus the bound. It is prepared
//! once per connection instead of being built with `format()` and planned
//! on every call as the PL/pgSQL function does. It names the queue table
//! (`pgmq."q_<name>"`, from a validated [`QueueName`]), so it needs that
//! table's layout: a caller that cannot vouch for the installed PGMQ should
//! use [`read`](crate::Pgmq::read).

use serde::de::DeserializeOwned;
use tokio_postgres::types::Type;

use crate::conn::args::{qty, secs};
use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::pgmq::message::{decode_rows, raw_from_row, Decoded, Message, RawJson};
use crate::pgmq::queue_name::QueueName;
use crate::pgmq::read::ReadOptions;
use crate::Pgmq;

/// Where a [`read_from`](crate::Pgmq::read_from) starts.
///
/// A read from the start walks over the dead index entries that deleted
/// messages leave at the head of the queue until VACUUM removes them; one
/// [`After`](ReadFrom::After) a bound descends the index to the bound and
/// skips them, but does not see visible messages below it (retries, expired
/// claims, rows whose sending transaction committed late). A consumer that
/// reads after a bound must therefore also read from the start now and then.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReadFrom {
    /// From the lowest `msg_id`, as `pgmq.read` does.
    Start,
    /// Only messages with a `msg_id` greater than this.
    After(i64),
    /// Only messages with a `msg_id` greater than this or than the queue's
    /// claim frontier, whichever is higher: the highest `msg_id` among the
    /// few messages most recently claimed by any consumer, looked up in the
    /// same statement with one descent of the queue's `vt` index.
    ///
    /// A consumer that shares a queue with others and reads after its own
    /// highest `msg_id` walks over every row the others claimed since (each
    /// an index entry and a heap fetch that fails the visibility test); the
    /// frontier lets its read start where the fleet's claims end instead.
    /// The frontier is the `msg_id` of a message that was read (its
    /// `last_read_at` is set) and whose `vt` is no later than this read's
    /// own visibility timeout from now, so a message sent with a longer
    /// delay never moves it; a claimed message's id is never above the
    /// highest id any consumer claimed, so the bound skips nothing a read
    /// after the fleet's own bounds would have found. Below it the same
    /// rule as for [`After`](ReadFrom::After) holds: read from the start
    /// now and then.
    AfterFrontier(i64),
    /// Only messages with a `msg_id` greater than this or than the start
    /// of a range taken from the queue's claim cursor in the `pgmq_sdk`
    /// schema, whichever is higher (needs the schema, version 8 or later).
    ///
    /// Consumers that read after the frontier at the same time start at
    /// the same `msg_id` and step over the rows each other's reads in
    /// flight have locked. Each ranged read instead takes its own range of
    /// `msg_id`s (as wide as the quantity asked for) from one cursor row
    /// per queue, which moves on with every range taken, so concurrent
    /// reads start past each other's rows; a read that comes back short
    /// pulls the cursor back to where it ended. The cursor is a hint: the
    /// same rule as for [`After`](ReadFrom::After) holds, read from the
    /// start now and then.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use std::time::Duration;
    /// use pgmq_client::{ReadFrom, ReadOptions};
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// let opts = ReadOptions::new(Duration::from_secs(30)).qty(100);
    /// let batch = client.read_from_raw(&q, ReadFrom::Ranged(41_000), &opts).await?;
    /// # Ok(()) }
    /// ```
    Ranged(i64),
}

/// The read's SQL for `queue`: `$1` the visibility timeout in seconds
/// (float8, whole seconds as PGMQ's integer), `$2` the quantity, and for a
/// bounded read `$3` the `msg_id` to start after.
///
/// The update finds the claimed rows by `msg_id = ANY` of the claimed ids
/// rather than by a join with them. The statement is prepared, and a
/// prepared statement may run a generic plan, planned without the
/// quantity: the planner then takes `LIMIT $2` for a tenth of the table,
/// and for that many rows a join picks a merge join over a full scan of
/// the primary key (or a hash join over the whole table), which walks
/// every row and every deleted, unvacuumed entry on every read. The array
/// leaves the planner one plan for any estimate: one primary-key probe
/// per claimed id.
fn read_sql(queue: &QueueName, from: ReadFrom) -> String {
    let bound = match from {
        ReadFrom::Start => String::new(),
        ReadFrom::After(_) | ReadFrom::Ranged(_) => " AND msg_id > $3".to_owned(),
        // The newest claims have the highest `vt` at or below now plus the
        // visibility timeout (a claim sets `vt` to its time plus the
        // timeout); a few of them, not one, so that one extended, released
        // or delayed row at the top does not hide the frontier. GREATEST
        // ignores the NULL of an empty queue.
        ReadFrom::AfterFrontier(_) => format!(
            " AND msg_id > GREATEST($3, (SELECT max(f.msg_id) FROM \
             (SELECT msg_id, last_read_at FROM {t} \
             WHERE vt <= pg_catalog.now() + pg_catalog.make_interval(secs => $1 + 1) \
             ORDER BY vt DESC LIMIT {FRONTIER_ROWS}) AS f \
             WHERE f.last_read_at IS NOT NULL))",
            t = queue.quoted_table(),
        ),
    };
    format!(
        "UPDATE {t} AS m SET \
         last_read_at = pg_catalog.clock_timestamp(), \
         vt = pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => $1), \
         read_ct = m.read_ct + 1 \
         WHERE m.msg_id = ANY(ARRAY(SELECT msg_id FROM {t} \
         WHERE vt <= pg_catalog.clock_timestamp(){bound} \
         ORDER BY msg_id ASC LIMIT $2 FOR UPDATE SKIP LOCKED)) \
         RETURNING m.msg_id, m.read_ct, m.enqueued_at, m.last_read_at, m.vt, m.message, m.headers",
        t = queue.quoted_table(),
    )
}

/// How many of the most recent claims [`ReadFrom::AfterFrontier`] looks at.
const FRONTIER_ROWS: u32 = 4;

impl<E: Executor> Pgmq<E> {
    /// Reads up to `opts.qty` visible messages starting at `from` and
    /// hides them for `opts.vt`, exactly as [`read`](Self::read) does: the
    /// same visibility test, order, locking, updates (`read_ct`,
    /// `last_read_at`, `vt`) and columns, as one statement on the queue
    /// table prepared once per connection instead of PGMQ's PL/pgSQL
    /// function (see [`ReadFrom`] for what a bound skips). Bodies are decoded
    /// per message as [`read`](Self::read) does. The statement needs PGMQ
    /// 1.x's queue table layout; with an installation you cannot vouch for,
    /// use [`read`](Self::read).
    ///
    /// It takes no filter and no wait ([`ReadOptions::filter`],
    /// [`ReadOptions::poll`]): either is refused with
    /// [`Error::InvalidArgument`]. A queue that does not exist is
    /// [`Error::QueueNotFound`].
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use std::time::Duration;
    /// use pgmq_client::{ReadFrom, ReadOptions};
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// let opts = ReadOptions::new(Duration::from_secs(30)).qty(100);
    /// // Continue after the last message of the previous batch...
    /// let batch = client.read_from::<serde_json::Value>(&q, ReadFrom::After(41_000), &opts).await?;
    /// // ...and now and then from the start, for retries below it.
    /// let batch = client.read_from::<serde_json::Value>(&q, ReadFrom::Start, &opts).await?;
    /// # Ok(()) }
    /// ```
    pub async fn read_from<T: DeserializeOwned>(
        &self,
        queue: &QueueName,
        from: ReadFrom,
        opts: &ReadOptions,
    ) -> Result<Vec<Decoded<T>>, Error> {
        decode_rows(&self.read_from_rows(queue, from, opts).await?)
    }

    /// Like [`read_from`](Self::read_from), bodies left undecoded.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::{ReadFrom, ReadOptions};
    /// use std::time::Duration;
    /// let opts = ReadOptions::new(Duration::from_secs(30)).qty(100);
    /// let batch = client.read_from_raw(&q, ReadFrom::Start, &opts).await?;
    /// # Ok(()) }
    /// ```
    pub async fn read_from_raw(
        &self,
        queue: &QueueName,
        from: ReadFrom,
        opts: &ReadOptions,
    ) -> Result<Vec<Message<RawJson>>, Error> {
        self.read_from_rows(queue, from, opts)
            .await?
            .iter()
            .map(raw_from_row)
            .collect()
    }

    #[tracing::instrument(name = "pgmq.read_from", skip_all, fields(queue = %queue, qty = opts.qty, from = ?from))]
    async fn read_from_rows(
        &self,
        queue: &QueueName,
        from: ReadFrom,
        opts: &ReadOptions,
    ) -> Result<Vec<tokio_postgres::Row>, Error> {
        opts.refuse("read_from", false)?;
        let vt = f64::from(secs(opts.vt, "visibility timeout")?);
        let n = self::qty(opts.qty)?;
        match from {
            ReadFrom::Start => {
                self.run_text(
                    &read_sql(queue, from),
                    queue.as_str(),
                    &[(&vt, Type::FLOAT8), (&n, Type::INT4)],
                )
                .await
            }
            ReadFrom::Ranged(id) => {
                let width = i64::from(n);
                let start = self.claim_range(queue, id, width).await?.max(id);
                let rows = self
                    .run_text(
                        &read_sql(queue, ReadFrom::After(start)),
                        queue.as_str(),
                        &[(&vt, Type::FLOAT8), (&n, Type::INT4), (&start, Type::INT8)],
                    )
                    .await?;
                if rows.len() < usize::try_from(n).unwrap_or(0) {
                    // The tail: the cursor follows it rather than running
                    // ahead (an empty read falls back to the caller's own
                    // bound, which no range starts below).
                    let top = rows
                        .iter()
                        .filter_map(|r| r.try_get::<_, i64>(0).ok())
                        .max()
                        .unwrap_or(id);
                    // The rows are claimed: a failed rewind (only a hint)
                    // must not lose them.
                    if let Err(e) = self.rewind_claim_cursor(queue, top).await {
                        tracing::debug!(queue = %queue, error = %e, "claim cursor not rewound");
                    }
                }
                Ok(rows)
            }
            ReadFrom::After(id) | ReadFrom::AfterFrontier(id) => {
                self.run_text(
                    &read_sql(queue, from),
                    queue.as_str(),
                    &[(&vt, Type::FLOAT8), (&n, Type::INT4), (&id, Type::INT8)],
                )
                .await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statement_is_pgmqs_read_on_the_quoted_table() {
        let q = QueueName::new("jobs").unwrap();
        let full = read_sql(&q, ReadFrom::Start);
        let bounded = read_sql(&q, ReadFrom::After(1));
        let frontier = read_sql(&q, ReadFrom::AfterFrontier(1));
        for sql in [&full, &bounded, &frontier] {
            assert!(sql.contains("FROM pgmq.\"q_jobs\" WHERE"), "{sql}");
            // The claimed rows are probed by id, never joined (see read_sql).
            assert!(
                sql.contains("WHERE m.msg_id = ANY(ARRAY(SELECT msg_id"),
                "{sql}"
            );
            assert!(sql.contains("UPDATE pgmq.\"q_jobs\" AS m"), "{sql}");
            assert!(sql.contains("vt <= pg_catalog.clock_timestamp()"), "{sql}");
            assert!(sql.contains("ORDER BY msg_id ASC LIMIT $2 FOR UPDATE SKIP LOCKED"));
            assert!(sql.contains("read_ct = m.read_ct + 1"));
            assert!(sql.contains("last_read_at = pg_catalog.clock_timestamp()"));
            assert!(sql.ends_with(
                "RETURNING m.msg_id, m.read_ct, m.enqueued_at, m.last_read_at, m.vt, m.message, m.headers"
            ));
        }
        assert!(!full.contains("$3"));
        assert!(bounded.contains("AND msg_id > $3"));
        assert!(frontier.contains("AND msg_id > GREATEST($3, (SELECT max(f.msg_id)"));
        assert!(frontier.contains("ORDER BY vt DESC LIMIT 4"));
        assert!(frontier.contains("WHERE f.last_read_at IS NOT NULL"));
        // A ranged read's statement is the bounded one: the range's start
        // is its bound.
        assert_eq!(read_sql(&q, ReadFrom::Ranged(1)), bounded);
    }
}
