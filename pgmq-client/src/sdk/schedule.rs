//! Periodic sends: a schedule sends a given message (body and headers) to
//! a queue on each tick of a cron expression in a time zone, or of a fixed
//! interval. Schedules live in the `pgmq_sdk` schema
//! ([`crate::sdk::sdk_schema`]); any number of processes fire them
//! ([`Pgmq::fire_due_schedules`], which pgmq-worker's `Scheduler` runs in a
//! loop), and each tick is sent once for the whole fleet.
//!
//! # One send per tick
//!
//! A schedule's row holds its next tick not yet sent. A runner reads the
//! due schedules and the database's clock ([`Pgmq::due_schedules`]),
//! computes here which ticks are due, and fires each schedule
//! ([`Pgmq::fire`]): one statement that, only if the row is still as the
//! runner read it, sends one message per tick and moves the next tick past
//! them. Two runners that read the same tick both try; the row lock
//! (`FOR UPDATE SKIP LOCKED`) and the fence on what they read let exactly
//! one send it. A runner that crashes before its statement commits has
//! sent nothing and moved nothing: the next runner sends the tick. No
//! runner is elected, and one that stalls (SIGSTOP) and wakes up late
//! finds the row moved and sends nothing.
//!
//! Each message carries the headers [`SCHEDULE_HEADER`] (the schedule's
//! name) and [`TICK_HEADER`] (the tick, RFC 3339 in UTC with
//! milliseconds): a consumer can tell the ticks apart by them.
//!
//! # Ticks
//!
//! The database's clock decides what is due. A cron expression (five
//! fields, or six with seconds first; `@hourly` and the like) is read in
//! its time zone (an IANA name, `UTC` by default), so `0 9 * * MON-FRI`
//! in `Europe/Paris` stays at 9:00 across daylight saving changes. An
//! interval's ticks are the multiples of it since the Unix epoch (every
//! 5 minutes: at :00, :05, ...). A new, changed or resumed schedule's
//! first tick is its first after that change.
//!
//! # Missed ticks
//!
//! When no runner ran for a while, several ticks are due at once. The
//! latest is always sent; of the ones before it (the missed ticks) at most
//! the schedule's `catch_up` most recent are sent too, oldest first, and
//! the older ones are skipped (logged, never sent later).
//! [`DEFAULT_CATCH_UP`] is the default; 0 skips every missed tick. Ticks
//! due while a schedule is paused are never sent.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::rows::{col, first_col};
use crate::conn::statements::Stmt;
use crate::pgmq::queue_name::QueueName;
use crate::sdk::cadence::{due_ticks, tick_key, Cadence, Ticks};
use crate::Pgmq;

const FEATURE: &str = "periodic sends";

/// The header naming the schedule that sent a message.
pub const SCHEDULE_HEADER: &str = "x-pgmq-schedule";

/// The header holding the tick a scheduled message was sent for (RFC 3339
/// in UTC, milliseconds: `2026-01-31T09:00:00.000Z`); with
/// [`SCHEDULE_HEADER`] the message's key.
pub const TICK_HEADER: &str = "x-pgmq-tick";

/// How many missed ticks a schedule sends after a gap by default, besides
/// the latest due one ([`Schedule::catch_up`]).
pub const DEFAULT_CATCH_UP: u32 = 10;

/// The most missed ticks a schedule may catch up on.
pub const MAX_CATCH_UP: u32 = 10_000;

/// The longest schedule name, in bytes.
pub const MAX_SCHEDULE_NAME_LEN: usize = 200;

/// A schedule to create or replace ([`Pgmq::put_schedule`]).
///
/// ```
/// use pgmq_client::{Cadence, QueueName, Schedule};
/// let s = Schedule::new("nightly-report", QueueName::new("reports")?,
///         Cadence::cron("0 3 * * *", "Europe/Paris")?)?
///     .message(serde_json::json!({"report": "daily"}))
///     .catch_up(0);
/// assert_eq!(s.name(), "nightly-report");
/// # Ok::<(), pgmq_client::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Schedule {
    name: String,
    queue: QueueName,
    cadence: Cadence,
    message: serde_json::Value,
    headers: Option<serde_json::Value>,
    catch_up: u32,
}

