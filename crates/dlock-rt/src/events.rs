//! The protocol-event seam: services say what they decided or believed (a grant, a fenced
//! write and its answer, an intent, a rail call, a lease belief, a reconciler finding) as a
//! `kind` with named fields, and whoever installed a [`Sink`] records it. The simulation's
//! sink appends to its incident trace (`sim/src/trace.rs`); `dlock demo --trace FILE.jsonl`
//! installs a file sink that writes the same line schema (docs/simulation.md "Incident
//! trace").
//!
//! Invariants of this module:
//! - With no sink installed, [`emit`] is one branch: the closure that builds the fields is
//!   never called, so nothing is allocated and nothing is read.
//! - A sink never decides anything: emitting is after the decision, and a sink's answer is
//!   not returned to the service.
//! - Fields are a `BTreeMap`, so their order is by name whatever order the emitter gave.
//! - In simulation (`cfg(madsim)`) the sink is per thread, the thread a seed's runtime runs
//!   on, so seeds run in parallel never see each other's events; outside it, the sink is the
//!   process's.
//! - [`mono_ms`] puts an [`Instant`] on the same scale as the line's `mono_ms`: in
//!   simulation the reading of the instant's own node clock (whole ms since the frame's
//!   origin), outside it the host's monotonic clock (`CLOCK_MONOTONIC`, whole ms since
//!   boot), one scale for every process of a host, so the traces of separate processes
//!   merge on it (docs/real-runs.md). A wall-clock fault (libfaketime with
//!   `FAKETIME_DONT_FAKE_MONOTONIC=1`) does not touch it.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::Instant;

/// An event's own fields, sorted by name.
pub type Fields = BTreeMap<&'static str, Value>;

