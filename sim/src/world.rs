//! The simulated cluster: one world builder, [`build`], for every topology a simulation
//! needs (the swarm's draws, scenarios, hand-written tests): 1–3 lock-server replicas over
//! one lockdb (the simulation store [`MemLockStore`] or the simulated etcd), 1–2
//! payment-resource and 1–2 rail-proxy replicas over one paydb ([`MemPaydb`]), the
//! rail-stub, 1–6 executors of concurrency 1–8, and the reconciler's node; or, with no lock
//! server, no payment-resource and no executors, the proxy scenarios' world
//! ([`WorldSpec::proxy_only`]). [`start`] is [`build`] of a spec within bounds.
//!
//! Nodes are addressed by name ([`node_addr`] holds the table; docs/simulation.md shows it):
//!
//! | node | address |
//! |---|---|
//! | `rail-stub` | 10.0.0.1:8084 |
//! | `proxy-1`, `proxy-2` | 10.0.0.2:8083, 10.0.4.2:8083 |
//! | `payment-1`, `payment-2` | 10.0.0.4:8082, 10.0.3.2:8082 |
//! | `lock-1` … `lock-3` | 10.0.1.N:8081 |
//! | `etcd` | 10.0.2.1:2379 (etcd backend only) |
//! | `executor-1` … `executor-6` | 10.0.5.N:8085 |
//! | `client-1` … `client-3` | 10.0.8.N (scripted lock clients, no listener) |
//! | `reconciler`, `workload`, `operator`, `observer` | 10.0.6.1, 10.0.7.1, 10.0.7.2, 10.0.9.9 |
//!
//! Invariants:
//! - Every service starts through its crate's entry point in its node's `init`, so a madsim
//!   restart of the node ([`World::restart`]) starts it again the production way.
//! - The databases live outside every service node: a kill or restart loses a process's
//!   memory, never its database. The world keeps the unwrapped stores ([`World::paydb`],
//!   [`World::locks`]) as the checkers' ground truth; the nodes get them through the optional
//!   [`StoreWrap`] closures (the fault layer's seam).
//! - Executor `i` calls the replicas [`Topology::replica_for`] picks by its index, so any
//!   topology with two proxies has executors on both.
//!
//! Tests judge a run with [`violations`] (the oracle's [`crate::oracle::safety_failures`]),
//! which reads paydb and the rail's own record, never the answers.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use dlock_config::Layers;
use dlock_executor::{Executor, ExecutorConfig};
use dlock_lock_server::store::LockStore;
use dlock_lock_server::store_mem::MemLockStore;
use dlock_payment_resource::store::PaymentStore;
use dlock_payment_resource::store_mem::MemPaydb;
use dlock_rail_proxy::store::RailStore;
use dlock_rt::http::{BaseUrl, HttpClient};
use dlock_rt::{Clock, Duration, ServiceHandle};
use serde_json::Value;
use tokio::net::TcpListener;

use crate::faults::Faults;
use crate::oracle::calls::{CallSlot, ObservedLockStore};
use crate::store_faults::StoreFaultPlan;

pub const LOCK_IP: [u8; 4] = [10, 0, 1, 1];
pub const STUB_IP: [u8; 4] = [10, 0, 0, 1];
pub const PROXY_IP: [u8; 4] = [10, 0, 0, 2];
pub const PAYMENT_IP: [u8; 4] = [10, 0, 0, 4];
pub const LOCK_PORT: u16 = 8081;
pub const PAYMENT_PORT: u16 = 8082;
pub const PROXY_PORT: u16 = 8083;
pub const STUB_PORT: u16 = 8084;
pub const EXECUTOR_PORT: u16 = 8085;
/// An address no service uses, for reading the rail's record from outside every node.
pub const OBSERVER_IP: [u8; 4] = [10, 0, 9, 9];
/// How long the nodes get to bind before anyone calls them.
pub const BIND_SETTLE_MS: u64 = 100;
/// The lock server's reaper interval in every simulated world (shorter than production's,
/// so lapsed sessions are reaped within a short simulated run).
pub const REAP_INTERVAL_MS: u64 = 200;

/// `http://ip:port`.
pub fn url(ip: [u8; 4], port: u16) -> BaseUrl {
    BaseUrl::plain(SocketAddr::new(IpAddr::from(ip), port).to_string())
}

fn http(ip: [u8; 4], port: u16) -> String {
    format!("http://{}", SocketAddr::new(IpAddr::from(ip), port))
}

/// The keys that wire a world together: each service's listen address on its node, and
/// the addresses the services and executors call each other on.
pub fn wiring() -> Vec<(&'static str, String)> {
    let addr = |ip: [u8; 4], port: u16| SocketAddr::new(IpAddr::from(ip), port).to_string();
    vec![
        ("lock.server.listen", addr(LOCK_IP, LOCK_PORT)),
        ("rail.stub.listen", addr(STUB_IP, STUB_PORT)),
        ("payment.resource.listen", addr(PAYMENT_IP, PAYMENT_PORT)),
        ("rail.proxy.listen", addr(PROXY_IP, PROXY_PORT)),
        ("rail.proxy.rail-url", http(STUB_IP, STUB_PORT)),
        ("executor.lock-url", http(LOCK_IP, LOCK_PORT)),
        ("executor.payment-url", http(PAYMENT_IP, PAYMENT_PORT)),
        ("executor.proxy-url", http(PROXY_IP, PROXY_PORT)),
    ]
}

/// The layers of a simulated world: `settings` (C5 keys, e.g. `("rail.stub.latency-ms",
/// "400")`, and `("profile", "unsafe-test")` to allow a safety switch off) over the world's
/// defaults, with the [`wiring`] imposed.
pub fn layers(settings: &[(&str, &str)]) -> Layers {
    let mut l = Layers::of(settings);
    l.set_default("lock.reaper.interval-ms", REAP_INTERVAL_MS);
    // The resources trust the world's grant key (C3-extensions E-14; [`grant_signer`]).
    let public = grant_signer().verify_key().to_base64();
    l.set_default("payment.grants.verify-keys", &public);
    l.set_default("rail.proxy.grants.verify-keys", &public);
    // Every node is given the world's credentials (E-13): the services the harness's
    // three tokens and the forger's two bound ones ([`credentials`]), the executors the
    // worker's, and every client in the simulation (one process) a token of the role each
    // endpoint needs.
    l.set_default("auth.credentials", credentials());
    l.set_default("executor.auth.token", dlock_testkit::auth::WORKER_TOKEN);
    dlock_rt::http::set_process_default_bearer(dlock_testkit::auth::bearer());
    for (key, value) in wiring() {
        l.set_flag(key, value);
    }
    l
}

/// The forger's worker credential ([`crate::forger`], its owner attacks): bound to
/// `owners=forger/*`. Simulation only.
pub const FORGER_WORKER_TOKEN: &str = "sim-forger-worker-token-00000000000001";
/// The worker credential of the victim the forger sets up itself: bound to
/// `owners=forger-victim/*`. Simulation only.
pub const VICTIM_WORKER_TOKEN: &str = "sim-forger-victim-token-00000000000001";

/// The world's credentials text: the harness's three tokens
/// ([`dlock_testkit::auth::credentials`]), then the forger's and its victim's worker
/// tokens, each bound to its own owner ids (C3-extensions E-9, "Owner binding").
pub fn credentials() -> String {
    format!(
        "{}worker {FORGER_WORKER_TOKEN} owners=forger/*\nworker {VICTIM_WORKER_TOKEN} owners=forger-victim/*\n",
        dlock_testkit::auth::credentials()
    )
}

/// Salt of the world's grant key stream ([`grant_signer`]).
const GRANT_KEY_SALT: u64 = 0x6772_616e_742d_6b65;

