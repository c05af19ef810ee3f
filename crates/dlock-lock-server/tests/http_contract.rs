//! The lock server's HTTP contract (C3 §3.3, L1–L8), in process over the simulation store:
//! every row and code of the table, and the envelope on every refusal. The store's own
//! semantics are held to SQL by the conformance suite; this file proves the wire.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it drives them over real sockets and bounds its own waits with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

use std::sync::Arc;

use axum::body::Body;
use dlock_contract::CONTENT_TYPE_JSON;
use dlock_lock_server::service::{LockServer, LockServerConfig};
use dlock_lock_server::store_mem::MemLockStore;
use dlock_rt::Clock;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

/// The backend under the HTTP surface. FR-09: every backend answers with identical status
/// codes and bodies, so every case below runs on each.
#[derive(Debug, Clone, Copy)]
pub enum Backend {
    Sim,
    Sqlite,
    Postgres,
    Etcd,
}

/// A server on a fresh store of `backend`, and whatever keeps that store alive.
struct Rig {
    app: axum::Router,
    server: Arc<LockServer>,
    _guard: Option<dlock_testkit::TempDir>,
}

/// The lock server's settings from its own resolver, with `keys` (C5 `lock.*`) set.
fn settings(keys: &[(&str, &str)]) -> LockServerConfig {
    let mut l = dlock_config::Layers::of(keys);
    l.set_flag("auth.credentials", dlock_testkit::auth::credentials());
    dlock_lock_server::config::resolve(&l, dlock_config::Profile::Production).expect("settings").config
}

/// A fresh store of `backend`, and whatever keeps it alive.
async fn store_of(backend: Backend) -> (Arc<dyn dlock_lock_server::store::LockStore>, Option<dlock_testkit::TempDir>) {
    match backend {
        Backend::Sim => (Arc::new(MemLockStore::new(Clock::system())), None),
        Backend::Sqlite | Backend::Postgres => {
            let db =
                if let Backend::Sqlite = backend { dlock_testkit::Db::Sqlite } else { dlock_testkit::Db::Postgres };
            let (url, dir) = dlock_testkit::fresh_database(db).await;
            (dlock_lock_server::store_sql::open(&url).await.expect("open lockdb"), Some(dir))
        }
        Backend::Etcd => {
            let raw = std::env::var("DLOCK_TEST_ETCD_ENDPOINTS")
                .expect("DLOCK_TEST_ETCD_ENDPOINTS is not set: run ./scripts/test.sh, which starts etcd");
            let endpoints: Vec<String> = raw.split(',').map(str::to_owned).collect();
            let prefix = format!("/dlock-http-{}", uuid::Uuid::new_v4().simple());
            let store = dlock_lock_server::store_etcd::EtcdLockStore::connect(&endpoints, &prefix).await.expect("etcd");
            (Arc::new(store), None)
        }
    }
}

async fn app_with(backend: Backend, keys: &[(&str, &str)]) -> Rig {
    let cfg = settings(keys);
    let (store, guard) = store_of(backend).await;
    let server = LockServer::new(store, cfg, Clock::system());
    Rig { app: dlock_lock_server::app::router(server.clone()), server, _guard: guard }
}

/// A server on a fresh store of `backend` behind authentication with `credentials` (the
/// credentials file's text), as every process serves.
async fn app_with_credentials(backend: Backend, credentials: &str) -> Rig {
    let mut l = dlock_config::Layers::of(&[]);
    l.set_flag("auth.credentials", credentials.to_owned());
    let cfg = dlock_lock_server::config::resolve(&l, dlock_config::Profile::Production).expect("settings").config;
    let auth = dlock_http::auth::Authenticator::new(
        dlock_lock_server::NODE,
        dlock_contract::auth::LOCK_SERVER_ROUTES,
        &cfg.auth,
        Clock::system(),
    )
    .expect("credentials");
    assert!(auth.is_some(), "authentication is on");
    let (store, guard) = store_of(backend).await;
    let server = LockServer::new(store, cfg, Clock::system());
    Rig { app: dlock_lock_server::app::router_with_auth(server.clone(), auth), server, _guard: guard }
}

