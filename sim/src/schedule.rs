//! A [`Schedule`]: ordered, timed fault events over node names. A scenario file produces one
//! ([`crate::scenario::Scenario::schedule`]), and so does the swarm, from a seed's drawn
//! [`FaultRates`] ([`Schedule::draw`]). Under madsim, [`Schedule::play`] applies each event
//! at its simulated time through the mechanisms of [`crate::faults`] and
//! [`crate::store_faults`], on a [`Stage`] (the world) that maps names to nodes.
//!
//! Invariants:
//! - Events are in time order; events at the same time keep the order they were given in.
//! - Every fault a schedule opens with a duration is closed by an event of the schedule
//!   (a pause by a resume, a crash by a start, a partition by its heal, a clog by an
//!   unclog), so a drawn schedule never leaves the world broken past `duration_ms` plus the
//!   longest fault; [`Schedule::draw`] checks this before returning.
//! - Drawing uses only the generator it is given: the same seed draws the same schedule.

use std::collections::BTreeMap;

use dlock_rt::rand::Rng;

/// A stored fault class for a `store-fault` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StoreFaultKind {
    /// Calls are refused, nothing happens (a window with `for-ms`, else `count` calls).
    Unavailable,
    /// `count` calls of `op` commit and lose their acknowledgement.
    CommitUnknown,
    /// Calls take `latency-ms` longer for `for-ms`.
    Latency,
    /// The lock server loses its store's leader for `for-ms` (lockdb only): on the
    /// simulation store, lockdb is unavailable (NOT_LEADER); on the simulated etcd, the etcd
    /// node is unreachable and frozen.
    LeaderLoss,
}

/// A moment the world can wait for before an event (`when = "..."` in a scenario).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Trigger {
    /// Some executor holds a lease.
    LeaseGranted,
    /// A call is in flight at the rail (the stub has received it and not yet answered).
    RailCall,
    /// An intent row has been written (a submission admitted).
    IntentWritten,
    /// A lock request is queued behind a holder.
    WaiterQueued,
}

impl Trigger {
    pub const ALL: [Trigger; 4] =
        [Trigger::LeaseGranted, Trigger::RailCall, Trigger::IntentWritten, Trigger::WaiterQueued];
}

/// Every fault kind the swarm draws a rate for ([`FaultRates`]), by the name campaign
/// summaries print ([`Event::kind`]).
pub const FAULT_KINDS: [&str; 13] = [
    "pause",
    "crash",
    "partition",
    "one-way",
    "clog",
    "lossy-link",
    "drift",
    "skew",
    "store-unavailable",
    "lost-ack",
    "store-latency",
    "leader-loss",
    "revoke",
];

/// One fault event, over node names.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Pause {
        node: String,
    },
    Resume {
        node: String,
    },
    /// Kill (no drain).
    Crash {
        node: String,
    },
    /// Restart through the node's init.
    Start {
        node: String,
    },
    /// Cut `a` from `b` (both ways unless `one_way`: only `a -> b`). `name` lets a heal
    /// target it.
    Partition {
        name: Option<String>,
        a: Vec<String>,
        b: Vec<String>,
        one_way: bool,
    },
    /// Heal one named partition, or everything (partitions, clogs, pauses) when `None`.
    Heal {
        name: Option<String>,
    },
    /// Clog `from -> to` (lossy at `loss` for `for_ms` when `loss` is given).
    Clog {
        from: String,
        to: String,
        loss: Option<f64>,
        for_ms: Option<u64>,
    },
    Unclog {
        from: String,
        to: String,
    },
    /// Step the node's wall clock.
    SkewClock {
        node: String,
        ms: i64,
    },
    /// Set the node's monotonic clock rate.
    DriftClock {
        node: String,
        rate: f64,
    },
    StoreFault {
        store: String,
        op: Option<String>,
        fault: StoreFaultKind,
        count: u32,
        for_ms: Option<u64>,
        latency_ms: Option<u64>,
    },
    /// An operator revokes `key` (or a key currently held, chosen by the world).
    Revoke {
        key: Option<String>,
    },
    /// The scripted lock client `client` acquires `key` (waiting up to `wait_ms` in the
    /// server's queue) and holds the grant for `hold_ms` (a scenario's `acquire`; never drawn).
    Acquire {
        client: String,
        key: String,
        wait_ms: u64,
        hold_ms: u64,
        session_ttl_ms: Option<u64>,
    },
}

