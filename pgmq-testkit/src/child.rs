//! The one protocol between a harness (the benchmark, the fault suite) and
//! the worker processes it starts from its own binary.
//!
//! The parent starts `exe <subcommand> <spec>`, where `<spec>` is the
//! child's settings serialized as one JSON argument. Secrets never go
//! there: the DSNs go in environment variables the caller names, so that
//! they stay out of `ps`.
//!
//! The child talks on stdout, one line each, a kind and for some kinds a
//! JSON value after a space:
//!
//! - `ready <pid>`: it connected and built its worker;
//! - `stats <json>` (optional, periodic): its counters so far;
//! - `draining`: a first SIGTERM started a graceful shutdown;
//! - `forced`: a second SIGTERM escalated that shutdown;
//! - `report <json>`: its final report, just before it exits.
//!
//! The parent may say `go` on the child's stdin (when it started the child
//! [`with_go`](Spawn::with_go)): the child waits for it after `ready`, so
//! that several children start their clocks together. Anything else on
//! stdin, or stdin closed, tells the child to give up.
//!
//! [`Child`] is the parent's side; [`say`], [`say_json`], [`say_ready`],
//! [`wait_for_go`] and [`spec_from_arg`] are the child's.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::BoxError;

/// How long a child may take from its start to `ready`.
pub const READY_LIMIT: Duration = Duration::from_secs(60);

/// How long the parent waits, after the child exited, for the rest of its
/// stdout (the last lines may still be in the pipe).
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// The kinds of line a child writes on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// Connected and built; followed by the child's pid.
    Ready,
    /// Its counters so far (JSON).
    Stats,
    /// A graceful shutdown started.
    Draining,
    /// The shutdown was escalated.
    Forced,
    /// The final report (JSON).
    Report,
}

impl Line {
    /// The word that starts the line.
    pub fn word(self) -> &'static str {
        match self {
            Line::Ready => "ready",
            Line::Stats => "stats",
            Line::Draining => "draining",
            Line::Forced => "forced",
            Line::Report => "report",
        }
    }
}

/// What a child said on stdout so far: `S` is its `stats` value, `R` its
/// `report`.
#[derive(Debug, Clone)]
pub struct Said<S, R> {
    /// It said `ready`.
    pub ready: bool,
    /// It said `draining`.
    pub draining: bool,
    /// It said `forced`.
    pub forced: bool,
    /// The last `stats` line.
    pub stats: Option<S>,
    /// The `report` line.
    pub report: Option<R>,
    /// The first line that was not one of the protocol's, or whose JSON did
    /// not parse, with why.
    pub garbled: Option<String>,
}

impl<S, R> Default for Said<S, R> {
    fn default() -> Self {
        Said {
            ready: false,
            draining: false,
            forced: false,
            stats: None,
            report: None,
            garbled: None,
        }
    }
}

impl<S: DeserializeOwned, R: DeserializeOwned> Said<S, R> {
    /// Takes in one line of the child's stdout.
    fn hear(&mut self, line: &str) {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let bad = match word {
            "ready" => {
                self.ready = true;
                None
            }
            "draining" => {
                self.draining = true;
                None
            }
            "forced" => {
                self.forced = true;
                None
            }
            "stats" => match serde_json::from_str(rest) {
                Ok(s) => {
                    self.stats = Some(s);
                    None
                }
                Err(e) => Some(e.to_string()),
            },
            "report" => match serde_json::from_str(rest) {
                Ok(r) => {
                    self.report = Some(r);
                    None
                }
                Err(e) => Some(e.to_string()),
            },
            _ => Some("not a line of the protocol".to_owned()),
        };
        if let (Some(why), None) = (bad, &self.garbled) {
            self.garbled = Some(format!("{line:?}: {why}"));
        }
    }
}

impl<R> Said<serde_json::Value, R> {
    /// A counter of the last `stats` line (0 before the first).
    pub fn stat(&self, name: &str) -> u64 {
        self.stats
            .as_ref()
            .and_then(|s| s[name].as_u64())
            .unwrap_or(0)
    }
}

/// How a child ended.
#[derive(Debug, Clone)]
pub struct Exit<S, R> {
    /// Its exit status.
    pub status: ExitStatus,
    /// Everything it said.
    pub said: Said<S, R>,
    /// From the call that waited (or signalled) to the exit.
    pub took: Duration,
}

impl<S, R> Exit<S, R> {
    /// Exited 0 after writing its report.
    pub fn clean(&self) -> bool {
        self.status.success() && self.said.report.is_some()
    }

