//! Shared helpers of the worker's integration tests: the DSN, unique queues
//! dropped even when a test panics, and waiting for a condition.
#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use pgmq_client::{Client, QueueName};

/// The DSN of the throwaway cluster (scripts/db-start.sh), or PGMQ_TEST_DSN.
pub fn dsn() -> String {
    std::env::var("PGMQ_TEST_DSN")
        .unwrap_or_else(|_| "postgres://pgmq:pgmq@127.0.0.1:55432/pgmq".to_owned())
}

pub async fn client() -> Client {
    Client::connect(&dsn())
        .await
        .expect("the test database is up: run scripts/db-start.sh")
}

/// A queue name no other test (or run) uses.
pub fn unique(prefix: &str) -> QueueName {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    QueueName::new(&format!("w{prefix}_{}_{nanos:x}_{n}", std::process::id())).unwrap()
}

/// Queues created for one test, dropped when the guard goes (even on panic).
pub struct Queues {
    names: Vec<QueueName>,
}

impl Queues {
    pub async fn new(client: &Client, names: &[&QueueName]) -> Queues {
        for q in names {
            client.create(q).await.unwrap();
        }
        Queues {
            names: names.iter().map(|q| (*q).clone()).collect(),
        }
    }
}

impl Drop for Queues {
    fn drop(&mut self) {
        let names = std::mem::take(&mut self.names);
        // Drop on a fresh thread with its own runtime: Drop cannot await.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                // The test's pool belongs to the test's runtime; use a new one.
                if let Ok(c) = Client::connect(&dsn()).await {
                    for q in names {
                        let _ = c.drop_queue(&q).await;
                    }
                }
            });
        })
        .join();
    }
}

/// Waits until `check` returns true, polling every 10 ms, for at most `max`.
pub async fn wait_for<F, Fut>(max: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < max,
            "timed out after {max:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Number of messages in a queue table, visible or not.
pub async fn queue_len(client: &Client, q: &QueueName) -> i64 {
    client.metrics(q).await.unwrap().queue_length
}

/// Rows of the archive table.
pub async fn archive_len(client: &Client, q: &QueueName) -> i64 {
    let conn = client.connection().await.unwrap();
    let row = conn
        .query_one(&format!("SELECT count(*) FROM {}", q.archive_table()), &[])
        .await
        .unwrap();
    row.get(0)
}

/// A row of a queue table locked by another transaction (`SELECT ... FOR
/// UPDATE`), so that a delete of it waits, until [`release`](Self::release).
pub struct RowLock {
    conn: pgmq_client::reexports::bb8::PooledConnection<'static, pgmq_client::ConnectionManager>,
}

impl RowLock {
    pub async fn take(client: &Client, q: &QueueName, msg_id: i64) -> RowLock {
        let conn = client.connection_owned().await.unwrap();
        conn.batch_execute("BEGIN").await.unwrap();
        conn.execute(
            &format!("SELECT 1 FROM {} WHERE msg_id = $1 FOR UPDATE", q.table()),
            &[&msg_id],
        )
        .await
        .unwrap();
        RowLock { conn }
    }

    /// Ends the locking transaction (a rollback: it wrote nothing).
    pub async fn release(self) {
        self.conn.batch_execute("ROLLBACK").await.unwrap();
    }
}

/// The messages of a typed read or pop, every one of which must decode.
pub fn ok<T>(batch: Vec<pgmq_client::Decoded<T>>) -> Vec<pgmq_client::Message<T>> {
    batch
        .into_iter()
        .map(|m| m.unwrap_or_else(|u| panic!("{u}")))
        .collect()
}

/// A transactional handler that inserts the message's id into `table` in the
/// worker's transaction, then waits up to `pause_ms` (random) before the
/// commit, where a kill can land.
pub struct InsertRow {
    pub table: String,
    pub pause_ms: u64,
}

impl pgmq_worker::TransactionalHandler<serde_json::Value> for InsertRow {
    async fn handle(
        &self,
        msg: pgmq_client::Message<serde_json::Value>,
        tx: &pgmq_client::Transaction<'_>,
        _ctx: pgmq_worker::Context,
    ) -> Result<pgmq_worker::Outcome, pgmq_worker::HandlerError> {
        tx.execute(
            &format!("INSERT INTO {} (msg_id) VALUES ($1)", self.table),
            &[&msg.msg_id],
        )
        .await?;
        if self.pause_ms > 0 {
            use rand::Rng;
            let pause = Duration::from_millis(rand::thread_rng().gen_range(0..self.pause_ms));
            tokio::time::sleep(pause).await;
        }
        Ok(pgmq_worker::Outcome::Delete)
    }
}

/// The error a worker stops with when it cannot start (it must not start).
#[allow(dead_code)]
pub async fn start_error<T: serde::de::DeserializeOwned + Send + 'static>(
    worker: pgmq_worker::Worker<T>,
) -> pgmq_worker::Error {
    worker
        .run_until(std::future::pending::<()>())
        .await
        .expect_err("the worker started")
}

