//! paydb on PostgreSQL and SQLite, through sqlx.
//!
//! The SQL is written once, with `$n` placeholders, and the same statements run on both
//! databases (SQLite gets `?n`, its numbered form). The two implementations differ only in
//! their pool type; a macro stamps the one body out for each.
//!
//! Steps 1–3 are one transaction whose first statement is a write, so on SQLite the
//! transaction takes the write lock at once (no read-then-upgrade deadlock) and on
//! PostgreSQL the conditional upsert row-locks the mark until commit.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dlock_contract::payout::{self, Actor, PayoutState};
use dlock_contract::rail::SubmissionOutcome;
use sqlx::Row;
use uuid::Uuid;

use dlock_db::Dialect;
use dlock_paydb::sql::{commit_error, db_error, parse_state, parse_uuid, PG_MIGRATOR, SQLITE_MIGRATOR};

use crate::admission::{self, MarkVerdict};
use crate::store::{
    Admission, Attempt, Checked, NewPayout, PayoutRow, RailStore, Resolution, Stamp, StoreError, SubmissionRow,
    Unstamped,
};

/// The forwardable-attempt predicate of `rail_submission_attempt_uidx`, verbatim.
const FORWARDABLE: &str = "outcome IS NULL OR outcome IN ('ACKED', 'REJECTED', 'TIMEOUT')";

fn pg_sql(sql: &str) -> std::borrow::Cow<'_, str> {
    Dialect::Postgres.sql(sql)
}

fn sqlite_sql(sql: &str) -> std::borrow::Cow<'_, str> {
    Dialect::Sqlite.sql(sql)
}

/// Opens paydb at `url` and applies pending migrations.
pub async fn open(url: &str) -> Result<std::sync::Arc<dyn RailStore>, StoreError> {
    match Dialect::of_url(url).map_err(StoreError::Unavailable)? {
        Dialect::Postgres => Ok(std::sync::Arc::new(PgRailStore::open(url).await?)),
        Dialect::Sqlite => Ok(std::sync::Arc::new(SqliteRailStore::open(url).await?)),
    }
}

/// Applies pending paydb migrations at `url`; returns the versions the tree holds, all now
/// applied.
pub async fn migrate(url: &str) -> Result<Vec<i64>, StoreError> {
    let migrator = match Dialect::of_url(url).map_err(StoreError::Unavailable)? {
        Dialect::Postgres => {
            PgRailStore::open(url).await?;
            &PG_MIGRATOR
        }
        Dialect::Sqlite => {
            SqliteRailStore::open(url).await?;
            &SQLITE_MIGRATOR
        }
    };
    Ok(migrator.iter().map(|m| m.version).collect())
}

/// paydb on PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgRailStore {
    pub pool: sqlx::PgPool,
    /// Autocommitted reads: the same pool on PostgreSQL.
    pub read_pool: sqlx::PgPool,
}

impl PgRailStore {
    pub async fn open(url: &str) -> Result<PgRailStore, StoreError> {
        let pool = dlock_db::pg_pool(url).await.map_err(db_error)?;
        PG_MIGRATOR.run(&pool).await.map_err(|e| StoreError::Unavailable(format!("migrate: {e}")))?;
        Ok(PgRailStore { read_pool: pool.clone(), pool })
    }

    /// PostgreSQL's transactions run on the caller's task: its pool has many connections.
    fn writer(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        None
    }
}

/// paydb on SQLite (the embedded default).
#[derive(Debug, Clone)]
pub struct SqliteRailStore {
    pub pool: sqlx::SqlitePool,
    /// Autocommitted reads, off the one writer connection
    /// (`dlock_db::SharedSqlitePool::readers`).
    pub read_pool: sqlx::SqlitePool,
    /// This process's one pool on the file (`dlock_db::shared_sqlite_pool`): held so the
    /// other services of the process that open the same file share it.
    _shared: dlock_db::SharedSqlitePool,
    /// The process's SQLite writer thread (`dlock_db::sqlite_writer_thread`, §8.7).
    writer: dlock_rt::dedicated::WriterThread,
}

impl SqliteRailStore {
    /// This process's one pool on the file, as every other store opened on it holds it.
    pub fn shared_pool(&self) -> &dlock_db::SharedSqlitePool {
        &self._shared
    }

    fn writer(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        Some(self.writer.clone())
    }

