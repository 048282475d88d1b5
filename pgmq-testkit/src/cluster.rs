//! A throwaway cluster on a port of its own, driven through the workspace
//! scripts (`scripts/db-start.sh`, `db-ctl.sh`, `db-stop.sh`) with
//! `PGMQ_DB_PORT` set: the fault suite's (which kills and restarts its
//! server), and the benchmark's `--local` ([`Cluster::attended`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::process::Command;

use crate::BoxError;

/// The port of the development cluster other tools use: never touched here.
pub const SHARED_PORT: u16 = 55432;

/// How long a script may take when nobody watches it ([`Cluster::new`]).
const SCRIPT_LIMIT: Duration = Duration::from_secs(300);

/// A cluster on its own port.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// The folder holding db-start.sh, db-ctl.sh and db-stop.sh.
    scripts: PathBuf,
    port: u16,
    /// The DSN db-start.sh printed, parsed (its password is generated with
    /// the cluster).
    login: Arc<OnceLock<pgmq_client::ConnInfo>>,
    /// The scripts' stderr goes to this process's, without a time limit
    /// ([`Cluster::attended`]); otherwise it is captured into the error of
    /// a script that failed, and a script gets [`SCRIPT_LIMIT`].
    attended: bool,
}

impl Cluster {
    /// The fault suite's cluster, with the scripts of the workspace `root`:
    /// their output is captured (and in the error of one that fails), each
    /// may take 5 minutes. Refuses the shared development cluster's port.
    pub fn new(root: &Path, port: u16) -> Result<Self, BoxError> {
        if port == SHARED_PORT {
            return Err(format!(
                "port {SHARED_PORT} is the shared development cluster; the fault suite kills \
                 its server, so it needs its own port (--port 55433)"
            )
            .into());
        }
        Ok(Cluster {
            scripts: root.join("scripts"),
            port,
            login: Arc::default(),
            attended: false,
        })
    }

    /// A cluster someone watches being made (the benchmark's `--local`), with
    /// the scripts in the folder `scripts`: their stderr goes to this
    /// process's, so that what they do and why one failed is in the output,
    /// and they take as long as they take (db-start.sh may first install
    /// PostgreSQL with apt-get). Refuses the shared development cluster's port.
    pub fn attended(scripts: &Path, port: u16) -> Result<Self, BoxError> {
        if port == SHARED_PORT {
            return Err(format!(
                "port {SHARED_PORT} is the shared development cluster; a throwaway cluster \
                 is removed afterwards, so it needs its own port"
            )
            .into());
        }
        Ok(Cluster {
            scripts: scripts.to_owned(),
            port,
            login: Arc::default(),
            attended: true,
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

    /// Whether a server runs on the port (`db-ctl.sh status`).
    pub async fn running(&self) -> Result<bool, BoxError> {
        Ok(self.run("db-ctl.sh", &["status"]).await?.status.success())
    }

    /// Starts (or recovers) the cluster; idempotent. Returns the DSN
    /// db-start.sh printed, with the cluster's password: never to be logged.
    pub async fn start(&self) -> Result<String, BoxError> {
        let printed = self.script("db-start.sh", &[]).await?;
        // postgres://user:password@127.0.0.1:port/pgmq
        let dsn = printed.lines().last().unwrap_or_default().trim();
        let login = pgmq_client::ConnInfo::parse(dsn).map_err(|_| "db-start.sh printed no DSN")?;
        let _ = self.login.set(login);
        Ok(dsn.to_owned())
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

    /// Stops the cluster and removes its folder, blocking the thread: for a
    /// guard's `Drop`, which must clean up even when a test panicked.
    pub fn remove_blocking(&self) {
        let _ = std::process::Command::new("bash")
            .arg(self.scripts.join("db-stop.sh"))
            .env("PGMQ_DB_PORT", self.port.to_string())
            .stdin(Stdio::null())
            .output();
    }

    /// Runs a script; returns its stdout (db-start.sh prints the DSN, with
    /// the password: never logged), or an error when it failed.
    async fn script(&self, name: &str, args: &[&str]) -> Result<String, BoxError> {
        let path = self.scripts.join(name);
        let started = Instant::now();
        let out = self.run(name, args).await?;
        if !out.status.success() {
            // Attended, the script's stderr is already in ours.
            let stderr = String::from_utf8_lossy(&out.stderr);
            let why = match stderr.trim() {
                "" => String::new(),
                s => format!(": {s}"),
            };
            let command = [path.display().to_string()]
                .into_iter()
                .chain(args.iter().map(|a| a.to_string()))
                .collect::<Vec<_>>()
                .join(" ");
            return Err(format!("{command} failed ({}){why}", out.status).into());
        }
        tracing::debug!(
            script = name,
            ms = started.elapsed().as_millis() as u64,
            "cluster script done"
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs a script and waits for it, whatever its exit status; its stdout
    /// captured, its stderr captured or (attended) this process's.
    async fn run(&self, name: &str, args: &[&str]) -> Result<std::process::Output, BoxError> {
        let path = self.scripts.join(name);
        let mut cmd = Command::new("bash");
        cmd.arg(&path)
            .args(args)
            .env("PGMQ_DB_PORT", self.port.to_string())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let running = |e: std::io::Error| format!("running {}: {e}", path.display());
        if self.attended {
            // stdout (db-start.sh's DSN) is captured; stderr goes to ours.
            // `Command::output` would capture both, whatever `stderr` was
            // set to, and the reason a script failed would be lost.
            let child = cmd
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(running)?;
            return Ok(child.wait_with_output().await.map_err(running)?);
        }
        match tokio::time::timeout(SCRIPT_LIMIT, cmd.output()).await {
            Ok(out) => Ok(out.map_err(running)?),
            Err(_) => Err(format!(
                "{} {} did not finish within {} s",
                path.display(),
                args.join(" "),
                SCRIPT_LIMIT.as_secs()
            )
            .into()),
        }
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
