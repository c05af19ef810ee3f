//! The lock rules, once: pure functions from the facts a store read to the decision it must
//! apply. No I/O, no clock reads (`now_ms` is the store's clock, read by the store and
//! handed in: lockdb's clock on SQL, the judging replica's frame on etcd), no randomness.
//!
//! Every backend (the simulation store, SQLite, PostgreSQL, etcd) reads the facts in its own
//! atomic step, calls these functions, and applies the answer under its own conditional
//! write: the SQL predicates (`expires_at_ms > now`, `ON CONFLICT DO NOTHING`, the
//! per-key advisory lock) and etcd's value guards stay the authority against races; these
//! functions only decide what a consistent snapshot means. Tests in `store_sql` hold the SQL
//! predicates that re-state a rule inside one statement to the function here.
//!
//! ## Invariants (asserted in release builds too)
//! - A grant is live iff `now < min(lease end, session end)`; a grant whose session is gone
//!   (closed, or forgotten) is dead and counts as released: no lock-delay.
//! - A recorded lock-delay never decreases ([`merge_delay`]).
//! - A token issued is strictly greater than the last one issued, the floor, and the token of
//!   the grant it replaces ([`next_token`], [`assert_token_replaces`]).
//! - An acquire grants only when the caller's session is live, no live grant holds the key,
//!   and no lock-delay runs at `now`.
//! - A caller bound to owner ids addresses only sessions and grants stored for one of them
//!   ([`may_address`]); an unbound caller addresses any.
//! - A rotate ([`decide_rotate`]) is a release followed by an acquire, decided on one
//!   snapshot: it grants only when the caller's session is live and holds the live grant
//!   `(key, token)`; the new token must exceed `token` ([`assert_token_replaces`]).
//!
//! - What L7 shows of a key ([`judge_key`]) is judged at one `now` of the store's clock: a
//!   grant shown live has time left (`> 0`), a lock-delay shown runs (`> 0` left), and no
//!   stored token exceeds the token floor shown.
//! - A page of held keys (C3-extensions E-23) reads exactly the keys [`key_range`] bounds:
//!   those that start with the prefix and sort after the cursor, in bytewise order.
//!
//! All instants are Unix epoch milliseconds; comparisons are exact integers (no rounding).

use std::ops::Bound;

use uuid::Uuid;

use crate::store::{AcquireRefusal, GrantRow, KeyInfo, RenewRefusal, RevokeRefusal, RotateRefusal, SessionRefusal};

/// A session may act at `now` iff it exists (`Some(end)`, closed or forgotten sessions are
/// `None`) and `now < end`. An expired session that is still remembered answers `Expired`.
pub fn session_check(session_end_ms: Option<i64>, now_ms: i64) -> Result<(), SessionRefusal> {
    match session_end_ms {
        None => Err(SessionRefusal::Unknown),
        Some(end) if now_ms < end => Ok(()),
        Some(_) => Err(SessionRefusal::Expired),
    }
}

/// When a grant dies: the earlier of its lease end and its holder session's end.
///
/// `None` when the holder session is gone (closed, or forgotten after retention): the grant
/// is dead already and counts as released by the close, so it carries no lock-delay. (On the
/// SQL backends the session's deletion cascades to its grants, so this cannot arise there;
/// on etcd an acquire can commit beside a concurrent close of the same session.)
pub fn grant_dies_at(lease_end_ms: i64, session_end_ms: Option<i64>) -> Option<i64> {
    session_end_ms.map(|s| s.min(lease_end_ms))
}

/// Whether a grant is live at `now`: `now` is before [`grant_dies_at`].
pub fn grant_live(lease_end_ms: i64, session_end_ms: Option<i64>, now_ms: i64) -> bool {
    // Planted bug `lease-end-inclusive` (simulation only): still live at the very tick it
    // ends.
    if dlock_contract::planted::on(dlock_contract::planted::Bug::LeaseEndInclusive) {
        return grant_dies_at(lease_end_ms, session_end_ms).is_some_and(|t| now_ms <= t);
    }
    grant_dies_at(lease_end_ms, session_end_ms).is_some_and(|t| now_ms < t)
}

/// The lock-delay a grant that died at `died_at_ms` *without release* imposes: nobody else
/// may be granted the key before `died_at + delay_ms`. `None` when it imposes none
/// (`delay_ms <= 0`, or the grant counts as released: `died_at_ms` is `None`). Saturates.
pub fn lock_delay_until(died_at_ms: Option<i64>, delay_ms: i64) -> Option<i64> {
    died_at_ms.filter(|_| delay_ms > 0).map(|d| d.saturating_add(delay_ms))
}

/// A key's recorded lock-delay after adding `until_ms`: the later of the two. Never lowers
/// what was recorded (the SQL `RECORD_DELAY` statement is the same `CASE`).
pub fn merge_delay(recorded_ms: Option<i64>, until_ms: Option<i64>) -> Option<i64> {
    let merged = match (recorded_ms, until_ms) {
        (Some(r), Some(u)) => Some(r.max(u)),
        (r, u) => r.or(u),
    };
    assert!(merged >= recorded_ms, "lock-delay lowered: {recorded_ms:?} -> {merged:?}");
    merged
}

/// The next token from a counter: one past both the last issued and the floor.
pub fn next_token(last_issued: i64, floor: i64) -> i64 {
    let token = last_issued.max(floor).checked_add(1);
    let token = token.unwrap_or_else(|| panic!("token space exhausted at {last_issued}/{floor}"));
    assert!(token > last_issued && token > floor);
    token
}

