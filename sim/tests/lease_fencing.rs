//! The whole point, in a seeded world: a worker holding the lock is paused (a GC pause, a
//! stalled VM) past its lease; a newer worker takes the lock with a larger token and pays;
//! the paused worker wakes, its client already knows the lease is gone, and even if it
//! writes anyway the rail-proxy fences it out. An operator revoke does the same to a live
//! holder. Lock server, rail-proxy and rail-stub run on their own madsim nodes. The lock
//! server's backend is either the simulation store or madsim-etcd-client's simulated etcd on
//! its own node (the etcd backend's code, unchanged); paydb is the simulation store. Both
//! outlive every service node.

#![cfg(madsim)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use dlock_contract::payout::PayoutState;
use dlock_contract::OwnerId;
use dlock_lock_client::{LockClient, LockClientConfig};
use dlock_lock_server::store_mem::MemLockStore;
use dlock_rail_proxy::store::{NewPayout, RailStore};
use dlock_rail_proxy::store_mem::MemRailStore;
use dlock_rt::http::{BaseUrl, HttpClient};
use dlock_rt::{Clock, Duration};
use dlock_sim::world;
use serde_json::{json, Value};
use uuid::Uuid;

use dlock_sim::world::{LOCK_IP, PROXY_IP, STUB_IP};

const ACCOUNT: &str = "acct-1";
/// Lease of every grant in these tests.
const LEASE_MS: u64 = 3_000;
/// How long the zombie is frozen: well past its lease and its session.
const PAUSE_MS: u64 = 12_000;

fn url(ip: [u8; 4], port: u16) -> BaseUrl {
    BaseUrl::plain(SocketAddr::new(IpAddr::from(ip), port).to_string())
}

struct World {
    rail: Arc<MemRailStore>,
    payouts: Vec<Uuid>,
}

/// The lock server's backend in a simulated world.
#[derive(Debug, Clone, Copy)]
enum Backend {
    /// The in-memory lockdb.
    Mem,
    /// madsim-etcd-client's simulated etcd, on its own node.
    Etcd,
}

const ETCD_ADDR: &str = "10.0.2.1:2379";
/// Longest the lock server waits for the simulated etcd to answer at start.
const ETCD_START_MS_MAX: u64 = 5_000;

async fn lock_store(backend: Backend, mem: Arc<MemLockStore>) -> Arc<dyn dlock_lock_server::store::LockStore> {
    match backend {
        Backend::Mem => mem,
        Backend::Etcd => {
            let endpoints = vec![format!("http://{ETCD_ADDR}")];
            let store = dlock_rt::wait_until(Duration::from_millis(50), Duration::from_millis(ETCD_START_MS_MAX), || {
                let endpoints = endpoints.clone();
                async move { dlock_lock_server::store_etcd::EtcdLockStore::connect(&endpoints, "/dlock").await.ok() }
            })
            .await
            .expect("simulated etcd reachable");
            Arc::new(store)
        }
    }
}

/// Starts the lock server (on `backend`), the rail-stub and the rail-proxy, with `n`
/// CLAIMED payouts.
async fn world(n: usize, backend: Backend) -> World {
    let handle = madsim::runtime::Handle::current();
    if let Backend::Etcd = backend {
        let ip: IpAddr = ETCD_ADDR.split(':').next().and_then(|ip| ip.parse().ok()).expect("etcd ip");
        let etcd = handle.create_node().name("etcd").ip(ip).build();
        etcd.spawn(async move {
            let addr: SocketAddr = ETCD_ADDR.parse().expect("etcd addr");
            etcd_client::SimServer::builder().serve(addr).await.expect("simulated etcd serves");
        });
    }
    let locks = Arc::new(MemLockStore::new(Clock::reference()));
    let rail = Arc::new(MemRailStore::new());
    let mut payouts = Vec::new();
    for i in 0..n {
        let id = dlock_rt::rand::uuid_v4();
        let p = NewPayout {
            payout_id: id,
            account_id: ACCOUNT.into(),
            amount_minor: 100 + i as i64,
            currency: "EUR".into(),
            beneficiary_ref: "b".into(),
            state: PayoutState::Claimed,
        };
        rail.insert_payout(&p, Clock::system().wall()).await.expect("seed payout");
        payouts.push(id);
    }
    // Every service through its crate's entry point, settings from its own resolver.
    let stub_seed = dlock_rt::rand::random_u64().to_string();
    let layers = world::layers(&[("rail.stub.seed", &stub_seed)]);
    world::start_lock_node(&layers, 700, move || lock_store(backend, locks.clone()));
    world::start_stub_node(&layers, -4_000);
    let proxy_store: Arc<dyn RailStore> = rail.clone();
    world::start_proxy_node(&layers, 0, proxy_store);
    // Let the nodes bind before anyone calls them.
    dlock_rt::sleep(Duration::from_millis(100)).await;
    World { rail, payouts }
}

