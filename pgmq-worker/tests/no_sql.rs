//! pgmq-worker holds no SQL text: every statement the worker runs is
//! pgmq-client's, behind a named function on the client's call path (its
//! prepared statements, the fenced table statements built from a validated
//! `QueueName`, the SDK schema's trust check before first use).
//!
//! The check reads every string literal in the code of
//! `pgmq-worker/src/` (comments left out, so docs may name statements) and
//! fails on one that looks like SQL: one that starts with a statement's
//! keyword (`SELECT `, `DELETE `, `WITH `, ...), or has a clause of one
//! (`INSERT INTO`, `DELETE FROM`, `SELECT ... FROM`, `UPDATE ... SET`,
//! `FOR UPDATE`, `RETURNING`), a catalog or PGMQ function call
//! (`pg_catalog.`, `pgmq.f(`, `pgmq_sdk.`), a quoted queue table
//! (`pgmq."q_`) or a typed parameter (`$1::`). Keywords count in capitals
//! only, so log messages about a "LISTEN connection" or "could not sample
//! pgmq.metrics" pass.

use pgmq_testkit::modgraph::{rust_files, strip_comments};

/// A string literal of a source file: the line it starts on and its text
/// (escapes as written, line continuations joined).
#[derive(Debug, PartialEq)]
struct Literal {
    line: usize,
    text: String,
}

