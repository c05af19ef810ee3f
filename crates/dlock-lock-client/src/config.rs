//! The client's settings: every budget of C3 §3.8 for the executor → lock-server hops, with
//! its unit last, and the safety margin of the local deadline (`lock.client.safety-margin`).
//!
//! A config is validated once, by [`crate::LockClient::new`]; nothing behind that call
//! re-checks it. Out-of-range values are refused, never clamped: a mistyped safety setting
//! must not fall back silently to something else.

use dlock_contract::lock::{LOCK_TTL_MS_MAX, LOCK_TTL_MS_MIN, SESSION_TTL_MS_MAX, SESSION_TTL_MS_MIN, WAIT_MS_MAX};
use dlock_contract::OwnerId;
use dlock_rt::http::BaseUrl;

use crate::error::LockClientError;

/// Default `lock.client.safety-margin`: the local deadline is `TTL × (1 − 0.30)` (C3 §3.8).
pub const SAFETY_MARGIN_DEFAULT: f64 = 0.30;
/// Default session TTL asked for on open (C3 L1 range 1 000 … 60 000 ms).
pub const SESSION_TTL_MS_DEFAULT: u64 = 10_000;
/// Default lease asked for on acquire and renew. The client always sends it, so it knows the
/// lease it asked for without reading a wall clock.
pub const LOCK_TTL_MS_DEFAULT: u64 = 10_000;

/// Acquire connect budget (C3 §3.8: executor → lock-server acquire, 500 ms / 2 s).
pub const ACQUIRE_CONNECT_TIMEOUT_MS_DEFAULT: u64 = 500;
/// Acquire read budget (C3 §3.8).
pub const ACQUIRE_READ_TIMEOUT_MS_DEFAULT: u64 = 2_000;
/// Acquire attempts, the first included (C3 §3.8 "up to 5"), then `CONTENTION_EXCEEDED`.
pub const ACQUIRE_ATTEMPTS_MAX_DEFAULT: u32 = 5;
/// Shortest pause between two attempts (C3 §3.8 "jittered exponential 50 ms → 1 s").
pub const BACKOFF_MS_MIN_DEFAULT: u64 = 50;
/// Longest pause between two attempts.
pub const BACKOFF_MS_MAX_DEFAULT: u64 = 1_000;
/// Longest server `retryAfterMillis` (on `NOT_LEADER`, `NOT_READY`) honoured inside one call.
/// A longer one ends the call with that error, so the caller decides; the client never
/// waits less than the server asked.
pub const RETRY_AFTER_MS_MAX_DEFAULT: u64 = 2_000;

/// Heartbeat connect budget (C3 §3.8: 300 ms / 1 s, "must fail fast").
pub const HEARTBEAT_CONNECT_TIMEOUT_MS_DEFAULT: u64 = 300;
/// Heartbeat read budget.
pub const HEARTBEAT_READ_TIMEOUT_MS_DEFAULT: u64 = 1_000;
/// Heartbeat tries per period of `ttl / 3` (C3 §3.8 "2 within one third of lock.session.ttl").
pub const HEARTBEAT_TRIES_MAX_DEFAULT: u32 = 2;

/// Renew connect budget (C3 §3.8: 500 ms / 2 s).
pub const RENEW_CONNECT_TIMEOUT_MS_DEFAULT: u64 = 500;
/// Renew read budget.
pub const RENEW_READ_TIMEOUT_MS_DEFAULT: u64 = 2_000;
/// Renew retries after the first try, only on retry-safe failures (C3 §3.8 "1 (renew)").
pub const RENEW_RETRIES_MAX_DEFAULT: u32 = 1;

/// Release (and session close) connect budget (C3 §3.8: 500 ms / 2 s, never retried).
pub const RELEASE_CONNECT_TIMEOUT_MS_DEFAULT: u64 = 500;
/// Release (and session close) read budget.
pub const RELEASE_READ_TIMEOUT_MS_DEFAULT: u64 = 2_000;

