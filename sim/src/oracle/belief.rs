//! The holders' beliefs (issue 35 part 3): **no two executors believe they hold one key at
//! the same instant**, while clock rates stay within the lock client's margin, on every
//! backend. Judged online, in true (simulated) time, from what the holders themselves say
//! on the event seam ([`dlock_rt::events`]), not from any store:
//! - `lease_belief` (`dlock-lock-client`'s guard): a grant believed (`granted`, `renewed`)
//!   until its local deadline on the holder node's monotonic clock, or no longer
//!   (`released`, `lost`, `early_notice`);
//! - `session_belief` (its session): a grant is believed only while its session is too, so
//!   the session's local deadline bounds every grant of it (`opened`, `extended`, `lost`).
//!
//! When a holder starts to believe in a grant (`granted`, its local deadline and its
//! session's still ahead of its node's clock: an answer that came back too late is no
//! belief), every other session's grant of the same key is asked whether its holder still
//! believes *now*: its node's monotonic
//! reading is before both its grant's and its session's local deadline, and neither was
//! given up. A crashed node believes nothing (the process is gone). A revoked grant
//! (`revoke`, L8) is not judged: a revoke promises no exclusion, the fences do.
//!
//! **The clock assumption.** A holder believes `(1 − m) × ttl` of its own clock from before
//! it sent the request; a judge (the simulation lockdb's reference clock, or on etcd any
//! lock replica) ends the grant no sooner than `ttl` of its own clock after it decided. So
//! two beliefs overlap only if the holder's clock ran slower than `(1 − m)` times the
//! judge's ([`rates_excuse`]). Such an overlap is excused (the fences still hold it: the
//! other invariants judge that); any other is a failure. Wall-clock offsets and steps never
//! excuse anything: no decision reads a wall clock.
//!
//! Invariants of this module:
//! - Pure over its inputs: the node clock readings come in through the caller (`reading`),
//!   so a unit test feeds hand-made beliefs and clocks.
//! - Bounded: a believer is kept until given up, its node crashes, or it is replaced by a
//!   later belief of the same `(key, token)`; at most [`BELIEVERS_MAX`] are kept (past it
//!   the oldest key's are forgotten, which can only miss a failure, never invent one).

use std::collections::BTreeMap;

use dlock_rt::events::Fields;
use serde_json::Value;

use crate::outcome::Failure;

/// The invariant's id.
pub const NO_TWO_BELIEVING_HOLDERS: &str = "no_two_believing_holders";

/// Bound on the grants whose holders' beliefs are kept.
pub const BELIEVERS_MAX: usize = 65_536;

#[derive(Debug, Clone)]
struct SessionBelief<N> {
    node: N,
    deadline_ms: u64,
    lost: bool,
}

#[derive(Debug, Clone)]
struct Held<N> {
    node: N,
    session: String,
    owner: String,
    deadline_ms: u64,
    /// When (monitor ms) this holder began to believe in this grant.
    since_ms: u64,
}

/// A world's node: madsim's node id (a plain number outside the simulation, where only
/// the pure checkers build).
#[cfg(madsim)]
pub type Node = madsim::task::NodeId;
#[cfg(not(madsim))]
pub type Node = u64;

/// The beliefs of every holder, and the clock rates that may excuse an overlap; `N` names
/// a node ([`Node`] in a world).
#[derive(Debug)]
pub struct Beliefs<N = Node> {
    sessions: BTreeMap<String, SessionBelief<N>>,
    /// key -> token -> its holder's belief.
    held: BTreeMap<String, BTreeMap<i64, Held<N>>>,
    /// node -> its clock rate changes (monitor ms, rate), in order.
    rates: BTreeMap<N, Vec<(u64, f64)>>,
    /// The nodes that judge leases besides the reference clock (etcd's lock replicas).
    judges: Vec<N>,
    /// Every revoked `(key, token)` (at most [`BELIEVERS_MAX`]): a revoke can commit before
    /// its holder's `granted` is emitted (a rotate's grant revoked at once), so a belief in
    /// a revoked grant is never kept.
    revoked: std::collections::BTreeSet<(String, i64)>,
    /// The lock client's safety margin `m`.
    margin: f64,
    /// Overlaps excused by clock rates (for the summary's probe counts).
    excused: u64,
}

