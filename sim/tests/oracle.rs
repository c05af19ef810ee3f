//! The oracle against the real world: a planted violation is caught by the online monitor
//! *at the acceptance* (the simulated instant the resource took the stale token), and a run
//! that is only hostile, not broken, gives no failure at all, online, at the end or in the
//! liveness check.
//!
//! Run many seeds with `MADSIM_TEST_NUM=1000`; replay one with `MADSIM_TEST_SEED=N`.

#![cfg(madsim)]

use std::collections::BTreeMap;
use std::net::IpAddr;

use dlock_contract::payment::{ClaimRequest, NewAccountRequest, NewPayoutRequest};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::SubmissionRequest;
use dlock_contract::{IdempotencyKey, OwnerId};
use dlock_payment_client::{PaymentClient, PaymentClientConfig};
use dlock_payment_resource::store::PaymentStore;
use dlock_rail_client::{RailClient, RailClientConfig};
use dlock_rt::Duration;
use dlock_sim::oracle::{self, ids, Monitor};
use dlock_sim::world::{self, url, WorldSpec, PAYMENT_IP, PAYMENT_PORT, PROXY_IP, PROXY_PORT};
use uuid::Uuid;

/// Lease of every executor grant in these worlds.
const LEASE_MS: u64 = 3_000;
/// How long the paused executor stays frozen: well past its lease and session.
const PAUSE_MS: u64 = 15_000;
/// Longest (simulated) a run may take to settle every payout.
const SETTLE_MS_MAX: u64 = 300_000;

fn key(k: &str) -> IdempotencyKey {
    IdempotencyKey::parse(k).expect("key")
}

/// `t` signed for the writer's grant of `payout:acct-0` (C3-extensions E-14).
fn signed(t: i64) -> dlock_contract::grant::SignedToken {
    dlock_sim::world::signed("acct-0", t, "writer")
}

/// Opens `accounts` accounts and `n` payouts through the payment-resource, from a node of
/// its own.
async fn seed_payouts(accounts: usize, n: usize) -> Vec<Uuid> {
    let setup = madsim::runtime::Handle::current().create_node().name("setup").ip(IpAddr::from([10, 0, 0, 9])).build();
    setup
        .spawn(async move {
            let mut cfg = PaymentClientConfig::new(url(PAYMENT_IP, PAYMENT_PORT));
            cfg.write_read_timeout_ms = 10_000;
            let client = PaymentClient::new(cfg).expect("payment client");
            let ops = OwnerId::parse("ops").expect("owner");
            for a in 0..accounts {
                let body = NewAccountRequest {
                    account_id: format!("acct-{a}"),
                    currency: "EUR".into(),
                    opening_balance_minor: 50_000,
                };
                client.create_account(&ops, &key(&format!("open-{a}")), &body).await.expect("account opened");
            }
            let mut ids = Vec::new();
            for i in 0..n {
                let body = NewPayoutRequest {
                    payout_id: None,
                    account_id: format!("acct-{}", i % accounts),
                    amount_minor: 1_000 + i as i64,
                    currency: "EUR".into(),
                    beneficiary_ref: format!("ben-{i}"),
                };
                let created = client.create_payout(&ops, &key(&format!("create-{i}")), &body).await.expect("created");
                ids.push(created.payout_id);
            }
            dlock_rt::sleep(Duration::from_millis(5)).await;
            ids
        })
        .await
        .expect("setup")
}

/// What the hand-driven stale writer saw: the simulated window (monitor ms) in which its
/// stale submission was sent and answered, and whether the proxy acknowledged it.
struct Stale {
    sent_ms: u64,
    answered_ms: u64,
    acked: bool,
}