/// Asserts a new grant's token exceeds the token of the grant it replaced (FR-10).
pub fn assert_token_replaces(token: i64, replaced: Option<i64>) {
    if let Some(old) = replaced {
        assert!(token > old, "token {token} issued over a grant holding {old}");
    }
}

/// A key's grant as read, with its holder session's end (`None`: that session is gone).
#[derive(Debug, Clone, Copy)]
pub struct GrantFacts<'a> {
    pub grant: &'a GrantRow,
    pub holder_end_ms: Option<i64>,
}

impl GrantFacts<'_> {
    pub fn dies_at(&self) -> Option<i64> {
        grant_dies_at(self.grant.expires_at_ms, self.holder_end_ms)
    }

    pub fn live(&self, now_ms: i64) -> bool {
        grant_live(self.grant.expires_at_ms, self.holder_end_ms, now_ms)
    }
}

/// What L7 shows of a key a store read at `now_ms` (its own clock): the grant if it is
/// live, how long it has left, how long the key's recorded lock-delay (`delay_until_ms`)
/// still runs, and the token floor (`token_floor`: every later token exceeds it).
///
/// A grant that died without release and is still stored shows the lock-delay its removal
/// will record ([`lock_delay_until`] with `delay_ms`), merged with the recorded one.
pub fn judge_key(
    grant: Option<GrantFacts<'_>>,
    delay_until_ms: Option<i64>,
    delay_ms: i64,
    token_floor: i64,
    now_ms: i64,
) -> KeyInfo {
    let live = grant.filter(|g| g.live(now_ms));
    let lease_left_ms = live.and_then(|g| g.dies_at()).map(|d| d.saturating_sub(now_ms));
    let pending = grant.filter(|g| !g.live(now_ms)).and_then(|g| lock_delay_until(g.dies_at(), delay_ms));
    let delay_until_ms = merge_delay(delay_until_ms, pending);
    let delay_left_ms = delay_until_ms.filter(|u| *u > now_ms).map(|u| u.saturating_sub(now_ms));
    assert!(lease_left_ms.is_none_or(|l| l > 0), "a live grant with {lease_left_ms:?} ms left");
    assert!(delay_left_ms.is_none_or(|l| l > 0), "a running lock-delay with {delay_left_ms:?} ms left");
    if let Some(g) = grant {
        assert!(
            g.grant.fencing_token <= token_floor,
            "token {} stored above the floor {token_floor}",
            g.grant.fencing_token
        );
    }
    KeyInfo { grant: live.map(|g| g.grant.clone()), lease_left_ms, delay_left_ms, token_floor }
}

/// The bounds of the lock keys that start with `prefix` and sort after `after` (bytewise, as
/// every backend orders keys: SQLite's `BINARY`, PostgreSQL's `COLLATE "C"`, etcd's bytes,
/// a `BTreeMap<String, _>`), for one page of held keys (C3-extensions E-23); `None` when no
/// key can lie in them. `prefix` is empty (every key) or of C3's key alphabet (ASCII below
/// `~`), so the keys starting with it end below `prefix` with its last byte raised by one.
pub fn key_range(prefix: &str, after: Option<&str>) -> Option<(Bound<String>, Bound<String>)> {
    assert!(prefix.bytes().all(|b| b < b'~'), "a key prefix outside C3's alphabet: {prefix:?}");
    let until = match prefix.as_bytes().split_last() {
        None => Bound::Unbounded,
        Some((last, head)) => {
            let mut end = head.to_vec();
            end.push(last + 1);
            Bound::Excluded(String::from_utf8(end).unwrap_or_else(|_| unreachable!("ASCII stays ASCII")))
        }
    };
    let from = match after {
        Some(a) if a >= prefix => Bound::Excluded(a.to_owned()),
        _ if prefix.is_empty() => Bound::Unbounded,
        _ => Bound::Included(prefix.to_owned()),
    };
    if let (Bound::Excluded(a), Bound::Excluded(u)) = (&from, &until) {
        if a >= u {
            return None;
        }
    }
    Some((from, until))
}

/// What an acquire read: the caller's session, the key's grant, the key's record.
#[derive(Debug, Clone, Copy)]
pub struct AcquireFacts<'a> {
    pub now_ms: i64,
    pub session_id: Uuid,
    /// The caller's session end (`None`: unknown).
    pub session_end_ms: Option<i64>,
    pub grant: Option<GrantFacts<'a>>,
    /// The key's record: `None` never granted, `Some(delay_until)` seen.
    pub key: Option<Option<i64>>,
    pub delay_ms: i64,
}

/// A dead grant the acquire removes before deciding further.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Removal {
    /// The dead grant `(key, token)`: remove exactly that row.
    pub token: i64,
    /// When it died (`None`: released, its session is gone).
    pub died_at_ms: Option<i64>,
    /// The lock-delay its loss imposes, to merge into the key record ([`merge_delay`]).
    pub delay_until_ms: Option<i64>,
}

/// A grant to issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantPlan {
    /// Write the key record (absent before, or carrying a lock-delay that has run out: it
    /// is cleared). A key seen without a delay needs no write.
    pub write_key_record: bool,
    /// The token of the grant this one replaces, if any (the new token must exceed it).
    pub replaces: Option<i64>,
}

/// The acquire decision: first remove `remove` (if any), then grant or refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireDecision {
    pub remove: Option<Removal>,
    pub verdict: Result<GrantPlan, AcquireRefusal>,
}

