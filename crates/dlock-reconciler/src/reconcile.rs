//! One reconciliation run: read paydb and the rail's own record, classify every payout,
//! and report. It writes nothing, anywhere (FR-26: detective, never repairs).
//!
//! **Read order.** paydb is read statement by statement, not in one snapshot, while the
//! services keep writing. The order is chosen so that a write landing between two reads can
//! only hide a problem until the next run, never invent one:
//!
//! 1. Payout ids, per state, in an order where every transition but SUBMITTED → CLAIMED
//!    (an UNSENT attempt) goes forward, so a moving payout is still listed once; then every
//!    `rail_submission` row, whose payout ids cover that one backward move.
//! 2. Each payout with its attempts (`payout`), read after its listing: a POSTED payout's
//!    ACKED attempt committed before it became POSTED, so it is among the attempts read.
//! 3. The resolutions, then the ledger, then the accounts: a claim's token or a posting's
//!    fence read in 2 or 3 is at most the fence read later (fences only rise); a balance and
//!    its ledger sum come from one statement.
//! 4. The rail marks, after the rows of 1 (marks only rise).
//! 5. The rail's record, last: every call it holds had its intent committed before the
//!    call (the proxy commits before it forwards), and an ambiguous payout is classified on
//!    calls read after it was quarantined.
//! 6. Suspicions that a concurrent write could explain (entries of a payout read as not
//!    POSTED; a rail call for a payout not read, or read without a forwardable attempt) are
//!    re-read once before they are reported.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::{RailCall, SubmissionOutcome};
use dlock_paydb::pay::{
    settlement_account, snapshot_after_everything, AccountKind, AccountView, Direction, LedgerEntry, ListQuery,
    PayoutView, ResolutionRow,
};
use dlock_paydb::rail::{is_forwardable, SubmissionRow};
use uuid::Uuid;

use crate::budget::{with_budget, BudgetExhausted, ReadBudget, ReadError};
use crate::rail::RailRecord;
use crate::report::{
    AmbiguousClass, AmbiguousPayout, CurrencyTotals, Finding, FindingKind, Report, SourceStatus, Sources,
};
use crate::store::ReconcileStore;

/// Default `reconcile.intent-unresolved-ms-max`: an intent row older than this is reported.
/// The proxy resolves an intent within its read timeout (8 s) plus one transaction.
pub const INTENT_UNRESOLVED_MS_MAX_DEFAULT: u64 = 60_000;
/// Default `reconcile.acked-unposted-ms-max`: a RAIL_ACKED payout not POSTED within this is
/// reported.
pub const ACKED_UNPOSTED_MS_MAX_DEFAULT: u64 = 60_000;
/// Payouts per P1 page the reconciler asks for.
pub const LIST_PAGE_ROWS: i64 = 500;

/// The listing order (see the module doc): forward along every C2 transition but
/// SUBMITTED → CLAIMED.
pub const LISTING_ORDER: [PayoutState; 8] = [
    PayoutState::Pending,
    PayoutState::Claimed,
    PayoutState::Submitted,
    PayoutState::RailAcked,
    PayoutState::RailAmbiguous,
    PayoutState::Posted,
    PayoutState::Failed,
    PayoutState::Abandoned,
];

/// The age bounds of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// `reconcile.intent-unresolved-ms-max`.
    pub intent_unresolved_ms_max: u64,
    /// `reconcile.acked-unposted-ms-max`.
    pub acked_unposted_ms_max: u64,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            intent_unresolved_ms_max: INTENT_UNRESOLVED_MS_MAX_DEFAULT,
            acked_unposted_ms_max: ACKED_UNPOSTED_MS_MAX_DEFAULT,
        }
    }
}

/// The parameters of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// The run's "now": every age is measured from it (the caller's clock, so tests and the
    /// simulation choose it).
    pub now: DateTime<Utc>,
    pub bounds: Bounds,
    pub budget: ReadBudget,
}

impl Params {
    pub fn at(now: DateTime<Utc>) -> Params {
        Params { now, bounds: Bounds::default(), budget: ReadBudget::default() }
    }
}

/// paydb, through the reconciler's own store trait (SQL in production, `MemPaydb` in the
/// simulation).
#[derive(Clone)]
pub struct Paydb {
    pub store: Arc<dyn ReconcileStore>,
    /// Where it is, for the report (never a URL with credentials).
    pub describe: String,
}

