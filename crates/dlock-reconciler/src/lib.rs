//! The reconciler (FR-26): the detective control. It reads paydb through its own store
//! trait ([`store::ReconcileStore`], over `dlock-paydb`'s shared statements, so it runs on SQL
//! in production and on `MemPaydb` in the simulation, and depends on no service crate), and the rail's own record (the
//! stub's `GET /calls` stands in for the bank's statement). It classifies every payout and
//! reports; it **never repairs**. Repair of a quarantined payout is a separate, explicit,
//! audited operator act: the command `dlock resolve` ([`resolve`]), or the same verdict over
//! HTTP, the payment-resource's `POST /v1/payouts/{payoutId}/resolution` (C3-extensions
//! E-21, the console's Resolve action), under the same field rules.
//!
//! - [`reconcile::reconcile`]: one run, at an explicit "now", into a [`report::Report`].
//! - [`report::Report::render_table`] and serde (`--json`); [`report::Report::exit_code`]:
//!   0 clean, 1 incident-grade finding, 3 a source unreadable within its budget.
//! - [`budget`]: C3 §3.8's `1 s / 30 s`, 3 tries per read.
//! - [`cli`]: the clap arguments of `dlock reconcile` and `dlock resolve`, and their entry
//!   points.

/// The reconciler's name for itself in emitted protocol events ([`dlock_rt::events`]).
pub const NODE: &str = "reconciler";

pub mod budget;
pub mod cli;
pub mod config;
#[cfg(not(madsim))]
pub mod open;
pub mod rail;
pub mod reconcile;
pub mod record;
pub mod report;
pub mod resolve;
pub mod store;

pub use reconcile::{reconcile, Bounds, Params, Paydb};
pub use report::{Finding, FindingKind, Report, Severity};
