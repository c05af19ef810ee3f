//! HTTP surface of the lock server (C3 §3.3, L1–L8; rotate, C3-extensions E-18; the list of
//! held keys, E-23), health and metrics.
//!
//! Invariant: L7 and the list answer a key with one body ([`lock_info`]) from one judgement
//! ([`crate::rules::judge_key`]), so they cannot disagree on what a key's state means.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Extension;
use chrono::{DateTime, Utc};
use dlock_contract::lock::{
    clamp_session_ttl_ms, is_lock_key, HeartbeatAck, LockGrant, LockInfo, LockList, LockOutcome, SessionOpened,
    LOCK_LIST_ITEMS_DEFAULT, LOCK_LIST_ITEMS_MAX, LOCK_TTL_MS_MAX, LOCK_TTL_MS_MIN, REVOKE_REASON_CHARS_MIN,
    REVOKE_TEXT_CHARS_MAX, WAIT_MS_MAX,
};
use dlock_contract::stream::EventFilter;
use dlock_contract::{ErrorCode, FieldError, OwnerId};
use dlock_http::{ApiError, JsonBody, TraceId};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::service::{AcquireOutcome, LockServer, CONTENTION_RETRY_AFTER_MS, NOT_LEADER_RETRY_AFTER_MS};
use crate::store::{
    AcquireRefusal, Addressed, ClassifiedStoreError, GrantRow, KeyInfo, RenewRefusal, RevokeRefusal, RotateRefusal,
    SessionRefusal, StoreError,
};

/// Largest request body the lock server reads.
pub const BODY_BYTES_MAX: usize = 16 * 1024;

/// The lock server's routes, wrapped in the envelope middleware.
pub fn router(server: Arc<LockServer>) -> axum::Router {
    dlock_http::finish(routes(server), BODY_BYTES_MAX)
}

/// [`router`] behind `auth` (none: authentication off), with the lock server's role table.
pub fn router_with_auth(server: Arc<LockServer>, auth: Option<Arc<dlock_http::auth::Authenticator>>) -> axum::Router {
    dlock_http::finish_with_auth(routes(server), BODY_BYTES_MAX, auth)
}

fn routes(server: Arc<LockServer>) -> axum::Router {
    axum::Router::new()
        .route("/v1/sessions", post(open_session))
        .route("/v1/sessions/{session_id}/heartbeat", post(heartbeat))
        .route("/v1/sessions/{session_id}", delete(close_session))
        .route("/v1/locks/{key}/acquire", post(acquire))
        .route("/v1/locks/{key}/renew", post(renew))
        .route("/v1/locks/{key}/rotate", post(rotate))
        .route("/v1/locks/{key}/revoke", post(revoke))
        .route("/v1/locks/{key}", get(info).delete(release))
        .route("/v1/locks", get(list))
        .route("/v1/events", get(events))
        .route("/v1/events/recent", get(recent_events))
        .route("/health/live", get(dlock_http::health::live))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics))
        .route(dlock_http::openapi::DOCUMENT_PATH, get(crate::openapi::openapi_json))
        .with_state(server)
}

fn at(ms: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}

/// A store failure, by its class (C3-extensions C-29): `Unavailable` is 503 `NOT_LEADER`
/// (nothing changed; retry-safe), anything else 500 `INTERNAL` (a lost commit answer may
/// have granted: never retry-safe).
fn not_leader(e: StoreError) -> ApiError {
    match e.fault().code(ErrorCode::NotLeader) {
        ErrorCode::NotLeader => {
            ApiError::new(ErrorCode::NotLeader, "this replica cannot currently guarantee the backend's ordering")
                .with_retry_after_ms(NOT_LEADER_RETRY_AFTER_MS)
                .with_internal(e.to_string())
        }
        // Corrupt content (a store's guard refused what the rule decided, or an answer it
        // cannot read) is also a contradiction; a lost commit answer is not.
        code => ApiError::new(code, "the backend's answer was lost or unreadable; the outcome is unknown")
            .contradiction_if(e.fault() == dlock_contract::store::StoreFault::Corrupt)
            .with_internal(e.to_string()),
    }
}

fn session_refusal(r: SessionRefusal, id: Uuid) -> ApiError {
    match r {
        SessionRefusal::Unknown => ApiError::new(ErrorCode::SessionUnknown, "no such session; open a new one")
            .with_details(json!({ "sessionId": id })),
        SessionRefusal::Expired => {
            ApiError::new(ErrorCode::SessionExpired, "the session's heartbeat lapsed and its locks were released")
                .with_details(json!({ "sessionId": id }))
        }
    }
}

/// The principal's owner binding (`None`: unbound, or authentication off).
type Caller = Option<Extension<dlock_http::auth::Principal>>;

fn bound(caller: &Caller) -> Option<&std::collections::BTreeSet<String>> {
    caller.as_ref().and_then(|p| p.0.owners.as_ref())
}

