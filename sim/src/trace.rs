//! The incident trace: one JSON line per protocol event of a seed, in simulated time
//! (`cargo xtask sim replay --seed S --trace FILE.jsonl`). The schema is documented in
//! `docs/simulation.md` ("Incident trace"); [`SCHEMA`] names its version.
//!
//! Sources (all ground truth or the harness's own record; no service is asked):
//! - the oracle's store observers ([`crate::oracle::Monitor`]): every committed session
//!   end, grant, renew, release, revoke (with the new token floor) and drop of the simulation
//!   lockdb, and every fenced write paydb decided (claim, post, admission) with the presented
//!   and the stored token and the answer, recorded as they commit, on the node whose task
//!   made them;
//! - the fault schedule as the supervisor applied it ([`crate::schedule::Stage::applied`]),
//!   the fault layer's own record ([`crate::faults::Faults::record`]) and the store fault
//!   plan's record, merged in by their simulated time;
//! - the services' event seam ([`dlock_rt::events`]), for what only a service knows: each
//!   lock holder's belief about its lease (`lease_belief`: its local deadline on its own
//!   monotonic clock, renewals as it saw them, the early loss notice of its watch) and its
//!   session (`session_belief`), and the reconciler's findings (`reconciler_finding`); [`SEAM_KINDS`] only, so nothing the
//!   observers record is recorded twice. On etcd, whose lockdb has no observer, also the
//!   lock server's own sessions, grants, renewals, releases and revokes
//!   ([`LOCK_SEAM_KINDS`]), each emitted after the store committed it;
//! - the campaign's phase markers, the liveness phase's heals, and at the end of the run the
//!   rail-stub's call log, every intent row's outcome, and every failure of the seed.
//!
//! Each line's first six fields are fixed, in this order: `seq`, `t_ms`, `node`, `mono_ms`,
//! `wall_ms`, `kind`; the kind's own fields follow, sorted by name. Rendering is by hand
//! (fixed order, sorted detail map), so no map order of a JSON library can leak in.
//!
//! Invariants of this module:
//! - The same seed gives the same lines, byte for byte: every input is the seeded runtime's
//!   (simulated time, node clocks, store commits in commit order), maps are `BTreeMap`s, and
//!   nothing reads the host's clock.
//! - `seq` is 0, 1, 2, … in line order, and `t_ms` never decreases from one line to the next
//!   (checked by [`Trace::lines`], release builds too).
//! - At most [`TRACE_EVENTS_MAX`] events are kept; past it, events are counted, not kept,
//!   and the last line (`trace_end`) says how many were dropped.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use madsim::task::NodeId;
use serde_json::Value;

/// The schema's name and version, in the first line (`trace_start`). A field or kind is
/// only ever added under the same version; a renamed or removed one is a new version.
pub const SCHEMA: &str = dlock_rt::events::SCHEMA;

/// Bound on the events one trace keeps.
pub const TRACE_EVENTS_MAX: usize = 200_000;

/// Every `kind` a line may have (docs/simulation.md "Incident trace" describes each).
pub const KINDS: [&str; 28] = [
    "trace_start",
    "phase",
    "session",
    "session_closed",
    "grant",
    "renew",
    "release",
    "revoke",
    "drop",
    "fenced_write",
    "intent",
    "schedule",
    "fault",
    "store_fault",
    "heal",
    "rail_call",
    "intent_outcome",
    "failure",
    "trace_end",
    "note",
    "lease_belief",
    "reconciler_finding",
    "session_belief",
    "contradiction",
    "store_call",
    "store_answer",
    "exchange_sent",
    "exchange_done",
];

/// The kinds the trace takes from the services' event seam ([`dlock_rt::events`]). Every
/// other kind a service emits there (fenced_write, intent, rail_call, intent_outcome, and
/// the lock server's [`LOCK_SEAM_KINDS`] when lockdb is the simulation's) the trace already
/// has from its own ground-truth sources (the store observers, the rail-stub's log, the
/// intent rows), so the sink drops it: nothing is recorded twice.
pub const SEAM_KINDS: [&str; 3] = ["lease_belief", "reconciler_finding", "session_belief"];

/// The lock server's kinds on the event seam: each emitted after its store committed (a
/// session opened or heartbeat, closed; a grant, renew, release, revoke). The trace takes them
/// from the seam only when lockdb is etcd, which has no store observer; on the simulation
/// lockdb its observer records them (and the reaper's drops, which the seam does not carry).
pub const LOCK_SEAM_KINDS: [&str; 6] = ["session", "session_closed", "grant", "renew", "release", "revoke"];

