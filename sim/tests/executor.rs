//! Executors on madsim nodes beside the whole cluster (lock server, payment-resource,
//! rail-proxy, rail-stub), under a hostile rail and a paused worker. The checkers read
//! paydb and the rail's own record, never the executors' answers:
//!
//! - no payout reaches the rail twice;
//! - every CUSTOMER balance equals its ledger sum, debits equal credits, and no available
//!   balance is negative;
//! - every payout ends terminal (POSTED, FAILED) or quarantined (RAIL_AMBIGUOUS).
//!
//! Run many seeds with `MADSIM_TEST_NUM=1000`; replay one with `MADSIM_TEST_SEED=N`.

#![cfg(madsim)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use dlock_contract::payment::{NewAccountRequest, NewPayoutRequest};
use dlock_contract::payout::PayoutState;
use dlock_contract::{IdempotencyKey, OwnerId};
use dlock_executor::{Executor, ExecutorConfig, Outcome};
use dlock_payment_client::{PaymentClient, PaymentClientConfig};
use dlock_payment_resource::store::PaymentStore;
use dlock_payment_resource::store_mem::MemPaydb;
use dlock_rt::{Clock, Duration};
use dlock_sim::world::{self, url, WorldSpec, PAYMENT_IP, PAYMENT_PORT};
use uuid::Uuid;

/// Lease of every executor grant in these worlds.
const LEASE_MS: u64 = 3_000;
/// How long the paused executor stays frozen: well past its lease and session.
const PAUSE_MS: u64 = 15_000;
/// Longest (simulated) a run may take to settle every payout.
const SETTLE_MS_MAX: u64 = 300_000;

fn hostile_rail() -> WorldSpec {
    WorldSpec::skewed()
        .with("rail.stub.latency-ms", 400)
        .with("rail.stub.failure-rate", 0.1)
        .with("rail.stub.decline-rate", 0.05)
        .with("rail.stub.drop-hold-ms", 9_000)
}

/// Opens `accounts` accounts and `n` payouts through the payment-resource, from a setup node.
async fn seed(accounts: usize, n: usize) -> Vec<Uuid> {
    let handle = madsim::runtime::Handle::current();
    let setup = handle.create_node().name("setup").ip(IpAddr::from([10, 0, 0, 9])).build();
    setup
        .spawn(async move {
            let mut cfg = PaymentClientConfig::new(url(PAYMENT_IP, PAYMENT_PORT));
            cfg.write_read_timeout_ms = 10_000;
            let client = PaymentClient::new(cfg).expect("payment client");
            let ops = OwnerId::parse("ops").expect("owner");
            let key = |k: String| IdempotencyKey::parse(&k).expect("key");
            for a in 0..accounts {
                let body = NewAccountRequest {
                    account_id: format!("acct-{a}"),
                    currency: "EUR".into(),
                    opening_balance_minor: 50_000,
                };
                client.create_account(&ops, &key(format!("open-{a}")), &body).await.expect("account opened");
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
                let created =
                    client.create_payout(&ops, &key(format!("create-{i}")), &body).await.expect("payout created");
                ids.push(created.payout_id);
            }
            // Let the clock pass the last creation, so every payout is in the first scan.
            dlock_rt::sleep(Duration::from_millis(5)).await;
            ids
        })
        .await
        .expect("setup")
}

/// An executor's settings in these worlds: `owner`, two tasks, the short lease; `extra`
/// keys on top (`payment.fencing.enabled = false` needs `profile = unsafe-test`).
fn executor_config(owner: &str, extra: &[(&str, &str)]) -> ExecutorConfig {
    let lease = LEASE_MS.to_string();
    let mut settings = vec![
        ("executor.owner-id", owner),
        ("executor.concurrency", "2"),
        ("executor.lock-ttl-ms", lease.as_str()),
        ("executor.poll-interval-ms", "100"),
    ];
    settings.extend_from_slice(extra);
    world::executor_config(&settings)
}

/// The fail-open worker: it writes without checking its lease.
const FAIL_OPEN: &[(&str, &str)] = &[("profile", "unsafe-test"), ("payment.fencing.enabled", "false")];