/// The world's grant signing key: every lock-server replica signs with it and the resources
/// trust its public key. Its 32 seed bytes come from a stream seeded with the simulation's
/// seed (the same bytes on every replay of a seed), not from the runtime's own stream: a
/// draw there would move every existing seed's schedule. Outside a runtime: seed 0.
pub fn grant_signer() -> dlock_contract::grant::GrantSigner {
    use dlock_rt::rand::Rng;
    let seed = madsim::runtime::Handle::try_current().map(|h| h.seed()).unwrap_or(0);
    let mut rng = dlock_rt::rand::seeded(seed ^ GRANT_KEY_SALT);
    let mut key = [0u8; 32];
    rng.fill(&mut key);
    dlock_contract::grant::GrantSigner::from_seed(&key)
}

/// `token` with the world key's signature of a grant of `payout:{account}` to `owner`: what
/// a test that drives the resources without a lock server presents (C3-extensions E-14).
pub fn signed(account: &str, token: i64, owner: &str) -> dlock_contract::grant::SignedToken {
    let t = dlock_contract::FencingToken::new(token).unwrap_or_else(|| panic!("token {token} is not > 0"));
    let sig = grant_signer().sign(&dlock_contract::grant::payout_lock_key(account), token, owner);
    dlock_contract::grant::SignedToken::new(t, Some(sig))
}

/// A running world: its nodes by name, the stores (outside every node), and the executors.
pub struct World {
    /// The simulation paydb, unwrapped: the ground truth the oracle reads.
    pub paydb: Arc<MemPaydb>,
    /// The simulation lockdb, unwrapped (the lock servers' store on [`LockBackend::Mem`]).
    pub locks: Arc<MemLockStore>,
    /// Where every lock-server replica's lockdb calls are told (either backend): the
    /// oracle's view of etcd, which has no store observer ([`crate::oracle::calls`]).
    pub lock_calls: Arc<CallSlot>,
    /// `lock-1`, `payment-1`, `proxy-1` and `rail-stub` (the nodes older tests name);
    /// `lock-1` and `payment-1` are absent from a proxy-only world
    /// ([`WorldSpec::proxy_only`]).
    pub lock_node: Option<madsim::runtime::NodeHandle>,
    pub payment_node: Option<madsim::runtime::NodeHandle>,
    pub proxy_node: madsim::runtime::NodeHandle,
    pub stub_node: madsim::runtime::NodeHandle,
    /// A node outside the cluster, for reading the rail's record.
    observer: madsim::runtime::NodeHandle,
    nodes: BTreeMap<String, madsim::runtime::NodeHandle>,
    spec: WorldSpec,
    executors: ExecutorRegistry,
    /// Set by [`World::heal_executors`]: every executor (re)starts without its chaos stalls.
    calm: Arc<AtomicBool>,
    /// The fault layer over this world's nodes (every node's name registered).
    faults: Faults,
    /// What the scripted lock clients did (`acquire` steps), one line each.
    clients: ClientLog,
}

/// What the scripted lock clients did, one line each, in order.
#[derive(Clone, Default)]
pub struct ClientLog(Arc<Mutex<Vec<String>>>);

impl ClientLog {
    /// Most lines kept.
    pub const LEN_MAX: usize = 10_000;

    pub fn lines(&self) -> Vec<String> {
        self.0.lock().map(|g| g.clone()).unwrap_or_default()
    }
    fn push(&self, line: String) {
        if let Ok(mut g) = self.0.lock() {
            if g.len() < Self::LEN_MAX {
                g.push(line);
            }
        }
    }
}

/// Each running executor by node name, replaced at each (re)start of its node.
type ExecutorRegistry = Arc<Mutex<BTreeMap<String, Arc<Executor>>>>;

/// How long the simulated supervisor waits before it starts a service again whose start
/// failed or whose server stopped: `RestartSec=2s` of the shipped systemd units
/// (deploy/systemd, `Restart=on-failure`), so a service that cannot reach its store at boot
/// comes back once the store does, as in production.
pub const SUPERVISOR_RESTART_MS: u64 = 2_000;

