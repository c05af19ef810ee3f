//! The rail-proxy's store: the trait every backend implements, and the records it speaks.
//!
//! The trait is shaped by T-024's transaction boundaries, not by tables:
//! [`RailStore::admit`] is steps 1–3 in **one** transaction (advance the mark, claim the
//! forwardable slot, move the payout to SUBMITTED), and [`RailStore::resolve`] is the
//! second transaction that records the outcome of the one forward in between. Nothing
//! between the two holds a database connection, so a slow rail never pins one.
//!
//! Invariants every implementation keeps (the conformance suite proves them on SQLite,
//! PostgreSQL and the simulation store alike):
//! 1. The mark for an account only rises, and only to a token strictly greater than it.
//! 2. At most one forwardable attempt (outcome NULL, ACKED, REJECTED or TIMEOUT) exists per
//!    payout, decided by the unique index, never by a prior read.
//! 3. Every attempt that passes validation leaves exactly one row carrying its token.
//! 4. A refused admission (fenced, duplicate) never changes the payout; a not-claimable
//!    one changes nothing at all.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::SubmissionOutcome;
use uuid::Uuid;

/// A store failure. Every variant means "no decision was made": the caller answers as if
/// the transaction never happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached, timed out, or was busy past its bound.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The database answered something the store cannot interpret.
    #[error("unexpected database content: {0}")]
    Corrupt(String),
}

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

/// The rail-proxy's view of paydb.
#[async_trait]
pub trait RailStore: Send + Sync + 'static {
    /// Cheap round trip, for readiness.
    async fn ping(&self) -> Result<(), StoreError>;

    /// The payout, for body validation before step 1 (advisory: `admit` decides).
    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutRow>, StoreError>;

    /// Steps 1–3 in one transaction. See [`Admission`].
    async fn admit(&self, attempt: &Attempt) -> Result<Admission, StoreError>;

    /// Records the outcome of the forward of `submission_id` and moves its payout out of
    /// SUBMITTED, in one transaction. Resolving an already-resolved row is a no-op.
    async fn resolve(&self, submission_id: Uuid, resolution: &Resolution, at: DateTime<Utc>) -> Result<(), StoreError>;

    /// The mark for an account, if it was ever set.
    async fn high_water(&self, account_id: &str) -> Result<Option<i64>, StoreError>;

    /// Attempts, in the order they were written; all of them, or one payout's.
    async fn submissions(&self, payout_id: Option<Uuid>) -> Result<Vec<SubmissionRow>, StoreError>;

    /// Ids of at most `limit` attempts whose outcome is still unrecorded and that were
    /// submitted before `before`, oldest first (the orphan sweep).
    async fn unresolved_before(&self, before: DateTime<Utc>, limit: i64) -> Result<Vec<Uuid>, StoreError>;

    /// Inserts a payout. Fails if the id exists.
    async fn insert_payout(&self, payout: &NewPayout, at: DateTime<Utc>) -> Result<(), StoreError>;
}
