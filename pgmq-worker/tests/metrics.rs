//! The `metrics` feature publishes through the facade: with a recorder
//! installed, a small run records the per-message histograms (handler time,
//! queue wait), the counters (a claim lost to another delivery among them)
//! and the gauges sampled from `pgmq.metrics`, each labelled with the queue.
#![cfg(feature = "metrics")]

mod common;

use std::collections::HashMap;
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
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.claims_lost, 1);
}
