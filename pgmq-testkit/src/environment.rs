//! What both the benchmark document and the fault suite's report record
//! about where a run happened: the SDK build ([`Sdk`], [`sdk`]), the compiler
//! and profile ([`Build`], [`build`]), the server ([`Database`],
//! [`database`]) and its durability settings ([`Durability`],
//! [`durability`]). pgmq-bench re-exports all of it from its `document` and
//! `metadata` modules; the benchmark.v1 JSON is unchanged.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The error of the functions that query the server.
pub type Result<T, E = tokio_postgres::Error> = std::result::Result<T, E>;

async fn read(path: &str) -> Option<String> {
    tokio::fs::read_to_string(path).await.ok()
}

/// Durable or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DurabilityClass {
    /// fsync, synchronous_commit, full_page_writes and autovacuum on; logged queues.
    Durable,
    /// Any of them off, or unlogged queues: not comparable with durable results.
    NonDurable,
}

/// The durability settings read from the server.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Durability {
    /// The class.
    pub class: DurabilityClass,
    /// True only for durable results; `compare` refuses to mix the two classes.
    pub comparable: bool,
    /// fsync, synchronous_commit, full_page_writes, autovacuum as the server reported them.
    pub settings: BTreeMap<String, String>,
    /// Whether the queues were created unlogged (`--unlogged`).
    pub unlogged_queues: bool,
    /// Why the result is non-durable (empty when durable).
    pub reasons: Vec<String>,
}

/// The SDK build.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Sdk {
    /// Version of pgmq-client / pgmq-worker / pgmq-bench (one workspace version).
    pub version: String,
    /// `git rev-parse HEAD` at build time, if the source was a git checkout.
    pub git_commit: Option<String>,
    /// Whether tracked files differed from that commit at build time.
    pub git_dirty: Option<bool>,
}

/// Compiler and profile.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Build {
    /// `debug` or `release` (debug assertions off).
    pub profile: String,
    /// `rustc -V` at build time.
    pub rustc: Option<String>,
    /// Target triple.
    pub target: Option<String>,
    /// The flags rustc was given for this crate (`CARGO_ENCODED_RUSTFLAGS` at
    /// build time, separated by spaces; empty when none). Null when the
    /// build did not say (and in older documents).
    #[serde(default)]
    pub rustflags: Option<String>,
    /// The profile's `opt-level` at build time (`OPT_LEVEL`: `0`–`3`, `s`, `z`).
    #[serde(default)]
    pub opt_level: Option<String>,
    /// The profile's `debug` setting at build time (`DEBUG`: `true`/`false`).
    #[serde(default)]
    pub debug_info: Option<String>,
}

/// The server.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Database {
    /// The DSN with the password removed.
    pub dsn: String,
    /// Whether `--local` started a throwaway cluster for this run.
    pub local_cluster: bool,
    /// `SELECT version()`.
    pub server_version: String,
    /// `server_version_num`.
    pub server_version_num: i32,
    /// The PGMQ version found.
    pub pgmq_version: String,
    /// `extension` or `sql_only`.
    pub pgmq_install: String,
    /// The `pg_settings` rows named in
    /// [`RECORDED_SETTINGS`] (an
    /// allow-list of performance and durability settings), whatever their
    /// source; no other setting.
    pub settings: Vec<Setting>,
    /// The storage under the server's data directory (absent in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<Storage>,
    /// `SELECT 1` round trips on one connection (absent in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select1_round_trip: Option<RoundTrip>,
}

/// The filesystem and block device holding the server's data directory,
/// read on this host; each field null when unknown, with `reason` saying why.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Storage {
    /// Filesystem type of the mount holding the data directory (`ext4`, `xfs`, `overlay`, ...).
    pub filesystem: Option<String>,
    /// The block device under it (its name in /sys/block, e.g. `nvme0n1`,
    /// `vda`; the whole disk when the filesystem is on a partition).
    pub block_device: Option<String>,
    /// The bus the device hangs off, from its sysfs path: `nvme`, `virtio`,
    /// `scsi`, `ata`, `usb`, `mmc`, or `virtual` (device mapper, zram, loop, md).
    pub device_bus: Option<String>,
    /// `/sys/block/<dev>/queue/rotational`: true for a spinning disk. A
    /// virtual disk reports what its driver says, not what is underneath.
    pub rotational: Option<bool>,
    /// Why some of the above are null (server not on this host, data
    /// directory not readable, no block device under the filesystem).
    pub reason: Option<String>,
}

