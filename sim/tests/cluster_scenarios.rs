//! The cluster scenarios that today's world can play (one lock server on the simulation
//! store, one payment-resource, one rail-proxy, the rail-stub, and the scenario's
//! executors), with their fault schedule played from the supervisor while the executors
//! work, and the world's checkers run at the end: no payout reaches the rail twice, every
//! balance is its ledger sum, debits equal credits, and every payout settles (POSTED,
//! FAILED, ABANDONED or RAIL_AMBIGUOUS) once the faults are healed.
//!
//! Scenarios whose topology or faults need the whole-cluster world (two proxies, etcd, a
//! lockdb fault plan, the waiter-queued trigger) are listed in `NEEDS_THE_WORLD` and
//! parse-checked only (`sim/src/scenario.rs`).

#![cfg(madsim)]

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;

use dlock_contract::payment::{NewAccountRequest, NewPayoutRequest};
use dlock_contract::payout::PayoutState;
use dlock_contract::{IdempotencyKey, OwnerId};
use dlock_lock_server::store::LockStore;
use dlock_payment_client::{PaymentClient, PaymentClientConfig};
use dlock_payment_resource::store::PaymentStore;
use dlock_rt::http::HttpClient;
use dlock_rt::Duration;
use dlock_sim::faults::Faults;
use dlock_sim::scenario::{self, Scenario};
use dlock_sim::schedule::{Stage, Trigger};
use dlock_sim::store_faults::StoreFaultPlan;
use dlock_sim::world::{self, url, World, WorldConfig, LOCK_IP, LOCK_PORT, PAYMENT_IP, PAYMENT_PORT};
use madsim::task::NodeId;
use uuid::Uuid;

/// Scenarios this world plays.
const PLAYED: &[&str] = &[
    "clock-drift-40",
    "duplicate-ack-rail",
    "partition-holder-lock-server",
    "pause-during-rail-call",
    "revoke-mid-flight",
];
/// Scenarios that need the whole-cluster world.
const NEEDS_THE_WORLD: &[&str] =
    &["lock-leader-loss", "lock-leader-loss-etcd", "stale-writer-second-proxy", "waiter-session-expires"];
/// Longest (simulated) the payouts may take to settle after the schedule.
const SETTLE_MS_MAX: u64 = 300_000;
/// How often a trigger is polled.
const TRIGGER_POLL_MS: u64 = 20;

struct Cluster {
    world: World,
    faults: Faults,
    executors: Vec<(String, NodeId)>,
    accounts: u32,
    /// A node to call the services from (the supervisor has no address).
    ops: madsim::runtime::NodeHandle,
}

impl Cluster {
    async fn held_key(&self) -> Option<(String, i64)> {
        for a in 0..self.accounts {
            let key = format!("payout:acct-{a}");
            if let Ok(Some(info)) = LockStore::info(self.world.locks.as_ref(), &key).await {
                if let Some(g) = info.grant {
                    return Some((key, g.fencing_token));
                }
            }
        }
        None
    }
}