async fn call(
    app: &axum::Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, Value) {
    let mut b = axum::http::Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = match body {
        Some(v) => b.header("content-type", "application/json").body(Body::from(v.to_string())),
        None => b.body(Body::empty()),
    }
    .expect("request");
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status().as_u16();
    if status >= 400 {
        let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        assert_eq!(ct, CONTENT_TYPE_JSON, "{method} {uri}");
    }
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

const OWNER: (&str, &str) = ("x-owner-id", "worker-1");

async fn session(app: &axum::Router, owner: &str, ttl: i64) -> String {
    let (s, v) = call(app, "POST", "/v1/sessions", &[("x-owner-id", owner)], Some(json!({ "ttlMillis": ttl }))).await;
    assert_eq!(s, 201, "{v}");
    v["sessionId"].as_str().expect("sessionId").to_owned()
}

async fn acquire(app: &axum::Router, key: &str, sid: &str, owner: &str, extra: Value) -> (u16, Value) {
    let mut body = json!({ "sessionId": sid });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    call(app, "POST", &format!("/v1/locks/{key}/acquire"), &[("x-owner-id", owner)], Some(body)).await
}

async fn l1_opens_a_session_with_the_ttl_clamped_into_range(backend: Backend) {
    let rig = app_with(backend, &[]).await;
    let app = rig.app.clone();
    for (asked, granted) in [(5, 1_000), (5_000, 5_000), (600_000, 60_000)] {
        let (s, v) = call(&app, "POST", "/v1/sessions", &[OWNER], Some(json!({ "ttlMillis": asked }))).await;
        assert_eq!(s, 201);
        assert_eq!(v["ttlMillis"], granted);
        assert_eq!(v["ownerId"], "worker-1");
        assert!(v["expiresAt"].as_str().is_some_and(|t| t.ends_with('Z')));
    }
    // ownerId in the body instead of the header.
    let (s, v) = call(&app, "POST", "/v1/sessions", &[], Some(json!({ "ownerId": "w-2" }))).await;
    assert_eq!((s, v["ownerId"].as_str()), (201, Some("w-2")));
    // Neither, or disagreeing: VALIDATION_FAILED.
    let (s, v) = call(&app, "POST", "/v1/sessions", &[], Some(json!({}))).await;
    assert_eq!((s, v["code"].as_str()), (400, Some("VALIDATION_FAILED")));
    let (s, _) = call(&app, "POST", "/v1/sessions", &[OWNER], Some(json!({ "ownerId": "other" }))).await;
    assert_eq!(s, 400);
}

async fn l2_heartbeat_reports_held_locks_and_server_time_and_distinguishes_unknown(backend: Backend) {
    let rig = app_with(backend, &[]).await;
    let app = rig.app.clone();
    let sid = session(&app, "worker-1", 5_000).await;
    assert_eq!(acquire(&app, "k1", &sid, "worker-1", json!({})).await.0, 200);
    let (s, v) = call(&app, "POST", &format!("/v1/sessions/{sid}/heartbeat"), &[OWNER], None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["heldLockCount"], 1);
    assert!(v["serverTime"].is_string() && v["expiresAt"].is_string());
    let unknown = uuid::Uuid::new_v4();
    let (s, v) = call(&app, "POST", &format!("/v1/sessions/{unknown}/heartbeat"), &[OWNER], None).await;
    assert_eq!((s, v["code"].as_str(), v["retrySafe"].as_bool()), (404, Some("SESSION_UNKNOWN"), Some(false)));
}

async fn l2_lapsed_session_is_expired_not_unknown(backend: Backend) {
    let rig = app_with(backend, &[]).await;
    let (app, server) = (rig.app.clone(), rig.server.clone());
    let (_, opened) = call(&app, "POST", "/v1/sessions", &[OWNER], Some(json!({ "ttlMillis": 1_000 }))).await;
    let sid = opened["sessionId"].as_str().expect("sessionId").to_owned();
    let expires = chrono::DateTime::parse_from_rfc3339(opened["expiresAt"].as_str().expect("expiresAt"))
        .expect("rfc3339")
        .timestamp_millis();
    // Wait on the backend's clock (not by heartbeating, which would keep it alive).
    let lapsed = dlock_rt::wait_until(dlock_rt::Duration::from_millis(20), dlock_rt::Duration::from_secs(5), || {
        let server = server.clone();
        async move { server.store.now_ms().await.ok().filter(|now| *now > expires) }
    })
    .await;
    assert!(lapsed.is_some());
    let (s, v) = call(&app, "POST", &format!("/v1/sessions/{sid}/heartbeat"), &[OWNER], None).await;
    assert_eq!((s, v["code"].as_str()), (410, Some("SESSION_EXPIRED")));
}

async fn l3_closing_a_session_releases_its_locks_and_forgets_it(backend: Backend) {
    let rig = app_with(backend, &[]).await;
    let app = rig.app.clone();
    let a = session(&app, "worker-1", 5_000).await;
    let b = session(&app, "worker-2", 5_000).await;
    assert_eq!(acquire(&app, "k", &a, "worker-1", json!({})).await.0, 200);
    let (s, _) = call(&app, "DELETE", &format!("/v1/sessions/{a}"), &[OWNER], None).await;
    assert_eq!(s, 204);
    assert_eq!(acquire(&app, "k", &b, "worker-2", json!({})).await.0, 200);
    let (s, v) = call(&app, "DELETE", &format!("/v1/sessions/{a}"), &[OWNER], None).await;
    assert_eq!((s, v["code"].as_str()), (404, Some("SESSION_UNKNOWN")));
}

async fn l4_grants_a_fresh_token_and_contended_answers_name_the_holder(backend: Backend) {
    let rig = app_with(backend, &[]).await;
    let app = rig.app.clone();
    let a = session(&app, "worker-1", 5_000).await;
    let b = session(&app, "worker-2", 5_000).await;
    let (s, g) = acquire(&app, "payout:acct-1", &a, "worker-1", json!({ "ttlMillis": 4_000 })).await;
    assert_eq!(s, 200, "{g}");
    for field in ["key", "ownerId", "sessionId", "fencingToken", "acquiredAt", "expiresAt"] {
        assert!(!g[field].is_null(), "LockGrant.{field} missing: {g}");
    }
    let (s, v) = acquire(&app, "payout:acct-1", &b, "worker-2", json!({})).await;
    assert_eq!(s, 409);
    assert_eq!(v["code"], "LOCK_CONTENDED");
    assert_eq!(v["retrySafe"], true);
    assert!(v["retryAfterMillis"].as_u64().is_some_and(|ms| ms > 0));
    assert_eq!(v["details"]["holderOwnerId"], "worker-1");
    assert_eq!(v["details"]["expiresAt"], g["expiresAt"]);
    // A later grant of another key gets a larger token.
    let (_, g2) = acquire(&app, "payout:acct-2", &b, "worker-2", json!({})).await;
    assert!(g2["fencingToken"].as_i64() > g["fencingToken"].as_i64());
}

async fn l4_rejects_bad_keys_and_out_of_range_waits(backend: Backend) {
    let rig = app_with(backend, &[]).await;
    let app = rig.app.clone();
    let a = session(&app, "worker-1", 5_000).await;
    let long = "k".repeat(129);
    for key in ["bad%20key", long.as_str()] {
        let (s, v) = acquire(&app, key, &a, "worker-1", json!({})).await;
        assert_eq!((s, v["code"].as_str()), (400, Some("VALIDATION_FAILED")), "{key}");
    }
    let (s, v) = acquire(&app, "k", &a, "worker-1", json!({ "waitMillis": 30_001 })).await;
    assert_eq!((s, v["code"].as_str()), (400, Some("VALIDATION_FAILED")));
    let (s, v) = acquire(&app, "k", "not-a-uuid", "worker-1", json!({})).await;
    assert_eq!((s, v["code"].as_str()), (400, Some("VALIDATION_FAILED")));
    let unknown = uuid::Uuid::new_v4().to_string();
    let (s, v) = acquire(&app, "k", &unknown, "worker-1", json!({})).await;
    assert_eq!((s, v["code"].as_str()), (404, Some("SESSION_UNKNOWN")));
    let (s, v) = call(&app, "POST", "/v1/locks/k/acquire", &[], Some(json!({ "sessionId": a }))).await;
    assert_eq!((s, v["code"].as_str()), (400, Some("VALIDATION_FAILED")), "X-Owner-Id is required");
}

async fn l4_waiter_is_granted_when_the_holder_releases(backend: Backend) {
    let rig = app_with(backend, &[]).await;
    let app = rig.app.clone();
    let a = session(&app, "worker-1", 10_000).await;
    let b = session(&app, "worker-2", 10_000).await;
    let (_, g) = acquire(&app, "k", &a, "worker-1", json!({})).await;
    let token = g["fencingToken"].as_i64().expect("token").to_string();
    let waiter = {
        let app = app.clone();
        let b = b.clone();
        tokio::spawn(async move { acquire(&app, "k", &b, "worker-2", json!({ "waitMillis": 5_000 })).await })
    };
    let queued = dlock_rt::wait_until(dlock_rt::Duration::from_millis(10), dlock_rt::Duration::from_secs(5), || {
        let app = app.clone();
        async move { (call(&app, "GET", "/v1/locks/k", &[], None).await.1["waiterCount"] == 1).then_some(()) }
    })
    .await;
    assert!(queued.is_some(), "the waiter never queued");
    let (s, _) =
        call(&app, "DELETE", "/v1/locks/k", &[OWNER, ("x-fencing-token", &token)], Some(json!({ "sessionId": a })))
            .await;
    assert_eq!(s, 204);
    let (s, g2) = waiter.await.expect("waiter");
    assert_eq!(s, 200, "{g2}");
    assert_eq!(g2["ownerId"], "worker-2");
    assert!(g2["fencingToken"].as_i64() > g["fencingToken"].as_i64());
}

async fn l4_waiters_past_the_cap_get_contention_exceeded(backend: Backend) {
    let rig = app_with(backend, &[("lock.waiters-max", "1")]).await;
    let (app, _server) = (rig.app.clone(), rig.server.clone());
    let a = session(&app, "worker-1", 10_000).await;
    let b = session(&app, "worker-2", 10_000).await;
    let c = session(&app, "worker-3", 10_000).await;
    assert_eq!(acquire(&app, "k", &a, "worker-1", json!({})).await.0, 200);
    let first = {
        let app = app.clone();
        tokio::spawn(async move { acquire(&app, "k", &b, "worker-2", json!({ "waitMillis": 1_000 })).await })
    };
    let queued = dlock_rt::wait_until(dlock_rt::Duration::from_millis(10), dlock_rt::Duration::from_secs(5), || {
        let app = app.clone();
        async move { (call(&app, "GET", "/v1/locks/k", &[], None).await.1["waiterCount"] == 1).then_some(()) }
    })
    .await;
    assert!(queued.is_some());
    let (s, v) = acquire(&app, "k", &c, "worker-3", json!({ "waitMillis": 1_000 })).await;
    assert_eq!((s, v["code"].as_str()), (429, Some("CONTENTION_EXCEEDED")));
    assert!(v["retryAfterMillis"].as_u64().is_some_and(|ms| ms > 0));
    // The first waiter times out with LOCK_CONTENDED, and leaves the queue.
    let (s, v) = first.await.expect("waiter");
    assert_eq!((s, v["code"].as_str()), (409, Some("LOCK_CONTENDED")));
    assert_eq!(call(&app, "GET", "/v1/locks/k", &[], None).await.1["waiterCount"], 0);
}

async fn l5_renew_keeps_the_token_and_a_dead_grant_is_lock_lost(backend: Backend) {
    let rig = app_with(backend, &[]).await;
    let app = rig.app.clone();
    let a = session(&app, "worker-1", 10_000).await;
    let (_, g) = acquire(&app, "k", &a, "worker-1", json!({ "ttlMillis": 2_000 })).await;
    let token = g["fencingToken"].as_i64().expect("token").to_string();
    let (s, r) = call(
        &app,
        "POST",
        "/v1/locks/k/renew",
        &[OWNER, ("x-fencing-token", &token)],
        Some(json!({ "sessionId": a, "ttlMillis": 5_000 })),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["fencingToken"], g["fencingToken"]);
    assert!(r["expiresAt"].as_str() > g["expiresAt"].as_str());
    let (s, v) = call(
        &app,
        "POST",
        "/v1/locks/k/renew",
        &[OWNER, ("x-fencing-token", "999999")],
        Some(json!({ "sessionId": a })),
    )
    .await;
    assert_eq!((s, v["code"].as_str()), (409, Some("LOCK_LOST")));
    assert_eq!(v["details"]["storedToken"], g["fencingToken"]);
    for bad in ["0", "-3", "05", ""] {
        let (s, v) = call(
            &app,
            "POST",
            "/v1/locks/k/renew",
            &[OWNER, ("x-fencing-token", bad)],
            Some(json!({ "sessionId": a })),
        )
        .await;
        assert_eq!((s, v["code"].as_str()), (400, Some("INVALID_TOKEN")), "{bad:?}");
    }
}

/// E-18: rotate answers a new grant of the same session with a greater token; the old token
/// is then stale; a foreign or stale rotate is LOCK_LOST and changes nothing; the checks are
/// renew's.
async fn e18_rotate_grants_a_greater_token_to_the_holder_and_a_stale_one_is_lock_lost(backend: Backend) {
    let rig = app_with(backend, &[]).await;
    let app = rig.app.clone();
    let a = session(&app, "worker-1", 10_000).await;
    let b = session(&app, "worker-2", 10_000).await;
    let (_, g) = acquire(&app, "k", &a, "worker-1", json!({ "ttlMillis": 2_000 })).await;
    let t1 = g["fencingToken"].as_i64().expect("token");
    let rotate = |token: String, sid: String| {
        let app = app.clone();
        async move {
            call(
                &app,
                "POST",
                "/v1/locks/k/rotate",
                &[OWNER, ("x-fencing-token", &token)],
                Some(json!({ "sessionId": sid, "ttlMillis": 5_000 })),
            )
            .await
        }
    };
    // Another session presenting the holder's token: refused, nothing changes.
    let (s, v) = rotate(t1.to_string(), b.clone()).await;
    assert_eq!((s, v["code"].as_str()), (409, Some("LOCK_LOST")), "{v}");
    assert_eq!(v["details"]["storedToken"], g["fencingToken"]);
    let (s, r) = rotate(t1.to_string(), a.clone()).await;
    assert_eq!(s, 200, "{r}");
    let t2 = r["fencingToken"].as_i64().expect("token");
    assert!(t2 > t1, "rotated {t2} over {t1}");
    assert_eq!((r["key"].as_str(), r["sessionId"].as_str()), (Some("k"), Some(a.as_str())));
    let (_, info) = call(&app, "GET", "/v1/locks/k", &[], None).await;
    assert_eq!((info["held"].as_bool(), info["fencingToken"].as_i64()), (Some(true), Some(t2)));
    // The old token rotates nothing now.
    let (s, v) = rotate(t1.to_string(), a.clone()).await;
    assert_eq!((s, v["code"].as_str()), (409, Some("LOCK_LOST")));
    assert_eq!(v["details"]["storedToken"].as_i64(), Some(t2));
    for bad in ["0", "-3", "05", ""] {
        let (s, v) = rotate(bad.to_owned(), a.clone()).await;
        assert_eq!((s, v["code"].as_str()), (400, Some("INVALID_TOKEN")), "{bad:?}");
    }
    let ghost = uuid::Uuid::new_v4().to_string();
    let (s, v) = rotate(t2.to_string(), ghost).await;
    assert_eq!((s, v["code"].as_str()), (404, Some("SESSION_UNKNOWN")));
}

async fn l6_stale_release_is_lock_lost_and_never_frees_the_newer_grant(backend: Backend) {
    let rig = app_with(backend, &[]).await;
    let app = rig.app.clone();
    let a = session(&app, "worker-1", 10_000).await;
    let b = session(&app, "worker-2", 10_000).await;
    let (_, g1) = acquire(&app, "k", &a, "worker-1", json!({})).await;
    let t1 = g1["fencingToken"].as_i64().expect("token").to_string();
    assert_eq!(call(&app, "DELETE", &format!("/v1/sessions/{a}"), &[OWNER], None).await.0, 204);
    let (_, g2) = acquire(&app, "k", &b, "worker-2", json!({})).await;
    // The old holder's release, with its old token: benign LOCK_LOST; the new grant stands.
    let (s, v) =
        call(&app, "DELETE", &format!("/v1/locks/k?sessionId={a}"), &[OWNER, ("x-fencing-token", &t1)], None).await;
    assert_eq!((s, v["code"].as_str()), (409, Some("LOCK_LOST")));
    assert_eq!(v["details"]["storedToken"], g2["fencingToken"]);
    let (_, info) = call(&app, "GET", "/v1/locks/k", &[], None).await;
    assert_eq!((info["held"].as_bool(), info["fencingToken"].clone()), (Some(true), g2["fencingToken"].clone()));
}

async fn l7_info_is_404_for_a_never_seen_key_and_advisory_otherwise(backend: Backend) {
    let rig = app_with(backend, &[]).await;
    let app = rig.app.clone();
    let (s, v) = call(&app, "GET", "/v1/locks/never", &[], None).await;
    assert_eq!((s, v["code"].as_str()), (404, Some("NOT_FOUND")));
    let a = session(&app, "worker-1", 10_000).await;
    let (_, g) = acquire(&app, "k", &a, "worker-1", json!({})).await;
    let (s, v) = call(&app, "GET", "/v1/locks/k", &[], None).await;
    assert_eq!(s, 200);
    assert_eq!(v["held"], true);
    assert_eq!(v["ownerId"], "worker-1");
    assert_eq!(v["fencingToken"], g["fencingToken"]);
    assert_eq!(v["waiterCount"], 0);
    let token = g["fencingToken"].as_i64().expect("token").to_string();
    call(&app, "DELETE", "/v1/locks/k", &[OWNER, ("x-fencing-token", &token)], Some(json!({ "sessionId": a }))).await;
    let (s, v) = call(&app, "GET", "/v1/locks/k", &[], None).await;
    assert_eq!((s, v["held"].as_bool()), (200, Some(false)));
    assert!(v.get("fencingToken").is_none());
}

/// An item of the list as L7 answers the key, but for the lease left (judged at each read).
fn judged_elsewhere(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("leaseRemainingMs");
    }
    v
}

