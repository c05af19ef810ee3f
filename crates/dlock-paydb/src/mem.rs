//! paydb in memory: every table behind one mutex, with the same semantics as SQL.
//!
//! [`MemPaydb`] stands in for the *database*, not for a service's memory. The
//! payment-resource implements its `PaymentStore` on it, the rail-proxy its `RailStore`, and
//! the reconciler reads it, so in the simulation the services share one paydb exactly as
//! their SQL stores share one database. It outlives every simulated node it serves, and no
//! service caches from it.
//!
//! Invariants (the services' conformance suites hold this to the SQL stores):
//! 1. Each method over [`PaydbTables`] is one transaction: the caller holds the one mutex
//!    around it ([`MemPaydb::lock`]), which is what a serialisable transaction looks like
//!    from outside.
//! 2. A method validates everything before its first write, so a refusal has nothing to
//!    undo. [`guard_transition`] and the CHECK helpers mirror the SQL triggers and CHECKs (a
//!    write they refuse is [`StoreError::Corrupt`], as a trigger error is).
//!
//! **Observer** (simulation only in practice): [`MemPaydb::set_observer`] registers one
//! [`PaydbObserver`], called after every fenced write (claim, post, admission) *inside* the
//! transaction, under the one mutex, with the tables as that write left them. The
//! simulation's oracle uses it to check fence monotonicity at each acceptance, in
//! acceptance order. Unset (the default) it costs one uncontended `Option` read per fenced
//! write; it never changes what a write does. A batch's admission
//! ([`MemPaydb::admit_batch_txn`], C3-extensions E-19) is one transaction reported as one
//! fenced write per payout, each with its own state before and all with the batch's one
//! pass id ([`FencedWrite::batch_pass`]): its fence compared the token once for all of them.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use dlock_contract::payout::{self, Actor, PayoutState};
use dlock_contract::planted::{self, Bug};
use dlock_contract::rail::SubmissionOutcome;
use dlock_contract::stream::EventKind;
use serde_json::json;
use uuid::Uuid;

use crate::admission::{self, AdmissionDecision, AdmissionFacts, BatchFacts, FirstAttempt, PayoutFacts};
use crate::events::MemEvents;
use crate::pay::{
    funding_account, is_system_account, is_unsettled, settlement_account, AccountKind, AccountView,
    AmbiguousResolution, Direction, LedgerEntry, ListQuery, Operation, PayoutSummary, PayoutView, ResolutionRow,
    ResolveOutcome, StoredResponse, SubmissionSummary, RESOLUTION_REASON_CHARS_MIN,
};
use crate::rail::{is_forwardable, Admission, Attempt, NewPayout, PayoutRow, Resolution, SubmissionRow};
use crate::StoreError;

/// One `payouts` row with every column paydb holds (the proxy reads only [`PayoutRow`];
/// the payment-resource's simulation store, which shares these tables, uses the rest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPayout {
    pub row: PayoutRow,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The token of the latest claim (`payouts.claim_token`).
    pub claim_token: Option<i64>,
    pub claimed_by: Option<String>,
    pub claimed_at: Option<DateTime<Utc>>,
}

/// paydb's payouts and rail tables in memory. Each method is one transaction: the caller
/// holds the one mutex around it. Public so that a store sharing paydb (the
/// payment-resource's simulation store) runs the very same admission code.
#[derive(Debug, Default)]
pub struct RailTables {
    pub payouts: BTreeMap<Uuid, StoredPayout>,
    pub high_water: BTreeMap<String, i64>,
    /// In insertion order (the `seq` column).
    pub submissions: Vec<SubmissionRow>,
    /// paydb's `events` outbox (C3-extensions E-20). Here, beside the payouts and the
    /// rail's rows, so that the methods of both table sets reach it; every method that
    /// changes a row a SQL trigger watches emits the trigger's event.
    pub events: MemEvents,
}

fn row(a: &Attempt, outcome: Option<SubmissionOutcome>) -> SubmissionRow {
    SubmissionRow {
        submission_id: a.submission_id,
        payout_id: a.payout_id,
        account_id: a.account_id.clone(),
        presented_token: a.presented_token,
        owner_id: a.owner_id.clone(),
        idempotency_key: a.idempotency_key.clone(),
        amount_minor: a.amount_minor,
        currency: a.currency.clone(),
        outcome,
        outcome_detail: None,
        rail_reference: None,
        submitted_at: a.at,
        resolved_at: outcome.map(|_| a.at),
    }
}

/// The events paydb's triggers write (`migrations/paydb/*/20261207100000_create_events.sql`),
/// as the memory tables emit them: the same kind, `at` (the column the trigger copies),
/// account, payout and body. Each is called after the write it describes, in the order the
/// SQL statements would fire the triggers.
pub mod emit {
    use super::*;

    /// `account.created` (CUSTOMER accounts only: the caller inserts one).
    pub fn account_created(ev: &mut MemEvents, account_id: &str, a: &StoredAccount) {
        if a.kind != AccountKind::Customer {
            return;
        }
        let body = json!({ "currency": a.currency, "balanceMinor": a.balance_minor });
        ev.emit(EventKind::AccountCreated, a.created_at, Some(account_id), None, body);
    }

