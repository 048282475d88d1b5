//! The benchmark's sections, one file each, and the registry that lists
//! them: `REGISTRY` is where the command line's section names, the order a
//! round runs them in, the run's checks, the document's figures, the
//! Markdown report's parts and the document's JSON Schema ([`schema`]) come
//! from. A section's file holds its run type and where its runs are kept
//! (a [`Runs`](crate::document::Runs)), its `Section` implementation (how
//! a round runs it, its checks, its figures, its part of the report), so
//! adding a section is one file and one line in the `registry!` list below
//! (then `pgmq-bench schema` regenerates the committed schema). A section with
//! options of its own declares them in its file as a type implementing
//! [`Options`] (its flags, the checked settings derived from them, and what
//! the document's workload records of them) and names it in its registry
//! line (`idle => [IdleWorker] with IdleOptions`): the registry flattens it
//! into the command line ([`SectionArgs`]), the run's settings
//! ([`SectionConfigs`], `ctx.cfg.options.<module>`) and the workload
//! ([`SectionWorkloads`]).
//!
//! What the sections share is here too: the run context, the message
//! bodies, preloading and vacuuming a queue.
//!
//! Every message body is `{"id": n, "pad": "xxx…"}`: `id` is assigned by the
//! bench from 0 so that handlers can record it in a `Ledger`,
//! and `pad` brings the body to `--payload-bytes`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use pgmq_client::{Client, QueueName};
use serde::{Deserialize, Serialize};

use crate::checks::Checks;
use crate::config::{Apply, Config};
use std::collections::BTreeMap;

use crate::document::{
    Document, Figure, RunOutcome, SectionRuns, Sections, TargetCheck, WorkerCounters,
};
use crate::error::Result;
use crate::figures::Figures;
use crate::figures::{worker_targets, TargetContext};
use crate::guard::Guard;
use crate::process::MemoryMeter;
use crate::progress::Progress;
use crate::report::thousands;

/// Declares the section modules and [`REGISTRY`], the sections in the
/// order a round runs them: one line per file, naming the sections it holds
/// and, after `with`, the [`Options`] type of the options it declares.
macro_rules! registry {
    ($($vis:vis $module:ident => [$($section:ident),+] $(with $opts:ident)?,)+) => {
        $($vis mod $module;)+

        /// Every section, in the order a round runs them: the one list a
        /// section is registered in.
        pub(crate) const REGISTRY: &[&dyn Section] = &[$($(&$module::$section,)+)+];

        /// The options the sections declare, one group per section file
        /// that has any (flattened into the benchmark's command line).
        #[derive(Debug, Clone, clap::Args)]
        #[non_exhaustive]
        pub struct SectionArgs {
            $($(
                #[allow(missing_docs)]
                #[command(flatten)]
                pub $module: $module::$opts,
            )?)+
        }

        /// The sections' checked settings, one per section file that
        /// declares options.
        #[derive(Debug, Clone)]
        #[non_exhaustive]
        pub struct SectionConfigs {
            $($(
                #[allow(missing_docs)]
                pub $module: <$module::$opts as Options>::Config,
            )?)+
        }

        /// What the document's workload records of the sections' options
        /// (flattened into [`Workload`](crate::document::Workload)).
        #[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
        #[non_exhaustive]
        pub struct SectionWorkloads {
            $($(
                #[allow(missing_docs)]
                #[serde(flatten)]
                pub $module: <$module::$opts as Options>::Workload,
            )?)+
        }

        impl SectionArgs {
            /// Applies the run's profile to every section's options.
            pub(crate) fn apply_profile(&mut self, p: &Apply<'_>) {
                $($(<$module::$opts as Options>::apply_profile(&mut self.$module, p);)?)+
            }
        }

        impl SectionConfigs {
            /// Checks every section's options.
            pub(crate) fn from_args(a: &SectionArgs) -> Result<SectionConfigs> {
                Ok(SectionConfigs {
                    $($($module: <$module::$opts as Options>::config(&a.$module)?,)?)+
                })
            }

            /// What the workload records of them, field by field.
            pub(crate) fn workload(&self) -> BTreeMap<String, serde_json::Value> {
                let all = SectionWorkloads {
                    $($($module: <$module::$opts as Options>::workload(&self.$module),)?)+
                };
                match serde_json::to_value(all) {
                    Ok(serde_json::Value::Object(fields)) => fields.into_iter().collect(),
                    _ => BTreeMap::new(),
                }
            }
        }
    };
}

