//! W3C trace context (C3-extensions E-17): one trace per payout attempt, joined across
//! every hop (executor → lock-server, payment-resource, rail-proxy; proxy → rail-stub).
//!
//! A [`TraceContext`] (trace id, this span's id, its parent's id, flags) is carried per
//! task in a tokio task-local ([`TraceContext::scope`], [`current`]); it works the same
//! under madsim, where every node runs in one process. Who makes one:
//! - the executor, once per payout attempt: [`TraceContext::root`], its trace id derived
//!   from a per-process seed ([`TraceSeed`]) and an attempt counter;
//! - every server, once per request: [`TraceContext::for_request`] adopts the trace of a
//!   valid incoming `traceparent` (its span's parent is the caller's span) or starts a new
//!   trace;
//! - every outgoing call through [`crate::http::HttpClient::send`] made inside a context:
//!   [`TraceContext::child`], sent as `traceparent: 00-<trace>-<child span>-<flags>`.
//!
//! Ids and the seeded simulation: a server draws exactly two `u64`s from [`crate::rand`]
//! per request, whether or not a `traceparent` arrived (a fresh trace id takes two; an
//! adopted trace uses them for the server's span id), which is what a server drew before
//! traces were propagated. Every other id is derived by hashing (the trace id, the parent
//! span id and a per-context counter), so propagation adds no random draw and a seed's
//! schedule is the one it was.
//!
//! Invariants (asserted): a context's trace id and span id are never zero; a child keeps
//! its parent's trace id and flags, and names its parent's span as its parent.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The W3C header name.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// The only version this process writes.
pub const TRACEPARENT_VERSION: &str = "00";
/// Length of a version-00 `traceparent` value (`vv-32hex-16hex-ff`).
pub const TRACEPARENT_V00_CHARS: usize = 55;
/// The `sampled` bit of the trace flags.
pub const FLAG_SAMPLED: u8 = 0x01;

/// A parsed, valid `traceparent` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: u128,
    /// The caller's span id.
    pub parent_id: u64,
    pub flags: u8,
}

fn lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl TraceParent {
    /// Parses a `traceparent` value by the W3C rules; `None` (the header is ignored) for a
    /// value that is not one: wrong lengths, uppercase or non-hex digits, version `ff`, an
    /// all-zero trace or parent id, a version-00 value with anything after the flags. A
    /// higher version is read for its first four fields if what follows is `-...`.
    pub fn parse(raw: &str) -> Option<TraceParent> {
        let raw = raw.trim_matches(|c| c == ' ' || c == '\t');
        if raw.len() < TRACEPARENT_V00_CHARS || !raw.is_ascii() {
            return None;
        }
        let (version, rest) = (&raw[..2], &raw[2..]);
        if !lower_hex(version, 2) || version == "ff" {
            return None;
        }
        if version == TRACEPARENT_VERSION && raw.len() != TRACEPARENT_V00_CHARS {
            return None;
        }
        if raw.len() > TRACEPARENT_V00_CHARS && raw.as_bytes()[TRACEPARENT_V00_CHARS] != b'-' {
            return None;
        }
        let b = rest.as_bytes();
        if b[0] != b'-' || b[33] != b'-' || b[50] != b'-' {
            return None;
        }
        let (trace, parent, flags) = (&rest[1..33], &rest[34..50], &rest[51..53]);
        if !lower_hex(trace, 32) || !lower_hex(parent, 16) || !lower_hex(flags, 2) {
            return None;
        }
        let trace_id = u128::from_str_radix(trace, 16).ok()?;
        let parent_id = u64::from_str_radix(parent, 16).ok()?;
        let flags = u8::from_str_radix(flags, 16).ok()?;
        (trace_id != 0 && parent_id != 0).then_some(TraceParent { trace_id, parent_id, flags })
    }

    /// The header value (version 00).
    pub fn header(&self) -> String {
        format!("{TRACEPARENT_VERSION}-{:032x}-{:016x}-{:02x}", self.trace_id, self.parent_id, self.flags)
    }
}

