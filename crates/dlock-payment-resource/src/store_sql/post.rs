//! The post (P3, and P3b: a single post is a batch of one, [`crate::store::Post::batch_of_one`]).
//!
//! Holds the post's read (each payout it names and whether the attempt it names is the
//! payout's ACKED one, I7), its writes (the transitions to POSTED, the settlement accounts,
//! every ledger entry, the one debit of their sum, and the recorded answer: one statement on
//! PostgreSQL, one batch on SQLite), and the inherent fns `run_post` (the whole
//! transaction) and `post_in` (after the gate and fence, [`super::gate`]), stamped for both
//! stores by `post_op!`; and, per dialect, `post_batch_writes`.
//!
//! Invariants:
//! - the read runs after the fence rose (the account's row lock held), as a statement of
//!   its own on PostgreSQL;
//! - each payout is decided by [`rules::decide_post_batch`] in order, on the balance the
//!   ones before it left; the writes are checked against the decision (payouts moved,
//!   entries written, the balance after, the identity row written once), and a payout that
//!   moved in between fails the post as `Unavailable`, nothing written;
//! - no text varies with the batch's size.

use chrono::{DateTime, Utc};
use dlock_contract::payout::{self, Actor, PayoutState};
use dlock_contract::time::truncate_ms;
use sqlx::Row;

use super::gate::{BatchFenceThen, BatchRead, RECORD_SQL};
use super::{json_text, row_payout_id, PgPaymentStore, SqlitePaymentStore};
use crate::answer;
use crate::rules::{self, PostBatchFacts, PostDecision};
use crate::store::{
    settlement_account, AccountKind, Answering, Decided, IdemRequest, LedgerEntry, PostBatch, PostBatchOutcome,
    PostOutcome, StoreError, StoredResponse,
};
use dlock_paydb::sql::{db_error, parse_state};

/// A post's debit, after its entries: `$1` amount, `$2` instant, `$3` account.
pub(super) const BALANCE_DEBIT_SQL: &str = "UPDATE accounts SET balance_minor = balance_minor - $1, updated_at = $2 \
     WHERE account_id = $3 RETURNING balance_minor";

/// PostgreSQL: the batch post's read of each payout it names and whether the attempt it
/// names is the payout's ACKED one (I7). `$1`, `$2`, `$3`: the payout ids, submission ids
/// and rail references (`TEXT[]` each, in the request's order).
pub(super) const PG_POST_BATCH_READ_SQL: &str =
    "SELECT p.payout_id, p.account_id, p.state, p.amount_minor, p.currency, \
     EXISTS (SELECT 1 FROM rail_submission s WHERE s.payout_id = p.payout_id AND s.submission_id = m.submission_id \
     AND s.outcome = 'ACKED' AND s.rail_reference = m.rail_reference) AS acked \
     FROM unnest($1::text[], $2::text[], $3::text[]) AS m(payout_id, submission_id, rail_reference) \
     JOIN payouts p ON p.payout_id = m.payout_id";

/// SQLite: as [`PG_POST_BATCH_READ_SQL`]; `$1` a JSON array of `[payout id, submission id,
/// rail reference]`.
pub(super) const SQLITE_POST_BATCH_READ_SQL: &str =
    "SELECT p.payout_id, p.account_id, p.state, p.amount_minor, p.currency, \
     EXISTS (SELECT 1 FROM rail_submission s WHERE s.payout_id = p.payout_id AND s.submission_id = (m.value ->> 1) \
     AND s.outcome = 'ACKED' AND s.rail_reference = (m.value ->> 2)) AS acked \
     FROM json_each($1) AS m JOIN payouts p ON p.payout_id = (m.value ->> 0)";