/// Round trips of a trivial prepared statement, microseconds.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct RoundTrip {
    /// Timed round trips (after the warm-up ones).
    pub samples: u32,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Mean.
    pub mean_us: f64,
}

/// One row of `pg_settings`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Setting {
    /// Name.
    pub name: String,
    /// Value, in `unit`.
    pub setting: String,
    /// Unit, if any.
    pub unit: Option<String>,
    /// Where it was set (configuration file, client, ...).
    pub source: String,
}

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
        git_commit: option_env!("PGMQ_TESTKIT_GIT_COMMIT").map(str::to_owned),
        git_dirty: option_env!("PGMQ_TESTKIT_GIT_DIRTY").map(|d| d == "true"),
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
        rustc: option_env!("PGMQ_TESTKIT_RUSTC").map(str::to_owned),
        target: option_env!("PGMQ_TESTKIT_TARGET").map(str::to_owned),
        rustflags: option_env!("PGMQ_TESTKIT_RUSTFLAGS").map(str::to_owned),
        opt_level: option_env!("PGMQ_TESTKIT_OPT_LEVEL").map(str::to_owned),
        debug_info: option_env!("PGMQ_TESTKIT_DEBUG").map(str::to_owned),
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
        storage: Some(storage(admin).await),
        select1_round_trip: Some(select1_round_trip(admin).await?),
    })
}

/// One line of /proc/self/mountinfo: the mount point, the device number,
/// the filesystem type and the mount source.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    point: String,
    dev: String,
    fstype: String,
    source: String,
}

/// Mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], oct) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount holding `path` (absolute, symlinks resolved): the one whose
/// mount point is the longest whole-component prefix of it; the last such
/// line wins, as a later mount over the same point hides the earlier.
fn mount_of(mountinfo: &str, path: &str) -> Option<Mount> {
    let mut best: Option<Mount> = None;
    for line in mountinfo.lines() {
        let (left, right) = match line.split_once(" - ") {
            Some(x) => x,
            None => continue,
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        let (Some(dev), Some(point), Some(fstype), Some(source)) =
            (l.get(2), l.get(4), r.first(), r.get(1))
        else {
            continue;
        };
        let point = unescape_octal(point);
        let under = point == "/"
            || path == point
            || path
                .strip_prefix(point.as_str())
                .is_some_and(|rest| rest.starts_with('/'));
        if under && best.as_ref().is_none_or(|b| point.len() >= b.point.len()) {
            best = Some(Mount {
                point,
                dev: (*dev).to_owned(),
                fstype: (*fstype).to_owned(),
                source: unescape_octal(source),
            });
        }
    }
    best
}

/// The bus of a block device, from its resolved sysfs path.
fn device_bus(sysfs_path: &str) -> Option<&'static str> {
    let p = sysfs_path;
    [
        ("/devices/virtual/", "virtual"),
        ("/nvme", "nvme"),
        ("/virtio", "virtio"),
        ("/usb", "usb"),
        ("/mmc", "mmc"),
        ("/ata", "ata"),
        ("/host", "scsi"),
    ]
    .into_iter()
    .find_map(|(needle, bus)| p.contains(needle).then_some(bus))
}

/// The whole disk's sysfs directory for a block device's sysfs link (a
/// partition's parent; the device itself otherwise).
async fn disk_dir(link: &std::path::Path) -> Option<std::path::PathBuf> {
    let dir = tokio::fs::canonicalize(link).await.ok()?;
    if tokio::fs::metadata(dir.join("partition")).await.is_ok() {
        return dir.parent().map(std::path::Path::to_path_buf);
    }
    Some(dir)
}

