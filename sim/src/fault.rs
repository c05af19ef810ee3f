//! The fault vocabulary: one [`Fault`] type that scenarios write, the swarm draws, the
//! shrinker edits and the mechanisms apply (docs/simulation.md, "Faults").
//!
//! - A scenario step is a fault at the cursor (`crate::scenario::Step::Fault`), written
//!   exactly as this type serializes: `action = "pause"`, `node = "executor-1"`,
//!   `for-ms = 500`. Node fields are named `node`, `from`, `to`, `a` or `b`;
//!   [`Fault::nodes`] and [`Fault::rename_nodes`] find them by those names, and
//!   [`Fault::verb`] reads the `action` tag, so neither needs an arm per variant.
//! - A fault with a `for-ms` that an undo closes (pause, crash, partition, clog without
//!   loss) is one value here; [`Fault::expand`] turns it into the primitive timeline the
//!   mechanisms play: the fault without its duration, and its undo (resume, start, heal,
//!   unclog) that long after.
//! - [`KINDS`] is the one table of the kinds the swarm draws: each row's name (as campaign
//!   summaries print it), its maximum rate per simulated minute, which faults it covers and
//!   how it draws one. [`FaultRates`] holds a rate per kind name.
//!
//! A new fault kind is a [`Fault`] variant, a [`KINDS`] row, and one arm where the
//! mechanisms apply it (`crate::schedule`'s `apply` under madsim; a real-process driver has
//! its own): `the_kind_table_and_the_fault_enum_agree` holds the table to the enum.
//!
//! Nothing here depends on madsim: the same vocabulary drives real processes.
//!
//! Invariants (asserted): every row of [`KINDS`] has a distinct name, and every fault a row
//! draws is of that row's kind and of no other's; [`FaultRates::set`] takes only a name of
//! the table; [`Fault::expand`] leaves no `for-ms` on a fault an undo closes.

use std::collections::BTreeMap;

use dlock_rt::rand::{Rng, RngCore};
use serde::{Deserialize, Serialize};

/// A stored fault class for a `store-fault`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
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

fn is_false(b: &bool) -> bool {
    !*b
}

fn one_u32() -> u32 {
    1
}

/// One fault, or the undo of one, over node names (module doc).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Fault {
    /// Freeze `node` (for `for-ms`, then resume it).
    #[serde(rename_all = "kebab-case")]
    Pause {
        node: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        for_ms: Option<u64>,
    },
    Resume {
        node: String,
    },
    /// Kill `node` abruptly, no drain (for `for-ms`, then start it).
    #[serde(rename_all = "kebab-case")]
    Crash {
        node: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        for_ms: Option<u64>,
    },
    /// Start a crashed node again through its init.
    Start {
        node: String,
    },
    /// Cut side `a` from side `b` (only `a -> b` when `one-way`), for `for-ms` or until a
    /// `heal` names it.
    #[serde(rename_all = "kebab-case")]
    Partition {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        a: Vec<String>,
        b: Vec<String>,
        #[serde(default, skip_serializing_if = "is_false")]
        one_way: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        for_ms: Option<u64>,
    },
    /// Heal the partition `name`, or every network fault and pause (and the store plan).
    Heal {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    /// Clog the link `from -> to` (both directions when `both-ways`), for `for-ms` or until
    /// an unclog; with `loss`, the link drops that fraction for `for-ms` instead.
    #[serde(rename_all = "kebab-case")]
    Clog {
        from: String,
        to: String,
        #[serde(default, skip_serializing_if = "is_false")]
        both_ways: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        loss: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        for_ms: Option<u64>,
    },
    Unclog {
        from: String,
        to: String,
    },
    /// Step `node`'s wall clock by `ms` (negative: backwards).
    SkewClock {
        node: String,
        ms: i64,
    },
    /// `node`'s monotonic clock runs at `rate` × real time (0.6: 40 % slow).
    DriftClock {
        node: String,
        rate: f64,
    },
    /// A store fault: see [`StoreFaultKind`].
    #[serde(rename_all = "kebab-case")]
    StoreFault {
        store: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        op: Option<String>,
        fault: StoreFaultKind,
        #[serde(default = "one_u32")]
        count: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        for_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        latency_ms: Option<u64>,
    },
    /// An operator revokes `key` (or a key some executor holds, chosen by the world).
    Revoke {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
    },
}

