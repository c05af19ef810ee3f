//! The admission decision of C3 §3.5, once: fence, duplicate, intent, as pure functions
//! from the facts a store read to the decision it applies; and a batch's (C3-extensions
//! E-19): one fence verdict for all its payouts, then each payout as a single one.
//!
//! The functions live in [`dlock_paydb::admission`] (with their invariants, asserted in
//! release builds too, and their property test against a history model), because the
//! in-memory tables' admission code ([`dlock_paydb::mem::RailTables::admit`]) applies them
//! there and `dlock-paydb` depends on no service crate. This module re-exports them: the
//! proxy's SQL store calls the step functions through it to choose its answer from what
//! each conditional statement revealed, and an answer the rule would not give is corrupt
//! content, never a guess.

pub use dlock_paydb::admission::{
    advanced_mark, decide_admission, decide_batch_admission, mark_verdict, may_submit, AdmissionDecision,
    AdmissionFacts, BatchDecision, BatchFacts, FirstAttempt, MarkVerdict, PayoutFacts,
};
