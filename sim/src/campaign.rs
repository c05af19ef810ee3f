//! One swarm seed, start to end, and campaigns of many.
//!
//! [`run_seed`] draws the seed's [`SwarmConfig`], builds a madsim runtime for that seed, and
//! plays it:
//!
//! 1. **Fault phase** (`cfg.fault_ms` of simulated time): the world of the drawn topology
//!    (paydb and lockdb behind a [`StoreFaultPlan`], the unwrapped stores kept as the
//!    oracle's ground truth), the workload creating payouts over time, the operator revoking
//!    and resolving, the rail-stub's chaos and the executors' stalls, and a fault
//!    [`Schedule`] drawn from the seed's [`crate::schedule::FaultRates`] with the runtime's
//!    seeded generator ([`draw_schedule`]) over [`World::fault_targets`] (service nodes and
//!    executors; never the harness's nodes), played by the supervisor (this task, on no
//!    service node) concurrently with the workload. The schedule is cut at `cfg.fault_ms`.
//!    The oracle hears of every partition heal (`partition_healed`) and of every executor
//!    whose clock was slowed beyond the lock client's safety margin (`note_drifted_owner`).
//! 2. **Liveness phase**: [`World::heal_all`] (partitions, clogs, pauses, the store plan,
//!    clocks, an etcd leader loss; killed nodes start again), then
//!    [`World::heal_executors`]; chaos stops being injected, and within
//!    [`RunOptions::liveness_ms_max`] of simulated time every payout the workload created
//!    must reach POSTED, FAILED, ABANDONED or RAIL_AMBIGUOUS.
//! 3. **Checks**: unsettled payouts as liveness failures, then [`crate::oracle::check`]
//!    (the monitor's online findings, the rail's log against paydb, the ledger, the wire)
//!    and, once every payout settled, [`crate::oracle::liveness`]. A panic anywhere (a
//!    service, the world, the runtime's time limit) is a crash.
//!
//! **Defence in depth**: [`RunOptions::layer_off`] switches one stale-writer defence off
//! for the seed (`dlock_rt::defence::set_off` on the seed's thread, switched back on after
//! it, panic or not); the oracle is told when the layer is a fence it watches
//! ([`fence_of`]), and the seed's [`dlock_rt::defence::Tally`] (what each layer stopped, and
//! what the switched-off one let through) is in its outcome.
//!
//! **Negative controls**: [`RunOptions::planted`] plants one bug for the seed
//! (`dlock_rt::planted::set` on the seed's thread, cleared after it, panic or not); the
//! oracle is not told, so what the bug lets through is a finding.
//!
//! The seed's probe counts come from [`dlock_rt::probe`] (per thread: one runtime per
//! thread), its simulated time from the runtime's clock.
//!
//! **A scenario as a seed** ([`RunOptions::scenario`], `dlock-sim run --scenario NAME`):
//! the same three phases, oracle and outcome, with `scenarios/NAME.toml` in place of the
//! draw: its topology, settings, rail knobs and workload ([`Scenario::swarm_config`], no
//! drawn faults, stalls or operator), its steps as the fault phase's schedule (played to
//! the end of its cursor, triggers waited for), the scripted lock clients it names. The
//! seed still seeds the runtime (the rail's chaos, the workload's arrivals, every race).
//! The proxy-only scenarios (`nodes = ["rail-stub", "rail-proxy"]`) play on the proxy
//! world ([`crate::scenario_seed::run_proxy`] on `WorldSpec::proxy_only()`, built by
//! `world::build`), each broken invariant a correctness failure.
//! [`run_seed_with`] also returns what a scenario test asserts on ([`ScenarioFacts`]). The
//! scenario-only parts live in [`crate::scenario_seed`]. A scenario with `swarm-rng = true`
//! advances the runtime's generator where a swarm seed draws its schedule, so a seed shrunk
//! into a scenario ([`crate::shrink`]) keeps the races of the seed it came from;
//! [`run_scenario`] plays a parsed scenario that is not a file.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use dlock_contract::payout::PayoutState;
use dlock_payment_resource::store::PaymentStore;
use dlock_rt::defence::{self, Layer};
use dlock_rt::planted::{self, Bug};
use dlock_rt::Duration;
use uuid::Uuid;