impl Schedule {
    /// A schedule that sends `{}` with no headers and catches up on at
    /// most [`DEFAULT_CATCH_UP`] missed ticks. [`Error::InvalidArgument`]
    /// for a name that is empty, longer than [`MAX_SCHEDULE_NAME_LEN`] or
    /// holds a NUL.
    pub fn new(name: &str, queue: QueueName, cadence: Cadence) -> Result<Self, Error> {
        check_name(name)?;
        Ok(Schedule {
            name: name.to_owned(),
            queue,
            cadence,
            message: serde_json::json!({}),
            headers: None,
            catch_up: DEFAULT_CATCH_UP,
        })
    }

    /// The message body each tick sends.
    pub fn message(mut self, body: serde_json::Value) -> Self {
        self.message = body;
        self
    }

    /// The headers each tick sends (a JSON object), beside
    /// [`SCHEDULE_HEADER`] and [`TICK_HEADER`].
    pub fn headers(mut self, headers: serde_json::Value) -> Self {
        self.headers = Some(headers);
        self
    }

    /// How many missed ticks to send after a gap, besides the latest due
    /// one (at most [`MAX_CATCH_UP`]); 0 skips them. Default
    /// [`DEFAULT_CATCH_UP`].
    pub fn catch_up(mut self, ticks: u32) -> Self {
        self.catch_up = ticks;
        self
    }

    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

fn check_name(name: &str) -> Result<(), Error> {
    if name.is_empty() || name.len() > MAX_SCHEDULE_NAME_LEN || name.contains('\0') {
        return Err(Error::InvalidArgument(format!(
            "a schedule's name must be 1 to {MAX_SCHEDULE_NAME_LEN} bytes without NUL: {name:?}"
        )));
    }
    Ok(())
}

/// A schedule as stored, as [`Pgmq::schedules`] lists it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// Its name.
    pub name: String,
    /// The queue it sends to.
    pub queue_name: String,
    /// When it ticks; `None` for a stored cadence this crate cannot read
    /// (a row written by hand).
    pub cadence: Option<Cadence>,
    /// The body each tick sends.
    pub message: serde_json::Value,
    /// The headers each tick sends.
    pub headers: Option<serde_json::Value>,
    /// Missed ticks sent after a gap.
    pub catch_up: u32,
    /// Whether it is paused.
    pub paused: bool,
    /// Its next tick not sent yet (`None`: the first after `changed_at`,
    /// placed by the next runner).
    pub next_tick: Option<DateTime<Utc>>,
    /// The last tick it sent.
    pub last_tick: Option<DateTime<Utc>>,
    /// How many messages it sent.
    pub sent: i64,
    /// When its spec last changed or it was last resumed.
    pub changed_at: DateTime<Utc>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
}

/// A due schedule, as [`Pgmq::due_schedules`] read it, with the ticks to
/// send: what [`Pgmq::fire`] sends if the schedule is still as read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DueSchedule {
    /// The schedule's name.
    pub name: String,
    /// The ticks to send, oldest first (empty when the schedule only gets
    /// its first tick placed).
    pub ticks: Vec<DateTime<Utc>>,
    /// The due ticks skipped under the schedule's catch-up bound: the
    /// first and the last.
    pub skipped: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// The next tick once these are sent.
    pub next_tick: DateTime<Utc>,
    seen_next: Option<DateTime<Utc>>,
    seen_changed: DateTime<Utc>,
}

impl DueSchedule {
    /// The same firing without its sends: it moves the schedule past the
    /// ticks and sends nothing. A test hook for the fault campaign's
    /// sabotage (a runner that sends a tick outside the fenced statement).
    #[doc(hidden)]
    pub fn advance_only(&self) -> DueSchedule {
        DueSchedule {
            ticks: Vec::new(),
            ..self.clone()
        }
    }
}

