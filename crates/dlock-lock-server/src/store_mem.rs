//! The simulation lock store: lockdb in memory, with the same semantics as SQL.
//!
//! Like the rail-proxy's simulation store, it stands in for the *backend*: in the
//! simulation it outlives every lock-server node. Its clock is the backend's clock (one
//! clock for all replicas, as PostgreSQL's is). Each method takes the one mutex for its
//! whole body: a serialisable transaction, seen from outside.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use dlock_rt::Clock;
use uuid::Uuid;

use crate::store::{
    AcquireRefusal, GrantRow, KeyInfo, LockStore, ReapReport, RenewRefusal, Revocation, RevokeRefusal, SessionRefusal,
    SessionRow, StoreError,
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
    fn session_live(&self, id: Uuid, now: i64) -> bool {
        self.sessions.get(&id).is_some_and(|s| now < s.row.expires_at_ms)
    }

    fn session_check(&self, id: Uuid, now: i64) -> Result<(), SessionRefusal> {
        match self.sessions.get(&id) {
            None => Err(SessionRefusal::Unknown),
            Some(s) if now < s.row.expires_at_ms => Ok(()),
            Some(_) => Err(SessionRefusal::Expired),
        }
    }

    fn grant_live(&self, g: &GrantRow, now: i64) -> bool {
        now < g.expires_at_ms && self.session_live(g.session_id, now)
    }

    /// When a (dead) grant died: its own lease end, or its session's, whichever was first.
    fn died_at(&self, g: &GrantRow) -> i64 {
        match self.sessions.get(&g.session_id) {
            Some(s) => g.expires_at_ms.min(s.row.expires_at_ms),
            None => g.expires_at_ms,
        }
    }

    fn next_token(&mut self) -> i64 {
        let t = self.last_issued.max(self.floor) + 1;
        self.last_issued = t;
        t
    }

    /// Removes a grant that died without release, recording its lock-delay.
    fn drop_lost(&mut self, key: &str, delay_ms: i64) {
        if let Some(g) = self.grants.remove(key) {
            if delay_ms > 0 {
                let until = self.died_at(&g) + delay_ms;
                let slot = self.keys.entry(key.to_owned()).or_insert(None);
                *slot = Some(slot.map_or(until, |u| u.max(until)));
            }
        }
    }
}

/// In-memory lockdb.
#[derive(Debug)]
pub struct MemLockStore {
    clock: Clock,
    tables: Mutex<Tables>,
}

impl MemLockStore {
    /// A store whose leases run on `clock` (the simulated backend's clock).
    pub fn new(clock: Clock) -> MemLockStore {
        MemLockStore { clock, tables: Mutex::new(Tables::default()) }
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
        Ok(row)
    }

    async fn heartbeat(&self, session_id: Uuid) -> Result<Result<(SessionRow, i64), SessionRefusal>, StoreError> {
        let now = self.now();
        let mut t = self.lock()?;
        if let Err(r) = t.session_check(session_id, now) {
            return Ok(Err(r));
        }
        let held = t.grants.values().filter(|g| g.session_id == session_id && now < g.expires_at_ms).count();
        let Some(s) = t.sessions.get_mut(&session_id) else { return Ok(Err(SessionRefusal::Unknown)) };
        s.row.expires_at_ms = now + s.row.ttl_ms;
        Ok(Ok((s.row.clone(), held as i64)))
    }

