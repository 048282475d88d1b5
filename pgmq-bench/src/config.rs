//! The validated settings of one benchmark run, and the profiles: the
//! default (no flag: every section at small sizes, a few minutes), `--quick`,
//! `--standard`, `--full` (the option defaults, the release run) and
//! `--long`.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::cli::{ClaimReadsArg, HandlerKind, RunArgs};
use crate::error::{Error, Result};
use crate::sections::{Section, REGISTRY};

/// `pick!(p, args.field, default, value)`: [`Apply::set`] on `args.field`,
/// whose option id is the field's name (clap's id of a derived option).
macro_rules! pick {
    ($p:expr, $a:ident . $f:ident, $default:expr, $value:expr) => {
        $p.set(stringify!($f), &mut $a.$f, $default, $value)
    };
}
pub(crate) use pick;

/// The run's settings, checked: the command line's options with the
/// profile applied, read through `Deref` as [`RunArgs`], and the
/// derived values as methods.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// The profile the options were completed from.
    pub profile: Profile,
    /// Sections, in round order, without repeats.
    pub(crate) sections: Vec<&'static dyn Section>,
    /// The options, checked and completed: `workers` without repeats in a
    /// row, `processes` ascending and each once, `backlog_sizes` resolved
    /// ([`Config::backlog_sizes`]) and `pool_size` raised for
    /// `--handler db-write-tx` ([`pool_size`]).
    args: RunArgs,
}

impl std::ops::Deref for Config {
    type Target = RunArgs;

    fn deref(&self) -> &RunArgs {
        &self.args
    }
}

/// The backlog sizes of the full profile.
pub const BACKLOG_SIZES: [u64; 2] = [100_000, 1_000_000];
/// The backlog sizes of the quick and default profiles.
pub const SMALL_BACKLOG_SIZES: [u64; 2] = [20_000, 100_000];
/// The backlog sizes of the standard profile.
pub const STANDARD_BACKLOG_SIZES: [u64; 1] = [100_000];

fn bad(msg: impl Into<String>) -> Error {
    Error::Config(msg.into())
}

impl Config {
    /// Checks `args`.
    pub fn from_args(a: &RunArgs) -> Result<Config> {
        let profile = Profile::of(a);
        let a = &with_profile(a, profile);
        check_scalars(a)?;
        let sections = ordered_sections(a);
        let backlog_sizes = backlog_sizes(a)?;
        if !(1..=1024).contains(&a.backlog_workers) {
            return Err(bad("--backlog-workers must be between 1 and 1024"));
        }
        let processes = process_counts(a)?;
        check_rate_search(a)?;
        a.options.check()?;
        let mut args = a.clone();
        args.workers.dedup();
        args.backlog_sizes = Some(backlog_sizes);
        args.processes = processes;
        args.pool_size = pool_size(a);
        Ok(Config {
            profile,
            sections,
            args,
        })
    }

    /// Visibility timeout (`--vt`).
    pub fn vt(&self) -> Duration {
        Duration::from_secs(u64::from(self.visibility_timeout))
    }

    /// Simulated handler work (`--handler-work-ms`).
    pub fn handler_work(&self) -> Duration {
        Duration::from_millis(self.handler_work_ms)
    }

    /// sustained target rate (`--rate`; None: 0, unpaced).
    pub fn sustained_rate(&self) -> Option<f64> {
        (self.rate > 0.0).then_some(self.rate)
    }

    /// backlog_scaling sizes, ascending.
    pub fn backlog_sizes(&self) -> &[u64] {
        self.args.backlog_sizes.as_deref().unwrap_or_default()
    }