    /// The status and how long the exit took, for a message.
    pub fn describe(&self) -> String {
        format!("{} after {} ms", self.status, self.took.as_millis())
    }
}

/// Where a child's stderr goes.
#[derive(Debug, Clone)]
pub enum Stderr {
    /// The parent's own stderr.
    Inherit,
    /// A log file (created, or truncated).
    File(PathBuf),
}

/// How to start a child: its binary, subcommand, spec and environment.
#[derive(Debug)]
pub struct Spawn {
    cmd: Command,
    name: String,
    stderr: Stderr,
    go: bool,
}

impl Spawn {
    /// `exe subcommand <spec as JSON>`, named `name` in errors, its stderr
    /// inherited, stdin closed.
    pub fn new<T: Serialize>(
        exe: impl AsRef<std::ffi::OsStr>,
        subcommand: &str,
        spec: &T,
        name: &str,
    ) -> Result<Spawn, BoxError> {
        let mut cmd = Command::new(exe);
        cmd.arg(subcommand).arg(serde_json::to_string(spec)?);
        Ok(Spawn {
            cmd,
            name: name.to_owned(),
            stderr: Stderr::Inherit,
            go: false,
        })
    }

    /// Sets an environment variable of the child (a DSN, say).
    pub fn env(mut self, key: &str, value: &str) -> Spawn {
        self.cmd.env(key, value);
        self
    }

    /// Removes an environment variable the child would inherit.
    pub fn env_remove(mut self, key: &str) -> Spawn {
        self.cmd.env_remove(key);
        self
    }

    /// Where the child's stderr goes.
    pub fn stderr(mut self, to: Stderr) -> Spawn {
        self.stderr = to;
        self
    }

    /// Keeps the child's stdin open for [`Child::go`].
    pub fn with_go(mut self) -> Spawn {
        self.go = true;
        self
    }

    /// Starts the child and waits, up to [`READY_LIMIT`], until it says
    /// `ready`; a child that does not is killed, and the error names where
    /// its stderr went.
    pub async fn start<S, R>(self) -> Result<Child<S, R>, BoxError>
    where
        S: DeserializeOwned + Send + Sync + 'static,
        R: DeserializeOwned + Send + Sync + 'static,
    {
        let Spawn {
            mut cmd,
            name,
            stderr,
            go,
        } = self;
        let err_to = match &stderr {
            Stderr::Inherit => {
                cmd.stderr(Stdio::inherit());
                "its stderr".to_owned()
            }
            Stderr::File(path) => {
                let log = tokio::fs::File::create(path).await?.into_std().await;
                cmd.stderr(Stdio::from(log));
                path.display().to_string()
            }
        };
        cmd.stdin(if go { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let pid = child.id().ok_or("the child exited at once")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let stdin = child.stdin.take();
        let (tx, said) = watch::channel(Said::default());
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tx.send_modify(|s| s.hear(&line));
            }
        });
        let mut child = Child {
            child,
            pid,
            stdin,
            said,
            reader: Some(reader),
            name,
        };
        let ready = matches!(
            tokio::time::timeout(READY_LIMIT, child.said.wait_for(|s| s.ready)).await,
            Ok(Ok(_))
        );
        if !ready {
            let _ = child.child.start_kill();
            let _ = child.child.wait().await;
            return Err(format!("{} did not become ready (see {err_to})", child.name).into());
        }
        Ok(child)
    }
}

/// A running child, as its parent sees it: killed when dropped.
#[derive(Debug)]
pub struct Child<S, R> {
    child: tokio::process::Child,
    pid: u32,
    stdin: Option<ChildStdin>,
    said: watch::Receiver<Said<S, R>>,
    reader: Option<JoinHandle<()>>,
    /// The name errors give it.
    pub name: String,
}

