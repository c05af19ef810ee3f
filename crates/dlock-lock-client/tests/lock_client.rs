//! The lock client against a scripted fake lock server: retries, local deadlines, early
//! notice of loss, heartbeats, release. Every test is named after the behaviour it proves.

mod support;

use dlock_contract::ErrorCode;
use dlock_lock_client::{
    AcquireOptions, CloseOutcome, LeaseStatus, LockClient, LockClientConfig, LockClientError, LossReason, Operation,
    ReleaseOutcome, Session, SessionLoss,
};
use dlock_rt::{Clock, Duration};
use support::{refuse, slow, FakeLockServer, Op, Reply};

/// Poll interval of every "wait until" in these tests.
const POLL_MS: u64 = 10;
/// Longest any "wait until" in these tests waits.
const WAIT_MS_MAX: u64 = 3_000;

async fn open(server: &FakeLockServer, edit: impl FnOnce(&mut LockClientConfig)) -> (LockClient, Session) {
    let mut cfg = server.config();
    edit(&mut cfg);
    let client = LockClient::new(cfg).expect("valid config");
    let session = client.open_session().await.expect("session opens");
    (client, session)
}

async fn eventually<F: FnMut() -> bool>(mut cond: F) -> bool {
    dlock_rt::wait_until(Duration::from_millis(POLL_MS), Duration::from_millis(WAIT_MS_MAX), || {
        let v = cond();
        async move { v.then_some(()) }
    })
    .await
    .is_some()
}

fn retry_safe_codes_excluded() -> impl Iterator<Item = ErrorCode> {
    ErrorCode::ALL.into_iter().filter(|c| !c.retry_safe())
}

#[tokio::test]
async fn contended_acquire_backs_off_and_is_granted_on_a_later_attempt() {
    let server = FakeLockServer::start().await;
    server.script(Op::Acquire, [refuse(ErrorCode::LockContended), refuse(ErrorCode::LockContended)]);
    let (_client, session) = open(&server, |_| {}).await;

    let guard = session.acquire("payout:acct-1").await.expect("granted on the third attempt");

    assert!(guard.is_held());
    assert!(guard.token().get() > 0);
    let seen = server.seen(Op::Acquire);
    assert_eq!(seen.len(), 3);
    for pair in seen.windows(2) {
        let gap = pair[1].at.duration_since(pair[0].at);
        assert!(gap >= Duration::from_millis(50), "backoff of at least backoff_ms_min: {gap:?}");
    }
    assert!(seen.iter().all(|s| s.owner.as_deref() == Some("worker-1")), "every write carries X-Owner-Id");
    assert!(seen.iter().all(|s| s.body["sessionId"] == session.id().to_string()));
}

#[tokio::test]
async fn acquire_reports_contention_exceeded_after_five_attempts() {
    let server = FakeLockServer::start().await;
    server.set_default(Op::Acquire, refuse(ErrorCode::LockContended));
    let (_client, session) = open(&server, |_| {}).await;

    let err = session.acquire("payout:acct-1").await.expect_err("always contended");

    assert!(matches!(err, LockClientError::ContentionExceeded { attempts: 5, .. }), "{err:?}");
    assert_eq!(err.code(), Some(ErrorCode::ContentionExceeded));
    assert!(err.retry_safe());
    assert_eq!(server.count(Op::Acquire), 5);
}

#[tokio::test]
async fn not_leader_retry_after_is_waited_before_the_next_attempt() {
    let server = FakeLockServer::start().await;
    server.script(Op::Acquire, [Reply::Refuse(ErrorCode::NotLeader, Some(300))]);
    let (_client, session) = open(&server, |_| {}).await;

    session.acquire("payout:acct-1").await.expect("granted on the second attempt");

    let seen = server.seen(Op::Acquire);
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at.duration_since(seen[0].at);
    assert!(gap >= Duration::from_millis(300), "retryAfterMillis honoured: {gap:?}");
}