/// Advisory-read connect budget (C3 §3.8 "any → GET advisory reads": 300 ms / 1 s, 2 retries).
pub const READ_CONNECT_TIMEOUT_MS_DEFAULT: u64 = 300;
/// Advisory-read read budget.
pub const READ_READ_TIMEOUT_MS_DEFAULT: u64 = 1_000;
/// Advisory-read retries after the first try.
pub const READ_RETRIES_MAX_DEFAULT: u32 = 2;

/// Largest value any `*_attempts_max`, `*_tries_max` or `*_retries_max` setting may take.
pub const ATTEMPTS_CEILING_MAX: u32 = 20;
/// Largest value any `*_timeout_ms` or `*_ms_*` setting may take.
pub const TIMEOUT_MS_CEILING_MAX: u64 = 60_000;

/// The client's settings. Build with [`LockClientConfig::new`] and adjust fields.
#[derive(Debug, Clone)]
pub struct LockClientConfig {
    /// The lock server, `http://host:port`.
    pub base_url: BaseUrl,
    /// Sent as `X-Owner-Id` on every write and as `ownerId` on session open (FR-30).
    pub owner_id: OwnerId,
    /// Session TTL asked for; the server may clamp it down, and the smaller value is used.
    pub session_ttl_ms: u64,
    /// Lease asked for on every acquire and renew.
    pub lock_ttl_ms: u64,
    /// `lock.client.safety-margin`: the local deadline is `TTL × (1 − safety_margin)`,
    /// measured from the instant the request was sent. Strictly between 0 and 1.
    pub safety_margin: f64,
    pub acquire_connect_timeout_ms: u64,
    pub acquire_read_timeout_ms: u64,
    pub acquire_attempts_max: u32,
    pub backoff_ms_min: u64,
    pub backoff_ms_max: u64,
    pub retry_after_ms_max: u64,
    pub heartbeat_connect_timeout_ms: u64,
    pub heartbeat_read_timeout_ms: u64,
    pub heartbeat_tries_max: u32,
    pub renew_connect_timeout_ms: u64,
    pub renew_read_timeout_ms: u64,
    pub renew_retries_max: u32,
    pub release_connect_timeout_ms: u64,
    pub release_read_timeout_ms: u64,
    pub read_connect_timeout_ms: u64,
    pub read_read_timeout_ms: u64,
    pub read_retries_max: u32,
    /// The credential every request presents (C3-extensions E-13); none: no header.
    pub bearer: Option<dlock_rt::http::Bearer>,
}

impl LockClientConfig {
    /// The C3 §3.8 defaults for the lock server at `base_url`, acting as `owner_id`.
    pub fn new(base_url: BaseUrl, owner_id: OwnerId) -> LockClientConfig {
        LockClientConfig {
            base_url,
            owner_id,
            session_ttl_ms: SESSION_TTL_MS_DEFAULT,
            lock_ttl_ms: LOCK_TTL_MS_DEFAULT,
            safety_margin: SAFETY_MARGIN_DEFAULT,
            acquire_connect_timeout_ms: ACQUIRE_CONNECT_TIMEOUT_MS_DEFAULT,
            acquire_read_timeout_ms: ACQUIRE_READ_TIMEOUT_MS_DEFAULT,
            acquire_attempts_max: ACQUIRE_ATTEMPTS_MAX_DEFAULT,
            backoff_ms_min: BACKOFF_MS_MIN_DEFAULT,
            backoff_ms_max: BACKOFF_MS_MAX_DEFAULT,
            retry_after_ms_max: RETRY_AFTER_MS_MAX_DEFAULT,
            heartbeat_connect_timeout_ms: HEARTBEAT_CONNECT_TIMEOUT_MS_DEFAULT,
            heartbeat_read_timeout_ms: HEARTBEAT_READ_TIMEOUT_MS_DEFAULT,
            heartbeat_tries_max: HEARTBEAT_TRIES_MAX_DEFAULT,
            renew_connect_timeout_ms: RENEW_CONNECT_TIMEOUT_MS_DEFAULT,
            renew_read_timeout_ms: RENEW_READ_TIMEOUT_MS_DEFAULT,
            renew_retries_max: RENEW_RETRIES_MAX_DEFAULT,
            release_connect_timeout_ms: RELEASE_CONNECT_TIMEOUT_MS_DEFAULT,
            release_read_timeout_ms: RELEASE_READ_TIMEOUT_MS_DEFAULT,
            read_connect_timeout_ms: READ_CONNECT_TIMEOUT_MS_DEFAULT,
            read_read_timeout_ms: READ_READ_TIMEOUT_MS_DEFAULT,
            read_retries_max: READ_RETRIES_MAX_DEFAULT,
            bearer: None,
        }
    }

