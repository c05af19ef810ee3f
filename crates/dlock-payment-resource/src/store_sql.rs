//! paydb on PostgreSQL and SQLite, through sqlx, as the payment-resource sees it.
//!
//! The SQL is written once, with `$n` placeholders, and the same statements run on both
//! databases (SQLite gets `?n`, its numbered form, or `?` inside a batch). The two implementations differ only in
//! their pool and row types; [`sql_payment_store!`] stamps the one body out for each.
//!
//! Every mutating method is one transaction whose first statement is the idempotency
//! upsert (statement 0, design §4). It is a write, so SQLite holds its write lock from the
//! first statement, and PostgreSQL makes a concurrent duplicate wait on the identity's
//! primary key until the first transaction ends. A claim or post then runs the strict fence
//! `UPDATE accounts … WHERE … AND fence < $token` (statement 1). Under READ COMMITTED that
//! row lock serialises every claim and post of one account, so the reservation read that
//! follows is safe (design §3). An outcome that commits a mutation is rendered inside the
//! transaction and written into the identity row before the commit; a refusal rolls back,
//! identity row included.
//!
//! Folded statements (issue 14, docs/performance.md "Claims and posts: folded statements"),
//! none of them touching the fence or the reservation read: a post's transition carries the
//! ACKED-attempt check (`AND EXISTS`, [`post_move_sql`], held to `rules::decide_post` by a
//! test) and writes both ledger entries in one INSERT; on PostgreSQL a claim's transition
//! and its identity row's response are one data-modifying statement
//! ([`CLAIM_MOVE_AND_RECORD`]). The fence UPDATE and the reservation read stay two
//! statements: under READ COMMITTED one statement reads one snapshot, taken before it waits
//! for the account's row lock, so a reservation read folded into the fence could miss a
//! claim that committed during the wait (overspend).
//!
//! SQLite (issue 14, docs/performance.md "SQLite: statements batched into one call"):
//! statements with no decision between them go to the connection's worker as one batch
//! (`dlock_db::sqlite_batch`): a claim's or post's fence and the statement after it, a
//! claim's transition and recorded answer, a post's ledger writes, debit and recorded
//! answer. A statement a batch ran after a fence that refused is undone by the rollback
//! every refusal ends in (`commit_decided`). A claim's and a post's statement 0 joins that
//! first batch (docs/performance.md "SQLite: statements batched into one call"): the fence
//! is chained to it in SQL ([`FENCE_AFTER_GATE_SQL`], `AND changes() = 1`), so a request
//! its identity gate refuses never raises a fence (asserted), and its transaction rolls
//! back. PostgreSQL runs the same statements one by one but for three folds: a claim's and
//! a post's gate and fence are one statement, the fence chained to the gate in SQL
//! (`PG_GATE_FENCE_PARTS`, docs/performance.md "Claims and posts: folded statements"); the
//! claim's transition and recorded answer are one ([`CLAIM_MOVE_AND_RECORD`]); a post's
//! writes after its transition are one
//! (docs/performance.md "Claims and posts: folded statements"). The fence's follower runs
//! only after a raised fence, as a statement of its own. Every SQLite write transaction
//! runs on the process's SQLite writer thread
//! (docs/performance.md "The SQLite writer thread", [`PaymentStore::writer_thread`]).
//!
//! Batches (C3-extensions E-19, P2b and P3b): one transaction per batch, the account's fence
//! passed once. PostgreSQL: statement 0 and the account's fence as one statement (as a
//! claim's), then the read of every payout the batch names (`= ANY`, or `unnest` of the
//! posts' attempts) and, for a claim, the account's reservation, as its own statement
//! behind the fence's row lock; then every write and the recorded answer as one statement
//! (a claim: the conditional transitions; a post: the transitions, the settlement accounts,
//! every entry, the one debit). Three statements (and `BEGIN`, `COMMIT`) whatever the batch's
//! size; a refused fence reads why instead, and rolls back. SQLite: the gate, the fence and
//! the read in one batch, then the writes in another: two calls to the writer. No text
//! varies with the batch's size (the payouts are one array bind on PostgreSQL, one JSON text
//! read with `json_each` on SQLite). Each transition is conditional on what the read saw; a
//! payout that moved in between (the proxy or an operator: no account row lock) fails the
//! batch as `Unavailable`, nothing written.
//!
//! Errors: connection failures, timeouts and busy answers are [`StoreError::Unavailable`]
//! (nothing was decided); a commit whose answer was lost is [`StoreError::CommitUnknown`];
//! a constraint or trigger refusing a statement the store issued, or content the store
//! cannot read, is [`StoreError::Corrupt`].

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dlock_contract::payout::{self, Actor, PayoutState};
use dlock_contract::time::truncate_ms;
use dlock_db::Dialect;
use sqlx::Row;
use uuid::Uuid;

use crate::answer;
use crate::payout_accounts::PayoutAccounts;
use crate::rules::{self, ClaimBatchFacts, FenceVerdict, PostBatchFacts, PostDecision};
use crate::store::{
    funding_account, settlement_account, AbandonOutcome, AccountKind, AccountView, AmbiguousResolution, Answering,
    BatchOutcome, ClaimBatch, ClaimBatchOutcome, ClaimBatchPayout, ClaimOutcome, ClaimSeen, CreateAccountOutcome,
    CreatePayoutOutcome, Decided, IdemRequest, Idempotent, LedgerEntry, ListQuery, NewAccount, NewPayout, PaymentStore,
    PayoutSummary, PayoutView, PostBatch, PostBatchOutcome, PostBatchPayout, PostOutcome, ResolutionRow,
    ResolveOutcome, StoreError, StoredResponse,
};

use dlock_paydb::sql::{commit_error, db_error, parse_kind, parse_state, PG_MIGRATOR, SQLITE_MIGRATOR};

/// The `paydb_secrets.name` of the P1 cursor key.
pub const CURSOR_SECRET_NAME: &str = "p1-cursor";

/// What statement 0 decided.
enum Gate {
    /// A new identity, or an expired record replaced: run the request.
    Execute,
    /// A live record with the same fingerprint.
    Replay(StoredResponse),
    /// A live record with another fingerprint.
    Conflict,
}

impl Gate {
    /// The answer when the request must not run.
    fn answer<T>(self) -> Option<Idempotent<T>> {
        match self {
            Gate::Execute => None,
            Gate::Replay(r) => Some(Idempotent::Replayed(r)),
            Gate::Conflict => Some(Idempotent::Conflict),
        }
    }
}

/// Whether an outcome committed a mutation (and so is rendered and recorded).
trait Commits {
    fn commits(&self) -> bool;
}

impl Commits for ClaimOutcome {
    fn commits(&self) -> bool {
        matches!(self, ClaimOutcome::Claimed { .. } | ClaimOutcome::InsufficientFunds { .. })
    }
}

impl Commits for PostOutcome {
    fn commits(&self) -> bool {
        matches!(self, PostOutcome::Posted { .. })
    }
}

impl Commits for ClaimBatchOutcome {
    fn commits(&self) -> bool {
        self.moved() > 0
    }
}

impl Commits for PostBatchOutcome {
    fn commits(&self) -> bool {
        self.moved() > 0
    }
}

impl Commits for CreateAccountOutcome {
    fn commits(&self) -> bool {
        matches!(self, CreateAccountOutcome::Created(_))
    }
}

impl Commits for CreatePayoutOutcome {
    fn commits(&self) -> bool {
        matches!(self, CreatePayoutOutcome::Created(_))
    }
}

/// Longest a PostgreSQL statement waits for a row lock (C3-extensions C-9: a concurrent
/// duplicate waits, then replays). SQLite's single writer waits `SQLITE_BUSY_MS_MAX`.
pub const IDEMPOTENCY_WAIT_MS_MAX: u64 = 2_000;

