//! A worker process as the suite sees it: pgmq-testkit's child protocol
//! ([`pgmq_testkit::child`]) with the fault worker's spec, its counters and
//! its shutdown report as JSON values.

use std::path::Path;

use pgmq_testkit::child::{Spawn, Stderr};

use super::worker::{FaultSpec, DSN_ENV, FORCED_EXIT, LEDGER_DSN_ENV};
use super::BoxError;

/// A running worker process (its `stats` and `report` lines as JSON).
pub(crate) type WorkerProc = pgmq_testkit::child::Child<serde_json::Value, serde_json::Value>;

/// How a worker process ended.
pub(crate) type Exit = pgmq_testkit::child::Exit<serde_json::Value, serde_json::Value>;

/// Starts `current_exe worker <args as JSON>` with `dsn` (and `ledger_dsn`)
/// in its environment, its stderr in `log_dir/<name>.log`, and waits until
/// it says `ready`.
pub(crate) async fn spawn(
    log_dir: &Path,
    name: &str,
    dsn: &str,
    ledger_dsn: Option<&str>,
    args: &FaultSpec,
) -> Result<WorkerProc, BoxError> {
    let exe = std::env::current_exe()?;
    let spawn = Spawn::new(exe, "worker", args, &format!("worker {name}"))?
        .env(DSN_ENV, dsn)
        .env_remove(LEDGER_DSN_ENV)
        .stderr(Stderr::File(log_dir.join(format!("{name}.log"))));
    let spawn = match ledger_dsn {
        Some(l) => spawn.env(LEDGER_DSN_ENV, l),
        None => spawn,
    };
    spawn.start().await
}

/// Exited with the escalated shutdown's code after a second SIGTERM, and
/// its report says the SDK's shutdown was immediate.
pub(crate) fn forced(e: &Exit) -> bool {
    e.status.code() == Some(i32::from(FORCED_EXIT))
        && e.said.forced
        && e.said
            .report
            .as_ref()
            .is_some_and(|r| r["immediate"] == true)
}
