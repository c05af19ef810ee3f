//! The payment-resource's OpenAPI document (C3 §3.4, C3-extensions E-16), generated from
//! the `#[utoipa::path]` attributes on the handlers in [`crate::app`] and completed by
//! [`dlock_http::openapi::complete`] with security (from
//! [`dlock_contract::auth::PAYMENT_ROUTES`]) and every error code of [`ERRORS`].
//!
//! Invariant: every route [`crate::app::router`] serves is an operation of [`document`],
//! with an [`ERRORS`] row (the `openapi_docs` test of the `dlock` crate proves both).

use dlock_contract::payout::PayoutState;
use dlock_contract::ErrorCode::{
    FencedOut, IdempotencyConflict, InsufficientFunds, InvalidToken, NotFound, NotReady, PayoutNotClaimable,
    ValidationFailed,
};
use dlock_http::openapi::{errors, RouteErrors, ServiceDoc, BODY_CODES};
use utoipa::OpenApi;

/// Every error code each operation's handler can answer (beyond the transport and auth
/// codes [`dlock_http::openapi::complete`] adds to every route). A replayed idempotent
/// answer is one of these too: it repeats the first answer byte for byte. A batch's rows
/// (P2b, P3b) list what it answers for the whole request; each payout's own answer is an
/// item of its `200` (C3-extensions E-19).
pub const ERRORS: &[RouteErrors] = &[
    errors("POST", "/v1/accounts", &[BODY_CODES, &[IdempotencyConflict, NotReady]]),
    errors("GET", "/v1/accounts/{accountId}", &[&[ValidationFailed, NotFound, NotReady]]),
    errors("POST", "/v1/payouts", &[BODY_CODES, &[IdempotencyConflict, NotReady]]),
    errors("GET", "/v1/payouts", &[&[ValidationFailed, NotReady]]),
    errors("GET", "/v1/payouts/{payoutId}", &[&[ValidationFailed, NotFound, NotReady]]),
    errors(
        "POST",
        "/v1/payouts/{payoutId}/resolution",
        &[BODY_CODES, &[NotFound, PayoutNotClaimable, IdempotencyConflict, NotReady]],
    ),
    errors(
        "POST",
        "/v1/payouts/{payoutId}/claim",
        &[
            BODY_CODES,
            &[InvalidToken, NotFound, FencedOut, PayoutNotClaimable, InsufficientFunds, IdempotencyConflict, NotReady],
        ],
    ),
    errors(
        "POST",
        "/v1/payouts/{payoutId}/post",
        &[BODY_CODES, &[InvalidToken, NotFound, FencedOut, PayoutNotClaimable, IdempotencyConflict, NotReady]],
    ),
    errors(
        "POST",
        "/v1/accounts/{accountId}/claims",
        &[BODY_CODES, &[InvalidToken, NotFound, FencedOut, IdempotencyConflict, NotReady]],
    ),
    errors(
        "POST",
        "/v1/accounts/{accountId}/posts",
        &[BODY_CODES, &[InvalidToken, NotFound, FencedOut, IdempotencyConflict, NotReady]],
    ),
    errors("GET", "/v1/events", &[&[ValidationFailed, NotReady]]),
    errors("GET", "/v1/events/recent", &[&[ValidationFailed, NotReady]]),
    errors("GET", "/health/live", &[]),
    errors("GET", "/health/ready", &[&[NotReady]]),
    errors("GET", "/metrics", &[]),
    errors("GET", dlock_http::openapi::DOCUMENT_PATH, &[]),
];

/// The `{payoutId}` path parameter.
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct PayoutPath {
    /// The payout's id (a hyphenated UUID).
    #[param(rename = "payoutId")]
    pub payout_id: uuid::Uuid,
}

/// The `{accountId}` path parameter.
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct AccountPath {
    /// The account's id: 1 to 64 characters of `[a-zA-Z0-9:._-]`.
    #[param(rename = "accountId", pattern = "^[a-zA-Z0-9:._-]{1,64}$", example = "acct-1")]
    pub account_id: String,
}

/// The query of `GET /v1/payouts` (P1). Any other parameter, or one given twice, is
/// `400 VALIDATION_FAILED`.
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only payouts in this state.
    pub state: PayoutState,
    /// Only this account's payouts.
    #[param(rename = "accountId", pattern = "^[a-zA-Z0-9:._-]{1,64}$")]
    pub account_id: Option<String>,
    /// Page size.
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    /// `nextCursor` of the previous page, with the same `state` and `accountId`.
    #[param(max_length = 512)]
    pub cursor: Option<String>,
}

#[derive(OpenApi)]
#[openapi(
    info(title = "dlock payment-resource", description = "Accounts, payouts and the fenced ledger (C3 §3.4)."),
    paths(
        crate::app::create_account,
        crate::app::get_account,
        crate::app::create_payout,
        crate::app::list_payouts,
        crate::app::get_payout,
        crate::app::resolve,
        crate::app::claim,
        crate::app::post_payout,
        crate::app::claim_batch,
        crate::app::post_batch,
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

/// The payment-resource's document.
pub fn document() -> Result<utoipa::openapi::OpenApi, dlock_http::openapi::DocError> {
    dlock_http::openapi::complete(
        Doc::openapi(),
        &ServiceDoc { roles: Some(dlock_contract::auth::PAYMENT_ROUTES), errors: ERRORS },
    )
}

/// This service's OpenAPI document (C3-extensions E-16).
#[utoipa::path(get, path = "/v1/openapi.json", tag = "meta",
    responses((status = 200, description = "This service's OpenAPI 3.1 document.", content_type = "application/json; charset=utf-8", body = Object)))]
pub async fn openapi_json() -> axum::response::Response {
    dlock_http::openapi::serve(document())
}
