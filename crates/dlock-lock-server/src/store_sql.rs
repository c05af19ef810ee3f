//! lockdb on PostgreSQL and SQLite, through sqlx.
//!
//! The statements are written once with `$n` placeholders; the two implementations differ
//! only in three dialect fragments, passed to the macro that stamps the one body out:
//! how a transaction begins (SQLite: `BEGIN IMMEDIATE`, so the write lock is taken up
//! front and a read-then-write transaction can never deadlock on upgrade), how the
//! database's clock is read, and where the next token comes from (PostgreSQL: `nextval` of
//! the global `fencing_token_seq`; SQLite: `token_floor.last_issued`, advanced in the
//! granting transaction).
//!
//! Every method runs in one transaction and reads `now` from the database first, so every
//! replica judges leases by the same clock.

use std::sync::Arc;

use async_trait::async_trait;
use dlock_db::Dialect;
use sqlx::Row;
use uuid::Uuid;

use crate::store::{
    AcquireRefusal, GrantRow, KeyInfo, LockStore, ReapReport, RenewRefusal, Revocation, RevokeRefusal, SessionRefusal,
    SessionRow, StoreError,
};

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
        Ok(PgLockStore { pool })
    }
}

/// lockdb on SQLite (the embedded default).
#[derive(Debug, Clone)]
pub struct SqliteLockStore {
    pub pool: sqlx::SqlitePool,
}