use crate::oracle::Monitor;
use crate::outcome::{Failure, SeedOutcome};
use crate::scenario::Scenario;
pub use crate::scenario_seed::ScenarioFacts;
use crate::schedule::{Event, Fault, Schedule, Stage, Trigger};
use crate::store_faults::StoreFaultPlan;
use crate::swarm::{Backend, SwarmConfig};
use crate::world::{self, LockBackend, StoreWrap, Topology, World, WorldSpec};

/// Default bound of the liveness phase (simulated).
pub const LIVENESS_MS_MAX: u64 = 120_000;
/// How often the liveness phase looks at paydb.
pub const SETTLE_POLL_MS: u64 = 250;
/// Simulated time past the fault phase and the liveness bound after which the runtime
/// itself gives up (a crash: something never stopped).
pub const TIME_LIMIT_SLACK_MS: u64 = 60_000;

/// How a seed is run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// A scenario name (`scenarios/NAME.toml`) to play instead of the swarm draw (module
    /// doc); an unknown name is a crash of each seed (the runner refuses it first).
    pub scenario: Option<String>,
    /// Bound of the liveness phase (simulated ms).
    pub liveness_ms_max: u64,
    /// Print the drawn configuration to stderr before the seed runs.
    pub print_config: bool,
    /// Keep every payout's final state and the operator's actions in the trace.
    pub full_trace: bool,
    /// A defence layer to switch off for the seed (`--layer-off NAME`; `dlock_rt::defence`):
    /// the defence-in-depth campaigns. `None` (the default) runs every layer.
    pub layer_off: Option<Layer>,
    /// A bug to plant for the seed (`--plant NAME`; `dlock_rt::planted`): the negative
    /// controls. `None` (the default) plants nothing. Unlike `layer_off`, the oracle is not
    /// told: what the bug lets through is a finding.
    pub planted: Option<Bug>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            scenario: None,
            liveness_ms_max: LIVENESS_MS_MAX,
            print_config: false,
            full_trace: false,
            layer_off: None,
            planted: None,
        }
    }
}

/// The oracle's fence a switched-off layer bypasses, if it is one: its acceptances of lower
/// tokens are then the switch doing what it says, not a finding (`Monitor::expect_layer_off`).
pub fn fence_of(layer: Layer) -> Option<crate::oracle::Fence> {
    match layer {
        Layer::ClaimFence | Layer::PostFence => Some(crate::oracle::Fence::Account),
        Layer::RailMark => Some(crate::oracle::Fence::Rail),
        Layer::ExecutorLeaseCheck | Layer::DuplicateGuard | Layer::StateChecks => None,
    }
}

/// The world spec of a drawn configuration.
pub fn spec_of(cfg: &SwarmConfig) -> WorldSpec {
    WorldSpec {
        topology: Topology {
            lock_replicas: cfg.lock_replicas,
            payment_replicas: cfg.payment_replicas,
            proxy_replicas: cfg.proxy_replicas,
            executors: cfg.executors.clone(),
            reconciler: true,
        },
        backend: match cfg.backend {
            Backend::Mem => LockBackend::Mem,
            Backend::Etcd => LockBackend::Etcd,
        },
        settings: cfg.settings(),
        wrap: StoreWrap::planned(Arc::new(StoreFaultPlan::new())),
        ..WorldSpec::default()
    }
}

