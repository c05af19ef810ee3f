//! The stream watcher (issue 38): a client of the payment-resource's event stream
//! (C3-extensions E-20, `GET /v1/events`) on node `watcher`, connected to `payment-1` for the
//! whole seed. It resumes from its last cursor after every broken connection (a partition,
//! a kill, a restart of `payment-1`), deduplicates by `eventId`, and on `resync_required`
//! takes a new snapshot (`GET /v1/events/recent`) and continues from its cursor. It never
//! fails on its own: it records what it received ([`Watched`]), and the oracle judges it.
//!
//! ## Invariants (checked by [`failures`], against paydb's own tables)
//! - `stream_in_commit_order`: on each connection, events arrive in strictly increasing
//!   seq, each above the seq the connection resumed from.
//! - `stream_never_gaps`: every event paydb committed that the payment-resource streams,
//!   with a seq up to the last one the watcher was brought to (an event's or a bookmark's),
//!   was received, except those a `resync_required` covered (between the seq it had and
//!   the snapshot it took after).
//! - `stream_only_committed`: every event received is paydb's event of that seq, equal in
//!   every field.
//! - `stream_dedupes_by_id`: after deduplication no event id repeats, and each id names
//!   its seq.
//! - `outbox_matches_tables` (the store, not the stream): replaying paydb's events gives
//!   paydb's tables: each payout's `payout.state_changed` chain starts at its
//!   `payout.created` state, each step from the state the previous one left, and ends at the
//!   payout's state; each account's `fence.raised` chain rises from 0 to its fence. An event
//!   for a change that did not commit, or a change without its event, breaks a chain.
//!
//! The watcher runs on the seeds whose configuration draws it ([`crate::swarm::SwarmConfig`]
//! `watcher`); the others keep a world without it (and without a tailer on `payment-1`,
//! which starts on the first stream request).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_contract::payout::PayoutState;
use dlock_contract::stream::{EventKind, StoredEvent, WireEvent};
use dlock_paydb::MemPaydb;
use dlock_rt::http::HttpClient;

use crate::outcome::Failure;

/// The watcher's node.
pub const WATCHER_NODE: &str = "watcher";
/// The service it watches.
pub const WATCHED_NODE: &str = "payment-1";
/// Longest silence on an open stream before the watcher reconnects (above the bookmark
/// interval, so a healthy idle stream never trips it).
pub const WATCH_IDLE_MS: u64 = 20_000;
/// Pause before reconnecting after a failure.
pub const WATCH_RECONNECT_MS: u64 = 300;
/// Budgets of the watcher's HTTP calls.
pub const WATCH_CONNECT_MS: u64 = 1_000;
pub const WATCH_READ_MS: u64 = 5_000;
/// How long the end of a seed waits for the watcher to reach paydb's last event.
pub const WATCH_CATCH_UP_MS_MAX: u64 = 30_000;
/// Naps the watcher takes during a seed: it drops its connection after staying
/// [`WATCH_STAY_MS_MIN`]..=[`WATCH_STAY_MS_MAX`] and comes back [`WATCH_NAP_MS_MIN`]..=
/// [`WATCH_NAP_MS_MAX`] later with the cursor it had (a client that went away), so every
/// watcher seed resumes from stale cursors, some of them past the purge.
pub const WATCH_NAPS: u32 = 3;
pub const WATCH_STAY_MS_MIN: u64 = 500;
pub const WATCH_STAY_MS_MAX: u64 = 4_000;
pub const WATCH_NAP_MS_MIN: u64 = 200;
pub const WATCH_NAP_MS_MAX: u64 = 5_000;
/// Events of the snapshot the watcher takes after a `resync_required`.
pub const WATCH_SNAPSHOT_EVENTS: usize = 200;

/// Invariant ids (see the module doc).
pub mod ids {
    pub const STREAM_IN_COMMIT_ORDER: &str = "stream_in_commit_order";
    pub const STREAM_NEVER_GAPS: &str = "stream_never_gaps";
    pub const STREAM_ONLY_COMMITTED: &str = "stream_only_committed";
    pub const STREAM_DEDUPES_BY_ID: &str = "stream_dedupes_by_id";
    pub const OUTBOX_MATCHES_TABLES: &str = "outbox_matches_tables";
    /// Liveness: the watcher reached paydb's last event once faults stopped.
    pub const STREAM_CATCHES_UP: &str = "stream_catches_up";
}

