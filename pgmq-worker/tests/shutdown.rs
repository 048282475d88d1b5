//! The stop sequence: release of unstarted claims at once, in-flight handlers
//! finishing within the grace period, abandoned ones reported, queued
//! acknowledgements drained, and the report's numbers.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{client, queue_len, unique, wait_for, Queues, RowLock};
use pgmq_client::Message;
use pgmq_worker::{Outcome, Worker};
use serde_json::{json, Value};
use tokio::sync::Notify;

const WAIT: Duration = Duration::from_secs(20);

fn bodies(count: u64) -> Vec<Value> {
    (0..count).map(|n| json!({ "n": n })).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_unstarted_claims_before_in_flight_handlers_finish() {
    let client = client().await;
    let q = unique("stop");
    let _g = Queues::new(&client, &[&q]).await;
    // A quick warm-up message first: until a handler has finished, the worker
    // claims only as many messages as it has handlers (claimer.rs).
    client.send(&q, &json!({"warm_up": true})).await.unwrap();

    let started = Arc::new(Notify::new());
    let finished_at = Arc::new(Mutex::new(None::<Instant>));
    let (s, f) = (Arc::clone(&started), Arc::clone(&finished_at));
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(1)
        .batch_size(50)
        .claim_capacity(100)
        .poll_interval(Duration::from_millis(50))
        .shutdown_grace(Duration::from_secs(10))
        .handler(move |m: Message<Value>| {
            let (s, f) = (Arc::clone(&s), Arc::clone(&f));
            async move {
                if m.body.get("warm_up").is_none() {
                    s.notify_one();
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    *f.lock().unwrap() = Some(Instant::now());
                }
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "the warm-up", || async {
        handle.stats().deleted == 1
    })
    .await;
    client.send_batch(&q, &bodies(50)).await.unwrap();
    started.notified().await;
    wait_for(WAIT, "all 50 claimed", || async {
        handle.stats().claimed == 51
    })
    .await;
    // Nothing is visible: one message runs, 49 wait in the claim queue.
    let none = client
        .read::<Value>(&q, Duration::from_secs(60), 100)
        .await
        .unwrap();
    assert!(none.is_empty());

    let shutdown_began = Instant::now();
    let stopping = tokio::spawn(handle.shutdown());
    // The 49 unstarted messages come back at once, while the handler still runs.
    let mut released = Vec::new();
    let seen_at = loop {
        released.extend(
            client
                .read::<Value>(&q, Duration::from_secs(60), 100)
                .await
                .unwrap(),
        );
        if released.len() >= 49 {
            break Instant::now();
        }
        assert!(
            shutdown_began.elapsed() < Duration::from_secs(1),
            "not released at once"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(released.len(), 49);
    let report = stopping.await.unwrap().unwrap();
    let finished_at = finished_at
        .lock()
        .unwrap()
        .expect("the in-flight handler finished");
    assert!(
        seen_at < finished_at,
        "released only after the in-flight handler finished"
    );

    assert_eq!(report.handled, 2);
    assert_eq!(report.acked, 2);
    assert_eq!(report.stats.deleted, 2);
    assert_eq!(report.released, 49);
    assert_eq!(report.still_running_at_deadline, 0);
    assert_eq!(report.acks_failed, 0);
    assert_eq!(report.release_failed, 0);
    // The in-flight message was deleted; the 49 released ones are the test's now.
    assert_eq!(queue_len(&client, &q).await, 49);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_past_the_grace_period_are_abandoned_and_reported() {
    let client = client().await;
    let q = unique("grace");
    let _g = Queues::new(&client, &[&q]).await;
    client.send_batch(&q, &bodies(2)).await.unwrap();

    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(2)
        .visibility_timeout(Duration::from_secs(30))
        .poll_interval(Duration::from_millis(50))
        .shutdown_grace(Duration::from_millis(300))
        .handler(|m: Message<Value>| async move {
            if m.body["n"] == 0 {
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            Ok(Outcome::Delete)
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "one deleted", || async {
        handle.stats().deleted == 1
    })
    .await;
    let t = Instant::now();
    let report = handle.shutdown().await.unwrap();
    let took = t.elapsed();
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
    assert!(took >= Duration::from_millis(250), "shutdown took {took:?}");
    assert_eq!(report.still_running_at_deadline, 1);
    assert_eq!(report.stats.still_running_at_deadline, 1);
    assert_eq!(report.handled, 1);
    // The abandoned message stays invisible until its visibility timeout ends.
    let m = client.metrics(&q).await.unwrap();
    assert_eq!((m.queue_length, m.queue_visible_length), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_acknowledgements_are_written_before_shutdown_returns() {
    let client = client().await;
    let q = unique("drain");
    let _g = Queues::new(&client, &[&q]).await;
    client.send_batch(&q, &bodies(120)).await.unwrap();

    let calls = Arc::new(AtomicU64::new(0));
    let c = Arc::clone(&calls);
    // Acknowledgements wait up to 30 s for a batch of 1000: only the drain
    // at shutdown writes them.
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(4)
        .poll_interval(Duration::from_millis(50))
        .ack_batch_size(1000)
        .ack_capacity(1000)
        .ack_flush_interval(Duration::from_secs(30))
        .handler(move |_m: Message<Value>| {
            c.fetch_add(1, Ordering::Relaxed);
            async { Ok(Outcome::Delete) }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "120 handled", || async {
        handle.stats().handled == 120
    })
    .await;
    let s = handle.stats();
    assert_eq!(s.deleted, 0);
    assert_eq!(s.acks_pending, 120);
    assert_eq!(queue_len(&client, &q).await, 120);

    let t = Instant::now();
    let report = handle.shutdown().await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(report.acked, 120);
    assert_eq!(report.stats.acks_pending, 0);
    assert_eq!(report.released, 0);
    assert_eq!(queue_len(&client, &q).await, 0);
    assert_eq!(calls.load(Ordering::Relaxed), 120);
}

#[tokio::test]
async fn run_until_stops_when_the_future_resolves() {
    let client = client().await;
    let q = unique("until");
    let _g = Queues::new(&client, &[&q]).await;
    client.send_batch(&q, &bodies(5)).await.unwrap();
    let token = tokio_util::sync::CancellationToken::new();
    let t2 = token.clone();
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(20))
        .handler(move |_m: Message<Value>| {
            let t2 = t2.clone();
            async move {
                t2.cancel();
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap();
    let report = worker.run_until(token.cancelled_owned()).await.unwrap();
    // Every claimed message was either handled (and acknowledged) or released.
    assert_eq!(report.handled + report.released, 5);
    assert_eq!(report.acked, report.handled);
    assert_eq!(queue_len(&client, &q).await as u64, report.released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_blocking_handler_does_not_hold_up_the_shutdown() {
    let client = client().await;
    let q = unique("blkgrace");
    let _g = Queues::new(&client, &[&q]).await;
    client.send_batch(&q, &bodies(3)).await.unwrap();
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(2)
        .poll_interval(Duration::from_millis(20))
        .shutdown_grace(Duration::from_millis(200))
        .blocking_handler(|m: Message<Value>| {
            if m.body["n"] == 0 {
                std::thread::sleep(Duration::from_secs(3));
            }
            Ok(Outcome::Delete)
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "two deleted", || async {
        handle.stats().deleted == 2
    })
    .await;
    let t = Instant::now();
    let report = handle.shutdown().await.unwrap();
    // Neither the 3 s handler nor the 10 s ack drain timeout is waited for.
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(report.still_running_at_deadline, 1);
    assert_eq!(report.acked, 2);
    let m = client.metrics(&q).await.unwrap();
    assert_eq!((m.queue_length, m.queue_visible_length), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_at_shutdown_use_up_no_attempt() {
    let client = client().await;
    let q = unique("relattempts");
    let dlq = unique("relattempts_dlq");
    let _g = Queues::new(&client, &[&q, &dlq]).await;
    const N: u64 = 80;
    client.send_batch(&q, &bodies(N)).await.unwrap();
    // Handler runs per message, over every worker below.
    let runs = Arc::new(Mutex::new(vec![0u32; N as usize]));
    let build = |max_attempts: u32, sleep: Duration| {
        let runs = Arc::clone(&runs);
        Worker::<Value>::builder(client.clone(), q.clone())
            .concurrency(2)
            .max_attempts(max_attempts)
            .dead_letter_queue(dlq.clone())
            .poll_interval(Duration::from_millis(20))
            .handler(move |m: Message<Value>| {
                let runs = Arc::clone(&runs);
                async move {
                    runs.lock().unwrap()[m.body["n"].as_u64().unwrap() as usize] += 1;
                    tokio::time::sleep(sleep).await;
                    Ok(Outcome::Delete)
                }
            })
            .build()
            .unwrap()
    };
    // Five graceful shutdowns while most claims wait unstarted behind slow
    // handlers: each releases them.
    for round in 0..5 {
        let handle = build(2, Duration::from_millis(300)).spawn();
        wait_for(WAIT, "claims waiting behind the handlers", || async {
            let s = handle.stats();
            s.handled >= 1 && s.claimed >= s.handled + 10
        })
        .await;
        let report = handle.shutdown().await.unwrap();
        assert!(report.released >= 8, "round {round}: {report:?}");
        assert_eq!(report.release_failed, 0);
        assert_eq!(report.stats.dead_lettered, 0, "round {round}");
        // What is left was never run, or given back with its read undone.
        let conn = client.connection().await.unwrap();
        let max_read_ct: Option<i32> = conn
            .query_one(&format!("SELECT max(read_ct) FROM {}", q.table()), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(max_read_ct, Some(0), "round {round}");
    }
    // A last worker drains the rest: nothing is dead-lettered unrun.
    let handle = build(2, Duration::ZERO).spawn();
    wait_for(WAIT, "the queue drained", || async {
        queue_len(&client, &q).await == 0
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.stats.dead_lettered, 0);
    assert_eq!(queue_len(&client, &dlq).await, 0);
    assert!(runs.lock().unwrap().iter().all(|&n| n == 1), "{runs:?}");
}

/// A worker whose handler never returns on `{"hang": true}` (and tells
/// `started`), and deletes anything else.
fn hanging_worker(
    client: &pgmq_client::Client,
    q: &pgmq_client::QueueName,
    concurrency: usize,
    started: &Arc<Notify>,
) -> pgmq_worker::WorkerBuilder<Value> {
    let started = Arc::clone(started);
    Worker::builder(client.clone(), q.clone())
        .concurrency(concurrency)
        .visibility_timeout(Duration::from_secs(4))
        .poll_interval(Duration::from_millis(20))
        .shutdown_grace(Duration::from_secs(30))
        .handler(move |m: Message<Value>| {
            let started = Arc::clone(&started);
            async move {
                if m.body.get("hang").is_some() {
                    started.notify_one();
                    std::future::pending::<()>().await;
                }
                Ok(Outcome::Delete)
            }
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_immediate_shutdown_cuts_a_graceful_one_short() {
    let client = client().await;
    let q = unique("escalate");
    let _g = Queues::new(&client, &[&q]).await;
    let hang = client.send(&q, &json!({"hang": true})).await.unwrap();
    client.send_batch(&q, &bodies(10)).await.unwrap();
    let started = Arc::new(Notify::new());
    // Acknowledgements wait for a batch of 1000 or 30 s: only the drain at
    // shutdown writes them.
    let worker = hanging_worker(&client, &q, 2, &started)
        .ack_batch_size(1000)
        .ack_flush_interval(Duration::from_secs(30))
        .build()
        .unwrap();
    let handle = worker.spawn();
    started.notified().await;
    wait_for(WAIT, "10 handled", || async {
        handle.stats().handled == 10
    })
    .await;
    assert_eq!(handle.stats().acks_pending, 10);

    // A graceful shutdown waits for the hanging handler (grace 30 s) ...
    let stop = handle.shutdown_handle();
    let stopping = tokio::spawn(handle.shutdown());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!stopping.is_finished());
    assert!(stop.is_requested() && !stop.is_immediate());
    // ... until it is escalated.
    let escalated = Instant::now();
    stop.immediate();
    let report = stopping.await.unwrap().unwrap();
    let took = escalated.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "returned {took:?} after the escalation"
    );
    assert!(report.immediate);
    assert_eq!(report.abandoned, [hang]);
    assert_eq!(report.still_running_at_deadline, 1);
    // Finished handlers' acknowledgements were still written.
    assert_eq!(report.acked, 10);
    assert_eq!(report.acks_failed, 0);
    assert_eq!(report.stats.acks_pending, 0);

    // The abandoned message is still invisible, and comes back after its
    // visibility timeout (4 s, extended by the heartbeat while it ran).
    let m = client.metrics(&q).await.unwrap();
    assert_eq!((m.queue_length, m.queue_visible_length), (1, 0));
    let shut = Instant::now();
    let back = loop {
        let got = client
            .read_raw(&q, Duration::from_secs(60), 1)
            .await
            .unwrap();
        if let Some(m) = got.into_iter().next() {
            break m;
        }
        assert!(
            shut.elapsed() < Duration::from_secs(10),
            "the abandoned message never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((back.msg_id, back.read_ct), (hang, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_now_still_gives_back_unstarted_claims() {
    let client = client().await;
    let q = unique("now");
    let _g = Queues::new(&client, &[&q]).await;
    // A quick warm-up message first: until a handler has finished, the
    // worker claims only as many messages as it has handlers (claimer.rs).
    client.send(&q, &json!({"warm_up": true})).await.unwrap();
    let started = Arc::new(Notify::new());
    let handle = hanging_worker(&client, &q, 1, &started)
        .build()
        .unwrap()
        .spawn();
    wait_for(WAIT, "the warm-up", || async {
        handle.stats().deleted == 1
    })
    .await;
    let hang = client.send(&q, &json!({"hang": true})).await.unwrap();
    client.send_batch(&q, &bodies(5)).await.unwrap();
    started.notified().await;
    wait_for(WAIT, "all claimed", || async {
        handle.stats().claimed == 7
    })
    .await;

    let t = Instant::now();
    let report = handle.shutdown_now().await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(report.immediate);
    assert_eq!(report.abandoned, [hang]);
    assert_eq!(report.released, 5);
    assert_eq!(report.release_failed, 0);
    // The five are visible again, their read undone; the abandoned one is not.
    let conn = client.connection().await.unwrap();
    let rows = conn
        .query(
            &format!(
                "SELECT msg_id, read_ct, vt <= clock_timestamp() FROM {} ORDER BY msg_id",
                q.table()
            ),
            &[],
        )
        .await
        .unwrap();
    let rows: Vec<(i64, i32, bool)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(rows.len(), 6);
    assert_eq!(rows[0], (hang, 1, false));
    assert!(
        rows[1..].iter().all(|r| (r.1, r.2) == (0, true)),
        "{rows:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_immediate_shutdown_bounds_a_stuck_acknowledgement_drain() {
    let client = client().await;
    let q = unique("nowstuck");
    let _g = Queues::new(&client, &[&q]).await;
    let id = client.send(&q, &json!({"n": 0})).await.unwrap();
    let (started, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (s, g) = (Arc::clone(&started), Arc::clone(&go));
    let handle = Worker::<Value>::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(20))
        .handler(move |_m: Message<Value>| {
            let (s, g) = (Arc::clone(&s), Arc::clone(&g));
            async move {
                s.notify_one();
                g.notified().await;
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap()
        .spawn();
    started.notified().await;
    // Another transaction locks the row: the delete waits for it.
    let lock = RowLock::take(&client, &q, id).await;
    go.notify_one();
    wait_for(WAIT, "the delete under way", || async {
        let s = handle.stats();
        s.handled == 1 && s.acks_pending == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    // ack_drain_timeout is 10 s; an immediate shutdown gives it about 1 s.
    let t = Instant::now();
    let report = handle.shutdown_now().await.unwrap();
    let took = t.elapsed();
    lock.release().await;
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert!(report.immediate);
    assert!(report.abandoned.is_empty());
    assert_eq!(report.acked, 0);
    assert_eq!(report.acks_failed, 1);
}

/// A graceful shutdown while the writer retries a failed write: handler
/// loops whose acknowledgements wait for room in the full ack channel are
/// cut off at the grace deadline, and their finished acknowledgements are
/// counted in `acks_failed` (they are not running, so not `abandoned`): the
/// report agrees with what the database still holds.
///
/// The writer fails for real: another transaction locks every row, so the
/// delete waits, and the test terminates the writer's backend while it
/// waits (its delete is rolled back: no write of unknown outcome lands
/// later), until the grace period is over; then the lock goes and the
/// writer gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledgements_cut_off_at_the_grace_deadline_are_reported() {
    let client = client().await;
    let q = unique("ackcut");
    let _g = Queues::new(&client, &[&q]).await;
    client.send_batch(&q, &bodies(4)).await.unwrap();
    let started = Arc::new(AtomicU64::new(0));
    let go = Arc::new(Notify::new());
    let (s, g) = (Arc::clone(&started), Arc::clone(&go));
    let handle = Worker::<Value>::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(20))
        .concurrency(4)
        .ack_capacity(1)
        .ack_batch_size(1)
        .ack_flushers(1)
        .ack_retry_timeout(Duration::from_secs(60))
        .shutdown_grace(Duration::from_secs(1))
        .ack_drain_timeout(Duration::from_secs(15))
        .handler(move |_m: Message<Value>| {
            let (s, g) = (Arc::clone(&s), Arc::clone(&g));
            async move {
                let notified = g.notified();
                s.fetch_add(1, Ordering::SeqCst);
                notified.await;
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap()
        .spawn();
    wait_for(WAIT, "4 handlers started", || async {
        started.load(Ordering::SeqCst) == 4
    })
    .await;
    let lock = client.connection_owned().await.unwrap();
    lock.batch_execute(&format!(
        "BEGIN; SELECT 1 FROM {} FOR UPDATE",
        q.quoted_table()
    ))
    .await
    .unwrap();
    let failing = tokio_util::sync::CancellationToken::new();
    let terminator = tokio::spawn({
        let (client, q, failing) = (client.clone(), q.clone(), failing.clone());
        async move {
            let conn = client.connection_owned().await.unwrap();
            let pattern = format!("%DELETE FROM {}%", q.quoted_table());
            while !failing.is_cancelled() {
                conn.execute(
                    "SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity \
                     WHERE wait_event_type = 'Lock' AND query LIKE $1",
                    &[&pattern],
                )
                .await
                .unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    go.notify_waiters();
    wait_for(WAIT, "4 handled", || async { handle.stats().handled == 4 }).await;
    wait_for(WAIT, "the writer retrying", || async {
        handle.stats().ack_retries > 0
    })
    .await;
    let shutdown = tokio::spawn(handle.shutdown());
    // Past the grace deadline the writer gets through.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    failing.cancel();
    terminator.await.unwrap();
    lock.batch_execute("ROLLBACK").await.unwrap();
    let report = shutdown.await.unwrap().unwrap();
    let left = queue_len(&client, &q).await as u64;
    let seen = format!(
        "left {left}, acked {}, acks_failed {}, abandoned {:?}",
        report.acked, report.acks_failed, report.abandoned
    );
    assert!(report.abandoned.is_empty(), "{seen}");
    assert_eq!(report.acked + left, 4, "{seen}");
    assert_eq!(
        report.acks_failed, left,
        "messages left in the queue that the report does not count: {seen}"
    );
    assert_eq!(report.stats.acks_pending, 0);
}
