//! The pools' bounds (docs/performance.md "Pools"): no ping before a checkout, so a connection
//! broken while idle fails its first statement and the pool then recovers on its own; and
//! one SQLite pool per file per process while anyone holds it.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it bounds its own waits on real processes with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

use std::time::Duration;

use dlock_db::{shared_sqlite_pool, POOL_IDLE_MS_MAX, POOL_LIFETIME_MS_MAX};
use sqlx::Connection;

/// How long a test polls for the pool to recover before failing.
const RECOVERY_MS_MAX: u64 = 10_000;
/// Pause between two polls.
const POLL_MS: u64 = 20;

#[tokio::test]
async fn no_pool_pings_before_a_checkout_and_every_pool_bounds_idle_and_age() {
    let dir = dlock_testkit::TempDir::new("pools");
    let sqlite = dlock_db::sqlite_pool(&dlock_testkit::sqlite_url(&dir)).await.expect("sqlite");
    let pg = dlock_db::pg_pool(&dlock_testkit::pg_database().await).await.expect("postgres");
    for (name, before, idle, life) in [
        (
            "sqlite",
            sqlite.options().get_test_before_acquire(),
            sqlite.options().get_idle_timeout(),
            sqlite.options().get_max_lifetime(),
        ),
        (
            "postgres",
            pg.options().get_test_before_acquire(),
            pg.options().get_idle_timeout(),
            pg.options().get_max_lifetime(),
        ),
    ] {
        assert!(!before, "{name}: the pool pings before a checkout");
        assert_eq!(idle, Some(Duration::from_millis(POOL_IDLE_MS_MAX)), "{name}");
        assert_eq!(life, Some(Duration::from_millis(POOL_LIFETIME_MS_MAX)), "{name}");
    }
}

/// Terminates every other backend connected to the database of `url`; returns how many.
async fn terminate_backends(url: &str) -> i64 {
    let mut admin = sqlx::PgConnection::connect(&dlock_testkit::pg_admin_url()).await.expect("admin");
    let db = url.rsplit('/').next().and_then(|d| d.split('?').next()).expect("database name").to_owned();
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> pg_backend_pid()) t",
    )
    .bind(db)
    .fetch_one(&mut admin)
    .await
    .expect("terminate");
    let _ = admin.close().await;
    killed
}

