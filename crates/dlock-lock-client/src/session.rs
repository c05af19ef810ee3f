//! A session (C3 L1–L3): opened once, kept alive by a background heartbeat, and the anchor
//! of every grant taken through it.
//!
//! Invariants:
//! - The session's local deadline is `send instant of the last successful heartbeat (or of
//!   the open) + ttl × (1 − safety_margin)`. Once it passes, the session is lost, even if a
//!   heartbeat answer arrives later: an answer never revives a lapsed session.
//! - Loss is sticky and keeps its first reason; it is announced once on the session's watch
//!   channel, which every grant's watchdog listens to (a session's grants die with it, FR-04).
//! - The heartbeat task beats every `heartbeat_interval` (a third of the TTL), with at most
//!   `heartbeat_tries_max` tries per beat, all within that third. It ends when the session is
//!   lost, closed or dropped; it never outlives the [`Session`] handle.
//! - A heartbeat is idempotent (it only extends this owner's own session), so a try whose
//!   answer was lost may be followed by another; `SESSION_EXPIRED` / `SESSION_UNKNOWN` end
//!   the session at once.
//! - Every change of the holder's belief in its session is emitted once as a
//!   `session_belief` event ([`dlock_rt::events`]): `opened`, `extended` (a heartbeat moved
//!   the local deadline) and `lost` (with the reason), each with the local deadline on this
//!   node's monotonic clock. A grant is believed only while its session is too, so a
//!   `lease_belief` and its session's `session_belief`s together say until when a holder
//!   believes (the simulation's oracle checks that no two holders believe at once).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use dlock_contract::lock::{is_lock_key, LockGrant};
use dlock_contract::{ErrorCode, FencingToken};
use dlock_rt::{Duration, Instant, JoinHandle};
use tokio::sync::watch;
use uuid::Uuid;

use crate::config::AcquireOptions;
use crate::error::{LockClientError, Operation};
use crate::guard::LockGuard;
use crate::lease::{self, SessionLoss, SessionStatus};
use crate::retry::{self, Failure, RetryPolicy, ACQUIRE_RETRY_CODES, NO_RETRY_CODES};
use crate::wire::{self, AcquireBody, Answer};
use crate::{lock_state, now, ClientInner};

/// Most keys whose acquire had an unknown outcome that one session remembers. Past it, the
/// session refuses every acquire: it must be closed (which reclaims whatever it holds).
pub const AMBIGUOUS_KEYS_MAX: usize = 64;

/// How a session close ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseOutcome {
    /// `204`: the server released the session and every lock attached to it.
    Closed,
    /// `SESSION_UNKNOWN` / `SESSION_EXPIRED`: the session was already gone.
    AlreadyGone,
}

#[derive(Debug)]
struct SessionState {
    deadline: Instant,
    lost: Option<SessionLoss>,
}

/// What the session handle, its heartbeat task and its grants share.
#[derive(Debug)]
pub(crate) struct SessionShared {
    pub(crate) id: Uuid,
    /// Its node name in emitted events: the owner id up to its first `/` (as a grant's).
    node: String,
    /// The TTL granted (the smaller of asked and answered).
    pub(crate) ttl_ms: u64,
    local_lease: Duration,
    state: Mutex<SessionState>,
    tx: watch::Sender<SessionStatus>,
    /// Keys whose acquire outcome is unknown on this session (bounded by AMBIGUOUS_KEYS_MAX).
    ambiguous_keys: Mutex<BTreeSet<String>>,
}

impl SessionShared {
    /// The session's local deadline if it is alive at `now`; otherwise why it is not (and,
    /// the first time, the loss is recorded and announced).
    pub(crate) fn check(&self, now: Instant) -> Result<Instant, SessionLoss> {
        let mut st = lock_state(&self.state);
        if let Some(loss) = st.lost {
            return Err(loss);
        }
        if now < st.deadline {
            return Ok(st.deadline);
        }
        st.lost = Some(SessionLoss::HeartbeatLapsed);
        let deadline = st.deadline;
        drop(st);
        self.belief("lost", deadline, Some(SessionLoss::HeartbeatLapsed));
        self.announce(SessionLoss::HeartbeatLapsed);
        Err(SessionLoss::HeartbeatLapsed)
    }

    /// Records `loss` unless the session is already lost (the first reason stays).
    pub(crate) fn mark_lost(&self, loss: SessionLoss) {
        let mut st = lock_state(&self.state);
        if st.lost.is_some() {
            return;
        }
        st.lost = Some(loss);
        let deadline = st.deadline;
        drop(st);
        self.belief("lost", deadline, Some(loss));
        self.announce(loss);
    }

