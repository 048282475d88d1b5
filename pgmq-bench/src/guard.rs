//! The queue guard: the benchmark owns only queues named `pgmq_bench_*`, and
//! drops every one it created on normal completion, on error, on panic and on
//! Ctrl-C/SIGTERM.
//!
//! At start it refuses to run while `pgmq_bench_*` queues exist (another run
//! in progress, or one killed with SIGKILL), unless told to clean them
//! (`--clean`). Cleanup is best effort: a failed drop is reported on stderr
//! and does not hide the benchmark result. Only a SIGKILL or a host crash can
//! leave queues behind; the next run then refuses until `--clean`.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};

use pgmq_client::{Client, QueueName};

use crate::error::{Error, Result};

/// Every queue the benchmark creates starts with this.
pub const PREFIX: &str = "pgmq_bench_";

/// The owned-queue registry; clones share it.
#[derive(Clone, Debug)]
pub struct Guard {
    client: Client,
    owned: Arc<Mutex<BTreeSet<QueueName>>>,
    unlogged: bool,
}

/// Names of existing queues that start with [`PREFIX`].
pub async fn leftovers(client: &Client) -> Result<Vec<String>> {
    Ok(client
        .list_queues()
        .await?
        .into_iter()
        .map(|q| q.queue_name)
        .filter(|n| n.starts_with(PREFIX))
        .collect())
}

/// `pgmq_bench_<suffix>`, validated.
pub fn queue_name(suffix: &str) -> Result<QueueName> {
    Ok(QueueName::new(&format!("{PREFIX}{suffix}"))?)
}

impl Guard {
    /// Checks for leftover `pgmq_bench_*` queues: refuses when there are any,
    /// unless `clean`, which drops them first. Returns the guard and the names
    /// cleaned.
    pub async fn acquire(
        client: Client,
        clean: bool,
        unlogged: bool,
    ) -> Result<(Guard, Vec<String>)> {
        let found = leftovers(&client).await?;
        if !found.is_empty() && !clean {
            return Err(Error::Refused(format!(
                "queues named {PREFIX}* already exist ({}): another benchmark may be running, \
                 or one was killed; rerun with --clean to drop them",
                found.join(", ")
            )));
        }
        for name in &found {
            client.drop_queue(&QueueName::new(name)?).await?;
        }
        Ok((
            Guard {
                client,
                owned: Arc::new(Mutex::new(BTreeSet::new())),
                unlogged,
            },
            found,
        ))
    }

    fn owned(&self) -> std::sync::MutexGuard<'_, BTreeSet<QueueName>> {
        self.owned.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates `pgmq_bench_<suffix>` afresh (dropped first if it exists),
    /// logged or unlogged as configured, and registers it for cleanup.
    pub async fn fresh(&self, suffix: &str) -> Result<QueueName> {
        let q = queue_name(suffix)?;
        self.owned().insert(q.clone());
        self.client.drop_queue(&q).await?;
        if self.unlogged {
            self.client.create_unlogged(&q).await?;
        } else {
            self.client.create(&q).await?;
        }
        Ok(q)
    }

    /// Drops one owned queue now (to free its space) and forgets it.
    pub async fn release(&self, q: &QueueName) -> Result<()> {
        self.client.drop_queue(q).await?;
        self.owned().remove(q);
        Ok(())
    }

    /// Drops every owned queue, best effort; returns the failures.
    pub async fn cleanup(&self) -> Vec<String> {
        let names: Vec<QueueName> = self.owned().iter().rev().cloned().collect();
        let mut failures = Vec::new();
        for q in names {
            match self.client.drop_queue(&q).await {
                Ok(_) => {
                    self.owned().remove(&q);
                }
                Err(e) => failures.push(format!("could not drop {q}: {e}")),
            }
        }
        for f in &failures {
            eprintln!("pgmq-bench: cleanup: {f}");
        }
        failures
    }

    /// Runs `body` as its own task and drops every owned queue afterwards,
    /// whether it returned, failed, panicked or Ctrl-C/SIGTERM arrived.
    pub async fn run<T, F>(&self, body: F) -> Result<T>
    where
        T: Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        let mut task = tokio::spawn(body);
        let result = tokio::select! {
            joined = &mut task => match joined {
                Ok(r) => r,
                Err(e) if e.is_panic() => {
                    let payload = e.into_panic();
                    let msg = payload
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".to_owned());
                    Err(Error::Panicked(msg))
                }
                Err(_) => Err(Error::Interrupted),
            },
            () = shutdown_signal() => {
                task.abort();
                let _ = task.await;
                Err(Error::Interrupted)
            }
        };
        self.cleanup().await;
        result
    }
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