fn lock_client(owner: &str) -> LockClient {
    let mut cfg = LockClientConfig::new(url(LOCK_IP, 8081), OwnerId::parse(owner).expect("owner"));
    cfg.session_ttl_ms = LEASE_MS;
    cfg.lock_ttl_ms = LEASE_MS;
    LockClient::new(cfg).expect("client config")
}

/// `POST /v1/rail/submissions` through the rail client; the answer's status and code (or
/// outcome).
async fn submit(payout: Uuid, amount_minor: i64, token: i64, owner: &str) -> (u16, String) {
    let mut cfg = dlock_rail_client::RailClientConfig::new(url(PROXY_IP, 8083));
    cfg.read_timeout_ms = 20_000;
    let client = dlock_rail_client::RailClient::new(cfg).expect("rail client");
    let body = dlock_contract::rail::SubmissionRequest {
        payout_id: payout,
        account_id: ACCOUNT.into(),
        amount_minor,
        currency: "EUR".into(),
        beneficiary_ref: "b".into(),
    };
    let token = dlock_sim::world::signed(ACCOUNT, token, owner);
    let key = dlock_contract::IdempotencyKey::parse(&format!("payout:{payout}")).expect("key");
    match client.submit(token, &OwnerId::parse(owner).expect("owner"), &key, &body).await {
        Ok(ack) => (200, ack.outcome.as_str().to_owned()),
        Err(dlock_rail_client::RailRefusal::Refused { status, envelope }) => {
            (status, envelope.code.as_str().to_owned())
        }
        Err(dlock_rail_client::RailRefusal::Unreadable { status, .. }) => (status, "?".to_owned()),
        Err(e) => panic!("proxy answered: {e}"),
    }
}

/// The rail's own call log, read from an observer node (the test's own task has no address
/// on the simulated network). Called once per simulated world: the node keeps its address.
async fn rail_calls() -> Vec<String> {
    let handle = madsim::runtime::Handle::current();
    let observer = handle.create_node().name("observer").ip(IpAddr::from([10, 0, 9, 9])).build();
    observer.spawn(read_rail_calls()).await.expect("observer")
}

async fn read_rail_calls() -> Vec<String> {
    let r = HttpClient::new(1_000, 5_000)
        .send(&url(STUB_IP, 8084), http::Method::GET, "/calls", &[], None)
        .await
        .expect("stub answered");
    let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    v["calls"].as_array().into_iter().flatten().filter_map(|c| c["clientRef"].as_str().map(str::to_owned)).collect()
}

#[madsim::test]
async fn a_worker_paused_past_its_lease_is_fenced_out_at_the_rail() {
    paused_worker_is_fenced_out(Backend::Mem).await
}

#[madsim::test]
async fn a_worker_paused_past_its_lease_is_fenced_out_at_the_rail_on_simulated_etcd() {
    paused_worker_is_fenced_out(Backend::Etcd).await
}

