//! A scenario played as a campaign seed: the parts of [`crate::campaign::run_seed`] that only a
//! scenario seed uses (`RunOptions::scenario`). The world spec of the file
//! ([`spec`]), the proxy-only scenarios' path ([`play_proxy`], [`run_proxy`] on
//! [`WorldSpec::proxy_only`]'s world), a step that could not apply
//! as a failure ([`step_failures`]), and the ground truth a scenario test asserts on
//! ([`ScenarioFacts`], gathered by [`facts`] at the end of the run).
//!
//! Invariant: nothing here changes how a swarm seed runs; a scenario seed has the swarm's
//! phases, oracle, failure classes and outcome.

use std::collections::BTreeMap;
use std::sync::Arc;

use dlock_contract::payout::PayoutState;
use dlock_contract::rail::RailCallLog;
use dlock_rail_proxy::store::{NewPayout, RailStore};
use dlock_rt::http::{BaseUrl, HttpClient};
use dlock_rt::{Clock, Duration};
use uuid::Uuid;

use crate::oracle::{self, Monitor, Seen};
use crate::outcome::Failure;
use crate::scenario::{Control, Scenario, Step};
use crate::schedule::Schedule;
use crate::store_faults::StoreFaultPlan;
use crate::swarm::SwarmConfig;
use crate::world::{url, StoreWrap, World, WorldSpec, PROXY_IP, PROXY_PORT, STUB_IP, STUB_PORT};
use crate::Report;

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
            found.push(Failure::crash(oracle::ids::SCENARIO_STEP_APPLIES, l.clone()));
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

/// A proxy-only scenario as a seed: [`run_proxy`] on the proxy world; each broken
/// invariant or unmet expectation is a correctness failure named after it.
pub async fn play_proxy(s: Scenario, config: String) -> crate::campaign::Played5 {
    let t0 = madsim::time::Instant::now();
    let report = run_proxy(&s).await;
    let failures =
        report
            .violations
            .iter()
            .map(|v| {
                let name = v.split(':').next().unwrap_or_default();
                let invariant = crate::scenario::INVARIANTS.iter().copied().find(|i| *i == name).unwrap_or(
                    if name == "expectation" { oracle::ids::SCENARIO_EXPECTATION } else { oracle::ids::SCENARIO_CHECK },
                );
                Failure::correctness(invariant, v.clone())
            })
            .collect();
    let mut trace = vec![config];
    trace.extend(report.trace);
    (failures, t0.elapsed().as_millis() as u64, trace, std::collections::BTreeMap::new(), None)
}

/// How often a proxy scenario's client polls a (re)starting node.
pub const PROXY_POLL_INTERVAL_MS: u64 = 50;
/// Longest a node may take to serve after (re)start, in a proxy scenario.
pub const NODE_START_MS_MAX: u64 = 10_000;
/// The amount every proxy scenario payout carries.
pub const PAYOUT_AMOUNT_MINOR: i64 = 1_000;

