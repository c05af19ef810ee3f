//! lockdb on PostgreSQL and SQLite, through sqlx.
//!
//! The statements are written once with `$n` placeholders; the two implementations differ
//! only in a few dialect fragments, passed to the macro that stamps the one body out:
//! how a transaction begins (SQLite: `BEGIN IMMEDIATE`, so the write lock is taken up
//! front and a read-then-write transaction can never deadlock on upgrade), how the
//! database's clock is read, and where the next token comes from (PostgreSQL: `nextval` of
//! the global `fencing_token_seq`, evaluated inside the statement that writes the grant, so
//! drawing the token costs no round trip of its own; SQLite: `token_floor.last_issued`,
//! advanced by its own statement in the granting transaction).
//!
//! The token-issuing transactions (acquire, rotate) are each dialect's own: `pg_grant` runs
//! them statement by statement, `sqlite_grant` in two calls to the connection's worker
//! (docs/performance.md "The lock server's grants"); both decide by the same rules on the
//! same context read (`ACQUIRE_CONTEXT`) and write the same statements.
//!
//! ## Rotate (C3-extensions E-18)
//! One transaction, like acquire: the per-key advisory lock (PostgreSQL), the acquire context
//! (now, the caller's session, the grant with its holder's session, the key record) in one
//! read, [`rules::decide_rotate`], then one `UPDATE` of the grant row that re-states the
//! release predicate (`(key, token)`, the caller's session, lease ahead of `now`) and sets
//! the fresh token. The session is checked in the same transaction that grants (the Jepsen
//! note at `acquire`). A concurrent release, reaper or close that removed the row after the
//! read leaves the `UPDATE` with no row (READ COMMITTED re-evaluates its predicate on the
//! row's newest version): the rotate then rolls back and answers `Lost`, having changed
//! nothing.
//!
//! ## The key's lock in the `BEGIN` (PostgreSQL)
//! An acquire's and a rotate's transaction opens with `BEGIN` and the key's advisory lock
//! sent as one simple query ([`pg_begin_key_sql`]: one round trip where there were two), so
//! the lock is still taken before anything is read or drawn. A connection whose such `BEGIN`
//! failed is closed, never pooled (`begin_key!`, in `pg_grant`). Revoke, and a key outside C3's alphabet,
//! take the same lock with a bound statement after `BEGIN`.
//!
//! ## Events (C3-extensions E-20)
//! Triggers write the outbox (`migrations/lockdb/*/20261207110000_create_events.sql`) on the
//! rows each operation already writes, in its transaction: no operation gains a statement.
//! The one ordering they need: a revoke writes its audit row *before* it deletes the grant,
//! so the deleted-grant trigger knows the grant was revoked. Reads: [`PgLockStore`] stops
//! below a hole until it is final ([`dlock_db::events::HoleGate`]); SQLite has one writer,
//! so every committed seq is final.
//!
//! ## Held keys (C3-extensions E-23)
//! One page is one `SELECT` ([`held_keys_sql`]), so one snapshot on both dialects without a
//! transaction: lockdb's clock, the token floor, and each grant in the page's bounds with
//! its holder session's end and its key's lock-delay. Keys compare bytewise on both
//! (`COLLATE "C"` on PostgreSQL, whose database collation may be a locale's), as on etcd and
//! in the simulation store, so every backend pages in one order.
//!
//! ## Time: lockdb's clock
//! Every method runs in one transaction and reads `now` first, from lockdb's clock
//! ([`clock`], C1 §1.4.2): a value in the database that only the judging replica's monotonic
//! clock advances. So every replica judges leases by the same clock, and no wall clock (a
//! replica's, or the database host's) decides one. Answers show instants on the answering
//! replica's wall clock ([`WallShift`]), for humans.

use std::ops::Bound;
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use dlock_contract::stream::{EventKind, StoredEvent};
use dlock_db::events::{HoleGate, Snapshot};
use dlock_db::Dialect;
use sqlx::Row;
use uuid::Uuid;

use crate::rules::{self, AcquireFacts, GrantFacts};
use crate::store::{
    AcquireRefusal, Addressed, EventRead, GrantRow, HeldKey, KeyInfo, LockStore, ReapReport, RenewRefusal, Revocation,
    RevokeRefusal, RotateRefusal, SessionRefusal, SessionRow, StoreError, WallShift,
};

pub mod clock;
pub use clock::{ClockJudge, CLOCK_TICK_MS, JUDGE_GRACE_MS};

static PG_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/lockdb/postgres");
static SQLITE_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/lockdb/sqlite");

fn unavailable(e: sqlx::Error) -> StoreError {
    if dlock_db::is_decode_error(&e) {
        StoreError::Corrupt(dlock_db::describe(&e))
    } else {
        StoreError::Unavailable(dlock_db::describe(&e))
    }
}

/// A failed `COMMIT`: a lost answer may have committed ([`StoreError::CommitUnknown`]);
/// any other failure committed nothing.
fn commit_error(e: sqlx::Error) -> StoreError {
    if dlock_db::is_commit_answer_lost(&e) {
        StoreError::CommitUnknown(dlock_db::describe(&e))
    } else {
        unavailable(e)
    }
}

fn parse_uuid(raw: &str) -> Result<Uuid, StoreError> {
    Uuid::parse_str(raw).map_err(|e| StoreError::Corrupt(format!("bad uuid {raw:?}: {e}")))
}

/// Opens lockdb at `url` and applies pending migrations.
pub async fn open(url: &str) -> Result<Arc<dyn LockStore>, StoreError> {
    match Dialect::of_url(url).map_err(StoreError::Unavailable)? {
        Dialect::Postgres => Ok(Arc::new(PgLockStore::open(url).await?)),
        Dialect::Sqlite => Ok(Arc::new(SqliteLockStore::open(url).await?)),
    }
}

/// Applies pending lockdb migrations at `url`; returns the versions the tree holds.
pub async fn migrate(url: &str) -> Result<Vec<i64>, StoreError> {
    let migrator = match Dialect::of_url(url).map_err(StoreError::Unavailable)? {
        Dialect::Postgres => {
            PgLockStore::open(url).await?;
            &PG_MIGRATOR
        }
        Dialect::Sqlite => {
            SqliteLockStore::open(url).await?;
            &SQLITE_MIGRATOR
        }
    };
    Ok(migrator.iter().map(|m| m.version).collect())
}

/// lockdb on PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgLockStore {
    pub pool: sqlx::PgPool,
    /// This replica's part in lockdb's clock ([`clock`]).
    pub judge: Arc<ClockJudge>,
    /// Answers' instants on this replica's wall clock.
    shift: Arc<WallShift>,
    /// The hole the outbox's reader waits on ([`HoleGate`]).
    events: Arc<HoleGate>,
}

impl PgLockStore {
    /// Connects, migrates, and repairs the token source: after a restore from an older
    /// backup the sequence may lag the persisted floor or the grants; it is moved past both,
    /// so no token is ever issued below `max(floor, last issued)`.
    pub async fn open(url: &str) -> Result<PgLockStore, StoreError> {
        let pool = dlock_db::pg_pool(url).await.map_err(unavailable)?;
        PG_MIGRATOR.run(&pool).await.map_err(|e| StoreError::Unavailable(format!("migrate: {e}")))?;
        sqlx::query(
            "SELECT setval('fencing_token_seq', m) FROM ( \
               SELECT GREATEST(f.floor, f.last_issued, (SELECT COALESCE(MAX(fencing_token), 0) FROM lock_grants)) AS m \
               FROM token_floor f WHERE f.id = 1) x \
             WHERE m > 0 AND m >= (SELECT last_value FROM fencing_token_seq)",
        )
        .execute(&pool)
        .await
        .map_err(unavailable)?;
        PgLockStore::over(pool).await
    }

    /// A store over `pool`, whose database is migrated already; starts this replica's part
    /// in lockdb's clock ([`clock`]).
    pub async fn over(pool: sqlx::PgPool) -> Result<PgLockStore, StoreError> {
        let (judge, shift) = clock_parts(pool.clone()).await?;
        Ok(PgLockStore { pool, judge, shift, events: Arc::new(HoleGate::new()) })
    }