/// Decides an acquire (L4) from one snapshot. The session is checked in the same decision
/// that grants (Jepsen's etcd 3.4.3 lock bug). A live grant refuses (`AlreadyHeld` for the
/// caller's own, not re-entrant; else `Contended`); a dead one is removed, recording its
/// lock-delay, and the key is then free unless a lock-delay runs at `now`.
pub fn decide_acquire(f: &AcquireFacts<'_>) -> AcquireDecision {
    let refuse = |r| AcquireDecision { remove: None, verdict: Err(r) };
    if let Err(r) = session_check(f.session_end_ms, f.now_ms) {
        return refuse(AcquireRefusal::Session(r));
    }
    let mut delay = f.key.flatten();
    let mut remove = None;
    if let Some(g) = f.grant {
        if g.live(f.now_ms) {
            if !dlock_contract::planted::on(dlock_contract::planted::Bug::GrantUnexpired) {
                return refuse(holder_refusal(g.grant, f.session_id));
            }
            // Planted bug `grant-unexpired` (simulation only): the live grant is dropped as
            // if it had expired, and the key granted again.
            let remove = Some(Removal { token: g.grant.fencing_token, died_at_ms: None, delay_until_ms: None });
            let plan = GrantPlan { write_key_record: f.key.is_none(), replaces: Some(g.grant.fencing_token) };
            return AcquireDecision { remove, verdict: Ok(plan) };
        }
        let died_at_ms = g.dies_at();
        let delay_until_ms = lock_delay_until(died_at_ms, f.delay_ms);
        delay = merge_delay(delay, delay_until_ms);
        remove = Some(Removal { token: g.grant.fencing_token, died_at_ms, delay_until_ms });
    }
    if let Some(until) = delay.filter(|u| f.now_ms < *u) {
        return AcquireDecision { remove, verdict: Err(AcquireRefusal::Delayed { until_ms: until }) };
    }
    let plan = GrantPlan { write_key_record: f.key.is_none() || delay.is_some(), replaces: remove.map(|r| r.token) };
    AcquireDecision { remove, verdict: Ok(plan) }
}

/// The refusal a live grant gives an acquire by `session_id`: `AlreadyHeld` when it is the
/// caller's own (acquire is not re-entrant), else `Contended` with its holder.
pub fn holder_refusal(live: &GrantRow, session_id: Uuid) -> AcquireRefusal {
    if live.session_id == session_id {
        AcquireRefusal::AlreadyHeld { fencing_token: live.fencing_token, expires_at_ms: live.expires_at_ms }
    } else {
        AcquireRefusal::Contended { holder_owner_id: live.owner_id.clone(), expires_at_ms: live.expires_at_ms }
    }
}

/// Decides a renew (L5): the caller's session is live and the key's grant is the live grant
/// `(key, token)` of that session. `Lost` carries the key's stored token, live or dead.
pub fn decide_renew(
    session_end_ms: Option<i64>,
    grant: Option<GrantFacts<'_>>,
    session_id: Uuid,
    token: i64,
    now_ms: i64,
) -> Result<(), RenewRefusal> {
    session_check(session_end_ms, now_ms).map_err(RenewRefusal::Session)?;
    match grant {
        Some(g) if g.grant.fencing_token == token && g.grant.session_id == session_id && g.live(now_ms) => Ok(()),
        other => Err(RenewRefusal::Lost { stored_token: other.map(|g| g.grant.fencing_token) }),
    }
}

/// Decides a release (L6): the key's grant is the live grant `(key, token)`; the session is
/// not part of the predicate. `Err` carries the key's stored token, if a row exists.
pub fn decide_release(grant: Option<GrantFacts<'_>>, token: i64, now_ms: i64) -> Result<(), Option<i64>> {
    match grant {
        Some(g) if g.grant.fencing_token == token && g.live(now_ms) => Ok(()),
        other => Err(other.map(|g| g.grant.fencing_token)),
    }
}

/// What a rotate read: what an acquire by the caller's session reads (its grant's holder
/// end matters only when the holder is the caller: a grant of another session refuses
/// whatever its liveness), and the token presented (the grant to release).
#[derive(Debug, Clone, Copy)]
pub struct RotateFacts<'a> {
    pub acquire: AcquireFacts<'a>,
    pub token: i64,
}

