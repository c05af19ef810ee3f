//! The store fault layer: a [`StoreFaultPlan`] decides, for each call of a store operation,
//! whether to delay it, refuse it (`Unavailable`) or run it and lose its acknowledgement
//! (`CommitUnknown`), from seeded rates, time windows and scripted one-shots; the
//! `Planned*Store` wrappers put a plan in front of any `LockStore`, `PaymentStore` or
//! `RailStore` (the simulation's memory stores, which outlive every node).
//!
//! Invariants:
//! - `Unavailable` fails the call before any of it runs (provably nothing happened);
//!   `CommitUnknown` runs the call to completion and then fails it, so the write is
//!   committed although the caller saw an error. A call that failed by itself is answered
//!   as it failed (no ack to lose).
//! - A lost ack on the intent row (`admit`), the claim or the post fires the coverage probe
//!   `LostAckIntent` / `LostAckClaim` / `LostAckPost` at the moment it is injected.
//! - Rates draw from the runtime's seeded stream only when they are non-zero, so a plan
//!   that injects nothing leaves the seed's random stream, and so its trace, unchanged.
//! - Latency is slept on madsim's global timer (a database's latency is real time, whatever
//!   the calling node's clock drift).
//!
//! Store errors: an injected class becomes each store's own error through dlock-contract's
//! one classification (`ClassifiedStoreError::of_fault` with `StoreFault::Unavailable` or
//! `StoreFault::CommitUnknown`), so the services answer it exactly as they answer the real
//! failure. The services' own `Faulty*Store` wrappers (per-operation queues) stay the
//! unit-test hook; this plan adds time windows, latency and seeded rates for the world.

use dlock_rt::probe::Probe;

/// Bound on the plan's record of injected faults.
pub const STORE_RECORD_LEN_MAX: usize = 100_000;
/// Bound on one injected latency.
pub const STORE_LATENCY_MS_MAX: u64 = 60_000;

/// The databases of a world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StoreName {
    /// paydb: the payment-resource's and the rail-proxy's tables.
    Paydb,
    /// lockdb: the lock server's store (the simulation store or etcd through its client).
    Lockdb,
}

impl StoreName {
    pub fn parse(s: &str) -> Option<StoreName> {
        match s {
            "paydb" => Some(StoreName::Paydb),
            "lockdb" => Some(StoreName::Lockdb),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            StoreName::Paydb => "paydb",
            StoreName::Lockdb => "lockdb",
        }
    }
    /// The operations (trait method names) of this store.
    pub fn ops(self) -> &'static [&'static str] {
        match self {
            StoreName::Paydb => PAYDB_OPS,
            StoreName::Lockdb => LOCKDB_OPS,
        }
    }
}

/// paydb's operations: `PaymentStore`'s then `RailStore`'s (`payout` and `ping` are both's).
pub const PAYDB_OPS: &[&str] = &[
    "ping",
    "cursor_secret",
    "create_account",
    "create_payout",
    "claim",
    "post",
    "claim_batch",
    "post_batch",
    "abandon",
    "resolve_ambiguous",
    "resolve_recorded",
    "resolutions",
    "payout",
    "account",
    "accounts",
    "list",
    "ledger",
    "oldest_pending_created_at",
    "purge_idempotency",
    "idempotency_record_count",
    "admit",
    "resolve",
    "admit_batch",
    "resolve_batch",
    "high_water",
    "submissions",
    "unresolved_before",
    "insert_payout",
    "read_events",
    "purge_events",
];

/// lockdb's operations (`LockStore`'s methods).
pub const LOCKDB_OPS: &[&str] = &[
    "ping",
    "now_ms",
    "open_session",
    "heartbeat",
    "close_session",
    "acquire",
    "renew",
    "release",
    "rotate",
    "info",
    "held_keys",
    "revoke",
    "reap",
    "owner_of",
];

/// Operations that write (a lost ack only means something for these).
pub const WRITE_OPS: &[&str] = &[
    "cursor_secret",
    "create_account",
    "create_payout",
    "claim",
    "post",
    "claim_batch",
    "post_batch",
    "abandon",
    "resolve_ambiguous",
    "resolve_recorded",
    "purge_idempotency",
    "purge_events",
    "admit",
    "resolve",
    "admit_batch",
    "resolve_batch",
    "insert_payout",
    "open_session",
    "heartbeat",
    "close_session",
    "acquire",
    "renew",
    "release",
    "rotate",
    "revoke",
    "reap",
];

/// The class of an injected failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Injected {
    /// Nothing happened.
    Unavailable,
    /// The call committed; its answer was lost.
    CommitUnknown,
}