impl Event {
    /// The verb, as in scenario files.
    pub fn verb(&self) -> &'static str {
        match self {
            Event::Pause { .. } => "pause",
            Event::Resume { .. } => "resume",
            Event::Crash { .. } => "crash",
            Event::Start { .. } => "start",
            Event::Partition { .. } => "partition",
            Event::Heal { .. } => "heal",
            Event::Clog { .. } => "clog",
            Event::Unclog { .. } => "unclog",
            Event::SkewClock { .. } => "skew-clock",
            Event::DriftClock { .. } => "drift-clock",
            Event::StoreFault { .. } => "store-fault",
            Event::Revoke { .. } => "revoke",
            Event::Acquire { .. } => "acquire",
        }
    }

    /// The fault kind (one of [`FAULT_KINDS`], the kinds the swarm draws a rate for) this
    /// event injects; `None` for the events that undo one (resume, start, heal, unclog).
    pub fn kind(&self) -> Option<&'static str> {
        Some(match self {
            Event::Pause { .. } => "pause",
            Event::Crash { .. } => "crash",
            Event::Partition { one_way: false, .. } => "partition",
            Event::Partition { one_way: true, .. } => "one-way",
            Event::Clog { loss: None, .. } => "clog",
            Event::Clog { loss: Some(_), .. } => "lossy-link",
            Event::DriftClock { .. } => "drift",
            Event::SkewClock { .. } => "skew",
            Event::StoreFault { fault: StoreFaultKind::Unavailable, .. } => "store-unavailable",
            Event::StoreFault { fault: StoreFaultKind::CommitUnknown, .. } => "lost-ack",
            Event::StoreFault { fault: StoreFaultKind::Latency, .. } => "store-latency",
            Event::StoreFault { fault: StoreFaultKind::LeaderLoss, .. } => "leader-loss",
            Event::Revoke { .. } => "revoke",
            // Undoes, and a scenario's scripted lock client (not a fault).
            Event::Resume { .. }
            | Event::Start { .. }
            | Event::Heal { .. }
            | Event::Unclog { .. }
            | Event::Acquire { .. } => return None,
        })
    }

    /// Node names the event acts on.
    pub fn nodes(&self) -> Vec<&str> {
        match self {
            Event::Pause { node }
            | Event::Resume { node }
            | Event::Crash { node }
            | Event::Start { node }
            | Event::SkewClock { node, .. }
            | Event::DriftClock { node, .. } => vec![node.as_str()],
            Event::Acquire { client, .. } => vec![client.as_str()],
            Event::Partition { a, b, .. } => a.iter().chain(b.iter()).map(String::as_str).collect(),
            Event::Clog { from, to, .. } | Event::Unclog { from, to } => vec![from.as_str(), to.as_str()],
            Event::Heal { .. } | Event::StoreFault { .. } | Event::Revoke { .. } => vec![],
        }
    }
}

/// An event at a time.
#[derive(Debug, Clone, PartialEq)]
pub struct Timed {
    /// Simulated ms after the schedule starts playing.
    pub at_ms: u64,
    /// Wait for this moment first (later events shift by the wait).
    pub when: Option<Trigger>,
    pub event: Event,
}

/// Ordered, timed fault events (module doc).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Schedule {
    pub events: Vec<Timed>,
}

