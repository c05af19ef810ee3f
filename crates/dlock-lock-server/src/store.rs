//! The lock server's store: the trait every backend implements, and its semantics.
//!
//! Every method is one atomic step against the backend (one transaction in SQL), and **no
//! wall clock decides a lease** (C1 §1.4.2, §1.5.4). On SQLite and PostgreSQL `now` below is
//! *lockdb's clock*: one value in the database, advanced only by durations the judging
//! replica measured on its monotonic clock ([`crate::lockdb_clock`]), read by the store in the
//! statement that decides, so every replica judges by the same clock and no wall clock (a
//! replica's or the database host's) moves it. On etcd, which has no clock, each replica
//! judges by durations on its own monotonic clock since it first saw each version of a
//! record (`store_etcd`, "Time"): `now` there is that replica's frame. The simulation store
//! keeps lockdb's clock as SQL does (`store_mem`). All instants are epoch
//! milliseconds on the store's clock; answers show them on the answering replica's wall
//! clock ([`WallShift`]), for humans only.

//! ## Definitions
//! Each definition below is one pure function of [`crate::rules`] (`session_check`,
//! `grant_dies_at`, `lock_delay_until` / `merge_delay`, `next_token`, `decide_acquire`, …);
//! every backend reads the facts, calls it, and applies the answer under its own
//! conditional write.
//! - A **session** is *live* iff it is not closed and `now < expires_at_ms`. A session that
//!   lapsed is *expired*; it is remembered (answering `SESSION_EXPIRED`) until the reaper
//!   forgets it after the retention period, after which it is *unknown*. A closed session
//!   (L3) is forgotten at once: it is *unknown*.
//! - A **grant** (the row of a key) is *live* iff `now < grant.expires_at_ms` and its
//!   session is live. A key has at most one grant row; a dead one may linger until the
//!   reaper or the next acquire removes it.
//! - A grant **dies** at `min(grant.expires_at_ms, session.expires_at_ms)`, or when the
//!   session is closed (L3) or the grant released (L6) or revoked (L8).
//! - **Lock-delay** (`delay_ms`): when a grant dies *without* being released (its lease or
//!   its session lapsed), nobody else may be granted the key before `died_at + delay_ms`.
//!   Release, close and revoke impose no delay.
//! - **Tokens**: every grant gets a token strictly greater than every token issued before
//!   by this backend and strictly greater than the token floor. The floor only rises
//!   (revoke raises it); it survives restarts and restores (it is stored, not derived).
//!
//! ## Invariants (the conformance suite proves them on every backend)
//! 1. At most one live grant per key, ever.
//! 2. Tokens in grant order strictly increase, across restarts and revokes.
//! 3. Acquire re-checks the session in the same atomic step that grants (a waiter whose
//!    session lapsed while it waited is never granted: Jepsen's etcd 3.4.3 lock bug).
//! 4. Release deletes exactly the grant `(key, token)` and nothing else.
//! 5. A grant committed but never reported (an ambiguous acquire) is still attached to its
//!    session and dies with it: there are no ghost grants.
//! 6. A rotate (release `(key, t₁)` + acquire by the same session, C3-extensions E-18) is
//!    one atomic step: either the live grant `(key, t₁)` of the caller's live session is
//!    replaced by a grant with a fresh token `t₂ > t₁`, or nothing changes. The key is never
//!    free in between, and the release imposes no lock-delay.

use std::sync::atomic::{AtomicI64, Ordering};

use async_trait::async_trait;
pub use dlock_contract::store::{ClassifiedStoreError, StoreFault};
pub use dlock_contract::stream::EventRead;
use dlock_rt::Clock;
use uuid::Uuid;

pub mod events;

/// How far the wall clock may part from the store's clock before a replica's answers
/// follow it ([`WallShift`]): within it, they keep one offset, so the instants of one grant
/// read the same in every answer and do not jitter by a millisecond.
pub const WALL_OFFSET_SLACK_MS: u64 = 1_000;

/// Shows a store's instants on the answering replica's wall clock, for humans: `expiresAt`,
/// `acquiredAt`, `serverTime`, `lockDelayUntil`. The offset (wall now minus store now) moves
/// only when the two part by more than [`WALL_OFFSET_SLACK_MS`]: after a wall-clock step, or
/// slow drift. Nothing reads a shown instant back to decide.
#[derive(Debug)]
pub struct WallShift {
    clock: Clock,
    /// The offset answers use now; [`WallShift::UNSET`] before the first.
    shown_ms: AtomicI64,
}

impl WallShift {
    const UNSET: i64 = i64::MIN;

