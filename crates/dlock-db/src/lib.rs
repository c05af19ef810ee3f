//! SQL plumbing shared by every store (paydb and lockdb, PostgreSQL and SQLite).
//!
//! Stores write their SQL once, with PostgreSQL's `$n` placeholders; [`Dialect::sql`] turns
//! them into SQLite's numbered `?n`, which mean the same. Nothing here exists under
//! `cfg(madsim)`: sqlx uses real sockets and threads, so the simulation uses in-memory stores
//! held to the SQL ones by conformance suites.
//!
//! Pools (issue 14, docs/performance.md "Pools"):
//! - No pool pings a connection before handing it out (`test_before_acquire` off): that ping
//!   was one extra round trip per checkout. A connection is instead bounded by age
//!   ([`POOL_LIFETIME_MS_MAX`]) and idleness ([`POOL_IDLE_MS_MAX`]). A connection that broke
//!   while idle fails its first statement; every store's first statement on a checkout is
//!   `BEGIN` or an autocommitted statement the server never received, and the stores map
//!   that failure to `Unavailable` (nothing decided, retry-safe). A failed `COMMIT` is still
//!   classified by [`is_commit_answer_lost`] alone. sqlx pings a connection when it is
//!   returned, so a broken one is closed then and never handed out twice.
//! - Invariant: at most one pool per SQLite file per process is handed out by
//!   [`shared_sqlite_pool`] while anyone holds it (a registry by canonical path; asserted
//!   when a pool is handed out), so two services of one process on one file queue in one
//!   pool instead of sleeping in SQLite's busy handler against each other.
//! - Reads of a shared SQLite file run on a reader pool beside it ([`SharedSqlitePool::readers`],
//!   at most [`SQLITE_READERS_MAX`] connections, `query_only`): in WAL a reader never waits for
//!   the writer, and a read begun after a commit returned sees that commit, so a read moved
//!   off the one writer connection answers what it answered on it, without queueing behind
//!   every write of the process. Only autocommitted reads go there; every read a decision
//!   depends on stays inside its write transaction on the writer.
//! - SQLite write transactions run on a thread of their own, one per process for every file
//!   ([`sqlite_writer_thread`], `dlock_rt::dedicated`,
//!   docs/performance.md "The SQLite writer thread"): the stores hand each whole
//!   transaction to it and await the answer, so a writer connection's holder is never a
//!   task waiting behind HTTP work between two statements.
//!
//! SQLite batches ([`sqlite_batch_sql`], [`sqlite_batch`]): sqlx-sqlite runs each statement
//! as one command to the connection's worker thread and back, and on a busy 2-core machine
//! those hops, not SQLite's work, bound the one writer (docs/performance.md, "What bounds
//! each curve"). Statements with no decision between them go as one multi-statement
//! query: one hop for all of them, the same statements in the same order in the same
//! transaction.
//! A store batches only statements that are all to run, or whose transaction rolls back
//! whenever a later one should not have run. This relies on sqlx-sqlite running every
//! statement of a query and binding `?NNN` across them, which sqlx 0.8 marks deprecated
//! (launchbadge/sqlx#3108): `tests/pools.rs` holds the behaviour, so an upgrade that drops it
//! fails there first.
//!
//! Unflushed SQLite writes ([`sqlite_unflushed`],
//! docs/performance.md "SQLite: unflushed releases"): a write whose loss is already safe
//! (the lock server's release) may commit at `synchronous = NORMAL`, to the WAL without a
//! flush of its own; the next flushed commit on the file makes it durable with itself.
//! Invariant: a connection returns to its pool only at `FULL` (the batch ran to its last
//! statement, which restores it); a batch that failed or was dropped half-way closes its
//! connection, so every other write stays flushed.

#![cfg(not(madsim))]

pub mod events;

use std::borrow::Cow;
use std::str::FromStr;
use std::time::Duration;

/// Most connections one service opens to one PostgreSQL database.
pub const PG_POOL_CONNECTIONS_MAX: u32 = 16;
/// Most connections one process opens to one SQLite file through [`shared_sqlite_pool`]
/// (and one [`sqlite_pool`] opens). One: SQLite has one writer at a time anyway, and a
/// second connection would only wait in SQLite's busy handler, whose sleeps (up to 100 ms
/// each) cost far more under contention than queueing in the pool.
pub const SQLITE_POOL_CONNECTIONS_MAX: u32 = 1;
/// Most read-only connections beside the writer on one shared SQLite file (WAL readers run
/// concurrently with the writer and with each other).
pub const SQLITE_READERS_MAX: u32 = 2;
/// Longest a request waits for a pooled connection.
pub const POOL_ACQUIRE_MS_MAX: u64 = 2_000;
/// Longest a pooled connection sits idle before the pool closes it. It bounds how long a
/// connection the server or a middlebox dropped can wait in the pool to fail one request
/// (no connection is pinged before it is handed out).
pub const POOL_IDLE_MS_MAX: u64 = 60_000;
/// Longest a pooled connection lives before the pool replaces it.
pub const POOL_LIFETIME_MS_MAX: u64 = 30 * 60_000;
/// Longest SQLite waits for the write lock before answering busy.
pub const SQLITE_BUSY_MS_MAX: u64 = 5_000;

