//! The `pgmq-bench.benchmark.v1` document: the types the binary writes and
//! `report`/`compare`/`check` read. `docs/benchmark.v1.schema.json` is
//! generated from these types and the sections' run types
//! (`sections::schema`); a test validates real output against it.
//!
//! Layout: [`Document::figures`] is a flat list of every reported number
//! (median, min, max, the raw value of each measured run, its unit, which
//! direction is better and its definition); [`Document::sections`] keeps each
//! run's full record (warm-up runs included, flagged); everything that states
//! the conditions is in [`Document::metadata`], [`Document::durability`] and
//! [`Document::protocol`].

use std::collections::BTreeMap;
use std::marker::PhantomData;

use chrono::{DateTime, Utc};
use clap::ValueEnum;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub use crate::stats::{IntervalPercentiles, Percentiles};

// What the fault suite's report records too (the SDK build, the compiler,
// the server, its durability): defined in pgmq-testkit, the same JSON here.
pub use pgmq_testkit::environment::{
    Build, Database, Durability, DurabilityClass, RoundTrip, Sdk, Setting, Storage,
};

/// The value of [`Document::schema`].
pub const SCHEMA: &str = "pgmq-bench.benchmark.v1";

/// One benchmark invocation's result.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Document {
    /// Always [`SCHEMA`].
    #[schemars(extend("const" = SCHEMA))]
    pub schema: String,
    /// Whether the run passed its correctness checks, and why not.
    pub outcome: RunOutcome,
    /// Durability settings and whether this result may be compared with durable ones.
    pub durability: Durability,
    /// Versions, machine, database, workload, command line.
    pub metadata: Metadata,
    /// Warm-up, repetitions, statistic, memory and vacuum method.
    pub protocol: Protocol,
    /// Every reported number, with its runs, unit and definition.
    pub figures: Vec<Figure>,
    /// Each run's full record, per section.
    pub sections: Sections,
    /// Peak resident memory per section and overall.
    pub memory: MemorySummary,
    /// The performance targets of the worker runtime, evaluated on this run.
    pub targets: Vec<TargetCheck>,
    /// In an aggregate document (`pgmq-bench aggregate`): every invocation's
    /// own document, whole. Its figures then hold one value per invocation
    /// (that invocation's median) and its `sections` are empty. Absent in the
    /// document of one invocation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub invocations: Vec<serde_json::Value>,
}

impl Document {
    /// Parses a document, refusing other schemas.
    pub fn from_json(text: &str, what: &str) -> Result<Document> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| Error::json(what, e))?;
        match v.get("schema").and_then(|s| s.as_str()) {
            Some(SCHEMA) => {}
            Some(other) => {
                return Err(Error::Refused(format!(
                    "{what} has schema {other:?}, expected {SCHEMA:?}"
                )))
            }
            None => return Err(Error::Refused(format!("{what} has no \"schema\" field"))),
        }
        serde_json::from_value(v).map_err(|e| Error::json(what, e))
    }

    /// Reads and parses a document file.
    pub async fn read(path: &std::path::Path) -> Result<Document> {
        let what = path.display().to_string();
        let text = tokio::fs::read_to_string(path)
            .await
            .map_err(|e| Error::io(format!("reading {what}"), e))?;
        Document::from_json(&text, &what)
    }

    /// The figure with this id.
    pub fn figure(&self, id: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.id == id)
    }

    /// The run's profile: the one recorded, else (an older document) the
    /// one its command line names, the full one when it names none.
    pub fn profile(&self) -> String {
        if let Some(p) = &self.metadata.workload.profile {
            return p.clone();
        }
        ["quick", "standard", "long"]
            .into_iter()
            .find(|p| self.metadata.command.iter().any(|a| *a == format!("--{p}")))
            .unwrap_or("full")
            .to_owned()
    }
}

/// The schema of [`Summary`], `pgmq-bench summary`'s output.
pub const SUMMARY_SCHEMA: &str = "pgmq-bench.summary.v1";

