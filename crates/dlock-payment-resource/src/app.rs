//! HTTP surface of the payment-resource (C3 §3.4, P1–P5, the two creates, and the batches
//! P2b and P3b of C3-extensions E-19).
//!
//! Check order on a fenced write (the first failure answers): token and the syntax of its
//! signature (400 `INVALID_TOKEN`) → owner → key → path → media type, size, JSON → fields
//! → the grant's signature against the stored payout's lock key (400 `INVALID_TOKEN`,
//! C3-extensions E-14; it writes nothing) → idempotency identity → the store's one
//! transaction (404, fence, state, funds). Refusals are judged afresh on every request;
//! committed outcomes are answered from the bytes the store recorded with them.
//!
//! A batch (P2b, P3b) checks in the same order, its path's `accountId` in place of the
//! payout id; its grant is checked once, against `payout:{accountId}` of the path (no read:
//! the store's transaction then finds each payout of that account, or answers it
//! `NOT_FOUND`). Its `200` carries one item per payout whose status and body are exactly
//! what the single write would answer for that payout under the batch's token (the same
//! renderers, the batch's trace id in every envelope; each body's bytes are the single
//! answer's). What concerns the whole batch (the fence, an unknown account, the identity,
//! a store failure) is answered for it, once. Per payout, the `fenced_write` event, the
//! claim or post counter and the log line are the single write's.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Extension;
use dlock_contract::batch::{batch_target, BatchAnswer};
use dlock_contract::fenced::{FencedOut, FencedResource};
use dlock_contract::payment::{
    AccountBody, ClaimAck, ClaimBatchRequest, ClaimRequest, EntryBody, NewAccountRequest, NewPayoutRequest, PayoutBody,
    PayoutItem, PayoutPage, PostAck, PostBatchRequest, PostRequest, SubmissionBody, CURSOR_CHARS_MAX, P1_LIMIT_DEFAULT,
    P1_LIMIT_MAX,
};
use dlock_contract::payout::PayoutState;
use dlock_contract::{ErrorCode, FieldError};
use dlock_http::{ApiError, JsonBody, TraceId};
use serde_json::json;
use uuid::Uuid;

use crate::cursor::CursorPayload;
use crate::metrics::{RESOURCE_ACCOUNT, RESOURCE_LEDGER};
use crate::service::{PaymentResource, NOT_READY_RETRY_AFTER_MS};
use crate::store::{
    AccountView, BatchItemOutcome, BatchOutcome, Claim, ClaimBatch, ClaimBatchOutcome, ClaimBatchPayout, ClaimOutcome,
    ClassifiedStoreError, CreateAccountOutcome, CreatePayoutOutcome, Decided, Idempotent, ListQuery, NewAccount,
    NewPayout, Operation, PayoutView, Post, PostBatch, PostBatchOutcome, PostBatchPayout, PostOutcome, StoreError,
    StoredResponse,
};

/// Target of the account-creation identity.
const TARGET_ACCOUNTS: &str = "accounts";
/// Target of the payout-creation identity.
const TARGET_PAYOUTS: &str = "payouts";

/// The payment-resource's routes, wrapped in the envelope middleware.
pub fn router(pr: Arc<PaymentResource>) -> axum::Router {
    router_with_auth(pr, None)
}

/// [`router`] behind `auth` (none: authentication off), with this service's role table.
pub fn router_with_auth(pr: Arc<PaymentResource>, auth: Option<Arc<dlock_http::auth::Authenticator>>) -> axum::Router {
    let body_bytes_max = pr.cfg.body_bytes_max;
    let routes = axum::Router::new()
        .route("/v1/accounts", post(create_account))
        .route("/v1/accounts/{account_id}", get(get_account))
        .route("/v1/payouts", post(create_payout).get(list_payouts))
        .route("/v1/payouts/{payout_id}", get(get_payout))
        .route("/v1/payouts/{payout_id}/claim", post(claim))
        .route("/v1/payouts/{payout_id}/post", post(post_payout))
        .route("/v1/accounts/{account_id}/claims", post(claim_batch))
        .route("/v1/accounts/{account_id}/posts", post(post_batch))
        .route("/health/live", get(dlock_http::health::live))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics))
        .route(dlock_http::openapi::DOCUMENT_PATH, get(crate::openapi::openapi_json))
        .with_state(pr);
    dlock_http::finish_with_auth(routes, body_bytes_max, auth)
}

// ---------------------------------------------------------------------------------------
// Shared pieces
// ---------------------------------------------------------------------------------------

/// A store failure, by its class (C3-extensions C-29): only `Unavailable` (nothing was
/// changed) is the retry-safe 503 `NOT_READY`; the others are 500 `INTERNAL`.
fn store_error(e: StoreError) -> ApiError {
    let code = e.fault().code(ErrorCode::NotReady);
    match e {
        StoreError::Unavailable(cause) => {
            ApiError::new(code, "paydb could not decide the request; nothing was changed")
                .with_retry_after_ms(NOT_READY_RETRY_AFTER_MS)
                .with_internal(cause)
        }
        StoreError::CommitUnknown(cause) => ApiError::new(
            code,
            "the outcome is unknown; replay the same request with the same key and token to learn it",
        )
        .with_internal(cause),
        StoreError::Corrupt(cause) => ApiError::internal(cause),
    }
}

/// The grant check of a fenced write (C3-extensions E-14), before the store's transaction
/// compares the token to the fence: the signature must be a trusted key's over
/// (`payout:{accountId}` of the payout as stored, the token, the request's owner). A
/// refusal is 400 `INVALID_TOKEN` and writes nothing (no row, no fence, no idempotency
/// record). The payout's account never changes once created, so reading it here, outside
/// the write's transaction, cannot race; the read is the one column
/// ([`crate::store::PaymentStore::payout_account`]), not the payout and its submissions. An
/// unknown payout passes to the store, whose transaction answers 404 and writes nothing
/// either.
async fn verify_grant(
    pr: &PaymentResource,
    payout_id: Uuid,
    signature: Option<&str>,
    token: i64,
    owner: &str,
) -> Result<(), ApiError> {
    let Some(account_id) = pr.store.payout_account(payout_id).await.map_err(store_error)? else { return Ok(()) };
    account_grant(pr, &account_id, signature, token, owner).map_err(|e| {
        tracing::warn!(payoutId = %payout_id, accountId = %account_id, presentedToken = token,
            ownerId = owner, cause = %e, "grant_signature_refused");
        dlock_http::grant_refused(e)
    })
}

/// Whether `signature` is a trusted key's over (`payout:{account_id}`, `token`, `owner`).
fn account_grant(
    pr: &PaymentResource,
    account_id: &str,
    signature: Option<&str>,
    token: i64,
    owner: &str,
) -> Result<(), dlock_contract::grant::GrantError> {
    let lock_key = dlock_contract::grant::payout_lock_key(account_id);
    pr.cfg.grants.verify(signature, &lock_key, token, Some(owner)).map(|_| ())
}

/// The grant check of a batch (C3-extensions E-19), once for the whole request: the
/// signature must be a trusted key's over (`payout:{accountId}` of the path, the token, the
/// request's owner). No read: a payout the batch names that is not this account's is its
/// item's `NOT_FOUND`, decided in the store's transaction. A refusal is 400 `INVALID_TOKEN`
/// and writes nothing.
fn verify_account_grant(
    pr: &PaymentResource,
    account_id: &str,
    signature: Option<&str>,
    token: i64,
    owner: &str,
) -> Result<(), ApiError> {
    account_grant(pr, account_id, signature, token, owner).map_err(|e| {
        tracing::warn!(accountId = %account_id, presentedToken = token, ownerId = owner, cause = %e,
            "grant_signature_refused");
        dlock_http::grant_refused(e)
    })
}

