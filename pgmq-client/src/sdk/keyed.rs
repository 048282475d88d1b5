//! Idempotent sends: a send that carries a deduplication key enqueues
//! nothing when the key was taken within its window, and returns the id of
//! the key's first message instead.
//!
//! The keys live in the `pgmq_sdk` schema ([`crate::sdk::sdk_schema`]), taken in
//! the same transaction as the send: a send inside a caller's transaction
//! ([`Pgmq::on`]) that rolls back leaves its key free, and two producers
//! sending one key at once store one message (the second waits for the
//! first's transaction, then sees the key taken, or takes it if the first
//! rolled back). This is what makes a producer's retry safe after
//! [`CommitOutcome::Unknown`](crate::CommitOutcome::Unknown): send again
//! with the same key, and the queue holds the message once whichever way
//! the first try ended.
//!
//! # The window, and whose key it is
//!
//! A key's window runs from the moment its first send's statement ran, by
//! the database server's clock; after it, the key is free again. A window
//! shorter than the sending transaction is no window: a second sender that
//! waited for the first's commit finds the key already expired and sends
//! again. Choose windows far longer than any transaction that sends.
//!
//! A queue's keys belong to the queue's table: `Orders` and `orders` (one
//! PGMQ queue) share them, a queue dropped and created again starts with
//! none, and [`Pgmq::purge_queue`] forgets them with the messages they
//! named. Taking and reading a queue's keys needs what sending needs,
//! INSERT on the queue's table; a role without it sees none of them. Keys
//! of topic sends are held per routing key and per role (the role that took
//! the key, and its members).
//!
//! # Expired keys
//!
//! A send takes over an expired key in place; it never touches another
//! key, so it waits only on transactions that send one of its own keys,
//! and batches sharing keys lock them in one order. Expired rows are
//! deleted apart from the sends: after a send through a [`Client`](crate::Client)
//! (at most once a second per client, in a transaction of its own), or by
//! [`Pgmq::expire_send_keys`].
//!
//! What a key costs: one row and one index entry (its primary key) in
//! `pgmq_sdk.queue_keys` per message, written once, already holding the
//! message's id, in the send's transaction (see docs/fleet-keyed-sends.md
//! in the repository, "What a key costs", and docs/results for the
//! measured cost against a plain batch send). On a pool, where each call
//! is a transaction of its own, a send first runs its statement for fresh
//! keys as SQL text prepared per connection (`fresh_keys_sql`), and
//! calls the schema's function only when a key was taken (or the key
//! table is an older schema version's, until `install-sdk` runs).

use std::time::Duration;

use serde::Serialize;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::rows::col;
use crate::conn::statements::Stmt;
use crate::pgmq::message::{DelayArg, SendOptions};
use crate::pgmq::queue_name::QueueName;
use crate::pgmq::send::{to_json, JsonBatch};
use crate::Pgmq;

/// The longest key accepted, in bytes (it is stored in a B-tree index).
pub const MAX_DEDUP_KEY_LEN: usize = 512;

/// The feature name in [`Error::SdkSchemaMissing`].
const FEATURE: &str = "an idempotent send";

/// How many expired keys of each kind one housekeeping pass deletes.
const EXPIRE_BATCH: i32 = 5_000;

/// A deduplication key and how long it holds from its first send.
///
/// ```
/// use pgmq_client::DedupKey;
/// use std::time::Duration;
/// let key = DedupKey::new("order-42/created", Duration::from_secs(3600));
/// assert_eq!(key.key, "order-42/created");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DedupKey {
    /// The key: any text of 1 to [`MAX_DEDUP_KEY_LEN`] bytes without NUL,
    /// unique per queue (per routing key for a topic send).
    pub key: String,
    /// How long the key holds after its first send (at least 1 ms).
    pub window: Duration,
}

impl DedupKey {
    /// A key that holds for `window`.
    pub fn new(key: impl Into<String>, window: Duration) -> Self {
        DedupKey {
            key: key.into(),
            window,
        }
    }
}

