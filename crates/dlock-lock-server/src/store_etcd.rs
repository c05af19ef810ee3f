//! lockdb on etcd (`--backend etcd --etcd-endpoints …`), through `etcd-client` (in
//! simulation: `madsim-etcd-client`'s simulated server, through the same API).
//!
//! ## Key layout
//! Everything lives under one prefix `P` (default `/dlock`), so several deployments or test
//! runs can share one etcd:
//! - `P/s/{session_id}`: a session, JSON `{owner_id, ttl_ms, expires_at_ms, expired_marked,
//!   prev}`.
//! - `P/g/{key}`: the grant of a key, JSON `{session_id, owner_id, acquired_at_ms,
//!   expires_at_ms, ttl_ms, nonce, prev}`, plus `rotated` or `token` on a rotated grant
//!   (see "Tokens").
//!   At most one per key, by construction (it is one etcd key).
//! - `P/k/{key}`: the key was seen (`info` answers `Some`), with its lock-delay
//!   `{delay_until_ms, delay_left_ms, prev}`. Written by every removal of a lost grant, and by a grant only when
//!   that changes it (absent, or carrying a lock-delay that has run out); a grant over a
//!   record without delay leaves it alone but still guards it.
//! - `P/r/{revocation_id}`: the audit record of a revoke `{key, operator, reason,
//!   revoked_token, at_ms}`; its CreateRevision is the new token floor.
//!
//! Every value is non-empty JSON: the existence test below relies on it.
//!
//! ## Tokens (FR-10)
//! The token of a grant is the ModRevision of the transaction that wrote `P/g/{key}`. The
//! granting transaction requires the key to be absent, so that revision is also the key's
//! CreateRevision, which a renew (a put over the existing key) leaves alone: the token is read
//! back as `create_revision` wherever the grant is read. etcd's revision is one global
//! counter that every write transaction advances and that survives restarts (it is in the
//! WAL and the snapshot), so tokens strictly increase across keys, sessions and restarts.
//! Callers may rely only on their order (they are not dense: every write advances the
//! revision).
//!
//! **Rotate** (C3-extensions E-18) replaces a grant in one guarded txn. etcd refuses a txn
//! that deletes and puts the same key, so the rotate *puts over* `P/g/{key}`, which keeps its
//! CreateRevision; the new grant's value carries `rotated: true`, and its token is the
//! record's **ModRevision**, the rotate txn's own revision (its first put, read back in the
//! same txn), greater than every revision before it, `t₁` included. A renew of a rotated
//! grant (a put, which moves the ModRevision) writes the token into the value (`token`) and
//! drops `rotated`. So a grant's token is `token`, else the ModRevision if `rotated`, else
//! the CreateRevision ([`Rec::token`]); grants never rotated keep their exact old bytes.
//!
//! **Floor.** A revoke writes its audit record in the same transaction that deletes the
//! grant, as that transaction's first put; the record's CreateRevision is the revoke's own
//! revision and is returned as `new_token_floor`. Every later transaction has a greater
//! revision, so every later token exceeds the floor, with no stored counter to keep in step:
//! the floor is etcd's revision counter itself, and it survives whatever etcd's data survives.
//!
//! ## Transactions and the value-compare trap
//! Each method reads what it needs (one read-only txn, or two when a grant's holder session
//! must be looked up), decides, and commits one guarded txn whose compares assert that every
//! record it decided on is unchanged; if a guard fails, it re-reads and decides again, at most
//! [`CAS_ATTEMPTS_MAX`] times (then `Unavailable`). That is optimistic concurrency control:
//! the committed txn is the atomic step, and its guards make it serialisable with every other.
//!
//! ## Round trips: guards from what was last seen
//! Read-then-commit alone makes an acquire+release pair five round trips (read, grant; read
//! the grant, read its holder session, delete). Three things make it two in the common case,
//! both write txns, like etcd's own lock/unlock pair:
//! - **Failed guards read back.** A guarded commit carries, in its else branches (one per
//!   nesting level, see below), the gets its method's next attempt needs; a failed guard
//!   answers a consistent snapshot in the same round trip, and the retry decides on it.
//! - **Hints** (`Seen`, per process, bounded by [`SEEN_MAX`]): the raw bytes this store
//!   last wrote or read of sessions, grants and key records. `acquire` first tries to grant
//!   on them when they say the key is free (caller's session live, no grant seen, no
//!   lock-delay running; a key never seen is guessed free), guarding the session, the
//!   grant's absence and the key record exactly as if it had read them; `release` first
//!   deletes the grant `(key, token)` when they say it is live, guarding the grant *and*
//!   its holder session's bytes (the decision used both). A hint is never trusted: the
//!   guards make the commit decide on exactly the state it would have read, and a stale
//!   hint only fails a guard (one write round trip that reads back instead of a read).
//!   Refusals are decided only on real snapshots, never on hints.
//! - **Rotate** is like release: first on what this process last saw of the grant and the
//!   caller's session (both guarded), else on a snapshot; a failed guard reads back.
//! - **Holder in the same read.** Where a grant's holder session is needed (`acquire`,
//!   `release`, `info`, `revoke`), the read also gets the session this process last saw
//!   holding the key; the separate holder lookup happens only when that guess was wrong.
//!
//! Read-only txns go through etcd's linearizable read path, txns with a put or delete in
//! any branch through raft (one WAL append) whether their guards hold or not; with replicas
//! sharing etcd, hints are staler and some first attempts cost that write round trip.
//!
//! The simulator evaluates only *value* compares, and a `NotEqual` on a missing key is true
//! there but false on real etcd (real etcd fails every value compare on a missing key). So:
//! - "record unchanged" is `value(k) == bytes read` on a key that was read as present. Equal
//!   on a missing key is false on both. A grant carries a random `nonce`, so equal bytes mean
//!   the same grant (no ABA: a released and re-granted key never has the same value).
//! - "record absent" is expressed without `NotEqual`: `value(k) > ""` is true exactly when
//!   `k` exists (all values are non-empty; a missing key fails it on both), and the guarded
//!   ops go in the *else* branch: `if value(k) > "" then {} else { txn(rest) }`, nested once
//!   per key that must be absent. Nested txns are in etcd since 3.3 and in the simulator.
//! - `NotEqual`, `version`, `create_revision` and `mod_revision` compares are never used.
//!
//! A second simulator quirk: inside one txn it gives each put its own revision (`r+1`,
//! `r+2`, …) and then resets the store's revision to `r+1`, where real etcd gives every op
//! of a txn the same revision `r+1`. Only the *first* put of a txn gets the same revision on
//! both, so the one put whose revision is used (the grant's, the revocation record's) is
//! always the first op of its txn, and the revision is read back inside the same txn with a
//! `get` rather than taken from the header.
//!
//! ## Events (C3-extensions E-20)
//! A txn that changes what the outbox records ([`crate::store::events`]) also puts one
//! record `P/e/{random id}` holding its events, in order (at most [`EVENTS_PER_TXN_MAX`] − 1),
//! as the txn's **second** op: after the first op, whose revision the tokens and the floor
//! are, and which every such txn has (a put, or a guarded delete of a key that exists).
//! The txn's revision is the events' order: event `i` of a txn at revision `r` has seq
//! `r * EVENTS_PER_TXN_MAX + i`, so events of one txn share its revision and keep their order.
//! On real etcd every op of a txn has the txn's revision; the simulator gives the second op
//! the first op's revision + 1 ("the value-compare trap" above), which the reader takes off
//! ([`EVENT_PUT_REV_AFTER_FIRST`]): so seqs are commit order on both, and a grant's token or
//! a revoke's floor (unknown until the txn commits) is filled into its event's body from the
//! txn's revision when read. A read is linearizable, and every later txn has a greater
//! revision: every seq up to the greatest read is final. The purge deletes whole records
//! (the oldest, keeping at least `keep` events) and keeps its mark at `P/ep`.
//!
//! ## Held keys (C3-extensions E-23)
//! A page is judged at one revision `R`: one read-only txn reads every session and the
//! page's grants (a key range in key order, with a limit; the whole `P/g/` in the
//! simulator, narrowed here), and `R` is its floor, as for `info`. The grants' key records
//! are read after, each beside its grant again, in txns of [`GRANTS_PER_TXN_MAX`] keys:
//! every txn that writes `P/k/{key}` also writes `P/g/{key}` (a grant, or the removal of a
//! lost one), and a grant's bytes are never stored twice ("Time"), so a grant read again
//! unchanged proves its key record is as it was at `R`. A grant that changed meanwhile
//! reads the page again, at most [`CAS_ATTEMPTS_MAX`] times.
//!
//! ## Time
//! etcd has no clock API, and no replica's wall clock decides anything here: **each
//! replica judges every grant, session and lock-delay by durations on its own monotonic
//! clock, since it first saw that version of the record** (the DynamoDB lock client's rule;
//! C1 §1.5.4, C3-extensions C-28). [`Judge`] keeps it:
//! - **The frame.** `now` is this replica's *frame*: epoch ms that advance only with its
//!   monotonic clock ([`Clock::now`]), anchored at its wall clock when the store opened. A
//!   wall-clock step after that moves nothing; only the clock's *rate* matters.
//! - **First sight.** A stored version is identified by its bytes: a new grant carries a
//!   random `nonce`, and every later version at a key carries `prev`, the digest of the
//!   version it replaced (its guard proved it replaced exactly that one), so equal bytes at
//!   one key are one version, and no version needs a random draw. The first time this
//!   replica reads a version, or just before it sends the write that stores one, it notes
//!   the frame instant ([`Judge::seen`], [`Judge::wrote`]). A write that extends a version
//!   (`heartbeat`, `renew`) takes that instant after its read, never before: a read that
//!   stalled would otherwise date the extension before a version a concurrent call committed
//!   meanwhile, and shorten what that call's answer had promised (docs/testing/bugs.md, B22). Read back, a version's instants
//!   are rewritten into the frame from that instant ([`Judged`]): a session or a grant ends
//!   `ttl_ms` after it was first seen, a lock-delay runs the `delay_left_ms` it was written
//!   with. A session marked expired has ended. The rules then decide exactly as on any
//!   backend. The stored `expires_at_ms`, `acquired_at_ms` and `delay_until_ms` are in the
//!   writer's frame, for humans reading etcd; no decision reads them back.
//! - **Why it is safe.** The holder's client starts its lease before it sends the request
//!   (FR-11), the writer notes the version when it decides, and every other replica can
//!   only see it after it committed. So no replica judges a version dead before `ttl_ms`
//!   of its own clock have passed since the holder started believing, whatever any wall
//!   clock says or does. Only rates matter: server-side exclusion holds while the judging
//!   replica's clock does not run fast; the holders' beliefs stay exclusive while clock
//!   rates differ by less than `m / (2 − m)` for the client's safety margin `m` (17.6 % at
//!   the default 0.3).
//! - **It extends, never shortens.** A replica that has just started, or forgot a version
//!   (the table is bounded by [`WATCHED_MAX`]), judges it from now: a full TTL more. The
//!   reaper reads every session and grant each pass, so a replica first sees every version
//!   within one reaper interval of its commit; that is the extra delay a takeover through
//!   another replica can take, on top of the TTL. The reaper does not read key records: a
//!   replica first sees a lock-delay when an acquire reads it, and runs its time from then,
//!   so there a delay ends later by as long as the record sat unread (at most once per lost
//!   grant and replica: the next grant clears the delay).
//! - **Answers.** Instants in answers are the frame shifted onto the wall clock
//!   (`Judge::wall_offset`, which follows the wall clock only when the two part by more
//!   than [`WALL_OFFSET_SLACK_MS`], so one grant's instants read the same in every answer):
//!   for humans; nothing reads them back to decide.
//! - **Upgrades.** A grant without `ttl_ms` is judged by `expires_at_ms - acquired_at_ms`; a
//!   lock-delay without `delay_left_ms` runs [`LEGACY_DELAY_LEFT_MS`] from first sight.
//!
//! ## Why sessions are not etcd leases
//! etcd leases have second granularity, a server-enforced minimum TTL (about 1.5 election
//! timeouts, typically 2 s+), and their expiry *deletes* the attached keys: the store could
//! no longer answer `SESSION_EXPIRED` (distinct from unknown, for a retention period), nor
//! record the lock-delay of a grant that died with its session, nor decide expiry at the
//! millisecond `expires_at` the contract returns. The simulator's leases tick once a second.
//! So sessions are records judged by `expires_at_ms`, like the SQL backends; the reaper
//! removes what died.
//!
//! ## Limits
//! - Hints are per process and forgotten kind by kind past [`SEEN_MAX`] records; other
//!   replicas' writes make them stale (a guard fails, the txn reads back, the retry decides).
//! - `heartbeat`, `close_session` and `reap` scan `P/g/` (all grants): O(grants) per call;
//!   `held_keys` reads every session (O(sessions)) and, in the simulator, every grant. A
//!   per-session index would make them O(held); not needed at the sizes this serves today.
//! - A session's grants are removed in chunks of [`GRANTS_PER_TXN_MAX`] to stay under etcd's
//!   `--max-txn-ops` (default 128); a session holding more is closed in several txns.
//! - Every RPC is bounded by [`RPC_MS_MAX`]; unreachable etcd, no leader (requests require
//!   one), a timeout or any etcd error is `Unavailable` (503 `NOT_LEADER`).
//! - A txn whose connection was refused (nothing sent) is sent again, up to
//!   [`CONNECT_REFUSED_TRIES_MAX`] tries within that one bound: etcd-client balances over
//!   the endpoints with tonic's balanced channel, which keeps a member whose reconnect
//!   failed "ready", so its power-of-two-choices balancer keeps handing requests to a
//!   member that is down (it is never busy), each refused at once; another try most often
//!   reaches a live member. Found by the local fault run (docs/testing/bugs.md, B5): with one of three members
//!   down the lock servers answered a steady share of requests 503 until it came back.
//!   Invariant: only a refused connect is retried (the request never left the process), so
//!   a retried write cannot apply twice.

