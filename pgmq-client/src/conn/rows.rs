//! Row decoding: the columns of a returned row read without a panic (a
//! type or NULL mismatch is [`Error::UnexpectedRow`]), and decoding errors
//! of message bodies and headers stripped of the values they quote.

use crate::conn::error::Error;

/// Reads column `idx` of `row`, a type or NULL mismatch becoming
/// [`Error::UnexpectedRow`] rather than a panic.
pub(crate) fn col<'a, T: postgres_types::FromSql<'a>>(
    row: &'a tokio_postgres::Row,
    idx: usize,
) -> Result<T, Error> {
    row.try_get(idx)
        .map_err(|source| Error::UnexpectedRow { source })
}

/// Column `idx` of the first row, or `default` when there is no row.
pub(crate) fn first_col<'a, T: postgres_types::FromSql<'a>>(
    rows: &'a [tokio_postgres::Row],
    idx: usize,
    default: T,
) -> Result<T, Error> {
    match rows.first() {
        Some(r) => col(r, idx),
        None => Ok(default),
    }
}

/// Column 0 of every row.
pub(crate) fn col0s<'a, T: postgres_types::FromSql<'a>>(
    rows: &'a [tokio_postgres::Row],
) -> Result<Vec<T>, Error> {
    rows.iter().map(|r| col(r, 0)).collect()
}

/// The same decoding error, its text without any value taken from the body.
///
/// serde quotes offending values (`invalid type: string "4111 1111"`,
/// ``unknown variant `x` ``); those are replaced by `…`. What follows
/// `, expected` describes the target type and is kept, as are the names in
/// `missing field` (they come from the type too).
pub(crate) fn payload_free(e: &serde_json::Error) -> serde_json::Error {
    let text = e.to_string();
    // serde_json appends " at line L column C"; keep the position separately.
    let reason = match text.rfind(" at line ") {
        Some(i) if e.line() > 0 => &text[..i],
        _ => text.as_str(),
    };
    let (about_body, about_type) = match reason.find(", expected") {
        Some(i) => reason.split_at(i),
        None => (reason, ""),
    };
    let about_body = if about_body.starts_with("missing field") {
        about_body.to_owned()
    } else {
        blank_quoted(about_body)
    };
    let msg = if e.line() > 0 {
        format!(
            "{about_body}{about_type} at line {} column {}",
            e.line(),
            e.column()
        )
    } else {
        format!("{about_body}{about_type}")
    };
    <serde_json::Error as serde::de::Error>::custom(msg)
}

/// Replaces the contents of `"..."` and `` `...` `` spans by `…`.
fn blank_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' | '`' => {
                out.push(c);
                out.push('…');
                let mut escaped = false;
                for d in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if d == '\\' && c == '"' {
                        escaped = true;
                    } else if d == c {
                        out.push(c);
                        break;
                    }
                }
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_errors_lose_the_values() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct S {
            id: u64,
            kind: K,
        }
        #[derive(Debug, serde::Deserialize)]
        enum K {
            A,
        }
        for (body, secret, kept) in [
            (
                r#"{"id": "4111 1111", "kind": "A"}"#,
                "4111",
                "expected u64",
            ),
            (r#"{"id": 1, "kind": "Zsecret"}"#, "Zsecret", "expected `A`"),
            (r#"{"id": -77123, "kind": "A"}"#, "77123", "expected u64"),
            (r#"{"id": 1.5e300, "kind": "A"}"#, "1.5", "expected u64"),
            (r#"{"kind": "A"}"#, "\u{0}", "missing field `id`"),
            (r#"{"id": 1, "kind": "A""#, "\u{0}", "EOF"),
        ] {
            let e = serde_json::from_str::<S>(body).unwrap_err();
            let clean = payload_free(&e);
            let text = clean.to_string();
            assert!(!text.contains(secret), "{text}");
            assert!(!format!("{clean:?}").contains(secret), "{clean:?}");
            assert!(text.contains(kept), "{text}");
            assert!(text.contains("line 1 column"), "{text}");
        }
        assert_eq!(blank_quoted(r#"a "x\"y" b `z` c"#), "a \"…\" b `…` c");
    }
}
