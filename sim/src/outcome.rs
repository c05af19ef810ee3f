//! What one simulated seed ends with, and how failures are classed.
//!
//! A failure falls in one of three classes, after TigerBeetle's VOPR: a **crash** (the world
//! itself broke: a panic, a node that never came up, a setup error), a **liveness** failure
//! (after every fault healed, the cluster did not settle within its bound), or a
//! **correctness** failure (a safety invariant broke). Each has an exit code; a campaign
//! exits with the worst class it saw. Every failure is reported in one line naming the
//! class, the broken invariant and the seed.

use std::collections::BTreeMap;

use dlock_rt::probe::Probe;

/// The class of a failure; the order is severity (the worst class of a campaign wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FailureClass {
    Crash,
    Liveness,
    Correctness,
}

impl FailureClass {
    /// The process exit code of a campaign whose worst failure has this class.
    pub fn exit_code(self) -> u8 {
        match self {
            FailureClass::Crash => 127,
            FailureClass::Liveness => 128,
            FailureClass::Correctness => 129,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FailureClass::Crash => "crash",
            FailureClass::Liveness => "liveness",
            FailureClass::Correctness => "correctness",
        }
    }
}

/// One broken invariant (or crash) of one seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub class: FailureClass,
    /// The invariant's stable name, e.g. `at_most_one_rail_call_per_payout`.
    pub invariant: &'static str,
    /// What was seen, in one line (ids, tokens, states).
    pub detail: String,
}

impl Failure {
    pub fn correctness(invariant: &'static str, detail: impl Into<String>) -> Failure {
        Failure { class: FailureClass::Correctness, invariant, detail: detail.into() }
    }
    pub fn liveness(invariant: &'static str, detail: impl Into<String>) -> Failure {
        Failure { class: FailureClass::Liveness, invariant, detail: detail.into() }
    }
    pub fn crash(invariant: &'static str, detail: impl Into<String>) -> Failure {
        Failure { class: FailureClass::Crash, invariant, detail: detail.into() }
    }

    /// The one-line report: `correctness: at_most_one_rail_call_per_payout (seed 42): ...`.
    pub fn line(&self, seed: u64) -> String {
        format!("{}: {} (seed {seed}): {}", self.class.name(), self.invariant, self.detail)
    }
}

/// Everything one seed produced.
#[derive(Debug, Clone, Default)]
pub struct SeedOutcome {
    pub seed: u64,
    /// The drawn configuration, in one line, as printed before the seed ran.
    pub config: String,
    pub failures: Vec<Failure>,
    pub probes: BTreeMap<Probe, u64>,
    /// Simulated time the seed covered, in ms.
    pub sim_ms: u64,
    /// Fault events the seed's schedule applied (not skipped), by kind
    /// ([`crate::fault::KINDS`]).
    pub faults: BTreeMap<&'static str, u64>,
    /// The seed's event trace, one line per event (the same seed gives the same lines).
    pub trace: Vec<String>,
    /// What each defence layer stopped, and what a switched-off layer let through
    /// (`dlock_rt::defence`, per thread like the probes).
    pub defence: dlock_rt::defence::Tally,
    /// What the oracle saw of the clocks beyond pass or fail (the clock envelope).
    pub clock: crate::oracle::calls::ClockTally,
}

impl SeedOutcome {
    /// The worst class among the failures, if any.
    pub fn worst(&self) -> Option<FailureClass> {
        self.failures.iter().map(|f| f.class).max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_vopr_classes_and_the_worst_class_wins() {
        assert_eq!(
            [FailureClass::Crash, FailureClass::Liveness, FailureClass::Correctness].map(FailureClass::exit_code),
            [127, 128, 129]
        );
        let o = SeedOutcome {
            failures: vec![Failure::liveness("settles", "x"), Failure::correctness("one_call", "y")],
            ..SeedOutcome::default()
        };
        assert_eq!(o.worst(), Some(FailureClass::Correctness));
        assert_eq!(SeedOutcome::default().worst(), None);
    }

    #[test]
    fn a_failure_is_one_line_naming_class_invariant_and_seed() {
        let line = Failure::correctness("at_most_one_rail_call_per_payout", "payout p1 called 2 times").line(7);
        assert_eq!(line, "correctness: at_most_one_rail_call_per_payout (seed 7): payout p1 called 2 times");
        assert!(!line.contains('\n'));
    }
}
