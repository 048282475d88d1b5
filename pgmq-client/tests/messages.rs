//! Sending, reading and acknowledging on the pool: batch sizes 1 and 1,000,
//! delays, headers, filters, polling, pop, archive, set_vt, typed payloads.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::Utc;
use pgmq_client::{
    Client, Delay, Error, Message, QueueName, RawJson, ReadFrom, ReadOptions, SendOptions,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use common::Queues;

const VT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u64,
    item: String,
}

/// Reads until `want` messages arrived or `within` passes.
async fn read_within(
    client: &Client,
    q: &QueueName,
    want: usize,
    within: Duration,
) -> Vec<Message> {
    let start = Instant::now();
    let mut got: Vec<Message> = Vec::new();
    while got.len() < want && start.elapsed() < within {
        got.extend(common::ok(client.read::<Value>(q, VT, 10).await.unwrap()));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    got
}

/// The batch acknowledgements return only the ids that existed: one already
/// gone, one never sent.
#[tokio::test]
async fn batch_acks_return_only_what_existed() {
    let client = common::client().await;
    let qs = Queues::new();
    let pg = common::raw().await;
    let q = qs.fresh(&client, "existed").await;
    let ids = client
        .send_batch(&q, &[json!(1), json!(2), json!(3), json!(4)])
        .await
        .unwrap();
    let missing = ids[3] + 1000;
    let mut archived = client
        .archive_batch(&q, &[ids[0], ids[1], missing])
        .await
        .unwrap();
    archived.sort_unstable();
    assert_eq!(archived, [ids[0], ids[1]]);
    let mut deleted = client
        .delete_batch(&q, &[ids[1], ids[2], ids[3], missing])
        .await
        .unwrap();
    deleted.sort_unstable();
    assert_eq!(deleted, [ids[2], ids[3]]);
    assert!(common::queue_rows(&pg, &q).await.is_empty());
    assert_eq!(common::archive_rows(&pg, &q).await.len(), 2);
}

#[tokio::test]
async fn batches_of_one_and_a_thousand() {
    let client = common::client().await;
    let qs = Queues::new();
    let pg = common::raw().await;
    for n in [1usize, 1000] {
        let q = qs.fresh(&client, "batch").await;
        let bodies: Vec<Order> = (0..n as u64)
            .map(|id| Order {
                id,
                item: format!("item {id}"),
            })
            .collect();
        let ids = client.send_batch(&q, &bodies).await.unwrap();
        assert_eq!(ids.len(), n);
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "ids come back in order"
        );
        assert_eq!(client.metrics(&q).await.unwrap().queue_length, n as i64);

        let got: Vec<Message<Order>> = common::ok(client.read(&q, VT, n).await.unwrap());
        assert_eq!(got.len(), n);
        let mut by_id: HashMap<i64, Order> = got.into_iter().map(|m| (m.msg_id, m.body)).collect();
        for (id, body) in ids.iter().zip(&bodies) {
            assert_eq!(by_id.remove(id).as_ref(), Some(body));
        }

        // Half archived, the rest deleted, all in batches.
        let (to_archive, to_delete) = ids.split_at(n / 2);
        assert_eq!(
            client
                .set_vt_batch(&q, &ids, Duration::ZERO)
                .await
                .unwrap()
                .len(),
            n
        );
        assert_eq!(
            client.archive_batch(&q, to_archive).await.unwrap().len(),
            to_archive.len()
        );
        let mut deleted = client.delete_batch(&q, to_delete).await.unwrap();
        deleted.sort_unstable();
        assert_eq!(deleted, to_delete);
        assert!(common::queue_rows(&pg, &q).await.is_empty());
        assert_eq!(common::archive_rows(&pg, &q).await.len(), to_archive.len());
    }
    // Empty batches do nothing, without a round trip.
    let q = qs.name("never_created");
    assert!(client
        .send_batch::<Value>(&q, &[])
        .await
        .unwrap()
        .is_empty());
    assert!(client.delete_batch(&q, &[]).await.unwrap().is_empty());
    assert!(client.archive_batch(&q, &[]).await.unwrap().is_empty());
    assert!(client
        .set_vt_batch(&q, &[], Duration::ZERO)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn delay_in_seconds() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "delay_s").await;
    let before = Instant::now();
    let opts = SendOptions::new().delay(Duration::from_secs(2));
    let id = client.send_with(&q, &json!({"d": 1}), &opts).await.unwrap();
    let ids = client
        .send_batch_with(
            &q,
            &[json!(1), json!(2)],
            &SendOptions::new().delay(std::time::Duration::from_secs(2)),
        )
        .await
        .unwrap();
    let early: Vec<Message> = common::ok(client.read(&q, VT, 10).await.unwrap());
    assert!(early.is_empty(), "invisible before the delay: {early:?}");
    assert_eq!(client.metrics(&q).await.unwrap().queue_visible_length, 0);
    let got = read_within(&client, &q, 3, Duration::from_secs(5)).await;
    let mut got_ids = common::ids(&got);
    got_ids.sort_unstable();
    assert_eq!(got_ids, [id, ids[0], ids[1]]);
    assert!(before.elapsed() >= Duration::from_millis(1900));
}