#[tokio::test]
async fn every_non_retry_safe_code_ends_an_acquire_after_one_request() {
    let server = FakeLockServer::start().await;
    let client = LockClient::new(server.config()).expect("valid config");
    for code in retry_safe_codes_excluded() {
        // A fresh session per code: the session codes end the session they answer.
        let session = client.open_session().await.expect("session opens");
        let before = server.count(Op::Acquire);
        server.script(Op::Acquire, [refuse(code)]);

        let err = session.acquire("payout:acct-1").await.expect_err("refused");

        assert_eq!(server.count(Op::Acquire), before + 1, "{code}: exactly one request");
        assert!(!err.retry_safe(), "{code}: {err:?}");
        match code {
            ErrorCode::Internal => assert!(matches!(err, LockClientError::Ambiguous { .. }), "{err:?}"),
            _ => assert_eq!(err.code(), Some(code)),
        }
    }
}

#[tokio::test]
async fn every_non_retry_safe_code_ends_a_renew_after_one_request_and_loses_the_grant() {
    let server = FakeLockServer::start().await;
    let client = LockClient::new(server.config()).expect("valid config");
    for code in retry_safe_codes_excluded() {
        let session = client.open_session().await.expect("session opens");
        let guard = session.acquire("payout:acct-1").await.expect("granted");
        let before = server.count(Op::Renew);
        server.script(Op::Renew, [refuse(code)]);

        let err = guard.renew().await.expect_err("refused");

        assert_eq!(server.count(Op::Renew), before + 1, "{code}: exactly one request");
        assert!(!err.retry_safe(), "{code}: {err:?}");
        assert_eq!(guard.status(), LeaseStatus::Lost(LossReason::RenewFailed), "{code}");
        let renew = server.seen(Op::Renew).pop().expect("seen");
        assert_eq!(renew.token, Some(guard.token().to_string()), "renew carries X-Fencing-Token");
    }
}

#[tokio::test]
async fn renew_is_retried_once_on_not_leader_then_the_grant_is_lost() {
    let server = FakeLockServer::start().await;
    server.set_default(Op::Renew, Reply::Refuse(ErrorCode::NotLeader, Some(10)));
    let (_client, session) = open(&server, |_| {}).await;
    let guard = session.acquire("payout:acct-1").await.expect("granted");

    let err = guard.renew().await.expect_err("never renewed");

    assert_eq!(server.count(Op::Renew), 2, "one try and one retry");
    assert_eq!(err.code(), Some(ErrorCode::NotLeader));
    assert!(!guard.is_held(), "a failed renew fails closed");
}

#[tokio::test]
async fn lease_is_lost_locally_when_its_deadline_passes_though_the_server_never_said_so() {
    let server = FakeLockServer::start().await;
    let (_client, session) = open(&server, |c| {
        c.lock_ttl_ms = 1_000;
        c.session_ttl_ms = 10_000;
    })
    .await;
    let guard = session.acquire("payout:acct-1").await.expect("granted");
    assert!(guard.remaining() <= Duration::from_millis(700), "{:?}", guard.remaining());
    assert!(guard.is_held());

    assert!(eventually(|| !guard.is_held()).await, "the local deadline passes");

    assert_eq!(guard.status(), LeaseStatus::Lost(LossReason::DeadlinePassed));
    assert_eq!(guard.remaining(), Duration::ZERO);
    assert!(session.is_alive(), "only the grant's own deadline passed");
    assert_eq!((server.count(Op::Renew), server.count(Op::Release)), (0, 0), "the server never said so");
    assert!(matches!(guard.renew().await, Err(LockClientError::LeaseLost { reason: LossReason::DeadlinePassed })));
    assert_eq!(server.count(Op::Renew), 0, "a lost lease is not renewed");
}

