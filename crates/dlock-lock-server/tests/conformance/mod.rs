//! The lock store conformance suite: the same cases against every `LockStore`
//! implementation (the simulation store today; SQLite and PostgreSQL plug in through
//! [`lock_store_conformance!`]), so the simulation cannot drift from SQL semantics. Each case
//! names the behaviour it proves; the definitions and invariants are those of the
//! `dlock_lock_server::store` module doc (C3 §3.3, L1–L8).
//!
//! Rules every case follows, so that it holds against a real database clock:
//! - Only relations between values the *store* returns are compared (its `now_ms`, the
//!   expiries and tokens it hands out), never the test's own clock, and with a tolerance.
//! - Nothing is "waited for" with a bare sleep: [`wait_past`] polls the store's clock until
//!   it passes an instant the store itself returned (non-mutating: polling `heartbeat` would
//!   keep the very session alive that the case waits to lapse).
//! - Every case gets a fresh store, so reaper counts are exact.
//! - A case that relies on a window of store time (a `SHORT_MS` session still live when its
//!   next call runs, a lock-delay not yet over) says so when the store's own clock shows the
//!   machine, not the store, closed it first ([`stalled`]: a loaded test machine can stall a
//!   task for seconds). [`run_case`] then plays the case again on a fresh store, at most
//!   [`STALLED_TRIES_MAX`] times; any other failure fails the case at once. A store that
//!   closes a window early is caught, because the store's clock is then still inside it.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it bounds its own waits on real processes with the host's clock (the seam binds service code)"
)]

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use dlock_contract::stream::EventKind;
use dlock_lock_server::store::{
    AcquireRefusal, GrantRow, KeyInfo, LockStore, ReapReport, RenewRefusal, Revocation, RevokeRefusal, RotateRefusal,
    SessionRefusal, SessionRow,
};
use dlock_rt::Duration;
use uuid::Uuid;

pub type Store = Arc<dyn LockStore>;

/// A lease or session that lapses during the case.
pub const SHORT_MS: i64 = 300;
/// A lease or session that outlives the case.
pub const LONG_MS: i64 = 60_000;
/// The lock-delay of the cases that prove it (long enough that the first refused acquire
/// surely comes before it ends, short enough to keep the suite fast).
pub const DELAY_MS: i64 = 800;
/// Rounding of a backend's clock to milliseconds (microsecond timestamps in PostgreSQL).
pub const EPS_MS: i64 = 5;
/// A retention the cases never reach.
pub const KEEP_MS: i64 = 3_600_000;

const POLL: Duration = Duration::from_millis(10);
const DEADLINE: Duration = Duration::from_secs(5);

/// How a case's panic says the machine stalled past a window the case needs ([`stalled`]).
pub const STALLED: &str = "stalled past the case's window:";
/// Fresh stores one case is played on at most while its windows keep being outrun.
pub const STALLED_TRIES_MAX: usize = 3;

/// Ends the case as outrun by the machine (not failed by the store): [`run_case`] plays it
/// again on a fresh store. Only for a window the store's own clock shows already closed.
pub fn stalled(what: String) -> ! {
    std::panic::panic_any(format!("{STALLED} {what}"))
}

/// Whether a panic's payload is [`stalled`]'s.
pub fn is_stalled(payload: &(dyn std::any::Any + Send)) -> bool {
    payload.downcast_ref::<String>().is_some_and(|m| m.starts_with(STALLED))
}

/// Plays `case` on a store from `make` (and drops the store's guard after it), again on a
/// fresh one while it ends [`stalled`], at most [`STALLED_TRIES_MAX`] times in all; any
/// other panic, or a case stalled on every try, fails at once with its own message.
pub async fn run_case<S, G, C>(make: impl Fn() -> S, case: impl Fn(Store) -> C)
where
    S: std::future::Future<Output = (Store, G)>,
    C: std::future::Future<Output = ()>,
{
    use futures::FutureExt;
    for attempt in 1..=STALLED_TRIES_MAX {
        let (store, guard) = make().await;
        let played = std::panic::AssertUnwindSafe(case(store)).catch_unwind().await;
        drop(guard);
        match played {
            Ok(()) => return,
            Err(payload) if is_stalled(&*payload) && attempt < STALLED_TRIES_MAX => {
                eprintln!("conformance: try {attempt} of {STALLED_TRIES_MAX} was outrun; playing it on a fresh store");
            }
            Err(payload) => std::panic::resume_unwind(payload),
        }
    }
}

pub fn id() -> Uuid {
    dlock_rt::rand::uuid_v4()
}

pub async fn now(store: &Store) -> i64 {
    store.now_ms().await.expect("now_ms")
}

/// Whether the store's clock has reached `end_ms` (within [`EPS_MS`]): a lease or session
/// ending at `end_ms` is dead from that instant on (`rules::grant_live`: live while
/// `now < end`), so a refusal then is the machine's stall, not the store's fault.
pub async fn reached(store: &Store, end_ms: i64) -> bool {
    now(store).await + EPS_MS >= end_ms
}

pub async fn open(store: &Store, owner: &str, ttl_ms: i64) -> SessionRow {
    store.open_session(id(), owner, ttl_ms).await.expect("open_session")
}

pub async fn heartbeat(store: &Store, session_id: Uuid) -> Result<(SessionRow, i64), SessionRefusal> {
    store.heartbeat(session_id).await.expect("heartbeat")
}

pub async fn acquire(
    store: &Store,
    key: &str,
    session: &SessionRow,
    ttl_ms: i64,
    delay_ms: i64,
) -> Result<GrantRow, AcquireRefusal> {
    store.acquire(key, session.session_id, ttl_ms, delay_ms).await.expect("acquire")
}

/// Acquires `key`, which the case expects to be granted.
pub async fn grant(store: &Store, key: &str, session: &SessionRow, ttl_ms: i64, delay_ms: i64) -> GrantRow {
    match acquire(store, key, session, ttl_ms, delay_ms).await {
        Ok(g) => g,
        Err(AcquireRefusal::Session(SessionRefusal::Expired)) if reached(store, session.expires_at_ms).await => {
            stalled(format!(
                "the session of {} lapsed at {} before it could take {key}",
                session.owner_id, session.expires_at_ms
            ))
        }
        Err(r) => panic!("acquire {key} by {} refused: {r:?}", session.owner_id),
    }
}

pub async fn renew(
    store: &Store,
    key: &str,
    session: &SessionRow,
    token: i64,
    ttl_ms: i64,
) -> Result<GrantRow, RenewRefusal> {
    store.renew(key, session.session_id, token, ttl_ms).await.expect("renew")
}

pub async fn release(store: &Store, key: &str, token: i64) -> Result<(), Option<i64>> {
    store.release(key, token).await.expect("release")
}

pub async fn rotate(
    store: &Store,
    key: &str,
    session: &SessionRow,
    token: i64,
    ttl_ms: i64,
    delay_ms: i64,
) -> Result<GrantRow, RotateRefusal> {
    store.rotate(key, session.session_id, token, ttl_ms, delay_ms).await.expect("rotate")
}

pub async fn info(store: &Store, key: &str) -> Option<KeyInfo> {
    store.info(key, DELAY_MS).await.expect("info")
}

/// The live grant of a key, if the store knows the key (`None`: never seen).
pub async fn held(store: &Store, key: &str) -> Option<Option<GrantRow>> {
    info(store, key).await.map(|i| i.grant)
}

/// The live grant of a key the case knows was seen.
pub async fn live_grant(store: &Store, key: &str) -> Option<GrantRow> {
    info(store, key).await.unwrap_or_else(|| panic!("{key} was granted, info must know it")).grant
}

pub async fn revoke(store: &Store, key: &str, expected_token: Option<i64>) -> Result<Revocation, RevokeRefusal> {
    store.revoke(key, "oncall@example", "stuck holder, revoking", expected_token, id()).await.expect("revoke")
}

pub async fn reap(store: &Store, limit: i64, delay_ms: i64, retention_ms: i64) -> ReapReport {
    store.reap(limit, delay_ms, retention_ms).await.expect("reap")
}

/// Polls the store's own clock until it is strictly past `at_ms` (an instant the store
/// returned). Strictly: at millisecond resolution, `now_ms == at_ms` may still be before a
/// microsecond expiry.
pub async fn wait_past(store: &Store, at_ms: i64) {
    let reached =
        dlock_rt::wait_until(POLL, DEADLINE, || async move { (now(store).await > at_ms).then_some(()) }).await;
    assert!(reached.is_some(), "the store's clock did not pass {at_ms} within {DEADLINE:?}");
}

/// Polls acquire until it grants; returns the grant and every refusal seen before it.
pub async fn wait_granted(
    store: &Store,
    key: &str,
    session: &SessionRow,
    ttl_ms: i64,
    delay_ms: i64,
) -> (GrantRow, Vec<AcquireRefusal>) {
    let seen = std::sync::Mutex::new(Vec::new());
    let seen_ref = &seen;
    let granted = dlock_rt::wait_until(POLL, DEADLINE, || async move {
        match acquire(store, key, session, ttl_ms, delay_ms).await {
            Ok(g) => Some(g),
            Err(r) => {
                seen_ref.lock().expect("refusals").push(r);
                None
            }
        }
    })
    .await;
    let refusals = seen.into_inner().expect("refusals");
    let grant = granted.unwrap_or_else(|| panic!("{key} was never granted within {DEADLINE:?}: {refusals:?}"));
    (grant, refusals)
}

#[track_caller]
pub fn assert_within(value: i64, lo: i64, hi: i64, what: &str) {
    assert!(lo <= value && value <= hi, "{what}: {value} not within [{lo}, {hi}]");
}

