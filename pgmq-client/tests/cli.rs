//! The `pgmq` command-line tool, run as a process against the test database.
#![cfg(feature = "cli")]

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use pgmq_client::{Message, RawJson, SendOptions};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use common::Queues;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// stdout as JSON values, one per line.
    fn lines(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect()
    }

    fn ok(self) -> Self {
        assert_eq!(self.code, 0, "stderr: {}", self.stderr);
        self
    }

    /// Exit status 1 ("anything else") with `needle` in the message.
    fn failed(self, needle: &str) -> Self {
        self.failed_with(1, needle)
    }

    /// Exit status `code` with `needle` in the message.
    fn failed_with(self, code: i32, needle: &str) -> Self {
        assert_eq!(
            self.code, code,
            "stdout: {} stderr: {}",
            self.stdout, self.stderr
        );
        assert!(
            self.stderr.starts_with("pgmq: error: ") && self.stderr.contains(needle),
            "{:?} not in {:?}",
            needle,
            self.stderr
        );
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
        self
    }
}

/// Runs `pgmq args` with DATABASE_URL (unless `env` overrides) and `stdin`.
async fn pgmq_with(args: &[&str], stdin: &str, env: &[(&str, Option<&str>)]) -> Run {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgmq"));
    cmd.args(args)
        .env("DATABASE_URL", common::dsn())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let out = child.wait_with_output().await.unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

async fn pgmq(args: &[&str], stdin: &str) -> Run {
    pgmq_with(args, stdin, &[]).await
}

#[tokio::test]
async fn create_list_purge_drop() {
    let client = common::client().await;
    let qs = Queues::new();
    let (plain, unlogged) = (qs.name("cli_plain"), qs.name("cli_unl"));
    pgmq(&["create", plain.as_str()], "").await.ok();
    pgmq(&["create", unlogged.as_str(), "--unlogged"], "")
        .await
        .ok();
    client
        .send_batch(&plain, &[json!(1), json!(2), json!(3)])
        .await
        .unwrap();

    let listed = pgmq(&["list"], "").await.ok().lines();
    let row = listed
        .iter()
        .find(|r| r["queue_name"] == plain.as_str())
        .expect("listed");
    assert_eq!(row["queue_length"], 3);
    assert_eq!(row["queue_visible_length"], 3);
    assert_eq!(row["total_messages"], 3);
    assert_eq!(row["is_unlogged"], false);
    let row = listed
        .iter()
        .find(|r| r["queue_name"] == unlogged.as_str())
        .expect("listed");
    assert_eq!(row["is_unlogged"], true);
    let table = pgmq(&["list", "--table"], "").await.ok().stdout;
    assert!(table.starts_with("QUEUE"), "{table}");
    let line = table
        .lines()
        .find(|l| l.starts_with(&format!("{} ", plain.as_str())))
        .expect("a row for the queue");
    assert!(line.ends_with("logged"), "{line}");

    let purged = pgmq(&["purge", plain.as_str(), "--yes"], "")
        .await
        .ok()
        .lines();
    assert_eq!(purged, [json!({"purged": 3})]);
    pgmq(&["drop", plain.as_str(), "--yes"], "").await.ok();
    pgmq(&["drop", plain.as_str(), "--yes"], "")
        .await
        .failed_with(3, "does not exist");
    pgmq(&["drop", plain.as_str(), "--if-exists", "--yes"], "")
        .await
        .ok();
    assert!(!client.queue_exists(&plain).await.unwrap());
}

/// `pgmq autovacuum --show` looks; without it the SDK's settings are set
/// again on a table whose settings were reset.
#[tokio::test]
async fn autovacuum_shows_and_sets_the_queue_tables_settings() {
    let qs = Queues::new();
    let q = qs.name("cli_autovac");
    pgmq(&["create", q.as_str()], "").await.ok();
    let pg = common::raw().await;
    pg.batch_execute(&format!(
        "ALTER TABLE {} RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, \
         autovacuum_vacuum_cost_delay)",
        q.quoted_table()
    ))
    .await
    .unwrap();
    let shown = pgmq(&["autovacuum", q.as_str(), "--show"], "")
        .await
        .ok()
        .lines();
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0]["table"], q.table());
    assert_eq!(shown[0]["caller_owns"], true);
    assert_eq!(shown[0]["settings"], json!([]));
    let set = pgmq(&["autovacuum", q.as_str()], "").await.ok().lines();
    let settings = set[0]["settings"].as_array().expect("settings").len();
    assert_eq!(settings, pgmq_client::QUEUE_TABLE_AUTOVACUUM.len());
}

#[tokio::test]
async fn create_partitioned_when_pg_partman_is_installed() {
    let pg = common::raw().await;
    let has: i64 = common::scalar(
        &pg,
        "SELECT count(*) FROM pg_extension WHERE extname = 'pg_partman'",
        &[],
    )
    .await;
    let qs = Queues::new();
    let q = qs.name("cli_part");
    let run = pgmq(&["create", q.as_str(), "--partitioned"], "").await;
    if has == 0 {
        eprintln!("SKIPPED the partitioned case: pg_partman is not installed");
        run.failed("pg_partman");
        return;
    }
    run.ok();
    let listed = pgmq(&["list"], "").await.ok().lines();
    let row = listed
        .iter()
        .find(|r| r["queue_name"] == q.as_str())
        .unwrap();
    assert_eq!(row["is_partitioned"], true);
    pgmq(&["drop", q.as_str(), "--yes"], "").await.ok();
}

