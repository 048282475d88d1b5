//! What every scenario shares: the cluster, a client, the run id, and the
//! steps scenarios are made of (make queues, produce, start workers, wait for
//! the queue to drain, count).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use pgmq_client::{Client, QueueName};

use super::child::WorkerProc;
use super::cluster::{find_root, Cluster};
use super::job::{key_headers, Job};
use super::ledger::{self, Produced, Tally};
use super::proxy::Proxy;
use super::worker::{FaultSpec, Sabotage};
use super::{BoxError, FaultsArgs};

/// Shared state of one run of the suite.
pub(crate) struct Ctx {
    pub cluster: Cluster,
    pub client: Client,
    pub run_id: String,
    pub log_dir: PathBuf,
    /// Messages per scenario.
    pub n: usize,
    pub quick: bool,
    pub proxy_port: u16,
    pub started_at: DateTime<Utc>,
    pub machine: String,
    /// PostgreSQL and PGMQ versions of the suite's cluster.
    pub server: String,
    /// The cluster as the benchmark document records it.
    pub database: pgmq_testkit::environment::Database,
    pub durability: pgmq_testkit::environment::Durability,
    /// The fault worker's deliberate bug (`--sabotage`).
    pub sabotage: Vec<Sabotage>,
    tag: String,
    workers: AtomicU32,
}

/// A scenario's queue and its dead-letter queue.
pub(crate) struct Queues {
    pub q: QueueName,
    pub dlq: QueueName,
}

impl Ctx {
    /// Starts the suite's proxy (on `--proxy-port`) in front of the
    /// cluster.
    pub(crate) async fn start_proxy(&self) -> Result<Proxy, BoxError> {
        let listen: SocketAddr = ([127, 0, 0, 1], self.proxy_port).into();
        let upstream: SocketAddr = ([127, 0, 0, 1], self.cluster.port()).into();
        Ok(Proxy::start(listen, upstream).await?)
    }

    /// The cluster's DSN through `proxy`.
    pub(crate) fn proxied_dsn(&self, proxy: &Proxy) -> String {
        self.cluster.dsn_at(proxy.addr().port(), "pgmq")
    }

    /// Starts the suite's cluster, creates the ledger tables, picks a run id.
    pub(crate) async fn setup(args: &FaultsArgs) -> Result<Ctx, BoxError> {
        let root = find_root(args.root.as_deref()).await?;
        let cluster = Cluster::new(&root, args.port)?;
        if args.proxy_port == 55432 || args.proxy_port == args.port {
            return Err("--proxy-port must differ from 55432 and from --port".into());
        }
        cluster.start().await?;
        let client = Client::builder(&cluster.dsn())
            .max_size(8)
            .connect_timeout(Duration::from_secs(5))
            .application_name("pgmq-faults")
            .connect()
            .await?;
        let conn = client.connection().await?;
        conn.batch_execute(&ledger::schema()).await?;
        let row = conn
            .query_one(
                "select current_setting('server_version'), \
                 (select extversion from pg_extension where extname = 'pgmq')",
                &[],
            )
            .await?;
        let server = format!(
            "PostgreSQL {}, PGMQ {}",
            row.get::<_, String>(0),
            row.get::<_, Option<String>>(1)
                .unwrap_or_else(|| "?".into())
        );
        drop(conn);
        let admin = session(&cluster.dsn(), "pgmq-faults-admin").await?;
        let database = pgmq_testkit::environment::database(
            &admin,
            pgmq_client::redact_dsn(&cluster.dsn()),
            true,
            client.install(),
        )
        .await?;
        let durability = pgmq_testkit::environment::durability(&admin, false).await?;
        drop(admin);
        let started_at = Utc::now();
        let tag = format!("{}", started_at.timestamp() % 1_000_000_000);
        let run_id = format!(
            "{}-{}",
            started_at.format("%Y%m%dT%H%M%SZ"),
            std::process::id()
        );
        let log_dir = match &args.log_dir {
            Some(d) => {
                tokio::fs::create_dir_all(d).await?;
                d.clone()
            }
            None => private_temp_dir(&format!("pgmq-faults-{run_id}"))?,
        };
        let n = args
            .messages
            .unwrap_or(if args.quick { 1_000 } else { 10_000 })
            .max(100);
        Ok(Ctx {
            cluster,
            client,
            run_id,
            log_dir,
            n,
            quick: args.quick,
            proxy_port: args.proxy_port,
            started_at,
            machine: machine().await,
            server,
            database,
            durability,
            sabotage: args.sabotage.clone(),
            tag,
            workers: AtomicU32::new(0),
        })
    }

