//! Runs the rail store conformance suite against SQLite, PostgreSQL and the simulation
//! stores, the proxy's own tables and all of paydb in memory (the last two also under
//! `--cfg madsim`, where sqlx cannot run). Requirement ids: see
//! docs/contracts/requirements.md.

mod conformance;

use std::sync::Arc;

use dlock_rail_proxy::store::RailStore;
use dlock_rail_proxy::store_mem::MemRailStore;
#[cfg(not(madsim))]
use dlock_testkit::{fresh_database, Db, TempDir};

#[cfg(not(madsim))]
async fn sqlite() -> (Arc<dyn RailStore>, TempDir) {
    let (url, dir) = fresh_database(Db::Sqlite).await;
    (dlock_rail_proxy::store_sql::open(&url).await.expect("open sqlite"), dir)
}

#[cfg(not(madsim))]
async fn postgres() -> (Arc<dyn RailStore>, TempDir) {
    let (url, dir) = fresh_database(Db::Postgres).await;
    (dlock_rail_proxy::store_sql::open(&url).await.expect("open postgres"), dir)
}

async fn sim() -> (Arc<dyn RailStore>, ()) {
    (Arc::new(MemRailStore::new()), ())
}

/// All of paydb in memory, the simulation's database (the payment-resource shares it).
async fn sim_paydb() -> (Arc<dyn RailStore>, ()) {
    (Arc::new(dlock_rail_proxy::store_mem::MemPaydb::new()), ())
}

#[cfg(not(madsim))]
rail_store_conformance!(sqlite_store, sqlite());
#[cfg(not(madsim))]
rail_store_conformance!(postgres_store, postgres());
rail_store_conformance!(sim_store, sim());
rail_store_conformance!(sim_paydb_store, sim_paydb());