/// Each fault's rate, as the swarm draws it per seed ([`crate::swarm::SwarmConfig::draw`];
/// the one fault-rate type of the crate): events per simulated minute (0: never), and the
/// ranges their parameters are drawn from.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRates {
    pub pause_per_min: f64,
    pub crash_per_min: f64,
    pub partition_per_min: f64,
    pub one_way_per_min: f64,
    pub clog_per_min: f64,
    pub lossy_link_per_min: f64,
    pub drift_per_min: f64,
    pub skew_per_min: f64,
    pub store_unavailable_per_min: f64,
    pub lost_ack_per_min: f64,
    pub store_latency_per_min: f64,
    pub leader_loss_per_min: f64,
    pub revoke_per_min: f64,
    /// How long a pause, crash, partition, clog, unavailability or leader loss lasts.
    pub fault_ms_min: u64,
    pub fault_ms_max: u64,
    /// Clock rates drawn within.
    pub drift_rate_min: f64,
    pub drift_rate_max: f64,
    /// Wall steps drawn within ±this.
    pub skew_ms_max: i64,
    pub store_latency_ms_max: u64,
}

impl FaultRates {
    /// Whether every rate is zero (a schedule drawn from it is empty).
    pub fn is_zero(&self) -> bool {
        [
            self.pause_per_min,
            self.crash_per_min,
            self.partition_per_min,
            self.one_way_per_min,
            self.clog_per_min,
            self.lossy_link_per_min,
            self.drift_per_min,
            self.skew_per_min,
            self.store_unavailable_per_min,
            self.lost_ack_per_min,
            self.store_latency_per_min,
            self.leader_loss_per_min,
            self.revoke_per_min,
        ]
        .iter()
        .all(|r| *r == 0.0)
    }

    /// No faults at all.
    pub fn none() -> FaultRates {
        FaultRates {
            pause_per_min: 0.0,
            crash_per_min: 0.0,
            partition_per_min: 0.0,
            one_way_per_min: 0.0,
            clog_per_min: 0.0,
            lossy_link_per_min: 0.0,
            drift_per_min: 0.0,
            skew_per_min: 0.0,
            store_unavailable_per_min: 0.0,
            lost_ack_per_min: 0.0,
            store_latency_per_min: 0.0,
            leader_loss_per_min: 0.0,
            revoke_per_min: 0.0,
            fault_ms_min: 100,
            fault_ms_max: 10_000,
            drift_rate_min: 0.5,
            drift_rate_max: 1.5,
            skew_ms_max: 3_600_000,
            store_latency_ms_max: 2_000,
        }
    }

    /// Every rate drawn from `rng`, each zero with probability `p_off` (so configurations
    /// that always succeed do not dominate, and neither do ones where everything fails).
    pub fn draw(rng: &mut impl Rng, p_off: f64) -> FaultRates {
        let mut r = FaultRates::none();
        let mut rate = |max: f64| if rng.gen_bool(p_off.clamp(0.0, 1.0)) { 0.0 } else { rng.gen_range(0.0..max) };
        r.pause_per_min = rate(6.0);
        r.crash_per_min = rate(3.0);
        r.partition_per_min = rate(3.0);
        r.one_way_per_min = rate(2.0);
        r.clog_per_min = rate(3.0);
        r.lossy_link_per_min = rate(2.0);
        r.drift_per_min = rate(2.0);
        r.skew_per_min = rate(2.0);
        r.store_unavailable_per_min = rate(3.0);
        r.lost_ack_per_min = rate(4.0);
        r.store_latency_per_min = rate(3.0);
        r.leader_loss_per_min = rate(1.0);
        r.revoke_per_min = rate(2.0);
        r
    }
}

/// Operations whose lost ack the swarm draws (the three that have a probe, and lockdb's
/// grant and renewal).
pub const LOST_ACK_OPS: &[(&str, &str)] =
    &[("paydb", "admit"), ("paydb", "claim"), ("paydb", "post"), ("lockdb", "acquire"), ("lockdb", "renew")];

fn pick(rng: &mut impl Rng, nodes: &[String]) -> String {
    nodes[rng.gen_range(0..nodes.len())].clone()
}