/// The owner check (C3-extensions E-9, "Owner binding"): `403 FORBIDDEN` unless the caller
/// may act as the stored owner of every session and grant the write addresses, decided
/// before anything changes. A missing session or grant passes here; the store's answer
/// (`SESSION_UNKNOWN`, `LOCK_LOST`) follows.
async fn authorize(
    server: &LockServer,
    caller: &Caller,
    targets: &[Addressed<'_>],
    owner: &OwnerId,
    trace: &TraceId,
) -> Result<(), ApiError> {
    if server.may_address(bound(caller), targets).await.map_err(not_leader)? {
        return Ok(());
    }
    tracing::warn!(ownerId = %owner, traceId = %trace.0, "lock_owner_forbidden");
    Err(ApiError::new(ErrorCode::Forbidden, "this credential may not act for the owner of this session or grant"))
}

/// A stored token for a log line: the number, or `none`.
fn display_token(t: Option<i64>) -> String {
    t.map_or_else(|| "none".to_owned(), |t| t.to_string())
}

fn lock_key(raw: &str) -> Result<String, ApiError> {
    if is_lock_key(raw) {
        Ok(raw.to_owned())
    } else {
        Err(ApiError::validation(
            "the lock key is invalid",
            vec![FieldError::new("key", "must be 1 to 128 characters of [a-zA-Z0-9:._-]")],
        ))
    }
}

fn path_session(raw: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).ok().filter(|_| raw.len() == 36).ok_or_else(|| {
        ApiError::validation(
            "the session id is invalid",
            vec![FieldError::new("sessionId", "must be a hyphenated UUID")],
        )
    })
}

fn body_session(body: &Value) -> Result<Uuid, ApiError> {
    match body.get("sessionId").and_then(Value::as_str) {
        Some(raw) => path_session(raw),
        None => Err(ApiError::validation(
            "sessionId is required",
            vec![FieldError::new("sessionId", "is required and must be a hyphenated UUID")],
        )),
    }
}

/// An optional integer body field within `[min, max]`.
fn opt_int(body: &Value, field: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_i64() {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(ApiError::validation(
                format!("{field} is out of range"),
                vec![FieldError::new(field, format!("must be an integer from {min} to {max}"))],
            )),
        },
    }
}

/// A grant's body, signed by this server when it has a signing key (the one place grants
/// are signed, whatever the backend: C3-extensions E-14).
fn grant_body(server: &LockServer, g: &GrantRow) -> LockGrant {
    LockGrant {
        fencing_signature: server.sign(g),
        key: g.key.clone(),
        owner_id: g.owner_id.clone(),
        session_id: g.session_id,
        fencing_token: g.fencing_token,
        acquired_at: at(g.acquired_at_ms),
        expires_at: at(g.expires_at_ms),
    }
}

/// The request of a call on a held grant (L5 renew, E-18 rotate): the key, the presented
/// token, the owner, the body's session and the ttl to grant, checked in that order.
struct HeldRequest {
    key: String,
    token: dlock_contract::FencingToken,
    owner: OwnerId,
    session: Uuid,
    ttl: i64,
}

fn held_request(
    server: &LockServer,
    key: &str,
    headers: &HeaderMap,
    body: Result<JsonBody, ApiError>,
) -> Result<HeldRequest, ApiError> {
    let key = lock_key(key)?;
    let token = dlock_http::fencing_token(headers)?;
    let owner = dlock_http::owner_id(headers)?;
    let JsonBody(body) = body?;
    let session = body_session(&body)?;
    let ttl = lock_ttl(server, opt_int(&body, "ttlMillis", 1, i64::MAX)?);
    Ok(HeldRequest { key, token, owner, session, ttl })
}

fn lock_ttl(server: &LockServer, requested: Option<i64>) -> i64 {
    requested.unwrap_or(server.cfg.lock_ttl_ms_default).clamp(LOCK_TTL_MS_MIN, LOCK_TTL_MS_MAX)
}

/// A JSON body, or `{}` when the request has none (for endpoints whose body is optional).
/// A body that is present is held to every rule of [`JsonBody`] (a JSON object, declared
/// `application/json`): `[1,2]` is `400 VALIDATION_FAILED`, never an empty body.
fn optional_body(body: Result<JsonBody, ApiError>, headers: &HeaderMap) -> Result<Value, ApiError> {
    use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
    let has_body = headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()) != Some("0")
        && [CONTENT_TYPE, CONTENT_LENGTH, TRANSFER_ENCODING].iter().any(|h| headers.contains_key(h));
    if has_body {
        body.map(|JsonBody(v)| v)
    } else {
        Ok(Value::Object(Default::default()))
    }
}

// L1
/// Open a session (L1).
///
/// The owner comes from `X-Owner-Id` or the body's `ownerId` (both: they must agree). The
/// TTL is clamped into the contract's range.
#[utoipa::path(post, path = "/v1/sessions", tag = "sessions",
    params(("X-Owner-Id" = Option<String>, Header, description = "The caller's worker identity (or send `ownerId`).", pattern = "^[!-~]{1,64}$")),
    request_body(content = Option<dlock_contract::lock::OpenSessionRequest>, content_type = "application/json"),
    responses((status = 201, description = "The session is open.", body = SessionOpened)))]