#[tokio::test]
async fn send_lines_and_envelopes_then_read_and_pop() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "cli_send").await;
    let big = "12345678901234567890.123456789";
    let input = format!("{{\"n\": 1}}\n\n  \"two\"  \n{{\"amount\": {big}}}\n[4]\n");
    let ids: Vec<i64> = pgmq(&["send", q.as_str(), "--batch", "2"], &input)
        .await
        .ok()
        .lines()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(ids.len(), 4);
    assert!(ids.windows(2).all(|w| w[0] < w[1]));

    // read prints JSON lines with the body exactly as stored.
    let read = pgmq(&["read", q.as_str(), "-n", "10", "--vt", "0"], "")
        .await
        .ok();
    assert!(read.stdout.contains(big), "{}", read.stdout);
    let msgs = read.lines();
    let got: Vec<i64> = msgs.iter().map(|m| m["msg_id"].as_i64().unwrap()).collect();
    let mut sorted = got.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ids);
    let first = msgs.iter().find(|m| m["msg_id"] == ids[0]).unwrap();
    assert_eq!(first["body"], json!({"n": 1}));
    assert_eq!(first["read_ct"], 1);
    assert!(first["enqueued_at"].is_string() && first["vt"].is_string());
    assert_eq!(first["headers"], Value::Null);

    // --filter.
    let filtered = pgmq(
        &["read", q.as_str(), "-n", "10", "--filter", r#"{"n": 1}"#],
        "",
    )
    .await
    .ok()
    .lines();
    assert_eq!(filtered.len(), 1);
    assert_eq!(filtered[0]["msg_id"], ids[0]);

    // pop removes.
    let popped = pgmq(&["pop", q.as_str(), "-n", "2"], "").await.ok().lines();
    assert_eq!(popped.len(), 2);
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 2);

    // Envelopes from a file: headers and delays (seconds or a time).
    let dir = std::env::temp_dir().join(format!("pgmq-cli-{}", q.as_str()));
    tokio::fs::create_dir_all(&dir).await.unwrap();
    let file = dir.join("in.jsonl");
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    tokio::fs::write(
        &file,
        format!(
            "{{\"body\": {{\"e\": 1}}, \"headers\": {{\"trace\": \"t1\"}}}}\n\
             {{\"body\": {{\"e\": 2}}, \"delay\": 3600}}\n\
             {{\"body\": {{\"e\": 3}}, \"delay\": \"{later}\"}}\n\
             {{\"body\": {{\"e\": 4}}}}\n"
        ),
    )
    .await
    .unwrap();
    let q2 = qs.fresh(&client, "cli_env").await;
    let ids = pgmq(
        &[
            "send",
            q2.as_str(),
            "--envelope",
            "--file",
            file.to_str().unwrap(),
        ],
        "",
    )
    .await
    .ok()
    .lines();
    assert_eq!(ids.len(), 4);
    tokio::fs::remove_dir_all(&dir).await.unwrap();
    let visible: Vec<Message> =
        common::ok(client.read(&q2, Duration::from_secs(30), 10).await.unwrap());
    let mut bodies: Vec<i64> = visible
        .iter()
        .map(|m| m.body["e"].as_i64().unwrap())
        .collect();
    bodies.sort_unstable();
    assert_eq!(bodies, [1, 4], "2 and 3 are delayed");
    let with_headers = visible.iter().find(|m| m.body["e"] == 1).unwrap();
    assert_eq!(with_headers.header("trace"), Some(&json!("t1")));
    assert_eq!(client.metrics(&q2).await.unwrap().queue_length, 4);

    // A global --delay.
    let q3 = qs.fresh(&client, "cli_delay").await;
    pgmq(&["send", q3.as_str(), "--delay", "3600"], "1\n2\n")
        .await
        .ok();
    let m = client.metrics(&q3).await.unwrap();
    assert_eq!((m.queue_length, m.queue_visible_length), (2, 0));
}

#[tokio::test]
async fn read_poll_returns_when_a_message_arrives() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "cli_poll").await;
    let sender = client.clone();
    let q2 = q.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        sender.send(&q2, &json!({"late": 1})).await.unwrap();
    });
    let start = Instant::now();
    let got = pgmq(&["read", q.as_str(), "--poll", "10"], "")
        .await
        .ok()
        .lines();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["body"], json!({"late": 1}));
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn delete_and_archive_by_id() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "cli_ack").await;
    let ids = client
        .send_batch(&q, &[json!(1), json!(2), json!(3)])
        .await
        .unwrap();
    let (a, b, c) = (ids[0].to_string(), ids[1].to_string(), ids[2].to_string());
    let deleted = pgmq(&["delete", q.as_str(), &a, "999999"], "")
        .await
        .ok()
        .lines();
    assert_eq!(deleted, [json!(ids[0])]);
    let archived = pgmq(&["archive", q.as_str(), &b, &c], "")
        .await
        .ok()
        .lines();
    assert_eq!(archived.len(), 2);
    let pg = common::raw().await;
    assert_eq!(common::archive_rows(&pg, &q).await.len(), 2);
    assert!(common::queue_rows(&pg, &q).await.is_empty());
}

#[tokio::test]
async fn bad_lines_are_reported_without_their_content() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "cli_bad").await;
    let secret = "CARD-4111-SECRET";
    let run = pgmq(
        &["send", q.as_str()],
        &format!("1\n2\n{{\"card\": \"{secret}\"\n4\n"),
    )
    .await
    .failed("line 3");
    assert!(!run.stderr.contains(secret), "{}", run.stderr);
    assert!(run.stderr.contains("2 message(s)"), "{}", run.stderr);
    assert_eq!(run.lines().len(), 2, "the ids of the two sent");
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 2);

    // Envelope mistakes: unknown keys, headers that are not an object.
    pgmq(
        &["send", q.as_str(), "--envelope"],
        &format!("{{\"body\": 1, \"header\": {{\"x\": \"{secret}\"}}}}\n"),
    )
    .await
    .failed("line 1");
    pgmq(
        &["send", q.as_str(), "--envelope"],
        "{\"body\": 1, \"headers\": [1]}\n",
    )
    .await
    .failed("must be a JSON object");
    pgmq(&["read", q.as_str(), "--filter", "{nope"], "")
        .await
        .failed_with(2, "--filter is not JSON");
    pgmq(&["send", q.as_str(), "--file", "/nonexistent/x.jsonl"], "")
        .await
        .failed("opening /nonexistent/x.jsonl");
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 2);
}

#[tokio::test]
async fn a_nul_line_is_named_and_its_batch_is_not_sent() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "cli_nul").await;
    // Batches of 2: lines 1-2 go, lines 3-4 hold the NUL (line 4), line 5
    // is never reached.
    let run = pgmq(
        &["send", q.as_str(), "--batch", "2"],
        "1\n2\n3\n{\"k\": \"a\\u0000b\"}\n5\n",
    )
    .await
    .failed("line 4: a NUL character (\\u0000) in its body");
    assert!(run.stderr.contains("none of lines 3-4"), "{}", run.stderr);
    assert!(
        run.stderr.contains("2 message(s) before line 3 were sent"),
        "{}",
        run.stderr
    );
    assert_eq!(run.lines().len(), 2, "the ids of the two sent");
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 2);
    // In headers, with --envelope.
    pgmq(
        &["send", q.as_str(), "--envelope"],
        "{\"body\": 1}\n{\"body\": 2, \"headers\": {\"h\": \"\\u0000\"}}\n",
    )
    .await
    .failed("line 2: a NUL character (\\u0000) in its headers");
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 3);
}