registry! {
    send => [SendSingle, SendBatch],
    send_keyed => [SendBatchKeyed],
    consume => [ConsumeScaling],
    baseline => [Baseline],
    backlog => [BacklogScaling],
    processes => [WorkerProcesses],
    idle => [IdleWorker] with IdleOptions,
    wakeup => [WakeupLatency] with WakeupOptions,
    sustained => [Sustained],
    batch_handler => [BatchHandlerSection] with BatchHandlerOptions,
    pub(crate) steady => [SteadyStream] with SteadyOptions,
    pinned => [PinnedHorizon] with PinnedOptions,
    fleet_limit => [FleetLimit] with FleetLimitOptions,
}

/// The options a section file declares: its command-line flags (a clap
/// [`Args`](clap::Args) group, flattened into the benchmark's), the checked
/// settings its run reads, and the part of the document's workload that
/// records them.
pub trait Options: clap::Args {
    /// The checked settings (`ctx.cfg.options.<module>`).
    type Config: std::fmt::Debug + Clone;
    /// The workload fields (flattened into the document's workload, so
    /// their names must not clash with another section's).
    type Workload: std::fmt::Debug
        + Clone
        + Serialize
        + for<'de> Deserialize<'de>
        + schemars::JsonSchema;

    /// Checks the flags (a typed `Error::Config` naming the flag when bad).
    fn config(&self) -> Result<Self::Config>;

    /// What the document records of `config`.
    fn workload(config: &Self::Config) -> Self::Workload;

    /// Replaces the flags that the profile `p.profile` (the default,
    /// `--quick`, `--standard`, `--full`, `--long`) sets for this section,
    /// each only when not given (`config::pick!`). By default a profile
    /// changes none.
    fn apply_profile(&mut self, p: &Apply<'_>) {
        let _ = p;
    }
}

pub use processes::child_main as process_worker_main;
pub use sustained::db_clock_offset_us;

/// Every figure of the measured runs in `s`: each section's, in the order
/// a round runs them, then the memory figures.
pub(crate) fn figures(s: &Sections) -> Vec<Figure> {
    let mut f = Figures::default();
    for section in REGISTRY {
        section.figures(s, &mut f);
    }
    crate::figures::memory(&mut f, &peaks(s));
    f.into_figures()
}

/// Each section's run peaks, in the order a round runs them.
fn peaks(s: &Sections) -> Vec<(&'static str, crate::figures::RunPeaks)> {
    REGISTRY.iter().map(|x| (x.name(), x.peaks(s))).collect()
}

/// Largest run peak per section, warm-up runs included.
pub(crate) fn section_peaks(s: &Sections) -> BTreeMap<String, u64> {
    crate::figures::section_peaks(&peaks(s))
}

/// The run's own checks, which decide its outcome: each section's of its
/// runs (every message accounted for, every drain verified, sustained
/// verdicts; warnings about weak numbers), and a warning for a build that
/// is not a release build (`profile`).
pub(crate) fn evaluate(s: &Sections, profile: &str) -> RunOutcome {
    let mut checks = Checks::default();
    for section in REGISTRY {
        section.check(s, &mut checks);
    }
    checks.outcome(profile)
}

/// The pgmq-worker performance targets, evaluated on the medians of one
/// document: the worker's (`figures::worker_targets`) and those each section
/// states of its own figures. The memory target needs two documents:
/// `check-memory`.
pub fn targets(figures: &[Figure], ctx: TargetContext) -> Vec<TargetCheck> {
    let mut checks = worker_targets(figures, ctx);
    for section in REGISTRY {
        checks.extend(section.targets(figures));
    }
    checks
}

