//! Per-node clock drift against the lock client's safety margin, in the whole cluster.
//!
//! A worker's client believes a lease for `ttl × (1 − safety_margin)` of *its own* clock
//! (FR-11). On a node whose clock runs at rate `r` that is `ttl × (1 − margin) / r` of real
//! time, so with the default margin of 30 %:
//!
//! - drift within the margin (here 20 % slow) is absorbed by the client itself: its grant
//!   is lost locally before the server lets anyone else take the lock;
//! - drift beyond it (here 40 % slow) makes a stale writer: the client still believes its
//!   lease after the server has granted the lock to a newer holder. Only the fences stop it,
//!   at the account (claim), at the ledger (post) and at the rail (high-water mark). The
//!   test asserts the client *was* fooled at the moment it wrote, so the fences are what
//!   held, not luck in the timing.
//!
//! Workers are hand-written lock-client workers, each on its own node; the drifting node's
//! clock is set with `dlock_rt::sim_clock::set_rate` before it starts.

#![cfg(madsim)]

use std::net::IpAddr;

use dlock_contract::payment::{ClaimAck, ClaimRequest, NewAccountRequest, NewPayoutRequest, PostAck, PostRequest};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::{SubmissionAck, SubmissionOutcome, SubmissionRequest};
use dlock_contract::{IdempotencyKey, OwnerId};
use dlock_lock_client::{LockClient, LockClientConfig, LossReason};
use dlock_payment_client::{PaymentClient, PaymentClientConfig, PaymentRefusal};
use dlock_payment_resource::store::PaymentStore;
use dlock_rail_client::{RailClient, RailClientConfig, RailRefusal};
use dlock_rt::{sim_clock, Duration, Instant};
use dlock_sim::world::{
    self, url, violations, WorldSpec, LOCK_IP, LOCK_PORT, PAYMENT_IP, PAYMENT_PORT, PROXY_IP, PROXY_PORT,
};
use uuid::Uuid;

const ACCOUNT: &str = "acct-1";
const LOCK_KEY: &str = "payout:acct-1";
/// Lease of every grant and session here: long, so that the drift's effect (a fraction of
/// it) dwarfs network latency.
const LEASE_MS: u64 = 10_000;
/// How long the newer worker may wait for the lock (simulated).
const TAKEOVER_MS_MAX: u64 = 30_000;
const OPENING_BALANCE_MINOR: i64 = 10_000;
const AMOUNT_MINOR: i64 = 1_000;
const READ_TIMEOUT_MS: u64 = 20_000;

fn lock_client(owner: &str) -> LockClient {
    let mut cfg = LockClientConfig::new(url(LOCK_IP, LOCK_PORT), OwnerId::parse(owner).expect("owner"));
    cfg.session_ttl_ms = LEASE_MS;
    cfg.lock_ttl_ms = LEASE_MS;
    LockClient::new(cfg).expect("client config")
}

fn payment() -> PaymentClient {
    let mut cfg = PaymentClientConfig::new(url(PAYMENT_IP, PAYMENT_PORT));
    cfg.write_read_timeout_ms = READ_TIMEOUT_MS;
    cfg.write_retries_max = 0;
    PaymentClient::new(cfg).expect("payment client")
}

fn rail() -> RailClient {
    let mut cfg = RailClientConfig::new(url(PROXY_IP, PROXY_PORT));
    cfg.read_timeout_ms = READ_TIMEOUT_MS;
    RailClient::new(cfg).expect("rail client")
}

fn owner_id(owner: &str) -> OwnerId {
    OwnerId::parse(owner).expect("owner")
}

fn key(k: &str) -> IdempotencyKey {
    IdempotencyKey::parse(k).expect("key")
}

fn payout_key(payout: Uuid) -> IdempotencyKey {
    key(&format!("payout:{payout}"))
}

fn claim_code(r: &Result<ClaimAck, PaymentRefusal>) -> String {
    r.as_ref().map_or_else(
        |e| e.code().map_or_else(|| format!("? {e}"), |c| c.as_str().to_owned()),
        |a| a.state.as_str().to_owned(),
    )
}

fn post_code(r: &Result<PostAck, PaymentRefusal>) -> String {
    r.as_ref().map_or_else(
        |e| e.code().map_or_else(|| format!("? {e}"), |c| c.as_str().to_owned()),
        |a| a.state.as_str().to_owned(),
    )
}

