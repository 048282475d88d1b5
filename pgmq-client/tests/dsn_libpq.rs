//! libpq is the oracle of the crate's DSN parser: a small C program built
//! here against libpq (tests/libpq_oracle/oracle.c, `libpq-dev`) prints what
//! `PQconninfoParse` makes of a DSN, and generated DSNs of both forms must
//! parse the same in [`ConnInfo::parse`]: the same keywords with the same
//! values, or an error from both. Rendered again (`ConnInfo::to_dsn`) they
//! must parse to the same values in both parsers, and their redacted forms
//! to the same values with the password replaced.
//!
//! The one difference the crate makes on purpose in what is generated here:
//! a percent-escape that decodes to bytes that are not UTF-8 is an error in
//! the crate (libpq passes the bytes on). NUL bytes, the crate's other
//! refusal, are not generated (libpq would stop reading at them).
//!
//! 1,500 DSNs of each form by default; `PGMQ_DSN_CASES=40000` for a longer
//! run. Fails, rather than skipping, when libpq-dev is missing: install it with
//! `apt-get install -y libpq-dev` (scripts/test.sh does).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use pgmq_client::ConnInfo;
use proptest::prelude::*;

struct Oracle {
    _child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

/// What a parser made of a DSN: each keyword set with its value's bytes.
type Parsed = Option<BTreeMap<String, Vec<u8>>>;

fn pg_config(arg: &str) -> String {
    let out = Command::new("pg_config")
        .arg(arg)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "pg_config not found ({e}): the libpq oracle test needs libpq-dev \
             (apt-get install -y libpq-dev)"
            )
        });
    assert!(out.status.success(), "pg_config {arg} failed");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Builds the oracle in a folder of its own, removed once it runs.
