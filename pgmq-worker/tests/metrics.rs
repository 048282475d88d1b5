//! The `metrics` feature publishes through the facade: with a recorder
//! installed, a small run records the per-message histograms (handler time,
//! queue wait), the counters (a claim lost to another delivery among them)
//! and the gauges sampled from `pgmq.metrics`, each labelled with the queue.
#![cfg(feature = "metrics")]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{client, unique, wait_for, Queues};
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use pgmq_client::Message;
use pgmq_worker::{Outcome, Worker};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

const WAIT: Duration = Duration::from_secs(20);
const MESSAGES: u64 = 10;

/// A histogram's samples.
#[derive(Default)]
struct Samples(Mutex<Vec<f64>>);

impl metrics::HistogramFn for Samples {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

/// Everything registered, by `name{label=value,...}`.
#[derive(Default)]
struct Recorded {
    counters: Mutex<HashMap<String, Arc<AtomicU64>>>,
    /// Gauges as `f64` bits (the facade's own `GaugeFn` for `AtomicU64`).
    gauges: Mutex<HashMap<String, Arc<AtomicU64>>>,
    histograms: Mutex<HashMap<String, Arc<Samples>>>,
}

fn key_text(key: &Key) -> String {
    let labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

/// The recorder, installed once for this test binary.
#[derive(Clone, Default)]
struct Debugging(Arc<Recorded>);

impl Debugging {
    fn counter(&self, name: &str) -> Option<u64> {
        let map = self.0.counters.lock().unwrap();
        map.get(name).map(|c| c.load(Relaxed))
    }

    fn gauge(&self, name: &str) -> Option<f64> {
        let map = self.0.gauges.lock().unwrap();
        map.get(name).map(|g| f64::from_bits(g.load(Relaxed)))
    }

    /// The names of everything registered with this label (`{queue=...}`).
    fn names_labelled(&self, label: &str) -> BTreeSet<String> {
        let counters = self.0.counters.lock().unwrap();
        let gauges = self.0.gauges.lock().unwrap();
        let histograms = self.0.histograms.lock().unwrap();
        counters
            .keys()
            .chain(gauges.keys())
            .chain(histograms.keys())
            .filter_map(|key| key.strip_suffix(label))
            .map(str::to_owned)
            .collect()
    }

    fn samples(&self, name: &str) -> Vec<f64> {
        let map = self.0.histograms.lock().unwrap();
        map.get(name)
            .map(|h| h.0.lock().unwrap().clone())
            .unwrap_or_default()
    }
}

impl Recorder for Debugging {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut map = self.0.counters.lock().unwrap();
        Counter::from_arc(Arc::clone(map.entry(key_text(key)).or_default()))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let mut map = self.0.gauges.lock().unwrap();
        Gauge::from_arc(Arc::clone(map.entry(key_text(key)).or_default()))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let mut map = self.0.histograms.lock().unwrap();
        Histogram::from_arc(Arc::clone(map.entry(key_text(key)).or_default()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_records_histograms_counters_and_queue_gauges() {
    let recorder = Debugging::default();
    metrics::set_global_recorder(recorder.clone()).expect("the only recorder of this binary");

    let client = client().await;
    let q = unique("metrics");
    let _g = Queues::new(&client, &[&q]).await;
    let bodies: Vec<Value> = (0..MESSAGES).map(|n| json!({ "n": n })).collect();
    client.send_batch(&q, &bodies).await.unwrap();
    let lost_id = client.send(&q, &json!({ "lose": true })).await.unwrap();

    // The handler of the message to lose waits until the test has taken
    // its claim over, so that the worker's fenced delete matches nothing.
    let (started_tx, mut started) = mpsc::unbounded_channel::<()>();
    let (go_tx, go) = oneshot::channel::<()>();
    let go = Mutex::new(Some(go));
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .visibility_timeout(Duration::from_secs(2))
        .heartbeat(false)
        .poll_interval(Duration::from_millis(50))
        .metrics_interval(Duration::from_millis(50))
        .handler(move |m: Message<Value>| {
            let wait = (m.body.get("lose").is_some())
                .then(|| go.lock().unwrap().take())
                .flatten();
            if wait.is_some() {
                let _ = started_tx.send(());
            }
            async move {
                if let Some(go) = wait {
                    let _ = go.await;
                }
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    tokio::time::timeout(WAIT, started.recv()).await.unwrap();
    // Another delivery takes the message, as PGMQ's read would once the
    // claim expired.
    common::take_claim_over(&client, &q, lost_id).await;
    let _ = go_tx.send(());

    let label = format!("{{queue={}}}", q.as_str());
    let name = |metric: &str| format!("{metric}{label}");
    wait_for(WAIT, "the counters published", || async {
        recorder.counter(&name("pgmq_worker_handled_total")) == Some(MESSAGES + 1)
            && recorder.counter(&name("pgmq_worker_deleted_total")) == Some(MESSAGES)
            && recorder.counter(&name("pgmq_worker_claims_lost_total")) == Some(1)
    })
    .await;
    // The stolen message stays in the queue, invisible: the gauges come
    // from pgmq.metrics.
    wait_for(WAIT, "the queue's gauges sampled", || async {
        recorder.gauge(&name("pgmq_queue_length")) == Some(1.0)
            && recorder.gauge(&name("pgmq_queue_visible_length")) == Some(0.0)
    })
    .await;
    assert!(
        recorder
            .gauge(&name("pgmq_queue_oldest_msg_age_seconds"))
            .is_some_and(|age| age >= 0.0),
        "no oldest-message age"
    );
    assert_eq!(recorder.gauge(&name("pgmq_worker_healthy")), Some(1.0));
    // Every counter of StatsSnapshot is published, those still at 0 too.
    for counter in [
        "pgmq_worker_expired_unstarted_total",
        "pgmq_worker_expired_released_total",
        "pgmq_worker_wakeups_poll_total",
        "pgmq_worker_wakeups_notify_total",
    ] {
        assert!(
            recorder.counter(&name(counter)).is_some(),
            "{counter} is not published"
        );
    }

    // One sample per handler run, each a plausible time in seconds.
    for metric in [
        "pgmq_worker_handler_seconds",
        "pgmq_worker_queue_wait_seconds",
    ] {
        let samples = recorder.samples(&name(metric));
        assert_eq!(samples.len() as u64, MESSAGES + 1, "{metric}: {samples:?}");
        assert!(
            samples
                .iter()
                .all(|s| (0.0..WAIT.as_secs_f64()).contains(s)),
            "{metric}: {samples:?}"
        );
    }
    // What was published is exactly what the crate docs list.
    let documented = documented_names(&package_file(METRICS_MD));
    let published = recorder.names_labelled(&label);
    assert_eq!(
        published.difference(&documented).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "published but not in {METRICS_MD}"
    );
    assert_eq!(
        documented.difference(&published).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "in {METRICS_MD} but not published"
    );

    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.claims_lost, 1);
}

/// The metrics table the crate docs include, relative to this package.
const METRICS_MD: &str = "docs/metrics.md";

fn package_file(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every metric name `doc` lists: the first cell of each table row, with
/// `pgmq_worker_<counter>_total` expanded over the counters of the
/// paragraph that starts "The counters".
fn documented_names(doc: &str) -> BTreeSet<String> {
    let code = |text: &str| -> Vec<String> {
        text.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    };
    let counters_text = doc
        .split_once("\nThe counters")
        .expect("the doc lists the counters")
        .1;
    let counters_text = counters_text.split("\n\n").next().unwrap();
    let counters: Vec<String> = code(counters_text)
        .into_iter()
        .filter(|c| !c.contains('<') && c != "StatsSnapshot")
        .collect();
    let mut names = BTreeSet::new();
    for row in doc.lines().filter(|l| l.starts_with("| `")) {
        let first = row.split('|').nth(1).unwrap();
        for name in code(first) {
            match name.split_once("<counter>") {
                Some((before, after)) => {
                    names.extend(counters.iter().map(|c| format!("{before}{c}{after}")))
                }
                None => {
                    names.insert(name);
                }
            }
        }
    }
    names
}

#[test]
fn a_missing_or_extra_metric_is_caught() {
    let doc = "x\n\n| name | kind | what |\n| --- | --- | --- |\n| `p_<counter>_total` | counter | `StatsSnapshot`'s |\n| `g` | gauge | `x` |\n\nThe counters, each `p_<counter>_total` (on `StatsSnapshot`): `a`,\n`b`.\n";
    let names = documented_names(doc);
    let want: BTreeSet<String> = ["g", "p_a_total", "p_b_total"].map(String::from).into();
    assert_eq!(names, want);
    let real = documented_names(&package_file(METRICS_MD));
    assert!(real.len() >= 35, "{real:?}");
    assert!(real.contains("pgmq_worker_tx_unavailable_total"));
}
