//! The payment-resource's store: the trait every paydb backend implements, and the records
//! it speaks.
//!
//! The trait is shaped by transactions, not tables. Each mutating method is **one**
//! transaction whose first write is the idempotency identity row (statement 0, see
//! [`IdemRequest`]); the mutation and the complete rendered response commit together, or
//! nothing does.
//!
//! Invariants every implementation keeps (the conformance suite proves them on SQLite,
//! PostgreSQL and the simulation store alike):
//! 1. **The fence is strict.** A claim or post commits only if the presented token is
//!    strictly greater than `accounts.fence`; the fence then equals the token. An equal or
//!    lower token changes nothing (FR-15, C3 §3.4, C-10).
//! 2. **Only C2's transitions.** A claim moves PENDING→CLAIMED or CLAIMED→CLAIMED (recovery),
//!    or, when funds are short, to FAILED; a post moves RAIL_ACKED→POSTED. Conditional
//!    updates decide races; triggers refuse every other pair.
//! 3. **The ledger balances.** A CUSTOMER account's balance equals Σ CREDIT − Σ DEBIT of its
//!    entries, and across the ledger Σ DEBIT = Σ CREDIT (FR-25). Entries are append-only.
//! 4. **No overdraft.** balance − Σ amount of the account's unsettled payouts (CLAIMED,
//!    SUBMITTED, RAIL_ACKED, RAIL_AMBIGUOUS) never goes below zero.
//! 5. **Idempotency.** A live identity with the same fingerprint replays the stored status
//!    and bytes; with another fingerprint it is a conflict. Neither changes anything.
//!    Refusals (404, 409, 400) roll back, identity row included, so they are judged afresh.
//! 6. **A batch is one request, and a single write is a batch of one** (C3-extensions E-19,
//!    [`PaymentStore::claim`], [`PaymentStore::post`]): one identity row, the account's
//!    fence compared and raised once, then each payout by its single write's rule on what
//!    the payouts before it left. It commits iff a payout moved; a refused payout changes
//!    nothing, and a batch that moved none leaves nothing (no fence, no identity row).
//! 7. **Answers are rendered below the store** ([`crate::answer`], pure functions of the
//!    outcome and [`Answering`]): nothing above the store runs inside a transaction.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dlock_contract::payout::PayoutState;
use uuid::Uuid;

/// paydb's shared rows and the one store error, from `dlock-paydb` (the reconciler reads
/// the same records).
pub use dlock_paydb::pay::{
    funding_account, is_system_account, is_unsettled, settlement_account, snapshot_after_everything, AccountKind,
    AccountView, AmbiguousResolution, Direction, LedgerEntry, ListQuery, Operation, PayoutPosting, PayoutSummary,
    PayoutView, ResolutionRow, ResolveOutcome, StoredResponse, SubmissionSummary, RESOLUTION_RAIL_REFERENCE_CHARS_MAX,
    RESOLUTION_REASON_CHARS_MAX, RESOLUTION_REASON_CHARS_MIN,
};
pub use dlock_paydb::{ClassifiedStoreError, StoreError, StoreFault};

/// The idempotency identity and fingerprint of one mutating request.
///
/// Identity = (`operation`, `target_id`, `key`, `token`). The target is the payout id for
/// claim and post, `accounts` / `payouts` for the creates; the token is 0 for the unfenced
/// creates. A newer holder under the payout's stable key is therefore a new request, which
/// the fence judges (C3-extensions C-9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdemRequest {
    pub operation: Operation,
    pub target_id: String,
    pub key: String,
    pub token: i64,
    pub owner_id: String,
    /// Lower-case hex SHA-256 of the RFC 8785 form of the semantic request.
    pub fingerprint: String,
    pub at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// What the idempotency ledger decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Idempotent<T> {
    /// The request ran. `stored` is the recorded response when the outcome committed a
    /// mutation (then the caller must answer exactly these bytes); `None` for a refusal,
    /// which rolled back and recorded nothing.
    Executed { outcome: T, stored: Option<StoredResponse> },
    /// A live record with the same fingerprint: answer these bytes, nothing ran.
    Replayed(StoredResponse),
    /// A live record with another fingerprint: 422 `IDEMPOTENCY_CONFLICT`, nothing ran.
    Conflict,
}

