//! Batch sends of uneven sizes, and bodies or headers PostgreSQL cannot
//! store (a NUL character): typed errors, never an abort or a partial send.

mod common;

use common::Queues;
use pgmq_client::{CommitOutcome, Error, SendOptions};
use serde_json::json;
use serde_json::value::RawValue;

/// The peak resident set of this process so far (VmHWM), in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status")
}

#[tokio::test]
async fn a_large_first_body_does_not_size_the_whole_batch() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "big_first").await;
    let mut bodies = vec![json!("x".repeat(5 << 20))];
    bodies.extend((1..10_000).map(|i| json!({ "i": i })));
    let before = peak_rss_kib();
    let ids = client.send_batch(&q, &bodies).await.unwrap();
    let grown_mib = (peak_rss_kib() - before) / 1024;
    assert_eq!(ids.len(), 10_000);
    // The batch is about 5 MB of JSON; a buffer sized at the first body for
    // every message would be about 50 GB.
    assert!(grown_mib < 512, "peak memory grew by {grown_mib} MiB");
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 10_000);
}

#[tokio::test]
async fn a_batch_over_the_protocol_limit_is_refused_before_sending() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "too_big").await;
    // 17 bodies of 64 MiB (one value, borrowed 17 times): 1.06 GiB of
    // JSON, over a Bind message's 1 GiB.
    let body = RawValue::from_string(format!("\"{}\"", "y".repeat(64 << 20))).unwrap();
    let bodies = vec![&*body; 17];
    let err = client.send_batch(&q, &bodies).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(err.to_string().contains("smaller batches"), "{err}");
    assert_eq!(err.outcome(), CommitOutcome::NotSent);
    // Common headers repeated for each message count too.
    let opts = SendOptions::new().headers(json!({ "h": "z".repeat(1 << 20) }));
    let err = client
        .send_batch_with(&q, &vec![json!(1); 1_100], &opts)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 0);
}

#[tokio::test]
async fn a_nul_in_a_batch_names_the_message_and_sends_nothing() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "nul_batch").await;
    let bodies = [json!("fine"), json!({ "k": "a\u{0}b" }), json!(3)];
    let err = client.send_batch(&q, &bodies).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnstorableText {
                index: Some(1),
                field: Some("body"),
                source: None,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("message 1"), "{err}");
    assert_eq!(err.outcome(), CommitOutcome::NotSent);

    // In a key, and in per-message headers.
    let err = client
        .send_batch(&q, &[json!({ "k\u{0}": 1 })])
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::UnstorableText { index: Some(0), .. }),
        "{err:?}"
    );
    let opts = SendOptions::new().headers_each(vec![json!({}), json!({ "h": "\u{0}" })]);
    let err = client
        .send_batch_with(&q, &[json!(1), json!(2)], &opts)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnstorableText {
                index: Some(1),
                field: Some("headers"),
                ..
            }
        ),
        "{err:?}"
    );

    // A single send, body or headers.
    let err = client.send(&q, &json!("\u{0}")).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnstorableText {
                index: None,
                field: Some("body"),
                ..
            }
        ),
        "{err:?}"
    );
    let opts = SendOptions::new().headers(json!({ "h": "\u{0}" }));
    let err = client.send_with(&q, &json!(1), &opts).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnstorableText {
                field: Some("headers"),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 0);

    // A backslash followed by the text u0000 is no NUL.
    let id = client.send(&q, &json!("\\u0000")).await.unwrap();
    let m = client
        .read::<serde_json::Value>(&q, std::time::Duration::from_secs(30), 1)
        .await
        .unwrap();
    let m = m.into_iter().next().unwrap().unwrap();
    assert_eq!(m.msg_id, id);
    assert_eq!(m.body, json!("\\u0000"));
}

#[tokio::test]
async fn the_servers_refusal_of_a_nul_is_the_same_typed_error() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "nul_server").await;
    // A text argument with a zero byte, as the server sees it.
    let err = client.send_topic("a\u{0}b", &json!(1)).await.unwrap_err();
    assert!(
        matches!(err, Error::UnstorableText { index: None, .. }),
        "{err:?}"
    );
    assert_eq!(err.sqlstate().map(|c| c.code()), Some("22021"));
    assert_eq!(err.outcome(), CommitOutcome::Rejected);
    // jsonb's own refusal of \u0000, on a caller's SQL.
    let conn = client.connection().await.unwrap();
    let err: Error = conn
        .query_one("SELECT '\"\\u0000\"'::jsonb::text", &[])
        .await
        .unwrap_err()
        .into();
    assert!(matches!(err, Error::UnstorableText { .. }), "{err:?}");
    assert_eq!(err.sqlstate().map(|c| c.code()), Some("22P05"));
    let _ = q;
}
