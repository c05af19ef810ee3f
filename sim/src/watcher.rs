//! The stream watcher (issue 38): one client per event stream (C3-extensions E-20,
//! `GET /v1/events`), all on node `watcher`, each connected to one service for the whole
//! seed ([`Stream`]):
//!
//! | stream | node | kinds | ground truth |
//! |---|---|---|---|
//! | `payment-resource` | `payment-1` | paydb's, but `rail.*` | paydb's outbox (`MemEvents::history`) |
//! | `rail-proxy` | `proxy-1` | paydb's `rail.*` ([`EventKind::is_rail`]) | paydb's outbox |
//! | `lock-server` | `lock-1` | lockdb's ([`EventKind::is_lock`]) | lockdb's outbox (`MemLockStore::event_history`) |
//!
//! Every replica of a service reads the one store, so its first replica stands for all. The
//! lock server's stream is watched on the simulation lockdb only: on etcd no history keeps
//! the purged records to judge it against.
//!
//! Each client is its own task with its own cursor, naps and resyncs, so a fault on one
//! service never masks another's stream. It resumes from its last cursor after every broken
//! connection (a partition, a kill, a restart of its node), naps [`WATCH_NAPS`] times (the
//! first nap until the retention purge of its store has passed its cursor), deduplicates by
//! `eventId`, and on `resync_required` takes a new snapshot (`GET /v1/events/recent`) and
//! continues from its cursor. It never fails on its own: it records what it received ([`Watched`]), and the
//! oracle judges it.
//!
//! ## Invariants (checked by [`failures`] per stream, against its store's own outbox)
//! A failure keeps the invariant's id and names the stream at the head of its detail
//! ([`Stream::label`], e.g. `lock-server stream (lock-1): ...`).
//! - `stream_in_commit_order`: on each connection, events arrive in strictly increasing
//!   seq, each above the seq the connection resumed from.
//! - `stream_never_gaps`: every event its store committed of the kinds the stream carries,
//!   with a seq up to the last one the client was brought to (an event's or a bookmark's),
//!   was received, except those a `resync_required` covered (between the seq it had and
//!   the snapshot it took after).
//! - `stream_only_committed`: every event received is its store's event of that seq, equal
//!   in every field, and of a kind the stream carries.
//! - `stream_dedupes_by_id`: after deduplication no event id repeats, and each id names
//!   its store and its seq.
//! - `stream_catches_up` (liveness): once faults stopped, the client reaches the stream's
//!   last event within [`WATCH_CATCH_UP_MS_MAX`].
//! - `outbox_matches_tables` (paydb's store, not a stream; every seed): replaying paydb's
//!   events gives paydb's tables: each payout's `payout.state_changed` chain starts at its
//!   `payout.created` state, each step from the state the previous one left, and ends at the
//!   payout's state; each account's `fence.raised` chain rises from 0 to its fence. An event
//!   for a change that did not commit, or a change without its event, breaks a chain.
//!
//! The watcher runs on the seeds whose configuration draws it ([`crate::swarm::SwarmConfig`]
//! `watcher`); the others keep a world without it (and without a tailer on any service,
//! which starts on the first stream request).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_contract::payout::PayoutState;
use dlock_contract::stream::{EventKind, StoredEvent, WireEvent};
use dlock_lock_server::store::LockStore as _;
use dlock_lock_server::store_mem::MemLockStore;
use dlock_paydb::MemPaydb;
use dlock_rt::http::HttpClient;

use crate::outcome::Failure;
use crate::world::World;