/// Plays the proxy scenario `scenario` in the current madsim runtime on
/// [`WorldSpec::proxy_only`]'s world (its store fault plan in front of paydb): one CLAIMED
/// payout per label, then the steps from the `workload` node (`submit` waits for its answer,
/// `restart-proxy` kills and restarts `proxy-1`, a fault step applies at once and its
/// `for-ms` undo runs on its own), then the oracle's checkers the scenario lists, over the
/// rail's log and paydb.
pub async fn run_proxy(scenario: &Scenario) -> Report {
    let mut report = Report::default();
    let rail = &scenario.rail;
    let skew = |node: &str| scenario.skew_ms.get(node).copied().unwrap_or(0);
    let spec = WorldSpec { wrap: StoreWrap::planned(Arc::new(StoreFaultPlan::new())), ..WorldSpec::proxy_only() }
        .with("rail.stub.latency-ms", rail.latency_ms)
        .with("rail.stub.failure-rate", rail.failure_rate)
        .with("rail.stub.duplicate-ack-rate", rail.duplicate_ack_rate)
        .with("rail.stub.decline-rate", rail.decline_rate)
        .skew("rail-stub", skew("rail-stub"))
        .skew("proxy-1", skew("rail-proxy"));
    let mut w = match crate::world::build(spec).await {
        Ok(w) => w,
        Err(e) => {
            report.violations.push(format!("setup: {e}"));
            return report;
        }
    };
    let Some(proxy_id) = w.node_id("proxy-1") else {
        report.violations.push("setup: no proxy-1".to_owned());
        return report;
    };
    // The proxy scenarios name the proxy `rail-proxy`, in their steps and in the trace.
    w.faults().name("rail-proxy", proxy_id);

    // paydb content: one CLAIMED payout per label.
    let mut payouts: BTreeMap<String, Uuid> = BTreeMap::new();
    for label in scenario.payout_labels() {
        let id = dlock_rt::rand::uuid_v4();
        let p = NewPayout {
            payout_id: id,
            account_id: scenario.account.clone(),
            amount_minor: PAYOUT_AMOUNT_MINOR,
            currency: "EUR".into(),
            beneficiary_ref: "ben".into(),
            state: PayoutState::Claimed,
        };
        if let Err(e) = RailStore::insert_payout(&*w.paydb, &p, Clock::system().wall()).await {
            report.violations.push(format!("setup: {e}"));
            return report;
        }
        payouts.insert(label, id);
    }

    let client = w.add_node("workload");
    let w = Arc::new(w);
    let stage = w.clone();
    let steps = scenario.steps.clone();
    let account = scenario.account.clone();
    let client_payouts = payouts.clone();
    let played = client
        .spawn(async move {
            let mut trace = Vec::new();
            let mut violations = Vec::new();
            for (i, step) in steps.iter().enumerate() {
                match step {
                    Step::Control(Control::Submit { payout, token, expect }) => {
                        let id = client_payouts.get(payout).copied().unwrap_or_default();
                        wait_ready(url(PROXY_IP, PROXY_PORT)).await;
                        let (status, code) = submit(id, &account, *token).await;
                        trace.push(format!("step {i}: submit {payout} token={token} -> {status} {code}"));
                        if let Some(e) = expect {
                            let (want_status, want_code) = e.answer();
                            if (status, code.as_str()) != (want_status, want_code) {
                                violations.push(format!(
                                    "expectation: step {i} submit {payout} token={token} expected {want_status} {want_code}, got {status} {code}"
                                ));
                            }
                        }
                    }
                    Step::Control(Control::RestartProxy) => {
                        let h = madsim::runtime::Handle::current();
                        h.kill(proxy_id);
                        h.restart(proxy_id);
                        trace.push(format!("step {i}: restart rail-proxy"));
                    }
                    Step::Control(Control::Sleep { ms }) => {
                        dlock_rt::sleep(Duration::from_millis(*ms)).await;
                        trace.push(format!("step {i}: sleep {ms} ms"));
                    }
                    fault => {
                        // The step's events at its own instant now; its undo (`for-ms`) on a
                        // task of its own, as a schedule plays it.
                        let events = fault.events();
                        let (now, later): (Vec<_>, Vec<_>) = events.into_iter().partition(|t| t.at_ms == 0);
                        for line in (Schedule { events: now }).play(&*stage).await {
                            trace.push(format!("step {i}: {line}"));
                        }
                        if !later.is_empty() {
                            let stage = stage.clone();
                            madsim::task::spawn(async move {
                                Schedule { events: later }.play(&*stage).await;
                            });
                        }
                    }
                }
            }
            wait_ready(url(STUB_IP, STUB_PORT)).await;
            let calls = fetch_calls().await;
            (trace, violations, calls)
        })
        .await;
    let (trace, violations, calls) = match played {
        Ok(v) => v,
        Err(e) => {
            report.violations.push(format!("client task failed: {e}"));
            return report;
        }
    };
    report.trace = trace;
    report.trace.extend(w.faults().trace());
    if let Some(plan) = w.store_plan() {
        report.trace.extend(plan.trace());
    }
    report.violations = violations;

    let labels: BTreeMap<String, String> = payouts.iter().map(|(l, id)| (id.to_string(), l.clone())).collect();
    let label = |id: &str| labels.get(id).cloned().unwrap_or_else(|| id.to_owned());
    for c in &calls.calls {
        report.trace.push(format!(
            "rail: {} {:?} paid={} ref={} at={}",
            label(&c.client_ref),
            c.outcome,
            c.paid,
            c.rail_reference.as_deref().unwrap_or("-"),
            dlock_contract::time::rfc3339_ms(c.received_at)
        ));
    }
    let rows = match RailStore::submissions(&*w.paydb, None).await {
        Ok(r) => r,
        Err(e) => {
            report.violations.push(format!("read paydb: {e}"));
            return report;
        }
    };
    for r in &rows {
        report.trace.push(format!(
            "paydb: {} token={} outcome={} at={}",
            label(&r.payout_id.to_string()),
            r.presented_token,
            r.outcome.map_or("NULL", |o| o.as_str()),
            dlock_contract::time::rfc3339_ms(r.submitted_at)
        ));
    }
    let mark = RailStore::high_water(&*w.paydb, &scenario.account).await.unwrap_or(None);
    report.trace.push(format!("paydb: mark {} = {mark:?}", scenario.account));

    // The scenario's invariants, judged by the oracle's checkers under the oracle's ids.
    let refs: Vec<String> = calls.calls.iter().map(|c| c.client_ref.clone()).collect();
    let marks: BTreeMap<String, i64> = mark.map(|m| (scenario.account.clone(), m)).into_iter().collect();
    let judged = oracle::rail_failures(&refs, &rows).into_iter().chain(oracle::mark_failures(&marks, &rows));
    report.violations.extend(
        judged
            .filter(|f| scenario.invariants.iter().any(|i| i == f.invariant))
            .map(|f| format!("{}: {}", f.invariant, f.detail))
            .map(|v| labels.iter().fold(v, |acc, (id, l)| acc.replace(id.as_str(), l.as_str()))),
    );
    report
}