/// The rows one run read from paydb.
struct Snapshot {
    payouts: BTreeMap<Uuid, PayoutView>,
    submissions: Vec<SubmissionRow>,
    resolutions: Vec<ResolutionRow>,
    ledger: Vec<LedgerEntry>,
    accounts: Vec<AccountView>,
    marks: BTreeMap<String, Option<i64>>,
}

/// What the rail's record says of one `clientRef`.
#[derive(Debug, Clone, Default)]
struct CallStats {
    calls: u64,
    paid: u64,
    /// References of the calls that moved money.
    paid_references: Vec<Option<String>>,
}

struct Reader<'a> {
    store: &'a dyn ReconcileStore,
    budget: &'a ReadBudget,
}

impl Reader<'_> {
    async fn payout(&self, id: Uuid) -> Result<Option<PayoutView>, BudgetExhausted> {
        let store = self.store;
        with_budget(self.budget, self.budget.read_timeout_ms, "read a payout", move || async move {
            store.payout(id).await.map_err(ReadError::from)
        })
        .await
    }

    async fn snapshot(&self) -> Result<Snapshot, BudgetExhausted> {
        let (store, budget) = (self.store, self.budget);
        let timeout = budget.read_timeout_ms;
        // 1. Every payout id.
        let mut ids = BTreeSet::new();
        for state in LISTING_ORDER {
            let mut after = None;
            loop {
                let q = ListQuery {
                    state,
                    account_id: None,
                    snapshot: snapshot_after_everything(),
                    created_after: None,
                    after,
                    limit: LIST_PAGE_ROWS,
                };
                let q = &q;
                let page = with_budget(budget, timeout, "list payouts", move || async move {
                    store.list(q).await.map_err(ReadError::from)
                })
                .await?;
                ids.extend(page.iter().map(|p| p.payout_id));
                match page.last() {
                    Some(last) if page.len() as i64 == LIST_PAGE_ROWS => {
                        after = Some((last.created_at, last.payout_id))
                    }
                    _ => break,
                }
            }
        }
        let submissions = with_budget(budget, timeout, "read rail submissions", move || async move {
            store.submissions(None).await.map_err(ReadError::from)
        })
        .await?;
        ids.extend(submissions.iter().map(|s| s.payout_id));
        // 2. Each payout with its attempts.
        let mut payouts = BTreeMap::new();
        for id in ids {
            if let Some(view) = self.payout(id).await? {
                payouts.insert(id, view);
            }
        }
        // 3. Resolutions, ledger, accounts.
        let resolutions = with_budget(budget, timeout, "read resolutions", move || async move {
            store.resolutions(None).await.map_err(ReadError::from)
        })
        .await?;
        let ledger = with_budget(budget, timeout, "read the ledger", move || async move {
            store.ledger(None).await.map_err(ReadError::from)
        })
        .await?;
        let accounts = with_budget(budget, timeout, "read accounts", move || async move {
            store.accounts().await.map_err(ReadError::from)
        })
        .await?;
        // 4. The marks of every account the proxy saw.
        let mut marks = BTreeMap::new();
        for account in submissions.iter().map(|s| s.account_id.as_str()).collect::<BTreeSet<_>>() {
            let mark = with_budget(budget, timeout, "read a rail mark", move || async move {
                store.high_water(account).await.map_err(ReadError::from)
            })
            .await?;
            marks.insert(account.to_owned(), mark);
        }
        Ok(Snapshot { payouts, submissions, resolutions, ledger, accounts, marks })
    }
}

/// Reads the rail's record within the budget.
async fn read_rail(rail: &dyn RailRecord, budget: &ReadBudget) -> Result<Vec<RailCall>, BudgetExhausted> {
    let timeout = budget.connect_timeout_ms + budget.read_timeout_ms;
    with_budget(budget, timeout, "read the rail's call log", move || rail.calls()).await
}