/// Statement 0 of every deciding transaction: the upsert of the identity row, which
/// replaces only an expired record (a row back: run the request). Eight placeholders, once
/// each, in order ([`bind_gate!`]).
const GATE_SQL: &str = "INSERT INTO idempotency_records (operation, target_id, idempotency_key, fencing_token, \
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
const PG_GATE_FENCE_SELECT: &str = "SELECT (SELECT COUNT(*) FROM gate) AS gated, \
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
const RECORD_SQL: &str = "UPDATE idempotency_records SET response_status = $1, response_body = $2 \
     WHERE operation = $3 AND target_id = $4 AND idempotency_key = $5 AND fencing_token = $6";

/// A post's debit, after its entries: `$1` amount, `$2` instant, `$3` account.
const BALANCE_DEBIT_SQL: &str = "UPDATE accounts SET balance_minor = balance_minor - $1, updated_at = $2 \
     WHERE account_id = $3 RETURNING balance_minor";

// ---------------------------------------------------------------------------------------
// Batches (C3-extensions E-19): the statements of P2b and P3b. None of their texts varies
// with the batch's size: the payouts travel as one array bind on PostgreSQL (`= ANY`,
// `unnest`) and as one JSON text on SQLite (`json_each`, `->>`).
// ---------------------------------------------------------------------------------------

/// A batch's fence: the strict fence on the CUSTOMER account itself (C3 §3.4 verbatim),
/// with `$extra` conditions after its own. `$1` the token, `$2` the instant, `$3` the
/// account, `$4` the token again.
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
/// the upsert wrote (as [`FENCE_AFTER_GATE_SQL`]).
const ACCOUNT_FENCE_AFTER_GATE_SQL: &str = account_fence_sql!(" AND changes() = 1");

/// PostgreSQL: a batch's fence as the CTE after its gate's (as [`PG_FENCE_AFTER_GATE_SQL`]).
const PG_ACCOUNT_FENCE_AFTER_GATE_SQL: &str = account_fence_sql!(" AND EXISTS (SELECT 1 FROM gate)");

/// PostgreSQL: a batch's statement 0 and its fence as one statement (as
/// [`pg_gate_fence_sql`]), answered as [`PG_GATE_FENCE_SELECT`].
fn pg_batch_gate_fence_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        dlock_db::pg_cte_sql(
            &[("gate", GATE_SQL, 8), ("fence", PG_ACCOUNT_FENCE_AFTER_GATE_SQL, 4)],
            PG_GATE_FENCE_SELECT,
        )
    })
}

/// Why a batch's fence refused: the CUSTOMER account's fence (no row: no such account).
const ACCOUNT_FENCE_REFUSED_SQL: &str = "SELECT fence FROM accounts WHERE account_id = $1 AND kind = 'CUSTOMER'";

/// The columns a batch claim reads of each payout it names, and the account's reservation
/// (Σ amount of its unsettled payouts, the batch's own included; `$1` the account). Read
/// after the fence's row lock, as a claim's reservation read ([`CLAIM_READ_SQL`]).
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
const PG_CLAIM_BATCH_READ_SQL: &str = claim_batch_read_sql!("= ANY($2)");
/// SQLite: the batch claim's read; `$2` the payout ids (a JSON array of strings).
const SQLITE_CLAIM_BATCH_READ_SQL: &str = claim_batch_read_sql!("IN (SELECT value FROM json_each($2))");

/// PostgreSQL: the batch post's read of each payout it names and whether the attempt it
/// names is the payout's ACKED one (I7). `$1`, `$2`, `$3`: the payout ids, submission ids
/// and rail references (`TEXT[]` each, in the request's order).
const PG_POST_BATCH_READ_SQL: &str = "SELECT p.payout_id, p.account_id, p.state, p.amount_minor, p.currency, \
     EXISTS (SELECT 1 FROM rail_submission s WHERE s.payout_id = p.payout_id AND s.submission_id = m.submission_id \
     AND s.outcome = 'ACKED' AND s.rail_reference = m.rail_reference) AS acked \
     FROM unnest($1::text[], $2::text[], $3::text[]) AS m(payout_id, submission_id, rail_reference) \
     JOIN payouts p ON p.payout_id = m.payout_id";

/// SQLite: as [`PG_POST_BATCH_READ_SQL`]; `$1` a JSON array of `[payout id, submission id,
/// rail reference]`.
const SQLITE_POST_BATCH_READ_SQL: &str = "SELECT p.payout_id, p.account_id, p.state, p.amount_minor, p.currency, \
     EXISTS (SELECT 1 FROM rail_submission s WHERE s.payout_id = p.payout_id AND s.submission_id = (m.value ->> 1) \
     AND s.outcome = 'ACKED' AND s.rail_reference = (m.value ->> 2)) AS acked \
     FROM json_each($1) AS m JOIN payouts p ON p.payout_id = (m.value ->> 0)";

/// PostgreSQL: a batch claim's transitions, each conditional on the state and attempt count
/// the batch's read saw (as [`CLAIM_MOVE_AND_RECORD`]'s). `$1` token, `$2` owner, `$3`/`$4`
/// instant, then per payout (`$5` ids, `$6` next states, `$7` states read, `$8` attempt
/// counts read).
const PG_CLAIM_BATCH_MOVE_SQL: &str = "UPDATE payouts p SET state = m.next, claim_token = $1, claimed_by = $2, \
     claimed_at = $3, updated_at = $4 FROM unnest($5::text[], $6::text[], $7::text[], $8::int4[]) \
     AS m(payout_id, next, was, attempts) \
     WHERE p.payout_id = m.payout_id AND p.state = m.was AND p.attempt_count = m.attempts RETURNING p.payout_id";

/// SQLite: as [`PG_CLAIM_BATCH_MOVE_SQL`]; `$5` a JSON array of `[payout id, next state,
/// state read, attempt count read]`.
const SQLITE_CLAIM_BATCH_MOVE_SQL: &str = "UPDATE payouts SET state = m.next, claim_token = $1, claimed_by = $2, \
     claimed_at = $3, updated_at = $4 FROM (SELECT (value ->> 0) AS payout_id, (value ->> 1) AS next, \
     (value ->> 2) AS was, (value ->> 3) AS attempts FROM json_each($5)) AS m \
     WHERE payouts.payout_id = m.payout_id AND payouts.state = m.was AND payouts.attempt_count = m.attempts";

/// PostgreSQL: a batch claim's transitions and its recorded answer, one statement
/// ([`dlock_db::pg_cte_sql`]): (payouts moved, identity rows written).
fn pg_claim_batch_move_and_record_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        let recorded = format!("{RECORD_SQL} RETURNING operation");
        dlock_db::pg_cte_sql(
            &[("moved", PG_CLAIM_BATCH_MOVE_SQL, 8), ("recorded", &recorded, 6)],
            "SELECT (SELECT COUNT(*) FROM moved) AS moved, (SELECT COUNT(*) FROM recorded) AS recorded",
        )
    })
}

/// SQLite: a batch claim's transitions and its recorded answer, one batch.
fn sqlite_claim_batch_move_and_record_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| dlock_db::sqlite_batch_sql(&[(SQLITE_CLAIM_BATCH_MOVE_SQL, 5), (RECORD_SQL, 6)]))
}

/// The states a post moves a payout from (C2: RAIL_ACKED).
fn post_sources_sql() -> String {
    payout::sql_states(&payout::sources(PayoutState::Posted, Actor::PaymentResource))
}

/// PostgreSQL: a batch post's writes, one statement: the transitions to POSTED (`$2` the
/// posted payouts' ids), the settlement accounts (upserted), every entry, the one debit of
/// their sum, and the recorded answer (each a CTE over rows no other touches).
fn pg_post_batch_writes_sql() -> &'static str {
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
fn sqlite_post_batch_writes_sql() -> &'static str {
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

