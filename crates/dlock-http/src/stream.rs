//! The event stream's serving half (C3-extensions E-20): `GET /v1/events` (Server-Sent
//! Events) and `GET /v1/events/recent`, over a store's outbox ([`EventSource`]).
//!
//! One [`EventHub`] per service process tails its store: a task reads the final events
//! after the hub's head every [`EVENT_POLL_MS`] (at once again while pages come back full),
//! keeps the newest [`RING_EVENTS_MAX`] of them in memory and publishes the head. Each
//! stream is *pulled* by its connection: it takes the next page only when the client has
//! read the last, from the ring when the ring reaches back to its cursor, else from the
//! store below the hub's head. So a slow client costs one page of memory
//! ([`EVENT_PAGE_EVENTS_MAX`]), never a growing queue; once it falls
//! [`EVENT_LAG_EVENTS_MAX`] behind, or its cursor falls below the retention purge, it is
//! sent `resync_required` and the stream ends.
//!
//! The cursor (the SSE `id:` of each event; `Last-Event-ID` or `?cursor=` to resume) is
//! `b64url(payload) "." b64url(HMAC-SHA256(key, "dlock/event-cursor/v1\0" ‖ payload))`,
//! where `payload = {"v":1,"st":stream,"sc":service,"sub":tag,"f":filter,"seq":n}`: the
//! stream's name, the service whose selection of it the client read, a keyed tag of the caller's credential (never the credential nor its digest), the
//! canonical filter and the seq through which the client has been served. It is checked
//! again at every (re)connection: a cursor that is absent, not issued here, issued to
//! another caller or for another filter, or expired, gets `resync_required` with its
//! reason, never a silent restart from anywhere.
//!
//! Invariants (asserted):
//! - a stream sends events in strictly increasing seq, each at most once per connection,
//!   and every event the filter selects with a seq between the cursor it resumed from and
//!   the one it last sent, or else `resync_required`;
//! - the cursor sent with an event or a bookmark never runs ahead of the hub's final head.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use bytes::Bytes;
use dlock_contract::planted::{self, Bug};
use dlock_contract::store::StoreError;
use dlock_contract::stream::{
    ControlKind, EventFilter, EventKind, EventRead, ResyncReason, StoredEvent, WireEvent, BOOKMARK_INTERVAL_MS,
    EVENT_CURSOR_CHARS_MAX, EVENT_LAG_EVENTS_MAX, EVENT_PAGE_EVENTS_MAX, EVENT_POLL_MS, EVENT_STREAMS_MAX,
    RECENT_EVENTS_LIMIT_MAX,
};
use dlock_contract::{ErrorCode, FieldError};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use tokio::sync::watch;

use crate::auth::Principal;
use crate::ApiError;

/// Events the hub keeps in memory, newest last: a stream within this many events of the
/// head reads nothing from the store.
pub const RING_EVENTS_MAX: usize = 4_096;
/// How long a snapshot waits for the tailer's first read of the store.
pub const EVENT_READY_WAIT_MS: u64 = 5_000;
/// How long the tailer waits after a failed read of the store.
pub const TAIL_RETRY_MS: u64 = 1_000;
/// The `retry:` a stream tells an SSE client to wait before it reconnects.
pub const SSE_RETRY_MS: u64 = 1_000;

const MAC_CONTEXT: &[u8] = b"dlock/event-cursor/v1\0";
const SUBJECT_CONTEXT: &[u8] = b"dlock/event-subject/v1\0";
const VERSION: u32 = 1;

type HmacSha256 = Hmac<Sha256>;

/// A store's outbox, as a hub reads it.
#[async_trait]
pub trait EventSource: Send + Sync + 'static {
    /// The final events after `after`, at most `limit`. With `upto`, every seq at or below
    /// it is already known final (the hub read it so): the store returns the rows in
    /// `(after, upto]` without waiting on any hole.
    async fn read_events(&self, after: i64, upto: Option<i64>, limit: usize) -> Result<EventRead, StoreError>;
}

/// What the tailer last published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Head {
    /// Every seq at or below it is final and in the ring or the store.
    pub seq: i64,
    pub purged_through: i64,
    /// Whether the tailer has read the store at least once.
    pub ready: bool,
}

#[derive(Debug, Default)]
struct Ring {
    events: VecDeque<Arc<StoredEvent>>,
    /// Every final seq in `(from, head]` is in `events` (or never existed).
    from: i64,
}