/// A document's summary: small enough to attach to a changelog or a pull
/// request (no runs, no sections, no invocations), and enough to read the
/// results and compare them by eye. The full document stays the record.
/// `docs/benchmark-summary.v1.schema.json` describes it.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Summary {
    /// Always [`SUMMARY_SCHEMA`].
    pub schema: &'static str,
    /// The schema of the document it summarizes.
    pub source_schema: String,
    /// When the run started and ended.
    pub started_at: DateTime<Utc>,
    /// When the run ended.
    pub finished_at: DateTime<Utc>,
    /// The SDK's version and commit.
    pub sdk: Sdk,
    /// The benchmark's profile ([`Document::profile`]).
    pub profile: String,
    /// Measured rounds (per invocation in an aggregate).
    pub repeat: u32,
    /// Invocations merged, in an aggregate document; null otherwise.
    pub invocations: Option<u32>,
    /// The compiler and build profile.
    pub build: Build,
    /// The server and PGMQ versions.
    pub database: SummaryDatabase,
    /// The machine.
    pub host: Host,
    /// Whether the run passed its checks, and why not.
    pub outcome: RunOutcome,
    /// Whether the result may be compared with durable ones.
    pub durable_comparable: bool,
    /// The ids of the headline figures the document has, in the order of
    /// `summary --markdown`'s rows
    /// (`report::summary::HEADLINE`).
    pub headline: Vec<String>,
    /// Every figure: id, unit, direction, median, range and run count.
    pub figures: Vec<SummaryFigure>,
    /// The performance targets as evaluated in the run.
    pub targets: Vec<TargetCheck>,
}

/// The server of a [`Summary`].
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct SummaryDatabase {
    /// `SELECT version()`.
    pub server_version: String,
    /// `server_version_num`.
    pub server_version_num: i32,
    /// The PGMQ version.
    pub pgmq_version: String,
    /// `extension` or `sql_only`.
    pub pgmq_install: String,
}

/// One figure of a [`Summary`].
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct SummaryFigure {
    /// The figure's stable key.
    pub id: String,
    /// Its short label.
    pub label: String,
    /// Its unit.
    pub unit: String,
    /// Which direction is an improvement.
    pub better: Better,
    /// Median over the measured runs (per-invocation medians in an aggregate).
    pub median: f64,
    /// Smallest measured run.
    pub min: f64,
    /// Largest measured run.
    pub max: f64,
    /// How many runs the median is over.
    pub runs: usize,
}

/// What each handler call does besides recording its id.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize, schemars::JsonSchema,
)]
#[value(rename_all = "kebab-case")]
#[serde(rename_all = "kebab-case")]
pub enum HandlerKind {
    /// Nothing (plus `--handler-work-ms`).
    Empty,
    /// Inserts one row into `pgmq_bench_handler_sink` of the same database,
    /// through a pool of its own (plus `--handler-work-ms`).
    DbWrite,
    /// The same insert, made by a transactional handler in the worker's
    /// transaction that also deletes the message (transactional
    /// completion), on the SDK pool (raised to at least the largest
    /// worker's handlers + 4 connections, which its transactions need).
    DbWriteTx,
}

impl HandlerKind {
    /// The name in the document.
    pub fn name(self) -> &'static str {
        match self {
            HandlerKind::Empty => "empty",
            HandlerKind::DbWrite => "db-write",
            HandlerKind::DbWriteTx => "db-write-tx",
        }
    }

    /// The kind with this [`name`](HandlerKind::name), if any.
    ///
    /// ```
    /// use pgmq_bench::document::HandlerKind;
    /// assert_eq!(HandlerKind::from_name("db-write"), Some(HandlerKind::DbWrite));
    /// assert_eq!(HandlerKind::from_name("slow"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<HandlerKind> {
        HandlerKind::value_variants()
            .iter()
            .copied()
            .find(|k| k.name() == name)
    }
}

/// How the workers' claimers read the queue (`--claim-reads`): the
/// worker's [`ClaimReads`](pgmq_worker::ClaimReads) paths that a benchmark
/// compares.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize, schemars::JsonSchema,
)]
#[value(rename_all = "kebab-case")]
#[serde(rename_all = "kebab-case")]
pub enum ClaimReadsArg {
    /// A statement on the queue table that continues after the highest
    /// `msg_id` read, skipping the deleted head of a draining queue.
    Bounded,
    /// The same statement, always from the lowest `msg_id`.
    FromStart,
    /// PGMQ's `pgmq.read` function.
    Function,
}

