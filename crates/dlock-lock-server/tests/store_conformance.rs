//! Runs the lock store conformance suite (C3 §3.3, L1–L8; the invariants of
//! `dlock_lock_server::store`) against every `LockStore` backend. Today that is the
//! simulation store, which also runs under `--cfg madsim`.

mod conformance;

use std::sync::Arc;

use dlock_lock_server::store::LockStore;
use dlock_lock_server::store_mem::MemLockStore;
use dlock_rt::Clock;

async fn sim() -> (Arc<dyn LockStore>, ()) {
    (Arc::new(MemLockStore::new(Clock::system())), ())
}

lock_store_conformance!(sim_store, sim());

#[cfg(not(madsim))]
async fn sql(db: dlock_testkit::Db) -> (Arc<dyn LockStore>, dlock_testkit::TempDir) {
    let (url, dir) = dlock_testkit::fresh_database(db).await;
    (dlock_lock_server::store_sql::open(&url).await.expect("open lockdb"), dir)
}

#[cfg(not(madsim))]
lock_store_conformance!(sqlite_store, sql(dlock_testkit::Db::Sqlite));
#[cfg(not(madsim))]
lock_store_conformance!(postgres_store, sql(dlock_testkit::Db::Postgres));
