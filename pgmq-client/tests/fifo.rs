//! FIFO groups: for every strategy, a later message of a group is not
//! delivered while an earlier one is in flight, and each strategy picks
//! across groups the way it documents.

mod common;

use std::time::{Duration, Instant};

use pgmq_client::ReadOptions;
use pgmq_client::{Client, GroupStrategy, Message, QueueName, FIFO_GROUP_HEADER};
use serde_json::{json, Value};

use common::Queues;

const VT: Duration = Duration::from_secs(30);
const ALL: [GroupStrategy; 3] = [
    GroupStrategy::Fill,
    GroupStrategy::RoundRobin,
    GroupStrategy::Head,
];

/// Sends one message per `(group, n)`, in order; returns the ids.
///
/// Group names are qualified with the queue's: PGMQ's round-robin read
/// takes an advisory lock per group *name*, database-wide, and passes over
/// a group another transaction (on any queue) is reading at that moment.
async fn send_grouped(client: &Client, q: &QueueName, msgs: &[(&str, i32)]) -> Vec<i64> {
    let group = |g: &str| format!("{q}-{g}");
    let bodies: Vec<Value> = msgs
        .iter()
        .map(|(g, n)| json!({"g": group(g), "n": n}))
        .collect();
    let headers: Vec<Value> = msgs
        .iter()
        .map(|(g, _)| json!({ FIFO_GROUP_HEADER: group(g) }))
        .collect();
    client
        .send_batch_with(
            q,
            &bodies,
            &pgmq_client::SendOptions::new().headers_each(headers.to_vec()),
        )
        .await
        .unwrap()
}

async fn grouped(client: &Client, q: &QueueName, s: GroupStrategy, n: usize) -> Vec<i64> {
    let got: Vec<Message> = common::ok(
        client
            .read_grouped(q, s, &ReadOptions::new(VT).qty(n))
            .await
            .unwrap(),
    );
    for m in &got {
        assert_eq!(
            m.header(FIFO_GROUP_HEADER).and_then(Value::as_str),
            m.body["g"].as_str()
        );
    }
    common::ids(&got)
}

#[tokio::test]
async fn a_group_waits_for_its_earlier_message_in_every_strategy() {
    let client = common::client().await;
    let qs = Queues::new();
    for s in ALL {
        let q = qs.fresh(&client, "fifo_wait").await;
        // a1 b1 a2 b2, interleaved.
        let ids = send_grouped(&client, &q, &[("a", 1), ("b", 1), ("a", 2), ("b", 2)]).await;
        let (a1, b1, a2, b2) = (ids[0], ids[1], ids[2], ids[3]);

        assert_eq!(grouped(&client, &q, s, 1).await, [a1], "{s:?}");
        assert_eq!(grouped(&client, &q, s, 1).await, [b1], "{s:?}: a is busy");
        assert!(
            grouped(&client, &q, s, 10).await.is_empty(),
            "{s:?}: both groups have a message in flight"
        );
        // Reading without groups would hand out a2: the grouped reads do not.
        assert!(client.delete(&q, b1).await.unwrap());
        assert_eq!(grouped(&client, &q, s, 10).await, [b2], "{s:?}");
        assert!(grouped(&client, &q, s, 10).await.is_empty(), "{s:?}");
        // a1's visibility timeout ends without a delete: a1 again, not a2.
        client.set_vt(&q, a1, Duration::ZERO).await.unwrap();
        let again: Vec<Message> = common::ok(
            client
                .read_grouped(&q, s, &ReadOptions::new(VT).qty(1))
                .await
                .unwrap(),
        );
        assert_eq!(common::ids(&again), [a1], "{s:?}: redelivery keeps order");
        assert_eq!(again[0].read_ct, 2);
        assert!(client.archive(&q, a1).await.unwrap());
        assert_eq!(grouped(&client, &q, s, 10).await, [a2], "{s:?}");
    }
}

#[tokio::test]
async fn strategies_pick_across_groups_as_documented() {
    let client = common::client().await;
    let qs = Queues::new();
    let msgs = [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3), ("c", 1)];

    // Fill: as many as possible from the group with the oldest message first.
    let q = qs.fresh(&client, "fifo_fill").await;
    let ids = send_grouped(&client, &q, &msgs).await;
    let got = grouped(&client, &q, GroupStrategy::Fill, 3).await;
    assert_eq!(got, [ids[0], ids[2], ids[4]], "a1 a2 a3, in order");
    let got = grouped(&client, &q, GroupStrategy::Fill, 3).await;
    assert_eq!(got, [ids[1], ids[3], ids[5]], "b1 b2, then c1");

    // Round robin: one from each group in turn, oldest group first.
    let q = qs.fresh(&client, "fifo_rr").await;
    let ids = send_grouped(&client, &q, &msgs).await;
    let got = grouped(&client, &q, GroupStrategy::RoundRobin, 5).await;
    assert_eq!(
        got,
        [ids[0], ids[1], ids[5], ids[2], ids[3]],
        "a1 b1 c1 a2 b2"
    );

    // Head: at most one per group.
    let q = qs.fresh(&client, "fifo_head").await;
    let ids = send_grouped(&client, &q, &msgs).await;
    let got = grouped(&client, &q, GroupStrategy::Head, 10).await;
    assert_eq!(got, [ids[0], ids[1], ids[5]], "a1 b1 c1");
}

#[tokio::test]
async fn messages_without_a_group_form_one_default_group() {
    let client = common::client().await;
    let qs = Queues::new();
    for s in ALL {
        let q = qs.fresh(&client, "fifo_default").await;
        let ids = client.send_batch(&q, &[json!(1), json!(2)]).await.unwrap();
        assert_eq!(grouped(&client, &q, s, 1).await, [ids[0]], "{s:?}");
        assert!(grouped(&client, &q, s, 1).await.is_empty(), "{s:?}");
        client.delete(&q, ids[0]).await.unwrap();
        assert_eq!(grouped(&client, &q, s, 1).await, [ids[1]], "{s:?}");
    }
}

#[tokio::test]
async fn grouped_poll_returns_when_the_head_is_deleted() {
    let client = common::client().await;
    let qs = Queues::new();
    for s in ALL {
        let q = qs.fresh(&client, "fifo_poll").await;
        client.create_fifo_index(&q).await.unwrap();
        let ids = send_grouped(&client, &q, &[("a", 1), ("a", 2)]).await;
        assert_eq!(grouped(&client, &q, s, 1).await, [ids[0]]);
        let deleter = client.clone();
        let (q2, head) = (q.clone(), ids[0]);
        let del = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            deleter.delete(&q2, head).await.unwrap()
        });
        let start = Instant::now();
        let got: Vec<Message> = common::ok(
            client
                .read_grouped(
                    &q,
                    s,
                    &ReadOptions::new(VT)
                        .qty(1)
                        // A wait far longer than the delete takes even on a
                        // loaded machine: a poll that ran out would return
                        // nothing, which the id check below refuses.
                        .poll(Duration::from_secs(20), Duration::from_millis(50)),
                )
                .await
                .unwrap(),
        );
        let waited = start.elapsed();
        assert!(del.await.unwrap());
        // The next message of the group, returned by the poll once the head
        // was gone (so not before the delete).
        assert_eq!(common::ids(&got), [ids[1]], "{s:?}");
        assert!(waited >= Duration::from_millis(250), "{s:?}: {waited:?}");
    }
}
