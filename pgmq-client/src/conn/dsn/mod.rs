//! DSNs: the one parser ([`ConnInfo`], libpq's rules), the settings made
//! from it, redaction, and libpq's password sources.

pub(crate) mod config;
mod parse;

pub use parse::{ConnInfo, DsnError, RAW_CREDENTIALS};

/// Returns `dsn` with its password replaced by `***`, rendered from the
/// DSN as libpq parses it ([`ConnInfo::redacted`]), in its own form (URL or
/// key=value): the text is never edited, so whatever the password holds and
/// wherever the DSN puts it (user information, `?password=`, a quoted
/// value), it cannot survive. A DSN libpq would not parse shows nothing of
/// itself: `<unparsable DSN>`.
///
/// ```
/// use pgmq_client::redact_dsn;
/// assert_eq!(redact_dsn("postgres://app:hunter2@db:5432/app"), "postgres://app:***@db:5432/app");
/// assert_eq!(redact_dsn("postgres://app:a%2Fb%3Fc@db/app"), "postgres://app:***@db/app");
/// assert_eq!(
///     redact_dsn("postgres://app@db:5432/app?password=hunter@2x"),
///     "postgres://app:***@db:5432/app"
/// );
/// assert_eq!(redact_dsn(r"host=db user=app password='it\'s me'"), "host=db user=app password=***");
/// assert_eq!(redact_dsn(r"host=db password=it\ is user=app"), "host=db password=*** user=app");
/// assert_eq!(redact_dsn("host=db password='never closed"), "<unparsable DSN>");
/// ```
pub fn redact(dsn: &str) -> String {
    match ConnInfo::parse(dsn) {
        Ok(info) => info.redacted(),
        Err(_) => "<unparsable DSN>".to_owned(),
    }
}

/// The password libpq would use when the DSN has none: `PGPASSWORD`, else
/// the first matching line of the password file (the DSN's `passfile`,
/// else `PGPASSFILE`, else `~/.pgpass`), read only when it is a private
/// regular file.
pub(crate) fn libpq_password(
    config: &tokio_postgres::Config,
    passfile: Option<&std::path::Path>,
) -> Option<String> {
    if let Ok(pw) = std::env::var("PGPASSWORD") {
        if !pw.is_empty() {
            return Some(pw);
        }
    }
    let path = match (passfile, std::env::var_os("PGPASSFILE")) {
        (Some(p), _) => p.to_owned(),
        (None, Some(p)) => std::path::PathBuf::from(p),
        (None, None) => std::path::PathBuf::from(std::env::var_os("HOME")?).join(".pgpass"),
    };
    if !path.exists() {
        return None;
    }
    let text = match read_private(&path, "password file", 1024 * 1024) {
        Ok(text) => text,
        Err(e) => {
            // libpq, too, ignores a password file others can read or write.
            tracing::warn!("password file ignored: {e}");
            return None;
        }
    };
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(_)) | None => "localhost".to_owned(),
        #[cfg(not(unix))]
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user()?.to_owned();
    let db = config.get_dbname().unwrap_or(&user).to_owned();
    pgpass_lookup(&text, &host, port, &db, &user)
}

/// Finds the password for `host:port:database:user` in the text of a libpq
/// password file (`~/.pgpass`): one `hostname:port:database:username:password`
/// per line, `*` matching anything in the first four fields, `\:` and `\\`
/// escaping a colon and a backslash, `#` starting a comment line. The first
/// matching line wins.
///
/// ```
/// let file = "# comment\ndb:5432:app:app:s3cr\\:et\n*:*:*:admin:other\n";
/// assert_eq!(pgmq_client::pgpass_lookup(file, "db", 5432, "app", "app").as_deref(), Some("s3cr:et"));
/// assert_eq!(pgmq_client::pgpass_lookup(file, "x", 1, "y", "admin").as_deref(), Some("other"));
/// assert_eq!(pgmq_client::pgpass_lookup(file, "db", 5433, "app", "app"), None);
/// ```
pub fn pgpass_lookup(text: &str, host: &str, port: u16, db: &str, user: &str) -> Option<String> {
    let port = port.to_string();
    for line in text.lines() {
        if line.trim_start().starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut fields = Vec::with_capacity(5);
        let mut cur = String::new();
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    if let Some(n) = chars.next() {
                        cur.push(n);
                    }
                }
                ':' if fields.len() < 4 => fields.push(std::mem::take(&mut cur)),
                c => cur.push(c),
            }
        }
        fields.push(cur);
        if fields.len() != 5 {
            continue;
        }
        let ok = |pat: &str, v: &str| pat == "*" || pat == v;
        if ok(&fields[0], host)
            && ok(&fields[1], &port)
            && ok(&fields[2], db)
            && ok(&fields[3], user)
        {
            return Some(fields.swap_remove(4));
        }
    }
    None
}

