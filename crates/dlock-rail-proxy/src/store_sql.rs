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

use crate::admission::{self, FirstAttempt, MarkVerdict};
use crate::store::{
    batch_answers, check_batch, validate_batch, validated_attempts, Admission, Attempt, Checked, EventRead, NewPayout,
    PayoutRow, RailStore, Resolution, Stamp, StoreError, SubmissionRow, Unstamped,
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
    /// The event outbox's reader (C3-extensions E-20): it remembers the hole it waits on.
    events: std::sync::Arc<dlock_paydb::events::sql::PgEventReader>,
}

impl PgRailStore {
    pub async fn open(url: &str) -> Result<PgRailStore, StoreError> {
        let pool = dlock_db::pg_pool(url).await.map_err(db_error)?;
        PG_MIGRATOR.run(&pool).await.map_err(|e| StoreError::Unavailable(format!("migrate: {e}")))?;
        Ok(PgRailStore { read_pool: pool.clone(), pool, events: Default::default() })
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
    /// The process's SQLite writer thread (`dlock_db::sqlite_writer_thread`,
    /// docs/performance.md "The SQLite writer thread").
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
/// snapshot before a wait (the hazard in docs/performance.md "Checks no cut may remove")
/// changes no decision. A refusal is classified after it, by statements of their own
/// (refusals only).
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

/// The payout states a resolution moves a SUBMITTED payout to ([`Resolution::payout_state`]
/// of each outcome; a test holds the list to it).
const RESOLUTION_TARGETS: [PayoutState; 4] =
    [PayoutState::RailAcked, PayoutState::Failed, PayoutState::RailAmbiguous, PayoutState::Claimed];

/// One SQL condition: the payout in `state` may move to the row's `target` by C2's rule for
/// the proxy (`target` is one of [`RESOLUTION_TARGETS`]), so that one statement moves every
/// payout of a batch by its own outcome's rule, as `state IN {sources}` moves one.
fn resolution_moves_sql(target: &str, state: &str) -> String {
    let arms: Vec<String> = RESOLUTION_TARGETS
        .iter()
        .map(|to| {
            let from = payout::sql_states(&payout::sources(*to, Actor::RailProxy));
            format!("({target} = '{}' AND {state} IN {from})", to.as_str())
        })
        .collect();
    format!("({})", arms.join(" OR "))
}

/// Every resolution of a batch as one PostgreSQL statement, autocommitted: each outcome on
/// its attempt still unresolved (`resolved`: the conditional write decides, on the newest
/// row version), and each payout whose attempt it wrote out of SUBMITTED by its outcome's
/// rule. Arrays `$1`..`$5` (submission, target state, outcome, detail, reference), `$6`
/// the instant. The single resolution is a batch of one. Built once per process.
fn pg_resolve_batch_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        let moves = resolution_moves_sql("resolved.target", "payouts.state");
        format!(
            "WITH i AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) \
               AS i(submission_id, target, outcome, detail, reference)), \
             resolved AS ( \
               UPDATE rail_submission SET outcome = i.outcome, outcome_detail = i.detail, \
               rail_reference = i.reference, resolved_at = $6::timestamptz \
               FROM i WHERE rail_submission.submission_id = i.submission_id AND rail_submission.outcome IS NULL \
               RETURNING rail_submission.payout_id, i.target) \
             UPDATE payouts SET state = resolved.target, updated_at = $6::timestamptz FROM resolved \
             WHERE payouts.payout_id = resolved.payout_id AND {moves}"
        )
    })
}

/// Every resolution of a batch on SQLite, in one transaction (the writer's lock held from
/// the first statement), outcome by outcome as [`pg_resolve_batch_sql`] writes them, so
/// that paydb's triggers write the same events in the same order (each `rail.outcome`, then
/// its payout's `payout.state_changed`): [`SQLITE_RECORD_OUTCOMES_SQL`], the outcome on its
/// attempt still unresolved, answering whether it wrote; then, only if it did,
/// [`sqlite_move_resolved_sql`], the payout out of SUBMITTED by its outcome's rule. So a
/// payout moves exactly when its outcome is recorded. `$1` the instant, `$2` the row as JSON
/// (`[[submission, target state, outcome, detail, reference]]`), in each statement.
const SQLITE_RECORD_OUTCOMES_SQL: &str =
    "UPDATE rail_submission SET outcome = i.value ->> 2, outcome_detail = i.value ->> 3, \
     rail_reference = i.value ->> 4, resolved_at = $1 FROM json_each($2) AS i \
     WHERE rail_submission.submission_id = i.value ->> 0 AND rail_submission.outcome IS NULL \
     RETURNING rail_submission.submission_id";

/// The second statement of a resolution on SQLite ([`SQLITE_RECORD_OUTCOMES_SQL`]): the
/// payout of the attempt the first recorded. Built once per process.
fn sqlite_move_resolved_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        let moves = resolution_moves_sql("(i.value ->> 1)", "payouts.state");
        let moved = format!(
            "UPDATE payouts SET state = i.value ->> 1, updated_at = $1 \
             FROM json_each($2) AS i JOIN rail_submission AS s ON s.submission_id = i.value ->> 0 \
             WHERE payouts.payout_id = s.payout_id AND {moves}"
        );
        sqlite_sql(&moved).into_owned()
    })
}

