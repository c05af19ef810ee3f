//! A [`LockStore`] that measures every call: `lock_store_op_seconds{op}` (issue 13).
//!
//! [`TimedLockStore`] wraps the store a [`crate::service::LockServer`] is given, so every
//! store call of the replica (HTTP handlers, waiters, reaper) is timed in one place, on the
//! replica's `dlock-rt` clock. The `op` tag is the trait method ([`LockStoreOp`], a closed
//! set); nothing else differs from the wrapped store.

use std::sync::Arc;

use async_trait::async_trait;
use dlock_http::metrics::{ClosedTag, OffWriterWrites, PoolStats, TaggedHistogram};
use dlock_rt::Clock;
use uuid::Uuid;

use crate::store::{
    AcquireRefusal, Addressed, GrantRow, KeyInfo, LockStore, ReapReport, RenewRefusal, Revocation, RevokeRefusal,
    RotateRefusal, SessionRefusal, SessionRow, StoreError,
};

/// The `op` tag of `lock_store_op_seconds`: one value per [`LockStore`] method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockStoreOp {
    Ping,
    NowMs,
    OpenSession,
    Heartbeat,
    CloseSession,
    Acquire,
    Renew,
    Release,
    Rotate,
    Info,
    OwnerOf,
    Revoke,
    Reap,
}

impl ClosedTag for LockStoreOp {
    const LABEL: &'static str = "op";

    fn all() -> &'static [Self] {
        use LockStoreOp::*;
        &[
            Ping,
            NowMs,
            OpenSession,
            Heartbeat,
            CloseSession,
            Acquire,
            Renew,
            Release,
            Rotate,
            Info,
            OwnerOf,
            Revoke,
            Reap,
        ]
    }

    fn tag(self) -> &'static str {
        match self {
            LockStoreOp::Ping => "ping",
            LockStoreOp::NowMs => "now_ms",
            LockStoreOp::OpenSession => "open_session",
            LockStoreOp::Heartbeat => "heartbeat",
            LockStoreOp::CloseSession => "close_session",
            LockStoreOp::Acquire => "acquire",
            LockStoreOp::Renew => "renew",
            LockStoreOp::Release => "release",
            LockStoreOp::Rotate => "rotate",
            LockStoreOp::Info => "info",
            LockStoreOp::OwnerOf => "owner_of",
            LockStoreOp::Revoke => "revoke",
            LockStoreOp::Reap => "reap",
        }
    }
}

/// `inner`, timing every call into `ops`.
pub struct TimedLockStore {
    pub inner: Arc<dyn LockStore>,
    pub ops: Arc<TaggedHistogram<LockStoreOp>>,
    /// Where each write is noted: it runs on the store's writer thread, or is counted.
    pub off_writer: Arc<OffWriterWrites>,
    pub clock: Clock,
}

impl TimedLockStore {
    /// Times the write `call` under `op`, noting whether it runs on the store's writer
    /// thread (`*_store_writes_off_writer_total`).
    async fn write<T>(&self, op: LockStoreOp, call: impl std::future::Future<Output = T>) -> T {
        self.off_writer.note(self.inner.writer_thread(), op.tag());
        self.ops.time(&self.clock, op, call).await
    }
}

#[async_trait]
impl LockStore for TimedLockStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.ops.time(&self.clock, LockStoreOp::Ping, self.inner.ping()).await
    }

    async fn now_ms(&self) -> Result<i64, StoreError> {
        self.ops.time(&self.clock, LockStoreOp::NowMs, self.inner.now_ms()).await
    }

    async fn open_session(&self, session_id: Uuid, owner_id: &str, ttl_ms: i64) -> Result<SessionRow, StoreError> {
        self.write(LockStoreOp::OpenSession, self.inner.open_session(session_id, owner_id, ttl_ms)).await
    }

    async fn heartbeat(&self, session_id: Uuid) -> Result<Result<(SessionRow, i64), SessionRefusal>, StoreError> {
        self.write(LockStoreOp::Heartbeat, self.inner.heartbeat(session_id)).await
    }

    async fn close_session(&self, session_id: Uuid, delay_ms: i64) -> Result<Result<(), SessionRefusal>, StoreError> {
        self.write(LockStoreOp::CloseSession, self.inner.close_session(session_id, delay_ms)).await
    }

    async fn acquire(
        &self,
        key: &str,
        session_id: Uuid,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, AcquireRefusal>, StoreError> {
        self.write(LockStoreOp::Acquire, self.inner.acquire(key, session_id, ttl_ms, delay_ms)).await
    }

    async fn renew(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
    ) -> Result<Result<GrantRow, RenewRefusal>, StoreError> {
        self.write(LockStoreOp::Renew, self.inner.renew(key, session_id, token, ttl_ms)).await
    }

    async fn release(&self, key: &str, token: i64) -> Result<Result<(), Option<i64>>, StoreError> {
        self.write(LockStoreOp::Release, self.inner.release(key, token)).await
    }

    async fn rotate(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, RotateRefusal>, StoreError> {
        let call = self.inner.rotate(key, session_id, token, ttl_ms, delay_ms);
        self.write(LockStoreOp::Rotate, call).await
    }

    async fn info(&self, key: &str) -> Result<Option<KeyInfo>, StoreError> {
        self.ops.time(&self.clock, LockStoreOp::Info, self.inner.info(key)).await
    }

    async fn owner_of(&self, target: Addressed<'_>) -> Result<Option<String>, StoreError> {
        self.ops.time(&self.clock, LockStoreOp::OwnerOf, self.inner.owner_of(target)).await
    }

    async fn revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        expected_token: Option<i64>,
        revocation_id: Uuid,
    ) -> Result<Result<Revocation, RevokeRefusal>, StoreError> {
        let call = self.inner.revoke(key, operator, reason, expected_token, revocation_id);
        self.write(LockStoreOp::Revoke, call).await
    }

    async fn reap(&self, limit: i64, delay_ms: i64, retention_ms: i64) -> Result<ReapReport, StoreError> {
        self.write(LockStoreOp::Reap, self.inner.reap(limit, delay_ms, retention_ms)).await
    }

    fn judges_clock(&self) -> bool {
        self.inner.judges_clock()
    }

    fn pool_stats(&self) -> Option<PoolStats> {
        self.inner.pool_stats()
    }

    fn writer_thread(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        self.inner.writer_thread()
    }
}
