//! Trace context in message headers (feature `otel`): a client built with
//! `trace_context(true)` sends the current trace in each message's headers
//! (single, batch and topic-free sends alike, merged with the caller's own
//! headers), and the worker's per-message span continues it: the handler
//! runs in the sender's trace. A message sent outside any trace carries
//! nothing and starts a trace of its own.
#![cfg(feature = "otel")]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{dsn, queue_len, unique, wait_for, Queues};
use opentelemetry::trace::{TraceContextExt, TraceId, TracerProvider as _};
use pgmq_client::{Client, Message, SendOptions};
use pgmq_worker::{Outcome, Worker};
use serde_json::{json, Value};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

/// Per message id: the trace its handler ran in, and the headers it got.
type Seen = Arc<Mutex<HashMap<i64, (TraceId, Option<Value>)>>>;

fn trace_id_of(span: &tracing::Span) -> TraceId {
    span.context().span().span_context().trace_id()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_runs_in_the_senders_trace() {
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let tracer = provider.tracer("pgmq-otel-test");
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::filter::LevelFilter::INFO)
        .with(tracing_opentelemetry::layer().with_tracer(tracer));
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let client = Client::builder(&dsn())
        .trace_context(true)
        .connect()
        .await
        .unwrap();
    let q = unique("otel");
    let _queues = Queues::new(&client, &[&q]).await;

    // Sent inside a span: one alone with the caller's headers, two in a batch.
    let produce = tracing::info_span!("produce");
    let sender_trace = trace_id_of(&produce);
    assert_ne!(sender_trace, TraceId::INVALID);
    let (one, batch) = async {
        let opts = SendOptions::new().headers(json!({"tenant": "acme"}));
        let one = client.send_with(&q, &json!({"n": 1}), &opts).await.unwrap();
        let batch = client
            .send_batch(&q, &[json!({"n": 2}), json!({"n": 3})])
            .await
            .unwrap();
        (one, batch)
    }
    .instrument(produce)
    .await;
    // Sent outside any span: no trace context.
    let untraced = client.send(&q, &json!({"n": 4})).await.unwrap();

    // The handler notes the trace it runs in and the headers it got.
    let seen: Seen = Arc::default();
    let s = Arc::clone(&seen);
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .poll_interval(Duration::from_millis(20))
        .handler(move |msg: Message<Value>| {
            let s = Arc::clone(&s);
            async move {
                let id = trace_id_of(&tracing::Span::current());
                s.lock().unwrap().insert(msg.msg_id, (id, msg.headers));
                Ok(Outcome::Delete)
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(Duration::from_secs(20), "every message handled", || {
        let n = seen.lock().unwrap().len();
        async move { n == 4 }
    })
    .await;
    handle.shutdown().await.unwrap();
    assert_eq!(queue_len(&client, &q).await, 0);

    let seen = seen.lock().unwrap();
    for id in std::iter::once(one).chain(batch) {
        let (trace, headers) = &seen[&id];
        assert_eq!(
            *trace, sender_trace,
            "message {id} runs in the sender's trace"
        );
        let h = headers.as_ref().unwrap();
        let parent = h["traceparent"].as_str().unwrap();
        assert!(parent.contains(&sender_trace.to_string()), "{parent}");
    }
    // The caller's own header is kept beside the trace context.
    assert_eq!(seen[&one].1.as_ref().unwrap()["tenant"], "acme");
    // Outside a trace: no headers added, and not the sender's trace.
    let (trace, headers) = &seen[&untraced];
    assert_eq!(headers, &None);
    assert_ne!(*trace, sender_trace);
}
