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
    request_to("/v1/rail/submissions", headers, body)
}

/// [`request`] to `path`.
fn request_to(path: &str, headers: &[(&str, &str)], body: &str) -> axum::http::Request<Body> {
    let mut b = axum::http::Request::post(path);
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

// ---- Batches: R1b `POST /v1/rail/submission-batches` (C3-extensions E-19) ----

const BATCHES: &str = "/v1/rail/submission-batches";

/// The batch's headers: the single submission's, less `X-Idempotency-Key`, with a trace.
const BATCH_HEADERS: &[(&str, &str)] = &[
    ("content-type", "application/json"),
    ("x-fencing-token", "7"),
    ("x-owner-id", "w-1"),
    ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
];
const BATCH_TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// A batch body of `a-1` naming each payout with the terms `claimed` writes.
fn batch_body(payouts: &[Uuid]) -> Value {
    let submissions: Vec<Value> = payouts
        .iter()
        .map(|p| {
            let mut one = body_for(*p);
            if let Some(o) = one.as_object_mut() {
                o.remove("accountId");
                o.insert("idempotencyKey".into(), json!(format!("payout:{p}")));
            }
            one
        })
        .collect();
    json!({"accountId": "a-1", "submissions": submissions})
}

async fn post_batch(app: &axum::Router, headers: &[(&str, &str)], body: &Value) -> (u16, String, Value) {
    call(app, request_to(BATCHES, headers, &body.to_string())).await
}

/// The batch's items, each `(payoutId, status, body)`, asserting one per payout in order.
fn items_of(v: &Value, payouts: &[Uuid]) -> Vec<(u16, Value)> {
    let items = v["items"].as_array().expect("items");
    assert_eq!(items.len(), payouts.len(), "{v}");
    items
        .iter()
        .zip(payouts)
        .map(|(item, p)| {
            assert_eq!(item["payoutId"], json!(p), "{item}");
            (item["status"].as_u64().and_then(|s| u16::try_from(s).ok()).expect("status"), item["body"].clone())
        })
        .collect()
}

#[tokio::test]
async fn a_batch_of_three_is_forwarded_three_times_exactly_once_each() {
    let r = rig(&[]).await;
    let ps = vec![claimed(&r.store, "a-1").await, claimed(&r.store, "a-1").await, claimed(&r.store, "a-1").await];
    let (s, ct, v) = post_batch(&r.app, BATCH_HEADERS, &batch_body(&ps)).await;
    assert_eq!((s, ct.as_str()), (200, CONTENT_TYPE_JSON), "{v}");
    assert_eq!((v["accountId"].clone(), v["presentedToken"].clone()), (json!("a-1"), json!(7)));
    for (p, (status, body)) in ps.iter().zip(items_of(&v, &ps)) {
        assert_eq!(status, 200, "{body}");
        assert_eq!((body["outcome"].clone(), body["presentedToken"].clone()), (json!("ACKED"), json!(7)));
        let rows = r.store.submissions(Some(*p)).await.expect("rows");
        assert_eq!(rows.iter().map(|r| r.outcome).collect::<Vec<_>>(), [Some(SubmissionOutcome::Acked)]);
        assert_eq!(json!(rows[0].submission_id), body["submissionId"]);
        assert_eq!(rows[0].rail_reference.as_deref(), body["railReference"].as_str());
        assert_eq!(r.store.payout(*p).await.expect("read").expect("exists").state, PayoutState::RailAcked);
    }
    let calls = r.stub.calls();
    assert_eq!(calls.len(), 3, "{calls:?}");
    for p in &ps {
        assert_eq!(calls.iter().filter(|c| c.client_ref == p.to_string()).count(), 1, "payout {p} forwarded once");
    }
    assert_eq!(r.store.high_water("a-1").await, Ok(Some(7)));
    // The same batch again under the same grant: the mark fences it whole; nothing more reaches the rail.
    let (s, ct, v) = post_batch(&r.app, BATCH_HEADERS, &batch_body(&ps)).await;
    assert_envelope(s, &ct, &v, 409, "FENCED_OUT");
    assert_eq!(r.stub.calls().len(), 3);
}

/// A seed of the stub's chaos stream whose first three calls, at failure-rate 0.5, are one
/// dropped connection and two acknowledgements (in some order).
fn seed_with_one_drop_in_three() -> u64 {
    (0..10_000u64)
        .find(|s| {
            let mut rng = dlock_rt::rand::seeded(*s);
            let mut drops = 0;
            for _ in 0..3 {
                let fail: f64 = dlock_rt::rand::Rng::gen(&mut rng);
                let kind: bool = dlock_rt::rand::Rng::gen(&mut rng);
                for _ in 0..3 {
                    let _: u64 = dlock_rt::rand::Rng::gen(&mut rng);
                }
                match (fail < 0.5, kind) {
                    (false, _) => {}
                    (true, false) => drops += 1,
                    (true, true) => return false,
                }
            }
            drops == 1
        })
        .expect("a seed with exactly one drop in three calls")
}

#[tokio::test]
async fn a_batch_item_whose_rail_call_times_out_is_rail_ambiguous_while_the_others_are_acked() {
    let seed = seed_with_one_drop_in_three().to_string();
    // The dropped connection is held past the proxy's 2 s read timeout: a true timeout.
    let r =
        rig(&[("rail.stub.failure-rate", "0.5"), ("rail.stub.seed", &seed), ("rail.stub.drop-hold-ms", "3000")]).await;
    let ps = vec![claimed(&r.store, "a-1").await, claimed(&r.store, "a-1").await, claimed(&r.store, "a-1").await];
    let (s, _, v) = post_batch(&r.app, BATCH_HEADERS, &batch_body(&ps)).await;
    assert_eq!(s, 200, "{v}");
    let calls = r.stub.calls();
    assert_eq!(calls.len(), 3, "{calls:?}");
    let dropped: Vec<&str> = calls
        .iter()
        .filter(|c| c.outcome == dlock_contract::rail::RailCallOutcome::Dropped)
        .map(|c| c.client_ref.as_str())
        .collect();
    assert_eq!(dropped.len(), 1, "{calls:?}");
    for (p, (status, body)) in ps.iter().zip(items_of(&v, &ps)) {
        let rows = r.store.submissions(Some(*p)).await.expect("rows");
        let state = r.store.payout(*p).await.expect("read").expect("exists").state;
        if p.to_string() == dropped[0] {
            assert_eq!(
                (status, body["code"].clone(), body["retrySafe"].clone()),
                (409, json!("RAIL_AMBIGUOUS"), json!(false))
            );
            assert_eq!(
                body["details"],
                json!({"payoutId": p, "submissionId": rows[0].submission_id, "outcome": "TIMEOUT"})
            );
            assert_eq!(body["traceId"], BATCH_TRACE_ID);
            assert_eq!(rows[0].outcome, Some(SubmissionOutcome::Timeout));
            assert!(rows[0].outcome_detail.as_deref().is_some_and(|d| d.contains("no answer")), "{rows:?}");
            assert_eq!(state, PayoutState::RailAmbiguous);
        } else {
            assert_eq!((status, body["outcome"].clone()), (200, json!("ACKED")), "{body}");
            assert_eq!(rows[0].outcome, Some(SubmissionOutcome::Acked));
            assert_eq!(state, PayoutState::RailAcked);
        }
        assert_eq!(rows.len(), 1, "one attempt each, never retried");
    }
}

/// The count of a metric series in `/metrics` (0 when absent).
async fn metric(app: &axum::Router, series: &str) -> f64 {
    let req = axum::http::Request::get("/metrics").body(Body::empty()).expect("req");
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8_lossy(&bytes)
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse::<f64>().ok()))
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_fenced_batch_makes_no_rail_call_and_is_fenced_out_whole() {
    let r = rig(&[]).await;
    let first = claimed(&r.store, "a-1").await;
    let (s, _, v) = call(&r.app, request(GOOD, &body_for(first).to_string())).await;
    assert_eq!(s, 200, "{v}");
    let ps = vec![claimed(&r.store, "a-1").await, claimed(&r.store, "a-1").await];
    let unknown = Uuid::new_v4();
    let mut named = ps.clone();
    named.push(unknown);
    let (s, ct, v) = post_batch(&r.app, BATCH_HEADERS, &batch_body(&named)).await;
    assert_envelope(s, &ct, &v, 409, "FENCED_OUT");
    assert_eq!(
        v["details"],
        json!({"presentedToken": 7, "highestToken": 7, "resourceType": "rail", "resourceId": "a-1", "ownerId": "w-1"})
    );
    assert_eq!(v["traceId"], BATCH_TRACE_ID);
    assert!(v.get("items").is_none());
    assert_eq!(r.stub.calls().len(), 1, "only the single submission reached the rail");
    for p in &ps {
        let rows = r.store.submissions(Some(*p)).await.expect("rows");
        assert_eq!(
            rows.iter().map(|r| (r.outcome, r.presented_token)).collect::<Vec<_>>(),
            [(Some(SubmissionOutcome::Fenced), 7)]
        );
        assert_eq!(r.store.payout(*p).await.expect("read").expect("exists").state, PayoutState::Claimed);
    }
    assert_eq!(r.store.submissions(Some(unknown)).await.expect("rows"), vec![], "an unmatched payout writes nothing");
    assert_eq!(metric(&r.app, "lock_fenced_out_total{resource=\"rail\"}").await, 1.0, "counted once per batch");
    assert_eq!(metric(&r.app, "rail_submission_total{outcome=\"fenced\"}").await, 2.0, "one per FENCED row");
}