#[tokio::test]
async fn every_error_is_a_message_and_a_non_zero_exit() {
    let qs = Queues::new();
    let missing = qs.name("cli_missing");
    let secret = "Sup3rS3cret-pw";
    let wrong = format!("postgres://pgmq:{secret}@127.0.0.1:55432/pgmq");
    // The test DSN with its password (generated by db-start.sh, or the
    // development default pgmq) replaced.
    let wrong = match std::env::var("PGMQ_TEST_DSN") {
        Ok(d) => {
            let cfg: tokio_postgres::Config = d.parse().unwrap();
            let pw = String::from_utf8(cfg.get_password().unwrap().to_vec()).unwrap();
            let replaced = d.replacen(&format!(":{pw}@"), &format!(":{secret}@"), 1);
            assert_ne!(replaced, d, "PGMQ_TEST_DSN: a URL with user:password@");
            replaced
        }
        Err(_) => wrong,
    };

    pgmq_with(&["list"], "", &[("DATABASE_URL", None)])
        .await
        .failed_with(2, "set DATABASE_URL, or pass --dsn-file or --dsn");
    // A login the server turns down is refused (4), not unreachable.
    for run in [
        pgmq_with(&["list"], "", &[("DATABASE_URL", Some(&wrong))]).await,
        pgmq(&["--dsn", &wrong, "list"], "").await,
    ] {
        let run = run.failed_with(4, "password authentication failed");
        assert!(!run.stderr.contains(secret) && !run.stdout.contains(secret));
    }
    // --help shows where the DSN comes from, never its value.
    let help = pgmq_with(&["--help"], "", &[("DATABASE_URL", Some(&wrong))]).await;
    assert_eq!(help.code, 0);
    assert!(help.stdout.contains("DATABASE_URL") && !help.stdout.contains(secret));

    // A missing queue: 3.
    for args in [
        &["read", missing.as_str()][..],
        &["purge", missing.as_str()],
        &["purge", missing.as_str(), "--yes"],
        &["peek", missing.as_str()],
        &["peek", missing.as_str(), "--archive"],
        &["metrics", missing.as_str()],
        &["archive", "list", missing.as_str()],
        &["archive", "prune", missing.as_str(), "--older-than", "1d"],
        &["set-vt", missing.as_str(), "1", "0"],
        &["redrive", missing.as_str()],
    ] {
        pgmq(args, "").await.failed_with(3, "does not exist");
    }
    pgmq(&["send", missing.as_str()], "1\n")
        .await
        .failed_with(3, "does not exist");
    // A bad queue name is a bad command line: 2.
    pgmq(&["create", "Bad$Name"], "")
        .await
        .failed_with(2, "invalid queue name");
    pgmq(&["create", "x'; drop table pgmq.meta; --"], "")
        .await
        .failed_with(2, "invalid queue name");
    pgmq(&["peek", "x'; drop table pgmq.meta; --"], "")
        .await
        .failed_with(2, "invalid queue name");
    pgmq(&["--dsn", &common::dsn_for("pgmq_none"), "list"], "")
        .await
        .failed("CREATE EXTENSION pgmq");
    let dead = format!(
        "postgres://pgmq:pgmq@127.0.0.1:{}/pgmq",
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    );
    // Nothing listening: unreachable, 5.
    pgmq(&["--dsn", &dead, "list"], "")
        .await
        .failed_with(5, "could not connect");
    pgmq(&["--ca-file", "/nonexistent.pem", "list"], "")
        .await
        .failed("reading /nonexistent.pem");
    // Usage errors are clap's: exit status 2.
    let usage = pgmq(&["frobnicate"], "").await;
    assert_eq!(usage.code, 2, "{}", usage.stderr);
    let usage = pgmq(&["create", "q", "--unlogged", "--partitioned"], "").await;
    assert_eq!(usage.code, 2, "{}", usage.stderr);
}

/// What pgmq-worker puts in a dead-letter queue: the original body, and
/// headers naming the source queue and keeping the original headers.
fn dead_letter_headers(source: &str, original_id: i64, original: Value) -> Value {
    json!({
        "reason": "failed 5 times",
        "attempts": 5,
        "source_queue": source,
        "original_msg_id": original_id,
        "original_headers": original,
    })
}

#[tokio::test]
async fn redrive_moves_dead_letters_back_in_transactions() {
    let client = common::client().await;
    let qs = Queues::new();
    let src = qs.fresh(&client, "cli_src").await;
    let other = qs.fresh(&client, "cli_other").await;
    let dlq = qs.fresh(&client, "cli_dlq").await;
    let bodies = [
        json!({"order": 1}),
        json!({"order": 2, "amount": 1}),
        json!({"order": 3}),
        json!({"orphan": true}),
    ];
    let headers = [
        dead_letter_headers(src.as_str(), 11, json!({"x-pgmq-group": "g1"})),
        dead_letter_headers(src.as_str(), 12, Value::Null),
        dead_letter_headers(src.as_str(), 13, json!({"trace": "t3"})),
        json!({"note": "no source queue"}),
    ];
    let dead_ids = client
        .send_batch_with(
            &dlq,
            &bodies,
            &pgmq_client::SendOptions::new().headers_each(headers.to_vec()),
        )
        .await
        .unwrap();

    // Dry run: prints the plan, moves nothing, hides nothing.
    let plan = pgmq(&["redrive", dlq.as_str(), "--dry-run"], "").await.ok();
    let lines = plan.lines();
    assert_eq!(lines.len(), 3, "{}", plan.stdout);
    assert!(lines
        .iter()
        .all(|l| l["queue"] == src.as_str() && l.get("new_msg_id").is_none()));
    assert!(plan.stderr.contains("would move 3"), "{}", plan.stderr);
    assert!(plan
        .stderr
        .contains(&format!("message {} stays", dead_ids[3])));
    let m = client.metrics(&dlq).await.unwrap();
    assert_eq!((m.queue_length, m.queue_visible_length), (4, 4));
    assert_eq!(client.metrics(&src).await.unwrap().queue_length, 0);

    // For real, two per transaction.
    let run = pgmq(&["redrive", dlq.as_str(), "--batch", "2"], "")
        .await
        .ok();
    let moved = run.lines();
    assert_eq!(moved.len(), 3, "{}", run.stdout);
    assert!(run.stderr.contains("moved 3") && run.stderr.contains("1 left in place"));
    let back: Vec<Message<RawJson>> = client
        .read_raw(&src, Duration::from_secs(30), 10)
        .await
        .unwrap();
    let mut back: Vec<(i64, Value, Option<Value>)> = back
        .into_iter()
        .map(|m| (m.msg_id, m.body.decode().unwrap(), m.headers))
        .collect();
    back.sort_by_key(|b| b.0);
    assert_eq!(
        back.iter().map(|b| b.1.clone()).collect::<Vec<_>>(),
        bodies[..3],
        "same bodies, same order"
    );
    assert_eq!(
        back[0].2,
        Some(json!({"x-pgmq-group": "g1"})),
        "original headers restored"
    );
    assert_eq!(back[1].2, None);
    assert_eq!(back[2].2, Some(json!({"trace": "t3"})));
    for (line, (new_id, ..)) in moved.iter().zip(&back) {
        assert_eq!(line["new_msg_id"], *new_id);
    }
    // The orphan stays, visible again.
    let m = client.metrics(&dlq).await.unwrap();
    assert_eq!((m.queue_length, m.queue_visible_length), (1, 1));

    // --to sends anything, orphans included; its own headers are kept.
    let run = pgmq(&["redrive", dlq.as_str(), "--to", other.as_str()], "")
        .await
        .ok();
    assert_eq!(run.lines().len(), 1);
    let got: Vec<Message> = common::ok(
        client
            .read(&other, Duration::from_secs(30), 10)
            .await
            .unwrap(),
    );
    assert_eq!(got[0].body, json!({"orphan": true}));
    assert_eq!(got[0].headers, Some(json!({"note": "no source queue"})));
    assert_eq!(client.metrics(&dlq).await.unwrap().queue_length, 0);

    // --limit.
    let ids = client
        .send_batch_with(
            &dlq,
            &[json!(1), json!(2), json!(3)],
            &pgmq_client::SendOptions::new().headers_each(
                [
                    dead_letter_headers(src.as_str(), 1, Value::Null),
                    dead_letter_headers(src.as_str(), 2, Value::Null),
                    dead_letter_headers(src.as_str(), 3, Value::Null),
                ]
                .to_vec(),
            ),
        )
        .await
        .unwrap();
    let run = pgmq(&["redrive", dlq.as_str(), "--limit", "2"], "")
        .await
        .ok();
    let moved: Vec<Value> = run.lines().iter().map(|l| l["msg_id"].clone()).collect();
    assert_eq!(moved, [json!(ids[0]), json!(ids[1])]);
    assert_eq!(client.metrics(&dlq).await.unwrap().queue_length, 1);
}

