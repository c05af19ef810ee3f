//! The payment-resource's metrics (C4): closed tag-value sets, never a payout or account id
//! as a tag (NFR-09). Every series is registered at 0 and counted after commit.

use dlock_http::metrics::{Counter, LabeledCounter};

/// Values of the `resource` tag on `lock_fenced_out_total` (C4). `rail` stays 0 here: the
/// proxy counts its own refusals.
pub const FENCED_RESOURCES: [&str; 3] = ["account", "ledger", "rail"];
pub const RESOURCE_ACCOUNT: usize = 0;
pub const RESOURCE_LEDGER: usize = 1;

/// `payout_claim_total{outcome}`.
pub const CLAIM_OUTCOMES: [&str; 5] = ["claimed", "reclaimed", "fenced", "not_claimable", "insufficient_funds"];
/// `payout_post_total{outcome}`.
pub const POST_OUTCOMES: [&str; 4] = ["posted", "fenced", "not_claimable", "rail_mismatch"];
/// `idempotency_request_total{outcome}`.
pub const IDEMPOTENCY_OUTCOMES: [&str; 3] = ["executed", "replayed", "conflict"];

#[derive(Debug)]
pub struct PaymentMetrics {
    pub fenced_out: LabeledCounter<3>,
    pub claims: LabeledCounter<5>,
    pub posts: LabeledCounter<4>,
    pub idempotency: LabeledCounter<3>,
    pub purged: Counter,
}

impl Default for PaymentMetrics {
    fn default() -> Self {
        PaymentMetrics {
            fenced_out: LabeledCounter::new(
                "lock_fenced_out_total",
                "Writes refused because the presented token did not exceed the stored fence. Incident-grade.",
                "resource",
                FENCED_RESOURCES,
            ),
            claims: LabeledCounter::new("payout_claim_total", "Claims (P2) by outcome.", "outcome", CLAIM_OUTCOMES),
            posts: LabeledCounter::new("payout_post_total", "Posts (P3) by outcome.", "outcome", POST_OUTCOMES),
            idempotency: LabeledCounter::new(
                "idempotency_request_total",
                "Mutating requests by what the idempotency ledger decided.",
                "outcome",
                IDEMPOTENCY_OUTCOMES,
            ),
            purged: Counter::new("idempotency_purged_total", "Expired idempotency records deleted."),
        }
    }
}

fn index(values: &[&str], tag: &str) -> usize {
    values.iter().position(|v| *v == tag).unwrap_or(0)
}

impl PaymentMetrics {
    pub fn claim(&self, tag: &str) {
        self.claims.inc(index(&CLAIM_OUTCOMES, tag));
    }

    pub fn post(&self, tag: &str) {
        self.posts.inc(index(&POST_OUTCOMES, tag));
    }

    pub fn idempotency(&self, tag: &str) {
        self.idempotency.inc(index(&IDEMPOTENCY_OUTCOMES, tag));
    }

    /// The exposition text; `backlog_age_seconds` is read from paydb at scrape time.
    pub fn render(&self, backlog_age_seconds: Option<f64>) -> String {
        let mut out = String::new();
        self.fenced_out.render(&mut out);
        self.claims.render(&mut out);
        self.posts.render(&mut out);
        self.idempotency.render(&mut out);
        self.purged.render(&mut out);
        out.push_str("# HELP payout_backlog_age_seconds Age of the oldest PENDING payout (0 when none).\n");
        out.push_str("# TYPE payout_backlog_age_seconds gauge\n");
        out.push_str(&format!("payout_backlog_age_seconds {}\n", backlog_age_seconds.unwrap_or(0.0)));
        out
    }
}
