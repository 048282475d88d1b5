//! Shared helpers of the integration tests: the throwaway database's DSN,
//! unique queue names, a guard that drops a test's queues even when it panics,
//! and a plain `tokio_postgres` connection for looking at tables directly.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use pgmq_client::{Client, QueueName};

/// The DSN of the throwaway cluster (scripts/db-start.sh), or PGMQ_TEST_DSN.
pub fn dsn() -> String {
    std::env::var("PGMQ_TEST_DSN")
        .unwrap_or_else(|_| "postgres://pgmq:pgmq@127.0.0.1:55432/pgmq".to_owned())
}

/// The same server, another database.
pub fn dsn_for(db: &str) -> String {
    let mut info = pgmq_client::ConnInfo::parse(&dsn()).expect("PGMQ_TEST_DSN parses");
    info.set("dbname", db).unwrap();
    info.to_dsn()
}

pub async fn client() -> Client {
    Client::connect(&dsn())
        .await
        .expect("the test database is up: run scripts/db-start.sh")
}

/// A plain tokio-postgres connection (no statement cache, no TLS) to `dsn`.
pub async fn raw_to(dsn: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls)
        .await
        .expect("the test database is up: run scripts/db-start.sh");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A plain tokio-postgres connection to the test database.
pub async fn raw() -> tokio_postgres::Client {
    raw_to(&dsn()).await
}

/// `(msg_id, read_ct, visible now)` of every message of `q`, by id, straight
/// from its table.
pub async fn msg_states(
    pg: &tokio_postgres::Client,
    q: &pgmq_client::QueueName,
) -> Vec<(i64, i32, bool)> {
    let sql = format!(
        "SELECT msg_id, read_ct, vt <= clock_timestamp() FROM {} ORDER BY msg_id",
        q.quoted_table()
    );
    pg.query(&sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// Waits for the session advisory lock named `name` on a connection of its
/// own; the lock is held until the returned client is dropped (also when
/// the test panics), across test processes.
pub async fn advisory_lock(name: &str) -> tokio_postgres::Client {
    let pg = raw().await;
    pg.execute("SELECT pg_advisory_lock(hashtextextended($1, 0))", &[&name])
        .await
        .unwrap();
    pg
}

/// A queue name no other test (or run) uses.
pub fn unique(prefix: &str) -> QueueName {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let name = format!("t_{prefix}_{}_{n}_{:x}", std::process::id(), nanos & 0xffff);
    QueueName::new(&name[..name.len().min(47)]).unwrap()
}

/// Creates a fresh queue.
pub async fn fresh_queue(client: &Client, prefix: &str) -> QueueName {
    let q = unique(prefix);
    client.create(&q).await.unwrap();
    q
}

/// Drops every queue it handed out when it goes out of scope, also when the
/// test panicked (on a thread of its own, so it works from any runtime).
pub struct Queues {
    dsn: String,
    names: Mutex<Vec<QueueName>>,
}

impl Queues {
    /// A guard for queues on the test database.
    pub fn new() -> Self {
        Self::on(&dsn())
    }

    /// A guard for queues on another database or server.
    pub fn on(dsn: &str) -> Self {
        Queues {
            dsn: dsn.to_owned(),
            names: Mutex::new(Vec::new()),
        }
    }

    /// A unique name, dropped at the end (whether or not it gets created).
    pub fn name(&self, prefix: &str) -> QueueName {
        let q = unique(prefix);
        self.names.lock().unwrap().push(q.clone());
        q
    }

    /// `name` (a queue made some other way), dropped at the end.
    pub fn adopt(&self, name: &str) -> QueueName {
        let q = QueueName::new(name).unwrap();
        self.names.lock().unwrap().push(q.clone());
        q
    }

    /// A unique queue, created now, dropped at the end.
    pub async fn fresh<E: pgmq_client::Executor>(
        &self,
        pgmq: &pgmq_client::Pgmq<E>,
        prefix: &str,
    ) -> QueueName {
        let q = self.name(prefix);
        pgmq.create(&q).await.unwrap();
        q
    }
}

impl Default for Queues {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs `f` to completion on a runtime of its own, on a thread of its own:
/// for cleanups in `Drop`, which cannot await and may run on any runtime
/// (or while a test panics).
pub fn run_detached<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let _ = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f())
    })
    .join();
}