/// One run over an open paydb and the rail's record.
pub async fn reconcile(paydb: &Paydb, rail: &dyn RailRecord, params: &Params) -> Report {
    let reader = Reader { store: &*paydb.store, budget: &params.budget };
    let snapshot = reader.snapshot().await;
    let calls = read_rail(rail, &params.budget).await;
    let mut report = Report::empty(
        params.now,
        Sources {
            paydb: match &snapshot {
                Ok(_) => SourceStatus::read(&paydb.describe),
                Err(e) => SourceStatus::unreadable(&paydb.describe, e.to_string()),
            },
            rail: match &calls {
                Ok(_) => SourceStatus::read(rail.describe()),
                Err(e) => SourceStatus::unreadable(rail.describe(), e.to_string()),
            },
        },
    );
    let calls = calls.ok();
    // 6. Re-read what a concurrent write could explain.
    let checked = match snapshot {
        Ok(snapshot) => match recheck(&reader, &snapshot, calls.as_deref()).await {
            Ok(rechecked) => Some((snapshot, rechecked)),
            Err(e) => {
                report.sources.paydb = SourceStatus::unreadable(&paydb.describe, e.to_string());
                None
            }
        },
        Err(_) => None,
    };
    match (checked, &calls) {
        (Some((snapshot, rechecked)), _) => check(&mut report, &snapshot, &rechecked, calls.as_deref(), params),
        // paydb unreadable: the rail's record alone still shows a double payment.
        (None, Some(calls)) => check_rail_alone(&mut report, calls),
        (None, None) => {}
    }
    unreadable_findings(&mut report);
    report.finish();
    emit_findings(&report);
    report
}

/// A run whose paydb could not even be opened: the rail's record alone still shows a
/// double payment.
pub async fn reconcile_without_paydb(paydb: &str, error: &str, rail: &dyn RailRecord, params: &Params) -> Report {
    let calls = read_rail(rail, &params.budget).await;
    let mut report = Report::empty(
        params.now,
        Sources {
            paydb: SourceStatus::unreadable(paydb, error),
            rail: match &calls {
                Ok(_) => SourceStatus::read(rail.describe()),
                Err(e) => SourceStatus::unreadable(rail.describe(), e.to_string()),
            },
        },
    );
    if let Ok(calls) = &calls {
        check_rail_alone(&mut report, calls);
    }
    unreadable_findings(&mut report);
    report.finish();
    emit_findings(&report);
    report
}

/// One `reconciler_finding` event per finding of a finished run ([`dlock_rt::events`]), in
/// the report's order: the one place every run's findings pass.
fn emit_findings(report: &Report) {
    if !dlock_rt::events::enabled() {
        return;
    }
    for f in &report.findings {
        dlock_rt::events::emit(crate::NODE, "reconciler_finding", || {
            [
                ("finding", f.kind.as_str().into()),
                ("severity", f.severity.as_str().into()),
                ("payout", dlock_rt::events::opt(f.payout_id.map(|p| p.to_string()))),
                ("account", dlock_rt::events::opt(f.account_id.clone())),
                ("detail", f.detail.clone().into()),
            ]
        });
    }
}

fn unreadable_findings(report: &mut Report) {
    for (name, s) in [("paydb", &report.sources.paydb), ("rail", &report.sources.rail)] {
        if let Some(e) = &s.error {
            let detail = format!("{name} ({}) could not be read within its budget: {e}", s.source);
            report.findings.push(Finding::new(FindingKind::SourceUnreadable, None, None, detail));
        }
    }
}

/// The payouts a concurrent write could have moved under a suspicion, re-read.
async fn recheck(
    reader: &Reader<'_>,
    s: &Snapshot,
    calls: Option<&[RailCall]>,
) -> Result<BTreeMap<Uuid, Option<PayoutView>>, BudgetExhausted> {
    let mut suspects = BTreeSet::new();
    for e in &s.ledger {
        if let Some(p) = e.payout_id {
            if s.payouts.get(&p).is_none_or(|v| v.state != PayoutState::Posted) {
                suspects.insert(p);
            }
        }
    }
    for c in calls.unwrap_or_default() {
        if let Ok(p) = Uuid::parse_str(&c.client_ref) {
            if s.payouts.get(&p).is_none_or(|v| forwardable(v) == 0) {
                suspects.insert(p);
            }
        }
    }
    let mut rechecked = BTreeMap::new();
    for p in suspects {
        rechecked.insert(p, reader.payout(p).await?);
    }
    Ok(rechecked)
}

/// Attempts of a payout that were, or may have been, presented to the rail.
fn forwardable(v: &PayoutView) -> usize {
    v.submissions.iter().filter(|s| is_forwardable(s.outcome)).count()
}

