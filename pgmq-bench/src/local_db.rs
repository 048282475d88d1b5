//! `--local`: a throwaway PostgreSQL + PGMQ cluster started with the
//! repository's `scripts/db-start.sh` on its own port (55436 by default, so
//! the development cluster on 55432 is never touched), and removed with
//! `scripts/db-stop.sh` when the benchmark ends. The scripts are run by
//! pgmq-testkit's [`Cluster`] (the fault suite's cluster too), attended:
//! their stderr is the benchmark's.

use std::path::{Path, PathBuf};

use pgmq_testkit::cluster::Cluster;

use crate::error::{Error, Result};
use crate::target::Target;

/// The default `--local-port`.
pub const DEFAULT_PORT: u16 = 55436;

/// The port of the shared development cluster, which `--local` never uses.
pub use pgmq_testkit::cluster::SHARED_PORT;

/// A running throwaway cluster; [`LocalDb::stop`] removes it.
#[derive(Debug)]
pub struct LocalDb {
    cluster: Cluster,
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
        let local = |e: pgmq_testkit::BoxError| Error::Local(e.to_string());
        let cluster = Cluster::attended(&scripts, port).map_err(local)?;
        if cluster.running().await.map_err(local)? {
            return Err(Error::Refused(format!(
                "a cluster is already running on port {port}; --local starts its own and removes it \
                 afterwards. Stop that one (PGMQ_DB_PORT={port} bash scripts/db-stop.sh) or pick \
                 another --local-port"
            )));
        }
        let dsn = match cluster.start().await {
            Ok(dsn) => dsn,
            Err(e) => {
                // Remove whatever half-started.
                let _ = cluster.remove().await;
                return Err(Error::Local(format!("port {port}: {e}")));
            }
        };
        let target = match Target::resolve(&dsn) {
            Ok(t) => t,
            Err(e) => {
                let _ = cluster.remove().await;
                return Err(e);
            }
        };
        Ok(LocalDb {
            cluster,
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
        self.cluster
            .remove()
            .await
            .map_err(|e| Error::Local(format!("port {}: {e}", self.port)))
    }
}