    /// A shift onto `clock`'s wall clock, starting at `initial_ms` (`None`: from the first
    /// store reading).
    pub fn new(clock: Clock, initial_ms: Option<i64>) -> WallShift {
        WallShift { clock, shown_ms: AtomicI64::new(initial_ms.unwrap_or(Self::UNSET)) }
    }

    /// The offset from the store's clock, reading `store_now_ms` now, to this replica's wall
    /// clock.
    pub fn offset(&self, store_now_ms: i64) -> i64 {
        let now = self.clock.wall().timestamp_millis().saturating_sub(store_now_ms);
        let shown = self.shown_ms.load(Ordering::Relaxed);
        if shown != Self::UNSET && now.abs_diff(shown) <= WALL_OFFSET_SLACK_MS {
            return shown;
        }
        self.shown_ms.store(now, Ordering::Relaxed);
        now
    }

    /// The offset answers use now, as the last [`WallShift::offset`] left it (0 before any).
    pub fn current(&self) -> i64 {
        match self.shown_ms.load(Ordering::Relaxed) {
            Self::UNSET => 0,
            shown => shown,
        }
    }

    /// A grant row's instants shifted by `offset`.
    pub fn grant(g: GrantRow, offset: i64) -> GrantRow {
        GrantRow {
            acquired_at_ms: g.acquired_at_ms.saturating_add(offset),
            expires_at_ms: g.expires_at_ms.saturating_add(offset),
            ..g
        }
    }

    /// A session row's end shifted by `offset`.
    pub fn session(s: SessionRow, offset: i64) -> SessionRow {
        SessionRow { expires_at_ms: s.expires_at_ms.saturating_add(offset), ..s }
    }

    /// An acquire refusal's instants shifted by `offset`.
    pub fn acquire_refusal(r: AcquireRefusal, offset: i64) -> AcquireRefusal {
        match r {
            AcquireRefusal::Contended { holder_owner_id, expires_at_ms } => {
                AcquireRefusal::Contended { holder_owner_id, expires_at_ms: expires_at_ms.saturating_add(offset) }
            }
            AcquireRefusal::AlreadyHeld { fencing_token, expires_at_ms } => {
                AcquireRefusal::AlreadyHeld { fencing_token, expires_at_ms: expires_at_ms.saturating_add(offset) }
            }
            AcquireRefusal::Delayed { until_ms } => {
                AcquireRefusal::Delayed { until_ms: until_ms.saturating_add(offset) }
            }
            AcquireRefusal::Session(r) => AcquireRefusal::Session(r),
        }
    }

    /// A rotate refusal's instants shifted by `offset`.
    pub fn rotate_refusal(r: RotateRefusal, offset: i64) -> RotateRefusal {
        match r {
            RotateRefusal::Delayed { until_ms } => RotateRefusal::Delayed { until_ms: until_ms.saturating_add(offset) },
            other => other,
        }
    }
}

/// The backend could not decide: the one store error every store shares
/// ([`StoreFault`], C3-extensions C-29). Only `Unavailable` is answered `503 NOT_LEADER`
/// (nothing changed, the caller may retry); the others are `500 INTERNAL`.
pub use dlock_contract::store::StoreError;

/// Why a session-scoped call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionRefusal {
    /// Never existed, closed, or forgotten after retention (`404 SESSION_UNKNOWN`).
    Unknown,
    /// Lapsed and still remembered (`410 SESSION_EXPIRED`).
    Expired,
}

/// A session as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    pub session_id: Uuid,
    pub owner_id: String,
    pub ttl_ms: i64,
    pub expires_at_ms: i64,
}

/// A grant as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantRow {
    pub key: String,
    pub session_id: Uuid,
    pub owner_id: String,
    pub fencing_token: i64,
    pub acquired_at_ms: i64,
    pub expires_at_ms: i64,
}

/// Why an acquire did not grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireRefusal {
    Session(SessionRefusal),
    /// A live grant of another session holds the key (`409 LOCK_CONTENDED`).
    Contended {
        holder_owner_id: String,
        expires_at_ms: i64,
    },
    /// The session already holds this key: acquire is not re-entrant (`409 LOCK_CONTENDED`,
    /// holder = the caller). The caller renews instead.
    AlreadyHeld {
        fencing_token: i64,
        expires_at_ms: i64,
    },
    /// The previous grant was lost, not released; lock-delay runs until this instant
    /// (`409 LOCK_CONTENDED` with `details.lockDelayUntil`).
    Delayed {
        until_ms: i64,
    },
}