/// A post of one payout's read (both dialects; `$1` payout, `$2` submission id, `$3` rail
/// reference): [`PG_POST_BATCH_READ_SQL`] with scalar binds and no join, which the server
/// plans once rather than at every execution (docs/performance.md "Claims and posts:
/// folded statements").
pub(super) const POST_ONE_READ_SQL: &str = "SELECT p.payout_id, p.account_id, p.state, p.amount_minor, p.currency, \
     EXISTS (SELECT 1 FROM rail_submission s WHERE s.payout_id = p.payout_id AND s.submission_id = m.submission_id \
     AND s.outcome = 'ACKED' AND s.rail_reference = m.rail_reference) AS acked \
     FROM (SELECT CAST($1 AS TEXT) AS payout_id, CAST($2 AS TEXT) AS submission_id, CAST($3 AS TEXT) AS rail_reference) \
     AS m JOIN payouts p ON p.payout_id = m.payout_id";

/// The writes of a post that posts one payout, in order (each `$n` from 1): its transition,
/// its settlement account (upserted), its two entries, the debit and the recorded answer.
/// The batch's writes with scalar binds and two-row `VALUES` instead of arrays.
fn post_one_parts() -> [(String, usize); 5] {
    use dlock_paydb::sql::{ledger_insert_sql, LEDGER_ENTRY_BINDS, SYSTEM_ACCOUNT_UPSERT_SQL};
    [
        (
            format!(
                "UPDATE payouts SET state = 'POSTED', updated_at = $1 WHERE payout_id = $2 AND state IN {}",
                post_sources_sql()
            ),
            2,
        ),
        (SYSTEM_ACCOUNT_UPSERT_SQL.to_owned(), 5),
        (ledger_insert_sql(2), 2 * LEDGER_ENTRY_BINDS),
        (BALANCE_DEBIT_SQL.to_owned(), 3),
        (RECORD_SQL.to_owned(), 6),
    ]
}

/// PostgreSQL: the writes of a post of one payout ([`post_one_parts`]), one statement,
/// answered as [`pg_post_batch_writes_sql`].
pub(super) fn pg_post_one_writes_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        let [moved, settle, entries, debit, recorded] = post_one_parts();
        let moved_sql = format!("{} RETURNING payout_id", moved.0);
        let entries_sql = format!("{} RETURNING 1", entries.0);
        let recorded_sql = format!("{} RETURNING 1", recorded.0);
        dlock_db::pg_cte_sql(
            &[
                ("moved", &moved_sql, moved.1),
                ("settle", &settle.0, settle.1),
                ("entries", &entries_sql, entries.1),
                ("debit", &debit.0, debit.1),
                ("recorded", &recorded_sql, recorded.1),
            ],
            "SELECT (SELECT COUNT(*) FROM moved) AS moved, (SELECT COUNT(*) FROM entries) AS entries, \
             (SELECT balance_minor FROM debit) AS balance_minor, (SELECT COUNT(*) FROM recorded) AS recorded",
        )
    })
}

/// SQLite: the writes of a post of one payout ([`post_one_parts`]), one batch.
pub(super) fn sqlite_post_one_writes_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        let parts = post_one_parts();
        let parts: Vec<(&str, usize)> = parts.iter().map(|(sql, binds)| (sql.as_str(), *binds)).collect();
        dlock_db::sqlite_batch_sql(&parts)
    })
}

/// Binds the writes of a post of one payout (`$w`, posting `$payout` into the settlement
/// account `$settlement` of `$currency`) in [`post_one_parts`]' order.
macro_rules! bind_post_one {
    ($query:expr, $w:expr, $payout:expr, $settlement:expr, $currency:expr) => {{
        let query = $query
            .bind($w.at)
            .bind($payout.clone())
            .bind($settlement.clone())
            .bind(AccountKind::Settlement.as_str())
            .bind($currency.clone())
            .bind($w.at)
            .bind($w.at);
        dlock_paydb::bind_ledger_entries!(query, &$w.entries)
            .bind($w.total_minor)
            .bind($w.at)
            .bind($w.account_id.to_owned())
            .bind(i32::from($w.response.status))
            .bind($w.response.body.clone())
            .bind($w.identity.operation.as_str())
            .bind($w.identity.target_id.clone())
            .bind($w.identity.key.clone())
            .bind($w.identity.token)
    }};
}

