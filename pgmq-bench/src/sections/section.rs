//! What every section is: the [`Section`] trait the registry lists, the
//! [`Options`] a section file may declare, and the checked reading of a
//! section flag's seconds.

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::checks::Checks;
use crate::config::{Apply, Config};
use crate::document::{Document, SectionRuns, Sections};
use crate::error::Result;
use crate::figures::Figures;
use crate::kit::ctx::Round;
use crate::kit::Ctx;
use crate::sections::plan;

/// The options a section file declares: its command-line flags (a clap
/// [`Args`](clap::Args) group, flattened into the benchmark's), which the
/// document's workload also records as they were given (serialized and
/// flattened into it, so their names must not clash with another
/// section's), and, once checked, the settings its run reads
/// (`ctx.cfg.options.<module>`, with accessors for what the run reads in
/// another unit, such as a [`Duration`](std::time::Duration)).
pub trait Options:
    clap::Args + Serialize + for<'de> Deserialize<'de> + schemars::JsonSchema
{
    /// Checks the flags (a typed `Error::Config` naming the flag when bad).
    fn check(&self) -> Result<()>;

    /// Replaces the flags that the profile `p.profile` (the default,
    /// `--quick`, `--standard`, `--full`, `--long`) sets for this section,
    /// each only when not given (`config::pick!`). By default a profile
    /// changes none.
    fn apply_profile(&mut self, p: &Apply<'_>) {
        let _ = p;
    }
}

/// One benchmark section: its name on the command line and in the
/// document, how a round runs it (its [`Rounds`]), the run's checks of its
/// runs, its figures and its part of the Markdown report.
pub(crate) trait Section: Sync + BoxedRound {
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

    /// Adds the failures and warnings of its runs in `s`; none by default.
    fn check(&self, s: &Sections, out: &mut Checks) {
        let _ = (s, out);
    }

    /// Adds the figures of its measured runs in `s`.
    fn figures(&self, s: &Sections, f: &mut Figures);

    /// Each run's peak RSS as (round, warm-up, bytes), for the memory
    /// figures and summary: those its runs record.
    fn peaks(&self, s: &Sections) -> Vec<(u32, bool, u64)> {
        self.runs().peaks(s)
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

/// How a round runs a section: the one part of a section that awaits,
/// written as an `async fn`.
pub(crate) trait Rounds: Sync {
    /// Runs the section once for the round `at`, recording its runs in `s`.
    fn run_round(
        &self,
        ctx: &Arc<Ctx>,
        at: Round<'_>,
        s: &mut Sections,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// A section's [`Rounds`] as the registry calls it: the round's future
/// boxed, so that sections of different types share one list.
pub(crate) trait BoxedRound {
    /// [`Rounds::run_round`], boxed.
    fn boxed_round<'a>(
        &'a self,
        ctx: &'a Arc<Ctx>,
        at: Round<'a>,
        s: &'a mut Sections,
    ) -> BoxFuture<'a, Result<()>>;
}

impl<T: Rounds> BoxedRound for T {
    fn boxed_round<'a>(
        &'a self,
        ctx: &'a Arc<Ctx>,
        at: Round<'a>,
        s: &'a mut Sections,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.run_round(ctx, at, s))
    }
}

impl std::fmt::Debug for dyn Section {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
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

/// A section flag's number, checked to lie in `range` (a typed
/// `Error::Config` naming `flag` otherwise).
pub(crate) fn within<T>(v: T, range: std::ops::RangeInclusive<T>, flag: &str) -> Result<T>
where
    T: PartialOrd + std::fmt::Display,
{
    if range.contains(&v) {
        return Ok(v);
    }
    Err(crate::error::Error::Config(format!(
        "{flag} must be between {} and {}",
        range.start(),
        range.end()
    )))
}

/// A section flag's number, checked to be at least `least` (a typed
/// `Error::Config` naming `flag` otherwise).
pub(crate) fn at_least<T>(v: T, least: T, flag: &str) -> Result<T>
where
    T: PartialOrd + std::fmt::Display,
{
    if v >= least {
        return Ok(v);
    }
    Err(crate::error::Error::Config(format!(
        "{flag} must be at least {least}"
    )))
}

/// A [`Duration`](std::time::Duration) recorded in a document as its
/// seconds: `#[serde(with = "crate::sections::secs")]`.
pub(crate) mod secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes the seconds.
    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    /// Reads the seconds.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Duration::try_from_secs_f64(f64::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}
