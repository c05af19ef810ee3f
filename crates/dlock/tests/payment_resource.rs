//! The payment-resource as a real `dlock payment-resource` process beside the rail-stub,
//! the rail-proxy and the lock server, on SQLite and on PostgreSQL. The resource and the
//! proxy share one paydb; assertions read the services' answers, paydb through P4/P5, and
//! the rail's own call log.

#![cfg(not(madsim))]

#[macro_use]
mod common;

use common::*;
use dlock_contract::payment::{AccountBody, ClaimAck, ClaimRequest, PostAck, PostRequest};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::{SubmissionAck, SubmissionOutcome, SubmissionRequest};
use dlock_contract::{ErrorCode, ErrorEnvelope, FencingToken, IdempotencyKey, OwnerId};
use dlock_payment_client::PaymentRefusal;
use dlock_rail_client::{RailClient, RailClientConfig};
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

async fn setup(payment: &Service, opening: i64, amounts: &[i64]) -> Vec<Uuid> {
    let client = payment_client(payment);
    open_account(&client, "open-acct-1", "acct-1", opening).await;
    let mut ids = Vec::new();
    for (i, amount) in amounts.iter().enumerate() {
        ids.push(create_payout(&client, &format!("create-{i}"), "acct-1", *amount, "ben-1").await.payout_id);
    }
    ids
}

/// P2 as a worker sends it: the grant's token, the payout's stable key.
async fn claim(payment: &Service, p: Uuid, token: i64, owner: &str, expected: PayoutState) -> Claimed {
    claim_keyed(payment, p, token, owner, expected, &format!("payout:{p}")).await
}

type Claimed = Result<ClaimAck, PaymentRefusal>;

async fn claim_keyed(payment: &Service, p: Uuid, token: i64, owner: &str, expected: PayoutState, key: &str) -> Claimed {
    let (token, owner) = (FencingToken::new(token).expect("token"), OwnerId::parse(owner).expect("owner"));
    let key = IdempotencyKey::parse(key).expect("key");
    let token = signed_token(&payment.base, p, token.get(), owner.as_str()).await;
    payment_client(payment).claim(p, token, &owner, &key, &ClaimRequest { expected_state: expected }).await
}

/// P2 with its answer's raw bytes, for the byte-for-byte replay.
async fn claim_bytes(payment: &BaseUrl, p: Uuid, token: i64, owner: &str) -> (u16, Vec<u8>) {
    let (t, key) = (token.to_string(), format!("payout:{p}"));
    let sig = signed_token(payment, p, token, owner).await.signature.unwrap_or_default();
    let headers = [
        ("x-fencing-token", t.as_str()),
        ("x-owner-id", owner),
        ("x-idempotency-key", key.as_str()),
        ("x-fencing-signature", sig.as_str()),
    ];
    let (s, bytes, _) =
        call(payment, &format!("/v1/payouts/{p}/claim"), &headers, json!({"expectedState": "PENDING"})).await;
    (s, bytes)
}

/// The one submission, through the rail client.
async fn submit_once(proxy: &Service, p: Uuid, amount_minor: i64, token: i64) -> SubmissionAck {
    let body = SubmissionRequest {
        payout_id: p,
        account_id: "acct-1".into(),
        amount_minor,
        currency: "EUR".into(),
        beneficiary_ref: "ben-1".into(),
    };
    let mut cfg = RailClientConfig::new(proxy.base.clone());
    cfg.read_timeout_ms = client().read_timeout_ms;
    cfg.bearer = Some(dlock_testkit::auth::bearer());
    let (token, owner) = (FencingToken::new(token).expect("token"), OwnerId::parse("worker-1").expect("owner"));
    let key = IdempotencyKey::parse(&format!("payout:{p}")).expect("key");
    let token = dlock_contract::grant::SignedToken::new(token, sign_payout("acct-1", &token.to_string(), "worker-1"));
    RailClient::new(cfg).expect("rail client").submit(token, &owner, &key, &body).await.expect("acked")
}

async fn post(
    payment: &Service,
    p: Uuid,
    token: i64,
    owner: &str,
    ack: &SubmissionAck,
) -> Result<PostAck, PaymentRefusal> {
    let body = PostRequest {
        rail_reference: ack.rail_reference.clone(),
        submission_id: ack.submission_id,
        rail_outcome: SubmissionOutcome::Acked.as_str().to_owned(),
    };
    let (token, owner) = (FencingToken::new(token).expect("token"), OwnerId::parse(owner).expect("owner"));
    let key = IdempotencyKey::parse(&format!("payout:{p}")).expect("key");
    let token = signed_token(&payment.base, p, token.get(), owner.as_str()).await;
    payment_client(payment).post(p, token, &owner, &key, &body).await
}

async fn account(payment: &Service) -> AccountBody {
    payment_client(payment).account("acct-1").await.expect("P5")
}

