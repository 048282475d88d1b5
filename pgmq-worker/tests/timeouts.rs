//! No silent stalls, and no attempts used for nothing: handler timeouts,
//! snoozes, hung blocking handlers at immediate shutdown, a blackholed
//! database connection, and the settings that cannot work refused early.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{archive_len, client, dsn, queue_len, unique, wait_for, Queues};
use pgmq_client::{Client, Message};
use pgmq_testkit::proxy::Proxy;
use pgmq_worker::{Backoff, Context, Outcome, WakeUp, Worker};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_handler_times_out_is_retried_then_dead_lettered_and_the_others_flow() {
    let client = client().await;
    let q = unique("hung");
    let dlq = unique("hung_dlq");
    let _g = Queues::new(&client, &[&q, &dlq]).await;
    let msgs: Vec<Value> = (0..10).map(|n| json!({ "n": n })).collect();
    client.send_batch(&q, &msgs).await.unwrap();
    let attempts_seen = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&attempts_seen);
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(4)
        .poll_interval(Duration::from_millis(50))
        .handler_timeout(Duration::from_millis(300))
        .max_attempts(2)
        .retry_backoff(Backoff::constant(Duration::ZERO))
        .retry_jitter(false)
        .dead_letter_queue(dlq.clone())
        .handler_with_context(move |m: Message<Value>, ctx: Context| {
            let hangs = m.body["n"] == 3;
            if hangs {
                seen.lock().unwrap().push(ctx.attempt());
            }
            async move {
                if hangs {
                    std::future::pending::<()>().await;
                }
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "nine deleted and one dead-lettered", || async {
        let s = handle.stats();
        s.deleted == 9 && s.dead_lettered == 1
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.stats.timed_out, 2);
    assert_eq!(*attempts_seen.lock().unwrap(), vec![1, 2]);
    assert_eq!(queue_len(&client, &q).await, 0);
    let dead = client
        .read::<Value>(&dlq, Duration::from_secs(30), 5)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    let h = dead[0].as_ref().unwrap().headers.clone().unwrap();
    let reason = h["reason"].as_str().unwrap();
    assert!(reason.contains("timed out"), "{reason}");
    assert_eq!(h["attempts"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snoozes_use_neither_an_attempt_nor_a_delivery() {
    let client = client().await;
    let q = unique("snooze");
    let _g = Queues::new(&client, &[&q]).await;
    client.send(&q, &json!({"n": 1})).await.unwrap();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let r = Arc::clone(&runs);
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(20))
        .max_attempts(1)
        .max_deliveries(1)
        .handler_with_context(move |_m: Message<Value>, ctx: Context| {
            let mut runs = r.lock().unwrap();
            runs.push((ctx.attempt(), ctx.deliveries()));
            let outcome = if runs.len() < 4 {
                Outcome::Snooze(Duration::from_millis(50))
            } else {
                Outcome::Delete
            };
            async move { Ok(outcome) }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "deleted", || async { handle.stats().deleted == 1 }).await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(*runs.lock().unwrap(), vec![(1, 1); 4]);
    assert_eq!(report.stats.snoozed, 3);
    assert_eq!(report.stats.dead_lettered, 0);
}

/// A blocking handler that never returns: the immediate shutdown returns
/// within about a second, and the test's runtime (dropped when the test
/// returns) does not wait for the hung thread either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_immediate_shutdown_returns_with_a_hung_blocking_handler() {
    let client = client().await;
    let q = unique("hungblk");
    let _g = Queues::new(&client, &[&q]).await;
    client.send(&q, &json!({"n": 1})).await.unwrap();
    let started = Arc::new(AtomicBool::new(false));
    let s = Arc::clone(&started);
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(20))
        .handler_timeout(None)
        .blocking_handler(move |_m: Message<Value>| {
            s.store(true, Ordering::SeqCst);
            loop {
                std::thread::sleep(Duration::from_millis(50));
            }
            #[allow(unreachable_code)]
            Ok(Outcome::Delete)
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "the handler started", || async {
        started.load(Ordering::SeqCst)
    })
    .await;
    let t = Instant::now();
    let report = handle.shutdown_now().await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(report.abandoned.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_on_a_client_from_a_callers_pool_fails_at_start() {
    let client = client().await;
    let q = unique("frompool");
    let _g = Queues::new(&client, &[&q]).await;
    let from_pool = Client::from_pool(client.pool().clone()).await.unwrap();
    let worker: Worker<Value> = Worker::builder(from_pool, q.clone())
        .wake_up(WakeUp::Notify)
        .handler(|_m: Message<Value>| async { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let err = worker
        .run_until(std::future::ready(()))
        .await
        .expect_err("no DSN to LISTEN with");
    assert!(err.to_string().contains("Listener::connect"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_queue_equal_to_the_queue_is_refused() {
    let client = client().await;
    let q = unique("selfdlq");
    let err = Worker::<Value>::builder(client, q.clone())
        .dead_letter_queue(q)
        .handler(|_m: Message<Value>| async { Ok(Outcome::Delete) })
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("dead-letter queue"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_queue_dropped_while_running_archives_with_the_reason() {
    let client = client().await;
    let q = unique("dropdlq");
    let dlq = unique("dropdlq_dlq");
    let _g = Queues::new(&client, &[&q, &dlq]).await;
    let calls = Arc::new(AtomicU64::new(0));
    let c = Arc::clone(&calls);
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(20))
        .dead_letter_queue(dlq.clone())
        .handler(move |_m: Message<Value>| {
            c.fetch_add(1, Ordering::SeqCst);
            async { Ok(Outcome::DeadLetter("no good".into())) }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "started", || async { handle.stats().reads > 0 }).await;
    client.drop_queue(&dlq).await.unwrap();
    client.send(&q, &json!({"n": 1})).await.unwrap();
    wait_for(WAIT, "archived", || async {
        handle.stats().dead_lettered == 1
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "ran once, not in a loop");
    assert_eq!(report.acks_failed, 0);
    assert_eq!(queue_len(&client, &q).await, 0);
    assert_eq!(archive_len(&client, &q).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_connection_is_noticed_and_the_worker_resumes() {
    let direct = client().await;
    let q = unique("blackhole");
    let _g = Queues::new(&direct, &[&q]).await;
    let cfg: tokio_postgres::Config = dsn().parse().unwrap();
    let host = "127.0.0.1";
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    // pgmq-testkit's proxy, blackholed below: it stops forwarding in both
    // directions without closing anything, as a network partition or a
    // paused host looks to the client (a half-open connection, no reset).
    let hole = Proxy::start(
        "127.0.0.1:0".parse().unwrap(),
        format!("{host}:{port}").parse().unwrap(),
    )
    .await
    .unwrap();
    let via = dsn().replace(&format!(":{port}/"), &format!(":{}/", hole.addr().port()));
    assert_ne!(via, dsn(), "the test DSN names its port");
    let client = Client::builder(&via)
        .connect_timeout(Duration::from_secs(1))
        .pool_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let msgs: Vec<Value> = (0..20).map(|n| json!({ "n": n })).collect();
    // Reads abandoned in the blackhole reach the server once it lifts and
    // claim messages nobody will handle: those come back when their
    // visibility timeout ends, kept short here.
    let worker: Worker<Value> = Worker::builder(client, q.clone())
        .poll_interval(Duration::from_millis(50))
        .visibility_timeout(Duration::from_secs(3))
        .db_timeout(Duration::from_secs(1))
        .handler(|_m: Message<Value>| async { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let handle = worker.spawn();
    direct.send_batch(&q, &msgs).await.unwrap();
    wait_for(WAIT, "the first 20", || async {
        handle.stats().deleted == 20
    })
    .await;
    assert!(handle.health().is_healthy(), "{:?}", handle.health());

    hole.set_blackhole(true);
    let frozen_at = Instant::now();
    direct.send_batch(&q, &msgs).await.unwrap();
    wait_for(WAIT, "the blackhole noticed", || async {
        !handle.health().claiming
    })
    .await;
    let noticed = frozen_at.elapsed();
    // Three bounded reads (1 s each) and their backoff: well under 30 s.
    assert!(noticed < Duration::from_secs(15), "{noticed:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    hole.set_blackhole(false);
    let resumed_at = Instant::now();
    wait_for(WAIT, "every message handled", || async {
        handle.stats().deleted >= 40
    })
    .await;
    let resumed = resumed_at.elapsed();
    println!("blackhole noticed after {noticed:?}, all handled {resumed:?} after it lifted");
    assert!(resumed < Duration::from_secs(15), "{resumed:?}");
    wait_for(WAIT, "healthy again", || async {
        handle.health().is_healthy()
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(queue_len(&direct, &q).await, 0);
    assert_eq!(report.stats.deleted, 40);
}

/// A worker on `q` through a proxy that blackholes itself in the handler of
/// the message `{"cut": true}`, after 20 warm-up messages were deleted (so
/// the pool holds idle connections: the cut delete is sent on one, rather
/// than waiting for a connection the blackhole would never open, and gets
/// no answer within `db_timeout`). The heartbeat is off, so only the
/// completer judges the delete. Returns the proxy, the worker and the cut
/// message's id.
async fn cut_after_handler(
    direct: &Client,
    q: &pgmq_client::QueueName,
    vt: Duration,
) -> (Arc<Proxy>, pgmq_worker::WorkerHandle, i64) {
    let cfg: tokio_postgres::Config = dsn().parse().unwrap();
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let hole = Arc::new(
        Proxy::start(
            "127.0.0.1:0".parse().unwrap(),
            format!("127.0.0.1:{port}").parse().unwrap(),
        )
        .await
        .unwrap(),
    );
    let via = dsn().replace(&format!(":{port}/"), &format!(":{}/", hole.addr().port()));
    assert_ne!(via, dsn(), "the test DSN names its port");
    let client = Client::builder(&via)
        .connect_timeout(Duration::from_secs(1))
        .pool_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let h = Arc::clone(&hole);
    let worker: Worker<Value> = Worker::builder(client, q.clone())
        .concurrency(1)
        .poll_interval(Duration::from_millis(50))
        .visibility_timeout(vt)
        .db_timeout(Duration::from_secs(1))
        .heartbeat(false)
        .ack_retry_timeout(Duration::from_secs(60))
        .handler(move |m: Message<Value>| {
            if m.body["cut"] == true {
                h.set_blackhole(true);
            }
            async { Ok(Outcome::Delete) }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    let warm: Vec<Value> = (0..20).map(|n| json!({ "n": n })).collect();
    direct.send_batch(q, &warm).await.unwrap();
    wait_for(WAIT, "the first 20", || async {
        handle.stats().deleted == 20
    })
    .await;
    let cut = direct.send(q, &json!({ "cut": true })).await.unwrap();
    wait_for(WAIT, "the delete tried without an answer", || async {
        handle.stats().ack_retries >= 1
    })
    .await;
    (hole, handle, cut)
}

/// A delete with no answer (so it may or may not have landed) while the
/// claim expires and another consumer takes the message: once the database
/// is back the retried delete matches nothing, and the worker counts the
/// claim lost rather than the message acknowledged (the row is still
/// there, so no earlier try removed it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_lost_while_a_delete_had_no_answer_is_counted_lost() {
    let direct = client().await;
    let q = unique("unanswered");
    let _g = Queues::new(&direct, &[&q]).await;
    let (hole, handle, cut) = cut_after_handler(&direct, &q, Duration::from_secs(2)).await;
    // The claim (2 s) expires under the waiting delete; another consumer
    // takes the message and holds it.
    let start = Instant::now();
    loop {
        let got = direct
            .read::<Value>(&q, Duration::from_secs(120), 1)
            .await
            .unwrap();
        if let Some(m) = got.first() {
            assert_eq!(m.as_ref().unwrap().msg_id, cut);
            break;
        }
        assert!(start.elapsed() < WAIT, "the claim never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // What the blackhole held (the first delete) is delivered now: fenced,
    // it matches nothing either.
    hole.set_blackhole(false);
    wait_for(WAIT, "the lost claim counted", || async {
        handle.stats().claims_lost == 1
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.claims_lost, 1);
    assert_eq!(report.acks_failed, 0);
    assert_eq!(
        report.stats.deleted, 20,
        "the cut message was not deleted here"
    );
    assert_eq!(
        queue_len(&direct, &q).await,
        1,
        "the other consumer holds it"
    );
}

/// The other way round: the delete with no answer lands (the blackhole
/// delivers it when it lifts, within the claim), and the retry matches
/// nothing because of it. The message is counted deleted, not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_that_landed_without_an_answer_is_counted_deleted() {
    let direct = client().await;
    let q = unique("landed");
    let _g = Queues::new(&direct, &[&q]).await;
    let (hole, handle, _cut) = cut_after_handler(&direct, &q, Duration::from_secs(30)).await;
    hole.set_blackhole(false);
    wait_for(WAIT, "the cut message counted deleted", || async {
        handle.stats().deleted == 21
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.claims_lost, 0);
    assert_eq!(report.acks_failed, 0);
    assert_eq!(queue_len(&direct, &q).await, 0);
}

/// A blocking handler that hangs on every message, past `handler_timeout`:
/// the threads left running are capped by `max_abandoned_blocking_threads`
/// (at most `concurrency` + that many runs at once, not one thread per
/// message), health says loops wait, and once the hangs end every message
/// is handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_blocking_threads_are_capped() {
    let client = client().await;
    let q = unique("blkcap");
    let _g = Queues::new(&client, &[&q]).await;
    let bodies: Vec<Value> = (0..12).map(|n| json!({ "n": n })).collect();
    client.send_batch(&q, &bodies).await.unwrap();
    let hang = Arc::new(AtomicBool::new(true));
    // (running now, most at once)
    let runs = Arc::new(Mutex::new((0usize, 0usize)));
    let (h, r) = (Arc::clone(&hang), Arc::clone(&runs));
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(2)
        .poll_interval(Duration::from_millis(20))
        .handler_timeout(Duration::from_millis(100))
        .retry_backoff(Backoff::constant(Duration::ZERO))
        .retry_jitter(false)
        .max_attempts(100)
        .max_abandoned_blocking_threads(3)
        .blocking_handler(move |_m: Message<Value>| {
            {
                let mut r = r.lock().unwrap();
                r.0 += 1;
                r.1 = r.1.max(r.0);
            }
            while h.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(10));
            }
            r.lock().unwrap().0 -= 1;
            Ok(Outcome::Delete)
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "both loops waiting at the cap", || async {
        handle.health().blocking_runs_waiting == 2
    })
    .await;
    // Time for more runs to start, were they not capped.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let most = runs.lock().unwrap().1;
    assert!(most <= 2 + 3, "{most} blocking runs at once");
    hang.store(false, Ordering::SeqCst);
    wait_for(WAIT, "all handled", || async {
        handle.stats().deleted == 12
    })
    .await;
    assert_eq!(handle.health().blocking_runs_waiting, 0);
    handle.shutdown().await.unwrap();
}

/// The attempts header of each message of `q` (0 without one), by
/// `msg_id`, read from the queue table.
async fn attempts_written(client: &Client, q: &pgmq_client::QueueName) -> Vec<i64> {
    let conn = client.connection().await.unwrap();
    let sql = format!(
        "SELECT coalesce((headers->>'{}')::bigint, 0) FROM {} ORDER BY msg_id",
        pgmq_worker::ATTEMPTS_HEADER,
        q.table()
    );
    let rows = conn.query(&sql, &[]).await.unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// A blocking run abandoned at `handler_timeout` while the cap of
/// abandoned threads is already reached: its retry is written (the
/// attempt counted, the message back in the queue) before the loop waits
/// for a hung thread to end, rather than the message being held, and
/// extended by the heartbeat, for as long as the hung threads live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_abandoned_at_the_cap_is_retried_before_the_loop_waits() {
    let client = client().await;
    let q = unique("blkcapretry");
    let _g = Queues::new(&client, &[&q]).await;
    let bodies: Vec<Value> = (0..2).map(|n| json!({ "n": n })).collect();
    client.send_batch(&q, &bodies).await.unwrap();
    let hang = Arc::new(AtomicBool::new(true));
    let h = Arc::clone(&hang);
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(1)
        .poll_interval(Duration::from_millis(20))
        .visibility_timeout(Duration::from_secs(2))
        .handler_timeout(Duration::from_millis(200))
        .retry_backoff(Backoff::constant(Duration::ZERO))
        .retry_jitter(false)
        .max_attempts(100)
        .max_abandoned_blocking_threads(1)
        .blocking_handler(move |_m: Message<Value>| {
            while h.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(Outcome::Delete)
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    // The first hang takes the cap's one thread; the second run's loop
    // waits for it. Both runs are retries written by then, while they hang
    // (longer than several visibility timeouts).
    wait_for(WAIT, "the loop waiting at the cap", || async {
        handle.health().blocking_runs_waiting == 1
    })
    .await;
    wait_for(
        Duration::from_secs(10),
        "both abandoned runs retried while the hangs last",
        || async { attempts_written(&client, &q).await.iter().all(|&a| a >= 1) },
    )
    .await;
    assert_eq!(handle.health().blocking_runs_waiting, 1);
    hang.store(false, Ordering::SeqCst);
    wait_for(WAIT, "both handled", || async {
        handle.stats().deleted == 2
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.stats.dead_lettered, 0);
    assert_eq!(queue_len(&client, &q).await, 0);
}

/// Backends of `app` waiting on a lock now.
async fn waiting_on_a_lock(client: &Client, app: &str) -> i64 {
    let conn = client.connection().await.unwrap();
    conn.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
        &[&app],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_abandoned_at_db_timeout_stop_on_the_server_too() {
    // A backlog, then another session holds ACCESS EXCLUSIVE on the queue
    // table for 20 s while the worker runs with db_timeout 1 s: its claim
    // reads time out again and again. Each abandoned read must end on the
    // server too, so the backends of the worker waiting on the lock never
    // outnumber its pool; once the lock goes, every message is handled.
    let setup = client().await;
    let q = unique("lockwait");
    let _g = Queues::new(&setup, &[&q]).await;
    let msgs: Vec<Value> = (0..50).map(|n| json!({ "n": n })).collect();
    setup.send_batch(&q, &msgs).await.unwrap();
    let app = format!("lockwait_{}", std::process::id());
    let pool_size = 5;
    let wclient = Client::builder(&dsn())
        .max_size(pool_size)
        .application_name(&app)
        .connect()
        .await
        .unwrap();
    let locker = setup.connection_owned().await.unwrap();
    locker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
            q.quoted_table()
        ))
        .await
        .unwrap();
    let worker: Worker<Value> = Worker::builder(wclient, q.clone())
        .db_timeout(Duration::from_secs(1))
        .poll_interval(Duration::from_millis(50))
        .handler(|_m: Message<Value>| async { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let handle = worker.spawn();
    let mut most = 0;
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        most = most.max(waiting_on_a_lock(&setup, &app).await);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    locker.batch_execute("ROLLBACK").await.unwrap();
    wait_for(WAIT, "every message handled", || async {
        handle.stats().deleted == 50
    })
    .await;
    handle.shutdown().await.unwrap();
    assert!(
        most <= i64::from(pool_size),
        "{most} backends of the worker waited on the lock, more than its pool of {pool_size}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_insert_trigger_ddl_does_not_queue_producers_behind_a_long_transaction() {
    // A long transaction holds a lock on the queue table while a worker
    // with notifications starts: its DDL must not wait in line for ever,
    // with every producer waiting behind it. Sends keep completing; the start gives up with an error naming
    // the session that holds the lock.
    let setup = client().await;
    let q = unique("ddllock");
    let _g = Queues::new(&setup, &[&q]).await;
    // A producer's transaction left open: it holds ROW EXCLUSIVE on the
    // table, which the trigger's CREATE (SHARE ROW EXCLUSIVE) waits for.
    let holder = setup.connection_owned().await.unwrap();
    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .execute("SELECT pgmq.send($1, '{}'::jsonb)", &[&q.as_str()])
        .await
        .unwrap();
    let holder_pid: i32 = holder
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let worker: Worker<Value> = Worker::builder(client().await, q.clone())
        .wake_up(WakeUp::Notify)
        .handler(|_m: Message<Value>| async { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let start = tokio::spawn(worker.run_until(std::future::pending::<()>()));
    let producer = client().await;
    let until = Instant::now() + Duration::from_secs(8);
    let mut blocked = None;
    while Instant::now() < until && blocked.is_none() {
        let sent =
            tokio::time::timeout(Duration::from_secs(5), producer.send(&q, &json!({"n": 1}))).await;
        if !matches!(sent, Ok(Ok(_))) {
            blocked = Some(sent);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let res = tokio::time::timeout(Duration::from_secs(30), start).await;
    // The lock goes before anything is asserted: the queue's drop needs it.
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert!(
        blocked.is_none(),
        "a send waited behind the trigger's DDL: {blocked:?}"
    );
    match res.expect("the start gave up").unwrap() {
        Err(pgmq_worker::Error::Locked { holders, .. }) => {
            assert!(holders.contains(&format!("pid {holder_pid}")), "{holders}");
        }
        other => panic!("expected Error::Locked, got {other:?}"),
    }
}
