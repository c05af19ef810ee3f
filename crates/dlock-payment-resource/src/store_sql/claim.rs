//! The claim (P2, and P2b: a single claim is a batch of one, [`crate::store::Claim::batch_of_one`]).
//!
//! Holds the claim's read (each payout it names and the account's reservation), its
//! transitions and recorded answer (one statement on PostgreSQL, one batch on SQLite), and
//! the inherent fns `run_claim` (the whole transaction) and `claim_in` (after the gate and
//! fence, [`super::gate`]), stamped for both stores by `claim_op!`; and, per dialect,
//! `claim_batch_move_and_record`.
//!
//! Invariants:
//! - the read runs after the fence rose (the account's row lock held), as a statement of
//!   its own on PostgreSQL, so the reservation counts every claim committed before;
//! - each payout is decided by [`rules::decide_claim_batch`] in order, on what the ones
//!   before it left; each transition is conditional on the state and attempt count the read
//!   saw, and a payout that moved in between (the proxy or an operator: no account row
//!   lock) fails the claim as `Unavailable`, nothing written;
//! - no text varies with the batch's size (one array bind on PostgreSQL, one JSON text read
//!   with `json_each` on SQLite), but for PostgreSQL's move of one payout
//!   ([`PG_CLAIM_ONE_MOVE_SQL`]: the same statement with scalar binds, which the server plans
//!   once instead of at every execution).

use chrono::{DateTime, Utc};
use dlock_contract::payout::PayoutState;
use dlock_contract::time::truncate_ms;
use sqlx::Row;

use super::gate::{BatchFenceThen, BatchRead, RECORD_SQL};
use super::{json_text, row_payout_id, PgPaymentStore, SqlitePaymentStore};
use crate::answer;
use crate::rules::{self, ClaimBatchFacts};
use crate::store::{
    Answering, ClaimBatch, ClaimBatchOutcome, ClaimOutcome, ClaimSeen, Decided, IdemRequest, StoreError, StoredResponse,
};
use dlock_paydb::sql::{db_error, parse_state};

/// The columns a batch claim reads of each payout it names, and the account's reservation
/// (Σ amount of its unsettled payouts, the batch's own included; `$1` the account). Read
/// after the fence's row lock, as a statement of its own on PostgreSQL (so its snapshot
/// follows the lock: no claim committed during the wait is missed).
macro_rules! claim_batch_read_sql {
    ($payouts:literal) => {
        concat!(
            "SELECT p.payout_id, p.account_id, p.state, p.amount_minor, p.currency, p.beneficiary_ref, \
             p.attempt_count, (SELECT CAST(COALESCE(SUM(q.amount_minor), 0) AS BIGINT) FROM payouts q \
             WHERE q.account_id = $1 AND q.state IN ",
            dlock_paydb::unsettled_sql!(),
            ") AS unsettled_minor FROM payouts p WHERE p.payout_id ",
            $payouts
        )
    };
}

/// PostgreSQL: the batch claim's read; `$2` the payout ids (`TEXT[]`).
pub(super) const PG_CLAIM_BATCH_READ_SQL: &str = claim_batch_read_sql!("= ANY($2)");
/// SQLite: the batch claim's read; `$2` the payout ids (a JSON array of strings).
pub(super) const SQLITE_CLAIM_BATCH_READ_SQL: &str = claim_batch_read_sql!("IN (SELECT value FROM json_each($2))");

/// PostgreSQL: a batch claim's transitions, each conditional on the state and attempt count
/// the batch's read saw. `$1` token, `$2` owner, `$3`/`$4`
/// instant, then per payout (`$5` ids, `$6` next states, `$7` states read, `$8` attempt
/// counts read).
pub(super) const PG_CLAIM_BATCH_MOVE_SQL: &str =
    "UPDATE payouts p SET state = m.next, claim_token = $1, claimed_by = $2, \
     claimed_at = $3, updated_at = $4 FROM unnest($5::text[], $6::text[], $7::text[], $8::int4[]) \
     AS m(payout_id, next, was, attempts) \
     WHERE p.payout_id = m.payout_id AND p.state = m.was AND p.attempt_count = m.attempts RETURNING p.payout_id";

