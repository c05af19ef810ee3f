//! paydb, the one database the payment-resource, the rail-proxy and the reconciler share:
//! its migrations and migrators, its row types, the in-memory tables and the SQL the stores
//! share. The three services depend on this crate, never on each other; each keeps its own
//! store trait and its implementations (a test over `cargo metadata` proves no service
//! crate depends on another, `crates/dlock-testkit/tests/service_dependencies.rs`).
//!
//! - [`StoreError`]: the one error every paydb store answers.
//! - [`admission`]: the proxy's admission decision (C3 §3.5: fence, duplicate, intent) as
//!   pure functions, a batch's too (C3-extensions E-19: one fence verdict, then each
//!   payout), which [`mem::RailTables::admit`] and [`mem::RailTables::admit_batch`] apply
//!   and the proxy's SQL store consults; the proxy's `admission` module re-exports them.
//! - [`ledger`]: the ledger rules (the balanced payout posting, the debit that never
//!   overdraws) as pure functions, applied here and by the payment-resource, whose `rules`
//!   module re-exports them.
//! - [`rail`]: the proxy's rows (payouts as it reads them, attempts, outcomes).
//! - [`pay`]: the payment rows (accounts, ledger entries, payouts as P1/P4 report them,
//!   operator resolutions).
//! - [`findings`]: the reconciler's recorded findings (the open rows and their
//!   `reconciler.finding` events) and the one rule that opens and clears them.
//! - [`mem`]: all of paydb in memory ([`mem::MemPaydb`]), the simulation's database.
//! - `sql` (not under `cfg(madsim)`: sqlx cannot run there): the migrators, the error
//!   mapping and the shared statements, for PostgreSQL and SQLite.
//!
//! Invariant: paydb's schema has one source, `migrations/paydb`, embedded here once; a store
//! that opens paydb runs these migrators and no other. Each rule is written once: a rule
//! that code in this crate applies lives in this crate (never in a service crate, which this
//! crate must not depend on), and the service crates re-export it.

pub mod admission;
pub mod events;
pub mod findings;
pub mod ledger;
pub mod mem;
pub mod pay;
pub mod rail;
#[cfg(not(madsim))]
pub mod sql;

pub use dlock_contract::store::{ClassifiedStoreError, StoreFault};
pub use mem::MemPaydb;

/// The SQL list of the states whose payouts reserve their amount ([`pay::is_unsettled`]). A
/// macro, so that `concat!` can splice it into statement literals.
#[macro_export]
macro_rules! unsettled_sql {
    () => {
        "('CLAIMED', 'SUBMITTED', 'RAIL_ACKED', 'RAIL_AMBIGUOUS')"
    };
}

/// A paydb store failure: the one store error every store shares ([`StoreFault`],
/// C3-extensions C-29): `Unavailable` is 503 and retry-safe, the others 500.
pub use dlock_contract::store::StoreError;