/// The string literals of Rust source `src`: plain (`"..."`), byte
/// (`b"..."`), C (`c"..."`) and raw (`r#"..."#`) ones, outside comments
/// (blanked first, lines kept) and char literals.
fn literals(src: &str) -> Vec<Literal> {
    let s: Vec<char> = strip_comments(src).chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < s.len() {
        let c = s[i];
        let next = s.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\'', '"', '\u{1F600}') or a lifetime ('a).
            if next == Some('\\') {
                // The quote, the backslash and the escaped char, then on to
                // the closing quote (`'\u{1F600}'` has more).
                i += 3;
                while i < s.len() && s[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if s.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if ident(c) {
            let start = i;
            while i < s.len() && ident(s[i]) {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let prefix = matches!(word.as_str(), "r" | "b" | "br" | "c" | "cr");
            if !prefix {
                continue;
            }
            let raw = word.ends_with('r');
            let mut hashes = 0;
            if raw {
                while s.get(i + hashes) == Some(&'#') {
                    hashes += 1;
                }
            }
            if s.get(i + hashes) != Some(&'"') {
                continue;
            }
            i += hashes;
            if raw {
                let (text, end, lines) = raw_body(&s, i + 1, hashes);
                out.push(Literal { line, text });
                line += lines;
                i = end;
            } else {
                let (text, end, lines) = body(&s, i + 1);
                out.push(Literal { line, text });
                line += lines;
                i = end;
            }
        } else if c == '"' {
            let (text, end, lines) = body(&s, i + 1);
            out.push(Literal { line, text });
            line += lines;
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

/// A plain string's text from `start` (after its opening quote), the index
/// after its closing quote, and the newlines it spans. A backslash at the
/// end of a line joins the next line, its leading whitespace dropped, as
/// the compiler reads it.
fn body(s: &[char], start: usize) -> (String, usize, usize) {
    let mut text = String::new();
    let mut lines = 0;
    let mut i = start;
    while i < s.len() {
        match s[i] {
            '"' => return (text, i + 1, lines),
            '\\' if s.get(i + 1) == Some(&'\n') => {
                i += 1;
                while i < s.len() && s[i].is_whitespace() {
                    if s[i] == '\n' {
                        lines += 1;
                    }
                    i += 1;
                }
            }
            '\\' => {
                text.push(s[i]);
                if let Some(&e) = s.get(i + 1) {
                    text.push(e);
                }
                i += 2;
            }
            c => {
                if c == '\n' {
                    lines += 1;
                }
                text.push(c);
                i += 1;
            }
        }
    }
    (text, i, lines)
}

/// A raw string's text from `start` (after its opening quote), closed by a
/// quote and `hashes` `#`s.
fn raw_body(s: &[char], start: usize, hashes: usize) -> (String, usize, usize) {
    let mut text = String::new();
    let mut lines = 0;
    let mut i = start;
    while i < s.len() {
        if s[i] == '"' && (1..=hashes).all(|k| s.get(i + k) == Some(&'#')) {
            return (text, i + 1 + hashes, lines);
        }
        if s[i] == '\n' {
            lines += 1;
        }
        text.push(s[i]);
        i += 1;
    }
    (text, i, lines)
}

/// Keywords a statement starts with, in capitals.
const STATEMENT_STARTS: &[&str] = &[
    "SELECT",
    "INSERT",
    "UPDATE",
    "DELETE",
    "MERGE",
    "WITH",
    "VALUES",
    "TABLE",
    "CREATE",
    "ALTER",
    "DROP",
    "TRUNCATE",
    "GRANT",
    "REVOKE",
    "COPY",
    "CALL",
    "DO",
    "SET",
    "RESET",
    "SHOW",
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "SAVEPOINT",
    "LOCK",
    "PREPARE",
    "EXECUTE",
    "DEALLOCATE",
    "DISCARD",
    "EXPLAIN",
    "ANALYZE",
    "VACUUM",
    "NOTIFY",
    "UNLISTEN",
];

/// What in `text` makes it SQL, if anything.
fn sql_sign(text: &str) -> Option<String> {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let first = flat.split(|c: char| !c.is_ascii_alphabetic()).next()?;
    if STATEMENT_STARTS.contains(&first) && flat.len() > first.len() {
        let after = flat[first.len()..].chars().next();
        if after.is_some_and(|c| c == ' ' || c == '(' || c == '*') {
            return Some(format!("starts with {first}"));
        }
    }
    let has = |s: &str| flat.contains(s);
    let later = |a: &str, b: &str| flat.find(a).is_some_and(|i| flat[i..].contains(b));
    let signs: [(bool, &str); 14] = [
        (has("INSERT INTO "), "INSERT INTO"),
        (has("DELETE FROM "), "DELETE FROM"),
        (later("SELECT ", " FROM "), "SELECT ... FROM"),
        (later("UPDATE ", " SET "), "UPDATE ... SET"),
        (has("FOR UPDATE"), "FOR UPDATE"),
        (has(" RETURNING "), "RETURNING"),
        (has("LISTEN \"") || has("LISTEN pgmq"), "LISTEN"),
        (has("pg_catalog."), "pg_catalog."),
        (has("pgmq_sdk."), "pgmq_sdk."),
        (has("pgmq.\""), "a quoted PGMQ table"),
        (has("pg_notify("), "pg_notify"),
        (has("set_config("), "set_config"),
        (has("$1::") || has("$2::"), "a typed parameter"),
        (pgmq_call(&flat), "a PGMQ function call"),
    ];
    signs
        .iter()
        .find(|(found, _)| *found)
        .map(|(_, what)| (*what).to_owned())
}

/// Whether `text` calls a function of the `pgmq` schema (`pgmq.read(`).
fn pgmq_call(text: &str) -> bool {
    text.match_indices("pgmq.").any(|(i, _)| {
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            return false;
        }
        let rest = &text[i + "pgmq.".len()..];
        let name_len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        name_len > 0 && rest[name_len..].starts_with('(')
    })
}

#[test]
fn the_worker_sources_hold_no_sql() {
    let files = rust_files(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    assert!(files.len() >= 20, "src read wrong: {} files", files.len());
    let mut found = Vec::new();
    let mut seen = 0;
    for (rel, text) in &files {
        for lit in literals(text) {
            seen += 1;
            if let Some(why) = sql_sign(&lit.text) {
                let rel = rel.display();
                let flat = lit.text.split_whitespace().collect::<Vec<_>>().join(" ");
                let shown: String = flat.chars().take(100).collect();
                let more = if shown.len() < flat.len() { "…" } else { "" };
                found.push(format!(
                    "  pgmq-worker/src/{rel}:{} ({why}): {shown}{more}",
                    lit.line
                ));
            }
        }
    }
    assert!(
        seen >= 100,
        "too few string literals found ({seen}): the scanner is off"
    );
    assert!(
        found.is_empty(),
        "pgmq-worker holds no SQL text: put each statement in pgmq-client, behind a named \
         function on its call path (a `Stmt` in pgmq-client/src/statements.rs, or a table \
         statement built from a validated QueueName, with a `Pgmq` method), and call that. \
         SQL found:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scanner_reads_literals_not_comments_or_chars() {
    let src = r####"
// "SELECT 1 FROM t" in a comment
/* "DELETE FROM t" /* nested */ still a comment */
/// Docs may say `SELECT * FROM pgmq.read(...)`.
fn f<'a>(x: &'a str) -> char {
    let q = '"';
    let e = '\'';
    let s = "LISTEN connection lost; reconnecting";
    let t = "SELECT m.msg_id \
             FROM {t} AS m";
    let r = r#"WITH d AS (DELETE FROM x RETURNING 1) SELECT "quoted""#;
    let b = b"bytes";
    '"'
}
"####;
    let lits = literals(src);
    let texts: Vec<&str> = lits.iter().map(|l| l.text.as_str()).collect();
    assert_eq!(
        texts,
        [
            "LISTEN connection lost; reconnecting",
            "SELECT m.msg_id FROM {t} AS m",
            "WITH d AS (DELETE FROM x RETURNING 1) SELECT \"quoted\"",
            "bytes",
        ]
    );
    assert_eq!(lits[0].line, 8);
    assert_eq!(lits[1].line, 9);
    assert_eq!(lits[2].line, 11);
}

#[test]
fn sql_is_told_from_messages() {
    for sql in [
        "SELECT pg_catalog.array_agg(msg_id) FROM {} WHERE msg_id = ANY($1::bigint[])",
        "SELECT 1",
        "WITH dead AS (SELECT * FROM x) SELECT 1",
        "DELETE FROM {t} AS m USING locked l",
        "UPDATE {t} SET vt = now()",
        "SELECT m.msg_id FROM {t} AS m ORDER BY m.msg_id FOR UPDATE OF m",
        "GRANT SELECT ON pgmq.q_<queue> TO app",
        "select * from pgmq.read($1, $2, $3)",
        "x = pgmq_sdk.queue_paused('q')",
        "SET lock_timeout = '1s'",
        "LISTEN \"pgmq.q_jobs.INSERT\"",
        "the table pgmq.\"q_jobs\"",
    ] {
        assert!(sql_sign(sql).is_some(), "not taken for SQL: {sql}");
    }
    for message in [
        "LISTEN connection lost; reconnecting",
        "the group's LISTEN connection",
        "claims call pgmq.read: the queue table's layout is not one this worker knows",
        "could not sample pgmq.metrics",
        "could not check for the pgmq_sdk schema; starting anyway",
        "delete",
        "dead-letter",
        "SELECTED",
        "x-pgmq-worker-attempts",
        "pid {} (application_name '{}', {}, transaction open {:.0} s, holding {})",
    ] {
        assert_eq!(sql_sign(message), None, "taken for SQL: {message}");
    }
}