async fn e23_lists_the_held_keys_in_pages_each_as_l7_answers_it_and_refuses_a_bad_query(backend: Backend) {
    let rig = app_with(backend, &[]).await;
    let app = rig.app.clone();
    let (s, v) = call(&app, "GET", "/v1/locks", &[], None).await;
    assert_eq!((s, v), (200, json!({ "items": [] })), "nothing held: an empty last page");
    let a = session(&app, "worker-1", 10_000).await;
    for key in ["k:c", "k:a", "k:b", "other"] {
        let (s, v) = acquire(&app, key, &a, "worker-1", json!({})).await;
        assert_eq!(s, 200, "{key}: {v}");
    }
    let (_, b) = call(&app, "GET", "/v1/locks/k:b", &[], None).await;
    let token = b["fencingToken"].as_i64().expect("token").to_string();
    let released = json!({ "sessionId": a });
    call(&app, "DELETE", "/v1/locks/k:b", &[OWNER, ("x-fencing-token", &token)], Some(released)).await;
    // Pages of one under `k:`: each item is L7's body, and the cursor leads to the next.
    let (s, first) = call(&app, "GET", "/v1/locks?prefix=k:&limit=1", &[], None).await;
    assert_eq!(s, 200, "{first}");
    assert_eq!(first["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(first["nextCursor"], "k:a");
    let (_, l7) = call(&app, "GET", "/v1/locks/k:a", &[], None).await;
    assert_eq!(judged_elsewhere(first["items"][0].clone()), judged_elsewhere(l7), "the list and L7 agree");
    assert!(first["items"][0]["leaseRemainingMs"].as_i64().is_some_and(|ms| ms > 0 && ms <= 10_000));
    let (s, last) = call(&app, "GET", "/v1/locks?prefix=k:&after=k:a&limit=1", &[], None).await;
    assert_eq!(s, 200, "{last}");
    let keys: Vec<&Value> = last["items"].as_array().expect("items").iter().map(|i| &i["key"]).collect();
    assert_eq!(keys, [&json!("k:c")], "the released k:b is not listed");
    assert!(last.get("nextCursor").is_none(), "the last page has no cursor: {last}");
    let (_, all) = call(&app, "GET", "/v1/locks", &[], None).await;
    let keys: Vec<&str> = all["items"].as_array().expect("items").iter().filter_map(|i| i["key"].as_str()).collect();
    assert_eq!(keys, ["k:a", "k:c", "other"]);
    // A bad query is refused, naming every bad parameter.
    let bad = [
        ("limit=0", vec!["limit"]),
        ("limit=501", vec!["limit"]),
        ("limit=ten", vec!["limit"]),
        ("prefix=bad%20key", vec!["prefix"]),
        ("after=", vec!["after"]),
        ("limit=1&limit=2", vec!["limit"]),
        ("cursor=k:a&prefix=k%2F", vec!["cursor", "prefix"]),
    ];
    for (query, fields) in bad {
        let (s, v) = call(&app, "GET", &format!("/v1/locks?{query}"), &[], None).await;
        assert_eq!((s, v["code"].as_str()), (400, Some("VALIDATION_FAILED")), "{query}: {v}");
        let named: Vec<&str> =
            v["details"]["fields"].as_array().expect("fields").iter().filter_map(|f| f["field"].as_str()).collect();
        assert_eq!(named, fields, "{query}");
    }
}

async fn l8_revoke_raises_the_floor_and_validates_its_request(backend: Backend) {
    let rig = app_with(backend, &[]).await;
    let app = rig.app.clone();
    let a = session(&app, "worker-1", 10_000).await;
    let b = session(&app, "worker-2", 10_000).await;
    let (_, g) = acquire(&app, "k", &a, "worker-1", json!({})).await;
    let revoke = |body: Value| {
        let app = app.clone();
        async move { call(&app, "POST", "/v1/locks/k/revoke", &[("x-owner-id", "ops")], Some(body)).await }
    };
    let (s, v) = revoke(json!({ "operator": "alice", "reason": "short" })).await;
    assert_eq!((s, v["code"].as_str()), (400, Some("VALIDATION_FAILED")));
    let (s, v) =
        revoke(json!({ "operator": "alice", "reason": "stuck holder on acct", "expectedToken": 1_000_000 })).await;
    assert_eq!((s, v["code"].as_str()), (409, Some("FENCED_OUT")));
    let (s, v) =
        revoke(json!({ "operator": "alice", "reason": "stuck holder on acct", "expectedToken": g["fencingToken"] }))
            .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["revokedToken"], g["fencingToken"]);
    assert!(v["newTokenFloor"].as_i64() > g["fencingToken"].as_i64());
    assert!(v["revocationId"].is_string());
    let (s, v2) = revoke(json!({ "operator": "alice", "reason": "stuck holder on acct" })).await;
    assert_eq!((s, v2["code"].as_str()), (404, Some("NOT_FOUND")));
    // Every later grant exceeds the floor.
    let (_, g2) = acquire(&app, "k", &b, "worker-2", json!({})).await;
    assert!(g2["fencingToken"].as_i64() > v["newTokenFloor"].as_i64());
}

async fn every_refusal_is_the_envelope(backend: Backend) {
    let rig = app_with(backend, &[]).await;
    let app = rig.app.clone();
    for (method, uri) in [("GET", "/v1/nope"), ("PUT", "/v1/sessions"), ("GET", "/v1/locks/k/acquire")] {
        let (s, v) = call(&app, method, uri, &[], None).await;
        assert!(s == 404 || s == 405, "{method} {uri}: {s}");
        assert!(v["code"].is_string() && v["traceId"].is_string(), "{v}");
    }
}

/// A store whose backend is gone: every call fails as an unreachable database would.
struct Unreachable;

#[async_trait::async_trait]
impl dlock_lock_server::store::LockStore for Unreachable {
    async fn ping(&self) -> Result<(), StoreError> {
        Err(gone())
    }
    async fn now_ms(&self) -> Result<i64, StoreError> {
        Err(gone())
    }
    async fn open_session(&self, _: uuid::Uuid, _: &str, _: i64) -> Result<SessionRow, StoreError> {
        Err(gone())
    }
    async fn heartbeat(&self, _: uuid::Uuid) -> Result<Result<(SessionRow, i64), SessionRefusal>, StoreError> {
        Err(gone())
    }
    async fn close_session(&self, _: uuid::Uuid, _: i64) -> Result<Result<(), SessionRefusal>, StoreError> {
        Err(gone())
    }
    async fn acquire(
        &self,
        _: &str,
        _: uuid::Uuid,
        _: i64,
        _: i64,
    ) -> Result<Result<GrantRow, AcquireRefusal>, StoreError> {
        Err(gone())
    }
    async fn renew(
        &self,
        _: &str,
        _: uuid::Uuid,
        _: i64,
        _: i64,
    ) -> Result<Result<GrantRow, RenewRefusal>, StoreError> {
        Err(gone())
    }
    async fn release(&self, _: &str, _: i64) -> Result<Result<(), Option<i64>>, StoreError> {
        Err(gone())
    }
    async fn owner_of(&self, _: dlock_lock_server::store::Addressed<'_>) -> Result<Option<String>, StoreError> {
        Err(gone())
    }
    async fn rotate(
        &self,
        _: &str,
        _: uuid::Uuid,
        _: i64,
        _: i64,
        _: i64,
    ) -> Result<Result<GrantRow, dlock_lock_server::store::RotateRefusal>, StoreError> {
        Err(gone())
    }
    async fn info(&self, _: &str, _: i64) -> Result<Option<KeyInfo>, StoreError> {
        Err(gone())
    }
    async fn held_keys(
        &self,
        _: &str,
        _: Option<&str>,
        _: usize,
        _: i64,
    ) -> Result<Vec<dlock_lock_server::store::HeldKey>, StoreError> {
        Err(gone())
    }
    async fn revoke(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: Option<i64>,
        _: uuid::Uuid,
    ) -> Result<Result<Revocation, RevokeRefusal>, StoreError> {
        Err(gone())
    }
    async fn reap(&self, _: i64, _: i64, _: i64) -> Result<ReapReport, StoreError> {
        Err(gone())
    }
    async fn read_events(&self, _: i64, _: usize) -> Result<dlock_lock_server::store::EventRead, StoreError> {
        Err(gone())
    }
    async fn purge_events(&self, _: i64) -> Result<u64, StoreError> {
        Err(gone())
    }
}

fn gone() -> StoreError {
    StoreError::Unavailable("connection refused".into())
}

use dlock_lock_server::store::{
    AcquireRefusal, GrantRow, KeyInfo, ReapReport, RenewRefusal, Revocation, RevokeRefusal, SessionRefusal, SessionRow,
    StoreError,
};

/// A request: method, path, JSON body, headers.
type Case = (&'static str, String, Option<Value>, Vec<(&'static str, &'static str)>);

#[tokio::test]
async fn an_unreachable_backend_is_not_leader_never_a_guess() {
    let server = LockServer::new(Arc::new(Unreachable), settings(&[]), Clock::system());
    let app = dlock_lock_server::app::router(server);
    let sid = uuid::Uuid::new_v4().to_string();
    let cases: Vec<Case> = vec![
        ("POST", "/v1/sessions".into(), Some(json!({})), vec![OWNER]),
        ("POST", format!("/v1/sessions/{sid}/heartbeat"), None, vec![OWNER]),
        ("DELETE", format!("/v1/sessions/{sid}"), None, vec![OWNER]),
        ("POST", "/v1/locks/k/acquire".into(), Some(json!({ "sessionId": sid })), vec![OWNER]),
        ("POST", "/v1/locks/k/renew".into(), Some(json!({ "sessionId": sid })), vec![OWNER, ("x-fencing-token", "5")]),
        ("POST", "/v1/locks/k/rotate".into(), Some(json!({ "sessionId": sid })), vec![OWNER, ("x-fencing-token", "5")]),
        ("DELETE", format!("/v1/locks/k?sessionId={sid}"), None, vec![OWNER, ("x-fencing-token", "5")]),
        ("GET", "/v1/locks/k".into(), None, vec![]),
        ("GET", "/v1/locks?prefix=k".into(), None, vec![]),
        ("POST", "/v1/locks/k/revoke".into(), Some(json!({ "operator": "o", "reason": "long enough" })), vec![OWNER]),
    ];
    for (method, uri, body, headers) in cases {
        let (s, v) = call(&app, method, &uri, &headers, body).await;
        assert_eq!((s, v["code"].as_str()), (503, Some("NOT_LEADER")), "{method} {uri}: {v}");
        assert_eq!(v["retrySafe"], true);
        assert!(v["retryAfterMillis"].as_u64().is_some_and(|ms| ms > 0));
        assert!(!v.to_string().contains("connection refused"), "internal cause leaked: {v}");
    }
    let (s, v) = call(&app, "GET", "/health/ready", &[], None).await;
    assert_eq!((s, v["code"].as_str()), (503, Some("NOT_READY")));
    assert_eq!(call(&app, "GET", "/health/live", &[], None).await.0, 200);
}

async fn a_waiter_whose_session_lapses_while_it_waits_is_never_granted(backend: Backend) {
    let rig = app_with(backend, &[("lock.wait.poll-ms", "10")]).await;
    let (app, server) = (rig.app.clone(), rig.server.clone());
    let holder = session(&app, "holder", 30_000).await;
    let waiter = session(&app, "waiter", 1_000).await;
    let (_, g) = acquire(&app, "k", &holder, "holder", json!({})).await;
    let token = g["fencingToken"].as_i64().expect("token").to_string();
    let waiting = {
        let app = app.clone();
        let waiter = waiter.clone();
        tokio::spawn(async move { acquire(&app, "k", &waiter, "waiter", json!({ "waitMillis": 10_000 })).await })
    };
    // The waiter sends no heartbeat: wait on the backend's clock until its session lapsed.
    let lapsed = dlock_rt::wait_until(dlock_rt::Duration::from_millis(20), dlock_rt::Duration::from_secs(5), || {
        let server = server.clone();
        let waiter = waiter.clone();
        async move {
            let id = uuid::Uuid::parse_str(&waiter).ok()?;
            let acquired = server.store.acquire("probe", id, 1_000, 0).await.ok()?;
            matches!(acquired, Err(AcquireRefusal::Session(SessionRefusal::Expired))).then_some(())
        }
    })
    .await;
    assert!(lapsed.is_some(), "the waiter's session never lapsed");
    let released = call(
        &app,
        "DELETE",
        "/v1/locks/k",
        &[("x-owner-id", "holder"), ("x-fencing-token", &token)],
        Some(json!({ "sessionId": holder })),
    )
    .await;
    assert_eq!(released.0, 204);
    let (s, v) = waiting.await.expect("waiter");
    assert_eq!((s, v["code"].as_str()), (410, Some("SESSION_EXPIRED")), "{v}");
    let (_, info) = call(&app, "GET", "/v1/locks/k", &[], None).await;
    assert_eq!(info["held"], false, "the lapsed waiter was granted: {info}");
}

async fn l4_waiters_are_granted_in_arrival_order(backend: Backend) {
    let rig = app_with(backend, &[("lock.wait.poll-ms", "5")]).await;
    let (app, _server) = (rig.app.clone(), rig.server.clone());
    let holder = session(&app, "holder", 30_000).await;
    let (_, g) = acquire(&app, "k", &holder, "holder", json!({})).await;
    let mut token = g["fencingToken"].as_i64().expect("token").to_string();
    let mut owner = "holder".to_owned();
    let mut sid = holder;
    // Three waiters, queued one after the other (each seen in the queue before the next).
    let mut waiters = Vec::new();
    for i in 0..3 {
        let name = format!("waiter-{i}");
        let s = session(&app, &name, 30_000).await;
        let handle = {
            let (app, s, name) = (app.clone(), s.clone(), name.clone());
            tokio::spawn(async move { acquire(&app, "k", &s, &name, json!({ "waitMillis": 20_000 })).await })
        };
        let queued = dlock_rt::wait_until(dlock_rt::Duration::from_millis(5), dlock_rt::Duration::from_secs(5), || {
            let app = app.clone();
            async move { (call(&app, "GET", "/v1/locks/k", &[], None).await.1["waiterCount"] == i + 1).then_some(()) }
        })
        .await;
        assert!(queued.is_some(), "waiter {i} never queued");
        waiters.push((name, s, handle));
    }
    // Each release hands the key to the longest-waiting request.
    for (name, s, handle) in waiters {
        let (st, _) = call(
            &app,
            "DELETE",
            &format!("/v1/locks/k?sessionId={sid}"),
            &[("x-owner-id", &owner), ("x-fencing-token", &token)],
            None,
        )
        .await;
        assert_eq!(st, 204);
        let (st, g) = handle.await.expect("waiter");
        assert_eq!(st, 200, "{g}");
        assert_eq!(g["ownerId"], name.as_str(), "the key skipped the head of the queue");
        token = g["fencingToken"].as_i64().expect("token").to_string();
        owner = name;
        sid = s;
    }
}

async fn l4_a_no_wait_request_does_not_barge_past_waiters(backend: Backend) {
    // The waiter polls the store rarely, so only an explicit wake moves it.
    let rig = app_with(backend, &[("lock.wait.poll-ms", "60000")]).await;
    let (app, server) = (rig.app.clone(), rig.server.clone());
    let holder = session(&app, "holder", 30_000).await;
    let waiter = session(&app, "waiter", 30_000).await;
    let barger = session(&app, "barger", 30_000).await;
    let (_, g) = acquire(&app, "k", &holder, "holder", json!({})).await;
    let waiting = {
        let (app, waiter) = (app.clone(), waiter.clone());
        tokio::spawn(async move { acquire(&app, "k", &waiter, "waiter", json!({ "waitMillis": 10_000 })).await })
    };
    let queued = dlock_rt::wait_until(dlock_rt::Duration::from_millis(5), dlock_rt::Duration::from_secs(5), || {
        let app = app.clone();
        async move { (call(&app, "GET", "/v1/locks/k", &[], None).await.1["waiterCount"] == 1).then_some(()) }
    })
    .await;
    assert!(queued.is_some(), "the waiter never queued");
    // Free the key behind the queue's back (as another replica's release would).
    let token = g["fencingToken"].as_i64().expect("token");
    assert_eq!(server.store.release("k", token).await.expect("release"), Ok(()));
    let (s, v) = acquire(&app, "k", &barger, "barger", json!({})).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (409, Some("LOCK_CONTENDED")),
        "a no-wait request took the key from the queue: {v}"
    );
    server.wake("k");
    let (s, g2) = waiting.await.expect("waiter");
    assert_eq!((s, g2["ownerId"].as_str()), (200, Some("waiter")), "{g2}");
}

/// E-14: with a signing key, acquire and renew both answer the grant's signature
/// (`fencingSignature`) over (key, token, owner), whatever the backend; without one, none.
async fn acquire_and_renew_answer_the_grant_signature(backend: Backend) {
    let mut rig = app_with(backend, &[]).await;
    let app = rig.app.clone();
    let a = session(&app, "worker-1", 10_000).await;
    let (_, unsigned) = acquire(&app, "payout:acct-9", &a, "worker-1", json!({})).await;
    assert!(unsigned.get("fencingSignature").is_none(), "{unsigned}");
    let mut cfg = settings(&[]);
    cfg.signer = Some(dlock_contract::grant::testing::signer());
    let signed = LockServer::new(rig.server.store.clone(), cfg, Clock::system());
    rig.app = dlock_lock_server::app::router(signed);
    let app = rig.app.clone();
    let b = session(&app, "worker-1", 10_000).await;
    let (s, g) = acquire(&app, "payout:acct-1", &b, "worker-1", json!({})).await;
    assert_eq!(s, 200, "{g}");
    let token = g["fencingToken"].as_i64().expect("token");
    let sig = g["fencingSignature"].as_str().expect("signed").to_owned();
    let v = dlock_contract::grant::testing::verifier();
    assert_eq!(
        v.verify(Some(&sig), "payout:acct-1", token, Some("worker-1")),
        Ok(dlock_contract::grant::Verdict::Signed)
    );
    let t = token.to_string();
    let (s, r) = call(
        &app,
        "POST",
        "/v1/locks/payout:acct-1/renew",
        &[OWNER, ("x-fencing-token", &t)],
        Some(json!({ "sessionId": b })),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["fencingSignature"].as_str(), Some(sig.as_str()));
}

/// `GET /metrics` as text.
async fn metrics_text(app: &axum::Router) -> String {
    let req = axum::http::Request::builder().uri("/metrics").body(Body::empty()).expect("request");
    let resp = app.clone().oneshot(req).await.expect("response");
    assert_eq!(resp.status(), 200);
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8(bytes.to_vec()).expect("utf8")
}

/// The value of the sample line `series` in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.parse().ok()))
}