    /// The name of the claim-read path the workers use: `--claim-reads`,
    /// else the worker's default (None when the default is a path this
    /// option cannot name).
    pub fn claim_reads_name(&self) -> Option<&'static str> {
        self.claim_reads
            .or_else(|| ClaimReadsArg::of(pgmq_worker::ClaimReads::default()))
            .map(ClaimReadsArg::name)
    }

    /// Whether the section named `name` runs.
    pub fn has(&self, name: &str) -> bool {
        self.sections.iter().any(|s| s.name() == name)
    }

    /// The names of the sections that run, in round order.
    pub fn section_names(&self) -> Vec<&'static str> {
        self.sections.iter().map(|s| s.name()).collect()
    }
}

/// The checks of the counts, sizes and durations that need no other
/// option's value resolved first.
fn check_scalars(a: &RunArgs) -> Result<()> {
    if a.repeat == 0 {
        return Err(bad("--repeat must be at least 1"));
    }
    if a.messages == 0
        || a.batch_messages == 0
        || a.single_messages == 0
        || a.processes_messages == 0
    {
        return Err(bad(
            "--messages, --batch-messages, --single-messages and --processes-messages must be at \
             least 1",
        ));
    }
    if !(1..=10_000).contains(&a.batch_size) {
        return Err(bad("--batch-size must be between 1 and 10000"));
    }
    if a.visibility_timeout == 0 {
        return Err(bad("--vt must be at least 1 second"));
    }
    if a.workers.is_empty() || a.workers.iter().any(|w| !(1..=1024).contains(w)) {
        return Err(bad("--workers takes handler counts between 1 and 1024"));
    }
    if a.duration.is_zero() || a.sustained_warmup >= a.duration {
        return Err(bad(
            "--duration must be longer than --sustained-warmup (and not zero)",
        ));
    }
    if !(a.rate.is_finite() && a.rate >= 0.0) {
        return Err(bad("--rate must be 0 (unpaced) or a positive rate"));
    }
    if a.producers == 0 || a.sustained_workers == 0 {
        return Err(bad(
            "--producers and --sustained-workers must be at least 1",
        ));
    }
    if a.pool_size < 2 {
        return Err(bad("--pool-size must be at least 2"));
    }
    Ok(())
}

/// The SDK pool's size: `--pool-size`, raised for `--handler db-write-tx`
/// to what the largest worker needs (each handler holds a connection for its
/// transaction, plus two claimers, the flusher and one spare), which the
/// worker's `build()` would otherwise refuse.
fn pool_size(a: &RunArgs) -> u32 {
    if a.handler != HandlerKind::DbWriteTx {
        return a.pool_size;
    }
    let most = a.workers.iter().copied().max().unwrap_or(1);
    let most = most.max(a.sustained_workers).max(a.backlog_workers);
    a.pool_size.max(most.saturating_add(4))
}

/// The selected sections in round order (the registry's), each once.
fn ordered_sections(a: &RunArgs) -> Vec<&'static dyn Section> {
    REGISTRY
        .iter()
        .copied()
        .filter(|s| a.sections.iter().any(|n| n == s.name()))
        .collect()
}

/// The backlog sizes: `--backlog-sizes` or the profile's, with 10M for
/// `--backlog-10m`, ascending and each once; none may be 0.
fn backlog_sizes(a: &RunArgs) -> Result<Vec<u64>> {
    let mut backlog_sizes = a
        .backlog_sizes
        .clone()
        .unwrap_or_else(|| match Profile::of(a) {
            Profile::Quick | Profile::Default => SMALL_BACKLOG_SIZES.to_vec(),
            Profile::Standard => STANDARD_BACKLOG_SIZES.to_vec(),
            Profile::Full | Profile::Long => BACKLOG_SIZES.to_vec(),
        });
    if a.backlog_10m {
        backlog_sizes.push(10_000_000);
    }
    backlog_sizes.sort_unstable();
    backlog_sizes.dedup();
    if backlog_sizes.is_empty() || backlog_sizes.contains(&0) {
        return Err(bad("--backlog-sizes takes sizes of at least 1"));
    }
    Ok(backlog_sizes)
}