fn text(f: &Fields, k: &str) -> Option<String> {
    f.get(k).and_then(Value::as_str).map(str::to_owned)
}

fn int(f: &Fields, k: &str) -> Option<i64> {
    f.get(k).and_then(Value::as_i64)
}

impl<N> Default for Beliefs<N> {
    fn default() -> Self {
        Beliefs {
            sessions: BTreeMap::new(),
            held: BTreeMap::new(),
            rates: BTreeMap::new(),
            judges: Vec::new(),
            revoked: std::collections::BTreeSet::new(),
            margin: 0.0,
            excused: 0,
        }
    }
}

impl<N: Ord + Copy + std::fmt::Debug> Beliefs<N> {
    /// Beliefs judged with the lock client's safety margin `margin`, against the reference
    /// clock and the clocks of `judges` (etcd's lock replicas; none on the simulation lockdb).
    pub fn new(margin: f64, judges: Vec<N>) -> Beliefs<N> {
        Beliefs { margin, judges, ..Beliefs::default() }
    }

    /// The fastest rate any judging clock ran at during `[from_ms, to_ms]`: the reference
    /// clock's 1, or a judge's (every rate it had then).
    pub fn fastest_judge(&self, from_ms: u64, to_ms: u64) -> f64 {
        self.judges.iter().flat_map(|j| rates_within(&self.rates, *j, from_ms, to_ms)).fold(1.0_f64, f64::max)
    }

    /// Overlaps excused by clock rates so far.
    pub fn excused(&self) -> u64 {
        self.excused
    }

    /// `node`'s clock rate was set to `rate` at `at_ms`.
    pub fn note_rate(&mut self, node: N, at_ms: u64, rate: f64) {
        self.rates.entry(node).or_default().push((at_ms, rate));
    }

    /// An operator revoked `(key, token)` (L8): its holder may believe on until it learns,
    /// and no exclusion is promised past a revoke (the fences hold it); it is not judged.
    pub fn revoked(&mut self, key: &str, token: i64) {
        if self.revoked.len() >= BELIEVERS_MAX {
            self.revoked.clear();
        }
        self.revoked.insert((key.to_owned(), token));
        if let Some(grants) = self.held.get_mut(key) {
            grants.remove(&token);
            if grants.is_empty() {
                self.held.remove(key);
            }
        }
    }

    /// `node` crashed: its process believes nothing any more.
    pub fn node_crashed(&mut self, node: N) {
        self.sessions.retain(|_, s| s.node != node);
        for grants in self.held.values_mut() {
            grants.retain(|_, h| h.node != node);
        }
        self.held.retain(|_, g| !g.is_empty());
    }

