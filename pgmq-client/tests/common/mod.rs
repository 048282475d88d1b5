//! Shared helpers of the integration tests: the throwaway database's DSN and
//! unique queue names.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};

use pgmq_client::{Client, QueueName};

/// The DSN of the throwaway cluster (scripts/db-start.sh), or PGMQ_TEST_DSN.
pub fn dsn() -> String {
    std::env::var("PGMQ_TEST_DSN")
        .unwrap_or_else(|_| "postgres://pgmq:pgmq@127.0.0.1:55432/pgmq".to_owned())
}

/// The same server, another database.
pub fn dsn_for(db: &str) -> String {
    let d = dsn();
    match d.rfind('/') {
        Some(i) => format!("{}/{}", &d[..i], db),
        None => d,
    }
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
    let name = format!("t_{prefix}_{}_{n}_{:x}", std::process::id(), nanos & 0xffff);
    QueueName::new(&name[..name.len().min(47)]).unwrap()
}

/// Creates a fresh queue.
pub async fn fresh_queue(client: &Client, prefix: &str) -> QueueName {
    let q = unique(prefix);
    client.create(&q).await.unwrap();
    q
}