    /// `fence.raised`, when the fence changed (`updated_at` = `at`).
    pub fn fence_raised(ev: &mut MemEvents, account_id: &str, previous: i64, fence: i64, at: DateTime<Utc>) {
        if previous != fence {
            let body = json!({ "previousFence": previous, "presentedToken": fence });
            ev.emit(EventKind::FenceRaised, at, Some(account_id), None, body);
        }
    }

    /// `payout.created`.
    pub fn payout_created(ev: &mut MemEvents, p: &StoredPayout) {
        let body = json!({
            "amountMinor": p.row.amount_minor,
            "currency": p.row.currency,
            "beneficiaryRef": p.row.beneficiary_ref,
            "state": p.row.state.as_str(),
        });
        ev.emit(
            EventKind::PayoutCreated,
            p.created_at,
            Some(&p.row.account_id),
            Some(p.row.payout_id.to_string()),
            body,
        );
    }

    /// `payout.state_changed`, when the state changed (`from` the state before the write).
    pub fn payout_state_changed(ev: &mut MemEvents, p: &StoredPayout, from: PayoutState) {
        if from == p.row.state {
            return;
        }
        let body = json!({
            "from": from.as_str(),
            "to": p.row.state.as_str(),
            "attemptCount": p.row.attempt_count,
            "claimToken": p.claim_token,
        });
        let payout_id = Some(p.row.payout_id.to_string());
        ev.emit(EventKind::PayoutStateChanged, p.updated_at, Some(&p.row.account_id), payout_id, body);
    }

    /// `rail.mark_raised`, when the mark changed (`previous` `None`: the row is inserted).
    pub fn mark_raised(ev: &mut MemEvents, account_id: &str, previous: Option<i64>, mark: i64, at: DateTime<Utc>) {
        if previous != Some(mark) {
            let body = json!({ "previousMark": previous.unwrap_or(0), "presentedToken": mark });
            ev.emit(EventKind::RailMarkRaised, at, Some(account_id), None, body);
        }
    }

    /// `rail.intent` (outcome NULL) or `rail.refused`, for an inserted attempt row.
    pub fn submission_inserted(ev: &mut MemEvents, s: &SubmissionRow) {
        let kind = if s.outcome.is_none() { EventKind::RailIntent } else { EventKind::RailRefused };
        let body = json!({
            "submissionId": s.submission_id.to_string(),
            "presentedToken": s.presented_token,
            "ownerId": s.owner_id,
            "amountMinor": s.amount_minor,
            "currency": s.currency,
            "outcome": s.outcome.map(SubmissionOutcome::as_str),
        });
        ev.emit(kind, s.submitted_at, Some(&s.account_id), Some(s.payout_id.to_string()), body);
    }

    /// `rail.outcome`, for an attempt whose outcome was just recorded.
    pub fn submission_resolved(ev: &mut MemEvents, s: &SubmissionRow) {
        let body = json!({
            "submissionId": s.submission_id.to_string(),
            "presentedToken": s.presented_token,
            "outcome": s.outcome.map(SubmissionOutcome::as_str),
            "railReference": s.rail_reference,
        });
        let at = s.resolved_at.unwrap_or(s.submitted_at);
        ev.emit(EventKind::RailOutcome, at, Some(&s.account_id), Some(s.payout_id.to_string()), body);
    }

    /// `operator.resolution`, for an inserted audit row (`account_id`: its payout's).
    pub fn resolution_inserted(ev: &mut MemEvents, account_id: Option<&str>, r: &ResolutionRow) {
        let body = json!({
            "resolutionId": r.resolution_id.to_string(),
            "resolvedAs": r.resolved_as.as_str(),
            "operator": r.operator,
            "reason": r.reason,
            "railReference": r.rail_reference,
        });
        ev.emit(EventKind::OperatorResolution, r.resolved_at, account_id, Some(r.payout_id.to_string()), body);
    }
}

/// What one fence pass covers of each payout of a batch: its account, the token, the owner,
/// the fencing switch, and the payout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassKey<'a> {
    pub account_id: &'a str,
    pub presented_token: i64,
    pub owner_id: &'a str,
    pub fencing_enabled: bool,
    pub payout_id: Uuid,
}

impl<'a> From<&'a Attempt> for PassKey<'a> {
    fn from(a: &'a Attempt) -> PassKey<'a> {
        PassKey {
            account_id: &a.account_id,
            presented_token: a.presented_token,
            owner_id: &a.owner_id,
            fencing_enabled: a.fencing_enabled,
            payout_id: a.payout_id,
        }
    }
}

/// A batch shares one account, token, owner and fencing switch, and names each payout once
/// (C3-extensions E-19): what one fence pass covers. Else [`StoreError::Corrupt`]: the
/// caller broke the batch's shape (a store checks it before its first write).
pub fn one_pass<'a>(keys: impl IntoIterator<Item = PassKey<'a>>) -> Result<(), StoreError> {
    let mut first: Option<PassKey<'a>> = None;
    let mut seen = std::collections::BTreeSet::new();
    for k in keys {
        let f = *first.get_or_insert(k);
        let same = (k.account_id, k.presented_token, k.owner_id, k.fencing_enabled)
            == (f.account_id, f.presented_token, f.owner_id, f.fencing_enabled);
        if !same || !seen.insert(k.payout_id) {
            return Err(StoreError::Corrupt(format!(
                "a batch is one account, one token, one owner and each payout once; payout {} is not",
                k.payout_id
            )));
        }
    }
    Ok(())
}

