//! Shrinking a failing seed (`dlock-sim shrink --seed S`, `cargo xtask sim shrink ...`):
//! delta debugging of the seed's configuration and fault schedule down to a small scenario
//! file that still breaks the same invariant.
//!
//! 1. **The failure**: the seed runs once (a swarm seed, or `--scenario NAME`, with the
//!    `--plant`/`--layer-off` given); its first correctness failure (else its first
//!    liveness failure) names the invariant to keep breaking. A seed without one is refused ([`ShrinkError::Clean`]).
//! 2. **The plan** ([`Plan`]): the seed as an explicit, editable scenario: the drawn
//!    configuration (topology with each executor's concurrency, workload, rail knobs, the
//!    executors' settings, the operator) and the concrete list of the fault events the
//!    seed drew, each a scenario step at its time (an open and its undo become one step
//!    with `for-ms`; an undo the fault phase cut leaves the fault open until `heal_all`,
//!    as in the seed; events at or after `fault_ms` never played and are dropped), ending
//!    with the fault phase. Its scenario has `swarm-rng = true`, so it plays the seed's
//!    races. The un-shrunk plan is played first and must break the same invariant
//!    ([`ShrinkError::NotReproduced`] otherwise). A `--scenario` seed's plan is its file's
//!    steps at their cursor times.
//! 3. **ddmin** over the plan's steps (fault events; a proxy scenario's submissions), then
//!    greedy passes until none helps: drop each executor, lower each executor's
//!    concurrency, drop a lock, payment or proxy replica, fewer payouts, halve every
//!    `for-ms` (pauses and the other timed faults); and the chaos that is no fault event:
//!    the operator off, each rail knob to zero, the executors' stalls off. Steps naming a
//!    dropped node are dropped, later replicas renumbered. A candidate already judged is
//!    not run again.
//! 4. **Acceptance**: a candidate is kept only if its scenario, played with the same seed
//!    and the same bug or switched-off layer, has a correctness or liveness failure of the
//!    same invariant; and, when a bug is planted or a layer is off, the same candidate
//!    without them does not (so the shrunk file still needs the bug to fail). Every
//!    candidate is a scenario run ([`crate::campaign::run_scenario`]), so the result fails
//!    by construction; the written file is parsed back and must equal it.
//!
//! Invariants: at most [`SHRINK_RUNS_MAX`] seed runs (reported); the shrunk plan is never
//! larger than the original in fault events, payouts, executors or replicas; shrinking is
//! deterministic (the same seed and options give the same file).

use std::collections::BTreeMap;

use dlock_rt::defence::Layer;
use dlock_rt::planted::Bug;

use crate::campaign::{self, RunOptions};
use crate::outcome::{FailureClass, SeedOutcome};
use crate::scenario::{Control, LockBackend, Operator, RailKnobs, Scenario, Step, Topology, Workload};
use crate::schedule::{Event, Fault, Schedule};
use crate::swarm::{Backend, SwarmConfig};

/// Most seed runs one shrink may use (the original, the plan's check and every candidate,
/// the controls without the bug included).
pub const SHRINK_RUNS_MAX: usize = 400;

/// What to shrink.
#[derive(Debug, Clone, Default)]
pub struct ShrinkOptions {
    pub seed: u64,
    /// A scenario (name or `.toml` path) instead of the swarm draw.
    pub scenario: Option<String>,
    pub planted: Option<Bug>,
    pub layer_off: Option<Layer>,
    /// The shrunk scenario's name (its file is `<name>.toml`).
    pub name: String,
    /// How the replay command in the file's header names it (default: `name`, a file under
    /// `scenarios/`; else its path).
    pub replay_as: Option<String>,
}

/// Why a seed was not shrunk.
#[derive(Debug, Clone, PartialEq)]
pub enum ShrinkError {
    /// The seed has no correctness or liveness failure: nothing to shrink.
    Clean(String),
    /// The seed's plan, played as a scenario, does not break the seed's invariant.
    NotReproduced(String),
    /// The scenario given does not load.
    Scenario(String),
}

impl std::fmt::Display for ShrinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShrinkError::Clean(s) | ShrinkError::NotReproduced(s) | ShrinkError::Scenario(s) => f.write_str(s),
        }
    }
}