/// One service process's view of its store's event stream.
pub struct EventHub {
    stream: &'static str,
    /// Which service's selection of the stream this hub serves (a cursor binds it: two
    /// services serving one store's stream select different kinds).
    scope: &'static str,
    source: Arc<dyn EventSource>,
    key: [u8; 32],
    streams_kind: fn(EventKind) -> bool,
    head: watch::Sender<Head>,
    ring: Mutex<Ring>,
    open: AtomicUsize,
    clock: dlock_rt::Clock,
    tailing: AtomicBool,
}

impl std::fmt::Debug for EventHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventHub").field("stream", &self.stream).field("head", &*self.head.borrow()).finish()
    }
}

/// The cursor's payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Payload {
    v: u32,
    st: String,
    sc: String,
    sub: String,
    f: String,
    seq: i64,
}

impl EventHub {
    /// A hub over `source`, named `stream` (the prefix of every event id: `paydb`,
    /// `lockdb`), serving the kinds `streams_kind` admits for the service `scope`, signing
    /// cursors with `key`.
    pub fn new(
        stream: &'static str,
        scope: &'static str,
        source: Arc<dyn EventSource>,
        key: [u8; 32],
        streams_kind: fn(EventKind) -> bool,
        clock: dlock_rt::Clock,
    ) -> Arc<EventHub> {
        let (head, _) = watch::channel(Head::default());
        let ring = Mutex::new(Ring::default());
        let (open, tailing) = (AtomicUsize::new(0), AtomicBool::new(false));
        Arc::new(EventHub { stream, scope, source, key, streams_kind, head, ring, open, clock, tailing })
    }

