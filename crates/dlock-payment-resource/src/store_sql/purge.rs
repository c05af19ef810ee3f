//! Upkeep: the purge of expired idempotency records, their count, and the P1 cursor key.
//!
//! Holds the inherent fns `run_purge_idempotency` and `count_idempotency_records`, stamped
//! for both stores by `purge_op!`, and `run_cursor_secret` per store, which calls paydb's
//! statements of the key (`dlock_paydb::events::sql`, the rail-proxy's too).
//!
//! Invariants: the purge deletes at most `batch_max` expired records and never a live one
//! (the outer `expires_at` test is re-checked on a row another transaction just replaced);
//! the cursor key is written once ([`super::CURSOR_SECRET_NAME`], the first candidate wins)
//! and every replica reads the stored one.

use chrono::{DateTime, Utc};
use dlock_contract::time::truncate_ms;
use sqlx::Row;

use super::{PgPaymentStore, SqlitePaymentStore};
use crate::store::StoreError;
use dlock_paydb::sql::db_error;

/// Stamps the upkeep fns for a store (`$sql` its placeholder form).
macro_rules! purge_op {
    ($store:ty, $sql:path) => {
        impl $store {
            pub(super) async fn run_purge_idempotency(
                &self,
                now: DateTime<Utc>,
                batch_max: i64,
            ) -> Result<u64, StoreError> {
                if batch_max <= 0 {
                    return Ok(0);
                }
                // The outer `expires_at` test is re-checked on a row another transaction
                // just replaced, so a live record is never deleted.
                let q = $sql(
                    "DELETE FROM idempotency_records WHERE expires_at <= $1 \
                     AND (operation, target_id, idempotency_key, fencing_token) IN \
                     (SELECT operation, target_id, idempotency_key, fencing_token FROM idempotency_records \
                      WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2)",
                );
                sqlx::query(&q)
                    .bind(now)
                    .bind(batch_max)
                    .execute(&self.pool)
                    .await
                    .map(|r| r.rows_affected())
                    .map_err(db_error)
            }

            pub(super) async fn count_idempotency_records(&self) -> Result<u64, StoreError> {
                let n: i64 = sqlx::query("SELECT COUNT(*) AS n FROM idempotency_records")
                    .fetch_one(&self.read_pool)
                    .await
                    .and_then(|r| r.try_get("n"))
                    .map_err(db_error)?;
                u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("record count {n}")))
            }
        }
    };
}

purge_op!(PgPaymentStore, super::pg_sql);
purge_op!(SqlitePaymentStore, super::sqlite_sql);

impl PgPaymentStore {
    /// The P1 cursor key (`dlock_paydb::events::sql::pg_cursor_secret`, the rail-proxy's too).
    pub(super) async fn run_cursor_secret(
        &self,
        candidate: [u8; 32],
        at: DateTime<Utc>,
    ) -> Result<[u8; 32], StoreError> {
        dlock_paydb::events::sql::pg_cursor_secret(&self.pool, candidate, truncate_ms(at)).await
    }
}

impl SqlitePaymentStore {
    /// The P1 cursor key (`dlock_paydb::events::sql::sqlite_cursor_secret`), on the writer.
    pub(super) async fn run_cursor_secret(
        &self,
        candidate: [u8; 32],
        at: DateTime<Utc>,
    ) -> Result<[u8; 32], StoreError> {
        dlock_paydb::events::sql::sqlite_cursor_secret(&self.pool, candidate, truncate_ms(at)).await
    }
}
