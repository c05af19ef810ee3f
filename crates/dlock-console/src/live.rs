//! `GET /live?source=payment|proxy|lock&<filter>`: the browser's Server-Sent Events feed, one
//! per open page, telling the page that its main region changed.
//!
//! The console follows the chosen service's event feed (C3-extensions E-20) for the page's
//! filter, with the session's bearer, and sends the browser:
//! - `change` (`id:` the service's head `seq`) when an event the filter selects is newer
//!   than the browser's position: the page re-fetches its main region. The first position
//!   is the page's watermark (`after`, the service's head read *before* the page's data,
//!   [`crate::app::Console::from_watermark`]), so an event the page's snapshot missed is a
//!   change, never the feed's starting point; a reconnect resumes from `Last-Event-ID`;
//! - `resync_required` (with an empty `id:`, then the stream ends) when the browser's
//!   `Last-Event-ID` is not a position of this feed (malformed, or ahead of the service's
//!   newest event, as after a restore): the page re-fetches a fresh snapshot and reconnects
//!   without it;
//! - `unavailable` (then the stream ends) when the service refuses or cannot be reached.
//!
//! How it follows the service: it reads the snapshot route, `GET /v1/events/recent` with
//! `limit=1` and the page's filter (its head `seq` and newest selected event), every
//! [`LIVE_POLL_MS`]: one small request per open page, where holding the service's
//! `GET /v1/events` open per page would cost the service a connection and the whole
//! fan-out each (docs/performance.md, "The event stream under load"). The browser-facing
//! protocol above is the same either way.
//!
//! Bounds: at most [`LIVE_STREAMS_MAX`] streams per console (one more is `503 NOT_READY`);
//! a stream lasts at most [`LIVE_STREAM_MS_MAX`] (the browser reconnects by itself with its
//! `Last-Event-ID`); a comment goes every [`LIVE_PING_MS`] of quiet, so a gone browser is
//! noticed; a stream ends as soon as its session does (logout, expiry, a retired token).

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use dlock_contract::ErrorCode;
use dlock_http::ApiError;
use dlock_rt::http::BaseUrl;
use dlock_rt::{Duration, Instant};
use serde_json::Value;

use crate::app::{event_filter, filter_query, parse_form, Console};

/// Most `/live` streams one console serves at once.
pub const LIVE_STREAMS_MAX: usize = 16;
/// Pause between two looks at the service's newest event, ms.
pub const LIVE_POLL_MS: u64 = 1_000;
/// Longest quiet before a keep-alive comment, ms.
pub const LIVE_PING_MS: u64 = 15_000;
/// Longest one stream lasts before it ends (the browser reconnects), ms.
pub const LIVE_STREAM_MS_MAX: u64 = 300_000;
/// The browser's reconnect delay the stream asks for (`retry:`), ms.
pub const LIVE_RETRY_MS: u64 = 3_000;

/// One of the [`LIVE_STREAMS_MAX`] places, given back when the stream is dropped.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(open: &Arc<AtomicUsize>) -> Option<Slot> {
        let mut n = open.load(Ordering::SeqCst);
        loop {
            if n >= LIVE_STREAMS_MAX {
                return None;
            }
            match open.compare_exchange(n, n + 1, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return Some(Slot(open.clone())),
                Err(now) => n = now,
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Where the browser stands, from its `Last-Event-ID`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// No id: the page was just rendered; start from the service's newest event.
    Fresh,
    /// The newest `seq` the browser was told about.
    At(i64),
    /// An id this feed never sent.
    Invalid,
}

/// Reads `Last-Event-ID` (a reconnect), else the page's watermark `after` (the feed's first
/// connection, [`crate::app::Console::from_watermark`]).
pub fn resume_of(headers: &HeaderMap, after: Option<&str>) -> Resume {
    let position = |v: &str| v.parse::<i64>().ok().filter(|s| *s >= 0).map_or(Resume::Invalid, Resume::At);
    match headers.get("last-event-id").map(|v| v.to_str().map(str::trim)) {
        None | Some(Ok("")) => after.map_or(Resume::Fresh, position),
        Some(Ok(v)) => position(v),
        Some(Err(_)) => Resume::Invalid,
    }
}

/// What one look at the service's newest event means for the browser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Tell it about `seq` (`first`: the position only, nothing changed since the page).
    Tell { seq: i64, first: bool },
    /// Its position is ahead of the service: resync.
    Resync,
    /// Nothing new.
    Quiet,
}