impl SqliteLockStore {
    pub async fn open(url: &str) -> Result<SqliteLockStore, StoreError> {
        let pool = dlock_db::sqlite_pool(url).await.map_err(unavailable)?;
        SQLITE_MIGRATOR.run(&pool).await.map_err(|e| StoreError::Unavailable(format!("migrate: {e}")))?;
        Ok(SqliteLockStore { pool })
    }
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

/// The grant of a key with its session's expiry (NULL if the session is gone).
const GRANT_WITH_SESSION: &str = "SELECT g.lock_key, g.session_id, g.owner_id, g.fencing_token, g.acquired_at_ms, \
     g.expires_at_ms, s.expires_at_ms AS session_expires_at_ms \
     FROM lock_grants g LEFT JOIN lock_sessions s ON s.session_id = g.session_id WHERE g.lock_key = $1";

/// Everything an acquire decides on, in one round trip: the database's `now`, the caller's
/// session (`$2`), the key's (`$1`) grant with its session's expiry, and the key's row.
/// `{NOW}` is replaced by the dialect's clock expression.
const ACQUIRE_CONTEXT: &str = "SELECT {NOW} AS now_ms,      s.owner_id AS s_owner_id, s.expires_at_ms AS s_expires_at_ms,      g.lock_key, g.session_id, g.owner_id, g.fencing_token, g.acquired_at_ms, g.expires_at_ms,      gs.expires_at_ms AS session_expires_at_ms,      k.lock_key AS k_lock_key, k.delay_until_ms      FROM (SELECT 1 AS one) o      LEFT JOIN lock_sessions s ON s.session_id = $2      LEFT JOIN lock_grants g ON g.lock_key = $1      LEFT JOIN lock_sessions gs ON gs.session_id = g.session_id      LEFT JOIN lock_keys k ON k.lock_key = $1";

/// Compare-and-delete of a live grant, as one statement.
const RELEASE_LIVE: &str = "DELETE FROM lock_grants WHERE lock_key = $1 AND fencing_token = $2      AND expires_at_ms > {NOW}      AND session_id IN (SELECT session_id FROM lock_sessions WHERE expires_at_ms > {NOW})      RETURNING fencing_token";

/// Raises a key's lock-delay to `$2` (never lowers it).
const RECORD_DELAY: &str = "UPDATE lock_keys SET delay_until_ms = \
     CASE WHEN COALESCE(delay_until_ms, 0) > $2 THEN delay_until_ms ELSE $2 END WHERE lock_key = $1";

macro_rules! sql_lock_store {
    ($store:ty, $dialect:expr, $begin:expr, $now:expr, $next_token:expr, $key_lock:expr) => {
        impl $store {
            fn q(sql: &str) -> String {
                $dialect.sql(sql).into_owned()
            }

            /// Serialises every token-issuing transaction on one key (acquire, revoke) for
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
                self.pool.begin_with($begin).await.map_err(unavailable)
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
                let Some(row) = row else { return Ok(Err(SessionRefusal::Unknown)) };
                let expires: i64 = row.int("expires_at_ms")?;
                if now >= expires {
                    return Ok(Err(SessionRefusal::Expired));
                }
                Ok(Ok((row.text("owner_id")?, row.int("ttl_ms")?, expires)))
            }

            /// The key's grant row and whether it is live, plus when it died if not.
            async fn tx_grant(
                tx: &mut sqlx::Transaction<'_, <$store as DbOf>::Db>,
                key: &str,
                now: i64,
            ) -> Result<Option<(GrantRow, bool, i64)>, StoreError> {
                let row = sqlx::query(&Self::q(GRANT_WITH_SESSION))
                    .bind(key.to_owned())
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(unavailable)?;
                let Some(row) = row else { return Ok(None) };
                let grant = grant_of(&row)?;
                let session_expires = row.opt_int("session_expires_at_ms")?;
                let died_at = session_expires.map_or(grant.expires_at_ms, |s| s.min(grant.expires_at_ms));
                let live = now < died_at;
                Ok(Some((grant, live, died_at)))
            }

            /// Removes a grant that died without release, recording its lock-delay. Returns
            /// whether this call removed it (a concurrent reaper may have been first).
            async fn tx_drop_lost(
                tx: &mut sqlx::Transaction<'_, <$store as DbOf>::Db>,
                key: &str,
                token: i64,
                died_at: i64,
                delay_ms: i64,
            ) -> Result<bool, StoreError> {
                if delay_ms > 0 {
                    sqlx::query(&Self::q(RECORD_DELAY))
                        .bind(key.to_owned())
                        .bind(died_at + delay_ms)
                        .execute(&mut **tx)
                        .await
                        .map_err(unavailable)?;
                }
                let removed =
                    sqlx::query(&Self::q("DELETE FROM lock_grants WHERE lock_key = $1 AND fencing_token = $2"))
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
            async fn ping(&self) -> Result<(), StoreError> {
                sqlx::query("SELECT 1").execute(&self.pool).await.map(|_| ()).map_err(unavailable)
            }

            async fn now_ms(&self) -> Result<i64, StoreError> {
                sqlx::query(&format!("SELECT {} AS now_ms", $now))
                    .fetch_one(&self.pool)
                    .await
                    .and_then(|r| r.try_get::<i64, _>("now_ms"))
                    .map_err(unavailable)
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
                Ok(SessionRow { session_id, owner_id: owner_id.to_owned(), ttl_ms, expires_at_ms: now + ttl_ms })
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
                Ok(Ok((SessionRow { session_id, owner_id, ttl_ms, expires_at_ms: now + ttl_ms }, held)))
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
                    let died_at = expires.min(session_expires);
                    if died_at <= now {
                        // Lost before the close: its lock-delay stands.
                        Self::tx_drop_lost(&mut tx, &key, token, died_at, delay_ms).await?;
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
                let mut tx = self.begin().await?;
                Self::tx_lock_key(&mut tx, key).await?;
                // The session is checked in the same transaction that grants (Jepsen etcd 3.4.3).
                let ctx = sqlx::query(&Self::q(&ACQUIRE_CONTEXT.replace("{NOW}", $now)))
                    .bind(key.to_owned())
                    .bind(session_id.to_string())
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(unavailable)?;
                let now = ctx.int("now_ms")?;
                let owner_id = match (ctx.opt_text("s_owner_id")?, ctx.opt_int("s_expires_at_ms")?) {
                    (Some(owner), Some(expires)) if now < expires => owner,
                    (Some(_), Some(_)) => return Ok(Err(AcquireRefusal::Session(SessionRefusal::Expired))),
                    _ => return Ok(Err(AcquireRefusal::Session(SessionRefusal::Unknown))),
                };
                let mut delay_until = ctx.opt_int("delay_until_ms")?;
                let key_seen = ctx.opt_text("k_lock_key")?.is_some();
                if ctx.opt_text("lock_key")?.is_some() {
                    let g = grant_of(&ctx)?;
                    let session_expires = ctx.opt_int("session_expires_at_ms")?;
                    let died_at = session_expires.map_or(g.expires_at_ms, |e| e.min(g.expires_at_ms));
                    if now < died_at {
                        return Ok(Err(if g.session_id == session_id {
                            AcquireRefusal::AlreadyHeld { fencing_token: g.fencing_token, expires_at_ms: g.expires_at_ms }
                        } else {
                            AcquireRefusal::Contended { holder_owner_id: g.owner_id, expires_at_ms: g.expires_at_ms }
                        }));
                    }
                    Self::tx_drop_lost(&mut tx, key, g.fencing_token, died_at, delay_ms).await?;
                    if delay_ms > 0 {
                        delay_until = Some(delay_until.map_or(died_at + delay_ms, |d| d.max(died_at + delay_ms)));
                    }
                }
                if let Some(until) = delay_until.filter(|u| now < *u) {
                    // Keep the removal of the dead grant: it is part of what this call decided.
                    tx.commit().await.map_err(commit_error)?;
                    return Ok(Err(AcquireRefusal::Delayed { until_ms: until }));
                }
                let token = Self::tx_next_token(&mut tx).await?;
                let inserted = sqlx::query(&Self::q(
                    "INSERT INTO lock_grants (lock_key, session_id, owner_id, fencing_token, acquired_at_ms, expires_at_ms) \
                     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (lock_key) DO NOTHING RETURNING fencing_token",
                ))
                .bind(key.to_owned())
                .bind(session_id.to_string())
                .bind(owner_id.clone())
                .bind(token)
                .bind(now)
                .bind(now + ttl_ms)
                .fetch_optional(&mut *tx)
                .await
                .map_err(unavailable)?;
                if inserted.is_none() {
                    // A concurrent transaction granted the key first (PostgreSQL, READ COMMITTED).
                    tx.rollback().await.map_err(unavailable)?;
                    let mut tx = self.begin().await?;
                    let now = Self::tx_now(&mut tx).await?;
                    let winner = Self::tx_grant(&mut tx, key, now).await?;
                    tx.rollback().await.map_err(unavailable)?;
                    return Ok(Err(match winner {
                        Some((g, _, _)) if g.session_id == session_id => {
                            AcquireRefusal::AlreadyHeld { fencing_token: g.fencing_token, expires_at_ms: g.expires_at_ms }
                        }
                        Some((g, _, _)) => {
                            AcquireRefusal::Contended { holder_owner_id: g.owner_id, expires_at_ms: g.expires_at_ms }
                        }
                        None => AcquireRefusal::Contended { holder_owner_id: String::new(), expires_at_ms: now },
                    }));
                }
                if !key_seen || delay_until.is_some() {
                    // First grant of the key, or a lock-delay that has run out: record the key
                    // as seen and clear the delay. (A key already seen without a delay needs
                    // no write: the steady state costs nothing here.)
                    sqlx::query(&Self::q(
                        "INSERT INTO lock_keys (lock_key, first_granted_at_ms, delay_until_ms) VALUES ($1, $2, NULL) \
                         ON CONFLICT (lock_key) DO UPDATE SET delay_until_ms = NULL",
                    ))
                    .bind(key.to_owned())
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(unavailable)?;
                }
                tx.commit().await.map_err(commit_error)?;
                Ok(Ok(GrantRow {
                    key: key.to_owned(),
                    session_id,
                    owner_id,
                    fencing_token: token,
                    acquired_at_ms: now,
                    expires_at_ms: now + ttl_ms,
                }))
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
                if let Err(r) = Self::tx_session(&mut tx, session_id, now).await? {
                    return Ok(Err(RenewRefusal::Session(r)));
                }
                let current = Self::tx_grant(&mut tx, key, now).await?;
                let Some((g, true, _)) = current.clone().filter(|(g, _, _)| {
                    g.fencing_token == token && g.session_id == session_id
                }) else {
                    return Ok(Err(RenewRefusal::Lost { stored_token: current.map(|(g, _, _)| g.fencing_token) }));
                };
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
                    let stored = sqlx::query(&Self::q("SELECT fencing_token FROM lock_grants WHERE lock_key = $1"))
                        .bind(key.to_owned())
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(unavailable)?
                        .map(|r| r.int("fencing_token"))
                        .transpose()?;
                    return Ok(Err(RenewRefusal::Lost { stored_token: stored }));
                }
                tx.commit().await.map_err(commit_error)?;
                Ok(Ok(GrantRow { expires_at_ms: now + ttl_ms, ..g }))
            }

            async fn release(&self, key: &str, token: i64) -> Result<Result<(), Option<i64>>, StoreError> {
                // One statement, no explicit transaction: the predicate is the whole decision.
                let released = sqlx::query(&Self::q(&RELEASE_LIVE.replace("{NOW}", $now)))
                    .bind(key.to_owned())
                    .bind(token)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(unavailable)?;
                if released.is_some() {
                    return Ok(Ok(()));
                }
                let stored: Option<i64> =
                    sqlx::query(&Self::q("SELECT fencing_token FROM lock_grants WHERE lock_key = $1"))
                        .bind(key.to_owned())
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(unavailable)?
                        .map(|r| r.int("fencing_token"))
                        .transpose()?;
                Ok(Err(stored))
            }

            async fn info(&self, key: &str) -> Result<Option<KeyInfo>, StoreError> {
                let mut tx = self.begin().await?;
                let now = Self::tx_now(&mut tx).await?;
                let seen = sqlx::query(&Self::q("SELECT lock_key FROM lock_keys WHERE lock_key = $1"))
                    .bind(key.to_owned())
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(unavailable)?;
                if seen.is_none() {
                    tx.rollback().await.map_err(unavailable)?;
                    return Ok(None);
                }
                let grant = Self::tx_grant(&mut tx, key, now).await?.filter(|(_, live, _)| *live).map(|(g, _, _)| g);
                tx.rollback().await.map_err(unavailable)?;
                Ok(Some(KeyInfo { grant }))
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
                let Some((g, true, _)) = Self::tx_grant(&mut tx, key, now).await? else {
                    tx.rollback().await.map_err(unavailable)?;
                    return Ok(Err(RevokeRefusal::NotHeld));
                };
                if expected_token.is_some_and(|e| e != g.fencing_token) {
                    tx.rollback().await.map_err(unavailable)?;
                    return Ok(Err(RevokeRefusal::Stale { current_token: g.fencing_token }));
                }
                sqlx::query(&Self::q("DELETE FROM lock_grants WHERE lock_key = $1 AND fencing_token = $2"))
                    .bind(key.to_owned())
                    .bind(g.fencing_token)
                    .execute(&mut *tx)
                    .await
                    .map_err(unavailable)?;
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
                .bind(g.fencing_token)
                .bind(floor)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(unavailable)?;
                tx.commit().await.map_err(commit_error)?;
                Ok(Ok(Revocation { revoked_token: g.fencing_token, new_token_floor: floor, revocation_id }))
            }

            async fn reap(&self, limit: i64, delay_ms: i64, retention_ms: i64) -> Result<ReapReport, StoreError> {
                let mut tx = self.begin().await?;
                let now = Self::tx_now(&mut tx).await?;
                let mut report = ReapReport::default();
                let lapsed = sqlx::query(&Self::q(
                    "SELECT session_id, expires_at_ms FROM lock_sessions \
                     WHERE NOT expired_marked AND expires_at_ms <= $1 ORDER BY expires_at_ms, session_id LIMIT $2",
                ))
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
                        let died_at = g.int("expires_at_ms")?.min(session_expires);
                        let removed = Self::tx_drop_lost(
                            &mut tx,
                            &g.text("lock_key")?,
                            g.int("fencing_token")?,
                            died_at,
                            delay_ms,
                        )
                        .await?;
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
                let lapsed_grants = sqlx::query(&Self::q(
                    "SELECT lock_key, fencing_token, expires_at_ms FROM lock_grants WHERE expires_at_ms <= $1 \
                     ORDER BY expires_at_ms, lock_key LIMIT $2",
                ))
                .bind(now)
                .bind(limit)
                .fetch_all(&mut *tx)
                .await
                .map_err(unavailable)?;
                for g in &lapsed_grants {
                    let removed = Self::tx_drop_lost(
                        &mut tx,
                        &g.text("lock_key")?,
                        g.int("fencing_token")?,
                        g.int("expires_at_ms")?,
                        delay_ms,
                    )
                    .await?;
                    report.released_grants += u64::from(removed);
                }
                report.forgotten_sessions = sqlx::query(&Self::q(
                    "DELETE FROM lock_sessions WHERE session_id IN ( \
                       SELECT session_id FROM lock_sessions WHERE expired_marked AND expires_at_ms + $2 <= $1 \
                       ORDER BY expires_at_ms LIMIT $3)",
                ))
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
        }
    };
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

sql_lock_store!(
    PgLockStore,
    Dialect::Postgres,
    "BEGIN",
    "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT",
    "SELECT nextval('fencing_token_seq') AS token",
    Some("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
);
sql_lock_store!(
    SqliteLockStore,
    Dialect::Sqlite,
    "BEGIN IMMEDIATE",
    "CAST(unixepoch('subsec') * 1000 AS INTEGER)",
    "UPDATE token_floor SET last_issued = MAX(last_issued, floor) + 1 WHERE id = 1 RETURNING last_issued AS token",
    None
);
