//! `dlock demo --trace FILE.jsonl`: the incident trace of a real run. The services of the
//! one-process cluster emit their protocol events through `dlock_rt::events`; this sink
//! writes each as one line in the simulation's schema (docs/simulation.md "Incident trace",
//! "The demo's trace"): the same six fixed fields first (`seq`, `t_ms`, `node`, `mono_ms`,
//! `wall_ms`, `kind`), then the kind's fields sorted by name, rendered by the same function.
//!
//! In one process there is one clock: `t_ms` and `mono_ms` are both the ms since the trace
//! began on the host's monotonic clock (`dlock_rt::events::mono_ms`, the scale of a
//! `lease_belief`'s `local_deadline_mono_ms`); `wall_ms` is the host's wall clock; `node`
//! is the emitting service's name for itself (`lock-server`, `payment-resource`,
//! `rail-proxy`, `rail-stub`, `reconciler`, or the executor's owner id); the demo's own
//! lines (`trace_start`, `phase`, `trace_end`) are the node `demo`.
//!
//! Invariants of this module:
//! - `seq` is 0, 1, 2, … in file order and `t_ms` never decreases: both are taken under
//!   the one mutex that also orders the writes.
//! - At most [`DEMO_TRACE_EVENTS_MAX`] events are written; past it they are counted, and
//!   the last line (`trace_end`) says how many were dropped.
//! - A write error stops the writing (the run goes on) and is reported by [`TraceFile::finish`].
//!
//! A service process started with `--trace-file FILE` (`trace.file`, `DLOCK_TRACE_FILE`)
//! writes the same lines through [`TraceFile::start_service`]: appended to `FILE`, one
//! `write` per line with nothing buffered, so a `kill -9` loses no line already emitted
//! (at most the last one is cut short). Its `mono_ms` is the host's monotonic clock, the
//! scale every process of one host shares, so `dlock-real` merges the files of a real run
//! into one history (docs/real-runs.md).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use dlock_rt::events::{self, Fields, LineHead, Sink};
use dlock_rt::Clock;
use serde_json::Value;

/// Bound on the events one demo trace writes.
pub const DEMO_TRACE_EVENTS_MAX: u64 = 2_000_000;

/// The node name of the demo's own lines.
pub const DEMO_NODE: &str = "demo";

struct State {
    out: Option<Out>,
    seq: u64,
    last_t_ms: u64,
    /// The `mono_ms` reading when the trace began: `t_ms` counts from it.
    origin_ms: u64,
    dropped: u64,
    error: Option<String>,
}

/// Where the lines go: buffered for the demo (flushed at its end), or straight to the file
/// for a service, which may be killed at any instant.
enum Out {
    Buffered(BufWriter<File>),
    Direct(File),
}

impl Out {
    fn line(&mut self, line: &str) -> std::io::Result<()> {
        match self {
            Out::Buffered(w) => writeln!(w, "{line}"),
            Out::Direct(f) => {
                let mut bytes = Vec::with_capacity(line.len() + 1);
                bytes.extend_from_slice(line.as_bytes());
                bytes.push(b'\n');
                f.write_all(&bytes)
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Out::Buffered(w) => w.flush(),
            Out::Direct(f) => f.flush(),
        }
    }
}

struct FileSink(Mutex<State>);

impl FileSink {
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut g = match self.0.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut g)
    }

    fn write(&self, node: &str, kind: &str, fields: &Fields) {
        self.with(|s| {
            let Some(out) = s.out.as_mut() else { return };
            if s.seq >= DEMO_TRACE_EVENTS_MAX && kind != "trace_end" {
                s.dropped += 1;
                return;
            }
            let mono_ms = events::mono_ms(Clock::system().now());
            let t_ms = mono_ms.saturating_sub(s.origin_ms).max(s.last_t_ms);
            let wall_ms = Clock::system().wall().timestamp_millis();
            let head = LineHead { seq: s.seq, t_ms, node, mono_ms, wall_ms, kind };
            let line = events::render_line(head, fields);
            if let Err(e) = out.line(&line) {
                s.error = Some(e.to_string());
                s.out = None;
                return;
            }
            s.seq += 1;
            s.last_t_ms = t_ms;
        });
    }
}

impl Sink for FileSink {
    fn record(&self, node: &str, kind: &'static str, fields: Fields) {
        self.write(node, kind, &fields);
    }
}

/// An open demo trace, installed on the event seam until [`TraceFile::finish`].
pub struct TraceFile {
    sink: Arc<FileSink>,
    installed: Option<events::Installed>,
}

impl TraceFile {
    /// Creates `path` (truncating it), writes `trace_start`, and installs the sink.
    pub fn start(path: &Path, config: &str) -> Result<TraceFile, String> {
        let file = File::create(path).map_err(|e| format!("cannot create the trace file {}: {e}", path.display()))?;
        Ok(TraceFile::begin(Out::Buffered(BufWriter::new(file)), DEMO_NODE, config))
    }

    /// A service's trace (module doc): appends to `path` (created if absent), writes
    /// `trace_start` as `node` with `config`, and installs the sink for the process's life.
    pub fn start_service(path: &Path, node: &str, config: &str) -> Result<TraceFile, String> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("cannot open the trace file {}: {e}", path.display()))?;
        Ok(TraceFile::begin(Out::Direct(file), node, config))
    }

    fn begin(out: Out, node: &str, config: &str) -> TraceFile {
        let origin_ms = events::mono_ms(Clock::system().now());
        let sink = Arc::new(FileSink(Mutex::new(State {
            out: Some(out),
            seq: 0,
            last_t_ms: 0,
            origin_ms,
            dropped: 0,
            error: None,
        })));
        sink.write(
            node,
            "trace_start",
            &[("schema", Value::from(events::SCHEMA)), ("seed", Value::Null), ("config", config.into())]
                .into_iter()
                .collect(),
        );
        let installed = Some(events::install(sink.clone()));
        TraceFile { sink, installed }
    }

    /// A phase marker of the demo (`seed`, `run`, `checks`).
    pub fn phase(&self, phase: &str, detail: &str) {
        self.sink.write(
            DEMO_NODE,
            "phase",
            &[("phase", Value::from(phase)), ("detail", detail.into())].into_iter().collect(),
        );
    }

    /// Removes the sink, writes `trace_end` and flushes: the lines written, or why not.
    pub fn finish(mut self) -> Result<u64, String> {
        self.installed.take();
        let (events, dropped) = self.sink.with(|s| (s.seq, s.dropped));
        self.sink.write(
            DEMO_NODE,
            "trace_end",
            &[("events", Value::from(events)), ("dropped", dropped.into())].into_iter().collect(),
        );
        self.sink.with(|s| {
            if let Some(out) = s.out.as_mut() {
                if let Err(e) = out.flush() {
                    s.error = Some(e.to_string());
                }
            }
            match s.error.take() {
                Some(e) => Err(format!("the trace file could not be written: {e}")),
                None => Ok(s.seq),
            }
        })
    }
}
