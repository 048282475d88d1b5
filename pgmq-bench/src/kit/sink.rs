//! `--handler db-write`'s sink: the table handlers insert into and the
//! connections they insert on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::Result;

/// run, dropped at its end).
pub(crate) const SINK_TABLE: &str = "pgmq_bench_handler_sink";

/// `--handler db-write`: a pool of plain connections of its own (not the
/// SDK's), each with the insert prepared; handler calls take them round robin
/// and pipeline on them.
#[derive(Debug)]
pub(crate) struct Sink {
    pub(crate) conns: Vec<(tokio_postgres::Client, tokio_postgres::Statement)>,
    next: AtomicUsize,
}

impl Sink {
    /// Creates the table (idempotent) with `admin`.
    pub(crate) async fn create_table(admin: &tokio_postgres::Client) -> Result<()> {
        admin
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {SINK_TABLE} (id bigint NOT NULL, \
                 at timestamptz NOT NULL DEFAULT clock_timestamp())"
            ))
            .await?;
        Ok(())
    }

    /// Drops the table.
    pub(crate) async fn drop_table(admin: &tokio_postgres::Client) -> Result<()> {
        admin
            .batch_execute(&format!("DROP TABLE IF EXISTS {SINK_TABLE}"))
            .await?;
        Ok(())
    }

    /// `size` connections to `dsn`.
    pub(crate) async fn connect(target: &crate::target::Target, size: u32) -> Result<Arc<Sink>> {
        let mut conns = Vec::new();
        for _ in 0..size.clamp(1, 16) {
            let (pg, _notifications) = target
                .builder()
                .application_name("pgmq-bench-handler-sink")
                .connect_dedicated()
                .await?;
            let stmt = pg
                .prepare(&format!("INSERT INTO {SINK_TABLE} (id) VALUES ($1)"))
                .await?;
            conns.push((pg, stmt));
        }
        Ok(Arc::new(Sink {
            conns,
            next: AtomicUsize::new(0),
        }))
    }

    /// Inserts one row.
    pub(crate) async fn write(&self, id: u64) -> std::result::Result<(), tokio_postgres::Error> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        let (pg, stmt) = &self.conns[i];
        pg.execute(stmt, &[&(id as i64)]).await.map(|_| ())
    }
}
