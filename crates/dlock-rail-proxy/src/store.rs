//! The rail-proxy's store: the trait every backend implements, and the records it speaks.
//!
//! The trait is shaped by T-024's transaction boundaries, not by tables:
//! [`RailStore::admit`] is steps 1–3 in **one** transaction (advance the mark, claim the
//! forwardable slot, move the payout to SUBMITTED), and [`RailStore::resolve`] is the
//! second transaction that records the outcome of the one forward in between. Nothing
//! between the two holds a database connection, so a slow rail never pins one.
//!
//! Invariants every implementation keeps (the conformance suite proves them on SQLite,
//! PostgreSQL and the simulation store alike):
//! 1. The mark for an account only rises, and only to a token strictly greater than it.
//! 2. At most one forwardable attempt (outcome NULL, ACKED, REJECTED or TIMEOUT) exists per
//!    payout, decided by the unique index, never by a prior read.
//! 3. Every attempt that passes validation leaves exactly one row carrying its token.
//! 4. A refused admission (fenced, duplicate) never changes the payout; a not-claimable
//!    one changes nothing at all.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

/// paydb's shared rail rows and the one store error, from `dlock-paydb`.
pub use dlock_paydb::rail::{is_forwardable, Admission, Attempt, NewPayout, PayoutRow, Resolution, SubmissionRow};
pub use dlock_paydb::{ClassifiedStoreError, StoreError, StoreFault};

/// The rail-proxy's view of paydb.
#[async_trait]
pub trait RailStore: Send + Sync + 'static {
    /// Cheap round trip, for readiness.
    async fn ping(&self) -> Result<(), StoreError>;

    /// The payout, for body validation before step 1 (advisory: `admit` decides).
    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutRow>, StoreError>;

    /// Steps 1–3 in one transaction. See [`Admission`].
    async fn admit(&self, attempt: &Attempt) -> Result<Admission, StoreError>;

    /// Records the outcome of the forward of `submission_id` and moves its payout out of
    /// SUBMITTED, in one transaction. Resolving an already-resolved row is a no-op.
    async fn resolve(&self, submission_id: Uuid, resolution: &Resolution, at: DateTime<Utc>) -> Result<(), StoreError>;

    /// The mark for an account, if it was ever set.
    async fn high_water(&self, account_id: &str) -> Result<Option<i64>, StoreError>;

    /// Attempts, in the order they were written; all of them, or one payout's.
    async fn submissions(&self, payout_id: Option<Uuid>) -> Result<Vec<SubmissionRow>, StoreError>;

    /// Ids of at most `limit` attempts whose outcome is still unrecorded and that were
    /// submitted before `before`, oldest first (the orphan sweep).
    async fn unresolved_before(&self, before: DateTime<Utc>, limit: i64) -> Result<Vec<Uuid>, StoreError>;

    /// Inserts a payout. Fails if the id exists.
    async fn insert_payout(&self, payout: &NewPayout, at: DateTime<Utc>) -> Result<(), StoreError>;

    /// The SQL pool's connections now, for `dlock_db_pool_connections` (`None`: no pool).
    fn pool_stats(&self) -> Option<dlock_http::metrics::PoolStats> {
        None
    }

    /// The thread this store's write transactions run on (`dlock_rt::dedicated`; SQLite's
    /// one writer connection, docs/performance.md §8.7), `None`: on the caller's task.
    fn writer_thread(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        None
    }
}
