//! The simulation lock store: lockdb in memory, with the same semantics as SQL.
//!
//! Like the rail-proxy's simulation store, it stands in for the *backend*: in the
//! simulation it outlives every lock-server node. Each method takes the one mutex for its
//! whole body: a serialisable transaction, seen from outside.
//!
//! **Its clock.** One clock for all replicas, as on SQL. [`MemLockStore::judged`] keeps
//! lockdb's clock exactly as SQL does (C1 §1.4.2, [`crate::lockdb_clock`]): the row in
//! memory, read under the mutex by every decision, and advanced only by the replica that
//! judges it; each replica's view ([`MemLockStore::replica`], [`MemReplica`]) runs the
//! production judge loop on its own node's monotonic clock and shows instants on its own
//! wall clock. The simulation world uses it. [`MemLockStore::new`] judges by a given
//! [`Clock`] instead (the reference clock in the conformance suite and the older tests).
//!
//! **Observer** (simulation only in practice): [`MemLockStore::set_observer`] registers one
//! [`LockObserver`], told of every change to a grant or a session's end *inside* the
//! transaction, under the one mutex, in commit order ([`LockEvent`]). The simulation's
//! oracle keeps its own model of who holds what from these facts and checks each grant
//! against it. Unset (the default) it costs one `Option` read per write; it never changes
//! what a write does.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dlock_rt::Clock;
use uuid::Uuid;

use crate::lockdb_clock::{self, ClockDb, ClockFault, ClockJudge};
use crate::rules::{self, AcquireFacts, ClockRow, GrantFacts, RotateFacts};
use crate::store::events::{removal_kind, LockEventRecord, MemOutbox};
use dlock_contract::stream::EventKind;

use crate::store::{
    AcquireRefusal, Addressed, EventRead, GrantRow, HeldKey, KeyInfo, LockStore, ReapReport, RenewRefusal, Revocation,
    RevokeRefusal, RotateRefusal, SessionRefusal, SessionRow, StoreError, WallShift,
};

#[derive(Debug, Clone)]
struct Session {
    row: SessionRow,
    /// When the reaper (or a close) recorded the lapse.
    expired_marked: bool,
}

#[derive(Debug, Default)]
struct Tables {
    sessions: BTreeMap<Uuid, Session>,
    grants: BTreeMap<String, GrantRow>,
    /// Every key ever granted, with the end of its lock-delay, if one runs.
    keys: BTreeMap<String, Option<i64>>,
    last_issued: i64,
    floor: i64,
    revocations: Vec<(Uuid, String, String, String, i64, i64, i64)>,
    /// lockdb's clock ([`crate::lockdb_clock`]) when the store keeps one
    /// ([`MemLockStore::judged`]); `None`: the store's clock is its [`Clock`].
    clock: Option<ClockRow>,
    /// The event outbox ([`crate::store::events`]): written by the change it describes,
    /// under the same lock.
    events: MemOutbox,
}

impl Tables {
    fn session_end(&self, id: Uuid) -> Option<i64> {
        self.sessions.get(&id).map(|s| s.row.expires_at_ms)
    }

    fn session_check(&self, id: Uuid, now: i64) -> Result<(), SessionRefusal> {
        rules::session_check(self.session_end(id), now)
    }

    /// The grant of `key` with its holder session's end, as the rules take it.
    fn grant_facts(&self, key: &str) -> Option<GrantFacts<'_>> {
        self.grants.get(key).map(|g| GrantFacts { grant: g, holder_end_ms: self.session_end(g.session_id) })
    }

    fn grant_live(&self, g: &GrantRow, now: i64) -> bool {
        rules::grant_live(g.expires_at_ms, self.session_end(g.session_id), now)
    }

    fn next_token(&mut self) -> i64 {
        let t = rules::next_token(self.last_issued, self.floor);
        self.last_issued = t;
        t
    }

    /// Records a lock-delay running until `until` on `key` (merged, never lowered).
    fn record_delay(&mut self, key: &str, until: Option<i64>) {
        if until.is_some() {
            let slot = self.keys.entry(key.to_owned()).or_insert(None);
            *slot = rules::merge_delay(*slot, until);
        }
    }

    /// Removes a grant that died (at `died_at`) without release, recording its lock-delay.
    fn drop_lost(&mut self, key: &str, died_at: Option<i64>, delay_ms: i64) {
        if self.grants.remove(key).is_some() {
            self.record_delay(key, rules::lock_delay_until(died_at, delay_ms));
        }
    }

    /// Removes a grant found lost by the reaper, from its lease and its session's end,
    /// recording `lock.expired`.
    fn drop_dead(&mut self, key: &str, delay_ms: i64, at: DateTime<Utc>) {
        let died_at = self.grant_facts(key).and_then(|g| g.dies_at());
        if let Some(g) = self.grants.get(key).cloned() {
            self.emit_grant(EventKind::LockExpired, &g, at);
        }
        self.drop_lost(key, died_at, delay_ms);
    }

    /// Records an event about grant `g`.
    fn emit_grant(&mut self, kind: EventKind, g: &GrantRow, at: DateTime<Utc>) {
        self.events.emit(LockEventRecord::grant(kind, &g.key, g.fencing_token, g.session_id, &g.owner_id), at);
    }
}

