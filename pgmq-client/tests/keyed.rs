//! Idempotent sends against the real database: duplicates within the
//! window, the window's end, batches, topics, transactions that commit or
//! roll back, producers racing on one key, the cleanup of expired keys,
//! and bad input.

mod common;

use std::sync::Arc;
use std::time::Duration;

use pgmq_client::{Client, DedupKey, Error, Pgmq, SendOptions};
use serde_json::json;

use common::Queues;

const HOUR: Duration = Duration::from_secs(3600);

async fn client() -> Client {
    let client = common::client().await;
    client.install_sdk_schema().await.unwrap();
    client
}

/// A key no other test (or run) uses.
fn key(name: &str) -> String {
    format!("{name}-{}", common::unique("k").as_str())
}

async fn count(q: &pgmq_client::QueueName) -> i64 {
    common::scalar(
        &common::raw().await,
        &format!("SELECT count(*) FROM pgmq.q_{}", q.as_str()),
        &[],
    )
    .await
}

#[tokio::test]
async fn a_second_send_with_the_key_enqueues_nothing() {
    let client = client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "ky_one").await;
    let other = qs.fresh(&client, "ky_other").await;
    let k = DedupKey::new(key("order"), HOUR);

    let first = client.send_keyed(&q, &k, &json!({"n": 1})).await.unwrap();
    assert!(!first.duplicate);
    let again = client.send_keyed(&q, &k, &json!({"n": 2})).await.unwrap();
    assert_eq!(again.msg_id, first.msg_id);
    assert!(again.duplicate);
    assert_eq!(count(&q).await, 1);
    let msgs = client
        .read::<serde_json::Value>(&q, HOUR, 10)
        .await
        .unwrap();
    assert_eq!(
        common::ok(msgs)[0].body,
        json!({"n": 1}),
        "the first body is kept"
    );

    // The key is per queue.
    let elsewhere = client.send_keyed(&other, &k, &json!(3)).await.unwrap();
    assert!(!elsewhere.duplicate);
    // A duplicate still answers after its message was consumed.
    client.delete(&q, first.msg_id).await.unwrap();
    let late = client.send_keyed(&q, &k, &json!(4)).await.unwrap();
    assert_eq!((late.msg_id, late.duplicate), (first.msg_id, true));
    assert_eq!(count(&q).await, 0);
}

#[tokio::test]
async fn after_the_window_the_key_is_free_again() {
    let client = client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "ky_window").await;
    let k = DedupKey::new(key("w"), Duration::from_millis(300));
    let first = client.send_keyed(&q, &k, &json!(1)).await.unwrap();
    let within = client.send_keyed(&q, &k, &json!(2)).await.unwrap();
    assert!(within.duplicate);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let after = client.send_keyed(&q, &k, &json!(3)).await.unwrap();
    assert!(!after.duplicate);
    assert_ne!(after.msg_id, first.msg_id);
    assert_eq!(count(&q).await, 2);
}