/// A pair of distinct nodes, when there are two.
fn pair(rng: &mut impl Rng, nodes: &[String]) -> (String, String) {
    let a = rng.gen_range(0..nodes.len());
    let mut b = rng.gen_range(0..nodes.len());
    if nodes.len() > 1 && b == a {
        b = (a + 1) % nodes.len();
    }
    (nodes[a].clone(), nodes[b].clone())
}

/// How many events of a rate `per_min` fall in `duration_ms`: the integer part, plus one
/// more with the fractional part's probability.
fn count(rng: &mut impl Rng, per_min: f64, duration_ms: u64) -> u64 {
    if !(per_min.is_finite() && per_min > 0.0) {
        return 0;
    }
    let expected = per_min * duration_ms as f64 / 60_000.0;
    let whole = expected.floor();
    let extra = rng.gen_bool((expected - whole).clamp(0.0, 1.0));
    whole as u64 + u64::from(extra)
}

impl Schedule {
    /// Sorts the events by time, keeping the given order among equal times.
    pub fn sorted(mut self) -> Schedule {
        self.events.sort_by_key(|t| t.at_ms);
        self
    }

    /// The verbs the schedule uses, with counts.
    pub fn verbs(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for t in &self.events {
            *m.entry(t.event.verb()).or_insert(0) += 1;
        }
        m
    }

    /// The last event's time.
    pub fn end_ms(&self) -> u64 {
        self.events.iter().map(|t| t.at_ms).max().unwrap_or(0)
    }

