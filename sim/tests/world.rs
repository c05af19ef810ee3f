//! The world builder: the largest topology builds with every node at its table address,
//! each store is handed to each node through the wrapper seam, executors spread over the
//! replicas by index, and a restarted node comes back through its entry point over the same
//! database.

#![cfg(madsim)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use dlock_contract::payment::NewAccountRequest;
use dlock_contract::{IdempotencyKey, OwnerId};
use dlock_payment_client::{PaymentClient, PaymentClientConfig};
use dlock_payment_resource::store::PaymentStore;
use dlock_rt::Duration;
use dlock_sim::world::{self, node_addr, node_url, LockBackend, StoreWrap, Topology, WorldSpec};

const NAMES: [&str; 18] = [
    "rail-stub",
    "proxy-1",
    "proxy-2",
    "payment-1",
    "payment-2",
    "lock-1",
    "lock-2",
    "lock-3",
    "etcd",
    "executor-1",
    "executor-2",
    "executor-3",
    "executor-4",
    "executor-5",
    "executor-6",
    "reconciler",
    "workload",
    "operator",
];

#[test]
fn every_node_of_the_table_has_its_own_address() {
    let mut ips = BTreeSet::new();
    for name in NAMES.iter().chain(["observer"].iter()) {
        let addr = node_addr(name).unwrap_or_else(|| panic!("{name} has no address"));
        assert!(ips.insert(addr.ip()), "{name} shares {addr}");
    }
    assert_eq!(node_addr("executor-7"), None);
    assert_eq!(node_addr("lock-0"), None);
    assert_eq!(node_addr("nobody"), None);
}

fn largest(wrapped: Arc<Mutex<Vec<String>>>) -> WorldSpec {
    let (p, r, l) = (wrapped.clone(), wrapped.clone(), wrapped);
    WorldSpec {
        topology: Topology {
            lock_replicas: 3,
            payment_replicas: 2,
            proxy_replicas: 2,
            executors: vec![1, 8, 2, 3, 1, 4],
            reconciler: true,
        },
        backend: LockBackend::Mem,
        wrap: StoreWrap {
            payment: Some(Arc::new(move |n: &str, s| {
                p.lock().expect("log").push(format!("payment {n}"));
                s
            })),
            rail: Some(Arc::new(move |n: &str, s| {
                r.lock().expect("log").push(format!("rail {n}"));
                s
            })),
            lock: Some(Arc::new(move |n: &str, s| {
                l.lock().expect("log").push(format!("lock {n}"));
                s
            })),
            plan: None,
        },
        ..WorldSpec::default()
    }
}

#[madsim::test]
async fn the_largest_world_builds_with_every_node_named_and_every_store_wrapped() {
    let wrapped = Arc::new(Mutex::new(Vec::new()));
    let spec = largest(wrapped.clone());
    let cfg = world::executor_spec_config(&spec, 5, 3).expect("executor 5");
    assert_eq!(cfg.lock_url, node_url("lock-2"), "executor 5 of 3 lock replicas calls lock-2");
    assert_eq!(cfg.payment_url, node_url("payment-1"));
    assert_eq!(cfg.proxy_url, node_url("proxy-1"));
    assert_eq!(cfg.concurrency, 3);
    let w = world::build(spec).await.expect("world");
    let names = w.node_names();
    for name in NAMES.iter().filter(|n| !["etcd", "workload", "operator"].contains(n)) {
        assert!(names.iter().any(|n| n == name), "{name} missing from {names:?}");
    }
    let ids: BTreeSet<_> = names.iter().map(|n| w.node_id(n).expect("id")).collect();
    assert_eq!(ids.len(), names.len(), "one node per name");
    // Every executor runs (its init ran), under its own name.
    let up = dlock_rt::wait_until(Duration::from_millis(50), Duration::from_millis(5_000), || async {
        (w.executors().len() == 6).then_some(())
    })
    .await;
    assert!(up.is_some(), "executors running: {:?}", w.executors().keys().collect::<Vec<_>>());
    let mut seen = wrapped.lock().expect("log").clone();
    seen.sort();
    assert!(seen.contains(&"lock lock-3".to_owned()) && seen.contains(&"payment payment-2".to_owned()));
    assert!(seen.contains(&"rail proxy-2".to_owned()), "{seen:?}");
}

#[madsim::test]
async fn a_restarted_payment_replica_comes_back_over_the_same_paydb() {
    let spec = WorldSpec {
        topology: Topology { payment_replicas: 2, ..Topology::default() },
        backend: LockBackend::Mem,
        ..WorldSpec::default()
    };
    let mut w = world::build(spec).await.expect("world");
    let client = node_url("payment-2");
    let open = |id: &'static str| {
        let client = client.clone();
        async move {
            let c = PaymentClient::new(PaymentClientConfig::new(client)).expect("client");
            let body = NewAccountRequest { account_id: id.into(), currency: "EUR".into(), opening_balance_minor: 10 };
            let key = IdempotencyKey::parse(&format!("open-{id}")).expect("key");
            c.create_account(&OwnerId::parse("ops").expect("owner"), &key, &body).await.is_ok()
        }
    };
    let node = w.add_node("workload");
    assert!(node.spawn(open("acct-a")).await.expect("workload"), "payment-2 serves");
    assert!(w.restart("payment-2"));
    let back = dlock_rt::wait_until(Duration::from_millis(50), Duration::from_millis(5_000), || {
        let node = node.clone();
        async move { node.spawn(open("acct-b")).await.ok().filter(|ok| *ok) }
    })
    .await;
    assert!(back.is_some(), "payment-2 came back through its entry point");
    let a = PaymentStore::account(&*w.paydb, "acct-a").await.expect("read");
    assert!(a.is_some(), "the account opened before the restart is still in paydb");
}