impl Stage for Cluster {
    fn node(&self, name: &str) -> Option<NodeId> {
        match name {
            "lock-1" => Some(self.world.lock_node.id()),
            "payment-1" => Some(self.world.payment_node.id()),
            "proxy-1" => Some(self.world.proxy_node.id()),
            "rail-stub" => Some(self.world.stub_node.id()),
            other => self.executors.iter().find(|(n, _)| n == other).map(|(_, id)| *id),
        }
    }
    fn faults(&self) -> &Faults {
        &self.faults
    }
    fn store_plan(&self) -> Option<&StoreFaultPlan> {
        None
    }
    fn revoke<'a>(&'a self, key: Option<&'a str>) -> Pin<Box<dyn Future<Output = Result<String, String>> + Send + 'a>> {
        Box::pin(async move {
            let (key, token) = match key {
                Some(k) => (k.to_owned(), None),
                None => {
                    let (k, t) = self.held_key().await.ok_or("no key is held")?;
                    (k, Some(t))
                }
            };
            let body = serde_json::json!({ "operator": "ops", "reason": "scenario revoke", "expectedToken": token });
            let path = format!("/v1/locks/{key}/revoke");
            let status = self
                .ops
                .spawn(async move {
                    HttpClient::new(1_000, 5_000)
                        .send(
                            &url(LOCK_IP, LOCK_PORT),
                            http::Method::POST,
                            &path,
                            &[("content-type", "application/json"), ("x-owner-id", "ops")],
                            Some(body.to_string().into()),
                        )
                        .await
                        .map_or(0, |r| r.status)
                })
                .await
                .map_err(|e| e.to_string())?;
            Ok(format!("revoke {key} -> {status}"))
        })
    }
    fn wait_for(&self, trigger: Trigger) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            let calls_before = self.world.rail_calls().await.len();
            loop {
                let hit = match trigger {
                    Trigger::LeaseGranted => self.held_key().await.is_some(),
                    // The stub logs a call when it arrives; with the scenario's rail latency
                    // it is then in flight.
                    Trigger::RailCall => self.world.rail_calls().await.len() > calls_before,
                    Trigger::IntentWritten => {
                        dlock_rail_proxy::store::RailStore::submissions(self.world.paydb.as_ref(), None)
                            .await
                            .is_ok_and(|r| !r.is_empty())
                    }
                    Trigger::WaiterQueued => true,
                };
                if hit {
                    return;
                }
                madsim::time::sleep(std::time::Duration::from_millis(TRIGGER_POLL_MS)).await;
            }
        })
    }
}

/// Opens `accounts` accounts and `n` payouts (round robin, or all on the hot ones).
async fn seed(ops: &madsim::runtime::NodeHandle, accounts: u32, hot: u32, n: u32) -> Vec<Uuid> {
    ops.spawn(async move {
        let mut cfg = PaymentClientConfig::new(url(PAYMENT_IP, PAYMENT_PORT));
        cfg.write_read_timeout_ms = 10_000;
        let client = PaymentClient::new(cfg).expect("payment client");
        let owner = OwnerId::parse("ops").expect("owner");
        let key = |k: String| IdempotencyKey::parse(&k).expect("key");
        for a in 0..accounts {
            let body = NewAccountRequest {
                account_id: format!("acct-{a}"),
                currency: "EUR".into(),
                opening_balance_minor: 100_000,
            };
            client.create_account(&owner, &key(format!("open-{a}")), &body).await.expect("account opened");
        }
        let spread = if hot > 0 { hot } else { accounts };
        let mut ids = Vec::new();
        for i in 0..n {
            let body = NewPayoutRequest {
                payout_id: None,
                account_id: format!("acct-{}", i % spread),
                amount_minor: 1_000 + i64::from(i),
                currency: "EUR".into(),
                beneficiary_ref: format!("ben-{i}"),
            };
            ids.push(client.create_payout(&owner, &key(format!("create-{i}")), &body).await.expect("payout").payout_id);
        }
        dlock_rt::sleep(Duration::from_millis(5)).await;
        ids
    })
    .await
    .expect("ops")
}

fn settled(s: PayoutState) -> bool {
    s.is_terminal() || s == PayoutState::RailAmbiguous
}