/// The rule of one look: the browser at position `last` (none yet), the service's head
/// `head` (its newest event of any kind) and its newest event the filter selects,
/// `newest`. A position is a head: the page showed everything up to it.
pub fn step(last: Option<i64>, head: i64, newest: Option<i64>) -> Step {
    let newest = newest.unwrap_or(0);
    let head = head.max(newest);
    match last {
        None => Step::Tell { seq: head, first: true },
        Some(l) if head < l => Step::Resync,
        Some(l) if newest > l => Step::Tell { seq: head, first: false },
        Some(_) => Step::Quiet,
    }
}

struct Follow {
    console: Arc<Console>,
    session_id: String,
    base: BaseUrl,
    query: String,
    last: Option<i64>,
    resume: Resume,
    opened: bool,
    done: bool,
    started: Instant,
    last_frame: Instant,
    _slot: Slot,
}

const RESYNC: &str = "id\nevent: resync_required\ndata: {\"reason\":\"invalid\"}\n\n";

impl Follow {
    /// The next frame, or `None` when the stream ends.
    async fn next(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        if !self.opened {
            self.opened = true;
            let mut s = format!("retry: {LIVE_RETRY_MS}\n\n");
            match self.resume {
                Resume::Invalid => {
                    s.push_str(RESYNC);
                    self.done = true;
                }
                Resume::At(seq) => self.last = Some(seq),
                Resume::Fresh => {}
            }
            return Some(Bytes::from(s));
        }
        let clock = self.console.clock;
        loop {
            if clock.now() >= self.started + Duration::from_millis(LIVE_STREAM_MS_MAX) {
                return None;
            }
            dlock_rt::sleep(Duration::from_millis(LIVE_POLL_MS)).await;
            let session = self.console.session(&self.session_id)?;
            let path = format!("/v1/events/recent?limit=1{}", self.query);
            let (head, newest) = match crate::upstream::get(&self.base, &path, &session.token).await {
                Err(e) => {
                    self.done = true;
                    let data = serde_json::json!({ "status": e.status() });
                    return Some(Bytes::from(format!("event: unavailable\ndata: {data}\n\n")));
                }
                Ok(v) => (
                    v.get("seq").and_then(Value::as_i64).unwrap_or(0),
                    v.get("events")
                        .and_then(Value::as_array)
                        .and_then(|a| a.iter().filter_map(|e| e.get("seq").and_then(Value::as_i64)).max()),
                ),
            };
            let now = clock.now();
            match step(self.last, head, newest) {
                Step::Tell { seq, first } => {
                    self.last = Some(seq);
                    self.last_frame = now;
                    let kind = if first { "ready" } else { "change" };
                    return Some(Bytes::from(format!("id: {seq}\nevent: {kind}\ndata: {{\"seq\":{seq}}}\n\n")));
                }
                Step::Resync => {
                    self.done = true;
                    return Some(Bytes::from(RESYNC));
                }
                Step::Quiet if now >= self.last_frame + Duration::from_millis(LIVE_PING_MS) => {
                    self.last_frame = now;
                    return Some(Bytes::from_static(b": ping\n\n"));
                }
                Step::Quiet => {}
            }
        }
    }
}