/// On the current node, as a supervisor (systemd's `Restart=on-failure`) runs a process:
/// binds `addr`, starts a service through `start` (a service crate's entry point, background
/// tasks included), and runs it until the node is killed; a failed bind or start, or a
/// server that stops, is retried after [`SUPERVISOR_RESTART_MS`] (the runtime's time limit
/// bounds the whole run).
pub async fn run_service<S, F, Fut>(name: &'static str, addr: SocketAddr, mut start: F)
where
    F: FnMut(TcpListener) -> Fut,
    Fut: Future<Output = Result<ServiceHandle<S>, String>>,
{
    loop {
        match dlock_rt::http::bind(addr).await {
            Ok(listener) => match start(listener).await {
                Ok(h) => {
                    h.stopped().await;
                    tracing::error!(service = name, "sim_service_stopped");
                }
                Err(e) => tracing::error!(service = name, cause = %e, "sim_service_start_failed"),
            },
            Err(e) => tracing::error!(service = name, cause = %e, "sim_service_bind_failed"),
        }
        dlock_rt::sleep(std::time::Duration::from_millis(SUPERVISOR_RESTART_MS)).await;
    }
}

/// The lock server on a new node named `lock-server` at [`LOCK_IP`], over `store` (made
/// anew at each (re)start, as a process reconnects to its database), started with
/// `dlock_lock_server::start`.
pub fn start_lock_node<St, StFut>(l: &Layers, skew_ms: i64, store: St) -> madsim::runtime::NodeHandle
where
    St: Fn() -> StFut + Send + Sync + 'static,
    StFut: Future<Output = Arc<dyn LockStore>> + Send + 'static,
{
    lock_node("lock-server", l, skew_ms, store)
}

fn lock_node<St, StFut>(name: &str, l: &Layers, skew_ms: i64, store: St) -> madsim::runtime::NodeHandle
where
    St: Fn() -> StFut + Send + Sync + 'static,
    StFut: Future<Output = Arc<dyn LockStore>> + Send + 'static,
{
    let mut s = dlock_lock_server::config::resolve(l, l.profile().expect("profile")).expect("lock-server settings");
    // Every replica signs with the world's key unless the settings name a key file.
    s.config.signer.get_or_insert_with(grant_signer);
    madsim::runtime::Handle::current()
        .create_node()
        .name(name)
        .ip(s.listen.ip())
        .init(move || {
            let (cfg, listen, store) = (s.config.clone(), s.listen, store());
            async move {
                let store = store.await;
                run_service("lock-server", listen, |l| {
                    dlock_lock_server::start(
                        cfg.clone(),
                        store.clone(),
                        Clock::with_skew_ms(skew_ms),
                        l,
                        std::future::pending(),
                    )
                })
                .await
            }
        })
        .build()
}

/// The rail-stub on a new node named `rail-stub`, started with `dlock_rail_stub::start`.
/// Its chaos seed is drawn once from the runtime unless `rail.stub.seed` is set.
pub fn start_stub_node(l: &Layers, skew_ms: i64) -> madsim::runtime::NodeHandle {
    stub_node("rail-stub", l, skew_ms)
}

fn stub_node(name: &str, l: &Layers, skew_ms: i64) -> madsim::runtime::NodeHandle {
    let s = dlock_rail_stub::config::resolve(l, l.profile().expect("profile")).expect("rail-stub settings");
    madsim::runtime::Handle::current()
        .create_node()
        .name(name)
        .ip(s.listen.ip())
        .init(move || {
            let (cfg, listen) = (s.config.clone(), s.listen);
            async move {
                run_service("rail-stub", listen, |l| {
                    dlock_rail_stub::start(cfg.clone(), Clock::with_skew_ms(skew_ms), l, std::future::pending())
                })
                .await
            }
        })
        .build()
}

/// The rail-proxy on a new node named `rail-proxy` over `store`, started with
/// `dlock_rail_proxy::start`: its orphan sweeper runs, so an intent a killed proxy left
/// behind is recovered after a restart, as in production.
pub fn start_proxy_node(l: &Layers, skew_ms: i64, store: Arc<dyn RailStore>) -> madsim::runtime::NodeHandle {
    proxy_node("rail-proxy", l, skew_ms, store)
}

fn proxy_node(name: &str, l: &Layers, skew_ms: i64, store: Arc<dyn RailStore>) -> madsim::runtime::NodeHandle {
    let s = dlock_rail_proxy::config::resolve(l, l.profile().expect("profile")).expect("rail-proxy settings");
    madsim::runtime::Handle::current()
        .create_node()
        .name(name)
        .ip(s.listen.ip())
        .init(move || {
            let (cfg, listen, store) = (s.config.clone(), s.listen, store.clone());
            async move {
                run_service("rail-proxy", listen, |l| {
                    dlock_rail_proxy::start(
                        cfg.clone(),
                        store.clone(),
                        Clock::with_skew_ms(skew_ms),
                        l,
                        std::future::pending(),
                    )
                })
                .await
            }
        })
        .build()
}

/// The payment-resource on a new node named `payment-resource` over `store`, started with
/// `dlock_payment_resource::start` (its idempotency purger included).
pub fn start_payment_node(l: &Layers, skew_ms: i64, store: Arc<dyn PaymentStore>) -> madsim::runtime::NodeHandle {
    payment_node("payment-resource", l, skew_ms, store)
}

fn payment_node(name: &str, l: &Layers, skew_ms: i64, store: Arc<dyn PaymentStore>) -> madsim::runtime::NodeHandle {
    let s = dlock_payment_resource::config::resolve(l, l.profile().expect("profile")).expect("payment settings");
    madsim::runtime::Handle::current()
        .create_node()
        .name(name)
        .ip(s.listen.ip())
        .init(move || {
            let (cfg, listen, store) = (s.config.clone(), s.listen, store.clone());
            async move {
                run_service("payment-resource", listen, |l| {
                    dlock_payment_resource::start(
                        cfg.clone(),
                        store.clone(),
                        Clock::with_skew_ms(skew_ms),
                        l,
                        std::future::pending(),
                    )
                })
                .await
            }
        })
        .build()
}

/// An executor's settings in a world: `settings` (C5 keys, `("profile", "unsafe-test")`
/// to allow `payment.fencing.enabled = false`) with the [`wiring`] imposed.
pub fn executor_config(settings: &[(&str, &str)]) -> ExecutorConfig {
    let l = layers(settings);
    dlock_executor::config::resolve(&l, l.profile().expect("profile")).expect("executor settings").config
}

/// Starts an executor on a new node `name` at `ip` with `dlock_executor::start`; returns
/// the node and the executor (for its metrics) once it runs.
pub async fn start_executor_node(
    name: &str,
    ip: [u8; 4],
    cfg: ExecutorConfig,
    skew_ms: i64,
) -> (madsim::runtime::NodeHandle, Arc<Executor>) {
    let node = madsim::runtime::Handle::current().create_node().name(name).ip(IpAddr::from(ip)).build();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let addr = SocketAddr::new(IpAddr::from(ip), EXECUTOR_PORT);
    let mut tx = Some(tx);
    node.spawn(async move {
        run_service("executor", addr, |l| {
            let (cfg, tx) = (cfg.clone(), tx.take());
            async move {
                let h = dlock_executor::start(cfg, Clock::with_skew_ms(skew_ms), l, std::future::pending()).await?;
                if let Some(tx) = tx {
                    let _ = tx.send(h.service.clone());
                }
                Ok(h)
            }
        })
        .await
    });
    let executor = rx.await.expect("the executor started");
    (node, executor)
}

/// [`build`] of a spec whose topology is within bounds (every preset's is).
///
/// # Panics
/// When `spec`'s topology is outside the world's bounds (a bug in the caller).
pub async fn start(spec: WorldSpec) -> World {
    build(spec).await.expect("the spec's topology is within the world's bounds")
}

impl World {
    /// The rail's own record (`GET /calls`): each call's `clientRef`, in arrival order, read
    /// from the observer node.
    pub async fn rail_calls(&self) -> Vec<String> {
        self.observer
            .spawn(async {
                let Ok(r) = HttpClient::new(1_000, 5_000)
                    .send(&url(STUB_IP, STUB_PORT), http::Method::GET, "/calls", &[], None)
                    .await
                else {
                    return Vec::new();
                };
                let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                v["calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c["clientRef"].as_str().map(str::to_owned))
                    .collect::<Vec<_>>()
            })
            .await
            .unwrap_or_default()
    }
}

/// What the oracle's end-of-run checks on paydb and the rail's record find
/// ([`crate::oracle::safety_failures`]), one `invariant: detail` line each; empty when the
/// run is clean.
pub async fn violations(paydb: &MemPaydb, rail_calls: &[String]) -> Vec<String> {
    let mut found: Vec<String> = crate::oracle::safety_failures(paydb, rail_calls)
        .into_iter()
        .map(|f| format!("{}: {}", f.invariant, f.detail))
        .collect();
    found.dedup();
    found
}

// ---------------------------------------------------------------------------------------
// The world builder: the one way a simulation builds a cluster of any drawn topology.
// ---------------------------------------------------------------------------------------

/// The simulated etcd's address (node `etcd`), when the lock servers run on it.
pub const ETCD_ADDR: &str = "10.0.2.1:2379";
/// Longest a lock-server replica waits for the simulated etcd at start.
pub const ETCD_START_MS_MAX: u64 = 5_000;
/// The workload's node (payout creation through the payment client).
pub const WORKLOAD_IP: [u8; 4] = [10, 0, 7, 1];
/// The operator's node (revokes over L8, RAIL_AMBIGUOUS resolutions).
pub const OPERATOR_IP: [u8; 4] = [10, 0, 7, 2];
/// IP of the forger's node (issue 12, [`crate::forger`]).
pub const FORGER_IP: [u8; 4] = [10, 0, 7, 3];
/// The stream watcher's node ([`crate::watcher`]).
pub const WATCHER_IP: [u8; 4] = [10, 0, 7, 4];
/// The reconciler's node.
pub const RECONCILER_IP: [u8; 4] = [10, 0, 6, 1];
/// Most lock-server replicas a topology may have.
pub const LOCK_REPLICAS_MAX: usize = 3;
/// Most payment-resource replicas.
pub const PAYMENT_REPLICAS_MAX: usize = 2;
/// Most rail-proxy replicas.
pub const PROXY_REPLICAS_MAX: usize = 2;
/// Most executors.
pub const EXECUTORS_MAX: usize = 6;
/// Most worker tasks per executor.
pub const EXECUTOR_CONCURRENCY_MAX: usize = 8;

/// The address of the node `name` (see the table in the crate doc and docs/simulation.md):
///
/// | name | address |
/// |---|---|
/// | `rail-stub` | 10.0.0.1:8084 |
/// | `proxy-1` | 10.0.0.2:8083 ([`PROXY_IP`]) |
/// | `proxy-2` | 10.0.4.2:8083 |
/// | `payment-1` | 10.0.0.4:8082 ([`PAYMENT_IP`]) |
/// | `payment-2` | 10.0.3.2:8082 |
/// | `lock-1..3` | 10.0.1.N:8081 (`lock-1` is [`LOCK_IP`]) |
/// | `etcd` | 10.0.2.1:2379 (etcd backend only) |
/// | `executor-1..6` | 10.0.5.N:8085 |
/// | `client-1..3` | 10.0.8.N (scripted lock clients, no listener) |
/// | `reconciler` | 10.0.6.1 (no listener) |
/// | `workload` | 10.0.7.1 (no listener) |
/// | `operator` | 10.0.7.2 (no listener) |
/// | `observer` | 10.0.9.9 (no listener) |
///
/// `None` for a name outside the table.
pub fn node_addr(name: &str) -> Option<SocketAddr> {
    let at = |ip: [u8; 4], port: u16| Some(SocketAddr::new(IpAddr::from(ip), port));
    let (kind, n) = match name.rsplit_once('-') {
        Some((k, n)) if n.parse::<u8>().is_ok() && !k.is_empty() => (k, n.parse::<u8>().unwrap_or(0)),
        _ => (name, 0),
    };
    match (kind, n) {
        ("rail-stub", 0) => at(STUB_IP, STUB_PORT),
        ("proxy", 1) => at(PROXY_IP, PROXY_PORT),
        ("proxy", 2) => at([10, 0, 4, 2], PROXY_PORT),
        ("payment", 1) => at(PAYMENT_IP, PAYMENT_PORT),
        ("payment", 2) => at([10, 0, 3, 2], PAYMENT_PORT),
        ("lock", n @ 1..=3) => at([10, 0, 1, n], LOCK_PORT),
        ("etcd", 0) => ETCD_ADDR.parse().ok(),
        ("executor", n @ 1..=6) => at([10, 0, 5, n], EXECUTOR_PORT),
        ("client", n @ 1..=3) => at([10, 0, 8, n], 0),
        ("reconciler", 0) => at(RECONCILER_IP, 0),
        ("workload", 0) => at(WORKLOAD_IP, 0),
        ("operator", 0) => at(OPERATOR_IP, 0),
        ("forger", 0) => at(FORGER_IP, 0),
        ("watcher", 0) => at(WATCHER_IP, 0),
        ("observer", 0) => at(OBSERVER_IP, 0),
        _ => None,
    }
}

/// `http://` base URL of the node `name`'s service.
///
/// # Panics
/// When `name` is not in the table of [`node_addr`] (a bug in the caller: names are fixed).
pub fn node_url(name: &str) -> BaseUrl {
    let addr = node_addr(name).unwrap_or_else(|| panic!("no simulated node named {name}"));
    BaseUrl::plain(addr.to_string())
}

/// The lock servers' backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockBackend {
    /// The simulation lockdb ([`MemLockStore`]), shared by every replica.
    Mem,
    /// madsim-etcd-client's simulated etcd on node `etcd`, the etcd backend's own code.
    Etcd,
}

impl LockBackend {
    pub fn name(self) -> &'static str {
        match self {
            LockBackend::Mem => "mem",
            LockBackend::Etcd => "etcd",
        }
    }
}