    /// PostgreSQL's transactions run on the caller's task: its pool has many connections.
    fn writer(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        None
    }
}

/// lockdb on SQLite (the embedded default).
#[derive(Debug, Clone)]
pub struct SqliteLockStore {
    pub pool: sqlx::SqlitePool,
    /// This replica's part in lockdb's clock ([`clock`]).
    pub judge: Arc<ClockJudge>,
    /// Answers' instants on this replica's wall clock.
    shift: Arc<WallShift>,
    /// The thread its write transactions run on (docs/performance.md "The SQLite writer thread").
    writer: dlock_rt::dedicated::WriterThread,
}

impl PgLockStore {
    /// The release's one statement ([`RELEASE_LIVE`]), autocommitted: whether it deleted
    /// the grant. Built once: a release is on every payout's path.
    async fn delete_live_grant(&self, key: &str, token: i64) -> Result<bool, StoreError> {
        static SQL: LazyLock<String> = LazyLock::new(|| RELEASE_LIVE.replace("{NOW}", PG_NOW));
        let released =
            sqlx::query(&SQL).bind(key.to_owned()).bind(token).fetch_optional(&self.pool).await.map_err(unavailable)?;
        Ok(released.is_some())
    }
}

/// SQLite's release: [`RELEASE_LIVE`] in an unflushed batch. Built once.
static SQLITE_RELEASE_SQL: LazyLock<String> =
    LazyLock::new(|| dlock_db::sqlite_unflushed_sql(&[(&RELEASE_LIVE.replace("{NOW}", SQLITE_NOW), 2)]));

impl SqliteLockStore {
    /// The release's one statement ([`RELEASE_LIVE`]), autocommitted and not flushed by
    /// itself ([`dlock_db::sqlite_unflushed`],
    /// docs/performance.md "SQLite: unflushed releases"): whether it deleted the grant. The
    /// next flushed commit on the file (every grant, rotate, revoke and session write is
    /// one) makes it durable; only a power loss or an OS crash before that can undo it, and
    /// an undone release is a grant that lapses with its lease, as when the release's
    /// answer is lost.
    async fn delete_live_grant(&self, key: &str, token: i64) -> Result<bool, StoreError> {
        let release = sqlx::query(&SQLITE_RELEASE_SQL).bind(key.to_owned()).bind(token);
        let parts = dlock_db::sqlite_unflushed(&self.pool, release, 1).await.map_err(unavailable)?;
        Ok(parts.first().is_some_and(|deleted| !deleted.rows.is_empty()))
    }
}

impl SqliteLockStore {
    pub async fn open(url: &str) -> Result<SqliteLockStore, StoreError> {
        let pool = dlock_db::sqlite_pool(url).await.map_err(unavailable)?;
        SQLITE_MIGRATOR.run(&pool).await.map_err(|e| StoreError::Unavailable(format!("migrate: {e}")))?;
        let writer = dlock_db::sqlite_writer_thread().map_err(unavailable)?;
        let (judge, shift) = clock_parts(pool.clone()).await?;
        Ok(SqliteLockStore { pool, writer, judge, shift })
    }

    fn writer(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        Some(self.writer.clone())
    }
}

/// This replica's part in lockdb's clock, started on `db`, and the shift its answers use,
/// set from the clock's value now.
async fn clock_parts(db: impl crate::lockdb_clock::ClockDb) -> Result<(Arc<ClockJudge>, Arc<WallShift>), StoreError> {
    let shift = Arc::new(WallShift::new(dlock_rt::Clock::system(), None));
    let row = db.read().await.map_err(|e| StoreError::Unavailable(format!("lock_clock: {e}")))?;
    let row = row.ok_or_else(|| StoreError::Corrupt("lock_clock has no row".into()))?;
    shift.offset(row.now_ms);
    Ok((clock::start(db, dlock_rt::Clock::system()), shift))
}

fn grant_of(r: &impl RowLike) -> Result<GrantRow, StoreError> {
    Ok(GrantRow {
        key: r.text("lock_key")?,
        session_id: parse_uuid(&r.text("session_id")?)?,
        owner_id: r.text("owner_id")?,
        fencing_token: r.int("fencing_token")?,
        acquired_at_ms: r.int("acquired_at_ms")?,
        expires_at_ms: r.int("expires_at_ms")?,
    })
}

/// Column access shared by both row types.
trait RowLike {
    fn text(&self, col: &str) -> Result<String, StoreError>;
    fn int(&self, col: &str) -> Result<i64, StoreError>;
    fn opt_int(&self, col: &str) -> Result<Option<i64>, StoreError>;
    fn opt_text(&self, col: &str) -> Result<Option<String>, StoreError>;
}

macro_rules! row_like {
    ($row:ty) => {
        impl RowLike for $row {
            fn text(&self, col: &str) -> Result<String, StoreError> {
                self.try_get(col).map_err(unavailable)
            }
            fn int(&self, col: &str) -> Result<i64, StoreError> {
                self.try_get(col).map_err(unavailable)
            }
            fn opt_int(&self, col: &str) -> Result<Option<i64>, StoreError> {
                self.try_get(col).map_err(unavailable)
            }
            fn opt_text(&self, col: &str) -> Result<Option<String>, StoreError> {
                self.try_get(col).map_err(unavailable)
            }
        }
    };
}

row_like!(sqlx::postgres::PgRow);
row_like!(sqlx::sqlite::SqliteRow);

/// What an acquire or a rotate decides on, as [`ACQUIRE_CONTEXT`] read it.
struct GrantContext {
    now: i64,
    /// The caller's session: its owner and end (`None`: unknown).
    owner_id: Option<String>,
    session_end: Option<i64>,
    /// The key's grant, with its holder session's end.
    grant: Option<GrantRow>,
    holder_end: Option<i64>,
    /// The key's record: `None` never granted, `Some(delay_until)` seen.
    key_record: Option<Option<i64>>,
}

impl GrantContext {
    fn of(ctx: &impl RowLike) -> Result<GrantContext, StoreError> {
        Ok(GrantContext {
            now: ctx.int("now_ms")?,
            owner_id: ctx.opt_text("s_owner_id")?,
            session_end: ctx.opt_int("s_expires_at_ms")?,
            grant: ctx.opt_text("lock_key")?.map(|_| grant_of(ctx)).transpose()?,
            holder_end: ctx.opt_int("session_expires_at_ms")?,
            key_record: ctx.opt_text("k_lock_key")?.map(|_| ctx.opt_int("delay_until_ms")).transpose()?,
        })
    }

    fn grant_facts(&self) -> Option<GrantFacts<'_>> {
        self.grant.as_ref().map(|g| GrantFacts { grant: g, holder_end_ms: self.holder_end })
    }

    /// The facts an acquire (or a rotate's acquire part) by `session_id` decides on.
    fn acquire_facts(&self, session_id: Uuid, delay_ms: i64) -> AcquireFacts<'_> {
        AcquireFacts {
            now_ms: self.now,
            session_id,
            session_end_ms: self.session_end,
            grant: self.grant_facts(),
            key: self.key_record,
            delay_ms,
        }
    }
}

/// Whether an acquire refused with `refusal` still commits its decision's removal of a dead
/// grant, if it has one (it is part of what the call decided): only a lock-delay refusal
/// does, since the removal is what imposed the delay. Any other refusal rolls the removal
/// back with it.
fn keeps_removal(refusal: &AcquireRefusal) -> bool {
    matches!(refusal, AcquireRefusal::Delayed { .. })
}

mod pg_grant;
mod sqlite_grant;

/// The grant of a key with its session's expiry (NULL if the session is gone).
const GRANT_WITH_SESSION: &str = "SELECT g.lock_key, g.session_id, g.owner_id, g.fencing_token, g.acquired_at_ms, \
     g.expires_at_ms, s.expires_at_ms AS session_expires_at_ms \
     FROM lock_grants g LEFT JOIN lock_sessions s ON s.session_id = g.session_id WHERE g.lock_key = $1";