impl ClaimReadsArg {
    /// The name on the command line and in the document.
    pub fn name(self) -> &'static str {
        match self {
            ClaimReadsArg::Bounded => "bounded",
            ClaimReadsArg::FromStart => "from-start",
            ClaimReadsArg::Function => "function",
        }
    }

    /// The option naming `how`, if there is one.
    ///
    /// ```
    /// use pgmq_bench::document::ClaimReadsArg;
    /// use pgmq_worker::ClaimReads;
    /// assert_eq!(ClaimReadsArg::of(ClaimReads::Function), Some(ClaimReadsArg::Function));
    /// assert_eq!(ClaimReadsArg::of(ClaimReads::FifoGroups), None);
    /// ```
    pub fn of(how: pgmq_worker::ClaimReads) -> Option<ClaimReadsArg> {
        ClaimReadsArg::value_variants()
            .iter()
            .copied()
            .find(|a| pgmq_worker::ClaimReads::from(*a) == how)
    }
}

/// Pass or fail of the run's own checks.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct RunOutcome {
    /// No failures.
    pub ok: bool,
    /// What failed: missing messages, a failed sustained verdict, an undrained queue.
    pub failures: Vec<String>,
    /// What weakens the numbers without failing the run (a timed run under one second, a debug build).
    pub warnings: Vec<String>,
}

/// Versions and conditions.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Metadata {
    /// When the run started.
    pub started_at: DateTime<Utc>,
    /// When it finished.
    pub finished_at: DateTime<Utc>,
    /// The SDK build.
    pub sdk: Sdk,
    /// The compiler and profile.
    pub build: Build,
    /// The machine the benchmark ran on.
    pub host: Host,
    /// The server.
    pub database: Database,
    /// What was sent and consumed.
    pub workload: Workload,
    /// The command line, with any password removed.
    pub command: Vec<String>,
    /// The benchmark's own async runtime (absent in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeInfo>,
}

/// The benchmark process's tokio runtime.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct RuntimeInfo {
    /// Worker threads of the multi-threaded runtime the sections ran on
    /// (`Handle::metrics().num_workers()`, read at run time).
    pub tokio_worker_threads: u32,
}

/// The machine.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Host {
    /// `std::env::consts::OS`.
    pub os: String,
    /// `PRETTY_NAME` of /etc/os-release.
    pub os_release: Option<String>,
    /// Kernel release.
    pub kernel: Option<String>,
    /// `std::env::consts::ARCH`.
    pub arch: String,
    /// First `model name` of /proc/cpuinfo.
    pub cpu_model: Option<String>,
    /// CPUs this process may use (`available_parallelism`).
    pub cpu_count: u32,
    /// MemTotal of /proc/meminfo, bytes.
    pub memory_bytes: Option<u64>,
    /// cgroup v2 `cpu.max` of this process, if readable ("max 100000" is no limit).
    pub cgroup_cpu_max: Option<String>,
    /// cgroup v2 `memory.max`, if readable.
    pub cgroup_memory_max: Option<String>,
    /// 1-minute load average when the run started.
    pub load_average_start: Option<f64>,
    /// 1-minute load average when it finished.
    pub load_average_end: Option<f64>,
    /// Whether the host is a virtual machine or a container, as far as it
    /// can tell (absent in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtualization: Option<Virtualization>,
    /// The CPU frequency governors (`scaling_governor` of every CPU, the
    /// distinct values joined by `,`); null where cpufreq is not exposed.
    #[serde(default)]
    pub cpu_governor: Option<String>,
}

/// What the host says about virtualization; each field null when unknown.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Virtualization {
    /// `systemd-detect-virt --vm` (`none`, `kvm`, `vmware`, ...), when installed.
    pub vm: Option<String>,
    /// `systemd-detect-virt --container` (`none`, `docker`, `podman`, ...), when installed.
    pub container: Option<String>,
    /// Whether /proc/cpuinfo's flags include `hypervisor` (set by the CPU
    /// under a hypervisor).
    pub hypervisor_cpu_flag: Option<bool>,
    /// /sys/class/dmi/id/sys_vendor.
    pub sys_vendor: Option<String>,
    /// /sys/class/dmi/id/product_name.
    pub product_name: Option<String>,
}

