//! The executor's client of the lock server (C3 §3.3, L1–L7).
//!
//! A worker opens a [`Session`] (heartbeated in the background), acquires a [`LockGuard`]
//! per key, attaches [`LockGuard::token`] to every fenced write, and aborts its critical
//! section as soon as [`LockGuard::watch`] says the lease is lost. The fence at the resource
//! is what makes a stale writer harmless; this client's job is to make a worker *stop* being
//! one as early as it can, and never to manufacture a duplicate by retrying.
//!
//! # Invariants
//!
//! 1. **The local deadline decides, on the monotonic clock (FR-11).** A grant is believed
//!    held until `t_sent + ttl × (1 − safety_margin)`, where `t_sent` is the instant the
//!    acquire (or the last successful renew) *request was sent* and `safety_margin` is
//!    `lock.client.safety-margin` (default 0.30). A slow answer shortens the belief; nothing
//!    the server says lengthens it. Past the deadline the lock is lost, whatever the server
//!    thinks. Wall-clock stamps in answers are never compared with this process's clock.
//! 2. **A grant dies with its session (FR-04).** A session is alive until
//!    `t_sent(last successful heartbeat) + ttl × (1 − safety_margin)`; a grant's effective
//!    deadline is the earlier of its own and its session's. Heartbeats go every third of the
//!    TTL with at most two tries each, within that third (C3 §3.8).
//! 3. **Loss is sticky and announced once.** The first reason wins; a late renew or
//!    heartbeat answer never revives a lost grant or session. Each grant's watch channel
//!    flips when its deadline passes (a watchdog task sleeps until it), a renew fails, its
//!    session is lost, or it is released or dropped.
//! 4. **Only retry-safe failures are retried (C3 §3.2).** The retry loop (module `retry`) can
//!    only be handed a value that is built from a code whose catalogue verdict is
//!    retry-safe, or from a connection that never opened. `FENCED_OUT`, `LOCK_LOST`, the
//!    session codes and every other non-retry-safe code end the call after one request.
//! 5. **Every loop has a bound.** Acquire: `acquire_attempts_max` (5) attempts, jittered
//!    exponential backoff `backoff_ms_min` → `backoff_ms_max` (50 ms → 1 s), then
//!    `CONTENTION_EXCEEDED` (FR-28). Renew: one retry, only when retry-safe. Release and
//!    session close: one request, never retried (expiry is the fallback). A server
//!    `retryAfterMillis` is honoured up to `retry_after_ms_max`, and a longer one ends the call.
//! 6. **A lost answer to a write is an ambiguity, not a failure.** An acquire that was sent
//!    and not answered is [`LockClientError::Ambiguous`], never retried: the grant may exist,
//!    attached to the session, under a token the client never saw. It dies with the session;
//!    the session refuses to acquire that key again, and the caller's move is to close the
//!    session (the server reclaims everything attached to it) and open a new one.
//! 7. **Time, tasks and randomness come from `dlock_rt`**, so the client runs unchanged in
//!    the madsim simulation and a seed replays its backoff jitter.

mod client;
pub mod config;
pub mod error;
mod guard;
pub mod lease;
mod retry;
mod session;
mod wire;

pub use client::LockClient;
pub use config::{AcquireOptions, LockClientConfig};
pub use error::{LockClientError, Operation};
pub use guard::{LockGuard, ReleaseOutcome};
pub use lease::{LeaseStatus, LossReason, SessionLoss, SessionStatus};
pub use session::{CloseOutcome, Session, AMBIGUOUS_KEYS_MAX};

pub(crate) use client::ClientInner;

/// Monotonic now, from the runtime seam (virtual in simulation).
pub(crate) fn now() -> dlock_rt::Instant {
    dlock_rt::Clock::system().now()
}

/// Locks shared state. A panic elsewhere while holding it cannot leave a half-written lease
/// (every write is one assignment), so a poisoned lock is still read.
pub(crate) fn lock_state<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
