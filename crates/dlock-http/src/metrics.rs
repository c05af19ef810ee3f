//! Prometheus text exposition through the `metrics` crate, one recorder per service
//! instance (C4; issue 13).
//!
//! Every service builds one [`Registry`] in its entry point: a `metrics::Recorder` of its
//! own (never the process-global recorder: the simulation runs every node of a cluster in
//! one process), whose [`Registry::render`] is the service's `/metrics`. Handles are
//! registered through `Recorder::register_*`, so a series exists, at 0, from the moment its
//! family is built. Histograms keep fixed buckets (`metrics_util::storage::Histogram`); the
//! text is written by `metrics_exporter_prometheus::formatting`.
//!
//! Why not `metrics_exporter_prometheus::PrometheusRecorder`: building one calibrates the
//! `quanta` clock, a loop that waits for the monotonic clock to advance. Inside a madsim
//! poll that clock stands still, so the loop never ends, and madsim refuses the system
//! thread that could run it outside the simulation. This recorder reads no clock at all.
//!
//! Invariants:
//! - Tag values are closed sets: a family is built from an enum ([`ClosedTag`]) or a fixed
//!   array, every value is registered at start-up (alerts on `increase()` need the 0), and a
//!   value outside the set cannot be expressed, so a payout or account id can never become a
//!   tag (NFR-09).
//! - Histograms are in seconds (`_seconds`), each with a named bucket set given to
//!   [`Registry::new`]; registering a histogram without one panics (release builds too).
//!   Durations are measured on the `dlock-rt` clock, never the standard library's: the simulation's
//!   virtual time is what they see, and recording one reads no clock, draws no randomness
//!   and schedules nothing.
//! - The exposition is in a fixed order (families by name, series by labels), whatever the
//!   order of registration or of the samples.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use metrics::{Counter as CounterHandle, Gauge as GaugeHandle, Histogram as HistogramHandle, HistogramFn};
use metrics::{Key, KeyName, Label, Level, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::formatting::{write_help_line, write_metric_line, write_type_line};
use metrics_exporter_prometheus::LabelSet;

/// Buckets of a hop or a store operation, seconds: 0.5 ms .. 10 s.
pub const HOP_BUCKETS_SECONDS: [f64; 14] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// Buckets of a call to the rail, seconds: 1 ms .. 30 s.
pub const RAIL_BUCKETS_SECONDS: [f64; 14] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
/// Buckets of a payout end to end, seconds: 5 ms .. 60 s.
pub const END_TO_END_BUCKETS_SECONDS: [f64; 13] =
    [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// The metadata every handle is registered with (this recorder ignores it).
const METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// A tag whose values are a closed set: an enum listing every value once.
pub trait ClosedTag: Copy + PartialEq + 'static {
    /// The tag's name (`hop`, `op`, `outcome`).
    const LABEL: &'static str;
    /// Every value, in exposition order.
    fn all() -> &'static [Self];
    /// The value as exported.
    fn tag(self) -> &'static str;
}

/// A histogram with fixed buckets: the storage behind a histogram handle.
#[derive(Debug)]
struct Bucketed(Mutex<metrics_util::storage::Histogram>);

impl HistogramFn for Bucketed {
    fn record(&self, value: f64) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).record(value);
    }
}

/// One series' storage.
#[derive(Debug, Clone)]
enum Series {
    Counter(Arc<AtomicU64>),
    /// The value's `f64` bits (as `metrics` stores gauges).
    Gauge(Arc<AtomicU64>),
    Histogram(Arc<Bucketed>),
}

/// One metric family: its type, help text, and series by label set.
#[derive(Debug, Default)]
struct Family {
    help: String,
    series: BTreeMap<Vec<(String, String)>, (Key, Series)>,
}

/// One service instance's metrics: its own recorder, which also renders them.
#[derive(Debug)]
pub struct Registry {
    /// Histogram families and their buckets (fixed at construction).
    buckets: BTreeMap<&'static str, &'static [f64]>,
    families: Mutex<BTreeMap<String, Family>>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new(&[])
    }
}