/// How many of each node a world has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Lock-server replicas, 1..=[`LOCK_REPLICAS_MAX`].
    pub lock_replicas: usize,
    /// Payment-resource replicas, 1..=[`PAYMENT_REPLICAS_MAX`].
    pub payment_replicas: usize,
    /// Rail-proxy replicas over the one paydb, 1..=[`PROXY_REPLICAS_MAX`].
    pub proxy_replicas: usize,
    /// Each executor's `--concurrency` (1..=[`EXECUTOR_CONCURRENCY_MAX`]); at most
    /// [`EXECUTORS_MAX`] executors, none is allowed (tests that start their own).
    pub executors: Vec<usize>,
    /// Whether the world has the `reconciler` node.
    pub reconciler: bool,
}

impl Default for Topology {
    /// One of each service, no executors, no reconciler node (what [`start`] builds).
    fn default() -> Self {
        Topology { lock_replicas: 1, payment_replicas: 1, proxy_replicas: 1, executors: Vec::new(), reconciler: false }
    }
}

impl Topology {
    /// The service node names, in start order.
    pub fn service_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        names.extend((1..=self.lock_replicas).map(|i| format!("lock-{i}")));
        names.push("rail-stub".to_owned());
        names.extend((1..=self.proxy_replicas).map(|i| format!("proxy-{i}")));
        names.extend((1..=self.payment_replicas).map(|i| format!("payment-{i}")));
        names
    }

    /// Executor `i` (1-based) calls lock replica `(i-1) % lock_replicas + 1`, and likewise
    /// for payment and proxy: executors spread over the replicas by index.
    pub fn replica_for(i: usize, replicas: usize) -> usize {
        (i.saturating_sub(1)) % replicas.max(1) + 1
    }

    fn check(&self) -> Result<(), String> {
        let within = |what: &str, n: usize, max: usize| {
            if (1..=max).contains(&n) {
                Ok(())
            } else {
                Err(format!("{what} {n} outside 1..={max}"))
            }
        };
        // A proxy-only world (no lock server, no payment-resource) has no executors.
        let proxy_only = self.lock_replicas == 0 && self.payment_replicas == 0 && self.executors.is_empty();
        if !proxy_only {
            within("lock replicas", self.lock_replicas, LOCK_REPLICAS_MAX)?;
            within("payment replicas", self.payment_replicas, PAYMENT_REPLICAS_MAX)?;
        }
        within("proxy replicas", self.proxy_replicas, PROXY_REPLICAS_MAX)?;
        if self.executors.len() > EXECUTORS_MAX {
            return Err(format!("{} executors, at most {EXECUTORS_MAX}", self.executors.len()));
        }
        for c in &self.executors {
            within("executor concurrency", *c, EXECUTOR_CONCURRENCY_MAX)?;
        }
        Ok(())
    }
}

/// Wraps the store a node is handed (the node's name, the store): the fault layer's seam.
/// The world keeps the unwrapped stores for the oracle's ground truth.
pub type PaymentWrap = Arc<dyn Fn(&str, Arc<dyn PaymentStore>) -> Arc<dyn PaymentStore> + Send + Sync>;
/// See [`PaymentWrap`]; for the proxies' paydb.
pub type RailWrap = Arc<dyn Fn(&str, Arc<dyn RailStore>) -> Arc<dyn RailStore> + Send + Sync>;
/// See [`PaymentWrap`]; for the lock servers' lockdb (either backend).
pub type LockWrap = Arc<dyn Fn(&str, Arc<dyn LockStore>) -> Arc<dyn LockStore> + Send + Sync>;

/// Optional wrappers around every store a node is handed.
#[derive(Clone, Default)]
pub struct StoreWrap {
    pub payment: Option<PaymentWrap>,
    pub rail: Option<RailWrap>,
    pub lock: Option<LockWrap>,
    /// The store fault plan the wrappers consult, when they are [`StoreWrap::planned`]: the
    /// world keeps it ([`World::store_plan`]) so a schedule can drive it.
    pub plan: Option<Arc<StoreFaultPlan>>,
}

impl StoreWrap {
    /// paydb (both the payment-resource's and the proxies' view) and lockdb (either backend)
    /// behind `plan`'s fault layer; the world's own handles stay unwrapped (ground truth).
    pub fn planned(plan: Arc<StoreFaultPlan>) -> StoreWrap {
        use crate::store_faults::{PlannedLockStore, PlannedPaymentStore, PlannedRailStore};
        let (p, r, l) = (plan.clone(), plan.clone(), plan.clone());
        StoreWrap {
            payment: Some(Arc::new(move |_: &str, inner| Arc::new(PlannedPaymentStore { inner, plan: p.clone() }))),
            rail: Some(Arc::new(move |_: &str, inner| Arc::new(PlannedRailStore { inner, plan: r.clone() }))),
            lock: Some(Arc::new(move |_: &str, inner| Arc::new(PlannedLockStore { inner, plan: l.clone() }))),
            plan: Some(plan),
        }
    }
}

/// Everything a world is built from.
#[derive(Clone)]
pub struct WorldSpec {
    pub topology: Topology,
    pub backend: LockBackend,
    /// C5 keys for every service and executor (see [`layers`]); executors also get
    /// `executor.owner-id` and `executor.concurrency` from the topology.
    pub settings: Vec<(String, String)>,
    /// Each node's clock skew in ms, by node name (absent: 0).
    pub skew_ms: BTreeMap<String, i64>,
    pub wrap: StoreWrap,
    /// C5 keys for one executor only, over `settings`, by node name (`executor-N`).
    pub node_settings: BTreeMap<String, Vec<(String, String)>>,
}

impl Default for WorldSpec {
    fn default() -> Self {
        WorldSpec {
            topology: Topology::default(),
            backend: LockBackend::Mem,
            settings: Vec::new(),
            skew_ms: BTreeMap::new(),
            wrap: StoreWrap::default(),
            node_settings: BTreeMap::new(),
        }
    }
}