    pub fn stream_name(&self) -> &'static str {
        self.stream
    }

    /// The last published head.
    pub fn head(&self) -> Head {
        *self.head.borrow()
    }

    /// Reads the store once past the head; returns whether the page came back full.
    pub async fn tail_once(&self) -> Result<bool, StoreError> {
        let after = self.head().seq;
        let read = self.source.read_events(after, None, EVENT_PAGE_EVENTS_MAX).await?;
        let full = read.events.len() >= EVENT_PAGE_EVENTS_MAX;
        assert!(read.head >= after, "events: the store's head {} went back below {after}", read.head);
        {
            let mut ring = self.ring.lock().map_err(|_| StoreError::Corrupt("event ring poisoned".into()))?;
            if ring.events.is_empty() && !self.head().ready {
                ring.from = after;
            }
            for e in read.events {
                assert!(e.seq > after && e.seq <= read.head, "events: seq {} outside ({after}, {}]", e.seq, read.head);
                ring.events.push_back(Arc::new(e));
            }
            // A purged event is gone for every reader, the ring's too: a stream whose cursor
            // the purge passed is then read from the store, which says it expired.
            while ring.events.len() > RING_EVENTS_MAX
                || ring.events.front().is_some_and(|e| e.seq <= read.purged_through)
            {
                if let Some(e) = ring.events.pop_front() {
                    ring.from = e.seq;
                }
            }
            ring.from = ring.from.max(read.purged_through);
        }
        self.head.send_replace(Head { seq: read.head, purged_through: read.purged_through, ready: true });
        Ok(full)
    }

    /// Starts the tailer on first use: a service no client ever asks for its events never
    /// reads them (and a simulated world without a stream client schedules nothing more).
    /// The tailer holds the hub weakly and stops once the service dropped it.
    pub fn ensure_tailing(self: &Arc<Self>) {
        if !self.tailing.swap(true, Ordering::SeqCst) {
            drop(dlock_rt::spawn(run_tailer(Arc::downgrade(self))));
        }
    }

    /// Waits, at most [`EVENT_READY_WAIT_MS`], until the tailer has read the store once.
    async fn ready(self: &Arc<Self>) -> Result<Head, ApiError> {
        self.ensure_tailing();
        let mut rx = self.head.subscribe();
        let wait = dlock_rt::Duration::from_millis(EVENT_READY_WAIT_MS);
        let ready = dlock_rt::timeout(wait, rx.wait_for(|h| h.ready)).await;
        match ready {
            Some(Ok(h)) => Ok(*h),
            _ => Err(ApiError::new(ErrorCode::NotReady, "the event stream has not read its store yet")
                .with_retry_after_ms(SSE_RETRY_MS)),
        }
    }

    fn subject_tag(&self, principal: Option<&Principal>) -> String {
        let subject: &[u8] = principal.map_or(b"anonymous".as_slice(), |p| p.subject.as_slice());
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(SUBJECT_CONTEXT);
        mac.update(subject);
        hex_of(&mac.finalize().into_bytes()[..8])
    }

    fn mac(&self, payload: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(MAC_CONTEXT);
        mac.update(payload);
        mac
    }

    /// The cursor of `seq` for this caller and filter.
    pub fn cursor(&self, principal: Option<&Principal>, filter: &EventFilter, seq: i64) -> String {
        let p = Payload {
            v: VERSION,
            st: self.stream.to_owned(),
            sc: self.scope.to_owned(),
            sub: self.subject_tag(principal),
            f: filter.canonical(),
            seq,
        };
        let json = serde_json::to_vec(&p).expect("a payload serialises");
        let tag = self.mac(&json).finalize().into_bytes();
        format!("{}.{}", URL_SAFE_NO_PAD.encode(&json), URL_SAFE_NO_PAD.encode(tag))
    }

    /// The seq a cursor resumes from, or why the stream cannot resume from it.
    pub fn resume(
        &self,
        principal: Option<&Principal>,
        filter: &EventFilter,
        cursor: Option<&str>,
    ) -> Result<i64, ResyncReason> {
        let cursor = cursor.filter(|c| !c.is_empty()).ok_or(ResyncReason::Absent)?;
        if cursor.len() > EVENT_CURSOR_CHARS_MAX {
            return Err(ResyncReason::Invalid);
        }
        let (p64, t64) = cursor.split_once('.').ok_or(ResyncReason::Invalid)?;
        let json = URL_SAFE_NO_PAD.decode(p64).map_err(|_| ResyncReason::Invalid)?;
        let tag = URL_SAFE_NO_PAD.decode(t64).map_err(|_| ResyncReason::Invalid)?;
        self.mac(&json).verify_slice(&tag).map_err(|_| ResyncReason::Invalid)?;
        let p: Payload = serde_json::from_slice(&json).map_err(|_| ResyncReason::Invalid)?;
        if p.v != VERSION || p.st != self.stream || p.sc != self.scope || p.seq < 0 {
            return Err(ResyncReason::Invalid);
        }
        if p.sub != self.subject_tag(principal) {
            return Err(ResyncReason::OtherSubject);
        }
        if p.f != filter.canonical() {
            return Err(ResyncReason::OtherFilter);
        }
        let head = self.head();
        // Planted bug `no-resync-after-retention` (test-only): a purged cursor resumed.
        let expired = p.seq < head.purged_through && !planted::on(Bug::NoResyncAfterRetention);
        if expired {
            return Err(ResyncReason::Expired);
        }
        // Planted bug `cursor-one-past` (test-only): the first event after the cursor skipped.
        if planted::on(Bug::CursorOnePast) {
            return Ok(p.seq + 1);
        }
        Ok(p.seq)
    }

    /// A snapshot's watermark: every event at or below it was committed before a read that
    /// starts now, so a snapshot read after this call reflects them all.
    pub async fn watermark(self: &Arc<Self>) -> Result<i64, ApiError> {
        Ok(self.ready().await?.seq)
    }

    /// The events after `after` that this service streams, at most `limit`, below the head:
    /// from the ring when it reaches back to `after`, else from the store. Returns them and
    /// the seq through which they account for everything.
    async fn page(&self, after: i64, head: i64, limit: usize) -> Result<(Vec<Arc<StoredEvent>>, i64), StoreError> {
        {
            let ring = self.ring.lock().map_err(|_| StoreError::Corrupt("event ring poisoned".into()))?;
            if ring.from <= after {
                let start = ring.events.partition_point(|e| e.seq <= after);
                let events: Vec<Arc<StoredEvent>> =
                    ring.events.iter().skip(start).take_while(|e| e.seq <= head).take(limit).cloned().collect();
                let through = if events.len() == limit { events.last().map_or(head, |e| e.seq) } else { head };
                return Ok((events, through));
            }
        }
        let read = self.source.read_events(after, Some(head), limit).await?;
        let through = if read.events.len() >= limit { read.events.last().map_or(head, |e| e.seq) } else { head };
        Ok((read.events.into_iter().filter(|e| e.seq <= head).map(Arc::new).collect(), through.min(head)))
    }

    /// `GET /v1/events/recent`: the newest events the filter selects (at most `limit`,
    /// oldest first) and the cursor of the head they were read at.
    pub async fn recent(
        self: &Arc<Self>,
        principal: Option<&Principal>,
        filter: &EventFilter,
        limit: usize,
    ) -> Result<RecentPage, ApiError> {
        self.ready().await?;
        let limit = limit.clamp(1, RECENT_EVENTS_LIMIT_MAX);
        let (events, head) = {
            let ring = self.ring.lock().map_err(|_| ApiError::internal("event ring poisoned"))?;
            let head = self.head().seq;
            let mut picked: Vec<WireEvent> = ring
                .events
                .iter()
                .rev()
                .filter(|e| e.seq <= head && (self.streams_kind)(e.kind) && filter.selects(e))
                .take(limit)
                .map(|e| WireEvent::of(self.stream, e))
                .collect();
            picked.reverse();
            (picked, head)
        };
        Ok(RecentPage { events, cursor: self.cursor(principal, filter, head), seq: head })
    }

    /// `GET /v1/events`: the SSE response for this caller, filter and cursor.
    pub fn serve(
        self: &Arc<Self>,
        principal: Option<&Principal>,
        filter: EventFilter,
        cursor: Option<&str>,
    ) -> Response {
        if self.open.load(Ordering::Relaxed) >= EVENT_STREAMS_MAX {
            return ApiError::new(ErrorCode::NotReady, format!("{EVENT_STREAMS_MAX} event streams are open here"))
                .with_retry_after_ms(SSE_RETRY_MS)
                .into_response();
        }
        self.ensure_tailing();
        let start = self.resume(principal, &filter, cursor);
        let conn = Conn {
            hub: self.clone(),
            _open: OpenGuard::new(self.clone()),
            principal: principal.cloned(),
            filter,
            cursor: start.unwrap_or(0),
            resync: start.err(),
            out: VecDeque::new(),
            done: false,
            rx: self.head.subscribe(),
            since_sent: self.clock.now(),
        };
        let body = futures::stream::unfold(conn, |mut c| async move {
            let next = c.next_frame().await?;
            Some((Ok::<Bytes, std::io::Error>(next), c))
        });
        let mut res = Response::new(Body::from_stream(body));
        let h = res.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        h.insert("x-accel-buffering", HeaderValue::from_static("no"));
        *res.status_mut() = StatusCode::OK;
        res
    }
}