/// The lock-delay end of an acquire that must be refused as delayed by a grant that died at
/// `died_at` (the end within [`EPS_MS`] of `died_at + DELAY_MS`). Granted only once the
/// store's clock had passed that end: [`stalled`] (the machine ran the acquire too late).
#[track_caller]
pub fn assert_delayed_from(r: &Result<GrantRow, AcquireRefusal>, died_at: i64, what: &str) -> i64 {
    let ends = died_at + DELAY_MS;
    match r {
        Err(AcquireRefusal::Delayed { until_ms }) => {
            assert_within(*until_ms, ends - EPS_MS, ends + EPS_MS, what);
            *until_ms
        }
        Ok(g) if g.acquired_at_ms >= ends => {
            stalled(format!("{what}: the acquire ran at {}, after the delay had ended at {ends}", g.acquired_at_ms))
        }
        other => panic!("{what}: expected Delayed, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Store basics.
// ---------------------------------------------------------------------------------------

pub async fn ping_answers_and_the_store_clock_does_not_run_backwards(store: Store) {
    store.ping().await.expect("ping");
    let a = now(&store).await;
    let b = now(&store).await;
    assert!(a <= b, "store clock went back: {a} then {b}");
}

// ---------------------------------------------------------------------------------------
// Sessions (L1–L3).
// ---------------------------------------------------------------------------------------

pub async fn open_session_stores_owner_and_ttl_and_expires_one_ttl_ahead(store: Store) {
    let before = now(&store).await;
    let session_id = id();
    let s = store.open_session(session_id, "owner-a", LONG_MS).await.expect("open_session");
    let after = now(&store).await;
    assert_eq!((s.session_id, s.owner_id.as_str(), s.ttl_ms), (session_id, "owner-a", LONG_MS));
    assert_within(s.expires_at_ms, before + LONG_MS - EPS_MS, after + LONG_MS + EPS_MS, "expires_at = now + ttl");
    // A second session of the same owner is a different session.
    let s2 = open(&store, "owner-a", LONG_MS).await;
    assert_ne!(s2.session_id, s.session_id);
    let (row, held) = heartbeat(&store, s.session_id).await.expect("fresh session is live");
    assert_eq!((row.session_id, row.owner_id.as_str(), row.ttl_ms, held), (session_id, "owner-a", LONG_MS, 0));
}

pub async fn heartbeat_extends_a_live_session_past_its_first_expiry(store: Store) {
    let s = open(&store, "owner-a", SHORT_MS).await;
    let (session_id, target) = (s.session_id, s.expires_at_ms + SHORT_MS / 2);
    // Heartbeat every poll until the store's clock is well past the first expiry: the
    // session must stay live throughout, each heartbeat pushing the expiry forward.
    let live_until = &AtomicI64::new(s.expires_at_ms);
    let last = dlock_rt::wait_until(Duration::from_millis(50), DEADLINE, || {
        let store = &store;
        async move {
            let row = match heartbeat(store, session_id).await {
                Ok((row, _)) => row,
                Err(SessionRefusal::Expired) if reached(store, live_until.load(Ordering::SeqCst)).await => stalled(
                    format!("the session lapsed at {} between two heartbeats", live_until.load(Ordering::SeqCst)),
                ),
                Err(r) => panic!("heartbeat keeps the session live: {r:?}"),
            };
            live_until.store(row.expires_at_ms, Ordering::SeqCst);
            (now(store).await > target).then_some(row)
        }
    })
    .await
    .expect("store clock passed the first expiry");
    assert!(last.expires_at_ms > s.expires_at_ms, "heartbeat extended {} to {}", s.expires_at_ms, last.expires_at_ms);
    assert_eq!(last.ttl_ms, SHORT_MS);
    // The extension is `now + ttl`.
    let s = open(&store, "owner-b", LONG_MS).await;
    let before = now(&store).await;
    let (row, _) = heartbeat(&store, s.session_id).await.expect("live");
    let after = now(&store).await;
    assert_within(row.expires_at_ms, before + LONG_MS - EPS_MS, after + LONG_MS + EPS_MS, "heartbeat: now + ttl");
    assert!(row.expires_at_ms >= s.expires_at_ms);
}

pub async fn heartbeat_counts_only_the_sessions_live_grants(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let b = open(&store, "owner-b", LONG_MS).await;
    assert_eq!(heartbeat(&store, a.session_id).await.map(|(_, n)| n), Ok(0));
    let g1 = grant(&store, "k1", &a, LONG_MS, 0).await;
    grant(&store, "k2", &a, LONG_MS, 0).await;
    grant(&store, "k-other", &b, LONG_MS, 0).await;
    assert_eq!(heartbeat(&store, a.session_id).await.map(|(_, n)| n), Ok(2));
    // A grant whose own lease lapsed is not counted, though the session lives on.
    let short = grant(&store, "k3", &a, SHORT_MS, 0).await;
    wait_past(&store, short.expires_at_ms).await;
    assert_eq!(heartbeat(&store, a.session_id).await.map(|(_, n)| n), Ok(2));
    // Nor a released one.
    assert_eq!(release(&store, "k1", g1.fencing_token).await, Ok(()));
    assert_eq!(heartbeat(&store, a.session_id).await.map(|(_, n)| n), Ok(1));
    assert_eq!(heartbeat(&store, b.session_id).await.map(|(_, n)| n), Ok(1));
}

pub async fn heartbeat_and_close_of_a_never_opened_session_are_unknown(store: Store) {
    let ghost = id();
    assert_eq!(heartbeat(&store, ghost).await, Err(SessionRefusal::Unknown));
    assert_eq!(store.close_session(ghost, 0).await.expect("close"), Err(SessionRefusal::Unknown));
    // The refusals created nothing.
    assert_eq!(heartbeat(&store, ghost).await, Err(SessionRefusal::Unknown));
}

pub async fn heartbeat_of_a_lapsed_session_is_expired_and_does_not_revive_it(store: Store) {
    let s = open(&store, "owner-a", SHORT_MS).await;
    wait_past(&store, s.expires_at_ms).await;
    // Before any reaper pass: lapse is decided by the clock, not by the reaper.
    assert_eq!(heartbeat(&store, s.session_id).await, Err(SessionRefusal::Expired));
    assert_eq!(heartbeat(&store, s.session_id).await, Err(SessionRefusal::Expired));
    // After the reaper marked it, still remembered as expired.
    assert_eq!(reap(&store, 100, 0, KEEP_MS).await.expired_sessions, 1);
    assert_eq!(heartbeat(&store, s.session_id).await, Err(SessionRefusal::Expired));
}

pub async fn reaper_forgets_an_expired_session_after_retention_then_it_is_unknown(store: Store) {
    let s = open(&store, "owner-a", SHORT_MS).await;
    let g = grant(&store, "k", &s, LONG_MS, 0).await;
    wait_past(&store, s.expires_at_ms).await;
    assert_eq!(
        reap(&store, 100, 0, KEEP_MS).await,
        ReapReport { expired_sessions: 1, released_grants: 1, forgotten_sessions: 0 }
    );
    assert_eq!(heartbeat(&store, s.session_id).await, Err(SessionRefusal::Expired), "remembered during retention");
    // Past `expires_at + retention`, the next pass forgets it.
    let retention = SHORT_MS;
    wait_past(&store, s.expires_at_ms + retention).await;
    assert_eq!(
        reap(&store, 100, 0, retention).await,
        ReapReport { expired_sessions: 0, released_grants: 0, forgotten_sessions: 1 }
    );
    assert_eq!(heartbeat(&store, s.session_id).await, Err(SessionRefusal::Unknown));
    assert_eq!(acquire(&store, "k2", &s, LONG_MS, 0).await, Err(AcquireRefusal::Session(SessionRefusal::Unknown)));
    assert_eq!(
        renew(&store, "k", &s, g.fencing_token, LONG_MS).await,
        Err(RenewRefusal::Session(SessionRefusal::Unknown))
    );
    assert_eq!(store.close_session(s.session_id, 0).await.expect("close"), Err(SessionRefusal::Unknown));
}

pub async fn close_forgets_the_session_and_releases_its_grants_without_lock_delay(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let b = open(&store, "owner-b", LONG_MS).await;
    let g1 = grant(&store, "k1", &a, LONG_MS, DELAY_MS).await;
    let g2 = grant(&store, "k2", &a, LONG_MS, DELAY_MS).await;
    let gb = grant(&store, "kb", &b, LONG_MS, DELAY_MS).await;
    assert_eq!(store.close_session(a.session_id, DELAY_MS).await.expect("close"), Ok(()));
    // Forgotten at once: unknown, not expired.
    assert_eq!(heartbeat(&store, a.session_id).await, Err(SessionRefusal::Unknown));
    assert_eq!(store.close_session(a.session_id, DELAY_MS).await.expect("close"), Err(SessionRefusal::Unknown));
    assert_eq!(acquire(&store, "k3", &a, LONG_MS, 0).await, Err(AcquireRefusal::Session(SessionRefusal::Unknown)));
    assert_eq!(
        renew(&store, "k1", &a, g1.fencing_token, LONG_MS).await,
        Err(RenewRefusal::Session(SessionRefusal::Unknown))
    );
    // Its grants are gone (the keys are still known)...
    assert_eq!(held(&store, "k1").await, Some(None));
    assert_eq!(held(&store, "k2").await, Some(None));
    assert_eq!(release(&store, "k1", g1.fencing_token).await, Err(None));
    // ...and free at once for another session, even one asking for lock-delay.
    let n1 = grant(&store, "k1", &b, LONG_MS, DELAY_MS).await;
    let n2 = grant(&store, "k2", &b, LONG_MS, DELAY_MS).await;
    assert!(n1.fencing_token > g2.fencing_token && n2.fencing_token > n1.fencing_token);
    // Another session's grant was untouched.
    assert_eq!(live_grant(&store, "kb").await, Some(gb));
}

pub async fn close_of_a_lapsed_session_keeps_the_lock_delay_of_its_lost_grants(store: Store) {
    let a = open(&store, "owner-a", SHORT_MS).await;
    let b = open(&store, "owner-b", LONG_MS).await;
    let g = grant(&store, "k", &a, LONG_MS, DELAY_MS).await;
    wait_past(&store, a.expires_at_ms).await;
    // The grant died when the session lapsed; closing afterwards does not undo its delay.
    assert_eq!(store.close_session(a.session_id, DELAY_MS).await.expect("close"), Ok(()));
    assert_eq!(heartbeat(&store, a.session_id).await, Err(SessionRefusal::Unknown));
    let died_at = g.expires_at_ms.min(a.expires_at_ms);
    let until =
        assert_delayed_from(&acquire(&store, "k", &b, LONG_MS, DELAY_MS).await, died_at, "until = died_at + delay");
    let (next, refusals) = wait_granted(&store, "k", &b, LONG_MS, DELAY_MS).await;
    assert!(refusals.iter().all(|r| *r == AcquireRefusal::Delayed { until_ms: until }), "{refusals:?}");
    assert!(next.acquired_at_ms >= until, "granted at {} before the delay ended at {until}", next.acquired_at_ms);
    assert!(next.fencing_token > g.fencing_token);
}

// ---------------------------------------------------------------------------------------
// Acquire (L4).
// ---------------------------------------------------------------------------------------

pub async fn acquire_grants_a_fresh_token_to_a_live_session(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    assert_eq!(info(&store, "payout:acct-1").await, None, "never seen");
    let before = now(&store).await;
    let g = grant(&store, "payout:acct-1", &a, LONG_MS, 0).await;
    let after = now(&store).await;
    assert_eq!((g.key.as_str(), g.session_id, g.owner_id.as_str()), ("payout:acct-1", a.session_id, "owner-a"));
    assert!(g.fencing_token > 0, "token {}", g.fencing_token);
    assert_within(g.acquired_at_ms, before - EPS_MS, after + EPS_MS, "acquired_at = now");
    assert_within(g.expires_at_ms - g.acquired_at_ms, LONG_MS - EPS_MS, LONG_MS + EPS_MS, "lease = ttl");
    assert_eq!(held(&store, "payout:acct-1").await, Some(Some(g.clone())));
    // A second key gets a different, greater token.
    let g2 = grant(&store, "payout:acct-2", &a, LONG_MS, 0).await;
    assert!(g2.fencing_token > g.fencing_token);
}

pub async fn acquire_by_another_session_is_contended_with_the_holder_and_its_expiry(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let b = open(&store, "owner-b", LONG_MS).await;
    let g = grant(&store, "k", &a, LONG_MS, DELAY_MS).await;
    for _ in 0..2 {
        assert_eq!(
            acquire(&store, "k", &b, LONG_MS, DELAY_MS).await,
            Err(AcquireRefusal::Contended { holder_owner_id: "owner-a".into(), expires_at_ms: g.expires_at_ms })
        );
    }
    // The refusal changed nothing: the holder's grant stands, the loser's session lives.
    assert_eq!(live_grant(&store, "k").await, Some(g.clone()));
    assert_eq!(heartbeat(&store, b.session_id).await.map(|(_, n)| n), Ok(0));
    // The holder's expiry in the refusal follows a renew.
    let renewed = renew(&store, "k", &a, g.fencing_token, LONG_MS).await.expect("renew");
    assert_eq!(
        acquire(&store, "k", &b, LONG_MS, DELAY_MS).await,
        Err(AcquireRefusal::Contended { holder_owner_id: "owner-a".into(), expires_at_ms: renewed.expires_at_ms })
    );
}

pub async fn acquire_by_the_holding_session_is_already_held_not_reentrant(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let g = grant(&store, "k", &a, LONG_MS, 0).await;
    assert_eq!(
        acquire(&store, "k", &a, LONG_MS, 0).await,
        Err(AcquireRefusal::AlreadyHeld { fencing_token: g.fencing_token, expires_at_ms: g.expires_at_ms })
    );
    // No new token, no extension: the grant is exactly as it was.
    assert_eq!(live_grant(&store, "k").await, Some(g.clone()));
    let renewed = renew(&store, "k", &a, g.fencing_token, LONG_MS).await.expect("renew");
    assert_eq!(
        acquire(&store, "k", &a, LONG_MS, 0).await,
        Err(AcquireRefusal::AlreadyHeld { fencing_token: g.fencing_token, expires_at_ms: renewed.expires_at_ms })
    );
}

/// Invariant 3 (Jepsen, etcd 3.4.3): acquire re-checks the session in the granting step.
pub async fn acquire_by_an_expired_session_is_refused_even_when_the_key_is_free(store: Store) {
    let a = open(&store, "owner-a", SHORT_MS).await;
    let held = grant(&store, "k-held", &a, LONG_MS, 0).await;
    wait_past(&store, a.expires_at_ms).await;
    // A free, never-seen key: still refused, and still never seen.
    assert_eq!(acquire(&store, "k-free", &a, LONG_MS, 0).await, Err(AcquireRefusal::Session(SessionRefusal::Expired)));
    assert_eq!(info(&store, "k-free").await, None);
    // The key it held (its grant died with it): Expired, not AlreadyHeld.
    assert_eq!(acquire(&store, "k-held", &a, LONG_MS, 0).await, Err(AcquireRefusal::Session(SessionRefusal::Expired)));
    assert_eq!(live_grant(&store, "k-held").await, None);
    // Same after the reaper marked it.
    reap(&store, 100, 0, KEEP_MS).await;
    assert_eq!(acquire(&store, "k-free", &a, LONG_MS, 0).await, Err(AcquireRefusal::Session(SessionRefusal::Expired)));
    assert_eq!(info(&store, "k-free").await, None);
    assert!(held.fencing_token > 0);
}

pub async fn acquire_by_an_unknown_session_is_refused(store: Store) {
    let ghost = SessionRow { session_id: id(), owner_id: "ghost".into(), ttl_ms: LONG_MS, expires_at_ms: i64::MAX };
    assert_eq!(acquire(&store, "k", &ghost, LONG_MS, 0).await, Err(AcquireRefusal::Session(SessionRefusal::Unknown)));
    assert_eq!(info(&store, "k").await, None);
}

pub async fn lapsed_lease_frees_the_key_for_another_session(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let b = open(&store, "owner-b", LONG_MS).await;
    let g = grant(&store, "k", &a, SHORT_MS, 0).await;
    wait_past(&store, g.expires_at_ms).await;
    assert_eq!(live_grant(&store, "k").await, None, "a lapsed lease is not shown as held");
    let next = grant(&store, "k", &b, LONG_MS, 0).await;
    assert!(next.fencing_token > g.fencing_token);
    assert_eq!(live_grant(&store, "k").await, Some(next.clone()));
    // The old holder (its session alive) now meets the new holder.
    assert_eq!(
        acquire(&store, "k", &a, LONG_MS, 0).await,
        Err(AcquireRefusal::Contended { holder_owner_id: "owner-b".into(), expires_at_ms: next.expires_at_ms })
    );
}

/// Also invariant 5: a grant whose response was never read is still attached to its
/// session and dies with it.
pub async fn lapsed_session_frees_the_key_for_another_session(store: Store) {
    let a = open(&store, "owner-a", SHORT_MS).await;
    let b = open(&store, "owner-b", LONG_MS).await;
    // An "ambiguous" acquire: committed, the answer never read.
    let _ = acquire(&store, "k", &a, LONG_MS, 0).await;
    wait_past(&store, a.expires_at_ms).await;
    assert_eq!(held(&store, "k").await, Some(None), "the grant died with its session");
    let next = grant(&store, "k", &b, LONG_MS, 0).await;
    assert_eq!(live_grant(&store, "k").await, Some(next));
}

// ---------------------------------------------------------------------------------------
// Lock-delay.
// ---------------------------------------------------------------------------------------

pub async fn lapsed_lease_imposes_lock_delay_until_death_plus_delay(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let b = open(&store, "owner-b", LONG_MS).await;
    let g = grant(&store, "k", &a, SHORT_MS, DELAY_MS).await;
    wait_past(&store, g.expires_at_ms).await;
    let until = assert_delayed_from(&acquire(&store, "k", &b, LONG_MS, DELAY_MS).await, g.expires_at_ms, "until");
    assert_eq!(held(&store, "k").await, Some(None), "delayed, but not held");
    // The refused acquire kept its removal of the dead grant: no row, not merely a dead one.
    assert_eq!(release(&store, "k", g.fencing_token).await, Err(None), "the dead grant was removed");
    let (next, refusals) = wait_granted(&store, "k", &b, LONG_MS, DELAY_MS).await;
    assert!(refusals.iter().all(|r| *r == AcquireRefusal::Delayed { until_ms: until }), "{refusals:?}");
    assert!(next.acquired_at_ms >= until, "granted at {} before the delay ended at {until}", next.acquired_at_ms);
    assert!(next.fencing_token > g.fencing_token);
}

pub async fn lapsed_session_imposes_lock_delay_from_the_session_expiry(store: Store) {
    let a = open(&store, "owner-a", SHORT_MS).await;
    let b = open(&store, "owner-b", LONG_MS).await;
    let g = grant(&store, "k", &a, LONG_MS, DELAY_MS).await;
    wait_past(&store, a.expires_at_ms).await;
    // The grant died at min(grant expiry, session expiry) = the session's.
    let died_at = g.expires_at_ms.min(a.expires_at_ms);
    let until = assert_delayed_from(&acquire(&store, "k", &b, LONG_MS, DELAY_MS).await, died_at, "until");
    let (next, refusals) = wait_granted(&store, "k", &b, LONG_MS, DELAY_MS).await;
    assert!(refusals.iter().all(|r| *r == AcquireRefusal::Delayed { until_ms: until }), "{refusals:?}");
    assert!(next.acquired_at_ms >= until, "granted at {} before the delay ended at {until}", next.acquired_at_ms);
}

pub async fn release_close_and_revoke_impose_no_lock_delay(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let closing = open(&store, "owner-c", LONG_MS).await;
    let b = open(&store, "owner-b", LONG_MS).await;
    let released = grant(&store, "k-release", &a, LONG_MS, DELAY_MS).await;
    grant(&store, "k-close", &closing, LONG_MS, DELAY_MS).await;
    let revoked = grant(&store, "k-revoke", &a, LONG_MS, DELAY_MS).await;
    assert_eq!(release(&store, "k-release", released.fencing_token).await, Ok(()));
    assert_eq!(store.close_session(closing.session_id, DELAY_MS).await.expect("close"), Ok(()));
    revoke(&store, "k-revoke", Some(revoked.fencing_token)).await.expect("revoke");
    for key in ["k-release", "k-close", "k-revoke"] {
        grant(&store, key, &b, LONG_MS, DELAY_MS).await;
    }
}

// ---------------------------------------------------------------------------------------
// Tokens.
// ---------------------------------------------------------------------------------------

pub async fn tokens_strictly_increase_across_keys_and_sessions_and_are_never_reused(store: Store) {
    let s1 = open(&store, "owner-1", LONG_MS).await;
    let s2 = open(&store, "owner-2", LONG_MS).await;
    let s3 = open(&store, "owner-3", LONG_MS).await;
    let mut issued = Vec::new();
    issued.push(grant(&store, "k1", &s1, LONG_MS, 0).await.fencing_token);
    issued.push(grant(&store, "k2", &s2, LONG_MS, 0).await.fencing_token);
    let g3 = grant(&store, "k3", &s3, LONG_MS, 0).await;
    issued.push(g3.fencing_token);
    // Refused acquires and renews issue nothing observable, and never lower the next token.
    let _ = acquire(&store, "k1", &s2, LONG_MS, 0).await;
    let renewed = renew(&store, "k3", &s3, g3.fencing_token, LONG_MS).await.expect("renew");
    assert_eq!(renewed.fencing_token, g3.fencing_token);
    assert_eq!(release(&store, "k1", issued[0]).await, Ok(()));
    issued.push(grant(&store, "k1", &s2, LONG_MS, 0).await.fencing_token);
    // Same key, same session again after release: a new token, never the old one.
    assert_eq!(release(&store, "k1", issued[3]).await, Ok(()));
    issued.push(grant(&store, "k1", &s2, LONG_MS, 0).await.fencing_token);
    let floor = revoke(&store, "k3", None).await.expect("revoke").new_token_floor;
    issued.push(floor);
    issued.push(grant(&store, "k3", &s1, LONG_MS, 0).await.fencing_token);
    assert_eq!(store.close_session(s2.session_id, 0).await.expect("close"), Ok(()));
    issued.push(grant(&store, "k2", &s3, LONG_MS, 0).await.fencing_token);
    issued.push(grant(&store, "k4", &s1, LONG_MS, 0).await.fencing_token);
    assert!(issued.windows(2).all(|w| w[0] < w[1]), "tokens in grant order: {issued:?}");
    assert_eq!(issued.iter().collect::<BTreeSet<_>>().len(), issued.len(), "reused: {issued:?}");
}

// ---------------------------------------------------------------------------------------
// Renew (L5).
// ---------------------------------------------------------------------------------------

pub async fn renew_extends_the_lease_and_keeps_the_token(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let g = grant(&store, "k", &a, SHORT_MS, 0).await;
    let target = g.expires_at_ms + SHORT_MS / 2;
    // Renew every poll until the store's clock is well past the first lease's end.
    let live_until = &AtomicI64::new(g.expires_at_ms);
    let last = dlock_rt::wait_until(Duration::from_millis(50), DEADLINE, || {
        let (store, a, g) = (&store, &a, &g);
        async move {
            let r = match renew(store, "k", a, g.fencing_token, SHORT_MS).await {
                Ok(r) => r,
                Err(RenewRefusal::Lost { .. }) if reached(store, live_until.load(Ordering::SeqCst)).await => {
                    stalled(format!("the lease lapsed at {} between two renews", live_until.load(Ordering::SeqCst)))
                }
                Err(r) => panic!("renew keeps the grant live: {r:?}"),
            };
            live_until.store(r.expires_at_ms, Ordering::SeqCst);
            (now(store).await > target).then_some(r)
        }
    })
    .await
    .expect("store clock passed the first lease");
    assert_eq!(
        (&last.key, last.session_id, &last.owner_id, last.fencing_token, last.acquired_at_ms),
        (&g.key, g.session_id, &g.owner_id, g.fencing_token, g.acquired_at_ms),
        "renew extends, never re-issues"
    );
    assert!(last.expires_at_ms > g.expires_at_ms);
    // The extension is `now + ttl`.
    let before = now(&store).await;
    let r = renew(&store, "k", &a, g.fencing_token, LONG_MS).await.expect("renew");
    let after = now(&store).await;
    assert_within(r.expires_at_ms, before + LONG_MS - EPS_MS, after + LONG_MS + EPS_MS, "renew: now + ttl");
    assert_eq!(live_grant(&store, "k").await, Some(r));
}

pub async fn renew_refuses_a_wrong_token_another_session_or_a_dead_grant_as_lost(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let b = open(&store, "owner-b", LONG_MS).await;
    let g = grant(&store, "k", &a, LONG_MS, 0).await;
    let t = g.fencing_token;
    assert_eq!(renew(&store, "k", &a, t + 1, LONG_MS).await, Err(RenewRefusal::Lost { stored_token: Some(t) }));
    assert_eq!(renew(&store, "k", &a, t - 1, LONG_MS).await, Err(RenewRefusal::Lost { stored_token: Some(t) }));
    assert_eq!(renew(&store, "k", &b, t, LONG_MS).await, Err(RenewRefusal::Lost { stored_token: Some(t) }));
    assert_eq!(renew(&store, "never", &a, t, LONG_MS).await, Err(RenewRefusal::Lost { stored_token: None }));
    // None of the refusals touched the grant.
    assert_eq!(live_grant(&store, "k").await, Some(g));
    // A dead grant (own lease lapsed, session alive) cannot be renewed back to life. Its row
    // may linger until reaped or replaced: the stored token is its own, or none.
    let short = grant(&store, "k-short", &a, SHORT_MS, 0).await;
    wait_past(&store, short.expires_at_ms).await;
    let r = renew(&store, "k-short", &a, short.fencing_token, LONG_MS).await;
    assert!(
        matches!(r, Err(RenewRefusal::Lost { stored_token: None }))
            || r == Err(RenewRefusal::Lost { stored_token: Some(short.fencing_token) }),
        "{r:?}"
    );
    assert_eq!(live_grant(&store, "k-short").await, None);
    // Taken over: the old holder learns the newer token.
    let next = grant(&store, "k-short", &b, LONG_MS, 0).await;
    assert_eq!(
        renew(&store, "k-short", &a, short.fencing_token, LONG_MS).await,
        Err(RenewRefusal::Lost { stored_token: Some(next.fencing_token) })
    );
}

pub async fn renew_by_an_expired_or_unknown_session_is_a_session_refusal(store: Store) {
    let a = open(&store, "owner-a", SHORT_MS).await;
    let g = grant(&store, "k", &a, LONG_MS, 0).await;
    let ghost = SessionRow { session_id: id(), owner_id: "ghost".into(), ttl_ms: LONG_MS, expires_at_ms: i64::MAX };
    assert_eq!(
        renew(&store, "k", &ghost, g.fencing_token, LONG_MS).await,
        Err(RenewRefusal::Session(SessionRefusal::Unknown))
    );
    wait_past(&store, a.expires_at_ms).await;
    assert_eq!(
        renew(&store, "k", &a, g.fencing_token, LONG_MS).await,
        Err(RenewRefusal::Session(SessionRefusal::Expired))
    );
    assert_eq!(live_grant(&store, "k").await, None);
}

// ---------------------------------------------------------------------------------------
// Release (L6).
// ---------------------------------------------------------------------------------------

pub async fn release_is_compare_and_delete_on_key_and_token(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let g = grant(&store, "k", &a, LONG_MS, 0).await;
    let other = grant(&store, "k-other", &a, LONG_MS, 0).await;
    let t = g.fencing_token;
    // Wrong token on the right key, right token on the wrong key: nothing deleted.
    assert_eq!(release(&store, "k", t + 1_000).await, Err(Some(t)));
    assert_eq!(release(&store, "k-other", t).await, Err(Some(other.fencing_token)));
    assert_eq!(live_grant(&store, "k").await, Some(g.clone()));
    assert_eq!(live_grant(&store, "k-other").await, Some(other.clone()));
    // The exact pair deletes exactly that grant.
    assert_eq!(release(&store, "k", t).await, Ok(()));
    assert_eq!(held(&store, "k").await, Some(None));
    assert_eq!(live_grant(&store, "k-other").await, Some(other));
    assert_eq!(heartbeat(&store, a.session_id).await.map(|(_, n)| n), Ok(1));
    // Releasing again: no row any more.
    assert_eq!(release(&store, "k", t).await, Err(None));
}

pub async fn stale_release_never_frees_the_newer_holders_grant(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let b = open(&store, "owner-b", LONG_MS).await;
    let old = grant(&store, "k", &a, SHORT_MS, 0).await;
    wait_past(&store, old.expires_at_ms).await;
    let newer = grant(&store, "k", &b, LONG_MS, 0).await;
    assert!(newer.fencing_token > old.fencing_token);
    assert_eq!(release(&store, "k", old.fencing_token).await, Err(Some(newer.fencing_token)));
    assert_eq!(live_grant(&store, "k").await, Some(newer.clone()));
    renew(&store, "k", &b, newer.fencing_token, LONG_MS).await.expect("the newer holder still holds");
    assert_eq!(release(&store, "k", newer.fencing_token).await, Ok(()));
}

pub async fn release_of_a_never_granted_key_is_none(store: Store) {
    assert_eq!(release(&store, "never", 1).await, Err(None));
    assert_eq!(release(&store, "never", i64::MAX).await, Err(None));
    assert_eq!(info(&store, "never").await, None, "a refused release does not make the key seen");
}

pub async fn release_of_a_dead_grant_is_refused(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let b = open(&store, "owner-b", LONG_MS).await;
    let g = grant(&store, "k", &a, SHORT_MS, 0).await;
    wait_past(&store, g.expires_at_ms).await;
    // No live grant (k, token): refused; the dead row, if it lingers, reports its token.
    let r = release(&store, "k", g.fencing_token).await;
    assert!(r == Err(None) || r == Err(Some(g.fencing_token)), "{r:?}");
    grant(&store, "k", &b, LONG_MS, 0).await;
}

// ---------------------------------------------------------------------------------------
// Rotate (C3-extensions E-18): release + acquire by the same session, one atomic step.
// ---------------------------------------------------------------------------------------

pub async fn rotate_replaces_the_holders_grant_with_a_greater_token_in_one_step(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let b = open(&store, "owner-b", LONG_MS).await;
    let g = grant(&store, "k", &a, LONG_MS, DELAY_MS).await;
    let before = now(&store).await;
    let r = rotate(&store, "k", &a, g.fencing_token, SHORT_MS * 10, DELAY_MS).await.expect("the holder rotates");
    let after = now(&store).await;
    assert!(r.fencing_token > g.fencing_token, "rotated {} over {}", r.fencing_token, g.fencing_token);
    assert_eq!((&r.key, r.session_id, &r.owner_id), (&g.key, a.session_id, &a.owner_id));
    assert_within(r.acquired_at_ms, before - EPS_MS, after + EPS_MS, "rotate: a fresh grant at now");
    assert_eq!(r.expires_at_ms - r.acquired_at_ms, SHORT_MS * 10, "rotate: now + ttl");
    assert_eq!(live_grant(&store, "k").await, Some(r.clone()));
    // The old grant is gone: its token releases, renews and rotates nothing.
    assert_eq!(release(&store, "k", g.fencing_token).await, Err(Some(r.fencing_token)));
    assert_eq!(
        renew(&store, "k", &a, g.fencing_token, LONG_MS).await,
        Err(RenewRefusal::Lost { stored_token: Some(r.fencing_token) })
    );
    assert_eq!(
        rotate(&store, "k", &a, g.fencing_token, LONG_MS, DELAY_MS).await,
        Err(RotateRefusal::Lost { stored_token: Some(r.fencing_token) })
    );
    // The key was never free: another session is still refused, by the new grant.
    assert!(matches!(acquire(&store, "k", &b, LONG_MS, DELAY_MS).await, Err(AcquireRefusal::Contended { .. })));
    assert_eq!(heartbeat(&store, a.session_id).await.map(|(_, n)| n), Ok(1));
    // The rotated grant is a grant like any other: renewed with its own token, rotated again,
    // and the next grant of any key is above it.
    renew(&store, "k", &a, r.fencing_token, LONG_MS).await.expect("renew the rotated grant");
    let again = rotate(&store, "k", &a, r.fencing_token, LONG_MS, DELAY_MS).await.expect("rotate again");
    assert!(again.fencing_token > r.fencing_token);
    let renewed = renew(&store, "k", &a, again.fencing_token, LONG_MS).await.expect("renew keeps the token");
    assert_eq!(renewed.fencing_token, again.fencing_token);
    let other = grant(&store, "k-other", &b, LONG_MS, 0).await;
    assert!(other.fencing_token > again.fencing_token);
    // Released (not lost): no lock-delay, the key is free at once.
    assert_eq!(release(&store, "k", again.fencing_token).await, Ok(()));
    grant(&store, "k", &b, LONG_MS, DELAY_MS).await;
}

pub async fn rotate_of_a_wrong_token_another_sessions_or_a_dead_grant_is_lost_and_grants_nothing(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let b = open(&store, "owner-b", LONG_MS).await;
    let g = grant(&store, "k", &a, LONG_MS, 0).await;
    let t = g.fencing_token;
    let lost = |stored| Err(RotateRefusal::Lost { stored_token: stored });
    assert_eq!(rotate(&store, "k", &a, t + 1, LONG_MS, 0).await, lost(Some(t)));
    assert_eq!(rotate(&store, "k", &a, t - 1, LONG_MS, 0).await, lost(Some(t)));
    // Another session presenting the holder's token: a rotate re-grants only to the holder.
    assert_eq!(rotate(&store, "k", &b, t, LONG_MS, 0).await, lost(Some(t)));
    assert_eq!(rotate(&store, "never", &a, t, LONG_MS, 0).await, lost(None));
    assert_eq!(info(&store, "never").await, None, "a refused rotate does not make the key seen");
    // None of the refusals touched the grant, and none issued a grant.
    assert_eq!(live_grant(&store, "k").await, Some(g.clone()));
    assert_eq!(heartbeat(&store, b.session_id).await.map(|(_, n)| n), Ok(0));
    // A dead grant (own lease lapsed, session alive) is not rotated back to life.
    let short = grant(&store, "k-short", &a, SHORT_MS, 0).await;
    wait_past(&store, short.expires_at_ms).await;
    let r = rotate(&store, "k-short", &a, short.fencing_token, LONG_MS, 0).await;
    assert!(r == lost(None) || r == lost(Some(short.fencing_token)), "{r:?}");
    assert_eq!(live_grant(&store, "k-short").await, None);
    assert_eq!(heartbeat(&store, a.session_id).await.map(|(_, n)| n), Ok(1), "only `k` is held");
    // Taken over: the old holder learns the newer token, and the newer grant stays.
    let next = grant(&store, "k-short", &b, LONG_MS, 0).await;
    assert_eq!(rotate(&store, "k-short", &a, short.fencing_token, LONG_MS, 0).await, lost(Some(next.fencing_token)));
    assert_eq!(live_grant(&store, "k-short").await, Some(next));
}

pub async fn rotate_by_an_expired_or_unknown_session_is_a_session_refusal(store: Store) {
    let a = open(&store, "owner-a", SHORT_MS).await;
    let g = grant(&store, "k", &a, LONG_MS, 0).await;
    let ghost = SessionRow { session_id: id(), owner_id: "ghost".into(), ttl_ms: LONG_MS, expires_at_ms: i64::MAX };
    assert_eq!(
        rotate(&store, "k", &ghost, g.fencing_token, LONG_MS, 0).await,
        Err(RotateRefusal::Session(SessionRefusal::Unknown))
    );
    assert_eq!(live_grant(&store, "k").await, Some(g.clone()));
    wait_past(&store, a.expires_at_ms).await;
    assert_eq!(
        rotate(&store, "k", &a, g.fencing_token, LONG_MS, 0).await,
        Err(RotateRefusal::Session(SessionRefusal::Expired))
    );
    assert_eq!(live_grant(&store, "k").await, None);
}

pub async fn a_rotated_grant_that_lapses_imposes_the_lock_delay_like_any_grant(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let b = open(&store, "owner-b", LONG_MS).await;
    let g = grant(&store, "k", &a, LONG_MS, DELAY_MS).await;
    let r = rotate(&store, "k", &a, g.fencing_token, SHORT_MS, DELAY_MS).await.expect("rotate");
    wait_past(&store, r.expires_at_ms).await;
    assert_delayed_from(&acquire(&store, "k", &b, LONG_MS, DELAY_MS).await, r.expires_at_ms, "until");
    let (next, _) = wait_granted(&store, "k", &b, LONG_MS, DELAY_MS).await;
    assert!(next.fencing_token > r.fencing_token);
}

pub async fn racing_rotates_and_acquirers_never_overlap_and_tokens_increase(store: Store) {
    const TASKS: usize = 3;
    const TENURES_EACH: usize = 5;
    const ROTATES_PER_TENURE: usize = 3;
    let holders = Arc::new(AtomicI64::new(0));
    let most_holders = Arc::new(AtomicI64::new(0));
    let issued = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let s = open(&store, &format!("rotator-{i}"), LONG_MS).await;
        let (store, holders, most_holders, issued) =
            (store.clone(), holders.clone(), most_holders.clone(), issued.clone());
        tasks.push(tokio::spawn(async move {
            let started = dlock_rt::Instant::now();
            let mut tenures = 0;
            while tenures < TENURES_EACH {
                assert!(started.elapsed() < DEADLINE, "rotator-{i} starved: {tenures} tenures");
                match store.acquire("hot", s.session_id, LONG_MS, 0).await.expect("acquire") {
                    Ok(g) => {
                        let now_holding = holders.fetch_add(1, Ordering::SeqCst) + 1;
                        most_holders.fetch_max(now_holding, Ordering::SeqCst);
                        let mut token = g.fencing_token;
                        let mut mine = vec![token];
                        for _ in 0..ROTATES_PER_TENURE {
                            let r = store.rotate("hot", s.session_id, token, LONG_MS, 0).await.expect("rotate");
                            let r = r.unwrap_or_else(|e| panic!("rotator-{i} could not rotate its own grant: {e:?}"));
                            assert!(r.fencing_token > token);
                            token = r.fencing_token;
                            mine.push(token);
                        }
                        issued.lock().expect("issued").push(mine);
                        holders.fetch_sub(1, Ordering::SeqCst);
                        assert_eq!(store.release("hot", token).await.expect("release"), Ok(()));
                        tenures += 1;
                    }
                    Err(AcquireRefusal::Contended { .. }) => dlock_rt::sleep(Duration::from_millis(1)).await,
                    Err(other) => panic!("rotator-{i}: unexpected refusal {other:?}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("rotator task");
    }
    assert_eq!(most_holders.load(Ordering::SeqCst), 1, "two tasks held the key at once");
    // Each tenure's tokens form one run, and runs do not interleave: sorted by their first
    // token, every run ends below the next one's start.
    let mut runs = issued.lock().expect("issued").clone();
    assert_eq!(runs.len(), TASKS * TENURES_EACH);
    runs.sort();
    for w in runs.windows(2) {
        assert!(w[0].last() < w[1].first(), "tenures interleaved: {:?} then {:?}", w[0], w[1]);
    }
    assert_eq!(held(&store, "hot").await, Some(None));
}

// ---------------------------------------------------------------------------------------
// Info (L7).
// ---------------------------------------------------------------------------------------

pub async fn info_is_none_for_a_never_seen_key_and_shows_only_the_live_grant(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    assert_eq!(info(&store, "k").await, None);
    let g = grant(&store, "k", &a, LONG_MS, 0).await;
    assert_eq!(held(&store, "k").await, Some(Some(g.clone())));
    assert_eq!(info(&store, "k-unrelated").await, None);
    assert_eq!(release(&store, "k", g.fencing_token).await, Ok(()));
    assert_eq!(held(&store, "k").await, Some(None), "released, but still seen");
    // A lapsed lease is not shown as held.
    let short = grant(&store, "k", &a, SHORT_MS, 0).await;
    wait_past(&store, short.expires_at_ms).await;
    assert_eq!(held(&store, "k").await, Some(None));
}

/// L7's judgement (C3-extensions E-22): how long a live grant has left and how long a
/// lock-delay still runs, on the store's own clock, and the floor every later token exceeds.
pub async fn info_judges_the_lease_left_the_lock_delay_left_and_the_token_floor(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let b = open(&store, "owner-b", LONG_MS).await;
    let g = grant(&store, "k", &a, LONG_MS, DELAY_MS).await;
    let i = info(&store, "k").await.expect("seen");
    let left = i.lease_left_ms.expect("a live grant has time left");
    assert!(left > 0 && left <= LONG_MS, "lease left {left} of {LONG_MS}");
    assert!(left > LONG_MS - 10_000, "lease left {left}: judged on the store's clock, just granted");
    assert_eq!(i.delay_left_ms, None, "no lock-delay while held");
    assert!(i.token_floor >= g.fencing_token, "floor {} under the live token {}", i.token_floor, g.fencing_token);
    // A lapsed lease: nothing left, and its lock-delay runs, before the dead grant's removal
    // recorded it (the delay its removal will record) and after.
    let short = grant(&store, "k-lapsing", &a, SHORT_MS, DELAY_MS).await;
    wait_past(&store, short.expires_at_ms).await;
    for stage in ["stored dead", "removed"] {
        let i = info(&store, "k-lapsing").await.expect("seen");
        assert_eq!((&i.grant, i.lease_left_ms), (&None, None), "{stage}");
        match i.delay_left_ms {
            Some(delay) => assert!(delay > 0 && delay <= DELAY_MS, "{stage}: delay left {delay} of {DELAY_MS}"),
            // Only a machine stalled past the whole delay may see none.
            None => assert!(reached(&store, short.expires_at_ms + DELAY_MS).await, "{stage}: no lock-delay shown"),
        }
        if stage == "stored dead" {
            let refused = acquire(&store, "k-lapsing", &b, LONG_MS, DELAY_MS).await;
            let delayed = matches!(refused, Err(AcquireRefusal::Delayed { .. }));
            assert!(delayed || reached(&store, short.expires_at_ms + DELAY_MS).await, "{refused:?}");
        }
    }
    // The floor rises past every token issued since, on any key, and past a revoke's floor.
    let r = revoke(&store, "k", Some(g.fencing_token)).await.expect("revoked");
    let i = info(&store, "k").await.expect("seen");
    assert!(i.token_floor >= r.new_token_floor, "floor {} under the revoke's {}", i.token_floor, r.new_token_floor);
    assert_eq!((i.lease_left_ms, i.delay_left_ms), (None, None), "a revoke imposes no lock-delay");
    let next = grant(&store, "k-other", &b, LONG_MS, 0).await;
    assert!(next.fencing_token > i.token_floor, "token {} not above the floor read before it", next.fencing_token);
    assert!(info(&store, "k").await.expect("seen").token_floor >= next.fencing_token);
}

/// The keys of one page of held keys (C3-extensions E-23), in the order the store answered.
pub async fn held_keys(store: &Store, prefix: &str, after: Option<&str>, limit: usize) -> Vec<String> {
    let page = store.held_keys(prefix, after, limit, DELAY_MS).await.expect("held_keys");
    page.into_iter().map(|h| h.key).collect()
}

/// The list of held keys (C3-extensions E-23): the keys with a stored grant, live or dead
/// and not yet removed, in bytewise key order under a prefix, paged after a key, each judged
/// as L7 judges it; a released or revoked key is not listed, a lapsed one until its removal.
pub async fn list_pages_the_held_keys_in_key_order_each_judged_as_l7_judges_it(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let b = open(&store, "owner-b", LONG_MS).await;
    // Bytewise order, which no locale's collation keeps: `:` < `B` < `_` < `a` < `z`.
    for (i, key) in ["pay:b", "payz", "pay:a", "other:1", "pay_x", "pay:B", "pay:c"].into_iter().enumerate() {
        grant(&store, key, if i % 2 == 0 { &a } else { &b }, LONG_MS, DELAY_MS).await;
    }
    let released = grant(&store, "pay:released", &a, LONG_MS, DELAY_MS).await;
    assert_eq!(release(&store, "pay:released", released.fencing_token).await, Ok(()));
    let revoked = grant(&store, "pay:revoked", &b, LONG_MS, DELAY_MS).await;
    revoke(&store, "pay:revoked", Some(revoked.fencing_token)).await.expect("revoked");
    let lapsing = grant(&store, "pay:lapsing", &a, SHORT_MS, DELAY_MS).await;
    wait_past(&store, lapsing.expires_at_ms).await;

    let pay = ["pay:B", "pay:a", "pay:b", "pay:c", "pay:lapsing"];
    assert_eq!(held_keys(&store, "pay:", None, 100).await, pay, "the prefix, in bytewise order");
    assert_eq!(held_keys(&store, "pay:", Some("a"), 100).await, pay, "a cursor before the prefix");
    let mut all = vec!["other:1"];
    all.extend(pay);
    all.extend(["pay_x", "payz"]);
    assert_eq!(held_keys(&store, "", None, 100).await, all, "every key with a stored grant");
    // Pages of two: each after the last key of the one before, to the end and past it.
    let mut paged = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = held_keys(&store, "pay", after.as_deref(), 2).await;
        assert!(page.len() <= 2, "a page of {} keys", page.len());
        let Some(last) = page.last().cloned() else { break };
        paged.extend(page);
        after = Some(last);
    }
    assert_eq!(paged, all[1..], "the pages of `pay` join into the prefix's keys, each once");
    assert_eq!(held_keys(&store, "pay:", Some("pay;"), 100).await, Vec::<String>::new(), "past the prefix");

    // Each key is judged as L7 judges it: the live grant, its lease left, the lapsed
    // grant's lock-delay, the floor.
    let page = store.held_keys("", None, 100, DELAY_MS).await.expect("held_keys");
    for h in &page {
        let i = info(&store, &h.key).await.expect("a listed key is seen");
        assert_eq!(h.info.grant, i.grant, "{}: the grant", h.key);
        assert!(h.info.token_floor <= i.token_floor, "{}: the floor went back", h.key);
        if let Some(g) = &h.info.grant {
            assert!(g.fencing_token <= h.info.token_floor, "{}: token above the floor", h.key);
        }
        match (h.info.lease_left_ms, i.lease_left_ms) {
            (Some(listed), Some(read)) => assert!(listed >= read && listed <= LONG_MS, "{}: lease {listed}", h.key),
            (listed, read) => assert_eq!(listed, read, "{}: the lease left", h.key),
        }
    }
    let dead = page.iter().find(|h| h.key == "pay:lapsing").expect("listed until removed");
    assert_eq!((&dead.info.grant, dead.info.lease_left_ms), (&None, None), "a lapsed grant is not held");
    match dead.info.delay_left_ms {
        Some(delay) => assert!(delay > 0 && delay <= DELAY_MS, "delay left {delay} of {DELAY_MS}"),
        None => assert!(reached(&store, lapsing.expires_at_ms + DELAY_MS).await, "no lock-delay shown"),
    }
    assert!(page
        .iter()
        .filter(|h| h.key != "pay:lapsing")
        .all(|h| h.info.grant.is_some() && h.info.delay_left_ms.is_none()));
    // Removed, the lapsed grant is no longer listed; the key is still seen (L7).
    reap(&store, 100, DELAY_MS, KEEP_MS).await;
    assert_eq!(held_keys(&store, "pay:", None, 100).await, pay[..4], "a removed grant is not listed");
    assert_eq!(held(&store, "pay:lapsing").await, Some(None));
}

// ---------------------------------------------------------------------------------------
// Revoke (L8).
// ---------------------------------------------------------------------------------------

pub async fn revoke_of_a_key_without_a_live_grant_is_not_held(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    assert_eq!(revoke(&store, "never", None).await, Err(RevokeRefusal::NotHeld));
    assert_eq!(revoke(&store, "never", Some(7)).await, Err(RevokeRefusal::NotHeld), "not Stale: nothing is held");
    let g = grant(&store, "k-released", &a, LONG_MS, 0).await;
    assert_eq!(release(&store, "k-released", g.fencing_token).await, Ok(()));
    assert_eq!(revoke(&store, "k-released", None).await, Err(RevokeRefusal::NotHeld));
    let short = grant(&store, "k-lapsed", &a, SHORT_MS, 0).await;
    wait_past(&store, short.expires_at_ms).await;
    assert_eq!(revoke(&store, "k-lapsed", Some(short.fencing_token)).await, Err(RevokeRefusal::NotHeld));
    assert!(grant(&store, "k-next", &a, LONG_MS, 0).await.fencing_token > short.fencing_token);
}

pub async fn revoke_with_a_stale_expected_token_is_refused_and_leaves_the_grant(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let g = grant(&store, "k", &a, LONG_MS, 0).await;
    let t = g.fencing_token;
    assert_eq!(revoke(&store, "k", Some(t + 1)).await, Err(RevokeRefusal::Stale { current_token: t }));
    assert_eq!(revoke(&store, "k", Some(t - 1)).await, Err(RevokeRefusal::Stale { current_token: t }));
    assert_eq!(live_grant(&store, "k").await, Some(g.clone()));
    renew(&store, "k", &a, t, LONG_MS).await.expect("the holder still holds");
    assert_eq!(revoke(&store, "k", Some(t)).await.map(|r| r.revoked_token), Ok(t));
}

pub async fn revoke_removes_the_grant_and_raises_the_token_floor(store: Store) {
    let a = open(&store, "owner-a", LONG_MS).await;
    let b = open(&store, "owner-b", LONG_MS).await;
    let g = grant(&store, "k", &a, LONG_MS, DELAY_MS).await;
    let revocation_id = id();
    let r = store
        .revoke("k", "oncall@example", "worker wedged mid-payout", Some(g.fencing_token), revocation_id)
        .await
        .expect("revoke")
        .expect("revoked");
    assert_eq!((r.revoked_token, r.revocation_id), (g.fencing_token, revocation_id));
    assert!(r.new_token_floor > r.revoked_token, "floor {} must exceed {}", r.new_token_floor, r.revoked_token);
    // The grant is gone; the evicted holder can neither renew nor release it.
    assert_eq!(held(&store, "k").await, Some(None));
    assert_eq!(renew(&store, "k", &a, g.fencing_token, LONG_MS).await, Err(RenewRefusal::Lost { stored_token: None }));
    assert_eq!(release(&store, "k", g.fencing_token).await, Err(None));
    assert_eq!(heartbeat(&store, a.session_id).await.map(|(_, n)| n), Ok(0), "its session lives on, holding nothing");
    // The next grant, on any key, exceeds the floor (no lock-delay after a revoke).
    let next = grant(&store, "k", &b, LONG_MS, DELAY_MS).await;
    assert!(next.fencing_token > r.new_token_floor, "next {} vs floor {}", next.fencing_token, r.new_token_floor);
    // Revoke without a CAS guard; the floor only rises.
    let r2 = revoke(&store, "k", None).await.expect("revoked");
    assert_eq!(r2.revoked_token, next.fencing_token);
    assert!(r2.new_token_floor > r2.revoked_token && r2.new_token_floor > r.new_token_floor);
    let other = grant(&store, "k-other", &a, LONG_MS, 0).await;
    assert!(other.fencing_token > r2.new_token_floor);
}

// ---------------------------------------------------------------------------------------
// Reaper.
// ---------------------------------------------------------------------------------------

pub async fn reaper_marks_lapsed_sessions_and_removes_their_grants(store: Store) {
    let lapsing = open(&store, "owner-a", SHORT_MS).await;
    let live = open(&store, "owner-b", LONG_MS).await;
    grant(&store, "k1", &lapsing, LONG_MS, 0).await;
    grant(&store, "k2", &lapsing, LONG_MS, 0).await;
    let kept = grant(&store, "k-live", &live, LONG_MS, 0).await;
    wait_past(&store, lapsing.expires_at_ms).await;
    assert_eq!(
        reap(&store, 100, 0, KEEP_MS).await,
        ReapReport { expired_sessions: 1, released_grants: 2, forgotten_sessions: 0 }
    );
    assert_eq!(heartbeat(&store, lapsing.session_id).await, Err(SessionRefusal::Expired), "marked, remembered");
    assert_eq!(held(&store, "k1").await, Some(None));
    assert_eq!(release(&store, "k1", 1).await, Err(None), "the reaper removed the row");
    // The live session and its grant are untouched.
    assert_eq!(live_grant(&store, "k-live").await, Some(kept));
    assert_eq!(heartbeat(&store, live.session_id).await.map(|(_, n)| n), Ok(1));
    // Reaped without delay: free at once.
    grant(&store, "k1", &live, LONG_MS, 0).await;
    grant(&store, "k2", &live, LONG_MS, 0).await;
}

pub async fn reaper_removes_grants_whose_own_lease_lapsed(store: Store) {
    let s = open(&store, "owner-a", LONG_MS).await;
    let short = grant(&store, "k-short", &s, SHORT_MS, 0).await;
    let kept = grant(&store, "k-long", &s, LONG_MS, 0).await;
    wait_past(&store, short.expires_at_ms).await;
    assert_eq!(
        reap(&store, 100, 0, KEEP_MS).await,
        ReapReport { expired_sessions: 0, released_grants: 1, forgotten_sessions: 0 }
    );
    // The row is gone (not merely dead): no stored token any more.
    assert_eq!(
        renew(&store, "k-short", &s, short.fencing_token, LONG_MS).await,
        Err(RenewRefusal::Lost { stored_token: None })
    );
    assert_eq!(release(&store, "k-short", short.fencing_token).await, Err(None));
    assert_eq!(live_grant(&store, "k-long").await, Some(kept));
    assert_eq!(heartbeat(&store, s.session_id).await.map(|(_, n)| n), Ok(1));
}

pub async fn reaper_records_lock_delay_for_the_grants_it_removes(store: Store) {
    let lapsing = open(&store, "owner-a", SHORT_MS).await;
    let holder = open(&store, "owner-b", LONG_MS).await;
    let taker = open(&store, "owner-c", LONG_MS).await;
    let by_session = grant(&store, "k-session", &lapsing, LONG_MS, DELAY_MS).await;
    let by_lease = grant(&store, "k-lease", &holder, SHORT_MS, DELAY_MS).await;
    wait_past(&store, lapsing.expires_at_ms.max(by_lease.expires_at_ms)).await;
    assert_eq!(
        reap(&store, 100, DELAY_MS, KEEP_MS).await,
        ReapReport { expired_sessions: 1, released_grants: 2, forgotten_sessions: 0 }
    );
    let session_died = by_session.expires_at_ms.min(lapsing.expires_at_ms);
    let mut delayed = Vec::new();
    for (key, died_at) in [("k-session", session_died), ("k-lease", by_lease.expires_at_ms)] {
        let until = assert_delayed_from(&acquire(&store, key, &taker, LONG_MS, DELAY_MS).await, died_at, key);
        delayed.push((key, until));
    }
    for (key, until) in delayed {
        let (next, refusals) = wait_granted(&store, key, &taker, LONG_MS, DELAY_MS).await;
        assert!(refusals.iter().all(|r| *r == AcquireRefusal::Delayed { until_ms: until }), "{key}: {refusals:?}");
        assert!(next.acquired_at_ms >= until, "{key}: granted at {} before {until}", next.acquired_at_ms);
    }
}

pub async fn reaper_respects_its_limit(store: Store) {
    // Three lapsed sessions with one grant each, and a live session with three lapsed leases.
    let mut lapsing = Vec::new();
    for i in 0..3 {
        let s = open(&store, &format!("owner-{i}"), SHORT_MS).await;
        grant(&store, &format!("k-session-{i}"), &s, LONG_MS, 0).await;
        lapsing.push(s);
    }
    let live = open(&store, "owner-live", LONG_MS).await;
    let mut last_lease = 0;
    for i in 0..3 {
        last_lease = grant(&store, &format!("k-lease-{i}"), &live, SHORT_MS, 0).await.expires_at_ms;
    }
    let last_session = lapsing.iter().map(|s| s.expires_at_ms).max().expect("three sessions");
    wait_past(&store, last_session.max(last_lease)).await;
    // Limit 1: each pass does at most one row of each kind; passes continue until done.
    let mut total = ReapReport::default();
    let mut passes = 0;
    loop {
        let r = reap(&store, 1, 0, KEEP_MS).await;
        if r == ReapReport::default() {
            break;
        }
        passes += 1;
        assert!(passes <= 10, "reaper never finished: {total:?}");
        assert!(r.expired_sessions <= 1 && r.forgotten_sessions == 0, "pass {passes}: {r:?}");
        // A marked session's own grant plus at most one lapsed lease.
        assert!(r.released_grants <= 2, "pass {passes}: {r:?}");
        total.expired_sessions += r.expired_sessions;
        total.released_grants += r.released_grants;
    }
    assert_eq!((total.expired_sessions, total.released_grants), (3, 6), "{passes} passes");
    assert!(passes >= 3, "limit 1 cannot mark three sessions in {passes} passes");
    // Forgetting is limited too.
    let mut forgotten = 0;
    let mut passes = 0;
    loop {
        let r = reap(&store, 1, 0, 0).await;
        if r == ReapReport::default() {
            break;
        }
        passes += 1;
        assert!(passes <= 10, "reaper never finished forgetting");
        assert_eq!((r.expired_sessions, r.released_grants), (0, 0), "{r:?}");
        assert!(r.forgotten_sessions <= 1, "{r:?}");
        forgotten += r.forgotten_sessions;
    }
    assert_eq!((forgotten, passes), (3, 3));
    for s in &lapsing {
        assert_eq!(heartbeat(&store, s.session_id).await, Err(SessionRefusal::Unknown));
    }
    assert_eq!(heartbeat(&store, live.session_id).await.map(|(_, n)| n), Ok(0));
}

/// A lapsed session holding a grant, a live session with a lapsed and a live lease.
async fn reaper_fixture(store: &Store, tag: &str) -> (SessionRow, SessionRow, GrantRow) {
    let lapsing = open(store, &format!("{tag}-lapsing"), SHORT_MS).await;
    let live = open(store, &format!("{tag}-live"), LONG_MS).await;
    grant(store, &format!("{tag}-k-session"), &lapsing, LONG_MS, 0).await;
    let short = grant(store, &format!("{tag}-k-lease"), &live, SHORT_MS, 0).await;
    let kept = grant(store, &format!("{tag}-k-live"), &live, LONG_MS, 0).await;
    wait_past(store, lapsing.expires_at_ms.max(short.expires_at_ms)).await;
    (lapsing, live, kept)
}

async fn assert_reaped_state(store: &Store, tag: &str, lapsing: &SessionRow, live: &SessionRow, kept: &GrantRow) {
    assert_eq!(heartbeat(store, lapsing.session_id).await, Err(SessionRefusal::Expired));
    assert_eq!(heartbeat(store, live.session_id).await.map(|(_, n)| n), Ok(1));
    for key in [format!("{tag}-k-session"), format!("{tag}-k-lease")] {
        assert_eq!(held(store, &key).await, Some(None), "{key}");
        assert_eq!(release(store, &key, kept.fencing_token).await, Err(None), "{key}: row removed");
    }
    assert_eq!(live_grant(store, &format!("{tag}-k-live")).await.as_ref(), Some(kept));
}

pub async fn reaper_is_idempotent(store: Store) {
    let (lapsing, live, kept) = reaper_fixture(&store, "t").await;
    assert_eq!(
        reap(&store, 100, 0, KEEP_MS).await,
        ReapReport { expired_sessions: 1, released_grants: 2, forgotten_sessions: 0 }
    );
    assert_eq!(reap(&store, 100, 0, KEEP_MS).await, ReapReport::default());
    assert_eq!(reap(&store, 100, DELAY_MS, KEEP_MS).await, ReapReport::default());
    assert_reaped_state(&store, "t", &lapsing, &live, &kept).await;
}

pub async fn concurrent_reaper_passes_leave_the_same_final_state(store: Store) {
    let mut fixtures = Vec::new();
    for tag in ["a", "b", "c"] {
        fixtures.push((tag, reaper_fixture(&store, tag).await));
    }
    let (r1, r2) = tokio::join!(store.reap(100, 0, KEEP_MS), store.reap(100, 0, KEEP_MS));
    let (r1, r2) = (r1.expect("reap"), r2.expect("reap"));
    // Every row is reaped exactly once between the two passes.
    assert_eq!(
        (r1.expired_sessions + r2.expired_sessions, r1.released_grants + r2.released_grants),
        (3, 6),
        "{r1:?} + {r2:?}"
    );
    assert_eq!(r1.forgotten_sessions + r2.forgotten_sessions, 0);
    assert_eq!(reap(&store, 100, 0, KEEP_MS).await, ReapReport::default());
    for (tag, (lapsing, live, kept)) in &fixtures {
        assert_reaped_state(&store, tag, lapsing, live, kept).await;
    }
    // Concurrent forgetting, too.
    let (f1, f2) = tokio::join!(store.reap(100, 0, 0), store.reap(100, 0, 0));
    let (f1, f2) = (f1.expect("reap"), f2.expect("reap"));
    assert_eq!(f1.forgotten_sessions + f2.forgotten_sessions, 3, "{f1:?} + {f2:?}");
    for (_, (lapsing, live, _)) in &fixtures {
        assert_eq!(heartbeat(&store, lapsing.session_id).await, Err(SessionRefusal::Unknown));
        assert_eq!(heartbeat(&store, live.session_id).await.map(|(_, n)| n), Ok(1));
    }
}

// ---------------------------------------------------------------------------------------
// Concurrency (invariants 1 and 2).
// ---------------------------------------------------------------------------------------

pub async fn racing_acquirers_of_one_key_get_exactly_one_grant(store: Store) {
    const RACERS: usize = 16;
    let mut sessions = Vec::new();
    for i in 0..RACERS {
        sessions.push(open(&store, &format!("racer-{i}"), LONG_MS).await);
    }
    let start = Arc::new(tokio::sync::Barrier::new(RACERS));
    let mut tasks = Vec::new();
    for s in sessions {
        let (store, start) = (store.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            store.acquire("hot", s.session_id, LONG_MS, 0).await.expect("acquire")
        }));
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.expect("racer task"));
    }
    let winners: Vec<&GrantRow> = outcomes.iter().filter_map(|o| o.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1, "{outcomes:?}");
    let winner = winners[0].clone();
    for o in &outcomes {
        if let Err(r) = o {
            assert_eq!(
                *r,
                AcquireRefusal::Contended {
                    holder_owner_id: winner.owner_id.clone(),
                    expires_at_ms: winner.expires_at_ms
                }
            );
        }
    }
    assert_eq!(live_grant(&store, "hot").await, Some(winner));
}

#[derive(Debug, Clone, Copy)]
struct Tenure {
    token: i64,
    /// Global event sequence numbers: the store granted between `acquire_called` and
    /// `acquire_returned`, and released between `release_called` and `release_returned`.
    acquire_returned: u64,
    release_called: u64,
}

pub async fn racing_acquire_release_cycles_never_overlap_and_tokens_increase(store: Store) {
    const TASKS: usize = 4;
    const GRANTS_EACH: usize = 10;
    let seq = Arc::new(AtomicU64::new(0));
    let holders = Arc::new(AtomicI64::new(0));
    let most_holders = Arc::new(AtomicI64::new(0));
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let s = open(&store, &format!("cycler-{i}"), LONG_MS).await;
        let (store, seq, holders, most_holders) = (store.clone(), seq.clone(), holders.clone(), most_holders.clone());
        tasks.push(tokio::spawn(async move {
            let mut tenures = Vec::new();
            let started = dlock_rt::Instant::now();
            while tenures.len() < GRANTS_EACH {
                assert!(started.elapsed() < DEADLINE, "cycler-{i} starved: {} grants", tenures.len());
                match store.acquire("hot", s.session_id, LONG_MS, 0).await.expect("acquire") {
                    Ok(g) => {
                        let acquire_returned = seq.fetch_add(1, Ordering::SeqCst);
                        let now_holding = holders.fetch_add(1, Ordering::SeqCst) + 1;
                        most_holders.fetch_max(now_holding, Ordering::SeqCst);
                        // Hold the key for a moment (the critical section), then let go.
                        dlock_rt::sleep(Duration::from_millis(1)).await;
                        holders.fetch_sub(1, Ordering::SeqCst);
                        let release_called = seq.fetch_add(1, Ordering::SeqCst);
                        let released = store.release("hot", g.fencing_token).await.expect("release");
                        assert_eq!(released, Ok(()), "cycler-{i} could not release its own live grant");
                        tenures.push(Tenure { token: g.fencing_token, acquire_returned, release_called });
                    }
                    Err(AcquireRefusal::Contended { .. }) => {
                        // Back off before retrying (a retry pace, not a wait for an event).
                        dlock_rt::sleep(Duration::from_millis(1)).await;
                    }
                    Err(other) => panic!("cycler-{i}: unexpected refusal {other:?}"),
                }
            }
            tenures
        }));
    }
    let mut tenures = Vec::new();
    for t in tasks {
        tenures.extend(t.await.expect("cycler task"));
    }
    assert_eq!(tenures.len(), TASKS * GRANTS_EACH);
    assert_eq!(most_holders.load(Ordering::SeqCst), 1, "two tasks held the key at once");
    // In the order the store granted them, tokens strictly increase and each grant came after
    // the previous one's release began. (The grant instants may go back by a few ms on a real
    // database: a transaction reads `now` when it starts and may commit after a shorter
    // one. A stale `now` only ever shortens a lease, so it is safe, and not promised.)
    tenures.sort_by_key(|t| t.acquire_returned);
    for w in tenures.windows(2) {
        let (prev, next) = (w[0], w[1]);
        assert!(next.token > prev.token, "token {} granted after {}", next.token, prev.token);
        assert!(
            prev.release_called < next.acquire_returned,
            "grant {} was handed out before grant {} was released: {prev:?} {next:?}",
            next.token,
            prev.token
        );
    }
    assert_eq!(held(&store, "hot").await, Some(None));
}

// ---------------------------------------------------------------------------------------
// The event outbox (C3-extensions E-20; `dlock_lock_server::store::events`).
// ---------------------------------------------------------------------------------------

/// One event as a case expects it: kind, lock key, body.
pub type Expected = (EventKind, Option<String>, serde_json::Value);

/// The event of a grant `(key, token)` of `session`.
pub fn grant_event(kind: EventKind, key: &str, token: i64, session: &SessionRow) -> Expected {
    let body = serde_json::json!({
        "key": key, "token": token, "sessionId": session.session_id.to_string(), "ownerId": session.owner_id,
    });
    (kind, Some(key.to_owned()), body)
}

/// The events committed since `head`, all of them (the read pages until it is caught up),
/// and the new head. Every event's `lock_key` is set exactly on the lock kinds, and no
/// event carries an account or a payout.
pub async fn events_since(store: &Store, head: i64) -> (Vec<Expected>, i64) {
    let mut head = head;
    let mut out = Vec::new();
    loop {
        let r = store.read_events(head, 3).await.expect("read_events");
        assert!(r.head >= head, "the head went back from {head} to {}", r.head);
        for e in &r.events {
            assert!(e.seq > head && e.seq <= r.head, "seq {} outside ({head}, {}]", e.seq, r.head);
            assert_eq!(e.lock_key.is_some(), e.kind.as_str().starts_with("lock."), "{e:?}");
            assert!(e.account_id.is_none() && e.payout_id.is_none(), "{e:?}");
            assert!(e.kind.is_lock(), "{e:?}");
            head = e.seq;
            out.push((e.kind, e.lock_key.clone(), e.body.clone()));
        }
        if r.events.is_empty() {
            return (out, r.head);
        }
        head = r.head;
    }
}

/// Runs `op`, then asserts it recorded exactly `want`, in order; returns the new head.
#[track_caller]
pub fn assert_recorded(what: &str, got: &[Expected], want: &[Expected]) {
    assert_eq!(got, want, "{what}: recorded events");
}

pub async fn every_operation_records_its_events_in_its_own_step_in_one_sequence(store: Store) {
    use EventKind::*;
    let (none, mut head) = events_since(&store, 0).await;
    assert!(none.is_empty(), "a fresh store has no events: {none:?}");
    let s1 = open(&store, "owner-a", LONG_MS).await;
    let (got, h) = events_since(&store, head).await;
    let opened = serde_json::json!({ "sessionId": s1.session_id.to_string(), "ownerId": "owner-a", "ttlMs": LONG_MS });
    assert_recorded("open", &got, &[(SessionOpened, None, opened)]);
    head = h;
    let g1 = grant(&store, "ev-a", &s1, LONG_MS, 0).await;
    let (got, h) = events_since(&store, head).await;
    assert_recorded("acquire", &got, &[grant_event(LockGranted, "ev-a", g1.fencing_token, &s1)]);
    head = h;
    renew(&store, "ev-a", &s1, g1.fencing_token, LONG_MS).await.expect("renewed");
    let (got, h) = events_since(&store, head).await;
    assert_recorded("renew", &got, &[grant_event(LockRenewed, "ev-a", g1.fencing_token, &s1)]);
    head = h;
    let g2 = rotate(&store, "ev-a", &s1, g1.fencing_token, LONG_MS, 0).await.expect("rotated");
    let (got, h) = events_since(&store, head).await;
    let want = [
        grant_event(LockReleased, "ev-a", g1.fencing_token, &s1),
        grant_event(LockGranted, "ev-a", g2.fencing_token, &s1),
    ];
    assert_recorded("rotate", &got, &want);
    head = h;
    release(&store, "ev-a", g2.fencing_token).await.expect("released");
    let (got, h) = events_since(&store, head).await;
    assert_recorded("release", &got, &[grant_event(LockReleased, "ev-a", g2.fencing_token, &s1)]);
    head = h;
    let g3 = grant(&store, "ev-b", &s1, LONG_MS, 0).await;
    let revocation_id = id();
    let rv = store
        .revoke("ev-b", "oncall@example", "stuck holder, revoking", Some(g3.fencing_token), revocation_id)
        .await
        .expect("revoke")
        .expect("revoked");
    let (got, h) = events_since(&store, head).await;
    let (kind, key, mut body) = grant_event(LockRevoked, "ev-b", g3.fencing_token, &s1);
    if let Some(o) = body.as_object_mut() {
        o.insert("newTokenFloor".into(), serde_json::json!(rv.new_token_floor));
        o.insert("revocationId".into(), serde_json::json!(revocation_id.to_string()));
        o.insert("operator".into(), serde_json::json!("oncall@example"));
        o.insert("reason".into(), serde_json::json!("stuck holder, revoking"));
    }
    assert_recorded(
        "acquire, revoke",
        &got,
        &[grant_event(LockGranted, "ev-b", g3.fencing_token, &s1), (kind, key, body)],
    );
    head = h;
    // A session that lapses with its grant: the reaper expires both, the grant first.
    let s2 = open(&store, "owner-b", SHORT_MS).await;
    let g4 = grant(&store, "ev-c", &s2, LONG_MS, 0).await;
    wait_past(&store, s2.expires_at_ms).await;
    reap(&store, 100, 0, KEEP_MS).await;
    let (got, h) = events_since(&store, head).await;
    let expired = serde_json::json!({ "sessionId": s2.session_id.to_string(), "ownerId": "owner-b" });
    let opened = serde_json::json!({ "sessionId": s2.session_id.to_string(), "ownerId": "owner-b", "ttlMs": SHORT_MS });
    let want = [
        (SessionOpened, None, opened),
        grant_event(LockGranted, "ev-c", g4.fencing_token, &s2),
        grant_event(LockExpired, "ev-c", g4.fencing_token, &s2),
        (SessionExpired, None, expired),
    ];
    assert_recorded("open, acquire, lapse, reap", &got, &want);
    head = h;
    // A close: the grant that had died expires, the live one is released.
    let s3 = open(&store, "owner-c", LONG_MS).await;
    let lost = grant(&store, "ev-d", &s3, SHORT_MS, 0).await;
    let live = grant(&store, "ev-e", &s3, LONG_MS, 0).await;
    wait_past(&store, lost.expires_at_ms).await;
    store.close_session(s3.session_id, 0).await.expect("close").expect("closed");
    let (got, h) = events_since(&store, head).await;
    let opened = serde_json::json!({ "sessionId": s3.session_id.to_string(), "ownerId": "owner-c", "ttlMs": LONG_MS });
    let want = [
        (SessionOpened, None, opened),
        grant_event(LockGranted, "ev-d", lost.fencing_token, &s3),
        grant_event(LockGranted, "ev-e", live.fencing_token, &s3),
        grant_event(LockExpired, "ev-d", lost.fencing_token, &s3),
        grant_event(LockReleased, "ev-e", live.fencing_token, &s3),
    ];
    assert_recorded("open, acquire twice, close", &got, &want);
    head = h;
    // An acquire over a dead grant: the grant it removes expires, then the new one.
    let g5 = grant(&store, "ev-f", &s1, SHORT_MS, 0).await;
    wait_past(&store, g5.expires_at_ms).await;
    let g6 = grant(&store, "ev-f", &s1, LONG_MS, 0).await;
    let (got, _) = events_since(&store, head).await;
    let want = [
        grant_event(LockGranted, "ev-f", g5.fencing_token, &s1),
        grant_event(LockExpired, "ev-f", g5.fencing_token, &s1),
        grant_event(LockGranted, "ev-f", g6.fencing_token, &s1),
    ];
    assert_recorded("acquire over a dead grant", &got, &want);
}

pub async fn a_refused_operation_records_no_event(store: Store) {
    let s1 = open(&store, "owner-a", LONG_MS).await;
    let s2 = open(&store, "owner-b", LONG_MS).await;
    let g = grant(&store, "ev-k", &s1, LONG_MS, 0).await;
    let (_, head) = events_since(&store, 0).await;
    assert!(acquire(&store, "ev-k", &s2, LONG_MS, 0).await.is_err(), "contended");
    assert!(acquire(&store, "ev-k", &s1, LONG_MS, 0).await.is_err(), "already held");
    assert!(store.acquire("ev-other", id(), LONG_MS, 0).await.expect("acquire").is_err(), "unknown session");
    assert!(renew(&store, "ev-k", &s1, g.fencing_token + 1, LONG_MS).await.is_err(), "wrong token");
    assert!(renew(&store, "ev-k", &s2, g.fencing_token, LONG_MS).await.is_err(), "another session");
    assert!(release(&store, "ev-k", g.fencing_token - 1).await.is_err(), "stale release");
    assert!(release(&store, "ev-never", 1).await.is_err(), "never granted");
    assert!(rotate(&store, "ev-k", &s2, g.fencing_token, LONG_MS, 0).await.is_err(), "another session's");
    assert!(revoke(&store, "ev-k", Some(g.fencing_token + 1)).await.is_err(), "stale expected token");
    assert!(revoke(&store, "ev-never", None).await.is_err(), "not held");
    assert!(heartbeat(&store, id()).await.is_err(), "unknown session");
    assert!(store.close_session(id(), 0).await.expect("close").is_err(), "unknown session");
    heartbeat(&store, s1.session_id).await.expect("a heartbeat records nothing either");
    let (got, h) = events_since(&store, head).await;
    assert!(got.is_empty(), "refusals recorded {got:?}");
    assert_eq!(h, head, "the head moved without an event");
}

pub async fn event_reads_page_in_seq_order_and_the_head_is_final(store: Store) {
    for i in 0..5 {
        open(&store, &format!("owner-{i}"), LONG_MS).await;
    }
    let first = store.read_events(0, 2).await.expect("read");
    assert_eq!(first.events.len(), 2);
    assert_eq!(first.head, first.events[1].seq, "a full page ends at its last event");
    let rest = store.read_events(first.head, 100).await.expect("read");
    assert_eq!(rest.events.len(), 3);
    let seqs: Vec<i64> = first.events.iter().chain(&rest.events).map(|e| e.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "seqs in commit order: {seqs:?}");
    let owners: Vec<&str> =
        first.events.iter().chain(&rest.events).filter_map(|e| e.body["ownerId"].as_str()).collect();
    assert_eq!(owners, ["owner-0", "owner-1", "owner-2", "owner-3", "owner-4"], "commit order");
    assert_eq!(rest.head, seqs[4]);
    let caught_up = store.read_events(rest.head, 100).await.expect("read");
    assert!(caught_up.events.is_empty());
    assert_eq!(caught_up.head, rest.head, "a caught-up read keeps its head");
    assert_eq!(caught_up.purged_through, 0);
}

pub async fn purge_keeps_the_newest_events_marks_what_it_deleted_and_never_reuses_a_seq(store: Store) {
    for i in 0..6 {
        open(&store, &format!("owner-{i}"), LONG_MS).await;
    }
    let all = store.read_events(0, 100).await.expect("read").events;
    assert_eq!(all.len(), 6);
    assert_eq!(store.purge_events(2).await.expect("purge"), 4);
    let kept = store.read_events(0, 100).await.expect("read");
    assert_eq!(kept.purged_through, all[3].seq, "the mark is the highest seq deleted");
    assert_eq!(kept.events, all[4..].to_vec(), "the newest two are kept as they were");
    assert_eq!(store.purge_events(2).await.expect("purge"), 0, "nothing more to purge");
    open(&store, "owner-late", LONG_MS).await;
    let late = store.read_events(all[5].seq, 100).await.expect("read").events;
    assert_eq!(late.len(), 1);
    assert!(late[0].seq > all[5].seq, "a seq is never reused after a purge");
    assert_eq!(store.read_events(0, 100).await.expect("read").purged_through, all[3].seq);
}

/// Declares one `#[tokio::test]` per case for a backend. `$make` is an async expression that
/// yields `(Arc<dyn LockStore>, guard)`; the guard (a temp dir, a database handle) lives as
/// long as the test. Every case gets a fresh store.
#[macro_export]
macro_rules! lock_store_conformance {
    ($backend:ident, $make:expr) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;
            use super::conformance as c;
            $crate::lock_store_conformance!(@cases $make;
                ping_answers_and_the_store_clock_does_not_run_backwards,
                open_session_stores_owner_and_ttl_and_expires_one_ttl_ahead,
                heartbeat_extends_a_live_session_past_its_first_expiry,
                heartbeat_counts_only_the_sessions_live_grants,
                heartbeat_and_close_of_a_never_opened_session_are_unknown,
                heartbeat_of_a_lapsed_session_is_expired_and_does_not_revive_it,
                reaper_forgets_an_expired_session_after_retention_then_it_is_unknown,
                close_forgets_the_session_and_releases_its_grants_without_lock_delay,
                close_of_a_lapsed_session_keeps_the_lock_delay_of_its_lost_grants,
                acquire_grants_a_fresh_token_to_a_live_session,
                acquire_by_another_session_is_contended_with_the_holder_and_its_expiry,
                acquire_by_the_holding_session_is_already_held_not_reentrant,
                acquire_by_an_expired_session_is_refused_even_when_the_key_is_free,
                acquire_by_an_unknown_session_is_refused,
                lapsed_lease_frees_the_key_for_another_session,
                lapsed_session_frees_the_key_for_another_session,
                lapsed_lease_imposes_lock_delay_until_death_plus_delay,
                lapsed_session_imposes_lock_delay_from_the_session_expiry,
                release_close_and_revoke_impose_no_lock_delay,
                tokens_strictly_increase_across_keys_and_sessions_and_are_never_reused,
                renew_extends_the_lease_and_keeps_the_token,
                renew_refuses_a_wrong_token_another_session_or_a_dead_grant_as_lost,
                renew_by_an_expired_or_unknown_session_is_a_session_refusal,
                release_is_compare_and_delete_on_key_and_token,
                stale_release_never_frees_the_newer_holders_grant,
                release_of_a_never_granted_key_is_none,
                release_of_a_dead_grant_is_refused,
                rotate_replaces_the_holders_grant_with_a_greater_token_in_one_step,
                rotate_of_a_wrong_token_another_sessions_or_a_dead_grant_is_lost_and_grants_nothing,
                rotate_by_an_expired_or_unknown_session_is_a_session_refusal,
                a_rotated_grant_that_lapses_imposes_the_lock_delay_like_any_grant,
                racing_rotates_and_acquirers_never_overlap_and_tokens_increase,
                info_is_none_for_a_never_seen_key_and_shows_only_the_live_grant,
                info_judges_the_lease_left_the_lock_delay_left_and_the_token_floor,
                list_pages_the_held_keys_in_key_order_each_judged_as_l7_judges_it,
                revoke_of_a_key_without_a_live_grant_is_not_held,
                revoke_with_a_stale_expected_token_is_refused_and_leaves_the_grant,
                revoke_removes_the_grant_and_raises_the_token_floor,
                reaper_marks_lapsed_sessions_and_removes_their_grants,
                reaper_removes_grants_whose_own_lease_lapsed,
                reaper_records_lock_delay_for_the_grants_it_removes,
                reaper_respects_its_limit,
                reaper_is_idempotent,
                concurrent_reaper_passes_leave_the_same_final_state,
                racing_acquirers_of_one_key_get_exactly_one_grant,
                racing_acquire_release_cycles_never_overlap_and_tokens_increase,
                every_operation_records_its_events_in_its_own_step_in_one_sequence,
                a_refused_operation_records_no_event,
                event_reads_page_in_seq_order_and_the_head_is_final,
                purge_keeps_the_newest_events_marks_what_it_deleted_and_never_reuses_a_seq
            );
        }
    };
    (@cases $make:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                c::run_case(|| $make, c::$case).await;
            }
        )*
    };
}
