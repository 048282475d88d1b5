//! What the document records about the build, the machine and the server.

use std::collections::BTreeMap;

use crate::document::{Build, Database, Durability, DurabilityClass, Host, Sdk, Setting};
use crate::error::Result;

/// The four settings that decide whether a result is durable.
pub const DURABILITY_SETTINGS: [&str; 4] = [
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "autovacuum",
];

/// The SDK version and git commit compiled into this binary.
pub fn sdk() -> Sdk {
    Sdk {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        git_commit: option_env!("PGMQ_BENCH_GIT_COMMIT").map(str::to_owned),
        git_dirty: option_env!("PGMQ_BENCH_GIT_DIRTY").map(|d| d == "true"),
    }
}

/// Profile, rustc and target of this binary.
pub fn build() -> Build {
    Build {
        profile: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
        .to_owned(),
        rustc: option_env!("PGMQ_BENCH_RUSTC").map(str::to_owned),
        target: option_env!("PGMQ_BENCH_TARGET").map(str::to_owned),
    }
}

async fn read(path: &str) -> Option<String> {
    tokio::fs::read_to_string(path).await.ok()
}

/// The 1-minute load average.
pub async fn load_average() -> Option<f64> {
    read("/proc/loadavg")
        .await?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn os_release_pretty(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let v = l.strip_prefix("PRETTY_NAME=")?;
        Some(v.trim_matches('"').to_owned())
    })
}

fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "model name").then(|| v.trim().to_owned())
    })
}

fn mem_total(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let v = l.strip_prefix("MemTotal:")?;
        let kb: u64 = v.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb * 1024)
    })
}

/// The machine: OS, kernel, CPU, memory, cgroup limits, load.
pub async fn host() -> Host {
    let cgroup_dir = read("/proc/self/cgroup").await.and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("0::").map(|p| p.trim().to_owned()))
    });
    let (cpu_max, mem_max) = match &cgroup_dir {
        Some(dir) => (
            read(&format!("/sys/fs/cgroup{dir}/cpu.max")).await,
            read(&format!("/sys/fs/cgroup{dir}/memory.max")).await,
        ),
        None => (None, None),
    };
    Host {
        os: std::env::consts::OS.to_owned(),
        os_release: read("/etc/os-release")
            .await
            .as_deref()
            .and_then(os_release_pretty),
        kernel: read("/proc/sys/kernel/osrelease")
            .await
            .map(|s| s.trim().to_owned()),
        arch: std::env::consts::ARCH.to_owned(),
        cpu_model: read("/proc/cpuinfo").await.as_deref().and_then(cpu_model),
        cpu_count: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
        memory_bytes: read("/proc/meminfo").await.as_deref().and_then(mem_total),
        cgroup_cpu_max: cpu_max.map(|s| s.trim().to_owned()),
        cgroup_memory_max: mem_max.map(|s| s.trim().to_owned()),
        load_average_start: load_average().await,
        load_average_end: None,
    }
}

/// The only server settings a document records: those that decide how fast
/// or how durable a run is, and how the server reads its input. An
/// allow-list, not a deny-list: a setting not named here (an extension's or
/// an application's custom `app.*` value, a connection string, a key file,
/// a path) never reaches the document, whatever its name or source.
pub const RECORDED_SETTINGS: &[&str] = &[
    // Memory.
    "shared_buffers",
    "work_mem",
    "maintenance_work_mem",
    "autovacuum_work_mem",
    "temp_buffers",
    "effective_cache_size",
    "huge_pages",
    // Connections and parallelism.
    "max_connections",
    "max_worker_processes",
    "max_parallel_workers",
    "max_parallel_workers_per_gather",
    "max_parallel_maintenance_workers",
    // Durability and the write-ahead log.
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_level",
    "wal_buffers",
    "wal_compression",
    "wal_sync_method",
    "wal_writer_delay",
    "wal_writer_flush_after",
    "commit_delay",
    "commit_siblings",
    "max_wal_size",
    "min_wal_size",
    "checkpoint_timeout",
    "checkpoint_completion_target",
    "data_checksums",
    // Autovacuum (PGMQ's tables churn: it decides their bloat).
    "autovacuum",
    "autovacuum_max_workers",
    "autovacuum_naptime",
    "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_insert_threshold",
    "autovacuum_vacuum_insert_scale_factor",
    "autovacuum_analyze_threshold",
    "autovacuum_analyze_scale_factor",
    "autovacuum_vacuum_cost_delay",
    "autovacuum_vacuum_cost_limit",
    "vacuum_cost_delay",
    "vacuum_cost_limit",
    // Background writer.
    "bgwriter_delay",
    "bgwriter_lru_maxpages",
    "bgwriter_lru_multiplier",
    // Planner and I/O.
    "jit",
    "random_page_cost",
    "seq_page_cost",
    "effective_io_concurrency",
    "default_statistics_target",
    // What is loaded, and how text and time are read.
    "shared_preload_libraries",
    "server_encoding",
    "TimeZone",
    "ssl",
];

