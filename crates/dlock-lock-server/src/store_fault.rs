//! A [`LockStore`] with injected faults: the fault layer's hook (C3-extensions C-29).
//!
//! [`FaultyLockStore`] wraps any store (the memory store in the simulation) and fails the
//! calls queued in its [`StoreFaults`], per operation (the trait method's name), in the one
//! classification every store answers: `Unavailable` and `Corrupt` fail the call before it
//! changes anything, `CommitUnknown` lets it commit and loses the answer. Nothing else
//! differs from the wrapped store.

use std::sync::Arc;

use async_trait::async_trait;
use dlock_contract::store::StoreFaults;
use uuid::Uuid;

use crate::store::{
    AcquireRefusal, Addressed, GrantRow, KeyInfo, LockStore, ReapReport, RenewRefusal, Revocation, RevokeRefusal,
    RotateRefusal, SessionRefusal, SessionRow, StoreError,
};

/// `inner`, failing the calls `faults` holds.
pub struct FaultyLockStore {
    pub inner: Arc<dyn LockStore>,
    pub faults: Arc<StoreFaults>,
}

impl FaultyLockStore {
    pub fn new(inner: Arc<dyn LockStore>) -> FaultyLockStore {
        FaultyLockStore { inner, faults: Arc::new(StoreFaults::new()) }
    }
}

#[async_trait]
impl LockStore for FaultyLockStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.faults.run("ping", self.inner.ping()).await
    }

    async fn now_ms(&self) -> Result<i64, StoreError> {
        self.faults.run("now_ms", self.inner.now_ms()).await
    }

    async fn open_session(&self, session_id: Uuid, owner_id: &str, ttl_ms: i64) -> Result<SessionRow, StoreError> {
        self.faults.run("open_session", self.inner.open_session(session_id, owner_id, ttl_ms)).await
    }

    async fn heartbeat(&self, session_id: Uuid) -> Result<Result<(SessionRow, i64), SessionRefusal>, StoreError> {
        self.faults.run("heartbeat", self.inner.heartbeat(session_id)).await
    }

    async fn close_session(&self, session_id: Uuid, delay_ms: i64) -> Result<Result<(), SessionRefusal>, StoreError> {
        self.faults.run("close_session", self.inner.close_session(session_id, delay_ms)).await
    }

    async fn acquire(
        &self,
        key: &str,
        session_id: Uuid,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, AcquireRefusal>, StoreError> {
        self.faults.run("acquire", self.inner.acquire(key, session_id, ttl_ms, delay_ms)).await
    }

    async fn renew(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
    ) -> Result<Result<GrantRow, RenewRefusal>, StoreError> {
        self.faults.run("renew", self.inner.renew(key, session_id, token, ttl_ms)).await
    }

    async fn release(&self, key: &str, token: i64) -> Result<Result<(), Option<i64>>, StoreError> {
        self.faults.run("release", self.inner.release(key, token)).await
    }

    async fn rotate(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, RotateRefusal>, StoreError> {
        self.faults.run("rotate", self.inner.rotate(key, session_id, token, ttl_ms, delay_ms)).await
    }

    async fn owner_of(&self, target: Addressed<'_>) -> Result<Option<String>, StoreError> {
        self.faults.run("owner_of", self.inner.owner_of(target)).await
    }

    async fn info(&self, key: &str) -> Result<Option<KeyInfo>, StoreError> {
        self.faults.run("info", self.inner.info(key)).await
    }

    async fn revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        expected_token: Option<i64>,
        revocation_id: Uuid,
    ) -> Result<Result<Revocation, RevokeRefusal>, StoreError> {
        self.faults.run("revoke", self.inner.revoke(key, operator, reason, expected_token, revocation_id)).await
    }

    async fn reap(&self, limit: i64, delay_ms: i64, retention_ms: i64) -> Result<ReapReport, StoreError> {
        self.faults.run("reap", self.inner.reap(limit, delay_ms, retention_ms)).await
    }

    fn judges_clock(&self) -> bool {
        self.inner.judges_clock()
    }

    fn pool_stats(&self) -> Option<dlock_http::metrics::PoolStats> {
        self.inner.pool_stats()
    }

    fn writer_thread(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        self.inner.writer_thread()
    }
}
