//! One etcd endpoint down does not fail the lock server's requests (found by the local
//! fault run, docs/testing/bugs.md B5, deploy/local/README.md "What the real run showed"): the
//! store is given a live etcd (Debian's `etcd-server`, started here on free loopback
//! ports) and an endpoint where nothing listens. etcd-client's balanced channel keeps the
//! dead endpoint "ready" and hands it about half of the requests, each refused at connect;
//! the store sends a refused txn again (`CONNECT_REFUSED_TRIES_MAX`), so nearly every
//! request succeeds. Without the retry about half of them fail.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it drives them over real sockets and bounds its own waits with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

use dlock_lock_server::store::LockStore;

mod own_etcd;
use own_etcd::{free_port, Etcd};
/// Requests sent while one of the two endpoints is down.
const PINGS: usize = 200;
/// Most of them that may fail: each fails only if all its tries land on the dead endpoint
/// (about 2^-8 each); without the retry about half fail.
const FAILED_PINGS_MAX: usize = 10;

#[tokio::test]
async fn a_refused_etcd_endpoint_among_live_ones_does_not_fail_the_requests() {
    let dir = dlock_testkit::TempDir::new("etcd-member-down");
    let (client, peer, dead) = (free_port(), free_port(), free_port());
    let _etcd = Etcd::start(dir.path(), client, peer);
    let endpoints = vec![format!("http://127.0.0.1:{client}"), format!("http://127.0.0.1:{dead}")];
    let store = own_etcd::store(&endpoints, "/dlock-member-down").await;
    let mut failed = Vec::new();
    for _ in 0..PINGS {
        if let Err(e) = store.ping().await {
            failed.push(e.to_string());
        }
    }
    assert!(
        failed.len() <= FAILED_PINGS_MAX,
        "{} of {PINGS} requests failed with one endpoint down, e.g. {:?}",
        failed.len(),
        failed.first()
    );
}
