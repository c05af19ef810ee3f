//! The timeline: one self-contained HTML file (inline CSS, SVG and a little JS; nothing is
//! fetched when it is viewed) drawn from an incident trace, the JSON-lines format of
//! `docs/simulation.md` ("Incident trace"). [`render_html`] is the whole drawing API; the
//! simulation runner (`dlock-sim replay --timeline FILE.html`) and `dlock demo` call it, and
//! the console calls it on a trace [`trace_from_events`] makes from the services' events.
//!
//! What is drawn, top to bottom, on one simulated-time axis (`t_ms`):
//! - the campaign's phases (fault, liveness, checks) as a strip;
//! - faults as shaded bands: partitions and clogs (`fault`, `schedule`), pauses and crashes
//!   of nodes that are not executors, store faults (`store_fault`) as ticks, the liveness
//!   phase's heals (`heal`) as lines;
//! - a lane per executor: its lease intervals as the lock server saw them (a `grant`, its
//!   `renew`s, and its end: `release`, `revoke`, `drop`, `session_closed`, or the expiry the
//!   grant and its renewals promised), what the executor believed (`lease_belief`, when the
//!   trace has it), its pauses and crashes (hatched), and its fenced writes with their
//!   presented and stored tokens (a fenced-out write is a red square with a cross);
//! - a lane per account: the account fence and the rail high-water mark as step lines, and
//!   each write's presented token as a dot (a fenced-out dot sits at or below the line);
//! - the rail: each intent (submitted → resolved, with its outcome) and each call the rail
//!   received, with its outcome;
//! - the invariants: each `failure`, marked (a red line over the whole picture) at the last
//!   event of the payout its detail names, else where the checks found it.
//!
//! Every mark carries its trace line: a `<title>` (the browser's tooltip) and, through the
//! script, the panel at the bottom (hover shows it, a click pins it).
//!
//! Invariants of this module:
//! - Deterministic: the same trace gives byte-identical HTML. Maps are `BTreeMap`s, numbers
//!   are printed with fixed precision, nothing reads a clock or the environment.
//! - Bounded: at most [`EVENTS_DRAWN_MAX`] events are drawn (the earliest, by drawing time);
//!   when more were drawable the picture says so and where it stops. Lanes, rows, failures
//!   and tooltips have their own bounds (the `*_MAX` constants below).
//! - Tolerant: kinds it does not know, and fields it does not know, are ignored; a known kind
//!   missing a field it needs is drawn without that part. Only a line that is not a JSON
//!   object with a numeric `t_ms` and a string `kind` is an error.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

pub mod from_events;
pub use from_events::trace_from_events;

use serde_json::{Map, Value};

/// Bound on the events drawn (the earliest by drawing time); the rest are counted.
pub const EVENTS_DRAWN_MAX: usize = 4_000;
/// Bound on the trace text accepted.
pub const INPUT_BYTES_MAX: usize = 256 * 1024 * 1024;
/// Bound on executor lanes (the rest are named as not drawn).
pub const EXECUTOR_LANES_MAX: usize = 24;
/// Bound on account lanes (accounts with fenced-out writes first, then by write count).
pub const ACCOUNT_LANES_MAX: usize = 6;
/// Bound on failures drawn.
pub const FAILURES_DRAWN_MAX: usize = 20;
/// Bound on fenced-out writes listed in the header (all are drawn in their lanes).
pub const FENCED_LISTED_MAX: usize = 8;
/// Bound on rows of the fault lane and of the rail lane (later intervals share the last).
pub const BAND_ROWS_MAX: usize = 12;
/// Bound on stacked lease rows in one executor lane.
pub const LEASE_ROWS_MAX: usize = 8;
/// Bound on the characters of one tooltip (a longer line is cut, and says so).
pub const TOOLTIP_CHARS_MAX: usize = 4_000;
/// Horizontal scale before the width bounds apply.
pub const PLOT_PX_PER_S: f64 = 24.0;
/// Bounds on the plot's width.
pub const PLOT_WIDTH_PX_MIN: f64 = 1_500.0;
pub const PLOT_WIDTH_PX_MAX: f64 = 12_000.0;

const LABEL_W_PX: f64 = 200.0;
const PAD_X_PX: f64 = 16.0;
const AXIS_H_PX: f64 = 26.0;
const PHASE_H_PX: f64 = 18.0;
const ROW_H_PX: f64 = 16.0;
const LANE_GAP_PX: f64 = 8.0;
const ACCOUNT_H_PX: f64 = 72.0;
const CHAR_W_PX: f64 = 6.4;

/// One parsed trace line.
struct Ev {
    seq: u64,
    t: u64,
    node: String,
    mono: i64,
    wall: i64,
    kind: String,
    m: Map<String, Value>,
    raw: String,
}

impl Ev {
    fn s(&self, k: &str) -> Option<&str> {
        self.m.get(k).and_then(Value::as_str)
    }
    fn u(&self, k: &str) -> Option<u64> {
        self.m.get(k).and_then(Value::as_u64)
    }
    fn i(&self, k: &str) -> Option<i64> {
        self.m.get(k).and_then(Value::as_i64)
    }
    fn b(&self, k: &str) -> Option<bool> {
        self.m.get(k).and_then(Value::as_bool)
    }
    fn strs(&self, k: &str) -> Vec<String> {
        match self.m.get(k) {
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
            Some(Value::String(s)) => vec![s.clone()],
            _ => Vec::new(),
        }
    }
    /// Simulated ms of a reading of this node's wall clock.
    fn wall_to_t(&self, wall_ms: i64) -> u64 {
        let origin = self.wall - self.t as i64;
        u64::try_from(wall_ms - origin).unwrap_or(0)
    }
    /// Simulated ms of a reading of this node's monotonic clock.
    fn mono_to_t(&self, mono_ms: i64) -> u64 {
        u64::try_from(self.t as i64 + (mono_ms - self.mono)).unwrap_or(0)
    }
}

fn parse(jsonl: &str) -> Result<Vec<Ev>, String> {
    if jsonl.len() > INPUT_BYTES_MAX {
        return Err(format!("trace is {} bytes, over the bound of {INPUT_BYTES_MAX}", jsonl.len()));
    }
    let mut out = Vec::new();
    for (n, line) in jsonl.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let m = match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(format!("line {}: not a JSON object", n + 1)),
            Err(e) => return Err(format!("line {}: not JSON: {e}", n + 1)),
        };
        let t = m.get("t_ms").and_then(Value::as_u64).ok_or_else(|| format!("line {}: no numeric t_ms", n + 1))?;
        let kind =
            m.get("kind").and_then(Value::as_str).ok_or_else(|| format!("line {}: no string kind", n + 1))?.to_owned();
        let seq = m.get("seq").and_then(Value::as_u64).unwrap_or(n as u64);
        let node = m.get("node").and_then(Value::as_str).unwrap_or("").to_owned();
        let mono = m.get("mono_ms").and_then(Value::as_i64).unwrap_or(t as i64);
        let wall = m.get("wall_ms").and_then(Value::as_i64).unwrap_or(t as i64);
        out.push(Ev { seq, t, node, mono, wall, kind, m, raw: line.to_owned() });
    }
    Ok(out)
}

/// Kinds drawn as marks (each counts against [`EVENTS_DRAWN_MAX`]).
const MARK_KINDS: [&str; 15] = [
    "grant",
    "renew",
    "release",
    "revoke",
    "drop",
    "session_closed",
    "fenced_write",
    "schedule",
    "fault",
    "store_fault",
    "heal",
    "rail_call",
    "intent_outcome",
    "lease_belief",
    "failure",
];

/// When a line is drawn: its `t_ms`, except the end-of-run records that carry their own
/// wall reading (rail calls: when the stub received them; intent outcomes: when submitted).
fn draw_t(e: &Ev) -> u64 {
    match e.kind.as_str() {
        "rail_call" => e.i("received_wall_ms").map_or(e.t, |w| e.wall_to_t(w)),
        "intent_outcome" => e.i("submitted_wall_ms").map_or(e.t, |w| e.wall_to_t(w)),
        _ => e.t,
    }
}

/// `executor-10` after `executor-9`.
fn natural_key(s: &str) -> (String, u64, String) {
    let head = s.trim_end_matches(|c: char| c.is_ascii_digit());
    let num = s[head.len()..].parse::<u64>().unwrap_or(0);
    (head.to_owned(), num, s.to_owned())
}

fn lane_of_owner(owner: &str) -> &str {
    owner.split('/').next().unwrap_or(owner)
}

fn is_executor(name: &str) -> bool {
    name.starts_with("executor")
}

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

fn tooltip(raw: &str) -> String {
    if raw.chars().count() <= TOOLTIP_CHARS_MAX {
        esc(raw)
    } else {
        let cut: String = raw.chars().take(TOOLTIP_CHARS_MAX).collect();
        format!("{}… (cut at {TOOLTIP_CHARS_MAX} characters)", esc(&cut))
    }
}

fn digits(n: u64) -> f64 {
    n.to_string().len() as f64
}

fn secs(ms: u64) -> String {
    format!("{}.{:03} s", ms / 1000, ms % 1000)
}

/// The fenced writes a failure's detail names by account and token ("account acct-0
/// accepted token 1 at its admission … after token 2"): the writes on a named account whose
/// presented token is the first token the detail names, accepted ones first.
fn token_hits(evs: &[Ev], kept: &BTreeSet<usize>, detail: &str) -> Vec<usize> {
    let token = detail.split("token ").nth(1).and_then(|r| {
        let d: String = r.chars().take_while(char::is_ascii_digit).collect();
        d.parse::<u64>().ok()
    });
    let Some(token) = token else { return Vec::new() };
    let on = |i: &usize| {
        let e = &evs[*i];
        e.kind == "fenced_write"
            && e.u("presented_token") == Some(token)
            && e.s("account").is_some_and(|a| detail.split(|c: char| c.is_whitespace() || c == ',').any(|w| w == a))
    };
    let all: Vec<usize> = kept.iter().copied().filter(on).collect();
    let accepted: Vec<usize> = all.iter().copied().filter(|i| evs[*i].s("answer") == Some("accepted")).collect();
    if accepted.is_empty() {
        all
    } else {
        accepted
    }
}

/// A lease as its holder believed it (`lease_belief` lines: `granted`, `renewed`, then
/// `early_notice`, `lost` or `released`).
struct Belief {
    lane: String,
    key: String,
    token: u64,
    start: u64,
    /// The latest local deadline, in simulated ms.
    deadline: Option<u64>,
    /// When the holder stopped believing, and the line that says so.
    end: Option<(u64, usize)>,
    idxs: Vec<usize>,
}

