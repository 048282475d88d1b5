//! The console in a real browser: headless Chromium driven over WebDriver
//! loads the queues page, follows a queue, goes to its dead letters,
//! redrives one, and the database shows it moved.
//!
//! Needs `chromium` and `chromium-driver` (Debian packages; .ci/run
//! installs them). Without chromedriver the test says so loudly and passes,
//! except under CI (`CI=true`), where it fails.

mod common;
#[path = "common/webdriver.rs"]
mod webdriver;

use common::*;
use pgmq_console::{router, ConsoleOptions};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_follows_a_queue_and_redrives_a_dead_letter() {
    let Some(driver) = webdriver::chromedriver() else {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("chromedriver is not installed, and CI must run the browser test");
        }
        eprintln!(
            "\n!!! SKIPPED: the console's browser test needs chromedriver \
             (apt-get install chromium chromium-driver) !!!\n"
        );
        return;
    };
    let client = client().await;
    let src = fresh(&client, "con_web").await;
    let dlq = pgmq_client::QueueName::new(&format!("{src}_dlq")).unwrap();
    client.create(&dlq).await.unwrap();
    send(&client, &src, json!({"waiting": true}), None).await;
    let mut ids = Vec::new();
    for i in 0..2 {
        let h = json!({"reason": "timeout", "attempts": 5, "source_queue": src.as_str()});
        ids.push(send(&client, &dlq, json!({ "order": i }), Some(h)).await);
    }

    let app = router(client.clone(), ConsoleOptions::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let b = webdriver::Browser::start(&driver).await;
    b.goto(&format!("{base}/?q={src}")).await;
    assert!(b.text("h1").await.contains("Queues"));
    b.click(&format!("#queues a[href='/queues/{src}']")).await;
    assert_eq!(b.url().await, format!("{base}/queues/{src}"));
    assert_eq!(b.text("h1").await, src.as_str());
    assert_eq!(b.text("#depth").await, "1");
    b.click("nav a[href='/']").await;
    b.goto(&format!("{base}/?q={src}")).await;
    b.click(&format!("#queues a[href='/dead/{dlq}']")).await;
    assert_eq!(b.url().await, format!("{base}/dead/{dlq}"));
    b.click(&format!("#letters input[name='id'][value='{}']", ids[0]))
        .await;
    b.click("#letters input[name='confirm']").await;
    assert!(b.selected("#letters input[name='confirm']").await);
    b.click("#redrive-selected").await;
    assert!(
        b.text("#summary").await.contains("Moved 1 letter(s)"),
        "{}",
        b.text("main").await
    );
    b.quit().await;
    server.abort();

    assert_eq!(ids_in(&client, &dlq).await, vec![ids[1]]);
    let back = client.peek_raw(&src, 10).await.unwrap();
    assert_eq!(back.len(), 2);
    assert_eq!(back[1].body.get(), r#"{"order": 0}"#);
}

async fn ids_in(client: &pgmq_client::Client, q: &pgmq_client::QueueName) -> Vec<i64> {
    ids(client, q).await
}

/// Not a test: takes the screenshots of docs/images/ (run by
/// scripts/console-screenshots.sh, which sets PGMQ_CONSOLE_SCREENSHOTS to
/// the folder). Sample queues, dead letters, a worker's presence record
/// and the committed benchmark document, each page saved as a PNG.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes the docs' screenshots; run by scripts/console-screenshots.sh"]
async fn screenshots() {
    let dir = std::env::var("PGMQ_CONSOLE_SCREENSHOTS").expect("PGMQ_CONSOLE_SCREENSHOTS");
    let driver = webdriver::chromedriver().expect("chromedriver");
    let client = client().await;
    let mut queues = Vec::new();
    for (name, n) in [
        ("shop_orders", 40),
        ("shop_emails", 7),
        ("shop_invoices", 0),
    ] {
        let q = pgmq_client::QueueName::new(name).unwrap();
        let _ = client.drop_queue(&q).await;
        client.create(&q).await.unwrap();
        for i in 0..n {
            send(
                &client,
                &q,
                json!({"order": 1000 + i, "customer": "acme"}),
                None,
            )
            .await;
        }
        queues.push(q);
    }
    let dlq = pgmq_client::QueueName::new("shop_orders_dlq").unwrap();
    let _ = client.drop_queue(&dlq).await;
    client.create(&dlq).await.unwrap();
    for (i, reason) in ["timeout", "timeout", "timeout", "card declined", "<script>"]
        .iter()
        .enumerate()
    {
        let h = json!({"reason": reason, "attempts": 5, "source_queue": "shop_orders",
                       "original_headers": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}});
        send(&client, &dlq, json!({"order": 2000 + i}), Some(h)).await;
    }
    client
        .pause(&queues[1], Some("mail provider outage"))
        .await
        .unwrap();
    let mut w =
        pgmq_client::WorkerPresence::new("web-1:4242:shop_orders:0", "shop_orders", "web-1", 4242);
    w.concurrency = 8;
    w.claims_per_sec = 950.0;
    w.acks_per_sec = 948.5;
    w.claimed = 120_400;
    w.acked = 120_380;
    w.failed = 5;
    client.report_presence(&w, false).await.unwrap();
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/results/dev-machine-6773cc8.json"
    ))
    .unwrap();
    let opts = ConsoleOptions::new()
        .refresh(std::time::Duration::ZERO)
        .bench_document("dev-machine-6773cc8.json", &doc)
        .unwrap();
    let nightly = pgmq_client::Schedule::new(
        "shop-nightly-report",
        queues[2].clone(),
        pgmq_client::Cadence::cron("0 3 * * *", "Europe/Paris").unwrap(),
    )
    .unwrap()
    .message(json!({"report": "invoices"}));
    client.put_schedule(&nightly).await.unwrap();
    let app = router(client.clone(), opts);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let b = webdriver::Browser::start(&driver).await;
    // Traffic between page reads, so that the pages have rates to show:
    // each read samples the queues (at most once a second).
    for round in 0..8_i32 {
        b.goto(&format!("{base}/?q=shop_")).await;
        b.goto(&format!("{base}/queues/shop_orders")).await;
        let bodies: Vec<i32> = (0..20 + 5 * round).collect();
        let ids = client.send_batch(&queues[0], &bodies).await.unwrap();
        client
            .delete_batch(&queues[0], &ids[..(15 + 3 * round) as usize])
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    }
    for (file, path) in [
        ("console-queues.png", "/?q=shop_".to_owned()),
        ("console-queue.png", "/queues/shop_orders".to_owned()),
        (
            "console-dead-letters.png",
            "/dead/shop_orders_dlq".to_owned(),
        ),
        ("console-fleet.png", "/fleet".to_owned()),
        ("console-schedules.png", "/schedules".to_owned()),
        ("console-bench.png", "/bench".to_owned()),
    ] {
        b.goto(&format!("{base}{path}")).await;
        b.find("main").await;
        std::fs::write(format!("{dir}/{file}"), b.screenshot().await).unwrap();
    }
    b.quit().await;
    server.abort();
    client.resume(&queues[1]).await.unwrap();
    client.remove_schedule("shop-nightly-report").await.unwrap();
}