/// PostgreSQL: [`PG_CLAIM_BATCH_MOVE_SQL`] for a batch of one (a single claim, or a batch
/// where one payout moves), its binds scalars in the same places. The text has no join and
/// no array, so the server plans it once per connection (a cached generic plan, an index
/// lookup); the join over `unnest` is planned anew at every execution (a custom plan: a
/// generic one would scan `payouts`), which on a single claim cost about half a millisecond
/// of its round trip (docs/performance.md "Claims and posts: folded statements").
pub(super) const PG_CLAIM_ONE_MOVE_SQL: &str =
    "UPDATE payouts p SET state = m.next, claim_token = $1, claimed_by = $2, claimed_at = $3, updated_at = $4 \
     FROM (SELECT $5::text AS payout_id, $6::text AS next, $7::text AS was, $8::int4 AS attempts) AS m \
     WHERE p.payout_id = m.payout_id AND p.state = m.was AND p.attempt_count = m.attempts RETURNING p.payout_id";

/// SQLite: as [`PG_CLAIM_BATCH_MOVE_SQL`]; `$5` a JSON array of `[payout id, next state,
/// state read, attempt count read]`.
pub(super) const SQLITE_CLAIM_BATCH_MOVE_SQL: &str =
    "UPDATE payouts SET state = m.next, claim_token = $1, claimed_by = $2, \
     claimed_at = $3, updated_at = $4 FROM (SELECT (value ->> 0) AS payout_id, (value ->> 1) AS next, \
     (value ->> 2) AS was, (value ->> 3) AS attempts FROM json_each($5)) AS m \
     WHERE payouts.payout_id = m.payout_id AND payouts.state = m.was AND payouts.attempt_count = m.attempts";

/// PostgreSQL: a batch claim's transitions and its recorded answer, one statement
/// ([`dlock_db::pg_cte_sql`]): (payouts moved, identity rows written).
pub(super) fn pg_claim_batch_move_and_record_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        let recorded = format!("{RECORD_SQL} RETURNING operation");
        dlock_db::pg_cte_sql(
            &[("moved", PG_CLAIM_BATCH_MOVE_SQL, 8), ("recorded", &recorded, 6)],
            "SELECT (SELECT COUNT(*) FROM moved) AS moved, (SELECT COUNT(*) FROM recorded) AS recorded",
        )
    })
}

/// PostgreSQL: one payout's transition ([`PG_CLAIM_ONE_MOVE_SQL`]) and the recorded
/// answer, one statement, answered as [`pg_claim_batch_move_and_record_sql`].
pub(super) fn pg_claim_one_move_and_record_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        let recorded = format!("{RECORD_SQL} RETURNING operation");
        dlock_db::pg_cte_sql(
            &[("moved", PG_CLAIM_ONE_MOVE_SQL, 8), ("recorded", &recorded, 6)],
            "SELECT (SELECT COUNT(*) FROM moved) AS moved, (SELECT COUNT(*) FROM recorded) AS recorded",
        )
    })
}

/// SQLite: a batch claim's transitions and its recorded answer, one batch.
pub(super) fn sqlite_claim_batch_move_and_record_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| dlock_db::sqlite_batch_sql(&[(SQLITE_CLAIM_BATCH_MOVE_SQL, 5), (RECORD_SQL, 6)]))
}

/// A batch claim's transitions: per payout (id, next state, state read, attempt count read).
pub(super) type ClaimBatchMoves = Vec<(String, PayoutState, PayoutState, i32)>;

/// A batch claim's writes once decided: its transitions and the recorded answer.
pub(super) struct ClaimBatchWrites<'a> {
    pub(super) b: &'a ClaimBatch,
    pub(super) at: DateTime<Utc>,
    pub(super) moves: ClaimBatchMoves,
    pub(super) identity: &'a IdemRequest,
    pub(super) response: &'a StoredResponse,
}

