//! Gate and fence: what every deciding transaction of the store opens and ends with.
//!
//! Holds statement 0 (the identity gate, [`GATE_SQL`], bound by `bind_gate!`), the recorded
//! answer ([`RECORD_SQL`]), the account fence of a claim or post (the strict fence on the
//! CUSTOMER account, chained to the gate in SQL) and why it refused, and the inherent fns
//! that open and end a transaction: `gate`, `gate_live`, `record`, `finish`, `begin`,
//! `commit_decided`, `refused_at_gate`, `account_fence_refused`, `batch_refused`, stamped for
//! both stores by `gate_and_fence!`; and, per dialect, `batch_gate_fence_then`: a claim's
//! or post's gate, fence and read.
//!
//! Invariants:
//! - the gate is the first statement of every deciding transaction; a request whose gate
//!   refuses it (a live record: a replay, or a conflict for another fingerprint) raises no
//!   fence (the fence is conditional on the gate's write: `AND EXISTS (SELECT 1 FROM gate)`
//!   on PostgreSQL, `AND changes() = 1` on SQLite; asserted) and its transaction rolls back;
//! - on PostgreSQL the read after the fence is a statement of its own, so its snapshot is
//!   taken after the fence's row lock (under READ COMMITTED a statement folded into the
//!   fence would read a snapshot from before the wait: overspend);
//! - a refusal rolls back, identity row included; an outcome that commits is committed only
//!   with its answer recorded in the identity row (written exactly once).

use chrono::{DateTime, Utc};
use dlock_contract::time::truncate_ms;
use sqlx::Row;

use super::claim::{PG_CLAIM_BATCH_READ_SQL, SQLITE_CLAIM_BATCH_READ_SQL};
use super::post::{PG_POST_BATCH_READ_SQL, POST_ONE_READ_SQL, SQLITE_POST_BATCH_READ_SQL};
use super::{json_text, Commits, Gate, PgPaymentStore, SqlitePaymentStore};
use crate::rules::{self, FenceVerdict};
use crate::store::{
    BatchOutcome, ClaimBatchPayout, Decided, IdemRequest, Idempotent, PostBatchPayout, StoreError, StoredResponse,
};
use dlock_paydb::sql::{commit_error, db_error};

/// Statement 0 of every deciding transaction: the upsert of the identity row, which
/// replaces only an expired record (a row back: run the request). Eight placeholders, once
/// each, in order (`bind_gate!`).
pub(super) const GATE_SQL: &str =
    "INSERT INTO idempotency_records (operation, target_id, idempotency_key, fencing_token, \
     request_sha256, owner_id, response_status, response_body, created_at, expires_at) \
     VALUES ($1, $2, $3, $4, $5, $6, NULL, NULL, $7, $8) \
     ON CONFLICT (operation, target_id, idempotency_key, fencing_token) DO UPDATE \
     SET request_sha256 = EXCLUDED.request_sha256, owner_id = EXCLUDED.owner_id, \
     response_status = NULL, response_body = NULL, created_at = EXCLUDED.created_at, \
     expires_at = EXCLUDED.expires_at \
     WHERE idempotency_records.expires_at <= EXCLUDED.created_at \
     RETURNING operation";

/// PostgreSQL: what a gate-and-fence statement answers: one row, whether the gate wrote
/// (`gated`, 0 or 1) and the raised fence's account and balance (NULL when it did not rise).
pub(super) const PG_GATE_FENCE_SELECT: &str = "SELECT (SELECT COUNT(*) FROM gate) AS gated, \
     (SELECT account_id FROM fence) AS account_id, (SELECT balance_minor FROM fence) AS balance_minor";

/// Binds [`GATE_SQL`]'s values for the identity `$i`, in order.
macro_rules! bind_gate {
    ($query:expr, $i:expr) => {
        $query
            .bind($i.operation.as_str())
            .bind($i.target_id.clone())
            .bind($i.key.clone())
            .bind($i.token)
            .bind($i.fingerprint.clone())
            .bind($i.owner_id.clone())
            .bind(truncate_ms($i.at))
            .bind(truncate_ms($i.expires_at))
    };
}

