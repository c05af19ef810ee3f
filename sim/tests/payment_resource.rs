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

use dlock_contract::payment::{ClaimAck, ClaimRequest, NewAccountRequest, NewPayoutRequest, PostAck, PostRequest};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::{SubmissionAck, SubmissionOutcome, SubmissionRequest};
use dlock_contract::{ErrorCode, ErrorEnvelope, IdempotencyKey, OwnerId};
use dlock_lock_client::{LockClient, LockClientConfig};
use dlock_payment_client::{PaymentClient, PaymentClientConfig, PaymentRefusal};
use dlock_payment_resource::store::PaymentStore;
use dlock_rail_client::{RailClient, RailClientConfig, RailRefusal};
use dlock_rt::http::{BaseUrl, HttpClient};
use dlock_rt::Duration;
use dlock_sim::world::{self, url, violations, WorldSpec, LOCK_IP, PAYMENT_IP, PROXY_IP};
use serde_json::{json, Value};
use uuid::Uuid;

const ACCOUNT: &str = "acct-1";
const LEASE_MS: u64 = 3_000;
const PAUSE_MS: u64 = 12_000;

async fn world() -> world::World {
    world::start(WorldSpec::skewed()).await
}

fn lock_client(owner: &str) -> LockClient {
    let mut cfg = LockClientConfig::new(url(LOCK_IP, 8081), OwnerId::parse(owner).expect("owner"));
    cfg.session_ttl_ms = LEASE_MS;
    cfg.lock_ttl_ms = LEASE_MS;
    LockClient::new(cfg).expect("client config")
}

/// The read budget of these helpers' clients: long enough for any answer in these worlds.
const READ_TIMEOUT_MS: u64 = 20_000;

/// A payment client as a worker holds one, each call sent once (these tests count answers).
fn payment() -> PaymentClient {
    let mut cfg = PaymentClientConfig::new(url(PAYMENT_IP, 8082));
    cfg.write_read_timeout_ms = READ_TIMEOUT_MS;
    cfg.write_retries_max = 0;
    PaymentClient::new(cfg).expect("payment client")
}

fn rail() -> RailClient {
    let mut cfg = RailClientConfig::new(url(PROXY_IP, 8083));
    cfg.read_timeout_ms = READ_TIMEOUT_MS;
    RailClient::new(cfg).expect("rail client")
}

fn owner_id(owner: &str) -> OwnerId {
    OwnerId::parse(owner).expect("owner")
}

fn payout_key(payout: Uuid) -> IdempotencyKey {
    IdempotencyKey::parse(&format!("payout:{payout}")).expect("key")
}

/// A sent request whose answer must have come back (a success or a C3 envelope).
fn answered<T>(r: Result<T, PaymentRefusal>) -> Result<T, ErrorEnvelope> {
    r.map_err(|e| e.envelope().cloned().unwrap_or_else(|| panic!("the payment-resource answered: {e}")))
}

/// A success's state or outcome, or the refusal's code.
fn code<T, E: std::fmt::Display>(
    r: &Result<T, E>,
    state: impl Fn(&T) -> &'static str,
    refusal: impl Fn(&E) -> Option<ErrorCode>,
) -> String {
    match r {
        Ok(v) => state(v).to_owned(),
        Err(e) => refusal(e).map_or_else(|| format!("? {e}"), |c| c.as_str().to_owned()),
    }
}

fn claim_code(r: &Result<ClaimAck, PaymentRefusal>) -> String {
    code(r, |a| a.state.as_str(), PaymentRefusal::code)
}

fn submit_code(r: &Result<SubmissionAck, RailRefusal>) -> String {
    code(r, |a| a.outcome.as_str(), RailRefusal::code)
}

