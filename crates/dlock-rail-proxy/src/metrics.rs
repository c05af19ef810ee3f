//! The proxy's metrics (C4): closed tag-value sets, never a payout id as a tag (NFR-09).

use dlock_contract::rail::SubmissionOutcome;
use dlock_http::metrics::{Counter, LabeledCounter};

/// Values of the `resource` tag on `lock_fenced_out_total` (C4 §resources).
pub const FENCED_RESOURCES: [&str; 3] = ["account", "ledger", "rail"];
/// Index of `rail` in [`FENCED_RESOURCES`].
pub const RESOURCE_RAIL: usize = 2;

#[derive(Debug)]
pub struct ProxyMetrics {
    pub submissions: LabeledCounter<6>,
    pub duplicates: Counter,
    pub fenced_out: LabeledCounter<3>,
}

impl Default for ProxyMetrics {
    fn default() -> Self {
        ProxyMetrics {
            submissions: LabeledCounter::new(
                "rail_submission_total",
                "Rail submission attempts by recorded outcome.",
                "outcome",
                SubmissionOutcome::ALL.map(SubmissionOutcome::tag),
            ),
            duplicates: Counter::new(
                "rail_duplicate_attempted_total",
                "Submissions refused because the payout already had a forwardable attempt. Pages.",
            ),
            fenced_out: LabeledCounter::new(
                "lock_fenced_out_total",
                "Writes refused because the presented token did not exceed the stored fence. Incident-grade.",
                "resource",
                FENCED_RESOURCES,
            ),
        }
    }
}

impl ProxyMetrics {
    pub fn outcome(&self, o: SubmissionOutcome) {
        let index = SubmissionOutcome::ALL.iter().position(|x| *x == o).unwrap_or(0);
        self.submissions.inc(index);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        self.submissions.render(&mut out);
        self.duplicates.render(&mut out);
        self.fenced_out.render(&mut out);
        out
    }
}
