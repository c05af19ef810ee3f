//! paydb on PostgreSQL and SQLite, through sqlx, as the payment-resource sees it.
//!
//! The SQL is written once, with `$n` placeholders, and the same statements run on both
//! databases (SQLite gets `?n`, its numbered form, or `?` inside a batch). The two stores,
//! [`PgPaymentStore`] and [`SqlitePaymentStore`], differ only in their pool and row types:
//! each file below stamps its operation's inherent fns for both with its own
//! `macro_rules!`, and `sql_payment_store!` stamps the [`PaymentStore`] impl, which only
//! delegates to them. Files, per operation:
//!
//! - `gate.rs`: gate and fence, what every deciding transaction opens and ends with: the
//!   identity gate (statement 0), the account fence, the recorded answer, commit or
//!   rollback, and a claim's or post's gate, fence and read per dialect;
//! - `claim.rs`: the claim (P2, P2b); `post.rs`: the post (P3, P3b);
//! - `create.rs`: the creates (P0, P1) and the operator's abandon and resolution;
//! - `reads.rs`: the autocommitted reads; `purge.rs`: the idempotency purge, the record
//!   count and the cursor key;
//! - `tests.rs`: the unit tests of the statements, held to the rules they apply.
//!
//! Every mutating method is one transaction whose first statement is the idempotency
//! upsert (statement 0, design §4). It is a write, so SQLite holds its write lock from the
//! first statement, and PostgreSQL makes a concurrent duplicate wait on the identity's
//! primary key until the first transaction ends. An outcome that commits a mutation is
//! rendered inside the transaction ([`crate::answer`]) and written into the identity row
//! before the commit; a refusal rolls back, identity row included.
//!
//! Claims and posts (C3-extensions E-19, P2b and P3b; a single claim or post, P2 or P3, is
//! a batch of one: [`crate::store::Claim::batch_of_one`], [`crate::store::Post::batch_of_one`]):
//! one transaction per batch, the account's fence passed once, in three steps.
//!
//! 1. The identity gate and the strict fence on the CUSTOMER account
//!    (`UPDATE accounts … WHERE account_id = … AND kind = 'CUSTOMER' AND fence < $token`),
//!    the fence chained to the gate in SQL so a request the gate refuses (a replay, or a
//!    conflict) raises no fence (asserted) and rolls back: on PostgreSQL one statement
//!    (`gate::pg_batch_gate_fence_sql`, `dlock_db::pg_cte_sql`, `AND EXISTS (SELECT 1 FROM
//!    gate)`); on SQLite one batch with the read (`AND changes() = 1`).
//! 2. The read of every payout the batch names (`= ANY`, or `unnest` of the posts'
//!    attempts) and, for a claim, the account's reservation; for a post, whether the
//!    attempt it names is the payout's ACKED one. On PostgreSQL it is its own statement,
//!    behind the fence's row lock: under READ COMMITTED one statement reads one snapshot,
//!    taken before it waits for the row lock, so a read folded into the fence could miss
//!    a claim that committed during the wait (overspend). A fence that did not rise reads
//!    why instead (`ACCOUNT_FENCE_REFUSED_SQL`), and the transaction rolls back.
//! 3. The rule decides each payout in order ([`crate::rules::decide_claim_batch`],
//!    [`crate::rules::decide_post_batch`]); then every write and the recorded answer as one
//!    statement on PostgreSQL, one batch on SQLite: a claim's conditional transitions
//!    (`claim::pg_claim_batch_move_and_record_sql`); a post's transitions to POSTED, the
//!    settlement accounts, every ledger entry, the one debit of their sum
//!    (`post::pg_post_batch_writes_sql`). Each transition is conditional on what the read
//!    saw; a payout that moved in between (the proxy or an operator: no account row lock)
//!    fails the batch as `Unavailable`, nothing written.
//!
//! So on PostgreSQL a claim or post that moves a payout is five statements whatever the batch's size
//! (`BEGIN`, gate and fence, the read, the writes, `COMMIT`), and on SQLite four calls to
//! the writer (`BEGIN`, gate, fence and read, the writes, `COMMIT`). No text varies with
//! the batch's size (the payouts are one array bind on PostgreSQL, one JSON text read with
//! `json_each` on SQLite), but for PostgreSQL's move of one claimed payout, which has a
//! scalar form the server plans once (`claim::PG_CLAIM_ONE_MOVE_SQL`). docs/performance.md "Claims and posts: folded statements" and
//! "SQLite: statements batched into one call". Every SQLite write transaction runs on the
//! process's SQLite writer thread (docs/performance.md "The SQLite writer thread",
//! [`PaymentStore::writer_thread`]).
//!
//! Errors: connection failures, timeouts and busy answers are [`StoreError::Unavailable`]
//! (nothing was decided); a commit whose answer was lost is [`StoreError::CommitUnknown`];
//! a constraint or trigger refusing a statement the store issued, or content the store
//! cannot read, is [`StoreError::Corrupt`].

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dlock_db::Dialect;
use uuid::Uuid;

