//! The simulation store: all of paydb in memory, with the same semantics as SQL.
//!
//! [`MemPaydb`] stands in for the *database*, not for a service's memory. It holds every
//! paydb table behind one mutex and implements both [`PaymentStore`] and the proxy's
//! [`RailStore`], so in the simulation the payment-resource and the rail-proxy share one
//! paydb exactly as their SQL stores share one database. It outlives every simulated node
//! it serves, and neither service caches from it.
//!
//! Each method takes the one mutex for its whole body, which is what a serialisable
//! transaction looks like from outside. A method validates everything and renders the
//! response before its first write, so a refusal has nothing to undo. The helpers
//! [`guard_transition`] and the fence comparisons mirror the SQL triggers and CHECKs (a write
//! they refuse is [`StoreError::Corrupt`], as a trigger error is). The conformance suite
//! holds it to the SQL stores.
//!
//! **Observer** (simulation only in practice): [`MemPaydb::set_observer`] registers one
//! [`PaydbObserver`], called after every fenced write (claim, post, admission) *inside* the
//! transaction, under the one mutex, with the tables as that write left them. The
//! simulation's oracle uses it to check fence monotonicity at each acceptance, in
//! acceptance order. Unset (the default) it costs one uncontended `Option` read per fenced
//! write; it never changes what a write does.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dlock_contract::payout::{self, Actor, PayoutState};

use crate::rules::{self, ClaimDecision, ClaimFacts, FenceVerdict, PostDecision, PostFacts};
use dlock_contract::rail::SubmissionOutcome;
use dlock_rail_proxy::store as rail;
use dlock_rail_proxy::store::RailStore;
use dlock_rail_proxy::store_mem::{RailTables, StoredPayout};
use uuid::Uuid;

use crate::store::{
    funding_account, is_system_account, is_unsettled, settlement_account, AbandonOutcome, AccountKind, AccountView,
    AmbiguousResolution, Claim, ClaimOutcome, CreateAccountOutcome, CreatePayoutOutcome, Decided, Direction,
    IdemRequest, Idempotent, LedgerEntry, ListQuery, NewAccount, NewPayout, Operation, PaymentStore, PayoutSummary,
    PayoutView, Post, PostOutcome, Render, ResolutionRow, ResolveOutcome, StoreError, StoredResponse,
    SubmissionSummary, RESOLUTION_REASON_CHARS_MIN,
};

/// One `accounts` row (the key is its `account_id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAccount {
    pub kind: AccountKind,
    pub currency: String,
    pub balance_minor: i64,
    /// 0 = never fenced.
    pub fence: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// One `idempotency_records` row (the key is its identity). In memory a record never
/// lacks its response: it is inserted together with the mutation it records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub request_sha256: String,
    pub owner_id: String,
    pub response: StoredResponse,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// The idempotency identity: (operation, target, key, token).
pub type Identity = (Operation, String, String, i64);

/// Every paydb table. Public so that the simulation's invariant checkers can read the
/// database itself, never the services' answers.
#[derive(Debug, Default)]
pub struct PaydbTables {
    /// `payouts`, `rail_high_water` and `rail_submission`, with the proxy's own code.
    pub rail: RailTables,
    pub accounts: BTreeMap<String, StoredAccount>,
    /// `ledger_entries`, append-only, in insertion order.
    pub ledger: Vec<LedgerEntry>,
    pub idempotency: BTreeMap<Identity, StoredRecord>,
    /// `paydb_secrets` row `p1-cursor`.
    pub cursor_secret: Option<[u8; 32]>,
    /// `payout_resolutions`, append-only, in insertion order.
    pub resolutions: Vec<ResolutionRow>,
}

/// Which fenced write paydb decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FencedOp {
    /// P2, at the account fence (`accounts.fence`).
    Claim,
    /// P3, at the ledger (the same `accounts.fence`).
    Post,
    /// The proxy's steps 1–3, at the rail's high-water mark (`rail_high_water`).
    Admit,
}

/// What the fence made of a fenced write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceVerdictSeen {
    /// The fence (or mark) passed and now equals the token: the write was accepted.
    Accepted,
    /// The fence refused the token.
    FencedOut { highest_token: i64 },
    /// No fence decision was applied: a replay, a conflict, a missing payout, a state
    /// refusal (which rolls the fence back), or a store error.
    Other,
}

/// One fenced write as paydb decided it, reported to the [`PaydbObserver`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedWrite {
    pub op: FencedOp,
    pub payout_id: Uuid,
    /// The payout's account (empty when the payout does not exist).
    pub account_id: String,
    pub token: i64,
    pub owner_id: String,
    /// The resource compared the token (false only for an admission with
    /// `rail.proxy.fencing.enabled = false`: then `Accepted` means the proxy took a token it
    /// never compared).
    pub fenced: bool,
    /// The payout's state before the write (`None`: no such payout).
    pub state_before: Option<PayoutState>,
    pub verdict: FenceVerdictSeen,
    /// The idempotency identity (claim and post).
    pub identity: Option<Identity>,
    /// The response this write recorded (a committed claim or post).
    pub recorded: Option<StoredResponse>,
    /// The recorded response a replay answered.
    pub replayed: Option<StoredResponse>,
    /// The proxy's admission, rendered (`admitted`, `fenced`, `duplicate`, `not_claimable`).
    pub admission: Option<&'static str>,
}