    /// The holder's belief in this session, as a `session_belief` event (module doc).
    fn belief(&self, source: &'static str, deadline: Instant, reason: Option<SessionLoss>) {
        dlock_rt::events::emit(&self.node, "session_belief", || {
            [
                ("session", self.id.to_string().into()),
                ("local_deadline_mono_ms", dlock_rt::events::mono_ms(deadline).into()),
                ("source", source.into()),
                ("reason", dlock_rt::events::opt(reason.map(|r| r.to_string()))),
            ]
        });
    }

    fn announce(&self, loss: SessionLoss) {
        if matches!(loss, SessionLoss::Closed | SessionLoss::Dropped) {
            // The owner ended it: news, not a warning.
            tracing::info!(sessionId = %self.id, reason = %loss, "lock_session_ended");
        } else {
            tracing::warn!(sessionId = %self.id, reason = %loss, "lock_session_lost");
        }
        // Sent outside the state lock: a receiver holding a borrow must never wait on it.
        self.tx.send_replace(SessionStatus::Lost(loss));
    }

    /// A heartbeat sent at `sent_at` succeeded: move the deadline, unless it already passed.
    fn extend(&self, sent_at: Instant, now: Instant) -> Result<(), SessionLoss> {
        self.check(now)?;
        let mut st = lock_state(&self.state);
        if let Some(loss) = st.lost {
            return Err(loss);
        }
        let candidate = sent_at.checked_add(self.local_lease).unwrap_or(sent_at);
        if candidate > st.deadline {
            st.deadline = candidate;
            drop(st);
            self.belief("extended", candidate, None);
        }
        Ok(())
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<SessionStatus> {
        self.tx.subscribe()
    }

    /// What a failed grant-issuing call (acquire, rotate) of `key` teaches the session: an
    /// unknown outcome makes it refuse the key from now on (a grant may exist, attached to
    /// it, under a token never seen); a session refusal ends it.
    pub(crate) fn note_grant_failure(&self, key: &str, e: &LockClientError) {
        match e {
            LockClientError::Ambiguous { .. } => {
                tracing::warn!(key, sessionId = %self.id, cause = %e, "lock_acquire_ambiguous");
                let mut keys = lock_state(&self.ambiguous_keys);
                if keys.len() < AMBIGUOUS_KEYS_MAX {
                    keys.insert(key.to_owned());
                }
            }
            LockClientError::Server {
                code: code @ (ErrorCode::SessionExpired | ErrorCode::SessionUnknown), ..
            } => {
                self.mark_lost(SessionLoss::Ended(*code));
            }
            _ => tracing::info!(key, cause = %e, "lock_acquire_failed"),
        }
    }
}

/// An open session. Dropping it stops the heartbeats and marks it (and its grants) lost;
/// [`Session::close`] also tells the server.
#[derive(Debug)]
pub struct Session {
    shared: Arc<SessionShared>,
    inner: Arc<ClientInner>,
    heartbeat: JoinHandle<()>,
}

impl Session {
    /// Starts the heartbeat of a session whose open request was sent at `sent_at`.
    pub(crate) fn start(inner: Arc<ClientInner>, id: Uuid, ttl_ms: u64, sent_at: Instant) -> Session {
        let local_lease = lease::local_lease(ttl_ms, inner.config.safety_margin);
        let deadline = sent_at.checked_add(local_lease).unwrap_or(sent_at);
        let (tx, _rx) = watch::channel(SessionStatus::Alive);
        let node = inner.config.owner_id.as_str().split('/').next().unwrap_or_default().to_owned();
        let shared = Arc::new(SessionShared {
            id,
            node,
            ttl_ms,
            local_lease,
            state: Mutex::new(SessionState { deadline, lost: None }),
            tx,
            ambiguous_keys: Mutex::new(BTreeSet::new()),
        });
        shared.belief("opened", deadline, None);
        let heartbeat = dlock_rt::spawn(heartbeat_loop(inner.clone(), shared.clone(), sent_at));
        tracing::info!(sessionId = %id, ttlMillis = ttl_ms, "lock_session_opened");
        Session { shared, inner, heartbeat }
    }

    pub fn id(&self) -> Uuid {
        self.shared.id
    }

    /// The TTL the server granted (never more than was asked for).
    pub fn ttl_ms(&self) -> u64 {
        self.shared.ttl_ms
    }

    pub fn status(&self) -> SessionStatus {
        match self.shared.check(now()) {
            Ok(_) => SessionStatus::Alive,
            Err(loss) => SessionStatus::Lost(loss),
        }
    }

    /// Whether the session's local deadline is still ahead and nothing ended it.
    pub fn is_alive(&self) -> bool {
        self.status().is_alive()
    }