/// The world as a schedule's stage: only service nodes and executors are fault targets (the
/// harness's nodes and etcd are refused by name), a swarm draw's store plan sits in front of
/// the stores, and `heal_all` starts a killed node again and lifts every pause and window.
#[madsim::test]
async fn the_world_stage_faults_only_services_and_executors_and_heal_all_restores_them() {
    use dlock_sim::schedule::Stage;
    let cfg = dlock_sim::swarm::SwarmConfig::draw(7);
    let mut w = world::build(dlock_sim::campaign::spec_of(&cfg)).await.expect("the drawn world builds");
    w.add_node("workload");
    w.add_node("operator");
    let targets = w.fault_targets();
    for name in ["observer", "workload", "operator", "reconciler", "etcd"] {
        assert!(!targets.iter().any(|t| t == name), "{name} is a fault target: {targets:?}");
        assert!(Stage::node(&w, name).is_none(), "the stage hands out {name}");
    }
    assert!(targets.iter().any(|t| t == "lock-1") && targets.iter().any(|t| t == "executor-1"), "{targets:?}");
    assert!(Stage::store_plan(&w).is_some(), "the drawn world has no store plan");
    let payment = Stage::node(&w, "payment-1").expect("payment-1");
    w.faults().kill(payment);
    let lock = Stage::node(&w, "lock-1").expect("lock-1");
    w.faults().pause(lock);
    let healed = w.heal_all();
    assert_eq!(healed, vec!["heal: restarted payment-1".to_owned()]);
    assert!(w.faults().paused().is_empty());
    // The restarted payment replica answers again.
    let up = dlock_rt::wait_until(Duration::from_millis(50), Duration::from_millis(5_000), || async {
        let r = w
            .node("observer")
            .expect("observer")
            .spawn(async {
                dlock_rt::http::HttpClient::new(500, 1_000)
                    .send(&node_url("payment-1"), http::Method::GET, "/health/live", &[], None)
                    .await
                    .is_ok_and(|r| r.status == 200)
            })
            .await;
        r.ok().filter(|ok| *ok)
    })
    .await;
    assert!(up.is_some(), "payment-1 did not come back after heal_all");
}

/// Drawn schedules never crash the rail-stub (its record is the oracle's ground truth) and
/// always close what they open.
#[test]
fn a_drawn_campaign_schedule_never_crashes_the_rail_stub_and_closes_every_fault() {
    let targets: Vec<String> =
        NAMES.iter().filter(|n| !world::UNFAULTABLE_NODES.contains(n)).map(|s| s.to_string()).collect();
    let mut events = 0;
    for seed in 0..300 {
        let cfg = dlock_sim::swarm::SwarmConfig::draw(seed);
        let s = dlock_sim::campaign::draw_schedule(&cfg, &targets, &mut dlock_rt::rand::seeded(seed));
        let timeline = s.timeline();
        events += timeline.len();
        assert!(s.closes_what_it_opens(), "seed {seed}: {s:?}");
        assert!(!timeline.iter().any(|t| matches!(t.event.fault(),
            Some(dlock_sim::schedule::Fault::Crash { node, .. } | dlock_sim::schedule::Fault::Start { node }) if node == "rail-stub")));
    }
    assert!(events > 300, "300 drawn seeds played only {events} fault events");
}

/// DL-109: every node of a world authenticates (E-13): a request with an unknown token is
/// `401 UNAUTHENTICATED` and one with no token is too, while the world's own clients carry
/// its credentials (a token of the role each endpoint needs) and are served.
#[madsim::test]
async fn every_world_node_authenticates_and_the_worlds_clients_carry_its_credentials() {
    let spec = WorldSpec { backend: LockBackend::Mem, ..WorldSpec::default() };
    let mut w = world::build(spec).await.expect("world");
    let node = w.add_node("workload");
    let answers = node
        .spawn(async {
            let mut out = Vec::new();
            for name in ["lock-1", "payment-1", "proxy-1"] {
                let url = node_url(name);
                let carried = dlock_rt::http::HttpClient::new(500, 2_000)
                    .send(&url, http::Method::GET, "/metrics", &[], None)
                    .await
                    .map(|r| r.status);
                let stranger = dlock_rt::http::HttpClient::new(500, 2_000)
                    .send(
                        &url,
                        http::Method::GET,
                        "/metrics",
                        &[("authorization", "Bearer nobody-knows-this-token")],
                        None,
                    )
                    .await
                    .map(|r| (r.status, serde_json::from_slice::<serde_json::Value>(&r.body).unwrap_or_default()));
                let health = dlock_rt::http::HttpClient::new(500, 2_000)
                    .send(&url, http::Method::GET, "/health/live", &[("authorization", "Bearer x")], None)
                    .await
                    .map(|r| r.status);
                out.push((name, carried.ok(), stranger.ok(), health.ok()));
            }
            out
        })
        .await
        .expect("workload");
    for (name, carried, stranger, health) in answers {
        assert_eq!(carried, Some(200), "{name}: the world's client is served");
        let (status, body) = stranger.expect("answered");
        assert_eq!((status, body["code"].as_str()), (401, Some("UNAUTHENTICATED")), "{name}: {body}");
        assert_eq!(health, Some(200), "{name}: health is open");
    }
}