/// What the watcher received.
#[derive(Debug, Default, Clone)]
pub struct Watched {
    /// After deduplication, in arrival order.
    pub applied: Vec<WireEvent>,
    pub seen: BTreeSet<String>,
    /// Frames that repeated an id already applied (at-least-once: allowed).
    pub duplicates: u64,
    /// `(seq it had, snapshot seq after, reason)` per `resync_required`.
    pub resyncs: Vec<(i64, i64, String)>,
    /// The highest seq the stream has brought it to (an event's or a bookmark's).
    pub through: i64,
    pub connections: u64,
    pub bookmarks: u64,
    /// Order broken on a connection (recorded as they happen).
    pub disorder: Vec<String>,
}

/// The watcher's record, shared with the checks.
#[derive(Debug, Clone, Default)]
pub struct WatchLog(Arc<Mutex<Watched>>);

impl WatchLog {
    pub fn snapshot(&self) -> Watched {
        self.0.lock().map(|w| w.clone()).unwrap_or_default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut Watched) -> R) -> Option<R> {
        self.0.lock().ok().map(|mut w| f(&mut w))
    }
}

/// One SSE frame.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Frame {
    pub id: Option<String>,
    pub event: String,
    pub data: String,
}

/// Splits complete frames off the front of `buf` (frames end with a blank line).
pub fn take_frames(buf: &mut String) -> Vec<Frame> {
    let mut out = Vec::new();
    while let Some(end) = buf.find("\n\n") {
        let raw: String = buf.drain(..end + 2).collect();
        let mut f = Frame::default();
        for line in raw.lines() {
            if let Some(v) = line.strip_prefix("id:") {
                f.id = Some(v.trim_start().to_owned());
            } else if let Some(v) = line.strip_prefix("event:") {
                f.event = v.trim_start().to_owned();
            } else if let Some(v) = line.strip_prefix("data:") {
                f.data.push_str(v.trim_start());
            }
        }
        out.push(f);
    }
    out
}

/// Starts the watcher on its node (added to `w`); it runs until the world stops.
pub fn start_watcher(w: &mut crate::world::World) -> WatchLog {
    let node = w.add_node(WATCHER_NODE);
    let log = WatchLog::default();
    let l = log.clone();
    node.spawn(async move { watch(l).await });
    log
}

async fn watch(log: WatchLog) {
    let base = crate::world::node_url(WATCHED_NODE);
    // A reader: the stream needs no more (C3 §3.1.2).
    let bearer = dlock_rt::http::Bearer::fixed(dlock_contract::auth::Secret::new(dlock_testkit::auth::READER_TOKEN));
    let client = HttpClient::new(WATCH_CONNECT_MS, WATCH_READ_MS).with_bearer(Some(bearer));
    let mut cursor: Option<String> = None;
    let mut naps_left = WATCH_NAPS;
    let draw = |lo: u64, hi: u64| lo + dlock_rt::rand::random_u64() % (hi - lo + 1);
    loop {
        if cursor.is_none() {
            match snapshot(&client, &base).await {
                Some((c, seq, events)) => {
                    log.with(|w| {
                        let had = w.through;
                        for e in events {
                            apply(w, e);
                        }
                        // The `resync_required` this snapshot answers gets its end; the first
                        // snapshot is one of its own.
                        match w.resyncs.last_mut() {
                            Some(r) if r.1 < 0 => r.1 = seq,
                            _ => w.resyncs.push((had, seq, "snapshot".to_owned())),
                        }
                        w.through = w.through.max(seq);
                    });
                    cursor = Some(c);
                }
                None => {
                    dlock_rt::sleep(Duration::from_millis(WATCH_RECONNECT_MS)).await;
                    continue;
                }
            }
        }
        let c = cursor.clone().unwrap_or_default();
        let resumed = log.with(|w| {
            w.connections += 1;
            w.through
        });
        let Some(resumed) = resumed else { return };
        let Ok(mut res) = client.get_streaming(&base, "/v1/events", &[("last-event-id", c.as_str())]).await else {
            dlock_rt::sleep(Duration::from_millis(WATCH_RECONNECT_MS)).await;
            continue;
        };
        if res.status != 200 {
            dlock_rt::sleep(Duration::from_millis(WATCH_RECONNECT_MS)).await;
            continue;
        }
        let mut buf = String::new();
        let mut last = resumed;
        let nap = (naps_left > 0).then(|| {
            naps_left -= 1;
            (draw(WATCH_STAY_MS_MIN, WATCH_STAY_MS_MAX), draw(WATCH_NAP_MS_MIN, WATCH_NAP_MS_MAX))
        });
        let connected = madsim::time::Instant::now();
        'conn: loop {
            let idle = match nap {
                Some((stay, _)) => {
                    let left = stay.saturating_sub(connected.elapsed().as_millis() as u64);
                    if left == 0 {
                        break 'conn;
                    }
                    left.min(WATCH_IDLE_MS)
                }
                None => WATCH_IDLE_MS,
            };
            let chunk = match res.next_chunk(idle).await {
                Ok(Some(b)) => b,
                Err(dlock_rt::http::ClientError::Timeout(_)) if nap.is_some() => continue 'conn,
                _ => break 'conn,
            };
            buf.push_str(&String::from_utf8_lossy(&chunk));
            for f in take_frames(&mut buf) {
                match f.event.as_str() {
                    "resync_required" => {
                        let reason = serde_json::from_str::<serde_json::Value>(&f.data)
                            .ok()
                            .and_then(|v| v["reason"].as_str().map(str::to_owned))
                            .unwrap_or_default();
                        log.with(|w| w.resyncs.push((w.through, -1, reason)));
                        cursor = None;
                        break 'conn;
                    }
                    "bookmark" => {
                        let seq = serde_json::from_str::<serde_json::Value>(&f.data)
                            .ok()
                            .and_then(|v| v["seq"].as_i64())
                            .unwrap_or(-1);
                        log.with(|w| {
                            if seq < last {
                                w.disorder.push(format!("bookmark at seq {seq} after seq {last}"));
                            }
                            w.bookmarks += 1;
                            w.through = w.through.max(seq);
                        });
                        last = last.max(seq);
                        cursor = f.id.clone().or(cursor);
                    }
                    _ => {
                        let Ok(e) = serde_json::from_str::<WireEvent>(&f.data) else {
                            log.with(|w| w.disorder.push(format!("a frame that is no event: {:?}", f.event)));
                            continue;
                        };
                        log.with(|w| {
                            if e.seq <= last {
                                w.disorder.push(format!(
                                    "connection {}: seq {} after seq {last} (resumed from {resumed})",
                                    w.connections, e.seq
                                ));
                            }
                            w.through = w.through.max(e.seq);
                            apply(w, e.clone());
                        });
                        last = last.max(e.seq);
                        cursor = f.id.clone().or(cursor);
                    }
                }
            }
        }
        drop(res);
        let pause = nap.map_or(WATCH_RECONNECT_MS, |(_, away)| away);
        dlock_rt::sleep(Duration::from_millis(pause)).await;
    }
}

