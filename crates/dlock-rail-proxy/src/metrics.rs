//! The proxy's metrics (C4, issue 13): closed tag-value sets, never a payout id as a tag
//! (NFR-09), on the instance's own recorder. `rail_call_seconds{outcome}` times the one call
//! to the rail per admitted submission; `rail_store_op_seconds{op}` times every store call
//! ([`crate::store_timed`]); the SQL pool is read at scrape time.

use std::sync::Arc;

use dlock_contract::rail::SubmissionOutcome;
use dlock_http::metrics::{
    ClosedTag, Counter, LabeledCounter, OffWriterWrites, PoolGauges, Registry, TaggedHistogram, HOP_BUCKETS_SECONDS,
    RAIL_BUCKETS_SECONDS,
};

use crate::store_timed::RailStoreOp;

/// Values of the `resource` tag on `lock_fenced_out_total` (C4 §resources).
pub const FENCED_RESOURCES: [&str; 3] = ["account", "ledger", "rail"];
/// Index of `rail` in [`FENCED_RESOURCES`].
pub const RESOURCE_RAIL: usize = 2;

/// `rail_call_seconds`: proxy → rail calls (buckets 1 ms .. 30 s).
pub const RAIL_CALL_SECONDS: &str = "rail_call_seconds";
/// `rail_store_op_seconds`: every store call of this proxy (buckets 0.5 ms .. 10 s).
pub const STORE_OP_SECONDS: &str = "rail_store_op_seconds";

/// How one call to the rail ended (`rail_call_seconds{outcome}`): the outcome class the
/// proxy records for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RailCall {
    /// A well-formed 200.
    Acked,
    /// A decline (402).
    Rejected,
    /// Any other answer, or none: the rail may have acted.
    Ambiguous,
    /// The connection could not be opened; nothing was sent.
    Unsent,
}

impl RailCall {
    /// The class of a forward whose recorded outcome is `o`.
    pub fn of(o: SubmissionOutcome) -> RailCall {
        match o {
            SubmissionOutcome::Acked => RailCall::Acked,
            SubmissionOutcome::Rejected => RailCall::Rejected,
            SubmissionOutcome::Unsent => RailCall::Unsent,
            // A forward never records FENCED or DUPLICATE; if it did, the money's fate is
            // what is unknown.
            SubmissionOutcome::Timeout | SubmissionOutcome::Fenced | SubmissionOutcome::Duplicate => {
                RailCall::Ambiguous
            }
        }
    }
}

impl ClosedTag for RailCall {
    const LABEL: &'static str = "outcome";

    fn all() -> &'static [Self] {
        &[RailCall::Acked, RailCall::Rejected, RailCall::Ambiguous, RailCall::Unsent]
    }

    fn tag(self) -> &'static str {
        match self {
            RailCall::Acked => "acked",
            RailCall::Rejected => "rejected",
            RailCall::Ambiguous => "ambiguous",
            RailCall::Unsent => "unsent",
        }
    }
}

#[derive(Debug)]
pub struct ProxyMetrics {
    registry: Registry,
    pub submissions: LabeledCounter<6>,
    pub duplicates: Counter,
    pub fenced_out: LabeledCounter<3>,
    pub rail_calls: TaggedHistogram<RailCall>,
    pub store_ops: Arc<TaggedHistogram<RailStoreOp>>,
    pub store_writes_off_writer: Arc<OffWriterWrites>,
    pub pool: PoolGauges,
}

impl Default for ProxyMetrics {
    fn default() -> Self {
        let registry =
            Registry::new(&[(RAIL_CALL_SECONDS, &RAIL_BUCKETS_SECONDS), (STORE_OP_SECONDS, &HOP_BUCKETS_SECONDS)]);
        let r = &registry;
        ProxyMetrics {
            submissions: LabeledCounter::new(
                r,
                "rail_submission_total",
                "Rail submission attempts by recorded outcome.",
                "outcome",
                SubmissionOutcome::ALL.map(SubmissionOutcome::tag),
            ),
            duplicates: Counter::new(
                r,
                "rail_duplicate_attempted_total",
                "Submissions refused because the payout already had a forwardable attempt. Pages.",
            ),
            fenced_out: LabeledCounter::new(
                r,
                "lock_fenced_out_total",
                "Writes refused because the presented token did not exceed the stored fence. Incident-grade.",
                "resource",
                FENCED_RESOURCES,
            ),
            rail_calls: TaggedHistogram::new(
                r,
                RAIL_CALL_SECONDS,
                "Calls from this proxy to the rail by outcome class, seconds (connect to answer or timeout).",
            ),
            store_ops: Arc::new(TaggedHistogram::new(
                r,
                STORE_OP_SECONDS,
                "Store calls of this rail-proxy by operation (the RailStore method), seconds.",
            )),
            store_writes_off_writer: Arc::new(OffWriterWrites::new(r, "rail_store_writes_off_writer_total")),
            pool: PoolGauges::new(r),
            registry,
        }
    }
}

impl ProxyMetrics {
    pub fn outcome(&self, o: SubmissionOutcome) {
        let index = SubmissionOutcome::ALL.iter().position(|x| *x == o).unwrap_or(0);
        self.submissions.inc(index);
    }

    pub fn render(&self) -> String {
        self.registry.render()
    }
}
