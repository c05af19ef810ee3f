//! SQLite's token-issuing transactions (acquire, rotate) in three calls to the connection's
//! worker (docs/performance.md §8.19).
//!
//! sqlx-sqlite runs each statement, `BEGIN` and `COMMIT` as one hand-off to the connection's
//! worker thread and back; statement by statement an acquire made five (`BEGIN IMMEDIATE`,
//! the context read, the token, the grant, `COMMIT`), more with a dead grant to remove or a
//! key to record. Here each makes three, through a [`SqliteBatchTx`]: (1) `BEGIN IMMEDIATE`
//! and [`ACQUIRE_CONTEXT`] in one batch; (2) after the rule ([`rules::decide_acquire`],
//! [`rules::decide_rotate`]), every write the decision names in one batch: the dead grant's
//! removal and its lock-delay (acquire), the next token ([`SQLITE_NEXT_TOKEN`]), the grant
//! carrying that token ([`INSERT_GRANT`], [`ROTATE_GRANT`]), the key's record; (3) `COMMIT`,
//! or `ROLLBACK` for a refusal.
//!
//! What does not change: the same transaction (the write lock taken before anything is read,
//! so nothing changes between the read and the writes), the same statements in the same
//! order, the same rules, and the token check before the `COMMIT`. Invariants (asserted in
//! release builds too): the grant carries exactly the token its transaction drew, and that
//! token exceeds the one of the grant it replaces ([`rules::assert_token_replaces`]).

use dlock_db::{sqlite_batch_sql, SqliteBatchTx};
use uuid::Uuid;

use super::{
    commit_error, keeps_removal, unavailable, GrantContext, RowLike, SqliteLockStore, ACQUIRE_CONTEXT, DROP_GRANT,
    INSERT_GRANT, RECORD_DELAY, RECORD_KEY, ROTATE_GRANT, SQLITE_NEXT_TOKEN, SQLITE_NOW,
};
use crate::rules::{self, GrantPlan, Removal, RotateFacts};
use crate::store::{AcquireRefusal, GrantRow, RotateRefusal, StoreError};

/// The grant's token, read inside the statement that writes the grant: the value the batch's
/// [`SQLITE_NEXT_TOKEN`] just advanced, under the same write lock.
const DRAWN_TOKEN: &str = "(SELECT last_issued FROM token_floor WHERE id = 1)";