/// Whether `name` is one of the [`RECORDED_SETTINGS`] (exactly: as
/// `pg_settings` spells it).
pub fn is_recorded(name: &str) -> bool {
    RECORDED_SETTINGS.contains(&name)
}

/// The server: version, PGMQ, and the [`RECORDED_SETTINGS`] (whatever their
/// source, defaults included; nothing else from `pg_settings`).
pub async fn database(
    admin: &tokio_postgres::Client,
    dsn_redacted: String,
    local_cluster: bool,
    pgmq: Option<&pgmq_client::PgmqInstall>,
) -> Result<Database> {
    let row = admin
        .query_one(
            "SELECT version(), current_setting('server_version_num')::int",
            &[],
        )
        .await?;
    let names: Vec<&str> = RECORDED_SETTINGS.to_vec();
    let rows = admin
        .query(
            "SELECT name, setting, unit, source FROM pg_catalog.pg_settings \
             WHERE name = ANY($1) ORDER BY name",
            &[&names],
        )
        .await?;
    let settings = rows
        .iter()
        .map(|r| Setting {
            name: r.get(0),
            setting: r.get(1),
            unit: r.get(2),
            source: r.get(3),
        })
        // Checked again on the way out: what the server returned, not what
        // was asked for, is what would be written.
        .filter(|s| is_recorded(&s.name))
        .collect();
    let (pgmq_version, pgmq_install) = match pgmq {
        Some(i) => (
            i.version.to_string(),
            match i.mode {
                pgmq_client::InstallMode::Extension => "extension",
                _ => "sql_only",
            }
            .to_owned(),
        ),
        None => ("unknown".to_owned(), "unknown".to_owned()),
    };
    Ok(Database {
        dsn: dsn_redacted,
        local_cluster,
        server_version: row.get(0),
        server_version_num: row.get(1),
        pgmq_version,
        pgmq_install,
        settings,
    })
}

/// Reads the durability settings and classifies the run.
pub async fn durability(admin: &tokio_postgres::Client, unlogged: bool) -> Result<Durability> {
    let names: Vec<&str> = DURABILITY_SETTINGS.to_vec();
    let rows = admin
        .query(
            "SELECT name, setting FROM pg_settings WHERE name = ANY($1)",
            &[&names],
        )
        .await?;
    let settings: BTreeMap<String, String> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    Ok(classify(settings, unlogged))
}

/// Pure part of [`durability`]: any of the four settings off (or missing), or
/// unlogged queues, make the result non-durable and not comparable.
///
/// ```
/// use std::collections::BTreeMap;
/// let mut s: BTreeMap<String, String> = ["fsync", "synchronous_commit", "full_page_writes", "autovacuum"]
///     .iter().map(|n| (n.to_string(), "on".to_string())).collect();
/// assert!(pgmq_bench::metadata::classify(s.clone(), false).comparable);
/// assert!(!pgmq_bench::metadata::classify(s.clone(), true).comparable);
/// s.insert("synchronous_commit".into(), "off".into());
/// assert!(!pgmq_bench::metadata::classify(s, false).comparable);
/// ```
pub fn classify(settings: BTreeMap<String, String>, unlogged: bool) -> Durability {
    let mut reasons = Vec::new();
    for name in DURABILITY_SETTINGS {
        match settings.get(name).map(String::as_str) {
            Some("off") => reasons.push(format!("{name} is off")),
            Some(_) => {}
            None => reasons.push(format!("{name} could not be read")),
        }
    }
    if unlogged {
        reasons.push("queues were created unlogged (--unlogged)".to_owned());
    }
    let class = if reasons.is_empty() {
        DurabilityClass::Durable
    } else {
        DurabilityClass::NonDurable
    };
    Durability {
        class,
        comparable: class == DurabilityClass::Durable,
        settings,
        unlogged_queues: unlogged,
        reasons,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_files() {
        assert_eq!(
            os_release_pretty("NAME=x\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n")
                .as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(
            cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n").as_deref(),
            Some("AMD EPYC 7B13")
        );
        assert_eq!(mem_total("MemTotal:       1024 kB\n"), Some(1024 * 1024));
    }

    #[test]
    fn only_allow_listed_settings_are_recorded() {
        for name in ["shared_buffers", "fsync", "TimeZone", "autovacuum_naptime"] {
            assert!(is_recorded(name), "{name}");
        }
        for name in [
            "primary_conninfo",
            "ssl_passphrase_command",
            "ssl_key_file",
            "app.api_token",
            "data_directory",
            "config_file",
            "archive_command",
            "search_path",
            "application_name",
            "timezone",
        ] {
            assert!(!is_recorded(name), "{name}");
        }
        for name in DURABILITY_SETTINGS {
            assert!(is_recorded(name), "{name}");
        }
    }

    #[test]
    fn missing_setting_is_non_durable() {
        let d = classify(BTreeMap::new(), false);
        assert_eq!(d.class, DurabilityClass::NonDurable);
        assert_eq!(d.reasons.len(), 4);
    }
}