use std::collections::{BTreeMap, HashMap};
use std::ops::{Bound, RangeBounds};
use std::sync::Mutex;

use async_trait::async_trait;
use dlock_contract::stream::{EventKind, StoredEvent};
use dlock_rt::{Clock, Duration};
use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::rules::{self, AcquireFacts, GrantFacts, GrantPlan, RotateFacts};
use crate::store::events::{removal_kind, LockEventRecord};
use crate::store::{
    AcquireRefusal, Addressed, EventRead, GrantRow, HeldKey, KeyInfo, LockStore, ReapReport, RenewRefusal, Revocation,
    RevokeRefusal, RotateRefusal, SessionRefusal, SessionRow, StoreError, WallShift,
};

/// Bound on one etcd round trip (connect, read, or txn).
pub const RPC_MS_MAX: u64 = 2_000;
/// Tries of one txn whose connect is refused (see the module doc, "Limits"). The
/// simulator dials one endpoint only, so there another try would reach the same node:
/// one try, and the simulation's runs stay as they were.
#[cfg(not(madsim))]
pub const CONNECT_REFUSED_TRIES_MAX: usize = 8;
#[cfg(madsim)]
pub const CONNECT_REFUSED_TRIES_MAX: usize = 1;
/// Bound on optimistic retries of one method whose guard failed under contention.
pub const CAS_ATTEMPTS_MAX: usize = 64;
/// Grants removed per txn (2 ops each, plus one for the session) under etcd's default
/// `--max-txn-ops` of 128.
pub const GRANTS_PER_TXN_MAX: usize = 40;
/// Events one txn may record is below this; an event's seq is its txn's revision times it,
/// plus its index in the txn ("Events").
pub const EVENTS_PER_TXN_MAX: usize = 64;
/// Event records one read of `P/e/` answers, at most (real etcd; the simulator answers all).
pub const EVENT_RECORDS_PER_READ_MAX: usize = 512;
/// Event records one purge txn deletes, at most (under etcd's `--max-txn-ops` of 128).
pub const EVENT_RECORDS_PER_PURGE_TXN_MAX: usize = 100;
/// How far an event record's ModRevision is past its txn's first op's ("Events"): 0 on etcd,
/// where every op of a txn shares its revision; 1 in the simulator, where the record, the
/// second op, gets its own.
pub const EVENT_PUT_REV_AFTER_FIRST: i64 = if cfg!(madsim) { 1 } else { 0 };
/// The prefix when the operator names none.
pub const DEFAULT_PREFIX: &str = "/dlock";
/// Records of each kind remembered as hints (`Seen`); past it, that kind is forgotten.
pub const SEEN_MAX: usize = 4_096;
/// Stored versions whose first sight a replica remembers ("Time"); past it, all are
/// forgotten, and every lease is judged again from its next sight (later, never sooner).
pub const WATCHED_MAX: usize = 65_536;
/// The lock-delay left, from first sight, of a key record written before records carried
/// the delay left (during a rolling upgrade): a conservative guess, since such a record
/// holds only the writer's wall-clock instant, which no replica may compare with its own.
pub const LEGACY_DELAY_LEFT_MS: i64 = 10_000;
/// How far the wall clock may part from a replica's frame before its answers' wall times
/// follow it ("Time"): the one bound every backend's answers share.
pub use crate::store::WALL_OFFSET_SLACK_MS;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SessionVal {
    owner_id: String,
    ttl_ms: i64,
    /// The writer's frame (module doc, "Time"): for humans. Read back, it is this replica's
    /// judged end ([`Judged`]).
    expires_at_ms: i64,
    expired_marked: bool,
    /// The digest of the version this one replaced ([`digest`]; absent in a session's first
    /// version): makes every version's bytes at one key unique ("Time").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prev: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct GrantVal {
    session_id: Uuid,
    owner_id: String,
    /// The writer's frame, for humans; read back, when the grant was acquired in this
    /// replica's frame: first sight less the grant's age when this version was written.
    acquired_at_ms: i64,
    /// The writer's frame, for humans; read back, this replica's judged end of the lease.
    expires_at_ms: i64,
    /// The lease this version grants, from when a replica first sees it ("Time"). Absent
    /// in a grant written before it was stored: `expires_at_ms - acquired_at_ms`.
    #[serde(default)]
    ttl_ms: i64,
    /// Makes every grant's bytes unique, so a value compare identifies one grant.
    nonce: Uuid,
    /// The digest of the version a renew replaced: makes every version of one grant unique
    /// ("Time").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prev: Option<u64>,
    /// Written by a rotate: the token is this value's ModRevision (see "Tokens").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    rotated: bool,
    /// The token, written by a renew of a rotated grant (its put moves the ModRevision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    token: Option<i64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct KeyVal {
    /// The writer's frame, for humans; read back, this replica's judged end of the delay.
    delay_until_ms: Option<i64>,
    /// The lock-delay still to run when this version was written, from when a replica first
    /// sees it ("Time"). Absent in a record written before it was stored: a delay there runs
    /// [`LEGACY_DELAY_LEFT_MS`] from first sight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delay_left_ms: Option<i64>,
    /// The digest of the version this one replaced: makes every version with a delay
    /// unique ("Time").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prev: Option<u64>,
}

impl KeyVal {
    /// A record carrying a lock-delay until `until_ms` (this replica's frame), written at
    /// `now_ms` over `replaced` (`None`: no record); `None`: no delay.
    fn delayed(until_ms: Option<i64>, now_ms: i64, replaced: Option<&[u8]>) -> KeyVal {
        KeyVal {
            delay_until_ms: until_ms,
            delay_left_ms: until_ms.map(|u| u.saturating_sub(now_ms).max(0)),
            prev: until_ms.map(|_| replaced.map_or(0, digest)),
        }
    }
}

/// What one stored version means on the replica that judges it: its instants rewritten into
/// this replica's frame from when it first saw these exact bytes (module doc, "Time").
trait Judged: DeserializeOwned {
    /// Rewrites this version's instants into the frame of the replica that first saw it at
    /// `seen_ms`.
    fn judge(&mut self, seen_ms: i64);
}

impl Judged for SessionVal {
    fn judge(&mut self, seen_ms: i64) {
        // A marked session lapsed before it was marked: it is over when first seen so.
        self.expires_at_ms = if self.expired_marked { seen_ms } else { seen_ms.saturating_add(self.ttl_ms) };
    }
}

impl Judged for GrantVal {
    fn judge(&mut self, seen_ms: i64) {
        if self.ttl_ms <= 0 {
            self.ttl_ms = self.expires_at_ms.saturating_sub(self.acquired_at_ms).max(0);
        }
        // The grant's age when this version was written: a duration within the writer's
        // frame (written at `expires - ttl`), so it means the same in every frame.
        let age = self.expires_at_ms.saturating_sub(self.ttl_ms).saturating_sub(self.acquired_at_ms).max(0);
        self.acquired_at_ms = seen_ms.saturating_sub(age);
        self.expires_at_ms = seen_ms.saturating_add(self.ttl_ms);
    }
}

impl Judged for KeyVal {
    fn judge(&mut self, seen_ms: i64) {
        let left = match (self.delay_left_ms, self.delay_until_ms) {
            (Some(left), _) => Some(left),
            (None, Some(_)) => Some(LEGACY_DELAY_LEFT_MS),
            (None, None) => None,
        };
        self.delay_until_ms = left.map(|l| seen_ms.saturating_add(l));
    }
}

/// Lease judgement on this replica's monotonic clock (module doc, "Time"): the frame, and
/// when this replica first saw each stored version.
#[derive(Debug)]
struct Judge {
    clock: Clock,
    /// The monotonic instant the store opened, and the wall clock then: the frame is epoch
    /// ms that advance with the monotonic clock only.
    origin: dlock_rt::Instant,
    origin_ms: i64,
    /// How far the wall clock is from the frame, as answers show it ([`WallShift`]).
    shift: WallShift,
    /// (etcd key, digest of bytes seen there) -> when first seen or written (frame ms). At
    /// most [`WATCHED_MAX`] entries; the reaper keeps, for the keys it scans, only the
    /// version each holds now.
    watched: Mutex<BTreeMap<(String, u64), i64>>,
    /// Whether the reaper's first full scan since the store opened has run.
    scanned: std::sync::atomic::AtomicBool,
}