/// How a committed outcome's answer is rendered (inside the transaction, by the pure
/// functions of [`crate::answer`], so that the recorded bytes and the first answer are one).
pub use crate::answer::{Answering, Shape};

/// The result of a mutating store call.
pub type Decided<T> = Result<Idempotent<T>, StoreError>;

/// `POST /v1/accounts`, validated, with the ids the store writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAccount {
    pub account_id: String,
    pub currency: String,
    pub opening_balance_minor: i64,
    /// Ids of the opening posting and its two entries (DEBIT funding, CREDIT the account);
    /// unused when the opening balance is 0.
    pub posting_id: Uuid,
    pub entry_ids: [Uuid; 2],
    pub at: DateTime<Utc>,
}

/// `POST /v1/payouts`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPayout {
    pub payout_id: Uuid,
    pub account_id: String,
    pub amount_minor: i64,
    pub currency: String,
    pub beneficiary_ref: String,
    pub at: DateTime<Utc>,
}

impl NewAccount {
    /// The opening posting at `at`: DEBIT `#funding:{CUR}`, CREDIT the account, or nothing
    /// for an opening balance of 0. Every store writes exactly these rows.
    pub fn opening_entries(&self, at: DateTime<Utc>) -> Vec<LedgerEntry> {
        if self.opening_balance_minor <= 0 {
            return Vec::new();
        }
        let entry = |entry_id, account_id, direction| LedgerEntry {
            entry_id,
            posting_id: self.posting_id,
            payout_id: None,
            account_id,
            direction,
            amount_minor: self.opening_balance_minor,
            currency: self.currency.clone(),
            fence: 0,
            created_at: at,
        };
        vec![
            entry(self.entry_ids[0], funding_account(&self.currency), Direction::Debit),
            entry(self.entry_ids[1], self.account_id.clone(), Direction::Credit),
        ]
    }
}

/// P2, validated: the claim of one payout, which the store runs as a batch of one
/// ([`Claim::batch_of_one`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub payout_id: Uuid,
    pub token: i64,
    pub owner_id: String,
    /// PENDING, or CLAIMED for a recovery re-claim.
    pub expected: PayoutState,
    pub at: DateTime<Utc>,
}

/// P3, validated, with the ids the store writes: the post of one payout, which the store
/// runs as a batch of one ([`Post::batch_of_one`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Post {
    pub payout_id: Uuid,
    pub token: i64,
    pub owner_id: String,
    pub submission_id: Uuid,
    pub rail_reference: String,
    /// Ids of the posting and its entries: `[DEBIT the account, CREDIT settlement]`.
    pub posting_id: Uuid,
    pub entry_ids: [Uuid; 2],
    pub at: DateTime<Utc>,
}

impl Claim {
    /// This claim as the batch of one the store runs: `account_id` is the payout's account
    /// (read for the grant check; a payout's account never changes).
    pub fn batch_of_one(&self, account_id: &str) -> ClaimBatch {
        ClaimBatch {
            account_id: account_id.to_owned(),
            token: self.token,
            owner_id: self.owner_id.clone(),
            payouts: vec![ClaimBatchPayout { payout_id: self.payout_id, expected: self.expected }],
            at: self.at,
        }
    }
}

impl Post {
    /// This post as the batch of one the store runs (`account_id` as [`Claim::batch_of_one`]).
    pub fn batch_of_one(&self, account_id: &str) -> PostBatch {
        PostBatch {
            account_id: account_id.to_owned(),
            token: self.token,
            owner_id: self.owner_id.clone(),
            payouts: vec![PostBatchPayout {
                payout_id: self.payout_id,
                submission_id: self.submission_id,
                rail_reference: self.rail_reference.clone(),
                posting_id: self.posting_id,
                entry_ids: self.entry_ids,
            }],
            at: self.at,
        }
    }

