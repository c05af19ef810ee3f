//! The simulation's record of the writes clients sent and the answers they got, on the wire.
//!
//! The oracle judges answers against the stores: an answer marked `retrySafe: true` must
//! have left no trace, and an idempotent write's answer must be the bytes its record holds.
//! Both need what the *caller* received, which no store knows. `HttpClient::send`
//! ([`crate::http`]), the one door every typed client (payment, rail, lock) goes through,
//! records each `POST` here: the request (path, headers, body) when it starts, and its fate
//! (a complete answer's status and body bytes, or a failure) when it ends.
//!
//! Invariants:
//! - Outside `cfg(madsim)` nothing is recorded and nothing is kept: [`begin`] returns `None`
//!   and [`snapshot`] is empty. Production pays one branch per request.
//! - Under `cfg(madsim)` the record is per thread (one madsim runtime, one seed, per
//!   thread) and off until [`enable`] (which also forgets what an earlier seed left).
//! - Every recorded step takes the next value of one counter ([`seq`]): the order of sends,
//!   answers and anything else that reads [`seq`] on the same thread (a store's commit seen
//!   by the oracle) is the order in which they happened.
//! - At most [`EXCHANGES_MAX`] exchanges are kept per seed; past it nothing more is
//!   recorded and [`overflowed`] says so (a check over the record must then say it is
//!   partial, never pass silently).
//! - A request whose future is dropped before it ends (its caller gave up, its node was
//!   killed) keeps `fate: None`: its outcome is unknown, never "answered".
//!
//! ## On real processes: the event seam
//! Outside the simulation a process keeps no record: with an event sink installed (a trace
//! file, `trace.file`), each judged write ([`judged`]: a fenced write, or an acquire) goes
//! to the seam instead ([`trace_begin`], [`trace_finish`]), as two events of node
//! [`TRACE_NODE`]: `exchange_sent` (`run`, `id`, `authority`, `method`, `path`, its
//! fencing token and idempotency key, `request`) when it starts, and `exchange_done` (`run`,
//! `id`, `status` and `body`, or `failed` and `nothing_sent`) when it ends. The real run
//! rebuilds [`Exchange`]s from them on the host's monotonic clock (docs/real-runs.md, "What
//! callers received"). Invariants:
//! - no other header is written: never `Authorization`, never the grant's signature;
//! - a body over [`TRACED_BODY_BYTES_MAX`] bytes, or not UTF-8, is left out (`request` or
//!   `body` absent: the judge reads that exchange's outcome as unknown);
//! - `id` counts this process's traced writes from 0 and `run` is drawn once per process
//!   start, so a restarted process's ids stay apart; a write whose future was dropped has
//!   an `exchange_sent` and no `exchange_done`: unknown, as above.

/// Most exchanges one seed records.
pub const EXCHANGES_MAX: usize = 200_000;

/// How a recorded request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// A complete answer arrived.
    Answered { status: u16, body: Vec<u8> },
    /// The request failed; `nothing_sent` when provably not a byte left the caller.
    Failed { nothing_sent: bool },
}

/// One recorded write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    /// [`seq`] when the request started.
    pub seq_sent: u64,
    /// [`seq`] when it ended (`None`: it never did).
    pub seq_done: Option<u64>,
    /// `host:port` it was sent to.
    pub authority: String,
    pub method: String,
    pub path: String,
    /// The headers the caller set (names lower-cased).
    pub headers: Vec<(String, String)>,
    pub request: Vec<u8>,
    pub fate: Option<Fate>,
}