/// Stamps the claim's inherent fns for a store (`$db` its database).
macro_rules! claim_op {
    ($store:ty, $db:ty) => {
        impl $store {
            pub(super) async fn run_claim(
                &self,
                b: &ClaimBatch,
                i: &IdemRequest,
                a: &Answering,
            ) -> Decided<ClaimBatchOutcome> {
                let mut tx = self.pool.begin().await.map_err(db_error)?;
                let read = BatchRead::Claim { account_id: &b.account_id, payouts: &b.payouts };
                let fenced =
                    Self::batch_gate_fence_then(&mut tx, i, &b.account_id, b.token, truncate_ms(b.at), read).await?;
                let fenced = match fenced {
                    Ok(fenced) => fenced,
                    Err(refused) => return Self::refused_at_gate(tx, refused).await,
                };
                let decided = Self::claim_in(&mut tx, b, i, a, fenced).await?;
                let decided = Self::commit_decided(tx, decided).await;
                let by = (b.account_id.as_str(), b.token, b.owner_id.as_str(), b.at);
                if let Some(refused) =
                    super::FenceRefused::of(&decided, "claim", by, b.payouts.iter().map(|p| p.payout_id))
                {
                    self.write_fence_refused(&refused).await;
                }
                let decided = decided?;
                Ok(decided)
            }

            /// The batch claim inside its transaction, after its gate and fence (`fenced`:
            /// the account's balance when the fence rose, and the batch's read). Each payout
            /// of the account is decided by the claim rule in order on what the ones before
            /// it left ([`rules::decide_claim_batch`]); every transition and the recorded
            /// answer are then one statement (PostgreSQL) or one batch (SQLite). An outcome
            /// that commits comes back with its recorded answer, for the caller to commit.
            pub(super) async fn claim_in(
                tx: &mut sqlx::Transaction<'static, $db>,
                b: &ClaimBatch,
                i: &IdemRequest,
                a: &Answering,
                fenced: BatchFenceThen<<$db as sqlx::Database>::Row>,
            ) -> Result<(ClaimBatchOutcome, Option<StoredResponse>), StoreError> {
                let (balance, rows) = match fenced {
                    (Some(balance), rows) => (balance, rows),
                    (None, _) => return Self::batch_refused(tx, &b.account_id, b.token).await,
                };
                // What the read found of each payout of the account (another account's is
                // not found), and the account's reservation (every row carries it).
                let mut unsettled = 0i64;
                let mut read = std::collections::BTreeMap::new();
                for row in rows {
                    unsettled = get!(row, "unsettled_minor");
                    if !rules::batch_may_write(&b.account_id, &get!(row, "account_id", String)) {
                        continue;
                    }
                    let payout_id = row_payout_id(&get!(row, "payout_id", String))?;
                    let state = parse_state(&get!(row, "state", String))?;
                    let terms: (i64, String, String, i32) = (
                        get!(row, "amount_minor"),
                        get!(row, "currency"),
                        get!(row, "beneficiary_ref"),
                        get!(row, "attempt_count"),
                    );
                    read.insert(payout_id, (state, terms));
                }
                let facts: Vec<ClaimBatchFacts> = b
                    .payouts
                    .iter()
                    .filter_map(|p| {
                        read.get(&p.payout_id).map(|(state, terms)| ClaimBatchFacts {
                            state: *state,
                            expected: p.expected,
                            amount_minor: terms.0,
                        })
                    })
                    .collect();
                let mut decisions = rules::decide_claim_batch(balance, unsettled, &facts)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?
                    .into_iter();
                let mut items = Vec::with_capacity(b.payouts.len());
                let mut moves: ClaimBatchMoves = Vec::new();
                for p in &b.payouts {
                    let Some((state, (amount, currency, beneficiary_ref, attempts))) = read.get(&p.payout_id) else {
                        items.push((p.payout_id, ClaimOutcome::NotFound));
                        continue;
                    };
                    let Some(decision) = decisions.next() else {
                        return Err(StoreError::Corrupt(
                            "the batch claim rule decided fewer payouts than it read".into(),
                        ));
                    };
                    let read = ClaimSeen { amount_minor: *amount, currency, beneficiary_ref, attempt_count: *attempts };
                    let outcome = ClaimOutcome::decided(&decision, &b.account_id, b.token, read);
                    if let Some(next) = decision.next_state() {
                        moves.push((p.payout_id.to_string(), next, *state, *attempts));
                    }
                    items.push((p.payout_id, outcome));
                }
                let outcome = ClaimBatchOutcome::Decided { items };
                if moves.is_empty() {
                    return Ok((outcome, None));
                }
                let response = answer::claim(&outcome, &b.account_id, b.token, a);
                let expected = moves.len();
                let w = ClaimBatchWrites { b, at: truncate_ms(b.at), moves, identity: i, response: &response };
                match Self::claim_batch_move_and_record(tx, &w).await? {
                    (moved, 1) if moved == expected => Ok((outcome, Some(response))),
                    // A payout moved since the read (the proxy or an operator: neither takes
                    // the account's row lock). The caller rolls back; a retry judges afresh.
                    (moved, 1) if moved < expected => Err(StoreError::Unavailable(format!(
                        "{} of the batch's payouts changed while they were claimed; nothing was written",
                        expected - moved
                    ))),
                    (moved, recorded) => Err(StoreError::Corrupt(format!(
                        "batch claim: {moved} of {expected} payouts moved, identity row written {recorded} times"
                    ))),
                }
            }
        }
    };
}