/// Everything an acquire decides on, in one round trip: the database's `now`, the caller's
/// session (`$1`), the key's grant with its session's expiry, and the key's row (the key is
/// bound twice, `$2` and `$3`: each placeholder once, in order, as a SQLite batch needs,
/// `dlock_db::sqlite_batch_sql`). `{NOW}` is replaced by the dialect's clock expression.
const ACQUIRE_CONTEXT: &str = "SELECT {NOW} AS now_ms,      s.owner_id AS s_owner_id, s.expires_at_ms AS s_expires_at_ms,      g.lock_key, g.session_id, g.owner_id, g.fencing_token, g.acquired_at_ms, g.expires_at_ms,      gs.expires_at_ms AS session_expires_at_ms,      k.lock_key AS k_lock_key, k.delay_until_ms      FROM (SELECT 1 AS one) o      LEFT JOIN lock_sessions s ON s.session_id = $1      LEFT JOIN lock_grants g ON g.lock_key = $2      LEFT JOIN lock_sessions gs ON gs.session_id = g.session_id      LEFT JOIN lock_keys k ON k.lock_key = $3";

/// Compare-and-delete of a live grant, as one statement: [`rules::decide_release`] in one
/// predicate (held to it by a test below), so a concurrent renew or reaper cannot slip in.
const RELEASE_LIVE: &str = "DELETE FROM lock_grants WHERE lock_key = $1 AND fencing_token = $2      AND expires_at_ms > {NOW}      AND session_id IN (SELECT session_id FROM lock_sessions WHERE expires_at_ms > {NOW})      RETURNING fencing_token";

/// The reaper's predicates ([`rules::session_lapsed`], [`rules::lease_lapsed`] of a grant
/// `g`, [`rules::session_forgettable`]), `$1` = now, `$2` = retention; held to the rules by a
/// test below.
const SESSION_LAPSED: &str = "NOT expired_marked AND expires_at_ms <= $1";
const LEASE_LAPSED: &str = "g.expires_at_ms <= $1";
const SESSION_FORGETTABLE: &str = "expired_marked AND expires_at_ms + $2 <= $1";

/// Raises a key's (`$3`) lock-delay to the value bound as both `$1` and `$2` (never lowers
/// it): [`rules::merge_delay`] in one statement (held to it by a test below), each
/// placeholder once, in order (a SQLite batch's form).
const RECORD_DELAY: &str = "UPDATE lock_keys SET delay_until_ms = \
     CASE WHEN delay_until_ms IS NOT NULL AND delay_until_ms > $1 THEN delay_until_ms ELSE $2 END \
     WHERE lock_key = $3";

/// Removes the grant `(key $1, token $2)` that died without release (an acquire's removal).
const DROP_GRANT: &str = "DELETE FROM lock_grants WHERE lock_key = $1 AND fencing_token = $2";

/// Records the key `$1` as granted at `$2` (first grant), or clears its run-out lock-delay.
const RECORD_KEY: &str = "INSERT INTO lock_keys (lock_key, first_granted_at_ms, delay_until_ms) VALUES ($1, $2, NULL) \
     ON CONFLICT (lock_key) DO UPDATE SET delay_until_ms = NULL";

/// The grant row of an acquire. `{TOKEN}` is the dialect's token expression, evaluated in
/// this statement: PostgreSQL's `nextval`, after the per-key advisory lock was taken by an
/// earlier statement of the same transaction, so the ordering argument at `tx_lock_key` is
/// unchanged (`pg_grant`); SQLite's value its batch just drew (`sqlite_grant`).
const INSERT_GRANT: &str =
    "INSERT INTO lock_grants (lock_key, session_id, owner_id, fencing_token, acquired_at_ms, expires_at_ms) \
     VALUES ($1, $2, $3, {TOKEN}, $4, $5) ON CONFLICT (lock_key) DO NOTHING RETURNING fencing_token";

/// The rotate's write: the fresh grant (acquired at `now` `$1`, expiring at `$2`, owner `$3`,
/// token `{TOKEN}`: the dialect's token expression, as in [`INSERT_GRANT`]) written over the grant
/// `(key $4, token $5)` held by the caller's session `$6` with its lease ahead of `now`
/// (bound again as `$7`): the release predicate, re-stated so a row changed since the context
/// read is not touched. Each placeholder once, in order (a SQLite batch's form).
const ROTATE_GRANT: &str =
    "UPDATE lock_grants SET fencing_token = {TOKEN}, acquired_at_ms = $1, expires_at_ms = $2, owner_id = $3 \
     WHERE lock_key = $4 AND fencing_token = $5 AND session_id = $6 AND expires_at_ms > $7 \
     RETURNING fencing_token";

/// PostgreSQL: `BEGIN` and the key's advisory lock (`tx_lock_key`'s, the same lock id:
/// `hashtextextended` of the key as text) as one simple query, so a token-issuing
/// transaction opens serialised on its key in one round trip, not two. The key is inlined
/// as a string literal, so only a key of C3's alphabet (`[a-zA-Z0-9:._-]{1,128}`,
/// [`dlock_contract::lock::is_lock_key`]: no quote, no backslash) is; any other key gets
/// `None`, and its transaction takes the lock with its own bound statement, as before.
pub fn pg_begin_key_sql(key: &str) -> Option<String> {
    dlock_contract::lock::is_lock_key(key)
        .then(|| format!("BEGIN; SELECT pg_advisory_xact_lock(hashtextextended('{key}', 0))"))
}

