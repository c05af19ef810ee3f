//! The cluster scenarios that today's world can play (one lock server on the simulation
//! store, one payment-resource, one rail-proxy, the rail-stub, and the scenario's
//! executors), with their fault schedule played from the supervisor while the executors
//! work, and the world's checkers run at the end: no payout reaches the rail twice, every
//! balance is its ledger sum, debits equal credits, and every payout settles (POSTED,
//! FAILED, ABANDONED or RAIL_AMBIGUOUS) once the faults are healed.
//!
//! The scenarios that need the whole-cluster world (two proxies, etcd, a lockdb fault plan,
//! scripted lock clients and the waiter-queued trigger) play as campaign seeds
//! (`campaign::run_seed_with`, the path of `dlock-sim run --scenario NAME`): the world of
//! `world::build`, the campaign's oracle, liveness phase and outcome, and each test asserts
//! the property its scenario exists to show from the run's ground truth
//! (`campaign::ScenarioFacts`). `every_shipped_scenario_is_played_by_a_test` holds every
//! file to being played by some test.

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
use dlock_payment_resource::store_mem::FencedOp;
use dlock_rt::http::HttpClient;
use dlock_rt::probe::Probe;
use dlock_rt::Duration;
use dlock_sim::campaign::{self, RunOptions, ScenarioFacts};
use dlock_sim::faults::{FaultKind, Faults};
use dlock_sim::oracle::Seen;
use dlock_sim::scenario::{self, Scenario};
use dlock_sim::schedule::{Stage, Trigger};
use dlock_sim::store_faults::StoreFaultPlan;
use dlock_sim::store_faults::{Injected, StoreName};
use dlock_sim::world::Topology;
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
/// Scenarios played as campaign seeds in the whole-cluster world, each by its test below.
const PLAYED_IN_THE_WORLD: &[&str] =
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

