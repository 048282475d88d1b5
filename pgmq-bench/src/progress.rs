//! Progress lines on stderr, only when stderr is a terminal.

use std::io::IsTerminal;
use std::time::Instant;

/// Writes progress to stderr when it is a terminal; quiet otherwise (CI logs,
/// redirected output).
#[derive(Debug, Clone)]
pub struct Progress {
    enabled: bool,
    start: Instant,
}

impl Progress {
    /// Enabled when stderr is a terminal.
    pub fn new() -> Progress {
        Progress {
            enabled: std::io::stderr().is_terminal(),
            start: Instant::now(),
        }
    }

    /// Prints one line with the seconds since start.
    pub fn say(&self, line: impl AsRef<str>) {
        if self.enabled {
            eprintln!(
                "[{:>6.1}s] {}",
                self.start.elapsed().as_secs_f64(),
                line.as_ref()
            );
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}