/// The states a post moves a payout from (C2: RAIL_ACKED).
pub(super) fn post_sources_sql() -> String {
    payout::sql_states(&payout::sources(PayoutState::Posted, Actor::PaymentResource))
}

/// PostgreSQL: a batch post's writes, one statement: the transitions to POSTED (`$2` the
/// posted payouts' ids), the settlement accounts (upserted), every entry, the one debit of
/// their sum, and the recorded answer (each a CTE over rows no other touches).
pub(super) fn pg_post_batch_writes_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        let moved = format!(
            "UPDATE payouts SET state = 'POSTED', updated_at = $1 WHERE payout_id = ANY($2) AND state IN {} \
             RETURNING payout_id",
            post_sources_sql()
        );
        let settle = "INSERT INTO accounts (account_id, kind, currency, balance_minor, fence, created_at, updated_at) \
             SELECT s.account_id, $1, s.currency, 0, 0, $2, $3 FROM unnest($4::text[], $5::text[]) \
             AS s(account_id, currency) ON CONFLICT (account_id) DO NOTHING";
        let entries =
            "INSERT INTO ledger_entries (entry_id, posting_id, payout_id, account_id, direction, amount_minor, \
             currency, fence, created_at) SELECT e.entry_id, e.posting_id, e.payout_id, e.account_id, e.direction, \
             e.amount_minor, e.currency, $1, $2 FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], \
             $7::text[], $8::int8[], $9::text[]) AS e(entry_id, posting_id, payout_id, account_id, direction, \
             amount_minor, currency) RETURNING 1";
        let recorded = format!("{RECORD_SQL} RETURNING 1");
        dlock_db::pg_cte_sql(
            &[
                ("moved", &moved, 2),
                ("settle", settle, 5),
                ("entries", entries, 9),
                ("debit", BALANCE_DEBIT_SQL, 3),
                ("recorded", &recorded, 6),
            ],
            "SELECT (SELECT COUNT(*) FROM moved) AS moved, (SELECT COUNT(*) FROM entries) AS entries, \
             (SELECT balance_minor FROM debit) AS balance_minor, (SELECT COUNT(*) FROM recorded) AS recorded",
        )
    })
}

/// SQLite: as [`pg_post_batch_writes_sql`], one batch; the arrays are JSON texts.
pub(super) fn sqlite_post_batch_writes_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        let moved = format!(
            "UPDATE payouts SET state = 'POSTED', updated_at = $1 \
             WHERE payout_id IN (SELECT value FROM json_each($2)) AND state IN {}",
            post_sources_sql()
        );
        let settle = "INSERT INTO accounts (account_id, kind, currency, balance_minor, fence, created_at, updated_at) \
             SELECT (value ->> 0), $1, (value ->> 1), 0, 0, $2, $3 FROM json_each($4) WHERE true \
             ON CONFLICT (account_id) DO NOTHING";
        let entries =
            "INSERT INTO ledger_entries (entry_id, posting_id, payout_id, account_id, direction, amount_minor, \
             currency, fence, created_at) SELECT (value ->> 0), (value ->> 1), (value ->> 2), (value ->> 3), \
             (value ->> 4), (value ->> 5), (value ->> 6), $1, $2 FROM json_each($3)";
        dlock_db::sqlite_batch_sql(&[(&moved, 2), (settle, 4), (entries, 3), (BALANCE_DEBIT_SQL, 3), (RECORD_SQL, 6)])
    })
}

/// A batch post's writes once decided: the posted payouts, their settlement accounts
/// (distinct), every entry, the debit of their sum, and the recorded answer.
pub(super) struct PostBatchWrites<'a> {
    at: DateTime<Utc>,
    token: i64,
    account_id: &'a str,
    posted: Vec<String>,
    settlements: Vec<(String, String)>,
    entries: Vec<LedgerEntry>,
    total_minor: i64,
    identity: &'a IdemRequest,
    response: &'a StoredResponse,
}

