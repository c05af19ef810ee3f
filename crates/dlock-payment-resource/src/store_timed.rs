//! A [`PaymentStore`] that measures every call: `payout_store_op_seconds{op}` (issue 13).
//!
//! [`TimedPaymentStore`] wraps the store the [`crate::service::PaymentResource`] is given, so every store call is timed in one
//! place, on the service's `dlock-rt` clock. The `op` tag is the trait method
//! ([`PaymentStoreOp`], a closed set); nothing else differs from the wrapped store.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dlock_http::metrics::{ClosedTag, OffWriterWrites, PoolStats, TaggedHistogram};
use dlock_rt::Clock;
use uuid::Uuid;

use crate::store::{
    AbandonOutcome, AccountView, AmbiguousResolution, Claim, ClaimBatch, ClaimBatchOutcome, ClaimOutcome,
    CreateAccountOutcome, CreatePayoutOutcome, Decided, IdemRequest, LedgerEntry, ListQuery, NewAccount, NewPayout,
    PaymentStore, PayoutSummary, PayoutView, Post, PostBatch, PostBatchOutcome, PostOutcome, Render, ResolutionRow,
    ResolveOutcome, StoreError,
};

/// The `op` tag of `payout_store_op_seconds`: one value per [`PaymentStore`] method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentStoreOp {
    Ping,
    CursorSecret,
    CreateAccount,
    CreatePayout,
    Claim,
    Post,
    ClaimBatch,
    PostBatch,
    Abandon,
    ResolveAmbiguous,
    Resolutions,
    Payout,
    PayoutAccount,
    Account,
    Accounts,
    List,
    Ledger,
    OldestPendingCreatedAt,
    PurgeIdempotency,
    IdempotencyRecordCount,
}

impl ClosedTag for PaymentStoreOp {
    const LABEL: &'static str = "op";

    fn all() -> &'static [Self] {
        use PaymentStoreOp::*;
        &[
            Ping,
            CursorSecret,
            CreateAccount,
            CreatePayout,
            Claim,
            Post,
            ClaimBatch,
            PostBatch,
            Abandon,
            ResolveAmbiguous,
            Resolutions,
            Payout,
            PayoutAccount,
            Account,
            Accounts,
            List,
            Ledger,
            OldestPendingCreatedAt,
            PurgeIdempotency,
            IdempotencyRecordCount,
        ]
    }

    fn tag(self) -> &'static str {
        match self {
            PaymentStoreOp::Ping => "ping",
            PaymentStoreOp::CursorSecret => "cursor_secret",
            PaymentStoreOp::CreateAccount => "create_account",
            PaymentStoreOp::CreatePayout => "create_payout",
            PaymentStoreOp::Claim => "claim",
            PaymentStoreOp::Post => "post",
            PaymentStoreOp::ClaimBatch => "claim_batch",
            PaymentStoreOp::PostBatch => "post_batch",
            PaymentStoreOp::Abandon => "abandon",
            PaymentStoreOp::ResolveAmbiguous => "resolve_ambiguous",
            PaymentStoreOp::Resolutions => "resolutions",
            PaymentStoreOp::Payout => "payout",
            PaymentStoreOp::PayoutAccount => "payout_account",
            PaymentStoreOp::Account => "account",
            PaymentStoreOp::Accounts => "accounts",
            PaymentStoreOp::List => "list",
            PaymentStoreOp::Ledger => "ledger",
            PaymentStoreOp::OldestPendingCreatedAt => "oldest_pending_created_at",
            PaymentStoreOp::PurgeIdempotency => "purge_idempotency",
            PaymentStoreOp::IdempotencyRecordCount => "idempotency_record_count",
        }
    }
}

/// `inner`, timing every call into `ops`.
pub struct TimedPaymentStore {
    pub inner: Arc<dyn PaymentStore>,
    pub ops: Arc<TaggedHistogram<PaymentStoreOp>>,
    /// Where each write is noted: it runs on the store's writer thread, or is counted.
    pub off_writer: Arc<OffWriterWrites>,
    pub clock: Clock,
}

impl TimedPaymentStore {
    /// Times the write `call` under `op`, noting whether it runs on the store's writer
    /// thread (`*_store_writes_off_writer_total`).
    async fn write<T>(&self, op: PaymentStoreOp, call: impl std::future::Future<Output = T>) -> T {
        self.off_writer.note(self.inner.writer_thread(), op.tag());
        self.ops.time(&self.clock, op, call).await
    }
}

