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
//! `account_fence_check` (a single write is a batch of one), through
//! `dlock_rt::defence::stops` ([`Layer::ClaimFence`], [`Layer::PostFence`]). Only a simulation campaign can switch either off; a bypassed fence
//! lets the write through without moving (a lower token never lowers `accounts.fence`).
//! The SQL stores have no switch: they never run in the simulation.
//!
//! Claims and posts report to paydb's observer, when one is registered
//! ([`MemPaydb::set_observer`]), inside their transaction (the simulation's oracle). A batch
//! (C3-extensions E-19) reports one fenced write per payout, all with the batch's one fence
//! pass (`FencedWrite::batch_pass`; a single write, the batch of one, reports none) and its
//! identity; its fence decides at [`Layer::ClaimFence`] or [`Layer::PostFence`], once for the
//! request.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dlock_contract::payout::{self, Actor, PayoutState};
use dlock_contract::rail::SubmissionOutcome;
use dlock_contract::stream::EventKind;
use dlock_contract::time::truncate_ms;
use dlock_paydb::events::{fence_refused_body, EventRead};
use dlock_paydb::mem::{
    bigint, emit, payout_view, reserved_minor, system_account, upsert_system_accounts, StoredPayout,
};
pub use dlock_paydb::mem::{
    guard_transition, FenceVerdictSeen, FencedOp, FencedWrite, Identity, MemPaydb, PaydbObserver, PaydbTables,
    StoredAccount, StoredRecord,
};
use dlock_paydb::rail::PayoutRow;
use dlock_rt::defence::{self, Layer};
use uuid::Uuid;

use crate::answer;
use crate::rules::{self, ClaimBatchFacts, FenceVerdict, PostBatchFacts, PostDecision};
use crate::store::{
    is_system_account, settlement_account, AbandonOutcome, AccountKind, AccountView, AmbiguousResolution, Answering,
    BatchItemOutcome, BatchOutcome, ClaimBatch, ClaimBatchOutcome, ClaimOutcome, ClaimSeen, CreateAccountOutcome,
    CreatePayoutOutcome, Decided, IdemRequest, Idempotent, LedgerEntry, ListQuery, NewAccount, NewPayout, PaymentStore,
    PayoutSummary, PayoutView, PostBatch, PostBatchOutcome, PostOutcome, ResolutionRow, ResolveOutcome, Shape,
    StoreError, StoredResponse,
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

/// Raises `account_id`'s fence to `token` (the caller has checked `fence < token`).
fn raise_fence(t: &mut PaydbTables, account_id: &str, token: i64, at: DateTime<Utc>) -> Result<(), StoreError> {
    let Some(a) = t.accounts.get_mut(account_id) else {
        return Err(StoreError::Corrupt(format!("account {account_id:?} vanished")));
    };
    if rules::fence_check(a.fence, token) != FenceVerdict::Passes {
        return Err(StoreError::Corrupt(format!("accounts: fence of {account_id:?} may only rise")));
    }
    let previous = a.fence;
    a.fence = rules::raise_fence(a.fence, token);
    a.updated_at = at;
    let fence = a.fence;
    emit::fence_raised(&mut t.rail.events, account_id, previous, fence, truncate_ms(at));
    Ok(())
}

/// The `fence.refused` event of a claim or post its account's fence refused (C3-extensions
/// E-20): written by the store, after the refusal changed nothing (here, under the same
/// mutex: nothing can come between).
fn fence_refused(
    t: &mut PaydbTables,
    operation: &str,
    refused: (&str, i64, &str),
    payouts: &[Uuid],
    at: DateTime<Utc>,
    fence: i64,
) {
    let (account_id, token, owner_id) = refused;
    let ids: Vec<String> = payouts.iter().map(Uuid::to_string).collect();
    let body = fence_refused_body(operation, token, fence, owner_id, &ids);
    t.rail.events.emit(EventKind::FenceRefused, truncate_ms(at), Some(account_id), None, body);
}

/// A claim's or post's fence: the account's own, compared once for the request.
enum AccountFence {
    Passes,
    Fenced {
        highest_token: i64,
    },
    /// Refused, but the simulation switched this layer off ([`Layer::ClaimFence`] or
    /// [`Layer::PostFence`]): the write goes on and the fence is left where it is (a lower
    /// token never lowers it).
    Bypassed,
    /// No such CUSTOMER account.
    NotFound,
}

/// The CUSTOMER account `account_id`'s fence at the layer `layer` (claim or post): the one
/// place either layer decides (a single write is a batch of one).
fn account_fence_check(t: &PaydbTables, account_id: &str, token: i64, layer: Layer) -> AccountFence {
    let Some(a) = t.accounts.get(account_id).filter(|a| a.kind == AccountKind::Customer) else {
        return AccountFence::NotFound;
    };
    match rules::fence_check(a.fence, token) {
        FenceVerdict::Passes => AccountFence::Passes,
        FenceVerdict::Fenced { highest_token } if defence::stops(layer, true) => AccountFence::Fenced { highest_token },
        FenceVerdict::Fenced { .. } => AccountFence::Bypassed,
    }
}

/// A payout of a batch's account as the batch read it: `None` for no such payout, or one
/// of another account (its item is `NotFound`).
fn batch_payout<'a>(t: &'a PaydbTables, account_id: &str, payout_id: Uuid) -> Option<&'a StoredPayout> {
    t.rail.payouts.get(&payout_id).filter(|p| rules::batch_may_write(account_id, &p.row.account_id))
}