/// The JSON Schema of the benchmark.v1 document, generated from its types:
/// the document's own, each registered section's run type under
/// `sections.<name>` (described by its one-line help), and the registered
/// names wherever a section is named. `docs/benchmark.v1.schema.json` is
/// this schema, printed by `pgmq-bench schema`.
pub fn schema() -> serde_json::Value {
    let mut generator = schemars::generate::SchemaSettings::draft2020_12()
        .with_transform(closed)
        .into_generator();
    let mut properties = serde_json::Map::new();
    for section in REGISTRY {
        let mut runs = section.runs().schema(&mut generator).to_value();
        runs["description"] = section.about().into();
        properties.insert(section.name().to_owned(), runs);
    }
    generator.subschema_for::<SectionWorkloads>();
    let mut root = generator.root_schema_for::<Document>().to_value();
    root["$id"] = "https://example.invalid/pgmq-sdk/docs/benchmark.v1.schema.json".into();
    root["title"] = crate::document::SCHEMA.into();
    let defs = &mut root["$defs"];
    // The sections' options are fields of the workload.
    let options = defs
        .as_object_mut()
        .and_then(|d| d.remove("SectionWorkloads"))
        .unwrap_or_default();
    let workload = &mut defs["Workload"];
    for (name, field) in options["properties"].as_object().into_iter().flatten() {
        workload["properties"][name] = field.clone();
    }
    for name in options["required"].as_array().into_iter().flatten() {
        if let Some(required) = workload["required"].as_array_mut() {
            required.push(name.clone());
        }
    }
    defs["Sections"] = serde_json::json!({
        "description": "Each section's runs under its name.",
        "type": "object",
        "additionalProperties": false,
        "required": crate::document::ALWAYS_WRITTEN[..7],
        "properties": properties,
    });
    defs["SectionName"] = serde_json::json!({
        "description": "A registered section's name.",
        "enum": names().collect::<Vec<_>>(),
    });
    root
}

/// Makes every object schema with properties refuse others: the document
/// writes only the fields its types have, so an unknown field is an error.
fn closed(schema: &mut schemars::Schema) {
    if let Some(object) = schema.as_object_mut() {
        if object.contains_key("properties") && !object.contains_key("additionalProperties") {
            object.insert("additionalProperties".into(), false.into());
        }
    }
    schemars::transform::transform_subschemas(&mut closed, schema);
}

/// The names of the registered sections, in the order a round runs them
/// (what `--sections` accepts and `sections` in a document holds).
///
/// ```
/// let names: Vec<&str> = pgmq_bench::sections::names().collect();
/// assert_eq!(names.first(), Some(&"send_single"));
/// assert!(names.contains(&"worker_processes"));
/// ```
pub fn names() -> impl Iterator<Item = &'static str> {
    REGISTRY.iter().map(|s| s.name())
}

/// One benchmark section: its name on the command line and in the
/// document, how a round runs it, the run's checks of its runs, its figures
/// and its part of the Markdown report.
pub(crate) trait Section: Sync {
    /// Where its runs are in the document: its name and its run type (a
    /// [`Runs`](crate::document::Runs) declared in its file).
    fn runs(&self) -> &dyn SectionRuns;

    /// The name on the command line and in the document (`sections.<name>`).
    fn name(&self) -> &'static str {
        self.runs().name()
    }

    /// One line for `--help`.
    fn about(&self) -> &'static str;

    /// What one round of it is planned to take with `cfg` (see [`plan`]):
    /// what the progress lines' estimate of the time left is made of.
    /// Nothing when its round runs nothing of its own (its runs are made
    /// by other sections): it is then not a step of the run.
    fn planned(&self, cfg: &Config) -> plan::Plan;

    /// Whether warm-up rounds run it (only throughput sections do).
    fn in_warmup(&self) -> bool {
        false
    }

    /// Runs the section once for the round `at`, recording its runs in `s`.
    fn run_round<'a>(
        &'a self,
        ctx: &'a Arc<Ctx>,
        at: Round<'a>,
        s: &'a mut Sections,
    ) -> BoxFuture<'a, Result<()>>;

    /// Adds the failures and warnings of its runs in `s`.
    fn check(&self, s: &Sections, out: &mut Checks);

    /// Adds the figures of its measured runs in `s`.
    fn figures(&self, s: &Sections, f: &mut Figures);

    /// Each run's peak RSS as (round, warm-up, bytes), for the memory
    /// figures and summary; none by default.
    fn peaks(&self, s: &Sections) -> Vec<(u32, bool, u64)> {
        let _ = s;
        Vec::new()
    }

    /// Appends its part of the Markdown report of `d` (nothing when `d`
    /// holds none of its figures).
    fn report(&self, d: &Document, out: &mut String);

    /// Its performance targets, evaluated on a document's `figures` (see
    /// [`targets`]); none by default.
    fn targets(&self, figures: &[crate::document::Figure]) -> Vec<crate::document::TargetCheck> {
        let _ = figures;
        Vec::new()
    }
}