/// C-11's conditional upsert of the mark, as a batch's one fence pass writes it.
const MARK_UPSERT: &str = "ON CONFLICT (account_id) DO UPDATE \
     SET highest_token = EXCLUDED.highest_token, updated_at = EXCLUDED.updated_at \
     WHERE rail_high_water.highest_token < EXCLUDED.highest_token RETURNING highest_token";

/// A batch's steps 1-3 as one PostgreSQL statement (C3-extensions E-19), chained like
/// [`pg_admit_sql`]'s parts and deciding by the same conditional writes: `mark` once for
/// the batch (C-11's upsert); `intent`, every validated payout's intent row, only when the
/// mark wrote, each admitted or not by the unique index (`ON CONFLICT DO NOTHING`, per
/// row); `moved`, CLAIMED -> SUBMITTED of each payout whose intent was inserted, by an
/// `UPDATE` that re-checks its `WHERE` on the newest row version. It answers the mark it
/// wrote and the payouts each part wrote. `$1` account, `$2` token, `$3` owner, arrays `$4`..
/// `$9` (submission, payout, key, amount, currency, instant), `$10` the mark's instant.
/// `fenced = false` (`--profile unsafe-test`): no `mark` part, no `$10`. The text does not
/// vary with the batch's size; built once per process and form.
fn pg_batch_parts_sql(fenced: bool) -> &'static str {
    static SQL: [std::sync::OnceLock<String>; 2] = [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    SQL[usize::from(fenced)].get_or_init(|| {
        let from = payout::sql_states(&payout::sources(PayoutState::Submitted, Actor::RailProxy));
        let (mark, gate, marked) = if fenced {
            (
                format!(
                    "mark AS (INSERT INTO rail_high_water (account_id, highest_token, updated_at) \
                     VALUES ($1::text, $2::bigint, $10::timestamptz) {MARK_UPSERT}), "
                ),
                " WHERE EXISTS (SELECT 1 FROM mark)",
                "(SELECT highest_token FROM mark)",
            )
        } else {
            (String::new(), "", "NULL::bigint")
        };
        format!(
            "WITH i AS (SELECT * FROM unnest($4::text[], $5::text[], $6::text[], $7::int8[], $8::text[], \
               $9::timestamptz[]) AS i(submission_id, payout_id, idempotency_key, amount_minor, currency, submitted_at)), \
             {mark}\
             intent AS ( \
               INSERT INTO rail_submission (submission_id, payout_id, account_id, presented_token, owner_id, \
               idempotency_key, amount_minor, currency, outcome, submitted_at) \
               SELECT i.submission_id, i.payout_id, $1::text, $2::bigint, $3::text, i.idempotency_key, \
               i.amount_minor, i.currency, NULL, i.submitted_at FROM i{gate} \
               ON CONFLICT (payout_id) WHERE {FORWARDABLE} DO NOTHING \
               RETURNING payout_id, submitted_at), \
             moved AS ( \
               UPDATE payouts SET state = 'SUBMITTED', attempt_count = payouts.attempt_count + 1, \
               updated_at = intent.submitted_at FROM intent \
               WHERE payouts.payout_id = intent.payout_id AND payouts.state IN {from} \
               RETURNING payouts.payout_id) \
             SELECT {marked} AS marked, ARRAY(SELECT payout_id FROM intent) AS claimed, \
                    ARRAY(SELECT payout_id FROM moved) AS moved"
        )
    })
}

/// A batch's steps 1-3 on SQLite, as one batch of statements chained like
/// [`sqlite_admit_statements`]: the mark once (`$1` account, `$2` token, `$3` instant);
/// every intent row only when it wrote (`changes() = 1`), each admitted or not by the unique
/// index (`$1` account, `$2` token, `$3` owner, `$4` the rows as JSON: `[submission, payout,
/// key, amount, currency, instant]`); CLAIMED -> SUBMITTED of each payout whose intent this
/// batch inserted (`$1` the same JSON). `fenced = false`: no mark statement. The text does
/// not vary with the batch's size; built once per process and form.
fn sqlite_batch_parts_sql(fenced: bool) -> &'static str {
    static SQL: [std::sync::OnceLock<String>; 2] = [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    SQL[usize::from(fenced)].get_or_init(|| {
        let from = payout::sql_states(&payout::sources(PayoutState::Submitted, Actor::RailProxy));
        let mark = format!(
            "INSERT INTO rail_high_water (account_id, highest_token, updated_at) VALUES ($1, $2, $3) {MARK_UPSERT}"
        );
        let gate = if fenced { "changes() = 1" } else { "true" };
        let intent = format!(
            "INSERT INTO rail_submission (submission_id, payout_id, account_id, presented_token, owner_id, \
             idempotency_key, amount_minor, currency, outcome, submitted_at) \
             SELECT i.value ->> 0, i.value ->> 1, $1, $2, $3, i.value ->> 2, i.value ->> 3, i.value ->> 4, NULL, \
             i.value ->> 5 FROM json_each($4) AS i WHERE {gate} \
             ON CONFLICT (payout_id) WHERE {FORWARDABLE} DO NOTHING RETURNING payout_id"
        );
        let moved = format!(
            "UPDATE payouts SET state = 'SUBMITTED', attempt_count = payouts.attempt_count + 1, \
             updated_at = s.submitted_at FROM rail_submission AS s \
             WHERE s.payout_id = payouts.payout_id \
             AND s.submission_id IN (SELECT i.value ->> 0 FROM json_each($1) AS i) \
             AND payouts.state IN {from} RETURNING payouts.payout_id"
        );
        if fenced {
            dlock_db::sqlite_batch_sql(&[(&mark, 3), (&intent, 4), (&moved, 1)])
        } else {
            dlock_db::sqlite_batch_sql(&[(&intent, 4), (&moved, 1)])
        }
    })
}