#[tokio::test]
async fn grant_remaining_leaves_the_sessions_deadline_out_and_remaining_takes_the_earlier() {
    // A 10 s lease (7 s local) in a 2 s session (1.4 s local): the session's deadline
    // comes first, which `remaining` says and `grant_remaining` does not.
    let server = FakeLockServer::start().await;
    let (_client, session) = open(&server, |c| {
        c.lock_ttl_ms = 10_000;
        c.session_ttl_ms = 2_000;
    })
    .await;
    let guard = session.acquire("payout:acct-1").await.expect("granted");
    assert!(guard.remaining() <= Duration::from_millis(1_400), "{:?}", guard.remaining());
    assert!(guard.grant_remaining() > Duration::from_millis(6_000), "{:?}", guard.grant_remaining());
    assert!(guard.grant_remaining() <= Duration::from_millis(7_000), "{:?}", guard.grant_remaining());

    guard.release().await.expect("released");
    let (_client, session) = open(&server, |c| c.lock_ttl_ms = 10_000).await;
    let guard = session.acquire("payout:acct-1").await.expect("granted");
    session.close().await.expect("closed");
    assert_eq!(guard.grant_remaining(), Duration::ZERO, "a grant whose session is lost has none left");
}

#[tokio::test]
async fn local_deadline_counts_from_the_acquire_send_instant_not_the_answer() {
    let server = FakeLockServer::start().await;
    server.script(Op::Acquire, [slow(400, Reply::Ok)]);
    let (_client, session) = open(&server, |c| c.lock_ttl_ms = 1_000).await;

    let guard = session.acquire("payout:acct-1").await.expect("granted, slowly");

    // 700 ms of local lease from the send, of which the slow answer used 400 ms.
    let remaining = guard.remaining();
    assert!(remaining <= Duration::from_millis(300), "{remaining:?}");
}

#[tokio::test]
async fn renew_moves_the_deadline_from_the_renew_send_instant() {
    let server = FakeLockServer::start().await;
    let (_client, session) = open(&server, |c| c.lock_ttl_ms = 2_000).await;
    let guard = session.acquire("payout:acct-1").await.expect("granted");
    assert!(eventually(|| guard.remaining() < Duration::from_millis(1_300)).await);
    server.script(Op::Renew, [slow(200, Reply::Ok)]);
    let before = guard.deadline().expect("held");

    guard.renew().await.expect("renewed");

    let after = guard.remaining();
    assert!(after <= Duration::from_millis(1_200), "1 400 ms from the send, 200 ms of it spent waiting: {after:?}");
    assert!(guard.deadline().expect("held") > before, "the renew moved the deadline");
    assert_eq!(server.seen(Op::Renew)[0].body["ttlMillis"], 2_000);
}

#[tokio::test]
async fn watch_flips_when_the_local_deadline_passes() {
    let server = FakeLockServer::start().await;
    let (_client, session) = open(&server, |c| c.lock_ttl_ms = 1_000).await;
    let guard = session.acquire("payout:acct-1").await.expect("granted");
    let mut notice = guard.watch();
    assert_eq!(*notice.borrow_and_update(), LeaseStatus::Held);
    let started = Clock::system().now();

    let flipped = dlock_rt::timeout(Duration::from_millis(WAIT_MS_MAX), notice.wait_for(|s| !s.is_held())).await;

    let status = flipped.expect("flips before the wait bound").map(|s| *s).expect("sender alive");
    assert_eq!(status, LeaseStatus::Lost(LossReason::DeadlinePassed));
    assert!(started.elapsed() < Duration::from_millis(WAIT_MS_MAX));
}

#[tokio::test]
async fn watch_flips_when_a_renew_fails() {
    let server = FakeLockServer::start().await;
    server.script(Op::Renew, [refuse(ErrorCode::LockLost)]);
    let (_client, session) = open(&server, |_| {}).await;
    let guard = session.acquire("payout:acct-1").await.expect("granted");
    let notice = guard.watch();

    let err = guard.renew().await.expect_err("lock lost");

    assert_eq!(err.code(), Some(ErrorCode::LockLost));
    assert!(notice.has_changed().expect("sender alive"));
    assert_eq!(*notice.borrow(), LeaseStatus::Lost(LossReason::RenewFailed));
}