/// One committed change, as the [`LockObserver`] sees it (times in the store's ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockEvent {
    /// A session was opened or heartbeated: it now ends at `expires_at_ms`.
    SessionEnds { session_id: Uuid, expires_at_ms: i64 },
    /// A session was closed at `now_ms`; its grants went with it.
    SessionClosed { session_id: Uuid, now_ms: i64 },
    /// A grant was issued at `now_ms`.
    Granted { grant: GrantRow, now_ms: i64 },
    /// A grant's lease was extended at `now_ms`.
    Renewed { key: String, token: i64, expires_at_ms: i64, now_ms: i64 },
    /// A grant was released by its holder.
    Released { key: String, token: i64, now_ms: i64 },
    /// A grant was revoked by an operator; the token floor rose to `new_token_floor`.
    Revoked { key: String, token: i64, new_token_floor: i64, now_ms: i64 },
    /// The reaper (or an acquire) removed a grant it judged dead.
    Dropped { key: String, token: i64, now_ms: i64 },
    /// A heartbeat, acquire, renew or rotate was refused at `now_ms` (nothing changed): what
    /// the decision said of the records, for an observer to hold it to them.
    Refused { refusal: Refusal, now_ms: i64 },
}

/// What a refused call judged (see [`LockEvent::Refused`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The caller's session may not act: it ended, or it is unknown.
    Session { session_id: Uuid, refusal: SessionRefusal },
    /// An acquire found the key held by a live grant (another session's, or the caller's).
    Held { key: String, session_id: Uuid },
    /// An acquire or rotate found a lock-delay running until `until_ms`.
    Delayed { key: String, until_ms: i64 },
    /// A renew or rotate found no live grant `(key, token)` of the caller's session.
    Lost { key: String, token: i64, session_id: Uuid },
}

/// Sees every committed change to grants and session ends (see the module doc).
pub trait LockObserver: Send + Sync {
    fn event(&self, e: &LockEvent);
}

#[derive(Default)]
struct ObserverSlot(std::sync::RwLock<Option<std::sync::Arc<dyn LockObserver>>>);

impl std::fmt::Debug for ObserverSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self.0.read().map(|o| o.is_some()).unwrap_or(false);
        f.debug_struct("ObserverSlot").field("set", &set).finish()
    }
}

impl ObserverSlot {
    fn tell(&self, e: impl FnOnce() -> LockEvent) {
        let observer = self.0.read().ok().and_then(|o| o.clone());
        if let Some(o) = observer {
            o.event(&e());
        }
    }
}

/// In-memory lockdb.
#[derive(Debug)]
pub struct MemLockStore {
    clock: Clock,
    tables: Mutex<Tables>,
    observer: ObserverSlot,
    /// Replicas started over this store ([`MemLockStore::replica`]): each one's judge name
    /// is unique, as a process's is.
    replicas: AtomicU64,
}

impl MemLockStore {
    /// A store whose leases run on `clock` (the simulated backend's clock).
    pub fn new(clock: Clock) -> MemLockStore {
        MemLockStore {
            clock,
            tables: Mutex::new(Tables::default()),
            observer: ObserverSlot::default(),
            replicas: AtomicU64::new(0),
        }
    }

