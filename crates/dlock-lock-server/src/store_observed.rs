//! Every lock-store call told to an observer, with what it asked and how it ended: the
//! evidence the oracle's lock-call checker (`dlock_sim::oracle::calls`) judges in true time,
//! on every backend.
//!
//! - [`ObservedLockStore`] sits between a replica and its store and tells a [`CallSlot`]
//!   when each call begins ([`Asked`]) and how it ended ([`Answered`]); reads and the
//!   reaper pass through untold. The simulation registers its oracle as the slot's
//!   observer (the oracle stamps each report with the world's true time).
//! - [`EventObserver`] is the real processes' observer: it writes each report on the event
//!   seam (`store_call` before the call, `store_answer` after it), so a real run's judge
//!   feeds the same checker from the lock servers' trace files, stamped on the host's
//!   monotonic clock (docs/real-runs.md). [`Asked::from_fields`] and
//!   [`Answered::from_fields`] read them back.
//!
//! Invariants:
//! - A call is told `begin` before it is sent and `end` after its answer, so a process
//!   killed in between leaves a call that began and never ended (its outcome unknown), and
//!   never an answer without its call.
//! - A failed call ends [`Answered::Unknown`]: never evidence of a grant, a renew or a
//!   heartbeat.
//! - Without an observer a call passes through untold, at the cost of one read of the slot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use serde_json::Value;
use uuid::Uuid;

use crate::store::{
    AcquireRefusal, Addressed, GrantRow, HeldKey, KeyInfo, LockStore, ReapReport, RenewRefusal, Revocation,
    RevokeRefusal, RotateRefusal, SessionRefusal, SessionRow, StoreError,
};

/// What a call asked of the store (what the checker reads of it).
#[derive(Debug, Clone, PartialEq)]
pub enum Asked {
    Open {
        session: Uuid,
    },
    Heartbeat {
        session: Uuid,
    },
    Close {
        session: Uuid,
    },
    Acquire {
        key: String,
        session: Uuid,
        ttl_ms: i64,
        delay_ms: i64,
    },
    Renew {
        key: String,
        session: Uuid,
        token: i64,
        ttl_ms: i64,
    },
    Release {
        key: String,
        token: i64,
    },
    Rotate {
        key: String,
        session: Uuid,
        token: i64,
        ttl_ms: i64,
        delay_ms: i64,
    },
    Revoke {
        key: String,
    },
    /// A read, or the reaper: nothing the checker judges.
    Other,
}

/// How a call ended (what the checker reads of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answered {
    /// An open or heartbeat was acknowledged: the session's ttl.
    SessionLive {
        ttl_ms: i64,
    },
    /// An acquire or rotate granted this token.
    Granted {
        token: i64,
    },
    /// A renew extended the grant.
    Renewed,
    /// A release, a close or a revoke (of this token) was done.
    Done,
    Revoked {
        token: i64,
    },
    /// The call's session was refused as expired or unknown.
    SessionRefused,
    /// An acquire was refused: the key is held, or its lock-delay runs.
    KeyBusy,
    /// Any other answer the store gave.
    Other,
    /// The store failed: the outcome is unknown.
    Unknown,
}

/// Told of every call an [`ObservedLockStore`] passes on.
pub trait CallObserver: Send + Sync {
    fn begin(&self, id: u64, asked: Asked);
    fn end(&self, id: u64, answered: Answered);
}

/// Where the world's [`ObservedLockStore`]s report: the oracle registers one observer once
/// the world runs; until then (and without one) calls pass through untold.
#[derive(Default)]
pub struct CallSlot {
    observer: RwLock<Option<Arc<dyn CallObserver>>>,
    next: AtomicU64,
}

impl CallSlot {
    pub fn set_observer(&self, o: Arc<dyn CallObserver>) {
        if let Ok(mut slot) = self.observer.write() {
            *slot = Some(o);
        }
    }

