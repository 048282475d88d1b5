//! `read_from`: the table statement returns what `pgmq.read` returns
//! (visibility, read_ct, last_read_at, vt, body, headers), a bound skips the
//! ids at or below it, and a message made visible again below the bound is
//! found by a read from the start.

mod common;

use std::time::Duration;

use pgmq_client::ReadOptions;
use pgmq_client::{Client, Delay, Error, Message, QueueName, RawJson, ReadFrom, SendOptions};
use serde_json::{json, Value};

use common::Queues;

const VT: Duration = Duration::from_secs(30);

/// The same four messages: two plain, one with headers, one delayed.
async fn fill(client: &Client, q: &QueueName) -> Vec<i64> {
    let mut ids = client
        .send_batch(q, &[json!({"n": 1}), json!({"n": 2})])
        .await
        .unwrap();
    let with_headers = SendOptions::new().headers(json!({"tenant": "acme", "x-k": [1, 2]}));
    ids.push(
        client
            .send_with(q, &json!({"n": 3}), &with_headers)
            .await
            .unwrap(),
    );
    let delayed = SendOptions::new().delay(Duration::from_secs(60));
    ids.push(
        client
            .send_with(q, &json!({"n": 4}), &delayed)
            .await
            .unwrap(),
    );
    ids
}

fn sorted(mut v: Vec<Message<RawJson>>) -> Vec<Message<RawJson>> {
    v.sort_by_key(|m| m.msg_id);
    v
}

fn body(m: &Message<RawJson>) -> Value {
    serde_json::from_str(m.body.get()).unwrap()
}

/// Two queues filled alike, one read by `pgmq.read`, one by `read_from`:
/// the same messages with the same fields (each relative to its own read).
#[tokio::test]
async fn a_read_from_the_start_returns_what_pgmq_read_returns() {
    let client = common::client().await;
    let qs = Queues::new();
    let a = qs.fresh(&client, "rf_fn").await;
    let b = qs.fresh(&client, "rf_tab").await;
    fill(&client, &a).await;
    fill(&client, &b).await;
    let pg = common::raw().await;
    let before: chrono::DateTime<chrono::Utc> = pg
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .unwrap()
        .get(0);
    let by_fn = sorted(client.read_raw(&a, VT, 10).await.unwrap());
    let by_table = sorted(
        client
            .read_from_raw(&b, ReadFrom::Start, &ReadOptions::new(VT).qty(10))
            .await
            .unwrap(),
    );
    let after: chrono::DateTime<chrono::Utc> = pg
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .unwrap()
        .get(0);

    assert_eq!(by_fn.len(), 3, "the delayed message is not visible");
    assert_eq!(by_table.len(), by_fn.len());
    for (f, t) in by_fn.iter().zip(&by_table) {
        assert_eq!(body(f), body(t));
        assert_eq!(f.headers, t.headers);
        assert_eq!(f.read_ct, 1);
        assert_eq!(t.read_ct, 1);
        let read_at = t.last_read_at.expect("a read sets last_read_at");
        assert!(
            read_at >= before && read_at <= after,
            "{read_at} not in [{before}, {after}]"
        );
        assert!(read_at >= t.enqueued_at);
        // vt = clock_timestamp() + 30 s, the clock read again for vt.
        for m in [f, t] {
            let hidden = m.vt - m.last_read_at.unwrap();
            assert!(
                hidden >= chrono::Duration::seconds(30) && hidden < chrono::Duration::seconds(31),
                "{hidden}"
            );
        }
    }
    assert_eq!(
        by_table[2].headers,
        Some(json!({"tenant": "acme", "x-k": [1, 2]}))
    );
    assert_eq!(by_table[0].headers, None);

    // The rows as stored match what was returned, as with pgmq.read.
    let row = pg
        .query_one(
            &format!(
                "SELECT read_ct, last_read_at, vt FROM {} WHERE msg_id = $1",
                b.quoted_table()
            ),
            &[&by_table[0].msg_id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), by_table[0].read_ct);
    assert_eq!(
        row.get::<_, Option<chrono::DateTime<chrono::Utc>>>(1),
        by_table[0].last_read_at
    );
    assert_eq!(
        row.get::<_, chrono::DateTime<chrono::Utc>>(2),
        by_table[0].vt
    );

    // Claimed: neither read sees them again; made visible, both see them,
    // read_ct counting on.
    assert!(client.read_raw(&a, VT, 10).await.unwrap().is_empty());
    assert!(client
        .read_from_raw(&b, ReadFrom::Start, &ReadOptions::new(VT).qty(10))
        .await
        .unwrap()
        .is_empty());
    for m in &by_table {
        client.set_vt(&b, m.msg_id, Delay::NONE).await.unwrap();
    }
    let again = sorted(
        client
            .read_from_raw(&b, ReadFrom::Start, &ReadOptions::new(VT).qty(10))
            .await
            .unwrap(),
    );
    assert_eq!(
        again.iter().map(|m| m.msg_id).collect::<Vec<_>>(),
        by_table.iter().map(|m| m.msg_id).collect::<Vec<_>>()
    );
    assert!(again.iter().all(|m| m.read_ct == 2));
    assert!(again
        .iter()
        .zip(&by_table)
        .all(|(x, y)| x.last_read_at > y.last_read_at));
}