fn submit_code(r: &Result<SubmissionAck, RailRefusal>) -> String {
    r.as_ref().map_or_else(
        |e| e.code().map_or_else(|| format!("? {e}"), |c| c.as_str().to_owned()),
        |a| a.outcome.as_str().to_owned(),
    )
}

async fn claim(
    payout: Uuid,
    token: i64,
    owner: &str,
    expected: PayoutState,
    k: &IdempotencyKey,
) -> Result<ClaimAck, PaymentRefusal> {
    payment()
        .claim(
            payout,
            dlock_sim::world::signed(ACCOUNT, token, owner),
            &owner_id(owner),
            k,
            &ClaimRequest { expected_state: expected },
        )
        .await
}

async fn submit(payout: Uuid, token: i64, owner: &str) -> Result<SubmissionAck, RailRefusal> {
    let body = SubmissionRequest {
        payout_id: payout,
        account_id: ACCOUNT.into(),
        amount_minor: AMOUNT_MINOR,
        currency: "EUR".into(),
        beneficiary_ref: "b".into(),
    };
    rail().submit(dlock_sim::world::signed(ACCOUNT, token, owner), &owner_id(owner), &payout_key(payout), &body).await
}

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

/// One account and one PENDING payout, opened from a setup node.
async fn seed_one_payout() -> Uuid {
    let handle = madsim::runtime::Handle::current();
    let setup = handle.create_node().name("setup").ip(IpAddr::from([10, 0, 0, 9])).build();
    setup
        .spawn(async {
            let client = payment();
            let ops = owner_id("ops");
            let open = NewAccountRequest {
                account_id: ACCOUNT.into(),
                currency: "EUR".into(),
                opening_balance_minor: OPENING_BALANCE_MINOR,
            };
            client.create_account(&ops, &key("acct-1"), &open).await.expect("account opened");
            let body = NewPayoutRequest {
                payout_id: None,
                account_id: ACCOUNT.into(),
                amount_minor: AMOUNT_MINOR,
                currency: "EUR".into(),
                beneficiary_ref: "b".into(),
            };
            client.create_payout(&ops, &key("create-0"), &body).await.expect("payout created").payout_id
        })
        .await
        .expect("setup")
}

/// What the newer worker did: its two tokens, its answers, and when (reference clock) the
/// server let it have the lock.
struct Takeover {
    claim_token: i64,
    post_token: i64,
    codes: (String, String, String),
    granted_at: Instant,
}

/// Worker B, on a correct clock: waits for the lock, re-claims the payout (recovery),
/// submits it, and posts it under a newer grant.
async fn take_over(p: Uuid) -> Takeover {
    let session = lock_client("worker-b").open_session().await.expect("session");
    let guard = dlock_rt::wait_until(Duration::from_millis(250), Duration::from_millis(TAKEOVER_MS_MAX), || {
        let session = &session;
        async move { session.acquire(LOCK_KEY).await.ok() }
    })
    .await
    .expect("B got the lock once A's lease lapsed on the server");
    let granted_at = sim_clock::reference_now();
    let t1 = guard.token().get();
    let re = claim(p, t1, "worker-b", PayoutState::Claimed, &payout_key(p)).await;
    let ack = submit(p, t1, "worker-b").await;
    let _ = guard.release().await;
    let guard = session.acquire(LOCK_KEY).await.expect("second grant");
    let t2 = guard.token().get();
    let acked = ack.as_ref().map(|a| (a.rail_reference.clone(), a.submission_id)).unwrap_or_default();
    let posted = post(p, t2, "worker-b", (&acked.0, acked.1)).await;
    let _ = guard.release().await;
    Takeover {
        claim_token: t1,
        post_token: t2,
        codes: (claim_code(&re), submit_code(&ack), post_code(&posted)),
        granted_at,
    }
}

