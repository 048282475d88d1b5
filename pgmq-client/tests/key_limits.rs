//! Claims under a limit per key (`Pgmq::read_key_limited_raw`), on
//! databases of their own: a key's limit holds across connections reading
//! at once, the messages of a key at its limit never hold back other keys,
//! a killed holder's places come back, and a message without the key is
//! not limited.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pgmq_client::{Error, FleetLimit, KeyFrom, KeyLimit, QueueName, ReadOptions, SendOptions};
use serde_json::json;

use common::OwnDb;

/// Sends one message a key, the key in the header `k` and in the body's
/// `who.id`.
async fn send_keys(client: &pgmq_client::Client, q: &QueueName, keys: &[&str]) {
    for k in keys {
        let headers = json!({ "k": k });
        client
            .send_with(
                q,
                &json!({ "who": { "id": k } }),
                &SendOptions::default().headers(headers),
            )
            .await
            .unwrap();
    }
}

/// A database of its own with the schema installed, and its queue `jobs`.
async fn setup(name: &str) -> (OwnDb, pgmq_client::Client, QueueName) {
    let db = OwnDb::new(name).await;
    let client = db.client().await;
    client.install_sdk_schema().await.unwrap();
    let q = QueueName::new("jobs").unwrap();
    client.create(&q).await.unwrap();
    (db, client, q)
}

/// How many messages one claim under `limit` takes.
async fn claim(
    client: &pgmq_client::Client,
    q: &QueueName,
    limit: &KeyLimit,
    opts: &ReadOptions,
) -> usize {
    client
        .read_key_limited_raw(q, limit, opts)
        .await
        .unwrap()
        .len()
}

fn key_of(m: &pgmq_client::Message<pgmq_client::RawJson>) -> String {
    let v: serde_json::Value = serde_json::from_str(m.body.get()).unwrap();
    v["who"]["id"].as_str().unwrap_or("").to_string()
}

#[tokio::test]
async fn a_hot_key_at_its_limit_holds_back_no_other_key() {
    let (db, client, q) = setup("key_limit_hol").await;
    // Twenty messages of one key at the head, then ten keys of one each.
    send_keys(&client, &q, &["hot"; 20]).await;
    let cold: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
    send_keys(
        &client,
        &q,
        &cold.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
    )
    .await;
    let limit = KeyLimit::new(KeyFrom::header("k").unwrap(), FleetLimit::max_running(2));
    let opts = ReadOptions::new(Duration::from_secs(30)).qty(10);

    let mut got = Vec::new();
    for _ in 0..3 {
        got.extend(
            client
                .read_key_limited_raw(&q, &limit, &opts)
                .await
                .unwrap(),
        );
    }
    let hot = got.iter().filter(|m| key_of(m) == "hot").count();
    assert_eq!(hot, 2, "the hot key is at its limit of 2");
    let mut cold_got: Vec<String> = got.iter().map(key_of).filter(|k| k != "hot").collect();
    cold_got.sort();
    let mut want = cold.clone();
    want.sort();
    assert_eq!(
        cold_got, want,
        "every cold key claimed past the hot key's backlog"
    );
    // The hot key's other messages are in the queue, untouched.
    let untouched: i64 = common::scalar(
        &common::raw_to(&db.dsn()).await,
        "SELECT count(*) FROM pgmq.q_jobs WHERE read_ct = 0",
        &[],
    )
    .await;
    assert_eq!(untouched, 18);

    // A delete frees the key's place at once.
    let first_hot = got.iter().find(|m| key_of(m) == "hot").unwrap().msg_id;
    client.delete(&q, first_hot).await.unwrap();
    let next = client
        .read_key_limited_raw(&q, &limit, &opts)
        .await
        .unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(key_of(&next[0]), "hot");

    // Keyed by the body, the same.
    let by_body = KeyLimit::new(
        KeyFrom::body(["who", "id"]).unwrap(),
        FleetLimit::max_running(3),
    );
    assert_eq!(
        claim(&client, &q, &by_body, &opts).await,
        1,
        "3 of the hot key run now (2 of them claimed above)"
    );
}

#[tokio::test]
async fn a_killed_holders_places_come_back_within_its_vt() {
    let (db, client, q) = setup("key_limit_vt").await;
    send_keys(&client, &q, &["a", "a", "a"]).await;
    let limit = KeyLimit::new(KeyFrom::header("k").unwrap(), FleetLimit::max_running(1));
    let short = ReadOptions::new(Duration::from_secs(1)).qty(10);
    {
        // The holder: its own connection, gone without acknowledging.
        let holder = db.client().await;
        assert_eq!(claim(&holder, &q, &limit, &short).await, 1);
    }
    assert_eq!(claim(&client, &q, &limit, &short).await, 0);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(claim(&client, &q, &limit, &short).await, 1);
}