/// Every file under `scenarios/` is played by a test: the proxy scenarios by
/// `every_scenario_holds_its_invariants` (sim/tests/scenarios.rs, which plays every one of
/// them), the others by a test of this file (`PLAYED` on the one-replica world,
/// `PLAYED_IN_THE_WORLD` as campaign seeds). A new file fails here until a test plays it.
#[test]
fn every_shipped_scenario_is_played_by_a_test() {
    let all = scenario::all().expect("scenarios load");
    let names: Vec<&str> = all.iter().map(|(_, s)| s.name.as_str()).collect();
    for (path, s) in &all {
        let played =
            s.is_proxy_only() || PLAYED.contains(&s.name.as_str()) || PLAYED_IN_THE_WORLD.contains(&s.name.as_str());
        assert!(played, "{path} is played by no test");
    }
    for listed in PLAYED.iter().chain(PLAYED_IN_THE_WORLD) {
        assert!(names.contains(listed), "{listed} is listed as played but has no file");
    }
    assert!(PLAYED.iter().all(|p| !PLAYED_IN_THE_WORLD.contains(p)), "a scenario listed twice");
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

// ---------------------------------------------------------------------------------------
// Scenarios played as campaign seeds in the whole-cluster world.
// ---------------------------------------------------------------------------------------

/// Seeds each world scenario test plays (`DLOCK_SIM_SCENARIO_SEEDS` sets it).
const WORLD_SEEDS_DEFAULT: u64 = 16;

fn world_seeds() -> Vec<u64> {
    let n = std::env::var("DLOCK_SIM_SCENARIO_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(WORLD_SEEDS_DEFAULT);
    (1..=n.max(1)).collect()
}

/// Plays `name` as a campaign seed; asserts the seed is clean (no crash, liveness or
/// correctness failure) and returns its outcome and facts.
fn play_in_the_world(name: &str, seed: u64) -> (dlock_sim::outcome::SeedOutcome, ScenarioFacts) {
    eprintln!("dlock-sim seed={seed} scenario={name} (replay: cargo xtask sim replay --seed {seed} --scenario {name})");
    let opts = RunOptions { scenario: Some(name.to_owned()), ..RunOptions::default() };
    let (outcome, facts) = campaign::run_seed_with(seed, &opts);
    let lines: Vec<String> = outcome.failures.iter().map(|f| f.line(seed)).collect();
    assert!(lines.is_empty(), "{name} seed {seed}: {lines:?}\n{}", outcome.trace.join("\n"));
    let facts = facts.expect("a world scenario leaves its facts");
    // The file names the probes it exists to reach: each fired in this seed.
    let s = scenario::load_named(name).expect("scenario");
    for p in &s.probes {
        let fired = outcome.probes.iter().any(|(probe, n)| probe.name() == p && *n > 0);
        assert!(fired, "{name} seed {seed}: probe {p} never fired ({:?})", outcome.probes);
    }
    (outcome, facts)
}

fn probe(o: &dlock_sim::outcome::SeedOutcome, p: Probe) -> u64 {
    o.probes.get(&p).copied().unwrap_or(0)
}

fn all_posted(f: &ScenarioFacts) -> bool {
    !f.final_states.is_empty() && f.final_states.values().all(|s| *s == Some(PayoutState::Posted))
}

fn rail_calls_of(f: &ScenarioFacts, payout: Uuid) -> usize {
    f.rail_calls.iter().filter(|c| **c == payout.to_string()).count()
}

/// C3 §3.5 on two proxies over one paydb: the zombie (executor 1, whose proxy is proxy-1)
/// submits with its older token while the newer holder's forward (executor 2, through
/// proxy-2) is in flight; the mark both replicas share refuses it, and the rail sees the
/// payout once.
#[test]
fn a_stale_writer_on_the_second_proxy_is_fenced_by_the_shared_mark_while_the_newer_forward_is_in_flight() {
    // Executor i calls proxy replica i here: the two writers reach two replicas.
    assert_eq!((Topology::replica_for(1, 2), Topology::replica_for(2, 2)), (1, 2));
    for seed in world_seeds() {
        let (o, f) = play_in_the_world("stale-writer-second-proxy", seed);
        let mut caught = 0;
        for s in &f.seen {
            let Seen::Fenced { op: FencedOp::Admit, accepted: false, payout_id, token, owner_id, in_flight, .. } = s
            else {
                continue;
            };
            if !owner_id.starts_with("executor-1/") {
                continue;
            }
            // The newer holder's forward of the same account is in flight at that instant,
            // and it was admitted (on the other replica) with a larger token.
            let newer = in_flight.iter().find(|(t, o)| t > token && o.starts_with("executor-2/"));
            let Some((newer_token, _)) = newer else { continue };
            let admitted = f.seen.iter().any(|e| {
                matches!(e, Seen::Fenced { op: FencedOp::Admit, accepted: true, token: t, owner_id: w, .. }
                    if t == newer_token && w.starts_with("executor-2/"))
            });
            assert!(admitted, "seed {seed}: in-flight token {newer_token} was never admitted");
            assert_eq!(rail_calls_of(&f, *payout_id), 1, "seed {seed}: payout {payout_id} at the rail");
            caught += 1;
        }
        assert!(
            caught >= 1,
            "seed {seed}: no stale submission fenced on proxy-1 during a forward:\n{}",
            o.trace.join("\n")
        );
        assert!(probe(&o, Probe::FencedOutRail) >= 1, "seed {seed}: {:?}", o.probes);
        assert!(all_posted(&f), "seed {seed}: {:?}", f.final_states);
    }
}

/// A queued waiter whose session lapses while it waits is never granted (the server
/// re-checks the session at grant time); the waiter behind it is granted after its wait,
/// with a token above the holder's.
#[test]
fn a_waiter_whose_session_expires_while_queued_is_never_granted_and_the_next_waiter_is() {
    for seed in world_seeds() {
        let (o, f) = play_in_the_world("waiter-session-expires", seed);
        let session_of = |client: &str| {
            f.clients.iter().find_map(|l| l.strip_prefix(&format!("{client}: session ")).map(str::to_owned))
        };
        let expired = session_of("client-2").expect("client-2 opened a session");
        let grants: Vec<(i64, &str, String)> = f
            .seen
            .iter()
            .filter_map(|s| match s {
                Seen::Granted { token, owner_id, session_id, .. } => {
                    Some((*token, owner_id.as_str(), session_id.to_string()))
                }
                _ => None,
            })
            .collect();
        assert!(
            grants.iter().all(|(_, owner, session)| *owner != "client-2" && *session != expired),
            "seed {seed}: the expired waiter was granted: {grants:?}"
        );
        assert!(
            f.clients.iter().any(|l| l.starts_with("client-2: refused payout:acct-0 SESSION_EXPIRED")),
            "seed {seed}: {:?}",
            f.clients
        );
        let token_of = |client: &str| grants.iter().find(|(_, o, _)| *o == client).map(|(t, _, _)| *t);
        let (holder, next) = (token_of("client-1"), token_of("client-3"));
        assert!(
            matches!((holder, next), (Some(h), Some(n)) if n > h),
            "seed {seed}: holder {holder:?}, next waiter {next:?}; {:?}",
            f.clients
        );
        assert!(probe(&o, Probe::WaiterGrantedAfterWait) >= 1, "seed {seed}: {:?}", o.probes);
        assert!(all_posted(&f), "seed {seed}: {:?}", f.final_states);
    }
}

/// The window in which lockdb refused calls (runtime ms), from the store plan's record.
fn lockdb_refusals(f: &ScenarioFacts) -> Option<(u64, u64)> {
    let at: Vec<u64> = f
        .store_faults
        .iter()
        .filter(|r| r.store == StoreName::Lockdb && r.decision.fault == Some(Injected::Unavailable))
        .map(|r| r.at_ms)
        .collect();
    Some((*at.iter().min()?, *at.iter().max()?))
}

/// Tokens of (grants, accepted claims) before `from` and after `to` (runtime ms).
fn tokens_around(f: &ScenarioFacts, from: u64, to: u64, grants: bool) -> (Vec<i64>, Vec<i64>) {
    let (mut before, mut after) = (Vec::new(), Vec::new());
    for s in &f.seen {
        let (at, token) = match s {
            Seen::Granted { at_ms, token, .. } if grants => (*at_ms, *token),
            Seen::Fenced { at_ms, token, op: FencedOp::Claim, accepted: true, .. } if !grants => (*at_ms, *token),
            _ => continue,
        };
        let at = f.monitor_started_ms + at;
        if at < from {
            before.push(token);
        } else if at > to {
            after.push(token);
        }
    }
    (before, after)
}

/// lockdb loses its leader while a lease is held: the lock servers answer NOT_LEADER, the
/// oracle sees no two live grants and rising tokens, grants resume after the loss with
/// tokens above every earlier one, and every payout is paid once and posted.
#[test]
fn a_lockdb_leader_loss_answers_not_leader_and_grants_resume_above_every_earlier_token() {
    for seed in world_seeds() {
        let (o, f) = play_in_the_world("lock-leader-loss", seed);
        let (from, to) = lockdb_refusals(&f).expect("lockdb refused calls during the leader loss");
        assert!(f.acquires_not_leader >= 1.0, "seed {seed}: no acquire answered NOT_LEADER");
        let (before, after) = tokens_around(&f, from, to, true);
        assert!(
            !before.is_empty() && !after.is_empty(),
            "seed {seed}: grants {before:?} / {after:?}\n{}",
            o.trace.join("\n")
        );
        assert!(after.iter().min() > before.iter().max(), "seed {seed}: {before:?} then {after:?}");
        assert!(all_posted(&f), "seed {seed}: {:?}", f.final_states);
        assert!(f.final_states.keys().all(|p| rail_calls_of(&f, *p) == 1), "seed {seed}: {:?}", f.rail_calls);
    }
}

/// The simulated etcd loses its leader (unreachable and frozen) while a lease is held: the
/// lock server refuses (NOT_LEADER, or INTERNAL for a write it cannot prove unapplied),
/// the fences accept only rising tokens, claims after the election carry tokens above every
/// earlier one, and every payout is paid once and posted.
#[test]
fn an_etcd_leader_loss_refuses_the_lock_server_and_tokens_rise_across_the_election() {
    for seed in world_seeds() {
        let (o, f) = play_in_the_world("lock-leader-loss-etcd", seed);
        let loss = f.faults.iter().find_map(|r| match r.kind {
            FaultKind::EtcdLeaderLoss { for_ms } => Some((r.at_ms, r.at_ms + for_ms)),
            _ => None,
        });
        let (from, to) = loss.expect("the etcd leader was lost");
        assert!(f.acquires_not_leader >= 1.0, "seed {seed}: no acquire was refused during the election");
        let (before, after) = tokens_around(&f, from, to, false);
        assert!(
            !before.is_empty() && !after.is_empty(),
            "seed {seed}: claims {before:?} / {after:?}\n{}",
            o.trace.join("\n")
        );
        assert!(after.iter().min() > before.iter().max(), "seed {seed}: {before:?} then {after:?}");
        assert!(all_posted(&f), "seed {seed}: {:?}", f.final_states);
        assert!(f.final_states.keys().all(|p| rail_calls_of(&f, *p) == 1), "seed {seed}: {:?}", f.rail_calls);
    }
}

/// A scenario seed replays bit for bit, like a swarm seed: the same configuration line,
/// failures, probes and trace.
#[test]
fn a_scenario_seed_replays_the_same_outcome() {
    let opts = RunOptions { scenario: Some("waiter-session-expires".into()), ..RunOptions::default() };
    let (a, b) = (campaign::run_seed(3, &opts), campaign::run_seed(3, &opts));
    assert!(a.config.starts_with("seed=3 scenario=waiter-session-expires "), "{}", a.config);
    assert_eq!((a.config, a.failures, a.probes, a.sim_ms), (b.config, b.failures, b.probes, b.sim_ms));
    assert_eq!(a.trace, b.trace);
}

/// An unknown scenario name is refused, naming the known ones; a proxy scenario plays as a
/// seed on the proxy world and an unmet expectation there is a correctness failure.
#[test]
fn an_unknown_scenario_is_refused_and_a_proxy_scenario_plays_as_a_seed() {
    let err = scenario::load_named("no-such-scenario").expect_err("unknown");
    assert!(err.contains("known: ") && err.contains("stale-writer-second-proxy"), "{err}");
    let opts = RunOptions { scenario: Some("no-such-scenario".into()), ..RunOptions::default() };
    let o = campaign::run_seed(1, &opts);
    assert_eq!(o.worst(), Some(dlock_sim::outcome::FailureClass::Crash));
    let opts = RunOptions { scenario: Some("proxy-restart".into()), ..RunOptions::default() };
    let o = campaign::run_seed(1, &opts);
    assert!(o.failures.is_empty(), "{:?}", o.failures);
    assert!(o.trace.iter().any(|l| l.contains("token=41 -> 409 FENCED_OUT")), "{:?}", o.trace);
}