impl Judge {
    fn new(clock: Clock) -> Judge {
        Judge {
            clock,
            origin: clock.now(),
            origin_ms: clock.wall().timestamp_millis(),
            shift: WallShift::new(clock, Some(0)),
            watched: Mutex::new(BTreeMap::new()),
            scanned: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Now, in this replica's frame: never backwards, whatever the wall clock does.
    fn frame(&self) -> i64 {
        if old_rule() {
            return self.clock.wall().timestamp_millis();
        }
        let elapsed = self.clock.now().saturating_duration_since(self.origin).as_millis();
        self.origin_ms.saturating_add(i64::try_from(elapsed).unwrap_or(i64::MAX))
    }

    /// How far this replica's wall clock is from its frame now (`frame + offset` is a wall
    /// time, for answers: humans only).
    fn wall_offset(&self) -> i64 {
        self.shift.offset(self.frame())
    }

    fn watched(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, u64), i64>> {
        self.watched.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// When this replica first saw `raw` at `key`: now, unless it saw these bytes there
    /// before and has watched them since. A replica that has just started has seen
    /// nothing, so it judges every lease from now: it extends, never shortens.
    fn seen(&self, key: &str, raw: &[u8]) -> i64 {
        self.seen_at(key, raw, self.frame())
    }

    /// [`Judge::seen`] with now being `now`.
    fn seen_at(&self, key: &str, raw: &[u8], now: i64) -> i64 {
        let version = (key.to_owned(), digest(raw));
        let mut watched = self.watched();
        if let Some(at) = watched.get(&version) {
            return *at;
        }
        Self::note(&mut watched, version, now);
        now
    }

    /// Whether this replica has a first sight of `raw` at `key`.
    fn is_watched(&self, key: &str, raw: &[u8]) -> bool {
        self.watched().contains_key(&(key.to_owned(), digest(raw)))
    }

    /// Notes that this replica wrote `raw` at `key` at `now` (its decision's instant).
    fn wrote(&self, key: &str, raw: &[u8], now: i64) {
        Self::note(&mut self.watched(), (key.to_owned(), digest(raw)), now);
    }

    fn note(watched: &mut BTreeMap<(String, u64), i64>, version: (String, u64), at: i64) {
        if watched.len() >= WATCHED_MAX && !watched.contains_key(&version) {
            // Forgetting only makes a lease judged later, never sooner.
            watched.clear();
        }
        watched.insert(version, at);
        assert!(watched.len() <= WATCHED_MAX, "the watch table is over its bound");
    }

    /// After a full scan of `prefixes`, which found `present` (key -> the digest of the
    /// bytes it holds): keeps, under those prefixes, only the watch of each key's present
    /// version, and every watch outside them.
    fn retain_scanned(&self, prefixes: &[&str], present: &BTreeMap<String, u64>) {
        self.watched().retain(|(k, d), _| {
            !prefixes.iter().any(|p| k.starts_with(p)) || present.get(k).is_some_and(|now| now == d)
        });
    }
}

/// The planted bug `etcd-wall-clock-judge` (simulation only): the rule before "Time", this
/// replica's wall clock against the instants other replicas wrote with theirs.
fn old_rule() -> bool {
    dlock_contract::planted::on(dlock_contract::planted::Bug::EtcdWallClockJudge)
}

/// A stable digest of a stored value's bytes: a version's identity on one key.
fn digest(raw: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    raw.hash(&mut h);
    h.finish()
}

/// One txn's events, as `P/e/{id}` holds them ("Events").
#[derive(Debug, Clone, Serialize, Deserialize)]
struct EventsVal {
    events: Vec<EventVal>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct EventVal {
    kind: String,
    /// The writer's wall clock, epoch ms: for humans.
    at_ms: i64,
    lock_key: Option<String>,
    body: serde_json::Value,
    /// The body field that is the txn's revision (a grant's `token`, a revoke's
    /// `newTokenFloor`), filled in when read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    txn_revision: Option<String>,
}

/// An event a txn will record, with the body field (if any) that is the txn's revision.
type Pending = (LockEventRecord, Option<&'static str>);

/// The event of grant `g` (its token as stored).
fn grant_event(kind: EventKind, key: &str, g: &Rec<GrantVal>) -> Pending {
    (LockEventRecord::grant(kind, key, g.token(), g.val.session_id, &g.val.owner_id), None)
}

/// The purge mark `P/ep`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct PurgedVal {
    purged_through: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct RevocationVal {
    key: String,
    operator: String,
    reason: String,
    revoked_token: i64,
    at_ms: i64,
}

/// One stored record: its raw bytes (for guards), decoded value and CreateRevision.
#[derive(Debug, Clone)]
struct Rec<T> {
    key: String,
    raw: Vec<u8>,
    val: T,
    create_rev: i64,
    mod_rev: i64,
}

impl Rec<GrantVal> {
    /// The grant's fencing token (module doc, "Tokens").
    fn token(&self) -> i64 {
        match (self.val.token, self.val.rotated) {
            (Some(t), _) => t,
            (None, true) => self.mod_rev,
            (None, false) => self.create_rev,
        }
    }
}

/// One raw key-value as read.
#[derive(Debug, Clone)]
struct Entry {
    key: String,
    value: Vec<u8>,
    create_rev: i64,
    mod_rev: i64,
}

impl Entry {
    fn decode<T: DeserializeOwned>(self) -> Result<Rec<T>, StoreError> {
        let val = serde_json::from_slice(&self.value)
            .map_err(|e| StoreError::Corrupt(format!("etcd value at {}: {e}", self.key)))?;
        Ok(Rec { key: self.key, raw: self.value, val, create_rev: self.create_rev, mod_rev: self.mod_rev })
    }
}

enum Read {
    Key(String),
    Prefix(String),
    /// The keys in `[start, end)`, in key order, at most `limit` (real etcd only: the
    /// simulator takes no range options).
    #[cfg(not(madsim))]
    Range {
        start: String,
        end: String,
        limit: usize,
    },
}

impl Read {
    fn op(&self) -> TxnOp {
        match self {
            // `None`: an exact get (the simulator's `GetOptions::new()` means prefix).
            Read::Key(k) => TxnOp::get(k.as_str(), None),
            Read::Prefix(p) => TxnOp::get(p.as_str(), Some(GetOptions::new().with_prefix())),
            #[cfg(not(madsim))]
            Read::Range { start, end, limit } => TxnOp::get(
                start.as_str(),
                Some(
                    GetOptions::new()
                        .with_range(end.as_str())
                        .with_limit(i64::try_from(*limit).unwrap_or(i64::MAX))
                        .with_sort(etcd_client::SortTarget::Key, etcd_client::SortOrder::Ascend),
                ),
            ),
        }
    }
}

/// What this process last wrote or read of some records, by raw bytes: hints for guessing a
/// txn's guards without reading first (see the module doc). Never trusted: a decision taken
/// on a hint is committed only under guards that every record it used still has exactly
/// those bytes, and a wrong hint just fails its guard. `None` means "seen absent".
#[derive(Debug, Default)]
struct Seen {
    /// Session records, by session id.
    sessions: HashMap<Uuid, Vec<u8>>,
    /// `P/g/{key}` by lock key: bytes, CreateRevision and ModRevision (the token is one of
    /// them or in the bytes, [`Rec::token`]).
    grants: HashMap<String, Option<(Vec<u8>, i64, i64)>>,
    /// `P/k/{key}` by lock key.
    keys: HashMap<String, Option<Vec<u8>>>,
}

fn remember<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>, k: K, v: V) {
    if map.len() >= SEEN_MAX && !map.contains_key(&k) {
        map.clear();
    }
    map.insert(k, v);
}

/// A guard of a commit.
#[derive(Clone)]
enum Cond {
    /// The key holds exactly these bytes.
    Is(String, Vec<u8>),
    /// The key does not exist.
    Absent(String),
}

impl Cond {
    fn of<T>(rec: &Rec<T>) -> Cond {
        Cond::Is(rec.key.clone(), rec.raw.clone())
    }

    fn of_opt<T>(rec: Option<&Rec<T>>, key: String) -> Cond {
        rec.map_or(Cond::Absent(key), Cond::of)
    }
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(v).map_err(|e| StoreError::Corrupt(format!("encode: {e}")))
}

fn unavailable(e: etcd_client::Error) -> StoreError {
    StoreError::Unavailable(format!("etcd: {e}"))
}

/// Answers of etcd (or of the client) that prove a write txn was not applied: refused before
/// it was sent, or by etcd before it was proposed. A refused connection sent nothing: the
/// real client says "tcp connect error" (tonic), the simulated one "connection refused"
/// (madsim's connect, before the request exists on the wire).
const WRITE_NOT_APPLIED: [&str; 5] = [
    "etcdserver: no leader",
    "etcdserver: too many requests",
    "etcdserver: not capable",
    "tcp connect error",
    "connection refused",
];

/// A failed write txn. Provably not applied (see [`WRITE_NOT_APPLIED`], or arguments the
/// client refused before sending) is [`StoreError::Unavailable`]; anything else (no answer
/// within the bound, a broken connection, "request timed out", "leader changed") may have
/// committed: [`StoreError::CommitUnknown`] (C3-extensions C-29).
fn write_error(e: etcd_client::Error) -> StoreError {
    let text = e.to_string();
    let not_sent = matches!(e, etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_));
    if not_sent || WRITE_NOT_APPLIED.iter().any(|m| text.contains(m)) {
        StoreError::Unavailable(format!("etcd: {text}"))
    } else {
        StoreError::CommitUnknown(format!("etcd: {text}"))
    }
}

/// Whether `e` is a connect that was refused: the request never left this process (the
/// real client: tonic's "tcp connect error" with an `ECONNREFUSED` source).
fn connect_refused(e: &etcd_client::Error) -> bool {
    let text = e.to_string();
    text.contains("tcp connect error") && (text.contains("ConnectionRefused") || text.contains("Connection refused"))
}

fn contended(what: &str) -> StoreError {
    StoreError::Unavailable(format!("etcd: {what} kept conflicting after {CAS_ATTEMPTS_MAX} attempts"))
}

/// When a grant dies, given its holder session as read ([`rules::grant_dies_at`]); `None`
/// when that session is gone (closed, or forgotten after retention). Such an orphan can only
/// arise when an acquire commits beside a concurrent close of the same session (neither
/// changes the session's value, so neither guard sees the other); it counts as released by
/// the close: dead, with no lock-delay.
fn death(g: &GrantVal, holder: Option<&SessionVal>) -> Option<i64> {
    rules::grant_dies_at(g.expires_at_ms, holder.map(session_end))
}

fn live(g: &GrantVal, holder: Option<&SessionVal>, now: i64) -> bool {
    rules::grant_live(g.expires_at_ms, holder.map(session_end), now)
}

/// When a session ends, judged on this replica: a session marked expired has ended (some
/// replica judged it lapsed), whenever this one first saw it so.
fn session_end(s: &SessionVal) -> i64 {
    if s.expired_marked {
        i64::MIN
    } else {
        s.expires_at_ms
    }
}

fn grant_row(key: &str, g: &Rec<GrantVal>) -> GrantRow {
    GrantRow {
        key: key.to_owned(),
        session_id: g.val.session_id,
        owner_id: g.val.owner_id.clone(),
        fencing_token: g.token(),
        acquired_at_ms: g.val.acquired_at_ms,
        expires_at_ms: g.val.expires_at_ms,
    }
}

fn session_row(id: Uuid, s: &SessionVal) -> SessionRow {
    SessionRow { session_id: id, owner_id: s.owner_id.clone(), ttl_ms: s.ttl_ms, expires_at_ms: s.expires_at_ms }
}

fn session_check(s: Option<&Rec<SessionVal>>, now: i64) -> Result<&Rec<SessionVal>, SessionRefusal> {
    rules::session_check(s.map(|s| self::session_end(&s.val)), now)?;
    s.ok_or(SessionRefusal::Unknown)
}

/// lockdb on etcd.
pub struct EtcdLockStore {
    client: Client,
    prefix: String,
    /// This replica's lease judgement: its frame and what it saw when ("Time").
    judge: Judge,
    /// Hints for guards, see [`Seen`].
    seen: Mutex<Seen>,
    /// Event records this store has put ("Events"): part of each one's key.
    event_records_written: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for EtcdLockStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLockStore").field("prefix", &self.prefix).field("clock", &self.judge.clock).finish()
    }
}

impl EtcdLockStore {
    /// Connects to etcd at `endpoints` (`http://host:port`), keeping every record under
    /// `prefix`. Leases are judged on this node's monotonic clock (module doc, "Time").
    pub async fn connect(endpoints: &[String], prefix: &str) -> Result<EtcdLockStore, StoreError> {
        Self::connect_with_clock(endpoints, prefix, Clock::system()).await
    }

    /// [`EtcdLockStore::connect`] with the node's clock (its wall-clock skew only changes
    /// the instants answers show).
    pub async fn connect_with_clock(
        endpoints: &[String],
        prefix: &str,
        clock: Clock,
    ) -> Result<EtcdLockStore, StoreError> {
        if endpoints.is_empty() {
            return Err(StoreError::Unavailable("etcd: no endpoints given".into()));
        }
        let prefix = prefix.trim_end_matches('/');
        let prefix = if prefix.is_empty() { DEFAULT_PREFIX.to_owned() } else { prefix.to_owned() };
        let client = Self::client(endpoints).await?;
        let store = EtcdLockStore {
            client,
            prefix,
            judge: Judge::new(clock),
            seen: Mutex::default(),
            event_records_written: std::sync::atomic::AtomicU64::new(0),
        };
        store.ping().await?;
        Ok(store)
    }

    #[cfg(not(madsim))]
    async fn client(endpoints: &[String]) -> Result<Client, StoreError> {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(std::time::Duration::from_millis(RPC_MS_MAX))
            .with_timeout(std::time::Duration::from_millis(RPC_MS_MAX))
            .with_require_leader(true);
        Self::bounded(Client::connect(endpoints, Some(options))).await
    }

    #[cfg(madsim)]
    async fn client(endpoints: &[String]) -> Result<Client, StoreError> {
        // The simulator dials `host:port` and takes the first endpoint only.
        let plain: Vec<String> = endpoints
            .iter()
            .map(|e| e.trim_start_matches("http://").trim_start_matches("https://").to_owned())
            .collect();
        Self::bounded(Client::connect(&plain, None)).await
    }

    async fn bounded<T>(f: impl std::future::Future<Output = Result<T, etcd_client::Error>>) -> Result<T, StoreError> {
        match dlock_rt::timeout(Duration::from_millis(RPC_MS_MAX), f).await {
            Some(r) => r.map_err(unavailable),
            None => Err(StoreError::Unavailable(format!("etcd: no answer within {RPC_MS_MAX} ms"))),
        }
    }

    /// Now in this replica's frame (module doc, "Time").
    fn now(&self) -> i64 {
        self.judge.frame()
    }

    /// A grant row judged in this replica's frame, on its wall clock (for answers).
    fn wall_row(&self, g: GrantRow) -> GrantRow {
        WallShift::grant(g, self.judge.wall_offset())
    }

    /// An acquire's refusal with its instants on this replica's wall clock (for answers).
    fn wall_refusal(&self, r: AcquireRefusal) -> AcquireRefusal {
        WallShift::acquire_refusal(r, self.judge.wall_offset())
    }

    fn session_key(&self, id: Uuid) -> String {
        format!("{}/s/{id}", self.prefix)
    }

    fn sessions_prefix(&self) -> String {
        format!("{}/s/", self.prefix)
    }

    fn grant_key(&self, key: &str) -> String {
        format!("{}/g/{key}", self.prefix)
    }

    fn grants_prefix(&self) -> String {
        format!("{}/g/", self.prefix)
    }

    fn key_key(&self, key: &str) -> String {
        format!("{}/k/{key}", self.prefix)
    }

    fn events_prefix(&self) -> String {
        format!("{}/e/", self.prefix)
    }

    fn purged_key(&self) -> String {
        format!("{}/ep", self.prefix)
    }

    /// Puts `events` into `ops` as the txn's second op ("Events"); nothing when there are
    /// none. The first op must be there already: its revision is the txn's.
    fn with_events(&self, ops: &mut Vec<TxnOp>, events: Vec<Pending>) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        assert!(events.len() < EVENTS_PER_TXN_MAX, "etcd: a txn records {} events", events.len());
        assert!(!ops.is_empty(), "etcd: events are a txn's second op");
        let at_ms = self.judge.clock.wall().timestamp_millis();
        let val = EventsVal {
            events: events
                .into_iter()
                .map(|(e, field)| EventVal {
                    kind: e.kind.as_str().to_owned(),
                    at_ms,
                    lock_key: e.lock_key,
                    body: e.body,
                    txn_revision: field.map(str::to_owned),
                })
                .collect(),
        };
        let raw = encode(&val)?;
        // A key no other txn puts, drawn without randomness (the simulation's random stream
        // stays as it was): this store's origin and count of event records, and the record's
        // own bytes (a grant's token, a session's id, the instant).
        let n = self.event_records_written.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = format!("{}{:x}-{n:x}-{:016x}", self.events_prefix(), self.judge.origin_ms, digest(&raw));
        ops.insert(1, TxnOp::put(key, raw, None));
        Ok(())
    }

    /// Event records with a ModRevision in `[min_rev, max_rev]`, by ModRevision
    /// (`descending`: newest first), at most `limit`; and the purge mark, in one read.
    async fn event_records(
        &self,
        (min_rev, max_rev): (i64, Option<i64>),
        descending: bool,
        limit: usize,
    ) -> Result<(Vec<Entry>, Option<Vec<u8>>), StoreError> {
        let prefix = self.events_prefix();
        #[cfg(not(madsim))]
        let opts = {
            let order = if descending { etcd_client::SortOrder::Descend } else { etcd_client::SortOrder::Ascend };
            let mut o = GetOptions::new()
                .with_prefix()
                .with_sort(etcd_client::SortTarget::Mod, order)
                .with_limit(i64::try_from(limit).unwrap_or(i64::MAX))
                .with_min_mod_revision(min_rev.max(0));
            if let Some(max) = max_rev {
                o = o.with_max_mod_revision(max);
            }
            o
        };
        // The simulator takes no range options: the whole prefix, narrowed below.
        #[cfg(madsim)]
        let opts = GetOptions::new().with_prefix();
        let ops = vec![TxnOp::get(prefix.as_str(), Some(opts)), TxnOp::get(self.purged_key(), None)];
        let resp = Self::bounded(self.txn(Txn::new().when(Vec::<Compare>::new()).and_then(ops))).await?;
        let mut r = Self::entries(resp.op_responses(), 2)?;
        let mark = r.pop().and_then(|mut e| e.pop()).map(|e| e.value);
        let mut records: Vec<Entry> = r
            .pop()
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.mod_rev >= min_rev && max_rev.is_none_or(|m| e.mod_rev <= m))
            .collect();
        records.sort_by_key(|e| if descending { -e.mod_rev } else { e.mod_rev });
        records.truncate(limit);
        Ok((records, mark))
    }