/// What a batch's first statements found: the account's balance when its fence rose, and
/// the rows of the batch's read (none when the fence refused).
type BatchFenceThen<R> = (Option<i64>, Vec<R>);

/// What a batch reads after its fence, per dialect's binds.
enum BatchRead<'a> {
    /// The payouts a claim names, and the account's reservation.
    Claim { account_id: &'a str, payouts: &'a [ClaimBatchPayout] },
    /// The payouts a post names, with the attempt each names.
    Post { payouts: &'a [PostBatchPayout] },
}

/// A batch claim's transitions: per payout (id, next state, state read, attempt count read).
type ClaimBatchMoves = Vec<(String, PayoutState, PayoutState, i32)>;

/// A batch claim's writes once decided: its transitions and the recorded answer.
struct ClaimBatchWrites<'a> {
    b: &'a ClaimBatch,
    at: DateTime<Utc>,
    moves: ClaimBatchMoves,
    identity: &'a IdemRequest,
    response: &'a StoredResponse,
}

/// A batch post's writes once decided: the posted payouts, their settlement accounts
/// (distinct), every entry, the debit of their sum, and the recorded answer.
struct PostBatchWrites<'a> {
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

/// `value` as one JSON text (a batch's bind on SQLite).
fn json_text<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(format!("a batch's bind is not JSON: {e}")))
}

/// A batch row's payout id.
fn row_payout_id(raw: &str) -> Result<Uuid, StoreError> {
    Uuid::parse_str(raw).map_err(|e| StoreError::Corrupt(format!("payouts: payout_id {raw:?} is not a UUID: {e}")))
}

fn pg_sql(sql: &str) -> std::borrow::Cow<'_, str> {
    Dialect::Postgres.sql(sql)
}

fn sqlite_sql(sql: &str) -> std::borrow::Cow<'_, str> {
    Dialect::Sqlite.sql(sql)
}

fn parse_secret(raw: &str) -> Result<[u8; 32], StoreError> {
    let bytes = hex::decode(raw).map_err(|e| StoreError::Corrupt(format!("bad {CURSOR_SECRET_NAME} secret: {e}")))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| StoreError::Corrupt(format!("{CURSOR_SECRET_NAME} secret is {} bytes, not 32", bytes.len())))
}

/// Opens paydb at `url` (applying pending migrations) as a [`PaymentStore`].
pub async fn open(url: &str) -> Result<Arc<dyn PaymentStore>, StoreError> {
    match Dialect::of_url(url).map_err(StoreError::Unavailable)? {
        Dialect::Postgres => Ok(Arc::new(PgPaymentStore::open(url).await?)),
        Dialect::Sqlite => Ok(Arc::new(SqlitePaymentStore::open(url).await?)),
    }
}

/// paydb on PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgPaymentStore {
    pub pool: sqlx::PgPool,
    /// Autocommitted reads: the same pool on PostgreSQL.
    pub read_pool: sqlx::PgPool,
    /// The payouts' accounts the grant check has read ([`PayoutAccounts`],
    /// docs/performance.md "The grant check's account read").
    accounts: Arc<PayoutAccounts>,
}

impl PgPaymentStore {
    pub async fn open(url: &str) -> Result<PgPaymentStore, StoreError> {
        // A request waits at most this long for a row another transaction holds (the
        // identity row of a concurrent duplicate, or the account's fence row); past it the
        // transaction rolls back and the answer is 503 NOT_READY, retry-safe.
        // Migrations run on a pool without that bound: they may wait for another process's
        // migration lock (the proxy migrates the same paydb).
        let migrating = dlock_db::pg_pool(url).await.map_err(db_error)?;
        PG_MIGRATOR.run(&migrating).await.map_err(|e| StoreError::Unavailable(format!("migrate: {e}")))?;
        migrating.close().await;
        let pool = dlock_db::pg_pool_with_lock_timeout(url, IDEMPOTENCY_WAIT_MS_MAX).await.map_err(db_error)?;
        Ok(PgPaymentStore { read_pool: pool.clone(), pool, accounts: Arc::new(PayoutAccounts::new()) })
    }

    /// PostgreSQL's transactions run on the caller's task: its pool has many connections.
    fn writer(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        None
    }
}

/// paydb on SQLite (the embedded default).
#[derive(Debug, Clone)]
pub struct SqlitePaymentStore {
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
    /// The payouts' accounts the grant check has read ([`PayoutAccounts`],
    /// docs/performance.md "The grant check's account read").
    accounts: Arc<PayoutAccounts>,
}

impl SqlitePaymentStore {
    /// This process's one pool on the file, as every other store opened on it holds it.
    pub fn shared_pool(&self) -> &dlock_db::SharedSqlitePool {
        &self._shared
    }

    fn writer(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        Some(self.writer.clone())
    }