#[madsim::test]
async fn drift_beyond_the_safety_margin_is_caught_by_the_fences() {
    let handle = madsim::runtime::Handle::current();
    eprintln!("dlock-sim seed={}", handle.seed());
    let w = world::start(WorldSpec::skewed()).await;
    let p = seed_one_payout().await;

    // Worker A's clock runs 40 % slow: beyond the 30 % margin, it over-believes its lease.
    let slow = handle.create_node().name("worker-a").ip(IpAddr::from([10, 0, 0, 10])).build();
    sim_clock::set_rate(slow.id(), 0.6);
    let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel::<i64>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let a = slow.spawn(async move {
        let session = lock_client("worker-a").open_session().await.expect("session");
        let guard = session.acquire(LOCK_KEY).await.expect("grant");
        let token = guard.token().get();
        claim(p, token, "worker-a", PayoutState::Pending, &payout_key(p)).await.expect("claimed");
        let _ = claimed_tx.send(token);
        let _ = go_rx.await;
        // A worker that checks its lease before every write, as it must: the slow clock
        // says the lease is still good.
        let held = guard.is_held();
        let regenerated = key("regenerated");
        let reclaim = claim(p, token, "worker-a", PayoutState::Claimed, &regenerated).await;
        let sub = submit(p, token, "worker-a").await;
        let posted = post(p, token, "worker-a", ("forged", Uuid::nil())).await;
        (held, claim_code(&reclaim), submit_code(&sub), post_code(&posted))
    });
    let token_a = claimed_rx.await.expect("A claimed");

    let fast = handle.create_node().name("worker-b").ip(IpAddr::from([10, 0, 0, 11])).build();
    let b = fast.spawn(take_over(p)).await.expect("worker B");
    assert!(
        b.claim_token > token_a && b.post_token > b.claim_token,
        "tokens {token_a} < {} < {}",
        b.claim_token,
        b.post_token
    );
    assert_eq!(b.codes, ("CLAIMED".into(), "ACKED".into(), "POSTED".into()));

    let _ = go_tx.send(());
    let (held, reclaim, sub, posted) = a.await.expect("worker A");
    assert!(held, "the slow clock must have fooled A's client (else the fences were never tested)");
    assert_eq!(reclaim, "FENCED_OUT", "the account fence must stop the stale claim");
    assert_eq!(sub, "FENCED_OUT", "the rail-proxy's high-water mark must stop the stale submission");
    assert_eq!(posted, "FENCED_OUT", "the ledger fence must stop the stale post");

    let calls = w.rail_calls().await;
    assert_eq!(calls, [p.to_string()], "the payout reached the rail once, B's call");
    assert_eq!(violations(&w.paydb, &calls).await, Vec::<String>::new());
    let acct = PaymentStore::account(&*w.paydb, ACCOUNT).await.expect("read").expect("account");
    assert_eq!((acct.balance_minor, acct.fence), (OPENING_BALANCE_MINOR - AMOUNT_MINOR, b.post_token));
}

#[madsim::test]
async fn drift_within_the_safety_margin_is_caught_by_the_client_itself() {
    let handle = madsim::runtime::Handle::current();
    eprintln!("dlock-sim seed={}", handle.seed());
    let w = world::start(WorldSpec::skewed()).await;
    let p = seed_one_payout().await;

    // Worker A's clock runs 20 % slow: within the margin, its client gives the lease up
    // before the server does.
    let slow = handle.create_node().name("worker-a").ip(IpAddr::from([10, 0, 0, 10])).build();
    sim_clock::set_rate(slow.id(), 0.8);
    let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel::<i64>();
    let a = slow.spawn(async move {
        let session = lock_client("worker-a").open_session().await.expect("session");
        let guard = session.acquire(LOCK_KEY).await.expect("grant");
        let token = guard.token().get();
        claim(p, token, "worker-a", PayoutState::Pending, &payout_key(p)).await.expect("claimed");
        let _ = claimed_tx.send(token);
        let reason = guard.lost().await;
        (reason, sim_clock::reference_now())
    });
    let token_a = claimed_rx.await.expect("A claimed");

    let fast = handle.create_node().name("worker-b").ip(IpAddr::from([10, 0, 0, 11])).build();
    let b = fast.spawn(take_over(p)).await.expect("worker B");
    let (reason, lost_at) = a.await.expect("worker A");
    assert_eq!(reason, LossReason::DeadlinePassed);
    assert!(lost_at < b.granted_at, "A's client gave up at {lost_at:?}, after B was granted at {:?}", b.granted_at);
    assert!(b.claim_token > token_a);
    assert_eq!(b.codes, ("CLAIMED".into(), "ACKED".into(), "POSTED".into()));
    let calls = w.rail_calls().await;
    assert_eq!(calls, [p.to_string()]);
    assert_eq!(violations(&w.paydb, &calls).await, Vec::<String>::new());
}
