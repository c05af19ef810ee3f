//! Runs the payment store conformance suite against SQLite, PostgreSQL and the simulation
//! store (the last also under `--cfg madsim`, where sqlx cannot run). Every backend is one
//! fresh paydb, opened both as the payment-resource's `PaymentStore` and as the proxy's
//! `RailStore`. Requirement ids: see docs/contracts/requirements.md.

mod conformance;

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use conformance::Operator;
use dlock_contract::payout::PayoutState;
use dlock_payment_resource::store::PaymentStore;
use dlock_payment_resource::store_mem::{guard_transition, MemPaydb};
use dlock_rail_proxy::store::RailStore;
use uuid::Uuid;

/// The simulation's operator writes the shared tables directly, through the same guard as
/// the SQL trigger.
struct SimOperator(Arc<MemPaydb>);

#[async_trait]
impl Operator for SimOperator {
    async fn set_payout_state(&self, payout_id: Uuid, to: PayoutState, at: DateTime<Utc>) {
        self.0
            .with_tables(|t| {
                let p = t.rail.payouts.get_mut(&payout_id).expect("payout exists");
                guard_transition(p.row.state, to).expect("a C2 transition");
                p.row.state = to;
                p.updated_at = at;
            })
            .expect("store");
    }
}

async fn sim() -> (Arc<dyn PaymentStore>, Arc<dyn RailStore>, Arc<dyn Operator>) {
    let paydb = Arc::new(MemPaydb::new());
    (paydb.clone(), paydb.clone(), Arc::new(SimOperator(paydb)))
}

#[cfg(not(madsim))]
mod sql {
    use super::*;
    use dlock_payment_resource::store_sql::{PgPaymentStore, SqlitePaymentStore};
    use dlock_rail_proxy::store_sql::{PgRailStore, SqliteRailStore};
    use dlock_testkit::{fresh_database, Db, TempDir};
    use sqlx::Connection;

    /// A hand-run `UPDATE` on the database (its triggers still apply); keeps the database's
    /// temp dir alive.
    pub struct SqlOperator {
        url: String,
        _dir: TempDir,
    }

    const SET_STATE: &str = "UPDATE payouts SET state = $1, updated_at = $2 WHERE payout_id = $3";

    #[async_trait]
    impl Operator for SqlOperator {
        async fn set_payout_state(&self, payout_id: Uuid, to: PayoutState, at: DateTime<Utc>) {
            let rows = if self.url.starts_with("sqlite:") {
                let mut conn = sqlx::SqliteConnection::connect(&self.url).await.expect("connect sqlite");
                let sql = SET_STATE.replace('$', "?");
                let q = sqlx::query(&sql).bind(to.as_str()).bind(at).bind(payout_id.to_string());
                q.execute(&mut conn).await.expect("update payout").rows_affected()
            } else {
                let mut conn = sqlx::PgConnection::connect(&self.url).await.expect("connect postgres");
                let q = sqlx::query(SET_STATE).bind(to.as_str()).bind(at).bind(payout_id.to_string());
                q.execute(&mut conn).await.expect("update payout").rows_affected()
            };
            assert_eq!(rows, 1, "payout {payout_id} exists");
        }
    }

    pub async fn sqlite() -> (Arc<dyn PaymentStore>, Arc<dyn RailStore>, Arc<dyn Operator>) {
        let (url, dir) = fresh_database(Db::Sqlite).await;
        let pay = SqlitePaymentStore::open(&url).await.expect("open sqlite payment store");
        let rail = SqliteRailStore::open(&url).await.expect("open sqlite rail store");
        (Arc::new(pay), Arc::new(rail), Arc::new(SqlOperator { url, _dir: dir }))
    }

    pub async fn postgres() -> (Arc<dyn PaymentStore>, Arc<dyn RailStore>, Arc<dyn Operator>) {
        let (url, dir) = fresh_database(Db::Postgres).await;
        let pay = PgPaymentStore::open(&url).await.expect("open postgres payment store");
        let rail = PgRailStore::open(&url).await.expect("open postgres rail store");
        (Arc::new(pay), Arc::new(rail), Arc::new(SqlOperator { url, _dir: dir }))
    }
}

#[cfg(not(madsim))]
payment_store_conformance!(sqlite_store, sql::sqlite());
#[cfg(not(madsim))]
payment_store_conformance!(postgres_store, sql::postgres());
payment_store_conformance!(sim_store, sim());