    /// The events of one record, with their seqs ("Events").
    fn events_of(e: &Entry) -> Result<Vec<StoredEvent>, StoreError> {
        let val: EventsVal = serde_json::from_slice(&e.value)
            .map_err(|err| StoreError::Corrupt(format!("etcd value at {}: {err}", e.key)))?;
        let revision = e.mod_rev - EVENT_PUT_REV_AFTER_FIRST;
        let width = EVENTS_PER_TXN_MAX as i64;
        val.events
            .into_iter()
            .enumerate()
            .map(|(i, ev)| {
                let kind = EventKind::parse(&ev.kind)
                    .ok_or_else(|| StoreError::Corrupt(format!("etcd: unknown event kind {:?}", ev.kind)))?;
                let mut body = ev.body;
                if let (Some(field), Some(o)) = (ev.txn_revision, body.as_object_mut()) {
                    o.insert(field, serde_json::json!(revision));
                }
                let at = chrono::DateTime::from_timestamp_millis(ev.at_ms)
                    .ok_or_else(|| StoreError::Corrupt(format!("etcd: event at_ms {}", ev.at_ms)))?;
                let record = LockEventRecord { kind, lock_key: ev.lock_key, body };
                Ok(record.stored(revision * width + i as i64, at))
            })
            .collect()
    }

    fn purged_of(mark: Option<&[u8]>) -> Result<PurgedVal, StoreError> {
        mark.map_or(Ok(PurgedVal::default()), |raw| {
            serde_json::from_slice(raw).map_err(|e| StoreError::Corrupt(format!("etcd purge mark: {e}")))
        })
    }

    fn revocation_key(&self, id: Uuid) -> String {
        format!("{}/r/{id}", self.prefix)
    }

    /// The read of the grants whose lock keys lie in `range`, in key order, at most `limit`
    /// (real etcd). The simulator takes no range options: there, every grant, narrowed by
    /// the caller, which narrows on real etcd too.
    fn grants_in(&self, (from, until): &(Bound<String>, Bound<String>), limit: usize) -> Read {
        #[cfg(not(madsim))]
        {
            let start = match from {
                Bound::Included(k) => self.grant_key(k),
                // The least key after `k`.
                Bound::Excluded(k) => format!("{}\0", self.grant_key(k)),
                Bound::Unbounded => self.grants_prefix(),
            };
            let end = match until {
                Bound::Excluded(k) => self.grant_key(k),
                Bound::Included(k) => format!("{}\0", self.grant_key(k)),
                // The end of `P/g/`: '0' follows '/'.
                Bound::Unbounded => format!("{}/g0", self.prefix),
            };
            Read::Range { start, end, limit }
        }
        #[cfg(madsim)]
        {
            let _ = (from, until, limit);
            Read::Prefix(self.grants_prefix())
        }
    }

