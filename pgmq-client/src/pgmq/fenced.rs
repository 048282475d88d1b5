//! Writes fenced on a delivery: delete, archive and requeue only the message
//! *as a given read delivered it*, named by its [`Receipt`] (`msg_id` and
//! the `last_read_at` that read set); each returns the ids it wrote, so a
//! write from an expired delivery matches nothing and says so. Why, and
//! what a requeue and an extension ([`Requeue::keep_claim`]) do to the
//! delivery: the repository's docs/concepts.md, "Fencing".
//!
//! These are statements on PGMQ's queue and archive tables (`pgmq."q_<name>"`,
//! `pgmq."a_<name>"`), with the same effect as PGMQ's functions plus the
//! fence, prepared once per connection. The table names come only from a
//! validated [`QueueName`]; catalog functions are schema-qualified.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;

use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::rows::col0s;
use crate::pgmq::message::Message;
use crate::pgmq::queue_name::QueueName;
use crate::Pgmq;

/// The longest delay a requeue takes (PGMQ's own visibility timeouts are
/// `integer` seconds): longer ones are cut to this, about 68 years.
pub const MAX_DELAY: Duration = Duration::from_secs(i32::MAX as u64);

/// One delivery of a message: its id and the `last_read_at` that the read
/// which delivered it set. A write that carries it touches the message only
/// while no later read has delivered it again (its claim is still this one).
///
/// ```no_run
/// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
/// use std::time::Duration;
/// let msgs = client.read_raw(&q, Duration::from_secs(30), 10).await?;
/// let receipts: Vec<_> = msgs.iter().filter_map(|m| m.receipt()).collect();
/// // ... handle them ...
/// let deleted = client.delete_fenced(&q, &receipts).await?;
/// if deleted.len() < receipts.len() {
///     println!("some claims expired and were taken by another consumer");
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Receipt {
    /// The message id.
    pub msg_id: i64,
    /// `last_read_at` as the read returned it (database clock, microseconds).
    pub read_at: DateTime<Utc>,
}

impl<T> Message<T> {
    /// The receipt of this delivery; None for a message that was never
    /// read (from `pop`, or `set_vt` on an unread message).
    pub fn receipt(&self) -> Option<Receipt> {
        self.last_read_at.map(|read_at| Receipt {
            msg_id: self.msg_id,
            read_at,
        })
    }
}

/// One fenced requeue: make a delivered message visible again after a delay.
///
/// ```
/// use std::time::Duration;
/// use pgmq_client::{Receipt, Requeue};
/// # let receipt = Receipt { msg_id: 1, read_at: chrono::Utc::now() };
/// // Retry in 5 s, and record the attempt in the message's headers.
/// let r = Requeue::new(receipt, Duration::from_secs(5))
///     .merge_headers(serde_json::json!({"attempts": 2}));
/// // Give it back now, as if never read (`read_ct` one lower).
/// let r = Requeue::new(receipt, Duration::ZERO).undo_read();
/// // Keep holding it 30 s more (a heartbeat): the receipt still matches.
/// let r = Requeue::new(receipt, Duration::from_secs(30)).keep_claim();
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Requeue {
    /// The delivery to requeue.
    pub receipt: Receipt,
    /// Visible again this long from now (database clock; sub-second delays
    /// are kept; at most [`MAX_DELAY`]).
    pub delay: Duration,
    /// Lower `read_ct` by one (never below 0): the read is undone, so a
    /// consumer that counts deliveries by `read_ct` does not count it.
    pub undo_read: bool,
    /// A JSON object merged into the message's headers (`headers || this`;
    /// headers that are not an object are left as they are).
    pub headers: Option<serde_json::Value>,
    /// The delivery goes on holding the message: `last_read_at` is left as
    /// it is, so later writes carrying the same receipt still match (an
    /// extension of a running claim). Otherwise (the default) the requeue
    /// ends the delivery: `last_read_at` becomes NULL, and nothing carrying
    /// this receipt matches the message again.
    pub keep_claim: bool,
}

impl Requeue {
    /// Visible again `delay` from now, the delivery ended; `read_ct` and
    /// headers unchanged.
    pub fn new(receipt: Receipt, delay: Duration) -> Self {
        Requeue {
            receipt,
            delay,
            undo_read: false,
            headers: None,
            keep_claim: false,
        }
    }

