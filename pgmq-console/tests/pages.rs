//! Every page and action of the console against the real database: the
//! looks change nothing, the actions do what they say, and the guards
//! (CSRF token, confirmation, read-only mode, access token, escaping) hold.

mod common;

use common::*;
use pgmq_console::{router, ConsoleOptions};
use serde_json::json;

#[tokio::test]
async fn the_queues_page_lists_each_queue_with_its_counts() {
    let client = client().await;
    let q = fresh(&client, "con_list").await;
    for i in 0..3 {
        send(&client, &q, json!({ "i": i }), None).await;
    }
    let app = router(client.clone(), ConsoleOptions::new());
    let page = get(&app, &format!("/?q={q}")).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains(&format!("href=\"/queues/{q}\"")));
    let row = &page.body[page.body.find(&format!(">{q}<")).unwrap()..];
    assert!(row.contains("<td class=\"n\">3</td>"), "{row}");
    // The page names no server: no host, port or password of the DSN.
    let info = pgmq_client::ConnInfo::parse(&dsn()).unwrap();
    let host = info.get("host").unwrap_or_default();
    let port = info.get("port").unwrap_or_default();
    assert!(!page.body.contains(&format!("{host}:{port}")));
    if let Some(password) = info.get("password") {
        assert!(!page.body.contains(password), "the page shows the password");
    }
}

#[tokio::test]
async fn a_queue_page_is_a_look_that_changes_nothing_with_a_json_filter() {
    let client = client().await;
    let q = fresh(&client, "con_look").await;
    let a = send(&client, &q, json!({"kind": "a"}), None).await;
    let b = send(
        &client,
        &q,
        json!({"kind": "b"}),
        Some(json!({"attempts": 3})),
    )
    .await;
    let app = router(client.clone(), ConsoleOptions::new());
    let all = get(&app, &format!("/queues/{q}")).await;
    assert_eq!(all.status, 200, "{}", all.body);
    assert!(all.body.contains(&format!("<td class=\"n\">{a}</td>")));
    let by_body = get(
        &app,
        &format!("/queues/{q}?filter=%7B%22kind%22%3A%22b%22%7D"),
    )
    .await;
    let messages = &by_body.body[by_body.body.find("id=\"messages\"").unwrap()..];
    assert!(messages.contains(&format!("<td class=\"n\">{b}</td>")));
    assert!(!messages.contains(&format!("<td class=\"n\">{a}</td>")));
    let by_header = get(
        &app,
        &format!("/queues/{q}?filter=%7B%22attempts%22%3A3%7D"),
    )
    .await;
    let messages = &by_header.body[by_header.body.find("id=\"messages\"").unwrap()..];
    assert!(messages.contains(&format!("<td class=\"n\">{b}</td>")));
    assert!(!messages.contains(&format!("<td class=\"n\">{a}</td>")));
    let bad = get(&app, &format!("/queues/{q}?filter=%7Bnope")).await;
    assert!(bad.body.contains("the filter is not JSON"));
    // Nothing was hidden or counted by the looks.
    for m in client.peek_raw(&q, 10).await.unwrap() {
        assert_eq!(m.read_ct, 0);
        assert!(m.vt <= chrono::Utc::now());
    }
    assert_eq!(
        get(&app, "/queues/con_no_such_queue").await.status,
        404,
        "a missing queue"
    );
}

#[tokio::test]
async fn a_queue_page_shows_its_archive() {
    let client = client().await;
    let q = fresh(&client, "con_arch").await;
    let id = send(&client, &q, json!({"archived": "yes"}), None).await;
    client.archive(&q, id).await.unwrap();
    let app = router(client.clone(), ConsoleOptions::new());
    let page = get(&app, &format!("/queues/{q}")).await;
    let archive = &page.body[page.body.find("id=\"archive\"").unwrap()..];
    assert!(
        archive.contains(&format!("<td class=\"n\">{id}</td>")),
        "{archive}"
    );
}