/// What a keyed send did.
///
/// ```
/// let sent = pgmq_client::Sent { msg_id: 7, duplicate: false };
/// assert!(!sent.duplicate);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    /// The message's id: the new message's, or for a duplicate the id the
    /// key's first send returned (that message may since have been read
    /// and deleted).
    pub msg_id: i64,
    /// True when the key was taken and nothing was enqueued.
    pub duplicate: bool,
}

/// What a keyed topic send did.
///
/// ```
/// let sent = pgmq_client::TopicSent { queues: 2, duplicate: true };
/// assert_eq!(sent.queues, 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicSent {
    /// How many queues the message reached (for a duplicate: how many the
    /// key's first send reached).
    pub queues: i32,
    /// True when the key was taken and nothing was sent.
    pub duplicate: bool,
}

fn check_key(key: &str) -> Result<(), Error> {
    if key.is_empty() || key.len() > MAX_DEDUP_KEY_LEN {
        return Err(Error::InvalidArgument(format!(
            "a deduplication key takes 1 to {MAX_DEDUP_KEY_LEN} bytes, not {}",
            key.len()
        )));
    }
    if key.contains('\0') {
        return Err(Error::unstorable(None, "deduplication key"));
    }
    Ok(())
}

/// The window in milliseconds, at least 1.
fn window_ms(window: Duration) -> Result<i64, Error> {
    let ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    if ms < 1 {
        return Err(Error::InvalidArgument(format!(
            "a deduplication window of {window:?} is shorter than 1 ms"
        )));
    }
    // make_interval takes seconds as a double: stay well inside it.
    const MAX_MS: i64 = 100 * 365 * 24 * 3600 * 1000;
    if ms > MAX_MS {
        return Err(Error::InvalidArgument(format!(
            "a deduplication window of {window:?} is longer than 100 years"
        )));
    }
    Ok(ms)
}

/// The statement a keyed send runs first on a pool, where each call is a
/// transaction of its own: every key expected new, as in the fast path of
/// `pgmq_sdk.send_batch_keyed`, but sent as the statement itself, prepared
/// once per connection, so that the server neither plans it on every call
/// nor opens a subtransaction for it. `one`: a single message (`$1` a key,
/// `$2` a body, `$3` headers), else a batch (`$1` keys, `$2` bodies, `$3`
/// headers, as arrays); `$4` the delay, `$5` the window in milliseconds,
/// `$6` the queue's table. Rows: `(msg_id, false)` per message, in order.
///
/// It draws the ids from the queue's own sequence, inserts the keys in
/// key order with a plain `INSERT` (one descent of the key table's primary
/// key each, and its unique check) and the messages with those ids. In a
/// batch, a key already in the table, or twice in the batch, fails it with
/// a unique violation, and nothing of it stays: the statement is the whole
/// transaction. A single message's key is inserted `ON CONFLICT DO
/// NOTHING`, and its message only when the key went in: a taken key sends
/// nothing and returns no row, without an error (a duplicate single send
/// leaves no line in the server's log). Either way the send then runs the
/// function, which sorts out taken, expired and repeated keys.
///
/// Names are qualified with their schemas (`pg_catalog` for functions and
/// the collation), the table's name is a parameter where it is read as
/// text, and its identifier is quoted by [`QueueName::quoted_table`]. It
/// runs as the caller, like the functions: row-level security on the key
/// table and the queue table's own privileges apply.
fn fresh_keys_sql(queue: &QueueName, delay: &DelayArg, one: bool) -> String {
    let vt = match delay {
        DelayArg::Secs(..) => {
            "pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => $4::integer)"
        }
        DelayArg::At(..) => "$4::timestamptz",
    };
    let drawn = if one {
        "SELECT $1::text AS k, $2::jsonb AS m, $3::jsonb AS h, 1::bigint AS i, \
         pg_catalog.nextval((SELECT pg_catalog.pg_get_serial_sequence($6::text, 'msg_id')::pg_catalog.regclass)) AS id"
    } else {
        "SELECT u.k, u.m, u.h, u.i, \
         pg_catalog.nextval((SELECT pg_catalog.pg_get_serial_sequence($6::text, 'msg_id')::pg_catalog.regclass)) AS id \
         FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::jsonb[]), \
         pg_catalog.unnest($3::jsonb[])) WITH ORDINALITY AS u(k, m, h, i)"
    };
    // One key: skipped when taken, and the message sent only with it.
    let (on_conflict, if_keyed) = if one {
        (
            " ON CONFLICT DO NOTHING RETURNING 1",
            " WHERE EXISTS (SELECT 1 FROM keyed)",
        )
    } else {
        ("", "")
    };
    format!(
        "WITH drawn AS ({drawn}), \
         keyed AS (INSERT INTO pgmq_sdk.queue_keys (msg_id, expires_at, queue_relid, key) \
           SELECT d.id, pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => $5::bigint / 1000.0), \
             (SELECT pg_catalog.to_regclass($6::text)::pg_catalog.oid), d.k \
           FROM drawn d ORDER BY d.k COLLATE pg_catalog.\"C\"{on_conflict}), \
         sent AS (INSERT INTO {t} (msg_id, vt, message, headers) OVERRIDING SYSTEM VALUE \
           SELECT d.id, {vt}, d.m, d.h FROM drawn d{if_keyed} ORDER BY d.i) \
         SELECT d.id, false FROM drawn d{if_keyed} ORDER BY d.i",
        t = queue.quoted_table(),
    )
}