/// The probe a lost ack of `op` fires, if any.
pub fn lost_ack_probe(store: StoreName, op: &str) -> Option<Probe> {
    match (store, op) {
        (StoreName::Paydb, "admit" | "admit_batch") => Some(Probe::LostAckIntent),
        (StoreName::Paydb, "claim" | "claim_batch") => Some(Probe::LostAckClaim),
        (StoreName::Paydb, "post" | "post_batch") => Some(Probe::LostAckPost),
        _ => None,
    }
}

#[cfg(madsim)]
pub use plan::*;

#[cfg(madsim)]
mod plan {
    use std::collections::{BTreeMap, VecDeque};
    use std::sync::{Arc, Mutex};

    use dlock_contract::store::{ClassifiedStoreError, StoreFault};
    use dlock_rt::probe;

    use super::{lost_ack_probe, Injected, StoreName, STORE_LATENCY_MS_MAX, STORE_RECORD_LEN_MAX, WRITE_OPS};
    use crate::faults::now_ms;

    /// Seeded per-call rates.
    #[derive(Debug, Clone, Copy, PartialEq, Default)]
    pub struct StoreRates {
        /// Probability a call is refused `Unavailable`.
        pub unavailable: f64,
        /// Probability a write commits and loses its ack.
        pub commit_unknown: f64,
        /// Probability a call is delayed, by up to `latency_ms_max`.
        pub latency_p: f64,
        pub latency_ms_max: u64,
    }

    impl StoreRates {
        fn is_zero(&self) -> bool {
            self.unavailable <= 0.0 && self.commit_unknown <= 0.0 && (self.latency_p <= 0.0 || self.latency_ms_max == 0)
        }
    }

