//! The console's settings, with their defaults.

use std::time::Duration;

/// How the console behaves: access, limits, timeouts.
///
/// ```
/// let o = pgmq_console::ConsoleOptions::new().row_limit(50).read_only(true);
/// assert_eq!(o.row_limit, 50);
/// assert!(o.read_only);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ConsoleOptions {
    /// Hide and refuse every action that changes something. Default: false.
    pub read_only: bool,
    /// The access token: when set, every request must carry it (the cookie
    /// that `/login?token=...` sets, or `Authorization: Bearer ...`).
    /// Default: none.
    pub token: Option<String>,
    /// Rows at most in any list (messages, archive, dead letters, reasons).
    /// Default: 100.
    pub row_limit: usize,
    /// Queues at most on the queues page. Default: 200.
    pub queue_limit: usize,
    /// Counts (depth, in flight, archive) stop at this many rows and show
    /// "at least". Default: 100 000.
    pub count_cap: i64,
    /// Every page's reads end after this long (`statement_timeout`).
    /// Default: 5 s.
    pub statement_timeout: Duration,
    /// A worker whose presence record was not written for this long is
    /// shown as gone on the fleet page. Default: 60 s (six of a 10 s
    /// presence interval).
    pub gone_after: Duration,
    /// The benchmark documents the benchmark page shows, by name
    /// ([`bench_document`](Self::bench_document)). Default: none.
    pub bench_docs: Vec<(String, serde_json::Value)>,
    /// Reload the queues page this often (an HTTP refresh; none when zero).
    /// Default: 10 s.
    pub refresh: Duration,
}

impl Default for ConsoleOptions {
    fn default() -> Self {
        ConsoleOptions {
            read_only: false,
            token: None,
            row_limit: 100,
            queue_limit: 200,
            count_cap: 100_000,
            statement_timeout: Duration::from_secs(5),
            gone_after: Duration::from_secs(60),
            bench_docs: Vec::new(),
            refresh: Duration::from_secs(10),
        }
    }
}

impl ConsoleOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets [`read_only`](Self::read_only).
    pub fn read_only(mut self, yes: bool) -> Self {
        self.read_only = yes;
        self
    }
    /// Sets [`token`](Self::token).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }
    /// Sets [`row_limit`](Self::row_limit) (at least 1).
    pub fn row_limit(mut self, n: usize) -> Self {
        self.row_limit = n.max(1);
        self
    }
    /// Sets [`queue_limit`](Self::queue_limit) (at least 1).
    pub fn queue_limit(mut self, n: usize) -> Self {
        self.queue_limit = n.max(1);
        self
    }
    /// Sets [`count_cap`](Self::count_cap) (at least 1).
    pub fn count_cap(mut self, n: i64) -> Self {
        self.count_cap = n.max(1);
        self
    }
    /// Sets [`statement_timeout`](Self::statement_timeout).
    pub fn statement_timeout(mut self, d: Duration) -> Self {
        self.statement_timeout = d;
        self
    }
    /// Sets [`gone_after`](Self::gone_after).
    pub fn gone_after(mut self, d: Duration) -> Self {
        self.gone_after = d;
        self
    }
    /// Adds a benchmark document (the text of a `pgmq-bench.benchmark.v1`
    /// JSON document) under `name`; text that is not one is
    /// [`ConsoleError::BadRequest`](crate::ConsoleError::BadRequest).
    pub fn bench_document(mut self, name: &str, json: &str) -> Result<Self, crate::ConsoleError> {
        let doc = crate::pages::bench::parse(json)?;
        self.bench_docs.push((name.to_owned(), doc));
        Ok(self)
    }
    /// Sets [`refresh`](Self::refresh).
    pub fn refresh(mut self, d: Duration) -> Self {
        self.refresh = d;
        self
    }
}
