//! paydb's SQL, shared by every store that serves it (PostgreSQL and SQLite, through sqlx).
//!
//! - [`PG_MIGRATOR`] and [`SQLITE_MIGRATOR`]: paydb's migrations (`migrations/paydb`),
//!   embedded once; the payment-resource and the rail-proxy both run them.
//! - The error mapping every paydb store uses ([`db_error`], [`commit_error`]): connection
//!   failures, timeouts and busy answers are [`StoreError::Unavailable`] (nothing was
//!   decided); a commit whose answer was lost is [`StoreError::CommitUnknown`]; a constraint
//!   or trigger refusing a statement the store issued, or content the store cannot read, is
//!   [`StoreError::Corrupt`].
//! - [`pg`] and [`sqlite`]: the statements more than one store runs (the reads the
//!   payment-resource, the proxy and the reconciler share, the ledger-writing helpers, and
//!   the operator's resolution). The SQL is written once, with `$n` placeholders; SQLite
//!   gets `?n`, its numbered form, and [`paydb_sql!`] stamps the one body out per backend.
//!
//! Invariant: every statement here reads or writes exactly the rows the services' earlier
//! statements did (issue 14 folded some of them: P4's payout and submissions are one joined
//! read, a posting's two entries are one multi-row INSERT); each service's conformance
//! suite proves the stores over them.

use dlock_contract::payout::PayoutState;
use dlock_contract::rail::SubmissionOutcome;
use uuid::Uuid;

use crate::pay::{AccountKind, Direction};
use crate::StoreError;

/// paydb's migrations (`migrations/paydb/postgres`), embedded once.
pub static PG_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/paydb/postgres");
/// paydb's migrations for SQLite (`migrations/paydb/sqlite`).
pub static SQLITE_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/paydb/sqlite");

/// The SQL list of unsettled states (tests hold it to [`crate::pay::is_unsettled`]).
pub const UNSETTLED_SQL: &str = crate::unsettled_sql!();

/// The upsert of one system account (no balance, no fence): `$1` id, `$2` kind, `$3`
/// currency, `$4`/`$5` the instant (each placeholder once, in order: a batch statement,
/// `dlock_db::sqlite_batch_sql`).
pub const SYSTEM_ACCOUNT_UPSERT_SQL: &str = "INSERT INTO accounts (account_id, kind, currency, balance_minor, fence, \
     created_at, updated_at) VALUES ($1, $2, $3, 0, 0, $4, $5) ON CONFLICT (account_id) DO NOTHING";

/// Binds per ledger entry in [`ledger_insert_sql`].
pub const LEDGER_ENTRY_BINDS: usize = 9;

/// One multi-row INSERT of `n` ledger entries, [`LEDGER_ENTRY_BINDS`] placeholders each, in
/// order ([`bind_ledger_entries!`] binds them).
pub fn ledger_insert_sql(n: usize) -> String {
    let rows: Vec<String> = (0..n)
        .map(|k| {
            let b = k * LEDGER_ENTRY_BINDS;
            let cols: Vec<String> = (1..=LEDGER_ENTRY_BINDS).map(|c| format!("${}", b + c)).collect();
            format!("({})", cols.join(", "))
        })
        .collect();
    format!(
        "INSERT INTO ledger_entries (entry_id, posting_id, payout_id, account_id, direction, amount_minor, \
         currency, fence, created_at) VALUES {}",
        rows.join(", ")
    )
}

/// Binds `entries` to a query of [`ledger_insert_sql`], in its order.
#[macro_export]
macro_rules! bind_ledger_entries {
    ($query:expr, $entries:expr) => {{
        let mut query = $query;
        for e in $entries {
            query = query
                .bind(e.entry_id.to_string())
                .bind(e.posting_id.to_string())
                .bind(e.payout_id.map(|p| p.to_string()))
                .bind(e.account_id.clone())
                .bind(e.direction.as_str())
                .bind(e.amount_minor)
                .bind(e.currency.clone())
                .bind(e.fence)
                .bind(e.created_at);
        }
        query
    }};
}

/// Σ CREDIT − Σ DEBIT of one account's entries (`a` is the `accounts` row).
macro_rules! ledger_sum {
    () => {
        "(SELECT CAST(COALESCE(SUM(CASE WHEN e.direction = 'CREDIT' THEN e.amount_minor ELSE -e.amount_minor END), 0) \
         AS BIGINT) FROM ledger_entries e WHERE e.account_id = a.account_id)"
    };
}