/// The path's `accountId`, or 400 `VALIDATION_FAILED`.
fn path_account_id(raw: &str) -> Result<(), ApiError> {
    if dlock_contract::rail::is_account_id(raw) {
        Ok(())
    } else {
        Err(ApiError::validation(
            "accountId in the path is malformed",
            vec![FieldError::new("accountId", "must be 1 to 64 characters of [a-zA-Z0-9:._-]")],
        ))
    }
}

fn path_uuid(raw: &str, field: &str) -> Result<Uuid, ApiError> {
    match Uuid::parse_str(raw) {
        Ok(id) if raw.len() == 36 => Ok(id),
        _ => Err(ApiError::validation(
            format!("{field} in the path must be a hyphenated UUID"),
            vec![FieldError::new(field, "must be a hyphenated UUID")],
        )),
    }
}

fn identity_error(cause: String) -> ApiError {
    ApiError::internal(format!("fingerprint: {cause}"))
}

/// A 2xx body as it is recorded and answered.
fn recorded<T: serde::Serialize>(status: u16, body: &T) -> StoredResponse {
    match serde_json::to_vec(body) {
        Ok(body) => StoredResponse { status, body },
        Err(e) => recorded_error(ApiError::internal(format!("serialize response: {e}")), ""),
    }
}

/// An error envelope as it is recorded and answered (with the first request's trace id).
fn recorded_error(err: ApiError, trace_id: &str) -> StoredResponse {
    let (status, body) = dlock_http::envelope_bytes(err, trace_id);
    StoredResponse { status, body }
}

/// Turns what the store decided into the answer: a replay or a committed outcome is the
/// recorded bytes; a refusal is rendered now by `refusal`. `committed` logs and counts a
/// committed outcome (after commit, never before).
fn answer<T, R: IntoResponse>(
    pr: &PaymentResource,
    decided: Decided<T>,
    (operation, target_id, owner_id): (Operation, &str, &str),
    committed: impl FnOnce(&T),
    refusal: impl FnOnce(T) -> R,
) -> Response {
    match decided {
        Err(e) => store_error(e).into_response(),
        Ok(Idempotent::Replayed(r)) => {
            pr.metrics.idempotency("replayed");
            dlock_http::prerendered(r.status, r.body)
        }
        Ok(Idempotent::Conflict) => {
            pr.metrics.idempotency("conflict");
            tracing::warn!(
                operation = operation.as_str(),
                targetId = target_id,
                ownerId = owner_id,
                "idempotency_conflict"
            );
            ApiError::new(
                ErrorCode::IdempotencyConflict,
                "this idempotency key was used with a materially different request; neither has any effect",
            )
            .with_details(json!({ "operation": operation.as_str(), "targetId": target_id }))
            .into_response()
        }
        Ok(Idempotent::Executed { outcome, stored: Some(r) }) => {
            pr.metrics.idempotency("executed");
            committed(&outcome);
            dlock_http::prerendered(r.status, r.body)
        }
        Ok(Idempotent::Executed { outcome, stored: None }) => {
            pr.metrics.idempotency("executed");
            refusal(outcome).into_response()
        }
    }
}

/// What a fenced write decided, for its `fenced_write` event ([`dlock_rt::events`]):
/// `accepted` (the fence let it through), `fenced_out` (with the stored token it did not
/// exceed), `no_decision` (refused before the fence: not found, not claimable; a conflict,
/// a replay, a store error).
struct FenceSeen<'a> {
    op: &'static str,
    payout_id: Uuid,
    token: i64,
    owner: &'a str,
    account: Option<&'a str>,
    answer: &'static str,
    stored_token: Option<i64>,
    replay: bool,
    fenced: bool,
}

/// Emits the `fenced_write` event of one claim or post, in the one code path every store
/// answers through (the handler), after the store decided.
fn emit_fenced_write(f: FenceSeen<'_>) {
    dlock_rt::events::emit(crate::NODE, "fenced_write", || {
        [
            ("op", f.op.into()),
            ("payout", f.payout_id.to_string().into()),
            ("account", f.account.unwrap_or_default().into()),
            ("owner", f.owner.into()),
            ("presented_token", f.token.into()),
            ("stored_token", dlock_rt::events::opt(f.stored_token)),
            ("answer", f.answer.into()),
            ("admission", serde_json::Value::Null),
            ("fenced", f.fenced.into()),
            ("state_before", serde_json::Value::Null),
            ("replay", f.replay.into()),
        ]
    });
}

/// The `fenced_write` event of one claim or post (`op`, guarded by `layer`), when a sink
/// listens: what the store decided, read through `accepted` and `fenced`.
#[allow(clippy::too_many_arguments)]
fn trace_fenced_write<T>(
    op: &'static str,
    layer: dlock_rt::defence::Layer,
    payout_id: Uuid,
    token: i64,
    owner: &str,
    decided: &Decided<T>,
    accepted: impl Fn(&T) -> Option<&str>,
    fenced: impl Fn(&T) -> Option<(&str, i64)>,
) {
    if !dlock_rt::events::enabled() {
        return;
    }
    let (answer, stored_token, account, replay) = fence_seen(decided, accepted, fenced, token);
    emit_fenced_write(FenceSeen {
        op,
        payout_id,
        token,
        owner,
        account: account.as_deref(),
        answer,
        stored_token,
        replay,
        fenced: !dlock_rt::defence::off(layer),
    });
}

/// The answer, stored token and account of a decided claim or post (`accepted`: the outcome
/// passed the fence; `fenced`: its highest token when it was refused by it).
fn fence_seen<T>(
    d: &Decided<T>,
    accepted: impl Fn(&T) -> Option<&str>,
    fenced: impl Fn(&T) -> Option<(&str, i64)>,
    token: i64,
) -> (&'static str, Option<i64>, Option<String>, bool) {
    match d {
        Ok(Idempotent::Executed { outcome, .. }) => {
            if let Some(a) = accepted(outcome) {
                ("accepted", Some(token), Some(a.to_owned()), false)
            } else if let Some((a, highest)) = fenced(outcome) {
                ("fenced_out", Some(highest), Some(a.to_owned()), false)
            } else {
                ("no_decision", None, None, false)
            }
        }
        Ok(Idempotent::Replayed(_)) => ("no_decision", None, None, true),
        _ => ("no_decision", None, None, false),
    }
}

/// The 409 `FENCED_OUT` of a claim (`account`) or a post (`ledger`), logged and counted
/// once. `payout_id` is the single write's payout; a batch (`None`) is refused for its
/// account, and its details name no payout.
#[allow(clippy::too_many_arguments)]
fn fenced_out(
    pr: &PaymentResource,
    resource: usize,
    resource_id: &str,
    presented: i64,
    highest: i64,
    owner_id: &str,
    payout_id: Option<Uuid>,
    trace: &TraceId,
) -> ApiError {
    let resource_type = crate::metrics::FENCED_RESOURCES[resource];
    pr.metrics.fenced_out.inc(resource);
    let mut details = FencedOut::new(presented, highest, FencedResource::ALL[resource], resource_id, owner_id);
    match payout_id {
        Some(payout_id) => {
            tracing::warn!(
                resource = resource_type,
                resourceId = resource_id,
                presentedToken = presented,
                highestToken = highest,
                ownerId = owner_id,
                payoutId = %payout_id,
                traceId = %trace.0,
                "fenced_out"
            );
            details = details.for_payout(payout_id);
        }
        None => tracing::warn!(
            resource = resource_type,
            resourceId = resource_id,
            presentedToken = presented,
            highestToken = highest,
            ownerId = owner_id,
            traceId = %trace.0,
            "fenced_out"
        ),
    }
    ApiError::new(
        ErrorCode::FencedOut,
        "the presented token does not exceed the stored fence; a newer holder exists. Abort the critical section",
    )
    .with_details(details.to_value())
}