#[tokio::test]
async fn delay_until_a_timestamp() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "delay_at").await;
    let at = Utc::now() + chrono::Duration::milliseconds(2000);
    let id = client
        .send_with(&q, &json!({"d": 1}), &SendOptions::new().delay(at))
        .await
        .unwrap();
    let ids = client
        .send_batch_with(&q, &[json!(1)], &SendOptions::new().delay(at))
        .await
        .unwrap();
    let early: Vec<Message> = common::ok(client.read(&q, VT, 10).await.unwrap());
    assert!(early.is_empty());
    let got = read_within(&client, &q, 2, Duration::from_secs(5)).await;
    assert!(Utc::now() >= at);
    let mut got_ids = common::ids(&got);
    got_ids.sort_unstable();
    assert_eq!(got_ids, [id, ids[0]]);
    assert!(got.iter().all(|m| m.enqueued_at < at));
}

/// A header struct of the caller's sent with `SendOptions::headers_from`
/// comes back equal through `Message::headers_as`, on a single send and on
/// every message of a batch.
#[tokio::test]
async fn typed_headers_round_trip() {
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Meta {
        tenant: String,
        priority: u8,
        tags: Vec<String>,
        parent: Option<i64>,
    }
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "typed_headers").await;
    let meta = Meta {
        tenant: "acme".into(),
        priority: 3,
        tags: vec!["ünï".into(), "b".into()],
        parent: None,
    };
    let opts = SendOptions::new().headers_from(&meta).unwrap();
    let one = client.send_with(&q, &json!(1), &opts).await.unwrap();
    let batch = client
        .send_batch_with(&q, &[json!(2), json!(3)], &opts)
        .await
        .unwrap();
    let got: Vec<Message> = common::ok(client.read::<Value>(&q, VT, 10).await.unwrap());
    let mut ids: Vec<i64> = got.iter().map(|m| m.msg_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [one, batch[0], batch[1]]);
    for m in &got {
        assert_eq!(m.headers_as::<Meta>().unwrap(), Some(meta.clone()));
    }
}