    /// Stops the cluster unless asked to keep it.
    pub(crate) async fn teardown(&self, keep: bool) {
        if keep {
            eprintln!(
                "faults: cluster kept at {}",
                pgmq_client::redact_dsn(&self.cluster.dsn())
            );
            return;
        }
        if let Err(e) = self.cluster.remove().await {
            eprintln!("faults: could not remove the cluster: {e}");
        }
    }

    /// Creates a fresh queue and dead-letter queue for a scenario.
    pub(crate) async fn queues(&self, label: &str) -> Result<Queues, BoxError> {
        let q = QueueName::new(&format!("fault_{label}_{}", self.tag))?;
        let dlq = QueueName::new(&format!("fault_{label}_{}_dlq", self.tag))?;
        for name in [&q, &dlq] {
            self.client.drop_queue(name).await.ok();
            self.client.create(name).await?;
        }
        Ok(Queues { q, dlq })
    }

    /// Drops a scenario's queues (the ledger keeps the evidence).
    pub(crate) async fn drop_queues(&self, qs: &Queues) {
        for name in [&qs.q, &qs.dlq] {
            if let Err(e) = self.client.drop_queue(name).await {
                eprintln!("faults: could not drop {name}: {e}");
            }
        }
    }

    /// Runs `body` on fresh queues of `label` ([`Ctx::queues`]), then drops
    /// them, whatever it returned.
    pub(crate) async fn with_queues<T>(
        &self,
        label: &str,
        body: impl AsyncFnOnce(&Queues) -> Result<T, BoxError>,
    ) -> Result<T, BoxError> {
        let qs = self.queues(label).await?;
        let result = body(&qs).await;
        self.drop_queues(&qs).await;
        result
    }

    /// Produces `jobs` in batches of 500 on the suite's own (unfaulted) client.
    pub(crate) async fn produce(&self, q: &QueueName, jobs: &[Job]) -> Produced {
        self.produce_headed(q, jobs, key_headers).await
    }

    /// [`Ctx::produce`], each message's headers `headers` of its key.
    pub(crate) async fn produce_headed(
        &self,
        q: &QueueName,
        jobs: &[Job],
        headers: impl Fn(i64) -> serde_json::Value,
    ) -> Produced {
        let mut produced = Produced::default();
        for chunk in jobs.chunks(500) {
            let keys: Vec<i64> = chunk.iter().map(|j| j.key).collect();
            let headers: Vec<serde_json::Value> = keys.iter().map(|k| headers(*k)).collect();
            let res = self
                .client
                .send_batch_with(
                    q,
                    chunk,
                    &pgmq_client::SendOptions::new().headers_each(headers),
                )
                .await;
            produced.record(&keys, &res);
        }
        produced
    }

    /// Plain jobs with keys `0..n`.
    pub(crate) fn plain_jobs(&self, n: usize) -> Vec<Job> {
        (0..n as i64).map(Job::plain).collect()
    }

    /// Worker settings for a scenario's queues (with the run's sabotage).
    pub(crate) fn worker_args(&self, qs: &Queues, scenario: &str) -> FaultSpec {
        let mut a = FaultSpec::for_queue(&qs.q, &qs.dlq, &self.run_id, scenario);
        a.sabotage = self.sabotage.clone();
        a
    }

