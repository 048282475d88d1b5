//! Every outcome a handler can produce, on the real database: delete, archive,
//! retry (explicit and by error, with backoff), dead-letter (explicit, after
//! max attempts, undecodable body), panics, blocking handlers, bounded claims.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{archive_len, client, queue_len, unique, wait_for, Queues};
use pgmq_client::{Message, QueueName};
use pgmq_worker::{Backoff, Outcome, Worker};
use serde::Deserialize;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(20);

#[derive(Debug, Deserialize)]
struct Job {
    n: u64,
}

fn jobs(count: u64) -> Vec<Value> {
    (0..count).map(|n| json!({ "n": n })).collect()
}

/// Reads every message of `q` (a dead-letter queue) without deleting it.
async fn read_all(client: &pgmq_client::Client, q: &QueueName) -> Vec<Message<Value>> {
    common::ok(client.read(q, Duration::from_secs(60), 1000).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_acks_every_message_once() {
    let client = client().await;
    let q = unique("del");
    let _g = Queues::new(&client, &[&q]).await;
    client.send_batch(&q, &jobs(250)).await.unwrap();

    let seen = Arc::new(Mutex::new(HashMap::<u64, u32>::new()));
    let s = Arc::clone(&seen);
    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .concurrency(4)
        .batch_size(50)
        .poll_interval(Duration::from_millis(50))
        .handler(move |m: Message<Job>| {
            let s = Arc::clone(&s);
            async move {
                *s.lock().unwrap().entry(m.body.n).or_default() += 1;
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "250 deletes", || async { handle.acked() == 250 }).await;
    let report = handle.shutdown().await.unwrap();

    assert_eq!(queue_len(&client, &q).await, 0);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 250);
    assert!(seen.values().all(|&c| c == 1), "a message ran twice");
    assert_eq!(report.handled, 250);
    assert_eq!(report.acked, 250);
    assert_eq!(report.stats.deleted, 250);
    assert_eq!(report.stats.claimed, 250);
    assert_eq!(report.stats.succeeded, 250);
    assert_eq!(report.stats.failed, 0);
    assert_eq!(report.stats.acks_pending, 0);
    assert_eq!(report.released, 0);
    assert_eq!(report.stats.handler_latency.len(), 250);
    assert_eq!(report.stats.queue_wait_local.len(), 250);
    assert_eq!(report.stats.queue_wait_db.len(), 250);
}

#[tokio::test]
async fn archive_moves_messages_to_the_archive() {
    let client = client().await;
    let q = unique("arc");
    let _g = Queues::new(&client, &[&q]).await;
    client.send_batch(&q, &jobs(10)).await.unwrap();
    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(50))
        .handler(|_m: Message<Job>| async { Ok(Outcome::Archive) })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "10 archived", || async {
        handle.stats().archived == 10
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(queue_len(&client, &q).await, 0);
    assert_eq!(archive_len(&client, &q).await, 10);
    assert_eq!(report.stats.deleted, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_waits_the_backoff_then_succeeds() {
    let client = client().await;
    let q = unique("retry");
    let _g = Queues::new(&client, &[&q]).await;
    // n = 0 fails by error the first time; n = 1 asks for an explicit retry.
    client.send_batch(&q, &jobs(2)).await.unwrap();

    let attempts = Arc::new(Mutex::new(Vec::<(u64, i32, Instant)>::new()));
    let a = Arc::clone(&attempts);
    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(50))
        .retry_backoff(Backoff::constant(Duration::from_secs(1)))
        .retry_jitter(false)
        .handler(move |m: Message<Job>| {
            let a = Arc::clone(&a);
            async move {
                a.lock()
                    .unwrap()
                    .push((m.body.n, m.read_ct, Instant::now()));
                match (m.body.n, m.read_ct) {
                    (0, 1) => Err("not yet".into()),
                    (1, 1) => Ok(Outcome::Retry(Duration::from_secs(1))),
                    _ => Ok(Outcome::Delete),
                }
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "both deleted", || async {
        handle.stats().deleted == 2
    })
    .await;
    let report = handle.shutdown().await.unwrap();

    let attempts = attempts.lock().unwrap().clone();
    assert_eq!(attempts.len(), 4, "{attempts:?}");
    for n in 0..2 {
        let runs: Vec<_> = attempts.iter().filter(|a| a.0 == n).collect();
        assert_eq!(runs.len(), 2);
        assert_eq!((runs[0].1, runs[1].1), (1, 2), "read_ct counts attempts");
        let gap = runs[1].2 - runs[0].2;
        assert!(
            gap >= Duration::from_millis(900),
            "retried after {gap:?}, before the backoff"
        );
    }
    assert_eq!(report.stats.retried, 2);
    assert_eq!(report.stats.failed, 1);
    assert_eq!(report.stats.succeeded, 3);
    assert_eq!(queue_len(&client, &q).await, 0);
}

#[tokio::test]
async fn dead_letter_outcome_moves_the_message_with_its_reason() {
    let client = client().await;
    let q = unique("dl");
    let dlq = unique("dlq");
    let _g = Queues::new(&client, &[&q, &dlq]).await;
    let opts = pgmq_client::SendOptions::new().headers(json!({"trace": "t-1"}));
    let id = client.send_with(&q, &json!({"n": 7}), &opts).await.unwrap();

    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(50))
        .dead_letter_queue(dlq.clone())
        .handler(|_m: Message<Job>| async { Ok(Outcome::DeadLetter("customer unknown".into())) })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "dead letter", || async {
        handle.stats().dead_lettered == 1
    })
    .await;
    handle.shutdown().await.unwrap();

    assert_eq!(queue_len(&client, &q).await, 0);
    let dead = read_all(&client, &dlq).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].body, json!({"n": 7}));
    let h = dead[0].headers.as_ref().unwrap();
    assert_eq!(h["reason"], "customer unknown");
    assert_eq!(h["attempts"], 1);
    assert_eq!(h["source_queue"], q.as_str());
    assert_eq!(h["original_msg_id"], id);
    assert_eq!(h["original_headers"], json!({"trace": "t-1"}));
}

/// The dead-letter copy is exact: a body and headers with numbers no f64 or
/// i64 holds arrive in the dead-letter queue text-identical (as PostgreSQL
/// prints them): one dead-lettered by its handler, one whose body does not
/// even decode (1e400 is out of serde_json's range).
#[tokio::test]
async fn dead_letter_copies_body_and_headers_exactly() {
    let client = client().await;
    let q = unique("dlx");
    let dlq = unique("dlxq");
    let _g = Queues::new(&client, &[&q, &dlq]).await;
    let bodies = [
        r#"{"n": 1, "big": 123456789012345678901234567890, "precise": 0.1000000000000000055511151231257827021181583404541015625, "deep": [[[{"x": -98765432109876543210.000000000000000000001}]]]}"#,
        r#"[18446744073709551616, 1e400, -0.0, 3.14159265358979323846264338327950288]"#,
    ];
    let headers = r#"{"tenant": "acme", "seq": 340282366920938463463374607431768211456}"#;
    let mut ids = Vec::new();
    for (i, body) in bodies.iter().enumerate() {
        let body = pgmq_client::RawJson::from_text(*body).unwrap();
        let opts = if i == 0 {
            pgmq_client::SendOptions::new().headers(serde_json::from_str::<Value>("{}").unwrap())
        } else {
            pgmq_client::SendOptions::new()
        };
        ids.push(client.send_with(&q, &body, &opts).await.unwrap());
    }
    // Headers with a huge number, set in SQL (a serde_json::Value cannot hold it).
    let conn = client.connection().await.unwrap();
    conn.execute(
        &format!(
            "UPDATE {} SET headers = $1::text::jsonb WHERE msg_id = $2",
            q.table()
        ),
        &[&headers, &ids[0]],
    )
    .await
    .unwrap();
    let stored = |table: String| {
        let conn = &conn;
        async move {
            conn.query(
                &format!("SELECT message::text, headers::text FROM {table} ORDER BY msg_id"),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, Option<String>>(1)))
            .collect::<Vec<_>>()
        }
    };
    let before = stored(q.table()).await;
    assert_eq!(before.len(), 2);
    assert!(
        before[0].0.contains("123456789012345678901234567890"),
        "{before:?}"
    );

    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(50))
        .dead_letter_queue(dlq.clone())
        .handler(|m: Message<Value>| async move {
            Ok(Outcome::DeadLetter(format!("reason {}", m.msg_id)))
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "two dead letters", || async {
        handle.stats().dead_lettered == 2
    })
    .await;
    handle.shutdown().await.unwrap();
    assert_eq!(queue_len(&client, &q).await, 0);

    let rows = conn
        .query(
            &format!(
                "SELECT message::text, (headers->'original_headers')::text, \
                 (headers->>'original_msg_id')::bigint, headers->>'reason' \
                 FROM {} ORDER BY (headers->>'original_msg_id')::bigint",
                dlq.table()
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 2);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row.get::<_, i64>(2), ids[i]);
        assert_eq!(row.get::<_, String>(0), before[i].0, "body of message {i}");
        // A missing header is JSON null in `original_headers`.
        let original: Option<String> = row.get(1);
        let expected = before[i].1.clone().unwrap_or_else(|| "null".into());
        assert_eq!(
            original.as_deref(),
            Some(expected.as_str()),
            "headers of message {i}"
        );
        let reason: String = row.get(3);
        if i == 0 {
            assert_eq!(reason, format!("reason {}", ids[0]));
        } else {
            // 1e400 does not fit serde_json's f64: undecodable, dead-lettered
            // unhandled, and still copied exactly.
            assert!(reason.starts_with("body does not decode"), "{reason}");
        }
    }
}