/// A tick sent by [`Pgmq::fire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FiredTick {
    /// The message's id.
    pub msg_id: i64,
    /// The tick it was sent for.
    pub tick: DateTime<Utc>,
}

/// What one pass of [`Pgmq::fire_due_schedules`] did.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct FiringPass {
    /// The ticks sent, by schedule.
    pub sent: Vec<(String, FiredTick)>,
    /// The due schedules another runner fired first (or that changed
    /// since they were read).
    pub lost: usize,
    /// The schedules that failed, with the error.
    pub failed: Vec<(String, String)>,
    /// Whether the pass read as many due schedules as it may fire at once:
    /// more may be due.
    pub full: bool,
}

impl<E: Executor> Pgmq<E> {
    /// Creates the schedule, or replaces the spec of the one of that name
    /// (keeping whether it is paused): true when it was created. A
    /// replaced spec starts over from now. [`Error::QueueNotFound`] for a
    /// queue that does not exist, SQLSTATE 42501 for a role without INSERT
    /// on the queue's table, [`Error::SdkSchemaMissing`] without the
    /// `pgmq_sdk` schema.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::{Cadence, QueueName, Schedule};
    /// let s = Schedule::new("heartbeat", QueueName::new("ops")?,
    ///     Cadence::every(std::time::Duration::from_secs(60))?)?;
    /// client.put_schedule(&s).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq_sdk.put_schedule", skip_all, fields(schedule = %s.name))]
    pub async fn put_schedule(&self, s: &Schedule) -> Result<bool, Error> {
        if s.catch_up > MAX_CATCH_UP {
            return Err(Error::InvalidArgument(format!(
                "a schedule catches up on at most {MAX_CATCH_UP} ticks: {}",
                s.catch_up
            )));
        }
        Ticks::of(&s.cadence)?;
        let (cron, tz, every_ms): (Option<&str>, Option<&str>, Option<i64>) = match &s.cadence {
            Cadence::Cron { expr, time_zone } => (Some(expr), Some(time_zone), None),
            Cadence::Every(d) => (None, None, Some(d.as_millis() as i64)),
        };
        if let Some(h) = &s.headers {
            if !h.is_object() {
                return Err(Error::InvalidArgument(
                    "a schedule's headers must be a JSON object".into(),
                ));
            }
        }
        let q = s.queue.as_str();
        let catch_up = s.catch_up as i32;
        let rows = self
            .run(
                Stmt::PutSchedule,
                Some(q),
                &[
                    &s.name, &q, &cron, &tz, &every_ms, &s.message, &s.headers, &catch_up,
                ],
            )
            .await
            .map_err(|e| e.in_sdk(FEATURE))?;
        first_col::<Option<bool>>(&rows, 0, None).map(|b| b.unwrap_or(false))
    }

    /// Pauses a schedule: true when it was running. A paused schedule
    /// sends nothing; the ticks due while it is paused are never sent.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// client.pause_schedule("heartbeat").await?;
    /// # Ok(()) }
    /// ```
    pub async fn pause_schedule(&self, name: &str) -> Result<bool, Error> {
        self.schedule_call(Stmt::PauseSchedule, name).await
    }

    /// Resumes a paused schedule from now: true when it was paused.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// client.resume_schedule("heartbeat").await?;
    /// # Ok(()) }
    /// ```
    pub async fn resume_schedule(&self, name: &str) -> Result<bool, Error> {
        self.schedule_call(Stmt::ResumeSchedule, name).await
    }

    /// Removes a schedule: true when there was one.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// client.remove_schedule("heartbeat").await?;
    /// # Ok(()) }
    /// ```
    pub async fn remove_schedule(&self, name: &str) -> Result<bool, Error> {
        self.schedule_call(Stmt::RemoveSchedule, name).await
    }