/// The types of [`fresh_keys_sql`]'s parameters but the last (the table).
fn fresh_keys_types(delay: &DelayArg, one: bool) -> [Type; 5] {
    let d = match delay {
        DelayArg::Secs(..) => Type::INT4,
        DelayArg::At(..) => Type::TIMESTAMPTZ,
    };
    if one {
        [Type::TEXT, Type::JSONB, Type::JSONB, d, Type::INT8]
    } else {
        [
            Type::TEXT_ARRAY,
            Type::JSONB_ARRAY,
            Type::JSONB_ARRAY,
            d,
            Type::INT8,
        ]
    }
}

/// Whether the function should answer after a fresh-keys statement
/// failed with `e` (nothing of it stays): a unique violation (a key was
/// taken, or given twice), or a key table of an older schema version (a
/// column it requires or lacks), whose installed function still fits it
/// until `install-sdk` runs.
fn ask_the_function(e: &Error) -> bool {
    matches!(
        e.sqlstate(),
        Some(s) if *s == SqlState::UNIQUE_VIOLATION
            || *s == SqlState::NOT_NULL_VIOLATION
            || *s == SqlState::UNDEFINED_COLUMN
    )
}

impl<E: Executor> Pgmq<E> {
    /// Deletes expired keys when the executor's housekeeping is due (at
    /// most once a second per client), in a transaction of its own; a
    /// failure is only logged, since the send it follows went through.
    async fn expire_keys_when_due(&self) {
        if self.executor().housekeeping_due() {
            if let Err(e) = self.expire_send_keys(EXPIRE_BATCH).await {
                tracing::debug!(error = %e, "could not delete expired deduplication keys");
            }
        }
    }

    /// A keyed send's rows, `(msg_id, duplicate)` per message: `params`
    /// are the key(s), body(s), headers, delay and window in milliseconds
    /// (`one`: a single message). When each call on the executor is a
    /// transaction of its own ([`Executor::autocommit`]), [`fresh_keys_sql`]
    /// first, and the function (`delay`'s statement) only when a key was
    /// taken (that statement undone, or for one message, skipped);
    /// elsewhere the function alone, since a failed statement would abort
    /// the caller's transaction.
    async fn keyed_rows(
        &self,
        queue: &QueueName,
        delay: &DelayArg,
        one: bool,
        params: [&(dyn ToSql + Sync); 5],
    ) -> Result<Vec<Row>, Error> {
        let q = queue.as_str();
        if self.executor().autocommit() {
            let sql = fresh_keys_sql(queue, delay, one);
            let table = queue.quoted_table();
            let mut typed: Vec<(&(dyn ToSql + Sync), Type)> = params
                .iter()
                .copied()
                .zip(fresh_keys_types(delay, one))
                .collect();
            typed.push((&table, Type::TEXT));
            match self.run_text(&sql, q, &typed).await {
                Err(e) if ask_the_function(&e) => {}
                // A single message's key was taken: nothing was sent.
                Ok(rows) if one && rows.is_empty() => {}
                res => return res.map_err(|e| e.in_sdk(FEATURE)),
            }
        }
        let mut args: Vec<&(dyn ToSql + Sync)> = vec![&q];
        args.extend(params);
        self.run(delay.stmt(), Some(q), &args)
            .await
            .map_err(|e| e.in_sdk(FEATURE))
    }
}

