//! The lock server's service layer: what is per replica around the atomic store calls.
//!
//! - **Waiters** (`waitMillis`): a fair FIFO queue per key, capped at
//!   `lock.waiters-max`; beyond the cap the answer is `CONTENTION_EXCEEDED`. Only the head of
//!   a queue asks the store, and a request with `waitMillis = 0` does not barge past a
//!   non-empty queue. The head is woken when this replica releases (or revokes) the key, and
//!   when the head before it left without the key; it polls the store every
//!   `lock.wait.poll-ms` for what other replicas and lease expiry do. Only the head is woken
//!   (each waiter has its own wake-up), and a head that leaves *with* the key wakes nobody:
//!   the key is held again, so the next head could only be refused (issue 14: every
//!   hand-off used to cost one refused store acquire and a wake-up of every waiter).
//!   Fairness is per replica; across replicas, heads race at the store, which stays the
//!   only judge.
//! - **Reaper**: one pass every `lock.reaper.interval-ms`, bounded by
//!   `lock.reaper.batch-max`; safe to run on every replica at once.
//! - **Metrics and logs** for acquire outcomes, contention, waiter depth and queues, session
//!   expiry, revokes, the latency of every store call (`lock_store_op_seconds{op}`) and the
//!   SQL pool (`dlock_db_pool_connections{state}`), on the replica's own recorder.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use dlock_http::metrics::{
    Counter, Gauge, LabeledCounter, OffWriterWrites, PoolGauges, Registry, TaggedHistogram, HOP_BUCKETS_SECONDS,
};
use dlock_rt::{Clock, Duration};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::rules::{ends_the_wait, on_arrival, queue_has_room, Arrival};
use crate::store::{AcquireRefusal, Addressed, GrantRow, LockStore, RotateRefusal, StoreError};
use crate::store_timed::{LockStoreOp, TimedLockStore};

/// Default `lock.session.ttl-ms` (C3 L1 "default lock.session.ttl").
pub const SESSION_TTL_MS_DEFAULT: i64 = 10_000;
/// Default `lock.default.ttl-ms` (C3 L4 "default lock.default.ttl").
pub const LOCK_TTL_MS_DEFAULT: i64 = 10_000;
/// Default `lock.waiters-max`: waiters per key on one replica.
pub const WAITERS_PER_KEY_MAX_DEFAULT: usize = 64;
/// Default `lock.session.retention-ms`: how long a lapsed session answers SESSION_EXPIRED
/// before it is forgotten (SESSION_UNKNOWN).
pub const SESSION_RETENTION_MS_DEFAULT: i64 = 3_600_000;
/// Default `lock.reaper.interval-ms`.
pub const REAP_INTERVAL_MS_DEFAULT: u64 = 500;
/// Default `lock.reaper.batch-max`: rows of each kind one reaper pass handles.
pub const REAP_BATCH_MAX_DEFAULT: i64 = 1_000;
/// Default `lock.wait.poll-ms`: how often a waiting head re-asks the store.
pub const WAIT_POLL_MS_DEFAULT: u64 = 100;
/// Owners of sessions, and of grants, this replica remembers for the owner check (each kind;
/// past it that kind is forgotten and read again from the store as needed). Owners never
/// change (`store::Addressed`), so what is remembered is never stale.
pub const OWNERS_REMEMBERED_MAX: usize = 65_536;
/// `retryAfterMillis` on NOT_LEADER.
pub const NOT_LEADER_RETRY_AFTER_MS: u64 = 1_000;
/// `retryAfterMillis` on CONTENTION_EXCEEDED.
pub const CONTENTION_RETRY_AFTER_MS: u64 = 1_000;

