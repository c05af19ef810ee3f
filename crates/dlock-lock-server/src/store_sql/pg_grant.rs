//! PostgreSQL's token-issuing transactions (acquire, rotate), statement by statement in one
//! transaction: `BEGIN` with the key's advisory lock (`begin_key!`, one round trip), the
//! context read ([`ACQUIRE_CONTEXT`]), the rule, the dead grant's removal, the grant with
//! its token drawn by `nextval` inside the statement that writes it, the token rule's
//! check, the key's record, `COMMIT` (docs/performance.md "The lock server's grants"). A
//! concurrent transaction that granted the key first (READ COMMITTED) leaves the grant's
//! `INSERT` with no row: the acquire rolls back and answers who holds the key.

use uuid::Uuid;

use super::{
    commit_error, keeps_removal, pg_begin_key_sql, unavailable, GrantContext, PgLockStore, RowLike, ACQUIRE_CONTEXT,
    INSERT_GRANT, PG_NOW, RECORD_KEY, ROTATE_GRANT,
};
use crate::rules::{self, RotateFacts};
use crate::store::{AcquireRefusal, GrantRow, RotateRefusal, StoreError};

/// The next token, drawn inside the statement that writes the grant, after the key's lock
/// (so the ordering argument at `tx_lock_key` holds).
const NEXT_TOKEN: &str = "nextval('fencing_token_seq')";

/// Opens a token-issuing transaction on `key` as `$tx`, on a connection `$conn` of the
/// store's pool held by the caller: `BEGIN` and the key's lock in one round trip for a key of
/// C3's alphabet ([`pg_begin_key_sql`]), else `BEGIN` and then `tx_lock_key`. When the one-round-trip `BEGIN` fails, the server may have begun the
/// transaction and failed its lock (a `lock_timeout`, a cancel), leaving the connection in an
/// aborted transaction that sqlx does not know to roll back (it counts the transaction only
/// once its `BEGIN` succeeded): that connection is closed, not returned to the pool, so no
/// later checkout inherits the aborted transaction.
macro_rules! begin_key {
    ($self:ident, $key:expr, $conn:ident, $tx:ident) => {
        let key_begin = pg_begin_key_sql($key);
        let locked_by_begin = key_begin.is_some();
        let statement = key_begin.map_or(std::borrow::Cow::Borrowed(Self::BEGIN), std::borrow::Cow::Owned);
        let mut $conn = ClosingConnection::of($self.pool.acquire().await.map_err(unavailable)?);
        let mut $tx = match sqlx::Connection::begin_with(&mut *$conn.conn, statement).await {
            Ok(tx) => tx,
            Err(e) => {
                $conn.close = locked_by_begin;
                return Err(unavailable(e));
            }
        };
        if !locked_by_begin {
            Self::tx_lock_key(&mut $tx, $key).await?;
        }
    };
}

/// A pooled connection that is closed, not returned to the pool, when dropped with `close`
/// set (`begin_key!`). The flag is a field of its own so it can be set while a transaction
/// still borrows the connection.
struct ClosingConnection<DB: sqlx::Database> {
    conn: sqlx::pool::PoolConnection<DB>,
    close: bool,
}

impl<DB: sqlx::Database> ClosingConnection<DB> {
    fn of(conn: sqlx::pool::PoolConnection<DB>) -> ClosingConnection<DB> {
        ClosingConnection { conn, close: false }
    }
}

impl<DB: sqlx::Database> Drop for ClosingConnection<DB> {
    fn drop(&mut self) {
        if self.close {
            self.conn.close_on_drop();
        }
    }
}

impl PgLockStore {
    /// [`ACQUIRE_CONTEXT`] for `key` and the caller's session, in one statement.
    async fn tx_context(
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        key: &str,
        session_id: Uuid,
    ) -> Result<GrantContext, StoreError> {
        let ctx = sqlx::query(&Self::q(&ACQUIRE_CONTEXT.replace("{NOW}", PG_NOW)))
            .bind(session_id.to_string())
            .bind(key.to_owned())
            .bind(key.to_owned())
            .fetch_one(&mut **tx)
            .await
            .map_err(unavailable)?;
        GrantContext::of(&ctx)
    }

    /// The end of a transaction that issued `token` for `key` (an acquire's or a
    /// rotate's): the token rule's check, the key's record when the plan says so, the
    /// commit, and the grant the answer carries.
    async fn tx_finish_grant(
        mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
        grant: GrantRow,
        plan: &rules::GrantPlan,
    ) -> Result<GrantRow, StoreError> {
        rules::assert_token_replaces(grant.fencing_token, plan.replaces);
        if plan.write_key_record {
            // First grant of the key, or a lock-delay that has run out: record the key
            // as seen and clear the delay. (A key already seen without a delay needs
            // no write: the steady state costs nothing here.)
            sqlx::query(&Self::q(RECORD_KEY))
                .bind(grant.key.clone())
                .bind(grant.acquired_at_ms)
                .execute(&mut *tx)
                .await
                .map_err(unavailable)?;
        }
        tx.commit().await.map_err(commit_error)?;
        Ok(grant)
    }