fn build_oracle() -> std::path::PathBuf {
    static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("pgmq-libpq-oracle-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("oracle");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/libpq_oracle/oracle.c");
    let include = pg_config("--includedir");
    let lib = pg_config("--libdir");
    assert!(
        std::path::Path::new(&include).join("libpq-fe.h").exists(),
        "libpq-fe.h is not in {include}: install libpq-dev (apt-get install -y libpq-dev)"
    );
    let out = Command::new("cc")
        .args(["-O1", "-o"])
        .arg(&exe)
        .arg(src)
        .arg(format!("-I{include}"))
        .arg(format!("-L{lib}"))
        .arg(format!("-Wl,-rpath,{lib}"))
        .arg("-lpq")
        .output()
        .expect("cc, to build the libpq oracle");
    assert!(
        out.status.success(),
        "building the libpq oracle failed (is libpq-dev installed? apt-get install -y \
         libpq-dev): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

fn oracle() -> &'static Mutex<Oracle> {
    static ORACLE: OnceLock<Mutex<Oracle>> = OnceLock::new();
    ORACLE.get_or_init(|| {
        let exe = build_oracle();
        let mut child = Command::new(&exe)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("running the libpq oracle");
        // It runs on: its folder can go.
        std::fs::remove_dir_all(exe.parent().unwrap()).unwrap();
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        Mutex::new(Oracle {
            _child: child,
            input,
            output,
        })
    })
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn libpq(dsn: &str) -> Parsed {
    let mut o = oracle().lock().unwrap_or_else(|e| e.into_inner());
    o.input.write_all(dsn.as_bytes()).unwrap();
    o.input.write_all(b"\0").unwrap();
    o.input.flush().unwrap();
    let mut line = String::new();
    o.output.read_line(&mut line).unwrap();
    let line = line.trim_end_matches('\n');
    if line == "ERR" {
        return None;
    }
    let rest = line.strip_prefix("OK").expect("the oracle's answer");
    Some(
        rest.split(' ')
            .filter(|s| !s.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap();
                (k.to_owned(), unhex(v))
            })
            .collect(),
    )
}

fn crate_parse(dsn: &str) -> Parsed {
    ConnInfo::parse(dsn).ok().map(|info| {
        info.iter()
            .map(|(k, v)| (k.to_owned(), v.as_bytes().to_vec()))
            .collect()
    })
}

/// Compares both parsers on `dsn`, and both on its redacted form; true
/// when the DSN parsed.
fn agree(dsn: &str) -> Result<bool, TestCaseError> {
    let theirs = libpq(dsn);
    let ours = crate_parse(dsn);
    let not_utf8 = |p: &Parsed| {
        p.as_ref()
            .is_some_and(|m| m.values().any(|v| std::str::from_utf8(v).is_err()))
    };
    if ours.is_none() && not_utf8(&theirs) {
        // The named difference: values that are not UTF-8 are refused.
        return Ok(false);
    }
    prop_assert_eq!(&ours, &theirs, "DSN {:?}", dsn);
    let Some(mut expected) = ours else {
        let shown = pgmq_client::redact_dsn(dsn);
        prop_assert_eq!(shown, "<unparsable DSN>");
        return Ok(false);
    };
    // The DSN rendered again with its password parses to the same values.
    let again = ConnInfo::parse(dsn).unwrap().to_dsn();
    prop_assert_eq!(
        &libpq(&again),
        &Some(expected.clone()),
        "DSN {:?} rendered as {:?}",
        dsn,
        again
    );
    prop_assert_eq!(
        &crate_parse(&again),
        &Some(expected.clone()),
        "DSN {:?} rendered as {:?}",
        dsn,
        again
    );
    let redacted = ConnInfo::parse(dsn).unwrap().redacted();
    if redacted == pgmq_client::DSN_RAW_CREDENTIALS {
        // The named difference of redaction: a URL whose '@' libpq does
        // not take as the end of the user information (a '/' before it) is
        // not shown, since a password with a raw '/' would be.
        let authority = &dsn[dsn.find("://").unwrap() + 3..];
        let authority = &authority[..authority.find('/').unwrap()];
        prop_assert!(
            !authority.contains('@') && authority.contains(':'),
            "DSN {:?} hidden as raw credentials",
            dsn
        );
        prop_assert_eq!(pgmq_client::redact_dsn(dsn), redacted);
        return Ok(true);
    }
    if let Some(pw) = expected.get_mut("password") {
        *pw = b"***".to_vec();
    }
    let expected = Some(expected);
    prop_assert_eq!(
        &crate_parse(&redacted),
        &expected,
        "DSN {:?} redacted as {:?}",
        dsn,
        redacted
    );
    prop_assert_eq!(
        &libpq(&redacted),
        &expected,
        "DSN {:?} redacted as {:?} (libpq)",
        dsn,
        redacted
    );
    prop_assert_eq!(pgmq_client::redact_dsn(dsn), redacted);
    Ok(true)
}

/// Characters with a meaning somewhere in a DSN, and non-ASCII ones.
const SPECIAL: &[char] = &[
    '@', ':', '/', '?', '#', '&', '=', '%', '\'', ' ', '\\', ',', '[', ']', '"', '+', '\t', '\n',
    'é', 'ü', '日', '€',
];

fn special() -> impl Strategy<Value = char> {
    prop::sample::select(SPECIAL)
}

fn percent(c: char) -> String {
    let mut buf = [0; 4];
    c.encode_utf8(&mut buf)
        .bytes()
        .map(|b| format!("%{b:02X}"))
        .collect()
}

/// A piece of URL text: mostly plain, with escaped and raw special
/// characters and now and then an invalid or non-UTF-8 escape.
fn url_atom() -> impl Strategy<Value = String> {
    prop_oneof![
        10 => "[a-zA-Z0-9._~-]{1,4}",
        4 => special().prop_map(percent),
        1 => special().prop_map(|c| c.to_string()),
        1 => prop::sample::select(&["%zz", "%4", "%", "%00", "%C3", "%e9", "%Ff", "%2c"][..])
            .prop_map(str::to_owned),
    ]
}

fn url_text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(url_atom(), 0..max).prop_map(|v| v.concat())
}

