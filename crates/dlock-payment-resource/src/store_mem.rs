//! The simulation store's payment side: the payment-resource's [`PaymentStore`] over
//! [`MemPaydb`], paydb in memory (`dlock-paydb`), with the same semantics as SQL.
//!
//! `MemPaydb` stands in for the *database*, not for a service's memory: the rail-proxy
//! implements its `RailStore` on the same value, so in the simulation the two services share
//! one paydb exactly as their SQL stores share one database.
//!
//! Each method takes the one mutex for its whole body, which is what a serialisable
//! transaction looks like from outside. A method validates everything and renders the
//! response before its first write, so a refusal has nothing to undo. The helpers
//! [`guard_transition`] and the fence comparisons mirror the SQL triggers and CHECKs (a write
//! they refuse is [`StoreError::Corrupt`], as a trigger error is). The conformance suite
//! holds it to the SQL stores.
//!
//! Defence in depth: the account fence at claim and at post decide in one place,
//! `fence_check` here, through `dlock_rt::defence::stops` ([`Layer::ClaimFence`],
//! [`Layer::PostFence`]). Only a simulation campaign can switch either off; a bypassed fence
//! lets the write through without moving (a lower token never lowers `accounts.fence`).
//! The SQL stores have no switch: they never run in the simulation.
//!
//! Claims and posts report to paydb's observer, when one is registered
//! ([`MemPaydb::set_observer`]), inside their transaction (the simulation's oracle).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dlock_contract::payout::{self, Actor, PayoutState};
use dlock_contract::rail::SubmissionOutcome;
use dlock_paydb::mem::{bigint, payout_view, reserved_minor, system_account, upsert_system_accounts, StoredPayout};
pub use dlock_paydb::mem::{
    guard_transition, FenceVerdictSeen, FencedOp, FencedWrite, Identity, MemPaydb, PaydbObserver, PaydbTables,
    StoredAccount, StoredRecord,
};
use dlock_paydb::rail::PayoutRow;
use dlock_rt::defence::{self, Layer};
use uuid::Uuid;

use crate::rules::{self, ClaimDecision, ClaimFacts, FenceVerdict, PostDecision, PostFacts};
use crate::store::{
    is_system_account, settlement_account, AbandonOutcome, AccountKind, AccountView, AmbiguousResolution, Claim,
    ClaimOutcome, CreateAccountOutcome, CreatePayoutOutcome, Decided, IdemRequest, Idempotent, LedgerEntry, ListQuery,
    NewAccount, NewPayout, PaymentStore, PayoutSummary, PayoutView, Post, PostOutcome, Render, ResolutionRow,
    ResolveOutcome, StoreError, StoredResponse,
};

/// The payment-resource's transactions over the tables (each under the one mutex).
struct PaydbTx;

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

/// The fence statement's verdict: `Ok(account_id)` when `token` may pass, else the
/// outcome's `Fenced` fields, or `None` when the payout does not exist.
enum Fence {
    Passes {
        account_id: String,
    },
    Fenced {
        account_id: String,
        highest_token: i64,
    },
    /// The fence would have refused, but the simulation switched this layer off
    /// ([`Layer::ClaimFence`] or [`Layer::PostFence`]): the write goes on and the fence is
    /// left where it is (a lower token never lowers it).
    Bypassed {
        account_id: String,
    },
    NotFound,
}