async fn paused_worker_is_fenced_out(backend: Backend) {
    let seed = madsim::runtime::Handle::current().seed();
    eprintln!("dlock-sim seed={seed} backend={backend:?}");
    let handle = madsim::runtime::Handle::current();
    let w = world(2, backend).await;
    let (p1, p2) = (w.payouts[0], w.payouts[1]);

    // Worker A takes the lock, then freezes before it submits.
    let zombie = handle.create_node().name("worker-a").ip(IpAddr::from([10, 0, 0, 10])).build();
    let (acquired_tx, acquired_rx) = tokio::sync::oneshot::channel::<i64>();
    let a = zombie.spawn(async move {
        let session = lock_client("worker-a").open_session().await.expect("session");
        let guard = session.acquire("payout:acct-1").await.expect("grant");
        let _ = acquired_tx.send(guard.token().get());
        // The critical section: this sleep is where the pause lands.
        dlock_rt::sleep(Duration::from_millis(200)).await;
        let held_at_wake = guard.is_held();
        // A buggy worker writes anyway; the fence must stop it.
        let answer = submit(p1, 100, guard.token().get(), "worker-a").await;
        (guard.token().get(), held_at_wake, answer)
    });
    let token_a = acquired_rx.await.expect("worker A acquired");
    handle.pause(zombie.id());

    // Worker B waits out A's lease, takes the lock with a larger token, and pays.
    let worker_b = handle.create_node().name("worker-b").ip(IpAddr::from([10, 0, 0, 11])).build();
    let b = worker_b.spawn(async move {
        let session = lock_client("worker-b").open_session().await.expect("session");
        let guard = dlock_rt::wait_until(Duration::from_millis(250), Duration::from_millis(PAUSE_MS), || {
            let session = &session;
            async move { session.acquire("payout:acct-1").await.ok() }
        })
        .await
        .expect("worker B got the lock once A's lease lapsed");
        let answer = submit(p2, 101, guard.token().get(), "worker-b").await;
        (guard.token().get(), answer)
    });
    let (token_b, answer_b) = b.await.expect("worker B");
    assert!(token_b > token_a, "B's token {token_b} must exceed A's {token_a}");
    assert_eq!(answer_b, (200, "ACKED".to_owned()));

    dlock_rt::sleep(Duration::from_millis(PAUSE_MS)).await;
    handle.resume(zombie.id());
    let (_, held_at_wake, answer_a) = a.await.expect("worker A");
    assert!(!held_at_wake, "A's client still believed it held the lock after a {PAUSE_MS} ms pause");
    assert_eq!(answer_a, (409, "FENCED_OUT".to_owned()), "the zombie's write was not fenced");
    assert_eq!(rail_calls().await, [p2.to_string()], "only B's payout may reach the rail");
    assert_eq!(w.rail.high_water(ACCOUNT).await.expect("mark"), Some(token_b));
}

#[madsim::test]
async fn a_revoked_holder_is_fenced_out_by_the_next_holder() {
    revoked_holder_is_fenced_out(Backend::Mem).await
}

#[madsim::test]
async fn a_revoked_holder_is_fenced_out_by_the_next_holder_on_simulated_etcd() {
    revoked_holder_is_fenced_out(Backend::Etcd).await
}

async fn revoked_holder_is_fenced_out(backend: Backend) {
    let seed = madsim::runtime::Handle::current().seed();
    eprintln!("dlock-sim seed={seed} backend={backend:?}");
    let handle = madsim::runtime::Handle::current();
    let w = world(2, backend).await;
    let (p1, p2) = (w.payouts[0], w.payouts[1]);
    let ops = handle.create_node().name("ops").ip(IpAddr::from([10, 0, 0, 20])).build();
    let outcome = ops
        .spawn(async move {
            let c = lock_client("worker-c").open_session().await.expect("session");
            let held = c.acquire("payout:acct-1").await.expect("grant");
            let token_c = held.token().get();
            // An operator evicts C without its cooperation.
            let body =
                json!({ "operator": "alice", "reason": "holder stuck on a dead rail", "expectedToken": token_c });
            let r = HttpClient::new(1_000, 5_000)
                .send(
                    &url(LOCK_IP, 8081),
                    http::Method::POST,
                    "/v1/locks/payout:acct-1/revoke",
                    &[("content-type", "application/json"), ("x-owner-id", "alice")],
                    Some(body.to_string().into()),
                )
                .await
                .expect("revoke answered");
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            let floor =
                serde_json::from_slice::<Value>(&r.body).expect("json")["newTokenFloor"].as_i64().expect("floor");
            let d = lock_client("worker-d").open_session().await.expect("session");
            let next = d.acquire("payout:acct-1").await.expect("grant after revoke");
            let token_d = next.token().get();
            let paid = submit(p2, 101, token_d, "worker-d").await;
            let stale = submit(p1, 100, token_c, "worker-c").await;
            (token_c, floor, token_d, paid, stale)
        })
        .await
        .expect("ops");
    let (token_c, floor, token_d, paid, stale) = outcome;
    assert!(floor > token_c && token_d > floor, "tokens {token_c} < floor {floor} < {token_d} must hold");
    assert_eq!(paid, (200, "ACKED".to_owned()));
    assert_eq!(stale, (409, "FENCED_OUT".to_owned()));
    assert_eq!(rail_calls().await, [p2.to_string()]);
}