/// The refused rows of a batch (FENCED or DUPLICATE), resolved as they are written, as one
/// PostgreSQL statement: `$1` account, `$2` token, `$3` owner, arrays `$4`..`$10`
/// (submission, payout, key, amount, currency, instant, outcome).
const PG_REFUSED_ROWS_SQL: &str =
    "INSERT INTO rail_submission (submission_id, payout_id, account_id, presented_token, owner_id, \
     idempotency_key, amount_minor, currency, outcome, submitted_at, resolved_at) \
     SELECT i.submission_id, i.payout_id, $1::text, $2::bigint, $3::text, i.idempotency_key, i.amount_minor, \
     i.currency, i.outcome, i.submitted_at, i.submitted_at \
     FROM unnest($4::text[], $5::text[], $6::text[], $7::int8[], $8::text[], $9::timestamptz[], $10::text[]) \
     AS i(submission_id, payout_id, idempotency_key, amount_minor, currency, submitted_at, outcome)";

/// [`PG_REFUSED_ROWS_SQL`] on SQLite: `$4` the rows as JSON (`[submission, payout, key,
/// amount, currency, instant, outcome]`).
const SQLITE_REFUSED_ROWS_SQL: &str =
    "INSERT INTO rail_submission (submission_id, payout_id, account_id, presented_token, owner_id, \
     idempotency_key, amount_minor, currency, outcome, submitted_at, resolved_at) \
     SELECT i.value ->> 0, i.value ->> 1, $1, $2, $3, i.value ->> 2, i.value ->> 3, i.value ->> 4, \
     i.value ->> 6, i.value ->> 5, i.value ->> 5 FROM json_each($4) AS i";

/// An instant as sqlx writes a bound `DateTime<Utc>` into SQLite (`sqlx-sqlite`'s encoding:
/// RFC 3339, `AutoSi` fractions, `+00:00`), for the instants a batch carries inside its JSON:
/// paydb compares instants as text, so they must be the very text a bound instant writes (a
/// test holds the two together).
fn sqlite_instant(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, false)
}

/// Ids as a JSON array of strings (SQLite's `json_each` set).
fn json_ids(ids: &[Uuid]) -> String {
    serde_json::Value::Array(ids.iter().map(|i| serde_json::Value::String(i.to_string())).collect()).to_string()
}

/// A batch's attempt rows as JSON arrays (SQLite): `[submission, payout, key, amount,
/// currency, instant]`, and the outcome last when one is given.
fn json_rows(attempts: &[&Attempt], outcomes: Option<&[SubmissionOutcome]>) -> String {
    let rows: Vec<serde_json::Value> = attempts
        .iter()
        .enumerate()
        .map(|(k, a)| {
            let mut row = vec![
                a.submission_id.to_string().into(),
                a.payout_id.to_string().into(),
                a.idempotency_key.clone().into(),
                a.amount_minor.into(),
                a.currency.clone().into(),
                sqlite_instant(a.at).into(),
            ];
            if let Some(o) = outcomes.and_then(|o| o.get(k)) {
                row.push(o.as_str().into());
            }
            serde_json::Value::Array(row)
        })
        .collect();
    serde_json::Value::Array(rows).to_string()
}

/// A batch's resolutions as JSON arrays (SQLite): `[submission, target state, outcome,
/// detail, reference]`.
fn json_resolutions(outcomes: &[(Uuid, Resolution)]) -> String {
    let rows: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|(id, r)| {
            serde_json::json!([
                id.to_string(),
                r.payout_state().as_str(),
                r.outcome().as_str(),
                r.detail(),
                r.rail_reference()
            ])
        })
        .collect();
    serde_json::Value::Array(rows).to_string()
}

/// What a batch's steps 1-3 wrote: the mark they advanced to, the payouts whose intent was
/// inserted, the payouts that moved to SUBMITTED.
#[derive(Debug, Default)]
struct BatchParts {
    marked: Option<i64>,
    claimed: std::collections::BTreeSet<Uuid>,
    moved: std::collections::BTreeSet<Uuid>,
}