impl Exchange {
    /// The value of header `name` (lower-case), if the caller set it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

#[cfg(madsim)]
#[derive(Default)]
struct Log {
    enabled: bool,
    seq: u64,
    exchanges: Vec<Exchange>,
    overflowed: bool,
}

#[cfg(madsim)]
thread_local! {
    static LOG: std::cell::RefCell<Log> = std::cell::RefCell::new(Log::default());
}

/// Starts recording on this thread, forgetting anything recorded before (simulation only).
pub fn enable() {
    #[cfg(madsim)]
    LOG.with(|l| *l.borrow_mut() = Log { enabled: true, ..Log::default() });
}

/// Stops recording and forgets everything (simulation only).
pub fn reset() {
    #[cfg(madsim)]
    LOG.with(|l| *l.borrow_mut() = Log::default());
}

/// Takes the next value of this thread's counter (0 outside the simulation or when off).
pub fn seq() -> u64 {
    #[cfg(madsim)]
    return LOG.with(|l| {
        let mut l = l.borrow_mut();
        l.seq += 1;
        l.seq
    });
    #[cfg(not(madsim))]
    0
}

/// Records the start of a request; the index to [`finish`] it with (`None` when not
/// recording).
pub fn begin(authority: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Option<usize> {
    #[cfg(madsim)]
    return LOG.with(|l| {
        let mut l = l.borrow_mut();
        if !l.enabled {
            return None;
        }
        if l.exchanges.len() >= EXCHANGES_MAX {
            l.overflowed = true;
            return None;
        }
        l.seq += 1;
        let seq_sent = l.seq;
        l.exchanges.push(Exchange {
            seq_sent,
            seq_done: None,
            authority: authority.to_owned(),
            method: method.to_owned(),
            path: path.to_owned(),
            headers: headers.iter().map(|(k, v)| (k.to_ascii_lowercase(), (*v).to_owned())).collect(),
            request: body.to_vec(),
            fate: None,
        });
        Some(l.exchanges.len() - 1)
    });
    #[cfg(not(madsim))]
    {
        let _ = (authority, method, path, headers, body);
        None
    }
}

/// Records how the request of `index` ended.
pub fn finish(index: Option<usize>, fate: Fate) {
    #[cfg(madsim)]
    if let Some(i) = index {
        LOG.with(|l| {
            let mut l = l.borrow_mut();
            l.seq += 1;
            let seq = l.seq;
            if let Some(e) = l.exchanges.get_mut(i) {
                e.seq_done = Some(seq);
                e.fate = Some(fate);
            }
        });
    }
    #[cfg(not(madsim))]
    let _ = (index, fate);
}

/// The node name of the traced exchanges' events (module doc, "On real processes").
pub const TRACE_NODE: &str = "http-client";

/// Longest request or answer body an `exchange_sent` or `exchange_done` event carries, in
/// bytes; a longer one is left out.
pub const TRACED_BODY_BYTES_MAX: usize = 65_536;

/// Whether the oracle's wire checks judge a request: a fenced write (it carries
/// `X-Fencing-Token`: a claim, a post, a submission, a batch) or an acquire (L4).
pub fn judged(path: &str, headers: &[(&str, &str)]) -> bool {
    path.starts_with("/v1/locks/") && path.ends_with("/acquire")
        || headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(dlock_contract::HEADER_FENCING_TOKEN))
}

/// A traced write in flight: its process start's `run` and its `id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Traced {
    pub run: u64,
    pub id: u64,
}

#[cfg(not(madsim))]
fn body_text(body: &[u8]) -> Option<&str> {
    (body.len() <= TRACED_BODY_BYTES_MAX).then(|| std::str::from_utf8(body).ok()).flatten()
}

/// Outside the simulation, with an event sink installed: emits a judged write's
/// `exchange_sent` (module doc) and returns what [`trace_finish`] ends it with. `None` in
/// the simulation (its record is [`begin`]'s), without a sink, or for a write not [`judged`].
pub fn trace_begin(authority: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Option<Traced> {
    #[cfg(not(madsim))]
    {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        static RUN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        if !crate::events::enabled() || !judged(path, headers) {
            return None;
        }
        let t = Traced { run: *RUN.get_or_init(crate::rand::random_u64), id: NEXT.fetch_add(1, Ordering::Relaxed) };
        let header = |name: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| *v);
        crate::events::emit(TRACE_NODE, "exchange_sent", || {
            let mut f: Vec<(&'static str, serde_json::Value)> = vec![
                ("run", t.run.into()),
                ("id", t.id.into()),
                ("authority", authority.into()),
                ("method", method.into()),
                ("path", path.into()),
            ];
            if let Some(v) = header(dlock_contract::HEADER_FENCING_TOKEN) {
                f.push(("fencing_token", v.into()));
            }
            if let Some(v) = header(dlock_contract::HEADER_IDEMPOTENCY_KEY) {
                f.push(("idempotency_key", v.into()));
            }
            if let Some(text) = body_text(body) {
                f.push(("request", text.into()));
            }
            f
        });
        Some(t)
    }
    #[cfg(madsim)]
    {
        let _ = (authority, method, path, headers, body);
        None
    }
}

