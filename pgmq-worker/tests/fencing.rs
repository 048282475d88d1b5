//! Fenced writes: a worker whose claim expired and was taken by another
//! delivery changes nothing of that delivery, whatever it writes late, and
//! reports the claim as lost.
//!
//! The scenario: worker A runs a message; while A's handler still runs, the
//! message's visibility timeout ends and B (here the test) claims it. The
//! expiry and B's read are made deterministic by one statement doing what
//! `pgmq.read` does to the row (new `last_read_at`, `read_ct + 1`, a new
//! `vt`), as a paused process or a slow database would let happen. Then A finishes with each outcome in turn, or its
//! heartbeat fires, and B's claim must be untouched.
//!
//! The control that shows the scenario can fail:
//! `unfenced_writes_change_the_later_claim` does what A did before the
//! fence (PGMQ's `delete` and `set_vt` by id) and sees B's claim deleted or
//! made visible early.

mod common;

use std::time::Duration;

use common::{client, queue_len, unique, wait_for, Queues};
use pgmq_client::{Client, Delay, Message, QueueName, Requeue};
use pgmq_worker::{Context, Outcome, Worker};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

const WAIT: Duration = Duration::from_secs(20);

/// B's claim of the message: its delivery, as the table holds it.
#[derive(Debug, PartialEq)]
struct Claim {
    read_ct: i32,
    /// NULL once a requeue ended the delivery.
    last_read_at: Option<chrono::DateTime<chrono::Utc>>,
    vt: chrono::DateTime<chrono::Utc>,
}

async fn claim_of(client: &Client, q: &QueueName, id: i64) -> Option<Claim> {
    let conn = client.connection().await.unwrap();
    let row = conn
        .query_opt(
            &format!(
                "SELECT read_ct, last_read_at, vt FROM {} WHERE msg_id = $1",
                q.quoted_table()
            ),
            &[&id],
        )
        .await
        .unwrap()?;
    Some(Claim {
        read_ct: row.get(0),
        last_read_at: row.get(1),
        vt: row.get(2),
    })
}

/// Claims the message as B, for 60 s, as if A's claim had expired and B's
/// `pgmq.read` had taken it.
async fn steal(client: &Client, q: &QueueName, id: i64) -> Claim {
    common::take_claim_over(client, q, id).await;
    claim_of(client, q, id).await.unwrap()
}

/// What A's handler does once B holds the message.
#[derive(Debug, Clone)]
enum Late {
    Outcome(Outcome),
    /// Keeps running until its context is cancelled (by the heartbeat that
    /// finds the claim lost), then deletes.
    WaitForCancel,
}