/// A plan's size, as the report prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    /// Steps that inject a fault (`Event::kind` is some: a pause with its resume is one).
    pub fault_events: usize,
    /// Every step but the sleeps (a proxy scenario's submissions count here).
    pub steps: usize,
    pub payouts: usize,
    pub executors: usize,
    /// Lock, payment and proxy replicas together.
    pub replicas: usize,
}

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} fault events, {} steps, {} payouts, {} executors, {} replicas",
            self.fault_events, self.steps, self.payouts, self.executors, self.replicas
        )
    }
}

/// One step of a plan at its time (simulated ms after the fault phase starts).
#[derive(Debug, Clone, PartialEq)]
pub struct Timed {
    pub at_ms: u64,
    pub step: Step,
}

/// A seed as an explicit, editable scenario (module doc): `base` without its steps, the
/// timed steps, and the end of the fault phase.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub base: Scenario,
    pub steps: Vec<Timed>,
    pub end_ms: u64,
}

impl Plan {
    /// The plan of a swarm seed: its drawn configuration `cfg` and the schedule it drew.
    pub fn from_swarm(cfg: &SwarmConfig, drawn: &Schedule, name: &str) -> Plan {
        let s = |v: String| toml::Value::String(v);
        let settings: BTreeMap<String, toml::Value> = [
            ("executor.lock-ttl-ms", cfg.lock_ttl_ms.to_string()),
            ("executor.lock-wait-ms", cfg.lock_wait_ms.to_string()),
            ("executor.chaos.pause-rate", cfg.executor_pause_rate.to_string()),
            ("executor.chaos.pause-ms", cfg.executor_pause_ms.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), s(v)))
        .collect();
        let base = Scenario {
            name: name.to_owned(),
            description: String::new(),
            nodes: Vec::new(),
            topology: Topology {
                lock_servers: cfg.lock_replicas as u32,
                lock_backend: match cfg.backend {
                    Backend::Mem => LockBackend::Mem,
                    Backend::Etcd => LockBackend::Etcd,
                },
                payment_resources: cfg.payment_replicas as u32,
                rail_proxies: cfg.proxy_replicas as u32,
                executors: cfg.executors.len() as u32,
                executor_concurrency: 1,
                executor_concurrencies: cfg.executors.iter().map(|c| *c as u32).collect(),
                reconciler: true,
                lock_clients: 0,
            },
            workload: Workload {
                accounts: cfg.accounts as u32,
                hot_accounts: cfg.hot_accounts as u32,
                payouts: cfg.payouts as u32,
                arrival_ms: cfg.arrival_ms,
                hot_share: Some(cfg.hot_share),
            },
            account: String::new(),
            invariants: Vec::new(),
            probes: Vec::new(),
            rail: RailKnobs {
                latency_ms: cfg.stub_latency_ms,
                failure_rate: cfg.stub_failure_rate,
                duplicate_ack_rate: cfg.stub_duplicate_ack_rate,
                decline_rate: cfg.stub_decline_rate,
            },
            settings,
            node_settings: BTreeMap::new(),
            skew_ms: BTreeMap::new(),
            operator: Operator { revokes: cfg.operator_revokes as u32, resolves: cfg.operator_resolves },
            swarm_rng: true,
            forger: true,
            steps: Vec::new(),
        };
        Plan { base, steps: steps_of(drawn, cfg.fault_ms), end_ms: cfg.fault_ms }
    }

    /// The plan of a scenario: its steps at their cursor times, ending with its cursor.
    pub fn from_scenario(s: &Scenario, name: &str) -> Plan {
        let mut base = s.clone();
        base.name = name.to_owned();
        base.steps = Vec::new();
        let mut at_ms = 0;
        let mut steps = Vec::new();
        for step in &s.steps {
            match step {
                Step::Control(Control::Sleep { ms }) => at_ms += ms,
                other => steps.push(Timed { at_ms, step: other.clone() }),
            }
        }
        if !base.is_proxy_only() && base.topology.executor_concurrencies.is_empty() {
            base.topology.executor_concurrencies =
                vec![base.topology.executor_concurrency; base.topology.executors as usize];
        }
        Plan { base, steps, end_ms: at_ms }
    }

    /// The plan as a scenario: its steps in time order (stable), a `sleep` before each later
    /// one, and a last `sleep` to `end_ms`.
    pub fn scenario(&self) -> Scenario {
        let mut s = self.base.clone();
        let mut timed = self.steps.clone();
        timed.sort_by_key(|t| t.at_ms);
        let mut cursor = 0;
        for t in timed {
            if t.at_ms > cursor {
                s.steps.push(Step::Control(Control::Sleep { ms: t.at_ms - cursor }));
                cursor = t.at_ms;
            }
            s.steps.push(t.step);
        }
        if self.end_ms > cursor || s.steps.is_empty() {
            s.steps.push(Step::Control(Control::Sleep { ms: self.end_ms.saturating_sub(cursor).max(1) }));
        }
        s
    }

    pub fn size(&self) -> Size {
        let t = &self.base.topology;
        let proxy = self.base.is_proxy_only();
        Size {
            fault_events: self
                .steps
                .iter()
                .filter(|t| t.step.events().iter().any(|e| e.event.kind().is_some()))
                .count(),
            steps: self.steps.len(),
            payouts: if proxy { self.scenario().payout_labels().len() } else { self.base.workload.payouts as usize },
            executors: if proxy { 0 } else { t.executors as usize },
            replicas: if proxy { 0 } else { (t.lock_servers + t.payment_resources + t.rail_proxies) as usize },
        }
    }

    /// The plan without node `prefix-i` (1-based): steps naming it dropped (a partition
    /// only loses it from its side), later ones of the kind renumbered.
    fn without_node(&self, prefix: &str, i: u32) -> Plan {
        let rename = |n: &str| -> Option<String> {
            let Some(k) = n.strip_prefix(prefix).and_then(|r| r.strip_prefix('-')).and_then(|k| k.parse::<u32>().ok())
            else {
                return Some(n.to_owned());
            };
            match k.cmp(&i) {
                std::cmp::Ordering::Less => Some(n.to_owned()),
                std::cmp::Ordering::Equal => None,
                std::cmp::Ordering::Greater => Some(format!("{prefix}-{}", k - 1)),
            }
        };
        let mut p = self.clone();
        p.steps = self
            .steps
            .iter()
            .filter_map(|t| rename_step(&t.step, &rename).map(|step| Timed { at_ms: t.at_ms, step }))
            .collect();
        for k in self.base.node_settings.keys() {
            if let Some(v) = p.base.node_settings.remove(k) {
                if let Some(n) = rename(k) {
                    p.base.node_settings.insert(n, v);
                }
            }
        }
        for k in self.base.skew_ms.keys() {
            if let Some(v) = p.base.skew_ms.remove(k) {
                if let Some(n) = rename(k) {
                    p.base.skew_ms.insert(n, v);
                }
            }
        }
        let t = &mut p.base.topology;
        match prefix {
            "executor" => {
                t.executors -= 1;
                if (i as usize) <= t.executor_concurrencies.len() {
                    t.executor_concurrencies.remove(i as usize - 1);
                }
            }
            "lock" => t.lock_servers -= 1,
            "payment" => t.payment_resources -= 1,
            _ => t.rail_proxies -= 1,
        }
        p
    }
}