/// Starts an executor on its own node; returns the node and the executor (for its metrics).
async fn start_executor(
    name: &str,
    ip: [u8; 4],
    cfg: ExecutorConfig,
    skew_ms: i64,
) -> (madsim::runtime::NodeHandle, Arc<Executor>) {
    world::start_executor_node(name, ip, cfg, skew_ms).await
}

async fn states(paydb: &MemPaydb, ids: &[Uuid]) -> BTreeMap<Uuid, PayoutState> {
    let mut out = BTreeMap::new();
    for id in ids {
        if let Ok(Some(p)) = PaymentStore::payout(paydb, *id).await {
            out.insert(*id, p.state);
        }
    }
    out
}

/// The reconciler, on a madsim node of its own, over the shared paydb and the rail's record
/// read over the simulated network (the same code `dlock reconcile` runs).
async fn reconcile_on_a_node(paydb: Arc<MemPaydb>) -> dlock_reconciler::Report {
    let handle = madsim::runtime::Handle::current();
    let node = handle.create_node().name("reconciler").ip(IpAddr::from([10, 0, 0, 30])).build();
    node.spawn(async move {
        let budget = dlock_reconciler::budget::ReadBudget::default();
        let rail = dlock_reconciler::rail::HttpRailRecord::new(url(world::STUB_IP, world::STUB_PORT), &budget);
        let source = dlock_reconciler::Paydb { store: paydb, describe: "simulation paydb".into() };
        let params = dlock_reconciler::Params { budget, ..dlock_reconciler::Params::at(Clock::system().wall()) };
        dlock_reconciler::reconcile(&source, &rail, &params).await
    })
    .await
    .expect("reconciler node")
}

fn settled(s: PayoutState) -> bool {
    s.is_terminal() || s == PayoutState::RailAmbiguous
}

/// Waits (simulated time) until every payout is terminal or quarantined.
async fn settle(paydb: &MemPaydb, ids: &[Uuid]) -> BTreeMap<Uuid, PayoutState> {
    let _ = dlock_rt::wait_until(Duration::from_millis(200), Duration::from_millis(SETTLE_MS_MAX), || async {
        states(paydb, ids).await.values().all(|s| settled(*s)).then_some(())
    })
    .await;
    states(paydb, ids).await
}

fn assert_settled(states: &BTreeMap<Uuid, PayoutState>, seed: u64) {
    let open: Vec<_> = states.iter().filter(|(_, s)| !settled(**s)).collect();
    assert!(open.is_empty(), "unsettled payouts {open:?} (replay with MADSIM_TEST_SEED={seed})");
}

#[madsim::test]
async fn executors_on_madsim_nodes_settle_every_payout_once_under_a_hostile_rail() {
    let seed = madsim::runtime::Handle::current().seed();
    eprintln!("dlock-sim seed={seed}");
    let w = world::start(hostile_rail()).await;
    let ids = seed_payouts(3, 18).await;
    let (_a, ea) = start_executor("executor-a", [10, 0, 0, 10], executor_config("executor-a", &[]), 250).await;
    let (_b, eb) = start_executor("executor-b", [10, 0, 0, 11], executor_config("executor-b", &[]), -700).await;
    let states = settle(&w.paydb, &ids).await;
    assert_settled(&states, seed);
    let calls = w.rail_calls().await;
    let found = world::violations(&w.paydb, &calls).await;
    assert!(found.is_empty(), "{found:?} (replay with MADSIM_TEST_SEED={seed})");
    // Each executor counts a payout once its critical section has released the lock, a
    // moment after the post committed.
    let report = reconcile_on_a_node(w.paydb.clone()).await;
    assert_eq!(report.exit_code(), 0, "{} (replay with MADSIM_TEST_SEED={seed})", report.render_table());
    assert!(report.clean && report.ledger_balanced && report.max_rail_calls_per_payout <= 1);
    let posted = states.values().filter(|s| **s == PayoutState::Posted).count() as u64;
    let counted = || ea.metrics.get(Outcome::Posted) + eb.metrics.get(Outcome::Posted);
    let _ = dlock_rt::wait_until(Duration::from_millis(50), Duration::from_millis(10_000), || async {
        (counted() >= posted).then_some(())
    })
    .await;
    assert_eq!(counted(), posted, "each posted payout is counted once, by the executor that posted it");
    assert_eq!(ea.metrics.get(Outcome::Fenced) + eb.metrics.get(Outcome::Fenced), 0, "nobody slept through a lease");
}