async fn a_writes_late(late: Late) {
    let client = client().await;
    let q = unique("fence");
    let dlq = unique("fence_dlq");
    let _g = Queues::new(&client, &[&q, &dlq]).await;
    let id = client.send(&q, &json!({"n": 1})).await.unwrap();

    let (started_tx, mut started) = mpsc::unbounded_channel::<()>();
    let (go_tx, go) = oneshot::channel::<()>();
    let go = std::sync::Mutex::new(Some(go));
    let heartbeat = matches!(late, Late::WaitForCancel);
    let outcome = late.clone();
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .visibility_timeout(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(50))
        .heartbeat(heartbeat)
        .dead_letter_queue(dlq.clone())
        .handler_with_context(move |_m: Message<Value>, ctx: Context| {
            let _ = started_tx.send(());
            let go = go.lock().unwrap().take();
            let outcome = outcome.clone();
            async move {
                match outcome {
                    Late::Outcome(o) => {
                        if let Some(go) = go {
                            let _ = go.await;
                        }
                        Ok(o)
                    }
                    Late::WaitForCancel => {
                        ctx.cancelled().await;
                        Ok(Outcome::Delete)
                    }
                }
            }
        })
        .build()
        .unwrap();
    let handle = worker.spawn();
    tokio::time::timeout(WAIT, started.recv()).await.unwrap();
    let b = steal(&client, &q, id).await;
    // A's late write: its handler returns now (or, with the heartbeat, the
    // next extension finds the claim lost and cancels it).
    let _ = go_tx.send(());
    wait_for(WAIT, "A reports the claim lost", || async {
        handle.stats().claims_lost == 1 && handle.stats().acks_pending == 0
    })
    .await;
    // Give any stray write time to land before looking.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        claim_of(&client, &q, id).await,
        Some(b),
        "{late:?}: B's claim changed"
    );
    assert_eq!(queue_len(&client, &dlq).await, 0, "{late:?}: dead-lettered");
    assert_eq!(
        common::archive_len(&client, &q).await,
        0,
        "{late:?}: archived"
    );
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.claims_lost, 1, "{late:?}");
    assert_eq!(report.acks_failed, 0, "{late:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_delete_leaves_the_later_claim_alone() {
    a_writes_late(Late::Outcome(Outcome::Delete)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_retry_leaves_the_later_claim_alone() {
    a_writes_late(Late::Outcome(Outcome::Retry(Duration::from_secs(1)))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_dead_letter_leaves_the_later_claim_alone() {
    a_writes_late(Late::Outcome(Outcome::DeadLetter("late".into()))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_archive_leaves_the_later_claim_alone() {
    a_writes_late(Late::Outcome(Outcome::Archive)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_heartbeat_leaves_the_later_claim_alone_and_cancels_the_handler() {
    a_writes_late(Late::WaitForCancel).await;
}

/// The control: the same late writes without the fence (PGMQ's functions,
/// by id, as the worker wrote them before) do change B's claim, and the
/// fenced ones with A's receipt do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfenced_writes_change_the_later_claim() {
    let client = client().await;
    let q = unique("nofence");
    let _g = Queues::new(&client, &[&q]).await;
    let ids = client
        .send_batch(&q, &[json!({"n": 1}), json!({"n": 2})])
        .await
        .unwrap();
    let a = client
        .read_raw(&q, Duration::from_secs(30), 2)
        .await
        .unwrap();
    let a: Vec<_> = a.iter().map(|m| m.receipt().unwrap()).collect();
    let b: Vec<Claim> = {
        let mut v = Vec::new();
        for id in &ids {
            v.push(steal(&client, &q, *id).await);
        }
        v
    };
    // Fenced, with A's receipts: nothing happens to B's claims.
    assert!(client.delete_fenced(&q, &a[..1]).await.unwrap().is_empty());
    let retry = [Requeue::new(a[1], Duration::ZERO)];
    assert!(client.requeue_fenced(&q, &retry).await.unwrap().is_empty());
    assert_eq!(claim_of(&client, &q, ids[0]).await.as_ref(), Some(&b[0]));
    assert_eq!(claim_of(&client, &q, ids[1]).await.as_ref(), Some(&b[1]));
    // Unfenced, by id: B's first claim is deleted, its second made visible
    // 58 s early.
    assert!(client.delete(&q, ids[0]).await.unwrap());
    assert_eq!(claim_of(&client, &q, ids[0]).await, None);
    client.set_vt(&q, ids[1], Delay::NONE).await.unwrap();
    assert!(claim_of(&client, &q, ids[1]).await.unwrap().vt < b[1].vt);
}

/// The heartbeat keeps extending a delivery until its acknowledgement is
/// written, not only while its handler runs: an acknowledgement held back
/// (here by a long `ack_flush_interval` at a low rate) past the visibility
/// timeout does not let another consumer claim the message meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_stays_claimed_until_its_acknowledgement_is_written() {
    let client = client().await;
    let q = unique("ackwait");
    let _g = Queues::new(&client, &[&q]).await;
    let id = client.send(&q, &json!({"n": 1})).await.unwrap();
    let worker: Worker<Value> = Worker::builder(client.clone(), q.clone())
        .visibility_timeout(Duration::from_secs(1))
        .poll_interval(Duration::from_millis(50))
        .ack_flush_interval(Duration::from_secs(4))
        .handler(|_m: Message<Value>| async { Ok(Outcome::Delete) })
        .build()
        .unwrap();
    let handle = worker.spawn();
    wait_for(WAIT, "handled", || async { handle.stats().handled == 1 }).await;
    // Its delete waits up to 4 s: well past the 1 s visibility timeout.
    let until = std::time::Instant::now() + Duration::from_millis(2500);
    while std::time::Instant::now() < until {
        let got = client
            .read::<Value>(&q, Duration::from_secs(30), 1)
            .await
            .unwrap();
        assert!(
            got.is_empty(),
            "claimed by another consumer while its ack waited"
        );
        // Nor claimed again by this worker (it polls faster than this loop).
        assert_eq!(
            handle.stats().handled,
            1,
            "delivered again while its ack waited"
        );
        assert_eq!(handle.stats().deleted, 0, "the ack was not held back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for(WAIT, "deleted", || async { handle.stats().deleted == 1 }).await;
    let report = handle.shutdown().await.unwrap();
    assert_eq!(report.claims_lost, 0);
    assert!(report.stats.heartbeats > 0);
    assert_eq!(claim_of(&client, &q, id).await, None);
}

/// A requeue ends its delivery: the same fenced release sent twice (a
/// retried write whose first try landed) lowers `read_ct` once, and a
/// retry's headers and delay are written once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeue_sent_twice_is_applied_once() {
    let client = client().await;
    let q = unique("requeue2");
    let _g = Queues::new(&client, &[&q]).await;
    let id = client.send(&q, &json!({"n": 1})).await.unwrap();
    // Two deliveries: read_ct 2, the second one holding it.
    let first = client.read_raw(&q, Duration::ZERO, 1).await.unwrap();
    assert_eq!(first.len(), 1);
    let second = client
        .read_raw(&q, Duration::from_secs(30), 1)
        .await
        .unwrap();
    let r = second[0].receipt().unwrap();
    assert_eq!(second[0].read_ct, 2);
    let release = [Requeue::new(r, Duration::ZERO).undo_read()];
    assert_eq!(client.requeue_fenced(&q, &release).await.unwrap(), vec![id]);
    assert!(
        client
            .requeue_fenced(&q, &release)
            .await
            .unwrap()
            .is_empty(),
        "the second copy matched the ended delivery"
    );
    let after = claim_of(&client, &q, id).await.unwrap();
    assert_eq!(after.read_ct, 1, "read_ct dropped twice");
    assert_eq!(
        after.last_read_at, None,
        "the requeue left the delivery's fence"
    );
}

/// A heartbeat's extension of a delivery that a release (or retry, or
/// snooze) already ended, landing late, does not push the visibility out:
/// the message stays visible at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_extension_after_a_release_changes_nothing() {
    let client = client().await;
    let q = unique("extlate");
    let _g = Queues::new(&client, &[&q]).await;
    let id = client.send(&q, &json!({"n": 1})).await.unwrap();
    let got = client
        .read_raw(&q, Duration::from_secs(30), 1)
        .await
        .unwrap();
    let r = got[0].receipt().unwrap();
    // An extension keeps the claim: a later write with the receipt matches.
    let extend = [Requeue::new(r, Duration::from_secs(30)).keep_claim()];
    assert_eq!(client.requeue_fenced(&q, &extend).await.unwrap(), vec![id]);
    let release = [Requeue::new(r, Duration::ZERO).undo_read()];
    assert_eq!(client.requeue_fenced(&q, &release).await.unwrap(), vec![id]);
    // The extension that was on its way lands now.
    let late = [Requeue::new(r, Duration::from_secs(3600)).keep_claim()];
    assert!(client.requeue_fenced(&q, &late).await.unwrap().is_empty());
    let visible = client
        .read_raw(&q, Duration::from_secs(30), 1)
        .await
        .unwrap();
    assert_eq!(
        visible.iter().map(|m| m.msg_id).collect::<Vec<_>>(),
        vec![id],
        "the late extension hid the released message"
    );
    assert_eq!(visible[0].read_ct, 1);
}