    /// Draws a schedule for `nodes` (world names: `lock-1`, `executor-2`, `rail-stub`, ...)
    /// over `duration_ms`, from `rates` (events per minute). Every fault with a duration
    /// is closed by its undo event (module doc).
    pub fn draw(rates: &FaultRates, nodes: &[String], duration_ms: u64, rng: &mut impl Rng) -> Schedule {
        let mut events = Vec::new();
        if nodes.is_empty() || duration_ms == 0 {
            return Schedule::default();
        }
        let lo = rates.fault_ms_min.min(rates.fault_ms_max);
        let hi = rates.fault_ms_max.max(lo + 1);
        let push = |events: &mut Vec<Timed>, at_ms: u64, event: Event| events.push(Timed { at_ms, when: None, event });
        let mut partitions = 0u32;
        macro_rules! each {
            ($rate:expr, |$at:ident, $len:ident| $body:block) => {
                for _ in 0..count(rng, $rate, duration_ms) {
                    let $at = rng.gen_range(0..duration_ms);
                    let $len = rng.gen_range(lo..hi);
                    $body
                }
            };
        }
        each!(rates.pause_per_min, |at, len| {
            let node = pick(rng, nodes);
            push(&mut events, at, Event::Pause { node: node.clone() });
            push(&mut events, at + len, Event::Resume { node });
        });
        each!(rates.crash_per_min, |at, len| {
            let node = pick(rng, nodes);
            push(&mut events, at, Event::Crash { node: node.clone() });
            push(&mut events, at + len, Event::Start { node });
        });
        for (rate, one_way) in [(rates.partition_per_min, false), (rates.one_way_per_min, true)] {
            each!(rate, |at, len| {
                if nodes.len() < 2 {
                    continue;
                }
                partitions += 1;
                let name = format!("drawn-{partitions}");
                let (a, b) = if one_way {
                    let (a, b) = pair(rng, nodes);
                    (vec![a], vec![b])
                } else {
                    // A random side against the rest.
                    let mut a = Vec::new();
                    let mut b = Vec::new();
                    for n in nodes {
                        if rng.gen_bool(0.3) {
                            a.push(n.clone())
                        } else {
                            b.push(n.clone())
                        }
                    }
                    if a.is_empty() {
                        a.push(b.remove(rng.gen_range(0..b.len())));
                    }
                    if b.is_empty() {
                        b.push(a.remove(rng.gen_range(0..a.len())));
                    }
                    (a, b)
                };
                push(&mut events, at, Event::Partition { name: Some(name.clone()), a, b, one_way });
                push(&mut events, at + len, Event::Heal { name: Some(name) });
            });
        }
        each!(rates.clog_per_min, |at, len| {
            let (from, to) = pair(rng, nodes);
            push(&mut events, at, Event::Clog { from: from.clone(), to: to.clone(), loss: None, for_ms: None });
            push(&mut events, at + len, Event::Unclog { from, to });
        });
        each!(rates.lossy_link_per_min, |at, len| {
            let (from, to) = pair(rng, nodes);
            let loss = rng.gen_range(0.05..0.6);
            push(&mut events, at, Event::Clog { from, to, loss: Some(loss), for_ms: Some(len) });
        });
        each!(rates.drift_per_min, |at, _len| {
            let lo_r = rates.drift_rate_min.min(rates.drift_rate_max);
            let hi_r = rates.drift_rate_max.max(lo_r + 1e-6);
            let rate = rng.gen_range(lo_r..hi_r);
            push(&mut events, at, Event::DriftClock { node: pick(rng, nodes), rate });
        });
        each!(rates.skew_per_min, |at, _len| {
            let bound = rates.skew_ms_max.max(1);
            let ms = rng.gen_range(-bound..=bound);
            push(&mut events, at, Event::SkewClock { node: pick(rng, nodes), ms });
        });
        each!(rates.store_unavailable_per_min, |at, len| {
            let store = if rng.gen_bool(0.5) { "paydb" } else { "lockdb" };
            push(
                &mut events,
                at,
                Event::StoreFault {
                    store: store.into(),
                    op: None,
                    fault: StoreFaultKind::Unavailable,
                    count: 1,
                    for_ms: Some(len),
                    latency_ms: None,
                },
            );
        });
        each!(rates.lost_ack_per_min, |at, _len| {
            let (store, op) = LOST_ACK_OPS[rng.gen_range(0..LOST_ACK_OPS.len())];
            push(
                &mut events,
                at,
                Event::StoreFault {
                    store: store.into(),
                    op: Some(op.into()),
                    fault: StoreFaultKind::CommitUnknown,
                    count: 1,
                    for_ms: None,
                    latency_ms: None,
                },
            );
        });
        each!(rates.store_latency_per_min, |at, len| {
            let store = if rng.gen_bool(0.5) { "paydb" } else { "lockdb" };
            let latency = rng.gen_range(1..=rates.store_latency_ms_max.max(1));
            push(
                &mut events,
                at,
                Event::StoreFault {
                    store: store.into(),
                    op: None,
                    fault: StoreFaultKind::Latency,
                    count: 1,
                    for_ms: Some(len),
                    latency_ms: Some(latency),
                },
            );
        });
        each!(rates.leader_loss_per_min, |at, len| {
            push(
                &mut events,
                at,
                Event::StoreFault {
                    store: "lockdb".into(),
                    op: None,
                    fault: StoreFaultKind::LeaderLoss,
                    count: 1,
                    for_ms: Some(len),
                    latency_ms: None,
                },
            );
        });
        each!(rates.revoke_per_min, |at, _len| {
            push(&mut events, at, Event::Revoke { key: None });
        });
        let s = Schedule { events }.sorted();
        assert!(s.closes_what_it_opens(), "a drawn schedule left a fault open: {s:?}");
        s
    }

