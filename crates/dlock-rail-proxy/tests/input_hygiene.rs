//! Input hygiene at the rail-proxy, over real HTTP on the simulation store, SQLite and
//! PostgreSQL: a NUL character in any string, a body that is not a JSON object, or a key
//! given twice is `400 VALIDATION_FAILED` (never retry-safe) before admission: no intent
//! row, no mark moved, no rail call.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it drives them over real sockets and bounds its own waits with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

use std::sync::Arc;

use axum::body::Bytes;
use dlock_contract::payout::PayoutState;
use dlock_contract::CONTENT_TYPE_JSON;
use dlock_rail_proxy::service::ProxyConfig;
use dlock_rail_proxy::store::{NewPayout, RailStore};
use dlock_rail_proxy::store_mem::MemRailStore;
use dlock_rail_proxy::{router, RailProxy};
use dlock_rail_stub::{RailStub, StubConfig};
use dlock_rt::http::{BaseUrl, HttpClient};
use dlock_rt::Clock;
use serde_json::Value;
use uuid::Uuid;

#[derive(Debug, Clone, Copy)]
pub enum Backend {
    Sim,
    Sqlite,
    Postgres,
}

/// A proxy on a fresh paydb of `backend`, in front of a rail-stub, both on loopback.
struct Served {
    base: BaseUrl,
    store: Arc<dyn RailStore>,
    stub: Arc<RailStub>,
    _stops: Vec<tokio::sync::oneshot::Sender<()>>,
    _guard: Option<dlock_testkit::TempDir>,
}

async fn serve_on_loopback(app: axum::Router) -> (BaseUrl, tokio::sync::oneshot::Sender<()>) {
    let listener = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
    let base = BaseUrl::parse(&format!("http://{}", listener.local_addr().expect("addr"))).expect("url");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(dlock_rt::http::serve(listener, app, async {
        let _ = rx.await;
    }));
    (base, tx)
}

async fn served(backend: Backend) -> Served {
    let (store, guard): (Arc<dyn RailStore>, _) = match backend {
        Backend::Sim => (Arc::new(MemRailStore::new()), None),
        Backend::Sqlite | Backend::Postgres => {
            let db =
                if let Backend::Sqlite = backend { dlock_testkit::Db::Sqlite } else { dlock_testkit::Db::Postgres };
            let (url, dir) = dlock_testkit::fresh_database(db).await;
            (dlock_rail_proxy::store_sql::open(&url).await.expect("open paydb"), Some(dir))
        }
    };
    let stub = RailStub::new(StubConfig::default(), Clock::system());
    let (rail_url, stop_stub) = serve_on_loopback(dlock_rail_stub::router(stub.clone())).await;
    let cfg = ProxyConfig {
        rail_url,
        connect_timeout_ms: 500,
        read_timeout_ms: 2_000,
        fencing_enabled: true,
        duplicate_guard_enabled: true,
        body_bytes_max: 4_096,
        grants: dlock_contract::grant::testing::verifier(),
        auth: dlock_http::auth::AuthSettings::inline(&dlock_testkit::auth::credentials()),
    };
    let (base, stop_proxy) = serve_on_loopback(router(RailProxy::new(store.clone(), cfg, Clock::system()))).await;
    Served { base, store, stub, _stops: vec![stop_stub, stop_proxy], _guard: guard }
}

async fn claimed(store: &dyn RailStore) -> Uuid {
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

async fn submit(s: &Served, path: &str, body: &str) -> (u16, Value) {
    // The test key's grant of `payout:a-1` (the payout's account) to w-1 under token 7.
    let sig = dlock_contract::grant::testing::sign_payout("a-1", 7, "w-1");
    let headers = [
        ("content-type", "application/json"),
        ("x-fencing-token", "7"),
        ("x-fencing-signature", sig.as_str()),
        ("x-owner-id", "w-1"),
        ("x-idempotency-key", "payout:k"),
    ];
    let resp = HttpClient::new(2_000, 10_000)
        .send(&s.base, axum::http::Method::POST, path, &headers, Some(Bytes::from(body.to_owned())))
        .await
        .expect("answer");
    if resp.status >= 400 {
        let ct = resp.headers.get("content-type").and_then(|v| v.to_str().ok());
        assert_eq!(ct, Some(CONTENT_TYPE_JSON), "{body}");
    }
    (resp.status, serde_json::from_slice(&resp.body).unwrap_or(Value::Null))
}

fn body(p: Uuid, beneficiary: &str) -> String {
    format!(
        r#"{{"payoutId":"{p}","accountId":"a-1","amountMinor":500,"currency":"EUR","beneficiaryRef":"{beneficiary}"}}"#
    )
}

async fn hostile_submissions_are_validation_failed_before_admission(backend: Backend) {
    let s = served(backend).await;
    let p = claimed(&*s.store).await;
    let cases = [
        (body(p, "b\\u0000"), "beneficiaryRef"),
        // The field itself (a bare "a-1" also occurs in some payout ids).
        (body(p, "b").replace(r#""accountId":"a-1""#, r#""accountId":"a-1\u0000""#), "accountId"),
        (body(p, "b").replace(r#""amountMinor":500"#, r#""amountMinor":500,"amountMinor":5"#), "amountMinor"),
        ("[1,2]".to_owned(), "$"),
        ("\"x\"".to_owned(), "$"),
    ];
    for (raw, field) in &cases {
        let (status, v) = submit(&s, "/v1/rail/submissions", raw).await;
        assert_eq!(status, 400, "{raw}: {v}");
        assert_eq!(v["code"], "VALIDATION_FAILED", "{raw}: {v}");
        assert_eq!(v["retrySafe"], false, "{raw}: {v}");
        assert_eq!(v["details"]["fields"][0]["field"], *field, "{raw}: {v}");
    }
    let (status, v) = submit(&s, "/v1/rail/submissions?x=%00", &body(p, "b")).await;
    assert_eq!((status, v["code"].as_str()), (400, Some("VALIDATION_FAILED")), "{v}");
    // Nothing was admitted or presented.
    assert_eq!(s.store.submissions(None).await.expect("rows"), vec![]);
    assert!(s.stub.calls().is_empty());
    // The same payout submits cleanly afterwards: the refusals left no trace.
    let (status, v) = submit(&s, "/v1/rail/submissions", &body(p, "b")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(s.stub.calls().len(), 1);
}

mod sim {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hostile_submissions_are_validation_failed_before_admission() {
        super::hostile_submissions_are_validation_failed_before_admission(super::Backend::Sim).await
    }
}

mod sqlite {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hostile_submissions_are_validation_failed_before_admission() {
        super::hostile_submissions_are_validation_failed_before_admission(super::Backend::Sqlite).await
    }
}

mod postgres {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hostile_submissions_are_validation_failed_before_admission() {
        super::hostile_submissions_are_validation_failed_before_admission(super::Backend::Postgres).await
    }
}
