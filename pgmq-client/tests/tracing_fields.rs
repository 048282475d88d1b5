//! Tracing: every call opens a span naming the call and the queue (and the
//! batch size), and no span or event ever records a payload, a header, a
//! filter or a password.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pgmq_client::ReadOptions;
use pgmq_client::{Client, GroupStrategy, Message, SendOptions};
use serde_json::json;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Record};
use tracing::{Event, Id, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

use common::Queues;

/// Everything recorded: `(span or event name, field, value)`.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<(String, String, String)>>>);

struct Collect<'a> {
    name: &'a str,
    out: &'a Captured,
}

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.out.0.lock().unwrap().push((
            self.name.to_owned(),
            field.name().to_owned(),
            format!("{value:?}"),
        ));
    }
}

impl<S: Subscriber> Layer<S> for Captured {
    fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {
        let name = attrs.metadata().name();
        self.0
            .lock()
            .unwrap()
            .push((name.to_owned(), String::new(), String::new()));
        attrs.record(&mut Collect { name, out: self });
    }

    fn on_record(&self, _id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        values.record(&mut Collect {
            name: "record",
            out: self,
        });
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        event.record(&mut Collect {
            name: event.metadata().name(),
            out: self,
        });
    }
}

#[tokio::test]
async fn spans_name_calls_and_queues_but_never_payloads_or_passwords() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    let _default = tracing::subscriber::set_default(subscriber);

    let secret = "S3CRET-PAYLOAD";
    let password = "pgmq"; // the test role's; checked as `:pgmq@` below
    let client: Client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "trace").await;
    let body = json!({"card": secret});
    let opts = SendOptions::new().headers(json!({"h": secret}));
    client.send_with(&q, &body, &opts).await.unwrap();
    client
        .send_batch_with(
            &q,
            &[body.clone(), body.clone()],
            &pgmq_client::SendOptions::new()
                .headers_each([json!({"h": secret}), json!({"h": secret})].to_vec()),
        )
        .await
        .unwrap();
    let got: Vec<Message> = common::ok(
        client
            .read_with(
                &q,
                &ReadOptions::new(Duration::from_secs(30))
                    .qty(10)
                    .filter(json!({"card": secret})),
            )
            .await
            .unwrap(),
    );
    assert_eq!(got.len(), 3);
    let ids = common::ids(&got);
    client.set_vt_batch(&q, &ids, Duration::ZERO).await.unwrap();
    let _: Vec<Message> = common::ok(
        client
            .read_grouped(
                &q,
                GroupStrategy::Fill,
                &ReadOptions::new(Duration::from_secs(30)).qty(10),
            )
            .await
            .unwrap(),
    );
    client.archive(&q, ids[0]).await.unwrap();
    client.delete_batch(&q, &ids[1..]).await.unwrap();
    let k = format!("k{}", q.as_str());
    client.bind_topic(&format!("{k}.*"), &q).await.unwrap();
    client.send_topic(&format!("{k}.x"), &body).await.unwrap();
    client
        .send_batch_topic(&format!("{k}.x"), std::slice::from_ref(&body))
        .await
        .unwrap();
    let _: Vec<Message> = common::ok(client.pop(&q, 10).await.unwrap());
    // A failing call's error is not recorded with its payload either.
    let missing = qs.name("trace_missing");
    let _ = client.send(&missing, &body).await;
    let _ = client.read::<u64>(&q, Duration::from_secs(1), 1).await;
    let _ = Client::connect(&format!("postgres://pgmq:{secret}@127.0.0.1:1/pgmq")).await;

    let all = captured.0.lock().unwrap().clone();
    for (name, field, value) in &all {
        assert!(
            !value.contains(secret),
            "{name}.{field} recorded a payload: {value}"
        );
        assert!(
            !value.contains(&format!(":{password}@")),
            "{name}.{field} recorded a password"
        );
    }
    let spans: Vec<&str> = all
        .iter()
        .filter(|(_, f, _)| f.is_empty())
        .map(|(n, _, _)| n.as_str())
        .collect();
    for expected in [
        "pgmq.create",
        "pgmq.send",
        "pgmq.send_batch",
        "pgmq.read",
        "pgmq.set_vt_batch",
        "pgmq.read_grouped",
        "pgmq.archive",
        "pgmq.delete_batch",
        "pgmq.bind_topic",
        "pgmq.send_topic",
        "pgmq.send_batch_topic",
        "pgmq.pop",
    ] {
        assert!(spans.contains(&expected), "no {expected} span in {spans:?}");
    }
    let field = |span: &str, f: &str| -> Vec<String> {
        all.iter()
            .filter(|(n, fld, _)| n == span && fld == f)
            .map(|(_, _, v)| v.clone())
            .collect()
    };
    assert!(field("pgmq.send", "queue").contains(&q.as_str().to_owned()));
    assert!(field("pgmq.send_batch", "batch").contains(&"2".to_owned()));
    assert!(field("pgmq.read", "qty").contains(&"10".to_owned()));
}
