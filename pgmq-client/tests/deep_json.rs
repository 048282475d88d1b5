//! JSON nested deeper than serde_json's recursion limit (128 levels):
//! PostgreSQL accepts it, so a queue can hold it. One such message must not
//! fail reads of the messages around it, and code that only forwards bodies
//! (`read_raw`, `set_vt_raw`) must get them back intact.

mod common;

use std::time::Duration;

use pgmq_client::{Delay, Error};

fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

#[tokio::test]
async fn deep_bodies_and_headers_do_not_fail_their_batch() {
    let client = common::client().await;
    let queues = common::Queues::new();
    let q = queues.fresh(&client, "deep").await;
    let deep = nested(10_000);
    let pg = common::raw().await;
    let send = "select pgmq.send($1, $2::text::jsonb, $3::text::jsonb, 0)";
    let good = client.send(&q, &serde_json::json!({"n": 1})).await.unwrap();
    pg.execute(send, &[&q.as_str(), &deep, &r#"{"h": 1}"#])
        .await
        .unwrap();
    let deep_headers = format!(r#"{{"trace": {deep}}}"#);
    pg.execute(send, &[&q.as_str(), &r#"{"n": 3}"#, &deep_headers])
        .await
        .unwrap();

    // The whole batch reads; bodies come back as sent.
    let batch = client
        .read_raw(&q, Duration::from_secs(30), 10)
        .await
        .unwrap();
    assert_eq!(batch.len(), 3);
    assert_eq!(batch[0].msg_id, good);
    assert_eq!(batch[1].body.get().len(), deep.len());
    // Headers too deep for a serde_json::Value arrive as their text.
    let h = batch[2].headers.as_ref().unwrap();
    assert!(h
        .as_str()
        .is_some_and(|t| t.starts_with(r#"{"trace": [[["#)));
    assert_eq!(batch[2].body.get(), r#"{"n": 3}"#);

    // Decoding the deep body is a typed error for that message only.
    let err = batch[1].clone().decode::<serde_json::Value>().unwrap_err();
    assert!(matches!(err, Error::Deserialize { msg_id, .. } if msg_id == batch[1].msg_id));

    // set_vt_raw gives the deep body back intact; set_vt fails on it, typed.
    let raw = client
        .set_vt_raw(&q, batch[1].msg_id, Delay::NONE)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(raw.body.get().len(), deep.len());
    let err = client
        .set_vt(&q, batch[1].msg_id, Delay::NONE)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Deserialize { .. }), "{err:?}");
    // Forwarding the raw body elsewhere keeps it whole.
    let copy = queues.fresh(&client, "deep_copy").await;
    client.send(&copy, &raw.body).await.unwrap();
    let back = client
        .read_raw(&copy, Duration::from_secs(30), 1)
        .await
        .unwrap();
    assert_eq!(back[0].body.get().len(), deep.len());
}
