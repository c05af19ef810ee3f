//! A heartbeat whose read stalls never shortens the session a newer heartbeat extended
//! meanwhile (docs/testing/bugs.md B22, found by the real run's lock-call checker): on etcd a
//! replica dates the version it writes by its own monotonic clock, and the date must come
//! after the read, never before it.
//!
//! Two replicas share one etcd (Debian's `etcd-server`, started here on free loopback
//! ports): `x` reaches it through a TCP relay this test can hold, `y` directly. `x` opens a
//! session; with the relay held, `x`'s heartbeat sends its read and waits; `y` heartbeats the
//! same session and is answered; the relay lets go and `x`'s heartbeat writes on top of
//! `y`'s version. Once the session's TTL has run since `x`'s heartbeat began, but not since
//! `y`'s, `x` must still judge the session live: `y`'s answer promised it. Dated before its
//! read, `x`'s version ended the session at its own start plus the TTL.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it drives them over real sockets and bounds its own waits with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use dlock_lock_server::store::LockStore;
use dlock_rt::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod own_etcd;
use own_etcd::{free_port, Etcd};
/// The session's TTL.
const TTL_MS: i64 = 3_000;
/// How long `x`'s heartbeat stays held before `y` heartbeats: what a version dated before
/// the read loses.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_whose_read_stalled_never_shortens_the_session_a_newer_heartbeat_extended() {
    let dir = dlock_testkit::TempDir::new("etcd-stalled-heartbeat");
    let (client, peer) = (free_port(), free_port());
    let _etcd = Etcd::start(dir.path(), client, peer);
    let client_url = format!("http://127.0.0.1:{client}");
    let relay = Relay::start(format!("127.0.0.1:{client}")).await;
    let prefix = "/dlock-stalled-heartbeat";
    let x = Arc::new(own_etcd::store(&[format!("http://127.0.0.1:{}", relay.port)], prefix).await);
    let y = own_etcd::store(&[client_url], prefix).await;

    let session = uuid::Uuid::from_u128(0xb22);
    x.open_session(session, "w-1", TTL_MS).await.expect("open through x");
    // x's heartbeat: its read is held at the relay.
    relay.held.store(true, Ordering::SeqCst);
    let x_began = Instant::now();
    let stalled = {
        let x = x.clone();
        tokio::spawn(async move { x.heartbeat(session).await })
    };
    let seen = dlock_rt::wait_until(Duration::from_millis(5), Duration::from_millis(HOLD_SEEN_MS_MAX), || {
        let n = relay.holding.load(Ordering::SeqCst);
        async move { (n > 0).then_some(()) }
    })
    .await;
    assert!(seen.is_some(), "the relay never held x's read");
    // The held time must pass for the date of x's version to matter: a duration, not an event.
    tokio::time::sleep(std::time::Duration::from_millis(HELD_BEFORE_Y_MS)).await;
    let y_began = Instant::now();
    y.heartbeat(session).await.expect("y's heartbeat").expect("the session is live");
    relay.held.store(false, Ordering::SeqCst);
    stalled.await.expect("x's heartbeat task").expect("x's heartbeat").expect("the session is live for x");

    // The TTL has run since x's heartbeat began, not since y's: y's answer promised the
    // session until y_began + TTL, so x must judge it live now.
    let judge_at = x_began + std::time::Duration::from_millis(TTL_MS as u64 + 200);
    assert!(judge_at < y_began + std::time::Duration::from_millis(TTL_MS as u64), "the held time was too short");
    tokio::time::sleep_until(judge_at.into()).await;
    let now = x.heartbeat(session).await.expect("x's last heartbeat");
    assert!(
        now.is_ok(),
        "x judged the session dead {} ms after y's answered heartbeat began (TTL {TTL_MS} ms): {now:?}",
        judge_at.duration_since(y_began).as_millis()
    );
}
