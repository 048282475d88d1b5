//! Progress lines on stderr, whether it is a terminal, a pipe or a file:
//! one whole line each (no carriage returns), so that `| tee log` and CI
//! logs show what a terminal shows. A run says where it is as `[k/N]` steps
//! (a section in a round) with an estimate of the time left ([`Steps`]),
//! each run's rate, and the count of a long preload.

use std::time::{Duration, Instant};

use crate::sections::plan::Plan;

/// Writes progress lines to stderr, each prefixed with the seconds since
/// the run started.
#[derive(Debug, Clone)]
pub struct Progress {
    start: Instant,
}

impl Progress {
    /// Progress from now.
    pub fn new() -> Progress {
        Progress {
            start: Instant::now(),
        }
    }

    /// Prints one line with the seconds since start.
    pub fn say(&self, line: impl AsRef<str>) {
        eprintln!(
            "[{:>6.1}s] {}",
            self.start.elapsed().as_secs_f64(),
            line.as_ref()
        );
    }
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}

/// The least and the most the pace of the work done may scale the work
/// left by.
const PACE_BOUNDS: (f64, f64) = (0.1, 10.0);

/// The steps of a run, each a section in a round, with what each is
/// planned to take: which one is next, and an estimate of what is left.
///
/// The estimate is the fixed seconds of the steps left plus their work
/// seconds scaled by the pace of the work done so far (the seconds the
/// steps done took beyond their fixed seconds, over their work seconds);
/// it is only an estimate, and says so where it is printed.
#[derive(Debug)]
pub(crate) struct Steps {
    planned: Vec<Plan>,
    next: usize,
    first_started: Option<Instant>,
}

impl Steps {
    /// The steps, with each one's plan, in the order they run.
    pub(crate) fn new(planned: Vec<Plan>) -> Steps {
        Steps {
            planned,
            next: 0,
            first_started: None,
        }
    }

    /// How many steps there are.
    pub(crate) fn len(&self) -> usize {
        self.planned.len()
    }

    /// The planned seconds of every step.
    pub(crate) fn planned_s(&self) -> f64 {
        self.planned.iter().map(|p| p.total_s()).sum()
    }

    /// Starts the next step: its number, from 1, and the estimated seconds
    /// left including it.
    pub(crate) fn start_next(&mut self) -> (usize, f64) {
        let now = Instant::now();
        let first = *self.first_started.get_or_insert(now);
        let done: Plan = self.planned[..self.next].iter().copied().sum();
        let left: Plan = self.planned[self.next..].iter().copied().sum();
        let pace = if done.work_s > 0.0 {
            let worked = now.duration_since(first).as_secs_f64() - done.fixed_s;
            (worked / done.work_s).clamp(PACE_BOUNDS.0, PACE_BOUNDS.1)
        } else {
            1.0
        };
        self.next = (self.next + 1).min(self.planned.len());
        (self.next, left.fixed_s + left.work_s * pace)
    }
}

/// `about 3 min 40 s` for an estimate of `secs` seconds (to 10 s above a
/// minute, to the second below).
///
/// ```text
/// about 40 s, about 1 min 10 s, about 12 min 0 s
/// ```
pub(crate) fn about(secs: f64) -> String {
    let secs = secs.max(0.0);
    if secs < 60.0 {
        return format!("about {:.0} s", secs.max(1.0));
    }
    let tens = (secs / 10.0).round() as u64 * 10;
    let d = Duration::from_secs(tens);
    format!("about {} min {} s", d.as_secs() / 60, d.as_secs() % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_scales_the_work_left_by_the_pace_of_the_work_done() {
        let mut s = Steps::new(vec![
            Plan::work(0.001),
            Plan::work(0.01) + Plan::fixed(2.0),
            Plan::fixed(1.0),
        ]);
        assert_eq!(s.len(), 3);
        assert!((s.planned_s() - 3.011).abs() < 1e-9);
        let (k, left) = s.start_next();
        assert_eq!((k, left), (1, 3.011));
        std::thread::sleep(Duration::from_millis(40));
        // 40 ms for 1 ms of work: 40 times slower, bounded to 10; the
        // fixed seconds are not scaled.
        let (k, left) = s.start_next();
        assert_eq!(k, 2);
        assert!((left - (3.0 + 0.01 * PACE_BOUNDS.1)).abs() < 1e-9, "{left}");
        let (k, _) = s.start_next();
        assert_eq!(k, 3);
    }

    #[test]
    fn estimates_read_in_minutes_and_seconds() {
        assert_eq!(about(0.2), "about 1 s");
        assert_eq!(about(42.4), "about 42 s");
        assert_eq!(about(64.0), "about 1 min 0 s");
        assert_eq!(about(226.0), "about 3 min 50 s");
        assert_eq!(about(1560.0), "about 26 min 0 s");
    }
}
