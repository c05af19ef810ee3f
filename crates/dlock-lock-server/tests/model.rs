//! Model-based test of the lock store (DL-100, DL-181): random sequences of session open,
//! heartbeat, close, acquire, renew, release, rotate (C3-extensions E-18), revoke, info, lease
//! expiry (time advances) and restart,
//! driven against the real store and against a small reference model, compared after every
//! step.
//!
//! **Level: the `LockStore` trait** (the backend plus `rules.rs`, which every store calls),
//! not the `LockServer`. Leases are judged by the *backend's* clock (`store.rs`), which the
//! service cannot move; the store level is the one where time can be controlled
//! deterministically:
//! - **SQLite** (normal cfg; a temp-file database, so a restart can re-open it): the
//!   database clock is real time, so "advance time by `d`" shifts every stored instant
//!   (session, grant and key-record times, revocation stamps) back by `d`, which is the same
//!   as the clock jumping forward by `d`. Model time runs in units of [`UNIT_MS`], far longer
//!   than a whole case takes in real time, so the real milliseconds that pass between two
//!   steps can never move a lease across a unit boundary. A **restart** drops the pool and
//!   re-opens the database (`SqliteLockStore::open`, migrations included), as a lock-server
//!   restart over the same lockdb does.
//! - **The simulation store** (`MemLockStore`, `--cfg madsim` only: outside the simulation
//!   its clock is the host's wall clock, which nothing can move): time advances by sleeping
//!   in virtual time. A restart rebuilds nothing: the simulation store *is* the backend that
//!   outlives every lock-server node, so a node restart leaves it as it was.
//!
//! ## What is checked after every step
//! - Every answer equals the model's (grant or the exact refusal, the exact token, the held
//!   count of a heartbeat, the stored token a refused renew or release reports).
//! - `info` of every key equals the model's live grant: at most one live grant per key.
//! - Tokens are one global sequence: every grant's token is strictly greater than every
//!   token issued before it (on any key, across restarts) and than the revoke floor, so a
//!   revoked key's next token is above its floor.
//! - A renew after the lease or the session lapsed is refused; a release or renew with a
//!   token that is not the live holder's is refused and changes nothing.
//!
//! Lock-delay is 0 here (the rules-level model in `rules.rs` and the conformance suite cover
//! it); the reaper is not driven (expired sessions stay remembered, answering `Expired`).
//!
//! Bounded for CI: [`CASES_PER_BACKEND`] cases of at most [`OPS_PER_CASE_MAX`] steps each,
//! from a fixed proptest seed. A run that never reached one of the situations these
//! properties are about ([`Coverage`]) fails, so it cannot pass vacuously.
//!
//! It can fail: [`the_model_checker_flags_wrong_answers`] feeds the checker wrong answers,
//! and under madsim `planted_lock_store_bugs_fail_the_model_test` plants lock-store bugs
//! (`grant-unexpired`, `revoke-keeps-floor`) that the run must find and shrink.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;

use dlock_lock_server::store::{AcquireRefusal, LockStore, RenewRefusal, RevokeRefusal, RotateRefusal, SessionRefusal};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use uuid::Uuid;

/// Random cases per backend.
const CASES_PER_BACKEND: u32 = 64;
/// Steps per case, at most.
const OPS_PER_CASE_MAX: usize = 40;
/// One model time unit in store milliseconds (much longer than a whole case runs).
const UNIT_MS: i64 = 600_000;
/// Session slots a case drives (each `Open` starts a fresh session in its slot).
const SLOTS: usize = 3;
/// Keys a case drives.
const KEYS: usize = 2;
/// Session ttls, in units: at least the lease ttls, so that a lease often lapses while its
/// session lives (the case where a renew must be refused by the lease alone).
const SESSION_TTL_UNITS: std::ops::Range<i64> = 2..9;
/// Lease ttls, in units.
const LEASE_TTL_UNITS: std::ops::Range<i64> = 1..4;
/// One `Advance`, in units, below this bound.
const ADVANCE_UNITS_MAX: i64 = 3;
/// The lock-delay every acquire and close passes.
const DELAY_MS: i64 = 0;

/// Which token a renew, release or revoke presents, relative to the key's stored grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pick {
    /// The stored grant's token (1 when none is stored).
    Current,
    /// One below it: an older grant's token, of this key or another.
    Older,
    /// A token never issued.
    Bogus,
}