/// The watcher's node (every stream's client runs on it).
pub const WATCHER_NODE: &str = "watcher";
/// Longest silence on an open stream before a client reconnects (above the bookmark
/// interval, so a healthy idle stream never trips it).
pub const WATCH_IDLE_MS: u64 = 20_000;
/// Pause before reconnecting after a failure.
pub const WATCH_RECONNECT_MS: u64 = 300;
/// Budgets of the watcher's HTTP calls.
pub const WATCH_CONNECT_MS: u64 = 1_000;
pub const WATCH_READ_MS: u64 = 5_000;
/// How long the end of a seed waits for each client to reach its stream's last event.
pub const WATCH_CATCH_UP_MS_MAX: u64 = 30_000;
/// Pause between two looks at a client's progress while the end of a seed waits for it.
pub const WATCH_CATCH_UP_POLL_MS: u64 = 200;
/// Naps each client takes during a seed: it drops its connection after staying
/// [`WATCH_STAY_MS_MIN`]..=[`WATCH_STAY_MS_MAX`] and comes back with the cursor it had (a
/// client that went away), so every watcher seed resumes from stale cursors. The first nap
/// lasts until the retention purge of its stream's store has passed its cursor (at most
/// [`WATCH_PURGE_NAP_MS_MAX`]): every stream whose seed writes more than a retention's worth
/// of events while it is away resumes from a purged cursor. The others last
/// [`WATCH_NAP_MS_MIN`]..=[`WATCH_NAP_MS_MAX`].
pub const WATCH_NAPS: u32 = 3;
/// Longest first nap, waiting for the purge to pass the client's cursor.
pub const WATCH_PURGE_NAP_MS_MAX: u64 = 10_000;
/// Pause between two looks at the purge during the first nap.
pub const WATCH_PURGE_POLL_MS: u64 = 250;
pub const WATCH_STAY_MS_MIN: u64 = 500;
pub const WATCH_STAY_MS_MAX: u64 = 4_000;
pub const WATCH_NAP_MS_MIN: u64 = 200;
pub const WATCH_NAP_MS_MAX: u64 = 5_000;
/// Events of the snapshot a client takes after a `resync_required`.
pub const WATCH_SNAPSHOT_EVENTS: usize = 200;
/// Failures of one kind reported per stream (the first ones; a broken stream breaks often).
pub const WATCH_FAILURES_PER_KIND_MAX: usize = 3;

/// One event stream the watcher follows (the module doc's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stream {
    /// The payment-resource's selection of paydb's events (every kind but the rail's).
    Payment,
    /// The rail-proxy's selection of paydb's events (the `rail.*` kinds).
    Rail,
    /// The lock server's: lockdb's events.
    Lock,
}

impl Stream {
    /// Every stream, in the order the watcher starts and the oracle judges them.
    pub const ALL: [Stream; 3] = [Stream::Payment, Stream::Rail, Stream::Lock];

    /// The service serving it (its `scope` in the cursor).
    pub fn service(self) -> &'static str {
        match self {
            Stream::Payment => "payment-resource",
            Stream::Rail => "rail-proxy",
            Stream::Lock => "lock-server",
        }
    }

    /// The node its client connects to.
    pub fn node(self) -> &'static str {
        match self {
            Stream::Payment => "payment-1",
            Stream::Rail => "proxy-1",
            Stream::Lock => "lock-1",
        }
    }

    /// The store whose outbox it streams: the prefix of its event ids.
    pub fn store(self) -> &'static str {
        match self {
            Stream::Payment | Stream::Rail => dlock_paydb::events::STREAM,
            Stream::Lock => dlock_lock_server::store::events::STREAM,
        }
    }

    /// Whether it streams events of `kind` (the service's own selection).
    pub fn carries(self, kind: EventKind) -> bool {
        match self {
            Stream::Payment => !kind.is_rail(),
            Stream::Rail => kind.is_rail(),
            Stream::Lock => kind.is_lock(),
        }
    }

    /// How a failure names it: `lock-server stream (lock-1)`.
    pub fn label(self) -> String {
        format!("{} stream ({})", self.service(), self.node())
    }

    /// Whether the world `w` has a ground truth for it: paydb's streams always, lockdb's on
    /// the simulation lockdb only.
    pub fn judged_in(self, w: &World) -> bool {
        match self {
            Stream::Payment | Stream::Rail => true,
            Stream::Lock => w.spec().backend == crate::world::LockBackend::Mem,
        }
    }
}

/// The stores the streams serve, read raw (below every fault layer), as the oracle reads
/// them: the streams' ground truth, and what a client napping past the purge waits for.
#[derive(Debug, Clone)]
pub struct Stores {
    pub paydb: Arc<MemPaydb>,
    pub lockdb: Arc<MemLockStore>,
}