    fn observer(&self) -> Option<Arc<dyn CallObserver>> {
        self.observer.read().ok().and_then(|o| o.clone())
    }

    async fn run<T>(
        &self,
        asked: impl FnOnce() -> Asked,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
        answered: impl FnOnce(&T) -> Answered,
    ) -> Result<T, StoreError> {
        let Some(o) = self.observer() else { return call.await };
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        o.begin(id, asked());
        let out = call.await;
        o.end(id, out.as_ref().map_or(Answered::Unknown, answered));
        out
    }
}

/// A replica's lockdb, its calls told to a [`CallSlot`] (see the module doc).
pub struct ObservedLockStore {
    pub inner: Arc<dyn LockStore>,
    pub slot: Arc<CallSlot>,
}

fn session_answer<T>(r: &Result<T, SessionRefusal>, live: impl FnOnce(&T) -> Answered) -> Answered {
    match r {
        Ok(t) => live(t),
        Err(SessionRefusal::Expired | SessionRefusal::Unknown) => Answered::SessionRefused,
    }
}

#[async_trait]
impl LockStore for ObservedLockStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }
    async fn now_ms(&self) -> Result<i64, StoreError> {
        self.inner.now_ms().await
    }
    async fn open_session(&self, session_id: Uuid, owner_id: &str, ttl_ms: i64) -> Result<SessionRow, StoreError> {
        let call = self.inner.open_session(session_id, owner_id, ttl_ms);
        let answered = |r: &SessionRow| Answered::SessionLive { ttl_ms: r.ttl_ms };
        self.slot.run(|| Asked::Open { session: session_id }, call, answered).await
    }
    async fn heartbeat(&self, session_id: Uuid) -> Result<Result<(SessionRow, i64), SessionRefusal>, StoreError> {
        let call = self.inner.heartbeat(session_id);
        let answered = |r: &Result<(SessionRow, i64), SessionRefusal>| {
            session_answer(r, |(row, _)| Answered::SessionLive { ttl_ms: row.ttl_ms })
        };
        self.slot.run(|| Asked::Heartbeat { session: session_id }, call, answered).await
    }
    async fn close_session(&self, session_id: Uuid, delay_ms: i64) -> Result<Result<(), SessionRefusal>, StoreError> {
        let call = self.inner.close_session(session_id, delay_ms);
        let answered = |r: &Result<(), SessionRefusal>| if r.is_ok() { Answered::Done } else { Answered::Other };
        self.slot.run(|| Asked::Close { session: session_id }, call, answered).await
    }
    async fn acquire(
        &self,
        key: &str,
        session_id: Uuid,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, AcquireRefusal>, StoreError> {
        let call = self.inner.acquire(key, session_id, ttl_ms, delay_ms);
        let asked = || Asked::Acquire { key: key.to_owned(), session: session_id, ttl_ms, delay_ms };
        let answered = |r: &Result<GrantRow, AcquireRefusal>| match r {
            Ok(g) => Answered::Granted { token: g.fencing_token },
            Err(AcquireRefusal::Session(_)) => Answered::SessionRefused,
            Err(AcquireRefusal::Contended { .. } | AcquireRefusal::Delayed { .. }) => Answered::KeyBusy,
            Err(_) => Answered::Other,
        };
        self.slot.run(asked, call, answered).await
    }
    async fn renew(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
    ) -> Result<Result<GrantRow, RenewRefusal>, StoreError> {
        let call = self.inner.renew(key, session_id, token, ttl_ms);
        let asked = || Asked::Renew { key: key.to_owned(), session: session_id, token, ttl_ms };
        let answered = |r: &Result<GrantRow, RenewRefusal>| match r {
            Ok(_) => Answered::Renewed,
            Err(_) => Answered::Other,
        };
        self.slot.run(asked, call, answered).await
    }
    async fn release(&self, key: &str, token: i64) -> Result<Result<(), Option<i64>>, StoreError> {
        let call = self.inner.release(key, token);
        let answered = |r: &Result<(), Option<i64>>| if r.is_ok() { Answered::Done } else { Answered::Other };
        self.slot.run(|| Asked::Release { key: key.to_owned(), token }, call, answered).await
    }
    async fn rotate(
        &self,
        key: &str,
        session_id: Uuid,
        token: i64,
        ttl_ms: i64,
        delay_ms: i64,
    ) -> Result<Result<GrantRow, RotateRefusal>, StoreError> {
        let call = self.inner.rotate(key, session_id, token, ttl_ms, delay_ms);
        let asked = || Asked::Rotate { key: key.to_owned(), session: session_id, token, ttl_ms, delay_ms };
        let answered = |r: &Result<GrantRow, RotateRefusal>| match r {
            Ok(g) => Answered::Granted { token: g.fencing_token },
            Err(RotateRefusal::Session(_)) => Answered::SessionRefused,
            Err(_) => Answered::Other,
        };
        self.slot.run(asked, call, answered).await
    }
    async fn owner_of(&self, target: Addressed<'_>) -> Result<Option<String>, StoreError> {
        self.inner.owner_of(target).await
    }
    async fn info(&self, key: &str, delay_ms: i64) -> Result<Option<KeyInfo>, StoreError> {
        self.inner.info(key, delay_ms).await
    }
    async fn held_keys(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        delay_ms: i64,
    ) -> Result<Vec<HeldKey>, StoreError> {
        self.inner.held_keys(prefix, after, limit, delay_ms).await
    }
    async fn revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        expected_token: Option<i64>,
        revocation_id: Uuid,
    ) -> Result<Result<Revocation, RevokeRefusal>, StoreError> {
        let call = self.inner.revoke(key, operator, reason, expected_token, revocation_id);
        let answered = |r: &Result<Revocation, RevokeRefusal>| match r {
            Ok(r) => Answered::Revoked { token: r.revoked_token },
            Err(_) => Answered::Other,
        };
        self.slot.run(|| Asked::Revoke { key: key.to_owned() }, call, answered).await
    }
    async fn reap(&self, limit: i64, delay_ms: i64, retention_ms: i64) -> Result<ReapReport, StoreError> {
        self.inner.reap(limit, delay_ms, retention_ms).await
    }
    async fn read_events(&self, after: i64, limit: usize) -> Result<crate::store::EventRead, StoreError> {
        self.inner.read_events(after, limit).await
    }
    async fn purge_events(&self, keep: i64) -> Result<u64, StoreError> {
        self.inner.purge_events(keep).await
    }
    fn judges_clock(&self) -> bool {
        self.inner.judges_clock()
    }
    fn pool_stats(&self) -> Option<dlock_http::metrics::PoolStats> {
        self.inner.pool_stats()
    }
    fn writer_thread(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        self.inner.writer_thread()
    }
}