/// The recorded answer in the identity row: `$1` status, `$2` body, then the identity
/// (`$3` operation, `$4` target, `$5` key, `$6` token).
pub(super) const RECORD_SQL: &str = "UPDATE idempotency_records SET response_status = $1, response_body = $2 \
     WHERE operation = $3 AND target_id = $4 AND idempotency_key = $5 AND fencing_token = $6";

/// A batch's fence: the strict fence on the CUSTOMER account itself (C3 §3.4 verbatim),
/// with `$extra` conditions after its own. `$1` the token, `$2` the instant, `$3` the
/// account, `$4` the token's bound ([`rules::fence_sql_bound`]: the token again, so the
/// statement passes what `rules::fence_check` passes).
macro_rules! account_fence_sql {
    ($extra:literal) => {
        concat!(
            "UPDATE accounts SET fence = $1, updated_at = $2 \
             WHERE account_id = $3 AND kind = 'CUSTOMER' AND fence < $4",
            $extra,
            " RETURNING account_id, balance_minor"
        )
    };
}

/// SQLite: a batch's fence in one batch after its identity row's upsert, raised only when
/// the upsert wrote (`changes()` counts the statement before it: the gate's upsert).
pub(super) const ACCOUNT_FENCE_AFTER_GATE_SQL: &str = account_fence_sql!(" AND changes() = 1");

/// PostgreSQL: a batch's fence as the CTE after its gate's, raised only when the gate wrote.
pub(super) const PG_ACCOUNT_FENCE_AFTER_GATE_SQL: &str = account_fence_sql!(" AND EXISTS (SELECT 1 FROM gate)");

/// PostgreSQL: a batch's statement 0 and its fence as one statement (the fence chained to
/// the gate in SQL), answered as [`PG_GATE_FENCE_SELECT`].
pub(super) fn pg_batch_gate_fence_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        dlock_db::pg_cte_sql(
            &[("gate", GATE_SQL, 8), ("fence", PG_ACCOUNT_FENCE_AFTER_GATE_SQL, 4)],
            PG_GATE_FENCE_SELECT,
        )
    })
}

/// Why a batch's fence refused: the CUSTOMER account's fence (no row: no such account).
pub(super) const ACCOUNT_FENCE_REFUSED_SQL: &str =
    "SELECT fence FROM accounts WHERE account_id = $1 AND kind = 'CUSTOMER'";

/// What a batch's first statements found: the account's balance when its fence rose, and
/// the rows of the batch's read (none when the fence refused).
pub(super) type BatchFenceThen<R> = (Option<i64>, Vec<R>);

/// What a batch reads after its fence, per dialect's binds.
pub(super) enum BatchRead<'a> {
    /// The payouts a claim names, and the account's reservation.
    Claim { account_id: &'a str, payouts: &'a [ClaimBatchPayout] },
    /// The payouts a post names, with the attempt each names.
    Post { payouts: &'a [PostBatchPayout] },
}