/// Payout ids read back as text.
fn uuid_set(raw: impl IntoIterator<Item = String>) -> Result<std::collections::BTreeSet<Uuid>, StoreError> {
    raw.into_iter().map(|r| parse_uuid(&r)).collect()
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

    /// Every resolution of a batch, one autocommitted statement ([`pg_resolve_batch_sql`]).
    async fn resolve_batch_once(
        conn: &mut sqlx::PgConnection,
        outcomes: &[(Uuid, Resolution)],
        at: DateTime<Utc>,
    ) -> Result<(), (sqlx::Error, Stage)> {
        let column = |f: &dyn Fn(&(Uuid, Resolution)) -> Option<String>| -> Vec<Option<String>> {
            outcomes.iter().map(f).collect()
        };
        sqlx::query(pg_resolve_batch_sql())
            .bind(column(&|(id, _)| Some(id.to_string())))
            .bind(column(&|(_, r)| Some(r.payout_state().as_str().to_owned())))
            .bind(column(&|(_, r)| Some(r.outcome().as_str().to_owned())))
            .bind(column(&|(_, r)| r.detail().map(str::to_owned)))
            .bind(column(&|(_, r)| r.rail_reference().map(str::to_owned)))
            .bind(at)
            .execute(&mut *conn)
            .await
            // Autocommitted: a lost answer may have committed.
            .map_err(|e| (e, Stage::Commit))?;
        Ok(())
    }

    /// The SQL of "`column` is one of the ids bound at `$1`".
    fn id_in(column: &str) -> String {
        format!("{column} = ANY($1)")
    }

    /// The SQL of "the event's `submissionId` is one of the ids bound at `$2`".
    fn event_submission_in() -> &'static str {
        "(body::jsonb ->> 'submissionId') = ANY($2)"
    }

    fn bind_submissions<'q>(
        query: sqlx::query::Query<'q, sqlx::Postgres, <sqlx::Postgres as sqlx::Database>::Arguments<'q>>,
        ids: &[Uuid],
    ) -> sqlx::query::Query<'q, sqlx::Postgres, <sqlx::Postgres as sqlx::Database>::Arguments<'q>> {
        query.bind(ids.iter().map(Uuid::to_string).collect::<Vec<String>>())
    }

    /// The event outbox, through the store's one [`dlock_paydb::events::sql::PgEventReader`].
    async fn read_event_page(&self, after: i64, limit: usize) -> Result<EventRead, StoreError> {
        self.events.read(&self.read_pool, after, limit).await
    }

    async fn read_final_event_page(&self, after: i64, upto: i64, limit: usize) -> Result<EventRead, StoreError> {
        dlock_paydb::events::sql::pg_read_final(&self.read_pool, after, upto, limit).await
    }

    /// The deployment's cursor key ([`RailStore::cursor_secret`]).
    async fn secret(&self, candidate: [u8; 32], at: DateTime<Utc>) -> Result<[u8; 32], StoreError> {
        dlock_paydb::events::sql::pg_cursor_secret(&self.pool, candidate, dlock_contract::time::truncate_ms(at)).await
    }

    fn bind_ids<'q>(
        query: sqlx::query::Query<'q, sqlx::Postgres, <sqlx::Postgres as sqlx::Database>::Arguments<'q>>,
        ids: &[Uuid],
    ) -> sqlx::query::Query<'q, sqlx::Postgres, <sqlx::Postgres as sqlx::Database>::Arguments<'q>> {
        query.bind(ids.iter().map(Uuid::to_string).collect::<Vec<String>>())
    }

    /// Binds a batch's attempt rows as arrays: `$4`..`$9` of [`pg_batch_parts_sql`] and
    /// [`PG_REFUSED_ROWS_SQL`] (after the account, the token and the owner).
    fn bind_rows<'q>(
        query: sqlx::query::Query<'q, sqlx::Postgres, <sqlx::Postgres as sqlx::Database>::Arguments<'q>>,
        attempts: &[&Attempt],
    ) -> sqlx::query::Query<'q, sqlx::Postgres, <sqlx::Postgres as sqlx::Database>::Arguments<'q>> {
        let Some(first) = attempts.first() else { return query };
        query
            .bind(first.account_id.clone())
            .bind(first.presented_token)
            .bind(first.owner_id.clone())
            .bind(attempts.iter().map(|a| a.submission_id.to_string()).collect::<Vec<_>>())
            .bind(attempts.iter().map(|a| a.payout_id.to_string()).collect::<Vec<_>>())
            .bind(attempts.iter().map(|a| a.idempotency_key.clone()).collect::<Vec<_>>())
            .bind(attempts.iter().map(|a| a.amount_minor).collect::<Vec<_>>())
            .bind(attempts.iter().map(|a| a.currency.clone()).collect::<Vec<_>>())
            .bind(attempts.iter().map(|a| a.at).collect::<Vec<_>>())
    }

    /// A batch's steps 1-3, one statement ([`pg_batch_parts_sql`]); the mark's instant is
    /// the first attempt's.
    async fn batch_parts(
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        attempts: &[&Attempt],
        fenced: bool,
    ) -> Result<BatchParts, StoreError> {
        let Some(first) = attempts.first() else { return Ok(BatchParts::default()) };
        let query = Self::bind_rows(sqlx::query(pg_batch_parts_sql(fenced)), attempts);
        let query = if fenced { query.bind(first.at) } else { query };
        let row = query.fetch_one(&mut **tx).await.map_err(db_error)?;
        Ok(BatchParts {
            marked: row.try_get("marked").map_err(db_error)?,
            claimed: uuid_set(row.try_get::<Vec<String>, _>("claimed").map_err(db_error)?)?,
            moved: uuid_set(row.try_get::<Vec<String>, _>("moved").map_err(db_error)?)?,
        })
    }

    /// Writes a batch's refused rows, one statement ([`PG_REFUSED_ROWS_SQL`]).
    async fn insert_refused(
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        attempts: &[&Attempt],
        outcomes: &[SubmissionOutcome],
    ) -> Result<u64, StoreError> {
        let query = Self::bind_rows(sqlx::query(PG_REFUSED_ROWS_SQL), attempts)
            .bind(outcomes.iter().map(|o| o.as_str().to_owned()).collect::<Vec<_>>());
        Ok(query.execute(&mut **tx).await.map_err(db_error)?.rows_affected())
    }
}

