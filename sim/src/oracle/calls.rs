//! The lock store judged from its callers' side, in true time (issue 35 part 3): what the
//! lock-server replicas asked of lockdb and what lockdb acknowledged, on every backend,
//! etcd included (whose simulated server has no observer of its own).
//!
//! [`ObservedLockStore`] (`dlock_lock_server::store_observed`, re-exported here) sits
//! between a replica and its store (inside the fault layer, so it sees what the store itself
//! answered) and tells a [`CallSlot`] when each call begins and how it ended. The oracle
//! stamps both with the world's true (simulated) time and feeds [`Calls`]; a real run feeds
//! it the same reports from the lock servers' trace files (docs/real-runs.md). It judges:
//! - **`no_two_live_grants_per_key`.** A grant lives at least until `ttl` after its last
//!   acknowledged version's call *began* (the judging replica first sees a version no sooner
//!   than its writer decided it, C1 §1.5.4; lockdb's clock on SQL and the simulation store
//!   runs no faster than its judge), and no longer than its session, which lives at least
//!   `ttl` after its last acknowledged open or heartbeat began. A later token of the key
//!   acknowledged (its call *ended*) before that instant is two live grants.
//! - **`lock_delay_honoured`.** A grant that died without release keeps its key from
//!   everyone for the lock-delay after that instant.
//! - **`lock_tokens_increase_in_grant_order`.** A grant acknowledged after another's call
//!   began carries a greater token (any key).
//! - **`heartbeat_keeps_its_session_live`.** A call that began after a heartbeat was
//!   acknowledged, and was refused `SESSION_EXPIRED` or `SESSION_UNKNOWN` before `ttl` had
//!   run since that heartbeat began: one replica accepted the heartbeat, another judged the
//!   session dead.
//!
//! A store that keeps lockdb's clock may end a lease up to one tick's advance early in true
//! time (C1 §1.4.2): that slack ([`Calls::new`]) comes off every bound. Time is scaled by
//! the fastest judge's clock rate over the window (a judge whose clock
//! runs at rate `r` ends a `ttl` after `ttl / r` of true time): only rates excuse, never a
//! wall-clock offset or step. Anything that may legitimately end a grant early excuses it
//! from the instant its call *began*, whatever its outcome: a release or rotate of that
//! token, a revoke of its key, a close of its session.
//!
//! Invariants of this module:
//! - Sound over lost acknowledgements: a call that failed (its outcome unknown) is never
//!   evidence of a grant, a renew or a heartbeat, and an excuse counts from its begin even
//!   when it failed. Knowledge only grows, so a failure once found stays true.
//! - Pure over its inputs: times come in as arguments, so a unit test feeds hand-made calls.
//! - Bounded: at most [`GRANTS_PER_KEY_MAX`] grants per key and [`TRACKED_MAX`] entries in
//!   each table. Forgetting only ever misses a failure; a table that would need to forget
//!   an excuse switches the checker off for the rest of the seed ([`Calls::partial`]).

use std::collections::BTreeMap;

pub use dlock_lock_server::store_observed::{Answered, Asked, CallObserver, CallSlot, ObservedLockStore};
use uuid::Uuid;

use crate::outcome::Failure;

/// The invariant ids this module reports (beside `no_two_live_grants_per_key` and
/// `lock_tokens_increase_in_grant_order`).
pub const LOCK_DELAY_HONOURED: &str = "lock_delay_honoured";
pub const HEARTBEAT_KEEPS_SESSION_LIVE: &str = "heartbeat_keeps_its_session_live";

/// Grants kept per key (the latest tokens): an overlap is with a recent predecessor.
pub const GRANTS_PER_KEY_MAX: usize = 16;
/// Entries kept in each of the checker's tables (calls in flight, sessions, excuses).
pub const TRACKED_MAX: usize = 262_144;
/// Acknowledged opens and heartbeats kept per session (the latest).
const SESSION_ACKS_MAX: usize = 4;

#[derive(Debug, Clone)]
struct Grant {
    token: i64,
    session: Uuid,
    ttl_ms: i64,
    delay_ms: i64,
    /// When the call that wrote its last acknowledged version began.
    version_ms: u64,
    /// When the call that granted it ended (it was committed by then).
    acked_ms: u64,
}

#[derive(Debug, Clone, Default)]
struct Session {
    ttl_ms: i64,
    /// (began, ended) of its latest acknowledged opens and heartbeats.
    acks: Vec<(u64, u64)>,
}