/// P2's message for a payout not in the expected state.
const CLAIM_NOT_CLAIMABLE: &str = "the payout is not in the expected state; a claim changes nothing";
/// P3's message for a payout that is not RAIL_ACKED.
const POST_NOT_CLAIMABLE: &str = "only a RAIL_ACKED payout is posted; the post changes nothing";

/// P3's 400 for a body that names no acknowledged attempt of the payout.
fn rail_mismatch() -> ApiError {
    ApiError::validation(
        "no acknowledged rail submission of this payout has this submissionId and railReference",
        vec![
            FieldError::new("submissionId", "names no acknowledged submission of this payout"),
            FieldError::new("railReference", "does not match the acknowledged submission"),
        ],
    )
}

/// The envelope of a claim its payout refused (P2's, and a batch item's body): not
/// claimable, or not found. Any other outcome is no refusal of its payout.
fn claim_refusal(payout_id: Uuid, o: &ClaimOutcome) -> ApiError {
    match o {
        ClaimOutcome::NotClaimable { state } => not_claimable(payout_id, *state, CLAIM_NOT_CLAIMABLE),
        ClaimOutcome::NotFound => not_found("payout"),
        ClaimOutcome::Fenced { .. } | ClaimOutcome::Claimed { .. } | ClaimOutcome::InsufficientFunds { .. } => {
            ApiError::internal("committed outcome without a recorded response")
        }
    }
}

/// The envelope of a post its payout refused (P3's, and a batch item's body).
fn post_refusal(payout_id: Uuid, o: &PostOutcome) -> ApiError {
    match o {
        PostOutcome::NotClaimable { state } => not_claimable(payout_id, *state, POST_NOT_CLAIMABLE),
        PostOutcome::RailMismatch => rail_mismatch(),
        PostOutcome::NotFound => not_found("payout"),
        PostOutcome::Fenced { .. } | PostOutcome::Posted { .. } => {
            ApiError::internal("committed outcome without a recorded response")
        }
    }
}

/// The counter and log line of one claim outcome, as P2 emits them (a committed outcome's
/// after its commit); a batch emits them per payout. `Fenced` counts here; its log line
/// and `lock_fenced_out_total` are the fence refusal's ([`fenced_out`]).
fn note_claim(pr: &PaymentResource, trace: &TraceId, payout_id: Uuid, token: i64, owner: &str, o: &ClaimOutcome) {
    match o {
        ClaimOutcome::Claimed { account_id, reclaimed, .. } => {
            pr.metrics.claim(if *reclaimed { "reclaimed" } else { "claimed" });
            tracing::info!(payoutId = %payout_id, accountId = %account_id, presentedToken = token,
                ownerId = owner, reclaimed = *reclaimed, traceId = %trace.0, "payout_claimed");
        }
        ClaimOutcome::InsufficientFunds { account_id, amount_minor, available_minor } => {
            pr.metrics.claim("insufficient_funds");
            tracing::warn!(payoutId = %payout_id, accountId = %account_id, amountMinor = *amount_minor,
                availableMinor = *available_minor, ownerId = owner, traceId = %trace.0,
                "payout_failed_insufficient_funds");
        }
        ClaimOutcome::Fenced { .. } => pr.metrics.claim("fenced"),
        ClaimOutcome::NotClaimable { .. } => pr.metrics.claim("not_claimable"),
        ClaimOutcome::NotFound => {}
    }
}

/// The counter and log line of one post outcome, as P3 emits them; a batch emits them per
/// payout.
fn note_post(pr: &PaymentResource, trace: &TraceId, payout_id: Uuid, token: i64, owner: &str, o: &PostOutcome) {
    match o {
        PostOutcome::Posted { account_id, balance_minor, .. } => {
            pr.metrics.post("posted");
            tracing::info!(payoutId = %payout_id, accountId = %account_id, presentedToken = token,
                ownerId = owner, balanceMinor = *balance_minor, traceId = %trace.0, "payout_posted");
        }
        PostOutcome::Fenced { .. } => pr.metrics.post("fenced"),
        PostOutcome::NotClaimable { .. } => pr.metrics.post("not_claimable"),
        PostOutcome::RailMismatch => pr.metrics.post("rail_mismatch"),
        PostOutcome::NotFound => {}
    }
}

fn not_claimable(payout_id: Uuid, state: PayoutState, message: &str) -> ApiError {
    ApiError::new(ErrorCode::PayoutNotClaimable, message).with_details(json!({ "payoutId": payout_id, "state": state }))
}

fn not_found(what: &str) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("no such {what}"))
}

fn account_body(a: &AccountView) -> AccountBody {
    AccountBody {
        account_id: a.account_id.clone(),
        currency: a.currency.clone(),
        balance_minor: a.balance_minor,
        fence: a.fence,
        ledger_sum_minor: a.ledger_sum_minor,
        available_minor: a.balance_minor - a.reserved_minor,
        created_at: a.created_at,
        updated_at: a.updated_at,
    }
}

fn payout_body(p: &PayoutView) -> PayoutBody {
    PayoutBody {
        payout_id: p.payout_id,
        account_id: p.account_id.clone(),
        amount_minor: p.amount_minor,
        currency: p.currency.clone(),
        beneficiary_ref: p.beneficiary_ref.clone(),
        state: p.state,
        attempt_count: p.attempt_count,
        claim_token: p.claim_token,
        claimed_by: p.claimed_by.clone(),
        claimed_at: p.claimed_at,
        created_at: p.created_at,
        updated_at: p.updated_at,
        submissions: p
            .submissions
            .iter()
            .map(|s| SubmissionBody {
                submission_id: s.submission_id,
                presented_token: s.presented_token,
                outcome: s.outcome,
                rail_reference: s.rail_reference.clone(),
                submitted_at: s.submitted_at,
                resolved_at: s.resolved_at,
            })
            .collect(),
    }
}

// ---------------------------------------------------------------------------------------
// Creates
// ---------------------------------------------------------------------------------------

/// Create an account (operator), with its opening balance posted to the ledger.
#[utoipa::path(post, path = "/v1/accounts", tag = "accounts",
    params(dlock_http::openapi::OwnerHeader, dlock_http::openapi::IdempotencyKeyHeader),
    request_body(content = dlock_contract::payment::NewAccountRequest, content_type = "application/json"),
    responses((status = 201, description = "Created (or the recorded answer to this idempotency key).", body = AccountBody)))]
