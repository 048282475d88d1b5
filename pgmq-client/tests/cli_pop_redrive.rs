//! `pgmq pop` and `pgmq redrive` when things go wrong: stdout closed early,
//! a target that is the dead-letter queue itself, many messages left in
//! place, a connection lost during COMMIT. Run as a process against the test
//! database (through a cutting proxy for the last one). And `pgmq move` by
//! a filter, and two `pgmq archive prune` processes at once.
#![cfg(feature = "cli")]

mod common;

use std::process::Stdio;
use std::time::Duration;

use pgmq_client::{QueueName, SendOptions};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use common::Queues;

/// Long enough for any of these runs; reaching it means the run hung.
const HANG: Duration = Duration::from_secs(120);

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `pgmq args` with DATABASE_URL = `dsn`, killed when it outlives [`HANG`]
/// (then `code` is None).
async fn pgmq_on(dsn: &str, args: &[&str]) -> Run {
    let child = spawn(dsn, args);
    match tokio::time::timeout(HANG, child.wait_with_output()).await {
        Ok(out) => {
            let out = out.unwrap();
            Run {
                code: out.status.code(),
                stdout: String::from_utf8(out.stdout).unwrap(),
                stderr: String::from_utf8(out.stderr).unwrap(),
            }
        }
        Err(_) => Run {
            code: None,
            stdout: String::new(),
            stderr: String::new(),
        },
    }
}

/// `pgmq args` started with DATABASE_URL = `dsn`, stdout and stderr piped;
/// killed when dropped.
fn spawn(dsn: &str, args: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_pgmq"))
        .args(args)
        .env("DATABASE_URL", dsn)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn pgmq(args: &[&str]) -> Run {
    pgmq_on(&common::dsn(), args).await
}

/// (msg_id, read_ct, visible now) of every message in `q`, by id.
async fn rows(q: &QueueName) -> Vec<(i64, i32, bool)> {
    common::msg_states(&common::raw().await, q).await
}

/// `pgmq pop q -n 1000 | head -1`: the reader takes one line and closes the
/// pipe. Every message is still in the queue, visible again at once (the
/// printed one too: pop deletes only what it wrote out in full).
#[tokio::test]
async fn pop_into_a_pipe_closed_after_one_line_loses_nothing() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "cli_pop_pipe").await;
    // 1000 lines of about 600 bytes: far more than a pipe holds.
    let pad = "x".repeat(500);
    let bodies: Vec<Value> = (0..1000).map(|i| json!({"n": i, "pad": pad})).collect();
    client.send_batch(&q, &bodies).await.unwrap();

    let mut child = spawn(&common::dsn(), &["pop", q.as_str(), "-n", "1000"]);
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    tokio::time::timeout(HANG, stdout.read_line(&mut first))
        .await
        .expect("no line came out")
        .unwrap();
    let first: Value = serde_json::from_str(&first).unwrap();
    drop(stdout);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .await
        .unwrap();
    let status = tokio::time::timeout(HANG, child.wait())
        .await
        .expect("pop did not end")
        .unwrap();

    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("writing output"), "{stderr}");
    assert!(stderr.contains("no message was deleted"), "{stderr}");
    let left = rows(&q).await;
    assert_eq!(left.len(), 1000, "messages were lost: {stderr}");
    assert!(left.iter().all(|(_, _, visible)| *visible), "still hidden");
    assert!(left
        .iter()
        .any(|(id, _, _)| Some(*id) == first["msg_id"].as_i64()));

    // With stdout intact, pop prints and deletes.
    let run = pgmq(&["pop", q.as_str(), "-n", "3"]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout.lines().count(), 3);
    assert_eq!(rows(&q).await.len(), 997);
}

fn dead(source: &str) -> Value {
    json!({"source_queue": source, "original_headers": null})
}

/// A dead letter naming `source`; its msg_id.
async fn send_dead(client: &pgmq_client::Client, dlq: &QueueName, source: &QueueName) -> i64 {
    client
        .send_with(
            dlq,
            &json!({"moves": 1}),
            &SendOptions::new().headers(dead(source.as_str())),
        )
        .await
        .unwrap()
}

/// `--to` naming the dead-letter queue is refused at once (the copies would
/// be read again: the run would never end).
#[tokio::test]
async fn redrive_to_the_dead_letter_queue_itself_is_refused() {
    let client = common::client().await;
    let qs = Queues::new();
    let dlq = qs.fresh(&client, "cli_rd_self").await;
    client
        .send_batch(&dlq, &[json!(1), json!(2)])
        .await
        .unwrap();
    let run = pgmq(&["redrive", dlq.as_str(), "--to", dlq.as_str()]).await;
    assert!(run.code.is_some(), "redrive --to itself did not end");
    assert_eq!(run.code, Some(2), "a bad command line: {}", run.stderr);
    assert!(
        run.stderr.starts_with("pgmq: error: ") && run.stderr.contains("--to"),
        "{}",
        run.stderr
    );
    assert_eq!(rows(&dlq).await.len(), 2);
    assert!(rows(&dlq).await.iter().all(|r| r.1 == 0));
}