/// A belief line's local deadline, in simulated ms: `local_deadline_mono_ms` (or any numeric
/// field with `deadline` in its name; on the node's monotonic clock unless it says `wall`).
fn belief_deadline(e: &Ev) -> Option<u64> {
    if let Some(v) = e.i("local_deadline_mono_ms") {
        return Some(e.mono_to_t(v));
    }
    e.m.iter()
        .filter(|(k, _)| k.contains("deadline"))
        .find_map(|(k, v)| v.as_i64().map(|v| if k.contains("wall") { e.wall_to_t(v) } else { e.mono_to_t(v) }))
}

/// Whether a belief line ends the belief: `source` is `early_notice`, `lost` or `released`
/// (or the line has a `lost`/`loss` field that is set).
fn belief_ends(e: &Ev) -> bool {
    matches!(e.s("source"), Some("early_notice" | "lost" | "released"))
        || e.m
            .iter()
            .any(|(k, v)| (k == "lost" || k.contains("loss")) && !matches!(v, Value::Null | Value::Bool(false)))
}

/// A lease as the lock server saw it.
struct Lease {
    lane: String,
    key: String,
    token: u64,
    session: String,
    start: u64,
    grant_seq: usize,
    expiry: u64,
    renews: Vec<usize>,
    end: Option<(u64, &'static str, usize)>,
}

/// A node-scoped fault interval (pause, crash, clog) or a partition.
struct Band {
    what: String,
    nodes: Vec<String>,
    start: u64,
    end: Option<u64>,
    seqs: Vec<usize>,
}

struct Failure {
    idx: usize,
    at: u64,
    located: bool,
}

/// Greedy packing of intervals into rows: the first row whose last end is before `start`.
struct Rows {
    ends: Vec<f64>,
    max: usize,
}

impl Rows {
    fn new(max: usize) -> Rows {
        Rows { ends: Vec::new(), max: max.max(1) }
    }
    fn place(&mut self, start: f64, end: f64) -> usize {
        for (i, e) in self.ends.iter_mut().enumerate() {
            if *e <= start {
                *e = end;
                return i;
            }
        }
        if self.ends.len() < self.max {
            self.ends.push(end);
            return self.ends.len() - 1;
        }
        let last = self.ends.len() - 1;
        self.ends[last] = self.ends[last].max(end);
        last
    }
    fn count(&self) -> usize {
        self.ends.len().max(1)
    }
}

/// Text labels of one row that must not overlap: a label is drawn only where it fits.
#[derive(Default)]
struct LabelRow {
    end_x: f64,
}

impl LabelRow {
    fn fits(&mut self, x: f64, text: &str) -> bool {
        if x < self.end_x {
            return false;
        }
        self.end_x = x + text.chars().count() as f64 * CHAR_W_PX + 6.0;
        true
    }
}

/// Renders the incident trace `jsonl` (one JSON object per line) as one self-contained
/// HTML document. Errors only on a line that is not a JSON object with `t_ms` and `kind`
/// (module doc).
pub fn render_html(jsonl: &str) -> Result<String, String> {
    let evs = parse(jsonl)?;
    Ok(Model::build(&evs).render())
}

struct Model<'a> {
    evs: &'a [Ev],
    /// Indexes into `evs` of the lines drawn, in drawing-time order.
    kept: Vec<usize>,
    drawable: usize,
    cut_at: Option<u64>,
    t_end: u64,
    seed: Option<u64>,
    config: Option<String>,
    schema: Option<String>,
    /// The trace's axis is its writers' wall clocks (`trace_start`'s `"clock": "wall"`, a
    /// trace made from the services' events), not simulated time.
    wall_axis: bool,
    trace_dropped: u64,
    phases: Vec<(u64, String, usize)>,
    executors: Vec<String>,
    executors_hidden: Vec<String>,
    leases: Vec<Lease>,
    beliefs: Vec<Belief>,
    node_bands: Vec<Band>,
    partitions: Vec<Band>,
    schedule_ticks: Vec<usize>,
    store_ticks: Vec<usize>,
    heals: Vec<usize>,
    writes: Vec<usize>,
    accounts: Vec<String>,
    accounts_hidden: usize,
    rail_calls: Vec<usize>,
    intents: Vec<usize>,
    failures: Vec<Failure>,
    failures_total: usize,
    implicated: BTreeSet<usize>,
}

