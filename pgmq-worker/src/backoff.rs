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
    use rand::Rng;
    let f = rand::thread_rng().gen_range(1.0 - JITTER..=1.0 + JITTER);
    d.min(pgmq_client::MAX_DELAY)
        .mul_f64(f)
        .min(pgmq_client::MAX_DELAY)
}

/// The relative spread of [`jittered`].
pub(crate) const JITTER: f64 = 0.2;

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
