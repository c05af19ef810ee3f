//! Tokens never go backwards on the SQL backends: across a backend restart (a fresh pool
//! on the same database), across a restore that left the token source behind the issued
//! tokens, and across a revoke's raised floor; a rotate (C3-extensions E-18) draws from the
//! same source, above all of them.

#![cfg(not(madsim))]

use std::sync::Arc;

use dlock_lock_server::store::LockStore;
use dlock_testkit::{fresh_database, Db};
use uuid::Uuid;

async fn grant(store: &Arc<dyn LockStore>, key: &str) -> i64 {
    let s = store.open_session(Uuid::new_v4(), "w", 30_000).await.expect("session");
    store.acquire(key, s.session_id, 30_000, 0).await.expect("acquire").expect("granted").fencing_token
}

async fn tokens_survive_a_backend_restart(db: Db) {
    let (url, _dir) = fresh_database(db).await;
    let first = dlock_lock_server::store_sql::open(&url).await.expect("open");
    let mut last = 0;
    for i in 0..5 {
        last = grant(&first, &format!("k{i}")).await;
    }
    drop(first);
    let reopened = dlock_lock_server::store_sql::open(&url).await.expect("reopen");
    let next = grant(&reopened, "after-restart").await;
    assert!(next > last, "token {next} issued after {last} across a restart");
}

async fn revoke_floor_survives_a_backend_restart(db: Db) {
    let (url, _dir) = fresh_database(db).await;
    let store = dlock_lock_server::store_sql::open(&url).await.expect("open");
    let t = grant(&store, "k").await;
    let floor = store
        .revoke("k", "ops", "stuck holder, revoking", Some(t), Uuid::new_v4())
        .await
        .expect("revoke")
        .expect("revoked")
        .new_token_floor;
    drop(store);
    let reopened = dlock_lock_server::store_sql::open(&url).await.expect("reopen");
    let next = grant(&reopened, "k").await;
    assert!(next > floor, "token {next} issued at or below the floor {floor} after a restart");
}

/// Rotated tokens come from the one token source: above the rotated grant, above a revoke's
/// floor, and below every later grant, across a restart.
async fn rotated_tokens_stay_in_the_one_sequence(db: Db) {
    let (url, _dir) = fresh_database(db).await;
    let store = dlock_lock_server::store_sql::open(&url).await.expect("open");
    let t = grant(&store, "revoked").await;
    let floor = store
        .revoke("revoked", "ops", "stuck holder, revoking", Some(t), Uuid::new_v4())
        .await
        .expect("revoke")
        .expect("revoked")
        .new_token_floor;
    let s = store.open_session(Uuid::new_v4(), "w", 30_000).await.expect("session");
    let mut token = store.acquire("k", s.session_id, 30_000, 0).await.expect("acquire").expect("granted").fencing_token;
    assert!(token > floor);
    for _ in 0..3 {
        let rotated = store.rotate("k", s.session_id, token, 30_000, 0).await.expect("rotate").expect("rotated");
        assert!(rotated.fencing_token > token, "rotate issued {} over {token}", rotated.fencing_token);
        token = rotated.fencing_token;
    }
    drop(store);
    let reopened = dlock_lock_server::store_sql::open(&url).await.expect("reopen");
    let next = grant(&reopened, "after-restart").await;
    assert!(next > token, "token {next} issued after the rotated {token} across a restart");
}

#[tokio::test]
async fn postgres_rotated_tokens_stay_in_the_one_sequence() {
    rotated_tokens_stay_in_the_one_sequence(Db::Postgres).await
}

#[tokio::test]
async fn sqlite_rotated_tokens_stay_in_the_one_sequence() {
    rotated_tokens_stay_in_the_one_sequence(Db::Sqlite).await
}

#[tokio::test]
async fn postgres_tokens_survive_a_backend_restart() {
    tokens_survive_a_backend_restart(Db::Postgres).await
}

#[tokio::test]
async fn sqlite_tokens_survive_a_backend_restart() {
    tokens_survive_a_backend_restart(Db::Sqlite).await
}

#[tokio::test]
async fn postgres_revoke_floor_survives_a_backend_restart() {
    revoke_floor_survives_a_backend_restart(Db::Postgres).await
}

#[tokio::test]
async fn sqlite_revoke_floor_survives_a_backend_restart() {
    revoke_floor_survives_a_backend_restart(Db::Sqlite).await
}

/// A restore from an older backup (or a hand-reset sequence) leaves `fencing_token_seq`
/// behind tokens already issued. Opening the store moves it past the persisted floor, the
/// last issued token and every live grant, so the next token is still the largest.
#[tokio::test]
async fn postgres_sequence_set_back_by_a_restore_is_repaired_at_open() {
    let (url, _dir) = fresh_database(Db::Postgres).await;
    let store = dlock_lock_server::store_sql::open(&url).await.expect("open");
    let mut last = 0;
    for i in 0..5 {
        last = grant(&store, &format!("k{i}")).await;
    }
    drop(store);
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    sqlx::query("SELECT setval('fencing_token_seq', 1)").execute(&pool).await.expect("set back");
    pool.close().await;
    let reopened = dlock_lock_server::store_sql::open(&url).await.expect("reopen");
    let next = grant(&reopened, "after-restore").await;
    assert!(next > last, "token {next} issued after {last} once the sequence was set back");
}

/// The sequence hands out tokens one at a time (`CACHE 1`): no connection holds a block of
/// tokens it could issue after a newer one.
#[tokio::test]
async fn postgres_token_sequence_caches_one_value() {
    let (url, _dir) = fresh_database(Db::Postgres).await;
    drop(dlock_lock_server::store_sql::open(&url).await.expect("open"));
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let cache: i64 = sqlx::query_scalar("SELECT cache_size FROM pg_sequences WHERE sequencename = 'fencing_token_seq'")
        .fetch_one(&pool)
        .await
        .expect("pg_sequences");
    assert_eq!(cache, 1);
}