    /// Whether every pause, crash, partition and clog without a duration of its own is
    /// followed by its undo.
    pub fn closes_what_it_opens(&self) -> bool {
        let mut open: BTreeMap<String, i64> = BTreeMap::new();
        fn bump(open: &mut BTreeMap<String, i64>, k: String, d: i64) {
            *open.entry(k).or_insert(0) += d;
        }
        for t in &self.events {
            match &t.event {
                Event::Pause { node } => bump(&mut open, format!("pause {node}"), 1),
                Event::Resume { node } => bump(&mut open, format!("pause {node}"), -1),
                Event::Crash { node } => bump(&mut open, format!("crash {node}"), 1),
                Event::Start { node } => bump(&mut open, format!("crash {node}"), -1),
                Event::Partition { name: Some(n), .. } => bump(&mut open, format!("partition {n}"), 1),
                Event::Heal { name: Some(n) } => bump(&mut open, format!("partition {n}"), -1),
                Event::Heal { name: None } => {
                    open.retain(|k, _| !k.starts_with("partition") && !k.starts_with("clog") && !k.starts_with("pause"))
                }
                Event::Clog { from, to, loss: None, .. } => bump(&mut open, format!("clog {from} {to}"), 1),
                Event::Unclog { from, to } => bump(&mut open, format!("clog {from} {to}"), -1),
                _ => {}
            }
        }
        open.values().all(|v| *v <= 0)
    }
}

#[cfg(madsim)]
pub use play::{Stage, TRIGGER_WAIT_MS_MAX};

#[cfg(madsim)]
mod play {
    use std::future::Future;
    use std::pin::Pin;

    use madsim::task::NodeId;

    use super::{Event, Schedule, StoreFaultKind, Trigger};
    use crate::faults::{now_ms, Faults};
    use crate::store_faults::{Injected, StoreFaultPlan, StoreName};

    /// Longest [`Schedule::play`] waits for a trigger before applying the event anyway.
    pub const TRIGGER_WAIT_MS_MAX: u64 = 120_000;