impl Registry {
    /// A recorder whose histogram families (`name`, buckets) are `histograms`. Every
    /// histogram a service registers later must be named here.
    pub fn new(histograms: &[(&'static str, &'static [f64])]) -> Registry {
        for (name, buckets) in histograms {
            assert!(!buckets.is_empty(), "histogram {name} has no buckets");
            assert!(buckets.windows(2).all(|w| w[0] < w[1]), "histogram {name}: buckets must increase");
        }
        Registry { buckets: histograms.iter().copied().collect(), families: Mutex::new(BTreeMap::new()) }
    }

    fn key(name: &'static str, labels: &[(&'static str, &'static str)]) -> Key {
        Key::from_parts(name, labels.iter().map(|(k, v)| Label::from_static_parts(k, v)).collect::<Vec<_>>())
    }

    /// The series of `key`, made by `make` if it does not exist yet.
    fn series(&self, key: &Key, make: impl FnOnce() -> Series) -> Series {
        let mut families = self.families.lock().unwrap_or_else(PoisonError::into_inner);
        let family = families.entry(key.name().to_owned()).or_default();
        let labels = key.labels().map(|l| (l.key().to_owned(), l.value().to_owned())).collect();
        family.series.entry(labels).or_insert_with(|| (key.clone(), make())).1.clone()
    }

    fn describe(&self, name: KeyName, description: SharedString) {
        let mut families = self.families.lock().unwrap_or_else(PoisonError::into_inner);
        families.entry(name.as_str().to_owned()).or_default().help = description.into_owned();
    }

    /// Registers the counter `name{labels}` (it renders at 0 from now on).
    pub fn counter(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &'static str)],
    ) -> CounterHandle {
        self.describe_counter(KeyName::from_const_str(name), None, SharedString::const_str(help));
        self.register_counter(&Self::key(name, labels), &METADATA)
    }

    /// Registers the gauge `name{labels}`.
    pub fn gauge(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &'static str)],
    ) -> GaugeHandle {
        self.describe_gauge(KeyName::from_const_str(name), None, SharedString::const_str(help));
        self.register_gauge(&Self::key(name, labels), &METADATA)
    }

    /// Registers the histogram `name{labels}` (`name` must be one [`Registry::new`] was given).
    pub fn histogram(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &'static str)],
    ) -> HistogramHandle {
        self.describe_histogram(KeyName::from_const_str(name), None, SharedString::const_str(help));
        self.register_histogram(&Self::key(name, labels), &METADATA)
    }

    /// The exposition text of every series registered so far.
    pub fn render(&self) -> String {
        self.render_families(&[])
    }

    /// The exposition text of the families named in `only` (all of them when `only` is
    /// empty); see [`requested_families`].
    pub fn render_families(&self, only: &[String]) -> String {
        let families = self.families.lock().unwrap_or_else(PoisonError::into_inner);
        let no_global_labels = indexmap::IndexMap::new();
        let mut out = String::new();
        for (name, family) in families.iter() {
            if !only.is_empty() && !only.iter().any(|n| n == name) {
                continue;
            }
            let Some((_, (_, first))) = family.series.first_key_value() else { continue };
            let kind = match first {
                Series::Counter(_) => "counter",
                Series::Gauge(_) => "gauge",
                Series::Histogram(_) => "histogram",
            };
            if !family.help.is_empty() {
                write_help_line(&mut out, name, None, None, &family.help);
            }
            write_type_line(&mut out, name, None, None, kind);
            for (key, series) in family.series.values() {
                let labels = LabelSet::from_key_and_global(key, &no_global_labels);
                match series {
                    Series::Counter(c) => {
                        write_metric_line::<&str, u64>(
                            &mut out,
                            name,
                            None,
                            &labels,
                            None,
                            c.load(Ordering::Relaxed),
                            None,
                        );
                    }
                    Series::Gauge(g) => {
                        let v = f64::from_bits(g.load(Ordering::Relaxed));
                        write_metric_line::<&str, f64>(&mut out, name, None, &labels, None, v, None);
                    }
                    Series::Histogram(h) => {
                        let h = h.0.lock().unwrap_or_else(PoisonError::into_inner);
                        for (le, count) in h.buckets() {
                            write_metric_line(&mut out, name, Some("bucket"), &labels, Some(("le", le)), count, None);
                        }
                        let count = h.count();
                        write_metric_line(&mut out, name, Some("bucket"), &labels, Some(("le", "+Inf")), count, None);
                        write_metric_line::<&str, f64>(&mut out, name, Some("sum"), &labels, None, h.sum(), None);
                        write_metric_line::<&str, u64>(&mut out, name, Some("count"), &labels, None, count, None);
                    }
                }
            }
            out.push('\n');
        }
        out
    }
}

