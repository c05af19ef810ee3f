//! The executor's OpenAPI document (C3-extensions E-16), generated from the `#[utoipa::path]`
//! attributes on its handlers and completed by [`dlock_http::openapi::complete`] with
//! security (from [`dlock_contract::auth::EXECUTOR_ROUTES`]) and every error code of [`ERRORS`].
//!
//! Invariant: every route the service's router serves is an operation of [`document`],
//! with an [`ERRORS`] row (the `openapi_docs` test of the `dlock` crate proves both).

use dlock_http::openapi::{errors, RouteErrors, ServiceDoc};
use utoipa::OpenApi;

/// Every error code each operation's handler can answer (beyond the transport and auth
/// codes [`dlock_http::openapi::complete`] adds to every route).
pub const ERRORS: &[RouteErrors] = &[
    errors("GET", "/health/ready", &[]),
    errors("GET", "/health/live", &[]),
    errors("GET", "/metrics", &[]),
    errors("GET", dlock_http::openapi::DOCUMENT_PATH, &[]),
];

#[derive(OpenApi)]
#[openapi(
    info(
        title = "dlock executor",
        description = "The worker that moves payouts; it serves only health, metrics and this document."
    ),
    paths(crate::ready, crate::metrics, dlock_http::health::live, openapi_json,),
    components(schemas(dlock_contract::ErrorEnvelope, dlock_contract::ErrorCode, dlock_contract::FieldError))
)]
struct Doc;

/// The executor's document.
pub fn document() -> Result<utoipa::openapi::OpenApi, dlock_http::openapi::DocError> {
    dlock_http::openapi::complete(
        Doc::openapi(),
        &ServiceDoc { roles: Some(dlock_contract::auth::EXECUTOR_ROUTES), errors: ERRORS },
    )
}

/// This service's OpenAPI document (C3-extensions E-16).
#[utoipa::path(get, path = "/v1/openapi.json", tag = "meta",
    responses((status = 200, description = "This service's OpenAPI 3.1 document.", content_type = "application/json; charset=utf-8", body = Object)))]
pub async fn openapi_json() -> axum::response::Response {
    dlock_http::openapi::serve(document())
}