/// A keyed send's row: the message's id and whether its key was taken.
fn sent(r: &Row) -> Result<Sent, Error> {
    Ok(Sent {
        msg_id: col::<i64>(r, 0)?,
        duplicate: col::<bool>(r, 1)?,
    })
}

impl<E: Executor> Pgmq<E> {
    /// Sends one message under a deduplication key: when the key was taken
    /// within its window, enqueues nothing and returns the first message's
    /// id with `duplicate: true`. Needs the `pgmq_sdk` schema
    /// ([`Error::SdkSchemaMissing`] otherwise). See the module docs.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::{DedupKey, QueueName};
    /// use std::time::Duration;
    /// let q = QueueName::new("orders")?;
    /// let key = DedupKey::new("order-42", Duration::from_secs(3600));
    /// let first = client.send_keyed(&q, &key, &serde_json::json!({"order": 42})).await?;
    /// let again = client.send_keyed(&q, &key, &serde_json::json!({"order": 42})).await?;
    /// assert!(again.duplicate && again.msg_id == first.msg_id);
    /// # Ok(()) }
    /// ```
    pub async fn send_keyed<T: Serialize + ?Sized + Sync>(
        &self,
        queue: &QueueName,
        key: &DedupKey,
        body: &T,
    ) -> Result<Sent, Error> {
        self.send_keyed_with(queue, key, body, &SendOptions::default())
            .await
    }

    /// [`send_keyed`](Self::send_keyed) with a delay and/or headers.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::{DedupKey, QueueName, SendOptions};
    /// use std::time::Duration;
    /// let q = QueueName::new("reminders")?;
    /// let key = DedupKey::new("remind-7", Duration::from_secs(600));
    /// let opts = SendOptions::new().delay(Duration::from_secs(60));
    /// client.send_keyed_with(&q, &key, &serde_json::json!({"remind": 7}), &opts).await?;
    /// # Ok(()) }
    /// ```
    pub async fn send_keyed_with<T: Serialize + ?Sized + Sync>(
        &self,
        queue: &QueueName,
        key: &DedupKey,
        body: &T,
        opts: &SendOptions,
    ) -> Result<Sent, Error> {
        check_key(&key.key)?;
        let window = window_ms(key.window)?;
        let body = to_json(body, "body")?;
        let headers = self.headers_json(opts)?;
        let k = key.key.as_str();
        let delay = opts
            .delay
            .arg("delay", Stmt::SendKeyedOne, Stmt::SendKeyedOneAt)?;
        let rows = self
            .keyed_rows(
                queue,
                &delay,
                true,
                [&k, &body, &headers, delay.value(), &window],
            )
            .await?;
        self.expire_keys_when_due().await;
        let r = rows
            .first()
            .ok_or_else(|| Error::InvalidArgument("send_keyed returned no row".into()))?;
        sent(r)
    }

