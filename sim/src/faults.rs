//! Fault mechanisms over madsim node ids: process pause/resume and kill/restart, network
//! partitions (symmetric and one-way), per-link clogs and lossy links, world-wide latency and
//! loss, per-node clock drift and wall steps, and an etcd leader loss. Every mechanism is a
//! method of [`Faults`] taking [`NodeId`]s; the world maps node names to ids and registers
//! them ([`Faults::name`]) so the record reads in names.
//!
//! Each applied fault is appended to the record ([`Faults::record`]), stamped with the
//! simulated time, for the trace; partitions are also kept as spans ([`Faults::partitions`],
//! [`PartitionSpan`]: when each started and healed), so the oracle can tell a partition that
//! healed while a lease taken before it was still live (`PartitionHealedMidLease`), and
//! [`Faults::on_heal`] lets it run a check at the instant of each heal.
//!
//! What madsim 0.2.34 offers and what is built on it (docs/simulation.md, "Faults"):
//! - `NetSim::clog_link(src, dst)` drops the `src -> dst` direction only: a connect from a
//!   clogged source is refused at once, and a segment on an established connection is held
//!   and retried with backoff until the link opens (madsim's TCP is reliable). A symmetric
//!   partition clogs both directions of every pair; a one-way partition only one.
//! - madsim has no per-link latency or loss: its `net::Config` (`send_latency`,
//!   `packet_loss_rate`) is world-wide ([`Faults::set_latency`], [`Faults::set_loss`]).
//!   A lossy link ([`Faults::lossy_link`]) is built from clogs: a task flips the link
//!   clogged for random slots, so a fraction of connects is refused and segments sent in a
//!   closed slot wait for the next open one (loss on a reliable transport is delay).
//! - `Handle::pause` freezes every task of a node (timers included) until `resume`;
//!   `Handle::kill` drops them and `restart` runs the node's `init` again. Databases live
//!   outside the nodes (see [`crate::world`]) and survive both.
//!
//! Invariants: every mechanism records what it did before returning; [`Faults::heal_all`]
//! leaves no link clogged that this layer clogged and no node paused; the record is in
//! simulated-time order (appends only, from one runtime thread).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use madsim::net::NetSim;
use madsim::runtime::Handle;
use madsim::task::NodeId;
use madsim::time::TimeHandle;

/// Bound on the fault record: a run that applies more faults than this keeps the first ones
/// and counts the rest (`FaultState::dropped`).
pub const RECORD_LEN_MAX: usize = 100_000;
/// Slot length of a lossy link: the link is open or clogged for whole slots.
pub const LOSSY_SLOT_MS: u64 = 50;
/// Bound on a lossy link's life, so a forgotten one cannot run forever.
pub const LOSSY_LINK_MS_MAX: u64 = 3_600_000;

/// One applied fault.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    Pause,
    Resume,
    Kill,
    Restart,
    /// Both directions between the two sides clogged (`one_way`: only `a -> b`).
    Partition {
        id: u64,
        one_way: bool,
    },
    /// The partition `id` healed (every link it clogged opened).
    Heal {
        id: u64,
    },
    /// `a -> b` clogged (or opened).
    Clog,
    Unclog,
    /// `a -> b` lossy at `loss` for `for_ms`.
    LossyLink {
        loss: f64,
        for_ms: u64,
    },
    /// World-wide one-way latency range, in ms.
    Latency {
        min_ms: u64,
        max_ms: u64,
    },
    /// World-wide packet loss rate.
    Loss {
        rate: f64,
    },
    /// The node's monotonic clock runs at `rate` from now on.
    ClockRate {
        rate: f64,
    },
    /// The node's wall clock stepped by `delta_ms`.
    WallStep {
        delta_ms: i64,
    },
    /// The node's clock is correct again.
    ClockReset,
    /// The etcd node lost its leader for `for_ms` (clogged and frozen).
    EtcdLeaderLoss {
        for_ms: u64,
    },
    EtcdLeaderBack,
}

/// One line of the record.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRecord {
    /// Simulated milliseconds since the runtime started.
    pub at_ms: u64,
    pub kind: FaultKind,
    /// The nodes it acted on (for a partition: side `a`).
    pub a: Vec<NodeId>,
    /// For a partition, a clog or a lossy link: side `b` (the destination).
    pub b: Vec<NodeId>,
}