/// `step` with every node name mapped by `rename` (`None`: the node is gone); `None` when
/// the step has nothing left to act on.
fn rename_step(step: &Step, rename: &dyn Fn(&str) -> Option<String>) -> Option<Step> {
    match step {
        Step::Fault { fault, when } => Some(Step::Fault { fault: fault.rename_nodes(rename)?, when: *when }),
        // Control steps name no replica (a scripted client is never removed).
        Step::Control(_) => Some(step.clone()),
    }
}

/// A drawn schedule as timed steps (module doc, 2.): each entry that opens before
/// `fault_ms` is one step with its `for-ms`, except where the seed never plays the undo
/// (it falls at or after `fault_ms`, where the schedule is cut and everything heals): that
/// fault stays open to the end of the phase, as in the seed. A drawn partition loses its
/// `drawn-N` name (its step's `for-ms` heals it).
fn steps_of(drawn: &Schedule, fault_ms: u64) -> Vec<Timed> {
    let mut out = Vec::new();
    for t in drawn.events.iter().filter(|t| t.at_ms < fault_ms) {
        let step = match &t.event {
            Event::Fault(fault) => {
                let mut fault = fault.clone();
                let undo_unplayed = fault.for_ms().is_some_and(|ms| t.at_ms.saturating_add(ms) >= fault_ms);
                if fault.closed_by_undo() && undo_unplayed {
                    fault.clear_for_ms();
                }
                if let Fault::Partition { name, .. } = &mut fault {
                    *name = None;
                }
                Step::Fault { fault, when: t.when }
            }
            Event::Acquire { client, key, wait_ms, hold_ms, session_ttl_ms } => Step::Control(Control::Acquire {
                client: client.clone(),
                key: key.clone(),
                wait_ms: *wait_ms,
                hold_ms: *hold_ms,
                session_ttl_ms: *session_ttl_ms,
                when: t.when,
            }),
        };
        out.push(Timed { at_ms: t.at_ms, step });
    }
    out.sort_by_key(|t| t.at_ms);
    out
}