    /// The sabotage's name, when there is one.
    pub(crate) fn sabotage_name(&self) -> Option<String> {
        let names: Vec<String> = self
            .sabotage
            .iter()
            .filter(|s| **s != Sabotage::None)
            .map(|s| format!("{s:?}"))
            .collect();
        (!names.is_empty()).then(|| names.join(", "))
    }

    /// Starts a worker process connected straight to the cluster.
    pub(crate) async fn spawn_worker(&self, args: &FaultSpec) -> Result<WorkerProc, BoxError> {
        self.spawn_worker_via(args, &self.cluster.dsn(), None).await
    }

    /// Starts a worker process with its own DSNs (through the proxy, say).
    pub(crate) async fn spawn_worker_via(
        &self,
        args: &FaultSpec,
        dsn: &str,
        ledger_dsn: Option<&str>,
    ) -> Result<WorkerProc, BoxError> {
        let i = self.workers.fetch_add(1, Ordering::Relaxed);
        let name = format!("s{}-w{i}", args.scenario);
        super::child::spawn(&self.log_dir, &name, dsn, ledger_dsn, args).await
    }

    /// Ledger rows of a scenario so far; None while the server is unreachable.
    pub(crate) async fn progress(&self, scenario: &str) -> Option<i64> {
        ledger::handled_count(&self.client, &self.run_id, scenario)
            .await
            .ok()
    }

    /// Waits until the ledger has at least `rows` rows for the scenario.
    pub(crate) async fn wait_progress(
        &self,
        scenario: &str,
        rows: i64,
        limit: Duration,
    ) -> Result<(), BoxError> {
        let every = Duration::from_millis(50);
        poll_until(limit, every, || async move {
            self.progress(scenario).await.unwrap_or(0) >= rows
        })
        .await
        .map(|_| ())
        .ok_or_else(|| {
            let s = limit.as_secs();
            format!("scenario {scenario}: fewer than {rows} handlings after {s} s").into()
        })
    }

    /// Waits until the queue holds no message at all (visible or not).
    /// Returns whether it drained within `limit`.
    pub(crate) async fn wait_drained(&self, q: &QueueName, limit: Duration) -> bool {
        let every = Duration::from_millis(100);
        poll_until(limit, every, || async move {
            self.client
                .metrics(q)
                .await
                .is_ok_and(|m| m.queue_length == 0)
        })
        .await
        .is_some()
    }

    /// Waits for the server to accept queries again (after a restart).
    pub(crate) async fn wait_server(&self, limit: Duration) -> Result<(), BoxError> {
        let every = Duration::from_millis(100);
        poll_until(limit, every, || async move {
            self.client.list_queues().await.is_ok()
        })
        .await
        .map(|_| ())
        .ok_or_else(|| "the server did not come back".into())
    }

    /// Counts everything for a scenario (after its workers stopped).
    pub(crate) async fn account(
        &self,
        scenario: &str,
        qs: &Queues,
        produced: &Produced,
    ) -> Result<Accounted, BoxError> {
        produced
            .persist(&self.client, &self.run_id, scenario)
            .await?;
        let at = (self.run_id.as_str(), scenario);
        let end = ledger::end_of(&self.client, at, (&qs.q, &qs.dlq)).await?;
        Ok(Accounted {
            tally: end.tally(produced),
            handlings: end.handlings,
            dead: end.dead.0.into_iter().collect(),
            dead_reasons: end.dead_reasons,
        })
    }
}

/// The counts of a scenario, with the rows they came from.
pub(crate) struct Accounted {
    pub tally: Tally,
    pub handlings: Vec<ledger::Handling>,
    /// Keys found in the dead-letter queue.
    pub dead: HashSet<i64>,
    /// The reason written on each keyed dead letter.
    pub dead_reasons: std::collections::HashMap<i64, String>,
}

/// A one-line description of the machine (cores, memory, PostgreSQL).
async fn machine() -> String {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = tokio::fs::read_to_string("/proc/meminfo")
        .await
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| format!("{} GiB", (kb + 524_288) / 1_048_576))
        .unwrap_or_else(|| "? GiB".into());
    format!("{cores} cores, {mem}, {}", std::env::consts::OS)
}

