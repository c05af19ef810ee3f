//! A paydb connection that PostgreSQL terminated while it sat idle in the pool (no pool
//! pings before a checkout, docs/performance.md "Pools"): the submission it fails answers 503
//! RAIL_UNAVAILABLE, retry-safe, having written nothing and called nothing, and the next try
//! goes through; an outcome whose connection died during the forward is still recorded.
//! Needs `DLOCK_TEST_PG_URL`.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it bounds its own waits on real processes with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use dlock_config::{Layers, Profile};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::SubmissionOutcome;
use dlock_rail_proxy::store::{NewPayout, RailStore};
use dlock_rail_proxy::{router, RailProxy};
use dlock_rail_stub::RailStub;
use dlock_rt::Clock;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sqlx::Connection;
use tower::ServiceExt;
use uuid::Uuid;

/// How long a test polls before it fails.
const POLL_MS_MAX: u64 = 10_000;
/// Pause between two polls.
const POLL_MS: u64 = 20;

struct Rig {
    app: axum::Router,
    store: Arc<dyn RailStore>,
    stub: Arc<RailStub>,
    url: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn rig(stub_latency_ms: &str) -> Rig {
    let listener = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
    let rail = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let stub_cfg = dlock_rail_stub::config::resolve(
        &Layers::of(&[("rail.stub.latency-ms", stub_latency_ms)]),
        Profile::Production,
    )
    .expect("stub settings")
    .config;
    let h = dlock_rail_stub::start(stub_cfg, Clock::system(), listener, async {
        let _ = rx.await;
    })
    .await
    .expect("stub");
    let creds = dlock_testkit::auth::credentials();
    let l = Layers::of(&[
        ("rail.proxy.rail-url", &rail),
        ("rail.proxy.grants.verify-keys", &dlock_contract::grant::testing::signer().verify_key().to_base64()),
        ("auth.credentials", &creds),
    ]);
    let cfg = dlock_rail_proxy::config::resolve(&l, Profile::Production).expect("proxy settings").config;
    let url = dlock_testkit::pg_database().await;
    let store = dlock_rail_proxy::store_sql::open(&url).await.expect("open postgres");
    let app = router(RailProxy::new(store.clone(), cfg, Clock::system()));
    Rig { app, store, stub: h.service.clone(), url, _stop: stop }
}

async fn claimed(store: &Arc<dyn RailStore>) -> Uuid {
    let id = Uuid::new_v4();
    let p = NewPayout {
        payout_id: id,
        account_id: "a-1".into(),
        amount_minor: 500,
        currency: "EUR".into(),
        beneficiary_ref: "b".into(),
        state: PayoutState::Claimed,
    };
    store.insert_payout(&p, Clock::system().wall()).await.expect("insert");
    id
}

fn submission(p: Uuid, token: i64) -> axum::http::Request<Body> {
    let body = json!({"payoutId": p, "accountId": "a-1", "amountMinor": 500, "currency": "EUR", "beneficiaryRef": "b"});
    axum::http::Request::post("/v1/rail/submissions")
        .header("content-type", "application/json")
        .header("x-fencing-token", token.to_string())
        .header("x-owner-id", "w-1")
        .header("x-idempotency-key", format!("payout:{p}"))
        .header("x-fencing-signature", dlock_contract::grant::testing::sign_payout("a-1", token, "w-1"))
        .body(Body::from(body.to_string()))
        .expect("request")
}

async fn call(app: &axum::Router, req: axum::http::Request<Body>) -> (u16, Value) {
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// A connection of its own to the test database, to watch and to kill from.
async fn watcher(url: &str) -> sqlx::PgConnection {
    sqlx::PgConnection::connect(url).await.expect("watcher")
}

/// Terminates every backend of the test database but the watcher's; returns how many.
async fn terminate_pool_backends(w: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()) t",
    )
    .fetch_one(w)
    .await
    .expect("terminate")
}

#[tokio::test]
async fn a_submission_on_a_connection_killed_while_idle_is_503_retry_safe_and_its_retry_is_acked() {
    let r = rig("0").await;
    let p = claimed(&r.store).await;
    r.store.ping().await.expect("warm");
    let mut w = watcher(&r.url).await;
    assert!(terminate_pool_backends(&mut w).await >= 1, "the pool's idle connection was terminated");

    let (status, v) = call(&r.app, submission(p, 7)).await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["code"], "RAIL_UNAVAILABLE", "{v}");
    assert_eq!(v["retrySafe"], true, "{v}");
    // Nothing decided: no call, no row, no mark, the payout untouched.
    assert!(r.stub.calls().is_empty());
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM rail_submission").fetch_one(&mut w).await.expect("rows");
    assert_eq!(rows, 0);
    let marks: i64 = sqlx::query_scalar("SELECT count(*) FROM rail_high_water").fetch_one(&mut w).await.expect("marks");
    assert_eq!(marks, 0);

    // The answer was retry-safe: the same submission again, until the pool has recovered.
    let deadline = std::time::Instant::now() + Duration::from_millis(POLL_MS_MAX);
    let acked = loop {
        let (status, v) = call(&r.app, submission(p, 7)).await;
        if status == 200 {
            break v;
        }
        assert_eq!((status, &v["retrySafe"]), (503, &Value::Bool(true)), "{v}");
        assert!(std::time::Instant::now() < deadline, "the pool did not recover: {v}");
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    };
    assert!(acked["railReference"].is_string(), "{acked}");
    assert_eq!(r.stub.calls().len(), 1, "forwarded exactly once");
    let rows = r.store.submissions(Some(p)).await.expect("rows");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].outcome, Some(SubmissionOutcome::Acked));
    assert_eq!(r.store.payout(p).await.expect("read").expect("exists").state, PayoutState::RailAcked);
}

#[tokio::test]
async fn an_outcome_whose_connection_was_killed_during_the_forward_is_still_recorded() {
    // The stub holds each call long enough to kill the pool's connections meanwhile.
    let r = rig("600").await;
    let p = claimed(&r.store).await;
    let mut w = watcher(&r.url).await;
    let app = r.app.clone();
    let submit = tokio::spawn(async move { call(&app, submission(p, 7)).await });
    // Wait for the intent (the forward is under way), then kill every pool connection.
    let deadline = std::time::Instant::now() + Duration::from_millis(POLL_MS_MAX);
    loop {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM rail_submission WHERE outcome IS NULL")
            .fetch_one(&mut w)
            .await
            .expect("intents");
        if n == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no intent was written");
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    assert!(terminate_pool_backends(&mut w).await >= 1, "the pool's connections were terminated");
    let (status, v) = submit.await.expect("submission task");
    assert_eq!(status, 200, "the rail's ack is recorded, not quarantined: {v}");
    let rows = r.store.submissions(Some(p)).await.expect("rows");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].outcome, Some(SubmissionOutcome::Acked));
    assert_eq!(r.stub.calls().len(), 1);
    assert_eq!(r.store.payout(p).await.expect("read").expect("exists").state, PayoutState::RailAcked);
}