/// Where the server keeps its data: the filesystem and block device under
/// `SHOW data_directory`, read on this host. Only a server on this host can
/// be looked at: one reached over a non-loopback address, or whose data
/// directory does not exist here, gets nulls and the reason. The path itself
/// is not recorded.
pub async fn storage(admin: &tokio_postgres::Client) -> Storage {
    let why = |reason: &str| Storage {
        reason: Some(reason.to_owned()),
        ..Storage::default()
    };
    // NULL over a Unix socket; the server's own address over TCP.
    let addr: Option<String> = match admin
        .query_one("SELECT host(inet_server_addr())", &[])
        .await
    {
        Ok(r) => r.get(0),
        Err(_) => return why("inet_server_addr() failed"),
    };
    if let Some(a) = &addr {
        let loopback = a
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            return why("server reached over a non-loopback address: its data directory is not on this host");
        }
    }
    let dir: String = match admin.query_one("SHOW data_directory", &[]).await {
        Ok(r) => r.get(0),
        Err(_) => return why(
            "data_directory not readable by this role (superuser or pg_read_all_settings needed)",
        ),
    };
    // The directory itself is usually closed to other users (mode 0700); its
    // existence is visible, and the mount lookup only needs the path.
    let path =
        match tokio::fs::canonicalize(&dir).await {
            Ok(p) => p.to_string_lossy().into_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return why(
                "data directory not found on this host (server in another container or machine)",
            ),
            Err(_) => dir,
        };
    let Some(mountinfo) = read("/proc/self/mountinfo").await else {
        return why("/proc/self/mountinfo not readable");
    };
    let Some(m) = mount_of(&mountinfo, &path) else {
        return why("no mount found for the data directory");
    };
    let mut out = Storage {
        filesystem: Some(m.fstype.clone()),
        ..Storage::default()
    };
    let mut disk = disk_dir(std::path::Path::new(&format!("/sys/dev/block/{}", m.dev))).await;
    if disk.is_none() && m.source.starts_with("/dev/") {
        // Filesystems with devices of their own numbering (btrfs) name the
        // real one as their source.
        if let Ok(src) = tokio::fs::canonicalize(&m.source).await {
            if let Some(name) = src.file_name() {
                let link = std::path::Path::new("/sys/class/block").join(name);
                disk = disk_dir(&link).await;
            }
        }
    }
    let Some(disk) = disk else {
        out.reason = Some(format!(
            "the {} filesystem has no block device of its own",
            m.fstype
        ));
        return out;
    };
    out.block_device = disk.file_name().map(|n| n.to_string_lossy().into_owned());
    out.device_bus = device_bus(&disk.to_string_lossy()).map(str::to_owned);
    out.rotational = read(&format!("{}/queue/rotational", disk.display()))
        .await
        .and_then(|v| match v.trim() {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        });
    if out.rotational.is_none() {
        out.reason = Some("queue/rotational not readable".to_owned());
    }
    out
}

/// Warm-up round trips before [`select1_round_trip`] times any.
pub const ROUND_TRIP_WARMUP: u32 = 20;
/// Round trips [`select1_round_trip`] times.
pub const ROUND_TRIP_SAMPLES: u32 = 200;

/// Median, 99th percentile (nearest rank) and mean of `us`, to 0.1 µs.
fn round_trip_summary(mut us: Vec<f64>) -> Option<RoundTrip> {
    if us.is_empty() {
        return None;
    }
    us.sort_by(f64::total_cmp);
    let rank = |q: f64| us[((q * us.len() as f64).ceil() as usize).clamp(1, us.len()) - 1];
    // A tenth of a microsecond: finer digits are timer noise.
    let tenth = |v: f64| (v * 10.0).round() / 10.0;
    Some(RoundTrip {
        samples: us.len() as u32,
        p50_us: tenth(rank(0.50)),
        p99_us: tenth(rank(0.99)),
        mean_us: tenth(us.iter().sum::<f64>() / us.len() as f64),
    })
}