/// [`LockStore::acquire`](crate::store::LockStore::acquire) on SQLite.
pub(super) async fn acquire(
    store: &SqliteLockStore,
    key: &str,
    session_id: Uuid,
    ttl_ms: i64,
    delay_ms: i64,
) -> Result<Result<GrantRow, AcquireRefusal>, StoreError> {
    let (mut tx, ctx) = open(store, key, session_id).await?;
    let decision = rules::decide_acquire(&ctx.acquire_facts(session_id, delay_ms));
    let plan = match decision.verdict {
        Ok(plan) => plan,
        Err(refusal) => {
            match decision.remove {
                // The dead grant's removal is part of what a lock-delay refusal decided.
                Some(removal) if keeps_removal(&refusal, true) => {
                    let mut writes = Writes::default();
                    writes.removal(key, &removal);
                    writes.run(&mut tx).await?;
                    tx.commit().await.map_err(commit_error)?;
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
    let insert = INSERT_GRANT.replace("{TOKEN}", DRAWN_TOKEN);
    let binds = [
        Bind::Text(key.to_owned()),
        Bind::Text(session_id.to_string()),
        Bind::Text(grant.owner_id.clone()),
        Bind::Int(grant.acquired_at_ms),
        Bind::Int(grant.expires_at_ms),
    ];
    match write_grant(&mut tx, writes, &insert, binds, &grant, &plan).await? {
        Some(token) => Ok(Ok(commit(tx, grant, token).await?)),
        // Under the write lock taken before the read, the key cannot have been granted since.
        None => Err(nothing_written(tx, "the key was granted under the acquire's write lock").await),
    }
}

/// [`LockStore::rotate`](crate::store::LockStore::rotate) on SQLite.
pub(super) async fn rotate(
    store: &SqliteLockStore,
    key: &str,
    session_id: Uuid,
    token: i64,
    ttl_ms: i64,
    delay_ms: i64,
) -> Result<Result<GrantRow, RotateRefusal>, StoreError> {
    let (mut tx, ctx) = open(store, key, session_id).await?;
    let plan = match rules::decide_rotate(&RotateFacts { acquire: ctx.acquire_facts(session_id, delay_ms), token }) {
        Ok(plan) => plan,
        Err(refusal) => {
            tx.rollback().await.map_err(unavailable)?;
            return Ok(Err(refusal));
        }
    };
    let grant = Grant::new(key, session_id, &ctx, ttl_ms);
    let update = ROTATE_GRANT.replace("{TOKEN}", DRAWN_TOKEN);
    let binds = [
        Bind::Int(grant.acquired_at_ms),
        Bind::Int(grant.expires_at_ms),
        Bind::Text(grant.owner_id.clone()),
        Bind::Text(key.to_owned()),
        Bind::Int(token),
        Bind::Text(session_id.to_string()),
        Bind::Int(grant.acquired_at_ms),
    ];
    match write_grant(&mut tx, Writes::default(), &update, binds, &grant, &plan).await? {
        Some(token) => Ok(Ok(commit(tx, grant, token).await?)),
        // The rule saw the caller's live grant under the write lock: it is still there.
        None => Err(nothing_written(tx, "the grant changed under the rotate's write lock").await),
    }
}

/// Call (1): `BEGIN IMMEDIATE` and the context the rules decide on. The session is checked
/// in the same transaction that grants (Jepsen etcd 3.4.3).
async fn open(
    store: &SqliteLockStore,
    key: &str,
    session_id: Uuid,
) -> Result<(SqliteBatchTx, GrantContext), StoreError> {
    let context = ACQUIRE_CONTEXT.replace("{NOW}", SQLITE_NOW);
    let sql = SqliteBatchTx::begin_sql(&[(&context, 3)]);
    let query = sqlx::query(&sql).bind(session_id.to_string()).bind(key.to_owned()).bind(key.to_owned());
    let (tx, parts) = SqliteBatchTx::begin(&store.pool, query, 1).await.map_err(unavailable)?;
    let row = parts
        .first()
        .and_then(|p| p.rows.first())
        .ok_or_else(|| StoreError::Unavailable("the grant context read answered no row".into()))?;
    Ok((tx, GrantContext::of(row)?))
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

/// Call (2): `writes` (what comes before the token), the next token, the grant statement
/// `sql` with its `binds` (the token inline, [`DRAWN_TOKEN`]), and the key's record when the
/// plan says so. Answers the grant's token, `None` when the grant statement wrote no row.
/// Checks the token rule before anything commits.
async fn write_grant<const N: usize>(
    tx: &mut SqliteBatchTx,
    mut writes: Writes<'_>,
    sql: &str,
    binds: [Bind; N],
    grant: &Grant,
    plan: &GrantPlan,
) -> Result<Option<i64>, StoreError> {
    let drawn_at = writes.push(SQLITE_NEXT_TOKEN, 0, []);
    let grant_at = writes.push(sql, N, binds);
    if plan.write_key_record {
        // First grant of the key, or a lock-delay that has run out (see `tx_finish_grant`).
        writes.push(RECORD_KEY, 2, [Bind::Text(grant.key.clone()), Bind::Int(grant.acquired_at_ms)]);
    }
    let parts = writes.run(tx).await?;
    let token_at = |at: usize, col: &str| parts.get(at).and_then(|p| p.rows.first()).map(|r| r.int(col)).transpose();
    let drawn = token_at(drawn_at, "token")?;
    let Some(token) = token_at(grant_at, "fencing_token")? else { return Ok(None) };
    assert_eq!(Some(token), drawn, "the grant carries the token its transaction drew");
    rules::assert_token_replaces(token, plan.replaces);
    Ok(Some(token))
}

/// Call (3) of a grant: `COMMIT`, and the grant the answer carries.
async fn commit(tx: SqliteBatchTx, grant: Grant, token: i64) -> Result<GrantRow, StoreError> {
    tx.commit().await.map_err(commit_error)?;
    let Grant { key, session_id, owner_id, acquired_at_ms, expires_at_ms } = grant;
    Ok(GrantRow { key, session_id, owner_id, fencing_token: token, acquired_at_ms, expires_at_ms })
}

/// A grant statement that wrote no row where the write lock says it must: rolled back,
/// nothing written, and the caller may ask again.
async fn nothing_written(tx: SqliteBatchTx, why: &str) -> StoreError {
    match tx.rollback().await {
        Ok(()) => StoreError::Unavailable(why.to_owned()),
        Err(e) => unavailable(e),
    }
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

    /// Runs the batch inside `tx`, in one call; an error leaves `tx` to be dropped (its
    /// connection closed, the transaction rolled back).
    async fn run(self, tx: &mut SqliteBatchTx) -> Result<Vec<dlock_db::BatchPart>, StoreError> {
        let sql = sqlite_batch_sql(&self.statements);
        let mut query = sqlx::query(&sql);
        for bind in self.binds {
            query = match bind {
                Bind::Text(v) => query.bind(v),
                Bind::Int(v) => query.bind(v),
            };
        }
        tx.run(query, self.statements.len()).await.map_err(unavailable)
    }
}