/// What was measured.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Workload {
    /// The profile the options were completed from: `default` (no profile
    /// flag), `quick`, `standard`, `full` or `long`. Absent in older
    /// documents, whose run without a profile flag was the full one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<ProfileName>")]
    pub profile: Option<String>,
    /// Sections run, in order.
    #[schemars(with = "Vec<SectionName>")]
    pub sections: Vec<String>,
    /// Messages per consume run (consume_scaling, baseline read + delete).
    pub messages: u64,
    /// Messages per batch-send run (send_batch, its baseline).
    pub batch_messages: u64,
    /// Messages per single-send run (its own and the baseline's).
    pub single_messages: u64,
    /// Send and claim batch size.
    pub batch_size: u32,
    /// Visibility timeout, seconds.
    pub visibility_timeout_s: u32,
    /// JSON body size, bytes (approximate: `{"id": n, "pad": "..."}`).
    pub payload_bytes: u32,
    /// Handler counts of consume_scaling.
    pub workers: Vec<u32>,
    /// Simulated asynchronous work per handler call, milliseconds.
    pub handler_work_ms: u64,
    /// Whether queues were unlogged.
    pub unlogged: bool,
    /// Connection pool size of the SDK client.
    pub pool_size: u32,
    /// What the sections record of the options they declare.
    /// Each field is a section's, and the section reads its own as its
    /// type ([`Workload::options_of`]); the registry gives their schema.
    #[serde(flatten)]
    #[schemars(skip)]
    pub options: BTreeMap<String, serde_json::Value>,
    /// sustained duration, seconds.
    pub sustained_duration_s: f64,
    /// sustained: seconds at the start excluded from the slope fit.
    pub sustained_warmup_s: f64,
    /// sustained producer target rate, messages/s in total (None: unpaced).
    pub sustained_rate: Option<f64>,
    /// sustained producer tasks.
    pub sustained_producers: u32,
    /// sustained handler count.
    pub sustained_workers: u32,
    /// What each handler call did besides recording its id (`--handler`:
    /// `empty`, `db-write` or `db-write-tx`); absent in older documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<HandlerKind>")]
    pub handler: Option<String>,
    /// backlog_scaling backlog sizes, ascending (absent in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog_sizes: Option<Vec<u64>>,
    /// Handler concurrency of backlog_scaling and, per process, of
    /// worker_processes (absent in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog_workers: Option<u32>,
    /// worker_processes process counts, ascending (absent in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<Vec<u32>>,
    /// Messages per worker_processes run (absent in older documents, whose
    /// runs drained `messages`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes_messages: Option<u64>,
    /// How the workers' claimers read the queue (`--claim-reads`, else the
    /// worker's default): `bounded`, `from-start` or `function`; absent in
    /// older documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<ClaimReadsArg>")]
    pub claim_reads: Option<String>,
    /// The sustained rate search's settings (absent in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_search: Option<RateSearch>,
}

impl Workload {
    /// The sections' options as `T`, the type a section's options record
    /// (its fields read from [`options`](Workload::options)).
    pub fn options_of<T: DeserializeOwned>(&self) -> Result<T> {
        let fields = serde_json::Value::Object(self.options.clone().into_iter().collect());
        serde_json::from_value(fields).map_err(|e| Error::json("metadata.workload", e))
    }
}

/// The settings of the sustained rate search (`--rate-search`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct RateSearch {
    /// Whether the search ran (`--rate-search`).
    pub enabled: bool,
    /// Factor between steps (`--rate-step`).
    pub step: f64,
    /// Most steps (`--rate-steps-max`).
    pub steps_max: u32,
}

/// How the numbers were taken.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Protocol {
    /// Rounds run first and discarded.
    pub warmup: u32,
    /// Measured rounds.
    pub repeat: u32,
    /// How sections and repetitions interleave.
    pub order: String,
    /// The central figure.
    pub statistic: String,
    /// The spread reported beside it.
    pub spread: String,
    /// How peak RSS was measured.
    pub memory_method: String,
    /// The queue state at the start of each consuming run.
    pub queue_state: String,
    /// Runs shorter than this are flagged in warnings.
    pub min_timed_seconds: f64,
    /// In an aggregate document: how many invocations it merges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocations: Option<u32>,
}

/// The names of the profiles (`--quick`, the default, `--standard`,
/// `--full`, `--long`) in `metadata.workload.profile`.
pub const PROFILES: [&str; 5] = ["quick", "default", "standard", "full", "long"];

/// A profile's name, one of [`PROFILES`], in the document's schema.
#[derive(Debug)]
pub struct ProfileName;

impl schemars::JsonSchema for ProfileName {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ProfileName".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "enum": PROFILES })
    }
}

