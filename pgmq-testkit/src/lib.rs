//! What the benchmark (pgmq-bench) and the fault suite (pgmq-faults) share;
//! not published.
//!
//! - [`cluster`]: a throwaway PostgreSQL + PGMQ cluster on a port of its
//!   own, driven through the workspace's `scripts/db-*.sh` (the fault
//!   suite's cluster, and the benchmark's `--local`);
//! - [`child`]: the one protocol between a harness and the worker
//!   processes it starts from its own binary (a JSON spec, `ready`, `go`,
//!   `stats`, `report` lines), both sides;
//! - [`proxy`]: a TCP proxy that cuts, refuses, blackholes or delays
//!   connections on demand (the fault suite's network faults);
//! - [`spec`]: one serializable description of a worker (its handler's
//!   kind and every builder setting), which the harnesses put in their
//!   children's specs;
//! - [`environment`]: what both record about where a run happened (the SDK
//!   build, the compiler and profile, the server and its durability), the
//!   same JSON in the benchmark.v1 document and in the fault report;
//! - [`modgraph`]: the import graph of a crate's modules, read from its
//!   `src/`, for every crate's `tests/module_graph.rs`;
//! - [`parse_duration`]: the `30s`, `5m` of their command lines.

pub mod child;
pub mod cluster;
pub mod environment;
pub mod modgraph;
pub mod proxy;
pub mod spec;

use std::time::Duration;

/// The error type of the cluster's and the fault suite's harness: any
/// failure of the harness itself.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Parses `30`, `30s`, `500ms`, `5m`, `1h` into a duration.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(pgmq_testkit::parse_duration("1.5m"), Ok(Duration::from_secs(90)));
/// assert!(pgmq_testkit::parse_duration("5 parsecs").is_err());
/// ```
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => (&s[..i], s[i..].trim()),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (try 30s, 5m, 1h)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" | "" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("unknown unit {unit:?} in {s:?} (ms, s, m, h)")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{s:?} is not a duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }
}