#[tokio::test]
async fn messages_without_the_key_are_not_limited_and_bad_paths_are_refused() {
    let (db, client, q) = setup("key_limit_none").await;
    client.send_batch(&q, &[1, 2, 3, 4, 5]).await.unwrap();
    let limit = KeyLimit::new(KeyFrom::header("k").unwrap(), FleetLimit::max_running(1));
    let opts = ReadOptions::new(Duration::from_secs(30)).qty(10);
    assert_eq!(claim(&client, &q, &limit, &opts).await, 5);
    assert!(KeyFrom::header("").is_err());
    assert!(KeyFrom::body(["a", ""]).is_err());
    assert!(KeyFrom::body(vec!["x"; 17]).is_err());
    let none = KeyLimit::new(KeyFrom::header("k").unwrap(), FleetLimit::default());
    let e = client
        .read_key_limited_raw(&q, &none, &opts)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    // A path is data: quotes and SQL in it name a field, nothing more.
    let odd = KeyLimit::new(
        KeyFrom::header("k'); DROP TABLE pgmq.q_jobs; --").unwrap(),
        FleetLimit::max_running(1),
    );
    client.read_key_limited_raw(&q, &odd, &opts).await.unwrap();
    assert!(client.key_limit_available().await.unwrap());
    // A snapshot held for a whole transaction would count stale claims.
    let raw = common::raw_to(&db.dsn()).await;
    raw.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    let e = raw
        .query(
            "SELECT * FROM pgmq_sdk.read_key_limited('jobs', 30, 1, true, '{k}', 1, NULL, NULL)",
            &[],
        )
        .await
        .unwrap_err();
    let msg = e.as_db_error().map(|d| d.message().to_owned());
    assert!(
        msg.as_deref().is_some_and(|m| m.contains("READ COMMITTED")),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_keys_rate_holds_and_other_keys_go_at_full_rate() {
    let (_db, client, q) = setup("key_limit_rate").await;
    send_keys(&client, &q, &["slow"; 40]).await;
    let fast: Vec<String> = (0..40).map(|i| format!("f{}", i % 4)).collect();
    send_keys(
        &client,
        &q,
        &fast.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
    )
    .await;
    // 5 a second a key, a bucket of 1.
    let limit = KeyLimit::new(
        KeyFrom::header("k").unwrap(),
        FleetLimit::per_second(5.0).with_burst(1.0),
    );
    let opts = ReadOptions::new(Duration::from_secs(30)).qty(50);
    let start = std::time::Instant::now();
    let mut slow = 0usize;
    let mut others = 0usize;
    while start.elapsed() < Duration::from_millis(600) {
        for m in client
            .read_key_limited_raw(&q, &limit, &opts)
            .await
            .unwrap()
        {
            if key_of(&m) == "slow" {
                slow += 1;
            } else {
                others += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    assert!(
        slow as f64 <= 1.0 + 5.0 * secs + 1.0,
        "{slow} claims of one key in {secs:.2} s at 5 a second"
    );
    assert!(slow >= 1);
    // Each of the four other keys has its own bucket: at least its first
    // claim came at once, beside the slow key's.
    assert!(others >= 4, "{others}");
}

#[tokio::test]
async fn claimers_on_many_connections_never_pass_a_keys_limit() {
    let (db, client, q) = setup("key_limit_many").await;
    let keys = ["a", "b", "c"];
    let mut all = Vec::new();
    for i in 0..150 {
        all.push(keys[i % 3]);
    }
    send_keys(&client, &q, &all).await;
    const LIMIT: usize = 2;
    let limit = KeyLimit::new(
        KeyFrom::header("k").unwrap(),
        FleetLimit::max_running(LIMIT as u32),
    );
    // Per key, the claims a claimer holds: raised after its claim returned,
    // lowered before its delete is sent, so never above what the database
    // holds.
    let running: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let worst = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let c = db.client().await;
        let (q, limit) = (q.clone(), limit.clone());
        let (running, worst, done, stop) =
            (running.clone(), worst.clone(), done.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let opts = ReadOptions::new(Duration::from_secs(30)).qty(4);
            while !stop.load(Ordering::SeqCst) {
                let got = c.read_key_limited_raw(&q, &limit, &opts).await.unwrap();
                if got.is_empty() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                for m in &got {
                    let mut r = running.lock().unwrap();
                    let n = r.entry(key_of(m)).or_default();
                    *n += 1;
                    worst.fetch_max(*n, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
                for m in &got {
                    *running.lock().unwrap().get_mut(&key_of(m)).unwrap() -= 1;
                    c.delete(&q, m.msg_id).await.unwrap();
                    done.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while done.load(Ordering::SeqCst) < all.len() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        done.load(Ordering::SeqCst),
        all.len(),
        "every message handled"
    );
    assert_eq!(
        worst.load(Ordering::SeqCst),
        LIMIT,
        "a key's claims peaked at its limit"
    );
}

#[tokio::test]
async fn claimers_on_many_connections_keep_a_keys_rate() {
    let (db, client, q) = setup("key_limit_rates").await;
    send_keys(&client, &q, &["r"; 60]).await;
    // 10 a second, a bucket of 2, for the key across four connections.
    let limit = KeyLimit::new(
        KeyFrom::header("k").unwrap(),
        FleetLimit::per_second(10.0).with_burst(2.0),
    );
    let start = std::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let c = db.client().await;
        let (q, limit) = (q.clone(), limit.clone());
        tasks.push(tokio::spawn(async move {
            let opts = ReadOptions::new(Duration::from_secs(30)).qty(10);
            let mut n = 0;
            while start.elapsed() < Duration::from_millis(800) {
                n += claim(&c, &q, &limit, &opts).await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    // The bucket's 2, then 10 a second.
    assert!(
        total as f64 <= 2.0 + 10.0 * secs + 1.0,
        "{total} claims in {secs:.2} s"
    );
    assert!(total >= 2, "{total}");
}