    async fn schedule_call(&self, stmt: Stmt, name: &str) -> Result<bool, Error> {
        check_name(name)?;
        let rows = self
            .run(stmt, None, &[&name])
            .await
            .map_err(|e| e.in_sdk(FEATURE))?;
        first_col::<Option<bool>>(&rows, 0, None).map(|b| b.unwrap_or(false))
    }

    /// Every schedule the caller may see (SELECT or INSERT on its queue's
    /// table), by name.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// for s in client.schedules().await? {
    ///     println!("{} -> {}: next {:?}", s.name, s.queue_name, s.next_tick);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn schedules(&self) -> Result<Vec<ScheduleInfo>, Error> {
        let rows = self
            .run(Stmt::ListSchedules, None, &[])
            .await
            .map_err(|e| e.in_sdk(FEATURE))?;
        rows.iter()
            .map(|r| {
                let cron: Option<String> = col(r, 2)?;
                let tz: String = col(r, 3)?;
                let every: Option<i64> = col(r, 4)?;
                let cadence = match (cron, every) {
                    (Some(expr), _) => Cadence::cron(&expr, &tz).ok(),
                    (None, Some(ms)) if ms > 0 => {
                        Cadence::every(Duration::from_millis(ms as u64)).ok()
                    }
                    _ => None,
                };
                Ok(ScheduleInfo {
                    name: col(r, 0)?,
                    queue_name: col(r, 1)?,
                    cadence,
                    message: col(r, 5)?,
                    headers: col(r, 6)?,
                    catch_up: col::<i32>(r, 7)?.max(0) as u32,
                    paused: col(r, 8)?,
                    next_tick: col(r, 9)?,
                    last_tick: col(r, 10)?,
                    sent: col(r, 11)?,
                    changed_at: col(r, 12)?,
                    created_at: col(r, 13)?,
                })
            })
            .collect()
    }

    /// The schedules due by the database's clock that the caller may fire
    /// (INSERT on the queue's table), at most `max`, earliest first, with
    /// the ticks each would send. Takes no lock: [`Pgmq::fire`] sends them
    /// if no one did meanwhile. A schedule whose stored cadence does not
    /// parse is left out (logged).
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// for due in client.due_schedules(100).await? {
    ///     client.fire(&due).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn due_schedules(&self, max: usize) -> Result<Vec<DueSchedule>, Error> {
        let max = i32::try_from(max.max(1)).unwrap_or(i32::MAX);
        let rows = self
            .run(Stmt::DueSchedules, None, &[&max])
            .await
            .map_err(|e| e.in_sdk(FEATURE))?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let name: String = col(r, 0)?;
            let cron: Option<String> = col(r, 1)?;
            let tz: String = col(r, 2)?;
            let every: Option<i64> = col(r, 3)?;
            let catch_up: i32 = col(r, 4)?;
            let seen_next: Option<DateTime<Utc>> = col(r, 5)?;
            let seen_changed: DateTime<Utc> = col(r, 6)?;
            let now: DateTime<Utc> = col(r, 7)?;
            let cadence = match (cron, every) {
                (Some(expr), _) => Cadence::Cron {
                    expr,
                    time_zone: tz,
                },
                (None, Some(ms)) => Cadence::Every(Duration::from_millis(ms.max(0) as u64)),
                (None, None) => continue,
            };
            let ticks = match Ticks::of(&cadence) {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(schedule = %name, error = %e, "schedule skipped: its cadence does not parse");
                    continue;
                }
            };
            let start = seen_next.unwrap_or_else(|| ticks.after(seen_changed));
            let (due, skipped) = due_ticks(&ticks, start, now, catch_up.max(0) as u32);
            let next_tick = if due.is_empty() {
                start
            } else {
                ticks.after(now)
            };
            if due.is_empty() && seen_next.is_some() {
                continue;
            }
            out.push(DueSchedule {
                name,
                ticks: due,
                skipped,
                next_tick,
                seen_next,
                seen_changed,
            });
        }
        Ok(out)
    }

    /// Fires a due schedule: sends its ticks and moves it past them, in
    /// one statement, if it is still as [`Pgmq::due_schedules`] read it
    /// and no other runner holds it. `None` when it was not (another
    /// runner fired it, or it was changed, paused or removed): nothing was
    /// sent.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// for due in client.due_schedules(100).await? {
    ///     if let Some(sent) = client.fire(&due).await? {
    ///         println!("{}: {} sent", due.name, sent.len());
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq_sdk.fire_schedule", skip_all, fields(schedule = %due.name))]
    pub async fn fire(&self, due: &DueSchedule) -> Result<Option<Vec<FiredTick>>, Error> {
        let rows = self
            .run(
                Stmt::FireSchedule,
                None,
                &[
                    &due.name,
                    &due.seen_next,
                    &due.seen_changed,
                    &due.ticks,
                    &due.next_tick,
                ],
            )
            .await
            .map_err(|e| e.in_sdk(FEATURE))?;
        if rows.is_empty() && !due.ticks.is_empty() {
            return Ok(None);
        }
        let sent = rows
            .iter()
            .map(|r| {
                Ok(FiredTick {
                    msg_id: col(r, 0)?,
                    tick: col(r, 1)?,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        if let Some((first, last)) = due.skipped {
            tracing::warn!(schedule = %due.name, first = %tick_key(first), last = %tick_key(last),
                "missed ticks skipped beyond the schedule's catch-up bound");
        }
        Ok(Some(sent))
    }

    /// One runner's pass: reads up to `max` due schedules and fires each
    /// ([`Pgmq::due_schedules`], [`Pgmq::fire`]). A schedule whose firing
    /// fails is reported in [`FiringPass::failed`] and the pass goes on;
    /// an error reading the due schedules is returned.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let pass = client.fire_due_schedules(100).await?;
    /// println!("{} ticks sent", pass.sent.len());
    /// # Ok(()) }
    /// ```
    pub async fn fire_due_schedules(&self, max: usize) -> Result<FiringPass, Error> {
        let due = self.due_schedules(max).await?;
        let mut pass = FiringPass {
            full: due.len() >= max.max(1),
            ..FiringPass::default()
        };
        for d in &due {
            match self.fire(d).await {
                Ok(Some(sent)) => pass
                    .sent
                    .extend(sent.into_iter().map(|t| (d.name.clone(), t))),
                Ok(None) => pass.lost += 1,
                Err(e) => pass.failed.push((d.name.clone(), e.to_string())),
            }
        }
        Ok(pass)
    }

    /// How long until the earliest next tick of the schedules not paused,
    /// by the database's clock (zero when one is due); `None` without
    /// any. A runner sleeps at most this long.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let wait = client.next_schedule_due().await?;
    /// # Ok(()) }
    /// ```
    pub async fn next_schedule_due(&self) -> Result<Option<Duration>, Error> {
        let rows = self
            .run(Stmt::NextScheduleDue, None, &[])
            .await
            .map_err(|e| e.in_sdk(FEATURE))?;
        let secs: Option<f64> = first_col(&rows, 0, None)?;
        Ok(secs.map(|s| Duration::from_secs_f64(s.clamp(0.0, 1e9))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_cadences_and_names_are_refused() {
        assert!(Cadence::cron("* * *", "UTC").is_err());
        assert!(Cadence::cron("* * * * *", "Mars/Olympus").is_err());
        assert!(Cadence::every(Duration::ZERO).is_err());
        assert!(Cadence::every(Duration::from_micros(1500)).is_err());
        let q = QueueName::new("q").unwrap();
        let c = Cadence::every(Duration::from_secs(1)).unwrap();
        assert!(Schedule::new("", q.clone(), c.clone()).is_err());
        assert!(Schedule::new("a\0b", q.clone(), c.clone()).is_err());
        assert!(Schedule::new(&"x".repeat(201), q, c).is_err());
    }
}
