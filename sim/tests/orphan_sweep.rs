//! Recovery of an intent left by a dead proxy, in a seeded world whose rail-proxy is
//! started through `dlock_rail_proxy::start` (its orphan sweeper included, as in
//! production): the proxy writes its intent and forwards, the rail holds the call, and the
//! proxy node is killed before any outcome is recorded. After a restart, the sweeper
//! records the orphan as TIMEOUT and quarantines the payout (RAIL_AMBIGUOUS); nothing hands
//! it back for another attempt, and the rail saw it once.
//!
//! Run many seeds with `MADSIM_TEST_NUM=1000`; replay one with `MADSIM_TEST_SEED=N`.

#![cfg(madsim)]

use std::net::IpAddr;

use dlock_contract::payout::PayoutState;
use dlock_contract::rail::SubmissionOutcome;
use dlock_rail_proxy::store::{NewPayout, RailStore};
use dlock_rt::http::HttpClient;
use dlock_rt::{Clock, Duration};
use dlock_sim::world::{self, url, WorldSpec, PROXY_IP, PROXY_PORT};
use serde_json::json;

/// How long the rail holds the forward: past the moment the proxy is killed.
const RAIL_LATENCY_MS: u64 = 6_000;
/// Longest (simulated) the sweep may take after the restart: one forward's whole budget
/// (connect 1 s + read 8 s + 5 s), plus a sweep interval, plus slack for the skews.
const SWEEP_WAIT_MS_MAX: u64 = 60_000;

#[madsim::test]
async fn an_intent_orphaned_by_a_killed_proxy_is_quarantined_by_the_restarted_proxys_sweeper() {
    let seed = madsim::runtime::Handle::current().seed();
    eprintln!("dlock-sim seed={seed}");
    let handle = madsim::runtime::Handle::current();
    let w = world::start(WorldSpec::skewed().with("rail.stub.latency-ms", RAIL_LATENCY_MS)).await;
    let payout_id = dlock_rt::rand::uuid_v4();
    let p = NewPayout {
        payout_id,
        account_id: "acct-1".into(),
        amount_minor: 1_000,
        currency: "EUR".into(),
        beneficiary_ref: "ben-1".into(),
        state: PayoutState::Claimed,
    };
    RailStore::insert_payout(&*w.paydb, &p, Clock::system().wall()).await.expect("seed payout");

    let client = handle.create_node().name("client").ip(IpAddr::from([10, 0, 0, 3])).build();
    client.spawn(async move {
        let body = json!({"payoutId": payout_id, "accountId": "acct-1", "amountMinor": 1_000, "currency": "EUR",
            "beneficiaryRef": "ben-1"});
        let key = format!("payout:{payout_id}");
        let sig = dlock_sim::world::signed("acct-1", 1, "sim-worker").signature.unwrap_or_default();
        let _ = HttpClient::new(1_000, 30_000)
            .send(
                &url(PROXY_IP, PROXY_PORT),
                http::Method::POST,
                "/v1/rail/submissions",
                &[
                    ("content-type", "application/json"),
                    ("x-fencing-token", "1"),
                    ("x-owner-id", "sim-worker"),
                    ("x-idempotency-key", &key),
                    ("x-fencing-signature", &sig),
                ],
                Some(body.to_string().into()),
            )
            .await;
    });
    // The intent is written before the socket opens; kill the proxy while the rail holds it.
    let intent =
        dlock_rt::wait_until(Duration::from_millis(10), Duration::from_millis(RAIL_LATENCY_MS / 2), || async {
            let rows = RailStore::submissions(&*w.paydb, Some(payout_id)).await.ok()?;
            rows.iter().any(|r| r.outcome.is_none()).then_some(())
        })
        .await;
    assert!(intent.is_some(), "the proxy never wrote its intent (replay with MADSIM_TEST_SEED={seed})");
    handle.kill(w.proxy_node.id());
    let orphaned = RailStore::submissions(&*w.paydb, Some(payout_id)).await.expect("rows");
    assert!(orphaned.iter().all(|r| r.outcome.is_none()), "{orphaned:?}");
    handle.restart(w.proxy_node.id());

    let swept = dlock_rt::wait_until(Duration::from_millis(200), Duration::from_millis(SWEEP_WAIT_MS_MAX), || async {
        let rows = RailStore::submissions(&*w.paydb, Some(payout_id)).await.ok()?;
        let payout = RailStore::payout(&*w.paydb, payout_id).await.ok()??;
        (rows.iter().all(|r| r.outcome == Some(SubmissionOutcome::Timeout))
            && payout.state == PayoutState::RailAmbiguous)
            .then_some(())
    })
    .await;
    let rows = RailStore::submissions(&*w.paydb, Some(payout_id)).await.expect("rows");
    assert!(swept.is_some(), "the orphaned intent was never swept: {rows:?} (replay with MADSIM_TEST_SEED={seed})");
    assert_eq!(rows.len(), 1, "nothing handed the payout back for another attempt: {rows:?}");
    let calls = w.rail_calls().await;
    assert!(calls.len() <= 1, "the rail saw the payout {} times (replay with MADSIM_TEST_SEED={seed})", calls.len());
}