/// The lock server's settings (C5 keys `lock.*`).
#[derive(Debug, Clone)]
pub struct LockServerConfig {
    pub session_ttl_ms_default: i64,
    pub lock_ttl_ms_default: i64,
    pub delay_ms: i64,
    pub waiters_per_key_max: usize,
    pub session_retention_ms: i64,
    pub reap_interval_ms: u64,
    pub reap_batch_max: i64,
    pub wait_poll_ms: u64,
    /// `lock.grants.signing-key-file`: the key every grant is signed with (C3-extensions
    /// E-14). `None`: grants carry no signature, and resources that verify refuse them.
    pub signer: Option<dlock_contract::grant::GrantSigner>,
    /// `auth.*` (C3-extensions E-13).
    pub auth: dlock_http::auth::AuthSettings,
    /// lockdb's events kept by the reaper's purge (`lock.events.retention-events`;
    /// C3-extensions E-20).
    pub event_retention_events: i64,
    /// Least pause between two of those purges (`lock.events.purge-interval-ms`), ms.
    pub event_purge_interval_ms: u64,
}

impl Default for LockServerConfig {
    fn default() -> Self {
        LockServerConfig {
            session_ttl_ms_default: SESSION_TTL_MS_DEFAULT,
            lock_ttl_ms_default: LOCK_TTL_MS_DEFAULT,
            delay_ms: 0,
            waiters_per_key_max: WAITERS_PER_KEY_MAX_DEFAULT,
            session_retention_ms: SESSION_RETENTION_MS_DEFAULT,
            reap_interval_ms: REAP_INTERVAL_MS_DEFAULT,
            reap_batch_max: REAP_BATCH_MAX_DEFAULT,
            wait_poll_ms: WAIT_POLL_MS_DEFAULT,
            signer: None,
            auth: dlock_http::auth::AuthSettings::disabled(),
            event_retention_events: dlock_contract::stream::EVENT_RETENTION_EVENTS_DEFAULT,
            event_purge_interval_ms: EVENT_PURGE_INTERVAL_MS,
        }
    }
}

/// Default `lock.events.purge-interval-ms`: least pause between two retention purges of
/// lockdb's events (C3-extensions E-20), ms.
pub const EVENT_PURGE_INTERVAL_MS: u64 = 60_000;

/// The context of the event cursor key derived from the grant signing key.
const EVENT_CURSOR_KEY_CONTEXT: &[u8] = b"dlock/lock-server/event-cursor-key/v1\0";

/// lockdb's outbox, read through the store, as the event hub reads it.
struct StoreEvents(Arc<dyn LockStore>);

#[async_trait::async_trait]
impl dlock_http::stream::EventSource for StoreEvents {
    async fn read_events(
        &self,
        after: i64,
        upto: Option<i64>,
        limit: usize,
    ) -> Result<dlock_contract::stream::EventRead, StoreError> {
        let read = self.0.read_events(after, limit).await?;
        Ok(match upto {
            Some(upto) => read.clipped(after, upto, limit),
            None => read,
        })
    }
}

/// Values of `lock_acquire_total{outcome}`.
pub const ACQUIRE_OUTCOMES: [&str; 7] =
    ["granted", "contended", "delayed", "exceeded", "session_unknown", "session_expired", "not_leader"];

/// `lock_store_op_seconds`: every store call of this replica (buckets 0.5 ms .. 10 s).
pub const STORE_OP_SECONDS: &str = "lock_store_op_seconds";

/// The lock server's metrics (C4, issue 13), on this replica's own recorder.
#[derive(Debug)]
pub struct LockMetrics {
    registry: Registry,
    pub acquire: LabeledCounter<7>,
    pub waiters: Gauge,
    /// Keys with a non-empty waiter queue on this replica (set at each scrape).
    pub waiter_queues: Gauge,
    pub sessions_expired: Counter,
    pub grants_reaped: Counter,
    pub revokes: Counter,
    pub releases: LabeledCounter<2>,
    pub store_ops: Arc<TaggedHistogram<LockStoreOp>>,
    pub store_writes_off_writer: Arc<OffWriterWrites>,
    pub pool: PoolGauges,
    /// 1 while this replica advances lockdb's clock (set at each scrape).
    pub clock_judge: Gauge,
}