    async fn close_session(&self, session_id: Uuid, delay_ms: i64) -> Result<Result<(), SessionRefusal>, StoreError> {
        let now = self.now();
        let mut t = self.lock()?;
        let Some(s) = t.sessions.get(&session_id).cloned() else { return Ok(Err(SessionRefusal::Unknown)) };
        let live = now < s.row.expires_at_ms;
        let keys: Vec<String> =
            t.grants.values().filter(|g| g.session_id == session_id).map(|g| g.key.clone()).collect();
        for key in keys {
            let lost = !live || t.grants.get(&key).is_some_and(|g| g.expires_at_ms <= now);
            if lost {
                // Died before the close (lease or session lapsed): its lock-delay stands.
                t.drop_lost(&key, delay_ms);
            } else {
                t.grants.remove(&key);
            }
        }
        t.sessions.remove(&session_id);
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
        if let Err(r) = t.session_check(session_id, now) {
            return Ok(Err(AcquireRefusal::Session(r)));
        }
        if let Some(g) = t.grants.get(key).cloned() {
            if t.grant_live(&g, now) {
                return Ok(Err(if g.session_id == session_id {
                    AcquireRefusal::AlreadyHeld { fencing_token: g.fencing_token, expires_at_ms: g.expires_at_ms }
                } else {
                    AcquireRefusal::Contended { holder_owner_id: g.owner_id, expires_at_ms: g.expires_at_ms }
                }));
            }
            t.drop_lost(key, delay_ms);
        }
        if let Some(Some(until)) = t.keys.get(key) {
            if now < *until {
                return Ok(Err(AcquireRefusal::Delayed { until_ms: *until }));
            }
        }
        let owner_id = t.sessions.get(&session_id).map(|s| s.row.owner_id.clone()).unwrap_or_default();
        let token = t.next_token();
        let grant = GrantRow {
            key: key.to_owned(),
            session_id,
            owner_id,
            fencing_token: token,
            acquired_at_ms: now,
            expires_at_ms: now + ttl_ms,
        };
        t.grants.insert(key.to_owned(), grant.clone());
        t.keys.insert(key.to_owned(), None);
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
        if let Err(r) = t.session_check(session_id, now) {
            return Ok(Err(RenewRefusal::Session(r)));
        }
        let stored = t.grants.get(key).cloned();
        match stored {
            Some(g) if g.fencing_token == token && g.session_id == session_id && t.grant_live(&g, now) => {
                let Some(g) = t.grants.get_mut(key) else { return Ok(Err(RenewRefusal::Lost { stored_token: None })) };
                g.expires_at_ms = now + ttl_ms;
                Ok(Ok(g.clone()))
            }
            other => Ok(Err(RenewRefusal::Lost { stored_token: other.map(|g| g.fencing_token) })),
        }
    }

    async fn release(&self, key: &str, token: i64) -> Result<Result<(), Option<i64>>, StoreError> {
        let now = self.now();
        let mut t = self.lock()?;
        match t.grants.get(key).cloned() {
            Some(g) if g.fencing_token == token && t.grant_live(&g, now) => {
                t.grants.remove(key);
                Ok(Ok(()))
            }
            other => Ok(Err(other.map(|g| g.fencing_token))),
        }
    }

    async fn info(&self, key: &str) -> Result<Option<KeyInfo>, StoreError> {
        let now = self.now();
        let t = self.lock()?;
        if !t.keys.contains_key(key) {
            return Ok(None);
        }
        let grant = t.grants.get(key).filter(|g| t.grant_live(g, now)).cloned();
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
        let Some(g) = t.grants.get(key).cloned().filter(|g| t.grant_live(g, now)) else {
            return Ok(Err(RevokeRefusal::NotHeld));
        };
        if expected_token.is_some_and(|e| e != g.fencing_token) {
            return Ok(Err(RevokeRefusal::Stale { current_token: g.fencing_token }));
        }
        t.grants.remove(key);
        let floor = t.next_token();
        t.floor = floor;
        t.revocations.push((
            revocation_id,
            key.to_owned(),
            operator.to_owned(),
            reason.to_owned(),
            g.fencing_token,
            floor,
            now,
        ));
        Ok(Ok(Revocation { revoked_token: g.fencing_token, new_token_floor: floor, revocation_id }))
    }

    async fn reap(&self, limit: i64, delay_ms: i64, retention_ms: i64) -> Result<ReapReport, StoreError> {
        let now = self.now();
        let limit = usize::try_from(limit.max(0)).unwrap_or(0);
        let mut t = self.lock()?;
        let mut report = ReapReport::default();
        let lapsed: Vec<Uuid> = t
            .sessions
            .iter()
            .filter(|(_, s)| !s.expired_marked && s.row.expires_at_ms <= now)
            .map(|(id, _)| *id)
            .take(limit)
            .collect();
        for id in lapsed {
            let keys: Vec<String> = t.grants.values().filter(|g| g.session_id == id).map(|g| g.key.clone()).collect();
            for key in keys {
                t.drop_lost(&key, delay_ms);
                report.released_grants += 1;
            }
            if let Some(s) = t.sessions.get_mut(&id) {
                s.expired_marked = true;
            }
            report.expired_sessions += 1;
        }
        let lapsed_grants: Vec<String> =
            t.grants.values().filter(|g| g.expires_at_ms <= now).map(|g| g.key.clone()).take(limit).collect();
        for key in lapsed_grants {
            t.drop_lost(&key, delay_ms);
            report.released_grants += 1;
        }
        let forgotten: Vec<Uuid> = t
            .sessions
            .iter()
            .filter(|(_, s)| s.expired_marked && s.row.expires_at_ms + retention_ms <= now)
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
