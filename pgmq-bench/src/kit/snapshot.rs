//! Database snapshots around a measured window: the queue table's
//! statistics, its dead tuples, the CPU of the PostgreSQL cluster (when it
//! runs on this host) and of the bench process, and the database's clock.

use std::time::Duration;

use pgmq_client::QueueName;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::kit::Ctx;
use crate::report::{fmt_value, thousands};

/// The database's own counters over a worker_processes run, from the
/// processes' `go` to their exit: the queue table's statistics
/// (`pg_stat_user_tables`, `pg_statio_user_tables`) and the database's
/// transactions (`pg_stat_database`), per message handled. Unlike the rates
/// they do not depend on how loaded the machine was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct ProcessesServer {
    /// Shared buffers (hit or read) of the queue table and its indexes.
    pub buffers_per_msg: f64,
    /// Rows the queue table's index scans fetched (`idx_tup_fetch`): rows
    /// examined, the claimed and the skipped.
    pub index_rows_per_msg: f64,
    /// Committed and rolled-back transactions in the database (every
    /// statement of a worker is one).
    pub transactions_per_msg: f64,
    /// Rows updated in the queue table (claims, extensions).
    pub rows_updated: u64,
    /// Rows deleted from the queue table (acknowledgements).
    pub rows_deleted: u64,
    /// CPU of every process of the PostgreSQL cluster, microseconds per
    /// message (None: the server does not run on the bench's host, and in
    /// older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_us_per_msg: Option<f64>,
    /// CPU of the worker processes (user and system, from their start to
    /// their exit), microseconds per message (None in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers_cpu_us_per_msg: Option<f64>,
}

/// The database's counters over one run's window (None: not readable).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct SteadyServer {
    /// CPU of every process of the cluster (local only), microseconds per
    /// message completed.
    pub cpu_us_per_msg: Option<f64>,
    /// The queue table's `n_dead_tup`, largest of one-second samples.
    pub dead_tuples_peak: Option<u64>,
    /// The queue table's `n_dead_tup` sampled each second over the window,
    /// in order (a sample that could not be read is left out): whether
    /// vacuum keeps the dead tuples level or they pile up (empty in older
    /// documents).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dead_tuples_per_s: Vec<u64>,
    /// Index tuples fetched (`idx_tup_fetch`) of the queue table per message.
    pub idx_tup_fetch_per_msg: Option<f64>,
    /// Heap and index buffers of the queue table touched (hit or read) per message.
    pub buffers_per_msg: Option<f64>,
    /// CPU of the bench process itself (producer, worker, measuring; user
    /// and system, every thread), microseconds per message completed: the
    /// client side of the same two cores when the server runs on the
    /// bench's host (None in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bench_cpu_us_per_msg: Option<f64>,
}

impl SteadyServer {
    /// Its cells in a report's table ("–" for a counter not read): server
    /// CPU per message (µs), with `bench_cpu` the bench's too, index
    /// tuples fetched and buffers touched per message, the dead tuples'
    /// peak.
    pub(crate) fn cells(&self, bench_cpu: bool) -> String {
        let us = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.0}"));
        let per_msg = |v: Option<f64>| v.map_or("–".to_owned(), |v| fmt_value(v, "1/msg"));
        let mut cells = vec![us(self.cpu_us_per_msg)];
        if bench_cpu {
            cells.push(us(self.bench_cpu_us_per_msg));
        }
        cells.push(per_msg(self.idx_tup_fetch_per_msg));
        cells.push(per_msg(self.buffers_per_msg));
        cells.push(
            self.dead_tuples_peak
                .map_or("–".to_owned(), |v| thousands(v as f64)),
        );
        cells.join(" | ")
    }
}

/// The queue table's statistics, the database's transactions, and the CPU
/// of the cluster, of the bench process and of its reaped children at one
/// moment.
pub(crate) struct DbSnapshot {
    cpu: Option<Duration>,
    /// The bench process's own CPU time.
    bench_cpu: Duration,
    /// The CPU time of the bench's child processes that ended.
    children_cpu: Duration,
    /// idx_tup_fetch, n_tup_upd, n_tup_del, buffers (heap and index, hit
    /// and read), the database's transactions.
    table: Option<[i64; 5]>,
}

const TABLE_SQL: &str = "SELECT coalesce(t.idx_tup_fetch, 0)::int8, \
     coalesce(t.n_tup_upd, 0)::int8, coalesce(t.n_tup_del, 0)::int8, \
     (coalesce(io.heap_blks_hit, 0) + coalesce(io.heap_blks_read, 0) \
      + coalesce(io.idx_blks_hit, 0) + coalesce(io.idx_blks_read, 0))::int8, \
     (SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database \
      WHERE datname = current_database()) \
     FROM pg_stat_user_tables t JOIN pg_statio_user_tables io USING (relid) \
     WHERE t.schemaname = 'pgmq' AND t.relname = $1";