#[tokio::test]
async fn a_connection_killed_while_idle_fails_its_first_statement_and_the_pool_recovers() {
    let url = dlock_testkit::pg_database().await;
    let pool = dlock_db::pg_pool(&url).await.expect("pool");
    sqlx::query("SELECT 1").execute(&pool).await.expect("warm");
    // The connection goes back to the pool in a task of its own (after sqlx's release ping).
    let deadline = std::time::Instant::now() + Duration::from_millis(RECOVERY_MS_MAX);
    while pool.num_idle() != 1 {
        assert!(std::time::Instant::now() < deadline, "the connection never came back idle");
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    assert!(terminate_backends(&url).await >= 1, "the idle connection's backend was terminated");
    // Without a ping the dead connection is handed out: its first statement (a BEGIN, as
    // every store transaction starts) fails, and nothing reached the server.
    let first = pool.begin().await;
    let Err(e) = first else { panic!("the first statement on the killed connection succeeded: it was pinged") };
    assert!(
        !matches!(&e, sqlx::Error::Database(db) if db.code().is_some_and(|c| c.starts_with("23"))),
        "a broken connection is no refusal: {e}"
    );
    // sqlx pings a connection when it comes back and closes a broken one, so the pool
    // recovers without anyone's help.
    let deadline = std::time::Instant::now() + Duration::from_millis(RECOVERY_MS_MAX);
    loop {
        match sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(&pool).await {
            Ok(1) => break,
            other => {
                assert!(std::time::Instant::now() < deadline, "the pool did not recover: {other:?}");
                tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
            }
        }
    }
}

#[tokio::test]
async fn one_sqlite_file_gets_one_pool_per_process_however_its_url_is_spelled() {
    let dir = dlock_testkit::TempDir::new("pools");
    let file = dir.path().join("paydb.sqlite");
    let a = shared_sqlite_pool(&format!("sqlite://{}", file.display())).await.expect("a");
    let b = shared_sqlite_pool(&format!("sqlite:{}/./paydb.sqlite", dir.path().display())).await.expect("b");
    assert!(a.same_pool(&b), "two opens of one file share one pool");
    let other =
        shared_sqlite_pool(&format!("sqlite://{}", dir.path().join("lockdb.sqlite").display())).await.expect("c");
    assert!(!a.same_pool(&other), "another file has a pool of its own");
    sqlx::query("CREATE TABLE t (v INTEGER)").execute(a.pool()).await.expect("create");
    sqlx::query("INSERT INTO t VALUES (1)").execute(&*b).await.expect("write through the other holder");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t").fetch_one(a.pool()).await.expect("read");
    assert_eq!(n, 1);
}

#[tokio::test]
async fn a_shared_sqlite_pool_is_forgotten_with_its_last_holder_and_never_outlives_its_file() {
    let dir = dlock_testkit::TempDir::new("pools");
    let url = dlock_testkit::sqlite_url(&dir);
    let first = shared_sqlite_pool(&url).await.expect("first");
    let pool = first.pool().clone();
    drop(first);
    // The registry held no strong reference: a new open is a new pool.
    let second = shared_sqlite_pool(&url).await.expect("second");
    sqlx::query("SELECT 1").execute(&pool).await.expect("the first pool still works for its clone");
    pool.close().await;
    assert!(!second.is_closed(), "closing the forgotten pool does not close the new one");
    // A closed pool is not handed out either.
    second.close().await;
    let reopened = shared_sqlite_pool(&url).await.expect("reopened");
    assert!(!reopened.same_pool(&second) && !reopened.is_closed(), "a closed pool is not handed out");
    drop((second, reopened));
    // The file replaced under a held pool: a later open never reuses the pool of the old file.
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.path().join(format!("paydb.sqlite{suffix}")));
    }
    let held = shared_sqlite_pool(&url).await.expect("held");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.path().join(format!("paydb.sqlite{suffix}")));
    }
    let fresh = shared_sqlite_pool(&url).await.expect("fresh");
    assert!(!held.same_pool(&fresh), "a pool of a replaced file is not handed out");
    assert!(dir.path().join("paydb.sqlite").is_file());
}

#[tokio::test]
async fn an_in_memory_database_is_never_shared() {
    let a = shared_sqlite_pool("sqlite::memory:").await.expect("a");
    let b = shared_sqlite_pool("sqlite::memory:").await.expect("b");
    assert!(!a.same_pool(&b));
}

#[tokio::test]
async fn a_read_on_the_reader_pool_does_not_wait_for_an_open_write_and_sees_every_commit() {
    let dir = dlock_testkit::TempDir::new("pools");
    let shared = shared_sqlite_pool(&dlock_testkit::sqlite_url(&dir)).await.expect("open");
    sqlx::query("CREATE TABLE t (v INTEGER)").execute(shared.pool()).await.expect("create");
    sqlx::query("INSERT INTO t VALUES (1)").execute(shared.pool()).await.expect("insert");
    // The writer's only connection is inside a write transaction: a read queued on the
    // writer would wait for it (and time out), one on the readers answers at once.
    let mut tx = shared.pool().begin().await.expect("begin");
    sqlx::query("INSERT INTO t VALUES (2)").execute(&mut *tx).await.expect("insert in tx");
    let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM t").fetch_one(shared.readers()).await.expect("read");
    assert_eq!(seen, 1, "a reader sees only committed rows");
    tx.commit().await.expect("commit");
    let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM t").fetch_one(shared.readers()).await.expect("read");
    assert_eq!(seen, 2, "a read begun after a commit returned sees it");
    // Readers cannot write.
    let refused = sqlx::query("INSERT INTO t VALUES (3)").execute(shared.readers()).await;
    assert!(refused.is_err(), "a reader connection refuses writes: {refused:?}");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t").fetch_one(shared.pool()).await.expect("read");
    assert_eq!(n, 2);
}

