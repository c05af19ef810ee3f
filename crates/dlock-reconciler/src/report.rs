//! The reconciler's report: what it found, as a human table ([`Report::render_table`]) or
//! JSON (serde, camelCase), and the exit code it maps to ([`Report::exit_code`]).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use dlock_contract::payout::PayoutState;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Exit code: every source was read and nothing incident-grade was found.
pub const EXIT_CLEAN: u8 = 0;
/// Exit code: at least one incident-grade finding (it wins over [`EXIT_INCOMPLETE`]).
pub const EXIT_INCIDENT: u8 = 1;
/// Exit code: no incident found, but a source could not be read within its budget, so the
/// run cannot say the system is clean.
pub const EXIT_INCOMPLETE: u8 = 3;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// An invariant is broken (money moved twice, the ledger drifted, a fence is behind a
    /// token it accepted): page. The exit code is 1.
    Incident,
    /// A payout needs a human (quarantined, stuck), or a source was unreadable; no
    /// invariant is known to be broken.
    Warning,
    /// For the record (an operator's resolution).
    Info,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Incident => "incident",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

/// What a finding is about. Each kind has one fixed severity ([`FindingKind::severity`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FindingKind {
    /// The rail moved money more than once for one `clientRef` (one payout).
    DoublePayment,
    /// The rail was called more than once for one `clientRef`, moving money at most once.
    /// The proxy forwards a payout once, ever: any second call is a breach.
    RepeatedRailCall,
    /// A rail call whose `clientRef` names no payout in paydb.
    RailCallForUnknownPayout,
    /// A rail call for a payout that has no forwardable attempt (it never reached SUBMITTED,
    /// or its attempts were all fenced, duplicate or unsent).
    RailCallNotAdmitted,
    /// A POSTED payout without exactly one ACKED attempt (or, instead, one operator
    /// resolution as POSTED).
    PostedWithoutAck,
    /// A POSTED payout without exactly its two entries (DEBIT the account, CREDIT
    /// settlement, its amount), or ledger entries for a payout that is not POSTED.
    PostingMismatch,
    /// A CUSTOMER account's `balance_minor` differs from Σ CREDIT − Σ DEBIT of its entries.
    BalanceMismatch,
    /// Σ DEBIT ≠ Σ CREDIT across the ledger (per currency), or within one posting.
    LedgerUnbalanced,
    /// An account's balance is below zero.
    NegativeBalance,
    /// A CUSTOMER account's available balance (balance − unsettled payouts) is below zero.
    NegativeAvailableBalance,
    /// An account's fence is below a token that committed there (a claim's token, or a
    /// posting's fence).
    FenceBelowCommittedToken,
    /// An account's rail mark is below (or absent under) a token the proxy admitted.
    MarkBelowAdmittedToken,
    /// A RAIL_AMBIGUOUS payout, with the rail's classification: an operator must resolve it.
    AmbiguousPayout,
    /// An intent row (`outcome IS NULL`) older than `intent_unresolved_ms_max`.
    IntentUnresolved,
    /// A RAIL_ACKED payout not POSTED within `acked_unposted_ms_max`.
    AckedNotPosted,
    /// A source could not be read within its budget.
    SourceUnreadable,
    /// An operator resolved a quarantined payout (the audit trail).
    OperatorResolution,
}

impl FindingKind {
    pub const ALL: [FindingKind; 17] = [
        FindingKind::DoublePayment,
        FindingKind::RepeatedRailCall,
        FindingKind::RailCallForUnknownPayout,
        FindingKind::RailCallNotAdmitted,
        FindingKind::PostedWithoutAck,
        FindingKind::PostingMismatch,
        FindingKind::BalanceMismatch,
        FindingKind::LedgerUnbalanced,
        FindingKind::NegativeBalance,
        FindingKind::NegativeAvailableBalance,
        FindingKind::FenceBelowCommittedToken,
        FindingKind::MarkBelowAdmittedToken,
        FindingKind::AmbiguousPayout,
        FindingKind::IntentUnresolved,
        FindingKind::AckedNotPosted,
        FindingKind::SourceUnreadable,
        FindingKind::OperatorResolution,
    ];