/// The worker_processes counts, ascending and each once, between 1 and 64.
fn process_counts(a: &RunArgs) -> Result<Vec<u32>> {
    let mut processes = a.processes.clone();
    processes.sort_unstable();
    processes.dedup();
    if processes.is_empty() || processes.iter().any(|p| !(1..=64).contains(p)) {
        return Err(bad("--processes takes process counts between 1 and 64"));
    }
    Ok(processes)
}

/// The rate-search options: a step factor above 1, at least one step, and
/// a starting `--rate` above 0 when the search is on.
fn check_rate_search(a: &RunArgs) -> Result<()> {
    if !(a.rate_step.is_finite() && a.rate_step > 1.0) || a.rate_steps_max == 0 {
        return Err(bad(
            "--rate-step must be above 1 and --rate-steps-max at least 1",
        ));
    }
    if a.rate_search && a.rate <= 0.0 {
        return Err(bad(
            "--rate-search starts from --rate, which must be above 0",
        ));
    }
    Ok(())
}

/// `args` with `profile` applied: each option the profile sets is replaced
/// unless it was given ([`Apply::set`]); the sections' own options take it
/// in their files. The backlog sizes of a profile are in [`backlog_sizes`].
fn with_profile(a: &RunArgs, profile: Profile) -> RunArgs {
    let mut a = a.clone();
    let given = std::mem::take(&mut a.given);
    let p = &Apply {
        profile,
        given: &given,
    };
    let secs = Duration::from_secs;
    match profile {
        Profile::Long => {
            pick!(p, a.repeat, 3, 5);
            pick!(p, a.messages, 150_000, 300_000);
            pick!(p, a.batch_messages, 250_000, 500_000);
            pick!(p, a.single_messages, 10_000, 20_000);
            if a.duration < secs(300) {
                a.duration = secs(300);
            }
            pick!(p, a.sustained_warmup, secs(5), secs(30));
        }
        Profile::Quick | Profile::Default => {
            // The default: the quick profile's sizes with two measured
            // rounds (a median and a range), fewer single sends and a
            // shorter sustained window; every section in a few minutes on
            // 2 cores.
            let quick = profile == Profile::Quick;
            pick!(p, a.repeat, 3, if quick { 1 } else { 2 });
            pick!(p, a.warmup, 1, 0);
            pick!(p, a.messages, 150_000, 20_000);
            pick!(p, a.batch_messages, 250_000, 20_000);
            pick!(
                p,
                a.single_messages,
                10_000,
                if quick { 2_000 } else { 1_000 }
            );
            pick!(p, a.duration, secs(30), secs(if quick { 20 } else { 10 }));
            pick!(
                p,
                a.sustained_warmup,
                secs(5),
                secs(if quick { 3 } else { 2 })
            );
            pick!(p, a.processes, vec![1, 2, 4, 8], vec![1, 2]);
            pick!(p, a.processes_messages, 400_000, 20_000);
        }
        Profile::Standard => {
            pick!(p, a.repeat, 3, 2);
            pick!(p, a.messages, 150_000, 50_000);
            pick!(p, a.batch_messages, 250_000, 100_000);
            pick!(p, a.single_messages, 10_000, 5_000);
            pick!(p, a.duration, secs(30), secs(20));
            pick!(p, a.processes, vec![1, 2, 4, 8], vec![1, 2]);
            pick!(p, a.processes_messages, 400_000, 50_000);
        }
        Profile::Full => {}
    }
    // Each section's own options take the profile in the section's file.
    a.options.apply_profile(p);
    a.given = given;
    a
}

/// The run's profile: `--quick`, `--standard`, `--full`, `--long`, or none
/// (the default). A section's [`Options`](crate::sections::Options) may
/// shorten or lengthen its own runs for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// `--quick`: a smoke run of a minute or two, one round.
    Quick,
    /// No profile flag: every section at small sizes, two rounds, a few
    /// minutes.
    Default,
    /// `--standard`: between the default and the full run.
    Standard,
    /// `--full`: the documented option defaults, the release run.
    Full,
    /// `--long`: longer runs and more rounds.
    Long,
}

