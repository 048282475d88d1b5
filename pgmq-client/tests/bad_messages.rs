//! Bad messages never cost good ones: bodies that do not decode (a number
//! out of f64's range, nesting past serde's recursion limit, a schema
//! mismatch) come back raw, one by one, from every typed read and from pop;
//! row-decoding failures are their own, non-transient error; limits are
//! checked before any SQL runs.

mod common;

use std::time::Duration;

use pgmq_client::ReadOptions;
use pgmq_client::{Decoded, Error, GroupStrategy, QueueName, FIFO_GROUP_HEADER};
use serde_json::{json, Value};

const VT: Duration = Duration::from_secs(30);

#[derive(Debug, serde::Deserialize)]
struct Order {
    id: u64,
}

fn nested(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

/// Sends, in this order: a good order, `1e400`, 200 levels of nesting, a
/// schema mismatch, a good order. Returns the ids.
async fn fill(q: &QueueName, headers: Option<Value>) -> Vec<i64> {
    let pg = common::raw().await;
    let h = headers.map(|h| h.to_string());
    let mut ids = Vec::new();
    for body in [
        r#"{"id": 1}"#.to_owned(),
        r#"{"id": 1e400}"#.to_owned(),
        format!(r#"{{"id": {}}}"#, nested(200)),
        r#"{"id": "seven"}"#.to_owned(),
        r#"{"id": 5}"#.to_owned(),
    ] {
        let row = pg
            .query_one(
                "SELECT pgmq.send($1, $2::text::jsonb, $3::text::jsonb, 0)",
                &[&q.as_str(), &body, &h],
            )
            .await
            .unwrap();
        ids.push(row.get(0));
    }
    ids
}

/// The batch splits into the two good orders and the three bad messages, in
/// id order, each bad one holding its body whole.
fn check(batch: Vec<Decoded<Order>>, ids: &[i64]) {
    let mut batch = batch;
    batch.sort_by_key(|m| match m {
        Ok(m) => m.msg_id,
        Err(u) => u.message.msg_id,
    });
    assert_eq!(batch.len(), 5, "nothing is dropped");
    let good: Vec<(i64, u64)> = batch
        .iter()
        .filter_map(|m| m.as_ref().ok())
        .map(|m| (m.msg_id, m.body.id))
        .collect();
    assert_eq!(good, [(ids[0], 1), (ids[4], 5)]);
    let bad: Vec<_> = batch.iter().filter_map(|m| m.as_ref().err()).collect();
    assert_eq!(
        bad.iter().map(|u| u.message.msg_id).collect::<Vec<_>>(),
        ids[1..4]
    );
    // The raw body is the stored text (PostgreSQL writes 1e400 out in full).
    assert!(bad[0].message.body.get().starts_with(r#"{"id": 1000"#));
    assert!(bad[1].message.body.get().contains(&nested(200)));
    assert_eq!(bad[2].message.body.get(), r#"{"id": "seven"}"#);
    // The error text names the message, never the body's values.
    let text = bad[2].to_string();
    assert!(text.contains(&ids[3].to_string()), "{text}");
    assert!(!text.contains("seven"), "{text}");
    // `?` still gives the old typed error.
    let e: Error = bad[2].clone().into();
    assert!(matches!(e, Error::Deserialize { msg_id, .. } if msg_id == ids[3]));
}

#[tokio::test]
async fn typed_reads_return_each_message_decoded_or_raw() {
    let client = common::client().await;
    let queues = common::Queues::new();
    let q = queues.fresh(&client, "bad_read").await;
    let ids = fill(&q, None).await;

    check(client.read::<Order>(&q, VT, 10).await.unwrap(), &ids);
    client.set_vt_batch(&q, &ids, Duration::ZERO).await.unwrap();
    check(
        client
            .read_with::<Order>(&q, &ReadOptions::new(VT).qty(10).filter(json!({})))
            .await
            .unwrap(),
        &ids,
    );
    client.set_vt_batch(&q, &ids, Duration::ZERO).await.unwrap();
    check(
        client
            .read_with::<Order>(
                &q,
                &ReadOptions::new(VT)
                    .qty(10)
                    .poll(Duration::from_secs(1), Duration::from_millis(50)),
            )
            .await
            .unwrap(),
        &ids,
    );
    // Raw twins of every read form give all five back as stored.
    client.set_vt_batch(&q, &ids, Duration::ZERO).await.unwrap();
    assert_eq!(client.read_raw(&q, VT, 10).await.unwrap().len(), 5);
    client.set_vt_batch(&q, &ids, Duration::ZERO).await.unwrap();
    assert_eq!(
        client
            .read_with_raw(&q, &ReadOptions::new(VT).qty(10).filter(json!({})))
            .await
            .unwrap()
            .len(),
        5
    );
    client.set_vt_batch(&q, &ids, Duration::ZERO).await.unwrap();
    let polled = client
        .read_with_raw(
            &q,
            &ReadOptions::new(VT)
                .qty(10)
                .poll(Duration::from_secs(1), Duration::from_millis(50)),
        )
        .await
        .unwrap();
    assert_eq!(polled.len(), 5);
}

#[tokio::test]
async fn pop_loses_no_message() {
    let client = common::client().await;
    let queues = common::Queues::new();
    let q = queues.fresh(&client, "bad_pop").await;
    let ids = fill(&q, None).await;
    check(client.pop::<Order>(&q, 10).await.unwrap(), &ids);
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 0);

    let ids = fill(&q, None).await;
    let raw = client.pop_raw(&q, 10).await.unwrap();
    assert_eq!(
        raw.iter().map(|m| m.msg_id).collect::<Vec<_>>().len(),
        ids.len()
    );
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 0);
}

#[tokio::test]
async fn a_bad_message_does_not_block_its_fifo_group() {
    let client = common::client().await;
    let queues = common::Queues::new();
    let q = queues.fresh(&client, "bad_fifo").await;
    let ids = fill(&q, Some(json!({ FIFO_GROUP_HEADER: "g1" }))).await;
    check(
        client
            .read_grouped::<Order>(&q, GroupStrategy::Fill, &ReadOptions::new(VT).qty(10))
            .await
            .unwrap(),
        &ids,
    );
    client.set_vt_batch(&q, &ids, Duration::ZERO).await.unwrap();
    check(
        client
            .read_grouped::<Order>(
                &q,
                GroupStrategy::Fill,
                &ReadOptions::new(VT)
                    .qty(10)
                    .poll(Duration::from_secs(1), Duration::from_millis(50)),
            )
            .await
            .unwrap(),
        &ids,
    );
    // The head of the group is undecodable: Head still hands it out, raw,
    // so the caller can archive it and let the group advance.
    client.delete(&q, ids[0]).await.unwrap();
    client.set_vt_batch(&q, &ids, Duration::ZERO).await.unwrap();
    let head = client
        .read_grouped::<Order>(&q, GroupStrategy::Head, &ReadOptions::new(VT).qty(10))
        .await
        .unwrap();
    assert_eq!(head.len(), 1);
    let bad = head.into_iter().next().unwrap().unwrap_err();
    assert_eq!(bad.message.msg_id, ids[1]);
    client.set_vt_batch(&q, &ids, Duration::ZERO).await.unwrap();
    let raw = client
        .read_grouped_raw(&q, GroupStrategy::Fill, &ReadOptions::new(VT).qty(10))
        .await
        .unwrap();
    assert_eq!(raw.len(), 4);
    client.set_vt_batch(&q, &ids, Duration::ZERO).await.unwrap();
    let raw = client
        .read_grouped_raw(
            &q,
            GroupStrategy::RoundRobin,
            &ReadOptions::new(VT)
                .qty(10)
                .poll(Duration::from_secs(1), Duration::from_millis(50)),
        )
        .await
        .unwrap();
    assert_eq!(raw.len(), 4);
}

#[tokio::test]
async fn a_row_that_does_not_decode_is_not_a_transient_database_error() {
    let pg = common::raw().await;
    let row = pg
        .query_one("SELECT NULL::bigint, 'x'::text", &[])
        .await
        .unwrap();
    for e in [
        row.try_get::<_, i64>(0).unwrap_err(),
        row.try_get::<_, i64>(1).unwrap_err(),
        row.try_get::<_, i64>(7).unwrap_err(),
    ] {
        let e = Error::from(e);
        assert!(matches!(e, Error::UnexpectedRow { .. }), "{e:?}");
        assert!(!e.is_transient(), "{e}");
        assert!(e.sqlstate().is_none());
    }
    // `query_one` on no row: the same.
    let e = Error::from(pg.query_one("SELECT 1 WHERE false", &[]).await.unwrap_err());
    assert!(matches!(e, Error::UnexpectedRow { .. }), "{e:?}");
    assert!(!e.is_transient());
}

#[tokio::test]
async fn limits_are_checked_before_any_sql() {
    let client = common::client().await;
    let queues = common::Queues::new();
    let q = queues.fresh(&client, "limits").await;
    let too_many = pgmq_client::MAX_BATCH + 1;
    let bad = |r: Result<_, Error>| matches!(r, Err(Error::InvalidArgument(_)));
    assert!(bad(client.read::<Value>(&q, VT, too_many).await.map(drop)));
    assert!(bad(client.read_raw(&q, VT, too_many).await.map(drop)));
    assert!(bad(client.pop::<Value>(&q, too_many).await.map(drop)));
    assert!(bad(client
        .read_grouped::<Value>(&q, GroupStrategy::Fill, &ReadOptions::new(VT).qty(too_many))
        .await
        .map(drop)));
    let ids: Vec<i64> = (0..too_many as i64).collect();
    assert!(bad(client.delete_batch(&q, &ids).await.map(drop)));
    assert!(bad(client.archive_batch(&q, &ids).await.map(drop)));
    assert!(bad(client.set_vt_batch(&q, &ids, VT).await.map(drop)));
    let bodies = vec![json!(1); too_many];
    assert!(bad(client.send_batch(&q, &bodies).await.map(drop)));
    assert!(bad(client
        .read::<Value>(&q, Duration::MAX, 1)
        .await
        .map(drop)));
    // Nothing was sent by the refused batch.
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 0);
    // MAX_BATCH itself is accepted.
    assert!(client
        .read::<Value>(&q, VT, pgmq_client::MAX_BATCH)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn a_sub_second_visibility_timeout_rounds_up() {
    let client = common::client().await;
    let queues = common::Queues::new();
    let q = queues.fresh(&client, "subsec").await;
    client.send(&q, &json!(1)).await.unwrap();
    let first = client
        .read_raw(&q, Duration::from_millis(500), 1)
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    // Hidden for a whole second, not for none.
    assert!(client
        .read_raw(&q, Duration::from_millis(500), 1)
        .await
        .unwrap()
        .is_empty());
    let vt = (first[0].vt - first[0].last_read_at.unwrap()).num_milliseconds();
    assert!((900..=1100).contains(&vt), "vt {vt} ms after the read");
}

#[tokio::test]
async fn debug_of_a_server_error_leaves_its_detail_out() {
    let pg = common::raw().await;
    pg.batch_execute(
        "CREATE TEMP TABLE t (k text PRIMARY KEY); INSERT INTO t VALUES ('card-4111')",
    )
    .await
    .unwrap();
    let e = Error::from(
        pg.execute("INSERT INTO t VALUES ('card-4111')", &[])
            .await
            .unwrap_err(),
    );
    let shown = format!("{e:?} {e} {e:#?}");
    assert!(!shown.contains("card-4111"), "{shown}");
    assert!(shown.contains("23505"), "{shown}");
    assert!(e.detail().is_some_and(|d| d.contains("card-4111")));
}