    pub fn severity(self) -> Severity {
        match self {
            FindingKind::DoublePayment
            | FindingKind::RepeatedRailCall
            | FindingKind::RailCallForUnknownPayout
            | FindingKind::RailCallNotAdmitted
            | FindingKind::PostedWithoutAck
            | FindingKind::PostingMismatch
            | FindingKind::BalanceMismatch
            | FindingKind::LedgerUnbalanced
            | FindingKind::NegativeBalance
            | FindingKind::NegativeAvailableBalance
            | FindingKind::FenceBelowCommittedToken
            | FindingKind::MarkBelowAdmittedToken => Severity::Incident,
            FindingKind::AmbiguousPayout
            | FindingKind::IntentUnresolved
            | FindingKind::AckedNotPosted
            | FindingKind::SourceUnreadable => Severity::Warning,
            FindingKind::OperatorResolution => Severity::Info,
        }
    }

    /// The wire spelling (`DOUBLE_PAYMENT`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::DoublePayment => "DOUBLE_PAYMENT",
            FindingKind::RepeatedRailCall => "REPEATED_RAIL_CALL",
            FindingKind::RailCallForUnknownPayout => "RAIL_CALL_FOR_UNKNOWN_PAYOUT",
            FindingKind::RailCallNotAdmitted => "RAIL_CALL_NOT_ADMITTED",
            FindingKind::PostedWithoutAck => "POSTED_WITHOUT_ACK",
            FindingKind::PostingMismatch => "POSTING_MISMATCH",
            FindingKind::BalanceMismatch => "BALANCE_MISMATCH",
            FindingKind::LedgerUnbalanced => "LEDGER_UNBALANCED",
            FindingKind::NegativeBalance => "NEGATIVE_BALANCE",
            FindingKind::NegativeAvailableBalance => "NEGATIVE_AVAILABLE_BALANCE",
            FindingKind::FenceBelowCommittedToken => "FENCE_BELOW_COMMITTED_TOKEN",
            FindingKind::MarkBelowAdmittedToken => "MARK_BELOW_ADMITTED_TOKEN",
            FindingKind::AmbiguousPayout => "AMBIGUOUS_PAYOUT",
            FindingKind::IntentUnresolved => "INTENT_UNRESOLVED",
            FindingKind::AckedNotPosted => "ACKED_NOT_POSTED",
            FindingKind::SourceUnreadable => "SOURCE_UNREADABLE",
            FindingKind::OperatorResolution => "OPERATOR_RESOLUTION",
        }
    }
}

/// One thing the reconciler found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    pub kind: FindingKind,
    pub severity: Severity,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payout_id: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_id: Option<String>,
    /// Human-readable; no code parses it.
    pub detail: String,
}

impl Finding {
    pub fn new(kind: FindingKind, payout_id: Option<Uuid>, account_id: Option<&str>, detail: String) -> Finding {
        Finding { kind, severity: kind.severity(), payout_id, account_id: account_id.map(str::to_owned), detail }
    }
}

/// What the rail's record says of a RAIL_AMBIGUOUS payout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AmbiguousClass {
    /// Exactly one call for it moved money: `dlock resolve --as posted` with its reference.
    Paid,
    /// No call for it moved money: `dlock resolve --as failed`, once the rail's statement
    /// agrees.
    NotPaid,
    /// The rail could not be read, or it moved money more than once.
    Unknown,
}

impl AmbiguousClass {
    pub const ALL: [AmbiguousClass; 3] = [AmbiguousClass::Paid, AmbiguousClass::NotPaid, AmbiguousClass::Unknown];

    pub fn as_str(self) -> &'static str {
        match self {
            AmbiguousClass::Paid => "PAID",
            AmbiguousClass::NotPaid => "NOT_PAID",
            AmbiguousClass::Unknown => "UNKNOWN",
        }
    }
}

/// One RAIL_AMBIGUOUS payout and its classification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AmbiguousPayout {
    pub payout_id: Uuid,
    pub account_id: String,
    pub amount_minor: i64,
    pub currency: String,
    pub classification: AmbiguousClass,
    /// Calls the rail received for it, and how many moved money (absent when the rail was
    /// not read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rail_calls: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paid_calls: Option<u64>,
    /// The reference of the one paying call, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rail_reference: Option<String>,
}