    /// Sends a batch, each message under its own key (`keys[i]` for
    /// `bodies[i]`), all keys with one window; returns one [`Sent`] per
    /// message, in order. A key taken before, or by an earlier message of
    /// the same batch, sends nothing for its message. All or nothing: on a
    /// pool one statement for fresh keys, followed by the function
    /// `pgmq_sdk.send_batch_keyed` only when a key was taken (each in a
    /// transaction of its own); elsewhere the function alone.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::{QueueName, SendOptions};
    /// use std::time::Duration;
    /// let q = QueueName::new("orders")?;
    /// let keys = ["order-1", "order-2"];
    /// let bodies = [serde_json::json!({"order": 1}), serde_json::json!({"order": 2})];
    /// let sent = client
    ///     .send_batch_keyed(&q, &keys, Duration::from_secs(3600), &bodies, &SendOptions::new())
    ///     .await?;
    /// let new = sent.iter().filter(|s| !s.duplicate).count();
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq_sdk.send_batch_keyed", skip_all, fields(queue = %queue, batch = bodies.len()))]
    pub async fn send_batch_keyed<T: Serialize + Sync, K: AsRef<str> + Sync>(
        &self,
        queue: &QueueName,
        keys: &[K],
        window: Duration,
        bodies: &[T],
        opts: &SendOptions,
    ) -> Result<Vec<Sent>, Error> {
        if keys.len() != bodies.len() {
            return Err(Error::InvalidArgument(format!(
                "{} deduplication keys for {} messages",
                keys.len(),
                bodies.len()
            )));
        }
        let keys: Vec<&str> = keys.iter().map(AsRef::as_ref).collect();
        for k in &keys {
            check_key(k)?;
        }
        let window = window_ms(window)?;
        let Some((bodies, headers)) =
            JsonBatch::bodies_and_headers(bodies, opts, &self.trace_headers())?
        else {
            return Ok(Vec::new());
        };
        let delay = opts
            .delay
            .arg("delay", Stmt::SendKeyed, Stmt::SendKeyedAt)?;
        let rows = self
            .keyed_rows(
                queue,
                &delay,
                false,
                [&keys, &bodies, &headers, delay.value(), &window],
            )
            .await?;
        self.expire_keys_when_due().await;
        rows.iter().map(sent).collect()
    }

    /// [`send_topic_with`](Self::send_topic_with) under a deduplication key
    /// (held per routing key): when the key was taken within its window,
    /// sends nothing and says how many queues the first send reached.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::{DedupKey, SendOptions};
    /// use std::time::Duration;
    /// let key = DedupKey::new("order-42/created", Duration::from_secs(3600));
    /// let sent = client
    ///     .send_topic_keyed("orders.eu.created", &key, &serde_json::json!({"id": 42}), &SendOptions::new())
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq_sdk.send_topic_keyed", skip_all)]
    pub async fn send_topic_keyed<T: Serialize + ?Sized + Sync>(
        &self,
        routing_key: &str,
        key: &DedupKey,
        body: &T,
        opts: &SendOptions,
    ) -> Result<TopicSent, Error> {
        check_key(&key.key)?;
        let window = window_ms(key.window)?;
        let body = to_json(body, "body")?;
        let headers = self.headers_json(opts)?;
        let delay = crate::pgmq::topics::topic_delay(opts)?;
        let k = key.key.as_str();
        let rows = self
            .run(
                Stmt::SendTopicKeyed,
                None,
                &[&routing_key, &k, &body, &headers, &delay, &window],
            )
            .await
            .map_err(|e| e.in_sdk(FEATURE))?;
        self.expire_keys_when_due().await;
        let r = rows
            .first()
            .ok_or_else(|| Error::InvalidArgument("send_topic_keyed returned no row".into()))?;
        Ok(TopicSent {
            queues: col::<Option<i32>>(r, 0)?.unwrap_or(0),
            duplicate: col::<bool>(r, 1)?,
        })
    }

    /// Deletes up to `max_rows` expired deduplication keys of each kind
    /// (queue and topic keys), passing over keys another transaction holds,
    /// and the leftover pause flags and limit state of dropped queues;
    /// returns how many rows it deleted. A [`Client`](crate::Client) calls
    /// it on its own after keyed sends, at most once a second; call it
    /// yourself when you send only inside your own transactions (it is
    /// meant to run in a transaction of its own: inside a longer one it
    /// holds the deleted keys' locks until that commits).
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let deleted = client.expire_send_keys(10_000).await?;
    /// # Ok(()) }
    /// ```
    pub async fn expire_send_keys(&self, max_rows: i32) -> Result<i64, Error> {
        if max_rows < 1 {
            return Err(Error::InvalidArgument(format!(
                "expire_send_keys takes 1 or more rows, not {max_rows}"
            )));
        }
        let rows = self
            .run(Stmt::ExpireKeys, None, &[&max_rows])
            .await
            .map_err(|e| e.in_sdk(FEATURE))?;
        Ok(i64::from(
            crate::conn::rows::first_col::<Option<i32>>(&rows, 0, None)?.unwrap_or(0),
        ))
    }
}
