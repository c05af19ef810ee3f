//! The simulation store: paydb's rail tables in memory, with the same semantics as SQL.
//!
//! It stands in for the *database*, not for the proxy's memory: in the simulation it
//! outlives every proxy node it serves (a killed and restarted proxy finds its marks where
//! it left them), exactly as paydb outlives a proxy process. The proxy never caches from it.
//!
//! Each method takes the one mutex for its whole body, which is what a serialisable
//! transaction looks like from outside. The conformance suite holds it to the SQL stores.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dlock_contract::payout::{self, Actor, PayoutState};
use dlock_contract::rail::SubmissionOutcome;
use uuid::Uuid;

use crate::admission::{self, AdmissionDecision, AdmissionFacts, FirstAttempt};
use crate::store::{
    is_forwardable, Admission, Attempt, NewPayout, PayoutRow, RailStore, Resolution, StoreError, SubmissionRow,
};

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
}

/// In-memory paydb (payouts and rail tables).
#[derive(Debug, Default)]
pub struct MemRailStore {
    tables: Mutex<RailTables>,
}

impl MemRailStore {
    pub fn new() -> MemRailStore {
        MemRailStore::default()
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, RailTables>, StoreError> {
        self.tables.lock().map_err(|_| StoreError::Corrupt("simulation store poisoned".into()))
    }
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

impl RailTables {
    pub fn payout(&self, payout_id: Uuid) -> Option<PayoutRow> {
        self.payouts.get(&payout_id).map(|p| p.row.clone())
    }

    /// Steps 1–3, as [`RailStore::admit`].
    pub fn admit(&mut self, a: &Attempt) -> Result<Admission, StoreError> {
        let t = self;
        // One snapshot of every fact steps 1–3 decide on; the admission rule decides.
        let first_forwardable = t
            .submissions
            .iter()
            .find(|s| s.payout_id == a.payout_id && is_forwardable(s.outcome))
            .map(|s| FirstAttempt { submission_id: s.submission_id, submitted_at: s.submitted_at });
        let decision = admission::decide_admission(&AdmissionFacts {
            fencing_enabled: a.fencing_enabled,
            mark: t.high_water.get(&a.account_id).copied(),
            presented_token: a.presented_token,
            first_forwardable,
            state: t.payouts.get(&a.payout_id).map(|p| p.row.state),
        });
        match decision {
            AdmissionDecision::Fenced { .. } => t.submissions.push(row(a, Some(SubmissionOutcome::Fenced))),
            AdmissionDecision::Duplicate { mark, .. } => {
                if let Some(m) = mark {
                    t.high_water.insert(a.account_id.clone(), m);
                }
                t.submissions.push(row(a, Some(SubmissionOutcome::Duplicate)));
            }
            AdmissionDecision::NotClaimable { .. } => {}
            AdmissionDecision::Vanished => return Err(StoreError::Corrupt(format!("payout {} vanished", a.payout_id))),
            AdmissionDecision::Admit { mark } => {
                let Some(payout) = t.payouts.get_mut(&a.payout_id) else {
                    return Err(StoreError::Corrupt(format!("payout {} vanished", a.payout_id)));
                };
                payout.row.state = PayoutState::Submitted;
                payout.row.attempt_count += 1;
                payout.updated_at = a.at;
                if let Some(m) = mark {
                    t.high_water.insert(a.account_id.clone(), m);
                }
                t.submissions.push(row(a, None));
            }
        }
        decision.admission(a.at).ok_or_else(|| StoreError::Corrupt(format!("payout {} vanished", a.payout_id)))
    }

    /// As [`RailStore::resolve`].
    pub fn resolve(&mut self, submission_id: Uuid, r: &Resolution, at: DateTime<Utc>) -> Result<(), StoreError> {
        let t = self;
        let Some(s) = t.submissions.iter_mut().find(|s| s.submission_id == submission_id) else {
            return Err(StoreError::Corrupt(format!("no submission {submission_id}")));
        };
        if s.outcome.is_some() {
            return Ok(());
        }
        s.outcome = Some(r.outcome());
        s.outcome_detail = r.detail().map(str::to_owned);
        s.rail_reference = r.rail_reference().map(str::to_owned);
        s.resolved_at = Some(at);
        let payout_id = s.payout_id;
        if let Some(p) = t.payouts.get_mut(&payout_id) {
            if payout::may_transition(p.row.state, r.payout_state(), Actor::RailProxy) {
                p.row.state = r.payout_state();
                p.updated_at = at;
            }
        }
        Ok(())
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

    /// As [`RailStore::insert_payout`].
    pub fn insert_payout(&mut self, p: &NewPayout, at: DateTime<Utc>) -> Result<(), StoreError> {
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

#[async_trait]
impl RailStore for MemRailStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.lock().map(|_| ())
    }

    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutRow>, StoreError> {
        Ok(self.lock()?.payout(payout_id))
    }

    async fn admit(&self, a: &Attempt) -> Result<Admission, StoreError> {
        self.lock()?.admit(a)
    }

    async fn resolve(&self, submission_id: Uuid, r: &Resolution, at: DateTime<Utc>) -> Result<(), StoreError> {
        self.lock()?.resolve(submission_id, r, at)
    }

    async fn high_water(&self, account_id: &str) -> Result<Option<i64>, StoreError> {
        Ok(self.lock()?.high_water.get(account_id).copied())
    }

    async fn submissions(&self, payout_id: Option<Uuid>) -> Result<Vec<SubmissionRow>, StoreError> {
        Ok(self.lock()?.submissions_of(payout_id))
    }

    async fn unresolved_before(&self, before: DateTime<Utc>, limit: i64) -> Result<Vec<Uuid>, StoreError> {
        Ok(self.lock()?.unresolved_before(before, limit))
    }

    async fn insert_payout(&self, p: &NewPayout, at: DateTime<Utc>) -> Result<(), StoreError> {
        self.lock()?.insert_payout(p, at)
    }
}
