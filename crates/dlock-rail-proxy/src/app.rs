//! HTTP surface of the proxy (C3 §3.5): `POST /v1/rail/submissions`, health, metrics.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Extension;
use dlock_contract::rail::{SubmissionAck, SubmissionOutcome, SubmissionRequest};
use dlock_contract::time::rfc3339_ms;
use dlock_contract::ErrorCode;
use dlock_http::{ApiError, JsonBody, TraceId};
use serde_json::json;

use crate::service::{Outcome, RailProxy, Submission, RAIL_UNAVAILABLE_RETRY_AFTER_MS};

/// The proxy's routes, wrapped in the envelope middleware.
pub fn router(proxy: Arc<RailProxy>) -> axum::Router {
    router_with_auth(proxy, None)
}

/// [`router`] behind `auth` (none: authentication off), with this service's role table.
pub fn router_with_auth(proxy: Arc<RailProxy>, auth: Option<Arc<dlock_http::auth::Authenticator>>) -> axum::Router {
    let body_bytes_max = proxy.cfg.body_bytes_max;
    let routes = axum::Router::new()
        .route("/v1/rail/submissions", post(submit))
        .route("/health/live", get(dlock_http::health::live))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics))
        .route(dlock_http::openapi::DOCUMENT_PATH, get(crate::openapi::openapi_json))
        .with_state(proxy);
    dlock_http::finish_with_auth(routes, body_bytes_max, auth)
}

/// Submit a claimed payout to the rail (C3 §3.5, worker), at most once per payout.
#[utoipa::path(post, path = "/v1/rail/submissions", tag = "rail",
    params(dlock_http::openapi::FencingTokenHeader, dlock_http::openapi::FencingSignatureHeader, dlock_http::openapi::OwnerHeader, dlock_http::openapi::IdempotencyKeyHeader),
    request_body(content = dlock_contract::rail::SubmissionRequest, content_type = "application/json"),
    responses((status = 200, description = "The rail acknowledged the transfer.", body = SubmissionAck)))]