    /// Keeps the delivery's claim instead of ending it (see
    /// [`keep_claim`](Self::keep_claim)): for extending the visibility of a
    /// message still being handled.
    pub fn keep_claim(mut self) -> Self {
        self.keep_claim = true;
        self
    }

    /// Also lowers `read_ct` by one (see [`undo_read`](Self::undo_read)).
    pub fn undo_read(mut self) -> Self {
        self.undo_read = true;
        self
    }

    /// Also merges `headers` (a JSON object) into the message's headers.
    pub fn merge_headers(mut self, headers: serde_json::Value) -> Self {
        self.headers = Some(headers);
        self
    }
}

/// The rows of `$1 ids, $2 read_ats` that still hold that delivery, joined
/// on the primary key (the `= ANY` lets the planner use it for any table size).
macro_rules! fence {
    () => {
        "m.msg_id = r.id AND m.last_read_at = r.read_at AND m.msg_id = ANY($1::bigint[])"
    };
}

fn delete_sql(queue: &QueueName) -> String {
    format!(
        "WITH d AS (DELETE FROM {t} AS m \
         USING ROWS FROM (pg_catalog.unnest($1::bigint[]), pg_catalog.unnest($2::timestamptz[])) AS r(id, read_at) \
         WHERE {f} RETURNING m.msg_id) \
         SELECT pg_catalog.array_agg(d.msg_id) FROM d",
        t = queue.quoted_table(),
        f = fence!()
    )
}

fn archive_sql(queue: &QueueName) -> String {
    format!(
        "WITH d AS (DELETE FROM {t} AS m \
         USING ROWS FROM (pg_catalog.unnest($1::bigint[]), pg_catalog.unnest($2::timestamptz[]), pg_catalog.unnest($3::jsonb[])) AS r(id, read_at, patch) \
         WHERE {f} \
         RETURNING m.msg_id, m.vt, m.read_ct, m.enqueued_at, m.last_read_at, m.message, \
         CASE WHEN r.patch IS NULL THEN m.headers \
              WHEN m.headers IS NULL THEN r.patch \
              WHEN pg_catalog.jsonb_typeof(m.headers) = 'object' THEN m.headers || r.patch \
              ELSE m.headers END AS headers), \
         a AS (INSERT INTO {a} (msg_id, vt, read_ct, enqueued_at, last_read_at, message, headers) \
         SELECT msg_id, vt, read_ct, enqueued_at, last_read_at, message, headers FROM d \
         RETURNING msg_id) \
         SELECT pg_catalog.array_agg(a.msg_id) FROM a",
        t = queue.quoted_table(),
        a = queue.quoted_archive_table(),
        f = fence!()
    )
}

fn requeue_sql(queue: &QueueName) -> String {
    format!(
        "WITH u AS (UPDATE {t} AS m SET \
         vt = pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => r.delay), \
         read_ct = CASE WHEN r.undo THEN pg_catalog.int4larger(m.read_ct - 1, 0) ELSE m.read_ct END, \
         headers = CASE WHEN r.patch IS NULL THEN m.headers \
                        WHEN m.headers IS NULL THEN r.patch \
                        WHEN pg_catalog.jsonb_typeof(m.headers) = 'object' THEN m.headers || r.patch \
                        ELSE m.headers END, \
         last_read_at = CASE WHEN r.keep THEN m.last_read_at END \
         FROM ROWS FROM (pg_catalog.unnest($1::bigint[]), pg_catalog.unnest($2::timestamptz[]), \
         pg_catalog.unnest($3::float8[]), pg_catalog.unnest($4::bool[]), pg_catalog.unnest($5::jsonb[]), \
         pg_catalog.unnest($6::bool[])) \
         AS r(id, read_at, delay, undo, patch, keep) \
         WHERE {f} AND (NOT r.keep OR m.vt > pg_catalog.clock_timestamp()) RETURNING m.msg_id) \
         SELECT pg_catalog.array_agg(u.msg_id) FROM u",
        t = queue.quoted_table(),
        f = fence!()
    )
}

