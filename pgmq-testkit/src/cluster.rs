//! The suite's own throwaway cluster, driven through the workspace scripts
//! (`scripts/db-start.sh`, `db-ctl.sh`, `db-stop.sh`) with `PGMQ_DB_PORT` set.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::process::Command;

use crate::BoxError;

/// The port of the development cluster other tools use: never touched here.
const SHARED_PORT: u16 = 55432;

/// A cluster on its own port.
#[derive(Debug, Clone)]
pub struct Cluster {
    root: PathBuf,
    port: u16,
    /// The DSN db-start.sh printed, parsed (its password is generated with
    /// the cluster).
    login: Arc<OnceLock<pgmq_client::ConnInfo>>,
}

impl Cluster {
    /// Refuses the shared development cluster's port.
    pub fn new(root: &Path, port: u16) -> Result<Self, BoxError> {
        if port == SHARED_PORT {
            return Err(format!(
                "port {SHARED_PORT} is the shared development cluster; the fault suite kills \
                 its server, so it needs its own port (--port 55433)"
            )
            .into());
        }
        Ok(Cluster {
            root: root.to_owned(),
            port,
            login: Arc::default(),
        })
    }

    /// The DSN of database `pgmq` (PGMQ installed).
    pub fn dsn(&self) -> String {
        self.dsn_for("pgmq")
    }

    /// The DSN of another database of the cluster (`pgmq_none`: no PGMQ).
    pub fn dsn_for(&self, db: &str) -> String {
        self.dsn_at(self.port, db)
    }

    /// The DSN of database `db` on `port` of 127.0.0.1 (the cluster's own,
    /// or a proxy's in front of it), with the cluster's user and password.
    pub fn dsn_at(&self, port: u16, db: &str) -> String {
        let mut info =
            pgmq_client::ConnInfo::parse(&format!("postgres://pgmq@127.0.0.1:{port}/{db}"))
                .expect("a DSN of known parts");
        if let Some(login) = self.login.get() {
            for k in ["user", "password"] {
                if let Some(v) = login.get(k) {
                    info.set(k, v).expect("a libpq keyword");
                }
            }
        }
        info.to_dsn()
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts (or recovers) the cluster; idempotent.
    pub async fn start(&self) -> Result<(), BoxError> {
        let printed = self.script("db-start.sh", &[]).await?;
        // postgres://user:password@127.0.0.1:port/pgmq
        let login = printed
            .lines()
            .last()
            .and_then(|dsn| pgmq_client::ConnInfo::parse(dsn.trim()).ok())
            .ok_or("db-start.sh printed no DSN")?;
        let _ = self.login.set(login);
        Ok(())
    }

    /// `pg_ctl stop -m immediate`: a crash.
    pub async fn kill(&self) -> Result<(), BoxError> {
        self.script("db-ctl.sh", &["kill"]).await.map(drop)
    }

    /// Starts a killed server again (crash recovery runs).
    pub async fn restart_after_kill(&self) -> Result<(), BoxError> {
        self.script("db-ctl.sh", &["start"]).await.map(drop)
    }

    /// Stops the cluster and removes its folder.
    pub async fn remove(&self) -> Result<(), BoxError> {
        self.script("db-stop.sh", &[]).await.map(drop)
    }

    /// Runs a script; returns its stdout (db-start.sh prints the DSN, with
    /// the password: never logged).
    async fn script(&self, name: &str, args: &[&str]) -> Result<String, BoxError> {
        let path = self.root.join("scripts").join(name);
        let started = Instant::now();
        let out = Command::new("bash")
            .arg(&path)
            .args(args)
            .env("PGMQ_DB_PORT", self.port.to_string())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(300), out)
            .await
            .map_err(|_| {
                format!(
                    "{} {} did not finish within 300 s",
                    path.display(),
                    args.join(" ")
                )
            })??;
        if !out.status.success() {
            return Err(format!(
                "{} {} failed ({}): {}",
                path.display(),
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )
            .into());
        }
        tracing::debug!(
            script = name,
            ms = started.elapsed().as_millis() as u64,
            "cluster script done"
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Finds the workspace root: the given folder, else the current folder, else
/// the workspace this binary was built from.
pub async fn find_root(given: Option<&Path>) -> Result<PathBuf, BoxError> {
    async fn has_scripts(p: &Path) -> bool {
        let script = p.join("scripts").join("db-start.sh");
        tokio::fs::try_exists(&script).await.unwrap_or(false)
    }
    if let Some(p) = given {
        if has_scripts(p).await {
            return Ok(p.to_owned());
        }
        return Err(format!("{} holds no scripts/db-start.sh (--root)", p.display()).into());
    }
    let cwd = std::env::current_dir()?;
    if has_scripts(&cwd).await {
        return Ok(cwd);
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if has_scripts(&built).await {
        return Ok(built);
    }
    Err("scripts/db-start.sh not found: run from the workspace root or pass --root".into())
}
