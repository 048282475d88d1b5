//! `--local`: a throwaway PostgreSQL + PGMQ cluster started with the
//! repository's `scripts/db-start.sh` on its own port (55436 by default, so
//! the development cluster on 55432 is never touched), and removed with
//! `scripts/db-stop.sh` when the benchmark ends.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use crate::error::{Error, Result};
use crate::target::Target;

/// The default `--local-port`.
pub const DEFAULT_PORT: u16 = 55436;

/// The port of the shared development cluster, which `--local` never uses.
pub const SHARED_PORT: u16 = 55432;

/// A running throwaway cluster; [`LocalDb::stop`] removes it.
#[derive(Debug)]
pub struct LocalDb {
    scripts: PathBuf,
    port: u16,
    target: Target,
}

/// Where the db-*.sh scripts are: `PGMQ_BENCH_SCRIPTS`, then this source
/// tree's `scripts/`, then `./scripts`.
pub fn scripts_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PGMQ_BENCH_SCRIPTS") {
        return PathBuf::from(dir);
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts");
    if built.join("db-start.sh").exists() {
        return built;
    }
    PathBuf::from("scripts")
}

async fn script(
    scripts: &Path,
    name: &str,
    port: u16,
    args: &[&str],
) -> Result<std::process::Output> {
    let path = scripts.join(name);
    let io_err = |e| Error::io(format!("running {}", path.display()), e);
    // stdout (db-start.sh's DSN) is captured; stderr goes to ours, so that
    // why a script failed is in the output. `Command::output` would capture
    // both, whatever `stderr` was set to, and the reason would be lost.
    let child = Command::new("bash")
        .arg(&path)
        .args(args)
        .env("PGMQ_DB_PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(io_err)?;
    child.wait_with_output().await.map_err(io_err)
}

impl LocalDb {
    /// Starts a cluster on `port` and returns its DSN. Refuses the shared
    /// port and a port whose cluster is already running (it would be removed
    /// afterwards).
    pub async fn start(port: u16) -> Result<LocalDb> {
        if port == SHARED_PORT {
            return Err(Error::Refused(format!(
                "--local-port {SHARED_PORT} is the shared development cluster; --local removes its cluster afterwards"
            )));
        }
        let scripts = scripts_dir();
        if !scripts.join("db-start.sh").exists() {
            return Err(Error::Local(format!(
                "{} not found; run from the repository root or set PGMQ_BENCH_SCRIPTS",
                scripts.join("db-start.sh").display()
            )));
        }
        let status = script(&scripts, "db-ctl.sh", port, &["status"]).await?;
        if status.status.success() {
            return Err(Error::Refused(format!(
                "a cluster is already running on port {port}; --local starts its own and removes it \
                 afterwards. Stop that one (PGMQ_DB_PORT={port} bash scripts/db-stop.sh) or pick \
                 another --local-port"
            )));
        }
        let out = script(&scripts, "db-start.sh", port, &[]).await?;
        if !out.status.success() {
            // Remove whatever half-started.
            let _ = script(&scripts, "db-stop.sh", port, &[]).await;
            return Err(Error::Local(format!(
                "db-start.sh failed on port {port} ({})",
                out.status
            )));
        }
        let dsn = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim()
            .to_owned();
        if dsn.is_empty() {
            return Err(Error::Local("db-start.sh printed no DSN".into()));
        }
        let target = match Target::resolve(&dsn) {
            Ok(t) => t,
            Err(e) => {
                let _ = script(&scripts, "db-stop.sh", port, &[]).await;
                return Err(e);
            }
        };
        Ok(LocalDb {
            scripts,
            port,
            target,
        })
    }

    /// The cluster's database (its DSN holds the generated password).
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Stops the cluster and removes its folder.
    pub async fn stop(self) -> Result<()> {
        let out = script(&self.scripts, "db-stop.sh", self.port, &[]).await?;
        if out.status.success() {
            Ok(())
        } else {
            Err(Error::Local(format!(
                "db-stop.sh failed on port {}",
                self.port
            )))
        }
    }
}
