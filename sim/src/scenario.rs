//! Scenario files (`scenarios/*.toml`): see `scenarios/README.md` for the format.
//!
//! A scenario names its topology and workload, the rail's chaos knobs, and a list of steps:
//! fault verbs (`pause`, `resume`, `crash`, `start`, `partition`, `heal`, `clog`,
//! `skew-clock`, `drift-clock`, `store-fault`, `revoke`, `sleep`), the scripted lock
//! client's `acquire`, and the legacy proxy steps (`submit`, `restart-proxy`); settings for
//! every service (`[settings]`) and for one executor (`[node-settings.executor-N]`); optional
//! keys that let a file hold a swarm seed's drawn configuration (what `dlock-sim shrink`
//! writes: each executor's concurrency, the hot accounts' share, the `[operator]`, and
//! `swarm-rng`, `forger`), each defaulting to what a scenario meant without it. [`Scenario::schedule`] turns the fault steps into a
//! [`Schedule`] (steps run at a cursor that only `sleep` advances; a `for-ms` closes its
//! fault that long after it opened). Unknown keys and verbs are errors, and
//! [`Scenario::parse`] refuses a step naming a node the topology does not start, so a typo
//! cannot silently turn a fault off.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::fault::Fault;
use crate::schedule::{Event, Schedule, Timed, Trigger};

/// The oracle's invariants a proxy scenario may ask for (`invariants = [...]`), by the
/// oracle's ids (the world's oracle checks its own full set on every other scenario).
pub const INVARIANTS: &[&str] = &[
    crate::oracle::ids::RAIL_CALL_HAS_INTENT,
    crate::oracle::ids::AT_MOST_ONE_RAIL_CALL,
    crate::oracle::ids::MARK_EQUALS_HIGHEST_ADMITTED,
];

/// Bounds on what a scenario may ask for.
pub const LOCK_SERVERS_MAX: u32 = 3;
pub const PAYMENT_RESOURCES_MAX: u32 = 2;
pub const RAIL_PROXIES_MAX: u32 = 2;
pub const EXECUTORS_MAX: u32 = 6;
pub const EXECUTOR_CONCURRENCY_MAX: u32 = 8;
pub const PAYOUTS_MAX: u32 = 10_000;
/// Most scripted lock clients (`client-1` .. `client-3`).
pub const LOCK_CLIENTS_MAX: u32 = 3;
/// Longest an `acquire` step waits in the server's queue (`waitMillis`, C3 L4's bound).
pub const ACQUIRE_WAIT_MS_MAX: u64 = 30_000;
/// Longest an `acquire` step holds its grant.
pub const ACQUIRE_HOLD_MS_MAX: u64 = 30_000;
/// Bounds of an `acquire` step's session TTL.
pub const CLIENT_SESSION_TTL_MS_MIN: u64 = 1_000;
pub const CLIENT_SESSION_TTL_MS_MAX: u64 = 60_000;
/// Longest single `sleep` or `for-ms`.
pub const STEP_MS_MAX: u64 = crate::fault::FOR_MS_MAX;

/// A parsed scenario.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Explicit node names (the legacy proxy scenarios); without it, the names come from
    /// [`Topology::node_names`].
    #[serde(default)]
    pub nodes: Vec<String>,
    #[serde(default)]
    pub topology: Topology,
    #[serde(default)]
    pub workload: Workload,
    /// The account every legacy `submit` step is for.
    #[serde(default)]
    pub account: String,
    /// The oracle invariants a proxy scenario is judged by ([`INVARIANTS`]); the world's
    /// oracle checks everything regardless.
    #[serde(default)]
    pub invariants: Vec<String>,
    /// Coverage probes this scenario exists to reach (`dlock_rt::probe::Probe` names).
    #[serde(default)]
    pub probes: Vec<String>,
    #[serde(default)]
    pub rail: RailKnobs,
    /// C5 settings for the world's services (`"lock.session.ttl-ms" = 2000`).
    #[serde(default)]
    pub settings: BTreeMap<String, toml::Value>,
    /// C5 settings for one executor only, over `settings` (`[node-settings.executor-1]`):
    /// e.g. a chaos stall on one executor.
    #[serde(default)]
    pub node_settings: BTreeMap<String, BTreeMap<String, toml::Value>>,
    /// Wall-clock skew per node at start, in milliseconds (monotonic time is never skewed).
    #[serde(default)]
    pub skew_ms: BTreeMap<String, i64>,
    /// The operator's revokes and resolutions during the fault phase (`[operator]`; default
    /// none: the steps are the faults). A shrunk swarm seed keeps its drawn operator here.
    #[serde(default)]
    pub operator: Operator,
    /// Advance the runtime's generator where a swarm seed draws its fault schedule (one
    /// draw), so a shrunk swarm seed (`dlock-sim shrink`) plays the same races as the seed it
    /// came from. Default false.
    #[serde(default)]
    pub swarm_rng: bool,
    /// Play the forger (`crate::forger`) as a swarm seed does: its fault-phase rounds and its
    /// end. A shrunk swarm seed keeps it, so a bug only the forger shows still shrinks.
    /// Default false.
    #[serde(default)]
    pub forger: bool,
    #[serde(rename = "step")]
    pub steps: Vec<Step>,
}