macro_rules! sql_lock_store {
    ($store:ty, $dialect:expr, $begin:expr, $now:expr, $next_token:expr, $key_lock:expr) => {
        impl $store {
            /// The dialect's `BEGIN`.
            const BEGIN: &'static str = $begin;

            fn q(sql: &str) -> String {
                $dialect.sql(sql).into_owned()
            }

            /// Serialises every token-issuing transaction on one key (acquire, rotate, revoke) for
            /// the rest of the transaction, before anything is read. Without it, on
            /// PostgreSQL, an acquire could draw its token, stall, and commit after a later
            /// token was granted and released on the same key: tokens would go backwards
            /// in grant order. SQLite needs nothing: `BEGIN IMMEDIATE` already serialises
            /// every writer.
            async fn tx_lock_key(tx: &mut sqlx::Transaction<'_, <$store as DbOf>::Db>, key: &str) -> Result<(), StoreError> {
                let lock: Option<&str> = $key_lock;
                if let Some(sql) = lock {
                    sqlx::query(sql).bind(key.to_owned()).execute(&mut **tx).await.map_err(unavailable)?;
                }
                Ok(())
            }

            async fn begin(&self) -> Result<sqlx::Transaction<'_, <$store as DbOf>::Db>, StoreError> {
                self.pool.begin_with(Self::BEGIN).await.map_err(unavailable)
            }

            async fn tx_now(tx: &mut sqlx::Transaction<'_, <$store as DbOf>::Db>) -> Result<i64, StoreError> {
                sqlx::query(&format!("SELECT {} AS now_ms", $now))
                    .fetch_one(&mut **tx)
                    .await
                    .and_then(|r| r.try_get::<i64, _>("now_ms"))
                    .map_err(unavailable)
            }

            async fn tx_next_token(tx: &mut sqlx::Transaction<'_, <$store as DbOf>::Db>) -> Result<i64, StoreError> {
                sqlx::query($next_token)
                    .fetch_one(&mut **tx)
                    .await
                    .and_then(|r| r.try_get::<i64, _>("token"))
                    .map_err(unavailable)
            }

            /// The session's expiry, or why it cannot act.
            async fn tx_session(
                tx: &mut sqlx::Transaction<'_, <$store as DbOf>::Db>,
                session_id: Uuid,
                now: i64,
            ) -> Result<Result<(String, i64, i64), SessionRefusal>, StoreError> {
                let row = sqlx::query(&Self::q(
                    "SELECT owner_id, ttl_ms, expires_at_ms FROM lock_sessions WHERE session_id = $1",
                ))
                .bind(session_id.to_string())
                .fetch_optional(&mut **tx)
                .await
                .map_err(unavailable)?;
                let expires = row.as_ref().map(|r| r.int("expires_at_ms")).transpose()?;
                if let Err(refusal) = rules::session_check(expires, now) {
                    return Ok(Err(refusal));
                }
                let (Some(row), Some(expires)) = (row, expires) else { return Ok(Err(SessionRefusal::Unknown)) };
                Ok(Ok((row.text("owner_id")?, row.int("ttl_ms")?, expires)))
            }

            /// The token of the key's stored grant (`None`: no grant), read outside any
            /// transaction: what a refused release, renew or rotate reports.
            async fn stored_token(&self, key: &str) -> Result<Option<i64>, StoreError> {
                sqlx::query(&Self::q("SELECT fencing_token FROM lock_grants WHERE lock_key = $1"))
                    .bind(key.to_owned())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(unavailable)?
                    .map(|r| r.int("fencing_token"))
                    .transpose()
            }

            /// The key's grant row with its holder session's end (`None`: session gone).
            async fn tx_grant(
                tx: &mut sqlx::Transaction<'_, <$store as DbOf>::Db>,
                key: &str,
            ) -> Result<Option<(GrantRow, Option<i64>)>, StoreError> {
                let row = sqlx::query(&Self::q(GRANT_WITH_SESSION))
                    .bind(key.to_owned())
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(unavailable)?;
                let Some(row) = row else { return Ok(None) };
                Ok(Some((grant_of(&row)?, row.opt_int("session_expires_at_ms")?)))
            }

            /// Removes a grant that died without release, recording the lock-delay its loss
            /// imposes (`delay_until`, from [`rules::lock_delay_until`]). Returns whether this
            /// call removed it (a concurrent reaper may have been first).
            async fn tx_drop_lost(
                tx: &mut sqlx::Transaction<'_, <$store as DbOf>::Db>,
                key: &str,
                token: i64,
                delay_until: Option<i64>,
            ) -> Result<bool, StoreError> {
                if let Some(until) = delay_until {
                    sqlx::query(&Self::q(RECORD_DELAY))
                        .bind(until)
                        .bind(until)
                        .bind(key.to_owned())
                        .execute(&mut **tx)
                        .await
                        .map_err(unavailable)?;
                }
                let removed =
                    sqlx::query(&Self::q(DROP_GRANT))
                        .bind(key.to_owned())
                        .bind(token)
                        .execute(&mut **tx)
                        .await
                        .map_err(unavailable)?
                        .rows_affected();
                Ok(removed == 1)
            }
        }

        #[async_trait]
        impl LockStore for $store {
            fn judges_clock(&self) -> bool {
                self.judge.is_judging()
            }

            fn pool_stats(&self) -> Option<dlock_http::metrics::PoolStats> {
                let idle = u32::try_from(self.pool.num_idle()).unwrap_or(u32::MAX);
                Some(dlock_http::metrics::PoolStats { size: self.pool.size(), idle })
            }

            fn writer_thread(&self) -> Option<dlock_rt::dedicated::WriterThread> {
                self.writer()
            }

            async fn ping(&self) -> Result<(), StoreError> {
                sqlx::query("SELECT 1").execute(&self.pool).await.map(|_| ()).map_err(unavailable)
            }

            async fn now_ms(&self) -> Result<i64, StoreError> {
                let now = sqlx::query(&format!("SELECT {} AS now_ms", $now))
                    .fetch_one(&self.pool)
                    .await
                    .and_then(|r| r.try_get::<i64, _>("now_ms"))
                    .map_err(unavailable)?;
                Ok(now.saturating_add(self.shift.offset(now)))
            }

            async fn open_session(
                &self,
                session_id: Uuid,
                owner_id: &str,
                ttl_ms: i64,
            ) -> Result<SessionRow, StoreError> {
                let mut tx = self.begin().await?;
                let now = Self::tx_now(&mut tx).await?;
                sqlx::query(&Self::q(
                    "INSERT INTO lock_sessions (session_id, owner_id, ttl_ms, created_at_ms, expires_at_ms, expired_marked) \
                     VALUES ($1, $2, $3, $4, $5, FALSE)",
                ))
                .bind(session_id.to_string())
                .bind(owner_id.to_owned())
                .bind(ttl_ms)
                .bind(now)
                .bind(now + ttl_ms)
                .execute(&mut *tx)
                .await
                .map_err(unavailable)?;
                tx.commit().await.map_err(commit_error)?;
                let row = SessionRow { session_id, owner_id: owner_id.to_owned(), ttl_ms, expires_at_ms: now + ttl_ms };
                Ok(WallShift::session(row, self.shift.offset(now)))
            }

            async fn heartbeat(
                &self,
                session_id: Uuid,
            ) -> Result<Result<(SessionRow, i64), SessionRefusal>, StoreError> {
                let mut tx = self.begin().await?;
                let now = Self::tx_now(&mut tx).await?;
                let (owner_id, ttl_ms) = match Self::tx_session(&mut tx, session_id, now).await? {
                    Ok((owner, ttl, _)) => (owner, ttl),
                    Err(r) => return Ok(Err(r)),
                };
                sqlx::query(&Self::q("UPDATE lock_sessions SET expires_at_ms = $2 WHERE session_id = $1"))
                    .bind(session_id.to_string())
                    .bind(now + ttl_ms)
                    .execute(&mut *tx)
                    .await
                    .map_err(unavailable)?;
                // The session is live (checked above), so its grants are live iff their lease is.
                let held: i64 = sqlx::query(&Self::q(
                    "SELECT COUNT(*) AS held FROM lock_grants WHERE session_id = $1 AND expires_at_ms > $2",
                ))
                .bind(session_id.to_string())
                .bind(now)
                .fetch_one(&mut *tx)
                .await
                .and_then(|r| r.try_get("held"))
                .map_err(unavailable)?;
                tx.commit().await.map_err(commit_error)?;
                let row = SessionRow { session_id, owner_id, ttl_ms, expires_at_ms: now + ttl_ms };
                Ok(Ok((WallShift::session(row, self.shift.offset(now)), held)))
            }

            async fn close_session(
                &self,
                session_id: Uuid,
                delay_ms: i64,
            ) -> Result<Result<(), SessionRefusal>, StoreError> {
                let mut tx = self.begin().await?;
                let now = Self::tx_now(&mut tx).await?;
                let session = sqlx::query(&Self::q("SELECT expires_at_ms FROM lock_sessions WHERE session_id = $1"))
                    .bind(session_id.to_string())
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(unavailable)?;
                let Some(session) = session else { return Ok(Err(SessionRefusal::Unknown)) };
                let session_expires: i64 = session.int("expires_at_ms")?;
                let grants = sqlx::query(&Self::q(
                    "SELECT lock_key, fencing_token, expires_at_ms FROM lock_grants WHERE session_id = $1 ORDER BY lock_key",
                ))
                .bind(session_id.to_string())
                .fetch_all(&mut *tx)
                .await
                .map_err(unavailable)?;
                for g in &grants {
                    let (key, token, expires) = (g.text("lock_key")?, g.int("fencing_token")?, g.int("expires_at_ms")?);
                    if let Some(died_at) = rules::lost_before_close(expires, session_expires, now) {
                        // Lost before the close: its lock-delay stands.
                        let until = rules::lock_delay_until(Some(died_at), delay_ms);
                        Self::tx_drop_lost(&mut tx, &key, token, until).await?;
                    }
                }
                // Deleting the session releases its remaining grants (ON DELETE CASCADE).
                sqlx::query(&Self::q("DELETE FROM lock_sessions WHERE session_id = $1"))
                    .bind(session_id.to_string())
                    .execute(&mut *tx)
                    .await
                    .map_err(unavailable)?;
                tx.commit().await.map_err(commit_error)?;
                Ok(Ok(()))
            }

            async fn acquire(
                &self,
                key: &str,
                session_id: Uuid,
                ttl_ms: i64,
                delay_ms: i64,
            ) -> Result<Result<GrantRow, AcquireRefusal>, StoreError> {
                // The dialect's token-issuing transaction (`pg_grant`, `sqlite_grant`). A grant
                // was acquired at lockdb's now.
                Ok(match self.acquire_grant(key, session_id, ttl_ms, delay_ms).await? {
                    Ok(g) => {
                        let offset = self.shift.offset(g.acquired_at_ms);
                        Ok(WallShift::grant(g, offset))
                    }
                    Err(r) => Err(WallShift::acquire_refusal(r, self.shift.current())),
                })
            }

            async fn rotate(
                &self,
                key: &str,
                session_id: Uuid,
                token: i64,
                ttl_ms: i64,
                delay_ms: i64,
            ) -> Result<Result<GrantRow, RotateRefusal>, StoreError> {
                Ok(match self.rotate_grant(key, session_id, token, ttl_ms, delay_ms).await? {
                    Ok(g) => {
                        let offset = self.shift.offset(g.acquired_at_ms);
                        Ok(WallShift::grant(g, offset))
                    }
                    Err(r) => Err(WallShift::rotate_refusal(r, self.shift.current())),
                })
            }

            async fn renew(
                &self,
                key: &str,
                session_id: Uuid,
                token: i64,
                ttl_ms: i64,
            ) -> Result<Result<GrantRow, RenewRefusal>, StoreError> {
                let mut tx = self.begin().await?;
                let now = Self::tx_now(&mut tx).await?;
                let session_end = match Self::tx_session(&mut tx, session_id, now).await? {
                    Ok((_, _, end)) => Some(end),
                    Err(r) => return Ok(Err(RenewRefusal::Session(r))),
                };
                let current = Self::tx_grant(&mut tx, key).await?;
                let facts = current.as_ref().map(|(g, h)| GrantFacts { grant: g, holder_end_ms: *h });
                if let Err(refusal) = rules::decide_renew(session_end, facts, session_id, token, now) {
                    return Ok(Err(refusal));
                }
                let Some((g, _)) = current else { return Ok(Err(RenewRefusal::Lost { stored_token: None })) };
                // The grant may have died and been replaced since the read: only a row this
                // statement actually extended counts.
                let extended = sqlx::query(&Self::q(
                    "UPDATE lock_grants SET expires_at_ms = $3 \
                     WHERE lock_key = $1 AND fencing_token = $2 AND session_id = $4 AND expires_at_ms > $5",
                ))
                .bind(key.to_owned())
                .bind(token)
                .bind(now + ttl_ms)
                .bind(session_id.to_string())
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(unavailable)?
                .rows_affected();
                if extended != 1 {
                    tx.rollback().await.map_err(unavailable)?;
                    return Ok(Err(RenewRefusal::Lost { stored_token: self.stored_token(key).await? }));
                }
                tx.commit().await.map_err(commit_error)?;
                Ok(Ok(WallShift::grant(GrantRow { expires_at_ms: now + ttl_ms, ..g }, self.shift.offset(now))))
            }

            async fn release(&self, key: &str, token: i64) -> Result<Result<(), Option<i64>>, StoreError> {
                // One statement, no explicit transaction: the predicate is the whole decision.
                if self.delete_live_grant(key, token).await? {
                    return Ok(Ok(()));
                }
                Ok(Err(self.stored_token(key).await?))
            }

            async fn owner_of(&self, target: Addressed<'_>) -> Result<Option<String>, StoreError> {
                let row = match target {
                    Addressed::Session(id) => {
                        sqlx::query(&Self::q("SELECT owner_id FROM lock_sessions WHERE session_id = $1"))
                            .bind(id.to_string())
                            .fetch_optional(&self.pool)
                            .await
                    }
                    Addressed::Grant { key, token } => sqlx::query(&Self::q(
                        "SELECT owner_id FROM lock_grants WHERE lock_key = $1 AND fencing_token = $2",
                    ))
                    .bind(key.to_owned())
                    .bind(token)
                    .fetch_optional(&self.pool)
                    .await,
                };
                row.map_err(unavailable)?.map(|r| r.text("owner_id")).transpose()
            }

            async fn info(&self, key: &str, delay_ms: i64) -> Result<Option<KeyInfo>, StoreError> {
                let mut tx = self.begin().await?;
                let now = Self::tx_now(&mut tx).await?;
                let seen = sqlx::query(&Self::q("SELECT delay_until_ms FROM lock_keys WHERE lock_key = $1"))
                    .bind(key.to_owned())
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(unavailable)?;
                let Some(seen) = seen else {
                    tx.rollback().await.map_err(unavailable)?;
                    return Ok(None);
                };
                let delay_until = seen.opt_int("delay_until_ms")?;
                let grant = Self::tx_grant(&mut tx, key).await?;
                let floor = sqlx::query(token_floor_sql($dialect))
                    .fetch_one(&mut *tx)
                    .await
                    .and_then(|r| r.try_get::<i64, _>("floor"))
                    .map_err(unavailable)?;
                tx.rollback().await.map_err(unavailable)?;
                let facts = grant.as_ref().map(|(g, h)| GrantFacts { grant: g, holder_end_ms: *h });
                let info = rules::judge_key(facts, delay_until, delay_ms, floor, now);
                Ok(Some(KeyInfo { grant: info.grant.map(|g| WallShift::grant(g, self.shift.offset(now))), ..info }))
            }

            async fn held_keys(
                &self,
                prefix: &str,
                after: Option<&str>,
                limit: usize,
                delay_ms: i64,
            ) -> Result<Vec<HeldKey>, StoreError> {
                let Some((from, until)) = rules::key_range(prefix, after) else { return Ok(Vec::new()) };
                let sql = held_keys_sql($dialect, $now, (&from, &until));
                let mut query = sqlx::query(&sql);
                for bound in [&from, &until] {
                    if let Bound::Included(k) | Bound::Excluded(k) = bound {
                        query = query.bind(k.clone());
                    }
                }
                // One statement: one snapshot, with no explicit transaction to hold.
                let rows = query
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(unavailable)?;
                let mut page = Vec::with_capacity(rows.len());
                for row in &rows {
                    let (now, floor) = (row.int("now_ms")?, row.int("token_floor_now")?);
                    let grant = grant_of(row)?;
                    let facts = GrantFacts { grant: &grant, holder_end_ms: row.opt_int("session_expires_at_ms")? };
                    let info = rules::judge_key(Some(facts), row.opt_int("delay_until_ms")?, delay_ms, floor, now);
                    let offset = self.shift.offset(now);
                    let info = KeyInfo { grant: info.grant.map(|g| WallShift::grant(g, offset)), ..info };
                    page.push(HeldKey { key: grant.key, info });
                }
                Ok(page)
            }

            async fn revoke(
                &self,
                key: &str,
                operator: &str,
                reason: &str,
                expected_token: Option<i64>,
                revocation_id: Uuid,
            ) -> Result<Result<Revocation, RevokeRefusal>, StoreError> {
                let mut tx = self.begin().await?;
                Self::tx_lock_key(&mut tx, key).await?;
                let now = Self::tx_now(&mut tx).await?;
                let current = Self::tx_grant(&mut tx, key).await?;
                let facts = current.as_ref().map(|(g, h)| GrantFacts { grant: g, holder_end_ms: *h });
                let revoked = match rules::decide_revoke(facts, expected_token, now) {
                    Ok(token) => token,
                    Err(refusal) => {
                        tx.rollback().await.map_err(unavailable)?;
                        return Ok(Err(refusal));
                    }
                };
                let floor = Self::tx_next_token(&mut tx).await?;
                sqlx::query(&Self::q(
                    "UPDATE token_floor SET floor = $1, \
                     last_issued = CASE WHEN last_issued > $1 THEN last_issued ELSE $1 END WHERE id = 1",
                ))
                .bind(floor)
                .execute(&mut *tx)
                .await
                .map_err(unavailable)?;
                sqlx::query(&Self::q(
                    "INSERT INTO lock_revocations (revocation_id, lock_key, operator, reason, revoked_token, \
                     new_token_floor, revoked_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                ))
                .bind(revocation_id.to_string())
                .bind(key.to_owned())
                .bind(operator.to_owned())
                .bind(reason.to_owned())
                .bind(revoked)
                .bind(floor)
                // An audit instant, for humans: this replica's wall clock.
                .bind(now.saturating_add(self.shift.offset(now)))
                .execute(&mut *tx)
                .await
                .map_err(unavailable)?;
                // After the audit row: the deleted-grant trigger finds it, and records
                // `lock.revoked` with the new floor (module doc, "Events").
                sqlx::query(&Self::q(DROP_GRANT))
                    .bind(key.to_owned())
                    .bind(revoked)
                    .execute(&mut *tx)
                    .await
                    .map_err(unavailable)?;
                tx.commit().await.map_err(commit_error)?;
                Ok(Ok(Revocation { revoked_token: revoked, new_token_floor: floor, revocation_id }))
            }

            async fn reap(&self, limit: i64, delay_ms: i64, retention_ms: i64) -> Result<ReapReport, StoreError> {
                let mut tx = self.begin().await?;
                let now = Self::tx_now(&mut tx).await?;
                let mut report = ReapReport::default();
                let lapsed = sqlx::query(&Self::q(&format!(
                    "SELECT session_id, expires_at_ms FROM lock_sessions \
                     WHERE {SESSION_LAPSED} ORDER BY expires_at_ms, session_id LIMIT $2"
                )))
                .bind(now)
                .bind(limit)
                .fetch_all(&mut *tx)
                .await
                .map_err(unavailable)?;
                for s in &lapsed {
                    let (sid, session_expires) = (s.text("session_id")?, s.int("expires_at_ms")?);
                    let grants = sqlx::query(&Self::q(
                        "SELECT lock_key, fencing_token, expires_at_ms FROM lock_grants WHERE session_id = $1 ORDER BY lock_key",
                    ))
                    .bind(sid.clone())
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(unavailable)?;
                    for g in &grants {
                        let died_at = rules::grant_dies_at(g.int("expires_at_ms")?, Some(session_expires));
                        let until = rules::lock_delay_until(died_at, delay_ms);
                        let removed =
                            Self::tx_drop_lost(&mut tx, &g.text("lock_key")?, g.int("fencing_token")?, until).await?;
                        report.released_grants += u64::from(removed);
                    }
                    let marked = sqlx::query(&Self::q(
                        "UPDATE lock_sessions SET expired_marked = TRUE WHERE session_id = $1 AND NOT expired_marked",
                    ))
                    .bind(sid)
                    .execute(&mut *tx)
                    .await
                    .map_err(unavailable)?
                    .rows_affected();
                    report.expired_sessions += marked;
                }
                let lapsed_grants = sqlx::query(&Self::q(&format!(
                    "SELECT g.lock_key, g.fencing_token, g.expires_at_ms, s.expires_at_ms AS session_expires_at_ms \
                     FROM lock_grants g LEFT JOIN lock_sessions s ON s.session_id = g.session_id \
                     WHERE {LEASE_LAPSED} ORDER BY g.expires_at_ms, g.lock_key LIMIT $2"
                )))
                .bind(now)
                .bind(limit)
                .fetch_all(&mut *tx)
                .await
                .map_err(unavailable)?;
                for g in &lapsed_grants {
                    let died_at = rules::grant_dies_at(g.int("expires_at_ms")?, g.opt_int("session_expires_at_ms")?);
                    let until = rules::lock_delay_until(died_at, delay_ms);
                    let removed =
                        Self::tx_drop_lost(&mut tx, &g.text("lock_key")?, g.int("fencing_token")?, until).await?;
                    report.released_grants += u64::from(removed);
                }
                report.forgotten_sessions = sqlx::query(&Self::q(&format!(
                    "DELETE FROM lock_sessions WHERE session_id IN ( \
                       SELECT session_id FROM lock_sessions WHERE {SESSION_FORGETTABLE} \
                       ORDER BY expires_at_ms LIMIT $3)"
                )))
                .bind(now)
                .bind(retention_ms)
                .bind(limit)
                .execute(&mut *tx)
                .await
                .map_err(unavailable)?
                .rows_affected();
                tx.commit().await.map_err(commit_error)?;
                Ok(report)
            }

            async fn read_events(&self, after: i64, limit: usize) -> Result<EventRead, StoreError> {
                self.outbox_read(after, limit).await
            }

            async fn purge_events(&self, keep: i64) -> Result<u64, StoreError> {
                let mut tx = self.pool.begin().await.map_err(unavailable)?;
                let through: i64 = sqlx::query(&Self::q(PURGE_MARK))
                    .bind(keep.max(0))
                    .fetch_one(&mut *tx)
                    .await
                    .and_then(|r| r.try_get("purged_through"))
                    .map_err(unavailable)?;
                let n = sqlx::query(&Self::q("DELETE FROM events WHERE seq <= $1"))
                    .bind(through)
                    .execute(&mut *tx)
                    .await
                    .map_err(unavailable)?;
                tx.commit().await.map_err(commit_error)?;
                Ok(n.rows_affected())
            }
        }
    };
}

/// The outbox's rows after `$1`, at most `$2`, in seq order.
const EVENTS_AFTER: &str = "SELECT seq, kind, at_ms, lock_key, body FROM events WHERE seq > $1 ORDER BY seq LIMIT $2";
/// The purge mark: the highest seq the retention purge has deleted.
const PURGED_THROUGH: &str = "SELECT purged_through FROM event_retention WHERE id = 1";
/// The purge's first statement: raises the mark to the highest seq it deletes (all but the
/// newest `$1`), never lowering it.
const PURGE_MARK: &str = "UPDATE event_retention SET purged_through = \
     CASE WHEN purged_through > m THEN purged_through ELSE m END \
     FROM (SELECT COALESCE((SELECT seq FROM events ORDER BY seq DESC LIMIT 1 OFFSET $1), 0) AS m) x \
     WHERE id = 1 RETURNING purged_through";

/// One outbox row as stored.
fn event_of(r: &impl RowLike) -> Result<StoredEvent, StoreError> {
    let kind = r.text("kind")?;
    let kind = EventKind::parse(&kind).ok_or_else(|| StoreError::Corrupt(format!("events: unknown kind {kind:?}")))?;
    let body = serde_json::from_str(&r.text("body")?).map_err(|e| StoreError::Corrupt(format!("events: body: {e}")))?;
    let at_ms = r.int("at_ms")?;
    let at = chrono::DateTime::from_timestamp_millis(at_ms)
        .ok_or_else(|| StoreError::Corrupt(format!("events: at_ms {at_ms} out of range")))?;
    Ok(StoredEvent {
        seq: r.int("seq")?,
        kind,
        at,
        account_id: None,
        payout_id: None,
        lock_key: r.opt_text("lock_key")?,
        body,
    })
}

impl PgLockStore {
    /// The final events after `after` (at most `limit`), the head and the purge mark: one
    /// REPEATABLE READ transaction reads the snapshot, the rows and the mark; the hole gate
    /// keeps the read below any seq that may still commit (module doc, "Events").
    async fn outbox_read(&self, after: i64, limit: usize) -> Result<EventRead, StoreError> {
        let mut tx = self.pool.begin().await.map_err(unavailable)?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *tx)
            .await
            .map_err(unavailable)?;
        let snap: String =
            sqlx::query_scalar("SELECT pg_current_snapshot()::text").fetch_one(&mut *tx).await.map_err(unavailable)?;
        let snap = Snapshot::parse(&snap).ok_or_else(|| StoreError::Corrupt(format!("snapshot {snap:?}")))?;
        let rows = sqlx::query(EVENTS_AFTER)
            .bind(after)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await
            .map_err(unavailable)?;
        let purged_through: i64 = sqlx::query_scalar(PURGED_THROUGH).fetch_one(&mut *tx).await.map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        let seqs: Vec<i64> = rows.iter().map(|r| r.int("seq")).collect::<Result<_, _>>()?;
        let from = after.max(purged_through);
        let skip = seqs.partition_point(|&s| s <= from);
        let (n, head) = self.events.pass(from, &seqs[skip..], &snap);
        let events = rows[skip..skip + n].iter().map(event_of).collect::<Result<Vec<_>, _>>()?;
        Ok(EventRead { events, head: head.max(after), purged_through })
    }
}