async fn open_session(
    State(server): State<Arc<LockServer>>,
    Extension(trace): Extension<TraceId>,
    principal: Option<Extension<dlock_http::auth::Principal>>,
    headers: HeaderMap,
    body: Result<JsonBody, ApiError>,
) -> Result<Response, ApiError> {
    let body = optional_body(body, &headers)?;
    let from_header = headers.contains_key(dlock_contract::HEADER_OWNER_ID).then(|| dlock_http::owner_id(&headers));
    let from_body = body.get("ownerId").map(|v| {
        v.as_str().ok_or(()).and_then(|s| OwnerId::parse(s).map_err(|_| ())).map_err(|_| {
            ApiError::validation(
                "ownerId is invalid",
                vec![FieldError::new("ownerId", "must be 1 to 64 visible ASCII characters")],
            )
        })
    });
    let owner = match (from_header.transpose()?, from_body.transpose()?) {
        (Some(h), Some(b)) if h != b => {
            return Err(ApiError::validation(
                "X-Owner-Id and ownerId disagree",
                vec![FieldError::new("ownerId", "must equal X-Owner-Id when both are given")],
            ))
        }
        (Some(o), _) | (None, Some(o)) => o,
        (None, None) => {
            return Err(ApiError::validation(
                "an owner is required",
                vec![FieldError::new("ownerId", "is required (or send X-Owner-Id)")],
            ))
        }
    };
    // A credential bound to owner ids opens sessions only for them (E-13).
    dlock_http::auth::check_owner(principal.as_ref().map(|p| &p.0), owner.as_str())?;
    let requested = opt_int(&body, "ttlMillis", 1, i64::MAX)?;
    let ttl = clamp_session_ttl_ms(requested.unwrap_or(server.cfg.session_ttl_ms_default));
    let id = dlock_rt::rand::uuid_v4();
    let owner_text = owner.as_str().to_owned();
    let open =
        move |store: Arc<dyn crate::store::LockStore>| async move { store.open_session(id, &owner_text, ttl).await };
    let row = server.write(open).await.map_err(not_leader)?;
    server.remember_owner(bound(&principal), Addressed::Session(id), &row.owner_id);
    emit_session(id, row.expires_at_ms);
    tracing::info!(sessionId = %id, ownerId = %owner, ttlMillis = ttl, traceId = %trace.0, "session_opened");
    Ok(dlock_http::json(
        StatusCode::CREATED,
        &SessionOpened {
            session_id: id,
            owner_id: row.owner_id,
            ttl_millis: row.ttl_ms,
            expires_at: at(row.expires_at_ms),
        },
    ))
}

/// The event seam's `session` (docs/simulation.md "Incident trace"): session `id` now ends
/// at `expires_at_ms` (store time), after it was opened or heartbeat.
fn emit_session(id: Uuid, expires_at_ms: i64) {
    dlock_rt::events::emit(crate::NODE, "session", || {
        [("session", id.to_string().into()), ("expires_at_ms", expires_at_ms.into())]
    });
}

// L2
/// Heartbeat a session (L2): extends it by its TTL.
#[utoipa::path(post, path = "/v1/sessions/{sessionId}/heartbeat", tag = "sessions",
    params(crate::openapi::SessionPath, dlock_http::openapi::OwnerHeader),
    responses((status = 200, description = "The session is extended.", body = HeartbeatAck)))]
async fn heartbeat(
    State(server): State<Arc<LockServer>>,
    Extension(trace): Extension<TraceId>,
    caller: Caller,
    Path(session_id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = path_session(&session_id)?;
    let owner = dlock_http::owner_id(&headers)?;
    authorize(&server, &caller, &[Addressed::Session(id)], &owner, &trace).await?;
    let heartbeat = server.write(move |store| async move { store.heartbeat(id).await }).await;
    let (row, held) = heartbeat.map_err(not_leader)?.map_err(|r| session_refusal(r, id))?;
    emit_session(id, row.expires_at_ms);
    // The store extended the session to its own `now + ttl`: that `now` is the server time.
    let now = row.expires_at_ms - row.ttl_ms;
    Ok(dlock_http::json(
        StatusCode::OK,
        &HeartbeatAck {
            session_id: id,
            expires_at: at(row.expires_at_ms),
            server_time: at(now),
            held_lock_count: held,
        },
    ))
}

// L3
/// Close a session (L3): releases its locks (after the lock delay).
#[utoipa::path(delete, path = "/v1/sessions/{sessionId}", tag = "sessions",
    params(crate::openapi::SessionPath, dlock_http::openapi::OwnerHeader),
    responses((status = 204, description = "The session is closed.")))]