    /// [`LockStore::acquire`](crate::store::LockStore::acquire) on PostgreSQL.
    pub(super) async fn acquire_grant(
        &self,
        key: &str,
        session_id: Uuid,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, AcquireRefusal>, StoreError> {
        begin_key!(self, key, conn, tx);
        // The session is checked in the same transaction that grants (Jepsen etcd 3.4.3).
        let ctx = Self::tx_context(&mut tx, key, session_id).await?;
        let now = ctx.now;
        let decision = rules::decide_acquire(&ctx.acquire_facts(session_id, delay_ms));
        if let Some(removal) = decision.remove {
            Self::tx_drop_lost(&mut tx, key, removal.token, removal.delay_until_ms).await?;
        }
        let plan = match decision.verdict {
            Ok(plan) => plan,
            Err(refusal) if decision.remove.is_some() && keeps_removal(&refusal) => {
                tx.commit().await.map_err(commit_error)?;
                return Ok(Err(refusal));
            }
            Err(refusal) => {
                tx.rollback().await.map_err(unavailable)?;
                return Ok(Err(refusal));
            }
        };
        let owner_id = ctx.owner_id.unwrap_or_default();
        let sql = Self::q(&INSERT_GRANT.replace("{TOKEN}", NEXT_TOKEN));
        let inserted = sqlx::query(&sql)
            .bind(key.to_owned())
            .bind(session_id.to_string())
            .bind(owner_id.clone())
            .bind(now)
            .bind(now + ttl_ms)
            .fetch_optional(&mut *tx)
            .await
            .map_err(unavailable)?;
        let token = match inserted.as_ref() {
            Some(row) => row.int("fencing_token")?,
            None => 0,
        };
        if inserted.is_none() {
            // A concurrent transaction granted the key first (PostgreSQL, READ COMMITTED).
            tx.rollback().await.map_err(unavailable)?;
            let mut tx = self.begin().await?;
            let now = Self::tx_now(&mut tx).await?;
            let winner = Self::tx_grant(&mut tx, key).await?;
            tx.rollback().await.map_err(unavailable)?;
            return Ok(Err(match winner {
                Some((g, _)) => rules::holder_refusal(&g, session_id),
                None => AcquireRefusal::Contended { holder_owner_id: String::new(), expires_at_ms: now },
            }));
        }
        let grant = GrantRow {
            key: key.to_owned(),
            session_id,
            owner_id,
            fencing_token: token,
            acquired_at_ms: now,
            expires_at_ms: now + ttl_ms,
        };
        Ok(Ok(Self::tx_finish_grant(tx, grant, &plan).await?))
    }

    /// [`LockStore::rotate`](crate::store::LockStore::rotate) on PostgreSQL.
    pub(super) async fn rotate_grant(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, RotateRefusal>, StoreError> {
        // A token-issuing transaction: serialised on the key like acquire (see `tx_lock_key`).
        begin_key!(self, key, conn, tx);
        // The session is checked in the same transaction that grants (Jepsen etcd 3.4.3).
        let ctx = Self::tx_context(&mut tx, key, session_id).await?;
        let now = ctx.now;
        let decision = rules::decide_rotate(&RotateFacts { acquire: ctx.acquire_facts(session_id, delay_ms), token });
        let plan = match decision {
            Ok(plan) => plan,
            Err(refusal) => {
                tx.rollback().await.map_err(unavailable)?;
                return Ok(Err(refusal));
            }
        };
        let owner_id = ctx.owner_id.unwrap_or_default();
        let sql = Self::q(&ROTATE_GRANT.replace("{TOKEN}", NEXT_TOKEN));
        let rotated = sqlx::query(&sql)
            .bind(now)
            .bind(now + ttl_ms)
            .bind(owner_id.clone())
            .bind(key.to_owned())
            .bind(token)
            .bind(session_id.to_string())
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .map_err(unavailable)?;
        let Some(rotated) = rotated else {
            // Released, reaped or closed since the read: nothing to rotate, nothing changed.
            tx.rollback().await.map_err(unavailable)?;
            return Ok(Err(RotateRefusal::Lost { stored_token: self.stored_token(key).await? }));
        };
        let grant = GrantRow {
            key: key.to_owned(),
            session_id,
            owner_id,
            fencing_token: rotated.int("fencing_token")?,
            acquired_at_ms: now,
            expires_at_ms: now + ttl_ms,
        };
        Ok(Ok(Self::tx_finish_grant(tx, grant, &plan).await?))
    }
}
