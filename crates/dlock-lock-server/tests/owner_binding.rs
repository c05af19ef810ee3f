//! A session and its grants belong to their owner (C3-extensions E-9, "Owner binding";
//! docs/security.md, attack 11): a worker credential bound to `owners=exec-1/*`, naming an
//! owner id it may use, tries every lock-server write that addresses a session or a grant
//! of `exec-2/0` (L2, L3, L4's `sessionId`, L5, rotate, L6 with a made-up session id and
//! the token L7 shows to any reader). Each is refused `403 FORBIDDEN` before anything
//! changes, on every backend; the owner's own calls still pass, and a bound worker's
//! missing session is still `SESSION_UNKNOWN`.

#![cfg(not(madsim))]

use std::sync::Arc;

use axum::body::Body;
use dlock_lock_server::service::LockServer;
use dlock_lock_server::store_mem::MemLockStore;
use dlock_rt::Clock;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

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

#[derive(Debug, Clone, Copy)]
enum Backend {
    Sim,
    Sqlite,
    Postgres,
    Etcd,
}

struct Rig {
    app: axum::Router,
    _guard: Option<dlock_testkit::TempDir>,
}

async fn rig(backend: Backend) -> Rig {
    let creds = format!("worker {EXEC_1} owners=exec-1/*\nworker {EXEC_2} owners=exec-2/*\n");
    let mut l = dlock_config::Layers::of(&[("lock.delay-ms", "0")]);
    l.set_flag("auth.credentials", creds);
    let cfg = dlock_lock_server::config::resolve(&l, dlock_config::Profile::Production).expect("settings").config;
    let (store, guard): (Arc<dyn dlock_lock_server::store::LockStore>, _) = match backend {
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
            let prefix = format!("/dlock-owner-{}", uuid::Uuid::new_v4().simple());
            let store = dlock_lock_server::store_etcd::EtcdLockStore::connect(&endpoints, &prefix).await.expect("etcd");
            (Arc::new(store), None)
        }
    };
    let auth = dlock_http::auth::Authenticator::new(
        dlock_lock_server::NODE,
        dlock_contract::auth::LOCK_SERVER_ROUTES,
        &cfg.auth,
        Clock::system(),
    )
    .expect("credentials");
    assert!(auth.is_some(), "authentication is on");
    let server = LockServer::new(store, cfg, Clock::system());
    Rig { app: dlock_lock_server::app::router_with_auth(server, auth), _guard: guard }
}