/// The checker (see the module doc).
#[derive(Debug, Default)]
pub struct Calls {
    pending: BTreeMap<u64, (Asked, u64)>,
    grants: BTreeMap<String, Vec<Grant>>,
    sessions: BTreeMap<Uuid, Session>,
    /// `(key, token)` -> when its first release or rotate began.
    given_up: BTreeMap<(String, i64), u64>,
    /// key -> each revoke's (began, ended); `None`: not ended yet, or unknown.
    revokes: BTreeMap<String, Vec<(u64, Option<u64>)>>,
    /// session -> when its first close began.
    closes: BTreeMap<Uuid, u64>,
    /// When a grant was acknowledged -> the greatest token acknowledged by then.
    tokens: BTreeMap<u64, i64>,
    /// A table was full: nothing more is judged this seed.
    partial: bool,
    /// How early in true time the store may end a lease or a session ([`Calls::new`]).
    slack_ms: u64,
    /// Grants judged against a predecessor so far (for the tests and the trace).
    pub pairs_judged: u64,
    /// What the clock envelope measures ([`ClockTally`]).
    tally: ClockTally,
    /// Upper bounds of what may live, from every attempt whatever its outcome (the
    /// takeover delay's reference): `(key, token)` -> the latest renew's begin + ttl; key ->
    /// the latest begin + ttl of an acquire or rotate whose outcome is unknown; session ->
    /// the latest begin of an open or heartbeat.
    renew_tried: BTreeMap<(String, i64), u64>,
    grant_tried: BTreeMap<String, u64>,
    session_tried: BTreeMap<Uuid, u64>,
    /// Deaths the store acknowledged (`dead_grant_never_revived`): `(key, token)` -> when its
    /// release or revoke was first acknowledged; session -> when its close was.
    ended: BTreeMap<(String, i64), u64>,
    closed_acked: BTreeMap<Uuid, u64>,
}

/// What the lock store's calls showed of the clocks, beyond pass or fail (the clock
/// envelope, `crate::envelope`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClockTally {
    /// Overlaps (two live grants, a grant inside a lock-delay, a live session refused) that
    /// only a judge's clock running fast excused.
    pub excused_by_rate: u64,
    /// Overlaps of two holders' beliefs that only clock rates excused (`super::belief`).
    pub beliefs_excused_by_rate: u64,
    /// The longest an acquire was still refused as held or delayed after everything that
    /// may have held its key (any attempt to grant, renew or heartbeat, whatever its
    /// outcome) had run its ttl and lock-delay in true time, in ms.
    pub longest_takeover_ms: u64,
}

impl Calls {
    /// A checker for a store that may end a lease or a session up to `slack_ms` early in
    /// true time: 0 on etcd (each replica judges on its own monotonic clock), lockdb's
    /// `CLOCK_ADVANCE_MS_MAX` on a store that keeps lockdb's clock (a decision reads the
    /// clock as its last tick left it, C1 §1.4.2).
    pub fn new(slack_ms: u64) -> Calls {
        Calls { slack_ms, ..Calls::default() }
    }

    /// Whether a full table switched the checker off.
    pub fn partial(&self) -> bool {
        self.partial
    }

    /// What the calls showed of the clocks so far.
    pub fn tally(&self) -> ClockTally {
        self.tally
    }

    fn note_max<K: Ord>(map: &mut BTreeMap<K, u64>, k: K, v: u64) {
        if map.len() < TRACKED_MAX {
            let e = map.entry(k).or_insert(v);
            *e = (*e).max(v);
        }
    }

    /// Notes what an attempt may have made live, whatever its outcome.
    fn tried(&mut self, asked: &Asked, began: u64, answered: Answered) {
        let ttl = |t: i64| u64::try_from(t).unwrap_or(0);
        match asked {
            Asked::Open { session } | Asked::Heartbeat { session } => {
                Self::note_max(&mut self.session_tried, *session, began);
            }
            Asked::Renew { key, token, ttl_ms, .. } => {
                Self::note_max(&mut self.renew_tried, (key.clone(), *token), began + ttl(*ttl_ms));
            }
            Asked::Acquire { key, ttl_ms, .. } | Asked::Rotate { key, ttl_ms, .. } if answered == Answered::Unknown => {
                Self::note_max(&mut self.grant_tried, key.clone(), began + ttl(*ttl_ms));
            }
            _ => {}
        }
    }

