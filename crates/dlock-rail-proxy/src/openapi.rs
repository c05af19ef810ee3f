//! The rail-proxy's OpenAPI document (C3-extensions E-16), generated from the `#[utoipa::path]`
//! attributes on its handlers and completed by [`dlock_http::openapi::complete`] with
//! security (from [`dlock_contract::auth::RAIL_PROXY_ROUTES`]) and every error code of [`ERRORS`].
//!
//! Invariant: every route the service's router serves is an operation of [`document`],
//! with an [`ERRORS`] row (the `openapi_docs` test of the `dlock` crate proves both).

use dlock_contract::ErrorCode::{
    DuplicateSubmission, FencedOut, InvalidToken, NotReady, PayoutNotClaimable, RailAmbiguous, RailUnavailable,
    ValidationFailed,
};
use dlock_http::openapi::{errors, RouteErrors, ServiceDoc};
use utoipa::OpenApi;

/// Every error code each operation's handler can answer (beyond the transport and auth
/// codes [`dlock_http::openapi::complete`] adds to every route).
pub const ERRORS: &[RouteErrors] = &[
    RouteErrors {
        method: "POST",
        path: "/v1/rail/submissions",
        codes: &[
            dlock_http::openapi::BODY_CODES,
            &[InvalidToken, FencedOut, DuplicateSubmission, PayoutNotClaimable, RailAmbiguous, RailUnavailable],
        ],
        // A rail decline (C3-extensions C-1).
        overrides: &[(422, ValidationFailed)],
    },
    // R1b (C3-extensions E-19): what concerns the whole batch. Each payout's own answer is an
    // item of the 200 (`INTERNAL`, a lost or unreadable answer, is a transport code).
    RouteErrors {
        method: "POST",
        path: "/v1/rail/submission-batches",
        codes: &[dlock_http::openapi::BODY_CODES, &[InvalidToken, FencedOut, RailUnavailable]],
        overrides: &[],
    },
    errors("GET", "/health/ready", &[&[NotReady]]),
    errors("GET", "/v1/events", &[&[ValidationFailed, NotReady]]),
    errors("GET", "/v1/events/recent", &[&[ValidationFailed, NotReady]]),
    errors("GET", "/health/live", &[]),
    errors("GET", "/metrics", &[]),
    errors("GET", dlock_http::openapi::DOCUMENT_PATH, &[]),
];

#[derive(OpenApi)]
#[openapi(
    info(
        title = "dlock rail-proxy",
        description = "The only path to the rail: fenced, at most one forwardable submission per payout (C3 §3.5); several payouts of one account under one grant (C3-extensions E-19)."
    ),
    paths(
        crate::app::submit,
        crate::app::submit_batch,
        crate::app::events,
        crate::app::recent_events,
        crate::app::ready,
        crate::app::metrics,
        dlock_http::health::live,
        openapi_json,
    ),
    components(schemas(
        dlock_contract::ErrorEnvelope,
        dlock_contract::ErrorCode,
        dlock_contract::FieldError,
        dlock_contract::batch::BatchItem,
        dlock_contract::rail::SubmissionBatchItem,
        dlock_contract::stream::WireEvent
    ))
)]
struct Doc;

/// The rail-proxy's document.
pub fn document() -> Result<utoipa::openapi::OpenApi, dlock_http::openapi::DocError> {
    dlock_http::openapi::complete(
        Doc::openapi(),
        &ServiceDoc { roles: Some(dlock_contract::auth::RAIL_PROXY_ROUTES), errors: ERRORS },
    )
}

/// This service's OpenAPI document (C3-extensions E-16).
#[utoipa::path(get, path = "/v1/openapi.json", tag = "meta",
    responses((status = 200, description = "This service's OpenAPI 3.1 document.", content_type = "application/json; charset=utf-8", body = Object)))]
pub async fn openapi_json() -> axum::response::Response {
    dlock_http::openapi::serve(document())
}