/// Which nodes a scenario's world starts.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Topology {
    #[serde(default = "one_u32")]
    pub lock_servers: u32,
    #[serde(default)]
    pub lock_backend: LockBackend,
    #[serde(default = "one_u32")]
    pub payment_resources: u32,
    #[serde(default = "one_u32")]
    pub rail_proxies: u32,
    #[serde(default = "one_u32")]
    pub executors: u32,
    #[serde(default = "one_u32")]
    pub executor_concurrency: u32,
    /// Each executor's own concurrency (optional; when given, one entry per executor, over
    /// `executor-concurrency`).
    #[serde(default)]
    pub executor_concurrencies: Vec<u32>,
    #[serde(default)]
    pub reconciler: bool,
    /// Scripted lock clients (`client-1` ..), driven by `acquire` steps.
    #[serde(default)]
    pub lock_clients: u32,
}

fn one_u32() -> u32 {
    1
}

impl Default for Topology {
    fn default() -> Self {
        Topology {
            lock_servers: 1,
            lock_backend: LockBackend::Mem,
            payment_resources: 1,
            rail_proxies: 1,
            executors: 1,
            executor_concurrency: 1,
            executor_concurrencies: Vec::new(),
            reconciler: false,
            lock_clients: 0,
        }
    }
}

/// The lock servers' store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LockBackend {
    /// The simulation lockdb.
    #[default]
    Mem,
    /// madsim-etcd-client's simulated etcd, on node `etcd`.
    Etcd,
}

impl Topology {
    /// The world's node names, as the world names them: `lock-N`, `payment-N`, `proxy-N`,
    /// `executor-N`, `rail-stub`, `client-N`, and `reconciler` and `etcd` when present.
    pub fn node_names(&self) -> Vec<String> {
        let mut v = Vec::new();
        let mut push = |prefix: &str, n: u32| (1..=n).for_each(|i| v.push(format!("{prefix}-{i}")));
        push("lock", self.lock_servers);
        push("payment", self.payment_resources);
        push("proxy", self.rail_proxies);
        push("executor", self.executors);
        push("client", self.lock_clients);
        v.push("rail-stub".to_owned());
        if self.reconciler {
            v.push("reconciler".to_owned());
        }
        if self.lock_backend == LockBackend::Etcd {
            v.push("etcd".to_owned());
        }
        v
    }

    fn validate(&self) -> Result<(), String> {
        let check = |what: &str, n: u32, lo: u32, hi: u32| {
            if (lo..=hi).contains(&n) {
                Ok(())
            } else {
                Err(format!("topology.{what} = {n} outside {lo}..={hi}"))
            }
        };
        check("lock-servers", self.lock_servers, 1, LOCK_SERVERS_MAX)?;
        check("payment-resources", self.payment_resources, 1, PAYMENT_RESOURCES_MAX)?;
        check("rail-proxies", self.rail_proxies, 1, RAIL_PROXIES_MAX)?;
        check("executors", self.executors, 0, EXECUTORS_MAX)?;
        check("executor-concurrency", self.executor_concurrency, 1, EXECUTOR_CONCURRENCY_MAX)?;
        if !self.executor_concurrencies.is_empty() {
            if self.executor_concurrencies.len() != self.executors as usize {
                return Err(format!(
                    "topology.executor-concurrencies has {} entries for {} executors",
                    self.executor_concurrencies.len(),
                    self.executors
                ));
            }
            for c in &self.executor_concurrencies {
                check("executor-concurrencies[]", *c, 1, EXECUTOR_CONCURRENCY_MAX)?;
            }
        }
        check("lock-clients", self.lock_clients, 0, LOCK_CLIENTS_MAX)
    }
}

/// What the world's workload generator offers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Workload {
    #[serde(default = "one_u32")]
    pub accounts: u32,
    /// How many of the accounts take most payouts.
    #[serde(default)]
    pub hot_accounts: u32,
    #[serde(default)]
    pub payouts: u32,
    /// Payouts arrive spread over this long (0: all at the start).
    #[serde(default)]
    pub arrival_ms: u64,
    /// The share of payouts the hot accounts take (optional, 0..=1; without it 0.8 when
    /// some accounts are not hot).
    #[serde(default)]
    pub hot_share: Option<f64>,
}