    /// The lock key of a grant record's etcd key.
    fn lock_key_of<'a>(&self, grant_key: &'a str) -> &'a str {
        grant_key.strip_prefix(&self.grants_prefix()).unwrap_or(grant_key)
    }

    /// One read-only txn: a consistent snapshot of every key or prefix asked for.
    async fn read(&self, reads: Vec<Read>) -> Result<Vec<Vec<Entry>>, StoreError> {
        Ok(self.read_at(reads).await?.0)
    }

    /// [`Self::read`], with the revision the read saw: every later txn's revision (so every
    /// later token) exceeds it.
    async fn read_at(&self, reads: Vec<Read>) -> Result<(Vec<Vec<Entry>>, i64), StoreError> {
        let ops: Vec<TxnOp> = reads.iter().map(Read::op).collect();
        let resp = Self::bounded(self.txn(Txn::new().when(Vec::<Compare>::new()).and_then(ops))).await?;
        let revision = resp
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| StoreError::Corrupt("an etcd read answered without a header".into()))?;
        Ok((Self::entries(resp.op_responses(), reads.len())?, revision))
    }

    /// One txn, sent again while its connect is refused, [`CONNECT_REFUSED_TRIES_MAX`] tries
    /// in all (the caller bounds them all by one [`RPC_MS_MAX`]).
    async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse, etcd_client::Error> {
        let mut kv = self.client.kv_client();
        let mut tries = 1;
        loop {
            match kv.txn(txn.clone()).await {
                Err(e) if tries < CONNECT_REFUSED_TRIES_MAX && connect_refused(&e) => tries += 1,
                answer => return answer,
            }
        }
    }

    /// The records answered by `n` gets.
    fn entries(resps: Vec<TxnOpResponse>, n: usize) -> Result<Vec<Vec<Entry>>, StoreError> {
        let mut out = Vec::with_capacity(n);
        for op in resps {
            let TxnOpResponse::Get(get) = op else {
                return Err(StoreError::Corrupt("etcd: read txn answered a non-get".into()));
            };
            let mut entries = Vec::new();
            for kv in get.kvs() {
                let key = String::from_utf8(kv.key().to_vec())
                    .map_err(|e| StoreError::Corrupt(format!("etcd: non-utf8 key: {e}")))?;
                entries.push(Entry {
                    key,
                    value: kv.value().to_vec(),
                    create_rev: kv.create_revision(),
                    mod_rev: kv.mod_revision(),
                });
            }
            out.push(entries);
        }
        if out.len() != n {
            return Err(StoreError::Corrupt(format!("etcd: read txn answered {} of {n} gets", out.len())));
        }
        Ok(out)
    }

    async fn read_one<T: Judged>(&self, key: String) -> Result<Option<Rec<T>>, StoreError> {
        self.one(self.read(vec![Read::Key(key)]).await?.pop())
    }

    /// Commits `ops` iff every guard holds; returns the ops' responses, or `None` when a guard
    /// failed (nothing was written). See the module doc for how `Absent` is expressed.
    async fn commit(&self, conds: Vec<Cond>, ops: Vec<TxnOp>) -> Result<Option<Vec<TxnOpResponse>>, StoreError> {
        Ok(self.commit_or_read(conds, ops, &[]).await?.ok())
    }

    /// [`EtcdLockStore::commit`], where a failed guard answers `Err` with `reads` done by the
    /// same txn instead (a consistent snapshot, as [`EtcdLockStore::read`] gives): the next
    /// attempt decides on it without another round trip.
    async fn commit_or_read(
        &self,
        conds: Vec<Cond>,
        ops: Vec<TxnOp>,
        reads: &[Read],
    ) -> Result<Result<Vec<TxnOpResponse>, Vec<Vec<Entry>>>, StoreError> {
        let read_ops = || reads.iter().map(Read::op).collect::<Vec<TxnOp>>();
        let mut equal = Vec::new();
        let mut absent = Vec::new();
        for c in conds {
            match c {
                Cond::Is(k, v) => equal.push(Compare::value(k, CompareOp::Equal, v)),
                Cond::Absent(k) => absent.push(k),
            }
        }
        let mut txn = Txn::new().when(equal).and_then(ops).or_else(read_ops());
        for k in absent.iter().rev() {
            txn = Txn::new()
                .when(vec![Compare::value(k.as_str(), CompareOp::Greater, Vec::new())])
                .and_then(read_ops())
                .or_else(vec![TxnOp::txn(txn)]);
        }
        let mut resp = match dlock_rt::timeout(Duration::from_millis(RPC_MS_MAX), self.txn(txn)).await {
            Some(r) => r.map_err(write_error)?,
            None => {
                return Err(StoreError::CommitUnknown(format!("etcd: write txn unanswered within {RPC_MS_MAX} ms")))
            }
        };
        for _ in &absent {
            if resp.succeeded() {
                // The key exists.
                return Ok(Err(Self::entries(resp.op_responses(), reads.len())?));
            }
            match resp.op_responses().into_iter().next() {
                Some(TxnOpResponse::Txn(inner)) => resp = inner,
                _ => return Err(StoreError::Corrupt("etcd: nested txn answered no txn".into())),
            }
        }
        if resp.succeeded() {
            Ok(Ok(resp.op_responses()))
        } else {
            Ok(Err(Self::entries(resp.op_responses(), reads.len())?))
        }
    }

    /// The holder session of a grant: one of the sessions already read in the same snapshot
    /// (`None` there: read as absent), else read now.
    async fn holder(
        &self,
        g: &GrantVal,
        known: &[(Uuid, Option<&Rec<SessionVal>>)],
    ) -> Result<Option<Rec<SessionVal>>, StoreError> {
        match known.iter().find(|(id, _)| *id == g.session_id) {
            Some((_, s)) => Ok(s.cloned()),
            None => self.read_one::<SessionVal>(self.session_key(g.session_id)).await,
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn saw_session(&self, id: Uuid, s: Option<&Rec<SessionVal>>) {
        let mut seen = self.seen();
        match s {
            Some(s) => remember(&mut seen.sessions, id, s.raw.clone()),
            None => {
                seen.sessions.remove(&id);
            }
        }
    }

    fn saw_grant(&self, key: &str, g: Option<&Rec<GrantVal>>) {
        remember(&mut self.seen().grants, key.to_owned(), g.map(|g| (g.raw.clone(), g.create_rev, g.mod_rev)));
    }

    fn saw_key(&self, key: &str, rec: Option<&Rec<KeyVal>>) {
        remember(&mut self.seen().keys, key.to_owned(), rec.map(|r| r.raw.clone()));
    }

    /// The session this process last saw holding `key`, to read along with the grant.
    fn holder_hint(&self, key: &str) -> Option<Uuid> {
        let seen = self.seen();
        let (raw, _, _) = seen.grants.get(key)?.as_ref()?;
        serde_json::from_slice::<GrantVal>(raw).ok().map(|g| g.session_id)
    }

    /// The session record `id` as last seen, decoded.
    fn seen_session(&self, id: Uuid) -> Option<Rec<SessionVal>> {
        let raw = self.seen().sessions.get(&id)?.clone();
        self.judged(Entry { key: self.session_key(id), value: raw, create_rev: 0, mod_rev: 0 }).ok()
    }

    /// The grant of `key` as last seen: `None` unknown, `Some(None)` seen absent.
    fn seen_grant(&self, key: &str) -> Option<Option<Rec<GrantVal>>> {
        let g = self.seen().grants.get(key)?.clone();
        Some(g.and_then(|(raw, create_rev, mod_rev)| {
            self.judged(Entry { key: self.grant_key(key), value: raw, create_rev, mod_rev }).ok()
        }))
    }

    /// The key record of `key` as last seen: `None` unknown, `Some(None)` seen absent.
    fn seen_key(&self, key: &str) -> Option<Option<Rec<KeyVal>>> {
        let rec = self.seen().keys.get(key)?.clone();
        Some(
            rec.and_then(|raw| {
                self.judged(Entry { key: self.key_key(key), value: raw, create_rev: 0, mod_rev: 0 }).ok()
            }),
        )
    }

    /// The caller's session, the key record and the grant to make, when what this process
    /// last saw says the key is free for a grant at `now` ([`rules::decide_acquire`] on the
    /// hints: the session live, no grant seen, no lock-delay running). A key never seen here
    /// is guessed free and never granted.
    fn free_as_seen(
        &self,
        key: &str,
        session_id: Uuid,
        now: i64,
        delay_ms: i64,
    ) -> Option<(Rec<SessionVal>, Option<Rec<KeyVal>>, GrantPlan)> {
        let s = self.seen_session(session_id)?;
        if self.seen_grant(key).is_some_and(|g| g.is_some()) {
            return None;
        }
        let rec = self.seen_key(key).flatten();
        let decision = rules::decide_acquire(&AcquireFacts {
            now_ms: now,
            session_id,
            session_end_ms: Some(session_end(&s.val)),
            grant: None,
            key: rec.as_ref().map(|r| r.val.delay_until_ms),
            delay_ms,
        });
        let plan = decision.verdict.ok()?;
        Some((s, rec, plan))
    }

    /// The grant `(key, token)` and its holder session, when what this process last saw
    /// says that grant is live at `now`.
    fn live_as_seen(&self, key: &str, token: i64, now: i64) -> Option<(Rec<GrantVal>, Rec<SessionVal>)> {
        let g = self.seen_grant(key).flatten().filter(|g| g.token() == token)?;
        let h = self.seen_session(g.val.session_id)?;
        live(&g.val, Some(&h.val), now).then_some((g, h))
    }

    /// The granting txn: grants `key` to session `s` unless `s`, the key's grant (absent,
    /// or `replacing` for a rotate, which re-grants to the same session) or the key record
    /// `rec` changed from what the decision saw; then `Err` with `reads`' snapshot. The token
    /// is the txn's revision (the first put's; a fresh grant's CreateRevision, a rotated
    /// grant's ModRevision), read back in the same txn and asserted above the replaced one.
    async fn grant(
        &self,
        key: &str,
        (session_id, s): (Uuid, &Rec<SessionVal>),
        replacing: Option<&Rec<GrantVal>>,
        (rec, plan): (Option<&Rec<KeyVal>>, GrantPlan),
        (ttl_ms, now): (i64, i64),
        reads: &[Read],
    ) -> Result<Result<GrantRow, Vec<Vec<Entry>>>, StoreError> {
        let (gkey, kkey) = (self.grant_key(key), self.key_key(key));
        let val = GrantVal {
            session_id,
            owner_id: s.val.owner_id.clone(),
            acquired_at_ms: now,
            expires_at_ms: now + ttl_ms,
            ttl_ms,
            nonce: dlock_rt::rand::uuid_v4(),
            prev: None,
            rotated: replacing.is_some(),
            token: None,
        };
        let raw = encode(&val)?;
        let held = match replacing {
            Some(g) => Cond::of(g),
            None => Cond::Absent(gkey.clone()),
        };
        let conds = vec![Cond::of(s), held, Cond::of_opt(rec, kkey.clone())];
        // First op: its revision is the token on real etcd and in the simulator alike.
        let mut ops = vec![TxnOp::put(gkey.clone(), raw.clone(), None)];
        // The key record is written only when it changes: absent (first grant), or carrying
        // a lock-delay (which has run out, or the decision would have refused).
        let rec_after = match rec {
            Some(r) if !plan.write_key_record => r.raw.clone(),
            _ => {
                let cleared = encode(&KeyVal::default())?;
                ops.push(TxnOp::put(kkey.clone(), cleared.clone(), None));
                cleared
            }
        };
        ops.push(TxnOp::get(gkey.clone(), None));
        // The fresh token is the txn's revision, filled into the event when read ("Events").
        let mut events: Vec<Pending> = replacing.iter().map(|g| grant_event(EventKind::LockReleased, key, g)).collect();
        let granted = LockEventRecord::grant(EventKind::LockGranted, key, 0, session_id, &s.val.owner_id);
        events.push((granted, Some("token")));
        self.with_events(&mut ops, events)?;
        // Noted before the txn is sent, so that no reader of this replica can see the grant
        // first ("Time"); a txn whose guard fails leaves a watch of bytes never stored.
        self.judge.wrote(&gkey, &raw, now);
        match self.commit_or_read(conds, ops, reads).await? {
            Ok(resps) => {
                let (create_rev, mod_rev) = revisions_of(&resps)?;
                let granted = Rec { key: gkey, raw, val, create_rev, mod_rev };
                rules::assert_token_replaces(granted.token(), plan.replaces);
                self.saw_grant(key, Some(&granted));
                remember(&mut self.seen().keys, key.to_owned(), Some(rec_after));
                Ok(Ok(grant_row(key, &granted)))
            }
            Err(read) => Ok(Err(read)),
        }
    }

    /// Key records of `keys`, for merging lock-delays.
    async fn key_records(&self, keys: &[String]) -> Result<BTreeMap<String, Rec<KeyVal>>, StoreError> {
        let mut out = BTreeMap::new();
        for chunk in keys.chunks(GRANTS_PER_TXN_MAX) {
            let reads = chunk.iter().map(|k| Read::Key(self.key_key(k))).collect();
            for (k, mut entries) in chunk.iter().zip(self.read(reads).await?) {
                if let Some(e) = entries.pop() {
                    out.insert(k.clone(), self.judged(e)?);
                }
            }
        }
        Ok(out)
    }

    /// Guards and ops removing grant `g`. A lost grant (`lost_at`: when it died)
    /// records its lock-delay ([`rules::lock_delay_until`]), never lowering one already
    /// recorded ([`rules::merge_delay`]).
    fn drop_ops(
        &self,
        g: &Rec<GrantVal>,
        rec: Option<&Rec<KeyVal>>,
        lost_at: Option<i64>,
        delay_ms: i64,
        (conds, ops): (&mut Vec<Cond>, &mut Vec<TxnOp>),
    ) -> Result<(), StoreError> {
        let key = self.lock_key_of(&g.key);
        conds.push(Cond::of(g));
        ops.push(TxnOp::delete(g.key.clone(), None));
        if let Some(until) = rules::lock_delay_until(lost_at, delay_ms) {
            let old = rec.and_then(|r| r.val.delay_until_ms);
            let now = self.now();
            let raw =
                encode(&KeyVal::delayed(rules::merge_delay(old, Some(until)), now, rec.map(|r| r.raw.as_slice())))?;
            // Judged from now here ("Time"): the delay runs to `until` on this replica.
            self.judge.wrote(&self.key_key(key), &raw, now);
            conds.push(Cond::of_opt(rec, self.key_key(key)));
            ops.push(TxnOp::put(self.key_key(key), raw, None));
        }
        Ok(())
    }

    /// Removes the grants of session `s` (all, or in chunks) and then applies `last` (the
    /// session's own change) in the txn of the last chunk. `lost_at(g)` says whether and
    /// when each grant died. Every chunk's txn carries `last`'s guard (the session as read):
    /// a heartbeat committed meanwhile stops the removal at the next chunk, so no grant of a
    /// session an answered heartbeat extended is removed as lapsed (docs/testing/bugs.md B23).
    /// Returns how many grants were removed, or `None` if a guard failed (then the remaining
    /// chunks were not tried).
    async fn remove_session_grants(
        &self,
        grants: &[&Rec<GrantVal>],
        lost_at: impl Fn(&GrantVal) -> Option<i64>,
        delay_ms: i64,
        (last, mut last_events): ((Cond, TxnOp), Vec<Pending>),
    ) -> Result<Option<u64>, StoreError> {
        let keys: Vec<String> = grants.iter().map(|g| self.lock_key_of(&g.key).to_owned()).collect();
        let records = if delay_ms > 0 && grants.iter().any(|g| lost_at(&g.val).is_some()) {
            self.key_records(&keys).await?
        } else {
            BTreeMap::new()
        };
        let chunks: Vec<&[&Rec<GrantVal>]> =
            if grants.is_empty() { vec![&[][..]] } else { grants.chunks(GRANTS_PER_TXN_MAX).collect() };
        let mut removed = 0;
        let session_guard = last.0.clone();
        let mut last = Some(last);
        let n = chunks.len();
        for (i, chunk) in chunks.into_iter().enumerate() {
            let (mut conds, mut ops, mut events) = (Vec::new(), Vec::new(), Vec::new());
            if i + 1 < n {
                conds.push(session_guard.clone());
            }
            for g in chunk {
                let key = self.lock_key_of(&g.key);
                let lost = lost_at(&g.val);
                self.drop_ops(g, records.get(key), lost, delay_ms, (&mut conds, &mut ops))?;
                events.push(grant_event(removal_kind(lost.is_some()), key, g));
            }
            if i + 1 == n {
                if let Some((c, op)) = last.take() {
                    conds.push(c);
                    ops.push(op);
                    events.append(&mut last_events);
                }
            }
            self.with_events(&mut ops, events)?;
            if self.commit(conds, ops).await?.is_none() {
                return Ok(None);
            }
            removed += chunk.len() as u64;
        }
        Ok(Some(removed))
    }

    /// Every grant record, in key order.
    fn grants_of(&self, entries: Vec<Entry>) -> Result<Vec<Rec<GrantVal>>, StoreError> {
        entries.into_iter().map(|e| self.judged(e)).collect()
    }

    /// One stored record, decoded and judged on this replica ([`Judged`]).
    fn judged<T: Judged>(&self, e: Entry) -> Result<Rec<T>, StoreError> {
        let seen = self.judge.seen(&e.key, &e.value);
        let mut rec = e.decode::<T>()?;
        if !old_rule() {
            rec.val.judge(seen);
        }
        Ok(rec)
    }

    /// The single record of one get, decoded and judged.
    fn one<T: Judged>(&self, entries: Option<Vec<Entry>>) -> Result<Option<Rec<T>>, StoreError> {
        entries.and_then(|mut e| e.pop()).map(|e| self.judged(e)).transpose()
    }
}

/// The CreateRevision and ModRevision of the record a write txn read back last.
fn revisions_of(resps: &[TxnOpResponse]) -> Result<(i64, i64), StoreError> {
    for r in resps.iter().rev() {
        if let TxnOpResponse::Get(get) = r {
            if let Some(kv) = get.kvs().first() {
                return Ok((kv.create_revision(), kv.mod_revision()));
            }
        }
    }
    Err(StoreError::Corrupt("etcd: a txn did not read its record back".into()))
}

#[async_trait]
impl LockStore for EtcdLockStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.read(vec![Read::Key(format!("{}/ping", self.prefix))]).await.map(|_| ())
    }

    /// This replica's wall clock: for humans, and for relating the instants of its answers
    /// (which are on the same clock). No decision reads it ("Time").
    async fn now_ms(&self) -> Result<i64, StoreError> {
        Ok(self.now().saturating_add(self.judge.wall_offset()))
    }

    async fn open_session(&self, session_id: Uuid, owner_id: &str, ttl_ms: i64) -> Result<SessionRow, StoreError> {
        let now = self.now();
        let val = SessionVal {
            owner_id: owner_id.to_owned(),
            ttl_ms,
            expires_at_ms: now + ttl_ms,
            expired_marked: false,
            prev: None,
        };
        let raw = encode(&val)?;
        let mut ops = vec![TxnOp::put(self.session_key(session_id), raw.clone(), None)];
        self.with_events(&mut ops, vec![(LockEventRecord::session_opened(session_id, owner_id, ttl_ms), None)])?;
        self.judge.wrote(&self.session_key(session_id), &raw, now);
        self.commit(Vec::new(), ops).await?;
        remember(&mut self.seen().sessions, session_id, raw);
        let row = session_row(session_id, &val);
        Ok(SessionRow { expires_at_ms: row.expires_at_ms.saturating_add(self.judge.wall_offset()), ..row })
    }

    async fn heartbeat(&self, session_id: Uuid) -> Result<Result<(SessionRow, i64), SessionRefusal>, StoreError> {
        for _ in 0..CAS_ATTEMPTS_MAX {
            let mut r =
                self.read(vec![Read::Key(self.session_key(session_id)), Read::Prefix(self.grants_prefix())]).await?;
            let grants = self.grants_of(r.pop().unwrap_or_default())?;
            let session = r.pop().and_then(|mut e| e.pop()).map(|e| self.judged::<SessionVal>(e)).transpose()?;
            // After the read ("Time": just before the write): a `now` taken before a read that
            // stalled would date the new version before one a concurrent heartbeat committed
            // meanwhile, and shorten the session that heartbeat's answer extended (bugs.md B22).
            let now = self.now();
            let s = match session_check(session.as_ref(), now) {
                Ok(s) => s,
                Err(refusal) => return Ok(Err(refusal)),
            };
            let held =
                grants.iter().filter(|g| g.val.session_id == session_id && live(&g.val, Some(&s.val), now)).count();
            let val = SessionVal { expires_at_ms: now + s.val.ttl_ms, prev: Some(digest(&s.raw)), ..s.val.clone() };
            let raw = encode(&val)?;
            let ops = vec![TxnOp::put(s.key.clone(), raw.clone(), None)];
            self.judge.wrote(&s.key, &raw, now);
            if self.commit(vec![Cond::of(s)], ops).await?.is_some() {
                remember(&mut self.seen().sessions, session_id, raw);
                let row = session_row(session_id, &val);
                let row =
                    SessionRow { expires_at_ms: row.expires_at_ms.saturating_add(self.judge.wall_offset()), ..row };
                return Ok(Ok((row, held as i64)));
            }
        }
        Err(contended("heartbeat"))
    }

    async fn close_session(&self, session_id: Uuid, delay_ms: i64) -> Result<Result<(), SessionRefusal>, StoreError> {
        for _ in 0..CAS_ATTEMPTS_MAX {
            let now = self.now();
            let mut r =
                self.read(vec![Read::Key(self.session_key(session_id)), Read::Prefix(self.grants_prefix())]).await?;
            let grants = self.grants_of(r.pop().unwrap_or_default())?;
            let Some(s) = r.pop().and_then(|mut e| e.pop()).map(|e| self.judged::<SessionVal>(e)).transpose()? else {
                return Ok(Err(SessionRefusal::Unknown));
            };
            let mut mine: Vec<&Rec<GrantVal>> = grants.iter().filter(|g| g.val.session_id == session_id).collect();
            // Died before the close (lease or session lapsed): its lock-delay stands.
            let lost_at = |g: &GrantVal| rules::lost_before_close(g.expires_at_ms, session_end(&s.val), now);
            // The grants that had died first, then the ones the close releases (each by key).
            mine.sort_by_key(|g| lost_at(&g.val).is_none());
            let last = (Cond::of(&s), TxnOp::delete(s.key.clone(), None));
            if self.remove_session_grants(&mine, lost_at, delay_ms, (last, Vec::new())).await?.is_some() {
                self.saw_session(session_id, None);
                for g in mine {
                    self.saw_grant(self.lock_key_of(&g.key), None);
                }
                return Ok(Ok(()));
            }
        }
        Err(contended("close"))
    }

    async fn acquire(
        &self,
        key: &str,
        session_id: Uuid,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, AcquireRefusal>, StoreError> {
        let framed: Result<Result<GrantRow, AcquireRefusal>, StoreError> = async {
            let (skey, gkey, kkey) = (self.session_key(session_id), self.grant_key(key), self.key_key(key));
            // What one attempt decides on, in one snapshot: the caller's session, the grant, the
            // key record, and the session this process last saw holding the key, if another.
            let reads = |hint: Option<Uuid>| {
                let mut r = vec![Read::Key(skey.clone()), Read::Key(gkey.clone()), Read::Key(kkey.clone())];
                r.extend(hint.filter(|h| *h != session_id).map(|h| Read::Key(self.session_key(h))));
                (hint.filter(|h| *h != session_id), r)
            };
            // A snapshot answered by a txn whose guard failed, for the next attempt.
            let mut snap: Option<(Option<Uuid>, Vec<Vec<Entry>>)> = None;
            // The greatest token of a dead grant this call removed: the grant must exceed it.
            let mut replaced: Option<i64> = None;
            // First, grant on what this process last saw, when that says the key is free: the
            // granting txn's guards check every record the decision used, and answer the
            // snapshot if one differs. Refusals are never decided on what was seen.
            let now = self.now();
            if let Some((s, rec, plan)) = self.free_as_seen(key, session_id, now, delay_ms) {
                let (_, r) = reads(None);
                match self.grant(key, (session_id, &s), None, (rec.as_ref(), plan), (ttl_ms, now), &r).await? {
                    Ok(row) => return Ok(Ok(row)),
                    Err(read) => snap = Some((None, read)),
                }
            }
            for _ in 0..CAS_ATTEMPTS_MAX {
                let (hint, r) = match snap.take() {
                    Some(taken) => taken,
                    None => {
                        let (hint, r) = reads(self.holder_hint(key));
                        (hint, self.read(r).await?)
                    }
                };
                let now = self.now();
                let mut r = r.into_iter();
                let session = self.one::<SessionVal>(r.next())?;
                let grant = self.one::<GrantVal>(r.next())?;
                let rec = self.one::<KeyVal>(r.next())?;
                let hinted = hint.map(|h| self.one::<SessionVal>(r.next()).map(|s| (h, s))).transpose()?;
                self.saw_session(session_id, session.as_ref());
                self.saw_grant(key, grant.as_ref());
                self.saw_key(key, rec.as_ref());
                // The holder session of the grant in the way, if any (the caller's own, or the
                // hinted one, from the same snapshot; else read now).
                let session_end = session.as_ref().map(|s| self::session_end(&s.val));
                let holder = match grant.as_ref() {
                    // A refused session needs no holder lookup (the decision refuses first).
                    Some(g) if rules::session_check(session_end, now).is_ok() => {
                        let mut known = vec![(session_id, session.as_ref())];
                        known.extend(hinted.as_ref().map(|(h, hs)| (*h, hs.as_ref())));
                        self.holder(&g.val, &known).await?
                    }
                    _ => None,
                };
                let row = grant.as_ref().map(|g| grant_row(key, g));
                // The session is checked in the same decision (and txn) that grants (Jepsen etcd 3.4.3).
                let decision = rules::decide_acquire(&AcquireFacts {
                    now_ms: now,
                    session_id,
                    session_end_ms: session_end,
                    grant: row.as_ref().map(|r| GrantFacts {
                        grant: r,
                        holder_end_ms: holder.as_ref().map(|h| self::session_end(&h.val)),
                    }),
                    key: rec.as_ref().map(|r| r.val.delay_until_ms),
                    delay_ms,
                });
                if let (Some(removal), Some(g)) = (decision.remove, grant.as_ref()) {
                    // A dead grant in the way: remove it (recording its lock-delay) in its own
                    // txn, then decide again. The txn guards the grant *and* its holder session
                    // as read: replicas date a version from their own first sight ("Time"), so
                    // a session this replica judged lapsed may meanwhile have been extended by
                    // a heartbeat another replica still judged live, and that heartbeat's
                    // answer promised the session, and so this grant, a full TTL more
                    // (docs/testing/bugs.md B23). A renew changes the grant's bytes, a
                    // heartbeat the session's: either fails the guard, and the next attempt
                    // decides on what it wrote.
                    let (mut conds, mut ops) = (Vec::new(), Vec::new());
                    self.drop_ops(g, rec.as_ref(), removal.died_at_ms, delay_ms, (&mut conds, &mut ops))?;
                    conds.push(Cond::of_opt(holder.as_ref(), self.session_key(g.val.session_id)));
                    self.with_events(&mut ops, vec![grant_event(EventKind::LockExpired, key, g)])?;
                    if self.commit(conds, ops).await?.is_some() {
                        replaced = replaced.max(Some(removal.token));
                    }
                    continue;
                }
                let plan = match decision.verdict {
                    Ok(plan) => GrantPlan { replaces: plan.replaces.max(replaced), ..plan },
                    Err(refusal) => return Ok(Err(refusal)),
                };
                let Ok(s) = session_check(session.as_ref(), now) else {
                    return Err(StoreError::Corrupt("etcd: acquire granted without a live session".into()));
                };
                let (hint, r) = reads(self.holder_hint(key));
                match self.grant(key, (session_id, s), None, (rec.as_ref(), plan), (ttl_ms, now), &r).await? {
                    Ok(row) => return Ok(Ok(row)),
                    Err(read) => snap = Some((hint, read)),
                }
            }
            Err(contended("acquire"))
        }
        .await;
        // Decided in this replica's frame; answered on its wall clock ("Time").
        Ok(framed?.map(|g| self.wall_row(g)).map_err(|r| self.wall_refusal(r)))
    }

    async fn renew(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
    ) -> Result<Result<GrantRow, RenewRefusal>, StoreError> {
        for _ in 0..CAS_ATTEMPTS_MAX {
            let mut r =
                self.read(vec![Read::Key(self.session_key(session_id)), Read::Key(self.grant_key(key))]).await?;
            let grant = r.pop().and_then(|mut e| e.pop()).map(|e| self.judged::<GrantVal>(e)).transpose()?;
            let session = r.pop().and_then(|mut e| e.pop()).map(|e| self.judged::<SessionVal>(e)).transpose()?;
            // After the read, as `heartbeat`'s: a renew never dates its version before one a
            // concurrent renew committed while this read stalled (bugs.md B22).
            let now = self.now();
            // The grant's holder is the caller's session whenever the renew can succeed, so
            // the caller's session (read in this snapshot) stands in for it.
            let row = grant.as_ref().map(|g| grant_row(key, g));
            let session_end = session.as_ref().map(|s| self::session_end(&s.val));
            let facts = row.as_ref().map(|r| GrantFacts { grant: r, holder_end_ms: session_end });
            if let Err(refusal) = rules::decide_renew(session_end, facts, session_id, token, now) {
                return Ok(Err(refusal));
            }
            let (Ok(s), Some(g)) = (session_check(session.as_ref(), now), grant) else {
                return Ok(Err(RenewRefusal::Lost { stored_token: None }));
            };
            // A rotated grant's token is its ModRevision, which this put moves: it is written
            // into the value instead (module doc, "Tokens").
            let kept = if g.val.rotated { Some(g.token()) } else { g.val.token };
            let val = GrantVal {
                expires_at_ms: now + ttl_ms,
                ttl_ms,
                prev: Some(digest(&g.raw)),
                rotated: false,
                token: kept,
                ..g.val.clone()
            };
            let raw = encode(&val)?;
            let mut ops = vec![TxnOp::put(g.key.clone(), raw.clone(), None)];
            self.with_events(&mut ops, vec![grant_event(EventKind::LockRenewed, key, &g)])?;
            self.judge.wrote(&g.key, &raw, now);
            if self.commit(vec![Cond::of(s), Cond::of(&g)], ops).await?.is_some() {
                let renewed = Rec { raw: raw.clone(), val, ..g };
                self.saw_grant(key, Some(&renewed));
                return Ok(Ok(self.wall_row(grant_row(key, &renewed))));
            }
        }
        Err(contended("renew"))
    }

    async fn release(&self, key: &str, token: i64) -> Result<Result<(), Option<i64>>, StoreError> {
        let gkey = self.grant_key(key);
        let reads = |holder: Option<Uuid>| {
            let mut r = vec![Read::Key(gkey.clone())];
            r.extend(holder.map(|h| Read::Key(self.session_key(h))));
            r
        };
        let mut snap: Option<(Option<Uuid>, Vec<Vec<Entry>>)> = None;
        // First, on what this process last saw of the grant and its holder session, when that
        // says the grant `(key, token)` is live: both records are guarded.
        if let Some((g, h)) = self.live_as_seen(key, token, self.now()) {
            let r = reads(Some(g.val.session_id));
            let mut ops = vec![TxnOp::delete(g.key.clone(), None)];
            self.with_events(&mut ops, vec![grant_event(EventKind::LockReleased, key, &g)])?;
            match self.commit_or_read(vec![Cond::of(&g), Cond::of(&h)], ops, &r).await? {
                Ok(_) => {
                    self.saw_grant(key, None);
                    return Ok(Ok(()));
                }
                Err(read) => snap = Some((Some(g.val.session_id), read)),
            }
        }
        for _ in 0..CAS_ATTEMPTS_MAX {
            let (hint, r) = match snap.take() {
                Some(taken) => taken,
                None => {
                    let hint = self.holder_hint(key);
                    (hint, self.read(reads(hint)).await?)
                }
            };
            let now = self.now();
            let mut r = r.into_iter();
            let grant = self.one::<GrantVal>(r.next())?;
            let hinted = hint.map(|h| self.one::<SessionVal>(r.next()).map(|s| (h, s))).transpose()?;
            self.saw_grant(key, grant.as_ref());
            let Some(g) = grant else { return Ok(Err(None)) };
            if g.token() != token {
                // Decided without the holder (the token alone refuses): saves its lookup.
                return Ok(Err(Some(g.token())));
            }
            let known: Vec<_> = hinted.iter().map(|(h, hs)| (*h, hs.as_ref())).collect();
            let holder = self.holder(&g.val, &known).await?;
            let row = grant_row(key, &g);
            let facts = GrantFacts { grant: &row, holder_end_ms: holder.as_ref().map(|h| self::session_end(&h.val)) };
            if let Err(stored) = rules::decide_release(Some(facts), token, now) {
                return Ok(Err(stored));
            }
            let r = reads(Some(g.val.session_id));
            let mut ops = vec![TxnOp::delete(g.key.clone(), None)];
            self.with_events(&mut ops, vec![grant_event(EventKind::LockReleased, key, &g)])?;
            match self.commit_or_read(vec![Cond::of(&g)], ops, &r).await? {
                Ok(_) => {
                    self.saw_grant(key, None);
                    return Ok(Ok(()));
                }
                Err(read) => snap = Some((Some(g.val.session_id), read)),
            }
        }
        Err(contended("release"))
    }

    async fn rotate(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, RotateRefusal>, StoreError> {
        let framed: Result<Result<GrantRow, RotateRefusal>, StoreError> = async {
            // The holder must be the caller, so the caller's session is the holder lookup.
            let reads = || {
                vec![
                    Read::Key(self.session_key(session_id)),
                    Read::Key(self.grant_key(key)),
                    Read::Key(self.key_key(key)),
                ]
            };
            let decide =
                |session: Option<&Rec<SessionVal>>, grant: Option<&Rec<GrantVal>>, rec: Option<&Rec<KeyVal>>, now| {
                    let row = grant.map(|g| grant_row(key, g));
                    let session_end = session.map(|s| self::session_end(&s.val));
                    // A grant of another session refuses whatever its holder's liveness (rules).
                    let holder_end = session_end.filter(|_| grant.is_some_and(|g| g.val.session_id == session_id));
                    rules::decide_rotate(&RotateFacts {
                        acquire: AcquireFacts {
                            now_ms: now,
                            session_id,
                            session_end_ms: session_end,
                            grant: row.as_ref().map(|r| GrantFacts { grant: r, holder_end_ms: holder_end }),
                            key: rec.map(|r| r.val.delay_until_ms),
                            delay_ms,
                        },
                        token,
                    })
                };
            let mut snap: Option<Vec<Vec<Entry>>> = None;
            // First, on what this process last saw (the grant `(key, token)` live and the caller's,
            // its session, the key record): every record the decision used is guarded. Refusals
            // are never decided on what was seen.
            let now = self.now();
            let seen = self.live_as_seen(key, token, now).filter(|(g, _)| g.val.session_id == session_id);
            if let (Some((g, s)), Some(rec)) = (seen, self.seen_key(key)) {
                if let Ok(plan) = decide(Some(&s), Some(&g), rec.as_ref(), now) {
                    match self
                        .grant(key, (g.val.session_id, &s), Some(&g), (rec.as_ref(), plan), (ttl_ms, now), &reads())
                        .await?
                    {
                        Ok(row) => return Ok(Ok(row)),
                        Err(read) => snap = Some(read),
                    }
                }
            }
            for _ in 0..CAS_ATTEMPTS_MAX {
                let r = match snap.take() {
                    Some(taken) => taken,
                    None => self.read(reads()).await?,
                };
                let now = self.now();
                let mut r = r.into_iter();
                let session = self.one::<SessionVal>(r.next())?;
                let grant = self.one::<GrantVal>(r.next())?;
                let rec = self.one::<KeyVal>(r.next())?;
                self.saw_session(session_id, session.as_ref());
                self.saw_grant(key, grant.as_ref());
                self.saw_key(key, rec.as_ref());
                let plan = match decide(session.as_ref(), grant.as_ref(), rec.as_ref(), now) {
                    Ok(plan) => plan,
                    Err(refusal) => return Ok(Err(refusal)),
                };
                let (Ok(s), Some(g)) = (session_check(session.as_ref(), now), grant.as_ref()) else {
                    return Err(StoreError::Corrupt("etcd: rotate granted without a live session and grant".into()));
                };
                match self
                    .grant(key, (g.val.session_id, s), Some(g), (rec.as_ref(), plan), (ttl_ms, now), &reads())
                    .await?
                {
                    Ok(row) => return Ok(Ok(row)),
                    Err(read) => snap = Some(read),
                }
            }
            Err(contended("rotate"))
        }
        .await;
        // Decided in this replica's frame; answered on its wall clock ("Time").
        let offset = self.judge.wall_offset();
        Ok(framed?.map(|g| self.wall_row(g)).map_err(|r| WallShift::rotate_refusal(r, offset)))
    }

    async fn owner_of(&self, target: Addressed<'_>) -> Result<Option<String>, StoreError> {
        Ok(match target {
            Addressed::Session(id) => self.read_one::<SessionVal>(self.session_key(id)).await?.map(|s| s.val.owner_id),
            Addressed::Grant { key, token } => self
                .read_one::<GrantVal>(self.grant_key(key))
                .await?
                .filter(|g| g.token() == token)
                .map(|g| g.val.owner_id),
        })
    }

    async fn info(&self, key: &str, delay_ms: i64) -> Result<Option<KeyInfo>, StoreError> {
        let framed: Result<Option<KeyInfo>, StoreError> = async {
            let now = self.now();
            let hint = self.holder_hint(key);
            let mut reads = vec![Read::Key(self.key_key(key)), Read::Key(self.grant_key(key))];
            reads.extend(hint.map(|h| Read::Key(self.session_key(h))));
            let (entries, revision) = self.read_at(reads).await?;
            let mut r = entries.into_iter();
            let seen = self.one::<KeyVal>(r.next())?;
            let grant = self.one::<GrantVal>(r.next())?;
            let hinted = hint.map(|h| self.one::<SessionVal>(r.next()).map(|s| (h, s))).transpose()?;
            self.saw_grant(key, grant.as_ref());
            let Some(seen) = seen else { return Ok(None) };
            let facts = match grant {
                None => None,
                Some(g) => {
                    let known: Vec<_> = hinted.iter().map(|(h, hs)| (*h, hs.as_ref())).collect();
                    let holder = self.holder(&g.val, &known).await?;
                    Some((grant_row(key, &g), holder.map(|h| session_end(&h.val))))
                }
            };
            let facts = facts.as_ref().map(|(g, h)| GrantFacts { grant: g, holder_end_ms: *h });
            // The token floor: a token is its grant's CreateRevision, and every later txn's
            // revision exceeds this read's.
            Ok(Some(rules::judge_key(facts, seen.val.delay_until_ms, delay_ms, revision, now)))
        }
        .await;
        Ok(framed?.map(|i| KeyInfo { grant: i.grant.map(|g| self.wall_row(g)), ..i }))
    }

    /// One page at one revision ("Held keys" in the module doc).
    async fn held_keys(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        delay_ms: i64,
    ) -> Result<Vec<HeldKey>, StoreError> {
        let Some(range) = rules::key_range(prefix, after).filter(|_| limit > 0) else { return Ok(Vec::new()) };
        let framed: Result<Vec<HeldKey>, StoreError> = async {
            'page: for _ in 0..CAS_ATTEMPTS_MAX {
                let now = self.now();
                let reads = vec![Read::Prefix(self.sessions_prefix()), self.grants_in(&range, limit)];
                let (mut entries, revision) = self.read_at(reads).await?;
                let mut grants = Vec::new();
                for e in entries.pop().unwrap_or_default() {
                    let key = self.lock_key_of(&e.key).to_owned();
                    if range.contains(&key) {
                        grants.push((key, self.judged::<GrantVal>(e)?));
                    }
                }
                grants.sort_by(|a, b| a.0.cmp(&b.0));
                grants.truncate(limit);
                let mut sessions = BTreeMap::new();
                for e in entries.pop().unwrap_or_default() {
                    let rec = self.judged::<SessionVal>(e)?;
                    if let Some(id) =
                        rec.key.strip_prefix(&self.sessions_prefix()).and_then(|r| Uuid::parse_str(r).ok())
                    {
                        sessions.insert(id, rec);
                    }
                }
                // The key records, read after: each grant read again beside its record,
                // unchanged, proves the record is as it was at `revision`.
                let mut records = BTreeMap::new();
                for chunk in grants.chunks(GRANTS_PER_TXN_MAX) {
                    let reads =
                        chunk.iter().flat_map(|(k, _)| [Read::Key(self.grant_key(k)), Read::Key(self.key_key(k))]);
                    let mut r = self.read(reads.collect()).await?.into_iter();
                    for (key, g) in chunk {
                        let again = r.next().and_then(|mut e| e.pop());
                        if again.is_none_or(|e| e.value != g.raw) {
                            continue 'page;
                        }
                        if let Some(rec) = self.one::<KeyVal>(r.next())? {
                            records.insert(key.clone(), rec);
                        }
                    }
                }
                return grants
                    .iter()
                    .map(|(key, g)| {
                        let row = grant_row(key, g);
                        let holder = sessions.get(&g.val.session_id).map(|s| session_end(&s.val));
                        let facts = GrantFacts { grant: &row, holder_end_ms: holder };
                        let delay_until = records.get(key).and_then(|r| r.val.delay_until_ms);
                        // The floor as `info` reads it: every later txn's revision exceeds it.
                        let info = rules::judge_key(Some(facts), delay_until, delay_ms, revision, now);
                        Ok(HeldKey { key: key.clone(), info })
                    })
                    .collect();
            }
            Err(contended("held_keys"))
        }
        .await;
        Ok(framed?
            .into_iter()
            .map(|h| HeldKey { info: KeyInfo { grant: h.info.grant.map(|g| self.wall_row(g)), ..h.info }, ..h })
            .collect())
    }

    async fn revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        expected_token: Option<i64>,
        revocation_id: Uuid,
    ) -> Result<Result<Revocation, RevokeRefusal>, StoreError> {
        let rkey = self.revocation_key(revocation_id);
        for _ in 0..CAS_ATTEMPTS_MAX {
            let now = self.now();
            let hint = self.holder_hint(key);
            let mut reads = vec![Read::Key(self.grant_key(key))];
            reads.extend(hint.map(|h| Read::Key(self.session_key(h))));
            let mut r = self.read(reads).await?.into_iter();
            let Some(g) = self.one::<GrantVal>(r.next())? else {
                return Ok(Err(RevokeRefusal::NotHeld));
            };
            let hinted = hint.map(|h| self.one::<SessionVal>(r.next()).map(|s| (h, s))).transpose()?;
            let known: Vec<_> = hinted.iter().map(|(h, hs)| (*h, hs.as_ref())).collect();
            let holder = self.holder(&g.val, &known).await?;
            let row = grant_row(key, &g);
            let facts = GrantFacts { grant: &row, holder_end_ms: holder.as_ref().map(|h| self::session_end(&h.val)) };
            if let Err(refusal) = rules::decide_revoke(Some(facts), expected_token, now) {
                return Ok(Err(refusal));
            }
            let audit = RevocationVal {
                key: key.to_owned(),
                operator: operator.to_owned(),
                reason: reason.to_owned(),
                revoked_token: g.token(),
                at_ms: now,
            };
            let mut ops = vec![
                // First op: its revision (the floor) is the txn's on both etcd and the simulator.
                TxnOp::put(rkey.clone(), encode(&audit)?, None),
                TxnOp::delete(g.key.clone(), None),
                TxnOp::get(rkey.clone(), None),
            ];
            // The floor is the txn's revision, filled into the event when read ("Events").
            let revoked = LockEventRecord::revoked(
                key,
                g.token(),
                (g.val.session_id, &g.val.owner_id),
                0,
                (revocation_id, operator, reason),
            );
            self.with_events(&mut ops, vec![(revoked, Some("newTokenFloor"))])?;
            if let Some(resps) = self.commit(vec![Cond::of(&g), Cond::Absent(rkey.clone())], ops).await? {
                let (floor, _) = revisions_of(&resps)?;
                self.saw_grant(key, None);
                return Ok(Ok(Revocation { revoked_token: g.token(), new_token_floor: floor, revocation_id }));
            }
        }
        Err(contended("revoke"))
    }

    async fn reap(&self, limit: i64, delay_ms: i64, retention_ms: i64) -> Result<ReapReport, StoreError> {
        let now = self.now();
        let limit = usize::try_from(limit.max(0)).unwrap_or(0);
        let mut report = ReapReport::default();
        let mut r = self.read(vec![Read::Prefix(self.sessions_prefix()), Read::Prefix(self.grants_prefix())]).await?;
        let grant_entries = r.pop().unwrap_or_default();
        let first_scan = !self.judge.scanned.swap(true, std::sync::atomic::Ordering::Relaxed);
        if first_scan && grant_entries.iter().any(|e| !self.judge.is_watched(&e.key, &e.value)) {
            // A grant this replica never watched: judged from now, a full TTL more ("Time").
            dlock_rt::probe::hit(dlock_rt::probe::Probe::JudgeExtendedAfterStart);
        }
        let mut grants = self.grants_of(grant_entries)?;
        let mut sessions = BTreeMap::new();
        for e in r.pop().unwrap_or_default() {
            let rec = self.judged::<SessionVal>(e)?;
            let id = rec.key.strip_prefix(&self.sessions_prefix()).and_then(|raw| Uuid::parse_str(raw).ok());
            let Some(id) = id else { return Err(StoreError::Corrupt(format!("etcd: bad session key {}", rec.key))) };
            sessions.insert(id, rec);
        }
        // The scan saw every session and grant: forget the watches of records gone.
        let present = sessions
            .values()
            .map(|s| (s.key.clone(), digest(&s.raw)))
            .chain(grants.iter().map(|g| (g.key.clone(), digest(&g.raw))))
            .collect();
        self.judge.retain_scanned(&[&self.sessions_prefix(), &self.grants_prefix()], &present);
        // 1. Lapsed sessions: mark them, removing their grants (all dead with them).
        let lapsed: Vec<Uuid> = sessions
            .iter()
            .filter(|(_, s)| rules::session_lapsed(s.val.expires_at_ms, s.val.expired_marked, now))
            .map(|(id, _)| *id)
            .take(limit)
            .collect();
        let mut gone = std::collections::BTreeSet::new();
        for id in lapsed {
            let Some(s) = sessions.get(&id).cloned() else { continue };
            let mine: Vec<&Rec<GrantVal>> = grants.iter().filter(|g| g.val.session_id == id).collect();
            let marked = SessionVal { expired_marked: true, prev: Some(digest(&s.raw)), ..s.val.clone() };
            let raw = encode(&marked)?;
            // The marked version's end, for retention, is the lapse this replica judged.
            self.judge.wrote(&s.key, &raw, s.val.expires_at_ms);
            let last = (Cond::of(&s), TxnOp::put(s.key.clone(), raw.clone(), None));
            let expired = vec![(LockEventRecord::session_expired(id, &s.val.owner_id), None)];
            let lost_at = |g: &GrantVal| death(g, Some(&s.val));
            if let Some(n) = self.remove_session_grants(&mine, lost_at, delay_ms, (last, expired)).await? {
                report.expired_sessions += 1;
                report.released_grants += n;
                gone.extend(mine.iter().map(|g| g.key.clone()));
                let updated =
                    Rec { key: s.key.clone(), raw, val: marked, create_rev: s.create_rev, mod_rev: s.mod_rev };
                sessions.insert(id, updated);
            }
        }
        grants.retain(|g| !gone.contains(&g.key));
        // 2. Grants whose own lease lapsed.
        let lapsed: Vec<&Rec<GrantVal>> =
            grants.iter().filter(|g| rules::lease_lapsed(g.val.expires_at_ms, now)).take(limit).collect();
        let keys: Vec<String> = lapsed.iter().map(|g| self.lock_key_of(&g.key).to_owned()).collect();
        let records = if delay_ms > 0 { self.key_records(&keys).await? } else { BTreeMap::new() };
        for (g, key) in lapsed.into_iter().zip(keys) {
            let died = death(&g.val, sessions.get(&g.val.session_id).map(|s| &s.val));
            let (mut conds, mut ops) = (Vec::new(), Vec::new());
            self.drop_ops(g, records.get(&key), died, delay_ms, (&mut conds, &mut ops))?;
            self.with_events(&mut ops, vec![grant_event(EventKind::LockExpired, &key, g)])?;
            if self.commit(conds, ops).await?.is_some() {
                report.released_grants += 1;
            }
        }
        // 3. Expired sessions past retention: forget them.
        let forgotten: Vec<&Rec<SessionVal>> = sessions
            .values()
            .filter(|s| rules::session_forgettable(s.val.expires_at_ms, s.val.expired_marked, retention_ms, now))
            .take(limit)
            .collect();
        for s in forgotten {
            if self.commit(vec![Cond::of(s)], vec![TxnOp::delete(s.key.clone(), None)]).await?.is_some() {
                report.forgotten_sessions += 1;
            }
        }
        Ok(report)
    }

    async fn read_events(&self, after: i64, limit: usize) -> Result<EventRead, StoreError> {
        let width = EVENTS_PER_TXN_MAX as i64;
        // Records of the txn holding seq `after` and later (a record holds at least one event).
        let min_rev = after.div_euclid(width) + EVENT_PUT_REV_AFTER_FIRST;
        let records_max = limit.saturating_add(1).min(EVENT_RECORDS_PER_READ_MAX);
        let (records, mark) = self.event_records((min_rev, None), false, records_max).await?;
        let purged_through = Self::purged_of(mark.as_deref())?.purged_through;
        let mut events = Vec::new();
        let mut last_seen = after;
        for e in &records {
            for ev in Self::events_of(e)? {
                last_seen = last_seen.max(ev.seq);
                if ev.seq > after && events.len() < limit {
                    events.push(ev);
                }
            }
        }
        // Every seq up to the last read is final (module doc, "Events"); a page cut short
        // ends at its last event.
        let head = match events.last() {
            Some(e) if events.len() == limit => e.seq,
            _ => last_seen,
        };
        Ok(EventRead { events, head: head.max(after), purged_through })
    }

    async fn purge_events(&self, keep: i64) -> Result<u64, StoreError> {
        // The newest record to delete: walk from the newest until `keep` events are kept.
        let mut kept = 0i64;
        let mut cut: Option<i64> = None;
        let mut below: Option<i64> = None;
        'walk: loop {
            let (records, _) = self.event_records((0, below), true, EVENT_RECORDS_PER_READ_MAX).await?;
            let Some(oldest) = records.last().map(|e| e.mod_rev) else { break };
            for e in &records {
                if kept >= keep.max(0) {
                    cut = Some(e.mod_rev);
                    break 'walk;
                }
                kept += Self::events_of(e)?.len() as i64;
            }
            below = Some(oldest - 1);
        }
        let Some(cut) = cut else { return Ok(0) };
        let mut deleted = 0u64;
        // Each committed txn deletes at least one record: the loop ends; only conflicts count.
        let mut conflicts = 0usize;
        while conflicts < CAS_ATTEMPTS_MAX {
            let (records, mark) = self.event_records((0, Some(cut)), false, EVENT_RECORDS_PER_PURGE_TXN_MAX).await?;
            if records.is_empty() {
                return Ok(deleted);
            }
            let old = Self::purged_of(mark.as_deref())?;
            let mut through = old.purged_through;
            let mut n = 0u64;
            let mut ops = Vec::new();
            for e in &records {
                let evs = Self::events_of(e)?;
                through = through.max(evs.iter().map(|ev| ev.seq).max().unwrap_or(0));
                n += evs.len() as u64;
                ops.push(TxnOp::delete(e.key.clone(), None));
            }
            let raw = encode(&PurgedVal { purged_through: through })?;
            ops.insert(0, TxnOp::put(self.purged_key(), raw, None));
            let mut conds: Vec<Cond> = records.iter().map(|e| Cond::Is(e.key.clone(), e.value.clone())).collect();
            conds.push(match mark {
                Some(m) => Cond::Is(self.purged_key(), m),
                None => Cond::Absent(self.purged_key()),
            });
            if self.commit(conds, ops).await?.is_some() {
                deleted += n;
            } else {
                conflicts += 1;
            }
        }
        Err(contended("purge"))
    }
}