    /// The payout's posting at `at`: DEBIT the account, CREDIT `#settlement:{CUR}`, both
    /// carrying the presented token as their fence. Every store writes exactly these rows.
    pub fn entries(&self, account_id: &str, amount_minor: i64, currency: &str, at: DateTime<Utc>) -> [LedgerEntry; 2] {
        PayoutPosting {
            payout_id: self.payout_id,
            posting_id: self.posting_id,
            entry_ids: self.entry_ids,
            account_id,
            amount_minor,
            currency,
            fence: self.token,
            at,
        }
        .entries()
    }
}

/// One payout of a batch claim: the payout and its P2 body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimBatchPayout {
    pub payout_id: Uuid,
    /// PENDING, or CLAIMED for a recovery re-claim.
    pub expected: PayoutState,
}

/// P2b (C3-extensions E-19), validated: several payouts of one account under one token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimBatch {
    /// The account whose fence the batch passes once (the path's `accountId`).
    pub account_id: String,
    pub token: i64,
    pub owner_id: String,
    /// 1 to `BATCH_PAYOUTS_MAX` payouts, each once, in the request's order.
    pub payouts: Vec<ClaimBatchPayout>,
    pub at: DateTime<Utc>,
}

/// One payout of a batch post: the payout, its P3 body and the ids the store writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostBatchPayout {
    pub payout_id: Uuid,
    pub submission_id: Uuid,
    pub rail_reference: String,
    /// Ids of the posting and its entries: `[DEBIT the account, CREDIT settlement]`.
    pub posting_id: Uuid,
    pub entry_ids: [Uuid; 2],
}

/// P3b (C3-extensions E-19), validated, with the ids the store writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostBatch {
    pub account_id: String,
    pub token: i64,
    pub owner_id: String,
    /// 1 to `BATCH_PAYOUTS_MAX` payouts, each once, in the request's order.
    pub payouts: Vec<PostBatchPayout>,
    pub at: DateTime<Utc>,
}

impl PostBatch {
    /// The single post of one of its payouts: what P3 would have carried for it.
    pub fn post(&self, p: &PostBatchPayout) -> Post {
        Post {
            payout_id: p.payout_id,
            token: self.token,
            owner_id: self.owner_id.clone(),
            submission_id: p.submission_id,
            rail_reference: p.rail_reference.clone(),
            posting_id: p.posting_id,
            entry_ids: p.entry_ids,
            at: self.at,
        }
    }
}

/// What a claim decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// Committed: the payout is CLAIMED, the fence equals the token. `amount_minor`,
    /// `currency` and `beneficiary_ref` are the payout's (immutable) terms, read by the
    /// claim's own reservation read: the answer carries what a submission needs
    /// (C3-extensions C-30), so the worker does not read the payout again.
    Claimed {
        account_id: String,
        account_fence: i64,
        attempt_count: i32,
        reclaimed: bool,
        amount_minor: i64,
        currency: String,
        beneficiary_ref: String,
    },
    /// Committed: the fence was raised and the payout is FAILED (422, recorded).
    InsufficientFunds {
        account_id: String,
        amount_minor: i64,
        available_minor: i64,
    },
    /// Rolled back: the token did not exceed the account's fence.
    Fenced {
        account_id: String,
        highest_token: i64,
    },
    /// Rolled back: the payout is not in the expected state.
    NotClaimable {
        state: PayoutState,
    },
    NotFound,
}

/// What a claim's read saw of its payout: the terms its answer carries and the attempt
/// count its transition requires unchanged.
#[derive(Debug, Clone, Copy)]
pub struct ClaimSeen<'a> {
    pub amount_minor: i64,
    pub currency: &'a str,
    pub beneficiary_ref: &'a str,
    pub attempt_count: i32,
}

