//! What the console's tests share: the test database, fresh queues, and
//! requests to the router without a network.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use pgmq_client::{Client, QueueName, SendOptions};
use serde_json::Value;
use tower::ServiceExt;

pub fn dsn() -> String {
    std::env::var("PGMQ_TEST_DSN")
        .unwrap_or_else(|_| "postgres://pgmq:pgmq@127.0.0.1:55432/pgmq".to_owned())
}

/// A client of the test database, with the pgmq_sdk schema installed.
pub async fn client() -> Client {
    let c = Client::connect(&dsn())
        .await
        .expect("the test database is up: run scripts/db-start.sh");
    c.install_sdk_schema().await.expect("pgmq_sdk installs");
    c
}

/// A new, empty queue whose name starts with `prefix`.
pub async fn fresh(client: &Client, prefix: &str) -> QueueName {
    static N: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let q = QueueName::new(&name).unwrap();
    client.create(&q).await.unwrap();
    q
}

/// Sends `body` with `headers` to `q`.
pub async fn send(client: &Client, q: &QueueName, body: Value, headers: Option<Value>) -> i64 {
    let mut opts = SendOptions::new();
    if let Some(h) = headers {
        opts = opts.headers(h);
    }
    client.send_with(q, &body, &opts).await.unwrap()
}

/// A response: status, the Set-Cookie header if any, the body.
pub struct Got {
    pub status: StatusCode,
    pub cookie: Option<String>,
    pub location: Option<String>,
    pub body: String,
}

async fn call(app: &Router, req: Request<Body>) -> Got {
    let res = app.clone().oneshot(req).await.unwrap();
    let h = |name| {
        res.headers()
            .get(name)
            .and_then(|v: &axum::http::HeaderValue| v.to_str().ok())
            .map(str::to_owned)
    };
    let (cookie, location) = (h(header::SET_COOKIE), h(header::LOCATION));
    let status = res.status();
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 24)
        .await
        .unwrap();
    Got {
        status,
        cookie,
        location,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

pub async fn get(app: &Router, path: &str) -> Got {
    get_with(app, path, &[]).await
}

pub async fn get_with(app: &Router, path: &str, headers: &[(&str, &str)]) -> Got {
    let mut req = Request::get(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    call(app, req.body(Body::empty()).unwrap()).await
}

/// POSTs a urlencoded form of `fields`, with `headers`.
pub async fn post(
    app: &Router,
    path: &str,
    fields: &[(&str, &str)],
    headers: &[(&str, &str)],
) -> Got {
    let body = serde_urlencoded::to_string(fields).unwrap();
    let mut req = Request::post(path)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::HOST, "127.0.0.1:8080");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    call(app, req.body(Body::from(body)).unwrap()).await
}

/// The CSRF token in a page's forms.
pub fn csrf(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("the page has an action form");
    let start = at + "name=\"csrf\" value=\"".len();
    page[start..start + 64].to_owned()
}

/// The msg_ids in `q`, by msg_id.
pub async fn ids(client: &Client, q: &QueueName) -> Vec<i64> {
    client
        .peek_raw(q, 1000)
        .await
        .unwrap()
        .iter()
        .map(|m| m.msg_id)
        .collect()
}
