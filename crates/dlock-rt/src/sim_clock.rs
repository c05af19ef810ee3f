//! Per-node clocks in the simulation (`cfg(madsim)` only).
//!
//! madsim has one global clock. This module gives every simulated node a clock of its own
//! on top of it, so that a node whose oscillator runs slow believes its lease for longer
//! than the server does: the stale writer dlock exists to stop.
//!
//! # Model
//!
//! Each node has
//! - a **monotonic clock**, a piecewise-linear function of global time: it runs at the
//!   node's rate ([`set_rate`]), and a rate change takes effect from the global instant it
//!   is made, continuing from the reading the node had then;
//! - a **wall-clock offset** ([`step_wall`]), added to the global wall clock (and to the
//!   [`crate::Clock`]'s own skew). The offset steps forward and backward; the rate does not
//!   apply to the wall clock (drift of the wall clock is modelled by steps, as NTP makes it).
//!
//! A node nobody has touched reads the global clock exactly. The registry lives in the
//! simulation's thread and belongs to one madsim runtime: a new runtime (a new seed, a
//! determinism re-run) starts with every node untouched. It is keyed by node in a
//! `BTreeMap`, so nothing about it depends on hash order.
//!
//! Everything node-local in the seam follows the clock of the node whose task runs it:
//! [`crate::Clock::now`] and [`Instant::now`] read it, [`crate::sleep`],
//! [`crate::sleep_until`], [`crate::timeout`] and [`crate::wait_until`] wait on it.
//!
//! # Invariants (asserted in release builds too)
//!
//! - A node's monotonic clock never decreases, whatever its rate does, and across
//!   [`reset`].
//! - A rate is within [`RATE_MIN`]`..=`[`RATE_MAX`]; a wall offset within
//!   ±[`WALL_OFFSET_MS_MAX`].
//! - An [`Instant`] carries its frame (a node, or the reference clock). Comparing or
//!   subtracting instants of two frames panics: they are readings of different clocks.
//! - A sleep on a node ends at the first global instant at which that node's clock has
//!   advanced by at least the requested duration (and, as in madsim, never before 1 ms of
//!   global time has passed, so a zero sleep still lets time move). A rate change during a
//!   sleep applies to the rest of it: `sleep(10 s)` at 1×, slowed to 0.5× after 2 s, ends
//!   after 2 + 16 = 18 s of global time. So on a node at rate `r`, `sleep(d)` lasts `d / r`
//!   of global time, and a slow node over-believes every lease it measures.
//! - [`reset`] (for a node that comes back as a new machine) returns the rate to 1× and the
//!   wall offset to 0; the monotonic reading continues from where it was, never back.
//!   madsim has no hook on restart: the world calls [`reset`] when it wants one.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use madsim::net::NetSim;
use madsim::task::NodeId;
use madsim::time::TimeHandle;
use tokio::sync::Notify;

/// The slowest rate a node's monotonic clock may run at.
pub const RATE_MIN: f64 = 0.1;
/// The fastest rate a node's monotonic clock may run at.
pub const RATE_MAX: f64 = 10.0;
/// The largest wall-clock offset a node may accumulate, either way (30 days).
pub const WALL_OFFSET_MS_MAX: i64 = 30 * 24 * 3_600 * 1_000;

/// Rates are kept as parts per million, so the clock arithmetic is exact integers.
const RATE_PPM_ONE: u64 = 1_000_000;

/// Whose clock a reading is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Frame {
    /// The simulation's global clock (and, outside a runtime, the host's).
    Reference,
    /// One node's clock.
    Node(NodeId),
}

/// A monotonic instant of one frame: the time that frame's clock shows, as a duration since
/// the simulation started. Only comparable with instants of the same frame.
#[derive(Clone, Copy)]
pub struct Instant {
    frame: Frame,
    at: Duration,
}

impl Instant {
    /// Now, on the clock of the node running the caller.
    pub fn now() -> Instant {
        current_now()
    }

    /// The reading of this instant's clock, in whole ms since its frame's origin (the
    /// `mono_ms` scale of the incident trace).
    pub fn reading_ms(&self) -> u64 {
        u64::try_from(self.at.as_millis()).unwrap_or(u64::MAX)
    }

    /// Whose clock this instant was read from.
    pub fn frame(&self) -> Frame {
        self.frame
    }

    /// How much this instant's own clock has advanced since it.
    pub fn elapsed(&self) -> Duration {
        now_in(self.frame).at.saturating_sub(self.at)
    }

    /// `self − earlier`, or zero if `earlier` is later. Panics on frames that differ.
    pub fn duration_since(&self, earlier: Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }

    /// `self − earlier`, or zero if `earlier` is later. Panics on frames that differ.
    pub fn saturating_duration_since(&self, earlier: Instant) -> Duration {
        same_frame(self, &earlier);
        self.at.saturating_sub(earlier.at)
    }

    /// `self − earlier`, or `None` if `earlier` is later. Panics on frames that differ.
    pub fn checked_duration_since(&self, earlier: Instant) -> Option<Duration> {
        same_frame(self, &earlier);
        self.at.checked_sub(earlier.at)
    }

    pub fn checked_add(&self, d: Duration) -> Option<Instant> {
        self.at.checked_add(d).map(|at| Instant { frame: self.frame, at })
    }

    pub fn checked_sub(&self, d: Duration) -> Option<Instant> {
        self.at.checked_sub(d).map(|at| Instant { frame: self.frame, at })
    }
}

#[track_caller]
fn same_frame(a: &Instant, b: &Instant) {
    assert!(
        a.frame == b.frame,
        "instants of two clocks compared ({:?} and {:?}): a node's instants only compare with its own",
        a.frame,
        b.frame
    );
}

impl std::fmt::Debug for Instant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.frame {
            Frame::Reference => write!(f, "Instant(reference, {:?})", self.at),
            Frame::Node(n) => write!(f, "Instant(node {n}, {:?})", self.at),
        }
    }
}

impl PartialEq for Instant {
    fn eq(&self, other: &Instant) -> bool {
        same_frame(self, other);
        self.at == other.at
    }
}

impl Eq for Instant {}

impl std::hash::Hash for Instant {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.frame.hash(state);
        self.at.hash(state);
    }
}

impl PartialOrd for Instant {
    fn partial_cmp(&self, other: &Instant) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Instant {
    fn cmp(&self, other: &Instant) -> std::cmp::Ordering {
        same_frame(self, other);
        self.at.cmp(&other.at)
    }
}

impl std::ops::Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        self.checked_add(d).expect("overflow when adding duration to instant")
    }
}

impl std::ops::AddAssign<Duration> for Instant {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl std::ops::Sub<Duration> for Instant {
    type Output = Instant;
    fn sub(self, d: Duration) -> Instant {
        self.checked_sub(d).expect("overflow when subtracting duration from instant")
    }
}

impl std::ops::SubAssign<Duration> for Instant {
    fn sub_assign(&mut self, d: Duration) {
        *self = *self - d;
    }
}

impl std::ops::Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

/// One node's clock: `local(g) = anchor_local + (g − anchor_global) × rate`.
#[derive(Debug)]
struct NodeClock {
    anchor_global: Duration,
    anchor_local: Duration,
    rate_ppm: u64,
    wall_offset_ms: i64,
    /// Woken when the rate changes, so sleeps in progress follow the new rate.
    changed: Arc<Notify>,
}

impl NodeClock {
    /// The clock of an untouched node at global time `g`: it reads `g`.
    fn untouched(g: Duration) -> NodeClock {
        NodeClock {
            anchor_global: g,
            anchor_local: g,
            rate_ppm: RATE_PPM_ONE,
            wall_offset_ms: 0,
            changed: Arc::default(),
        }
    }

    fn local_at(&self, g: Duration) -> Duration {
        let since = g.saturating_sub(self.anchor_global).as_nanos();
        self.anchor_local.saturating_add(nanos(since * u128::from(self.rate_ppm) / u128::from(RATE_PPM_ONE)))
    }

    /// The first global time at which this clock reads at least `local`.
    fn global_when(&self, local: Duration) -> Duration {
        let ahead = local.saturating_sub(self.anchor_local).as_nanos();
        let scaled = (ahead * u128::from(RATE_PPM_ONE)).div_ceil(u128::from(self.rate_ppm));
        self.anchor_global.saturating_add(nanos(scaled))
    }