async fn seed_payouts(accounts: usize, n: usize) -> Vec<Uuid> {
    seed(accounts, n).await
}

/// An executor that does not check its own lease (`payment.fencing.enabled = false`, the
/// fail-open worker) is frozen mid-run past its lease and session, then wakes and writes
/// whatever it was doing. The fences at the account, the ledger and the rail must stop it:
/// nothing is paid twice, and the ledger balances.
#[madsim::test]
async fn a_fail_open_executor_paused_mid_run_pays_nothing_twice() {
    let seed = madsim::runtime::Handle::current().seed();
    eprintln!("dlock-sim seed={seed}");
    let handle = madsim::runtime::Handle::current();
    let w = world::start(hostile_rail()).await;
    let ids = seed_payouts(2, 12).await;
    let (zombie, ez) = start_executor("executor-z", [10, 0, 0, 10], executor_config("executor-z", FAIL_OPEN), 0).await;
    // Freeze the zombie as soon as it has claimed something.
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
    let (_b, eb) = start_executor("executor-b", [10, 0, 0, 11], executor_config("executor-b", &[]), 0).await;
    dlock_rt::sleep(Duration::from_millis(PAUSE_MS)).await;
    handle.resume(zombie.id());
    let states = settle(&w.paydb, &ids).await;
    assert_settled(&states, seed);
    let calls = w.rail_calls().await;
    let found = world::violations(&w.paydb, &calls).await;
    assert!(found.is_empty(), "{found:?} (replay with MADSIM_TEST_SEED={seed})");
    eprintln!(
        "zombie fenced {} times, duplicate {}; executor-b posted {}",
        ez.metrics.get(Outcome::Fenced),
        ez.metrics.get(Outcome::Duplicate),
        eb.metrics.get(Outcome::Posted)
    );
}

/// An executor stalled between its lease check and each fenced write (a GC pause at the
/// worst moment, `executor.chaos.pause-rate = 1`) for longer than its lease, beside a
/// healthy executor on the same account. Its stale writes are fenced out at the account,
/// the ledger or the rail; nothing is paid twice; the ledger balances.
#[madsim::test]
async fn an_executor_stalled_before_its_writes_is_fenced_out() {
    let seed = madsim::runtime::Handle::current().seed();
    eprintln!("dlock-sim seed={seed}");
    let w = world::start(hostile_rail()).await;
    let ids = seed_payouts(1, 10).await;
    let pause_ms = (3 * LEASE_MS).to_string();
    let stalled = executor_config(
        "executor-z",
        &[("executor.concurrency", "1"), ("executor.chaos.pause-rate", "1"), ("executor.chaos.pause-ms", &pause_ms)],
    );
    let (_z, ez) = start_executor("executor-z", [10, 0, 0, 10], stalled, 0).await;
    // The healthy executor starts once the stalled one holds the account (and sleeps on it).
    let held = dlock_rt::wait_until(Duration::from_millis(10), Duration::from_millis(30_000), || async {
        let info = dlock_lock_server::store::LockStore::info(&*w.locks, "payout:acct-0", 0).await.ok().flatten();
        info.and_then(|i| i.grant).filter(|g| g.owner_id.starts_with("executor-z")).map(|_| ())
    })
    .await;
    assert!(held.is_some(), "the stalled executor never took the account (replay with MADSIM_TEST_SEED={seed})");
    let (_b, eb) = start_executor("executor-b", [10, 0, 0, 11], executor_config("executor-b", &[]), 0).await;
    let states = settle(&w.paydb, &ids).await;
    assert_settled(&states, seed);
    let calls = w.rail_calls().await;
    let found = world::violations(&w.paydb, &calls).await;
    assert!(found.is_empty(), "{found:?} (replay with MADSIM_TEST_SEED={seed})");
    // The stalled executor may still be asleep when the last payout settles: give its stale
    // write the time to land (bounded), then judge.
    let _ = dlock_rt::wait_until(Duration::from_millis(100), Duration::from_millis(4 * 3 * LEASE_MS), || async {
        (ez.metrics.get(Outcome::Fenced) >= 1).then_some(())
    })
    .await;
    let found = world::violations(&w.paydb, &w.rail_calls().await).await;
    assert!(found.is_empty(), "{found:?} after the stalled writes (replay with MADSIM_TEST_SEED={seed})");
    assert!(
        ez.metrics.get(Outcome::Fenced) >= 1,
        "the stalled executor was never fenced out (posted {}, replay with MADSIM_TEST_SEED={seed})",
        ez.metrics.get(Outcome::Posted)
    );
    assert_eq!(eb.metrics.get(Outcome::Fenced), 0, "the healthy executor never writes stale");
}