#[tokio::test]
async fn a_batch_sends_each_free_key_once_in_order() {
    let client = client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "ky_batch").await;
    let (a, b, c) = (key("a"), key("b"), key("c"));
    let earlier = client
        .send_keyed(&q, &DedupKey::new(b.clone(), HOUR), &json!("b0"))
        .await
        .unwrap();
    let keys = [a.clone(), b.clone(), a.clone(), c.clone()];
    let bodies = [json!("a1"), json!("b1"), json!("a2"), json!("c1")];
    let opts = SendOptions::new().headers_each(vec![
        json!({"h": 1}),
        json!({"h": 2}),
        json!({"h": 3}),
        json!({"h": 4}),
    ]);
    let sent = client
        .send_batch_keyed(&q, &keys, HOUR, &bodies, &opts)
        .await
        .unwrap();
    let dup: Vec<bool> = sent.iter().map(|s| s.duplicate).collect();
    assert_eq!(dup, [false, true, true, false]);
    assert_eq!(sent[1].msg_id, earlier.msg_id);
    assert_eq!(
        sent[2].msg_id, sent[0].msg_id,
        "the batch's own earlier message"
    );
    assert!(sent[3].msg_id > sent[0].msg_id);
    let msgs = common::ok(
        client
            .read::<serde_json::Value>(&q, HOUR, 10)
            .await
            .unwrap(),
    );
    let mut got: Vec<(serde_json::Value, serde_json::Value)> = msgs
        .iter()
        .map(|m| (m.body.clone(), m.headers.clone().unwrap_or_default()))
        .collect();
    got.sort_by_key(|(b, _)| b.to_string());
    assert_eq!(
        got,
        [
            (json!("a1"), json!({"h": 1})),
            (json!("b0"), json!(null)),
            (json!("c1"), json!({"h": 4}))
        ]
    );
    // Empty batch: nothing, no SQL needed.
    let none: Vec<String> = Vec::new();
    let empty: Vec<serde_json::Value> = Vec::new();
    assert!(client
        .send_batch_keyed(&q, &none, HOUR, &empty, &SendOptions::new())
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn a_rolled_back_send_leaves_its_key_free() {
    let client = client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "ky_tx").await;
    let k = DedupKey::new(key("tx"), HOUR);
    {
        let mut conn = client.connection().await.unwrap();
        let tx = conn.transaction().await.unwrap();
        let s = Pgmq::on(&tx).send_keyed(&q, &k, &json!(1)).await.unwrap();
        assert!(!s.duplicate);
        tx.rollback().await.unwrap();
    }
    assert_eq!(count(&q).await, 0);
    let first = {
        let mut conn = client.connection().await.unwrap();
        let tx = conn.transaction().await.unwrap();
        let s = Pgmq::on(&tx).send_keyed(&q, &k, &json!(2)).await.unwrap();
        assert!(!s.duplicate, "the rolled-back key is free");
        tx.commit().await.unwrap();
        s
    };
    let again = client.send_keyed(&q, &k, &json!(3)).await.unwrap();
    assert_eq!((again.msg_id, again.duplicate), (first.msg_id, true));
    assert_eq!(count(&q).await, 1);
}

/// Inside a caller's transaction a taken key answers "duplicate" and the
/// transaction goes on: the send never runs a statement that fails on a
/// taken key there (a failed statement would abort the caller's work).
#[tokio::test]
async fn a_taken_key_inside_a_transaction_leaves_it_usable() {
    let client = client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "ky_txdup").await;
    let (a, b) = (key("a"), key("b"));
    let first = client
        .send_keyed(&q, &DedupKey::new(a.clone(), HOUR), &json!("a0"))
        .await
        .unwrap();
    let mut conn = client.connection().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    let pg = Pgmq::on(&tx);
    let again = pg
        .send_keyed(&q, &DedupKey::new(a.clone(), HOUR), &json!("a1"))
        .await
        .unwrap();
    assert_eq!((again.msg_id, again.duplicate), (first.msg_id, true));
    let sent = pg
        .send_batch_keyed(
            &q,
            &[&a, &b],
            HOUR,
            &[json!("a2"), json!("b1")],
            &SendOptions::new(),
        )
        .await
        .unwrap();
    assert_eq!((sent[0].msg_id, sent[0].duplicate), (first.msg_id, true));
    assert!(!sent[1].duplicate);
    pg.send(&q, &json!("plain")).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(count(&q).await, 3);
}

/// Keyed sends keep their delay, given in seconds or as a time, on the
/// first try of fresh keys and after a taken one.
#[tokio::test]
async fn keyed_sends_keep_their_delay() {
    let client = client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "ky_delay").await;
    let taken = key("taken");
    client
        .send_keyed(&q, &DedupKey::new(taken.clone(), HOUR), &json!(0))
        .await
        .unwrap();
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    for opts in [
        SendOptions::new().delay(HOUR),
        SendOptions::new().delay(later),
    ] {
        let one = client
            .send_keyed_with(&q, &DedupKey::new(key("one"), HOUR), &json!(1), &opts)
            .await
            .unwrap();
        assert!(!one.duplicate);
        let fresh = [key("b1"), key("b2")];
        let sent = client
            .send_batch_keyed(&q, &fresh, HOUR, &[json!(2), json!(3)], &opts)
            .await
            .unwrap();
        assert!(sent.iter().all(|s| !s.duplicate));
        let mixed = [key("m1"), taken.clone()];
        let sent = client
            .send_batch_keyed(&q, &mixed, HOUR, &[json!(4), json!(5)], &opts)
            .await
            .unwrap();
        assert_eq!(
            sent.iter().map(|s| s.duplicate).collect::<Vec<_>>(),
            [false, true]
        );
    }
    // The first message (no delay) is visible; the eight delayed are not.
    assert_eq!(count(&q).await, 9);
    let visible = client.read_raw(&q, HOUR, 20).await.unwrap();
    assert_eq!(visible.len(), 1);
}