const PARAM_KEYS: &[&str] = &[
    "user",
    "password",
    "host",
    "port",
    "dbname",
    "sslmode",
    "sslrootcert",
    "channel_binding",
    "connect_timeout",
    "application_name",
    "hostaddr",
    "options",
    "ssl",
    "no_such_keyword",
];

fn value_for(key: &'static str) -> BoxedStrategy<String> {
    match key {
        "sslmode" => prop_oneof![
            4 => prop::sample::select(
                &["disable", "allow", "prefer", "require", "verify-ca", "verify-full"][..]
            )
            .prop_map(str::to_owned),
            1 => url_text(3),
        ]
        .boxed(),
        "ssl" => prop_oneof![Just("true".to_owned()), url_text(2)].boxed(),
        "channel_binding" => prop::sample::select(&["disable", "prefer", "require", "x"][..])
            .prop_map(str::to_owned)
            .boxed(),
        "connect_timeout" | "port" => {
            prop_oneof![3 => "[0-9]{1,5}", 1 => "[0-9]{1,5}(,[0-9]{0,5}){0,2}", 1 => url_text(2)]
                .boxed()
        }
        _ => url_text(6).boxed(),
    }
}

fn param() -> impl Strategy<Value = String> {
    prop::sample::select(PARAM_KEYS)
        .prop_flat_map(|k| value_for(k).prop_map(move |v| format!("{k}={v}")))
}

fn host() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z][a-z0-9.-]{0,8}",
        2 => Just("127.0.0.1".to_owned()),
        2 => prop::sample::select(&["[::1]", "[fe80::1%25eth0]", "[", "[]", "[::1]x"][..])
            .prop_map(str::to_owned),
        1 => Just(String::new()),
        2 => url_text(4),
    ]
}

fn port() -> impl Strategy<Value = String> {
    prop_oneof![4 => "[0-9]{1,5}", 1 => Just(String::new()), 1 => url_text(2)]
}

fn url_dsn() -> impl Strategy<Value = String> {
    (
        prop::sample::select(&["postgres://", "postgresql://"][..]),
        prop::option::of((url_text(5), prop::option::of(url_text(8)))),
        prop::collection::vec((host(), prop::option::of(port())), 1..4),
        prop::option::of(url_text(5)),
        prop::option::of(prop::collection::vec(param(), 0..5)),
    )
        .prop_map(|(scheme, userinfo, hosts, db, params)| {
            let mut s = scheme.to_owned();
            if let Some((user, password)) = userinfo {
                s.push_str(&user);
                if let Some(p) = password {
                    s.push(':');
                    s.push_str(&p);
                }
                s.push('@');
            }
            let hosts: Vec<String> = hosts
                .into_iter()
                .map(|(h, p)| match p {
                    Some(p) => format!("{h}:{p}"),
                    None => h,
                })
                .collect();
            s.push_str(&hosts.join(","));
            if let Some(db) = db {
                s.push('/');
                s.push_str(&db);
            }
            if let Some(params) = params {
                s.push('?');
                s.push_str(&params.join("&"));
            }
            s
        })
}

/// A key=value value's raw text: plain characters and special ones.
fn kv_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            6 => "[a-zA-Z0-9._-]{1,4}",
            3 => special().prop_map(|c| c.to_string()),
        ],
        0..6,
    )
    .prop_map(|v| v.concat())
}

/// A value written as a DSN writer would: quoted with escapes, escaped
/// without quotes, or raw (which may not survive as written).
fn kv_value() -> impl Strategy<Value = String> {
    (kv_text(), 0..5u8).prop_map(|(v, style)| match style {
        0 | 1 => format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'")),
        2 | 3 => v
            .chars()
            .map(|c| {
                if c.is_whitespace() || c == '\\' || c == '\'' {
                    format!("\\{c}")
                } else {
                    c.to_string()
                }
            })
            .collect(),
        _ => v,
    })
}

