//! A [`Schedule`]: timed faults (the one vocabulary, [`crate::fault::Fault`]) and the
//! scripted lock client's acquires, over node names. A scenario file produces one
//! ([`crate::scenario::Scenario::schedule`]), and so does the swarm, from a seed's drawn
//! [`FaultRates`] ([`Schedule::draw`]). Its entries keep each fault's `for-ms`;
//! [`Schedule::timeline`] expands them into the primitive events the mechanisms play (a
//! pause and its resume). Under madsim, [`Schedule::play`] applies each timeline event at
//! its simulated time through the mechanisms of [`crate::faults`] and
//! [`crate::store_faults`], on a [`Stage`] (the world) that maps names to nodes.
//!
//! Invariants:
//! - The timeline is in time order; events at the same time keep the order of their
//!   entries (and an undo follows its fault).
//! - Every fault the timeline opens with a duration is closed by an event of the timeline
//!   (a pause by a resume, a crash by a start, a partition by its heal, a clog by an
//!   unclog), so a drawn schedule never leaves the world broken past `duration_ms` plus the
//!   longest fault; [`Schedule::draw`] checks this before returning.
//! - Drawing uses only the generator it is given: the same seed draws the same schedule.

use std::collections::BTreeMap;

pub use crate::fault::{Fault, FaultRates, StoreFaultKind};

/// A moment the world can wait for before an event (`when = "..."` in a scenario).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
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