fn calls_by_ref(calls: &[RailCall]) -> BTreeMap<&str, CallStats> {
    let mut m: BTreeMap<&str, CallStats> = BTreeMap::new();
    for c in calls {
        let s = m.entry(c.client_ref.as_str()).or_default();
        s.calls += 1;
        // Planted bug `reconciler-trusts-answer` (simulation only): the rail's answer taken
        // for what it did. A call dropped after paying then counts as unpaid.
        let paid = if dlock_contract::planted::on(dlock_contract::planted::Bug::ReconcilerTrustsAnswer) {
            c.outcome == dlock_contract::rail::RailCallOutcome::Accepted
        } else {
            c.paid
        };
        if paid {
            s.paid += 1;
            s.paid_references.push(c.rail_reference.clone());
        }
    }
    m
}

/// The checks that need only the rail's record: rail totals, double payments and repeats.
fn check_rail_alone(report: &mut Report, calls: &[RailCall]) {
    let by_ref = calls_by_ref(calls);
    report.rail_calls_total = calls.len() as u64;
    report.max_rail_calls_per_payout = by_ref.values().map(|s| s.calls).max().unwrap_or(0);
    for (client_ref, s) in &by_ref {
        let payout_id = Uuid::parse_str(client_ref).ok();
        if s.paid >= 2 {
            let refs: Vec<&str> = s.paid_references.iter().map(|r| r.as_deref().unwrap_or("(none)")).collect();
            let detail = format!(
                "the rail moved money {} times for clientRef {client_ref} ({} calls; references {})",
                s.paid,
                s.calls,
                refs.join(", ")
            );
            report.findings.push(Finding::new(FindingKind::DoublePayment, payout_id, None, detail));
        } else if s.calls >= 2 {
            let detail = format!(
                "the rail was called {} times for clientRef {client_ref} and moved money {} time(s); the proxy \
                 forwards a payout once",
                s.calls, s.paid
            );
            report.findings.push(Finding::new(FindingKind::RepeatedRailCall, payout_id, None, detail));
        }
    }
}

fn age_ms(now: DateTime<Utc>, since: DateTime<Utc>) -> i64 {
    (now - since).num_milliseconds()
}

fn bound_ms(bound: u64) -> i64 {
    i64::try_from(bound).unwrap_or(i64::MAX)
}

