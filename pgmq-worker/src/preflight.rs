//! The start-up checks, each bounded by `db_timeout`: the queue and the
//! dead-letter queue exist (with `check_queue`), the queue table has the
//! columns the fenced writes use, the PGMQ version's `read` is the one the
//! claim statement repeats (which picks how the claim loops read), and, for
//! [`WakeUp::Notify`](crate::WakeUp::Notify), the queue's insert trigger
//! is enabled (its DDL with a short `lock_timeout`, retried, then
//! [`Error::Locked`]) and the LISTEN connection opened.
//!
//! A transient error only warns (the worker retries once running); a setup
//! that can never work fails the start.

use pgmq_client::{Pgmq, QueueName};

use crate::claimer::{ClaimReads, ReadPath};
use crate::db::{Kept, Source};
use crate::error::Error;

/// What the start-up checks read.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub queue: QueueName,
    pub dead_letter_queue: Option<QueueName>,
    pub check_queue: bool,
    pub claim_reads: ClaimReads,
    /// Whether the claims take part in a fleet-wide limit (which needs the
    /// `pgmq_sdk` schema).
    pub fleet_limit: bool,
    /// Whether the claims take part in a limit per key (which needs the
    /// `pgmq_sdk` schema).
    pub key_limit: bool,
    pub db_timeout: std::time::Duration,
    /// Wake-ups by notification ([`WakeUp::Notify`](crate::WakeUp::Notify)).
    pub notify: bool,
    pub notify_throttle: std::time::Duration,
    /// Whether `notify_throttle` was set by the caller (then it overrides
    /// the throttle of an existing trigger).
    pub notify_throttle_set: bool,
}

/// Checks the queue (and the dead-letter queue) when `check_queue` is set,
/// and picks how the claim loops read: the table statements need a layout
/// that was checked, on a PGMQ whose `read` this crate knows.
pub(crate) async fn check_queues(source: &Source, cfg: &Settings) -> Result<ReadPath, Error> {
    if cfg.check_queue {
        check_queue(source, &cfg.queue, cfg.db_timeout).await?;
        if let Some(dlq) = &cfg.dead_letter_queue {
            check_queue(source, dlq, cfg.db_timeout).await?;
        }
    }
    if cfg.fleet_limit {
        check_sdk_schema(source, cfg.db_timeout, false).await?;
        return Ok(ReadPath::Limited);
    }
    if cfg.key_limit {
        check_sdk_schema(source, cfg.db_timeout, true).await?;
        return Ok(ReadPath::KeyLimited);
    }
    let layout_known = cfg.check_queue && check_layout(source, cfg).await?;
    Ok(match cfg.claim_reads {
        ClaimReads::Function => ReadPath::Function,
        ClaimReads::FifoGroups => ReadPath::Grouped,
        _ if !layout_known || !known_read(source, cfg.db_timeout).await => {
            tracing::info!(queue = %cfg.queue, "claims call pgmq.read: the queue table's layout or the PGMQ version is not one this worker knows");
            ReadPath::Function
        }
        ClaimReads::FromStart => ReadPath::FromStart,
        _ => ReadPath::Bounded,
    })
}

