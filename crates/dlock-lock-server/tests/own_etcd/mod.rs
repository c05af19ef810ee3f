//! One etcd member of a test's own (Debian's `etcd-server`, which `scripts/test.sh`
//! installs) on free loopback ports, and a store connected to it: for the tests that stop,
//! restart or stall etcd, which the shared one must never see. Killed when dropped.

use std::process::{Child, Command, Stdio};

use dlock_lock_server::store::LockStore;
use dlock_lock_server::store_etcd::EtcdLockStore;
use dlock_rt::Duration;

/// Longest etcd may take to answer after it starts.
pub const ETCD_START_MS_MAX: u64 = 30_000;

/// A free loopback port (the kernel's pick, released at once).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// A running etcd member, killed when dropped.
pub struct Etcd {
    child: Child,
}

impl Etcd {
    /// Starts a one-member etcd on `dir`, serving clients on `client` and its peer URL on
    /// `peer` (start it again on the same three to restart it).
    pub fn start(dir: &std::path::Path, client: u16, peer: u16) -> Etcd {
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

/// A store on `endpoints` under `prefix`, once etcd answers a ping through it (bounded by
/// [`ETCD_START_MS_MAX`]).
pub async fn store(endpoints: &[String], prefix: &str) -> EtcdLockStore {
    let (endpoints, prefix) = (endpoints.to_vec(), prefix.to_owned());
    dlock_rt::wait_until(Duration::from_millis(100), Duration::from_millis(ETCD_START_MS_MAX), || {
        let (endpoints, prefix) = (endpoints.clone(), prefix.clone());
        async move {
            let s = EtcdLockStore::connect(&endpoints, &prefix).await.ok()?;
            s.ping().await.ok().map(|_| s)
        }
    })
    .await
    .expect("etcd answered")
}