/// The clock skews of [`WorldSpec::skewed`]: `lock-1` ahead, `proxy-1` behind, `payment-1`
/// ahead (ms).
pub const SKEWED_LOCK_MS: i64 = 300;
pub const SKEWED_PROXY_MS: i64 = -1_500;
pub const SKEWED_PAYMENT_MS: i64 = 900;

impl WorldSpec {
    /// Preset: one replica of each service, no executors, the simulation lockdb, and the
    /// service clocks apart: `lock-1` [`SKEWED_LOCK_MS`], `proxy-1` [`SKEWED_PROXY_MS`],
    /// `payment-1` [`SKEWED_PAYMENT_MS`], `rail-stub` 0. What the hand-written whole-cluster
    /// tests start ([`start`]).
    pub fn skewed() -> WorldSpec {
        WorldSpec::default()
            .skew("lock-1", SKEWED_LOCK_MS)
            .skew("proxy-1", SKEWED_PROXY_MS)
            .skew("payment-1", SKEWED_PAYMENT_MS)
            .skew("rail-stub", 0)
    }

    /// Preset: the proxy world of the proxy scenarios: `rail-stub` and one rail-proxy
    /// (`proxy-1`, which a schedule may also call `rail-proxy`) over paydb; no lock server,
    /// no payment-resource, no executors (a revoke is refused).
    pub fn proxy_only() -> WorldSpec {
        let topology = Topology {
            lock_replicas: 0,
            payment_replicas: 0,
            proxy_replicas: 1,
            executors: Vec::new(),
            reconciler: false,
        };
        WorldSpec { topology, ..WorldSpec::default() }
    }

    /// With `key = value` among the settings.
    pub fn with(mut self, key: &str, value: impl ToString) -> WorldSpec {
        self.settings.push((key.to_owned(), value.to_string()));
        self
    }

    /// With the node `name`'s clock `ms` ahead (behind when negative).
    pub fn skew(mut self, name: &str, ms: i64) -> WorldSpec {
        self.skew_ms.insert(name.to_owned(), ms);
        self
    }

    /// With the lock servers on `backend`.
    pub fn on(mut self, backend: LockBackend) -> WorldSpec {
        self.backend = backend;
        self
    }

    fn skew_of(&self, name: &str) -> i64 {
        self.skew_ms.get(name).copied().unwrap_or(0)
    }

    /// The layers every service resolves from: the settings over the world's defaults, the
    /// wiring of replica 1 (each replica's listen address is then set per node).
    fn layers(&self) -> Layers {
        let pairs: Vec<(&str, &str)> = self.settings.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        layers(&pairs)
    }
}

/// `base` with the listen and call addresses of one node set (replica `n` of a service).
fn layers_for(base: &Layers, key: &str, name: &str) -> Layers {
    let mut l = base.clone();
    if let Some(addr) = node_addr(name) {
        l.set_flag(key, addr);
    }
    l
}

/// `http://ip:port` of the node `name`.
fn http_of(name: &str) -> String {
    format!("http://{}", node_url(name).authority)
}

/// The lockdb a lock-server replica (`name`, its wall clock `skew_ms` ahead) opens at each
/// (re)start, on its node: on the simulation lockdb its replica view, which takes part in
/// lockdb's clock on the node's own monotonic clock (`MemLockStore::replica`).
async fn open_lock_store(backend: LockBackend, mem: Arc<MemLockStore>, name: &str, skew_ms: i64) -> Arc<dyn LockStore> {
    match backend {
        LockBackend::Mem => Arc::new(mem.replica(name, Clock::with_skew_ms(skew_ms))),
        LockBackend::Etcd => {
            let endpoints = vec![format!("http://{ETCD_ADDR}")];
            let store = dlock_rt::wait_until(Duration::from_millis(50), Duration::from_millis(ETCD_START_MS_MAX), || {
                let endpoints = endpoints.clone();
                async move { dlock_lock_server::store_etcd::EtcdLockStore::connect(&endpoints, "/dlock").await.ok() }
            })
            .await;
            match store {
                Some(s) => Arc::new(s),
                // Unreachable etcd: a lock server that cannot open its store; the node's
                // init fails loudly (a crash of the world, not a quiet hang).
                None => panic!("simulated etcd unreachable within {ETCD_START_MS_MAX} ms"),
            }
        }
    }
}

/// Executor `index` (1-based) of `spec`: its settings, replicas chosen by index
/// ([`Topology::replica_for`]), owner `executor-N`, the drawn concurrency.
pub fn executor_spec_config(spec: &WorldSpec, index: usize, concurrency: usize) -> Result<ExecutorConfig, String> {
    let t = &spec.topology;
    let mut l = spec.layers();
    let name = format!("executor-{index}");
    l.set_flag("executor.owner-id", &name);
    l.set_flag("executor.concurrency", concurrency);
    // Cut 6: each executor prefers its share of the accounts (index 0-based).
    l.set_flag("executor.affinity-index", index.saturating_sub(1));
    l.set_flag("executor.affinity-count", t.executors.len().max(1));
    l.set_flag("executor.listen", node_addr(&name).ok_or("executor index outside the table")?);
    l.set_flag("executor.lock-url", http_of(&format!("lock-{}", Topology::replica_for(index, t.lock_replicas))));
    l.set_flag(
        "executor.payment-url",
        http_of(&format!("payment-{}", Topology::replica_for(index, t.payment_replicas))),
    );
    l.set_flag("executor.proxy-url", http_of(&format!("proxy-{}", Topology::replica_for(index, t.proxy_replicas))));
    for (key, value) in spec.node_settings.get(&name).into_iter().flatten() {
        l.set_flag(key, value);
    }
    let profile = l.profile().map_err(|e| e.to_string())?;
    dlock_executor::config::resolve(&l, profile).map(|s| s.config).map_err(|e| e.to_string())
}

