//! Two ways to shape delivery with PGMQ:
//!
//! 1. Fan-out with topics: queues bind routing-key patterns (`*` matches one
//!    dot-separated word, `#` zero or more); `send_topic` stores one copy of
//!    the message in every queue whose pattern matches.
//! 2. FIFO groups: messages carrying the `x-pgmq-group` header are delivered
//!    in order within their group; `read_grouped` hands out a group's next
//!    message only once every earlier one of that group was deleted or
//!    archived, while other groups keep flowing.
//!
//! `cargo run -p pgmq-examples --example topics_fifo` (reads `DATABASE_URL`).

use std::time::Duration;

use pgmq_client::{Client, GroupStrategy, QueueName, ReadOptions, SendOptions, FIFO_GROUP_HEADER};
use serde_json::{json, Value};

const VT: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::connect(&pgmq_examples::database_url()).await?;
    let eu = pgmq_examples::demo_queue("topics_eu")?;
    let created = pgmq_examples::demo_queue("topics_created")?;
    let audit = pgmq_examples::demo_queue("topics_audit")?;
    let ledger = pgmq_examples::demo_queue("fifo_ledger")?;
    let queues = [eu.clone(), created.clone(), audit.clone(), ledger.clone()];
    for q in &queues {
        client.create(q).await?;
    }
    println!("created queues {}", names(&queues));

    let result = async {
        topics(&client, &eu, &created, &audit).await?;
        fifo(&client, &ledger).await
    }
    .await;

    // Dropping a queue also removes its topic bindings.
    for q in &queues {
        client.drop_queue(q).await?;
    }
    println!("dropped queues {}", names(&queues));
    result
}