impl Stores {
    pub fn of(w: &World) -> Stores {
        Stores { paydb: w.paydb.clone(), lockdb: w.locks.clone() }
    }

    /// Every event `stream`'s store ever committed that it streams (purged ones included),
    /// in seq order: the ground truth the stream is judged against.
    pub fn truth(&self, stream: Stream) -> Vec<StoredEvent> {
        let all = match stream {
            Stream::Payment | Stream::Rail => {
                self.paydb.with_tables(|t| t.rail.events.history().cloned().collect()).unwrap_or_default()
            }
            Stream::Lock => self.lockdb.event_history(),
        };
        all.into_iter().filter(|e| stream.carries(e.kind)).collect()
    }

    /// The highest seq the retention purge of `stream`'s store has deleted.
    pub async fn purged_through(&self, stream: Stream) -> i64 {
        match stream {
            Stream::Payment | Stream::Rail => {
                self.paydb.with_tables(|t| t.rail.events.read(i64::MAX, 0).purged_through).unwrap_or(0)
            }
            Stream::Lock => self.lockdb.read_events(i64::MAX, 0).await.map_or(0, |r| r.purged_through),
        }
    }
}

/// Invariant ids (see the module doc).
pub mod ids {
    pub const STREAM_IN_COMMIT_ORDER: &str = "stream_in_commit_order";
    pub const STREAM_NEVER_GAPS: &str = "stream_never_gaps";
    pub const STREAM_ONLY_COMMITTED: &str = "stream_only_committed";
    pub const STREAM_DEDUPES_BY_ID: &str = "stream_dedupes_by_id";
    pub const OUTBOX_MATCHES_TABLES: &str = "outbox_matches_tables";
    /// Liveness: a client reached its stream's last event once faults stopped.
    pub const STREAM_CATCHES_UP: &str = "stream_catches_up";
}

/// What one stream's client received.
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

/// One client's record, shared with the checks.
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

/// The clients the watcher runs, each with its record.
#[derive(Debug, Clone, Default)]
pub struct Watchers(pub Vec<(Stream, WatchLog)>);

impl Watchers {
    /// The record of `stream`'s client, if the watcher runs one.
    pub fn log(&self, stream: Stream) -> Option<&WatchLog> {
        self.0.iter().find(|(s, _)| *s == stream).map(|(_, l)| l)
    }
}

/// Starts the watcher on its node (added to `w`): one client task per stream of `streams`
/// ([`Stream::judged_in`] `w` only); each runs until the world stops.
pub fn start_watcher(w: &mut World, streams: &[Stream]) -> Watchers {
    let streams: Vec<Stream> = streams.iter().copied().filter(|s| s.judged_in(w)).collect();
    let stores = Stores::of(w);
    let node = w.add_node(WATCHER_NODE);
    let mut out = Watchers::default();
    for stream in streams {
        let log = WatchLog::default();
        let (l, st) = (log.clone(), stores.clone());
        node.spawn(async move { watch(stream, l, st).await });
        out.0.push((stream, log));
    }
    out
}