impl SqliteLockStore {
    /// The events after `after` (at most `limit`): one writer, so every committed seq is
    /// final; the head is the last seq returned on a full page, else the last committed.
    async fn outbox_read(&self, after: i64, limit: usize) -> Result<EventRead, StoreError> {
        let mut tx = self.pool.begin().await.map_err(unavailable)?;
        let rows = sqlx::query(&Dialect::Sqlite.sql(EVENTS_AFTER))
            .bind(after)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await
            .map_err(unavailable)?;
        let purged_through: i64 = sqlx::query_scalar(PURGED_THROUGH).fetch_one(&mut *tx).await.map_err(unavailable)?;
        let last: Option<i64> =
            sqlx::query_scalar("SELECT MAX(seq) FROM events").fetch_one(&mut *tx).await.map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        let events = rows.iter().map(event_of).collect::<Result<Vec<_>, _>>()?;
        let head = match events.last() {
            Some(e) if events.len() == limit => e.seq,
            _ => last.unwrap_or(0).max(after),
        };
        Ok(EventRead { events, head, purged_through })
    }
}

/// The sqlx database of a store type.
trait DbOf {
    type Db: sqlx::Database;
}

impl DbOf for PgLockStore {
    type Db = sqlx::Postgres;
}

impl DbOf for SqliteLockStore {
    type Db = sqlx::Sqlite;
}