#[tokio::test]
async fn pause_and_resume_with_a_reason() {
    let client = client().await;
    let q = fresh(&client, "con_pause").await;
    let app = router(client.clone(), ConsoleOptions::new());
    let page = get(&app, &format!("/queues/{q}")).await;
    let token = csrf(&page.body);
    let done = post(
        &app,
        &format!("/queues/{q}/pause"),
        &[
            ("csrf", &token),
            ("confirm", "yes"),
            ("reason", "db \"migration\""),
        ],
        &[],
    )
    .await;
    assert_eq!(done.status, 303, "{}", done.body);
    assert!(client.is_paused(&q).await.unwrap());
    let page = get(&app, &format!("/queues/{q}")).await;
    assert!(
        page.body.contains("(db &quot;migration&quot;)"),
        "{}",
        page.body
    );
    let done = post(
        &app,
        &format!("/queues/{q}/resume"),
        &[("csrf", &token), ("confirm", "yes")],
        &[],
    )
    .await;
    assert_eq!(done.status, 303, "{}", done.body);
    assert!(!client.is_paused(&q).await.unwrap());
}

#[tokio::test]
async fn an_action_without_the_csrf_token_or_confirmation_does_nothing() {
    let client = client().await;
    let q = fresh(&client, "con_csrf").await;
    let app = router(client.clone(), ConsoleOptions::new());
    let token = csrf(&get(&app, &format!("/queues/{q}")).await.body);
    let path = format!("/queues/{q}/pause");
    let refused = post(&app, &path, &[("confirm", "yes")], &[]).await;
    assert_eq!(refused.status, 403);
    let wrong = "0".repeat(64);
    let refused = post(&app, &path, &[("csrf", &wrong), ("confirm", "yes")], &[]).await;
    assert_eq!(refused.status, 403);
    let unconfirmed = post(&app, &path, &[("csrf", &token)], &[]).await;
    assert_eq!(unconfirmed.status, 400);
    let cross = post(
        &app,
        &path,
        &[("csrf", &token), ("confirm", "yes")],
        &[("origin", "http://evil.example")],
    )
    .await;
    assert_eq!(cross.status, 403);
    assert!(!client.is_paused(&q).await.unwrap());
    // Another console process has another token.
    let other = router(client.clone(), ConsoleOptions::new());
    let refused = post(&other, &path, &[("csrf", &token), ("confirm", "yes")], &[]).await;
    assert_eq!(refused.status, 403);
    assert!(!client.is_paused(&q).await.unwrap());
}

/// Dead letters as pgmq-worker writes them, for `source`.
async fn letters(
    client: &pgmq_client::Client,
    dlq: &pgmq_client::QueueName,
    source: &str,
) -> Vec<i64> {
    let mut ids = Vec::new();
    for (i, reason) in ["timeout", "timeout", "bad input"].iter().enumerate() {
        let h = json!({"reason": reason, "attempts": 3, "source_queue": source,
                       "original_headers": {"trace": i}});
        ids.push(send(client, dlq, json!({"n": i}), Some(h)).await);
    }
    ids
}

#[tokio::test]
async fn dead_letters_are_grouped_by_reason_and_filtered() {
    let client = client().await;
    let src = fresh(&client, "con_src").await;
    let dlq = fresh(&client, "con_dlq").await;
    let ids = letters(&client, &dlq, src.as_str()).await;
    let app = router(client.clone(), ConsoleOptions::new());
    let page = get(&app, &format!("/dead/{dlq}")).await;
    assert_eq!(page.status, 200, "{}", page.body);
    let reasons = &page.body[page.body.find("id=\"reasons\"").unwrap()..];
    let timeout = &reasons[reasons.find(">timeout<").unwrap()..];
    assert!(timeout.contains("<td class=\"n\">2</td>"), "{reasons}");
    let bad = &reasons[reasons.find(">bad input<").unwrap()..];
    assert!(bad.contains("<td class=\"n\">1</td>"), "{reasons}");
    let one = get(&app, &format!("/dead/{dlq}?reason=bad%20input")).await;
    let list = &one.body[one.body.find("id=\"letters\"").unwrap()..];
    assert!(list.contains(&format!("value=\"{}\"", ids[2])));
    assert!(!list.contains(&format!("value=\"{}\"", ids[0])));
    assert_eq!(client.peek_raw(&dlq, 10).await.unwrap()[0].read_ct, 0);
}

