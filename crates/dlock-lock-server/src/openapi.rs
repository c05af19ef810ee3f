//! The lock server's OpenAPI document (C3 §3.3, C3-extensions E-16), generated from the
//! `#[utoipa::path]` attributes on the handlers in [`crate::app`] and completed by
//! [`dlock_http::openapi::complete`] with security (from
//! [`dlock_contract::auth::LOCK_SERVER_ROUTES`]) and every error code of [`ERRORS`].
//!
//! Invariant: every route [`crate::app::router`] serves is an operation of [`document`],
//! with an [`ERRORS`] row (the `openapi_docs` test of the `dlock` crate proves both).

use dlock_contract::ErrorCode::{
    ContentionExceeded, FencedOut, InvalidToken, LockContended, LockLost, NotFound, NotLeader, NotReady,
    SessionExpired, SessionUnknown, ValidationFailed,
};
use dlock_http::openapi::{errors, RouteErrors, ServiceDoc, BODY_CODES};
use utoipa::OpenApi;

/// Every error code each operation's handler can answer (beyond the transport and auth
/// codes [`dlock_http::openapi::complete`] adds to every route).
pub const ERRORS: &[RouteErrors] = &[
    errors("POST", "/v1/sessions", &[BODY_CODES, &[NotLeader]]),
    errors(
        "POST",
        "/v1/sessions/{sessionId}/heartbeat",
        &[&[ValidationFailed, SessionUnknown, SessionExpired, NotLeader]],
    ),
    errors("DELETE", "/v1/sessions/{sessionId}", &[&[ValidationFailed, SessionUnknown, NotLeader]]),
    errors(
        "POST",
        "/v1/locks/{key}/acquire",
        &[BODY_CODES, &[SessionUnknown, SessionExpired, LockContended, ContentionExceeded, NotLeader]],
    ),
    errors(
        "POST",
        "/v1/locks/{key}/renew",
        &[BODY_CODES, &[InvalidToken, SessionUnknown, SessionExpired, LockLost, NotLeader]],
    ),
    errors(
        "POST",
        "/v1/locks/{key}/rotate",
        &[BODY_CODES, &[InvalidToken, SessionUnknown, SessionExpired, LockLost, LockContended, NotLeader]],
    ),
    errors("DELETE", "/v1/locks/{key}", &[BODY_CODES, &[InvalidToken, LockLost, NotLeader]]),
    errors("GET", "/v1/locks/{key}", &[&[ValidationFailed, NotFound, NotLeader]]),
    errors("GET", "/v1/locks", &[&[ValidationFailed, NotLeader]]),
    errors("GET", "/v1/events", &[&[ValidationFailed, NotReady]]),
    errors("GET", "/v1/events/recent", &[&[ValidationFailed, NotReady]]),
    errors("POST", "/v1/locks/{key}/revoke", &[BODY_CODES, &[NotFound, FencedOut, NotLeader]]),
    errors("GET", "/health/live", &[]),
    errors("GET", "/health/ready", &[&[NotReady]]),
    errors("GET", "/metrics", &[]),
    errors("GET", dlock_http::openapi::DOCUMENT_PATH, &[]),
];

/// The `{key}` path parameter (C3 L4).
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct KeyPath {
    /// The lock key: 1 to 128 characters of `[a-zA-Z0-9:._-]`.
    #[param(pattern = "^[a-zA-Z0-9:._-]{1,128}$", example = "payout:acct-1")]
    pub key: String,
}

/// The query of `GET /v1/locks` (C3-extensions E-23). Any other parameter, or one given
/// twice, is `400 VALIDATION_FAILED`.
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LockListQuery {
    /// Only the keys that start with this (a key's characters: 1 to 128 of
    /// `[a-zA-Z0-9:._-]`).
    #[param(pattern = "^[a-zA-Z0-9:._-]{1,128}$", example = "payout:")]
    pub prefix: Option<String>,
    /// `nextCursor` of the previous page (with the same `prefix`): the keys after it.
    #[param(pattern = "^[a-zA-Z0-9:._-]{1,128}$")]
    pub after: Option<String>,
    /// Keys on the page (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

// The literals above are the contract's bounds.
const _: () =
    assert!(dlock_contract::lock::LOCK_LIST_ITEMS_DEFAULT == 100 && dlock_contract::lock::LOCK_LIST_ITEMS_MAX == 500);

/// The `{sessionId}` path parameter.
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SessionPath {
    /// A session id as `POST /v1/sessions` returned it (a hyphenated UUID).
    #[param(rename = "sessionId")]
    pub session_id: uuid::Uuid,
}

#[derive(OpenApi)]
#[openapi(
    info(title = "dlock lock server", description = "Sessions, leases and fencing tokens (C3 §3.3)."),
    paths(
        crate::app::open_session,
        crate::app::heartbeat,
        crate::app::close_session,
        crate::app::acquire,
        crate::app::renew,
        crate::app::rotate,
        crate::app::release,
        crate::app::info,
        crate::app::list,
        crate::app::revoke,
        crate::app::events,
        crate::app::recent_events,
        dlock_http::health::live,
        crate::app::ready,
        crate::app::metrics,
        openapi_json,
    ),
    components(schemas(
        dlock_contract::ErrorEnvelope,
        dlock_contract::ErrorCode,
        dlock_contract::FieldError,
        dlock_contract::stream::WireEvent
    ))
)]
struct Doc;

/// The lock server's document.
pub fn document() -> Result<utoipa::openapi::OpenApi, dlock_http::openapi::DocError> {
    dlock_http::openapi::complete(
        Doc::openapi(),
        &ServiceDoc { roles: Some(dlock_contract::auth::LOCK_SERVER_ROUTES), errors: ERRORS },
    )
}

/// This service's OpenAPI document (C3-extensions E-16).
#[utoipa::path(get, path = "/v1/openapi.json", tag = "meta",
    responses((status = 200, description = "This service's OpenAPI 3.1 document.", content_type = "application/json; charset=utf-8", body = Object)))]
pub async fn openapi_json() -> axum::response::Response {
    dlock_http::openapi::serve(document())
}