/// Stamps the gate-and-fence inherent fns for a store: `$db` its database, `$sql` its
/// placeholder form ([`super::pg_sql`], [`super::sqlite_sql`]).
macro_rules! gate_and_fence {
    ($store:ty, $db:ty, $sql:path) => {
        impl $store {
            /// Statement 0: the upsert of the identity row, which replaces only an expired
            /// record. No row back means a live record: read it and judge the fingerprint.
            pub(super) async fn gate(
                tx: &mut sqlx::Transaction<'static, $db>,
                i: &IdemRequest,
            ) -> Result<Gate, StoreError> {
                let q = $sql(GATE_SQL);
                let fresh = bind_gate!(sqlx::query(&q), i).fetch_optional(&mut **tx).await.map_err(db_error)?;
                if fresh.is_some() {
                    return Ok(Gate::Execute);
                }
                Self::gate_live(tx, i).await
            }

            /// After an upsert that wrote nothing: the live record, judged by its fingerprint
            /// (a replay of its answer, or a conflict).
            pub(super) async fn gate_live(
                tx: &mut sqlx::Transaction<'static, $db>,
                i: &IdemRequest,
            ) -> Result<Gate, StoreError> {
                let q = $sql(
                    "SELECT request_sha256, response_status, response_body FROM idempotency_records \
                     WHERE operation = $1 AND target_id = $2 AND idempotency_key = $3 AND fencing_token = $4",
                );
                let live = sqlx::query(&q)
                    .bind(i.operation.as_str())
                    .bind(i.target_id.clone())
                    .bind(i.key.clone())
                    .bind(i.token)
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(db_error)?;
                let Some(live) = live else {
                    // Purged between the two statements (a replica with a later clock).
                    return Err(StoreError::Unavailable("idempotency record vanished while being read".into()));
                };
                if get!(live, "request_sha256", String) != i.fingerprint {
                    return Ok(Gate::Conflict);
                }
                match (get!(live, "response_status", Option<i32>), get!(live, "response_body", Option<Vec<u8>>)) {
                    (Some(status), Some(body)) => {
                        let status = u16::try_from(status)
                            .map_err(|_| StoreError::Corrupt(format!("recorded status {status} is not a status")))?;
                        Ok(Gate::Replay(StoredResponse { status, body }))
                    }
                    _ => Err(StoreError::Corrupt("a committed idempotency record lacks its response".into())),
                }
            }

            /// Writes `response` into the identity row of `i`; how many rows it wrote.
            pub(super) async fn record(
                tx: &mut sqlx::Transaction<'static, $db>,
                i: &IdemRequest,
                response: &StoredResponse,
            ) -> Result<u64, StoreError> {
                let q = $sql(RECORD_SQL);
                Ok(sqlx::query(&q)
                    .bind(i32::from(response.status))
                    .bind(response.body.clone())
                    .bind(i.operation.as_str())
                    .bind(i.target_id.clone())
                    .bind(i.key.clone())
                    .bind(i.token)
                    .execute(&mut **tx)
                    .await
                    .map_err(db_error)?
                    .rows_affected())
            }

            /// Ends a deciding transaction: a refusal rolls back (identity row included); an
            /// outcome that commits is rendered, recorded in the identity row and committed.
            pub(super) async fn finish<T: Commits + Send + Sync>(
                mut tx: sqlx::Transaction<'static, $db>,
                i: &IdemRequest,
                outcome: T,
                render: impl FnOnce(&T) -> StoredResponse + Send,
            ) -> Decided<T> {
                if !outcome.commits() {
                    tx.rollback().await.map_err(db_error)?;
                    return Ok(Idempotent::Executed { outcome, stored: None });
                }
                let response = render(&outcome);
                let written = Self::record(&mut tx, i, &response).await?;
                if written != 1 {
                    return Err(StoreError::Corrupt(format!("identity row written {written} times, not once")));
                }
                tx.commit().await.map_err(commit_error)?;
                Ok(Idempotent::Executed { outcome, stored: Some(response) })
            }

            /// Why a batch's fence refused (its UPDATE wrote nothing): `None` when there is no
            /// such CUSTOMER account, else its stored fence, read now.
            pub(super) async fn account_fence_refused(
                tx: &mut sqlx::Transaction<'static, $db>,
                account_id: &str,
                token: i64,
            ) -> Result<Option<i64>, StoreError> {
                let q = $sql(ACCOUNT_FENCE_REFUSED_SQL);
                let held =
                    sqlx::query(&q).bind(account_id.to_owned()).fetch_optional(&mut **tx).await.map_err(db_error)?;
                let Some(r) = held else { return Ok(None) };
                match rules::fence_check(get!(r, "fence"), token) {
                    FenceVerdict::Fenced { highest_token } => Ok(Some(highest_token)),
                    // Fences only rise: the account appeared between the two statements.
                    FenceVerdict::Passes => Err(StoreError::Unavailable(format!(
                        "account {account_id} appeared while its fence was checked; nothing was written"
                    ))),
                }
            }

            /// A batch whose fence did not rise: fenced (the stored fence that refused it) or
            /// no such CUSTOMER account; nothing to record, the caller rolls back.
            pub(super) async fn batch_refused<T>(
                tx: &mut sqlx::Transaction<'static, $db>,
                account_id: &str,
                token: i64,
            ) -> Result<(BatchOutcome<T>, Option<StoredResponse>), StoreError> {
                let outcome = match Self::account_fence_refused(tx, account_id, token).await? {
                    None => BatchOutcome::AccountNotFound,
                    Some(highest_token) => BatchOutcome::Fenced { highest_token },
                };
                Ok((outcome, None))
            }

            /// The batch claim inside its transaction, after its gate and fence (`fenced`:
            /// the account's balance when the fence rose, and the batch's read). Each payout
            /// of the account is decided by the claim rule in order on what the ones before
            /// it left ([`rules::decide_claim_batch`]); every transition and the recorded

            /// Ends a claim's or post's transaction: an outcome with its recorded answer
            /// commits; a refusal (no answer recorded) rolls back, identity row included.
            pub(super) async fn commit_decided<T: Commits + Send + Sync>(
                tx: sqlx::Transaction<'static, $db>,
                (outcome, response): (T, Option<StoredResponse>),
            ) -> Decided<T> {
                match response {
                    Some(response) => {
                        tx.commit().await.map_err(commit_error)?;
                        Ok(Idempotent::Executed { outcome, stored: Some(response) })
                    }
                    None => {
                        if outcome.commits() {
                            return Err(StoreError::Corrupt("a committing outcome without its recorded answer".into()));
                        }
                        tx.rollback().await.map_err(db_error)?;
                        Ok(Idempotent::Executed { outcome, stored: None })
                    }
                }
            }

            /// Ends a transaction whose identity gate refused the request (a replay or a
            /// conflict): rolls back whatever ran with the gate, answers the gate's answer.
            pub(super) async fn refused_at_gate<T>(tx: sqlx::Transaction<'static, $db>, refused: Gate) -> Decided<T> {
                tx.rollback().await.map_err(db_error)?;
                refused.answer().ok_or_else(|| StoreError::Corrupt("the gate refused a request it runs".into()))
            }

            /// Begins a deciding transaction and runs statement 0: `Err(answer)` when the
            /// request must not run (a replay or a conflict; already rolled back).
            pub(super) async fn begin<T>(
                &self,
                i: &IdemRequest,
            ) -> Result<Result<sqlx::Transaction<'static, $db>, Idempotent<T>>, StoreError> {
                let mut tx = self.pool.begin().await.map_err(db_error)?;
                match Self::gate(&mut tx, i).await?.answer() {
                    None => Ok(Ok(tx)),
                    Some(answer) => {
                        tx.rollback().await.map_err(db_error)?;
                        Ok(Err(answer))
                    }
                }
            }
        }
    };
}