/// Decides a rotate (C3-extensions E-18): [`decide_release`] of `(key, token)`, then
/// [`decide_acquire`] by the same session on the state that release leaves (no grant), as
/// one decision. The caller's session is checked first, in the same decision that grants
/// (as renew and acquire do); the grant must be the caller's own (a rotate re-grants to the
/// holder; another session's grant is `Lost`, as renew answers). The release half imposes
/// no lock-delay, so the acquire half refuses only on a lock-delay recorded before (which
/// a live grant never leaves running); then the release does not happen either. `Ok` is the
/// grant to issue, replacing `token`.
pub fn decide_rotate(f: &RotateFacts<'_>) -> Result<GrantPlan, RotateRefusal> {
    // Planted bug `rotate-lapsed-session` (simulation only): the caller's session read as
    // never ending, so its grant is judged by its lease alone.
    let a = &if dlock_contract::planted::on(dlock_contract::planted::Bug::RotateLapsedSession) {
        let forever = |end: Option<i64>| end.map(|_| i64::MAX);
        let grant = f.acquire.grant.map(|g| GrantFacts { holder_end_ms: forever(g.holder_end_ms), ..g });
        AcquireFacts { session_end_ms: forever(f.acquire.session_end_ms), grant, ..f.acquire }
    } else {
        f.acquire
    };
    session_check(a.session_end_ms, a.now_ms).map_err(RotateRefusal::Session)?;
    let own = a.grant.filter(|g| g.grant.session_id == a.session_id);
    let stored = a.grant.map(|g| g.grant.fencing_token);
    if own.is_none() {
        return Err(RotateRefusal::Lost { stored_token: stored });
    }
    decide_release(own, f.token, a.now_ms).map_err(|stored_token| RotateRefusal::Lost { stored_token })?;
    let after_release = decide_acquire(&AcquireFacts { grant: None, ..*a });
    assert!(after_release.remove.is_none(), "a released key has no grant to remove");
    match after_release.verdict {
        Ok(plan) => Ok(GrantPlan { replaces: Some(f.token), ..plan }),
        Err(AcquireRefusal::Delayed { until_ms }) => Err(RotateRefusal::Delayed { until_ms }),
        Err(AcquireRefusal::Session(r)) => Err(RotateRefusal::Session(r)),
        // No grant is left to contend with once the release half ran.
        Err(other @ (AcquireRefusal::Contended { .. } | AcquireRefusal::AlreadyHeld { .. })) => {
            panic!("rotate: acquire over a released key refused {other:?}")
        }
    }
}

/// Decides a revoke (L8): there is a live grant, and it holds `expected_token` if one was
/// given. `Ok` is the token to revoke.
pub fn decide_revoke(
    grant: Option<GrantFacts<'_>>,
    expected_token: Option<i64>,
    now_ms: i64,
) -> Result<i64, RevokeRefusal> {
    let Some(g) = grant.filter(|g| g.live(now_ms)) else { return Err(RevokeRefusal::NotHeld) };
    let current = g.grant.fencing_token;
    if expected_token.is_some_and(|e| e != current) {
        return Err(RevokeRefusal::Stale { current_token: current });
    }
    Ok(current)
}

/// The owner check (C3-extensions E-9, "Owner binding"): whether a caller whose credential
/// is bound to `owners` (`None`: unbound, or authentication off) may address a session or a
/// grant stored for `stored_owner` (`None`: nothing is stored; the store's own answer, such
/// as `SESSION_UNKNOWN` or `LOCK_LOST`, then follows). A bound caller may address only what
/// is stored for an owner it may act as ([`dlock_contract::auth::may_act_as`]).
pub fn may_address(owners: Option<&std::collections::BTreeSet<String>>, stored_owner: Option<&str>) -> bool {
    stored_owner.is_none_or(|o| dlock_contract::auth::may_act_as(owners, o))
}

/// What closing a session (L3) does to one of its grants: `Some(died_at)` when the grant had
/// already died (its lease or the session lapsed at or before `now`), so its lock-delay from
/// that death stands; `None` when it was live and the close releases it (no delay).
pub fn lost_before_close(lease_end_ms: i64, session_end_ms: i64, now_ms: i64) -> Option<i64> {
    grant_dies_at(lease_end_ms, Some(session_end_ms)).filter(|d| *d <= now_ms)
}

/// The reaper's three predicates. A session lapsed (to be marked expired, its grants removed
/// as lost) iff not yet marked and `end <= now`.
pub fn session_lapsed(session_end_ms: i64, expired_marked: bool, now_ms: i64) -> bool {
    !expired_marked && session_end_ms <= now_ms
}

/// A grant whose own lease lapsed (to be removed as lost) iff `lease end <= now`.
pub fn lease_lapsed(lease_end_ms: i64, now_ms: i64) -> bool {
    lease_end_ms <= now_ms
}

/// An expired session is forgotten (then unknown) iff marked and `end + retention <= now`.
pub fn session_forgettable(session_end_ms: i64, expired_marked: bool, retention_ms: i64, now_ms: i64) -> bool {
    expired_marked && session_end_ms.saturating_add(retention_ms) <= now_ms
}

/// The waiter queue (service layer, per replica): what an acquire does on arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Nobody waits: ask the store now.
    AskStore,
    /// A queue waits and the caller will not: refuse as contended without barging past it.
    RefuseNoBarge,
    /// Join the queue (the caller waits and a queue is ahead of it).
    Join,
}

/// The arrival rule: only the head of a non-empty queue asks the store; a no-wait request
/// never barges past waiters.
pub fn on_arrival(queue_empty: bool, wait_ms: i64) -> Arrival {
    match (queue_empty, wait_ms > 0) {
        (true, _) => Arrival::AskStore,
        (false, false) => Arrival::RefuseNoBarge,
        (false, true) => Arrival::Join,
    }
}

/// Whether a queue of `len` waiters has room for one more under `waiters_max`.
pub fn queue_has_room(len: usize, waiters_max: usize) -> bool {
    len < waiters_max
}

/// Whether a store refusal ends an acquire at once, waiting or not: the session cannot act,
/// or it already holds the key. Only contention and lock-delay are worth waiting out.
pub fn ends_the_wait(r: &AcquireRefusal) -> bool {
    matches!(r, AcquireRefusal::Session(_) | AcquireRefusal::AlreadyHeld { .. })
}

/// lockdb's clock row as one replica read it (C1 §1.4.2): its value, its judge (`""`:
/// none) and the judge's term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClockRow {
    pub now_ms: i64,
    pub judge: String,
    pub term: i64,
}

/// What a replica that is not lockdb's judge does about the clock row it just read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockMove {
    /// Take the judge's role, guarded on the row as read.
    TakeOver,
    /// Keep watching: the judge is advancing the clock, or has been silent for less than
    /// the grace.
    Watch,
}