/// The trace's sink on the event seam: keeps [`SEAM_KINDS`] (and [`LOCK_SEAM_KINDS`] when
/// `lock` is set), on the node whose task emitted (the service's own name for itself when
/// the trace does not know that node).
struct SeamSink {
    trace: Trace,
    lock: bool,
}

impl dlock_rt::events::Sink for SeamSink {
    fn record(&self, node: &str, kind: &'static str, fields: dlock_rt::events::Fields) {
        if SEAM_KINDS.contains(&kind) || (self.lock && LOCK_SEAM_KINDS.contains(&kind)) {
            let id = madsim::plugin::node();
            let name = self.trace.with(|s| s.names.get(&id).cloned()).unwrap_or_else(|| node.to_owned());
            self.trace.on_node_named(id, name, kind, fields);
        }
    }
}

/// The node name of events the supervisor (the harness's own task) makes.
pub const SUPERVISOR: &str = "supervisor";

/// One event before its `seq` is assigned.
#[derive(Debug, Clone)]
struct Entry {
    t_ms: u64,
    node: String,
    mono_ms: u64,
    wall_ms: i64,
    kind: &'static str,
    fields: BTreeMap<&'static str, Value>,
}

#[derive(Debug, Default)]
struct Inner {
    names: BTreeMap<NodeId, String>,
    /// The reference wall clock at simulated time 0 (Unix ms); set by [`Trace::begin`].
    wall_origin_ms: i64,
    entries: Vec<Entry>,
    dropped: u64,
    last_t_ms: u64,
}

/// A seed's incident trace, shared by the observers and the campaign (clones share it).
#[derive(Debug, Clone, Default)]
pub struct Trace(Arc<Mutex<Inner>>);

/// `i`'s reading as whole ms since its frame's origin (the scale of every `mono_ms` and of
/// a `lease_belief`'s `local_deadline_mono_ms`).
fn reading_ms(i: dlock_rt::sim_clock::Instant) -> u64 {
    i.reading_ms()
}

