//! A [`RailStore`] that measures every call: `rail_store_op_seconds{op}` (issue 13).
//!
//! [`TimedRailStore`] wraps the store the [`crate::service::RailProxy`] is given, so every store call is timed in one
//! place, on the service's `dlock-rt` clock. The `op` tag is the trait method
//! ([`RailStoreOp`], a closed set); nothing else differs from the wrapped store.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dlock_http::metrics::{ClosedTag, OffWriterWrites, PoolStats, TaggedHistogram};
use dlock_rt::Clock;
use uuid::Uuid;

use crate::store::{
    Admission, Attempt, Checked, NewPayout, PayoutRow, RailStore, Resolution, Stamp, StoreError, SubmissionRow,
    Unstamped,
};

/// The `op` tag of `rail_store_op_seconds`: one value per [`RailStore`] method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RailStoreOp {
    Ping,
    Payout,
    Admit,
    Resolve,
    AdmitBatch,
    ResolveBatch,
    HighWater,
    Submissions,
    UnresolvedBefore,
    InsertPayout,
}

impl ClosedTag for RailStoreOp {
    const LABEL: &'static str = "op";

    fn all() -> &'static [Self] {
        use RailStoreOp::*;
        &[
            Ping,
            Payout,
            Admit,
            Resolve,
            AdmitBatch,
            ResolveBatch,
            HighWater,
            Submissions,
            UnresolvedBefore,
            InsertPayout,
        ]
    }

    fn tag(self) -> &'static str {
        match self {
            RailStoreOp::Ping => "ping",
            RailStoreOp::Payout => "payout",
            RailStoreOp::Admit => "admit",
            RailStoreOp::Resolve => "resolve",
            RailStoreOp::AdmitBatch => "admit_batch",
            RailStoreOp::ResolveBatch => "resolve_batch",
            RailStoreOp::HighWater => "high_water",
            RailStoreOp::Submissions => "submissions",
            RailStoreOp::UnresolvedBefore => "unresolved_before",
            RailStoreOp::InsertPayout => "insert_payout",
        }
    }
}

/// `inner`, timing every call into `ops`.
pub struct TimedRailStore {
    pub inner: Arc<dyn RailStore>,
    pub ops: Arc<TaggedHistogram<RailStoreOp>>,
    /// Where each write is noted: it runs on the store's writer thread, or is counted.
    pub off_writer: Arc<OffWriterWrites>,
    pub clock: Clock,
}

impl TimedRailStore {
    /// Times the write `call` under `op`, noting whether it runs on the store's writer
    /// thread (`*_store_writes_off_writer_total`).
    async fn write<T>(&self, op: RailStoreOp, call: impl std::future::Future<Output = T>) -> T {
        self.off_writer.note(self.inner.writer_thread(), op.tag());
        self.ops.time(&self.clock, op, call).await
    }
}

#[async_trait]
impl RailStore for TimedRailStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.ops.time(&self.clock, RailStoreOp::Ping, self.inner.ping()).await
    }

    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutRow>, StoreError> {
        self.ops.time(&self.clock, RailStoreOp::Payout, self.inner.payout(payout_id)).await
    }

    async fn admit(&self, attempt: &Attempt) -> Result<Admission, StoreError> {
        self.write(RailStoreOp::Admit, self.inner.admit(attempt)).await
    }

    /// Timed as one admission (its validation read is part of it).
    async fn admit_checked(&self, asked: &Unstamped, stamp: Stamp<'_>) -> Result<Checked, StoreError> {
        self.write(RailStoreOp::Admit, self.inner.admit_checked(asked, stamp)).await
    }

    async fn resolve(&self, submission_id: Uuid, resolution: &Resolution, at: DateTime<Utc>) -> Result<(), StoreError> {
        self.write(RailStoreOp::Resolve, self.inner.resolve(submission_id, resolution, at)).await
    }

    async fn admit_batch(&self, asked: &[Unstamped], stamp: Stamp<'_>) -> Result<Vec<Checked>, StoreError> {
        self.write(RailStoreOp::AdmitBatch, self.inner.admit_batch(asked, stamp)).await
    }

    async fn resolve_batch(&self, outcomes: &[(Uuid, Resolution)], at: DateTime<Utc>) -> Result<(), StoreError> {
        self.write(RailStoreOp::ResolveBatch, self.inner.resolve_batch(outcomes, at)).await
    }

    async fn high_water(&self, account_id: &str) -> Result<Option<i64>, StoreError> {
        self.ops.time(&self.clock, RailStoreOp::HighWater, self.inner.high_water(account_id)).await
    }

    async fn submissions(&self, payout_id: Option<Uuid>) -> Result<Vec<SubmissionRow>, StoreError> {
        self.ops.time(&self.clock, RailStoreOp::Submissions, self.inner.submissions(payout_id)).await
    }

    async fn unresolved_before(&self, before: DateTime<Utc>, limit: i64) -> Result<Vec<Uuid>, StoreError> {
        self.ops.time(&self.clock, RailStoreOp::UnresolvedBefore, self.inner.unresolved_before(before, limit)).await
    }

    async fn insert_payout(&self, payout: &NewPayout, at: DateTime<Utc>) -> Result<(), StoreError> {
        self.write(RailStoreOp::InsertPayout, self.inner.insert_payout(payout, at)).await
    }

    fn pool_stats(&self) -> Option<PoolStats> {
        self.inner.pool_stats()
    }

    fn writer_thread(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        self.inner.writer_thread()
    }
}
