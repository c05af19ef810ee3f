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

/// The event outbox on etcd (C3-extensions E-20, `store_etcd` "Events"): the events of one
/// txn share its revision (`seq / EVENTS_PER_TXN_MAX`, which is the txn's token) and keep
/// their order (`seq % EVENTS_PER_TXN_MAX`).
async fn a_txns_events_share_its_revision_and_keep_their_order(store: Arc<dyn LockStore>) {
    use dlock_contract::stream::EventKind;
    use dlock_lock_server::store_etcd::EVENTS_PER_TXN_MAX;
    let width = EVENTS_PER_TXN_MAX as i64;
    let session = store.open_session(dlock_rt::rand::uuid_v4(), "owner-a", 60_000).await.expect("open");
    let sid = session.session_id;
    let g1 = store.acquire("k1", sid, 60_000, 0).await.expect("acquire").expect("granted");
    let g2 = store.acquire("k2", sid, 60_000, 0).await.expect("acquire").expect("granted");
    let head = store.read_events(0, 100).await.expect("read").head;
    let g3 = store.rotate("k1", sid, g1.fencing_token, 60_000, 0).await.expect("rotate").expect("rotated");
    let rotated = store.read_events(head, 100).await.expect("read");
    let shape: Vec<(EventKind, i64, i64, i64)> = rotated
        .events
        .iter()
        .map(|e| (e.kind, e.seq / width, e.seq % width, e.body["token"].as_i64().unwrap_or(0)))
        .collect();
    let rev = g3.fencing_token;
    assert_eq!(
        shape,
        [(EventKind::LockReleased, rev, 0, g1.fencing_token), (EventKind::LockGranted, rev, 1, g3.fencing_token)],
        "a rotate's two events, at its revision (its token), in order"
    );
    store.close_session(sid, 0).await.expect("close").expect("closed");
    let closed = store.read_events(rotated.head, 100).await.expect("read");
    let shape: Vec<(Option<&str>, i64)> =
        closed.events.iter().map(|e| (e.lock_key.as_deref(), e.seq % width)).collect();
    assert_eq!(shape, [(Some("k1"), 0), (Some("k2"), 1)], "a close's releases, by key, in one txn");
    assert_eq!(closed.events[0].seq / width, closed.events[1].seq / width, "one txn, one revision");
    assert!(closed.events[0].seq / width > rev, "a later txn, a later revision");
    assert_eq!(closed.events[1].body["token"].as_i64(), Some(g2.fencing_token));
}

#[cfg(not(madsim))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_store_a_txns_events_share_its_revision_and_keep_their_order() {
    let (store, _guard) = etcd().await;
    a_txns_events_share_its_revision_and_keep_their_order(store).await;
}

#[cfg(madsim)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_etcd_store_a_txns_events_share_its_revision_and_keep_their_order() {
    let (store, _server) = sim_etcd().await;
    a_txns_events_share_its_revision_and_keep_their_order(store).await;
}
