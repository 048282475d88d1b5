//! The shortest path: send, read, delete, and a rolled-back send.

mod common;

use std::time::Duration;

use pgmq_client::{Message, Pgmq};

#[tokio::test]
async fn send_read_delete_roundtrip() {
    let client = common::client().await;
    let q = common::fresh_queue(&client, "smoke").await;
    let id = client
        .send(&q, &serde_json::json!({"hello": "world"}))
        .await
        .unwrap();
    let msgs: Vec<Message> =
        common::ok(client.read(&q, Duration::from_secs(30), 10).await.unwrap());
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0].msg_id, id);
    assert_eq!(msgs[0].body["hello"], "world");
    assert!(client.delete(&q, id).await.unwrap());
    let mut conn = client.connection().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    Pgmq::on(&tx).send(&q, &1).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 0);
    assert!(client.drop_queue(&q).await.unwrap());
}