#[cfg(test)]
mod write_error_tests {
    use super::*;

    #[test]
    fn an_etcd_write_error_is_commit_unknown_unless_etcd_proves_it_was_not_applied() {
        let unknown = write_error(etcd_client::Error::WatchError("connection reset by peer".into()));
        assert!(matches!(unknown, StoreError::CommitUnknown(_)), "{unknown:?}");
        let timed_out = write_error(etcd_client::Error::WatchError("etcdserver: request timed out".into()));
        assert!(matches!(timed_out, StoreError::CommitUnknown(_)), "{timed_out:?}");
        for proof in WRITE_NOT_APPLIED {
            let e = write_error(etcd_client::Error::WatchError(format!("status: {proof}")));
            assert!(matches!(e, StoreError::Unavailable(_)), "{proof}: {e:?}");
        }
        let refused = write_error(etcd_client::Error::InvalidArgs("empty key".into()));
        assert!(matches!(refused, StoreError::Unavailable(_)), "{refused:?}");
    }
}

#[cfg(all(test, not(madsim)))]
mod judge_tests {
    use super::*;

    fn grant_bytes(ttl_ms: i64, expires_at_ms: i64) -> Vec<u8> {
        let val = GrantVal {
            session_id: Uuid::nil(),
            owner_id: "w".into(),
            acquired_at_ms: 0,
            expires_at_ms,
            ttl_ms,
            nonce: dlock_rt::rand::uuid_v4(),
            prev: None,
            rotated: false,
            token: None,
        };
        serde_json::to_vec(&val).expect("encode")
    }