fn setting(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Plays `s` on today's world; one line per broken check.
async fn play(s: &Scenario) -> Vec<String> {
    let mut cfg = WorldConfig::default()
        .with("rail.stub.latency-ms", s.rail.latency_ms)
        .with("rail.stub.failure-rate", s.rail.failure_rate)
        .with("rail.stub.duplicate-ack-rate", s.rail.duplicate_ack_rate)
        .with("rail.stub.decline-rate", s.rail.decline_rate);
    let mut executor_settings: Vec<(String, String)> = Vec::new();
    for (k, v) in &s.settings {
        if k.starts_with("executor.") {
            executor_settings.push((k.clone(), setting(v)));
        } else {
            cfg = cfg.with(k, setting(v));
        }
    }
    let world = world::start(cfg).await;
    let handle = madsim::runtime::Handle::current();
    let ops = handle.create_node().name("ops").ip(IpAddr::from([10, 0, 0, 9])).build();
    let ids = seed(&ops, s.workload.accounts, s.workload.hot_accounts, s.workload.payouts).await;
    let faults = Faults::new();
    faults.name("lock-1", world.lock_node.id());
    faults.name("payment-1", world.payment_node.id());
    faults.name("proxy-1", world.proxy_node.id());
    faults.name("rail-stub", world.stub_node.id());
    let mut executors = Vec::new();
    let concurrency = s.topology.executor_concurrency.to_string();
    for i in 1..=s.topology.executors {
        let name = format!("executor-{i}");
        let owner = name.clone();
        let mut settings: Vec<(&str, &str)> = vec![
            ("executor.owner-id", owner.as_str()),
            ("executor.concurrency", concurrency.as_str()),
            ("executor.poll-interval-ms", "100"),
        ];
        settings.extend(executor_settings.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let ip = [10, 0, 3, u8::try_from(i).expect("executors <= 6")];
        let (node, _) = world::start_executor_node(&name, ip, world::executor_config(&settings), 0).await;
        faults.name(&name, node.id());
        executors.push((name, node.id()));
    }
    let cluster = Cluster { world, faults, executors, accounts: s.workload.accounts, ops };
    let trace = s.schedule().play(&cluster).await;
    for l in trace.iter().chain(cluster.faults.trace().iter()) {
        eprintln!("{l}");
    }
    let skipped: Vec<&String> = trace.iter().filter(|l| l.contains("SKIPPED") || l.contains("never came")).collect();
    let mut broken: Vec<String> = skipped.iter().map(|l| format!("schedule: {l}")).collect();
    // Liveness: heal everything, then every payout settles within the bound.
    cluster.faults.heal_all();
    for (_, id) in &cluster.executors {
        dlock_sim::faults::clock::reset(*id);
    }
    let paydb = cluster.world.paydb.clone();
    let ids2 = ids.clone();
    let done = dlock_rt::wait_until(Duration::from_millis(500), Duration::from_millis(SETTLE_MS_MAX), || {
        let paydb = paydb.clone();
        let ids = ids2.clone();
        async move {
            for id in &ids {
                match PaymentStore::payout(paydb.as_ref(), *id).await {
                    Ok(Some(p)) if settled(p.state) => {}
                    _ => return None,
                }
            }
            Some(())
        }
    })
    .await;
    if done.is_none() {
        broken.push(format!("liveness: not every payout settled within {SETTLE_MS_MAX} ms"));
    }
    let calls = cluster.world.rail_calls().await;
    broken.extend(world::violations(&cluster.world.paydb, &calls).await);
    broken
}

fn seed_of_runtime() -> u64 {
    madsim::runtime::Handle::current().seed()
}

#[test]
fn every_cluster_scenario_is_played_here_or_named_as_needing_the_world() {
    let all = scenario::all().expect("scenarios load");
    for (path, s) in all.iter().filter(|(_, s)| !s.is_proxy_only()) {
        assert!(
            PLAYED.contains(&s.name.as_str()) || NEEDS_THE_WORLD.contains(&s.name.as_str()),
            "{path} is neither played nor listed as needing the world"
        );
    }
}

macro_rules! played {
    ($test:ident, $name:literal) => {
        #[madsim::test]
        async fn $test() {
            eprintln!("dlock-sim seed={} scenario={}", seed_of_runtime(), $name);
            let s = Scenario::load(&scenario::scenarios_dir().join(concat!($name, ".toml"))).expect("scenario");
            let broken = play(&s).await;
            assert!(broken.is_empty(), "{} (replay with MADSIM_TEST_SEED={}): {broken:?}", $name, seed_of_runtime());
        }
    };
}

played!(clock_drift_40_on_one_executor_pays_nothing_twice, "clock-drift-40");
played!(a_holder_partitioned_from_the_lock_server_pays_nothing_twice, "partition-holder-lock-server");
played!(a_holder_paused_during_its_rail_call_pays_nothing_twice, "pause-during-rail-call");
played!(a_revoke_mid_flight_pays_nothing_twice, "revoke-mid-flight");
played!(a_duplicate_paying_rail_with_a_lossy_link_and_a_proxy_crash_pays_nothing_twice, "duplicate-ack-rail");
