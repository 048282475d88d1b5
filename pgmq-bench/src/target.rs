//! Where a run connects: the DSN read once (from `--dsn`, `PGMQ_BENCH_DSN`,
//! `--dsn-file` or `--local`'s cluster) and its password resolved once, as
//! libpq would: the DSN's own, else `PGPASSWORD`, else the password file
//! (`PGPASSFILE`, or `~/.pgpass`). Every connection of the run (the SDK pool,
//! the admin connection, the baseline's plain connections) is built from the
//! one [`Target`], so the password never has to be put back into a string,
//! and nothing that prints a `Target` can show it.

use std::path::Path;

use pgmq_client::ClientBuilder;

use crate::error::{Error, Result};

/// Where the password came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PasswordSource {
    /// The DSN holds it.
    Dsn,
    /// The `PGPASSWORD` environment variable.
    PgPassword,
    /// The password file (`PGPASSFILE`, or `~/.pgpass`).
    PassFile,
    /// None found: the server must not ask for one (peer, trust, a client
    /// certificate).
    None,
}

impl PasswordSource {
    /// How a progress line names it.
    pub fn describe(self) -> &'static str {
        match self {
            PasswordSource::Dsn => "from the DSN",
            PasswordSource::PgPassword => "from PGPASSWORD",
            PasswordSource::PassFile => "from the password file (PGPASSFILE or ~/.pgpass)",
            PasswordSource::None => "none",
        }
    }
}

/// The database of a run, resolved once.
///
/// `Debug` and [`redacted`](Self::redacted) show the DSN with its password
/// replaced by `***`; the password itself is only inside the
/// [`ClientBuilder`]s that [`builder`](Self::builder) returns.
#[derive(Clone)]
pub struct Target {
    /// The DSN as given (it may hold the password): only ever handed to a
    /// child process's environment, never printed.
    dsn: String,
    builder: ClientBuilder,
    redacted: String,
    source: PasswordSource,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("dsn", &self.redacted)
            .field("password", &self.source)
            .finish()
    }
}

impl Target {
    /// Parses `dsn` and, when it holds no password, takes one where libpq
    /// does: `PGPASSWORD`, else the password file (`PGPASSFILE`, or
    /// `~/.pgpass`, ignored when group or others may read it).
    ///
    /// ```
    /// let t = pgmq_bench::target::Target::resolve("postgres://u:s3cret@h/db").unwrap();
    /// assert_eq!(t.redacted(), "postgres://u:***@h/db");
    /// assert!(!format!("{t:?}").contains("s3cret"));
    /// ```
    pub fn resolve(dsn: &str) -> Result<Target> {
        let plain = ClientBuilder::new(dsn).pg_config()?;
        let resolved = if plain.get_password().is_some() {
            None
        } else {
            ClientBuilder::new(dsn)
                .libpq_password(true)
                .pg_config()?
                .get_password()
                .map(<[u8]>::to_vec)
        };
        let source = if plain.get_password().is_some() {
            PasswordSource::Dsn
        } else if resolved.is_none() {
            PasswordSource::None
        } else if std::env::var("PGPASSWORD").is_ok_and(|p| !p.is_empty()) {
            PasswordSource::PgPassword
        } else {
            PasswordSource::PassFile
        };
        let mut builder = ClientBuilder::new(dsn);
        if let Some(pw) = resolved {
            builder = builder.password(pw);
        }
        Ok(Target {
            dsn: dsn.to_owned(),
            builder,
            redacted: pgmq_client::redact_dsn(dsn),
            source,
        })
    }

    /// A builder for one more connection or pool to the database, with the
    /// resolved password; set its application name and sizes as needed.
    pub fn builder(&self) -> ClientBuilder {
        self.builder.clone()
    }

    /// The DSN as given, for the environment of a child process of this
    /// run (a worker process), which resolves its password the same way
    /// from the same environment. Never print it.
    pub(crate) fn dsn_for_child_env(&self) -> &str {
        &self.dsn
    }

    /// The DSN with its password replaced by `***`: what may be printed or
    /// recorded.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    /// Where the password came from.
    pub fn password_source(&self) -> PasswordSource {
        self.source
    }
}

/// Reads a DSN from `path` (`--dsn-file`): its first line that is neither
/// blank nor a `#` comment, trimmed. Refused unless a regular file with mode
/// 0600 or stricter, as [`pgmq_client::read_dsn_file`] (shared with the
/// `pgmq` tool) checks on the opened file. Error messages name the file,
/// never its content.
pub fn read_dsn_file(path: &Path) -> Result<String> {
    pgmq_client::read_dsn_file(path, "--dsn-file").map_err(|e| match e {
        pgmq_client::DsnFileError::Refused(m) => Error::Refused(m),
        other => Error::Config(other.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DSN file in a directory of its own, removed with the directory
    /// when dropped.
    struct TempDsn(std::path::PathBuf);

    impl std::ops::Deref for TempDsn {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDsn {
        fn drop(&mut self) {
            if let Some(dir) = self.0.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }

    fn temp_file(name: &str, text: &str, mode: u32) -> TempDsn {
        let dir =
            std::env::temp_dir().join(format!("pgmq-bench-target-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("dsn");
        std::fs::write(&path, text).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        #[cfg(not(unix))]
        let _ = mode;
        TempDsn(path)
    }

    #[test]
    fn dsn_file_first_line_that_is_not_a_comment() {
        let p = temp_file(
            "ok",
            "# bench database\n\n  postgres://u:p%40w@h/db  \nignored\n",
            0o600,
        );
        assert_eq!(read_dsn_file(&p).unwrap(), "postgres://u:p%40w@h/db");
        let p = temp_file("empty", "# nothing\n\n", 0o600);
        assert!(matches!(read_dsn_file(&p), Err(Error::Config(_))));
        let e = read_dsn_file(Path::new("/nonexistent/pgmq-bench-dsn")).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }

    #[cfg(unix)]
    #[test]
    fn dsn_file_refused_when_others_may_read_it() {
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602] {
            let p = temp_file(&format!("m{mode:o}"), "postgres://u:SeCrEt@h/db\n", mode);
            let e = read_dsn_file(&p).unwrap_err();
            assert!(matches!(e, Error::Refused(_)), "{mode:o}: {e}");
            let text = format!("{e} {e:?}");
            assert!(text.contains("chmod 0600"), "{text}");
            assert!(!text.contains("SeCrEt"), "{text}");
        }
        let dir = temp_file("dir", "", 0o600);
        let e = read_dsn_file(dir.parent().unwrap()).unwrap_err();
        assert!(matches!(e, Error::Refused(_)), "{e}");
    }

    #[test]
    fn the_dsn_password_wins_and_is_never_shown() {
        let t = Target::resolve("host=h user=u password='a b@/?%' dbname=d").unwrap();
        assert_eq!(t.password_source(), PasswordSource::Dsn);
        let text = format!("{t:?} {}", t.redacted());
        assert!(!text.contains("a b@"), "{text}");
        assert_eq!(
            t.builder().pg_config().unwrap().get_password(),
            Some(&b"a b@/?%"[..])
        );
    }
}