/// Emits the `exchange_done` of a write [`trace_begin`] traced.
pub fn trace_finish(traced: Option<Traced>, fate: &Fate) {
    let Some(t) = traced else { return };
    crate::events::emit(TRACE_NODE, "exchange_done", || {
        let mut f: Vec<(&'static str, serde_json::Value)> = vec![("run", t.run.into()), ("id", t.id.into())];
        match fate {
            Fate::Answered { status, body } => {
                f.push(("status", (*status).into()));
                #[cfg(not(madsim))]
                if let Some(text) = body_text(body) {
                    f.push(("body", text.into()));
                }
                #[cfg(madsim)]
                let _ = body;
            }
            Fate::Failed { nothing_sent } => {
                f.push(("failed", true.into()));
                f.push(("nothing_sent", (*nothing_sent).into()));
            }
        }
        f
    });
}

/// Everything recorded on this thread since [`enable`] (empty outside the simulation).
pub fn snapshot() -> Vec<Exchange> {
    #[cfg(madsim)]
    return LOG.with(|l| l.borrow().exchanges.clone());
    #[cfg(not(madsim))]
    Vec::new()
}

/// Whether [`EXCHANGES_MAX`] was reached and later requests went unrecorded.
pub fn overflowed() -> bool {
    #[cfg(madsim)]
    return LOG.with(|l| l.borrow().overflowed);
    #[cfg(not(madsim))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(madsim)]
    #[test]
    fn a_request_is_recorded_with_its_fate_in_sequence_once_enabled() {
        reset();
        assert_eq!(begin("a:1", "POST", "/x", &[], b"{}"), None, "off until enabled");
        enable();
        let i = begin("a:1", "POST", "/x", &[("X-Fencing-Token", "7")], b"{}");
        let mid = seq();
        finish(i, Fate::Answered { status: 503, body: b"e".to_vec() });
        let j = begin("a:1", "POST", "/y", &[], b"");
        let log = snapshot();
        assert_eq!(log.len(), 2);
        assert!(log[0].seq_sent < mid && log[0].seq_done.is_some_and(|d| d > mid));
        assert_eq!(log[0].header("x-fencing-token"), Some("7"));
        assert_eq!(log[0].fate, Some(Fate::Answered { status: 503, body: b"e".to_vec() }));
        assert_eq!((j, &log[1].fate), (Some(1), &None), "a request that never ended keeps no fate");
        enable();
        assert!(snapshot().is_empty() && !overflowed());
        reset();
    }

    #[cfg(not(madsim))]
    #[test]
    fn outside_the_simulation_a_judged_write_goes_to_the_seam_without_its_credentials() {
        use std::sync::{Arc, Mutex};
        type Seen = Mutex<Vec<(&'static str, crate::events::Fields)>>;
        struct Collect(Seen);
        impl crate::events::Sink for Collect {
            fn record(&self, _node: &str, kind: &'static str, fields: crate::events::Fields) {
                if let Ok(mut v) = self.0.lock() {
                    v.push((kind, fields));
                }
            }
        }
        let headers = [
            ("Authorization", "Bearer secret-token"),
            (dlock_contract::HEADER_FENCING_TOKEN, "7"),
            (dlock_contract::HEADER_FENCING_SIGNATURE, "sig"),
            (dlock_contract::HEADER_IDEMPOTENCY_KEY, "k-1"),
        ];
        let _one = crate::events::TEST_SINK_LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        assert_eq!(trace_begin("a:1", "POST", "/v1/payouts/p/claim", &headers, b"{}"), None, "no sink: nothing");
        let sink = Arc::new(Collect(Mutex::new(Vec::new())));
        let _g = crate::events::install(sink.clone());
        assert_eq!(trace_begin("a:1", "POST", "/v1/sessions/s/heartbeat", &[], b"{}"), None, "not judged");
        let t = trace_begin("a:1", "POST", "/v1/payouts/p/claim", &headers, b"{\"expectedState\":\"PENDING\"}");
        assert!(t.is_some());
        trace_finish(t, &Fate::Answered { status: 409, body: br#"{"code":"FENCED_OUT"}"#.to_vec() });
        let big = vec![b'x'; TRACED_BODY_BYTES_MAX + 1];
        let u = trace_begin("a:1", "POST", "/v1/locks/k/acquire", &[], &big);
        trace_finish(u, &Fate::Failed { nothing_sent: true });
        let seen = sink.0.lock().map(|v| v.clone()).unwrap_or_default();
        let kinds: Vec<&str> = seen.iter().map(|(k, _)| *k).collect();
        assert_eq!(kinds, ["exchange_sent", "exchange_done", "exchange_sent", "exchange_done"]);
        let text = format!("{seen:?}");
        assert!(!text.contains("secret-token") && !text.contains("sig\""), "{text}");
        let (sent, done) = (&seen[0].1, &seen[1].1);
        assert_eq!(sent.get("fencing_token").and_then(|v| v.as_str()), Some("7"));
        assert_eq!(sent.get("idempotency_key").and_then(|v| v.as_str()), Some("k-1"));
        assert_eq!(sent.get("id"), done.get("id"));
        assert_eq!(done.get("body").and_then(|v| v.as_str()), Some(r#"{"code":"FENCED_OUT"}"#));
        assert!(!seen[2].1.contains_key("request"), "a body over the bound is left out");
        assert_eq!(seen[3].1.get("nothing_sent").and_then(|v| v.as_bool()), Some(true));
    }

    #[cfg(not(madsim))]
    #[test]
    fn outside_the_simulation_nothing_is_recorded() {
        enable();
        assert_eq!(begin("a:1", "POST", "/x", &[], b"{}"), None);
        assert!(snapshot().is_empty());
        assert_eq!(seq(), 0);
    }
}