#[tokio::test]
async fn heartbeats_keep_a_session_alive_and_stop_after_close() {
    let server = FakeLockServer::start().await;
    let (_client, session) = open(&server, |c| c.session_ttl_ms = 1_500).await;
    let opened = Clock::system().now();

    assert!(eventually(|| server.count(Op::Heartbeat) >= 3).await, "heartbeats every third of the TTL");

    assert!(opened.elapsed() > Duration::from_millis(1_050), "past the deadline an unbeaten session would have");
    assert!(session.is_alive());
    assert!(server.seen(Op::Heartbeat).iter().all(|s| s.owner.as_deref() == Some("worker-1")));
    let watch = session.watch();
    assert_eq!(session.close().await.expect("closed"), CloseOutcome::Closed);
    assert_eq!(*watch.borrow(), dlock_lock_client::SessionStatus::Lost(SessionLoss::Closed));
    assert_eq!(server.count(Op::Close), 1);
    let beats = server.count(Op::Heartbeat);
    assert!(!eventually_within(800, || server.count(Op::Heartbeat) > beats).await, "no heartbeat after close");
}

async fn eventually_within<F: FnMut() -> bool>(window_ms: u64, mut cond: F) -> bool {
    dlock_rt::wait_until(Duration::from_millis(POLL_MS), Duration::from_millis(window_ms), || {
        let v = cond();
        async move { v.then_some(()) }
    })
    .await
    .is_some()
}

#[tokio::test]
async fn failing_heartbeats_lapse_the_session_and_every_grant_with_it() {
    let server = FakeLockServer::start().await;
    server.set_default(Op::Heartbeat, Reply::Refuse(ErrorCode::NotLeader, Some(10)));
    let (_client, session) = open(&server, |c| {
        c.session_ttl_ms = 1_000;
        c.lock_ttl_ms = 10_000;
    })
    .await;
    let guard = session.acquire("payout:acct-1").await.expect("granted");

    let reason = dlock_rt::timeout(Duration::from_millis(WAIT_MS_MAX), guard.lost()).await.expect("lost in time");

    assert_eq!(reason, LossReason::SessionLost(SessionLoss::HeartbeatLapsed));
    assert!(!session.is_alive());
    assert!(server.count(Op::Heartbeat) >= 2, "two tries per beat");
}

#[tokio::test]
async fn session_expired_ends_the_session_and_its_grants_without_another_heartbeat() {
    let server = FakeLockServer::start().await;
    server.set_default(Op::Heartbeat, refuse(ErrorCode::SessionExpired));
    let (_client, session) = open(&server, |c| c.session_ttl_ms = 1_500).await;
    let guard = session.acquire("payout:acct-1").await.expect("granted");

    let reason = dlock_rt::timeout(Duration::from_millis(WAIT_MS_MAX), guard.lost()).await.expect("lost in time");

    assert_eq!(reason, LossReason::SessionLost(SessionLoss::Ended(ErrorCode::SessionExpired)));
    assert_eq!(server.count(Op::Heartbeat), 1, "SESSION_EXPIRED is not retried");
    let err = session.acquire("payout:acct-2").await.expect_err("session gone");
    assert!(matches!(err, LockClientError::SessionLost { .. }), "{err:?}");
    assert_eq!(server.count(Op::Acquire), 1, "refused locally");
}

#[tokio::test]
async fn release_is_sent_once_and_never_retried() {
    let server = FakeLockServer::start().await;
    server.script(Op::Release, [Reply::Refuse(ErrorCode::NotLeader, Some(10)), slow(600, Reply::Ok)]);
    let (_client, session) = open(&server, |c| c.release_read_timeout_ms = 300).await;

    let first = session.acquire("payout:acct-1").await.expect("granted");
    let err = first.release().await.expect_err("not leader");
    assert_eq!(err.code(), Some(ErrorCode::NotLeader), "even a retry-safe answer is not retried");
    assert_eq!(server.count(Op::Release), 1);

    let second = session.acquire("payout:acct-2").await.expect("granted");
    let err = second.release().await.expect_err("no answer in time");
    assert!(matches!(err, LockClientError::Ambiguous { operation: Operation::Release, .. }), "{err:?}");
    assert_eq!(server.count(Op::Release), 2, "one request per release");
}

