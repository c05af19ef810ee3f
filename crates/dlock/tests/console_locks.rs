//! The console's Locks page over a real lock server (C3-extensions E-23): without a key it
//! lists the keys the lock server holds, so a key held shows and a key released does not.
//! The lock server runs in process on the simulation store; the console reaches it over a
//! socket, as in a deployment.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it drives them over real sockets (the seam binds service code)"
)]
#![cfg(not(madsim))]

use std::sync::Arc;

use bytes::Bytes;
use dlock_rt::http::{BaseUrl, ClientResponse, HttpClient};
use serde_json::{json, Value};

const READER: &str = "reader-console-locks-token-00001";
const OWNER: &str = "worker-1";

async fn send(
    c: &HttpClient,
    at: &BaseUrl,
    method: http::Method,
    path: &str,
    h: &[(&str, &str)],
    body: Option<Value>,
) -> ClientResponse {
    let mut headers = h.to_vec();
    if body.is_some() {
        headers.push(("content-type", "application/json"));
    }
    let body = body.map(|b| Bytes::from(b.to_string()));
    c.send(at, method, path, &headers, body).await.expect("answered")
}

fn json_of(r: &ClientResponse) -> Value {
    serde_json::from_slice(&r.body).expect("a JSON answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_locks_page_lists_a_held_key_and_not_a_released_one() {
    let clock = dlock_rt::Clock::system();
    let store = Arc::new(dlock_lock_server::store_mem::MemLockStore::new(clock));
    let server = dlock_lock_server::service::LockServer::new(store, Default::default(), clock);
    let l = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
    let router = dlock_lock_server::app::router(server.clone());
    let lock = dlock_rt::ServiceHandle::serve(server, l, router, 1_000, std::future::pending()).expect("lock server");
    let lock_url = BaseUrl::parse(&format!("http://{}", lock.local_addr)).expect("url");
    let cfg = dlock_console::ConsoleConfig {
        payment_url: lock_url.clone(),
        lock_url: lock_url.clone(),
        proxy_url: lock_url.clone(),
        session_ttl_ms: 60_000,
        auth: dlock_http::auth::AuthSettings::inline(&format!("reader {READER}\n")),
    };
    let l = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
    let console = dlock_console::start(cfg, clock, l, std::future::pending()).await.expect("console");
    let console_url = BaseUrl::parse(&format!("http://{}", console.local_addr)).expect("url");
    let c = HttpClient::new(1_000, 10_000).without_bearer();

    // A worker holds `job:held` and released `job:released`.
    let owner = [("x-owner-id", OWNER)];
    let opened = send(&c, &lock_url, http::Method::POST, "/v1/sessions", &owner, Some(json!({}))).await;
    let sid = json_of(&opened)["sessionId"].as_str().expect("a session").to_owned();
    let mut tokens = Vec::new();
    for key in ["job:held", "job:released"] {
        let path = format!("/v1/locks/{key}/acquire");
        let r = send(&c, &lock_url, http::Method::POST, &path, &owner, Some(json!({ "sessionId": sid }))).await;
        assert_eq!(r.status, 200, "{key}: {}", String::from_utf8_lossy(&r.body));
        tokens.push(json_of(&r)["fencingToken"].as_i64().expect("a token").to_string());
    }
    let path = format!("/v1/locks/job:released?sessionId={sid}");
    let h = [("x-owner-id", OWNER), ("x-fencing-token", tokens[1].as_str())];
    assert_eq!(send(&c, &lock_url, http::Method::DELETE, &path, &h, None).await.status, 204);

    // A reader signs in and opens the Locks page without a key.
    let origin = format!("http://{}", console_url.authority);
    let login = [("content-type", "application/x-www-form-urlencoded"), ("origin", origin.as_str())];
    let body = Some(Bytes::from(format!("token={READER}")));
    let r = c.send(&console_url, http::Method::POST, "/login", &login, body).await.expect("answered");
    assert_eq!(r.status, 303);
    let cookie = r.headers.get("set-cookie").and_then(|v| v.to_str().ok()).expect("a session cookie");
    let cookie = cookie.split(';').next().expect("name=value").to_owned();
    let r = send(&c, &console_url, http::Method::GET, "/locks", &[("cookie", cookie.as_str())], None).await;
    assert_eq!(r.status, 200);
    let page = String::from_utf8_lossy(&r.body).into_owned();
    assert!(page.contains("href=\"/locks?key=job%3Aheld\">job:held</a>"), "the held key is listed: {page}");
    assert!(page.contains(&format!("<span class=\"mono\">{OWNER}</span>")), "with its holder: {page}");
    assert!(!page.contains("job:released"), "the released key is not listed: {page}");
}
