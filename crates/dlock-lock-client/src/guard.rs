//! A held grant: its fencing token, its local deadline, and the early notice of its loss.
//!
//! Invariants:
//! - `is_held()` is true only while the grant is not lost, its local deadline is ahead, and
//!   its session is alive. The local deadline is `send instant of the acquire (or of the
//!   last successful renew) + ttl × (1 − safety_margin)`: what the server says never
//!   lengthens it (FR-11).
//! - Loss is sticky and keeps its first reason: a renew answer that arrives after the
//!   deadline does not revive the grant.
//! - The watch channel flips to [`LeaseStatus::Lost`] exactly once, when the deadline passes
//!   (a watchdog task sleeps until it), a renew fails, the session is lost, or the grant is
//!   released or dropped. A worker selects on it to abort its critical section early.
//! - Renew is tried at most `1 + renew_retries_max` times, and only a retry-safe failure
//!   leads to another try. Any renew that does not succeed marks the grant lost (fail
//!   closed).
//! - Release sends exactly one request and is never retried: expiry is the fallback.
//! - Rotate (C3-extensions E-18) ends the belief in the old grant before anything is sent
//!   (once sent, the server may release it at any moment). Only a retry-safe failure
//!   (`NOT_LEADER`, `NOT_READY`, a refused connection: nothing happened) leads to another
//!   try, and only while the old grant's local deadline is ahead. A lost answer is
//!   [`LockClientError::Ambiguous`], never retried, and the session then refuses the key as
//!   after an ambiguous acquire. The new grant's token must exceed the old one.
//! - Every change of the holder's belief is emitted once as a `lease_belief` event
//!   ([`dlock_rt::events`]; a no-op without a sink): the grant, each renew that moved the
//!   deadline, and the one loss (its watch flip), with the local deadline believed then.

use std::sync::{Arc, Mutex};

use dlock_contract::{ErrorCode, FencingToken};
use dlock_rt::{Duration, Instant, JoinHandle};
use tokio::sync::watch;
use uuid::Uuid;

use crate::error::{LockClientError, Operation};
use crate::lease::{self, LeaseStatus, LossReason, SessionLoss};
use crate::retry::{self, Failure, RetryPolicy, NO_RETRY_CODES, UNAVAILABLE_RETRY_CODES};
use crate::session::{read_grant, SessionShared};
use crate::wire::{self, ReleaseBody, RenewBody};
use crate::LockClientError as E;
use crate::{lock_state, now, ClientInner};

/// How a release ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// `204`: the compare-and-delete on (key, token) removed the grant.
    Released,
    /// `LOCK_LOST`: the grant had already expired or been taken over (benign, C3 L6).
    AlreadyGone,
}

#[derive(Debug)]
struct GrantState {
    deadline: Instant,
    lost: Option<LossReason>,
}

#[derive(Debug)]
pub(crate) struct GrantShared {
    key: String,
    token: FencingToken,
    /// The lock server's signature of this grant (`fencingSignature`), if it signs.
    signature: Option<String>,
    session: Arc<SessionShared>,
    state: Mutex<GrantState>,
    tx: watch::Sender<LeaseStatus>,
    /// The holder's owner id.
    owner: String,
    /// Its node name in emitted events ([`dlock_rt::events`]): the owner id up to its
    /// first `/` (an executor's worker `executor-0/3` is the node `executor-0`).
    node: String,
}

impl GrantShared {
    /// The effective deadline (the grant's, or its session's if earlier) while held;
    /// otherwise why it is not held (recorded and announced the first time).
    fn check(&self, now: Instant) -> Result<Instant, LossReason> {
        let session = self.session.check(now);
        let mut st = lock_state(&self.state);
        if let Some(reason) = st.lost {
            return Err(reason);
        }
        let verdict = match session {
            Err(loss) => Err(LossReason::SessionLost(loss)),
            Ok(_) if now >= st.deadline => Err(LossReason::DeadlinePassed),
            Ok(session_deadline) => Ok(st.deadline.min(session_deadline)),
        };
        if let Err(reason) = verdict {
            st.lost = Some(reason);
            let deadline = st.deadline;
            drop(st);
            self.announce(reason, deadline);
        }
        verdict
    }

