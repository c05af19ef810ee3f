//! The proxy's HTTP contract, in process: every refusal is the C3 envelope, bad input
//! writes nothing, and each forward outcome maps to its pinned status and code. The rail is
//! a real rail-stub served on loopback; the store is the simulation store (the conformance
//! suite holds it to the SQL stores).

#![cfg(not(madsim))]

use std::sync::Arc;

use axum::body::Body;
use dlock_config::{Layers, Profile};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::{SubmissionOutcome, BENEFICIARY_REF_CHARS_MAX};
use dlock_contract::CONTENT_TYPE_JSON;
use dlock_rail_proxy::service::ProxyConfig;
use dlock_rail_proxy::store::{NewPayout, RailStore};
use dlock_rail_proxy::store_mem::MemRailStore;
use dlock_rail_proxy::{router, RailProxy};
use dlock_rail_stub::{RailStub, StubConfig};
use dlock_rt::http::BaseUrl;
use dlock_rt::Clock;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;
use uuid::Uuid;

struct Rig {
    app: axum::Router,
    store: Arc<MemRailStore>,
    stub: Arc<RailStub>,
    rail_url: BaseUrl,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// The rail-stub's settings from its own resolver, its knobs set by `knobs` (`rail.stub.*`).
fn stub_cfg(knobs: &[(&str, &str)]) -> StubConfig {
    dlock_rail_stub::config::resolve(&Layers::of(knobs), Profile::Production).expect("stub settings").config
}

/// The proxy's settings in these tests (short budgets, a small body limit), from its resolver.
fn proxy_cfg(rail_url: &BaseUrl) -> ProxyConfig {
    let rail = format!("http://{}", rail_url.authority);
    let creds = dlock_testkit::auth::credentials();
    let l = Layers::of(&[
        ("rail.proxy.rail-url", &rail),
        ("rail.proxy.connect-timeout-ms", "500"),
        ("rail.proxy.read-timeout-ms", "2000"),
        ("rail.proxy.body-bytes-max", "4096"),
        ("rail.proxy.grants.verify-keys", &dlock_contract::grant::testing::signer().verify_key().to_base64()),
        ("auth.credentials", &creds),
    ]);
    dlock_rail_proxy::config::resolve(&l, Profile::Production).expect("proxy settings").config
}

/// A rail-stub started through its entry point on loopback, and the proxy's router before it.
async fn rig(knobs: &[(&str, &str)]) -> Rig {
    let listener = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
    let rail_url = BaseUrl::parse(&format!("http://{}", listener.local_addr().expect("addr"))).expect("url");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let h = dlock_rail_stub::start(stub_cfg(knobs), Clock::system(), listener, async {
        let _ = rx.await;
    })
    .await
    .expect("stub");
    rig_with(h.service.clone(), rail_url, tx)
}

fn rig_with(stub: Arc<RailStub>, rail_url: BaseUrl, stop: tokio::sync::oneshot::Sender<()>) -> Rig {
    let store = Arc::new(MemRailStore::new());
    let cfg = proxy_cfg(&rail_url);
    let dyn_store: Arc<dyn RailStore> = store.clone();
    let app = router(RailProxy::new(dyn_store, cfg, Clock::system()));
    Rig { app, store, stub, rail_url, _stop: stop }
}

async fn claimed(store: &MemRailStore, account: &str) -> Uuid {
    let id = Uuid::new_v4();
    store
        .insert_payout(
            &NewPayout {
                payout_id: id,
                account_id: account.into(),
                amount_minor: 500,
                currency: "EUR".into(),
                beneficiary_ref: "b".into(),
                state: PayoutState::Claimed,
            },
            Clock::system().wall(),
        )
        .await
        .expect("insert");
    id
}

fn body_for(p: Uuid) -> Value {
    json!({"payoutId": p, "accountId": "a-1", "amountMinor": 500, "currency": "EUR", "beneficiaryRef": "b"})
}

/// The submission with `headers`; when they carry a numeric token and no signature, the
/// test key's signature of a grant of `payout:a-1` (every payout here is a-1's) for that
/// token and owner is added (C3-extensions E-14).
fn request(headers: &[(&str, &str)], body: &str) -> axum::http::Request<Body> {
    let mut b = axum::http::Request::post("/v1/rail/submissions");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let get = |name: &str| headers.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    if let (Some(Ok(t)), Some(owner), None) =
        (get("x-fencing-token").map(str::parse::<i64>), get("x-owner-id"), get("x-fencing-signature"))
    {
        b = b.header("x-fencing-signature", dlock_contract::grant::testing::sign_payout("a-1", t, owner));
    }
    b.body(Body::from(body.to_owned())).expect("request")
}

const GOOD: &[(&str, &str)] = &[
    ("content-type", "application/json"),
    ("x-fencing-token", "7"),
    ("x-owner-id", "w-1"),
    ("x-idempotency-key", "payout:k"),
];

async fn call(app: &axum::Router, req: axum::http::Request<Body>) -> (u16, String, Value) {
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status().as_u16();
    let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, ct, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn assert_envelope(status: u16, ct: &str, v: &Value, want_status: u16, want_code: &str) {
    assert_eq!(status, want_status, "{v}");
    assert_eq!(ct, CONTENT_TYPE_JSON);
    assert_eq!(v["code"], want_code, "{v}");
    assert!(v["message"].is_string() && v["retrySafe"].is_boolean());
    assert_eq!(v["traceId"].as_str().map(str::len), Some(32));
}

#[tokio::test]
async fn malformed_or_missing_token_is_invalid_token_and_writes_nothing() {
    let r = rig(&[]).await;
    let p = claimed(&r.store, "a-1").await;
    let body = body_for(p).to_string();
    for token in
        [None, Some(""), Some("0"), Some("-1"), Some("+5"), Some("05"), Some("1e3"), Some("9223372036854775808")]
    {
        let mut headers: Vec<(&str, &str)> = GOOD.iter().copied().filter(|(k, _)| *k != "x-fencing-token").collect();
        if let Some(t) = token {
            headers.push(("x-fencing-token", t));
        }
        let (s, ct, v) = call(&r.app, request(&headers, &body)).await;
        assert_envelope(s, &ct, &v, 400, "INVALID_TOKEN");
    }
    assert_eq!(r.store.submissions(None).await.expect("rows"), vec![]);
    assert!(r.stub.calls().is_empty());
}

#[tokio::test]
async fn missing_owner_or_idempotency_key_is_validation_failed() {
    let r = rig(&[]).await;
    let p = claimed(&r.store, "a-1").await;
    for drop in ["x-owner-id", "x-idempotency-key"] {
        let headers: Vec<_> = GOOD.iter().copied().filter(|(k, _)| *k != drop).collect();
        let (s, ct, v) = call(&r.app, request(&headers, &body_for(p).to_string())).await;
        assert_envelope(s, &ct, &v, 400, "VALIDATION_FAILED");
        assert!(v["details"]["fields"][0]["field"].as_str().is_some_and(|f| f.eq_ignore_ascii_case(drop)), "{v}");
    }
    assert_eq!(r.store.submissions(None).await.expect("rows"), vec![]);
}

#[tokio::test]
async fn bad_bodies_are_enveloped_and_write_no_row() {
    let r = rig(&[]).await;
    let p = claimed(&r.store, "a-1").await;
    let no_ct: Vec<_> = GOOD.iter().copied().filter(|(k, _)| *k != "content-type").collect();
    let mut wrong_amount = body_for(p);
    wrong_amount["amountMinor"] = json!(501);
    let mut unknown = body_for(p);
    unknown["payoutId"] = json!(Uuid::new_v4());
    let mut bad_currency = body_for(p);
    bad_currency["currency"] = json!("EURO");
    let mut long_ref = body_for(p);
    long_ref["beneficiaryRef"] = json!("x".repeat(BENEFICIARY_REF_CHARS_MAX + 1));
    let cases: Vec<(axum::http::Request<Body>, u16, &str)> = vec![
        (request(&no_ct, &body_for(p).to_string()), 415, "UNSUPPORTED_MEDIA_TYPE"),
        (request(GOOD, "{\"payoutId\":"), 400, "VALIDATION_FAILED"),
        (request(GOOD, "[]"), 400, "VALIDATION_FAILED"),
        (request(GOOD, &"x".repeat(5_000)), 413, "PAYLOAD_TOO_LARGE"),
        (request(GOOD, &wrong_amount.to_string()), 400, "VALIDATION_FAILED"),
        (request(GOOD, &unknown.to_string()), 400, "VALIDATION_FAILED"),
        (request(GOOD, &bad_currency.to_string()), 400, "VALIDATION_FAILED"),
        (request(GOOD, &long_ref.to_string()), 400, "VALIDATION_FAILED"),
    ];
    for (req, status, code) in cases {
        let (s, ct, v) = call(&r.app, req).await;
        assert_envelope(s, &ct, &v, status, code);
    }
    assert_eq!(r.store.submissions(None).await.expect("rows"), vec![]);
    assert_eq!(r.store.high_water("a-1").await, Ok(None));
    assert!(r.stub.calls().is_empty());
}

#[tokio::test]
async fn unknown_routes_and_wrong_methods_are_enveloped() {
    let r = rig(&[]).await;
    let get = axum::http::Request::get("/v1/rail/submissions").body(Body::empty()).expect("req");
    let (s, ct, v) = call(&r.app, get).await;
    assert_envelope(s, &ct, &v, 405, "METHOD_NOT_ALLOWED");
    let nope = axum::http::Request::get("/v1/nope").body(Body::empty()).expect("req");
    let (s, ct, v) = call(&r.app, nope).await;
    assert_envelope(s, &ct, &v, 404, "NOT_FOUND");
}

#[tokio::test]
async fn rail_decline_is_422_validation_failed_and_fails_the_payout() {
    let r = rig(&[("rail.stub.decline-rate", "1")]).await;
    let p = claimed(&r.store, "a-1").await;
    let (s, ct, v) = call(&r.app, request(GOOD, &body_for(p).to_string())).await;
    assert_envelope(s, &ct, &v, 422, "VALIDATION_FAILED");
    assert_eq!(v["details"]["outcome"], "REJECTED");
    let rows = r.store.submissions(Some(p)).await.expect("rows");
    assert_eq!(rows.iter().map(|r| r.outcome).collect::<Vec<_>>(), [Some(SubmissionOutcome::Rejected)]);
    assert_eq!(r.store.payout(p).await.expect("read").expect("exists").state, PayoutState::Failed);
    assert_eq!(r.stub.calls().len(), 1);
}

#[tokio::test]
async fn rail_5xx_is_ambiguous_and_quarantines_the_payout() {
    // failure-rate 1 with this seed: the first call's failure is a 5xx, not a drop.
    let seed = (0..64u64)
        .find(|s| {
            let mut rng = dlock_rt::rand::seeded(*s);
            let _fail: f64 = dlock_rt::rand::Rng::gen(&mut rng);
            dlock_rt::rand::Rng::gen::<bool>(&mut rng)
        })
        .expect("a seed whose first failure is a 5xx");
    let seed = seed.to_string();
    let r = rig(&[("rail.stub.failure-rate", "1"), ("rail.stub.seed", &seed)]).await;
    let p = claimed(&r.store, "a-1").await;
    let (s, ct, v) = call(&r.app, request(GOOD, &body_for(p).to_string())).await;
    assert_envelope(s, &ct, &v, 409, "RAIL_AMBIGUOUS");
    assert_eq!(v["retrySafe"], false);
    assert_eq!(r.store.payout(p).await.expect("read").expect("exists").state, PayoutState::RailAmbiguous);
    let rows = r.store.submissions(Some(p)).await.expect("rows");
    assert_eq!(rows[0].outcome, Some(SubmissionOutcome::Timeout));
    assert_eq!(rows[0].outcome_detail.as_deref(), Some("rail answered 500"));
}

#[tokio::test]
async fn unreachable_rail_is_unavailable_and_hands_the_payout_back() {
    let closed = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
    let rail_url = BaseUrl::parse(&format!("http://{}", closed.local_addr().expect("addr"))).expect("url");
    drop(closed);
    let (tx, _rx) = tokio::sync::oneshot::channel();
    let r = rig_with(RailStub::new(stub_cfg(&[]), Clock::system()), rail_url, tx);
    let p = claimed(&r.store, "a-1").await;
    let (s, ct, v) = call(&r.app, request(GOOD, &body_for(p).to_string())).await;
    assert_envelope(s, &ct, &v, 503, "RAIL_UNAVAILABLE");
    assert_eq!(v["retrySafe"], true);
    assert!(v["retryAfterMillis"].as_u64().is_some_and(|ms| ms > 0));
    assert_eq!(v["details"]["outcome"], "UNSENT");
    assert_eq!(r.store.payout(p).await.expect("read").expect("exists").state, PayoutState::Claimed);
    // Readiness fails closed while the rail is unreachable.
    let ready = axum::http::Request::get("/health/ready").body(Body::empty()).expect("req");
    let (s, ct, v) = call(&r.app, ready).await;
    assert_envelope(s, &ct, &v, 503, "NOT_READY");
    assert_eq!(v["details"]["components"]["railStub"]["status"], "DOWN");
    assert_eq!(v["details"]["components"]["paydb"]["status"], "UP");
}

#[tokio::test]
async fn payout_that_is_not_claimed_is_not_claimable_and_moves_no_mark() {
    let r = rig(&[]).await;
    let id = Uuid::new_v4();
    r.store
        .insert_payout(
            &NewPayout {
                payout_id: id,
                account_id: "a-1".into(),
                amount_minor: 500,
                currency: "EUR".into(),
                beneficiary_ref: "b".into(),
                state: PayoutState::Pending,
            },
            Clock::system().wall(),
        )
        .await
        .expect("insert");
    let (s, ct, v) = call(&r.app, request(GOOD, &body_for(id).to_string())).await;
    assert_envelope(s, &ct, &v, 409, "PAYOUT_NOT_CLAIMABLE");
    assert_eq!(v["details"]["state"], "PENDING");
    assert_eq!(r.store.high_water("a-1").await, Ok(None));
    assert!(r.stub.calls().is_empty());
}

#[tokio::test]
async fn a_body_that_differs_from_the_payout_is_validation_failed_and_reaches_nothing() {
    let r = rig(&[]).await;
    let id = claimed(&r.store, "a-1").await;
    for (field, value) in [
        ("accountId", json!("a-2")),
        ("amountMinor", json!(501)),
        ("currency", json!("USD")),
        ("beneficiaryRef", json!("someone-else")),
    ] {
        let mut body = body_for(id);
        body[field] = value;
        let (s, ct, v) = call(&r.app, request(GOOD, &body.to_string())).await;
        assert_envelope(s, &ct, &v, 400, "VALIDATION_FAILED");
        assert_eq!(v["details"]["fields"][0]["field"], field, "{v}");
    }
    assert_eq!(r.store.high_water("a-1").await, Ok(None));
    assert!(r.stub.calls().is_empty());
    let (s, _, v) = call(&r.app, request(GOOD, &body_for(id).to_string())).await;
    assert_eq!(s, 200, "the matching body is still admitted: {v}");
    assert_eq!(r.stub.calls().len(), 1);
}

#[tokio::test]
async fn liveness_touches_no_dependency() {
    let closed = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
    let rail_url = BaseUrl::parse(&format!("http://{}", closed.local_addr().expect("addr"))).expect("url");
    drop(closed);
    let (tx, _rx) = tokio::sync::oneshot::channel();
    let r = rig_with(RailStub::new(stub_cfg(&[]), Clock::system()), rail_url, tx);
    let live = axum::http::Request::get("/health/live").body(Body::empty()).expect("req");
    let (s, ct, v) = call(&r.app, live).await;
    assert_eq!((s, ct.as_str()), (200, CONTENT_TYPE_JSON));
    assert_eq!(v["status"], "UP");
}

/// A proxy over an in-memory store with no reachable rail: only its orphan sweep is driven.
fn sweep_rig() -> (Rig, Arc<RailProxy>) {
    let stub = RailStub::new(stub_cfg(&[]), Clock::system());
    let (tx, _rx) = tokio::sync::oneshot::channel::<()>();
    let rail = BaseUrl::parse("http://127.0.0.1:9").expect("url");
    let r = rig_with(stub, rail.clone(), tx);
    let proxy = RailProxy::new(r.store.clone(), proxy_cfg(&rail), Clock::system());
    (r, proxy)
}

/// Admits an intent for a claimed payout of `account`, stamped `at`; returns its payout and
/// submission ids.
async fn intent_at(store: &MemRailStore, account: &str, at: chrono::DateTime<chrono::Utc>) -> (Uuid, Uuid) {
    let payout = claimed(store, account).await;
    let attempt = dlock_rail_proxy::store::Attempt {
        submission_id: Uuid::new_v4(),
        payout_id: payout,
        account_id: account.into(),
        presented_token: 3,
        owner_id: "w-1".into(),
        idempotency_key: format!("payout:{payout}"),
        amount_minor: 500,
        currency: "EUR".into(),
        at,
        fencing_enabled: true,
    };
    store.admit(&attempt).await.expect("admit");
    (payout, attempt.submission_id)
}

#[tokio::test]
async fn an_orphaned_intent_is_quarantined_by_the_sweep_and_a_live_one_is_left_alone() {
    let (r, proxy) = sweep_rig();
    let now = Clock::system().wall();
    let mut ids = Vec::new();
    for (account, age_ms) in [("acct-orphan", proxy.cfg.shutdown_grace_ms() as i64 + 1_000), ("acct-live", 100)] {
        ids.push(intent_at(&r.store, account, now - chrono::Duration::milliseconds(age_ms)).await);
    }
    assert_eq!(proxy.sweep_orphans().await, Ok(1));
    let orphan = r.store.submissions(Some(ids[0].0)).await.expect("rows");
    assert_eq!(orphan[0].outcome, Some(SubmissionOutcome::Timeout));
    assert_eq!(r.store.payout(ids[0].0).await.expect("read").expect("exists").state, PayoutState::RailAmbiguous);
    let live = r.store.submissions(Some(ids[1].0)).await.expect("rows");
    assert_eq!(live[0].outcome, None, "an intent within one forward's budget may still be in flight");
    assert_eq!(r.store.payout(ids[1].0).await.expect("read").expect("exists").state, PayoutState::Submitted);
    assert_eq!(proxy.sweep_orphans().await, Ok(0), "the sweep is idempotent");
}

/// An intent stamped by a replica whose wall clock ran ahead looks fresh by this proxy's
/// wall clock for as long as that clock was ahead; the sweep still quarantines it once it
/// has watched it unresolved for one forward's budget on its own monotonic clock, and not
/// before.
#[tokio::test]
async fn an_orphan_stamped_by_a_clock_running_ahead_is_swept_after_one_budget_watched() {
    let (r, proxy) = sweep_rig();
    let budget_ms = proxy.cfg.shutdown_grace_ms();
    // Ten budgets ahead of this proxy's wall clock.
    let ahead = Clock::system().wall() + chrono::Duration::milliseconds(10 * budget_ms as i64);
    let (payout, _) = intent_at(&r.store, "acct-ahead", ahead).await;
    let (wall, mono) = (Clock::system().wall(), Clock::system().now());
    let later =
        |ms: u64| (wall + chrono::Duration::milliseconds(ms as i64), mono + std::time::Duration::from_millis(ms));
    assert_eq!(proxy.sweep_orphans_at(wall, mono).await, Ok(0), "first sighting");
    let (w, m) = later(budget_ms - 1);
    assert_eq!(proxy.sweep_orphans_at(w, m).await, Ok(0), "watched for less than a budget");
    let (w, m) = later(budget_ms);
    assert_eq!(proxy.sweep_orphans_at(w, m).await, Ok(1), "watched for a whole budget");
    assert_eq!(r.store.payout(payout).await.expect("read").expect("exists").state, PayoutState::RailAmbiguous);
}

#[tokio::test]
async fn each_injected_store_fault_of_the_intent_commit_maps_to_its_code_and_retry_safety() {
    use dlock_rail_proxy::store::StoreFault;
    use dlock_rail_proxy::store_fault::FaultyRailStore;
    // (class, status, code, retrySafe, intent row left behind)
    let cases = [
        (StoreFault::Unavailable, 503, "RAIL_UNAVAILABLE", true, false),
        (StoreFault::CommitUnknown, 500, "INTERNAL", false, true),
        (StoreFault::Corrupt, 500, "INTERNAL", false, false),
    ];
    for (fault, status, code, retry_safe, intent) in cases {
        let base = rig(&[]).await;
        let faulty = Arc::new(FaultyRailStore::new(base.store.clone()));
        let app = router(RailProxy::new(faulty.clone(), proxy_cfg(&base.rail_url), Clock::system()));
        let p = claimed(&base.store, "a-1").await;
        faulty.faults.inject("admit", fault);
        let (s, ct, v) = call(&app, request(GOOD, &body_for(p).to_string())).await;
        assert_envelope(s, &ct, &v, status, code);
        assert_eq!(v["retrySafe"], retry_safe, "{fault:?}: {v}");
        // Nothing was ever presented to the rail; a lost commit answer left its intent.
        assert!(base.stub.calls().is_empty(), "{fault:?}");
        let rows = base.store.submissions(Some(p)).await.expect("rows");
        assert_eq!(rows.len(), usize::from(intent), "{fault:?}");
        let state = base.store.payout(p).await.expect("read").expect("exists").state;
        assert_eq!(state, if intent { PayoutState::Submitted } else { PayoutState::Claimed }, "{fault:?}");
    }
}
