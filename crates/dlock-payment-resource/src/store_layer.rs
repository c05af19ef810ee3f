//! The one delegation of [`PaymentStore`]: a [`PaymentStoreLayer`] (timing, faults, the
//! simulation's fault plan) says what happens around one call, and the blanket
//! `impl<L: PaymentStoreLayer> PaymentStore for L` below forwards every method to the
//! layer's inner store through [`PaymentStoreLayer::around`] (issue 36 §4).
//!
//! Invariants:
//! - Adding a store method touches the trait, its implementations, [`PaymentStoreOp`] and
//!   the one delegating impl here; no layer re-states it.
//! - Every async method is one [`PaymentStoreOp`] (a fenced write one per request shape): its metric tag
//!   ([`ClosedTag::tag`], `payout_store_op_seconds{op}`), its fault name
//!   ([`PaymentStoreOp::fault_op`]: `payout_account` is faulted as `payout`, the same read)
//!   and whether it writes ([`PaymentStoreOp::is_write`]) are fixed here, once.
//! - The call's future is created before the layer runs and polled only by it, so a layer
//!   may refuse a call before any of it runs.
//! - A layer with [`PaymentStoreLayer::DELEGATES_DEFAULTED`] `false` answers the trait's
//!   defaulted methods (`payout_account`, `pool_stats`, `writer_thread`) with the trait's
//!   defaults, over its own (layered) `payout`; otherwise they go to the inner store.

use std::future::Future;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dlock_http::metrics::{ClosedTag, PoolStats};
use uuid::Uuid;

use crate::store::{
    AbandonOutcome, AccountView, AmbiguousResolution, Answering, ClaimBatch, ClaimBatchOutcome, CreateAccountOutcome,
    CreatePayoutOutcome, Decided, IdemRequest, LedgerEntry, ListQuery, NewAccount, NewPayout, PaymentStore,
    PayoutSummary, PayoutView, PostBatch, PostBatchOutcome, ResolutionRow, ResolveOutcome, Shape, StoreError,
};

/// The `op` tag of `payout_store_op_seconds`: one value per [`PaymentStore`] method, and
/// for the fenced writes one per request shape (`claim` and `claim_batch` are both
/// [`PaymentStore::claim`], a single claim being a batch of one).
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
    ResolveRecorded,
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
    ReadEvents,
    PurgeEvents,
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
            ResolveRecorded,
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
            ReadEvents,
            PurgeEvents,
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
            PaymentStoreOp::ResolveRecorded => "resolve_recorded",
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
            PaymentStoreOp::ReadEvents => "read_events",
            PaymentStoreOp::PurgeEvents => "purge_events",
        }
    }
}

impl PaymentStoreOp {
    /// The op of a claim of `shape`.
    pub fn claim(shape: Shape) -> Self {
        match shape {
            Shape::Single => PaymentStoreOp::Claim,
            Shape::Batch => PaymentStoreOp::ClaimBatch,
        }
    }

    /// The op of a post of `shape`.
    pub fn post(shape: Shape) -> Self {
        match shape {
            Shape::Single => PaymentStoreOp::Post,
            Shape::Batch => PaymentStoreOp::PostBatch,
        }
    }

    /// Whether the method writes (its call is noted on or off the store's writer thread).
    pub fn is_write(self) -> bool {
        use PaymentStoreOp::*;
        matches!(
            self,
            CursorSecret
                | CreateAccount
                | CreatePayout
                | Claim
                | Post
                | ClaimBatch
                | PostBatch
                | Abandon
                | ResolveAmbiguous
                | ResolveRecorded
                | PurgeIdempotency
                | PurgeEvents
        )
    }

    /// The operation name faults are queued and planned under: the tag, except that
    /// `payout_account` is faulted as `payout` (the same read of the same row, narrowed to
    /// one column).
    pub fn fault_op(self) -> &'static str {
        match self {
            PaymentStoreOp::PayoutAccount => PaymentStoreOp::Payout.tag(),
            op => op.tag(),
        }
    }
}

/// What happens around each call of a wrapped [`PaymentStore`]: the whole of a decorator.
pub trait PaymentStoreLayer: Send + Sync + 'static {
    /// `false`: the defaulted methods keep the trait's defaults (module doc).
    const DELEGATES_DEFAULTED: bool = true;

    /// The wrapped store.
    fn inner(&self) -> &dyn PaymentStore;

    /// Runs `call`, one not yet polled call of `op` on [`Self::inner`].
    fn around<T: Send>(
        &self,
        op: PaymentStoreOp,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> impl Future<Output = Result<T, StoreError>> + Send;
}

#[async_trait]
impl<L: PaymentStoreLayer> PaymentStore for L {
    async fn ping(&self) -> Result<(), StoreError> {
        self.around(PaymentStoreOp::Ping, self.inner().ping()).await
    }