/// Builds `spec`'s world in the current madsim runtime: the databases (outside every node),
/// each service node through its crate's entry point (a restart re-runs that init: the
/// service comes back over the same database), the observer, the reconciler's node, and
/// the executors once the services have bound.
pub async fn build(spec: WorldSpec) -> Result<World, String> {
    spec.topology.check()?;
    let handle = madsim::runtime::Handle::current();
    let mut nodes = BTreeMap::new();
    if spec.backend == LockBackend::Etcd {
        let addr: SocketAddr = ETCD_ADDR.parse().map_err(|_| "etcd address")?;
        let etcd = handle
            .create_node()
            .name("etcd")
            .ip(addr.ip())
            .init(move || async move {
                if let Err(e) = etcd_client::SimServer::builder().serve(addr).await {
                    tracing::error!(cause = %e, "sim_etcd_serve_failed");
                }
            })
            .build();
        nodes.insert("etcd".to_owned(), etcd);
    }
    let locks = Arc::new(MemLockStore::judged(Clock::reference()));
    let lock_calls = Arc::new(CallSlot::default());
    let paydb = Arc::new(MemPaydb::new());
    let mut l = spec.layers();
    if l.get_opt::<u64>("rail.stub.seed").ok().flatten().is_none() {
        l.set_flag("rail.stub.seed", dlock_rt::rand::random_u64());
    }
    let t = spec.topology.clone();
    for i in 1..=t.lock_replicas {
        let name = format!("lock-{i}");
        let (mem, wrap, backend, n) = (locks.clone(), spec.wrap.lock.clone(), spec.backend, name.clone());
        let (slot, skew) = (lock_calls.clone(), spec.skew_of(&name));
        let node = lock_node(&name, &layers_for(&l, "lock.server.listen", &name), skew, move || {
            let (mem, wrap, n, slot) = (mem.clone(), wrap.clone(), n.clone(), slot.clone());
            async move {
                // Innermost, so the oracle sees what the store itself answered (a lost ack
                // the fault layer injects outside it is still a commit).
                let inner = open_lock_store(backend, mem, &n, skew).await;
                let store: Arc<dyn LockStore> = Arc::new(ObservedLockStore { inner, slot });
                match &wrap {
                    Some(w) => w(&n, store),
                    None => store,
                }
            }
        });
        nodes.insert(name, node);
    }
    nodes.insert("rail-stub".to_owned(), stub_node("rail-stub", &l, spec.skew_of("rail-stub")));
    for i in 1..=t.proxy_replicas {
        let name = format!("proxy-{i}");
        let raw: Arc<dyn RailStore> = paydb.clone();
        let store = match &spec.wrap.rail {
            Some(w) => w(&name, raw),
            None => raw,
        };
        let node = proxy_node(&name, &layers_for(&l, "rail.proxy.listen", &name), spec.skew_of(&name), store);
        nodes.insert(name, node);
    }
    for i in 1..=t.payment_replicas {
        let name = format!("payment-{i}");
        let raw: Arc<dyn PaymentStore> = paydb.clone();
        let store = match &spec.wrap.payment {
            Some(w) => w(&name, raw),
            None => raw,
        };
        let node = payment_node(&name, &layers_for(&l, "payment.resource.listen", &name), spec.skew_of(&name), store);
        nodes.insert(name, node);
    }
    let observer = handle.create_node().name("observer").ip(IpAddr::from(OBSERVER_IP)).build();
    nodes.insert("observer".to_owned(), observer.clone());
    if t.reconciler {
        let node = handle.create_node().name("reconciler").ip(IpAddr::from(RECONCILER_IP)).build();
        nodes.insert("reconciler".to_owned(), node);
    }
    dlock_rt::sleep(Duration::from_millis(BIND_SETTLE_MS)).await;
    let executors: ExecutorRegistry = Arc::new(Mutex::new(BTreeMap::new()));
    let calm = Arc::new(AtomicBool::new(false));
    for (k, concurrency) in t.executors.iter().enumerate() {
        let index = k + 1;
        let name = format!("executor-{index}");
        let cfg = executor_spec_config(&spec, index, *concurrency)?;
        let addr = node_addr(&name).ok_or("executor address")?;
        let (registry, skew, n, calm) = (executors.clone(), spec.skew_of(&name), name.clone(), calm.clone());
        let node = handle
            .create_node()
            .name(&name)
            .ip(addr.ip())
            .init(move || {
                let (mut cfg, registry, n) = (cfg.clone(), registry.clone(), n.clone());
                if calm.load(Ordering::SeqCst) {
                    cfg.pause_rate = 0.0;
                }
                async move {
                    run_service("executor", addr, |l| {
                        let (cfg, registry, n) = (cfg.clone(), registry.clone(), n.clone());
                        async move {
                            let h = dlock_executor::start(cfg, Clock::with_skew_ms(skew), l, std::future::pending())
                                .await?;
                            if let Ok(mut r) = registry.lock() {
                                r.insert(n, h.service.clone());
                            }
                            Ok(h)
                        }
                    })
                    .await
                }
            })
            .build();
        nodes.insert(name, node);
    }
    let faults = Faults::new();
    for (name, n) in &nodes {
        faults.name(name, n.id());
    }
    let node = |name: &str| nodes.get(name).cloned().ok_or_else(|| format!("node {name} missing"));
    Ok(World {
        paydb,
        locks,
        lock_calls,
        lock_node: nodes.get("lock-1").cloned(),
        payment_node: nodes.get("payment-1").cloned(),
        proxy_node: node("proxy-1")?,
        stub_node: node("rail-stub")?,
        observer,
        nodes,
        spec,
        executors,
        calm,
        faults,
        clients: ClientLog::default(),
    })
}

impl World {
    /// Every node's name, in name order (see [`node_addr`] for the table).
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.keys().cloned().collect()
    }

    /// The madsim id of the node `name` (for `Handle::pause`, `kill`, `restart`, and the
    /// network simulator's partitions and clogs).
    pub fn node_id(&self, name: &str) -> Option<madsim::task::NodeId> {
        self.nodes.get(name).map(|n| n.id())
    }

    /// The nodes whose clocks judge leases: every lock replica, on either backend. On etcd
    /// each judges by its own monotonic clock (C1 §1.5.4); on the simulation lockdb one at a
    /// time advances lockdb's clock by its own (C1 §1.4.2).
    pub fn lock_judges(&self) -> Vec<madsim::task::NodeId> {
        self.nodes.iter().filter(|(name, _)| name.starts_with("lock-")).map(|(_, n)| n.id()).collect()
    }

    /// How early in true time lockdb may end a lease: one tick's advance of lockdb's clock
    /// on the simulation lockdb (C1 §1.4.2), none on etcd (each replica judges on its own
    /// monotonic clock, C1 §1.5.4).
    pub fn lock_clock_slack_ms(&self) -> u64 {
        match self.spec.backend {
            LockBackend::Mem => dlock_lock_server::lockdb_clock::CLOCK_ADVANCE_MS_MAX,
            LockBackend::Etcd => 0,
        }
    }

    /// The node `name`'s handle.
    pub fn node(&self, name: &str) -> Option<&madsim::runtime::NodeHandle> {
        self.nodes.get(name)
    }

    /// The spec the world was built from.
    pub fn spec(&self) -> &WorldSpec {
        &self.spec
    }

    /// The running executors by node name (an executor being restarted is absent until its
    /// init has run again; a killed one keeps its last entry).
    pub fn executors(&self) -> BTreeMap<String, Arc<Executor>> {
        self.executors.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Kills the node `name` (its memory is lost; the databases are not). False if unknown.
    pub fn kill(&self, name: &str) -> bool {
        self.node_id(name).map(|id| madsim::runtime::Handle::current().kill(id)).is_some()
    }

    /// Restarts the node `name`: kills it and re-runs its init (the service starts again
    /// through its entry point, over the same database). False if unknown.
    ///
    /// A kill first: madsim 0.2's `restart` alone does not reset the node's sockets, so the
    /// old listener would keep the port and the restarted service could not be reached.
    pub fn restart(&self, name: &str) -> bool {
        let Some(id) = self.node_id(name) else { return false };
        let handle = madsim::runtime::Handle::current();
        handle.kill(id);
        handle.restart(id);
        true
    }

    /// The liveness phase's heal for the executors' own chaos: every executor restarts (through
    /// its entry point) without its injected stalls (`executor.chaos.pause-rate = 0`), as
    /// will every later restart. A restart is a crash of the process: whatever it held is
    /// recovered the production way (leases lapse, the orphan sweep, re-claims).
    pub fn heal_executors(&self) {
        self.calm.store(true, Ordering::SeqCst);
        let stalled = self
            .spec
            .settings
            .iter()
            .chain(self.spec.node_settings.values().flatten())
            .any(|(k, v)| k == "executor.chaos.pause-rate" && v.parse::<f64>().is_ok_and(|r| r > 0.0));
        if stalled {
            for name in self.nodes.keys().filter(|n| n.starts_with("executor-")) {
                self.restart(name);
            }
        }
    }

    /// Freezes the node `name` (no task of it runs) until [`World::resume`].
    pub fn pause(&self, name: &str) -> bool {
        self.node_id(name).map(|id| madsim::runtime::Handle::current().pause(id)).is_some()
    }

    pub fn resume(&self, name: &str) -> bool {
        self.node_id(name).map(|id| madsim::runtime::Handle::current().resume(id)).is_some()
    }

    /// The rail's full record (`GET /calls`), read from the observer node; empty when the
    /// stub cannot be read.
    pub async fn rail_call_log(&self) -> dlock_contract::rail::RailCallLog {
        self.read_rail_call_log().await.unwrap_or_default()
    }

    /// The rail's full record (`GET /calls`), read from the observer node; `None` when the
    /// stub cannot be read (no answer, or not its log).
    pub async fn read_rail_call_log(&self) -> Option<dlock_contract::rail::RailCallLog> {
        self.observer
            .spawn(async {
                let r = HttpClient::new(1_000, 5_000)
                    .send(&url(STUB_IP, STUB_PORT), http::Method::GET, "/calls", &[], None)
                    .await
                    .ok()?;
                serde_json::from_slice(&r.body).ok()
            })
            .await
            .ok()
            .flatten()
    }

    /// The reconciler, run once on the `reconciler` node (the observer when the topology has
    /// none) over the unwrapped paydb and the rail's record read over the network.
    pub async fn reconcile(&self) -> dlock_reconciler::Report {
        let node = self.nodes.get("reconciler").unwrap_or(&self.observer);
        let paydb = self.paydb.clone();
        node.spawn(async move {
            let budget = dlock_reconciler::budget::ReadBudget::default();
            let rail = dlock_reconciler::rail::HttpRailRecord::new(url(STUB_IP, STUB_PORT), &budget);
            let source = dlock_reconciler::Paydb { store: paydb, describe: "simulation paydb".into() };
            let params = dlock_reconciler::Params { budget, ..dlock_reconciler::Params::at(Clock::system().wall()) };
            dlock_reconciler::reconcile(&source, &rail, &params).await
        })
        .await
        .expect("the reconciler's node runs")
    }
}