/// A partition's life, for the oracle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionSpan {
    pub id: u64,
    pub a: Vec<NodeId>,
    pub b: Vec<NodeId>,
    /// Only `a -> b` dropped.
    pub one_way: bool,
    pub started_ms: u64,
    /// `None` while it lasts.
    pub healed_ms: Option<u64>,
}

type HealHook = Box<dyn Fn(&PartitionSpan) + Send + Sync>;

#[derive(Default)]
struct FaultState {
    names: BTreeMap<NodeId, String>,
    record: Vec<FaultRecord>,
    dropped: u64,
    next_partition: u64,
    partitions: Vec<PartitionSpan>,
    /// Links clogged by partitions (counted: overlapping partitions may clog one link twice).
    partition_links: BTreeMap<(NodeId, NodeId), u32>,
    /// Links clogged by [`Faults::clog`].
    clogged: BTreeSet<(NodeId, NodeId)>,
    paused: BTreeSet<NodeId>,
    /// Lossy links running (cancelled by heal_all through the generation counter).
    lossy_generation: u64,
    on_heal: Vec<HealHook>,
    /// Partition ids by the label a schedule gave them.
    labels: BTreeMap<String, Vec<u64>>,
}

/// The fault layer of one simulated world (cheap to clone; every clone shares the record).
#[derive(Clone, Default)]
pub struct Faults {
    state: Arc<Mutex<FaultState>>,
}

