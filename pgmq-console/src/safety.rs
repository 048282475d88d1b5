//! What keeps the console from being an open door: the listen check, the
//! access token, the CSRF token and confirmation on every action, and the
//! response headers (a Content-Security-Policy that runs no script at all).

use std::net::SocketAddr;

use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use rand::RngCore;

use crate::{AppState, ConsoleError};

/// The cookie `/login` sets with the access token.
const TOKEN_COOKIE: &str = "pgmq_console_token";

/// Refuses to serve on `addr` when it is not a loopback address, unless an
/// access token is set or the console is read-only; a token must be 16 to
/// 256 characters of `A-Z a-z 0-9 - _ . ~` (it travels in a cookie).
///
/// ```
/// use pgmq_console::{check_listen, ConsoleOptions};
/// let public = "0.0.0.0:8080".parse().unwrap();
/// assert!(check_listen(public, &ConsoleOptions::new()).is_err());
/// assert!(check_listen(public, &ConsoleOptions::new().read_only(true)).is_ok());
/// assert!(check_listen("127.0.0.1:8080".parse().unwrap(), &ConsoleOptions::new()).is_ok());
/// ```
pub fn check_listen(addr: SocketAddr, opts: &crate::ConsoleOptions) -> Result<(), ConsoleError> {
    if let Some(t) = &opts.token {
        let ok_chars = t
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.~".contains(&b));
        if !ok_chars || t.len() < 16 || t.len() > 256 {
            return Err(ConsoleError::BadRequest(
                "the access token must be 16 to 256 characters of A-Z a-z 0-9 - _ . ~".into(),
            ));
        }
    }
    if addr.ip().is_loopback() || opts.token.is_some() || opts.read_only {
        Ok(())
    } else {
        Err(ConsoleError::PublicListen(addr))
    }
}

/// A fresh CSRF token: 32 random bytes, hex.
pub(crate) fn new_csrf_token() -> String {
    let mut b = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Equality that takes the same time wherever the strings differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Whether the request carries the access token (cookie or bearer).
fn has_token(headers: &HeaderMap, token: &str) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| same(t, token));
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .any(|(k, v)| k == TOKEN_COOKIE && same(v, token));
    bearer || cookie
}

/// Every request: the access token when one is set (not for `/login`), a
/// POST from another origin refused, and the security headers added.
pub(crate) async fn guard(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(token) = &st.opts.token {
        if req.uri().path() != "/login" && !has_token(req.headers(), token) {
            return ConsoleError::Unauthorized.into_response();
        }
    }
    if req.method() == Method::POST && !same_origin(req.headers()) {
        return ConsoleError::Csrf.into_response();
    }
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

/// A POST's Origin, when the browser sends one, names the host it was sent
/// to. (The pages' Referrer-Policy is `same-origin`: with `no-referrer` a
/// browser sends `Origin: null`, which is refused.)
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin_host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    matches!((origin_host, host), (Some(o), Some(h)) if o == h)
}

/// The query of `/login`.
#[derive(serde::Deserialize)]
pub(crate) struct Login {
    token: String,
}

/// `GET /login?token=...`: with the right token, the cookie that carries it
/// (HttpOnly, SameSite=Strict) and a redirect to the queues.
pub(crate) async fn login(State(st): State<AppState>, Query(q): Query<Login>) -> Response {
    match &st.opts.token {
        Some(t) if same(&q.token, t) => {
            let cookie = format!("{TOKEN_COOKIE}={t}; HttpOnly; SameSite=Strict; Path=/");
            let mut res = Redirect::to("/").into_response();
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                res.headers_mut().insert(header::SET_COOKIE, v);
            }
            res
        }
        Some(_) => ConsoleError::Unauthorized.into_response(),
        None => (StatusCode::NOT_FOUND, "no access token is set").into_response(),
    }
}

/// A submitted form's fields, repeated ones kept (a selection of msg_ids).
pub(crate) struct Fields(Vec<(String, String)>);

impl Fields {
    /// Parses a urlencoded body.
    pub(crate) fn parse(body: &str) -> Result<Fields, ConsoleError> {
        serde_urlencoded::from_str(body)
            .map(Fields)
            .map_err(|e| ConsoleError::BadRequest(format!("a form that does not parse: {e}")))
    }

    /// The first value of `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `key`.
    pub(crate) fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The CSRF token must be this process's, and `confirm` must be `yes`
    /// (the form's checkbox): otherwise nothing is done.
    pub(crate) fn check(&self, st: &AppState) -> Result<(), ConsoleError> {
        if !self.get("csrf").is_some_and(|t| same(t, &st.csrf)) {
            return Err(ConsoleError::Csrf);
        }
        if self.get("confirm") != Some("yes") {
            return Err(ConsoleError::BadRequest(
                "not confirmed: tick the confirmation box to go ahead".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "abcd"));
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=b; pgmq_console_token=s3cret"),
        );
        assert!(has_token(&h, "s3cret"));
        assert!(!has_token(&h, "s3cre"));
    }

    #[test]
    fn a_post_from_another_origin_is_not_same_origin() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(!same_origin(&h));
    }
}