    /// A store that keeps lockdb's clock as SQL does (C1 §1.4.2): it starts at `clock`'s
    /// wall time and stands until a replica ([`MemLockStore::replica`]) judges it; only the
    /// judge's monotonic clock advances it from then.
    pub fn judged(clock: Clock) -> MemLockStore {
        let store = MemLockStore::new(clock);
        let row = ClockRow { now_ms: store.clock.wall().timestamp_millis(), judge: String::new(), term: 0 };
        if let Ok(mut t) = store.tables.lock() {
            t.clock = Some(row);
        }
        store
    }

    /// lockdb's now, as the last tick left it (the store's clock when it keeps none).
    pub fn clock_now_ms(&self) -> i64 {
        self.tables.lock().map(|t| self.now_in(&t)).unwrap_or_else(|_| self.clock.wall().timestamp_millis())
    }

    /// Every event the outbox ever held, purged ones included, in seq order
    /// ([`MemOutbox::history`]; the simulation's ground truth for the lock server's stream).
    pub fn event_history(&self) -> Vec<dlock_contract::stream::StoredEvent> {
        self.tables.lock().map(|t| t.events.history().cloned().collect()).unwrap_or_default()
    }

    /// A lock-server replica's view of this store, started now on the caller's node: on a
    /// [`MemLockStore::judged`] store it takes part in lockdb's clock (judging it on
    /// `clock`'s monotonic clock, under the name `{name}#{n}`, one per start), and its answers
    /// show lockdb's instants on `clock`'s wall clock, as a SQL replica's do.
    pub fn replica(self: &Arc<Self>, name: &str, clock: Clock) -> MemReplica {
        let judged = self.tables.lock().map(|t| t.clock.is_some()).unwrap_or(false);
        let judge = judged.then(|| {
            let n = self.replicas.fetch_add(1, Ordering::Relaxed);
            lockdb_clock::start(MemClock(self.clone()), clock, format!("{name}#{n}"))
        });
        let shift = judged.then(|| {
            let shift = WallShift::new(clock, None);
            shift.offset(self.clock_now_ms());
            shift
        });
        MemReplica { store: self.clone(), judge, shift }
    }

    /// Registers the one observer of committed changes (replacing any earlier one).
    pub fn set_observer(&self, observer: std::sync::Arc<dyn LockObserver>) {
        if let Ok(mut slot) = self.observer.0.write() {
            *slot = Some(observer);
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Tables>, StoreError> {
        self.tables.lock().map_err(|_| StoreError::Corrupt("simulation store poisoned".into()))
    }

    /// The store's now, read under its lock: lockdb's clock when it keeps one.
    fn now_in(&self, t: &Tables) -> i64 {
        t.clock.as_ref().map_or_else(|| self.clock.wall().timestamp_millis(), |c| c.now_ms)
    }
}

#[async_trait]
impl LockStore for MemLockStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.lock().map(|_| ())
    }

    async fn now_ms(&self) -> Result<i64, StoreError> {
        let t = self.lock()?;
        Ok(self.now_in(&t))
    }

    async fn open_session(&self, session_id: Uuid, owner_id: &str, ttl_ms: i64) -> Result<SessionRow, StoreError> {
        let mut t = self.lock()?;
        let now = self.now_in(&t);
        let row = SessionRow { session_id, owner_id: owner_id.to_owned(), ttl_ms, expires_at_ms: now + ttl_ms };
        t.sessions.insert(session_id, Session { row: row.clone(), expired_marked: false });
        t.events.emit(LockEventRecord::session_opened(session_id, owner_id, ttl_ms), self.clock.wall());
        self.observer.tell(|| LockEvent::SessionEnds { session_id, expires_at_ms: row.expires_at_ms });
        Ok(row)
    }

    async fn heartbeat(&self, session_id: Uuid) -> Result<Result<(SessionRow, i64), SessionRefusal>, StoreError> {
        let mut t = self.lock()?;
        let now = self.now_in(&t);
        if let Err(r) = t.session_check(session_id, now) {
            self.observer
                .tell(|| LockEvent::Refused { refusal: Refusal::Session { session_id, refusal: r }, now_ms: now });
            return Ok(Err(r));
        }
        let held = t.grants.values().filter(|g| g.session_id == session_id && t.grant_live(g, now)).count();
        let Some(s) = t.sessions.get_mut(&session_id) else { return Ok(Err(SessionRefusal::Unknown)) };
        s.row.expires_at_ms = now + s.row.ttl_ms;
        let row = s.row.clone();
        self.observer.tell(|| LockEvent::SessionEnds { session_id, expires_at_ms: row.expires_at_ms });
        Ok(Ok((row, held as i64)))
    }

