//! HTTP surface of the proxy (C3 §3.5): `POST /v1/rail/submissions`, its batch
//! `POST /v1/rail/submission-batches` (C3-extensions E-19), health, metrics.
//!
//! Invariant: a submission's outcome has one wire answer (`answer`); the single
//! submission answers with it, and each item of a batch is it (status and body, the
//! envelope carrying the batch request's trace id), so an item never differs from what the
//! single submission would answer for that payout under the same token.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Extension;
use dlock_contract::batch::{BatchAnswer, BatchItem};
use dlock_contract::fenced::{FencedOut, FencedResource};
use dlock_contract::rail::{SubmissionAck, SubmissionBatchRequest, SubmissionOutcome, SubmissionRequest};
use dlock_contract::time::rfc3339_ms;
use dlock_contract::ErrorCode;
use dlock_http::{ApiError, JsonBody, TraceId};
use serde_json::json;

use crate::service::{BatchOutcome, BatchSubmission, Outcome, RailProxy, Submission, RAIL_UNAVAILABLE_RETRY_AFTER_MS};

/// The proxy's routes, wrapped in the envelope middleware.
pub fn router(proxy: Arc<RailProxy>) -> axum::Router {
    router_with_auth(proxy, None)
}

/// [`router`] behind `auth` (none: authentication off), with this service's role table.
pub fn router_with_auth(proxy: Arc<RailProxy>, auth: Option<Arc<dlock_http::auth::Authenticator>>) -> axum::Router {
    let body_bytes_max = proxy.cfg.body_bytes_max;
    let routes = axum::Router::new()
        .route("/v1/rail/submissions", post(submit))
        .route("/v1/rail/submission-batches", post(submit_batch))
        .route("/v1/events", get(events))
        .route("/v1/events/recent", get(recent_events))
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
    let answering = Answering {
        payout_id: body.payout_id,
        account_id: body.account_id.clone(),
        presented_token: token.get(),
        owner_id: owner.as_str().to_owned(),
    };
    let outcome = proxy.submit(Submission { token, signature, owner, key, body, trace_id: trace.0 }).await;
    Ok(match answer(outcome, &answering) {
        Ok(ack) => dlock_http::json(StatusCode::OK, &ack),
        Err(e) => e.into_response(),
    })
}

/// Submit several claimed payouts of one account under one grant (C3-extensions E-19, R1b,
/// worker): one fence pass for all of them, each forwarded at most once. Each item is what
/// `POST /v1/rail/submissions` answers for its payout under this token.
#[utoipa::path(post, path = "/v1/rail/submission-batches", tag = "rail",
    params(dlock_http::openapi::FencingTokenHeader, dlock_http::openapi::FencingSignatureHeader, dlock_http::openapi::OwnerHeader),
    request_body(content = dlock_contract::rail::SubmissionBatchRequest, content_type = "application/json"),
    responses((status = 200, description = "One item per submission, in the request's order: each the status and body the single submission answers for its payout under this token (ACKED 200; a decline 422 VALIDATION_FAILED; RAIL_AMBIGUOUS; DUPLICATE_SUBMISSION; PAYOUT_NOT_CLAIMABLE; RAIL_UNAVAILABLE after UNSENT; 400 VALIDATION_FAILED for a payout that does not match its submission, nothing written for it). The whole request's refusals (400, 409 FENCED_OUT, 503 RAIL_UNAVAILABLE, 500 INTERNAL) are the error responses `openapi::ERRORS` adds.", body = BatchAnswer)))]