#[derive(Debug, Clone)]
enum Op {
    Advance(i64),
    Open(usize, i64),
    Heartbeat(usize),
    Close(usize),
    Acquire(usize, usize, i64),
    Renew(usize, usize, Pick, i64),
    Release(usize, Pick),
    /// Rotate by the slot's session, presenting the picked token, for a lease of `ttl`.
    Rotate(usize, usize, Pick, i64),
    Revoke(usize, Option<Pick>),
    Restart,
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![3 => Just(Pick::Current), 1 => Just(Pick::Older), 1 => Just(Pick::Bogus)]
}

fn op() -> impl Strategy<Value = Op> {
    let slot = 0..SLOTS;
    let key = 0..KEYS;
    let ttl = LEASE_TTL_UNITS;
    prop_oneof![
        3 => (1..ADVANCE_UNITS_MAX).prop_map(Op::Advance),
        1 => (slot.clone(), SESSION_TTL_UNITS).prop_map(|(s, t)| Op::Open(s, t)),
        2 => slot.clone().prop_map(Op::Heartbeat),
        1 => slot.clone().prop_map(Op::Close),
        4 => (slot.clone(), key.clone(), ttl.clone()).prop_map(|(s, k, t)| Op::Acquire(s, k, t)),
        4 => (slot, key.clone(), pick(), ttl).prop_map(|(s, k, p, t)| Op::Renew(s, k, p, t)),
        2 => (key.clone(), pick()).prop_map(|(k, p)| Op::Release(k, p)),
        3 => (0..SLOTS, key.clone(), pick(), LEASE_TTL_UNITS).prop_map(|(s, k, p, t)| Op::Rotate(s, k, p, t)),
        1 => (key, proptest::option::of(pick())).prop_map(|(k, p)| Op::Revoke(k, p)),
        1 => Just(Op::Restart),
    ]
}

/// A case: every slot opens a session first (else most steps would name unknown sessions),
/// then random steps; [`OPS_PER_CASE_MAX`] in all.
fn ops() -> impl Strategy<Value = Vec<Op>> {
    let opens = proptest::collection::vec(SESSION_TTL_UNITS, SLOTS);
    (opens, proptest::collection::vec(op(), 1..=OPS_PER_CASE_MAX - SLOTS)).prop_map(|(ttls, rest)| {
        ttls.into_iter().enumerate().map(|(slot, ttl)| Op::Open(slot, ttl)).chain(rest).collect()
    })
}

/// An answer, normalised to what the model can predict exactly (no absolute instants:
/// lease lengths are reported relative to the store's own `now`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Done,
    Heartbeat(Result<i64, SessionRefusal>),
    Closed(Result<(), SessionRefusal>),
    /// Granted: token, holder session, lease length (ms).
    Acquire(Result<(i64, Uuid, i64), Refused>),
    /// Renewed: token, lease length (ms).
    Renew(Result<(i64, i64), RenewRefusal>),
    Release(Result<(), Option<i64>>),
    /// Rotated: the new token, lease length (ms).
    Rotate(Result<(i64, i64), RotateRefusal>),
    /// Revoked: revoked token, new floor.
    Revoke(Result<(i64, i64), RevokeRefusal>),
}

/// An acquire refusal without its absolute instants.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Refused {
    Session(SessionRefusal),
    Contended { holder: Uuid },
    AlreadyHeld { token: i64 },
    Delayed,
}

#[derive(Debug, Clone, Copy)]
struct MSession {
    ttl: i64,
    end: i64,
}

#[derive(Debug, Clone, Copy)]
struct MGrant {
    session: Uuid,
    token: i64,
    lease_end: i64,
}

/// The reference: what the store should hold, in model units.
#[derive(Debug, Default)]
struct Model {
    now: i64,
    /// Open or expired sessions (a closed one is gone: unknown).
    sessions: BTreeMap<Uuid, MSession>,
    /// The stored grant row of each key, live or dead, until release, revoke, close or a
    /// replacing acquire removes it.
    rows: BTreeMap<usize, MGrant>,
    /// Keys ever granted (`info` of any other key is `None`).
    seen: BTreeSet<usize>,
    last_issued: i64,
    floor: i64,
}

