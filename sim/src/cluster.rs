//! The simulated cluster: rail-stub, rail-proxy and a client on three madsim nodes, with
//! paydb played by the simulation store. The store lives outside every node, as paydb
//! lives outside every proxy process: killing the proxy node loses its memory, not paydb.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use dlock_contract::payout::PayoutState;
use dlock_contract::rail::RailCallLog;
use dlock_rail_proxy::store::{NewPayout, RailStore};
use dlock_rail_proxy::store_mem::MemRailStore;
use dlock_rt::http::{BaseUrl, HttpClient};
use dlock_rt::{Clock, Duration};
use uuid::Uuid;

use crate::faults::Faults;
use crate::oracle;
use crate::scenario::{Control, Scenario, Step};
use crate::schedule::{Schedule, Stage};
use crate::store_faults::{PlannedRailStore, StoreFaultPlan};
use crate::Report;

pub const STUB_IP: [u8; 4] = [10, 0, 0, 1];
pub const PROXY_IP: [u8; 4] = [10, 0, 0, 2];
pub const CLIENT_IP: [u8; 4] = [10, 0, 0, 3];
pub const STUB_PORT: u16 = 8084;
pub const PROXY_PORT: u16 = 8083;
/// How often the client polls a (re)starting node.
pub const POLL_INTERVAL_MS: u64 = 50;
/// Longest a node may take to serve after (re)start.
pub const NODE_START_MS_MAX: u64 = 10_000;
/// The amount every scenario payout carries.
pub const PAYOUT_AMOUNT_MINOR: i64 = 1_000;

fn addr(ip: [u8; 4], port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::from(ip), port)
}

fn base(ip: [u8; 4], port: u16) -> BaseUrl {
    BaseUrl::plain(addr(ip, port).to_string())
}

/// Plays `scenario` in the current madsim runtime.
pub async fn run(scenario: &Scenario) -> Report {
    let handle = madsim::runtime::Handle::current();
    let mut report = Report::default();
    let store = Arc::new(MemRailStore::new());

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
        if let Err(e) = store.insert_payout(&p, Clock::system().wall()).await {
            report.violations.push(format!("setup: {e}"));
            return report;
        }
        payouts.insert(label, id);
    }

    let skew = |node: &str| scenario.skew_ms.get(node).copied().unwrap_or(0);
    // The stub and the proxy are started through their crates' entry points with settings
    // from their own resolvers, as in production (the proxy's orphan sweeper included).
    let rail = &scenario.rail;
    let seed = dlock_rt::rand::random_u64().to_string();
    let settings = [
        ("rail.stub.latency-ms", rail.latency_ms.to_string()),
        ("rail.stub.failure-rate", rail.failure_rate.to_string()),
        ("rail.stub.duplicate-ack-rate", rail.duplicate_ack_rate.to_string()),
        ("rail.stub.decline-rate", rail.decline_rate.to_string()),
        ("rail.stub.seed", seed),
    ];
    let pairs: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let layers = crate::world::layers(&pairs);
    let plan = Arc::new(StoreFaultPlan::new());
    let proxy_store: Arc<dyn RailStore> = Arc::new(PlannedRailStore { inner: store.clone(), plan: plan.clone() });
    let stub = crate::world::start_stub_node(&layers, skew("rail-stub"));
    let proxy = crate::world::start_proxy_node(&layers, skew("rail-proxy"), proxy_store);
    let proxy_id = proxy.id();
    let faults = Faults::new();
    faults.name("rail-stub", stub.id());
    faults.name("rail-proxy", proxy_id);
    let stage = ProxyStage { faults: faults.clone(), plan, stub: stub.id(), proxy: proxy_id };
    let plan_trace = stage.plan.clone();

    let client = handle.create_node().name("client").ip(IpAddr::from(CLIENT_IP)).build();
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
                        wait_ready(base(PROXY_IP, PROXY_PORT)).await;
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
                        for line in (Schedule { events: now }).play(&stage).await {
                            trace.push(format!("step {i}: {line}"));
                        }
                        if !later.is_empty() {
                            let stage = stage.clone();
                            madsim::task::spawn(async move {
                                Schedule { events: later }.play(&stage).await;
                            });
                        }
                    }
                }
            }
            wait_ready(base(STUB_IP, STUB_PORT)).await;
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
    report.trace.extend(faults.trace());
    report.trace.extend(plan_trace.trace());
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
    let rows = match store.submissions(None).await {
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
    let mark = store.high_water(&scenario.account).await.unwrap_or(None);
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

fn client() -> HttpClient {
    HttpClient::new(1_000, 30_000)
}

/// Polls `GET /health/live` until the node answers, within [`NODE_START_MS_MAX`].
async fn wait_ready(url: BaseUrl) {
    let _ =
        dlock_rt::wait_until(Duration::from_millis(POLL_INTERVAL_MS), Duration::from_millis(NODE_START_MS_MAX), || {
            let url = url.clone();
            async move {
                match client().send(&url, http::Method::GET, "/health/live", &[], None).await {
                    Ok(r) if r.status == 200 => Some(()),
                    _ => None,
                }
            }
        })
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
    let mut cfg = dlock_rail_client::RailClientConfig::new(base(PROXY_IP, PROXY_PORT));
    cfg.read_timeout_ms = client().read_timeout_ms;
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
    match client().send(&base(STUB_IP, STUB_PORT), http::Method::GET, "/calls", &[], None).await {
        Ok(r) => serde_json::from_slice(&r.body).unwrap_or_default(),
        Err(_) => RailCallLog::default(),
    }
}

/// The legacy proxy world as a [`Stage`]: the rail-stub and the rail-proxy, paydb behind a
/// store fault plan; no lock server (a revoke is refused).
#[derive(Clone)]
struct ProxyStage {
    faults: Faults,
    plan: Arc<StoreFaultPlan>,
    stub: madsim::task::NodeId,
    proxy: madsim::task::NodeId,
}

impl Stage for ProxyStage {
    fn node(&self, name: &str) -> Option<madsim::task::NodeId> {
        match name {
            "rail-stub" => Some(self.stub),
            "rail-proxy" => Some(self.proxy),
            _ => None,
        }
    }
    fn faults(&self) -> &Faults {
        &self.faults
    }
    fn store_plan(&self) -> Option<&StoreFaultPlan> {
        Some(&self.plan)
    }
    fn revoke<'a>(
        &'a self,
        _key: Option<&'a str>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send + 'a>> {
        Box::pin(async { Err("the proxy world has no lock server".to_owned()) })
    }
}
