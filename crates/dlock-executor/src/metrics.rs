//! The executor's metrics (C4): `payout_execute_total{outcome}` and
//! `payout_backlog_age_seconds`, closed tag sets, no ids as tags (NFR-09).

use std::sync::atomic::{AtomicI64, Ordering};

use dlock_http::metrics::LabeledCounter;

/// How one attempt at a payout ended (`payout_execute_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// Claimed, acknowledged by the rail, and posted to the ledger.
    Posted,
    /// Insufficient funds, or declined by the rail: the payout is FAILED.
    Failed,
    /// The proxy answered `RAIL_AMBIGUOUS`: quarantined, never submitted again.
    Ambiguous,
    /// `FENCED_OUT` at the account, the ledger or the rail. Incident-grade.
    Fenced,
    /// `DUPLICATE_SUBMISSION` at the proxy. Pages.
    Duplicate,
    /// Another worker moved the payout first (`PAYOUT_NOT_CLAIMABLE`).
    NotClaimable,
    /// A hop could not decide (503, unreachable, an unexpected answer): nothing to undo; the
    /// payout is taken up again on a later scan.
    Unavailable,
    /// The local lease deadline passed before a fenced write: the executor did not write.
    LeaseLost,
    /// The submission's answer was lost: the proxy decides the outcome, and a later scan
    /// acts on the state it recorded. Never resubmitted.
    AnswerLost,
}

impl Outcome {
    pub const ALL: [Outcome; 9] = [
        Outcome::Posted,
        Outcome::Failed,
        Outcome::Ambiguous,
        Outcome::Fenced,
        Outcome::Duplicate,
        Outcome::NotClaimable,
        Outcome::Unavailable,
        Outcome::LeaseLost,
        Outcome::AnswerLost,
    ];

    pub fn tag(self) -> &'static str {
        match self {
            Outcome::Posted => "posted",
            Outcome::Failed => "failed",
            Outcome::Ambiguous => "ambiguous",
            Outcome::Fenced => "fenced",
            Outcome::Duplicate => "duplicate",
            Outcome::NotClaimable => "not_claimable",
            Outcome::Unavailable => "unavailable",
            Outcome::LeaseLost => "lease_lost",
            Outcome::AnswerLost => "answer_lost",
        }
    }
}

#[derive(Debug)]
pub struct ExecutorMetrics {
    pub execute: LabeledCounter<9>,
    /// Age of the oldest PENDING payout seen by the last scan, in milliseconds.
    backlog_age_ms: AtomicI64,
}

impl Default for ExecutorMetrics {
    fn default() -> Self {
        ExecutorMetrics {
            execute: LabeledCounter::new(
                "payout_execute_total",
                "Attempts at a payout by how they ended. fenced and duplicate page.",
                "outcome",
                Outcome::ALL.map(Outcome::tag),
            ),
            backlog_age_ms: AtomicI64::new(0),
        }
    }
}

impl ExecutorMetrics {
    pub fn count(&self, o: Outcome) {
        let index = Outcome::ALL.iter().position(|x| *x == o).unwrap_or(0);
        self.execute.inc(index);
    }

    pub fn get(&self, o: Outcome) -> u64 {
        let index = Outcome::ALL.iter().position(|x| *x == o).unwrap_or(0);
        self.execute.get(index)
    }

    pub fn set_backlog_age_ms(&self, ms: i64) {
        self.backlog_age_ms.store(ms.max(0), Ordering::Relaxed);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        self.execute.render(&mut out);
        out.push_str("# HELP payout_backlog_age_seconds Age of the oldest PENDING payout at the last scan.\n");
        out.push_str("# TYPE payout_backlog_age_seconds gauge\n");
        let ms = self.backlog_age_ms.load(Ordering::Relaxed);
        out.push_str(&format!("payout_backlog_age_seconds {}\n", ms as f64 / 1000.0));
        out
    }
}