/// Most statements one [`sqlite_batch`] sends in one query.
pub const SQLITE_BATCH_STATEMENTS_MAX: usize = 8;

/// SQLite: `statements`, each `(sql, binds)`, as one multi-statement query. Each statement
/// names its placeholders `$1, $2, …, $binds` once each, in that order (a value used twice
/// is bound twice), so that the same text serves PostgreSQL statement by statement; here
/// each becomes SQLite's anonymous `?`, and sqlx binds the values of statement 1, then of
/// statement 2, … in order. (Numbered `?NNN` across statements do not bind through sqlx:
/// a statement whose first placeholder is `?5` has four unnamed slots before it, which sqlx
/// fills positionally.) Asserts the form, in release builds too.
pub fn sqlite_batch_sql(statements: &[(&str, usize)]) -> String {
    assert!(
        !statements.is_empty() && statements.len() <= SQLITE_BATCH_STATEMENTS_MAX,
        "a batch has 1..={SQLITE_BATCH_STATEMENTS_MAX} statements, not {}",
        statements.len()
    );
    let mut out = String::new();
    for (sql, binds) in statements {
        each_placeholder(sql, *binds, &mut out, |out, _| out.push('?'));
        out.push_str(";\n");
    }
    out
}

/// Most parts one [`pg_cte_sql`] statement holds.
pub const PG_CTE_PARTS_MAX: usize = 8;

/// PostgreSQL: `statements`, each `(name, sql, binds)` in [`sqlite_batch_sql`]'s form
/// (placeholders `$1, …, $binds` once each, in order), as one statement of one round trip:
/// each becomes the common table expression `name`, its placeholders numbered on after the
/// ones before it (so the binds go in statement order, as in a batch), and `select`, which
/// names no placeholder, reads what their `RETURNING` clauses return. Every data-modifying
/// CTE runs to its end whether or not `select` reads it, and all of them run against the
/// statement's one snapshot: none sees another's rows, so only statements with no decision
/// between them and no row in common belong in one. Asserts the form, in release builds too.
pub fn pg_cte_sql(statements: &[(&str, &str, usize)], select: &str) -> String {
    assert!(
        !statements.is_empty() && statements.len() <= PG_CTE_PARTS_MAX,
        "a CTE statement has 1..={PG_CTE_PARTS_MAX} parts, not {}",
        statements.len()
    );
    assert!(!select.contains('$'), "the final select names no placeholder: {select}");
    let mut out = String::from("WITH ");
    let mut before = 0usize;
    for (k, (name, sql, binds)) in statements.iter().enumerate() {
        if k > 0 {
            out.push_str(", ");
        }
        out.push_str(name);
        out.push_str(" AS (");
        each_placeholder(sql, *binds, &mut out, |out, n| {
            out.push('$');
            out.push_str(&(before + n).to_string());
        });
        out.push(')');
        before += binds;
    }
    out.push(' ');
    out.push_str(select);
    out
}

/// Copies `sql` into `out`, each of its placeholders `$1, …, $binds` (once each, in order)
/// written by `emit` with its number. Asserts the form.
fn each_placeholder(sql: &str, binds: usize, out: &mut String, mut emit: impl FnMut(&mut String, usize)) {
    let mut chars = sql.chars().peekable();
    let mut next = 1usize;
    while let Some(ch) = chars.next() {
        if ch != '$' {
            out.push(ch);
            continue;
        }
        let mut n = 0usize;
        let mut digits = 0;
        while let Some(v) = chars.peek().and_then(|d| d.to_digit(10)) {
            n = n * 10 + v as usize;
            digits += 1;
            chars.next();
        }
        assert!(digits > 0 && n == next && n <= binds, "placeholder ${n} where ${next} of {binds} belongs: {sql}");
        emit(out, n);
        next += 1;
    }
    assert!(next == binds + 1, "{} of {binds} placeholders in {sql}", next - 1);
}

/// What one statement of a [`sqlite_batch`] returned: its rows, and the rows it changed
/// (meaningful for INSERT, UPDATE and DELETE only: SQLite reports the last change count
/// for any other statement).
#[derive(Default)]
pub struct BatchPart {
    pub rows: Vec<sqlx::sqlite::SqliteRow>,
    pub rows_affected: u64,
}

