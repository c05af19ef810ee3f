//! The payment-resource on its own madsim node, beside the lock server, the rail-proxy and
//! the rail-stub. The payment-resource and the proxy share one simulation paydb (as their
//! SQL stores share one database), which outlives every service node.
//!
//! - A payout settles the way the executor will move it: acquire, claim, submit, release,
//!   acquire again, post (C-10: a post needs a newer grant than the claim).
//! - A worker paused past its lease after claiming is fenced out at the resource (claim and
//!   post) and at the rail, while the newer holder settles the payout.
//! - A restarted payment-resource node keeps the fence (it lives in paydb) and replays a
//!   recorded claim byte for byte.
//!
//! The checkers read paydb, never the answers: the ledger balances, no account is
//! overdrawn, and the rail saw at most one call per payout.

#![cfg(madsim)]

use std::net::IpAddr;

use dlock_contract::OwnerId;
use dlock_lock_client::{LockClient, LockClientConfig};
use dlock_payment_resource::store::PaymentStore;
use dlock_rt::http::{BaseUrl, HttpClient};
use dlock_rt::Duration;
use dlock_sim::world::{self, url, violations, WorldConfig, LOCK_IP, PAYMENT_IP, PROXY_IP};
use serde_json::{json, Value};
use uuid::Uuid;

const ACCOUNT: &str = "acct-1";
const LEASE_MS: u64 = 3_000;
const PAUSE_MS: u64 = 12_000;

async fn world() -> world::World {
    world::start(WorldConfig::default()).await
}

fn lock_client(owner: &str) -> LockClient {
    let mut cfg = LockClientConfig::new(url(LOCK_IP, 8081), OwnerId::parse(owner).expect("owner"));
    cfg.session_ttl_ms = LEASE_MS;
    cfg.lock_ttl_ms = LEASE_MS;
    LockClient::new(cfg).expect("client config")
}

/// One JSON call; the status and body.
async fn call(base: BaseUrl, path: &str, headers: &[(&str, &str)], body: Value) -> (u16, Value) {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let r = HttpClient::new(1_000, 20_000)
        .send(&base, http::Method::POST, path, &all, Some(body.to_string().into()))
        .await
        .expect("service answered");
    (r.status, serde_json::from_slice(&r.body).unwrap_or(Value::Null))
}

async fn call_raw(base: BaseUrl, path: &str, headers: &[(&str, &str)], body: Value) -> (u16, Vec<u8>) {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let r = HttpClient::new(1_000, 20_000)
        .send(&base, http::Method::POST, path, &all, Some(body.to_string().into()))
        .await
        .expect("service answered");
    (r.status, r.body.to_vec())
}

fn code(v: &Value) -> String {
    v.get("code").or_else(|| v.get("state")).or_else(|| v.get("outcome")).and_then(Value::as_str).unwrap_or("?").into()
}

