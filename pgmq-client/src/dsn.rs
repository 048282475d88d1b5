//! DSN helpers: removing the password before a DSN is shown anywhere.

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
    let dsn = dsn.trim();
    if let Some(rest) = dsn
        .strip_prefix("postgres://")
        .map(|r| ("postgres://", r))
        .or_else(|| {
            dsn.strip_prefix("postgresql://")
                .map(|r| ("postgresql://", r))
        })
    {
        let (scheme, rest) = rest;
        let (authority_end, tail) = match rest.find(['/', '?']) {
            Some(i) => (i, &rest[i..]),
            None => (rest.len(), ""),
        };
        let authority = &rest[..authority_end];
        let authority = match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                let host = &authority[at..];
                match userinfo.find(':') {
                    Some(colon) => format!("{}:***{}", &userinfo[..colon], host),
                    None => authority.to_owned(),
                }
            }
            None => authority.to_owned(),
        };
        let tail = redact_query(tail);
        return format!("{scheme}{authority}{tail}");
    }
    // key=value form: values may be quoted with single quotes.
    let mut out = String::with_capacity(dsn.len());
    let mut rest = dsn;
    while !rest.is_empty() {
        let trimmed = rest.trim_start();
        out.push_str(&rest[..rest.len() - trimmed.len()]);
        rest = trimmed;
        if rest.is_empty() {
            break;
        }
        let key_end = rest.find('=').unwrap_or(rest.len());
        let key = rest[..key_end].trim();
        out.push_str(&rest[..key_end]);
        rest = &rest[key_end..];
        if rest.is_empty() {
            break;
        }
        out.push('=');
        rest = rest[1..].trim_start();
        let (value, after) = if let Some(stripped) = rest.strip_prefix('\'') {
            let mut end = stripped.len();
            let bytes = stripped.as_bytes();
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
        if key.eq_ignore_ascii_case("password") {
            out.push_str("***");
        } else {
            out.push_str(value);
        }
        rest = after;
    }
    out
}

fn redact_query(tail: &str) -> String {
    let Some(q) = tail.find('?') else {
        return tail.to_owned();
    };
    let (path, query) = tail.split_at(q + 1);
    let parts: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
            _ => kv.to_owned(),
        })
        .collect();
    format!("{path}{}", parts.join("&"))
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
}