/// The batch behaviour the stores rely on (sqlx-sqlite, deprecated in sqlx 0.8): every
/// statement of one query runs, in order, with positional binds across them, and each
/// statement's rows and change count come back apart; an error in a later statement is the
/// batch's error and leaves the earlier ones to the transaction's rollback.
#[tokio::test]
async fn a_sqlite_batch_runs_every_statement_in_order_and_answers_each_apart() {
    use dlock_db::{sqlite_batch, sqlite_batch_sql};
    let (shared, _dir) = table_t().await;
    let sql = sqlite_batch_sql(&[
        ("INSERT INTO t (id, v) VALUES ($1, $2) RETURNING id", 2),
        ("UPDATE t SET v = v + $1 WHERE id = $2 RETURNING v", 2),
        ("UPDATE t SET v = 0 WHERE id = $1", 1),
        ("SELECT COUNT(*) AS n FROM t WHERE v > $1", 1),
    ]);
    let mut tx = shared.pool().begin().await.expect("begin");
    let q = sqlx::query(&sql).bind(2_i64).bind(20_i64).bind(5_i64).bind(1_i64).bind(99_i64).bind(0_i64);
    let parts = sqlite_batch(&mut tx, q, 4).await.expect("batch");
    use sqlx::Row as _;
    assert_eq!(parts.len(), 4);
    assert_eq!((parts[0].rows.len(), parts[0].rows_affected), (1, 1));
    assert_eq!(parts[0].rows[0].get::<i64, _>("id"), 2);
    assert_eq!(parts[1].rows[0].get::<i64, _>("v"), 15, "the second statement saw its own binds");
    assert_eq!((parts[2].rows.len(), parts[2].rows_affected), (0, 0), "no row 99: nothing changed");
    assert_eq!(parts[3].rows[0].get::<i64, _>("n"), 2, "the last statement saw the first two");
    tx.commit().await.expect("commit");
    // An error in the second statement: the first ran, the rollback undoes it.
    let sql =
        sqlite_batch_sql(&[("INSERT INTO t (id, v) VALUES ($1, 1)", 1), ("INSERT INTO t (id, v) VALUES ($1, 1)", 1)]);
    let mut tx = shared.pool().begin().await.expect("begin");
    let q = sqlx::query(&sql).bind(3_i64).bind(1_i64);
    assert!(sqlite_batch(&mut tx, q, 2).await.is_err(), "id 1 exists: the batch fails");
    tx.rollback().await.expect("rollback");
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t").fetch_one(shared.pool()).await.expect("count");
    assert_eq!(n, 2, "row 3 of the failed batch rolled back with it");
}

/// A [`dlock_db::SqliteBatchTx`] opens with its first statements in one call, commits what
/// its committing batch wrote, and hands back a connection sqlx can begin a transaction on
/// (none left open); a rolled-back one leaves nothing.
#[tokio::test]
async fn a_sqlite_batch_transaction_commits_or_rolls_back_and_leaves_its_connection_clean() {
    use dlock_db::SqliteBatchTx;
    use sqlx::Row as _;
    let (shared, _dir) = table_t().await;
    let open = SqliteBatchTx::begin_sql(&[("SELECT v FROM t WHERE id = $1", 1)]);
    let (tx, parts) = SqliteBatchTx::begin(shared.pool(), sqlx::query(&open).bind(1_i64), 1).await.expect("begin");
    assert_eq!(parts.len(), 1, "the BEGIN's own result is not among the parts");
    assert_eq!(parts[0].rows[0].get::<i64, _>("v"), 10);
    let last = SqliteBatchTx::commit_sql(&[
        ("INSERT INTO t (id, v) VALUES ($1, $2)", 2),
        ("UPDATE t SET v = v + 1 WHERE id = $1", 1),
        ("UPDATE t SET v = v + $1 WHERE id = $2 RETURNING v", 2),
    ]);
    let q = sqlx::query(&last).bind(2_i64).bind(20_i64).bind(1_i64).bind(5_i64).bind(2_i64);
    let parts = tx.commit_with(q, 3).await.expect("commit");
    assert_eq!(parts.len(), 3, "the COMMIT's own result is not among the parts");
    assert_eq!(parts[2].rows[0].get::<i64, _>("v"), 25);
    // The pool's one connection is back, outside any transaction: sqlx's own BEGIN works.
    let mut plain = shared.pool().begin().await.expect("sqlx can begin on the returned connection");
    let sum: i64 = sqlx::query_scalar("SELECT SUM(v) FROM t").fetch_one(&mut *plain).await.expect("sum");
    assert_eq!(sum, 36, "every batch's writes committed");
    plain.rollback().await.expect("rollback");

    let write = SqliteBatchTx::begin_sql(&[("INSERT INTO t (id, v) VALUES ($1, $2)", 2)]);
    let (tx, _) =
        SqliteBatchTx::begin(shared.pool(), sqlx::query(&write).bind(3_i64).bind(30_i64), 1).await.expect("begin");
    tx.rollback().await.expect("rollback");
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t").fetch_one(shared.pool()).await.expect("count");
    assert_eq!(n, 2, "the rolled-back insert is gone");
}