/// Σ amount of one account's unsettled payouts (`a` is the `accounts` row).
macro_rules! reserved {
    () => {
        concat!(
            "(SELECT CAST(COALESCE(SUM(p.amount_minor), 0) AS BIGINT) FROM payouts p \
             WHERE p.account_id = a.account_id AND p.state IN ",
            crate::unsettled_sql!(),
            ")"
        )
    };
}

/// An account row with its recomputed ledger sum and reservation (`FROM accounts a`).
pub const ACCOUNT_COLUMNS: &str = concat!(
    "a.account_id, a.kind, a.currency, a.balance_minor, a.fence, a.created_at, a.updated_at, ",
    ledger_sum!(),
    " AS ledger_sum_minor, ",
    reserved!(),
    " AS reserved_minor"
);

/// Every `payouts` column.
pub const PAYOUT_COLUMNS: &str =
    "payout_id, account_id, amount_minor, currency, beneficiary_ref, state, attempt_count, \
                                  claim_token, claimed_by, claimed_at, created_at, updated_at";

/// Every `payouts` column, qualified by the alias `p` (for reads that join).
pub const PAYOUT_COLUMNS_P: &str =
    "p.payout_id, p.account_id, p.amount_minor, p.currency, p.beneficiary_ref, p.state, p.attempt_count, \
     p.claim_token, p.claimed_by, p.claimed_at, p.created_at, p.updated_at";

/// Every `ledger_entries` column.
pub const LEDGER_COLUMNS: &str =
    "entry_id, posting_id, payout_id, account_id, direction, amount_minor, currency, fence, created_at";

/// Every `payout_resolutions` column.
pub const RESOLUTION_COLUMNS: &str =
    "resolution_id, payout_id, resolved_as, operator, reason, rail_reference, resolved_at";

/// Whether the database refused a statement on a constraint or a guard trigger: the store
/// issued a write its own checks should have ruled out.
pub fn is_refusal(db: &(dyn sqlx::error::DatabaseError + 'static)) -> bool {
    if !matches!(db.kind(), sqlx::error::ErrorKind::Other) {
        return true;
    }
    let code = db.code().unwrap_or_default();
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // SQLITE_CONSTRAINT (19) and its extended codes, RAISE(ABORT) in a trigger included.
        code.parse::<i32>().is_ok_and(|c| c & 0xff == 19)
    } else {
        // Class 23 (integrity constraint violation); P0001 is a RAISE without an errcode.
        code.starts_with("23") || code == "P0001"
    }
}

/// A failed statement: content the store cannot read, or a refusal of a write it issued, is
/// [`StoreError::Corrupt`]; anything else (no connection, a timeout, a busy answer) is
/// [`StoreError::Unavailable`]: nothing was decided.
pub fn db_error(e: sqlx::Error) -> StoreError {
    let text = dlock_db::describe(&e);
    let corrupt = dlock_db::is_decode_error(&e)
        || matches!(
            &e,
            sqlx::Error::RowNotFound | sqlx::Error::ColumnIndexOutOfBounds { .. } | sqlx::Error::TypeNotFound { .. }
        )
        || matches!(&e, sqlx::Error::Database(db) if is_refusal(db.as_ref()));
    if corrupt {
        StoreError::Corrupt(text)
    } else {
        StoreError::Unavailable(text)
    }
}

/// A failed COMMIT: an I/O failure means the answer was lost, not that nothing happened.
pub fn commit_error(e: sqlx::Error) -> StoreError {
    if dlock_db::is_commit_answer_lost(&e) {
        StoreError::CommitUnknown(dlock_db::describe(&e))
    } else {
        db_error(e)
    }
}

pub fn parse_uuid(raw: &str) -> Result<Uuid, StoreError> {
    Uuid::parse_str(raw).map_err(|e| StoreError::Corrupt(format!("bad uuid {raw:?}: {e}")))
}

pub fn parse_state(raw: &str) -> Result<PayoutState, StoreError> {
    PayoutState::parse(raw).ok_or_else(|| StoreError::Corrupt(format!("bad payout state {raw:?}")))
}

pub fn parse_kind(raw: &str) -> Result<AccountKind, StoreError> {
    AccountKind::parse(raw).ok_or_else(|| StoreError::Corrupt(format!("bad account kind {raw:?}")))
}