/// Every check over a paydb snapshot and, when it was read, the rail's record.
fn check(
    report: &mut Report,
    s: &Snapshot,
    rechecked: &BTreeMap<Uuid, Option<PayoutView>>,
    calls: Option<&[RailCall]>,
    params: &Params,
) {
    let now = params.now;
    let by_ref = calls.map(calls_by_ref);
    // Per payout id, for the payouts the rail's record names.
    let by_payout: Option<BTreeMap<Uuid, &CallStats>> = by_ref
        .as_ref()
        .map(|m| m.iter().filter_map(|(r, stats)| Uuid::parse_str(r).ok().map(|p| (p, stats))).collect());
    let mut entries_by_payout: BTreeMap<Uuid, Vec<&LedgerEntry>> = BTreeMap::new();
    for e in &s.ledger {
        if let Some(p) = e.payout_id {
            entries_by_payout.entry(p).or_default().push(e);
        }
    }

    // Counts.
    report.payouts_total = s.payouts.len() as u64;
    for v in s.payouts.values() {
        *report.payouts_by_state.entry(v.state).or_insert(0) += 1;
    }
    report.fenced_out.rail =
        s.submissions.iter().filter(|r| r.outcome == Some(SubmissionOutcome::Fenced)).count() as u64;
    report.duplicate_submissions =
        s.submissions.iter().filter(|r| r.outcome == Some(SubmissionOutcome::Duplicate)).count() as u64;

    // Per payout.
    for (id, v) in &s.payouts {
        let id = *id;
        let evidence = by_payout.as_ref().map(|m| m.get(&id).copied().cloned().unwrap_or_default());
        for intent in v.submissions.iter().filter(|a| a.outcome.is_none()) {
            let age = age_ms(now, intent.submitted_at);
            if age > bound_ms(params.bounds.intent_unresolved_ms_max) {
                let detail = format!(
                    "intent {} (token {}) unresolved for {age} ms (bound {} ms); the payout is {}; {}",
                    intent.submission_id,
                    intent.presented_token,
                    params.bounds.intent_unresolved_ms_max,
                    v.state.as_str(),
                    rail_evidence(evidence.as_ref()),
                );
                report.findings.push(Finding::new(
                    FindingKind::IntentUnresolved,
                    Some(id),
                    Some(&v.account_id),
                    detail,
                ));
            }
        }
        let acked: Vec<_> = v.submissions.iter().filter(|a| a.outcome == Some(SubmissionOutcome::Acked)).collect();
        match v.state {
            PayoutState::RailAcked => {
                let since = acked.first().and_then(|a| a.resolved_at).unwrap_or(v.updated_at);
                let age = age_ms(now, since);
                if age > bound_ms(params.bounds.acked_unposted_ms_max) {
                    let detail = format!(
                        "RAIL_ACKED for {age} ms (bound {} ms) and not POSTED: the rail paid, the ledger does not \
                         show it",
                        params.bounds.acked_unposted_ms_max
                    );
                    report.findings.push(Finding::new(
                        FindingKind::AckedNotPosted,
                        Some(id),
                        Some(&v.account_id),
                        detail,
                    ));
                }
            }
            PayoutState::Posted => {
                let resolved =
                    s.resolutions.iter().filter(|r| r.payout_id == id && r.resolved_as == PayoutState::Posted).count();
                if acked.len() + resolved != 1 {
                    let detail = format!(
                        "POSTED with {} ACKED attempt(s) and {resolved} operator resolution(s) as POSTED; exactly \
                         one is required",
                        acked.len()
                    );
                    report.findings.push(Finding::new(
                        FindingKind::PostedWithoutAck,
                        Some(id),
                        Some(&v.account_id),
                        detail,
                    ));
                }
                check_posting(report, v, entries_by_payout.get(&id).map(Vec::as_slice).unwrap_or_default());
            }
            PayoutState::RailAmbiguous => classify(report, v, evidence.as_ref()),
            _ => {}
        }
    }
    // Entries of a payout that is not POSTED, once re-read.
    for (p, entries) in &entries_by_payout {
        if s.payouts.get(p).is_some_and(|v| v.state == PayoutState::Posted) {
            continue;
        }
        match rechecked.get(p).and_then(Option::as_ref) {
            Some(v) if v.state == PayoutState::Posted => check_posting(report, v, entries),
            Some(v) => {
                let detail =
                    format!("{} ledger entries for a payout that is {}, not POSTED", entries.len(), v.state.as_str());
                report.findings.push(Finding::new(FindingKind::PostingMismatch, Some(*p), Some(&v.account_id), detail));
            }
            None => {
                let detail = format!("{} ledger entries for a payout paydb does not hold", entries.len());
                report.findings.push(Finding::new(FindingKind::PostingMismatch, Some(*p), None, detail));
            }
        }
    }
    for r in &s.resolutions {
        let detail = format!(
            "resolved as {} by {} at {} on rail reference {}: {}",
            r.resolved_as.as_str(),
            r.operator,
            dlock_contract::time::rfc3339_ms(r.resolved_at),
            r.rail_reference,
            r.reason
        );
        let account = s.payouts.get(&r.payout_id).map(|v| v.account_id.as_str());
        report.findings.push(Finding::new(FindingKind::OperatorResolution, Some(r.payout_id), account, detail));
    }

    check_accounts(report, s);
    check_ledger(report, s);
    check_marks(report, s);

    if let Some(calls) = calls {
        check_rail_alone(report, calls);
        for (client_ref, stats) in by_ref.iter().flatten() {
            let Ok(p) = Uuid::parse_str(client_ref) else {
                let detail =
                    format!("{} rail call(s) with clientRef {client_ref:?}, which is not a payout id", stats.calls);
                report.findings.push(Finding::new(FindingKind::RailCallForUnknownPayout, None, None, detail));
                continue;
            };
            let view = match s.payouts.get(&p) {
                Some(v) if forwardable(v) > 0 => continue,
                Some(v) => rechecked.get(&p).and_then(Option::as_ref).or(Some(v)),
                None => rechecked.get(&p).and_then(Option::as_ref),
            };
            match view {
                None => {
                    let detail = format!("{} rail call(s) for a payout paydb does not hold", stats.calls);
                    report.findings.push(Finding::new(FindingKind::RailCallForUnknownPayout, Some(p), None, detail));
                }
                Some(v) if forwardable(v) == 0 => {
                    let detail = format!(
                        "{} rail call(s) ({} paid) for a payout with no forwardable attempt: it is {} after {} \
                         intent(s)",
                        stats.calls,
                        stats.paid,
                        v.state.as_str(),
                        v.attempt_count
                    );
                    report.findings.push(Finding::new(
                        FindingKind::RailCallNotAdmitted,
                        Some(p),
                        Some(&v.account_id),
                        detail,
                    ));
                }
                Some(_) => {}
            }
        }
    }
    report.ledger_balanced =
        !report.findings.iter().any(|f| matches!(f.kind, FindingKind::LedgerUnbalanced | FindingKind::BalanceMismatch));
}