async fn create_account(
    State(pr): State<Arc<PaymentResource>>,
    Extension(trace): Extension<TraceId>,
    headers: HeaderMap,
    body: Result<JsonBody, ApiError>,
) -> Result<Response, ApiError> {
    let owner = dlock_http::owner_id(&headers)?;
    let key = dlock_http::idempotency_key(&headers)?;
    let JsonBody(raw) = body?;
    let req = NewAccountRequest::from_json(&raw)
        .map_err(|fields| ApiError::validation("the account body is invalid", fields))?;
    let at = pr.now();
    let idem = pr
        .identity(Operation::CreateAccount, TARGET_ACCOUNTS, key.as_str(), 0, owner.as_str(), &req, at)
        .map_err(identity_error)?;
    let a = NewAccount {
        account_id: req.account_id.clone(),
        currency: req.currency.clone(),
        opening_balance_minor: req.opening_balance_minor,
        posting_id: dlock_rt::rand::uuid_v4(),
        entry_ids: [dlock_rt::rand::uuid_v4(), dlock_rt::rand::uuid_v4()],
        at,
    };
    let trace_id = trace.0.clone();
    let render = move |o: &CreateAccountOutcome| match o {
        CreateAccountOutcome::Created(view) => recorded(201, &account_body(view)),
        CreateAccountOutcome::Exists => recorded_error(ApiError::internal("not a committed outcome"), &trace_id),
    };
    let decided = pr.write(move |store| async move { store.create_account(&a, &idem, &render).await }).await;
    Ok(answer(
        &pr,
        decided,
        (Operation::CreateAccount, TARGET_ACCOUNTS, owner.as_str()),
        |o| {
            if let CreateAccountOutcome::Created(v) = o {
                tracing::info!(accountId = %v.account_id, currency = %v.currency, openingBalanceMinor = v.balance_minor,
                    ownerId = owner.as_str(), traceId = %trace.0, "account_created");
            }
        },
        |_| {
            ApiError::validation(
                "an account with this accountId already exists",
                vec![FieldError::new("accountId", "already exists")],
            )
        },
    ))
}

/// Create a payout (operator) in state `PENDING`.
#[utoipa::path(post, path = "/v1/payouts", tag = "payouts",
    params(dlock_http::openapi::OwnerHeader, dlock_http::openapi::IdempotencyKeyHeader),
    request_body(content = dlock_contract::payment::NewPayoutRequest, content_type = "application/json"),
    responses((status = 201, description = "Created (or the recorded answer to this idempotency key).", body = PayoutBody)))]
async fn create_payout(
    State(pr): State<Arc<PaymentResource>>,
    Extension(trace): Extension<TraceId>,
    headers: HeaderMap,
    body: Result<JsonBody, ApiError>,
) -> Result<Response, ApiError> {
    let owner = dlock_http::owner_id(&headers)?;
    let key = dlock_http::idempotency_key(&headers)?;
    let JsonBody(raw) = body?;
    let req = NewPayoutRequest::from_json(&raw)
        .map_err(|fields| ApiError::validation("the payout body is invalid", fields))?;
    let at = pr.now();
    // The fingerprint covers the request as sent: an absent payoutId fingerprints as null,
    // not as the id generated below, so a retry of it replays the first answer.
    let idem = pr
        .identity(Operation::CreatePayout, TARGET_PAYOUTS, key.as_str(), 0, owner.as_str(), &req, at)
        .map_err(identity_error)?;
    let p = NewPayout {
        payout_id: req.payout_id.unwrap_or_else(dlock_rt::rand::uuid_v4),
        account_id: req.account_id.clone(),
        amount_minor: req.amount_minor,
        currency: req.currency.clone(),
        beneficiary_ref: req.beneficiary_ref.clone(),
        at,
    };
    let trace_id = trace.0.clone();
    let render = move |o: &CreatePayoutOutcome| match o {
        CreatePayoutOutcome::Created(view) => recorded(201, &payout_body(view)),
        _ => recorded_error(ApiError::internal("not a committed outcome"), &trace_id),
    };
    let decided = pr.write(move |store| async move { store.create_payout(&p, &idem, &render).await }).await;
    Ok(answer(
        &pr,
        decided,
        (Operation::CreatePayout, TARGET_PAYOUTS, owner.as_str()),
        |o| {
            if let CreatePayoutOutcome::Created(v) = o {
                tracing::info!(payoutId = %v.payout_id, accountId = %v.account_id, amountMinor = v.amount_minor,
                    ownerId = owner.as_str(), traceId = %trace.0, "payout_created");
            }
        },
        |o| match o {
            CreatePayoutOutcome::PayoutExists => ApiError::validation(
                "a payout with this payoutId already exists",
                vec![FieldError::new("payoutId", "already exists")],
            ),
            CreatePayoutOutcome::UnknownAccount => ApiError::validation(
                "no account has this accountId",
                vec![FieldError::new("accountId", "names no account")],
            ),
            CreatePayoutOutcome::CurrencyMismatch { account_currency } => ApiError::validation(
                format!("the account holds {account_currency}; a payout must be in its account's currency"),
                vec![FieldError::new("currency", "is not the account's currency")],
            ),
            CreatePayoutOutcome::Created(_) => ApiError::internal("created outcome without a recorded response"),
        },
    ))
}

// ---------------------------------------------------------------------------------------
// P2, P3
// ---------------------------------------------------------------------------------------

/// The recorded answer of a committed claim: 200 `ClaimAck`, or the 422
/// `INSUFFICIENT_FUNDS` envelope (under the first request's trace id).
pub fn render_claim(o: &ClaimOutcome, payout_id: Uuid, token: i64, key: &str, trace_id: &str) -> StoredResponse {
    match o {
        ClaimOutcome::Claimed {
            account_id,
            account_fence,
            attempt_count,
            amount_minor,
            currency,
            beneficiary_ref,
            ..
        } => recorded(
            200,
            &ClaimAck {
                payout_id,
                state: PayoutState::Claimed,
                claim_token: token,
                account_fence: *account_fence,
                attempt_count: *attempt_count,
                idempotency_key: key.to_owned(),
                account_id: Some(account_id.clone()),
                amount_minor: Some(*amount_minor),
                currency: Some(currency.clone()),
                beneficiary_ref: Some(beneficiary_ref.clone()),
            },
        ),
        ClaimOutcome::InsufficientFunds { account_id, amount_minor, available_minor } => {
            let message = "the account's available balance does not cover this payout; it is FAILED and will never \
                           reach the rail";
            let err = ApiError::new(ErrorCode::InsufficientFunds, message).with_details(json!({
                "payoutId": payout_id,
                "accountId": account_id,
                "amountMinor": amount_minor,
                "availableMinor": available_minor,
                "state": PayoutState::Failed,
            }));
            recorded_error(err, trace_id)
        }
        _ => recorded_error(ApiError::internal("not a committed outcome"), trace_id),
    }
}

/// The recorded answer of a committed post: 200 `PostAck`.
pub fn render_post(o: &PostOutcome, payout_id: Uuid, trace_id: &str) -> StoredResponse {
    match o {
        PostOutcome::Posted { entries, balance_minor, .. } => recorded(
            200,
            &PostAck {
                payout_id,
                state: PayoutState::Posted,
                entries: entries
                    .iter()
                    .map(|e| EntryBody {
                        entry_id: e.entry_id,
                        account_id: e.account_id.clone(),
                        direction: e.direction.as_str().to_owned(),
                        amount_minor: e.amount_minor,
                        fence: e.fence,
                    })
                    .collect(),
                balance_minor: *balance_minor,
            },
        ),
        _ => recorded_error(ApiError::internal("not a committed outcome"), trace_id),
    }
}

/// Claim a payout (P2, worker): a fenced write under the caller's lock token.
#[utoipa::path(post, path = "/v1/payouts/{payoutId}/claim", tag = "payouts",
    params(crate::openapi::PayoutPath, dlock_http::openapi::FencingTokenHeader, dlock_http::openapi::FencingSignatureHeader, dlock_http::openapi::OwnerHeader, dlock_http::openapi::IdempotencyKeyHeader),
    request_body(content = dlock_contract::payment::ClaimRequest, content_type = "application/json"),
    responses((status = 200, description = "Claimed (or the recorded answer to this idempotency key).", body = ClaimAck)))]
