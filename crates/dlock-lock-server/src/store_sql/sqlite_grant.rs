//! SQLite's token-issuing transactions (acquire, rotate) in two calls to the connection's
//! worker (docs/performance.md "The lock server's grants").
//!
//! sqlx-sqlite runs each statement, `BEGIN` and `COMMIT` as one hand-off to the connection's
//! worker thread and back; statement by statement an acquire made five (`BEGIN IMMEDIATE`,
//! the context read, the token, the grant, `COMMIT`), more with a dead grant to remove or a
//! key to record. Here each makes two, through a [`SqliteBatchTx`]: (1) `BEGIN IMMEDIATE`
//! and [`ACQUIRE_CONTEXT`] in one batch, with the token the transaction's draw will issue
//! ([`SQLITE_TOKEN_AFTER`]); (2) after the rule ([`rules::decide_acquire`],
//! [`rules::decide_rotate`]) and the token check on that token, every write the decision
//! names and `COMMIT` in one batch: the dead grant's removal and its lock-delay (acquire),
//! the next token ([`SQLITE_NEXT_TOKEN`]), the grant carrying that token ([`INSERT_GRANT`],
//! [`ROTATE_GRANT`]), the key's record. A refusal ends with `ROLLBACK` (or commits the
//! removal a lock-delay refusal keeps, in one batch too).
//!
//! What does not change: the same transaction (the write lock taken before anything is read,
//! so nothing changes between the read and the writes: the token read in (1) is the token
//! drawn in (2)), the same statements in the same order, the same rules, and the token check
//! before anything is written. Invariants (asserted in release builds too): the token checked
//! is the token drawn and the token the grant carries, and it exceeds the one of the grant it
//! replaces ([`rules::assert_token_replaces`]). A grant statement that writes no row (which
//! the write lock rules out) answers `Unavailable`: the grant was not written; what committed
//! with it (a token skipped, a dead grant removed) is what a retry does anyway.

use std::sync::LazyLock;

use dlock_db::SqliteBatchTx;
use uuid::Uuid;

use super::{
    commit_error, keeps_removal, unavailable, GrantContext, RowLike, SqliteLockStore, ACQUIRE_CONTEXT, DROP_GRANT,
    INSERT_GRANT, RECORD_DELAY, RECORD_KEY, ROTATE_GRANT, SQLITE_NEXT_TOKEN, SQLITE_NOW, SQLITE_TOKEN_AFTER,
};
use crate::rules::{self, GrantPlan, Removal, RotateFacts};
use crate::store::{AcquireRefusal, GrantRow, RotateRefusal, StoreError};

/// The grant's token, read inside the statement that writes the grant: the value the batch's
/// [`SQLITE_NEXT_TOKEN`] just advanced, under the same write lock.
const DRAWN_TOKEN: &str = "(SELECT last_issued FROM token_floor WHERE id = 1)";

/// Call (1)'s SQL: `BEGIN IMMEDIATE`, then [`ACQUIRE_CONTEXT`] with the token the draw will
/// issue (`next_token`). Built once: the statement cache keys on it.
static OPEN: LazyLock<String> = LazyLock::new(|| {
    let head = "SELECT {NOW} AS now_ms,";
    assert!(ACQUIRE_CONTEXT.starts_with(head), "the context read opens with now");
    let context = ACQUIRE_CONTEXT
        .replacen(head, &format!("{head} {SQLITE_TOKEN_AFTER} AS next_token,"), 1)
        .replace("{NOW}", SQLITE_NOW);
    SqliteBatchTx::begin_sql(&[(&context, 3)])
});
/// [`INSERT_GRANT`] carrying the drawn token.
static INSERT_DRAWN: LazyLock<String> = LazyLock::new(|| INSERT_GRANT.replace("{TOKEN}", DRAWN_TOKEN));
/// [`ROTATE_GRANT`] carrying the drawn token.
static ROTATE_DRAWN: LazyLock<String> = LazyLock::new(|| ROTATE_GRANT.replace("{TOKEN}", DRAWN_TOKEN));

