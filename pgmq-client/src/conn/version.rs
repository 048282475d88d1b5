//! PGMQ detection (extension or SQL-only install) and the supported range.

use std::fmt;

use crate::conn::error::Error;
use crate::conn::rows::col;

/// The oldest PGMQ this crate supports: 1.11.0 brought topics, the notify
/// throttle calls and the current `read`/`set_vt` signatures.
pub const MIN_SUPPORTED: Version = Version::new(1, 11, 0);

/// A PGMQ version, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

impl Version {
    /// A version.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Version {
            major,
            minor,
            patch,
        }
    }

    /// Parses `1.13.0` (a missing patch reads as 0).
    pub fn parse(s: &str) -> Option<Version> {
        let mut it = s.trim().split('.');
        let major = it.next()?.parse().ok()?;
        let minor = it.next().unwrap_or("0").parse().ok()?;
        let patch_part = it.next().unwrap_or("0");
        let digits: String = patch_part
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        let patch = if digits.is_empty() {
            0
        } else {
            digits.parse().ok()?
        };
        Some(Version::new(major, minor, patch))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// How PGMQ is installed in the connected database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InstallMode {
    /// `CREATE EXTENSION pgmq`: the version is the extension's.
    Extension,
    /// PGMQ's SQL loaded without the extension (managed servers): the version is
    /// inferred from the functions present, so it is a lower bound.
    SqlOnly,
}

/// What [`detect`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PgmqInstall {
    /// Extension or SQL-only.
    pub mode: InstallMode,
    /// The version (for SQL-only installs, the newest version whose functions are all present).
    pub version: Version,
}

/// The detection query: extension version, then markers of SQL-only installs.
pub(crate) const DETECT_SQL: &str = "SELECT \
    (SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pgmq'), \
    pg_catalog.to_regclass('pgmq.meta') IS NOT NULL, \
    pg_catalog.to_regprocedure('pgmq.send_topic(text,jsonb,jsonb,integer)') IS NOT NULL, \
    pg_catalog.to_regprocedure('pgmq.read_grouped_head_with_poll(text,integer,integer,integer,integer)') IS NOT NULL, \
    pg_catalog.to_regprocedure('pgmq.create_partitioned(text,text,text,integer)') IS NOT NULL, \
    pg_catalog.current_database()";

/// Detects PGMQ on `client` and checks it against [`MIN_SUPPORTED`].
///
/// Errors: [`Error::PgmqMissing`] when there is no PGMQ, [`Error::PgmqTooOld`]
/// when it is older than supported; both name the fix.
pub async fn detect(client: &tokio_postgres::Client) -> Result<PgmqInstall, Error> {
    let row = client
        // Unnamed, in one round trip: works behind PgBouncer's transaction mode too.
        .query_typed(DETECT_SQL, &[])
        .await
        .map_err(Error::from_pg)?
        .into_iter()
        .next()
        .ok_or_else(|| Error::Config("the PGMQ detection query returned no row".into()))?;
    let ext: Option<String> = col(&row, 0)?;
    let has_meta: bool = col(&row, 1)?;
    let markers = [col(&row, 2)?, col(&row, 3)?, col(&row, 4)?];
    let database: String = col(&row, 5)?;
    let install =
        classify(ext.as_deref(), has_meta, markers).ok_or(Error::PgmqMissing { database })?;
    if install.version < MIN_SUPPORTED {
        return Err(Error::PgmqTooOld {
            found: install.version.to_string(),
            minimum: MIN_SUPPORTED.to_string(),
        });
    }
    Ok(install)
}

/// Pure part of [`detect`], unit-tested.
fn classify(ext: Option<&str>, has_meta: bool, markers: [bool; 3]) -> Option<PgmqInstall> {
    if let Some(v) = ext {
        return Some(PgmqInstall {
            mode: InstallMode::Extension,
            version: Version::parse(v).unwrap_or(Version::new(0, 0, 0)),
        });
    }
    if !has_meta {
        return None;
    }
    let version = match markers {
        [true, true, true] => Version::new(1, 13, 0),
        [true, true, false] => Version::new(1, 12, 0),
        [true, false, _] => Version::new(1, 11, 0),
        _ => Version::new(1, 0, 0),
    };
    Some(PgmqInstall {
        mode: InstallMode::SqlOnly,
        version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_versions() {
        assert_eq!(Version::parse("1.13.0"), Some(Version::new(1, 13, 0)));
        assert_eq!(Version::parse("1.4"), Some(Version::new(1, 4, 0)));
        assert_eq!(Version::parse("2.0.0-rc1"), Some(Version::new(2, 0, 0)));
        assert_eq!(Version::parse("x"), None);
        assert!(Version::new(1, 10, 1) < MIN_SUPPORTED);
    }

    #[test]
    fn classify_installs() {
        let e = classify(Some("1.13.0"), true, [true; 3]).unwrap();
        assert_eq!(e.mode, InstallMode::Extension);
        assert_eq!(e.version, Version::new(1, 13, 0));
        assert!(classify(None, false, [false; 3]).is_none());
        let s = classify(None, true, [true, true, false]).unwrap();
        assert_eq!(s.mode, InstallMode::SqlOnly);
        assert_eq!(s.version, Version::new(1, 12, 0));
        let old = classify(None, true, [false, false, false]).unwrap();
        assert!(old.version < MIN_SUPPORTED);
    }
}