fn post_code(r: &Result<PostAck, PaymentRefusal>) -> String {
    code(r, |a| a.state.as_str(), PaymentRefusal::code)
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

async fn create_account_and_payouts(n: usize) -> Vec<Uuid> {
    let client = payment();
    let ops = owner_id("ops");
    let open = NewAccountRequest { account_id: ACCOUNT.into(), currency: "EUR".into(), opening_balance_minor: 10_000 };
    let key = |k: &str| IdempotencyKey::parse(k).expect("key");
    client.create_account(&ops, &key("acct-1"), &open).await.expect("account opened");
    let mut ids = Vec::new();
    for i in 0..n {
        let body = NewPayoutRequest {
            payout_id: None,
            account_id: ACCOUNT.into(),
            amount_minor: 1_000 + i as i64,
            currency: "EUR".into(),
            beneficiary_ref: "b".into(),
        };
        let created = client.create_payout(&ops, &key(&format!("create-{i}")), &body).await.expect("payout created");
        ids.push(created.payout_id);
    }
    ids
}

/// P2 under `token`, with the payout's stable idempotency key.
async fn claim(payout: Uuid, token: i64, owner: &str, expected: PayoutState) -> Result<ClaimAck, PaymentRefusal> {
    claim_keyed(payout, token, owner, expected, &payout_key(payout)).await
}

async fn claim_keyed(
    payout: Uuid,
    token: i64,
    owner: &str,
    expected: PayoutState,
    key: &IdempotencyKey,
) -> Result<ClaimAck, PaymentRefusal> {
    payment()
        .claim(
            payout,
            dlock_sim::world::signed(ACCOUNT, token, owner),
            &owner_id(owner),
            key,
            &ClaimRequest { expected_state: expected },
        )
        .await
}

async fn submit(payout: Uuid, amount: i64, token: i64, owner: &str) -> Result<SubmissionAck, RailRefusal> {
    let body = SubmissionRequest {
        payout_id: payout,
        account_id: ACCOUNT.into(),
        amount_minor: amount,
        currency: "EUR".into(),
        beneficiary_ref: "b".into(),
    };
    rail().submit(dlock_sim::world::signed(ACCOUNT, token, owner), &owner_id(owner), &payout_key(payout), &body).await
}

/// P3 under `token` of the rail's `(railReference, submissionId)`.
async fn post(payout: Uuid, token: i64, owner: &str, acked: (&str, Uuid)) -> Result<PostAck, PaymentRefusal> {
    let body = PostRequest {
        rail_reference: acked.0.to_owned(),
        submission_id: acked.1,
        rail_outcome: SubmissionOutcome::Acked.as_str().to_owned(),
    };
    payment()
        .post(payout, dlock_sim::world::signed(ACCOUNT, token, owner), &owner_id(owner), &payout_key(payout), &body)
        .await
}

/// Moves one payout the executor's way; returns the final answers' codes.
async fn settle(payout: Uuid, amount: i64, owner: &'static str) -> Vec<String> {
    let client = lock_client(owner);
    let session = client.open_session().await.expect("session");
    let mut trail = Vec::new();
    let guard = session.acquire("payout:acct-1").await.expect("grant");
    let t1 = guard.token().get();
    trail.push(claim_code(&claim(payout, t1, owner, PayoutState::Pending).await));
    let ack = submit(payout, amount, t1, owner).await;
    trail.push(submit_code(&ack));
    let _ = guard.release().await;
    let guard = session.acquire("payout:acct-1").await.expect("second grant");
    if let Ok(ack) = &ack {
        let posted = post(payout, guard.token().get(), owner, (&ack.rail_reference, ack.submission_id)).await;
        trail.push(post_code(&posted));
    }
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
        claim(p, token, "worker-a", PayoutState::Pending).await.expect("claimed");
        let _ = claimed_tx.send(token);
        dlock_rt::sleep(Duration::from_millis(200)).await;
        // A buggy worker goes on regardless, even under a regenerated idempotency key (the
        // stable key with its own token would be a conflicting replay, changing nothing);
        // every fence must stop it.
        let regenerated = IdempotencyKey::parse("regenerated").expect("key");
        let reclaim = claim_keyed(p, token, "worker-a", PayoutState::Claimed, &regenerated).await;
        let sub = submit(p, 1_000, token, "worker-a").await;
        let posted = post(p, token, "worker-a", ("forged", Uuid::nil())).await;
        (claim_code(&reclaim), submit_code(&sub), post_code(&posted), answered(reclaim).expect_err("refused"))
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
        let re = claim(p, t1, "worker-b", PayoutState::Claimed).await;
        let ack = submit(p, 1_000, t1, "worker-b").await;
        let _ = guard.release().await;
        let guard = session.acquire("payout:acct-1").await.expect("second grant");
        let t2 = guard.token().get();
        let acked = ack.as_ref().map(|a| (a.rail_reference.clone(), a.submission_id)).unwrap_or_default();
        let posted = post(p, t2, "worker-b", (&acked.0, acked.1)).await;
        let _ = guard.release().await;
        (t1, t2, claim_code(&re), submit_code(&ack), post_code(&posted))
    });
    let (t1, t2, re, ack, posted) = b.await.expect("worker B");
    assert!(t1 > token_a && t2 > t1);
    assert_eq!((re.as_str(), ack.as_str(), posted.as_str()), ("CLAIMED", "ACKED", "POSTED"));

    dlock_rt::sleep(Duration::from_millis(PAUSE_MS)).await;
    handle.resume(zombie.id());
    let (reclaim, sub, post_a, reclaim_body) = a.await.expect("worker A");
    let details = reclaim_body.details.unwrap_or_default();
    assert_eq!(reclaim, "FENCED_OUT", "{details}");
    assert_eq!(details["highestToken"], t2);
    assert_eq!(details["presentedToken"], token_a);
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
            let sig = dlock_sim::world::signed(ACCOUNT, 40, "w-1").signature.unwrap_or_default();
            let headers = [
                ("x-fencing-token", "40"),
                ("x-owner-id", "w-1"),
                ("x-idempotency-key", "payout:k"),
                ("x-fencing-signature", sig.as_str()),
            ];
            let path = format!("/v1/payouts/{p}/claim");
            let first = call_raw(url(PAYMENT_IP, 8082), &path, &headers, json!({"expectedState": "PENDING"})).await;
            (p, first)
        })
        .await
        .expect("first claim");
    let (p, (status, bytes)) = first;
    assert_eq!(status, 200);

    let payment = w.payment_node.as_ref().expect("the world has payment-1").id();
    handle.kill(payment);
    handle.restart(payment);
    dlock_rt::sleep(Duration::from_millis(100)).await;

    let after = client
        .spawn(async move {
            let sig = dlock_sim::world::signed(ACCOUNT, 40, "w-1").signature.unwrap_or_default();
            let headers = [
                ("x-fencing-token", "40"),
                ("x-owner-id", "w-1"),
                ("x-idempotency-key", "payout:k"),
                ("x-fencing-signature", sig.as_str()),
            ];
            let path = format!("/v1/payouts/{p}/claim");
            let replay = dlock_rt::wait_until(Duration::from_millis(50), Duration::from_millis(5_000), || {
                let path = path.clone();
                async move {
                    let r = HttpClient::new(500, 5_000)
                        .send(
                            &url(PAYMENT_IP, 8082),
                            http::Method::POST,
                            &path,
                            &[("content-type", "application/json"), headers[0], headers[1], headers[2], headers[3]],
                            Some(json!({"expectedState": "PENDING"}).to_string().into()),
                        )
                        .await
                        .ok()?;
                    Some((r.status, r.body.to_vec()))
                }
            })
            .await
            .expect("the restarted node answers");
            let stale = answered(claim(p, 40, "w-2", PayoutState::Claimed).await);
            (replay, stale)
        })
        .await
        .expect("after restart");
    let ((replay_status, replay_bytes), stale) = after;
    assert_eq!(replay_status, 200);
    assert_eq!(replay_bytes, bytes, "the recorded answer replays byte for byte across a restart");
    let stale = stale.expect_err("a stale token is refused");
    assert_eq!(stale.code, ErrorCode::FencedOut);
    assert_eq!(stale.details.unwrap_or_default()["highestToken"], 40);
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