/// Stamps the post's inherent fns for a store (`$db` its database).
macro_rules! post_op {
    ($store:ty, $db:ty) => {
        impl $store {
            pub(super) async fn run_post(&self, b: &PostBatch, i: &IdemRequest, a: &Answering) -> Decided<PostBatchOutcome> {
                let mut tx = self.pool.begin().await.map_err(db_error)?;
                let read = BatchRead::Post { payouts: &b.payouts };
                let fenced =
                    Self::batch_gate_fence_then(&mut tx, i, &b.account_id, b.token, truncate_ms(b.at), read).await?;
                let fenced = match fenced {
                    Ok(fenced) => fenced,
                    Err(refused) => return Self::refused_at_gate(tx, refused).await,
                };
                let decided = Self::post_in(&mut tx, b, i, a, fenced).await?;
                let decided = Self::commit_decided(tx, decided).await;
                let by = (b.account_id.as_str(), b.token, b.owner_id.as_str(), b.at);
                if let Some(refused) = super::FenceRefused::of(&decided, "post", by, b.payouts.iter().map(|p| p.payout_id)) {
                    self.write_fence_refused(&refused).await;
                }
                let decided = decided?;
                Ok(decided)
            }

            /// The batch post inside its transaction, after its gate and fence: each payout
            /// of the account decided by the post rule in order on the balance the ones
            /// before it left ([`rules::decide_post_batch`]); every write and the recorded
            /// answer then as one statement (PostgreSQL) or one batch (SQLite).
            pub(super) async fn post_in(
                tx: &mut sqlx::Transaction<'static, $db>,
                b: &PostBatch,
                i: &IdemRequest,
                a: &Answering,
                fenced: BatchFenceThen<<$db as sqlx::Database>::Row>,
            ) -> Result<(PostBatchOutcome, Option<StoredResponse>), StoreError> {
                let (balance, rows) = match fenced {
                    (Some(balance), rows) => (balance, rows),
                    (None, _) => return Self::batch_refused(tx, &b.account_id, b.token).await,
                };
                let at = truncate_ms(b.at);
                let mut read = std::collections::BTreeMap::new();
                for row in rows {
                    if !rules::batch_may_write(&b.account_id, &get!(row, "account_id", String)) {
                        continue;
                    }
                    let payout_id = row_payout_id(&get!(row, "payout_id", String))?;
                    let state = parse_state(&get!(row, "state", String))?;
                    let terms: (i64, String, bool) = (get!(row, "amount_minor"), get!(row, "currency"), get!(row, "acked"));
                    read.insert(payout_id, (state, terms));
                }
                let facts: Vec<PostBatchFacts> = b
                    .payouts
                    .iter()
                    .filter_map(|p| {
                        read.get(&p.payout_id).map(|(state, (amount, _, acked))| PostBatchFacts {
                            state: *state,
                            acked: *acked,
                            amount_minor: *amount,
                        })
                    })
                    .collect();
                let mut decisions =
                    rules::decide_post_batch(balance, &facts).map_err(|e| StoreError::Corrupt(e.to_string()))?.into_iter();
                let mut items = Vec::with_capacity(b.payouts.len());
                let mut posted = Vec::new();
                let mut settlements: Vec<(String, String)> = Vec::new();
                let mut entries = Vec::new();
                let (mut balance_after, mut total_minor) = (balance, 0i64);
                for p in &b.payouts {
                    let Some((_, (amount, currency, _))) = read.get(&p.payout_id) else {
                        items.push((p.payout_id, PostOutcome::NotFound));
                        continue;
                    };
                    let Some(decision) = decisions.next() else {
                        return Err(StoreError::Corrupt("the batch post rule decided fewer payouts than it read".into()));
                    };
                    let outcome = match decision {
                        PostDecision::NotClaimable { state } => PostOutcome::NotClaimable { state },
                        PostDecision::RailMismatch => PostOutcome::RailMismatch,
                        PostDecision::Posted { balance_after_minor } => {
                            let pair = b.post(p).entries(&b.account_id, *amount, currency, at);
                            let settlement = (settlement_account(currency), currency.clone());
                            if !settlements.contains(&settlement) {
                                settlements.push(settlement);
                            }
                            posted.push(p.payout_id.to_string());
                            entries.extend(pair.iter().cloned());
                            balance_after = balance_after_minor;
                            total_minor = total_minor
                                .checked_add(*amount)
                                .ok_or_else(|| StoreError::Corrupt("a batch's posted total overflows".into()))?;
                            PostOutcome::Posted {
                                account_id: b.account_id.clone(),
                                entries: pair,
                                balance_minor: balance_after_minor,
                            }
                        }
                    };
                    items.push((p.payout_id, outcome));
                }
                let outcome = PostBatchOutcome::Decided { items };
                if posted.is_empty() {
                    return Ok((outcome, None));
                }
                let response = answer::post(&outcome, &b.account_id, b.token, a);
                let expected = posted.len();
                let w = PostBatchWrites {
                    at,
                    token: b.token,
                    account_id: &b.account_id,
                    posted,
                    settlements,
                    entries,
                    total_minor,
                    identity: i,
                    response: &response,
                };
                let (moved, written, balance_minor, recorded) = Self::post_batch_writes(tx, &w).await?;
                if moved != expected {
                    // RAIL_ACKED moves only by a post, under the account's row lock: a payout
                    // that did not move is one that changed since the read.
                    return Err(StoreError::Unavailable(format!(
                        "{} of the batch's payouts changed while they were posted; nothing was written",
                        expected.saturating_sub(moved)
                    )));
                }
                if written != w.entries.len() || balance_minor != balance_after || recorded != 1 {
                    return Err(StoreError::Corrupt(format!(
                        "batch post: {written} of {} entries written, balance {balance_minor} where the post rule says \
                         {balance_after}, identity row written {recorded} times",
                        w.entries.len()
                    )));
                }
                Ok((outcome, Some(response)))
            }
        }
    };
}