/// The seed's fault schedule over `targets` (node names) for `cfg.fault_ms`, drawn from
/// `rng` (the runtime's seeded generator in a campaign). The rail-stub is never crashed: it
/// stands for the bank, whose record of calls (the oracle's ground truth) outlives any
/// outage; it may still be paused, partitioned or clogged. The drawn drifted executor
/// (`cfg.drifted_executor`) opens the schedule: its clock is slowed at 0 ms (it draws
/// nothing from `rng`, so the rest of the schedule is unchanged by it). A sweep's
/// `cfg.clock_events` join it in time order.
pub fn draw_schedule(cfg: &SwarmConfig, targets: &[String], rng: &mut impl dlock_rt::rand::Rng) -> Schedule {
    let mut s = Schedule::draw(&cfg.faults, targets, cfg.fault_ms, rng);
    s.events.retain(
        |t| !matches!(t.event.fault(), Some(Fault::Crash { node, .. } | Fault::Start { node }) if node == "rail-stub"),
    );
    if let Some((node, rate)) = cfg.drifted_executor_node().filter(|(n, _)| targets.contains(n)) {
        s.events.insert(0, crate::schedule::Timed::fault(0, Fault::DriftClock { node, rate }));
    }
    // A sweep's clocks (`crate::envelope`): the timeline plays them in time order among the
    // drawn events.
    s.events.extend(cfg.clock_events.iter().filter(|t| t.event.nodes().iter().all(|n| targets.contains(n))).cloned());
    debug_assert!(s.closes_what_it_opens());
    s
}

/// A clock rate below this (`1 - safety margin`) lets a lock client believe its lease
/// past the server's expiry: the drift "beyond the margin" the oracle's probe names.
pub fn drift_beyond_margin(rate: f64) -> bool {
    rate < 1.0 - dlock_lock_client::config::SAFETY_MARGIN_DEFAULT
}

/// The world as the campaign's stage: the world's own [`Stage`], plus the oracle's hooks.
struct Played<'a> {
    world: &'a World,
    monitor: &'a Monitor,
    /// Fault events applied (not skipped), by kind.
    kinds: std::sync::Mutex<BTreeMap<&'static str, u64>>,
    /// The seed's incident trace, when kept.
    trace: Option<&'a crate::trace::Trace>,
}

impl Stage for Played<'_> {
    fn node(&self, name: &str) -> Option<madsim::task::NodeId> {
        self.world.node(name).and_then(|_| Stage::node(self.world, name))
    }
    fn faults(&self) -> &crate::faults::Faults {
        self.world.faults()
    }
    fn store_plan(&self) -> Option<&StoreFaultPlan> {
        Stage::store_plan(self.world)
    }
    fn etcd(&self) -> Option<madsim::task::NodeId> {
        self.world.etcd()
    }
    fn revoke<'a>(
        &'a self,
        key: Option<&'a str>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send + 'a>> {
        self.world.revoke(key)
    }
    fn wait_for(&self, trigger: Trigger) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        self.world.wait_for(trigger)
    }
    fn acquire<'a>(
        &'a self,
        client: &'a str,
        key: &'a str,
        wait_ms: u64,
        hold_ms: u64,
        session_ttl_ms: Option<u64>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send + 'a>> {
        self.world.acquire(client, key, wait_ms, hold_ms, session_ttl_ms)
    }
    fn applied(&self, event: &Event, line: &str) {
        if let Some(t) = self.trace {
            t.schedule_event(event, line);
        }
        if let (Some(kind), false) = (event.kind(), line.starts_with("SKIPPED")) {
            if let Ok(mut k) = self.kinds.lock() {
                *k.entry(kind).or_insert(0) += 1;
            }
        }
        if line.starts_with("SKIPPED") {
            return;
        }
        match event.fault() {
            Some(Fault::DriftClock { node, rate }) => {
                if node.starts_with("executor-") && drift_beyond_margin(*rate) {
                    self.monitor.note_drifted_owner(node);
                }
                if let Some(id) = self.world.node_id(node) {
                    self.monitor.note_rate(id, *rate);
                }
            }
            Some(Fault::Crash { node, .. }) => {
                if let Some(id) = self.world.node_id(node) {
                    self.monitor.node_crashed(id);
                }
            }
            _ => {}
        }
    }
}

