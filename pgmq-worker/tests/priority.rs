//! Priorities across queues (`Priority`, `WorkerGroup::priority`): with a
//! backlog on every queue the handled share per queue follows the policy,
//! within 10 % of the expected share; strict priorities starve the lower
//! queue only while the higher one has messages; every message is handled
//! once, none claimed and left to time out; and two processes running the
//! same prioritized group share the queues by the same weights.
//!
//! The two-process test starts its children from this test binary itself,
//! speaking pgmq-testkit's child protocol (`ready`, `go`, `stats`,
//! `report`), as pgmq-bench and pgmq-faults start theirs from their own
//! binaries: the child is the test `priority_child_process`, which does
//! nothing unless `PGMQ_PRIORITY_CHILD` is set.

mod common;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use common::{client, dsn, queue_len, unique, wait_for, Queues};
use pgmq_client::{Client, Message, QueueName};
use pgmq_testkit::child::{say_json, say_ready, spec_from_arg, wait_for_go, Line, Spawn};
use pgmq_worker::{Outcome, Priority, Worker, WorkerGroup};
use serde::{Deserialize, Serialize};

/// What one queue's handler counts.
#[derive(Default)]
struct Counts {
    handled: AtomicU64,
    /// Runs of a message delivered before (`read_ct` > 1).
    redelivered: AtomicU64,
    /// This queue's handlers running at once, now and at most.
    running: Gauge,
    /// The group's handlers running at once, when shared with the other
    /// queues' counts ([`Counts::sharing`]).
    group: Arc<Gauge>,
}

impl Counts {
    /// Counts whose group gauge is `group`.
    fn sharing(group: &Arc<Gauge>) -> Arc<Counts> {
        Arc::new(Counts {
            group: Arc::clone(group),
            ..Counts::default()
        })
    }
}

/// Runs in progress, and the most seen at once.
#[derive(Default)]
struct Gauge {
    now: AtomicU64,
    peak: AtomicU64,
}

impl Gauge {
    fn enter(&self) {
        let now = self.now.fetch_add(1, Relaxed) + 1;
        self.peak.fetch_max(now, Relaxed);
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Relaxed);
    }

    fn peak(&self) -> u64 {
        self.peak.load(Relaxed)
    }
}

