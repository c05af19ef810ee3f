//! paydb's payment rows: what the payment-resource writes and the reconciler reads
//! (accounts, ledger entries, payouts as P1/P4 report them, operator resolutions).
//!
//! Moved here from the payment-resource's store so that the reconciler reads the same
//! records without depending on the service; the payment-resource re-exports them.

use chrono::{DateTime, Utc};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::SubmissionOutcome;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::StoreError;

/// The operations the idempotency ledger records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Operation {
    CreateAccount,
    CreatePayout,
    Claim,
    Post,
    /// An operator's resolution of a RAIL_AMBIGUOUS payout over HTTP (C3-extensions E-21).
    Resolve,
}

impl Operation {
    pub const ALL: [Operation; 5] =
        [Operation::CreateAccount, Operation::CreatePayout, Operation::Claim, Operation::Post, Operation::Resolve];

    /// Column spelling (`idempotency_records.operation`).
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::CreateAccount => "CREATE_ACCOUNT",
            Operation::CreatePayout => "CREATE_PAYOUT",
            Operation::Claim => "CLAIM",
            Operation::Post => "POST",
            Operation::Resolve => "RESOLVE",
        }
    }

    pub fn parse(raw: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|o| o.as_str() == raw)
    }
}

/// A complete response, as recorded: status and exact body bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

/// A ledger entry's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Direction {
    Debit,
    Credit,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Debit => "DEBIT",
            Direction::Credit => "CREDIT",
        }
    }

    pub fn parse(raw: &str) -> Option<Direction> {
        match raw {
            "DEBIT" => Some(Direction::Debit),
            "CREDIT" => Some(Direction::Credit),
            _ => None,
        }
    }
}

/// One `ledger_entries` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    pub entry_id: Uuid,
    pub posting_id: Uuid,
    /// `None` for an opening balance.
    pub payout_id: Option<Uuid>,
    pub account_id: String,
    pub direction: Direction,
    pub amount_minor: i64,
    pub currency: String,
    /// The posting's token; 0 for an opening balance.
    pub fence: i64,
    pub created_at: DateTime<Utc>,
}

/// The system account that funds opening balances in `currency`.
pub fn funding_account(currency: &str) -> String {
    format!("#funding:{currency}")
}

/// The system account that posted payouts in `currency` are credited to.
pub fn settlement_account(currency: &str) -> String {
    format!("#settlement:{currency}")
}

/// Whether `account_id` names a system account (`#…`; no request can name one).
pub fn is_system_account(account_id: &str) -> bool {
    account_id.starts_with('#')
}

/// The account kinds (`accounts.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AccountKind {
    Customer,
    Funding,
    Settlement,
}

impl AccountKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AccountKind::Customer => "CUSTOMER",
            AccountKind::Funding => "FUNDING",
            AccountKind::Settlement => "SETTLEMENT",
        }
    }

    pub fn parse(raw: &str) -> Option<AccountKind> {
        match raw {
            "CUSTOMER" => Some(AccountKind::Customer),
            "FUNDING" => Some(AccountKind::Funding),
            "SETTLEMENT" => Some(AccountKind::Settlement),
            _ => None,
        }
    }
}

/// An account as P5 reports it, with the ledger sum recomputed from the entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountView {
    pub account_id: String,
    pub kind: AccountKind,
    pub currency: String,
    pub balance_minor: i64,
    pub fence: i64,
    /// Σ CREDIT − Σ DEBIT over the account's entries (FR-25: equals `balance_minor` for a
    /// CUSTOMER account).
    pub ledger_sum_minor: i64,
    /// Σ amount of the account's unsettled payouts (CLAIMED, SUBMITTED, RAIL_ACKED,
    /// RAIL_AMBIGUOUS).
    pub reserved_minor: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// One attempt as P4 summarises it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmissionSummary {
    pub submission_id: Uuid,
    pub presented_token: i64,
    pub outcome: Option<SubmissionOutcome>,
    pub rail_reference: Option<String>,
    pub submitted_at: DateTime<Utc>,
    pub resolved_at: Option<DateTime<Utc>>,
}

/// A payout as P4 reports it: every column, plus its attempts in `seq` order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayoutView {
    pub payout_id: Uuid,
    pub account_id: String,
    pub amount_minor: i64,
    pub currency: String,
    pub beneficiary_ref: String,
    pub state: PayoutState,
    pub attempt_count: i32,
    pub claim_token: Option<i64>,
    pub claimed_by: Option<String>,
    pub claimed_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub submissions: Vec<SubmissionSummary>,
}

/// One P1 item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayoutSummary {
    pub payout_id: Uuid,
    pub account_id: String,
    pub amount_minor: i64,
    pub currency: String,
    pub state: PayoutState,
    pub attempt_count: i32,
    pub created_at: DateTime<Utc>,
}

/// A payout's posting: DEBIT the payout's account, CREDIT `#settlement:{CUR}`, one amount,
/// both entries carrying `fence`. A post and an operator's resolution as POSTED both write
/// exactly these two rows.
pub struct PayoutPosting<'a> {
    pub payout_id: Uuid,
    pub posting_id: Uuid,
    /// `[DEBIT the account, CREDIT settlement]`.
    pub entry_ids: [Uuid; 2],
    pub account_id: &'a str,
    pub amount_minor: i64,
    pub currency: &'a str,
    /// The posting's token (0 for an operator's resolution: an operator holds no lock).
    pub fence: i64,
    pub at: DateTime<Utc>,
}

impl PayoutPosting<'_> {
    /// The two entries ([`crate::ledger::payout_posting`], which asserts they balance).
    pub fn entries(&self) -> [LedgerEntry; 2] {
        crate::ledger::payout_posting(self)
    }
}