async fn close_session(
    State(server): State<Arc<LockServer>>,
    Extension(trace): Extension<TraceId>,
    caller: Caller,
    Path(session_id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = path_session(&session_id)?;
    let owner = dlock_http::owner_id(&headers)?;
    authorize(&server, &caller, &[Addressed::Session(id)], &owner, &trace).await?;
    let delay_ms = server.cfg.delay_ms;
    let closed = server.write(move |store| async move { store.close_session(id, delay_ms).await }).await;
    closed.map_err(not_leader)?.map_err(|r| match r {
        // C3 L3 answers only SESSION_UNKNOWN: a lapsed session is closed all the same.
        SessionRefusal::Unknown | SessionRefusal::Expired => session_refusal(SessionRefusal::Unknown, id),
    })?;
    dlock_rt::events::emit(crate::NODE, "session_closed", || {
        [("session", id.to_string().into()), ("store_ms", server.clock.wall().timestamp_millis().into())]
    });
    tracing::info!(sessionId = %id, ownerId = %owner, traceId = %trace.0, "session_closed");
    Ok(StatusCode::NO_CONTENT.into_response())
}

// L4
/// Acquire a lock (L4), optionally waiting up to `waitMillis` for it.
#[utoipa::path(post, path = "/v1/locks/{key}/acquire", tag = "locks",
    params(crate::openapi::KeyPath, dlock_http::openapi::OwnerHeader),
    request_body(content = dlock_contract::lock::AcquireRequest, content_type = "application/json"),
    responses((status = 200, description = "Granted: the grant and its fencing token.", body = LockGrant)))]
async fn acquire(
    State(server): State<Arc<LockServer>>,
    Extension(trace): Extension<TraceId>,
    caller: Caller,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Result<JsonBody, ApiError>,
) -> Result<Response, ApiError> {
    let key = lock_key(&key)?;
    let owner = dlock_http::owner_id(&headers)?;
    let JsonBody(body) = body?;
    let session = body_session(&body)?;
    let ttl = lock_ttl(&server, opt_int(&body, "ttlMillis", 1, i64::MAX)?);
    let wait = opt_int(&body, "waitMillis", 0, WAIT_MS_MAX)?.unwrap_or(0);
    authorize(&server, &caller, &[Addressed::Session(session)], &owner, &trace).await?;
    let outcome = server.acquire(&key, session, ttl, wait).await.map_err(not_leader)?;
    match outcome {
        AcquireOutcome::Granted(g) => {
            server.remember_owner(bound(&caller), Addressed::Grant { key: &key, token: g.fencing_token }, &g.owner_id);
            tracing::info!(key = %key, ownerId = %owner, sessionId = %session, fencingToken = g.fencing_token, traceId = %trace.0, "lock_granted");
            Ok(dlock_http::json(StatusCode::OK, &grant_body(&server, &g)))
        }
        AcquireOutcome::QueueFull => {
            tracing::warn!(key = %key, ownerId = %owner, waitersMax = server.cfg.waiters_per_key_max, traceId = %trace.0, "lock_waiters_full");
            Err(ApiError::new(ErrorCode::ContentionExceeded, "too many requests are already waiting for this key")
                .with_retry_after_ms(CONTENTION_RETRY_AFTER_MS)
                .with_details(json!({ "key": key, "waitersMax": server.cfg.waiters_per_key_max })))
        }
        AcquireOutcome::Refused(AcquireRefusal::Session(r)) => Err(session_refusal(r, session)),
        AcquireOutcome::Refused(r) => {
            let (details, retry_after) = match r {
                AcquireRefusal::Contended { holder_owner_id, expires_at_ms } => (
                    json!({ "key": key, "holderOwnerId": holder_owner_id, "expiresAt": dlock_contract::time::rfc3339_ms(at(expires_at_ms)) }),
                    expires_at_ms,
                ),
                AcquireRefusal::AlreadyHeld { fencing_token, expires_at_ms } => (
                    json!({ "key": key, "holderOwnerId": owner.as_str(), "expiresAt": dlock_contract::time::rfc3339_ms(at(expires_at_ms)),
                            "heldBySession": true, "fencingToken": fencing_token }),
                    expires_at_ms,
                ),
                AcquireRefusal::Delayed { until_ms } => {
                    (json!({ "key": key, "lockDelayUntil": dlock_contract::time::rfc3339_ms(at(until_ms)) }), until_ms)
                }
                AcquireRefusal::Session(_) => (json!({ "key": key }), 0),
            };
            Err(ApiError::new(ErrorCode::LockContended, "the lock is held; nothing happened")
                .with_retry_after_ms(retry_after_ms(&server, retry_after))
                .with_details(details))
        }
    }
}

/// `retryAfterMillis` until `until_ms`, within 1..=[`WAIT_MS_MAX`]. A hint, not a promise
/// (C3 §3.1): this replica's clock is close enough, and asking the backend would add a round
/// trip to every contended answer.
fn retry_after_ms(server: &LockServer, until_ms: i64) -> u64 {
    let now = server.clock.wall().timestamp_millis();
    u64::try_from(until_ms.saturating_sub(now)).unwrap_or(0).clamp(1, WAIT_MS_MAX as u64)
}

/// A held grant's request that found the grant gone (renew's or rotate's `Lost`).
struct HeldLost<'a, O: std::fmt::Display> {
    key: &'a str,
    owner: &'a O,
    token: i64,
    stored_token: Option<i64>,
    trace: &'a TraceId,
}