async fn topics(
    client: &Client,
    eu: &QueueName,
    created: &QueueName,
    audit: &QueueName,
) -> Result<(), Box<dyn std::error::Error>> {
    println!("\n== fan-out with topics");
    // Routing keys carry this process's id so that other users of the
    // database (whose patterns may be broad) do not see our messages.
    let p = format!("shop{}", std::process::id());
    let bindings = [
        (format!("{p}.orders.eu.*"), eu),
        (format!("{p}.orders.*.created"), created),
        (format!("{p}.#"), audit),
    ];
    for (pattern, q) in &bindings {
        client.bind_topic(pattern, q).await?;
        println!("bound {pattern:<28} -> {q}");
    }

    let key = format!("{p}.orders.eu.created");
    let routes = client.test_routing(&key).await?;
    println!(
        "test_routing({key}) would reach: {}",
        routes
            .iter()
            .map(|r| r.queue_name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );

    for (key, body) in [
        (
            format!("{p}.orders.eu.created"),
            json!({"order": 1, "region": "eu"}),
        ),
        (
            format!("{p}.orders.us.created"),
            json!({"order": 2, "region": "us"}),
        ),
        (
            format!("{p}.orders.eu.shipped"),
            json!({"order": 1, "status": "shipped"}),
        ),
        (format!("{p}.billing.invoice"), json!({"invoice": 7})),
    ] {
        let n = client.send_topic(&key, &body).await?;
        println!("send_topic({key}) stored {n} copy(ies) of {body}");
    }

    println!("who received what:");
    let mut total = 0;
    for q in [eu, created, audit] {
        let got = client
            .read::<Value>(q, VT, 10)
            .await?
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        total += got.len();
        let bodies: Vec<String> = got.iter().map(|m| m.body.to_string()).collect();
        println!(
            "  {:<24} {} message(s): {}",
            q.as_str(),
            got.len(),
            bodies.join(" ")
        );
        let ids: Vec<i64> = got.iter().map(|m| m.msg_id).collect();
        client.delete_batch(q, &ids).await?;
    }
    // eu: 2 (eu.created, eu.shipped); created: 2 (eu.created, us.created); audit: all 4.
    if total != 8 {
        return Err(format!("expected 8 deliveries across the three queues, saw {total}").into());
    }
    Ok(())
}

async fn fifo(client: &Client, ledger: &QueueName) -> Result<(), Box<dyn std::error::Error>> {
    println!("\n== FIFO groups on {ledger}");
    client.create_fifo_index(ledger).await?;
    // Interleaved sends to two accounts; each account's entries must apply in order.
    let entries = [
        ("acct-a", 1),
        ("acct-b", 1),
        ("acct-a", 2),
        ("acct-b", 2),
        ("acct-a", 3),
    ];
    for (group, seq) in entries {
        let opts = SendOptions::new().headers(json!({ FIFO_GROUP_HEADER: group }));
        let id = client
            .send_with(ledger, &json!({"account": group, "seq": seq}), &opts)
            .await?;
        println!("sent {group} #{seq} as message {id}");
    }

    // Fill: take as much as possible from the group with the oldest message.
    let batch = client
        .read_grouped::<Value>(ledger, GroupStrategy::Fill, &ReadOptions::new(VT).qty(3))
        .await?
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    println!("read_grouped(Fill, 3)       -> {}", describe(&batch));
    // While those are in flight, their group is blocked; the other group is not.
    let next = client
        .read_grouped::<Value>(ledger, GroupStrategy::Fill, &ReadOptions::new(VT).qty(3))
        .await?
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    println!("read_grouped(Fill, 3) again -> {}", describe(&next));
    check_in_order(&batch)?;
    check_in_order(&next)?;
    let first_group: Vec<&str> = batch.iter().filter_map(|m| group_of(m)).collect();
    if next
        .iter()
        .any(|m| first_group.contains(&group_of(m).unwrap_or_default()))
    {
        return Err("a group was handed out twice while its messages were in flight".into());
    }
    let ids: Vec<i64> = batch.iter().chain(&next).map(|m| m.msg_id).collect();
    client.delete_batch(ledger, &ids).await?;
    println!(
        "deleted {} message(s); each group was read in its send order",
        ids.len()
    );

    // Round-robin: one from each group in turn.
    for (group, seq) in [("acct-a", 4), ("acct-a", 5), ("acct-b", 3)] {
        let opts = SendOptions::new().headers(json!({ FIFO_GROUP_HEADER: group }));
        client
            .send_with(ledger, &json!({"account": group, "seq": seq}), &opts)
            .await?;
    }
    let rr = client
        .read_grouped::<Value>(
            ledger,
            GroupStrategy::RoundRobin,
            &ReadOptions::new(VT).qty(10),
        )
        .await?
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    println!("read_grouped(RoundRobin)    -> {}", describe(&rr));
    check_in_order(&rr)?;
    let ids: Vec<i64> = rr.iter().map(|m| m.msg_id).collect();
    client.delete_batch(ledger, &ids).await?;
    Ok(())
}

fn group_of(m: &pgmq_client::Message<Value>) -> Option<&str> {
    m.header(FIFO_GROUP_HEADER).and_then(Value::as_str)
}

fn describe(batch: &[pgmq_client::Message<Value>]) -> String {
    if batch.is_empty() {
        return "nothing".into();
    }
    batch
        .iter()
        .map(|m| {
            format!(
                "{} #{}",
                m.body["account"].as_str().unwrap_or("?"),
                m.body["seq"]
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Within each group, the sequence numbers of a batch must increase.
fn check_in_order(batch: &[pgmq_client::Message<Value>]) -> Result<(), String> {
    let mut last: std::collections::HashMap<&str, i64> = Default::default();
    for m in batch {
        let g = group_of(m).unwrap_or_default();
        let seq = m.body["seq"].as_i64().unwrap_or_default();
        if let Some(prev) = last.insert(g, seq) {
            if prev >= seq {
                return Err(format!("group {g}: #{seq} came after #{prev}"));
            }
        }
    }
    Ok(())
}

fn names(qs: &[QueueName]) -> String {
    qs.iter()
        .map(QueueName::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}