/// An operator's verdict on a RAIL_AMBIGUOUS payout, backed by a rail reference (C2:
/// RAIL_AMBIGUOUS → POSTED | FAILED, operator only), from `dlock resolve` or from
/// `POST /v1/payouts/{payoutId}/resolution` (C3-extensions E-21). The caller validates the
/// text fields with [`dlock_contract::resolution`] (`reason` ≥
/// [`RESOLUTION_REASON_CHARS_MIN`] characters); the store refuses any `resolved_as` other
/// than POSTED or FAILED.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmbiguousResolution {
    pub resolution_id: Uuid,
    pub payout_id: Uuid,
    /// POSTED (the rail paid) or FAILED (it did not).
    pub resolved_as: PayoutState,
    pub operator: String,
    pub reason: String,
    /// The rail's reference, or the statement line, the verdict rests on.
    pub rail_reference: String,
    /// Ids of the posting and its entries when resolved as POSTED: `[DEBIT the account,
    /// CREDIT settlement]`; unused for FAILED.
    pub posting_id: Uuid,
    pub entry_ids: [Uuid; 2],
    pub at: DateTime<Utc>,
}

/// The bounds of a resolution's text fields, with the field rules every surface applies
/// (`dlock resolve`, the payment-resource's route, the console) in
/// [`dlock_contract::resolution`].
pub use dlock_contract::resolution::{
    RESOLUTION_RAIL_REFERENCE_CHARS_MAX, RESOLUTION_REASON_CHARS_MAX, RESOLUTION_REASON_CHARS_MIN,
};

impl AmbiguousResolution {
    /// The posting a resolution as POSTED writes at `at`, with fence 0: an operator is not a
    /// lock holder, and its write is not fenced (the payout is quarantined, so no holder
    /// can touch it).
    pub fn entries(&self, account_id: &str, amount_minor: i64, currency: &str, at: DateTime<Utc>) -> [LedgerEntry; 2] {
        PayoutPosting {
            payout_id: self.payout_id,
            posting_id: self.posting_id,
            entry_ids: self.entry_ids,
            account_id,
            amount_minor,
            currency,
            fence: 0,
            at,
        }
        .entries()
    }

    /// Refuses a verdict C2 does not allow (checked by every store before any write).
    pub fn check(&self) -> Result<(), StoreError> {
        if matches!(self.resolved_as, PayoutState::Posted | PayoutState::Failed) {
            Ok(())
        } else {
            Err(StoreError::Corrupt(format!(
                "a RAIL_AMBIGUOUS payout resolves to POSTED or FAILED, not {}",
                self.resolved_as.as_str()
            )))
        }
    }

    /// The audit row this resolution writes.
    pub fn row(&self, at: DateTime<Utc>) -> ResolutionRow {
        ResolutionRow {
            resolution_id: self.resolution_id,
            payout_id: self.payout_id,
            resolved_as: self.resolved_as,
            operator: self.operator.clone(),
            reason: self.reason.clone(),
            rail_reference: self.rail_reference.clone(),
            resolved_at: at,
        }
    }
}

/// What an operator's resolution decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveOutcome {
    /// Committed: the payout is `state` (POSTED or FAILED), the audit row is written, and the
    /// account's balance is `balance_minor` (debited for POSTED, unchanged for FAILED).
    Resolved {
        state: PayoutState,
        balance_minor: i64,
    },
    /// Rolled back: only a RAIL_AMBIGUOUS payout can be resolved.
    NotAmbiguous {
        state: PayoutState,
    },
    NotFound,
}

/// One `payout_resolutions` row: the audit trail of operator resolutions (append-only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolutionRow {
    pub resolution_id: Uuid,
    pub payout_id: Uuid,
    pub resolved_as: PayoutState,
    pub operator: String,
    pub reason: String,
    pub rail_reference: String,
    pub resolved_at: DateTime<Utc>,
}

/// A snapshot bound later than any payout (9999-12-31T23:59:59Z), for reading every payout
/// of a state regardless of its creator's clock. (Not `DateTime::MAX_UTC`: its text form
/// sorts before every ordinary instant in SQLite.)
pub fn snapshot_after_everything() -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(253_402_300_799, 0).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// A lower bound earlier than any payout (0001-01-01T00:00:00Z): what a store binds for "no
/// lower bound" ([`ListQuery::created_after`] `None`), so the bound stays one plain range.
/// (Not `DateTime::MIN_UTC`: PostgreSQL's timestamps do not reach it.)
pub fn before_every_payout() -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(-62_135_596_800, 0).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// A P1 page request. Rows come in (`created_at`, `payout_id`) ascending order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    pub state: PayoutState,
    pub account_id: Option<String>,
    /// Rows created after this instant are not listed (the walk's fixed snapshot).
    pub snapshot: DateTime<Utc>,
    /// Only rows created after this instant (`None`: no lower bound). A walk's first page
    /// reads the rows stamped after its own millisecond this way (a clock ahead of the
    /// listing replica's stamped them), one index range (docs/contracts/C3-extensions.md,
    /// "P1 cursor").
    pub created_after: Option<DateTime<Utc>>,
    /// Keyset: only rows strictly after (`created_at`, `payout_id`).
    pub after: Option<(DateTime<Utc>, Uuid)>,
    /// Rows to return at most (the service asks for one more than it shows).
    pub limit: i64,
}

/// Whether a payout in `state` holds a reservation against its account's balance.
pub fn is_unsettled(state: PayoutState) -> bool {
    matches!(state, PayoutState::Claimed | PayoutState::Submitted | PayoutState::RailAcked | PayoutState::RailAmbiguous)
}