/// Where emitted events go.
pub trait Sink: Send + Sync {
    /// `node`: the emitting service's name for itself (a sink that knows better, such as the
    /// simulation's, which knows the running node, may use its own).
    fn record(&self, node: &str, kind: &'static str, fields: Fields);
}

#[cfg(madsim)]
thread_local! {
    static SINK: std::cell::RefCell<Option<Arc<dyn Sink>>> = const { std::cell::RefCell::new(None) };
}

#[cfg(not(madsim))]
static ENABLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
#[cfg(not(madsim))]
static SINK: std::sync::RwLock<Option<Arc<dyn Sink>>> = std::sync::RwLock::new(None);

/// Puts back, when dropped, the sink that was installed before its own (none, usually):
/// installs nest.
#[must_use = "the sink is removed when the guard is dropped"]
pub struct Installed(Option<Arc<dyn Sink>>);

impl Drop for Installed {
    fn drop(&mut self) {
        set(self.0.take());
    }
}

fn set(sink: Option<Arc<dyn Sink>>) {
    #[cfg(madsim)]
    SINK.with(|s| *s.borrow_mut() = sink);
    #[cfg(not(madsim))]
    {
        let on = sink.is_some();
        match SINK.write() {
            Ok(mut g) => *g = sink,
            Err(poisoned) => *poisoned.into_inner() = sink,
        }
        ENABLED.store(on, std::sync::atomic::Ordering::Release);
    }
}

/// Installs `sink` in place of the one installed now (if any) until the returned guard
/// drops, which puts that one back. A sink that wants to see what it replaced as well
/// forwards to [`installed`], read before.
pub fn install(sink: Arc<dyn Sink>) -> Installed {
    let previous = current();
    set(Some(sink));
    Installed(previous)
}

/// The sink installed now, if any.
pub fn installed() -> Option<Arc<dyn Sink>> {
    current()
}

/// Whether a sink is installed.
pub fn enabled() -> bool {
    #[cfg(madsim)]
    return SINK.with(|s| s.borrow().is_some());
    #[cfg(not(madsim))]
    ENABLED.load(std::sync::atomic::Ordering::Acquire)
}

fn current() -> Option<Arc<dyn Sink>> {
    #[cfg(madsim)]
    return SINK.with(|s| s.borrow().clone());
    #[cfg(not(madsim))]
    match SINK.read() {
        Ok(g) => g.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    }
}

/// Emits one event of `node` (the service's own name): `fields` is called only when a sink
/// is installed.
pub fn emit<F, I>(node: &str, kind: &'static str, fields: F)
where
    F: FnOnce() -> I,
    I: IntoIterator<Item = (&'static str, Value)>,
{
    if !enabled() {
        return;
    }
    if let Some(sink) = current() {
        sink.record(node, kind, fields().into_iter().collect());
    }
}

/// The incident trace's schema name and version (docs/simulation.md "Incident trace"). A
/// field or kind is only ever added under the same version; a renamed or removed one is a
/// new version.
pub const SCHEMA: &str = "dlock-incident-trace/1";

/// The fields every trace line has, first and in this order.
pub const REQUIRED_FIELDS: [&str; 6] = ["seq", "t_ms", "node", "mono_ms", "wall_ms", "kind"];

/// The fixed fields of one trace line.
#[derive(Debug, Clone, Copy)]
pub struct LineHead<'a> {
    pub seq: u64,
    pub t_ms: u64,
    pub node: &'a str,
    pub mono_ms: u64,
    pub wall_ms: i64,
    pub kind: &'a str,
}

/// One trace line: the six fixed fields in order, then `fields` sorted by name. Rendered by
/// hand (fixed order, sorted map), so no JSON library's map order can leak in; the
/// simulation's trace and the demo's file both render through here.
pub fn render_line(h: LineHead<'_>, fields: &Fields) -> String {
    let s = |v: &str| Value::from(v).to_string();
    let mut line = format!(
        "{{\"seq\":{},\"t_ms\":{},\"node\":{},\"mono_ms\":{},\"wall_ms\":{},\"kind\":{}",
        h.seq,
        h.t_ms,
        s(h.node),
        h.mono_ms,
        h.wall_ms,
        s(h.kind)
    );
    for (k, v) in fields {
        line.push_str(&format!(",{}:{}", s(k), v));
    }
    line.push('}');
    line
}

/// A value from an optional one (`null` when `None`).
pub fn opt<T: Into<Value>>(v: Option<T>) -> Value {
    v.map_or(Value::Null, Into::into)
}

/// `i` in whole ms on the scale of a trace line's `mono_ms` (see the module doc).
pub fn mono_ms(i: Instant) -> u64 {
    #[cfg(madsim)]
    return i.reading_ms();
    #[cfg(not(madsim))]
    {
        // One pair of readings taken together: the process's `Instant` origin and the host's
        // CLOCK_MONOTONIC in ms at that origin (std's `Instant` reads that clock on Linux, so
        // the two agree to within the microseconds between the reads).
        static ORIGIN: std::sync::OnceLock<(Instant, u64)> = std::sync::OnceLock::new();
        let (origin, host_ms) = *ORIGIN.get_or_init(|| (Instant::now(), host_monotonic_ms()));
        let since = u64::try_from(i.saturating_duration_since(origin).as_millis()).unwrap_or(u64::MAX);
        let before = u64::try_from(origin.saturating_duration_since(i).as_millis()).unwrap_or(u64::MAX);
        host_ms.saturating_add(since).saturating_sub(before)
    }
}

/// The host's `CLOCK_MONOTONIC` in whole ms (since boot): the same reading in every process.
#[cfg(not(madsim))]
fn host_monotonic_ms() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let ms = u64::try_from(t.tv_nsec / 1_000_000).unwrap_or(0);
    secs.saturating_mul(1_000).saturating_add(ms)
}

/// Held by every unit test of this crate that installs a sink or needs none installed: the
/// sink is one per process, and tests run on parallel threads.
#[cfg(all(test, not(madsim)))]
pub(crate) static TEST_SINK_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(all(test, not(madsim)))]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Collect(Mutex<Vec<(String, &'static str, Fields)>>);
    impl Sink for Collect {
        fn record(&self, node: &str, kind: &'static str, fields: Fields) {
            if let Ok(mut v) = self.0.lock() {
                v.push((node.to_owned(), kind, fields));
            }
        }
    }

    #[test]
    fn without_a_sink_the_fields_are_never_built_and_with_one_they_arrive_sorted() {
        let _one = TEST_SINK_LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let called = std::cell::Cell::new(false);
        emit("n", "k", || {
            called.set(true);
            [("a", Value::from(1))]
        });
        assert!(!called.get(), "no sink: the closure must not run");
        let sink = Arc::new(Collect(Mutex::new(Vec::new())));
        {
            let _g = install(sink.clone());
            emit("lock-server", "grant", || [("token", Value::from(3)), ("key", Value::from("k"))]);
        }
        emit("n", "after", || [("a", Value::from(1))]);
        let got = sink.0.lock().map(|v| v.clone()).unwrap_or_default();
        assert_eq!(got.len(), 1, "one event while installed, none after: {got:?}");
        assert_eq!(got[0].0, "lock-server");
        assert_eq!(got[0].1, "grant");
        assert_eq!(got[0].2.keys().copied().collect::<Vec<_>>(), vec!["key", "token"]);
    }

    #[test]
    fn a_rendered_line_has_the_fixed_fields_first_then_the_sorted_fields() {
        let f: Fields = [("b", Value::from(2)), ("a", Value::from("x"))].into_iter().collect();
        let h = LineHead { seq: 7, t_ms: 5, node: "rail-proxy", mono_ms: 4, wall_ms: -1, kind: "intent" };
        assert_eq!(
            render_line(h, &f),
            r#"{"seq":7,"t_ms":5,"node":"rail-proxy","mono_ms":4,"wall_ms":-1,"kind":"intent","a":"x","b":2}"#
        );
    }

    #[test]
    fn mono_ms_never_decreases_for_later_instants() {
        let _ = mono_ms(Instant::now());
        let a = Instant::now();
        let b = a + std::time::Duration::from_millis(250);
        assert!(mono_ms(b) >= mono_ms(a) + 250);
        // An instant before the origin reads earlier, not 0.
        let before = a.checked_sub(std::time::Duration::from_millis(100)).unwrap_or(a);
        assert!(mono_ms(before) <= mono_ms(a));
    }

    #[test]
    fn mono_ms_is_the_hosts_monotonic_clock_shared_by_every_process() {
        // Another process reads CLOCK_MONOTONIC at the same instant as we do: a per-process
        // origin (0 at the first reading) would be seconds or more below it.
        let ours = mono_ms(Instant::now());
        let host = host_monotonic_ms();
        assert!(host.abs_diff(ours) <= 50, "mono_ms {ours} vs CLOCK_MONOTONIC {host} ms");
        assert!(ours > 1_000, "CLOCK_MONOTONIC counts from boot, not from this process: {ours}");
    }
}