/// Whether a source was read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceStatus {
    /// Where it was read (a database scheme, the rail's URL).
    pub source: String,
    pub read: bool,
    /// Why not, when `read` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl SourceStatus {
    pub fn read(source: impl Into<String>) -> SourceStatus {
        SourceStatus { source: source.into(), read: true, error: None }
    }

    pub fn unreadable(source: impl Into<String>, error: impl Into<String>) -> SourceStatus {
        SourceStatus { source: source.into(), read: false, error: Some(error.into()) }
    }
}

/// The two sources of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sources {
    pub paydb: SourceStatus,
    pub rail: SourceStatus,
}

/// Fenced-out attempts per enforcement point, as far as paydb remembers them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FencedOut {
    /// FENCED rows in `rail_submission` (enforcement point c).
    pub rail: u64,
    /// Why the account and ledger are absent.
    pub note: String,
}

/// The note on [`FencedOut`].
pub const FENCED_OUT_NOTE: &str = "the payment-resource's account and ledger refusals roll back and are not \
                                   stored; they are counted by lock_fenced_out_total{resource=account|ledger}";

/// Σ DEBIT and Σ CREDIT of one currency's entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CurrencyTotals {
    pub debits_minor: i128,
    pub credits_minor: i128,
}

/// One reconciliation run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The run's "now": the instant every age bound is measured from.
    #[serde(with = "dlock_contract::time::ms")]
    pub checked_at: DateTime<Utc>,
    pub sources: Sources,
    pub payouts_total: u64,
    /// Every state, zeros included.
    pub payouts_by_state: BTreeMap<PayoutState, u64>,
    pub fenced_out: FencedOut,
    /// DUPLICATE rows in `rail_submission` (a repeat of a forwarded payout, refused at step 2).
    pub duplicate_submissions: u64,
    pub ambiguous: Vec<AmbiguousPayout>,
    /// Every class, zeros included.
    pub ambiguous_by_class: BTreeMap<AmbiguousClass, u64>,
    pub rail_calls_total: u64,
    /// Most calls the rail received for one `clientRef` (1 in a healthy run).
    pub max_rail_calls_per_payout: u64,
    pub ledger_totals: BTreeMap<String, CurrencyTotals>,
    /// Σ DEBIT = Σ CREDIT in every currency and every posting, and every CUSTOMER balance
    /// equals its ledger sum.
    pub ledger_balanced: bool,
    pub findings: Vec<Finding>,
    pub incidents: u64,
    pub warnings: u64,
    /// Every source read and no incident-grade finding (warnings allowed).
    pub clean: bool,
}

impl Report {
    /// An empty report at `checked_at` (counts at zero, no findings).
    pub fn empty(checked_at: DateTime<Utc>, sources: Sources) -> Report {
        Report {
            checked_at,
            sources,
            payouts_total: 0,
            payouts_by_state: PayoutState::ALL.into_iter().map(|s| (s, 0)).collect(),
            fenced_out: FencedOut { rail: 0, note: FENCED_OUT_NOTE.to_owned() },
            duplicate_submissions: 0,
            ambiguous: Vec::new(),
            ambiguous_by_class: AmbiguousClass::ALL.into_iter().map(|c| (c, 0)).collect(),
            rail_calls_total: 0,
            max_rail_calls_per_payout: 0,
            ledger_totals: BTreeMap::new(),
            ledger_balanced: true,
            findings: Vec::new(),
            incidents: 0,
            warnings: 0,
            clean: true,
        }
    }

    /// Sorts the findings (incidents first, then by kind, payout and account) and derives
    /// the counts and `clean`.
    pub fn finish(&mut self) {
        self.findings.sort_by(|a, b| {
            (a.severity, a.kind, a.payout_id, &a.account_id, &a.detail).cmp(&(
                b.severity,
                b.kind,
                b.payout_id,
                &b.account_id,
                &b.detail,
            ))
        });
        self.incidents = self.count(Severity::Incident);
        self.warnings = self.count(Severity::Warning);
        self.clean = self.incidents == 0 && self.sources.paydb.read && self.sources.rail.read;
    }

    fn count(&self, severity: Severity) -> u64 {
        self.findings.iter().filter(|f| f.severity == severity).count() as u64
    }

    /// The findings of one kind.
    pub fn of_kind(&self, kind: FindingKind) -> Vec<&Finding> {
        self.findings.iter().filter(|f| f.kind == kind).collect()
    }

