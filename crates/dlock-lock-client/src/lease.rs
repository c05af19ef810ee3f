//! Lease arithmetic and lease states: plain functions and values, no I/O, no clock reads.
//!
//! Every instant here is a monotonic [`Instant`] handed in by the caller; nothing reads a
//! wall clock (FR-11). The server's `expiresAt` / `acquiredAt` are wall-clock stamps for
//! humans: the only use made of them is their *difference* within one answer, which can
//! only shorten the lease the client believes in, never lengthen it.

use chrono::{DateTime, Utc};
use dlock_contract::ErrorCode;
use dlock_rt::{Duration, Instant};

/// Why a session is no longer alive. Sticky: a lost session never comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionLoss {
    /// No heartbeat succeeded before the session's local deadline
    /// (`ttl × (1 − safety_margin)` after the last successful heartbeat was sent).
    HeartbeatLapsed,
    /// The server answered `SESSION_EXPIRED` or `SESSION_UNKNOWN` (FR-04).
    Ended(ErrorCode),
    /// [`crate::Session::close`] was called.
    Closed,
    /// The [`crate::Session`] handle was dropped; its heartbeats stopped.
    Dropped,
}

impl std::fmt::Display for SessionLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionLoss::HeartbeatLapsed => f.write_str("no heartbeat succeeded before the local deadline"),
            SessionLoss::Ended(code) => write!(f, "the server answered {code}"),
            SessionLoss::Closed => f.write_str("closed"),
            SessionLoss::Dropped => f.write_str("the session handle was dropped"),
        }
    }
}

/// Why a grant is no longer held locally. Sticky: a lost grant never comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossReason {
    /// The local deadline passed, whatever the server believes (FR-11).
    DeadlinePassed,
    /// A renew did not succeed (any failure: the client fails closed).
    RenewFailed,
    /// The session the grant is attached to was lost; every grant dies with it (FR-04).
    SessionLost(SessionLoss),
    /// [`crate::LockGuard::release`] was called.
    Released,
    /// The [`crate::LockGuard`] was dropped without a release; the server reaps the lease.
    Dropped,
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LossReason::DeadlinePassed => f.write_str("the local deadline passed"),
            LossReason::RenewFailed => f.write_str("a renew failed"),
            LossReason::SessionLost(s) => write!(f, "the session was lost ({s})"),
            LossReason::Released => f.write_str("released"),
            LossReason::Dropped => f.write_str("the guard was dropped"),
        }
    }
}

/// What a grant's watch channel carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseStatus {
    Held,
    Lost(LossReason),
}

impl LeaseStatus {
    pub fn is_held(self) -> bool {
        self == LeaseStatus::Held
    }
}

/// What a session's watch channel carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionStatus {
    Alive,
    Lost(SessionLoss),
}

impl SessionStatus {
    pub fn is_alive(self) -> bool {
        self == SessionStatus::Alive
    }
}

/// Rounding slack, in milliseconds, for the float product in [`local_lease`].
const LEASE_MS_EPSILON: f64 = 1e-6;

/// How long the client believes a lease of `ttl_ms` lasts: `ttl × (1 − safety_margin)`,
/// rounded down to the millisecond.
pub fn local_lease(ttl_ms: u64, safety_margin: f64) -> Duration {
    let kept = (1.0 - safety_margin).clamp(0.0, 1.0);
    // The epsilon absorbs binary fractions (1 − 0.9 is 0.09999…); `as` saturates, and the
    // clamp keeps the product within `0 ..= ttl_ms`.
    let ms = (ttl_ms as f64 * kept + LEASE_MS_EPSILON).floor() as u64;
    Duration::from_millis(ms.min(ttl_ms))
}

/// The local deadline of a lease of `ttl_ms` whose request left at `sent_at`. Measured from
/// the send, not the answer: a slow answer shortens the belief, never extends it.
pub fn local_deadline(sent_at: Instant, ttl_ms: u64, safety_margin: f64) -> Instant {
    // On overflow (impossible for TTLs ≤ 60 s) the lease is believed already over.
    sent_at.checked_add(local_lease(ttl_ms, safety_margin)).unwrap_or(sent_at)
}