post_op!(PgPaymentStore, sqlx::Postgres);
post_op!(SqlitePaymentStore, sqlx::Sqlite);

impl PgPaymentStore {
    /// A batch post's writes, one statement ([`pg_post_batch_writes_sql`]): (payouts moved,
    /// entries written, the balance after, identity rows written).
    pub(super) async fn post_batch_writes(
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        w: &PostBatchWrites<'_>,
    ) -> Result<(usize, usize, i64, i64), StoreError> {
        let row = if let ([payout], [(settlement, currency)]) = (w.posted.as_slice(), w.settlements.as_slice()) {
            let query = bind_post_one!(sqlx::query(pg_post_one_writes_sql()), w, payout, settlement, currency);
            query.fetch_one(&mut **tx).await.map_err(db_error)?
        } else {
            Self::post_batch_writes_row(tx, w).await?
        };
        let (moved, written): (i64, i64) = (get!(row, "moved"), get!(row, "entries"));
        let Some(balance) = get!(row, "balance_minor", Option<i64>) else {
            return Err(StoreError::Corrupt(format!("accounts: no account {} to debit", w.account_id)));
        };
        let count = |n: i64| usize::try_from(n).unwrap_or(0);
        Ok((count(moved), count(written), balance, get!(row, "recorded")))
    }