    /// Refuses any value outside its documented range, naming the field.
    pub fn validate(&self) -> Result<(), LockClientError> {
        let bad = |what: String| Err(LockClientError::Invalid(what));
        let ttl_in = |v: u64, min: i64, max: i64| i64::try_from(v).is_ok_and(|v| (min..=max).contains(&v));
        if !ttl_in(self.session_ttl_ms, SESSION_TTL_MS_MIN, SESSION_TTL_MS_MAX) {
            return bad(format!(
                "session_ttl_ms = {} is outside {SESSION_TTL_MS_MIN}..={SESSION_TTL_MS_MAX}",
                self.session_ttl_ms
            ));
        }
        if !ttl_in(self.lock_ttl_ms, LOCK_TTL_MS_MIN, LOCK_TTL_MS_MAX) {
            return bad(format!("lock_ttl_ms = {} is outside {LOCK_TTL_MS_MIN}..={LOCK_TTL_MS_MAX}", self.lock_ttl_ms));
        }
        if !(self.safety_margin.is_finite() && self.safety_margin > 0.0 && self.safety_margin < 1.0) {
            return bad(format!("safety_margin = {} must be strictly between 0 and 1", self.safety_margin));
        }
        let timeouts = [
            ("acquire_connect_timeout_ms", self.acquire_connect_timeout_ms),
            ("acquire_read_timeout_ms", self.acquire_read_timeout_ms),
            ("heartbeat_connect_timeout_ms", self.heartbeat_connect_timeout_ms),
            ("heartbeat_read_timeout_ms", self.heartbeat_read_timeout_ms),
            ("renew_connect_timeout_ms", self.renew_connect_timeout_ms),
            ("renew_read_timeout_ms", self.renew_read_timeout_ms),
            ("release_connect_timeout_ms", self.release_connect_timeout_ms),
            ("release_read_timeout_ms", self.release_read_timeout_ms),
            ("read_connect_timeout_ms", self.read_connect_timeout_ms),
            ("read_read_timeout_ms", self.read_read_timeout_ms),
            ("backoff_ms_min", self.backoff_ms_min),
            ("backoff_ms_max", self.backoff_ms_max),
            ("retry_after_ms_max", self.retry_after_ms_max),
        ];
        for (name, v) in timeouts {
            if v == 0 || v > TIMEOUT_MS_CEILING_MAX {
                return bad(format!("{name} = {v} is outside 1..={TIMEOUT_MS_CEILING_MAX}"));
            }
        }
        if self.backoff_ms_min > self.backoff_ms_max {
            return bad(format!(
                "backoff_ms_min = {} exceeds backoff_ms_max = {}",
                self.backoff_ms_min, self.backoff_ms_max
            ));
        }
        let counts = [
            ("acquire_attempts_max", self.acquire_attempts_max, 1),
            ("heartbeat_tries_max", self.heartbeat_tries_max, 1),
            ("renew_retries_max", self.renew_retries_max, 0),
            ("read_retries_max", self.read_retries_max, 0),
        ];
        for (name, v, min) in counts {
            if v < min || v > ATTEMPTS_CEILING_MAX {
                return bad(format!("{name} = {v} is outside {min}..={ATTEMPTS_CEILING_MAX}"));
            }
        }
        Ok(())
    }
}

/// Per-acquire options (C3 L4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AcquireOptions {
    /// Lease to ask for; `None` uses [`LockClientConfig::lock_ttl_ms`].
    pub ttl_ms: Option<u64>,
    /// Server-side wait (`waitMillis`, 0 … 30 000). It must be shorter than the acquire read
    /// budget, or the client would give up first and manufacture an ambiguous acquire.
    pub wait_ms: Option<u64>,
}

