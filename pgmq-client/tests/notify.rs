//! NOTIFY on insert: the channel `pgmq.q_<name>.INSERT` fires on commit,
//! throttles are listed, updated and disabled, and a [`Listener`] ends when
//! its connection is lost.

mod common;

use std::time::Duration;

use pgmq_client::{ClientBuilder, Error, Listener, Notification, Pgmq};
use serde_json::json;

use common::Queues;

/// The next notification within `d`, if any.
async fn next_within(l: &mut Listener, d: Duration) -> Option<Notification> {
    tokio::time::timeout(d, l.recv()).await.ok().flatten()
}

/// Waits `d` and returns every notification received meanwhile.
async fn drain(l: &mut Listener, d: Duration) -> Vec<Notification> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + d;
    while let Ok(Some(n)) = tokio::time::timeout_at(deadline, l.recv()).await {
        out.push(n);
    }
    out
}

#[tokio::test]
async fn insert_notifies_listeners_on_commit() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "nt").await;
    let other = qs.fresh(&client, "nt_other").await;
    client
        .enable_notify_insert(&q, Duration::ZERO)
        .await
        .unwrap();
    client
        .enable_notify_insert(&other, Duration::ZERO)
        .await
        .unwrap();
    let mut l = Listener::connect(&ClientBuilder::new(&common::dsn()))
        .await
        .unwrap();
    l.listen(&q).await.unwrap();

    client.send(&q, &json!({"a": 1})).await.unwrap();
    let n = next_within(&mut l, Duration::from_secs(3))
        .await
        .expect("a notification after the insert");
    assert_eq!(n.channel, q.insert_channel());
    assert_eq!(n.channel, format!("pgmq.q_{}.INSERT", q.as_str()));
    assert!(n.payload.is_empty(), "PGMQ sends no payload");

    // Another queue's inserts are not on this channel.
    client.send(&other, &json!({"b": 1})).await.unwrap();
    assert!(drain(&mut l, Duration::from_millis(300)).await.is_empty());

    // A rolled-back insert notifies nobody; a committed one does, at commit.
    let mut conn = client.connection().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    Pgmq::on(&tx).send(&q, &json!({"c": 1})).await.unwrap();
    assert!(drain(&mut l, Duration::from_millis(200)).await.is_empty());
    tx.rollback().await.unwrap();
    assert!(drain(&mut l, Duration::from_millis(300)).await.is_empty());
    let tx = conn.transaction().await.unwrap();
    Pgmq::on(&tx).send(&q, &json!({"c": 2})).await.unwrap();
    assert!(
        drain(&mut l, Duration::from_millis(200)).await.is_empty(),
        "not before commit"
    );
    tx.commit().await.unwrap();
    assert!(next_within(&mut l, Duration::from_secs(3)).await.is_some());

    // A batch insert: at least one notification (PostgreSQL folds identical
    // notifications of one transaction into one).
    client
        .send_batch(&q, &[json!(1), json!(2), json!(3)])
        .await
        .unwrap();
    let got = drain(&mut l, Duration::from_millis(500)).await;
    assert!(!got.is_empty() && got.len() <= 3, "{got:?}");

    // Unlisten: nothing more arrives.
    l.unlisten(&q).await.unwrap();
    client.send(&q, &json!({"d": 1})).await.unwrap();
    assert!(drain(&mut l, Duration::from_millis(300)).await.is_empty());
    assert!(!l.is_closed());
}

#[tokio::test]
async fn throttles_are_listed_updated_and_disabled() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "nt_throttle").await;
    let mut l = Listener::connect(&ClientBuilder::new(&common::dsn()))
        .await
        .unwrap();
    l.listen(&q).await.unwrap();

    // Not enabled: no trigger, no notification, not listed; update refuses.
    client.send(&q, &1).await.unwrap();
    assert!(drain(&mut l, Duration::from_millis(300)).await.is_empty());
    let listed = |all: Vec<pgmq_client::NotifyThrottle>| {
        all.into_iter()
            .find(|t| t.queue_name == q.as_str())
            .map(|t| t.throttle_interval_ms)
    };
    assert_eq!(
        listed(client.list_notify_insert_throttles().await.unwrap()),
        None
    );
    let err = client
        .update_notify_insert(&q, Duration::from_millis(10))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Database { .. }), "{err:?}");

    // A long throttle: the first insert notifies, the next ones within the
    // interval do not.
    client
        .enable_notify_insert(&q, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        listed(client.list_notify_insert_throttles().await.unwrap()),
        Some(60_000)
    );
    for i in 0..3 {
        client.send(&q, &i).await.unwrap();
    }
    let got = drain(&mut l, Duration::from_millis(600)).await;
    assert_eq!(got.len(), 1, "throttled to one: {got:?}");

    // Updating resets the throttle window and changes the interval.
    client
        .update_notify_insert(&q, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        listed(client.list_notify_insert_throttles().await.unwrap()),
        Some(0)
    );
    for i in 0..3 {
        client.send(&q, &i).await.unwrap();
        assert!(
            next_within(&mut l, Duration::from_secs(3)).await.is_some(),
            "unthrottled: every insert notifies ({i})"
        );
    }
    let t = client
        .list_notify_insert_throttles()
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.queue_name == q.as_str())
        .unwrap();
    assert!(t.last_notified_at > chrono::Utc::now() - chrono::Duration::seconds(30));

    // Enabling again just updates; disabling removes trigger and row.
    client
        .enable_notify_insert(&q, Duration::from_millis(5))
        .await
        .unwrap();
    assert_eq!(
        listed(client.list_notify_insert_throttles().await.unwrap()),
        Some(5)
    );
    client.disable_notify_insert(&q).await.unwrap();
    client.disable_notify_insert(&q).await.unwrap();
    assert_eq!(
        listed(client.list_notify_insert_throttles().await.unwrap()),
        None
    );
    client.send(&q, &1).await.unwrap();
    assert!(drain(&mut l, Duration::from_millis(300)).await.is_empty());
}

#[tokio::test]
async fn a_listener_ends_when_its_connection_is_lost() {
    let app = format!("pgmq-test-listener-{}", std::process::id());
    let mut l = Listener::connect(&ClientBuilder::new(&common::dsn()).application_name(&app))
        .await
        .unwrap();
    let qs = Queues::new();
    let client = common::client().await;
    let q = qs.fresh(&client, "nt_lost").await;
    l.listen(&q).await.unwrap();
    let pg = common::raw().await;
    let killed: i64 = common::scalar(
        &pg,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
        &[&app],
    )
    .await;
    assert_eq!(killed, 1);
    let end = tokio::time::timeout(Duration::from_secs(5), l.recv()).await;
    assert_eq!(
        end,
        Ok(None),
        "recv returns None once the connection is gone"
    );
    assert!(l.is_closed());
    let err = l.listen(&q).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
}
