//! Defence in depth, one switch per layer: test-only switches that let a simulation campaign
//! turn exactly one of dlock's stale-writer defences off, to prove the others still hold.
//!
//! dlock stops a stale writer at six layers ([`Layer`]). Each layer's code path asks this
//! module at exactly the one place the layer decides, with [`stops`]:
//!
//! ```text
//! if dlock_contract::defence::stops(Layer::ClaimFence, stored >= presented) { refuse } else { go on }
//! ```
//!
//! `stops(layer, would_stop)` returns `would_stop` unless the layer is switched off, and in
//! the simulation it counts, per layer, how often the layer stopped something
//! ([`Tally::stopped`]) and how often it *would* have but was switched off
//! ([`Tally::bypassed`]): a bypass is the proof that the campaign reached the layer's
//! situation, so whatever kept safety afterwards was another layer.
//!
//! It lives in `dlock-contract` (the lowest crate: `may_transition` and the paydb admission
//! rule sit below `dlock-rt`); `dlock_rt::defence` re-exports it for service code.
//!
//! ## Invariants
//! - **Compiled out of production.** Outside `cfg(madsim)` [`off`] is the constant `false`
//!   and [`stops`] is the identity on `would_stop` (both `#[inline]`, no state): no build
//!   without the simulation cfg can switch a layer off, because the only setter,
//!   `set_off`, exists only under `cfg(madsim)`. A normal-cfg unit test holds the first
//!   half, and a `compile_fail` doctest (on [`current`]) the second.
//! - **At most one layer is off**, and only on the thread that switched it (one madsim
//!   runtime per thread, as with `dlock_rt::probe`): a campaign sets it before a seed and
//!   clears it after; other seeds on other threads are untouched.
//! - **Nothing changes when no layer is off**: [`stops`] then returns its argument, so every
//!   decision is the one the code made before the switch existed.
//! - The names ([`Layer::name`]) are stable: `dlock-sim --layer-off NAME` and the campaign
//!   summaries use them.

/// One stale-writer defence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Layer {
    /// The executor's own lease check before each fenced write (FR-11: no write once the
    /// local lease deadline has passed): `dlock-executor`, `Executor::may_write`.
    ExecutorLeaseCheck,
    /// The account fence at claim (FR-15, P2): the payment-resource's claim refuses a token
    /// that does not exceed `accounts.fence`.
    ClaimFence,
    /// The same fence at post (P3): the ledger write refuses a token that does not exceed
    /// `accounts.fence`.
    PostFence,
    /// The rail's durable per-account high-water mark (C3 §3.5 step 1).
    RailMark,
    /// One forwardable attempt per payout (C3 §3.5 step 2, `DUPLICATE_SUBMISSION`).
    DuplicateGuard,
    /// The payout state machine (C2): `payout::may_transition` and the state-trigger mirror
    /// `payout::may_write_state`, which every store's transition goes through, and the
    /// claim's compare-and-set on the state its writer read (`rules::decide_claim` in the
    /// payment-resource).
    StateChecks,
}

impl Layer {
    /// Every layer, in the order a stale writer meets them on its way to the rail and back.
    pub const ALL: [Layer; 6] = [
        Layer::ExecutorLeaseCheck,
        Layer::ClaimFence,
        Layer::PostFence,
        Layer::RailMark,
        Layer::DuplicateGuard,
        Layer::StateChecks,
    ];

    /// The stable name (`--layer-off NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Layer::ExecutorLeaseCheck => "executor-lease-check",
            Layer::ClaimFence => "claim-fence",
            Layer::PostFence => "post-fence",
            Layer::RailMark => "rail-mark",
            Layer::DuplicateGuard => "duplicate-guard",
            Layer::StateChecks => "state-checks",
        }
    }

    /// The layer of a stable name; `None` for anything else.
    pub fn parse(name: &str) -> Option<Layer> {
        Layer::ALL.into_iter().find(|l| l.name() == name)
    }
}

impl std::fmt::Display for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the layers did on this thread since the last [`reset`] (simulation only; empty
/// otherwise).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// How often each layer stopped something.
    pub stopped: std::collections::BTreeMap<Layer, u64>,
    /// How often a switched-off layer would have stopped something and let it through.
    pub bypassed: std::collections::BTreeMap<Layer, u64>,
}