/// The units of figures.
pub const UNITS: [&str; 11] = [
    "msg/s", "ms", "s", "%", "x", "MiB", "1/s", "msg", "1/msg", "B/msg", "µs/msg",
];

/// Which direction of change is an improvement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    /// Larger is better (throughput).
    Higher,
    /// Smaller is better (latency, memory, CPU).
    Lower,
    /// Informational.
    None,
}

/// One reported number over the measured runs.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Figure {
    /// Stable key, e.g. `consume_scaling.w4.throughput`.
    pub id: String,
    /// The section it belongs to.
    #[schemars(with = "SectionName")]
    pub section: String,
    /// Short human label.
    pub label: String,
    /// Unit: one of [`UNITS`].
    #[schemars(extend("enum" = UNITS))]
    pub unit: String,
    /// Which direction is an improvement.
    pub better: Better,
    /// What the number means, attached to it.
    pub definition: String,
    /// Median over the measured runs.
    pub median: f64,
    /// Smallest measured run.
    pub min: f64,
    /// Largest measured run.
    pub max: f64,
    /// Each measured run's value (rates carry the count and seconds they came from).
    pub runs: Vec<Sample>,
}

impl Figure {
    /// A figure from its runs; `None` when there are no runs.
    pub fn from_runs(
        id: impl Into<String>,
        section: impl Into<String>,
        label: impl Into<String>,
        unit: impl Into<String>,
        better: Better,
        definition: impl Into<String>,
        runs: Vec<Sample>,
    ) -> Option<Figure> {
        let values: Vec<f64> = runs.iter().map(|s| s.value).collect();
        let (median, min, max) = crate::stats::median_min_max(&values)?;
        Some(Figure {
            id: id.into(),
            section: section.into(),
            label: label.into(),
            unit: unit.into(),
            better,
            definition: definition.into(),
            median,
            min,
            max,
            runs,
        })
    }
}

/// One measured run's value of a figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Sample {
    /// Measured round (0-based, warm-up rounds excluded).
    pub round: u32,
    /// The value.
    pub value: f64,
    /// For rates: the count the rate divides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// For rates: the seconds it divides by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_s: Option<f64>,
}

impl Sample {
    /// A plain value.
    pub fn value(round: u32, value: f64) -> Sample {
        Sample {
            round,
            value,
            count: None,
            elapsed_s: None,
        }
    }

    /// A rate, recomputable from its count and seconds.
    pub fn rate(round: u32, rate: &Rate) -> Sample {
        Sample {
            round,
            value: rate.rate_per_s,
            count: Some(rate.count),
            elapsed_s: Some(rate.elapsed_s),
        }
    }
}

/// A count over seconds; `rate_per_s` is always `count / elapsed_s`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Rate {
    /// How many.
    pub count: u64,
    /// Over how many seconds.
    pub elapsed_s: f64,
    /// `count / elapsed_s` (0 when `elapsed_s` is 0).
    pub rate_per_s: f64,
}

impl Rate {
    /// `count` over `elapsed_s`.
    ///
    /// ```
    /// let r = pgmq_bench::document::Rate::new(500, 2.0);
    /// assert_eq!(r.rate_per_s, 250.0);
    /// ```
    pub fn new(count: u64, elapsed_s: f64) -> Rate {
        let rate_per_s = if elapsed_s > 0.0 {
            count as f64 / elapsed_s
        } else {
            0.0
        };
        Rate {
            count,
            elapsed_s,
            rate_per_s,
        }
    }
}

/// A registered section's name, in the document's schema: the registry,
/// which knows the names, fills in their list (`sections::schema`).
#[derive(Debug)]
pub struct SectionName;

impl schemars::JsonSchema for SectionName {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "SectionName".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string" })
    }
}

/// The sections every benchmark.v1 document holds, in this order, each an
/// empty list when the run did not run it: the format's first sections,
/// whose readers may expect them. The first seven are in every benchmark.v1
/// document; `backlog_scaling` and `worker_processes` are absent in older
/// ones. Any other section's runs are written only when it ran.
pub const ALWAYS_WRITTEN: [&str; 9] = [
    "send_single",
    "send_batch",
    "consume_scaling",
    "idle_worker",
    "wakeup_latency",
    "baseline",
    "sustained",
    "backlog_scaling",
    "worker_processes",
];

