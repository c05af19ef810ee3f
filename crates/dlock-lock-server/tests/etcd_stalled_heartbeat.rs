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
//!
//! The same relay, holding etcd's answers to `x` instead, replays B23: an acquire that read
//! a session as lapsed must not remove its grant after a heartbeat through a replica that
//! still judged it live was answered.
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
/// A lease long enough that only a session can end it.
const LONG_LEASE_MS: i64 = 60_000;
/// Bytes of etcd's answer to an acquire's read (four records) the relay must hold before the
/// read is known to have been served: more than any HTTP/2 control frame.
const READ_ANSWER_BYTES_MIN: usize = 300;
/// Bound on waiting for the relay to hold `x`'s read.
const HOLD_SEEN_MS_MAX: u64 = 10_000;
/// Bytes the relay copies at once.
const RELAY_CHUNK_BYTES: usize = 16 * 1024;

/// A TCP relay to `target` that, while `held`, forwards nothing from its clients and counts
/// the chunks it holds back; while `answers_held`, forwards nothing from etcd and counts the
/// bytes it holds back.
struct Relay {
    port: u16,
    held: Arc<AtomicBool>,
    holding: Arc<AtomicUsize>,
    answers_held: Arc<AtomicBool>,
    answer_bytes_held: Arc<AtomicUsize>,
}

impl Relay {
    async fn start(target: String) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the relay");
        let port = listener.local_addr().expect("addr").port();
        let (held, holding) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let (answers_held, answer_bytes_held) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let (h, n) = (held.clone(), holding.clone());
        let (ah, an) = (answers_held.clone(), answer_bytes_held.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&target).await else { continue };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                // Client to etcd, held back while `held` (counting chunks); etcd to client,
                // while `answers_held` (counting bytes).
                tokio::spawn(forward(cr, sw, h.clone(), n.clone(), 1));
                tokio::spawn(forward(sr, cw, ah.clone(), an.clone(), 0));
            }
        });
        Relay { port, held, holding, answers_held, answer_bytes_held }
    }
}

/// Copies `from` to `to`; while `held`, keeps what arrives (reading on, so that everything
/// sent so far is counted) and sends it once let go, adding to `count` per chunk kept
/// (`per_chunk`), or its bytes when `per_chunk` is 0.
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    held: Arc<AtomicBool>,
    count: Arc<AtomicUsize>,
    per_chunk: usize,
) {
    let mut buf = vec![0u8; RELAY_CHUNK_BYTES];
    let mut kept: Vec<u8> = Vec::new();
    loop {
        let holding = held.load(Ordering::SeqCst);
        if !holding && !kept.is_empty() {
            if to.write_all(&kept).await.is_err() {
                break;
            }
            kept.clear();
        }
        let read = match tokio::time::timeout(std::time::Duration::from_millis(5), from.read(&mut buf)).await {
            Err(_) => continue,
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(read)) => read,
        };
        // Judged when the bytes arrived, not before the read began: a chunk that came after
        // `held` was set is kept, however long the read had been waiting (under load, a
        // read begun before the flag rose once let the answer it was meant to hold through).
        if held.load(Ordering::SeqCst) {
            count.fetch_add(if per_chunk == 0 { read } else { per_chunk }, Ordering::SeqCst);
            kept.extend_from_slice(&buf[..read]);
        } else if to.write_all(&buf[..read]).await.is_err() {
            break;
        }
    }
}

/// Two replicas on one etcd of the test's own: `x` through a relay, `y` directly.
struct Pair {
    _dir: dlock_testkit::TempDir,
    _etcd: Etcd,
    relay: Relay,
    x: Arc<EtcdLockStore>,
    y: Arc<EtcdLockStore>,
    /// etcd's own client URL, and the replicas' prefix: for a replica started later.
    direct: String,
    prefix: String,
}