impl std::fmt::Debug for dyn Section {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a round of a section is planned to take: the seconds of its fixed
/// windows (timed phases, sleeps, the gaps between samples: the same on
/// any machine) and the seconds of its work at nominal speeds of a 2-core
/// machine (sends, preloads, drains: faster or slower with the machine and
/// its load). The estimate of the time left adds the fixed seconds of the
/// steps left to their work seconds scaled by the pace of the work done
/// so far, so the speeds need only be in proportion to each other.
pub(crate) mod plan {
    use super::baseline::Baseline;
    use super::Section;
    use crate::config::Config;

    /// What one round of a section is planned to take.
    #[derive(Debug, Clone, Copy, Default, PartialEq)]
    pub(crate) struct Plan {
        /// Seconds of fixed windows.
        pub(crate) fixed_s: f64,
        /// Seconds of work at the nominal speeds.
        pub(crate) work_s: f64,
    }

    impl Plan {
        /// `s` seconds of fixed windows.
        pub(crate) fn fixed(s: f64) -> Plan {
            Plan {
                fixed_s: s,
                work_s: 0.0,
            }
        }

        /// `s` seconds of work at the nominal speeds.
        pub(crate) fn work(s: f64) -> Plan {
            Plan {
                fixed_s: 0.0,
                work_s: s,
            }
        }

        /// Both, in seconds.
        pub(crate) fn total_s(self) -> f64 {
            self.fixed_s + self.work_s
        }
    }

    impl std::ops::Add for Plan {
        type Output = Plan;

        fn add(self, other: Plan) -> Plan {
            Plan {
                fixed_s: self.fixed_s + other.fixed_s,
                work_s: self.work_s + other.work_s,
            }
        }
    }

    impl std::iter::Sum for Plan {
        fn sum<I: Iterator<Item = Plan>>(iter: I) -> Plan {
            iter.fold(Plan::default(), |a, b| a + b)
        }
    }

    /// Sequential one-message sends a second.
    pub(crate) const SINGLE_SENDS: f64 = 1_500.0;
    /// Messages a second of sequential batch sends.
    pub(crate) const BATCH_SENDS: f64 = 50_000.0;
    /// Messages a second a worker drains from a preloaded queue.
    pub(crate) const DRAIN: f64 = 40_000.0;
    /// Messages a second the one-connection read + delete loop drains.
    pub(crate) const LOOP_DRAIN: f64 = 20_000.0;
    /// Messages a second a server-side preload writes.
    pub(crate) const PRELOAD: f64 = 150_000.0;
    /// Seconds of a run besides its messages: a fresh queue, its vacuum,
    /// the checks after it, dropping it.
    pub(crate) const SETUP: f64 = 0.3;
    /// Seconds to start a worker process.
    pub(crate) const PROCESS_START: f64 = 1.0;

    /// Seconds of a run that preloads `n` messages and drains them at
    /// `rate` a second.
    pub(crate) fn drain(n: u64, rate: f64) -> f64 {
        SETUP + n as f64 / PRELOAD + n as f64 / rate
    }