/// Messages redrive leaves in place are not touched: no read_ct, not
/// hidden; the movable ones move.
#[tokio::test]
async fn redrive_leaves_skipped_messages_untouched() {
    let client = common::client().await;
    let qs = Queues::new();
    let src = qs.fresh(&client, "cli_rd_src").await;
    let dlq = qs.fresh(&client, "cli_rd_skip").await;
    let headers = vec![
        json!({"note": "no source"}),
        dead(src.as_str()),
        json!({"source_queue": "no_such_queue_here"}),
        dead(src.as_str()),
    ];
    let ids = client
        .send_batch_with(
            &dlq,
            &[json!(1), json!(2), json!(3), json!(4)],
            &SendOptions::new().headers_each(headers),
        )
        .await
        .unwrap();
    let run = pgmq(&["redrive", dlq.as_str(), "--batch", "1"]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stderr.contains("moved 2"), "{}", run.stderr);
    assert!(run.stderr.contains("2 left in place"), "{}", run.stderr);
    assert_eq!(
        rows(&dlq).await,
        vec![(ids[0], 0, true), (ids[2], 0, true)],
        "the messages left in place were changed"
    );
    assert_eq!(rows(&src).await.len(), 2);
    // A second run leaves them exactly so too.
    let run = pgmq(&["redrive", dlq.as_str()]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(rows(&dlq).await, vec![(ids[0], 0, true), (ids[2], 0, true)]);
}

/// More messages left in place than one call takes (10 000) do not fail the
/// run after the moves committed: they are counted and reported.
#[tokio::test]
async fn redrive_with_more_than_ten_thousand_left_in_place_succeeds() {
    let client = common::client().await;
    let qs = Queues::new();
    let src = qs.fresh(&client, "cli_rd_src").await;
    let dlq = qs.fresh(&client, "cli_rd_many").await;
    let stay: Vec<Value> = (0..5001).map(|i| json!({"stays": i})).collect();
    for _ in 0..2 {
        client.send_batch(&dlq, &stay).await.unwrap();
    }
    send_dead(&client, &dlq, &src).await;
    let run = pgmq(&["redrive", dlq.as_str(), "--batch", "5000"]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr.contains("moved 1 message(s)") && run.stderr.contains("10002 left in place"),
        "{}",
        run.stderr.lines().last().unwrap_or_default()
    );
    assert_eq!(rows(&src).await.len(), 1);
    let left = rows(&dlq).await;
    assert_eq!(left.len(), 10002);
    assert!(
        left.iter().all(|r| r.1 == 0 && r.2),
        "left ones were changed"
    );
}

/// A proxy to the test database that cuts every connection through it the
/// moment the client sends COMMIT (before the server gets it); its DSN.
async fn commit_cutting_proxy() -> String {
    let dsn = common::dsn();
    let config: tokio_postgres::Config = dsn.parse().unwrap();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let local = listener.local_addr().unwrap().port();
    let proxied = dsn.replacen(&format!("{host}:{port}"), &format!("127.0.0.1:{local}"), 1);
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let server = TcpStream::connect((host.as_str(), port)).await.unwrap();
            tokio::spawn(pipe_until_commit(client, server));
        }
    });
    proxied
}

/// Copies bytes both ways; drops both sockets when the client's side holds
/// a simple-query COMMIT.
async fn pipe_until_commit(client: TcpStream, server: TcpStream) {
    const COMMIT: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let down = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut sr, &mut cw).await;
        cw
    });
    let mut buf = vec![0u8; 64 * 1024];
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let n = match cr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        tail.extend_from_slice(&buf[..n]);
        if tail.windows(COMMIT.len()).any(|w| w == COMMIT) {
            break;
        }
        if sw.write_all(&buf[..n]).await.is_err() {
            break;
        }
        let keep = tail.len().saturating_sub(COMMIT.len());
        tail.drain(..keep);
    }
    down.abort();
}