/// A shrunk seed.
#[derive(Debug, Clone)]
pub struct Shrunk {
    pub seed: u64,
    /// The invariant the seed broke, and every kept candidate breaks.
    pub invariant: &'static str,
    pub before: Size,
    pub after: Size,
    /// Seed runs used (at most [`SHRINK_RUNS_MAX`]).
    pub runs: usize,
    pub plan: Plan,
    /// The scenario file: a header comment and the shrunk plan's scenario.
    pub text: String,
}

/// The first correctness failure's invariant, else the first liveness failure's: the worse
/// class is the one kept.
fn target_of(o: &SeedOutcome) -> Option<&'static str> {
    let first = |class: FailureClass| o.failures.iter().find(|f| f.class == class).map(|f| f.invariant);
    first(FailureClass::Correctness).or_else(|| first(FailureClass::Liveness))
}

fn breaks(o: &SeedOutcome, invariant: &str) -> bool {
    o.failures
        .iter()
        .any(|f| matches!(f.class, FailureClass::Correctness | FailureClass::Liveness) && f.invariant == invariant)
}

/// Plays candidates, counting runs.
struct Judge {
    seed: u64,
    invariant: &'static str,
    opts: RunOptions,
    /// Whether a kept candidate must also not break the invariant without the bug/layer.
    control: bool,
    runs: usize,
    /// Every candidate judged, by its rendered scenario: none is run twice.
    judged: BTreeMap<String, bool>,
}

impl Judge {
    fn budget_left(&self) -> bool {
        self.runs < SHRINK_RUNS_MAX
    }

    /// Whether `plan` breaks the invariant (and, with a control, only with the bug).
    fn fails(&mut self, plan: &Plan) -> bool {
        let s = plan.scenario();
        let key = render(&s);
        if let Some(verdict) = self.judged.get(&key) {
            return *verdict;
        }
        // A candidate whose file would not parse (a named heal left without its partition, a
        // node the topology no longer starts) is no candidate: the file must play alone.
        let verdict = Scenario::parse(&key).is_ok_and(|back| back == s) && self.judge(&s);
        self.judged.insert(key, verdict);
        verdict
    }

    fn judge(&mut self, s: &Scenario) -> bool {
        if !self.budget_left() {
            return false;
        }
        self.runs += 1;
        if !breaks(&campaign::run_scenario(self.seed, s, &self.opts), self.invariant) {
            return false;
        }
        if self.control {
            if !self.budget_left() {
                return false;
            }
            self.runs += 1;
            let clean = RunOptions { planted: None, layer_off: None, ..self.opts.clone() };
            if breaks(&campaign::run_scenario(self.seed, s, &clean), self.invariant) {
                return false;
            }
        }
        true
    }
}

/// ddmin (Zeller and Hildebrandt) over the plan's steps: the smallest subset found that
/// still fails, each subset tried being a plan with only those steps.
fn ddmin(plan: &Plan, judge: &mut Judge) -> Plan {
    let with = |idx: &[usize]| Plan { steps: idx.iter().map(|&i| plan.steps[i].clone()).collect(), ..plan.clone() };
    let mut keep: Vec<usize> = (0..plan.steps.len()).collect();
    if !keep.is_empty() && judge.fails(&with(&[])) {
        return with(&[]);
    }
    let mut n = 2usize;
    while keep.len() >= 2 && judge.budget_left() {
        let chunk = keep.len().div_ceil(n);
        let parts: Vec<Vec<usize>> = keep.chunks(chunk).map(<[usize]>::to_vec).collect();
        let mut reduced = false;
        for part in &parts {
            if judge.fails(&with(part)) {
                keep = part.clone();
                n = 2;
                reduced = true;
                break;
            }
        }
        if !reduced && parts.len() > 2 {
            for k in 0..parts.len() {
                let complement: Vec<usize> =
                    parts.iter().enumerate().filter(|(j, _)| *j != k).flat_map(|(_, p)| p.iter().copied()).collect();
                if judge.fails(&with(&complement)) {
                    keep = complement;
                    n = (n - 1).max(2);
                    reduced = true;
                    break;
                }
            }
        }
        if !reduced {
            if n >= keep.len() {
                break;
            }
            n = (2 * n).min(keep.len());
        }
    }
    with(&keep)
}