    pub async fn open(url: &str) -> Result<SqliteRailStore, StoreError> {
        let shared = dlock_db::shared_sqlite_pool(url).await.map_err(db_error)?;
        SQLITE_MIGRATOR.run(shared.pool()).await.map_err(|e| StoreError::Unavailable(format!("migrate: {e}")))?;
        let writer = dlock_db::sqlite_writer_thread().map_err(db_error)?;
        Ok(SqliteRailStore {
            pool: shared.pool().clone(),
            read_pool: shared.readers().clone(),
            _shared: shared,
            writer,
        })
    }
}

/// Where a failed write failed: before its commit (nothing committed) or at it (an
/// autocommitted statement counts as its own commit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Statement,
    Commit,
}

impl Stage {
    fn classify(self, e: sqlx::Error) -> StoreError {
        match self {
            Stage::Statement => db_error(e),
            Stage::Commit => commit_error(e),
        }
    }
}

/// How far the writes of steps 1-3 got, in one transaction still open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AdmitStep {
    /// Step 1 refused: the mark is at or above the token (nothing written yet).
    MarkRefused,
    /// Step 2 refused: a forwardable attempt holds the payout's slot (the mark advanced).
    SlotTaken,
    /// Step 3 refused: the payout was not in a state the proxy submits from.
    NotMoved,
    /// All three wrote: the intent is ready to commit.
    Moved,
}

/// Steps 1-3 as one PostgreSQL statement. Each data-modifying part runs only when the one
/// before it wrote (`EXISTS` on its `RETURNING`), so the parts chain exactly like the three
/// statements they replace, each still deciding by its own conditional write:
/// - `mark`: the conditional upsert (`ON CONFLICT ... DO UPDATE ... WHERE <`) compares with
///   the newest committed mark, locked, whatever the statement's snapshot;
/// - `intent`: the unique index decides a conflict (`ON CONFLICT DO NOTHING`), not a read;
/// - `moved`: an `UPDATE` re-checks its `WHERE` on the newest row version it locks.
///
/// None of the three decides by a plain read of the statement's snapshot, so taking that
/// snapshot before a wait (the hazard of docs/performance.md §5 cut 8) changes no decision.
/// A refusal is classified after it, by statements of their own (refusals only).
///
/// `gated` ([`RailStore::admit_checked`]): a first part, `gate`, reads the payout's terms and
/// the mark writes only when they are the body's (`$10` the beneficiary), so validation and
/// steps 1-3 are one statement. The terms never change once written (paydb's trigger) and a
/// payout is never deleted, so the snapshot's answer is the newest; a payout the snapshot
/// predates is found by the refusal's own read, and the parts then run again ungated.
/// Built once per process and form (every admission sends one).
fn pg_admit_sql(gated: bool) -> &'static str {
    static SQL: [std::sync::OnceLock<String>; 2] = [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    SQL[usize::from(gated)].get_or_init(|| pg_admit_sql_text(gated))
}

/// The text of [`pg_admit_sql`].
fn pg_admit_sql_text(gated: bool) -> String {
    let from = payout::sql_states(&payout::sources(PayoutState::Submitted, Actor::RailProxy));
    let (gate, values) = if gated {
        (
            "gate AS (SELECT 1 FROM payouts WHERE payout_id = $2 AND account_id = $3 AND amount_minor = $7 \
             AND currency = $8 AND beneficiary_ref = $10), ",
            "SELECT $3, $4, $9 WHERE EXISTS (SELECT 1 FROM gate)",
        )
    } else {
        ("", "VALUES ($3, $4, $9)")
    };
    format!(
        "WITH {gate}mark AS ( \
           INSERT INTO rail_high_water (account_id, highest_token, updated_at) {values} \
           ON CONFLICT (account_id) DO UPDATE \
           SET highest_token = EXCLUDED.highest_token, updated_at = EXCLUDED.updated_at \
           WHERE rail_high_water.highest_token < EXCLUDED.highest_token \
           RETURNING highest_token), \
         intent AS ( \
           INSERT INTO rail_submission (submission_id, payout_id, account_id, presented_token, owner_id, \
           idempotency_key, amount_minor, currency, outcome, submitted_at) \
           SELECT $1, $2, $3, $4, $5, $6, $7, $8, NULL, $9 WHERE EXISTS (SELECT 1 FROM mark) \
           ON CONFLICT (payout_id) WHERE {FORWARDABLE} DO NOTHING \
           RETURNING submission_id), \
         moved AS ( \
           UPDATE payouts SET state = 'SUBMITTED', attempt_count = attempt_count + 1, updated_at = $9 \
           WHERE payout_id = $2 AND state IN {from} AND EXISTS (SELECT 1 FROM intent) \
           RETURNING payout_id) \
         SELECT (SELECT highest_token FROM mark) AS marked, \
                EXISTS (SELECT 1 FROM intent) AS claimed, \
                EXISTS (SELECT 1 FROM moved) AS moved"
    )
}