impl Recorder for Registry {
    fn describe_counter(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn describe_gauge(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn describe_histogram(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn register_counter(&self, key: &Key, _metadata: &Metadata<'_>) -> CounterHandle {
        match self.series(key, || Series::Counter(Arc::new(AtomicU64::new(0)))) {
            Series::Counter(c) => CounterHandle::from_arc(c),
            _ => panic!("{} is registered as another type", key.name()),
        }
    }

    fn register_gauge(&self, key: &Key, _metadata: &Metadata<'_>) -> GaugeHandle {
        match self.series(key, || Series::Gauge(Arc::new(AtomicU64::new(0.0f64.to_bits())))) {
            Series::Gauge(g) => GaugeHandle::from_arc(g),
            _ => panic!("{} is registered as another type", key.name()),
        }
    }

    fn register_histogram(&self, key: &Key, _metadata: &Metadata<'_>) -> HistogramHandle {
        let buckets = self.buckets.get(key.name()).copied();
        let Some(h) = buckets.and_then(metrics_util::storage::Histogram::new) else {
            panic!("histogram {} has no bucket set (Registry::new)", key.name());
        };
        match self.series(key, || Series::Histogram(Arc::new(Bucketed(Mutex::new(h))))) {
            Series::Histogram(h) => HistogramHandle::from_arc(h),
            _ => panic!("{} is registered as another type", key.name()),
        }
    }
}

/// Most `name[]` selectors one scrape may give; the rest are ignored.
pub const REQUESTED_FAMILIES_MAX: usize = 32;

/// The families a scrape asks for with `name[]=FAMILY` query parameters (the convention of
/// Prometheus client libraries, set with `params:` in a scrape config), in the order given;
/// empty (render everything) when there are none. At most [`REQUESTED_FAMILIES_MAX`]; a
/// value that is not a metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`) is ignored, so nothing a
/// caller sends is echoed back.
pub fn requested_families(query: Option<&str>) -> Vec<String> {
    let valid = |n: &str| {
        let mut chars = n.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    query
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .filter(|(k, _)| matches!(*k, "name[]" | "name%5B%5D" | "name%5b%5d"))
        .map(|(_, v)| v)
        .filter(|v| valid(v))
        .take(REQUESTED_FAMILIES_MAX)
        .map(str::to_owned)
        .collect()
}

/// A counter family with one closed label (values given as a fixed array).
pub struct LabeledCounter<const N: usize> {
    handles: [CounterHandle; N],
    /// The same counts, for in-process readers (tests, the demo).
    counts: [AtomicU64; N],
}

impl<const N: usize> LabeledCounter<N> {
    pub fn new(
        registry: &Registry,
        name: &'static str,
        help: &'static str,
        label: &'static str,
        values: [&'static str; N],
    ) -> Self {
        LabeledCounter {
            handles: values.map(|v| registry.counter(name, help, &[(label, v)])),
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Adds one to the series whose label value is `values[index]` (an index outside the
    /// set counts nothing).
    pub fn inc(&self, index: usize) {
        if let (Some(h), Some(c)) = (self.handles.get(index), self.counts.get(index)) {
            h.increment(1);
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn get(&self, index: usize) -> u64 {
        self.counts.get(index).map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

impl<const N: usize> std::fmt::Debug for LabeledCounter<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LabeledCounter").field("counts", &self.counts).finish()
    }
}

/// A counter without labels.
pub struct Counter {
    handle: CounterHandle,
    count: AtomicU64,
}

impl Counter {
    pub fn new(registry: &Registry, name: &'static str, help: &'static str) -> Self {
        Counter { handle: registry.counter(name, help, &[]), count: AtomicU64::new(0) }
    }

    pub fn inc(&self) {
        self.add(1);
    }

    pub fn add(&self, n: u64) {
        self.handle.increment(n);
        self.count.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counter").field("count", &self.count).finish()
    }
}

/// `<service>_store_writes_off_writer_total`: store writes that ran off the store's SQLite
/// writer thread (docs/performance.md "The SQLite writer thread"). Each service runs its
/// store's writes through one helper that hands them to that thread, and its timing wrapper
/// notes every write here, so the count stays 0 unless a call site skips the helper (a lost
/// performance cut, never a lost check: the write still runs, under the same transaction).
/// The first one is logged with its operation.
pub struct OffWriterWrites {
    counter: Counter,
}

impl OffWriterWrites {
    pub const HELP: &'static str =
        "Store writes that ran off the SQLite writer thread: 0 unless a call site skips the service's write helper.";

    pub fn new(registry: &Registry, name: &'static str) -> Self {
        OffWriterWrites { counter: Counter::new(registry, name, Self::HELP) }
    }

    /// Notes the write `op` of a store whose writer thread is `writer`, counting it when it
    /// runs off that thread ([`dlock_rt::dedicated::runs_off`]).
    pub fn note(&self, writer: Option<dlock_rt::dedicated::WriterThread>, op: &'static str) {
        if dlock_rt::dedicated::runs_off(writer.as_ref()) {
            if self.counter.get() == 0 {
                tracing::warn!(
                    op,
                    "a store write ran off the SQLite writer thread: its call site skips the write helper"
                );
            }
            self.counter.inc();
        }
    }

    pub fn get(&self) -> u64 {
        self.counter.get()
    }
}

impl std::fmt::Debug for OffWriterWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffWriterWrites").field("count", &self.get()).finish()
    }
}

/// An integer gauge without labels.
pub struct Gauge {
    handle: GaugeHandle,
    value: AtomicI64,
}

impl Gauge {
    pub fn new(registry: &Registry, name: &'static str, help: &'static str) -> Self {
        Gauge { handle: registry.gauge(name, help, &[]), value: AtomicI64::new(0) }
    }

    pub fn add(&self, delta: i64) {
        let now = self.value.fetch_add(delta, Ordering::Relaxed) + delta;
        self.handle.set(now as f64);
    }

    pub fn set(&self, v: i64) {
        self.value.store(v, Ordering::Relaxed);
        self.handle.set(v as f64);
    }

    pub fn get(&self) -> i64 {
        self.value.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for Gauge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gauge").field("value", &self.value).finish()
    }
}

/// A histogram family (seconds) with one closed tag `T`.
pub struct TaggedHistogram<T: ClosedTag> {
    handles: Vec<(T, HistogramHandle)>,
}

impl<T: ClosedTag> std::fmt::Debug for TaggedHistogram<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaggedHistogram").field("series", &self.handles.len()).finish()
    }
}

impl<T: ClosedTag> TaggedHistogram<T> {
    pub fn new(registry: &Registry, name: &'static str, help: &'static str) -> Self {
        let handles = T::all().iter().map(|t| (*t, registry.histogram(name, help, &[(T::LABEL, t.tag())]))).collect();
        TaggedHistogram { handles }
    }

    /// Records `d` (as seconds) under `tag`.
    pub fn observe(&self, tag: T, d: std::time::Duration) {
        if let Some((_, h)) = self.handles.iter().find(|(t, _)| *t == tag) {
            h.record(d.as_secs_f64());
        }
    }

    /// Runs `f`, recording how long it took on `clock` under `tag`.
    pub async fn time<F: std::future::Future>(&self, clock: &dlock_rt::Clock, tag: T, f: F) -> F::Output {
        let start = clock.now();
        let out = f.await;
        self.observe(tag, clock.now() - start);
        out
    }
}

/// A gauge family with one closed tag `T` (pool connections by state).
pub struct TaggedGauge<T: ClosedTag> {
    handles: Vec<(T, GaugeHandle)>,
}

impl<T: ClosedTag> std::fmt::Debug for TaggedGauge<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaggedGauge").field("series", &self.handles.len()).finish()
    }
}

impl<T: ClosedTag> TaggedGauge<T> {
    pub fn new(registry: &Registry, name: &'static str, help: &'static str) -> Self {
        let handles = T::all().iter().map(|t| (*t, registry.gauge(name, help, &[(T::LABEL, t.tag())]))).collect();
        TaggedGauge { handles }
    }

    pub fn set(&self, tag: T, v: f64) {
        if let Some((_, g)) = self.handles.iter().find(|(t, _)| *t == tag) {
            g.set(v);
        }
    }
}

/// A SQL pool's connections by state (`dlock_db_pool_connections{state}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolState {
    /// Open and waiting for a query.
    Idle,
    /// Open and lent out.
    InUse,
}

impl ClosedTag for PoolState {
    const LABEL: &'static str = "state";
    fn all() -> &'static [Self] {
        &[PoolState::Idle, PoolState::InUse]
    }
    fn tag(self) -> &'static str {
        match self {
            PoolState::Idle => "idle",
            PoolState::InUse => "in_use",
        }
    }
}

/// What a SQL store's pool holds now: connections open, and of them idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    pub size: u32,
    pub idle: u32,
}