impl Default for LockMetrics {
    fn default() -> Self {
        let registry = Registry::new(&[(STORE_OP_SECONDS, &HOP_BUCKETS_SECONDS)]);
        let r = &registry;
        LockMetrics {
            acquire: LabeledCounter::new(
                r,
                "lock_acquire_total",
                "Acquire requests by outcome.",
                "outcome",
                ACQUIRE_OUTCOMES,
            ),
            waiters: Gauge::new(r, "lock_waiters", "Requests waiting in this replica's per-key FIFO queues."),
            waiter_queues: Gauge::new(r, "lock_waiter_queues", "Keys with at least one waiter queued on this replica."),
            sessions_expired: Counter::new(
                r,
                "lock_session_expired_total",
                "Sessions whose heartbeat lapsed, processed by this replica's reaper.",
            ),
            grants_reaped: Counter::new(r, "lock_grant_reaped_total", "Dead grants removed by this replica's reaper."),
            revokes: Counter::new(r, "lock_revoke_total", "Operator revocations (each also raised the token floor)."),
            releases: LabeledCounter::new(
                r,
                "lock_release_total",
                "Release requests by outcome.",
                "outcome",
                ["released", "lost"],
            ),
            store_ops: Arc::new(TaggedHistogram::new(
                r,
                STORE_OP_SECONDS,
                "Lock store calls of this replica by operation (the LockStore method), seconds.",
            )),
            store_writes_off_writer: Arc::new(OffWriterWrites::new(r, "lock_store_writes_off_writer_total")),
            pool: PoolGauges::new(r),
            clock_judge: Gauge::new(
                r,
                "lock_clock_judge",
                "1 while this replica advances lockdb's clock (PostgreSQL, SQLite), else 0.",
            ),
            registry,
        }
    }
}

impl LockMetrics {
    pub fn acquire_outcome(&self, outcome: &str) {
        if let Some(i) = ACQUIRE_OUTCOMES.iter().position(|o| *o == outcome) {
            self.acquire.inc(i);
        }
    }

    /// The families in `only` (every family when empty).
    pub fn render(&self, only: &[String]) -> String {
        self.registry.render_families(only)
    }
}

/// One key's waiters on this replica, in arrival order, each with its own wake-up.
#[derive(Debug, Default)]
struct Queue {
    waiters: VecDeque<(u64, Arc<Notify>)>,
}

impl Queue {
    fn head(&self) -> Option<u64> {
        self.waiters.front().map(|(id, _)| *id)
    }

    /// Wakes the head (a wake-up sent while it is not waiting is kept for its next wait).
    fn wake_head(&self) {
        if let Some((_, notify)) = self.waiters.front() {
            notify.notify_one();
        }
    }
}

/// A store write's answer: the rule's outcome, or its refusal, or the store's error.
type StoreAnswer<T, R> = Result<Result<T, R>, StoreError>;

/// What an acquire came to at the service level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    Granted(GrantRow),
    Refused(AcquireRefusal),
    /// The key's waiter queue on this replica is full.
    QueueFull,
}

/// One replica of the lock server.
pub struct LockServer {
    pub store: Arc<dyn LockStore>,
    pub cfg: LockServerConfig,
    pub clock: Clock,
    pub metrics: LockMetrics,
    queues: Mutex<BTreeMap<String, Queue>>,
    next_waiter: std::sync::atomic::AtomicU64,
    /// Stored owners this replica read or made, for [`LockServer::may_address`].
    owners: Mutex<Owners>,
    /// lockdb's event stream as this replica serves it (C3-extensions E-20).
    pub events: Arc<dlock_http::stream::EventHub>,
}

/// Stored owners of sessions and grants `(key, token)`, each map bounded by
/// [`OWNERS_REMEMBERED_MAX`]. Filled only for callers bound to owner ids: an unbound caller
/// is never checked, so it costs nothing.
#[derive(Debug, Default)]
struct Owners {
    sessions: BTreeMap<Uuid, String>,
    grants: BTreeMap<(String, i64), String>,
}

impl Owners {
    fn get(&self, target: &Addressed<'_>) -> Option<String> {
        match *target {
            Addressed::Session(id) => self.sessions.get(&id).cloned(),
            Addressed::Grant { key, token } => self.grants.get(&(key.to_owned(), token)).cloned(),
        }
    }

