//! DSN helpers: removing the password before a DSN is shown anywhere, and
//! rewriting parameters (`sslmode`) before tokio-postgres parses the DSN.

/// Returns `dsn` with its password replaced by `***`, in both the URL form
/// (`postgres://user:secret@host/db`, `?password=secret`) and the key=value
/// form (`host=db password=secret`).
///
/// ```
/// use pgmq_client::redact_dsn;
/// assert_eq!(redact_dsn("postgres://app:hunter2@db:5432/app"), "postgres://app:***@db:5432/app");
/// assert_eq!(redact_dsn("host=db user=app password=hunter2"), "host=db user=app password=***");
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
/// URL's `user:password@` part is rewritten as key `password` too.
pub(crate) fn map_params(
    dsn: &str,
    userinfo: bool,
    mut f: impl FnMut(&str, &str) -> Option<Option<String>>,
) -> String {
    let dsn = dsn.trim();
    let url = ["postgres://", "postgresql://"]
        .iter()
        .find_map(|scheme| dsn.strip_prefix(scheme).map(|rest| (*scheme, rest)));
    match url {
        Some((scheme, rest)) => map_url(scheme, rest, userinfo, &mut f),
        None => map_key_values(dsn, &mut f),
    }
}

type ParamFn<'a> = dyn FnMut(&str, &str) -> Option<Option<String>> + 'a;

fn map_url(scheme: &str, rest: &str, userinfo: bool, f: &mut ParamFn<'_>) -> String {
    let (authority_end, tail) = match rest.find(['/', '?']) {
        Some(i) => (i, &rest[i..]),
        None => (rest.len(), ""),
    };
    let authority = &rest[..authority_end];
    let authority = match authority.rfind('@') {
        Some(at) if userinfo => {
            let (info, host) = authority.split_at(at);
            match info.split_once(':') {
                Some((user, password)) => match f("password", password) {
                    Some(Some(v)) => format!("{user}:{v}{host}"),
                    Some(None) => format!("{user}{host}"),
                    None => authority.to_owned(),
                },
                None => authority.to_owned(),
            }
        }
        _ => authority.to_owned(),
    };
    let Some(q) = tail.find('?') else {
        return format!("{scheme}{authority}{tail}");
    };
    let (path, query) = (&tail[..q], &tail[q + 1..]);
    let parts: Vec<String> = query
        .split('&')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match f(k, v) {
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
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
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