/// The resolution as one PostgreSQL statement, autocommitted: the outcome on the attempt
/// still unresolved, and its payout out of SUBMITTED by the same conditional rules as the
/// two statements it replaces.
fn pg_resolve_sql(to: PayoutState) -> String {
    let from = payout::sql_states(&payout::sources(to, Actor::RailProxy));
    format!(
        "WITH resolved AS ( \
           UPDATE rail_submission SET outcome = $2, outcome_detail = $3, rail_reference = $4, resolved_at = $5 \
           WHERE submission_id = $1 AND outcome IS NULL \
           RETURNING payout_id) \
         UPDATE payouts SET state = $6, updated_at = $5 \
         WHERE payout_id IN (SELECT payout_id FROM resolved) AND state IN {from}"
    )
}

/// Steps 1-3 on SQLite, as one batch of three statements chained like [`pg_admit_sql`]'s
/// parts: each runs its write only when the statement before it wrote (`changes() = 1`:
/// SQLite's count of the rows the most recently completed statement changed), each still
/// deciding by its own conditional write. SQLite has no data-modifying CTE; the batch is one
/// call to the connection's worker (`dlock_db::sqlite_batch`). Each placeholder once, in
/// order: mark (`$1` account, `$2` token, `$3` instant), intent (`$1`..`$9`: submission,
/// payout, account, token, owner, key, amount, currency, instant), transition (`$1`
/// instant, `$2` payout).
/// `gated`: the mark writes only when the payout's terms are the body's (`$4`..`$8`: payout,
/// account, amount, currency, beneficiary), as [`pg_admit_sql`]'s `gate`; the writer's lock
/// is held from the batch's first statement, so the terms it reads are the newest.
fn sqlite_admit_statements(gated: bool) -> [(String, usize); 3] {
    let from = payout::sql_states(&payout::sources(PayoutState::Submitted, Actor::RailProxy));
    let (values, mark_binds) = if gated {
        (
            "SELECT $1, $2, $3 WHERE EXISTS (SELECT 1 FROM payouts WHERE payout_id = $4 AND account_id = $5 \
             AND amount_minor = $6 AND currency = $7 AND beneficiary_ref = $8)",
            8,
        )
    } else {
        ("VALUES ($1, $2, $3)", 3)
    };
    [
        (
            format!(
                "INSERT INTO rail_high_water (account_id, highest_token, updated_at) {values} \
                 ON CONFLICT (account_id) DO UPDATE \
                 SET highest_token = EXCLUDED.highest_token, updated_at = EXCLUDED.updated_at \
                 WHERE rail_high_water.highest_token < EXCLUDED.highest_token \
                 RETURNING highest_token"
            ),
            mark_binds,
        ),
        (
            format!(
                "INSERT INTO rail_submission (submission_id, payout_id, account_id, presented_token, owner_id, \
                 idempotency_key, amount_minor, currency, outcome, submitted_at) \
                 SELECT $1, $2, $3, $4, $5, $6, $7, $8, NULL, $9 WHERE changes() = 1 \
                 ON CONFLICT (payout_id) WHERE {FORWARDABLE} DO NOTHING \
                 RETURNING submission_id"
            ),
            9,
        ),
        (
            format!(
                "UPDATE payouts SET state = 'SUBMITTED', attempt_count = attempt_count + 1, updated_at = $1 \
                 WHERE payout_id = $2 AND state IN {from} AND changes() = 1"
            ),
            2,
        ),
    ]
}