/// `GET /live`.
pub async fn live(State(c): State<Arc<Console>>, headers: HeaderMap, RawQuery(q): RawQuery) -> Response {
    let Some((session_id, _)) = c.current(&headers) else {
        return ApiError::new(ErrorCode::Unauthenticated, "sign in to the console first").into_response();
    };
    let q = parse_form(q.as_deref().unwrap_or("")).unwrap_or_default();
    let (filter, problem) = event_filter(&q);
    if let Some(p) = problem {
        return ApiError::new(ErrorCode::ValidationFailed, p).into_response();
    }
    let Some(slot) = Slot::take(&c.live_open) else {
        return ApiError::new(ErrorCode::NotReady, format!("{LIVE_STREAMS_MAX} live streams are open here"))
            .with_retry_after_ms(LIVE_RETRY_MS)
            .into_response();
    };
    let base = c.source_url(&filter.source).clone();
    let now = c.clock.now();
    let follow = Follow {
        console: c.clone(),
        session_id,
        base,
        query: filter_query(&filter),
        last: None,
        resume: resume_of(&headers, q.get("after").map(String::as_str)),
        opened: false,
        done: false,
        started: now,
        last_frame: now,
        _slot: slot,
    };
    let stream = futures::stream::unfold(follow, |mut f| async move {
        let bytes = f.next().await?;
        Some((Ok::<Bytes, Infallible>(bytes), f))
    });
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    r.headers_mut().insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_look_tells_a_newer_selected_event_resyncs_a_head_behind_and_is_quiet_otherwise() {
        assert_eq!(step(None, 0, None), Step::Tell { seq: 0, first: true });
        assert_eq!(step(None, 9, Some(7)), Step::Tell { seq: 9, first: true });
        assert_eq!(step(Some(7), 9, Some(9)), Step::Tell { seq: 9, first: false });
        assert_eq!(step(Some(9), 9, Some(9)), Step::Quiet);
        // Events the filter does not select move the head, not the page.
        assert_eq!(step(Some(9), 15, Some(4)), Step::Quiet);
        assert_eq!(step(Some(12), 9, Some(9)), Step::Resync);
    }

    #[test]
    fn a_page_watermark_below_an_event_its_snapshot_missed_tells_the_page() {
        // The page read the head at 70 and then its data; an event at 74 its data missed
        // (the service's ring not yet at it) is a change, never the feed's starting point.
        let Resume::At(from) = resume_of(&HeaderMap::new(), Some("70")) else { panic!("a position") };
        assert_eq!(step(Some(from), 74, Some(74)), Step::Tell { seq: 74, first: false });
        // Without the watermark the feed would have started at 74 and said nothing.
        assert_eq!(step(None, 74, Some(74)), Step::Tell { seq: 74, first: true });
    }

    #[test]
    fn last_event_id_is_a_non_negative_seq_or_invalid_and_wins_over_the_watermark() {
        let mut h = HeaderMap::new();
        assert_eq!(resume_of(&h, None), Resume::Fresh);
        assert_eq!(resume_of(&h, Some("5")), Resume::At(5));
        assert_eq!(resume_of(&h, Some("x")), Resume::Invalid);
        h.insert("last-event-id", HeaderValue::from_static("42"));
        assert_eq!(resume_of(&h, Some("5")), Resume::At(42));
        h.insert("last-event-id", HeaderValue::from_static("eyJ2IjoxfQ.x"));
        assert_eq!(resume_of(&h, None), Resume::Invalid);
        h.insert("last-event-id", HeaderValue::from_static("-1"));
        assert_eq!(resume_of(&h, None), Resume::Invalid);
    }

    #[test]
    fn the_live_streams_are_bounded_and_a_dropped_stream_frees_its_place() {
        let open = Arc::new(AtomicUsize::new(0));
        let slots: Vec<Slot> = (0..LIVE_STREAMS_MAX).map(|_| Slot::take(&open).expect("room")).collect();
        assert!(Slot::take(&open).is_none(), "one more than the bound is refused");
        drop(slots);
        assert_eq!(open.load(Ordering::SeqCst), 0);
        assert!(Slot::take(&open).is_some());
    }
}