/// The lease a grant really got: what was asked for, or less if the server's own two stamps
/// (from one answer, one clock) say it granted less. Never more than was asked for.
pub fn granted_ttl_ms(requested_ms: u64, acquired_at: DateTime<Utc>, expires_at: DateTime<Utc>) -> u64 {
    let span_ms = (expires_at - acquired_at).num_milliseconds();
    u64::try_from(span_ms).map_or(0, |span| span.min(requested_ms))
}

/// How often a session heartbeats: every third of its TTL (C3 §3.8), and at least twice
/// within its local lease, so one lost heartbeat never lapses a session by itself.
pub fn heartbeat_interval(session_ttl_ms: u64, safety_margin: f64) -> Duration {
    let third = Duration::from_millis(session_ttl_ms / 3);
    let half_local = local_lease(session_ttl_ms, safety_margin) / 2;
    third.min(half_local).max(Duration::from_millis(1))
}

/// The pause after failed attempt number `attempt` (1-based): uniform in
/// `[min_ms, ceiling]` where `ceiling = min_ms × 2^(attempt − 1)`, capped at `max_ms`.
/// `random` is one draw from `dlock_rt::rand`, so a simulation seed replays it.
pub fn backoff_ms(attempt: u32, min_ms: u64, max_ms: u64, random: u64) -> u64 {
    let doublings = attempt.saturating_sub(1).min(32);
    let ceiling = min_ms.saturating_mul(1u64 << doublings).min(max_ms).max(min_ms);
    let span = ceiling - min_ms;
    min_ms + random % span.saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_lease_keeps_seventy_percent_by_default() {
        assert_eq!(local_lease(1_000, 0.30), Duration::from_millis(700));
        assert_eq!(local_lease(10_000, 0.30), Duration::from_millis(7_000));
        assert_eq!(local_lease(1_001, 0.5), Duration::from_millis(500));
    }

    #[test]
    fn local_deadline_counts_from_the_send_instant() {
        let sent = dlock_rt::Clock::system().now();
        assert_eq!(local_deadline(sent, 1_000, 0.30), sent + Duration::from_millis(700));
    }

    #[test]
    fn granted_ttl_never_exceeds_what_was_asked() {
        let at = DateTime::<Utc>::from_timestamp_millis(1_000_000).expect("stamp");
        let plus = |ms| at + chrono::Duration::milliseconds(ms);
        assert_eq!(granted_ttl_ms(5_000, at, plus(5_000)), 5_000);
        assert_eq!(granted_ttl_ms(5_000, at, plus(9_000)), 5_000);
        assert_eq!(granted_ttl_ms(5_000, at, plus(2_000)), 2_000);
        assert_eq!(granted_ttl_ms(5_000, at, plus(-1)), 0);
    }

    #[test]
    fn heartbeat_interval_is_a_third_of_the_ttl_and_fits_twice_in_the_local_lease() {
        assert_eq!(heartbeat_interval(9_000, 0.30), Duration::from_millis(3_000));
        // A large margin leaves a local lease of 1 000 ms: beat every 500 ms.
        assert_eq!(heartbeat_interval(10_000, 0.90), Duration::from_millis(500));
    }

    #[test]
    fn backoff_grows_exponentially_within_bounds_and_is_jittered() {
        for random in [0, 1, 77, u64::MAX] {
            for attempt in 1..=10 {
                let ms = backoff_ms(attempt, 50, 1_000, random);
                let ceiling = (50u64 << (attempt - 1)).min(1_000);
                assert!((50..=ceiling).contains(&ms), "attempt {attempt}: {ms}");
            }
        }
        assert_eq!(backoff_ms(1, 50, 1_000, 12345), 50);
        assert_eq!(backoff_ms(5, 50, 1_000, 750), 800);
        assert_eq!(backoff_ms(40, 50, 1_000, 950), 1_000);
        let distinct: std::collections::BTreeSet<u64> = (0..64).map(|r| backoff_ms(4, 50, 1_000, r * 7)).collect();
        assert!(distinct.len() > 10, "jitter spreads the pauses: {distinct:?}");
    }
}