/// The fields that name nodes ([`Fault::nodes`]).
const NODE_FIELDS: [&str; 5] = ["node", "from", "to", "a", "b"];

/// Longest single `for-ms` (and a lossy link's life when a scenario gives none).
pub const FOR_MS_MAX: u64 = 3_600_000;

/// The range of a `drift-clock` rate.
pub const DRIFT_RATE_RANGE: std::ops::RangeInclusive<f64> = 0.1..=10.0;

impl Fault {
    /// The fault as its scenario table (`action` and its fields).
    pub fn table(&self) -> toml::Table {
        match toml::Table::try_from(self) {
            Ok(t) => t,
            // Every field is a string, a number, a bool or a list of strings.
            Err(e) => panic!("a fault always serializes: {e}"),
        }
    }

    /// The verb, as in scenario files (`pause`, `skew-clock`, ...).
    pub fn verb(&self) -> String {
        self.table().get("action").and_then(|v| v.as_str()).unwrap_or_default().to_owned()
    }

    /// Node names the fault acts on, in field order (`node`, `from`, `to`, `a`, `b`).
    pub fn nodes(&self) -> Vec<String> {
        let t = self.table();
        let mut out = Vec::new();
        for field in NODE_FIELDS {
            match t.get(field) {
                Some(toml::Value::String(s)) => out.push(s.clone()),
                Some(toml::Value::Array(v)) => out.extend(v.iter().filter_map(|x| x.as_str()).map(str::to_owned)),
                _ => {}
            }
        }
        out
    }

    /// The fault with every node name mapped by `rename` (`None`: the node is gone); `None`
    /// when nothing is left to act on (a single node gone, or a partition side emptied).
    pub fn rename_nodes(&self, rename: &dyn Fn(&str) -> Option<String>) -> Option<Fault> {
        let mut t = self.table();
        for field in NODE_FIELDS {
            match t.get_mut(field) {
                Some(toml::Value::String(s)) => *s = rename(s)?,
                Some(toml::Value::Array(v)) => {
                    v.retain_mut(|x| match x.as_str().and_then(rename) {
                        Some(n) => {
                            *x = toml::Value::String(n);
                            true
                        }
                        None => false,
                    });
                    if v.is_empty() {
                        return None;
                    }
                }
                _ => {}
            }
        }
        Fault::deserialize(toml::Value::Table(t)).ok()
    }