async fn create_account_and_payouts(n: usize) -> Vec<Uuid> {
    let (s, v) = call(
        url(PAYMENT_IP, 8082),
        "/v1/accounts",
        &[("x-owner-id", "ops"), ("x-idempotency-key", "acct-1")],
        json!({"accountId": ACCOUNT, "currency": "EUR", "openingBalanceMinor": 10_000}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let mut ids = Vec::new();
    for i in 0..n {
        let key = format!("create-{i}");
        let (s, v) = call(
            url(PAYMENT_IP, 8082),
            "/v1/payouts",
            &[("x-owner-id", "ops"), ("x-idempotency-key", &key)],
            json!({"accountId": ACCOUNT, "amountMinor": 1_000 + i as i64, "currency": "EUR", "beneficiaryRef": "b"}),
        )
        .await;
        assert_eq!(s, 201, "{v}");
        ids.push(Uuid::parse_str(v["payoutId"].as_str().expect("id")).expect("uuid"));
    }
    ids
}

async fn claim(payout: Uuid, token: i64, owner: &str, expected: &str) -> (u16, Value) {
    let (t, key) = (token.to_string(), format!("payout:{payout}"));
    call(
        url(PAYMENT_IP, 8082),
        &format!("/v1/payouts/{payout}/claim"),
        &[("x-fencing-token", &t), ("x-owner-id", owner), ("x-idempotency-key", &key)],
        json!({"expectedState": expected}),
    )
    .await
}

async fn submit(payout: Uuid, amount: i64, token: i64, owner: &str) -> (u16, Value) {
    let (t, key) = (token.to_string(), format!("payout:{payout}"));
    call(
        url(PROXY_IP, 8083),
        "/v1/rail/submissions",
        &[("x-fencing-token", &t), ("x-owner-id", owner), ("x-idempotency-key", &key)],
        json!({"payoutId": payout, "accountId": ACCOUNT, "amountMinor": amount, "currency": "EUR", "beneficiaryRef": "b"}),
    )
    .await
}

async fn post(payout: Uuid, token: i64, owner: &str, ack: &Value) -> (u16, Value) {
    let (t, key) = (token.to_string(), format!("payout:{payout}"));
    call(
        url(PAYMENT_IP, 8082),
        &format!("/v1/payouts/{payout}/post"),
        &[("x-fencing-token", &t), ("x-owner-id", owner), ("x-idempotency-key", &key)],
        json!({"railReference": ack["railReference"], "submissionId": ack["submissionId"], "railOutcome": "ACKED"}),
    )
    .await
}

/// Moves one payout the executor's way; returns the final answers' codes.
async fn settle(payout: Uuid, amount: i64, owner: &'static str) -> Vec<String> {
    let client = lock_client(owner);
    let session = client.open_session().await.expect("session");
    let mut trail = Vec::new();
    let guard = session.acquire("payout:acct-1").await.expect("grant");
    let t1 = guard.token().get();
    let (_, v) = claim(payout, t1, owner, "PENDING").await;
    trail.push(code(&v));
    let (_, ack) = submit(payout, amount, t1, owner).await;
    trail.push(code(&ack));
    let _ = guard.release().await;
    let guard = session.acquire("payout:acct-1").await.expect("second grant");
    let (_, v) = post(payout, guard.token().get(), owner, &ack).await;
    trail.push(code(&v));
    let _ = guard.release().await;
    trail
}

#[madsim::test]
async fn payment_resource_on_a_madsim_node_settles_payouts_through_the_proxy() {
    let seed = madsim::runtime::Handle::current().seed();
    eprintln!("dlock-sim seed={seed}");
    let handle = madsim::runtime::Handle::current();
    let w = world().await;
    let worker = handle.create_node().name("worker").ip(IpAddr::from([10, 0, 0, 10])).build();
    let trails = worker
        .spawn(async move {
            let ids = create_account_and_payouts(3).await;
            let mut trails = Vec::new();
            for (i, id) in ids.iter().enumerate() {
                trails.push(settle(*id, 1_000 + i as i64, "worker-1").await);
            }
            (ids, trails)
        })
        .await
        .expect("worker");
    let (ids, trails) = trails;
    for t in &trails {
        assert_eq!(t, &["CLAIMED", "ACKED", "POSTED"], "{trails:?}");
    }
    let acct = PaymentStore::account(&*w.paydb, ACCOUNT).await.expect("read").expect("account");
    assert_eq!(acct.balance_minor, 10_000 - 1_000 - 1_001 - 1_002);
    let calls = w.rail_calls().await;
    assert_eq!(calls.len(), ids.len());
    assert_eq!(violations(&w.paydb, &calls).await, Vec::<String>::new());
}

#[madsim::test]
async fn a_worker_paused_after_its_claim_is_fenced_out_at_claim_post_and_rail() {
    let seed = madsim::runtime::Handle::current().seed();
    eprintln!("dlock-sim seed={seed}");
    let handle = madsim::runtime::Handle::current();
    let w = world().await;
    let setup = handle.create_node().name("setup").ip(IpAddr::from([10, 0, 0, 9])).build();
    let ids = setup.spawn(create_account_and_payouts(1)).await.expect("setup");
    let p = ids[0];

    // A claims, then freezes before it submits.
    let zombie = handle.create_node().name("worker-a").ip(IpAddr::from([10, 0, 0, 10])).build();
    let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel::<i64>();
    let a = zombie.spawn(async move {
        let session = lock_client("worker-a").open_session().await.expect("session");
        let guard = session.acquire("payout:acct-1").await.expect("grant");
        let token = guard.token().get();
        let (s, _) = claim(p, token, "worker-a", "PENDING").await;
        assert_eq!(s, 200);
        let _ = claimed_tx.send(token);
        dlock_rt::sleep(Duration::from_millis(200)).await;
        // A buggy worker goes on regardless, even under a regenerated idempotency key (the
        // stable key with its own token would be a conflicting replay, changing nothing);
        // every fence must stop it.
        let t = token.to_string();
        let reclaim = call(
            url(PAYMENT_IP, 8082),
            &format!("/v1/payouts/{p}/claim"),
            &[("x-fencing-token", &t), ("x-owner-id", "worker-a"), ("x-idempotency-key", "regenerated")],
            json!({"expectedState": "CLAIMED"}),
        )
        .await;
        let sub = submit(p, 1_000, token, "worker-a").await;
        let fake_ack = json!({"railReference": "forged", "submissionId": Uuid::nil()});
        let posted = post(p, token, "worker-a", &fake_ack).await;
        (code(&reclaim.1), code(&sub.1), code(&posted.1), reclaim.1)
    });
    let token_a = claimed_rx.await.expect("A claimed");
    handle.pause(zombie.id());

    // B waits out A's lease, re-claims (recovery), submits, and posts under a newer grant.
    let worker_b = handle.create_node().name("worker-b").ip(IpAddr::from([10, 0, 0, 11])).build();
    let b = worker_b.spawn(async move {
        let session = lock_client("worker-b").open_session().await.expect("session");
        let guard = dlock_rt::wait_until(Duration::from_millis(250), Duration::from_millis(PAUSE_MS), || {
            let session = &session;
            async move { session.acquire("payout:acct-1").await.ok() }
        })
        .await
        .expect("B got the lock once A's lease lapsed");
        let t1 = guard.token().get();
        let (_, re) = claim(p, t1, "worker-b", "CLAIMED").await;
        let (_, ack) = submit(p, 1_000, t1, "worker-b").await;
        let _ = guard.release().await;
        let guard = session.acquire("payout:acct-1").await.expect("second grant");
        let t2 = guard.token().get();
        let (_, posted) = post(p, t2, "worker-b", &ack).await;
        let _ = guard.release().await;
        (t1, t2, code(&re), code(&ack), code(&posted))
    });
    let (t1, t2, re, ack, posted) = b.await.expect("worker B");
    assert!(t1 > token_a && t2 > t1);
    assert_eq!((re.as_str(), ack.as_str(), posted.as_str()), ("CLAIMED", "ACKED", "POSTED"));

    dlock_rt::sleep(Duration::from_millis(PAUSE_MS)).await;
    handle.resume(zombie.id());
    let (reclaim, sub, post_a, reclaim_body) = a.await.expect("worker A");
    assert_eq!(reclaim, "FENCED_OUT", "{reclaim_body}");
    assert_eq!(reclaim_body["details"]["highestToken"], t2);
    assert_eq!(reclaim_body["details"]["presentedToken"], token_a);
    assert_eq!(sub, "FENCED_OUT", "the rail-proxy must fence the zombie's submission");
    assert_eq!(post_a, "FENCED_OUT", "the ledger must fence the zombie's post");
    let calls = w.rail_calls().await;
    assert_eq!(calls, [p.to_string()]);
    assert_eq!(violations(&w.paydb, &calls).await, Vec::<String>::new());
    let acct = PaymentStore::account(&*w.paydb, ACCOUNT).await.expect("read").expect("account");
    assert_eq!((acct.balance_minor, acct.fence), (9_000, t2));
}

#[madsim::test]
async fn payment_resource_restart_on_madsim_keeps_the_fence_and_replays() {
    let handle = madsim::runtime::Handle::current();
    let w = world().await;
    let client = handle.create_node().name("worker").ip(IpAddr::from([10, 0, 0, 10])).build();
    let first = client
        .spawn(async {
            let ids = create_account_and_payouts(1).await;
            let p = ids[0];
            let headers = [("x-fencing-token", "40"), ("x-owner-id", "w-1"), ("x-idempotency-key", "payout:k")];
            let path = format!("/v1/payouts/{p}/claim");
            let first = call_raw(url(PAYMENT_IP, 8082), &path, &headers, json!({"expectedState": "PENDING"})).await;
            (p, first)
        })
        .await
        .expect("first claim");
    let (p, (status, bytes)) = first;
    assert_eq!(status, 200);

    handle.kill(w.payment_node.id());
    handle.restart(w.payment_node.id());
    dlock_rt::sleep(Duration::from_millis(100)).await;

    let after = client
        .spawn(async move {
            let headers = [("x-fencing-token", "40"), ("x-owner-id", "w-1"), ("x-idempotency-key", "payout:k")];
            let path = format!("/v1/payouts/{p}/claim");
            let replay = dlock_rt::wait_until(Duration::from_millis(50), Duration::from_millis(5_000), || {
                let path = path.clone();
                async move {
                    let r = HttpClient::new(500, 5_000)
                        .send(
                            &url(PAYMENT_IP, 8082),
                            http::Method::POST,
                            &path,
                            &[("content-type", "application/json"), headers[0], headers[1], headers[2]],
                            Some(json!({"expectedState": "PENDING"}).to_string().into()),
                        )
                        .await
                        .ok()?;
                    Some((r.status, r.body.to_vec()))
                }
            })
            .await
            .expect("the restarted node answers");
            let stale = claim(p, 40, "w-2", "CLAIMED").await;
            (replay, stale)
        })
        .await
        .expect("after restart");
    let ((replay_status, replay_bytes), (stale_status, stale)) = after;
    assert_eq!(replay_status, 200);
    assert_eq!(replay_bytes, bytes, "the recorded answer replays byte for byte across a restart");
    assert_eq!(stale_status, 409);
    assert_eq!(stale["code"], "FENCED_OUT");
    assert_eq!(stale["details"]["highestToken"], 40);
}

#[test]
fn payment_flow_replays_bit_for_bit() {
    let seed = std::env::var("MADSIM_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(11);
    madsim::runtime::Runtime::check_determinism(seed, madsim::Config::default(), || async {
        let handle = madsim::runtime::Handle::current();
        let w = world().await;
        let worker = handle.create_node().name("worker").ip(IpAddr::from([10, 0, 0, 10])).build();
        worker
            .spawn(async {
                let ids = create_account_and_payouts(2).await;
                for (i, id) in ids.iter().enumerate() {
                    settle(*id, 1_000 + i as i64, "worker-1").await;
                }
            })
            .await
            .expect("worker");
        let _ = w.rail_calls().await;
        let _ = PaymentStore::ledger(&*w.paydb, None).await;
    });
}