impl RailTables {
    pub fn payout(&self, payout_id: Uuid) -> Option<PayoutRow> {
        self.payouts.get(&payout_id).map(|p| p.row.clone())
    }

    /// What the transaction reads of `a`'s payout: its forwardable attempt and its state.
    fn payout_facts(&self, a: &Attempt) -> PayoutFacts {
        let first_forwardable = self
            .submissions
            .iter()
            .find(|s| s.payout_id == a.payout_id && is_forwardable(s.outcome))
            .map(|s| FirstAttempt { submission_id: s.submission_id, submitted_at: s.submitted_at });
        PayoutFacts { first_forwardable, state: self.payouts.get(&a.payout_id).map(|p| p.row.state) }
    }

    /// Applies one payout's decision (its row, its move), not the mark: the caller writes the
    /// mark once ([`RailTables::write_mark`]). `Vanished` is ruled out before the first write.
    fn apply(&mut self, a: &Attempt, decision: &AdmissionDecision) {
        match decision {
            AdmissionDecision::Fenced { .. } => self.submissions.push(row(a, Some(SubmissionOutcome::Fenced))),
            AdmissionDecision::Duplicate { .. } => self.submissions.push(row(a, Some(SubmissionOutcome::Duplicate))),
            AdmissionDecision::NotClaimable { .. } | AdmissionDecision::Vanished => {}
            AdmissionDecision::Admit { .. } => {
                if let Some(payout) = self.payouts.get_mut(&a.payout_id) {
                    payout.row.state = PayoutState::Submitted;
                    payout.row.attempt_count += 1;
                    payout.updated_at = a.at;
                }
                self.submissions.push(row(a, None));
            }
        }
    }

    /// Writes the account's mark for `decisions`, once: `mark` when one of them passed step
    /// 1 (as the rule decided it). Planted bug `mark-after-call` (simulation only): the mark
    /// is not written with the intents, but in `resolve`, after the forward returned (a
    /// duplicate still writes it).
    fn write_mark(&mut self, account_id: &str, mark: Option<i64>, decisions: &[AdmissionDecision]) {
        let duplicate = decisions.iter().any(|d| matches!(d, AdmissionDecision::Duplicate { .. }));
        if let Some(m) = mark.filter(|_| duplicate || !planted::on(Bug::MarkAfterCall)) {
            self.high_water.insert(account_id.to_owned(), m);
        }
    }

    /// Steps 1–3, as [`RailStore::admit`].
    pub fn admit(&mut self, a: &Attempt) -> Result<Admission, StoreError> {
        // One snapshot of every fact steps 1–3 decide on; the admission rule decides.
        let p = self.payout_facts(a);
        let decision = admission::decide_admission(&AdmissionFacts {
            fencing_enabled: a.fencing_enabled,
            mark: self.high_water.get(&a.account_id).copied(),
            presented_token: a.presented_token,
            first_forwardable: p.first_forwardable,
            state: p.state,
        });
        let Some(answer) = decision.admission(a.at) else {
            return Err(StoreError::Corrupt(format!("payout {} vanished", a.payout_id)));
        };
        let mark_before = self.high_water.get(&a.account_id).copied();
        self.apply(a, &decision);
        let mark = match decision {
            AdmissionDecision::Duplicate { mark, .. } | AdmissionDecision::Admit { mark } => mark,
            _ => None,
        };
        self.write_mark(&a.account_id, mark, std::slice::from_ref(&decision));
        self.emit_admissions(std::slice::from_ref(a), std::slice::from_ref(&decision), &[p.state], mark_before);
        Ok(answer)
    }

    /// The events of one fence pass's writes ([`RailTables::admit`], [`RailTables::admit_batch`]),
    /// in the order the SQL statements fire their triggers: the mark (its instant the first
    /// attempt's), every intent, every payout moved to SUBMITTED, then the refused rows
    /// (FENCED, DUPLICATE), each group in the attempts' order.
    fn emit_admissions(
        &mut self,
        attempts: &[Attempt],
        decisions: &[AdmissionDecision],
        states_before: &[Option<PayoutState>],
        mark_before: Option<i64>,
    ) {
        let Some(first) = attempts.first() else { return };
        if let Some(&mark) = self.high_water.get(&first.account_id) {
            emit::mark_raised(&mut self.events, &first.account_id, mark_before, mark, first.at);
        }
        let admitted = |d: &AdmissionDecision| matches!(d, AdmissionDecision::Admit { .. });
        let refused =
            |d: &AdmissionDecision| matches!(d, AdmissionDecision::Fenced { .. } | AdmissionDecision::Duplicate { .. });
        for (a, _) in attempts.iter().zip(decisions).filter(|(_, d)| admitted(d)) {
            if let Some(row) = self.submissions.iter().rev().find(|s| s.submission_id == a.submission_id) {
                emit::submission_inserted(&mut self.events, row);
            }
        }
        for ((a, _), before) in attempts.iter().zip(decisions).zip(states_before).filter(|((_, d), _)| admitted(d)) {
            if let (Some(p), Some(from)) = (self.payouts.get(&a.payout_id), before) {
                emit::payout_state_changed(&mut self.events, p, *from);
            }
        }
        for (a, _) in attempts.iter().zip(decisions).filter(|(_, d)| refused(d)) {
            if let Some(row) = self.submissions.iter().rev().find(|s| s.submission_id == a.submission_id) {
                emit::submission_inserted(&mut self.events, row);
            }
        }
    }