#[tokio::test]
async fn redrive_leaves_messages_naming_a_missing_queue() {
    let client = common::client().await;
    let qs = Queues::new();
    let src = qs.fresh(&client, "cli_src2").await;
    let dlq = qs.fresh(&client, "cli_dlq2").await;
    let gone = qs.name("cli_gone");
    client
        .send_with(
            &dlq,
            &json!({"a": 1}),
            &SendOptions::new().headers(dead_letter_headers(src.as_str(), 1, Value::Null)),
        )
        .await
        .unwrap();
    let stays = client
        .send_with(
            &dlq,
            &json!({"a": 2}),
            &SendOptions::new().headers(dead_letter_headers(gone.as_str(), 2, Value::Null)),
        )
        .await
        .unwrap();
    // The message naming a queue that does not exist stays, with the reason.
    let run = pgmq(&["redrive", dlq.as_str()], "").await.ok();
    assert_eq!(run.lines().len(), 1, "{}", run.stdout);
    assert!(
        run.stderr.contains(&format!(
            "message {stays} stays: source_queue {gone} does not exist"
        )),
        "{}",
        run.stderr
    );
    assert_eq!(client.metrics(&src).await.unwrap().queue_length, 1);
    let m = client.metrics(&dlq).await.unwrap();
    assert_eq!((m.queue_length, m.queue_visible_length), (1, 1));
}

#[tokio::test]
async fn redrive_to_several_queues_needs_yes() {
    let client = common::client().await;
    let qs = Queues::new();
    let a = qs.fresh(&client, "cli_a").await;
    let b = qs.fresh(&client, "cli_b").await;
    let dlq = qs.fresh(&client, "cli_dlq3").await;
    for (q, n) in [(&a, 1), (&b, 2)] {
        client
            .send_with(
                &dlq,
                &json!({"n": n}),
                &SendOptions::new().headers(dead_letter_headers(q.as_str(), n, Value::Null)),
            )
            .await
            .unwrap();
    }
    let run = pgmq(&["redrive", dlq.as_str()], "")
        .await
        .failed_with(4, "--yes");
    assert!(run.stderr.contains(a.as_str()) && run.stderr.contains(b.as_str()));
    assert_eq!(client.metrics(&dlq).await.unwrap().queue_visible_length, 2);
    // --limit 1 names one queue only.
    let run = pgmq(&["redrive", dlq.as_str(), "--limit", "1"], "")
        .await
        .ok();
    assert_eq!(run.lines().len(), 1);
    let run = pgmq(&["redrive", dlq.as_str(), "--yes"], "").await.ok();
    assert_eq!(run.lines().len(), 1);
    assert_eq!(client.metrics(&a).await.unwrap().queue_length, 1);
    assert_eq!(client.metrics(&b).await.unwrap().queue_length, 1);
}

#[tokio::test]
async fn notify_enable_list_disable() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "cli_notify").await;
    pgmq(&["notify", "enable", q.as_str(), "--throttle-ms", "40"], "")
        .await
        .ok();
    let listed = pgmq(&["notify", "list"], "").await.ok().lines();
    let row = listed
        .iter()
        .find(|r| r["queue_name"] == q.as_str())
        .expect("listed");
    assert_eq!(row["throttle_interval_ms"], 40);
    let table = pgmq(&["notify", "list", "--table"], "").await.ok().stdout;
    let rows = table_rows(&table, "QUEUE THROTTLE_MS LAST_NOTIFIED_AT");
    let row = rows.iter().find(|r| r[0] == q.as_str()).expect("listed");
    assert_eq!(row[1], "40");
    pgmq(&["notify", "disable", q.as_str()], "").await.ok();
    let listed = pgmq(&["notify", "list"], "").await.ok().lines();
    assert!(!listed.iter().any(|r| r["queue_name"] == q.as_str()));
    pgmq(&["notify", "enable", qs.name("cli_nq").as_str()], "")
        .await
        .failed_with(3, "does not exist");
}

