//! A whole cluster on madsim nodes: the lock server, the payment-resource, the rail-proxy
//! and the rail-stub, each on its own node and address. The payment-resource and the proxy
//! share one simulation paydb ([`MemPaydb`]) and the lock server keeps its simulation lockdb;
//! both stores live outside every node, as databases outlive processes: killing and
//! restarting a node loses its memory, never its database.
//!
//! Tests start executors (or hand-written workers) on nodes of their own, then judge the run
//! with [`violations`], which reads paydb and the rail's own record, never the answers.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use dlock_config::Layers;
use dlock_executor::{Executor, ExecutorConfig};
use dlock_lock_server::store::LockStore;
use dlock_lock_server::store_mem::MemLockStore;
use dlock_payment_resource::store::{is_system_account, Direction, PaymentStore};
use dlock_payment_resource::store_mem::MemPaydb;
use dlock_rail_proxy::store::RailStore;
use dlock_rt::http::{BaseUrl, HttpClient};
use dlock_rt::{Clock, Duration, ServiceHandle};
use serde_json::Value;
use tokio::net::TcpListener;

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
    BaseUrl { authority: SocketAddr::new(IpAddr::from(ip), port).to_string() }
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
    for (key, value) in wiring() {
        l.set_flag(key, value);
    }
    l
}

/// The knobs of a world: service settings by key and each node's clock skew.
#[derive(Debug, Clone)]
pub struct WorldConfig {
    /// C5 keys and values, resolved by each service's own resolver (see [`layers`]).
    pub settings: Vec<(String, String)>,
    pub lock_skew_ms: i64,
    pub proxy_skew_ms: i64,
    pub payment_skew_ms: i64,
    pub stub_skew_ms: i64,
}

impl Default for WorldConfig {
    fn default() -> Self {
        WorldConfig {
            settings: Vec::new(),
            lock_skew_ms: 300,
            proxy_skew_ms: -1_500,
            payment_skew_ms: 900,
            stub_skew_ms: 0,
        }
    }
}

impl WorldConfig {
    /// With `key = value` among the settings.
    pub fn with(mut self, key: &str, value: impl ToString) -> WorldConfig {
        self.settings.push((key.to_owned(), value.to_string()));
        self
    }

    fn layers(&self) -> Layers {
        let pairs: Vec<(&str, &str)> = self.settings.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        layers(&pairs)
    }
}

/// A running world.
pub struct World {
    pub paydb: Arc<MemPaydb>,
    pub locks: Arc<MemLockStore>,
    pub lock_node: madsim::runtime::NodeHandle,
    pub payment_node: madsim::runtime::NodeHandle,
    pub proxy_node: madsim::runtime::NodeHandle,
    pub stub_node: madsim::runtime::NodeHandle,
    /// A node outside the cluster, for reading the rail's record.
    observer: madsim::runtime::NodeHandle,
}

/// On the current node: binds `addr`, starts a service through `start` (a service crate's
/// entry point, background tasks included), and runs it until the node is killed.
pub async fn run_service<S, F, Fut>(name: &'static str, addr: SocketAddr, start: F)
where
    F: FnOnce(TcpListener) -> Fut,
    Fut: Future<Output = Result<ServiceHandle<S>, String>>,
{
    let listener = match dlock_rt::http::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(service = name, cause = %e, "sim_service_bind_failed");
            return;
        }
    };
    match start(listener).await {
        Ok(h) => h.stopped().await,
        Err(e) => tracing::error!(service = name, cause = %e, "sim_service_start_failed"),
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
    let s = dlock_lock_server::config::resolve(l, l.profile().expect("profile")).expect("lock-server settings");
    madsim::runtime::Handle::current()
        .create_node()
        .name("lock-server")
        .ip(s.listen.ip())
        .init(move || {
            let (cfg, listen, store) = (s.config.clone(), s.listen, store());
            async move {
                let store = store.await;
                run_service("lock-server", listen, |l| {
                    dlock_lock_server::start(cfg, store, Clock::with_skew_ms(skew_ms), l, std::future::pending())
                })
                .await
            }
        })
        .build()
}