/// The tailer of `hub`, until the hub is dropped.
async fn run_tailer(hub: Weak<EventHub>) {
    loop {
        let Some(h) = hub.upgrade() else { return };
        let pause = match h.tail_once().await {
            Ok(true) => None,
            Ok(false) => Some(EVENT_POLL_MS),
            Err(e) => {
                tracing::warn!(stream = h.stream, error = %e, "event_tail_failed");
                Some(TAIL_RETRY_MS)
            }
        };
        drop(h);
        if let Some(ms) = pause {
            dlock_rt::sleep(dlock_rt::Duration::from_millis(ms)).await;
        }
    }
}

/// `GET /v1/events/recent`'s answer.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecentPage {
    pub events: Vec<WireEvent>,
    /// Connect to `/v1/events` with this cursor (and the same filter) to continue.
    pub cursor: String,
    /// The head the page was read at: every event up to it is reflected, and the stream
    /// continues after it.
    pub seq: i64,
}

/// One Server-Sent Events frame of `GET /v1/events`, as a client parses it (C3-extensions
/// E-20): `event` the kind (or `bookmark`, `resync_required`), `data` its JSON, `id` the
/// cursor to resume from (empty on `resync_required`), `retry` the reconnect delay in ms.
#[derive(Debug, Clone, utoipa::ToSchema)]
pub struct SseFrame {
    pub event: Option<String>,
    pub data: Option<String>,
    pub id: Option<String>,
    pub retry: Option<u64>,
}

/// The query of `GET /v1/events` (C3-extensions E-20). Each filter parameter may repeat,
/// and each value may be a comma-separated list; anything else is `400 VALIDATION_FAILED`.
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Only events about this account.
    pub account: Option<String>,
    /// Only events about this payout.
    pub payout: Option<String>,
    /// Only events about this lock key.
    #[param(rename = "lockKey")]
    pub lock_key: Option<String>,
    /// Only events of this kind (`payout.created`, `fence.refused`, …).
    pub kind: Option<String>,
    /// Where to resume: the `id:` of the last frame received, or a snapshot's `cursor`. A
    /// `Last-Event-ID` header wins over it.
    #[param(max_length = 1024)]
    pub cursor: Option<String>,
}

/// The query of `GET /v1/events/recent` (C3-extensions E-20).
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RecentQuery {
    /// Only events about this account.
    pub account: Option<String>,
    /// Only events about this payout.
    pub payout: Option<String>,
    /// Only events about this lock key.
    #[param(rename = "lockKey")]
    pub lock_key: Option<String>,
    /// Only events of this kind.
    pub kind: Option<String>,
    /// Events at most (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
}

struct OpenGuard(Arc<EventHub>);