#[tokio::test]
async fn the_password_stays_off_the_command_line() {
    let cfg: tokio_postgres::Config = common::dsn().parse().unwrap();
    let user = cfg.get_user().unwrap().to_owned();
    let password = String::from_utf8(cfg.get_password().unwrap().to_vec()).unwrap();
    let host = match &cfg.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        other => panic!("a TCP test DSN, not {other:?}"),
    };
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let db = cfg.get_dbname().unwrap().to_owned();
    let bare = format!("postgres://{user}@{host}:{port}/{db}");
    let dir = std::env::temp_dir().join(format!("pgmq-cli-pw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let nowhere = dir.join("missing");
    let nowhere = nowhere.to_str().unwrap();

    // No password anywhere: the server refuses, so the cases below prove something.
    pgmq_with(
        &["list"],
        "",
        &[
            ("DATABASE_URL", Some(&bare)),
            ("PGPASSWORD", None),
            ("PGPASSFILE", Some(nowhere)),
        ],
    )
    .await
    .failed_with(4, "");
    // PGPASSWORD.
    pgmq_with(
        &["list"],
        "",
        &[
            ("DATABASE_URL", Some(&bare)),
            ("PGPASSWORD", Some(&password)),
        ],
    )
    .await
    .ok();
    // A password file, wildcards and all; ignored while others may read it.
    let passfile = dir.join("pgpass");
    std::fs::write(
        &passfile,
        format!("# test\nother:*:*:*:wrong\n{host}:{port}:*:{user}:{password}\n"),
    )
    .unwrap();
    let env = [
        ("DATABASE_URL", Some(bare.as_str())),
        ("PGPASSWORD", None),
        ("PGPASSFILE", passfile.to_str()),
    ];
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o644)).unwrap();
        pgmq_with(&["list"], "", &env).await.failed_with(4, "");
        std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    pgmq_with(&["list"], "", &env).await.ok();
    // The whole DSN in a file.
    let dsn_file = dir.join("dsn");
    std::fs::write(&dsn_file, format!("{}\n", common::dsn())).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dsn_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    pgmq_with(
        &["list", "--dsn-file", dsn_file.to_str().unwrap()],
        "",
        &[("DATABASE_URL", None), ("PGPASSFILE", Some(nowhere))],
    )
    .await
    .ok();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--dsn-file` takes only a private regular file (as libpq takes only a
/// private ~/.pgpass): any group or other permission bit, or a folder, is
/// refused, without the file's content in the message. `DATABASE_URL` merely
/// set in the environment does not conflict with it (the file wins); an
/// explicit `--dsn` does.
#[cfg(unix)]
#[tokio::test]
async fn dsn_file_must_be_private_and_wins_over_database_url() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("pgmq-cli-dsnfile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let dsn_file = dir.join("dsn");
    let path = dsn_file.to_str().unwrap();
    let password = {
        let cfg: tokio_postgres::Config = common::dsn().parse().unwrap();
        String::from_utf8(cfg.get_password().unwrap().to_vec()).unwrap()
    };
    std::fs::write(
        &dsn_file,
        format!("# the test database\n\n{}\n", common::dsn()),
    )
    .unwrap();
    let no_env = [("DATABASE_URL", None)];

    for mode in [
        0o644, 0o640, 0o604, 0o620, 0o602, 0o610, 0o601, 0o660, 0o606,
    ] {
        std::fs::set_permissions(&dsn_file, std::fs::Permissions::from_mode(mode)).unwrap();
        let run = pgmq_with(&["list", "--dsn-file", path], "", &no_env)
            .await
            .failed("chmod 0600");
        assert!(
            run.stderr.contains(&format!("{mode:04o}")),
            "{}",
            run.stderr
        );
        assert!(!run.stderr.contains(&password), "{}", run.stderr);
    }
    // Not a regular file.
    pgmq_with(&["list", "--dsn-file", dir.to_str().unwrap()], "", &no_env)
        .await
        .failed("not a regular file");

    std::fs::set_permissions(&dsn_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    pgmq_with(&["list", "--dsn-file", path], "", &no_env)
        .await
        .ok();
    std::fs::set_permissions(&dsn_file, std::fs::Permissions::from_mode(0o400)).unwrap();
    pgmq_with(&["list", "--dsn-file", path], "", &no_env)
        .await
        .ok();
    // DATABASE_URL in the environment (here one that cannot work) is no
    // conflict: the file is used.
    pgmq_with(
        &["list", "--dsn-file", path],
        "",
        &[("DATABASE_URL", Some("postgres://nobody@127.0.0.1:1/none"))],
    )
    .await
    .ok();
    // An explicit --dsn with --dsn-file is a bad command line.
    let run = pgmq_with(
        &[
            "list",
            "--dsn-file",
            path,
            "--dsn",
            "postgres://nobody@127.0.0.1:1/none",
        ],
        "",
        &no_env,
    )
    .await;
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("cannot be used with"), "{}", run.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `(msg_id, read_ct, vt, last_read_at)` of every message of `q`, exactly,
/// straight from its table.
async fn exact_states(
    pg: &tokio_postgres::Client,
    q: &pgmq_client::QueueName,
) -> Vec<(
    i64,
    i32,
    chrono::DateTime<chrono::Utc>,
    Option<chrono::DateTime<chrono::Utc>>,
)> {
    let sql = format!(
        "SELECT msg_id, read_ct, vt, last_read_at FROM {} ORDER BY msg_id",
        q.quoted_table()
    );
    common::fetch(pg, &sql, &[], |r| (r.get(0), r.get(1), r.get(2), r.get(3))).await
}

/// The rows of a `--table` output after its heading (whose first columns
/// are those of `heading`), split on blanks.
fn table_rows(stdout: &str, heading: &str) -> Vec<Vec<String>> {
    let mut lines = stdout.lines();
    let head: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let want: Vec<&str> = heading.split_whitespace().collect();
    assert!(head.starts_with(&want), "{stdout}");
    lines
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

#[tokio::test]
async fn peek_changes_neither_vt_nor_read_ct() {
    let client = common::client().await;
    let pg = common::raw().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "cli_peek").await;
    let ids = client
        .send_batch(&q, &[json!({"n": 1}), json!({"n": 2}), json!({"n": 3})])
        .await
        .unwrap();
    // One claimed (hidden, read once), two visible and never read.
    let claimed: Vec<Message> =
        common::ok(client.read(&q, Duration::from_secs(600), 1).await.unwrap());
    assert_eq!(claimed[0].msg_id, ids[0]);
    let before = exact_states(&pg, &q).await;

    let run = pgmq(&["peek", q.as_str()], "").await.ok();
    let lines = run.lines();
    let got: Vec<i64> = lines
        .iter()
        .map(|l| l["msg_id"].as_i64().unwrap())
        .collect();
    assert_eq!(got, ids, "every message, hidden or not, by msg_id");
    assert_eq!(lines[0]["read_ct"], 1);
    assert_eq!(lines[1]["read_ct"], 0);
    assert_eq!(lines[1]["body"], json!({"n": 2}));
    assert!(lines[0]["vt"].is_string() && lines[0]["headers"].is_null());
    let two = pgmq(&["peek", q.as_str(), "-n", "2"], "")
        .await
        .ok()
        .lines();
    assert_eq!(two.len(), 2);
    let table = pgmq(&["peek", q.as_str(), "--table"], "").await.ok().stdout;
    let rows = table_rows(&table, "MSG_ID  READ_CT  ENQUEUED_AT");
    assert_eq!(rows.len(), 3, "{table}");
    assert_eq!(rows[0][0], ids[0].to_string());
    assert_eq!(rows[0][1], "1");

    assert_eq!(
        exact_states(&pg, &q).await,
        before,
        "peek changed the queue"
    );
    let m = client.metrics(&q).await.unwrap();
    assert_eq!((m.queue_length, m.queue_visible_length), (3, 2));
    // read --table, for comparison, claims.
    let read = pgmq(&["read", q.as_str(), "--table", "--vt", "0"], "")
        .await
        .ok()
        .stdout;
    let rows = table_rows(&read, "MSG_ID  READ_CT");
    assert_eq!(
        (rows[0][0].clone(), rows[0][1].as_str()),
        (ids[1].to_string(), "1")
    );
}

#[tokio::test]
async fn archive_by_id_list_and_prune_in_batches() {
    let client = common::client().await;
    let pg = common::raw().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "cli_arch").await;
    let ids = client
        .send_batch(&q, &[json!(1), json!(2), json!(3), json!(4), json!(5)])
        .await
        .unwrap();
    let id_args: Vec<String> = ids[..4].iter().map(i64::to_string).collect();
    // The archive-by-id form still works next to the subcommands.
    let mut args = vec!["archive", q.as_str()];
    args.extend(id_args.iter().map(String::as_str));
    assert_eq!(pgmq(&args, "").await.ok().lines().len(), 4);
    // Three of them archived ten days ago.
    pg.execute(
        &format!(
            "UPDATE {} SET archived_at = archived_at - interval '10 days' WHERE msg_id = ANY($1)",
            q.quoted_archive_table()
        ),
        &[&ids[..3].to_vec()],
    )
    .await
    .unwrap();

    let listed = pgmq(&["archive", "list", q.as_str()], "")
        .await
        .ok()
        .lines();
    let got: Vec<i64> = listed
        .iter()
        .map(|l| l["msg_id"].as_i64().unwrap())
        .collect();
    assert_eq!(got, ids[..4]);
    assert!(listed.iter().all(|l| l["archived_at"].is_string()));
    assert_eq!(listed[0]["body"], json!(1));
    let peeked = pgmq(&["peek", q.as_str(), "--archive", "-n", "2"], "")
        .await
        .ok()
        .lines();
    assert_eq!(peeked, listed[..2]);
    let table = pgmq(&["archive", "list", q.as_str(), "--table", "-n", "1"], "")
        .await
        .ok()
        .stdout;
    assert_eq!(
        table_rows(&table, "MSG_ID  READ_CT  ENQUEUED_AT  ").len(),
        1,
        "{table}"
    );

    // Batches of one: three short transactions, and a fourth that finds none.
    let pruned = pgmq(
        &[
            "archive",
            "prune",
            q.as_str(),
            "--older-than",
            "7d",
            "--batch",
            "1",
        ],
        "",
    )
    .await
    .ok()
    .lines();
    assert_eq!(
        pruned,
        [json!({"queue": q.as_str(), "pruned": 3, "busy": false})]
    );
    let left: Vec<i64> = common::archive_rows(&pg, &q)
        .await
        .iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(left, [ids[3]]);
    let again = pgmq(&["archive", "prune", q.as_str(), "--older-than", "7d"], "")
        .await
        .ok()
        .lines();
    assert_eq!(again[0]["pruned"], 0);
    // The queue itself is untouched.
    assert_eq!(common::queue_rows(&pg, &q).await.len(), 1);

    // Usage mistakes: exit status 2.
    for bad in [
        &["archive", "prune", q.as_str()][..],
        &["archive", "prune", q.as_str(), "--older-than", "7 days"],
        &[
            "archive",
            "prune",
            q.as_str(),
            "--older-than",
            "1d",
            "--batch",
            "0",
        ],
        &["archive", q.as_str()],
    ] {
        let run = pgmq(bad, "").await;
        assert_eq!(run.code, 2, "{bad:?}: {}", run.stderr);
    }
    // `--` makes `list` a queue name (here one that does not exist).
    pgmq(&["archive", "--", "list", "1"], "")
        .await
        .failed_with(3, "\"list\" does not exist");
}

#[tokio::test]
async fn metrics_of_one_queue_and_of_all() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "cli_metrics").await;
    client.send_batch(&q, &[json!(1), json!(2)]).await.unwrap();
    let one = pgmq(&["metrics", q.as_str()], "").await.ok().lines();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0]["queue_name"], q.as_str());
    assert_eq!(one[0]["queue_length"], 2);
    assert_eq!(one[0]["total_messages"], 2);
    let all = pgmq(&["metrics"], "").await.ok().lines();
    assert!(all.iter().any(|m| m["queue_name"] == q.as_str()));
    let table = pgmq(&["metrics", q.as_str(), "--table"], "")
        .await
        .ok()
        .stdout;
    let rows = table_rows(&table, "QUEUE  ");
    assert_eq!(rows[0][..3], [q.as_str(), "2", "2"]);
}

#[tokio::test]
async fn watch_refreshes_then_stops_after_count() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "cli_watch").await;
    client.send_batch(&q, &[json!(1), json!(2)]).await.unwrap();
    client
        .read_raw(&q, Duration::from_secs(600), 1)
        .await
        .unwrap();
    // Paused when the database has the pgmq_sdk schema; `-` without it.
    let paused = match client.pause(&q, Some("watch test")).await {
        Ok(_) => "yes",
        Err(pgmq_client::Error::SdkSchemaMissing { .. }) => "-",
        Err(e) => panic!("{e}"),
    };
    let start = Instant::now();
    let run = pgmq(&["watch", "--interval", "0.3", "--count", "2"], "")
        .await
        .ok();
    assert!(start.elapsed() < Duration::from_secs(60));
    let tables: Vec<&str> = run.stdout.split("\n\n").collect();
    assert_eq!(tables.len(), 2, "{}", run.stdout);
    for (i, t) in tables.iter().enumerate() {
        let mut lines = t.lines();
        assert!(lines.next().unwrap().contains("every 0.3 s"), "{t}");
        let heading = lines.next().unwrap();
        assert_eq!(
            heading.split_whitespace().collect::<Vec<_>>(),
            [
                "QUEUE",
                "DEPTH",
                "VISIBLE",
                "IN_FLIGHT",
                "OLDEST_S",
                "IN/S",
                "OUT/S",
                "PAUSED"
            ],
            "{t}"
        );
        let row: Vec<&str> = lines
            .find(|l| l.starts_with(&format!("{} ", q.as_str())))
            .expect("a row for the queue")
            .split_whitespace()
            .collect();
        // QUEUE DEPTH VISIBLE IN_FLIGHT OLDEST_S IN/S OUT/S PAUSED
        assert_eq!(row[1..4], ["2", "1", "1"], "{t}");
        // Rates from the second refresh on.
        if i == 0 {
            assert_eq!(row[5..7], ["-", "-"], "{t}");
        } else {
            assert_eq!(row[5..7], ["0.0", "0.0"], "{t}");
        }
        assert_eq!(row[7], paused, "{t}");
    }
    if paused == "yes" {
        let listed = pgmq(&["paused", "--table"], "").await.ok().stdout;
        let rows = table_rows(&listed, "QUEUE  PAUSED_AT");
        let row = rows.iter().find(|r| r[0] == q.as_str()).expect("listed");
        assert_eq!(row[3..], ["watch", "test"]);
        client.resume(&q).await.unwrap();
    }
}

#[tokio::test]
async fn set_vt_hides_and_shows_a_message() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "cli_setvt").await;
    let id = client.send(&q, &json!({"v": 1})).await.unwrap().to_string();
    let hidden = pgmq(&["set-vt", q.as_str(), &id, "3600"], "")
        .await
        .ok()
        .lines();
    assert_eq!(hidden[0]["msg_id"].to_string(), id);
    let vt: chrono::DateTime<chrono::Utc> = hidden[0]["vt"].as_str().unwrap().parse().unwrap();
    assert!(vt > chrono::Utc::now() + chrono::Duration::minutes(59));
    assert_eq!(client.metrics(&q).await.unwrap().queue_visible_length, 0);
    pgmq(&["set-vt", q.as_str(), &id, "0"], "").await.ok();
    assert_eq!(client.metrics(&q).await.unwrap().queue_visible_length, 1);
    pgmq(&["set-vt", q.as_str(), "999999999", "0"], "")
        .await
        .failed_with(3, "message 999999999 is not in queue");
    let usage = pgmq(&["set-vt", q.as_str(), &id, "-5"], "").await;
    assert_eq!(usage.code, 2, "{}", usage.stderr);
}

#[tokio::test]
async fn topic_bind_list_test_unbind() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "cli_topic").await;
    let pattern = format!("{}.*", q.as_str());
    let bound = pgmq(&["topic", "bind", &pattern, q.as_str()], "")
        .await
        .ok()
        .lines();
    assert_eq!(bound, [json!({"pattern": pattern, "queue": q.as_str()})]);
    let listed = pgmq(&["topic", "list", "--queue", q.as_str()], "")
        .await
        .ok()
        .lines();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["pattern"], pattern.as_str());
    assert_eq!(listed[0]["queue_name"], q.as_str());
    let all = pgmq(&["topic", "list", "--table"], "").await.ok().stdout;
    let rows = table_rows(&all, "PATTERN  ");
    assert!(
        rows.iter().any(|r| r[0] == pattern && r[1] == q.as_str()),
        "{all}"
    );

    let key = format!("{}.created", q.as_str());
    let matched = pgmq(&["topic", "test", &key], "").await.ok().lines();
    assert_eq!(matched.len(), 1);
    assert_eq!(matched[0]["queue_name"], q.as_str());
    let table = pgmq(&["topic", "test", &key, "--table"], "")
        .await
        .ok()
        .stdout;
    assert_eq!(table_rows(&table, "PATTERN  QUEUE").len(), 1);
    assert_eq!(
        client.metrics(&q).await.unwrap().queue_length,
        0,
        "test sends nothing"
    );

    let removed = pgmq(&["topic", "unbind", &pattern, q.as_str()], "")
        .await
        .ok()
        .lines();
    assert_eq!(removed[0]["removed"], true);
    let again = pgmq(&["topic", "unbind", &pattern, q.as_str()], "")
        .await
        .ok()
        .lines();
    assert_eq!(again[0]["removed"], false);
    assert!(pgmq(&["topic", "list", "--queue", q.as_str()], "")
        .await
        .ok()
        .lines()
        .is_empty());
}

#[tokio::test]
async fn purge_and_drop_are_refused_without_yes() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "cli_yes").await;
    client
        .send_batch(&q, &[json!(1), json!(2), json!(3)])
        .await
        .unwrap();
    let run = pgmq(&["purge", q.as_str()], "")
        .await
        .failed_with(4, "without --yes");
    assert!(run.stderr.contains("3 message(s)"), "{}", run.stderr);
    let run = pgmq(&["drop", q.as_str()], "")
        .await
        .failed_with(4, "without --yes");
    assert!(
        run.stderr.contains("3 message(s)") && run.stderr.contains(&q.archive_table()),
        "{}",
        run.stderr
    );
    // --if-exists is no confirmation.
    pgmq(&["drop", q.as_str(), "--if-exists"], "")
        .await
        .failed_with(4, "without --yes");
    assert!(run.stdout.is_empty());
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 3);
    // Nothing to remove: no confirmation needed to say so.
    let missing = qs.name("cli_yes_missing");
    pgmq(&["drop", missing.as_str()], "")
        .await
        .failed_with(3, "does not exist");
    pgmq(&["drop", missing.as_str(), "--if-exists"], "")
        .await
        .ok();
}

/// A role that may log in and use schema pgmq but read no queue table,
/// dropped when the guard goes.
struct Unprivileged {
    name: String,
}

impl Unprivileged {
    async fn new() -> Unprivileged {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!("r_cli_{}_{nanos:x}", std::process::id());
        let db = pgmq_client::ConnInfo::parse(&common::dsn()).unwrap();
        let db = db.get("dbname").unwrap().to_owned();
        common::raw()
            .await
            .batch_execute(&format!(
                "CREATE ROLE \"{name}\" LOGIN PASSWORD 'pw-{name}'; \
                 GRANT CONNECT ON DATABASE \"{db}\" TO \"{name}\"; \
                 GRANT USAGE ON SCHEMA pgmq TO \"{name}\""
            ))
            .await
            .unwrap();
        Unprivileged { name }
    }

    fn dsn(&self) -> String {
        let mut info = pgmq_client::ConnInfo::parse(&common::dsn()).unwrap();
        info.set("user", &self.name).unwrap();
        info.set("password", &format!("pw-{}", self.name)).unwrap();
        info.to_dsn()
    }
}

impl Drop for Unprivileged {
    fn drop(&mut self) {
        let name = self.name.clone();
        common::run_detached(move || async move {
            let _ = common::raw()
                .await
                .batch_execute(&format!(
                    "REVOKE ALL ON SCHEMA pgmq FROM \"{name}\"; DROP OWNED BY \"{name}\"; \
                     DROP ROLE IF EXISTS \"{name}\""
                ))
                .await;
        });
    }
}

/// Permission denied (SQLSTATE 42501) is refused: exit status 4.
#[tokio::test]
async fn permission_denied_is_refused() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "cli_denied").await;
    client.send(&q, &json!(1)).await.unwrap();
    let role = Unprivileged::new().await;
    let env = [("DATABASE_URL", Some(role.dsn()))];
    let env: Vec<(&str, Option<&str>)> = env.iter().map(|(k, v)| (*k, v.as_deref())).collect();
    pgmq_with(&["peek", q.as_str()], "", &env)
        .await
        .failed_with(4, "permission denied");
    pgmq_with(&["archive", "list", q.as_str()], "", &env)
        .await
        .failed_with(4, "permission denied");
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 1);
}

#[tokio::test]
async fn completions_for_each_shell_need_no_database() {
    let env = [("DATABASE_URL", None)];
    for (shell, marker) in [
        ("bash", "_pgmq()"),
        ("zsh", "#compdef pgmq"),
        ("fish", "complete -c pgmq"),
    ] {
        let run = pgmq_with(&["completions", shell], "", &env).await.ok();
        assert!(run.stdout.contains(marker), "{shell}: {}", run.stdout);
        for cmd in ["peek", "watch", "set-vt", "prune", "bind"] {
            assert!(run.stdout.contains(cmd), "{shell} lacks {cmd}");
        }
    }
    let usage = pgmq_with(&["completions", "tcsh"], "", &env).await;
    assert_eq!(usage.code, 2, "{}", usage.stderr);
}

/// `--help` speaks to operators: the exit statuses are there, developer
/// notes are not.
#[tokio::test]
async fn help_lists_exit_statuses_and_no_developer_notes() {
    let top = pgmq(&["--help"], "").await.ok().stdout;
    for code in [
        "0 done",
        "2 bad command line",
        "3 not found",
        "4 refused",
        "5 database unreachable",
    ] {
        assert!(top.contains(code), "{code} missing from --help");
    }
    let commands = [
        "list",
        "peek",
        "metrics",
        "watch",
        "create",
        "drop",
        "purge",
        "send",
        "read",
        "pop",
        "delete",
        "archive",
        "set-vt",
        "redrive",
        "topic",
        "notify",
        "install-sdk",
        "pause",
        "resume",
        "paused",
        "schedule",
        "completions",
    ];
    let mut helps = vec![top];
    for c in commands {
        helps.push(pgmq(&[c, "--help"], "").await.ok().stdout);
    }
    for sub in [
        ["archive", "list"],
        ["archive", "prune"],
        ["topic", "bind"],
        ["topic", "test"],
        ["schedule", "add"],
    ] {
        helps.push(pgmq(&[sub[0], sub[1], "--help"], "").await.ok().stdout);
    }
    for h in &helps {
        for note in ["clap", "`connect`", "Failure", "crate::", "(see `"] {
            assert!(!h.contains(note), "{note:?} in help:\n{h}");
        }
    }
}