async fn submit_batch(
    State(proxy): State<Arc<RailProxy>>,
    Extension(trace): Extension<TraceId>,
    headers: HeaderMap,
    body: Result<JsonBody, ApiError>,
) -> Result<Response, ApiError> {
    // Header checks first, as the single submission's; `X-Idempotency-Key` is not read (each
    // submission carries its payout's key in the body).
    let token = dlock_http::fencing_token(&headers)?;
    let signature = dlock_http::fencing_signature(&headers)?;
    let owner = dlock_http::owner_id(&headers)?;
    let JsonBody(raw) = body?;
    let body = SubmissionBatchRequest::from_json(&raw)
        .map_err(|fields| ApiError::validation("the submission batch body is invalid", fields))?;
    let presented_token = token.get();
    let owner_id = owner.as_str().to_owned();
    let account_id = body.account_id.clone();
    let payouts: Vec<uuid::Uuid> = body.submissions.iter().map(|s| s.payout_id).collect();
    let trace_id = trace.0.clone();
    let batch = BatchSubmission { token, signature, owner, body, trace_id: trace.0 };
    Ok(match proxy.submit_batch(batch).await {
        BatchOutcome::Whole(outcome) => request_error(outcome)
            .unwrap_or_else(|| ApiError::internal("a batch's whole answer was a payout's"))
            .into_response(),
        BatchOutcome::Fenced { highest_token } => {
            let whole = Answering { payout_id: uuid::Uuid::nil(), account_id, presented_token, owner_id };
            fenced_out(&whole, highest_token, None).into_response()
        }
        BatchOutcome::Items(outcomes) => {
            let items = payouts
                .into_iter()
                .zip(outcomes)
                .map(|(payout_id, outcome)| {
                    let answering = Answering {
                        payout_id,
                        account_id: account_id.clone(),
                        presented_token,
                        owner_id: owner_id.clone(),
                    };
                    item(payout_id, answer(outcome, &answering), &trace_id)
                })
                .collect();
            dlock_http::json(StatusCode::OK, &BatchAnswer { account_id, presented_token, items })
        }
    })
}

/// What an answer about one payout names: the payout, its account, the token and owner.
struct Answering {
    payout_id: uuid::Uuid,
    account_id: String,
    presented_token: i64,
    owner_id: String,
}

/// 409 `FENCED_OUT` at the rail's high-water mark for `a`'s token and account (C3 §3.4's
/// details, `resourceType` `rail`): a single submission (`submission_id` given) names its
/// payout, attempt and outcome; a fenced batch (C3-extensions E-19) nothing more.
fn fenced_out(a: &Answering, highest_token: i64, submission_id: Option<uuid::Uuid>) -> ApiError {
    let mut details =
        FencedOut::new(a.presented_token, highest_token, FencedResource::Rail, &a.account_id, &a.owner_id);
    if let Some(submission_id) = submission_id {
        details = details.for_payout(a.payout_id);
        details.submission_id = Some(submission_id);
        details.outcome = Some(SubmissionOutcome::Fenced);
    }
    ApiError::new(
        ErrorCode::FencedOut,
        "the presented token does not exceed the account's high-water mark; a newer holder exists",
    )
    .with_details(details.to_value())
}

/// The answer a submission's `outcome` comes to on the wire (C3 §3.5, C3-extensions E-4):
/// its `SubmissionAck`, or the error its envelope carries. The single submission answers
/// with it, and each item of a batch is it.
fn answer(outcome: Outcome, a: &Answering) -> Result<SubmissionAck, ApiError> {
    let payout_id = a.payout_id;
    Err(match outcome {
        Outcome::Acked { submission_id, rail_reference, submitted_at, resolved_at } => {
            return Ok(SubmissionAck {
                submission_id,
                payout_id,
                presented_token: a.presented_token,
                outcome: SubmissionOutcome::Acked,
                rail_reference,
                submitted_at,
                resolved_at,
            })
        }
        Outcome::Fenced { submission_id, highest_token } => fenced_out(a, highest_token, Some(submission_id)),
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
        })),
        Outcome::NotClaimable { state } => ApiError::new(
            ErrorCode::PayoutNotClaimable,
            "the payout is not CLAIMED; only a claimed payout is submitted",
        )
        .with_details(json!({ "payoutId": payout_id, "state": state })),
        Outcome::Rejected { submission_id } => {
            ApiError::new(ErrorCode::ValidationFailed, "the rail declined the transfer").with_status(422).with_details(
                json!({
                    "payoutId": payout_id,
                    "submissionId": submission_id,
                    "outcome": SubmissionOutcome::Rejected,
                }),
            )
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
        .with_internal(cause),
        Outcome::Unsent { submission_id, cause } => {
            ApiError::new(ErrorCode::RailUnavailable, "the rail could not be reached; nothing was presented to it")
                .with_retry_after_ms(RAIL_UNAVAILABLE_RETRY_AFTER_MS)
                .with_details(json!({
                    "payoutId": payout_id,
                    "submissionId": submission_id,
                    "outcome": SubmissionOutcome::Unsent,
                }))
                .with_internal(cause)
        }
        other => match request_error(other) {
            Some(e) => e,
            None => ApiError::internal("an outcome with no answer"),
        },
    })
}