/// The event-seam names of [`Asked`]'s variants (`store_call`'s `asked`).
const ASKED: [&str; 9] = ["open", "heartbeat", "close", "acquire", "renew", "release", "rotate", "revoke", "other"];

impl Asked {
    /// Its fields on the event seam (`store_call`): `asked` and every argument, `null` when
    /// it has none.
    pub fn fields(&self) -> [(&'static str, Value); 6] {
        let (asked, key, session, token, ttl_ms, delay_ms): (usize, Option<&str>, Option<Uuid>, _, _, _) = match self {
            Asked::Open { session } => (0, None, Some(*session), None, None, None),
            Asked::Heartbeat { session } => (1, None, Some(*session), None, None, None),
            Asked::Close { session } => (2, None, Some(*session), None, None, None),
            Asked::Acquire { key, session, ttl_ms, delay_ms } => {
                (3, Some(key.as_str()), Some(*session), None, Some(*ttl_ms), Some(*delay_ms))
            }
            Asked::Renew { key, session, token, ttl_ms } => {
                (4, Some(key.as_str()), Some(*session), Some(*token), Some(*ttl_ms), None)
            }
            Asked::Release { key, token } => (5, Some(key.as_str()), None, Some(*token), None, None),
            Asked::Rotate { key, session, token, ttl_ms, delay_ms } => {
                (6, Some(key.as_str()), Some(*session), Some(*token), Some(*ttl_ms), Some(*delay_ms))
            }
            Asked::Revoke { key } => (7, Some(key.as_str()), None, None, None, None),
            Asked::Other => (8, None, None, None, None, None),
        };
        [
            ("asked", ASKED[asked].into()),
            ("key", key.map_or(Value::Null, Value::from)),
            ("session", session.map_or(Value::Null, |s| s.to_string().into())),
            ("token", token.map_or(Value::Null, Value::from)),
            ("ttl_ms", ttl_ms.map_or(Value::Null, Value::from)),
            ("delay_ms", delay_ms.map_or(Value::Null, Value::from)),
        ]
    }

    /// Reads [`Asked::fields`] back from an event's fields (`field(name)`); `None` when a
    /// field its `asked` needs is missing or malformed.
    pub fn from_fields<'a>(field: impl Fn(&str) -> Option<&'a Value>) -> Option<Asked> {
        let key = || field("key").and_then(Value::as_str).map(str::to_owned);
        let session = || field("session").and_then(Value::as_str).and_then(|s| s.parse::<Uuid>().ok());
        let int = |name: &str| field(name).and_then(Value::as_i64);
        Some(match field("asked")?.as_str()? {
            "open" => Asked::Open { session: session()? },
            "heartbeat" => Asked::Heartbeat { session: session()? },
            "close" => Asked::Close { session: session()? },
            "acquire" => {
                Asked::Acquire { key: key()?, session: session()?, ttl_ms: int("ttl_ms")?, delay_ms: int("delay_ms")? }
            }
            "renew" => Asked::Renew { key: key()?, session: session()?, token: int("token")?, ttl_ms: int("ttl_ms")? },
            "release" => Asked::Release { key: key()?, token: int("token")? },
            "rotate" => Asked::Rotate {
                key: key()?,
                session: session()?,
                token: int("token")?,
                ttl_ms: int("ttl_ms")?,
                delay_ms: int("delay_ms")?,
            },
            "revoke" => Asked::Revoke { key: key()? },
            "other" => Asked::Other,
            _ => return None,
        })
    }
}