    /// Records `reason` unless already lost (the first reason stays).
    fn mark_lost(&self, reason: LossReason) {
        let mut st = lock_state(&self.state);
        if st.lost.is_some() {
            return;
        }
        st.lost = Some(reason);
        let deadline = st.deadline;
        drop(st);
        self.announce(reason, deadline);
    }

    /// The holder's belief about this grant, as a `lease_belief` event: `source` is
    /// `granted`, `renewed`, `early_notice` (the watch flipped before the local deadline:
    /// a renew failed or the session was lost), `lost` (the local deadline passed) or
    /// `released` (released, or the guard dropped).
    fn belief(&self, source: &'static str, deadline: Instant, reason: Option<LossReason>) {
        dlock_rt::events::emit(&self.node, "lease_belief", || {
            [
                ("key", self.key.clone().into()),
                ("token", self.token.get().into()),
                ("owner", self.owner.clone().into()),
                ("session", self.session.id.to_string().into()),
                ("local_deadline_mono_ms", dlock_rt::events::mono_ms(deadline).into()),
                ("source", source.into()),
                ("reason", dlock_rt::events::opt(reason.map(|r| r.to_string()))),
            ]
        });
    }

    fn announce(&self, reason: LossReason, deadline: Instant) {
        let source = match reason {
            LossReason::Released | LossReason::Dropped => "released",
            LossReason::DeadlinePassed => "lost",
            LossReason::RenewFailed | LossReason::SessionLost(_) => "early_notice",
        };
        self.belief(source, deadline, Some(reason));
        match reason {
            LossReason::Released | LossReason::Dropped => {
                tracing::info!(key = %self.key, fencingToken = self.token.get(), %reason, "lock_given_up");
            }
            _ => tracing::warn!(key = %self.key, fencingToken = self.token.get(), %reason, "lock_lost"),
        }
        // Sent outside the state lock: a receiver holding a borrow must never wait on it.
        self.tx.send_replace(LeaseStatus::Lost(reason));
    }

    /// A renew sent at `sent_at` succeeded: move the deadline, unless the grant is already
    /// lost (then the late answer changes nothing).
    fn extend(&self, new_deadline: Instant, now: Instant) -> Result<(), LossReason> {
        self.check(now)?;
        let mut st = lock_state(&self.state);
        if let Some(reason) = st.lost {
            return Err(reason);
        }
        st.deadline = st.deadline.max(new_deadline);
        let deadline = st.deadline;
        drop(st);
        self.belief("renewed", deadline, None);
        Ok(())
    }
}

/// A held lock. Attach [`LockGuard::token`] to every fenced write; check
/// [`LockGuard::is_held`] (or select on [`LockGuard::watch`]) before each step; release it
/// when done. Dropping it without a release stops local belief at once and leaves the lease
/// to expire on the server.
#[derive(Debug)]
pub struct LockGuard {
    grant: Arc<GrantShared>,
    inner: Arc<ClientInner>,
    /// The lease asked for on acquire; every renew asks for the same.
    ttl_ms: u64,
    watchdog: JoinHandle<()>,
}

impl LockGuard {
    pub(crate) fn start(
        inner: Arc<ClientInner>,
        session: Arc<SessionShared>,
        key: String,
        token: FencingToken,
        signature: Option<String>,
        ttl_ms: u64,
        deadline: Instant,
    ) -> LockGuard {
        let (tx, _rx) = watch::channel(LeaseStatus::Held);
        let owner = inner.config.owner_id.as_str().to_owned();
        // An executor's workers are `EXECUTOR/N`: their node is the executor.
        let node = owner.split('/').next().unwrap_or_default().to_owned();
        let grant = Arc::new(GrantShared {
            key,
            token,
            signature,
            session,
            state: Mutex::new(GrantState { deadline, lost: None }),
            tx,
            owner,
            node,
        });
        grant.belief("granted", deadline, None);
        let watchdog = dlock_rt::spawn(watchdog(grant.clone()));
        LockGuard { grant, inner, ttl_ms, watchdog }
    }

