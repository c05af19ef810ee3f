//! The whole point, in a seeded world: a worker holding the lock is paused (a GC pause, a
//! stalled VM) past its lease; a newer worker takes the lock with a larger token and pays;
//! the paused worker wakes, its client already knows the lease is gone, and even if it
//! writes anyway the rail-proxy fences it out. An operator revoke does the same to a live
//! holder. The world is `world::build`'s one-of-each world (`WorldSpec::default()`: lock
//! server, rail-proxy, rail-stub and payment-resource on their own madsim nodes); the lock
//! server's backend is either the simulation lockdb or madsim-etcd-client's simulated etcd on
//! its own node (the etcd backend's code, unchanged); paydb is the simulation paydb. Both
//! outlive every service node.

#![cfg(madsim)]

use std::net::{IpAddr, SocketAddr};

use dlock_contract::payout::PayoutState;
use dlock_contract::OwnerId;
use dlock_lock_client::{LockClient, LockClientConfig};
use dlock_rail_proxy::store::{NewPayout, RailStore};
use dlock_rt::http::{BaseUrl, HttpClient};
use dlock_rt::{Clock, Duration};
use dlock_sim::world::{self, LockBackend, World, WorldSpec};
use serde_json::{json, Value};
use uuid::Uuid;

use dlock_sim::world::{LOCK_IP, PROXY_IP};

const ACCOUNT: &str = "acct-1";
/// Lease of every grant in these tests.
const LEASE_MS: u64 = 3_000;
/// How long the zombie is frozen: well past its lease and its session.
const PAUSE_MS: u64 = 12_000;
/// The lock server's clock runs ahead of true time, the rail-stub's behind.
const LOCK_SKEW_MS: i64 = 700;
const STUB_SKEW_MS: i64 = -4_000;

fn url(ip: [u8; 4], port: u16) -> BaseUrl {
    BaseUrl::plain(SocketAddr::new(IpAddr::from(ip), port).to_string())
}

/// The one-of-each world ([`WorldSpec::default`]) with its lock server on `backend` and the
/// lock and stub clocks apart, and `n` CLAIMED payouts of [`ACCOUNT`] in its paydb.
async fn world(n: usize, backend: LockBackend) -> (World, Vec<Uuid>) {
    let spec = WorldSpec::default().on(backend).skew("lock-1", LOCK_SKEW_MS).skew("rail-stub", STUB_SKEW_MS);
    let w = world::start(spec).await;
    let mut payouts = Vec::new();
    for i in 0..n {
        let id = dlock_rt::rand::uuid_v4();
        let p = NewPayout {
            payout_id: id,
            account_id: ACCOUNT.into(),
            amount_minor: 100 + i as i64,
            currency: "EUR".into(),
            beneficiary_ref: "b".into(),
            state: PayoutState::Claimed,
        };
        RailStore::insert_payout(&*w.paydb, &p, Clock::system().wall()).await.expect("seed payout");
        payouts.push(id);
    }
    (w, payouts)
}

fn lock_client(owner: &str) -> LockClient {
    let mut cfg = LockClientConfig::new(url(LOCK_IP, 8081), OwnerId::parse(owner).expect("owner"));
    cfg.session_ttl_ms = LEASE_MS;
    cfg.lock_ttl_ms = LEASE_MS;
    LockClient::new(cfg).expect("client config")
}

/// `POST /v1/rail/submissions` through the rail client; the answer's status and code (or
/// outcome).
async fn submit(payout: Uuid, amount_minor: i64, token: i64, owner: &str) -> (u16, String) {
    let mut cfg = dlock_rail_client::RailClientConfig::new(url(PROXY_IP, 8083));
    cfg.read_timeout_ms = 20_000;
    let client = dlock_rail_client::RailClient::new(cfg).expect("rail client");
    let body = dlock_contract::rail::SubmissionRequest {
        payout_id: payout,
        account_id: ACCOUNT.into(),
        amount_minor,
        currency: "EUR".into(),
        beneficiary_ref: "b".into(),
    };
    let token = dlock_sim::world::signed(ACCOUNT, token, owner);
    let key = dlock_contract::IdempotencyKey::parse(&format!("payout:{payout}")).expect("key");
    match client.submit(token, &OwnerId::parse(owner).expect("owner"), &key, &body).await {
        Ok(ack) => (200, ack.outcome.as_str().to_owned()),
        Err(dlock_rail_client::RailRefusal::Refused { status, envelope }) => {
            (status, envelope.code.as_str().to_owned())
        }
        Err(dlock_rail_client::RailRefusal::Unreadable { status, .. }) => (status, "?".to_owned()),
        Err(e) => panic!("proxy answered: {e}"),
    }
}

#[madsim::test]
async fn a_worker_paused_past_its_lease_is_fenced_out_at_the_rail() {
    paused_worker_is_fenced_out(LockBackend::Mem).await
}

#[madsim::test]
async fn a_worker_paused_past_its_lease_is_fenced_out_at_the_rail_on_simulated_etcd() {
    paused_worker_is_fenced_out(LockBackend::Etcd).await
}

