//! `Pgmq::move_batch` against the real database: what a move takes and
//! keeps, and that a move through connections cut at random loses and
//! doubles nothing.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use pgmq_client::{Client, Error, MoveBatch, MoveSelection, QueueName, SendOptions};
use pgmq_testkit::proxy::Proxy;
use serde_json::{json, Value};

use common::Queues;

/// The bodies' `n` and the headers of every message of `q`, by msg_id.
async fn contents(q: &QueueName) -> Vec<(i64, Option<Value>)> {
    let pg = common::raw().await;
    let sql = format!(
        "SELECT (message->>'n')::bigint, headers FROM {} ORDER BY msg_id",
        q.quoted_table()
    );
    pg.query(&sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Moves by ids, by a filter on the body and on the headers, and all: the
/// copies keep body and headers exactly, get new ids (returned beside the
/// old), start at read_ct 0; messages being handled stay.
#[tokio::test]
async fn a_move_takes_what_it_selects_and_keeps_body_and_headers() {
    let client = common::client().await;
    let qs = Queues::new();
    let from = qs.fresh(&client, "mv_from").await;
    let to = qs.fresh(&client, "mv_to").await;
    let bodies: Vec<Value> = (0..6)
        .map(|n| json!({"n": n, "region": if n % 2 == 0 { "eu" } else { "us" }}))
        .collect();
    let headers: Vec<Value> = (0..6).map(|n| json!({"h": n, "big": 1e300})).collect();
    let ids = client
        .send_batch_with(&from, &bodies, &SendOptions::new().headers_each(headers))
        .await
        .unwrap();
    // Message 5 is being handled: read, hidden for a minute.
    client
        .set_vt(&from, ids[5], Duration::from_secs(60))
        .await
        .unwrap();

    let by_id = MoveBatch::new(MoveSelection::Ids(vec![ids[1], ids[5]]));
    let moved = client.move_batch(&from, &to, &by_id).await.unwrap();
    assert_eq!(moved.len(), 1, "the hidden message moved: {moved:?}");
    assert_eq!(moved[0].msg_id, ids[1]);

    let eu = MoveBatch::new(MoveSelection::Matching {
        body: Some(json!({"region": "eu"})),
        headers: Some(json!({"h": 2})),
    });
    let moved = client.move_batch(&from, &to, &eu).await.unwrap();
    assert_eq!(moved.iter().map(|m| m.msg_id).collect::<Vec<_>>(), [ids[2]]);

    let all = MoveBatch::new(MoveSelection::All).limit(2);
    let first = client.move_batch(&from, &to, &all).await.unwrap();
    assert_eq!(
        first.iter().map(|m| m.msg_id).collect::<Vec<_>>(),
        [ids[0], ids[3]]
    );
    let rest = client
        .move_batch(&from, &to, &all.clone().after(ids[3]))
        .await
        .unwrap();
    assert_eq!(rest.iter().map(|m| m.msg_id).collect::<Vec<_>>(), [ids[4]]);

    let left = contents(&from).await;
    assert_eq!(left, vec![(5, Some(json!({"h": 5, "big": 1e300})))]);
    let there = contents(&to).await;
    assert_eq!(
        there.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        [1, 2, 0, 3, 4]
    );
    for (n, h) in &there {
        assert_eq!(h, &Some(json!({"h": n, "big": 1e300})), "headers of {n}");
    }
    let pg = common::raw().await;
    let read_cts = common::msg_states(&pg, &to).await;
    assert!(read_cts.iter().all(|(_, ct, _)| *ct == 0), "{read_cts:?}");
}

/// A missing target or source is QueueNotFound naming it, and moves nothing;
/// a move to the same queue is refused.
#[tokio::test]
async fn a_move_to_a_missing_queue_names_it_and_moves_nothing() {
    let client = common::client().await;
    let qs = Queues::new();
    let from = qs.fresh(&client, "mv_src").await;
    let missing = qs.name("mv_missing");
    client.send(&from, &json!({"n": 1})).await.unwrap();
    let all = MoveBatch::new(MoveSelection::All);
    match client.move_batch(&from, &missing, &all).await {
        Err(Error::QueueNotFound { queue }) => assert_eq!(queue, missing.as_str()),
        other => panic!("{other:?}"),
    }
    match client.move_batch(&missing, &from, &all).await {
        Err(Error::QueueNotFound { queue }) => assert_eq!(queue, missing.as_str()),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        client.move_batch(&from, &from, &all).await,
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(contents(&from).await.len(), 1);
}

/// Moves through a proxy that cuts the connection at various points of
/// every other batch, retrying each failed batch: every message ends in exactly
/// one of the two queues, none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_through_cut_connections_loses_and_doubles_nothing() {
    const N: i64 = 600;
    let direct = common::client().await;
    let qs = Queues::new();
    let from = qs.fresh(&direct, "mv_cut_from").await;
    let to = qs.fresh(&direct, "mv_cut_to").await;
    let bodies: Vec<Value> = (0..N).map(|n| json!({ "n": n })).collect();
    for chunk in bodies.chunks(500) {
        direct.send_batch(&from, chunk).await.unwrap();
    }
    let cfg: tokio_postgres::Config = common::dsn().parse().unwrap();
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let proxy = Proxy::start(
        "127.0.0.1:0".parse().unwrap(),
        format!("127.0.0.1:{port}").parse().unwrap(),
    )
    .await
    .unwrap();
    // Each chunk a little late, so that cuts land inside statements too.
    proxy.set_latency(Duration::from_millis(2));
    let via = common::dsn().replace(&format!(":{port}/"), &format!(":{}/", proxy.addr().port()));
    assert_ne!(via, common::dsn(), "the test DSN names its port");
    let client = Client::builder(&via)
        .connect_timeout(Duration::from_secs(2))
        .pool_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let proxy = std::sync::Arc::new(proxy);
    let (mut failed, mut moved, mut round) = (0u32, 0usize, 0u64);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the move never ended"
        );
        let batch = MoveBatch::new(MoveSelection::All).limit(20);
        // Every other batch, a cut 0 to 9 ms after the call starts: before
        // the statement reaches the server, while it runs, or as its
        // result comes back (each chunk waits 2 ms in the proxy).
        if round % 2 == 1 {
            let p = proxy.clone();
            let ms = (round * 7) % 10;
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                p.cut_all();
            });
        }
        round += 1;
        match client.move_batch(&from, &to, &batch).await {
            Ok(done) if done.is_empty() => break,
            Ok(done) => moved += done.len(),
            Err(e) => {
                assert!(e.is_transient(), "{e}");
                failed += 1;
            }
        }
    }
    assert!(
        failed > 0,
        "no batch failed: the proxy never cut a statement"
    );
    assert!(contents(&from).await.is_empty());
    let there: Vec<i64> = contents(&to).await.iter().map(|(n, _)| *n).collect();
    let distinct: BTreeSet<i64> = there.iter().copied().collect();
    assert_eq!(there.len(), distinct.len(), "a message was doubled");
    assert_eq!(
        distinct,
        (0..N).collect::<BTreeSet<_>>(),
        "a message was lost"
    );
    assert!(
        moved <= N as usize,
        "{moved} reported moved of {N} ({failed} failed)"
    );
}