async fn metrics_time_every_store_call_and_show_the_waiter_queues_and_the_pool(backend: Backend) {
    let rig = app_with(backend, &[]).await;
    let app = rig.app.clone();
    let before = metrics_text(&app).await;
    for op in ["acquire", "release", "heartbeat", "reap", "open_session", "info"] {
        let series = format!("lock_store_op_seconds_bucket{{op=\"{op}\",le=\"0.0005\"}}");
        assert!(sample(&before, &series).is_some(), "{series} is not registered at start-up:\n{before}");
    }
    let a = session(&app, "worker-1", 10_000).await;
    let b = session(&app, "worker-2", 10_000).await;
    assert_eq!(acquire(&app, "k", &a, "worker-1", json!({})).await.0, 200);
    let waiter = {
        let app = app.clone();
        tokio::spawn(async move { acquire(&app, "k", &b, "worker-2", json!({ "waitMillis": 2_000 })).await })
    };
    // Both gauges are read from the one scrape that shows the queue: a second scrape could
    // come after the waiter's 2 s ran out on a slow machine.
    let queued = dlock_rt::wait_until(dlock_rt::Duration::from_millis(10), dlock_rt::Duration::from_secs(5), || {
        let app = app.clone();
        async move {
            let text = metrics_text(&app).await;
            (sample(&text, "lock_waiter_queues") == Some(1.0)).then_some(text)
        }
    })
    .await;
    let text = queued.expect("the waiter's queue never showed");
    assert_eq!(sample(&text, "lock_waiters"), Some(1.0), "{text}");
    let (s, _) = waiter.await.expect("waiter");
    assert_eq!(s, 409);
    let text = metrics_text(&app).await;
    assert_eq!(sample(&text, "lock_waiter_queues"), Some(0.0), "{text}");
    // Two sessions opened, and at least the first acquire and the waiter's asked the store.
    assert_eq!(sample(&text, "lock_store_op_seconds_count{op=\"open_session\"}"), Some(2.0), "{text}");
    assert!(sample(&text, "lock_store_op_seconds_count{op=\"acquire\"}").is_some_and(|n| n >= 2.0), "{text}");
    assert_eq!(sample(&text, "lock_store_op_seconds_count{op=\"revoke\"}"), Some(0.0), "{text}");
    let inf = sample(&text, "lock_store_op_seconds_bucket{op=\"open_session\",le=\"+Inf\"}");
    assert_eq!(inf, Some(2.0), "{text}");
    let pool = sample(&text, "dlock_db_pool_connections{state=\"idle\"}")
        .zip(sample(&text, "dlock_db_pool_connections{state=\"in_use\"}"));
    let (idle, in_use) = pool.expect("pool gauges");
    match backend {
        Backend::Sqlite | Backend::Postgres => assert!(idle + in_use >= 1.0, "a SQL store shows its pool: {text}"),
        Backend::Sim | Backend::Etcd => assert_eq!(idle + in_use, 0.0, "{text}"),
    }
}