/// The greedy passes' candidates of `p`, smallest change first within each kind.
fn candidates(p: &Plan) -> Vec<Plan> {
    let mut out = Vec::new();
    if p.base.is_proxy_only() {
        return out;
    }
    let t = &p.base.topology;
    for i in (1..=t.executors).rev() {
        if t.executors > 1 {
            out.push(p.without_node("executor", i));
        }
    }
    for i in 0..t.executor_concurrencies.len() {
        let c = t.executor_concurrencies[i];
        for lower in [1, c / 2] {
            if lower >= 1 && lower < c {
                let mut q = p.clone();
                q.base.topology.executor_concurrencies[i] = lower;
                out.push(q);
            }
        }
    }
    for (prefix, n) in [("lock", t.lock_servers), ("payment", t.payment_resources), ("proxy", t.rail_proxies)] {
        for i in (1..=n).rev() {
            if n > 1 {
                out.push(p.without_node(prefix, i));
            }
        }
    }
    // The chaos that is not a fault event: the operator, the rail's knobs, the stalls.
    if p.base.operator != Operator::default() {
        let mut q = p.clone();
        q.base.operator = Operator::default();
        out.push(q);
    }
    let r = &p.base.rail;
    for calm in [
        RailKnobs { latency_ms: 0, ..r.clone() },
        RailKnobs { failure_rate: 0.0, ..r.clone() },
        RailKnobs { duplicate_ack_rate: 0.0, ..r.clone() },
        RailKnobs { decline_rate: 0.0, ..r.clone() },
    ] {
        if calm != *r {
            let mut q = p.clone();
            q.base.rail = calm;
            out.push(q);
        }
    }
    let stall = "executor.chaos.pause-rate";
    if p.base.settings.get(stall).is_some_and(|v| v.as_str().is_some_and(|v| v != "0")) {
        let mut q = p.clone();
        q.base.settings.insert(stall.to_owned(), toml::Value::String("0".into()));
        out.push(q);
    }
    let payouts = p.base.workload.payouts;
    let mut fewer: Vec<u32> = vec![1, payouts / 4, payouts / 2, payouts.saturating_sub(1)];
    fewer.retain(|n| *n >= 1 && *n < payouts);
    fewer.dedup();
    for n in fewer {
        let mut q = p.clone();
        q.base.workload.payouts = n;
        out.push(q);
    }
    for i in 0..p.steps.len() {
        if let Step::Fault { fault, .. } = &p.steps[i].step {
            if let Some(ms) = fault.for_ms().filter(|ms| *ms >= 2) {
                let mut q = p.clone();
                if let Step::Fault { fault, .. } = &mut q.steps[i].step {
                    fault.set_for_ms(ms / 2);
                }
                out.push(q);
            }
        }
    }
    out
}

/// The replay command of a shrunk file at `scenario` (a name or a path).
pub fn replay_command(seed: u64, scenario: &str, planted: Option<Bug>, layer_off: Option<Layer>) -> String {
    let mut c = format!("cargo xtask sim replay --seed {seed} --scenario {scenario}");
    if let Some(b) = planted {
        c.push_str(&format!(" --plant {b}"));
    }
    if let Some(l) = layer_off {
        c.push_str(&format!(" --layer-off {l}"));
    }
    c
}