/// One span of one trace, carried by the task doing its work.
#[derive(Debug, Clone)]
pub struct TraceContext {
    trace_id: u128,
    span_id: u64,
    parent_id: Option<u64>,
    flags: u8,
    /// How many children this span has made (feeds the derived child span ids).
    children: Arc<AtomicU64>,
}

tokio::task_local! {
    static CURRENT: TraceContext;
}

/// The context of the calling task, if it runs inside one.
pub fn current() -> Option<TraceContext> {
    CURRENT.try_with(Clone::clone).ok()
}

/// `f`, run inside the caller's context and tracing span (if any): for work handed to a
/// spawned task that is still part of the caller's request.
pub fn carry<F: Future>(f: F) -> impl Future<Output = F::Output> {
    use tracing::Instrument;
    let ctx = current();
    let f = f.in_current_span();
    async move {
        match ctx {
            Some(c) => c.scope(f).await,
            None => f.await,
        }
    }
}

/// The one `traceparent` value of `headers`; `None` when it is absent, repeated (W3C: a
/// request with two is malformed) or not text.
pub fn traceparent_of(headers: &http::HeaderMap) -> Option<&str> {
    let mut all = headers.get_all(TRACEPARENT_HEADER).iter();
    match (all.next(), all.next()) {
        (Some(v), None) => v.to_str().ok(),
        _ => None,
    }
}

/// SplitMix64's finaliser: a bijective mix of 64 bits.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A non-zero id derived from `words`.
fn derive(words: &[u64]) -> u64 {
    let h = words.iter().fold(0x6a09_e667_f3bc_c908_u64, |acc, w| mix(acc ^ mix(*w)));
    if h == 0 {
        1
    } else {
        h
    }
}

/// Where an executor's trace ids come from: a per-process seed and a counter, so a trace
/// id per payout attempt costs no random draw.
#[derive(Debug)]
pub struct TraceSeed {
    seed: u64,
    attempts: AtomicU64,
}

impl TraceSeed {
    /// A seed from `words` (the executor passes its owner id's hash and its start time) and,
    /// outside the simulation, the operating system's randomness. Inside a madsim runtime no
    /// draw is taken (it would move every later draw of a seeded run).
    pub fn new(words: &[u64]) -> TraceSeed {
        #[cfg(madsim)]
        let salt = 0;
        #[cfg(not(madsim))]
        let salt = u64::from_le_bytes(crate::rand::secret_bytes::<8>());
        let mut all = words.to_vec();
        all.push(salt);
        TraceSeed { seed: derive(&all), attempts: AtomicU64::new(0) }
    }

    /// A new root context (a new trace, sampled).
    pub fn next_root(&self) -> TraceContext {
        let n = self.attempts.fetch_add(1, Ordering::Relaxed);
        let hi = derive(&[self.seed, n, 1]);
        let lo = derive(&[self.seed, n, 2]);
        TraceContext::root((u128::from(hi) << 64) | u128::from(lo), FLAG_SAMPLED)
    }
}