/// Why a renew did not extend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenewRefusal {
    Session(SessionRefusal),
    /// No live grant `(key, token)` of this session (`409 LOCK_LOST`). `stored_token` is the
    /// key's current grant token, live or dead, if a row exists.
    Lost {
        stored_token: Option<i64>,
    },
}

/// Why a rotate (C3-extensions E-18) did not replace the grant. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RotateRefusal {
    /// The caller's session cannot act (`404 SESSION_UNKNOWN`, `410 SESSION_EXPIRED`).
    Session(SessionRefusal),
    /// No live grant `(key, token)` of this session (`409 LOCK_LOST`); `stored_token` as
    /// for renew: the key's current grant token, live or dead, if a row exists.
    Lost { stored_token: Option<i64> },
    /// A lock-delay runs on the key (`409 LOCK_CONTENDED` with `details.lockDelayUntil`):
    /// the acquire half refuses, so the release half does not happen either.
    Delayed { until_ms: i64 },
}

/// The key's state for `GET /v1/locks/{key}` (advisory), judged by the store at one `now`
/// of its own clock ([`crate::rules::judge_key`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    /// The live grant, if any.
    pub grant: Option<GrantRow>,
    /// How long the live grant has left, by the store's own judgement (lockdb's clock on
    /// SQL, the judging replica's frame on etcd): never a difference of two processes' wall
    /// clocks. `Some` iff `grant` is.
    pub lease_left_ms: Option<i64>,
    /// How long a lock-delay on the key still runs, judged the same way (`None`: none runs).
    pub delay_left_ms: Option<i64>,
    /// Every token granted after this read exceeds this: the highest token issued or
    /// reserved by a revocation, deployment-wide (tokens are not per key).
    pub token_floor: i64,
}

/// One key of a page of held keys (C3-extensions E-23): a key with a stored grant, live or
/// dead and not yet removed, judged as [`LockStore::info`] judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldKey {
    pub key: String,
    pub info: KeyInfo,
}

/// A successful revoke (L8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    pub revoked_token: i64,
    /// Every later grant's token exceeds this.
    pub new_token_floor: i64,
    pub revocation_id: Uuid,
}

/// Why a revoke did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevokeRefusal {
    /// No live grant (`404`).
    NotHeld,
    /// `expected_token` is not the live grant's token (`409 FENCED_OUT`).
    Stale { current_token: i64 },
}

/// What a write addresses, for the owner check (C3-extensions E-9, "Owner binding"): a
/// session by its id, or a grant by `(key, token)`. Both owners are immutable: a session
/// keeps the owner it was opened for, a grant its session's, and neither id is ever reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addressed<'a> {
    Session(Uuid),
    Grant { key: &'a str, token: i64 },
}

/// What one reaper pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReapReport {
    /// Sessions newly marked expired (their grants removed, lock-delay recorded).
    pub expired_sessions: u64,
    /// Dead grants removed (of expired sessions, or whose own lease lapsed).
    pub released_grants: u64,
    /// Expired sessions forgotten after the retention period (now unknown).
    pub forgotten_sessions: u64,
}