/// [`sqlite_admit_statements`] as one batch's text (`dlock_db::sqlite_batch_sql`), built
/// once per process and form (every admission sends one).
fn sqlite_admit_batch_sql(gated: bool) -> &'static str {
    static SQL: [std::sync::OnceLock<String>; 2] = [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    SQL[usize::from(gated)].get_or_init(|| {
        let [mark, intent, moved] = sqlite_admit_statements(gated);
        dlock_db::sqlite_batch_sql(&[(&mark.0, mark.1), (&intent.0, intent.1), (&moved.0, moved.1)])
    })
}

/// The resolution on SQLite, as one batch of two statements in one transaction: the outcome
/// on the attempt still unresolved (`$1`..`$5`: outcome, detail, reference, instant,
/// submission), then its payout out of SUBMITTED only if that wrote (`changes() = 1`; `$1`
/// state, `$2` instant, `$3` submission).
fn sqlite_resolve_statements(to: PayoutState) -> [(String, usize); 2] {
    let from = payout::sql_states(&payout::sources(to, Actor::RailProxy));
    [
        (
            "UPDATE rail_submission SET outcome = $1, outcome_detail = $2, rail_reference = $3, resolved_at = $4 \
             WHERE submission_id = $5 AND outcome IS NULL"
                .to_owned(),
            5,
        ),
        (
            format!(
                "UPDATE payouts SET state = $1, updated_at = $2 \
                 WHERE payout_id = (SELECT payout_id FROM rail_submission WHERE submission_id = $3) \
                 AND state IN {from} AND changes() = 1"
            ),
            3,
        ),
    ]
}

/// The payout as the proxy reads it ([`PayoutRow`]).
const PAYOUT_SQL: &str = "SELECT payout_id, account_id, amount_minor, currency, beneficiary_ref, state, attempt_count \
     FROM payouts WHERE payout_id = $1";

/// A row of [`PAYOUT_SQL`].
fn payout_row<R: Row>(r: &R) -> Result<PayoutRow, StoreError>
where
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'v> String: sqlx::Decode<'v, R::Database> + sqlx::Type<R::Database>,
    for<'v> i64: sqlx::Decode<'v, R::Database> + sqlx::Type<R::Database>,
    for<'v> i32: sqlx::Decode<'v, R::Database> + sqlx::Type<R::Database>,
{
    Ok(PayoutRow {
        payout_id: parse_uuid(&r.try_get::<String, _>("payout_id").map_err(db_error)?)?,
        account_id: r.try_get("account_id").map_err(db_error)?,
        amount_minor: r.try_get("amount_minor").map_err(db_error)?,
        currency: r.try_get("currency").map_err(db_error)?,
        beneficiary_ref: r.try_get("beneficiary_ref").map_err(db_error)?,
        state: parse_state(&r.try_get::<String, _>("state").map_err(db_error)?)?,
        attempt_count: r.try_get("attempt_count").map_err(db_error)?,
    })
}

/// Binds an attempt's intent row in its statements' order: submission, payout, account,
/// token, owner, key, amount, currency, instant.
macro_rules! bind_intent {
    ($query:expr, $a:expr) => {
        $query
            .bind($a.submission_id.to_string())
            .bind($a.payout_id.to_string())
            .bind($a.account_id.clone())
            .bind($a.presented_token)
            .bind($a.owner_id.clone())
            .bind($a.idempotency_key.clone())
            .bind($a.amount_minor)
            .bind($a.currency.clone())
            .bind($a.at)
    };
}

/// What steps 1-3 wrote: the mark they advanced to, whether the intent was inserted,
/// whether the payout moved.
type AdmitParts = (Option<i64>, bool, bool);

/// PostgreSQL: steps 1-3 and the resolution as single statements.
impl PgRailStore {
    async fn admit_parts(
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        a: &Attempt,
        gate: Option<&str>,
    ) -> Result<AdmitParts, StoreError> {
        let query = bind_intent!(sqlx::query(pg_admit_sql(gate.is_some())), a);
        let query = match gate {
            Some(beneficiary_ref) => query.bind(beneficiary_ref.to_owned()),
            None => query,
        };
        let row = query.fetch_one(&mut **tx).await.map_err(db_error)?;
        Ok((
            row.try_get("marked").map_err(db_error)?,
            row.try_get("claimed").map_err(db_error)?,
            row.try_get("moved").map_err(db_error)?,
        ))
    }