impl Model {
    fn session_check(&self, s: Uuid) -> Result<(), SessionRefusal> {
        match self.sessions.get(&s) {
            None => Err(SessionRefusal::Unknown),
            Some(m) if self.now < m.end => Ok(()),
            Some(_) => Err(SessionRefusal::Expired),
        }
    }

    fn live(&self, g: &MGrant) -> bool {
        self.now < g.lease_end && self.sessions.get(&g.session).is_some_and(|s| self.now < s.end)
    }

    fn live_grant(&self, key: usize) -> Option<MGrant> {
        self.rows.get(&key).copied().filter(|g| self.live(g))
    }

    fn presented(&self, key: usize, p: Pick) -> i64 {
        let current = self.rows.get(&key).map_or(1, |g| g.token);
        match p {
            Pick::Current => current,
            Pick::Older => current - 1,
            Pick::Bogus => current + 1_000_000,
        }
    }

    fn issue(&mut self) -> i64 {
        self.last_issued = self.last_issued.max(self.floor) + 1;
        self.last_issued
    }

    /// Applies `op` (with the session ids it names resolved) and returns the answer the
    /// store must give.
    fn step(&mut self, op: &Op, slot_id: impl Fn(usize) -> Uuid) -> Answer {
        match *op {
            Op::Advance(d) => {
                self.now += d;
                Answer::Done
            }
            Op::Restart => Answer::Done,
            Op::Open(slot, ttl) => {
                self.sessions.insert(slot_id(slot), MSession { ttl, end: self.now + ttl });
                Answer::Done
            }
            Op::Heartbeat(slot) => {
                let s = slot_id(slot);
                Answer::Heartbeat(self.session_check(s).map(|()| {
                    if let Some(m) = self.sessions.get_mut(&s) {
                        m.end = self.now + m.ttl;
                    }
                    let held = self.rows.values().filter(|g| g.session == s && self.live(g)).count();
                    i64::try_from(held).unwrap_or(i64::MAX)
                }))
            }
            Op::Close(slot) => {
                let s = slot_id(slot);
                if self.sessions.remove(&s).is_none() {
                    return Answer::Closed(Err(SessionRefusal::Unknown));
                }
                self.rows.retain(|_, g| g.session != s);
                Answer::Closed(Ok(()))
            }
            Op::Acquire(slot, key, ttl) => {
                let s = slot_id(slot);
                if let Err(r) = self.session_check(s) {
                    return Answer::Acquire(Err(Refused::Session(r)));
                }
                if let Some(g) = self.live_grant(key) {
                    let refused = if g.session == s {
                        Refused::AlreadyHeld { token: g.token }
                    } else {
                        Refused::Contended { holder: g.session }
                    };
                    return Answer::Acquire(Err(refused));
                }
                let token = self.issue();
                self.rows.insert(key, MGrant { session: s, token, lease_end: self.now + ttl });
                self.seen.insert(key);
                Answer::Acquire(Ok((token, s, ttl * UNIT_MS)))
            }
            Op::Renew(slot, key, p, ttl) => {
                let s = slot_id(slot);
                let token = self.presented(key, p);
                if let Err(r) = self.session_check(s) {
                    return Answer::Renew(Err(RenewRefusal::Session(r)));
                }
                let now = self.now;
                match self.live_grant(key) {
                    Some(g) if g.session == s && g.token == token => {
                        if let Some(row) = self.rows.get_mut(&key) {
                            row.lease_end = now + ttl;
                        }
                        Answer::Renew(Ok((token, ttl * UNIT_MS)))
                    }
                    _ => Answer::Renew(Err(RenewRefusal::Lost { stored_token: self.rows.get(&key).map(|g| g.token) })),
                }
            }
            Op::Release(key, p) => {
                let token = self.presented(key, p);
                match self.live_grant(key) {
                    Some(g) if g.token == token => {
                        self.rows.remove(&key);
                        Answer::Release(Ok(()))
                    }
                    _ => Answer::Release(Err(self.rows.get(&key).map(|g| g.token))),
                }
            }
            Op::Rotate(slot, key, p, ttl) => {
                let s = slot_id(slot);
                let token = self.presented(key, p);
                if let Err(r) = self.session_check(s) {
                    return Answer::Rotate(Err(RotateRefusal::Session(r)));
                }
                match self.live_grant(key) {
                    // Release by the holder, then acquire by it: a fresh token, the key never free.
                    Some(g) if g.session == s && g.token == token => {
                        let fresh = self.issue();
                        self.rows.insert(key, MGrant { session: s, token: fresh, lease_end: self.now + ttl });
                        Answer::Rotate(Ok((fresh, ttl * UNIT_MS)))
                    }
                    _ => {
                        Answer::Rotate(Err(RotateRefusal::Lost { stored_token: self.rows.get(&key).map(|g| g.token) }))
                    }
                }
            }
            Op::Revoke(key, p) => {
                let expected = p.map(|p| self.presented(key, p));
                let Some(g) = self.live_grant(key) else { return Answer::Revoke(Err(RevokeRefusal::NotHeld)) };
                if expected.is_some_and(|e| e != g.token) {
                    return Answer::Revoke(Err(RevokeRefusal::Stale { current_token: g.token }));
                }
                self.rows.remove(&key);
                self.floor = self.issue();
                Answer::Revoke(Ok((g.token, self.floor)))
            }
        }
    }
}