impl Tally {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Tally) {
        for (l, n) in &other.stopped {
            *self.stopped.entry(*l).or_insert(0) += n;
        }
        for (l, n) in &other.bypassed {
            *self.bypassed.entry(*l).or_insert(0) += n;
        }
    }

    pub fn stopped(&self, l: Layer) -> u64 {
        self.stopped.get(&l).copied().unwrap_or(0)
    }

    pub fn bypassed(&self, l: Layer) -> u64 {
        self.bypassed.get(&l).copied().unwrap_or(0)
    }
}

#[cfg(madsim)]
mod state {
    use std::cell::{Cell, RefCell};

    thread_local! {
        pub static OFF: Cell<Option<super::Layer>> = const { Cell::new(None) };
        pub static TALLY: RefCell<super::Tally> = RefCell::new(super::Tally::default());
    }
}

/// Whether `layer` is switched off on this thread (by [`set_off`], or by a planted fencing
/// bug, [`crate::planted::Bug::layers_off`]). The constant `false` outside the simulation.
#[inline]
pub fn off(layer: Layer) -> bool {
    #[cfg(madsim)]
    return state::OFF.with(|o| o.get() == Some(layer)) || crate::planted::turns_off(layer);
    #[cfg(not(madsim))]
    {
        let _ = layer;
        false
    }
}

/// The layer's decision: `would_stop` unless `layer` is switched off (module doc). Call it
/// at the one place the layer decides, with whether its check refuses. Outside the
/// simulation it returns `would_stop` and keeps nothing.
#[inline]
pub fn stops(layer: Layer, would_stop: bool) -> bool {
    #[cfg(madsim)]
    {
        if !would_stop {
            return false;
        }
        let off = off(layer);
        state::TALLY.with(|t| {
            let mut t = t.borrow_mut();
            let slot = if off { &mut t.bypassed } else { &mut t.stopped };
            *slot.entry(layer).or_insert(0) += 1;
        });
        !off
    }
    #[cfg(not(madsim))]
    {
        let _ = layer;
        would_stop
    }
}

/// Switches `layer` off on this thread (`None`: every layer on). Simulation only: there is
/// no way to switch a layer off in any other build.
#[cfg(madsim)]
pub fn set_off(layer: Option<Layer>) {
    state::OFF.with(|o| o.set(layer));
}

/// The layer switched off on this thread, if any (always `None` outside the simulation).
///
/// Outside the simulation there is no setter at all; this must not compile there:
#[cfg_attr(not(madsim), doc = "```compile_fail")]
#[cfg_attr(madsim, doc = "```text")]
/// dlock_contract::defence::set_off(Some(dlock_contract::defence::Layer::ClaimFence));
/// ```
pub fn current() -> Option<Layer> {
    #[cfg(madsim)]
    return state::OFF.with(|o| o.get());
    #[cfg(not(madsim))]
    None
}

/// This thread's tally since the last [`reset`].
pub fn snapshot() -> Tally {
    #[cfg(madsim)]
    return state::TALLY.with(|t| t.borrow().clone());
    #[cfg(not(madsim))]
    Tally::default()
}

/// Forgets this thread's tally (call before each seed).
pub fn reset() {
    #[cfg(madsim)]
    state::TALLY.with(|t| *t.borrow_mut() = Tally::default());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_names_are_stable_and_parse_back() {
        let names: Vec<&str> = Layer::ALL.iter().map(|l| l.name()).collect();
        assert_eq!(
            names,
            ["executor-lease-check", "claim-fence", "post-fence", "rail-mark", "duplicate-guard", "state-checks"]
        );
        for l in Layer::ALL {
            assert_eq!(Layer::parse(l.name()), Some(l));
        }
        assert_eq!(Layer::parse("claim_fence"), None);
        assert_eq!(Layer::parse(""), None);
    }

    #[cfg(not(madsim))]
    #[test]
    fn outside_the_simulation_no_layer_is_ever_off_and_every_check_decides() {
        for l in Layer::ALL {
            assert!(!off(l), "{l} is off in a production build");
            assert!(stops(l, true), "{l} let a refusal through in a production build");
            assert!(!stops(l, false));
        }
        assert_eq!(current(), None);
        assert_eq!(snapshot(), Tally::default());
    }
}
