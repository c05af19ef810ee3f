//! Runs the rail store conformance suite against SQLite, PostgreSQL and the simulation
//! store. Requirement ids: see docs/contracts/requirements.md.

mod conformance;

use std::sync::Arc;

use dlock_rail_proxy::store::RailStore;
use dlock_rail_proxy::store_mem::MemRailStore;
use dlock_testkit::{fresh_database, Db, TempDir};

async fn sqlite() -> (Arc<dyn RailStore>, TempDir) {
    let (url, dir) = fresh_database(Db::Sqlite).await;
    (dlock_rail_proxy::store_sql::open(&url).await.expect("open sqlite"), dir)
}

async fn postgres() -> (Arc<dyn RailStore>, TempDir) {
    let (url, dir) = fresh_database(Db::Postgres).await;
    (dlock_rail_proxy::store_sql::open(&url).await.expect("open postgres"), dir)
}

async fn sim() -> (Arc<dyn RailStore>, ()) {
    (Arc::new(MemRailStore::new()), ())
}

rail_store_conformance!(sqlite_store, sqlite());
rail_store_conformance!(postgres_store, postgres());
rail_store_conformance!(sim_store, sim());