impl OpenGuard {
    fn new(hub: Arc<EventHub>) -> OpenGuard {
        hub.open.fetch_add(1, Ordering::Relaxed);
        OpenGuard(hub)
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One open stream.
struct Conn {
    hub: Arc<EventHub>,
    _open: OpenGuard,
    principal: Option<Principal>,
    filter: EventFilter,
    /// Every selected event at or below it has been sent.
    cursor: i64,
    resync: Option<ResyncReason>,
    out: VecDeque<Bytes>,
    done: bool,
    rx: watch::Receiver<Head>,
    since_sent: dlock_rt::Instant,
}

impl Conn {
    async fn next_frame(&mut self) -> Option<Bytes> {
        loop {
            if let Some(b) = self.out.pop_front() {
                return Some(b);
            }
            if self.done {
                return None;
            }
            if let Some(reason) = self.resync.take() {
                self.out.push_back(resync_frame(reason));
                self.done = true;
                continue;
            }
            let head = *self.rx.borrow_and_update();
            if !head.ready {
                self.wait(head).await;
                continue;
            }
            if self.cursor < head.purged_through && !planted::on(Bug::NoResyncAfterRetention) {
                self.resync = Some(ResyncReason::Expired);
                continue;
            }
            if head.seq - self.cursor > EVENT_LAG_EVENTS_MAX {
                self.resync = Some(ResyncReason::TooSlow);
                continue;
            }
            if head.seq > self.cursor {
                let (events, through) = match self.hub.page(self.cursor, head.seq, EVENT_PAGE_EVENTS_MAX).await {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::warn!(stream = self.hub.stream, error = %e, "event_page_failed");
                        dlock_rt::sleep(dlock_rt::Duration::from_millis(TAIL_RETRY_MS)).await;
                        continue;
                    }
                };
                let mut last = self.cursor;
                for e in events {
                    assert!(e.seq > last, "events: seq {} sent after {last}", e.seq);
                    last = e.seq;
                    if (self.hub.streams_kind)(e.kind) && self.filter.selects(&e) {
                        let cursor = self.hub.cursor(self.principal.as_ref(), &self.filter, e.seq);
                        self.out.push_back(event_frame(&cursor, &WireEvent::of(self.hub.stream, &e)));
                    }
                }
                assert!(
                    through >= last && through <= head.seq,
                    "events: a page through {through} outside [{last}, {}]",
                    head.seq
                );
                self.cursor = through;
                if !self.out.is_empty() {
                    self.since_sent = self.hub.clock.now();
                }
                continue;
            }
            self.wait(head).await;
        }
    }

    /// Waits for a new head; sends a bookmark when none came for [`BOOKMARK_INTERVAL_MS`].
    async fn wait(&mut self, head: Head) {
        let interval = dlock_rt::Duration::from_millis(BOOKMARK_INTERVAL_MS);
        let left = interval.saturating_sub(self.since_sent.elapsed());
        let changed = dlock_rt::timeout(left, self.rx.changed()).await;
        match changed {
            Some(Ok(())) => {}
            Some(Err(_)) => self.done = true,
            None => {
                if head.ready {
                    let cursor = self.hub.cursor(self.principal.as_ref(), &self.filter, self.cursor);
                    self.out.push_back(bookmark_frame(&cursor, self.cursor));
                }
                self.since_sent = self.hub.clock.now();
            }
        }
    }
}

fn event_frame(cursor: &str, e: &WireEvent) -> Bytes {
    let data = serde_json::to_string(e).expect("an event serialises");
    Bytes::from(format!("id: {cursor}\nevent: {}\ndata: {data}\n\n", e.kind))
}

fn bookmark_frame(cursor: &str, seq: i64) -> Bytes {
    let data = serde_json::json!({ "cursor": cursor, "seq": seq });
    Bytes::from(format!("id: {cursor}\nevent: {}\ndata: {data}\n\n", ControlKind::Bookmark.as_str()))
}

fn resync_frame(reason: ResyncReason) -> Bytes {
    let data = serde_json::json!({ "reason": reason.as_str() });
    // `id:` with no value clears the client's last event id: it must not resume from it.
    Bytes::from(format!(
        "retry: {SSE_RETRY_MS}\nid:\nevent: {}\ndata: {data}\n\n",
        ControlKind::ResyncRequired.as_str()
    ))
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The filter, cursor and limit of a stream request: the query's `account`, `payout`,
/// `lockKey`, `kind`, `cursor` and (recent page) `limit`; a `Last-Event-ID` header wins
/// over `cursor`.
#[derive(Debug, Clone)]
pub struct StreamRequest {
    pub filter: EventFilter,
    pub cursor: Option<String>,
    pub limit: Option<usize>,
}

impl StreamRequest {
    pub fn parse(query: Option<&str>, headers: &HeaderMap) -> Result<StreamRequest, ApiError> {
        let pairs: Vec<(String, String)> = query.map_or_else(Vec::new, url_pairs);
        let mut cursor = None;
        let mut limit = None;
        let mut filter_pairs = Vec::new();
        for (k, v) in &pairs {
            match k.as_str() {
                "cursor" => cursor = Some(v.clone()),
                "limit" => {
                    let n: usize =
                        v.parse().ok().filter(|n| (1..=RECENT_EVENTS_LIMIT_MAX).contains(n)).ok_or_else(|| {
                            ApiError::validation(
                                "invalid query",
                                vec![FieldError::new(
                                    "limit",
                                    format!("must be an integer in 1..={RECENT_EVENTS_LIMIT_MAX}"),
                                )],
                            )
                        })?;
                    limit = Some(n);
                }
                _ => filter_pairs.push((k.as_str(), v.as_str())),
            }
        }
        let filter = EventFilter::from_pairs(filter_pairs)
            .map_err(|e| ApiError::validation("invalid event filter", vec![FieldError::new(e.field, e.problem)]))?;
        if let Some(id) = headers.get("last-event-id") {
            let id = id.to_str().map_err(|_| {
                ApiError::validation("invalid header", vec![FieldError::new("Last-Event-ID", "is not visible ASCII")])
            })?;
            if !id.is_empty() {
                cursor = Some(id.to_owned());
            }
        }
        Ok(StreamRequest { filter, cursor, limit })
    }
}

/// `application/x-www-form-urlencoded` pairs of a query string.
fn url_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `GET /v1/events`: the query and headers of the request, answered by `hub`.
pub fn events_response(
    hub: &Arc<EventHub>,
    principal: Option<&Principal>,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let req = StreamRequest::parse(query, headers)?;
    if req.limit.is_some() {
        return Err(ApiError::validation(
            "invalid query",
            vec![FieldError::new("limit", "applies to /v1/events/recent only")],
        ));
    }
    Ok(hub.serve(principal, req.filter, req.cursor.as_deref()))
}

/// The preference a snapshot read (P1, P4, L7) takes to answer its event cursor
/// (C3-extensions E-20, "Snapshots"): `Prefer: event-cursor` (RFC 7240).
pub const PREFER_EVENT_CURSOR: &str = "event-cursor";
/// The response header carrying a snapshot's event cursor.
pub const HEADER_EVENT_CURSOR: &str = "x-event-cursor";
/// The response header carrying the seq of a snapshot's event cursor.
pub const HEADER_EVENT_SEQ: &str = "x-event-seq";

/// A snapshot's watermark: the cursor to stream on from after reading the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotMark {
    pub cursor: String,
    pub seq: i64,
}

impl SnapshotMark {
    /// Adds the mark to a snapshot's response: `X-Event-Cursor`, `X-Event-Seq`, and
    /// `Preference-Applied: event-cursor`.
    pub fn apply(self, mut res: Response) -> Response {
        let h = res.headers_mut();
        if let Ok(v) = HeaderValue::from_str(&self.cursor) {
            h.insert(HEADER_EVENT_CURSOR, v);
            h.insert(HEADER_EVENT_SEQ, HeaderValue::from(self.seq));
            h.insert("preference-applied", HeaderValue::from_static(PREFER_EVENT_CURSOR));
        }
        res
    }
}

/// Whether a request prefers its snapshot's event cursor (`Prefer: event-cursor`, among
/// other preferences or alone, in any of its `Prefer` headers).
pub fn prefers_event_cursor(headers: &HeaderMap) -> bool {
    headers.get_all("prefer").iter().filter_map(|v| v.to_str().ok()).any(|v| {
        v.split(',').any(|p| p.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case(PREFER_EVENT_CURSOR)))
    })
}