impl Drop for Queues {
    fn drop(&mut self) {
        let names = std::mem::take(&mut *self.names.lock().unwrap());
        if names.is_empty() {
            return;
        }
        let dsn = self.dsn.clone();
        run_detached(move || async move {
            let Ok((pg, conn)) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls).await else {
                return;
            };
            tokio::spawn(async move {
                let _ = conn.await;
            });
            for q in names {
                let name = q.as_str();
                let _ = pg
                    .execute(
                        "SELECT pgmq.drop_queue(queue_name) FROM pgmq.meta WHERE queue_name = $1",
                        &[&name],
                    )
                    .await;
            }
        });
    }
}

/// Rows of a queue's table: `(msg_id, read_ct, body)` in id order.
pub async fn queue_rows(
    pg: &tokio_postgres::Client,
    q: &QueueName,
) -> Vec<(i64, i32, serde_json::Value)> {
    table_rows(pg, &q.quoted_table()).await
}

/// Rows of a queue's archive table: `(msg_id, read_ct, body)` in id order.
pub async fn archive_rows(
    pg: &tokio_postgres::Client,
    q: &QueueName,
) -> Vec<(i64, i32, serde_json::Value)> {
    table_rows(pg, &q.quoted_archive_table()).await
}

async fn table_rows(
    pg: &tokio_postgres::Client,
    table: &str,
) -> Vec<(i64, i32, serde_json::Value)> {
    // `table` comes from a validated QueueName.
    let sql = format!("SELECT msg_id, read_ct, message FROM {table} ORDER BY msg_id");
    fetch(pg, &sql, &[], |r| (r.get(0), r.get(1), r.get(2))).await
}

/// The names of `pgmq.meta`, sorted.
pub async fn meta_names(pg: &tokio_postgres::Client) -> Vec<String> {
    fetch(
        pg,
        "SELECT queue_name FROM pgmq.meta ORDER BY 1",
        &[],
        |r| r.get(0),
    )
    .await
}

/// Runs `sql` and maps each row with `f`.
pub async fn fetch<T>(
    pg: &tokio_postgres::Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    f: impl Fn(&tokio_postgres::Row) -> T,
) -> Vec<T> {
    pg.query(sql, params).await.unwrap().iter().map(f).collect()
}

/// The first column of the one row `sql` returns.
pub async fn scalar<T: for<'a> tokio_postgres::types::FromSql<'a>>(
    pg: &tokio_postgres::Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> T {
    pg.query_one(sql, params).await.unwrap().get(0)
}

/// Ids of messages.
pub fn ids<T>(msgs: &[pgmq_client::Message<T>]) -> Vec<i64> {
    msgs.iter().map(|m| m.msg_id).collect()
}

/// The messages of a typed read or pop, every one of which must decode.
pub fn ok<T>(batch: Vec<pgmq_client::Decoded<T>>) -> Vec<pgmq_client::Message<T>> {
    batch
        .into_iter()
        .map(|m| m.unwrap_or_else(|u| panic!("{u}")))
        .collect()
}

/// A database of its own with PGMQ, dropped (with its connections) when
/// the guard goes, also when the test panicked.
pub struct OwnDb {
    name: String,
}

impl OwnDb {
    pub async fn new(prefix: &str) -> OwnDb {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!("t_{prefix}_{}_{nanos:x}", std::process::id());
        let admin = raw().await;
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap();
        let db = OwnDb { name };
        raw_to(&db.dsn())
            .await
            .batch_execute("CREATE EXTENSION pgmq")
            .await
            .unwrap();
        db
    }

    pub fn dsn(&self) -> String {
        dsn_for(&self.name)
    }

    /// A pool of one connection, so that every call reuses its statements.
    pub async fn client(&self) -> Client {
        pgmq_client::ClientBuilder::new(&self.dsn())
            .max_size(1)
            .connect()
            .await
            .unwrap()
    }
}

impl Drop for OwnDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        run_detached(move || async move {
            raw()
                .await
                .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .await
                .unwrap();
        });
    }
}