async fn watch(stream: Stream, log: WatchLog, stores: Stores) {
    let base = crate::world::node_url(stream.node());
    // A reader: the stream needs no more (C3 §3.1.2).
    let bearer = dlock_rt::http::Bearer::fixed(dlock_contract::auth::Secret::new(dlock_testkit::auth::READER_TOKEN));
    let client = HttpClient::new(WATCH_CONNECT_MS, WATCH_READ_MS).with_bearer(Some(bearer));
    let clock = dlock_rt::Clock::system();
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
        // `(stay, away, until the purge passed the cursor)`.
        let nap = (naps_left > 0).then(|| {
            let first = naps_left == WATCH_NAPS;
            naps_left -= 1;
            (draw(WATCH_STAY_MS_MIN, WATCH_STAY_MS_MAX), draw(WATCH_NAP_MS_MIN, WATCH_NAP_MS_MAX), first)
        });
        let connected = clock.now();
        'conn: loop {
            let idle = match nap {
                Some((stay, _, _)) => {
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
        match nap {
            Some((_, _, true)) => {
                // The first nap: away until the purge has passed the cursor, then one more
                // tail of the hub so it has seen the purge too.
                let through = log.snapshot().through;
                let (poll, max) =
                    (Duration::from_millis(WATCH_PURGE_POLL_MS), Duration::from_millis(WATCH_PURGE_NAP_MS_MAX));
                let _ = dlock_rt::wait_until(poll, max, || {
                    let stores = stores.clone();
                    async move { (stores.purged_through(stream).await > through).then_some(()) }
                })
                .await;
                dlock_rt::sleep(Duration::from_millis(2 * dlock_contract::stream::EVENT_POLL_MS)).await;
            }
            Some((_, away, false)) => dlock_rt::sleep(Duration::from_millis(away)).await,
            None => dlock_rt::sleep(Duration::from_millis(WATCH_RECONNECT_MS)).await,
        }
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

/// Waits (bounded, [`WATCH_CATCH_UP_MS_MAX`]) until `stream`'s client has been brought to
/// the stream's last event.
pub async fn catch_up(log: &WatchLog, stream: Stream, stores: &Stores) -> bool {
    let last = stores.truth(stream).last().map_or(0, |e| e.seq);
    dlock_rt::wait_until(
        Duration::from_millis(WATCH_CATCH_UP_POLL_MS),
        Duration::from_millis(WATCH_CATCH_UP_MS_MAX),
        || {
            let through = log.snapshot().through;
            async move { (through >= last).then_some(()) }
        },
    )
    .await
    .is_some()
}

/// Every client's invariants, stream by stream, each waited for first ([`catch_up`]).
pub async fn judge(watchers: &Watchers, w: &World) -> Vec<Failure> {
    let stores = Stores::of(w);
    let mut out = Vec::new();
    for (stream, log) in &watchers.0 {
        let caught_up = catch_up(log, *stream, &stores).await;
        out.extend(failures(*stream, log, &stores.truth(*stream), caught_up));
    }
    out
}

/// One client's invariants against `truth`, its stream's events as the store committed them
/// ([`Stores::truth`]; see the module doc). Each failure's detail starts with
/// [`Stream::label`].
pub fn failures(stream: Stream, log: &WatchLog, truth: &[StoredEvent], caught_up: bool) -> Vec<Failure> {
    let w = log.snapshot();
    let named = |detail: String| format!("{}: {detail}", stream.label());
    let mut out = Vec::new();
    for d in w.disorder.iter().take(WATCH_FAILURES_PER_KIND_MAX) {
        out.push(Failure::correctness(ids::STREAM_IN_COMMIT_ORDER, named(d.clone())));
    }
    let truth: BTreeMap<i64, &StoredEvent> = truth.iter().map(|e| (e.seq, e)).collect();
    let mut got: BTreeSet<i64> = BTreeSet::new();
    for e in &w.applied {
        if e.event_id != format!("{}/{}", stream.store(), e.seq) || !got.insert(e.seq) {
            out.push(Failure::correctness(
                ids::STREAM_DEDUPES_BY_ID,
                named(format!("event id {} at seq {} repeats or names another seq", e.event_id, e.seq)),
            ));
            break;
        }
        let same = truth.get(&e.seq).map(|t| WireEvent::of(stream.store(), t));
        if same.as_ref() != Some(e) {
            out.push(Failure::correctness(
                ids::STREAM_ONLY_COMMITTED,
                named(format!(
                    "received {} {} at seq {}, the store has {:?}",
                    e.kind,
                    e.event_id,
                    e.seq,
                    same.map(|s| s.kind)
                )),
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
            named(format!(
                "{} committed events up to seq {} never reached the watcher, the first seq {first} ({})",
                missed.len(),
                w.through,
                truth.get(first).map_or("?", |e| e.kind.as_str())
            )),
        ));
    }
    if !caught_up {
        out.push(Failure::liveness(
            ids::STREAM_CATCHES_UP,
            named(format!("the watcher reached seq {} of {}", w.through, truth.keys().last().copied().unwrap_or(0))),
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
