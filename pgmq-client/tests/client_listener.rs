//! `Client::listener`: a LISTEN connection opened with the client's own
//! settings (outside its pool) receives the queue's insert notifications.

mod common;

use std::time::Duration;

use pgmq_client::{ConnectionManager, Error};

#[tokio::test]
async fn listener_from_a_client_receives_inserts() {
    let client = common::client().await;
    let q = common::fresh_queue(&client, "lsn").await;
    client
        .enable_notify_insert(&q, Duration::ZERO)
        .await
        .unwrap();
    let mut l = client.listener().await.unwrap();
    l.listen(&q).await.unwrap();
    client.send(&q, &serde_json::json!({"a": 1})).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), l.recv())
        .await
        .expect("a notification within 5 s")
        .expect("the listener is open");
    assert_eq!(n.channel, q.insert_channel());
    client.drop_queue(&q).await.unwrap();
}

#[tokio::test]
async fn a_client_from_a_callers_pool_cannot_open_a_listener() {
    let builder = pgmq_client::ClientBuilder::new(&common::dsn());
    let manager = ConnectionManager::new(builder.pg_config().unwrap(), builder.make_tls().unwrap());
    let pool = bb8::Pool::builder().max_size(1).build_unchecked(manager);
    let client = pgmq_client::Client::from_pool(pool).await.unwrap();
    let err = client.listener().await.unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
}