    /// One autocommitted statement ([`pg_resolve_sql`]).
    async fn resolve_once(
        conn: &mut sqlx::PgConnection,
        submission_id: Uuid,
        r: &Resolution,
        at: DateTime<Utc>,
    ) -> Result<(), (sqlx::Error, Stage)> {
        sqlx::query(&pg_resolve_sql(r.payout_state()))
            .bind(submission_id.to_string())
            .bind(r.outcome().as_str())
            .bind(r.detail().map(str::to_owned))
            .bind(r.rail_reference().map(str::to_owned))
            .bind(at)
            .bind(r.payout_state().as_str())
            .execute(&mut *conn)
            .await
            // Autocommitted: a lost answer may have committed.
            .map_err(|e| (e, Stage::Commit))?;
        Ok(())
    }
}

/// SQLite: steps 1-3 and the resolution as batches ([`sqlite_admit_statements`],
/// [`sqlite_resolve_statements`]).
impl SqliteRailStore {
    async fn admit_parts(
        tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        a: &Attempt,
        gate: Option<&str>,
    ) -> Result<AdmitParts, StoreError> {
        let query = sqlx::query(sqlite_admit_batch_sql(gate.is_some()))
            .bind(a.account_id.clone())
            .bind(a.presented_token)
            .bind(a.at);
        let query = match gate {
            Some(beneficiary_ref) => query
                .bind(a.payout_id.to_string())
                .bind(a.account_id.clone())
                .bind(a.amount_minor)
                .bind(a.currency.clone())
                .bind(beneficiary_ref.to_owned()),
            None => query,
        };
        let query = bind_intent!(query, a).bind(a.at).bind(a.payout_id.to_string());
        let parts = dlock_db::sqlite_batch(tx, query, 3).await.map_err(db_error)?;
        let marked = match parts[0].rows.first() {
            Some(r) => Some(r.try_get::<i64, _>("highest_token").map_err(db_error)?),
            None => None,
        };
        Ok((marked, !parts[1].rows.is_empty(), parts[2].rows_affected == 1))
    }

    /// One transaction of one batch ([`sqlite_resolve_statements`]).
    async fn resolve_once(
        conn: &mut sqlx::SqliteConnection,
        submission_id: Uuid,
        r: &Resolution,
        at: DateTime<Utc>,
    ) -> Result<(), (sqlx::Error, Stage)> {
        use sqlx::Connection;
        let statement = |e| (e, Stage::Statement);
        let mut tx = conn.begin().await.map_err(statement)?;
        let [outcome, moved] = sqlite_resolve_statements(r.payout_state());
        let q = dlock_db::sqlite_batch_sql(&[(&outcome.0, outcome.1), (&moved.0, moved.1)]);
        let query = sqlx::query(&q)
            .bind(r.outcome().as_str())
            .bind(r.detail().map(str::to_owned))
            .bind(r.rail_reference().map(str::to_owned))
            .bind(at)
            .bind(submission_id.to_string())
            .bind(r.payout_state().as_str())
            .bind(at)
            .bind(submission_id.to_string());
        dlock_db::sqlite_batch(&mut tx, query, 2).await.map_err(statement)?;
        tx.commit().await.map_err(|e| (e, Stage::Commit))
    }
}