    /// The drawable kind this fault injects (a [`KINDS`] row's name); `None` for an undo
    /// (resume, start, heal, unclog).
    pub fn kind(&self) -> Option<&'static str> {
        KINDS.iter().find(|row| (row.is)(self)).map(|row| row.name)
    }

    /// The fault's `for-ms`, if it has one.
    pub fn for_ms(&self) -> Option<u64> {
        match self {
            Fault::Pause { for_ms, .. }
            | Fault::Crash { for_ms, .. }
            | Fault::Partition { for_ms, .. }
            | Fault::Clog { for_ms, .. }
            | Fault::StoreFault { for_ms, .. } => *for_ms,
            _ => None,
        }
    }

    /// Sets the fault's `for-ms` (nothing for a fault without one).
    pub fn set_for_ms(&mut self, ms: u64) {
        match self {
            Fault::Pause { for_ms, .. }
            | Fault::Crash { for_ms, .. }
            | Fault::Partition { for_ms, .. }
            | Fault::Clog { for_ms, .. }
            | Fault::StoreFault { for_ms, .. } => *for_ms = Some(ms),
            _ => {}
        }
    }

    /// Removes the fault's `for-ms`: it then lasts until an undo or a heal.
    pub fn clear_for_ms(&mut self) {
        match self {
            Fault::Pause { for_ms, .. }
            | Fault::Crash { for_ms, .. }
            | Fault::Partition { for_ms, .. }
            | Fault::Clog { for_ms, .. }
            | Fault::StoreFault { for_ms, .. } => *for_ms = None,
            _ => {}
        }
    }

    /// Whether the fault's parameters are within what the mechanisms accept (the node names
    /// are the caller's to check against its world).
    pub fn validate(&self) -> Result<(), String> {
        if let Some(ms) = self.for_ms() {
            if ms == 0 || ms > FOR_MS_MAX {
                return Err(format!("for-ms = {ms} outside 1..={FOR_MS_MAX}"));
            }
        }
        match self {
            Fault::Partition { a, b, .. } if a.is_empty() || b.is_empty() => Err("both sides need a node".into()),
            Fault::Clog { loss: Some(l), .. } if !(0.0..=1.0).contains(l) => Err("loss outside 0..=1".into()),
            Fault::DriftClock { rate, .. } if !(rate.is_finite() && DRIFT_RATE_RANGE.contains(rate)) => {
                Err(format!("rate {rate} outside {}..={}", DRIFT_RATE_RANGE.start(), DRIFT_RATE_RANGE.end()))
            }
            Fault::StoreFault { store, op, fault, count, for_ms, latency_ms } => {
                let name = crate::store_faults::StoreName::parse(store)
                    .ok_or_else(|| format!("unknown store {store:?} (paydb, lockdb)"))?;
                if let Some(op) = op {
                    if !name.ops().contains(&op.as_str()) {
                        return Err(format!("{store} has no operation {op:?} (known: {})", name.ops().join(", ")));
                    }
                }
                let ok = match fault {
                    StoreFaultKind::CommitUnknown => {
                        op.as_deref().is_some_and(|o| crate::store_faults::WRITE_OPS.contains(&o))
                    }
                    StoreFaultKind::Unavailable => op.is_some() || for_ms.is_some(),
                    StoreFaultKind::Latency => latency_ms.is_some_and(|l| l > 0) && for_ms.is_some(),
                    StoreFaultKind::LeaderLoss => name == crate::store_faults::StoreName::Lockdb && for_ms.is_some(),
                };
                if !ok || *count == 0 {
                    return Err(format!(
                        "{fault:?} needs: commit-unknown a write op; unavailable an op or for-ms; latency latency-ms and for-ms; leader-loss store = \"lockdb\" and for-ms; count >= 1"
                    ));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The primitive timeline of this fault, as `(offset_ms, fault)` in play order: a
    /// `for-ms` an undo closes becomes that undo at the offset (an unnamed timed partition
    /// is named `step-partition-N`, counting in `anon`); a clog `both-ways` is two links;
    /// a lossy clog keeps its `for-ms` (its mechanism ends it; [`FOR_MS_MAX`] without one).
    pub fn expand(&self, anon: &mut u32) -> Vec<(u64, Fault)> {
        let out = match self.clone() {
            Fault::Pause { node, for_ms: Some(ms) } => {
                vec![(0, Fault::Pause { node: node.clone(), for_ms: None }), (ms, Fault::Resume { node })]
            }
            Fault::Crash { node, for_ms: Some(ms) } => {
                vec![(0, Fault::Crash { node: node.clone(), for_ms: None }), (ms, Fault::Start { node })]
            }
            Fault::Partition { name, a, b, one_way, for_ms: Some(ms) } => {
                let name = name.or_else(|| {
                    *anon += 1;
                    Some(format!("step-partition-{anon}"))
                });
                vec![
                    (0, Fault::Partition { name: name.clone(), a, b, one_way, for_ms: None }),
                    (ms, Fault::Heal { name }),
                ]
            }
            Fault::Clog { from, to, both_ways, loss, for_ms } => {
                let mut links = vec![(from.clone(), to.clone())];
                if both_ways {
                    links.push((to, from));
                }
                let mut out = Vec::new();
                for (from, to) in links {
                    match (loss, for_ms) {
                        (Some(_), _) => out.push((
                            0,
                            Fault::Clog {
                                from,
                                to,
                                both_ways: false,
                                loss,
                                for_ms: Some(for_ms.unwrap_or(FOR_MS_MAX)),
                            },
                        )),
                        (None, for_ms) => {
                            out.push((
                                0,
                                Fault::Clog {
                                    from: from.clone(),
                                    to: to.clone(),
                                    both_ways: false,
                                    loss,
                                    for_ms: None,
                                },
                            ));
                            if let Some(ms) = for_ms {
                                out.push((ms, Fault::Unclog { from, to }));
                            }
                        }
                    }
                }
                out
            }
            other => vec![(0, other)],
        };
        for (_, f) in &out {
            assert!(!f.closed_by_undo() || f.for_ms().is_none(), "expand left a for-ms an undo closes: {f:?}");
        }
        out
    }

    /// Whether this fault's `for-ms` is played as a separate undo ([`Fault::expand`]), not
    /// by the fault's own mechanism.
    pub fn closed_by_undo(&self) -> bool {
        matches!(
            self,
            Fault::Pause { .. } | Fault::Crash { .. } | Fault::Partition { .. } | Fault::Clog { loss: None, .. }
        )
    }
}

/// What a row's draw sees: the generator, the nodes a fault may name, the rates' parameter
/// ranges, and how many partitions were drawn so far (they are named `drawn-N`).
pub struct DrawCtx<'a> {
    pub rng: &'a mut dyn RngCore,
    pub nodes: &'a [String],
    pub rates: &'a FaultRates,
    pub partitions: u32,
}

impl DrawCtx<'_> {
    fn pick(&mut self) -> String {
        self.nodes[self.rng.gen_range(0..self.nodes.len())].clone()
    }

    /// A pair of distinct nodes, when there are two.
    fn pair(&mut self) -> (String, String) {
        let a = self.rng.gen_range(0..self.nodes.len());
        let mut b = self.rng.gen_range(0..self.nodes.len());
        if self.nodes.len() > 1 && b == a {
            b = (a + 1) % self.nodes.len();
        }
        (self.nodes[a].clone(), self.nodes[b].clone())
    }

    fn store(&mut self) -> String {
        (if self.rng.gen_bool(0.5) { "paydb" } else { "lockdb" }).to_owned()
    }

    fn partition(&mut self, one_way: bool, len_ms: u64) -> Option<Fault> {
        if self.nodes.len() < 2 {
            return None;
        }
        self.partitions += 1;
        let name = format!("drawn-{}", self.partitions);
        let (a, b) = if one_way {
            let (a, b) = self.pair();
            (vec![a], vec![b])
        } else {
            // A random side against the rest.
            let mut a = Vec::new();
            let mut b = Vec::new();
            for n in self.nodes {
                if self.rng.gen_bool(0.3) {
                    a.push(n.clone())
                } else {
                    b.push(n.clone())
                }
            }
            if a.is_empty() {
                a.push(b.remove(self.rng.gen_range(0..b.len())));
            }
            if b.is_empty() {
                b.push(a.remove(self.rng.gen_range(0..a.len())));
            }
            (a, b)
        };
        Some(Fault::Partition { name: Some(name), a, b, one_way, for_ms: Some(len_ms) })
    }

    fn store_fault(&mut self, store: String, fault: StoreFaultKind, for_ms: Option<u64>) -> Fault {
        Fault::StoreFault { store, op: None, fault, count: 1, for_ms, latency_ms: None }
    }
}

/// One drawable fault kind (module doc).
pub struct KindRow {
    /// As campaign summaries and the swarm's configuration line print it.
    pub name: &'static str,
    /// Bound of the swarm's drawn rate, in events per simulated minute.
    pub rate_max_per_min: f64,
    /// Whether a fault is of this kind.
    pub is: fn(&Fault) -> bool,
    /// Draws one fault of this kind lasting `len_ms` (its duration, where it has one);
    /// `None` when the world cannot have it (a partition of one node).
    pub draw: fn(&mut DrawCtx<'_>, u64) -> Option<Fault>,
}

/// Operations whose lost ack the swarm draws (the three that have a probe, and lockdb's
/// grant and renewal).
pub const LOST_ACK_OPS: &[(&str, &str)] =
    &[("paydb", "admit"), ("paydb", "claim"), ("paydb", "post"), ("lockdb", "acquire"), ("lockdb", "renew")];

/// Every kind the swarm draws, in the order it draws them (module doc).
pub static KINDS: [KindRow; 13] = [
    KindRow {
        name: "pause",
        rate_max_per_min: 6.0,
        is: |f| matches!(f, Fault::Pause { .. }),
        draw: |c, len| Some(Fault::Pause { node: c.pick(), for_ms: Some(len) }),
    },
    KindRow {
        name: "crash",
        rate_max_per_min: 3.0,
        is: |f| matches!(f, Fault::Crash { .. }),
        draw: |c, len| Some(Fault::Crash { node: c.pick(), for_ms: Some(len) }),
    },
    KindRow {
        name: "partition",
        rate_max_per_min: 3.0,
        is: |f| matches!(f, Fault::Partition { one_way: false, .. }),
        draw: |c, len| c.partition(false, len),
    },
    KindRow {
        name: "one-way",
        rate_max_per_min: 2.0,
        is: |f| matches!(f, Fault::Partition { one_way: true, .. }),
        draw: |c, len| c.partition(true, len),
    },
    KindRow {
        name: "clog",
        rate_max_per_min: 3.0,
        is: |f| matches!(f, Fault::Clog { loss: None, .. }),
        draw: |c, len| {
            let (from, to) = c.pair();
            Some(Fault::Clog { from, to, both_ways: false, loss: None, for_ms: Some(len) })
        },
    },
    KindRow {
        name: "lossy-link",
        rate_max_per_min: 2.0,
        is: |f| matches!(f, Fault::Clog { loss: Some(_), .. }),
        draw: |c, len| {
            let (from, to) = c.pair();
            let loss = c.rng.gen_range(0.05..0.6);
            Some(Fault::Clog { from, to, both_ways: false, loss: Some(loss), for_ms: Some(len) })
        },
    },
    KindRow {
        name: "drift",
        rate_max_per_min: 2.0,
        is: |f| matches!(f, Fault::DriftClock { .. }),
        draw: |c, _| {
            let lo = c.rates.drift_rate_min.min(c.rates.drift_rate_max);
            let hi = c.rates.drift_rate_max.max(lo + 1e-6);
            let rate = c.rng.gen_range(lo..hi);
            Some(Fault::DriftClock { node: c.pick(), rate })
        },
    },
    KindRow {
        name: "skew",
        rate_max_per_min: 2.0,
        is: |f| matches!(f, Fault::SkewClock { .. }),
        draw: |c, _| {
            let bound = c.rates.skew_ms_max.max(1);
            let ms = c.rng.gen_range(-bound..=bound);
            Some(Fault::SkewClock { node: c.pick(), ms })
        },
    },
    KindRow {
        name: "store-unavailable",
        rate_max_per_min: 3.0,
        is: |f| matches!(f, Fault::StoreFault { fault: StoreFaultKind::Unavailable, .. }),
        draw: |c, len| {
            let store = c.store();
            Some(c.store_fault(store, StoreFaultKind::Unavailable, Some(len)))
        },
    },
    KindRow {
        name: "lost-ack",
        rate_max_per_min: 4.0,
        is: |f| matches!(f, Fault::StoreFault { fault: StoreFaultKind::CommitUnknown, .. }),
        draw: |c, _| {
            let (store, op) = LOST_ACK_OPS[c.rng.gen_range(0..LOST_ACK_OPS.len())];
            Some(Fault::StoreFault {
                store: store.into(),
                op: Some(op.into()),
                fault: StoreFaultKind::CommitUnknown,
                count: 1,
                for_ms: None,
                latency_ms: None,
            })
        },
    },
    KindRow {
        name: "store-latency",
        rate_max_per_min: 3.0,
        is: |f| matches!(f, Fault::StoreFault { fault: StoreFaultKind::Latency, .. }),
        draw: |c, len| {
            let store = c.store();
            let latency = c.rng.gen_range(1..=c.rates.store_latency_ms_max.max(1));
            Some(Fault::StoreFault {
                store,
                op: None,
                fault: StoreFaultKind::Latency,
                count: 1,
                for_ms: Some(len),
                latency_ms: Some(latency),
            })
        },
    },
    KindRow {
        name: "leader-loss",
        rate_max_per_min: 1.0,
        is: |f| matches!(f, Fault::StoreFault { fault: StoreFaultKind::LeaderLoss, .. }),
        draw: |c, len| Some(c.store_fault("lockdb".into(), StoreFaultKind::LeaderLoss, Some(len))),
    },
    KindRow {
        name: "revoke",
        rate_max_per_min: 2.0,
        is: |f| matches!(f, Fault::Revoke { .. }),
        draw: |_, _| Some(Fault::Revoke { key: None }),
    },
];

/// The row named `name`.
pub fn kind(name: &str) -> Option<&'static KindRow> {
    KINDS.iter().find(|r| r.name == name)
}

/// Each kind's rate (events per simulated minute; 0 or absent: never), keyed by the kind's
/// name, and the ranges drawn faults' parameters come from.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRates {
    per_min: BTreeMap<&'static str, f64>,
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
    /// No faults at all, with the default parameter ranges.
    pub fn none() -> FaultRates {
        FaultRates {
            per_min: BTreeMap::new(),
            fault_ms_min: 100,
            fault_ms_max: 10_000,
            drift_rate_min: 0.5,
            drift_rate_max: 1.5,
            skew_ms_max: 3_600_000,
            store_latency_ms_max: 2_000,
        }
    }

    /// The rate of kind `name` (0 when unset).
    pub fn get(&self, name: &str) -> f64 {
        self.per_min.get(name).copied().unwrap_or(0.0)
    }

    /// Sets the rate of kind `name`, which must be a row of [`KINDS`].
    pub fn set(&mut self, name: &str, per_min: f64) {
        let row = kind(name);
        assert!(row.is_some(), "no fault kind named {name:?}");
        if let Some(row) = row {
            self.per_min.insert(row.name, per_min);
        }
    }

    /// With kind `name` at `per_min`.
    pub fn with(mut self, name: &str, per_min: f64) -> FaultRates {
        self.set(name, per_min);
        self
    }

    /// Whether every rate is zero (a schedule drawn from it is empty).
    pub fn is_zero(&self) -> bool {
        self.per_min.values().all(|r| *r == 0.0)
    }

    /// Draws the faults of `duration_ms` over `nodes`, in [`KINDS`] order: for each kind, as
    /// many events as its rate gives (the integer part, plus one more with the fractional
    /// part's probability), each at a uniform instant and lasting a uniform time within
    /// `fault_ms_min..fault_ms_max`. Each fault keeps its `for-ms` ([`Fault::expand`]
    /// turns it into its undo). Uses only `rng`: the same seed draws the same faults.
    pub fn draw(&self, nodes: &[String], duration_ms: u64, rng: &mut dyn RngCore) -> Vec<(u64, Fault)> {
        let mut out = Vec::new();
        if nodes.is_empty() || duration_ms == 0 {
            return out;
        }
        let lo = self.fault_ms_min.min(self.fault_ms_max);
        let hi = self.fault_ms_max.max(lo + 1);
        let mut c = DrawCtx { rng, nodes, rates: self, partitions: 0 };
        for row in &KINDS {
            for _ in 0..count(c.rng, self.get(row.name), duration_ms) {
                let at = c.rng.gen_range(0..duration_ms);
                let len = c.rng.gen_range(lo..hi);
                if let Some(fault) = (row.draw)(&mut c, len) {
                    assert!((row.is)(&fault), "{} drew {fault:?}", row.name);
                    out.push((at, fault));
                }
            }
        }
        out
    }
}