    /// 1 when anything incident-grade was found; else 3 when a source could not be read
    /// within its budget; else 0.
    pub fn exit_code(&self) -> u8 {
        if self.findings.iter().any(|f| f.severity == Severity::Incident) {
            EXIT_INCIDENT
        } else if !self.sources.paydb.read || !self.sources.rail.read {
            EXIT_INCOMPLETE
        } else {
            EXIT_CLEAN
        }
    }

    /// The report as a plain-text table for humans.
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        let verdict = match self.exit_code() {
            EXIT_INCIDENT => "INCIDENT",
            EXIT_INCOMPLETE => "INCOMPLETE (a source could not be read)",
            _ => "CLEAN",
        };
        out.push_str(&format!(
            "dlock reconcile at {}: {verdict}\n\n",
            dlock_contract::time::rfc3339_ms(self.checked_at)
        ));
        let source = |s: &SourceStatus| match &s.error {
            None => "read".to_owned(),
            Some(e) => format!("UNREADABLE: {e}"),
        };
        out.push_str(&table(&[
            vec!["source".into(), "where".into(), "status".into()],
            vec!["paydb".into(), self.sources.paydb.source.clone(), source(&self.sources.paydb)],
            vec!["rail".into(), self.sources.rail.source.clone(), source(&self.sources.rail)],
        ]));
        out.push('\n');

        let mut rows = vec![vec!["payout state".into(), "count".into()]];
        for (state, n) in &self.payouts_by_state {
            rows.push(vec![state.as_str().into(), n.to_string()]);
        }
        rows.push(vec!["total".into(), self.payouts_total.to_string()]);
        out.push_str(&table(&rows));
        out.push('\n');

        out.push_str(&table(&[
            vec!["fenced out at".into(), "count".into()],
            vec!["rail".into(), self.fenced_out.rail.to_string()],
            vec!["account, ledger".into(), "not stored (see lock_fenced_out_total)".into()],
            vec!["duplicate submissions".into(), self.duplicate_submissions.to_string()],
        ]));
        out.push('\n');

        let mut rows = vec![vec!["ambiguous".into(), "count".into()]];
        for (class, n) in &self.ambiguous_by_class {
            rows.push(vec![class.as_str().into(), n.to_string()]);
        }
        out.push_str(&table(&rows));
        if !self.ambiguous.is_empty() {
            out.push('\n');
            let mut rows = vec![vec![
                "payout".into(),
                "account".into(),
                "amount".into(),
                "class".into(),
                "calls".into(),
                "paid".into(),
                "rail reference".into(),
            ]];
            for a in &self.ambiguous {
                let n = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
                rows.push(vec![
                    a.payout_id.to_string(),
                    a.account_id.clone(),
                    format!("{} {}", a.amount_minor, a.currency),
                    a.classification.as_str().into(),
                    n(a.rail_calls),
                    n(a.paid_calls),
                    a.rail_reference.clone().unwrap_or_else(|| "-".into()),
                ]);
            }
            out.push_str(&indent(&table(&rows)));
        }
        out.push('\n');

        out.push_str(&table(&[
            vec!["rail calls".into(), "count".into()],
            vec!["total".into(), self.rail_calls_total.to_string()],
            vec!["max per payout".into(), self.max_rail_calls_per_payout.to_string()],
        ]));
        out.push('\n');

        let mut rows = vec![vec!["ledger".into(), "debits".into(), "credits".into()]];
        for (currency, t) in &self.ledger_totals {
            rows.push(vec![currency.clone(), t.debits_minor.to_string(), t.credits_minor.to_string()]);
        }
        out.push_str(&table(&rows));
        let balanced = match (self.sources.paydb.read, self.ledger_balanced) {
            (false, _) => "unknown (paydb was not read)",
            (true, true) => "yes",
            (true, false) => "NO",
        };
        out.push_str(&format!("ledger balanced: {balanced}\n\n"));

        let infos = self.findings.len() as u64 - self.incidents - self.warnings;
        out.push_str(&format!("findings: {} incident, {} warning, {infos} info\n", self.incidents, self.warnings));
        if !self.findings.is_empty() {
            let mut rows =
                vec![vec!["severity".into(), "kind".into(), "payout".into(), "account".into(), "detail".into()]];
            for f in &self.findings {
                rows.push(vec![
                    f.severity.as_str().into(),
                    f.kind.as_str().into(),
                    f.payout_id.map_or_else(|| "-".to_owned(), |p| p.to_string()),
                    f.account_id.clone().unwrap_or_else(|| "-".into()),
                    f.detail.clone(),
                ]);
            }
            out.push_str(&indent(&table(&rows)));
        }
        out
    }
}