gate_and_fence!(PgPaymentStore, sqlx::Postgres, super::pg_sql);
gate_and_fence!(SqlitePaymentStore, sqlx::Sqlite, super::sqlite_sql);

/// PostgreSQL: the gate and the fence are one statement ([`dlock_db::pg_cte_sql`]), the
/// read after it one more.
impl PgPaymentStore {
    /// A batch's statement 0 and its fence (the account's own) as one statement, then, when
    /// the fence rose, the batch's read as its own statement (its snapshot taken after the
    /// fence's row lock: it sees every claim committed before). `Err(gate)`: the batch does not run.
    pub(super) async fn batch_gate_fence_then(
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        i: &IdemRequest,
        account_id: &str,
        token: i64,
        at: DateTime<Utc>,
        read: BatchRead<'_>,
    ) -> Result<Result<BatchFenceThen<sqlx::postgres::PgRow>, Gate>, StoreError> {
        let query = bind_gate!(sqlx::query(pg_batch_gate_fence_sql()), i)
            .bind(token)
            .bind(at)
            .bind(account_id.to_owned())
            .bind(rules::fence_sql_bound(token));
        let r = query.fetch_one(&mut **tx).await.map_err(db_error)?;
        let (gated, account): (i64, Option<String>) = (get!(r, "gated"), get!(r, "account_id", Option<String>));
        if gated == 0 {
            assert!(account.is_none(), "a batch's fence rose for a request its identity gate refused");
            return Self::gate_live(tx, i).await.map(Err);
        }
        if account.is_none() {
            return Ok(Ok((None, Vec::new())));
        }
        let Some(balance) = get!(r, "balance_minor", Option<i64>) else {
            return Err(StoreError::Corrupt(format!("accounts: the fenced account {account_id} has no balance")));
        };
        let rows = match read {
            BatchRead::Claim { account_id, payouts } => {
                let ids: Vec<String> = payouts.iter().map(|p| p.payout_id.to_string()).collect();
                sqlx::query(PG_CLAIM_BATCH_READ_SQL).bind(account_id.to_owned()).bind(ids).fetch_all(&mut **tx).await
            }
            BatchRead::Post { payouts: [p] } => {
                sqlx::query(POST_ONE_READ_SQL)
                    .bind(p.payout_id.to_string())
                    .bind(p.submission_id.to_string())
                    .bind(p.rail_reference.clone())
                    .fetch_all(&mut **tx)
                    .await
            }
            BatchRead::Post { payouts } => {
                let ids: Vec<String> = payouts.iter().map(|p| p.payout_id.to_string()).collect();
                let submissions: Vec<String> = payouts.iter().map(|p| p.submission_id.to_string()).collect();
                let references: Vec<String> = payouts.iter().map(|p| p.rail_reference.clone()).collect();
                sqlx::query(PG_POST_BATCH_READ_SQL)
                    .bind(ids)
                    .bind(submissions)
                    .bind(references)
                    .fetch_all(&mut **tx)
                    .await
            }
        }
        .map_err(db_error)?;
        Ok(Ok((Some(balance), rows)))
    }
}

