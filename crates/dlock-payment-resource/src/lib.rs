//! The payment-resource: enforcement point (a) (C3 §3.4).
//!
//! It serves P1–P5 and two create endpoints over paydb, and trusts no lock state: only the
//! token it is handed and the fence it has stored (FR-15). Every protected write is one
//! conditional statement, `UPDATE accounts SET fence = :presented … WHERE … AND fence <
//! :presented`, in the same transaction as the state transition and, for a post, the two
//! balanced ledger entries. An equal token loses: strictly greater, never `>=`.
//!
//! Every mutating request is recorded in a durable idempotency ledger, with its fingerprint
//! and complete response, atomically with the mutation (see [`store`]).

pub mod app;
pub mod cursor;
pub mod idempotency;
pub mod metrics;
pub mod service;
pub mod store;
pub mod store_fault;
pub mod store_mem;
#[cfg(not(madsim))]
pub mod store_sql;

pub use app::router;
pub use service::{PaymentConfig, PaymentResource};
pub use store::PaymentStore;
