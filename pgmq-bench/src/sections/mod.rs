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
//! [`Options`] (its flags, their checks, and what the document's workload
//! records of them) and names it in its registry line (`idle =>
//! [IdleWorker] with IdleOptions`): the registry flattens it into the
//! command line, the workload and the run's settings ([`SectionArgs`],
//! `ctx.cfg.options.<module>`).
//!
//! What the sections measure with (the run context, message bodies,
//! preloading, tallies, drains, snapshots, worker processes) is in
//! `kit`; sections never import each other.

use serde::{Deserialize, Serialize};

use crate::checks::Checks;
use crate::config::Apply;
use std::collections::BTreeMap;

use crate::document::{Document, Figure, RunOutcome, Sections, TargetCheck};
use crate::error::Result;
use crate::figures::Figures;
use crate::figures::{worker_targets, TargetContext};
pub(crate) use crate::kit::ctx::Round;

pub(crate) mod plan;
mod section;
pub use section::Options;
pub(crate) use section::{at_least, seconds, secs, within, Rounds, Section};

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
        /// that has any (flattened into the benchmark's command line, and
        /// as given into the document's
        /// [`Workload`](crate::document::Workload)).
        #[derive(Debug, Clone, clap::Args, Serialize, Deserialize, schemars::JsonSchema)]
        #[non_exhaustive]
        pub struct SectionArgs {
            $($(
                #[allow(missing_docs)]
                #[command(flatten)]
                #[serde(flatten)]
                pub $module: $module::$opts,
            )?)+
        }

        impl SectionArgs {
            /// Applies the run's profile to every section's options.
            pub(crate) fn apply_profile(&mut self, p: &Apply<'_>) {
                $($(<$module::$opts as Options>::apply_profile(&mut self.$module, p);)?)+
            }

            /// Checks every section's options.
            pub(crate) fn check(&self) -> Result<()> {
                $($(<$module::$opts as Options>::check(&self.$module)?;)?)+
                Ok(())
            }

            /// What the workload records of them, field by field.
            pub(crate) fn workload(&self) -> BTreeMap<String, serde_json::Value> {
                match serde_json::to_value(self) {
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
    key_limits => [KeyLimits] with KeyLimitsOptions,
    fifo => [FifoGroups] with FifoOptions,
    priorities => [Priorities] with PrioritiesOptions,
}

pub use crate::kit::child::child_main as process_worker_main;
pub use crate::kit::snapshot::db_clock_offset_us;

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
    generator.subschema_for::<SectionArgs>();
    let mut root = generator.root_schema_for::<Document>().to_value();
    root["$id"] = "https://example.invalid/pgmq-sdk/docs/benchmark.v1.schema.json".into();
    root["title"] = crate::document::SCHEMA.into();
    let defs = &mut root["$defs"];
    // The sections' options are fields of the workload.
    let options = defs
        .as_object_mut()
        .and_then(|d| d.remove("SectionArgs"))
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
