//! The benchmark's sections, one file each, and the registry that lists
//! them: `REGISTRY` is where the command line's section names, the order a
//! round runs them in, the run's checks, the document's figures and the
//! Markdown report's parts come from. A section's file holds its run, its
//! `Section` implementation (how a round runs it, its checks, its figures,
//! its part of the report), so adding a section is one file and one line in
//! the `registry!` list below (a section without a field of its own in
//! [`Sections`] keeps its runs in [`Sections::extra`]). A section with
//! options of its own declares them in its file as a type implementing
//! [`Options`] (its flags, the checked settings derived from them, and what
//! the document's workload records of them) and names it in its registry
//! line (`idle => [IdleWorker] with IdleOptions`): the registry flattens it
//! into the command line ([`SectionArgs`]), the run's settings
//! ([`SectionConfigs`], `ctx.cfg.options.<module>`) and the workload
//! ([`SectionWorkloads`]).
//!
//! What the sections measure with (the run context, message bodies,
//! preloading, tallies, drains, snapshots, worker processes) is in
//! `kit`; sections never import each other.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::checks::Checks;
use crate::config::{Apply, Config};
use crate::document::{Document, Sections};
use crate::error::Result;
use crate::figures::Figures;
pub(crate) use crate::kit::ctx::Round;
use crate::kit::Ctx;

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
        #[derive(Debug, Clone, Serialize, Deserialize)]
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

            /// What the workload records of them.
            pub(crate) fn workload(&self) -> SectionWorkloads {
                SectionWorkloads {
                    $($($module: <$module::$opts as Options>::workload(&self.$module),)?)+
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
    type Workload: std::fmt::Debug + Clone + Serialize + for<'de> Deserialize<'de>;

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

pub use crate::kit::child::child_main as process_worker_main;
pub use crate::kit::snapshot::db_clock_offset_us;

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
    /// The name on the command line and in the document (`sections.<name>`).
    fn name(&self) -> &'static str;

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
    /// [`targets`](crate::figures::targets)); none by default.
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

/// Each run's peak RSS as (round, warm-up, bytes), for a section that keeps
/// its runs in [`Sections::extra`] under `name` (none when they do not parse).
pub(crate) fn extra_peaks<T: serde::de::DeserializeOwned>(
    s: &Sections,
    name: &str,
    peak: fn(&T) -> (u32, bool, u64),
) -> Vec<(u32, bool, u64)> {
    s.runs::<T>(name)
        .unwrap_or_default()
        .iter()
        .map(peak)
        .collect()
}