/// SQLite: the gate, the fence and the read go as one batch, one call to the connection's
/// worker thread (`dlock_db::sqlite_batch`).
impl SqlitePaymentStore {
    /// A batch's statement 0, its fence (the account's own, chained to the gate with
    /// `changes()`) and its read, in one batch. `Err(gate)`:
    /// the batch does not run.
    pub(super) async fn batch_gate_fence_then(
        tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        i: &IdemRequest,
        account_id: &str,
        token: i64,
        at: DateTime<Utc>,
        read: BatchRead<'_>,
    ) -> Result<Result<BatchFenceThen<sqlx::sqlite::SqliteRow>, Gate>, StoreError> {
        static CLAIM: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        static POST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        static POST_ONE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let batch = |read_sql: &str, binds: usize| {
            dlock_db::sqlite_batch_sql(&[(GATE_SQL, 8), (ACCOUNT_FENCE_AFTER_GATE_SQL, 4), (read_sql, binds)])
        };
        let q = match read {
            BatchRead::Claim { .. } => CLAIM.get_or_init(|| batch(SQLITE_CLAIM_BATCH_READ_SQL, 2)),
            BatchRead::Post { payouts: [_] } => POST_ONE.get_or_init(|| batch(POST_ONE_READ_SQL, 3)),
            BatchRead::Post { .. } => POST.get_or_init(|| batch(SQLITE_POST_BATCH_READ_SQL, 1)),
        };
        let query = bind_gate!(sqlx::query(q), i)
            .bind(token)
            .bind(at)
            .bind(account_id.to_owned())
            .bind(rules::fence_sql_bound(token));
        let query = match read {
            BatchRead::Claim { account_id, payouts } => {
                let ids: Vec<String> = payouts.iter().map(|p| p.payout_id.to_string()).collect();
                query.bind(account_id.to_owned()).bind(json_text(&ids)?)
            }
            BatchRead::Post { payouts: [p] } => {
                query.bind(p.payout_id.to_string()).bind(p.submission_id.to_string()).bind(p.rail_reference.clone())
            }
            BatchRead::Post { payouts } => {
                let named: Vec<(String, String, &str)> = payouts
                    .iter()
                    .map(|p| (p.payout_id.to_string(), p.submission_id.to_string(), p.rail_reference.as_str()))
                    .collect();
                query.bind(json_text(&named)?)
            }
        };
        let mut parts = dlock_db::sqlite_batch(tx, query, 3).await.map_err(db_error)?.into_iter();
        let (gate, fence, rows) =
            (parts.next().unwrap_or_default(), parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
        if gate.rows.is_empty() {
            assert!(fence.rows.is_empty(), "a batch's fence rose for a request its identity gate refused");
            return Self::gate_live(tx, i).await.map(Err);
        }
        let Some(r) = fence.rows.into_iter().next() else { return Ok(Ok((None, Vec::new()))) };
        Ok(Ok((Some(get!(r, "balance_minor")), rows.rows)))
    }
}