/// What a schedule plays: a fault, or a scenario's scripted lock client acquiring (a
/// control step that runs at its time; never drawn).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Fault(Fault),
    /// The scripted lock client `client` acquires `key` (waiting up to `wait_ms` in the
    /// server's queue) and holds the grant for `hold_ms`.
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
    pub fn verb(&self) -> String {
        match self {
            Event::Fault(f) => f.verb(),
            Event::Acquire { .. } => "acquire".to_owned(),
        }
    }

    /// The fault kind (a [`crate::fault::KINDS`] row's name) this event injects; `None` for
    /// an undo (resume, start, heal, unclog) and an acquire.
    pub fn kind(&self) -> Option<&'static str> {
        match self {
            Event::Fault(f) => f.kind(),
            Event::Acquire { .. } => None,
        }
    }

    /// Node names the event acts on.
    pub fn nodes(&self) -> Vec<String> {
        match self {
            Event::Fault(f) => f.nodes(),
            Event::Acquire { client, .. } => vec![client.clone()],
        }
    }

    /// The fault, if the event is one.
    pub fn fault(&self) -> Option<&Fault> {
        match self {
            Event::Fault(f) => Some(f),
            Event::Acquire { .. } => None,
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

impl Timed {
    /// `fault` at `at_ms`, with no trigger.
    pub fn fault(at_ms: u64, fault: Fault) -> Timed {
        Timed { at_ms, when: None, event: Event::Fault(fault) }
    }
}

/// Timed entries, each fault with its `for-ms` (module doc).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Schedule {
    pub events: Vec<Timed>,
}

impl Schedule {
    /// The primitive events to play, in time order (module doc): each entry expanded by
    /// [`Fault::expand`] (what opens at the entry's time waits for its trigger; an undo
    /// later does not), in entry order, then
    /// sorted by time, keeping that order among equal times.
    pub fn timeline(&self) -> Vec<Timed> {
        let mut anon = 0u32;
        let mut out = Vec::new();
        for t in &self.events {
            match &t.event {
                Event::Fault(f) => {
                    for (offset, e) in f.expand(&mut anon) {
                        let when = if offset == 0 { t.when } else { None };
                        out.push(Timed { at_ms: t.at_ms + offset, when, event: Event::Fault(e) });
                    }
                }
                Event::Acquire { .. } => out.push(t.clone()),
            }
        }
        out.sort_by_key(|t| t.at_ms);
        out
    }

    /// The timeline's verbs, with counts.
    pub fn verbs(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for t in self.timeline() {
            *m.entry(t.event.verb()).or_insert(0) += 1;
        }
        m
    }

    /// The timeline's last event's time.
    pub fn end_ms(&self) -> u64 {
        self.timeline().iter().map(|t| t.at_ms).max().unwrap_or(0)
    }

    /// Draws a schedule for `nodes` (world names: `lock-1`, `executor-2`, `rail-stub`, ...)
    /// over `duration_ms`, from `rates` ([`FaultRates::draw`]): the entries in draw order.
    /// Every fault with a duration is closed by its undo (module doc).
    pub fn draw(
        rates: &FaultRates,
        nodes: &[String],
        duration_ms: u64,
        rng: &mut impl dlock_rt::rand::Rng,
    ) -> Schedule {
        let events = rates.draw(nodes, duration_ms, rng).into_iter().map(|(at, f)| Timed::fault(at, f)).collect();
        let s = Schedule { events };
        assert!(s.closes_what_it_opens(), "a drawn schedule left a fault open: {s:?}");
        s
    }

    /// Whether, on the timeline, every pause, crash, partition and clog without a duration
    /// of its own is followed by its undo.
    pub fn closes_what_it_opens(&self) -> bool {
        let mut open: BTreeMap<String, i64> = BTreeMap::new();
        fn bump(open: &mut BTreeMap<String, i64>, k: String, d: i64) {
            *open.entry(k).or_insert(0) += d;
        }
        for t in self.timeline() {
            let Event::Fault(f) = &t.event else { continue };
            match f {
                Fault::Pause { node, .. } => bump(&mut open, format!("pause {node}"), 1),
                Fault::Resume { node } => bump(&mut open, format!("pause {node}"), -1),
                Fault::Crash { node, .. } => bump(&mut open, format!("crash {node}"), 1),
                Fault::Start { node } => bump(&mut open, format!("crash {node}"), -1),
                Fault::Partition { name: Some(n), .. } => bump(&mut open, format!("partition {n}"), 1),
                Fault::Heal { name: Some(n) } => bump(&mut open, format!("partition {n}"), -1),
                Fault::Heal { name: None } => {
                    open.retain(|k, _| !k.starts_with("partition") && !k.starts_with("clog") && !k.starts_with("pause"))
                }
                Fault::Clog { from, to, loss: None, .. } => bump(&mut open, format!("clog {from} {to}"), 1),
                Fault::Unclog { from, to } => bump(&mut open, format!("clog {from} {to}"), -1),
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

    use super::{Event, Fault, Schedule, StoreFaultKind, Trigger};
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
        /// Applies every event of the [timeline](Schedule::timeline) at its time (relative
        /// to now), on `stage`; returns one trace line per event (an event naming an unknown node is reported and skipped). Runs
        /// on the caller's task: call it from the supervisor (the test's own task, on no
        /// service node), so that pausing or killing nodes never stops the schedule.
        pub async fn play(&self, stage: &dyn Stage) -> Vec<String> {
            let start = now_ms();
            let mut shift = 0u64;
            let mut trace = Vec::new();
            for t in &self.timeline() {
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

    /// Applies one timeline event: the mechanisms' one arm per fault.
    async fn apply(stage: &dyn Stage, event: &Event) -> String {
        let fault = match event {
            Event::Fault(fault) => fault,
            Event::Acquire { client, key, wait_ms, hold_ms, session_ttl_ms } => {
                return match stage.acquire(client, key, *wait_ms, *hold_ms, *session_ttl_ms).await {
                    Ok(s) => format!("{client} {s}").trim().to_owned(),
                    Err(e) => format!("SKIPPED: {e}"),
                };
            }
        };
        let f = stage.faults();
        let one = |n: &String| stage.node(n).ok_or_else(|| format!("unknown node {n:?}"));
        let r: Result<String, String> = async {
            match fault {
                Fault::Pause { node, .. } => f.pause(one(node)?),
                Fault::Resume { node } => f.resume(one(node)?),
                Fault::Crash { node, .. } => f.kill(one(node)?),
                Fault::Start { node } => f.restart(one(node)?),
                Fault::Partition { name, a, b, one_way, .. } => {
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
                Fault::Heal { name: Some(n) } => {
                    if !f.heal_labelled(n) {
                        return Err(format!("no open partition named {n:?}"));
                    }
                }
                Fault::Heal { name: None } => {
                    f.heal_all();
                    if let Some(plan) = stage.store_plan() {
                        plan.heal();
                    }
                }
                Fault::Clog { from, to, loss: None, for_ms, .. } => {
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
                Fault::Clog { from, to, loss: Some(loss), for_ms, .. } => {
                    f.lossy_link(one(from)?, one(to)?, *loss, for_ms.unwrap_or(crate::faults::LOSSY_LINK_MS_MAX))
                }
                Fault::Unclog { from, to } => f.unclog(one(from)?, one(to)?),
                Fault::SkewClock { node, ms } => f.skew_clock(one(node)?, *ms),
                Fault::DriftClock { node, rate } => f.drift_clock(one(node)?, *rate),
                Fault::StoreFault { store, op, fault, count, for_ms, latency_ms } => {
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
                Fault::Revoke { key } => return stage.revoke(key.as_deref()).await,
            }
            Ok(String::new())
        }
        .await;
        match r {
            Ok(s) => format!("{} {s}", fault.nodes().join(",")).trim().to_owned(),
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
        crate::fault::KINDS.iter().fold(FaultRates::none(), |r, row| r.with(row.name, 2.0)).with("pause", 4.0)
    }

    #[test]
    fn the_same_seed_draws_the_same_schedule_and_every_fault_is_closed() {
        let draw = |seed| Schedule::draw(&busy(), &nodes(), 120_000, &mut dlock_rt::rand::seeded(seed));
        let a = draw(1);
        assert_eq!(a, draw(1));
        assert_ne!(a, draw(2));
        assert!(a.closes_what_it_opens());
        let timeline = a.timeline();
        assert!(timeline.windows(2).all(|w| w[0].at_ms <= w[1].at_ms), "not in time order");
        for verb in [
            "pause",
            "resume",
            "crash",
            "start",
            "partition",
            "heal",
            "clog",
            "unclog",
            "skew-clock",
            "drift-clock",
            "store-fault",
            "revoke",
        ] {
            assert!(a.verbs().contains_key(verb), "two minutes at these rates never drew {verb}: {:?}", a.verbs());
        }
        let names = nodes();
        assert!(timeline.iter().all(|t| t.event.nodes().iter().all(|n| names.contains(n))));
    }

    #[test]
    fn zero_rates_draw_nothing() {
        let s = Schedule::draw(&FaultRates::none(), &nodes(), 600_000, &mut dlock_rt::rand::seeded(3));
        assert!(s.events.is_empty(), "{s:?}");
    }

    #[test]
    fn an_unclosed_pause_is_detected() {
        let s = Schedule { events: vec![Timed::fault(0, Fault::Pause { node: "lock-1".into(), for_ms: None })] };
        assert!(!s.closes_what_it_opens());
        let closed =
            Schedule { events: vec![Timed::fault(0, Fault::Pause { node: "lock-1".into(), for_ms: Some(5) })] };
        assert!(closed.closes_what_it_opens());
    }

    #[test]
    fn the_timeline_plays_each_undo_after_its_fault_in_entry_order_among_equal_times() {
        let pause = |node: &str, at, ms| Timed::fault(at, Fault::Pause { node: node.into(), for_ms: Some(ms) });
        let s = Schedule { events: vec![pause("b", 100, 400), pause("a", 50, 450)] };
        let at: Vec<(u64, String, Vec<String>)> =
            s.timeline().into_iter().map(|t| (t.at_ms, t.event.verb(), t.event.nodes())).collect();
        assert_eq!(
            at,
            [
                (50, "pause".into(), vec!["a".into()]),
                (100, "pause".into(), vec!["b".into()]),
                (500, "resume".into(), vec!["b".into()]),
                (500, "resume".into(), vec!["a".into()]),
            ]
        );
    }
}
