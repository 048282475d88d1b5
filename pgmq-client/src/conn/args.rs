//! Argument checks, made before any SQL runs: durations in PGMQ's integer
//! seconds or milliseconds, quantities and batch sizes, and the text of a
//! rejected argument in an error.

use std::time::Duration;

use crate::conn::error::Error;

/// The most messages one call reads, pops or sends, and the most ids one
/// batch acknowledgement takes: 10 000.
///
/// A larger `qty` or batch is refused with [`Error::InvalidArgument`] before
/// any SQL runs. One statement's rows are held in memory whole, and PGMQ
/// locks a read batch in one transaction; split bigger work into calls of
/// this size or less.
///
/// ```
/// # async fn f(client: pgmq_client::Client, q: pgmq_client::QueueName) {
/// use std::time::Duration;
/// let err = client
///     .read::<serde_json::Value>(&q, Duration::from_secs(30), pgmq_client::MAX_BATCH + 1)
///     .await
///     .unwrap_err();
/// assert!(matches!(err, pgmq_client::Error::InvalidArgument(_)));
/// # }
/// ```
pub const MAX_BATCH: usize = 10_000;

/// The longest duration PGMQ's integer seconds hold: `i32::MAX` seconds
/// (about 68 years). Visibility timeouts, delays and poll times longer than
/// this are refused with [`Error::InvalidArgument`].
pub const MAX_SECONDS: Duration = Duration::from_secs(i32::MAX as u64);

/// `d` in whole seconds as PGMQ's integer arguments take them, **rounded
/// up**: a visibility timeout of 500 ms hides the message for 1 s rather than
/// not at all (zero stays zero). Longer than [`MAX_SECONDS`] is refused.
pub(crate) fn secs(d: Duration, what: &str) -> Result<i32, Error> {
    let s = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
    i32::try_from(s).map_err(|_| {
        Error::InvalidArgument(format!(
            "{what} of {d:?} is longer than the {}s PGMQ takes",
            i32::MAX
        ))
    })
}

/// Milliseconds of `d` as an integer argument, rounded up.
pub(crate) fn millis(d: Duration, what: &str) -> Result<i32, Error> {
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    i32::try_from(ms).map_err(|_| Error::InvalidArgument(format!("{what} of {d:?} is too long")))
}

/// A read's or pop's `qty`, at most [`MAX_BATCH`].
pub(crate) fn qty(n: usize) -> Result<i32, Error> {
    check_batch(n, "quantity")?;
    Ok(n as i32)
}

/// Refuses a batch of more than [`MAX_BATCH`] items.
pub(crate) fn check_batch(n: usize, what: &str) -> Result<(), Error> {
    if n > MAX_BATCH {
        return Err(Error::InvalidArgument(format!(
            "{what} {n} is more than the {MAX_BATCH} one call takes (MAX_BATCH)"
        )));
    }
    Ok(())
}

/// Truncates a user-supplied string for an error message.
pub(crate) fn shorten(s: &str) -> String {
    let mut out: String = s.chars().take(64).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shorten_long_input() {
        let long = "x".repeat(200);
        assert_eq!(shorten(&long).chars().count(), 65);
        assert_eq!(shorten("abc"), "abc");
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(secs(Duration::ZERO, "vt").unwrap(), 0);
        assert_eq!(secs(Duration::from_millis(1), "vt").unwrap(), 1);
        assert_eq!(secs(Duration::from_millis(500), "vt").unwrap(), 1);
        assert_eq!(secs(Duration::from_millis(2001), "vt").unwrap(), 3);
        assert_eq!(secs(MAX_SECONDS, "vt").unwrap(), i32::MAX);
        assert!(secs(MAX_SECONDS + Duration::from_nanos(1), "vt").is_err());
        assert!(secs(Duration::MAX, "vt").is_err());
        assert_eq!(millis(Duration::from_micros(1), "p").unwrap(), 1);
        assert_eq!(millis(Duration::from_millis(250), "p").unwrap(), 250);
    }

    #[test]
    fn batches_are_bounded() {
        assert_eq!(qty(MAX_BATCH).unwrap(), MAX_BATCH as i32);
        assert!(matches!(qty(MAX_BATCH + 1), Err(Error::InvalidArgument(_))));
        assert!(matches!(qty(usize::MAX), Err(Error::InvalidArgument(_))));
    }
}