/// Sees every fenced write inside its transaction (see the module doc).
pub trait PaydbObserver: Send + Sync {
    fn fenced_write(&self, tables: &PaydbTables, write: &FencedWrite);
}

#[derive(Default)]
struct ObserverSlot(std::sync::RwLock<Option<std::sync::Arc<dyn PaydbObserver>>>);

impl std::fmt::Debug for ObserverSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self.0.read().map(|o| o.is_some()).unwrap_or(false);
        f.debug_struct("ObserverSlot").field("set", &set).finish()
    }
}

/// In-memory paydb, shared by the payment-resource and the rail-proxy.
#[derive(Debug, Default)]
pub struct MemPaydb {
    tables: Mutex<PaydbTables>,
    observer: ObserverSlot,
}

fn verdict_of<T>(
    d: &Decided<T>,
    accepted: impl Fn(&T) -> bool,
    fenced: impl Fn(&T) -> Option<i64>,
) -> (FenceVerdictSeen, Option<StoredResponse>, Option<StoredResponse>) {
    match d {
        Ok(Idempotent::Executed { outcome, stored }) => {
            let v = if accepted(outcome) {
                FenceVerdictSeen::Accepted
            } else if let Some(highest_token) = fenced(outcome) {
                FenceVerdictSeen::FencedOut { highest_token }
            } else {
                FenceVerdictSeen::Other
            };
            (v, stored.clone(), None)
        }
        Ok(Idempotent::Replayed(r)) => (FenceVerdictSeen::Other, None, Some(r.clone())),
        _ => (FenceVerdictSeen::Other, None, None),
    }
}

const POISONED: &str = "simulation store poisoned";

impl MemPaydb {
    pub fn new() -> MemPaydb {
        MemPaydb::default()
    }

    fn lock(&self) -> Result<MutexGuard<'_, PaydbTables>, StoreError> {
        self.tables.lock().map_err(|_| StoreError::Corrupt(POISONED.into()))
    }

    fn lock_rail(&self) -> Result<MutexGuard<'_, PaydbTables>, rail::StoreError> {
        self.tables.lock().map_err(|_| rail::StoreError::Corrupt(POISONED.into()))
    }

    /// Registers the one observer of fenced writes (replacing any earlier one).
    pub fn set_observer(&self, observer: std::sync::Arc<dyn PaydbObserver>) {
        if let Ok(mut slot) = self.observer.0.write() {
            *slot = Some(observer);
        }
    }

    fn observer(&self) -> Option<std::sync::Arc<dyn PaydbObserver>> {
        self.observer.0.read().ok().and_then(|o| o.clone())
    }

    /// Runs `f` over the tables as one transaction: the simulation's invariant checkers read
    /// through it, and tests use it for what an operator would do by hand-run SQL. Writes
    /// made here bypass every guard.
    pub fn with_tables<R>(&self, f: impl FnOnce(&mut PaydbTables) -> R) -> Result<R, StoreError> {
        Ok(f(&mut *self.lock()?))
    }
}

/// The state trigger (D2): C2's pairs only ([`payout::may_write_state`]); a same-state
/// write passes.
pub fn guard_transition(from: PayoutState, to: PayoutState) -> Result<(), StoreError> {
    if payout::may_write_state(from, to) {
        Ok(())
    } else {
        Err(StoreError::Corrupt(format!("payouts: transition {}>{} not in C2", from.as_str(), to.as_str())))
    }
}

/// The identity of a request.
fn identity(i: &IdemRequest) -> Identity {
    (i.operation, i.target_id.clone(), i.key.clone(), i.token)
}

/// Statement 0's decision: a live record replays or conflicts, anything else executes.
fn live_record<T>(t: &PaydbTables, i: &IdemRequest) -> Option<Idempotent<T>> {
    let rec = t.idempotency.get(&identity(i))?;
    if rec.expires_at <= i.at {
        return None; // expired: judged afresh, and replaced if this request commits
    }
    if rec.request_sha256 == i.fingerprint {
        Some(Idempotent::Replayed(rec.response.clone()))
    } else {
        Some(Idempotent::Conflict)
    }
}

/// Records a committed outcome's response under the request's identity (replacing an
/// expired record).
fn record(t: &mut PaydbTables, i: &IdemRequest, response: &StoredResponse) {
    t.idempotency.insert(
        identity(i),
        StoredRecord {
            request_sha256: i.fingerprint.clone(),
            owner_id: i.owner_id.clone(),
            response: response.clone(),
            created_at: i.at,
            expires_at: i.expires_at,
        },
    );
}

/// The idempotency record's own CHECKs.
fn check_identity(i: &IdemRequest) -> Result<(), StoreError> {
    if i.token < 0 {
        return Err(StoreError::Corrupt("idempotency_records: fencing_token < 0".into()));
    }
    if i.fingerprint.chars().count() != 64 {
        return Err(StoreError::Corrupt("idempotency_records: request_sha256 is not 64 chars".into()));
    }
    Ok(())
}

