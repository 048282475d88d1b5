//! When a schedule ticks ([`Cadence`]: a cron expression in a time zone,
//! or a fixed interval) and the tick arithmetic of a firing: the first
//! tick after a moment, the last one before it, the due ticks under a
//! catch-up bound, and a tick's key ([`tick_key`]). Cron expressions are
//! parsed and searched (forward and backward) by `croner`, in a `chrono-tz`
//! zone; intervals tick on their multiples since the Unix epoch, in
//! microseconds.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds};
use croner::Cron;

use crate::conn::error::Error;

/// The next tick stored for a cron expression that has no tick left (a
/// pattern bound to past years): never due.
fn never() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(9999, 12, 31, 0, 0, 0)
        .single()
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// When a schedule ticks: a cron expression in a time zone, or a fixed
/// interval.
///
/// ```
/// use pgmq_client::Cadence;
/// let weekdays = Cadence::cron("0 9 * * MON-FRI", "Europe/Paris")?;
/// let often = Cadence::every(std::time::Duration::from_secs(30))?;
/// assert!(Cadence::cron("61 * * * *", "UTC").is_err());
/// # Ok::<(), pgmq_client::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cadence {
    /// A cron expression (five fields, or six with seconds first) read in
    /// an IANA time zone.
    Cron {
        /// The expression.
        expr: String,
        /// The time zone's IANA name.
        time_zone: String,
    },
    /// Every multiple of this interval since the Unix epoch (whole
    /// milliseconds, at least one).
    Every(Duration),
}

impl Cadence {
    /// A cron expression in a time zone; [`Error::InvalidArgument`] for an
    /// expression or a zone that does not parse.
    pub fn cron(expr: &str, time_zone: &str) -> Result<Self, Error> {
        let c = Cadence::Cron {
            expr: expr.to_owned(),
            time_zone: time_zone.to_owned(),
        };
        Ticks::of(&c)?;
        Ok(c)
    }

    /// A fixed interval; [`Error::InvalidArgument`] for one shorter than a
    /// millisecond or not in whole milliseconds.
    pub fn every(interval: Duration) -> Result<Self, Error> {
        let c = Cadence::Every(interval);
        Ticks::of(&c)?;
        Ok(c)
    }
}

impl std::fmt::Display for Cadence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cadence::Cron { expr, time_zone } => write!(f, "cron '{expr}' {time_zone}"),
            Cadence::Every(d) => write!(f, "every {}ms", d.as_millis()),
        }
    }
}

/// A cadence ready to compute ticks.
pub(crate) enum Ticks {
    Cron(Box<Cron>, Tz),
    /// The interval in microseconds.
    Every(i64),
}

impl Ticks {
    pub(crate) fn of(c: &Cadence) -> Result<Ticks, Error> {
        match c {
            Cadence::Cron { expr, time_zone } => {
                let cron = CronParser::builder()
                    .seconds(Seconds::Optional)
                    .build()
                    .parse(expr)
                    .map_err(|e| {
                        Error::InvalidArgument(format!("cron expression '{expr}': {e}"))
                    })?;
                let tz = Tz::from_str(time_zone)
                    .map_err(|e| Error::InvalidArgument(format!("time zone '{time_zone}': {e}")))?;
                Ok(Ticks::Cron(Box::new(cron), tz))
            }
            Cadence::Every(d) => {
                let ms = d.as_millis();
                if ms == 0 || d.subsec_nanos() % 1_000_000 != 0 || ms > i64::MAX as u128 / 1000 {
                    return Err(Error::InvalidArgument(format!(
                        "a schedule's interval must be whole milliseconds, at least one: {d:?}"
                    )));
                }
                Ok(Ticks::Every(ms as i64 * 1000))
            }
        }
    }

    /// The first tick strictly after `t`.
    pub(crate) fn after(&self, t: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            Ticks::Cron(cron, tz) => cron
                .find_next_occurrence(&t.with_timezone(tz), false)
                .map(|x| x.with_timezone(&Utc))
                .unwrap_or_else(|_| never()),
            Ticks::Every(us) => {
                let k = t.timestamp_micros().div_euclid(*us) + 1;
                DateTime::from_timestamp_micros(k.saturating_mul(*us)).unwrap_or_else(never)
            }
        }
    }

    /// The last tick at or before `t` (`inclusive`) or strictly before it.
    pub(crate) fn before(&self, t: DateTime<Utc>, inclusive: bool) -> Option<DateTime<Utc>> {
        match self {
            Ticks::Cron(cron, tz) => cron
                .find_previous_occurrence(&t.with_timezone(tz), inclusive)
                .ok()
                .map(|x| x.with_timezone(&Utc))
                .filter(|x| if inclusive { *x <= t } else { *x < t }),
            Ticks::Every(us) => {
                let m = t.timestamp_micros() - i64::from(!inclusive);
                DateTime::from_timestamp_micros(m.div_euclid(*us) * us)
            }
        }
    }
}