#[tokio::test]
async fn redrive_one_moves_it_back_and_leaves_the_rest() {
    let client = client().await;
    let src = fresh(&client, "con_src").await;
    let dlq = fresh(&client, "con_dlq").await;
    let ids = letters(&client, &dlq, src.as_str()).await;
    let app = router(client.clone(), ConsoleOptions::new());
    let token = csrf(&get(&app, &format!("/dead/{dlq}")).await.body);
    let id = ids[1].to_string();
    let done = post(
        &app,
        &format!("/dead/{dlq}/redrive"),
        &[("csrf", &token), ("confirm", "yes"), ("id", &id)],
        &[],
    )
    .await;
    assert_eq!(done.status, 200, "{}", done.body);
    assert!(
        done.body.contains("Moved 1 letter(s); 0 left in place."),
        "{}",
        done.body
    );
    assert_eq!(ids_of(&client, &dlq).await, vec![ids[0], ids[2]]);
    let moved = client.peek_raw(&src, 10).await.unwrap();
    assert_eq!(moved.len(), 1);
    assert_eq!(moved[0].body.get(), r#"{"n": 1}"#);
    // The original headers come back.
    assert_eq!(moved[0].headers, Some(json!({"trace": 1})));
}

async fn ids_of(client: &pgmq_client::Client, q: &pgmq_client::QueueName) -> Vec<i64> {
    ids(client, q).await
}

#[tokio::test]
async fn redrive_all_and_a_selection_leave_what_cannot_move() {
    let client = client().await;
    let src = fresh(&client, "con_src").await;
    let dlq = fresh(&client, "con_dlq").await;
    let ids = letters(&client, &dlq, src.as_str()).await;
    let orphan = send(&client, &dlq, json!("orphan"), Some(json!({"reason": "x"}))).await;
    let app = router(client.clone(), ConsoleOptions::new());
    let token = csrf(&get(&app, &format!("/dead/{dlq}")).await.body);
    let (a, b) = (ids[0].to_string(), ids[2].to_string());
    let done = post(
        &app,
        &format!("/dead/{dlq}/redrive"),
        &[("csrf", &token), ("confirm", "yes"), ("id", &a), ("id", &b)],
        &[],
    )
    .await;
    assert!(done.body.contains("Moved 2 letter(s)"), "{}", done.body);
    assert_eq!(ids_of(&client, &dlq).await, vec![ids[1], orphan]);
    let done = post(
        &app,
        &format!("/dead/{dlq}/redrive"),
        &[("csrf", &token), ("confirm", "yes"), ("all", "yes")],
        &[],
    )
    .await;
    assert!(
        done.body.contains("Moved 1 letter(s); 1 left in place."),
        "{}",
        done.body
    );
    assert!(
        done.body.contains("stays: no source_queue header"),
        "{}",
        done.body
    );
    assert_eq!(ids_of(&client, &dlq).await, vec![orphan]);
    assert_eq!(client.peek_raw(&src, 10).await.unwrap().len(), 3);
    // What stayed was not touched.
    assert_eq!(client.peek_raw(&dlq, 1).await.unwrap()[0].read_ct, 0);
    let none = post(
        &app,
        &format!("/dead/{dlq}/redrive"),
        &[("csrf", &token), ("confirm", "yes")],
        &[],
    )
    .await;
    assert_eq!(none.status, 400, "nothing selected");
}

#[tokio::test]
async fn delete_removes_the_selection_only_when_confirmed() {
    let client = client().await;
    let dlq = fresh(&client, "con_dlq").await;
    let ids = letters(&client, &dlq, "nowhere").await;
    let app = router(client.clone(), ConsoleOptions::new());
    let token = csrf(&get(&app, &format!("/dead/{dlq}")).await.body);
    let id = ids[0].to_string();
    let path = format!("/dead/{dlq}/delete");
    let unconfirmed = post(&app, &path, &[("csrf", &token), ("id", &id)], &[]).await;
    assert_eq!(unconfirmed.status, 400);
    assert_eq!(ids_of(&client, &dlq).await.len(), 3);
    let done = post(
        &app,
        &path,
        &[("csrf", &token), ("confirm", "yes"), ("id", &id)],
        &[],
    )
    .await;
    assert!(done.body.contains("Deleted 1 of 1"), "{}", done.body);
    assert_eq!(ids_of(&client, &dlq).await, vec![ids[1], ids[2]]);
}

#[tokio::test]
async fn read_only_mode_shows_no_action_and_refuses_every_post() {
    let client = client().await;
    let dlq = fresh(&client, "con_ro").await;
    let ids = letters(&client, &dlq, "nowhere").await;
    let app = router(client.clone(), ConsoleOptions::new().read_only(true));
    for path in [
        "/".to_owned(),
        format!("/queues/{dlq}"),
        format!("/dead/{dlq}"),
    ] {
        let page = get(&app, &path).await;
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        assert!(!page.body.contains("method=\"post\""), "{path} has a form");
        assert!(!page.body.contains("name=\"csrf\""), "{path}");
    }
    // A token from a writable console does not help.
    let rw = router(client.clone(), ConsoleOptions::new());
    let token = csrf(&get(&rw, &format!("/dead/{dlq}")).await.body);
    let id = ids[0].to_string();
    for action in ["redrive", "delete"] {
        let res = post(
            &app,
            &format!("/dead/{dlq}/{action}"),
            &[("csrf", &token), ("confirm", "yes"), ("id", &id)],
            &[],
        )
        .await;
        assert_eq!(res.status, 403, "{action}");
    }
    let res = post(
        &app,
        &format!("/queues/{dlq}/pause"),
        &[("csrf", &token), ("confirm", "yes")],
        &[],
    )
    .await;
    assert_eq!(res.status, 403);
    assert!(res.body.contains("read-only"));
    assert_eq!(ids_of(&client, &dlq).await, ids);
    assert!(!client.is_paused(&dlq).await.unwrap());
}

#[tokio::test]
async fn the_access_token_guards_every_page() {
    let client = client().await;
    let token = "a-token-of-sixteen-chars";
    let app = router(client.clone(), ConsoleOptions::new().token(token));
    assert_eq!(get(&app, "/").await.status, 401);
    let bearer = format!("Bearer {token}");
    assert_eq!(
        get_with(&app, "/", &[("authorization", &bearer)])
            .await
            .status,
        200
    );
    assert_eq!(
        get_with(
            &app,
            "/",
            &[("authorization", "Bearer wrong-token-wrong-token")]
        )
        .await
        .status,
        401
    );
    assert_eq!(get(&app, "/login?token=wrong").await.status, 401);
    let login = get(&app, &format!("/login?token={token}")).await;
    assert_eq!(login.status, 303);
    let cookie = login.cookie.expect("a cookie");
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
    let pair = cookie.split(';').next().unwrap();
    assert_eq!(get_with(&app, "/", &[("cookie", pair)]).await.status, 200);
    // A public address needs a token or read-only mode.
    let public = "0.0.0.0:8080".parse().unwrap();
    assert!(pgmq_console::check_listen(public, &ConsoleOptions::new()).is_err());
    assert!(pgmq_console::check_listen(public, &ConsoleOptions::new().token(token)).is_ok());
    assert!(pgmq_console::check_listen(public, &ConsoleOptions::new().token("short")).is_err());
}

#[tokio::test]
async fn bodies_and_headers_are_shown_escaped() {
    let client = client().await;
    let q = fresh(&client, "con_xss_dlq").await;
    let evil = "<script>alert(1)</script>";
    let quote = "\"><img src=x onerror=alert(2)>";
    send(
        &client,
        &q,
        json!({ "html": evil }),
        Some(json!({"reason": quote, "source_queue": evil, "x": quote})),
    )
    .await;
    let app = router(client.clone(), ConsoleOptions::new());
    for path in [
        format!("/queues/{q}"),
        format!("/dead/{q}"),
        format!(
            "/dead/{q}?reason={}",
            "%22%3E%3Cimg%20src%3Dx%20onerror%3Dalert(2)%3E"
        ),
    ] {
        let page = get(&app, &path).await;
        assert_eq!(page.status, 200, "{path}");
        assert!(!page.body.contains("<script>"), "{path}: {}", page.body);
        assert!(!page.body.contains("<img"), "{path}: {}", page.body);
        assert!(page.body.contains("&lt;script&gt;"), "{path}");
    }
}

#[tokio::test]
async fn the_fleet_page_shows_workers_running_stopped_and_gone() {
    let client = client().await;
    let q = fresh(&client, "con_fleet").await;
    let host = format!("host-{q}");
    let mut running = pgmq_client::WorkerPresence::new(&format!("{host}:1"), q.as_str(), &host, 1);
    running.concurrency = 7;
    running.claims_per_sec = 12.5;
    client.report_presence(&running, false).await.unwrap();
    let stopped = pgmq_client::WorkerPresence::new(&format!("{host}:2"), q.as_str(), &host, 2);
    client.report_presence(&stopped, true).await.unwrap();
    let app = router(client.clone(), ConsoleOptions::new());
    let page = get(&app, "/fleet").await;
    assert_eq!(page.status, 200, "{}", page.body);
    let row = |pid: &str| {
        let at = page.body.find(&format!(
            "<td class=\"n\">{pid}</td><td><a href=\"/queues/{q}\""
        ));
        let start = page.body[..at.expect("the worker's row")]
            .rfind("<tr>")
            .unwrap();
        page.body[start..].split("</tr>").next().unwrap().to_owned()
    };
    let (r1, r2) = (row("1"), row("2"));
    assert!(
        r1.contains(">running<") && r1.contains(">7<") && r1.contains(">12.5<"),
        "{r1}"
    );
    assert!(r2.contains(">stopped<"), "{r2}");
    // Not seen for longer than the console's limit: gone.
    let strict = router(
        client.clone(),
        ConsoleOptions::new().gone_after(std::time::Duration::ZERO),
    );
    let page = get(&strict, "/fleet").await;
    let at = page
        .body
        .find(&format!("{host}</td><td class=\"n\">1<"))
        .unwrap();
    let start = page.body[..at].rfind("<tr>").unwrap();
    assert!(
        page.body[start..at].contains(">gone<"),
        "{}",
        &page.body[start..at]
    );
}

/// A benchmark.v1 document with throughput `rates` at 1, 2, 4, 8 handlers
/// and one target that failed.
fn bench_doc(rates: [f64; 4]) -> String {
    let mut figures = Vec::new();
    for (w, r) in [1, 2, 4, 8].iter().zip(rates) {
        figures.push(json!({"id": format!("consume_scaling.w{w}.throughput"), "median": r}));
        figures.push(
            json!({"id": format!("consume_scaling.w{w}.queue_wait_db.p99_ms"), "median": 2.5}),
        );
    }
    json!({
        "schema": "pgmq-bench.benchmark.v1",
        "figures": figures,
        "targets": [{"id": "t", "description": "w8 <not below> w1", "observed": 0.5,
                     "limit": 0.95, "unit": "x", "pass": false}]
    })
    .to_string()
}

#[tokio::test]
async fn the_benchmark_page_charts_one_document_or_compares_two() {
    let client = client().await;
    let none = router(client.clone(), ConsoleOptions::new());
    assert!(get(&none, "/bench").await.body.contains("--bench-doc"));
    assert!(ConsoleOptions::new()
        .bench_document("x", r#"{"schema": "other"}"#)
        .is_err());
    let opts = ConsoleOptions::new()
        .bench_document("before.json", &bench_doc([100.0, 200.0, 400.0, 800.0]))
        .unwrap()
        .bench_document("after.json", &bench_doc([150.0, 300.0, 600.0, 1200.0]))
        .unwrap();
    let app = router(client, opts);
    let one = get(&app, "/bench").await;
    assert_eq!(one.status, 200, "{}", one.body);
    let scaling = &one.body[one.body.find("id=\"scaling\"").unwrap()..];
    let scaling = &scaling[..scaling.find("</svg>").unwrap()];
    // Four bars and the legend's box; the largest bar is the tallest.
    assert_eq!(scaling.matches("<rect").count(), 5, "{scaling}");
    assert!(scaling.contains(">800<") && scaling.contains("8 handlers"));
    assert!(one.body.contains("FAIL") && one.body.contains("w8 &lt;not below&gt; w1"));
    let two = get(&app, "/bench?a=0&b=1").await;
    let scaling = &two.body[two.body.find("id=\"scaling\"").unwrap()..];
    let scaling = &scaling[..scaling.find("</svg>").unwrap()];
    assert_eq!(scaling.matches("<rect").count(), 10, "{scaling}");
    assert!(scaling.contains("after.json") && scaling.contains(">1200<"));
    assert_eq!(get(&app, "/bench?a=5").await.status, 400);
}

#[tokio::test]
async fn schedules_are_listed_and_paused_and_resumed_only_when_confirmed() {
    use pgmq_client::{Cadence, Schedule};
    let client = client().await;
    client.install_sdk_schema().await.unwrap();
    let q = fresh(&client, "con_sched").await;
    let name = format!("con-sched-{q}");
    let every = Cadence::every(std::time::Duration::from_secs(3600)).unwrap();
    let s = Schedule::new(&name, q.clone(), every).unwrap();
    client.put_schedule(&s).await.unwrap();
    let paused = |client: pgmq_client::Client, name: String| async move {
        let all = client.schedules().await.unwrap();
        all.iter().find(|i| i.name == name).unwrap().paused
    };
    let app = router(client.clone(), ConsoleOptions::new());
    let page = get(&app, "/schedules").await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains(&name), "{}", page.body);
    let token = csrf(&page.body);
    let path = format!("/schedules/{name}/pause");
    // Without the CSRF token, or unconfirmed: refused, nothing paused.
    let res = post(&app, &path, &[("confirm", "yes")], &[]).await;
    assert_eq!(res.status, 403, "{}", res.body);
    let res = post(&app, &path, &[("csrf", &token)], &[]).await;
    assert_ne!(res.status, 303, "{}", res.body);
    assert!(!paused(client.clone(), name.clone()).await);
    let res = post(&app, &path, &[("csrf", &token), ("confirm", "yes")], &[]).await;
    assert_eq!(res.status, 303, "{}", res.body);
    assert!(paused(client.clone(), name.clone()).await);
    // Read-only: listed without a form, and the resume is refused.
    let ro = router(client.clone(), ConsoleOptions::new().read_only(true));
    let page = get(&ro, "/schedules").await;
    assert!(page.body.contains(&name) && !page.body.contains("method=\"post\""));
    let resume = format!("/schedules/{name}/resume");
    let res = post(&ro, &resume, &[("csrf", &token), ("confirm", "yes")], &[]).await;
    assert_eq!(res.status, 403);
    assert!(paused(client.clone(), name.clone()).await);
    let res = post(&app, &resume, &[("csrf", &token), ("confirm", "yes")], &[]).await;
    assert_eq!(res.status, 303, "{}", res.body);
    assert!(!paused(client.clone(), name.clone()).await);
    client.remove_schedule(&name).await.unwrap();
}

#[tokio::test]
async fn a_queue_page_charts_its_rates_in_and_out_from_two_samples() {
    let client = client().await;
    let q = fresh(&client, "con_rates").await;
    let app = router(client.clone(), ConsoleOptions::new());
    client.send(&q, &json!({"n": 0})).await.unwrap();
    let page = get(&app, &format!("/queues/{q}")).await;
    assert!(page.body.contains("No rate history yet"), "{}", page.body);
    let bodies: Vec<i32> = (1..=40).collect();
    let ids = client.send_batch(&q, &bodies).await.unwrap();
    client.delete_batch(&q, &ids[..10]).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let page = get(&app, &format!("/queues/{q}")).await;
    assert!(!page.body.contains("No rate history yet"), "{}", page.body);
    assert!(
        page.body.contains("in (sent)") && page.body.contains("<svg"),
        "{}",
        page.body
    );
}