impl PaydbTx {
    fn do_create_account(
        t: &mut PaydbTables,
        a: &NewAccount,
        i: &IdemRequest,
        how: &Answering,
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
        let response = answer::account_created(&outcome, &how.trace_id);
        // Writes, in statement order; nothing below can fail.
        record(t, i, &response);
        upsert_system_accounts(t, &a.currency, a.at);
        let account = StoredAccount {
            kind: AccountKind::Customer,
            currency: a.currency.clone(),
            balance_minor: opening,
            fence: 0,
            created_at: a.at,
            updated_at: a.at,
        };
        // The trigger copies `created_at`, which SQL holds in whole milliseconds.
        emit::account_created(
            &mut t.rail.events,
            &a.account_id,
            &StoredAccount { created_at: truncate_ms(a.at), ..account.clone() },
        );
        t.accounts.insert(a.account_id.clone(), account);
        t.ledger.extend(entries);
        Ok(Idempotent::Executed { outcome, stored: Some(response) })
    }

    fn do_create_payout(
        t: &mut PaydbTables,
        p: &NewPayout,
        i: &IdemRequest,
        a: &Answering,
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
        let response = answer::payout_created(&outcome, &a.trace_id);
        record(t, i, &response);
        emit::payout_created(&mut t.rail.events, &StoredPayout { created_at: truncate_ms(p.at), ..stored.clone() });
        t.rail.payouts.insert(p.payout_id, stored);
        Ok(Idempotent::Executed { outcome, stored: Some(response) })
    }

    /// The recorded resolution: statement 0, then paydb's resolution (which checks
    /// everything before its first write), then the answer recorded with it.
    fn do_resolve_recorded(
        t: &mut PaydbTables,
        r: &AmbiguousResolution,
        i: &IdemRequest,
        a: &Answering,
    ) -> Decided<ResolveOutcome> {
        check_identity(i)?;
        r.check()?;
        if let Some(replay) = live_record(t, i) {
            return Ok(replay);
        }
        let outcome = t.resolve_ambiguous(r)?;
        if !matches!(outcome, ResolveOutcome::Resolved { .. }) {
            // Refused before any write: nothing to undo, nothing recorded.
            return Ok(Idempotent::Executed { outcome, stored: None });
        }
        let response = answer::resolved(&outcome, r, &a.trace_id);
        record(t, i, &response);
        Ok(Idempotent::Executed { outcome, stored: Some(response) })
    }