    /// Time left before the session's local deadline (zero once lost).
    pub fn remaining(&self) -> Duration {
        let t = now();
        self.shared.check(t).map_or(Duration::ZERO, |d| d.saturating_duration_since(t))
    }

    /// A channel that flips to [`SessionStatus::Lost`] when the session is lost.
    pub fn watch(&self) -> watch::Receiver<SessionStatus> {
        self.shared.subscribe()
    }

    /// Acquires `key` with the configured lease and no server-side wait.
    pub async fn acquire(&self, key: &str) -> Result<LockGuard, LockClientError> {
        self.acquire_with(key, AcquireOptions::default()).await
    }

    /// Acquires `key` (C3 L4): up to `acquire_attempts_max` attempts on `LOCK_CONTENDED`,
    /// `NOT_LEADER` / `NOT_READY` (honouring `retryAfterMillis`) and refused connections,
    /// with jittered exponential backoff, then `CONTENTION_EXCEEDED` (FR-28).
    ///
    /// An acquire whose answer was lost is [`LockClientError::Ambiguous`] and is not retried:
    /// the grant may exist, attached to this session, with a token the client never saw. It
    /// dies with the session. The session remembers the key and refuses to acquire it again
    /// (without sending anything); the caller's move is to [`Session::close`] (the server
    /// then reclaims every lock the session holds) and open a new session.
    pub async fn acquire_with(&self, key: &str, options: AcquireOptions) -> Result<LockGuard, LockClientError> {
        if !is_lock_key(key) {
            return Err(LockClientError::Invalid(format!("lock key {key:?} must be 1 to 128 of [a-zA-Z0-9:._-]")));
        }
        let cfg = &self.inner.config;
        let (ttl_ms, wait_ms) = options.check(cfg)?;
        self.refuse_if_ambiguous(key)?;
        let shared = &*self.shared;
        let transport = &self.inner.transport;
        let body = serde_json::to_vec(&AcquireBody { session_id: shared.id, ttl_millis: ttl_ms, wait_millis: wait_ms })
            .map_err(|e| LockClientError::Invalid(e.to_string()))?;
        let body = &body[..];
        let path = wire::lock_path(key, Some("acquire"));
        let path = path.as_str();
        let policy = RetryPolicy {
            attempts_max: cfg.acquire_attempts_max,
            backoff_ms_min: cfg.backoff_ms_min,
            backoff_ms_max: cfg.backoff_ms_max,
            retry_after_ms_max: cfg.retry_after_ms_max,
        };
        let owner = cfg.owner_id.as_str();
        let outcome = retry::run(policy, |attempt| async move {
            shared.check(now()).map_err(|reason| LockClientError::SessionLost { reason })?;
            let sent_at = now();
            let answer = transport.call(&transport.acquire, http::Method::POST, path, None, Some(body.to_vec())).await;
            let ok = retry::classify(Operation::Acquire, attempt, answer, ACQUIRE_RETRY_CODES)?;
            let (grant, token) = read_grant(&ok.body, key, shared.id, owner).map_err(|cause| {
                // A 200 was sent: the grant exists, but the client cannot use it.
                Failure::Final(LockClientError::Ambiguous { operation: Operation::Acquire, cause })
            })?;
            Ok((grant, token, sent_at, attempt))
        })
        .await;
        match outcome {
            Ok((grant, token, sent_at, attempts)) => {
                let granted_ms = lease::granted_ttl_ms(ttl_ms, grant.acquired_at, grant.expires_at);
                let deadline = lease::local_deadline(sent_at, granted_ms, cfg.safety_margin);
                tracing::info!(
                    key,
                    fencingToken = token.get(),
                    sessionId = %shared.id,
                    attempts,
                    ttlMillis = granted_ms,
                    "lock_acquired"
                );
                Ok(LockGuard::start(
                    self.inner.clone(),
                    self.shared.clone(),
                    key.to_owned(),
                    token,
                    grant.fencing_signature.clone(),
                    ttl_ms,
                    deadline,
                ))
            }
            Err(e) => {
                self.note_acquire_failure(key, &e);
                Err(e)
            }
        }
    }

    fn refuse_if_ambiguous(&self, key: &str) -> Result<(), LockClientError> {
        let keys = lock_state(&self.shared.ambiguous_keys);
        if keys.contains(key) || keys.len() >= AMBIGUOUS_KEYS_MAX {
            return Err(LockClientError::Ambiguous {
                operation: Operation::Acquire,
                cause: format!(
                    "an earlier acquire of {key:?} on session {} has an unknown outcome; close the session",
                    self.shared.id
                ),
            });
        }
        Ok(())
    }

    fn note_acquire_failure(&self, key: &str, e: &LockClientError) {
        self.shared.note_grant_failure(key, e);
    }