    /// An acquire of `key` begun at `began` was refused as held or delayed: how long past
    /// the latest instant anything that may hold the key could have lived, lock-delay
    /// included (0 when it could still live).
    fn overdue(&self, key: &str, began: u64, delay_ms: i64) -> u64 {
        let Some(g) = self.grants.get(key).and_then(|v| v.last()) else { return 0 };
        if g.acked_ms > began || self.excused(key, g, began) {
            return 0;
        }
        let lease = self.renew_tried.get(&(key.to_owned(), g.token)).copied().unwrap_or(0).max(until(
            g.version_ms,
            g.ttl_ms,
            1.0,
        ));
        let session = match (self.sessions.get(&g.session), self.session_tried.get(&g.session)) {
            (Some(s), Some(tried)) => until(*tried, s.ttl_ms, 1.0),
            _ => return 0,
        };
        let held = lease.min(session).max(self.grant_tried.get(key).copied().unwrap_or(0));
        began.saturating_sub(held.saturating_add(u64::try_from(delay_ms).unwrap_or(0)))
    }

    fn full<T>(&mut self, len: usize, then: impl FnOnce(&mut Calls) -> T) -> Option<T> {
        if len >= TRACKED_MAX {
            self.partial = true;
            return None;
        }
        Some(then(self))
    }

    /// Call `id` began at `at_ms`. Whatever may end a grant early excuses it from now.
    pub fn begin(&mut self, id: u64, asked: Asked, at_ms: u64) {
        if self.partial {
            return;
        }
        match &asked {
            Asked::Release { key, token } | Asked::Rotate { key, token, .. } => {
                let k = (key.clone(), *token);
                if !self.given_up.contains_key(&k) {
                    let _ = self.full(self.given_up.len(), |c| c.given_up.insert(k, at_ms));
                }
            }
            Asked::Revoke { key } => {
                let n = self.revokes.values().map(Vec::len).sum();
                let key = key.clone();
                let _ = self.full(n, |c| c.revokes.entry(key).or_default().push((at_ms, None)));
            }
            Asked::Close { session } if !self.closes.contains_key(session) => {
                let s = *session;
                let _ = self.full(self.closes.len(), |c| c.closes.insert(s, at_ms));
            }
            _ => {}
        }
        let _ = self.full(self.pending.len(), |c| c.pending.insert(id, (asked, at_ms)));
    }