    /// Steps 1–3 of a batch (C3-extensions E-19), as the proxy's `RailStore::admit_batch`
    /// after its validation: `attempts` are validated and stamped, of one account, under one
    /// token, owner and fencing switch, each payout once (else [`StoreError::Corrupt`],
    /// nothing written). One snapshot, one [`admission::decide_batch_admission`], every
    /// decision applied and the mark written once; the answers in `attempts`' order.
    pub fn admit_batch(&mut self, attempts: &[Attempt]) -> Result<Vec<Admission>, StoreError> {
        let Some(first) = attempts.first() else { return Ok(Vec::new()) };
        one_pass(attempts.iter().map(PassKey::from))?;
        let facts = BatchFacts {
            fencing_enabled: first.fencing_enabled,
            mark: self.high_water.get(&first.account_id).copied(),
            presented_token: first.presented_token,
            payouts: attempts.iter().map(|a| self.payout_facts(a)).collect(),
        };
        let batch = admission::decide_batch_admission(&facts);
        // Every answer before the first write: a vanished payout refuses the whole batch.
        let answers = attempts
            .iter()
            .zip(&batch.decisions)
            .map(|(a, d)| {
                d.admission(a.at).ok_or_else(|| StoreError::Corrupt(format!("payout {} vanished", a.payout_id)))
            })
            .collect::<Result<Vec<Admission>, StoreError>>()?;
        let states_before: Vec<Option<PayoutState>> = facts.payouts.iter().map(|p| p.state).collect();
        for (a, d) in attempts.iter().zip(&batch.decisions) {
            self.apply(a, d);
        }
        self.write_mark(&first.account_id, batch.mark, &batch.decisions);
        self.emit_admissions(attempts, &batch.decisions, &states_before, facts.mark);
        Ok(answers)
    }

    /// Every outcome of a batch's forwards, as the proxy's `RailStore::resolve_batch`: each
    /// exactly as [`RailTables::resolve`] records it (a no-op when already resolved), all or
    /// none (an unknown submission refuses them all before the first write), one after the
    /// other (each outcome, then the payout it moves).
    pub fn resolve_batch(&mut self, outcomes: &[(Uuid, Resolution)], at: DateTime<Utc>) -> Result<(), StoreError> {
        if let Some((missing, _)) =
            outcomes.iter().find(|(id, _)| !self.submissions.iter().any(|s| s.submission_id == *id))
        {
            return Err(StoreError::Corrupt(format!("no submission {missing}")));
        }
        for (id, r) in outcomes {
            self.resolve(*id, r, at)?;
        }
        Ok(())
    }

    /// As [`RailStore::resolve`].
    pub fn resolve(&mut self, submission_id: Uuid, r: &Resolution, at: DateTime<Utc>) -> Result<(), StoreError> {
        if let Some(payout_id) = self.record_outcome(submission_id, r, at)? {
            self.move_resolved(payout_id, r.payout_state(), at);
        }
        Ok(())
    }

    /// A resolution's first write: the outcome on its attempt, if still unresolved (its
    /// payout's id back), else nothing.
    fn record_outcome(
        &mut self,
        submission_id: Uuid,
        r: &Resolution,
        at: DateTime<Utc>,
    ) -> Result<Option<Uuid>, StoreError> {
        let t = self;
        let Some(s) = t.submissions.iter_mut().find(|s| s.submission_id == submission_id) else {
            return Err(StoreError::Corrupt(format!("no submission {submission_id}")));
        };
        if s.outcome.is_some() {
            return Ok(None);
        }
        s.outcome = Some(r.outcome());
        s.outcome_detail = r.detail().map(str::to_owned);
        s.rail_reference = r.rail_reference().map(str::to_owned);
        s.resolved_at = Some(at);
        let payout_id = s.payout_id;
        emit::submission_resolved(&mut t.events, s);
        if planted::on(Bug::MarkAfterCall) {
            // Planted bug `mark-after-call`: the mark the intent should have written, now.
            let (account, token) = (s.account_id.clone(), s.presented_token);
            let before = t.high_water.get(&account).copied();
            let m = t.high_water.entry(account.clone()).or_insert(token);
            *m = (*m).max(token);
            let after = *m;
            emit::mark_raised(&mut t.events, &account, before, after, at);
        }
        Ok(Some(payout_id))
    }

    /// A resolution's second write: its payout out of SUBMITTED, by C2's rule for the proxy.
    fn move_resolved(&mut self, payout_id: Uuid, to: PayoutState, at: DateTime<Utc>) {
        if let Some(p) = self.payouts.get_mut(&payout_id) {
            if payout::may_transition(p.row.state, to, Actor::RailProxy) {
                let from = p.row.state;
                p.row.state = to;
                p.updated_at = at;
                emit::payout_state_changed(&mut self.events, p, from);
            }
        }
    }