    /// What a schedule plays on: the world.
    pub trait Stage: Send + Sync {
        /// The node named `name` (`lock-1`, `executor-2`, `rail-stub`, ...).
        fn node(&self, name: &str) -> Option<NodeId>;
        fn faults(&self) -> &Faults;
        /// The store fault plan in front of paydb and lockdb, if the world has one.
        fn store_plan(&self) -> Option<&StoreFaultPlan>;
        /// The simulated etcd's node, when the lock servers run on it.
        fn etcd(&self) -> Option<NodeId> {
            None
        }
        /// An operator revokes `key` (or a key some executor holds); a line for the trace.
        fn revoke<'a>(
            &'a self,
            key: Option<&'a str>,
        ) -> Pin<Box<dyn Future<Output = Result<String, String>> + Send + 'a>>;
        /// Called after each event is applied, with its trace line (the default: nothing): a
        /// campaign tells its oracle what the event did (e.g. which owner's clock drifted).
        fn applied(&self, event: &Event, line: &str) {
            let _ = (event, line);
        }
        /// The scripted lock client `client` acquires `key` and holds it (an `acquire` step),
        /// on its own node, without blocking the schedule; a line for the trace (the default:
        /// refused, for worlds without scripted clients).
        fn acquire<'a>(
            &'a self,
            client: &'a str,
            key: &'a str,
            wait_ms: u64,
            hold_ms: u64,
            session_ttl_ms: Option<u64>,
        ) -> Pin<Box<dyn Future<Output = Result<String, String>> + Send + 'a>> {
            let _ = (client, key, wait_ms, hold_ms, session_ttl_ms);
            Box::pin(async { Err("this world has no scripted lock clients".to_owned()) })
        }
        /// Resolves once `trigger` happened (the default: at once, for worlds without the hook).
        fn wait_for(&self, trigger: Trigger) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
            let _ = trigger;
            Box::pin(async {})
        }
    }

    impl Schedule {
        /// Applies every event at its time (relative to now), on `stage`; returns one trace
        /// line per event (an event naming an unknown node is reported and skipped). Runs
        /// on the caller's task: call it from the supervisor (the test's own task, on no
        /// service node), so that pausing or killing nodes never stops the schedule.
        pub async fn play(&self, stage: &dyn Stage) -> Vec<String> {
            let start = now_ms();
            let mut shift = 0u64;
            let mut trace = Vec::new();
            for t in &self.events {
                let due = start + t.at_ms + shift;
                let now = now_ms();
                if due > now {
                    madsim::time::sleep(std::time::Duration::from_millis(due - now)).await;
                }
                if let Some(trigger) = t.when {
                    let before = now_ms();
                    let waited = madsim::time::timeout(
                        std::time::Duration::from_millis(TRIGGER_WAIT_MS_MAX),
                        stage.wait_for(trigger),
                    )
                    .await;
                    shift += now_ms() - before;
                    if waited.is_err() {
                        trace
                            .push(format!("schedule @{}ms: {trigger:?} never came; applying anyway", now_ms() - start));
                    }
                }
                let line = apply(stage, &t.event).await;
                stage.applied(&t.event, &line);
                trace.push(format!("schedule @{}ms: {} {line}", now_ms() - start, t.event.verb()));
            }
            trace
        }
    }

    fn ids(stage: &dyn Stage, names: &[String]) -> Result<Vec<NodeId>, String> {
        names.iter().map(|n| stage.node(n).ok_or_else(|| format!("unknown node {n:?}"))).collect()
    }

    async fn apply(stage: &dyn Stage, event: &Event) -> String {
        let f = stage.faults();
        let one = |n: &String| stage.node(n).ok_or_else(|| format!("unknown node {n:?}"));
        let r: Result<String, String> = async {
            match event {
                Event::Pause { node } => f.pause(one(node)?),
                Event::Resume { node } => f.resume(one(node)?),
                Event::Crash { node } => f.kill(one(node)?),
                Event::Start { node } => f.restart(one(node)?),
                Event::Partition { name, a, b, one_way } => {
                    let (a, b) = (ids(stage, a)?, ids(stage, b)?);
                    let mut opened = Vec::new();
                    if *one_way {
                        for &x in &a {
                            for &y in &b {
                                opened.push(f.one_way(x, y));
                            }
                        }
                    } else {
                        opened.push(f.partition(&a, &b));
                    }
                    if let Some(n) = name {
                        for id in &opened {
                            f.label_partition(n, *id);
                        }
                    }
                    return Ok(format!("#{opened:?}"));
                }
                Event::Heal { name: Some(n) } => {
                    if !f.heal_labelled(n) {
                        return Err(format!("no open partition named {n:?}"));
                    }
                }
                Event::Heal { name: None } => {
                    f.heal_all();
                    if let Some(plan) = stage.store_plan() {
                        plan.heal();
                    }
                }
                Event::Clog { from, to, loss: None, for_ms } => {
                    let (a, b) = (one(from)?, one(to)?);
                    f.clog(a, b);
                    if let Some(ms) = *for_ms {
                        let f = f.clone();
                        madsim::task::spawn(async move {
                            madsim::time::sleep(std::time::Duration::from_millis(ms)).await;
                            f.unclog(a, b);
                        });
                    }
                }
                Event::Clog { from, to, loss: Some(loss), for_ms } => {
                    f.lossy_link(one(from)?, one(to)?, *loss, for_ms.unwrap_or(crate::faults::LOSSY_LINK_MS_MAX))
                }
                Event::Unclog { from, to } => f.unclog(one(from)?, one(to)?),
                Event::SkewClock { node, ms } => f.skew_clock(one(node)?, *ms),
                Event::DriftClock { node, rate } => f.drift_clock(one(node)?, *rate),
                Event::StoreFault { store, op, fault, count, for_ms, latency_ms } => {
                    let name = StoreName::parse(store).ok_or_else(|| format!("unknown store {store:?}"))?;
                    if *fault == StoreFaultKind::LeaderLoss {
                        let ms = for_ms.unwrap_or(0);
                        if let Some(etcd) = stage.etcd() {
                            f.etcd_leader_loss(etcd, ms);
                            return Ok(format!("etcd leader lost for {ms} ms"));
                        }
                    }
                    let plan = stage.store_plan().ok_or("the world has no store fault plan")?;
                    let op_static = op.as_deref().and_then(|o| name.ops().iter().copied().find(|k| *k == o));
                    if op.is_some() && op_static.is_none() {
                        return Err(format!("{store} has no operation {op:?}"));
                    }
                    match (fault, for_ms) {
                        (StoreFaultKind::Unavailable | StoreFaultKind::LeaderLoss, Some(ms)) => {
                            plan.unavailable_for(name, op_static, *ms)
                        }
                        (StoreFaultKind::Unavailable | StoreFaultKind::LeaderLoss, None) => plan.inject(
                            name,
                            op_static.ok_or("unavailable without for-ms needs op")?,
                            Injected::Unavailable,
                            *count,
                        ),
                        (StoreFaultKind::CommitUnknown, _) => plan.inject(
                            name,
                            op_static.ok_or("commit-unknown needs op")?,
                            Injected::CommitUnknown,
                            *count,
                        ),
                        (StoreFaultKind::Latency, ms) => {
                            plan.latency_for(name, op_static, latency_ms.unwrap_or(0), ms.unwrap_or(u64::MAX))
                        }
                    }
                }
                Event::Revoke { key } => return stage.revoke(key.as_deref()).await,
                Event::Acquire { client, key, wait_ms, hold_ms, session_ttl_ms } => {
                    return stage.acquire(client, key, *wait_ms, *hold_ms, *session_ttl_ms).await
                }
            }
            Ok(String::new())
        }
        .await;
        match r {
            Ok(s) => format!("{} {s}", event.nodes().join(",")).trim().to_owned(),
            Err(e) => format!("SKIPPED: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> Vec<String> {
        ["lock-1", "payment-1", "proxy-1", "proxy-2", "rail-stub", "executor-1", "executor-2"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    fn busy() -> FaultRates {
        let mut r = FaultRates::none();
        r.pause_per_min = 4.0;
        r.crash_per_min = 2.0;
        r.partition_per_min = 2.0;
        r.one_way_per_min = 2.0;
        r.clog_per_min = 2.0;
        r.lossy_link_per_min = 2.0;
        r.drift_per_min = 2.0;
        r.skew_per_min = 2.0;
        r.store_unavailable_per_min = 2.0;
        r.lost_ack_per_min = 2.0;
        r.store_latency_per_min = 2.0;
        r.leader_loss_per_min = 1.0;
        r.revoke_per_min = 2.0;
        r
    }

    #[test]
    fn the_same_seed_draws_the_same_schedule_and_every_fault_is_closed() {
        let draw = |seed| Schedule::draw(&busy(), &nodes(), 120_000, &mut dlock_rt::rand::seeded(seed));
        let a = draw(1);
        assert_eq!(a, draw(1));
        assert_ne!(a, draw(2));
        assert!(a.closes_what_it_opens());
        assert!(a.events.windows(2).all(|w| w[0].at_ms <= w[1].at_ms), "not in time order");
        for verb in [
            "pause",
            "resume",
            "crash",
            "start",
            "partition",
            "heal",
            "clog",
            "skew-clock",
            "drift-clock",
            "store-fault",
            "revoke",
        ] {
            assert!(a.verbs().contains_key(verb), "two minutes at these rates never drew {verb}: {:?}", a.verbs());
        }
        let names = nodes();
        assert!(a.events.iter().all(|t| t.event.nodes().iter().all(|n| names.iter().any(|m| m == n))));
    }

    #[test]
    fn zero_rates_draw_nothing() {
        let s = Schedule::draw(&FaultRates::none(), &nodes(), 600_000, &mut dlock_rt::rand::seeded(3));
        assert!(s.events.is_empty(), "{s:?}");
    }

    #[test]
    fn an_unclosed_pause_is_detected() {
        let s =
            Schedule { events: vec![Timed { at_ms: 0, when: None, event: Event::Pause { node: "lock-1".into() } }] };
        assert!(!s.closes_what_it_opens());
    }
}