fn rail_evidence(evidence: Option<&CallStats>) -> String {
    match evidence {
        None => "the rail's record was not read".to_owned(),
        Some(s) => format!("the rail's record shows {} call(s), {} paid", s.calls, s.paid),
    }
}

/// A RAIL_AMBIGUOUS payout: paid (exactly one call moved money), not paid (none did), or
/// unknown (the rail was not read, or it moved money more than once).
fn classify(report: &mut Report, v: &PayoutView, evidence: Option<&CallStats>) {
    let (class, reference) = match evidence {
        None => (AmbiguousClass::Unknown, None),
        Some(s) if s.paid == 0 => (AmbiguousClass::NotPaid, None),
        Some(s) if s.paid == 1 => (AmbiguousClass::Paid, s.paid_references.first().cloned().flatten()),
        Some(_) => (AmbiguousClass::Unknown, None),
    };
    *report.ambiguous_by_class.entry(class).or_insert(0) += 1;
    report.ambiguous.push(AmbiguousPayout {
        payout_id: v.payout_id,
        account_id: v.account_id.clone(),
        amount_minor: v.amount_minor,
        currency: v.currency.clone(),
        classification: class,
        rail_calls: evidence.map(|s| s.calls),
        paid_calls: evidence.map(|s| s.paid),
        rail_reference: reference.clone(),
    });
    let advice = match (class, &reference) {
        (AmbiguousClass::Paid, Some(r)) => {
            format!("resolve with `dlock resolve {} --as posted --rail-reference {r}`", v.payout_id)
        }
        (AmbiguousClass::Paid, None) => "the paying call carries no reference: find it on the rail's statement".into(),
        (AmbiguousClass::NotPaid, _) => "confirm on the rail's statement, then `dlock resolve … --as failed`".into(),
        (AmbiguousClass::Unknown, _) => "do not resolve until the rail's record is clear".into(),
    };
    let detail = format!("quarantined; {}: {}; {advice}", rail_evidence(evidence), class.as_str());
    report.findings.push(Finding::new(FindingKind::AmbiguousPayout, Some(v.payout_id), Some(&v.account_id), detail));
}

/// A POSTED payout's entries: exactly DEBIT its account and CREDIT settlement, its amount
/// and currency.
fn check_posting(report: &mut Report, v: &PayoutView, entries: &[&LedgerEntry]) {
    let matches = |e: &LedgerEntry, account: &str, direction: Direction| {
        e.account_id == account
            && e.direction == direction
            && e.amount_minor == v.amount_minor
            && e.currency == v.currency
    };
    let settlement = settlement_account(&v.currency);
    let debits = entries.iter().filter(|e| matches(e, &v.account_id, Direction::Debit)).count();
    let credits = entries.iter().filter(|e| matches(e, &settlement, Direction::Credit)).count();
    if entries.len() != 2 || debits != 1 || credits != 1 {
        let found: Vec<String> = entries
            .iter()
            .map(|e| format!("{} {} {} {}", e.direction.as_str(), e.account_id, e.amount_minor, e.currency))
            .collect();
        let detail = format!(
            "POSTED needs DEBIT {} and CREDIT {settlement} of {} {}; the ledger holds [{}]",
            v.account_id,
            v.amount_minor,
            v.currency,
            found.join("; ")
        );
        report.findings.push(Finding::new(
            FindingKind::PostingMismatch,
            Some(v.payout_id),
            Some(&v.account_id),
            detail,
        ));
    }
}