    /// What the plan decided for one call.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct Decision {
        pub delay_ms: u64,
        pub fault: Option<Injected>,
    }

    /// One injected fault, for the trace.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct StoreFaultRecord {
        pub at_ms: u64,
        pub store: StoreName,
        pub op: &'static str,
        pub decision: Decision,
    }

    #[derive(Debug, Clone)]
    struct Window {
        store: StoreName,
        /// `None`: every operation of the store.
        op: Option<String>,
        from_ms: u64,
        to_ms: u64,
        /// Latency during the window; `None`: the store is unavailable.
        latency_ms: Option<u64>,
    }

    #[derive(Debug, Default)]
    struct PlanState {
        rates: BTreeMap<StoreName, StoreRates>,
        op_rates: BTreeMap<(StoreName, String), StoreRates>,
        windows: Vec<Window>,
        queued: BTreeMap<(StoreName, String), VecDeque<Injected>>,
        record: Vec<StoreFaultRecord>,
    }

    /// The store faults of one world (module doc). Share it with `Arc`.
    #[derive(Debug, Default)]
    pub struct StoreFaultPlan {
        state: Mutex<PlanState>,
    }

    fn clamp_p(p: f64) -> f64 {
        if p.is_finite() {
            p.clamp(0.0, 1.0)
        } else {
            0.0
        }
    }

    fn draw(p: f64) -> bool {
        use madsim::rand::Rng;
        p > 0.0 && madsim::rand::thread_rng().gen_bool(clamp_p(p))
    }

    impl StoreFaultPlan {
        pub fn new() -> StoreFaultPlan {
            StoreFaultPlan::default()
        }

        fn with<R>(&self, f: impl FnOnce(&mut PlanState) -> R) -> R {
            let mut g = match self.state.lock() {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            f(&mut g)
        }

        /// Seeded rates for every operation of `store`.
        pub fn set_rates(&self, store: StoreName, rates: StoreRates) {
            self.with(|s| s.rates.insert(store, rates));
        }

        /// Seeded rates for one operation (over the store's).
        pub fn set_op_rates(&self, store: StoreName, op: &str, rates: StoreRates) {
            self.with(|s| s.op_rates.insert((store, op.to_owned()), rates));
        }

        /// The next `count` calls of `op` fail in class `fault` (scripted, in order).
        pub fn inject(&self, store: StoreName, op: &str, fault: Injected, count: u32) {
            self.with(|s| {
                let q = s.queued.entry((store, op.to_owned())).or_default();
                for _ in 0..count {
                    q.push_back(fault);
                }
            });
        }

        /// `store` (one operation, or all when `op` is `None`) is unavailable for `for_ms` from
        /// now: NOT_LEADER at the lock server for lockdb, RAIL_UNAVAILABLE / NOT_READY for paydb.
        pub fn unavailable_for(&self, store: StoreName, op: Option<&str>, for_ms: u64) {
            let from_ms = now_ms();
            self.with(|s| {
                s.windows.push(Window {
                    store,
                    op: op.map(str::to_owned),
                    from_ms,
                    to_ms: from_ms.saturating_add(for_ms),
                    latency_ms: None,
                })
            });
        }

        /// Every call of `store` (or of `op`) takes `latency_ms` longer for `for_ms` from now.
        pub fn latency_for(&self, store: StoreName, op: Option<&str>, latency_ms: u64, for_ms: u64) {
            let from_ms = now_ms();
            self.with(|s| {
                s.windows.push(Window {
                    store,
                    op: op.map(str::to_owned),
                    from_ms,
                    to_ms: from_ms.saturating_add(for_ms),
                    latency_ms: Some(latency_ms.min(STORE_LATENCY_MS_MAX)),
                })
            });
        }

        /// Forgets every rate, window and queued fault (the liveness phase's heal).
        pub fn heal(&self) {
            self.with(|s| {
                s.rates.clear();
                s.op_rates.clear();
                s.windows.clear();
                s.queued.clear();
            });
        }

        /// Every fault injected so far.
        pub fn record(&self) -> Vec<StoreFaultRecord> {
            self.with(|s| s.record.clone())
        }

        /// The record as trace lines.
        pub fn trace(&self) -> Vec<String> {
            self.record()
                .iter()
                .map(|r| {
                    let fault = r.decision.fault.map_or("-".to_owned(), |f| format!("{f:?}"));
                    format!(
                        "store-fault @{}ms: {} {} delay={}ms fault={fault}",
                        r.at_ms,
                        r.store.as_str(),
                        r.op,
                        r.decision.delay_ms
                    )
                })
                .collect()
        }

        /// Decides one call of `op` on `store` (queued one-shots first, then windows, then rates).
        pub fn decide(&self, store: StoreName, op: &'static str) -> Decision {
            let at = now_ms();
            let decision = self.with(|s| {
                let mut d = Decision::default();
                if let Some(q) = s.queued.get_mut(&(store, op.to_owned())) {
                    d.fault = q.pop_front();
                    if q.is_empty() {
                        s.queued.remove(&(store, op.to_owned()));
                    }
                }
                s.windows.retain(|w| w.to_ms > at);
                for w in s.windows.iter().filter(|w| w.store == store && w.from_ms <= at) {
                    if w.op.as_deref().is_some_and(|o| o != op) {
                        continue;
                    }
                    match w.latency_ms {
                        Some(ms) => d.delay_ms = d.delay_ms.max(ms),
                        None => d.fault = d.fault.or(Some(Injected::Unavailable)),
                    }
                }
                let rates = s.op_rates.get(&(store, op.to_owned())).or_else(|| s.rates.get(&store)).copied();
                if let Some(r) = rates.filter(|r| !r.is_zero()) {
                    if d.fault.is_none() && draw(r.unavailable) {
                        d.fault = Some(Injected::Unavailable);
                    }
                    if d.fault.is_none() && WRITE_OPS.contains(&op) && draw(r.commit_unknown) {
                        d.fault = Some(Injected::CommitUnknown);
                    }
                    if r.latency_ms_max > 0 && draw(r.latency_p) {
                        use madsim::rand::Rng;
                        let ms = madsim::rand::thread_rng().gen_range(1..=r.latency_ms_max.min(STORE_LATENCY_MS_MAX));
                        d.delay_ms = d.delay_ms.max(ms);
                    }
                }
                if d != Decision::default() && s.record.len() < STORE_RECORD_LEN_MAX {
                    s.record.push(StoreFaultRecord { at_ms: at, store, op, decision: d });
                }
                d
            });
            debug_assert!(decision.delay_ms <= STORE_LATENCY_MS_MAX);
            decision
        }

        /// Runs `call` (one call of `op`, not yet polled) under the plan's decision for it.
        pub async fn run<T, E: InjectError>(
            &self,
            store: StoreName,
            op: &'static str,
            call: impl std::future::Future<Output = Result<T, E>>,
        ) -> Result<T, E> {
            let d = self.decide(store, op);
            if d.delay_ms > 0 {
                madsim::time::sleep(std::time::Duration::from_millis(d.delay_ms)).await;
            }
            match d.fault {
                None => call.await,
                Some(Injected::Unavailable) => Err(E::injected(Injected::Unavailable, op)),
                Some(Injected::CommitUnknown) => {
                    call.await?;
                    if let Some(p) = lost_ack_probe(store, op) {
                        probe::hit(p);
                    }
                    Err(E::injected(Injected::CommitUnknown, op))
                }
            }
        }
    }

    /// A store error an injected fault can be answered as: every store's error, through
    /// dlock-contract's one classification.
    pub trait InjectError: Sized {
        fn injected(fault: Injected, op: &str) -> Self;
    }

    impl<E: ClassifiedStoreError> InjectError for E {
        fn injected(fault: Injected, op: &str) -> Self {
            let class = match fault {
                Injected::Unavailable => StoreFault::Unavailable,
                Injected::CommitUnknown => StoreFault::CommitUnknown,
            };
            E::of_fault(class, format!("injected into {op}"))
        }
    }

    // ---- the wrappers ------------------------------------------------------------------------

    use dlock_http::metrics::ClosedTag;
    use dlock_lock_server::store as ls;
    use dlock_lock_server::store_layer as ls_layer;
    use dlock_payment_resource::store as ps;
    use dlock_payment_resource::store_layer as ps_layer;
    use dlock_rail_proxy::store as rs;
    use dlock_rail_proxy::store_layer as rs_layer;

    /// A `LockStore` behind a plan (lockdb).
    pub struct PlannedLockStore {
        pub inner: Arc<dyn ls::LockStore>,
        pub plan: Arc<StoreFaultPlan>,
    }

    /// A `PaymentStore` behind a plan (paydb).
    pub struct PlannedPaymentStore {
        pub inner: Arc<dyn ps::PaymentStore>,
        pub plan: Arc<StoreFaultPlan>,
    }

    /// A `RailStore` behind a plan (paydb).
    pub struct PlannedRailStore {
        pub inner: Arc<dyn rs::RailStore>,
        pub plan: Arc<StoreFaultPlan>,
    }

    const L: StoreName = StoreName::Lockdb;
    const P: StoreName = StoreName::Paydb;

    /// The trait's defaulted methods keep their defaults (`judges_clock` false: the plan's
    /// lockdb has no judge).
    impl ls_layer::LockStoreLayer for PlannedLockStore {
        const DELEGATES_DEFAULTED: bool = false;

        fn inner(&self) -> &dyn ls::LockStore {
            &*self.inner
        }

        async fn around<T: Send>(
            &self,
            op: ls_layer::LockStoreOp,
            call: impl std::future::Future<Output = Result<T, ls::StoreError>> + Send,
        ) -> Result<T, ls::StoreError> {
            self.plan.run(L, op.tag(), call).await
        }
    }

    /// The trait's defaulted methods keep their defaults (`payout_account` reads through the
    /// planned `payout`, as the plan's `PAYDB_OPS` name it).
    impl ps_layer::PaymentStoreLayer for PlannedPaymentStore {
        const DELEGATES_DEFAULTED: bool = false;

        fn inner(&self) -> &dyn ps::PaymentStore {
            &*self.inner
        }

        async fn around<T: Send>(
            &self,
            op: ps_layer::PaymentStoreOp,
            call: impl std::future::Future<Output = Result<T, ps::StoreError>> + Send,
        ) -> Result<T, ps::StoreError> {
            self.plan.run(P, op.fault_op(), call).await
        }
    }

    /// `admit_checked` is the trait's default (a planned `payout` read, then a planned
    /// `admit`); `pool_stats` and `writer_thread` keep the trait's defaults.
    impl rs_layer::RailStoreLayer for PlannedRailStore {
        const DELEGATES_DEFAULTED: bool = false;
        const ADMIT_CHECKED_READ_THEN_ADMIT: bool = true;

        fn inner(&self) -> &dyn rs::RailStore {
            &*self.inner
        }

        async fn around<T: Send>(
            &self,
            op: rs_layer::RailStoreOp,
            call: impl std::future::Future<Output = Result<T, rs::StoreError>> + Send,
        ) -> Result<T, rs::StoreError> {
            self.plan.run(P, op.tag(), call).await
        }
    }
}