    /// Re-anchors at global time `g` with a new rate: continuous, so never backwards.
    fn set_rate_ppm(&mut self, g: Duration, rate_ppm: u64) {
        self.anchor_local = self.local_at(g);
        self.anchor_global = g;
        self.rate_ppm = rate_ppm;
        self.changed.notify_waiters();
    }
}

fn nanos(n: u128) -> Duration {
    let secs = u64::try_from(n / 1_000_000_000).unwrap_or(u64::MAX);
    // The remainder is below 10^9, so it fits.
    Duration::new(secs, (n % 1_000_000_000) as u32)
}

/// The node clocks of one madsim runtime, recognised by its network simulator.
struct Registry {
    owner: Weak<NetSim>,
    nodes: BTreeMap<NodeId, NodeClock>,
}

thread_local! {
    static REGISTRY: RefCell<Option<Registry>> = const { RefCell::new(None) };
}

/// Runs `f` on the current runtime's node clocks (a fresh, empty set for a runtime not seen
/// before). `None` outside a madsim runtime.
fn with_nodes<R>(f: impl FnOnce(&mut BTreeMap<NodeId, NodeClock>) -> R) -> Option<R> {
    TimeHandle::try_current()?;
    // Every runtime registers its network simulator; the `Weak` keeps the allocation, so
    // its address cannot be reused by a later runtime while we still hold it.
    let net = madsim::plugin::simulator::<NetSim>();
    REGISTRY.with(|cell| {
        let mut slot = cell.borrow_mut();
        let ours = slot.as_ref().is_some_and(|r| std::ptr::eq(r.owner.as_ptr(), Arc::as_ptr(&net)));
        if !ours {
            *slot = Some(Registry { owner: Arc::downgrade(&net), nodes: BTreeMap::new() });
        }
        slot.as_mut().map(|r| f(&mut r.nodes))
    })
}

/// The global clock's reading, as a duration since the simulation started; outside a
/// runtime, the host's monotonic clock since the first reading.
fn global_elapsed() -> Duration {
    match TimeHandle::try_current() {
        Some(time) => time.elapsed(),
        None => {
            static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
            ORIGIN.get_or_init(std::time::Instant::now).elapsed()
        }
    }
}

/// The node running the caller; `None` outside a madsim runtime.
fn current_node() -> Option<NodeId> {
    TimeHandle::try_current().map(|_| madsim::plugin::node())
}

fn now_in(frame: Frame) -> Instant {
    let g = global_elapsed();
    let at = match frame {
        Frame::Reference => g,
        Frame::Node(node) => with_nodes(|nodes| nodes.get(&node).map(|c| c.local_at(g))).flatten().unwrap_or(g),
    };
    Instant { frame, at }
}

fn current_now() -> Instant {
    match current_node() {
        Some(node) => now_in(Frame::Node(node)),
        None => now_in(Frame::Reference),
    }
}

/// Now on the reference clock (the simulation's global clock), untouched by any node.
pub fn reference_now() -> Instant {
    now_in(Frame::Reference)
}

/// Now on `node`'s clock, read from anywhere (the supervisor, an oracle).
pub fn now_on(node: NodeId) -> Instant {
    now_in(Frame::Node(node))
}

/// The global wall clock, in Unix milliseconds.
pub(crate) fn reference_wall_unix_ms() -> i64 {
    let wall = match TimeHandle::try_current() {
        Some(time) => time.now_time(),
        None => std::time::SystemTime::now(),
    };
    let since = wall.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// The wall-clock offset of the node running the caller (0 outside a runtime).
pub(crate) fn current_wall_offset_ms() -> i64 {
    current_node().map_or(0, wall_offset_ms)
}

#[track_caller]
fn control<R>(f: impl FnOnce(&mut BTreeMap<NodeId, NodeClock>, Duration) -> R) -> R {
    let g = global_elapsed();
    with_nodes(|nodes| f(nodes, g)).expect("sim_clock: the clock controls only work inside a madsim runtime")
}

/// Makes `node`'s monotonic clock run at `rate` × global time from now on (0.5: it sees
/// half the time pass). Sleeps in progress on the node follow the new rate.
///
/// # Panics
/// If `rate` is not within [`RATE_MIN`]`..=`[`RATE_MAX`], or outside a madsim runtime.
#[track_caller]
pub fn set_rate(node: NodeId, rate: f64) {
    assert!(
        rate.is_finite() && (RATE_MIN..=RATE_MAX).contains(&rate),
        "sim_clock: rate {rate} outside {RATE_MIN}..={RATE_MAX}"
    );
    // Within the bounds the product is at most 10^7: the cast is exact after rounding.
    let rate_ppm = (rate * RATE_PPM_ONE as f64).round() as u64;
    control(|nodes, g| nodes.entry(node).or_insert_with(|| NodeClock::untouched(g)).set_rate_ppm(g, rate_ppm));
}

/// The rate `node`'s monotonic clock runs at (1 for an untouched node).
pub fn rate(node: NodeId) -> f64 {
    let ppm = with_nodes(|nodes| nodes.get(&node).map(|c| c.rate_ppm)).flatten().unwrap_or(RATE_PPM_ONE);
    ppm as f64 / RATE_PPM_ONE as f64
}

/// Steps `node`'s wall clock by `delta_ms` (negative: backwards). Its monotonic clock, and
/// so every lease and sleep on it, is unaffected.
///
/// # Panics
/// If the node's accumulated offset would leave ±[`WALL_OFFSET_MS_MAX`], or outside a
/// madsim runtime.
#[track_caller]
pub fn step_wall(node: NodeId, delta_ms: i64) {
    control(|nodes, g| {
        let clock = nodes.entry(node).or_insert_with(|| NodeClock::untouched(g));
        let offset = clock.wall_offset_ms.saturating_add(delta_ms);
        assert!(
            offset.abs() <= WALL_OFFSET_MS_MAX,
            "sim_clock: wall offset {offset} ms of node {node} beyond ±{WALL_OFFSET_MS_MAX} ms"
        );
        clock.wall_offset_ms = offset;
    });
}

/// How far `node`'s wall clock is from the global one, in milliseconds (0 if untouched).
/// A [`crate::Clock`]'s own skew comes on top.
pub fn wall_offset_ms(node: NodeId) -> i64 {
    with_nodes(|nodes| nodes.get(&node).map(|c| c.wall_offset_ms)).flatten().unwrap_or(0)
}

/// Gives `node` a correct clock again: rate 1×, wall offset 0. Its monotonic reading carries
/// on from where it is (it never goes back); sleeps in progress follow the new rate.
#[track_caller]
pub fn reset(node: NodeId) {
    control(|nodes, g| {
        if let Some(clock) = nodes.get_mut(&node) {
            clock.set_rate_ppm(g, RATE_PPM_ONE);
            clock.wall_offset_ms = 0;
        }
    });
}

/// Waits until `deadline`'s clock reads at least `deadline`.
pub(crate) async fn sleep_until(deadline: Instant) {
    let time = TimeHandle::current();
    // Global instant 0 of the simulation (madsim's instants are its elapsed time).
    let origin = time.now_instant() - time.elapsed();
    let node = match deadline.frame {
        Frame::Reference => {
            global_sleep_until(&time, origin.checked_add(deadline.at)).await;
            return;
        }
        Frame::Node(node) => node,
    };
    loop {
        let g = time.elapsed();
        let plan = with_nodes(|nodes| {
            let clock = nodes.entry(node).or_insert_with(|| NodeClock::untouched(g));
            (clock.global_when(deadline.at), clock.changed.clone())
        });
        let Some((wake, changed)) = plan else { return };
        let notified = changed.notified();
        tokio::select! {
            biased;
            () = global_sleep_until(&time, origin.checked_add(wake)) => {}
            () = notified => {}
        }
        if now_in(deadline.frame).at >= deadline.at {
            return;
        }
    }
}

/// Sleeps until the global instant `at`; forever if it is beyond what an instant can hold.
async fn global_sleep_until(time: &TimeHandle, at: Option<std::time::Instant>) {
    match at {
        Some(at) => time.sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A deadline `d` from now on the current node's clock; `None` beyond what an instant holds.
pub(crate) fn deadline_in(d: Duration) -> Option<Instant> {
    Instant::now().checked_add(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock(rate_ppm: u64) -> NodeClock {
        let mut c = NodeClock::untouched(Duration::from_secs(10));
        c.set_rate_ppm(Duration::from_secs(10), rate_ppm);
        c
    }

    #[test]
    fn a_half_rate_clock_reads_half_the_global_time_from_its_anchor() {
        let c = clock(500_000);
        assert_eq!(c.local_at(Duration::from_secs(14)), Duration::from_secs(12));
        assert_eq!(c.global_when(Duration::from_secs(12)), Duration::from_secs(14));
    }

    #[test]
    fn the_global_deadline_of_a_local_reading_is_never_early() {
        for ppm in [100_000, 333_333, 700_001, 1_000_000, 1_499_999, 10_000_000] {
            let c = clock(ppm);
            for ns in [1u64, 7, 999, 1_000_001, 123_456_789_013] {
                let want = Duration::from_secs(10) + Duration::from_nanos(ns);
                let g = c.global_when(want);
                assert!(c.local_at(g) >= want, "ppm {ppm} ns {ns}");
                assert!(c.local_at(g.saturating_sub(Duration::from_nanos(1))) < want || g == c.anchor_global);
            }
        }
    }

    #[test]
    fn a_rate_change_continues_the_reading() {
        let mut c = clock(1_500_000);
        let before = c.local_at(Duration::from_secs(12));
        c.set_rate_ppm(Duration::from_secs(12), 100_000);
        assert_eq!(c.local_at(Duration::from_secs(12)), before);
        assert!(c.local_at(Duration::from_secs(13)) > before);
    }
}