impl Default for Workload {
    fn default() -> Self {
        Workload { accounts: 1, hot_accounts: 0, payouts: 0, arrival_ms: 0, hot_share: None }
    }
}

/// The operator of a campaign seed (`[operator]`).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Operator {
    /// Revokes of a held lock at times drawn over the fault phase.
    #[serde(default)]
    pub revokes: u32,
    /// Whether the operator resolves RAIL_AMBIGUOUS payouts mid-run.
    #[serde(default)]
    pub resolves: bool,
}

/// Most operator revokes a scenario may ask for.
pub const OPERATOR_REVOKES_MAX: u32 = 100;

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

/// One step: a fault at the cursor (the one vocabulary, [`Fault`]: every fault verb), or
/// a control step ([`Control`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// `fault` at the cursor, after `when` if given (a `for-ms` closes it that long after).
    Fault {
        fault: Fault,
        when: Option<Trigger>,
    },
    Control(Control),
}

/// The steps that are not faults.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(tag = "action", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Control {
    /// Submit payout `payout` (a label; each label is one CLAIMED payout) with `token`.
    Submit {
        payout: String,
        token: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expect: Option<Expect>,
    },
    /// `kill` then `restart` the rail-proxy node: its process memory is gone, paydb is not.
    RestartProxy,
    /// Let `ms` of simulated time pass.
    Sleep { ms: u64 },
    /// The scripted lock client `client` opens a session (TTL `session-ttl-ms`, else the
    /// lock client's default), acquires `key` waiting up to `wait-ms` in the server's queue,
    /// holds a grant for `hold-ms` and releases it. Runs on its own node: the next step does
    /// not wait for it.
    #[serde(rename_all = "kebab-case")]
    Acquire {
        client: String,
        key: String,
        #[serde(default)]
        wait_ms: u64,
        hold_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session_ttl_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        when: Option<Trigger>,
    },
}

/// The verbs of [`Control`]; every other `action` is a [`Fault`]'s.
const CONTROL_VERBS: [&str; 4] = ["submit", "restart-proxy", "sleep", "acquire"];

impl<'de> Deserialize<'de> for Step {
    /// A control verb reads as [`Control`]; anything else as a [`Fault`] with an optional
    /// `when` (so a fault verb is declared once, on [`Fault`]).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Step, D::Error> {
        use serde::de::Error;
        let mut t = toml::Table::deserialize(d)?;
        let action = t.get("action").and_then(toml::Value::as_str).unwrap_or_default();
        if CONTROL_VERBS.contains(&action) {
            return Control::deserialize(toml::Value::Table(t)).map(Step::Control).map_err(D::Error::custom);
        }
        let when = t.remove("when").map(toml::Value::try_into::<Trigger>).transpose().map_err(D::Error::custom)?;
        let fault = Fault::deserialize(toml::Value::Table(t)).map_err(D::Error::custom)?;
        Ok(Step::Fault { fault, when })
    }
}

impl Step {
    /// The step as its scenario table (what [`Step`]'s `Deserialize` reads back).
    pub fn table(&self) -> toml::Table {
        match self {
            Step::Fault { fault, when } => {
                let mut t = fault.table();
                if let Some(w) = when {
                    t.insert("when".into(), toml::Value::try_from(w).unwrap_or(toml::Value::Boolean(false)));
                }
                t
            }
            Step::Control(c) => toml::Table::try_from(c).unwrap_or_default(),
        }
    }

    /// The step's verb, as written in the file.
    pub fn verb(&self) -> String {
        match self {
            Step::Fault { fault, .. } => fault.verb(),
            Step::Control(c) => {
                self.table().get("action").and_then(toml::Value::as_str).map_or_else(|| format!("{c:?}"), str::to_owned)
            }
        }
    }

    fn nodes(&self) -> Vec<String> {
        match self {
            Step::Fault { fault, .. } => fault.nodes(),
            Step::Control(Control::Acquire { client, .. }) => vec![client.clone()],
            Step::Control(_) => vec![],
        }
    }
}

/// What a submission step must come to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Expect {
    Acked,
    Fenced,
    Duplicate,
    Ambiguous,
    Rejected,
    Unavailable,
    NotClaimable,
    /// 500 `INTERNAL`: the outcome is unknown (never retry-safe).
    Internal,
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
            Expect::Internal => (500, "INTERNAL"),
        }
    }
}

fn check_ms(what: &str, ms: Option<u64>) -> Result<(), String> {
    match ms {
        Some(ms) if ms == 0 || ms > STEP_MS_MAX => Err(format!("{what} = {ms} outside 1..={STEP_MS_MAX}")),
        _ => Ok(()),
    }
}

