//! Backoff: the delays of handler retries ([`Backoff`], by attempt, with
//! jitter), and the worker's own retries of failed database calls
//! ([`ErrorBackoff`], the same exponential curve walked one failure at a
//! time).

use std::time::Duration;

/// The delay before a failed message is tried again, by attempt number.
///
/// ```
/// use std::time::Duration;
/// use pgmq_worker::Backoff;
///
/// let b = Backoff::exponential(Duration::from_secs(1), Duration::from_secs(60));
/// assert_eq!(b.delay(1), Duration::from_secs(1));
/// assert_eq!(b.delay(3), Duration::from_secs(4));
/// assert_eq!(b.delay(30), Duration::from_secs(60));
/// assert_eq!(Backoff::constant(Duration::from_secs(5)).delay(9), Duration::from_secs(5));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backoff {
    /// The same delay every time.
    Constant(Duration),
    /// `base * 2^(attempt - 1)`, at most `max`.
    Exponential {
        /// The delay after the first attempt.
        base: Duration,
        /// The largest delay.
        max: Duration,
    },
}

impl Backoff {
    /// The same delay after every attempt.
    pub fn constant(delay: Duration) -> Self {
        Backoff::Constant(delay)
    }

    /// Doubling from `base` after the first attempt, capped at `max`.
    pub fn exponential(base: Duration, max: Duration) -> Self {
        Backoff::Exponential { base, max }
    }

    /// The delay after attempt `attempt` (1 = the first delivery) failed.
    pub fn delay(&self, attempt: u32) -> Duration {
        match *self {
            Backoff::Constant(d) => d,
            Backoff::Exponential { base, max } => {
                let shift = attempt.saturating_sub(1).min(31);
                base.checked_mul(1u32 << shift).unwrap_or(max).min(max)
            }
        }
    }
}

impl Default for Backoff {
    /// Exponential from 1 s to 5 min.
    fn default() -> Self {
        Backoff::exponential(Duration::from_secs(1), Duration::from_secs(300))
    }
}

/// Backoff after failed database calls: [`Backoff::exponential`] from
/// `min` to `max`, one step per failure, back to `min` after a success.
pub(crate) struct ErrorBackoff {
    curve: Backoff,
    /// Failures since the last reset.
    failures: u32,
}

impl ErrorBackoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        ErrorBackoff {
            curve: Backoff::exponential(min, max),
            failures: 0,
        }
    }

    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.curve.delay(self.failures)
    }
}

/// The delay before attempt `attempt` + 1 on `backoff`, with jitter when
/// `jitter` ([`jittered`]), never above PGMQ's longest delay.
pub(crate) fn retry_delay(backoff: &Backoff, attempt: u32, jitter: bool) -> Duration {
    let d = backoff.delay(attempt);
    if jitter {
        jittered(d)
    } else {
        d.min(pgmq_client::MAX_DELAY)
    }
}

/// `d` times a random factor in `[1 - JITTER, 1 + JITTER]`, so that
/// messages that failed together (a dependency down) do not all come back
/// at the same instant.
pub(crate) fn jittered(d: Duration) -> Duration {
    let f = 1.0 - JITTER + 2.0 * JITTER * unit_random();
    d.min(pgmq_client::MAX_DELAY)
        .mul_f64(f)
        .min(pgmq_client::MAX_DELAY)
}

/// The relative spread of [`jittered`].
pub(crate) const JITTER: f64 = 0.2;

/// A number in `[0, 1)` that differs from call to call: the hash of nothing
/// under a fresh `RandomState`, whose SipHash keys are random per thread and
/// change with every `RandomState::new`. Spreading retries needs no more than
/// that, and it spares the crate a random-number dependency.
fn unit_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    // The top 53 bits, as many as an f64's mantissa holds.
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_max_and_resets() {
        let mut b = ErrorBackoff::new(Duration::from_millis(50), Duration::from_millis(150));
        assert_eq!(b.next_delay(), Duration::from_millis(50));
        assert_eq!(b.next_delay(), Duration::from_millis(100));
        assert_eq!(b.next_delay(), Duration::from_millis(150));
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(50));
    }

    #[test]
    fn jitter_stays_within_its_spread_and_never_overflows() {
        for _ in 0..1000 {
            let d = jittered(Duration::from_secs(10));
            assert!(
                d >= Duration::from_secs(8) && d <= Duration::from_secs(12),
                "{d:?}"
            );
        }
        assert!(jittered(Duration::MAX) <= pgmq_client::MAX_DELAY);
    }
}