/// A refusal's envelope (the service must have answered with one).
fn refused<T: std::fmt::Debug>(r: Result<T, PaymentRefusal>) -> ErrorEnvelope {
    match r {
        Err(PaymentRefusal::Refused { envelope, .. }) => envelope,
        other => panic!("expected a C3 envelope, got {other:?}"),
    }
}

async fn payout_flows_from_creation_through_the_rail_to_the_ledger(db: Db) {
    let c = cluster(db).await;
    let ids = setup(&c.payment, 5_000, &[1_200, 800]).await;
    for (i, p) in ids.iter().enumerate() {
        let amount = [1_200, 800][i];
        let claim_token = 10 + 2 * i as i64;
        let claimed = claim(&c.payment, *p, claim_token, "worker-1", PayoutState::Pending).await.expect("claimed");
        assert_eq!(claimed.state, PayoutState::Claimed);
        let ack = submit_once(&c.proxy, *p, amount, claim_token).await;
        let posted = post(&c.payment, *p, claim_token + 1, "worker-1", &ack).await.expect("posted");
        assert_eq!(posted.state, PayoutState::Posted);
        let view = payment_client(&c.payment).payout(*p).await.expect("P4");
        assert_eq!(view.state, PayoutState::Posted);
        assert_eq!(view.submissions[0].outcome, Some(SubmissionOutcome::Acked));
    }
    let a = account(&c.payment).await;
    assert_eq!(a.balance_minor, 3_000);
    assert_eq!(a.ledger_sum_minor, 3_000);
    assert_eq!(a.fence, 13);
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
    let ids = setup(&c.payment, 5_000, &[1_000]).await;
    let p = ids[0];

    // A takes the lock and claims; then it stalls past its 1 s lease.
    let token_a = grant(&lock.base, "worker-a", 0).await;
    claim(&c.payment, p, token_a, "worker-a", PayoutState::Pending).await.expect("A claims");
    // B waits for A's lease to lapse, takes the lock, re-claims, submits, posts.
    let token_b = grant(&lock.base, "worker-b", 10_000).await;
    assert!(token_b > token_a);
    claim(&c.payment, p, token_b, "worker-b", PayoutState::Claimed).await.expect("B re-claims");
    let ack = submit_once(&c.proxy, p, 1_000, token_b).await;
    let token_b2 = grant(&lock.base, "worker-b", 10_000).await;

    // A wakes and writes anyway (re-claiming under a regenerated key, since its stable key
    // with its own token would only be a conflicting replay): the resource fences it at
    // claim and at post.
    let v = refused(claim_keyed(&c.payment, p, token_a, "worker-a", PayoutState::Claimed, "regenerated").await);
    let details = v.details.clone().unwrap_or_default();
    assert_eq!(v.code, ErrorCode::FencedOut, "{v:?}");
    assert_eq!(details["presentedToken"], token_a);
    assert_eq!(details["highestToken"], token_b);
    assert_eq!(details["resourceType"], "account");
    let v = refused(post(&c.payment, p, token_a, "worker-a", &ack).await);
    assert_eq!(v.code, ErrorCode::FencedOut, "{v:?}");
    assert_eq!(v.details.unwrap_or_default()["resourceType"], "ledger");

    post(&c.payment, p, token_b2, "worker-b", &ack).await.expect("B posts");
    let a = account(&c.payment).await;
    assert_eq!((a.balance_minor, a.ledger_sum_minor), (4_000, 4_000));
    assert_eq!(rail_calls(&c.stub).await.len(), 1);
    let metrics = String::from_utf8(get(&c.payment, "/metrics").await.body.to_vec()).expect("utf8");
    assert!(metrics.contains("lock_fenced_out_total{resource=\"account\"} 1"), "{metrics}");
    assert!(metrics.contains("lock_fenced_out_total{resource=\"ledger\"} 1"), "{metrics}");
}

async fn payment_resource_restart_keeps_fences_and_replays_claims(db: Db) {
    let mut c = cluster(db).await;
    let ids = setup(&c.payment, 5_000, &[700]).await;
    let p = ids[0];
    let (s, first) = claim_bytes(&c.payment.base, p, 21, "worker-1").await;
    assert_eq!(s, 200);
    c.payment.crash_and_restart();
    let (s, again) = claim_bytes(&c.payment.base, p, 21, "worker-1").await;
    assert_eq!(s, 200);
    assert_eq!(again, first, "the recorded answer replays byte for byte after a kill -9");
    // An older holder's claim (a new identity: its own token) meets the fence paydb kept.
    let v = refused(claim(&c.payment, p, 20, "worker-0", PayoutState::Pending).await);
    assert_eq!(v.code, ErrorCode::FencedOut, "{v:?}");
    assert_eq!(v.details.unwrap_or_default()["highestToken"], 21);
}

on_both_databases!(
    payout_flows_from_creation_through_the_rail_to_the_ledger,
    a_paused_worker_is_fenced_out_at_claim_and_post,
    payment_resource_restart_keeps_fences_and_replays_claims,
);