    fn do_claim(t: &mut PaydbTables, b: &ClaimBatch, i: &IdemRequest, a: &Answering) -> Decided<ClaimBatchOutcome> {
        check_identity(i)?;
        if let Some(replay) = live_record(t, i) {
            return Ok(replay);
        }
        let refused = |outcome| Ok(Idempotent::Executed { outcome, stored: None });
        // 1. The account's fence, once for the batch.
        let raise = match account_fence_check(t, &b.account_id, b.token, Layer::ClaimFence) {
            AccountFence::NotFound => return refused(ClaimBatchOutcome::AccountNotFound),
            AccountFence::Fenced { highest_token } => {
                let ids: Vec<Uuid> = b.payouts.iter().map(|p| p.payout_id).collect();
                fence_refused(t, "claim", (&b.account_id, b.token, &b.owner_id), &ids, b.at, highest_token);
                // Planted bug `event-outside-txn` (test-only): the request's own event written
                // though the claim rolled back, as a service that writes its events apart from
                // its transaction would.
                if dlock_contract::planted::on(dlock_contract::planted::Bug::EventOutsideTxn) {
                    emit::fence_raised(&mut t.rail.events, &b.account_id, highest_token, b.token, truncate_ms(b.at));
                }
                return refused(ClaimBatchOutcome::Fenced { highest_token });
            }
            AccountFence::Passes => true,
            AccountFence::Bypassed => false,
        };
        // 2. Every payout of the batch and the account's reservation, read once.
        let balance = t.accounts.get(&b.account_id).map_or(0, |a| a.balance_minor);
        let unsettled = bigint(reserved_minor(t, &b.account_id, None))?;
        let read: Vec<Option<&StoredPayout>> =
            b.payouts.iter().map(|p| batch_payout(t, &b.account_id, p.payout_id)).collect();
        let facts: Vec<ClaimBatchFacts> = b
            .payouts
            .iter()
            .zip(&read)
            .filter_map(|(p, row)| {
                row.map(|row| ClaimBatchFacts {
                    state: row.row.state,
                    expected: p.expected,
                    amount_minor: row.row.amount_minor,
                })
            })
            .collect();
        // 3. Each payout in order, by the claim rule on what the ones before it left.
        let mut decisions = rules::decide_claim_batch(balance, unsettled, &facts)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?
            .into_iter();
        let mut items = Vec::with_capacity(b.payouts.len());
        let mut moves = Vec::new();
        for (p, row) in b.payouts.iter().zip(&read) {
            let Some(row) = row else {
                items.push((p.payout_id, ClaimOutcome::NotFound));
                continue;
            };
            let Some(decision) = decisions.next() else {
                return Err(StoreError::Corrupt("the batch claim rule decided fewer payouts than it read".into()));
            };
            let read = ClaimSeen {
                amount_minor: row.row.amount_minor,
                currency: &row.row.currency,
                beneficiary_ref: &row.row.beneficiary_ref,
                attempt_count: row.row.attempt_count,
            };
            let outcome = ClaimOutcome::decided(&decision, &b.account_id, b.token, read);
            if let Some(next) = decision.next_state() {
                guard_transition(row.row.state, next)?;
                moves.push((p.payout_id, next));
            }
            items.push((p.payout_id, outcome));
        }
        let outcome = ClaimBatchOutcome::Decided { items };
        if moves.is_empty() {
            // Nothing moved: the fence and the identity roll back (they were never written).
            return refused(outcome);
        }
        let response = answer::claim(&outcome, &b.account_id, b.token, a);
        // Writes: fence, identity, each payout (nothing below can fail).
        if raise {
            raise_fence(t, &b.account_id, b.token, b.at)?;
        }
        record(t, i, &response);
        for (payout_id, next) in moves {
            if let Some(p) = t.rail.payouts.get_mut(&payout_id) {
                let from = p.row.state;
                p.row.state = next;
                p.claim_token = Some(b.token);
                p.claimed_by = Some(b.owner_id.clone());
                p.claimed_at = Some(b.at);
                p.updated_at = b.at;
                let seen = StoredPayout { updated_at: truncate_ms(b.at), ..p.clone() };
                emit::payout_state_changed(&mut t.rail.events, &seen, from);
            }
        }
        Ok(Idempotent::Executed { outcome, stored: Some(response) })
    }

