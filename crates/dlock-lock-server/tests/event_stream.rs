//! The lock server's event stream over HTTP (C3-extensions E-20): a snapshot's cursor
//! streams the session, the grant and the revoke (with its floor) that follow it, on the
//! simulation's lockdb and on SQLite; a reader of another key sees none of them.

#![cfg(not(madsim))]

use std::sync::Arc;

use axum::body::Body;
use dlock_lock_server::service::LockServer;
use dlock_lock_server::store_mem::MemLockStore;
use dlock_rt::Clock;
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

/// How long a test reads a stream for the frames it expects.
const STREAM_WAIT_MS_MAX: u64 = 10_000;

async fn apps() -> Vec<(&'static str, axum::Router, Option<dlock_testkit::TempDir>)> {
    let mut l = dlock_config::Layers::of(&[]);
    l.set_flag("auth.credentials", dlock_testkit::auth::credentials());
    let cfg = dlock_lock_server::config::resolve(&l, dlock_config::Profile::Production).expect("settings").config;
    let (url, dir) = dlock_testkit::fresh_database(dlock_testkit::Db::Sqlite).await;
    let sqlite = dlock_lock_server::store_sql::open(&url).await.expect("open lockdb");
    let mem: Arc<dyn dlock_lock_server::store::LockStore> = Arc::new(MemLockStore::new(Clock::system()));
    vec![
        ("memory", dlock_lock_server::app::router(LockServer::new(mem, cfg.clone(), Clock::system())), None),
        ("sqlite", dlock_lock_server::app::router(LockServer::new(sqlite, cfg, Clock::system())), Some(dir)),
    ]
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
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// The `data` of each SSE event frame until `n` of them arrived (or the stream ends, or
/// [`STREAM_WAIT_MS_MAX`] passes).
async fn events(app: &axum::Router, uri: &str, cursor: &str, n: usize) -> Vec<Value> {
    let req =
        axum::http::Request::builder().uri(uri).header("last-event-id", cursor).body(Body::empty()).expect("request");
    let resp = app.clone().oneshot(req).await.expect("infallible");
    assert_eq!(resp.status().as_u16(), 200);
    let mut body = resp.into_body().into_data_stream();
    let (mut text, mut out) = (String::new(), Vec::new());
    let _ = dlock_rt::timeout(dlock_rt::Duration::from_millis(STREAM_WAIT_MS_MAX), async {
        while out.len() < n {
            let Some(Ok(chunk)) = body.next().await else { break };
            text.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
            while let Some(end) = text.find("\n\n") {
                let raw: String = text.drain(..end + 2).collect();
                if let Some(d) = raw.lines().find_map(|l| l.strip_prefix("data: ")) {
                    out.push(serde_json::from_str::<Value>(d).expect("JSON"));
                }
            }
        }
    })
    .await;
    out
}

#[tokio::test]
async fn a_snapshot_cursor_streams_the_session_the_grant_and_the_revoke_with_its_floor() {
    for (name, app, _dir) in apps().await {
        let (s, page) = call(&app, "GET", "/v1/events/recent?lockKey=payout:acct-1", &[], None).await;
        assert_eq!(s, 200, "{name}: {page}");
        let cursor = page["cursor"].as_str().expect("cursor").to_owned();
        let (s, all) = call(&app, "GET", "/v1/events/recent", &[], None).await;
        assert_eq!(s, 200, "{name}");
        let all_cursor = all["cursor"].as_str().expect("cursor").to_owned();
        let owner = [("x-owner-id", "worker-1")];
        let (s, v) = call(&app, "POST", "/v1/sessions", &owner, Some(json!({ "ttlMillis": 10_000 }))).await;
        assert_eq!(s, 201, "{name}: {v}");
        let sid = v["sessionId"].as_str().expect("sessionId").to_owned();
        let (s, g) =
            call(&app, "POST", "/v1/locks/payout:acct-1/acquire", &owner, Some(json!({ "sessionId": sid }))).await;
        assert_eq!(s, 200, "{name}: {g}");
        let token = g["fencingToken"].as_i64().expect("token");
        let body = json!({ "operator": "alice", "reason": "a stuck payout run", "expectedToken": token });
        let (s, r) = call(&app, "POST", "/v1/locks/payout:acct-1/revoke", &[("x-owner-id", "ops")], Some(body)).await;
        assert_eq!(s, 200, "{name}: {r}");
        // The key's filter: the grant and the revoke (a session is about no key).
        let got = events(&app, "/v1/events?lockKey=payout:acct-1", &cursor, 2).await;
        let kinds: Vec<&str> = got.iter().filter_map(|e| e["kind"].as_str()).collect();
        assert_eq!(kinds, ["lock.granted", "lock.revoked"], "{name}: {got:?}");
        assert_eq!(got[0]["data"]["token"], json!(token), "{name}");
        assert_eq!(got[0]["lockKey"], json!("payout:acct-1"), "{name}");
        let floor = got[1]["data"]["newTokenFloor"].as_i64().expect("floor");
        assert!(floor >= token, "{name}: the floor {floor} covers the revoked token {token}");
        assert!(got[0]["eventId"].as_str().is_some_and(|id| id.starts_with("lockdb/")), "{name}");
        // Every kind, from the unfiltered snapshot: the session first.
        let got = events(&app, "/v1/events", &all_cursor, 3).await;
        let kinds: Vec<&str> = got.iter().filter_map(|e| e["kind"].as_str()).collect();
        assert_eq!(kinds, ["session.opened", "lock.granted", "lock.revoked"], "{name}: {got:?}");
    }
}

/// A GET with headers; the answer's status, headers and JSON body.
async fn get_with(app: &axum::Router, uri: &str, headers: &[(&str, &str)]) -> (u16, axum::http::HeaderMap, Value) {
    let mut b = axum::http::Request::builder().uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = app.clone().oneshot(b.body(Body::empty()).expect("request")).await.expect("infallible");
    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, headers, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// L7 is a snapshot (C3-extensions E-20, "Snapshots"; E-22): asked with `Prefer:
/// event-cursor`, it answers the cursor of a watermark read before it, bound to the key's
/// filter; a stream from it delivers the revoke that follows and nothing at or below the
/// watermark. It also judges the lease left and the token floor on the server's clock.
#[tokio::test]
async fn l7_answers_its_event_cursor_when_asked_and_the_stream_from_it_delivers_what_follows() {
    for (name, app, _dir) in apps().await {
        let owner = [("x-owner-id", "worker-1")];
        let (s, v) = call(&app, "POST", "/v1/sessions", &owner, Some(json!({ "ttlMillis": 10_000 }))).await;
        assert_eq!(s, 201, "{name}: {v}");
        let sid = v["sessionId"].as_str().expect("sessionId").to_owned();
        let body = json!({ "sessionId": sid, "ttlMillis": 20_000 });
        let (s, g) = call(&app, "POST", "/v1/locks/payout:acct-9/acquire", &owner, Some(body)).await;
        assert_eq!(s, 200, "{name}: {g}");
        let token = g["fencingToken"].as_i64().expect("token");
        // The grant is at or below the next head the stream publishes: the revoke is then
        // the one event after the snapshot (delivery is at least once, so otherwise the
        // grant could come again).
        let published = dlock_testkit::events_published(1, || {
            let app = app.clone();
            async move { call(&app, "GET", "/v1/events/recent?lockKey=payout:acct-9", &[], None).await.1 }
        })
        .await;
        assert!(published, "{name}: the grant's event was never published");

        let (s, h, plain) = get_with(&app, "/v1/locks/payout:acct-9", &[]).await;
        assert_eq!(s, 200, "{name}: {plain}");
        assert!(h.get("x-event-cursor").is_none(), "{name}: a cursor nobody asked for");
        let left = plain["leaseRemainingMs"].as_i64().expect("leaseRemainingMs");
        assert!(left > 0 && left <= 20_000, "{name}: {plain}");
        assert!(plain["tokenFloor"].as_i64().is_some_and(|f| f >= token), "{name}: {plain}");
        assert!(plain.get("lockDelayRemainingMs").is_none(), "{name}: {plain}");

        let (s, h, info) = get_with(&app, "/v1/locks/payout:acct-9", &[("prefer", "event-cursor")]).await;
        assert_eq!(s, 200, "{name}: {info}");
        assert_eq!(info["fencingToken"], json!(token), "{name}");
        assert_eq!(h.get("preference-applied").and_then(|v| v.to_str().ok()), Some("event-cursor"), "{name}");
        let cursor = h.get("x-event-cursor").and_then(|v| v.to_str().ok()).expect("x-event-cursor").to_owned();
        let mark: i64 = h.get("x-event-seq").and_then(|v| v.to_str().ok()?.parse().ok()).expect("x-event-seq");

        let body = json!({ "operator": "alice", "reason": "a stuck payout run", "expectedToken": token });
        let (s, r) = call(&app, "POST", "/v1/locks/payout:acct-9/revoke", &[("x-owner-id", "ops")], Some(body)).await;
        assert_eq!(s, 200, "{name}: {r}");
        let got = events(&app, "/v1/events?lockKey=payout:acct-9", &cursor, 1).await;
        assert_eq!(got.first().map(|e| &e["kind"]), Some(&json!("lock.revoked")), "{name}: {got:?}");
        assert!(got[0]["seq"].as_i64().is_some_and(|s| s > mark), "{name}: at or below the mark {mark}: {got:?}");
        // The cursor is the key's: another filter must take its own snapshot.
        let got = events(&app, "/v1/events", &cursor, 1).await;
        assert_eq!(got.first().map(|e| &e["reason"]), Some(&json!("other_filter")), "{name}: {got:?}");
    }
}