async fn pair(name: &str) -> Pair {
    let dir = dlock_testkit::TempDir::new(name);
    let (client, peer) = (free_port(), free_port());
    let etcd = Etcd::start(dir.path(), client, peer);
    let relay = Relay::start(format!("127.0.0.1:{client}")).await;
    let prefix = format!("/dlock-{name}");
    let x = Arc::new(own_etcd::store(&[format!("http://127.0.0.1:{}", relay.port)], &prefix).await);
    let direct = format!("http://127.0.0.1:{client}");
    let y = Arc::new(own_etcd::store(std::slice::from_ref(&direct), &prefix).await);
    Pair { _dir: dir, _etcd: etcd, relay, x, y, direct, prefix }
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

/// docs/testing/bugs.md B23, found by the real run's lock-call checker: a replica judged a
/// grant's holder session lapsed on a read that a heartbeat through another replica (which
/// still judged it live, having first seen it later) outdated before the replica removed the
/// grant. The removal guarded the grant alone, so it committed, and the key went to another
/// session while the answered heartbeat had promised the holder its session, and the grant's
/// lease had most of its time left. Here `x` first sees the holder's session, the TTL runs,
/// `z` starts (and judges the session from its own first sight: live), and `x`'s acquire
/// reads the session as it was, its answer held until `z`'s heartbeat has been answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_is_never_taken_for_a_lapsed_session_that_an_answered_heartbeat_extended_meanwhile() {
    use dlock_lock_server::store::AcquireRefusal;
    let p = pair("etcd-stale-holder").await;
    let (holder, other) = (uuid::Uuid::from_u128(0xb23), uuid::Uuid::from_u128(0xb24));
    p.y.open_session(holder, "w-1", TTL_MS).await.expect("open the holder's session through y");
    p.y.acquire("k", holder, LONG_LEASE_MS, 0).await.expect("acquire through y").expect("granted");
    p.x.open_session(other, "w-2", LONG_SESSION_TTL_MS).await.expect("open through x");
    let first = p.x.acquire("k", other, LONG_LEASE_MS, 0).await.expect("x's first acquire");
    assert!(matches!(first, Err(AcquireRefusal::Contended { .. })), "{first:?}");
    // The TTL must run on x's clock since x first saw the session: a duration, not an event.
    let seen = Instant::now();
    tokio::time::sleep_until((seen + std::time::Duration::from_millis(TTL_MS as u64 + 200)).into()).await;
    let z = own_etcd::store(std::slice::from_ref(&p.direct), &p.prefix).await;
    p.relay.answers_held.store(true, Ordering::SeqCst);
    let before = p.relay.answer_bytes_held.load(Ordering::SeqCst);
    let taking = tokio::spawn({
        let x = p.x.clone();
        async move { x.acquire("k", other, LONG_LEASE_MS, 0).await }
    });
    let served = dlock_rt::wait_until(Duration::from_millis(5), Duration::from_millis(HOLD_SEEN_MS_MAX), || {
        let n = p.relay.answer_bytes_held.load(Ordering::SeqCst) - before;
        async move { (n >= READ_ANSWER_BYTES_MIN).then_some(()) }
    })
    .await;
    if served.is_none() {
        let bytes = p.relay.answer_bytes_held.load(Ordering::SeqCst) - before;
        let answer = if taking.is_finished() { format!("{:?}", taking.await) } else { "none yet".into() };
        panic!("the relay never held the answer to x's read ({bytes} bytes held; x's acquire answered {answer})");
    }
    let extended = z.heartbeat(holder).await.expect("z's heartbeat");
    assert!(extended.is_ok(), "z first saw the session just now, so it judges it live: {extended:?}");
    p.relay.answers_held.store(false, Ordering::SeqCst);
    let taken = taking.await.expect("x's acquire task").expect("x's acquire");
    assert!(
        matches!(taken, Err(AcquireRefusal::Contended { .. })),
        "x took the key from a session an answered heartbeat had just extended: {taken:?}"
    );
    let info = z.info("k", 0).await.expect("info").expect("the key is known");
    assert_eq!(info.grant.map(|g| g.session_id), Some(holder), "the grant stays the holder's");
}
