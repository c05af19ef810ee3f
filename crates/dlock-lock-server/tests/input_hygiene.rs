//! Input hygiene at the lock server, over real HTTP on every backend: a NUL character in any
//! string, a body that is not a JSON object, a key given twice, or a `%00` in the path is
//! `400 VALIDATION_FAILED` (never retry-safe) and changes nothing, on every backend alike.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it drives them over real sockets and bounds its own waits with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

use std::sync::Arc;

use axum::body::Bytes;
use dlock_contract::CONTENT_TYPE_JSON;
use dlock_lock_server::service::{LockServer, LockServerConfig};
use dlock_lock_server::store_mem::MemLockStore;
use dlock_rt::http::{BaseUrl, HttpClient};
use dlock_rt::Clock;
use serde_json::Value;

#[derive(Debug, Clone, Copy)]
pub enum Backend {
    Sim,
    Sqlite,
    Postgres,
    Etcd,
}

/// A lock server on a fresh store of `backend`, served on loopback.
struct Served {
    base: BaseUrl,
    _stop: tokio::sync::oneshot::Sender<()>,
    _guard: Option<dlock_testkit::TempDir>,
}

async fn served(backend: Backend) -> Served {
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
            let prefix = format!("/dlock-hygiene-{}", uuid::Uuid::new_v4().simple());
            let store = dlock_lock_server::store_etcd::EtcdLockStore::connect(&endpoints, &prefix).await.expect("etcd");
            (Arc::new(store), None)
        }
    };
    let server = LockServer::new(store, LockServerConfig::default(), Clock::system());
    let listener = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
    let base = BaseUrl::parse(&format!("http://{}", listener.local_addr().expect("addr"))).expect("url");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(dlock_rt::http::serve(listener, dlock_lock_server::app::router(server), async {
        let _ = rx.await;
    }));
    Served { base, _stop: tx, _guard: guard }
}

/// Sends `body` (raw JSON text, declared `application/json`) with `X-Owner-Id: owner` and
/// `X-Fencing-Token: token` (when given), and returns status and JSON.
async fn send(s: &Served, method: &str, path: &str, owner: Option<&str>, body: Option<&str>) -> (u16, Value) {
    send_fenced(s, method, path, owner, None, body).await
}

async fn send_fenced(
    s: &Served,
    method: &str,
    path: &str,
    owner: Option<&str>,
    token: Option<i64>,
    body: Option<&str>,
) -> (u16, Value) {
    let token = token.map(|t| t.to_string());
    let mut headers = vec![];
    if let Some(o) = owner {
        headers.push(("x-owner-id", o));
    }
    if let Some(t) = &token {
        headers.push(("x-fencing-token", t.as_str()));
    }
    if body.is_some() {
        headers.push(("content-type", "application/json"));
    }
    let method = axum::http::Method::from_bytes(method.as_bytes()).expect("method");
    let resp = HttpClient::new(2_000, 10_000)
        .send(&s.base, method, path, &headers, body.map(|b| Bytes::from(b.to_owned())))
        .await
        .expect("answer");
    if resp.status >= 400 {
        let ct = resp.headers.get("content-type").and_then(|v| v.to_str().ok());
        assert_eq!(ct, Some(CONTENT_TYPE_JSON), "{path}");
    }
    (resp.status, serde_json::from_slice(&resp.body).unwrap_or(Value::Null))
}

fn assert_refused(answer: &(u16, Value), field: &str, case: &str) {
    let (status, v) = answer;
    assert_eq!(*status, 400, "{case}: {v}");
    assert_eq!(v["code"], "VALIDATION_FAILED", "{case}: {v}");
    assert_eq!(v["retrySafe"], false, "{case}: {v}");
    assert_eq!(v["traceId"].as_str().map(str::len), Some(32), "{case}: {v}");
    assert_eq!(v["details"]["fields"][0]["field"], field, "{case}: {v}");
}