    /// `n` when the baseline section runs (its loops then sit around an
    /// SDK section's runs, `n` of them per run), else 0.
    pub(crate) fn loops_around(cfg: &Config, n: u32) -> f64 {
        if cfg.has(Baseline.name()) {
            f64::from(n)
        } else {
            0.0
        }
    }
}

/// The round a run belongs to: its index among warm-up or measured rounds,
/// whether it is a warm-up round, and the tag naming it in progress lines.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Round<'a> {
    /// Index among the warm-up rounds, or among the measured ones.
    pub(crate) index: u32,
    /// A warm-up round (its runs are recorded but not in the figures).
    pub(crate) warm: bool,
    /// `warm-up 1/1` or `round 2/3`.
    pub(crate) tag: &'a str,
}

/// Everything a section needs.
#[derive(Debug)]
pub(crate) struct Ctx {
    /// The settings.
    pub(crate) cfg: Config,
    /// The database (its password resolved once; never printed).
    pub(crate) target: crate::target::Target,
    /// The SDK client (pool).
    pub(crate) client: Client,
    /// A dedicated plain connection for preloads, VACUUM and metadata.
    pub(crate) admin: tokio_postgres::Client,
    /// The owned-queue registry.
    pub(crate) guard: Guard,
    /// Per-run peak RSS.
    pub(crate) meter: MemoryMeter,
    /// Progress lines.
    pub(crate) progress: Progress,
    /// The padding string of every body.
    pub(crate) pad: String,
    /// With `--handler db-write`: the handlers' own connections.
    pub(crate) sink: Option<Arc<Sink>>,
}

/// The table `--handler db-write` inserts into (created at the start of a
/// run, dropped at its end).
pub(crate) const SINK_TABLE: &str = "pgmq_bench_handler_sink";

/// `--handler db-write`: a pool of plain connections of its own (not the
/// SDK's), each with the insert prepared; handler calls take them round robin
/// and pipeline on them.
#[derive(Debug)]
pub(crate) struct Sink {
    conns: Vec<(tokio_postgres::Client, tokio_postgres::Statement)>,
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

/// A message body as sent.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct OutBody<'a> {
    /// The bench's id of the message.
    pub(crate) id: u64,
    /// Padding to the payload size.
    pub(crate) pad: &'a str,
}

/// A message body as handlers read it (the padding is skipped).
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) struct InBody {
    /// The bench's id of the message.
    pub(crate) id: u64,
}

/// The id ranges `0..n` in batches of `size`.
pub(crate) fn id_batches(n: u64, size: u64) -> impl Iterator<Item = std::ops::Range<u64>> {
    let size = size.max(1);
    (0..n.div_ceil(size)).map(move |b| b * size..((b + 1) * size).min(n))
}

/// Bytes of `{"id": 123456, "pad": ""}` as PostgreSQL prints jsonb.
const BODY_OVERHEAD: u32 = 25;

/// A section flag's seconds, checked: finite and at least `least` (a typed
/// `Error::Config` naming `flag` otherwise).
pub(crate) fn seconds(v: f64, flag: &str, least: f64) -> Result<std::time::Duration> {
    if v.is_finite() && v >= least {
        return Ok(std::time::Duration::from_secs_f64(v));
    }
    let at_least = if least > 0.0 {
        format!(", at least {least}")
    } else {
        String::new()
    };
    Err(crate::error::Error::Config(format!(
        "{flag} must be a number of seconds{at_least}"
    )))
}

/// The padding that brings a body to about `payload_bytes`.
pub(crate) fn padding(payload_bytes: u32) -> String {
    "x".repeat(payload_bytes.saturating_sub(BODY_OVERHEAD) as usize)
}

/// Server-side preload: one `pgmq.send_batch` per chunk, bodies built by
/// `generate_series`, so the client does no work and holds no memory.
const PRELOAD_SQL: &str = "SELECT count(*) FROM pgmq.send_batch($1::text, ARRAY(\
    SELECT jsonb_build_object('id', g, 'pad', $4::text) \
    FROM generate_series($2::bigint, $3::bigint) AS g))";

const PRELOAD_CHUNK: u64 = 10_000;

/// A preload of at least this many messages is announced with its count.
const PRELOAD_SAID: u64 = 100_000;

