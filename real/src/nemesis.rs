//! The seeded nemesis of a real run: a schedule drawn from the seed in the simulation's one
//! fault vocabulary ([`dlock_sim::fault::Fault`], drawn by the same [`FaultRates::draw`]),
//! over the real cluster's processes (docs/real-runs.md "The nemesis").
//!
//! - [`Plan::draw`] is a pure function of the seed, the duration and the kinds: the same
//!   arguments draw the same plan, printed before the run starts. A seed replays the same
//!   schedule, not the same interleaving: the processes run on real threads, sockets and
//!   disks.
//! - Each kind draws over the processes its mechanism can reach ([`nodes_of`]): a pause or a
//!   crash over every process (the rail-stub is never crashed: its record of calls lives in
//!   its memory, and the judge reads it), a wall-clock step over the dlock processes (the
//!   ones run with libfaketime), a network fault over the executor in its own network
//!   namespace and the services it calls ([`normalize`] makes every drawn network fault
//!   touch that executor, the only link a real run can cut).
//! - [`REAL_KINDS`] and [`SIM_ONLY`] together are exactly the simulation's kinds
//!   (`crate`'s tests hold them to [`KINDS`]): a new simulated kind must be given a real
//!   mechanism or a reason.
//!
//! Invariants (asserted): every fault of a plan validates ([`Fault::validate`]) and names
//! only processes of the real cluster; offsets are within the duration and sorted.

use dlock_rt::rand::Rng;
use dlock_sim::fault::{Fault, FaultRates, KINDS};

/// Every process of the real cluster (deploy/local/up.sh), in start order.
pub const PROCESSES: [&str; 14] = [
    "postgres",
    "etcd-1",
    "etcd-2",
    "etcd-3",
    "lock-server-1",
    "lock-server-2",
    "lock-server-pg",
    "rail-stub",
    "payment-resource",
    "rail-proxy-1",
    "rail-proxy-2",
    "executor-1",
    "executor-2",
    "executor-3",
];

/// The dlock processes (every process after PostgreSQL and the etcd members): each writes a
/// trace file and runs with libfaketime.
pub const DLOCK_PROCESSES: &[&str] = PROCESSES.split_at(4).1;

/// The executor that runs in its own network namespace (`up.sh --netns`).
pub const NETNS_NODE: &str = "executor-3";

/// The services [`NETNS_NODE`] calls (up.sh: lock-server-1, the payment-resource,
/// rail-proxy-2): the far ends of the links a real run can cut.
pub const NETNS_PEERS: [&str; 3] = ["lock-server-1", "payment-resource", "rail-proxy-2"];

/// The simulation's kinds a real run plays.
pub const REAL_KINDS: [&str; 10] = [
    "pause",
    "crash",
    "partition",
    "one-way",
    "clog",
    "lossy-link",
    "skew",
    "store-unavailable",
    "leader-loss",
    "revoke",
];

/// The simulation's kinds a real run does not play, each with the reason
/// (docs/real-runs.md "Simulation and real run, fault by fault").
pub const SIM_ONLY: [(&str, &str); 3] = [
    (
        "drift",
        "libfaketime's rate also fakes the process's monotonic clock, the one clock the merged history is stamped with",
    ),
    (
        "lost-ack",
        "a real database cannot lose the acknowledgement of one named operation; a one-way partition loses replies instead",
    ),
    ("store-latency", "not yet: needs a delay on the database's port (tc netem on loopback)"),
];

/// A real run's fault rates: each kind at half its simulated maximum, lasting 0.5–6 s, wall
/// steps within ±1 h.
pub fn real_rates(kinds: &[&str]) -> FaultRates {
    let mut rates = FaultRates::none();
    for row in KINDS.iter().filter(|r| kinds.contains(&r.name)) {
        rates.set(row.name, row.rate_max_per_min / 2.0);
    }
    rates.fault_ms_min = 500;
    rates.fault_ms_max = 6_000;
    rates.skew_ms_max = 3_600_000;
    rates
}

/// The processes kind `kind` draws over (module doc).
pub fn nodes_of(kind: &str) -> Vec<String> {
    let list: Vec<&str> = match kind {
        "pause" => PROCESSES.to_vec(),
        "crash" => PROCESSES.iter().copied().filter(|p| *p != "rail-stub").collect(),
        "skew" => DLOCK_PROCESSES.to_vec(),
        "partition" | "one-way" | "clog" | "lossy-link" => {
            std::iter::once(NETNS_NODE).chain(NETNS_PEERS.iter().copied()).collect()
        }
        _ => PROCESSES.to_vec(),
    };
    list.into_iter().map(str::to_owned).collect()
}