/// Shrinks `o.seed` (module doc).
pub fn shrink(o: &ShrinkOptions) -> Result<Shrunk, ShrinkError> {
    let opts = RunOptions {
        scenario: o.scenario.clone(),
        planted: o.planted,
        layer_off: o.layer_off,
        ..RunOptions::default()
    };
    let given = match &o.scenario {
        Some(name) => Some(crate::scenario::load_named(name).map_err(ShrinkError::Scenario)?),
        None => None,
    };
    let (original, drawn) = campaign::run_seed_drawn(o.seed, &opts);
    let what = format!(
        "seed {}{}{}{}",
        o.seed,
        o.scenario.as_ref().map(|s| format!(" (scenario {s})")).unwrap_or_default(),
        o.planted.map(|b| format!(" with bug {b} planted")).unwrap_or_default(),
        o.layer_off.map(|l| format!(" with layer {l} off")).unwrap_or_default()
    );
    let Some(invariant) = target_of(&original) else {
        let crashes: Vec<&str> = original.failures.iter().map(|f| f.invariant).collect();
        return Err(ShrinkError::Clean(format!(
            "{what} has no correctness or liveness failure{}: nothing to shrink",
            if crashes.is_empty() { String::new() } else { format!(" (only crashes: {})", crashes.join(", ")) }
        )));
    };
    let plan = match (&given, drawn) {
        (Some(s), _) => Plan::from_scenario(s, &o.name),
        (None, Some(d)) => Plan::from_swarm(&SwarmConfig::draw(o.seed), &d, &o.name),
        (None, None) => return Err(ShrinkError::NotReproduced(format!("{what}: the seed drew no schedule"))),
    };
    shrink_plan(plan, invariant, o, &what, 1)
}

/// Shrinks `plan` (module doc, 3. and 4.) for `invariant`, with `o`'s seed, bug and layer;
/// `what` names its origin in the errors and the header, `runs` were already used. Public
/// so that a test can shrink a plan it built (e.g. a seed's plan with faults added).
pub fn shrink_plan(
    plan: Plan,
    invariant: &'static str,
    o: &ShrinkOptions,
    what: &str,
    runs: usize,
) -> Result<Shrunk, ShrinkError> {
    let opts = RunOptions { planted: o.planted, layer_off: o.layer_off, ..RunOptions::default() };
    let mut judge = Judge {
        seed: o.seed,
        invariant,
        opts,
        control: o.planted.is_some() || o.layer_off.is_some(),
        runs,
        judged: BTreeMap::new(),
    };
    if !judge.fails(&plan) {
        return Err(ShrinkError::NotReproduced(format!(
            "{what} breaks {invariant}, but its plan played as a scenario does not (or also does without the bug/layer)"
        )));
    }
    let before = plan.size();
    let mut best = ddmin(&plan, &mut judge);
    loop {
        let mut improved = false;
        for c in candidates(&best) {
            if !judge.budget_left() {
                break;
            }
            if judge.fails(&c) {
                best = c;
                improved = true;
                break;
            }
        }
        if !improved || !judge.budget_left() {
            break;
        }
    }
    let after = best.size();
    // Every pass only removes or lowers (module doc, invariants), within the bound.
    assert!(
        after.fault_events <= before.fault_events
            && after.steps <= before.steps
            && after.payouts <= before.payouts
            && after.executors <= before.executors
            && after.replicas <= before.replicas,
        "shrinking grew the plan: {before} -> {after}"
    );
    assert!(judge.runs <= SHRINK_RUNS_MAX, "{} runs past {SHRINK_RUNS_MAX}", judge.runs);
    best.base.description = format!(
        "Seed {} shrunk by `dlock-sim shrink`: the smallest plan found that still breaks {invariant}{}{}.",
        o.seed,
        o.planted.map(|b| format!(" with bug {b} planted")).unwrap_or_default(),
        o.layer_off.map(|l| format!(" with layer {l} switched off")).unwrap_or_default()
    );
    let header = [
        format!("# Shrunk by `dlock-sim shrink --seed {}` from {what}.", o.seed),
        format!("# Invariant: {invariant} (the seed's first correctness/liveness failure)."),
        format!(
            "# Bug planted: {}; layer off: {}.",
            o.planted.map(|b| b.to_string()).unwrap_or_else(|| "none".into()),
            o.layer_off.map(|l| l.to_string()).unwrap_or_else(|| "none".into())
        ),
        format!("# Before: {before}."),
        format!("# After:  {after}."),
        format!("# Runs used: {} of {SHRINK_RUNS_MAX}.", judge.runs),
        format!(
            "# Replay: {}",
            replay_command(o.seed, o.replay_as.as_deref().unwrap_or(&o.name), o.planted, o.layer_off)
        ),
    ];
    let text = format!("{}\n\n{}", header.join("\n"), render(&best.scenario()));
    Ok(Shrunk { seed: o.seed, invariant, before, after, runs: judge.runs, plan: best, text })
}