/// How often a long preload says how far it got.
const PRELOAD_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl Ctx {
    /// A body.
    pub(crate) fn body(&self, id: u64) -> OutBody<'_> {
        OutBody { id, pad: &self.pad }
    }

    /// Loads ids `0..n` into `q` on the server; returns the seconds taken.
    /// A large preload is announced, and a long one says every few seconds
    /// how many messages it has written.
    pub(crate) async fn preload(&self, q: &QueueName, n: u64) -> Result<f64> {
        let t = Instant::now();
        let mut said = t;
        if n >= PRELOAD_SAID {
            self.progress.say(format!(
                "preloading {} messages into {q}",
                thousands(n as f64)
            ));
        }
        for ids in id_batches(n, PRELOAD_CHUNK) {
            let (first, last) = (ids.start as i64, ids.end as i64 - 1);
            self.admin
                .query_one(PRELOAD_SQL, &[&q.as_str(), &first, &last, &self.pad])
                .await?;
            if said.elapsed() >= PRELOAD_EVERY && ids.end < n {
                said = Instant::now();
                self.progress.say(format!(
                    "preloaded {} of {} messages ({} msg/s)",
                    thousands(ids.end as f64),
                    thousands(n as f64),
                    thousands(ids.end as f64 / t.elapsed().as_secs_f64())
                ));
            }
        }
        Ok(t.elapsed().as_secs_f64())
    }

    /// `VACUUM (ANALYZE)` of the queue table; returns the seconds taken.
    pub(crate) async fn vacuum(&self, q: &QueueName) -> Result<f64> {
        let t = Instant::now();
        // `QueueName` admits only [a-z0-9_], so the table name is a plain identifier.
        self.admin
            .batch_execute(&format!("VACUUM (ANALYZE) {}", q.table()))
            .await?;
        Ok(t.elapsed().as_secs_f64())
    }

    /// A fresh queue holding ids `0..n`, vacuumed: (queue, preload s, vacuum s).
    pub(crate) async fn fresh_loaded(&self, suffix: &str, n: u64) -> Result<(QueueName, f64, f64)> {
        let q = self.guard.fresh(suffix).await?;
        let preload_s = self.preload(&q, n).await?;
        let vacuum_s = self.vacuum(&q).await?;
        Ok((q, preload_s, vacuum_s))
    }

    /// Messages left in `q`, then drops it (the run is over).
    pub(crate) async fn finish_queue(&self, q: &QueueName) -> Result<i64> {
        let left = self.queue_length(q).await?;
        self.guard.release(q).await?;
        Ok(left)
    }

    /// Messages in `q` (visible or not).
    pub(crate) async fn queue_length(&self, q: &QueueName) -> Result<i64> {
        Ok(self.client.metrics(q).await?.queue_length)
    }
}

/// The worker's counters, as the document records them.
pub(crate) fn counters(s: &pgmq_worker::StatsSnapshot) -> WorkerCounters {
    WorkerCounters {
        claimed: s.claimed,
        handled: s.handled,
        succeeded: s.succeeded,
        failed: s.failed,
        deleted: s.deleted,
        released: s.released,
        decode_failures: s.decode_failures,
        reads: s.reads,
        empty_reads: s.empty_reads,
        wakeups_poll: s.wakeups_poll,
        wakeups_notify: s.wakeups_notify,
        expired_unstarted: s.expired_unstarted,
        acks_failed: s.acks_failed,
        reads_from_start: s.reads_from_start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_batches_cover_every_id_once() {
        let v: Vec<_> = id_batches(5, 2).collect();
        assert_eq!(v, vec![0..2, 2..4, 4..5]);
    }

    #[test]
    fn body_size_is_close_to_the_target() {
        let pad = padding(100);
        let text = serde_json::to_string(&OutBody {
            id: 123_456,
            pad: &pad,
        })
        .unwrap();
        // serde_json prints without spaces, PostgreSQL with: within a few bytes.
        assert!((95..=100).contains(&text.len()), "{}", text.len());
        assert_eq!(padding(10), "");
    }
}