/// Every run's record, per section: under the section's name, the list of
/// its runs, each in the shape of the section's run type. A section
/// declares that type and its name once, in its file, as a [`Runs`], which
/// reads and appends its runs here; the document's schema takes each
/// section's from the registry.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(transparent)]
pub struct Sections(BTreeMap<String, serde_json::Value>);

impl Serialize for Sections {
    /// The [`ALWAYS_WRITTEN`] sections first, then the others by name.
    fn serialize<S: serde::Serializer>(&self, ser: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let empty = serde_json::Value::Array(Vec::new());
        let others = self
            .0
            .iter()
            .filter(|(name, _)| !ALWAYS_WRITTEN.contains(&name.as_str()));
        let mut map = ser.serialize_map(None)?;
        for name in ALWAYS_WRITTEN {
            map.serialize_entry(name, self.0.get(name).unwrap_or(&empty))?;
        }
        for (name, runs) in others {
            map.serialize_entry(name, runs)?;
        }
        map.end()
    }
}

impl schemars::JsonSchema for Sections {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Sections".into()
    }

    /// Lists of runs by section name; the document's schema
    /// (`sections::schema`) puts each registered section's run type in.
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "object",
            "additionalProperties": { "type": "array" }
        })
    }
}

impl Sections {
    /// Appends `run` to the runs of the section `name`.
    ///
    /// ```
    /// use pgmq_bench::document::Sections;
    /// let mut s = Sections::default();
    /// s.record("noop", &serde_json::json!({"round": 0})).unwrap();
    /// let runs: Vec<serde_json::Value> = s.runs("noop").unwrap();
    /// assert_eq!(runs.len(), 1);
    /// assert!(serde_json::to_value(&s).unwrap()["noop"].is_array());
    /// ```
    pub fn record(&mut self, name: &str, run: &impl Serialize) -> Result<()> {
        let run = serde_json::to_value(run).map_err(|e| Error::json("a section's run", e))?;
        let runs = self
            .0
            .entry(name.to_owned())
            .or_insert_with(|| serde_json::Value::Array(Vec::new()));
        match runs.as_array_mut() {
            Some(runs) => runs.push(run),
            None => *runs = serde_json::Value::Array(vec![run]),
        }
        Ok(())
    }

    /// The runs of the section `name` (none when it has none).
    pub fn runs<T: DeserializeOwned>(&self, name: &str) -> Result<Vec<T>> {
        match self.0.get(name) {
            None => Ok(Vec::new()),
            Some(v) => serde_json::from_value(v.clone())
                .map_err(|e| Error::json(format!("sections.{name}"), e)),
        }
    }

    /// Replaces the runs of the section `name`.
    fn set<T: Serialize>(&mut self, name: &str, runs: &[T]) -> Result<()> {
        let runs = serde_json::to_value(runs).map_err(|e| Error::json("a section's runs", e))?;
        self.0.insert(name.to_owned(), runs);
        Ok(())
    }
}

/// Where a section's runs are in [`Sections`]: its name and its run type,
/// declared once in the section's file
/// (`const RUNS: Runs<SendRun> = Runs::new("send_single");`). It reads,
/// appends and changes the runs as that type, and gives their schema.
pub struct Runs<T> {
    name: &'static str,
    run: PhantomData<fn() -> T>,
}

impl<T> Runs<T> {
    /// The runs of the section `name`, each a `T`.
    pub const fn new(name: &'static str) -> Runs<T> {
        Runs {
            name,
            run: PhantomData,
        }
    }

    /// The section's name (`sections.<name>`).
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl<T: Serialize + DeserializeOwned> Runs<T> {
    /// The runs in `s`; an error names the section when they do not parse.
    pub fn of(&self, s: &Sections) -> Result<Vec<T>> {
        s.runs(self.name)
    }

    /// The runs in `s`, none when they do not parse (the run's checks and
    /// reading a document report that).
    pub fn list(&self, s: &Sections) -> Vec<T> {
        self.of(s).unwrap_or_default()
    }

    /// Appends `run` to the runs in `s`.
    pub fn record(&self, s: &mut Sections, run: &T) -> Result<()> {
        s.record(self.name, run)
    }

    /// Changes the runs in `s` with `change`.
    pub fn update(&self, s: &mut Sections, change: impl FnOnce(&mut [T])) -> Result<()> {
        let mut runs = self.of(s)?;
        change(&mut runs);
        s.set(self.name, &runs)
    }
}

/// What the registry reads of a section's [`Runs`], whatever their type.
pub trait SectionRuns: Sync {
    /// The section's name (`sections.<name>`).
    fn name(&self) -> &'static str;