/// A writer driven by hand on its own node: claims and submits payout 0 under token 10,
/// claims payout 1 under token 11, then submits payout 1 under token 5, a token the rail's
/// mark has already passed.
async fn stale_writer(monitor: &Monitor, ids: &[Uuid]) -> Stale {
    let node = madsim::runtime::Handle::current().create_node().name("writer").ip(IpAddr::from([10, 0, 0, 20])).build();
    let (p0, p1) = (ids[0], ids[1]);
    let owner = OwnerId::parse("writer").expect("owner");
    let pay = PaymentClient::new(PaymentClientConfig::new(url(PAYMENT_IP, PAYMENT_PORT))).expect("payment client");
    let rail = RailClient::new(RailClientConfig::new(url(PROXY_IP, PROXY_PORT))).expect("rail client");
    let body = |p: Uuid| SubmissionRequest {
        payout_id: p,
        account_id: "acct-0".into(),
        amount_minor: if p == p0 { 1_000 } else { 1_001 },
        currency: "EUR".into(),
        beneficiary_ref: if p == p0 { "ben-0".into() } else { "ben-1".into() },
    };
    let pending = ClaimRequest { expected_state: PayoutState::Pending };
    let (o, b0, b1) = (owner.clone(), body(p0), body(p1));
    node.spawn(async move {
        pay.claim(p0, signed(10), &o, &key("c0"), &pending).await.expect("claim 0 under 10");
        rail.submit(signed(10), &o, &key("s0"), &b0).await.expect("payout 0 paid under 10");
        pay.claim(p1, signed(11), &o, &key("c1"), &pending).await.expect("claim 1 under 11");
    })
    .await
    .expect("writer node");
    let sent_ms = monitor.elapsed_ms();
    let rail = RailClient::new(RailClientConfig::new(url(PROXY_IP, PROXY_PORT))).expect("rail client");
    let acked = node
        .spawn(async move { rail.submit(signed(5), &owner, &key("s1"), &b1).await.is_ok() })
        .await
        .expect("writer node");
    Stale { sent_ms, answered_ms: monitor.elapsed_ms(), acked }
}

/// The planted bug: the rail-proxy's fence is switched off (`rail.proxy.fencing.enabled =
/// false`, only under `--profile unsafe-test`), and a writer presents a token below the one
/// the rail already took for the account. The proxy admits it; the monitor reports
/// `fence_accepts_only_rising_tokens` at that admission, inside the stale request's window,
/// before the request has even been answered.
#[madsim::test]
async fn a_stale_token_taken_by_a_rail_with_its_fence_off_is_caught_at_the_acceptance() {
    let seed = madsim::runtime::Handle::current().seed();
    let cfg = WorldSpec::skewed().with("profile", "unsafe-test").with("rail.proxy.fencing.enabled", "false");
    let w = world::start(cfg).await;
    let monitor = Monitor::start(&w);
    let ids = seed_payouts(1, 2).await;
    let stale = stale_writer(&monitor, &ids).await;
    assert!(stale.acked, "with its fence off the proxy forwards the stale token (seed {seed})");
    let online = monitor.failures();
    assert_eq!(
        online.iter().map(|f| f.failure.invariant).collect::<Vec<_>>(),
        [ids::FENCE_ACCEPTS_RISING_TOKENS],
        "{online:?} (replay with MADSIM_TEST_SEED={seed})"
    );
    let fired = online[0].at_ms;
    assert!(
        (stale.sent_ms..=stale.answered_ms).contains(&fired) && fired < stale.answered_ms,
        "fired at {fired} ms, the stale request ran {}..{} ms (seed {seed})",
        stale.sent_ms,
        stale.answered_ms
    );
    eprintln!(
        "seed {seed}: {} at {fired} ms (request sent {} ms, answered {} ms)",
        online[0].failure.line(seed),
        stale.sent_ms,
        stale.answered_ms
    );
    // The end check carries it, and nothing else broke: each payout reached the rail once.
    let end = oracle::check(&w, &monitor).await;
    assert_eq!(end.iter().map(|f| f.invariant).collect::<Vec<_>>(), [ids::FENCE_ACCEPTS_RISING_TOKENS], "{end:?}");
}

/// The control: the same stale writer against the rail's fence, switched on. The proxy
/// fences it out (a FENCED row, no rail call) and the oracle reports nothing.
#[madsim::test]
async fn the_same_stale_token_against_the_rails_fence_is_refused_and_the_oracle_stays_quiet() {
    let seed = madsim::runtime::Handle::current().seed();
    let w = world::start(WorldSpec::skewed()).await;
    let monitor = Monitor::start(&w);
    let ids = seed_payouts(1, 2).await;
    let stale = stale_writer(&monitor, &ids).await;
    assert!(!stale.acked, "the rail's fence refuses token 5 after 10 (seed {seed})");
    let end = oracle::check(&w, &monitor).await;
    assert!(end.is_empty(), "{end:?} (replay with MADSIM_TEST_SEED={seed})");
    let seen = monitor.with(|c| (c.acceptances, c.fenced_outs)).expect("checker");
    assert_eq!(seen, (3, 1), "claim, submit, claim accepted; the stale submit fenced out");
}