#[tokio::test]
async fn producers_racing_on_one_key_store_one_message() {
    let client = pgmq_client::ClientBuilder::new(&common::dsn())
        .max_size(16)
        .connect()
        .await
        .unwrap();
    client.install_sdk_schema().await.unwrap();
    let qs = Queues::new();
    let q = qs.fresh(&client, "ky_race").await;
    for round in 0..5 {
        let k = DedupKey::new(key(&format!("race{round}")), HOUR);
        let start = Arc::new(tokio::sync::Barrier::new(16));
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let (client, q, k, start) = (client.clone(), q.clone(), k.clone(), start.clone());
                tokio::spawn(async move {
                    // Hold a connection first, so the 16 sends go out together.
                    let conn = client.connection_owned().await.unwrap();
                    start.wait().await;
                    Pgmq::on(&*conn)
                        .send_keyed(&q, &k, &json!(i))
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut sent = Vec::new();
        for t in tasks {
            sent.push(t.await.unwrap());
        }
        assert_eq!(sent.iter().filter(|s| !s.duplicate).count(), 1, "{sent:?}");
        assert!(sent.iter().all(|s| s.msg_id == sent[0].msg_id), "{sent:?}");
    }
    assert_eq!(count(&q).await, 5);

    // A sender whose transaction is still open makes the others wait; they
    // take the key when it rolls back.
    let k = DedupKey::new(key("held"), HOUR);
    let mut conn = client.connection().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    Pgmq::on(&tx)
        .send_keyed(&q, &k, &json!("held"))
        .await
        .unwrap();
    let waiter = {
        let (client, q, k) = (client.clone(), q.clone(), k.clone());
        tokio::spawn(async move { client.send_keyed(&q, &k, &json!("waiter")).await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the second send waits on the key");
    tx.rollback().await.unwrap();
    let w = waiter.await.unwrap();
    assert!(!w.duplicate);
    assert_eq!(count(&q).await, 6);
}

#[tokio::test]
async fn batches_racing_on_shared_keys_store_each_key_once() {
    let client = pgmq_client::ClientBuilder::new(&common::dsn())
        .max_size(8)
        .connect()
        .await
        .unwrap();
    client.install_sdk_schema().await.unwrap();
    let qs = Queues::new();
    let q = qs.fresh(&client, "ky_batch_race").await;
    const KEYS: usize = 20;
    for round in 0..4 {
        let keys: Vec<String> = (0..KEYS).map(|i| key(&format!("r{round}-{i}"))).collect();
        let start = Arc::new(tokio::sync::Barrier::new(8));
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let (client, q, start) = (client.clone(), q.clone(), start.clone());
                // Half the senders list the keys backwards: the keys are
                // taken in one order all the same, so no deadlock.
                let mut keys = keys.clone();
                if t % 2 == 1 {
                    keys.reverse();
                }
                tokio::spawn(async move {
                    let conn = client.connection_owned().await.unwrap();
                    let bodies: Vec<_> = keys.iter().map(|k| json!({"k": k, "t": t})).collect();
                    start.wait().await;
                    let sent = Pgmq::on(&*conn)
                        .send_batch_keyed(&q, &keys, HOUR, &bodies, &SendOptions::new())
                        .await
                        .unwrap();
                    keys.into_iter().zip(sent).collect::<Vec<_>>()
                })
            })
            .collect();
        let mut by_key: std::collections::HashMap<String, Vec<pgmq_client::Sent>> =
            std::collections::HashMap::new();
        for t in tasks {
            for (k, s) in t.await.unwrap() {
                by_key.entry(k).or_default().push(s);
            }
        }
        assert_eq!(by_key.len(), KEYS);
        for (k, sent) in &by_key {
            assert_eq!(
                sent.iter().filter(|s| !s.duplicate).count(),
                1,
                "{k}: {sent:?}"
            );
            assert!(
                sent.iter().all(|s| s.msg_id == sent[0].msg_id),
                "{k}: {sent:?}"
            );
        }
    }
    assert_eq!(count(&q).await, 4 * KEYS as i64);

    // A batch of new keys and one expired key: each sent, the expired
    // key taken over with the new message's id.
    let old = key("expired");
    let short = DedupKey::new(old.clone(), Duration::from_millis(200));
    let first = client.send_keyed(&q, &short, &json!("old")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let keys = [key("n1"), old.clone(), key("n2")];
    let sent = client
        .send_batch_keyed(
            &q,
            &keys,
            HOUR,
            &[json!(1), json!(2), json!(3)],
            &SendOptions::new(),
        )
        .await
        .unwrap();
    assert!(sent.iter().all(|s| !s.duplicate), "{sent:?}");
    assert!(sent[1].msg_id > first.msg_id);
    assert!(sent[0].msg_id < sent[1].msg_id && sent[1].msg_id < sent[2].msg_id);
    let again = client
        .send_keyed(&q, &DedupKey::new(old, HOUR), &json!("again"))
        .await
        .unwrap();
    assert_eq!((again.msg_id, again.duplicate), (sent[1].msg_id, true));
}

#[tokio::test]
async fn a_topic_send_under_a_key_routes_once() {
    let client = client().await;
    let qs = Queues::new();
    let a = qs.fresh(&client, "ky_ta").await;
    let b = qs.fresh(&client, "ky_tb").await;
    let rk = format!("k{}", a.as_str());
    client.bind_topic(&format!("{rk}.#"), &a).await.unwrap();
    client.bind_topic(&format!("{rk}.#"), &b).await.unwrap();
    let k = DedupKey::new(key("topic"), HOUR);
    let opts = SendOptions::new();
    let first = client
        .send_topic_keyed(&format!("{rk}.created"), &k, &json!(1), &opts)
        .await
        .unwrap();
    assert_eq!((first.queues, first.duplicate), (2, false));
    let again = client
        .send_topic_keyed(&format!("{rk}.created"), &k, &json!(2), &opts)
        .await
        .unwrap();
    assert_eq!((again.queues, again.duplicate), (2, true));
    // Another routing key is another scope.
    let other = client
        .send_topic_keyed(&format!("{rk}.updated"), &k, &json!(3), &opts)
        .await
        .unwrap();
    assert!(!other.duplicate);
    assert_eq!((count(&a).await, count(&b).await), (2, 2));
    client.unbind_topic(&format!("{rk}.#"), &a).await.unwrap();
    client.unbind_topic(&format!("{rk}.#"), &b).await.unwrap();
}

/// Expired keys are deleted apart from the sends: by the client's own
/// housekeeping after a keyed send, or by `expire_send_keys`.
#[tokio::test]
async fn expired_keys_are_deleted_apart_from_the_sends() {
    let client = client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "ky_expire").await;
    let keys: Vec<String> = (0..50).map(|i| key(&format!("e{i}"))).collect();
    let bodies: Vec<i32> = (0..50).collect();
    let send_expiring = || async {
        client
            .send_batch_keyed(
                &q,
                &keys,
                Duration::from_millis(1),
                &bodies,
                &SendOptions::new(),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    send_expiring().await;
    let pg = common::raw().await;
    let table = q.table_name();
    let left = || async {
        common::scalar::<i64>(
            &pg,
            &format!(
                "SELECT count(*) FROM pgmq_sdk.queue_keys WHERE queue_relid = 'pgmq.{table}'::regclass"
            ),
            &[],
        )
        .await
    };
    // Other tests' keys may be expiring too: call until these are gone.
    let mut calls = 0;
    while left().await > 0 && calls < 100 {
        client.expire_send_keys(10_000).await.unwrap();
        calls += 1;
    }
    assert_eq!(left().await, 0, "expired keys stay after {calls} calls");

    // A client's first keyed send runs a housekeeping pass after it.
    send_expiring().await;
    let fresh = common::client().await;
    fresh
        .send_keyed(&q, &DedupKey::new(key("x"), HOUR), &json!(0))
        .await
        .unwrap();
    assert!(
        left().await <= 1,
        "a fresh client's send left the expired keys"
    );
}

#[tokio::test]
async fn bad_keys_and_windows_are_refused_before_any_sql() {
    let client = client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "ky_bad").await;
    let cases = [
        DedupKey::new("", HOUR),
        DedupKey::new("x".repeat(513), HOUR),
        DedupKey::new("ok", Duration::ZERO),
    ];
    for k in &cases {
        let e = client.send_keyed(&q, k, &json!(1)).await.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    }
    let e = client
        .send_keyed(&q, &DedupKey::new("nul\0", HOUR), &json!(1))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::UnstorableText { .. }), "{e:?}");
    let e = client
        .send_batch_keyed(&q, &["a"], HOUR, &[1, 2], &SendOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let e = client
        .send_keyed(
            &pgmq_client::QueueName::new("ky_missing_q").unwrap(),
            &DedupKey::new(key("m"), HOUR),
            &json!(1),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, Error::QueueNotFound { .. }), "{e:?}");
    assert_eq!(count(&q).await, 0);
}