impl Answered {
    /// Its fields on the event seam (`store_answer`): `answer`, and the `token` or `ttl_ms`
    /// it carries (`null` otherwise).
    pub fn fields(&self) -> [(&'static str, Value); 3] {
        let (answer, token, ttl_ms) = match self {
            Answered::SessionLive { ttl_ms } => ("session_live", None, Some(*ttl_ms)),
            Answered::Granted { token } => ("granted", Some(*token), None),
            Answered::Renewed => ("renewed", None, None),
            Answered::Done => ("done", None, None),
            Answered::Revoked { token } => ("revoked", Some(*token), None),
            Answered::SessionRefused => ("session_refused", None, None),
            Answered::KeyBusy => ("key_busy", None, None),
            Answered::Other => ("other", None, None),
            Answered::Unknown => ("unknown", None, None),
        };
        [
            ("answer", answer.into()),
            ("token", token.map_or(Value::Null, Value::from)),
            ("ttl_ms", ttl_ms.map_or(Value::Null, Value::from)),
        ]
    }

    /// Reads [`Answered::fields`] back; `None` when malformed.
    pub fn from_fields<'a>(field: impl Fn(&str) -> Option<&'a Value>) -> Option<Answered> {
        let int = |name: &str| field(name).and_then(Value::as_i64);
        Some(match field("answer")?.as_str()? {
            "session_live" => Answered::SessionLive { ttl_ms: int("ttl_ms")? },
            "granted" => Answered::Granted { token: int("token")? },
            "renewed" => Answered::Renewed,
            "done" => Answered::Done,
            "revoked" => Answered::Revoked { token: int("token")? },
            "session_refused" => Answered::SessionRefused,
            "key_busy" => Answered::KeyBusy,
            "other" => Answered::Other,
            "unknown" => Answered::Unknown,
            _ => return None,
        })
    }
}

