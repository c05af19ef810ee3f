//! PostgreSQL: an acquire's and a rotate's transaction opens with `BEGIN` and the key's
//! advisory lock in one simple query (`store_sql::pg_begin_key_sql`). These tests hold it to
//! what the two statements did: the same lock as the bound statement revoke still takes
//! (an acquire and a rotate wait while another transaction holds it), and a connection whose
//! one-round-trip `BEGIN` failed part-way is not handed to the next caller in an aborted
//! transaction.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it bounds its own waits on real processes with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

use std::str::FromStr;
use std::time::Duration;

use dlock_lock_server::store::{LockStore, StoreError};
use dlock_lock_server::store_sql::{pg_begin_key_sql, PgLockStore};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

/// How long a test waits for the store's call to be seen waiting on the key's lock.
const WAITER_SEEN_MS_MAX: u64 = 20_000;
/// How long a test waits for a store call to finish once the lock is free.
const CALL_DONE_MS_MAX: u64 = 20_000;

/// The key's advisory lock as revoke takes it: a bound statement after `BEGIN`.
async fn hold_key_lock(url: &str, key: &str) -> PgConnection {
    let mut conn = PgConnection::connect(url).await.expect("connect holder");
    sqlx::query("BEGIN").execute(&mut conn).await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(key)
        .execute(&mut conn)
        .await
        .expect("take the key's lock");
    conn
}

async fn free_key_lock(mut holder: PgConnection) {
    sqlx::query("ROLLBACK").execute(&mut holder).await.expect("rollback holder");
}

/// Waits until a session of this database waits for an advisory lock, while `call` is still
/// running; panics if `call` ends first (it did not wait for the lock) or the bound passes.
async fn until_waiting_on_advisory_lock<T>(url: &str, call: &tokio::task::JoinHandle<T>, what: &str) {
    let mut watcher = PgConnection::connect(url).await.expect("connect watcher");
    let deadline = std::time::Instant::now() + Duration::from_millis(WAITER_SEEN_MS_MAX);
    loop {
        assert!(!call.is_finished(), "the {what} finished while another transaction held its key's lock");
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .fetch_one(&mut watcher)
        .await
        .expect("read pg_locks");
        if waiting > 0 {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the {what} never waited for its key's lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn finished<T>(call: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(Duration::from_millis(CALL_DONE_MS_MAX), call).await.expect("call ends").expect("call task")
}

#[test]
fn only_a_key_of_the_c3_alphabet_is_inlined_into_the_begin() {
    assert_eq!(
        pg_begin_key_sql("payout:acct-1.a_b").as_deref(),
        Some("BEGIN; SELECT pg_advisory_xact_lock(hashtextextended('payout:acct-1.a_b', 0))")
    );
    for key in ["", "a'b", "a\\b", "a b", "a;b", "k\u{e9}", &"k".repeat(129)] {
        assert_eq!(pg_begin_key_sql(key), None, "{key:?} was inlined");
    }
    assert!(pg_begin_key_sql(&"k".repeat(128)).is_some());
}

#[tokio::test]
async fn on_postgresql_an_acquire_and_a_rotate_wait_for_the_keys_advisory_lock() {
    let url = dlock_testkit::pg_database().await;
    let store = std::sync::Arc::new(PgLockStore::open(&url).await.expect("open lockdb"));
    let key = "payout:acct-1";
    let session = store.open_session(Uuid::new_v4(), "w", 30_000).await.expect("session").session_id;

    let holder = hold_key_lock(&url, key).await;
    let acquire = tokio::spawn({
        let store = store.clone();
        async move { store.acquire(key, session, 30_000, 0).await }
    });
    until_waiting_on_advisory_lock(&url, &acquire, "acquire").await;
    free_key_lock(holder).await;
    let granted = finished(acquire).await.expect("acquire answers").expect("granted");

    let holder = hold_key_lock(&url, key).await;
    let token = granted.fencing_token;
    let rotate = tokio::spawn({
        let store = store.clone();
        async move { store.rotate(key, session, token, 30_000, 0).await }
    });
    until_waiting_on_advisory_lock(&url, &rotate, "rotate").await;
    free_key_lock(holder).await;
    let rotated = finished(rotate).await.expect("rotate answers").expect("rotated");
    assert!(rotated.fencing_token > token);
}

#[tokio::test]
async fn on_postgresql_a_connection_whose_key_begin_failed_is_not_pooled() {
    let url = dlock_testkit::pg_database().await;
    drop(PgLockStore::open(&url).await.expect("migrate lockdb"));
    // One connection, so the next call gets the same one unless it was closed; a short
    // lock_timeout makes the key's lock fail inside the one-round-trip BEGIN.
    let opts = sqlx::postgres::PgConnectOptions::from_str(&url).expect("url").options([("lock_timeout", "200ms")]);
    let pool = sqlx::pool::PoolOptions::<sqlx::Postgres>::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect_with(opts)
        .await
        .expect("pool");
    let store = PgLockStore::over(pool).await.expect("store");
    let session = store.open_session(Uuid::new_v4(), "w", 30_000).await.expect("session").session_id;

    let holder = hold_key_lock(&url, "k").await;
    let failed = store.acquire("k", session, 30_000, 0).await;
    assert!(matches!(failed, Err(StoreError::Unavailable(_))), "acquire under a held key lock: {failed:?}");
    free_key_lock(holder).await;

    let other = store.acquire("k2", session, 30_000, 0).await.expect("the next acquire runs").expect("granted");
    let same = store.acquire("k", session, 30_000, 0).await.expect("the key's acquire runs").expect("granted");
    assert!(same.fencing_token > other.fencing_token);
    store.heartbeat(session).await.expect("a later transaction runs").expect("session live");
}