impl Profile {
    /// The profile `a` asks for.
    pub(crate) fn of(a: &RunArgs) -> Profile {
        if a.long {
            Profile::Long
        } else if a.quick {
            Profile::Quick
        } else if a.standard {
            Profile::Standard
        } else if a.full {
            Profile::Full
        } else {
            Profile::Default
        }
    }

    /// Its name in the document (`metadata.workload.profile`).
    pub fn name(self) -> &'static str {
        match self {
            Profile::Quick => "quick",
            Profile::Default => "default",
            Profile::Standard => "standard",
            Profile::Full => "full",
            Profile::Long => "long",
        }
    }
}

/// A profile being applied to the options: which one, and the ids of the
/// options given on the command line or in the environment, which it
/// leaves alone.
#[derive(Debug)]
pub struct Apply<'a> {
    /// The profile.
    pub profile: Profile,
    given: &'a BTreeSet<String>,
}

impl Apply<'_> {
    /// Sets `v`, the value of the option `id`, to `value` unless the option
    /// was given or `v` no longer holds the option's `default`. (Options
    /// parsed without [`Cli::try_parse_args`](crate::cli::Cli::try_parse_args)
    /// record none as given: an option set to its default value on such a
    /// command line is replaced too.)
    pub(crate) fn set<T: PartialEq>(&self, id: &str, v: &mut T, default: T, value: T) {
        if !self.given.contains(id) && *v == default {
            *v = value;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(extra: &[&str]) -> RunArgs {
        let mut v = vec!["pgmq-bench"];
        v.extend_from_slice(extra);
        crate::cli::Cli::try_parse_args(v).unwrap().run
    }

    #[test]
    fn defaults_are_valid_and_ordered() {
        let c =
            Config::from_args(&args(&["--sections", "sustained,send_single,send_single"])).unwrap();
        assert_eq!(c.section_names(), vec!["send_single", "sustained"]);
        assert_eq!(c.sustained_rate(), Some(5000.0));
        assert!(Config::from_args(&args(&[])).is_ok());
    }

    #[test]
    fn quick_profile_replaces_defaults_only() {
        let c = Config::from_args(&args(&["--quick", "--messages", "5000"])).unwrap();
        assert_eq!((c.repeat, c.warmup, c.messages), (1, 0, 5000));
        assert_eq!(c.backlog_sizes(), SMALL_BACKLOG_SIZES.to_vec());
        assert_eq!(c.processes, vec![1, 2]);
        let c = Config::from_args(&args(&["--backlog-sizes", "300,100", "--backlog-10m"])).unwrap();
        assert_eq!(c.backlog_sizes(), vec![100, 300, 10_000_000]);
        assert_eq!(c.backlog_sizes().len(), 3);
        let c = Config::from_args(&args(&["--long"])).unwrap();
        assert_eq!(c.profile.name(), "long");
        assert!(c.duration >= Duration::from_secs(300));
        assert_eq!((c.repeat, c.messages), (5, 300_000));
        assert_eq!(c.backlog_sizes(), BACKLOG_SIZES.to_vec());
    }

    #[test]
    fn the_default_profile_is_small_and_keeps_what_is_given() {
        let c = Config::from_args(&args(&[])).unwrap();
        assert_eq!(c.profile, Profile::Default);
        assert_eq!((c.repeat, c.warmup, c.messages), (2, 0, 20_000));
        assert_eq!(c.backlog_sizes(), SMALL_BACKLOG_SIZES.to_vec());
        assert_eq!(c.section_names().len(), REGISTRY.len(), "every section");
        // An option given with the full profile's value keeps it.
        let c = Config::from_args(&args(&["--repeat", "3", "--warmup=1"])).unwrap();
        assert_eq!((c.repeat, c.warmup, c.messages), (3, 1, 20_000));
        let c = Config::from_args(&args(&["--steady-duration-s", "20"])).unwrap();
        assert_eq!(c.options.steady.duration(), Duration::from_secs(20));
        // Parsed without recording what was given: a value equal to the
        // default is the profile's.
        let v = ["pgmq-bench", "--repeat", "3"];
        let c = Config::from_args(&crate::cli::Cli::try_parse_from(v).unwrap().run).unwrap();
        assert_eq!(c.repeat, 2);
        let full = Config::from_args(&args(&["--full"])).unwrap();
        assert_eq!(full.profile, Profile::Full);
        assert_eq!((full.repeat, full.warmup, full.messages), (3, 1, 150_000));
        assert_eq!(full.backlog_sizes(), BACKLOG_SIZES.to_vec());
    }

    #[test]
    fn the_schema_names_every_profile() {
        let schema: serde_json::Value =
            serde_json::from_str(include_str!("../../docs/benchmark.v1.schema.json")).unwrap();
        let names: Vec<&str> = [
            Profile::Quick,
            Profile::Default,
            Profile::Standard,
            Profile::Full,
            Profile::Long,
        ]
        .map(Profile::name)
        .to_vec();
        let in_schema: Vec<&str> = schema["$defs"]["ProfileName"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(in_schema, names);
    }

    #[test]
    fn the_standard_profile_lies_between_quick_and_full() {
        let quick = Config::from_args(&args(&["--quick"])).unwrap();
        let standard = Config::from_args(&args(&["--standard"])).unwrap();
        let full = Config::from_args(&args(&["--full"])).unwrap();
        assert!(quick.messages < standard.messages && standard.messages < full.messages);
        assert!(quick.repeat < standard.repeat && standard.repeat < full.repeat);
        let bh = |c: &Config| c.options.batch_handler.batch_handler_messages;
        assert!(bh(&quick) < bh(&standard) && bh(&standard) < bh(&full));
        assert_eq!(standard.backlog_sizes(), STANDARD_BACKLOG_SIZES.to_vec());
        // One profile at a time.
        let both = crate::cli::Cli::try_parse_from(["pgmq-bench", "--quick", "--standard"]);
        assert!(both.is_err());
    }

    #[test]
    fn claim_reads_default_to_the_worker_default_and_are_named() {
        let c = Config::from_args(&args(&[])).unwrap();
        assert_eq!(c.claim_reads, None);
        assert_eq!(
            c.claim_reads_name(),
            ClaimReadsArg::of(pgmq_worker::ClaimReads::default()).map(ClaimReadsArg::name)
        );
        assert!(
            c.claim_reads_name().is_some(),
            "the worker's default has a name"
        );
        for (given, name) in [
            ("bounded", "bounded"),
            ("from-start", "from-start"),
            ("function", "function"),
        ] {
            let c = Config::from_args(&args(&["--claim-reads", given])).unwrap();
            assert_eq!(c.claim_reads_name(), Some(name));
            assert_eq!(
                ClaimReadsArg::of(c.claim_reads.unwrap().into()),
                c.claim_reads
            );
        }
        assert!(
            crate::cli::Cli::try_parse_from(["pgmq-bench", "--claim-reads", "fifo-groups"])
                .is_err()
        );
    }

    #[test]
    fn refusals() {
        for bad_args in [
            &["--repeat", "0"][..],
            &["--wakeup-samples", "5"],
            &["--workers", "0"],
            &["--duration", "2s", "--sustained-warmup", "5s"],
            &["--batch-size", "0"],
            &["--rate=-1"],
        ] {
            assert!(Config::from_args(&args(bad_args)).is_err(), "{bad_args:?}");
        }
        assert_eq!(
            Config::from_args(&args(&["--rate", "0"]))
                .unwrap()
                .sustained_rate(),
            None
        );
    }
}
