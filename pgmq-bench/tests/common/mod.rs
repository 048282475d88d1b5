//! Shared by the integration tests: a throwaway database per test on the
//! development cluster (so that tests never see each other's pgmq_bench_*
//! queues), and running the real binary.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// The cluster tests use (PGMQ_TEST_DSN, else the development cluster).
pub fn test_dsn() -> String {
    std::env::var("PGMQ_TEST_DSN")
        .unwrap_or_else(|_| "postgres://pgmq:pgmq@127.0.0.1:55432/pgmq".to_owned())
}

/// `dsn` with its database name replaced.
fn with_database(dsn: &str, db: &str) -> String {
    let mut info = pgmq_client::ConnInfo::parse(dsn).expect("the test DSN parses");
    info.set("dbname", db).unwrap();
    info.to_dsn()
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

pub async fn connect(dsn: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the test database: {e}"));
    tokio::spawn(conn);
    client
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A database with PGMQ created for one test and dropped when it ends.
pub struct TempDb {
    name: String,
    pub dsn: String,
}

impl TempDb {
    pub fn new(tag: &str) -> TempDb {
        let name = format!(
            "pgmq_bench_t_{tag}_{}_{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let dsn = with_database(&test_dsn(), &name);
        let admin = test_dsn();
        let (n, d) = (name.clone(), dsn.clone());
        runtime().block_on(async move {
            let c = connect(&admin).await;
            c.batch_execute(&format!("CREATE DATABASE {n}"))
                .await
                .unwrap();
            let c = connect(&d).await;
            c.batch_execute("CREATE EXTENSION pgmq").await.unwrap();
        });
        TempDb { name, dsn }
    }

    /// Runs SQL in this database and returns the first column of each row as text.
    pub fn query(&self, sql: &str) -> Vec<String> {
        self.try_query(sql).unwrap()
    }

    /// [`query`](Self::query), returning the server's refusal instead of
    /// panicking on it.
    pub fn try_query(&self, sql: &str) -> Result<Vec<String>, tokio_postgres::Error> {
        let dsn = self.dsn.clone();
        let sql = sql.to_owned();
        runtime().block_on(async move {
            let c = connect(&dsn).await;
            Ok(c.simple_query(&sql)
                .await?
                .into_iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => {
                        Some(r.get(0).unwrap_or("").to_owned())
                    }
                    _ => None,
                })
                .collect())
        })
    }

    /// Names of the queues that start with pgmq_bench_.
    pub fn bench_queues(&self) -> Vec<String> {
        self.query(
            "SELECT queue_name FROM pgmq.meta WHERE queue_name LIKE 'pgmq\\_bench\\_%' ORDER BY 1",
        )
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        let admin = test_dsn();
        let name = self.name.clone();
        runtime().block_on(async move {
            let c = connect(&admin).await;
            let _ = c
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await;
        });
    }
}

/// The benchmark binary built for these tests.
pub fn bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pgmq-bench"));
    c.env_remove("PGMQ_BENCH_DSN");
    c
}

/// Runs it and returns the output.
pub fn run(args: &[&str]) -> Output {
    bench()
        .args(args)
        .output()
        .expect("the pgmq-bench binary runs")
}

/// Runs it on `dsn`, given in `PGMQ_BENCH_DSN` (never on the command line,
/// where other local users could read its password), and returns the output.
pub fn run_on(dsn: &str, args: &[&str]) -> Output {
    bench()
        .env("PGMQ_BENCH_DSN", dsn)
        .args(args)
        .output()
        .expect("the pgmq-bench binary runs")
}

/// Runs the binary on `dsn` writing its document to a fresh temporary file
/// named `name` (`--output` goes before `args`), and returns the document;
/// panics with the binary's stderr when it wrote none.
pub fn run_document(dsn: &str, name: &str, args: &[&str]) -> serde_json::Value {
    let path = temp_path(name);
    let mut all = vec!["--output", path.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = run_on(dsn, &all);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "no document ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    serde_json::from_str(&text).unwrap()
}

/// A URL DSN's parts: the DSN without its password, the (decoded)
/// password, and the host, port, database and user a password file matches.
pub struct DsnParts {
    pub without_password: String,
    pub password: String,
    pub host: String,
    pub port: u16,
    pub dbname: String,
    pub user: String,
}

/// Splits a `postgres://user:password@host:port/db` DSN.
pub fn dsn_parts(dsn: &str) -> DsnParts {
    let config: tokio_postgres::Config = dsn.parse().expect("a DSN tokio-postgres reads");
    let password = String::from_utf8(
        config
            .get_password()
            .expect("the test DSN holds a password")
            .to_vec(),
    )
    .unwrap();
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => panic!("the test DSN names a TCP host"),
    };
    let (scheme, rest) = dsn.split_once("://").expect("a URL DSN");
    let at = rest.find('@').expect("userinfo in the URL");
    let userinfo = &rest[..at];
    let user_text = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
    DsnParts {
        without_password: format!("{scheme}://{user_text}{}", &rest[at..]),
        password,
        host,
        port: config.get_ports().first().copied().unwrap_or(5432),
        dbname: config.get_dbname().unwrap().to_owned(),
        user: config.get_user().unwrap().to_owned(),
    }
}