    async fn cursor_secret(&self, candidate: [u8; 32], at: DateTime<Utc>) -> Result<[u8; 32], StoreError> {
        self.around(PaymentStoreOp::CursorSecret, self.inner().cursor_secret(candidate, at)).await
    }

    async fn create_account(&self, n: &NewAccount, i: &IdemRequest, a: &Answering) -> Decided<CreateAccountOutcome> {
        self.around(PaymentStoreOp::CreateAccount, self.inner().create_account(n, i, a)).await
    }

    async fn create_payout(&self, p: &NewPayout, i: &IdemRequest, a: &Answering) -> Decided<CreatePayoutOutcome> {
        self.around(PaymentStoreOp::CreatePayout, self.inner().create_payout(p, i, a)).await
    }

    async fn claim(&self, b: &ClaimBatch, i: &IdemRequest, a: &Answering) -> Decided<ClaimBatchOutcome> {
        self.around(PaymentStoreOp::claim(a.shape), self.inner().claim(b, i, a)).await
    }

    async fn post(&self, b: &PostBatch, i: &IdemRequest, a: &Answering) -> Decided<PostBatchOutcome> {
        self.around(PaymentStoreOp::post(a.shape), self.inner().post(b, i, a)).await
    }

    async fn abandon(&self, payout_id: Uuid, at: DateTime<Utc>) -> Result<AbandonOutcome, StoreError> {
        self.around(PaymentStoreOp::Abandon, self.inner().abandon(payout_id, at)).await
    }

    async fn resolve_ambiguous(&self, r: &AmbiguousResolution) -> Result<ResolveOutcome, StoreError> {
        self.around(PaymentStoreOp::ResolveAmbiguous, self.inner().resolve_ambiguous(r)).await
    }

    async fn resolve_recorded(
        &self,
        r: &AmbiguousResolution,
        i: &IdemRequest,
        a: &Answering,
    ) -> Decided<ResolveOutcome> {
        self.around(PaymentStoreOp::ResolveRecorded, self.inner().resolve_recorded(r, i, a)).await
    }

    async fn resolutions(&self, payout_id: Option<Uuid>) -> Result<Vec<ResolutionRow>, StoreError> {
        self.around(PaymentStoreOp::Resolutions, self.inner().resolutions(payout_id)).await
    }

    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutView>, StoreError> {
        self.around(PaymentStoreOp::Payout, self.inner().payout(payout_id)).await
    }

    async fn payout_account(&self, payout_id: Uuid) -> Result<Option<String>, StoreError> {
        if L::DELEGATES_DEFAULTED {
            self.around(PaymentStoreOp::PayoutAccount, self.inner().payout_account(payout_id)).await
        } else {
            // The trait's default, over this layer's `payout`.
            Ok(self.payout(payout_id).await?.map(|p| p.account_id))
        }
    }

    async fn account(&self, account_id: &str) -> Result<Option<AccountView>, StoreError> {
        self.around(PaymentStoreOp::Account, self.inner().account(account_id)).await
    }

    async fn accounts(&self) -> Result<Vec<AccountView>, StoreError> {
        self.around(PaymentStoreOp::Accounts, self.inner().accounts()).await
    }

    async fn list(&self, q: &ListQuery) -> Result<Vec<PayoutSummary>, StoreError> {
        self.around(PaymentStoreOp::List, self.inner().list(q)).await
    }

    async fn ledger(&self, account_id: Option<&str>) -> Result<Vec<LedgerEntry>, StoreError> {
        self.around(PaymentStoreOp::Ledger, self.inner().ledger(account_id)).await
    }

    async fn oldest_pending_created_at(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        self.around(PaymentStoreOp::OldestPendingCreatedAt, self.inner().oldest_pending_created_at()).await
    }

    async fn purge_idempotency(&self, now: DateTime<Utc>, batch_max: i64) -> Result<u64, StoreError> {
        self.around(PaymentStoreOp::PurgeIdempotency, self.inner().purge_idempotency(now, batch_max)).await
    }

    async fn idempotency_record_count(&self) -> Result<u64, StoreError> {
        self.around(PaymentStoreOp::IdempotencyRecordCount, self.inner().idempotency_record_count()).await
    }

    async fn read_events(&self, after: i64, limit: usize) -> Result<dlock_paydb::events::EventRead, StoreError> {
        self.around(PaymentStoreOp::ReadEvents, self.inner().read_events(after, limit)).await
    }

    async fn read_final_events(
        &self,
        after: i64,
        upto: i64,
        limit: usize,
    ) -> Result<dlock_paydb::events::EventRead, StoreError> {
        self.around(PaymentStoreOp::ReadEvents, self.inner().read_final_events(after, upto, limit)).await
    }

    async fn purge_events(&self, keep: i64) -> Result<u64, StoreError> {
        self.around(PaymentStoreOp::PurgeEvents, self.inner().purge_events(keep)).await
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