/// A drawn network fault made to touch [`NETNS_NODE`] (module doc); other faults unchanged.
pub fn normalize(f: Fault) -> Fault {
    let ns = NETNS_NODE.to_owned();
    let peers = |v: Vec<String>| -> Vec<String> { v.into_iter().filter(|n| *n != ns).collect() };
    match f {
        Fault::Partition { name, a, b, one_way, for_ms } => {
            let (a, b) = if b.contains(&ns) && !a.contains(&ns) {
                // The cut runs from `a` to the namespaced executor.
                (peers(a), vec![ns.clone()])
            } else {
                let mut far = peers(b);
                if far.is_empty() {
                    far = peers(a.clone());
                }
                (vec![ns.clone()], far)
            };
            let b = if b.is_empty() { vec![NETNS_PEERS[0].to_owned()] } else { b };
            let a = if a.is_empty() { vec![NETNS_PEERS[0].to_owned()] } else { a };
            Fault::Partition { name, a, b, one_way, for_ms }
        }
        Fault::Clog { from, to, both_ways, loss, for_ms } => {
            let (from, to) = if from == ns || to == ns { (from, to) } else { (ns, to) };
            Fault::Clog { from, to, both_ways, loss, for_ms }
        }
        other => other,
    }
}

/// The hostile rail's knobs, drawn from the seed (the rail-stub's settings for the run).
#[derive(Debug, Clone, PartialEq)]
pub struct RailKnobs {
    /// `rail.stub.failure-rate`: half answered 5xx, half held then dropped (ambiguous).
    pub failure_rate: f64,
    /// `rail.stub.decline-rate`.
    pub decline_rate: f64,
    /// `rail.stub.duplicate-ack-rate`: a repeated `clientRef` paid again.
    pub duplicate_ack_rate: f64,
    /// `rail.stub.latency-ms`.
    pub latency_ms: u64,
}

impl RailKnobs {
    /// The settings as the environment variables the rail-stub reads.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("DLOCK_RAIL_STUB_FAILURE_RATE", format!("{}", self.failure_rate)),
            ("DLOCK_RAIL_STUB_DECLINE_RATE", format!("{}", self.decline_rate)),
            ("DLOCK_RAIL_STUB_DUPLICATE_ACK_RATE", format!("{}", self.duplicate_ack_rate)),
            ("DLOCK_RAIL_STUB_LATENCY_MS", self.latency_ms.to_string()),
        ]
    }
}

/// A real run's schedule (module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub seed: u64,
    pub duration_ms: u64,
    /// The kinds drawn, in [`KINDS`] order.
    pub kinds: Vec<&'static str>,
    pub rail: RailKnobs,
    /// `(offset_ms, fault)`, each fault with its `for-ms`, sorted by offset (ties in draw
    /// order).
    pub faults: Vec<(u64, Fault)>,
}

/// The kinds named by `list` (comma-separated, `all` for [`REAL_KINDS`]), or why not.
pub fn parse_kinds(list: &str) -> Result<Vec<&'static str>, String> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if name == "all" {
            out.extend(REAL_KINDS);
            continue;
        }
        if let Some((_, why)) = SIM_ONLY.iter().find(|(k, _)| *k == name) {
            return Err(format!("nemesis {name:?} is simulation-only: {why}"));
        }
        match REAL_KINDS.iter().find(|k| **k == name) {
            Some(k) => out.push(*k),
            None => return Err(format!("unknown nemesis {name:?} (known: {}, or all)", REAL_KINDS.join(", "))),
        }
    }
    // KINDS order, each once.
    Ok(KINDS.iter().map(|r| r.name).filter(|n| out.contains(n)).collect())
}

impl Plan {
    /// Draws the plan (module doc).
    pub fn draw(seed: u64, duration_ms: u64, kinds: &[&'static str]) -> Plan {
        let mut rng = dlock_rt::rand::seeded(seed);
        let rail = RailKnobs {
            failure_rate: (rng.gen_range(0..=40) as f64) / 1000.0,
            decline_rate: (rng.gen_range(0..=30) as f64) / 1000.0,
            duplicate_ack_rate: if rng.gen_bool(0.5) { 1.0 } else { 0.0 },
            latency_ms: rng.gen_range(0..=20),
        };
        let mut faults = Vec::new();
        for row in KINDS.iter().filter(|r| kinds.contains(&r.name)) {
            let rates = real_rates(&[row.name]);
            for (at, f) in rates.draw(&nodes_of(row.name), duration_ms, &mut rng) {
                faults.push((at, normalize(f)));
            }
        }
        faults.sort_by_key(|(at, _)| *at);
        // One name per partition across the kinds (each kind's draw counts from 1), and a
        // loss in whole percent.
        let mut partitions = 0;
        for (_, f) in &mut faults {
            match f {
                Fault::Partition { name, .. } => {
                    partitions += 1;
                    *name = Some(format!("drawn-{partitions}"));
                }
                Fault::Clog { loss: Some(l), .. } => *l = (*l * 100.0).round().clamp(1.0, 100.0) / 100.0,
                _ => {}
            }
        }
        let plan = Plan { seed, duration_ms, kinds: kinds.to_vec(), rail, faults };
        plan.check();
        plan
    }

    fn check(&self) {
        for (at, f) in &self.faults {
            assert!(*at < self.duration_ms.max(1), "fault at {at} ms past the duration");
            assert!(f.validate().is_ok(), "drawn fault invalid: {f:?}");
            for n in f.nodes() {
                assert!(PROCESSES.contains(&n.as_str()), "fault names {n}, not a process of the real cluster");
            }
        }
        assert!(self.faults.windows(2).all(|w| w[0].0 <= w[1].0), "plan not sorted");
    }

    /// The primitive timeline to play: each fault expanded into itself and its undo
    /// ([`Fault::expand`]), sorted by offset (ties in plan order).
    pub fn timeline(&self) -> Vec<(u64, Fault)> {
        let mut anon = 0;
        let mut out: Vec<(u64, Fault)> = Vec::new();
        for (at, f) in &self.faults {
            for (dt, g) in f.expand(&mut anon) {
                out.push((at + dt, g));
            }
        }
        out.sort_by_key(|(at, _)| *at);
        out
    }

    /// The plan as printed before the run: one header line, the rail's knobs, one line per
    /// fault (`+12.345s pause node=executor-1 for-ms=2000`).
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![
            format!(
                "real run: seed {} duration {} s nemesis {}",
                self.seed,
                self.duration_ms / 1000,
                if self.kinds.is_empty() { "none".to_owned() } else { self.kinds.join(",") }
            ),
            format!(
                "rail: failure-rate {} decline-rate {} duplicate-ack-rate {} latency-ms {}",
                self.rail.failure_rate, self.rail.decline_rate, self.rail.duplicate_ack_rate, self.rail.latency_ms
            ),
        ];
        for (at, f) in &self.faults {
            out.push(format!("  +{:>7.3}s {}", *at as f64 / 1000.0, describe(f)));
        }
        out
    }
}