/// `pgmq schedule`: a schedule added, listed, fired once per tick, paused,
/// resumed and removed; a bad cron expression is a usage error, a missing
/// schedule "not found".
#[tokio::test]
async fn schedules_are_added_listed_fired_paused_and_removed() {
    let client = common::client().await;
    client.install_sdk_schema().await.unwrap();
    let qs = Queues::new();
    let q = qs.fresh(&client, "cli_sched").await;
    let name = format!("cli-{}", q.as_str());
    let add = pgmq(
        &[
            "schedule",
            "add",
            &name,
            q.as_str(),
            "--every",
            "1s",
            "--message",
            r#"{"job":1}"#,
            "--headers",
            r#"{"h":"x"}"#,
            "--catch-up",
            "5",
        ],
        "",
    )
    .await
    .ok();
    assert_eq!(add.lines(), [json!({"schedule": name, "created": true})]);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let fired: Vec<Value> = pgmq(&["schedule", "fire"], "")
        .await
        .ok()
        .lines()
        .into_iter()
        .filter(|l| l["schedule"] == json!(name))
        .collect();
    assert!(!fired.is_empty(), "nothing fired");
    // A second pass within the same second sends nothing again.
    let again = pgmq(&["schedule", "fire"], "").await.ok().lines();
    let mine: Vec<_> = again
        .iter()
        .filter(|l| l["schedule"] == json!(name))
        .collect();
    assert!(mine.len() <= 1, "{mine:?}");
    let listed = pgmq(&["schedule", "list"], "").await.ok().lines();
    let row = listed
        .iter()
        .find(|l| l["schedule"] == json!(name))
        .unwrap();
    assert_eq!(row["queue"], json!(q.as_str()));
    assert_eq!(row["cadence"], json!("every 1000ms"));
    assert_eq!(row["message"], json!({"job": 1}));
    assert_eq!(row["catch_up"], json!(5));
    let table = pgmq(&["schedule", "list", "--table"], "").await.ok().stdout;
    assert!(
        table.starts_with("SCHEDULE") && table.contains(&name),
        "{table}"
    );
    let paused = pgmq(&["schedule", "pause", &name], "").await.ok().lines();
    assert_eq!(
        paused,
        [json!({"schedule": name, "paused": true, "changed": true})]
    );
    let resumed = pgmq(&["schedule", "resume", &name], "").await.ok().lines();
    assert_eq!(
        resumed,
        [json!({"schedule": name, "paused": false, "changed": true})]
    );
    pgmq(
        &["schedule", "add", &name, q.as_str(), "--cron", "61 * * * *"],
        "",
    )
    .await
    .failed_with(2, "cron expression");
    let neither = pgmq(&["schedule", "add", &name, q.as_str()], "").await;
    assert_eq!(neither.code, 2, "{}", neither.stderr);
    let removed = pgmq(&["schedule", "remove", &name], "").await.ok().lines();
    assert_eq!(removed, [json!({"schedule": name, "removed": true})]);
    pgmq(&["schedule", "remove", &name], "")
        .await
        .failed_with(3, "no schedule");
    pgmq(&["schedule", "pause", &name], "")
        .await
        .failed_with(3, "no schedule");
}