/// The gauges of a store's connection pool, set at each scrape.
#[derive(Debug)]
pub struct PoolGauges {
    connections: TaggedGauge<PoolState>,
}

/// Name of the pool gauge family.
pub const POOL_CONNECTIONS: &str = "dlock_db_pool_connections";

impl PoolGauges {
    pub fn new(registry: &Registry) -> PoolGauges {
        PoolGauges {
            connections: TaggedGauge::new(
                registry,
                POOL_CONNECTIONS,
                "Connections of the service's SQL pool by state (0 for stores without a pool).",
            ),
        }
    }

    pub fn set(&self, stats: Option<PoolStats>) {
        let s = stats.unwrap_or_default();
        let idle = s.idle.min(s.size);
        self.connections.set(PoolState::Idle, f64::from(idle));
        self.connections.set(PoolState::InUse, f64::from(s.size - idle));
    }
}

/// `Content-Type` of the Prometheus text format.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Wraps rendered text as a `/metrics` response.
pub fn response(text: String) -> axum::response::Response {
    let mut resp = axum::response::Response::new(axum::body::Body::from(text));
    resp.headers_mut()
        .insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static(PROMETHEUS_CONTENT_TYPE));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Op {
        Read,
        Write,
    }

    impl ClosedTag for Op {
        const LABEL: &'static str = "op";
        fn all() -> &'static [Self] {
            &[Op::Read, Op::Write]
        }
        fn tag(self) -> &'static str {
            match self {
                Op::Read => "read",
                Op::Write => "write",
            }
        }
    }

    #[test]
    fn labeled_counter_renders_every_pinned_value_even_at_zero() {
        let r = Registry::default();
        let c = LabeledCounter::new(&r, "x_total", "help", "outcome", ["a", "b"]);
        c.inc(1);
        c.inc(1);
        c.inc(9);
        let out = r.render();
        assert!(out.contains("# TYPE x_total counter\n"), "{out}");
        assert!(out.contains("x_total{outcome=\"a\"} 0\n"), "{out}");
        assert!(out.contains("x_total{outcome=\"b\"} 2\n"), "{out}");
        assert_eq!((c.get(0), c.get(1), c.get(9)), (0, 2, 0));
    }

    #[test]
    fn a_gauge_and_a_plain_counter_render_their_values() {
        let r = Registry::default();
        let g = Gauge::new(&r, "w", "waiters");
        let c = Counter::new(&r, "c_total", "count");
        g.add(3);
        g.add(-1);
        c.inc();
        let out = r.render();
        assert!(out.contains("# TYPE w gauge\nw 2\n"), "{out}");
        assert!(out.contains("c_total 1\n"), "{out}");
    }

    /// docs/performance.md "The SQLite writer thread": a write on the store's writer
    /// thread, or of a store without one, is not counted; one off the thread is, and the
    /// count is exported from 0.
    #[cfg(not(madsim))]
    #[tokio::test]
    async fn only_a_store_write_off_its_writer_thread_is_counted() {
        let r = Registry::default();
        let off = Arc::new(OffWriterWrites::new(&r, "x_store_writes_off_writer_total"));
        assert!(r.render().contains("x_store_writes_off_writer_total 0\n"), "exported before any write");
        let writer = dlock_rt::dedicated::WriterThread::start("dlock-test-writer").expect("start");
        off.note(None, "claim");
        let (w, o) = (writer.clone(), off.clone());
        writer.run(async move { o.note(Some(w), "claim") }).await;
        assert_eq!(off.get(), 0, "on the writer thread, or no writer thread at all");
        off.note(Some(writer.clone()), "claim");
        off.note(Some(writer), "post");
        assert_eq!(off.get(), 2);
        assert!(r.render().contains("x_store_writes_off_writer_total 2\n"), "{}", r.render());
    }

    #[test]
    fn a_tagged_histogram_renders_its_buckets_for_every_tag_before_any_sample() {
        const B: [f64; 3] = [0.001, 0.01, 0.1];
        let r = Registry::new(&[("op_seconds", &B)]);
        let h = TaggedHistogram::<Op>::new(&r, "op_seconds", "op latency");
        let out = r.render();
        assert!(out.contains("# TYPE op_seconds histogram\n"), "{out}");
        assert!(out.contains("op_seconds_count{op=\"read\"} 0\n"), "{out}");
        assert!(out.contains("op_seconds_count{op=\"write\"} 0\n"), "{out}");
        h.observe(Op::Write, std::time::Duration::from_millis(5));
        let out = r.render();
        assert!(out.contains("op_seconds_bucket{op=\"write\",le=\"0.001\"} 0\n"), "{out}");
        assert!(out.contains("op_seconds_bucket{op=\"write\",le=\"0.01\"} 1\n"), "{out}");
        assert!(out.contains("op_seconds_bucket{op=\"write\",le=\"+Inf\"} 1\n"), "{out}");
        assert!(out.contains("op_seconds_count{op=\"read\"} 0\n"), "{out}");
    }

    #[test]
    fn two_registries_do_not_share_series() {
        let (a, b) = (Registry::default(), Registry::default());
        let ca = Counter::new(&a, "c_total", "count");
        let _cb = Counter::new(&b, "c_total", "count");
        ca.inc();
        assert!(a.render().contains("c_total 1\n"));
        assert!(b.render().contains("c_total 0\n"));
    }

    #[test]
    fn the_exposition_order_does_not_depend_on_the_order_of_registration() {
        let (a, b) = (Registry::default(), Registry::default());
        let _a = (Counter::new(&a, "z_total", "z"), LabeledCounter::new(&a, "a_total", "a", "k", ["x", "y"]));
        let _b = (LabeledCounter::new(&b, "a_total", "a", "k", ["y", "x"]), Counter::new(&b, "z_total", "z"));
        assert_eq!(a.render(), b.render());
        assert!(a.render().find("a_total").lt(&a.render().find("z_total")));
    }

    #[test]
    fn a_scrape_can_ask_for_some_families_by_name() {
        let r = Registry::default();
        let _c = (Counter::new(&r, "a_total", "a"), Counter::new(&r, "b_total", "b"), Gauge::new(&r, "w", "w"));
        let only = requested_families(Some("name[]=w&x=1&name%5B%5D=b_total&name[]=bad%20name&name[]="));
        assert_eq!(only, ["w", "b_total"]);
        let out = r.render_families(&only);
        assert!(out.contains("\nw 0\n") && out.contains("b_total 0\n") && !out.contains("a_total"), "{out}");
        assert_eq!(requested_families(None), Vec::<String>::new());
        assert_eq!(r.render_families(&[]), r.render());
    }

    #[test]
    #[should_panic(expected = "has no bucket set")]
    fn a_histogram_without_a_bucket_set_is_refused() {
        let r = Registry::default();
        let _h = TaggedHistogram::<Op>::new(&r, "op_seconds", "op latency");
    }

    #[cfg(not(madsim))]
    #[test]
    fn a_timed_future_is_recorded_under_its_tag() {
        const B: [f64; 2] = [0.001, 1.0];
        let r = Registry::new(&[("op_seconds", &B)]);
        let h = TaggedHistogram::<Op>::new(&r, "op_seconds", "op latency");
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        let v = rt.block_on(h.time(&dlock_rt::Clock::system(), Op::Read, async { 7 }));
        assert_eq!(v, 7);
        let out = r.render();
        assert!(out.contains("op_seconds_count{op=\"read\"} 1\n"), "{out}");
        assert!(out.contains("op_seconds_count{op=\"write\"} 0\n"), "{out}");
    }

    #[test]
    fn pool_gauges_split_open_connections_into_idle_and_in_use() {
        let r = Registry::default();
        let p = PoolGauges::new(&r);
        p.set(Some(PoolStats { size: 5, idle: 2 }));
        let out = r.render();
        assert!(out.contains("dlock_db_pool_connections{state=\"idle\"} 2\n"), "{out}");
        assert!(out.contains("dlock_db_pool_connections{state=\"in_use\"} 3\n"), "{out}");
    }
}
