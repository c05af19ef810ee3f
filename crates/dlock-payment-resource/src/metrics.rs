//! The payment-resource's metrics (C4, issue 13): closed tag-value sets, never a payout or
//! account id as a tag (NFR-09). Every series is registered at 0 on the instance's own
//! recorder and counted after commit; `payout_store_op_seconds{op}` times every paydb call
//! ([`crate::store_timed`]); the backlog age and the pool are read at scrape time.

use std::sync::Arc;

use dlock_http::metrics::{
    Counter, LabeledCounter, OffWriterWrites, PoolGauges, Registry, TaggedHistogram, HOP_BUCKETS_SECONDS,
};

use dlock_contract::fenced::FencedResource;

use crate::store_timed::PaymentStoreOp;

/// `payout_store_op_seconds`: every paydb call of this instance (buckets 0.5 ms .. 10 s).
pub const STORE_OP_SECONDS: &str = "payout_store_op_seconds";

/// Values of the `resource` tag on `lock_fenced_out_total` (C4). `rail` stays 0 here: the
/// proxy counts its own refusals.
pub const FENCED_RESOURCES: [&str; 3] =
    [FencedResource::Account.as_str(), FencedResource::Ledger.as_str(), FencedResource::Rail.as_str()];
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
    registry: Registry,
    pub fenced_out: LabeledCounter<3>,
    pub claims: LabeledCounter<5>,
    pub posts: LabeledCounter<4>,
    pub idempotency: LabeledCounter<3>,
    pub purged: Counter,
    pub store_ops: Arc<TaggedHistogram<PaymentStoreOp>>,
    pub store_writes_off_writer: Arc<OffWriterWrites>,
    pub pool: PoolGauges,
    backlog_age: metrics::Gauge,
}

impl Default for PaymentMetrics {
    fn default() -> Self {
        let registry = Registry::new(&[(STORE_OP_SECONDS, &HOP_BUCKETS_SECONDS)]);
        let r = &registry;
        PaymentMetrics {
            fenced_out: LabeledCounter::new(
                r,
                "lock_fenced_out_total",
                "Writes refused because the presented token did not exceed the stored fence. Incident-grade.",
                "resource",
                FENCED_RESOURCES,
            ),
            claims: LabeledCounter::new(r, "payout_claim_total", "Claims (P2) by outcome.", "outcome", CLAIM_OUTCOMES),
            posts: LabeledCounter::new(r, "payout_post_total", "Posts (P3) by outcome.", "outcome", POST_OUTCOMES),
            idempotency: LabeledCounter::new(
                r,
                "idempotency_request_total",
                "Mutating requests by what the idempotency ledger decided.",
                "outcome",
                IDEMPOTENCY_OUTCOMES,
            ),
            purged: Counter::new(r, "idempotency_purged_total", "Expired idempotency records deleted."),
            store_ops: Arc::new(TaggedHistogram::new(
                r,
                STORE_OP_SECONDS,
                "paydb calls of this payment-resource by operation (the PaymentStore method), seconds.",
            )),
            store_writes_off_writer: Arc::new(OffWriterWrites::new(r, "payout_store_writes_off_writer_total")),
            pool: PoolGauges::new(r),
            backlog_age: r.gauge("payout_backlog_age_seconds", "Age of the oldest PENDING payout (0 when none).", &[]),
            registry,
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

    /// The exposition text; `backlog_age_seconds` is read from paydb at scrape time (0
    /// when it could not be read).
    pub fn render(&self, backlog_age_seconds: Option<f64>) -> String {
        self.backlog_age.set(backlog_age_seconds.unwrap_or(0.0));
        self.registry.render()
    }
}