fn apply(w: &mut Watched, e: WireEvent) {
    if w.seen.insert(e.event_id.clone()) {
        w.applied.push(e);
    } else {
        w.duplicates += 1;
    }
}

/// `GET /v1/events/recent`: the cursor, its seq and the events.
async fn snapshot(client: &HttpClient, base: &dlock_rt::http::BaseUrl) -> Option<(String, i64, Vec<WireEvent>)> {
    let path = format!("/v1/events/recent?limit={WATCH_SNAPSHOT_EVENTS}");
    let res = client.send(base, http::Method::GET, &path, &[], None).await.ok()?;
    if res.status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&res.body).ok()?;
    let cursor = v["cursor"].as_str()?.to_owned();
    let seq = v["seq"].as_i64()?;
    let events: Vec<WireEvent> = serde_json::from_value(v["events"].clone()).ok()?;
    Some((cursor, seq, events))
}

/// Waits (bounded) until the watcher has been brought to paydb's last streamed event.
pub async fn catch_up(log: &WatchLog, paydb: &MemPaydb) -> bool {
    let last = streamed(paydb).last().map_or(0, |e| e.seq);
    dlock_rt::wait_until(Duration::from_millis(200), Duration::from_millis(WATCH_CATCH_UP_MS_MAX), || {
        let through = log.snapshot().through;
        async move { (through >= last).then_some(()) }
    })
    .await
    .is_some()
}

/// paydb's events the payment-resource streams (every kind but the rail's), in seq order.
pub fn streamed(paydb: &MemPaydb) -> Vec<StoredEvent> {
    paydb.with_tables(|t| t.rail.events.history().filter(|e| !e.kind.is_rail()).cloned().collect()).unwrap_or_default()
}