fn check_accounts(report: &mut Report, s: &Snapshot) {
    // The highest token that committed on each account: claims (the payout's latest claim
    // token) and postings (the entry's fence, on the account it debits).
    let mut committed: BTreeMap<&str, (i64, String)> = BTreeMap::new();
    for v in s.payouts.values() {
        if let Some(t) = v.claim_token {
            let slot = committed.entry(v.account_id.as_str()).or_insert((0, String::new()));
            if t > slot.0 {
                *slot = (t, format!("claim of payout {}", v.payout_id));
            }
        }
    }
    for e in &s.ledger {
        if e.fence > 0 {
            let slot = committed.entry(e.account_id.as_str()).or_insert((0, String::new()));
            if e.fence > slot.0 {
                *slot = (e.fence, format!("posting {}", e.posting_id));
            }
        }
    }
    for a in &s.accounts {
        let id = a.account_id.as_str();
        if a.balance_minor < 0 {
            let detail = format!("balance {} {}", a.balance_minor, a.currency);
            report.findings.push(Finding::new(FindingKind::NegativeBalance, None, Some(id), detail));
        }
        if a.kind != AccountKind::Customer {
            continue;
        }
        if a.balance_minor != a.ledger_sum_minor {
            let detail = format!(
                "balance {} but Σ CREDIT − Σ DEBIT of its entries is {} ({})",
                a.balance_minor, a.ledger_sum_minor, a.currency
            );
            report.findings.push(Finding::new(FindingKind::BalanceMismatch, None, Some(id), detail));
        }
        let available = i128::from(a.balance_minor) - i128::from(a.reserved_minor);
        if a.balance_minor >= 0 && available < 0 {
            let detail = format!(
                "available {available} {}: balance {} minus {} reserved by unsettled payouts",
                a.currency, a.balance_minor, a.reserved_minor
            );
            report.findings.push(Finding::new(FindingKind::NegativeAvailableBalance, None, Some(id), detail));
        }
        if let Some((token, what)) = committed.get(id) {
            if a.fence < *token {
                let detail = format!("fence {} is below token {token}, which committed there ({what})", a.fence);
                report.findings.push(Finding::new(FindingKind::FenceBelowCommittedToken, None, Some(id), detail));
            }
        }
    }
}

fn check_ledger(report: &mut Report, s: &Snapshot) {
    let mut totals: BTreeMap<String, CurrencyTotals> = BTreeMap::new();
    let mut postings: BTreeMap<Uuid, (i128, i128)> = BTreeMap::new();
    for e in &s.ledger {
        let t = totals.entry(e.currency.clone()).or_default();
        let p = postings.entry(e.posting_id).or_default();
        match e.direction {
            Direction::Debit => {
                t.debits_minor += i128::from(e.amount_minor);
                p.0 += i128::from(e.amount_minor);
            }
            Direction::Credit => {
                t.credits_minor += i128::from(e.amount_minor);
                p.1 += i128::from(e.amount_minor);
            }
        }
    }
    for (currency, t) in &totals {
        if t.debits_minor != t.credits_minor {
            let detail =
                format!("{currency}: Σ DEBIT {} != Σ CREDIT {} across the ledger", t.debits_minor, t.credits_minor);
            report.findings.push(Finding::new(FindingKind::LedgerUnbalanced, None, None, detail));
        }
    }
    for (posting, (debits, credits)) in &postings {
        if debits != credits {
            let detail = format!("posting {posting}: Σ DEBIT {debits} != Σ CREDIT {credits}");
            report.findings.push(Finding::new(FindingKind::LedgerUnbalanced, None, None, detail));
        }
    }
    report.ledger_totals = totals;
}