// A session and its grants belong to their owner (C3-extensions E-9, "Owner binding";
// docs/security.md, attack 4b): a worker credential bound to `owners=exec-1/*`, naming an
// owner id it may use, tries every lock-server write that addresses a session or a grant
// of `exec-2/0` (L2, L3, L4's `sessionId`, L5, rotate, L6 with a made-up session id and the
// token L7 shows to any reader). Each is refused `403 FORBIDDEN` before anything changes;
// the owner's own calls still pass, and a bound worker's missing session is still
// `SESSION_UNKNOWN`.

/// Bound to the tasks of executor 1 (the forger's credential in every test).
const EXEC_1: &str = "owner-binding-exec-1-0000000000001";
/// Bound to the tasks of executor 2 (the victim's).
const EXEC_2: &str = "owner-binding-exec-2-0000000000001";
/// The forger's own owner id: one its credential may use.
const FORGER: (&str, &str) = ("x-owner-id", "exec-1/0");
/// The victim's owner id.
const VICTIM: (&str, &str) = ("x-owner-id", "exec-2/0");
/// A session id nobody opened.
const MADE_UP_SESSION: &str = "00000000-0000-4000-8000-00000000abcd";

/// A server whose credentials bind one worker to each executor's tasks.
async fn owner_rig(backend: Backend) -> Rig {
    app_with_credentials(backend, &format!("worker {EXEC_1} owners=exec-1/*\nworker {EXEC_2} owners=exec-2/*\n")).await
}