async fn submit(
    State(proxy): State<Arc<RailProxy>>,
    Extension(trace): Extension<TraceId>,
    headers: HeaderMap,
    body: Result<JsonBody, ApiError>,
) -> Result<Response, ApiError> {
    // Header checks first: a malformed token is INVALID_TOKEN whatever the body says.
    let token = dlock_http::fencing_token(&headers)?;
    let signature = dlock_http::fencing_signature(&headers)?;
    let owner = dlock_http::owner_id(&headers)?;
    let key = dlock_http::idempotency_key(&headers)?;
    let JsonBody(raw) = body?;
    let body = SubmissionRequest::from_json(&raw)
        .map_err(|fields| ApiError::validation("the submission body is invalid", fields))?;
    let payout_id = body.payout_id;
    let account_id = body.account_id.clone();
    let presented = token.get();
    let owner_text = owner.as_str().to_owned();
    let outcome = proxy.submit(Submission { token, signature, owner, key, body, trace_id: trace.0 }).await;
    Ok(match outcome {
        Outcome::Acked { submission_id, rail_reference, submitted_at, resolved_at } => dlock_http::json(
            StatusCode::OK,
            &SubmissionAck {
                submission_id,
                payout_id,
                presented_token: presented,
                outcome: SubmissionOutcome::Acked,
                rail_reference,
                submitted_at,
                resolved_at,
            },
        ),
        Outcome::Invalid { message, fields } => ApiError::validation(message, fields).into_response(),
        Outcome::GrantRefused(e) => dlock_http::grant_refused(e).into_response(),
        Outcome::StoreUnavailable { cause } => ApiError::new(
            ErrorCode::RailUnavailable,
            "the submission could not be recorded; nothing was presented to the rail",
        )
        .with_retry_after_ms(RAIL_UNAVAILABLE_RETRY_AFTER_MS)
        .with_internal(cause)
        .into_response(),
        Outcome::StoreUnknown { cause } => ApiError::new(
            ErrorCode::Internal,
            "paydb's answer was lost or unreadable; the intent may have committed: do not resubmit",
        )
        .with_internal(cause)
        .into_response(),
        Outcome::Unknown { cause } => {
            ApiError::new(ErrorCode::Internal, "the submission failed at an unknown point; do not resubmit")
                .with_internal(cause)
                .into_response()
        }
        Outcome::Fenced { submission_id, highest_token } => ApiError::new(
            ErrorCode::FencedOut,
            "the presented token does not exceed the account's high-water mark; a newer holder exists",
        )
        .with_details(json!({
            "presentedToken": presented,
            "highestToken": highest_token,
            "resourceType": "rail",
            "resourceId": account_id,
            "ownerId": owner_text,
            "payoutId": payout_id,
            "submissionId": submission_id,
            "outcome": SubmissionOutcome::Fenced,
        }))
        .into_response(),
        Outcome::Duplicate { submission_id, first_submission_id, first_submitted_at } => ApiError::new(
            ErrorCode::DuplicateSubmission,
            "this payout already has a submission record; resolve from it, never resubmit",
        )
        .with_details(json!({
            "payoutId": payout_id,
            "submissionId": submission_id,
            "firstSubmissionId": first_submission_id,
            "firstSubmittedAt": rfc3339_ms(first_submitted_at),
            "outcome": SubmissionOutcome::Duplicate,
        }))
        .into_response(),
        Outcome::NotClaimable { state } => ApiError::new(
            ErrorCode::PayoutNotClaimable,
            "the payout is not CLAIMED; only a claimed payout is submitted",
        )
        .with_details(json!({ "payoutId": payout_id, "state": state }))
        .into_response(),
        Outcome::Rejected { submission_id } => {
            ApiError::new(ErrorCode::ValidationFailed, "the rail declined the transfer")
                .with_status(422)
                .with_details(json!({
                    "payoutId": payout_id,
                    "submissionId": submission_id,
                    "outcome": SubmissionOutcome::Rejected,
                }))
                .into_response()
        }
        Outcome::Ambiguous { submission_id, cause } => ApiError::new(
            ErrorCode::RailAmbiguous,
            "the attempt was forwarded and its outcome is unknown; the payout is quarantined, never resubmit",
        )
        .with_details(json!({
            "payoutId": payout_id,
            "submissionId": submission_id,
            "outcome": SubmissionOutcome::Timeout,
        }))
        .with_internal(cause)
        .into_response(),
        Outcome::Unsent { submission_id, cause } => {
            ApiError::new(ErrorCode::RailUnavailable, "the rail could not be reached; nothing was presented to it")
                .with_retry_after_ms(RAIL_UNAVAILABLE_RETRY_AFTER_MS)
                .with_details(json!({
                    "payoutId": payout_id,
                    "submissionId": submission_id,
                    "outcome": SubmissionOutcome::Unsent,
                }))
                .with_internal(cause)
                .into_response()
        }
    })
}

/// Readiness (C4): paydb and the rail answer.
#[utoipa::path(get, path = "/health/ready", tag = "health",
    responses((status = 200, description = "Ready.", body = dlock_http::openapi::Health)))]
async fn ready(State(proxy): State<Arc<RailProxy>>) -> Response {
    let (db, rail) = proxy.readiness().await;
    dlock_http::health::ready(BTreeMap::from([("paydb", db), ("railStub", rail)]))
}

/// Prometheus metrics (C4).
#[utoipa::path(get, path = "/metrics", tag = "metrics",
    responses((status = 200, description = "Prometheus text exposition.", content_type = "text/plain; version=0.0.4; charset=utf-8", body = String)))]
async fn metrics(State(proxy): State<Arc<RailProxy>>) -> Response {
    dlock_http::metrics::response(proxy.render_metrics())
}
