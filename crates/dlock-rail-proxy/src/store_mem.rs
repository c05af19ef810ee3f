//! The simulation store: paydb's rail tables in memory, with the same semantics as SQL.
//!
//! It stands in for the *database*, not for the proxy's memory: in the simulation it
//! outlives every proxy node it serves (a killed and restarted proxy finds its marks where
//! it left them), exactly as paydb outlives a proxy process. The proxy never caches from it.
//!
//! Each method takes the one mutex for its whole body, which is what a serialisable
//! transaction looks like from outside. The conformance suite holds it to the SQL stores.
//! The tables and their admission code are `dlock-paydb`'s ([`RailTables`]); the same code
//! runs on [`MemPaydb`], all of paydb in memory, which the payment-resource shares. A batch
//! (`admit_batch`, `resolve_batch`) is one mutex hold too: validation, the one fence pass
//! and every payout's writes, or every outcome.

use std::sync::Mutex;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
pub use dlock_paydb::mem::{MemPaydb, RailTables, StoredPayout};
use uuid::Uuid;

use crate::store::{
    batch_answers, check_batch, validate_batch, validated_attempts, Admission, Attempt, Checked, EventRead, NewPayout,
    PayoutRow, RailStore, Resolution, Stamp, StoreError, SubmissionRow, Unstamped,
};

/// In-memory paydb (payouts and rail tables).
#[derive(Debug, Default)]
pub struct MemRailStore {
    tables: Mutex<RailTables>,
    /// `paydb_secrets` row `p1-cursor`.
    cursor_secret: Mutex<Option<[u8; 32]>>,
}

impl MemRailStore {
    pub fn new() -> MemRailStore {
        MemRailStore::default()
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, RailTables>, StoreError> {
        self.tables.lock().map_err(|_| StoreError::Corrupt("simulation store poisoned".into()))
    }
}

#[async_trait]
impl RailStore for MemRailStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.lock().map(|_| ())
    }

    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutRow>, StoreError> {
        Ok(self.lock()?.payout(payout_id))
    }

    async fn admit(&self, a: &Attempt) -> Result<Admission, StoreError> {
        self.lock()?.admit(a)
    }

    async fn resolve(&self, submission_id: Uuid, r: &Resolution, at: DateTime<Utc>) -> Result<(), StoreError> {
        self.lock()?.resolve(submission_id, r, at)
    }

    /// Validation and the batch's one fence pass under the one mutex: one transaction.
    async fn admit_batch(&self, asked: &[Unstamped], stamp: Stamp<'_>) -> Result<Vec<Checked>, StoreError> {
        check_batch(asked)?;
        let mut t = self.lock()?;
        let validated = validate_batch(asked, |id| t.payout(id), stamp);
        let admissions = t.admit_batch(&validated_attempts(&validated))?;
        batch_answers(validated, admissions)
    }

    async fn resolve_batch(&self, outcomes: &[(Uuid, Resolution)], at: DateTime<Utc>) -> Result<(), StoreError> {
        self.lock()?.resolve_batch(outcomes, at)
    }

    async fn high_water(&self, account_id: &str) -> Result<Option<i64>, StoreError> {
        Ok(self.lock()?.high_water.get(account_id).copied())
    }

    async fn submissions(&self, payout_id: Option<Uuid>) -> Result<Vec<SubmissionRow>, StoreError> {
        Ok(self.lock()?.submissions_of(payout_id))
    }

    async fn unresolved_before(&self, before: DateTime<Utc>, limit: i64) -> Result<Vec<Uuid>, StoreError> {
        Ok(self.lock()?.unresolved_before(before, limit))
    }

    async fn insert_payout(&self, p: &NewPayout, at: DateTime<Utc>) -> Result<(), StoreError> {
        self.lock()?.insert_payout(p, at)
    }

    async fn read_events(&self, after: i64, limit: usize) -> Result<EventRead, StoreError> {
        Ok(self.lock()?.events.read(after, limit))
    }

    async fn cursor_secret(&self, candidate: [u8; 32], _at: DateTime<Utc>) -> Result<[u8; 32], StoreError> {
        let mut s = self.cursor_secret.lock().map_err(|_| StoreError::Corrupt("cursor secret poisoned".into()))?;
        Ok(*s.get_or_insert(candidate))
    }
}

/// The proxy's view of all of paydb in memory: the proxy's own table code, under the same
/// mutex as the payment-resource's.
#[async_trait]
impl RailStore for MemPaydb {
    async fn ping(&self) -> Result<(), StoreError> {
        self.lock().map(|_| ())
    }

    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutRow>, StoreError> {
        Ok(self.lock()?.rail.payout(payout_id))
    }

    async fn admit(&self, attempt: &Attempt) -> Result<Admission, StoreError> {
        // One transaction, reported to paydb's observer when one is registered.
        self.admit_txn(attempt)
    }

    async fn resolve(&self, submission_id: Uuid, resolution: &Resolution, at: DateTime<Utc>) -> Result<(), StoreError> {
        self.lock()?.rail.resolve(submission_id, resolution, at)
    }

    /// One transaction, each payout's fenced write reported to paydb's observer with the
    /// batch's one pass id ([`MemPaydb::admit_batch_txn`]).
    async fn admit_batch(&self, asked: &[Unstamped], stamp: Stamp<'_>) -> Result<Vec<Checked>, StoreError> {
        check_batch(asked)?;
        let (admissions, validated) = self.admit_batch_txn(|rail| {
            let validated = validate_batch(asked, |id| rail.payout(id), stamp);
            (validated_attempts(&validated), validated)
        })?;
        batch_answers(validated, admissions)
    }

    async fn resolve_batch(&self, outcomes: &[(Uuid, Resolution)], at: DateTime<Utc>) -> Result<(), StoreError> {
        self.resolve_batch_txn(outcomes, at)
    }

    async fn high_water(&self, account_id: &str) -> Result<Option<i64>, StoreError> {
        Ok(self.lock()?.high_water(account_id))
    }

    async fn submissions(&self, payout_id: Option<Uuid>) -> Result<Vec<SubmissionRow>, StoreError> {
        Ok(self.lock()?.rail.submissions_of(payout_id))
    }

    async fn unresolved_before(&self, before: DateTime<Utc>, limit: i64) -> Result<Vec<Uuid>, StoreError> {
        Ok(self.lock()?.rail.unresolved_before(before, limit))
    }

    /// Also upserts a zero-balance CUSTOMER account in the payout's currency, as the SQL
    /// store does (seeded payouts bypass the funds check: dev and tests only).
    async fn insert_payout(&self, payout: &NewPayout, at: DateTime<Utc>) -> Result<(), StoreError> {
        self.lock()?.insert_payout(payout, at)
    }

    async fn read_events(&self, after: i64, limit: usize) -> Result<EventRead, StoreError> {
        Ok(self.lock()?.rail.events.read(after, limit))
    }

    async fn cursor_secret(&self, candidate: [u8; 32], _at: DateTime<Utc>) -> Result<[u8; 32], StoreError> {
        Ok(*self.lock()?.cursor_secret.get_or_insert(candidate))
    }
}