    /// As [`RailStore::unresolved_before`].
    pub fn unresolved_before(&self, before: DateTime<Utc>, limit: i64) -> Vec<Uuid> {
        let mut rows: Vec<&SubmissionRow> =
            self.submissions.iter().filter(|s| s.outcome.is_none() && s.submitted_at < before).collect();
        rows.sort_by_key(|s| s.submitted_at);
        rows.into_iter().take(usize::try_from(limit).unwrap_or(0)).map(|s| s.submission_id).collect()
    }

    pub fn submissions_of(&self, payout_id: Option<Uuid>) -> Vec<SubmissionRow> {
        self.submissions.iter().filter(|s| payout_id.is_none_or(|p| s.payout_id == p)).cloned().collect()
    }

    /// As [`RailStore::insert_payout`], on the rail's tables alone (the proxy's simulation
    /// store, which keeps no `accounts`): the account exists from its first payout, so that
    /// payout's insert is what writes its `account.created` (balance 0, as the SQL store's
    /// upsert), before the payout's own event.
    pub fn insert_payout(&mut self, p: &NewPayout, at: DateTime<Utc>) -> Result<(), StoreError> {
        let new_account = !self.payouts.values().any(|q| q.row.account_id == p.account_id);
        self.insert_payout_row(p, at)?;
        if new_account {
            let at = dlock_contract::time::truncate_ms(at);
            let account = StoredAccount {
                kind: AccountKind::Customer,
                currency: p.currency.clone(),
                balance_minor: 0,
                fence: 0,
                created_at: at,
                updated_at: at,
            };
            emit::account_created(&mut self.events, &p.account_id, &account);
        }
        if let Some(stored) = self.payouts.get(&p.payout_id) {
            emit::payout_created(&mut self.events, stored);
        }
        Ok(())
    }

    /// The `payouts` row of [`RailTables::insert_payout`], without its events. Fails,
    /// changing nothing, if the payout exists.
    fn insert_payout_row(&mut self, p: &NewPayout, at: DateTime<Utc>) -> Result<(), StoreError> {
        if self.payouts.contains_key(&p.payout_id) {
            return Err(StoreError::Corrupt(format!("payout {} exists", p.payout_id)));
        }
        let row = PayoutRow {
            payout_id: p.payout_id,
            account_id: p.account_id.clone(),
            amount_minor: p.amount_minor,
            currency: p.currency.clone(),
            beneficiary_ref: p.beneficiary_ref.clone(),
            state: p.state,
            attempt_count: 0,
        };
        let at = dlock_contract::time::truncate_ms(at);
        self.payouts.insert(
            p.payout_id,
            StoredPayout { row, created_at: at, updated_at: at, claim_token: None, claimed_by: None, claimed_at: None },
        );
        Ok(())
    }
}

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
    /// `reconciler_findings`: the reconciler's open findings.
    pub findings: crate::findings::MemFindings,
    /// The last batch fence pass drawn ([`PaydbTables::next_batch_pass`]; not a table:
    /// what tells the observer which fenced writes one batch's single pass covered).
    pub batch_passes: u64,
}

impl PaydbTables {
    /// The reconciler records one run's findings (one transaction: the open rows and their
    /// events).
    pub fn record_findings(
        &mut self,
        run: &crate::findings::FindingsRun,
    ) -> Result<crate::findings::RecordOutcome, StoreError> {
        self.findings.record(&mut self.rail.events, run)
    }

    /// A fresh id for one batch's fence pass (C3-extensions E-19): every payout of the
    /// batch is reported with it ([`FencedWrite::batch_pass`]).
    pub fn next_batch_pass(&mut self) -> u64 {
        self.batch_passes += 1;
        self.batch_passes
    }
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
    /// The resource accepted the write under its token (the fence or mark passed and now
    /// equals it; for an admission with the rail's fence off, the token was never compared).
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
    /// The payout's account (empty when the payout does not exist); for an admission, the
    /// account the attempt names (validated against the payout's before step 1).
    pub account_id: String,
    /// The account whose fence (or mark) judged the token: the payout's own for a single
    /// write, the account a batch named (C3-extensions E-19) for each of its payouts.
    pub fence_account: String,
    pub token: i64,
    pub owner_id: String,
    /// The resource compared the token (false only for an admission with
    /// `rail.proxy.fencing.enabled = false`).
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
    /// The batch (C3-extensions E-19) whose one fence pass this payout's write shared, its
    /// id from [`PaydbTables::next_batch_pass`]; `None` for a single write. Every payout of
    /// a batch carries the batch's one token: the fence compared it once, for all of them.
    pub batch_pass: Option<u64>,
}

/// Sees every fenced write inside its transaction (see the module doc). It is called under
/// paydb's mutex: it must not call back into the store.
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

