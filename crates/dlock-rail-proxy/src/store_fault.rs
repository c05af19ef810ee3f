//! A [`RailStore`] with injected faults: the fault layer's hook (C3-extensions C-29).
//!
//! [`FaultyRailStore`] wraps any store (`MemRailStore` or `MemPaydb` in the simulation) and
//! fails the calls queued in its [`StoreFaults`], per operation (the trait method's name),
//! in the one classification every store answers: `Unavailable` and `Corrupt` fail the call
//! before it changes anything, `CommitUnknown` lets it commit and loses the answer.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dlock_contract::store::StoreFaults;
use uuid::Uuid;

use crate::store::{
    Admission, Attempt, Checked, NewPayout, PayoutRow, RailStore, Resolution, Stamp, StoreError, SubmissionRow,
    Unstamped,
};

/// `inner`, failing the calls `faults` holds.
pub struct FaultyRailStore {
    pub inner: Arc<dyn RailStore>,
    pub faults: Arc<StoreFaults>,
}

impl FaultyRailStore {
    pub fn new(inner: Arc<dyn RailStore>) -> FaultyRailStore {
        FaultyRailStore { inner, faults: Arc::new(StoreFaults::new()) }
    }
}

#[async_trait]
impl RailStore for FaultyRailStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.faults.run("ping", self.inner.ping()).await
    }

    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutRow>, StoreError> {
        self.faults.run("payout", self.inner.payout(payout_id)).await
    }

    async fn admit(&self, attempt: &Attempt) -> Result<Admission, StoreError> {
        self.faults.run("admit", self.inner.admit(attempt)).await
    }

    async fn resolve(&self, submission_id: Uuid, resolution: &Resolution, at: DateTime<Utc>) -> Result<(), StoreError> {
        self.faults.run("resolve", self.inner.resolve(submission_id, resolution, at)).await
    }

    /// Faulted as one operation, `admit_batch`, exactly as `admit` is: `Unavailable` and
    /// `Corrupt` before anything is validated or written, `CommitUnknown` after the whole
    /// batch committed.
    async fn admit_batch(&self, asked: &[Unstamped], stamp: Stamp<'_>) -> Result<Vec<Checked>, StoreError> {
        self.faults.run("admit_batch", self.inner.admit_batch(asked, stamp)).await
    }

    /// Faulted as one operation, `resolve_batch`, exactly as `resolve` is.
    async fn resolve_batch(&self, outcomes: &[(Uuid, Resolution)], at: DateTime<Utc>) -> Result<(), StoreError> {
        self.faults.run("resolve_batch", self.inner.resolve_batch(outcomes, at)).await
    }

    async fn high_water(&self, account_id: &str) -> Result<Option<i64>, StoreError> {
        self.faults.run("high_water", self.inner.high_water(account_id)).await
    }

    async fn submissions(&self, payout_id: Option<Uuid>) -> Result<Vec<SubmissionRow>, StoreError> {
        self.faults.run("submissions", self.inner.submissions(payout_id)).await
    }

    async fn unresolved_before(&self, before: DateTime<Utc>, limit: i64) -> Result<Vec<Uuid>, StoreError> {
        self.faults.run("unresolved_before", self.inner.unresolved_before(before, limit)).await
    }

    async fn insert_payout(&self, payout: &NewPayout, at: DateTime<Utc>) -> Result<(), StoreError> {
        self.faults.run("insert_payout", self.inner.insert_payout(payout, at)).await
    }

    fn pool_stats(&self) -> Option<dlock_http::metrics::PoolStats> {
        self.inner.pool_stats()
    }

    fn writer_thread(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        self.inner.writer_thread()
    }
}