fn check_currency(currency: &str) -> Result<(), StoreError> {
    if currency.chars().count() == 3 {
        Ok(())
    } else {
        Err(StoreError::Corrupt(format!("currency {currency:?} is not 3 characters")))
    }
}

/// Σ amount of `account_id`'s unsettled payouts, other than `except`.
fn reserved_minor(t: &PaydbTables, account_id: &str, except: Option<Uuid>) -> i128 {
    t.rail
        .payouts
        .values()
        .filter(|p| p.row.account_id == account_id && Some(p.row.payout_id) != except && is_unsettled(p.row.state))
        .map(|p| i128::from(p.row.amount_minor))
        .sum()
}

/// Σ CREDIT − Σ DEBIT over `account_id`'s entries.
fn ledger_sum_minor(t: &PaydbTables, account_id: &str) -> i128 {
    t.ledger
        .iter()
        .filter(|e| e.account_id == account_id)
        .map(|e| match e.direction {
            Direction::Credit => i128::from(e.amount_minor),
            Direction::Debit => -i128::from(e.amount_minor),
        })
        .sum()
}

/// A sum as the BIGINT SQL computes (`CAST(… AS BIGINT)` fails on overflow).
fn bigint(v: i128) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Corrupt(format!("sum {v} overflows BIGINT")))
}

fn account_view(t: &PaydbTables, account_id: &str, a: &StoredAccount) -> Result<AccountView, StoreError> {
    Ok(AccountView {
        account_id: account_id.to_owned(),
        kind: a.kind,
        currency: a.currency.clone(),
        balance_minor: a.balance_minor,
        fence: a.fence,
        ledger_sum_minor: bigint(ledger_sum_minor(t, account_id))?,
        reserved_minor: bigint(reserved_minor(t, account_id, None))?,
        created_at: a.created_at,
        updated_at: a.updated_at,
    })
}

fn payout_view(t: &PaydbTables, p: &StoredPayout) -> PayoutView {
    let submissions = t
        .rail
        .submissions
        .iter()
        .filter(|s| s.payout_id == p.row.payout_id)
        .map(|s| SubmissionSummary {
            submission_id: s.submission_id,
            presented_token: s.presented_token,
            outcome: s.outcome,
            rail_reference: s.rail_reference.clone(),
            submitted_at: s.submitted_at,
            resolved_at: s.resolved_at,
        })
        .collect();
    PayoutView {
        payout_id: p.row.payout_id,
        account_id: p.row.account_id.clone(),
        amount_minor: p.row.amount_minor,
        currency: p.row.currency.clone(),
        beneficiary_ref: p.row.beneficiary_ref.clone(),
        state: p.row.state,
        attempt_count: p.row.attempt_count,
        claim_token: p.claim_token,
        claimed_by: p.claimed_by.clone(),
        claimed_at: p.claimed_at,
        created_at: p.created_at,
        updated_at: p.updated_at,
        submissions,
    }
}

fn system_account(kind: AccountKind, currency: &str, at: DateTime<Utc>) -> StoredAccount {
    StoredAccount { kind, currency: currency.to_owned(), balance_minor: 0, fence: 0, created_at: at, updated_at: at }
}

/// Upserts (`ON CONFLICT DO NOTHING`) the currency's two system accounts.
fn upsert_system_accounts(t: &mut PaydbTables, currency: &str, at: DateTime<Utc>) {
    t.accounts.entry(funding_account(currency)).or_insert_with(|| system_account(AccountKind::Funding, currency, at));
    t.accounts
        .entry(settlement_account(currency))
        .or_insert_with(|| system_account(AccountKind::Settlement, currency, at));
}

/// The fence statement's verdict: `Ok(account_id)` when `token` may pass, else the
/// outcome's `Fenced` fields, or `None` when the payout does not exist.
enum Fence {
    Passes { account_id: String },
    Fenced { account_id: String, highest_token: i64 },
    NotFound,
}

fn fence_check(t: &PaydbTables, payout_id: Uuid, token: i64) -> Result<Fence, StoreError> {
    let Some(p) = t.rail.payouts.get(&payout_id) else {
        return Ok(Fence::NotFound);
    };
    let account_id = p.row.account_id.clone();
    let Some(a) = t.accounts.get(&account_id) else {
        return Err(StoreError::Corrupt(format!("payout {payout_id} references missing account {account_id:?}")));
    };
    match rules::fence_check(a.fence, token) {
        FenceVerdict::Passes => Ok(Fence::Passes { account_id }),
        FenceVerdict::Fenced { highest_token } => Ok(Fence::Fenced { account_id, highest_token }),
    }
}