#[tokio::test]
async fn release_carries_the_token_and_reads_lock_lost_as_already_gone() {
    let server = FakeLockServer::start().await;
    server.script(Op::Release, [Reply::Ok, refuse(ErrorCode::LockLost)]);
    let (_client, session) = open(&server, |_| {}).await;
    let guard = session.acquire("payout:acct-1").await.expect("granted");
    let token = guard.token();
    let notice = guard.watch();

    assert_eq!(guard.release().await, Ok(ReleaseOutcome::Released));
    assert_eq!(*notice.borrow(), LeaseStatus::Lost(LossReason::Released));
    let seen = server.seen(Op::Release);
    assert_eq!(seen[0].token, Some(token.to_string()));
    assert_eq!(seen[0].body["sessionId"], session.id().to_string());

    let again = session.acquire("payout:acct-1").await.expect("granted");
    assert_eq!(again.release().await, Ok(ReleaseOutcome::AlreadyGone));
}

#[tokio::test]
async fn ambiguous_acquire_is_not_retried_and_its_key_is_refused_until_a_new_session() {
    let server = FakeLockServer::start().await;
    server.script(Op::Acquire, [slow(600, Reply::Ok), Reply::Drop]);
    let (client, session) = open(&server, |c| c.acquire_read_timeout_ms = 300).await;

    let err = session.acquire("payout:acct-1").await.expect_err("answer lost");
    assert!(matches!(err, LockClientError::Ambiguous { operation: Operation::Acquire, .. }), "{err:?}");
    assert!(!err.retry_safe());
    assert_eq!(server.count(Op::Acquire), 1, "not retried");

    let again = session.acquire("payout:acct-1").await.expect_err("refused locally");
    assert!(matches!(again, LockClientError::Ambiguous { .. }), "{again:?}");
    assert_eq!(server.count(Op::Acquire), 1, "nothing sent for a key with an unknown acquire");

    let dropped = session.acquire("payout:acct-2").await.expect_err("connection dropped");
    assert!(matches!(dropped, LockClientError::Ambiguous { .. }), "{dropped:?}");
    assert_eq!(server.count(Op::Acquire), 2);

    assert_eq!(session.close().await, Ok(CloseOutcome::Closed));
    let fresh = client.open_session().await.expect("new session");
    fresh.acquire("payout:acct-1").await.expect("granted on the new session");
}

#[tokio::test]
async fn rotate_sends_the_old_token_once_and_returns_a_held_guard_with_the_greater_one() {
    let server = FakeLockServer::start().await;
    let (_client, session) = open(&server, |_| {}).await;
    let old = session.acquire("payout:acct-1").await.expect("granted");
    let old_token = old.token();
    let watch = old.watch();

    let newer = old.rotate().await.expect("rotated");

    assert_eq!(server.count(Op::Rotate), 1);
    let sent = server.seen(Op::Rotate).pop().expect("seen");
    assert_eq!(sent.token, Some(old_token.to_string()), "rotate carries the old X-Fencing-Token");
    assert_eq!(sent.body["sessionId"], serde_json::json!(session.id()));
    assert!(newer.token() > old_token);
    assert!(newer.is_held());
    assert_eq!(*watch.borrow(), LeaseStatus::Lost(LossReason::Released), "belief in the old grant ended");
    assert!(newer.signature().is_some(), "the new grant carries its own signature");
}

#[tokio::test]
async fn a_refused_rotate_is_one_request_and_leaves_the_key_acquirable() {
    let server = FakeLockServer::start().await;
    let (_client, session) = open(&server, |_| {}).await;
    let old = session.acquire("payout:acct-1").await.expect("granted");
    server.script(Op::Rotate, [refuse(ErrorCode::LockLost)]);

    let err = old.rotate().await.expect_err("refused");

    assert_eq!(err.code(), Some(ErrorCode::LockLost));
    assert_eq!(server.count(Op::Rotate), 1, "never retried");
    session.acquire("payout:acct-1").await.expect("a definite refusal leaves the key acquirable");
}