#[tokio::test]
async fn headers_round_trip() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "headers").await;
    let h = json!({"trace": "abc", "nested": {"n": [1, 2, 3]}, "unicode": "ünï"});
    let with = client
        .send_with(&q, &json!({"b": 1}), &SendOptions::new().headers(h.clone()))
        .await
        .unwrap();
    let without = client.send(&q, &json!({"b": 2})).await.unwrap();
    let hs = [json!({"i": 0}), json!({"i": 1})];
    let batch = client
        .send_batch_with(
            &q,
            &[json!({"b": 3}), json!({"b": 4})],
            &SendOptions::new().headers_each(hs.to_vec()),
        )
        .await
        .unwrap();
    let got: HashMap<i64, Message> = client
        .read::<Value>(&q, VT, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.unwrap())
        .map(|m| (m.msg_id, m))
        .collect();
    assert_eq!(got[&with].headers.as_ref(), Some(&h));
    assert_eq!(got[&with].header("trace"), Some(&json!("abc")));
    // Typed headers: decoded into a struct, None without headers.
    #[derive(Debug, PartialEq, Deserialize)]
    struct Trace {
        trace: String,
    }
    assert_eq!(
        got[&with].headers_as::<Trace>().unwrap(),
        Some(Trace {
            trace: "abc".into()
        })
    );
    assert_eq!(got[&without].headers_as::<Trace>().unwrap(), None);
    let err = got[&batch[0]].headers_as::<Trace>().unwrap_err();
    assert!(matches!(err, Error::DeserializeHeaders { .. }), "{err:?}");
    assert_eq!(got[&without].headers, None);
    assert_eq!(got[&without].header("trace"), None);
    assert_eq!(got[&batch[0]].headers, Some(hs[0].clone()));
    assert_eq!(got[&batch[1]].headers, Some(hs[1].clone()));
    // The same headers for every message of a batch.
    let shared = json!({"tenant": "acme"});
    let ids = client
        .send_batch_with(&q, &[5, 6], &SendOptions::new().headers(shared.clone()))
        .await
        .unwrap();
    let got: Vec<Message> = common::ok(client.read::<Value>(&q, VT, 10).await.unwrap());
    assert_eq!(got.len(), 2);
    for m in &got {
        assert!(ids.contains(&m.msg_id));
        assert_eq!(m.headers.as_ref(), Some(&shared));
    }
    // Both kinds of headers, or per-message headers on one message: refused.
    let both = SendOptions::new()
        .headers(shared.clone())
        .headers_each(hs.to_vec());
    let err = client
        .send_batch_with(&q, &[1, 2], &both)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let each = SendOptions::new().headers_each(hs.to_vec());
    let err = client.send_with(&q, &1, &each).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    // Wrong number of headers: refused before any SQL.
    let err = client
        .send_batch_with(
            &q,
            &[1, 2],
            &SendOptions::new().headers_each(hs[..1].to_vec()),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
}

#[tokio::test]
async fn message_fields() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "fields").await;
    let before = Utc::now() - chrono::Duration::seconds(1);
    let id = client
        .send(
            &q,
            &Order {
                id: 7,
                item: "tea".into(),
            },
        )
        .await
        .unwrap();
    let m = client
        .read::<Order>(&q, VT, 1)
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(m.msg_id, id);
    assert_eq!(m.read_ct, 1);
    assert_eq!(m.body.item, "tea");
    assert!(m.enqueued_at >= before);
    let last = m.last_read_at.expect("read sets last_read_at");
    assert!(last >= m.enqueued_at);
    let vt_secs = (m.vt - last).num_seconds();
    assert!(
        (29..=31).contains(&vt_secs),
        "vt is 30 s after the read: {vt_secs}"
    );
    client.set_vt(&q, id, Duration::ZERO).await.unwrap();
    let m = client
        .read::<Order>(&q, VT, 1)
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(m.read_ct, 2);
}

#[tokio::test]
async fn read_where_filters_on_the_body() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "where").await;
    let ids = client
        .send_batch(
            &q,
            &[
                json!({"region": "eu", "n": 1}),
                json!({"region": "us", "n": 2}),
                json!({"region": "eu", "n": 3, "extra": {"a": 1}}),
            ],
        )
        .await
        .unwrap();
    let eu: Vec<Message> = common::ok(
        client
            .read_with(
                &q,
                &ReadOptions::new(VT).qty(10).filter(json!({"region": "eu"})),
            )
            .await
            .unwrap(),
    );
    let mut got = common::ids(&eu);
    got.sort_unstable();
    assert_eq!(got, [ids[0], ids[2]]);
    let nested: Vec<Message> = common::ok(
        client
            .read_with(
                &q,
                &ReadOptions::new(VT)
                    .qty(10)
                    .filter(json!({"extra": {"a": 1}})),
            )
            .await
            .unwrap(),
    );
    assert!(nested.is_empty(), "already invisible");
    let none: Vec<Message> = common::ok(
        client
            .read_with(
                &q,
                &ReadOptions::new(VT)
                    .qty(10)
                    .filter(json!({"region": "mars"})),
            )
            .await
            .unwrap(),
    );
    assert!(none.is_empty());
    // The filter is a bound parameter: quotes in it are data, not SQL.
    let odd: Vec<Message> = common::ok(
        client
            .read_with(
                &q,
                &ReadOptions::new(VT)
                    .qty(10)
                    .filter(json!({"region": "x')); drop table pgmq.meta; --"})),
            )
            .await
            .unwrap(),
    );
    assert!(odd.is_empty());
    let us: Vec<Message> = common::ok(
        client
            .read_with(
                &q,
                &ReadOptions::new(VT)
                    .qty(10)
                    .poll(Duration::from_secs(1), Duration::from_millis(50))
                    .filter(json!({"region": "us"})),
            )
            .await
            .unwrap(),
    );
    assert_eq!(common::ids(&us), [ids[1]]);
}