#[cfg(test)]
mod tests {
    use dlock_http::metrics::ClosedTag;
    use dlock_lock_server::store_layer::LockStoreOp;
    use dlock_payment_resource::store_layer::PaymentStoreOp;
    use dlock_rail_proxy::store_layer::RailStoreOp;

    use super::{StoreName, WRITE_OPS};

    /// `(fault name, writes)` of every operation of the three store layers, by store.
    fn layer_ops() -> Vec<(StoreName, &'static str, bool)> {
        let mut ops = Vec::new();
        ops.extend(PaymentStoreOp::all().iter().map(|op| (StoreName::Paydb, op.fault_op(), op.is_write())));
        ops.extend(RailStoreOp::all().iter().map(|op| (StoreName::Paydb, op.tag(), op.is_write())));
        ops.extend(LockStoreOp::all().iter().map(|op| (StoreName::Lockdb, op.tag(), op.is_write())));
        ops
    }

    #[test]
    fn every_store_layer_op_is_a_plan_op_and_writes_exactly_when_the_plan_says_it_writes() {
        for (store, op, writes) in layer_ops() {
            assert!(store.ops().contains(&op), "{op} is not one of {}'s plan ops", store.as_str());
            assert_eq!(WRITE_OPS.contains(&op), writes, "{op}: the layer and the plan disagree on whether it writes");
        }
        for store in [StoreName::Paydb, StoreName::Lockdb] {
            for op in store.ops() {
                assert!(
                    layer_ops().iter().any(|(s, o, _)| *s == store && o == op),
                    "plan op {op} of {} is no layer op",
                    store.as_str()
                );
            }
        }
    }
}
