//! The validated settings of one benchmark run.

use std::path::PathBuf;
use std::time::Duration;

use crate::cli::{RunArgs, Section};
use crate::error::{Error, Result};

/// The fewest wake-up samples per mode.
pub const MIN_WAKEUP_SAMPLES: u32 = 20;

/// The run's settings, checked.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Sections, in round order, without repeats.
    pub sections: Vec<Section>,
    /// Messages per consume run.
    pub messages: u64,
    /// Messages per batch-send run.
    pub batch_messages: u64,
    /// Messages per single-send run.
    pub single_messages: u64,
    /// Batch size of sends and claims.
    pub batch_size: u32,
    /// Visibility timeout.
    pub vt: Duration,
    /// JSON body size, bytes.
    pub payload_bytes: u32,
    /// consume_scaling handler counts.
    pub workers: Vec<u32>,
    /// Simulated handler work.
    pub handler_work: Duration,
    /// Measured rounds.
    pub repeat: u32,
    /// Discarded rounds.
    pub warmup: u32,
    /// SDK pool size.
    pub pool_size: u32,
    /// idle_worker window.
    pub idle: Duration,
    /// idle_worker poll interval.
    pub idle_poll: Duration,
    /// Wake-up samples per mode.
    pub wakeup_samples: u32,
    /// Wake-up poll interval / fallback.
    pub wakeup_poll: Duration,
    /// sustained producer window.
    pub duration: Duration,
    /// sustained start left out of the fit.
    pub sustained_warmup: Duration,
    /// sustained target rate (None: unpaced).
    pub rate: Option<f64>,
    /// sustained producer tasks.
    pub producers: u32,
    /// sustained handler concurrency.
    pub sustained_workers: u32,
    /// Unlogged queues.
    pub unlogged: bool,
    /// Drop leftovers first.
    pub clean: bool,
    /// No-progress limit.
    pub stall_timeout: Duration,
    /// Output path.
    pub output: PathBuf,
}

fn bad(msg: impl Into<String>) -> Error {
    Error::Config(msg.into())
}

impl Config {
    /// Checks `args`.
    pub fn from_args(a: &RunArgs) -> Result<Config> {
        if a.repeat == 0 {
            return Err(bad("--repeat must be at least 1"));
        }
        if a.messages == 0 || a.batch_messages == 0 || a.single_messages == 0 {
            return Err(bad(
                "--messages, --batch-messages and --single-messages must be at least 1",
            ));
        }
        if !(1..=10_000).contains(&a.batch_size) {
            return Err(bad("--batch-size must be between 1 and 10000"));
        }
        if a.visibility_timeout == 0 {
            return Err(bad("--vt must be at least 1 second"));
        }
        if a.workers.is_empty() || a.workers.iter().any(|w| !(1..=1024).contains(w)) {
            return Err(bad("--workers takes handler counts between 1 and 1024"));
        }
        if a.wakeup_samples < MIN_WAKEUP_SAMPLES {
            return Err(bad(format!(
                "--wakeup-samples must be at least {MIN_WAKEUP_SAMPLES}"
            )));
        }
        if a.idle_poll_ms == 0 || a.wakeup_poll_ms == 0 {
            return Err(bad("poll intervals must be at least 1 ms"));
        }
        if a.duration.is_zero() || a.sustained_warmup >= a.duration {
            return Err(bad(
                "--duration must be longer than --sustained-warmup (and not zero)",
            ));
        }
        if !(a.rate.is_finite() && a.rate >= 0.0) {
            return Err(bad("--rate must be 0 (unpaced) or a positive rate"));
        }
        if a.producers == 0 || a.sustained_workers == 0 {
            return Err(bad(
                "--producers and --sustained-workers must be at least 1",
            ));
        }
        if a.pool_size < 2 {
            return Err(bad("--pool-size must be at least 2"));
        }
        if a.idle.is_zero() {
            return Err(bad("--idle must be longer than zero"));
        }
        let mut sections: Vec<Section> = Section::ALL
            .iter()
            .copied()
            .filter(|s| a.sections.contains(s))
            .collect();
        sections.dedup();
        let mut workers = a.workers.clone();
        workers.dedup();
        Ok(Config {
            sections,
            messages: a.messages,
            batch_messages: a.batch_messages,
            single_messages: a.single_messages,
            batch_size: a.batch_size,
            vt: Duration::from_secs(u64::from(a.visibility_timeout)),
            payload_bytes: a.payload_bytes,
            workers,
            handler_work: Duration::from_millis(a.handler_work_ms),
            repeat: a.repeat,
            warmup: a.warmup,
            pool_size: a.pool_size,
            idle: a.idle,
            idle_poll: Duration::from_millis(a.idle_poll_ms),
            wakeup_samples: a.wakeup_samples,
            wakeup_poll: Duration::from_millis(a.wakeup_poll_ms),
            duration: a.duration,
            sustained_warmup: a.sustained_warmup,
            rate: (a.rate > 0.0).then_some(a.rate),
            producers: a.producers,
            sustained_workers: a.sustained_workers,
            unlogged: a.unlogged,
            clean: a.clean,
            stall_timeout: a.stall_timeout,
            output: a.output.clone(),
        })
    }

    /// Whether `s` runs.
    pub fn has(&self, s: Section) -> bool {
        self.sections.contains(&s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(extra: &[&str]) -> RunArgs {
        let mut v = vec!["pgmq-bench"];
        v.extend_from_slice(extra);
        crate::cli::Cli::try_parse_from(v).unwrap().run
    }

    #[test]
    fn defaults_are_valid_and_ordered() {
        let c =
            Config::from_args(&args(&["--sections", "sustained,send_single,send_single"])).unwrap();
        assert_eq!(c.sections, vec![Section::SendSingle, Section::Sustained]);
        assert_eq!(c.rate, Some(5000.0));
        assert!(Config::from_args(&args(&[])).is_ok());
    }

    #[test]
    fn refusals() {
        for bad_args in [
            &["--repeat", "0"][..],
            &["--wakeup-samples", "5"],
            &["--workers", "0"],
            &["--duration", "2s", "--sustained-warmup", "5s"],
            &["--batch-size", "0"],
            &["--rate=-1"],
        ] {
            assert!(Config::from_args(&args(bad_args)).is_err(), "{bad_args:?}");
        }
        assert_eq!(
            Config::from_args(&args(&["--rate", "0"])).unwrap().rate,
            None
        );
    }
}