/// One request as `token`'s holder.
async fn as_caller(
    app: &axum::Router,
    token: &str,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, Value) {
    let bearer = format!("Bearer {token}");
    let mut all = vec![("authorization", bearer.as_str())];
    all.extend_from_slice(headers);
    call(app, method, uri, &all, body).await
}

/// The victim: exec-2/0's session, holding `key` for 60 s. Returns (session id, token).
async fn victim_holds(app: &axum::Router, key: &str) -> (String, i64) {
    let (s, v) = as_caller(app, EXEC_2, "POST", "/v1/sessions", &[VICTIM], Some(json!({ "ttlMillis": 60_000 }))).await;
    assert_eq!(s, 201, "{v}");
    let sid = v["sessionId"].as_str().expect("sessionId").to_owned();
    let body = json!({ "sessionId": sid, "ttlMillis": 60_000 });
    let (s, g) = as_caller(app, EXEC_2, "POST", &format!("/v1/locks/{key}/acquire"), &[VICTIM], Some(body)).await;
    assert_eq!(s, 200, "{g}");
    (sid, g["fencingToken"].as_i64().expect("token"))
}

fn assert_forbidden(r: &(u16, Value), what: &str) {
    assert_eq!((r.0, r.1["code"].as_str()), (403, Some("FORBIDDEN")), "{what}: {}", r.1);
    assert_eq!(r.1["retrySafe"], false, "{what}");
    let text = r.1.to_string();
    assert!(!text.contains("exec-2"), "{what}: the answer names the stored owner: {text}");
}