/// Builds a detail map from `(name, value)` pairs.
pub fn fields<const N: usize>(pairs: [(&'static str, Value); N]) -> BTreeMap<&'static str, Value> {
    pairs.into_iter().collect()
}

impl Trace {
    pub fn new() -> Trace {
        Trace::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let mut g = match self.0.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut g)
    }

    /// Inside the seed's runtime, before anything is recorded: fixes the reference wall
    /// clock's origin and writes `trace_start`.
    pub fn begin(&self, seed: u64, config: &str) {
        let t = crate::faults::now_ms();
        let wall = dlock_rt::Clock::reference().wall().timestamp_millis();
        self.with(|s| s.wall_origin_ms = wall - i64::try_from(t).unwrap_or(0));
        self.supervisor(
            "trace_start",
            fields([("schema", SCHEMA.into()), ("seed", seed.into()), ("config", config.into())]),
        );
    }

    /// Names the world's nodes (call again after adding nodes).
    pub fn name_nodes(&self, world: &crate::world::World) {
        let named: Vec<(NodeId, String)> =
            world.node_names().into_iter().filter_map(|n| world.node_id(&n).map(|id| (id, n))).collect();
        self.with(|s| s.names.extend(named));
    }

    fn name_of(&self, id: NodeId) -> String {
        self.with(|s| s.names.get(&id).cloned()).unwrap_or_else(|| format!("node-{id}"))
    }

    /// The node id of a name the trace knows.
    fn id_of(&self, name: &str) -> Option<NodeId> {
        self.with(|s| s.names.iter().find(|(_, n)| n.as_str() == name).map(|(id, _)| *id))
    }

    fn push(&self, e: Entry) {
        self.with(|s| {
            s.last_t_ms = s.last_t_ms.max(e.t_ms);
            if s.entries.len() < TRACE_EVENTS_MAX {
                s.entries.push(e);
            } else {
                s.dropped += 1;
            }
        });
    }

    /// The sink to install on the event seam for this seed (see [`SEAM_KINDS`]); install
    /// it on the thread the seed's runtime runs on. `lock_from_seam`: lockdb has no store
    /// observer (etcd), so the lock server's [`LOCK_SEAM_KINDS`] come from the seam.
    pub fn seam_sink(&self, lock_from_seam: bool) -> Arc<dyn dlock_rt::events::Sink> {
        Arc::new(SeamSink { trace: self.clone(), lock: lock_from_seam })
    }

    /// An event on `node`'s clocks, now.
    fn on_node(&self, id: NodeId, kind: &'static str, fields: BTreeMap<&'static str, Value>) {
        self.on_node_named(id, self.name_of(id), kind, fields);
    }

    /// An event on `id`'s clocks, now, under the node name `node`.
    fn on_node_named(&self, id: NodeId, node: String, kind: &'static str, fields: BTreeMap<&'static str, Value>) {
        let t_ms = crate::faults::now_ms();
        let mono_ms = reading_ms(dlock_rt::sim_clock::now_on(id));
        let origin = self.with(|s| s.wall_origin_ms);
        let wall_ms = origin + i64::try_from(t_ms).unwrap_or(0) + dlock_rt::sim_clock::wall_offset_ms(id);
        self.push(Entry { t_ms, node, mono_ms, wall_ms, kind, fields });
    }

    /// An event on the node whose task runs the caller (an observer, called in the
    /// committing service's task).
    pub fn here(&self, kind: &'static str, fields: BTreeMap<&'static str, Value>) {
        self.on_node(madsim::plugin::node(), kind, fields);
    }

    /// An event on the named node's clocks (a fault acting on it), or the supervisor's when
    /// the trace does not know the name.
    pub fn at_node(&self, name: &str, kind: &'static str, fields: BTreeMap<&'static str, Value>) {
        match self.id_of(name) {
            Some(id) => self.on_node(id, kind, fields),
            None => self.supervisor(kind, fields),
        }
    }

    /// An event of `node` (a name) at simulated `t_ms` on the reference clocks.
    fn reference(&self, t_ms: u64, node: &str, kind: &'static str, fields: BTreeMap<&'static str, Value>) {
        let origin = self.with(|s| s.wall_origin_ms);
        let wall_ms = origin + i64::try_from(t_ms).unwrap_or(0);
        self.push(Entry { t_ms, node: node.to_owned(), mono_ms: t_ms, wall_ms, kind, fields });
    }

    /// An event of the supervisor, now (reference clocks: `mono_ms` is `t_ms`).
    pub fn supervisor(&self, kind: &'static str, fields: BTreeMap<&'static str, Value>) {
        self.reference(crate::faults::now_ms(), SUPERVISOR, kind, fields);
    }

    /// An event of the supervisor at the trace's latest time (callable outside the runtime:
    /// a seed's failures, after its runtime ended).
    pub fn at_end(&self, kind: &'static str, fields: BTreeMap<&'static str, Value>) {
        let t = self.with(|s| s.last_t_ms);
        self.reference(t, SUPERVISOR, kind, fields);
    }

    /// A phase marker (`fault`, `liveness`, `checks`, `end`).
    pub fn phase(&self, phase: &str, detail: &str) {
        self.supervisor("phase", fields([("phase", phase.into()), ("detail", detail.into())]));
    }

    /// Merges the fault layer's and the store fault plan's records (they carry their own
    /// simulated times; reference clocks). The fault layer's node is the supervisor; a store
    /// fault's node is the store it hit.
    pub fn merge_fault_records(&self, world: &crate::world::World) {
        let f = world.faults();
        for r in f.record() {
            let names = |ids: &[NodeId]| Value::from(ids.iter().map(|i| f.name_of(*i)).collect::<Vec<_>>());
            let what = match &r.kind {
                crate::faults::FaultKind::Partition { id, one_way: false } => format!("partition#{id}"),
                crate::faults::FaultKind::Partition { id, one_way: true } => format!("one-way#{id}"),
                crate::faults::FaultKind::Heal { id } => format!("heal#{id}"),
                other => format!("{other:?}"),
            };
            self.reference(
                r.at_ms,
                SUPERVISOR,
                "fault",
                fields([("fault", what.into()), ("a", names(&r.a)), ("b", names(&r.b))]),
            );
        }
        if let Some(plan) = world.store_plan() {
            for r in plan.record() {
                let fault = r.decision.fault.map_or(Value::Null, |f| format!("{f:?}").into());
                self.reference(
                    r.at_ms,
                    r.store.as_str(),
                    "store_fault",
                    fields([
                        ("store", r.store.as_str().into()),
                        ("op", r.op.to_string().into()),
                        ("delay_ms", r.decision.delay_ms.into()),
                        ("fault", fault),
                    ]),
                );
            }
        }
    }

    /// A fenced write paydb decided (called under paydb's mutex, in the writer's task):
    /// `fenced_write`, and `intent` when an admission wrote the intent row.
    pub fn fenced_write(
        &self,
        t: &dlock_payment_resource::store_mem::PaydbTables,
        w: &dlock_payment_resource::store_mem::FencedWrite,
    ) {
        use dlock_payment_resource::store_mem::{FenceVerdictSeen, FencedOp};
        let (op, stored) = match w.op {
            FencedOp::Claim => ("claim", t.accounts.get(&w.account_id).map(|a| a.fence)),
            FencedOp::Post => ("post", t.accounts.get(&w.account_id).map(|a| a.fence)),
            FencedOp::Admit => ("admit", t.rail.high_water.get(&w.account_id).copied()),
        };
        let (answer, stored) = match w.verdict {
            FenceVerdictSeen::Accepted => ("accepted", stored),
            FenceVerdictSeen::FencedOut { highest_token } => ("fenced_out", Some(highest_token)),
            FenceVerdictSeen::Other => ("no_decision", stored),
        };
        let opt = |v: Option<&'static str>| v.map_or(Value::Null, Value::from);
        self.here(
            "fenced_write",
            fields([
                ("op", op.into()),
                ("payout", w.payout_id.to_string().into()),
                ("account", w.account_id.clone().into()),
                ("owner", w.owner_id.clone().into()),
                ("presented_token", w.token.into()),
                ("stored_token", stored.map_or(Value::Null, Value::from)),
                ("answer", answer.into()),
                ("admission", opt(w.admission)),
                ("fenced", w.fenced.into()),
                ("state_before", opt(w.state_before.map(|s| s.as_str()))),
                ("replay", w.replayed.is_some().into()),
            ]),
        );
        if w.admission == Some("admitted") {
            self.here(
                "intent",
                fields([
                    ("payout", w.payout_id.to_string().into()),
                    ("account", w.account_id.clone().into()),
                    ("owner", w.owner_id.clone().into()),
                    ("presented_token", w.token.into()),
                ]),
            );
        }
    }

    /// A change the simulation lockdb committed (in the lock server's task).
    pub fn lock_event(&self, e: &dlock_lock_server::store_mem::LockEvent) {
        use dlock_lock_server::store_mem::LockEvent;
        let (kind, f) = match e {
            LockEvent::SessionEnds { session_id, expires_at_ms } => (
                "session",
                fields([("session", session_id.to_string().into()), ("expires_at_ms", (*expires_at_ms).into())]),
            ),
            LockEvent::SessionClosed { session_id, now_ms } => {
                ("session_closed", fields([("session", session_id.to_string().into()), ("store_ms", (*now_ms).into())]))
            }
            LockEvent::Granted { grant, now_ms } => (
                "grant",
                fields([
                    ("key", grant.key.clone().into()),
                    ("token", grant.fencing_token.into()),
                    ("session", grant.session_id.to_string().into()),
                    ("owner", grant.owner_id.clone().into()),
                    ("expires_at_ms", grant.expires_at_ms.into()),
                    ("store_ms", (*now_ms).into()),
                ]),
            ),
            LockEvent::Renewed { key, token, expires_at_ms, .. } => (
                "renew",
                fields([
                    ("key", key.clone().into()),
                    ("token", (*token).into()),
                    ("expires_at_ms", (*expires_at_ms).into()),
                ]),
            ),
            LockEvent::Released { key, token, now_ms } => (
                "release",
                fields([("key", key.clone().into()), ("token", (*token).into()), ("store_ms", (*now_ms).into())]),
            ),
            LockEvent::Revoked { key, token, new_token_floor, now_ms } => (
                "revoke",
                fields([
                    ("key", key.clone().into()),
                    ("token", (*token).into()),
                    ("token_floor", (*new_token_floor).into()),
                    ("store_ms", (*now_ms).into()),
                ]),
            ),
            LockEvent::Dropped { key, token, now_ms } => (
                "drop",
                fields([("key", key.clone().into()), ("token", (*token).into()), ("store_ms", (*now_ms).into())]),
            ),
            // A refusal changed nothing: the lock server's own events say it to the holder.
            LockEvent::Refused { .. } => return,
        };
        self.here(kind, f);
    }

    /// A schedule event the supervisor applied (`line`: what applying it said; `SKIPPED …`
    /// when it could not be applied), on the clocks of the node it acts on.
    pub fn schedule_event(&self, event: &crate::schedule::Event, line: &str) {
        let nodes: Vec<String> = event.nodes();
        let text = match event {
            crate::schedule::Event::Fault(f) => format!("{f:?}"),
            other => format!("{other:?}"),
        };
        let f = fields([
            ("verb", event.verb().into()),
            ("fault_kind", event.kind().map_or(Value::Null, Value::from)),
            ("nodes", nodes.clone().into()),
            ("event", text.into()),
            ("result", line.into()),
            ("skipped", line.starts_with("SKIPPED").into()),
        ]);
        match nodes.first() {
            Some(n) => self.at_node(n, "schedule", f),
            None => self.supervisor("schedule", f),
        }
    }

    /// The end of the run: the rail-stub's call log (its own record, in its order; the log
    /// has no simulated time, so these lines sit at the end, each with the stub's wall
    /// reading `received_wall_ms`) and every intent row's outcome.
    pub fn end_of_run(
        &self,
        log: &dlock_contract::rail::RailCallLog,
        submissions: &[dlock_rail_proxy::store::SubmissionRow],
    ) {
        for (i, c) in log.calls.iter().enumerate() {
            self.at_node(
                "rail-stub",
                "rail_call",
                fields([
                    ("index", i.into()),
                    ("client_ref", c.client_ref.clone().into()),
                    ("amount_minor", c.amount_minor.into()),
                    ("currency", c.currency.clone().into()),
                    ("outcome", format!("{:?}", c.outcome).into()),
                    ("paid", c.paid.into()),
                    ("rail_reference", c.rail_reference.clone().map_or(Value::Null, Value::from)),
                    ("received_wall_ms", c.received_at.timestamp_millis().into()),
                ]),
            );
        }
        for r in submissions {
            self.supervisor(
                "intent_outcome",
                fields([
                    ("submission", r.submission_id.to_string().into()),
                    ("payout", r.payout_id.to_string().into()),
                    ("account", r.account_id.clone().into()),
                    ("owner", r.owner_id.clone().into()),
                    ("presented_token", r.presented_token.into()),
                    ("outcome", r.outcome.map_or(Value::Null, |o| format!("{o:?}").into())),
                    ("detail", r.outcome_detail.clone().map_or(Value::Null, Value::from)),
                    ("submitted_wall_ms", r.submitted_at.timestamp_millis().into()),
                    ("resolved_wall_ms", r.resolved_at.map_or(Value::Null, |t| t.timestamp_millis().into())),
                ]),
            );
        }
    }

    /// Every failure of the seed, at the trace's end.
    pub fn failures(&self, failures: &[crate::outcome::Failure]) {
        for f in failures {
            self.at_end(
                "failure",
                fields([
                    ("class", f.class.name().into()),
                    ("invariant", f.invariant.into()),
                    ("detail", f.detail.clone().into()),
                ]),
            );
        }
    }

    /// The lines, in simulated-time order (a stable sort: events of one ms keep the order
    /// they were recorded in), numbered, with a closing `trace_end`.
    pub fn lines(&self) -> Vec<String> {
        let (mut entries, dropped) = self.with(|s| (s.entries.clone(), s.dropped));
        entries.sort_by_key(|e| e.t_ms);
        if let Some(last) = entries.last().cloned() {
            let mut end = last;
            end.kind = "trace_end";
            end.node = SUPERVISOR.to_owned();
            end.mono_ms = end.t_ms;
            end.fields = fields([("events", entries.len().into()), ("dropped", dropped.into())]);
            entries.push(end);
        }
        let mut out = Vec::with_capacity(entries.len());
        let mut prev = 0u64;
        for (seq, e) in entries.iter().enumerate() {
            assert!(e.t_ms >= prev, "incident trace: t_ms went back at seq {seq}");
            prev = e.t_ms;
            out.push(render(seq as u64, e));
        }
        out
    }
}

/// One line: the six fixed fields in order, then the kind's fields sorted by name.
fn render(seq: u64, e: &Entry) -> String {
    let head = dlock_rt::events::LineHead {
        seq,
        t_ms: e.t_ms,
        node: &e.node,
        mono_ms: e.mono_ms,
        wall_ms: e.wall_ms,
        kind: e.kind,
    };
    dlock_rt::events::render_line(head, &e.fields)
}

/// The fields every line has, in order.
pub const REQUIRED_FIELDS: [&str; 6] = dlock_rt::events::REQUIRED_FIELDS;

/// A stable 64-bit hash of a trace's lines (FNV-1a over the bytes, a newline after each):
/// what the determinism check compares.
pub fn hash_lines(lines: &[String]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for l in lines {
        for b in l.bytes().chain(std::iter::once(b'\n')) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The first line where two traces differ (index, left, right), if any.
pub fn first_difference(a: &[String], b: &[String]) -> Option<(usize, String, String)> {
    let n = a.len().max(b.len());
    (0..n).find(|i| a.get(*i) != b.get(*i)).map(|i| {
        let get = |v: &[String]| v.get(i).cloned().unwrap_or_else(|| "<no line>".to_owned());
        (i, get(a), get(b))
    })
}