impl World {
    /// Adds a node named `name` (an address from the table of [`node_addr`], no init) to the
    /// world, e.g. `workload` or `operator`; returns it (an existing one if already added).
    ///
    /// # Panics
    /// When `name` is not in the table (node names are fixed).
    /// Kills every node of the world (services, executors, the etcd, the harness's nodes),
    /// which drops their tasks. A madsim runtime that is dropped does not cancel the tasks
    /// still pending on its nodes, and a task holding anything that reaches its own node
    /// (a service's `Arc`s, a node handle) keeps the whole world alive: a campaign that did
    /// not end its worlds this way grew by megabytes per seed.
    pub fn shutdown(self) {
        let h = madsim::runtime::Handle::current();
        for node in self.nodes.values() {
            h.kill(node.id());
        }
        h.kill(self.observer.id());
    }

    pub fn add_node(&mut self, name: &str) -> madsim::runtime::NodeHandle {
        if let Some(n) = self.nodes.get(name) {
            return n.clone();
        }
        let addr = node_addr(name).unwrap_or_else(|| panic!("no simulated node named {name}"));
        let node = madsim::runtime::Handle::current().create_node().name(name).ip(addr.ip()).build();
        self.faults.name(name, node.id());
        self.nodes.insert(name.to_owned(), node.clone());
        node
    }
}

// ---------------------------------------------------------------------------------------
// The world as a schedule's stage.
// ---------------------------------------------------------------------------------------

/// Nodes a fault schedule never touches: the harness's own (`observer` reads the rail's
/// record, `workload` must be able to finish creating payouts, `operator` revokes and
/// resolves, `reconciler` is the liveness check's), and the simulated `etcd` (its data lives
/// in its process: a kill would lose lockdb; its trouble is the leader loss instead).
pub const UNFAULTABLE_NODES: &[&str] = &["observer", "workload", "operator", "forger", "watcher", "reconciler", "etcd"];

impl World {
    /// The fault layer over this world's nodes.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// The store fault plan in front of paydb and lockdb, when the world was built with
    /// [`StoreWrap::planned`].
    pub fn store_plan(&self) -> Option<&Arc<StoreFaultPlan>> {
        self.spec.wrap.plan.as_ref()
    }

    /// The nodes a schedule may fault, in name order: the service nodes and the executors
    /// (never [`UNFAULTABLE_NODES`]).
    pub fn fault_targets(&self) -> Vec<String> {
        self.nodes.keys().filter(|n| !UNFAULTABLE_NODES.contains(&n.as_str())).cloned().collect()
    }

    /// Heals every fault a schedule can leave behind (the liveness phase's "heal
    /// everything"): partitions, clogs, lossy links and pauses ([`Faults::heal_all`]), the
    /// store plan, an etcd leader loss, every node's clock (rate and wall offset), and every
    /// node killed and not started again is restarted through its init. Returns one trace
    /// line per node restarted.
    pub fn heal_all(&self) -> Vec<String> {
        use crate::faults::FaultKind;
        self.faults.heal_all();
        if let Some(plan) = self.store_plan() {
            plan.heal();
        }
        let handle = madsim::runtime::Handle::current();
        if let Some(etcd) = self.node_id("etcd") {
            handle.resume(etcd);
            madsim::net::NetSim::current().unclog_node(etcd);
        }
        for id in self.nodes.values().map(|n| n.id()) {
            crate::faults::clock::reset(id);
        }
        // A node whose last process fault was a kill is down: start it again.
        let mut down: BTreeMap<madsim::task::NodeId, bool> = BTreeMap::new();
        for r in self.faults.record() {
            match r.kind {
                FaultKind::Kill => r.a.iter().for_each(|id| {
                    down.insert(*id, true);
                }),
                FaultKind::Restart => r.a.iter().for_each(|id| {
                    down.insert(*id, false);
                }),
                _ => {}
            }
        }
        let mut lines = Vec::new();
        for (id, is_down) in down {
            if is_down {
                self.faults.restart(id);
                lines.push(format!("heal: restarted {}", self.faults.name_of(id)));
            }
        }
        lines
    }

    /// A key some executor holds now on the simulation lockdb (`payout:acct-N`), if any.
    async fn held_key(&self) -> Option<String> {
        for a in 0..crate::swarm::ACCOUNTS_MAX {
            let key = format!("payout:acct-{a}");
            if let Ok(Some(info)) = LockStore::info(self.locks.as_ref(), &key, 0).await {
                if info.grant.is_some() {
                    return Some(key);
                }
            }
        }
        None
    }
}

impl crate::schedule::Stage for World {
    /// The node `name`, unless it is one of [`UNFAULTABLE_NODES`]; `rail-proxy` (the proxy
    /// scenarios' name) is `proxy-1`.
    fn node(&self, name: &str) -> Option<madsim::task::NodeId> {
        if UNFAULTABLE_NODES.contains(&name) {
            return None;
        }
        self.node_id(if name == "rail-proxy" { "proxy-1" } else { name })
    }
    fn faults(&self) -> &Faults {
        &self.faults
    }
    fn store_plan(&self) -> Option<&StoreFaultPlan> {
        self.spec.wrap.plan.as_deref()
    }
    fn etcd(&self) -> Option<madsim::task::NodeId> {
        (self.spec.backend == LockBackend::Etcd).then(|| self.node_id("etcd")).flatten()
    }
    /// An operator revoke over L8 (the operator's own path, from node `operator`, or the
    /// observer when the world has no operator), at a random lock replica; without a key,
    /// a key held now (on the etcd backend, `payout:acct-0`).
    fn revoke<'a>(
        &'a self,
        key: Option<&'a str>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<String, String>> + Send + 'a>> {
        Box::pin(async move {
            if self.spec.topology.lock_replicas == 0 {
                return Err("the proxy world has no lock server".to_owned());
            }
            let key = match key {
                Some(k) => k.to_owned(),
                None if self.spec.backend == LockBackend::Etcd => "payout:acct-0".to_owned(),
                None => self.held_key().await.ok_or("no key is held")?,
            };
            let replicas = self.spec.topology.lock_replicas.max(1);
            let replica = (dlock_rt::rand::random_u64() % replicas as u64) as usize + 1;
            let node = self.nodes.get("operator").unwrap_or(&self.observer);
            let k = key.clone();
            let status = node
                .spawn(async move { crate::workload::revoke(replica, &k).await })
                .await
                .map_err(|e| e.to_string())?;
            Ok(format!("revoke {key} at lock-{replica} -> {status}"))
        })
    }
    /// The scripted lock client `client` (a node added with [`World::add_node`]) runs
    /// [`scripted_acquire`] on its node at lock replica [`Topology::replica_for`] its index.
    fn acquire<'a>(
        &'a self,
        client: &'a str,
        key: &'a str,
        wait_ms: u64,
        hold_ms: u64,
        session_ttl_ms: Option<u64>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<String, String>> + Send + 'a>> {
        Box::pin(async move {
            let node = self.nodes.get(client).ok_or_else(|| format!("no scripted client node {client:?}"))?;
            let index: usize = client
                .strip_prefix("client-")
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| format!("{client:?} is not client-N"))?;
            let replica = Topology::replica_for(index, self.spec.topology.lock_replicas);
            let script =
                Script { client: client.to_owned(), replica, key: key.to_owned(), wait_ms, hold_ms, session_ttl_ms };
            node.spawn(scripted_acquire(script, self.clients.clone()));
            Ok(format!("{client} acquires {key} at lock-{replica} (wait {wait_ms} ms, hold {hold_ms} ms)"))
        })
    }
    /// Polls the world's ground truth every [`TRIGGER_POLL_MS`] until `trigger` happened:
    /// `lease-granted` a grant of an account key lives (lockdb; on etcd, L7 at `lock-1`),
    /// `rail-call` the rail logged a call since the wait began (with the rail's latency it
    /// is then in flight), `intent-written` paydb holds an intent row written since the
    /// wait began, `waiter-queued` some lock replica's `lock_waiters` gauge is above zero.
    fn wait_for(&self, trigger: crate::schedule::Trigger) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        use crate::schedule::Trigger;
        Box::pin(async move {
            let intents = || self.paydb.with_tables(|t| t.rail.submissions.len()).unwrap_or(0);
            let calls_before = if trigger == Trigger::RailCall { self.rail_calls().await.len() } else { 0 };
            let intents_before = intents();
            loop {
                let hit = match trigger {
                    Trigger::LeaseGranted => self.lease_held().await,
                    Trigger::RailCall => self.rail_calls().await.len() > calls_before,
                    Trigger::IntentWritten => intents() > intents_before,
                    Trigger::WaiterQueued => self.waiters().await > 0.0,
                };
                if hit {
                    return;
                }
                madsim::time::sleep(std::time::Duration::from_millis(TRIGGER_POLL_MS)).await;
            }
        })
    }
}