/// The real processes' [`CallObserver`] (module doc): `store_call` and `store_answer` on
/// the event seam, each with the call's id and the observer's `run`, so the ids of a
/// restarted replica (or of another replica in the same process), which start again at 0,
/// are told apart.
pub struct EventObserver {
    node: &'static str,
    run: u64,
}

/// Observers created in this process: the low bits of each one's `run`.
static OBSERVERS: AtomicU64 = AtomicU64::new(0);

impl EventObserver {
    /// An observer for the replica named `node` on the seam. Its `run` is its creation on
    /// the host's monotonic clock (ms) times 1 024, plus its number in the process.
    pub fn new(node: &'static str) -> EventObserver {
        let started = dlock_rt::events::mono_ms(dlock_rt::Clock::system().now());
        let n = OBSERVERS.fetch_add(1, Ordering::Relaxed) % 1_024;
        EventObserver { node, run: started.saturating_mul(1_024) + n }
    }
}

impl CallObserver for EventObserver {
    fn begin(&self, id: u64, asked: Asked) {
        dlock_rt::events::emit(self.node, "store_call", || {
            let mut f = vec![("call", Value::from(id)), ("run", Value::from(self.run))];
            f.extend(asked.fields());
            f
        });
    }

    fn end(&self, id: u64, answered: Answered) {
        dlock_rt::events::emit(self.node, "store_answer", || {
            let mut f = vec![("call", Value::from(id)), ("run", Value::from(self.run))];
            f.extend(answered.fields());
            f
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn back<const N: usize>(fields: [(&'static str, Value); N]) -> std::collections::BTreeMap<&'static str, Value> {
        fields.into_iter().collect()
    }

    #[test]
    fn every_call_and_answer_reads_back_from_its_event_fields() {
        let s = Uuid::from_u128(7);
        let key = "payout:acct-1".to_owned();
        let asked = [
            Asked::Open { session: s },
            Asked::Heartbeat { session: s },
            Asked::Close { session: s },
            Asked::Acquire { key: key.clone(), session: s, ttl_ms: 1_500, delay_ms: 0 },
            Asked::Renew { key: key.clone(), session: s, token: 9, ttl_ms: 1_500 },
            Asked::Release { key: key.clone(), token: 9 },
            Asked::Rotate { key: key.clone(), session: s, token: 9, ttl_ms: 1_500, delay_ms: 5 },
            Asked::Revoke { key },
            Asked::Other,
        ];
        for a in asked {
            let f = back(a.fields());
            assert_eq!(f.len(), 6, "{a:?}: every field, null when it has none");
            assert_eq!(Asked::from_fields(|k| f.get(k)), Some(a.clone()), "{a:?}");
        }
        let answered = [
            Answered::SessionLive { ttl_ms: 10_000 },
            Answered::Granted { token: 3 },
            Answered::Renewed,
            Answered::Done,
            Answered::Revoked { token: 3 },
            Answered::SessionRefused,
            Answered::KeyBusy,
            Answered::Other,
            Answered::Unknown,
        ];
        for a in answered {
            let f = back(a.fields());
            assert_eq!(Answered::from_fields(|k| f.get(k)), Some(a), "{a:?}");
        }
        let mut f = back(Asked::Renew { key: "k".into(), session: s, token: 1, ttl_ms: 1 }.fields());
        f.insert("token", Value::Null);
        assert_eq!(Asked::from_fields(|k| f.get(k)), None, "a renew without its token is malformed");
        assert_eq!(Answered::from_fields(|_| None), None);
    }
}
