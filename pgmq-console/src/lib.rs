//! An operator console for PGMQ: the queues and their messages, the dead
//! letters and what to do about them, in a browser, served by axum with
//! pages rendered on the server (no JavaScript).
//!
//! The binary `pgmq-console` serves it; [`router`] gives the same pages to
//! an application that mounts them itself. Every read runs in a transaction
//! with a statement timeout ([`ConsoleOptions::statement_timeout`]) and every
//! list has a row limit ([`ConsoleOptions::row_limit`]). Mutating actions
//! (pause, resume, redrive, delete) are POST forms carrying a CSRF token and
//! a confirmation; [`ConsoleOptions::read_only`] removes them.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let client = pgmq_client::Client::connect("postgres://app@localhost/app").await?;
//! let app = pgmq_console::router(client, pgmq_console::ConsoleOptions::new());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```

mod chart;
mod error;
mod layout;
mod options;
mod pages;
mod rates;
mod safety;

pub use error::ConsoleError;
pub use options::ConsoleOptions;
pub use pages::bench::BENCH_SCHEMA;
pub use safety::check_listen;

use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;
use pgmq_client::Client;

/// What every handler shares: the database, the options, this process's
/// CSRF token.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) client: Client,
    pub(crate) opts: Arc<ConsoleOptions>,
    pub(crate) csrf: Arc<str>,
    /// Each queue's recent samples, for its rates in and out.
    pub(crate) rates: Arc<rates::Rates>,
}

/// The console's pages and actions on `client`, behind the access token
/// when [`ConsoleOptions::token`] is set. In read-only mode every action is
/// refused (403) before its form is read.
///
/// ```no_run
/// # async fn f(client: pgmq_client::Client) {
/// let app = pgmq_console::router(client, pgmq_console::ConsoleOptions::new().read_only(true));
/// # let _ = app; }
/// ```
pub fn router(client: Client, opts: ConsoleOptions) -> Router {
    let state = AppState {
        client,
        opts: Arc::new(opts),
        csrf: safety::new_csrf_token().into(),
        rates: Arc::default(),
    };
    // The rates' sampler, when a Tokio runtime runs this (it stops once the
    // router and its state are dropped).
    if tokio::runtime::Handle::try_current().is_ok() {
        tokio::spawn(rates::sample(
            state.client.clone(),
            state.opts.clone(),
            Arc::downgrade(&state.rates),
        ));
    }
    let mut app = Router::new()
        .route("/", get(pages::queues::page))
        .route("/queues/{name}", get(pages::queue::page))
        .route("/dead/{name}", get(pages::dead::page))
        .route("/fleet", get(pages::fleet::page))
        .route("/schedules", get(pages::schedules::page))
        .route("/bench", get(pages::bench::page))
        .route("/login", get(safety::login));
    if state.opts.read_only {
        for path in [
            "/queues/{name}/pause",
            "/queues/{name}/resume",
            "/dead/{name}/redrive",
            "/dead/{name}/delete",
            "/schedules/{name}/pause",
            "/schedules/{name}/resume",
        ] {
            app = app.route(path, post(read_only));
        }
    } else {
        app = app
            .route("/queues/{name}/pause", post(pages::queue::pause))
            .route("/queues/{name}/resume", post(pages::queue::resume))
            .route("/dead/{name}/redrive", post(pages::dead::redrive))
            .route("/dead/{name}/delete", post(pages::dead::delete))
            .route("/schedules/{name}/pause", post(pages::schedules::pause))
            .route("/schedules/{name}/resume", post(pages::schedules::resume));
    }
    app.layer(axum::middleware::from_fn_with_state(
        state.clone(),
        safety::guard,
    ))
    .with_state(state)
}

/// Every action in read-only mode.
async fn read_only() -> ConsoleError {
    ConsoleError::ReadOnly
}