impl ClaimOutcome {
    /// The outcome of the claim rule's `decision` (P2, or one payout of P2b) for a payout of
    /// `account_id` claimed under `token`, as its read saw it: every store builds it here.
    pub fn decided(decision: &crate::rules::ClaimDecision, account_id: &str, token: i64, read: ClaimSeen<'_>) -> Self {
        use crate::rules::ClaimDecision;
        match *decision {
            ClaimDecision::NotClaimable { state } => ClaimOutcome::NotClaimable { state },
            ClaimDecision::Claimed { reclaimed } => ClaimOutcome::Claimed {
                account_id: account_id.to_owned(),
                account_fence: token,
                attempt_count: read.attempt_count,
                reclaimed,
                amount_minor: read.amount_minor,
                currency: read.currency.to_owned(),
                beneficiary_ref: read.beneficiary_ref.to_owned(),
            },
            ClaimDecision::InsufficientFunds { available_minor } => ClaimOutcome::InsufficientFunds {
                account_id: account_id.to_owned(),
                amount_minor: read.amount_minor,
                available_minor,
            },
        }
    }
}

/// What a post decided. (One value per request, moved once: the size of `Posted` is not
/// worth a heap allocation.)
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostOutcome {
    /// Committed: the payout is POSTED with two balanced entries.
    Posted {
        account_id: String,
        entries: [LedgerEntry; 2],
        balance_minor: i64,
    },
    /// Rolled back: the token did not exceed the account's fence.
    Fenced {
        account_id: String,
        highest_token: i64,
    },
    /// Rolled back: the payout is not RAIL_ACKED.
    NotClaimable {
        state: PayoutState,
    },
    /// Rolled back: no ACKED attempt of this payout has this submission id and reference.
    RailMismatch,
    NotFound,
}

/// One payout's outcome within a batch: whether it moved the payout (the batch commits
/// iff one did).
pub trait BatchItemOutcome: Sized {
    fn moved(&self) -> bool;
    /// The single write's outcome when the fence of `account_id` refused the batch.
    fn fenced(account_id: &str, highest_token: i64) -> Self;
    /// The single write's outcome for a payout that does not exist.
    fn not_found() -> Self;
}

impl BatchItemOutcome for ClaimOutcome {
    /// Claimed, or failed for funds (both commit).
    fn moved(&self) -> bool {
        matches!(self, ClaimOutcome::Claimed { .. } | ClaimOutcome::InsufficientFunds { .. })
    }

    fn fenced(account_id: &str, highest_token: i64) -> Self {
        ClaimOutcome::Fenced { account_id: account_id.to_owned(), highest_token }
    }

    fn not_found() -> Self {
        ClaimOutcome::NotFound
    }
}

impl BatchItemOutcome for PostOutcome {
    fn moved(&self) -> bool {
        matches!(self, PostOutcome::Posted { .. })
    }

    fn fenced(account_id: &str, highest_token: i64) -> Self {
        PostOutcome::Fenced { account_id: account_id.to_owned(), highest_token }
    }

    fn not_found() -> Self {
        PostOutcome::NotFound
    }
}

/// What a batch decided (P2b: [`ClaimBatchOutcome`], P3b: [`PostBatchOutcome`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOutcome<T> {
    /// The fence passed: one outcome per payout, in the request's order, each what the
    /// single write would have decided (a claim's `Claimed`, `InsufficientFunds`,
    /// `NotClaimable` or `NotFound`; a post's `Posted`, `NotClaimable`, `RailMismatch` or
    /// `NotFound`: no such payout, or one of another account; never `Fenced`). Committed and
    /// recorded iff at least one payout moved ([`BatchOutcome::moved`]); else everything
    /// rolled back, the fence and the identity row included.
    Decided { items: Vec<(Uuid, T)> },
    /// Rolled back: the token did not exceed the account's fence. Nothing was written.
    Fenced { highest_token: i64 },
    /// Rolled back: no such CUSTOMER account. Nothing was written.
    AccountNotFound,
}

/// What a batch claim decided (P2b).
pub type ClaimBatchOutcome = BatchOutcome<ClaimOutcome>;
/// What a batch post decided (P3b).
pub type PostBatchOutcome = BatchOutcome<PostOutcome>;

impl<T: BatchItemOutcome> BatchOutcome<T> {
    /// How many payouts the batch moved.
    pub fn moved(&self) -> usize {
        match self {
            BatchOutcome::Decided { items } => items.iter().filter(|(_, o)| o.moved()).count(),
            _ => 0,
        }
    }