impl Scenario {
    pub fn parse(text: &str) -> Result<Scenario, String> {
        let s: Scenario = toml::from_str(text).map_err(|e| e.to_string())?;
        s.validate()?;
        Ok(s)
    }

    /// The node names steps may use: `nodes` when given, else the topology's.
    pub fn node_names(&self) -> Vec<String> {
        if self.nodes.is_empty() {
            self.topology.node_names()
        } else {
            self.nodes.clone()
        }
    }

    /// Whether this is a legacy proxy scenario (an explicit `nodes` list with the rail-proxy).
    pub fn is_proxy_only(&self) -> bool {
        self.nodes.iter().any(|n| n == "rail-proxy")
    }

    fn validate(&self) -> Result<(), String> {
        if let Some(bad) = self.invariants.iter().find(|i| !INVARIANTS.contains(&i.as_str())) {
            return Err(format!("unknown invariant {bad:?} (known: {})", INVARIANTS.join(", ")));
        }
        let probe_names: Vec<&str> = dlock_rt::probe::Probe::ALL.iter().map(|p| p.name()).collect();
        if let Some(bad) = self.probes.iter().find(|p| !probe_names.contains(&p.as_str())) {
            return Err(format!("unknown probe {bad:?} (known: {})", probe_names.join(", ")));
        }
        self.topology.validate()?;
        if self.workload.payouts > PAYOUTS_MAX {
            return Err(format!("workload.payouts = {} above {PAYOUTS_MAX}", self.workload.payouts));
        }
        if self.workload.accounts == 0 || self.workload.hot_accounts > self.workload.accounts {
            return Err("workload: accounts must be >= 1 and >= hot-accounts".into());
        }
        if self.workload.hot_share.is_some_and(|h| !(0.0..=1.0).contains(&h)) {
            return Err("workload.hot-share outside 0..=1".into());
        }
        if self.operator.revokes > OPERATOR_REVOKES_MAX {
            return Err(format!("operator.revokes = {} above {OPERATOR_REVOKES_MAX}", self.operator.revokes));
        }
        let names = self.node_names();
        if let Some(bad) = self.skew_ms.keys().find(|n| !names.contains(n)) {
            return Err(format!("skew-ms names node {bad:?}, which the scenario does not start"));
        }
        if let Some(bad) = self.node_settings.keys().find(|n| !n.starts_with("executor-") || !names.contains(n)) {
            return Err(format!(
                "node-settings names {bad:?}: only an executor the scenario starts takes its own settings"
            ));
        }
        if !self.nodes.is_empty() {
            for required in ["rail-stub", "rail-proxy"] {
                if !self.nodes.iter().any(|n| n == required) {
                    return Err(format!("nodes must include {required}"));
                }
            }
        }
        if self.steps.is_empty() {
            return Err("a scenario needs at least one step".into());
        }
        for (i, step) in self.steps.iter().enumerate() {
            let at = |e: String| format!("step {i} ({}): {e}", step.verb());
            if let Some(bad) = step.nodes().into_iter().find(|n| !names.contains(n)) {
                return Err(at(format!("node {bad:?} is not started (nodes: {})", names.join(", "))));
            }
            match step {
                Step::Fault { fault, .. } => fault.validate().map_err(at)?,
                Step::Control(Control::Submit { .. } | Control::RestartProxy) if !self.is_proxy_only() => {
                    return Err(at("submit and restart-proxy need nodes = [\"rail-stub\", \"rail-proxy\"]".into()));
                }
                Step::Control(Control::Sleep { ms }) => check_ms("ms", Some(*ms)).map_err(at)?,
                Step::Control(Control::Acquire { client, key, wait_ms, hold_ms, session_ttl_ms, .. }) => {
                    if !client.starts_with("client-") {
                        return Err(at(format!("{client:?} is not a scripted lock client (client-N)")));
                    }
                    if key.is_empty()
                        || key.len() > 128
                        || !key.chars().all(|c| c.is_ascii_alphanumeric() || ":._-".contains(c))
                    {
                        return Err(at(format!("lock key {key:?} must be 1 to 128 of [a-zA-Z0-9:._-]")));
                    }
                    if *wait_ms > ACQUIRE_WAIT_MS_MAX {
                        return Err(at(format!("wait-ms = {wait_ms} above {ACQUIRE_WAIT_MS_MAX}")));
                    }
                    if !(1..=ACQUIRE_HOLD_MS_MAX).contains(hold_ms) {
                        return Err(at(format!("hold-ms = {hold_ms} outside 1..={ACQUIRE_HOLD_MS_MAX}")));
                    }
                    if session_ttl_ms
                        .is_some_and(|t| !(CLIENT_SESSION_TTL_MS_MIN..=CLIENT_SESSION_TTL_MS_MAX).contains(&t))
                    {
                        return Err(at(format!(
                            "session-ttl-ms outside {CLIENT_SESSION_TTL_MS_MIN}..={CLIENT_SESSION_TTL_MS_MAX}"
                        )));
                    }
                }
                Step::Control(_) => {}
            }
        }
        // Partition names are unique and every named heal has its partition.
        let mut named: Vec<&str> = Vec::new();
        for step in &self.steps {
            match step {
                Step::Fault { fault: Fault::Partition { name: Some(n), .. }, .. } => {
                    if named.contains(&n.as_str()) {
                        return Err(format!("partition name {n:?} used twice"));
                    }
                    named.push(n)
                }
                Step::Fault { fault: Fault::Heal { name: Some(n) }, .. } if !named.contains(&n.as_str()) => {
                    return Err(format!("heal names partition {n:?}, which no earlier step opens"));
                }
                _ => {}
            }
        }
        Ok(())
    }