async fn claim(
    State(pr): State<Arc<PaymentResource>>,
    Extension(trace): Extension<TraceId>,
    headers: HeaderMap,
    Path(raw_id): Path<String>,
    body: Result<JsonBody, ApiError>,
) -> Result<Response, ApiError> {
    let token = dlock_http::fencing_token(&headers)?.get();
    let signature = dlock_http::fencing_signature(&headers)?;
    let owner = dlock_http::owner_id(&headers)?;
    let key = dlock_http::idempotency_key(&headers)?;
    let payout_id = path_uuid(&raw_id, "payoutId")?;
    let JsonBody(raw) = body?;
    let req =
        ClaimRequest::from_json(&raw).map_err(|fields| ApiError::validation("the claim body is invalid", fields))?;
    verify_grant(&pr, payout_id, signature.as_deref(), token, owner.as_str()).await?;
    let at = pr.now();
    let target = payout_id.to_string();
    let idem = pr
        .identity(Operation::Claim, &target, key.as_str(), token, owner.as_str(), &req, at)
        .map_err(identity_error)?;
    let c = Claim { payout_id, token, owner_id: owner.as_str().to_owned(), expected: req.expected_state, at };
    let trace_id = trace.0.clone();
    let key_text = key.as_str().to_owned();
    let render = move |o: &ClaimOutcome| render_claim(o, payout_id, token, &key_text, &trace_id);
    let decided = pr.write(move |store| async move { store.claim(&c, &idem, &render).await }).await;
    let owner_text = owner.as_str();
    trace_fenced_write(
        "claim",
        dlock_rt::defence::Layer::ClaimFence,
        payout_id,
        token,
        owner_text,
        &decided,
        |o| match o {
            ClaimOutcome::Claimed { account_id, .. } | ClaimOutcome::InsufficientFunds { account_id, .. } => {
                Some(account_id.as_str())
            }
            _ => None,
        },
        |o| match o {
            ClaimOutcome::Fenced { account_id, highest_token } => Some((account_id.as_str(), *highest_token)),
            _ => None,
        },
    );
    Ok(answer(
        &pr,
        decided,
        (Operation::Claim, &target, owner_text),
        |o| note_claim(&pr, &trace, payout_id, token, owner_text, o),
        |o| match o {
            ClaimOutcome::Fenced { ref account_id, highest_token } => {
                dlock_rt::probe::hit(dlock_rt::probe::Probe::FencedOutAccount);
                note_claim(&pr, &trace, payout_id, token, owner_text, &o);
                fenced_out(&pr, RESOURCE_ACCOUNT, account_id, token, highest_token, owner_text, Some(payout_id), &trace)
            }
            ClaimOutcome::Claimed { .. } | ClaimOutcome::InsufficientFunds { .. } => {
                ApiError::internal("committed outcome without a recorded response")
            }
            refused => {
                note_claim(&pr, &trace, payout_id, token, owner_text, &refused);
                claim_refusal(payout_id, &refused)
            }
        },
    ))
}

/// Post an acknowledged payout to the ledger (P3, worker): a fenced write.
#[utoipa::path(post, path = "/v1/payouts/{payoutId}/post", tag = "payouts",
    params(crate::openapi::PayoutPath, dlock_http::openapi::FencingTokenHeader, dlock_http::openapi::FencingSignatureHeader, dlock_http::openapi::OwnerHeader, dlock_http::openapi::IdempotencyKeyHeader),
    request_body(content = dlock_contract::payment::PostRequest, content_type = "application/json"),
    responses((status = 200, description = "Posted (or the recorded answer to this idempotency key).", body = PostAck)))]
async fn post_payout(
    State(pr): State<Arc<PaymentResource>>,
    Extension(trace): Extension<TraceId>,
    headers: HeaderMap,
    Path(raw_id): Path<String>,
    body: Result<JsonBody, ApiError>,
) -> Result<Response, ApiError> {
    let token = dlock_http::fencing_token(&headers)?.get();
    let signature = dlock_http::fencing_signature(&headers)?;
    let owner = dlock_http::owner_id(&headers)?;
    let key = dlock_http::idempotency_key(&headers)?;
    let payout_id = path_uuid(&raw_id, "payoutId")?;
    let JsonBody(raw) = body?;
    let req =
        PostRequest::from_json(&raw).map_err(|fields| ApiError::validation("the post body is invalid", fields))?;
    verify_grant(&pr, payout_id, signature.as_deref(), token, owner.as_str()).await?;
    let at = pr.now();
    let target = payout_id.to_string();
    let idem =
        pr.identity(Operation::Post, &target, key.as_str(), token, owner.as_str(), &req, at).map_err(identity_error)?;
    let p = Post {
        payout_id,
        token,
        owner_id: owner.as_str().to_owned(),
        submission_id: req.submission_id,
        rail_reference: req.rail_reference.clone(),
        posting_id: dlock_rt::rand::uuid_v4(),
        entry_ids: [dlock_rt::rand::uuid_v4(), dlock_rt::rand::uuid_v4()],
        at,
    };
    let trace_id = trace.0.clone();
    let render = move |o: &PostOutcome| render_post(o, payout_id, &trace_id);
    let decided = pr.write(move |store| async move { store.post(&p, &idem, &render).await }).await;
    let owner_text = owner.as_str();
    trace_fenced_write(
        "post",
        dlock_rt::defence::Layer::PostFence,
        payout_id,
        token,
        owner_text,
        &decided,
        |o| match o {
            PostOutcome::Posted { account_id, .. } => Some(account_id.as_str()),
            _ => None,
        },
        |o| match o {
            PostOutcome::Fenced { account_id, highest_token } => Some((account_id.as_str(), *highest_token)),
            _ => None,
        },
    );
    Ok(answer(
        &pr,
        decided,
        (Operation::Post, &target, owner_text),
        |o| note_post(&pr, &trace, payout_id, token, owner_text, o),
        |o| match o {
            PostOutcome::Fenced { highest_token, .. } => {
                dlock_rt::probe::hit(dlock_rt::probe::Probe::FencedOutLedger);
                note_post(&pr, &trace, payout_id, token, owner_text, &o);
                fenced_out(&pr, RESOURCE_LEDGER, &target, token, highest_token, owner_text, Some(payout_id), &trace)
            }
            PostOutcome::Posted { .. } => ApiError::internal("committed outcome without a recorded response"),
            refused => {
                note_post(&pr, &trace, payout_id, token, owner_text, &refused);
                post_refusal(payout_id, &refused)
            }
        },
    ))
}

// ---------------------------------------------------------------------------------------
// P2b, P3b: batches (C3-extensions E-19)
// ---------------------------------------------------------------------------------------

/// One item of a batch's `200` as it goes on the wire: its body is the single write's
/// answer, byte for byte ([`BatchAnswer`]'s shape: `payoutId`, `status`, `body`).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct BatchItemBytes {
    payout_id: Uuid,
    status: u16,
    body: Box<serde_json::value::RawValue>,
}

/// A batch's `200` as it goes on the wire ([`BatchAnswer`]'s shape).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct BatchAnswerBytes<'a> {
    account_id: &'a str,
    presented_token: i64,
    items: Vec<BatchItemBytes>,
}