    /// Whether the batch moved `payout_id`.
    pub fn moved_payout(&self, payout_id: Uuid) -> bool {
        match self {
            BatchOutcome::Decided { items } => items.iter().any(|(p, o)| *p == payout_id && o.moved()),
            _ => false,
        }
    }

    /// The stored fence that refused the batch, if the fence did.
    pub fn fenced_by(&self) -> Option<i64> {
        match self {
            BatchOutcome::Fenced { highest_token } => Some(*highest_token),
            _ => None,
        }
    }

    /// Each payout's outcome, when the fence passed (empty otherwise).
    pub fn items(&self) -> &[(Uuid, T)] {
        match self {
            BatchOutcome::Decided { items } => items,
            _ => &[],
        }
    }

    /// A batch of one (a single write) as the single write's outcome: its one item, or
    /// `Fenced` by `account_id`'s fence; an unknown account is an unknown payout.
    pub fn into_single(self, account_id: &str) -> T {
        match self {
            BatchOutcome::Decided { mut items } => {
                assert!(items.len() == 1, "a single write decided {} payouts", items.len());
                items.pop().map_or_else(T::not_found, |(_, item)| item)
            }
            BatchOutcome::Fenced { highest_token } => T::fenced(account_id, highest_token),
            BatchOutcome::AccountNotFound => T::not_found(),
        }
    }
}

impl<T> Idempotent<T> {
    /// The same decision over `f` of its outcome.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Idempotent<U> {
        match self {
            Idempotent::Executed { outcome, stored } => Idempotent::Executed { outcome: f(outcome), stored },
            Idempotent::Replayed(r) => Idempotent::Replayed(r),
            Idempotent::Conflict => Idempotent::Conflict,
        }
    }
}

/// What an account creation decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateAccountOutcome {
    Created(AccountView),
    /// Rolled back: the account id is taken.
    Exists,
}

/// What a payout creation decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreatePayoutOutcome {
    Created(PayoutView),
    /// Rolled back: the payout id is taken.
    PayoutExists,
    /// Rolled back: no such CUSTOMER account.
    UnknownAccount,
    /// Rolled back: the account holds another currency.
    CurrencyMismatch {
        account_currency: String,
    },
}

/// What an operator's abandon decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AbandonOutcome {
    Abandoned,
    /// Only PENDING and CLAIMED payouts can be abandoned (C2).
    NotAbandonable {
        state: PayoutState,
    },
    NotFound,
}