/// The watcher's invariants against paydb (see the module doc).
pub fn failures(log: &WatchLog, paydb: &MemPaydb, caught_up: bool) -> Vec<Failure> {
    let w = log.snapshot();
    let mut out = Vec::new();
    for d in w.disorder.iter().take(3) {
        out.push(Failure::correctness(ids::STREAM_IN_COMMIT_ORDER, d.clone()));
    }
    let truth: BTreeMap<i64, StoredEvent> = streamed(paydb).into_iter().map(|e| (e.seq, e)).collect();
    let mut got: BTreeSet<i64> = BTreeSet::new();
    for e in &w.applied {
        if e.event_id != format!("{}/{}", dlock_paydb::events::STREAM, e.seq) || !got.insert(e.seq) {
            out.push(Failure::correctness(
                ids::STREAM_DEDUPES_BY_ID,
                format!("event id {} at seq {} repeats or names another seq", e.event_id, e.seq),
            ));
            break;
        }
        let same = truth.get(&e.seq).map(|t| WireEvent::of(dlock_paydb::events::STREAM, t));
        if same.as_ref() != Some(e) {
            out.push(Failure::correctness(
                ids::STREAM_ONLY_COMMITTED,
                format!("received {} {} at seq {}, paydb has {:?}", e.kind, e.event_id, e.seq, same.map(|s| s.kind)),
            ));
            break;
        }
    }
    let exempt = |seq: i64| w.resyncs.iter().any(|(from, to, _)| seq > *from && seq <= *to);
    let missed: Vec<i64> =
        truth.keys().copied().filter(|s| *s <= w.through && !got.contains(s) && !exempt(*s)).collect();
    if let Some(first) = missed.first() {
        out.push(Failure::correctness(
            ids::STREAM_NEVER_GAPS,
            format!(
                "{} committed events up to seq {} never reached the watcher, the first seq {first} ({})",
                missed.len(),
                w.through,
                truth.get(first).map_or("?", |e| e.kind.as_str())
            ),
        ));
    }
    if !caught_up {
        out.push(Failure::liveness(
            ids::STREAM_CATCHES_UP,
            format!("the watcher reached seq {} of {}", w.through, truth.keys().last().copied().unwrap_or(0)),
        ));
    }
    out
}

/// `outbox_matches_tables`: paydb's events replayed give paydb's payouts and fences.
pub fn outbox_failures(paydb: &MemPaydb) -> Vec<Failure> {
    let Ok(found) = paydb.with_tables(|t| {
        let mut state: BTreeMap<String, PayoutState> = BTreeMap::new();
        let mut fence: BTreeMap<String, i64> = BTreeMap::new();
        let mut broken: Vec<String> = Vec::new();
        for e in t.rail.events.history() {
            let body = &e.body;
            match e.kind {
                EventKind::PayoutCreated => {
                    let s = body["state"].as_str().and_then(PayoutState::parse);
                    if let (Some(p), Some(s)) = (&e.payout_id, s) {
                        if state.insert(p.clone(), s).is_some() {
                            broken.push(format!("payout {p} created twice (seq {})", e.seq));
                        }
                    }
                }
                EventKind::PayoutStateChanged => {
                    let (from, to) = (body["from"].as_str(), body["to"].as_str());
                    let Some(p) = &e.payout_id else { continue };
                    let had = state.get(p).map(|s| s.as_str());
                    if had != from {
                        broken.push(format!(
                            "payout {p}: seq {} moves from {from:?}, but the chain is at {had:?}",
                            e.seq
                        ));
                    }
                    if let Some(to) = to.and_then(PayoutState::parse) {
                        state.insert(p.clone(), to);
                    }
                }
                EventKind::FenceRaised => {
                    let Some(a) = &e.account_id else { continue };
                    let had = fence.get(a).copied().unwrap_or(0);
                    let (prev, now) = (body["previousFence"].as_i64(), body["presentedToken"].as_i64());
                    if prev != Some(had) || now.is_none_or(|n| n <= had) {
                        broken.push(format!(
                            "account {a}: seq {} raises {prev:?}->{now:?}, the chain is at {had}",
                            e.seq
                        ));
                    }
                    if let Some(n) = now {
                        fence.insert(a.clone(), n);
                    }
                }
                _ => {}
            }
        }
        for (id, p) in &t.rail.payouts {
            let chain = state.get(&id.to_string()).copied();
            if chain != Some(p.row.state) {
                broken.push(format!("payout {id}: the events end at {chain:?}, the table says {:?}", p.row.state));
            }
        }
        for (id, a) in &t.accounts {
            if a.fence != fence.get(id).copied().unwrap_or(0) {
                broken.push(format!(
                    "account {id}: the events raise its fence to {:?}, the table says {}",
                    fence.get(id),
                    a.fence
                ));
            }
        }
        broken
    }) else {
        return Vec::new();
    };
    found.into_iter().take(1).map(|b| Failure::correctness(ids::OUTBOX_MATCHES_TABLES, b)).collect()
}