fn http_client() -> HttpClient {
    HttpClient::new(1_000, 30_000)
}

/// Polls `GET /health/live` until the node answers, within [`NODE_START_MS_MAX`].
async fn wait_ready(url: BaseUrl) {
    let _ = dlock_rt::wait_until(
        Duration::from_millis(PROXY_POLL_INTERVAL_MS),
        Duration::from_millis(NODE_START_MS_MAX),
        || {
            let url = url.clone();
            async move {
                match http_client().send(&url, http::Method::GET, "/health/live", &[], None).await {
                    Ok(r) if r.status == 200 => Some(()),
                    _ => None,
                }
            }
        },
    )
    .await;
}

/// One submission through the rail client, as a worker sends it; the answer's status and
/// code (or outcome), status 0 when no answer came.
async fn submit(payout: Uuid, account: &str, token: i64) -> (u16, String) {
    let body = dlock_contract::rail::SubmissionRequest {
        payout_id: payout,
        account_id: account.to_owned(),
        amount_minor: PAYOUT_AMOUNT_MINOR,
        currency: "EUR".into(),
        beneficiary_ref: "ben".into(),
    };
    let mut cfg = dlock_rail_client::RailClientConfig::new(url(PROXY_IP, PROXY_PORT));
    cfg.read_timeout_ms = http_client().read_timeout_ms;
    let (Ok(rail), Some(token), Ok(owner), Ok(key)) = (
        dlock_rail_client::RailClient::new(cfg),
        dlock_contract::FencingToken::new(token),
        dlock_contract::OwnerId::parse("sim-worker"),
        dlock_contract::IdempotencyKey::parse(&format!("payout:{payout}")),
    ) else {
        return (0, "not sent: invalid token or settings".to_owned());
    };
    // Signed with the world's grant key, as the lock server signs (C3-extensions E-14).
    let sig = crate::world::grant_signer().sign(
        &dlock_contract::grant::payout_lock_key(account),
        token.get(),
        owner.as_str(),
    );
    let token = dlock_contract::grant::SignedToken::new(token, Some(sig));
    match rail.submit(token, &owner, &key, &body).await {
        Ok(ack) => (200, ack.outcome.as_str().to_owned()),
        Err(dlock_rail_client::RailRefusal::Refused { status, envelope }) => {
            (status, envelope.code.as_str().to_owned())
        }
        Err(dlock_rail_client::RailRefusal::Unreadable { status, .. }) => (status, "?".to_owned()),
        Err(e) => (0, format!("transport error: {e}")),
    }
}

async fn fetch_calls() -> RailCallLog {
    match http_client().send(&url(STUB_IP, STUB_PORT), http::Method::GET, "/calls", &[], None).await {
        Ok(r) => serde_json::from_slice(&r.body).unwrap_or_default(),
        Err(_) => RailCallLog::default(),
    }
}
