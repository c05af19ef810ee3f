//! The store's reads: a payout (P4), a payout's account (the grant check's), an account,
//! every account, the payout list, the ledger, the resolutions and the oldest PENDING
//! payout's creation instant.
//!
//! Holds the inherent fns `read_*`, stamped for both stores by `reads_op!`.
//!
//! Invariants: every read is autocommitted on the read pool (on SQLite the `query_only`
//! readers, off the writer connection); no decision of a write depends on one. A payout's
//! account is read from paydb once per payout, then remembered
//! ([`crate::payout_accounts::PayoutAccounts`]): it never changes and no payout is deleted;
//! an unknown payout is not remembered.

use chrono::{DateTime, Utc};
use sqlx::Row;
use uuid::Uuid;

use super::{PgPaymentStore, SqlitePaymentStore};
use crate::store::{AccountView, LedgerEntry, ListQuery, PayoutSummary, PayoutView, ResolutionRow, StoreError};
use dlock_paydb::sql::db_error;

/// Stamps the reads for a store (`$paydb` its `dlock_paydb::sql` module).
macro_rules! reads_op {
    ($store:ty, $paydb:ident) => {
        impl $store {
            pub(super) async fn read_resolutions(
                &self,
                payout_id: Option<Uuid>,
            ) -> Result<Vec<ResolutionRow>, StoreError> {
                dlock_paydb::sql::$paydb::resolutions(&self.read_pool, payout_id).await
            }

            pub(super) async fn read_payout(&self, payout_id: Uuid) -> Result<Option<PayoutView>, StoreError> {
                dlock_paydb::sql::$paydb::payout(&self.read_pool, payout_id).await
            }

            /// Read from paydb once per payout, then from [`crate::payout_accounts::PayoutAccounts`]: a payout's
            /// account never changes (paydb refuses the update) and no payout is deleted.
            pub(super) async fn read_payout_account(&self, payout_id: Uuid) -> Result<Option<String>, StoreError> {
                if let Some(account) = self.accounts.get(payout_id) {
                    return Ok(Some(account));
                }
                let found = dlock_paydb::sql::$paydb::payout_account(&self.read_pool, payout_id).await?;
                if let Some(account) = &found {
                    self.accounts.remember(payout_id, account);
                }
                Ok(found)
            }

            pub(super) async fn read_account(&self, account_id: &str) -> Result<Option<AccountView>, StoreError> {
                dlock_paydb::sql::$paydb::account(&self.read_pool, account_id).await
            }

            pub(super) async fn read_accounts(&self) -> Result<Vec<AccountView>, StoreError> {
                dlock_paydb::sql::$paydb::accounts(&self.read_pool).await
            }

            pub(super) async fn read_list(&self, q: &ListQuery) -> Result<Vec<PayoutSummary>, StoreError> {
                dlock_paydb::sql::$paydb::list(&self.read_pool, q).await
            }

            pub(super) async fn read_ledger(&self, account_id: Option<&str>) -> Result<Vec<LedgerEntry>, StoreError> {
                dlock_paydb::sql::$paydb::ledger(&self.read_pool, account_id).await
            }

            pub(super) async fn read_oldest_pending_created_at(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
                let q = "SELECT created_at FROM payouts WHERE state = 'PENDING' ORDER BY created_at LIMIT 1";
                sqlx::query(q)
                    .fetch_optional(&self.read_pool)
                    .await
                    .map_err(db_error)?
                    .map(|r| r.try_get("created_at").map_err(db_error))
                    .transpose()
            }
        }
    };
}

reads_op!(PgPaymentStore, pg);
reads_op!(SqlitePaymentStore, sqlite);