use crate::payout_accounts::PayoutAccounts;
use crate::store::{
    AbandonOutcome, AccountView, AmbiguousResolution, Answering, ClaimBatch, ClaimBatchOutcome, ClaimOutcome,
    CreateAccountOutcome, CreatePayoutOutcome, Decided, IdemRequest, Idempotent, LedgerEntry, ListQuery, NewAccount,
    NewPayout, PaymentStore, PayoutSummary, PayoutView, PostBatch, PostBatchOutcome, PostOutcome, ResolutionRow,
    ResolveOutcome, StoreError, StoredResponse,
};

use dlock_contract::stream::EventKind;
use dlock_paydb::events::{self, sql::PgEventReader, EventRead};
use dlock_paydb::sql::{db_error, PG_MIGRATOR, SQLITE_MIGRATOR};

/// The `paydb_secrets.name` of the P1 cursor key.
pub use dlock_paydb::events::sql::CURSOR_SECRET_NAME;

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

impl Commits for ResolveOutcome {
    fn commits(&self) -> bool {
        matches!(self, ResolveOutcome::Resolved { .. })
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
    /// The event outbox's reader (C3-extensions E-20): it remembers the hole it waits on.
    events: Arc<PgEventReader>,
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
        Ok(PgPaymentStore {
            read_pool: pool.clone(),
            pool,
            accounts: Arc::new(PayoutAccounts::new()),
            events: Arc::new(PgEventReader::new()),
        })
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

/// A claim or post its account's fence refused (the fenced-out outcome): what its
/// `fence.refused` event says (C3-extensions E-20, [`events::fence_refused_body`]).
struct FenceRefused<'a> {
    /// `claim` or `post`.
    operation: &'static str,
    account_id: &'a str,
    token: i64,
    /// The fence as the refusal read it.
    fence: i64,
    owner_id: &'a str,
    payout_ids: Vec<Uuid>,
    at: DateTime<Utc>,
}

impl<'a> FenceRefused<'a> {
    /// The refusal `decided` is, if its account's fence refused it: `operation` (`claim` or
    /// `post`) of `payout_ids` of `account_id` under `token` by `owner_id` at `at`.
    fn of<T>(
        decided: &crate::store::Decided<crate::store::BatchOutcome<T>>,
        operation: &'static str,
        (account_id, token, owner_id, at): (&'a str, i64, &'a str, DateTime<Utc>),
        payout_ids: impl Iterator<Item = Uuid>,
    ) -> Option<FenceRefused<'a>> {
        let Ok(crate::store::Idempotent::Executed {
            outcome: crate::store::BatchOutcome::Fenced { highest_token },
            ..
        }) = decided
        else {
            return None;
        };
        let payout_ids = payout_ids.collect();
        Some(FenceRefused { operation, account_id, token, fence: *highest_token, owner_id, payout_ids, at })
    }

    fn body(&self) -> serde_json::Value {
        let ids: Vec<String> = self.payout_ids.iter().map(Uuid::to_string).collect();
        events::fence_refused_body(self.operation, self.token, self.fence, self.owner_id, &ids)
    }

    /// A failed write of the event changes no answer: it is logged, and the caller goes on.
    fn failed(&self, e: &StoreError) {
        tracing::warn!(operation = self.operation, account = self.account_id, token = self.token, cause = %e,
            "paydb_fence_refused_event_not_written");
    }
}

impl PgPaymentStore {
    /// Writes the `fence.refused` event of a refusal that rolled back, in a transaction of its
    /// own.
    async fn write_fence_refused(&self, r: &FenceRefused<'_>) {
        let at = dlock_contract::time::truncate_ms(r.at);
        let written =
            events::sql::pg_insert(&self.pool, EventKind::FenceRefused, at, Some(r.account_id), None, &r.body()).await;
        if let Err(e) = written {
            r.failed(&e);
        }
    }
}