/// Raises `account_id`'s fence to `token` (the caller has checked `fence < token`).
fn raise_fence(t: &mut PaydbTables, account_id: &str, token: i64, at: DateTime<Utc>) -> Result<(), StoreError> {
    let Some(a) = t.accounts.get_mut(account_id) else {
        return Err(StoreError::Corrupt(format!("account {account_id:?} vanished")));
    };
    if rules::fence_check(a.fence, token) != FenceVerdict::Passes {
        return Err(StoreError::Corrupt(format!("accounts: fence of {account_id:?} may only rise")));
    }
    a.fence = rules::raise_fence(a.fence, token);
    a.updated_at = at;
    Ok(())
}

impl MemPaydb {
    fn do_create_account(
        t: &mut PaydbTables,
        a: &NewAccount,
        i: &IdemRequest,
        r: Render<'_, CreateAccountOutcome>,
    ) -> Decided<CreateAccountOutcome> {
        check_identity(i)?;
        if let Some(replay) = live_record(t, i) {
            return Ok(replay);
        }
        if t.accounts.contains_key(&a.account_id) {
            return Ok(Idempotent::Executed { outcome: CreateAccountOutcome::Exists, stored: None });
        }
        // The CHECKs a bad row would hit.
        if is_system_account(&a.account_id) {
            return Err(StoreError::Corrupt(format!("accounts: {:?} is not a CUSTOMER id", a.account_id)));
        }
        check_currency(&a.currency)?;
        if a.opening_balance_minor < 0 {
            return Err(StoreError::Corrupt("accounts: balance_minor < 0".into()));
        }
        let opening = a.opening_balance_minor;
        let entries = a.opening_entries(a.at);
        let view = AccountView {
            account_id: a.account_id.clone(),
            kind: AccountKind::Customer,
            currency: a.currency.clone(),
            balance_minor: opening,
            fence: 0,
            ledger_sum_minor: opening,
            reserved_minor: 0,
            created_at: a.at,
            updated_at: a.at,
        };
        let outcome = CreateAccountOutcome::Created(view);
        let response = r(&outcome);
        // Writes, in statement order; nothing below can fail.
        record(t, i, &response);
        upsert_system_accounts(t, &a.currency, a.at);
        t.accounts.insert(
            a.account_id.clone(),
            StoredAccount {
                kind: AccountKind::Customer,
                currency: a.currency.clone(),
                balance_minor: opening,
                fence: 0,
                created_at: a.at,
                updated_at: a.at,
            },
        );
        t.ledger.extend(entries);
        Ok(Idempotent::Executed { outcome, stored: Some(response) })
    }

    fn do_create_payout(
        t: &mut PaydbTables,
        p: &NewPayout,
        i: &IdemRequest,
        r: Render<'_, CreatePayoutOutcome>,
    ) -> Decided<CreatePayoutOutcome> {
        check_identity(i)?;
        if let Some(replay) = live_record(t, i) {
            return Ok(replay);
        }
        let refused = |outcome| Ok(Idempotent::Executed { outcome, stored: None });
        let account = match t.accounts.get(&p.account_id) {
            Some(a) if a.kind == AccountKind::Customer => a,
            _ => return refused(CreatePayoutOutcome::UnknownAccount),
        };
        if account.currency != p.currency {
            return refused(CreatePayoutOutcome::CurrencyMismatch { account_currency: account.currency.clone() });
        }
        if t.rail.payouts.contains_key(&p.payout_id) {
            return refused(CreatePayoutOutcome::PayoutExists);
        }
        if p.amount_minor <= 0 {
            return Err(StoreError::Corrupt("payouts: amount_minor <= 0".into()));
        }
        let stored = StoredPayout {
            row: rail::PayoutRow {
                payout_id: p.payout_id,
                account_id: p.account_id.clone(),
                amount_minor: p.amount_minor,
                currency: p.currency.clone(),
                beneficiary_ref: p.beneficiary_ref.clone(),
                state: PayoutState::Pending,
                attempt_count: 0,
            },
            created_at: p.at,
            updated_at: p.at,
            claim_token: None,
            claimed_by: None,
            claimed_at: None,
        };
        let outcome = CreatePayoutOutcome::Created(payout_view(t, &stored));
        let response = r(&outcome);
        record(t, i, &response);
        t.rail.payouts.insert(p.payout_id, stored);
        Ok(Idempotent::Executed { outcome, stored: Some(response) })
    }

