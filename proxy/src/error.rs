//! The crate's one error type: setup errors (flags, engine state, sharing)
//! and request errors, each turned into an OpenAI-style JSON error response.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// Errors of the proxy. Every message says what to do next.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An `--engine` value that is not `ID=URL`.
    #[error("bad --engine {value:?}: {reason}")]
    BadEngine {
        /// The value given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// A setting or flag combination that cannot work.
    #[error("{0}")]
    Config(String),
    /// The router refused its settings or instances.
    #[error(transparent)]
    Router(#[from] engine_state_router::Error),
    /// Sharing reservations could not start.
    #[error("could not share reservations: {0}")]
    Sharing(String),
    /// The listener could not be bound or served.
    #[error("could not listen on {addr}: {source}; pick a free address")]
    Listen {
        /// The address asked for.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A request the proxy cannot route (400).
    #[error("{0}")]
    BadRequest(String),
    /// A request body over the bound (413).
    #[error(
        "the request body is over {limit} bytes; send a smaller prompt or raise --max-body-bytes"
    )]
    TooLarge {
        /// The bound in bytes.
        limit: usize,
    },
    /// No engine can take the request now (503).
    #[error("no healthy engine: {0}")]
    Unavailable(String),
    /// The chosen engine failed before answering (502), or did not answer in time (504).
    #[error("engine {engine} {what}")]
    Upstream {
        /// The engine id.
        engine: String,
        /// What happened.
        what: String,
        /// A timeout (504) rather than a failure (502).
        timeout: bool,
    },
}

impl Error {
    fn status(&self) -> StatusCode {
        match self {
            Error::BadRequest(_) => StatusCode::BAD_REQUEST,
            Error::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Error::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::Upstream { timeout: true, .. } => StatusCode::GATEWAY_TIMEOUT,
            Error::Upstream { .. } => StatusCode::BAD_GATEWAY,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for Error {
    /// `{"error": {"message", "type", "code"}}`, as OpenAI's API answers errors.
    fn into_response(self) -> Response {
        let status = self.status();
        let kind = match status {
            StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => "invalid_request_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable",
            _ => "upstream_error",
        };
        let body = serde_json::json!({
            "error": {"message": self.to_string(), "type": kind, "code": status.as_u16()}
        });
        (
            status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response()
    }
}