    /// The schema of the list of its runs.
    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> schemars::Schema;

    /// Whether its runs in `s` parse as its run type.
    fn parses(&self, s: &Sections) -> Result<()>;

    /// Each run's peak RSS as (round, warm-up, bytes), of the runs that
    /// record one (`peak_rss_bytes`), for the memory figures and summary.
    fn peaks(&self, s: &Sections) -> Vec<(u32, bool, u64)> {
        Runs::<RunPeak>::new(self.name())
            .list(s)
            .into_iter()
            .filter_map(|r| Some((r.round, r.warmup, r.peak_rss_bytes?)))
            .collect()
    }
}

/// What [`SectionRuns::peaks`] reads of any section's run.
#[derive(Serialize, Deserialize)]
struct RunPeak {
    round: u32,
    warmup: bool,
    #[serde(default)]
    peak_rss_bytes: Option<u64>,
}

impl<T: Serialize + DeserializeOwned + schemars::JsonSchema> SectionRuns for Runs<T> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        generator.subschema_for::<Vec<T>>()
    }

    fn parses(&self, s: &Sections) -> Result<()> {
        self.of(s).map(|_| ())
    }
}

/// A consume run at one handler count.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct ConsumeRun {
    /// Round.
    pub round: u32,
    /// Warm-up or measured.
    pub warmup: bool,
    /// Handler concurrency.
    pub workers: u32,
    /// Messages handled from worker start to the last handler completion.
    #[serde(flatten)]
    pub rate: Rate,
    /// Simulated work per handler call, milliseconds.
    pub handler_work_ms: u64,
    /// Handler duration (start to end of the handler future), from the worker's histogram.
    pub handler_ms: Percentiles,
    /// Database segment of queue wait: enqueued_at to last_read_at, both on the database clock.
    pub queue_wait_db_ms: Percentiles,
    /// Local segment of queue wait: claim registered to handler start, monotonic clock.
    pub queue_wait_local_ms: Percentiles,
    /// Seconds from the last handler completion to the end of the worker's shutdown (acks drained).
    pub ack_drain_s: f64,
    /// Messages still in the queue after shutdown (0 when the drain is verified).
    pub remaining_after: i64,
    /// Which messages were handled.
    pub ledger: LedgerReport,
    /// The worker's own counters at shutdown.
    pub worker: WorkerCounters,
    /// Seconds to preload the queue (not timed).
    pub preload_s: f64,
    /// Seconds of `VACUUM (ANALYZE)` after the preload (not timed).
    pub vacuum_s: f64,
    /// Peak RSS during the run, bytes.
    pub peak_rss_bytes: u64,
    /// What each handler call did: `empty`, `db-write` or `db-write-tx` (absent in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<HandlerKind>")]
    pub handler: Option<String>,
}

/// Handled-message accounting of one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct LedgerReport {
    /// Ids that had to be handled (0..expected).
    pub expected: u64,
    /// Handler calls seen.
    pub handled: u64,
    /// Distinct ids handled.
    pub distinct: u64,
    /// Expected ids never handled: a missing message fails the run.
    pub missing: u64,
    /// Handler calls for an id already handled (redeliveries).
    pub duplicates: u64,
    /// Ids outside 0..expected.
    pub unexpected: u64,
    /// Up to 20 missing ids.
    pub missing_ids: Vec<u64>,
    /// Up to 20 duplicated ids.
    pub duplicate_ids: Vec<u64>,
}

/// Counters of the worker runtime at shutdown.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct WorkerCounters {
    /// Messages claimed.
    pub claimed: u64,
    /// Handler calls finished.
    pub handled: u64,
    /// Handler calls that returned an outcome.
    pub succeeded: u64,
    /// Handler calls that returned an error or panicked.
    pub failed: u64,
    /// Messages deleted.
    pub deleted: u64,
    /// Claims released unstarted at shutdown.
    pub released: u64,
    /// Bodies that did not decode.
    pub decode_failures: u64,
    /// `pgmq.read` calls.
    pub reads: u64,
    /// `pgmq.read` calls that returned nothing.
    pub empty_reads: u64,
    /// Claim-loop wake-ups by the poll timer.
    pub wakeups_poll: u64,
    /// Claim-loop wake-ups by NOTIFY.
    pub wakeups_notify: u64,
    /// Claims not started because their visibility timeout had nearly run
    /// out while they waited locally (given back; absent in older documents).
    #[serde(default)]
    pub expired_unstarted: u64,
    /// Acknowledgements given up on (absent in older documents).
    #[serde(default)]
    pub acks_failed: u64,
    /// Of `reads`, those that started at the queue's head (absent in older
    /// documents).
    #[serde(default)]
    pub reads_from_start: u64,
}

