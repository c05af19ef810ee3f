//! The payment-resource as a real `dlock payment-resource` process beside the rail-stub,
//! the rail-proxy and the lock server, on SQLite and on PostgreSQL. The resource and the
//! proxy share one paydb; assertions read the services' answers, paydb through P4/P5, and
//! the rail's own call log.

#![cfg(not(madsim))]

#[macro_use]
mod common;

use common::*;
use dlock_rt::http::BaseUrl;
use dlock_testkit::{fresh_database, Db, TempDir};
use serde_json::{json, Value};
use uuid::Uuid;

struct Cluster {
    stub: Service,
    proxy: Service,
    payment: Service,
    _dir: TempDir,
}

async fn cluster(db: Db) -> Cluster {
    let (url, dir) = fresh_database(db).await;
    let stub = Service::start(&["rail-stub", "--seed", "3"]);
    let rail = stub.url();
    let payment = Service::start(&["payment-resource", "--database-url", &url]);
    let proxy = Service::start(&["rail-proxy", "--database-url", &url, "--rail-url", &rail]);
    Cluster { stub, proxy, payment, _dir: dir }
}

async fn call(base: &BaseUrl, path: &str, headers: &[(&str, &str)], body: Value) -> (u16, Vec<u8>, Value) {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let r = client()
        .send(base, http::Method::POST, path, &all, Some(body.to_string().into()))
        .await
        .expect("service answered");
    let v = json_of(&r);
    (r.status, r.body.to_vec(), v)
}