/// `LOCK_LOST` for a renew or rotate whose grant is gone, logged once.
fn lock_lost<O: std::fmt::Display>(l: &HeldLost<'_, O>, message: &str) -> ApiError {
    tracing::warn!(key = %l.key, ownerId = %l.owner, presentedToken = l.token,
        storedToken = %display_token(l.stored_token), traceId = %l.trace.0, "lock_lost");
    ApiError::new(ErrorCode::LockLost, message)
        .with_details(json!({ "key": l.key, "presentedToken": l.token, "storedToken": l.stored_token }))
}

// L5
/// Renew a held lock (L5): same token, later expiry.
#[utoipa::path(post, path = "/v1/locks/{key}/renew", tag = "locks",
    params(crate::openapi::KeyPath, dlock_http::openapi::FencingTokenHeader, dlock_http::openapi::OwnerHeader),
    request_body(content = dlock_contract::lock::RenewRequest, content_type = "application/json"),
    responses((status = 200, description = "Renewed.", body = LockGrant)))]
async fn renew(
    State(server): State<Arc<LockServer>>,
    Extension(trace): Extension<TraceId>,
    caller: Caller,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Result<JsonBody, ApiError>,
) -> Result<Response, ApiError> {
    let HeldRequest { key, token, owner, session, ttl } = held_request(&server, &key, &headers, body)?;
    let addressed = [Addressed::Session(session), Addressed::Grant { key: &key, token: token.get() }];
    authorize(&server, &caller, &addressed, &owner, &trace).await?;
    let (renewing, presented) = (key.clone(), token.get());
    let renew = move |store: Arc<dyn crate::store::LockStore>| async move {
        store.renew(&renewing, session, presented, ttl).await
    };
    match server.write(renew).await.map_err(not_leader)? {
        Ok(g) => {
            dlock_rt::events::emit(crate::NODE, "renew", || {
                [
                    ("key", g.key.clone().into()),
                    ("token", g.fencing_token.into()),
                    ("expires_at_ms", g.expires_at_ms.into()),
                ]
            });
            Ok(dlock_http::json(StatusCode::OK, &grant_body(&server, &g)))
        }
        Err(RenewRefusal::Session(r)) => Err(session_refusal(r, session)),
        Err(RenewRefusal::Lost { stored_token }) => Err(lock_lost(
            &HeldLost { key: &key, owner: &owner, token: token.get(), stored_token, trace: &trace },
            "this grant expired or was taken over; re-acquire, never retry",
        )),
    }
}

// E-18
/// Rotate a held lock (C3-extensions E-18): release the grant whose token is presented and
/// grant the key again to the same session, with a greater token, in one atomic step.
///
/// The checks and refusals are renew's (L5); a lock-delay recorded on the key answers
/// `LOCK_CONTENDED` as acquire does. A refusal changes nothing: the presented grant stays
/// as it was. An answer that is lost (or `500 INTERNAL`) may have rotated: the old grant may
/// be gone and a new one attached to the session.
#[utoipa::path(post, path = "/v1/locks/{key}/rotate", tag = "locks",
    params(crate::openapi::KeyPath, dlock_http::openapi::FencingTokenHeader, dlock_http::openapi::OwnerHeader),
    request_body(content = dlock_contract::lock::RenewRequest, content_type = "application/json"),
    responses((status = 200, description = "Rotated: the new grant and its (greater) fencing token.", body = LockGrant)))]
async fn rotate(
    State(server): State<Arc<LockServer>>,
    Extension(trace): Extension<TraceId>,
    caller: Caller,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Result<JsonBody, ApiError>,
) -> Result<Response, ApiError> {
    let HeldRequest { key, token, owner, session, ttl } = held_request(&server, &key, &headers, body)?;
    let addressed = [Addressed::Session(session), Addressed::Grant { key: &key, token: token.get() }];
    authorize(&server, &caller, &addressed, &owner, &trace).await?;
    match server.rotate(&key, session, token.get(), ttl).await.map_err(not_leader)? {
        Ok(g) => {
            server.forget_grant_owner(&key, token.get());
            server.remember_owner(bound(&caller), Addressed::Grant { key: &key, token: g.fencing_token }, &g.owner_id);
            tracing::info!(key = %key, ownerId = %owner, sessionId = %session, releasedToken = token.get(), fencingToken = g.fencing_token, traceId = %trace.0, "lock_rotated");
            Ok(dlock_http::json(StatusCode::OK, &grant_body(&server, &g)))
        }
        Err(RotateRefusal::Session(r)) => Err(session_refusal(r, session)),
        Err(RotateRefusal::Lost { stored_token }) => Err(lock_lost(
            &HeldLost { key: &key, owner: &owner, token: token.get(), stored_token, trace: &trace },
            "this grant expired or was taken over; nothing was rotated",
        )),
        Err(RotateRefusal::Delayed { until_ms }) => {
            Err(ApiError::new(ErrorCode::LockContended, "a lock-delay runs on the key; nothing was rotated")
                .with_retry_after_ms(retry_after_ms(&server, until_ms))
                .with_details(json!({ "key": key, "lockDelayUntil": dlock_contract::time::rfc3339_ms(at(until_ms)) })))
        }
    }
}