/// One fault in one line, as its scenario table reads (`pause node=executor-1 for-ms=2000`).
pub fn describe(f: &Fault) -> String {
    let t = f.table();
    let mut parts = vec![f.verb()];
    for (k, v) in &t {
        if k == "action" {
            continue;
        }
        let v = match v {
            toml::Value::String(s) => s.clone(),
            toml::Value::Array(a) => {
                format!("[{}]", a.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(","))
            }
            other => other.to_string(),
        };
        parts.push(format!("{k}={v}"));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_real_and_the_simulation_only_kinds_are_exactly_the_simulations_kinds() {
        let mut ours: Vec<&str> = REAL_KINDS.iter().copied().chain(SIM_ONLY.iter().map(|(k, _)| *k)).collect();
        ours.sort_unstable();
        let mut sims: Vec<&str> = KINDS.iter().map(|r| r.name).collect();
        sims.sort_unstable();
        assert_eq!(ours, sims, "classify every simulated kind as real or simulation-only, with a reason");
    }

    #[test]
    fn a_seed_draws_the_same_plan_every_time_and_another_seed_another() {
        let kinds = parse_kinds("all").unwrap_or_default();
        let a = Plan::draw(7, 600_000, &kinds);
        assert_eq!(a, Plan::draw(7, 600_000, &kinds));
        assert_eq!(a.lines(), Plan::draw(7, 600_000, &kinds).lines());
        assert_ne!(a.faults, Plan::draw(8, 600_000, &kinds).faults);
        // Ten minutes draw every real kind.
        for k in REAL_KINDS {
            assert!(a.faults.iter().any(|(_, f)| f.kind() == Some(k)), "no {k} in {:#?}", a.lines());
        }
    }

    #[test]
    fn every_network_fault_touches_the_namespaced_executor() {
        for seed in 0..50 {
            let plan = Plan::draw(seed, 120_000, &["partition", "one-way", "clog", "lossy-link"]);
            for (_, f) in &plan.faults {
                assert!(f.nodes().iter().any(|n| n == NETNS_NODE), "{f:?}");
                for n in f.nodes() {
                    assert!(n == NETNS_NODE || NETNS_PEERS.contains(&n.as_str()), "{f:?}");
                }
            }
        }
    }

    #[test]
    fn the_nemesis_list_refuses_unknown_and_simulation_only_kinds() {
        assert_eq!(parse_kinds("crash,pause").ok(), Some(vec!["pause", "crash"]));
        assert!(parse_kinds("crash,teleport").is_err());
        let e = parse_kinds("drift").err().unwrap_or_default();
        assert!(e.contains("simulation-only"), "{e}");
        assert_eq!(parse_kinds("").ok(), Some(vec![]));
    }

    #[test]
    fn the_timeline_closes_every_timed_fault_with_its_undo() {
        let plan = Plan::draw(3, 300_000, &["pause", "crash", "partition"]);
        let t = plan.timeline();
        let opens = t.iter().filter(|(_, f)| matches!(f, Fault::Pause { .. } | Fault::Crash { .. })).count();
        let closes = t.iter().filter(|(_, f)| matches!(f, Fault::Resume { .. } | Fault::Start { .. })).count();
        assert_eq!(opens, closes);
        assert!(t.windows(2).all(|w| w[0].0 <= w[1].0));
        assert!(plan.faults.iter().all(|(_, f)| !matches!(f, Fault::Crash { node, .. } if node == "rail-stub")));
    }
}