    pub async fn open(url: &str) -> Result<SqlitePaymentStore, StoreError> {
        let shared = dlock_db::shared_sqlite_pool(url).await.map_err(db_error)?;
        SQLITE_MIGRATOR.run(shared.pool()).await.map_err(|e| StoreError::Unavailable(format!("migrate: {e}")))?;
        let writer = dlock_db::sqlite_writer_thread().map_err(db_error)?;
        Ok(SqlitePaymentStore {
            pool: shared.pool().clone(),
            read_pool: shared.readers().clone(),
            _shared: shared,
            writer,
            accounts: Arc::new(PayoutAccounts::new()),
        })
    }
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

macro_rules! sql_payment_store {
    ($store:ty, $db:ty, $sql:path, $paydb:ident) => {
        impl $store {
            /// Statement 0: the upsert of the identity row, which replaces only an expired
            /// record. No row back means a live record: read it and judge the fingerprint.
            async fn gate(tx: &mut sqlx::Transaction<'static, $db>, i: &IdemRequest) -> Result<Gate, StoreError> {
                let q = $sql(GATE_SQL);
                let fresh = bind_gate!(sqlx::query(&q), i).fetch_optional(&mut **tx).await.map_err(db_error)?;
                if fresh.is_some() {
                    return Ok(Gate::Execute);
                }
                Self::gate_live(tx, i).await
            }

            /// After an upsert that wrote nothing: the live record, judged by its fingerprint
            /// (a replay of its answer, or a conflict).
            async fn gate_live(tx: &mut sqlx::Transaction<'static, $db>, i: &IdemRequest) -> Result<Gate, StoreError> {
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
            async fn record(
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
            async fn finish<T: Commits + Send + Sync>(
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
            async fn account_fence_refused(
                tx: &mut sqlx::Transaction<'static, $db>,
                account_id: &str,
                token: i64,
            ) -> Result<Option<i64>, StoreError> {
                let q = $sql(ACCOUNT_FENCE_REFUSED_SQL);
                let held = sqlx::query(&q)
                    .bind(account_id.to_owned())
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(db_error)?;
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
            async fn batch_refused<T>(
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
            /// answer are then one statement (PostgreSQL) or one batch (SQLite). An outcome
            /// that commits comes back with its recorded answer, for the caller to commit.
            async fn claim_in(
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
                    if get!(row, "account_id", String) != b.account_id {
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
                        return Err(StoreError::Corrupt("the batch claim rule decided fewer payouts than it read".into()));
                    };
                    let read = ClaimSeen {
                        amount_minor: *amount,
                        currency,
                        beneficiary_ref,
                        attempt_count: *attempts,
                    };
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

            /// The batch post inside its transaction, after its gate and fence: each payout
            /// of the account decided by the post rule in order on the balance the ones
            /// before it left ([`rules::decide_post_batch`]); every write and the recorded
            /// answer then as one statement (PostgreSQL) or one batch (SQLite).
            async fn post_in(
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
                    if get!(row, "account_id", String) != b.account_id {
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

            async fn create_account_in(
                tx: &mut sqlx::Transaction<'static, $db>,
                a: &NewAccount,
            ) -> Result<CreateAccountOutcome, StoreError> {
                let at = truncate_ms(a.at);
                let funding = funding_account(&a.currency);
                let system = [
                    (funding.clone(), AccountKind::Funding),
                    (settlement_account(&a.currency), AccountKind::Settlement),
                ];
                dlock_paydb::sql::$paydb::upsert_system_accounts(tx, &system, &a.currency, at).await?;
                let q = $sql(
                    "INSERT INTO accounts (account_id, kind, currency, balance_minor, fence, created_at, updated_at) \
                     VALUES ($1, 'CUSTOMER', $2, $3, 0, $4, $4) ON CONFLICT (account_id) DO NOTHING \
                     RETURNING account_id",
                );
                let created = sqlx::query(&q)
                    .bind(a.account_id.clone())
                    .bind(a.currency.clone())
                    .bind(a.opening_balance_minor)
                    .bind(at)
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(db_error)?;
                if created.is_none() {
                    return Ok(CreateAccountOutcome::Exists);
                }
                for e in a.opening_entries(at) {
                    dlock_paydb::sql::$paydb::insert_entry(tx, &e).await?;
                }
                Ok(CreateAccountOutcome::Created(AccountView {
                    account_id: a.account_id.clone(),
                    kind: AccountKind::Customer,
                    currency: a.currency.clone(),
                    balance_minor: a.opening_balance_minor,
                    fence: 0,
                    ledger_sum_minor: a.opening_balance_minor,
                    reserved_minor: 0,
                    created_at: at,
                    updated_at: at,
                }))
            }

            async fn create_payout_in(
                tx: &mut sqlx::Transaction<'static, $db>,
                p: &NewPayout,
            ) -> Result<CreatePayoutOutcome, StoreError> {
                let at = truncate_ms(p.at);
                let q = $sql("SELECT kind, currency FROM accounts WHERE account_id = $1");
                let account = sqlx::query(&q)
                    .bind(p.account_id.clone())
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(db_error)?;
                let Some(account) = account else {
                    return Ok(CreatePayoutOutcome::UnknownAccount);
                };
                if parse_kind(&get!(account, "kind", String))? != AccountKind::Customer {
                    return Ok(CreatePayoutOutcome::UnknownAccount);
                }
                let account_currency: String = get!(account, "currency");
                if account_currency != p.currency {
                    return Ok(CreatePayoutOutcome::CurrencyMismatch { account_currency });
                }
                let q = $sql(
                    "INSERT INTO payouts (payout_id, account_id, amount_minor, currency, beneficiary_ref, state, \
                     attempt_count, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, 'PENDING', 0, $6, $6) \
                     ON CONFLICT (payout_id) DO NOTHING RETURNING payout_id",
                );
                let created = sqlx::query(&q)
                    .bind(p.payout_id.to_string())
                    .bind(p.account_id.clone())
                    .bind(p.amount_minor)
                    .bind(p.currency.clone())
                    .bind(p.beneficiary_ref.clone())
                    .bind(at)
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(db_error)?;
                if created.is_none() {
                    return Ok(CreatePayoutOutcome::PayoutExists);
                }
                Ok(CreatePayoutOutcome::Created(PayoutView {
                    payout_id: p.payout_id,
                    account_id: p.account_id.clone(),
                    amount_minor: p.amount_minor,
                    currency: p.currency.clone(),
                    beneficiary_ref: p.beneficiary_ref.clone(),
                    state: PayoutState::Pending,
                    attempt_count: 0,
                    claim_token: None,
                    claimed_by: None,
                    claimed_at: None,
                    created_at: at,
                    updated_at: at,
                    submissions: Vec::new(),
                }))
            }

            /// Ends a claim's or post's transaction: an outcome with its recorded answer
            /// commits; a refusal (no answer recorded) rolls back, identity row included.
            async fn commit_decided<T: Commits + Send + Sync>(
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
            async fn refused_at_gate<T>(tx: sqlx::Transaction<'static, $db>, refused: Gate) -> Decided<T> {
                tx.rollback().await.map_err(db_error)?;
                refused.answer().ok_or_else(|| StoreError::Corrupt("the gate refused a request it runs".into()))
            }

            /// Begins a deciding transaction and runs statement 0: `Err(answer)` when the
            /// request must not run (a replay or a conflict; already rolled back).
            async fn begin<T>(
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

        #[async_trait]
        impl PaymentStore for $store {
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

            async fn cursor_secret(&self, candidate: [u8; 32], at: DateTime<Utc>) -> Result<[u8; 32], StoreError> {
                let mut tx = self.pool.begin().await.map_err(db_error)?;
                let q = $sql(
                    "INSERT INTO paydb_secrets (name, secret_hex, created_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (name) DO NOTHING",
                );
                sqlx::query(&q)
                    .bind(CURSOR_SECRET_NAME)
                    .bind(hex::encode(candidate))
                    .bind(truncate_ms(at))
                    .execute(&mut *tx)
                    .await
                    .map_err(db_error)?;
                let q = $sql("SELECT secret_hex FROM paydb_secrets WHERE name = $1");
                let stored: String = sqlx::query(&q)
                    .bind(CURSOR_SECRET_NAME)
                    .fetch_one(&mut *tx)
                    .await
                    .and_then(|r| r.try_get("secret_hex"))
                    .map_err(db_error)?;
                let secret = parse_secret(&stored)?;
                tx.commit().await.map_err(commit_error)?;
                Ok(secret)
            }

            async fn create_account(
                &self,
                a: &NewAccount,
                i: &IdemRequest,
                how: &Answering,
            ) -> Decided<CreateAccountOutcome> {
                let mut tx = match self.begin(i).await? {
                    Ok(tx) => tx,
                    Err(answer) => return Ok(answer),
                };
                let outcome = Self::create_account_in(&mut tx, a).await?;
                Self::finish(tx, i, outcome, |o| answer::account_created(o, &how.trace_id)).await
            }

            async fn create_payout(
                &self,
                p: &NewPayout,
                i: &IdemRequest,
                a: &Answering,
            ) -> Decided<CreatePayoutOutcome> {
                let mut tx = match self.begin(i).await? {
                    Ok(tx) => tx,
                    Err(answer) => return Ok(answer),
                };
                let outcome = Self::create_payout_in(&mut tx, p).await?;
                let decided = Self::finish(tx, i, outcome, |o| answer::payout_created(o, &a.trace_id)).await?;
                if let Idempotent::Executed { outcome: CreatePayoutOutcome::Created(view), stored: Some(_) } = &decided {
                    // Committed: the payout's first fenced write need not read its account.
                    self.accounts.remember(view.payout_id, &view.account_id);
                }
                Ok(decided)
            }

            async fn claim(&self, b: &ClaimBatch, i: &IdemRequest, a: &Answering) -> Decided<ClaimBatchOutcome> {
                let mut tx = self.pool.begin().await.map_err(db_error)?;
                let read = BatchRead::Claim { account_id: &b.account_id, payouts: &b.payouts };
                let fenced =
                    Self::batch_gate_fence_then(&mut tx, i, &b.account_id, b.token, truncate_ms(b.at), read).await?;
                let fenced = match fenced {
                    Ok(fenced) => fenced,
                    Err(refused) => return Self::refused_at_gate(tx, refused).await,
                };
                let decided = Self::claim_in(&mut tx, b, i, a, fenced).await?;
                Self::commit_decided(tx, decided).await
            }

            async fn post(&self, b: &PostBatch, i: &IdemRequest, a: &Answering) -> Decided<PostBatchOutcome> {
                let mut tx = self.pool.begin().await.map_err(db_error)?;
                let read = BatchRead::Post { payouts: &b.payouts };
                let fenced =
                    Self::batch_gate_fence_then(&mut tx, i, &b.account_id, b.token, truncate_ms(b.at), read).await?;
                let fenced = match fenced {
                    Ok(fenced) => fenced,
                    Err(refused) => return Self::refused_at_gate(tx, refused).await,
                };
                let decided = Self::post_in(&mut tx, b, i, a, fenced).await?;
                Self::commit_decided(tx, decided).await
            }

            async fn abandon(&self, payout_id: Uuid, at: DateTime<Utc>) -> Result<AbandonOutcome, StoreError> {
                let mut tx = self.pool.begin().await.map_err(db_error)?;
                // The source states C2 allows an operator's abandon from.
                let from = payout::sql_states(&payout::sources(PayoutState::Abandoned, Actor::Operator));
                let q = $sql(&format!(
                    "UPDATE payouts SET state = 'ABANDONED', updated_at = $2 WHERE payout_id = $1 AND state IN {from}"
                ))
                .into_owned();
                let moved = sqlx::query(&q)
                    .bind(payout_id.to_string())
                    .bind(truncate_ms(at))
                    .execute(&mut *tx)
                    .await
                    .map_err(db_error)?
                    .rows_affected();
                if moved == 1 {
                    tx.commit().await.map_err(commit_error)?;
                    return Ok(AbandonOutcome::Abandoned);
                }
                let q = $sql("SELECT state FROM payouts WHERE payout_id = $1");
                let state = sqlx::query(&q)
                    .bind(payout_id.to_string())
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db_error)?;
                tx.rollback().await.map_err(db_error)?;
                match state {
                    None => Ok(AbandonOutcome::NotFound),
                    Some(r) => Ok(AbandonOutcome::NotAbandonable { state: parse_state(&get!(r, "state", String))? }),
                }
            }

            async fn resolve_ambiguous(&self, r: &AmbiguousResolution) -> Result<ResolveOutcome, StoreError> {
                dlock_paydb::sql::$paydb::resolve_ambiguous(&self.pool, r).await
            }

            async fn resolutions(&self, payout_id: Option<Uuid>) -> Result<Vec<ResolutionRow>, StoreError> {
                dlock_paydb::sql::$paydb::resolutions(&self.read_pool, payout_id).await
            }

            async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutView>, StoreError> {
                dlock_paydb::sql::$paydb::payout(&self.read_pool, payout_id).await
            }

            /// Read from paydb once per payout, then from [`PayoutAccounts`]: a payout's
            /// account never changes (paydb refuses the update) and no payout is deleted.
            async fn payout_account(&self, payout_id: Uuid) -> Result<Option<String>, StoreError> {
                if let Some(account) = self.accounts.get(payout_id) {
                    return Ok(Some(account));
                }
                let found = dlock_paydb::sql::$paydb::payout_account(&self.read_pool, payout_id).await?;
                if let Some(account) = &found {
                    self.accounts.remember(payout_id, account);
                }
                Ok(found)
            }

            async fn account(&self, account_id: &str) -> Result<Option<AccountView>, StoreError> {
                dlock_paydb::sql::$paydb::account(&self.read_pool, account_id).await
            }

            async fn accounts(&self) -> Result<Vec<AccountView>, StoreError> {
                dlock_paydb::sql::$paydb::accounts(&self.read_pool).await
            }

            async fn list(&self, q: &ListQuery) -> Result<Vec<PayoutSummary>, StoreError> {
                dlock_paydb::sql::$paydb::list(&self.read_pool, q).await
            }

            async fn ledger(&self, account_id: Option<&str>) -> Result<Vec<LedgerEntry>, StoreError> {
                dlock_paydb::sql::$paydb::ledger(&self.read_pool, account_id).await
            }

            async fn oldest_pending_created_at(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
                let q = "SELECT created_at FROM payouts WHERE state = 'PENDING' ORDER BY created_at LIMIT 1";
                sqlx::query(q)
                    .fetch_optional(&self.read_pool)
                    .await
                    .map_err(db_error)?
                    .map(|r| r.try_get("created_at").map_err(db_error))
                    .transpose()
            }

            async fn purge_idempotency(&self, now: DateTime<Utc>, batch_max: i64) -> Result<u64, StoreError> {
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

            async fn idempotency_record_count(&self) -> Result<u64, StoreError> {
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

/// PostgreSQL: one statement per round trip, as written, but for the statements folded
/// into one ([`dlock_db::pg_cte_sql`]).
impl PgPaymentStore {
    /// A batch's statement 0 and its fence (the account's own) as one statement, then, when
    /// the fence rose, the batch's read as its own statement (its snapshot taken after the
    /// fence's row lock, as a claim's reservation read). `Err(gate)`: the batch does not run.
    async fn batch_gate_fence_then(
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
            .bind(token);
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

    /// A batch claim's transitions and its recorded answer, one statement
    /// ([`pg_claim_batch_move_and_record_sql`]): (payouts moved, identity rows written).
    async fn claim_batch_move_and_record(
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        w: &ClaimBatchWrites<'_>,
    ) -> Result<(usize, i64), StoreError> {
        let ids: Vec<String> = w.moves.iter().map(|m| m.0.clone()).collect();
        let next: Vec<&str> = w.moves.iter().map(|m| m.1.as_str()).collect();
        let was: Vec<&str> = w.moves.iter().map(|m| m.2.as_str()).collect();
        let attempts: Vec<i32> = w.moves.iter().map(|m| m.3).collect();
        let row = sqlx::query(pg_claim_batch_move_and_record_sql())
            .bind(w.b.token)
            .bind(w.b.owner_id.clone())
            .bind(w.at)
            .bind(w.at)
            .bind(ids)
            .bind(next)
            .bind(was)
            .bind(attempts)
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

    /// A batch post's writes, one statement ([`pg_post_batch_writes_sql`]): (payouts moved,
    /// entries written, the balance after, identity rows written).
    async fn post_batch_writes(
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        w: &PostBatchWrites<'_>,
    ) -> Result<(usize, usize, i64, i64), StoreError> {
        let column = |f: fn(&LedgerEntry) -> String| w.entries.iter().map(f).collect::<Vec<String>>();
        let row = sqlx::query(pg_post_batch_writes_sql())
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
            .map_err(db_error)?;
        let (moved, written): (i64, i64) = (get!(row, "moved"), get!(row, "entries"));
        let Some(balance) = get!(row, "balance_minor", Option<i64>) else {
            return Err(StoreError::Corrupt(format!("accounts: no account {} to debit", w.account_id)));
        };
        let count = |n: i64| usize::try_from(n).unwrap_or(0);
        Ok((count(moved), count(written), balance, get!(row, "recorded")))
    }
}

/// SQLite: statements with no decision between them go as one batch, one call to the
/// connection's worker thread (`dlock_db::sqlite_batch`).
impl SqlitePaymentStore {
    /// A batch's statement 0, its fence (the account's own, chained to the gate with
    /// `changes()`) and its read, in one batch (as [`Self::gate_fence_then`]). `Err(gate)`:
    /// the batch does not run.
    async fn batch_gate_fence_then(
        tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        i: &IdemRequest,
        account_id: &str,
        token: i64,
        at: DateTime<Utc>,
        read: BatchRead<'_>,
    ) -> Result<Result<BatchFenceThen<sqlx::sqlite::SqliteRow>, Gate>, StoreError> {
        static CLAIM: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        static POST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let batch = |read_sql: &str, binds: usize| {
            dlock_db::sqlite_batch_sql(&[(GATE_SQL, 8), (ACCOUNT_FENCE_AFTER_GATE_SQL, 4), (read_sql, binds)])
        };
        let q = match read {
            BatchRead::Claim { .. } => CLAIM.get_or_init(|| batch(SQLITE_CLAIM_BATCH_READ_SQL, 2)),
            BatchRead::Post { .. } => POST.get_or_init(|| batch(SQLITE_POST_BATCH_READ_SQL, 1)),
        };
        let query = bind_gate!(sqlx::query(q), i).bind(token).bind(at).bind(account_id.to_owned()).bind(token);
        let query = match read {
            BatchRead::Claim { account_id, payouts } => {
                let ids: Vec<String> = payouts.iter().map(|p| p.payout_id.to_string()).collect();
                query.bind(account_id.to_owned()).bind(json_text(&ids)?)
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

    /// A batch claim's transitions and its recorded answer, one batch
    /// ([`sqlite_claim_batch_move_and_record_sql`]): (payouts moved, identity rows written).
    async fn claim_batch_move_and_record(
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

    /// A batch post's writes, one batch ([`sqlite_post_batch_writes_sql`]): (payouts moved,
    /// entries written, the balance after, identity rows written).
    async fn post_batch_writes(
        tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        w: &PostBatchWrites<'_>,
    ) -> Result<(usize, usize, i64, i64), StoreError> {
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
        let parts = dlock_db::sqlite_batch(tx, query, 5).await.map_err(db_error)?;
        let Some(row) = parts[3].rows.first() else {
            return Err(StoreError::Corrupt(format!("accounts: no account {} to debit", w.account_id)));
        };
        let count = |k: usize| usize::try_from(parts[k].rows_affected).unwrap_or(usize::MAX);
        Ok((count(0), count(2), get!(row, "balance_minor"), i64::try_from(parts[4].rows_affected).unwrap_or(i64::MAX)))
    }
}

sql_payment_store!(PgPaymentStore, sqlx::Postgres, pg_sql, pg);
sql_payment_store!(SqlitePaymentStore, sqlx::Sqlite, sqlite_sql, sqlite);

#[cfg(test)]
mod tests {
    //! The folded statements, held to the rules they apply (SQLite; PostgreSQL runs the same
    //! text, and the conformance suite runs both stores).

    use super::*;
    use dlock_contract::rail::SubmissionOutcome;

    /// What the attempt table holds for the payout in one case: nothing, or one attempt
    /// (submission id, outcome, reference).
    type AttemptCase = Option<(Uuid, SubmissionOutcome, Option<&'static str>)>;

    /// docs/performance.md "The SQLite writer thread": on SQLite the service runs its
    /// writes on the process's SQLite writer thread (through the timing wrapper `start`
    /// puts around the store); elsewhere in line.
    #[tokio::test]
    async fn the_service_runs_sqlite_writes_on_the_writer_thread() {
        let (url, _dir) = dlock_testkit::fresh_database(dlock_testkit::Db::Sqlite).await;
        let store: Arc<dyn PaymentStore> = Arc::new(SqlitePaymentStore::open(&url).await.expect("open paydb"));
        let cfg = crate::service::PaymentConfig::default();
        let pr = crate::service::PaymentResource::start(store, cfg, dlock_rt::Clock::system()).await.expect("start");
        let thread = || async { std::thread::current().name().map(str::to_owned) };
        let on = pr.write(|_| thread()).await;
        assert_eq!(on.as_deref(), Some(dlock_db::SQLITE_WRITER_THREAD_NAME));
        let mem: Arc<dyn PaymentStore> = Arc::new(crate::store_mem::MemPaydb::new());
        let pr = crate::service::PaymentResource::start(
            mem,
            crate::service::PaymentConfig::default(),
            dlock_rt::Clock::system(),
        )
        .await
        .expect("start");
        let here = std::thread::current().name().map(str::to_owned);
        assert_eq!(pr.write(|_| thread()).await, here, "a store without a writer thread writes in line");
    }

    /// What the store tests below start from: a fresh store of a kind with the instant they
    /// write at (`fresh`), and rows written by hand: the CUSTOMER account `acct` (EUR,
    /// balance 500, fence 0), or a PENDING payout of 200 on it; or a payout deleted by hand.
    macro_rules! seed {
        ($store:ty, $db:expr, fresh) => {{
            let (url, dir) = dlock_testkit::fresh_database($db).await;
            let store = <$store>::open(&url).await.expect("open paydb");
            let at = DateTime::<Utc>::from_timestamp_millis(1_795_000_000_000).expect("instant");
            (store, at, url, dir)
        }};
        ($store:expr, $sql:path, $at:expr, account) => {
            sqlx::query(&$sql(
                "INSERT INTO accounts (account_id, kind, currency, balance_minor, fence, created_at, updated_at) \
                 VALUES ('acct', 'CUSTOMER', 'EUR', 500, 0, $1, $1)",
            ))
            .bind($at)
            .execute(&$store.pool)
            .await
            .expect("account")
        };
        ($store:expr, $sql:path, deleted $id:expr) => {
            sqlx::query(&$sql("DELETE FROM payouts WHERE payout_id = $1"))
                .bind($id.to_string())
                .execute(&$store.pool)
                .await
                .expect("delete by hand")
        };
        ($store:expr, $sql:path, $at:expr, payout $id:expr) => {
            sqlx::query(&$sql(
                "INSERT INTO payouts (payout_id, account_id, amount_minor, currency, beneficiary_ref, state, \
                 attempt_count, created_at, updated_at) VALUES ($1, 'acct', 200, 'EUR', 'ben', 'PENDING', 0, $2, $2)",
            ))
            .bind($id.to_string())
            .bind($at)
            .execute(&$store.pool)
            .await
            .expect("payout")
        };
    }

    /// The identity gate and the fence are chained in SQL: on SQLite one batch with the
    /// statement after the fence
    /// (docs/performance.md "SQLite: statements batched into one call"), on PostgreSQL one
    /// statement (docs/performance.md "Claims and posts: folded statements"). A request
    /// whose identity has a live record is answered from it (a replay, or a conflict for
    /// another fingerprint) and raises no fence and moves nothing, even with the account's
    /// fence below its token (a state the API never builds: a committed record's request
    /// raised the fence to its token).
    macro_rules! a_refused_gate_raises_no_fence {
        ($name:ident, $store:ty, $db:expr, $sql:path) => {
            #[tokio::test]
            async fn $name() {
                let (store, at, _url, _dir) = seed!($store, $db, fresh);
                let payout_id = Uuid::from_u128(77);
                seed!(store, $sql, at, account);
                seed!(store, $sql, at, payout payout_id);
                sqlx::query(&$sql(
                    "INSERT INTO idempotency_records (operation, target_id, idempotency_key, fencing_token, \
                     request_sha256, owner_id, response_status, response_body, created_at, expires_at) \
                     VALUES ('CLAIM', $1, 'payout:k', 5, $2, 'o', 200, $3, $4, $5)",
                ))
                .bind(payout_id.to_string())
                .bind("a".repeat(64))
                .bind(b"{}".to_vec())
                .bind(at)
                .bind(at + chrono::Duration::days(1))
                .execute(&store.pool)
                .await
                .expect("live record");
                let claim = Claim { payout_id, token: 5, owner_id: "o".into(), expected: PayoutState::Pending, at };
                let identity = |fingerprint: &str| IdemRequest {
                    operation: crate::store::Operation::Claim,
                    target_id: payout_id.to_string(),
                    key: "payout:k".into(),
                    token: 5,
                    owner_id: "o".into(),
                    fingerprint: fingerprint.into(),
                    at,
                    expires_at: at + chrono::Duration::days(1),
                };
                let render = |_: &ClaimOutcome| StoredResponse { status: 200, body: b"new".to_vec() };
                let replayed = store.claim(&claim, &identity(&"a".repeat(64)), &render).await.expect("claim");
                assert_eq!(replayed, Idempotent::Replayed(StoredResponse { status: 200, body: b"{}".to_vec() }));
                let conflict = store.claim(&claim, &identity(&"b".repeat(64)), &render).await.expect("claim");
                assert_eq!(conflict, Idempotent::Conflict);
                let fence: i64 = sqlx::query_scalar("SELECT fence FROM accounts WHERE account_id = 'acct'")
                    .fetch_one(&store.pool)
                    .await
                    .expect("fence");
                let state: String = sqlx::query_scalar(&$sql("SELECT state FROM payouts WHERE payout_id = $1"))
                    .bind(payout_id.to_string())
                    .fetch_one(&store.pool)
                    .await
                    .expect("state");
                assert_eq!((fence, state.as_str()), (0, "PENDING"), "the refused requests wrote nothing");
            }
        };
    }

    a_refused_gate_raises_no_fence!(
        a_request_its_identity_gate_refuses_raises_no_fence_and_moves_nothing,
        SqlitePaymentStore,
        dlock_testkit::Db::Sqlite,
        sqlite_sql
    );
    a_refused_gate_raises_no_fence!(
        on_postgresql_a_request_its_identity_gate_refuses_raises_no_fence_and_moves_nothing,
        PgPaymentStore,
        dlock_testkit::Db::Postgres,
        pg_sql
    );

    /// docs/performance.md "The grant check's account read": the grant check reads a
    /// payout's account from paydb once per store, then from memory (shown by deleting the
    /// payout row by hand: the store still answers its account, a freshly opened one does
    /// not); an unknown payout is read every time, so a payout created after a miss is
    /// found.
    macro_rules! a_payouts_account_is_read_once {
        ($name:ident, $store:ty, $db:expr, $sql:path) => {
            #[tokio::test]
            async fn $name() {
                let (store, at, url, _dir) = seed!($store, $db, fresh);
                let payout_id = Uuid::from_u128(78);
                seed!(store, $sql, at, account);
                assert_eq!(store.payout_account(payout_id).await.expect("read"), None);
                seed!(store, $sql, at, payout payout_id);
                assert_eq!(store.payout_account(payout_id).await.expect("read").as_deref(), Some("acct"));
                seed!(store, $sql, deleted payout_id);
                let remembered = store.payout_account(payout_id).await.expect("read");
                assert_eq!(remembered.as_deref(), Some("acct"), "the second read came from paydb");
                let fresh = <$store>::open(&url).await.expect("reopen paydb");
                assert_eq!(fresh.payout_account(payout_id).await.expect("read"), None);

                // A payout this store created is remembered from its commit: not read at all.
                let created_id = Uuid::from_u128(79);
                let new = NewPayout {
                    payout_id: created_id,
                    account_id: "acct".into(),
                    amount_minor: 100,
                    currency: "EUR".into(),
                    beneficiary_ref: "ben".into(),
                    at,
                };
                let identity = IdemRequest {
                    operation: crate::store::Operation::CreatePayout,
                    target_id: "acct".into(),
                    key: "create:k".into(),
                    token: 0,
                    owner_id: String::new(),
                    fingerprint: "c".repeat(64),
                    at,
                    expires_at: at + chrono::Duration::days(1),
                };
                let render = |_: &CreatePayoutOutcome| StoredResponse { status: 201, body: b"{}".to_vec() };
                let created = fresh.create_payout(&new, &identity, &render).await.expect("create");
                assert!(matches!(created, Idempotent::Executed { outcome: CreatePayoutOutcome::Created(_), .. }));
                seed!(fresh, $sql, deleted created_id);
                let remembered = fresh.payout_account(created_id).await.expect("read");
                assert_eq!(remembered.as_deref(), Some("acct"), "the created payout's account was read from paydb");
            }
        };
    }

    a_payouts_account_is_read_once!(
        a_payouts_account_is_read_from_paydb_once_and_an_unknown_payout_every_time,
        SqlitePaymentStore,
        dlock_testkit::Db::Sqlite,
        sqlite_sql
    );
    a_payouts_account_is_read_once!(
        on_postgresql_a_payouts_account_is_read_from_paydb_once_and_an_unknown_payout_every_time,
        PgPaymentStore,
        dlock_testkit::Db::Postgres,
        pg_sql
    );

    /// docs/performance.md "Claims and posts: folded statements": the PostgreSQL
    /// gate-and-fence statement is the gate's and the fence's texts, the fence chained to
    /// the gate, placeholders numbered on (8 for the gate, then 4).
    #[test]
    fn the_postgresql_gate_and_fence_statement_chains_the_fence_to_the_gate() {
        let q = pg_gate_fence_sql();
        assert!(q.starts_with("WITH gate AS (INSERT INTO idempotency_records"), "{q}");
        assert!(q.contains("fence AS (UPDATE accounts SET fence = $9, updated_at = $10"), "{q}");
        assert!(q.contains("WHERE payout_id = $11) AND fence < $12 AND EXISTS (SELECT 1 FROM gate)"), "{q}");
        assert!(!q.contains("$13"), "{q}");
    }

    /// E-19: a batch's statements are built once, whatever its size (the payouts travel as
    /// one array or JSON bind), with their placeholders in order (the builders assert it).
    #[test]
    fn the_batch_statements_have_one_text_whatever_the_batch_size() {
        let pg = [
            pg_batch_gate_fence_sql(),
            PG_CLAIM_BATCH_READ_SQL,
            PG_POST_BATCH_READ_SQL,
            pg_claim_batch_move_and_record_sql(),
            pg_post_batch_writes_sql(),
        ];
        for (q, last) in pg.iter().zip([12, 2, 3, 14, 25]) {
            assert!(q.contains(&format!("${last}")) && !q.contains(&format!("${}", last + 1)), "{q}");
        }
        assert!(pg_batch_gate_fence_sql().contains("WHERE account_id = $11 AND kind = 'CUSTOMER' AND fence < $12"));
        assert!(PG_CLAIM_BATCH_READ_SQL.ends_with("= ANY($2)"));
        for q in [sqlite_claim_batch_move_and_record_sql(), sqlite_post_batch_writes_sql()] {
            assert!(!q.contains('$'), "SQLite binds anonymously: {q}");
        }
        assert!(SQLITE_CLAIM_BATCH_READ_SQL.ends_with("IN (SELECT value FROM json_each($2))"));
    }

    /// E-19: a batch claim's transitions are conditional, each on the state and attempt count
    /// the batch's read saw (as a single claim's): a payout that moved since is not written
    /// (the caller then answers `Unavailable` and rolls back).
    macro_rules! a_batch_claim_moves_only_what_it_read {
        ($name:ident, $store:ty, $db:expr, $sql:path) => {
            #[tokio::test]
            async fn $name() {
                let (store, at, _url, _dir) = seed!($store, $db, fresh);
                let (p1, p2, p3) = (Uuid::from_u128(81), Uuid::from_u128(82), Uuid::from_u128(83));
                seed!(store, $sql, at, account);
                for p in [p1, p2, p3] {
                    seed!(store, $sql, at, payout p);
                }
                let b = ClaimBatch { account_id: "acct".into(), token: 5, owner_id: "o".into(), payouts: Vec::new(), at };
                let identity = IdemRequest {
                    operation: crate::store::Operation::Claim,
                    target_id: "account:acct".into(),
                    key: "k".into(),
                    token: 5,
                    owner_id: "o".into(),
                    fingerprint: "a".repeat(64),
                    at,
                    expires_at: at + chrono::Duration::days(1),
                };
                let response = StoredResponse { status: 200, body: b"{}".to_vec() };
                let (pending, claimed) = (PayoutState::Pending, PayoutState::Claimed);
                let moves = vec![
                    (p1.to_string(), claimed, pending, 0),
                    // Read as CLAIMED (it is PENDING now), read with another attempt count.
                    (p2.to_string(), claimed, claimed, 0),
                    (p3.to_string(), claimed, pending, 1),
                ];
                let w = ClaimBatchWrites { b: &b, at, moves, identity: &identity, response: &response };
                let mut tx = store.pool.begin().await.expect("begin");
                let (moved, recorded) = <$store>::claim_batch_move_and_record(&mut tx, &w).await.expect("moves");
                assert_eq!((moved, recorded), (1, 0), "only p1 moved; no identity row to record in");
                let state: String = sqlx::query_scalar(&$sql("SELECT state FROM payouts WHERE payout_id = $1"))
                    .bind(p1.to_string())
                    .fetch_one(&mut *tx)
                    .await
                    .expect("state");
                assert_eq!(state, "CLAIMED");
                tx.rollback().await.expect("rollback");
            }
        };
    }

    a_batch_claim_moves_only_what_it_read!(
        a_batch_claims_transitions_move_only_payouts_still_as_its_read_saw_them,
        SqlitePaymentStore,
        dlock_testkit::Db::Sqlite,
        sqlite_sql
    );
    a_batch_claim_moves_only_what_it_read!(
        on_postgresql_a_batch_claims_transitions_move_only_payouts_still_as_its_read_saw_them,
        PgPaymentStore,
        dlock_testkit::Db::Postgres,
        pg_sql
    );

    #[tokio::test]
    async fn post_statement_moves_exactly_when_the_post_rule_posts() {
        let (url, _dir) = dlock_testkit::fresh_database(dlock_testkit::Db::Sqlite).await;
        let store = SqlitePaymentStore::open(&url).await.expect("open paydb");
        let named = Uuid::from_u128(1);
        let other = Uuid::from_u128(2);
        let attempts: [AttemptCase; 6] = [
            None,
            Some((named, SubmissionOutcome::Acked, Some("RR-1"))),
            Some((named, SubmissionOutcome::Acked, Some("RR-other"))),
            Some((other, SubmissionOutcome::Acked, Some("RR-1"))),
            Some((named, SubmissionOutcome::Timeout, None)),
            Some((named, SubmissionOutcome::Rejected, None)),
        ];
        let at = DateTime::<Utc>::from_timestamp_millis(1_795_000_000_000).expect("instant");
        let mut cases = 0;
        for state in PayoutState::ALL {
            for attempt in attempts {
                cases += 1;
                let payout_id = Uuid::from_u128(1_000 + cases);
                let mut tx = store.pool.begin().await.expect("begin");
                sqlx::query(
                    "INSERT INTO accounts (account_id, kind, currency, balance_minor, fence, created_at, updated_at) \
                     VALUES ('acct', 'CUSTOMER', 'EUR', 500, 0, ?1, ?1)",
                )
                .bind(at)
                .execute(&mut *tx)
                .await
                .expect("account");
                sqlx::query(
                    "INSERT INTO payouts (payout_id, account_id, amount_minor, currency, beneficiary_ref, state, \
                     attempt_count, created_at, updated_at) VALUES (?1, 'acct', 200, 'EUR', 'ben', ?2, 1, ?3, ?3)",
                )
                .bind(payout_id.to_string())
                .bind(state.as_str())
                .bind(at)
                .execute(&mut *tx)
                .await
                .expect("payout");
                if let Some((submission_id, outcome, reference)) = attempt {
                    sqlx::query(
                        "INSERT INTO rail_submission (submission_id, payout_id, account_id, presented_token, owner_id, \
                         idempotency_key, amount_minor, currency, outcome, rail_reference, submitted_at, resolved_at) \
                         VALUES (?1, ?2, 'acct', 1, 'o', 'k', 200, 'EUR', ?3, ?4, ?5, ?5)",
                    )
                    .bind(submission_id.to_string())
                    .bind(payout_id.to_string())
                    .bind(outcome.as_str())
                    .bind(reference)
                    .bind(at)
                    .execute(&mut *tx)
                    .await
                    .expect("attempt");
                }
                let post = Post {
                    payout_id,
                    token: 2,
                    owner_id: "o".into(),
                    submission_id: named,
                    rail_reference: "RR-1".into(),
                    posting_id: Uuid::from_u128(3),
                    entry_ids: [Uuid::from_u128(4), Uuid::from_u128(5)],
                    at,
                };
                let acked = matches!(attempt, Some((id, SubmissionOutcome::Acked, Some("RR-1"))) if id == named);
                let facts = PostFacts { state, acked, balance_minor: 500, amount_minor: 200 };
                let rule = rules::decide_post(&facts).expect("covered");
                let moved = sqlx::query(&sqlite_sql(post_move_sql()))
                    .bind(at)
                    .bind(payout_id.to_string())
                    .bind(payout_id.to_string())
                    .bind(named.to_string())
                    .bind("RR-1")
                    .fetch_optional(&mut *tx)
                    .await
                    .expect("post statement")
                    .is_some();
                let case = format!("{state:?} with {attempt:?}");
                assert_eq!(moved, matches!(rule, PostDecision::Posted { .. }), "{case}");
                if !moved {
                    // A refusal is classified by the same rule over what is read afterwards.
                    let refused = SqlitePaymentStore::post_refused(&mut tx, &post, &payout_id.to_string(), 500)
                        .await
                        .expect("classify");
                    let expected = match rule {
                        PostDecision::NotClaimable { state } => PostOutcome::NotClaimable { state },
                        PostDecision::RailMismatch => PostOutcome::RailMismatch,
                        PostDecision::Posted { .. } => unreachable!("a posting rule moved the row above"),
                    };
                    assert_eq!(refused, expected, "{case}");
                }
                tx.rollback().await.expect("rollback");
            }
        }
        assert_eq!(cases, 8 * 6);
    }

    #[tokio::test]
    async fn a_posting_is_one_insert_of_both_entries() {
        let (url, _dir) = dlock_testkit::fresh_database(dlock_testkit::Db::Sqlite).await;
        let store = SqlitePaymentStore::open(&url).await.expect("open paydb");
        let at = DateTime::<Utc>::from_timestamp_millis(1_795_000_000_000).expect("instant");
        let mut tx = store.pool.begin().await.expect("begin");
        dlock_paydb::sql::sqlite::upsert_system_accounts(
            &mut tx,
            &[(funding_account("EUR"), AccountKind::Funding), (settlement_account("EUR"), AccountKind::Settlement)],
            "EUR",
            at,
        )
        .await
        .expect("system accounts");
        let a = NewAccount {
            account_id: "acct".into(),
            currency: "EUR".into(),
            opening_balance_minor: 50,
            posting_id: Uuid::from_u128(1),
            entry_ids: [Uuid::from_u128(2), Uuid::from_u128(3)],
            at,
        };
        sqlx::query(
            "INSERT INTO accounts (account_id, kind, currency, balance_minor, fence, created_at, updated_at) \
             VALUES ('acct', 'CUSTOMER', 'EUR', 50, 0, ?1, ?1)",
        )
        .bind(at)
        .execute(&mut *tx)
        .await
        .expect("account");
        let entries = a.opening_entries(at);
        dlock_paydb::sql::sqlite::insert_entries(&mut tx, &entries).await.expect("one insert");
        let rows: Vec<(String, String, i64)> =
            sqlx::query_as("SELECT entry_id, direction, amount_minor FROM ledger_entries ORDER BY entry_id")
                .fetch_all(&mut *tx)
                .await
                .expect("read");
        let expected: Vec<(String, String, i64)> =
            entries.iter().map(|e| (e.entry_id.to_string(), e.direction.as_str().to_owned(), e.amount_minor)).collect();
        assert_eq!(rows, expected);
        tx.rollback().await.expect("rollback");
    }

    #[test]
    fn cursor_secret_must_be_32_bytes_of_hex() {
        assert_eq!(parse_secret(&"ab".repeat(32)), Ok([0xab; 32]));
        assert!(matches!(parse_secret("ab"), Err(StoreError::Corrupt(_))));
        assert!(matches!(parse_secret(&"zz".repeat(32)), Err(StoreError::Corrupt(_))));
    }
}