impl<S: Clone, R: Clone> Child<S, R> {
    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process is still running (it did not exit or crash).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Says `go` (the child was started [`with_go`](Spawn::with_go)).
    pub async fn go(&mut self) -> Result<(), BoxError> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| format!("{} was started without a stdin to say go on", self.name))?;
        stdin.write_all(b"go\n").await?;
        stdin.flush().await.ok();
        Ok(())
    }

    /// Sends SIGTERM.
    pub async fn sigterm(&self) -> Result<(), BoxError> {
        self.signal("TERM").await
    }

    /// SIGSTOP: the process is frozen (as a paused VM or container would be)
    /// until [`sigcont`](Self::sigcont).
    pub async fn sigstop(&self) -> Result<(), BoxError> {
        self.signal("STOP").await
    }

    /// SIGCONT: a frozen process runs again.
    pub async fn sigcont(&self) -> Result<(), BoxError> {
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

    /// What the child said so far.
    pub fn said(&self) -> Said<S, R> {
        self.said.borrow().clone()
    }

    /// Waits, up to `limit`, until the child said `draining`.
    pub async fn wait_draining(&mut self, limit: Duration) -> bool {
        matches!(
            tokio::time::timeout(limit, self.said.wait_for(|s| s.draining)).await,
            Ok(Ok(_))
        )
    }

    /// SIGKILLs the child and reaps it.
    pub async fn sigkill(mut self) -> Result<Exit<S, R>, BoxError> {
        let t = Instant::now();
        self.child.start_kill()?;
        let status = self.child.wait().await?;
        Ok(self.exit(status, t.elapsed()).await)
    }

    /// Waits for the exit however long it takes (the child bounds its own
    /// run).
    pub async fn wait_exit(mut self) -> Result<Exit<S, R>, BoxError> {
        let t = Instant::now();
        self.stdin = None;
        let status = self.child.wait().await?;
        Ok(self.exit(status, t.elapsed()).await)
    }

    /// Waits for the exit; SIGKILLs after `limit`, and that is an error.
    pub async fn wait(mut self, limit: Duration) -> Result<Exit<S, R>, BoxError> {
        let t = Instant::now();
        self.stdin = None;
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                Ok(self.exit(status, t.elapsed()).await)
            }
            Err(_) => {
                self.child.start_kill()?;
                let _ = self.child.wait().await;
                Err(format!(
                    "{} did not exit within {} s; killed",
                    self.name,
                    limit.as_secs()
                )
                .into())
            }
        }
    }

    /// SIGTERM, then [`wait`](Self::wait) for the exit.
    pub async fn stop(self, limit: Duration) -> Result<Exit<S, R>, BoxError> {
        let t = Instant::now();
        self.sigterm().await?;
        let mut e = self.wait(limit).await?;
        e.took = t.elapsed();
        Ok(e)
    }

    async fn exit(&mut self, status: ExitStatus, took: Duration) -> Exit<S, R> {
        // The reader may still be parsing the last lines: let it reach EOF.
        if let Some(reader) = self.reader.take() {
            let _ = tokio::time::timeout(DRAIN_LIMIT, reader).await;
        }
        let said = self.said.borrow().clone();
        Exit { status, said, took }
    }
}

/// The child's side: parses its spec, the one JSON argument after the
/// subcommand.
pub fn spec_from_arg<T: DeserializeOwned>(arg: &str) -> Result<T, BoxError> {
    serde_json::from_str(arg).map_err(|e| format!("the child's spec: {e}").into())
}

/// The child's side: writes one line to the parent and flushes it.
pub fn say(line: Line) {
    write_line(line.word());
}

/// The child's side: writes `ready <pid>`.
pub fn say_ready() {
    write_line(&format!("{} {}", Line::Ready.word(), std::process::id()));
}

/// The child's side: writes a line with its JSON value (`stats`, `report`).
pub fn say_json<T: Serialize>(line: Line, value: &T) -> Result<(), BoxError> {
    let json = serde_json::to_string(value)?;
    write_line(&format!("{} {json}", line.word()));
    Ok(())
}

fn write_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The child's side: waits for the parent's `go` on stdin; false on any
/// other line, or when stdin closed (the parent ended).
pub async fn wait_for_go() -> Result<bool, BoxError> {
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::stdin().lock(), &mut line).map(|_| line)
    })
    .await??;
    Ok(line.trim() == "go")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_heard() {
        let mut s: Said<serde_json::Value, serde_json::Value> = Said::default();
        s.hear("ready 42");
        s.hear("stats {\"deleted\":3}");
        s.hear("draining");
        assert!(s.ready && s.draining && !s.forced);
        assert_eq!(s.stat("deleted"), 3);
        assert!(s.garbled.is_none());
        s.hear("report {\"immediate\":false}");
        s.hear("something else");
        s.hear("report {");
        assert_eq!(s.report, Some(serde_json::json!({"immediate": false})));
        assert!(s.garbled.as_deref().unwrap().contains("something else"));
    }

    #[test]
    fn a_typed_report_that_does_not_parse_is_garbled() {
        let mut s: Said<(), u64> = Said::default();
        s.hear("report \"many\"");
        assert!(s.report.is_none());
        assert!(s.garbled.as_deref().unwrap().starts_with("\"report"));
    }
}