/// Takes the message's claim over as another delivery would once the claim
/// expired: the same update PGMQ's read makes (new `last_read_at`,
/// `read_ct + 1`, invisible for 60 s), in one statement, so that the
/// worker's own poll cannot take it in between.
#[allow(dead_code)]
pub async fn take_claim_over(client: &Client, q: &QueueName, id: i64) {
    let conn = client.connection().await.unwrap();
    let n = conn
        .execute(
            &format!(
                "UPDATE {} SET vt = clock_timestamp() + interval '60 seconds', \
                 read_ct = read_ct + 1, last_read_at = clock_timestamp() WHERE msg_id = $1",
                q.quoted_table()
            ),
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(n, 1, "the message's claim is taken over");
}

/// A table of handled message ids that a test makes and drops.
pub struct Ledger {
    pub table: String,
    conn: pgmq_client::reexports::bb8::PooledConnection<'static, pgmq_client::ConnectionManager>,
}

impl Ledger {
    /// Creates `public.<prefix>_<queue>`.
    pub async fn create(client: &Client, prefix: &str, q: &QueueName) -> Ledger {
        let table = format!("public.{prefix}_{}", q.as_str());
        let conn = client.connection_owned().await.unwrap();
        conn.batch_execute(&format!("CREATE TABLE {table} (msg_id bigint NOT NULL)"))
            .await
            .unwrap();
        Ledger { table, conn }
    }

    /// Drops the table; returns its rows and distinct ids.
    pub async fn counts_and_drop(self) -> (i64, i64) {
        let t = &self.table;
        let row = self
            .conn
            .query_one(
                &format!("SELECT count(*), count(DISTINCT msg_id) FROM {t}"),
                &[],
            )
            .await
            .unwrap();
        self.conn
            .batch_execute(&format!("DROP TABLE {t}"))
            .await
            .unwrap();
        (row.get(0), row.get(1))
    }
}

/// A database of one test's own on the test cluster, with PGMQ and this
/// build's `pgmq_sdk` schema, dropped when the guard goes (even on panic):
/// for tests that change the `pgmq_sdk` schema's rights, and for tests of
/// the schema's features whatever version of it the shared database has.
/// The test role may create databases (and extensions in them), not roles.
pub struct OwnDatabase {
    name: String,
    pub dsn: String,
}

impl OwnDatabase {
    pub async fn create(prefix: &str) -> OwnDatabase {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let name = format!("{prefix}_{}_{nanos:x}", std::process::id());
        let admin = client().await;
        admin
            .connection()
            .await
            .unwrap()
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let base = dsn();
        let (head, _) = base
            .rsplit_once('/')
            .expect("the test DSN is a URL ending in /<database>");
        let db = OwnDatabase {
            dsn: format!("{head}/{name}"),
            name,
        };
        let bare = Client::builder(&db.dsn)
            .check_pgmq(false)
            .connect()
            .await
            .unwrap();
        bare.connection()
            .await
            .unwrap()
            .batch_execute("CREATE EXTENSION pgmq")
            .await
            .unwrap();
        db.client(2).await.install_sdk_schema().await.unwrap();
        db
    }

    /// A client of its own there, its pool `max_size` connections.
    pub async fn client(&self, max_size: u32) -> Client {
        Client::builder(&self.dsn)
            .max_size(max_size)
            .connect()
            .await
            .unwrap()
    }

    /// Runs `sql` there, as the test's role, on a connection of its own.
    pub async fn execute(&self, sql: &str) {
        let c = self.client(1).await;
        c.connection()
            .await
            .unwrap()
            .batch_execute(sql)
            .await
            .unwrap();
    }
}

impl Drop for OwnDatabase {
    fn drop(&mut self) {
        let name = std::mem::take(&mut self.name);
        // On a fresh thread with its own runtime, as `Queues` does.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                if let Ok(c) = Client::connect(&dsn()).await {
                    if let Ok(conn) = c.connection().await {
                        let _ = conn
                            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                            .await;
                    }
                }
            });
        })
        .join();
    }
}