fn kv_dsn() -> impl Strategy<Value = String> {
    let pair = (
        // `ssl` is a URL query key only.
        prop::sample::select(PARAM_KEYS).prop_filter("URL only", |k| *k != "ssl"),
        prop::sample::select(&["=", " = ", "= ", " ="][..]),
        kv_value(),
    )
        .prop_map(|(k, eq, v)| format!("{k}{eq}{v}"));
    (
        prop::collection::vec(
            (pair, prop::sample::select(&[" ", "  ", "\t", "\n", ""][..])),
            1..6,
        ),
        prop::sample::select(&["", " ", "\t "][..]),
    )
        .prop_map(|(pairs, lead)| {
            let mut s = lead.to_owned();
            for (p, sep) in pairs {
                s.push_str(&p);
                s.push_str(sep);
            }
            s
        })
}

/// Generated DSNs of each form: 1,500, or `PGMQ_DSN_CASES` for a longer run.
fn cases() -> u32 {
    std::env::var("PGMQ_DSN_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1500)
}

/// Runs `agree` over [`cases`] DSNs from `dsns` (a failure prints the
/// smallest failing DSN proptest finds), and checks that the generator
/// stays useful: at least a quarter of them parse.
fn differential(dsns: impl Strategy<Value = String>) {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let parsed = std::sync::atomic::AtomicU32::new(0);
    let total = std::sync::atomic::AtomicU32::new(0);
    let result = runner.run(&dsns, |dsn| {
        total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if agree(&dsn)? {
            parsed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (parsed, total) = (parsed.into_inner(), total.into_inner());
    assert!(total >= cases(), "{total} DSNs");
    assert!(parsed * 4 >= total, "only {parsed} of {total} DSNs parsed");
}

#[test]
fn url_dsns_parse_as_in_libpq() {
    differential(url_dsn());
}

#[test]
fn key_value_dsns_parse_as_in_libpq() {
    differential(kv_dsn());
}

#[test]
fn the_issues_dsns_parse_as_in_libpq() {
    for dsn in [
        "postgres://qpw:pa?ss@127.0.0.1:5432/postgres?sslmode=require",
        "postgres://app@db/app?password=s3cret&application_name=ops@acme",
        "postgres://app@db:5432/app?password=hunter@2x",
        "postgres://h/db?application_name=%zé",
        "postgres://u:a/b?c@h/db",
        "POSTGRES://u:p@h/db",
        " postgres://h/db",
        "postgres://h1:1,h2,[::1]:3/db?ssl=true",
        "postgres://h/db?requiressl=1",
        "host=h requiressl=0 sslmode=require",
        "host='a b' password=x\\ y user='it\\'s'",
        "host=h password='unterminated",
        "postgres://%C3%A9@h",
    ] {
        agree(dsn).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn the_differences_are_the_named_ones() {
    // Not UTF-8 once decoded: libpq passes the bytes on, the crate refuses.
    let dsn = "postgres://h/db?application_name=%E9";
    assert!(libpq(dsn).is_some());
    assert!(ConnInfo::parse(dsn).is_err());
    // A NUL byte: libpq (a C string) stops reading there; the crate refuses.
    assert!(ConnInfo::parse("host=h\0 password=x").is_err());
}

#[test]
fn every_libpq_keyword_is_known() {
    let exe = build_oracle();
    let out = Command::new(&exe).arg("--keywords").output().unwrap();
    std::fs::remove_dir_all(exe.parent().unwrap()).unwrap();
    assert!(out.status.success());
    let keywords = String::from_utf8(out.stdout).unwrap();
    assert!(keywords.lines().count() > 20, "{keywords}");
    for k in keywords.lines() {
        assert!(
            ConnInfo::parse(&format!("{k}=x")).is_ok(),
            "libpq knows {k}, the crate does not"
        );
    }
}