async fn setup(payment: &BaseUrl, opening: i64, amounts: &[i64]) -> Vec<Uuid> {
    let (s, _, v) = call(
        payment,
        "/v1/accounts",
        &[("x-owner-id", "ops"), ("x-idempotency-key", "open-acct-1")],
        json!({"accountId": "acct-1", "currency": "EUR", "openingBalanceMinor": opening}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let mut ids = Vec::new();
    for (i, amount) in amounts.iter().enumerate() {
        let key = format!("create-{i}");
        let (s, _, v) = call(
            payment,
            "/v1/payouts",
            &[("x-owner-id", "ops"), ("x-idempotency-key", &key)],
            json!({"accountId": "acct-1", "amountMinor": amount, "currency": "EUR", "beneficiaryRef": "ben-1"}),
        )
        .await;
        assert_eq!(s, 201, "{v}");
        ids.push(Uuid::parse_str(v["payoutId"].as_str().expect("id")).expect("uuid"));
    }
    ids
}

async fn claim(payment: &BaseUrl, p: Uuid, token: i64, owner: &str, expected: &str) -> (u16, Vec<u8>, Value) {
    let (t, key) = (token.to_string(), format!("payout:{p}"));
    call(
        payment,
        &format!("/v1/payouts/{p}/claim"),
        &[("x-fencing-token", &t), ("x-owner-id", owner), ("x-idempotency-key", &key)],
        json!({"expectedState": expected}),
    )
    .await
}

async fn post(payment: &BaseUrl, p: Uuid, token: i64, owner: &str, ack: &Value) -> (u16, Value) {
    let (t, key) = (token.to_string(), format!("payout:{p}"));
    let (s, _, v) = call(
        payment,
        &format!("/v1/payouts/{p}/post"),
        &[("x-fencing-token", &t), ("x-owner-id", owner), ("x-idempotency-key", &key)],
        json!({"railReference": ack["railReference"], "submissionId": ack["submissionId"], "railOutcome": "ACKED"}),
    )
    .await;
    (s, v)
}

async fn account(payment: &Service) -> Value {
    json_of(&get(payment, "/v1/accounts/acct-1").await)
}

async fn payout_flows_from_creation_through_the_rail_to_the_ledger(db: Db) {
    let c = cluster(db).await;
    let ids = setup(&c.payment.base, 5_000, &[1_200, 800]).await;
    for (i, p) in ids.iter().enumerate() {
        let amount = [1_200, 800][i];
        let claim_token = 10 + 2 * i as i64;
        let (s, _, v) = claim(&c.payment.base, *p, claim_token, "worker-1", "PENDING").await;
        assert_eq!((s, v["state"].as_str()), (200, Some("CLAIMED")), "{v}");
        let r = submit(&c.proxy, *p, "acct-1", amount, &claim_token.to_string()).await;
        assert_eq!(r.status, 200, "{:?}", json_of(&r));
        let ack = json_of(&r);
        let (s, v) = post(&c.payment.base, *p, claim_token + 1, "worker-1", &ack).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["state"], "POSTED");
        let view = json_of(&get(&c.payment, &format!("/v1/payouts/{p}")).await);
        assert_eq!(view["state"], "POSTED");
        assert_eq!(view["submissions"][0]["outcome"], "ACKED");
    }
    let a = account(&c.payment).await;
    assert_eq!(a["balanceMinor"], 3_000);
    assert_eq!(a["ledgerSumMinor"], 3_000);
    assert_eq!(a["fence"], 13);
    let calls = rail_calls(&c.stub).await;
    let refs: Vec<&str> = calls.iter().filter_map(|c| c["clientRef"].as_str()).collect();
    assert_eq!(
        refs,
        ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().iter().map(String::as_str).collect::<Vec<_>>()
    );
}

/// A lock server with short leases and no lock-delay, on its own SQLite lockdb.
fn lock_server(dir: &TempDir) -> Service {
    let url = dlock_testkit::sqlite_url(dir);
    Service::start(&["lock-server", "--database-url", &url, "--delay-ms", "0", "--reaper-interval-ms", "100"])
}

async fn grant(lock: &BaseUrl, owner: &str, wait_ms: u64) -> i64 {
    let (s, _, v) = call(lock, "/v1/sessions", &[("x-owner-id", owner)], json!({"ttlMillis": 30_000})).await;
    assert_eq!(s, 201, "{v}");
    let session = v["sessionId"].as_str().expect("session").to_owned();
    let (s, _, v) = call(
        lock,
        "/v1/locks/payout:acct-1/acquire",
        &[("x-owner-id", owner)],
        json!({"sessionId": session, "ttlMillis": 1_000, "waitMillis": wait_ms}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    v["fencingToken"].as_i64().expect("token")
}

async fn a_paused_worker_is_fenced_out_at_claim_and_post(db: Db) {
    let c = cluster(db).await;
    let lock_dir = TempDir::new("lockdb");
    let lock = lock_server(&lock_dir);
    let ids = setup(&c.payment.base, 5_000, &[1_000]).await;
    let p = ids[0];

    // A takes the lock and claims; then it stalls past its 1 s lease.
    let token_a = grant(&lock.base, "worker-a", 0).await;
    let (s, _, _) = claim(&c.payment.base, p, token_a, "worker-a", "PENDING").await;
    assert_eq!(s, 200);
    // B waits for A's lease to lapse, takes the lock, re-claims, submits, posts.
    let token_b = grant(&lock.base, "worker-b", 10_000).await;
    assert!(token_b > token_a);
    let (s, _, v) = claim(&c.payment.base, p, token_b, "worker-b", "CLAIMED").await;
    assert_eq!(s, 200, "{v}");
    let r = submit(&c.proxy, p, "acct-1", 1_000, &token_b.to_string()).await;
    assert_eq!(r.status, 200);
    let ack = json_of(&r);
    let token_b2 = grant(&lock.base, "worker-b", 10_000).await;

    // A wakes and writes anyway (re-claiming under a regenerated key, since its stable key
    // with its own token would only be a conflicting replay): the resource fences it at
    // claim and at post.
    let t = token_a.to_string();
    let (s, _, v) = call(
        &c.payment.base,
        &format!("/v1/payouts/{p}/claim"),
        &[("x-fencing-token", &t), ("x-owner-id", "worker-a"), ("x-idempotency-key", "regenerated")],
        json!({"expectedState": "CLAIMED"}),
    )
    .await;
    assert_eq!((s, v["code"].as_str()), (409, Some("FENCED_OUT")), "{v}");
    assert_eq!(v["details"]["presentedToken"], token_a);
    assert_eq!(v["details"]["highestToken"], token_b);
    assert_eq!(v["details"]["resourceType"], "account");
    let (s, v) = post(&c.payment.base, p, token_a, "worker-a", &ack).await;
    assert_eq!((s, v["code"].as_str()), (409, Some("FENCED_OUT")), "{v}");
    assert_eq!(v["details"]["resourceType"], "ledger");

    let (s, v) = post(&c.payment.base, p, token_b2, "worker-b", &ack).await;
    assert_eq!(s, 200, "{v}");
    let a = account(&c.payment).await;
    assert_eq!((a["balanceMinor"].as_i64(), a["ledgerSumMinor"].as_i64()), (Some(4_000), Some(4_000)));
    assert_eq!(rail_calls(&c.stub).await.len(), 1);
    let metrics = String::from_utf8(get(&c.payment, "/metrics").await.body.to_vec()).expect("utf8");
    assert!(metrics.contains("lock_fenced_out_total{resource=\"account\"} 1"), "{metrics}");
    assert!(metrics.contains("lock_fenced_out_total{resource=\"ledger\"} 1"), "{metrics}");
}

async fn payment_resource_restart_keeps_fences_and_replays_claims(db: Db) {
    let mut c = cluster(db).await;
    let ids = setup(&c.payment.base, 5_000, &[700]).await;
    let p = ids[0];
    let (s, first, _) = claim(&c.payment.base, p, 21, "worker-1", "PENDING").await;
    assert_eq!(s, 200);
    c.payment.crash_and_restart();
    let (s, again, _) = claim(&c.payment.base, p, 21, "worker-1", "PENDING").await;
    assert_eq!(s, 200);
    assert_eq!(again, first, "the recorded answer replays byte for byte after a kill -9");
    // An older holder's claim (a new identity: its own token) meets the fence paydb kept.
    let (s, _, v) = claim(&c.payment.base, p, 20, "worker-0", "PENDING").await;
    assert_eq!((s, v["code"].as_str()), (409, Some("FENCED_OUT")), "{v}");
    assert_eq!(v["details"]["highestToken"], 21);
}

on_both_databases!(
    payout_flows_from_creation_through_the_rail_to_the_ledger,
    a_paused_worker_is_fenced_out_at_claim_and_post,
    payment_resource_restart_keeps_fences_and_replays_claims,
);