/// paydb, as the payment-resource sees it.
#[async_trait]
pub trait PaymentStore: Send + Sync + 'static {
    /// Cheap round trip, for readiness.
    async fn ping(&self) -> Result<(), StoreError>;

    /// The deployment's P1 cursor key: stores `candidate` if no key exists yet, and returns
    /// the stored one (all replicas share it; it survives restarts).
    async fn cursor_secret(&self, candidate: [u8; 32], at: DateTime<Utc>) -> Result<[u8; 32], StoreError>;

    /// Creates a CUSTOMER account and posts its opening balance against `#funding:{CUR}`
    /// (upserting the currency's system accounts). The committed answer is
    /// [`crate::answer::account_created`] under `a`'s trace id.
    async fn create_account(&self, n: &NewAccount, i: &IdemRequest, a: &Answering) -> Decided<CreateAccountOutcome>;

    /// Creates a PENDING payout; the committed answer is [`crate::answer::payout_created`].
    async fn create_payout(&self, p: &NewPayout, i: &IdemRequest, a: &Answering) -> Decided<CreatePayoutOutcome>;

    /// P2 and P2b, the fenced claim (C3 §3.4; C3-extensions E-19), one transaction: a single
    /// claim is the batch of one of its payout's account ([`Claim::batch_of_one`]), and `a`'s
    /// shape decides only the answer ([`crate::answer::claim`]). Statement 0 is the
    /// request's identity row (`i`: operation `Claim`; target the payout for a single claim,
    /// `dlock_contract::batch::batch_target(account)` for a batch): a live record replays
    /// or conflicts. Then the account's strict fence, once: `fence < token` on the CUSTOMER
    /// account `b.account_id`, raised to the token; refused, everything rolls back
    /// ([`ClaimBatchOutcome::Fenced`], or [`ClaimBatchOutcome::AccountNotFound`]). Then each
    /// payout in the request's order: not found or of another account, `NotFound`; else
    /// the claim rule ([`crate::rules::decide_claim_batch`]: [`crate::rules::decide_claim`]
    /// with the reservation the payouts before it left) and its conditional transition (the
    /// state and attempt count read). A refused payout changes nothing. The transaction
    /// commits iff at least one payout moved, with the answer recorded in the identity row;
    /// else it rolls back and nothing is recorded. A payout that moved between the read and
    /// its transition (the proxy or an operator, who do not take the account's row lock)
    /// makes the request `StoreError::Unavailable`: nothing was written.
    async fn claim(&self, b: &ClaimBatch, i: &IdemRequest, a: &Answering) -> Decided<ClaimBatchOutcome>;

    /// P3 and P3b, the fenced post, one transaction, as [`PaymentStore::claim`] (operation
    /// `Post`; a single post is [`Post::batch_of_one`]): the identity row, the account's
    /// strict fence once, then each payout in the request's order by the post rule
    /// ([`crate::rules::decide_post_batch`]: on the balance the posts before it left):
    /// RAIL_ACKED → POSTED with the named ACKED attempt (I7), two balanced entries carrying
    /// the token, and the debit. Commits iff at least one payout was posted; the answer is
    /// [`crate::answer::post`].
    async fn post(&self, b: &PostBatch, i: &IdemRequest, a: &Answering) -> Decided<PostBatchOutcome>;

    /// An operator moves a PENDING or CLAIMED payout to ABANDONED.
    async fn abandon(&self, payout_id: Uuid, at: DateTime<Utc>) -> Result<AbandonOutcome, StoreError>;

    /// `dlock resolve` (and, recorded, [`PaymentStore::resolve_recorded`]): one transaction that moves a RAIL_AMBIGUOUS payout to POSTED (two
    /// balanced entries with fence 0, and the balance debited) or FAILED (the reservation is
    /// released), and writes its `payout_resolutions` audit row. Any other state is refused
    /// and changes nothing. The account's fence is left alone: an operator holds no token.
    async fn resolve_ambiguous(&self, r: &AmbiguousResolution) -> Result<ResolveOutcome, StoreError>;

    /// `POST /v1/payouts/{payoutId}/resolution` (C3-extensions E-21): the resolution of
    /// [`PaymentStore::resolve_ambiguous`] as one deciding transaction whose statement 0 is
    /// the request's identity row (`i`: operation `Resolve`, target the payout, token 0): a
    /// live record replays or conflicts and nothing runs. A resolution that commits records
    /// its answer ([`crate::answer::resolved`]) in the identity row; a refusal (no such
    /// payout, not RAIL_AMBIGUOUS) rolls back, identity row included, so it is judged afresh.
    async fn resolve_recorded(
        &self,
        r: &AmbiguousResolution,
        i: &IdemRequest,
        a: &Answering,
    ) -> Decided<ResolveOutcome>;

    /// The resolutions audit trail, all or one payout's, in (`resolved_at`,
    /// `resolution_id`) order.
    async fn resolutions(&self, payout_id: Option<Uuid>) -> Result<Vec<ResolutionRow>, StoreError>;

    /// P4 (advisory).
    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutView>, StoreError>;

    /// The payout's account (`None`: no such payout), for the grant check of a fenced write.
    /// A payout's account never changes once created (the `payouts_guard` triggers), so the
    /// answer read outside the write's transaction cannot go stale. SQL stores read the one
    /// column; the default reads the whole payout.
    async fn payout_account(&self, payout_id: Uuid) -> Result<Option<String>, StoreError> {
        Ok(self.payout(payout_id).await?.map(|p| p.account_id))
    }

    /// P5 (advisory), system accounts included.
    async fn account(&self, account_id: &str) -> Result<Option<AccountView>, StoreError>;

    /// Every account, system accounts included, in `account_id` order.
    async fn accounts(&self) -> Result<Vec<AccountView>, StoreError>;

    /// P1: at most `q.limit` rows.
    async fn list(&self, q: &ListQuery) -> Result<Vec<PayoutSummary>, StoreError>;

    /// Ledger entries, all or one account's, in (`created_at`, `entry_id`) order.
    async fn ledger(&self, account_id: Option<&str>) -> Result<Vec<LedgerEntry>, StoreError>;

    /// `created_at` of the oldest PENDING payout (`payout_backlog_age_seconds`).
    async fn oldest_pending_created_at(&self) -> Result<Option<DateTime<Utc>>, StoreError>;

    /// Deletes at most `batch_max` idempotency records expired at `now`; returns how many.
    async fn purge_idempotency(&self, now: DateTime<Utc>, batch_max: i64) -> Result<u64, StoreError>;

    /// How many idempotency records exist (live or expired, tests and metrics).
    async fn idempotency_record_count(&self) -> Result<u64, StoreError>;

    /// The event outbox (C3-extensions E-20): the final events after `after`, at most `limit`
    /// ([`dlock_paydb::events::EventRead`]).
    async fn read_events(&self, after: i64, limit: usize) -> Result<dlock_paydb::events::EventRead, StoreError>;

    /// [`PaymentStore::read_events`] below `upto`, every seq at or below which the caller
    /// already knows final (an event hub read it so): a store whose reads wait on holes
    /// (PostgreSQL) reads the range without waiting. The default is `read_events`.
    async fn read_final_events(
        &self,
        after: i64,
        upto: i64,
        limit: usize,
    ) -> Result<dlock_paydb::events::EventRead, StoreError> {
        Ok(self.read_events(after, limit).await?.clipped(after, upto, limit))
    }

    /// The retention purge: keeps the newest `keep` events; returns how many it deleted.
    async fn purge_events(&self, keep: i64) -> Result<u64, StoreError>;

    /// The SQL pool's connections now, for `dlock_db_pool_connections` (`None`: no pool).
    fn pool_stats(&self) -> Option<dlock_http::metrics::PoolStats> {
        None
    }

    /// The thread this store's write transactions run on (`dlock_rt::dedicated`; SQLite's
    /// one writer connection, docs/performance.md "The SQLite writer thread"), `None`: on
    /// the caller's task.
    fn writer_thread(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        None
    }
}