    /// One seam event of `node` at `at_ms`; `reading` reads a node's monotonic clock now
    /// (whole ms, the scale of `local_deadline_mono_ms`). A failure when a holder starts to
    /// believe while another session's holder of the key still does, unexcused.
    pub fn on_event(
        &mut self,
        node: N,
        kind: &str,
        f: &Fields,
        at_ms: u64,
        reading: impl Fn(N) -> u64,
    ) -> Option<Failure> {
        match kind {
            "session_belief" => {
                let (session, deadline, source) =
                    (text(f, "session")?, int(f, "local_deadline_mono_ms")?, text(f, "source")?);
                let deadline_ms = u64::try_from(deadline).unwrap_or(0);
                let lost = source == "lost";
                self.sessions.insert(session, SessionBelief { node, deadline_ms, lost });
                None
            }
            "lease_belief" => {
                let (key, token, source) = (text(f, "key")?, int(f, "token")?, text(f, "source")?);
                match source.as_str() {
                    "granted" | "renewed" => {
                        if self.revoked.contains(&(key.clone(), token)) {
                            return None;
                        }
                        let session = text(f, "session")?;
                        let deadline_ms = u64::try_from(int(f, "local_deadline_mono_ms")?).unwrap_or(0);
                        // A belief is judged only if its holder believes now: an answer that
                        // arrived after its local deadline (the holder's clock counted from
                        // before it sent the request) is no belief at all.
                        let believes = self.believes_at(&session, deadline_ms, reading(node));
                        let failure = if source == "granted" && believes {
                            self.overlap(&key, token, &session, at_ms, &reading)
                        } else {
                            None
                        };
                        let since_ms = self.held.get(&key).and_then(|g| g.get(&token)).map_or(at_ms, |h| h.since_ms);
                        let owner = text(f, "owner").unwrap_or_default();
                        self.bound();
                        self.held
                            .entry(key)
                            .or_default()
                            .insert(token, Held { node, session, owner, deadline_ms, since_ms });
                        failure
                    }
                    _ => {
                        if let Some(grants) = self.held.get_mut(&key) {
                            grants.remove(&token);
                            if grants.is_empty() {
                                self.held.remove(&key);
                            }
                        }
                        None
                    }
                }
            }
            "revoke" => {
                self.revoked(&text(f, "key")?, int(f, "token")?);
                None
            }
            _ => None,
        }
    }

    /// Whether `h`'s holder believes now, its node's clock reading `now`.
    fn believes(&self, h: &Held<N>, now: u64) -> bool {
        self.believes_at(&h.session, h.deadline_ms, now)
    }

    /// Whether a holder of `session` whose grant's local deadline is `deadline_ms` believes
    /// when its node's clock reads `now`: before both that deadline and its session's, and
    /// the session not given up.
    fn believes_at(&self, session: &str, deadline_ms: u64, now: u64) -> bool {
        let session = self.sessions.get(session);
        now < deadline_ms && session.is_none_or(|s| !s.lost && now < s.deadline_ms)
    }

    /// The failure, if a holder of another session still believes in a grant of `key` as
    /// the holder of `token` (of `session`) starts to.
    fn overlap(
        &mut self,
        key: &str,
        token: i64,
        session: &str,
        at_ms: u64,
        reading: &impl Fn(N) -> u64,
    ) -> Option<Failure> {
        let grants = self.held.get(key)?;
        let other = grants
            .iter()
            .find(|(t, h)| **t != token && h.session != session && self.believes(h, reading(h.node)))
            .map(|(t, h)| (*t, h.clone()))?;
        let (other_token, h) = other;
        if rates_excuse(&self.rates, h.node, &self.judges, h.since_ms, at_ms, self.margin) {
            self.excused += 1;
            return None;
        }
        Some(Failure::correctness(
            NO_TWO_BELIEVING_HOLDERS,
            format!(
                "key {key}: token {token} (session {session}) believed held while {} still believed token {other_token} \
                 (session {}, local deadline {} ms, its clock at {} ms)",
                h.owner,
                h.session,
                h.deadline_ms,
                reading(h.node)
            ),
        ))
    }

    /// Keeps at most [`BELIEVERS_MAX`] grants: past it, forgets the first key's.
    fn bound(&mut self) {
        while self.held.values().map(BTreeMap::len).sum::<usize>() >= BELIEVERS_MAX {
            let Some(first) = self.held.keys().next().cloned() else { break };
            self.held.remove(&first);
        }
    }
}

/// The rates `node`'s clock ran at during `[from_ms, to_ms]`: the one set last before
/// `from_ms` (1 when none) and every one set within.
fn rates_within<N: Ord>(rates: &BTreeMap<N, Vec<(u64, f64)>>, node: N, from_ms: u64, to_ms: u64) -> Vec<f64> {
    let changes = rates.get(&node).map(Vec::as_slice).unwrap_or_default();
    let before = changes.iter().rev().find(|(at, _)| *at <= from_ms).map_or(1.0, |(_, r)| *r);
    let mut all = vec![before];
    all.extend(changes.iter().filter(|(at, _)| *at > from_ms && *at <= to_ms).map(|(_, r)| *r));
    all
}