/// The `200` of a batch: one item per payout, each the single write's answer (`answers`,
/// in the request's order), its bytes kept as they are.
fn batch_answer(
    account_id: &str,
    token: i64,
    answers: impl Iterator<Item = (Uuid, StoredResponse)>,
    trace_id: &str,
) -> StoredResponse {
    let mut items = Vec::new();
    for (payout_id, r) in answers {
        let body = String::from_utf8(r.body)
            .map_err(|e| e.to_string())
            .and_then(|text| serde_json::value::RawValue::from_string(text).map_err(|e| e.to_string()));
        match body {
            Ok(body) => items.push(BatchItemBytes { payout_id, status: r.status, body }),
            Err(e) => return recorded_error(ApiError::internal(format!("a batch item is not JSON: {e}")), trace_id),
        }
    }
    recorded(200, &BatchAnswerBytes { account_id, presented_token: token, items })
}

/// The answer of a decided batch claim (recorded when it committed): per payout, P2's
/// answer under this token ([`render_claim`], or its refusal's envelope under the batch's
/// trace id). The `ClaimAck`'s `idempotencyKey` is the batch's key: the claim is recorded
/// under the batch's identity.
pub fn render_claim_batch(
    o: &ClaimBatchOutcome,
    account_id: &str,
    token: i64,
    key: &str,
    trace_id: &str,
) -> StoredResponse {
    let ClaimBatchOutcome::Decided { items } = o else {
        return recorded_error(ApiError::internal("not a decided batch"), trace_id);
    };
    let answers = items.iter().map(|(payout_id, item)| {
        let r = match item {
            ClaimOutcome::Claimed { .. } | ClaimOutcome::InsufficientFunds { .. } => {
                render_claim(item, *payout_id, token, key, trace_id)
            }
            refused => recorded_error(claim_refusal(*payout_id, refused), trace_id),
        };
        (*payout_id, r)
    });
    batch_answer(account_id, token, answers, trace_id)
}

/// The answer of a decided batch post: per payout, P3's answer under this token
/// ([`render_post`], or its refusal's envelope under the batch's trace id).
pub fn render_post_batch(o: &PostBatchOutcome, account_id: &str, token: i64, trace_id: &str) -> StoredResponse {
    let PostBatchOutcome::Decided { items } = o else {
        return recorded_error(ApiError::internal("not a decided batch"), trace_id);
    };
    let answers = items.iter().map(|(payout_id, item)| {
        let r = match item {
            PostOutcome::Posted { .. } => render_post(item, *payout_id, trace_id),
            refused => recorded_error(post_refusal(*payout_id, refused), trace_id),
        };
        (*payout_id, r)
    });
    batch_answer(account_id, token, answers, trace_id)
}

/// The `fenced_write` event of each payout of a batch (`op`, guarded by `layer`), when a
/// sink listens, as its single write would emit it: `accepted` for a payout the batch
/// moved, `fenced_out` for each payout of a fenced batch, `no_decision` for the rest.
#[allow(clippy::too_many_arguments)]
fn trace_batch_writes<T: BatchItemOutcome>(
    op: &'static str,
    layer: dlock_rt::defence::Layer,
    account_id: &str,
    payout_ids: &[Uuid],
    token: i64,
    owner: &str,
    decided: &Decided<BatchOutcome<T>>,
) {
    if !dlock_rt::events::enabled() {
        return;
    }
    for payout_id in payout_ids {
        let (answer, stored_token, account, replay) = match decided {
            Ok(Idempotent::Executed { outcome, .. }) if outcome.moved_payout(*payout_id) => {
                ("accepted", Some(token), Some(account_id), false)
            }
            Ok(Idempotent::Executed { outcome, .. }) => match outcome.fenced_by() {
                Some(highest) => ("fenced_out", Some(highest), Some(account_id), false),
                None => ("no_decision", None, None, false),
            },
            Ok(Idempotent::Replayed(_)) => ("no_decision", None, None, true),
            _ => ("no_decision", None, None, false),
        };
        emit_fenced_write(FenceSeen {
            op,
            payout_id: *payout_id,
            token,
            owner,
            account,
            answer,
            stored_token,
            replay,
            fenced: !dlock_rt::defence::off(layer),
        });
    }
}

/// A batch's (P2b, P3b) fenced-write headers and its path's account, checked in P2's order
/// (token, signature, owner, key, then the path): (token, signature, owner, key).
fn batch_headers(
    headers: &HeaderMap,
    account_id: &str,
) -> Result<(i64, Option<String>, dlock_contract::OwnerId, dlock_contract::IdempotencyKey), ApiError> {
    let token = dlock_http::fencing_token(headers)?.get();
    let signature = dlock_http::fencing_signature(headers)?;
    let owner = dlock_http::owner_id(headers)?;
    let key = dlock_http::idempotency_key(headers)?;
    path_account_id(account_id)?;
    Ok((token, signature, owner, key))
}

/// What differs between P2b and P3b once the store has decided: the single write's name,
/// fence layer, operation, per-payout logging and counting, the item a fenced batch gives
/// each payout, and the fenced-out resource and probe.
struct BatchKind<T> {
    op: &'static str,
    layer: dlock_rt::defence::Layer,
    operation: Operation,
    note: fn(&PaymentResource, &TraceId, Uuid, i64, &str, &T),
    fenced_item: fn(String, i64) -> T,
    resource: usize,
    probe: dlock_rt::probe::Probe,
}

const CLAIMS: BatchKind<ClaimOutcome> = BatchKind {
    op: "claim",
    layer: dlock_rt::defence::Layer::ClaimFence,
    operation: Operation::Claim,
    note: note_claim,
    fenced_item: |account_id, highest_token| ClaimOutcome::Fenced { account_id, highest_token },
    resource: RESOURCE_ACCOUNT,
    probe: dlock_rt::probe::Probe::FencedOutAccount,
};

const POSTS: BatchKind<PostOutcome> = BatchKind {
    op: "post",
    layer: dlock_rt::defence::Layer::PostFence,
    operation: Operation::Post,
    note: note_post,
    fenced_item: |account_id, highest_token| PostOutcome::Fenced { account_id, highest_token },
    resource: RESOURCE_LEDGER,
    probe: dlock_rt::probe::Probe::FencedOutLedger,
};

/// One batch request, as its answer needs it.
struct BatchDone<'a> {
    account_id: &'a str,
    payout_ids: &'a [Uuid],
    token: i64,
    owner: &'a str,
    target: &'a str,
}

/// The answer of a decided batch (P2b, P3b): each payout's `fenced_write` event, log line
/// and count as its single write's; a committed or replayed batch's recorded bytes; a batch
/// where nothing moved rendered now (`render`, not recorded); a fenced batch one
/// `FENCED_OUT` for the account; an unknown account 404.
fn answer_batch<T: BatchItemOutcome>(
    pr: &PaymentResource,
    trace: &TraceId,
    kind: &BatchKind<T>,
    d: BatchDone<'_>,
    decided: Decided<BatchOutcome<T>>,
    render: impl FnOnce(&BatchOutcome<T>) -> StoredResponse,
) -> Response {
    trace_batch_writes(kind.op, kind.layer, d.account_id, d.payout_ids, d.token, d.owner, &decided);
    let note_items = |o: &BatchOutcome<T>| {
        for (payout_id, item) in o.items() {
            (kind.note)(pr, trace, *payout_id, d.token, d.owner, item);
        }
    };
    answer(pr, decided, (kind.operation, d.target, d.owner), note_items, |o| match o {
        BatchOutcome::Decided { .. } => {
            // Nothing moved: the answer is not recorded, and is judged afresh next time.
            note_items(&o);
            let r = render(&o);
            dlock_http::prerendered(r.status, r.body)
        }
        BatchOutcome::Fenced { highest_token } => {
            dlock_rt::probe::hit(kind.probe);
            for payout_id in d.payout_ids {
                let item = (kind.fenced_item)(d.account_id.to_owned(), highest_token);
                (kind.note)(pr, trace, *payout_id, d.token, d.owner, &item);
            }
            fenced_out(pr, kind.resource, d.account_id, d.token, highest_token, d.owner, None, trace).into_response()
        }
        BatchOutcome::AccountNotFound => not_found("account").into_response(),
    })
}