/// The network and protocol floor under every figure: [`ROUND_TRIP_SAMPLES`]
/// executions of a prepared `SELECT 1` on `admin`, one at a time, after
/// [`ROUND_TRIP_WARMUP`] untimed ones.
pub async fn select1_round_trip(admin: &tokio_postgres::Client) -> Result<RoundTrip> {
    let stmt = admin.prepare("SELECT 1").await?;
    for _ in 0..ROUND_TRIP_WARMUP {
        admin.query_one(&stmt, &[]).await?;
    }
    let mut us = Vec::with_capacity(ROUND_TRIP_SAMPLES as usize);
    for _ in 0..ROUND_TRIP_SAMPLES {
        let t = std::time::Instant::now();
        admin.query_one(&stmt, &[]).await?;
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(round_trip_summary(us).expect("ROUND_TRIP_SAMPLES is not zero"))
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
/// assert!(pgmq_testkit::environment::classify(s.clone(), false).comparable);
/// assert!(!pgmq_testkit::environment::classify(s.clone(), true).comparable);
/// s.insert("synchronous_commit".into(), "off".into());
/// assert!(!pgmq_testkit::environment::classify(s, false).comparable);
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
    fn finds_the_mount_of_a_path() {
        let mi = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
                  30 27 0:25 / /var/lib rw - tmpfs tmpfs rw\n\
                  31 30 259:2 / /var/lib/postgresql rw - xfs /dev/nvme0n1p2 rw\n\
                  32 27 0:26 / /data\\040dir rw - btrfs /dev/sdb1 rw\n";
        let m = mount_of(mi, "/var/lib/postgresql/15/main").unwrap();
        assert_eq!((m.fstype.as_str(), m.dev.as_str()), ("xfs", "259:2"));
        assert_eq!(m.source, "/dev/nvme0n1p2");
        // A whole-component prefix only: /var/lib/postgresql2 is not under it.
        assert_eq!(
            mount_of(mi, "/var/lib/postgresql2").unwrap().fstype,
            "tmpfs"
        );
        assert_eq!(mount_of(mi, "/tmp/pg").unwrap().fstype, "ext4");
        // Escaped spaces in mount points.
        assert_eq!(mount_of(mi, "/data dir/pg").unwrap().fstype, "btrfs");
    }

    #[test]
    fn names_the_bus_of_a_block_device() {
        for (path, bus) in [
            (
                "/sys/devices/pci0000:00/0000:00:02.0/virtio1/block/vda",
                "virtio",
            ),
            (
                "/sys/devices/pci0000:00/0000:00:1d.0/0000:3d:00.0/nvme/nvme0/nvme0n1",
                "nvme",
            ),
            ("/sys/devices/virtual/block/dm-0", "virtual"),
            (
                "/sys/devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/block/sda",
                "ata",
            ),
            (
                "/sys/devices/pci0000:00/0000:00:10.0/host2/target2:0:0/2:0:0:0/block/sdb",
                "scsi",
            ),
        ] {
            assert_eq!(device_bus(path), Some(bus), "{path}");
        }
        assert_eq!(device_bus("/sys/devices/platform/foo/block/x"), None);
    }

    #[test]
    fn summarises_round_trips() {
        let us: Vec<f64> = (1..=200).map(f64::from).collect();
        let r = round_trip_summary(us).unwrap();
        assert_eq!((r.samples, r.p50_us, r.p99_us), (200, 100.0, 198.0));
        assert!((r.mean_us - 100.5).abs() < 1e-9);
        let r = round_trip_summary(vec![31.998, 62.342, 50.6893]).unwrap();
        assert_eq!((r.p50_us, r.p99_us, r.mean_us), (50.7, 62.3, 48.3));
        assert!(round_trip_summary(Vec::new()).is_none());
    }

    #[test]
    fn build_records_profile_settings() {
        let b = build();
        // Set by build.rs from what cargo gave it, whatever the profile.
        assert!(b.opt_level.is_some() && b.debug_info.is_some(), "{b:?}");
        assert!(b.rustflags.is_some(), "{b:?}");
    }

    #[test]
    fn missing_setting_is_non_durable() {
        let d = classify(BTreeMap::new(), false);
        assert_eq!(d.class, DurabilityClass::NonDurable);
        assert_eq!(d.reasons.len(), 4);
    }
}