/// Whether clock rates excuse an overlap with a belief held by `holder` since `from_ms`,
/// seen at `to_ms`: the holder's clock ran slower, at some point of that window, than
/// `(1 − margin)` times the fastest judge's (the reference clock's rate is 1, and every
/// node of `judges` counts with every rate it had then). A conservative reading: a rate
/// reset back to 1 is not recorded, so a drift once set keeps excusing.
pub fn rates_excuse<N: Ord + Copy>(
    rates: &BTreeMap<N, Vec<(u64, f64)>>,
    holder: N,
    judges: &[N],
    from_ms: u64,
    to_ms: u64,
    margin: f64,
) -> bool {
    let slowest = rates_within(rates, holder, from_ms, to_ms).into_iter().fold(f64::INFINITY, f64::min);
    let fastest = judges.iter().flat_map(|j| rates_within(rates, *j, from_ms, to_ms)).fold(1.0_f64, f64::max);
    slowest < (1.0 - margin) * fastest
}

#[cfg(test)]
mod tests {
    //! The checker fed hand-made beliefs and clocks: it reports an overlap, and nothing on
    //! the clean versions of the same beliefs.

    use std::cell::RefCell;

    use super::*;

    fn lease(key: &str, token: i64, session: &str, deadline: u64, source: &str) -> Fields {
        [
            ("key", Value::from(key)),
            ("token", token.into()),
            ("session", session.into()),
            ("owner", format!("executor-{session}/0").into()),
            ("local_deadline_mono_ms", deadline.into()),
            ("source", source.into()),
        ]
        .into_iter()
        .collect()
    }

    fn session(id: &str, deadline: u64, source: &str) -> Fields {
        [("session", Value::from(id)), ("local_deadline_mono_ms", deadline.into()), ("source", source.into())]
            .into_iter()
            .collect()
    }

    /// Nodes 1 and 2 hold; each node's clock reads what `clocks` says.
    struct World {
        beliefs: Beliefs<u64>,
        clocks: RefCell<BTreeMap<u64, u64>>,
    }

    impl World {
        fn new(judges: Vec<u64>) -> World {
            World { beliefs: Beliefs::new(0.3, judges), clocks: RefCell::new(BTreeMap::new()) }
        }

        fn at(&self, node: u64, ms: u64) {
            self.clocks.borrow_mut().insert(node, ms);
        }

        fn emit(&mut self, node: u64, kind: &str, f: Fields, at_ms: u64) -> Option<Failure> {
            let clocks = self.clocks.borrow().clone();
            self.beliefs.on_event(node, kind, &f, at_ms, |n| clocks.get(&n).copied().unwrap_or(0))
        }
    }

    #[test]
    fn a_grant_believed_while_another_sessions_holder_still_believes_is_a_failure() {
        let mut w = World::new(Vec::new());
        w.at(1, 100);
        assert!(w.emit(1, "session_belief", session("a", 5_000, "opened"), 0).is_none());
        assert!(w.emit(1, "lease_belief", lease("k", 1, "a", 2_000, "granted"), 0).is_none());
        w.at(1, 1_500);
        let f = w.emit(2, "lease_belief", lease("k", 2, "b", 9_000, "granted"), 1_500).expect("an overlap");
        assert_eq!(f.invariant, NO_TWO_BELIEVING_HOLDERS);
        assert!(f.detail.contains("token 2") && f.detail.contains("token 1"), "{}", f.detail);
    }

    #[test]
    fn a_belief_that_ended_by_its_deadline_its_session_a_release_a_revoke_or_a_crash_is_no_failure() {
        let ends: [&dyn Fn(&mut World); 5] = [
            &|w| w.at(1, 2_000),
            &|w| {
                w.emit(1, "session_belief", session("a", 1_200, "extended"), 1_000);
            },
            &|w| {
                w.emit(1, "lease_belief", lease("k", 1, "a", 2_000, "released"), 1_000);
            },
            &|w| w.beliefs.revoked("k", 1),
            &|w| w.beliefs.node_crashed(1),
        ];
        for (i, end) in ends.iter().enumerate() {
            let mut w = World::new(Vec::new());
            w.at(1, 100);
            w.emit(1, "session_belief", session("a", 5_000, "opened"), 0);
            w.emit(1, "lease_belief", lease("k", 1, "a", 2_000, "granted"), 0);
            w.at(1, 1_500);
            end(&mut w);
            assert!(w.emit(2, "lease_belief", lease("k", 2, "b", 9_000, "granted"), 1_500).is_none(), "case {i}");
        }
    }

