//! The password stays off the command line: the bench connects with it only
//! in `PGPASSWORD`, only in a password file (`~/.pgpass` or `PGPASSFILE`,
//! libpq's format, mode 0600), or only in a `--dsn-file`; a `--dsn-file`
//! others may read is refused; and the password appears in neither the
//! document, stdout, stderr, nor the argv of the bench or anything it starts.
//! The scripts that run the bench pass the DSN in the environment.

#![cfg(unix)]

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{bench, dsn_parts, temp_path, write_private, DsnParts, TempDb};

/// A short run that opens every kind of connection: the SDK pool and the
/// admin connection (send_single), and the baseline's plain connections.
fn tiny_args(output: &Path) -> Vec<String> {
    [
        "--output",
        output.to_str().unwrap(),
        "--sections",
        "send_single,baseline",
        "--single-messages",
        "20",
        "--batch-messages",
        "40",
        "--messages",
        "40",
        "--repeat",
        "1",
        "--warmup",
        "0",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A command with no password source but the ones a test adds: no
/// PGPASSWORD, no PGPASSFILE, HOME an empty folder (no ~/.pgpass).
fn bare(home: &Path) -> Command {
    let mut c = bench();
    c.env_remove("PGPASSWORD")
        .env_remove("PGPASSFILE")
        .env_remove("PGMQ_BENCH_DSN")
        .env("HOME", home);
    c
}

fn fresh_home() -> common::TempPath {
    let home = temp_path("home");
    std::fs::create_dir_all(&home).unwrap();
    home
}

/// The argv of `pid` and of every process below it.
fn argvs_under(pid: u32) -> Vec<String> {
    let mut family = vec![pid];
    let mut found = Vec::new();
    // Children first appear after their parent: a few passes over /proc.
    for _ in 0..3 {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(p) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
                continue;
            };
            // pid (comm) state ppid ...: comm may hold spaces, so after the last ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|s| s.parse::<u32>().ok());
            if ppid.is_some_and(|pp| family.contains(&pp)) && !family.contains(&p) {
                family.push(p);
            }
        }
    }
    for p in family {
        if let Ok(raw) = std::fs::read(format!("/proc/{p}/cmdline")) {
            found.push(String::from_utf8_lossy(&raw).replace('\0', " "));
        }
    }
    found
}

/// Runs `cmd`, reading the argv of the bench and of its children while it
/// runs; returns the output and every argv seen.
fn run_watched(mut cmd: Command) -> (Output, Vec<String>) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out_pipe = child.stdout.take().unwrap();
    let mut err_pipe = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        out_pipe.read_to_end(&mut v).unwrap();
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        err_pipe.read_to_end(&mut v).unwrap();
        v
    });
    let mut argvs = Vec::new();
    let status = loop {
        argvs.extend(argvs_under(child.id()));
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    argvs.sort();
    argvs.dedup();
    let output = Output {
        status,
        stdout: out_reader.join().unwrap(),
        stderr: err_reader.join().unwrap(),
    };
    (output, argvs)
}

/// The run succeeded, wrote a document, and the password is nowhere to be seen.
fn assert_connected_without_leaks(
    what: &str,
    parts: &DsnParts,
    out: &Output,
    argvs: &[String],
    doc: &Path,
) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}: the run failed: {stderr}"
    );
    let text = std::fs::read_to_string(doc).unwrap();
    let pw = &parts.password;
    assert!(
        !text.contains(pw.as_str()),
        "{what}: password in the document"
    );
    assert!(!stdout.contains(pw.as_str()), "{what}: password on stdout");
    assert!(!stderr.contains(pw.as_str()), "{what}: password on stderr");
    assert!(!argvs.is_empty(), "{what}: no argv was read");
    for argv in argvs {
        assert!(!argv.contains(pw.as_str()), "{what}: password in argv");
    }
    // The document records where it ran, without the password.
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let recorded = doc["metadata"]["database"]["dsn"].as_str().unwrap();
    assert!(recorded.contains(&parts.dbname), "{recorded}");
}

/// The same run with no password source at all fails: the password really
/// came from where the test put it.
fn assert_refused_without_a_password(parts: &DsnParts, extra_env: &[(&str, &str)]) {
    let home = fresh_home();
    let doc = temp_path("none.json");
    let mut cmd = bare(&home);
    cmd.env("PGMQ_BENCH_DSN", &parts.without_password)
        .args(tiny_args(&doc));
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "connected without a password: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!doc.exists());
}

/// A password-file line for `parts`, with `:` and `\` escaped.
fn pgpass_line(parts: &DsnParts) -> String {
    let esc = |s: &str| s.replace('\\', "\\\\").replace(':', "\\:");
    format!(
        "# a comment\n*:*:other_db:*:wrong\n{}:{}:{}:{}:{}\n",
        esc(&parts.host),
        parts.port,
        esc(&parts.dbname),
        esc(&parts.user),
        esc(&parts.password)
    )
}