#[derive(Debug, serde::Deserialize)]
struct SessionQuery {
    #[serde(rename = "sessionId")]
    session_id: Option<String>,
}

// L6
/// Release a lock (L6): only the grant whose token is presented.
///
/// `sessionId` comes from the query or, without it, from the body (attribution only).
#[utoipa::path(delete, path = "/v1/locks/{key}", tag = "locks",
    params(crate::openapi::KeyPath, dlock_http::openapi::FencingTokenHeader, dlock_http::openapi::OwnerHeader,
        ("sessionId" = Option<uuid::Uuid>, Query, description = "The releasing session (or send it in the body).")),
    request_body(content = Option<dlock_contract::lock::ReleaseRequest>, content_type = "application/json"),
    responses((status = 204, description = "Released.")))]
async fn release(
    State(server): State<Arc<LockServer>>,
    Extension(trace): Extension<TraceId>,
    caller: Caller,
    Path(key): Path<String>,
    Query(query): Query<SessionQuery>,
    headers: HeaderMap,
    body: Result<JsonBody, ApiError>,
) -> Result<Response, ApiError> {
    let key = lock_key(&key)?;
    let token = dlock_http::fencing_token(&headers)?;
    let owner = dlock_http::owner_id(&headers)?;
    // sessionId is carried for attribution, never as part of the predicate (C3 L6).
    let session = match query.session_id {
        Some(raw) => path_session(&raw)?,
        None => body_session(&optional_body(body, &headers)?)?,
    };
    let addressed = [Addressed::Grant { key: &key, token: token.get() }, Addressed::Session(session)];
    authorize(&server, &caller, &addressed, &owner, &trace).await?;
    let (releasing, presented) = (key.clone(), token.get());
    let release =
        move |store: Arc<dyn crate::store::LockStore>| async move { store.release(&releasing, presented).await };
    match server.write(release).await.map_err(not_leader)? {
        Ok(()) => {
            server.forget_grant_owner(&key, token.get());
            server.metrics.releases.inc(0);
            server.wake(&key);
            dlock_rt::events::emit(crate::NODE, "release", || {
                [
                    ("key", key.clone().into()),
                    ("token", token.get().into()),
                    ("store_ms", server.clock.wall().timestamp_millis().into()),
                ]
            });
            tracing::info!(key = %key, ownerId = %owner, sessionId = %session, fencingToken = token.get(), traceId = %trace.0, "lock_released");
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Err(stored_token) => {
            server.metrics.releases.inc(1);
            tracing::info!(key = %key, ownerId = %owner, presentedToken = token.get(), storedToken = %display_token(stored_token), traceId = %trace.0, "lock_release_stale");
            Err(ApiError::new(
                ErrorCode::LockLost,
                "this grant had already expired or been taken over; nothing was released",
            )
            .with_details(json!({ "key": key, "presentedToken": token.get(), "storedToken": stored_token })))
        }
    }
}

// L7
/// Read a lock's state (L7). Advisory: never decide "safe to act" from it.
/// The event stream (C3-extensions E-20): lockdb's events, as Server-Sent Events from the
/// cursor.
#[utoipa::path(get, path = "/v1/events", tag = "events", params(dlock_http::stream::EventsQuery),
    responses((status = 200, description = "Server-Sent Events: each event's `id:` is the cursor to resume from; `bookmark` and `resync_required` frames (C3-extensions E-20).", content_type = "text/event-stream; charset=utf-8", body = dlock_http::stream::SseFrame)))]
pub(crate) async fn events(
    State(server): State<Arc<LockServer>>,
    principal: Caller,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    dlock_http::stream::events_response(&server.events, principal.as_ref().map(|p| &p.0), query.as_deref(), &headers)
}

/// The recent events (C3-extensions E-20): the newest events the filter selects, and the
/// cursor to stream on from.
#[utoipa::path(get, path = "/v1/events/recent", tag = "events", params(dlock_http::stream::RecentQuery),
    responses((status = 200, description = "The newest events, oldest first, and the cursor of their head.", body = dlock_http::stream::RecentPage)))]
pub(crate) async fn recent_events(
    State(server): State<Arc<LockServer>>,
    principal: Caller,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    dlock_http::stream::recent_response(&server.events, principal.as_ref().map(|p| &p.0), query.as_deref()).await
}

#[utoipa::path(get, path = "/v1/locks/{key}", tag = "locks",
    params(crate::openapi::KeyPath, dlock_http::openapi::PreferEventCursorHeader),
    responses((status = 200, description = "The key's current state.", body = LockInfo)))]