#[tokio::test]
async fn a_batch_refused_whole_writes_nothing_and_reaches_no_rail() {
    let r = rig(&[]).await;
    let p = claimed(&r.store, "a-1").await;
    let body = batch_body(&[p]);
    let without =
        |name: &str| -> Vec<(&str, &str)> { BATCH_HEADERS.iter().copied().filter(|(k, _)| *k != name).collect() };
    let forged = dlock_contract::grant::testing::sign_payout("a-2", 7, "w-1");
    let mut forged_headers = BATCH_HEADERS.to_vec();
    forged_headers.push(("x-fencing-signature", &forged));
    let mut twice = batch_body(&[p, p]);
    twice["submissions"][1]["payoutId"] = json!(p);
    let too_many: Vec<Uuid> = (0..=dlock_contract::batch::BATCH_PAYOUTS_MAX).map(|_| Uuid::new_v4()).collect();
    let mut no_key = body.clone();
    no_key["submissions"][0].as_object_mut().map(|o| o.remove("idempotencyKey"));
    // (headers, body, status, code)
    type Case<'a> = (Vec<(&'a str, &'a str)>, Value, u16, &'a str);
    let cases: Vec<Case> = vec![
        (without("x-fencing-token"), body.clone(), 400, "INVALID_TOKEN"),
        (forged_headers.clone(), body.clone(), 400, "INVALID_TOKEN"),
        (without("x-owner-id"), body.clone(), 400, "VALIDATION_FAILED"),
        (BATCH_HEADERS.to_vec(), json!({"accountId": "a-1", "submissions": []}), 400, "VALIDATION_FAILED"),
        (BATCH_HEADERS.to_vec(), twice, 400, "VALIDATION_FAILED"),
        (BATCH_HEADERS.to_vec(), no_key, 400, "VALIDATION_FAILED"),
    ];
    for (headers, body, status, code) in cases {
        let (s, ct, v) = post_batch(&r.app, &headers, &body).await;
        assert_envelope(s, &ct, &v, status, code);
    }
    // More submissions than one batch names (in a body the small test limit admits: the
    // test proxy's body limit is 4 KiB, so this one is refused for its size first).
    let (s, ct, v) = post_batch(&r.app, BATCH_HEADERS, &batch_body(&too_many)).await;
    assert!(
        matches!((s, v["code"].as_str()), (400, Some("VALIDATION_FAILED")) | (413, Some("PAYLOAD_TOO_LARGE"))),
        "{s} {ct} {v}"
    );
    assert_eq!(r.store.submissions(None).await.expect("rows"), vec![]);
    assert_eq!(r.store.high_water("a-1").await, Ok(None));
    assert!(r.stub.calls().is_empty());
    // Without a signature the proxy's grants refuse the token too (the test key is trusted,
    // unsigned tokens are not).
    let unsigned = axum::http::Request::post(BATCHES)
        .header("content-type", "application/json")
        .header("x-fencing-token", "7")
        .header("x-owner-id", "w-1")
        .body(Body::from(batch_body(&[p]).to_string()))
        .expect("request");
    let (s, ct, v) = call(&r.app, unsigned).await;
    assert_envelope(s, &ct, &v, 400, "INVALID_TOKEN");
    assert!(r.stub.calls().is_empty());
}