/// Runs `query` (a [`sqlite_batch_sql`] of `statements` statements, with their binds) on
/// `conn` in one call to the connection's worker thread, and splits what it returned by
/// statement. An error in any statement is the batch's error (the statements before it
/// ran; the caller's transaction rolls back).
pub async fn sqlite_batch<'q>(
    conn: &mut sqlx::SqliteConnection,
    query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    statements: usize,
) -> Result<Vec<BatchPart>, sqlx::Error> {
    use futures::TryStreamExt as _;
    let mut parts = Vec::with_capacity(statements);
    let mut current = BatchPart::default();
    // The per-statement results are only in `fetch_many`'s stream (see the module doc).
    #[allow(deprecated)]
    let mut stream = query.fetch_many(conn);
    while let Some(step) = stream.try_next().await? {
        match step {
            sqlx::Either::Right(row) => current.rows.push(row),
            sqlx::Either::Left(done) => {
                current.rows_affected = done.rows_affected();
                parts.push(std::mem::take(&mut current));
            }
        }
    }
    if parts.len() != statements || !current.rows.is_empty() {
        return Err(sqlx::Error::Protocol(format!(
            "a batch of {statements} statements answered {} results",
            parts.len()
        )));
    }
    Ok(parts)
}

/// The statement an unflushed batch ([`sqlite_unflushed`]) opens with: SQLite's
/// `synchronous = NORMAL`, under which a commit in WAL mode is written to the WAL but not
/// flushed to the disk.
pub const SQLITE_UNFLUSHED_PRAGMA: &str = "PRAGMA synchronous = NORMAL";
/// The statement an unflushed batch ends with: back to `synchronous = FULL`, every SQLite
/// connection's setting ([`sqlite_pool`]), under which each commit flushes the WAL.
pub const SQLITE_FLUSHED_PRAGMA: &str = "PRAGMA synchronous = FULL";

/// SQLite: `statements` in [`sqlite_batch_sql`]'s form between [`SQLITE_UNFLUSHED_PRAGMA`]
/// and [`SQLITE_FLUSHED_PRAGMA`]: autocommitted statements whose commits are not flushed
/// by themselves ([`sqlite_unflushed`]).
pub fn sqlite_unflushed_sql(statements: &[(&str, usize)]) -> String {
    let mut all = Vec::with_capacity(statements.len() + 2);
    all.push((SQLITE_UNFLUSHED_PRAGMA, 0));
    all.extend_from_slice(statements);
    all.push((SQLITE_FLUSHED_PRAGMA, 0));
    sqlite_batch_sql(&all)
}

/// Runs `query` ([`sqlite_unflushed_sql`] of `statements` autocommitted statements, with
/// their binds) on a connection of `pool` in one call to its worker, and answers what each
/// statement returned. Their commits go to the WAL without a flush of their own
/// (docs/performance.md "SQLite: unflushed releases"): the next commit made at `FULL` on
/// the file, by any connection, flushes them with itself (one flush of the WAL file makes
/// every frame written before it durable), and a checkpoint flushes the WAL before it
/// copies a page. So `kill -9` loses nothing (the writes are in the operating system's
/// cache), and a power loss or an OS crash can undo only commits made this way since the
/// last flushed one, never a flushed commit or anything before it. Only a write whose loss
/// is already safe belongs here (the lock server's release: its grant comes back and lapses
/// with its lease, as when the release's answer is lost).
///
/// Invariant: a connection goes back to the pool only at `FULL`, that is, only after the
/// whole batch ran, its last statement included; a batch that failed, or was dropped
/// before its end, closes its connection (a fresh one opens at `FULL`), so no other write
/// ever runs unflushed.
pub async fn sqlite_unflushed<'q>(
    pool: &sqlx::SqlitePool,
    query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    statements: usize,
) -> Result<Vec<BatchPart>, sqlx::Error> {
    let sql = sqlx::Execute::sql(&query);
    assert!(
        sql.starts_with(SQLITE_UNFLUSHED_PRAGMA)
            && sql.strip_suffix(";\n").is_some_and(|s| s.ends_with(SQLITE_FLUSHED_PRAGMA)),
        "an unflushed batch is framed by the two pragmas"
    );
    let mut held = HeldConnection(Some(pool.acquire().await?));
    let mut parts = sqlite_batch(held.conn(), query, statements + 2).await?;
    // The whole batch ran, `FULL` included: the connection may go back to the pool.
    held.give_back();
    parts.remove(0);
    parts.truncate(statements);
    Ok(parts)
}

/// A pooled SQLite connection whose state its pool must not inherit until its holder says
/// otherwise: it goes back to the pool only through [`HeldConnection::give_back`]; dropped
/// any other way (an error, a panic, a future dropped half-way), it is closed.
struct HeldConnection(Option<sqlx::pool::PoolConnection<sqlx::Sqlite>>);

impl HeldConnection {
    /// The connection. It is `Some` until `give_back` consumes `self`, so no caller sees it gone.
    fn conn(&mut self) -> &mut sqlx::SqliteConnection {
        self.0.as_deref_mut().expect("a held connection is there until given back")
    }

    /// Returns the connection to its pool: its holder left it clean.
    fn give_back(mut self) {
        drop(self.0.take());
    }
}

