//! HTTP surface of the payment-resource (C3 §3.4, P1–P5, the two creates, the batches
//! P2b and P3b of C3-extensions E-19, and the operator's resolution of E-21).
//!
//! Handlers only translate HTTP: they read the headers, the path and the body, validate
//! them, and hand the request on. A fenced write (P2, P3, P2b, P3b) goes to the one
//! pipeline, [`crate::fenced`], which holds its check order, grant check, identity, store
//! call, events, metrics and answers; its headers are read by the one extractor,
//! [`FencedHeaders`]. A create, and the operator's resolution, runs its store call here and
//! answers through the same [`fenced::answer`]. Every recorded answer is rendered below the store
//! ([`crate::answer`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Extension;
use dlock_contract::batch::BatchAnswer;
use dlock_contract::payment::{
    AccountBody, ClaimAck, ClaimBatchRequest, ClaimRequest, NewAccountRequest, NewPayoutRequest, PayoutBody,
    PayoutItem, PayoutPage, PostAck, PostBatchRequest, PostRequest, ResolutionAck, ResolutionRequest, CURSOR_CHARS_MAX,
    P1_LIMIT_DEFAULT, P1_LIMIT_MAX,
};
use dlock_contract::payout::PayoutState;
use dlock_contract::stream::EventFilter;
use dlock_contract::FieldError;
use dlock_http::{ApiError, JsonBody, TraceId};
use uuid::Uuid;

use crate::answer::{account_body, not_found, payout_body, resolve_refusal, Answering, Shape};
use crate::cursor::CursorPayload;
use crate::fenced::{self, answer, store_error, FencedHeaders, FencedOp, FencedWrite, PostItem, Target};
use crate::service::PaymentResource;
use crate::store::{
    AmbiguousResolution, ClaimBatchPayout, CreateAccountOutcome, CreatePayoutOutcome, ListQuery, NewAccount, NewPayout,
    Operation, ResolveOutcome,
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
        .route("/v1/payouts/{payout_id}/resolution", post(resolve))
        .route("/v1/payouts/{payout_id}/claim", post(claim))
        .route("/v1/payouts/{payout_id}/post", post(post_payout))
        .route("/v1/accounts/{account_id}/claims", post(claim_batch))
        .route("/v1/accounts/{account_id}/posts", post(post_batch))
        .route("/v1/events", get(events))
        .route("/v1/events/recent", get(recent_events))
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
    let how = Answering { shape: Shape::Single, key: key.as_str().to_owned(), trace_id: trace.0.clone() };
    let decided = pr.write(move |store| async move { store.create_account(&a, &idem, &how).await }).await;
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
    let how = Answering { shape: Shape::Single, key: key.as_str().to_owned(), trace_id: trace.0.clone() };
    let decided = pr.write(move |store| async move { store.create_payout(&p, &idem, &how).await }).await;
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
// The operator's resolution of a quarantined payout (C3-extensions E-21)
// ---------------------------------------------------------------------------------------

/// Resolve a RAIL_AMBIGUOUS payout as POSTED or FAILED (operator, C3-extensions E-21): the
/// audited verdict of `dlock resolve`, over HTTP. The operator is the `X-Owner-Id`.
#[utoipa::path(post, path = "/v1/payouts/{payoutId}/resolution", tag = "payouts",
    params(crate::openapi::PayoutPath, dlock_http::openapi::OwnerHeader, dlock_http::openapi::IdempotencyKeyHeader),
    request_body(content = dlock_contract::payment::ResolutionRequest, content_type = "application/json"),
    responses((status = 200, description = "Resolved, with its audit row written (or the recorded answer to this idempotency key).", body = ResolutionAck)))]
