//! A whole cluster on madsim nodes: the lock server, the payment-resource, the rail-proxy
//! and the rail-stub, each on its own node and address. The payment-resource and the proxy
//! share one simulation paydb ([`MemPaydb`]) and the lock server keeps its simulation lockdb;
//! both stores live outside every node, as databases outlive processes: killing and
//! restarting a node loses its memory, never its database.
//!
//! Tests start executors (or hand-written workers) on nodes of their own, then judge the run
//! with [`violations`], which reads paydb and the rail's own record, never the answers.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use dlock_lock_server::service::{LockServer, LockServerConfig};
use dlock_lock_server::store_mem::MemLockStore;
use dlock_payment_resource::store::{is_system_account, Direction, PaymentStore};
use dlock_payment_resource::store_mem::MemPaydb;
use dlock_payment_resource::{PaymentConfig, PaymentResource};
use dlock_rail_proxy::service::ProxyConfig;
use dlock_rail_proxy::store::RailStore;
use dlock_rail_proxy::RailProxy;
use dlock_rail_stub::{RailStub, StubConfig};
use dlock_rt::http::{BaseUrl, HttpClient};
use dlock_rt::{Clock, Duration};
use serde_json::Value;

pub const LOCK_IP: [u8; 4] = [10, 0, 1, 1];
pub const STUB_IP: [u8; 4] = [10, 0, 0, 1];
pub const PROXY_IP: [u8; 4] = [10, 0, 0, 2];
pub const PAYMENT_IP: [u8; 4] = [10, 0, 0, 4];
pub const LOCK_PORT: u16 = 8081;
pub const PAYMENT_PORT: u16 = 8082;
pub const PROXY_PORT: u16 = 8083;
pub const STUB_PORT: u16 = 8084;
/// An address no service uses, for reading the rail's record from outside every node.
pub const OBSERVER_IP: [u8; 4] = [10, 0, 9, 9];
/// How long the nodes get to bind before anyone calls them.
pub const BIND_SETTLE_MS: u64 = 100;

/// `http://ip:port`.
pub fn url(ip: [u8; 4], port: u16) -> BaseUrl {
    BaseUrl { authority: SocketAddr::new(IpAddr::from(ip), port).to_string() }
}

/// The knobs of a world: the rail's chaos and each node's clock skew.
#[derive(Debug, Clone)]
pub struct WorldConfig {
    pub stub: StubConfig,
    pub lock_skew_ms: i64,
    pub proxy_skew_ms: i64,
    pub payment_skew_ms: i64,
    pub stub_skew_ms: i64,
    /// The proxy's read timeout towards the rail.
    pub rail_read_timeout_ms: u64,
}

impl Default for WorldConfig {
    fn default() -> Self {
        WorldConfig {
            stub: StubConfig::default(),
            lock_skew_ms: 300,
            proxy_skew_ms: -1_500,
            payment_skew_ms: 900,
            stub_skew_ms: 0,
            rail_read_timeout_ms: 8_000,
        }
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

/// Starts the four service nodes (the stub seeded from the runtime) and waits for them to bind.
pub async fn start(cfg: WorldConfig) -> World {
    let handle = madsim::runtime::Handle::current();
    let locks = Arc::new(MemLockStore::new(Clock::system()));
    let paydb = Arc::new(MemPaydb::new());

    let lock_store = locks.clone();
    let lock_skew = cfg.lock_skew_ms;
    let lock_node = handle
        .create_node()
        .name("lock-server")
        .ip(IpAddr::from(LOCK_IP))
        .init(move || {
            let store = lock_store.clone();
            async move {
                let cfg = LockServerConfig { reap_interval_ms: 200, ..LockServerConfig::default() };
                let server = LockServer::new(store, cfg, Clock::with_skew_ms(lock_skew));
                let _reaper = dlock_rt::spawn(server.clone().run_reaper());
                if let Ok(l) = dlock_rt::http::bind(SocketAddr::new(IpAddr::from(LOCK_IP), LOCK_PORT)).await {
                    dlock_rt::http::serve(l, dlock_lock_server::app::router(server), std::future::pending()).await;
                }
            }
        })
        .build();

    let stub_cfg = StubConfig { seed: dlock_rt::rand::random_u64(), ..cfg.stub.clone() };
    let stub_skew = cfg.stub_skew_ms;
    let stub_node = handle
        .create_node()
        .name("rail-stub")
        .ip(IpAddr::from(STUB_IP))
        .init(move || {
            let stub_cfg = stub_cfg.clone();
            async move {
                let stub = RailStub::new(stub_cfg, Clock::with_skew_ms(stub_skew));
                if let Ok(l) = dlock_rt::http::bind(SocketAddr::new(IpAddr::from(STUB_IP), STUB_PORT)).await {
                    dlock_rt::http::serve(l, dlock_rail_stub::router(stub), std::future::pending()).await;
                }
            }
        })
        .build();

    let proxy_store: Arc<dyn RailStore> = paydb.clone();
    let (proxy_skew, rail_read_timeout_ms) = (cfg.proxy_skew_ms, cfg.rail_read_timeout_ms);
    let proxy_node = handle
        .create_node()
        .name("rail-proxy")
        .ip(IpAddr::from(PROXY_IP))
        .init(move || {
            let store = proxy_store.clone();
            async move {
                let cfg = ProxyConfig {
                    rail_url: url(STUB_IP, STUB_PORT),
                    connect_timeout_ms: 1_000,
                    read_timeout_ms: rail_read_timeout_ms,
                    fencing_enabled: true,
                    duplicate_guard_enabled: true,
                    body_bytes_max: 65_536,
                };
                let proxy = RailProxy::new(store, cfg, Clock::with_skew_ms(proxy_skew));
                if let Ok(l) = dlock_rt::http::bind(SocketAddr::new(IpAddr::from(PROXY_IP), PROXY_PORT)).await {
                    dlock_rt::http::serve(l, dlock_rail_proxy::router(proxy), std::future::pending()).await;
                }
            }
        })
        .build();

    let payment_store: Arc<dyn PaymentStore> = paydb.clone();
    let payment_skew = cfg.payment_skew_ms;
    let payment_node = handle
        .create_node()
        .name("payment-resource")
        .ip(IpAddr::from(PAYMENT_IP))
        .init(move || {
            let store = payment_store.clone();
            async move {
                let Ok(pr) =
                    PaymentResource::start(store, PaymentConfig::default(), Clock::with_skew_ms(payment_skew)).await
                else {
                    return;
                };
                let _purger = dlock_rt::spawn(pr.clone().run_purger());
                if let Ok(l) = dlock_rt::http::bind(SocketAddr::new(IpAddr::from(PAYMENT_IP), PAYMENT_PORT)).await {
                    dlock_rt::http::serve(l, dlock_payment_resource::router(pr), std::future::pending()).await;
                }
            }
        })
        .build();
    let observer = handle.create_node().name("observer").ip(IpAddr::from(OBSERVER_IP)).build();
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