/// Claim several payouts of one account (P2b, worker, C3-extensions E-19): one fenced write
/// that passes the account's fence once, under one grant.
#[utoipa::path(post, path = "/v1/accounts/{accountId}/claims", tag = "payouts",
    params(crate::openapi::AccountPath, dlock_http::openapi::FencingTokenHeader, dlock_http::openapi::FencingSignatureHeader, dlock_http::openapi::OwnerHeader, dlock_http::openapi::IdempotencyKeyHeader),
    request_body(content = dlock_contract::payment::ClaimBatchRequest, content_type = "application/json"),
    responses((status = 200, description = "Each payout's P2 answer under this token, in the request's order (or the recorded answer to this idempotency key).", body = BatchAnswer)))]
async fn claim_batch(
    State(pr): State<Arc<PaymentResource>>,
    Extension(trace): Extension<TraceId>,
    headers: HeaderMap,
    Path(account_id): Path<String>,
    body: Result<JsonBody, ApiError>,
) -> Result<Response, ApiError> {
    let (token, signature, owner, key) = batch_headers(&headers, &account_id)?;
    let JsonBody(raw) = body?;
    let req = ClaimBatchRequest::from_json(&raw)
        .map_err(|fields| ApiError::validation("the claim batch body is invalid", fields))?;
    verify_account_grant(&pr, &account_id, signature.as_deref(), token, owner.as_str())?;
    let at = pr.now();
    let target = batch_target(&account_id);
    let idem = pr
        .identity(Operation::Claim, &target, key.as_str(), token, owner.as_str(), &req, at)
        .map_err(identity_error)?;
    let payouts: Vec<ClaimBatchPayout> =
        req.payouts.iter().map(|p| ClaimBatchPayout { payout_id: p.payout_id, expected: p.expected_state }).collect();
    let payout_ids: Vec<Uuid> = payouts.iter().map(|p| p.payout_id).collect();
    let b = ClaimBatch { account_id: account_id.clone(), token, owner_id: owner.as_str().to_owned(), payouts, at };
    let (trace_id, key_text, account) = (trace.0.clone(), key.as_str().to_owned(), account_id.clone());
    let render = move |o: &ClaimBatchOutcome| render_claim_batch(o, &account, token, &key_text, &trace_id);
    let decided = pr.write(move |store| async move { store.claim_batch(&b, &idem, &render).await }).await;
    let done =
        BatchDone { account_id: &account_id, payout_ids: &payout_ids, token, owner: owner.as_str(), target: &target };
    Ok(answer_batch(&pr, &trace, &CLAIMS, done, decided, |o| {
        render_claim_batch(o, &account_id, token, key.as_str(), &trace.0)
    }))
}

/// Post several acknowledged payouts of one account to the ledger (P3b, worker,
/// C3-extensions E-19): one fenced write that passes the account's fence once.
#[utoipa::path(post, path = "/v1/accounts/{accountId}/posts", tag = "payouts",
    params(crate::openapi::AccountPath, dlock_http::openapi::FencingTokenHeader, dlock_http::openapi::FencingSignatureHeader, dlock_http::openapi::OwnerHeader, dlock_http::openapi::IdempotencyKeyHeader),
    request_body(content = dlock_contract::payment::PostBatchRequest, content_type = "application/json"),
    responses((status = 200, description = "Each payout's P3 answer under this token, in the request's order (or the recorded answer to this idempotency key).", body = BatchAnswer)))]
async fn post_batch(
    State(pr): State<Arc<PaymentResource>>,
    Extension(trace): Extension<TraceId>,
    headers: HeaderMap,
    Path(account_id): Path<String>,
    body: Result<JsonBody, ApiError>,
) -> Result<Response, ApiError> {
    let (token, signature, owner, key) = batch_headers(&headers, &account_id)?;
    let JsonBody(raw) = body?;
    let req = PostBatchRequest::from_json(&raw)
        .map_err(|fields| ApiError::validation("the post batch body is invalid", fields))?;
    verify_account_grant(&pr, &account_id, signature.as_deref(), token, owner.as_str())?;
    let at = pr.now();
    let target = batch_target(&account_id);
    let idem =
        pr.identity(Operation::Post, &target, key.as_str(), token, owner.as_str(), &req, at).map_err(identity_error)?;
    let payouts: Vec<PostBatchPayout> = req
        .payouts
        .iter()
        .map(|p| PostBatchPayout {
            payout_id: p.payout_id,
            submission_id: p.submission_id,
            rail_reference: p.rail_reference.clone(),
            posting_id: dlock_rt::rand::uuid_v4(),
            entry_ids: [dlock_rt::rand::uuid_v4(), dlock_rt::rand::uuid_v4()],
        })
        .collect();
    let payout_ids: Vec<Uuid> = payouts.iter().map(|p| p.payout_id).collect();
    let b = PostBatch { account_id: account_id.clone(), token, owner_id: owner.as_str().to_owned(), payouts, at };
    let (trace_id, account) = (trace.0.clone(), account_id.clone());
    let render = move |o: &PostBatchOutcome| render_post_batch(o, &account, token, &trace_id);
    let decided = pr.write(move |store| async move { store.post_batch(&b, &idem, &render).await }).await;
    let done =
        BatchDone { account_id: &account_id, payout_ids: &payout_ids, token, owner: owner.as_str(), target: &target };
    Ok(answer_batch(&pr, &trace, &POSTS, done, decided, |o| render_post_batch(o, &account_id, token, &trace.0)))
}

// ---------------------------------------------------------------------------------------
// Reads: P1, P4, P5
// ---------------------------------------------------------------------------------------

/// Read a payout and its rail submissions (P4). Advisory.
#[utoipa::path(get, path = "/v1/payouts/{payoutId}", tag = "payouts", params(crate::openapi::PayoutPath),
    responses((status = 200, description = "The payout.", body = PayoutBody)))]
async fn get_payout(State(pr): State<Arc<PaymentResource>>, Path(raw_id): Path<String>) -> Result<Response, ApiError> {
    let payout_id = path_uuid(&raw_id, "payoutId")?;
    match pr.store.payout(payout_id).await.map_err(store_error)? {
        Some(p) => Ok(dlock_http::json(StatusCode::OK, &payout_body(&p))),
        None => Err(not_found("payout")),
    }
}

/// Read an account (P5): balance, fence and the ledger's sum. Advisory.
#[utoipa::path(get, path = "/v1/accounts/{accountId}", tag = "accounts", params(crate::openapi::AccountPath),
    responses((status = 200, description = "The account.", body = AccountBody)))]
async fn get_account(
    State(pr): State<Arc<PaymentResource>>,
    Path(account_id): Path<String>,
) -> Result<Response, ApiError> {
    path_account_id(&account_id)?;
    match pr.store.account(&account_id).await.map_err(store_error)? {
        Some(a) => Ok(dlock_http::json(StatusCode::OK, &account_body(&a))),
        None => Err(not_found("account")),
    }
}

/// A validated P1 query.
struct PageQuery {
    state: PayoutState,
    account_id: Option<String>,
    limit: u32,
    cursor: Option<CursorPayload>,
}