/// L7 as a reader would see it: (held, token, expiresAt).
async fn lock_state(app: &axum::Router, key: &str) -> (bool, Option<i64>, Option<String>) {
    let (s, v) = as_caller(app, EXEC_2, "GET", &format!("/v1/locks/{key}"), &[], None).await;
    assert_eq!(s, 200, "{v}");
    (v["held"].as_bool().unwrap_or(false), v["fencingToken"].as_i64(), v["expiresAt"].as_str().map(str::to_owned))
}

/// L2 by a forger: refused, and the victim's own heartbeat still passes.
async fn another_owners_session_is_not_heartbeated(backend: Backend) {
    let rig = owner_rig(backend).await;
    let (sid, _) = victim_holds(&rig.app, "k").await;
    let path = format!("/v1/sessions/{sid}/heartbeat");
    assert_forbidden(&as_caller(&rig.app, EXEC_1, "POST", &path, &[FORGER], None).await, "heartbeat");
    let own = as_caller(&rig.app, EXEC_2, "POST", &path, &[VICTIM], None).await;
    assert_eq!(own.0, 200, "the owner heartbeats: {}", own.1);
}

/// L4 through another owner's session: refused, nothing granted.
async fn another_owners_session_is_not_acquired_through(backend: Backend) {
    let rig = owner_rig(backend).await;
    let (sid, _) = victim_holds(&rig.app, "k").await;
    let body = json!({ "sessionId": sid, "ttlMillis": 60_000 });
    let r = as_caller(&rig.app, EXEC_1, "POST", "/v1/locks/other/acquire", &[FORGER], Some(body)).await;
    assert_forbidden(&r, "acquire through another owner's session");
    let (s, v) = as_caller(&rig.app, EXEC_2, "GET", "/v1/locks/other", &[], None).await;
    assert_eq!(s, 404, "nothing was granted: {v}");
    // A bound worker's own missing session is still SESSION_UNKNOWN, not FORBIDDEN.
    let body = json!({ "sessionId": MADE_UP_SESSION });
    let r = as_caller(&rig.app, EXEC_1, "POST", "/v1/locks/other/acquire", &[FORGER], Some(body)).await;
    assert_eq!((r.0, r.1["code"].as_str()), (404, Some("SESSION_UNKNOWN")), "{}", r.1);
}

/// L5 of another owner's grant: refused, its lease unchanged (a renew would have cut the
/// victim's 60 s lease to 1 s).
async fn another_owners_grant_is_not_renewed(backend: Backend) {
    let rig = owner_rig(backend).await;
    let (sid, token) = victim_holds(&rig.app, "k").await;
    let before = lock_state(&rig.app, "k").await;
    let headers = [FORGER, ("x-fencing-token", &token.to_string())];
    let body = json!({ "sessionId": sid, "ttlMillis": 1_000 });
    let r = as_caller(&rig.app, EXEC_1, "POST", "/v1/locks/k/renew", &headers, Some(body)).await;
    assert_forbidden(&r, "renew of another owner's grant");
    assert_eq!(lock_state(&rig.app, "k").await, before, "the lease moved");
}

/// Rotate (E-18) of another owner's grant: refused, the token unchanged.
async fn another_owners_grant_is_not_rotated(backend: Backend) {
    let rig = owner_rig(backend).await;
    let (sid, token) = victim_holds(&rig.app, "k").await;
    let headers = [FORGER, ("x-fencing-token", &token.to_string())];
    let body = json!({ "sessionId": sid });
    let r = as_caller(&rig.app, EXEC_1, "POST", "/v1/locks/k/rotate", &headers, Some(body)).await;
    assert_forbidden(&r, "rotate of another owner's grant");
    assert_eq!(lock_state(&rig.app, "k").await.1, Some(token), "the token was rotated away");
}

