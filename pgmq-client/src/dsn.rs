//! DSN helpers: removing the password before a DSN is shown anywhere, and
//! rewriting parameters (`sslmode`) before tokio-postgres parses the DSN.

/// Returns `dsn` with its password replaced by `***`, in both the URL form
/// (`postgres://user:secret@host/db`, `?password=secret`) and the key=value
/// form (`host=db password=secret`).
///
/// The DSN is parsed, not pattern-matched: in a URL the user information is
/// everything before the **last** `@` (so a password holding `/`, `?`, `:`
/// or `@`, percent-encoded or not, is hidden whole; an `@` later in the URL
/// only makes more of it hidden), and query keys are percent-decoded
/// (`pass%77ord=` is a password too). In the key=value form, values quoted
/// with `'...'` and backslash escapes (quoted or not: `password=a\ b`) are
/// read as libpq reads them. A key=value DSN that cannot be parsed (an
/// unterminated quote) is hidden from that point on.
///
/// ```
/// use pgmq_client::redact_dsn;
/// assert_eq!(redact_dsn("postgres://app:hunter2@db:5432/app"), "postgres://app:***@db:5432/app");
/// assert_eq!(redact_dsn("postgres://app:a/b?c@db/app"), "postgres://app:***@db/app");
/// assert_eq!(redact_dsn(r"host=db user=app password='it\'s me'"), "host=db user=app password=***");
/// assert_eq!(redact_dsn(r"host=db password=it\ is user=app"), "host=db password=*** user=app");
/// ```
pub fn redact(dsn: &str) -> String {
    map_params(dsn, true, |key, _| {
        key.eq_ignore_ascii_case("password")
            .then(|| Some("***".to_owned()))
    })
}

/// Rewrites the parameters of `dsn` (URL query or key=value pairs): `f(key,
/// value)` returns `None` to keep a parameter, `Some(None)` to remove it,
/// `Some(Some(v))` to replace its value. With `userinfo`, the password of a
/// URL's `user:password@` part is rewritten as key `password` too, and the
/// user information runs to the last `@` of the URL (see [`redact`]).
pub(crate) fn map_params(
    dsn: &str,
    userinfo: bool,
    mut f: impl FnMut(&str, &str) -> Option<Option<String>>,
) -> String {
    let dsn = dsn.trim();
    let url = ["postgres://", "postgresql://"].iter().find_map(|scheme| {
        let head = dsn.get(..scheme.len())?;
        head.eq_ignore_ascii_case(scheme)
            .then(|| (head, &dsn[scheme.len()..]))
    });
    match url {
        Some((scheme, rest)) => map_url(scheme, rest, userinfo, &mut f),
        None => map_key_values(dsn, &mut f),
    }
}

/// Percent-decodes `s` (invalid escapes are kept as they are).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

type ParamFn<'a> = dyn FnMut(&str, &str) -> Option<Option<String>> + 'a;

fn map_url(scheme: &str, rest: &str, userinfo: bool, f: &mut ParamFn<'_>) -> String {
    // With `userinfo`, the user information runs to the last '@': whatever
    // a password holds, it lies before that '@'. Without, the authority ends
    // at the first '/' or '?'.
    let (info, after) = match rest.rfind('@') {
        Some(at) if userinfo => (Some(&rest[..at]), &rest[at..]),
        _ => (None, rest),
    };
    let (host_end, tail) = match after.find(['/', '?']) {
        Some(i) => (i, &after[i..]),
        None => (after.len(), ""),
    };
    let host = &after[..host_end];
    let authority = match info {
        Some(info) => match info.split_once(':') {
            Some((user, password)) => match f("password", &percent_decode(password)) {
                Some(Some(v)) => format!("{user}:{v}{host}"),
                Some(None) => format!("{user}{host}"),
                None => format!("{info}{host}"),
            },
            None => format!("{info}{host}"),
        },
        None => host.to_owned(),
    };
    let Some(q) = tail.find('?') else {
        return format!("{scheme}{authority}{tail}");
    };
    let (path, query) = (&tail[..q], &tail[q + 1..]);
    let parts: Vec<String> = query
        .split('&')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match f(&percent_decode(k), &percent_decode(v)) {
                None => Some(kv.to_owned()),
                Some(None) => None,
                Some(Some(v)) => Some(format!("{k}={v}")),
            }
        })
        .collect();
    if parts.is_empty() {
        format!("{scheme}{authority}{path}")
    } else {
        format!("{scheme}{authority}{path}?{}", parts.join("&"))
    }
}

