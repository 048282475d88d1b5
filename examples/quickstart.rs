//! Quickstart: create a queue, send, read, delete.
//!
//! `cargo run -p pgmq-examples --example quickstart` (reads `DATABASE_URL`;
//! default: the docker compose database).

use std::time::Duration;

use pgmq_client::{Client, QueueName};

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Greeting {
    text: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::connect(&pgmq_examples::database_url()).await?;
    let queue = QueueName::new("quickstart")?;
    client.create(&queue).await?;
    println!("created queue {queue}");

    let id = client
        .send(
            &queue,
            &Greeting {
                text: "hello".into(),
            },
        )
        .await?;
    println!("sent message {id}");

    for msg in client
        .read::<Greeting>(&queue, Duration::from_secs(30), 10)
        .await?
    {
        // A body that is not a Greeting would come back as Err(Undecoded).
        let msg = msg?;
        println!(
            "read message {}: {:?} (read {} time)",
            msg.msg_id, msg.body, msg.read_ct
        );
        client.delete(&queue, msg.msg_id).await?;
        println!("deleted message {}", msg.msg_id);
    }
    client.drop_queue(&queue).await?;
    println!("dropped queue {queue}");
    Ok(())
}