async fn info(
    State(server): State<Arc<LockServer>>,
    principal: Caller,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Result<Response, ApiError> {
    let key = lock_key(&key)?;
    let filter = EventFilter { lock_keys: [key.clone()].into(), ..EventFilter::default() };
    // Before the read: the snapshot's watermark (C3-extensions E-20, "Snapshots").
    let mark =
        dlock_http::stream::snapshot_mark(&server.events, principal.as_ref().map(|p| &p.0), &headers, &filter).await?;
    let Some(info) = server.store.info(&key, server.cfg.delay_ms).await.map_err(not_leader)? else {
        return Err(
            ApiError::new(ErrorCode::NotFound, "this key was never granted").with_details(json!({ "key": key }))
        );
    };
    let res = dlock_http::json(StatusCode::OK, &lock_info(&server, key, info));
    Ok(match mark {
        Some(m) => m.apply(res),
        None => res,
    })
}

/// L7's body of `key` from the store's judgement of it: the one body L7 and the list
/// (E-23) answer.
fn lock_info(server: &LockServer, key: String, info: KeyInfo) -> LockInfo {
    let g = info.grant;
    LockInfo {
        held: g.is_some(),
        owner_id: g.as_ref().map(|g| g.owner_id.clone()),
        fencing_token: g.as_ref().map(|g| g.fencing_token),
        acquired_at: g.as_ref().map(|g| at(g.acquired_at_ms)),
        expires_at: g.as_ref().map(|g| at(g.expires_at_ms)),
        waiter_count: server.waiter_count(&key),
        lease_remaining_ms: info.lease_left_ms,
        lock_delay_remaining_ms: info.delay_left_ms,
        token_floor: Some(info.token_floor),
        key,
    }
}

/// A validated `GET /v1/locks` query (E-23).
#[derive(Debug, PartialEq, Eq)]
struct ListQuery {
    prefix: Option<String>,
    after: Option<String>,
    limit: usize,
}

/// The list's query: `prefix` and `after` a key's characters, `limit` in
/// `1..=LOCK_LIST_ITEMS_MAX`; any other parameter, or one given twice, is refused. Every
/// problem is named at once.
fn list_query(pairs: Vec<(String, String)>) -> Result<ListQuery, ApiError> {
    const KEY_RULE: &str = "must be 1 to 128 characters of [a-zA-Z0-9:._-]";
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut problems = Vec::new();
    for (name, value) in pairs {
        if !matches!(name.as_str(), "prefix" | "after" | "limit") {
            problems.push(FieldError::new(name, "is not a parameter of this listing (prefix, after, limit)"));
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
    let mut key_like = |field: &str| {
        let value = seen.get(field).cloned();
        if value.as_deref().is_some_and(|v| !is_lock_key(v)) {
            problems.push(FieldError::new(field, KEY_RULE));
        }
        value
    };
    let (prefix, after) = (key_like("prefix"), key_like("after"));
    let limit = match seen.get("limit").map(|raw| raw.parse::<usize>()) {
        None => LOCK_LIST_ITEMS_DEFAULT,
        Some(Ok(n)) if (1..=LOCK_LIST_ITEMS_MAX).contains(&n) => n,
        Some(_) => {
            problems.push(FieldError::new("limit", format!("must be an integer 1..={LOCK_LIST_ITEMS_MAX}")));
            LOCK_LIST_ITEMS_DEFAULT
        }
    };
    if !problems.is_empty() {
        return Err(ApiError::validation("the listing query is invalid", problems));
    }
    Ok(ListQuery { prefix, after, limit })
}

// E-23
/// List the keys the lock server holds (C3-extensions E-23): one page of the keys with a
/// stored grant (live, or dead and not yet removed), in key order, each exactly as L7
/// answers it. Advisory, as L7.
///
/// `nextCursor` is the page's last key, given back as `after` for the next page; it is
/// absent on the last page.
#[utoipa::path(get, path = "/v1/locks", tag = "locks", params(crate::openapi::LockListQuery),
    responses((status = 200, description = "One page of the keys with a stored grant, in key order.", body = LockList)))]
async fn list(
    State(server): State<Arc<LockServer>>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(pairs) = query.map_err(|_| {
        ApiError::validation(
            "the query string is not valid URL encoding",
            vec![FieldError::new("$query", "is malformed")],
        )
    })?;
    let q = list_query(pairs)?;
    // One key more than the page: whether another page follows.
    let read =
        server.store.held_keys(q.prefix.as_deref().unwrap_or(""), q.after.as_deref(), q.limit + 1, server.cfg.delay_ms);
    let mut page = read.await.map_err(not_leader)?;
    let more = page.len() > q.limit;
    page.truncate(q.limit);
    let items: Vec<LockInfo> = page.into_iter().map(|h| lock_info(&server, h.key, h.info)).collect();
    let next_cursor = if more { items.last().map(|i| i.key.clone()) } else { None };
    Ok(dlock_http::json(StatusCode::OK, &LockList { items, next_cursor }))
}

// L8
/// Revoke a lock (L8, operator): the next grant's token is above the revoked one.
#[utoipa::path(post, path = "/v1/locks/{key}/revoke", tag = "locks",
    params(crate::openapi::KeyPath, dlock_http::openapi::OwnerHeader),
    request_body(content = dlock_contract::lock::RevokeRequest, content_type = "application/json"),
    responses((status = 200, description = "Revoked.", body = LockOutcome)))]