/// The model's answer and the store's must be equal.
fn judge(op: &Op, expected: &Answer, actual: &Answer) -> Result<(), TestCaseError> {
    if expected == actual {
        Ok(())
    } else {
        Err(TestCaseError::fail(format!("{op:?}: the store answered {actual:?}, the model {expected:?}")))
    }
}

/// The invariants that hold whatever the model says: tokens strictly increase across keys
/// and restarts, and every grant is above the last revoke floor.
#[derive(Debug, Default)]
struct Tokens {
    max_issued: i64,
    floor: i64,
}

impl Tokens {
    fn check(&mut self, op: &Op, actual: &Answer) -> Result<(), TestCaseError> {
        match actual {
            Answer::Acquire(Ok((token, _, _))) | Answer::Rotate(Ok((token, _))) => {
                if *token <= self.max_issued || *token <= self.floor {
                    return Err(TestCaseError::fail(format!(
                        "{op:?}: token {token} issued after {} (floor {})",
                        self.max_issued, self.floor
                    )));
                }
                self.max_issued = *token;
            }
            Answer::Revoke(Ok((_, floor))) => {
                if *floor <= self.max_issued {
                    return Err(TestCaseError::fail(format!(
                        "{op:?}: floor {floor} not above the last token {}",
                        self.max_issued
                    )));
                }
                self.floor = *floor;
                self.max_issued = *floor;
            }
            _ => {}
        }
        Ok(())
    }
}

/// A backend under test: the store, how its clock advances, how it restarts.
enum Backend {
    #[cfg(not(madsim))]
    Sqlite { url: String, store: dlock_lock_server::store_sql::SqliteLockStore, _dir: dlock_testkit::TempDir },
    #[cfg(madsim)]
    Mem(Arc<dlock_lock_server::store_mem::MemLockStore>),
}

impl Backend {
    fn store(&self) -> Arc<dyn LockStore> {
        match self {
            #[cfg(not(madsim))]
            Backend::Sqlite { store, .. } => Arc::new(store.clone()),
            #[cfg(madsim)]
            Backend::Mem(store) => store.clone(),
        }
    }

    /// Moves the backend's clock forward by `ms`.
    async fn advance(&mut self, ms: i64) {
        match self {
            #[cfg(not(madsim))]
            Backend::Sqlite { store, .. } => {
                // Shifting every stored instant back is the clock jumping forward.
                for sql in [
                    "UPDATE lock_sessions SET created_at_ms = created_at_ms - $1, expires_at_ms = expires_at_ms - $1",
                    "UPDATE lock_grants SET acquired_at_ms = acquired_at_ms - $1, expires_at_ms = expires_at_ms - $1",
                    "UPDATE lock_keys SET first_granted_at_ms = first_granted_at_ms - $1, \
                     delay_until_ms = delay_until_ms - $1",
                    "UPDATE lock_revocations SET revoked_at_ms = revoked_at_ms - $1",
                ] {
                    sqlx::query(sql).bind(ms).execute(&store.pool).await.expect("shift the stored instants");
                }
            }
            #[cfg(madsim)]
            Backend::Mem(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0))).await;
            }
        }
    }

    async fn restart(&mut self) {
        match self {
            #[cfg(not(madsim))]
            Backend::Sqlite { url, store, .. } => {
                store.pool.close().await;
                *store = dlock_lock_server::store_sql::SqliteLockStore::open(url).await.expect("re-open lockdb");
            }
            #[cfg(madsim)]
            Backend::Mem(_) => {}
        }
    }
}