/// `qty` and order: the lowest visible ids first, at most `qty` of them;
/// typed reads decode as `read` does.
#[tokio::test]
async fn reads_take_the_lowest_ids_first() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "rf_order").await;
    let ids = client
        .send_batch(&q, &(0..10).map(|i| json!({"i": i})).collect::<Vec<_>>())
        .await
        .unwrap();
    let first = client
        .read_from::<Value>(&q, ReadFrom::Start, &ReadOptions::new(VT).qty(4))
        .await
        .unwrap();
    let mut got: Vec<i64> = common::ok(first).iter().map(|m| m.msg_id).collect();
    got.sort();
    assert_eq!(got, ids[..4]);
    let next = sorted(
        client
            .read_from_raw(&q, ReadFrom::Start, &ReadOptions::new(VT).qty(4))
            .await
            .unwrap(),
    );
    assert_eq!(next.iter().map(|m| m.msg_id).collect::<Vec<_>>(), ids[4..8]);
}

/// A bound skips every id at or below it, visible or not; a message below
/// it made visible again (a retry) is found by a read from the start.
#[tokio::test]
async fn a_retry_below_the_bound_is_found_by_a_read_from_the_start() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "rf_bound").await;
    let ids = client
        .send_batch(&q, &(0..10).map(|i| json!({"i": i})).collect::<Vec<_>>())
        .await
        .unwrap();

    let tail = sorted(
        client
            .read_from_raw(&q, ReadFrom::After(ids[6]), &ReadOptions::new(VT).qty(10))
            .await
            .unwrap(),
    );
    assert_eq!(tail.iter().map(|m| m.msg_id).collect::<Vec<_>>(), ids[7..]);
    let head = sorted(
        client
            .read_from_raw(&q, ReadFrom::Start, &ReadOptions::new(VT).qty(10))
            .await
            .unwrap(),
    );
    assert_eq!(head.iter().map(|m| m.msg_id).collect::<Vec<_>>(), ids[..7]);

    // The message with the lowest id comes back (a retry with no delay).
    client.set_vt(&q, ids[0], Delay::NONE).await.unwrap();
    let bound = ReadFrom::After(ids[9]);
    assert!(client
        .read_from_raw(&q, bound, &ReadOptions::new(VT).qty(10))
        .await
        .unwrap()
        .is_empty());
    let retried = client
        .read_from_raw(&q, ReadFrom::Start, &ReadOptions::new(VT).qty(10))
        .await
        .unwrap();
    assert_eq!(retried.len(), 1);
    assert_eq!(retried[0].msg_id, ids[0]);
    assert_eq!(retried[0].read_ct, 2);
    assert_eq!(body(&retried[0]), json!({"i": 0}));

    // Sent after the bound was taken: found by the bounded read.
    let later = client.send(&q, &json!({"i": 10})).await.unwrap();
    let got = client
        .read_from_raw(&q, bound, &ReadOptions::new(VT).qty(10))
        .await
        .unwrap();
    assert_eq!(got.iter().map(|m| m.msg_id).collect::<Vec<_>>(), [later]);
}