#[async_trait]
impl PaymentStore for TimedPaymentStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.ops.time(&self.clock, PaymentStoreOp::Ping, self.inner.ping()).await
    }

    async fn cursor_secret(&self, candidate: [u8; 32], at: DateTime<Utc>) -> Result<[u8; 32], StoreError> {
        self.write(PaymentStoreOp::CursorSecret, self.inner.cursor_secret(candidate, at)).await
    }

    async fn create_account(
        &self,
        a: &NewAccount,
        i: &IdemRequest,
        r: Render<'_, CreateAccountOutcome>,
    ) -> Decided<CreateAccountOutcome> {
        self.write(PaymentStoreOp::CreateAccount, self.inner.create_account(a, i, r)).await
    }

    async fn create_payout(
        &self,
        p: &NewPayout,
        i: &IdemRequest,
        r: Render<'_, CreatePayoutOutcome>,
    ) -> Decided<CreatePayoutOutcome> {
        self.write(PaymentStoreOp::CreatePayout, self.inner.create_payout(p, i, r)).await
    }

    async fn claim(&self, c: &Claim, i: &IdemRequest, r: Render<'_, ClaimOutcome>) -> Decided<ClaimOutcome> {
        self.write(PaymentStoreOp::Claim, self.inner.claim(c, i, r)).await
    }

    async fn post(&self, p: &Post, i: &IdemRequest, r: Render<'_, PostOutcome>) -> Decided<PostOutcome> {
        self.write(PaymentStoreOp::Post, self.inner.post(p, i, r)).await
    }

    async fn claim_batch(
        &self,
        b: &ClaimBatch,
        i: &IdemRequest,
        r: Render<'_, ClaimBatchOutcome>,
    ) -> Decided<ClaimBatchOutcome> {
        self.write(PaymentStoreOp::ClaimBatch, self.inner.claim_batch(b, i, r)).await
    }

    async fn post_batch(
        &self,
        b: &PostBatch,
        i: &IdemRequest,
        r: Render<'_, PostBatchOutcome>,
    ) -> Decided<PostBatchOutcome> {
        self.write(PaymentStoreOp::PostBatch, self.inner.post_batch(b, i, r)).await
    }

    async fn abandon(&self, payout_id: Uuid, at: DateTime<Utc>) -> Result<AbandonOutcome, StoreError> {
        self.write(PaymentStoreOp::Abandon, self.inner.abandon(payout_id, at)).await
    }

    async fn resolve_ambiguous(&self, r: &AmbiguousResolution) -> Result<ResolveOutcome, StoreError> {
        self.write(PaymentStoreOp::ResolveAmbiguous, self.inner.resolve_ambiguous(r)).await
    }

    async fn resolutions(&self, payout_id: Option<Uuid>) -> Result<Vec<ResolutionRow>, StoreError> {
        self.ops.time(&self.clock, PaymentStoreOp::Resolutions, self.inner.resolutions(payout_id)).await
    }

    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutView>, StoreError> {
        self.ops.time(&self.clock, PaymentStoreOp::Payout, self.inner.payout(payout_id)).await
    }

    async fn payout_account(&self, payout_id: Uuid) -> Result<Option<String>, StoreError> {
        self.ops.time(&self.clock, PaymentStoreOp::PayoutAccount, self.inner.payout_account(payout_id)).await
    }

    async fn account(&self, account_id: &str) -> Result<Option<AccountView>, StoreError> {
        self.ops.time(&self.clock, PaymentStoreOp::Account, self.inner.account(account_id)).await
    }

    async fn accounts(&self) -> Result<Vec<AccountView>, StoreError> {
        self.ops.time(&self.clock, PaymentStoreOp::Accounts, self.inner.accounts()).await
    }

    async fn list(&self, q: &ListQuery) -> Result<Vec<PayoutSummary>, StoreError> {
        self.ops.time(&self.clock, PaymentStoreOp::List, self.inner.list(q)).await
    }

    async fn ledger(&self, account_id: Option<&str>) -> Result<Vec<LedgerEntry>, StoreError> {
        self.ops.time(&self.clock, PaymentStoreOp::Ledger, self.inner.ledger(account_id)).await
    }

    async fn oldest_pending_created_at(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        self.ops.time(&self.clock, PaymentStoreOp::OldestPendingCreatedAt, self.inner.oldest_pending_created_at()).await
    }

    async fn purge_idempotency(&self, now: DateTime<Utc>, batch_max: i64) -> Result<u64, StoreError> {
        self.write(PaymentStoreOp::PurgeIdempotency, self.inner.purge_idempotency(now, batch_max)).await
    }

    async fn idempotency_record_count(&self) -> Result<u64, StoreError> {
        self.ops.time(&self.clock, PaymentStoreOp::IdempotencyRecordCount, self.inner.idempotency_record_count()).await
    }

    fn pool_stats(&self) -> Option<PoolStats> {
        self.inner.pool_stats()
    }

    fn writer_thread(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        self.inner.writer_thread()
    }
}