#[tokio::test]
async fn read_with_poll_returns_when_a_message_arrives() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "poll").await;

    // Nothing arrives: returns empty after about max_poll.
    let start = Instant::now();
    let none: Vec<Message> = common::ok(
        client
            .read_with(
                &q,
                &ReadOptions::new(VT)
                    .qty(1)
                    .poll(Duration::from_secs(1), Duration::from_millis(50)),
            )
            .await
            .unwrap(),
    );
    assert!(none.is_empty());
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(3),
        "{waited:?}"
    );

    // Something arrives 300 ms into a 20 s poll: returns with it (a poll
    // that ran out would return nothing, which the id check refuses).
    let sender = client.clone();
    let q2 = q.clone();
    let send = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        sender.send(&q2, &json!({"late": true})).await.unwrap()
    });
    let start = Instant::now();
    let got: Vec<Message> = common::ok(
        client
            .read_with(
                &q,
                &ReadOptions::new(VT)
                    .qty(1)
                    .poll(Duration::from_secs(20), Duration::from_millis(50)),
            )
            .await
            .unwrap(),
    );
    let waited = start.elapsed();
    let id = send.await.unwrap();
    assert_eq!(common::ids(&got), [id]);
    assert!(
        waited >= Duration::from_millis(250),
        "returned {waited:?} after the start of the poll, before the send"
    );
}

#[tokio::test]
async fn pop_reads_and_deletes() {
    let client = common::client().await;
    let qs = Queues::new();
    let pg = common::raw().await;
    let q = qs.fresh(&client, "pop").await;
    let ids = client
        .send_batch(&q, &[json!(1), json!(2), json!(3)])
        .await
        .unwrap();
    let popped: Vec<Message> = common::ok(client.pop(&q, 2).await.unwrap());
    let mut got = common::ids(&popped);
    got.sort_unstable();
    assert_eq!(got, ids[..2]);
    let left: Vec<i64> = common::queue_rows(&pg, &q)
        .await
        .iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(left, ids[2..]);
    let one: Vec<Message> = common::ok(client.pop(&q, 1).await.unwrap());
    assert_eq!(one[0].body, json!(3));
    assert!(client.pop::<Value>(&q, 1).await.unwrap().is_empty());
}

