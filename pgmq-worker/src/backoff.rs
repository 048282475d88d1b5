//! Backoff between attempts: the worker's own retries of failed database
//! calls, and the jitter of handler retries.

use std::time::Duration;

/// Backoff after failed database calls: from `min`, doubling to `max`.
pub(crate) struct ErrorBackoff {
    next: Duration,
    min: Duration,
    max: Duration,
}

impl ErrorBackoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        ErrorBackoff {
            next: min,
            min,
            max,
        }
    }

    pub(crate) fn reset(&mut self) {
        self.next = self.min;
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
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