    /// A grant whose answer reached its holder after the holder's local deadline (a delayed
    /// answer: the deadline counts from before the request) is never believed: no overlap
    /// (seed 10260 of the campaign), while the same grant arriving in time is one.
    #[test]
    fn a_belief_that_arrived_past_its_own_deadline_overlaps_nothing() {
        for (deadline, fails) in [(1_400, false), (1_600, true)] {
            let mut w = World::new(Vec::new());
            w.emit(1, "lease_belief", lease("k", 2, "b", 9_000, "granted"), 0);
            w.at(2, 1_500);
            let found = w.emit(2, "lease_belief", lease("k", 1, "a", deadline, "granted"), 1_500);
            assert_eq!(found.is_some(), fails, "deadline {deadline}");
        }
    }

    /// A revoke that commits before its holder's `granted` is emitted (a rotate's fresh grant
    /// revoked at once) still ends that belief.
    #[test]
    fn a_grant_revoked_before_its_holder_said_it_believed_is_not_judged() {
        let mut w = World::new(Vec::new());
        w.at(1, 100);
        w.beliefs.revoked("k", 1);
        w.emit(1, "lease_belief", lease("k", 1, "a", 2_000, "granted"), 0);
        assert!(w.emit(2, "lease_belief", lease("k", 2, "b", 9_000, "granted"), 10).is_none());
    }

    /// One session's grants (a rotate) and other keys never overlap.
    #[test]
    fn a_rotate_within_one_session_and_another_key_are_no_failure() {
        let mut w = World::new(Vec::new());
        w.at(1, 100);
        w.emit(1, "lease_belief", lease("k", 1, "a", 2_000, "granted"), 0);
        assert!(w.emit(1, "lease_belief", lease("k", 2, "a", 3_000, "granted"), 100).is_none());
        assert!(w.emit(2, "lease_belief", lease("j", 3, "b", 3_000, "granted"), 100).is_none());
    }

    /// An overlap is excused only when the holder's clock ran slower than `1 − m` times a
    /// judge's; a wall-clock step is never a rate, and a judge within the bound excuses nothing.
    #[test]
    fn only_clock_rates_beyond_the_margin_excuse_an_overlap() {
        let overlap = |rates: &[(u64, u64, f64)], judges: Vec<u64>| {
            let mut w = World::new(judges);
            for (node, at, rate) in rates {
                w.beliefs.note_rate(*node, *at, *rate);
            }
            w.at(1, 100);
            w.emit(1, "lease_belief", lease("k", 1, "a", 2_000, "granted"), 10);
            w.at(1, 1_500);
            w.emit(2, "lease_belief", lease("k", 2, "b", 9_000, "granted"), 1_500)
        };
        assert!(overlap(&[], vec![]).is_some(), "no drift: a failure");
        assert!(overlap(&[(1, 0, 0.8)], vec![]).is_some(), "0.8 is within a 0.3 margin");
        assert!(overlap(&[(1, 5, 0.6)], vec![]).is_none(), "a holder at 0.6 believes past the judge");
        assert!(overlap(&[(1, 2_000, 0.6)], vec![]).is_some(), "a drift after the overlap excuses nothing");
        assert!(overlap(&[(9, 5, 1.5)], vec![9]).is_none(), "an etcd judge at 1.5 ends leases early");
        assert!(overlap(&[(9, 5, 1.2)], vec![9]).is_some(), "1.2 against a holder at 1 is within the margin");
        assert!(overlap(&[(9, 5, 1.5)], vec![]).is_some(), "a node that judges nothing excuses nothing");
    }
}
