//! Property test: whatever a password holds (`/ ? @ % : & = ' " \` and
//! spaces among them), written into a DSN the way libpq and tokio-postgres
//! read it, `redact_dsn` never shows it, raw or encoded.

use pgmq_client::redact_dsn;
use proptest::prelude::*;

/// Percent-encodes every byte outside RFC 3986's unreserved set.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A key=value value: quoted, quotes and backslashes escaped.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// A key=value value unquoted: spaces, quotes and backslashes escaped.
fn escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_whitespace() || c == '\\' || c == '\'' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn hidden(dsn: &str, password: &str) -> Result<(), TestCaseError> {
    let shown = redact_dsn(dsn);
    for form in [
        password.to_owned(),
        encode(password),
        quote(password),
        escape(password),
    ] {
        prop_assert!(!shown.contains(&form), "{dsn:?} shown as {shown:?}");
    }
    Ok(())
}

/// A password with a raw `/` in a URL's user information: libpq finds no
/// user information (it reads host, port and database name from it), and
/// the redacted form must not show those fields either.
#[test]
fn a_raw_slash_in_a_url_password_is_not_shown() {
    for dsn in [
        "postgresql://app:Zq/AA@db/app",
        "postgres://app:123/x@db/app",
        "postgres://u:pa/ss?application_name=x@h/db",
    ] {
        let shown = redact_dsn(dsn);
        assert_eq!(shown, pgmq_client::DSN_RAW_CREDENTIALS, "{dsn}");
    }
    // Encoded as libpq requires, the same passwords redact as usual.
    assert_eq!(
        redact_dsn("postgresql://app:Zq%2FAA@db/app"),
        "postgresql://app:***@db/app"
    );
    // Without a ':' before the '/', nothing looks like a password.
    assert_eq!(
        redact_dsn("postgres://db/app?application_name=ops@acme"),
        "postgres://db/app?application_name=ops%40acme"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn passwords_never_survive_redaction(
        body in r#"[a-zA-Z0-9/?@%:&=#'" \\]{3,24}"#,
    ) {
        // A fixed lead makes an accidental match with the rest of the DSN impossible.
        let password = format!("Zq{body}");
        let p = password.as_str();
        // URL, userinfo percent-encoded (as libpq requires).
        hidden(&format!("postgres://app:{}@db.example:5432/app?sslmode=require", encode(p)), p)?;
        // URL, userinfo written raw (tokio-postgres takes up to the first '@').
        if !p.contains('@') {
            hidden(&format!("postgresql://app:{p}@db/app"), p)?;
        }
        // URL, password in the query.
        hidden(&format!("postgres://app@db/app?password={}&application_name=x", encode(p)), p)?;
        // key=value, quoted and escaped.
        hidden(&format!("host=db user=app password={} dbname=app", quote(p)), p)?;
        hidden(&format!("password = {} host=db", quote(p)), p)?;
        hidden(&format!("host=db password={} user=app", escape(p)), p)?;
    }
}