impl Drop for HeldConnection {
    fn drop(&mut self) {
        if let Some(mut conn) = self.0.take() {
            conn.close_on_drop();
        }
    }
}

/// The statement that opens a [`SqliteBatchTx`]: the write lock up front, as every SQLite
/// write transaction of the stores takes it.
pub const SQLITE_BATCH_TX_BEGIN: &str = "BEGIN IMMEDIATE";

/// SQLite: a write transaction whose `BEGIN IMMEDIATE` goes to the connection's worker in
/// one batch with its first statements ([`SqliteBatchTx::begin`]), and whose `COMMIT` goes
/// with its last statements ([`SqliteBatchTx::commit_with`]), or which ends with a
/// `ROLLBACK` ([`SqliteBatchTx::rollback`]): a read-decide-write transaction in two calls
/// to the worker where sqlx's `begin` and `commit` take one call each (the lock server's
/// acquire: five calls before, docs/performance.md "The lock server's grants").
///
/// sqlx does not count this transaction (it never saw its `BEGIN`), so it must never reach
/// the pool open. Invariant (asserted in release builds too): a connection goes back to the
/// pool only after a `COMMIT` or `ROLLBACK` that succeeded; a [`SqliteBatchTx`] dropped in
/// any other state (a failed batch, a failed end, an error or panic of its caller between
/// batches) closes its connection, and SQLite rolls back what a closed connection left
/// open. A failed `COMMIT` is classified by the caller as any other ([`is_commit_answer_lost`]).
pub struct SqliteBatchTx {
    /// Given back only by an end that succeeded; closed otherwise (it may hold the open
    /// transaction, which closing it rolls back).
    conn: HeldConnection,
}

impl SqliteBatchTx {
    /// The SQL of [`SqliteBatchTx::begin`]: [`SQLITE_BATCH_TX_BEGIN`], then `statements` in
    /// [`sqlite_batch_sql`]'s form.
    pub fn begin_sql(statements: &[(&str, usize)]) -> String {
        let mut all = Vec::with_capacity(statements.len() + 1);
        all.push((SQLITE_BATCH_TX_BEGIN, 0));
        all.extend_from_slice(statements);
        sqlite_batch_sql(&all)
    }

    /// Takes a connection of `pool` and runs `query` on it: [`SqliteBatchTx::begin_sql`] of
    /// `statements` statements, with their binds. Answers the open transaction and what each
    /// of the `statements` returned. On an error the connection is closed (the transaction,
    /// if it began, rolls back).
    pub async fn begin<'q>(
        pool: &sqlx::SqlitePool,
        query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
        statements: usize,
    ) -> Result<(SqliteBatchTx, Vec<BatchPart>), sqlx::Error> {
        assert!(
            sqlx::Execute::sql(&query).starts_with(SQLITE_BATCH_TX_BEGIN),
            "a batch transaction opens with {SQLITE_BATCH_TX_BEGIN}"
        );
        let mut tx = SqliteBatchTx { conn: HeldConnection(Some(pool.acquire().await?)) };
        let mut parts = sqlite_batch(tx.conn.conn(), query, statements + 1).await?;
        parts.remove(0);
        Ok((tx, parts))
    }

    /// The SQL of [`SqliteBatchTx::commit_with`]: `statements` in [`sqlite_batch_sql`]'s
    /// form, then `COMMIT`.
    pub fn commit_sql(statements: &[(&str, usize)]) -> String {
        let mut all = statements.to_vec();
        all.push(("COMMIT", 0));
        sqlite_batch_sql(&all)
    }

    /// Runs `query` ([`SqliteBatchTx::commit_sql`] of `statements` statements, with their
    /// binds) in one call: the statements, then `COMMIT`; returns the connection to the pool
    /// and what each of the `statements` returned. An error (in a statement, which stops the
    /// batch before its `COMMIT`, or in the `COMMIT`) closes the connection: whatever did
    /// not commit rolls back.
    pub async fn commit_with<'q>(
        mut self,
        query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
        statements: usize,
    ) -> Result<Vec<BatchPart>, sqlx::Error> {
        assert!(sqlx::Execute::sql(&query).ends_with("COMMIT;\n"), "a committing batch ends with COMMIT");
        let mut parts = sqlite_batch(self.conn.conn(), query, statements + 1).await?;
        parts.truncate(statements);
        // Ended: the connection may go back to the pool.
        self.conn.give_back();
        Ok(parts)
    }

    /// Rolls back, and returns the connection to the pool.
    pub async fn rollback(mut self) -> Result<(), sqlx::Error> {
        sqlx::query("ROLLBACK").execute(self.conn.conn()).await?;
        // Ended: the connection may go back to the pool.
        self.conn.give_back();
        Ok(())
    }
}

/// The database behind a `--database-url`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    Sqlite,
}