/// The rail mark of each account is at least every token the proxy admitted there: every
/// attempt that passed step 1 (outcome NULL, ACKED, REJECTED, TIMEOUT, UNSENT, and DUPLICATE,
/// which step 2 refused after step 1 advanced the mark).
fn check_marks(report: &mut Report, s: &Snapshot) {
    let mut admitted: BTreeMap<&str, &SubmissionRow> = BTreeMap::new();
    for r in s.submissions.iter().filter(|r| r.outcome != Some(SubmissionOutcome::Fenced)) {
        let slot = admitted.entry(r.account_id.as_str()).or_insert(r);
        if r.presented_token > slot.presented_token {
            *slot = r;
        }
    }
    for (account, r) in admitted {
        let mark = s.marks.get(account).copied().flatten();
        if mark.is_none_or(|m| m < r.presented_token) {
            let mark = mark.map_or_else(|| "absent".to_owned(), |m| m.to_string());
            let detail = format!(
                "rail mark {mark} is below token {} of attempt {} ({})",
                r.presented_token,
                r.submission_id,
                r.outcome.map_or("intent", |o| o.as_str())
            );
            report.findings.push(Finding::new(
                FindingKind::MarkBelowAdmittedToken,
                Some(r.payout_id),
                Some(account),
                detail,
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    //! The same run on the simulation store with the rail's record in memory: it needs no
    //! socket, so it also runs under `--cfg madsim`, where the simulation uses it.

    use super::*;
    use async_trait::async_trait;
    use dlock_contract::rail::RailCallOutcome;
    use dlock_paydb::MemPaydb;
    use dlock_payment_resource::store::{IdemRequest, NewAccount, Operation, PaymentStore};
    use dlock_rail_proxy::store::{Attempt, NewPayout, RailStore, Resolution};

    struct Calls(Vec<RailCall>);

    #[async_trait]
    impl RailRecord for Calls {
        async fn calls(&self) -> Result<Vec<RailCall>, ReadError> {
            Ok(self.0.clone())
        }

        fn describe(&self) -> String {
            "memory".into()
        }
    }

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp_millis(1_795_000_000_000 + ms).expect("instant")
    }

    fn paid_call(p: Uuid, reference: &str) -> RailCall {
        RailCall {
            client_ref: p.to_string(),
            amount_minor: 100,
            currency: "EUR".into(),
            outcome: RailCallOutcome::Accepted,
            paid: true,
            rail_reference: Some(reference.into()),
            received_at: at(0),
        }
    }

    /// A seeded CLAIMED payout, admitted under `token` and answered TIMEOUT.
    async fn quarantined(db: &MemPaydb, account: &str, token: i64) -> Uuid {
        let p = Uuid::new_v4();
        let new = NewPayout {
            payout_id: p,
            account_id: account.into(),
            amount_minor: 100,
            currency: "EUR".into(),
            beneficiary_ref: "b".into(),
            state: PayoutState::Claimed,
        };
        RailStore::insert_payout(db, &new, at(0)).await.expect("seed");
        let a = Attempt {
            submission_id: Uuid::new_v4(),
            payout_id: p,
            account_id: account.into(),
            presented_token: token,
            owner_id: "w".into(),
            idempotency_key: format!("payout:{p}"),
            amount_minor: 100,
            currency: "EUR".into(),
            at: at(0),
            fencing_enabled: true,
        };
        db.admit(&a).await.expect("admit");
        db.resolve(a.submission_id, &Resolution::Timeout { detail: "lost".into() }, at(0)).await.expect("resolve");
        p
    }

    #[tokio::test]
    async fn the_reconciler_runs_on_the_simulation_store_without_a_socket() {
        let db = Arc::new(MemPaydb::new());
        let account = NewAccount {
            account_id: "acct".into(),
            currency: "EUR".into(),
            opening_balance_minor: 200,
            posting_id: Uuid::new_v4(),
            entry_ids: [Uuid::new_v4(), Uuid::new_v4()],
            at: at(0),
        };
        let idem = IdemRequest {
            operation: Operation::CreateAccount,
            target_id: "accounts".into(),
            key: "k".into(),
            token: 0,
            owner_id: "ops".into(),
            fingerprint: "0".repeat(64),
            at: at(0),
            expires_at: at(1_000_000),
        };
        let how = dlock_payment_resource::answer::Answering {
            shape: dlock_payment_resource::answer::Shape::Single,
            key: "k".into(),
            trace_id: "t".into(),
        };
        db.create_account(&account, &idem, &how).await.expect("create account");
        let once = quarantined(&db, "acct", 1).await;
        let twice = quarantined(&db, "acct", 2).await;
        let paydb = Paydb { store: db.clone(), describe: "memory".into() };
        let rail = Calls(vec![paid_call(once, "RR-1"), paid_call(twice, "RR-2"), paid_call(twice, "RR-3")]);
        let report = reconcile(&paydb, &rail, &Params::at(at(1_000))).await;
        let classes: BTreeMap<Uuid, AmbiguousClass> =
            report.ambiguous.iter().map(|a| (a.payout_id, a.classification)).collect();
        assert_eq!(classes[&once], AmbiguousClass::Paid);
        assert_eq!(classes[&twice], AmbiguousClass::Unknown);
        let incidents: Vec<FindingKind> = report
            .findings
            .iter()
            .filter(|f| f.severity == crate::report::Severity::Incident)
            .map(|f| f.kind)
            .collect();
        assert_eq!(incidents, vec![FindingKind::DoublePayment], "{}", report.render_table());
        assert_eq!((report.exit_code(), report.max_rail_calls_per_payout), (crate::report::EXIT_INCIDENT, 2));
        assert_eq!(report.payouts_by_state[&PayoutState::RailAmbiguous], 2);
    }
}