/// Runs one seed in its own madsim runtime on the calling thread.
pub fn run_seed(seed: u64, opts: &RunOptions) -> SeedOutcome {
    run_seed_with(seed, opts).0
}

/// [`run_seed`], with a scenario seed's [`ScenarioFacts`] (`None` for a swarm seed or a
/// proxy-only scenario).
pub fn run_seed_with(seed: u64, opts: &RunOptions) -> (SeedOutcome, Option<ScenarioFacts>) {
    run_seed_inner(seed, opts, None)
}

thread_local! {
    /// What the oracle saw of the clocks in the last seed on this thread
    /// ([`SeedOutcome::clock`]).
    static LAST_TALLY: std::cell::Cell<crate::oracle::calls::ClockTally> = std::cell::Cell::default();
    /// The fault schedule the last swarm seed on this thread drew ([`run_seed_drawn`]).
    static LAST_DRAWN: std::cell::RefCell<Option<Schedule>> = const { std::cell::RefCell::new(None) };
}

/// [`run_seed`], with the fault schedule a swarm seed drew (before the cut at `fault_ms`;
/// `None` for a scenario seed): what [`crate::shrink`] turns into an editable plan.
pub fn run_seed_drawn(seed: u64, opts: &RunOptions) -> (SeedOutcome, Option<Schedule>) {
    LAST_DRAWN.with(|d| *d.borrow_mut() = None);
    let outcome = run_seed(seed, opts);
    (outcome, LAST_DRAWN.with(|d| d.borrow_mut().take()))
}

/// One seed of `scenario`, already parsed (a candidate of [`crate::shrink`]), as
/// [`RunOptions::scenario`] plays a named one (`opts.scenario` is not read).
pub fn run_scenario(seed: u64, scenario: &Scenario, opts: &RunOptions) -> SeedOutcome {
    let cfg = scenario.swarm_config(seed, crate::schedule::TRIGGER_WAIT_MS_MAX);
    run_prepared(cfg, scenario.describe(seed), Some(scenario.clone()), opts, None).0
}

/// [`run_seed`], keeping the seed's incident trace ([`crate::trace`]): its JSON lines, in
/// order (`dlock-sim replay --trace FILE`). A proxy-only scenario's trace holds its start,
/// its failures and its end only.
pub fn run_seed_traced(seed: u64, opts: &RunOptions) -> (SeedOutcome, Vec<String>) {
    let trace = crate::trace::Trace::new();
    let (outcome, _) = run_seed_inner(seed, opts, Some(&trace));
    (outcome, trace.lines())
}

fn run_seed_inner(
    seed: u64,
    opts: &RunOptions,
    trace: Option<&crate::trace::Trace>,
) -> (SeedOutcome, Option<ScenarioFacts>) {
    let scenario = match opts.scenario.as_deref().map(crate::scenario::load_named).transpose() {
        Ok(s) => s,
        Err(e) => {
            let failures = vec![Failure::crash(crate::oracle::ids::SCENARIO_LOADS, e.clone())];
            if let Some(t) = trace {
                t.failures(&failures);
            }
            let outcome = SeedOutcome {
                seed,
                config: format!("seed={seed} scenario={}", opts.scenario.as_deref().unwrap_or_default()),
                failures,
                trace: vec![e],
                ..SeedOutcome::default()
            };
            return (outcome, None);
        }
    };
    let trigger_wait = crate::schedule::TRIGGER_WAIT_MS_MAX;
    let cfg = scenario.as_ref().map_or_else(|| SwarmConfig::draw(seed), |s| s.swarm_config(seed, trigger_wait));
    let config = scenario.as_ref().map_or_else(|| cfg.to_string(), |s| s.describe(seed));
    run_prepared(cfg, config, scenario, opts, trace)
}

/// Runs `cfg` (a drawn configuration, possibly adjusted: the speed bench's fixed size) in
/// a madsim runtime seeded with `cfg.seed`, on the calling thread.
pub fn run_config(cfg: SwarmConfig, opts: &RunOptions) -> SeedOutcome {
    let config = cfg.to_string();
    run_prepared(cfg, config, None, opts, None).0
}