#[tokio::test]
async fn rotate_is_retried_only_on_not_leader() {
    let server = FakeLockServer::start().await;
    let (_client, session) = open(&server, |_| {}).await;
    let old = session.acquire("payout:acct-1").await.expect("granted");
    server.script(Op::Rotate, [Reply::Refuse(ErrorCode::NotLeader, Some(10))]);

    let newer = old.rotate().await.expect("rotated on the retry");

    assert_eq!(server.count(Op::Rotate), 2, "one try and one retry");
    assert!(newer.is_held());
}

#[tokio::test]
async fn an_ambiguous_rotate_is_not_retried_and_its_key_is_refused_like_an_ambiguous_acquire() {
    let server = FakeLockServer::start().await;
    server.script(Op::Rotate, [slow(600, Reply::Ok)]);
    let (_client, session) = open(&server, |c| c.acquire_read_timeout_ms = 300).await;
    let old = session.acquire("payout:acct-1").await.expect("granted");

    let err = old.rotate().await.expect_err("answer lost");

    assert!(matches!(err, LockClientError::Ambiguous { operation: Operation::Rotate, .. }), "{err:?}");
    assert_eq!(server.count(Op::Rotate), 1, "not retried");
    let before = server.count(Op::Acquire);
    let again = session.acquire("payout:acct-1").await.expect_err("refused locally");
    assert!(matches!(again, LockClientError::Ambiguous { .. }), "{again:?}");
    assert_eq!(server.count(Op::Acquire), before, "nothing sent for a key with an unknown rotate");
}

#[tokio::test]
async fn server_side_wait_must_fit_inside_the_read_budget() {
    let server = FakeLockServer::start().await;
    let (_client, session) = open(&server, |_| {}).await;

    let too_long = AcquireOptions { ttl_ms: None, wait_ms: Some(2_000) };
    let err = session.acquire_with("payout:acct-1", too_long).await.expect_err("refused");
    assert!(matches!(err, LockClientError::Invalid(_)), "{err:?}");
    let bad_key = session.acquire("has space").await.expect_err("refused");
    assert!(matches!(bad_key, LockClientError::Invalid(_)), "{bad_key:?}");
    assert_eq!(server.count(Op::Acquire), 0);

    let fits = AcquireOptions { ttl_ms: Some(5_000), wait_ms: Some(500) };
    session.acquire_with("payout:acct-1", fits).await.expect("granted");
    let body = &server.seen(Op::Acquire)[0].body;
    assert_eq!((body["ttlMillis"].as_u64(), body["waitMillis"].as_u64()), (Some(5_000), Some(500)));
}

#[tokio::test]
async fn inspect_is_an_advisory_read_and_an_unknown_key_is_none() {
    let server = FakeLockServer::start().await;
    server.script(Op::Inspect, [Reply::Ok, refuse(ErrorCode::NotFound)]);
    let client = LockClient::new(server.config()).expect("valid config");

    let info = client.inspect("payout:acct-1").await.expect("read").expect("seen");
    assert!(info.held);
    assert_eq!(info.key, "payout:acct-1");
    assert_eq!(client.inspect("payout:acct-9").await, Ok(None));
}

/// Collects the `lease_belief` events of the keys it is given (other tests of this binary
/// emit into the same process-wide sink).
struct Beliefs(std::sync::Mutex<Vec<(String, dlock_rt::events::Fields)>>, &'static [&'static str]);

impl dlock_rt::events::Sink for Beliefs {
    fn record(&self, node: &str, kind: &'static str, fields: dlock_rt::events::Fields) {
        let key = fields.get("key").and_then(|k| k.as_str()).unwrap_or_default().to_owned();
        if kind == "lease_belief" && self.1.contains(&key.as_str()) {
            if let Ok(mut v) = self.0.lock() {
                v.push((node.to_owned(), fields));
            }
        }
    }
}

