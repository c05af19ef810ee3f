//! A scenario played as a campaign seed: the parts of [`crate::campaign::run_seed`] that only a
//! scenario seed uses (`RunOptions::scenario`). The world spec of the file
//! ([`spec`]), the proxy-only scenarios' path ([`play_proxy`]), a step that could not apply
//! as a failure ([`step_failures`]), and the ground truth a scenario test asserts on
//! ([`ScenarioFacts`], gathered by [`facts`] at the end of the run).
//!
//! Invariant: nothing here changes how a swarm seed runs; a scenario seed has the swarm's
//! phases, oracle, failure classes and outcome.

use std::collections::BTreeMap;

use dlock_contract::payout::PayoutState;
use uuid::Uuid;

use crate::oracle::{Monitor, Seen};
use crate::outcome::Failure;
use crate::scenario::Scenario;
use crate::swarm::SwarmConfig;
use crate::world::{World, WorldSpec};

/// What a scenario seed leaves for a test to assert on, beyond its outcome: ground truth
/// gathered at the end of the run.
#[derive(Debug, Clone, Default)]
pub struct ScenarioFacts {
    /// Every fenced write and grant the oracle saw, in commit order.
    pub seen: Vec<Seen>,
    /// Runtime ms (`faults::now_ms`) at which the oracle started: `seen` times are after it.
    pub monitor_started_ms: u64,
    /// What the scripted lock clients did.
    pub clients: Vec<String>,
    /// The rail's own log: each call's `clientRef`, in arrival order.
    pub rail_calls: Vec<String>,
    /// `lock_acquire_total{outcome="not_leader"}` summed over the lock replicas (acquires
    /// answered NOT_LEADER, or INTERNAL for a store answer that was lost).
    pub acquires_not_leader: f64,
    /// Every injected store fault.
    pub store_faults: Vec<crate::store_faults::StoreFaultRecord>,
    /// Every applied network, process and clock fault.
    pub faults: Vec<crate::faults::FaultRecord>,
    /// Each created payout's final state.
    pub final_states: BTreeMap<Uuid, Option<PayoutState>>,
}

/// The world spec of a scenario seed: the drawn-configuration spec of its
/// [`Scenario::swarm_config`], with the scenario's settings over it, its per-executor
/// settings and its clocks' skews.
pub fn spec(s: &Scenario, cfg: &SwarmConfig) -> WorldSpec {
    let mut spec = crate::campaign::spec_of(cfg);
    let own = s.settings_pairs();
    spec.settings.retain(|(k, _)| !own.iter().any(|(o, _)| o == k));
    spec.settings.extend(own);
    spec.node_settings = s.node_settings_pairs();
    spec.skew_ms = s.skew_ms.clone();
    spec
}

/// The played schedule's lines into `trace`; each step that was skipped, or whose trigger
/// never came, is a crash-class `scenario_step_applies` failure (a step that did nothing
/// proves nothing).
pub fn step_failures(lines: Vec<String>, trace: &mut Vec<String>) -> Vec<Failure> {
    let mut found = Vec::new();
    for l in lines {
        if l.contains("SKIPPED") || l.contains("never came") {
            found.push(Failure::crash("scenario_step_applies", l.clone()));
        }
        trace.push(l);
    }
    found
}

/// The run's ground truth at its end (after the checks), also written to `trace`: the
/// scripted clients' lines, every fenced write and grant the oracle saw, the lock servers'
/// NOT_LEADER count.
pub async fn facts(
    w: &World,
    monitor: &Monitor,
    monitor_started_ms: u64,
    calls: &[String],
    final_states: &BTreeMap<Uuid, Option<PayoutState>>,
    trace: &mut Vec<String>,
) -> ScenarioFacts {
    let mut acquires_not_leader = 0.0;
    for r in 1..=w.spec().topology.lock_replicas {
        acquires_not_leader += w.lock_metric(r, "lock_acquire_total{outcome=\"not_leader\"}").await.unwrap_or(0.0);
    }
    let f = ScenarioFacts {
        seen: monitor.with(|c| c.seen().to_vec()).unwrap_or_default(),
        monitor_started_ms,
        clients: w.client_log(),
        rail_calls: calls.to_vec(),
        acquires_not_leader,
        store_faults: w.store_plan().map(|p| p.record()).unwrap_or_default(),
        faults: w.faults().record(),
        final_states: final_states.clone(),
    };
    trace.extend(f.clients.iter().cloned());
    trace.extend(f.seen.iter().map(|s| s.to_string()));
    trace.push(format!("lock servers: {acquires_not_leader} acquires answered not_leader"));
    f
}

/// A proxy-only scenario as a seed: [`crate::cluster::run`] on the proxy world; each broken
/// invariant or unmet expectation is a correctness failure named after it.
pub async fn play_proxy(s: Scenario, config: String) -> crate::campaign::Played5 {
    let t0 = madsim::time::Instant::now();
    let report = crate::cluster::run(&s).await;
    let failures = report
        .violations
        .iter()
        .map(|v| {
            let name = v.split(':').next().unwrap_or_default();
            let invariant = crate::scenario::INVARIANTS
                .iter()
                .copied()
                .find(|i| *i == name)
                .unwrap_or(if name == "expectation" { "scenario_expectation" } else { "scenario_check" });
            Failure::correctness(invariant, v.clone())
        })
        .collect();
    let mut trace = vec![config];
    trace.extend(report.trace);
    (failures, t0.elapsed().as_millis() as u64, trace, std::collections::BTreeMap::new(), None)
}