/// The token floor L7 shows ([`KeyInfo::token_floor`]): every token drawn later exceeds it.
/// PostgreSQL draws tokens from `fencing_token_seq`, whose `last_value` is the last drawn
/// once `is_called`; SQLite advances `token_floor.last_issued`.
fn token_floor_sql(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => {
            "SELECT GREATEST(f.floor, f.last_issued, \
               (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM fencing_token_seq)) AS floor \
             FROM token_floor f WHERE f.id = 1"
        }
        Dialect::Sqlite => "SELECT MAX(floor, last_issued) AS floor FROM token_floor WHERE id = 1",
    }
}

/// One page of held keys (C3-extensions E-23) as one statement, so one snapshot on both
/// dialects: lockdb's clock, the token floor, and each stored grant in the bounds
/// ([`rules::key_range`]) with its holder session's end and its key's recorded lock-delay,
/// in bytewise key order (PostgreSQL compares under `COLLATE "C"`, SQLite's default is
/// `BINARY`), at most the last placeholder's count. The bounds' placeholders come first,
/// in order, one per bound that is not `Unbounded`.
fn held_keys_sql(dialect: Dialect, now: &str, (from, until): (&Bound<String>, &Bound<String>)) -> String {
    let key = match dialect {
        Dialect::Postgres => "g.lock_key COLLATE \"C\"",
        Dialect::Sqlite => "g.lock_key",
    };
    let mut conds = Vec::new();
    for (bound, included, excluded) in [(from, ">=", ">"), (until, "<=", "<")] {
        let op = match bound {
            Bound::Included(_) => included,
            Bound::Excluded(_) => excluded,
            Bound::Unbounded => continue,
        };
        conds.push(format!("{key} {op} ${}", conds.len() + 1));
    }
    let filter = if conds.is_empty() { String::new() } else { format!("WHERE {}", conds.join(" AND ")) };
    let sql = format!(
        "SELECT {now} AS now_ms, ({floor}) AS token_floor_now, g.lock_key, g.session_id, g.owner_id, \
         g.fencing_token, g.acquired_at_ms, g.expires_at_ms, s.expires_at_ms AS session_expires_at_ms, \
         k.delay_until_ms \
         FROM lock_grants g LEFT JOIN lock_sessions s ON s.session_id = g.session_id \
         LEFT JOIN lock_keys k ON k.lock_key = g.lock_key \
         {filter} ORDER BY {key} LIMIT ${limit}",
        floor = token_floor_sql(dialect),
        limit = conds.len() + 1,
    );
    dialect.sql(&sql).into_owned()
}

