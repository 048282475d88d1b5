//! The console's errors, and how each becomes a page.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// What can go wrong serving the console.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsoleError {
    /// The database call failed (its text carries no password or payload).
    #[error("{0}")]
    Db(#[from] pgmq_client::Error),
    /// The request was not one the console takes (a bad filter, no
    /// confirmation, a bad form).
    #[error("{0}")]
    BadRequest(String),
    /// The CSRF token was missing or wrong.
    #[error("the form's CSRF token is missing or wrong: reload the page and try again")]
    Csrf,
    /// An action in read-only mode.
    #[error("the console is read-only: nothing was changed")]
    ReadOnly,
    /// No access token, or a wrong one.
    #[error("an access token is needed: open /login?token=... once")]
    Unauthorized,
    /// The listen address is not loopback and neither a token nor
    /// read-only mode was given.
    #[error(
        "refusing to listen on {0}: not a loopback address; give an access token (--token) \
         or --read-only"
    )]
    PublicListen(std::net::SocketAddr),
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        let status = match &self {
            ConsoleError::Db(pgmq_client::Error::QueueNotFound { .. }) => StatusCode::NOT_FOUND,
            ConsoleError::Db(pgmq_client::Error::InvalidQueueName { .. }) => {
                StatusCode::BAD_REQUEST
            }
            ConsoleError::Db(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ConsoleError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ConsoleError::Csrf | ConsoleError::ReadOnly => StatusCode::FORBIDDEN,
            ConsoleError::Unauthorized => StatusCode::UNAUTHORIZED,
            ConsoleError::PublicListen(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let page = crate::layout::shell(
            "Error",
            None,
            maud::html! { p.error { (self.to_string()) } },
        );
        (status, page).into_response()
    }
}
