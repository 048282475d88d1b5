//! Fleet-wide limits and pause/resume, with several worker processes on
//! one queue against the real database.
//!
//! The processes are this test binary run again on its test `fleet_child`
//! with a spec in `PGMQ_FLEET_CHILD`: each runs one worker until SIGTERM,
//! then prints every handler run it made (message, claim time on the
//! database's clock, start and end on the machine's clock) on a line of its
//! own. The parent checks what the processes did together, and samples the
//! queue table itself for the claims running at each moment. With a
//! `key_header`, the limit is a limit per key (the header's value) instead
//! of a fleet-wide one.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pgmq_client::{Client, FleetLimit, KeyFrom, KeyLimit, Message, QueueName, SendOptions};
use pgmq_worker::{Outcome, Worker};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use common::OwnDatabase;

const SPEC_ENV: &str = "PGMQ_FLEET_CHILD";
const RUNS_PREFIX: &str = "FLEET_RUNS ";

/// What a child process runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Spec {
    /// The database (the test's own, see `setup`).
    dsn: String,
    queue: String,
    concurrency: usize,
    batch_size: usize,
    handler_ms: u64,
    /// Handlers never return (a process to be killed while holding places).
    hang: bool,
    vt_secs: u64,
    poll_ms: u64,
    max_running: Option<u32>,
    per_second: Option<f64>,
    burst: Option<f64>,
    /// Handlers run in `steps` steps of `step_ms`, each recorded as a row
    /// of this table (`pid`, `msg_id`, `step`, and the database's
    /// `clock_timestamp()`), and the end as step `steps`, instead of
    /// sleeping `handler_ms`.
    steps_table: Option<String>,
    steps: u32,
    step_ms: u64,
    /// The limit is per key, the key the message's header of this name.
    #[serde(default)]
    key_header: Option<String>,
}