/// lockdb's clock on PostgreSQL ([`clock::CLOCK_NOW`]).
const PG_NOW: &str = clock::CLOCK_NOW;

sql_lock_store!(
    PgLockStore,
    Dialect::Postgres,
    "BEGIN",
    PG_NOW,
    "SELECT nextval('fencing_token_seq') AS token",
    Some("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
);
/// lockdb's clock on SQLite ([`clock::CLOCK_NOW`]).
const SQLITE_NOW: &str = clock::CLOCK_NOW;
/// SQLite's next token, as an expression over `token_floor`: past the last issued and past
/// the revocation floor.
macro_rules! sqlite_token_after {
    () => {
        "MAX(last_issued, floor) + 1"
    };
}
/// SQLite's next token: `token_floor.last_issued` advanced past the revocation floor.
const SQLITE_NEXT_TOKEN: &str = concat!(
    "UPDATE token_floor SET last_issued = ",
    sqlite_token_after!(),
    " WHERE id = 1 RETURNING last_issued AS token"
);
/// The token [`SQLITE_NEXT_TOKEN`] would issue now, without issuing it (read under the write
/// lock, it is the token the transaction's own draw then issues).
const SQLITE_TOKEN_AFTER: &str = concat!("(SELECT ", sqlite_token_after!(), " FROM token_floor WHERE id = 1)");

sql_lock_store!(SqliteLockStore, Dialect::Sqlite, "BEGIN IMMEDIATE", SQLITE_NOW, SQLITE_NEXT_TOKEN, None);

#[cfg(test)]
mod tests {
    //! The statements that re-state a rule inside one SQL predicate, held to the pure
    //! function in [`crate::rules`] over every boundary case (SQLite; PostgreSQL runs the
    //! same text, and the conformance suite runs both).

    use super::*;

    async fn store() -> (SqliteLockStore, dlock_testkit::TempDir) {
        let (url, dir) = dlock_testkit::fresh_database(dlock_testkit::Db::Sqlite).await;
        (SqliteLockStore::open(&url).await.expect("open lockdb"), dir)
    }

    /// docs/performance.md "The SQLite writer thread": the lock server runs its SQLite
    /// store's writes on the process's SQLite writer thread (through the wrappers
    /// `LockServer::new` puts around the store).
    #[tokio::test]
    async fn the_lock_server_runs_sqlite_writes_on_the_writer_thread() {
        let (store, _dir) = store().await;
        let cfg = crate::service::LockServerConfig::default();
        let server = crate::service::LockServer::new(Arc::new(store), cfg, dlock_rt::Clock::system());
        let on = server.write(|_| async { std::thread::current().name().map(str::to_owned) }).await;
        assert_eq!(on.as_deref(), Some(dlock_db::SQLITE_WRITER_THREAD_NAME));
    }

    /// `lock_clock_judge` shows whether this replica advances lockdb's clock: 1 once its
    /// store took the role, 0 on a store without a judge.
    #[tokio::test]
    async fn the_replica_that_judges_lockdbs_clock_says_so_on_metrics() {
        let judged = |server: Arc<crate::service::LockServer>| async move {
            let text = server.render_metrics(&["lock_clock_judge".to_owned()]);
            text.lines().find_map(|l| l.strip_prefix("lock_clock_judge ")).map(str::to_owned)
        };
        let (store, _dir) = store().await;
        let cfg = crate::service::LockServerConfig::default();
        let server = crate::service::LockServer::new(Arc::new(store), cfg.clone(), dlock_rt::Clock::system());
        let one = dlock_rt::wait_until(dlock_rt::Duration::from_millis(10), dlock_rt::Duration::from_secs(10), || {
            let server = server.clone();
            async move { judged(server).await.filter(|v| v == "1") }
        })
        .await;
        assert_eq!(one.as_deref(), Some("1"), "the only replica never became the judge");
        let mem = Arc::new(crate::store_mem::MemLockStore::new(dlock_rt::Clock::system()));
        let without = crate::service::LockServer::new(mem, cfg, dlock_rt::Clock::system());
        assert_eq!(judged(without).await.as_deref(), Some("0"));
    }

    /// docs/performance.md "SQLite: unflushed releases": a release runs unflushed, and the
    /// writer it hands back flushes again, after a release that deleted the grant and after
    /// one refused for a stale token alike.
    #[tokio::test]
    async fn a_sqlite_release_runs_unflushed_and_leaves_the_writer_flushing() {
        use crate::store::LockStore as _;
        let (store, _dir) = store().await;
        let level = |store: &SqliteLockStore| {
            let pool = store.pool.clone();
            async move { sqlx::query_scalar::<_, i64>("PRAGMA synchronous").fetch_one(&pool).await.expect("pragma") }
        };
        let session = Uuid::from_u128(1);
        store.open_session(session, "o", 60_000).await.expect("session");
        let granted = store.acquire("k", session, 60_000, 0).await.expect("acquire").expect("granted");
        assert_eq!(level(&store).await, 2, "a grant runs at FULL");
        let refused = store.release("k", granted.fencing_token - 1).await.expect("release");
        assert_eq!(refused, Err(Some(granted.fencing_token)), "a stale token releases nothing");
        assert_eq!(level(&store).await, 2, "the writer after a refused release flushes");
        store.release("k", granted.fencing_token).await.expect("release").expect("released");
        assert_eq!(level(&store).await, 2, "the writer after a release flushes");
        let again = store.acquire("k", session, 60_000, 0).await.expect("acquire").expect("the released key is free");
        assert!(again.fencing_token > granted.fencing_token);
        assert!(SQLITE_RELEASE_SQL.starts_with(dlock_db::SQLITE_UNFLUSHED_PRAGMA), "the release runs unflushed");
    }

    #[tokio::test]
    async fn release_predicate_is_the_release_rule() {
        let (store, _dir) = store().await;
        let ends = [5i64, 10, 15];
        let mut case = 0;
        for lease in ends {
            for session_end in ends {
                for presented in [7i64, 8] {
                    for now in 3..17 {
                        case += 1;
                        let (sid, key) = (Uuid::from_u128(case), format!("k{case}"));
                        let mut tx = store.pool.begin().await.expect("begin");
                        sqlx::query(
                            "INSERT INTO lock_sessions (session_id, owner_id, ttl_ms, created_at_ms, expires_at_ms, \
                             expired_marked) VALUES (?, 'o', 1, 0, ?, FALSE)",
                        )
                        .bind(sid.to_string())
                        .bind(session_end)
                        .execute(&mut *tx)
                        .await
                        .expect("session");
                        sqlx::query(
                            "INSERT INTO lock_grants (lock_key, session_id, owner_id, fencing_token, acquired_at_ms, \
                             expires_at_ms) VALUES (?, ?, 'o', 7, 0, ?)",
                        )
                        .bind(key.clone())
                        .bind(sid.to_string())
                        .bind(lease)
                        .execute(&mut *tx)
                        .await
                        .expect("grant");
                        let sql = Dialect::Sqlite.sql(&RELEASE_LIVE.replace("{NOW}", &now.to_string())).into_owned();
                        let released = sqlx::query(&sql)
                            .bind(key.clone())
                            .bind(presented)
                            .fetch_optional(&mut *tx)
                            .await
                            .expect("release")
                            .is_some();
                        tx.rollback().await.expect("rollback");
                        let row = GrantRow {
                            key,
                            session_id: sid,
                            owner_id: "o".into(),
                            fencing_token: 7,
                            acquired_at_ms: 0,
                            expires_at_ms: lease,
                        };
                        let facts = rules::GrantFacts { grant: &row, holder_end_ms: Some(session_end) };
                        let rule = rules::decide_release(Some(facts), presented, now).is_ok();
                        assert_eq!(
                            released, rule,
                            "lease {lease}, session {session_end}, token {presented}, now {now}"
                        );
                    }
                }
            }
        }
    }

    #[tokio::test]
    async fn record_delay_statement_is_the_merge_rule() {
        let (store, _dir) = store().await;
        for recorded in [None, Some(-3i64), Some(4), Some(10)] {
            for until in [-5i64, 4, 5, 20] {
                let mut tx = store.pool.begin().await.expect("begin");
                sqlx::query("INSERT INTO lock_keys (lock_key, first_granted_at_ms, delay_until_ms) VALUES ('k', 0, ?)")
                    .bind(recorded)
                    .execute(&mut *tx)
                    .await
                    .expect("key");
                sqlx::query(&Dialect::Sqlite.sql(RECORD_DELAY))
                    .bind(until)
                    .bind(until)
                    .bind("k")
                    .execute(&mut *tx)
                    .await
                    .expect("record");
                let after: Option<i64> = sqlx::query("SELECT delay_until_ms FROM lock_keys WHERE lock_key = 'k'")
                    .fetch_one(&mut *tx)
                    .await
                    .and_then(|r| r.try_get("delay_until_ms"))
                    .expect("read");
                tx.rollback().await.expect("rollback");
                assert_eq!(after, rules::merge_delay(recorded, Some(until)), "recorded {recorded:?}, until {until}");
            }
        }
    }

    #[tokio::test]
    async fn reaper_predicates_are_the_reaper_rules() {
        let (store, _dir) = store().await;
        let mut tx = store.pool.begin().await.expect("begin");
        let mut rows = Vec::new();
        for (i, (end, marked)) in [5i64, 10, 15].into_iter().flat_map(|e| [(e, false), (e, true)]).enumerate() {
            let sid = Uuid::from_u128(i as u128 + 1);
            sqlx::query(
                "INSERT INTO lock_sessions (session_id, owner_id, ttl_ms, created_at_ms, expires_at_ms, expired_marked) \
                 VALUES (?, 'o', 1, 0, ?, ?)",
            )
            .bind(sid.to_string())
            .bind(end)
            .bind(marked)
            .execute(&mut *tx)
            .await
            .expect("session");
            sqlx::query(
                "INSERT INTO lock_grants (lock_key, session_id, owner_id, fencing_token, acquired_at_ms, expires_at_ms) \
                 VALUES (?, ?, 'o', ?, 0, ?)",
            )
            .bind(format!("k{i}"))
            .bind(sid.to_string())
            .bind(i as i64 + 1)
            .bind(end + 2)
            .execute(&mut *tx)
            .await
            .expect("grant");
            rows.push((sid.to_string(), format!("k{i}"), end, marked));
        }
        let ids = |sql: String, now: i64, retention: i64| {
            let sql = Dialect::Sqlite.sql(&sql).into_owned();
            let pool = store.pool.clone();
            async move {
                let mut tx = pool.begin().await.expect("begin");
                let found: Vec<String> = sqlx::query(&sql)
                    .bind(now)
                    .bind(retention)
                    .fetch_all(&mut *tx)
                    .await
                    .expect("select")
                    .iter()
                    .map(|r| r.try_get::<String, _>("id").expect("id"))
                    .collect();
                tx.rollback().await.expect("rollback");
                std::collections::BTreeSet::from_iter(found)
            }
        };
        tx.commit().await.expect("commit");
        for now in 3..20 {
            for retention in [0i64, 3] {
                let lapsed = ids(
                    format!("SELECT session_id AS id FROM lock_sessions WHERE {SESSION_LAPSED} AND $2 = $2"),
                    now,
                    retention,
                )
                .await;
                let want = rows.iter().filter(|r| rules::session_lapsed(r.2, r.3, now)).map(|r| r.0.clone()).collect();
                assert_eq!(lapsed, want, "lapsed at {now}");
                let forgettable = ids(
                    format!("SELECT session_id AS id FROM lock_sessions WHERE {SESSION_FORGETTABLE}"),
                    now,
                    retention,
                )
                .await;
                let want = rows
                    .iter()
                    .filter(|r| rules::session_forgettable(r.2, r.3, retention, now))
                    .map(|r| r.0.clone())
                    .collect();
                assert_eq!(forgettable, want, "forgettable at {now}, retention {retention}");
                let leases = ids(
                    format!("SELECT g.lock_key AS id FROM lock_grants g WHERE {LEASE_LAPSED} AND $2 = $2"),
                    now,
                    retention,
                )
                .await;
                let want = rows.iter().filter(|r| rules::lease_lapsed(r.2 + 2, now)).map(|r| r.1.clone()).collect();
                assert_eq!(leases, want, "leases lapsed at {now}");
            }
        }
    }
}