/// Replaces every value that names a payout's or an attempt's identity or instant
/// (different in two runs of the same submission) with `"*"`.
fn normalized(mut v: Value) -> Value {
    const VOLATILE: [&str; 8] = [
        "payoutId",
        "submissionId",
        "firstSubmissionId",
        "firstSubmittedAt",
        "submittedAt",
        "resolvedAt",
        "railReference",
        "traceId",
    ];
    match &mut v {
        Value::Object(o) => {
            for (k, x) in o.iter_mut() {
                *x = if VOLATILE.contains(&k.as_str()) && !x.is_null() { json!("*") } else { normalized(x.take()) };
            }
        }
        Value::Array(a) => {
            for x in a.iter_mut() {
                *x = normalized(x.take());
            }
        }
        _ => {}
    }
    v
}

/// A payout set up for the comparison, its body as the submission names it.
#[derive(Debug, Clone, Copy)]
enum Setup {
    Claimed,
    Pending,
    /// Submitted and acknowledged before, under token 5.
    SubmittedBefore,
    Unknown,
    WrongAmount,
}

async fn set_up(r: &Rig, setup: Setup) -> (Uuid, Value) {
    let p = match setup {
        Setup::Unknown => Uuid::new_v4(),
        Setup::Pending => {
            let id = Uuid::new_v4();
            let payout = NewPayout {
                payout_id: id,
                account_id: "a-1".into(),
                amount_minor: 500,
                currency: "EUR".into(),
                beneficiary_ref: "b".into(),
                state: PayoutState::Pending,
            };
            r.store.insert_payout(&payout, Clock::system().wall()).await.expect("insert");
            id
        }
        _ => claimed(&r.store, "a-1").await,
    };
    if matches!(setup, Setup::SubmittedBefore) {
        let earlier: Vec<(&str, &str)> =
            GOOD.iter().map(|(k, v)| if *k == "x-fencing-token" { (*k, "5") } else { (*k, *v) }).collect();
        let (s, _, v) = call(&r.app, request(&earlier, &body_for(p).to_string())).await;
        assert_eq!(s, 200, "{v}");
    }
    let mut body = body_for(p);
    if matches!(setup, Setup::WrongAmount) {
        body["amountMinor"] = json!(501);
    }
    (p, body)
}

