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

use std::process::{Child, Command, Stdio};

use dlock_lock_server::store::LockStore;
use dlock_lock_server::store_etcd::EtcdLockStore;
use dlock_rt::Duration;

/// Longest etcd may take to answer after it starts.
const ETCD_START_MS_MAX: u64 = 30_000;
/// Requests sent while one of the two endpoints is down.
const PINGS: usize = 200;
/// Most of them that may fail: each fails only if all its tries land on the dead endpoint
/// (about 2^-8 each); without the retry about half fail.
const FAILED_PINGS_MAX: usize = 10;

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

struct Etcd(Child);

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_refused_etcd_endpoint_among_live_ones_does_not_fail_the_requests() {
    let dir = std::env::temp_dir().join(format!("dlock-etcd-member-down-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (client, peer, dead) = (free_port(), free_port(), free_port());
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let _etcd = Etcd(
        Command::new("etcd")
            .args(["--data-dir", &dir.display().to_string()])
            .args(["--name", "default"])
            .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("default={peer_url}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd: is Debian's etcd-server installed? ./scripts/test.sh installs it"),
    );
    let endpoints = vec![client_url.clone(), format!("http://127.0.0.1:{dead}")];
    let store = dlock_rt::wait_until(Duration::from_millis(100), Duration::from_millis(ETCD_START_MS_MAX), || {
        let endpoints = endpoints.clone();
        async move {
            let s = EtcdLockStore::connect(&endpoints, "/dlock-member-down").await.ok()?;
            s.ping().await.ok().map(|_| s)
        }
    })
    .await
    .expect("etcd answered through the two endpoints");
    let mut failed = Vec::new();
    for _ in 0..PINGS {
        if let Err(e) = store.ping().await {
            failed.push(e.to_string());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        failed.len() <= FAILED_PINGS_MAX,
        "{} of {PINGS} requests failed with one endpoint down, e.g. {:?}",
        failed.len(),
        failed.first()
    );
}