async fn revoke(
    State(server): State<Arc<LockServer>>,
    Extension(trace): Extension<TraceId>,
    principal: Caller,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Result<JsonBody, ApiError>,
) -> Result<Response, ApiError> {
    let key = lock_key(&key)?;
    let owner = dlock_http::owner_id(&headers)?;
    let JsonBody(body) = body?;
    let text = |field: &str, min: usize| -> Result<String, FieldError> {
        match body.get(field).and_then(Value::as_str) {
            Some(s) if s.chars().count() >= min && s.chars().count() <= REVOKE_TEXT_CHARS_MAX => Ok(s.to_owned()),
            _ => Err(FieldError::new(field, format!("is required, {min} to {REVOKE_TEXT_CHARS_MAX} characters"))),
        }
    };
    let operator = text("operator", 1);
    let reason = text("reason", REVOKE_REASON_CHARS_MIN);
    let expected = match body.get("expectedToken") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_i64()
            .filter(|t| *t > 0)
            .map(Some)
            .ok_or_else(|| FieldError::new("expectedToken", "must be an int64 greater than zero")),
    };
    let (operator, reason, expected) = match (operator, reason, expected) {
        (Ok(o), Ok(r), Ok(e)) => (o, r, e),
        (o, r, e) => {
            let fields = [o.err(), r.err(), e.err()].into_iter().flatten().collect();
            return Err(ApiError::validation("the revoke request is invalid", fields));
        }
    };
    // The audited name: a credential bound to owner ids revokes only under one of them, so
    // the `lock.revoked` event and the log name the person the credential belongs to (E-13).
    dlock_http::auth::check_owner(principal.as_ref().map(|p| &p.0), operator.as_str())?;
    let id = dlock_rt::rand::uuid_v4();
    let (revoking, by, why) = (key.clone(), operator.clone(), reason.clone());
    let revoke = move |store: Arc<dyn crate::store::LockStore>| async move {
        store.revoke(&revoking, &by, &why, expected, id).await
    };
    match server.write(revoke).await.map_err(not_leader)? {
        Ok(r) => {
            server.metrics.revokes.inc();
            server.wake(&key);
            dlock_rt::events::emit(crate::NODE, "revoke", || {
                [
                    ("key", key.clone().into()),
                    ("token", r.revoked_token.into()),
                    ("token_floor", r.new_token_floor.into()),
                    ("store_ms", server.clock.wall().timestamp_millis().into()),
                ]
            });
            tracing::warn!(
                key = %key, operator = %operator, reason = %reason, requestedBy = %owner,
                revokedToken = r.revoked_token, newTokenFloor = r.new_token_floor, revocationId = %id, traceId = %trace.0,
                "lock_revoked"
            );
            Ok(dlock_http::json(
                StatusCode::OK,
                &LockOutcome { revoked_token: r.revoked_token, new_token_floor: r.new_token_floor, revocation_id: id },
            ))
        }
        Err(RevokeRefusal::NotHeld) => {
            Err(ApiError::new(ErrorCode::NotFound, "the key is not held; nothing to revoke")
                .with_details(json!({ "key": key })))
        }
        Err(RevokeRefusal::Stale { current_token }) => Err(ApiError::new(
            ErrorCode::FencedOut,
            "expectedToken is not the current grant's token; a newer holder exists",
        )
        .with_details(json!({ "key": key, "presentedToken": expected, "highestToken": current_token }))),
    }
}

/// Readiness (C4): the backend answers.
#[utoipa::path(get, path = "/health/ready", tag = "health",
    responses((status = 200, description = "Ready.", body = dlock_http::openapi::Health)))]
async fn ready(State(server): State<Arc<LockServer>>) -> Response {
    let backend = server.store.ping().await.map_err(|e| e.to_string());
    dlock_http::health::ready(BTreeMap::from([("backend", backend)]))
}

/// `GET /metrics` (C4), optionally only the families named by `name[]=` parameters.
#[utoipa::path(get, path = "/metrics", tag = "metrics",
    params(("name[]" = Option<Vec<String>>, Query, description = "Only these metric families (repeatable); absent: every family.")),
    responses((status = 200, description = "Prometheus text exposition.", content_type = "text/plain; version=0.0.4; charset=utf-8", body = String)))]
async fn metrics(State(server): State<Arc<LockServer>>, RawQuery(query): RawQuery) -> Response {
    let only = dlock_http::metrics::requested_families(query.as_deref());
    dlock_http::metrics::response(server.render_metrics(&only))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrupt_store_content_is_a_contradiction_and_a_lost_commit_answer_is_not() {
        let corrupt = not_leader(StoreError::Corrupt("etcd: rotate granted without a live session".into()));
        let lost = not_leader(StoreError::CommitUnknown("timeout".into()));
        let down = not_leader(StoreError::Unavailable("no leader".into()));
        assert_eq!((corrupt.code, corrupt.contradiction), (ErrorCode::Internal, true));
        assert_eq!((lost.code, lost.contradiction), (ErrorCode::Internal, false));
        assert_eq!((down.code, down.contradiction), (ErrorCode::NotLeader, false));
        assert_eq!(corrupt.message, lost.message, "the caller reads one unknown outcome either way");
    }
}