/// The single submission's answer (status, body) for each setup, each in a rig of its own
/// (token 7 passes the mark once per account), and each item of one batch of all of them
/// under token 7, in a rig built by `make`: the same, up to the attempts' ids and instants.
async fn items_equal_single_answers(
    make: impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Rig>>>,
    setups: &[Setup],
) {
    let mut singles = Vec::new();
    for setup in setups {
        let r = make().await;
        let (_, body) = set_up(&r, *setup).await;
        let (s, _, v) = call(&r.app, request(GOOD, &body.to_string())).await;
        singles.push((s, v));
    }
    let r = make().await;
    let mut bodies = Vec::new();
    let mut payouts = Vec::new();
    for setup in setups {
        let (p, body) = set_up(&r, *setup).await;
        payouts.push(p);
        bodies.push(body);
    }
    let submissions: Vec<Value> = bodies
        .into_iter()
        .map(|mut b| {
            let key = format!("payout:{}", b["payoutId"].as_str().unwrap_or_default());
            if let Some(o) = b.as_object_mut() {
                o.remove("accountId");
                o.insert("idempotencyKey".into(), json!(key));
            }
            b
        })
        .collect();
    let (s, _, v) = post_batch(&r.app, BATCH_HEADERS, &json!({"accountId": "a-1", "submissions": submissions})).await;
    assert_eq!(s, 200, "{v}");
    let items = items_of(&v, &payouts);
    for (((setup, (single_status, single_body)), (status, body)), p) in
        setups.iter().zip(singles).zip(items).zip(&payouts)
    {
        assert_eq!(status, single_status, "{setup:?}: item {body} single {single_body}");
        let named = body.get("payoutId").or_else(|| body["details"].get("payoutId"));
        assert!(named.is_none_or(|n| *n == json!(p)), "{setup:?}: {body} names another payout");
        assert_eq!(normalized(body.clone()), normalized(single_body.clone()), "{setup:?}");
        if status != 200 {
            assert_eq!(body["traceId"], BATCH_TRACE_ID, "{setup:?}: the batch request's trace id");
        }
    }
}

#[tokio::test]
async fn batch_items_equal_the_single_submissions_answers() {
    let setups =
        [Setup::Claimed, Setup::Pending, Setup::SubmittedBefore, Setup::Unknown, Setup::WrongAmount, Setup::Claimed];
    items_equal_single_answers(|| Box::pin(rig(&[])), &setups).await;
    // A decline, answered 422 VALIDATION_FAILED with `outcome` REJECTED.
    items_equal_single_answers(|| Box::pin(rig(&[("rail.stub.decline-rate", "1")])), &[Setup::Claimed, Setup::Claimed])
        .await;
    // A rail that cannot be reached: 503 RAIL_UNAVAILABLE with `outcome` UNSENT, each.
    let unreachable = || -> std::pin::Pin<Box<dyn std::future::Future<Output = Rig>>> {
        Box::pin(async {
            let closed = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
            let rail_url = BaseUrl::parse(&format!("http://{}", closed.local_addr().expect("addr"))).expect("url");
            drop(closed);
            let (tx, _rx) = tokio::sync::oneshot::channel();
            rig_with(RailStub::new(stub_cfg(&[]), Clock::system()), rail_url, tx)
        })
    };
    items_equal_single_answers(unreachable, &[Setup::Claimed, Setup::Claimed]).await;
}