fn page_query(pr: &PaymentResource, pairs: Vec<(String, String)>) -> Result<PageQuery, ApiError> {
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut problems = Vec::new();
    for (name, value) in pairs {
        if !matches!(name.as_str(), "state" | "accountId" | "limit" | "cursor") {
            problems
                .push(FieldError::new(name, "is not a parameter of this listing (state, accountId, limit, cursor)"));
            continue;
        }
        match seen.entry(name) {
            std::collections::btree_map::Entry::Occupied(e) => {
                problems.push(FieldError::new(e.key().clone(), "is given more than once"));
            }
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(value);
            }
        }
    }
    let state = match seen.get("state").map(String::as_str) {
        None => {
            problems.push(FieldError::new("state", "is required"));
            None
        }
        Some(raw) => {
            let s = PayoutState::parse(raw);
            if s.is_none() {
                problems.push(FieldError::new("state", "must be one of the eight payout states"));
            }
            s
        }
    };
    let account_id = seen.get("accountId").cloned();
    if account_id.as_deref().is_some_and(|a| !dlock_contract::rail::is_account_id(a)) {
        problems.push(FieldError::new("accountId", "must be 1 to 64 characters of [a-zA-Z0-9:._-]"));
    }
    let limit = match seen.get("limit") {
        None => P1_LIMIT_DEFAULT,
        Some(raw) => match raw.parse::<u32>() {
            Ok(n) if (1..=P1_LIMIT_MAX).contains(&n) => n,
            _ => {
                problems.push(FieldError::new("limit", format!("must be an integer 1..={P1_LIMIT_MAX}")));
                P1_LIMIT_DEFAULT
            }
        },
    };
    if !problems.is_empty() {
        return Err(ApiError::validation("the listing query is invalid", problems));
    }
    let Some(state) = state else {
        return Err(ApiError::validation(
            "the listing query is invalid",
            vec![FieldError::new("state", "is required")],
        ));
    };
    let cursor = match seen.get("cursor") {
        None => None,
        Some(raw) if raw.len() > CURSOR_CHARS_MAX => {
            return Err(ApiError::validation(
                "the cursor is not one this service issued",
                vec![FieldError::new("cursor", "is not a cursor this service issued")],
            ))
        }
        Some(raw) => match pr.cursor.decode(raw, state, account_id.as_deref()) {
            Ok(c) => Some(c),
            Err(e) => {
                return Err(ApiError::validation(
                    format!("the cursor {}", e.problem()),
                    vec![FieldError::new("cursor", e.problem())],
                ))
            }
        },
    };
    Ok(PageQuery { state, account_id, limit, cursor })
}

/// Most rows stamped ahead of the listing clock that a walk's first page reads
/// ([`rows_ahead`]); a walk lists rows ahead beyond this many only once a first page
/// reaches them.
pub const P1_AHEAD_ROWS_MAX: i64 = 500;

/// The first page's rows of `q`'s filter stamped after `now`, its millisecond (a clock ahead
/// of this one stamped them), oldest first, at most [`P1_AHEAD_ROWS_MAX`]: one index range,
/// empty while the replicas' clocks agree.
async fn rows_ahead(
    pr: &PaymentResource,
    q: &PageQuery,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<crate::store::PayoutSummary>, ApiError> {
    pr.store
        .list(&ListQuery {
            state: q.state,
            account_id: q.account_id.clone(),
            snapshot: crate::store::snapshot_after_everything(),
            created_after: Some(now),
            after: None,
            limit: P1_AHEAD_ROWS_MAX,
        })
        .await
        .map_err(store_error)
}

/// List payouts in one state (P1), oldest first, in pages over one snapshot.
#[utoipa::path(get, path = "/v1/payouts", tag = "payouts", params(crate::openapi::ListQuery),
    responses((status = 200, description = "One page.", body = PayoutPage)))]
async fn list_payouts(
    State(pr): State<Arc<PaymentResource>>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(pairs) = query.map_err(|_| {
        ApiError::validation(
            "the query string is not valid URL encoding",
            vec![FieldError::new("$query", "is malformed")],
        )
    })?;
    let q = page_query(&pr, pairs)?;
    // The walk's snapshot: rows created before the first page's millisecond. (Not that
    // millisecond itself: a row created later within it would otherwise join mid-walk.)
    let now = pr.now();
    let mut snapshot_ms = match &q.cursor {
        Some(c) => c.snapshot_ms,
        None => now.timestamp_millis() - 1,
    };
    let snapshot = chrono::DateTime::from_timestamp_millis(snapshot_ms)
        .ok_or_else(|| ApiError::internal("cursor snapshot out of range"))?;
    let after = match &q.cursor {
        Some(c) => Some((
            chrono::DateTime::from_timestamp_millis(c.created_at_ms)
                .ok_or_else(|| ApiError::internal("cursor instant out of range"))?,
            c.payout_id,
        )),
        None => None,
    };
    let mut rows = pr
        .store
        .list(&ListQuery {
            state: q.state,
            account_id: q.account_id.clone(),
            snapshot,
            created_after: None,
            after,
            limit: i64::from(q.limit) + 1,
        })
        .await
        .map_err(store_error)?;
    if q.cursor.is_none() {
        // The first page also lists the rows created after its millisecond: a clock ahead of
        // this replica's stamped them (or this one's, before it stepped back). They exist
        // now, and a snapshot on this clock alone would hide them from every walk, a work
        // queue's scans included, until this clock caught up. They sort after every row the
        // snapshot holds, and the walk's snapshot reaches the newest of them, so its later
        // pages list them too (C3-extensions "P1 cursor").
        let ahead = rows_ahead(&pr, &q, now).await?;
        if let Some(newest) = ahead.last() {
            snapshot_ms = snapshot_ms.max(newest.created_at.timestamp_millis());
        }
        // The page's rows and the one that says whether another page follows.
        let room = (q.limit as usize + 1).saturating_sub(rows.len());
        rows.extend(ahead.into_iter().take(room));
    }
    let more = rows.len() > q.limit as usize;
    let items: Vec<PayoutItem> = rows
        .into_iter()
        .take(q.limit as usize)
        .map(|r| PayoutItem {
            payout_id: r.payout_id,
            account_id: r.account_id,
            amount_minor: r.amount_minor,
            currency: r.currency,
            state: r.state,
            attempt_count: r.attempt_count,
            created_at: r.created_at,
        })
        .collect();
    let next_cursor = match (more, items.last()) {
        (true, Some(last)) => Some(pr.cursor.encode(&CursorPayload {
            state: q.state,
            account_id: q.account_id.clone(),
            snapshot_ms,
            created_at_ms: last.created_at.timestamp_millis(),
            payout_id: last.payout_id,
        })),
        _ => None,
    };
    Ok(dlock_http::json(StatusCode::OK, &PayoutPage { items, next_cursor }))
}

/// Readiness (C4): paydb answers.
#[utoipa::path(get, path = "/health/ready", tag = "health",
    responses((status = 200, description = "Ready.", body = dlock_http::openapi::Health)))]
async fn ready(State(pr): State<Arc<PaymentResource>>) -> Response {
    dlock_http::health::ready(BTreeMap::from([("paydb", pr.readiness().await)]))
}

/// Prometheus metrics (C4).
#[utoipa::path(get, path = "/metrics", tag = "metrics",
    responses((status = 200, description = "Prometheus text exposition.", content_type = "text/plain; version=0.0.4; charset=utf-8", body = String)))]
async fn metrics(State(pr): State<Arc<PaymentResource>>) -> Response {
    dlock_http::metrics::response(pr.render_metrics().await)
}