impl Dialect {
    pub fn of_url(url: &str) -> Result<Dialect, String> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Dialect::Postgres)
        } else if url.starts_with("sqlite:") {
            Ok(Dialect::Sqlite)
        } else {
            Err("database url must start with sqlite:// or postgres://".into())
        }
    }

    /// `sql` with its `$n` placeholders in this dialect's spelling.
    pub fn sql(self, sql: &str) -> Cow<'_, str> {
        match self {
            Dialect::Postgres => Cow::Borrowed(sql),
            Dialect::Sqlite => Cow::Owned(sql.replace('$', "?")),
        }
    }
}

/// The file path inside a `sqlite://PATH[?query]` URL (`None` for in-memory databases).
pub fn sqlite_path(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty() && path != ":memory:").then_some(path)
}

/// Describes a sqlx error without its connection string or bind values (and, should a
/// message ever quote a URL, without that URL's credentials: [`redact_credentials`]).
pub fn describe(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => {
            redact_credentials(&format!("database error {}: {}", db.code().unwrap_or_default(), db.message()))
        }
        other => redact_credentials(&other.to_string()),
    }
}

/// `text` with the credentials of every URL in it replaced by `***`: the user-info part
/// (`postgres://user:pw@host` becomes `postgres://***@host`) and any `password=` query
/// value. Every message, log line or error that may quote a database URL goes through it.
/// It errs towards hiding: everything between `://` and the last `@` of a word is hidden.
pub fn redact_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let word_end =
            tail.find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>')).unwrap_or(tail.len());
        let (word, after) = tail.split_at(word_end);
        let word = match word.rfind('@') {
            Some(at) => format!("***{}", &word[at..]),
            None => word.to_owned(),
        };
        out.push_str(&redact_password_param(&word));
        rest = after;
    }
    out.push_str(rest);
    out
}

/// `word` with the value of every `password=` parameter replaced by `***`.
fn redact_password_param(word: &str) -> String {
    let mut out = String::with_capacity(word.len());
    let mut rest = word;
    while let Some(i) = rest.to_ascii_lowercase().find("password=") {
        let (head, tail) = rest.split_at(i + "password=".len());
        out.push_str(head);
        let end = tail.find('&').unwrap_or(tail.len());
        out.push_str("***");
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Whether an error means "the database said something we cannot read" rather than
/// "the database could not be reached or refused to decide".
pub fn is_decode_error(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) | sqlx::Error::ColumnNotFound(_))
}

/// Whether a failed `COMMIT` lost its answer: the connection broke (I/O, TLS, protocol,
/// the SQLite worker, SQLite's `SQLITE_IOERR` family) after the commit was sent, so the
/// write may have committed. Every other failure of a commit is a refusal: nothing
/// committed. Every SQL store classifies its commits with this one rule
/// (`StoreFault::CommitUnknown` in `dlock-contract`).
pub fn is_commit_answer_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => true,
        // SQLITE_IOERR (10) and its extended codes.
        sqlx::Error::Database(db) => {
            db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
                && db.code().unwrap_or_default().parse::<i32>().is_ok_and(|c| c & 0xff == 10)
        }
        _ => false,
    }
}

/// Whether a statement failed because its connection is gone: every failure
/// [`is_commit_answer_lost`] names, plus PostgreSQL's own word that the session ended
/// (class 08, connection exception; 57P01-57P03, the server shutting the session down or
/// not taking it). A store may try a write again on another connection after such a failure
/// only if the write is idempotent: it may have been applied.
pub fn is_connection_lost(e: &sqlx::Error) -> bool {
    is_commit_answer_lost(e)
        || matches!(e, sqlx::Error::Database(db)
            if db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>().is_some()
                && db.code().is_some_and(|c| c.starts_with("08") || matches!(&*c, "57P01" | "57P02" | "57P03")))
}

/// A pooled connection that answered a ping: what the pool no longer checks before a
/// checkout, for a retry after [`is_connection_lost`]. A connection that does not answer is
/// closed; at most the pool's connections plus one checkouts are tried, so every dead idle
/// connection is passed over before a fresh one is opened.
pub async fn live_connection<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
) -> Result<sqlx::pool::PoolConnection<DB>, sqlx::Error> {
    use sqlx::Connection;
    let tries_max = pool.options().get_max_connections().saturating_add(1);
    let mut last = None;
    for _ in 0..tries_max {
        let mut conn = pool.acquire().await?;
        match conn.ping().await {
            Ok(()) => return Ok(conn),
            Err(e) => {
                conn.close_on_drop();
                last = Some(e);
            }
        }
    }
    Err(last.unwrap_or(sqlx::Error::PoolTimedOut))
}

/// The bounds every pool shares: no ping before a checkout, connections bounded by
/// [`POOL_IDLE_MS_MAX`] and [`POOL_LIFETIME_MS_MAX`].
fn pool_options<DB: sqlx::Database>(connections_max: u32, acquire_ms_max: u64) -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(connections_max)
        .acquire_timeout(Duration::from_millis(acquire_ms_max))
        .test_before_acquire(false)
        .idle_timeout(Duration::from_millis(POOL_IDLE_MS_MAX))
        .max_lifetime(Duration::from_millis(POOL_LIFETIME_MS_MAX))
}