/// The rail-stub on a new node named `rail-stub`, started with `dlock_rail_stub::start`.
/// Its chaos seed is drawn once from the runtime unless `rail.stub.seed` is set.
pub fn start_stub_node(l: &Layers, skew_ms: i64) -> madsim::runtime::NodeHandle {
    let s = dlock_rail_stub::config::resolve(l, l.profile().expect("profile")).expect("rail-stub settings");
    madsim::runtime::Handle::current()
        .create_node()
        .name("rail-stub")
        .ip(s.listen.ip())
        .init(move || {
            let (cfg, listen) = (s.config.clone(), s.listen);
            async move {
                run_service("rail-stub", listen, |l| {
                    dlock_rail_stub::start(cfg, Clock::with_skew_ms(skew_ms), l, std::future::pending())
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
    let s = dlock_rail_proxy::config::resolve(l, l.profile().expect("profile")).expect("rail-proxy settings");
    madsim::runtime::Handle::current()
        .create_node()
        .name("rail-proxy")
        .ip(s.listen.ip())
        .init(move || {
            let (cfg, listen, store) = (s.config.clone(), s.listen, store.clone());
            async move {
                run_service("rail-proxy", listen, |l| {
                    dlock_rail_proxy::start(cfg, store, Clock::with_skew_ms(skew_ms), l, std::future::pending())
                })
                .await
            }
        })
        .build()
}

/// The payment-resource on a new node named `payment-resource` over `store`, started with
/// `dlock_payment_resource::start` (its idempotency purger included).
pub fn start_payment_node(l: &Layers, skew_ms: i64, store: Arc<dyn PaymentStore>) -> madsim::runtime::NodeHandle {
    let s = dlock_payment_resource::config::resolve(l, l.profile().expect("profile")).expect("payment settings");
    madsim::runtime::Handle::current()
        .create_node()
        .name("payment-resource")
        .ip(s.listen.ip())
        .init(move || {
            let (cfg, listen, store) = (s.config.clone(), s.listen, store.clone());
            async move {
                run_service("payment-resource", listen, |l| {
                    dlock_payment_resource::start(cfg, store, Clock::with_skew_ms(skew_ms), l, std::future::pending())
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
    node.spawn(async move {
        run_service("executor", addr, |l| async move {
            let h = dlock_executor::start(cfg, Clock::with_skew_ms(skew_ms), l, std::future::pending()).await?;
            let _ = tx.send(h.service.clone());
            Ok(h)
        })
        .await
    });
    let executor = rx.await.expect("the executor started");
    (node, executor)
}

/// Starts the four service nodes (the stub seeded from the runtime) and waits for them to bind.
pub async fn start(cfg: WorldConfig) -> World {
    let locks = Arc::new(MemLockStore::new(Clock::system()));
    let paydb = Arc::new(MemPaydb::new());
    let mut l = cfg.layers();
    if l.get_opt::<u64>("rail.stub.seed").ok().flatten().is_none() {
        l.set_flag("rail.stub.seed", dlock_rt::rand::random_u64());
    }
    let lock_store = locks.clone();
    let lock_node = start_lock_node(&l, cfg.lock_skew_ms, move || {
        let store: Arc<dyn LockStore> = lock_store.clone();
        async move { store }
    });
    let stub_node = start_stub_node(&l, cfg.stub_skew_ms);
    let proxy_node = start_proxy_node(&l, cfg.proxy_skew_ms, paydb.clone());
    let payment_node = start_payment_node(&l, cfg.payment_skew_ms, paydb.clone());
    let observer =
        madsim::runtime::Handle::current().create_node().name("observer").ip(IpAddr::from(OBSERVER_IP)).build();
    dlock_rt::sleep(Duration::from_millis(BIND_SETTLE_MS)).await;
    World { paydb, locks, lock_node, payment_node, proxy_node, stub_node, observer }
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

/// What the checkers find in paydb and at the rail: a CUSTOMER balance that is not its
/// ledger sum, a negative available balance, debits that are not credits, and a payout the
/// rail saw more than once. One line each; empty when the run is clean.
pub async fn violations(paydb: &MemPaydb, rail_calls: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    match PaymentStore::accounts(paydb).await {
        Ok(accounts) => {
            for a in accounts.iter().filter(|a| !is_system_account(&a.account_id)) {
                if a.balance_minor != a.ledger_sum_minor {
                    found.push(format!(
                        "{}: balance {} != ledger sum {}",
                        a.account_id, a.balance_minor, a.ledger_sum_minor
                    ));
                }
                if a.balance_minor - a.reserved_minor < 0 {
                    found.push(format!("{}: available {} < 0", a.account_id, a.balance_minor - a.reserved_minor));
                }
            }
        }
        Err(e) => found.push(format!("accounts unreadable: {e}")),
    }
    match PaymentStore::ledger(paydb, None).await {
        Ok(ledger) => {
            let side = |d: Direction| ledger.iter().filter(|e| e.direction == d).map(|e| e.amount_minor).sum::<i64>();
            if side(Direction::Debit) != side(Direction::Credit) {
                found.push(format!("debits {} != credits {}", side(Direction::Debit), side(Direction::Credit)));
            }
        }
        Err(e) => found.push(format!("ledger unreadable: {e}")),
    }
    let mut sorted = rail_calls.to_vec();
    sorted.sort();
    for w in sorted.windows(2) {
        if w[0] == w[1] {
            found.push(format!("payout {} reached the rail twice", w[0]));
        }
    }
    found.dedup();
    found
}