/// One seed of `cfg` (printed as `config`), or of `scenario` when given.
fn run_prepared(
    cfg: SwarmConfig,
    config: String,
    scenario: Option<Scenario>,
    opts: &RunOptions,
    trace: Option<&crate::trace::Trace>,
) -> (SeedOutcome, Option<ScenarioFacts>) {
    let seed = cfg.seed;
    if opts.print_config {
        eprintln!("{config}");
    }
    dlock_rt::probe::reset();
    LAST_TALLY.with(|t| t.set(Default::default()));
    // The layer switched off for this seed, on this thread only (the seed's runtime runs
    // here); switched back on below whatever the seed did.
    defence::reset();
    defence::set_off(opts.layer_off);
    planted::set(opts.planted);
    let limit_ms = cfg.fault_ms + opts.liveness_ms_max + TIME_LIMIT_SLACK_MS;
    // The services' event seam feeds the trace (its lease beliefs and reconciler findings;
    // on etcd, which has no lockdb observer, the lock server's sessions and grants too), on
    // this thread, where the seed's runtime runs; removed when this seed ends.
    let lock_from_seam = cfg.backend == Backend::Etcd;
    let _seam = trace.map(|t| dlock_rt::events::install(t.seam_sink(lock_from_seam)));
    let played = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let mut rt = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
        rt.set_time_limit(std::time::Duration::from_millis(limit_ms));
        let trace = trace.cloned();
        match scenario.clone() {
            Some(s) if s.is_proxy_only() => {
                let config = config.clone();
                rt.block_on(async move {
                    if let Some(t) = &trace {
                        t.begin(seed, &config);
                    }
                    crate::scenario_seed::play_proxy(s, config).await
                })
            }
            _ => rt.block_on(play(cfg.clone(), opts.clone(), scenario.clone(), config.clone(), trace)),
        }
    }));
    defence::set_off(None);
    planted::set(None);
    let probes = dlock_rt::probe::snapshot();
    let defence = defence::snapshot();
    if let (Some(t), Ok((failures, ..))) = (trace, &played) {
        t.failures(failures);
    }
    match played {
        Ok((failures, sim_ms, trace, faults, facts)) => {
            let clock = LAST_TALLY.with(|t| t.get());
            (SeedOutcome { seed, config, failures, probes, sim_ms, trace, faults, defence, clock }, facts)
        }
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "a panic without a message".to_owned());
            let line = msg.lines().next().unwrap_or_default().to_owned();
            if let Some(t) = trace {
                t.failures(&[Failure::crash(crate::oracle::ids::NO_PANIC, line.clone())]);
            }
            let outcome = SeedOutcome {
                seed,
                config,
                failures: vec![Failure::crash(crate::oracle::ids::NO_PANIC, line)],
                probes,
                sim_ms: 0,
                trace: vec![msg],
                faults: BTreeMap::new(),
                defence,
                clock: Default::default(),
            };
            (outcome, None)
        }
    }
}

fn settled(s: PayoutState) -> bool {
    s.is_terminal() || s == PayoutState::RailAmbiguous
}

async fn states(paydb: &dyn PaymentStore, ids: &[Uuid]) -> BTreeMap<Uuid, Option<PayoutState>> {
    let mut out = BTreeMap::new();
    for id in ids {
        out.insert(*id, paydb.payout(*id).await.ok().flatten().map(|p| p.state));
    }
    out
}