async fn resolve(
    State(pr): State<Arc<PaymentResource>>,
    Extension(trace): Extension<TraceId>,
    headers: HeaderMap,
    Path(raw_id): Path<String>,
    body: Result<JsonBody, ApiError>,
) -> Result<Response, ApiError> {
    // The operator's name: the `X-Owner-Id` rule is `dlock resolve --operator`'s
    // (`dlock_contract::resolution::parse_operator`).
    let owner = dlock_http::owner_id(&headers)?;
    let key = dlock_http::idempotency_key(&headers)?;
    let payout_id = path_uuid(&raw_id, "payoutId")?;
    let JsonBody(raw) = body?;
    let req = ResolutionRequest::from_json(&raw)
        .map_err(|fields| ApiError::validation("the resolution body is invalid", fields))?;
    let at = pr.now();
    let target = payout_id.to_string();
    let idem =
        pr.identity(Operation::Resolve, &target, key.as_str(), 0, owner.as_str(), &req, at).map_err(identity_error)?;
    let r = AmbiguousResolution {
        resolution_id: dlock_rt::rand::uuid_v4(),
        payout_id,
        resolved_as: req.resolved_as,
        operator: owner.as_str().to_owned(),
        reason: req.reason,
        rail_reference: req.rail_reference,
        posting_id: dlock_rt::rand::uuid_v4(),
        entry_ids: [dlock_rt::rand::uuid_v4(), dlock_rt::rand::uuid_v4()],
        at,
    };
    let (resolution_id, rail_reference) = (r.resolution_id, r.rail_reference.clone());
    let how = Answering { shape: Shape::Single, key: key.as_str().to_owned(), trace_id: trace.0.clone() };
    let decided = pr.write(move |store| async move { store.resolve_recorded(&r, &idem, &how).await }).await;
    Ok(answer(
        &pr,
        decided,
        (Operation::Resolve, &target, owner.as_str()),
        |o| {
            if let ResolveOutcome::Resolved { state, .. } = o {
                tracing::info!(payoutId = %payout_id, resolutionId = %resolution_id, resolvedAs = state.as_str(),
                    operator = owner.as_str(), railReference = %rail_reference, traceId = %trace.0, "payout_resolved");
            }
        },
        |o| resolve_refusal(payout_id, &o),
    ))
}

// ---------------------------------------------------------------------------------------
// P2, P3, and the batches P2b, P3b (C3-extensions E-19): one pipeline, crate::fenced
// ---------------------------------------------------------------------------------------

// Run as the batch of one of its payout's account (`crate::fenced`).
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
    let grant = FencedHeaders::read(&headers)?;
    let payout_id = path_uuid(&raw_id, "payoutId")?;
    let JsonBody(raw) = body?;
    let req =
        ClaimRequest::from_json(&raw).map_err(|fields| ApiError::validation("the claim body is invalid", fields))?;
    let op = FencedOp::Claim(vec![ClaimBatchPayout { payout_id, expected: req.expected_state }]);
    let w = FencedWrite { op, target: Target::Payout(payout_id), grant, request: &req };
    Ok(fenced::write(&pr, w, &trace).await)
}

// Run as the batch of one of its payout's account (`crate::fenced`).
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
    let grant = FencedHeaders::read(&headers)?;
    let payout_id = path_uuid(&raw_id, "payoutId")?;
    let JsonBody(raw) = body?;
    let req =
        PostRequest::from_json(&raw).map_err(|fields| ApiError::validation("the post body is invalid", fields))?;
    let op = FencedOp::Post(vec![posted(payout_id, req.submission_id, &req.rail_reference)]);
    let w = FencedWrite { op, target: Target::Payout(payout_id), grant, request: &req };
    Ok(fenced::write(&pr, w, &trace).await)
}

/// One payout of a post, as its request names it.
fn posted(payout_id: Uuid, submission_id: Uuid, rail_reference: &str) -> PostItem {
    PostItem { payout_id, submission_id, rail_reference: rail_reference.to_owned() }
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
    let grant = FencedHeaders::read(&headers)?;
    path_account_id(&account_id)?;
    let JsonBody(raw) = body?;
    let req = ClaimBatchRequest::from_json(&raw)
        .map_err(|fields| ApiError::validation("the claim batch body is invalid", fields))?;
    let payouts =
        req.payouts.iter().map(|p| ClaimBatchPayout { payout_id: p.payout_id, expected: p.expected_state }).collect();
    let w = FencedWrite { op: FencedOp::Claim(payouts), target: Target::Account(account_id), grant, request: &req };
    Ok(fenced::write(&pr, w, &trace).await)
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
    let grant = FencedHeaders::read(&headers)?;
    path_account_id(&account_id)?;
    let JsonBody(raw) = body?;
    let req = PostBatchRequest::from_json(&raw)
        .map_err(|fields| ApiError::validation("the post batch body is invalid", fields))?;
    let payouts = req.payouts.iter().map(|p| posted(p.payout_id, p.submission_id, &p.rail_reference)).collect();
    let w = FencedWrite { op: FencedOp::Post(payouts), target: Target::Account(account_id), grant, request: &req };
    Ok(fenced::write(&pr, w, &trace).await)
}