/// SQLite: steps 1-3 and the resolution as batches ([`sqlite_admit_statements`],
/// [`SQLITE_RECORD_OUTCOMES_SQL`]).
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

    /// Every resolution of a batch, one transaction: per outcome,
    /// [`SQLITE_RECORD_OUTCOMES_SQL`], then [`sqlite_move_resolved_sql`] if it recorded it.
    async fn resolve_batch_once(
        conn: &mut sqlx::SqliteConnection,
        outcomes: &[(Uuid, Resolution)],
        at: DateTime<Utc>,
    ) -> Result<(), (sqlx::Error, Stage)> {
        use sqlx::Connection;
        let statement = |e| (e, Stage::Statement);
        let mut tx = conn.begin().await.map_err(statement)?;
        let record = sqlite_sql(SQLITE_RECORD_OUTCOMES_SQL);
        for outcome in outcomes {
            let row = json_resolutions(std::slice::from_ref(outcome));
            let recorded: Option<String> = sqlx::query_scalar(&record)
                .bind(at)
                .bind(row.clone())
                .fetch_optional(&mut *tx)
                .await
                .map_err(statement)?;
            if recorded.is_some() {
                sqlx::query(sqlite_move_resolved_sql())
                    .bind(at)
                    .bind(row)
                    .execute(&mut *tx)
                    .await
                    .map_err(statement)?;
            }
        }
        tx.commit().await.map_err(|e| (e, Stage::Commit))
    }

    /// The SQL of "`column` is one of the ids bound at `$1`" (a JSON array).
    fn id_in(column: &str) -> String {
        format!("{column} IN (SELECT value FROM json_each($1))")
    }

    /// The SQL of "the event's `submissionId` is one of the ids bound at `$2`" (a JSON array).
    fn event_submission_in() -> &'static str {
        "(body ->> 'submissionId') IN (SELECT value FROM json_each($2))"
    }

    fn bind_submissions<'q>(
        query: sqlx::query::Query<'q, sqlx::Sqlite, <sqlx::Sqlite as sqlx::Database>::Arguments<'q>>,
        ids: &[Uuid],
    ) -> sqlx::query::Query<'q, sqlx::Sqlite, <sqlx::Sqlite as sqlx::Database>::Arguments<'q>> {
        query.bind(json_ids(ids))
    }

    /// The event outbox, off the writer connection (one writer: every committed seq is final).
    async fn read_event_page(&self, after: i64, limit: usize) -> Result<EventRead, StoreError> {
        dlock_paydb::events::sql::sqlite_read(&self.read_pool, after, limit).await
    }

    async fn read_final_event_page(&self, after: i64, upto: i64, limit: usize) -> Result<EventRead, StoreError> {
        Ok(dlock_paydb::events::sql::sqlite_read(&self.read_pool, after, limit).await?.clipped(after, upto, limit))
    }

    /// The deployment's cursor key ([`RailStore::cursor_secret`]).
    async fn secret(&self, candidate: [u8; 32], at: DateTime<Utc>) -> Result<[u8; 32], StoreError> {
        dlock_paydb::events::sql::sqlite_cursor_secret(&self.pool, candidate, dlock_contract::time::truncate_ms(at))
            .await
    }

    fn bind_ids<'q>(
        query: sqlx::query::Query<'q, sqlx::Sqlite, <sqlx::Sqlite as sqlx::Database>::Arguments<'q>>,
        ids: &[Uuid],
    ) -> sqlx::query::Query<'q, sqlx::Sqlite, <sqlx::Sqlite as sqlx::Database>::Arguments<'q>> {
        query.bind(json_ids(ids))
    }

    /// A batch's steps 1-3, one batch of statements ([`sqlite_batch_parts_sql`]); the mark's
    /// instant is the first attempt's.
    async fn batch_parts(
        tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        attempts: &[&Attempt],
        fenced: bool,
    ) -> Result<BatchParts, StoreError> {
        let Some(first) = attempts.first() else { return Ok(BatchParts::default()) };
        let rows = json_rows(attempts, None);
        let mut query = sqlx::query(sqlite_batch_parts_sql(fenced));
        if fenced {
            query = query.bind(first.account_id.clone()).bind(first.presented_token).bind(first.at);
        }
        let query = query
            .bind(first.account_id.clone())
            .bind(first.presented_token)
            .bind(first.owner_id.clone())
            .bind(rows.clone())
            .bind(rows);
        let statements = if fenced { 3 } else { 2 };
        let mut parts = dlock_db::sqlite_batch(tx, query, statements).await.map_err(db_error)?;
        let marked = if fenced {
            match parts.remove(0).rows.first() {
                Some(r) => Some(r.try_get::<i64, _>("highest_token").map_err(db_error)?),
                None => None,
            }
        } else {
            None
        };
        let returned = |part: &dlock_db::BatchPart| -> Result<Vec<String>, StoreError> {
            part.rows.iter().map(|r| r.try_get::<String, _>("payout_id").map_err(db_error)).collect()
        };
        Ok(BatchParts { marked, claimed: uuid_set(returned(&parts[0])?)?, moved: uuid_set(returned(&parts[1])?)? })
    }

    /// Writes a batch's refused rows, one statement ([`SQLITE_REFUSED_ROWS_SQL`]).
    async fn insert_refused(
        tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        attempts: &[&Attempt],
        outcomes: &[SubmissionOutcome],
    ) -> Result<u64, StoreError> {
        let Some(first) = attempts.first() else { return Ok(0) };
        let q = sqlite_sql(SQLITE_REFUSED_ROWS_SQL);
        let query = sqlx::query(&q)
            .bind(first.account_id.clone())
            .bind(first.presented_token)
            .bind(first.owner_id.clone())
            .bind(json_rows(attempts, Some(outcomes)));
        Ok(query.execute(&mut **tx).await.map_err(db_error)?.rows_affected())
    }
}

