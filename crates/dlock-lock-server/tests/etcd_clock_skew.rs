//! No wall clock decides a lease on etcd (C1 §1.5.4 "Time", C3-extensions C-28): two
//! lock-server replicas on one real etcd, one's wall clock 20 s ahead of the other's (or
//! behind), judge every grant, session and lock-delay by durations on their own monotonic
//! clocks since they first saw each stored version. Each test measures on the test's own
//! monotonic clock (the "host time" of both replicas) and fails on the old rule, where a
//! replica compared its wall clock with a deadline another replica wrote with its own.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it bounds its own waits on real processes with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_lock_server::store::{AcquireRefusal, LockStore, SessionRefusal};
use dlock_lock_server::store_etcd::EtcdLockStore;
use dlock_rt::Clock;

/// The skew between the two replicas' wall clocks.
const SKEW_MS: i64 = 20_000;
/// How often a contender asks again.
const POLL: Duration = Duration::from_millis(25);
/// How long after a lease's end a contender on the other replica may still be refused: the
/// contender first sees the grant within one poll of asking, and judges it from then
/// (docs: "Time"), plus one poll and the machine's scheduling.
const TAKEOVER_SLACK: Duration = Duration::from_millis(1_500);

/// Two replicas over one fresh prefix of the test etcd: `a` on the host's wall clock, `b`
/// with its wall clock `b_skew_ms` away.
async fn replicas(b_skew_ms: i64) -> (Arc<dyn LockStore>, Arc<dyn LockStore>) {
    let raw = std::env::var("DLOCK_TEST_ETCD_ENDPOINTS")
        .expect("DLOCK_TEST_ETCD_ENDPOINTS is not set: run ./scripts/test.sh, which starts etcd");
    let endpoints: Vec<String> = raw.split(',').map(str::to_owned).collect();
    let prefix = format!("/dlock-skew-{}", uuid::Uuid::new_v4().simple());
    let a = EtcdLockStore::connect_with_clock(&endpoints, &prefix, Clock::system()).await.expect("replica a");
    let b = EtcdLockStore::connect_with_clock(&endpoints, &prefix, Clock::with_skew_ms(b_skew_ms)).await.expect("b");
    (Arc::new(a), Arc::new(b))
}

/// A grant of 2 s on the replica behind is not granted again through the one 20 s ahead
/// before its 2 s are over (by host time), and is taken over within the documented slack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_wall_clock_runs_ahead_takes_over_a_grant_only_after_its_lease() {
    const LEASE_MS: u64 = 2_000;
    let (a, b) = replicas(SKEW_MS).await;
    let holder = a.open_session(uuid::Uuid::new_v4(), "holder", 60_000).await.expect("open");
    let contender = b.open_session(uuid::Uuid::new_v4(), "contender", 60_000).await.expect("open");
    let sent = Instant::now();
    let g = a.acquire("k", holder.session_id, LEASE_MS as i64, 0).await.expect("acquire").expect("granted");
    let taken = loop {
        match b.acquire("k", contender.session_id, 60_000, 0).await.expect("acquire") {
            Ok(next) => break (next, sent.elapsed()),
            Err(AcquireRefusal::Contended { .. }) => {}
            Err(other) => panic!("the contender was refused otherwise: {other:?}"),
        }
        assert!(sent.elapsed() < Duration::from_millis(LEASE_MS) + TAKEOVER_SLACK, "no takeover within the slack");
        tokio::time::sleep(POLL).await;
    };
    assert!(
        taken.1 >= Duration::from_millis(LEASE_MS),
        "granted again after {:?}, inside the first grant's {LEASE_MS} ms lease (two live grants)",
        taken.1
    );
    assert!(taken.0.fencing_token > g.fencing_token);
}

/// A heartbeat accepted through the replica 20 s behind keeps the session live on the
/// replica that opened it: it is not judged expired there at the old deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_through_a_replica_whose_wall_clock_lags_keeps_the_session_live_everywhere() {
    const TTL_MS: u64 = 1_500;
    let (a, b) = replicas(-SKEW_MS).await;
    let s = a.open_session(uuid::Uuid::new_v4(), "worker", TTL_MS as i64).await.expect("open");
    let opened = Instant::now();
    tokio::time::sleep(Duration::from_millis(TTL_MS / 2)).await;
    let beat = Instant::now();
    b.heartbeat(s.session_id).await.expect("heartbeat").expect("the lagging replica accepts the heartbeat");
    // Past the first deadline, inside the one the heartbeat set (by host time).
    tokio::time::sleep((opened + Duration::from_millis(TTL_MS + 200)).saturating_duration_since(Instant::now())).await;
    let answer = a.heartbeat(s.session_id).await.expect("heartbeat");
    let asked = beat.elapsed();
    if asked < Duration::from_millis(TTL_MS) {
        assert!(answer.is_ok(), "a session heartbeat {asked:?} ago through the other replica: {answer:?}");
    }
    assert_ne!(answer.err(), Some(SessionRefusal::Unknown));
}

/// The lock-delay a lost grant imposes, recorded by the replica behind, holds on the
/// replica 20 s ahead for its whole time (by host time) after the lease ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delay_recorded_by_one_replica_lasts_its_time_on_another_whose_clock_runs_ahead() {
    const LEASE_MS: u64 = 300;
    const DELAY_MS: u64 = 1_500;
    let (a, b) = replicas(SKEW_MS).await;
    let holder = a.open_session(uuid::Uuid::new_v4(), "holder", 60_000).await.expect("open");
    let other = a.open_session(uuid::Uuid::new_v4(), "other", 60_000).await.expect("open");
    let contender = b.open_session(uuid::Uuid::new_v4(), "contender", 60_000).await.expect("open");
    let sent = Instant::now();
    a.acquire("k", holder.session_id, LEASE_MS as i64, DELAY_MS as i64).await.expect("acquire").expect("granted");
    // Replica a judges the lease lost and records the delay (its own acquire is refused by it).
    loop {
        match a.acquire("k", other.session_id, 60_000, DELAY_MS as i64).await.expect("acquire") {
            Err(AcquireRefusal::Delayed { .. }) => break,
            Err(AcquireRefusal::Contended { .. }) => {}
            other => panic!("replica a: {other:?}"),
        }
        assert!(sent.elapsed() < Duration::from_millis(LEASE_MS) + TAKEOVER_SLACK, "replica a never saw it lapse");
        tokio::time::sleep(POLL).await;
    }
    let granted_after = loop {
        match b.acquire("k", contender.session_id, 60_000, DELAY_MS as i64).await.expect("acquire") {
            Ok(_) => break sent.elapsed(),
            Err(AcquireRefusal::Delayed { .. } | AcquireRefusal::Contended { .. }) => {}
            Err(other) => panic!("replica b: {other:?}"),
        }
        let bound = Duration::from_millis(LEASE_MS + DELAY_MS) + 2 * TAKEOVER_SLACK;
        assert!(sent.elapsed() < bound, "the delay never ended on replica b");
        tokio::time::sleep(POLL).await;
    };
    assert!(
        granted_after >= Duration::from_millis(LEASE_MS + DELAY_MS),
        "granted {granted_after:?} after the grant: the {DELAY_MS} ms lock-delay after its {LEASE_MS} ms lease was cut short"
    );
}
