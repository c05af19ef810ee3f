//! A heartbeat or a renew whose read stalls never shortens the session or the lease a newer
//! one extended meanwhile (docs/testing/bugs.md B22, found by the real run's lock-call
//! checker): on etcd a replica dates the version it writes by its own monotonic clock, and
//! the date must come after the read, never before it.
//!
//! Two replicas share one etcd (Debian's `etcd-server`, started here on free loopback
//! ports): `x` reaches it through a TCP relay this test can hold, `y` directly. With the
//! relay held, `x`'s extension (a heartbeat, or a renew) sends its read and waits; `y`
//! extends the same record and is answered; the relay lets go and `x`'s extension writes on
//! top of `y`'s version. Once the TTL has run since `x`'s extension began, but not since
//! `y`'s, `x` must still judge the record live: `y`'s answer promised it. Dated before its
//! read, `x`'s version ended the record at its own start plus the TTL.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it drives them over real sockets and bounds its own waits with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use dlock_lock_server::store::LockStore;
use dlock_lock_server::store_etcd::EtcdLockStore;
use dlock_rt::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod own_etcd;
use own_etcd::{free_port, Etcd};
/// The TTL of the record extended (the session's, or the lease's).
const TTL_MS: i64 = 3_000;
/// The session's TTL while its lease is under test: long, so only the lease can end.
const LONG_SESSION_TTL_MS: i64 = 60_000;
/// How long `x`'s extension stays held before `y` extends: what a version dated before the
/// read loses.
const HELD_BEFORE_Y_MS: u64 = 1_200;
/// Bound on waiting for the relay to hold `x`'s read.
const HOLD_SEEN_MS_MAX: u64 = 10_000;
/// Bytes the relay copies at once.
const RELAY_CHUNK_BYTES: usize = 16 * 1024;

/// A TCP relay to `target` that, while `held`, forwards nothing from its clients and counts
/// the chunks it holds back.
struct Relay {
    port: u16,
    held: Arc<AtomicBool>,
    holding: Arc<AtomicUsize>,
}

impl Relay {
    async fn start(target: String) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the relay");
        let port = listener.local_addr().expect("addr").port();
        let (held, holding) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let (h, n) = (held.clone(), holding.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&target).await else { continue };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let (h, n) = (h.clone(), n.clone());
                // Client to etcd, held back while `held`.
                tokio::spawn(async move {
                    let mut buf = vec![0u8; RELAY_CHUNK_BYTES];
                    while let Ok(read) = cr.read(&mut buf).await {
                        if read == 0 {
                            break;
                        }
                        if h.load(Ordering::SeqCst) {
                            n.fetch_add(1, Ordering::SeqCst);
                            while h.load(Ordering::SeqCst) {
                                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                            }
                        }
                        if sw.write_all(&buf[..read]).await.is_err() {
                            break;
                        }
                    }
                });
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                });
            }
        });
        Relay { port, held, holding }
    }
}

/// Two replicas on one etcd of the test's own: `x` through a relay, `y` directly.
struct Pair {
    _dir: dlock_testkit::TempDir,
    _etcd: Etcd,
    relay: Relay,
    x: Arc<EtcdLockStore>,
    y: Arc<EtcdLockStore>,
}

async fn pair(name: &str) -> Pair {
    let dir = dlock_testkit::TempDir::new(name);
    let (client, peer) = (free_port(), free_port());
    let etcd = Etcd::start(dir.path(), client, peer);
    let relay = Relay::start(format!("127.0.0.1:{client}")).await;
    let prefix = format!("/dlock-{name}");
    let x = Arc::new(own_etcd::store(&[format!("http://127.0.0.1:{}", relay.port)], &prefix).await);
    let y = Arc::new(own_etcd::store(&[format!("http://127.0.0.1:{client}")], &prefix).await);
    Pair { _dir: dir, _etcd: etcd, relay, x, y }
}

/// Plays the interleaving (module doc) with `extend`, one extension of the record under
/// test through the given replica. Answers what `x`'s next `extend` says once the TTL has
/// run since `x`'s stalled extension began but not since `y`'s, and how long after `y`'s
/// began that was (ms).
async fn stalled_then_judged<T, F, Fut>(p: &Pair, extend: F) -> (T, u128)
where
    F: Fn(Arc<EtcdLockStore>) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    p.relay.held.store(true, Ordering::SeqCst);
    let x_began = Instant::now();
    let stalled = tokio::spawn(extend(p.x.clone()));
    let seen = dlock_rt::wait_until(Duration::from_millis(5), Duration::from_millis(HOLD_SEEN_MS_MAX), || {
        let n = p.relay.holding.load(Ordering::SeqCst);
        async move { (n > 0).then_some(()) }
    })
    .await;
    assert!(seen.is_some(), "the relay never held x's read");
    // The held time must pass for the date of x's version to matter: a duration, not an event.
    tokio::time::sleep(std::time::Duration::from_millis(HELD_BEFORE_Y_MS)).await;
    let y_began = Instant::now();
    let _answered = extend(p.y.clone()).await;
    p.relay.held.store(false, Ordering::SeqCst);
    let _stalled = stalled.await.expect("x's extension task");
    let judge_at = x_began + std::time::Duration::from_millis(TTL_MS as u64 + 200);
    assert!(judge_at < y_began + std::time::Duration::from_millis(TTL_MS as u64), "the held time was too short");
    tokio::time::sleep_until(judge_at.into()).await;
    (extend(p.x.clone()).await, judge_at.duration_since(y_began).as_millis())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_whose_read_stalled_never_shortens_the_session_a_newer_heartbeat_extended() {
    let p = pair("etcd-stalled-heartbeat").await;
    let session = uuid::Uuid::from_u128(0xb22);
    p.x.open_session(session, "w-1", TTL_MS).await.expect("open through x");
    let (now, after_y) =
        stalled_then_judged(&p, |s| async move { s.heartbeat(session).await.map(|r| r.map(|_| ())) }).await;
    assert_eq!(
        now,
        Ok(Ok(())),
        "x judged the session dead {after_y} ms after y's answered heartbeat began (TTL {TTL_MS} ms)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renew_whose_read_stalled_never_shortens_the_lease_a_newer_renew_extended() {
    let p = pair("etcd-stalled-renew").await;
    let session = uuid::Uuid::from_u128(0xb22);
    p.x.open_session(session, "w-1", LONG_SESSION_TTL_MS).await.expect("open through x");
    let grant = p.x.acquire("k", session, TTL_MS, 0).await.expect("acquire").expect("granted");
    let token = grant.fencing_token;
    let (now, after_y) =
        stalled_then_judged(&p, |s| async move { s.renew("k", session, token, TTL_MS).await.map(|r| r.map(|_| ())) })
            .await;
    assert_eq!(
        now,
        Ok(Ok(())),
        "x judged the lease dead {after_y} ms after y's answered renew began (TTL {TTL_MS} ms)"
    );
}
