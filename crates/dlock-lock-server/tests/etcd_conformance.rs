//! Runs the lock store conformance suite against the etcd backend
//! (`dlock_lock_server::store_etcd`):
//! - on a real etcd, named by `DLOCK_TEST_ETCD_ENDPOINTS` (comma separated; `scripts/test.sh`
//!   starts Debian's etcd on loopback and exports it). Without it the tests FAIL: a missing
//!   etcd must never read as a pass. Each test uses a fresh random key prefix, so the cases
//!   share one etcd without seeing each other's records.
//! - under `--cfg madsim`, on madsim-etcd-client's simulated etcd server, one per test.

mod conformance;

use std::sync::Arc;

use dlock_lock_server::store::LockStore;
use dlock_lock_server::store_etcd::EtcdLockStore;

/// The environment variable naming the real etcd's client endpoints.
pub const ENDPOINTS_ENV: &str = "DLOCK_TEST_ETCD_ENDPOINTS";

fn fresh_prefix() -> String {
    format!("/dlock-test/{}", dlock_rt::rand::uuid_v4())
}

#[cfg(not(madsim))]
async fn etcd() -> (Arc<dyn LockStore>, ()) {
    let raw = std::env::var(ENDPOINTS_ENV).unwrap_or_default();
    let endpoints: Vec<String> = raw.split(',').map(str::trim).filter(|e| !e.is_empty()).map(str::to_owned).collect();
    assert!(
        !endpoints.is_empty(),
        "{ENDPOINTS_ENV} is not set: the etcd conformance suite needs a real etcd \
         (scripts/test.sh starts one; or run `etcd --data-dir $(mktemp -d) \
         --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
         --listen-peer-urls http://127.0.0.1:23800` and export {ENDPOINTS_ENV}=http://127.0.0.1:23790)"
    );
    let store = EtcdLockStore::connect(&endpoints, &fresh_prefix())
        .await
        .unwrap_or_else(|e| panic!("connect to etcd at {endpoints:?} ({ENDPOINTS_ENV}): {e}"));
    (Arc::new(store), ())
}

#[cfg(not(madsim))]
lock_store_conformance!(etcd_store, etcd());

/// A simulated etcd server on its own node; the store dials it from the test's node.
#[cfg(madsim)]
async fn sim_etcd() -> (Arc<dyn LockStore>, madsim::runtime::NodeHandle) {
    use dlock_rt::Duration;

    const ADDR: &str = "10.0.0.1:2379";
    const TEST_NODE_IP: &str = "10.0.0.2";
    let handle = madsim::runtime::Handle::current();
    // The test body (the conformance case) runs on the main node, which has no IP until
    // given one; the store dials etcd from there.
    madsim::net::NetSim::current().set_ip(madsim::plugin::node(), TEST_NODE_IP.parse().expect("test node ip"));
    let ip = ADDR.split(':').next().and_then(|ip| ip.parse().ok()).expect("server ip");
    let server = handle.create_node().name("etcd").ip(ip).build();
    server.spawn(async move {
        let addr = ADDR.parse().expect("server addr");
        etcd_client::SimServer::builder().serve(addr).await.expect("simulated etcd serves");
    });
    let endpoints = vec![format!("http://{ADDR}")];
    let store = dlock_rt::wait_until(Duration::from_millis(50), Duration::from_secs(5), || {
        let endpoints = endpoints.clone();
        async move { EtcdLockStore::connect(&endpoints, &fresh_prefix()).await.ok() }
    })
    .await
    .expect("the simulated etcd accepts connections");
    (Arc::new(store), server)
}

#[cfg(madsim)]
lock_store_conformance!(sim_etcd_store, sim_etcd());