fn map_key_values(dsn: &str, f: &mut ParamFn<'_>) -> String {
    // Values may be quoted with single quotes, with backslash escapes.
    let mut out = String::with_capacity(dsn.len());
    let mut rest = dsn;
    while !rest.is_empty() {
        let trimmed = rest.trim_start();
        let space = &rest[..rest.len() - trimmed.len()];
        rest = trimmed;
        if rest.is_empty() {
            out.push_str(space);
            break;
        }
        let key_end = rest.find('=').unwrap_or(rest.len());
        let key_text = &rest[..key_end];
        let key = key_text.trim();
        rest = &rest[key_end..];
        if rest.is_empty() {
            out.push_str(space);
            out.push_str(key_text);
            break;
        }
        rest = rest[1..].trim_start();
        let (value, after) = if let Some(stripped) = rest.strip_prefix('\'') {
            let bytes = stripped.as_bytes();
            let mut end = stripped.len();
            let mut i = 0;
            while i < bytes.len() {
                if bytes[i] == b'\\' {
                    i += 2;
                    continue;
                }
                if bytes[i] == b'\'' {
                    end = i;
                    break;
                }
                i += 1;
            }
            let value_len = (end + 2).min(rest.len());
            (&rest[..value_len], &rest[value_len..])
        } else {
            // Unquoted: up to the first whitespace not escaped by a backslash.
            let mut end = rest.len();
            let mut chars = rest.char_indices();
            while let Some((i, c)) = chars.next() {
                if c == '\\' {
                    chars.next();
                } else if c.is_whitespace() {
                    end = i;
                    break;
                }
            }
            (&rest[..end], &rest[end..])
        };
        let bare = value
            .strip_prefix('\'')
            .and_then(|v| v.strip_suffix('\''))
            .unwrap_or(value);
        match f(key, bare) {
            None => {
                out.push_str(space);
                out.push_str(key_text);
                out.push('=');
                out.push_str(value);
            }
            Some(None) => {}
            Some(Some(v)) => {
                out.push_str(space);
                out.push_str(key_text);
                out.push('=');
                out.push_str(&v);
            }
        }
        rest = after;
    }
    out
}

/// The password libpq would use for `config` when its DSN has none:
/// `PGPASSWORD`, else the first matching line of the password file.
pub(crate) fn libpq_password(config: &tokio_postgres::Config) -> Option<String> {
    if let Ok(pw) = std::env::var("PGPASSWORD") {
        if !pw.is_empty() {
            return Some(pw);
        }
    }
    let path = match std::env::var_os("PGPASSFILE") {
        Some(p) => std::path::PathBuf::from(p),
        None => std::path::PathBuf::from(std::env::var_os("HOME")?).join(".pgpass"),
    };
    #[cfg(unix)]
    {
        // libpq ignores a password file others can read or write.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).ok()?.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(path = %path.display(), "password file ignored: its mode allows group or other access (chmod 0600)");
            return None;
        }
    }
    let text = std::fs::read_to_string(&path).ok()?;
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
    use std::io::Read;
    let what = format!("{what} {}", path.display());
    let unreadable = |e: std::io::Error| DsnFileError::Unreadable(format!("{what}: {e}"));
    let file = std::fs::File::open(path).map_err(unreadable)?;
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
    file.take(MAX_DSN_FILE)
        .read_to_string(&mut text)
        .map_err(unreadable)?;
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .ok_or_else(|| DsnFileError::Unreadable(format!("{what} holds no DSN")))
}

#[cfg(test)]
mod tests {
    use super::{map_params, redact};

    #[test]
    fn urls() {
        assert_eq!(redact("postgres://u:p@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgresql://u@h/db"), "postgresql://u@h/db");
        assert_eq!(
            redact("postgres://u:p%40x@h:1/db?sslmode=require&password=z"),
            "postgres://u:***@h:1/db?sslmode=require&password=***"
        );
        assert_eq!(redact("postgres://h"), "postgres://h");
        assert!(!redact("postgres://u:s3cr3t@h/db").contains("s3cr3t"));
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
        assert!(!redact("password = s3cr3t host=h").contains("s3cr3t"));
        assert_eq!(
            redact(r"host=h password=a\ b\ c user=u"),
            "host=h password=*** user=u"
        );
        assert_eq!(
            redact("host=h password='never closed"),
            "host=h password=***"
        );
    }

    #[test]
    fn urls_parsed_not_matched() {
        assert_eq!(redact("postgres://u:a/b?c@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u:a@b@h/db"), "postgres://u:***@h/db");
        assert_eq!(
            redact("postgres://h/db?pass%77ord=s3cr3t&sslmode=require"),
            "postgres://h/db?pass%77ord=***&sslmode=require"
        );
        assert_eq!(redact("POSTGRES://u:p@h/db"), "POSTGRES://u:***@h/db");
        // An '@' in the query hides more, never less.
        assert!(!redact("postgres://u:s3cr3t@h/db?application_name=a@b").contains("s3cr3t"));
    }

    #[test]
    fn rewrite_and_remove() {
        let f = |k: &str, v: &str| match k {
            "sslmode" if v == "verify-full" => Some(Some("require".to_owned())),
            "drop" => Some(None),
            _ => None,
        };
        assert_eq!(
            map_params("postgres://u:p@h/db?drop=1&sslmode=verify-full", true, f),
            "postgres://u:p@h/db?sslmode=require"
        );
        assert_eq!(
            map_params("postgres://h/db?drop=1", true, f),
            "postgres://h/db"
        );
        assert_eq!(
            map_params("host=h sslmode='verify-full' drop=x user=u", false, f),
            "host=h sslmode=require user=u"
        );
        assert_eq!(
            map_params("host=h sslmode=prefer", false, f),
            "host=h sslmode=prefer"
        );
    }
}