/// A worker on `q` whose handler takes `ms` and counts into `counts`.
fn worker(
    client: &Client,
    q: &QueueName,
    concurrency: usize,
    visibility: Duration,
    ms: u64,
    counts: &Arc<Counts>,
) -> Worker<u64> {
    let counts = Arc::clone(counts);
    Worker::builder(client.clone(), q.clone())
        .concurrency(concurrency)
        .visibility_timeout(visibility)
        .poll_interval(Duration::from_millis(50))
        .handler(move |m: Message<u64>| {
            let counts = Arc::clone(&counts);
            async move {
                counts.running.enter();
                counts.group.enter();
                tokio::time::sleep(Duration::from_millis(ms)).await;
                counts.group.leave();
                counts.running.leave();
                if m.read_ct > 1 {
                    counts.redelivered.fetch_add(1, Relaxed);
                }
                counts.handled.fetch_add(1, Relaxed);
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap()
}

async fn fill(client: &Client, q: &QueueName, n: u64) {
    let bodies: Vec<u64> = (0..n).collect();
    for chunk in bodies.chunks(1_000) {
        client.send_batch(q, chunk).await.unwrap();
    }
}

/// A client whose pool fits `workers` workers (claimers + flusher + 1 each).
async fn pooled(workers: u32) -> Client {
    Client::builder(&dsn())
        .max_size(4 * workers + 2)
        .connect()
        .await
        .unwrap()
}

fn handled(counts: &[Arc<Counts>]) -> Vec<u64> {
    counts.iter().map(|c| c.handled.load(Relaxed)).collect()
}

/// Each share of `got` is within 10 % (relative) of its weight's share.
fn assert_shares(got: &[u64], weights: &[u64]) {
    let total: u64 = got.iter().sum();
    eprintln!("handled {got:?} for weights {weights:?}");
    let wsum: u64 = weights.iter().sum();
    for (i, (&g, &w)) in got.iter().zip(weights).enumerate() {
        let share = g as f64 / total as f64;
        let want = w as f64 / wsum as f64;
        assert!(
            (share - want).abs() <= 0.10 * want,
            "queue {i}: share {share:.3}, expected {want:.3} (handled {got:?}, weights {weights:?})"
        );
    }
}

/// Waits until the sum of `counts` reaches `n`; returns them then.
async fn until_total(counts: &[Arc<Counts>], n: u64, what: &str) -> Vec<u64> {
    wait_for(Duration::from_secs(120), what, || async {
        handled(counts).iter().sum::<u64>() >= n
    })
    .await;
    handled(counts)
}

type Running =
    tokio::task::JoinHandle<Result<Vec<pgmq_worker::ShutdownReport>, pgmq_worker::Error>>;

/// Runs `group`, measures the handled shares between `window.0` and
/// `window.1` messages handled in all (every queue must still have a
/// backlog at its end), checks them against `weights`, then lets every
/// message be handled and checks each was, once.
async fn measure_and_drain(
    client: &Client,
    qs: &[QueueName],
    group: WorkerGroup,
    counts: &[Arc<Counts>],
    weights: &[u64],
    window: (u64, u64),
    n: u64,
) {
    let stop = group.shutdown_handle();
    let running = tokio::spawn(group.run_until(std::future::pending::<()>()));
    let from = until_total(counts, window.0, "the window's start").await;
    let to = until_total(counts, window.1, "the window's end").await;
    assert!(
        to.iter().all(|&h| h < n),
        "a queue drained inside the window: {to:?}"
    );
    let got: Vec<u64> = to.iter().zip(&from).map(|(t, f)| t - f).collect();
    assert_shares(&got, weights);
    // Work conserving: the others take the capacity as queues drain.
    drain_and_stop(client, qs, counts, stop, running, &vec![n; qs.len()]).await;
}

/// Waits until the handlers handled `expected`, stops the group, and checks
/// that the queues are empty and no message was delivered twice.
async fn drain_and_stop(
    client: &Client,
    qs: &[QueueName],
    counts: &[Arc<Counts>],
    stop: pgmq_worker::GroupShutdown,
    running: Running,
    expected: &[u64],
) {
    wait_for(
        Duration::from_secs(120),
        "every message handled",
        || async { handled(counts) == expected },
    )
    .await;
    stop.graceful();
    running.await.unwrap().unwrap();
    assert_eq!(handled(counts), expected);
    for (q, c) in qs.iter().zip(counts) {
        assert_eq!(queue_len(client, q).await, 0);
        assert_eq!(c.redelivered.load(Relaxed), 0, "{q}: delivered twice");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_shares_follow_the_weights() {
    const N: u64 = 8_000;
    let client = pooled(3).await;
    let qs = [unique("prio_w4"), unique("prio_w2"), unique("prio_w1")];
    let _g = Queues::new(&client, &[&qs[0], &qs[1], &qs[2]]).await;
    for q in &qs {
        fill(&client, q, N).await;
    }
    let counts: Vec<Arc<Counts>> = (0..3).map(|_| Arc::default()).collect();
    let weights = [4u64, 2, 1];
    let mut group = WorkerGroup::new(client.clone()).priority(Priority::weighted().concurrency(8));
    for ((q, c), w) in qs.iter().zip(&counts).zip(weights) {
        let wk = worker(&client, q, 8, Duration::from_secs(30), 1, c);
        group = group.with_worker_priority(wk, w as u32);
    }
    // Measured past the start, while every queue still has a backlog (the
    // heaviest has handled about 57 % of 8,000 by the end of the window).
    // The gate shares the messages claimed; the handled shares follow
    // them up to what is claimed ahead and not yet run, so the window is
    // long enough for that to stay well inside the tolerance.
    measure_and_drain(&client, &qs, group, &counts, &weights, (500, 8_000), N).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_equal_weights_share_equally() {
    const N: u64 = 3_000;
    let client = pooled(2).await;
    let qs = [unique("prio_e1"), unique("prio_e2")];
    let _g = Queues::new(&client, &[&qs[0], &qs[1]]).await;
    for q in &qs {
        fill(&client, q, N).await;
    }
    let counts: Vec<Arc<Counts>> = (0..2).map(|_| Arc::default()).collect();
    // No policy given: `with_worker_priority` makes the group weighted,
    // over the workers' smallest concurrency (4).
    let first = worker(&client, &qs[0], 4, Duration::from_secs(30), 1, &counts[0]);
    let second = worker(&client, &qs[1], 6, Duration::from_secs(30), 1, &counts[1]);
    let group = WorkerGroup::new(client.clone())
        .with_worker_priority(first, 1)
        .with_worker_priority(second, 1);
    measure_and_drain(&client, &qs, group, &counts, &[1, 1], (300, 3_300), N).await;
}

/// Work conserving, and one limit for the group: while the heavy queue
/// has nothing, the light one runs on all of the group's 6 handlers (its
/// own `concurrency` is 8), never more; once the heavy queue has messages,
/// the group still runs at most 6 at once across both queues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_queue_leaves_its_share_to_the_others() {
    const N: u64 = 1_500;
    let client = pooled(2).await;
    let qs = [unique("prio_idle"), unique("prio_busy")];
    let _g = Queues::new(&client, &[&qs[0], &qs[1]]).await;
    fill(&client, &qs[1], N).await;
    let group_gauge = Arc::new(Gauge::default());
    let counts: Vec<Arc<Counts>> = (0..2).map(|_| Counts::sharing(&group_gauge)).collect();
    let heavy = worker(&client, &qs[0], 8, Duration::from_secs(30), 3, &counts[0]);
    let light = worker(&client, &qs[1], 8, Duration::from_secs(30), 3, &counts[1]);
    let group = WorkerGroup::new(client.clone())
        .priority(Priority::weighted().concurrency(6))
        .with_worker_priority(heavy, 4)
        .with_worker_priority(light, 1);
    let stop = group.shutdown_handle();
    let running = tokio::spawn(group.run_until(std::future::pending::<()>()));
    until_total(&counts, N / 2, "half the light queue handled").await;
    assert_eq!(counts[0].handled.load(Relaxed), 0);
    assert_eq!(
        counts[1].running.peak(),
        6,
        "the light queue alone did not get the whole group"
    );
    // The heavy queue's messages arrive while the light one has a backlog.
    fill(&client, &qs[0], N).await;
    drain_and_stop(&client, &qs, &counts, stop, running, &[N, N]).await;
    assert_eq!(group_gauge.peak(), 6, "the group ran more than 6 at once");
}

/// Strict: the low queue gets (almost) nothing while the high one has a
/// backlog, then everything; its messages are not claimed early, so none
/// sits claimed past its 1 s visibility timeout while the high queue's
/// backlog (about 2 s of work) is handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_serves_the_low_queue_only_once_the_high_one_is_drained() {
    const HIGH: u64 = 4_000;
    const LOW: u64 = 1_000;
    let client = pooled(2).await;
    let qs = [unique("prio_hi"), unique("prio_lo")];
    let _g = Queues::new(&client, &[&qs[0], &qs[1]]).await;
    fill(&client, &qs[1], LOW).await;
    fill(&client, &qs[0], HIGH).await;
    let counts: Vec<Arc<Counts>> = (0..2).map(|_| Arc::default()).collect();
    let high = worker(&client, &qs[0], 4, Duration::from_secs(30), 2, &counts[0]);
    let low = worker(&client, &qs[1], 4, Duration::from_secs(1), 2, &counts[1]);
    let group = WorkerGroup::new(client.clone())
        .priority(Priority::strict().concurrency(4))
        .with_worker_priority(high, 2)
        .with_worker_priority(low, 1);
    let stop = group.shutdown_handle();
    let running = tokio::spawn(group.run_until(std::future::pending::<()>()));

    wait_for(
        Duration::from_secs(120),
        "the high queue nearly drained",
        || async { counts[0].handled.load(Relaxed) >= HIGH - 200 },
    )
    .await;
    let [high, low] = handled(&counts)[..] else {
        unreachable!()
    };
    eprintln!("strict: high {high}, low {low} while the high queue had a backlog");
    assert!(
        low * 50 <= high,
        "the low queue got {low} while the high one had a backlog ({high} handled)"
    );
    drain_and_stop(&client, &qs, &counts, stop, running, &[HIGH, LOW]).await;
}

/// A child's settings.
#[derive(Serialize, Deserialize)]
struct ChildSpec {
    queues: Vec<String>,
    weights: Vec<u32>,
    concurrency: usize,
    handler_ms: u64,
}

/// A child's `stats` and `report`: handled and redelivered per queue.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
struct ChildCounts {
    handled: Vec<u64>,
    redelivered: Vec<u64>,
}

type Child = pgmq_testkit::child::Child<ChildCounts, ChildCounts>;

/// The children's handled counts per queue, summed, once they reach `n`
/// in all (from their last `stats` lines).
async fn combined_at_least(children: &[Child], n: u64) -> Vec<u64> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let mut sum = vec![0u64; 3];
        for c in children {
            if let Some(s) = c.said().stats {
                for (t, h) in sum.iter_mut().zip(&s.handled) {
                    *t += h;
                }
            }
        }
        if sum.iter().sum::<u64>() >= n {
            return sum;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the children handled {sum:?}, not {n}, in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_the_queues_by_weight() {
    const N: u64 = 6_000;
    let client = client().await;
    let qs = [unique("prio_p3"), unique("prio_p2"), unique("prio_p1")];
    let _g = Queues::new(&client, &[&qs[0], &qs[1], &qs[2]]).await;
    for q in &qs {
        fill(&client, q, N).await;
    }
    let weights = [3u32, 2, 1];
    let spec = ChildSpec {
        queues: qs.iter().map(|q| q.as_str().to_owned()).collect(),
        weights: weights.to_vec(),
        concurrency: 6,
        handler_ms: 1,
    };
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<Child> = Vec::new();
    for name in ["priority child a", "priority child b"] {
        let child = Spawn::new(&exe, "priority_child_process", &spec, name)
            .unwrap()
            .env("PGMQ_PRIORITY_CHILD", "1")
            .env("PGMQ_TEST_DSN", &dsn())
            .with_go()
            .start()
            .await
            .unwrap();
        children.push(child);
    }
    for c in &mut children {
        c.go().await.unwrap();
    }
    // A window of 8,400 handled: each process's claims ahead (what the
    // gate granted and no handler ran yet) shift the handled shares from
    // the claimed ones by a few dozen messages, well inside the tolerance
    // at this length. The heaviest queue handles about 4,500 by its end.
    let from = combined_at_least(&children, 600).await;
    let to = combined_at_least(&children, 9_000).await;
    assert!(
        to[0] < N,
        "the heaviest queue drained inside the window: {to:?}"
    );
    let window: Vec<u64> = to.iter().zip(&from).map(|(t, f)| t - f).collect();
    assert_shares(&window, &[3, 2, 1]);
    // Both processes took part.
    for c in &children {
        let h: u64 = c.said().stats.unwrap_or_default().handled.iter().sum();
        assert!(h > 0, "{} handled nothing", c.name);
    }

    wait_for(Duration::from_secs(120), "every queue drained", || async {
        let mut left = 0;
        for q in &qs {
            left += queue_len(&client, q).await;
        }
        left == 0
    })
    .await;
    let mut total = vec![0u64; 3];
    for c in children {
        let exit = c.stop(Duration::from_secs(30)).await.unwrap();
        assert!(exit.clean(), "{}", exit.describe());
        let report = exit.said.report.unwrap();
        assert_eq!(report.redelivered, vec![0; 3], "delivered twice");
        for (t, h) in total.iter_mut().zip(&report.handled) {
            *t += h;
        }
    }
    assert_eq!(total, vec![N; 3], "every message handled once");
}

/// The child of `two_processes_share_the_queues_by_weight` (nothing unless
/// `PGMQ_PRIORITY_CHILD` is set): runs the prioritized group of its spec
/// (the argument after its name), says `stats` every 50 ms, and on SIGTERM
/// drains, says `report` and exits.
#[test]
fn priority_child_process() {
    if std::env::var_os("PGMQ_PRIORITY_CHILD").is_none() {
        return;
    }
    let arg = std::env::args().nth(2).expect("the child's spec");
    let spec: ChildSpec = spec_from_arg(&arg).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let client = pooled(spec.queues.len() as u32).await;
        let counts: Vec<Arc<Counts>> = spec.queues.iter().map(|_| Arc::default()).collect();
        let mut group = WorkerGroup::new(client.clone())
            .priority(Priority::weighted().concurrency(spec.concurrency));
        for ((q, c), w) in spec.queues.iter().zip(&counts).zip(&spec.weights) {
            let q = QueueName::new(q).unwrap();
            let wk = worker(
                &client,
                &q,
                spec.concurrency,
                Duration::from_secs(30),
                spec.handler_ms,
                c,
            );
            group = group.with_worker_priority(wk, *w);
        }
        let snapshot = |counts: &[Arc<Counts>]| ChildCounts {
            handled: handled(counts),
            redelivered: counts.iter().map(|c| c.redelivered.load(Relaxed)).collect(),
        };
        say_ready();
        if !wait_for_go().await.unwrap() {
            std::process::exit(1);
        }
        let reporter = {
            let counts = counts.clone();
            tokio::spawn(async move {
                loop {
                    say_json(Line::Stats, &snapshot(&counts)).unwrap();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
        group
            .run_until(async move {
                term.recv().await;
            })
            .await
            .unwrap();
        reporter.abort();
        say_json(Line::Report, &snapshot(&counts)).unwrap();
        std::process::exit(0);
    });
}

/// Not a check: the figures of docs/results/README.md, "Priorities: what
/// the gate costs". Drains `N` messages from each of three queues
/// with handlers of `PRIO_BENCH_MS` ms (default 1), once with a weighted
/// group of capacity 8 and once with three plain workers of concurrency
/// 3, 3 and 2, and prints the throughput of each. Run with
/// `--run-ignored only --no-capture`, in release for real figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a check"]
async fn throughput_against_plain_workers() {
    const N: u64 = 5_000;
    let ms: u64 = std::env::var("PRIO_BENCH_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let client = pooled(3).await;
    for prioritized in [true, false, true, false] {
        let qs = [unique("prio_b1"), unique("prio_b2"), unique("prio_b3")];
        let _g = Queues::new(&client, &[&qs[0], &qs[1], &qs[2]]).await;
        for q in &qs {
            fill(&client, q, N).await;
        }
        let counts: Vec<Arc<Counts>> = (0..3).map(|_| Arc::default()).collect();
        let mut group = WorkerGroup::new(client.clone());
        if prioritized {
            group = group.priority(Priority::weighted().concurrency(8));
        }
        for (i, (q, c)) in qs.iter().zip(&counts).enumerate() {
            let concurrency = if prioritized { 8 } else { [3, 3, 2][i] };
            let wk = worker(&client, q, concurrency, Duration::from_secs(30), ms, c);
            group = if prioritized {
                group.with_worker_priority(wk, [4, 2, 1][i])
            } else {
                group.with_worker(wk)
            };
        }
        let monitors = group.monitors();
        let stop = group.shutdown_handle();
        let started = std::time::Instant::now();
        let running = tokio::spawn(group.run_until(std::future::pending::<()>()));
        // The steady rate, while every queue has a backlog, and the time to
        // drain them all.
        until_total(&counts, 1_500, "1,500 handled").await;
        let window = std::time::Instant::now();
        until_total(&counts, 7_500, "7,500 handled").await;
        let steady = 6_000.0 / window.elapsed().as_secs_f64();
        until_total(&counts, 3 * N, "every message handled").await;
        let took = started.elapsed();
        stop.graceful();
        running.await.unwrap().unwrap();
        let reads: u64 = monitors.iter().map(|(_, m)| m.stats().reads).sum();
        eprintln!(
            "{}: {steady:.0} msg/s with a backlog on every queue, {:.0} msg/s to drain \
             {} messages in {:?} (handler {ms} ms, {:.1} messages a read)",
            if prioritized {
                "weighted group, capacity 8"
            } else {
                "3 plain workers, 3+3+2"
            },
            (3 * N) as f64 / took.as_secs_f64(),
            3 * N,
            took,
            (3 * N) as f64 / reads as f64,
        );
    }
}