/// The observer's record of one admission: `answer` is what it came to (`None`: the
/// store failed), `batch_pass` the batch whose one fence pass it shared.
fn admit_write(
    a: &Attempt,
    state_before: Option<PayoutState>,
    answer: Option<&Admission>,
    batch_pass: Option<u64>,
) -> FencedWrite {
    let (verdict, admission) = match answer {
        Some(Admission::Admitted { .. }) => (FenceVerdictSeen::Accepted, "admitted"),
        // Step 1 passed and the mark rose; step 2 refused the repeat.
        Some(Admission::Duplicate { .. }) => (FenceVerdictSeen::Accepted, "duplicate"),
        Some(Admission::Fenced { highest_token }) => {
            (FenceVerdictSeen::FencedOut { highest_token: *highest_token }, "fenced")
        }
        Some(Admission::NotClaimable { .. }) => (FenceVerdictSeen::Other, "not_claimable"),
        None => (FenceVerdictSeen::Other, "error"),
    };
    FencedWrite {
        op: FencedOp::Admit,
        payout_id: a.payout_id,
        account_id: a.account_id.clone(),
        fence_account: a.account_id.clone(),
        token: a.presented_token,
        owner_id: a.owner_id.clone(),
        fenced: a.fencing_enabled && !dlock_contract::defence::off(dlock_contract::defence::Layer::RailMark),
        state_before,
        verdict,
        identity: None,
        recorded: None,
        replayed: None,
        admission: Some(admission),
        batch_pass,
    }
}

/// In-memory paydb, shared by the payment-resource and the rail-proxy.
#[derive(Debug, Default)]
pub struct MemPaydb {
    tables: Mutex<PaydbTables>,
    observer: ObserverSlot,
}

const POISONED: &str = "simulation store poisoned";

impl MemPaydb {
    pub fn new() -> MemPaydb {
        MemPaydb::default()
    }

    /// Takes the one mutex: one transaction over every table.
    pub fn lock(&self) -> Result<MutexGuard<'_, PaydbTables>, StoreError> {
        self.tables.lock().map_err(|_| StoreError::Corrupt(POISONED.into()))
    }

    /// Registers the one observer of fenced writes (replacing any earlier one).
    pub fn set_observer(&self, observer: std::sync::Arc<dyn PaydbObserver>) {
        if let Ok(mut slot) = self.observer.0.write() {
            *slot = Some(observer);
        }
    }

    /// The observer, if one is registered (the stores built on these tables report their
    /// fenced writes to it).
    pub fn observer(&self) -> Option<std::sync::Arc<dyn PaydbObserver>> {
        self.observer.0.read().ok().and_then(|o| o.clone())
    }

    /// The proxy's steps 1–3 as one transaction ([`RailTables::admit`]), reported to the
    /// observer if one is registered.
    pub fn admit_txn(&self, attempt: &Attempt) -> Result<Admission, StoreError> {
        let mut t = self.lock()?;
        let Some(observer) = self.observer() else {
            return t.rail.admit(attempt);
        };
        let state_before = t.rail.payouts.get(&attempt.payout_id).map(|p| p.row.state);
        let admitted = t.rail.admit(attempt);
        observer.fenced_write(&t, &admit_write(attempt, state_before, admitted.as_ref().ok(), None));
        admitted
    }

    /// A batch's validation and steps 1–3 as one transaction (C3-extensions E-19):
    /// `prepare` validates and stamps the batch on the tables as this transaction reads them
    /// (the attempts to admit, and whatever else its caller needs back), then
    /// [`RailTables::admit_batch`] decides them with one fence pass. Each payout's fenced
    /// write is reported to the observer, if one is registered, with its own state before
    /// and the batch's one pass id ([`PaydbTables::next_batch_pass`]).
    pub fn admit_batch_txn<T>(
        &self,
        prepare: impl FnOnce(&RailTables) -> (Vec<Attempt>, T),
    ) -> Result<(Vec<Admission>, T), StoreError> {
        let mut t = self.lock()?;
        let (attempts, prepared) = prepare(&t.rail);
        if attempts.is_empty() {
            return Ok((Vec::new(), prepared));
        }
        let Some(observer) = self.observer() else {
            return t.rail.admit_batch(&attempts).map(|a| (a, prepared));
        };
        let states_before: Vec<Option<PayoutState>> =
            attempts.iter().map(|a| t.rail.payouts.get(&a.payout_id).map(|p| p.row.state)).collect();
        let admitted = t.rail.admit_batch(&attempts);
        let pass = t.next_batch_pass();
        for (i, (a, state_before)) in attempts.iter().zip(states_before).enumerate() {
            let answer = admitted.as_ref().ok().and_then(|answers| answers.get(i));
            observer.fenced_write(&t, &admit_write(a, state_before, answer, Some(pass)));
        }
        admitted.map(|a| (a, prepared))
    }

    /// Every outcome of a batch's forwards as one transaction ([`RailTables::resolve_batch`]).
    pub fn resolve_batch_txn(&self, outcomes: &[(Uuid, Resolution)], at: DateTime<Utc>) -> Result<(), StoreError> {
        self.lock()?.rail.resolve_batch(outcomes, at)
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

/// Σ amount of `account_id`'s unsettled payouts, other than `except`.
pub fn reserved_minor(t: &PaydbTables, account_id: &str, except: Option<Uuid>) -> i128 {
    t.rail
        .payouts
        .values()
        .filter(|p| p.row.account_id == account_id && Some(p.row.payout_id) != except && is_unsettled(p.row.state))
        .map(|p| i128::from(p.row.amount_minor))
        .sum()
}

/// Σ CREDIT − Σ DEBIT over `account_id`'s entries.
pub fn ledger_sum_minor(t: &PaydbTables, account_id: &str) -> i128 {
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
pub fn bigint(v: i128) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Corrupt(format!("sum {v} overflows BIGINT")))
}