async fn paused_worker_is_fenced_out(backend: LockBackend) {
    let seed = madsim::runtime::Handle::current().seed();
    eprintln!("dlock-sim seed={seed} backend={backend:?}");
    let handle = madsim::runtime::Handle::current();
    let (w, payouts) = world(2, backend).await;
    let (p1, p2) = (payouts[0], payouts[1]);

    // Worker A takes the lock, then freezes before it submits.
    let zombie = handle.create_node().name("worker-a").ip(IpAddr::from([10, 0, 0, 10])).build();
    let (acquired_tx, acquired_rx) = tokio::sync::oneshot::channel::<i64>();
    let a = zombie.spawn(async move {
        let session = lock_client("worker-a").open_session().await.expect("session");
        let guard = session.acquire("payout:acct-1").await.expect("grant");
        let _ = acquired_tx.send(guard.token().get());
        // The critical section: this sleep is where the pause lands.
        dlock_rt::sleep(Duration::from_millis(200)).await;
        let held_at_wake = guard.is_held();
        // A buggy worker writes anyway; the fence must stop it.
        let answer = submit(p1, 100, guard.token().get(), "worker-a").await;
        (guard.token().get(), held_at_wake, answer)
    });
    let token_a = acquired_rx.await.expect("worker A acquired");
    handle.pause(zombie.id());

    // Worker B waits out A's lease, takes the lock with a larger token, and pays.
    let worker_b = handle.create_node().name("worker-b").ip(IpAddr::from([10, 0, 0, 11])).build();
    let b = worker_b.spawn(async move {
        let session = lock_client("worker-b").open_session().await.expect("session");
        let guard = dlock_rt::wait_until(Duration::from_millis(250), Duration::from_millis(PAUSE_MS), || {
            let session = &session;
            async move { session.acquire("payout:acct-1").await.ok() }
        })
        .await
        .expect("worker B got the lock once A's lease lapsed");
        let answer = submit(p2, 101, guard.token().get(), "worker-b").await;
        (guard.token().get(), answer)
    });
    let (token_b, answer_b) = b.await.expect("worker B");
    assert!(token_b > token_a, "B's token {token_b} must exceed A's {token_a}");
    assert_eq!(answer_b, (200, "ACKED".to_owned()));

    dlock_rt::sleep(Duration::from_millis(PAUSE_MS)).await;
    handle.resume(zombie.id());
    let (_, held_at_wake, answer_a) = a.await.expect("worker A");
    assert!(!held_at_wake, "A's client still believed it held the lock after a {PAUSE_MS} ms pause");
    assert_eq!(answer_a, (409, "FENCED_OUT".to_owned()), "the zombie's write was not fenced");
    assert_eq!(w.rail_calls().await, [p2.to_string()], "only B's payout may reach the rail");
    assert_eq!(RailStore::high_water(&*w.paydb, ACCOUNT).await.expect("mark"), Some(token_b));
}

#[madsim::test]
async fn a_revoked_holder_is_fenced_out_by_the_next_holder() {
    revoked_holder_is_fenced_out(LockBackend::Mem).await
}

#[madsim::test]
async fn a_revoked_holder_is_fenced_out_by_the_next_holder_on_simulated_etcd() {
    revoked_holder_is_fenced_out(LockBackend::Etcd).await
}

async fn revoked_holder_is_fenced_out(backend: LockBackend) {
    let seed = madsim::runtime::Handle::current().seed();
    eprintln!("dlock-sim seed={seed} backend={backend:?}");
    let handle = madsim::runtime::Handle::current();
    let (w, payouts) = world(2, backend).await;
    let (p1, p2) = (payouts[0], payouts[1]);
    let ops = handle.create_node().name("ops").ip(IpAddr::from([10, 0, 0, 20])).build();
    let outcome = ops
        .spawn(async move {
            let c = lock_client("worker-c").open_session().await.expect("session");
            let held = c.acquire("payout:acct-1").await.expect("grant");
            let token_c = held.token().get();
            // An operator evicts C without its cooperation.
            let body =
                json!({ "operator": "alice", "reason": "holder stuck on a dead rail", "expectedToken": token_c });
            let r = HttpClient::new(1_000, 5_000)
                .send(
                    &url(LOCK_IP, 8081),
                    http::Method::POST,
                    "/v1/locks/payout:acct-1/revoke",
                    &[("content-type", "application/json"), ("x-owner-id", "alice")],
                    Some(body.to_string().into()),
                )
                .await
                .expect("revoke answered");
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            let floor =
                serde_json::from_slice::<Value>(&r.body).expect("json")["newTokenFloor"].as_i64().expect("floor");
            let d = lock_client("worker-d").open_session().await.expect("session");
            let next = d.acquire("payout:acct-1").await.expect("grant after revoke");
            let token_d = next.token().get();
            let paid = submit(p2, 101, token_d, "worker-d").await;
            let stale = submit(p1, 100, token_c, "worker-c").await;
            (token_c, floor, token_d, paid, stale)
        })
        .await
        .expect("ops");
    let (token_c, floor, token_d, paid, stale) = outcome;
    assert!(floor > token_c && token_d > floor, "tokens {token_c} < floor {floor} < {token_d} must hold");
    assert_eq!(paid, (200, "ACKED".to_owned()));
    assert_eq!(stale, (409, "FENCED_OUT".to_owned()));
    assert_eq!(w.rail_calls().await, [p2.to_string()]);
}