/// A single claim or post (P2, P3) as the fenced-write pipeline runs it: the batch of one
/// of its payout's account, its outcome the one item's; an unknown payout is `NotFound`
/// and reaches no transaction. For tools and tests that drive a store without HTTP.
#[async_trait]
pub trait SingleWrites {
    async fn claim_one(&self, c: &Claim, i: &IdemRequest, a: &Answering) -> Decided<ClaimOutcome>;
    async fn post_one(&self, p: &Post, i: &IdemRequest, a: &Answering) -> Decided<PostOutcome>;
}

#[async_trait]
impl<S: PaymentStore + ?Sized> SingleWrites for S {
    async fn claim_one(&self, c: &Claim, i: &IdemRequest, a: &Answering) -> Decided<ClaimOutcome> {
        let Some(account) = self.payout_account(c.payout_id).await? else {
            return Ok(Idempotent::Executed { outcome: ClaimOutcome::NotFound, stored: None });
        };
        let decided = self.claim(&c.batch_of_one(&account), i, a).await?;
        Ok(decided.map(|o| o.into_single(&account)))
    }

    async fn post_one(&self, p: &Post, i: &IdemRequest, a: &Answering) -> Decided<PostOutcome> {
        let Some(account) = self.payout_account(p.payout_id).await? else {
            return Ok(Idempotent::Executed { outcome: PostOutcome::NotFound, stored: None });
        };
        let decided = self.post(&p.batch_of_one(&account), i, a).await?;
        Ok(decided.map(|o| o.into_single(&account)))
    }
}