/// Holds `payout:acct-0` from a node of its own for `hold_ms`, while an executor with
/// `executor.lock-wait-ms = wait_ms` finds its payout; returns the payout's final state and
/// how often a queued waiter was granted (`waiter_granted_after_wait`).
async fn contended_account_with_lock_wait(wait_ms: &str, hold_ms: u64) -> (Option<PayoutState>, u64) {
    use dlock_lock_client::{LockClient, LockClientConfig};
    use dlock_rt::probe::{self, Probe};
    probe::reset();
    let w = world::start(WorldSpec::skewed()).await;
    let ids = seed_payouts(1, 1).await;
    let handle = madsim::runtime::Handle::current();
    let holder = handle.create_node().name("holder").ip(IpAddr::from([10, 0, 0, 12])).build();
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
    let hold = holder.spawn(async move {
        let owner = OwnerId::parse("holder").expect("owner");
        let client =
            LockClient::new(LockClientConfig::new(url(world::LOCK_IP, world::LOCK_PORT), owner)).expect("lock client");
        let session = client.open_session().await.expect("session");
        let guard = session.acquire("payout:acct-0").await.expect("the holder takes the account first");
        let _ = held_tx.send(());
        dlock_rt::sleep(Duration::from_millis(hold_ms)).await;
        let _ = guard.release().await;
        let _ = session.close().await;
    });
    held_rx.await.expect("held");
    let cfg = executor_config("executor-w", &[("executor.concurrency", "1"), ("executor.lock-wait-ms", wait_ms)]);
    let (_n, _e) = start_executor("executor-w", [10, 0, 0, 10], cfg, 0).await;
    let _ = hold.await;
    let states = settle(&w.paydb, &ids).await;
    (states.get(&ids[0]).copied(), probe::snapshot().get(&Probe::WaiterGrantedAfterWait).copied().unwrap_or(0))
}

/// `executor.lock-wait-ms`: an executor that finds its account held queues at the lock
/// server, is granted the key once the holder releases it within the wait, and pays the
/// payout; with the default 0 it skips the account and takes it on a later scan, without
/// ever queueing.
#[madsim::test]
async fn an_executor_with_a_lock_wait_is_granted_a_contended_account_after_waiting() {
    let (state, waited) = contended_account_with_lock_wait("700", 400).await;
    assert_eq!(state, Some(PayoutState::Posted));
    assert!(waited >= 1, "the executor's acquire never waited in the queue");
}

#[madsim::test]
async fn an_executor_without_a_lock_wait_skips_a_contended_account_and_never_queues() {
    let (state, waited) = contended_account_with_lock_wait("0", 400).await;
    assert_eq!(state, Some(PayoutState::Posted));
    assert_eq!(waited, 0, "an executor without a lock wait queued");
}

#[test]
fn an_executor_run_replays_bit_for_bit() {
    let seed = std::env::var("MADSIM_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    madsim::runtime::Runtime::check_determinism(seed, madsim::Config::default(), || async {
        let w = world::start(hostile_rail()).await;
        let ids = seed_payouts(2, 6).await;
        let _e = start_executor("executor-a", [10, 0, 0, 10], executor_config("executor-a", &[]), 0).await;
        let _ = settle(&w.paydb, &ids).await;
        let _ = w.rail_calls().await;
    });
}