/// A PostgreSQL pool with the shared bounds.
pub async fn pg_pool(url: &str) -> Result<sqlx::PgPool, sqlx::Error> {
    pool_options::<sqlx::Postgres>(PG_POOL_CONNECTIONS_MAX, POOL_ACQUIRE_MS_MAX).connect(url).await
}

/// [`pg_pool`] whose sessions give up waiting for a row lock after `lock_timeout_ms`
/// (PostgreSQL's `lock_timeout`, set as a startup parameter: no extra round trip). A
/// statement that waited too long fails with SQLSTATE 55P03 and its transaction rolls back.
pub async fn pg_pool_with_lock_timeout(url: &str, lock_timeout_ms: u64) -> Result<sqlx::PgPool, sqlx::Error> {
    let opts =
        sqlx::postgres::PgConnectOptions::from_str(url)?.options([("lock_timeout", format!("{lock_timeout_ms}ms"))]);
    pool_options::<sqlx::Postgres>(PG_POOL_CONNECTIONS_MAX, POOL_ACQUIRE_MS_MAX).connect_with(opts).await
}

/// A SQLite pool of its own (WAL, synchronous=FULL, foreign keys on, bounded busy wait),
/// creating the file and its directory when missing. Services writing paydb open theirs
/// through [`shared_sqlite_pool`]; a pool of its own is for readers (WAL readers never wait
/// for the writer) and for tools.
pub async fn sqlite_pool(url: &str) -> Result<sqlx::SqlitePool, sqlx::Error> {
    if let Some(parent) = sqlite_path(url).and_then(|p| std::path::Path::new(p).parent()) {
        if !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent).map_err(sqlx::Error::Io)?;
        }
    }
    pool_options::<sqlx::Sqlite>(SQLITE_POOL_CONNECTIONS_MAX, POOL_ACQUIRE_MS_MAX + SQLITE_BUSY_MS_MAX)
        .connect_with(sqlite_options(url)?)
        .await
}

/// Every SQLite connection's settings: WAL, synchronous=FULL, foreign keys on, bounded busy
/// wait, the file created when missing.
fn sqlite_options(url: &str) -> Result<sqlx::sqlite::SqliteConnectOptions, sqlx::Error> {
    Ok(sqlx::sqlite::SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .synchronous(sqlx::sqlite::SqliteSynchronous::Full)
        .foreign_keys(true)
        .busy_timeout(Duration::from_millis(SQLITE_BUSY_MS_MAX)))
}

/// The reader pool beside a writer pool on the same file: [`SQLITE_READERS_MAX`] connections
/// that refuse to write (`PRAGMA query_only`), opened on first use (the writer has created
/// the file and set WAL by then).
fn sqlite_reader_pool(url: &str) -> Result<sqlx::SqlitePool, sqlx::Error> {
    let opts = sqlite_options(url)?.pragma("query_only", "ON");
    Ok(pool_options::<sqlx::Sqlite>(SQLITE_READERS_MAX, POOL_ACQUIRE_MS_MAX + SQLITE_BUSY_MS_MAX)
        .connect_lazy_with(opts))
}

/// A SQLite pool shared with every other holder in this process of a pool on the same file
/// (the registry's key: the file's canonical path and the URL's query). Dereferences to the
/// pool; the registry forgets the pool once the last holder drops it (a later open makes a
/// fresh one), and never hands out a pool whose file was replaced since (another inode at
/// the path). An in-memory database is never shared.
#[derive(Debug, Clone)]
pub struct SharedSqlitePool(std::sync::Arc<RegisteredPool>);

#[derive(Debug)]
struct RegisteredPool {
    pool: sqlx::SqlitePool,
    /// Autocommitted reads (the writer itself for an in-memory database, which one
    /// connection owns).
    readers: sqlx::SqlitePool,
    key: String,
    file: Option<FileIdentity>,
}

impl std::ops::Deref for SharedSqlitePool {
    type Target = sqlx::SqlitePool;
    fn deref(&self) -> &sqlx::SqlitePool {
        &self.0.pool
    }
}

impl SharedSqlitePool {
    /// The pool (a clone shares its connections).
    pub fn pool(&self) -> &sqlx::SqlitePool {
        &self.0.pool
    }

    /// The pool for autocommitted reads beside the writer ([`SQLITE_READERS_MAX`]
    /// connections that cannot write; the writer itself for an in-memory database). A read
    /// that a write decides on belongs in the write's transaction, on [`Self::pool`].
    pub fn readers(&self) -> &sqlx::SqlitePool {
        &self.0.readers
    }

    /// Whether `self` and `other` are the same pool.
    pub fn same_pool(&self, other: &SharedSqlitePool) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The file a pool opened, to tell a replaced file from the one still open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileIdentity {
    dev: u64,
    ino: u64,
}

fn file_identity(path: &std::path::Path) -> Option<FileIdentity> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| FileIdentity { dev: m.dev(), ino: m.ino() })
}