impl<'a> Model<'a> {
    fn build(evs: &'a [Ev]) -> Model<'a> {
        // The budget: mark kinds by (drawing time, seq); the first EVENTS_DRAWN_MAX are drawn.
        let mut marks: Vec<(u64, u64, usize)> = evs
            .iter()
            .enumerate()
            .filter(|(_, e)| MARK_KINDS.contains(&e.kind.as_str()) && e.kind != "failure")
            .map(|(i, e)| (draw_t(e), e.seq, i))
            .collect();
        marks.sort();
        let drawable = marks.len();
        let cut_at = (drawable > EVENTS_DRAWN_MAX).then(|| marks[EVENTS_DRAWN_MAX - 1].0);
        marks.truncate(EVENTS_DRAWN_MAX);
        let kept: Vec<usize> = marks.iter().map(|m| m.2).collect();
        assert!(kept.len() <= EVENTS_DRAWN_MAX, "timeline: more marks kept than EVENTS_DRAWN_MAX");
        let kept_set: BTreeSet<usize> = kept.iter().copied().collect();
        let limit = cut_at.unwrap_or(u64::MAX);

        let mut m = Model {
            evs,
            kept: kept.clone(),
            drawable,
            cut_at,
            t_end: 0,
            seed: None,
            config: None,
            schema: None,
            trace_dropped: 0,
            phases: Vec::new(),
            executors: Vec::new(),
            executors_hidden: Vec::new(),
            leases: Vec::new(),
            beliefs: Vec::new(),
            node_bands: Vec::new(),
            partitions: Vec::new(),
            schedule_ticks: Vec::new(),
            store_ticks: Vec::new(),
            heals: Vec::new(),
            writes: Vec::new(),
            accounts: Vec::new(),
            accounts_hidden: 0,
            rail_calls: Vec::new(),
            intents: Vec::new(),
            failures: Vec::new(),
            failures_total: 0,
            implicated: BTreeSet::new(),
            wall_axis: false,
        };

        // Lines outside the budget: the trace's own header and footer, phases, failures.
        for e in evs {
            match e.kind.as_str() {
                "trace_start" => {
                    m.seed = e.u("seed");
                    m.config = e.s("config").map(str::to_owned);
                    m.schema = e.s("schema").map(str::to_owned);
                    m.wall_axis = e.s("clock") == Some("wall");
                }
                "trace_end" => m.trace_dropped = e.u("dropped").unwrap_or(0),
                _ => {}
            }
        }
        for (i, e) in evs.iter().enumerate() {
            if e.kind == "phase" && e.t <= limit {
                m.phases.push((e.t, e.s("phase").unwrap_or("?").to_owned(), i));
            }
        }

        // Store clocks: simulated ms minus store ms, per lock-server node (the first seen
        // stands in before any is known).
        let mut first_offset: BTreeMap<&str, i64> = BTreeMap::new();
        for e in evs {
            if let Some(s) = e.i("store_ms") {
                first_offset.entry(e.node.as_str()).or_insert(e.t as i64 - s);
            }
        }
        let mut offset: BTreeMap<&str, i64> = first_offset.clone();
        let store_to_t = |offset: &BTreeMap<&str, i64>, node: &str, v: i64| -> u64 {
            u64::try_from(v + offset.get(node).copied().unwrap_or(0)).unwrap_or(0)
        };

        let mut lanes: BTreeSet<(String, u64, String)> = BTreeSet::new();
        let mut open: BTreeMap<(String, u64), usize> = BTreeMap::new();
        let mut open_beliefs: BTreeMap<(String, String, u64), usize> = BTreeMap::new();
        let mut session_expiry: BTreeMap<String, u64> = BTreeMap::new();
        let mut open_bands: BTreeMap<(String, String), usize> = BTreeMap::new();
        let mut open_parts: BTreeMap<String, usize> = BTreeMap::new();
        let mut write_count: BTreeMap<String, (usize, usize)> = BTreeMap::new();

        // Sessions are not marks, but they bound leases: every session line up to the cut.
        let mut order: Vec<usize> = kept.clone();
        order.extend(evs.iter().enumerate().filter(|(_, e)| e.kind == "session" && e.t <= limit).map(|(i, _)| i));
        order.sort_by_key(|i| (evs[*i].t, evs[*i].seq));

        for &i in &order {
            let e = &evs[i];
            m.t_end = m.t_end.max(draw_t(e));
            if let Some(s) = e.i("store_ms") {
                offset.insert(e.node.as_str(), e.t as i64 - s);
            }
            match e.kind.as_str() {
                "session" => {
                    if let (Some(s), Some(x)) = (e.s("session"), e.i("expires_at_ms")) {
                        session_expiry.insert(s.to_owned(), store_to_t(&offset, &e.node, x));
                    }
                }
                "grant" => {
                    let owner = e.s("owner").unwrap_or("?");
                    let lane = lane_of_owner(owner).to_owned();
                    lanes.insert(natural_key(&lane));
                    let key = e.s("key").unwrap_or("?").to_owned();
                    let token = e.u("token").unwrap_or(0);
                    let expiry = e.i("expires_at_ms").map_or(e.t, |x| store_to_t(&offset, &e.node, x));
                    open.insert((key.clone(), token), m.leases.len());
                    m.leases.push(Lease {
                        lane,
                        key,
                        token,
                        session: e.s("session").unwrap_or("").to_owned(),
                        start: e.t,
                        grant_seq: i,
                        expiry,
                        renews: Vec::new(),
                        end: None,
                    });
                }
                "renew" => {
                    let k = (e.s("key").unwrap_or("?").to_owned(), e.u("token").unwrap_or(0));
                    if let Some(&l) = open.get(&k) {
                        if let Some(x) = e.i("expires_at_ms") {
                            m.leases[l].expiry = store_to_t(&offset, &e.node, x);
                        }
                        m.leases[l].renews.push(i);
                    }
                }
                "release" | "revoke" | "drop" => {
                    let k = (e.s("key").unwrap_or("?").to_owned(), e.u("token").unwrap_or(0));
                    if let Some(l) = open.remove(&k) {
                        let cause = match e.kind.as_str() {
                            "release" => "released",
                            "revoke" => "revoked",
                            _ => "dropped",
                        };
                        m.leases[l].end = Some((e.t, cause, i));
                    }
                }
                "session_closed" => {
                    let s = e.s("session").unwrap_or("");
                    let ended: Vec<(String, u64)> =
                        open.iter().filter(|(_, &l)| m.leases[l].session == s).map(|(k, _)| k.clone()).collect();
                    for k in ended {
                        if let Some(l) = open.remove(&k) {
                            m.leases[l].end = Some((e.t, "session closed", i));
                        }
                    }
                }
                "lease_belief" => {
                    let lane = e.s("owner").map(lane_of_owner).unwrap_or(e.node.as_str()).to_owned();
                    lanes.insert(natural_key(&lane));
                    let k = (lane.clone(), e.s("key").unwrap_or("?").to_owned(), e.u("token").unwrap_or(0));
                    let source = e.s("source").unwrap_or("?");
                    let deadline = belief_deadline(e);
                    let ends = belief_ends(e);
                    let b = match open_beliefs.get(&k) {
                        Some(&b) if source != "granted" => b,
                        _ => {
                            open_beliefs.insert(k.clone(), m.beliefs.len());
                            m.beliefs.push(Belief {
                                lane,
                                key: k.1.clone(),
                                token: k.2,
                                start: e.t,
                                deadline: None,
                                end: None,
                                idxs: Vec::new(),
                            });
                            m.beliefs.len() - 1
                        }
                    };
                    let bl = &mut m.beliefs[b];
                    bl.idxs.push(i);
                    if let Some(d) = deadline {
                        bl.deadline = Some(bl.deadline.map_or(d, |o| o.max(d)));
                    }
                    if ends {
                        bl.end = Some((e.t, i));
                        open_beliefs.remove(&k);
                    }
                }
                "fenced_write" => {
                    if let Some(o) = e.s("owner") {
                        lanes.insert(natural_key(lane_of_owner(o)));
                    }
                    if let Some(a) = e.s("account") {
                        let c = write_count.entry(a.to_owned()).or_default();
                        c.1 += 1;
                        if e.s("answer") == Some("fenced_out") {
                            c.0 += 1;
                        }
                    }
                    m.writes.push(i);
                }
                "schedule" => {
                    m.schedule_ticks.push(i);
                    let verb = e.s("verb").unwrap_or("");
                    let nodes = e.strs("nodes");
                    let (opens, closes) = match verb {
                        "pause" => (Some("paused"), None),
                        "resume" => (None, Some("paused")),
                        "crash" => (Some("down"), None),
                        "start" => (None, Some("down")),
                        "clog" => (Some("clogged"), None),
                        "unclog" => (None, Some("clogged")),
                        _ => (None, None),
                    };
                    if e.b("skipped") == Some(true) {
                        continue;
                    }
                    if verb == "store-fault" {
                        // A store fault's window: its `for_ms`, read from the event's debug
                        // form when it has one (else the ticks of `store_fault` lines show it).
                        let ev = e.s("event").unwrap_or("");
                        let num_after = |pat: &str| {
                            ev.split(pat)
                                .nth(1)
                                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok())
                        };
                        let store = ev.split("store: \"").nth(1).and_then(|r| r.split('"').next()).unwrap_or("store");
                        if let Some(for_ms) = num_after("for_ms: Some(") {
                            m.node_bands.push(Band {
                                what: e.s("fault_kind").unwrap_or("store-fault").to_owned(),
                                nodes: vec![store.to_owned()],
                                start: e.t,
                                end: Some(e.t + for_ms),
                                seqs: vec![i],
                            });
                        }
                        continue;
                    }
                    let scope = if verb == "clog" || verb == "unclog" { nodes.join(" → ") } else { nodes.join(",") };
                    if let Some(what) = opens {
                        for n in &nodes {
                            if is_executor(n) {
                                lanes.insert(natural_key(n));
                            }
                        }
                        let k = (what.to_owned(), scope.clone());
                        if let std::collections::btree_map::Entry::Vacant(slot) = open_bands.entry(k) {
                            slot.insert(m.node_bands.len());
                            m.node_bands.push(Band {
                                what: what.to_owned(),
                                nodes,
                                start: e.t,
                                end: None,
                                seqs: vec![i],
                            });
                        }
                    } else if let Some(what) = closes {
                        if let Some(b) = open_bands.remove(&(what.to_owned(), scope)) {
                            m.node_bands[b].end = Some(e.t);
                            m.node_bands[b].seqs.push(i);
                        }
                    }
                }
                "fault" => {
                    let f = e.s("fault").unwrap_or("");
                    if let Some(id) = f.strip_prefix("heal#") {
                        if let Some(b) = open_parts.remove(id) {
                            m.partitions[b].end = Some(e.t);
                            m.partitions[b].seqs.push(i);
                        }
                    } else if !f.contains('#') {
                        // The fault layer's own record of a pause, kill, resume or restart:
                        // its line joins the band the schedule opened or closed at that time.
                        let a = e.strs("a");
                        if let Some(b) =
                            m.node_bands.iter_mut().rev().find(|b| {
                                b.nodes.iter().any(|n| a.contains(n)) && (b.start == e.t || b.end == Some(e.t))
                            })
                        {
                            b.seqs.push(i);
                        }
                    } else if let Some((what, id)) = f.split_once('#') {
                        open_parts.insert(id.to_owned(), m.partitions.len());
                        let (a, b) = (e.strs("a"), e.strs("b"));
                        let arrow = if what == "one-way" { " ↛ " } else { " ⇹ " };
                        m.partitions.push(Band {
                            what: format!("{what} {}{arrow}{}", a.join(","), b.join(",")),
                            nodes: a.into_iter().chain(b).collect(),
                            start: e.t,
                            end: None,
                            seqs: vec![i],
                        });
                    }
                }
                "store_fault" => m.store_ticks.push(i),
                "heal" => m.heals.push(i),
                "rail_call" => m.rail_calls.push(i),
                "intent_outcome" => {
                    if let Some(o) = e.s("owner") {
                        lanes.insert(natural_key(lane_of_owner(o)));
                    }
                    m.intents.push(i);
                }
                _ => {}
            }
        }
        // A lease the trace never ended is dead at its expiry (capped by its session's).
        for l in &mut m.leases {
            if let Some(s) = session_expiry.get(&l.session) {
                l.expiry = l.expiry.min(*s).max(l.start);
            }
            m.t_end = m.t_end.max(l.expiry.min(limit));
        }

        let all: Vec<String> = lanes.into_iter().map(|k| k.2).collect();
        let (shown, hidden) = all.split_at(all.len().min(EXECUTOR_LANES_MAX));
        m.executors = shown.to_vec();
        m.executors_hidden = hidden.to_vec();

        let mut accts: Vec<(String, (usize, usize))> = write_count.into_iter().collect();
        accts.sort_by(|a, b| (b.1 .0.min(1), b.1 .1).cmp(&(a.1 .0.min(1), a.1 .1)).then(a.0.cmp(&b.0)));
        m.accounts_hidden = accts.len().saturating_sub(ACCOUNT_LANES_MAX);
        let mut accounts: Vec<String> = accts.into_iter().take(ACCOUNT_LANES_MAX).map(|a| a.0).collect();
        accounts.sort_by_key(|a| natural_key(a));
        m.accounts = accounts;

        // Failures, and where each broke: the last drawn event of a payout (or submission,
        // or client reference) its detail names.
        let mut ids: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for &i in &kept_set {
            let e = &evs[i];
            for f in ["payout", "submission", "client_ref"] {
                if let Some(v) = e.s(f).filter(|v| v.len() >= 8) {
                    ids.entry(v).or_default().push(i);
                }
            }
        }
        let fails: Vec<usize> = evs.iter().enumerate().filter(|(_, e)| e.kind == "failure").map(|(i, _)| i).collect();
        m.failures_total = fails.len();
        for &i in fails.iter().take(FAILURES_DRAWN_MAX) {
            let e = &evs[i];
            let detail = format!("{} {}", e.s("detail").unwrap_or(""), e.s("invariant").unwrap_or(""));
            let mut hits: Vec<usize> = Vec::new();
            for (id, evs_of) in &ids {
                if detail.contains(id) {
                    hits.extend(evs_of.iter().copied());
                }
            }
            if hits.is_empty() {
                hits = token_hits(evs, &kept_set, &detail);
            }
            let at = hits.iter().map(|h| draw_t(&evs[*h])).filter(|t| *t <= e.t).max();
            m.implicated.extend(hits.iter().copied());
            let (at, located) = match at {
                Some(t) => (t, true),
                None => (e.t.min(m.t_end.max(e.t)), false),
            };
            if at <= limit {
                m.t_end = m.t_end.max(at);
            }
            m.failures.push(Failure { idx: i, at, located });
        }
        m
    }