/// A [`dlock_db::SqliteBatchTx`] whose batch fails half-way (the earlier statement applied:
/// here its opening batch, then a committing batch that failed before its `COMMIT`) never
/// reaches the pool: its connection is closed, SQLite rolls the transaction back, and the
/// next checkout writes (it would wait out the busy timeout and fail if the open transaction
/// still held the write lock).
#[tokio::test]
async fn a_sqlite_batch_transaction_dropped_open_rolls_back_and_frees_the_writer() {
    use dlock_db::SqliteBatchTx;
    let (shared, _dir) = table_t().await;
    let failing = SqliteBatchTx::begin_sql(&[
        ("UPDATE t SET v = 11 WHERE id = $1", 1),
        ("INSERT INTO t (id, v) VALUES ($1, 1)", 1),
        ("INSERT INTO t (id, v) VALUES ($1, 1)", 1),
    ]);
    let q = sqlx::query(&failing).bind(1_i64).bind(2_i64).bind(1_i64);
    assert!(SqliteBatchTx::begin(shared.pool(), q, 3).await.is_err(), "id 1 exists");
    let mut plain = shared.pool().begin().await.expect("a fresh connection begins");
    sqlx::query("INSERT INTO t VALUES (5, 50)").execute(&mut *plain).await.expect("the write lock is free");
    plain.commit().await.expect("commit");
    let rows: Vec<(i64, i64)> =
        sqlx::query_as("SELECT id, v FROM t ORDER BY id").fetch_all(shared.pool()).await.expect("rows");
    assert_eq!(rows, vec![(1, 10), (5, 50)], "the dropped transaction's update and insert rolled back");

    // A committing batch whose statement fails stops before its COMMIT: nothing commits.
    let open = SqliteBatchTx::begin_sql(&[("UPDATE t SET v = 11 WHERE id = $1", 1)]);
    let (tx, _) = SqliteBatchTx::begin(shared.pool(), sqlx::query(&open).bind(1_i64), 1).await.expect("begin");
    let failing = SqliteBatchTx::commit_sql(&[("INSERT INTO t (id, v) VALUES ($1, 1)", 1)]);
    assert!(tx.commit_with(sqlx::query(&failing).bind(5_i64), 1).await.is_err(), "id 5 exists");
    let mut plain = shared.pool().begin().await.expect("a fresh connection begins");
    sqlx::query("INSERT INTO t VALUES (6, 60)").execute(&mut *plain).await.expect("the write lock is free");
    plain.commit().await.expect("commit");
    let v: i64 = sqlx::query_scalar("SELECT v FROM t WHERE id = 1").fetch_one(shared.pool()).await.expect("v");
    assert_eq!(v, 10, "the failed committing batch's transaction rolled back");
}

/// The writer connection's `synchronous` level: 1 NORMAL, 2 FULL.
async fn synchronous(shared: &dlock_db::SharedSqlitePool) -> i64 {
    sqlx::query_scalar("PRAGMA synchronous").fetch_one(shared.pool()).await.expect("pragma")
}