#[test]
fn password_only_in_pgpassword() {
    let db = TempDb::new("pw_env");
    let parts = dsn_parts(&db.dsn);
    let home = fresh_home();
    let doc = temp_path("env.json");
    let mut cmd = bare(&home);
    cmd.env("PGMQ_BENCH_DSN", &parts.without_password)
        .env("PGPASSWORD", &parts.password)
        .args(tiny_args(&doc));
    let (out, argvs) = run_watched(cmd);
    assert_connected_without_leaks("PGPASSWORD", &parts, &out, &argvs, &doc);
    assert_refused_without_a_password(&parts, &[]);
}

#[test]
fn password_only_in_a_pgpass_file() {
    let db = TempDb::new("pw_file");
    let parts = dsn_parts(&db.dsn);

    // ~/.pgpass in a temporary HOME.
    let home = fresh_home();
    write_private(&home.join(".pgpass"), &pgpass_line(&parts), 0o600);
    let doc = temp_path("home.json");
    let mut cmd = bare(&home);
    cmd.env("PGMQ_BENCH_DSN", &parts.without_password)
        .args(tiny_args(&doc));
    let (out, argvs) = run_watched(cmd);
    assert_connected_without_leaks("~/.pgpass", &parts, &out, &argvs, &doc);

    // PGPASSFILE elsewhere, the DSN without password on the command line.
    let passfile = temp_path("passfile");
    write_private(&passfile, &pgpass_line(&parts), 0o600);
    let doc = temp_path("passfile.json");
    let home = fresh_home();
    let mut cmd = bare(&home);
    cmd.env("PGPASSFILE", &passfile)
        .arg("--dsn")
        .arg(&parts.without_password)
        .args(tiny_args(&doc));
    let (out, argvs) = run_watched(cmd);
    assert_connected_without_leaks("PGPASSFILE", &parts, &out, &argvs, &doc);

    // As libpq does, a password file others may read is ignored.
    let open = temp_path("open-passfile");
    write_private(&open, &pgpass_line(&parts), 0o644);
    assert_refused_without_a_password(&parts, &[("PGPASSFILE", open.to_str().unwrap())]);
}

#[test]
fn password_only_in_a_dsn_file() {
    let db = TempDb::new("pw_dsnfile");
    let parts = dsn_parts(&db.dsn);
    let dsn_file = temp_path("bench.dsn");
    write_private(
        &dsn_file,
        &format!("# the benchmark's database\n{}\n", db.dsn),
        0o600,
    );
    let doc = temp_path("dsnfile.json");
    let home = fresh_home();
    let mut cmd = bare(&home);
    cmd.arg("--dsn-file").arg(&dsn_file).args(tiny_args(&doc));
    let (out, argvs) = run_watched(cmd);
    assert_connected_without_leaks("--dsn-file", &parts, &out, &argvs, &doc);
    assert!(argvs.iter().any(|a| a.contains("--dsn-file")), "{argvs:?}");
}

#[test]
fn a_dsn_file_others_may_read_is_refused() {
    let parts = dsn_parts(&common::test_dsn());
    for mode in [0o644, 0o640, 0o604] {
        let dsn_file = temp_path("open.dsn");
        write_private(&dsn_file, &format!("{}\n", common::test_dsn()), mode);
        let doc = temp_path("refused.json");
        let out = bare(&fresh_home())
            .arg("--dsn-file")
            .arg(&dsn_file)
            .args(tiny_args(&doc))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "mode {mode:o}: {stderr}");
        assert!(stderr.contains("chmod 0600"), "{stderr}");
        assert!(!stderr.contains(&parts.password), "password on stderr");
        assert!(!doc.exists());
    }
    // Two databases named at once: refused rather than one picked.
    let dsn_file = temp_path("private.dsn");
    write_private(&dsn_file, &common::test_dsn(), 0o600);
    let out = bare(&fresh_home())
        .env("PGMQ_BENCH_DSN", &parts.without_password)
        .arg("--dsn-file")
        .arg(&dsn_file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("give one"));
}

/// The scripts that run the bench give it the DSN in PGMQ_BENCH_DSN (or
/// `--local`), never as `--dsn` on its command line.
#[test]
fn bench_scripts_keep_the_dsn_off_the_command_line() {
    let scripts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts");
    let mut seen = 0;
    for entry in std::fs::read_dir(&scripts).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("bench") && name.ends_with(".sh")) {
            continue;
        }
        seen += 1;
        let text = std::fs::read_to_string(entry.path()).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split(" #").next().unwrap_or("");
            if code.trim_start().starts_with('#') {
                continue;
            }
            assert!(
                !code.contains("--dsn ") && !code.contains("--dsn=") && !code.contains("--dsn\""),
                "{name}:{}: the DSN on a command line: {line}",
                i + 1
            );
            assert!(
                !code.contains("://") || !code.contains('@'),
                "{name}:{}: a DSN with credentials written out: {line}",
                i + 1
            );
        }
    }
    assert!(
        seen >= 3,
        "bench scripts not found in {}",
        scripts.display()
    );
}
