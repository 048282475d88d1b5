//! Batch handlers against the real database: batch sizes and the window,
//! per-message outcomes (one failure retried alone, a whole-batch failure
//! retrying each), and the transactional form: the batch's rows and the
//! deletes of its successes commit together, a claim lost before the lock
//! commits nothing for its message (and, with the fence off, does: the
//! test sees it), no claim is lost while the batch holds its rows, and
//! workers killed at random points leave neither a row without its delete
//! nor a delete without its row.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{dsn, queue_len, take_claim_over, unique, wait_for, Ledger, Queues};
use pgmq_client::{Client, Message, QueueName, Transaction};
use pgmq_worker::{
    Backoff, BatchContext, HandlerError, MessageResult, Outcome, TransactionalBatchHandler, Worker,
};
use rand::Rng;
use serde_json::{json, Value};

/// The `n` of a body `{"n": n}`.
fn n_of(m: &Message<Value>) -> i64 {
    m.body["n"].as_i64().unwrap()
}

async fn send_n(client: &Client, q: &QueueName, range: std::ops::Range<i64>) {
    let bodies: Vec<Value> = range.map(|n| json!({ "n": n })).collect();
    client.send_batch(q, &bodies).await.unwrap();
}

/// Read counts of the messages still queued, by id, and the rows of
/// `table`, in one statement (one snapshot).
async fn snapshot(client: &Client, q: &QueueName, table: &str) -> (i64, HashMap<i64, i32>) {
    let conn = client.connection().await.unwrap();
    let row = conn
        .query_one(
            &format!(
                "SELECT (SELECT count(*) FROM {table}), \
                 coalesce(array_agg(msg_id), '{{}}'), coalesce(array_agg(read_ct), '{{}}') \
                 FROM {}",
                q.table()
            ),
            &[],
        )
        .await
        .unwrap();
    let ids: Vec<i64> = row.get(1);
    let reads: Vec<i32> = row.get(2);
    (row.get(0), ids.into_iter().zip(reads).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_hold_at_most_max_and_the_window_gathers_late_arrivals() {
    let client = common::client().await;
    let q = unique("batch_sizes");
    let _g = Queues::new(&client, &[&q]).await;
    send_n(&client, &q, 0..250).await;
    let sizes = Arc::new(Mutex::new(Vec::<usize>::new()));
    let seen = Arc::new(Mutex::new(HashMap::<i64, u32>::new()));
    let (s2, seen2) = (Arc::clone(&sizes), Arc::clone(&seen));
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(2)
        .poll_interval(Duration::from_millis(20))
        .batch_handler(
            40,
            Duration::from_millis(50),
            move |batch: Vec<Message<Value>>| {
                let (sizes, seen) = (Arc::clone(&s2), Arc::clone(&seen2));
                async move {
                    sizes.lock().unwrap().push(batch.len());
                    let mut seen = seen.lock().unwrap();
                    for m in &batch {
                        *seen.entry(n_of(m)).or_default() += 1;
                    }
                    Ok(batch.iter().map(|_| Ok(Outcome::Delete)).collect())
                }
            },
        )
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(Duration::from_secs(60), "the queue drained", || async {
        queue_len(&client, &q).await == 0
    })
    .await;
    {
        let sizes = sizes.lock().unwrap();
        assert!(sizes.iter().all(|n| (1..=40).contains(n)), "{sizes:?}");
        assert!(sizes.contains(&40), "full batches: {sizes:?}");
        assert_eq!(sizes.iter().sum::<usize>(), 250, "{sizes:?}");
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 250);
        assert!(seen.values().all(|c| *c == 1));
        println!("batch sizes: {sizes:?}");
        drop(sizes);
    }
    sizes.lock().unwrap().clear();
    // The window: three messages sent 100 ms apart run as one batch (the
    // first waits up to 1.5 s for more).
    for n in 1000..1003 {
        send_n(&client, &q, n..n + 1).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for(Duration::from_secs(30), "the late ones handled", || async {
        seen.lock().unwrap().len() == 253
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.stats.deleted, 253);
    assert_eq!(report.stats.handled, 253);
    let late = sizes.lock().unwrap().clone();
    // With a 50 ms window the three may come as one batch or, on a slow
    // machine, as two or three: never more than what was sent, each once.
    assert_eq!(late.iter().sum::<usize>(), 3, "{late:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_waits_for_messages_sent_after_the_first() {
    let client = common::client().await;
    let q = unique("batch_window");
    let _g = Queues::new(&client, &[&q]).await;
    let sizes = Arc::new(Mutex::new(Vec::<usize>::new()));
    let s2 = Arc::clone(&sizes);
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(1)
        .visibility_timeout(Duration::from_secs(30))
        .poll_interval(Duration::from_millis(20))
        .batch_handler(
            10,
            Duration::from_millis(1500),
            move |batch: Vec<Message<Value>>| {
                let sizes = Arc::clone(&s2);
                async move {
                    sizes.lock().unwrap().push(batch.len());
                    Ok(batch.iter().map(|_| Ok(Outcome::Delete)).collect())
                }
            },
        )
        .build()
        .unwrap();
    let handle = worker.spawn();
    for n in 0..3 {
        send_n(&client, &q, n..n + 1).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for(Duration::from_secs(30), "the queue drained", || async {
        queue_len(&client, &q).await == 0
    })
    .await;
    handle.shutdown().await.unwrap();
    assert_eq!(*sizes.lock().unwrap(), vec![3], "one batch of three");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failure_in_a_batch_is_retried_alone() {
    let client = common::client().await;
    let q = unique("batch_one_fails");
    let _g = Queues::new(&client, &[&q]).await;
    send_n(&client, &q, 0..20).await;
    let runs = Arc::new(Mutex::new(HashMap::<i64, u32>::new()));
    let r2 = Arc::clone(&runs);
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(1)
        .poll_interval(Duration::from_millis(20))
        .retry_backoff(Backoff::constant(Duration::from_millis(100)))
        .retry_jitter(false)
        .batch_handler(
            20,
            Duration::from_millis(100),
            move |batch: Vec<Message<Value>>| {
                let runs = Arc::clone(&r2);
                async move {
                    let mut runs = runs.lock().unwrap();
                    let results: Vec<MessageResult> = batch
                        .iter()
                        .map(|m| {
                            let count = runs.entry(n_of(m)).or_default();
                            *count += 1;
                            if n_of(m) == 7 && *count == 1 {
                                Err("seven fails once".into())
                            } else {
                                Ok(Outcome::Delete)
                            }
                        })
                        .collect();
                    Ok(results)
                }
            },
        )
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(Duration::from_secs(30), "the queue drained", || async {
        queue_len(&client, &q).await == 0
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), 20);
    for (n, count) in runs.iter() {
        assert_eq!(*count, if *n == 7 { 2 } else { 1 }, "message {n}");
    }
    let s = &report.stats;
    assert_eq!((s.failed, s.retried, s.deleted), (1, 1, 20));
    assert_eq!((s.handled, s.succeeded), (21, 20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_batch_error_or_panic_uses_one_attempt_of_each_message() {
    let client = common::client().await;
    let q = unique("batch_all_fail");
    let dlq = unique("batch_all_fail_dlq");
    let _g = Queues::new(&client, &[&q, &dlq]).await;
    send_n(&client, &q, 0..5).await;
    let calls = Arc::new(Mutex::new(0u32));
    let c2 = Arc::clone(&calls);
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(1)
        .max_attempts(2)
        .dead_letter_queue(dlq.clone())
        .poll_interval(Duration::from_millis(20))
        .retry_backoff(Backoff::constant(Duration::from_millis(50)))
        .batch_handler(
            5,
            Duration::from_millis(300),
            move |batch: Vec<Message<Value>>| {
                let calls = Arc::clone(&c2);
                async move {
                    let call = {
                        let mut c = calls.lock().unwrap();
                        *c += 1;
                        *c
                    };
                    match call {
                        1 => Err::<Vec<MessageResult>, HandlerError>("the bulk API is down".into()),
                        _ => panic!("a bug in batch {} of {}", call, batch.len()),
                    }
                }
            },
        )
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(Duration::from_secs(30), "all dead-lettered", || async {
        queue_len(&client, &dlq).await == 5
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    let s = &report.stats;
    // Two attempts each: the error, then the panic, then the dead letter.
    assert_eq!((s.failed, s.panicked, s.retried), (10, 5, 5), "{s:?}");
    assert_eq!(s.dead_lettered, 5);
    assert_eq!(queue_len(&client, &q).await, 0);
}

/// A transactional batch handler: inserts the batch's successes into the
/// ledger table with one statement. On its first call it writes every row
/// and then fails the whole batch (all rolled back); message `fail` fails
/// alone on its first run and writes nothing. Each call's ids are recorded.
struct BulkLedger {
    table: String,
    fail: Option<i64>,
    fail_first_call: bool,
    /// Random pause (ms, up to) after writing, before the commit.
    pause_ms: u64,
    calls: Arc<Mutex<Vec<Vec<i64>>>>,
    runs: Arc<Mutex<HashMap<i64, u32>>>,
}

impl BulkLedger {
    fn new(table: &str) -> Self {
        BulkLedger {
            table: table.to_owned(),
            fail: None,
            fail_first_call: false,
            pause_ms: 0,
            calls: Arc::default(),
            runs: Arc::default(),
        }
    }
}

impl TransactionalBatchHandler<Value> for BulkLedger {
    async fn handle(
        &self,
        batch: Vec<Message<Value>>,
        tx: &Transaction<'_>,
    ) -> Result<Vec<MessageResult>, HandlerError> {
        let first_call = {
            let mut calls = self.calls.lock().unwrap();
            calls.push(batch.iter().map(|m| m.msg_id).collect());
            calls.len() == 1
        };
        if self.fail_first_call && first_call {
            let ids: Vec<i64> = batch.iter().map(|m| m.msg_id).collect();
            tx.execute(
                &format!(
                    "INSERT INTO {} (msg_id) SELECT unnest($1::bigint[])",
                    self.table
                ),
                &[&ids],
            )
            .await?;
            return Err("the whole batch fails after writing".into());
        }
        // Decide first, then write only the successes.
        let results: Vec<MessageResult> = {
            let mut runs = self.runs.lock().unwrap();
            batch
                .iter()
                .map(|m| {
                    let count = runs.entry(n_of(m)).or_default();
                    *count += 1;
                    if Some(n_of(m)) == self.fail && *count == 1 {
                        Err("fails alone, once".into())
                    } else {
                        Ok(Outcome::Delete)
                    }
                })
                .collect()
        };
        let ids: Vec<i64> = batch
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .map(|(m, _)| m.msg_id)
            .collect();
        tx.execute(
            &format!(
                "INSERT INTO {} (msg_id) SELECT unnest($1::bigint[])",
                self.table
            ),
            &[&ids],
        )
        .await?;
        if self.pause_ms > 0 {
            let pause = rand::thread_rng().gen_range(0..self.pause_ms);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        Ok(results)
    }
}

/// A client with room for `concurrency` transactions and the worker's own.
async fn tx_client(app: &str) -> Client {
    Client::builder(&dsn())
        .max_size(12)
        .application_name(app)
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_batch_commits_its_rows_with_the_deletes_of_its_successes() {
    let setup = common::client().await;
    let q = unique("txbatch");
    let _g = Queues::new(&setup, &[&q]).await;
    let ledger = Ledger::create(&setup, "txbatch", &q).await;
    send_n(&setup, &q, 0..60).await;
    let mut h = BulkLedger::new(&ledger.table);
    h.fail = Some(5);
    h.fail_first_call = true;
    let calls = Arc::clone(&h.calls);
    let worker: Worker<Value> = Worker::builder(tx_client("txbatch").await, q.clone())
        .concurrency(2)
        .poll_interval(Duration::from_millis(20))
        .retry_backoff(Backoff::constant(Duration::from_millis(100)))
        .retry_jitter(false)
        .transactional_batch_handler(25, Duration::from_millis(50), h)
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(Duration::from_secs(60), "the queue drained", || async {
        queue_len(&setup, &q).await == 0
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    let (rows, distinct) = ledger.counts_and_drop().await;
    assert_eq!((rows, distinct), (60, 60), "each row exactly once");
    let s = &report.stats;
    let first = calls.lock().unwrap()[0].len() as u64;
    // The first batch failed whole (its rows rolled back), message 5 once
    // alone; every message deleted in its batch's transaction.
    assert_eq!(s.failed, first + 1, "{s:?}");
    assert_eq!(s.retried, first + 1);
    assert_eq!(s.deleted, 60);
    assert_eq!((s.claims_lost, s.tx_unavailable), (0, 0));
    assert!(
        calls.lock().unwrap().iter().all(|c| c.len() <= 25),
        "{calls:?}"
    );
}

/// A worker with one batch loop whose batch waits `window` for more after
/// the first, running `h`.
async fn windowed(
    q: &QueueName,
    h: BulkLedger,
    window: Duration,
    fence_off: bool,
) -> Worker<Value> {
    let b = Worker::builder(tx_client("txbatch_lost").await, q.clone())
        .concurrency(1)
        .poll_interval(Duration::from_millis(20));
    #[cfg(feature = "fault-injection")]
    let b = if fence_off { b.fence_off() } else { b };
    #[cfg(not(feature = "fault-injection"))]
    assert!(
        !fence_off,
        "the fence_off hook needs feature fault-injection"
    );
    b.transactional_batch_handler(10, window, h)
        .build()
        .unwrap()
}

/// Sends one message, waits until the worker claimed it (it then waits in
/// the batch's window), takes its claim over as another consumer would,
/// then sends two more that join the batch. Returns the ledger's ids, what
/// the handler was given, the first message's id and read count, and the
/// report.
async fn lose_a_claim_in_the_window(fence_off: bool) -> (Vec<i64>, Vec<Vec<i64>>, i64, i32, u64) {
    let setup = common::client().await;
    let q = unique("txbatch_lost");
    let _g = Queues::new(&setup, &[&q]).await;
    let ledger = Ledger::create(&setup, "txlost", &q).await;
    let h = BulkLedger::new(&ledger.table);
    let calls = Arc::clone(&h.calls);
    let handle = windowed(&q, h, Duration::from_millis(1500), fence_off)
        .await
        .spawn();
    send_n(&setup, &q, 0..1).await;
    let (_, reads) = snapshot(&setup, &q, &ledger.table).await;
    let a = *reads.keys().next().unwrap();
    wait_for(
        Duration::from_secs(10),
        "the first message claimed",
        || async { snapshot(&setup, &q, &ledger.table).await.1.get(&a) == Some(&1) },
    )
    .await;
    take_claim_over(&setup, &q, a).await;
    send_n(&setup, &q, 1..3).await;
    wait_for(Duration::from_secs(30), "the batch ran", || async {
        !calls.lock().unwrap().is_empty()
    })
    .await;
    wait_for(Duration::from_secs(10), "the others deleted", || async {
        queue_len(&setup, &q).await <= 1
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    let (_, reads) = snapshot(&setup, &q, &ledger.table).await;
    let conn = setup.connection().await.unwrap();
    let mut ids: Vec<i64> = conn
        .query(&format!("SELECT msg_id FROM {}", ledger.table), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    ids.sort_unstable();
    drop(conn);
    ledger.counts_and_drop().await;
    let calls = calls.lock().unwrap().clone();
    (
        ids,
        calls,
        a,
        reads.get(&a).copied().unwrap_or(-1),
        report.claims_lost,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_lost_before_the_lock_commits_nothing_for_its_message() {
    let (rows, calls, a, read_ct, lost) = lose_a_claim_in_the_window(false).await;
    assert_eq!(calls.len(), 1, "one batch: {calls:?}");
    assert!(
        !calls[0].contains(&a),
        "the lost message was not run: {calls:?}"
    );
    assert_eq!(calls[0].len(), 2, "{calls:?}");
    assert!(!rows.contains(&a), "no row for the lost message: {rows:?}");
    assert_eq!(rows.len(), 2, "{rows:?}");
    // Still queued, held by the delivery that took it over.
    assert_eq!(read_ct, 2);
    assert_eq!(lost, 1);
}

/// The same run without the fence (the `fence_off` test hook): the lost
/// message runs and its row commits, with the message deleted under the
/// delivery that took it over. The test above would fail.
#[cfg(feature = "fault-injection")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_fence_a_lost_claim_commits_its_effect() {
    let (rows, calls, a, read_ct, _) = lose_a_claim_in_the_window(true).await;
    assert!(calls[0].contains(&a), "{calls:?}");
    assert!(rows.contains(&a), "{rows:?}");
    assert_eq!(read_ct, -1, "deleted under the other delivery");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_claim_is_lost_while_a_transactional_batch_holds_its_rows() {
    // A 1 s visibility timeout, a batch that runs 2.5 s: without the locks
    // its messages would be visible again halfway through. A read made then
    // finds nothing (it skips locked rows), and the batch commits.
    let setup = common::client().await;
    let q = unique("txbatch_held");
    let _g = Queues::new(&setup, &[&q]).await;
    let ledger = Ledger::create(&setup, "txheld", &q).await;
    send_n(&setup, &q, 0..5).await;
    struct Slow(BulkLedger, Arc<tokio::sync::Notify>);
    impl TransactionalBatchHandler<Value> for Slow {
        async fn handle(
            &self,
            batch: Vec<Message<Value>>,
            tx: &Transaction<'_>,
        ) -> Result<Vec<MessageResult>, HandlerError> {
            self.1.notify_one();
            tokio::time::sleep(Duration::from_millis(2500)).await;
            self.0.handle(batch, tx).await
        }
    }
    let started = Arc::new(tokio::sync::Notify::new());
    let worker: Worker<Value> = Worker::builder(tx_client("txbatch_held").await, q.clone())
        .concurrency(1)
        .visibility_timeout(Duration::from_secs(1))
        .poll_interval(Duration::from_millis(20))
        .transactional_batch_handler(
            5,
            Duration::from_millis(200),
            Slow(BulkLedger::new(&ledger.table), Arc::clone(&started)),
        )
        .build()
        .unwrap();
    let handle = worker.spawn();
    started.notified().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Past their visibility timeout, yet delivered once: neither this
    // worker's own claim loops nor another consumer took them again.
    let (_, reads) = snapshot(&setup, &q, &ledger.table).await;
    assert!(
        reads.values().all(|ct| *ct == 1),
        "delivered again: {reads:?}"
    );
    let stolen = setup
        .read_raw(&q, Duration::from_secs(30), 10)
        .await
        .unwrap();
    let ids: Vec<i64> = stolen.iter().map(|m| m.msg_id).collect();
    assert!(ids.is_empty(), "a read took a locked message: {ids:?}");
    wait_for(Duration::from_secs(30), "the batch committed", || async {
        queue_len(&setup, &q).await == 0
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(ledger.counts_and_drop().await, (5, 5));
    assert_eq!(report.claims_lost, 0);
    assert_eq!(report.stats.deleted, 5);
}

#[test]
fn every_row_exists_exactly_once_with_batch_workers_killed_at_random_points() {
    const MESSAGES: i64 = 300;
    const MAX_KILLS: usize = 12;
    let main = tokio::runtime::Runtime::new().unwrap();
    let (client, q, table) = main.block_on(async {
        let client = Client::connect(&dsn()).await.unwrap();
        let q = unique("txbatch_kill");
        client.create(&q).await.unwrap();
        let table = format!("public.rows_{}", q.as_str());
        let conn = client.connection().await.unwrap();
        conn.batch_execute(&format!("CREATE TABLE {table} (msg_id bigint NOT NULL)"))
            .await
            .unwrap();
        drop(conn);
        send_n(&client, &q, 0..MESSAGES).await;
        (client, q, table)
    });
    let killed_app = format!("killed_{}", q.as_str());
    let worker = |app: String| {
        let (q, table) = (q.clone(), table.clone());
        async move {
            let mut h = BulkLedger::new(&table);
            // Up to 60 ms between the batch's insert and its commit: kills
            // land there too.
            h.pause_ms = 60;
            Worker::<Value>::builder(tx_client(&app).await, q)
                .concurrency(2)
                .visibility_timeout(Duration::from_secs(1))
                .poll_interval(Duration::from_millis(20))
                .transactional_batch_handler(8, Duration::from_millis(5), h)
                .build()
                .unwrap()
        }
    };
    let mut kills = 0;
    let mut interrupting = 0;
    let (_, mut before) = main.block_on(snapshot(&client, &q, &table));
    while kills < MAX_KILLS && !before.is_empty() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let w = worker(killed_app.clone());
        rt.spawn(async move {
            let _ = w.await.run_until(std::future::pending::<()>()).await;
        });
        // Kill while the worker holds claimed work.
        main.block_on(wait_for(Duration::from_secs(30), "a claim", || async {
            let (_, now) = snapshot(&client, &q, &table).await;
            now.iter()
                .any(|(id, ct)| before.get(id).is_some_and(|b| ct > b))
        }));
        std::thread::sleep(Duration::from_millis(rand::thread_rng().gen_range(0..150)));
        rt.shutdown_background();
        kills += 1;
        main.block_on(wait_for(
            Duration::from_secs(30),
            "the killed worker's sessions ended",
            || async {
                let conn = client.connection().await.unwrap();
                let n: i64 = conn
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                        &[&killed_app],
                    )
                    .await
                    .unwrap()
                    .get(0);
                n == 0
            },
        ));
        let (rows, after) = main.block_on(snapshot(&client, &q, &table));
        assert_eq!(
            rows + after.len() as i64,
            MESSAGES,
            "after kill {kills}: a row without its delete, or a delete without its row"
        );
        if after
            .iter()
            .any(|(id, ct)| before.get(id).is_some_and(|b| ct > b))
        {
            interrupting += 1;
        }
        before = after;
    }
    assert!(
        interrupting >= 1,
        "no kill of {kills} interrupted claimed work"
    );
    main.block_on(async {
        let handle = worker(format!("drain_{}", q.as_str())).await.spawn();
        wait_for(Duration::from_secs(90), "the queue drained", || async {
            queue_len(&client, &q).await == 0
        })
        .await;
        handle.shutdown().await.unwrap();
        let conn = client.connection().await.unwrap();
        let row = conn
            .query_one(
                &format!("SELECT count(*), count(DISTINCT msg_id) FROM {table}"),
                &[],
            )
            .await
            .unwrap();
        let (rows, distinct): (i64, i64) = (row.get(0), row.get(1));
        println!("{kills} kills, {interrupting} interrupting claimed work; {rows} rows, {distinct} distinct");
        assert_eq!((rows, distinct), (MESSAGES, MESSAGES), "each row exactly once");
        conn.batch_execute(&format!("DROP TABLE {table}"))
            .await
            .unwrap();
        drop(conn);
        client.drop_queue(&q).await.unwrap();
    });
}

#[tokio::test]
async fn build_checks_the_batch_settings_and_the_pool() {
    let client = common::client().await;
    let q = unique("batch_build");
    let plain = |max: usize, window: Duration| {
        Worker::<Value>::builder(client.clone(), q.clone())
            .batch_handler(max, window, |b: Vec<Message<Value>>| async move {
                Ok(b.iter().map(|_| Ok(Outcome::Delete)).collect())
            })
            .build()
    };
    assert!(plain(100, Duration::from_millis(10)).is_ok());
    for (max, window) in [
        (0, Duration::ZERO),
        // Above claim_capacity (300 by default).
        (301, Duration::ZERO),
        // A quarter of the 30 s visibility timeout.
        (10, Duration::from_millis(7500)),
    ] {
        match plain(max, window) {
            Err(pgmq_worker::Error::Config(why)) => assert!(why.contains("batch"), "{why}"),
            other => panic!("max {max}, window {window:?}: {other:?}"),
        }
    }
    // The transactional form holds a connection per running batch.
    let tx = Worker::<Value>::builder(client.clone(), q.clone())
        .transactional_batch_handler(10, Duration::ZERO, BulkLedger::new("unused"))
        .build();
    assert!(matches!(
        tx,
        Err(pgmq_worker::Error::PoolTooSmall { needed: 12, .. })
    ));
}

/// Refuses one message on its first attempt; counts every `after`.
struct RefuseOnce {
    id: i64,
    afters: Arc<Mutex<Vec<(i64, bool)>>>,
}

impl pgmq_worker::Hook for RefuseOnce {
    fn before(
        &self,
        ctx: &pgmq_worker::Context,
        _headers: Option<&Value>,
    ) -> Result<(), HandlerError> {
        if ctx.msg_id() == self.id && ctx.attempt() == 1 {
            return Err("refused by the hook".into());
        }
        Ok(())
    }

    fn after(&self, ctx: &pgmq_worker::Context, result: &Result<Outcome, String>, _: Duration) {
        self.afters
            .lock()
            .unwrap()
            .push((ctx.msg_id(), result.is_ok()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_that_refuses_one_message_keeps_it_out_of_the_batch() {
    let client = common::client().await;
    let q = unique("batch_hook");
    let _g = Queues::new(&client, &[&q]).await;
    let bodies: Vec<Value> = (0..5).map(|n| json!({ "n": n })).collect();
    let ids = client.send_batch(&q, &bodies).await.unwrap();
    let refused = ids[2];
    let afters = Arc::new(Mutex::new(Vec::new()));
    let calls = Arc::new(Mutex::new(Vec::<Vec<i64>>::new()));
    let c2 = Arc::clone(&calls);
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(1)
        .poll_interval(Duration::from_millis(20))
        .retry_backoff(Backoff::constant(Duration::from_millis(50)))
        .hook(RefuseOnce {
            id: refused,
            afters: Arc::clone(&afters),
        })
        .batch_handler(
            5,
            Duration::from_millis(200),
            move |batch: Vec<Message<Value>>| {
                let calls = Arc::clone(&c2);
                async move {
                    calls
                        .lock()
                        .unwrap()
                        .push(batch.iter().map(|m| m.msg_id).collect());
                    Ok(batch.iter().map(|_| Ok(Outcome::Delete)).collect())
                }
            },
        )
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(Duration::from_secs(30), "the queue drained", || async {
        queue_len(&client, &q).await == 0
    })
    .await;
    let report = handle.shutdown().await.unwrap();
    let calls = calls.lock().unwrap().clone();
    assert!(!calls[0].contains(&refused), "{calls:?}");
    let ran: Vec<i64> = calls.concat();
    assert_eq!(ran.len(), 5, "each message ran once: {calls:?}");
    let afters = afters.lock().unwrap().clone();
    assert_eq!(
        afters.len(),
        6,
        "an after per run and per refusal: {afters:?}"
    );
    assert!(afters.contains(&(refused, false)));
    assert_eq!((report.stats.failed, report.stats.deleted), (1, 5));
}

/// A batch handler with a context sees each message's attempt (2 on the
/// retry of the one that failed, 1 for the others), a deadline under
/// `handler_timeout`, and its cancellation when the batch outlives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_context_gives_attempts_deadline_and_cancellation() {
    let client = common::client().await;
    let q = unique("batch_ctx");
    let _g = Queues::new(&client, &[&q]).await;
    send_n(&client, &q, 0..10).await;
    // (n, attempt, deliveries, had a deadline) per run of a message.
    let seen = Arc::new(Mutex::new(Vec::<(i64, u32, u32, bool)>::new()));
    let cancelled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (s2, c2) = (Arc::clone(&seen), Arc::clone(&cancelled));
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .concurrency(1)
        .poll_interval(Duration::from_millis(20))
        .retry_backoff(Backoff::constant(Duration::from_millis(100)))
        .retry_jitter(false)
        .handler_timeout(Duration::from_millis(500))
        .batch_handler_with_context(
            10,
            Duration::from_millis(100),
            move |batch: Vec<Message<Value>>, ctx: BatchContext| {
                let (seen, cancelled) = (Arc::clone(&s2), Arc::clone(&c2));
                async move {
                    assert_eq!(ctx.len(), batch.len());
                    let mut first_of_nine = false;
                    let results: Vec<MessageResult> = {
                        let mut seen = seen.lock().unwrap();
                        batch
                            .iter()
                            .enumerate()
                            .map(|(i, m)| {
                                let (attempt, deliveries) =
                                    (ctx.attempt(i).unwrap(), ctx.deliveries(i).unwrap());
                                seen.push((n_of(m), attempt, deliveries, ctx.deadline().is_some()));
                                first_of_nine |= n_of(m) == 9 && attempt == 1;
                                if n_of(m) == 3 && attempt == 1 {
                                    Err("three fails once".into())
                                } else {
                                    Ok(Outcome::Delete)
                                }
                            })
                            .collect()
                    };
                    if first_of_nine {
                        // Outlive handler_timeout: the worker drops this
                        // future and cancels the context, which a task
                        // holding a clone of it sees.
                        let ctx = ctx.clone();
                        tokio::spawn(async move {
                            let waited =
                                tokio::time::timeout(Duration::from_secs(5), ctx.cancelled());
                            if waited.await.is_ok() && ctx.is_cancelled() {
                                cancelled.store(true, std::sync::atomic::Ordering::SeqCst);
                            }
                        });
                        tokio::time::sleep(Duration::from_secs(3)).await;
                    }
                    Ok(results)
                }
            },
        )
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(Duration::from_secs(30), "the queue drained", || async {
        queue_len(&client, &q).await == 0
    })
    .await;
    handle.shutdown().await.unwrap();
    assert!(
        cancelled.load(std::sync::atomic::Ordering::SeqCst),
        "the timed-out batch was not cancelled"
    );
    let seen = seen.lock().unwrap();
    assert!(
        seen.iter().all(|s| s.3),
        "a run without a deadline: {seen:?}"
    );
    for n in 0..10 {
        let attempts: Vec<u32> = seen.iter().filter(|s| s.0 == n).map(|s| s.1).collect();
        let deliveries: Vec<u32> = seen.iter().filter(|s| s.0 == n).map(|s| s.2).collect();
        // Every message's runs count 1, 2, ... (the timed-out batch and 3's
        // failure each use an attempt), deliveries rising with them.
        assert_eq!(
            attempts,
            (1..=attempts.len() as u32).collect::<Vec<_>>(),
            "message {n}"
        );
        assert_eq!(deliveries, attempts, "message {n}");
    }
    let of_three = seen.iter().filter(|s| s.0 == 3).count();
    assert!(of_three >= 2, "three was not retried: {seen:?}");
}