    /// A version is judged from when this replica first saw it, whatever instant its writer
    /// stored: a writer's wall clock a day ahead or behind changes nothing.
    #[test]
    fn a_grant_ends_its_ttl_after_this_replica_first_saw_it_whatever_its_writer_stored() {
        let judge = Judge::new(Clock::system());
        let day_ms = 86_400_000;
        for (i, stored) in [1_000 - day_ms, 1_000 + day_ms].into_iter().enumerate() {
            let (key, raw) = (format!("/p/g/k{i}"), grant_bytes(2_000, stored));
            let first = judge.seen_at(&key, &raw, 1_000);
            assert_eq!(judge.seen_at(&key, &raw, 2_500), first, "the same bytes keep their first sight");
            let mut val: GrantVal = serde_json::from_slice(&raw).expect("decode");
            val.judge(first);
            assert_eq!(val.expires_at_ms, 3_000, "stored {stored}: the lease runs from first sight");
        }
    }

    /// A new version (a renew, a heartbeat) is judged from its own first sight; a replica
    /// that never saw a version (one just started) judges it from now: it extends.
    #[test]
    fn a_new_version_and_a_version_never_seen_are_judged_from_now() {
        let judge = Judge::new(Clock::system());
        assert_eq!(judge.seen_at("/p/s/x", b"v1", 100), 100);
        assert_eq!(judge.seen_at("/p/s/x", b"v2", 800), 800, "a new version");
        let fresh = Judge::new(Clock::system());
        assert_eq!(fresh.seen_at("/p/s/x", b"v2", 1_100), 1_100, "a replica that never saw it");
        // A writer's note stands, and a concurrent writer's bytes (its guard failed) do not
        // hide the winner's.
        judge.wrote("/p/g/k", b"winner", 5);
        judge.wrote("/p/g/k", b"loser", 9);
        assert_eq!(judge.seen_at("/p/g/k", b"winner", 50), 5);
    }