/// The connection drops during a batch's COMMIT: redrive says the batch's
/// outcome is unknown and names the ids to check, not "nothing moved".
#[tokio::test]
async fn redrive_with_the_commit_lost_says_the_outcome_is_unknown() {
    let client = common::client().await;
    let qs = Queues::new();
    let src = qs.fresh(&client, "cli_rd_src").await;
    let dlq = qs.fresh(&client, "cli_rd_cut").await;
    let id = send_dead(&client, &dlq, &src).await;
    let proxy = commit_cutting_proxy().await;
    let run = pgmq_on(&proxy, &["redrive", dlq.as_str()]).await;
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("the outcome of this batch is unknown"),
        "{}",
        run.stderr
    );
    assert!(
        !run.stderr.contains("nothing of this batch was moved"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains(&format!("{dlq} for msg_ids {id}"))
            && run.stderr.contains(src.as_str()),
        "{}",
        run.stderr
    );
    // The server never got the COMMIT: the message is still a dead letter.
    assert_eq!(rows(&dlq).await.len(), 1);
    assert!(rows(&src).await.is_empty());
}

/// `pgmq move --filter`: the matching messages move, one line each with
/// their new id, headers kept; the others stay.
#[tokio::test]
async fn move_by_filter_moves_the_matching_messages() {
    let client = common::client().await;
    let qs = Queues::new();
    let from = qs.fresh(&client, "cli_mv_from").await;
    let to = qs.fresh(&client, "cli_mv_to").await;
    let bodies: Vec<Value> = (0..6).map(|n| json!({"n": n, "eu": n % 2 == 0})).collect();
    let ids = client
        .send_batch_with(&from, &bodies, &SendOptions::new().headers(json!({"h": 1})))
        .await
        .unwrap();
    let run = pgmq(&[
        "move",
        from.as_str(),
        to.as_str(),
        "--filter",
        r#"{"eu": true}"#,
        "--batch",
        "2",
    ])
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines: Vec<Value> = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let moved: Vec<i64> = lines
        .iter()
        .map(|l| l["msg_id"].as_i64().unwrap())
        .collect();
    assert_eq!(moved, [ids[0], ids[2], ids[4]]);
    assert!(lines
        .iter()
        .all(|l| l["queue"] == to.as_str() && l["new_msg_id"].is_i64()));
    assert!(run.stderr.contains("moved 3 message(s)"), "{}", run.stderr);
    assert_eq!(rows(&from).await.len(), 3);
    let there = client.peek_raw(&to, 10).await.unwrap();
    assert_eq!(there.len(), 3);
    assert!(there.iter().all(|m| m.headers == Some(json!({"h": 1}))));
    // Without a selection, or to itself: a usage error, nothing moved.
    for bad in [
        &["move", from.as_str(), to.as_str()][..],
        &["move", from.as_str(), from.as_str(), "--all"],
    ] {
        assert_eq!(pgmq(bad).await.code, Some(2), "{bad:?}");
    }
    assert_eq!(rows(&from).await.len(), 3);
}

/// Two `pgmq archive prune` processes at once on one archive, in batches
/// of 10: each old row is pruned once (their counts add up) and no young
/// one; `--keep` keeps the newest.
#[tokio::test]
async fn prune_processes_at_once_prune_each_old_row_once() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "cli_prune_two").await;
    let bodies: Vec<Value> = (0..600).map(|n| json!(n)).collect();
    let ids = client.send_batch(&q, &bodies).await.unwrap();
    client.archive_batch(&q, &ids).await.unwrap();
    let old: Vec<i64> = ids.iter().copied().step_by(2).collect();
    common::raw()
        .await
        .execute(
            &format!(
                "UPDATE {} SET archived_at = archived_at - interval '2 hours' WHERE msg_id = ANY($1)",
                q.quoted_archive_table()
            ),
            &[&old],
        )
        .await
        .unwrap();
    let args = [
        "archive",
        "prune",
        q.as_str(),
        "--older-than",
        "1h",
        "--batch",
        "10",
    ];
    let dsn = common::dsn();
    let (a, b) = tokio::join!(pgmq_on(&dsn, &args), pgmq_on(&dsn, &args));
    let mut pruned = 0;
    for run in [a, b] {
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        let line: Value = serde_json::from_str(run.stdout.trim()).unwrap();
        pruned += line["pruned"].as_u64().unwrap();
    }
    assert_eq!(pruned, old.len() as u64);
    let pg = common::raw().await;
    let left: Vec<i64> = common::archive_rows(&pg, &q)
        .await
        .iter()
        .map(|r| r.0)
        .collect();
    let young: Vec<i64> = ids.iter().copied().skip(1).step_by(2).collect();
    assert_eq!(left, young);
    // --keep alone: the newest 5 stay.
    let run = pgmq(&["archive", "prune", q.as_str(), "--keep", "5"]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let left: Vec<i64> = common::archive_rows(&pg, &q)
        .await
        .iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(left, young[young.len() - 5..]);
}
