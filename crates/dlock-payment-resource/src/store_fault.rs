//! A [`PaymentStore`] with injected faults: the fault layer's hook (C3-extensions C-29).
//!
//! [`FaultyPaymentStore`] wraps any store (`MemPaydb` in the simulation) and fails the calls
//! queued in its [`StoreFaults`], per operation (the trait method's name), in the one
//! classification every store answers: `Unavailable` and `Corrupt` fail the call before it
//! changes anything, `CommitUnknown` lets it commit and loses the answer. The batch writes
//! (`claim_batch`, `post_batch`, C3-extensions E-19) are faulted exactly as `claim` and
//! `post` are, under their own names.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dlock_contract::store::StoreFaults;
use uuid::Uuid;

use crate::store::{
    AbandonOutcome, AccountView, AmbiguousResolution, Claim, ClaimBatch, ClaimBatchOutcome, ClaimOutcome,
    CreateAccountOutcome, CreatePayoutOutcome, Decided, IdemRequest, LedgerEntry, ListQuery, NewAccount, NewPayout,
    PaymentStore, PayoutSummary, PayoutView, Post, PostBatch, PostBatchOutcome, PostOutcome, Render, ResolutionRow,
    ResolveOutcome, StoreError,
};

/// `inner`, failing the calls `faults` holds.
pub struct FaultyPaymentStore {
    pub inner: Arc<dyn PaymentStore>,
    pub faults: Arc<StoreFaults>,
}

impl FaultyPaymentStore {
    pub fn new(inner: Arc<dyn PaymentStore>) -> FaultyPaymentStore {
        FaultyPaymentStore { inner, faults: Arc::new(StoreFaults::new()) }
    }
}

#[async_trait]
impl PaymentStore for FaultyPaymentStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.faults.run("ping", self.inner.ping()).await
    }

    async fn cursor_secret(&self, candidate: [u8; 32], at: DateTime<Utc>) -> Result<[u8; 32], StoreError> {
        self.faults.run("cursor_secret", self.inner.cursor_secret(candidate, at)).await
    }

    async fn create_account(
        &self,
        a: &NewAccount,
        i: &IdemRequest,
        r: Render<'_, CreateAccountOutcome>,
    ) -> Decided<CreateAccountOutcome> {
        self.faults.run("create_account", self.inner.create_account(a, i, r)).await
    }

    async fn create_payout(
        &self,
        p: &NewPayout,
        i: &IdemRequest,
        r: Render<'_, CreatePayoutOutcome>,
    ) -> Decided<CreatePayoutOutcome> {
        self.faults.run("create_payout", self.inner.create_payout(p, i, r)).await
    }

    async fn claim(&self, c: &Claim, i: &IdemRequest, r: Render<'_, ClaimOutcome>) -> Decided<ClaimOutcome> {
        self.faults.run("claim", self.inner.claim(c, i, r)).await
    }

    async fn post(&self, p: &Post, i: &IdemRequest, r: Render<'_, PostOutcome>) -> Decided<PostOutcome> {
        self.faults.run("post", self.inner.post(p, i, r)).await
    }

    async fn claim_batch(
        &self,
        b: &ClaimBatch,
        i: &IdemRequest,
        r: Render<'_, ClaimBatchOutcome>,
    ) -> Decided<ClaimBatchOutcome> {
        self.faults.run("claim_batch", self.inner.claim_batch(b, i, r)).await
    }

    async fn post_batch(
        &self,
        b: &PostBatch,
        i: &IdemRequest,
        r: Render<'_, PostBatchOutcome>,
    ) -> Decided<PostBatchOutcome> {
        self.faults.run("post_batch", self.inner.post_batch(b, i, r)).await
    }

    async fn abandon(&self, payout_id: Uuid, at: DateTime<Utc>) -> Result<AbandonOutcome, StoreError> {
        self.faults.run("abandon", self.inner.abandon(payout_id, at)).await
    }

    async fn resolve_ambiguous(&self, r: &AmbiguousResolution) -> Result<ResolveOutcome, StoreError> {
        self.faults.run("resolve_ambiguous", self.inner.resolve_ambiguous(r)).await
    }

    async fn resolutions(&self, payout_id: Option<Uuid>) -> Result<Vec<ResolutionRow>, StoreError> {
        self.faults.run("resolutions", self.inner.resolutions(payout_id)).await
    }

    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutView>, StoreError> {
        self.faults.run("payout", self.inner.payout(payout_id)).await
    }

    /// Faulted as `payout`: it is the same read of the same row, narrowed to one column.
    async fn payout_account(&self, payout_id: Uuid) -> Result<Option<String>, StoreError> {
        self.faults.run("payout", self.inner.payout_account(payout_id)).await
    }

    async fn account(&self, account_id: &str) -> Result<Option<AccountView>, StoreError> {
        self.faults.run("account", self.inner.account(account_id)).await
    }

    async fn accounts(&self) -> Result<Vec<AccountView>, StoreError> {
        self.faults.run("accounts", self.inner.accounts()).await
    }

    async fn list(&self, q: &ListQuery) -> Result<Vec<PayoutSummary>, StoreError> {
        self.faults.run("list", self.inner.list(q)).await
    }

    async fn ledger(&self, account_id: Option<&str>) -> Result<Vec<LedgerEntry>, StoreError> {
        self.faults.run("ledger", self.inner.ledger(account_id)).await
    }

    async fn oldest_pending_created_at(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        self.faults.run("oldest_pending_created_at", self.inner.oldest_pending_created_at()).await
    }

    async fn purge_idempotency(&self, now: DateTime<Utc>, batch_max: i64) -> Result<u64, StoreError> {
        self.faults.run("purge_idempotency", self.inner.purge_idempotency(now, batch_max)).await
    }

    async fn idempotency_record_count(&self) -> Result<u64, StoreError> {
        self.faults.run("idempotency_record_count", self.inner.idempotency_record_count()).await
    }

    fn pool_stats(&self) -> Option<dlock_http::metrics::PoolStats> {
        self.inner.pool_stats()
    }

    fn writer_thread(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        self.inner.writer_thread()
    }
}