    pub fn load(path: &Path) -> Result<Scenario, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Scenario::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Payout labels in order of first use.
    pub fn payout_labels(&self) -> Vec<String> {
        let mut labels: Vec<String> = Vec::new();
        for s in &self.steps {
            if let Step::Control(Control::Submit { payout, .. }) = s {
                if !labels.contains(payout) {
                    labels.push(payout.clone());
                }
            }
        }
        labels
    }

    /// The verbs the scenario uses.
    pub fn verbs(&self) -> Vec<String> {
        let mut v: Vec<String> = self.steps.iter().map(Step::verb).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The fault steps as a [`Schedule`]: each fault (and acquire) at the cursor, which
    /// only `sleep` advances; its timeline adds each `for-ms`'s undo that long after.
    /// `submit` steps are the legacy runner's and take no time here; `restart-proxy` is a
    /// crash and a start of `rail-proxy`.
    pub fn schedule(&self) -> Schedule {
        let mut cursor = 0u64;
        let mut events = Vec::new();
        for step in &self.steps {
            step_entries(step, &mut cursor, &mut events);
        }
        Schedule { events }
    }
}

/// Appends `step`'s schedule entries at `cursor` to `events` (a `sleep` advances the cursor).
fn step_entries(step: &Step, cursor: &mut u64, events: &mut Vec<Timed>) {
    let at_ms = *cursor;
    match step {
        Step::Fault { fault, when } => events.push(Timed { at_ms, when: *when, event: Event::Fault(fault.clone()) }),
        Step::Control(Control::Submit { .. }) => {}
        Step::Control(Control::RestartProxy) => {
            events.push(Timed::fault(at_ms, Fault::Crash { node: "rail-proxy".into(), for_ms: None }));
            events.push(Timed::fault(at_ms, Fault::Start { node: "rail-proxy".into() }));
        }
        Step::Control(Control::Sleep { ms }) => *cursor += ms,
        Step::Control(Control::Acquire { client, key, wait_ms, hold_ms, session_ttl_ms, when }) => events.push(Timed {
            at_ms,
            when: *when,
            event: Event::Acquire {
                client: client.clone(),
                key: key.clone(),
                wait_ms: *wait_ms,
                hold_ms: *hold_ms,
                session_ttl_ms: *session_ttl_ms,
            },
        }),
    }
}

impl Step {
    /// This step's timeline alone, from time 0 (the legacy runner plays steps one by one).
    pub fn events(&self) -> Vec<Timed> {
        let mut events = Vec::new();
        step_entries(self, &mut 0, &mut events);
        Schedule { events }.timeline()
    }
}

impl Scenario {
    /// Where the steps' cursor ends (the sum of the `sleep`s), in ms.
    pub fn cursor_end_ms(&self) -> u64 {
        self.steps.iter().map(|s| if let Step::Control(Control::Sleep { ms }) = s { *ms } else { 0 }).sum()
    }

    /// Simulated time to let pass after the schedule's last event, so the steps' cursor
    /// (the trailing `sleep`) is honoured.
    pub fn tail_ms(&self) -> u64 {
        self.cursor_end_ms().saturating_sub(self.schedule().end_ms())
    }

    /// How many steps wait for a trigger.
    pub fn triggers(&self) -> usize {
        self.schedule().timeline().iter().filter(|t| t.when.is_some()).count()
    }

    /// The `[settings]` as C5 key and value strings.
    pub fn settings_pairs(&self) -> Vec<(String, String)> {
        self.settings.iter().map(|(k, v)| (k.clone(), setting_value(v))).collect()
    }