/// Locks the rows of `$1 ids, $2 read_ats` that still hold those
/// deliveries, in id order (so that two lockers of overlapping batches
/// take their locks in the same order), and returns their ids.
fn lock_sql(queue: &QueueName) -> String {
    format!(
        "SELECT m.msg_id FROM {t} AS m, \
         ROWS FROM (pg_catalog.unnest($1::bigint[]), pg_catalog.unnest($2::timestamptz[])) AS r(id, read_at) \
         WHERE {f} \
         ORDER BY m.msg_id FOR UPDATE OF m",
        t = queue.quoted_table(),
        f = fence!()
    )
}

/// Locks the rows of `$1 ids` by id alone, in id order, and returns their
/// ids.
fn lock_unfenced_sql(queue: &QueueName) -> String {
    format!(
        "SELECT m.msg_id FROM {t} AS m \
         WHERE m.msg_id = ANY($1::bigint[]) \
         ORDER BY m.msg_id FOR UPDATE OF m",
        t = queue.quoted_table()
    )
}

/// Which of `$1 ids` are rows of the queue table, as one `array_agg`.
fn still_queued_sql(queue: &QueueName) -> String {
    format!(
        "SELECT pg_catalog.array_agg(msg_id) FROM {t} WHERE msg_id = ANY($1::bigint[])",
        t = queue.quoted_table()
    )
}

fn split(receipts: &[Receipt]) -> (Vec<i64>, Vec<DateTime<Utc>>) {
    receipts.iter().map(|r| (r.msg_id, r.read_at)).unzip()
}

/// The delay as seconds for `make_interval`, cut to [`MAX_DELAY`].
fn delay_secs(d: Duration) -> f64 {
    d.min(MAX_DELAY).as_secs_f64()
}

impl<E: Executor> Pgmq<E> {
    /// Deletes the messages still held by these deliveries; returns the ids
    /// deleted. A receipt whose message was read again since (its claim
    /// expired and someone else took it), or is gone, is left alone and
    /// missing from the result.
    #[tracing::instrument(name = "pgmq.delete_fenced", skip_all, fields(queue = %queue, batch = receipts.len()))]
    pub async fn delete_fenced(
        &self,
        queue: &QueueName,
        receipts: &[Receipt],
    ) -> Result<Vec<i64>, Error> {
        written(&self.on_receipts(delete_sql, queue, receipts).await?)
    }

    /// Archives the messages still held by these deliveries (as
    /// `pgmq.archive` does, fenced like [`delete_fenced`](Self::delete_fenced));
    /// returns the ids archived.
    #[tracing::instrument(name = "pgmq.archive_fenced", skip_all, fields(queue = %queue, batch = receipts.len()))]
    pub async fn archive_fenced(
        &self,
        queue: &QueueName,
        receipts: &[Receipt],
    ) -> Result<Vec<i64>, Error> {
        let with: Vec<(Receipt, Option<serde_json::Value>)> =
            receipts.iter().map(|r| (*r, None)).collect();
        self.archive_fenced_with_headers(queue, &with).await
    }