claim_op!(PgPaymentStore, sqlx::Postgres);
claim_op!(SqlitePaymentStore, sqlx::Sqlite);

impl PgPaymentStore {
    /// A batch claim's transitions and its recorded answer, one statement
    /// ([`pg_claim_batch_move_and_record_sql`]; [`pg_claim_one_move_and_record_sql`] when one
    /// payout moves): (payouts moved, identity rows written).
    pub(super) async fn claim_batch_move_and_record(
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        w: &ClaimBatchWrites<'_>,
    ) -> Result<(usize, i64), StoreError> {
        let query = match w.moves.as_slice() {
            [(id, next, was, attempts)] => sqlx::query(pg_claim_one_move_and_record_sql())
                .bind(w.b.token)
                .bind(w.b.owner_id.clone())
                .bind(w.at)
                .bind(w.at)
                .bind(id.clone())
                .bind(next.as_str())
                .bind(was.as_str())
                .bind(*attempts),
            moves => sqlx::query(pg_claim_batch_move_and_record_sql())
                .bind(w.b.token)
                .bind(w.b.owner_id.clone())
                .bind(w.at)
                .bind(w.at)
                .bind(moves.iter().map(|m| m.0.clone()).collect::<Vec<String>>())
                .bind(moves.iter().map(|m| m.1.as_str()).collect::<Vec<&str>>())
                .bind(moves.iter().map(|m| m.2.as_str()).collect::<Vec<&str>>())
                .bind(moves.iter().map(|m| m.3).collect::<Vec<i32>>()),
        };
        let row = query
            .bind(i32::from(w.response.status))
            .bind(w.response.body.clone())
            .bind(w.identity.operation.as_str())
            .bind(w.identity.target_id.clone())
            .bind(w.identity.key.clone())
            .bind(w.identity.token)
            .fetch_one(&mut **tx)
            .await
            .map_err(db_error)?;
        let moved: i64 = get!(row, "moved");
        Ok((usize::try_from(moved).unwrap_or(0), get!(row, "recorded")))
    }
}

impl SqlitePaymentStore {
    /// A batch claim's transitions and its recorded answer, one batch
    /// ([`sqlite_claim_batch_move_and_record_sql`]): (payouts moved, identity rows written).
    pub(super) async fn claim_batch_move_and_record(
        tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        w: &ClaimBatchWrites<'_>,
    ) -> Result<(usize, i64), StoreError> {
        let moves: Vec<(&str, &str, &str, i32)> =
            w.moves.iter().map(|m| (m.0.as_str(), m.1.as_str(), m.2.as_str(), m.3)).collect();
        let query = sqlx::query(sqlite_claim_batch_move_and_record_sql())
            .bind(w.b.token)
            .bind(w.b.owner_id.clone())
            .bind(w.at)
            .bind(w.at)
            .bind(json_text(&moves)?)
            .bind(i32::from(w.response.status))
            .bind(w.response.body.clone())
            .bind(w.identity.operation.as_str())
            .bind(w.identity.target_id.clone())
            .bind(w.identity.key.clone())
            .bind(w.identity.token);
        let parts = dlock_db::sqlite_batch(tx, query, 2).await.map_err(db_error)?;
        let moved = usize::try_from(parts[0].rows_affected).unwrap_or(usize::MAX);
        Ok((moved, i64::try_from(parts[1].rows_affected).unwrap_or(i64::MAX)))
    }
}