/// The error of an outcome that names no attempt (validation, the grant, the store before
/// any forward, a failed task): what a batch answers for the whole request, and the single
/// submission for its one. `None` for an outcome about an attempt.
fn request_error(outcome: Outcome) -> Option<ApiError> {
    Some(match outcome {
        Outcome::Invalid { message, fields } => ApiError::validation(message, fields),
        Outcome::GrantRefused(e) => dlock_http::grant_refused(e),
        Outcome::StoreUnavailable { cause } => ApiError::new(
            ErrorCode::RailUnavailable,
            "the submission could not be recorded; nothing was presented to the rail",
        )
        .with_retry_after_ms(RAIL_UNAVAILABLE_RETRY_AFTER_MS)
        .with_internal(cause),
        Outcome::StoreUnknown { cause, contradiction } => ApiError::new(
            ErrorCode::Internal,
            "paydb's answer was lost or unreadable; the intent may have committed: do not resubmit",
        )
        .contradiction_if(contradiction)
        .with_internal(cause),
        Outcome::Unknown { cause } => {
            ApiError::new(ErrorCode::Internal, "the submission failed at an unknown point; do not resubmit")
                .with_internal(cause)
        }
        _ => return None,
    })
}

/// A batch item: the single submission's status and body for `payout_id` (its envelope
/// rendered as the middleware renders one, with the batch request's trace id). An internal
/// cause is logged as the middleware logs it, never sent.
fn item(payout_id: uuid::Uuid, answered: Result<SubmissionAck, ApiError>, trace_id: &str) -> BatchItem {
    let (status, bytes) = match answered {
        Ok(ack) => match serde_json::to_vec(&ack) {
            Ok(bytes) => (200, bytes),
            Err(e) => dlock_http::envelope_bytes(ApiError::internal(format!("serialize an answer: {e}")), trace_id),
        },
        Err(e) => {
            if let Some(cause) = &e.internal {
                tracing::error!(code = e.code.as_str(), payoutId = %payout_id, traceId = %trace_id, cause = %cause,
                    "batch_item_failed");
            }
            dlock_http::envelope_bytes(e, trace_id)
        }
    };
    let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    BatchItem { payout_id, status, body }
}

/// The event hub, or 503 while paydb cannot be read for its key.
async fn hub(proxy: &RailProxy) -> Result<Arc<dlock_http::stream::EventHub>, ApiError> {
    proxy.event_hub().await.map_err(|e| {
        ApiError::new(ErrorCode::NotReady, "paydb is unavailable")
            .with_retry_after_ms(1_000)
            .with_internal(e.to_string())
    })
}

/// The event stream (C3-extensions E-20): paydb's rail events (intent, refusal, outcome,
/// mark), as Server-Sent Events from the cursor.
#[utoipa::path(get, path = "/v1/events", tag = "events", params(dlock_http::stream::EventsQuery),
    responses((status = 200, description = "Server-Sent Events: each event's `id:` is the cursor to resume from; `bookmark` and `resync_required` frames (C3-extensions E-20).", content_type = "text/event-stream; charset=utf-8", body = dlock_http::stream::SseFrame)))]
pub(crate) async fn events(
    State(proxy): State<Arc<RailProxy>>,
    principal: Option<Extension<dlock_http::auth::Principal>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let hub = hub(&proxy).await?;
    dlock_http::stream::events_response(&hub, principal.as_ref().map(|p| &p.0), query.as_deref(), &headers)
}

/// The recent events (C3-extensions E-20): the newest rail events the filter selects, and
/// the cursor to stream on from.
#[utoipa::path(get, path = "/v1/events/recent", tag = "events", params(dlock_http::stream::RecentQuery),
    responses((status = 200, description = "The newest events, oldest first, and the cursor of their head.", body = dlock_http::stream::RecentPage)))]
pub(crate) async fn recent_events(
    State(proxy): State<Arc<RailProxy>>,
    principal: Option<Extension<dlock_http::auth::Principal>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let hub = hub(&proxy).await?;
    dlock_http::stream::recent_response(&hub, principal.as_ref().map(|p| &p.0), query.as_deref()).await
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