    fn put(&mut self, target: &Addressed<'_>, owner: &str) {
        fn bounded<K: Ord>(map: &mut BTreeMap<K, String>, k: K, owner: &str) {
            if map.len() >= OWNERS_REMEMBERED_MAX {
                map.clear();
            }
            map.insert(k, owner.to_owned());
        }
        match *target {
            Addressed::Session(id) => bounded(&mut self.sessions, id, owner),
            Addressed::Grant { key, token } => bounded(&mut self.grants, (key.to_owned(), token), owner),
        }
        assert!(self.sessions.len() <= OWNERS_REMEMBERED_MAX && self.grants.len() <= OWNERS_REMEMBERED_MAX);
    }
}

/// Removes a waiter from its queue however the wait ends (grant, timeout, or the caller
/// going away mid-wait), and wakes the next one unless this one leaves with the key.
struct WaiterGuard<'a> {
    server: &'a LockServer,
    key: String,
    id: u64,
    granted: bool,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        self.server.leave_queue(&self.key, self.id, self.granted);
    }
}

impl LockServer {
    /// Runs one of the store's write transactions (`work`, given the store) on the store's
    /// writer thread when it has one (SQLite,
    /// docs/performance.md "The SQLite writer thread"), else on this task. Either way it
    /// runs to its end.
    pub async fn write<T, W>(&self, work: impl FnOnce(Arc<dyn LockStore>) -> W) -> T
    where
        W: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        dlock_rt::dedicated::run_on(self.store.writer_thread(), work(self.store.clone())).await
    }

    /// The store's acquire of `key` for `session_id`, on its writer ([`Self::write`]).
    async fn store_acquire(&self, key: &str, session: Uuid, ttl_ms: i64) -> StoreAnswer<GrantRow, AcquireRefusal> {
        let (key, delay_ms) = (key.to_owned(), self.cfg.delay_ms);
        self.write(move |store| async move { store.acquire(&key, session, ttl_ms, delay_ms).await }).await
    }

    /// A replica over `store`; every call it makes to `store` is timed
    /// (`lock_store_op_seconds`, [`TimedLockStore`]). In a real process with a trace file
    /// (an event sink installed), every call is also told to the seam
    /// ([`crate::store_observed::EventObserver`]): the evidence a real run's lock-call
    /// checker judges. The simulation observes its replicas' stores itself.
    pub fn new(store: Arc<dyn LockStore>, cfg: LockServerConfig, clock: Clock) -> Arc<LockServer> {
        let metrics = LockMetrics::default();
        #[cfg(not(madsim))]
        let store: Arc<dyn LockStore> = if dlock_rt::events::enabled() {
            let slot = Arc::new(crate::store_observed::CallSlot::default());
            slot.set_observer(Arc::new(crate::store_observed::EventObserver::new(crate::NODE)));
            Arc::new(crate::store_observed::ObservedLockStore { inner: store, slot })
        } else {
            store
        };
        let store: Arc<dyn LockStore> = Arc::new(TimedLockStore {
            inner: store,
            ops: metrics.store_ops.clone(),
            off_writer: metrics.store_writes_off_writer.clone(),
            clock,
        });
        // The cursor key: derived from the grant signing key, which every replica of a
        // deployment shares (a cursor then resumes on any replica, after any restart);
        // without one, this process's own (a cursor resumes only here).
        let key = match &cfg.signer {
            Some(signer) => signer.derived_secret(EVENT_CURSOR_KEY_CONTEXT),
            None => {
                let mut k = [0u8; 32];
                for chunk in k.chunks_mut(8) {
                    chunk.copy_from_slice(&dlock_rt::rand::random_u64().to_le_bytes());
                }
                k
            }
        };
        let events = dlock_http::stream::EventHub::new(
            crate::store::events::STREAM,
            crate::NODE,
            Arc::new(StoreEvents(store.clone())),
            key,
            |k| k.is_lock(),
            clock,
        );
        Arc::new(LockServer {
            store,
            cfg,
            clock,
            metrics,
            queues: Mutex::new(BTreeMap::new()),
            next_waiter: std::sync::atomic::AtomicU64::new(1),
            owners: Mutex::default(),
            events,
        })
    }

    /// The `X-Fencing-Signature` of a grant (key, token, owner), if this server signs.
    pub fn sign(&self, g: &GrantRow) -> Option<String> {
        self.cfg.signer.as_ref().map(|s| s.sign(&g.key, g.fencing_token, &g.owner_id))
    }

    /// The `/metrics` text of the families in `only` (every family when empty): the gauges
    /// read at scrape time (waiter queues, the store's pool) are set first.
    pub fn render_metrics(&self, only: &[String]) -> String {
        let queues = self.queues.lock().map(|q| q.values().filter(|q| !q.waiters.is_empty()).count()).unwrap_or(0);
        self.metrics.waiter_queues.set(i64::try_from(queues).unwrap_or(i64::MAX));
        self.metrics.pool.set(self.store.pool_stats());
        self.metrics.clock_judge.set(i64::from(self.store.judges_clock()));
        self.metrics.render(only)
    }

    /// The owner check (C3-extensions E-9, "Owner binding"), decided before anything
    /// changes: whether a caller bound to `owners` (`None`: unbound, never checked and never
    /// read for) may address every one of `targets` ([`crate::rules::may_address`] of each
    /// stored owner). A stored owner is read from the store once and then remembered.
    pub async fn may_address(
        &self,
        owners: Option<&std::collections::BTreeSet<String>>,
        targets: &[Addressed<'_>],
    ) -> Result<bool, StoreError> {
        // Planted bug `skip-owner-check` (simulation only): every caller may address anything.
        if owners.is_none() || dlock_contract::planted::on(dlock_contract::planted::Bug::SkipOwnerCheck) {
            return Ok(true);
        }
        for target in targets {
            let remembered = self.owners.lock().ok().and_then(|o| o.get(target));
            let stored = match remembered {
                Some(o) => Some(o),
                None => {
                    let read = self.store.owner_of(*target).await?;
                    if let Some(o) = &read {
                        self.remember_owner(owners, *target, o);
                    }
                    read
                }
            };
            if !crate::rules::may_address(owners, stored.as_deref()) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Remembers that `target` is stored for `owner`, for a caller bound to `owners`
    /// (an unbound caller is never checked: nothing to remember).
    pub fn remember_owner(
        &self,
        owners: Option<&std::collections::BTreeSet<String>>,
        target: Addressed<'_>,
        owner: &str,
    ) {
        if owners.is_some() {
            if let Ok(mut o) = self.owners.lock() {
                o.put(&target, owner);
            }
        }
    }

    /// Forgets the owner of grant `(key, token)`: it was released or replaced.
    pub fn forget_grant_owner(&self, key: &str, token: i64) {
        if let Ok(mut o) = self.owners.lock() {
            if !o.grants.is_empty() {
                o.grants.remove(&(key.to_owned(), token));
            }
        }
    }

    /// Waiters queued for `key` on this replica (advisory, for L7).
    pub fn waiter_count(&self, key: &str) -> i64 {
        self.queues.lock().map(|q| q.get(key).map_or(0, |q| q.waiters.len() as i64)).unwrap_or(0)
    }

    /// Wakes the head waiter of `key` (after this replica released or revoked it).
    pub fn wake(&self, key: &str) {
        if let Ok(q) = self.queues.lock() {
            if let Some(q) = q.get(key) {
                q.wake_head();
            }
        }
    }

    fn join_queue(&self, key: &str) -> Option<(u64, Arc<Notify>)> {
        let mut queues = self.queues.lock().ok()?;
        let q = queues.entry(key.to_owned()).or_default();
        if !queue_has_room(q.waiters.len(), self.cfg.waiters_per_key_max) {
            return None;
        }
        let id = self.next_waiter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        q.waiters.push_back((id, notify.clone()));
        self.metrics.waiters.add(1);
        Some((id, notify))
    }

    /// Takes waiter `id` out of `key`'s queue. Unless it leaves with the key (`granted`),
    /// the new head is woken: the key may be free (the leaver timed out, failed, or went
    /// away). A head that leaves with the key wakes nobody: the next release does.
    fn leave_queue(&self, key: &str, id: u64, granted: bool) {
        let Ok(mut queues) = self.queues.lock() else { return };
        let mut empty = false;
        if let Some(q) = queues.get_mut(key) {
            if let Some(pos) = q.waiters.iter().position(|(x, _)| *x == id) {
                q.waiters.remove(pos);
                self.metrics.waiters.add(-1);
            }
            if !granted {
                q.wake_head();
            }
            empty = q.waiters.is_empty();
        }
        if empty {
            queues.remove(key);
        }
    }

    fn is_head(&self, key: &str, id: u64) -> bool {
        self.queues.lock().map(|q| q.get(key).and_then(Queue::head) == Some(id)).unwrap_or(false)
    }

    fn queue_is_empty(&self, key: &str) -> bool {
        self.queues.lock().map(|q| q.get(key).is_none_or(|q| q.waiters.is_empty())).unwrap_or(true)
    }

    /// L4: acquire `key` for `session_id`, waiting up to `wait_ms` in the FIFO queue.
    pub async fn acquire(
        &self,
        key: &str,
        session_id: Uuid,
        ttl_ms: i64,
        wait_ms: i64,
    ) -> Result<AcquireOutcome, StoreError> {
        let outcome = self.acquire_inner(key, session_id, ttl_ms, wait_ms).await;
        if let Ok(AcquireOutcome::Granted(g)) = &outcome {
            dlock_rt::events::emit(crate::NODE, "grant", || {
                [
                    ("key", g.key.clone().into()),
                    ("token", g.fencing_token.into()),
                    ("session", g.session_id.to_string().into()),
                    ("owner", g.owner_id.clone().into()),
                    ("expires_at_ms", g.expires_at_ms.into()),
                    ("store_ms", g.acquired_at_ms.into()),
                ]
            });
        }
        let tag = match &outcome {
            Ok(AcquireOutcome::Granted(_)) => "granted",
            Ok(AcquireOutcome::Refused(AcquireRefusal::Contended { .. } | AcquireRefusal::AlreadyHeld { .. })) => {
                "contended"
            }
            Ok(AcquireOutcome::Refused(AcquireRefusal::Delayed { .. })) => "delayed",
            Ok(AcquireOutcome::Refused(AcquireRefusal::Session(crate::store::SessionRefusal::Unknown))) => {
                "session_unknown"
            }
            Ok(AcquireOutcome::Refused(AcquireRefusal::Session(crate::store::SessionRefusal::Expired))) => {
                "session_expired"
            }
            Ok(AcquireOutcome::QueueFull) => "exceeded",
            Err(_) => "not_leader",
        };
        self.metrics.acquire_outcome(tag);
        outcome
    }

    async fn acquire_inner(
        &self,
        key: &str,
        session_id: Uuid,
        ttl_ms: i64,
        wait_ms: i64,
    ) -> Result<AcquireOutcome, StoreError> {
        // The refusal to answer if the wait ends without a grant: the latest the store gave.
        let mut last = None;
        match on_arrival(self.queue_is_empty(key), wait_ms) {
            Arrival::AskStore => match self.store_acquire(key, session_id, ttl_ms).await? {
                Ok(g) => return Ok(AcquireOutcome::Granted(g)),
                Err(r) if wait_ms <= 0 || ends_the_wait(&r) => return Ok(AcquireOutcome::Refused(r)),
                Err(r) => last = Some(r),
            },
            // A queue is waiting: a no-wait request does not barge past it.
            Arrival::RefuseNoBarge => return Ok(AcquireOutcome::Refused(self.contended_now(key).await?)),
            Arrival::Join => {}
        }

        let Some((id, notify)) = self.join_queue(key) else { return Ok(AcquireOutcome::QueueFull) };
        let mut guard = WaiterGuard { server: self, key: key.to_owned(), id, granted: false };
        let deadline = self.clock.now() + Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0));
        let poll = Duration::from_millis(self.cfg.wait_poll_ms.max(1));
        loop {
            // Register for the wake-up before asking the store, so a release between the
            // store's answer and the wait is not missed.
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_head(key, id) {
                match self.store_acquire(key, session_id, ttl_ms).await? {
                    Ok(g) => {
                        // Granted from the queue: this waiter waited, and leaves with the key.
                        dlock_rt::probe::hit(dlock_rt::probe::Probe::WaiterGrantedAfterWait);
                        guard.granted = true;
                        return Ok(AcquireOutcome::Granted(g));
                    }
                    // The session is re-checked at grant time: a waiter whose session lapsed
                    // while it waited is never granted.
                    Err(r) if ends_the_wait(&r) => return Ok(AcquireOutcome::Refused(r)),
                    Err(r) => last = Some(r),
                }
            }
            let now = self.clock.now();
            if now >= deadline {
                let refusal = match last {
                    Some(r) => r,
                    // Never at the head: ask the store once, now, what holds the key.
                    None => self.contended_now(key).await?,
                };
                return Ok(AcquireOutcome::Refused(refusal));
            }
            let _ = dlock_rt::timeout(poll.min(deadline - now), notified).await;
        }
    }

    /// Rotate (C3-extensions E-18): the store's one atomic release + acquire of `key` by
    /// `session_id`, presenting `token`. The key is never free in between, so no waiter of
    /// this replica could have been granted it: nobody is woken (renew does the same). Emits
    /// the `release` and the `grant` events a release and an acquire would.
    pub async fn rotate(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
    ) -> Result<Result<GrantRow, RotateRefusal>, StoreError> {
        let (owned_key, delay_ms) = (key.to_owned(), self.cfg.delay_ms);
        let rotate = move |store: Arc<dyn LockStore>| async move {
            store.rotate(&owned_key, session_id, token, ttl_ms, delay_ms).await
        };
        let outcome = self.write(rotate).await?;
        if let Ok(g) = &outcome {
            assert!(g.fencing_token > token, "rotate issued token {} over {token}", g.fencing_token);
            dlock_rt::events::emit(crate::NODE, "release", || {
                [("key", g.key.clone().into()), ("token", token.into()), ("store_ms", g.acquired_at_ms.into())]
            });
            dlock_rt::events::emit(crate::NODE, "grant", || {
                [
                    ("key", g.key.clone().into()),
                    ("token", g.fencing_token.into()),
                    ("session", g.session_id.to_string().into()),
                    ("owner", g.owner_id.clone().into()),
                    ("expires_at_ms", g.expires_at_ms.into()),
                    ("store_ms", g.acquired_at_ms.into()),
                ]
            });
        }
        Ok(outcome)
    }

    /// The refusal a contended key gives right now (for callers that did not ask the store).
    async fn contended_now(&self, key: &str) -> Result<AcquireRefusal, StoreError> {
        let info = self.store.info(key, self.cfg.delay_ms).await?;
        Ok(match info.and_then(|i| i.grant) {
            Some(g) => AcquireRefusal::Contended { holder_owner_id: g.owner_id, expires_at_ms: g.expires_at_ms },
            None => AcquireRefusal::Contended { holder_owner_id: String::new(), expires_at_ms: 0 },
        })
    }

    /// One reaper pass; logs and counts what it did.
    pub async fn reap_once(&self) -> Result<crate::store::ReapReport, StoreError> {
        let (limit, delay_ms, retention_ms) =
            (self.cfg.reap_batch_max, self.cfg.delay_ms, self.cfg.session_retention_ms);
        let r = self.write(move |store| async move { store.reap(limit, delay_ms, retention_ms).await }).await?;
        if r.expired_sessions > 0 || r.released_grants > 0 || r.forgotten_sessions > 0 {
            tracing::info!(
                expiredSessions = r.expired_sessions,
                releasedGrants = r.released_grants,
                forgottenSessions = r.forgotten_sessions,
                "lock_reaper_pass"
            );
        }
        for _ in 0..r.expired_sessions {
            self.metrics.sessions_expired.inc();
        }
        for _ in 0..r.released_grants {
            self.metrics.grants_reaped.inc();
        }
        Ok(r)
    }

    /// Runs the reaper until the task is dropped.
    pub async fn run_reaper(self: Arc<Self>) {
        let interval = Duration::from_millis(self.cfg.reap_interval_ms.max(1));
        let mut purged_at = self.clock.now();
        loop {
            if let Err(e) = self.reap_once().await {
                tracing::warn!(cause = %e, "lock_reaper_failed");
            }
            // The events' retention purge, at most every `lock.events.purge-interval-ms` (a
            // purge counts the outbox: far less often than the reaper's own pass).
            if purged_at.elapsed() >= Duration::from_millis(self.cfg.event_purge_interval_ms) {
                purged_at = self.clock.now();
                let keep = self.cfg.event_retention_events;
                match self.write(move |store| async move { store.purge_events(keep).await }).await {
                    Ok(0) => {}
                    Ok(deleted) => tracing::info!(deleted, "event_purge_pass"),
                    Err(e) => tracing::warn!(cause = %e, "event_purge_failed"),
                }
            }
            dlock_rt::sleep(interval).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    fn server() -> Arc<LockServer> {
        let store = Arc::new(crate::store_mem::MemLockStore::new(Clock::system()));
        LockServer::new(store, LockServerConfig::default(), Clock::system())
    }

    /// Whether `notify` holds a wake-up (taking it).
    fn woken(notify: &Notify) -> bool {
        notify.notified().now_or_never().is_some()
    }

    /// The stored owners a replica remembers for the owner check stay within their bound
    /// (past it, that kind is forgotten and read again), and an unbound caller makes it
    /// remember nothing.
    #[test]
    fn remembered_owners_are_bounded_and_an_unbound_caller_adds_none() {
        let s = server();
        s.remember_owner(None, Addressed::Session(Uuid::from_u128(1)), "w");
        assert!(s.owners.lock().expect("owners").sessions.is_empty(), "an unbound caller is never checked");
        let bound = std::collections::BTreeSet::from(["w".to_owned()]);
        for i in 0..=OWNERS_REMEMBERED_MAX as u128 {
            s.remember_owner(Some(&bound), Addressed::Session(Uuid::from_u128(i)), "w");
            s.remember_owner(Some(&bound), Addressed::Grant { key: "k", token: i as i64 }, "w");
        }
        let o = s.owners.lock().expect("owners");
        assert!(o.sessions.len() <= OWNERS_REMEMBERED_MAX && o.grants.len() <= OWNERS_REMEMBERED_MAX);
        assert_eq!(o.get(&Addressed::Grant { key: "k", token: OWNERS_REMEMBERED_MAX as i64 }), Some("w".to_owned()));
        drop(o);
        s.forget_grant_owner("k", OWNERS_REMEMBERED_MAX as i64);
        assert_eq!(
            s.owners.lock().expect("owners").get(&Addressed::Grant { key: "k", token: OWNERS_REMEMBERED_MAX as i64 }),
            None
        );
    }

    /// A release wakes the head waiter only: the others could only find they are not the head.
    #[test]
    fn a_release_wakes_only_the_head_waiter() {
        let s = server();
        let (head, head_wake) = s.join_queue("k").expect("room");
        let (_, second_wake) = s.join_queue("k").expect("room");
        s.wake("k");
        assert!(woken(&head_wake), "the head is woken");
        assert!(!woken(&second_wake), "the waiter behind it is not");
        assert!(s.is_head("k", head));
    }

    /// A head that leaves with the key wakes nobody (the key is held again: the next head
    /// would only be refused); one that leaves without it wakes the next head.
    #[test]
    fn only_a_waiter_leaving_without_the_key_wakes_the_next() {
        let s = server();
        let (first, _) = s.join_queue("k").expect("room");
        let (second, second_wake) = s.join_queue("k").expect("room");
        let (third, third_wake) = s.join_queue("k").expect("room");
        s.leave_queue("k", first, true);
        assert!(s.is_head("k", second));
        assert!(!woken(&second_wake), "a granted head's leaving woke the next waiter");
        s.leave_queue("k", second, false);
        assert!(s.is_head("k", third));
        assert!(woken(&third_wake), "a head that left without the key wakes the next");
        assert_eq!(s.waiter_count("k"), 1);
        s.leave_queue("k", third, false);
        assert!(s.queue_is_empty("k"));
    }
}