// ---------------------------------------------------------------------------------------
// Reads: P1, P4, P5
// ---------------------------------------------------------------------------------------

/// Read a payout and its rail submissions (P4). Advisory.
#[utoipa::path(get, path = "/v1/payouts/{payoutId}", tag = "payouts",
    params(crate::openapi::PayoutPath, dlock_http::openapi::PreferEventCursorHeader),
    responses((status = 200, description = "The payout.", body = PayoutBody)))]
async fn get_payout(
    State(pr): State<Arc<PaymentResource>>,
    principal: Option<Extension<dlock_http::auth::Principal>>,
    headers: HeaderMap,
    Path(raw_id): Path<String>,
) -> Result<Response, ApiError> {
    let payout_id = path_uuid(&raw_id, "payoutId")?;
    let filter = EventFilter { payouts: [payout_id.to_string()].into(), ..EventFilter::default() };
    // Before the read: the snapshot's watermark (C3-extensions E-20, "Snapshots").
    let mark =
        dlock_http::stream::snapshot_mark(&pr.events, principal.as_ref().map(|p| &p.0), &headers, &filter).await?;
    match pr.store.payout(payout_id).await.map_err(store_error)? {
        Some(p) => Ok(with_mark(dlock_http::json(StatusCode::OK, &payout_body(&p)), mark)),
        None => Err(not_found("payout")),
    }
}

/// A snapshot's response with its event cursor, when the request preferred one.
fn with_mark(res: Response, mark: Option<dlock_http::stream::SnapshotMark>) -> Response {
    match mark {
        Some(m) => m.apply(res),
        None => res,
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
#[utoipa::path(get, path = "/v1/payouts", tag = "payouts",
    params(crate::openapi::ListQuery, dlock_http::openapi::PreferEventCursorHeader),
    responses((status = 200, description = "One page.", body = PayoutPage)))]
async fn list_payouts(
    State(pr): State<Arc<PaymentResource>>,
    principal: Option<Extension<dlock_http::auth::Principal>>,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(pairs) = query.map_err(|_| {
        ApiError::validation(
            "the query string is not valid URL encoding",
            vec![FieldError::new("$query", "is malformed")],
        )
    })?;
    let q = page_query(&pr, pairs)?;
    // Before the read: the page's watermark (C3-extensions E-20, "Snapshots"); a walk
    // streams on from its first page's.
    let filter = EventFilter { accounts: q.account_id.iter().cloned().collect(), ..EventFilter::default() };
    let mark =
        dlock_http::stream::snapshot_mark(&pr.events, principal.as_ref().map(|p| &p.0), &headers, &filter).await?;
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
        // Planted bug `p1-hides-ahead` (bug B8; test-only): the rows stamped ahead left out.
        let ahead = if dlock_contract::planted::on(dlock_contract::planted::Bug::P1HidesAhead) {
            Vec::new()
        } else {
            rows_ahead(&pr, &q, now).await?
        };
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
    Ok(with_mark(dlock_http::json(StatusCode::OK, &PayoutPage { items, next_cursor }), mark))
}

/// The event stream (C3-extensions E-20): paydb's events but the rail's, as Server-Sent
/// Events from the cursor.
#[utoipa::path(get, path = "/v1/events", tag = "events", params(dlock_http::stream::EventsQuery),
    responses((status = 200, description = "Server-Sent Events: each event's `id:` is the cursor to resume from; `bookmark` and `resync_required` frames (C3-extensions E-20).", content_type = "text/event-stream; charset=utf-8", body = dlock_http::stream::SseFrame)))]
pub(crate) async fn events(
    State(pr): State<Arc<PaymentResource>>,
    principal: Option<Extension<dlock_http::auth::Principal>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    dlock_http::stream::events_response(&pr.events, principal.as_ref().map(|p| &p.0), query.as_deref(), &headers)
}

/// The recent events (C3-extensions E-20): the newest events the filter selects, and the
/// cursor to stream on from.
#[utoipa::path(get, path = "/v1/events/recent", tag = "events", params(dlock_http::stream::RecentQuery),
    responses((status = 200, description = "The newest events, oldest first, and the cursor of their head.", body = dlock_http::stream::RecentPage)))]
pub(crate) async fn recent_events(
    State(pr): State<Arc<PaymentResource>>,
    principal: Option<Extension<dlock_http::auth::Principal>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    dlock_http::stream::recent_response(&pr.events, principal.as_ref().map(|p| &p.0), query.as_deref()).await
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