/// The store's answer to `op`, normalised.
async fn answer(store: &Arc<dyn LockStore>, op: &Op, slot_id: impl Fn(usize) -> Uuid, model: &Model) -> Answer {
    let key = |k: usize| format!("key-{k}");
    match *op {
        Op::Advance(_) | Op::Restart => Answer::Done,
        Op::Open(slot, ttl) => {
            let s = slot_id(slot);
            store.open_session(s, &format!("owner-{s}"), ttl * UNIT_MS).await.expect("open_session");
            Answer::Done
        }
        Op::Heartbeat(slot) => {
            Answer::Heartbeat(store.heartbeat(slot_id(slot)).await.expect("heartbeat").map(|(_, held)| held))
        }
        Op::Close(slot) => Answer::Closed(store.close_session(slot_id(slot), DELAY_MS).await.expect("close")),
        Op::Acquire(slot, k, ttl) => {
            let got = store.acquire(&key(k), slot_id(slot), ttl * UNIT_MS, DELAY_MS).await.expect("acquire");
            Answer::Acquire(match got {
                Ok(g) => Ok((g.fencing_token, g.session_id, g.expires_at_ms - g.acquired_at_ms)),
                Err(AcquireRefusal::Session(r)) => Err(Refused::Session(r)),
                Err(AcquireRefusal::AlreadyHeld { fencing_token, .. }) => {
                    Err(Refused::AlreadyHeld { token: fencing_token })
                }
                Err(AcquireRefusal::Contended { holder_owner_id, .. }) => {
                    let holder = holder_owner_id.strip_prefix("owner-").and_then(|s| Uuid::parse_str(s).ok());
                    Err(Refused::Contended { holder: holder.unwrap_or_default() })
                }
                Err(AcquireRefusal::Delayed { .. }) => Err(Refused::Delayed),
            })
        }
        Op::Renew(slot, k, p, ttl) => {
            let token = model.presented(k, p);
            let now = store.now_ms().await.expect("now_ms");
            let got = store.renew(&key(k), slot_id(slot), token, ttl * UNIT_MS).await.expect("renew");
            // The renewed lease runs `ttl` from the store's now (read just before; a real
            // clock moves a few ms in between, far below one unit).
            Answer::Renew(got.map(|g| (g.fencing_token, ((g.expires_at_ms - now) + UNIT_MS / 2) / UNIT_MS * UNIT_MS)))
        }
        Op::Release(k, p) => Answer::Release(store.release(&key(k), model.presented(k, p)).await.expect("release")),
        Op::Rotate(slot, k, p, ttl) => {
            let got = store
                .rotate(&key(k), slot_id(slot), model.presented(k, p), ttl * UNIT_MS, DELAY_MS)
                .await
                .expect("rotate");
            Answer::Rotate(got.map(|g| (g.fencing_token, g.expires_at_ms - g.acquired_at_ms)))
        }
        Op::Revoke(k, p) => {
            let expected = p.map(|p| model.presented(k, p));
            let got = store
                .revoke(&key(k), "model@test", "model-based test revoke", expected, dlock_rt::rand::uuid_v4())
                .await
                .expect("revoke");
            Answer::Revoke(got.map(|r| (r.revoked_token, r.new_token_floor)))
        }
    }
}

/// Every key's state in the store equals the model's: the live grant (token and holder),
/// or none; `None` for a key never granted.
async fn check_state(store: &Arc<dyn LockStore>, model: &Model, after: &Op) -> Result<(), TestCaseError> {
    for k in 0..KEYS {
        let got = store.info(&format!("key-{k}"), 0).await.expect("info");
        let got = got.map(|i| i.grant.map(|g| (g.fencing_token, g.session_id)));
        let want = model.seen.contains(&k).then(|| model.live_grant(k).map(|g| (g.token, g.session)));
        if got != want {
            return Err(TestCaseError::fail(format!(
                "after {after:?}: key-{k} is {got:?} in the store, {want:?} in the model"
            )));
        }
    }
    Ok(())
}