    /// Call `id` ended at `at_ms` with `answered`; `fastest(from, to)` is the fastest rate
    /// any judging clock ran at during `[from, to]` (1 for a true clock). The failures it
    /// reveals.
    pub fn end(&mut self, id: u64, answered: Answered, at_ms: u64, fastest: impl Fn(u64, u64) -> f64) -> Vec<Failure> {
        let Some((asked, began)) = self.pending.remove(&id) else { return Vec::new() };
        if self.partial {
            return Vec::new();
        }
        self.tried(&asked, began, answered);
        if let (Asked::Acquire { key, delay_ms, .. }, Answered::KeyBusy) = (&asked, answered) {
            let overdue = self.overdue(key, began, *delay_ms);
            self.tally.longest_takeover_ms = self.tally.longest_takeover_ms.max(overdue);
        }
        if let Asked::Revoke { key } = &asked {
            if let Some(r) =
                self.revokes.get_mut(key).and_then(|v| v.iter_mut().find(|r| r.0 == began && r.1.is_none()))
            {
                if answered != Answered::Unknown {
                    r.1 = Some(at_ms);
                }
            }
        }
        match (asked, answered) {
            (Asked::Open { session } | Asked::Heartbeat { session }, Answered::SessionLive { ttl_ms }) => {
                if !self.sessions.contains_key(&session) && self.sessions.len() >= TRACKED_MAX {
                    return Vec::new();
                }
                let s = self.sessions.entry(session).or_default();
                s.ttl_ms = ttl_ms;
                s.acks.push((began, at_ms));
                s.acks.sort_unstable();
                if s.acks.len() > SESSION_ACKS_MAX {
                    s.acks.remove(0);
                }
                Vec::new()
            }
            (
                Asked::Heartbeat { session } | Asked::Acquire { session, .. } | Asked::Rotate { session, .. },
                Answered::SessionRefused,
            ) => self.refused(session, began, at_ms, &fastest).into_iter().collect(),
            (Asked::Acquire { key, session, ttl_ms, delay_ms }, Answered::Granted { token }) => {
                let g = Grant { token, session, ttl_ms, delay_ms, version_ms: began, acked_ms: at_ms };
                self.granted(&key, g, &fastest)
            }
            (Asked::Rotate { key, session, ttl_ms, delay_ms, token: from }, Answered::Granted { token }) => {
                let mut found: Vec<Failure> = self.revived(&key, from, session, began, "rotated").into_iter().collect();
                let g = Grant { token, session, ttl_ms, delay_ms, version_ms: began, acked_ms: at_ms };
                found.extend(self.granted(&key, g, &fastest));
                found
            }
            (Asked::Renew { key, session, token, .. }, Answered::Renewed) => {
                let found = self.revived(&key, token, session, began, "renewed").into_iter().collect();
                if let Some(g) = self.grants.get_mut(&key).and_then(|v| v.iter_mut().find(|g| g.token == token)) {
                    g.version_ms = g.version_ms.max(began);
                }
                found
            }
            (Asked::Release { key, token }, Answered::Done) | (Asked::Revoke { key }, Answered::Revoked { token }) => {
                Self::note_min(&mut self.ended, (key, token), at_ms);
                Vec::new()
            }
            (Asked::Close { session }, Answered::Done) => {
                Self::note_min(&mut self.closed_acked, session, at_ms);
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    fn note_min<K: Ord>(map: &mut BTreeMap<K, u64>, k: K, v: u64) {
        if map.len() < TRACKED_MAX {
            let e = map.entry(k).or_insert(v);
            *e = (*e).min(v);
        }
    }

    /// A renew or rotate of `(key, token)` of `session`, begun at `began`, was acknowledged:
    /// a death of that grant the store had acknowledged before is a grant come back.
    fn revived(&self, key: &str, token: i64, session: Uuid, began: u64, how: &str) -> Option<Failure> {
        let k = (key.to_owned(), token);
        let replaced = self
            .grants
            .get(key)
            .into_iter()
            .flatten()
            .filter(|g| g.token > token && g.acked_ms <= began)
            .map(|g| (g.acked_ms, format!("replaced by token {}", g.token)))
            .min();
        let death = [
            self.ended.get(&k).filter(|at| **at <= began).map(|at| (*at, "released or revoked".to_owned())),
            self.closed_acked.get(&session).filter(|at| **at <= began).map(|at| (*at, "its session closed".to_owned())),
            replaced,
        ]
        .into_iter()
        .flatten()
        .min()?;
        Some(Failure::correctness(
            super::ids::DEAD_GRANT_NEVER_REVIVED,
            format!(
                "key {key}: token {token} {how} by a call begun at {began} ms, after the store acknowledged it \
                 {} at {} ms",
                death.1, death.0
            ),
        ))
    }

    /// A call on `session` that began at `began` was refused as expired or unknown at `ended`.
    fn refused(
        &mut self,
        session: Uuid,
        began: u64,
        ended: u64,
        fastest: &impl Fn(u64, u64) -> f64,
    ) -> Option<Failure> {
        if self.closes.get(&session).is_some_and(|c| *c <= ended) {
            return None;
        }
        let s = self.sessions.get(&session)?;
        let (hb_began, hb_ended) = s.acks.iter().rev().find(|(_, e)| *e <= began).copied()?;
        let live_until = until(hb_began, s.ttl_ms, fastest(hb_began, ended)).saturating_sub(self.slack_ms);
        if ended >= live_until && ended < until(hb_began, s.ttl_ms, 1.0).saturating_sub(self.slack_ms) {
            self.tally.excused_by_rate += 1;
        }
        (ended < live_until).then(|| {
            Failure::correctness(
                HEARTBEAT_KEEPS_SESSION_LIVE,
                format!(
                    "session {session}: refused as expired by a call of [{began}, {ended}] ms, after a heartbeat \
                     acknowledged at {hb_ended} ms (begun at {hb_began} ms, ttl {} ms): live until at least \
                     {live_until} ms",
                    s.ttl_ms
                ),
            )
        })
    }

    /// The instant `g` lives at least until, judged by clocks as fast as `fastest` up to
    /// `to`; `None` when its session's life is not known.
    fn lives_until(&self, g: &Grant, to: u64, fastest: &impl Fn(u64, u64) -> f64) -> Option<u64> {
        let s = self.sessions.get(&g.session)?;
        let (s_began, _) = s.acks.last().copied()?;
        let session = until(s_began, s.ttl_ms, fastest(s_began.min(g.version_ms), to));
        let lease = until(g.version_ms, g.ttl_ms, fastest(g.version_ms, to));
        Some(session.min(lease).saturating_sub(self.slack_ms))
    }

    /// Whether something that may end `g` (of `key`) early began by `by`.
    fn excused(&self, key: &str, g: &Grant, by: u64) -> bool {
        let given_up = self.given_up.get(&(key.to_owned(), g.token)).is_some_and(|at| *at <= by);
        let closed = self.closes.get(&g.session).is_some_and(|at| *at <= by);
        // A revoke removes whatever grant lives when it commits: any grant that may have
        // committed before the revoke ended (the grant's call began by then).
        let revoked = self
            .revokes
            .get(key)
            .into_iter()
            .flatten()
            .any(|(rb, re)| *rb <= by && re.is_none_or(|e| g.version_ms <= e));
        given_up || closed || revoked
    }

    /// An acknowledged grant of `key`: judged against every known grant of the key.
    fn granted(&mut self, key: &str, g: Grant, fastest: &impl Fn(u64, u64) -> f64) -> Vec<Failure> {
        if !self.grants.contains_key(key) && self.grants.len() >= TRACKED_MAX {
            self.partial = true;
            return Vec::new();
        }
        let mut found = Vec::new();
        // Tokens rise in grant order, across keys: above every token acknowledged before
        // this grant's call began.
        if let Some((at, before)) = self.tokens.range(..g.version_ms).next_back().map(|(a, t)| (*a, *t)) {
            if g.token <= before {
                found.push(Failure::correctness(
                    super::ids::TOKENS_INCREASE,
                    format!("key {key}: token {} granted by a call begun at {} ms, after token {before} was acknowledged at {at} ms", g.token, g.version_ms),
                ));
            }
        }
        let top = self.tokens.values().next_back().copied().unwrap_or(i64::MIN).max(g.token);
        self.tokens.insert(g.acked_ms, top);
        if self.tokens.len() > TRACKED_MAX {
            self.tokens.pop_first();
        }
        let known = self.grants.get(key).cloned().unwrap_or_default();
        for other in known.iter().filter(|o| o.token != g.token) {
            let (earlier, later) = if other.token < g.token { (other, &g) } else { (&g, other) };
            self.pairs_judged += 1;
            if let Some(f) = self.pair(key, earlier, later, fastest) {
                found.push(f);
            }
        }
        let v = self.grants.entry(key.to_owned()).or_default();
        if !v.iter().any(|o| o.token == g.token) {
            v.push(g);
            v.sort_by_key(|o| o.token);
            if v.len() > GRANTS_PER_KEY_MAX {
                v.remove(0);
            }
        }
        found
    }

    /// `later` (a greater token of `key`) against `earlier`.
    fn pair(
        &mut self,
        key: &str,
        earlier: &Grant,
        later: &Grant,
        fastest: &impl Fn(u64, u64) -> f64,
    ) -> Option<Failure> {
        let by = later.acked_ms;
        if self.excused(key, earlier, by) {
            return None;
        }
        let lives = self.lives_until(earlier, by, fastest)?;
        let rate = fastest(earlier.version_ms, by);
        let delayed_until = until(lives, later.delay_ms, rate);
        let true_clock = |_: u64, _: u64| 1.0;
        let nominal = self.lives_until(earlier, by, &true_clock).unwrap_or(lives);
        if by >= delayed_until && by < nominal.saturating_add(u64::try_from(later.delay_ms).unwrap_or(0)) {
            self.tally.excused_by_rate += 1;
        }
        if by < lives {
            return Some(Failure::correctness(
                super::ids::NO_TWO_LIVE_GRANTS,
                format!(
                    "key {key}: token {} granted by {by} ms while token {} lived until at least {lives} ms (its \
                     last version begun at {} ms, ttl {} ms, judged at rate {rate:.3} at most)",
                    later.token, earlier.token, earlier.version_ms, earlier.ttl_ms
                ),
            ));
        }
        (by < delayed_until).then(|| {
            Failure::correctness(
                LOCK_DELAY_HONOURED,
                format!(
                    "key {key}: token {} granted by {by} ms, inside the {} ms lock-delay of token {}, which died \
                     without release at {lives} ms at the earliest",
                    later.token, later.delay_ms, earlier.token
                ),
            )
        })
    }
}

/// `from + ttl` of a clock running at `rate`, in true ms (a faster clock ends sooner).
fn until(from: u64, ttl_ms: i64, rate: f64) -> u64 {
    let ttl = u64::try_from(ttl_ms).unwrap_or(0) as f64 / rate.max(1.0);
    from.saturating_add(ttl.floor() as u64)
}

#[cfg(test)]
mod tests {
    //! The checker fed hand-made calls: each failure it reports, and nothing on the clean
    //! versions of the same calls.

    use super::*;

    const S1: Uuid = Uuid::from_u128(1);
    const S2: Uuid = Uuid::from_u128(2);

    /// A checker and a call counter, true clocks unless `rate` says otherwise.
    struct Run {
        c: Calls,
        id: u64,
        rate: f64,
    }

    impl Run {
        fn new() -> Run {
            Run { c: Calls::new(0), id: 0, rate: 1.0 }
        }

        /// One call over `[began, ended]`; the invariants it failed.
        fn call(&mut self, asked: Asked, began: u64, answered: Answered, ended: u64) -> Vec<&'static str> {
            self.id += 1;
            self.c.begin(self.id, asked, began);
            let rate = self.rate;
            self.c.end(self.id, answered, ended, |_, _| rate).into_iter().map(|f| f.invariant).collect()
        }

        fn session(&mut self, session: Uuid, at: u64, ttl_ms: i64) {
            assert!(self.call(Asked::Heartbeat { session }, at, Answered::SessionLive { ttl_ms }, at + 1).is_empty());
        }

        fn acquire(&mut self, session: Uuid, began: u64, token: i64, ended: u64) -> Vec<&'static str> {
            let asked = Asked::Acquire { key: "k".into(), session, ttl_ms: 1_000, delay_ms: 500 };
            self.call(asked, began, Answered::Granted { token }, ended)
        }
    }

    const TWO: &str = super::super::ids::NO_TWO_LIVE_GRANTS;
    const REVIVED: &str = super::super::ids::DEAD_GRANT_NEVER_REVIVED;

    #[test]
    fn a_grant_renewed_or_rotated_after_the_store_acknowledged_its_death_is_revived() {
        let renew = |token| Asked::Renew { key: "k".into(), session: S1, token, ttl_ms: 1_000 };
        let rotate = |token| Asked::Rotate { key: "k".into(), session: S1, token, ttl_ms: 1_000, delay_ms: 0 };
        let release = |token| Asked::Release { key: "k".into(), token };
        // Clean: renewed and rotated while it lived, released after.
        let mut r = Run::new();
        r.session(S1, 0, 10_000);
        assert!(r.acquire(S1, 100, 5, 110).is_empty());
        assert!(r.call(renew(5), 200, Answered::Renewed, 210).is_empty());
        assert!(r.call(rotate(5), 300, Answered::Granted { token: 6 }, 310).is_empty());
        assert!(r.call(release(6), 400, Answered::Done, 410).is_empty());
        // A renew that began before the release was acknowledged proves nothing.
        assert!(r.call(renew(6), 405, Answered::Renewed, 420).is_empty());
        // After it: the released grant came back.
        assert_eq!(r.call(renew(6), 411, Answered::Renewed, 420), [REVIVED]);
        // A rotate of a token a greater one replaced.
        assert_eq!(r.call(rotate(5), 500, Answered::Granted { token: 7 }, 510), [REVIVED]);
        // A renew after its session's close was acknowledged.
        let mut r = Run::new();
        r.session(S1, 0, 10_000);
        assert!(r.acquire(S1, 100, 5, 110).is_empty());
        assert!(r.call(Asked::Close { session: S1 }, 200, Answered::Done, 210).is_empty());
        assert_eq!(r.call(renew(5), 220, Answered::Renewed, 230), [REVIVED]);
        // A renew after its revoke was acknowledged.
        let mut r = Run::new();
        r.session(S1, 0, 10_000);
        assert!(r.acquire(S1, 100, 5, 110).is_empty());
        assert!(r.call(Asked::Revoke { key: "k".into() }, 200, Answered::Revoked { token: 5 }, 210).is_empty());
        assert_eq!(r.call(renew(5), 220, Answered::Renewed, 230), [REVIVED]);
    }

    #[test]
    fn a_later_token_acknowledged_while_the_earlier_grant_lived_is_two_live_grants() {
        let mut r = Run::new();
        r.session(S1, 0, 10_000);
        r.session(S2, 0, 10_000);
        assert!(r.acquire(S1, 100, 5, 110).is_empty());
        // S1's grant lives until 100 + 1 000 at least: a grant acknowledged at 900 overlaps.
        assert_eq!(r.acquire(S2, 890, 9, 900), [TWO]);
        // Reported in either order of acknowledgement: the earlier token's ack came last.
        let mut r = Run::new();
        r.session(S1, 0, 10_000);
        r.session(S2, 0, 10_000);
        assert!(r.acquire(S2, 890, 9, 900).is_empty());
        assert_eq!(r.acquire(S1, 100, 5, 110), [TWO]);
    }

    #[test]
    fn a_grant_after_the_ttl_and_its_lock_delay_or_after_its_session_died_is_no_failure() {
        let mut r = Run::new();
        r.session(S1, 0, 10_000);
        r.session(S2, 0, 10_000);
        assert!(r.acquire(S1, 100, 5, 110).is_empty());
        assert!(r.acquire(S2, 1_600, 9, 1_610).is_empty(), "after 100 + 1 000 + 500 of lock-delay");
        // The holder's session lapsed first (heartbeat at 0, ttl 300): dead at 300.
        let mut r = Run::new();
        r.session(S1, 0, 300);
        r.session(S2, 0, 10_000);
        assert!(r.acquire(S1, 100, 5, 110).is_empty());
        assert!(r.acquire(S2, 850, 9, 860).is_empty(), "after 300 + 500 of lock-delay");
        assert!(r.c.pairs_judged > 0);
    }

    #[test]
    fn a_grant_inside_the_lock_delay_of_a_grant_that_died_without_release_is_found() {
        let mut r = Run::new();
        r.session(S1, 0, 10_000);
        r.session(S2, 0, 10_000);
        assert!(r.acquire(S1, 100, 5, 110).is_empty());
        assert_eq!(r.acquire(S2, 1_300, 9, 1_310), [LOCK_DELAY_HONOURED]);
    }

    #[test]
    fn a_release_rotate_revoke_or_close_begun_before_excuses_the_earlier_grant() {
        let excuses = [
            Asked::Release { key: "k".into(), token: 5 },
            Asked::Rotate { key: "k".into(), session: S1, token: 5, ttl_ms: 1_000, delay_ms: 500 },
            Asked::Revoke { key: "k".into() },
            Asked::Close { session: S1 },
        ];
        for excuse in excuses {
            let mut r = Run::new();
            r.session(S1, 0, 10_000);
            r.session(S2, 0, 10_000);
            assert!(r.acquire(S1, 100, 5, 110).is_empty());
            // Its outcome unknown: it may have applied.
            assert!(r.call(excuse.clone(), 200, Answered::Unknown, 210).is_empty());
            assert!(r.acquire(S2, 300, 9, 310).is_empty(), "{excuse:?} excuses");
        }
        // A revoke that ended before the grant's call began removed an earlier grant only.
        let mut r = Run::new();
        r.session(S1, 0, 10_000);
        r.session(S2, 0, 10_000);
        assert!(r.call(Asked::Revoke { key: "k".into() }, 50, Answered::Other, 60).is_empty());
        assert!(r.acquire(S1, 100, 5, 110).is_empty());
        assert_eq!(r.acquire(S2, 300, 9, 310), [TWO]);
    }

    #[test]
    fn an_unknown_outcome_is_no_evidence_and_a_renew_extends_the_grant() {
        let mut r = Run::new();
        r.session(S1, 0, 10_000);
        r.session(S2, 0, 10_000);
        let asked = Asked::Acquire { key: "k".into(), session: S1, ttl_ms: 1_000, delay_ms: 0 };
        assert!(r.call(asked, 100, Answered::Unknown, 110).is_empty());
        assert!(r.acquire(S2, 300, 9, 310).is_empty(), "an acquire that failed is no grant");
        let renew = Asked::Renew { key: "k".into(), session: S2, token: 9, ttl_ms: 1_000 };
        assert!(r.call(renew, 1_000, Answered::Renewed, 1_010).is_empty());
        assert_eq!(r.acquire(S1, 1_800, 12, 1_810), [TWO], "the renew begun at 1 000 keeps it to 2 000");
    }

    #[test]
    fn only_a_judge_clock_running_fast_excuses_an_early_grant() {
        let mut r = Run::new();
        r.rate = 2.0;
        r.session(S1, 0, 10_000);
        r.session(S2, 0, 10_000);
        assert!(r.acquire(S1, 100, 5, 110).is_empty());
        // At rate 2 the 1 000 ms lease and 500 ms delay take 750 ms of true time.
        assert!(r.acquire(S2, 860, 9, 870).is_empty());
        let mut r = Run::new();
        r.rate = 0.5;
        r.session(S1, 0, 10_000);
        r.session(S2, 0, 10_000);
        assert!(r.acquire(S1, 100, 5, 110).is_empty());
        assert_eq!(r.acquire(S2, 860, 9, 870), [TWO], "a slow judge excuses nothing");
    }

    #[test]
    fn a_session_refused_within_the_ttl_of_an_acknowledged_heartbeat_is_found() {
        let mut r = Run::new();
        r.session(S1, 1_000, 3_000);
        let hb = Asked::Heartbeat { session: S1 };
        assert_eq!(r.call(hb.clone(), 2_000, Answered::SessionRefused, 2_010), [HEARTBEAT_KEEPS_SESSION_LIVE]);
        let acquire = Asked::Acquire { key: "k".into(), session: S1, ttl_ms: 1_000, delay_ms: 0 };
        assert_eq!(r.call(acquire, 2_000, Answered::SessionRefused, 2_010), [HEARTBEAT_KEEPS_SESSION_LIVE]);
        // Clean: refused after the ttl, or by a call that began before the ack came back,
        // or after a close began.
        assert!(r.call(hb.clone(), 4_100, Answered::SessionRefused, 4_110).is_empty());
        let mut r = Run::new();
        r.id = 10;
        r.c.begin(1, hb.clone(), 500);
        r.session(S1, 1_000, 3_000);
        assert!(r.c.end(1, Answered::SessionRefused, 1_200, |_, _| 1.0).is_empty());
        assert!(r.call(Asked::Close { session: S1 }, 1_500, Answered::Unknown, 1_510).is_empty());
        assert!(r.call(hb, 2_000, Answered::SessionRefused, 2_010).is_empty());
    }

    #[test]
    fn a_store_that_keeps_lockdbs_clock_may_end_a_lease_one_ticks_advance_early() {
        for (ended, found) in [(1_010, &[][..]), (995, &[TWO][..])] {
            let mut r = Run::new();
            r.c = Calls::new(100);
            r.session(S1, 0, 10_000);
            r.session(S2, 0, 10_000);
            assert!(r.acquire(S1, 100, 5, 110).is_empty());
            // Token 5 lives until 100 + 1 000, less the 100 ms slack.
            let asked = Asked::Acquire { key: "k".into(), session: S2, ttl_ms: 1_000, delay_ms: 0 };
            assert_eq!(r.call(asked, ended - 10, Answered::Granted { token: 9 }, ended), found, "ended at {ended}");
        }
    }

    #[test]
    fn a_grant_whose_call_began_after_a_greater_token_was_acknowledged_is_found() {
        let mut r = Run::new();
        r.session(S1, 0, 10_000);
        let grant = |r: &mut Run, key: &str, began, token| {
            let asked = Asked::Acquire { key: key.into(), session: S1, ttl_ms: 1_000, delay_ms: 0 };
            r.call(asked, began, Answered::Granted { token }, began + 10)
        };
        assert!(grant(&mut r, "j", 100, 7).is_empty());
        // Overlapping calls may commit in either order: no failure.
        assert!(grant(&mut r, "k", 105, 5).is_empty());
        assert_eq!(grant(&mut r, "m", 200, 6), [super::super::ids::TOKENS_INCREASE]);
        assert!(grant(&mut r, "n", 300, 8).is_empty());
    }

    #[test]
    fn the_tally_counts_overlaps_only_a_fast_judge_excused_and_the_longest_takeover() {
        let mut r = Run::new();
        r.rate = 2.0;
        r.session(S1, 0, 10_000);
        r.session(S2, 0, 10_000);
        assert!(r.acquire(S1, 100, 5, 110).is_empty());
        assert!(r.acquire(S2, 860, 9, 870).is_empty(), "excused by the judge's rate 2");
        assert_eq!(r.c.tally().excused_by_rate, 1);
        // Token 9 lives until 860 + 1 000 and its lock-delay (500) at most: an acquire
        // refused at 2 600 was refused 240 ms past it.
        r.rate = 1.0;
        let busy = Asked::Acquire { key: "k".into(), session: S1, ttl_ms: 1_000, delay_ms: 500 };
        assert!(r.call(busy.clone(), 2_000, Answered::KeyBusy, 2_005).is_empty());
        assert_eq!(r.c.tally().longest_takeover_ms, 0, "within the lease and its delay");
        assert!(r.call(busy.clone(), 2_600, Answered::KeyBusy, 2_605).is_empty());
        assert_eq!(r.c.tally().longest_takeover_ms, 240);
        // A renew whose outcome is unknown may have kept it: no takeover delay then.
        let renew = Asked::Renew { key: "k".into(), session: S1, token: 9, ttl_ms: 1_000 };
        assert!(r.call(renew, 2_650, Answered::Unknown, 2_660).is_empty());
        assert!(r.call(busy, 2_700, Answered::KeyBusy, 2_705).is_empty());
        assert_eq!(r.c.tally().longest_takeover_ms, 240);
    }

    #[test]
    fn a_full_table_switches_the_checker_off_rather_than_forget_an_excuse() {
        let mut c = Calls::new(0);
        for id in 0..TRACKED_MAX as u64 {
            c.begin(id, Asked::Release { key: "k".into(), token: i64::try_from(id).unwrap_or(0) }, 0);
        }
        assert!(!c.partial());
        c.begin(u64::MAX, Asked::Release { key: "k".into(), token: -1 }, 0);
        assert!(c.partial());
    }
}
