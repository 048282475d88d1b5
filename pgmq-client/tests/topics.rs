//! Topic routing: bind, test_routing, send_topic counts, send_batch_topic,
//! unbind, list bindings, bad patterns.
//!
//! Bindings are global to the database, so every routing key here starts
//! with a prefix made from one of this test's own queue names.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use chrono::Utc;
use pgmq_client::{Error, Message, SendOptions};
use serde_json::{json, Value};

use common::Queues;

const VT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn routing_fans_out_to_matching_queues() {
    let client = common::client().await;
    let qs = Queues::new();
    let all = qs.fresh(&client, "tp_all").await;
    let eu = qs.fresh(&client, "tp_eu").await;
    let created = qs.fresh(&client, "tp_created").await;
    let k = format!("k{}", all.as_str());

    client.bind_topic(&format!("{k}.#"), &all).await.unwrap();
    client.bind_topic(&format!("{k}.eu.*"), &eu).await.unwrap();
    client
        .bind_topic(&format!("{k}.*.created"), &created)
        .await
        .unwrap();
    // Binding twice is a no-op.
    client.bind_topic(&format!("{k}.#"), &all).await.unwrap();

    let routes = client
        .test_routing(&format!("{k}.eu.created"))
        .await
        .unwrap();
    let mut queues: Vec<&str> = routes.iter().map(|r| r.queue_name.as_str()).collect();
    queues.sort_unstable();
    let mut expected = vec![all.as_str(), eu.as_str(), created.as_str()];
    expected.sort_unstable();
    assert_eq!(queues, expected);
    assert!(routes.iter().all(|r| !r.compiled_regex.is_empty()));
    assert_eq!(
        client
            .test_routing(&format!("{k}.us.updated"))
            .await
            .unwrap()
            .len(),
        1,
        "only {k}.#"
    );
    assert!(client
        .test_routing(&format!("other{k}.x"))
        .await
        .unwrap()
        .is_empty());

    // send_topic returns how many queues got the message.
    assert_eq!(
        client
            .send_topic(&format!("{k}.eu.created"), &json!({"e": 1}))
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        client
            .send_topic(&format!("{k}.us.created"), &json!({"e": 2}))
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        client
            .send_topic(&format!("other{k}.x"), &json!({"e": 3}))
            .await
            .unwrap(),
        0
    );
    let h = json!({"tenant": "t1"});
    assert_eq!(
        client
            .send_topic_with(
                &format!("{k}.eu.deleted"),
                &json!({"e": 4}),
                &SendOptions::new()
                    .headers(h.clone())
                    .delay(Duration::from_secs(60)),
            )
            .await
            .unwrap(),
        2
    );

    let bodies = |msgs: Vec<Message>| -> Vec<Value> {
        msgs.into_iter().map(|m| m.body["e"].clone()).collect()
    };
    let mut got = bodies(common::ok(client.read(&all, VT, 10).await.unwrap()));
    got.sort_by_key(|v| v.as_i64());
    assert_eq!(got, [json!(1), json!(2)], "e4 is delayed");
    assert_eq!(
        bodies(common::ok(client.read(&eu, VT, 10).await.unwrap())),
        [json!(1)]
    );
    let mut got = bodies(common::ok(client.read(&created, VT, 10).await.unwrap()));
    got.sort_by_key(|v| v.as_i64());
    assert_eq!(got, [json!(1), json!(2)]);
    // The delayed one is there, hidden, with its headers.
    let pg = common::raw().await;
    let hidden: Option<Value> = common::scalar(
        &pg,
        &format!(
            "SELECT headers FROM {} WHERE message->>'e' = '4' AND vt > now()",
            eu.table()
        ),
        &[],
    )
    .await;
    assert_eq!(hidden, Some(h));

    // send_batch_topic: one (queue, id) per stored message.
    let sent = client
        .send_batch_topic_with(
            &format!("{k}.eu.created"),
            &[json!({"b": 1}), json!({"b": 2})],
            &pgmq_client::SendOptions::new()
                .headers_each([json!({"i": 1}), json!({"i": 2})].to_vec()),
        )
        .await
        .unwrap();
    assert_eq!(sent.len(), 6, "2 messages x 3 queues");
    let mut per_queue: HashMap<String, Vec<i64>> = HashMap::new();
    for (q, id) in sent {
        per_queue.entry(q).or_default().push(id);
    }
    assert_eq!(per_queue.len(), 3);
    assert!(per_queue.values().all(|ids| ids.len() == 2));
    let in_eu: Vec<Message> = common::ok(client.read(&eu, VT, 10).await.unwrap());
    let mut ids = common::ids(&in_eu);
    ids.sort_unstable();
    let mut expected = per_queue[eu.as_str()].clone();
    expected.sort_unstable();
    assert_eq!(ids, expected);
    assert!(in_eu.iter().all(|m| m.header("i").is_some()));

    // Batch with a timestamp delay, and with a delay in seconds.
    assert_eq!(client.read::<Value>(&all, VT, 10).await.unwrap().len(), 2);
    let later = Utc::now() + chrono::Duration::hours(1);
    let sent = client
        .send_batch_topic_with(
            &format!("{k}.x"),
            &[json!(1)],
            &pgmq_client::SendOptions::new().delay(later),
        )
        .await
        .unwrap();
    assert_eq!(sent.len(), 1);
    let sent = client
        .send_batch_topic_with(
            &format!("{k}.x"),
            &[json!(1)],
            &pgmq_client::SendOptions::new().delay(std::time::Duration::from_secs(60)),
        )
        .await
        .unwrap();
    assert_eq!(sent, vec![(all.as_str().to_owned(), sent[0].1)]);
    assert!(client.read::<Value>(&all, VT, 10).await.unwrap().is_empty());
    assert!(client
        .send_batch_topic::<Value>(&format!("{k}.x"), &[])
        .await
        .unwrap()
        .is_empty());

    // Listing and unbinding.
    let mine = client.list_topic_bindings(Some(&eu)).await.unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].pattern, format!("{k}.eu.*"));
    assert_eq!(mine[0].queue_name, eu.as_str());
    let everything = client.list_topic_bindings(None).await.unwrap();
    assert!(
        everything
            .iter()
            .filter(|b| b.pattern.starts_with(&format!("{k}.")))
            .count()
            == 3
    );
    assert!(client
        .unbind_topic(&format!("{k}.eu.*"), &eu)
        .await
        .unwrap());
    assert!(!client
        .unbind_topic(&format!("{k}.eu.*"), &eu)
        .await
        .unwrap());
    assert_eq!(
        client
            .send_topic(&format!("{k}.eu.created"), &json!({}))
            .await
            .unwrap(),
        2
    );
    assert!(client
        .list_topic_bindings(Some(&eu))
        .await
        .unwrap()
        .is_empty());

    // Dropping a queue removes its bindings.
    assert!(client.drop_queue(&created).await.unwrap());
    assert_eq!(
        client
            .test_routing(&format!("{k}.eu.created"))
            .await
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn bad_patterns_and_keys_are_database_errors() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "tp_bad").await;
    for pattern in ["", "a..b", "a.b'c", "a b"] {
        let err = client.bind_topic(pattern, &q).await.unwrap_err();
        assert!(
            matches!(err, Error::Database { .. }),
            "{pattern:?}: {err:?}"
        );
        assert!(err.sqlstate().is_some(), "{pattern:?}");
        assert_eq!(err.outcome(), pgmq_client::CommitOutcome::Rejected);
    }
    for key in ["", "a.*", "a.#", "a..b"] {
        let err = client.send_topic(key, &json!(1)).await.unwrap_err();
        assert!(matches!(err, Error::Database { .. }), "{key:?}: {err:?}");
        let err = client.test_routing(key).await.unwrap_err();
        assert!(matches!(err, Error::Database { .. }), "{key:?}: {err:?}");
    }
    assert!(client
        .list_topic_bindings(Some(&q))
        .await
        .unwrap()
        .is_empty());
}