pub fn parse_direction(raw: &str) -> Result<Direction, StoreError> {
    Direction::parse(raw).ok_or_else(|| StoreError::Corrupt(format!("bad ledger direction {raw:?}")))
}

pub fn parse_outcome(raw: Option<String>) -> Result<Option<SubmissionOutcome>, StoreError> {
    raw.map(|r| SubmissionOutcome::parse(&r).ok_or_else(|| StoreError::Corrupt(format!("bad outcome {r:?}"))))
        .transpose()
}

/// `r.try_get(col)`, as a store error.
macro_rules! get {
    ($row:expr, $col:literal) => {
        $row.try_get($col).map_err(db_error)?
    };
    ($row:expr, $col:literal, $ty:ty) => {
        $row.try_get::<$ty, _>($col).map_err(db_error)?
    };
}

/// Stamps the shared statements out for one backend: a module `$m` over pool type `$db`
/// whose statements are spelt by `$dialect`.
macro_rules! paydb_sql {
    ($(#[$doc:meta])* $m:ident, $db:ty, $dialect:expr) => {
        $(#[$doc])*
        pub mod $m {
            use chrono::{DateTime, Utc};
            use dlock_contract::payout::{self, Actor, PayoutState};
            use dlock_contract::time::truncate_ms;
            use sqlx::Row;
            use uuid::Uuid;

            use super::*;
            use crate::pay::{
                settlement_account, AccountView, AmbiguousResolution, LedgerEntry, ListQuery, PayoutSummary,
                PayoutView, ResolutionRow, ResolveOutcome, SubmissionSummary,
            };
            use crate::rail::SubmissionRow;

            /// A statement in this backend's placeholder spelling.
            pub fn sql(sql: &str) -> std::borrow::Cow<'_, str> {
                $dialect.sql(sql)
            }

            pub async fn state_of(tx: &mut sqlx::Transaction<'static, $db>, payout_id: &str) -> Result<PayoutState, StoreError> {
                let q = sql("SELECT state FROM payouts WHERE payout_id = $1");
                let state: String = sqlx::query(&q)
                    .bind(payout_id.to_owned())
                    .fetch_one(&mut **tx)
                    .await
                    .and_then(|r| r.try_get("state"))
                    .map_err(db_error)?;
                parse_state(&state)
            }

            pub async fn insert_entry(tx: &mut sqlx::Transaction<'static, $db>, e: &LedgerEntry) -> Result<(), StoreError> {
                insert_entries(tx, std::slice::from_ref(e)).await
            }

            /// Inserts `entries` (a posting's balanced pair) in one multi-row INSERT: one statement
            /// instead of one per entry. The rows and their checks are [`insert_entry`]'s.
            pub async fn insert_entries(tx: &mut sqlx::Transaction<'static, $db>, entries: &[LedgerEntry]) -> Result<(), StoreError> {
                if entries.is_empty() {
                    return Ok(());
                }
                let q = sql(&ledger_insert_sql(entries.len())).into_owned();
                let query = $crate::bind_ledger_entries!(sqlx::query(&q), entries);
                let written = query.execute(&mut **tx).await.map_err(db_error)?.rows_affected();
                if written != entries.len() as u64 {
                    return Err(StoreError::Corrupt(format!("ledger: {written} entries written, not {}", entries.len())));
                }
                Ok(())
            }

            /// Upserts the system accounts of `currency` (no balance, no fence).
            pub async fn upsert_system_accounts(
                tx: &mut sqlx::Transaction<'static, $db>,
                accounts: &[(String, AccountKind)],
                currency: &str,
                at: DateTime<Utc>,
            ) -> Result<(), StoreError> {
                let q = sql(SYSTEM_ACCOUNT_UPSERT_SQL);
                for (account_id, kind) in accounts {
                    sqlx::query(&q)
                        .bind(account_id.clone())
                        .bind(kind.as_str())
                        .bind(currency.to_owned())
                        .bind(at)
                        .bind(at)
                        .execute(&mut **tx)
                        .await
                        .map_err(db_error)?;
                }
                Ok(())
            }

            /// `dlock resolve`, inside its transaction. Statement 1 is a write on the
            /// payout's account row (no column changes): it takes SQLite's write lock at once
            /// and, on PostgreSQL, the row lock every claim and post takes first, so the
            /// reservation reads of a concurrent claim stay safe (design §3).
            pub async fn resolve_in(
                tx: &mut sqlx::Transaction<'static, $db>,
                r: &AmbiguousResolution,
            ) -> Result<ResolveOutcome, StoreError> {
                let at = truncate_ms(r.at);
                let payout_id = r.payout_id.to_string();
                // 1. Lock the account (the fence is not touched: an operator holds no token).
                let q = sql(
                    "UPDATE accounts SET balance_minor = balance_minor \
                     WHERE account_id = (SELECT account_id FROM payouts WHERE payout_id = $1) \
                     RETURNING account_id, balance_minor",
                );
                let locked = sqlx::query(&q)
                    .bind(payout_id.clone())
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(db_error)?;
                let Some(locked) = locked else {
                    return Ok(ResolveOutcome::NotFound);
                };
                let balance_minor: i64 = get!(locked, "balance_minor");
                // 2. RAIL_AMBIGUOUS -> POSTED | FAILED, conditionally.
                // The source states C2 allows an operator's verdict from (RAIL_AMBIGUOUS).
                let from = payout::sql_states(&payout::sources(r.resolved_as, Actor::Operator));
                let q = sql(&format!(
                    "UPDATE payouts SET state = $2, updated_at = $3 WHERE payout_id = $1 AND state IN {from} \
                     RETURNING account_id, amount_minor, currency",
                ))
                .into_owned();
                let moved = sqlx::query(&q)
                    .bind(payout_id.clone())
                    .bind(r.resolved_as.as_str())
                    .bind(at)
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(db_error)?;
                let Some(moved) = moved else {
                    return Ok(ResolveOutcome::NotAmbiguous { state: state_of(tx, &payout_id).await? });
                };
                // 3. POSTED: the payout's two balanced entries (fence 0) and the debit.
                let balance_minor = if r.resolved_as == PayoutState::Posted {
                    let account_id: String = get!(moved, "account_id");
                    let amount: i64 = get!(moved, "amount_minor");
                    let currency: String = get!(moved, "currency");
                    let settlement = settlement_account(&currency);
                    upsert_system_accounts(tx, &[(settlement, AccountKind::Settlement)], &currency, at).await?;
                    insert_entries(tx, &r.entries(&account_id, amount, &currency, at)).await?;
                    let expected = crate::ledger::balance_after_debit(balance_minor, amount)
                        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                    let q = sql(
                        "UPDATE accounts SET balance_minor = balance_minor - $2, updated_at = $3 \
                         WHERE account_id = $1 RETURNING balance_minor",
                    );
                    sqlx::query(&q)
                        .bind(account_id)
                        .bind(amount)
                        .bind(at)
                        .fetch_one(&mut **tx)
                        .await
                        .and_then(|row| row.try_get::<i64, _>("balance_minor"))
                        .map_err(db_error)
                        .and_then(|after| {
                            // The account row is locked by step 1: nothing else moved it.
                            (after == expected).then_some(after).ok_or_else(|| {
                                StoreError::Corrupt(format!("accounts: balance {after} after the resolution, the rule says {expected}"))
                            })
                        })?
                } else {
                    balance_minor
                };
                // 4. The audit row.
                let q = sql(
                    "INSERT INTO payout_resolutions (resolution_id, payout_id, resolved_as, operator, reason, \
                     rail_reference, resolved_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                );
                sqlx::query(&q)
                    .bind(r.resolution_id.to_string())
                    .bind(payout_id)
                    .bind(r.resolved_as.as_str())
                    .bind(r.operator.clone())
                    .bind(r.reason.clone())
                    .bind(r.rail_reference.clone())
                    .bind(at)
                    .execute(&mut **tx)
                    .await
                    .map_err(db_error)?;
                Ok(ResolveOutcome::Resolved { state: r.resolved_as, balance_minor })
            }

            pub fn resolution_row(r: &<$db as sqlx::Database>::Row) -> Result<ResolutionRow, StoreError> {
                Ok(ResolutionRow {
                    resolution_id: parse_uuid(&get!(r, "resolution_id", String))?,
                    payout_id: parse_uuid(&get!(r, "payout_id", String))?,
                    resolved_as: parse_state(&get!(r, "resolved_as", String))?,
                    operator: get!(r, "operator"),
                    reason: get!(r, "reason"),
                    rail_reference: get!(r, "rail_reference"),
                    resolved_at: get!(r, "resolved_at"),
                })
            }

            pub fn account_view(r: &<$db as sqlx::Database>::Row) -> Result<AccountView, StoreError> {
                Ok(AccountView {
                    account_id: get!(r, "account_id"),
                    kind: parse_kind(&get!(r, "kind", String))?,
                    currency: get!(r, "currency"),
                    balance_minor: get!(r, "balance_minor"),
                    fence: get!(r, "fence"),
                    ledger_sum_minor: get!(r, "ledger_sum_minor"),
                    reserved_minor: get!(r, "reserved_minor"),
                    created_at: get!(r, "created_at"),
                    updated_at: get!(r, "updated_at"),
                })
            }

            pub fn ledger_entry(r: &<$db as sqlx::Database>::Row) -> Result<LedgerEntry, StoreError> {
                Ok(LedgerEntry {
                    entry_id: parse_uuid(&get!(r, "entry_id", String))?,
                    posting_id: parse_uuid(&get!(r, "posting_id", String))?,
                    payout_id: get!(r, "payout_id", Option<String>).as_deref().map(parse_uuid).transpose()?,
                    account_id: get!(r, "account_id"),
                    direction: parse_direction(&get!(r, "direction", String))?,
                    amount_minor: get!(r, "amount_minor"),
                    currency: get!(r, "currency"),
                    fence: get!(r, "fence"),
                    created_at: get!(r, "created_at"),
                })
            }

            pub async fn resolve_ambiguous(pool: &sqlx::Pool<$db>, r: &AmbiguousResolution) -> Result<ResolveOutcome, StoreError> {
                r.check()?;
                let mut tx = pool.begin().await.map_err(db_error)?;
                let outcome = resolve_in(&mut tx, r).await?;
                if matches!(outcome, ResolveOutcome::Resolved { .. }) {
                    tx.commit().await.map_err(commit_error)?;
                } else {
                    tx.rollback().await.map_err(db_error)?;
                }
                Ok(outcome)
            }

            pub async fn resolutions(pool: &sqlx::Pool<$db>, payout_id: Option<Uuid>) -> Result<Vec<ResolutionRow>, StoreError> {
                let q = format!(
                    "SELECT {RESOLUTION_COLUMNS} FROM payout_resolutions WHERE ($1 IS NULL OR payout_id = $1) \
                     ORDER BY resolved_at, resolution_id"
                );
                let q = sql(&q);
                let rows = sqlx::query(&q)
                    .bind(payout_id.map(|p| p.to_string()))
                    .fetch_all(pool)
                    .await
                    .map_err(db_error)?;
                rows.iter().map(resolution_row).collect()
            }

            /// P4: the payout and its rail submissions in one statement (the payout LEFT JOIN its
            /// `rail_submission` rows, in `seq` order; a payout without submissions is one row
            /// whose submission columns are NULL).
            pub async fn payout(pool: &sqlx::Pool<$db>, payout_id: Uuid) -> Result<Option<PayoutView>, StoreError> {
                let q = format!(
                    "SELECT {PAYOUT_COLUMNS_P}, s.submission_id AS s_submission_id, s.presented_token AS s_presented_token, \
                     s.outcome AS s_outcome, s.rail_reference AS s_rail_reference, s.submitted_at AS s_submitted_at, \
                     s.resolved_at AS s_resolved_at FROM payouts p LEFT JOIN rail_submission s ON s.payout_id = p.payout_id \
                     WHERE p.payout_id = $1 ORDER BY s.seq"
                );
                let q = sql(&q);
                let rows = sqlx::query(&q)
                    .bind(payout_id.to_string())
                    .fetch_all(pool)
                    .await
                    .map_err(db_error)?;
                let Some(r) = rows.first() else {
                    return Ok(None);
                };
                let mut submissions = Vec::with_capacity(rows.len());
                for s in &rows {
                    let Some(submission_id) = get!(s, "s_submission_id", Option<String>) else {
                        continue;
                    };
                    let presented_token: Option<i64> = get!(s, "s_presented_token");
                    let submitted_at: Option<DateTime<Utc>> = get!(s, "s_submitted_at");
                    let (Some(presented_token), Some(submitted_at)) = (presented_token, submitted_at) else {
                        return Err(StoreError::Corrupt(format!("rail_submission {submission_id}: NOT NULL columns read as NULL")));
                    };
                    submissions.push(SubmissionSummary {
                        submission_id: parse_uuid(&submission_id)?,
                        presented_token,
                        outcome: parse_outcome(get!(s, "s_outcome"))?,
                        rail_reference: get!(s, "s_rail_reference"),
                        submitted_at,
                        resolved_at: get!(s, "s_resolved_at"),
                    });
                }
                Ok(Some(PayoutView {
                    payout_id: parse_uuid(&get!(r, "payout_id", String))?,
                    account_id: get!(r, "account_id"),
                    amount_minor: get!(r, "amount_minor"),
                    currency: get!(r, "currency"),
                    beneficiary_ref: get!(r, "beneficiary_ref"),
                    state: parse_state(&get!(r, "state", String))?,
                    attempt_count: get!(r, "attempt_count"),
                    claim_token: get!(r, "claim_token"),
                    claimed_by: get!(r, "claimed_by"),
                    claimed_at: get!(r, "claimed_at"),
                    created_at: get!(r, "created_at"),
                    updated_at: get!(r, "updated_at"),
                    submissions,
                }))
            }

            /// The payout's account, one single-column read (the grant check of a fenced write
            /// needs nothing else; `accounts.account_id` of a payout never changes).
            pub async fn payout_account(pool: &sqlx::Pool<$db>, payout_id: Uuid) -> Result<Option<String>, StoreError> {
                let q = sql("SELECT account_id FROM payouts WHERE payout_id = $1");
                sqlx::query(&q)
                    .bind(payout_id.to_string())
                    .fetch_optional(pool)
                    .await
                    .map_err(db_error)?
                    .map(|r| r.try_get("account_id").map_err(db_error))
                    .transpose()
            }

            pub async fn account(pool: &sqlx::Pool<$db>, account_id: &str) -> Result<Option<AccountView>, StoreError> {
                let q = format!("SELECT {ACCOUNT_COLUMNS} FROM accounts a WHERE a.account_id = $1");
                let q = sql(&q);
                sqlx::query(&q)
                    .bind(account_id.to_owned())
                    .fetch_optional(pool)
                    .await
                    .map_err(db_error)?
                    .map(|r| account_view(&r))
                    .transpose()
            }

            pub async fn accounts(pool: &sqlx::Pool<$db>) -> Result<Vec<AccountView>, StoreError> {
                let q = format!("SELECT {ACCOUNT_COLUMNS} FROM accounts a");
                let rows = sqlx::query(&q).fetch_all(pool).await.map_err(db_error)?;
                let mut all = rows.iter().map(account_view).collect::<Result<Vec<_>, _>>()?;
                // Byte order, whatever the database's collation.
                all.sort_by(|x, y| x.account_id.cmp(&y.account_id));
                Ok(all)
            }

            pub async fn list(pool: &sqlx::Pool<$db>, q: &ListQuery) -> Result<Vec<PayoutSummary>, StoreError> {
                const SELECT: &str = "SELECT payout_id, account_id, amount_minor, currency, state, attempt_count, \
                                      created_at FROM payouts \
                                      WHERE state = $1 AND ($2 IS NULL OR account_id = $2) \
                                      AND created_at <= $3 AND created_at > $4";
                let limit = q.limit.max(0);
                let query = match q.after {
                    None => format!("{SELECT} ORDER BY created_at, payout_id LIMIT $5"),
                    Some(_) => format!(
                        "{SELECT} AND (created_at > $5 OR (created_at = $5 AND payout_id > $6)) \
                         ORDER BY created_at, payout_id LIMIT $7"
                    ),
                };
                let sql = sql(&query);
                // Both bounds are plain ranges on the (state, created_at) index.
                let base = sqlx::query(&sql)
                    .bind(q.state.as_str())
                    .bind(q.account_id.clone())
                    .bind(truncate_ms(q.snapshot))
                    .bind(truncate_ms(q.created_after.unwrap_or_else(crate::pay::before_every_payout)));
                let query = match q.after {
                    None => base.bind(limit),
                    Some((created_at, payout_id)) => {
                        base.bind(truncate_ms(created_at)).bind(payout_id.to_string()).bind(limit)
                    }
                };
                let rows = query.fetch_all(pool).await.map_err(db_error)?;
                rows.iter()
                    .map(|r| {
                        Ok(PayoutSummary {
                            payout_id: parse_uuid(&get!(r, "payout_id", String))?,
                            account_id: get!(r, "account_id"),
                            amount_minor: get!(r, "amount_minor"),
                            currency: get!(r, "currency"),
                            state: parse_state(&get!(r, "state", String))?,
                            attempt_count: get!(r, "attempt_count"),
                            created_at: get!(r, "created_at"),
                        })
                    })
                    .collect()
            }

            pub async fn ledger(pool: &sqlx::Pool<$db>, account_id: Option<&str>) -> Result<Vec<LedgerEntry>, StoreError> {
                let q = format!(
                    "SELECT {LEDGER_COLUMNS} FROM ledger_entries WHERE ($1 IS NULL OR account_id = $1) \
                     ORDER BY created_at, entry_id"
                );
                let q = sql(&q);
                let rows = sqlx::query(&q)
                    .bind(account_id.map(str::to_owned))
                    .fetch_all(pool)
                    .await
                    .map_err(db_error)?;
                rows.iter().map(ledger_entry).collect()
            }

            /// The mark for an account, if it was ever set.
            pub async fn high_water(pool: &sqlx::Pool<$db>, account_id: &str) -> Result<Option<i64>, StoreError> {
                let q = sql("SELECT highest_token FROM rail_high_water WHERE account_id = $1");
                sqlx::query(&q)
                    .bind(account_id.to_owned())
                    .fetch_optional(pool)
                    .await
                    .map_err(db_error)?
                    .map(|r| r.try_get("highest_token").map_err(db_error))
                    .transpose()
            }

            /// Attempts, in the order they were written (`seq`); all of them, or one payout's.
            pub async fn submissions(
                pool: &sqlx::Pool<$db>,
                payout_id: Option<Uuid>,
            ) -> Result<Vec<SubmissionRow>, StoreError> {
                let q = sql(
                    "SELECT submission_id, payout_id, account_id, presented_token, owner_id, idempotency_key, \
                     amount_minor, currency, outcome, outcome_detail, rail_reference, submitted_at, resolved_at \
                     FROM rail_submission WHERE ($1 IS NULL OR payout_id = $1) ORDER BY seq",
                );
                let rows = sqlx::query(&q)
                    .bind(payout_id.map(|p| p.to_string()))
                    .fetch_all(pool)
                    .await
                    .map_err(db_error)?;
                rows.iter()
                    .map(|r| {
                        Ok(SubmissionRow {
                            submission_id: parse_uuid(&get!(r, "submission_id", String))?,
                            payout_id: parse_uuid(&get!(r, "payout_id", String))?,
                            account_id: get!(r, "account_id"),
                            presented_token: get!(r, "presented_token"),
                            owner_id: get!(r, "owner_id"),
                            idempotency_key: get!(r, "idempotency_key"),
                            amount_minor: get!(r, "amount_minor"),
                            currency: get!(r, "currency"),
                            outcome: parse_outcome(get!(r, "outcome"))?,
                            outcome_detail: get!(r, "outcome_detail"),
                            rail_reference: get!(r, "rail_reference"),
                            submitted_at: get!(r, "submitted_at"),
                            resolved_at: get!(r, "resolved_at"),
                        })
                    })
                    .collect()
            }

        }
    };
}

paydb_sql!(
    /// paydb's shared statements on PostgreSQL.
    pg,
    sqlx::Postgres,
    dlock_db::Dialect::Postgres
);
paydb_sql!(
    /// paydb's shared statements on SQLite.
    sqlite,
    sqlx::Sqlite,
    dlock_db::Dialect::Sqlite
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pay::is_unsettled;

    #[test]
    fn unsettled_sql_list_matches_is_unsettled() {
        for state in PayoutState::ALL {
            assert_eq!(UNSETTLED_SQL.contains(&format!("'{}'", state.as_str())), is_unsettled(state), "{state:?}");
        }
    }

    #[test]
    fn statements_carry_no_stray_dollar_signs() {
        // The SQLite spelling rewrites every `$`; only placeholders may use one.
        for sql in
            [ACCOUNT_COLUMNS, PAYOUT_COLUMNS, PAYOUT_COLUMNS_P, LEDGER_COLUMNS, RESOLUTION_COLUMNS, UNSETTLED_SQL]
        {
            assert!(!sql.contains('$'), "{sql}");
        }
    }
}