/// One handler run, as a child reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Run {
    msg_id: i64,
    /// The claim's `last_read_at`, µs since the epoch (database clock).
    read_at_us: i64,
    /// Handler start and end, µs since the epoch (this machine's clock).
    start_us: i64,
    end_us: i64,
    /// The message's key (the `key_header` header), if any.
    #[serde(default)]
    key: Option<String>,
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// The child side: does nothing in a normal test run.
#[tokio::test]
async fn fleet_child() {
    let Ok(spec) = std::env::var(SPEC_ENV) else {
        return;
    };
    let spec: Spec = serde_json::from_str(&spec).unwrap();
    let client = pgmq_client::ClientBuilder::new(&spec.dsn)
        .max_size(8)
        .connect()
        .await
        .unwrap();
    let runs: Arc<Mutex<Vec<Run>>> = Arc::default();
    let mut limit = FleetLimit::default();
    if let Some(n) = spec.max_running {
        limit = limit.with_max_running(n);
    }
    if let Some(r) = spec.per_second {
        limit = limit.with_per_second(r);
    }
    if let Some(b) = spec.burst {
        limit = limit.with_burst(b);
    }
    let steps = match &spec.steps_table {
        Some(_) => Some(
            pgmq_client::ClientBuilder::new(&spec.dsn)
                .max_size(4)
                .connect()
                .await
                .unwrap(),
        ),
        None => None,
    };
    let handler_runs = Arc::clone(&runs);
    let builder = Worker::builder(client, QueueName::new(&spec.queue).unwrap())
        .concurrency(spec.concurrency)
        .batch_size(spec.batch_size)
        .visibility_timeout(Duration::from_secs(spec.vt_secs))
        .poll_interval(Duration::from_millis(spec.poll_ms))
        .handler_timeout(None);
    let builder = match &spec.key_header {
        Some(h) => builder.key_limit(KeyLimit::new(KeyFrom::header(h.as_str()).unwrap(), limit)),
        None => builder.fleet_limit(limit),
    };
    let worker: Worker<serde_json::Value> = builder
        .handler(move |m: Message<serde_json::Value>| {
            let runs = Arc::clone(&handler_runs);
            let spec = spec.clone();
            let steps = steps.clone();
            async move {
                let start_us = now_us();
                if spec.hang {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                if let (Some(table), Some(steps)) = (&spec.steps_table, &steps) {
                    let sql =
                        format!("INSERT INTO {table} (pid, msg_id, step) VALUES ($1, $2, $3)");
                    let pid = std::process::id() as i32;
                    for step in 0..=spec.steps {
                        let conn = steps.connection().await?;
                        conn.execute(&sql, &[&pid, &m.msg_id, &(step as i32)])
                            .await?;
                        drop(conn);
                        if step < spec.steps {
                            tokio::time::sleep(Duration::from_millis(spec.step_ms)).await;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(spec.handler_ms)).await;
                let read_at_us = m.last_read_at.map_or(0, |t| t.timestamp_micros());
                let key = spec
                    .key_header
                    .as_ref()
                    .and_then(|h| m.headers.as_ref()?.get(h)?.as_str().map(str::to_owned));
                runs.lock().unwrap().push(Run {
                    msg_id: m.msg_id,
                    read_at_us,
                    start_us,
                    end_us: now_us(),
                    key,
                });
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap();
    println!("FLEET_READY");
    worker.run_until_signal().await.unwrap();
    let runs = runs.lock().unwrap().clone();
    println!("{RUNS_PREFIX}{}", serde_json::to_string(&runs).unwrap());
}

/// A child process running `spec`.
struct Child {
    inner: tokio::process::Child,
}

impl Child {
    async fn start(spec: &Spec) -> Child {
        let inner = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args(["fleet_child", "--exact", "--nocapture", "--test-threads=1"])
            .env(SPEC_ENV, serde_json::to_string(spec).unwrap())
            .env("PGMQ_TEST_DSN", &spec.dsn)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Child { inner }
    }

    /// SIGTERM (a graceful shutdown), then its runs.
    async fn stop(mut self) -> Vec<Run> {
        let pid = self.inner.id().unwrap();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let mut out = String::new();
        let mut stdout = self.inner.stdout.take().unwrap();
        tokio::time::timeout(Duration::from_secs(60), stdout.read_to_string(&mut out))
            .await
            .expect("the child exits within 60 s of SIGTERM")
            .unwrap();
        let _ = self.inner.wait().await;
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix(RUNS_PREFIX))
            .unwrap_or_else(|| panic!("no runs reported; stdout: {out}"));
        serde_json::from_str(line).unwrap()
    }
}

async fn start_fleet(spec: &Spec, n: usize) -> Vec<Child> {
    let mut children = Vec::new();
    for _ in 0..n {
        children.push(Child::start(spec).await);
    }
    children
}

/// Stops every child; all their runs.
async fn stop_fleet(children: impl IntoIterator<Item = Child>) -> Vec<Run> {
    let mut runs = Vec::new();
    for c in children {
        runs.extend(c.stop().await);
    }
    runs
}

fn spec(db: &OwnDatabase, queue: &QueueName) -> Spec {
    Spec {
        dsn: db.dsn.clone(),
        queue: queue.as_str().to_owned(),
        concurrency: 4,
        batch_size: 10,
        handler_ms: 10,
        hang: false,
        vt_secs: 30,
        poll_ms: 100,
        max_running: None,
        per_second: None,
        burst: None,
        steps_table: None,
        steps: 0,
        step_ms: 0,
        key_header: None,
    }
}

/// A queue of `messages` messages in a database of the test's own (this
/// build's `pgmq_sdk` schema, whatever version the shared database has).
async fn setup(prefix: &str, messages: usize) -> (Client, QueueName, OwnDatabase) {
    let db = OwnDatabase::create(&format!("w{prefix}")).await;
    let client = db.client(8).await;
    let q = common::unique(prefix);
    client.create(&q).await.unwrap();
    let bodies: Vec<usize> = (0..messages).collect();
    for chunk in bodies.chunks(1000) {
        client.send_batch(&q, chunk).await.unwrap();
    }
    (client, q, db)
}

/// Samples, every 10 ms until `done` is set, how many of the queue's
/// messages are claimed and not yet acknowledged (a delivery with its
/// visibility timeout ahead); returns the most seen.
fn sample_running(
    dsn: &str,
    q: &QueueName,
    done: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<i64> {
    let sql = format!(
        "SELECT count(*) FROM pgmq.q_{} WHERE last_read_at IS NOT NULL AND vt > pg_catalog.clock_timestamp()",
        q.as_str()
    );
    let dsn = dsn.to_owned();
    tokio::spawn(async move {
        let pg = Client::connect(&dsn).await.unwrap();
        let conn = pg.connection().await.unwrap();
        let mut most = 0;
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            let n: i64 = conn.query_one(&sql, &[]).await.unwrap().get(0);
            most = most.max(n);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        most
    })
}

/// The most runs that overlapped at one moment.
fn most_at_once(runs: &[Run]) -> usize {
    let mut edges: Vec<(i64, i32)> = runs
        .iter()
        .flat_map(|r| [(r.start_us, 1), (r.end_us, -1)])
        .collect();
    // Ends before starts at the same microsecond.
    edges.sort_unstable();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}

async fn wait_drained(client: &Client, q: &QueueName, max: Duration) {
    common::wait_for(max, "the queue to drain", || async {
        common::queue_len(client, q).await == 0
    })
    .await;
}

#[tokio::test]
async fn four_processes_never_pass_the_concurrency_limit() {
    const LIMIT: u32 = 6;
    const N: usize = 200;
    let (client, q, db) = setup("fl_conc", N).await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = sample_running(&db.dsn, &q, Arc::clone(&done));
    let s = Spec {
        max_running: Some(LIMIT),
        handler_ms: 150,
        ..spec(&db, &q)
    };
    let children = start_fleet(&s, 4).await;
    wait_drained(&client, &q, Duration::from_secs(90)).await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let sampled = sampler.await.unwrap();
    let runs = stop_fleet(children).await;
    let ids: HashSet<i64> = runs.iter().map(|r| r.msg_id).collect();
    assert_eq!(ids.len(), N, "every message handled");
    assert!(
        most_at_once(&runs) <= LIMIT as usize,
        "{} at once",
        most_at_once(&runs)
    );
    assert!(
        sampled <= i64::from(LIMIT),
        "the database saw {sampled} running"
    );

    // From the moment the fleet first filled the limit (the processes
    // start one after another) until the last start (the backlog's end),
    // the fleet used the limit's places: handler time over places x time.
    let mut starts: Vec<i64> = runs.iter().map(|r| r.start_us).collect();
    starts.sort_unstable();
    let (first, last) = (starts[LIMIT as usize - 1], starts[N - 1]);
    let busy: i64 = runs
        .iter()
        .map(|r| r.end_us.clamp(first, last) - r.start_us.clamp(first, last))
        .sum();
    let used = busy as f64 / (f64::from(LIMIT) * (last - first) as f64);
    // How much of the limit the fleet used is a figure for the benchmark
    // (it depends on the machine's load), not a check here.
    println!("fleet used {used:.3} of {LIMIT} places; the database saw at most {sampled}");
}

/// Starts a process whose handlers hang until it holds 2 places (the
/// limit of `base`), then another; kills the first once a vt has passed
/// and checks that the other, which got nothing until then, handles all
/// `total` messages, starting within the vt of the kill. Its runs.
async fn kill_a_holder(client: &Client, q: &QueueName, base: &Spec, total: usize) -> Vec<Run> {
    let vt = base.vt_secs;
    let mut hung = Child::start(&Spec {
        hang: true,
        ..base.clone()
    })
    .await;
    let running = format!(
        "SELECT count(*) FROM pgmq.q_{} WHERE last_read_at IS NOT NULL AND vt > pg_catalog.clock_timestamp()",
        q.as_str()
    );
    let pg = client.connection().await.unwrap();
    common::wait_for(
        Duration::from_secs(30),
        "the hung process to hold 2 places",
        || async { pg.query_one(&running, &[]).await.unwrap().get::<_, i64>(0) == 2 },
    )
    .await;
    let other = Child::start(base).await;
    // The other process gets nothing while the places are held (the hung
    // process's heartbeat keeps extending them).
    tokio::time::sleep(Duration::from_secs(vt + 1)).await;
    assert_eq!(common::queue_len(client, q).await, total as i64);
    let killed_us = now_us();
    hung.inner.start_kill().unwrap();
    let _ = hung.inner.wait().await;
    wait_drained(client, q, Duration::from_secs(60)).await;
    let runs = other.stop().await;
    assert_eq!(runs.len(), total, "the other process handled every message");
    let first = runs.iter().map(|r| r.start_us).min().unwrap();
    let waited = Duration::from_micros((first - killed_us).max(0) as u64);
    println!("places freed {waited:?} after the kill (vt {vt} s)");
    // Within the vt, plus a poll interval and slack for a loaded machine.
    assert!(waited <= Duration::from_secs(vt + 3), "{waited:?}");
    runs
}

#[tokio::test]
async fn a_killed_process_frees_its_places_within_its_vt() {
    let (client, q, db) = setup("fl_kill", 20).await;
    let base = Spec {
        max_running: Some(2),
        vt_secs: 3,
        concurrency: 2,
        ..spec(&db, &q)
    };
    kill_a_holder(&client, &q, &base, 20).await;
}

#[tokio::test]
async fn four_processes_keep_to_the_rate_limit() {
    const RATE: f64 = 20.0;
    const BURST: f64 = 2.0;
    const N: usize = 100;
    let (client, q, db) = setup("fl_rate", N).await;
    let s = Spec {
        per_second: Some(RATE),
        burst: Some(BURST),
        concurrency: 8,
        handler_ms: 5,
        ..spec(&db, &q)
    };
    let children = start_fleet(&s, 4).await;
    wait_drained(&client, &q, Duration::from_secs(60)).await;
    let runs = stop_fleet(children).await;
    assert_eq!(
        runs.iter().map(|r| r.msg_id).collect::<HashSet<_>>().len(),
        N
    );
    // Claims in any one second, on the database's clock: at most a
    // second's tokens plus the bucket. The bucket is refilled at the
    // limited read's start and a claim's time is set a moment later in the
    // same read, so one claim may fall across a window's edge: one more is
    // allowed for it.
    let mut claims: Vec<i64> = runs.iter().map(|r| r.read_at_us).collect();
    claims.sort_unstable();
    let most = claims
        .iter()
        .enumerate()
        .map(|(i, t)| {
            claims[i..]
                .iter()
                .take_while(|u| **u < t + 1_000_000)
                .count()
        })
        .max()
        .unwrap();
    assert!(
        most as f64 <= RATE + BURST + 1.0,
        "{most} claims within one second at {RATE}/s, bucket {BURST}"
    );
    let span = (claims[N - 1] - claims[0]) as f64 / 1e6;
    let pace = (N as f64 - BURST) / span;
    println!("{pace:.1} claims/s against a limit of {RATE}; at most {most} in one second");
}

#[tokio::test]
async fn pause_stops_every_process_and_resume_restarts_them() {
    const N: usize = 600;
    const POLL: u64 = 200;
    let (client, q, db) = setup("fl_pause", N).await;
    let s = Spec {
        concurrency: 2,
        handler_ms: 20,
        poll_ms: POLL,
        ..spec(&db, &q)
    };
    let children = start_fleet(&s, 2).await;
    common::wait_for(Duration::from_secs(60), "some messages handled", || async {
        common::queue_len(&client, &q).await <= (N - 50) as i64
    })
    .await;
    let pg = client.connection().await.unwrap();
    let db_now = || async {
        pg.query_one("SELECT pg_catalog.clock_timestamp()", &[])
            .await
            .unwrap()
            .get::<_, chrono::DateTime<chrono::Utc>>(0)
            .timestamp_micros()
    };
    assert!(client.pause(&q, Some("test")).await.unwrap());
    let paused_at = db_now().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let left = common::queue_len(&client, &q).await;
    assert!(left > 0, "the queue drained before the pause took hold");
    let resumed_at = db_now().await;
    assert!(client.resume(&q).await.unwrap());
    wait_drained(&client, &q, Duration::from_secs(60)).await;
    let runs = stop_fleet(children).await;
    assert_eq!(
        runs.iter().map(|r| r.msg_id).collect::<HashSet<_>>().len(),
        N
    );
    // No claim from one poll interval (plus a read in flight) after the
    // pause until the resume.
    let quiet_from = paused_at + (POLL as i64 + 300) * 1000;
    let during: Vec<&Run> = runs
        .iter()
        .filter(|r| r.read_at_us > quiet_from && r.read_at_us < resumed_at)
        .collect();
    assert!(during.is_empty(), "claimed while paused: {during:?}");
    assert!(
        runs.iter().any(|r| r.read_at_us >= resumed_at),
        "claims went on after the resume"
    );
}

#[tokio::test]
async fn a_worker_started_while_paused_starts_paused_and_says_so() {
    let (client, q, _db) = setup("fl_start_paused", 20).await;
    client.pause(&q, None).await.unwrap();
    let worker: Worker<serde_json::Value> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(100))
        .handler(|_m: Message<serde_json::Value>| async move { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let handle = worker.spawn();
    common::wait_for(Duration::from_secs(10), "health to say paused", || async {
        handle.health().paused
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let read: i64 = client
        .connection()
        .await
        .unwrap()
        .query_one(
            &format!(
                "SELECT count(*) FROM pgmq.q_{} WHERE read_ct > 0",
                q.as_str()
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(read, 0, "nothing claimed while paused");
    assert!(handle.health().is_healthy(), "paused is healthy");
    client.resume(&q).await.unwrap();
    wait_drained(&client, &q, Duration::from_secs(30)).await;
    assert!(!handle.health().paused);
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.handled, 20);
}

#[tokio::test]
async fn a_limit_that_cannot_work_is_refused_by_build() {
    let client = common::client().await;
    let q = common::unique("fl_bad");
    for (limit, fifo) in [
        (FleetLimit::per_second(-1.0), false),
        (FleetLimit::max_running(0), false),
        (FleetLimit::max_running(2), true),
    ] {
        let mut b = Worker::<serde_json::Value>::builder(client.clone(), q.clone())
            .fleet_limit(limit)
            .handler(|_m: Message<serde_json::Value>| async move { Ok(Outcome::Delete) });
        if fifo {
            b = b.claim_reads(pgmq_worker::ClaimReads::FifoGroups);
        }
        let built = b.build();
        assert!(
            matches!(built, Err(pgmq_worker::Error::Config(_))),
            "{limit:?}"
        );
    }
    // A limit per key that limits nothing, or beside a fleet-wide limit.
    let by_k = || KeyFrom::header("k").unwrap();
    for (limit, fleet) in [
        (KeyLimit::new(by_k(), FleetLimit::default()), None),
        (KeyLimit::new(by_k(), FleetLimit::max_running(0)), None),
        (
            KeyLimit::new(by_k(), FleetLimit::max_running(1)),
            Some(FleetLimit::max_running(5)),
        ),
    ] {
        let mut b = Worker::<serde_json::Value>::builder(client.clone(), q.clone())
            .key_limit(limit.clone())
            .handler(|_m: Message<serde_json::Value>| async move { Ok(Outcome::Delete) });
        if let Some(f) = fleet {
            b = b.fleet_limit(f);
        }
        let built = b.build();
        assert!(
            matches!(built, Err(pgmq_worker::Error::Config(_))),
            "{limit:?}"
        );
    }
}

/// One handler step a child recorded (the database's clock).
struct Step {
    pid: i32,
    msg_id: i64,
    step: i32,
    at_us: i64,
}

/// The spans in which each (process, message) run was executing: between
/// two consecutive steps of it at most `gap_us` apart (a longer gap is a
/// process that was stopped, not executing).
fn active_spans(steps: &[Step], gap_us: i64) -> Vec<(i32, i64, i64)> {
    let mut runs: std::collections::BTreeMap<(i32, i64), Vec<i64>> = Default::default();
    for s in steps {
        runs.entry((s.pid, s.msg_id)).or_default().push(s.at_us);
    }
    let mut spans = Vec::new();
    for ((pid, _), mut at) in runs {
        at.sort_unstable();
        for w in at.windows(2) {
            if w[1] - w[0] <= gap_us {
                spans.push((pid, w[0], w[1]));
            }
        }
    }
    spans
}

/// How long (µs) handler runs of two different processes executed at the
/// same time, and how many steps of one process fell inside a span in
/// which another's run was executing.
fn overlap(steps: &[Step], gap_us: i64) -> (i64, usize) {
    let spans = active_spans(steps, gap_us);
    let mut both = 0;
    for (i, a) in spans.iter().enumerate() {
        for b in &spans[i + 1..] {
            if a.0 != b.0 {
                both += (a.2.min(b.2) - a.1.max(b.1)).max(0);
            }
        }
    }
    let inside = steps
        .iter()
        .filter(|s| {
            spans
                .iter()
                .any(|(pid, from, to)| *pid != s.pid && *from < s.at_us && s.at_us < *to)
        })
        .count();
    (both, inside)
}

/// The fence of a limited worker: one of two processes under
/// `max_running(1)`, vt 2 s, is SIGSTOPped in the middle of a handler run
/// and held past its visibility timeout, so that the other takes the
/// place; after SIGCONT its run must not go on beside the other's. The
/// handlers record each 100 ms step in the database, and the steps of two
/// processes' runs never overlap (tolerance: one step's span, a poll
/// already in progress when the process was stopped, and 50 ms). The work
/// all gets done.
#[tokio::test]
async fn a_stopped_process_never_runs_a_handler_beside_another() {
    const VT: u64 = 2;
    const N: usize = 6;
    const STEPS: u32 = 20;
    const STEP_MS: u64 = 100;
    let (client, q, db) = setup("fl_fence", N).await;
    let table = format!("public.steps_{}", q.as_str());
    db.execute(&format!(
        "CREATE TABLE {table} (pid int NOT NULL, msg_id bigint NOT NULL, step int NOT NULL, \
         at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp())"
    ))
    .await;
    let base = Spec {
        max_running: Some(1),
        vt_secs: VT,
        concurrency: 1,
        batch_size: 1,
        handler_ms: 0,
        steps_table: Some(table.clone()),
        steps: STEPS,
        step_ms: STEP_MS,
        ..spec(&db, &q)
    };
    let children = start_fleet(&base, 2).await;
    let pg = client.connection().await.unwrap();
    // A run with at least 1.2 s of steps left, in whichever process.
    let latest = format!("SELECT pid, step FROM {table} ORDER BY at DESC LIMIT 1");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let stopped: i32 = loop {
        if let Some(row) = pg.query_opt(&latest, &[]).await.unwrap() {
            let (pid, step): (i32, i32) = (row.get(0), row.get(1));
            if (2..=8).contains(&step) {
                break pid;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no run in its first steps within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let signal = |sig: &str| {
        let status = std::process::Command::new("kill")
            .args([sig, &stopped.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    };
    signal("-STOP");
    // Past its visibility timeout: the other process takes the place.
    tokio::time::sleep(Duration::from_secs(VT + 2)).await;
    signal("-CONT");
    wait_drained(&client, &q, Duration::from_secs(90)).await;
    stop_fleet(children).await;
    let steps: Vec<Step> = pg
        .query(&format!("SELECT pid, msg_id, step, at FROM {table}"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| Step {
            pid: r.get(0),
            msg_id: r.get(1),
            step: r.get(2),
            at_us: r
                .get::<_, chrono::DateTime<chrono::Utc>>(3)
                .timestamp_micros(),
        })
        .collect();
    let finished: HashSet<i64> = steps
        .iter()
        .filter(|s| s.step == STEPS as i32)
        .map(|s| s.msg_id)
        .collect();
    assert_eq!(finished.len(), N, "every message's run finished somewhere");
    let after_stop = steps.iter().filter(|s| s.pid == stopped).count();
    let (both_us, inside) = overlap(&steps, 4 * STEP_MS as i64 * 1000);
    println!(
        "process {stopped} stopped: {after_stop} steps of its own; two processes' runs overlapped {} ms, {inside} steps inside another's run",
        both_us / 1000
    );
    assert!(
        both_us <= (STEP_MS as i64 + 50) * 1000 && inside <= 1,
        "two processes' handlers ran at once for {} ms ({inside} steps inside another's run)",
        both_us / 1000
    );
}

/// A queue of one message per entry of `keys`, in that order, each with
/// its key in the header `k`, in a database of the test's own.
async fn setup_keyed(prefix: &str, keys: &[String]) -> (Client, QueueName, OwnDatabase) {
    let (client, q, db) = setup(prefix, 0).await;
    let bodies: Vec<usize> = (0..keys.len()).collect();
    let headers: Vec<serde_json::Value> =
        keys.iter().map(|k| serde_json::json!({ "k": k })).collect();
    for (b, h) in bodies.chunks(1000).zip(headers.chunks(1000)) {
        let opts = SendOptions::new().headers_each(h.to_vec());
        client.send_batch_with(&q, b, &opts).await.unwrap();
    }
    (client, q, db)
}

/// The runs of each key.
fn by_key(runs: &[Run]) -> std::collections::HashMap<String, Vec<Run>> {
    let mut out: std::collections::HashMap<String, Vec<Run>> = Default::default();
    for r in runs {
        out.entry(r.key.clone().unwrap_or_default())
            .or_default()
            .push(r.clone());
    }
    out
}

#[tokio::test]
async fn three_processes_keep_each_key_to_its_limit_and_a_hot_key_blocks_no_cold_one() {
    const LIMIT: u32 = 2;
    const HOT: usize = 40;
    // The hot key's messages first, at the head of the queue, then sixty
    // cold keys of one message each.
    let mut keys: Vec<String> = vec!["hot".to_owned(); HOT];
    keys.extend((0..60).map(|i| format!("cold{i}")));
    let (client, q, db) = setup_keyed("kl_hot", &keys).await;
    let s = Spec {
        max_running: Some(LIMIT),
        handler_ms: 50,
        key_header: Some("k".into()),
        ..spec(&db, &q)
    };
    let children = start_fleet(&s, 3).await;
    wait_drained(&client, &q, Duration::from_secs(90)).await;
    let runs = stop_fleet(children).await;
    let ids: HashSet<i64> = runs.iter().map(|r| r.msg_id).collect();
    assert_eq!(ids.len(), keys.len(), "every message handled");
    let keyed = by_key(&runs);
    for (k, rs) in &keyed {
        assert!(
            most_at_once(rs) <= LIMIT as usize,
            "key {k}: {} at once",
            most_at_once(rs)
        );
    }
    // The hot key's runs take at least HOT / LIMIT handler times one after
    // another; the cold keys' sixty runs share the other places of twelve.
    // Had the hot key's backlog held them back, they would end after it.
    let cold_end = runs
        .iter()
        .filter(|r| r.key.as_deref() != Some("hot"))
        .map(|r| r.end_us)
        .max()
        .unwrap();
    let hot_end = keyed["hot"].iter().map(|r| r.end_us).max().unwrap();
    assert!(
        cold_end < hot_end,
        "the cold keys ended after the hot key's backlog"
    );
}

#[tokio::test]
async fn a_killed_process_frees_its_keys_places_within_its_vt() {
    let keys: Vec<String> = vec!["a".to_owned(); 10];
    let (client, q, db) = setup_keyed("kl_kill", &keys).await;
    let base = Spec {
        max_running: Some(2),
        vt_secs: 3,
        concurrency: 4,
        key_header: Some("k".into()),
        ..spec(&db, &q)
    };
    let runs = kill_a_holder(&client, &q, &base, 10).await;
    assert!(most_at_once(&runs) <= 2);
}