/// What [`play`] returns: failures, simulated ms, trace, fault events applied by kind, a
/// scenario's facts.
pub(crate) type Played5 = (Vec<Failure>, u64, Vec<String>, BTreeMap<&'static str, u64>, Option<ScenarioFacts>);

/// The seed inside its runtime.
async fn play(
    cfg: SwarmConfig,
    opts: RunOptions,
    scenario: Option<Scenario>,
    config: String,
    tr: Option<crate::trace::Trace>,
) -> Played5 {
    let t0 = madsim::time::Instant::now();
    if let Some(t) = &tr {
        t.begin(cfg.seed, &config);
    }
    let mut trace = vec![config];
    let spec = scenario.as_ref().map_or_else(|| spec_of(&cfg), |s| crate::scenario_seed::spec(s, &cfg));
    let mut w = match world::build(spec).await {
        Ok(w) => w,
        Err(e) => return (vec![Failure::crash(crate::oracle::ids::WORLD_BUILDS, e)], 0, trace, BTreeMap::new(), None),
    };
    // The oracle watches every acceptance and grant from the first write on.
    let monitor_started_ms = crate::faults::now_ms();
    if let Some(t) = &tr {
        t.name_nodes(&w);
    }
    let monitor = crate::oracle::Monitor::start_traced(&w, tr.clone());
    if let Some(bug) = opts.planted {
        trace.push(format!("planted: bug {bug}"));
        if let Some(t) = &tr {
            t.supervisor("note", crate::trace::fields([("line", format!("planted: bug {bug}").into())]));
        }
    }
    if let Some(layer) = opts.layer_off {
        trace.push(format!("defence: layer {layer} switched off"));
        if let Some(t) = &tr {
            t.supervisor(
                "note",
                crate::trace::fields([("line", format!("defence: layer {layer} switched off").into())]),
            );
        }
        if let Some(fence) = fence_of(layer) {
            monitor.expect_layer_off(fence);
        }
    }
    // Revokes of the schedule go out from the operator's node, as the operator's do.
    w.add_node("operator");
    if let Some(s) = &scenario {
        for i in 1..=s.topology.lock_clients {
            w.add_node(&format!("client-{i}"));
        }
    }
    if let Some(t) = &tr {
        t.name_nodes(&w);
    }
    let created = crate::workload::start_workload(&mut w, &cfg);
    let operator = crate::workload::start_operator(&mut w, &cfg);
    // The forger plays in swarm seeds and in the scenarios shrunk from them (a written
    // scenario's steps are its own): during the fault phase, and again at the end.
    let forger_on = scenario.as_ref().is_none_or(|s| s.forger);
    let forger_log = forger_on.then(|| crate::forger::start_forger(&mut w, cfg.fault_ms));
    // The stream watcher follows every service's event stream in the seeds that draw it.
    let watchers = (scenario.is_none() && cfg.watcher)
        .then(|| crate::watcher::start_watcher(&mut w, &crate::watcher::Stream::ALL));
    // The seed's schedule, from the runtime's seeded generator (replays draw it again), or
    // the scenario's steps.
    let schedule = match &scenario {
        Some(s) => {
            if s.swarm_rng {
                // The one draw a swarm seed's schedule takes here (a shrunk seed's races).
                let _ = dlock_rt::rand::random_u64();
            }
            s.schedule()
        }
        None => {
            let s = draw_schedule(&cfg, &w.fault_targets(), &mut dlock_rt::rand::seeded(dlock_rt::rand::random_u64()));
            LAST_DRAWN.with(|d| *d.borrow_mut() = Some(s.clone()));
            s
        }
    };
    let timeline = schedule.timeline();
    let fault_events = timeline.len();
    trace.push(format!("schedule: {fault_events} fault events {:?}", schedule.verbs()));
    trace.extend(timeline.iter().map(|t| format!("schedule: @{}ms {:?}", t.at_ms, t.event)));
    {
        // Every heal tells the oracle, which fires `partition_healed_mid_lease` when a grant
        // committed before the partition began (true time) still lives (on the simulation
        // lockdb's clock).
        let (m, locks) = (monitor.clone(), w.locks.clone());
        w.faults().on_heal(move |span| {
            let ago = crate::faults::now_ms().saturating_sub(span.started_ms);
            m.partition_healed(ago, locks.clock_now_ms());
        });
    }
    // Fault phase: the schedule plays on this task (the supervisor, on no service node)
    // while the workload and the operator run on theirs; it is cut at `fault_ms`.
    let fault_end = madsim::time::Instant::now() + std::time::Duration::from_millis(cfg.fault_ms);
    let stage =
        Played { world: &w, monitor: &monitor, kinds: std::sync::Mutex::new(BTreeMap::new()), trace: tr.as_ref() };
    if let Some(t) = &tr {
        t.phase("fault", &format!("{fault_events} fault events for {} ms", cfg.fault_ms));
    }
    let played = madsim::time::timeout(std::time::Duration::from_millis(cfg.fault_ms), schedule.play(&stage)).await;
    let cut = played.is_err();
    let step_failures = match (&scenario, played) {
        (Some(_), Ok(lines)) => crate::scenario_seed::step_failures(lines, &mut trace),
        _ => Vec::new(),
    };
    match &scenario {
        // A scenario's fault phase ends with its steps' cursor (the trailing sleep).
        Some(s) if !cut => madsim::time::sleep(std::time::Duration::from_millis(s.tail_ms())).await,
        _ => madsim::time::sleep_until(fault_end).await,
    }
    // Liveness phase: nothing injects chaos any more: every fault healed, clocks reset,
    // killed nodes started again, the executors restarted without their stalls; the
    // workload finishes its creations and every payout must settle within the bound.
    let healed = w.heal_all();
    w.heal_executors();
    trace.push(format!("schedule: {} at the fault phase's end; heal_all", if cut { "cut" } else { "done" }));
    if let Some(t) = &tr {
        t.phase("liveness", if cut { "schedule cut at the fault phase's end" } else { "schedule done" });
        for h in &healed {
            t.supervisor("heal", crate::trace::fields([("line", h.as_str().into())]));
        }
    }
    trace.extend(healed);
    let liveness_ms = opts.liveness_ms_max;
    let deadline = Duration::from_millis(liveness_ms);
    let paydb = w.paydb.clone();
    let settled_in = dlock_rt::wait_until(Duration::from_millis(SETTLE_POLL_MS), deadline, || {
        let (created, paydb) = (created.clone(), paydb.clone());
        async move {
            if !created.done() {
                return None;
            }
            let s = states(&*paydb, &created.ids()).await;
            s.values().all(|s| s.is_some_and(settled)).then_some(())
        }
    })
    .await;
    let ids = created.ids();
    if let Some(t) = &tr {
        t.phase("checks", if settled_in.is_some() { "every payout settled" } else { "liveness bound reached" });
    }
    let final_states = states(&*w.paydb, &ids).await;
    // The forger's end, after everything settled.
    let forger = match forger_log {
        Some(log) => Some(crate::forger::run_forger(&w, log).await),
        None => None,
    };
    let mut failures = step_failures;
    if !created.done() {
        failures.push(Failure::liveness(
            crate::oracle::ids::WORKLOAD_FINISHES,
            format!("{} of {} payouts created", ids.len(), cfg.payouts),
        ));
    }
    if settled_in.is_none() {
        let open: Vec<String> = final_states
            .iter()
            .filter(|(_, s)| !s.is_some_and(settled))
            .map(|(id, s)| format!("{id}={}", s.map(|s| s.as_str()).unwrap_or("missing")))
            .collect();
        if !open.is_empty() {
            failures.push(Failure::liveness(
                crate::oracle::ids::EVERY_PAYOUT_SETTLES,
                format!("{} unsettled after {} ms: {}", open.len(), liveness_ms, open.join(" ")),
            ));
        }
    }
    let log = w.rail_call_log().await;
    let calls: Vec<String> = log.calls.iter().map(|c| c.client_ref.clone()).collect();
    // Safety, from ground truth: the monitor's online findings and the end-of-run checks.
    failures.extend(crate::oracle::check(&w, &monitor).await);
    LAST_TALLY.with(|t| t.set(monitor.with(|c| c.clock_tally()).unwrap_or_default()));
    if let Some(f) = &forger {
        failures.extend(f.failures());
    }
    // paydb's outbox against its tables, every seed; the watcher's streams, where it played.
    failures.extend(crate::watcher::outbox_failures(&w.paydb));
    if let Some(watchers) = &watchers {
        failures.extend(crate::watcher::judge(watchers, &w).await);
    }
    if settled_in.is_some() {
        // Liveness beyond settling (no unresolved intent, the reconciler agrees); an
        // unsettled run already failed above, and would only repeat it here.
        failures.extend(crate::oracle::liveness(&w).await);
    }
    let mut by_state: BTreeMap<&str, usize> = BTreeMap::new();
    for s in final_states.values() {
        *by_state.entry(s.map(|s| s.as_str()).unwrap_or("missing")).or_insert(0) += 1;
    }
    trace.push(format!(
        "payouts created {} of {}; by state {by_state:?}; rail calls {}; fault events {fault_events}",
        ids.len(),
        cfg.payouts,
        calls.len()
    ));
    if let Some(t) = &tr {
        t.merge_fault_records(&w);
        t.end_of_run(&log, &crate::oracle::PaydbRows::read(&w.paydb).submissions);
        t.phase("end", "");
    }
    trace.extend(w.faults().trace());
    if let Some(plan) = w.store_plan() {
        trace.extend(plan.trace());
    }
    if opts.full_trace {
        trace.extend(operator.lines());
        if let Some(f) = &forger {
            trace.extend(f.lines());
        }
        trace.extend(final_states.iter().map(|(id, s)| format!("payout {id} {s:?}")));
        trace.extend(log.calls.iter().map(|c| format!("rail: {} {:?} paid={}", c.client_ref, c.outcome, c.paid)));
    }
    let facts = match &scenario {
        Some(_) => {
            Some(crate::scenario_seed::facts(&w, &monitor, monitor_started_ms, &calls, &final_states, &mut trace).await)
        }
        None => None,
    };
    let sim_ms = t0.elapsed().as_millis() as u64;
    let faults = stage.kinds.into_inner().unwrap_or_else(|e| e.into_inner());
    w.shutdown();
    (failures, sim_ms, trace, faults, facts)
}

/// Calls `each(seed)` for every seed on `jobs` worker threads (one seed at a time per
/// thread, seeds handed out in order; one madsim runtime per thread, as madsim's own test
/// macro runs them).
pub fn for_each_seed(seeds: &[u64], jobs: usize, each: &(dyn Fn(u64) + Sync)) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let jobs = jobs.clamp(1, seeds.len().max(1));
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                while let Some(seed) = seeds.get(next.fetch_add(1, Ordering::Relaxed)) {
                    each(*seed);
                }
            });
        }
    });
}

/// Runs `seeds` on `jobs` worker threads ([`for_each_seed`]), calling
/// `progress(done, total, &outcome)` after each seed (from the worker's thread); returns
/// the summary, wall time included.
pub fn run_campaign(
    seeds: &[u64],
    jobs: usize,
    opts: &RunOptions,
    progress: &(dyn Fn(usize, usize, &SeedOutcome) + Sync),
) -> crate::summary::Summary {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let jobs = jobs.clamp(1, seeds.len().max(1));
    let summary = Mutex::new(crate::summary::Summary::new(jobs));
    let done = AtomicUsize::new(0);
    let started = std::time::Instant::now();
    for_each_seed(seeds, jobs, &|seed| {
        let outcome = run_seed(seed, opts);
        if let Ok(mut sum) = summary.lock() {
            sum.add(&outcome);
        }
        progress(done.fetch_add(1, Ordering::Relaxed) + 1, seeds.len(), &outcome);
    });
    let mut summary = summary.into_inner().unwrap_or_else(|e| e.into_inner());
    summary.layer_off = opts.layer_off;
    summary.planted = opts.planted;
    summary.wall_s = started.elapsed().as_secs_f64();
    summary
}