impl WorkerCounters {
    /// The cross-checks of the counters of a worker whose handlers always
    /// return `Outcome::Delete` and that was shut down after its queue was
    /// drained: every claim was handled or given back (claimed = handled +
    /// released + expired_unstarted + decode_failures), and every handled
    /// message was acknowledged (handled = deleted, no failed handler, no
    /// acknowledgement given up). Returns what does not add up.
    pub fn inconsistencies(&self) -> Vec<String> {
        let mut out = Vec::new();
        let given_back =
            self.handled + self.released + self.expired_unstarted + self.decode_failures;
        if self.claimed != given_back {
            out.push(format!(
                "worker counters do not add up: claimed {} != handled {} + released {} + expired_unstarted {} + decode_failures {}",
                self.claimed, self.handled, self.released, self.expired_unstarted, self.decode_failures
            ));
        }
        if self.handled != self.deleted {
            out.push(format!(
                "worker counters do not add up: handled {} != acknowledged (deleted) {}",
                self.handled, self.deleted
            ));
        }
        if self.failed > 0 || self.acks_failed > 0 {
            out.push(format!(
                "worker counters: {} failed handler calls, {} acknowledgements given up",
                self.failed, self.acks_failed
            ));
        }
        out
    }
}

/// The baseline section's runs: written by that section, and by the
/// sections whose SDK runs get a baseline run next to them
/// (`kit::plain::neighbour`), which also mark whom it was paired with.
pub(crate) const BASELINE_RUNS: Runs<BaselineRun> = Runs::new("baseline");

/// A baseline loop run.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct BaselineRun {
    /// Round.
    pub round: u32,
    /// Warm-up or measured.
    pub warmup: bool,
    /// `send_single`, `send_batch` or `consume`.
    pub kind: String,
    /// Messages over the timed interval.
    #[serde(flatten)]
    pub rate: Rate,
    /// Messages per call.
    pub batch_size: u32,
    /// For `consume`: which messages were handled.
    pub ledger: Option<LedgerReport>,
    /// For sends: queue length after the run; for `consume`: messages left (must be 0).
    pub in_queue_after: i64,
    /// For `consume`: preload seconds (not timed).
    pub preload_s: f64,
    /// For `consume`: VACUUM seconds (not timed).
    pub vacuum_s: f64,
    /// Peak RSS during the run, bytes.
    pub peak_rss_bytes: u64,
    /// For `consume` run beside `consume_scaling`: the handler count of the
    /// worker run that follows it, whose ratio it is the reference of.
    /// Absent for a section's own run (and in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paired_workers: Option<u32>,
    /// For `consume` run beside `consume_scaling`: the handler count of the
    /// worker run just before it. With `paired_workers` of the run before
    /// that worker run, it brackets it: the ratio's reference is the mean of
    /// the two. Absent for a section's own run (and in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follows_workers: Option<u32>,
}

/// Peak resident memory.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct MemorySummary {
    /// `vmhwm_reset` (VmHWM after `echo 5 > /proc/self/clear_refs` per run) or
    /// `rss_sampled_100ms` (largest VmRSS sampled every 100 ms).
    pub method: String,
    /// Largest of every run's peak and the start-up peak, bytes.
    pub overall_peak_rss_bytes: u64,
    /// Largest run peak per section (warm-up runs included), bytes.
    pub per_section: BTreeMap<String, u64>,
}

/// One performance target, evaluated.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct TargetCheck {
    /// Stable key.
    pub id: String,
    /// The target in words.
    pub description: String,
    /// The observed value (a median), if the run measured it.
    pub observed: Option<f64>,
    /// The limit.
    pub limit: f64,
    /// Unit of both.
    pub unit: String,
    /// Met, missed, or `None` when this run does not measure it.
    pub pass: Option<bool>,
    /// How it was evaluated.
    pub note: String,
}