/// A session of `owner` holding `key`; returns (session id, fencing token).
async fn holder(s: &Served, owner: &str, key: &str) -> (String, i64) {
    let (st, v) = send(s, "POST", "/v1/sessions", Some(owner), Some(r#"{"ttlMillis":30000}"#)).await;
    assert_eq!(st, 201, "{v}");
    let sid = v["sessionId"].as_str().expect("sid").to_owned();
    let body = format!(r#"{{"sessionId":"{sid}"}}"#);
    let (st, g) = send(s, "POST", &format!("/v1/locks/{key}/acquire"), Some(owner), Some(&body)).await;
    assert_eq!(st, 200, "{g}");
    (sid, g["fencingToken"].as_i64().expect("token"))
}

async fn nul_in_any_string_is_validation_failed_and_changes_nothing(backend: Backend) {
    let s = served(backend).await;
    let (sid, token) = holder(&s, "w-1", "k").await;
    let cases = [
        ("POST", "/v1/sessions".to_owned(), None, r#"{"ownerId":"w\u0000"}"#.to_owned(), "ownerId"),
        ("POST", "/v1/sessions".to_owned(), Some("w-1"), r#"{"ownerId":"w-1","note":"\u0000"}"#.to_owned(), "note"),
        (
            "POST",
            "/v1/locks/k/revoke".to_owned(),
            Some("ops"),
            r#"{"operator":"alice","reason":"stuck holder\u0000 on acct"}"#.to_owned(),
            "reason",
        ),
        (
            "POST",
            "/v1/locks/k/revoke".to_owned(),
            Some("ops"),
            r#"{"operator":"al\u0000ice","reason":"stuck holder on acct"}"#.to_owned(),
            "operator",
        ),
        ("POST", "/v1/locks/k/renew".to_owned(), Some("w-1"), format!(r#"{{"sessionId":"{sid}\u0000"}}"#), "sessionId"),
        ("POST", "/v1/locks/a%00b/acquire".to_owned(), Some("w-1"), format!(r#"{{"sessionId":"{sid}"}}"#), "path"),
        ("POST", "/v1/sessions/%00/heartbeat".to_owned(), Some("w-1"), "{}".to_owned(), "path"),
    ];
    for (method, path, owner, body, field) in cases {
        let answer = send_fenced(&s, method, &path, owner, Some(token), Some(&body)).await;
        assert_refused(&answer, field, &format!("{method} {path} {body}"));
    }
    // The refused revokes changed nothing: the holder still holds, with its token.
    let (st, info) = send(&s, "GET", "/v1/locks/k", None, None).await;
    assert_eq!((st, info["fencingToken"].as_i64()), (200, Some(token)), "{info}");
}

async fn a_body_that_is_not_an_object_is_validation_failed(backend: Backend) {
    let s = served(backend).await;
    let (sid, token) = holder(&s, "w-1", "k").await;
    for body in ["[1,2]", "\"x\"", "3", "null", "true"] {
        for path in ["/v1/sessions", "/v1/locks/k/acquire", "/v1/locks/k/renew", "/v1/locks/k/revoke"] {
            let answer = send_fenced(&s, "POST", path, Some("w-1"), Some(token), Some(body)).await;
            assert_refused(&answer, "$", &format!("POST {path} {body}"));
        }
        let answer = send_fenced(&s, "DELETE", "/v1/locks/k", Some("w-1"), Some(token), Some(body)).await;
        assert_refused(&answer, "$", &format!("DELETE {body}"));
    }
    // Still answered: a session with no body at all, and the holder's renew.
    let (st, v) = send(&s, "POST", "/v1/sessions", Some("w-2"), None).await;
    assert_eq!(st, 201, "{v}");
    let renew = format!(r#"{{"sessionId":"{sid}"}}"#);
    let (st, v) = send_fenced(&s, "POST", "/v1/locks/k/renew", Some("w-1"), Some(token), Some(&renew)).await;
    assert_eq!(st, 200, "{v}");
}

async fn a_key_given_twice_is_validation_failed(backend: Backend) {
    let s = served(backend).await;
    let (sid, token) = holder(&s, "w-1", "k").await;
    let cases = [
        ("/v1/sessions", r#"{"ownerId":"w-1","ttlMillis":5000,"ttlMillis":60000}"#.to_owned(), "ttlMillis"),
        ("/v1/locks/k2/acquire", format!(r#"{{"sessionId":"{sid}","sessionId":"{sid}"}}"#), "sessionId"),
        (
            "/v1/locks/k/revoke",
            format!(r#"{{"operator":"a","reason":"stuck holder on acct","expectedToken":1,"expectedToken":{token}}}"#),
            "expectedToken",
        ),
    ];
    for (path, body, field) in cases {
        let answer = send(&s, "POST", path, Some("w-1"), Some(&body)).await;
        assert_refused(&answer, field, &format!("POST {path} {body}"));
    }
    let (st, info) = send(&s, "GET", "/v1/locks/k", None, None).await;
    assert_eq!((st, info["fencingToken"].as_i64()), (200, Some(token)), "{info}");
    let (st, _) = send(&s, "GET", "/v1/locks/k2", None, None).await;
    assert_eq!(st, 404, "the refused acquire granted nothing");
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
    nul_in_any_string_is_validation_failed_and_changes_nothing,
    a_body_that_is_not_an_object_is_validation_failed,
    a_key_given_twice_is_validation_failed,
);