#[tokio::test]
async fn undecodable_body_is_dead_lettered_without_running_the_handler() {
    let client = client().await;
    let q = unique("dec");
    let dlq = unique("decq");
    let _g = Queues::new(&client, &[&q, &dlq]).await;
    client.send(&q, &json!({"n": 1})).await.unwrap();
    client.send(&q, &json!({"nope": true})).await.unwrap();

    let calls = Arc::new(AtomicU64::new(0));
    let c = Arc::clone(&calls);
    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(50))
        .dead_letter_queue(dlq.clone())
        .handler(move |_m: Message<Job>| {
            c.fetch_add(1, Ordering::Relaxed);
            async { Ok(Outcome::Delete) }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "both resolved", || async {
        let s = handle.stats();
        s.deleted == 1 && s.dead_lettered == 1
    })
    .await;
    let report = handle.shutdown().await.unwrap();

    assert_eq!(
        calls.load(Ordering::Relaxed),
        1,
        "the handler ran on the bad body"
    );
    assert_eq!(report.stats.decode_failures, 1);
    assert_eq!(report.stats.handled, 1);
    let dead = read_all(&client, &dlq).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].body, json!({"nope": true}));
    let reason = dead[0].headers.as_ref().unwrap()["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        reason.contains("does not decode") && reason.contains("missing field `n`"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_message_is_dead_lettered_after_max_attempts() {
    let client = client().await;
    let q = unique("poison");
    let dlq = unique("poisonq");
    let _g = Queues::new(&client, &[&q, &dlq]).await;
    client.send(&q, &json!({"n": 13})).await.unwrap();

    let calls = Arc::new(Mutex::new(Vec::new()));
    let c = Arc::clone(&calls);
    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(20))
        .max_attempts(3)
        .retry_backoff(Backoff::constant(Duration::ZERO))
        .dead_letter_queue(dlq.clone())
        .handler(move |m: Message<Job>| {
            c.lock().unwrap().push(m.read_ct);
            async { Err::<Outcome, _>("boom".into()) }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "dead letter", || async {
        handle.stats().dead_lettered == 1
    })
    .await;
    let report = handle.shutdown().await.unwrap();

    assert_eq!(*calls.lock().unwrap(), vec![1, 2, 3]);
    assert_eq!(report.stats.failed, 3);
    assert_eq!(report.stats.retried, 2);
    assert_eq!(queue_len(&client, &q).await, 0);
    let dead = read_all(&client, &dlq).await;
    assert_eq!(dead.len(), 1);
    let h = dead[0].headers.as_ref().unwrap();
    assert_eq!(h["attempts"], 3);
    let reason = h["reason"].as_str().unwrap();
    assert!(
        reason.contains("boom") && reason.contains("3 times"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_delivered_more_than_max_deliveries_is_not_run_again() {
    let client = client().await;
    let q = unique("over");
    let _g = Queues::new(&client, &[&q]).await;
    client.send(&q, &json!({"n": 1})).await.unwrap();
    // Three earlier deliveries that never finished (a handler that crashes
    // the process, say): no attempt was ever recorded.
    for _ in 0..3 {
        let m = client.read::<Value>(&q, Duration::ZERO, 1).await.unwrap();
        assert_eq!(m.len(), 1);
    }
    let calls = Arc::new(AtomicU64::new(0));
    let c = Arc::clone(&calls);
    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(50))
        .max_attempts(2)
        .max_deliveries(3)
        .handler(move |_m: Message<Job>| {
            c.fetch_add(1, Ordering::Relaxed);
            async { Ok(Outcome::Delete) }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    // No dead-letter queue: archived, with the reason in its headers.
    wait_for(WAIT, "archived", || async {
        handle.stats().dead_lettered == 1
    })
    .await;
    handle.shutdown().await.unwrap();
    assert_eq!(calls.load(Ordering::Relaxed), 0);
    assert_eq!(queue_len(&client, &q).await, 0);
    assert_eq!(archive_len(&client, &q).await, 1);
    let conn = client.connection().await.unwrap();
    let row = conn
        .query_one(
            &format!("SELECT headers FROM {}", q.quoted_archive_table()),
            &[],
        )
        .await
        .unwrap();
    let headers: Value = row.get(0);
    let reason = headers["dead_letter_reason"].as_str().unwrap();
    assert!(reason.contains("max_deliveries (3)"), "{reason}");
}

/// Claims lost in a crash before their handler ran use no attempt: with
/// `max_attempts(1)` such a message still runs once. (Counting attempts by
/// `read_ct`, as before, dead-lettered it without running it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_lost_in_a_crash_use_no_attempt() {
    let client = client().await;
    let q = unique("crashclaim");
    let _g = Queues::new(&client, &[&q]).await;
    client.send(&q, &json!({"n": 1})).await.unwrap();
    // A worker claimed it and crashed before starting it, twice.
    for _ in 0..2 {
        let m = client.read::<Value>(&q, Duration::ZERO, 1).await.unwrap();
        assert_eq!(m.len(), 1);
    }
    let calls = Arc::new(AtomicU64::new(0));
    let c = Arc::clone(&calls);
    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(50))
        .max_attempts(1)
        .handler_with_context(move |_m: Message<Job>, ctx: pgmq_worker::Context| {
            assert_eq!(ctx.attempt(), 1);
            assert_eq!(ctx.deliveries(), 3);
            c.fetch_add(1, Ordering::Relaxed);
            async { Ok(Outcome::Delete) }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "deleted", || async { handle.stats().deleted == 1 }).await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    assert_eq!(report.stats.dead_lettered, 0);
    assert_eq!(queue_len(&client, &q).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_is_a_failure_and_the_others_keep_going() {
    let client = client().await;
    let q = unique("panic");
    let _g = Queues::new(&client, &[&q]).await;
    client.send_batch(&q, &jobs(40)).await.unwrap();
    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .concurrency(3)
        .poll_interval(Duration::from_millis(20))
        .retry_backoff(Backoff::constant(Duration::ZERO))
        .handler(|m: Message<Job>| async move {
            if m.body.n.is_multiple_of(5) && m.read_ct == 1 {
                panic!("job {} exploded", m.body.n);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok(Outcome::Delete)
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "40 deleted", || async {
        handle.stats().deleted == 40
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.stats.panicked, 8);
    assert_eq!(report.stats.failed, 8);
    assert_eq!(report.stats.retried, 8);
    assert_eq!(report.handled, 48);
    assert_eq!(queue_len(&client, &q).await, 0);
}

#[tokio::test]
async fn blocking_handlers_run_off_the_runtime() {
    // A current-thread runtime: a blocking handler on it would serialize
    // everything. Each run records how many runs were inside a handler at
    // once; blocking handlers on their own threads overlap.
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let client = client().await;
    let q = unique("blk");
    let _g = Queues::new(&client, &[&q]).await;
    client.send_batch(&q, &jobs(8)).await.unwrap();
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (r, m) = (running.clone(), most.clone());
    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .concurrency(4)
        .poll_interval(Duration::from_millis(20))
        .blocking_handler(move |msg: Message<Job>| {
            let now = r.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(200));
            r.fetch_sub(1, Ordering::SeqCst);
            if msg.body.n == 3 && msg.read_ct == 1 {
                panic!("blocking handler panicked");
            }
            Ok(Outcome::Delete)
        })
        .retry_backoff(Backoff::constant(Duration::ZERO))
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "8 deleted", || async { handle.stats().deleted == 8 }).await;
    let report = handle.shutdown().await.unwrap();
    assert!(
        most.load(Ordering::SeqCst) >= 2,
        "blocking handlers never overlapped: they ran one at a time"
    );
    assert_eq!(report.stats.panicked, 1);
    assert_eq!(report.handled, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_never_exceed_the_claim_capacity() {
    let client = client().await;
    let q = unique("bound");
    let _g = Queues::new(&client, &[&q]).await;
    client.send_batch(&q, &jobs(300)).await.unwrap();
    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .concurrency(2)
        .batch_size(20)
        .claim_capacity(30)
        .poll_interval(Duration::from_millis(20))
        .handler(|_m: Message<Job>| async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok(Outcome::Delete)
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    let mut max_held = 0;
    let mut samples = 0;
    loop {
        let s = handle.stats();
        // Claimed but not yet taken by a handler: at most the capacity, plus
        // the handlers' own messages.
        let held = s.claimed - s.handled;
        max_held = max_held.max(held);
        samples += 1;
        if s.deleted == 300 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let report = handle.shutdown().await.unwrap();
    assert!(samples > 10);
    assert!(
        max_held <= 30 + 2,
        "held {max_held} messages with capacity 30"
    );
    assert!(max_held >= 10, "never filled the claim queue ({max_held})");
    // Once the first handler has finished, every read asks for at least half
    // a batch (10): 30 of them empty the queue. Before that the worker claims
    // only `concurrency` (2) at a time (a few reads), and the end of the
    // queue leaves at most a short read per claimer. Reading whatever room a
    // finished handler frees would take well over 100 reads. Empty polls
    // after the queue ran dry depend on timing and are not counted.
    let found = report.stats.reads - report.stats.empty_reads;
    assert!(
        found <= 300 / 10 + 8,
        "{found} reads found messages ({} reads, {} empty)",
        report.stats.reads,
        report.stats.empty_reads
    );
}

#[tokio::test]
async fn delayed_messages_are_found_by_polling() {
    let client = client().await;
    let q = unique("delay");
    let _g = Queues::new(&client, &[&q]).await;
    client
        .send_batch_with(
            &q,
            &jobs(3),
            &pgmq_client::SendOptions::new().delay(std::time::Duration::from_secs(1)),
        )
        .await
        .unwrap();
    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(100))
        .handler(|_m: Message<Job>| async { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "3 deleted", || async { handle.stats().deleted == 3 }).await;
    let report = handle.shutdown().await.unwrap();
    assert!(report.stats.empty_reads >= 2);
    assert!(report.stats.wakeups_poll >= 2);
}

#[tokio::test]
async fn a_missing_queue_fails_at_start() {
    let client = client().await;
    let q = unique("missing");
    let worker: Worker<Job> = Worker::builder(client.clone(), q)
        .handler(|_m: Message<Job>| async { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let err = common::start_error(worker).await;
    assert!(
        matches!(
            err,
            pgmq_worker::Error::Client(pgmq_client::Error::QueueNotFound { .. })
        ),
        "{err}"
    );
    let bad = Worker::<Job>::builder(client, unique("x"))
        .concurrency(0)
        .handler(|_m: Message<Job>| async { Ok(Outcome::Delete) })
        .build();
    assert!(matches!(bad, Err(pgmq_worker::Error::Config(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handlers_claim_only_what_they_can_start_in_time() {
    // 2 handlers of 100 ms on a 1 s visibility timeout: claiming all 40
    // messages at once would leave the tail waiting 2 s, past its timeout.
    let client = client().await;
    let q = unique("slow");
    let _g = Queues::new(&client, &[&q]).await;
    client.send_batch(&q, &jobs(40)).await.unwrap();
    let reads = Arc::new(Mutex::new(Vec::new()));
    let r = Arc::clone(&reads);
    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .concurrency(2)
        .visibility_timeout(Duration::from_secs(1))
        .heartbeat(false)
        .poll_interval(Duration::from_millis(20))
        .handler(move |m: Message<Job>| {
            r.lock().unwrap().push((m.body.n, m.read_ct));
            async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    let mut max_held = 0;
    while handle.stats().deleted < 40 {
        let s = handle.stats();
        max_held = max_held.max(s.claimed - s.handled);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let report = handle.shutdown().await.unwrap();
    let reads = reads.lock().unwrap().clone();
    assert_eq!(reads.len(), 40, "a message ran twice: {reads:?}");
    assert!(reads.iter().all(|r| r.1 == 1), "{reads:?}");
    assert_eq!(report.stats.expired_unstarted, 0);
    // 2 handlers * 250 ms / 100 ms = 5 waiting, plus the 2 running.
    assert!(max_held <= 8, "held {max_held}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_that_expired_unstarted_are_given_back_with_their_read_undone() {
    // One handler; a 3.3 s job holds up 5 claimed messages past 3/4 of
    // their 4 s visibility timeout (3 s), but not past it.
    let client = client().await;
    let q = unique("expired");
    let _g = Queues::new(&client, &[&q]).await;
    client.send(&q, &json!({"n": 100})).await.unwrap();
    let reads = Arc::new(Mutex::new(Vec::new()));
    let r = Arc::clone(&reads);
    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .concurrency(1)
        .max_attempts(1)
        .visibility_timeout(Duration::from_secs(4))
        .poll_interval(Duration::from_millis(20))
        .handler(move |m: Message<Job>| {
            r.lock().unwrap().push((m.body.n, m.read_ct));
            async move {
                if m.body.n == 0 {
                    tokio::time::sleep(Duration::from_millis(3300)).await;
                }
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    // A quick first message, so that the claim limit opens up (claimer.rs).
    wait_for(WAIT, "the warm-up", || async {
        handle.stats().deleted == 1
    })
    .await;
    client.send_batch(&q, &jobs(6)).await.unwrap();
    wait_for(WAIT, "all handled", || async {
        handle.stats().deleted == 7
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.stats.expired_unstarted, 5);
    assert_eq!(report.stats.expired_released, 5);
    // Each ran once, on its first counted attempt: the wait used up none
    // (with max_attempts 1, a second would have been dead-lettered).
    let mut reads = reads.lock().unwrap().clone();
    reads.sort_unstable();
    let want: Vec<(u64, i32)> = (0..6).map(|n| (n, 1)).chain([(100, 1)]).collect();
    assert_eq!(reads, want);
    assert_eq!(report.stats.dead_lettered, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_one_connection_still_drains_the_queue() {
    // The claim loops keep their connection between back-to-back reads; they
    // must give it back before waiting, or with a single pooled connection the
    // acknowledgements (and so the handlers, and so the claims) would wait
    // for ever.
    let setup = client().await;
    let q = unique("pool1");
    let _g = Queues::new(&setup, &[&q]).await;
    setup.send_batch(&q, &jobs(1000)).await.unwrap();
    let client = pgmq_client::ClientBuilder::new(&common::dsn())
        .max_size(1)
        .connect()
        .await
        .unwrap();
    let worker: Worker<Job> = Worker::builder(client, q.clone())
        .concurrency(4)
        .batch_size(50)
        .ack_capacity(50)
        .handler(|_m: Message<Job>| async { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "1000 deleted", || async {
        handle.stats().deleted == 1000
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.stats.deleted, 1000);
    assert_eq!(queue_len(&setup, &q).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_workers_snapshot_holds_every_handled_message() {
    // Handler loops merge their histograms into the shared ones at most every
    // 100 ms; one that goes idle with values left merges them when its wait
    // outlasts that, so a live snapshot of an idle worker is complete.
    let client = client().await;
    let q = unique("snap");
    let _g = Queues::new(&client, &[&q]).await;
    client.send_batch(&q, &jobs(300)).await.unwrap();
    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .concurrency(8)
        .poll_interval(Duration::from_secs(5))
        .handler(|_m: Message<Job>| async { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "300 deleted", || async {
        handle.stats().deleted == 300
    })
    .await;
    wait_for(Duration::from_secs(2), "histograms complete", || async {
        let s = handle.stats();
        s.handler_latency.len() == 300 && s.queue_wait_local.len() == 300
    })
    .await;
    handle.shutdown().await.unwrap();
}

/// Handler text longer than `MAX_REASON_LEN` is cut before it reaches the
/// dead-letter `reason` header: an error's text (after max_attempts) and an
/// explicit `Outcome::DeadLetter` reason. The cut keeps the start, ends in
/// `…`, and drops the tail (which may quote the data being handled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_handler_text_is_cut_in_the_dead_letter_reason() {
    use pgmq_worker::MAX_REASON_LEN;
    let client = client().await;
    let q = unique("longr");
    let dlq = unique("longrq");
    let _g = Queues::new(&client, &[&q, &dlq]).await;
    client.send_batch(&q, &jobs(2)).await.unwrap();
    // Multi-byte characters around the cut: it must land on a boundary.
    let long = |n: u64| format!("start-{n} {} TAIL-SECRET", "é".repeat(MAX_REASON_LEN * 4));

    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(20))
        .max_attempts(1)
        .dead_letter_queue(dlq.clone())
        .handler(move |m: Message<Job>| {
            let text = long(m.body.n);
            async move {
                if m.body.n == 0 {
                    Err(std::io::Error::other(text).into())
                } else {
                    Ok(Outcome::DeadLetter(text))
                }
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "two dead letters", || async {
        handle.stats().dead_lettered == 2
    })
    .await;
    handle.shutdown().await.unwrap();

    let dead = read_all(&client, &dlq).await;
    assert_eq!(dead.len(), 2);
    for m in &dead {
        let reason = m.headers.as_ref().unwrap()["reason"].as_str().unwrap();
        let n = m.body["n"].as_u64().unwrap();
        assert!(
            !reason.contains("TAIL-SECRET"),
            "not cut: {} bytes",
            reason.len()
        );
        assert!(reason.ends_with('…'), "{reason}");
        let start = format!("start-{n} ");
        let at = reason.find(&start).unwrap_or_else(|| panic!("{reason}"));
        // The handler's text, from where it starts in the header: at most
        // MAX_REASON_LEN bytes, then the ellipsis.
        let handler_part = &reason[at..];
        let kept = handler_part.len() - '…'.len_utf8();
        assert!(
            (MAX_REASON_LEN - 3..=MAX_REASON_LEN).contains(&kept),
            "{n}: {kept} bytes kept"
        );
        if n == 0 {
            assert!(
                reason.starts_with("failed 1 times (max_attempts), last error: "),
                "{reason}"
            );
        } else {
            assert_eq!(at, 0, "{reason}");
        }
    }
}

/// `Outcome::Retry(Duration::MAX)` and `Outcome::Snooze(Duration::MAX)` do
/// not panic or overflow: the delay is cut to `pgmq_client::MAX_DELAY` (about
/// 68 years), the messages stay in the queue, invisible until then, and are
/// counted as retried and snoozed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_and_snooze_for_ever_requeue_far_in_the_future() {
    let client = client().await;
    let q = unique("forever");
    let _g = Queues::new(&client, &[&q]).await;
    client.send_batch(&q, &jobs(2)).await.unwrap();

    let worker: Worker<Job> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(20))
        .retry_jitter(true)
        .handler(|m: Message<Job>| async move {
            Ok(if m.body.n == 0 {
                Outcome::Retry(Duration::MAX)
            } else {
                Outcome::Snooze(Duration::MAX)
            })
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "one retried and one snoozed", || async {
        let s = handle.stats();
        s.retried == 1 && s.snoozed == 1
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.stats.retried, 1);
    assert_eq!(report.stats.snoozed, 1);
    assert_eq!(report.stats.succeeded, 2);
    assert_eq!(report.stats.failed + report.stats.panicked, 0);
    assert_eq!(queue_len(&client, &q).await, 2);

    let conn = client.connection().await.unwrap();
    let rows = conn
        .query(
            &format!(
                "SELECT (message->>'n')::int, \
                 extract(year FROM vt)::int - extract(year FROM now())::int \
                 FROM {} ORDER BY msg_id",
                q.quoted_table()
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        let (n, years): (i32, i32) = (r.get(0), r.get(1));
        assert!(years > 60, "message {n} visible again in {years} years");
    }
}