/// Simulated milliseconds since the runtime started.
pub fn now_ms() -> u64 {
    u64::try_from(TimeHandle::current().elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Faults {
    pub fn new() -> Faults {
        Faults::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut FaultState) -> R) -> R {
        let mut g = match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut g)
    }

    fn push(&self, kind: FaultKind, a: &[NodeId], b: &[NodeId]) {
        let at_ms = now_ms();
        self.with(|s| {
            if s.record.len() < RECORD_LEN_MAX {
                s.record.push(FaultRecord { at_ms, kind, a: a.to_vec(), b: b.to_vec() });
            } else {
                s.dropped += 1;
            }
        });
    }

    /// Names `id` `name` in the record's lines.
    pub fn name(&self, name: &str, id: NodeId) {
        self.with(|s| s.names.insert(id, name.to_owned()));
    }

    /// The name given to `id`, or its number.
    pub fn name_of(&self, id: NodeId) -> String {
        self.with(|s| s.names.get(&id).cloned()).unwrap_or_else(|| format!("node-{id}"))
    }

    /// Every fault applied so far, in order.
    pub fn record(&self) -> Vec<FaultRecord> {
        self.with(|s| s.record.clone())
    }

    /// The record as trace lines: `fault @1200ms: partition#1 [lock-1] | [executor-1]`.
    pub fn trace(&self) -> Vec<String> {
        let (record, names) = self.with(|s| (s.record.clone(), s.names.clone()));
        let n = |ids: &[NodeId]| {
            ids.iter()
                .map(|i| names.get(i).cloned().unwrap_or_else(|| format!("node-{i}")))
                .collect::<Vec<_>>()
                .join(",")
        };
        record
            .iter()
            .map(|r| {
                let what = match &r.kind {
                    FaultKind::Partition { id, one_way: false } => format!("partition#{id}"),
                    FaultKind::Partition { id, one_way: true } => format!("one-way#{id}"),
                    FaultKind::Heal { id } => format!("heal#{id}"),
                    other => format!("{other:?}"),
                };
                if r.b.is_empty() {
                    format!("fault @{}ms: {what} [{}]", r.at_ms, n(&r.a))
                } else {
                    format!("fault @{}ms: {what} [{}] -> [{}]", r.at_ms, n(&r.a), n(&r.b))
                }
            })
            .collect()
    }

    /// Every partition so far, open or healed.
    pub fn partitions(&self) -> Vec<PartitionSpan> {
        self.with(|s| s.partitions.clone())
    }

    /// Partitions not yet healed.
    pub fn open_partitions(&self) -> Vec<PartitionSpan> {
        self.with(|s| s.partitions.iter().filter(|p| p.healed_ms.is_none()).cloned().collect())
    }

    /// Runs `hook` at each heal, with the healed partition (for the oracle's
    /// `PartitionHealedMidLease` probe: compare the span with the grants live at its start).
    pub fn on_heal(&self, hook: impl Fn(&PartitionSpan) + Send + Sync + 'static) {
        self.with(|s| s.on_heal.push(Box::new(hook)));
    }

    // ---- processes -------------------------------------------------------------------

    /// Freezes every task of `node` (its timers too) until [`Faults::resume`]: a GC pause,
    /// a stalled VM. Its sockets stay bound; callers' requests wait or time out.
    pub fn pause(&self, node: NodeId) {
        Handle::current().pause(node);
        self.with(|s| s.paused.insert(node));
        self.push(FaultKind::Pause, &[node], &[]);
    }

    pub fn resume(&self, node: NodeId) {
        Handle::current().resume(node);
        self.with(|s| s.paused.remove(&node));
        self.push(FaultKind::Resume, &[node], &[]);
    }

    /// Kills `node` abruptly (no drain): its tasks and memory are gone, its databases not.
    pub fn kill(&self, node: NodeId) {
        Handle::current().kill(node);
        self.with(|s| s.paused.remove(&node));
        self.push(FaultKind::Kill, &[node], &[]);
    }

    /// Starts `node` again through its `init` (a node without one comes back empty).
    pub fn restart(&self, node: NodeId) {
        Handle::current().restart(node);
        self.with(|s| s.paused.remove(&node));
        self.push(FaultKind::Restart, &[node], &[]);
    }

    // ---- network ---------------------------------------------------------------------

    fn clog_partition_link(s: &mut FaultState, src: NodeId, dst: NodeId) {
        let n = s.partition_links.entry((src, dst)).or_insert(0);
        *n += 1;
        if *n == 1 {
            NetSim::current().clog_link(src, dst);
        }
    }

    fn unclog_partition_link(s: &mut FaultState, src: NodeId, dst: NodeId) {
        if let Some(n) = s.partition_links.get_mut(&(src, dst)) {
            *n -= 1;
            if *n == 0 {
                s.partition_links.remove(&(src, dst));
                if !s.clogged.contains(&(src, dst)) {
                    NetSim::current().unclog_link(src, dst);
                }
            }
        }
    }

    fn open_partition(&self, a: &[NodeId], b: &[NodeId], one_way: bool) -> u64 {
        let at = now_ms();
        let id = self.with(|s| {
            s.next_partition += 1;
            let id = s.next_partition;
            for &x in a {
                for &y in b {
                    if x == y {
                        continue;
                    }
                    Self::clog_partition_link(s, x, y);
                    if !one_way {
                        Self::clog_partition_link(s, y, x);
                    }
                }
            }
            s.partitions.push(PartitionSpan {
                id,
                a: a.to_vec(),
                b: b.to_vec(),
                one_way,
                started_ms: at,
                healed_ms: None,
            });
            id
        });
        self.push(FaultKind::Partition { id, one_way }, a, b);
        id
    }

    /// Cuts every link between side `a` and side `b`, both ways; returns the partition's id.
    pub fn partition(&self, a: &[NodeId], b: &[NodeId]) -> u64 {
        self.open_partition(a, b, false)
    }

    /// Drops `a -> b` only: `a` cannot reach `b` (connects refused, segments held), `b`
    /// still reaches `a` but `a`'s answers to it never arrive until the heal.
    pub fn one_way(&self, a: NodeId, b: NodeId) -> u64 {
        self.open_partition(&[a], &[b], true)
    }

    /// Cuts `node` off from every node in `others`, both ways.
    pub fn isolate(&self, node: NodeId, others: &[NodeId]) -> u64 {
        self.open_partition(&[node], others, false)
    }

    /// Labels partition `id` `label` (a schedule's partition name; several ids may share one).
    pub fn label_partition(&self, label: &str, id: u64) {
        self.with(|s| s.labels.entry(label.to_owned()).or_default().push(id));
    }

    /// Heals every partition labelled `label`; whether there was one open.
    pub fn heal_labelled(&self, label: &str) -> bool {
        let ids = self.with(|s| s.labels.remove(label)).unwrap_or_default();
        let open: Vec<u64> = self.open_partitions().iter().map(|p| p.id).filter(|i| ids.contains(i)).collect();
        for id in &open {
            self.heal(*id);
        }
        !open.is_empty()
    }

    /// Heals partition `id` (a no-op if it already healed).
    pub fn heal(&self, id: u64) {
        let at = now_ms();
        let healed = self.with(|s| {
            let idx = s.partitions.iter().position(|p| p.id == id && p.healed_ms.is_none())?;
            let (a, b, one_way) = {
                let p = &s.partitions[idx];
                (p.a.clone(), p.b.clone(), p.one_way)
            };
            for &x in &a {
                for &y in &b {
                    if x == y {
                        continue;
                    }
                    Self::unclog_partition_link(s, x, y);
                    if !one_way {
                        Self::unclog_partition_link(s, y, x);
                    }
                }
            }
            s.partitions[idx].healed_ms = Some(at);
            Some(s.partitions[idx].clone())
        });
        if let Some(span) = healed {
            self.push(FaultKind::Heal { id }, &span.a, &span.b);
            // The hooks run outside the lock (they may read the record).
            let hooks = self.with(|s| std::mem::take(&mut s.on_heal));
            for h in &hooks {
                h(&span);
            }
            self.with(|s| {
                let mut hooks = hooks;
                hooks.append(&mut s.on_heal);
                s.on_heal = hooks;
            });
        }
    }

    /// Clogs `src -> dst` until [`Faults::unclog`] or [`Faults::heal_all`].
    pub fn clog(&self, src: NodeId, dst: NodeId) {
        NetSim::current().clog_link(src, dst);
        self.with(|s| s.clogged.insert((src, dst)));
        self.push(FaultKind::Clog, &[src], &[dst]);
    }

    pub fn unclog(&self, src: NodeId, dst: NodeId) {
        let still_partitioned = self.with(|s| {
            s.clogged.remove(&(src, dst));
            s.partition_links.contains_key(&(src, dst))
        });
        if !still_partitioned {
            NetSim::current().unclog_link(src, dst);
        }
        self.push(FaultKind::Unclog, &[src], &[dst]);
    }

    /// Makes `src -> dst` lossy at `loss` (0..=1) for `for_ms` (capped at
    /// [`LOSSY_LINK_MS_MAX`]): for each [`LOSSY_SLOT_MS`] slot the link is clogged with
    /// probability `loss` (seeded), then opened again (unless clogged otherwise).
    pub fn lossy_link(&self, src: NodeId, dst: NodeId, loss: f64, for_ms: u64) {
        let loss = if loss.is_finite() { loss.clamp(0.0, 1.0) } else { 0.0 };
        let for_ms = for_ms.min(LOSSY_LINK_MS_MAX);
        self.push(FaultKind::LossyLink { loss, for_ms }, &[src], &[dst]);
        let generation = self.with(|s| s.lossy_generation);
        let me = self.clone();
        // A supervisor task, on no service node: pausing or killing a node never stops it.
        madsim::task::spawn(async move {
            use madsim::rand::Rng;
            let end = now_ms().saturating_add(for_ms);
            while now_ms() < end && me.with(|s| s.lossy_generation) == generation {
                let closed = madsim::rand::thread_rng().gen_bool(loss);
                let others =
                    me.with(|s| s.clogged.contains(&(src, dst)) || s.partition_links.contains_key(&(src, dst)));
                if !others {
                    if closed {
                        NetSim::current().clog_link(src, dst);
                    } else {
                        NetSim::current().unclog_link(src, dst);
                    }
                }
                madsim::time::sleep(std::time::Duration::from_millis(LOSSY_SLOT_MS)).await;
            }
            let others = me.with(|s| s.clogged.contains(&(src, dst)) || s.partition_links.contains_key(&(src, dst)));
            if !others {
                NetSim::current().unclog_link(src, dst);
            }
        });
    }

    /// World-wide one-way latency of every segment, uniformly in `min_ms..max_ms` (madsim
    /// has no per-link latency; its default is 1..10 ms).
    pub fn set_latency(&self, min_ms: u64, max_ms: u64) {
        let max_ms = max_ms.max(min_ms + 1);
        NetSim::current().update_config(|c| {
            c.send_latency = std::time::Duration::from_millis(min_ms)..std::time::Duration::from_millis(max_ms)
        });
        self.push(FaultKind::Latency { min_ms, max_ms }, &[], &[]);
    }

    /// World-wide packet loss (a lost segment of an established connection is retried by
    /// madsim's reliable transport, so it shows as delay; a lost connect is refused).
    pub fn set_loss(&self, rate: f64) {
        let rate = if rate.is_finite() { rate.clamp(0.0, 1.0) } else { 0.0 };
        NetSim::current().update_config(|c| c.packet_loss_rate = rate);
        self.push(FaultKind::Loss { rate }, &[], &[]);
    }

    // ---- clocks ----------------------------------------------------------------------

    /// `node`'s monotonic clock runs at `rate` × real time from now on (`now`, `sleep` and
    /// `timeout` on the node follow it). `rate` is clamped to the runtime's bounds.
    pub fn drift_clock(&self, node: NodeId, rate: f64) {
        let rate = clock::set_rate(node, rate);
        self.push(FaultKind::ClockRate { rate }, &[node], &[]);
    }

    /// Steps `node`'s wall clock by `delta_ms` (negative: backwards); its monotonic clock,
    /// and so every lease on it, is unaffected.
    pub fn skew_clock(&self, node: NodeId, delta_ms: i64) {
        clock::step_wall(node, delta_ms);
        self.push(FaultKind::WallStep { delta_ms }, &[node], &[]);
    }

    pub fn reset_clock(&self, node: NodeId) {
        clock::reset(node);
        self.push(FaultKind::ClockReset, &[node], &[]);
    }

    // ---- lock-server trouble ---------------------------------------------------------

    /// The simulated etcd loses its leader for `for_ms`: madsim-etcd-client's simulator is
    /// one in-memory node without elections, so a leader loss is played as the node being
    /// unreachable (every link to and from it clogged: the lock server answers reads
    /// `NOT_LEADER`, and writes `NOT_LEADER` or, where its etcd store cannot prove the
    /// refused txn was not applied, `INTERNAL`) and frozen (its lease countdown stops, as a new
    /// etcd leader extends every lease by its TTL). Its data survives, as it does in a real
    /// election. The leader comes back after `for_ms` on a supervisor task.
    pub fn etcd_leader_loss(&self, etcd: NodeId, for_ms: u64) {
        NetSim::current().clog_node(etcd);
        Handle::current().pause(etcd);
        self.push(FaultKind::EtcdLeaderLoss { for_ms }, &[etcd], &[]);
        let me = self.clone();
        madsim::task::spawn(async move {
            madsim::time::sleep(std::time::Duration::from_millis(for_ms)).await;
            Handle::current().resume(etcd);
            NetSim::current().unclog_node(etcd);
            me.push(FaultKind::EtcdLeaderBack, &[etcd], &[]);
        });
    }

    // ---- all -------------------------------------------------------------------------

    /// Heals every partition, opens every clogged link, stops every lossy link and resumes
    /// every paused node (the liveness phase's "heal everything"). Clock drift is left to
    /// [`Faults::reset_clock`]: a slow clock is not a fault that heals.
    pub fn heal_all(&self) {
        let open: Vec<u64> = self.open_partitions().iter().map(|p| p.id).collect();
        for id in open {
            self.heal(id);
        }
        let (clogged, paused) = self.with(|s| {
            s.lossy_generation += 1;
            s.labels.clear();
            (std::mem::take(&mut s.clogged), std::mem::take(&mut s.paused))
        });
        for (src, dst) in clogged {
            NetSim::current().unclog_link(src, dst);
            self.push(FaultKind::Unclog, &[src], &[dst]);
        }
        for node in paused {
            Handle::current().resume(node);
            self.push(FaultKind::Resume, &[node], &[]);
        }
        debug_assert!(self.with(|s| s.partition_links.is_empty()), "a healed partition left a link clogged");
    }

    /// Nodes paused by this layer.
    pub fn paused(&self) -> Vec<NodeId> {
        self.with(|s| s.paused.iter().copied().collect())
    }
}

/// The single integration point with the runtime's per-node clocks (`dlock_rt::sim_clock`).
pub mod clock {
    use madsim::task::NodeId;

    /// Sets `node`'s clock rate, clamped to the runtime's bounds; returns the rate set.
    pub fn set_rate(node: NodeId, rate: f64) -> f64 {
        let rate = if rate.is_finite() { rate } else { 1.0 };
        let rate = rate.clamp(dlock_rt::sim_clock::RATE_MIN, dlock_rt::sim_clock::RATE_MAX);
        dlock_rt::sim_clock::set_rate(node, rate);
        rate
    }

    /// Steps `node`'s wall clock; a step that would leave the runtime's bound is clamped.
    pub fn step_wall(node: NodeId, delta_ms: i64) {
        let bound = dlock_rt::sim_clock::WALL_OFFSET_MS_MAX;
        let now = dlock_rt::sim_clock::wall_offset_ms(node);
        let target = now.saturating_add(delta_ms).clamp(-bound, bound);
        dlock_rt::sim_clock::step_wall(node, target - now);
    }

    pub fn reset(node: NodeId) {
        dlock_rt::sim_clock::reset(node);
    }
}