/// How many events of a rate `per_min` fall in `duration_ms`: the integer part, plus one
/// more with the fractional part's probability.
fn count(rng: &mut dyn RngCore, per_min: f64, duration_ms: u64) -> u64 {
    if !(per_min.is_finite() && per_min > 0.0) {
        return 0;
    }
    let expected = per_min * duration_ms as f64 / 60_000.0;
    let whole = expected.floor();
    let extra = rng.gen_bool((expected - whole).clamp(0.0, 1.0));
    whole as u64 + u64::from(extra)
}

/// Every verb of [`Fault`], as serde lists them when it refuses an unknown one (for the
/// tests that hold the table and the scenarios to the enum: a new variant cannot be missed).
#[cfg(test)]
pub(crate) fn every_verb() -> Vec<String> {
    let mut t = toml::Table::new();
    t.insert("action".into(), toml::Value::String("no-such-verb".into()));
    let err = Fault::deserialize(toml::Value::Table(t)).map(|_| ()).expect_err("unknown verb").to_string();
    let list = err.split("expected one of").nth(1).unwrap_or_default().lines().next().unwrap_or_default();
    list.split(',').map(|v| v.trim().trim_matches('`').to_owned()).filter(|v| !v.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> Vec<String> {
        ["lock-1", "payment-1", "proxy-1", "rail-stub", "executor-1", "executor-2"].map(String::from).to_vec()
    }

    #[test]
    fn the_kind_table_and_the_fault_enum_agree() {
        // Names are distinct.
        let mut names: Vec<&str> = KINDS.iter().map(|r| r.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), KINDS.len());
        // Every row draws faults of its own kind, and of no other row's.
        let rates = KINDS.iter().fold(FaultRates::none(), |r, row| r.with(row.name, row.rate_max_per_min));
        let mut rng = dlock_rt::rand::seeded(7);
        let mut drawn_verbs = Vec::new();
        for row in &KINDS {
            let mut c = DrawCtx { rng: &mut rng, nodes: &nodes(), rates: &rates, partitions: 0 };
            for _ in 0..20 {
                let f = (row.draw)(&mut c, 500).expect("six nodes draw every kind");
                assert_eq!(KINDS.iter().filter(|r| (r.is)(&f)).count(), 1, "{f:?}");
                assert_eq!(f.kind(), Some(row.name));
                f.validate().unwrap_or_else(|e| panic!("{} drew an invalid {f:?}: {e}", row.name));
                drawn_verbs.push(f.verb());
            }
        }
        // Every verb of the enum is drawn by a row, or is an undo (which no row draws).
        let undo = ["resume", "start", "heal", "unclog"];
        let verbs = every_verb();
        assert!(verbs.len() >= 12, "{verbs:?}");
        for v in &verbs {
            assert!(drawn_verbs.contains(v) != undo.contains(&v.as_str()), "verb {v}: drawn or an undo, not both");
        }
    }

    #[test]
    fn a_fault_reads_and_writes_as_its_scenario_step() {
        let f: Fault = toml::from_str("action = \"pause\"\nnode = \"executor-1\"\nfor-ms = 500\n").expect("parses");
        assert_eq!(f, Fault::Pause { node: "executor-1".into(), for_ms: Some(500) });
        assert_eq!(f.verb(), "pause");
        assert_eq!(toml::Value::Table(f.table()).try_into::<Fault>().expect("round trip"), f);
        let p = Fault::Partition {
            name: None,
            a: vec!["a".into()],
            b: vec!["b".into(), "c".into()],
            one_way: true,
            for_ms: None,
        };
        assert_eq!(p.nodes(), ["a", "b", "c"]);
        assert_eq!(p.kind(), Some("one-way"));
        let renamed = p.rename_nodes(&|n| (n != "b").then(|| n.to_uppercase())).expect("c stays");
        assert_eq!(renamed.nodes(), ["A", "C"]);
        assert!(p.rename_nodes(&|n| (n != "a").then(|| n.to_owned())).is_none(), "side a emptied");
        assert!(toml::from_str::<Fault>("action = \"pause\"\nnode = \"x\"\nfor-sec = 1\n").is_err());
        assert!(Fault::DriftClock { node: "x".into(), rate: 0.0 }.validate().is_err());
    }

    #[test]
    fn expanding_a_timed_fault_closes_it_with_its_undo() {
        let mut anon = 0;
        let clog = Fault::Clog { from: "a".into(), to: "b".into(), both_ways: true, loss: None, for_ms: Some(10) };
        let verbs: Vec<(u64, String)> = clog.expand(&mut anon).into_iter().map(|(t, f)| (t, f.verb())).collect();
        assert_eq!(verbs, [(0, "clog".into()), (10, "unclog".into()), (0, "clog".into()), (10, "unclog".into())]);
        let p =
            Fault::Partition { name: None, a: vec!["a".into()], b: vec!["b".into()], one_way: false, for_ms: Some(5) };
        let e = p.expand(&mut anon);
        assert_eq!(e[1], (5, Fault::Heal { name: Some("step-partition-1".into()) }));
        let lossy = Fault::Clog { from: "a".into(), to: "b".into(), both_ways: false, loss: Some(0.5), for_ms: None };
        assert_eq!(lossy.expand(&mut anon)[0].1.for_ms(), Some(FOR_MS_MAX));
    }

    #[test]
    fn the_same_generator_draws_the_same_faults() {
        let rates = KINDS.iter().fold(FaultRates::none(), |r, row| r.with(row.name, 2.0));
        let draw = |seed| rates.draw(&nodes(), 120_000, &mut dlock_rt::rand::seeded(seed));
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
        assert!(FaultRates::none().draw(&nodes(), 600_000, &mut dlock_rt::rand::seeded(3)).is_empty());
    }
}
