//! A run's findings, recorded in paydb (`dlock_paydb::findings`): what the report found,
//! as open rows and `reconciler.finding` events, so the payment-resource's event stream and
//! the console's payout story carry the reconciler's verdict (C3-extensions E-20;
//! docs/operating/reconciler-findings.md).
//!
//! Recording is not repairing: it touches only the reconciler's own table and the outbox,
//! never a payout, an account, the ledger or the rail's rows.
//!
//! Invariant: a run is recorded as complete only when every source was read; the findings
//! recorded are the report's incident and warning findings except `SOURCE_UNREADABLE` (a
//! fact about the run, not about paydb) and `OPERATOR_RESOLUTION` (its own event,
//! `operator.resolution`, already says it).

use dlock_paydb::findings::{FindingsRun, RecordOutcome, RecordedFinding};
use dlock_paydb::StoreError;

use crate::report::{FindingKind, Report, Severity};
use crate::store::ReconcileStore;

/// Whether a finding of this kind is recorded (module doc).
pub fn is_recorded(kind: FindingKind) -> bool {
    kind.severity() != Severity::Info && kind != FindingKind::SourceUnreadable
}

/// The run to record for `report`, under `run_id`.
pub fn findings_run(report: &Report, run_id: &str) -> FindingsRun {
    let findings = report
        .findings
        .iter()
        .filter(|f| is_recorded(f.kind))
        .map(|f| RecordedFinding {
            kind: f.kind.as_str().to_owned(),
            severity: f.severity.as_str().to_owned(),
            account_id: f.account_id.clone(),
            payout_id: f.payout_id.map(|p| p.to_string()),
            class: match f.kind {
                FindingKind::AmbiguousPayout => report
                    .ambiguous
                    .iter()
                    .find(|a| Some(a.payout_id) == f.payout_id)
                    .map(|a| a.classification.as_str().to_owned()),
                _ => None,
            },
            detail: f.detail.clone(),
        })
        .collect();
    FindingsRun {
        run_id: run_id.to_owned(),
        at: report.checked_at,
        complete: report.sources.paydb.read && report.sources.rail.read,
        findings,
    }
}

/// Records `report`'s findings in `store` under a fresh run id. A report that could not
/// read paydb records nothing (`Ok(None)`): it has nothing to say about paydb's rows.
pub async fn record(store: &dyn ReconcileStore, report: &Report) -> Result<Option<RecordOutcome>, StoreError> {
    if !report.sources.paydb.read {
        return Ok(None);
    }
    let run_id = dlock_rt::rand::uuid_v4().to_string();
    store.record_findings(&findings_run(report, &run_id)).await.map(Some)
}
