//! The rail-stub's OpenAPI document (C3-extensions E-16), generated from the `#[utoipa::path]`
//! attributes on its handlers and completed by [`dlock_http::openapi::complete`] with
//! security (none: the stub never authenticates) and every error code of [`ERRORS`].
//!
//! Invariant: every route the service's router serves is an operation of [`document`],
//! with an [`ERRORS`] row (the `openapi_docs` test of the `dlock` crate proves both).

use dlock_contract::ErrorCode::{NotReady, ValidationFailed};
use dlock_http::openapi::{errors, RouteErrors, ServiceDoc};
use utoipa::OpenApi;

/// Every error code each operation's handler can answer (beyond the transport and auth
/// codes [`dlock_http::openapi::complete`] adds to every route).
pub const ERRORS: &[RouteErrors] = &[
    RouteErrors {
        method: "POST",
        path: "/submit",
        codes: &[dlock_http::openapi::BODY_CODES, &[NotReady]],
        // A decline (C3-extensions C-18).
        overrides: &[(402, ValidationFailed)],
    },
    errors("GET", "/calls", &[]),
    errors("GET", "/health/ready", &[]),
    errors("GET", "/health/live", &[]),
    errors("GET", "/metrics", &[]),
    errors("GET", dlock_http::openapi::DOCUMENT_PATH, &[]),
];

#[derive(OpenApi)]
#[openapi(
    info(
        title = "dlock rail-stub",
        description = "A hostile, memoryless stand-in for the bank rail (C3 §3.6). It never authenticates."
    ),
    paths(crate::submit, crate::calls, crate::metrics, crate::openapi::ready, dlock_http::health::live, openapi_json,),
    components(schemas(dlock_contract::ErrorEnvelope, dlock_contract::ErrorCode, dlock_contract::FieldError))
)]
struct Doc;

/// The rail-stub's document.
pub fn document() -> Result<utoipa::openapi::OpenApi, dlock_http::openapi::DocError> {
    dlock_http::openapi::complete(Doc::openapi(), &ServiceDoc { roles: None, errors: ERRORS })
}

/// This service's OpenAPI document (C3-extensions E-16).
#[utoipa::path(get, path = "/v1/openapi.json", tag = "meta",
    responses((status = 200, description = "This service's OpenAPI 3.1 document.", content_type = "application/json; charset=utf-8", body = Object)))]
pub async fn openapi_json() -> axum::response::Response {
    dlock_http::openapi::serve(document())
}

/// Readiness (C4): the stub has no dependency, so it is ready whenever it is live.
#[utoipa::path(get, path = "/health/ready", tag = "health",
    responses((status = 200, description = "Ready.", body = dlock_http::openapi::Health)))]
pub async fn ready() -> axum::response::Response {
    dlock_http::health::live().await
}
