//! paydb's rail rows: payouts as the proxy reads them, its attempts and their outcomes.
//!
//! Moved here from the rail-proxy's store so that the payment-resource's simulation store
//! and the reconciler speak the same records without depending on the proxy; the proxy
//! re-exports them.

use chrono::{DateTime, Utc};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::SubmissionOutcome;
use uuid::Uuid;

/// The slice of a payout the proxy reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayoutRow {
    pub payout_id: Uuid,
    pub account_id: String,
    pub amount_minor: i64,
    pub currency: String,
    pub beneficiary_ref: String,
    pub state: PayoutState,
    pub attempt_count: i32,
}

/// A payout to insert (tests, the quick start, and the simulation seed work with it until
/// the payment-resource owns payout creation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPayout {
    pub payout_id: Uuid,
    pub account_id: String,
    pub amount_minor: i64,
    pub currency: String,
    pub beneficiary_ref: String,
    pub state: PayoutState,
}

/// One validated submission attempt, ready for steps 1–3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub submission_id: Uuid,
    pub payout_id: Uuid,
    pub account_id: String,
    pub presented_token: i64,
    pub owner_id: String,
    pub idempotency_key: String,
    pub amount_minor: i64,
    pub currency: String,
    pub at: DateTime<Utc>,
    /// `rail.proxy.fencing.enabled`; `false` skips step 1 (only under `--profile unsafe-test`).
    pub fencing_enabled: bool,
}

/// What steps 1–3 decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// The intent row committed and the payout is SUBMITTED: forward exactly once.
    Admitted { submitted_at: DateTime<Utc> },
    /// Step 1: the token did not exceed the mark. A FENCED row was written.
    Fenced { highest_token: i64 },
    /// Step 2: a forwardable attempt already exists. A DUPLICATE row was written.
    Duplicate { first_submitted_at: DateTime<Utc>, first_submission_id: Uuid },
    /// The payout is not CLAIMED. Nothing was written; the mark did not move.
    NotClaimable { state: PayoutState },
}

/// The outcome of the one forward, to record in the second transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    Acked {
        rail_reference: String,
    },
    Rejected {
        detail: String,
    },
    /// Forwarded, outcome unknown: the payout is quarantined.
    Timeout {
        detail: String,
    },
    /// The connection could not be opened: nothing was presented.
    Unsent {
        detail: String,
    },
}

impl Resolution {
    pub fn outcome(&self) -> SubmissionOutcome {
        match self {
            Resolution::Acked { .. } => SubmissionOutcome::Acked,
            Resolution::Rejected { .. } => SubmissionOutcome::Rejected,
            Resolution::Timeout { .. } => SubmissionOutcome::Timeout,
            Resolution::Unsent { .. } => SubmissionOutcome::Unsent,
        }
    }

    /// The payout state this outcome moves a SUBMITTED payout to (C2).
    pub fn payout_state(&self) -> PayoutState {
        match self {
            Resolution::Acked { .. } => PayoutState::RailAcked,
            Resolution::Rejected { .. } => PayoutState::Failed,
            Resolution::Timeout { .. } => PayoutState::RailAmbiguous,
            Resolution::Unsent { .. } => PayoutState::Claimed,
        }
    }

    pub fn detail(&self) -> Option<&str> {
        match self {
            Resolution::Acked { .. } => None,
            Resolution::Rejected { detail } | Resolution::Timeout { detail } | Resolution::Unsent { detail } => {
                Some(detail)
            }
        }
    }

    pub fn rail_reference(&self) -> Option<&str> {
        match self {
            Resolution::Acked { rail_reference } => Some(rail_reference),
            _ => None,
        }
    }
}

/// One `rail_submission` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmissionRow {
    pub submission_id: Uuid,
    pub payout_id: Uuid,
    pub account_id: String,
    pub presented_token: i64,
    pub owner_id: String,
    pub idempotency_key: String,
    pub amount_minor: i64,
    pub currency: String,
    pub outcome: Option<SubmissionOutcome>,
    pub outcome_detail: Option<String>,
    pub rail_reference: Option<String>,
    pub submitted_at: DateTime<Utc>,
    pub resolved_at: Option<DateTime<Utc>>,
}

/// Whether an outcome occupies the payout's one forwardable slot (`rail_submission_attempt_uidx`).
pub fn is_forwardable(outcome: Option<SubmissionOutcome>) -> bool {
    matches!(outcome, None | Some(SubmissionOutcome::Acked | SubmissionOutcome::Rejected | SubmissionOutcome::Timeout))
}
