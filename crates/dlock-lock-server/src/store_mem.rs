//! The simulation lock store: lockdb in memory, with the same semantics as SQL.
//!
//! Like the rail-proxy's simulation store, it stands in for the *backend*: in the
//! simulation it outlives every lock-server node. Its clock is one clock for all replicas,
//! as lockdb's clock is on SQL (C1 §1.4.2): in the simulation the reference clock, a judge
//! that never dies and never drifts. Each method takes the one mutex for its
//! whole body: a serialisable transaction, seen from outside.
//!
//! **Observer** (simulation only in practice): [`MemLockStore::set_observer`] registers one
//! [`LockObserver`], told of every change to a grant or a session's end *inside* the
//! transaction, under the one mutex, in commit order ([`LockEvent`]). The simulation's
//! oracle keeps its own model of who holds what from these facts and checks each grant
//! against it. Unset (the default) it costs one `Option` read per write; it never changes
//! what a write does.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use dlock_rt::Clock;
use uuid::Uuid;

use crate::rules::{self, AcquireFacts, GrantFacts, RotateFacts};
use crate::store::{
    AcquireRefusal, Addressed, GrantRow, KeyInfo, LockStore, ReapReport, RenewRefusal, Revocation, RevokeRefusal,
    RotateRefusal, SessionRefusal, SessionRow, StoreError,
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

    /// Removes a grant found lost by the reaper, from its lease and its session's end.
    fn drop_dead(&mut self, key: &str, delay_ms: i64) {
        let died_at = self.grant_facts(key).and_then(|g| g.dies_at());
        self.drop_lost(key, died_at, delay_ms);
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
    /// A grant's lease was extended.
    Renewed { key: String, token: i64, expires_at_ms: i64 },
    /// A grant was released by its holder.
    Released { key: String, token: i64, now_ms: i64 },
    /// A grant was revoked by an operator; the token floor rose to `new_token_floor`.
    Revoked { key: String, token: i64, new_token_floor: i64, now_ms: i64 },
    /// The reaper (or an acquire) removed a grant it judged dead.
    Dropped { key: String, token: i64, now_ms: i64 },
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
}

impl MemLockStore {
    /// A store whose leases run on `clock` (the simulated backend's clock).
    pub fn new(clock: Clock) -> MemLockStore {
        MemLockStore { clock, tables: Mutex::new(Tables::default()), observer: ObserverSlot::default() }
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

    fn now(&self) -> i64 {
        self.clock.wall().timestamp_millis()
    }
}

#[async_trait]
impl LockStore for MemLockStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.lock().map(|_| ())
    }

    async fn now_ms(&self) -> Result<i64, StoreError> {
        Ok(self.now())
    }

    async fn open_session(&self, session_id: Uuid, owner_id: &str, ttl_ms: i64) -> Result<SessionRow, StoreError> {
        let now = self.now();
        let mut t = self.lock()?;
        let row = SessionRow { session_id, owner_id: owner_id.to_owned(), ttl_ms, expires_at_ms: now + ttl_ms };
        t.sessions.insert(session_id, Session { row: row.clone(), expired_marked: false });
        self.observer.tell(|| LockEvent::SessionEnds { session_id, expires_at_ms: row.expires_at_ms });
        Ok(row)
    }

    async fn heartbeat(&self, session_id: Uuid) -> Result<Result<(SessionRow, i64), SessionRefusal>, StoreError> {
        let now = self.now();
        let mut t = self.lock()?;
        if let Err(r) = t.session_check(session_id, now) {
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
        let now = self.now();
        let mut t = self.lock()?;
        let Some(s) = t.sessions.get(&session_id).cloned() else { return Ok(Err(SessionRefusal::Unknown)) };
        let mine: Vec<(String, i64)> = t
            .grants
            .values()
            .filter(|g| g.session_id == session_id)
            .map(|g| (g.key.clone(), g.expires_at_ms))
            .collect();
        for (key, lease_end) in mine {
            // Died before the close (lease or session lapsed): its lock-delay stands.
            let lost = rules::lost_before_close(lease_end, s.row.expires_at_ms, now);
            t.drop_lost(&key, lost, delay_ms);
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
        let now = self.now();
        let mut t = self.lock()?;
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
                self.observer.tell(|| LockEvent::Dropped { key: key.to_owned(), token: g.fencing_token, now_ms: now });
            }
            t.record_delay(key, removal.delay_until_ms);
        }
        let plan = match decision.verdict {
            Ok(plan) => plan,
            Err(refusal) => return Ok(Err(refusal)),
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
        let now = self.now();
        let mut t = self.lock()?;
        if let Err(refusal) = rules::decide_renew(t.session_end(session_id), t.grant_facts(key), session_id, token, now)
        {
            return Ok(Err(refusal));
        }
        let Some(g) = t.grants.get_mut(key) else { return Ok(Err(RenewRefusal::Lost { stored_token: None })) };
        g.expires_at_ms = now + ttl_ms;
        let g = g.clone();
        self.observer.tell(|| LockEvent::Renewed { key: key.to_owned(), token, expires_at_ms: g.expires_at_ms });
        Ok(Ok(g))
    }

    async fn release(&self, key: &str, token: i64) -> Result<Result<(), Option<i64>>, StoreError> {
        let now = self.now();
        let mut t = self.lock()?;
        if let Err(stored) = rules::decide_release(t.grant_facts(key), token, now) {
            return Ok(Err(stored));
        }
        t.grants.remove(key);
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
        let now = self.now();
        let mut t = self.lock()?;
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
            Err(refusal) => return Ok(Err(refusal)),
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
        t.grants.insert(key.to_owned(), grant.clone());
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

    async fn info(&self, key: &str) -> Result<Option<KeyInfo>, StoreError> {
        let now = self.now();
        let t = self.lock()?;
        if !t.keys.contains_key(key) {
            return Ok(None);
        }
        let grant = t.grant_facts(key).filter(|g| g.live(now)).map(|g| g.grant.clone());
        Ok(Some(KeyInfo { grant }))
    }

    async fn revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        expected_token: Option<i64>,
        revocation_id: Uuid,
    ) -> Result<Result<Revocation, RevokeRefusal>, StoreError> {
        let now = self.now();
        let mut t = self.lock()?;
        let revoked = match rules::decide_revoke(t.grant_facts(key), expected_token, now) {
            Ok(token) => token,
            Err(refusal) => return Ok(Err(refusal)),
        };
        t.grants.remove(key);
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
        self.observer.tell(|| LockEvent::Revoked {
            key: key.to_owned(),
            token: revoked,
            new_token_floor: floor,
            now_ms: now,
        });
        Ok(Ok(Revocation { revoked_token: revoked, new_token_floor: floor, revocation_id }))
    }

    async fn reap(&self, limit: i64, delay_ms: i64, retention_ms: i64) -> Result<ReapReport, StoreError> {
        let now = self.now();
        let limit = usize::try_from(limit.max(0)).unwrap_or(0);
        let mut t = self.lock()?;
        let mut report = ReapReport::default();
        let lapsed: Vec<Uuid> = t
            .sessions
            .iter()
            .filter(|(_, s)| rules::session_lapsed(s.row.expires_at_ms, s.expired_marked, now))
            .map(|(id, _)| *id)
            .take(limit)
            .collect();
        for id in lapsed {
            let keys: Vec<String> = t.grants.values().filter(|g| g.session_id == id).map(|g| g.key.clone()).collect();
            for key in keys {
                let token = t.grants.get(&key).map(|g| g.fencing_token);
                t.drop_dead(&key, delay_ms);
                if let Some(token) = token {
                    self.observer.tell(|| LockEvent::Dropped { key: key.clone(), token, now_ms: now });
                }
                report.released_grants += 1;
            }
            if let Some(s) = t.sessions.get_mut(&id) {
                s.expired_marked = true;
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
            t.drop_dead(&key, delay_ms);
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
}