pub fn account_view(t: &PaydbTables, account_id: &str, a: &StoredAccount) -> Result<AccountView, StoreError> {
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

pub fn payout_view(t: &PaydbTables, p: &StoredPayout) -> PayoutView {
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

pub fn system_account(kind: AccountKind, currency: &str, at: DateTime<Utc>) -> StoredAccount {
    StoredAccount { kind, currency: currency.to_owned(), balance_minor: 0, fence: 0, created_at: at, updated_at: at }
}

/// Upserts (`ON CONFLICT DO NOTHING`) the currency's two system accounts.
pub fn upsert_system_accounts(t: &mut PaydbTables, currency: &str, at: DateTime<Utc>) {
    t.accounts.entry(funding_account(currency)).or_insert_with(|| system_account(AccountKind::Funding, currency, at));
    t.accounts
        .entry(settlement_account(currency))
        .or_insert_with(|| system_account(AccountKind::Settlement, currency, at));
}

/// paydb's reads and the operator's resolution, over the tables (each one transaction under
/// [`MemPaydb::lock`]); the services' stores and the reconciler call these.
impl PaydbTables {
    /// The resolutions audit trail, all or one payout's, in (`resolved_at`, `resolution_id`)
    /// order.
    pub fn resolutions(&self, payout_id: Option<Uuid>) -> Vec<ResolutionRow> {
        let mut rows: Vec<ResolutionRow> =
            self.resolutions.iter().filter(|r| payout_id.is_none_or(|p| r.payout_id == p)).cloned().collect();
        rows.sort_by_key(|r| (r.resolved_at, r.resolution_id));
        rows
    }

    /// P4: the payout with its attempts.
    pub fn payout_view(&self, payout_id: Uuid) -> Option<PayoutView> {
        self.rail.payouts.get(&payout_id).map(|p| payout_view(self, p))
    }

    /// P5, system accounts included.
    pub fn account(&self, account_id: &str) -> Result<Option<AccountView>, StoreError> {
        self.accounts.get(account_id).map(|a| account_view(self, account_id, a)).transpose()
    }

    /// Every account, in `account_id` order.
    pub fn account_views(&self) -> Result<Vec<AccountView>, StoreError> {
        self.accounts.iter().map(|(id, a)| account_view(self, id, a)).collect()
    }

    /// P1: at most `q.limit` rows.
    pub fn list(&self, q: &ListQuery) -> Vec<PayoutSummary> {
        let mut rows: Vec<&StoredPayout> = self
            .rail
            .payouts
            .values()
            .filter(|p| {
                p.row.state == q.state
                    && q.account_id.as_ref().is_none_or(|a| *a == p.row.account_id)
                    && p.created_at <= q.snapshot
                    && q.created_after.is_none_or(|t| p.created_at > t)
                    && q.after.is_none_or(|after| (p.created_at, p.row.payout_id) > after)
            })
            .collect();
        rows.sort_by_key(|p| (p.created_at, p.row.payout_id));
        let limit = usize::try_from(q.limit).unwrap_or(0);
        rows.into_iter()
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
            .collect()
    }

    /// Ledger entries, all or one account's, in (`created_at`, `entry_id`) order.
    pub fn ledger_of(&self, account_id: Option<&str>) -> Vec<LedgerEntry> {
        let mut entries: Vec<LedgerEntry> =
            self.ledger.iter().filter(|e| account_id.is_none_or(|a| e.account_id == a)).cloned().collect();
        entries.sort_by_key(|e| (e.created_at, e.entry_id));
        entries
    }

    /// The mark for an account, if it was ever set.
    pub fn high_water(&self, account_id: &str) -> Option<i64> {
        self.rail.high_water.get(account_id).copied()
    }

    /// `dlock resolve`: RAIL_AMBIGUOUS -> POSTED | FAILED with its audit row (the
    /// payment-resource's `resolve_ambiguous`).
    pub fn resolve_ambiguous(&mut self, r: &AmbiguousResolution) -> Result<ResolveOutcome, StoreError> {
        let t = self;
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
            crate::ledger::balance_after_debit(balance, amount).map_err(|e| StoreError::Corrupt(e.to_string()))?
        } else {
            balance
        };
        // Writes: payout, then (POSTED) entries and balance, then the audit row.
        if let Some(p) = t.rail.payouts.get_mut(&r.payout_id) {
            let from = p.row.state;
            p.row.state = r.resolved_as;
            p.updated_at = at;
            emit::payout_state_changed(&mut t.rail.events, p, from);
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
        let row = r.row(at);
        emit::resolution_inserted(&mut t.rail.events, Some(&account_id), &row);
        t.resolutions.push(row);
        Ok(ResolveOutcome::Resolved { state: r.resolved_as, balance_minor: balance_after })
    }

    /// Inserts a payout, and a zero-balance CUSTOMER account in its currency if none exists,
    /// as the SQL store does (seeded payouts bypass the funds check: dev and tests only).
    pub fn insert_payout(&mut self, p: &NewPayout, at: DateTime<Utc>) -> Result<(), StoreError> {
        let t = self;
        if is_system_account(&p.account_id) {
            return Err(StoreError::Corrupt(format!("accounts: {:?} is not a CUSTOMER id", p.account_id)));
        }
        if p.currency.chars().count() != 3 {
            return Err(StoreError::Corrupt(format!("currency {:?} is not 3 characters", p.currency)));
        }
        // Fails, changing nothing, if the payout exists.
        t.rail.insert_payout_row(p, at)?;
        let at = dlock_contract::time::truncate_ms(at);
        // The account first (`ON CONFLICT DO NOTHING`), then the payout, as the SQL store.
        if !t.accounts.contains_key(&p.account_id) {
            let account = StoredAccount {
                kind: AccountKind::Customer,
                currency: p.currency.clone(),
                balance_minor: 0,
                fence: 0,
                created_at: at,
                updated_at: at,
            };
            emit::account_created(&mut t.rail.events, &p.account_id, &account);
            t.accounts.insert(p.account_id.clone(), account);
        }
        if let Some(stored) = t.rail.payouts.get(&p.payout_id) {
            emit::payout_created(&mut t.rail.events, stored);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records every fenced write it sees.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<FencedWrite>>);

    impl PaydbObserver for Recorder {
        fn fenced_write(&self, _tables: &PaydbTables, write: &FencedWrite) {
            if let Ok(mut w) = self.0.lock() {
                w.push(write.clone());
            }
        }
    }

    fn seeded(db: &MemPaydb, state: PayoutState) -> Uuid {
        let id = Uuid::new_v4();
        let p = NewPayout {
            payout_id: id,
            account_id: "acct-1".into(),
            amount_minor: 100,
            currency: "EUR".into(),
            beneficiary_ref: "b".into(),
            state,
        };
        db.with_tables(|t| t.insert_payout(&p, DateTime::<Utc>::UNIX_EPOCH)).expect("lock").expect("insert");
        id
    }

    fn attempt_of(payout_id: Uuid, token: i64) -> Attempt {
        Attempt {
            submission_id: Uuid::new_v4(),
            payout_id,
            account_id: "acct-1".into(),
            presented_token: token,
            owner_id: "w-1".into(),
            idempotency_key: format!("payout:{payout_id}"),
            amount_minor: 100,
            currency: "EUR".into(),
            at: DateTime::<Utc>::UNIX_EPOCH,
            fencing_enabled: true,
        }
    }

    /// The observer sees each payout of a batch as its own fenced write, with its own state
    /// before, all under the batch's one pass id; a single admission carries none.
    #[test]
    fn a_batch_reports_each_payouts_fenced_write_under_one_pass() {
        let db = MemPaydb::new();
        let recorder = std::sync::Arc::new(Recorder::default());
        db.set_observer(recorder.clone());
        let (claimed, pending) = (seeded(&db, PayoutState::Claimed), seeded(&db, PayoutState::Pending));
        let attempts = vec![attempt_of(claimed, 5), attempt_of(pending, 5)];
        let (answers, extra) = db.admit_batch_txn(|_| (attempts.clone(), "prepared")).expect("batch");
        assert_eq!(extra, "prepared");
        assert!(matches!(answers[..], [Admission::Admitted { .. }, Admission::NotClaimable { .. }]), "{answers:?}");
        let later = seeded(&db, PayoutState::Claimed);
        db.admit_txn(&attempt_of(later, 6)).expect("single");
        let seen = recorder.0.lock().expect("writes").clone();
        let summary: Vec<_> =
            seen.iter().map(|w| (w.payout_id, w.state_before, w.admission, w.batch_pass, w.token)).collect();
        assert_eq!(
            summary,
            vec![
                (claimed, Some(PayoutState::Claimed), Some("admitted"), Some(1), 5),
                (pending, Some(PayoutState::Pending), Some("not_claimable"), Some(1), 5),
                (later, Some(PayoutState::Claimed), Some("admitted"), None, 6),
            ]
        );
        assert_eq!(db.with_tables(|t| t.high_water("acct-1")).expect("lock"), Some(6));
    }

    /// A batch that is not one pass (two tokens, or a payout twice) is refused before any
    /// write.
    #[test]
    fn a_batch_that_is_not_one_pass_writes_nothing() {
        let db = MemPaydb::new();
        let (a, b) = (seeded(&db, PayoutState::Claimed), seeded(&db, PayoutState::Claimed));
        for attempts in [vec![attempt_of(a, 5), attempt_of(b, 6)], vec![attempt_of(a, 5), attempt_of(a, 5)]] {
            let refused = db.admit_batch_txn(|_| (attempts.clone(), ()));
            assert!(matches!(refused, Err(StoreError::Corrupt(_))), "{refused:?}");
        }
        let (marks, rows) = db.with_tables(|t| (t.high_water("acct-1"), t.rail.submissions.len())).expect("lock");
        assert_eq!((marks, rows), (None, 0));
    }

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