/// DL-91: every change of a holder's belief is one `lease_belief` event, with its source and
/// the local deadline believed then: granted, renewed (a later deadline), released; a failed
/// renew is the watch's early notice; a passed deadline is lost.
#[tokio::test]
async fn every_change_of_a_holders_belief_is_one_lease_belief_event_with_its_source() {
    const KEYS: &[&str] = &["payout:belief-renew", "payout:belief-refused", "payout:belief-lapse"];
    let sink = std::sync::Arc::new(Beliefs(std::sync::Mutex::new(Vec::new()), KEYS));
    let _installed = dlock_rt::events::install(sink.clone());
    let server = FakeLockServer::start().await;
    let (_client, session) = open(&server, |c| c.lock_ttl_ms = 2_000).await;

    let guard = session.acquire(KEYS[0]).await.expect("granted");
    // Some of the 1 400 ms local lease passes, so the renew's deadline is a later one.
    assert!(eventually(|| guard.remaining() < Duration::from_millis(1_300)).await);
    guard.renew().await.expect("renewed");
    guard.release().await.expect("released");
    let guard = session.acquire(KEYS[1]).await.expect("granted");
    server.script(Op::Renew, [refuse(ErrorCode::LockLost)]);
    guard.renew().await.expect_err("lock lost");
    let (_c2, short) = open(&server, |c| c.lock_ttl_ms = 1_000).await;
    let lapsing = short.acquire(KEYS[2]).await.expect("granted");
    assert!(eventually(|| !lapsing.is_held()).await, "the local deadline passes");
    assert!(
        eventually(|| sink
            .0
            .lock()
            .map(|v| v.iter().filter(|(_, f)| f["key"] == KEYS[2]).count() == 2)
            .unwrap_or(false))
        .await,
        "the lapse is announced"
    );

    let got = sink.0.lock().map(|v| v.clone()).unwrap_or_default();
    let of = |key: &str| got.iter().filter(|(_, f)| f["key"] == key).map(|(_, f)| f.clone()).collect::<Vec<_>>();
    let sources =
        |key: &str| of(key).iter().map(|f| f["source"].as_str().unwrap_or_default().to_owned()).collect::<Vec<_>>();
    assert_eq!(sources(KEYS[0]), ["granted", "renewed", "released"], "{got:?}");
    assert_eq!(sources(KEYS[1]), ["granted", "early_notice"], "{got:?}");
    assert_eq!(sources(KEYS[2]), ["granted", "lost"], "{got:?}");
    let deadline = |f: &dlock_rt::events::Fields| f["local_deadline_mono_ms"].as_u64().expect("a deadline");
    let renewed = of(KEYS[0]);
    assert!(deadline(&renewed[1]) > deadline(&renewed[0]), "the renew moved the believed deadline: {renewed:?}");
    assert_eq!(of(KEYS[1])[1]["reason"], "a renew failed");
    assert!(of(KEYS[0])[0]["reason"].is_null());
    assert!(got.iter().all(|(node, f)| node == "worker-1" && f["owner"] == "worker-1"), "{got:?}");
}

#[tokio::test]
async fn a_grant_carries_the_lock_servers_signature_for_its_fenced_writes() {
    let server = FakeLockServer::start().await;
    let (_client, session) = open(&server, |_| {}).await;
    let guard = session.acquire("payout:acct-1").await.expect("granted");
    let signed = guard.signed_token();
    assert_eq!(signed.token, guard.token());
    assert_eq!(signed.signature.as_deref(), guard.signature());
    // The signature is the server's over (key, token, owner): a resource trusting its key admits it.
    let verdict = dlock_contract::grant::testing::verifier().verify(
        guard.signature(),
        "payout:acct-1",
        guard.token().get(),
        Some("worker-1"),
    );
    assert_eq!(verdict, Ok(dlock_contract::grant::Verdict::Signed));
}
