//! The executor's metrics (C4, issue 13), on the instance's own recorder, closed tag sets,
//! no ids as tags (NFR-09):
//! - `payout_execute_total{outcome}`: attempts at a payout by how they ended;
//! - `payout_backlog_age_seconds`: the oldest PENDING payout at the last scan;
//! - `payout_hop_seconds{hop}`: each hop of the critical section ([`Hop`]), measured on the
//!   executor's `dlock-rt` clock around the call, answered or not;
//! - `payout_end_to_end_seconds{outcome}`: a payout from its `createdAt` (P1, the
//!   payment-resource's wall clock) to this executor seeing it end POSTED or FAILED (its
//!   wall clock); when `createdAt` is unknown, from the start of the critical section that
//!   ended it (its monotonic clock).

use std::sync::atomic::{AtomicI64, Ordering};

use dlock_http::metrics::{
    ClosedTag, LabeledCounter, Registry, TaggedHistogram, END_TO_END_BUCKETS_SECONDS, HOP_BUCKETS_SECONDS,
};

/// `payout_hop_seconds` (buckets 0.5 ms .. 10 s).
pub const HOP_SECONDS: &str = "payout_hop_seconds";
/// `payout_end_to_end_seconds` (buckets 5 ms .. 60 s).
pub const END_TO_END_SECONDS: &str = "payout_end_to_end_seconds";

/// A hop of the critical section (`payout_hop_seconds{hop}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hop {
    /// L4 at the lock server (waiting in its queue included).
    Acquire,
    /// P4, the re-read under the grant (FR-14).
    Reread,
    /// P2 at the payment-resource.
    Claim,
    /// The submission to the rail-proxy (which calls the rail).
    Submit,
    /// P3 at the payment-resource.
    Post,
    /// L6 at the lock server.
    Release,
}

impl ClosedTag for Hop {
    const LABEL: &'static str = "hop";

    fn all() -> &'static [Self] {
        &[Hop::Acquire, Hop::Reread, Hop::Claim, Hop::Submit, Hop::Post, Hop::Release]
    }

    fn tag(self) -> &'static str {
        match self {
            Hop::Acquire => "acquire",
            Hop::Reread => "reread",
            Hop::Claim => "claim",
            Hop::Submit => "submit",
            Hop::Post => "post",
            Hop::Release => "release",
        }
    }
}

/// How a payout ended for `payout_end_to_end_seconds{outcome}`: the terminal outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Terminal {
    Posted,
    Failed,
}

impl Terminal {
    /// The terminal outcome `o` is, if it is one.
    pub fn of(o: Outcome) -> Option<Terminal> {
        match o {
            Outcome::Posted => Some(Terminal::Posted),
            Outcome::Failed => Some(Terminal::Failed),
            _ => None,
        }
    }
}

impl ClosedTag for Terminal {
    const LABEL: &'static str = "outcome";

    fn all() -> &'static [Self] {
        &[Terminal::Posted, Terminal::Failed]
    }

    fn tag(self) -> &'static str {
        match self {
            Terminal::Posted => "posted",
            Terminal::Failed => "failed",
        }
    }
}

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
    registry: Registry,
    pub execute: LabeledCounter<9>,
    /// Age of the oldest PENDING payout seen by the last scan, in milliseconds.
    backlog_age_ms: AtomicI64,
    backlog_age: metrics::Gauge,
    pub hops: TaggedHistogram<Hop>,
    pub end_to_end: TaggedHistogram<Terminal>,
}

impl Default for ExecutorMetrics {
    fn default() -> Self {
        let registry =
            Registry::new(&[(HOP_SECONDS, &HOP_BUCKETS_SECONDS), (END_TO_END_SECONDS, &END_TO_END_BUCKETS_SECONDS)]);
        let r = &registry;
        ExecutorMetrics {
            execute: LabeledCounter::new(
                r,
                "payout_execute_total",
                "Attempts at a payout by how they ended. fenced and duplicate page.",
                "outcome",
                Outcome::ALL.map(Outcome::tag),
            ),
            backlog_age_ms: AtomicI64::new(0),
            backlog_age: r.gauge(
                "payout_backlog_age_seconds",
                "Age of the oldest PENDING payout at the last scan.",
                &[],
            ),
            hops: TaggedHistogram::new(
                r,
                HOP_SECONDS,
                "Hops of the executor's critical section by hop, seconds (answered or not).",
            ),
            end_to_end: TaggedHistogram::new(
                r,
                END_TO_END_SECONDS,
                "Payouts from createdAt to the executor seeing them POSTED or FAILED, seconds.",
            ),
            registry,
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
        let ms = ms.max(0);
        self.backlog_age_ms.store(ms, Ordering::Relaxed);
        self.backlog_age.set(ms as f64 / 1000.0);
    }

    pub fn backlog_age_ms(&self) -> i64 {
        self.backlog_age_ms.load(Ordering::Relaxed)
    }

    pub fn render(&self) -> String {
        self.registry.render()
    }
}