impl SqliteLockStore {
    /// [`LockStore::acquire`](crate::store::LockStore::acquire) on SQLite.
    pub(super) async fn acquire_grant(
        &self,
        key: &str,
        session_id: Uuid,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, AcquireRefusal>, StoreError> {
        let (tx, ctx, next) = self.open_grant(key, session_id).await?;
        let decision = rules::decide_acquire(&ctx.acquire_facts(session_id, delay_ms));
        let plan = match decision.verdict {
            Ok(plan) => plan,
            Err(refusal) => {
                match decision.remove {
                    // The dead grant's removal is part of what a lock-delay refusal decided.
                    Some(removal) if keeps_removal(&refusal) => {
                        let mut writes = Writes::default();
                        writes.removal(key, &removal);
                        writes.commit(tx).await?;
                    }
                    _ => tx.rollback().await.map_err(unavailable)?,
                }
                return Ok(Err(refusal));
            }
        };
        let grant = Grant::new(key, session_id, &ctx, ttl_ms);
        let mut writes = Writes::default();
        if let Some(removal) = &decision.remove {
            writes.removal(key, removal);
        }
        let binds = [
            Bind::Text(key.to_owned()),
            Bind::Text(session_id.to_string()),
            Bind::Text(grant.owner_id.clone()),
            Bind::Int(grant.acquired_at_ms),
            Bind::Int(grant.expires_at_ms),
        ];
        match write_grant(tx, writes, &INSERT_DRAWN, binds, grant, &plan, next).await? {
            Some(grant) => Ok(Ok(grant)),
            // Under the write lock taken before the read, the key cannot have been granted since.
            None => Err(unwritten("the key was granted under the acquire's write lock")),
        }
    }

    /// [`LockStore::rotate`](crate::store::LockStore::rotate) on SQLite.
    pub(super) async fn rotate_grant(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, RotateRefusal>, StoreError> {
        let (tx, ctx, next) = self.open_grant(key, session_id).await?;
        let plan = match rules::decide_rotate(&RotateFacts { acquire: ctx.acquire_facts(session_id, delay_ms), token })
        {
            Ok(plan) => plan,
            Err(refusal) => {
                tx.rollback().await.map_err(unavailable)?;
                return Ok(Err(refusal));
            }
        };
        let grant = Grant::new(key, session_id, &ctx, ttl_ms);
        let binds = [
            Bind::Int(grant.acquired_at_ms),
            Bind::Int(grant.expires_at_ms),
            Bind::Text(grant.owner_id.clone()),
            Bind::Text(key.to_owned()),
            Bind::Int(token),
            Bind::Text(session_id.to_string()),
            Bind::Int(grant.acquired_at_ms),
        ];
        match write_grant(tx, Writes::default(), &ROTATE_DRAWN, binds, grant, &plan, next).await? {
            Some(grant) => Ok(Ok(grant)),
            // The rule saw the caller's live grant under the write lock: it is still there.
            None => Err(unwritten("the grant changed under the rotate's write lock")),
        }
    }

    /// Call (1): `BEGIN IMMEDIATE`, the context the rules decide on, and the token this
    /// transaction's draw will issue. The session is checked in the same transaction that grants
    /// (Jepsen etcd 3.4.3).
    async fn open_grant(&self, key: &str, session_id: Uuid) -> Result<(SqliteBatchTx, GrantContext, i64), StoreError> {
        let query = sqlx::query(OPEN.as_str()).bind(session_id.to_string()).bind(key.to_owned()).bind(key.to_owned());
        let (tx, parts) = SqliteBatchTx::begin(&self.pool, query, 1).await.map_err(unavailable)?;
        let row = parts
            .first()
            .and_then(|p| p.rows.first())
            .ok_or_else(|| StoreError::Unavailable("the grant context read answered no row".into()))?;
        Ok((tx, GrantContext::of(row)?, row.int("next_token")?))
    }
}

/// The grant a token-issuing transaction writes, but for its token.
struct Grant {
    key: String,
    session_id: Uuid,
    owner_id: String,
    acquired_at_ms: i64,
    expires_at_ms: i64,
}

impl Grant {
    fn new(key: &str, session_id: Uuid, ctx: &GrantContext, ttl_ms: i64) -> Grant {
        Grant {
            key: key.to_owned(),
            session_id,
            owner_id: ctx.owner_id.clone().unwrap_or_default(),
            acquired_at_ms: ctx.now,
            expires_at_ms: ctx.now + ttl_ms,
        }
    }
}

/// Call (2), after the token rule's check on `next` (the token call (1) read): `writes`
/// (what comes before the token), the next token, the grant statement `sql` with its `binds`
/// (the token inline, [`DRAWN_TOKEN`]), the key's record when the plan says so, and `COMMIT`.
/// Answers the grant, `None` when the grant statement wrote no row.
async fn write_grant<const N: usize>(
    tx: SqliteBatchTx,
    mut writes: Writes<'_>,
    sql: &str,
    binds: [Bind; N],
    grant: Grant,
    plan: &GrantPlan,
    next: i64,
) -> Result<Option<GrantRow>, StoreError> {
    rules::assert_token_replaces(next, plan.replaces);
    let drawn_at = writes.push(SQLITE_NEXT_TOKEN, 0, []);
    let grant_at = writes.push(sql, N, binds);
    if plan.write_key_record {
        // First grant of the key, or a lock-delay that has run out (see `tx_finish_grant`).
        writes.push(RECORD_KEY, 2, [Bind::Text(grant.key.clone()), Bind::Int(grant.acquired_at_ms)]);
    }
    let parts = writes.commit(tx).await?;
    let token_at = |at: usize, col: &str| parts.get(at).and_then(|p| p.rows.first()).map(|r| r.int(col)).transpose();
    assert_eq!(token_at(drawn_at, "token")?, Some(next), "the token drawn is the token checked");
    let Some(token) = token_at(grant_at, "fencing_token")? else { return Ok(None) };
    assert_eq!(token, next, "the grant carries the token its transaction drew");
    let Grant { key, session_id, owner_id, acquired_at_ms, expires_at_ms } = grant;
    Ok(Some(GrantRow { key, session_id, owner_id, fencing_token: token, acquired_at_ms, expires_at_ms }))
}

/// A grant statement that wrote no row where the write lock says it must: the grant was not
/// written, and the caller may ask again.
fn unwritten(why: &str) -> StoreError {
    StoreError::Unavailable(why.to_owned())
}

/// A value bound to one of a batch's placeholders.
enum Bind {
    Text(String),
    Int(i64),
}

/// The statements of one batch (each `(sql, placeholders)`) and their values, in order.
#[derive(Default)]
struct Writes<'s> {
    statements: Vec<(&'s str, usize)>,
    binds: Vec<Bind>,
}

impl<'s> Writes<'s> {
    /// Adds a statement with one value per placeholder; answers its index in the batch.
    fn push<const N: usize>(&mut self, sql: &'s str, placeholders: usize, binds: [Bind; N]) -> usize {
        assert_eq!(placeholders, N, "one value per placeholder: {sql}");
        self.statements.push((sql, placeholders));
        self.binds.extend(binds);
        self.statements.len() - 1
    }

    /// The removal of a dead grant: its lock-delay merged into the key record, then the row.
    fn removal(&mut self, key: &str, removal: &Removal) {
        if let Some(until) = removal.delay_until_ms {
            self.push(RECORD_DELAY, 3, [Bind::Int(until), Bind::Int(until), Bind::Text(key.to_owned())]);
        }
        self.push(DROP_GRANT, 2, [Bind::Text(key.to_owned()), Bind::Int(removal.token)]);
    }

    /// Runs the batch and `COMMIT` in `tx`, in one call. A failure is classified as a failed
    /// `COMMIT` ([`commit_error`]): one whose answer may have been lost (an I/O error) is
    /// `CommitUnknown`, never retry-safe; any other committed nothing.
    async fn commit(self, tx: SqliteBatchTx) -> Result<Vec<dlock_db::BatchPart>, StoreError> {
        let sql = SqliteBatchTx::commit_sql(&self.statements);
        let mut query = sqlx::query(&sql);
        for bind in self.binds {
            query = match bind {
                Bind::Text(v) => query.bind(v),
                Bind::Int(v) => query.bind(v),
            };
        }
        tx.commit_with(query, self.statements.len()).await.map_err(commit_error)
    }
}