#[tokio::test]
async fn archive_moves_rows_to_the_archive_table() {
    let client = common::client().await;
    let qs = Queues::new();
    let pg = common::raw().await;
    let q = qs.fresh(&client, "archive").await;
    let ids = client
        .send_batch(&q, &[json!({"a": 1}), json!({"a": 2}), json!({"a": 3})])
        .await
        .unwrap();
    let _: Vec<Message> = common::ok(client.read(&q, VT, 1).await.unwrap());
    assert!(client.archive(&q, ids[0]).await.unwrap());
    assert!(
        !client.archive(&q, ids[0]).await.unwrap(),
        "already archived"
    );
    let mut archived = client.archive_batch(&q, &ids[1..]).await.unwrap();
    archived.sort_unstable();
    assert_eq!(archived, ids[1..]);
    assert!(client
        .archive_batch(&q, &[i64::MAX])
        .await
        .unwrap()
        .is_empty());
    assert!(common::queue_rows(&pg, &q).await.is_empty());
    let rows = common::archive_rows(&pg, &q).await;
    assert_eq!(
        rows,
        vec![
            (ids[0], 1, json!({"a": 1})),
            (ids[1], 0, json!({"a": 2})),
            (ids[2], 0, json!({"a": 3})),
        ]
    );
    let archived_at: i64 = pg
        .query_one(
            &format!(
                "SELECT count(*) FROM {} WHERE archived_at IS NOT NULL",
                q.archive_table()
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(archived_at, 3);
}

#[tokio::test]
async fn delete_single_and_missing() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "delete").await;
    let id = client.send(&q, &1).await.unwrap();
    assert!(client.delete(&q, id).await.unwrap());
    assert!(!client.delete(&q, id).await.unwrap());
    assert!(client
        .delete_batch(&q, &[id, id + 1])
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn set_vt_single_and_batch() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "setvt").await;
    let ids = client
        .send_batch(&q, &[json!(1), json!(2), json!(3)])
        .await
        .unwrap();
    let read: Vec<Message> = common::ok(client.read(&q, VT, 3).await.unwrap());
    assert_eq!(read.len(), 3);

    // Back to visible now: readable again.
    let m = client
        .set_vt(&q, ids[0], Duration::ZERO)
        .await
        .unwrap()
        .expect("the message exists");
    assert_eq!(m.msg_id, ids[0]);
    assert_eq!(m.body, json!(1));
    assert!(m.vt <= Utc::now() + chrono::Duration::seconds(1));
    let again: Vec<Message> = common::ok(client.read(&q, VT, 3).await.unwrap());
    assert_eq!(common::ids(&again), [ids[0]]);
    assert_eq!(again[0].read_ct, 2);

    // To a timestamp: the returned vt is that time.
    let at = (Utc::now() + chrono::Duration::seconds(90)).with_nanosecond_micros();
    let m = client
        .set_vt(&q, ids[1], Delay::At(at))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.vt, at);

    // Batch: all visible in one call, then all hidden until a timestamp.
    let mut changed = client.set_vt_batch(&q, &ids, Duration::ZERO).await.unwrap();
    changed.sort_unstable();
    assert_eq!(changed, ids);
    assert_eq!(client.metrics(&q).await.unwrap().queue_visible_length, 3);
    let mut changed = client
        .set_vt_batch(&q, &ids, Utc::now() + chrono::Duration::seconds(60))
        .await
        .unwrap();
    changed.sort_unstable();
    assert_eq!(changed, ids);
    assert!(client.read::<Value>(&q, VT, 3).await.unwrap().is_empty());

    // Missing messages.
    assert!(client
        .set_vt(&q, i64::MAX, Duration::ZERO)
        .await
        .unwrap()
        .is_none());
    assert!(client
        .set_vt_batch(&q, &[i64::MAX], Duration::ZERO)
        .await
        .unwrap()
        .is_empty());
}

/// Rounds a timestamp to microseconds, PostgreSQL's precision.
trait Micros {
    fn with_nanosecond_micros(self) -> Self;
}

impl Micros for chrono::DateTime<Utc> {
    fn with_nanosecond_micros(self) -> Self {
        use chrono::Timelike;
        let n = self.nanosecond() / 1000 * 1000;
        self.with_nanosecond(n).unwrap()
    }
}

#[tokio::test]
async fn a_body_that_does_not_decode_stays_in_the_queue() {
    let client = common::client().await;
    let qs = Queues::new();
    let pg = common::raw().await;
    let q = qs.fresh(&client, "decode").await;
    let bad = client
        .send(&q, &json!({"id": "not a number"}))
        .await
        .unwrap();
    let mut batch = client.read::<Order>(&q, VT, 10).await.unwrap();
    assert_eq!(batch.len(), 1);
    let undecoded = batch.remove(0).unwrap_err();
    assert_eq!(undecoded.message.msg_id, bad);
    let err = Error::from(undecoded);
    match &err {
        Error::Deserialize { msg_id, .. } => assert_eq!(*msg_id, bad),
        other => panic!("expected Deserialize, got {other:?}"),
    }
    assert!(!err.is_transient());
    // Still there (read once, invisible until its vt ends).
    let rows = common::queue_rows(&pg, &q).await;
    assert_eq!(rows, vec![(bad, 1, json!({"id": "not a number"}))]);

    // read_raw decodes one by one: a good message is not held up by a bad one.
    client.set_vt(&q, bad, Duration::ZERO).await.unwrap();
    let good = client
        .send(
            &q,
            &Order {
                id: 1,
                item: "x".into(),
            },
        )
        .await
        .unwrap();
    let raw: Vec<Message<RawJson>> = client.read_raw(&q, VT, 10).await.unwrap();
    assert_eq!(raw.len(), 2);
    for m in raw {
        let id = m.msg_id;
        let text = m.body.get().to_owned();
        match m.decode::<Order>() {
            Ok(o) => {
                assert_eq!(id, good);
                assert_eq!(o.body.id, 1);
            }
            Err(Error::Deserialize { msg_id, .. }) => {
                assert_eq!(msg_id, bad);
                assert!(text.contains("not a number"));
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    // Error messages name the message, not its body.
    assert!(!err.to_string().contains("not a number"), "{err}");
    assert!(!format!("{err:?}").contains("not a number"), "{err:?}");
    assert!(err.to_string().contains("expected u64"), "{err}");
}

#[tokio::test]
async fn a_payload_that_does_not_serialize_sends_nothing() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "ser").await;
    let mut bad: HashMap<(u8, u8), u8> = HashMap::new();
    bad.insert((1, 2), 3);
    let err = client.send(&q, &bad).await.unwrap_err();
    assert!(matches!(err, Error::Serialize(_)), "{err:?}");
    assert_eq!(err.outcome(), pgmq_client::CommitOutcome::NotSent);
    let err = client
        .send_batch(&q, &[HashMap::new(), bad.clone()])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Serialize(_)), "{err:?}");
    let err = client.send_topic("a.b", &bad).await.unwrap_err();
    assert!(matches!(err, Error::Serialize(_)), "{err:?}");
    let err = client.send_batch_topic("a.b", &[bad]).await.unwrap_err();
    assert!(matches!(err, Error::Serialize(_)), "{err:?}");
    let m = client.metrics(&q).await.unwrap();
    assert_eq!((m.queue_length, m.total_messages), (0, 0));
}