    pub fn key(&self) -> &str {
        &self.grant.key
    }

    /// The fencing token to send as `X-Fencing-Token` on every protected write.
    pub fn token(&self) -> FencingToken {
        self.grant.token
    }

    /// The lock server's signature of this grant, to send as `X-Fencing-Signature` next to
    /// the token (C3-extensions E-14); `None` from a lock server without a signing key.
    pub fn signature(&self) -> Option<&str> {
        self.grant.signature.as_deref()
    }

    /// The token with its signature, as a fenced write presents them.
    pub fn signed_token(&self) -> dlock_contract::grant::SignedToken {
        dlock_contract::grant::SignedToken::new(self.grant.token, self.grant.signature.clone())
    }

    pub fn session_id(&self) -> Uuid {
        self.grant.session.id
    }

    pub fn status(&self) -> LeaseStatus {
        match self.grant.check(now()) {
            Ok(_) => LeaseStatus::Held,
            Err(reason) => LeaseStatus::Lost(reason),
        }
    }

    /// Whether the client still believes it holds the lock: not lost, local deadline ahead,
    /// session alive. Whatever the server says (FR-11).
    pub fn is_held(&self) -> bool {
        self.status().is_held()
    }

    /// Time left before the effective local deadline (zero once lost).
    pub fn remaining(&self) -> Duration {
        let t = now();
        self.grant.check(t).map_or(Duration::ZERO, |d| d.saturating_duration_since(t))
    }

    /// Time left before the grant's own local deadline, leaving its session's out (zero
    /// once lost, the session's loss included). What a renew or a rotate of this grant can
    /// extend: the session's deadline moves only with its heartbeats. [`LockGuard::remaining`]
    /// (the lesser of the two) is what a write may rely on.
    pub fn grant_remaining(&self) -> Duration {
        let t = now();
        match self.grant.check(t) {
            Ok(_) => lock_state(&self.grant.state).deadline.saturating_duration_since(t),
            Err(_) => Duration::ZERO,
        }
    }

    /// The effective local deadline (the grant's, or its session's if earlier), while held.
    pub fn deadline(&self) -> Option<Instant> {
        self.grant.check(now()).ok()
    }

    /// Early notice: a channel that flips to [`LeaseStatus::Lost`] once, when the deadline
    /// passes, a renew fails, the session is lost, or the grant is released or dropped.
    pub fn watch(&self) -> watch::Receiver<LeaseStatus> {
        self.grant.tx.subscribe()
    }

    /// Resolves when the grant is lost, with the reason.
    pub async fn lost(&self) -> LossReason {
        let mut rx = self.watch();
        match rx.wait_for(|s| !s.is_held()).await.map(|s| *s) {
            Ok(LeaseStatus::Lost(reason)) => reason,
            // The sender lives as long as `self`; neither arm is reachable in practice.
            Ok(LeaseStatus::Held) | Err(_) => LossReason::Dropped,
        }
    }