/// Largest DSN file [`read_dsn_file`] reads, bytes.
const MAX_DSN_FILE: u64 = 64 * 1024;

/// Why [`read_dsn_file`] gave no DSN. Messages name the file, never its
/// content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DsnFileError {
    /// Not a regular file, or its mode lets group or other users at it.
    #[error("{0}")]
    Refused(String),
    /// It cannot be opened or read, or holds no DSN.
    #[error("{0}")]
    Unreadable(String),
}

/// Reads a DSN from a file (a `--dsn-file`): its first line that is neither
/// blank nor a `#` comment, trimmed. `what` names the file in errors (say
/// `"--dsn-file /etc/app/dsn"`).
///
/// Refused, as libpq refuses such a password file, when the path is not a
/// regular file (a folder, a FIFO, a device) or when its mode has any group or
/// other permission bit (`chmod 0600`). The type and mode are checked on the
/// opened file, not on the path before opening it, so the file cannot be
/// swapped in between.
///
/// ```
/// # #[cfg(unix)] {
/// use std::os::unix::fs::PermissionsExt;
/// let path = std::env::temp_dir().join(format!("pgmq-doc-dsn-{}", std::process::id()));
/// std::fs::write(&path, "# app database\npostgres://app:s3cret@db/app\n").unwrap();
/// std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
/// let e = pgmq_client::read_dsn_file(&path, "--dsn-file").unwrap_err();
/// assert!(matches!(e, pgmq_client::DsnFileError::Refused(_)) && !e.to_string().contains("s3cret"));
/// std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
/// assert_eq!(pgmq_client::read_dsn_file(&path, "--dsn-file").unwrap(), "postgres://app:s3cret@db/app");
/// # std::fs::remove_file(&path).unwrap();
/// # }
/// ```
pub fn read_dsn_file(path: &std::path::Path, what: &str) -> Result<String, DsnFileError> {
    let text = read_private(path, what, MAX_DSN_FILE)?;
    let what = format!("{what} {}", path.display());
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .ok_or_else(|| DsnFileError::Unreadable(format!("{what} holds no DSN")))
}

/// Reads at most `max` bytes of a file that holds a password, refusing it
/// unless it is a regular file only its owner can read or write. The file
/// is opened without waiting (`O_NONBLOCK`: opening a FIFO would otherwise
/// wait for a writer) and its type and mode are checked on the opened file,
/// so it cannot be swapped in between.
fn read_private(path: &std::path::Path, what: &str, max: u64) -> Result<String, DsnFileError> {
    use std::io::Read;
    let what = format!("{what} {}", path.display());
    let unreadable = |e: std::io::Error| DsnFileError::Unreadable(format!("{what}: {e}"));
    let mut open = std::fs::OpenOptions::new();
    open.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        open.custom_flags(libc::O_NONBLOCK);
    }
    let file = open.open(path).map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    if !meta.is_file() {
        return Err(DsnFileError::Refused(format!(
            "{what} is not a regular file"
        )));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(DsnFileError::Refused(format!(
                "{what}: mode {mode:04o} lets group or other users at it; a file holding a \
                 password must be private (chmod 0600 {}), as libpq requires of ~/.pgpass",
                path.display()
            )));
        }
    }
    let mut text = String::new();
    file.take(max)
        .read_to_string(&mut text)
        .map_err(unreadable)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn urls() {
        assert_eq!(redact("postgres://u:p@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgresql://u@h/db"), "postgresql://u@h/db");
        assert_eq!(
            redact("postgres://u:p%40x@h:1/db?sslmode=require&password=z"),
            "postgres://u:***@h:1/db?sslmode=require"
        );
        assert_eq!(redact("postgres://h"), "postgres://h");
        assert_eq!(
            redact("postgres://h/db?pass%77ord=s3cr3t&sslmode=require"),
            "postgres://:***@h/db?sslmode=require"
        );
        // libpq's scheme is lower case: anything else is key=value, and
        // does not parse as that.
        assert_eq!(redact("POSTGRES://u:p@h/db"), "<unparsable DSN>");
        assert_eq!(
            redact("postgres://h/?application_name=%zé"),
            "<unparsable DSN>"
        );
    }

    #[test]
    fn key_values() {
        assert_eq!(
            redact("host=h password=p user=u"),
            "host=h password=*** user=u"
        );
        assert_eq!(
            redact("host=h password='a b\\'c' user=u"),
            "host=h password=*** user=u"
        );
        assert_eq!(redact("password = s3cr3t host=h"), "password=*** host=h");
        assert_eq!(
            redact(r"host=h password=a\ b\ c user=u application_name='x y'"),
            "host=h password=*** user=u application_name='x y'"
        );
    }
}