    fn do_claim(t: &mut PaydbTables, c: &Claim, i: &IdemRequest, r: Render<'_, ClaimOutcome>) -> Decided<ClaimOutcome> {
        check_identity(i)?;
        if let Some(replay) = live_record(t, i) {
            return Ok(replay);
        }
        let refused = |outcome| Ok(Idempotent::Executed { outcome, stored: None });
        // 1. The fence.
        let account_id = match fence_check(t, c.payout_id, c.token)? {
            Fence::NotFound => return refused(ClaimOutcome::NotFound),
            Fence::Fenced { account_id, highest_token } => {
                return refused(ClaimOutcome::Fenced { account_id, highest_token })
            }
            Fence::Passes { account_id } => account_id,
        };
        // 2. The state (a refusal rolls the fence back: it never moved).
        let Some(p) = t.rail.payouts.get(&c.payout_id) else {
            return refused(ClaimOutcome::NotFound);
        };
        let state = p.row.state;
        // 3. The funds, decided by the claim rule on what this transaction read.
        let amount = p.row.amount_minor;
        let attempt_count = p.row.attempt_count;
        let facts = ClaimFacts {
            state,
            expected: c.expected,
            amount_minor: amount,
            balance_minor: t.accounts.get(&account_id).map_or(0, |a| a.balance_minor),
            reserved_minor: bigint(reserved_minor(t, &account_id, Some(c.payout_id)))?,
        };
        let decision = rules::decide_claim(&facts).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let (next, outcome) = match decision {
            ClaimDecision::NotClaimable { state } => return refused(ClaimOutcome::NotClaimable { state }),
            ClaimDecision::Claimed { reclaimed } => (
                PayoutState::Claimed,
                ClaimOutcome::Claimed {
                    account_id: account_id.clone(),
                    account_fence: c.token,
                    attempt_count,
                    reclaimed,
                },
            ),
            ClaimDecision::InsufficientFunds { available_minor } => (
                PayoutState::Failed,
                ClaimOutcome::InsufficientFunds {
                    account_id: account_id.clone(),
                    amount_minor: amount,
                    available_minor,
                },
            ),
        };
        guard_transition(state, next)?;
        let response = r(&outcome);
        // Writes: fence (first: its guard is the only write that could refuse, and the
        // check above means it cannot), identity, payout.
        raise_fence(t, &account_id, c.token, c.at)?;
        record(t, i, &response);
        if let Some(p) = t.rail.payouts.get_mut(&c.payout_id) {
            p.row.state = next;
            p.claim_token = Some(c.token);
            p.claimed_by = Some(c.owner_id.clone());
            p.claimed_at = Some(c.at);
            p.updated_at = c.at;
        }
        Ok(Idempotent::Executed { outcome, stored: Some(response) })
    }

    fn do_post(t: &mut PaydbTables, p: &Post, i: &IdemRequest, r: Render<'_, PostOutcome>) -> Decided<PostOutcome> {
        check_identity(i)?;
        if let Some(replay) = live_record(t, i) {
            return Ok(replay);
        }
        let refused = |outcome| Ok(Idempotent::Executed { outcome, stored: None });
        // 1. The fence (a ledger write).
        let account_id = match fence_check(t, p.payout_id, p.token)? {
            Fence::NotFound => return refused(PostOutcome::NotFound),
            Fence::Fenced { account_id, highest_token } => {
                return refused(PostOutcome::Fenced { account_id, highest_token })
            }
            Fence::Passes { account_id } => account_id,
        };
        // 2. RAIL_ACKED -> POSTED.
        let Some(payout) = t.rail.payouts.get(&p.payout_id) else {
            return refused(PostOutcome::NotFound);
        };
        // 3. The acknowledged attempt (I7).
        let acked = t.rail.submissions.iter().any(|s| {
            s.payout_id == p.payout_id
                && s.submission_id == p.submission_id
                && s.outcome == Some(SubmissionOutcome::Acked)
                && s.rail_reference.as_deref() == Some(p.rail_reference.as_str())
        });
        let amount = payout.row.amount_minor;
        let currency = payout.row.currency.clone();
        let facts = PostFacts {
            state: payout.row.state,
            acked,
            balance_minor: t.accounts.get(&account_id).map_or(0, |a| a.balance_minor),
            amount_minor: amount,
        };
        // 4. and 5. The entries and the balance, with the CHECKs they would hit.
        let balance_after = match rules::decide_post(&facts).map_err(|e| StoreError::Corrupt(e.to_string()))? {
            PostDecision::NotClaimable { state } => return refused(PostOutcome::NotClaimable { state }),
            PostDecision::RailMismatch => return refused(PostOutcome::RailMismatch),
            PostDecision::Posted { balance_after_minor } => balance_after_minor,
        };
        // The settlement account is upserted below: a payout seeded through the proxy may
        // be the first of its currency.
        let entries = p.entries(&account_id, amount, &currency, p.at);
        let outcome = PostOutcome::Posted {
            account_id: account_id.clone(),
            entries: entries.clone(),
            balance_minor: balance_after,
        };
        let response = r(&outcome);
        // Writes: fence (first, as in a claim), identity, payout, entries, balance.
        raise_fence(t, &account_id, p.token, p.at)?;
        record(t, i, &response);
        if let Some(payout) = t.rail.payouts.get_mut(&p.payout_id) {
            payout.row.state = PayoutState::Posted;
            payout.updated_at = p.at;
        }
        t.accounts
            .entry(settlement_account(&currency))
            .or_insert_with(|| system_account(AccountKind::Settlement, &currency, p.at));
        t.ledger.extend(entries);
        if let Some(a) = t.accounts.get_mut(&account_id) {
            a.balance_minor = balance_after;
            a.updated_at = p.at;
        }
        Ok(Idempotent::Executed { outcome, stored: Some(response) })
    }