/// Fails the start when the `pgmq_sdk` schema's limited read (per key when
/// `per_key`) is missing (the limit would fail every read); a transient
/// error only warns.
async fn check_sdk_schema(
    source: &Source,
    limit: std::time::Duration,
    per_key: bool,
) -> Result<(), Error> {
    let found = async {
        let conn = source.checkout(limit).await?;
        let pg = Pgmq::on(&conn);
        if per_key {
            conn.bounded(limit, pg.key_limit_available()).await
        } else {
            conn.bounded(limit, pg.fleet_limit_available()).await
        }
    };
    let feature = if per_key {
        "a limit per key"
    } else {
        "a fleet-wide limit"
    };
    match found.await {
        Ok(true) => Ok(()),
        Ok(false) => Err(pgmq_client::Error::SdkSchemaMissing { feature }.into()),
        Err(e) if e.is_transient() => {
            tracing::warn!(error = %e, "could not check for the pgmq_sdk schema; starting anyway");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// With [`WakeUp::Notify`](crate::WakeUp::Notify): enables the queue's insert trigger (returning its
/// throttle) and, when `listen`, opens the LISTEN connection. Without it:
/// a zero throttle and no connection.
pub(crate) async fn prepare_notify(
    source: &Source,
    cfg: &Settings,
    listen: bool,
) -> Result<(std::time::Duration, Option<pgmq_client::Listener>), Error> {
    if !cfg.notify {
        return Ok((std::time::Duration::ZERO, None));
    }
    let throttle = ensure_notify_trigger(source, cfg).await?;
    if !listen {
        return Ok((throttle, None));
    }
    // A setup that can never listen fails now; a database that is away
    // only delays the LISTEN connection (polling meanwhile).
    match crate::notifier::listen(source, &cfg.queue).await {
        Ok(l) => Ok((throttle, Some(l))),
        Err(e) if e.is_transient() => {
            tracing::warn!(error = %e, "LISTEN connection failed; polling until it opens");
            Ok((throttle, None))
        }
        Err(e) => Err(e.into()),
    }
}

/// The columns of PGMQ's queue table that the fenced writes use, with their
/// types: the same from PGMQ 1.11 (the oldest supported) to 1.13.
const LAYOUT: &[(&str, &str)] = &[
    ("msg_id", "bigint"),
    ("read_ct", "integer"),
    ("enqueued_at", "timestamp with time zone"),
    ("last_read_at", "timestamp with time zone"),
    ("vt", "timestamp with time zone"),
    ("message", "jsonb"),
    ("headers", "jsonb"),
];

/// Whether the detected PGMQ's `read` is the one the claim statement
/// repeats (1.x from [`MIN_SUPPORTED`](pgmq_client::MIN_SUPPORTED) on); a
/// client that skipped detection does not say.
async fn known_read(source: &Source, limit: std::time::Duration) -> bool {
    source
        .install(limit)
        .await
        .is_some_and(|i| i.version.major == 1 && i.version >= pgmq_client::MIN_SUPPORTED)
}

/// Fails when the queue table lacks a column the fenced writes use (a PGMQ
/// whose layout this crate does not know); true when the layout was
/// checked, false when a transient error kept it from being checked (that
/// only warns).
async fn check_layout(source: &Source, cfg: &Settings) -> Result<bool, Error> {
    let queue = &cfg.queue;
    // On a connection of its own, within `db_timeout` (abandoned past it).
    let columns = async {
        let conn = source.checkout(cfg.db_timeout).await?;
        let pg = Pgmq::on(&conn);
        crate::db::bounded(cfg.db_timeout, &conn, pg.queue_table_columns(queue)).await
    }
    .await;
    let have = match columns {
        Ok(have) => have,
        Err(e) if e.is_transient() => {
            tracing::warn!(error = %e, queue = %queue, "could not check the queue table's layout; starting anyway");
            return Ok(false);
        }
        Err(e) => {
            return Err(Error::Config(format!(
                "could not read the queue table's layout: {e}"
            )))
        }
    };
    for (col, ty) in LAYOUT {
        if !have.iter().any(|c| c.name == *col && c.type_name == *ty) {
            return Err(Error::Config(format!(
                "the table of queue {queue} has no column {col} of type {ty}: this PGMQ's layout is not one this worker writes to"
            )));
        }
    }
    Ok(true)
}

/// Fails when `queue` does not exist; a transient error only warns (the
/// worker retries once running).
async fn check_queue(
    source: &Source,
    queue: &QueueName,
    limit: std::time::Duration,
) -> Result<(), Error> {
    match Pgmq::on(Kept::new(source.clone(), 0, limit))
        .queue_exists(queue)
        .await
    {
        Ok(true) => Ok(()),
        Ok(false) => Err(Error::Client(pgmq_client::Error::QueueNotFound {
            queue: queue.as_str().to_owned(),
        })),
        Err(e) if e.is_transient() => {
            tracing::warn!(error = %e, queue = %queue, "could not check the queue; starting anyway");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Enables PGMQ's insert trigger on the queue unless it already is; sets
/// the throttle of an existing trigger only when the builder was given one.
/// Returns the trigger's throttle (the configured one when it cannot be
/// looked up).
async fn ensure_notify_trigger(
    source: &Source,
    cfg: &Settings,
) -> Result<std::time::Duration, Error> {
    let client = Pgmq::on(Kept::new(source.clone(), 0, cfg.db_timeout));
    let wanted = cfg.notify_throttle;
    let existing = match client.list_notify_insert_throttles().await {
        Ok(list) => list
            .into_iter()
            .find(|t| t.queue_name == cfg.queue.as_str())
            .map(|t| {
                std::time::Duration::from_millis(u64::try_from(t.throttle_interval_ms).unwrap_or(0))
            }),
        Err(e) if e.is_transient() => {
            tracing::warn!(error = %e, "could not check the insert trigger; relying on polling");
            return Ok(wanted);
        }
        Err(e) => return Err(e.into()),
    };
    match existing {
        None => {
            trigger_ddl(source, cfg, TriggerDdl::Enable).await?;
            tracing::info!(queue = %cfg.queue, throttle = ?wanted, "enabled PGMQ's insert notifications");
            Ok(wanted)
        }
        Some(current) if cfg.notify_throttle_set && current != wanted => {
            trigger_ddl(source, cfg, TriggerDdl::Update).await?;
            tracing::info!(queue = %cfg.queue, from = ?current, to = ?wanted, "changed the insert trigger's throttle");
            Ok(wanted)
        }
        Some(current) => Ok(current),
    }
}

/// How long one try of the start-up DDL waits for its lock on the queue
/// table (at most half of `db_timeout`). Producers and readers of the queue
/// queue up behind a DDL statement waiting for its lock, so the wait is
/// kept short, and retried.
const DDL_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

/// Tries of the start-up DDL before the start fails with [`Error::Locked`]
/// (pauses of 0.5, 1, 2 and 4 s between them).
const DDL_TRIES: u32 = 5;

/// The start-up DDL on the queue's insert trigger.
#[derive(Clone, Copy)]
enum TriggerDdl {
    /// `enable_notify_insert` (which drops and creates the trigger).
    Enable,
    /// `update_notify_insert`.
    Update,
}

/// Runs `ddl` in a transaction with a short `lock_timeout`
/// ([`DDL_LOCK_TIMEOUT`]), so that a long transaction holding a lock on the
/// queue table does not make it wait, with every reader and producer of
/// the queue waiting behind it; retries with a growing pause; after
/// [`DDL_TRIES`] fails with [`Error::Locked`], naming the sessions that hold
/// locks on the table.
async fn trigger_ddl(source: &Source, cfg: &Settings, ddl: TriggerDdl) -> Result<(), Error> {
    let lock_timeout = DDL_LOCK_TIMEOUT.min(cfg.db_timeout / 2);
    let mut pause = lock_timeout;
    for attempt in 1..=DDL_TRIES {
        match trigger_ddl_once(source, cfg, ddl, lock_timeout).await {
            Ok(()) => return Ok(()),
            Err(e) if is_lock_timeout(&e) => {
                tracing::warn!(queue = %cfg.queue, attempt, "the insert trigger's DDL could not take its lock on the queue table in time (a long transaction holds one); trying again");
            }
            Err(e) => return Err(e.into()),
        }
        if attempt < DDL_TRIES {
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }
    Err(Error::Locked {
        table: cfg.queue.table(),
        holders: lock_holders(source, cfg).await,
    })
}

/// Whether `e` is PostgreSQL's `lock_timeout` (55P03, lock_not_available).
fn is_lock_timeout(e: &pgmq_client::Error) -> bool {
    e.sqlstate()
        == Some(&pgmq_client::reexports::tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE)
}

/// One try of [`trigger_ddl`], bounded by `db_timeout` (and server-side by
/// the same `statement_timeout`).
async fn trigger_ddl_once(
    source: &Source,
    cfg: &Settings,
    ddl: TriggerDdl,
    lock_timeout: std::time::Duration,
) -> Result<(), pgmq_client::Error> {
    let mut conn = source.checkout(cfg.db_timeout).await?;
    let run = async {
        let tx = conn.transaction().await?;
        let pg = Pgmq::on(&tx);
        pg.set_local_timeouts(lock_timeout, cfg.db_timeout).await?;
        match ddl {
            TriggerDdl::Enable => {
                pg.enable_notify_insert(&cfg.queue, cfg.notify_throttle)
                    .await?
            }
            TriggerDdl::Update => {
                pg.update_notify_insert(&cfg.queue, cfg.notify_throttle)
                    .await?
            }
        }
        tx.commit().await
    };
    match tokio::time::timeout(cfg.db_timeout, run).await {
        Ok(r) => r,
        Err(_) => {
            conn.abandon();
            Err(pgmq_client::Error::timed_out())
        }
    }
}

/// The sessions holding a lock on the queue's table, for [`Error::Locked`]:
/// their pid, application name, state and how long their transaction has
/// been open (never their query text, which may quote data).
async fn lock_holders(source: &Source, cfg: &Settings) -> String {
    let queue = &cfg.queue;
    // On a connection of its own, within `db_timeout` (abandoned past it).
    let holders = async {
        let conn = source.checkout(cfg.db_timeout).await?;
        let pg = Pgmq::on(&conn);
        let look = pg.queue_table_lock_holders(queue, LOCK_HOLDERS_SHOWN);
        crate::db::bounded(cfg.db_timeout, &conn, look).await
    }
    .await;
    match holders {
        Ok(holders) if !holders.is_empty() => holders
            .iter()
            .map(|h| {
                format!(
                    "pid {} (application_name '{}', {}, transaction open {:.0} s, holding {})",
                    h.pid,
                    h.application_name,
                    h.state,
                    h.transaction_open.as_secs_f64(),
                    h.mode
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
        Ok(_) => "no session any more".to_owned(),
        Err(e) => format!("unknown sessions (could not look them up: {e})"),
    }
}

/// How many of the sessions holding a lock on the queue table
/// [`Error::Locked`] names, the longest-open transactions first.
const LOCK_HOLDERS_SHOWN: usize = 5;
