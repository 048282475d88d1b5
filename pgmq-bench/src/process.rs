//! This process's resource use: peak resident memory per run, and CPU time.
//!
//! Peak RSS: Linux keeps the high-water mark in `VmHWM` of
//! `/proc/self/status`; writing `5` to `/proc/self/clear_refs` resets it to
//! the current RSS, which gives an exact per-run peak. Where that write is not
//! permitted, a task samples `VmRSS` every 100 ms and keeps the largest value
//! (a short spike between samples can be missed). The method used is recorded
//! in the document.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::resource::{getrusage, UsageWho};

/// How per-run peaks are measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryMethod {
    /// VmHWM reset through /proc/self/clear_refs before each run.
    HwmReset,
    /// Largest VmRSS sampled every 100 ms.
    Sampled,
}

impl MemoryMethod {
    /// The name recorded in the document.
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryMethod::HwmReset => "vmhwm_reset",
            MemoryMethod::Sampled => "rss_sampled_100ms",
        }
    }
}

/// A `kB` line of /proc/self/status, in bytes.
pub fn status_kb(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_status_kb(&text, field)
}

fn parse_status_kb(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb * 1024)
    })
}

/// Current resident set size, bytes.
pub fn current_rss() -> Option<u64> {
    status_kb("VmRSS")
}

/// Peak resident set size since start or the last reset, bytes.
pub fn peak_rss() -> Option<u64> {
    status_kb("VmHWM")
}

fn reset_hwm() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Measures the peak RSS of successive runs.
#[derive(Debug)]
pub struct MemoryMeter {
    method: MemoryMethod,
    sampled_max: Arc<AtomicU64>,
    sampler_on: Arc<AtomicBool>,
    overall: AtomicU64,
}

impl MemoryMeter {
    /// Picks the method (tries a reset) and, when sampling, starts the sampler
    /// task on the current runtime.
    pub fn start() -> MemoryMeter {
        let start_peak = peak_rss().unwrap_or(0);
        let method = if reset_hwm() {
            MemoryMethod::HwmReset
        } else {
            MemoryMethod::Sampled
        };
        let meter = MemoryMeter {
            method,
            sampled_max: Arc::new(AtomicU64::new(0)),
            sampler_on: Arc::new(AtomicBool::new(true)),
            overall: AtomicU64::new(start_peak),
        };
        if method == MemoryMethod::Sampled {
            let max = meter.sampled_max.clone();
            let on = meter.sampler_on.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                while on.load(Ordering::Relaxed) {
                    tick.tick().await;
                    if let Some(rss) = current_rss() {
                        max.fetch_max(rss, Ordering::Relaxed);
                    }
                }
            });
        }
        meter
    }

    /// The method in use.
    pub fn method(&self) -> MemoryMethod {
        self.method
    }

    /// Starts a run: resets the high-water mark (or the sampled maximum).
    pub fn begin(&self) {
        match self.method {
            MemoryMethod::HwmReset => {
                if !reset_hwm() {
                    tracing::debug!("clear_refs reset failed mid-run");
                }
            }
            MemoryMethod::Sampled => {
                self.sampled_max
                    .store(current_rss().unwrap_or(0), Ordering::Relaxed);
            }
        }
    }

    /// Ends a run: its peak RSS, bytes.
    pub fn end(&self) -> u64 {
        let peak = match self.method {
            MemoryMethod::HwmReset => peak_rss().unwrap_or(0),
            MemoryMethod::Sampled => {
                let now = current_rss().unwrap_or(0);
                self.sampled_max.fetch_max(now, Ordering::Relaxed).max(now)
            }
        };
        self.overall.fetch_max(peak, Ordering::Relaxed);
        peak
    }

    /// Largest peak seen (start-up included), bytes.
    pub fn overall(&self) -> u64 {
        let now = match self.method {
            MemoryMethod::HwmReset => peak_rss().unwrap_or(0),
            MemoryMethod::Sampled => self.sampled_max.load(Ordering::Relaxed),
        };
        self.overall.load(Ordering::Relaxed).max(now)
    }
}

impl Drop for MemoryMeter {
    fn drop(&mut self) {
        self.sampler_on.store(false, Ordering::Relaxed);
    }
}

/// User plus system CPU time of the whole process (all threads) so far.
pub fn cpu_time() -> Duration {
    usage(UsageWho::RUSAGE_SELF)
}

/// User plus system CPU time of this process's children that ended and
/// were waited for, so far (the worker processes of a run, once reaped).
pub fn children_cpu_time() -> Duration {
    usage(UsageWho::RUSAGE_CHILDREN)
}

fn usage(who: UsageWho) -> Duration {
    match getrusage(who) {
        Ok(u) => {
            let tv = |t: nix::sys::time::TimeVal| {
                Duration::from_secs(t.tv_sec().max(0) as u64)
                    + Duration::from_micros(t.tv_usec().max(0) as u64)
            };
            tv(u.user_time()) + tv(u.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_lines() {
        let text = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(parse_status_kb(text, "VmHWM"), Some(2 * 1024 * 1024));
        assert_eq!(parse_status_kb(text, "VmRSS"), Some(1024 * 1024));
        assert_eq!(parse_status_kb(text, "VmSwap"), None);
    }

    #[test]
    fn reads_own_memory_and_cpu() {
        assert!(current_rss().unwrap() > 0);
        assert!(peak_rss().unwrap() >= current_rss().unwrap() / 2);
        let before = cpu_time();
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(cpu_time() >= before);
    }
}
