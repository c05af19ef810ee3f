//! The one delegation of [`LockStore`]: a [`LockStoreLayer`] (timing, faults, the
//! simulation's fault plan) says what happens around one call, and the blanket
//! `impl<L: LockStoreLayer> LockStore for L` below forwards every method to the layer's
//! inner store through [`LockStoreLayer::around`] (issue 36 §4).
//!
//! Invariants:
//! - Adding a store method touches the trait, its implementations, [`LockStoreOp`] and the
//!   one delegating impl here; no layer re-states it.
//! - Every async method is one [`LockStoreOp`]: its metric tag ([`ClosedTag::tag`],
//!   `lock_store_op_seconds{op}`, also the fault name) and whether it writes
//!   ([`LockStoreOp::is_write`]) are fixed here, once.
//! - The call's future is created before the layer runs and polled only by it, so a layer
//!   may refuse a call before any of it runs.
//! - The event outbox's two methods (`read_events`, `purge_events`, C3-extensions E-20) are
//!   no [`LockStoreOp`]: they go to the inner store directly, untimed and never faulted
//!   (the fault plans and `lock_store_op_seconds{op}` name the lock operations only).
//! - A layer with [`LockStoreLayer::DELEGATES_DEFAULTED`] `false` answers the trait's
//!   defaulted methods (`judges_clock`, `pool_stats`, `writer_thread`) with the trait's
//!   defaults; otherwise they go to the inner store.

use std::future::Future;

use async_trait::async_trait;
use dlock_http::metrics::{ClosedTag, PoolStats};
use uuid::Uuid;

use crate::store::{
    AcquireRefusal, Addressed, EventRead, GrantRow, HeldKey, KeyInfo, LockStore, ReapReport, RenewRefusal, Revocation,
    RevokeRefusal, RotateRefusal, SessionRefusal, SessionRow, StoreError,
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
    HeldKeys,
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
            HeldKeys,
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
            LockStoreOp::HeldKeys => "held_keys",
            LockStoreOp::OwnerOf => "owner_of",
            LockStoreOp::Revoke => "revoke",
            LockStoreOp::Reap => "reap",
        }
    }
}

impl LockStoreOp {
    /// Whether the method writes (its call is noted on or off the store's writer thread).
    pub fn is_write(self) -> bool {
        use LockStoreOp::*;
        matches!(self, OpenSession | Heartbeat | CloseSession | Acquire | Renew | Release | Rotate | Revoke | Reap)
    }
}

/// What happens around each call of a wrapped [`LockStore`]: the whole of a decorator.
pub trait LockStoreLayer: Send + Sync + 'static {
    /// `false`: the defaulted methods keep the trait's defaults (module doc).
    const DELEGATES_DEFAULTED: bool = true;

    /// The wrapped store.
    fn inner(&self) -> &dyn LockStore;

    /// Runs `call`, one not yet polled call of `op` on [`Self::inner`].
    fn around<T: Send>(
        &self,
        op: LockStoreOp,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> impl Future<Output = Result<T, StoreError>> + Send;
}

#[async_trait]
impl<L: LockStoreLayer> LockStore for L {
    async fn ping(&self) -> Result<(), StoreError> {
        self.around(LockStoreOp::Ping, self.inner().ping()).await
    }

    async fn now_ms(&self) -> Result<i64, StoreError> {
        self.around(LockStoreOp::NowMs, self.inner().now_ms()).await
    }

    async fn open_session(&self, session_id: Uuid, owner_id: &str, ttl_ms: i64) -> Result<SessionRow, StoreError> {
        self.around(LockStoreOp::OpenSession, self.inner().open_session(session_id, owner_id, ttl_ms)).await
    }

    async fn heartbeat(&self, session_id: Uuid) -> Result<Result<(SessionRow, i64), SessionRefusal>, StoreError> {
        self.around(LockStoreOp::Heartbeat, self.inner().heartbeat(session_id)).await
    }

    async fn close_session(&self, session_id: Uuid, delay_ms: i64) -> Result<Result<(), SessionRefusal>, StoreError> {
        self.around(LockStoreOp::CloseSession, self.inner().close_session(session_id, delay_ms)).await
    }

    async fn acquire(
        &self,
        key: &str,
        session_id: Uuid,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, AcquireRefusal>, StoreError> {
        self.around(LockStoreOp::Acquire, self.inner().acquire(key, session_id, ttl_ms, delay_ms)).await
    }

    async fn renew(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
    ) -> Result<Result<GrantRow, RenewRefusal>, StoreError> {
        self.around(LockStoreOp::Renew, self.inner().renew(key, session_id, token, ttl_ms)).await
    }

    async fn release(&self, key: &str, token: i64) -> Result<Result<(), Option<i64>>, StoreError> {
        self.around(LockStoreOp::Release, self.inner().release(key, token)).await
    }

    async fn rotate(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, RotateRefusal>, StoreError> {
        let call = self.inner().rotate(key, session_id, token, ttl_ms, delay_ms);
        self.around(LockStoreOp::Rotate, call).await
    }

    async fn owner_of(&self, target: Addressed<'_>) -> Result<Option<String>, StoreError> {
        self.around(LockStoreOp::OwnerOf, self.inner().owner_of(target)).await
    }

    async fn info(&self, key: &str, delay_ms: i64) -> Result<Option<KeyInfo>, StoreError> {
        self.around(LockStoreOp::Info, self.inner().info(key, delay_ms)).await
    }

    async fn held_keys(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        delay_ms: i64,
    ) -> Result<Vec<HeldKey>, StoreError> {
        self.around(LockStoreOp::HeldKeys, self.inner().held_keys(prefix, after, limit, delay_ms)).await
    }

    async fn revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        expected_token: Option<i64>,
        revocation_id: Uuid,
    ) -> Result<Result<Revocation, RevokeRefusal>, StoreError> {
        let call = self.inner().revoke(key, operator, reason, expected_token, revocation_id);
        self.around(LockStoreOp::Revoke, call).await
    }

    async fn reap(&self, limit: i64, delay_ms: i64, retention_ms: i64) -> Result<ReapReport, StoreError> {
        self.around(LockStoreOp::Reap, self.inner().reap(limit, delay_ms, retention_ms)).await
    }

    async fn read_events(&self, after: i64, limit: usize) -> Result<EventRead, StoreError> {
        self.inner().read_events(after, limit).await
    }

    async fn purge_events(&self, keep: i64) -> Result<u64, StoreError> {
        self.inner().purge_events(keep).await
    }

    fn judges_clock(&self) -> bool {
        L::DELEGATES_DEFAULTED && self.inner().judges_clock()
    }

    fn pool_stats(&self) -> Option<PoolStats> {
        if L::DELEGATES_DEFAULTED {
            self.inner().pool_stats()
        } else {
            None
        }
    }

    fn writer_thread(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        if L::DELEGATES_DEFAULTED {
            self.inner().writer_thread()
        } else {
            None
        }
    }
}