impl SqlitePaymentStore {
    /// As [`PgPaymentStore::write_fence_refused`], on the writer connection (the caller's
    /// thread: a claim or post runs on the process's SQLite writer thread,
    /// [`PaymentStore::writer_thread`]).
    async fn write_fence_refused(&self, r: &FenceRefused<'_>) {
        let at = dlock_contract::time::truncate_ms(r.at);
        let written =
            events::sql::sqlite_insert(&self.pool, EventKind::FenceRefused, at, Some(r.account_id), None, &r.body())
                .await;
        if let Err(e) = written {
            r.failed(&e);
        }
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

mod claim;
mod create;
mod gate;
mod post;
mod purge;
mod reads;
#[cfg(test)]
mod tests;

/// Stamps the [`PaymentStore`] impl of a store: each method delegates to its operation's
/// inherent fn (`gate.rs`, `claim.rs`, `post.rs`, `create.rs`, `reads.rs`, `purge.rs`).
macro_rules! sql_payment_store {
    ($store:ty) => {
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
                self.run_cursor_secret(candidate, at).await
            }

            async fn create_account(
                &self,
                a: &NewAccount,
                i: &IdemRequest,
                how: &Answering,
            ) -> Decided<CreateAccountOutcome> {
                self.run_create_account(a, i, how).await
            }

            async fn create_payout(
                &self,
                p: &NewPayout,
                i: &IdemRequest,
                a: &Answering,
            ) -> Decided<CreatePayoutOutcome> {
                self.run_create_payout(p, i, a).await
            }

            async fn claim(&self, b: &ClaimBatch, i: &IdemRequest, a: &Answering) -> Decided<ClaimBatchOutcome> {
                self.run_claim(b, i, a).await
            }

            async fn post(&self, b: &PostBatch, i: &IdemRequest, a: &Answering) -> Decided<PostBatchOutcome> {
                self.run_post(b, i, a).await
            }

            async fn abandon(&self, payout_id: Uuid, at: DateTime<Utc>) -> Result<AbandonOutcome, StoreError> {
                self.run_abandon(payout_id, at).await
            }

            async fn resolve_ambiguous(&self, r: &AmbiguousResolution) -> Result<ResolveOutcome, StoreError> {
                self.run_resolve_ambiguous(r).await
            }

            async fn resolve_recorded(
                &self,
                r: &AmbiguousResolution,
                i: &IdemRequest,
                a: &Answering,
            ) -> Decided<ResolveOutcome> {
                self.run_resolve_recorded(r, i, a).await
            }

            async fn resolutions(&self, payout_id: Option<Uuid>) -> Result<Vec<ResolutionRow>, StoreError> {
                self.read_resolutions(payout_id).await
            }

            async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutView>, StoreError> {
                self.read_payout(payout_id).await
            }

            async fn payout_account(&self, payout_id: Uuid) -> Result<Option<String>, StoreError> {
                self.read_payout_account(payout_id).await
            }

            async fn account(&self, account_id: &str) -> Result<Option<AccountView>, StoreError> {
                self.read_account(account_id).await
            }

            async fn accounts(&self) -> Result<Vec<AccountView>, StoreError> {
                self.read_accounts().await
            }

            async fn list(&self, q: &ListQuery) -> Result<Vec<PayoutSummary>, StoreError> {
                self.read_list(q).await
            }

            async fn ledger(&self, account_id: Option<&str>) -> Result<Vec<LedgerEntry>, StoreError> {
                self.read_ledger(account_id).await
            }

            async fn oldest_pending_created_at(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
                self.read_oldest_pending_created_at().await
            }

            async fn purge_idempotency(&self, now: DateTime<Utc>, batch_max: i64) -> Result<u64, StoreError> {
                self.run_purge_idempotency(now, batch_max).await
            }

            async fn idempotency_record_count(&self) -> Result<u64, StoreError> {
                self.count_idempotency_records().await
            }

            async fn read_events(&self, after: i64, limit: usize) -> Result<EventRead, StoreError> {
                self.read_event_page(after, limit).await
            }

            async fn read_final_events(&self, after: i64, upto: i64, limit: usize) -> Result<EventRead, StoreError> {
                self.read_final_event_page(after, upto, limit).await
            }

            async fn purge_events(&self, keep: i64) -> Result<u64, StoreError> {
                self.run_purge_events(keep).await
            }
        }
    };
}

/// The event outbox on PostgreSQL: reads through the store's one [`PgEventReader`].
impl PgPaymentStore {
    async fn read_event_page(&self, after: i64, limit: usize) -> Result<EventRead, StoreError> {
        self.events.read(&self.read_pool, after, limit).await
    }

    async fn read_final_event_page(&self, after: i64, upto: i64, limit: usize) -> Result<EventRead, StoreError> {
        events::sql::pg_read_final(&self.read_pool, after, upto, limit).await
    }

    async fn run_purge_events(&self, keep: i64) -> Result<u64, StoreError> {
        events::sql::pg_purge(&self.pool, keep).await
    }
}

/// The event outbox on SQLite: reads off the writer connection, the purge on it.
impl SqlitePaymentStore {
    async fn read_event_page(&self, after: i64, limit: usize) -> Result<EventRead, StoreError> {
        events::sql::sqlite_read(&self.read_pool, after, limit).await
    }

    async fn read_final_event_page(&self, after: i64, upto: i64, limit: usize) -> Result<EventRead, StoreError> {
        Ok(events::sql::sqlite_read(&self.read_pool, after, limit).await?.clipped(after, upto, limit))
    }

    async fn run_purge_events(&self, keep: i64) -> Result<u64, StoreError> {
        events::sql::sqlite_purge(&self.pool, keep).await
    }
}

sql_payment_store!(PgPaymentStore);
sql_payment_store!(SqlitePaymentStore);