    fn do_resolve(t: &mut PaydbTables, r: &AmbiguousResolution) -> Result<ResolveOutcome, StoreError> {
        r.check()?;
        let Some(payout) = t.rail.payouts.get(&r.payout_id) else {
            return Ok(ResolveOutcome::NotFound);
        };
        if payout.row.state != PayoutState::RailAmbiguous {
            return Ok(ResolveOutcome::NotAmbiguous { state: payout.row.state });
        }
        payout::check_transition(payout.row.state, r.resolved_as, Actor::Operator)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        guard_transition(payout.row.state, r.resolved_as)?;
        // The audit row's CHECKs and unique index.
        let operator_chars = r.operator.chars().count();
        if !(1..=dlock_contract::headers::OWNER_ID_CHARS_MAX).contains(&operator_chars)
            || r.reason.chars().count() < RESOLUTION_REASON_CHARS_MIN
            || r.rail_reference.is_empty()
        {
            return Err(StoreError::Corrupt("payout_resolutions: a CHECK refused the row".into()));
        }
        if t.resolutions.iter().any(|x| x.payout_id == r.payout_id || x.resolution_id == r.resolution_id) {
            return Err(StoreError::Corrupt("payout_resolutions: the payout or the id is taken".into()));
        }
        let account_id = payout.row.account_id.clone();
        let amount = payout.row.amount_minor;
        let currency = payout.row.currency.clone();
        let Some(balance) = t.accounts.get(&account_id).map(|a| a.balance_minor) else {
            return Err(StoreError::Corrupt(format!(
                "payout {} references missing account {account_id:?}",
                r.payout_id
            )));
        };
        let posted = r.resolved_as == PayoutState::Posted;
        let at = dlock_contract::time::truncate_ms(r.at);
        let balance_after = if posted {
            rules::balance_after_debit(balance, amount).map_err(|e| StoreError::Corrupt(e.to_string()))?
        } else {
            balance
        };
        // Writes: payout, then (POSTED) entries and balance, then the audit row.
        if let Some(p) = t.rail.payouts.get_mut(&r.payout_id) {
            p.row.state = r.resolved_as;
            p.updated_at = at;
        }
        if posted {
            t.accounts
                .entry(settlement_account(&currency))
                .or_insert_with(|| system_account(AccountKind::Settlement, &currency, at));
            t.ledger.extend(r.entries(&account_id, amount, &currency, at));
            if let Some(a) = t.accounts.get_mut(&account_id) {
                a.balance_minor = balance_after;
                a.updated_at = at;
            }
        }
        t.resolutions.push(r.row(at));
        Ok(ResolveOutcome::Resolved { state: r.resolved_as, balance_minor: balance_after })
    }

    fn do_insert_payout(t: &mut PaydbTables, p: &rail::NewPayout, at: DateTime<Utc>) -> Result<(), rail::StoreError> {
        if is_system_account(&p.account_id) {
            return Err(rail::StoreError::Corrupt(format!("accounts: {:?} is not a CUSTOMER id", p.account_id)));
        }
        if p.currency.chars().count() != 3 {
            return Err(rail::StoreError::Corrupt(format!("currency {:?} is not 3 characters", p.currency)));
        }
        // Fails, changing nothing, if the payout exists.
        t.rail.insert_payout(p, at)?;
        let at = dlock_contract::time::truncate_ms(at);
        t.accounts.entry(p.account_id.clone()).or_insert_with(|| StoredAccount {
            kind: AccountKind::Customer,
            currency: p.currency.clone(),
            balance_minor: 0,
            fence: 0,
            created_at: at,
            updated_at: at,
        });
        Ok(())
    }
}

#[async_trait]
impl PaymentStore for MemPaydb {
    async fn ping(&self) -> Result<(), StoreError> {
        self.lock().map(|_| ())
    }

    async fn cursor_secret(&self, candidate: [u8; 32], _at: DateTime<Utc>) -> Result<[u8; 32], StoreError> {
        let mut t = self.lock()?;
        Ok(*t.cursor_secret.get_or_insert(candidate))
    }

    async fn create_account(
        &self,
        a: &NewAccount,
        i: &IdemRequest,
        r: Render<'_, CreateAccountOutcome>,
    ) -> Decided<CreateAccountOutcome> {
        MemPaydb::do_create_account(&mut *self.lock()?, a, i, r)
    }

    async fn create_payout(
        &self,
        p: &NewPayout,
        i: &IdemRequest,
        r: Render<'_, CreatePayoutOutcome>,
    ) -> Decided<CreatePayoutOutcome> {
        MemPaydb::do_create_payout(&mut *self.lock()?, p, i, r)
    }