/// Writes `text` to `path` with `mode` (before anything is written into it).
pub fn write_private(path: &std::path::Path, text: &str, mode: u32) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A path named `name` in a fresh temporary folder of its own. The folder,
/// with whatever the test wrote there, is removed when the value is dropped,
/// so the tests leave nothing in the temp folder.
pub fn temp_path(name: &str) -> TempPath {
    let dir = std::env::temp_dir().join(format!(
        "pgmq-bench-test-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    TempPath {
        path: dir.join(name),
        dir,
    }
}

/// See [`temp_path`]; derefs to the path.
#[derive(Debug)]
pub struct TempPath {
    path: PathBuf,
    dir: PathBuf,
}

impl std::ops::Deref for TempPath {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for TempPath {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<std::ffi::OsStr> for TempPath {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The workspace's docs folder.
pub fn docs_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs")
}

/// docs/benchmark.v1.schema.json, parsed.
pub fn schema() -> serde_json::Value {
    serde_json::from_str(
        &std::fs::read_to_string(docs_dir().join("benchmark.v1.schema.json")).unwrap(),
    )
    .unwrap()
}

/// Where `doc` violates the schema (empty when it validates).
pub fn schema_errors(doc: &serde_json::Value) -> Vec<String> {
    let schema = schema();
    let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
    validator
        .iter_errors(doc)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

/// Reads the schemas a schema refers to from docs/, where they lie beside
/// it (the summary schema refers to benchmark.v1.schema.json).
struct DocsFolder;

impl jsonschema::Retrieve for DocsFolder {
    fn retrieve(
        &self,
        uri: &jsonschema::Uri<String>,
    ) -> Result<serde_json::Value, Box<dyn std::error::Error + Send + Sync>> {
        let path = uri.as_str().split('#').next().unwrap_or("");
        let name = path.rsplit('/').next().unwrap_or("");
        Ok(serde_json::from_str(&std::fs::read_to_string(
            docs_dir().join(name),
        )?)?)
    }
}

/// The validator of docs/benchmark-summary.v1.schema.json, what `pgmq-bench
/// summary` writes as JSON.
pub fn summary_validator() -> jsonschema::Validator {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(docs_dir().join("benchmark-summary.v1.schema.json")).unwrap(),
    )
    .unwrap();
    jsonschema::options()
        .with_retriever(DocsFolder)
        .build(&schema)
        .expect("the summary schema compiles")
}

/// Where a summary violates its schema (empty when it validates).
pub fn summary_schema_errors(summary: &serde_json::Value) -> Vec<String> {
    summary_validator()
        .iter_errors(summary)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

/// The headline figures' labels, in row order, as `summary --markdown`
/// writes them.
pub fn headline_labels() -> Vec<&'static str> {
    pgmq_bench::report::summary::HEADLINE
        .iter()
        .map(|(_, label)| *label)
        .collect()
}

/// The arguments of a short run of every section (the database goes in
/// `PGMQ_BENCH_DSN`: see [`run_on`]).
pub fn short_run_args(output: &str) -> Vec<&str> {
    vec![
        "--output",
        output,
        "--messages",
        "2000",
        "--batch-messages",
        "3000",
        "--single-messages",
        "200",
        "--workers",
        "1,2",
        "--repeat",
        "2",
        "--warmup",
        "1",
        "--idle",
        "1s",
        "--wakeup-poll-ms",
        "50",
        "--duration",
        "3s",
        "--sustained-warmup",
        "1s",
        "--rate",
        "1000",
        "--sustained-workers",
        "2",
        "--backlog-sizes",
        "1000,3000",
        "--backlog-workers",
        "2",
        "--processes",
        "1,2",
        "--processes-messages",
        "2000",
        "--batch-handler-messages",
        "2000",
        "--batch-handler-workers",
        "2",
        "--steady-handlers",
        "2,8",
        "--steady-rates",
        "0",
        "--steady-depth",
        "200",
        "--steady-duration-s",
        "1",
        "--steady-warmup-s",
        "0.5",
        "--pinned-handlers",
        "4",
        "--pinned-calibrate-s",
        "1",
        "--pinned-phase-s",
        "1",
        "--pinned-readers",
        "2",
        "--fleet-limit-processes",
        "2",
        "--fleet-limit-places",
        "4",
        "--fleet-limit-messages",
        "200",
        "--fleet-limit-work-ms",
        "10",
    ]
}

/// The arguments of the smallest run that writes a document to `output`:
/// one round of send_single with 20 messages, no warm-up.
pub fn smallest_run_args(output: &str) -> Vec<&str> {
    vec![
        "--output",
        output,
        "--sections",
        "send_single",
        "--single-messages",
        "20",
        "--repeat",
        "1",
        "--warmup",
        "0",
    ]
}