    /// Like [`archive_fenced`](Self::archive_fenced), merging a JSON object
    /// into each archived message's headers (a reason, say), when given.
    #[tracing::instrument(name = "pgmq.archive_fenced", skip_all, fields(queue = %queue, batch = items.len()))]
    pub async fn archive_fenced_with_headers(
        &self,
        queue: &QueueName,
        items: &[(Receipt, Option<serde_json::Value>)],
    ) -> Result<Vec<i64>, Error> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = items.iter().map(|(r, _)| r.msg_id).collect();
        let reads: Vec<DateTime<Utc>> = items.iter().map(|(r, _)| r.read_at).collect();
        let patches: Vec<Option<&serde_json::Value>> =
            items.iter().map(|(_, h)| h.as_ref()).collect();
        let rows = self
            .run_text(
                &archive_sql(queue),
                queue.as_str(),
                &[
                    (&ids, Type::INT8_ARRAY),
                    (&reads, Type::TIMESTAMPTZ_ARRAY),
                    (&patches, Type::JSONB_ARRAY),
                ],
            )
            .await?;
        written(&rows)
    }

    /// Makes delivered messages visible again after their delays (a retry,
    /// a heartbeat's extension, a release: see [`Requeue`]), each only if
    /// its delivery still holds it; returns the ids updated. A requeue
    /// without [`Requeue::keep_claim`] ends its delivery (`last_read_at`
    /// becomes NULL): the same requeue sent again matches nothing.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// use std::time::Duration;
    /// use pgmq_client::Requeue;
    /// let msgs = client.read_raw(&q, Duration::from_secs(30), 10).await?;
    /// // Stopping before handling them: give them back at once, read undone.
    /// let back: Vec<Requeue> = msgs
    ///     .iter()
    ///     .filter_map(|m| m.receipt())
    ///     .map(|r| Requeue::new(r, Duration::ZERO).undo_read())
    ///     .collect();
    /// client.requeue_fenced(&q, &back).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.requeue_fenced", skip_all, fields(queue = %queue, batch = items.len()))]
    pub async fn requeue_fenced(
        &self,
        queue: &QueueName,
        items: &[Requeue],
    ) -> Result<Vec<i64>, Error> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = items.iter().map(|r| r.receipt.msg_id).collect();
        let reads: Vec<DateTime<Utc>> = items.iter().map(|r| r.receipt.read_at).collect();
        let delays: Vec<f64> = items.iter().map(|r| delay_secs(r.delay)).collect();
        let undo: Vec<bool> = items.iter().map(|r| r.undo_read).collect();
        let patches: Vec<Option<&serde_json::Value>> =
            items.iter().map(|r| r.headers.as_ref()).collect();
        let keep: Vec<bool> = items.iter().map(|r| r.keep_claim).collect();
        let rows = self
            .run_text(
                &requeue_sql(queue),
                queue.as_str(),
                &[
                    (&ids, Type::INT8_ARRAY),
                    (&reads, Type::TIMESTAMPTZ_ARRAY),
                    (&delays, Type::FLOAT8_ARRAY),
                    (&undo, Type::BOOL_ARRAY),
                    (&patches, Type::JSONB_ARRAY),
                    (&keep, Type::BOOL_ARRAY),
                ],
            )
            .await?;
        written(&rows)
    }
}

impl<E: Executor> Pgmq<E> {
    /// Locks (`SELECT ... FOR UPDATE`) the messages still held by these
    /// deliveries, in ascending id order; returns the ids locked, in that
    /// order. A receipt whose message was read again since, or is gone, is
    /// left alone and missing from the result.
    ///
    /// The lock lasts until the transaction ends, so run it on a
    /// [`Transaction`](crate::Transaction) (or a caller's own): the fenced
    /// writes that follow in the same transaction then cannot be overtaken
    /// by another consumer's read, which waits for the lock. On an
    /// autocommit executor (a [`Client`](crate::Client)) the lock ends with
    /// the call, and the result only says which deliveries still held.
    ///
    /// ```no_run
    /// # async fn f(conn: &mut pgmq_client::Connection, q: pgmq_client::QueueName, receipts: Vec<pgmq_client::Receipt>) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::Pgmq;
    /// let tx = conn.transaction().await?;
    /// let pg = Pgmq::on(&tx);
    /// let owned = pg.lock_fenced(&q, &receipts).await?;
    /// // ... the caller's own writes, for the messages in `owned` ...
    /// let held: Vec<_> = receipts.iter().copied().filter(|r| owned.contains(&r.msg_id)).collect();
    /// pg.delete_fenced(&q, &held).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.lock_fenced", skip_all, fields(queue = %queue, batch = receipts.len()))]
    pub async fn lock_fenced(
        &self,
        queue: &QueueName,
        receipts: &[Receipt],
    ) -> Result<Vec<i64>, Error> {
        col0s(&self.on_receipts(lock_sql, queue, receipts).await?)
    }

    /// Locks the messages with these ids, whoever holds them (no fence: see
    /// [`lock_fenced`](Self::lock_fenced)), in ascending id order; returns
    /// the ids locked, in that order.
    ///
    /// ```no_run
    /// # async fn f(conn: &mut pgmq_client::Connection, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// let tx = conn.transaction().await?;
    /// let locked = pgmq_client::Pgmq::on(&tx).lock_batch(&q, &[1, 2, 3]).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.lock_batch", skip_all, fields(queue = %queue, batch = ids.len()))]
    pub async fn lock_batch(&self, queue: &QueueName, ids: &[i64]) -> Result<Vec<i64>, Error> {
        col0s(&self.on_ids(lock_unfenced_sql, queue, ids).await?)
    }