macro_rules! sql_rail_store {
    ($store:ty, $db:ty, $sql:path, $paydb:ident) => {
        impl $store {
            /// The payouts named by `ids` as the proxy reads them, by id: one statement,
            /// whose text does not vary with the number of ids. Built once per process.
            async fn payouts_by_id(
                conn: &mut <$db as sqlx::Database>::Connection,
                ids: &[Uuid],
            ) -> Result<std::collections::BTreeMap<Uuid, PayoutRow>, StoreError> {
                static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
                let q = SQL.get_or_init(|| {
                    $sql(&format!(
                        "SELECT payout_id, account_id, amount_minor, currency, beneficiary_ref, state, attempt_count \
                         FROM payouts WHERE {}",
                        Self::id_in("payout_id")
                    ))
                    .into_owned()
                });
                let rows = Self::bind_ids(sqlx::query(q), ids).fetch_all(&mut *conn).await.map_err(db_error)?;
                rows.iter().map(|r| payout_row(r).map(|p| (p.payout_id, p))).collect()
            }

            /// The forwardable attempt of each payout of `ids` that has one (what made a
            /// batch's intent a duplicate), in its transaction.
            async fn firsts_in(
                tx: &mut sqlx::Transaction<'static, $db>,
                ids: &[Uuid],
            ) -> Result<std::collections::BTreeMap<Uuid, FirstAttempt>, StoreError> {
                let q = $sql(&format!(
                    "SELECT payout_id, submission_id, submitted_at FROM rail_submission WHERE {} AND ({FORWARDABLE})",
                    Self::id_in("payout_id")
                ))
                .into_owned();
                let rows = Self::bind_ids(sqlx::query(&q), ids).fetch_all(&mut **tx).await.map_err(db_error)?;
                rows.iter()
                    .map(|r| {
                        let payout_id = parse_uuid(&r.try_get::<String, _>("payout_id").map_err(db_error)?)?;
                        let submission_id = parse_uuid(&r.try_get::<String, _>("submission_id").map_err(db_error)?)?;
                        let submitted_at: DateTime<Utc> = r.try_get("submitted_at").map_err(db_error)?;
                        Ok((payout_id, FirstAttempt { submission_id, submitted_at }))
                    })
                    .collect()
            }

            /// The account's mark, read inside a transaction (a refusal's evidence).
            async fn highest_in(tx: &mut sqlx::Transaction<'static, $db>, account_id: &str) -> Result<i64, StoreError> {
                let q = $sql("SELECT highest_token FROM rail_high_water WHERE account_id = $1");
                sqlx::query(&q)
                    .bind(account_id.to_owned())
                    .fetch_one(&mut **tx)
                    .await
                    .and_then(|r| r.try_get("highest_token"))
                    .map_err(db_error)
            }

            /// The mark `highest` refused `token`; it must refuse it by the rule too.
            fn fenced_by(highest: i64, token: i64) -> Result<i64, StoreError> {
                match admission::mark_verdict(true, Some(highest), token) {
                    MarkVerdict::Fenced { highest_token } => Ok(highest_token),
                    _ => Err(StoreError::Corrupt(format!(
                        "rail_high_water {highest} refused token {token} the fence rule passes"
                    ))),
                }
            }

            /// The end of a batch's admission whose steps 1-3 wrote `parts`, in the same
            /// transaction: a fenced batch writes a FENCED row per attempt; otherwise each
            /// attempt is admitted (its intent in and its payout moved), a duplicate (the
            /// unique index refused its intent: a DUPLICATE row), or not claimable (its intent
            /// went in but its payout did not move: the intent is removed, nothing of it
            /// stays). It commits when some attempt passed step 1, else rolls back (the mark
            /// with it). The answers are in `attempts`' order.
            async fn finish_batch(
                mut tx: sqlx::Transaction<'static, $db>,
                attempts: &[&Attempt],
                parts: BatchParts,
            ) -> Result<Vec<Admission>, StoreError> {
                let Some(first) = attempts.first() else { return Ok(Vec::new()) };
                let token = first.presented_token;
                match parts.marked {
                    Some(to) if to != token => {
                        return Err(StoreError::Corrupt(format!("rail_high_water advanced to {to}")));
                    }
                    None if first.fencing_enabled => {
                        // Step 1 refused, so no other part wrote: every attempt is fenced.
                        if !parts.claimed.is_empty() || !parts.moved.is_empty() {
                            return Err(StoreError::Corrupt("a batch's parts wrote past a refused mark".into()));
                        }
                        let highest_token = Self::fenced_by(Self::highest_in(&mut tx, &first.account_id).await?, token)?;
                        let fenced = vec![SubmissionOutcome::Fenced; attempts.len()];
                        Self::insert_refused(&mut tx, attempts, &fenced).await?;
                        tx.commit().await.map_err(commit_error)?;
                        return Ok(vec![Admission::Fenced { highest_token }; attempts.len()]);
                    }
                    _ => {}
                }
                let mut steps = Vec::with_capacity(attempts.len());
                for a in attempts {
                    steps.push(match (parts.claimed.contains(&a.payout_id), parts.moved.contains(&a.payout_id)) {
                        (true, true) => AdmitStep::Moved,
                        (true, false) => AdmitStep::NotMoved,
                        (false, false) => AdmitStep::SlotTaken,
                        (false, true) => {
                            return Err(StoreError::Corrupt(format!("payout {} moved without its intent", a.payout_id)))
                        }
                    });
                }
                let of = |step: AdmitStep| -> Vec<&Attempt> {
                    attempts.iter().zip(&steps).filter(|(_, s)| **s == step).map(|(a, _)| *a).collect()
                };
                let (taken, not_moved) = (of(AdmitStep::SlotTaken), of(AdmitStep::NotMoved));
                let passed = attempts.len() > not_moved.len();
                let firsts = if taken.is_empty() {
                    Default::default()
                } else {
                    let ids: Vec<Uuid> = taken.iter().map(|a| a.payout_id).collect();
                    let firsts = Self::firsts_in(&mut tx, &ids).await?;
                    Self::insert_refused(&mut tx, &taken, &vec![SubmissionOutcome::Duplicate; taken.len()]).await?;
                    firsts
                };
                let states = if not_moved.is_empty() {
                    Default::default()
                } else {
                    // The conditional write refused: the payout was not in a state the proxy may
                    // submit from when it looked (the state read now is evidence only).
                    let ids: Vec<Uuid> = not_moved.iter().map(|a| a.payout_id).collect();
                    let states = Self::payouts_by_id(&mut tx, &ids).await?;
                    if passed {
                        let sids: Vec<Uuid> = not_moved.iter().map(|a| a.submission_id).collect();
                        let q = $sql(&format!(
                            "DELETE FROM rail_submission WHERE {} AND outcome IS NULL",
                            Self::id_in("submission_id")
                        ))
                        .into_owned();
                        let gone = Self::bind_ids(sqlx::query(&q), &sids)
                            .execute(&mut *tx)
                            .await
                            .map_err(db_error)?
                            .rows_affected();
                        if gone != sids.len() as u64 {
                            return Err(StoreError::Corrupt(format!("{gone} of {} refused intents removed", sids.len())));
                        }
                        // Their `rail.intent` events, written by the trigger in this
                        // transaction, describe rows that will never commit: they go too.
                        let q = $sql(&format!(
                            "DELETE FROM events WHERE kind = 'rail.intent' AND {} AND {}",
                            Self::id_in("payout_id"),
                            Self::event_submission_in()
                        ))
                        .into_owned();
                        let ids: Vec<Uuid> = not_moved.iter().map(|a| a.payout_id).collect();
                        let query = Self::bind_ids(sqlx::query(&q), &ids);
                        let query = Self::bind_submissions(query, &sids);
                        let gone = query.execute(&mut *tx).await.map_err(db_error)?.rows_affected();
                        if gone != sids.len() as u64 {
                            return Err(StoreError::Corrupt(format!(
                                "{gone} of {} refused intents' events removed",
                                sids.len()
                            )));
                        }
                    }
                    states
                };
                let admissions = attempts
                    .iter()
                    .zip(&steps)
                    .map(|(a, step)| match step {
                        AdmitStep::Moved => Ok(Admission::Admitted { submitted_at: a.at }),
                        AdmitStep::SlotTaken => firsts
                            .get(&a.payout_id)
                            .map(|f| Admission::Duplicate {
                                first_submitted_at: f.submitted_at,
                                first_submission_id: f.submission_id,
                            })
                            .ok_or_else(|| StoreError::Corrupt(format!("payout {}: no forwardable attempt", a.payout_id))),
                        _ => states
                            .get(&a.payout_id)
                            .map(|p| Admission::NotClaimable { state: p.state })
                            .ok_or_else(|| StoreError::Corrupt(format!("payout {} vanished", a.payout_id))),
                    })
                    .collect::<Result<Vec<Admission>, StoreError>>()?;
                if passed {
                    tx.commit().await.map_err(commit_error)?;
                } else {
                    // No attempt passed step 1: nothing stays, the mark included (C-6).
                    tx.rollback().await.map_err(db_error)?;
                }
                Ok(admissions)
            }

            /// One try of [`RailStore::resolve_batch`] on `conn` (`resolve_batch_once`).
            async fn resolve_batch_on(
                conn: &mut <$db as sqlx::Database>::Connection,
                outcomes: &[(Uuid, Resolution)],
                at: DateTime<Utc>,
            ) -> Result<(), (sqlx::Error, Stage)> {
                Self::resolve_batch_once(conn, outcomes, at).await
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
                        // The mark it left must refuse the token by the rule too.
                        let highest = Self::highest_in(&mut tx, &a.account_id).await?;
                        let highest_token = Self::fenced_by(highest, a.presented_token)?;
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

            /// A batch of one ([`RailStore::resolve_batch`]): the same statements.
            async fn resolve(&self, submission_id: Uuid, r: &Resolution, at: DateTime<Utc>) -> Result<(), StoreError> {
                self.resolve_batch(&[(submission_id, r.clone())], at).await
            }

            /// Validation (one read of every payout's immutable terms, before the
            /// transaction: they never change once written, and a payout is never deleted),
            /// then the stamps of the validated payouts, then one transaction: steps 1-3 of
            /// all of them in one database call (`pg_batch_parts_sql`,
            /// `sqlite_batch_parts_sql`) and the refusals' rows (`finish_batch`).
            async fn admit_batch(&self, asked: &[Unstamped], stamp: Stamp<'_>) -> Result<Vec<Checked>, StoreError> {
                check_batch(asked)?;
                let Some(first) = asked.first() else { return Ok(Vec::new()) };
                let ids: Vec<Uuid> = asked.iter().map(|a| a.payout_id).collect();
                let rows = {
                    let mut conn = self.read_pool.acquire().await.map_err(db_error)?;
                    Self::payouts_by_id(&mut conn, &ids).await?
                };
                let validated = validate_batch(asked, |id| rows.get(&id).cloned(), stamp);
                let attempts = validated_attempts(&validated);
                if attempts.is_empty() {
                    return batch_answers(validated, Vec::new());
                }
                let attempts: Vec<&Attempt> = attempts.iter().collect();
                let mut tx = self.pool.begin().await.map_err(db_error)?;
                let parts = Self::batch_parts(&mut tx, &attempts, first.fencing_enabled).await?;
                let admissions = Self::finish_batch(tx, &attempts, parts).await?;
                batch_answers(validated, admissions)
            }

            async fn resolve_batch(&self, outcomes: &[(Uuid, Resolution)], at: DateTime<Utc>) -> Result<(), StoreError> {
                if outcomes.is_empty() {
                    return Ok(());
                }
                // Recording an outcome writes only an attempt still unresolved, so trying it
                // again after a lost connection (this one was handed out unpinged) cannot
                // record a second outcome: the retry runs on a connection that answered a ping.
                let mut conn = self.pool.acquire().await.map_err(db_error)?;
                let first = Self::resolve_batch_on(&mut conn, outcomes, at).await;
                drop(conn);
                let Err((e, stage)) = first else { return Ok(()) };
                if !dlock_db::is_connection_lost(&e) {
                    return Err(stage.classify(e));
                }
                tracing::warn!(submissions = outcomes.len(), cause = %dlock_db::describe(&e),
                    "rail_resolve_connection_lost_retrying");
                let mut conn = dlock_db::live_connection(&self.pool).await.map_err(db_error)?;
                Self::resolve_batch_on(&mut *conn, outcomes, at).await.map_err(|(e, stage)| stage.classify(e))
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

            async fn read_events(&self, after: i64, limit: usize) -> Result<EventRead, StoreError> {
                self.read_event_page(after, limit).await
            }

            async fn read_final_events(&self, after: i64, upto: i64, limit: usize) -> Result<EventRead, StoreError> {
                self.read_final_event_page(after, upto, limit).await
            }

            async fn cursor_secret(&self, candidate: [u8; 32], at: DateTime<Utc>) -> Result<[u8; 32], StoreError> {
                self.secret(candidate, at).await
            }
        }
    };
}

sql_rail_store!(PgRailStore, sqlx::Postgres, pg_sql, pg);
sql_rail_store!(SqliteRailStore, sqlx::Sqlite, sqlite_sql, sqlite);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution_targets_are_every_outcomes_payout_state() {
        let outcomes = [
            Resolution::Acked { rail_reference: "r".into() },
            Resolution::Rejected { detail: "d".into() },
            Resolution::Timeout { detail: "d".into() },
            Resolution::Unsent { detail: "d".into() },
        ];
        let targets: Vec<PayoutState> = outcomes.iter().map(Resolution::payout_state).collect();
        assert_eq!(targets, RESOLUTION_TARGETS.to_vec());
    }

    /// The instants a batch carries in its JSON are the text sqlx writes for a bound instant,
    /// whole milliseconds or not, so paydb's text comparisons order them as any other.
    #[tokio::test]
    async fn a_batch_instant_is_the_text_a_bound_instant_writes_in_sqlite() {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:").await.expect("sqlite");
        let base = DateTime::<Utc>::from_timestamp_millis(1_795_000_000_000).expect("instant");
        for nanos in [0i64, 7_000_000, 120_000_000, 123_456_000, 123_456_789] {
            let at = base + chrono::Duration::nanoseconds(nanos);
            let bound: String =
                sqlx::query_scalar("SELECT CAST(? AS TEXT)").bind(at).fetch_one(&mut conn).await.expect("read");
            assert_eq!(sqlite_instant(at), bound, "{nanos} ns");
            let via_json: String = sqlx::query_scalar("SELECT value ->> 0 FROM json_each(?)")
                .bind(serde_json::json!([[sqlite_instant(at)]]).to_string())
                .fetch_one(&mut conn)
                .await
                .expect("read");
            assert_eq!(via_json, bound, "{nanos} ns through json_each");
        }
    }
}