#[tokio::test]
async fn each_injected_store_fault_of_a_batch_maps_to_its_code_and_no_resubmission_is_invited() {
    use dlock_rail_proxy::store::StoreFault;
    use dlock_rail_proxy::store_fault::FaultyRailStore;
    // The batch's one admission transaction: (class, status, code, retrySafe, intents left behind).
    let cases = [
        (StoreFault::Unavailable, 503, "RAIL_UNAVAILABLE", true, false),
        (StoreFault::CommitUnknown, 500, "INTERNAL", false, true),
        (StoreFault::Corrupt, 500, "INTERNAL", false, false),
    ];
    for (fault, status, code, retry_safe, intents) in cases {
        let base = rig(&[]).await;
        let faulty = Arc::new(FaultyRailStore::new(base.store.clone()));
        let app = router(RailProxy::new(faulty.clone(), proxy_cfg(&base.rail_url), Clock::system()));
        let ps = vec![claimed(&base.store, "a-1").await, claimed(&base.store, "a-1").await];
        faulty.faults.inject("admit_batch", fault);
        let (s, ct, v) = post_batch(&app, BATCH_HEADERS, &batch_body(&ps)).await;
        assert_envelope(s, &ct, &v, status, code);
        assert_eq!(v["retrySafe"], retry_safe, "{fault:?}: {v}");
        assert!(v.get("items").is_none());
        assert!(base.stub.calls().is_empty(), "{fault:?}: nothing was presented");
        for p in &ps {
            let rows = base.store.submissions(Some(*p)).await.expect("rows");
            assert_eq!(rows.len(), usize::from(intents), "{fault:?}");
        }
    }
    // The outcomes' one transaction fails: every forwarded payout is quarantined by answer.
    let base = rig(&[]).await;
    let faulty = Arc::new(FaultyRailStore::new(base.store.clone()));
    let app = router(RailProxy::new(faulty.clone(), proxy_cfg(&base.rail_url), Clock::system()));
    let ps = vec![claimed(&base.store, "a-1").await, claimed(&base.store, "a-1").await];
    faulty.faults.inject("resolve_batch", StoreFault::Unavailable);
    let (s, _, v) = post_batch(&app, BATCH_HEADERS, &batch_body(&ps)).await;
    assert_eq!(s, 200, "{v}");
    for (p, (status, body)) in ps.iter().zip(items_of(&v, &ps)) {
        assert_eq!((status, body["code"].clone()), (409, json!("RAIL_AMBIGUOUS")), "{body}");
        let rows = base.store.submissions(Some(*p)).await.expect("rows");
        assert_eq!(rows[0].outcome, None, "the unrecorded outcome leaves the intent for the sweep");
    }
    assert_eq!(base.stub.calls().len(), 2, "each forwarded once");
}

#[tokio::test]
async fn the_batch_route_is_in_the_openapi_document_with_every_status_it_answers() {
    let r = rig(&[]).await;
    let req = axum::http::Request::get("/v1/openapi.json").body(Body::empty()).expect("req");
    let (s, _, v) = call(&r.app, req).await;
    assert_eq!(s, 200);
    let op = &v["paths"][BATCHES]["post"];
    for status in ["200", "400", "409", "500", "503"] {
        assert!(op["responses"].get(status).is_some(), "{status}: {}", op["responses"]);
    }
    assert_eq!(op["security"][0]["bearer"], json!(["worker"]), "{op}");
}

#[tokio::test]
async fn a_batch_forwards_its_payouts_at_once_not_one_after_another() {
    // Each rail call takes 400 ms: four in a row would take 1.6 s.
    let r = rig(&[("rail.stub.latency-ms", "400")]).await;
    let mut ps = Vec::new();
    for _ in 0..4 {
        ps.push(claimed(&r.store, "a-1").await);
    }
    let clock = Clock::system();
    let started = clock.now();
    let (s, _, v) = post_batch(&r.app, BATCH_HEADERS, &batch_body(&ps)).await;
    let took = clock.now().duration_since(started);
    assert_eq!(s, 200, "{v}");
    assert!(items_of(&v, &ps).iter().all(|(status, _)| *status == 200), "{v}");
    assert_eq!(r.stub.calls().len(), 4);
    assert!(took < std::time::Duration::from_millis(1_500), "the forwards ran one after another: {took:?}");
}