    /// Which of `ids` are still rows of the queue's table, visible or not.
    ///
    /// A delete, an archive or a dead-letter move removes its rows, and
    /// PGMQ never reuses a message id: after such a write whose outcome is
    /// unknown (the connection broke once the request was sent), an id
    /// still here was not written by it, and an id gone was.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) -> Result<(), pgmq_client::Error> {
    /// let present = client.still_queued(&q, &[7, 8, 9]).await?;
    /// println!("{} of them are still in the queue", present.len());
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.still_queued", skip_all, fields(queue = %queue, batch = ids.len()))]
    pub async fn still_queued(&self, queue: &QueueName, ids: &[i64]) -> Result<Vec<i64>, Error> {
        written(&self.on_ids(still_queued_sql, queue, ids).await?)
    }

    /// Runs the statement `sql` makes for `queue` with the receipts as
    /// `$1 ids, $2 read_ats`; no call (no rows) for none.
    async fn on_receipts(
        &self,
        sql: fn(&QueueName) -> String,
        queue: &QueueName,
        receipts: &[Receipt],
    ) -> Result<Vec<tokio_postgres::Row>, Error> {
        if receipts.is_empty() {
            return Ok(Vec::new());
        }
        let (ids, reads) = split(receipts);
        let params = [
            (&ids as _, Type::INT8_ARRAY),
            (&reads as _, Type::TIMESTAMPTZ_ARRAY),
        ];
        self.run_text(&sql(queue), queue.as_str(), &params).await
    }

    /// Runs the statement `sql` makes for `queue` with `$1 ids`; no call (no
    /// rows) for none.
    async fn on_ids(
        &self,
        sql: fn(&QueueName) -> String,
        queue: &QueueName,
        ids: &[i64],
    ) -> Result<Vec<tokio_postgres::Row>, Error> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.run_text(&sql(queue), queue.as_str(), &[(&ids, Type::INT8_ARRAY)])
            .await
    }
}

/// The ids of the one `array_agg` row (NULL when nothing matched).
pub(crate) fn written(rows: &[tokio_postgres::Row]) -> Result<Vec<i64>, Error> {
    match rows.first() {
        None => Ok(Vec::new()),
        Some(row) => row
            .try_get::<_, Option<Vec<i64>>>(0)
            .map(Option::unwrap_or_default)
            .map_err(Error::from_pg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_name_the_quoted_tables_and_qualify_catalog_functions() {
        let q = QueueName::new("jobs").unwrap();
        for sql in [
            delete_sql(&q),
            archive_sql(&q),
            requeue_sql(&q),
            lock_sql(&q),
        ] {
            assert!(sql.contains("pgmq.\"q_jobs\""), "{sql}");
            assert!(sql.contains("m.last_read_at = r.read_at"), "{sql}");
            assert!(sql.contains("pg_catalog.unnest"), "{sql}");
            assert!(!sql.contains(" unnest("), "{sql}");
        }
        assert!(archive_sql(&q).contains("pgmq.\"a_jobs\""));
        assert!(lock_sql(&q).ends_with("ORDER BY m.msg_id FOR UPDATE OF m"));
        for sql in [lock_unfenced_sql(&q), still_queued_sql(&q)] {
            assert!(sql.contains("FROM pgmq.\"q_jobs\""), "{sql}");
            assert!(sql.contains("msg_id = ANY($1::bigint[])"), "{sql}");
        }
        // A requeue ends the delivery unless it keeps the claim.
        assert!(requeue_sql(&q).contains("last_read_at = CASE WHEN r.keep THEN m.last_read_at END"));
    }

    #[test]
    fn delays_are_capped() {
        assert_eq!(delay_secs(Duration::MAX), i32::MAX as f64);
        assert_eq!(delay_secs(Duration::from_millis(1500)), 1.5);
    }
}