/// An unflushed batch (docs/performance.md "SQLite: unflushed releases") runs its
/// statements at NORMAL, commits them, and hands its connection back at FULL, so the next
/// write flushes as every write does.
#[tokio::test]
async fn an_unflushed_sqlite_batch_runs_at_normal_and_hands_its_connection_back_at_full() {
    let (shared, _dir) = table_t().await;
    assert_eq!(synchronous(&shared).await, 2, "every connection opens at FULL");
    let sql = dlock_db::sqlite_unflushed_sql(&[("PRAGMA synchronous", 0), ("UPDATE t SET v = 11 WHERE id = $1", 1)]);
    let parts = dlock_db::sqlite_unflushed(shared.pool(), sqlx::query(&sql).bind(1_i64), 2).await.expect("batch");
    assert_eq!(parts.len(), 2, "one part per statement, the pragmas' left out");
    let level: i64 = sqlx::Row::get(&parts[0].rows[0], 0);
    assert_eq!(level, 1, "the statements ran at NORMAL");
    assert_eq!(parts[1].rows_affected, 1);
    assert_eq!(synchronous(&shared).await, 2, "the connection went back to the pool at FULL");
    let v: i64 = sqlx::query_scalar("SELECT v FROM t WHERE id = 1").fetch_one(shared.pool()).await.expect("v");
    assert_eq!(v, 11, "the update committed");
}

/// A batch that fails after its NORMAL and before its FULL closes its connection: the pool's
/// next write runs on a fresh connection, at FULL, never on one left unflushed.
#[tokio::test]
async fn a_failed_unflushed_sqlite_batch_closes_its_connection_so_no_other_write_runs_unflushed() {
    let (shared, _dir) = table_t().await;
    let sql = dlock_db::sqlite_unflushed_sql(&[("INSERT INTO t (id, v) VALUES ($1, 1)", 1)]);
    assert!(dlock_db::sqlite_unflushed(shared.pool(), sqlx::query(&sql).bind(1_i64), 1).await.is_err(), "id 1 exists");
    assert_eq!(synchronous(&shared).await, 2, "the writer after a failed unflushed batch flushes");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM t").fetch_one(shared.pool()).await.expect("count");
    assert_eq!(rows, 1, "the failed insert wrote nothing");
}

/// A batch dropped half-way (here while its update waits for the write lock) closes its
/// connection too, and the statements after the drop never run.
#[tokio::test]
async fn an_unflushed_sqlite_batch_dropped_half_way_closes_its_connection() {
    let (shared, dir) = table_t().await;
    let mut other = sqlx::SqliteConnection::connect(&dlock_testkit::sqlite_url(&dir)).await.expect("second connection");
    sqlx::query("BEGIN IMMEDIATE").execute(&mut other).await.expect("the other connection holds the write lock");
    let sql = dlock_db::sqlite_unflushed_sql(&[("UPDATE t SET v = 11 WHERE id = $1", 1)]);
    let batch = dlock_db::sqlite_unflushed(shared.pool(), sqlx::query(&sql).bind(1_i64), 1);
    assert!(tokio::time::timeout(Duration::from_millis(300), batch).await.is_err(), "the update waits for the lock");
    sqlx::query("ROLLBACK").execute(&mut other).await.expect("the lock is freed");
    assert_eq!(synchronous(&shared).await, 2, "the writer after a dropped unflushed batch flushes");
}

/// A shared SQLite pool on a fresh file with table `t (id, v)` holding the row `(1, 10)`.
async fn table_t() -> (dlock_db::SharedSqlitePool, dlock_testkit::TempDir) {
    let dir = dlock_testkit::TempDir::new("pools");
    let shared = shared_sqlite_pool(&dlock_testkit::sqlite_url(&dir)).await.expect("open");
    sqlx::query("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)").execute(shared.pool()).await.expect("t");
    sqlx::query("INSERT INTO t VALUES (1, 10)").execute(shared.pool()).await.expect("row");
    (shared, dir)
}
