//! The payment-resource's real axum router over its in-memory store, fed arbitrary request
//! bodies: whatever the bytes, the answer is never a 5xx, and every error is the JSON
//! [`ErrorEnvelope`] (C3 §3.1) with its content type. Shared by the fuzz target
//! `router_body` and the corpus replay test
//! (`crates/dlock-payment-resource/tests/fuzz_router_corpus.rs`).
//!
//! Each input gets a fresh store holding one account and one payout (made through the
//! router, so a claim or post has something to reach), which makes every run reproducible.
//! The first byte picks the route; the rest is the body.
#![allow(dead_code)] // not every includer uses every item

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::Request;
use dlock_contract::{ErrorEnvelope, CONTENT_TYPE_JSON};
use dlock_payment_resource::store_mem::MemPaydb;
use dlock_payment_resource::{router, PaymentConfig, PaymentResource};
use dlock_rt::Clock;
use http_body_util::BodyExt;
use tower::ServiceExt;

const PAYOUT_ID: &str = "4b6f1b5e-8d0a-4a39-9f5e-2f1d1a0c9e11";
const ACCOUNT_BODY: &str = r#"{"accountId":"acct:1","currency":"EUR","openingBalanceMinor":100000}"#;
const PAYOUT_BODY: &str = r#"{"payoutId":"4b6f1b5e-8d0a-4a39-9f5e-2f1d1a0c9e11","accountId":"acct:1","amountMinor":1250,"currency":"EUR","beneficiaryRef":"ref-1"}"#;

/// The write routes a body reaches, picked by the input's first byte.
fn route(selector: u8) -> (&'static str, String) {
    match selector % 4 {
        0 => ("POST", "/v1/accounts".to_owned()),
        1 => ("POST", "/v1/payouts".to_owned()),
        2 => ("POST", format!("/v1/payouts/{PAYOUT_ID}/claim")),
        _ => ("POST", format!("/v1/payouts/{PAYOUT_ID}/post")),
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime"))
}

/// Sends one write as owner `ops` under `key` with fencing token 5 (signed); returns the status, the
/// content type and the body.
async fn send(app: &axum::Router, method: &str, path: &str, key: &str, body: Vec<u8>) -> (u16, String, Vec<u8>) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("x-owner-id", "ops")
        .header("x-idempotency-key", key)
        .header("x-fencing-token", "5")
        // The test key's grant of the account's lock (C3-extensions E-14), so a claim or
        // post reaches the store.
        .header("x-fencing-signature", dlock_contract::grant::testing::sign_payout("acct:1", 5, "ops"))
        .header("content-type", "application/json")
        .body(Body::from(body))
        .expect("a well-formed request");
    let resp = app.clone().oneshot(req).await.expect("the router is infallible");
    let status = resp.status().as_u16();
    let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let bytes = resp.into_body().collect().await.expect("a body").to_bytes().to_vec();
    (status, ct, bytes)
}

/// Never a 5xx; every 4xx is an [`ErrorEnvelope`] served as `CONTENT_TYPE_JSON`.
pub fn router_body(data: &[u8]) {
    let Some((&selector, body)) = data.split_first() else { return };
    runtime().block_on(async {
        let cfg = PaymentConfig { grants: dlock_contract::grant::testing::verifier(), ..PaymentConfig::default() };
        let pr = PaymentResource::start(Arc::new(MemPaydb::new()), cfg, Clock::system())
            .await
            .expect("the payment-resource starts on a fresh store");
        let app = router(pr);
        for (path, key, setup) in
            [("/v1/accounts", "setup-account", ACCOUNT_BODY), ("/v1/payouts", "setup-payout", PAYOUT_BODY)]
        {
            let (status, _, answer) = send(&app, "POST", path, key, setup.as_bytes().to_vec()).await;
            assert!((200..300).contains(&status), "setup {path}: {status} {}", String::from_utf8_lossy(&answer));
        }
        let (method, path) = route(selector);
        let (status, ct, answer) = send(&app, method, &path, &format!("fuzz-{selector}"), body.to_vec()).await;
        let shown = String::from_utf8_lossy(&answer);
        assert!(status < 500, "{method} {path}: {status} {shown}");
        if status >= 400 {
            assert_eq!(ct, CONTENT_TYPE_JSON, "{method} {path}: {status} {shown}");
            let envelope = serde_json::from_slice::<ErrorEnvelope>(&answer);
            assert!(envelope.is_ok(), "{method} {path}: {status} is not an error envelope: {shown}");
        }
    });
}