fn q(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

fn f(x: f64) -> String {
    toml::Value::Float(x).to_string()
}

fn list(v: &[String]) -> String {
    format!("[{}]", v.iter().map(|s| q(s)).collect::<Vec<_>>().join(", "))
}

/// `s` as a scenario file (`Scenario::parse` reads it back to `s`).
pub fn render(s: &Scenario) -> String {
    let mut o = String::new();
    let mut line = |l: String| {
        o.push_str(&l);
        o.push('\n');
    };
    line(format!("name = {}", q(&s.name)));
    line(format!("description = {}", q(&s.description)));
    if !s.nodes.is_empty() {
        line(format!("nodes = {}", list(&s.nodes)));
    }
    if !s.account.is_empty() {
        line(format!("account = {}", q(&s.account)));
    }
    if !s.invariants.is_empty() {
        line(format!("invariants = {}", list(&s.invariants)));
    }
    if !s.probes.is_empty() {
        line(format!("probes = {}", list(&s.probes)));
    }
    if s.swarm_rng {
        line("swarm-rng = true".into());
    }
    if s.forger {
        line("forger = true".into());
    }
    let t = &s.topology;
    if !s.is_proxy_only() {
        line("\n[topology]".into());
        line(format!("lock-servers = {}", t.lock_servers));
        line(format!("lock-backend = {}", q(if t.lock_backend == LockBackend::Etcd { "etcd" } else { "mem" })));
        line(format!("payment-resources = {}", t.payment_resources));
        line(format!("rail-proxies = {}", t.rail_proxies));
        line(format!("executors = {}", t.executors));
        line(format!("executor-concurrency = {}", t.executor_concurrency));
        if !t.executor_concurrencies.is_empty() {
            let v: Vec<String> = t.executor_concurrencies.iter().map(u32::to_string).collect();
            line(format!("executor-concurrencies = [{}]", v.join(", ")));
        }
        line(format!("reconciler = {}", t.reconciler));
        line(format!("lock-clients = {}", t.lock_clients));
        let w = &s.workload;
        line("\n[workload]".into());
        line(format!("accounts = {}", w.accounts));
        line(format!("hot-accounts = {}", w.hot_accounts));
        line(format!("payouts = {}", w.payouts));
        line(format!("arrival-ms = {}", w.arrival_ms));
        if let Some(h) = w.hot_share {
            line(format!("hot-share = {}", f(h)));
        }
        if s.operator != Operator::default() {
            line("\n[operator]".into());
            line(format!("revokes = {}", s.operator.revokes));
            line(format!("resolves = {}", s.operator.resolves));
        }
    }
    if s.rail != RailKnobs::default() {
        line("\n[rail]".into());
        line(format!("latency-ms = {}", s.rail.latency_ms));
        line(format!("failure-rate = {}", f(s.rail.failure_rate)));
        line(format!("duplicate-ack-rate = {}", f(s.rail.duplicate_ack_rate)));
        line(format!("decline-rate = {}", f(s.rail.decline_rate)));
    }
    if !s.settings.is_empty() {
        line("\n[settings]".into());
        for (k, v) in &s.settings {
            line(format!("{} = {v}", q(k)));
        }
    }
    for (n, table) in &s.node_settings {
        line(format!("\n[node-settings.{n}]"));
        for (k, v) in table {
            line(format!("{} = {v}", q(k)));
        }
    }
    if !s.skew_ms.is_empty() {
        line("\n[skew-ms]".into());
        for (n, ms) in &s.skew_ms {
            line(format!("{} = {ms}", q(n)));
        }
    }
    for step in &s.steps {
        line("\n[[step]]".into());
        let mut t = step.table();
        let action = t.remove("action").unwrap_or_else(|| toml::Value::String(step.verb()));
        line(format!("action = {action}"));
        for (k, v) in t {
            line(format!("{k} = {v}"));
        }
    }
    o
}