type Registry = std::collections::BTreeMap<String, std::sync::Weak<RegisteredPool>>;

/// The process's shared SQLite pools, by key; dead entries are pruned on every open.
static SQLITE_POOLS: std::sync::Mutex<Registry> = std::sync::Mutex::new(std::collections::BTreeMap::new());

/// The registry key of `url` and the canonical file it names (`None`: in-memory, never
/// shared). The directory is created first, so the path can be made canonical before the
/// file exists.
fn sqlite_key(url: &str) -> Result<Option<(String, std::path::PathBuf)>, sqlx::Error> {
    let Some(path) = sqlite_path(url) else { return Ok(None) };
    let path = std::path::Path::new(path);
    let (dir, name) = match (path.parent(), path.file_name()) {
        (Some(d), Some(n)) => (if d.as_os_str().is_empty() { std::path::Path::new(".") } else { d }, n),
        _ => return Ok(None),
    };
    std::fs::create_dir_all(dir).map_err(sqlx::Error::Io)?;
    let file = std::fs::canonicalize(dir).map_err(sqlx::Error::Io)?.join(name);
    let query = url.split_once('?').map_or("", |(_, q)| q);
    Ok(Some((format!("{}?{query}", file.display()), file)))
}

/// The live pool registered under `key` for the file still at `file`, if any.
fn registered(reg: &Registry, key: &str, file: &std::path::Path) -> Option<SharedSqlitePool> {
    let live = reg.get(key)?.upgrade()?;
    (!live.pool.is_closed() && live.file.is_some() && live.file == file_identity(file))
        .then_some(SharedSqlitePool(live))
}

/// The thread every SQLite write transaction of this process runs on, whatever its file
/// (`dlock_rt::dedicated`): started by the first store that asks, kept for the process's life.
///
/// One for all files, not one per file: its runtime interleaves the transactions of every
/// file (each waits on its own connection's sqlx worker, not on the others), and measured
/// on 2 cores a second such thread (lockdb's beside paydb's) made both files' writes slower
/// than one thread did (docs/performance.md "The SQLite writer thread").
pub fn sqlite_writer_thread() -> Result<dlock_rt::dedicated::WriterThread, sqlx::Error> {
    static WRITER: std::sync::OnceLock<dlock_rt::dedicated::WriterThread> = std::sync::OnceLock::new();
    if let Some(w) = WRITER.get() {
        return Ok(w.clone());
    }
    let started = dlock_rt::dedicated::WriterThread::start(SQLITE_WRITER_THREAD_NAME)
        .map_err(|e| sqlx::Error::Io(std::io::Error::other(e)))?;
    Ok(WRITER.get_or_init(|| started).clone())
}

/// The name of every SQLite writer thread (`top -H` shows it).
pub const SQLITE_WRITER_THREAD_NAME: &str = "dlock-sqlite-writer";