impl DbSnapshot {
    /// The counters of `q`'s table now (None when they cannot be read).
    pub(crate) async fn read(ctx: &Ctx, q: &QueueName) -> DbSnapshot {
        let table = table_stats(ctx, TABLE_SQL, q).await.and_then(|row| {
            let mut out = [0i64; 5];
            for (i, v) in out.iter_mut().enumerate() {
                *v = row.try_get::<_, i64>(i).ok()?;
            }
            Some(out)
        });
        DbSnapshot {
            cpu: cluster_cpu(&ctx.admin).await,
            bench_cpu: crate::process::cpu_time(),
            children_cpu: crate::process::children_cpu_time(),
            table,
        }
    }

    /// Each counter's growth up to `after`.
    fn growth(&self, after: &DbSnapshot) -> Option<[u64; 5]> {
        let (a, b) = (self.table?, after.table?);
        Some(std::array::from_fn(|i| {
            u64::try_from(b[i] - a[i]).unwrap_or(0)
        }))
    }

    /// The growth up to `after` per message of `n`, as steady_stream and
    /// pinned_horizon record it (no dead tuples: [`ServerWindow`] samples
    /// them).
    fn per_msg(&self, after: &DbSnapshot, n: u64) -> SteadyServer {
        let per = |v: u64| v as f64 / n.max(1) as f64;
        let us = |d: Duration| d.as_secs_f64() * 1e6 / n.max(1) as f64;
        let table = self.growth(after);
        SteadyServer {
            cpu_us_per_msg: self
                .cpu
                .zip(after.cpu)
                .map(|(a, b)| us(b.saturating_sub(a))),
            dead_tuples_peak: None,
            dead_tuples_per_s: Vec::new(),
            idx_tup_fetch_per_msg: table.map(|t| per(t[0])),
            buffers_per_msg: table.map(|t| per(t[3])),
            bench_cpu_us_per_msg: Some(us(after.bench_cpu.saturating_sub(self.bench_cpu))),
        }
    }

    /// The growth up to `after` per message of `handled`, as
    /// worker_processes records it; None when the table's counters could
    /// not be read.
    pub(crate) fn processes(&self, after: &DbSnapshot, handled: u64) -> Option<ProcessesServer> {
        let per = |v: u64| v as f64 / handled.max(1) as f64;
        let us = |d: Duration| d.as_secs_f64() * 1e6 / handled.max(1) as f64;
        let d = self.growth(after)?;
        Some(ProcessesServer {
            index_rows_per_msg: per(d[0]),
            rows_updated: d[1],
            rows_deleted: d[2],
            buffers_per_msg: per(d[3]),
            transactions_per_msg: per(d[4]),
            server_cpu_us_per_msg: self
                .cpu
                .zip(after.cpu)
                .map(|(a, b)| us(b.saturating_sub(a))),
            workers_cpu_us_per_msg: Some(us(after.children_cpu.saturating_sub(self.children_cpu))),
        })
    }
}

/// The row of `sql` on the statistics of `q`'s table (its `$1` the
/// table's name), from a fresh statistics snapshot; None when it cannot
/// be read.
async fn table_stats(ctx: &Ctx, sql: &str, q: &QueueName) -> Option<tokio_postgres::Row> {
    // Table counters reach the shared statistics when a backend's
    // transaction ends, at most once a second per backend: a fresh
    // snapshot sees the others' latest flush.
    let _ = ctx
        .admin
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await;
    let table = format!("q_{}", q.as_str());
    ctx.admin.query_opt(sql, &[&table]).await.ok()?
}

/// The queue table's `n_dead_tup`.
async fn dead_tuples(ctx: &Ctx, q: &QueueName) -> Option<u64> {
    let sql = "SELECT n_dead_tup::int8 FROM pg_stat_user_tables \
               WHERE schemaname = 'pgmq' AND relname = $1";
    let row = table_stats(ctx, sql, q).await?;
    Some(row.get::<_, i64>(0).max(0) as u64)
}

/// Clock ticks per second of `/proc/<pid>/stat` (USER_HZ, 100 on Linux).
const USER_HZ: u64 = 100;