/// L6 of another owner's grant, with a made-up session id and the token L7 shows: refused,
/// the lock still held.
async fn another_owners_grant_is_not_released(backend: Backend) {
    let rig = owner_rig(backend).await;
    let (_, _) = victim_holds(&rig.app, "k").await;
    let (held, shown, _) = lock_state(&rig.app, "k").await;
    assert!(held);
    let token = shown.expect("L7 shows the token").to_string();
    let path = format!("/v1/locks/k?sessionId={MADE_UP_SESSION}");
    let r = as_caller(&rig.app, EXEC_1, "DELETE", &path, &[FORGER, ("x-fencing-token", &token)], None).await;
    assert_forbidden(&r, "release of another owner's grant");
    assert!(lock_state(&rig.app, "k").await.0, "the lock was released");
    // The owner releases it.
    let own = as_caller(&rig.app, EXEC_2, "DELETE", &path, &[VICTIM, ("x-fencing-token", &token)], None).await;
    assert_eq!(own.0, 204, "the owner releases: {}", own.1);
}

/// L3 of another owner's session: refused, the session and its lock still there.
async fn another_owners_session_is_not_closed(backend: Backend) {
    let rig = owner_rig(backend).await;
    let (sid, _) = victim_holds(&rig.app, "k").await;
    let path = format!("/v1/sessions/{sid}");
    assert_forbidden(&as_caller(&rig.app, EXEC_1, "DELETE", &path, &[FORGER], None).await, "close");
    assert!(lock_state(&rig.app, "k").await.0, "the session's lock was released");
    let own = as_caller(&rig.app, EXEC_2, "POST", &format!("{path}/heartbeat"), &[VICTIM], None).await;
    assert_eq!(own.0, 200, "the session is still open: {}", own.1);
}

/// An operator credential bound to its person's name (`owners=alice`) revokes only under
/// that name: the `operator` the audit records is the credential's, not whatever a caller
/// types (E-13). An unbound operator credential names anyone, as before.
async fn a_bound_operator_credential_revokes_only_under_its_own_name(backend: Backend) {
    const ALICE: &str = "operator-bound-to-alice-000000000001";
    const ANYONE: &str = "operator-unbound-00000000000000000001";
    let creds = format!("worker {EXEC_2} owners=exec-2/*\noperator {ALICE} owners=alice\noperator {ANYONE}\n");
    let rig = app_with_credentials(backend, &creds).await;
    let (_, token) = victim_holds(&rig.app, "k").await;
    let body = |who: &str| json!({ "operator": who, "reason": "stuck holder on acct", "expectedToken": token });
    let alice = [("x-owner-id", "alice")];
    let as_bob = as_caller(&rig.app, ALICE, "POST", "/v1/locks/k/revoke", &alice, Some(body("bob"))).await;
    assert_eq!((as_bob.0, as_bob.1["code"].as_str()), (403, Some("FORBIDDEN")), "{}", as_bob.1);
    assert_eq!(lock_state(&rig.app, "k").await.1, Some(token), "nothing was revoked");
    let as_alice = as_caller(&rig.app, ALICE, "POST", "/v1/locks/k/revoke", &alice, Some(body("alice"))).await;
    assert_eq!(as_alice.0, 200, "alice revokes under her own name: {}", as_alice.1);
    let (_, again) = victim_holds(&rig.app, "j").await;
    let unbound = json!({ "operator": "carol", "reason": "stuck holder on acct", "expectedToken": again });
    let r = as_caller(&rig.app, ANYONE, "POST", "/v1/locks/j/revoke", &[("x-owner-id", "ops")], Some(unbound)).await;
    assert_eq!(r.0, 200, "an unbound operator credential names anyone: {}", r.1);
}

macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        mod sim {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() { super::$case(super::Backend::Sim).await })*
        }
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() { super::$case(super::Backend::Sqlite).await })*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() { super::$case(super::Backend::Postgres).await })*
        }
        mod etcd {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() { super::$case(super::Backend::Etcd).await })*
        }
    };
}

on_every_backend!(
    l1_opens_a_session_with_the_ttl_clamped_into_range,
    l2_heartbeat_reports_held_locks_and_server_time_and_distinguishes_unknown,
    l2_lapsed_session_is_expired_not_unknown,
    l3_closing_a_session_releases_its_locks_and_forgets_it,
    l4_grants_a_fresh_token_and_contended_answers_name_the_holder,
    l4_rejects_bad_keys_and_out_of_range_waits,
    l4_waiter_is_granted_when_the_holder_releases,
    l4_waiters_past_the_cap_get_contention_exceeded,
    l5_renew_keeps_the_token_and_a_dead_grant_is_lock_lost,
    e18_rotate_grants_a_greater_token_to_the_holder_and_a_stale_one_is_lock_lost,
    l6_stale_release_is_lock_lost_and_never_frees_the_newer_grant,
    l7_info_is_404_for_a_never_seen_key_and_advisory_otherwise,
    e23_lists_the_held_keys_in_pages_each_as_l7_answers_it_and_refuses_a_bad_query,
    l8_revoke_raises_the_floor_and_validates_its_request,
    every_refusal_is_the_envelope,
    a_waiter_whose_session_lapses_while_it_waits_is_never_granted,
    l4_waiters_are_granted_in_arrival_order,
    l4_a_no_wait_request_does_not_barge_past_waiters,
    acquire_and_renew_answer_the_grant_signature,
    metrics_time_every_store_call_and_show_the_waiter_queues_and_the_pool,
    another_owners_session_is_not_heartbeated,
    another_owners_session_is_not_acquired_through,
    another_owners_grant_is_not_renewed,
    another_owners_grant_is_not_rotated,
    another_owners_grant_is_not_released,
    another_owners_session_is_not_closed,
    a_bound_operator_credential_revokes_only_under_its_own_name,
);

#[tokio::test]
async fn each_injected_store_fault_of_an_acquire_maps_to_its_code_and_retry_safety() {
    use dlock_lock_server::store::StoreFault;
    use dlock_lock_server::store_fault::FaultyLockStore;
    // (class, status, code, retrySafe, the grant committed)
    let cases = [
        (StoreFault::Unavailable, 503, "NOT_LEADER", true, false),
        (StoreFault::CommitUnknown, 500, "INTERNAL", false, true),
        (StoreFault::Corrupt, 500, "INTERNAL", false, false),
    ];
    for (fault, status, code, retry_safe, granted) in cases {
        let faulty = Arc::new(FaultyLockStore::new(Arc::new(MemLockStore::new(Clock::system()))));
        let app = dlock_lock_server::app::router(LockServer::new(
            faulty.clone(),
            LockServerConfig::default(),
            Clock::system(),
        ));
        let sid = session(&app, "worker-1", 10_000).await;
        faulty.faults.inject("acquire", fault);
        let (s, v) = acquire(&app, "k", &sid, "worker-1", json!({})).await;
        assert_eq!((s, v["code"].as_str()), (status, Some(code)), "{fault:?}: {v}");
        assert_eq!(v["retrySafe"], retry_safe, "{fault:?}: {v}");
        assert!(!v.to_string().contains("injected"), "internal cause leaked: {v}");
        // A lost answer left the grant, attached to the session (E-9); the others nothing.
        let (s, v) = call(&app, "GET", "/v1/locks/k", &[], None).await;
        assert_eq!(s, if granted { 200 } else { 404 }, "{fault:?}: {v}");
    }
}