    fn render(&self) -> String {
        let dur = self.t_end.max(1_000);
        let width = (dur as f64 / 1000.0 * PLOT_PX_PER_S).clamp(PLOT_WIDTH_PX_MIN, PLOT_WIDTH_PX_MAX);
        let ppm = width / dur as f64;
        let x = |t: u64| PAD_X_PX + t.min(dur) as f64 * ppm;
        let full_w = width + 2.0 * PAD_X_PX;

        // Vertical layout: (label, sublabels, y, height, kind).
        let mut y = AXIS_H_PX;
        let phase_y = y;
        y += PHASE_H_PX + 4.0;

        // Fault lane rows.
        let mut fault_rows = Rows::new(BAND_ROWS_MAX);
        let mut fault_items: Vec<(usize, &Band)> = Vec::new();
        for b in
            self.partitions.iter().chain(self.node_bands.iter().filter(|b| !b.nodes.iter().all(|n| is_executor(n))))
        {
            let s = x(b.start);
            let label_end = s + (b.what.len() as f64 + 12.0) * CHAR_W_PX;
            let e = x(b.end.unwrap_or(dur)).max(label_end);
            fault_items.push((fault_rows.place(s, e), b));
        }
        let stores: Vec<String> = self
            .store_ticks
            .iter()
            .map(|i| self.evs[*i].s("store").unwrap_or(self.evs[*i].node.as_str()).to_owned())
            .collect::<BTreeSet<String>>()
            .into_iter()
            .collect();
        let fault_y = y;
        let sched_row_y = fault_y;
        let band_rows_y = fault_y + ROW_H_PX + 2.0;
        let store_row_y = band_rows_y + fault_rows.count() as f64 * ROW_H_PX + 2.0;
        let fault_h = (store_row_y - fault_y) + stores.len() as f64 * ROW_H_PX + 4.0;
        y += fault_h + LANE_GAP_PX;

        // Executor lanes.
        struct ExecLayout {
            y: f64,
            lease_rows: usize,
            lease_y: f64,
            belief_y: f64,
            write_y: f64,
            h: f64,
        }
        let mut exec_layouts: Vec<ExecLayout> = Vec::new();
        let mut lease_row: BTreeMap<usize, usize> = BTreeMap::new();
        let mut belief_row: BTreeMap<usize, usize> = BTreeMap::new();
        let has_beliefs = !self.beliefs.is_empty();
        for lane in &self.executors {
            let mut rows = Rows::new(LEASE_ROWS_MAX);
            for (li, l) in self.leases.iter().enumerate().filter(|(_, l)| &l.lane == lane) {
                // Occupied until its end (or its expiry), plus room for the end's label.
                let end = l.end.map_or(l.expiry, |e| e.0);
                let label_px = if l.end.is_some_and(|e| e.1 == "released" && e.0 <= l.expiry) { 2.0 } else { 60.0 };
                lease_row.insert(li, rows.place(x(l.start), x(end) + label_px));
            }
            let mut brows = Rows::new(LEASE_ROWS_MAX);
            for (bi, b) in self.beliefs.iter().enumerate().filter(|(_, b)| &b.lane == lane) {
                let end = b.end.map_or(b.deadline.unwrap_or(b.start), |e| e.0).max(b.deadline.unwrap_or(0));
                belief_row.insert(bi, brows.place(x(b.start), x(end) + 70.0));
            }
            let lease_y = y + 4.0;
            let belief_y = lease_y + rows.count() as f64 * ROW_H_PX + 2.0;
            let belief_rows = if has_beliefs { brows.count() } else { 0 };
            let write_y = belief_y + belief_rows as f64 * ROW_H_PX + if has_beliefs { 2.0 } else { 0.0 };
            let h = write_y - y + 2.0 * ROW_H_PX + 8.0;
            exec_layouts.push(ExecLayout { y, lease_rows: rows.count(), lease_y, belief_y, write_y, h });
            y += h + LANE_GAP_PX;
        }
        let acct_y0 = y;
        y += self.accounts.len() as f64 * (ACCOUNT_H_PX + LANE_GAP_PX);
        let mut rail_rows = Rows::new(BAND_ROWS_MAX);
        let mut intent_row: BTreeMap<usize, usize> = BTreeMap::new();
        for &i in &self.intents {
            let e = &self.evs[i];
            let s = x(draw_t(e));
            let end = e.i("resolved_wall_ms").map_or(dur, |w| e.wall_to_t(w));
            let label = self.intent_label(e);
            intent_row.insert(i, rail_rows.place(s, x(end).max(s + label.len() as f64 * CHAR_W_PX + 8.0)));
        }
        let rail_y = y;
        let rail_h = 4.0 + ROW_H_PX + 4.0 + rail_rows.count() as f64 * ROW_H_PX + 6.0;
        y += rail_h + LANE_GAP_PX;
        let inv_y = y;
        let inv_h = 8.0 + self.failures.len().max(1) as f64 * ROW_H_PX + 6.0;
        y += inv_h;
        let height = y + 6.0;

        let mut p = String::new(); // the plot svg
        let mut l = String::new(); // the label svg
        let _ = write!(
            p,
            r#"<svg id="tl" xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" viewBox="0 0 {w:.0} {h:.0}" data-x0="{PAD_X_PX}" data-px-per-ms="{ppm:.6}" data-t-end-ms="{dur}" font-family="DejaVu Sans, Arial, sans-serif" font-size="11">"#,
            w = full_w,
            h = height
        );
        p.push_str(concat!(
            r##"<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">"##,
            r##"<rect width="6" height="6" fill="#eef0f3"/><line x1="0" y1="0" x2="0" y2="6" stroke="#9aa3af" stroke-width="2"/></pattern>"##,
            r##"<pattern id="hatch-down" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">"##,
            r##"<rect width="6" height="6" fill="#d6d9de"/><line x1="0" y1="0" x2="0" y2="6" stroke="#4b5563" stroke-width="2.5"/></pattern>"##,
            r##"<pattern id="hatch-expired" width="5" height="5" patternUnits="userSpaceOnUse" patternTransform="rotate(-45)">"##,
            r##"<rect width="5" height="5" fill="#ffffff"/><line x1="0" y1="0" x2="0" y2="5" stroke="#93b4f5" stroke-width="1.5"/></pattern></defs>"##
        ));
        let _ = write!(
            l,
            r#"<svg id="labels" xmlns="http://www.w3.org/2000/svg" width="{LABEL_W_PX}" height="{height:.0}" font-family="DejaVu Sans, Arial, sans-serif" font-size="11">"#
        );

        // Lane backgrounds first (zebra), so bands and marks sit on top.
        let bg = |p: &mut String, y: f64, h: f64, shade: bool| {
            let fill = if shade { "#f7f8fa" } else { "#ffffff" };
            let _ = write!(
                p,
                r##"<rect x="0" y="{y:.1}" width="{full_w:.1}" height="{h:.1}" fill="{fill}" stroke="#e5e7eb"/>"##
            );
        };
        bg(&mut p, fault_y, fault_h, true);
        for (n, lay) in exec_layouts.iter().enumerate() {
            bg(&mut p, lay.y, lay.h, n % 2 == 1);
        }
        for n in 0..self.accounts.len() {
            bg(&mut p, acct_y0 + n as f64 * (ACCOUNT_H_PX + LANE_GAP_PX), ACCOUNT_H_PX, true);
        }
        bg(&mut p, rail_y, rail_h, false);
        bg(&mut p, inv_y, inv_h, true);

        // Axis and grid.
        let step = [100u64, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 30_000, 60_000, 120_000, 300_000, 600_000]
            .into_iter()
            .find(|s| *s as f64 * ppm >= 70.0)
            .unwrap_or(1_200_000);
        p.push_str(r#"<g class="axis">"#);
        let mut t = 0;
        while t <= dur {
            let xx = x(t);
            let label = if step < 1_000 { format!("{:.1} s", t as f64 / 1000.0) } else { format!("{} s", t / 1000) };
            let _ = write!(
                p,
                r##"<line x1="{xx:.1}" y1="{AXIS_H_PX}" x2="{xx:.1}" y2="{height:.1}" stroke="#e5e7eb"/><text x="{xx:.1}" y="16" text-anchor="middle" fill="#374151">{label}</text>"##
            );
            t += step;
        }
        p.push_str("</g>");
        let axis = if self.wall_axis { "wall-clock time →" } else { "simulated time →" };
        let _ = write!(l, r##"<text x="8" y="16" fill="#374151" font-weight="bold">{axis}</text>"##);

        // Phases.
        let _ = write!(l, r##"<text x="8" y="{:.1}" fill="#6b7280">phase</text>"##, phase_y + 13.0);
        p.push_str(r#"<g class="lane" data-lane="phases" data-lane-kind="phases">"#);
        for (n, (t0, name, i)) in self.phases.iter().enumerate() {
            let t1 = self.phases.get(n + 1).map_or(dur, |p| p.0);
            let fill = match name.as_str() {
                "fault" => "#fde7e7",
                "liveness" => "#e3f4e8",
                "checks" => "#e8eefc",
                _ => "#f1f2f4",
            };
            let (x0, x1) = (x(*t0), x(t1));
            let _ = write!(
                p,
                r##"<g class="ev" data-seq="{}" data-kind="phase"><title>{}</title><rect x="{x0:.1}" y="{phase_y:.1}" width="{:.1}" height="{PHASE_H_PX}" fill="{fill}" stroke="#d1d5db"/>"##,
                self.evs[*i].seq,
                tooltip(&self.evs[*i].raw),
                (x1 - x0).max(1.0),
            );
            let text = format!("{name} phase");
            if x1 - x0 > text.len() as f64 * CHAR_W_PX + 8.0 {
                let _ = write!(
                    p,
                    r##"<text x="{:.1}" y="{:.1}" fill="#374151">{}</text>"##,
                    x0 + 4.0,
                    phase_y + 13.0,
                    esc(&text)
                );
            }
            p.push_str("</g>");
        }
        p.push_str("</g>");

        // Partitions: a faint band over the whole picture, under the marks.
        for b in &self.partitions {
            let (x0, x1) = (x(b.start), x(b.end.unwrap_or(dur)));
            let _ = write!(
                p,
                r##"<rect class="band-shade" x="{x0:.1}" y="{fault_y:.1}" width="{:.1}" height="{:.1}" fill="#f59e0b" opacity="0.07"/>"##,
                (x1 - x0).max(1.0),
                height - fault_y
            );
        }

        // Fault lane.
        let _ = write!(
            l,
            r##"<text x="8" y="{:.1}" font-weight="bold" fill="#111827">faults</text><text x="70" y="{:.1}" fill="#6b7280">schedule</text>"##,
            sched_row_y + 12.0,
            sched_row_y + 12.0
        );
        p.push_str(r#"<g class="lane" data-lane="faults" data-lane-kind="faults">"#);
        // Marks first, then their labels (a label drawn only where it fits), so a later
        // mark never covers an earlier label.
        let mut labels_svg = String::new();
        let mut sched_labels = LabelRow::default();
        for &i in &self.schedule_ticks {
            let e = &self.evs[i];
            let xx = x(e.t);
            let verb = match e.s("verb") {
                Some("store-fault") => e.s("fault_kind").unwrap_or("store-fault"),
                Some(v) => v,
                None => "?",
            };
            let skipped = e.b("skipped") == Some(true);
            let text = format!("{verb} {}{}", e.strs("nodes").join(","), if skipped { " (skipped)" } else { "" });
            let color = if skipped { "#9ca3af" } else { "#b45309" };
            let _ = write!(
                p,
                r##"<g class="ev" data-seq="{}" data-kind="schedule"><title>{}</title><path d="M{xx:.1} {:.1} l-4 -7 h8 z" fill="{color}"/></g>"##,
                e.seq,
                tooltip(&e.raw),
                sched_row_y + 12.0
            );
            if sched_labels.fits(xx + 5.0, &text) {
                let _ = write!(
                    labels_svg,
                    r##"<text x="{:.1}" y="{:.1}" fill="{color}">{}</text>"##,
                    xx + 5.0,
                    sched_row_y + 12.0,
                    esc(text.trim_end())
                );
            }
        }
        for (row, b) in &fault_items {
            let yy = band_rows_y + *row as f64 * ROW_H_PX;
            let (x0, x1) = (x(b.start), x(b.end.unwrap_or(dur)));
            let first = b.seqs[0];
            let (fill, stroke) = match b.what.as_str() {
                "paused" => ("url(#hatch)", "#6b7280"),
                "down" => ("url(#hatch-down)", "#374151"),
                w if w.starts_with("store") || w == "lost-ack" || w == "leader-loss" => ("#fecaca", "#dc2626"),
                _ => ("#fcd9a8", "#d97706"),
            };
            let label = if b.what.contains(' ') {
                b.what.clone()
            } else {
                format!("{} {}", b.nodes.join(if b.what == "clogged" { " → " } else { "," }), b.what)
            };
            let len = b.end.map_or("until the end".to_owned(), |e| secs(e.saturating_sub(b.start)));
            let _ = write!(
                p,
                r##"<g class="ev band" data-seq="{}" data-kind="{}" data-band="{}"><title>{}</title><rect x="{x0:.1}" y="{yy:.1}" width="{:.1}" height="{:.1}" fill="{fill}" stroke="{stroke}" rx="2"/><text x="{:.1}" y="{:.1}" fill="#111827">{} ({len})</text></g>"##,
                self.evs[first].seq,
                esc(&self.evs[first].kind),
                esc(&b.what),
                self.band_tooltip(b),
                (x1 - x0).max(2.0),
                ROW_H_PX - 3.0,
                x0 + 3.0,
                yy + 11.0,
                esc(&label)
            );
        }
        for (n, store) in stores.iter().enumerate() {
            let ry = store_row_y + n as f64 * ROW_H_PX;
            let _ = write!(l, r##"<text x="70" y="{:.1}" fill="#6b7280">{} faults</text>"##, ry + 11.0, esc(store));
            let mut store_labels = LabelRow::default();
            let mut last_label_t: Option<(u64, String)> = None;
            for &i in &self.store_ticks {
                let e = &self.evs[i];
                if e.s("store").unwrap_or(e.node.as_str()) != store.as_str() {
                    continue;
                }
                let xx = x(e.t);
                let fault = e.s("fault");
                let delay = e.u("delay_ms").unwrap_or(0);
                let w = (delay as f64 * ppm).max(2.0);
                let (color, opacity) = if fault.is_some() { ("#dc2626", "0.9") } else { ("#f59e0b", "0.35") };
                let _ = write!(
                    p,
                    r##"<g class="ev" data-seq="{}" data-kind="store_fault"><title>{}</title><rect x="{xx:.1}" y="{:.1}" width="{w:.1}" height="{:.1}" fill="{color}" opacity="{opacity}"/></g>"##,
                    e.seq,
                    tooltip(&e.raw),
                    ry + 2.0,
                    ROW_H_PX - 5.0
                );
                // One label per run of alike faults (a gap of a second ends a run).
                let text = match fault {
                    Some(f) => format!("{f} ({})", e.s("op").unwrap_or("?")),
                    None => format!("+{delay} ms latency"),
                };
                let same_run = last_label_t.as_ref().is_some_and(|(t, s)| *s == text && e.t < t + 1_000);
                if !same_run && store_labels.fits(xx + 3.0, &text) {
                    let _ = write!(
                        labels_svg,
                        r##"<text x="{:.1}" y="{:.1}" fill="#7f1d1d" font-size="10">{}</text>"##,
                        xx + 3.0,
                        ry + 11.0,
                        esc(&text)
                    );
                }
                last_label_t = Some((e.t, text));
            }
        }
        p.push_str(&labels_svg);
        p.push_str("</g>");

        // Heals: a dashed green line over the picture.
        for &i in &self.heals {
            let e = &self.evs[i];
            let xx = x(e.t);
            let _ = write!(
                p,
                r##"<g class="ev" data-seq="{}" data-kind="heal"><title>{}</title><line x1="{xx:.1}" y1="{fault_y:.1}" x2="{xx:.1}" y2="{height:.1}" stroke="#16a34a" stroke-dasharray="4 3" stroke-width="1.5"/><text x="{:.1}" y="{:.1}" fill="#15803d">heal all</text></g>"##,
                e.seq,
                tooltip(&e.raw),
                xx + 3.0,
                sched_row_y + 24.0 + fault_rows.count() as f64 * ROW_H_PX
            );
        }

        // Executor lanes.
        for (lane, lay) in self.executors.iter().zip(&exec_layouts) {
            let _ = write!(
                l,
                r##"<g data-lane-label="{n}"><text x="8" y="{:.1}" font-weight="bold" fill="#111827">{n}</text><text x="110" y="{:.1}" fill="#6b7280">lease (server)</text>"##,
                lay.y + 14.0,
                lay.lease_y + 11.0,
                n = esc(lane)
            );
            if has_beliefs {
                let _ = write!(
                    l,
                    r##"<text x="110" y="{:.1}" fill="#6b7280">lease (believed)</text>"##,
                    lay.belief_y + 11.0
                );
            }
            let _ = write!(l, r##"<text x="110" y="{:.1}" fill="#6b7280">writes</text></g>"##, lay.write_y + 15.0);
            let _ = write!(p, r#"<g class="lane" data-lane="{}" data-lane-kind="executor">"#, esc(lane));
            // Pauses and crashes of this executor: hatched under everything else.
            for b in self.node_bands.iter().filter(|b| b.nodes.iter().any(|n| n == lane)) {
                let (x0, x1) = (x(b.start), x(b.end.unwrap_or(dur)));
                let fill = if b.what == "down" { "url(#hatch-down)" } else { "url(#hatch)" };
                let len = b.end.map_or("until the end".to_owned(), |e| secs(e.saturating_sub(b.start)));
                let first = b.seqs[0];
                let _ = write!(
                    p,
                    r##"<g class="ev band" data-seq="{}" data-kind="schedule" data-band="{}"><title>{}</title><rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{fill}" opacity="0.9"/><text x="{:.1}" y="{:.1}" fill="#111827" font-weight="bold">{} {len}</text></g>"##,
                    self.evs[first].seq,
                    esc(&b.what),
                    self.band_tooltip(b),
                    lay.y + 1.0,
                    (x1 - x0).max(2.0),
                    lay.h - 2.0,
                    x0 + 4.0,
                    lay.y + lay.h - 4.0,
                    if b.what == "down" { "down" } else { "PAUSED" }
                );
            }
            let mut lease_labels: Vec<LabelRow> = (0..lay.lease_rows).map(|_| LabelRow::default()).collect();
            for (li, ls) in self.leases.iter().enumerate().filter(|(_, ls)| &ls.lane == lane) {
                let row = lease_row.get(&li).copied().unwrap_or(0);
                let yy = lay.lease_y + row as f64 * ROW_H_PX;
                self.draw_lease(&mut p, ls, yy, &x, dur, &mut lease_labels[row.min(lay.lease_rows - 1)]);
            }
            if has_beliefs {
                let mut labels = LabelRow::default();
                for (bi, b) in self.beliefs.iter().enumerate().filter(|(_, b)| &b.lane == lane) {
                    let row = belief_row.get(&bi).copied().unwrap_or(0);
                    self.draw_belief(&mut p, b, lay.belief_y + row as f64 * ROW_H_PX, &x, dur, &mut labels);
                }
            }
            let mut write_labels = LabelRow::default();
            let mut fenced_labels = LabelRow::default();
            for &i in &self.writes {
                let e = &self.evs[i];
                if e.s("owner").map(lane_of_owner) != Some(lane.as_str()) {
                    continue;
                }
                self.draw_write(&mut p, i, lay.write_y, &x, &mut write_labels, &mut fenced_labels);
            }
            p.push_str("</g>");
        }

        // Account lanes.
        for (n, acct) in self.accounts.iter().enumerate() {
            let ay = acct_y0 + n as f64 * (ACCOUNT_H_PX + LANE_GAP_PX);
            let _ = write!(
                l,
                r##"<g data-lane-label="account {a}"><text x="8" y="{:.1}" font-weight="bold" fill="#111827">account {a}</text><line x1="8" x2="26" y1="{:.1}" y2="{:.1}" stroke="#1d4ed8" stroke-width="2.5"/><text x="30" y="{:.1}" fill="#374151">account fence</text><line x1="8" x2="26" y1="{:.1}" y2="{:.1}" stroke="#7c3aed" stroke-width="2.5" stroke-dasharray="5 3"/><text x="30" y="{:.1}" fill="#374151">rail high-water mark</text><circle cx="17" cy="{:.1}" r="4" fill="#dc2626"/><text x="30" y="{:.1}" fill="#374151">presented token</text></g>"##,
                ay + 14.0,
                ay + 27.0,
                ay + 27.0,
                ay + 31.0,
                ay + 41.0,
                ay + 41.0,
                ay + 45.0,
                ay + 55.0,
                ay + 59.0,
                a = esc(acct)
            );
            self.draw_account(&mut p, acct, ay, &x, dur);
        }

        // Rail lane.
        let _ = write!(
            l,
            r##"<g data-lane-label="rail"><text x="8" y="{:.1}" font-weight="bold" fill="#111827">rail</text><text x="70" y="{:.1}" fill="#6b7280">calls received</text><text x="70" y="{:.1}" fill="#6b7280">intents (proxy)</text></g>"##,
            rail_y + 14.0,
            rail_y + 14.0,
            rail_y + 14.0 + ROW_H_PX + 4.0
        );
        p.push_str(r#"<g class="lane" data-lane="rail" data-lane-kind="rail">"#);
        let mut call_labels = LabelRow::default();
        for &i in &self.rail_calls {
            let e = &self.evs[i];
            let xx = x(draw_t(e));
            let outcome = e.s("outcome").unwrap_or("?");
            let paid = e.b("paid") == Some(true);
            let color = if paid {
                "#15803d"
            } else if outcome.contains("Decline") {
                "#6b7280"
            } else {
                "#ea580c"
            };
            let text = format!("{}{}", outcome, if paid { " (paid)" } else { "" });
            let _ = write!(
                p,
                r##"<g class="ev{}" data-seq="{}" data-kind="rail_call" data-outcome="{}"><title>{}</title><rect x="{:.1}" y="{:.1}" width="8" height="10" fill="{color}" rx="1"/>"##,
                if self.implicated.contains(&i) { " implicated" } else { "" },
                e.seq,
                esc(outcome),
                tooltip(&e.raw),
                xx - 4.0,
                rail_y + 5.0
            );
            if call_labels.fits(xx + 6.0, &text) {
                let _ = write!(
                    p,
                    r##"<text x="{:.1}" y="{:.1}" fill="{color}">{}</text>"##,
                    xx + 6.0,
                    rail_y + 14.0,
                    esc(&text)
                );
            }
            p.push_str("</g>");
        }
        let intents_y = rail_y + 4.0 + ROW_H_PX + 4.0;
        for &i in &self.intents {
            let e = &self.evs[i];
            let row = intent_row.get(&i).copied().unwrap_or(0);
            let yy = intents_y + row as f64 * ROW_H_PX;
            let x0 = x(draw_t(e));
            let resolved = e.i("resolved_wall_ms").map(|w| e.wall_to_t(w));
            let x1 = x(resolved.unwrap_or(dur));
            let outcome = e.s("outcome");
            let (fill, stroke) = match outcome {
                None => ("url(#hatch)", "#dc2626"),
                Some(o) if o.contains("Ack") => ("#bbf7d0", "#15803d"),
                Some(o) if o.contains("Ambig") || o.contains("Timeout") => ("#fed7aa", "#ea580c"),
                Some(_) => ("#e5e7eb", "#6b7280"),
            };
            let _ = write!(
                p,
                r##"<g class="ev{}" data-seq="{}" data-kind="intent_outcome" data-outcome="{}"><title>{}</title><rect x="{x0:.1}" y="{yy:.1}" width="{:.1}" height="{:.1}" fill="{fill}" stroke="{stroke}" rx="2"/><text x="{:.1}" y="{:.1}" fill="#111827">{}</text></g>"##,
                if self.implicated.contains(&i) { " implicated" } else { "" },
                e.seq,
                esc(outcome.unwrap_or("unresolved")),
                tooltip(&e.raw),
                (x1 - x0).max(3.0),
                ROW_H_PX - 3.0,
                x0 + 3.0,
                yy + 10.5,
                esc(&self.intent_label(e))
            );
        }
        p.push_str("</g>");

        // Invariants.
        let _ = write!(
            l,
            r##"<g data-lane-label="invariants"><text x="8" y="{:.1}" font-weight="bold" fill="#111827">invariants</text></g>"##,
            inv_y + 16.0
        );
        p.push_str(r#"<g class="lane" data-lane="invariants" data-lane-kind="invariants">"#);
        if self.failures.is_empty() {
            let _ = write!(
                p,
                r##"<text x="{:.1}" y="{:.1}" fill="#15803d">no invariant broke</text>"##,
                PAD_X_PX + 4.0,
                inv_y + 18.0
            );
        }
        for (n, f) in self.failures.iter().enumerate() {
            let e = &self.evs[f.idx];
            let xx = x(f.at);
            let yy = inv_y + 8.0 + n as f64 * ROW_H_PX;
            let inv = e.s("invariant").unwrap_or("?");
            let text = format!(
                "✖ {} broke{}: {}",
                inv,
                if f.located { "" } else { " (found by the end-of-run checks)" },
                e.s("detail").unwrap_or("")
            );
            let text: String = text.chars().take(220).collect();
            let anchor_end = xx > PAD_X_PX + width * 0.5;
            let _ = write!(
                p,
                r##"<g class="ev failure" data-seq="{}" data-kind="failure" data-invariant="{}"><title>{}</title><line x1="{xx:.1}" y1="{fault_y:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#dc2626" stroke-width="2"/><path d="M{xx:.1} {:.1} l6 6 l-6 6 l-6 -6 z" fill="#dc2626"/><text x="{:.1}" y="{:.1}" fill="#991b1b" font-weight="bold" text-anchor="{}">{}</text></g>"##,
                e.seq,
                esc(inv),
                tooltip(&e.raw),
                yy + 12.0,
                yy,
                if anchor_end { xx - 9.0 } else { xx + 9.0 },
                yy + 10.0,
                if anchor_end { "end" } else { "start" },
                esc(&text)
            );
        }
        p.push_str("</g>");
        // The time cursor (moved by the script).
        let _ = write!(
            p,
            r##"<g id="cursor" visibility="hidden"><line id="cursor-line" x1="0" x2="0" y1="{AXIS_H_PX}" y2="{height:.1}" stroke="#111827" stroke-width="1" stroke-dasharray="2 2"/><rect id="cursor-bg" x="0" y="{:.1}" width="74" height="14" fill="#111827" rx="2"/><text id="cursor-text" x="0" y="{:.1}" fill="#ffffff" font-size="10"></text></g>"##,
            AXIS_H_PX - 2.0,
            AXIS_H_PX + 9.0
        );
        p.push_str("</svg>");
        l.push_str("</svg>");
        self.page(&l, &p)
    }

    fn band_tooltip(&self, b: &Band) -> String {
        let lines: Vec<&str> = b.seqs.iter().map(|i| self.evs[*i].raw.as_str()).collect();
        tooltip(&lines.join("\n"))
    }

    fn intent_label(&self, e: &Ev) -> String {
        format!(
            "{} t{} {}",
            e.s("owner").unwrap_or("?"),
            e.u("presented_token").map_or("?".to_owned(), |t| t.to_string()),
            e.s("outcome").unwrap_or("unresolved")
        )
    }

    fn draw_lease(&self, p: &mut String, ls: &Lease, yy: f64, x: &dyn Fn(u64) -> f64, dur: u64, labels: &mut LabelRow) {
        let g = &self.evs[ls.grant_seq];
        let x0 = x(ls.start);
        let (solid_end, tail, cause) = match ls.end {
            Some((t, cause, _)) if t <= ls.expiry => (t, None, cause),
            // Dead at its expiry; the server removed it later.
            Some((t, "dropped", _)) => (ls.expiry, Some(t), "expired"),
            Some((t, cause, _)) => (ls.expiry, Some(t), cause),
            None if ls.expiry >= dur && self.cut_at.is_some() => (dur, None, "past the drawn window"),
            None => (ls.expiry, None, "expired"),
        };
        let x1 = x(solid_end).max(x0 + 2.0);
        let mut lines = vec![g.raw.as_str()];
        lines.extend(ls.renews.iter().map(|i| self.evs[*i].raw.as_str()));
        if let Some((_, _, i)) = ls.end {
            lines.push(self.evs[i].raw.as_str());
        }
        let h = ROW_H_PX - 3.0;
        let _ = write!(
            p,
            r##"<g class="ev lease" data-seq="{}" data-kind="grant" data-key="{}" data-token="{}" data-end="{}"><title>{}</title><rect x="{x0:.1}" y="{yy:.1}" width="{:.1}" height="{h:.1}" fill="#3b82f6" rx="2"/>"##,
            g.seq,
            esc(&ls.key),
            ls.token,
            esc(cause),
            tooltip(&lines.join("\n")),
            x1 - x0
        );
        if let Some(te) = tail {
            // Dead at its expiry, removed later: the gap is hatched.
            let xt = x(te);
            let _ = write!(
                p,
                r##"<rect x="{x1:.1}" y="{yy:.1}" width="{:.1}" height="{h:.1}" fill="url(#hatch-expired)" stroke="#93b4f5" stroke-width="0.8"/>"##,
                (xt - x1).max(1.0)
            );
        }
        for i in &ls.renews {
            let xr = x(self.evs[*i].t);
            let _ = write!(
                p,
                r##"<line x1="{xr:.1}" x2="{xr:.1}" y1="{:.1}" y2="{:.1}" stroke="#1e3a8a" stroke-width="1"/>"##,
                yy + 2.0,
                yy + h - 2.0
            );
        }
        let cap_color = match cause {
            "revoked" => "#dc2626",
            "dropped" | "session closed" => "#ea580c",
            "expired" => "#f59e0b",
            _ => "#1e3a8a",
        };
        let xe = x(tail.unwrap_or(solid_end));
        let _ = write!(
            p,
            r##"<rect x="{:.1}" y="{:.1}" width="3" height="{:.1}" fill="{cap_color}"/>"##,
            xe - 1.5,
            yy - 1.0,
            h + 2.0
        );
        let text = format!("{} token {}", ls.key, ls.token);
        if x1 - x0 > text.len() as f64 * CHAR_W_PX + 6.0 {
            let _ =
                write!(p, r##"<text x="{:.1}" y="{:.1}" fill="#ffffff">{}</text>"##, x0 + 3.0, yy + 10.5, esc(&text));
        } else if x1 - x0 > (7.0 + digits(ls.token)) * CHAR_W_PX + 4.0 {
            let _ = write!(
                p,
                r##"<text x="{:.1}" y="{:.1}" fill="#ffffff">token {}</text>"##,
                x0 + 3.0,
                yy + 10.5,
                ls.token
            );
        } else if x1 - x0 > 4.0 * CHAR_W_PX + 6.0 {
            let _ =
                write!(p, r##"<text x="{:.1}" y="{:.1}" fill="#ffffff">t{}</text>"##, x0 + 2.0, yy + 10.5, ls.token);
        }
        let end_text = match cause {
            "released" => String::new(),
            c => c.to_owned(),
        };
        if !end_text.is_empty() && labels.fits(xe + 3.0, &end_text) {
            let _ = write!(
                p,
                r##"<text x="{:.1}" y="{:.1}" fill="{cap_color}">{}</text>"##,
                xe + 3.0,
                yy + 10.5,
                esc(&end_text)
            );
        }
        labels.end_x = labels.end_x.max(xe);
        p.push_str("</g>");
    }

    /// A belief: a dashed amber bar from `granted` to the local deadline (or to the notice
    /// that ended it, when earlier); a notice after the deadline (a holder that was frozen
    /// learns late) is a dotted line from the deadline to the notice.
    fn draw_belief(
        &self,
        p: &mut String,
        b: &Belief,
        yy: f64,
        x: &dyn Fn(u64) -> f64,
        dur: u64,
        labels: &mut LabelRow,
    ) {
        let x0 = x(b.start);
        let deadline = b.deadline.unwrap_or(b.start);
        let (end_t, source) = match b.end {
            Some((t, i)) => (Some(t), self.evs[i].s("source").unwrap_or("lost")),
            None => (None, "believed"),
        };
        let solid_end = end_t.map_or(deadline, |t| t.min(deadline)).min(dur);
        let x1 = x(solid_end).max(x0 + 2.0);
        let lines: Vec<&str> = b.idxs.iter().map(|i| self.evs[*i].raw.as_str()).collect();
        let first = &self.evs[b.idxs[0]];
        let h = ROW_H_PX - 4.0;
        let _ = write!(
            p,
            r##"<g class="ev belief" data-seq="{}" data-kind="lease_belief" data-key="{}" data-token="{}" data-end="{}"><title>{}</title><rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="#fef3c7" stroke="#d97706" stroke-dasharray="3 2" rx="2"/>"##,
            first.seq,
            esc(&b.key),
            b.token,
            esc(source),
            tooltip(&lines.join("\n")),
            yy + 1.0,
            x1 - x0
        );
        if x1 - x0 > (7.0 + digits(b.token)) * CHAR_W_PX + 4.0 {
            let _ = write!(
                p,
                r##"<text x="{:.1}" y="{:.1}" fill="#92400e">token {}</text>"##,
                x0 + 3.0,
                yy + 10.0,
                b.token
            );
        }
        // The deadline itself: a bar end.
        if b.deadline.is_some() {
            let xd = x(deadline);
            let _ = write!(
                p,
                r##"<line x1="{xd:.1}" x2="{xd:.1}" y1="{:.1}" y2="{:.1}" stroke="#b45309" stroke-width="2"/>"##,
                yy,
                yy + ROW_H_PX - 2.0
            );
        }
        let (text, color, xe) = match end_t {
            Some(t) if t > deadline && b.deadline.is_some() => {
                let xt = x(t);
                let _ = write!(
                    p,
                    r##"<line x1="{x1:.1}" x2="{xt:.1}" y1="{:.1}" y2="{:.1}" stroke="#dc2626" stroke-width="1.5" stroke-dasharray="2 3"/>"##,
                    yy + h / 2.0 + 1.0,
                    yy + h / 2.0 + 1.0
                );
                (format!("{source} {} after its deadline", secs(t - deadline)), "#dc2626", xt)
            }
            Some(_) if source == "released" => (String::new(), "#92400e", x1),
            Some(_) => (source.replace('_', " "), "#dc2626", x1),
            None => (String::new(), "#92400e", x1),
        };
        if end_t.is_some() && source != "released" {
            let _ = write!(p, r##"<path d="M{xe:.1} {:.1} l5 9 h-10 z" fill="{color}"/>"##, yy + 1.0);
        }
        if !text.is_empty() && labels.fits(xe + 6.0, &text) {
            let _ =
                write!(p, r##"<text x="{:.1}" y="{:.1}" fill="{color}">{}</text>"##, xe + 6.0, yy + 10.0, esc(&text));
        }
        p.push_str("</g>");
    }

    fn draw_write(
        &self,
        p: &mut String,
        i: usize,
        yy: f64,
        x: &dyn Fn(u64) -> f64,
        labels: &mut LabelRow,
        fenced_labels: &mut LabelRow,
    ) {
        let e = &self.evs[i];
        let xx = x(e.t);
        let answer = e.s("answer").unwrap_or("?");
        let op = e.s("op").unwrap_or("?");
        let presented = e.u("presented_token").map_or("?".to_owned(), |t| t.to_string());
        let stored = e.u("stored_token").map_or("-".to_owned(), |t| t.to_string());
        let implicated = if self.implicated.contains(&i) { " implicated" } else { "" };
        let _ = write!(
            p,
            r##"<g class="ev write{implicated}" data-seq="{}" data-kind="fenced_write" data-op="{}" data-answer="{}" data-presented="{presented}" data-stored="{stored}"><title>{}</title>"##,
            e.seq,
            esc(op),
            esc(answer),
            tooltip(&e.raw)
        );
        let cy = yy + 7.0;
        match answer {
            "fenced_out" => {
                // Their own row, under the accepted ones: they must not hide behind them.
                let cy = cy + ROW_H_PX;
                let _ = write!(
                    p,
                    r##"<rect x="{:.1}" y="{:.1}" width="12" height="12" fill="#dc2626" rx="1"/><path d="M{:.1} {:.1} l6 6 M{:.1} {:.1} l-6 6" stroke="#ffffff" stroke-width="2"/>"##,
                    xx - 6.0,
                    cy - 6.0,
                    xx - 3.0,
                    cy - 3.0,
                    xx + 3.0,
                    cy - 3.0
                );
                let text = format!("FENCED OUT: {op} token {presented} ≤ {stored}");
                if fenced_labels.fits(xx + 9.0, &text) {
                    let _ = write!(
                        p,
                        r##"<text x="{:.1}" y="{:.1}" fill="#b91c1c" font-weight="bold">{}</text>"##,
                        xx + 9.0,
                        cy + 4.0,
                        esc(&text)
                    );
                }
            }
            "accepted" => {
                let fence_off = e.b("fenced") == Some(false);
                if fence_off {
                    // Taken with the resource's fence switched off: nothing checked it.
                    let _ = write!(
                        p,
                        r##"<circle cx="{xx:.1}" cy="{cy:.1}" r="5" fill="#f97316" stroke="#7c2d12" stroke-width="1.5"/>"##
                    );
                } else {
                    let _ = write!(p, r##"<circle cx="{xx:.1}" cy="{cy:.1}" r="5" fill="#16a34a"/>"##);
                }
                let text = format!("{op} {presented}{}", if fence_off { " (fence off)" } else { "" });
                if labels.fits(xx + 7.0, &text) {
                    let _ = write!(
                        p,
                        r##"<text x="{:.1}" y="{:.1}" fill="#166534">{}</text>"##,
                        xx + 7.0,
                        cy + 4.0,
                        esc(&text)
                    );
                }
            }
            _ => {
                let _ = write!(
                    p,
                    r##"<circle cx="{xx:.1}" cy="{cy:.1}" r="4.5" fill="#ffffff" stroke="#6b7280" stroke-width="1.5"/>"##
                );
            }
        }
        p.push_str("</g>");
    }

    fn draw_account(&self, p: &mut String, acct: &str, ay: f64, x: &dyn Fn(u64) -> f64, dur: u64) {
        let ws: Vec<usize> = self.writes.iter().copied().filter(|i| self.evs[*i].s("account") == Some(acct)).collect();
        let max_tok = ws
            .iter()
            .flat_map(|i| [self.evs[*i].u("presented_token"), self.evs[*i].u("stored_token")])
            .flatten()
            .max()
            .unwrap_or(1)
            .max(1);
        let top = ay + 10.0;
        let h = ACCOUNT_H_PX - 20.0;
        let ty = |t: u64| top + h - (t as f64 / max_tok as f64) * h;
        let _ = write!(p, r#"<g class="lane" data-lane="account {}" data-lane-kind="account">"#, esc(acct));
        let _ = write!(
            p,
            r##"<text x="{:.1}" y="{:.1}" fill="#9ca3af" font-size="9">token {max_tok}</text><text x="{:.1}" y="{:.1}" fill="#9ca3af" font-size="9">0</text>"##,
            PAD_X_PX + 2.0,
            top - 1.0,
            PAD_X_PX + 2.0,
            top + h + 9.0
        );
        // Step lines: the account fence (claims and posts) and the rail mark (admissions).
        for (ops, color, dash, name) in
            [(&["claim", "post"][..], "#1d4ed8", "", "fence"), (&["admit"][..], "#7c3aed", "6 3", "mark")]
        {
            let mut pts: Vec<(u64, u64)> = Vec::new();
            for &i in &ws {
                let e = &self.evs[i];
                if !ops.contains(&e.s("op").unwrap_or("")) {
                    continue;
                }
                if let Some(s) = e.u("stored_token") {
                    if pts.last().map(|p| p.1) != Some(s) {
                        pts.push((e.t, s));
                    }
                }
            }
            if pts.is_empty() {
                continue;
            }
            let mut d = String::new();
            for (n, (t, v)) in pts.iter().enumerate() {
                let (xx, yv) = (x(*t), ty(*v));
                if n == 0 {
                    let _ = write!(d, "M{xx:.1} {yv:.1}");
                } else {
                    let _ = write!(d, " H{xx:.1} V{yv:.1}");
                }
            }
            let _ = write!(d, " H{:.1}", x(dur));
            let _ = write!(
                p,
                r##"<path class="step" data-step="{name}" d="{d}" fill="none" stroke="{color}" stroke-width="2.5" stroke-dasharray="{dash}"/>"##
            );
            let mut labels = LabelRow::default();
            for (t, v) in &pts {
                let text = format!("{name} {v}");
                let xx = x(*t) + 3.0;
                // The fence's value above its line, the mark's below.
                let dy = if name == "fence" { -3.0 } else { 10.0 };
                if labels.fits(xx, &text) {
                    let _ = write!(
                        p,
                        r##"<text x="{xx:.1}" y="{:.1}" fill="{color}" font-size="10">{}</text>"##,
                        ty(*v) + dy,
                        esc(&text)
                    );
                }
            }
        }
        for &i in &ws {
            let e = &self.evs[i];
            let Some(tok) = e.u("presented_token") else { continue };
            let answer = e.s("answer").unwrap_or("?");
            let (fill, r) = match answer {
                "fenced_out" => ("#dc2626", 4.5),
                "accepted" => ("#16a34a", 3.0),
                _ => ("#9ca3af", 3.0),
            };
            let _ = write!(
                p,
                r##"<g class="ev" data-seq="{}" data-kind="fenced_write" data-answer="{}"><title>{}</title><circle cx="{:.1}" cy="{:.1}" r="{r}" fill="{fill}" stroke="#ffffff" stroke-width="0.8"/></g>"##,
                e.seq,
                esc(answer),
                tooltip(&e.raw),
                x(e.t),
                ty(tok)
            );
        }
        p.push_str("</g>");
    }

    fn page(&self, labels: &str, plot: &str) -> String {
        let mut h = String::new();
        let seed = self.seed.map_or(String::new(), |s| format!(" — seed {s}"));
        let _ = write!(
            h,
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>dlock timeline{}</title>\n<style>{CSS}</style>\n</head>\n<body>\n",
            esc(&seed)
        );
        let _ = write!(h, "<header><h1>dlock incident timeline{}</h1>", esc(&seed));
        if let Some(c) = &self.config {
            let _ = write!(h, r#"<p class="config">{}</p>"#, esc(c));
        }
        let fenced = self.writes.iter().filter(|i| self.evs[**i].s("answer") == Some("fenced_out")).count();
        let _ = write!(
            h,
            r#"<p class="stats" data-drawn="{}" data-drawable="{}">{} executors · {} leases · {} fenced writes ({} fenced out) · {} rail calls · {} intents · {} faults · {} failures · {} {} · {}</p>"#,
            self.kept.len(),
            self.drawable,
            self.executors.len(),
            self.leases.len(),
            self.writes.len(),
            fenced,
            self.rail_calls.len(),
            self.intents.len(),
            self.partitions.len() + self.node_bands.len() + self.store_ticks.len(),
            self.failures_total,
            if self.wall_axis { "spanning" } else { "simulated" },
            secs(self.t_end),
            esc(self.schema.as_deref().unwrap_or("schema unknown"))
        );
        for f in &self.failures {
            let e = &self.evs[f.idx];
            let _ = write!(
                h,
                r#"<p class="banner broken">✖ {} ({}) broke at t = {}{}: {}</p>"#,
                esc(e.s("invariant").unwrap_or("?")),
                esc(e.s("class").unwrap_or("?")),
                secs(f.at),
                if f.located { "" } else { " (found by the end-of-run checks)" },
                esc(e.s("detail").unwrap_or(""))
            );
        }
        let fenced_out: Vec<&Ev> =
            self.writes.iter().map(|i| &self.evs[*i]).filter(|e| e.s("answer") == Some("fenced_out")).collect();
        for e in fenced_out.iter().take(FENCED_LISTED_MAX) {
            let _ = write!(
                h,
                r#"<p class="banner fenced">FENCED OUT at t = {}: {} {} with token {} ≤ {} on {} ({})</p>"#,
                secs(e.t),
                esc(e.s("owner").unwrap_or("?")),
                esc(e.s("op").unwrap_or("?")),
                e.u("presented_token").map_or("?".to_owned(), |t| t.to_string()),
                e.u("stored_token").map_or("?".to_owned(), |t| t.to_string()),
                esc(e.s("account").unwrap_or("?")),
                esc(&e.node)
            );
        }
        if fenced_out.len() > FENCED_LISTED_MAX {
            let _ = write!(
                h,
                r#"<p class="banner fenced">… and {} more fenced-out writes (marked in their lanes)</p>"#,
                fenced_out.len() - FENCED_LISTED_MAX
            );
        }
        if self.failures_total > self.failures.len() {
            let _ = write!(
                h,
                r#"<p class="banner broken">… and {} more failures (only {FAILURES_DRAWN_MAX} are drawn)</p>"#,
                self.failures_total - self.failures.len()
            );
        }
        if let Some(t) = self.cut_at {
            let _ = write!(
                h,
                r#"<p class="banner truncated" data-truncated="true">Truncated: drawing the first {} of {} events (up to t = {}); the rest are not drawn (EVENTS_DRAWN_MAX).</p>"#,
                self.kept.len(),
                self.drawable,
                secs(t)
            );
        }
        if self.trace_dropped > 0 {
            let _ = write!(
                h,
                r#"<p class="banner truncated">The trace itself dropped {} events past its bound (trace_end).</p>"#,
                self.trace_dropped
            );
        }
        if !self.executors_hidden.is_empty() {
            let _ = write!(
                h,
                r#"<p class="banner truncated">Not drawn: {} more executor lanes ({}).</p>"#,
                self.executors_hidden.len(),
                esc(&self.executors_hidden.join(", "))
            );
        }
        if self.accounts_hidden > 0 {
            let _ = write!(
                h,
                r#"<p class="banner truncated">Not drawn: {} more account lanes (only the {ACCOUNT_LANES_MAX} with fenced-out writes or the most writes).</p>"#,
                self.accounts_hidden
            );
        }
        h.push_str(LEGEND);
        h.push_str("</header>\n<main class=\"chart\">\n<div class=\"labels\">");
        h.push_str(labels);
        h.push_str("</div>\n<div class=\"plot\" id=\"plot\">");
        h.push_str(plot);
        h.push_str("</div>\n</main>\n<pre id=\"raw\">Hover over any mark to see its trace line; click to pin it.</pre>\n<script>");
        h.push_str(JS);
        h.push_str("</script>\n</body>\n</html>\n");
        h
    }
}

const CSS: &str = "
body{margin:0;font:13px/1.4 'DejaVu Sans',Arial,sans-serif;color:#111827;background:#fff}
header{padding:10px 16px 4px}
h1{font-size:18px;margin:0 0 4px}
p{margin:2px 0}
.config{color:#4b5563;font-family:'DejaVu Sans Mono',monospace;font-size:11px;line-height:1.4;max-height:2.8em;overflow:hidden}
.stats{color:#374151}
.banner{padding:4px 8px;border-radius:3px;margin:4px 0}
.broken{background:#fee2e2;color:#991b1b;font-weight:bold;border-left:4px solid #dc2626}
.truncated{background:#fef3c7;color:#92400e;border-left:4px solid #d97706}
.fenced{background:#fff1f2;color:#b91c1c;border-left:4px solid #f87171;font-size:12px;padding:2px 8px}
.legend{display:flex;flex-wrap:wrap;gap:14px;margin:6px 0 2px;color:#374151;font-size:12px;align-items:center}
.legend svg{vertical-align:middle;margin-right:4px}
.chart{display:flex;border-top:1px solid #e5e7eb}
.labels{flex:0 0 200px;background:#fff;border-right:1px solid #d1d5db}
.plot{flex:1 1 auto;overflow-x:auto}
.ev{cursor:pointer}
.ev:hover>*:not(title),.ev.pinned>*:not(title){filter:drop-shadow(0 0 2px #111827)}
.implicated>rect,.implicated>circle{stroke:#dc2626;stroke-width:2.5}
.related>rect:first-of-type{stroke:#111827;stroke-width:2}
#raw{position:sticky;bottom:0;margin:0;padding:6px 16px;background:#111827;color:#f9fafb;font:12px 'DejaVu Sans Mono',monospace;white-space:pre-wrap;word-break:break-all;min-height:2.8em;max-height:9em;overflow:auto}
";

const LEGEND: &str = concat!(
    r##"<div class="legend">"##,
    r##"<span><svg width="30" height="12"><rect width="30" height="12" fill="#3b82f6" rx="2"/></svg>lease, as the lock server saw it</span>"##,
    r##"<span><svg width="30" height="12"><rect width="30" height="12" fill="url(#hatch-expired-l)" stroke="#93b4f5"/><defs><pattern id="hatch-expired-l" width="5" height="5" patternUnits="userSpaceOnUse" patternTransform="rotate(-45)"><rect width="5" height="5" fill="#fff"/><line x1="0" y1="0" x2="0" y2="5" stroke="#93b4f5" stroke-width="1.5"/></pattern></defs></svg>expired, not yet removed</span>"##,
    r##"<span><svg width="30" height="12"><rect width="30" height="12" fill="#fef3c7" stroke="#d97706" stroke-dasharray="3 2"/></svg>lease, as the executor believed it</span>"##,
    r##"<span><svg width="30" height="12"><rect width="30" height="12" fill="#d1d5db" stroke="#6b7280"/></svg>paused / down (hatched)</span>"##,
    r##"<span><svg width="12" height="12"><circle cx="6" cy="6" r="5" fill="#16a34a"/></svg>write accepted</span>"##,
    r##"<span><svg width="12" height="12"><rect width="12" height="12" fill="#dc2626"/><path d="M3 3 l6 6 M9 3 l-6 6" stroke="#fff" stroke-width="2"/></svg>write FENCED OUT (token ≤ fence)</span>"##,
    r##"<span><svg width="12" height="12"><circle cx="6" cy="6" r="4.5" fill="#fff" stroke="#6b7280" stroke-width="1.5"/></svg>no decision (replay, state refusal)</span>"##,
    r##"<span><svg width="30" height="12"><rect width="30" height="12" fill="#fcd9a8" stroke="#d97706"/></svg>partition / clog / node fault</span>"##,
    r##"<span><svg width="12" height="14"><path d="M6 1 l6 6 l-6 6 l-6 -6 z" fill="#dc2626"/></svg>invariant broke</span>"##,
    r##"</div>"##
);

const JS: &str = "
(function(){
  var raw=document.getElementById('raw');
  var pinned=null;
  var evs=document.querySelectorAll('.ev');
  function show(g){var t=g.querySelector('title');raw.textContent=t?t.textContent:'';}
  function relate(g,on){var k=g.getAttribute('data-key');if(!k){return;}
    var same=document.querySelectorAll('.ev[data-key]');
    for(var j=0;j<same.length;j++){if(same[j].getAttribute('data-key')===k){same[j].classList.toggle('related',on);}}}
  for(var i=0;i<evs.length;i++){(function(g){
    g.addEventListener('mouseenter',function(){if(!pinned){show(g);}relate(g,true);});
    g.addEventListener('mouseleave',function(){relate(g,false);});
    g.addEventListener('click',function(ev){ev.stopPropagation();
      if(pinned){pinned.classList.remove('pinned');}
      if(pinned===g){pinned=null;return;}
      pinned=g;g.classList.add('pinned');show(g);});
  })(evs[i]);}
  var svg=document.getElementById('tl');
  var x0=parseFloat(svg.getAttribute('data-x0'));
  var ppm=parseFloat(svg.getAttribute('data-px-per-ms'));
  var tEnd=parseFloat(svg.getAttribute('data-t-end-ms'));
  var cur=document.getElementById('cursor');
  var cl=document.getElementById('cursor-line'),cb=document.getElementById('cursor-bg'),ct=document.getElementById('cursor-text');
  svg.addEventListener('mousemove',function(ev){
    var r=svg.getBoundingClientRect();var x=ev.clientX-r.left;
    var t=Math.round((x-x0)/ppm);if(t<0||t>tEnd){cur.setAttribute('visibility','hidden');return;}
    cl.setAttribute('x1',x);cl.setAttribute('x2',x);cb.setAttribute('x',x+2);ct.setAttribute('x',x+5);
    ct.textContent='t = '+(t/1000).toFixed(3)+' s';cur.setAttribute('visibility','visible');
  });
  svg.addEventListener('mouseleave',function(){cur.setAttribute('visibility','hidden');});
  document.documentElement.setAttribute('data-timeline-ready',String(evs.length));
})();
";

#[cfg(test)]
mod tests {
    use super::*;

    fn line(seq: u64, t: u64, node: &str, kind: &str, rest: &str) -> String {
        format!(
            r#"{{"seq":{seq},"t_ms":{t},"node":"{node}","mono_ms":{t},"wall_ms":{},"kind":"{kind}"{rest}}}"#,
            1_000_000 + t
        )
    }

    #[test]
    fn a_line_that_is_not_json_is_an_error_naming_it() {
        let err = render_html("{\"t_ms\":1,\"kind\":\"note\"}\nnot json\n").err();
        assert!(err.as_deref().is_some_and(|e| e.starts_with("line 2:")), "{err:?}");
        assert!(render_html("{\"kind\":\"note\"}").is_err(), "a line without t_ms is an error");
    }

    #[test]
    fn unknown_kinds_and_fields_are_ignored() {
        let t = [
            line(0, 0, "supervisor", "trace_start", r#","config":"c","schema":"dlock-incident-trace/1","seed":7"#),
            line(1, 5, "x", "kind_from_the_future", r#","whatever":[1,2,{"a":null}]"#),
            line(2, 6, "lock-1", "grant", r#","key":"acct-0","owner":"executor-1/0","session":"s","token":3,"expires_at_ms":3006,"store_ms":6,"extra":true"#),
        ]
        .join("\n");
        let html = render_html(&t).expect("renders");
        assert!(html.contains(r#"data-lane="executor-1""#));
        assert!(!html.contains("kind_from_the_future\" "), "the unknown kind is not drawn as a mark");
    }

    #[test]
    fn past_the_bound_the_picture_says_it_is_truncated() {
        let mut t = vec![line(0, 0, "supervisor", "trace_start", r#","seed":1"#)];
        for n in 1..=(EVENTS_DRAWN_MAX as u64 + 10) {
            t.push(line(
                n,
                n,
                "payment-1",
                "fenced_write",
                r#","account":"acct-0","answer":"accepted","op":"claim","owner":"executor-1/0","presented_token":1,"stored_token":1"#,
            ));
        }
        let html = render_html(&t.join("\n")).expect("renders");
        assert!(html.contains(r#"data-truncated="true""#));
        assert!(html.contains(&format!("drawing the first {EVENTS_DRAWN_MAX} of {} events", EVENTS_DRAWN_MAX + 10)));
        assert_eq!(html.matches(r#"class="ev write""#).count(), EVENTS_DRAWN_MAX);
        let small = render_html(&t[..10].join("\n")).expect("renders");
        assert!(!small.contains("data-truncated"));
    }
}