/// A stable 64-bit hash of `s` (for [`TraceSeed::new`]'s words).
pub fn hash_str(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

impl TraceContext {
    fn new(trace_id: u128, span_id: u64, parent_id: Option<u64>, flags: u8) -> TraceContext {
        assert!(trace_id != 0 && span_id != 0, "E-17: trace and span ids are never zero");
        TraceContext { trace_id, span_id, parent_id, flags, children: Arc::new(AtomicU64::new(0)) }
    }

    /// The root span of a new trace `trace_id` (non-zero; zero is replaced by 1).
    pub fn root(trace_id: u128, flags: u8) -> TraceContext {
        let trace_id = trace_id.max(1);
        let span_id = derive(&[(trace_id >> 64) as u64, trace_id as u64, 0]);
        TraceContext::new(trace_id, span_id, None, flags)
    }

    /// A server's span for one request: the trace of `traceparent` when it is a valid
    /// value ([`TraceParent::parse`]), else a new trace. Draws two `u64`s either way (see
    /// the module documentation).
    pub fn for_request(traceparent: Option<&str>) -> TraceContext {
        let (hi, lo) = (crate::rand::random_u64(), crate::rand::random_u64());
        match traceparent.and_then(TraceParent::parse) {
            Some(p) => TraceContext::new(p.trace_id, derive(&[hi, lo]), Some(p.parent_id), p.flags),
            None => {
                let trace_id = ((u128::from(hi) << 64) | u128::from(lo)).max(1);
                TraceContext::new(trace_id, derive(&[hi, lo]), None, FLAG_SAMPLED)
            }
        }
    }

    /// A new child span of this one (same trace and flags; this span is its parent).
    pub fn child(&self) -> TraceContext {
        let n = self.children.fetch_add(1, Ordering::Relaxed);
        let span_id = derive(&[(self.trace_id >> 64) as u64, self.trace_id as u64, self.span_id, n]);
        let c = TraceContext::new(self.trace_id, span_id, Some(self.span_id), self.flags);
        assert!(c.trace_id == self.trace_id && c.parent_id == Some(self.span_id), "E-17: a child joins its parent");
        c
    }

    pub fn trace_id(&self) -> u128 {
        self.trace_id
    }

    pub fn span_id(&self) -> u64 {
        self.span_id
    }

    pub fn parent_id(&self) -> Option<u64> {
        self.parent_id
    }

    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// The trace id as 32 lowercase hex characters (the envelope's `traceId`).
    pub fn trace_id_hex(&self) -> String {
        format!("{:032x}", self.trace_id)
    }

    /// This span's id as 16 lowercase hex characters.
    pub fn span_id_hex(&self) -> String {
        format!("{:016x}", self.span_id)
    }

    /// The parent span's id as 16 lowercase hex characters; empty for a root.
    pub fn parent_id_hex(&self) -> String {
        self.parent_id.map(|p| format!("{p:016x}")).unwrap_or_default()
    }

    /// The `traceparent` value naming this span as the parent.
    pub fn traceparent(&self) -> String {
        TraceParent { trace_id: self.trace_id, parent_id: self.span_id, flags: self.flags }.header()
    }

    /// Runs `f` with this context as the task's current one.
    pub async fn scope<F: Future>(self, f: F) -> F::Output {
        CURRENT.scope(self, f).await
    }

    /// The tracing span of a server handling one request (`otel.kind = server`).
    pub fn server_span(&self, method: &str, path: &str) -> tracing::Span {
        tracing::info_span!(
            "dlock.request",
            otel.name = format!("{method} {path}"),
            otel.kind = "server",
            traceId = %self.trace_id_hex(),
            spanId = %self.span_id_hex(),
            parentSpanId = %self.parent_id_hex(),
            method,
            path,
        )
    }

    /// The tracing span of one outgoing call (`otel.kind = client`).
    pub fn client_span(&self, method: &str, authority: &str, path: &str) -> tracing::Span {
        tracing::info_span!(
            "dlock.call",
            otel.name = format!("{method} {path}"),
            otel.kind = "client",
            traceId = %self.trace_id_hex(),
            spanId = %self.span_id_hex(),
            parentSpanId = %self.parent_id_hex(),
            peer = authority,
            method,
            path,
        )
    }

    /// The tracing span of a root of work (the executor's payout attempt).
    pub fn work_span(&self, name: &str, subject: &str) -> tracing::Span {
        tracing::info_span!(
            "dlock.work",
            otel.name = name.to_owned(),
            otel.kind = "internal",
            traceId = %self.trace_id_hex(),
            spanId = %self.span_id_hex(),
            parentSpanId = %self.parent_id_hex(),
            subject,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_parses_and_renders_back() {
        let p = TraceParent::parse(GOOD).expect("valid");
        assert_eq!(p.trace_id, 0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736);
        assert_eq!(p.parent_id, 0x00f0_67aa_0ba9_02b7);
        assert_eq!(p.flags, 1);
        assert_eq!(p.header(), GOOD);
        // A later version: the first four fields, if what follows starts with '-'.
        assert!(TraceParent::parse(&format!("01{}-extra", &GOOD[2..])).is_some());
        assert!(TraceParent::parse(&format!("01{}", &GOOD[2..])).is_some());
    }

    #[test]
    fn invalid_traceparents_are_ignored_per_the_w3c_rules() {
        let bad = [
            ("version ff", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned()),
            ("zero trace id", "00-00000000000000000000000000000000-00f067aa0ba902b7-01".to_owned()),
            ("zero parent id", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01".to_owned()),
            ("uppercase trace id", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01".to_owned()),
            ("uppercase version", "0A-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned()),
            ("short trace id", "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01".to_owned()),
            ("long parent id", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b77-01".to_owned()),
            ("short flags", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1".to_owned()),
            ("v00 with a tail", format!("{GOOD}-x")),
            ("later version, no dash after", format!("01{}x", &GOOD[2..])),
            ("not hex", "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01".to_owned()),
            ("wrong separators", "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01".to_owned()),
            ("empty", String::new()),
            ("non-ascii", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0é".to_owned()),
        ];
        for (case, raw) in bad {
            assert_eq!(TraceParent::parse(&raw), None, "{case}: {raw}");
        }
    }

    #[test]
    fn a_server_adopts_a_valid_trace_and_starts_a_new_one_otherwise() {
        let adopted = TraceContext::for_request(Some(GOOD));
        assert_eq!(adopted.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(adopted.parent_id_hex(), "00f067aa0ba902b7");
        assert_ne!(adopted.span_id, 0x00f0_67aa_0ba9_02b7);
        let fresh = TraceContext::for_request(Some("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        assert_ne!(fresh.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(fresh.parent_id(), None);
        assert_eq!(fresh.trace_id_hex().len(), 32);
    }

    #[test]
    fn children_share_the_trace_and_name_their_parent_with_distinct_span_ids() {
        let seed = TraceSeed::new(&[hash_str("executor-1"), 7]);
        let (a, b) = (seed.next_root(), seed.next_root());
        assert_ne!(a.trace_id(), b.trace_id(), "one trace per attempt");
        let (c1, c2) = (a.child(), a.child());
        assert_eq!((c1.trace_id(), c1.parent_id()), (a.trace_id(), Some(a.span_id())));
        assert_ne!(c1.span_id(), c2.span_id());
        assert_ne!(c1.span_id(), a.span_id());
        let sent = TraceParent::parse(&c1.traceparent()).expect("we send valid values");
        assert_eq!((sent.trace_id, sent.parent_id, sent.flags), (a.trace_id(), c1.span_id(), FLAG_SAMPLED));
    }

    #[test]
    fn only_a_single_traceparent_header_is_read() {
        let mut h = http::HeaderMap::new();
        assert_eq!(traceparent_of(&h), None);
        h.append(TRACEPARENT_HEADER, http::HeaderValue::from_static(GOOD));
        assert_eq!(traceparent_of(&h), Some(GOOD));
        h.append(TRACEPARENT_HEADER, http::HeaderValue::from_static(GOOD));
        assert_eq!(traceparent_of(&h), None);
    }

    #[tokio::test]
    async fn the_context_follows_its_task_and_a_carried_future() {
        assert!(current().is_none());
        let root = TraceContext::root(42, FLAG_SAMPLED);
        let seen = root
            .clone()
            .scope(async {
                let inner = tokio::spawn(carry(async { current().map(|c| c.trace_id()) }));
                let lost = tokio::spawn(async { current().map(|c| c.trace_id()) });
                (current().map(|c| c.trace_id()), inner.await.ok().flatten(), lost.await.ok().flatten())
            })
            .await;
        assert_eq!(seen, (Some(42), Some(42), None));
    }
}