#[tokio::test]
async fn out_of_range_arguments_are_refused_before_sql() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.name("never_created_args");
    let huge = Duration::from_secs(u64::MAX);
    let checks: Vec<Error> = vec![
        client.read::<Value>(&q, huge, 1).await.unwrap_err(),
        client.read::<Value>(&q, VT, usize::MAX).await.unwrap_err(),
        client
            .read_with::<Value>(
                &q,
                &ReadOptions::new(VT)
                    .qty(1)
                    .poll(huge, Duration::from_millis(10)),
            )
            .await
            .unwrap_err(),
        client.set_vt(&q, 1, huge).await.unwrap_err(),
        client.pop::<Value>(&q, usize::MAX).await.unwrap_err(),
        client
            .send_with(
                &q,
                &1,
                &SendOptions::new().delay(Duration::from_secs(u64::from(u32::MAX))),
            )
            .await
            .unwrap_err(),
        client
            .send_topic_with("a.b", &1, &SendOptions::new().delay(Utc::now()))
            .await
            .unwrap_err(),
        client.enable_notify_insert(&q, huge).await.unwrap_err(),
    ];
    for err in checks {
        // InvalidArgument, not QueueNotFound: the queue was never asked for.
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        assert_eq!(err.outcome(), pgmq_client::CommitOutcome::NotSent);
    }
}

#[tokio::test]
async fn raw_bodies_are_forwarded_unchanged() {
    let client = common::client().await;
    let qs = Queues::new();
    let a = qs.fresh(&client, "raw_a").await;
    let b = qs.fresh(&client, "raw_b").await;
    let text = r#"{"amount": 12345678901234567890.123456789, "tiny": 1e-400, "s": "x"}"#;
    client
        .send(&a, &RawJson::from_text(text).unwrap())
        .await
        .unwrap();
    let first: Vec<Message<RawJson>> = client.read_raw(&a, VT, 1).await.unwrap();
    assert!(first[0]
        .body
        .get()
        .contains("12345678901234567890.123456789"));
    client.send(&b, &first[0].body).await.unwrap();
    let second: Vec<Message<RawJson>> = client.read_raw(&b, VT, 1).await.unwrap();
    assert_eq!(second[0].body.get(), first[0].body.get());
}

/// Options a read does not take are refused before any SQL: a filter on a
/// grouped read or `read_from`, a wait on `read_from`.
#[tokio::test]
async fn reads_refuse_options_they_do_not_take() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "read_opts").await;
    client.send(&q, &json!({"region": "eu"})).await.unwrap();
    let filtered = ReadOptions::new(VT).qty(10).filter(json!({"region": "eu"}));
    let polled = ReadOptions::new(VT).poll(Duration::from_secs(1), Duration::from_millis(10));
    let err = client
        .read_grouped_raw(&q, pgmq_client::GroupStrategy::Fill, &filtered)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    for opts in [&filtered, &polled] {
        let err = client
            .read_from_raw(&q, ReadFrom::Start, opts)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    }
    // Nothing was read by the refused calls; the filter still reads it.
    let got = client.read_with_raw(&q, &filtered).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].read_ct, 1);
}