/// Whether a replica takes over lockdb's clock: when nobody judges it, or when the row it
/// read (value, judge and term) has stayed unchanged for `watched_ms >= grace_ms` on the
/// replica's own monotonic clock (a judge advances the value every tick). Taking over is
/// always safe (the old judge's ticks are then refused by their guard, and the clock
/// resumes from the value it stood at); the grace only keeps a live judge from being
/// displaced. `watched_ms` is `None` when the replica has not seen this row before.
pub fn decide_clock(row: &ClockRow, watched_ms: Option<i64>, grace_ms: i64) -> ClockMove {
    if row.judge.is_empty() || watched_ms.is_some_and(|w| w >= grace_ms) {
        ClockMove::TakeOver
    } else {
        ClockMove::Watch
    }
}

/// How far a judge's tick advances lockdb's clock: the whole milliseconds its monotonic
/// clock ran since the last tick it counted (`elapsed_us`, microseconds), at most `max_ms`.
/// The remainder below a millisecond is carried to the next tick, so steady ticks neither
/// gain nor lose by rounding; time beyond `max_ms` (the judge stalled between two ticks) is
/// dropped, so the clock lags by the stall instead of jumping over it. A decision reads the
/// clock as the last tick left it, so a lease decided just before a tick ends at most the
/// advance of that tick (`max_ms`) early in true time, however long the judge stalled; the
/// time dropped only extends leases. Returns `(advance_ms, counted_us)`.
pub fn clock_advance(elapsed_us: u64, max_ms: i64) -> (i64, u64) {
    let ms = elapsed_us / 1_000;
    match i64::try_from(ms) {
        Ok(ms) if ms <= max_ms => (ms, (ms as u64).saturating_mul(1_000)),
        _ => (max_ms.max(0), elapsed_us),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The bounds of a page hold exactly the keys that start with the prefix and sort
        /// after the cursor, over an alphabet with C3's edges (`-`, `_`, `z`) and every length.
        #[test]
        fn key_range_bounds_exactly_the_keys_with_the_prefix_after_the_cursor(
            keys in proptest::collection::btree_set("[-_az]{1,4}", 0..24),
            prefix in "[-_az]{0,2}",
            after in proptest::option::of("[-_az]{1,4}"),
        ) {
            let want: Vec<&String> = keys
                .iter()
                .filter(|k| k.starts_with(prefix.as_str()) && after.as_ref().is_none_or(|a| k.as_str() > a.as_str()))
                .collect();
            let got: Vec<&String> = match key_range(&prefix, after.as_deref()) {
                None => Vec::new(),
                Some((from, until)) => keys.range::<str, _>((from.as_ref().map(String::as_str), until.as_ref().map(String::as_str))).collect(),
            };
            prop_assert_eq!(got, want);
        }
    }

    /// A replica takes over lockdb's clock when nobody judges it, or when the row stood
    /// still for the whole grace on its clock; never from a row it has just seen change.
    #[test]
    fn a_replica_takes_over_the_clock_only_when_unjudged_or_silent_for_the_grace() {
        let row = |judge: &str| ClockRow { now_ms: 10, judge: judge.to_owned(), term: 3 };
        assert_eq!(decide_clock(&row(""), None, 1_000), ClockMove::TakeOver, "nobody judges");
        assert_eq!(decide_clock(&row("j"), None, 1_000), ClockMove::Watch, "a row just seen");
        assert_eq!(decide_clock(&row("j"), Some(999), 1_000), ClockMove::Watch, "silent, within the grace");
        assert_eq!(decide_clock(&row("j"), Some(1_000), 1_000), ClockMove::TakeOver, "silent for the grace");
    }

    /// A tick advances by whole milliseconds and carries the rest: over any split of one
    /// duration into ticks, the clock advances by the duration's whole ms, never more.
    #[test]
    fn ticks_advance_the_clock_by_whole_ms_and_carry_the_rest() {
        assert_eq!(clock_advance(0, 100), (0, 0));
        assert_eq!(clock_advance(999, 100), (0, 0));
        assert_eq!(clock_advance(50_700, 100), (50, 50_000));
        let (mut carried, mut advanced) = (0u64, 0i64);
        for step in [333u64, 49_999, 50_001, 1, 12_345] {
            let (ms, counted) = clock_advance(carried + step, 100);
            advanced += ms;
            carried = carried + step - counted;
        }
        assert_eq!(advanced, (333 + 49_999 + 50_001 + 1 + 12_345) / 1_000);
    }

    /// A judge that stalled between two ticks advances the clock by at most the bound and
    /// drops the rest: the clock lags by the stall (every lease extended) and never jumps.
    #[test]
    fn a_stalled_judge_advances_the_clock_by_at_most_the_bound_and_drops_the_rest() {
        assert_eq!(clock_advance(100_999, 100), (100, 100_000), "at the bound: counted as usual");
        assert_eq!(clock_advance(101_000, 100), (100, 101_000), "beyond it: all counted, 100 added");
        assert_eq!(clock_advance(5_000_000, 100), (100, 5_000_000));
        assert_eq!(clock_advance(u64::MAX, 100), (100, u64::MAX));
    }

    /// The owner check: an unbound caller addresses anything, a bound one only what is
    /// stored for an owner it may act as (`*` entries by prefix); nothing stored passes.
    #[test]
    fn a_bound_caller_addresses_only_its_owners_sessions_and_grants() {
        let bound = std::collections::BTreeSet::from(["exec-1/*".to_owned(), "w-9".to_owned()]);
        assert!(may_address(None, Some("exec-2/0")), "unbound");
        assert!(may_address(Some(&bound), Some("exec-1/3")) && may_address(Some(&bound), Some("w-9")));
        assert!(!may_address(Some(&bound), Some("exec-2/0")) && !may_address(Some(&bound), Some("w-9/0")));
        assert!(may_address(Some(&bound), None), "nothing stored: the store answers");
    }

    fn grant(key: &str, session: Uuid, token: i64, at: i64, end: i64) -> GrantRow {
        GrantRow {
            key: key.into(),
            session_id: session,
            owner_id: format!("o-{session}"),
            fencing_token: token,
            acquired_at_ms: at,
            expires_at_ms: end,
        }
    }

    /// Reference: a grant is live at `t` iff `t` is inside its lease and inside its session;
    /// it died at the first instant at which it is not.
    fn live_reference(lease_end: i64, session_end: Option<i64>, t: i64) -> bool {
        t < lease_end && session_end.is_some_and(|s| t < s)
    }

    proptest! {
        #[test]
        fn grant_is_dead_at_the_earlier_of_lease_and_session_end(
            lease in -20i64..20, session in proptest::option::of(-20i64..20), now in -25i64..25,
        ) {
            prop_assert_eq!(grant_live(lease, session, now), live_reference(lease, session, now));
            match grant_dies_at(lease, session) {
                // The first dead instant, scanning the small range.
                Some(d) => {
                    prop_assert!(!live_reference(lease, session, d));
                    prop_assert!(live_reference(lease, session, d - 1));
                }
                None => prop_assert!(!live_reference(lease, session, now)),
            }
        }

        #[test]
        fn lock_delay_merge_never_lowers_and_takes_the_later(
            recorded in proptest::option::of(-50i64..50), died in proptest::option::of(-50i64..50),
            delay in -5i64..20,
        ) {
            let until = lock_delay_until(died, delay);
            prop_assert_eq!(until.is_some(), died.is_some() && delay > 0);
            let merged = merge_delay(recorded, until);
            prop_assert!(merged >= recorded);
            prop_assert!(merged >= until);
            prop_assert!(merged == recorded || merged == until);
        }
    }

    #[test]
    fn next_token_exceeds_last_issued_and_floor() {
        assert_eq!(next_token(0, 0), 1);
        assert_eq!(next_token(7, 3), 8);
        assert_eq!(next_token(3, 7), 8);
    }

    #[test]
    #[should_panic(expected = "issued over a grant")]
    fn a_token_not_above_the_replaced_one_is_refused_in_release_builds() {
        assert_token_replaces(5, Some(5));
    }

    #[test]
    fn arrival_never_barges_past_a_queue() {
        assert_eq!(on_arrival(true, 0), Arrival::AskStore);
        assert_eq!(on_arrival(true, 500), Arrival::AskStore);
        assert_eq!(on_arrival(false, 0), Arrival::RefuseNoBarge);
        assert_eq!(on_arrival(false, 500), Arrival::Join);
        assert!(queue_has_room(63, 64) && !queue_has_room(64, 64));
    }

    /// One key, three session slots (each `Open` starts a new session in its slot),
    /// operations in time order.
    #[derive(Debug, Clone)]
    enum Op {
        Advance(i64),
        Open(usize, i64),
        Heartbeat(usize),
        Close(usize),
        Acquire(usize, i64),
        Release,
        /// Renew by the slot's session, presenting the row's token (or a wrong one).
        Renew(usize, i64, bool),
        /// Revoke, expecting the row's token, a wrong one, or none.
        Revoke(Option<bool>),
        /// Rotate by the slot's session, presenting the row's token (or a wrong one).
        Rotate(usize, i64, bool),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1i64..8).prop_map(Op::Advance),
            (0usize..3, 1i64..10).prop_map(|(s, ttl)| Op::Open(s, ttl)),
            (0usize..3).prop_map(Op::Heartbeat),
            (0usize..3).prop_map(Op::Close),
            (0usize..3, 1i64..10).prop_map(|(s, ttl)| Op::Acquire(s, ttl)),
            Just(Op::Release),
            (0usize..3, 1i64..10, any::<bool>()).prop_map(|(s, ttl, right)| Op::Renew(s, ttl, right)),
            proptest::option::of(any::<bool>()).prop_map(Op::Revoke),
            (0usize..3, 1i64..10, any::<bool>()).prop_map(|(s, ttl, right)| Op::Rotate(s, ttl, right)),
        ]
    }

    /// A grant in the reference history.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Made {
        session: usize,
        token: i64,
        lease_end: i64,
        released_at: Option<i64>,
    }

    /// The reference history: every session and grant ever made, with how it ended.
    /// Liveness and lock-delay are recomputed from the whole history at each step, not kept
    /// incrementally as the store does.
    #[derive(Debug, Default)]
    struct History {
        grants: Vec<Made>,
        /// session -> (ttl, end, closed at); sessions are numbered in opening order.
        sessions: BTreeMap<usize, (i64, i64, Option<i64>)>,
    }

    impl History {
        /// Live at `t`: not released, inside its lease, inside its session, before a close.
        fn is_live(&self, g: &Made, t: i64) -> bool {
            g.released_at.is_none_or(|r| t < r)
                && t < g.lease_end
                && self
                    .sessions
                    .get(&g.session)
                    .is_some_and(|(_, end, closed)| t < *end && closed.is_none_or(|c| t < c))
        }

        fn live_at(&self, t: i64) -> Vec<Made> {
            self.grants.iter().filter(|g| self.is_live(g, t)).copied().collect()
        }

        /// Whether some grant that died without release still imposes its lock-delay at `t`.
        fn delayed_at(&self, t: i64, delay: i64) -> bool {
            self.grants.iter().any(|g| {
                let Some((_, end, closed)) = self.sessions.get(&g.session) else { return false };
                let died = g.lease_end.min(*end);
                let released_first = g.released_at.is_some_and(|r| r < died) || closed.is_some_and(|c| c < died);
                !released_first && died <= t && t < died + delay
            })
        }
    }

    proptest! {
        /// The acquire, renew, release, revoke and rotate decisions, driven over a random schedule,
        /// against the history model: an acquire grants exactly when the history says the
        /// key is free (caller's session live, no live grant, no lock-delay running), a renew
        /// extends exactly the live grant of the caller's session, a revoke removes exactly
        /// the live grant (raising the floor, imposing no delay), a rotate replaces exactly the
        /// live grant of the caller's session with a greater token, each refusal is the one the
        /// history explains, tokens strictly increase past the floor, and at most one grant
        /// is ever live.
        #[test]
        fn acquire_decision_matches_the_history_model(ops in proptest::collection::vec(op(), 1..80), delay in 0i64..6) {
            let mut now = 0i64;
            let mut hist = History::default();
            // slot -> current session number
            let mut slots: [Option<usize>; 3] = [None; 3];
            // The store the rules drive: one grant row (with its session), the key record,
            // the token counter.
            let mut row: Option<(usize, GrantRow)> = None;
            let mut record: Option<Option<i64>> = None;
            let mut last_issued = 0i64;
            let mut floor = 0i64;
            for op in ops {
                let open = |hist: &History, s: usize| hist.sessions.get(&s).filter(|x| x.2.is_none()).map(|x| x.1);
                match op {
                    Op::Advance(d) => now += d,
                    Op::Open(slot, ttl) => {
                        let s = hist.sessions.len();
                        hist.sessions.insert(s, (ttl, now + ttl, None));
                        slots[slot] = Some(s);
                    }
                    Op::Heartbeat(slot) => {
                        let Some(s) = slots[slot] else { continue };
                        if let Some((ttl, end, None)) = hist.sessions.get(&s).copied() {
                            if session_check(Some(end), now).is_ok() {
                                hist.sessions.insert(s, (ttl, now + ttl, None));
                            }
                        }
                    }
                    Op::Close(slot) => {
                        let Some(s) = slots[slot] else { continue };
                        if let Some((ttl, end, None)) = hist.sessions.get(&s).copied() {
                            if let Some((_, g)) = row.clone().filter(|(rs, _)| *rs == s) {
                                if let Some(died) = lost_before_close(g.expires_at_ms, end, now) {
                                    record = Some(merge_delay(record.flatten(), lock_delay_until(Some(died), delay)));
                                }
                                row = None;
                            }
                            hist.sessions.insert(s, (ttl, end, Some(now)));
                        }
                    }
                    Op::Release => {
                        if let Some((s, g)) = row.clone() {
                            let facts = GrantFacts { grant: &g, holder_end_ms: open(&hist, s) };
                            if decide_release(Some(facts), g.fencing_token, now).is_ok() {
                                row = None;
                                if let Some(h) = hist.grants.iter_mut().find(|h| h.token == g.fencing_token) {
                                    h.released_at = Some(now);
                                }
                            }
                        }
                    }
                    Op::Renew(slot, ttl, right) => {
                        let Some(s) = slots[slot] else { continue };
                        let id = Uuid::from_u128(s as u128);
                        let presented = row.as_ref().map_or(1, |(_, g)| g.fencing_token) + if right { 0 } else { 1_000 };
                        let holder = row.as_ref().map(|(rs, g)| GrantFacts { grant: g, holder_end_ms: open(&hist, *rs) });
                        let decision = decide_renew(open(&hist, s), holder, id, presented, now);
                        let live = hist.live_at(now);
                        let reference = open(&hist, s).is_some_and(|e| now < e)
                            && live.iter().any(|g| g.session == s && g.token == presented);
                        prop_assert_eq!(decision.is_ok(), reference, "renew {:?} at {}: {:?}", decision, now, hist);
                        match decision {
                            Ok(()) => {
                                if let Some((_, g)) = row.as_mut() {
                                    g.expires_at_ms = now + ttl;
                                }
                                if let Some(h) = hist.grants.iter_mut().find(|h| h.token == presented) {
                                    h.lease_end = now + ttl;
                                }
                            }
                            Err(RenewRefusal::Lost { stored_token }) => {
                                prop_assert_eq!(stored_token, row.as_ref().map(|(_, g)| g.fencing_token));
                            }
                            Err(RenewRefusal::Session(_)) => prop_assert!(open(&hist, s).is_none_or(|e| now >= e)),
                        }
                    }
                    Op::Revoke(expect) => {
                        let current = row.as_ref().map(|(_, g)| g.fencing_token);
                        let expected = expect.map(|right| current.unwrap_or(1) + if right { 0 } else { 1_000 });
                        let holder = row.as_ref().map(|(rs, g)| GrantFacts { grant: g, holder_end_ms: open(&hist, *rs) });
                        let live = hist.live_at(now);
                        match decide_revoke(holder, expected, now) {
                            Ok(token) => {
                                prop_assert!(live.len() == 1 && live[0].token == token);
                                prop_assert!(expected.is_none_or(|e| e == token));
                                // The floor is a freshly issued token; a revoke imposes no delay.
                                floor = next_token(last_issued, floor);
                                last_issued = floor;
                                row = None;
                                if let Some(h) = hist.grants.iter_mut().find(|h| h.token == token) {
                                    h.released_at = Some(now);
                                }
                            }
                            Err(RevokeRefusal::NotHeld) => prop_assert!(live.is_empty()),
                            Err(RevokeRefusal::Stale { current_token }) => {
                                prop_assert!(live.len() == 1 && live[0].token == current_token);
                                prop_assert!(expected.is_some_and(|e| e != current_token));
                            }
                        }
                    }
                    Op::Rotate(slot, ttl, right) => {
                        let Some(s) = slots[slot] else { continue };
                        let id = Uuid::from_u128(s as u128);
                        let presented = row.as_ref().map_or(1, |(_, g)| g.fencing_token) + if right { 0 } else { 1_000 };
                        let holder = row.as_ref().map(|(rs, g)| GrantFacts { grant: g, holder_end_ms: open(&hist, *rs) });
                        let decision = decide_rotate(&RotateFacts {
                            acquire: AcquireFacts {
                                now_ms: now,
                                session_id: id,
                                session_end_ms: open(&hist, s),
                                grant: holder,
                                key: record,
                                delay_ms: delay,
                            },
                            token: presented,
                        });
                        // The reference: a release by the holder then an acquire by it, with
                        // nothing in between; the release imposes no delay, so the acquire
                        // half is refused only by a delay already running.
                        let live = hist.live_at(now);
                        let holds = open(&hist, s).is_some_and(|e| now < e)
                            && live.iter().any(|g| g.session == s && g.token == presented);
                        prop_assert_eq!(decision.is_ok(), holds && !hist.delayed_at(now, delay), "rotate {:?} at {}: {:?}", decision, now, hist);
                        match decision {
                            Ok(plan) => {
                                let token = next_token(last_issued, floor);
                                assert_token_replaces(token, plan.replaces);
                                prop_assert!(token > presented && token > floor);
                                last_issued = token;
                                if let Some(h) = hist.grants.iter_mut().find(|h| h.token == presented) {
                                    h.released_at = Some(now);
                                }
                                row = Some((s, grant("k", id, token, now, now + ttl)));
                                if plan.write_key_record {
                                    record = Some(None);
                                }
                                hist.grants.push(Made { session: s, token, lease_end: now + ttl, released_at: None });
                            }
                            Err(RotateRefusal::Lost { stored_token }) => {
                                prop_assert!(!holds);
                                prop_assert_eq!(stored_token, row.as_ref().map(|(_, g)| g.fencing_token));
                            }
                            Err(RotateRefusal::Session(_)) => prop_assert!(open(&hist, s).is_none_or(|e| now >= e)),
                            Err(RotateRefusal::Delayed { until_ms }) => {
                                prop_assert!(now < until_ms && hist.delayed_at(now, delay));
                            }
                        }
                    }
                    Op::Acquire(slot, ttl) => {
                        let Some(s) = slots[slot] else { continue };
                        let id = Uuid::from_u128(s as u128);
                        let holder =
                            row.as_ref().map(|(rs, g)| GrantFacts { grant: g, holder_end_ms: open(&hist, *rs) });
                        let facts = AcquireFacts {
                            now_ms: now,
                            session_id: id,
                            session_end_ms: open(&hist, s),
                            grant: holder,
                            key: record,
                            delay_ms: delay,
                        };
                        let decision = decide_acquire(&facts);
                        let live = hist.live_at(now);
                        let free = open(&hist, s).is_some_and(|e| now < e) && live.is_empty() && !hist.delayed_at(now, delay);
                        prop_assert_eq!(decision.verdict.is_ok(), free, "{:?} at {}: {:?}", decision, now, hist);
                        if let Some(r) = decision.remove {
                            prop_assert!(row.as_ref().is_some_and(|(_, g)| g.fencing_token == r.token));
                            record = Some(merge_delay(record.flatten(), r.delay_until_ms));
                            row = None;
                        }
                        match decision.verdict {
                            Ok(plan) => {
                                let token = next_token(last_issued, floor);
                                prop_assert!(token > floor);
                                assert_token_replaces(token, plan.replaces);
                                last_issued = token;
                                row = Some((s, grant("k", id, token, now, now + ttl)));
                                if plan.write_key_record {
                                    record = Some(None);
                                }
                                hist.grants.push(Made { session: s, token, lease_end: now + ttl, released_at: None });
                            }
                            Err(AcquireRefusal::AlreadyHeld { fencing_token, .. }) => {
                                prop_assert_eq!(live.iter().map(|g| (g.session, g.token)).collect::<Vec<_>>(), vec![(s, fencing_token)]);
                            }
                            Err(AcquireRefusal::Contended { .. }) => {
                                prop_assert!(live.len() == 1 && live[0].session != s);
                            }
                            Err(AcquireRefusal::Delayed { until_ms }) => {
                                prop_assert!(now < until_ms && hist.delayed_at(now, delay));
                            }
                            Err(AcquireRefusal::Session(_)) => prop_assert!(open(&hist, s).is_none_or(|e| now >= e)),
                        }
                    }
                }
                prop_assert!(hist.live_at(now).len() <= 1, "two live grants at {}: {:?}", now, hist);
            }
        }
    }
}