/// Makes a new folder in the temporary directory, as mkdtemp(3) does: a
/// name with an unpredictable suffix, created with mode 0700 by a call that
/// fails when anything (a folder or a symlink another user planted) is
/// already there, so nothing is followed and nobody else can write in it.
pub(crate) fn private_temp_dir(prefix: &str) -> std::io::Result<PathBuf> {
    use std::hash::{BuildHasher, Hasher};
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    let mut last = None;
    for attempt in 0u32..100 {
        // RandomState is seeded from the OS's random source.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(attempt);
        let path = base.join(format!("{prefix}.{:016x}", h.finish()));
        match std::fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free temporary folder name")))
}

/// Checks `ready` every `every` until it holds, for at least `limit`;
/// returns how long that took, or `None` when it never held. The suite's
/// waits (a count reached, a queue drained, the server back) are this.
pub(crate) async fn poll_until<F, Fut>(
    limit: Duration,
    every: Duration,
    mut ready: F,
) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t = Instant::now();
    loop {
        if ready().await {
            return Some(t.elapsed());
        }
        if t.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// A dedicated session of the suite's own (its admin, the campaign's
/// nemesis and watchers), straight to the cluster; 5 s to connect, which a
/// loaded machine needs at times.
pub(crate) async fn session(dsn: &str, app: &str) -> Result<tokio_postgres::Client, BoxError> {
    let (c, _notes) = pgmq_client::ClientBuilder::new(dsn)
        .application_name(app)
        .connect_timeout(Duration::from_secs(5))
        .connect_dedicated()
        .await?;
    Ok(c)
}

/// What the fast sampler saw of a fleet-limited queue.
#[derive(Debug, Clone, Default)]
pub(crate) struct FleetSamples {
    pub samples: u64,
    /// The most claims running in one sample.
    pub most: i64,
    /// Samples with more than the limit: when, and how many.
    pub over: Vec<(DateTime<Utc>, i64)>,
}

/// Samples `table` every `every` until `stop`: the claims running by the
/// database's clock (a visibility timeout ahead and a delivery current, as
/// a fleet limit counts them), against `limit`; with `per_key`, the most
/// claims running of one value of that header (a limit per key's key).
pub(crate) fn sample_running(
    dsn: String,
    (table, per_key): (String, Option<&str>),
    limit: i64,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<FleetSamples> {
    // The header is one of the suite's own names ([a-z0-9_] only): safe
    // in a literal.
    let running = "vt > clock_timestamp() and last_read_at is not null";
    let sql = match per_key {
        None => format!("select count(*) filter (where {running}), clock_timestamp() from {table}"),
        Some(header) => format!(
            "select coalesce(max(n), 0), clock_timestamp() from ( \
                 select count(*) as n from {table} where {running} \
                 group by headers ->> '{header}') k"
        ),
    };
    tokio::spawn(async move {
        let mut out = FleetSamples::default();
        let mut conn: Option<tokio_postgres::Client> = None;
        while !*stop.borrow() {
            if conn.as_ref().is_none_or(|c| c.is_closed()) {
                conn = session(&dsn, "pgmq-campaign-watch").await.ok();
            }
            if let Some(c) = &conn {
                if let Ok(r) = c.query_one(sql.as_str(), &[]).await {
                    let n: i64 = r.get(0);
                    out.samples += 1;
                    out.most = out.most.max(n);
                    if n > limit {
                        out.over.push((r.get(1), n));
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.changed() => {}
            }
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn private_temp_dirs_are_fresh_and_0700() {
        let a = super::private_temp_dir("pgmq-faults-test").unwrap();
        let b = super::private_temp_dir("pgmq-faults-test").unwrap();
        assert_ne!(a, b);
        for d in [&a, &b] {
            let meta = std::fs::symlink_metadata(d).unwrap();
            assert!(meta.is_dir());
            assert_eq!(meta.permissions().mode() & 0o777, 0o700);
            std::fs::remove_dir(d).unwrap();
        }
    }
}