    async fn claim(&self, c: &Claim, i: &IdemRequest, r: Render<'_, ClaimOutcome>) -> Decided<ClaimOutcome> {
        let mut t = self.lock()?;
        let Some(observer) = self.observer() else {
            return MemPaydb::do_claim(&mut t, c, i, r);
        };
        let before = t.rail.payouts.get(&c.payout_id).map(|p| (p.row.state, p.row.account_id.clone()));
        let decided = MemPaydb::do_claim(&mut t, c, i, r);
        let (verdict, recorded, replayed) = verdict_of(
            &decided,
            |o| matches!(o, ClaimOutcome::Claimed { .. } | ClaimOutcome::InsufficientFunds { .. }),
            |o| match o {
                ClaimOutcome::Fenced { highest_token, .. } => Some(*highest_token),
                _ => None,
            },
        );
        let write = FencedWrite {
            op: FencedOp::Claim,
            payout_id: c.payout_id,
            account_id: before.as_ref().map(|b| b.1.clone()).unwrap_or_default(),
            token: c.token,
            owner_id: c.owner_id.clone(),
            fenced: true,
            state_before: before.map(|b| b.0),
            verdict,
            identity: Some(identity(i)),
            recorded,
            replayed,
            admission: None,
        };
        observer.fenced_write(&t, &write);
        decided
    }

    async fn post(&self, p: &Post, i: &IdemRequest, r: Render<'_, PostOutcome>) -> Decided<PostOutcome> {
        let mut t = self.lock()?;
        let Some(observer) = self.observer() else {
            return MemPaydb::do_post(&mut t, p, i, r);
        };
        let before = t.rail.payouts.get(&p.payout_id).map(|x| (x.row.state, x.row.account_id.clone()));
        let decided = MemPaydb::do_post(&mut t, p, i, r);
        let (verdict, recorded, replayed) = verdict_of(
            &decided,
            |o| matches!(o, PostOutcome::Posted { .. }),
            |o| match o {
                PostOutcome::Fenced { highest_token, .. } => Some(*highest_token),
                _ => None,
            },
        );
        let write = FencedWrite {
            op: FencedOp::Post,
            payout_id: p.payout_id,
            account_id: before.as_ref().map(|b| b.1.clone()).unwrap_or_default(),
            token: p.token,
            owner_id: p.owner_id.clone(),
            fenced: true,
            state_before: before.map(|b| b.0),
            verdict,
            identity: Some(identity(i)),
            recorded,
            replayed,
            admission: None,
        };
        observer.fenced_write(&t, &write);
        decided
    }

    async fn abandon(&self, payout_id: Uuid, at: DateTime<Utc>) -> Result<AbandonOutcome, StoreError> {
        let mut t = self.lock()?;
        let Some(p) = t.rail.payouts.get_mut(&payout_id) else {
            return Ok(AbandonOutcome::NotFound);
        };
        let state = p.row.state;
        if !payout::may_transition(state, PayoutState::Abandoned, Actor::Operator) {
            return Ok(AbandonOutcome::NotAbandonable { state });
        }
        p.row.state = PayoutState::Abandoned;
        p.updated_at = at;
        Ok(AbandonOutcome::Abandoned)
    }

    async fn resolve_ambiguous(&self, r: &AmbiguousResolution) -> Result<ResolveOutcome, StoreError> {
        MemPaydb::do_resolve(&mut *self.lock()?, r)
    }

    async fn resolutions(&self, payout_id: Option<Uuid>) -> Result<Vec<ResolutionRow>, StoreError> {
        let t = self.lock()?;
        let mut rows: Vec<ResolutionRow> =
            t.resolutions.iter().filter(|r| payout_id.is_none_or(|p| r.payout_id == p)).cloned().collect();
        rows.sort_by_key(|r| (r.resolved_at, r.resolution_id));
        Ok(rows)
    }

    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutView>, StoreError> {
        let t = self.lock()?;
        Ok(t.rail.payouts.get(&payout_id).map(|p| payout_view(&t, p)))
    }

    async fn account(&self, account_id: &str) -> Result<Option<AccountView>, StoreError> {
        let t = self.lock()?;
        t.accounts.get(account_id).map(|a| account_view(&t, account_id, a)).transpose()
    }

    async fn accounts(&self) -> Result<Vec<AccountView>, StoreError> {
        let t = self.lock()?;
        t.accounts.iter().map(|(id, a)| account_view(&t, id, a)).collect()
    }

    async fn list(&self, q: &ListQuery) -> Result<Vec<PayoutSummary>, StoreError> {
        let t = self.lock()?;
        let mut rows: Vec<&StoredPayout> = t
            .rail
            .payouts
            .values()
            .filter(|p| {
                p.row.state == q.state
                    && q.account_id.as_ref().is_none_or(|a| *a == p.row.account_id)
                    && p.created_at <= q.snapshot
                    && q.after.is_none_or(|after| (p.created_at, p.row.payout_id) > after)
            })
            .collect();
        rows.sort_by_key(|p| (p.created_at, p.row.payout_id));
        let limit = usize::try_from(q.limit).unwrap_or(0);
        Ok(rows
            .into_iter()
            .take(limit)
            .map(|p| PayoutSummary {
                payout_id: p.row.payout_id,
                account_id: p.row.account_id.clone(),
                amount_minor: p.row.amount_minor,
                currency: p.row.currency.clone(),
                state: p.row.state,
                attempt_count: p.row.attempt_count,
                created_at: p.created_at,
            })
            .collect())
    }