/// Runs one case against a fresh backend.
async fn run_case(mut backend: Backend, ops: &[Op], seen: &RefCell<Coverage>) -> Result<(), TestCaseError> {
    let mut restarted = false;
    let mut model = Model::default();
    let mut tokens = Tokens::default();
    // slot -> current session id; a slot never opened names a session that never existed.
    let mut slots: [Uuid; SLOTS] = [Uuid::nil(); SLOTS];
    for (i, slot) in slots.iter_mut().enumerate() {
        *slot = Uuid::from_u128(u128::MAX - i as u128);
    }
    let mut opened: u128 = 0;
    for op in ops {
        if let Op::Open(slot, _) = op {
            opened += 1;
            slots[*slot] = Uuid::from_u128(opened);
        }
        let store = backend.store();
        let actual = answer(&store, op, |s| slots[s], &model).await;
        match op {
            Op::Advance(d) => backend.advance(d * UNIT_MS).await,
            Op::Restart => backend.restart().await,
            _ => {}
        }
        let class = classify(&model, op, |s| slots[s], restarted);
        restarted |= matches!(op, Op::Restart);
        let expected = model.step(op, |s| slots[s]);
        judge(op, &expected, &actual)?;
        seen.borrow_mut().note(class, &expected);
        tokens.check(op, &actual)?;
        check_state(&backend.store(), &model, op).await?;
    }
    Ok(())
}

/// Runs [`CASES_PER_BACKEND`] random cases, each on a backend `make` builds, with `block_on`
/// the runtime's entry point; proptest shrinks a failing case to a minimal sequence, which
/// is the `Err`. `Ok` also requires that the cases reached every situation the properties
/// are about ([`Coverage::missing`]), else they would prove little.
fn run_cases<B, F>(make: impl Fn() -> F, block_on: B) -> Result<Coverage, String>
where
    B: Fn(std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), TestCaseError>>>>) -> Result<(), TestCaseError>,
    F: std::future::Future<Output = Backend> + 'static,
{
    let config = Config { cases: CASES_PER_BACKEND, failure_persistence: None, ..Config::default() };
    // A fixed seed: every CI run drives the same cases.
    let mut runner = TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let seen = Rc::new(RefCell::new(Coverage::default()));
    runner
        .run(&ops(), |ops| {
            let backend = make();
            let seen = seen.clone();
            block_on(Box::pin(async move { run_case(backend.await, &ops, &seen).await }))
        })
        .map_err(|e| e.to_string())?;
    let seen = *seen.borrow();
    let missing = seen.missing();
    if !missing.is_empty() {
        return Err(format!("the cases never reached {missing:?}: {seen:?}"));
    }
    Ok(seen)
}

#[cfg(not(madsim))]
#[test]
fn sqlite_store_matches_the_model_across_expiry_revoke_and_restart() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let outcome = run_cases(
        || async {
            let (url, dir) = dlock_testkit::fresh_database(dlock_testkit::Db::Sqlite).await;
            let store = dlock_lock_server::store_sql::SqliteLockStore::open(&url).await.expect("open lockdb");
            Backend::Sqlite { url, store, _dir: dir }
        },
        |f| rt.block_on(f),
    );
    match outcome {
        Ok(seen) => eprintln!("coverage: {seen:?}"),
        Err(e) => panic!("{e}"),
    }
}

/// The simulation store's cases, with `bug` planted on the simulation thread.
#[cfg(madsim)]
fn sim_cases(bug: Option<dlock_contract::planted::Bug>) -> Result<Coverage, String> {
    let outcome = run_cases(
        move || async move {
            dlock_contract::planted::set(bug);
            Backend::Mem(Arc::new(dlock_lock_server::store_mem::MemLockStore::new(dlock_rt::Clock::reference())))
        },
        |f| madsim::runtime::Runtime::new().block_on(f),
    );
    dlock_contract::planted::set(None);
    outcome
}

#[cfg(madsim)]
#[test]
fn sim_store_matches_the_model_across_expiry_revoke_and_restart() {
    match sim_cases(None) {
        Ok(seen) => eprintln!("coverage: {seen:?}"),
        Err(e) => panic!("{e}"),
    }
}