/// Left-aligned columns, two spaces apart; the last column is not padded.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|cell| cell.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(cell);
                let pad = widths[c] - cell.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp_millis(1_795_000_000_000).expect("instant")
    }

    fn both_read() -> Sources {
        Sources { paydb: SourceStatus::read("sqlite"), rail: SourceStatus::read("http://127.0.0.1:1/calls") }
    }

    #[test]
    fn every_kind_has_its_wire_spelling_and_a_fixed_severity() {
        for kind in FindingKind::ALL {
            let json = serde_json::to_string(&kind).expect("ser");
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
            let f = Finding::new(kind, None, None, "x".into());
            assert_eq!(f.severity, kind.severity());
            let wire = serde_json::to_value(&f).expect("ser");
            assert_eq!(wire["severity"], kind.severity().as_str());
        }
        assert_eq!(FindingKind::DoublePayment.severity(), Severity::Incident);
        assert_eq!(FindingKind::AmbiguousPayout.severity(), Severity::Warning);
    }

    #[test]
    fn exit_code_is_one_for_an_incident_three_for_an_unread_source_and_zero_otherwise() {
        let mut r = Report::empty(at(), both_read());
        r.findings.push(Finding::new(FindingKind::AmbiguousPayout, None, None, "x".into()));
        r.finish();
        assert_eq!((r.exit_code(), r.clean, r.warnings), (EXIT_CLEAN, true, 1));
        r.sources.rail = SourceStatus::unreadable("rail", "refused");
        r.finish();
        assert_eq!((r.exit_code(), r.clean), (EXIT_INCOMPLETE, false));
        r.findings.push(Finding::new(FindingKind::DoublePayment, None, None, "x".into()));
        r.finish();
        assert_eq!((r.exit_code(), r.clean, r.incidents), (EXIT_INCIDENT, false, 1));
        assert_eq!(r.findings[0].kind, FindingKind::DoublePayment, "incidents come first");
    }

    #[test]
    fn the_json_report_is_camel_case_with_every_state_and_class() {
        let mut r = Report::empty(at(), both_read());
        r.finish();
        let v = serde_json::to_value(&r).expect("ser");
        for key in [
            "checkedAt",
            "sources",
            "payoutsTotal",
            "payoutsByState",
            "fencedOut",
            "duplicateSubmissions",
            "ambiguous",
            "ambiguousByClass",
            "railCallsTotal",
            "maxRailCallsPerPayout",
            "ledgerTotals",
            "ledgerBalanced",
            "findings",
            "incidents",
            "warnings",
            "clean",
        ] {
            assert!(v.get(key).is_some(), "{key} missing from {v}");
        }
        assert_eq!(v["checkedAt"], "2026-11-18T11:06:40.000Z");
        assert_eq!(v["payoutsByState"]["RAIL_AMBIGUOUS"], 0);
        assert_eq!(v["ambiguousByClass"]["NOT_PAID"], 0);
        let back: Report = serde_json::from_value(v).expect("round trip");
        assert_eq!(back, r);
    }

    #[test]
    fn the_table_aligns_its_columns() {
        let mut r = Report::empty(at(), both_read());
        r.findings.push(Finding::new(FindingKind::NegativeBalance, None, Some("acct-1"), "balance -5".into()));
        r.findings.push(Finding::new(FindingKind::OperatorResolution, Some(Uuid::nil()), None, "as POSTED".into()));
        r.finish();
        let text = r.render_table();
        assert!(text.starts_with("dlock reconcile at 2026-11-18T11:06:40.000Z: INCIDENT\n"), "{text}");
        assert!(text.contains("findings: 1 incident, 0 warning, 1 info"), "{text}");
        let header = text.lines().find(|l| l.trim_start().starts_with("severity")).expect("header");
        let row = text.lines().find(|l| l.contains("NEGATIVE_BALANCE")).expect("row");
        assert_eq!(header.find("kind"), row.find("NEGATIVE_BALANCE"), "{text}");
        assert_eq!(header.find("account"), row.find("acct-1"), "{text}");
        assert!(text.contains("ledger balanced: yes"), "{text}");
    }
}