/// The account fence, at the layer `layer` (claim or post): the one place either layer
/// decides (`dlock_rt::defence::stops`).
fn fence_check(t: &PaydbTables, payout_id: Uuid, token: i64, layer: Layer) -> Result<Fence, StoreError> {
    let Some(p) = t.rail.payouts.get(&payout_id) else {
        return Ok(Fence::NotFound);
    };
    let account_id = p.row.account_id.clone();
    let Some(a) = t.accounts.get(&account_id) else {
        return Err(StoreError::Corrupt(format!("payout {payout_id} references missing account {account_id:?}")));
    };
    match rules::fence_check(a.fence, token) {
        FenceVerdict::Passes => Ok(Fence::Passes { account_id }),
        FenceVerdict::Fenced { highest_token } if defence::stops(layer, true) => {
            Ok(Fence::Fenced { account_id, highest_token })
        }
        FenceVerdict::Fenced { .. } => Ok(Fence::Bypassed { account_id }),
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

impl PaydbTx {
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
            row: PayoutRow {
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
        let (account_id, raise) = match fence_check(t, c.payout_id, c.token, Layer::ClaimFence)? {
            Fence::NotFound => return refused(ClaimOutcome::NotFound),
            Fence::Fenced { account_id, highest_token } => {
                return refused(ClaimOutcome::Fenced { account_id, highest_token })
            }
            Fence::Passes { account_id } => (account_id, true),
            Fence::Bypassed { account_id } => (account_id, false),
        };
        // 2. The state (a refusal rolls the fence back: it never moved).
        let Some(p) = t.rail.payouts.get(&c.payout_id) else {
            return refused(ClaimOutcome::NotFound);
        };
        let state = p.row.state;
        // 3. The funds, decided by the claim rule on what this transaction read.
        let amount = p.row.amount_minor;
        let attempt_count = p.row.attempt_count;
        let (currency, beneficiary_ref) = (p.row.currency.clone(), p.row.beneficiary_ref.clone());
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
                    amount_minor: amount,
                    currency,
                    beneficiary_ref,
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
        if raise {
            raise_fence(t, &account_id, c.token, c.at)?;
        }
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
        let (account_id, raise) = match fence_check(t, p.payout_id, p.token, Layer::PostFence)? {
            Fence::NotFound => return refused(PostOutcome::NotFound),
            Fence::Fenced { account_id, highest_token } => {
                return refused(PostOutcome::Fenced { account_id, highest_token })
            }
            Fence::Passes { account_id } => (account_id, true),
            Fence::Bypassed { account_id } => (account_id, false),
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
        if raise {
            raise_fence(t, &account_id, p.token, p.at)?;
        }
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
}

/// What a claim or post decided, as the observer is told it: the fence's verdict, the
/// response it recorded, the response a replay answered.
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
        PaydbTx::do_create_account(&mut *self.lock()?, a, i, r)
    }

    async fn create_payout(
        &self,
        p: &NewPayout,
        i: &IdemRequest,
        r: Render<'_, CreatePayoutOutcome>,
    ) -> Decided<CreatePayoutOutcome> {
        PaydbTx::do_create_payout(&mut *self.lock()?, p, i, r)
    }

    async fn claim(&self, c: &Claim, i: &IdemRequest, r: Render<'_, ClaimOutcome>) -> Decided<ClaimOutcome> {
        let mut t = self.lock()?;
        let Some(observer) = self.observer() else {
            return PaydbTx::do_claim(&mut t, c, i, r);
        };
        let before = t.rail.payouts.get(&c.payout_id).map(|p| (p.row.state, p.row.account_id.clone()));
        let decided = PaydbTx::do_claim(&mut t, c, i, r);
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
            fenced: !defence::off(Layer::ClaimFence),
            state_before: before.map(|b| b.0),
            verdict,
            identity: Some(identity(i)),
            recorded,
            replayed,
            admission: None,
            batch_pass: None,
        };
        observer.fenced_write(&t, &write);
        decided
    }

    async fn post(&self, p: &Post, i: &IdemRequest, r: Render<'_, PostOutcome>) -> Decided<PostOutcome> {
        let mut t = self.lock()?;
        let Some(observer) = self.observer() else {
            return PaydbTx::do_post(&mut t, p, i, r);
        };
        let before = t.rail.payouts.get(&p.payout_id).map(|x| (x.row.state, x.row.account_id.clone()));
        let decided = PaydbTx::do_post(&mut t, p, i, r);
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
            fenced: !defence::off(Layer::PostFence),
            state_before: before.map(|b| b.0),
            verdict,
            identity: Some(identity(i)),
            recorded,
            replayed,
            admission: None,
            batch_pass: None,
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
        self.lock()?.resolve_ambiguous(r)
    }

    async fn resolutions(&self, payout_id: Option<Uuid>) -> Result<Vec<ResolutionRow>, StoreError> {
        Ok(self.lock()?.resolutions(payout_id))
    }

    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutView>, StoreError> {
        Ok(self.lock()?.payout_view(payout_id))
    }

    async fn payout_account(&self, payout_id: Uuid) -> Result<Option<String>, StoreError> {
        Ok(self.lock()?.rail.payouts.get(&payout_id).map(|p| p.row.account_id.clone()))
    }

    async fn account(&self, account_id: &str) -> Result<Option<AccountView>, StoreError> {
        self.lock()?.account(account_id)
    }

    async fn accounts(&self) -> Result<Vec<AccountView>, StoreError> {
        self.lock()?.account_views()
    }

    async fn list(&self, q: &ListQuery) -> Result<Vec<PayoutSummary>, StoreError> {
        Ok(self.lock()?.list(q))
    }

    async fn ledger(&self, account_id: Option<&str>) -> Result<Vec<LedgerEntry>, StoreError> {
        Ok(self.lock()?.ledger_of(account_id))
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