    /// The `[node-settings.NODE]` tables as C5 key and value strings, by node.
    pub fn node_settings_pairs(&self) -> BTreeMap<String, Vec<(String, String)>> {
        self.node_settings
            .iter()
            .map(|(n, t)| (n.clone(), t.iter().map(|(k, v)| (k.clone(), setting_value(v))).collect()))
            .collect()
    }

    /// The swarm configuration a campaign seed plays this scenario with: the scenario's
    /// topology, rail knobs, workload, operator (none by default) and settings; no drawn
    /// faults or stalls (the steps are the faults). `fault_ms` bounds the schedule: the steps' time plus the
    /// longest wait of each trigger.
    pub fn swarm_config(&self, seed: u64, trigger_wait_ms_max: u64) -> crate::swarm::SwarmConfig {
        use crate::swarm::{Backend, SwarmConfig};
        let t = &self.topology;
        let w = &self.workload;
        let mut c = SwarmConfig::draw(seed);
        c.lock_replicas = t.lock_servers as usize;
        c.payment_replicas = t.payment_resources as usize;
        c.proxy_replicas = t.rail_proxies as usize;
        c.executors = if t.executor_concurrencies.is_empty() {
            vec![t.executor_concurrency as usize; t.executors as usize]
        } else {
            t.executor_concurrencies.iter().map(|c| *c as usize).collect()
        };
        c.backend = match t.lock_backend {
            LockBackend::Mem => Backend::Mem,
            LockBackend::Etcd => Backend::Etcd,
        };
        c.stub_latency_ms = self.rail.latency_ms;
        c.stub_failure_rate = self.rail.failure_rate;
        c.stub_duplicate_ack_rate = self.rail.duplicate_ack_rate;
        c.stub_decline_rate = self.rail.decline_rate;
        c.executor_pause_rate = 0.0;
        c.payouts = w.payouts as usize;
        c.accounts = w.accounts as usize;
        c.hot_accounts = (w.hot_accounts as usize).max(1);
        c.hot_share = match (w.hot_share, w.hot_accounts) {
            (Some(h), _) => h,
            (None, 0) => 0.0,
            (None, h) if h >= w.accounts => 1.0,
            _ => HOT_SHARE,
        };
        c.arrival_ms = w.arrival_ms;
        c.operator_revokes = self.operator.revokes as usize;
        c.operator_resolves = self.operator.resolves;
        c.faults = crate::schedule::FaultRates::none();
        // The steps are the faults and the settings the knobs: nothing else drawn from the seed.
        c.drifted_executor = None;
        c.lock_wait_ms = 0;
        let span = self.cursor_end_ms().max(self.schedule().end_ms());
        c.fault_ms = span.saturating_add(trigger_wait_ms_max.saturating_mul(self.triggers() as u64)).max(1);
        c
    }

