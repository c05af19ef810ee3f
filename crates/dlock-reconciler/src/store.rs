//! The reconciler's view of paydb: the reads of one run, and the operator's resolution
//! (`dlock resolve`).
//!
//! The reconciler keeps its own store trait: it depends on `dlock-paydb` (the shared rows,
//! the in-memory tables and the shared statements), never on the services. Its backends:
//! [`MemPaydb`] (the simulation's paydb, which the services share) and [`SqlPaydb`]
//! (PostgreSQL or SQLite). Every statement is the one the payment-resource and the
//! rail-proxy run for the same read (`dlock_paydb::sql`), so the reconciler reads what they
//! wrote.
//!
//! Invariant: every method but [`ReconcileStore::resolve_ambiguous`] and
//! [`ReconcileStore::record_findings`] is a plain read (asking again has no side effect);
//! each of those two is one transaction (a resolution with its audit row; a run's open
//! findings with their events).

use async_trait::async_trait;
use dlock_paydb::findings::{FindingsRun, RecordOutcome};
use dlock_paydb::pay::{
    AccountView, AmbiguousResolution, LedgerEntry, ListQuery, PayoutSummary, PayoutView, ResolutionRow, ResolveOutcome,
};
use dlock_paydb::rail::SubmissionRow;
use dlock_paydb::{MemPaydb, StoreError};
use uuid::Uuid;

/// paydb, as the reconciler sees it.
#[async_trait]
pub trait ReconcileStore: Send + Sync + 'static {
    /// P4: the payout with its attempts.
    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutView>, StoreError>;

    /// P1: at most `q.limit` rows.
    async fn list(&self, q: &ListQuery) -> Result<Vec<PayoutSummary>, StoreError>;

    /// Attempts, in the order they were written; all of them, or one payout's.
    async fn submissions(&self, payout_id: Option<Uuid>) -> Result<Vec<SubmissionRow>, StoreError>;

    /// The resolutions audit trail, all or one payout's.
    async fn resolutions(&self, payout_id: Option<Uuid>) -> Result<Vec<ResolutionRow>, StoreError>;

    /// Ledger entries, all or one account's, in (`created_at`, `entry_id`) order.
    async fn ledger(&self, account_id: Option<&str>) -> Result<Vec<LedgerEntry>, StoreError>;

    /// Every account, system accounts included, in `account_id` order.
    async fn accounts(&self) -> Result<Vec<AccountView>, StoreError>;

    /// The proxy's mark for an account, if it was ever set.
    async fn high_water(&self, account_id: &str) -> Result<Option<i64>, StoreError>;

    /// `dlock resolve`: one transaction that moves a RAIL_AMBIGUOUS payout to POSTED or
    /// FAILED and writes its audit row; any other state is refused and changes nothing.
    async fn resolve_ambiguous(&self, r: &AmbiguousResolution) -> Result<ResolveOutcome, StoreError>;

    /// Records a run's findings (`dlock_paydb::findings`): opens the new ones and, for a
    /// complete run, clears the ones gone, each with its `reconciler.finding` event, in one
    /// transaction.
    async fn record_findings(&self, run: &FindingsRun) -> Result<RecordOutcome, StoreError>;
}

#[async_trait]
impl ReconcileStore for MemPaydb {
    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutView>, StoreError> {
        Ok(self.lock()?.payout_view(payout_id))
    }

    async fn list(&self, q: &ListQuery) -> Result<Vec<PayoutSummary>, StoreError> {
        Ok(self.lock()?.list(q))
    }

    async fn submissions(&self, payout_id: Option<Uuid>) -> Result<Vec<SubmissionRow>, StoreError> {
        Ok(self.lock()?.rail.submissions_of(payout_id))
    }

    async fn resolutions(&self, payout_id: Option<Uuid>) -> Result<Vec<ResolutionRow>, StoreError> {
        Ok(self.lock()?.resolutions(payout_id))
    }

    async fn ledger(&self, account_id: Option<&str>) -> Result<Vec<LedgerEntry>, StoreError> {
        Ok(self.lock()?.ledger_of(account_id))
    }

    async fn accounts(&self) -> Result<Vec<AccountView>, StoreError> {
        self.lock()?.account_views()
    }

    async fn high_water(&self, account_id: &str) -> Result<Option<i64>, StoreError> {
        Ok(self.lock()?.high_water(account_id))
    }

    async fn resolve_ambiguous(&self, r: &AmbiguousResolution) -> Result<ResolveOutcome, StoreError> {
        self.lock()?.resolve_ambiguous(r)
    }

    async fn record_findings(&self, run: &FindingsRun) -> Result<RecordOutcome, StoreError> {
        self.lock()?.record_findings(run)
    }
}

/// paydb on PostgreSQL or SQLite, over a pool the reconciler opened (no migration: the
/// services own the schema).
#[cfg(not(madsim))]
#[derive(Debug, Clone)]
pub enum SqlPaydb {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

/// One statement of `dlock_paydb::sql`, on whichever backend `$db` is.
#[cfg(not(madsim))]
macro_rules! on_backend {
    ($db:expr, $f:ident($($arg:expr),*)) => {
        match $db {
            SqlPaydb::Postgres(pool) => dlock_paydb::sql::pg::$f(pool $(, $arg)*).await,
            SqlPaydb::Sqlite(pool) => dlock_paydb::sql::sqlite::$f(pool $(, $arg)*).await,
        }
    };
}

#[cfg(not(madsim))]
#[async_trait]
impl ReconcileStore for SqlPaydb {
    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutView>, StoreError> {
        on_backend!(self, payout(payout_id))
    }

    async fn list(&self, q: &ListQuery) -> Result<Vec<PayoutSummary>, StoreError> {
        on_backend!(self, list(q))
    }

    async fn submissions(&self, payout_id: Option<Uuid>) -> Result<Vec<SubmissionRow>, StoreError> {
        on_backend!(self, submissions(payout_id))
    }

    async fn resolutions(&self, payout_id: Option<Uuid>) -> Result<Vec<ResolutionRow>, StoreError> {
        on_backend!(self, resolutions(payout_id))
    }

    async fn ledger(&self, account_id: Option<&str>) -> Result<Vec<LedgerEntry>, StoreError> {
        on_backend!(self, ledger(account_id))
    }

    async fn accounts(&self) -> Result<Vec<AccountView>, StoreError> {
        on_backend!(self, accounts())
    }

    async fn high_water(&self, account_id: &str) -> Result<Option<i64>, StoreError> {
        on_backend!(self, high_water(account_id))
    }

    async fn resolve_ambiguous(&self, r: &AmbiguousResolution) -> Result<ResolveOutcome, StoreError> {
        on_backend!(self, resolve_ambiguous(r))
    }

    async fn record_findings(&self, run: &FindingsRun) -> Result<RecordOutcome, StoreError> {
        match self {
            SqlPaydb::Postgres(pool) => dlock_paydb::findings::sql::pg_record_findings(pool, run).await,
            SqlPaydb::Sqlite(pool) => dlock_paydb::findings::sql::sqlite_record_findings(pool, run).await,
        }
    }
}