    /// The row of [`pg_post_batch_writes_sql`] for `w`.
    async fn post_batch_writes_row(
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        w: &PostBatchWrites<'_>,
    ) -> Result<sqlx::postgres::PgRow, StoreError> {
        let column = |f: fn(&LedgerEntry) -> String| w.entries.iter().map(f).collect::<Vec<String>>();
        sqlx::query(pg_post_batch_writes_sql())
            .bind(w.at)
            .bind(w.posted.clone())
            .bind(AccountKind::Settlement.as_str())
            .bind(w.at)
            .bind(w.at)
            .bind(w.settlements.iter().map(|s| s.0.clone()).collect::<Vec<String>>())
            .bind(w.settlements.iter().map(|s| s.1.clone()).collect::<Vec<String>>())
            .bind(w.token)
            .bind(w.at)
            .bind(column(|e| e.entry_id.to_string()))
            .bind(column(|e| e.posting_id.to_string()))
            .bind(column(|e| e.payout_id.map(|p| p.to_string()).unwrap_or_default()))
            .bind(column(|e| e.account_id.clone()))
            .bind(column(|e| e.direction.as_str().to_owned()))
            .bind(w.entries.iter().map(|e| e.amount_minor).collect::<Vec<i64>>())
            .bind(column(|e| e.currency.clone()))
            .bind(w.total_minor)
            .bind(w.at)
            .bind(w.account_id.to_owned())
            .bind(i32::from(w.response.status))
            .bind(w.response.body.clone())
            .bind(w.identity.operation.as_str())
            .bind(w.identity.target_id.clone())
            .bind(w.identity.key.clone())
            .bind(w.identity.token)
            .fetch_one(&mut **tx)
            .await
            .map_err(db_error)
    }
}

impl SqlitePaymentStore {
    /// A batch post's writes, one batch ([`sqlite_post_batch_writes_sql`]): (payouts moved,
    /// entries written, the balance after, identity rows written).
    pub(super) async fn post_batch_writes(
        tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        w: &PostBatchWrites<'_>,
    ) -> Result<(usize, usize, i64, i64), StoreError> {
        if let ([payout], [(settlement, currency)]) = (w.posted.as_slice(), w.settlements.as_slice()) {
            let query = bind_post_one!(sqlx::query(sqlite_post_one_writes_sql()), w, payout, settlement, currency);
            return Self::post_writes_parts(tx, w, query).await;
        }
        type EntryRow = (String, String, Option<String>, String, &'static str, i64, String);
        let entries: Vec<EntryRow> = w
            .entries
            .iter()
            .map(|e| {
                (
                    e.entry_id.to_string(),
                    e.posting_id.to_string(),
                    e.payout_id.map(|p| p.to_string()),
                    e.account_id.clone(),
                    e.direction.as_str(),
                    e.amount_minor,
                    e.currency.clone(),
                )
            })
            .collect();
        let query = sqlx::query(sqlite_post_batch_writes_sql())
            .bind(w.at)
            .bind(json_text(&w.posted)?)
            .bind(AccountKind::Settlement.as_str())
            .bind(w.at)
            .bind(w.at)
            .bind(json_text(&w.settlements)?)
            .bind(w.token)
            .bind(w.at)
            .bind(json_text(&entries)?)
            .bind(w.total_minor)
            .bind(w.at)
            .bind(w.account_id.to_owned())
            .bind(i32::from(w.response.status))
            .bind(w.response.body.clone())
            .bind(w.identity.operation.as_str())
            .bind(w.identity.target_id.clone())
            .bind(w.identity.key.clone())
            .bind(w.identity.token);
        Self::post_writes_parts(tx, w, query).await
    }

    /// Runs a post's writes (the batch's or the one-payout form: the same five statements
    /// in the same order): (payouts moved, entries written, the balance after, identity rows
    /// written).
    async fn post_writes_parts<'q>(
        tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        w: &PostBatchWrites<'_>,
        query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    ) -> Result<(usize, usize, i64, i64), StoreError> {
        let parts = dlock_db::sqlite_batch(tx, query, 5).await.map_err(db_error)?;
        let Some(row) = parts[3].rows.first() else {
            return Err(StoreError::Corrupt(format!("accounts: no account {} to debit", w.account_id)));
        };
        let count = |k: usize| usize::try_from(parts[k].rows_affected).unwrap_or(usize::MAX);
        Ok((count(0), count(2), get!(row, "balance_minor"), i64::try_from(parts[4].rows_affected).unwrap_or(i64::MAX)))
    }
}
