//! Input hygiene at the payment-resource, over real HTTP on the simulation store, SQLite and
//! PostgreSQL: a NUL character in any string, a body that is not a JSON object, a key given
//! twice (two `amountMinor`s), or a `%00` in the path or query is `400 VALIDATION_FAILED`
//! (never retry-safe), before any idempotency fingerprint is taken, and writes nothing.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it drives them over real sockets and bounds its own waits with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

use std::sync::Arc;

use axum::body::Bytes;
use dlock_contract::CONTENT_TYPE_JSON;
use dlock_payment_resource::service::PaymentConfig;
use dlock_payment_resource::store_mem::MemPaydb;
use dlock_payment_resource::{router, PaymentResource, PaymentStore};
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

/// A payment-resource on a fresh paydb of `backend`, served on loopback.
struct Served {
    base: BaseUrl,
    _stop: tokio::sync::oneshot::Sender<()>,
    _guard: Option<dlock_testkit::TempDir>,
}

async fn served(backend: Backend) -> Served {
    let (store, guard): (Arc<dyn PaymentStore>, _) = match backend {
        Backend::Sim => (Arc::new(MemPaydb::new()), None),
        Backend::Sqlite | Backend::Postgres => {
            let db =
                if let Backend::Sqlite = backend { dlock_testkit::Db::Sqlite } else { dlock_testkit::Db::Postgres };
            let (url, dir) = dlock_testkit::fresh_database(db).await;
            (dlock_payment_resource::store_sql::open(&url).await.expect("open paydb"), Some(dir))
        }
    };
    let pr = PaymentResource::start(store, PaymentConfig::default(), Clock::system()).await.expect("start");
    let listener = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
    let base = BaseUrl::parse(&format!("http://{}", listener.local_addr().expect("addr"))).expect("url");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(dlock_rt::http::serve(listener, router(pr), async {
        let _ = rx.await;
    }));
    Served { base, _stop: tx, _guard: guard }
}

/// Sends `body` (raw JSON text) as a write of owner `ops` under idempotency key `key`.
async fn send(s: &Served, method: &str, path: &str, key: &str, body: Option<&str>) -> (u16, Value) {
    let mut headers = vec![("x-owner-id", "ops"), ("x-idempotency-key", key), ("x-fencing-token", "5")];
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

fn payout_body(id: Uuid, beneficiary: &str) -> String {
    format!(
        r#"{{"payoutId":"{id}","accountId":"acct-1","amountMinor":100,"currency":"EUR","beneficiaryRef":"{beneficiary}"}}"#
    )
}

async fn with_account(s: &Served) {
    let body = r#"{"accountId":"acct-1","currency":"EUR","openingBalanceMinor":10000}"#;
    let (st, v) = send(s, "POST", "/v1/accounts", "acct:acct-1", Some(body)).await;
    assert_eq!(st, 201, "{v}");
}

async fn nul_in_any_string_is_validation_failed_and_writes_nothing(backend: Backend) {
    let s = served(backend).await;
    with_account(&s).await;
    let id = Uuid::new_v4();
    let key = format!("create:{id}");
    let cases = [
        ("/v1/payouts".to_owned(), payout_body(id, "bene\\u0000-1"), "beneficiaryRef"),
        ("/v1/payouts".to_owned(), payout_body(id, "bene-1").replace("acct-1", "acct\\u0000"), "accountId"),
        (
            "/v1/accounts".to_owned(),
            r#"{"accountId":"acct-2\u0000","currency":"EUR","openingBalanceMinor":1}"#.to_owned(),
            "accountId",
        ),
        (format!("/v1/payouts/{id}/claim"), r#"{"expectedState":"PEN\u0000DING"}"#.to_owned(), "expectedState"),
        (format!("/v1/payouts/{id}/post"), r#"{"railReference":"r\u0000"}"#.to_owned(), "railReference"),
        ("/v1/accounts/acct%00-1".to_owned(), "{}".to_owned(), "path"),
    ];
    for (path, body, field) in &cases {
        let answer = send(&s, "POST", path, &key, Some(body)).await;
        assert_refused(&answer, field, &format!("POST {path} {body}"));
    }
    let (st, _) = send(&s, "GET", "/v1/accounts/acct%00-1", &key, None).await;
    assert_eq!(st, 400);
    let (st, v) = send(&s, "GET", "/v1/payouts?accountId=acct%00", &key, None).await;
    assert_refused(&(st, v), "query", "GET list with %00");
    // Nothing was written, and the key records no answer: the same key creates cleanly.
    let (st, _) = send(&s, "GET", &format!("/v1/payouts/{id}"), &key, None).await;
    assert_eq!(st, 404);
    let (st, v) = send(&s, "POST", "/v1/payouts", &key, Some(&payout_body(id, "bene-1"))).await;
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["beneficiaryRef"], "bene-1", "{v}");
}

async fn a_body_that_is_not_an_object_is_validation_failed(backend: Backend) {
    let s = served(backend).await;
    with_account(&s).await;
    let id = Uuid::new_v4();
    for body in ["[1,2]", "\"x\"", "3", "null"] {
        for path in ["/v1/accounts".to_owned(), "/v1/payouts".to_owned(), format!("/v1/payouts/{id}/claim")] {
            let answer = send(&s, "POST", &path, &format!("k:{id}"), Some(body)).await;
            assert_refused(&answer, "$", &format!("POST {path} {body}"));
        }
        let answer = send(&s, "POST", &format!("/v1/payouts/{id}/post"), &format!("k:{id}"), Some(body)).await;
        assert_refused(&answer, "$", &format!("post {body}"));
    }
}

async fn two_amounts_in_one_body_are_validation_failed_and_never_resolved(backend: Backend) {
    let s = served(backend).await;
    with_account(&s).await;
    let id = Uuid::new_v4();
    let key = format!("create:{id}");
    let twice = format!(
        r#"{{"payoutId":"{id}","accountId":"acct-1","amountMinor":100,"currency":"EUR","beneficiaryRef":"b","amountMinor":9999}}"#
    );
    let answer = send(&s, "POST", "/v1/payouts", &key, Some(&twice)).await;
    assert_refused(&answer, "amountMinor", "two amountMinor");
    let nested = r#"{"accountId":"acct-3","currency":"EUR","openingBalanceMinor":1,"meta":{"a":1,"a":2}}"#;
    let answer = send(&s, "POST", "/v1/accounts", "acct:acct-3", Some(nested)).await;
    assert_refused(&answer, "meta.a", "nested duplicate");
    let (st, _) = send(&s, "GET", &format!("/v1/payouts/{id}"), &key, None).await;
    assert_eq!(st, 404, "the refused create wrote a payout");
    // The key's first recorded answer is the clean create, not the refused one.
    let (st, v) = send(&s, "POST", "/v1/payouts", &key, Some(&payout_body(id, "b"))).await;
    assert_eq!((st, v["amountMinor"].as_i64()), (201, Some(100)), "{v}");
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
    };
}

on_every_backend!(
    nul_in_any_string_is_validation_failed_and_writes_nothing,
    a_body_that_is_not_an_object_is_validation_failed,
    two_amounts_in_one_body_are_validation_failed_and_never_resolved,
);
