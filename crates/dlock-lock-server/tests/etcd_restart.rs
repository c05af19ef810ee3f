//! Tokens never go backwards across an etcd restart: the test runs its own etcd (Debian's
//! `etcd-server`, which `scripts/test.sh` installs) on free loopback ports, grants, stops
//! etcd, starts it again on the same data directory, and grants again.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it drives them over real sockets and bounds its own waits with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

use std::sync::Arc;

use dlock_lock_server::store::LockStore;
use uuid::Uuid;

mod own_etcd;
use own_etcd::{free_port, Etcd};

async fn connect(endpoint: &str) -> Arc<dyn LockStore> {
    Arc::new(own_etcd::store(&[endpoint.to_owned()], "/dlock-restart").await)
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
