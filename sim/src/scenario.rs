//! Scenario files (`scenarios/*.toml`): see `scenarios/README.md` for the format.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

/// Invariants a scenario may ask for.
pub const INVARIANTS: &[&str] =
    &["fenced_never_forwarded", "at_most_one_forward_per_payout", "mark_equals_highest_admitted"];

/// A parsed scenario.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub nodes: Vec<String>,
    pub account: String,
    pub invariants: Vec<String>,
    #[serde(default)]
    pub rail: RailKnobs,
    /// Wall-clock skew per node, in milliseconds (monotonic time is never skewed).
    #[serde(default)]
    pub skew_ms: BTreeMap<String, i64>,
    #[serde(rename = "step")]
    pub steps: Vec<Step>,
}

/// `rail.stub.*` knobs for the scenario's stub.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct RailKnobs {
    #[serde(default)]
    pub latency_ms: u64,
    #[serde(default)]
    pub failure_rate: f64,
    #[serde(default = "one")]
    pub duplicate_ack_rate: f64,
    #[serde(default)]
    pub decline_rate: f64,
}

fn one() -> f64 {
    1.0
}

impl Default for RailKnobs {
    fn default() -> Self {
        RailKnobs { latency_ms: 0, failure_rate: 0.0, duplicate_ack_rate: 1.0, decline_rate: 0.0 }
    }
}

/// One step.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Step {
    /// Submit payout `payout` (a label; each label is one CLAIMED payout) with `token`.
    Submit {
        payout: String,
        token: i64,
        #[serde(default)]
        expect: Option<Expect>,
    },
    /// `kill` then `restart` the rail-proxy node: its process memory is gone, paydb is not.
    RestartProxy,
}

/// What a submission step must come to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Expect {
    Acked,
    Fenced,
    Duplicate,
    Ambiguous,
    Rejected,
    Unavailable,
    NotClaimable,
}

impl Expect {
    /// The wire answer this expectation stands for: status and code (`ACKED` for 200).
    pub fn answer(self) -> (u16, &'static str) {
        match self {
            Expect::Acked => (200, "ACKED"),
            Expect::Fenced => (409, "FENCED_OUT"),
            Expect::Duplicate => (409, "DUPLICATE_SUBMISSION"),
            Expect::Ambiguous => (409, "RAIL_AMBIGUOUS"),
            Expect::Rejected => (422, "VALIDATION_FAILED"),
            Expect::Unavailable => (503, "RAIL_UNAVAILABLE"),
            Expect::NotClaimable => (409, "PAYOUT_NOT_CLAIMABLE"),
        }
    }
}

impl Scenario {
    pub fn parse(text: &str) -> Result<Scenario, String> {
        let s: Scenario = toml::from_str(text).map_err(|e| e.to_string())?;
        if let Some(bad) = s.invariants.iter().find(|i| !INVARIANTS.contains(&i.as_str())) {
            return Err(format!("unknown invariant {bad:?} (known: {})", INVARIANTS.join(", ")));
        }
        if let Some(bad) = s.skew_ms.keys().find(|n| !s.nodes.contains(n)) {
            return Err(format!("skew-ms names node {bad:?}, which the scenario does not start"));
        }
        for required in ["rail-stub", "rail-proxy"] {
            if !s.nodes.iter().any(|n| n == required) {
                return Err(format!("nodes must include {required}"));
            }
        }
        Ok(s)
    }

    pub fn load(path: &Path) -> Result<Scenario, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Scenario::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Payout labels in order of first use.
    pub fn payout_labels(&self) -> Vec<String> {
        let mut labels: Vec<String> = Vec::new();
        for s in &self.steps {
            if let Step::Submit { payout, .. } = s {
                if !labels.contains(payout) {
                    labels.push(payout.clone());
                }
            }
        }
        labels
    }
}

/// The repository's `scenarios/` directory.
pub fn scenarios_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios")
}

/// Every scenario file in `scenarios/`, sorted by name.
pub fn all() -> Result<Vec<(String, Scenario)>, String> {
    let dir = scenarios_dir();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    files.into_iter().map(|p| Scenario::load(&p).map(|s| (p.display().to_string(), s))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_scenario_parses() {
        let all = all().expect("scenarios load");
        assert!(!all.is_empty());
        for (path, s) in all {
            assert!(!s.steps.is_empty(), "{path}");
        }
    }

    #[test]
    fn unknown_invariants_and_fields_are_refused() {
        let base = "name = \"x\"\nnodes = [\"rail-stub\", \"rail-proxy\"]\naccount = \"a\"\n";
        let bad_inv = format!("{base}invariants = [\"nope\"]\n[[step]]\naction = \"restart-proxy\"\n");
        assert!(Scenario::parse(&bad_inv).is_err());
        let bad_field = format!("{base}invariants = []\ncolour = 1\n[[step]]\naction = \"restart-proxy\"\n");
        assert!(Scenario::parse(&bad_field).is_err());
        let bad_action = format!("{base}invariants = []\n[[step]]\naction = \"explode\"\n");
        assert!(Scenario::parse(&bad_action).is_err());
        let ok = format!("{base}invariants = []\n[[step]]\naction = \"restart-proxy\"\n");
        assert!(Scenario::parse(&ok).is_ok());
    }
}
