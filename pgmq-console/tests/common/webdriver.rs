//! A minimal WebDriver client for the browser test: chromedriver started
//! on a free port, headless Chromium from the distribution's packages, the
//! few commands the test needs (navigate, find, click, text, screenshot),
//! over plain HTTP/1.1 on a socket (no HTTP client crate).
#![allow(dead_code)]

use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// WebDriver's key for an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Where chromedriver is, when installed (`chromium-driver`).
pub fn chromedriver() -> Option<String> {
    let path = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
    std::path::Path::new(&path).exists().then_some(path)
}

/// A browser session; chromedriver, the browser and its user data go
/// with it (on drop too).
pub struct Browser {
    port: u16,
    session: String,
    _driver: Child,
    profile: std::path::PathBuf,
}

async fn free_port() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

/// One HTTP/1.1 request to 127.0.0.1:`port`; the response's JSON.
async fn http(port: u16, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    // Read by Content-Length (chromedriver may keep the socket open), or
    // to the end for a chunked or unsized body.
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        let n = s.read(&mut buf).await.map_err(|e| e.to_string())?;
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw);
        if n == 0 {
            break;
        }
        if let Some((head, rest)) = text.split_once("\r\n\r\n") {
            let len = head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse::<usize>().ok())
                    .flatten()
            });
            if len.is_some_and(|len| rest.len() >= len) {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text.split_once("\r\n\r\n").ok_or("no HTTP header end")?;
    let payload = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    serde_json::from_str(&payload).map_err(|e| format!("{e}: {payload}"))
}

/// The body of a chunked response.
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

impl Browser {
    /// Starts chromedriver at `driver` and a headless Chromium session.
    pub async fn start(driver: &str) -> Browser {
        let port = free_port().await;
        // A process group of its own: chromedriver and the browser it
        // starts end together when the session is dropped (a failed test
        // never leaves a browser behind).
        let child = Command::new(driver)
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let mut ready = false;
        for _ in 0..100 {
            if let Ok(v) = http(port, "GET", "/status", None).await {
                if v["value"]["ready"] == json!(true) {
                    ready = true;
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ready, "chromedriver did not get ready on port {port}");
        let profile = std::env::temp_dir().join(format!(
            "pgmq-console-chromium-{}-{port}",
            std::process::id()
        ));
        let binary = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        // As root, in a closed network: no sandbox, no GPU, nothing fetched.
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": binary,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--window-size=1100,760",
                    format!("--user-data-dir={}", profile.display()),
                ]
            }
        }}});
        let v = http(port, "POST", "/session", Some(&caps))
            .await
            .expect("a session");
        let session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no browser session: {v}"))
            .to_owned();
        Browser {
            port,
            session,
            _driver: child,
            profile,
        }
    }

    async fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        let v = http(self.port, method, &path, body.as_ref().or(Some(&json!({}))))
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        if v["value"]["error"].is_string() {
            panic!("{method} {path}: {}", v["value"]);
        }
        v["value"].clone()
    }

    /// Loads `url` and waits for it.
    pub async fn goto(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({ "url": url }))).await;
    }

    /// The current address.
    pub async fn url(&self) -> String {
        self.cmd("GET", "/url", None)
            .await
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The element `css` selects, waited for up to 10 s (a page a click
    /// loads may still be on its way).
    pub async fn find(&self, css: &str) -> String {
        let path = format!("/session/{}/element", self.session);
        let q = json!({"using": "css selector", "value": css});
        for _ in 0..100 {
            let v = http(self.port, "POST", &path, Some(&q))
                .await
                .unwrap_or_else(|e| panic!("finding {css}: {e}"));
            if let Some(e) = v["value"][ELEMENT].as_str() {
                return e.to_owned();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no element {css} in 10 s");
    }

    /// Clicks the element `css` selects (a link or a submit button waits
    /// for the page it loads).
    pub async fn click(&self, css: &str) {
        let e = self.find(css).await;
        self.cmd("POST", &format!("/element/{e}/click"), None).await;
    }

    /// The visible text of the element `css` selects.
    pub async fn text(&self, css: &str) -> String {
        let e = self.find(css).await;
        let v = self.cmd("GET", &format!("/element/{e}/text"), None).await;
        v.as_str().unwrap_or_default().to_owned()
    }

    /// The page's HTML as the browser has it now.
    pub async fn source(&self) -> String {
        let v = self.cmd("GET", "/source", None).await;
        v.as_str().unwrap_or_default().to_owned()
    }

    /// Whether the element `css` selects is selected (a checkbox ticked).
    pub async fn selected(&self, css: &str) -> bool {
        let e = self.find(css).await;
        self.cmd("GET", &format!("/element/{e}/selected"), None)
            .await
            == json!(true)
    }

    /// A PNG of the window.
    pub async fn screenshot(&self) -> Vec<u8> {
        use base64::Engine;
        let v = self.cmd("GET", "/screenshot", None).await;
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap()
    }

    /// Ends the session; the rest goes on drop.
    pub async fn quit(self) {
        let path = format!("/session/{}", self.session);
        let _ = http(self.port, "DELETE", &path, None).await;
    }
}

impl Drop for Browser {
    /// Ends chromedriver's process group (the browser with it) and removes
    /// the browser's user data.
    fn drop(&mut self) {
        if let Some(pid) = self._driver.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