/// The model test can fail on a real store: each planted lock-store bug is found (and
/// shrunk) by it.
#[cfg(madsim)]
#[test]
fn planted_lock_store_bugs_fail_the_model_test() {
    use dlock_contract::planted::Bug;
    for (bug, symptom) in [(Bug::GrantUnexpired, "Acquire("), (Bug::RevokeKeepsFloor, "Revoke(")] {
        match sim_cases(Some(bug)) {
            Ok(seen) => panic!("{bug} went unnoticed: {seen:?}"),
            Err(e) => {
                assert!(e.contains(symptom), "{bug} failed the model test elsewhere than at {symptom}: {e}");
                assert!(e.contains("minimal failing input"), "{bug}: not shrunk: {e}");
            }
        }
    }
}

/// A situation a step is in, before it runs, that the properties are about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// A renew by the holder with its token after the lease lapsed, its session live.
    RenewOfLapsedLease,
    /// A release with a token that is not the live holder's.
    ReleaseByNonHolder,
    /// An acquire of a key whose stored grant is dead (lapsed lease or session).
    AcquireOverDeadGrant,
    /// An acquire after a revoke raised the floor.
    AcquireAfterRevoke,
    /// An acquire after a restart of the backend.
    AcquireAfterRestart,
    Other,
}

fn classify(m: &Model, op: &Op, slot_id: impl Fn(usize) -> Uuid, restarted: bool) -> Class {
    match *op {
        Op::Renew(slot, key, p, _) => {
            let s = slot_id(slot);
            let token = m.presented(key, p);
            let lapsed = m.rows.get(&key).is_some_and(|g| g.session == s && g.token == token && m.now >= g.lease_end);
            if lapsed && m.session_check(s).is_ok() {
                return Class::RenewOfLapsedLease;
            }
            Class::Other
        }
        Op::Release(key, p) if m.live_grant(key).is_some_and(|g| g.token != m.presented(key, p)) => {
            Class::ReleaseByNonHolder
        }
        Op::Acquire(slot, key, _) if m.session_check(slot_id(slot)).is_ok() => {
            if m.rows.get(&key).is_some_and(|g| !m.live(g)) {
                Class::AcquireOverDeadGrant
            } else if m.live_grant(key).is_none() && m.floor > 0 {
                Class::AcquireAfterRevoke
            } else if m.live_grant(key).is_none() && restarted {
                Class::AcquireAfterRestart
            } else {
                Class::Other
            }
        }
        _ => Class::Other,
    }
}

/// How often each situation and answer occurred over all cases.
#[derive(Debug, Clone, Copy, Default)]
struct Coverage {
    renew_of_lapsed_lease: u32,
    release_by_non_holder: u32,
    acquire_over_dead_grant: u32,
    acquire_after_revoke: u32,
    acquire_after_restart: u32,
    contended: u32,
    already_held: u32,
    revoked: u32,
    stale_revoke: u32,
    renewed: u32,
    rotated: u32,
    rotate_lost: u32,
    session_expired: u32,
    session_unknown: u32,
}

impl Coverage {
    fn note(&mut self, class: Class, answer: &Answer) {
        match class {
            Class::RenewOfLapsedLease => self.renew_of_lapsed_lease += 1,
            Class::ReleaseByNonHolder => self.release_by_non_holder += 1,
            Class::AcquireOverDeadGrant => self.acquire_over_dead_grant += 1,
            Class::AcquireAfterRevoke => self.acquire_after_revoke += 1,
            Class::AcquireAfterRestart => self.acquire_after_restart += 1,
            Class::Other => {}
        }
        match answer {
            Answer::Acquire(Err(Refused::Contended { .. })) => self.contended += 1,
            Answer::Acquire(Err(Refused::AlreadyHeld { .. })) => self.already_held += 1,
            Answer::Revoke(Ok(_)) => self.revoked += 1,
            Answer::Revoke(Err(RevokeRefusal::Stale { .. })) => self.stale_revoke += 1,
            Answer::Renew(Ok(_)) => self.renewed += 1,
            Answer::Rotate(Ok(_)) => self.rotated += 1,
            Answer::Rotate(Err(RotateRefusal::Lost { .. })) => self.rotate_lost += 1,
            Answer::Heartbeat(Err(SessionRefusal::Expired))
            | Answer::Acquire(Err(Refused::Session(SessionRefusal::Expired)))
            | Answer::Renew(Err(RenewRefusal::Session(SessionRefusal::Expired)))
            | Answer::Rotate(Err(RotateRefusal::Session(SessionRefusal::Expired))) => self.session_expired += 1,
            Answer::Heartbeat(Err(SessionRefusal::Unknown)) | Answer::Closed(Err(SessionRefusal::Unknown)) => {
                self.session_unknown += 1
            }
            _ => {}
        }
    }