/// The due ticks from `start` (the first tick not sent) up to `now`,
/// bounded by `catch_up` missed ones: (ticks to send, skipped range).
#[allow(clippy::type_complexity)]
pub(crate) fn due_ticks(
    ticks: &Ticks,
    start: DateTime<Utc>,
    now: DateTime<Utc>,
    catch_up: u32,
) -> (Vec<DateTime<Utc>>, Option<(DateTime<Utc>, DateTime<Utc>)>) {
    let mut out = Vec::new();
    let mut at = ticks.before(now, true);
    while let Some(t) = at {
        if t < start || out.len() > catch_up as usize {
            break;
        }
        out.push(t);
        at = ticks.before(t, false);
    }
    out.reverse();
    let skipped = match (at, out.first()) {
        (Some(last_skipped), Some(_)) if last_skipped >= start => Some((start, last_skipped)),
        _ => None,
    };
    (out, skipped)
}

/// The tick key of a scheduled message: its
/// [`TICK_HEADER`](crate::TICK_HEADER) value.
///
/// ```
/// use chrono::TimeZone;
/// let t = chrono::Utc.with_ymd_and_hms(2026, 1, 31, 9, 0, 0).unwrap();
/// assert_eq!(pgmq_client::tick_key(t), "2026-01-31T09:00:00.000Z");
/// ```
pub fn tick_key(tick: DateTime<Utc>) -> String {
    tick.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    /// Checks `after(from) == want` for each of `afters` and
    /// `before(at, inclusive) == want` for each of `befores`.
    fn check(c: Cadence, afters: &[(&str, &str)], befores: &[(&str, bool, &str)]) {
        let t = Ticks::of(&c).unwrap();
        for (from, want) in afters {
            assert_eq!(t.after(at(from)), at(want), "after {from}");
        }
        for (from, inclusive, want) in befores {
            assert_eq!(
                t.before(at(from), *inclusive),
                Some(at(want)),
                "before {from}"
            );
        }
    }

    #[test]
    fn intervals_tick_on_multiples_since_the_epoch() {
        check(
            Cadence::every(Duration::from_secs(300)).unwrap(),
            &[
                ("2026-01-01T10:02:10Z", "2026-01-01T10:05:00Z"),
                ("2026-01-01T10:05:00Z", "2026-01-01T10:10:00Z"),
            ],
            &[
                ("2026-01-01T10:05:00Z", true, "2026-01-01T10:05:00Z"),
                ("2026-01-01T10:05:00Z", false, "2026-01-01T10:00:00Z"),
            ],
        );
    }

    #[test]
    fn cron_ticks_follow_the_time_zone_across_dst() {
        // Winter: 9:00 in Paris is 8:00 UTC; summer (after 29 March): 7:00.
        check(
            Cadence::cron("0 9 * * *", "Europe/Paris").unwrap(),
            &[
                ("2026-03-27T12:00:00Z", "2026-03-28T08:00:00Z"),
                ("2026-03-29T12:00:00Z", "2026-03-30T07:00:00Z"),
            ],
            &[("2026-03-30T07:00:00Z", false, "2026-03-29T07:00:00Z")],
        );
    }

    #[test]
    fn missed_ticks_are_bounded_by_catch_up() {
        let t = Ticks::of(&Cadence::every(Duration::from_secs(1)).unwrap()).unwrap();
        let start = at("2026-01-01T00:00:00Z");
        let now = at("2026-01-01T00:00:09.500Z");
        let (all, skipped) = due_ticks(&t, start, now, 100);
        assert_eq!(all.len(), 10);
        assert_eq!(all[0], start);
        assert_eq!(skipped, None);
        let (some, skipped) = due_ticks(&t, start, now, 2);
        assert_eq!(
            some,
            vec![
                at("2026-01-01T00:00:07Z"),
                at("2026-01-01T00:00:08Z"),
                at("2026-01-01T00:00:09Z")
            ]
        );
        assert_eq!(skipped, Some((start, at("2026-01-01T00:00:06Z"))));
        let (latest, _) = due_ticks(&t, start, now, 0);
        assert_eq!(latest, vec![at("2026-01-01T00:00:09Z")]);
        let (none, _) = due_ticks(&t, at("2026-01-01T00:00:10Z"), now, 5);
        assert!(none.is_empty());
    }
}