/// CPU used so far by the whole PostgreSQL cluster `admin` is connected
/// to, when it runs on this host: the postmaster's own time, the time of
/// the children it reaped (backends that ended), and the time of its live
/// children. None when the server's process is not visible here.
pub(crate) async fn cluster_cpu(admin: &tokio_postgres::Client) -> Option<Duration> {
    let backend: i32 = admin
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .ok()?
        .get(0);
    let postmaster = stat_fields(backend as u32).await?.ppid;
    let comm = tokio::fs::read_to_string(format!("/proc/{postmaster}/comm"))
        .await
        .ok()?;
    if !comm.trim().starts_with("postgres") {
        return None;
    }
    let pm = stat_fields(postmaster).await?;
    let mut ticks = pm.own + pm.reaped;
    let mut dir = tokio::fs::read_dir("/proc").await.ok()?;
    while let Ok(Some(e)) = dir.next_entry().await {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(s) = stat_fields(pid).await {
            if s.ppid == postmaster {
                ticks += s.own;
            }
        }
    }
    Some(Duration::from_millis(ticks * 1000 / USER_HZ))
}

/// The fields of `/proc/<pid>/stat` this section reads.
struct StatFields {
    ppid: u32,
    /// utime + stime, ticks.
    own: u64,
    /// cutime + cstime (children waited for), ticks.
    reaped: u64,
}

async fn stat_fields(pid: u32) -> Option<StatFields> {
    let text = tokio::fs::read_to_string(format!("/proc/{pid}/stat"))
        .await
        .ok()?;
    parse_stat(&text)
}

/// Parses `/proc/<pid>/stat`: the fields after the command name, which
/// is in parentheses and may hold spaces.
fn parse_stat(text: &str) -> Option<StatFields> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
    let num = |i: usize| f.get(i)?.parse::<u64>().ok();
    Some(StatFields {
        ppid: f.get(1)?.parse().ok()?,
        own: num(11)? + num(12)?,
        reaped: num(13)? + num(14)?,
    })
}

/// The database clock minus this host's clock, microseconds: from the
/// `clock_timestamp()` read with the shortest of five round trips, taken as
/// read at that round trip's midpoint (so within half of it).
pub async fn db_clock_offset_us(admin: &tokio_postgres::Client) -> Result<i64> {
    let stmt = admin.prepare("SELECT clock_timestamp()").await?;
    let mut best: Option<(i64, i64)> = None;
    for _ in 0..5 {
        let before = chrono::Utc::now();
        let db: chrono::DateTime<chrono::Utc> = admin.query_one(&stmt, &[]).await?.get(0);
        let after = chrono::Utc::now();
        let rtt = (after - before).num_microseconds().unwrap_or(i64::MAX);
        let mid = before + (after - before) / 2;
        let offset = (db - mid).num_microseconds().unwrap_or(0);
        if best.is_none_or(|(r, _)| rtt < r) {
            best = Some((rtt, offset));
        }
    }
    Ok(best.map_or(0, |(_, o)| o))
}

/// The database's counters over a measured window of one queue: a
/// snapshot at its start, its dead tuples sampled during it, a snapshot at
/// its end.
pub(crate) struct ServerWindow {
    before: DbSnapshot,
    dead: Vec<u64>,
}

impl ServerWindow {
    /// Opens the window on `q`: its first snapshot.
    pub(crate) async fn open(ctx: &Ctx, q: &QueueName) -> ServerWindow {
        ServerWindow {
            before: DbSnapshot::read(ctx, q).await,
            dead: Vec::new(),
        }
    }

    /// Samples the queue table's dead tuples.
    pub(crate) async fn sample(&mut self, ctx: &Ctx, q: &QueueName) {
        if let Some(d) = dead_tuples(ctx, q).await {
            self.dead.push(d);
        }
    }

    /// Closes the window: the counters' growth per message of `completed`,
    /// the dead tuples' samples and their peak.
    pub(crate) async fn close(self, ctx: &Ctx, q: &QueueName, completed: u64) -> SteadyServer {
        let after = DbSnapshot::read(ctx, q).await;
        let mut server = self.before.per_msg(&after, completed);
        server.dead_tuples_peak = self.dead.iter().copied().max();
        server.dead_tuples_per_s = self.dead;
        server
    }
}

/// A tick every second, the first a second from now.
pub(crate) fn every_second() -> tokio::time::Interval {
    tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(1),
        Duration::from_secs(1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat_after_a_name_with_spaces() {
        let text = "42 (postgres: a b) S 7 42 42 0 -1 4194560 100 0 0 0 250 30 5 6 20 0 1 0";
        let s = parse_stat(text).unwrap();
        assert_eq!((s.ppid, s.own, s.reaped), (7, 280, 11));
    }
}