macro_rules! sql_rail_store {
    ($store:ty, $db:ty, $sql:path, $paydb:ident) => {
        impl $store {
            /// One try of [`RailStore::resolve`] on `conn`: one autocommitted statement on
            /// PostgreSQL, one transaction of one batch on SQLite (`resolve_once`).
            async fn resolve_on(
                conn: &mut <$db as sqlx::Database>::Connection,
                submission_id: Uuid,
                r: &Resolution,
                at: DateTime<Utc>,
            ) -> Result<(), (sqlx::Error, Stage)> {
                Self::resolve_once(conn, submission_id, r, at).await
            }

            /// How far the writes of steps 1-3 got, from what their parts wrote.
            fn admit_step(a: &Attempt, parts: AdmitParts) -> Result<AdmitStep, StoreError> {
                match parts {
                    (Some(to), _, _) if to != a.presented_token => {
                        Err(StoreError::Corrupt(format!("rail_high_water advanced to {to}")))
                    }
                    (None, false, false) => Ok(AdmitStep::MarkRefused),
                    (Some(_), false, false) => Ok(AdmitStep::SlotTaken),
                    (Some(_), true, false) => Ok(AdmitStep::NotMoved),
                    (Some(_), true, true) => Ok(AdmitStep::Moved),
                    // Each part runs only when the one before it wrote.
                    (m, c, v) => Err(StoreError::Corrupt(format!(
                        "admission parts out of order: marked {m:?}, claimed {c}, moved {v}"
                    ))),
                }
            }

            /// The payout, read inside a transaction.
            async fn payout_in(
                tx: &mut sqlx::Transaction<'static, $db>,
                payout_id: Uuid,
            ) -> Result<Option<PayoutRow>, StoreError> {
                let q = $sql(PAYOUT_SQL);
                let row = sqlx::query(&q).bind(payout_id.to_string()).fetch_optional(&mut **tx).await.map_err(db_error)?;
                row.map(|r| payout_row(&r)).transpose()
            }

            /// The end of an admission whose writes of steps 1-3 got as far as `step`: a
            /// refusal is classified (and its row written) in the same transaction.
            async fn finish_admission(
                &self,
                mut tx: sqlx::Transaction<'static, $db>,
                a: &Attempt,
                step: AdmitStep,
            ) -> Result<Admission, StoreError> {
                let insert_row = $sql(
                    "INSERT INTO rail_submission (submission_id, payout_id, account_id, presented_token, owner_id, \
                     idempotency_key, amount_minor, currency, outcome, submitted_at, resolved_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10)",
                );
                let refused_row = |outcome: SubmissionOutcome| {
                    sqlx::query(&insert_row)
                        .bind(a.submission_id.to_string())
                        .bind(a.payout_id.to_string())
                        .bind(a.account_id.clone())
                        .bind(a.presented_token)
                        .bind(a.owner_id.clone())
                        .bind(a.idempotency_key.clone())
                        .bind(a.amount_minor)
                        .bind(a.currency.clone())
                        .bind(outcome.as_str())
                        .bind(a.at)
                };
                match step {
                    AdmitStep::MarkRefused => {
                        let q = $sql("SELECT highest_token FROM rail_high_water WHERE account_id = $1");
                        let highest: i64 = sqlx::query(&q)
                            .bind(a.account_id.clone())
                            .fetch_one(&mut *tx)
                            .await
                            .and_then(|r| r.try_get("highest_token"))
                            .map_err(db_error)?;
                        // The mark it left must refuse the token by the rule too.
                        let MarkVerdict::Fenced { highest_token } =
                            admission::mark_verdict(true, Some(highest), a.presented_token)
                        else {
                            return Err(StoreError::Corrupt(format!(
                                "rail_high_water {highest} refused token {} the fence rule passes",
                                a.presented_token
                            )));
                        };
                        refused_row(SubmissionOutcome::Fenced).execute(&mut *tx).await.map_err(db_error)?;
                        tx.commit().await.map_err(commit_error)?;
                        Ok(Admission::Fenced { highest_token })
                    }
                    AdmitStep::SlotTaken => {
                        let q = $sql(&format!(
                            "SELECT submission_id, submitted_at FROM rail_submission \
                             WHERE payout_id = $1 AND ({FORWARDABLE})"
                        ))
                        .into_owned();
                        let first = sqlx::query(&q)
                            .bind(a.payout_id.to_string())
                            .fetch_one(&mut *tx)
                            .await
                            .map_err(db_error)?;
                        let first_submission_id =
                            parse_uuid(&first.try_get::<String, _>("submission_id").map_err(db_error)?)?;
                        let first_submitted_at: DateTime<Utc> = first.try_get("submitted_at").map_err(db_error)?;
                        refused_row(SubmissionOutcome::Duplicate).execute(&mut *tx).await.map_err(db_error)?;
                        tx.commit().await.map_err(commit_error)?;
                        Ok(Admission::Duplicate { first_submitted_at, first_submission_id })
                    }
                    AdmitStep::NotMoved => {
                        let q = $sql("SELECT state FROM payouts WHERE payout_id = $1");
                        let state: String = sqlx::query(&q)
                            .bind(a.payout_id.to_string())
                            .fetch_one(&mut *tx)
                            .await
                            .and_then(|r| r.try_get("state"))
                            .map_err(db_error)?;
                        tx.rollback().await.map_err(db_error)?;
                        // The conditional write refused: the payout was not in a state the proxy
                        // may submit from when it looked (the state read now is evidence only).
                        Ok(Admission::NotClaimable { state: parse_state(&state)? })
                    }
                    AdmitStep::Moved => {
                        tx.commit().await.map_err(commit_error)?;
                        Ok(Admission::Admitted { submitted_at: a.at })
                    }
                }
            }
        }

        #[async_trait]
        impl RailStore for $store {
            fn pool_stats(&self) -> Option<dlock_http::metrics::PoolStats> {
                let idle = u32::try_from(self.pool.num_idle()).unwrap_or(u32::MAX);
                Some(dlock_http::metrics::PoolStats { size: self.pool.size(), idle })
            }

            fn writer_thread(&self) -> Option<dlock_rt::dedicated::WriterThread> {
                self.writer()
            }

            async fn ping(&self) -> Result<(), StoreError> {
                sqlx::query("SELECT 1").execute(&self.pool).await.map(|_| ()).map_err(db_error)
            }

            async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutRow>, StoreError> {
                let q = $sql(PAYOUT_SQL);
                let row = sqlx::query(&q)
                    .bind(payout_id.to_string())
                    .fetch_optional(&self.read_pool)
                    .await
                    .map_err(db_error)?;
                row.map(|r| payout_row(&r)).transpose()
            }

            async fn admit_checked(&self, asked: &Unstamped, stamp: Stamp<'_>) -> Result<Checked, StoreError> {
                if !asked.fencing_enabled {
                    // `--profile unsafe-test` only: the read, then the statements one by one.
                    return crate::store::read_then_admit(self, asked, stamp).await;
                }
                let (submission_id, at) = stamp();
                let a = asked.stamped(submission_id, at);
                let mut tx = self.pool.begin().await.map_err(db_error)?;
                // Validation and steps 1-3 in one database call: the mark writes only when the
                // payout's terms are the body's (`gated`), and nothing after it runs unless it
                // wrote. No mark: the payout is read in the transaction to tell the two apart.
                let mut parts = Self::admit_parts(&mut tx, &a, Some(&asked.beneficiary_ref)).await?;
                if parts.0.is_none() {
                    let payout = Self::payout_in(&mut tx, a.payout_id).await?;
                    if !asked.matches(payout.as_ref()) {
                        tx.rollback().await.map_err(db_error)?;
                        return Ok(Checked::Unmatched(payout));
                    }
                    // The terms match, so the mark refused (or, on PostgreSQL, the statement's
                    // snapshot predates the payout): nothing was written; the parts run again
                    // ungated and decide.
                    parts = Self::admit_parts(&mut tx, &a, None).await?;
                }
                let step = Self::admit_step(&a, parts)?;
                let admission = self.finish_admission(tx, &a, step).await?;
                Ok(Checked::Decided { attempt: a, admission })
            }

            async fn admit(&self, a: &Attempt) -> Result<Admission, StoreError> {
                let mut tx = self.pool.begin().await.map_err(db_error)?;
                // Steps 1-3 in one database call: the data-modifying CTE of [`pg_admit_sql`]
                // on PostgreSQL, the chained batch of [`sqlite_admit_statements`] on SQLite,
                // whose parts run in the order their guards chain them.
                if a.fencing_enabled {
                    let step = Self::admit_step(a, Self::admit_parts(&mut tx, a, None).await?)?;
                    return self.finish_admission(tx, a, step).await;
                }

                // Fencing off (`--profile unsafe-test` only): steps 2-3, statement by
                // statement.
                // Step 2: the unique index decides; a conflict inserts nothing.
                let q = $sql(&format!(
                    "INSERT INTO rail_submission (submission_id, payout_id, account_id, presented_token, owner_id, \
                     idempotency_key, amount_minor, currency, outcome, submitted_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, NULL, $9) \
                     ON CONFLICT (payout_id) WHERE {FORWARDABLE} DO NOTHING \
                     RETURNING submission_id"
                ))
                .into_owned();
                let claimed = bind_intent!(sqlx::query(&q), a)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db_error)?;
                if claimed.is_none() {
                    return self.finish_admission(tx, a, AdmitStep::SlotTaken).await;
                }

                // Step 3: CLAIMED -> SUBMITTED in the same transaction, or roll back everything.
                // The source states C2 allows the proxy's submit from (CLAIMED).
                let from = payout::sql_states(&payout::sources(PayoutState::Submitted, Actor::RailProxy));
                let q = $sql(&format!(
                    "UPDATE payouts SET state = 'SUBMITTED', attempt_count = attempt_count + 1, updated_at = $2 \
                     WHERE payout_id = $1 AND state IN {from}"
                ))
                .into_owned();
                let moved = sqlx::query(&q)
                    .bind(a.payout_id.to_string())
                    .bind(a.at)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_error)?
                    .rows_affected();
                let step = if moved == 1 { AdmitStep::Moved } else { AdmitStep::NotMoved };
                self.finish_admission(tx, a, step).await
            }

            async fn resolve(&self, submission_id: Uuid, r: &Resolution, at: DateTime<Utc>) -> Result<(), StoreError> {
                // Recording an outcome writes only an attempt still unresolved, so trying it
                // again after a lost connection (this one was handed out unpinged) cannot
                // record a second outcome: the retry runs on a connection that answered a ping.
                let mut conn = self.pool.acquire().await.map_err(db_error)?;
                let first = Self::resolve_on(&mut conn, submission_id, r, at).await;
                drop(conn);
                let Err((e, stage)) = first else { return Ok(()) };
                if !dlock_db::is_connection_lost(&e) {
                    return Err(stage.classify(e));
                }
                tracing::warn!(submissionId = %submission_id, cause = %dlock_db::describe(&e),
                    "rail_resolve_connection_lost_retrying");
                let mut conn = dlock_db::live_connection(&self.pool).await.map_err(db_error)?;
                Self::resolve_on(&mut *conn, submission_id, r, at).await.map_err(|(e, stage)| stage.classify(e))
            }

            async fn unresolved_before(&self, before: DateTime<Utc>, limit: i64) -> Result<Vec<Uuid>, StoreError> {
                let q = $sql(
                    "SELECT submission_id FROM rail_submission WHERE outcome IS NULL AND submitted_at < $1 \
                     ORDER BY submitted_at LIMIT $2",
                );
                let rows = sqlx::query(&q).bind(before).bind(limit).fetch_all(&self.read_pool).await.map_err(db_error)?;
                rows.iter()
                    .map(|r| r.try_get::<String, _>("submission_id").map_err(db_error).and_then(|s| parse_uuid(&s)))
                    .collect()
            }

            async fn high_water(&self, account_id: &str) -> Result<Option<i64>, StoreError> {
                dlock_paydb::sql::$paydb::high_water(&self.read_pool, account_id).await
            }

            async fn submissions(&self, payout_id: Option<Uuid>) -> Result<Vec<SubmissionRow>, StoreError> {
                dlock_paydb::sql::$paydb::submissions(&self.read_pool, payout_id).await
            }

            async fn insert_payout(&self, p: &NewPayout, at: DateTime<Utc>) -> Result<(), StoreError> {
                // Every instant paydb stores is whole milliseconds (text order = time order).
                let at = dlock_contract::time::truncate_ms(at);
                let mut tx = self.pool.begin().await.map_err(db_error)?;
                // Payouts reference accounts: make sure the account exists (zero balance,
                // never fenced). A seeded payout bypasses the payment-resource's funds check.
                let q = $sql(
                    "INSERT INTO accounts (account_id, kind, currency, balance_minor, fence, created_at, updated_at) \
                     VALUES ($1, 'CUSTOMER', $2, 0, 0, $3, $3) ON CONFLICT (account_id) DO NOTHING",
                );
                sqlx::query(&q)
                    .bind(p.account_id.clone())
                    .bind(p.currency.clone())
                    .bind(at)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_error)?;
                let q = $sql(
                    "INSERT INTO payouts (payout_id, account_id, amount_minor, currency, beneficiary_ref, state, \
                     attempt_count, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, 0, $7, $7)",
                );
                sqlx::query(&q)
                    .bind(p.payout_id.to_string())
                    .bind(p.account_id.clone())
                    .bind(p.amount_minor)
                    .bind(p.currency.clone())
                    .bind(p.beneficiary_ref.clone())
                    .bind(p.state.as_str())
                    .bind(at)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_error)?;
                tx.commit().await.map_err(commit_error)
            }
        }
    };
}

sql_rail_store!(PgRailStore, sqlx::Postgres, pg_sql, pg);
sql_rail_store!(SqliteRailStore, sqlx::Sqlite, sqlite_sql, sqlite);