impl AcquireOptions {
    pub(crate) fn check(&self, cfg: &LockClientConfig) -> Result<(u64, Option<u64>), LockClientError> {
        let ttl_ms = self.ttl_ms.unwrap_or(cfg.lock_ttl_ms);
        if !i64::try_from(ttl_ms).is_ok_and(|v| (LOCK_TTL_MS_MIN..=LOCK_TTL_MS_MAX).contains(&v)) {
            return Err(LockClientError::Invalid(format!(
                "ttl_ms = {ttl_ms} is outside {LOCK_TTL_MS_MIN}..={LOCK_TTL_MS_MAX}"
            )));
        }
        if let Some(wait_ms) = self.wait_ms {
            let in_range = i64::try_from(wait_ms).is_ok_and(|v| v <= WAIT_MS_MAX);
            if !in_range || wait_ms >= cfg.acquire_read_timeout_ms {
                return Err(LockClientError::Invalid(format!(
                    "wait_ms = {wait_ms} must be at most {WAIT_MS_MAX} and below acquire_read_timeout_ms = {}",
                    cfg.acquire_read_timeout_ms
                )));
            }
        }
        Ok((ttl_ms, self.wait_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> LockClientConfig {
        let base = BaseUrl::parse("http://127.0.0.1:8081").expect("url");
        LockClientConfig::new(base, OwnerId::parse("worker-1").expect("owner"))
    }

    #[test]
    fn defaults_are_the_c3_budgets_and_validate() {
        let c = cfg();
        assert!(c.validate().is_ok());
        assert_eq!((c.acquire_connect_timeout_ms, c.acquire_read_timeout_ms), (500, 2_000));
        assert_eq!((c.heartbeat_connect_timeout_ms, c.heartbeat_read_timeout_ms), (300, 1_000));
        assert_eq!((c.renew_connect_timeout_ms, c.renew_read_timeout_ms, c.renew_retries_max), (500, 2_000, 1));
        assert_eq!((c.release_connect_timeout_ms, c.release_read_timeout_ms), (500, 2_000));
        assert_eq!((c.acquire_attempts_max, c.backoff_ms_min, c.backoff_ms_max), (5, 50, 1_000));
        assert_eq!(c.heartbeat_tries_max, 2);
        assert!((c.safety_margin - 0.30).abs() < f64::EPSILON);
    }

    #[test]
    fn out_of_range_settings_are_refused_by_name() {
        type Edit = fn(&mut LockClientConfig);
        let cases: [(&str, Edit); 7] = [
            ("safety_margin", |c| c.safety_margin = 0.0),
            ("safety_margin", |c| c.safety_margin = 1.0),
            ("safety_margin", |c| c.safety_margin = f64::NAN),
            ("session_ttl_ms", |c| c.session_ttl_ms = 999),
            ("lock_ttl_ms", |c| c.lock_ttl_ms = 60_001),
            ("acquire_attempts_max", |c| c.acquire_attempts_max = 0),
            ("backoff_ms_min", |c| c.backoff_ms_min = 2_000),
        ];
        for (name, edit) in cases {
            let mut c = cfg();
            edit(&mut c);
            match c.validate() {
                Err(LockClientError::Invalid(msg)) => assert!(msg.contains(name), "{name}: {msg}"),
                other => panic!("{name}: expected Invalid, got {other:?}"),
            }
        }
    }

    #[test]
    fn wait_at_or_beyond_the_read_budget_is_refused() {
        let c = cfg();
        let ok = AcquireOptions { ttl_ms: None, wait_ms: Some(1_000) };
        assert_eq!(ok.check(&c).ok(), Some((LOCK_TTL_MS_DEFAULT, Some(1_000))));
        let too_long = AcquireOptions { ttl_ms: None, wait_ms: Some(2_000) };
        assert!(matches!(too_long.check(&c), Err(LockClientError::Invalid(_))));
        let short_lease = AcquireOptions { ttl_ms: Some(10), wait_ms: None };
        assert!(matches!(short_lease.check(&c), Err(LockClientError::Invalid(_))));
    }
}