/// How often [`World`]'s `wait_for` looks at the ground truth.
pub const TRIGGER_POLL_MS: u64 = 20;
/// How much longer than its hold a scripted client's lease is (it never renews).
pub const SCRIPTED_LEASE_SLACK_MS: u64 = 5_000;
/// How much longer than its server-side wait a scripted client reads its acquire's answer.
pub const SCRIPTED_READ_SLACK_MS: u64 = 5_000;

/// One `acquire` step of a scripted lock client.
#[derive(Debug, Clone)]
struct Script {
    client: String,
    replica: usize,
    key: String,
    wait_ms: u64,
    hold_ms: u64,
    session_ttl_ms: Option<u64>,
}

/// A scripted lock client, on its own node: opens a session (its TTL, else the client's
/// default), acquires the key waiting up to `wait_ms` in the server's queue (one attempt,
/// read budget above the wait), holds a grant for `hold_ms` (the lease outlasts the hold:
/// no renew), releases it and closes the session. Each step is one line of `log`:
/// `client-2: session <id>`, `client-2: granted <key> token=N session=<id> after N ms`,
/// `client-2: refused <key> CODE after N ms`, `client-2: released <key> token=N`.
async fn scripted_acquire(s: Script, log: ClientLog) {
    use dlock_lock_client::{AcquireOptions, LockClient, LockClientConfig, LockClientError};
    let who = s.client.clone();
    let line = |what: String| format!("{who}: {what}");
    let Ok(owner) = dlock_contract::OwnerId::parse(&s.client) else {
        return log.push(line("owner id refused".into()));
    };
    let mut cfg = LockClientConfig::new(node_url(&format!("lock-{}", s.replica)), owner);
    if let Some(ttl) = s.session_ttl_ms {
        cfg.session_ttl_ms = ttl;
    }
    cfg.lock_ttl_ms =
        s.hold_ms.saturating_add(SCRIPTED_LEASE_SLACK_MS).min(dlock_contract::lock::LOCK_TTL_MS_MAX as u64);
    cfg.acquire_read_timeout_ms = s.wait_ms.saturating_add(SCRIPTED_READ_SLACK_MS);
    cfg.acquire_attempts_max = 1;
    let client = match LockClient::new(cfg) {
        Ok(c) => c,
        Err(e) => return log.push(line(format!("config refused: {e}"))),
    };
    let session = match client.open_session().await {
        Ok(s) => s,
        Err(e) => return log.push(line(format!("session refused: {e}"))),
    };
    log.push(line(format!("session {}", session.id())));
    let asked = crate::faults::now_ms();
    let options = AcquireOptions { ttl_ms: None, wait_ms: Some(s.wait_ms) };
    match session.acquire_with(&s.key, options).await {
        Ok(guard) => {
            let token = guard.token().get();
            let after = crate::faults::now_ms().saturating_sub(asked);
            log.push(line(format!("granted {} token={token} session={} after {after} ms", s.key, guard.session_id())));
            dlock_rt::sleep(Duration::from_millis(s.hold_ms)).await;
            let released = guard.release().await;
            log.push(line(format!("released {} token={token}: {released:?}", s.key)));
        }
        Err(e) => {
            let after = crate::faults::now_ms().saturating_sub(asked);
            let code = match &e {
                LockClientError::Server { code, .. } => code.as_str().to_owned(),
                other => other.to_string(),
            };
            log.push(line(format!("refused {} {code} after {after} ms", s.key)));
        }
    }
    let _ = session.close().await;
}

impl World {
    /// What the scripted lock clients did so far, one line each.
    pub fn client_log(&self) -> Vec<String> {
        self.clients.lines()
    }

    /// `GET path` on the node `name`'s service, from the observer: status and body (`None`
    /// when nothing answered).
    async fn observe(&self, name: &str, path: &str) -> Option<(u16, Vec<u8>)> {
        let (url, path) = (node_url(name), path.to_owned());
        self.observer
            .spawn(async move {
                HttpClient::new(300, 1_000)
                    .send(&url, http::Method::GET, &path, &[], None)
                    .await
                    .ok()
                    .map(|r| (r.status, r.body.to_vec()))
            })
            .await
            .ok()
            .flatten()
    }

    /// The value of the metric line `series` (`lock_acquire_total{outcome="not_leader"}`)
    /// at lock replica `replica`'s `/metrics`, when it answers.
    /// Asks for the series' family alone (`name[]`), so the answer stays as small as the
    /// exposition was before the latency histograms (and the schedule with it).
    pub async fn lock_metric(&self, replica: usize, series: &str) -> Option<f64> {
        let family = series.split('{').next().unwrap_or(series);
        let (status, body) = self.observe(&format!("lock-{replica}"), &format!("/metrics?name[]={family}")).await?;
        if status != 200 {
            return None;
        }
        let text = String::from_utf8_lossy(&body).into_owned();
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse::<f64>().ok()))
    }

    /// Requests queued in every lock replica's FIFO queues now (`lock_waiters`).
    pub async fn waiters(&self) -> f64 {
        let mut n = 0.0;
        for r in 1..=self.spec.topology.lock_replicas {
            n += self.lock_metric(r, "lock_waiters").await.unwrap_or(0.0);
        }
        n
    }

    /// Whether a grant of an account key lives now: lockdb's own rows on the simulation
    /// store; on etcd, L7 (`GET /v1/locks/{key}`) at `lock-1`.
    async fn lease_held(&self) -> bool {
        if self.spec.backend == LockBackend::Mem {
            return self.held_key().await.is_some();
        }
        for a in 0..crate::swarm::ACCOUNTS_MAX {
            if let Some((200, body)) = self.observe("lock-1", &format!("/v1/locks/payout:acct-{a}")).await {
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                if v["held"].as_bool() == Some(true) {
                    return true;
                }
            }
        }
        false
    }
}