fn settled(s: PayoutState) -> bool {
    s.is_terminal() || s == PayoutState::RailAmbiguous
}

async fn states(w: &world::World, ids: &[Uuid]) -> BTreeMap<Uuid, PayoutState> {
    let mut out = BTreeMap::new();
    for id in ids {
        if let Ok(Some(p)) = PaymentStore::payout(&*w.paydb, *id).await {
            out.insert(*id, p.state);
        }
    }
    out
}

/// A hostile rail and a fail-open executor (it writes without checking its lease) frozen
/// mid-run past its lease, beside a healthy one: stale writes happen and the fences stop
/// them. The oracle must see the run (acceptances, grants) and find nothing: no online
/// failure, nothing at the end, and after the run settles every payout settled, no intent
/// unresolved, and the reconciler states what the oracle computed.
#[madsim::test]
async fn a_hostile_but_correct_run_gives_no_failure_online_at_the_end_or_in_liveness() {
    let seed = madsim::runtime::Handle::current().seed();
    let handle = madsim::runtime::Handle::current();
    let cfg = WorldSpec::skewed()
        .with("rail.stub.latency-ms", 400)
        .with("rail.stub.failure-rate", 0.1)
        .with("rail.stub.decline-rate", 0.05)
        .with("rail.stub.drop-hold-ms", 9_000);
    let w = world::start(cfg).await;
    let monitor = Monitor::start(&w);
    dlock_rt::probe::reset();
    let ids = seed_payouts(2, 12).await;
    let lease = LEASE_MS.to_string();
    let exec = |owner: &'static str, fail_open: bool| {
        let mut s = vec![
            ("executor.owner-id", owner),
            ("executor.concurrency", "2"),
            ("executor.lock-ttl-ms", lease.as_str()),
            ("executor.poll-interval-ms", "100"),
        ];
        if fail_open {
            s.extend([("profile", "unsafe-test"), ("payment.fencing.enabled", "false")]);
        }
        world::executor_config(&s)
    };
    let (zombie, _ez) = world::start_executor_node("executor-z", [10, 0, 0, 10], exec("executor-z", true), 0).await;
    let _ = dlock_rt::wait_until(Duration::from_millis(10), Duration::from_millis(SETTLE_MS_MAX), || async {
        let mut claimed = false;
        for id in &ids {
            if let Ok(Some(p)) = PaymentStore::payout(&*w.paydb, *id).await {
                claimed |= p.claimed_by.as_deref().is_some_and(|o| o.starts_with("executor-z"));
            }
        }
        claimed.then_some(())
    })
    .await;
    handle.pause(zombie.id());
    let (_b, _eb) = world::start_executor_node("executor-b", [10, 0, 0, 11], exec("executor-b", false), 0).await;
    dlock_rt::sleep(Duration::from_millis(PAUSE_MS)).await;
    handle.resume(zombie.id());
    let _ = dlock_rt::wait_until(Duration::from_millis(200), Duration::from_millis(SETTLE_MS_MAX), || async {
        states(&w, &ids).await.values().all(|s| settled(*s)).then_some(())
    })
    .await;
    // The zombie may still have a stale write in flight: give it the time to land.
    dlock_rt::sleep(Duration::from_millis(4 * LEASE_MS)).await;
    let end = oracle::check(&w, &monitor).await;
    assert!(
        end.is_empty(),
        "{:?} (replay with MADSIM_TEST_SEED={seed})",
        end.iter().map(|f| f.line(seed)).collect::<Vec<_>>()
    );
    let live = oracle::liveness(&w).await;
    assert!(
        live.is_empty(),
        "{:?} (replay with MADSIM_TEST_SEED={seed})",
        live.iter().map(|f| f.line(seed)).collect::<Vec<_>>()
    );
    let (acceptances, fenced_outs, grants) =
        monitor.with(|c| (c.acceptances, c.fenced_outs, c.grants_seen)).expect("checker");
    // Acceptances count per payout; grants need not (a batch passes each fence once for
    // several payouts under one grant, C3-extensions E-19).
    assert!(acceptances >= 12 && grants >= 2, "the monitor saw the run: {acceptances} acceptances, {grants} grants");
    eprintln!(
        "seed {seed}: {acceptances} acceptances, {fenced_outs} fenced out, {grants} grants; probes {:?}",
        dlock_rt::probe::snapshot()
    );
}