    async fn close_session(&self, session_id: Uuid, delay_ms: i64) -> Result<Result<(), SessionRefusal>, StoreError> {
        let mut t = self.lock()?;
        let now = self.now_in(&t);
        let Some(s) = t.sessions.get(&session_id).cloned() else { return Ok(Err(SessionRefusal::Unknown)) };
        let mut mine: Vec<(GrantRow, Option<i64>)> = t
            .grants
            .values()
            .filter(|g| g.session_id == session_id)
            // Died before the close (lease or session lapsed): its lock-delay stands.
            .map(|g| (g.clone(), rules::lost_before_close(g.expires_at_ms, s.row.expires_at_ms, now)))
            .collect();
        // The events: the grants that had died first, then the ones the close releases.
        mine.sort_by_key(|(g, lost)| (lost.is_none(), g.key.clone()));
        let at = self.clock.wall();
        for (g, lost) in mine {
            t.emit_grant(removal_kind(lost.is_some()), &g, at);
            t.drop_lost(&g.key, lost, delay_ms);
        }
        t.sessions.remove(&session_id);
        self.observer.tell(|| LockEvent::SessionClosed { session_id, now_ms: now });
        Ok(Ok(()))
    }

    async fn acquire(
        &self,
        key: &str,
        session_id: Uuid,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, AcquireRefusal>, StoreError> {
        let mut t = self.lock()?;
        let now = self.now_in(&t);
        let decision = rules::decide_acquire(&AcquireFacts {
            now_ms: now,
            session_id,
            session_end_ms: t.session_end(session_id),
            grant: t.grant_facts(key),
            key: t.keys.get(key).copied(),
            delay_ms,
        });
        if let Some(removal) = decision.remove {
            if let Some(g) = t.grants.remove(key) {
                t.emit_grant(EventKind::LockExpired, &g, self.clock.wall());
                self.observer.tell(|| LockEvent::Dropped { key: key.to_owned(), token: g.fencing_token, now_ms: now });
            }
            t.record_delay(key, removal.delay_until_ms);
        }
        let plan = match decision.verdict {
            Ok(plan) => plan,
            Err(refusal) => {
                self.observer.tell(|| LockEvent::Refused {
                    refusal: match &refusal {
                        AcquireRefusal::Session(r) => Refusal::Session { session_id, refusal: *r },
                        AcquireRefusal::Delayed { until_ms } => {
                            Refusal::Delayed { key: key.to_owned(), until_ms: *until_ms }
                        }
                        _ => Refusal::Held { key: key.to_owned(), session_id },
                    },
                    now_ms: now,
                });
                return Ok(Err(refusal));
            }
        };
        let owner_id = t.sessions.get(&session_id).map(|s| s.row.owner_id.clone()).unwrap_or_default();
        let token = t.next_token();
        rules::assert_token_replaces(token, plan.replaces);
        let grant = GrantRow {
            key: key.to_owned(),
            session_id,
            owner_id,
            fencing_token: token,
            acquired_at_ms: now,
            expires_at_ms: now + ttl_ms,
        };
        t.grants.insert(key.to_owned(), grant.clone());
        if plan.write_key_record {
            t.keys.insert(key.to_owned(), None);
        }
        t.emit_grant(EventKind::LockGranted, &grant, self.clock.wall());
        self.observer.tell(|| LockEvent::Granted { grant: grant.clone(), now_ms: now });
        Ok(Ok(grant))
    }

    async fn renew(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
    ) -> Result<Result<GrantRow, RenewRefusal>, StoreError> {
        let mut t = self.lock()?;
        let now = self.now_in(&t);
        if let Err(refusal) = rules::decide_renew(t.session_end(session_id), t.grant_facts(key), session_id, token, now)
        {
            self.observer.tell(|| LockEvent::Refused {
                refusal: match &refusal {
                    RenewRefusal::Session(r) => Refusal::Session { session_id, refusal: *r },
                    RenewRefusal::Lost { .. } => Refusal::Lost { key: key.to_owned(), token, session_id },
                },
                now_ms: now,
            });
            return Ok(Err(refusal));
        }
        let Some(g) = t.grants.get_mut(key) else { return Ok(Err(RenewRefusal::Lost { stored_token: None })) };
        g.expires_at_ms = now + ttl_ms;
        let g = g.clone();
        t.emit_grant(EventKind::LockRenewed, &g, self.clock.wall());
        self.observer.tell(|| LockEvent::Renewed {
            key: key.to_owned(),
            token,
            expires_at_ms: g.expires_at_ms,
            now_ms: now,
        });
        Ok(Ok(g))
    }

    async fn release(&self, key: &str, token: i64) -> Result<Result<(), Option<i64>>, StoreError> {
        let mut t = self.lock()?;
        let now = self.now_in(&t);
        if let Err(stored) = rules::decide_release(t.grant_facts(key), token, now) {
            return Ok(Err(stored));
        }
        if let Some(g) = t.grants.remove(key) {
            t.emit_grant(EventKind::LockReleased, &g, self.clock.wall());
        }
        self.observer.tell(|| LockEvent::Released { key: key.to_owned(), token, now_ms: now });
        Ok(Ok(()))
    }

    async fn rotate(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, RotateRefusal>, StoreError> {
        let mut t = self.lock()?;
        let now = self.now_in(&t);
        let plan = match rules::decide_rotate(&RotateFacts {
            acquire: AcquireFacts {
                now_ms: now,
                session_id,
                session_end_ms: t.session_end(session_id),
                grant: t.grant_facts(key),
                key: t.keys.get(key).copied(),
                delay_ms,
            },
            token,
        }) {
            Ok(plan) => plan,
            Err(refusal) => {
                self.observer.tell(|| LockEvent::Refused {
                    refusal: match &refusal {
                        RotateRefusal::Session(r) => Refusal::Session { session_id, refusal: *r },
                        RotateRefusal::Lost { .. } => Refusal::Lost { key: key.to_owned(), token, session_id },
                        RotateRefusal::Delayed { until_ms } => {
                            Refusal::Delayed { key: key.to_owned(), until_ms: *until_ms }
                        }
                    },
                    now_ms: now,
                });
                return Ok(Err(refusal));
            }
        };
        let owner_id = t.sessions.get(&session_id).map(|s| s.row.owner_id.clone()).unwrap_or_default();
        let fresh = t.next_token();
        rules::assert_token_replaces(fresh, plan.replaces);
        let grant = GrantRow {
            key: key.to_owned(),
            session_id,
            owner_id,
            fencing_token: fresh,
            acquired_at_ms: now,
            expires_at_ms: now + ttl_ms,
        };
        let at = self.clock.wall();
        if let Some(old) = t.grants.insert(key.to_owned(), grant.clone()) {
            t.emit_grant(EventKind::LockReleased, &old, at);
        }
        t.emit_grant(EventKind::LockGranted, &grant, at);
        if plan.write_key_record {
            t.keys.insert(key.to_owned(), None);
        }
        // One transaction, seen as what it is: the release of `token`, then the grant.
        self.observer.tell(|| LockEvent::Released { key: key.to_owned(), token, now_ms: now });
        self.observer.tell(|| LockEvent::Granted { grant: grant.clone(), now_ms: now });
        Ok(Ok(grant))
    }

    async fn owner_of(&self, target: Addressed<'_>) -> Result<Option<String>, StoreError> {
        let t = self.lock()?;
        Ok(match target {
            Addressed::Session(id) => t.sessions.get(&id).map(|s| s.row.owner_id.clone()),
            Addressed::Grant { key, token } => {
                t.grants.get(key).filter(|g| g.fencing_token == token).map(|g| g.owner_id.clone())
            }
        })
    }

    async fn info(&self, key: &str, delay_ms: i64) -> Result<Option<KeyInfo>, StoreError> {
        let t = self.lock()?;
        let now = self.now_in(&t);
        let Some(delay_until) = t.keys.get(key) else { return Ok(None) };
        Ok(Some(rules::judge_key(t.grant_facts(key), *delay_until, delay_ms, t.last_issued.max(t.floor), now)))
    }

    async fn held_keys(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        delay_ms: i64,
    ) -> Result<Vec<HeldKey>, StoreError> {
        let t = self.lock()?;
        let now = self.now_in(&t);
        let Some((from, until)) = rules::key_range(prefix, after) else { return Ok(Vec::new()) };
        let range = (from.as_ref().map(String::as_str), until.as_ref().map(String::as_str));
        let floor = t.last_issued.max(t.floor);
        Ok(t.grants
            .range::<str, _>(range)
            .take(limit)
            .map(|(key, _)| {
                let delay_until = t.keys.get(key).copied().flatten();
                let info = rules::judge_key(t.grant_facts(key), delay_until, delay_ms, floor, now);
                HeldKey { key: key.clone(), info }
            })
            .collect())
    }

    async fn revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        expected_token: Option<i64>,
        revocation_id: Uuid,
    ) -> Result<Result<Revocation, RevokeRefusal>, StoreError> {
        let mut t = self.lock()?;
        let now = self.now_in(&t);
        let revoked = match rules::decide_revoke(t.grant_facts(key), expected_token, now) {
            Ok(token) => token,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let removed = t.grants.remove(key);
        let floor = if dlock_contract::planted::on(dlock_contract::planted::Bug::RevokeKeepsFloor) {
            // Planted bug `revoke-keeps-floor` (simulation only): the grant is gone, the
            // floor stays where it was.
            t.floor
        } else {
            let floor = t.next_token();
            t.floor = floor;
            floor
        };
        t.revocations.push((
            revocation_id,
            key.to_owned(),
            operator.to_owned(),
            reason.to_owned(),
            revoked,
            floor,
            now,
        ));
        if let Some(g) = removed {
            let e = LockEventRecord::revoked(
                key,
                revoked,
                (g.session_id, &g.owner_id),
                floor,
                (revocation_id, operator, reason),
            );
            t.events.emit(e, self.clock.wall());
        }
        self.observer.tell(|| LockEvent::Revoked {
            key: key.to_owned(),
            token: revoked,
            new_token_floor: floor,
            now_ms: now,
        });
        Ok(Ok(Revocation { revoked_token: revoked, new_token_floor: floor, revocation_id }))
    }

    async fn reap(&self, limit: i64, delay_ms: i64, retention_ms: i64) -> Result<ReapReport, StoreError> {
        let limit = usize::try_from(limit.max(0)).unwrap_or(0);
        let mut t = self.lock()?;
        let now = self.now_in(&t);
        let mut report = ReapReport::default();
        let lapsed: Vec<Uuid> = t
            .sessions
            .iter()
            .filter(|(_, s)| rules::session_lapsed(s.row.expires_at_ms, s.expired_marked, now))
            .map(|(id, _)| *id)
            .take(limit)
            .collect();
        let at = self.clock.wall();
        for id in lapsed {
            let keys: Vec<String> = t.grants.values().filter(|g| g.session_id == id).map(|g| g.key.clone()).collect();
            for key in keys {
                let token = t.grants.get(&key).map(|g| g.fencing_token);
                t.drop_dead(&key, delay_ms, at);
                if let Some(token) = token {
                    self.observer.tell(|| LockEvent::Dropped { key: key.clone(), token, now_ms: now });
                }
                report.released_grants += 1;
            }
            if let Some(s) = t.sessions.get_mut(&id) {
                s.expired_marked = true;
                let owner = s.row.owner_id.clone();
                t.events.emit(LockEventRecord::session_expired(id, &owner), at);
            }
            report.expired_sessions += 1;
        }
        let lapsed_grants: Vec<String> = t
            .grants
            .values()
            .filter(|g| rules::lease_lapsed(g.expires_at_ms, now))
            .map(|g| g.key.clone())
            .take(limit)
            .collect();
        for key in lapsed_grants {
            let token = t.grants.get(&key).map(|g| g.fencing_token);
            t.drop_dead(&key, delay_ms, at);
            if let Some(token) = token {
                self.observer.tell(|| LockEvent::Dropped { key: key.clone(), token, now_ms: now });
            }
            report.released_grants += 1;
        }
        let forgotten: Vec<Uuid> = t
            .sessions
            .iter()
            .filter(|(_, s)| rules::session_forgettable(s.row.expires_at_ms, s.expired_marked, retention_ms, now))
            .map(|(id, _)| *id)
            .take(limit)
            .collect();
        for id in forgotten {
            t.sessions.remove(&id);
            report.forgotten_sessions += 1;
        }
        Ok(report)
    }

    async fn read_events(&self, after: i64, limit: usize) -> Result<EventRead, StoreError> {
        Ok(self.lock()?.events.read(after, limit))
    }

    async fn purge_events(&self, keep: i64) -> Result<u64, StoreError> {
        Ok(self.lock()?.events.purge(keep))
    }
}

/// lockdb's clock row of a [`MemLockStore::judged`] store, as [`lockdb_clock`]'s loop reads
/// and writes it (the SQL statements' semantics, under the store's one mutex).
struct MemClock(Arc<MemLockStore>);

impl MemClock {
    fn row<T>(&self, f: impl FnOnce(&mut ClockRow) -> T) -> Result<T, ClockFault> {
        let mut t = self.0.tables.lock().map_err(|_| ClockFault::Closed)?;
        t.clock.as_mut().map(f).ok_or(ClockFault::Closed)
    }
}

#[async_trait]
impl ClockDb for MemClock {
    async fn read(&self) -> Result<Option<ClockRow>, ClockFault> {
        self.row(|r| Some(r.clone()))
    }

    async fn tick(&self, advance_ms: i64, judge: &str, term: i64) -> Result<bool, ClockFault> {
        self.row(|r| {
            let mine = r.judge == judge && r.term == term;
            if mine {
                r.now_ms = r.now_ms.saturating_add(advance_ms);
            }
            mine
        })
    }

    async fn take(&self, judge: &str, seen: &ClockRow) -> Result<Option<i64>, ClockFault> {
        self.row(|r| {
            (r == seen).then(|| {
                r.judge = judge.to_owned();
                r.term += 1;
                r.term
            })
        })
    }

    async fn resign(&self, judge: &str, term: i64) -> Result<(), ClockFault> {
        self.row(|r| {
            if r.judge == judge && r.term == term {
                r.judge.clear();
            }
        })
    }
}

/// One lock-server replica's view of a shared [`MemLockStore`] ([`MemLockStore::replica`]):
/// the store's answers, its part in lockdb's clock, and its answers' instants on its own
/// wall clock. Dropping it hands the judge's role back; a replica that dies with its node
/// does not, and another takes over after the grace.
pub struct MemReplica {
    store: Arc<MemLockStore>,
    judge: Option<Arc<ClockJudge>>,
    shift: Option<WallShift>,
}

impl MemReplica {
    /// The offset onto this replica's wall clock now (0 on a store without lockdb's clock).
    fn offset(&self) -> i64 {
        self.shift.as_ref().map_or(0, |s| s.offset(self.store.clock_now_ms()))
    }
}

#[async_trait]
impl LockStore for MemReplica {
    async fn ping(&self) -> Result<(), StoreError> {
        self.store.ping().await
    }
    async fn now_ms(&self) -> Result<i64, StoreError> {
        let now = self.store.now_ms().await?;
        Ok(now.saturating_add(self.offset()))
    }
    async fn open_session(&self, session_id: Uuid, owner_id: &str, ttl_ms: i64) -> Result<SessionRow, StoreError> {
        let row = self.store.open_session(session_id, owner_id, ttl_ms).await?;
        Ok(WallShift::session(row, self.offset()))
    }
    async fn heartbeat(&self, session_id: Uuid) -> Result<Result<(SessionRow, i64), SessionRefusal>, StoreError> {
        let r = self.store.heartbeat(session_id).await?;
        Ok(r.map(|(row, held)| (WallShift::session(row, self.offset()), held)))
    }
    async fn close_session(&self, session_id: Uuid, delay_ms: i64) -> Result<Result<(), SessionRefusal>, StoreError> {
        self.store.close_session(session_id, delay_ms).await
    }
    async fn acquire(
        &self,
        key: &str,
        session_id: Uuid,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, AcquireRefusal>, StoreError> {
        let r = self.store.acquire(key, session_id, ttl_ms, delay_ms).await?;
        let offset = self.offset();
        Ok(r.map(|g| WallShift::grant(g, offset)).map_err(|e| WallShift::acquire_refusal(e, offset)))
    }
    async fn renew(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
    ) -> Result<Result<GrantRow, RenewRefusal>, StoreError> {
        let r = self.store.renew(key, session_id, token, ttl_ms).await?;
        Ok(r.map(|g| WallShift::grant(g, self.offset())))
    }
    async fn release(&self, key: &str, token: i64) -> Result<Result<(), Option<i64>>, StoreError> {
        self.store.release(key, token).await
    }
    async fn rotate(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, RotateRefusal>, StoreError> {
        let r = self.store.rotate(key, session_id, token, ttl_ms, delay_ms).await?;
        let offset = self.offset();
        Ok(r.map(|g| WallShift::grant(g, offset)).map_err(|e| WallShift::rotate_refusal(e, offset)))
    }
    async fn owner_of(&self, target: Addressed<'_>) -> Result<Option<String>, StoreError> {
        self.store.owner_of(target).await
    }
    async fn info(&self, key: &str, delay_ms: i64) -> Result<Option<KeyInfo>, StoreError> {
        let info = self.store.info(key, delay_ms).await?;
        let offset = self.offset();
        Ok(info.map(|i| KeyInfo { grant: i.grant.map(|g| WallShift::grant(g, offset)), ..i }))
    }
    async fn held_keys(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        delay_ms: i64,
    ) -> Result<Vec<HeldKey>, StoreError> {
        let page = self.store.held_keys(prefix, after, limit, delay_ms).await?;
        let offset = self.offset();
        Ok(page
            .into_iter()
            .map(|h| HeldKey {
                info: KeyInfo { grant: h.info.grant.map(|g| WallShift::grant(g, offset)), ..h.info },
                ..h
            })
            .collect())
    }
    async fn revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        expected_token: Option<i64>,
        revocation_id: Uuid,
    ) -> Result<Result<Revocation, RevokeRefusal>, StoreError> {
        self.store.revoke(key, operator, reason, expected_token, revocation_id).await
    }
    async fn reap(&self, limit: i64, delay_ms: i64, retention_ms: i64) -> Result<ReapReport, StoreError> {
        self.store.reap(limit, delay_ms, retention_ms).await
    }
    async fn read_events(&self, after: i64, limit: usize) -> Result<EventRead, StoreError> {
        self.store.read_events(after, limit).await
    }
    async fn purge_events(&self, keep: i64) -> Result<u64, StoreError> {
        self.store.purge_events(keep).await
    }
    fn judges_clock(&self) -> bool {
        self.judge.as_ref().is_some_and(|j| j.is_judging())
    }
}

#[cfg(all(test, not(madsim)))]
mod tests {
    //! The simulation store's lockdb clock, through its replicas' views.

    use dlock_rt::{Clock, Duration};

    use super::*;

    async fn until(what: &str, cond: impl Fn() -> bool) {
        let met = dlock_rt::wait_until(Duration::from_millis(10), Duration::from_secs(10), || {
            let ok = cond();
            async move { ok.then_some(()) }
        })
        .await;
        assert!(met.is_some(), "{what}: not within the deadline");
    }

    /// A judged store's clock stands until a replica judges it, then advances no faster than
    /// the judge's monotonic clock; a replica that goes away hands the role to the next,
    /// and leases are decided on that clock.
    #[tokio::test]
    async fn the_simulation_store_keeps_lockdbs_clock_through_its_replicas() {
        let store = Arc::new(MemLockStore::judged(Clock::system()));
        let stood = store.clock_now_ms();
        let started = Clock::system().now();
        let first = store.replica("lock-1", Clock::system());
        until("lock-1 judges", || first.judges_clock()).await;
        until("the clock advances", || store.clock_now_ms() >= stood + 200).await;
        let ran = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        assert!(store.clock_now_ms() - stood <= ran, "the clock ran ahead of its judge");
        let second = store.replica("lock-2", Clock::system());
        assert!(!second.judges_clock(), "one judge at a time");
        let session = Uuid::from_u128(7);
        second.open_session(session, "exec-1", 60_000).await.expect("open");
        let grant = second.acquire("k", session, 1_000, 0).await.expect("store").expect("granted");
        assert_eq!(grant.expires_at_ms - grant.acquired_at_ms, 1_000);
        drop(first);
        until("lock-2 takes the role handed back", || second.judges_clock()).await;
        let at = store.clock_now_ms();
        until("the clock resumes", || store.clock_now_ms() > at).await;
        // A store judged by a given clock has no judge.
        let plain = Arc::new(MemLockStore::new(Clock::system())).replica("lock-1", Clock::system());
        assert!(!plain.judges_clock());
    }
}