/// `AfterFrontier` starts after the newest claims of any consumer: it
/// skips a visible message below them (found from the start), counts no
/// delayed message that was never read, and on a queue nobody read yet is
/// its own bound.
#[tokio::test]
async fn a_read_after_the_frontier_starts_after_the_newest_claims() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "rf_frontier").await;
    let ids = client
        .send_batch(&q, &(0..10).map(|i| json!({"i": i})).collect::<Vec<_>>())
        .await
        .unwrap();
    let opts = |n| ReadOptions::new(VT).qty(n);
    let got = |v: Vec<Message<RawJson>>| sorted(v).iter().map(|m| m.msg_id).collect::<Vec<_>>();

    // Nothing claimed yet: the bound alone.
    let first = client
        .read_from_raw(&q, ReadFrom::AfterFrontier(ids[0]), &opts(3))
        .await
        .unwrap();
    assert_eq!(got(first), ids[1..4]);
    // The lowest message is visible again, below the claims: a read after
    // the frontier starts past the newest claim, whatever its own bound.
    client.set_vt(&q, ids[0], Delay::NONE).await.unwrap();
    let next = client
        .read_from_raw(&q, ReadFrom::AfterFrontier(0), &opts(2))
        .await
        .unwrap();
    assert_eq!(got(next), ids[4..6]);
    // A bound above the frontier wins.
    let above = client
        .read_from_raw(&q, ReadFrom::AfterFrontier(ids[7]), &opts(10))
        .await
        .unwrap();
    assert_eq!(got(above), ids[8..]);
    // A message sent with a delay (never read) does not move the frontier,
    // even when its `vt` is the newest within the visibility timeout.
    let plain = client.send(&q, &json!({"i": 10})).await.unwrap();
    let delayed = SendOptions::new().delay(VT);
    client
        .send_with(&q, &json!({"i": 11}), &delayed)
        .await
        .unwrap();
    let after_delayed = client
        .read_from_raw(&q, ReadFrom::AfterFrontier(0), &opts(10))
        .await
        .unwrap();
    assert_eq!(got(after_delayed), [plain]);
    // The messages below the frontier are found from the start.
    let start = client
        .read_from_raw(&q, ReadFrom::Start, &opts(10))
        .await
        .unwrap();
    assert_eq!(got(start), [ids[0], ids[6], ids[7]]);
}

#[tokio::test]
async fn a_missing_queue_and_a_huge_quantity_are_refused() {
    let client = common::client().await;
    let q = QueueName::new("rf_no_such_queue_here").unwrap();
    let err = client
        .read_from_raw(&q, ReadFrom::Start, &ReadOptions::new(VT).qty(1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::QueueNotFound { .. }), "{err:?}");
    let err = client
        .read_from_raw(
            &q,
            ReadFrom::After(1),
            &ReadOptions::new(VT).qty(pgmq_client::MAX_BATCH + 1),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
}

/// The read as prepared, under a generic plan (what PostgreSQL runs once a
/// prepared statement's custom plans cost no less): planned without the
/// quantity, the planner takes `LIMIT $2` for a tenth of the table, and a
/// join of the claimed rows back to the table then scans the whole table
/// or its whole primary key (dead entries included) on every read. Both
/// reads must probe the primary key by id instead: no join, no sequential
/// scan, whatever the estimate.
#[tokio::test]
async fn the_prepared_read_probes_ids_under_a_generic_plan() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "rf_generic").await;
    let bodies: Vec<Value> = (0..5_000).map(|i| json!({"i": i})).collect();
    client.send_batch(&q, &bodies).await.unwrap();
    let conn = pgmq_client::Connection::new(common::raw().await);
    conn.batch_execute(&format!(
        "ANALYZE {}; SET plan_cache_mode = force_generic_plan",
        q.quoted_table()
    ))
    .await
    .unwrap();
    let pgmq = pgmq_client::Pgmq::on(&conn);
    for from in [ReadFrom::Start, ReadFrom::After(0)] {
        let got = pgmq
            .read_from_raw(&q, from, &ReadOptions::new(VT).qty(10))
            .await
            .unwrap();
        assert_eq!(got.len(), 10);
    }
    let prepared = conn
        .query(
            "SELECT name, cardinality(parameter_types), statement FROM pg_prepared_statements \
             WHERE statement LIKE '%FOR UPDATE SKIP LOCKED%' AND statement LIKE '%' || $1 || '%'",
            &[&q.as_str()],
        )
        .await
        .unwrap();
    let texts: Vec<String> = prepared.iter().map(|r| r.get(2)).collect();
    assert_eq!(
        prepared.len(),
        2,
        "both reads are prepared statements: {texts:?}"
    );
    for row in prepared {
        let (name, params): (String, i32) = (row.get(0), row.get(1));
        let args = if params == 3 { "30, 10, 0" } else { "30, 10" };
        let plan: Value = conn
            .query_one(
                &format!("EXPLAIN (FORMAT JSON) EXECUTE {name}({args})"),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let plan = plan.to_string();
        for node in ["Nested Loop", "Hash Join", "Merge Join", "Seq Scan"] {
            assert!(!plan.contains(node), "{node} in the generic plan: {plan}");
        }
    }
}