/// The watermark of a snapshot about to be read, when the request prefers it: the cursor,
/// for this caller and `filter`, of the head the hub published *before* the snapshot is
/// read. Every change the snapshot misses then has a greater seq and reaches a stream
/// resumed from the cursor; a change the snapshot already shows may come again (delivery is
/// at least once: clients deduplicate by `eventId`). Starts the hub's tailer on first use.
pub async fn snapshot_mark(
    hub: &Arc<EventHub>,
    principal: Option<&Principal>,
    headers: &HeaderMap,
    filter: &EventFilter,
) -> Result<Option<SnapshotMark>, ApiError> {
    if !prefers_event_cursor(headers) {
        return Ok(None);
    }
    let seq = hub.ready().await?.seq.max(hub.head().seq);
    Ok(Some(SnapshotMark { cursor: hub.cursor(principal, filter, seq), seq }))
}

/// Default events of `GET /v1/events/recent`.
pub const RECENT_EVENTS_LIMIT_DEFAULT: usize = 50;

/// `GET /v1/events/recent`: the query of the request, answered by `hub`.
pub async fn recent_response(
    hub: &Arc<EventHub>,
    principal: Option<&Principal>,
    query: Option<&str>,
) -> Result<Response, ApiError> {
    let req = StreamRequest::parse(query, &HeaderMap::new())?;
    if req.cursor.is_some() {
        return Err(ApiError::validation(
            "invalid query",
            vec![FieldError::new("cursor", "applies to /v1/events only")],
        ));
    }
    let page = hub.recent(principal, &req.filter, req.limit.unwrap_or(RECENT_EVENTS_LIMIT_DEFAULT)).await?;
    Ok(crate::json(StatusCode::OK, &page))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Utc};
    use futures::StreamExt;
    use http_body_util::BodyExt;

    /// An outbox in memory that can hide a hole and be purged.
    #[derive(Default)]
    struct Fake {
        events: Mutex<Vec<StoredEvent>>,
        purged_through: Mutex<i64>,
    }

    impl Fake {
        fn push(&self, seq: i64, kind: EventKind, account: &str) {
            self.events.lock().unwrap().push(StoredEvent {
                seq,
                kind,
                at: DateTime::<Utc>::UNIX_EPOCH,
                account_id: Some(account.to_owned()),
                payout_id: None,
                lock_key: None,
                body: serde_json::json!({ "n": seq }),
            });
        }
    }

    #[async_trait]
    impl EventSource for Fake {
        async fn read_events(&self, after: i64, upto: Option<i64>, limit: usize) -> Result<EventRead, StoreError> {
            let all = self.events.lock().unwrap();
            let events: Vec<StoredEvent> =
                all.iter().filter(|e| e.seq > after && upto.is_none_or(|u| e.seq <= u)).take(limit).cloned().collect();
            let last = all.last().map_or(after, |e| e.seq).max(after);
            let head =
                if events.len() == limit { events.last().map_or(after, |e| e.seq) } else { upto.unwrap_or(last) };
            Ok(EventRead { events, head, purged_through: *self.purged_through.lock().unwrap() })
        }
    }

    fn principal(n: u8) -> Principal {
        Principal { role: dlock_contract::auth::Role::Reader, owners: None, subject: [n; 32] }
    }

    fn hub(fake: Arc<Fake>) -> Arc<EventHub> {
        EventHub::new("paydb", "payment-resource", fake, [7; 32], |k| !k.is_rail(), dlock_rt::Clock::system())
    }

    async fn frames(res: Response, n: usize) -> Vec<String> {
        let mut body = res.into_body().into_data_stream();
        let mut text = String::new();
        while text.matches("\n\n").count() < n {
            match body.next().await {
                Some(Ok(b)) => text.push_str(std::str::from_utf8(&b).unwrap()),
                _ => break,
            }
        }
        text.split("\n\n").filter(|f| !f.is_empty()).map(str::to_owned).collect()
    }

    #[tokio::test]
    async fn a_cursor_resumes_only_for_its_caller_and_filter_and_refuses_a_tampered_one() {
        let fake = Arc::new(Fake::default());
        let hub = hub(fake);
        let f = EventFilter::from_pairs([("account", "a")]).unwrap();
        let c = hub.cursor(Some(&principal(1)), &f, 5);
        assert_eq!(hub.resume(Some(&principal(1)), &f, Some(&c)), Ok(5));
        assert_eq!(hub.resume(Some(&principal(2)), &f, Some(&c)), Err(ResyncReason::OtherSubject));
        assert_eq!(hub.resume(Some(&principal(1)), &EventFilter::default(), Some(&c)), Err(ResyncReason::OtherFilter));
        assert_eq!(hub.resume(Some(&principal(1)), &f, None), Err(ResyncReason::Absent));
        let mut t = c.clone().into_bytes();
        t[3] ^= 1;
        assert_eq!(
            hub.resume(Some(&principal(1)), &f, Some(std::str::from_utf8(&t).unwrap())),
            Err(ResyncReason::Invalid)
        );
        let other = EventHub::new(
            "paydb",
            "payment-resource",
            Arc::new(Fake::default()),
            [8; 32],
            |_| true,
            dlock_rt::Clock::system(),
        );
        let rail = EventHub::new(
            "paydb",
            "rail-proxy",
            Arc::new(Fake::default()),
            [7; 32],
            |_| true,
            dlock_rt::Clock::system(),
        );
        assert_eq!(rail.resume(Some(&principal(1)), &f, Some(&c)), Err(ResyncReason::Invalid), "another service's");
        assert_eq!(other.resume(Some(&principal(1)), &f, Some(&c)), Err(ResyncReason::Invalid), "another key");
        assert!(!c.contains(&hex_of(&[1; 32])), "the cursor never carries the credential's digest");
    }

    #[tokio::test]
    async fn a_stream_sends_the_selected_events_after_its_cursor_in_order_then_a_resync_when_expired() {
        let fake = Arc::new(Fake::default());
        for seq in 1..=6 {
            fake.push(seq, if seq % 2 == 0 { EventKind::PayoutCreated } else { EventKind::RailIntent }, "a");
        }
        let hub = hub(fake.clone());
        hub.tail_once().await.unwrap();
        let f = EventFilter::default();
        let c = hub.cursor(None, &f, 2);
        let got = frames(hub.serve(None, f.clone(), Some(&c)), 2).await;
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].contains("event: payout.created") && got[0].contains("\"seq\":4"), "{got:?}");
        assert!(got[1].contains("\"seq\":6"), "rail kinds are the proxy's: {got:?}");
        // Resuming from the first frame's id sends only what follows it.
        let id = got[0].lines().find_map(|l| l.strip_prefix("id: ")).unwrap().to_owned();
        let again = frames(hub.serve(None, f.clone(), Some(&id)), 1).await;
        assert!(again[0].contains("\"seq\":6"), "{again:?}");
        // Purged past the cursor: resync, and the stream ends.
        *fake.purged_through.lock().unwrap() = 4;
        hub.tail_once().await.unwrap();
        let gone = frames(hub.serve(None, f.clone(), Some(&c)), 1).await;
        assert!(gone[0].contains("event: resync_required") && gone[0].contains("expired"), "{gone:?}");
        let absent = frames(hub.serve(None, f, None), 1).await;
        assert!(absent[0].contains("\"reason\":\"absent\""), "{absent:?}");
    }

    #[tokio::test]
    async fn a_stream_behind_the_ring_reads_the_store_below_the_head_and_misses_nothing() {
        let fake = Arc::new(Fake::default());
        let n = (RING_EVENTS_MAX + 300) as i64;
        for seq in 1..=n {
            fake.push(seq, EventKind::PayoutCreated, if seq % 3 == 0 { "b" } else { "a" });
        }
        let hub = hub(fake.clone());
        while hub.tail_once().await.unwrap() {}
        assert_eq!(hub.head().seq, n);
        let f = EventFilter::from_pairs([("account", "b")]).unwrap();
        let c = hub.cursor(None, &f, 0);
        let want = (n / 3) as usize;
        let got = frames(hub.serve(None, f, Some(&c)), want).await;
        let seqs: Vec<i64> = got
            .iter()
            .map(|fr| {
                let data = fr.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
                serde_json::from_str::<WireEvent>(data).unwrap().seq
            })
            .collect();
        assert_eq!(seqs, (1..=n).filter(|s| s % 3 == 0).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn the_recent_page_returns_the_newest_selected_events_and_the_cursor_of_its_head() {
        let fake = Arc::new(Fake::default());
        for seq in 1..=10 {
            fake.push(seq, EventKind::PayoutCreated, "a");
        }
        let hub = hub(fake);
        hub.tail_once().await.unwrap();
        let page = hub.recent(None, &EventFilter::default(), 3).await.unwrap();
        assert_eq!(page.events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![8, 9, 10]);
        assert_eq!(hub.resume(None, &EventFilter::default(), Some(&page.cursor)), Ok(10));
        let body = recent_response(&hub, None, Some("limit=2&kind=payout.created")).await.unwrap();
        let bytes = body.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["events"].as_array().map(Vec::len), Some(2));
        assert!(recent_response(&hub, None, Some("kind=nope")).await.is_err());
        assert!(events_response(&hub, None, Some("limit=3"), &HeaderMap::new()).is_err());
    }

    #[test]
    fn a_last_event_id_header_wins_over_the_cursor_parameter_and_queries_decode() {
        let mut h = HeaderMap::new();
        h.insert("last-event-id", HeaderValue::from_static("from-header"));
        let r = StreamRequest::parse(Some("cursor=from-query&account=a%2Cb&kind=payout.created"), &h).unwrap();
        assert_eq!(r.cursor.as_deref(), Some("from-header"));
        assert_eq!(r.filter.accounts.len(), 2);
        assert!(StreamRequest::parse(Some("color=red"), &HeaderMap::new()).is_err());
    }
}