    /// Closes the session (C3 L3): stops the heartbeats, marks the session and all its grants
    /// lost at once, and sends one `DELETE`. Never retried: if it fails, the session expires.
    pub async fn close(self) -> Result<CloseOutcome, LockClientError> {
        self.heartbeat.abort();
        self.shared.mark_lost(SessionLoss::Closed);
        let transport = &self.inner.transport;
        let path = wire::session_path(self.shared.id);
        let answer = transport.call(&transport.release, http::Method::DELETE, &path, None, None).await;
        match retry::classify(Operation::CloseSession, 1, answer, NO_RETRY_CODES) {
            Ok(_) => Ok(CloseOutcome::Closed),
            Err(Failure::Final(LockClientError::Server {
                code: ErrorCode::SessionUnknown | ErrorCode::SessionExpired,
                ..
            })) => Ok(CloseOutcome::AlreadyGone),
            Err(Failure::Final(e)) => Err(e),
            // Only a refused connection gets here; close is never repeated.
            Err(Failure::Retry(nothing_sent)) => Err(nothing_sent.into_error()),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.heartbeat.abort();
        self.shared.mark_lost(SessionLoss::Dropped);
    }
}

/// Parses and checks an acquire or renew answer against what was asked.
pub(crate) fn read_grant(
    body: &[u8],
    key: &str,
    session_id: Uuid,
    owner: &str,
) -> Result<(LockGrant, FencingToken), String> {
    let grant: LockGrant = serde_json::from_slice(body).map_err(|e| format!("unreadable grant: {e}"))?;
    if grant.key != key || grant.session_id != session_id || grant.owner_id != owner {
        return Err(format!(
            "grant names key {:?}, session {}, owner {:?}; asked for {key:?}, {session_id}, {owner:?}",
            grant.key, grant.session_id, grant.owner_id
        ));
    }
    let token = FencingToken::new(grant.fencing_token)
        .ok_or_else(|| format!("fencing token {} is not > 0", grant.fencing_token))?;
    Ok((grant, token))
}

/// What one heartbeat try came to.
enum Beat {
    Extended,
    Ended(ErrorCode),
    Failed(String),
}

async fn beat_once(inner: &ClientInner, id: Uuid) -> Beat {
    let transport = &inner.transport;
    let path = wire::heartbeat_path(id);
    match transport.call(&transport.heartbeat, http::Method::POST, &path, None, None).await {
        Ok(Answer::Success { .. }) => Beat::Extended,
        Ok(Answer::Refused { envelope, .. })
            if matches!(envelope.code, ErrorCode::SessionExpired | ErrorCode::SessionUnknown) =>
        {
            Beat::Ended(envelope.code)
        }
        Ok(Answer::Refused { envelope, .. }) => Beat::Failed(format!("{}: {}", envelope.code, envelope.message)),
        Ok(Answer::Garbled { status, cause }) => Beat::Failed(format!("HTTP {status}: {cause}")),
        Err(e) => Beat::Failed(e.to_string()),
    }
}

/// The heartbeat task. Runs until the session is lost (or the task is aborted by close or
/// drop); each turn either sleeps towards the next beat or makes one beat of at most
/// `heartbeat_tries_max` tries.
async fn heartbeat_loop(inner: Arc<ClientInner>, shared: Arc<SessionShared>, opened_at: Instant) {
    let cfg = &inner.config;
    let interval = lease::heartbeat_interval(shared.ttl_ms, cfg.safety_margin);
    let mut next_beat = opened_at.checked_add(interval).unwrap_or(opened_at);
    loop {
        let t = now();
        let Ok(deadline) = shared.check(t) else { return };
        if t < next_beat {
            dlock_rt::sleep(next_beat.min(deadline).saturating_duration_since(t)).await;
            continue;
        }
        next_beat = t.checked_add(interval).unwrap_or(t);
        // Every try of this beat ends before the next beat is due and before the deadline.
        let beat_end = next_beat.min(deadline);
        for try_number in 1..=cfg.heartbeat_tries_max {
            let sent_at = now();
            let budget = beat_end.saturating_duration_since(sent_at);
            match dlock_rt::timeout(budget, beat_once(&inner, shared.id)).await {
                None => break,
                Some(Beat::Extended) => {
                    if shared.extend(sent_at, now()).is_err() {
                        return;
                    }
                    break;
                }
                Some(Beat::Ended(code)) => {
                    shared.mark_lost(SessionLoss::Ended(code));
                    return;
                }
                Some(Beat::Failed(cause)) => {
                    tracing::warn!(sessionId = %shared.id, try_number, cause, "lock_heartbeat_failed");
                }
            }
        }
    }
}