    /// Renews the lease (C3 L5) for the TTL asked for on acquire. Refused locally (nothing
    /// sent) once the grant is lost. On success the deadline moves to the renew's send
    /// instant plus the local lease. Any failure marks the grant lost.
    pub async fn renew(&self) -> Result<(), LockClientError> {
        let grant = &*self.grant;
        grant.check(now()).map_err(|reason| LockClientError::LeaseLost { reason })?;
        let cfg = &self.inner.config;
        let transport = &self.inner.transport;
        let session_id = grant.session.id;
        let body = serde_json::to_vec(&RenewBody { session_id, ttl_millis: self.ttl_ms })
            .map_err(|e| LockClientError::Invalid(e.to_string()))?;
        let body = &body[..];
        let path = wire::lock_path(&grant.key, Some("renew"));
        let path = path.as_str();
        let owner = cfg.owner_id.as_str();
        let policy = RetryPolicy {
            attempts_max: cfg.renew_retries_max.saturating_add(1),
            backoff_ms_min: cfg.backoff_ms_min,
            backoff_ms_max: cfg.backoff_ms_max,
            retry_after_ms_max: cfg.retry_after_ms_max,
        };
        let outcome = retry::run(policy, |attempt| async move {
            grant.check(now()).map_err(|reason| LockClientError::LeaseLost { reason })?;
            let sent_at = now();
            let answer = transport
                .call(&transport.renew, http::Method::POST, path, Some(grant.token), Some(body.to_vec()))
                .await;
            let ok = retry::classify(Operation::Renew, attempt, answer, UNAVAILABLE_RETRY_CODES)?;
            let protocol = |cause| Failure::Final(LockClientError::Protocol { operation: Operation::Renew, cause });
            let (renewed, token) = read_grant(&ok.body, &grant.key, session_id, owner).map_err(protocol)?;
            if token != grant.token {
                return Err(protocol(format!("renew re-issued token {token}; it must extend {}", grant.token)));
            }
            Ok((renewed, sent_at))
        })
        .await;
        let result = outcome.and_then(|(renewed, sent_at)| {
            let granted_ms = lease::granted_ttl_ms(self.ttl_ms, renewed.acquired_at, renewed.expires_at);
            let deadline = lease::local_deadline(sent_at, granted_ms, cfg.safety_margin);
            grant.extend(deadline, now()).map_err(|reason| LockClientError::LeaseLost { reason })
        });
        if let Err(e) = &result {
            if let LockClientError::Server {
                code: code @ (ErrorCode::SessionExpired | ErrorCode::SessionUnknown),
                ..
            } = e
            {
                grant.session.mark_lost(SessionLoss::Ended(*code));
            }
            tracing::warn!(key = %grant.key, fencingToken = grant.token.get(), cause = %e, "lock_renew_failed");
            grant.mark_lost(LossReason::RenewFailed);
        }
        result
    }

    /// Releases the grant (C3 L6): stops local belief at once, then sends exactly one
    /// `DELETE` with the token. Never retried; if it fails, the lease expires on the server.
    pub async fn release(self) -> Result<ReleaseOutcome, LockClientError> {
        self.watchdog.abort();
        self.grant.mark_lost(LossReason::Released);
        let transport = &self.inner.transport;
        let body = serde_json::to_vec(&ReleaseBody { session_id: self.grant.session.id })
            .map_err(|e| LockClientError::Invalid(e.to_string()))?;
        let path = wire::lock_path(&self.grant.key, None);
        let answer =
            transport.call(&transport.release, http::Method::DELETE, &path, Some(self.grant.token), Some(body)).await;
        match retry::classify(Operation::Release, 1, answer, NO_RETRY_CODES) {
            Ok(_) => Ok(ReleaseOutcome::Released),
            Err(Failure::Final(LockClientError::Server { code: ErrorCode::LockLost, .. })) => {
                Ok(ReleaseOutcome::AlreadyGone)
            }
            Err(Failure::Final(e)) => Err(e),
            // Only a refused connection gets here; release is never repeated.
            Err(Failure::Retry(nothing_sent)) => Err(nothing_sent.into_error()),
        }
    }
}