    /// The configuration line a campaign prints before the seed runs.
    pub fn describe(&self, seed: u64) -> String {
        let t = &self.topology;
        let w = &self.workload;
        format!(
            "seed={seed} scenario={} topo=lock{}/pay{}/proxy{} exec={}x{} clients={} backend={:?} \
             rail(lat={}ms fail={} dup={} decl={}) work(payouts={} accounts={} hot={} arrival={}ms) steps={}",
            self.name,
            t.lock_servers,
            t.payment_resources,
            t.rail_proxies,
            t.executors,
            t.executor_concurrency,
            t.lock_clients,
            t.lock_backend,
            self.rail.latency_ms,
            self.rail.failure_rate,
            self.rail.duplicate_ack_rate,
            self.rail.decline_rate,
            w.payouts,
            w.accounts,
            w.hot_accounts,
            w.arrival_ms,
            self.steps.len()
        )
    }
}

/// The share of payouts the hot accounts take when some accounts are not hot.
pub const HOT_SHARE: f64 = 0.8;

fn setting_value(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The name of every shipped scenario, sorted.
pub fn names() -> Result<Vec<String>, String> {
    Ok(all()?.into_iter().map(|(_, s)| s.name).collect())
}

/// The shipped scenario `name` (`scenarios/NAME.toml`); an unknown name is an error listing
/// the known ones.
///
/// A name ending in `.toml` is a path instead (a file outside `scenarios/`, such as the one
/// `dlock-sim shrink --out FILE.toml` writes).
pub fn load_named(name: &str) -> Result<Scenario, String> {
    if name.ends_with(".toml") {
        return Scenario::load(Path::new(name));
    }
    let known = names()?;
    if !known.iter().any(|n| n == name) {
        return Err(format!("unknown scenario {name:?} (known: {})", known.join(", ")));
    }
    Scenario::load(&scenarios_dir().join(format!("{name}.toml")))
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
    fn every_shipped_scenario_parses_and_is_named_after_its_file() {
        let all = all().expect("scenarios load");
        assert!(all.len() >= 12, "expected the shipped scenarios, found {}", all.len());
        for (path, s) in all {
            assert!(!s.steps.is_empty(), "{path}");
            assert!(path.ends_with(&format!("/{}.toml", s.name)), "{path} is named {:?}", s.name);
            assert!(!s.description.trim().is_empty(), "{path} has no description");
            assert!(s.schedule().closes_what_it_opens(), "{path} leaves a fault open");
        }
    }

    #[test]
    fn every_fault_verb_is_used_by_at_least_one_shipped_scenario() {
        let all = all().expect("scenarios load");
        let used: Vec<String> = all.iter().flat_map(|(_, s)| s.verbs()).collect();
        // `unclog` is what a clog's `for-ms` plays; every shipped clog has one.
        for verb in crate::fault::every_verb().into_iter().filter(|v| v != "unclog") {
            assert!(used.contains(&verb), "no scenario uses {verb}");
        }
    }

    #[test]
    fn the_issues_named_scenarios_exist() {
        let names: Vec<String> = all().expect("scenarios load").into_iter().map(|(_, s)| s.name).collect();
        for n in [
            "pause-during-rail-call",
            "proxy-restart",
            "stale-writer-second-proxy",
            "revoke-mid-flight",
            "clock-drift-40",
            "lost-ack-intent",
            "lock-leader-loss",
            "duplicate-ack-rail",
            "waiter-session-expires",
            "partition-holder-lock-server",
        ] {
            assert!(names.iter().any(|m| m == n), "missing scenario {n}");
        }
    }

    const BASE: &str = "name = \"x\"\ndescription = \"d\"\n";

    #[test]
    fn unknown_keys_verbs_nodes_and_invariants_are_refused() {
        let legacy = "name = \"x\"\nnodes = [\"rail-stub\", \"rail-proxy\"]\naccount = \"a\"\n";
        assert!(Scenario::parse(&format!("{legacy}invariants = [\"nope\"]\n[[step]]\naction = \"restart-proxy\"\n"))
            .is_err());
        assert!(Scenario::parse(&format!("{legacy}colour = 1\n[[step]]\naction = \"restart-proxy\"\n")).is_err());
        assert!(Scenario::parse(&format!("{legacy}[[step]]\naction = \"explode\"\n")).is_err());
        assert!(Scenario::parse(&format!("{legacy}[[step]]\naction = \"restart-proxy\"\n")).is_ok());
        // A key unknown to one verb, a node the topology does not start, a bad store op.
        let bad = [
            "[[step]]\naction = \"pause\"\nnode = \"executor-1\"\nfor-sec = 3\n",
            "[[step]]\naction = \"pause\"\nnode = \"executor-9\"\n",
            "[[step]]\naction = \"store-fault\"\nstore = \"paydb\"\nop = \"clam\"\nfault = \"commit-unknown\"\n",
            "[[step]]\naction = \"store-fault\"\nstore = \"paydb\"\nop = \"payout\"\nfault = \"commit-unknown\"\n",
            "[[step]]\naction = \"store-fault\"\nstore = \"paydb\"\nfault = \"leader-loss\"\nfor-ms = 5\n",
            "[[step]]\naction = \"drift-clock\"\nnode = \"executor-1\"\nrate = 0\n",
            "[[step]]\naction = \"heal\"\nname = \"never-opened\"\n",
            "[[step]]\naction = \"submit\"\npayout = \"p\"\ntoken = 1\n",
            "[topology]\nexecutors = 7\n[[step]]\naction = \"sleep\"\nms = 1\n",
            "[[step]]\naction = \"pause\"\nnode = \"executor-1\"\nwhen = \"sometime\"\n",
        ];
        for b in bad {
            assert!(Scenario::parse(&format!("{BASE}{b}")).is_err(), "accepted: {b}");
        }
        let good =
            "[[step]]\naction = \"store-fault\"\nstore = \"paydb\"\nop = \"claim\"\nfault = \"commit-unknown\"\n";
        assert!(Scenario::parse(&format!("{BASE}{good}")).is_ok());
    }

    #[test]
    fn acquire_steps_and_node_settings_are_checked() {
        let clients = "[topology]\nlock-clients = 2\nexecutors = 2\n";
        let step = |body: &str| format!("{BASE}{clients}[[step]]\naction = \"acquire\"\n{body}");
        let ok = step(
            "client = \"client-2\"\nkey = \"payout:acct-0\"\nwait-ms = 20000\nhold-ms = 1000\nsession-ttl-ms = 3000\n",
        );
        let s = Scenario::parse(&ok).expect("a good acquire parses");
        assert_eq!(s.verbs(), ["acquire"]);
        assert!(s.node_names().contains(&"client-2".to_owned()));
        for bad in [
            "client = \"client-3\"\nkey = \"k\"\nhold-ms = 1\n",
            "client = \"executor-1\"\nkey = \"k\"\nhold-ms = 1\n",
            "client = \"client-1\"\nkey = \"a b\"\nhold-ms = 1\n",
            "client = \"client-1\"\nkey = \"k\"\nwait-ms = 30001\nhold-ms = 1\n",
            "client = \"client-1\"\nkey = \"k\"\nhold-ms = 0\n",
            "client = \"client-1\"\nkey = \"k\"\nhold-ms = 1\nsession-ttl-ms = 10\n",
            "client = \"client-1\"\nkey = \"k\"\nhold-ms = 1\nholdms = 1\n",
        ] {
            assert!(Scenario::parse(&step(bad)).is_err(), "accepted: {bad}");
        }
        let settings = |table: &str| {
            format!("{BASE}{clients}[node-settings.{table}]\n\"executor.chaos.pause-rate\" = 1.0\n[[step]]\naction = \"sleep\"\nms = 1\n")
        };
        let s = Scenario::parse(&settings("executor-2")).expect("an executor's own settings parse");
        assert_eq!(s.node_settings_pairs()["executor-2"], [("executor.chaos.pause-rate".to_owned(), "1.0".to_owned())]);
        for bad in ["executor-3", "lock-1", "client-1"] {
            assert!(Scenario::parse(&settings(bad)).is_err(), "accepted node-settings for {bad}");
        }
    }

    #[test]
    fn a_scenario_seed_configuration_is_the_files_with_no_drawn_faults() {
        let s = load_named("stale-writer-second-proxy").expect("shipped");
        let c = s.swarm_config(9, 1_000);
        assert_eq!((c.lock_replicas, c.payment_replicas, c.proxy_replicas, c.executors.clone()), (1, 1, 2, vec![1, 1]));
        assert_eq!((c.payouts, c.accounts, c.hot_accounts, c.hot_share), (2, 1, 1, 1.0));
        assert_eq!((c.stub_latency_ms, c.operator_revokes, c.operator_resolves), (6_000, 0, false));
        assert!(c.faults.is_zero() && c.executor_pause_rate == 0.0);
        // The steps' cursor (40 s) plus one trigger's longest wait.
        assert_eq!(c.fault_ms, 40_000 + 1_000);
        assert_eq!(s.tail_ms(), 40_000);
        assert!(s.describe(9).starts_with("seed=9 scenario=stale-writer-second-proxy topo=lock1/pay1/proxy2 "));
        assert!(load_named("nope").is_err_and(|e| e.contains("known: ") && e.contains("proxy-restart")));
    }

    #[test]
    fn a_scenario_seeds_replay_command_names_the_scenario() {
        use crate::summary::replay_command_of;
        let s = load_named("waiter-session-expires").expect("shipped");
        assert_eq!(
            replay_command_of(4, &s.describe(4)),
            "cargo xtask sim replay --seed 4 --scenario waiter-session-expires"
        );
        let swarm = crate::swarm::SwarmConfig::draw(4).to_string();
        assert_eq!(replay_command_of(4, &swarm), "cargo xtask sim replay --seed 4");
    }

    #[test]
    fn the_schedule_follows_the_cursor_and_closes_timed_faults() {
        let text = format!(
            "{BASE}[topology]\nexecutors = 2\n\
             [[step]]\naction = \"sleep\"\nms = 100\n\
             [[step]]\naction = \"pause\"\nnode = \"executor-1\"\nfor-ms = 500\nwhen = \"rail-call\"\n\
             [[step]]\naction = \"partition\"\na = [\"executor-2\"]\nb = [\"lock-1\"]\nfor-ms = 50\n\
             [[step]]\naction = \"sleep\"\nms = 1000\n\
             [[step]]\naction = \"clog\"\nfrom = \"proxy-1\"\nto = \"rail-stub\"\nboth-ways = true\nfor-ms = 10\n"
        );
        let s = Scenario::parse(&text).expect("parses").schedule();
        let timeline = s.timeline();
        let verbs: Vec<String> = timeline.iter().map(|t| t.event.verb()).collect();
        let at: Vec<(u64, &str)> = timeline.iter().zip(&verbs).map(|(t, v)| (t.at_ms, v.as_str())).collect();
        assert_eq!(
            at,
            [
                (100, "pause"),
                (100, "partition"),
                (150, "heal"),
                (600, "resume"),
                (1100, "clog"),
                (1100, "clog"),
                (1110, "unclog"),
                (1110, "unclog"),
            ]
        );
        assert_eq!(timeline[0].when, Some(Trigger::RailCall));
        assert!(s.closes_what_it_opens());
    }
}