/// The one pool of this process on the SQLite file of `url` ([`SharedSqlitePool`]), opened
/// with [`sqlite_pool`]'s settings when no holder has it open.
pub async fn shared_sqlite_pool(url: &str) -> Result<SharedSqlitePool, sqlx::Error> {
    let Some((key, file)) = sqlite_key(url)? else {
        let pool = sqlite_pool(url).await?;
        let readers = pool.clone();
        return Ok(SharedSqlitePool(std::sync::Arc::new(RegisteredPool {
            pool,
            readers,
            key: String::new(),
            file: None,
        })));
    };
    {
        let reg = SQLITE_POOLS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(shared) = registered(&reg, &key, &file) {
            return Ok(shared);
        }
    }
    // Opened without the registry's lock held (opening awaits); a concurrent open of the
    // same file that registered first wins, and this pool is dropped unused.
    let pool = sqlite_pool(url).await?;
    let identity = file_identity(&file);
    let mut reg = SQLITE_POOLS.lock().unwrap_or_else(|e| e.into_inner());
    reg.retain(|_, w| w.strong_count() > 0);
    if let Some(shared) = registered(&reg, &key, &file) {
        return Ok(shared);
    }
    let readers = sqlite_reader_pool(url)?;
    let shared =
        SharedSqlitePool(std::sync::Arc::new(RegisteredPool { pool, readers, key: key.clone(), file: identity }));
    reg.insert(key.clone(), std::sync::Arc::downgrade(&shared.0));
    // The invariant: one live pool per key.
    assert!(
        reg.get(&key).and_then(std::sync::Weak::upgrade).is_some_and(|p| std::sync::Arc::ptr_eq(&p, &shared.0)),
        "the shared pool of {} is not the registered one",
        shared.0.key
    );
    Ok(shared)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_placeholders_keep_their_numbers() {
        assert_eq!(Dialect::Sqlite.sql("a = $1 AND b = $10 OR c = $1"), "a = ?1 AND b = ?10 OR c = ?1");
        assert_eq!(Dialect::Postgres.sql("a = $1"), "a = $1");
    }

    #[test]
    fn a_batch_turns_each_statements_placeholders_into_positional_ones() {
        let sql = sqlite_batch_sql(&[
            ("UPDATE a SET x = $1 WHERE id = $2", 2),
            ("SELECT $1, $2, $3", 3),
            ("DELETE FROM b", 0),
        ]);
        assert_eq!(sql, "UPDATE a SET x = ? WHERE id = ?;\nSELECT ?, ?, ?;\nDELETE FROM b;\n");
    }

    #[test]
    fn a_cte_statement_numbers_each_parts_placeholders_after_the_ones_before_it() {
        let sql = pg_cte_sql(
            &[
                ("a", "INSERT INTO a VALUES ($1, $2) RETURNING 1", 2),
                ("b", "DELETE FROM b", 0),
                ("c", "UPDATE c SET x = $1 WHERE id = $2 AND y = $3 RETURNING x", 3),
            ],
            "SELECT (SELECT COUNT(*) FROM a), (SELECT x FROM c)",
        );
        assert_eq!(
            sql,
            "WITH a AS (INSERT INTO a VALUES ($1, $2) RETURNING 1), b AS (DELETE FROM b), \
             c AS (UPDATE c SET x = $3 WHERE id = $4 AND y = $5 RETURNING x) \
             SELECT (SELECT COUNT(*) FROM a), (SELECT x FROM c)"
        );
    }

    #[test]
    #[should_panic(expected = "placeholder $3 where $2 of 3 belongs")]
    fn a_cte_statement_refuses_placeholders_out_of_order() {
        pg_cte_sql(&[("a", "SELECT $1, $3, $2", 3)], "SELECT 1");
    }

    #[test]
    #[should_panic(expected = "placeholder $2 where $1 of 2 belongs")]
    fn a_batch_refuses_placeholders_out_of_order() {
        sqlite_batch_sql(&[("SELECT $2, $1", 2)]);
    }

    #[test]
    #[should_panic(expected = "1 of 2 placeholders")]
    fn a_batch_refuses_a_statement_with_fewer_placeholders_than_binds() {
        sqlite_batch_sql(&[("SELECT $1", 2)]);
    }

    #[test]
    fn sqlite_path_is_read_from_the_url() {
        assert_eq!(sqlite_path("sqlite://dlock-data/paydb.sqlite"), Some("dlock-data/paydb.sqlite"));
        assert_eq!(sqlite_path("sqlite:///tmp/x.db?mode=rwc"), Some("/tmp/x.db"));
        assert_eq!(sqlite_path("sqlite::memory:"), None);
    }

    #[test]
    fn printed_urls_never_carry_their_credentials() {
        let cases = [
            (
                "cannot connect to postgres://u:s3cret@db:5432/paydb: refused",
                "cannot connect to postgres://***@db:5432/paydb: refused",
            ),
            ("postgresql://s3cret@h/x and sqlite://a/b", "postgresql://***@h/x and sqlite://a/b"),
            ("\"postgres://u:p/s3cret@h/db\"", "\"postgres://***@h/db\""),
            (
                "postgres://h/db?user=u&password=s3cret&sslmode=require",
                "postgres://h/db?user=u&password=***&sslmode=require",
            ),
            ("no url here", "no url here"),
        ];
        for (raw, want) in cases {
            assert_eq!(redact_credentials(raw), want);
            assert!(!redact_credentials(raw).contains("s3cret"));
        }
    }

    #[test]
    fn dialect_follows_the_url_scheme() {
        assert_eq!(Dialect::of_url("postgres://u@h/db"), Ok(Dialect::Postgres));
        assert_eq!(Dialect::of_url("sqlite://x"), Ok(Dialect::Sqlite));
        assert!(Dialect::of_url("mysql://x").is_err());
    }

    #[test]
    fn a_commit_whose_connection_broke_lost_its_answer_and_a_refusal_did_not() {
        let broken = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(is_commit_answer_lost(&sqlx::Error::Io(broken)));
        assert!(is_commit_answer_lost(&sqlx::Error::WorkerCrashed));
        assert!(is_commit_answer_lost(&sqlx::Error::Protocol("unexpected message".into())));
        assert!(!is_commit_answer_lost(&sqlx::Error::PoolTimedOut), "no connection: nothing was sent");
        assert!(!is_commit_answer_lost(&sqlx::Error::RowNotFound));
    }

    #[test]
    fn a_lost_connection_is_every_lost_commit_answer_and_nothing_a_database_decided() {
        let broken = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "pipe");
        assert!(is_connection_lost(&sqlx::Error::Io(broken)));
        assert!(is_connection_lost(&sqlx::Error::WorkerCrashed));
        assert!(!is_connection_lost(&sqlx::Error::PoolTimedOut), "no connection was lost: none was had");
        assert!(!is_connection_lost(&sqlx::Error::RowNotFound));
    }
}
