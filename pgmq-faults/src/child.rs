//! A worker process as the suite sees it: spawn, wait until ready, signal,
//! wait for its exit.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::worker::{WorkerArgs, FORCED_EXIT};
use super::BoxError;

/// What the worker said on stdout.
#[derive(Debug, Default, Clone)]
pub(crate) struct Said {
    pub ready: bool,
    pub draining: bool,
    pub forced: bool,
    pub report: Option<serde_json::Value>,
    /// The last `stats` line: the worker's counters.
    pub stats: Option<serde_json::Value>,
}

impl Said {
    /// A counter of the last `stats` line (0 before the first).
    pub(crate) fn stat(&self, name: &str) -> u64 {
        self.stats
            .as_ref()
            .and_then(|s| s[name].as_u64())
            .unwrap_or(0)
    }
}

/// A running worker process.
pub(crate) struct WorkerProc {
    child: Child,
    pid: u32,
    said: watch::Receiver<Said>,
    reader: Option<JoinHandle<()>>,
    pub name: String,
}

/// How a worker process ended.
#[derive(Debug, Clone)]
pub(crate) struct Exit {
    pub status: ExitStatus,
    pub said: Said,
    /// From the call that waited (or signalled) to the exit.
    pub took: Duration,
}

impl Exit {
    pub(crate) fn clean(&self) -> bool {
        self.status.success() && self.said.report.is_some()
    }

    /// Exited with the escalated shutdown's code after a second SIGTERM, and
    /// its report says the SDK's shutdown was immediate.
    pub(crate) fn forced(&self) -> bool {
        self.status.code() == Some(i32::from(FORCED_EXIT))
            && self.said.forced
            && self
                .said
                .report
                .as_ref()
                .is_some_and(|r| r["immediate"] == true)
    }

    pub(crate) fn describe(&self) -> String {
        format!("{} after {} ms", self.status, self.took.as_millis())
    }
}

impl WorkerProc {
    /// Starts `current_exe worker <args>` with `dsn` in its environment,
    /// its stderr in `log_dir/<name>.log`, and waits until it says `ready`.
    pub(crate) async fn spawn(
        log_dir: &Path,
        name: &str,
        dsn: &str,
        ledger_dsn: Option<&str>,
        args: &WorkerArgs,
    ) -> Result<WorkerProc, BoxError> {
        let exe = std::env::current_exe()?;
        let log_path = log_dir.join(format!("{name}.log"));
        let log = tokio::fs::File::create(&log_path).await?.into_std().await;
        let mut cmd = Command::new(exe);
        cmd.arg("worker")
            .args(args.to_argv())
            .env("PGMQ_FAULT_DSN", dsn)
            .env_remove("PGMQ_FAULT_LEDGER_DSN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        if let Some(l) = ledger_dsn {
            cmd.env("PGMQ_FAULT_LEDGER_DSN", l);
        }
        let mut child = cmd.spawn()?;
        let pid = child.id().ok_or("the worker exited at once")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, said) = watch::channel(Said::default());
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tx.send_modify(|s| {
                    if line.starts_with("ready") {
                        s.ready = true;
                    } else if line == "draining" {
                        s.draining = true;
                    } else if line == "forced" {
                        s.forced = true;
                    } else if let Some(json) = line.strip_prefix("report ") {
                        s.report = serde_json::from_str(json).ok();
                    } else if let Some(json) = line.strip_prefix("stats ") {
                        s.stats = serde_json::from_str(json).ok();
                    }
                });
            }
        });
        let mut proc = WorkerProc {
            child,
            pid,
            said,
            reader: Some(reader),
            name: name.to_owned(),
        };
        let ready = matches!(
            tokio::time::timeout(Duration::from_secs(60), proc.said.wait_for(|s| s.ready)).await,
            Ok(Ok(_))
        );
        if !ready {
            let _ = proc.child.start_kill();
            let _ = proc.child.wait().await;
            return Err(format!(
                "worker {name} did not become ready (see {})",
                log_path.display()
            )
            .into());
        }
        Ok(proc)
    }

    /// The OS process id.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process is still running (it did not exit or crash).
    pub(crate) fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends SIGTERM.
    pub(crate) async fn sigterm(&self) -> Result<(), BoxError> {
        self.signal("TERM").await
    }

    /// SIGSTOP: the process is frozen (as a paused VM or container would be)
    /// until [`sigcont`](Self::sigcont).
    pub(crate) async fn sigstop(&self) -> Result<(), BoxError> {
        self.signal("STOP").await
    }

    /// SIGCONT: a frozen process runs again.
    pub(crate) async fn sigcont(&self) -> Result<(), BoxError> {
        self.signal("CONT").await
    }

    async fn signal(&self, name: &str) -> Result<(), BoxError> {
        let st = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid.to_string())
            .status()
            .await?;
        if !st.success() {
            return Err(format!("kill -{name} {} failed", self.pid).into());
        }
        Ok(())
    }

    /// What the worker said so far (the last `stats` line among it).
    pub(crate) fn said(&self) -> Said {
        self.said.borrow().clone()
    }

    /// Waits until the worker printed `draining` (it saw the SIGTERM).
    pub(crate) async fn wait_draining(&mut self, limit: Duration) -> bool {
        matches!(
            tokio::time::timeout(limit, self.said.wait_for(|s| s.draining)).await,
            Ok(Ok(_))
        )
    }

    /// SIGKILLs the worker and reaps it.
    pub(crate) async fn sigkill(mut self) -> Result<Exit, BoxError> {
        let t = Instant::now();
        self.child.start_kill()?;
        let status = self.child.wait().await?;
        Ok(self.exit(status, t.elapsed()).await)
    }

    /// Waits for the exit; SIGKILLs after `limit`.
    pub(crate) async fn wait(mut self, limit: Duration) -> Result<Exit, BoxError> {
        let t = Instant::now();
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                Ok(self.exit(status, t.elapsed()).await)
            }
            Err(_) => {
                self.child.start_kill()?;
                let _ = self.child.wait().await;
                Err(format!(
                    "worker {} did not exit within {} s; killed",
                    self.name,
                    limit.as_secs()
                )
                .into())
            }
        }
    }

    /// SIGTERM, then wait for the exit.
    pub(crate) async fn stop(self, limit: Duration) -> Result<Exit, BoxError> {
        let t = Instant::now();
        self.sigterm().await?;
        let mut e = self.wait(limit).await?;
        e.took = t.elapsed();
        Ok(e)
    }

    async fn exit(&mut self, status: ExitStatus, took: Duration) -> Exit {
        // The reader may still be parsing the last lines: let it reach EOF.
        if let Some(reader) = self.reader.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        }
        let said = self.said.borrow().clone();
        Exit { status, said, took }
    }
}
