//! A typed client of the rail-proxy (C3 §3.5): the one submission of a claimed payout, and
//! its batch (C3-extensions E-19).
//!
//! [`RailClient::submit`] takes the contract's [`SubmissionRequest`] with the grant's token
//! and returns the proxy's [`SubmissionAck`] or a [`RailRefusal`], which keeps apart a C3
//! envelope (its code's retry-safety is the catalogue's verdict), a request that provably
//! never left this process, a request that was sent and never answered, and an answer that
//! is not C3.
//!
//! # Invariants
//!
//! 1. **A submission is sent at most once. Ever** (C3 §3.8, the only hop with a hard zero).
//!    [`RailClient::submit`] has no loop: one connection, one request, whatever comes back.
//!    Not after a connect failure, not after a 503, not after a lost answer. A retry would
//!    re-enter the proxy's duplicate guard (answered `DUPLICATE_SUBMISSION`) at best; after
//!    an unknown outcome it is the double payment this project exists to prevent.
//!    [`RailClient::submit_batch`] is the same hard zero for several payouts at once: one
//!    request, never re-sent, its refusal the whole batch's.
//! 2. **A lost answer is an ambiguity**: [`RailRefusal::NoAnswer`] is never retry-safe, and
//!    [`RailRefusal::outcome_unknown`] says so, as it does for `RAIL_AMBIGUOUS`, `INTERNAL`
//!    and an unreadable answer.
//! 3. **The budget is C3 §3.8's**: connect 1 s, read `rail.proxy.read-timeout-ms` + 2 s
//!    (10 s by default), so the proxy observes the rail's outcome before this caller gives
//!    up. Out-of-range settings are refused by [`RailClient::new`], never clamped.
//! 4. **Time and sockets come from `dlock_rt`**, so the client runs unchanged in the madsim
//!    simulation.
//!
//! [`SubmissionRequest`]: dlock_contract::rail::SubmissionRequest
//! [`SubmissionAck`]: dlock_contract::rail::SubmissionAck

mod client;
pub mod refusal;

pub use client::{
    RailClient, RailClientConfig, CONNECT_TIMEOUT_MS_DEFAULT, RAIL_READ_TIMEOUT_MS_DEFAULT, READ_MARGIN_MS,
    SUBMISSIONS_PATH, SUBMISSION_BATCHES_PATH, TIMEOUT_MS_CEILING_MAX,
};
pub use refusal::RailRefusal;