    async fn ledger(&self, account_id: Option<&str>) -> Result<Vec<LedgerEntry>, StoreError> {
        let t = self.lock()?;
        let mut entries: Vec<LedgerEntry> =
            t.ledger.iter().filter(|e| account_id.is_none_or(|a| e.account_id == a)).cloned().collect();
        entries.sort_by_key(|e| (e.created_at, e.entry_id));
        Ok(entries)
    }

    async fn oldest_pending_created_at(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let t = self.lock()?;
        Ok(t.rail.payouts.values().filter(|p| p.row.state == PayoutState::Pending).map(|p| p.created_at).min())
    }

    async fn purge_idempotency(&self, now: DateTime<Utc>, batch_max: i64) -> Result<u64, StoreError> {
        let mut t = self.lock()?;
        let mut expired: Vec<(DateTime<Utc>, Identity)> =
            t.idempotency.iter().filter(|(_, r)| r.expires_at <= now).map(|(k, r)| (r.expires_at, k.clone())).collect();
        expired.sort();
        let batch = usize::try_from(batch_max).unwrap_or(0);
        let mut deleted = 0u64;
        for (_, key) in expired.into_iter().take(batch) {
            if t.idempotency.remove(&key).is_some() {
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    async fn idempotency_record_count(&self) -> Result<u64, StoreError> {
        let t = self.lock()?;
        Ok(u64::try_from(t.idempotency.len()).unwrap_or(u64::MAX))
    }
}

/// The proxy's view of the same paydb: the proxy's own table code, under the same mutex.
#[async_trait]
impl RailStore for MemPaydb {
    async fn ping(&self) -> Result<(), rail::StoreError> {
        self.lock_rail().map(|_| ())
    }

    async fn payout(&self, payout_id: Uuid) -> Result<Option<rail::PayoutRow>, rail::StoreError> {
        Ok(self.lock_rail()?.rail.payout(payout_id))
    }

    async fn admit(&self, attempt: &rail::Attempt) -> Result<rail::Admission, rail::StoreError> {
        let mut t = self.lock_rail()?;
        let Some(observer) = self.observer() else {
            return t.rail.admit(attempt);
        };
        let state_before = t.rail.payouts.get(&attempt.payout_id).map(|p| p.row.state);
        let admitted = t.rail.admit(attempt);
        let (verdict, admission) = match &admitted {
            Ok(rail::Admission::Admitted { .. }) => (FenceVerdictSeen::Accepted, "admitted"),
            // Step 1 passed and the mark rose; step 2 refused the repeat.
            Ok(rail::Admission::Duplicate { .. }) => (FenceVerdictSeen::Accepted, "duplicate"),
            Ok(rail::Admission::Fenced { highest_token }) => {
                (FenceVerdictSeen::FencedOut { highest_token: *highest_token }, "fenced")
            }
            Ok(rail::Admission::NotClaimable { .. }) => (FenceVerdictSeen::Other, "not_claimable"),
            Err(_) => (FenceVerdictSeen::Other, "error"),
        };
        let write = FencedWrite {
            op: FencedOp::Admit,
            payout_id: attempt.payout_id,
            account_id: attempt.account_id.clone(),
            token: attempt.presented_token,
            owner_id: attempt.owner_id.clone(),
            fenced: attempt.fencing_enabled,
            state_before,
            verdict,
            identity: None,
            recorded: None,
            replayed: None,
            admission: Some(admission),
        };
        observer.fenced_write(&t, &write);
        admitted
    }

    async fn resolve(
        &self,
        submission_id: Uuid,
        resolution: &rail::Resolution,
        at: DateTime<Utc>,
    ) -> Result<(), rail::StoreError> {
        self.lock_rail()?.rail.resolve(submission_id, resolution, at)
    }

    async fn high_water(&self, account_id: &str) -> Result<Option<i64>, rail::StoreError> {
        Ok(self.lock_rail()?.rail.high_water.get(account_id).copied())
    }

    async fn submissions(&self, payout_id: Option<Uuid>) -> Result<Vec<rail::SubmissionRow>, rail::StoreError> {
        Ok(self.lock_rail()?.rail.submissions_of(payout_id))
    }

    async fn unresolved_before(&self, before: DateTime<Utc>, limit: i64) -> Result<Vec<Uuid>, rail::StoreError> {
        Ok(self.lock_rail()?.rail.unresolved_before(before, limit))
    }

    /// Also upserts a zero-balance CUSTOMER account in the payout's currency, as the SQL
    /// store does (seeded payouts bypass the funds check: dev and tests only).
    async fn insert_payout(&self, payout: &rail::NewPayout, at: DateTime<Utc>) -> Result<(), rail::StoreError> {
        MemPaydb::do_insert_payout(&mut *self.lock_rail()?, payout, at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_transition_allows_exactly_c2_and_same_state_writes() {
        for from in PayoutState::ALL {
            for to in PayoutState::ALL {
                let allowed =
                    from == to || dlock_contract::payout::TRANSITIONS.iter().any(|(f, t, _)| *f == from && *t == to);
                assert_eq!(guard_transition(from, to).is_ok(), allowed, "{from:?}>{to:?}");
            }
        }
        assert!(guard_transition(PayoutState::Posted, PayoutState::Claimed).is_err());
    }
}