    fn do_post(t: &mut PaydbTables, b: &PostBatch, i: &IdemRequest, a: &Answering) -> Decided<PostBatchOutcome> {
        check_identity(i)?;
        if let Some(replay) = live_record(t, i) {
            return Ok(replay);
        }
        let refused = |outcome| Ok(Idempotent::Executed { outcome, stored: None });
        // 1. The account's fence (a ledger write), once for the batch.
        let raise = match account_fence_check(t, &b.account_id, b.token, Layer::PostFence) {
            AccountFence::NotFound => return refused(PostBatchOutcome::AccountNotFound),
            AccountFence::Fenced { highest_token } => {
                let ids: Vec<Uuid> = b.payouts.iter().map(|p| p.payout_id).collect();
                fence_refused(t, "post", (&b.account_id, b.token, &b.owner_id), &ids, b.at, highest_token);
                return refused(PostBatchOutcome::Fenced { highest_token });
            }
            AccountFence::Passes => true,
            AccountFence::Bypassed => false,
        };
        // 2. Every payout of the batch and whether its named attempt is its ACKED one (I7).
        let balance = t.accounts.get(&b.account_id).map_or(0, |a| a.balance_minor);
        let read: Vec<Option<(&StoredPayout, bool)>> = b
            .payouts
            .iter()
            .map(|p| {
                batch_payout(t, &b.account_id, p.payout_id).map(|row| {
                    let acked = t.rail.submissions.iter().any(|s| {
                        s.payout_id == p.payout_id
                            && s.submission_id == p.submission_id
                            && s.outcome == Some(SubmissionOutcome::Acked)
                            && s.rail_reference.as_deref() == Some(p.rail_reference.as_str())
                    });
                    (row, acked)
                })
            })
            .collect();
        let facts: Vec<PostBatchFacts> = read
            .iter()
            .flatten()
            .map(|(row, acked)| PostBatchFacts {
                state: row.row.state,
                acked: *acked,
                amount_minor: row.row.amount_minor,
            })
            .collect();
        // 3. Each payout in order, by the post rule on the balance the ones before it left.
        let mut decisions =
            rules::decide_post_batch(balance, &facts).map_err(|e| StoreError::Corrupt(e.to_string()))?.into_iter();
        let mut items = Vec::with_capacity(b.payouts.len());
        let mut postings = Vec::new();
        let mut balance_after = balance;
        for (p, row) in b.payouts.iter().zip(&read) {
            let Some((row, _)) = row else {
                items.push((p.payout_id, PostOutcome::NotFound));
                continue;
            };
            let Some(decision) = decisions.next() else {
                return Err(StoreError::Corrupt("the batch post rule decided fewer payouts than it read".into()));
            };
            let outcome = match decision {
                PostDecision::NotClaimable { state } => PostOutcome::NotClaimable { state },
                PostDecision::RailMismatch => PostOutcome::RailMismatch,
                PostDecision::Posted { balance_after_minor } => {
                    guard_transition(row.row.state, PayoutState::Posted)?;
                    let currency = row.row.currency.clone();
                    let entries = b.post(p).entries(&b.account_id, row.row.amount_minor, &currency, b.at);
                    balance_after = balance_after_minor;
                    postings.push((p.payout_id, currency, entries.clone()));
                    PostOutcome::Posted {
                        account_id: b.account_id.clone(),
                        entries,
                        balance_minor: balance_after_minor,
                    }
                }
            };
            items.push((p.payout_id, outcome));
        }
        let outcome = PostBatchOutcome::Decided { items };
        if postings.is_empty() {
            return refused(outcome);
        }
        let response = answer::post(&outcome, &b.account_id, b.token, a);
        // Writes: fence, identity, then per posted payout its state, settlement account and
        // entries, and the balance after them all.
        if raise {
            raise_fence(t, &b.account_id, b.token, b.at)?;
        }
        record(t, i, &response);
        for (payout_id, currency, entries) in postings {
            if let Some(payout) = t.rail.payouts.get_mut(&payout_id) {
                let from = payout.row.state;
                payout.row.state = PayoutState::Posted;
                payout.updated_at = b.at;
                let seen = StoredPayout { updated_at: truncate_ms(b.at), ..payout.clone() };
                emit::payout_state_changed(&mut t.rail.events, &seen, from);
            }
            t.accounts
                .entry(settlement_account(&currency))
                .or_insert_with(|| system_account(AccountKind::Settlement, &currency, b.at));
            t.ledger.extend(entries);
        }
        if let Some(a) = t.accounts.get_mut(&b.account_id) {
            a.balance_minor = balance_after;
            a.updated_at = b.at;
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

/// Each payout's state and account before a batch (`None`: no such payout).
fn states_before(
    t: &PaydbTables,
    payout_ids: impl Iterator<Item = Uuid>,
) -> Vec<(Uuid, Option<(PayoutState, String)>)> {
    payout_ids.map(|id| (id, t.rail.payouts.get(&id).map(|p| (p.row.state, p.row.account_id.clone())))).collect()
}

/// Reports each payout of a batch to the observer: one [`FencedWrite`] per payout, in the
/// request's order, all carrying the batch's one fence pass
/// ([`PaydbTables::next_batch_pass`]; none for a single write, [`Shape::Single`]) and the
/// request's identity: `Accepted` for a payout it
/// moved, `FencedOut` for every payout of a fenced batch, `Other` for the rest (a refused
/// payout, a replay, a conflict, an unknown account, a store error). The response a
/// committed batch recorded is reported on each of its payouts; a replay's likewise.
#[allow(clippy::too_many_arguments)]
fn report_batch<T: BatchItemOutcome>(
    t: &mut PaydbTables,
    observer: &dyn PaydbObserver,
    (op, layer, shape): (FencedOp, Layer, Shape),
    (account_id, token, owner_id): (&str, i64, &str),
    before: &[(Uuid, Option<(PayoutState, String)>)],
    i: &IdemRequest,
    decided: &Decided<BatchOutcome<T>>,
) {
    let pass = match shape {
        Shape::Single => None,
        Shape::Batch => Some(t.next_batch_pass()),
    };
    for (payout_id, seen) in before {
        let (verdict, recorded, replayed) =
            verdict_of(decided, |o| o.moved_payout(*payout_id), BatchOutcome::fenced_by);
        let write = FencedWrite {
            op,
            payout_id: *payout_id,
            account_id: seen.as_ref().map(|b| b.1.clone()).unwrap_or_default(),
            fence_account: account_id.to_owned(),
            token,
            owner_id: owner_id.to_owned(),
            fenced: !defence::off(layer),
            state_before: seen.as_ref().map(|b| b.0),
            verdict,
            identity: Some(identity(i)),
            recorded,
            replayed,
            admission: None,
            batch_pass: pass,
        };
        observer.fenced_write(t, &write);
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

    async fn create_account(&self, n: &NewAccount, i: &IdemRequest, a: &Answering) -> Decided<CreateAccountOutcome> {
        PaydbTx::do_create_account(&mut *self.lock()?, n, i, a)
    }

    async fn create_payout(&self, p: &NewPayout, i: &IdemRequest, a: &Answering) -> Decided<CreatePayoutOutcome> {
        PaydbTx::do_create_payout(&mut *self.lock()?, p, i, a)
    }

    async fn claim(&self, b: &ClaimBatch, i: &IdemRequest, a: &Answering) -> Decided<ClaimBatchOutcome> {
        let mut t = self.lock()?;
        let Some(observer) = self.observer() else {
            return PaydbTx::do_claim(&mut t, b, i, a);
        };
        let before = states_before(&t, b.payouts.iter().map(|p| p.payout_id));
        let decided = PaydbTx::do_claim(&mut t, b, i, a);
        report_batch(
            &mut t,
            &*observer,
            (FencedOp::Claim, Layer::ClaimFence, a.shape),
            (&b.account_id, b.token, &b.owner_id),
            &before,
            i,
            &decided,
        );
        decided
    }

    async fn post(&self, b: &PostBatch, i: &IdemRequest, a: &Answering) -> Decided<PostBatchOutcome> {
        let mut t = self.lock()?;
        let Some(observer) = self.observer() else {
            return PaydbTx::do_post(&mut t, b, i, a);
        };
        let before = states_before(&t, b.payouts.iter().map(|p| p.payout_id));
        let decided = PaydbTx::do_post(&mut t, b, i, a);
        report_batch(
            &mut t,
            &*observer,
            (FencedOp::Post, Layer::PostFence, a.shape),
            (&b.account_id, b.token, &b.owner_id),
            &before,
            i,
            &decided,
        );
        decided
    }

    async fn abandon(&self, payout_id: Uuid, at: DateTime<Utc>) -> Result<AbandonOutcome, StoreError> {
        let mut t = self.lock()?;
        let t = &mut *t;
        let Some(p) = t.rail.payouts.get_mut(&payout_id) else {
            return Ok(AbandonOutcome::NotFound);
        };
        let state = p.row.state;
        if !payout::may_transition(state, PayoutState::Abandoned, Actor::Operator) {
            return Ok(AbandonOutcome::NotAbandonable { state });
        }
        p.row.state = PayoutState::Abandoned;
        p.updated_at = at;
        let seen = StoredPayout { updated_at: truncate_ms(at), ..p.clone() };
        emit::payout_state_changed(&mut t.rail.events, &seen, state);
        Ok(AbandonOutcome::Abandoned)
    }

    async fn resolve_ambiguous(&self, r: &AmbiguousResolution) -> Result<ResolveOutcome, StoreError> {
        self.lock()?.resolve_ambiguous(r)
    }

    async fn resolve_recorded(
        &self,
        r: &AmbiguousResolution,
        i: &IdemRequest,
        a: &Answering,
    ) -> Decided<ResolveOutcome> {
        PaydbTx::do_resolve_recorded(&mut *self.lock()?, r, i, a)
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

    async fn read_events(&self, after: i64, limit: usize) -> Result<EventRead, StoreError> {
        Ok(self.lock()?.rail.events.read(after, limit))
    }

    async fn purge_events(&self, keep: i64) -> Result<u64, StoreError> {
        Ok(self.lock()?.rail.events.purge(keep))
    }
}

#[cfg(test)]
mod tests;
