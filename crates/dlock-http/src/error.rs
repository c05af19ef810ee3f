//! The handler-side error type. It carries a code from the catalogue and never an HTTP
//! status of its own (except the documented overrides, see [`ApiError::with_status`]).

use axum::response::{IntoResponse, Response};
use dlock_contract::{ErrorCode, FieldError};
use serde_json::Value;

/// `retryAfterMillis` used when a retry-after code is raised without an explicit value.
pub const RETRY_AFTER_MS_DEFAULT: u64 = 1_000;

/// An error a handler answers with. Rendered into the envelope by the middleware.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub details: Option<Value>,
    pub retry_after_ms: Option<u64>,
    /// Logged with the trace id; never sent to the caller.
    pub internal: Option<String>,
    /// A status other than the catalogue's, for the documented exceptions only: the proxy
    /// answers a rail decline `422` and the stub answers a decline `402`, both with code
    /// `VALIDATION_FAILED` (C3-extensions.md, C-1 and C-18).
    pub status_override: Option<u16>,
    /// The service met a state its rules say cannot be ([`ApiError::internal`]): answered
    /// `INTERNAL` and emitted as a `contradiction` event (crate doc). An unknown outcome is
    /// `INTERNAL` too, and no contradiction.
    pub contradiction: bool,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
            details: None,
            retry_after_ms: None,
            internal: None,
            status_override: None,
            contradiction: false,
        }
    }

    /// `VALIDATION_FAILED` with `details.fields[]`.
    pub fn validation(message: impl Into<String>, fields: Vec<FieldError>) -> ApiError {
        let fields = serde_json::to_value(fields).unwrap_or(Value::Null);
        ApiError::new(ErrorCode::ValidationFailed, message).with_details(serde_json::json!({ "fields": fields }))
    }

    /// `INTERNAL` for a contradiction (a state the rules say cannot be: a store guard that
    /// refused what the rule decided, a committed outcome without its record), with the
    /// cause kept for the log and the `contradiction` event only.
    pub fn internal(cause: impl Into<String>) -> ApiError {
        ApiError { contradiction: true, ..ApiError::new(ErrorCode::Internal, "internal error").with_internal(cause) }
    }

    /// Marks this error a contradiction (the `contradiction` field) when `met`: an answer
    /// other than [`ApiError::internal`]'s whose cause is one, such as an unknown outcome
    /// whose store refused what the rule decided.
    pub fn contradiction_if(mut self, met: bool) -> ApiError {
        self.contradiction |= met;
        self
    }

    pub fn with_details(mut self, details: Value) -> ApiError {
        self.details = Some(details);
        self
    }

    pub fn with_retry_after_ms(mut self, ms: u64) -> ApiError {
        self.retry_after_ms = Some(ms);
        self
    }

    pub fn with_internal(mut self, cause: impl Into<String>) -> ApiError {
        self.internal = Some(cause.into());
        self
    }

    pub fn with_status(mut self, status: u16) -> ApiError {
        self.status_override = Some(status);
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // The envelope middleware renders it, so the trace id is in one place.
        let status = self.status_override.unwrap_or(self.code.http_status());
        let mut resp = Response::new(axum::body::Body::empty());
        *resp.status_mut() =
            axum::http::StatusCode::from_u16(status).unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        resp.extensions_mut().insert(self);
        resp
    }
}