/// The lock server's view of lockdb (or etcd).
#[async_trait]
pub trait LockStore: Send + Sync + 'static {
    /// Cheap round trip, for readiness.
    async fn ping(&self) -> Result<(), StoreError>;

    /// The clock the store's answers are on, epoch ms: the backend's (SQL), or the judging
    /// replica's frame shown on its wall clock (etcd). For relating answers' instants, and
    /// for humans.
    async fn now_ms(&self) -> Result<i64, StoreError>;

    /// Opens a session for `owner_id` with `ttl_ms` (already clamped by the caller):
    /// `expires_at = now + ttl_ms`.
    async fn open_session(&self, session_id: Uuid, owner_id: &str, ttl_ms: i64) -> Result<SessionRow, StoreError>;

    /// Extends a live session to `now + ttl_ms` and counts its live grants. The returned row's
    /// `expires_at_ms - ttl_ms` is the backend's `now` (the server reports it as `serverTime`).
    async fn heartbeat(&self, session_id: Uuid) -> Result<Result<(SessionRow, i64), SessionRefusal>, StoreError>;

    /// Closes a session and forgets it: later calls answer `Unknown`. A live session's grants
    /// are released (no lock-delay). An expired session's grants had already died when it
    /// lapsed, so their lock-delay (from that death) still applies.
    async fn close_session(&self, session_id: Uuid, delay_ms: i64) -> Result<Result<(), SessionRefusal>, StoreError>;

    /// Grants `key` to a live session for `ttl_ms` (clamped by the caller), with a fresh
    /// token, unless a live grant of another session holds it or lock-delay runs. A dead
    /// grant in the way is replaced. Session check and grant are one atomic step.
    async fn acquire(
        &self,
        key: &str,
        session_id: Uuid,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, AcquireRefusal>, StoreError>;

    /// Extends the live grant `(key, token)` of a live session to `now + ttl_ms`. The token
    /// never changes.
    async fn renew(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
    ) -> Result<Result<GrantRow, RenewRefusal>, StoreError>;

    /// Compare-and-delete of the live grant `(key, token)`; the session id is not part of
    /// the predicate (it is carried for attribution). `Err(stored_token)` when there is no
    /// such live grant: the key's current token, if a row exists.
    async fn release(&self, key: &str, token: i64) -> Result<Result<(), Option<i64>>, StoreError>;

    /// Rotate (C3-extensions E-18): in one atomic step, releases the live grant
    /// `(key, token)` of the live session `session_id` and grants `key` to that session
    /// again for `ttl_ms`, with a fresh token greater than `token` (and than every token
    /// issued before). [`crate::rules::decide_rotate`] decides; a refusal changes nothing.
    /// The session is checked in the same step; no lock-delay is imposed (a release).
    async fn rotate(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, RotateRefusal>, StoreError>;

    /// The stored owner of what `target` addresses: the session's owner (live, expired or
    /// remembered), or the owner of the key's grant row holding `token` (live or dead).
    /// `None` when nothing is stored. A read: it changes nothing.
    async fn owner_of(&self, target: Addressed<'_>) -> Result<Option<String>, StoreError>;

    /// The key's state; `None` if the key was never granted. `delay_ms` is the lock-delay a
    /// grant that died without release imposes ([`crate::rules::judge_key`]): a dead grant
    /// still stored shows the delay its removal will record.
    async fn info(&self, key: &str, delay_ms: i64) -> Result<Option<KeyInfo>, StoreError>;

    /// One page of the keys with a stored grant (live, or dead and not yet removed;
    /// C3-extensions E-23), in bytewise key order: at most `limit` keys that start with
    /// `prefix` (empty: any) and sort after `after`, the bounds of
    /// [`crate::rules::key_range`]. Each is judged as [`LockStore::info`] judges it
    /// ([`crate::rules::judge_key`], `delay_ms` as there), every key of the page on one read
    /// of the store: one statement (SQL), one lock (memory), one etcd revision. A read: it
    /// changes nothing.
    async fn held_keys(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        delay_ms: i64,
    ) -> Result<Vec<HeldKey>, StoreError>;

    /// Removes the live grant of `key` (if `expected_token` is given, only if it matches),
    /// raises the token floor to a freshly issued token, and records the audit row
    /// (operator, reason, time, revoked token, new floor).
    async fn revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        expected_token: Option<i64>,
        revocation_id: Uuid,
    ) -> Result<Result<Revocation, RevokeRefusal>, StoreError>;

    /// One reaper pass, at most `limit` rows of each kind: marks lapsed sessions expired and
    /// removes their grants (recording lock-delay), removes grants whose own lease lapsed,
    /// and forgets sessions expired more than `retention_ms` ago. Idempotent, and safe to
    /// run concurrently from several replicas.
    async fn reap(&self, limit: i64, delay_ms: i64, retention_ms: i64) -> Result<ReapReport, StoreError>;

    /// The event outbox (C3-extensions E-20): the final events after `after`, at most `limit`.
    /// Each operation above records its events ([`events`]) in its own atomic step.
    async fn read_events(&self, after: i64, limit: usize) -> Result<EventRead, StoreError>;

    /// The retention purge: keeps the newest `keep` events; returns how many it deleted.
    async fn purge_events(&self, keep: i64) -> Result<u64, StoreError>;

    /// Whether this replica advances lockdb's clock now (C1 §1.4.2: PostgreSQL and SQLite),
    /// for `lock_clock_judge`. Always false on etcd and the simulation store, which have no
    /// judge.
    fn judges_clock(&self) -> bool {
        false
    }

    /// The SQL pool's connections now, for `dlock_db_pool_connections` (`None`: no pool).
    fn pool_stats(&self) -> Option<dlock_http::metrics::PoolStats> {
        None
    }

    /// The thread this store's write transactions run on (`dlock_rt::dedicated`; SQLite's
    /// one writer connection, docs/performance.md "The SQLite writer thread"), `None`: on
    /// the caller's task.
    fn writer_thread(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        None
    }
}
