//! What a round of a section is planned to take: the seconds of its fixed
//! windows (timed phases, sleeps, the gaps between samples: the same on
//! any machine) and the seconds of its work at nominal speeds of a 2-core
//! machine (sends, preloads, drains: faster or slower with the machine and
//! its load). The estimate of the time left adds the fixed seconds of the
//! steps left to their work seconds scaled by the pace of the work done
//! so far, so the speeds need only be in proportion to each other.

use crate::config::Config;

/// What one round of a section is planned to take.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Plan {
    /// Seconds of fixed windows.
    pub(crate) fixed_s: f64,
    /// Seconds of work at the nominal speeds.
    pub(crate) work_s: f64,
}

impl Plan {
    /// `s` seconds of fixed windows.
    pub(crate) fn fixed(s: f64) -> Plan {
        Plan {
            fixed_s: s,
            work_s: 0.0,
        }
    }

    /// `s` seconds of work at the nominal speeds.
    pub(crate) fn work(s: f64) -> Plan {
        Plan {
            fixed_s: 0.0,
            work_s: s,
        }
    }

    /// Both, in seconds.
    pub(crate) fn total_s(self) -> f64 {
        self.fixed_s + self.work_s
    }
}

impl std::ops::Add for Plan {
    type Output = Plan;

    fn add(self, other: Plan) -> Plan {
        Plan {
            fixed_s: self.fixed_s + other.fixed_s,
            work_s: self.work_s + other.work_s,
        }
    }
}

impl std::iter::Sum for Plan {
    fn sum<I: Iterator<Item = Plan>>(iter: I) -> Plan {
        iter.fold(Plan::default(), |a, b| a + b)
    }
}

/// Sequential one-message sends a second.
pub(crate) const SINGLE_SENDS: f64 = 1_500.0;
/// Messages a second of sequential batch sends.
pub(crate) const BATCH_SENDS: f64 = 50_000.0;
/// Messages a second a worker drains from a preloaded queue.
pub(crate) const DRAIN: f64 = 40_000.0;
/// Messages a second the one-connection read + delete loop drains.
pub(crate) const LOOP_DRAIN: f64 = 20_000.0;
/// Messages a second a server-side preload writes.
pub(crate) const PRELOAD: f64 = 150_000.0;
/// Seconds of a run besides its messages: a fresh queue, its vacuum,
/// the checks after it, dropping it.
pub(crate) const SETUP: f64 = 0.3;
/// Seconds to start a worker process.
pub(crate) const PROCESS_START: f64 = 1.0;

/// Seconds of a run that preloads `n` messages and drains them at
/// `rate` a second.
pub(crate) fn drain(n: u64, rate: f64) -> f64 {
    SETUP + n as f64 / PRELOAD + n as f64 / rate
}

/// `n` when the baseline section runs (its loops then sit around an
/// SDK section's runs, `n` of them per run), else 0.
pub(crate) fn loops_around(cfg: &Config, n: u32) -> f64 {
    if cfg.has("baseline") {
        f64::from(n)
    } else {
        0.0
    }
}
