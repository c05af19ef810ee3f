//! Tokens never go backwards across an etcd restart: the test runs its own etcd (Debian's
//! `etcd-server`, which `scripts/test.sh` installs) on free loopback ports, grants, stops
//! etcd, starts it again on the same data directory, and grants again.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it drives them over real sockets and bounds its own waits with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use dlock_lock_server::store::LockStore;
use dlock_lock_server::store_etcd::EtcdLockStore;
use dlock_rt::Duration;
use uuid::Uuid;

/// Longest etcd may take to answer after it starts.
const ETCD_START_MS_MAX: u64 = 30_000;

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

struct Etcd {
    child: Child,
}

impl Etcd {
    fn start(dir: &std::path::Path, client: u16, peer: u16) -> Etcd {
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .args(["--data-dir", &dir.display().to_string()])
            .args(["--name", "default"])
            .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("default={peer_url}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd: is Debian's etcd-server installed? ./scripts/test.sh installs it");
        Etcd { child }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn connect(endpoint: &str) -> Arc<dyn LockStore> {
    let endpoints = vec![endpoint.to_owned()];
    let store = dlock_rt::wait_until(Duration::from_millis(100), Duration::from_millis(ETCD_START_MS_MAX), || {
        let endpoints = endpoints.clone();
        async move {
            let s = EtcdLockStore::connect(&endpoints, "/dlock-restart").await.ok()?;
            s.ping().await.ok().map(|_| s)
        }
    })
    .await
    .expect("etcd answered");
    Arc::new(store)
}

async fn grant(store: &Arc<dyn LockStore>, key: &str) -> i64 {
    let s = store.open_session(Uuid::new_v4(), "w", 30_000).await.expect("session");
    store.acquire(key, s.session_id, 30_000, 0).await.expect("acquire").expect("granted").fencing_token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_tokens_survive_an_etcd_restart() {
    let dir = dlock_testkit::TempDir::new("etcd-restart");
    let (client, peer) = (free_port(), free_port());
    let endpoint = format!("http://127.0.0.1:{client}");
    let mut last = 0;
    {
        let _etcd = Etcd::start(dir.path(), client, peer);
        let store = connect(&endpoint).await;
        for i in 0..5 {
            last = grant(&store, &format!("k{i}")).await;
        }
        let floor = store
            .revoke("k0", "ops", "restart test revoke", None, Uuid::new_v4())
            .await
            .expect("revoke")
            .expect("revoked")
            .new_token_floor;
        assert!(floor > last);
        last = floor;
    }
    let _etcd = Etcd::start(dir.path(), client, peer);
    let store = connect(&endpoint).await;
    let next = grant(&store, "after-restart").await;
    assert!(next > last, "token {next} issued at or below {last} after etcd restarted");
}