/// One request as `token`'s holder.
async fn call(
    app: &axum::Router,
    token: &str,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, Value) {
    let mut b =
        axum::http::Request::builder().method(method).uri(uri).header("authorization", format!("Bearer {token}"));
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
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// The victim: exec-2/0's session, holding `key` for 60 s. Returns (session id, token).
async fn victim_holds(app: &axum::Router, key: &str) -> (String, i64) {
    let (s, v) = call(app, EXEC_2, "POST", "/v1/sessions", &[VICTIM], Some(json!({ "ttlMillis": 60_000 }))).await;
    assert_eq!(s, 201, "{v}");
    let sid = v["sessionId"].as_str().expect("sessionId").to_owned();
    let body = json!({ "sessionId": sid, "ttlMillis": 60_000 });
    let (s, g) = call(app, EXEC_2, "POST", &format!("/v1/locks/{key}/acquire"), &[VICTIM], Some(body)).await;
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
    let (s, v) = call(app, EXEC_2, "GET", &format!("/v1/locks/{key}"), &[], None).await;
    assert_eq!(s, 200, "{v}");
    (v["held"].as_bool().unwrap_or(false), v["fencingToken"].as_i64(), v["expiresAt"].as_str().map(str::to_owned))
}

/// L2 by a forger: refused, and the victim's own heartbeat still passes.
async fn another_owners_session_is_not_heartbeated(backend: Backend) {
    let rig = rig(backend).await;
    let (sid, _) = victim_holds(&rig.app, "k").await;
    let path = format!("/v1/sessions/{sid}/heartbeat");
    assert_forbidden(&call(&rig.app, EXEC_1, "POST", &path, &[FORGER], None).await, "heartbeat");
    let own = call(&rig.app, EXEC_2, "POST", &path, &[VICTIM], None).await;
    assert_eq!(own.0, 200, "the owner heartbeats: {}", own.1);
}

/// L4 through another owner's session: refused, nothing granted.
async fn another_owners_session_is_not_acquired_through(backend: Backend) {
    let rig = rig(backend).await;
    let (sid, _) = victim_holds(&rig.app, "k").await;
    let body = json!({ "sessionId": sid, "ttlMillis": 60_000 });
    let r = call(&rig.app, EXEC_1, "POST", "/v1/locks/other/acquire", &[FORGER], Some(body)).await;
    assert_forbidden(&r, "acquire through another owner's session");
    let (s, v) = call(&rig.app, EXEC_2, "GET", "/v1/locks/other", &[], None).await;
    assert_eq!(s, 404, "nothing was granted: {v}");
    // A bound worker's own missing session is still SESSION_UNKNOWN, not FORBIDDEN.
    let body = json!({ "sessionId": MADE_UP_SESSION });
    let r = call(&rig.app, EXEC_1, "POST", "/v1/locks/other/acquire", &[FORGER], Some(body)).await;
    assert_eq!((r.0, r.1["code"].as_str()), (404, Some("SESSION_UNKNOWN")), "{}", r.1);
}

/// L5 of another owner's grant: refused, its lease unchanged (a renew would have cut the
/// victim's 60 s lease to 1 s).
async fn another_owners_grant_is_not_renewed(backend: Backend) {
    let rig = rig(backend).await;
    let (sid, token) = victim_holds(&rig.app, "k").await;
    let before = lock_state(&rig.app, "k").await;
    let headers = [FORGER, ("x-fencing-token", &token.to_string())];
    let body = json!({ "sessionId": sid, "ttlMillis": 1_000 });
    let r = call(&rig.app, EXEC_1, "POST", "/v1/locks/k/renew", &headers, Some(body)).await;
    assert_forbidden(&r, "renew of another owner's grant");
    assert_eq!(lock_state(&rig.app, "k").await, before, "the lease moved");
}

/// Rotate (E-18) of another owner's grant: refused, the token unchanged.
async fn another_owners_grant_is_not_rotated(backend: Backend) {
    let rig = rig(backend).await;
    let (sid, token) = victim_holds(&rig.app, "k").await;
    let headers = [FORGER, ("x-fencing-token", &token.to_string())];
    let body = json!({ "sessionId": sid });
    let r = call(&rig.app, EXEC_1, "POST", "/v1/locks/k/rotate", &headers, Some(body)).await;
    assert_forbidden(&r, "rotate of another owner's grant");
    assert_eq!(lock_state(&rig.app, "k").await.1, Some(token), "the token was rotated away");
}

/// L6 of another owner's grant, with a made-up session id and the token L7 shows: refused,
/// the lock still held.
async fn another_owners_grant_is_not_released(backend: Backend) {
    let rig = rig(backend).await;
    let (_, _) = victim_holds(&rig.app, "k").await;
    let (held, shown, _) = lock_state(&rig.app, "k").await;
    assert!(held);
    let token = shown.expect("L7 shows the token").to_string();
    let path = format!("/v1/locks/k?sessionId={MADE_UP_SESSION}");
    let r = call(&rig.app, EXEC_1, "DELETE", &path, &[FORGER, ("x-fencing-token", &token)], None).await;
    assert_forbidden(&r, "release of another owner's grant");
    assert!(lock_state(&rig.app, "k").await.0, "the lock was released");
    // The owner releases it.
    let own = call(&rig.app, EXEC_2, "DELETE", &path, &[VICTIM, ("x-fencing-token", &token)], None).await;
    assert_eq!(own.0, 204, "the owner releases: {}", own.1);
}

/// L3 of another owner's session: refused, the session and its lock still there.
async fn another_owners_session_is_not_closed(backend: Backend) {
    let rig = rig(backend).await;
    let (sid, _) = victim_holds(&rig.app, "k").await;
    let path = format!("/v1/sessions/{sid}");
    assert_forbidden(&call(&rig.app, EXEC_1, "DELETE", &path, &[FORGER], None).await, "close");
    assert!(lock_state(&rig.app, "k").await.0, "the session's lock was released");
    let own = call(&rig.app, EXEC_2, "POST", &format!("{path}/heartbeat"), &[VICTIM], None).await;
    assert_eq!(own.0, 200, "the session is still open: {}", own.1);
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
    another_owners_session_is_not_heartbeated,
    another_owners_session_is_not_acquired_through,
    another_owners_grant_is_not_renewed,
    another_owners_grant_is_not_rotated,
    another_owners_grant_is_not_released,
    another_owners_session_is_not_closed,
);