    fn missing(&self) -> Vec<&'static str> {
        [
            ("renew_of_lapsed_lease", self.renew_of_lapsed_lease),
            ("release_by_non_holder", self.release_by_non_holder),
            ("acquire_over_dead_grant", self.acquire_over_dead_grant),
            ("acquire_after_revoke", self.acquire_after_revoke),
            ("acquire_after_restart", self.acquire_after_restart),
            ("contended", self.contended),
            ("already_held", self.already_held),
            ("revoked", self.revoked),
            ("stale_revoke", self.stale_revoke),
            ("renewed", self.renewed),
            ("rotated", self.rotated),
            ("rotate_lost", self.rotate_lost),
            ("session_expired", self.session_expired),
            ("session_unknown", self.session_unknown),
        ]
        .into_iter()
        .filter(|(_, n)| *n == 0)
        .map(|(name, _)| name)
        .collect()
    }
}

/// The checker can fail: a store that answered a grant with a token not above the last one,
/// or a second live grant, or a renew past the lease, is flagged.
#[test]
fn the_model_checker_flags_wrong_answers() {
    let s = Uuid::from_u128(1);
    let t = Uuid::from_u128(2);
    let mut model = Model::default();
    let id = |slot: usize| if slot == 0 { s } else { t };
    model.step(&Op::Open(0, 3), id);
    model.step(&Op::Open(1, 3), id);
    let acquire = Op::Acquire(0, 0, 2);
    let first = model.step(&acquire, id);
    assert_eq!(first, Answer::Acquire(Ok((1, s, 2 * UNIT_MS))));
    // A second live grant of the key, to the other session.
    let second = Op::Acquire(1, 0, 2);
    let want = model.step(&second, id);
    assert!(judge(&second, &want, &Answer::Acquire(Ok((2, t, 2 * UNIT_MS)))).is_err());
    // A token reused across keys.
    let mut tokens = Tokens::default();
    assert!(tokens.check(&acquire, &first).is_ok());
    assert!(tokens.check(&acquire, &first).is_err());
    // A renew after the lease lapsed.
    model.step(&Op::Advance(2), id);
    let renew = Op::Renew(0, 0, Pick::Current, 2);
    let want = model.step(&renew, id);
    assert_eq!(want, Answer::Renew(Err(RenewRefusal::Lost { stored_token: Some(1) })));
    assert!(judge(&renew, &want, &Answer::Renew(Ok((1, 2 * UNIT_MS)))).is_err());
    // A release by a non-holder (an older token).
    let mut model = Model::default();
    model.step(&Op::Open(0, 3), id);
    model.step(&Op::Acquire(0, 0, 2), id);
    model.step(&Op::Acquire(0, 1, 2), id);
    let release = Op::Release(1, Pick::Older);
    let want = model.step(&release, id);
    assert_eq!(want, Answer::Release(Err(Some(2))));
    assert!(judge(&release, &want, &Answer::Release(Ok(()))).is_err());
    // A rotate that re-issued the token it was given, or rotated a grant it did not hold.
    let rotate = Op::Rotate(0, 0, Pick::Current, 2);
    let want = model.step(&rotate, id);
    assert_eq!(want, Answer::Rotate(Ok((3, 2 * UNIT_MS))));
    let mut tokens = Tokens { max_issued: 2, floor: 0 };
    assert!(tokens.check(&rotate, &Answer::Rotate(Ok((2, 2 * UNIT_MS)))).is_err());
    model.step(&Op::Open(1, 3), id);
    let foreign = Op::Rotate(1, 0, Pick::Current, 2);
    let want = model.step(&foreign, id);
    assert_eq!(want, Answer::Rotate(Err(RotateRefusal::Lost { stored_token: Some(3) })));
    assert!(judge(&foreign, &want, &Answer::Rotate(Ok((4, 2 * UNIT_MS)))).is_err());
}