impl LockGuard {
    /// Rotates the grant (C3-extensions E-18): one request that releases this grant and
    /// grants the key again to the same session with a greater token, in one atomic step on
    /// the server. Refused locally (nothing sent) once the grant is lost. Belief in this
    /// grant ends before the request is sent, whatever the answer: on success the new guard
    /// holds, with a local deadline from this request's send instant; on a refusal nothing
    /// changed on the server and this grant expires there; on an unknown outcome (lost
    /// answer, `INTERNAL`) the session refuses the key from then on, as after an ambiguous
    /// acquire.
    pub async fn rotate(self) -> Result<LockGuard, E> {
        let grant = self.grant.clone();
        let deadline = grant.check(now()).map_err(|reason| E::LeaseLost { reason })?;
        self.watchdog.abort();
        grant.mark_lost(LossReason::Released);
        let cfg = &self.inner.config;
        let transport = &self.inner.transport;
        let session = &grant.session;
        let body = serde_json::to_vec(&RenewBody { session_id: session.id, ttl_millis: self.ttl_ms })
            .map_err(|e| E::Invalid(e.to_string()))?;
        let body = &body[..];
        let path = wire::lock_path(&grant.key, Some("rotate"));
        let path = path.as_str();
        let owner = cfg.owner_id.as_str();
        let (key, old) = (grant.key.as_str(), grant.token);
        let policy = RetryPolicy {
            attempts_max: cfg.renew_retries_max.saturating_add(1),
            backoff_ms_min: cfg.backoff_ms_min,
            backoff_ms_max: cfg.backoff_ms_max,
            retry_after_ms_max: cfg.retry_after_ms_max,
        };
        let outcome = retry::run(policy, |attempt| async move {
            // Another try only while the old grant would still be held (nothing happened yet).
            let t = now();
            session.check(t).map_err(|reason| E::SessionLost { reason })?;
            if t >= deadline {
                return Err(Failure::Final(E::LeaseLost { reason: LossReason::DeadlinePassed }));
            }
            let sent_at = now();
            let answer =
                transport.call(&transport.acquire, http::Method::POST, path, Some(old), Some(body.to_vec())).await;
            let ok = retry::classify(Operation::Rotate, attempt, answer, UNAVAILABLE_RETRY_CODES)?;
            // A 200 was sent: a grant may exist, but the client cannot use it.
            let unusable = |cause| Failure::Final(E::Ambiguous { operation: Operation::Rotate, cause });
            let (granted, token) = read_grant(&ok.body, key, session.id, owner).map_err(unusable)?;
            if token <= old {
                return Err(unusable(format!("rotate issued token {token}; it must exceed {old}")));
            }
            Ok((granted, token, sent_at))
        })
        .await;
        match outcome {
            Ok((granted, token, sent_at)) => {
                let granted_ms = lease::granted_ttl_ms(self.ttl_ms, granted.acquired_at, granted.expires_at);
                let deadline = lease::local_deadline(sent_at, granted_ms, cfg.safety_margin);
                tracing::info!(key, releasedToken = old.get(), fencingToken = token.get(), sessionId = %session.id,
                    ttlMillis = granted_ms, "lock_rotated");
                Ok(LockGuard::start(
                    self.inner.clone(),
                    session.clone(),
                    key.to_owned(),
                    token,
                    granted.fencing_signature.clone(),
                    self.ttl_ms,
                    deadline,
                ))
            }
            Err(e) => {
                session.note_grant_failure(key, &e);
                Err(e)
            }
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.watchdog.abort();
        self.grant.mark_lost(LossReason::Dropped);
    }
}

/// Sleeps until the effective deadline and flips the watch when it passes; wakes early when
/// the grant or its session changes. Ends once the grant is lost (or the guard aborts it).
/// Each turn either ends the task or waits for a change or a deadline that has moved.
async fn watchdog(grant: Arc<GrantShared>) {
    let mut own = grant.tx.subscribe();
    let mut session = grant.session.subscribe();
    loop {
        let t = now();
        let Ok(deadline) = grant.check(t) else { return };
        let pause = deadline.saturating_duration_since(t);
        tokio::select! {
            biased;
            changed = own.changed() => if changed.is_err() { return },
            changed = session.changed() => if changed.is_err() { return },
            () = dlock_rt::sleep(pause) => {}
        }
    }
}