    /// A session marked expired has ended on every replica, however late one first sees it;
    /// a lock-delay runs what was left of it when written, from first sight.
    #[test]
    fn a_marked_session_has_ended_and_a_delay_runs_its_time_left_from_first_sight() {
        let mut s =
            SessionVal { owner_id: "w".into(), ttl_ms: 3_000, expires_at_ms: 0, expired_marked: true, prev: None };
        s.judge(10_000);
        assert!(rules::session_check(Some(session_end(&s)), 10_000).is_err());
        let mut k = KeyVal::delayed(Some(5_000), 4_000, None);
        assert_eq!(k.delay_left_ms, Some(1_000));
        k.judge(20_000);
        assert_eq!(k.delay_until_ms, Some(21_000));
        let mut legacy = KeyVal { delay_until_ms: Some(7), delay_left_ms: None, prev: None };
        legacy.judge(20_000);
        assert_eq!(legacy.delay_until_ms, Some(20_000 + LEGACY_DELAY_LEFT_MS));
    }

    /// The frame is anchored at the wall clock once: an hour of skew shows in the answers'
    /// offset at the start only, and the frame never runs backwards.
    #[test]
    fn the_frame_is_anchored_once_and_never_runs_backwards() {
        let ahead = Judge::new(Clock::with_skew_ms(3_600_000));
        assert!(ahead.wall_offset().abs() <= 1);
        let (a, b) = (ahead.frame(), ahead.frame());
        assert!(b >= a);
    }

    /// The table is bounded: past `WATCHED_MAX` it forgets (every lease is then judged
    /// from its next sight, later), and a reaper scan keeps only present versions.
    #[test]
    fn the_watch_table_is_bounded_and_a_scan_keeps_only_the_present_versions() {
        let judge = Judge::new(Clock::system());
        for i in 0..=WATCHED_MAX {
            judge.wrote(&format!("/p/k/{i}"), b"x", 1);
        }
        assert!(judge.watched().len() <= WATCHED_MAX);
        judge.watched().clear();
        judge.wrote("/p/s/a", b"old", 1);
        judge.wrote("/p/s/a", b"new", 2);
        judge.wrote("/p/s/gone", b"x", 3);
        judge.wrote("/p/k/kept", b"x", 4);
        let present = BTreeMap::from([("/p/s/a".to_owned(), digest(b"new"))]);
        judge.retain_scanned(&["/p/s/", "/p/g/"], &present);
        let left: Vec<i64> = judge.watched().values().copied().collect();
        assert_eq!(left, vec![4, 2], "the key record outside the scan, and a's present version");
    }
}
