//! Server-side sessions: who is signed in, with which token, until when.
//!
//! A session is created by a successful login and holds the bearer token the console calls
//! the services with (the services authorize every call again), the role the token had at
//! login, and a per-session CSRF token. The browser holds only a random session id in the
//! `dlock_console_session` cookie.
//!
//! Invariants:
//! - At most [`SESSIONS_MAX`] sessions exist; a login beyond that (after expired sessions
//!   are dropped) is refused, never made by evicting someone else.
//! - A session ends [`Sessions::ttl`] after its login, measured on the monotonic clock
//!   (`dlock_rt::Instant`), or at logout. An ended session is gone: its cookie is refused.
//! - The store is keyed by the SHA-256 digest of the session id, so a lookup's timing says
//!   nothing about other ids and memory holds no cookie value.
//! - Nothing here prints a token, a session id or a CSRF token (`Debug` is hand-written).
//!
//! Every method takes `now` from the caller, so the rules are plain functions of time.

use std::collections::BTreeMap;
use std::sync::Mutex;

use dlock_contract::auth::{digest, hex, token_eq, Role, Secret};
use dlock_rt::{Duration, Instant};

/// Most sessions one console holds at once.
pub const SESSIONS_MAX: usize = 256;
/// Random bytes in a session id and in a CSRF token (hex-encoded: twice as many characters).
pub const SESSION_ID_BYTES: usize = 32;

/// What a request learns from its session.
#[derive(Clone)]
pub struct SessionView {
    pub token: Secret,
    pub role: Role,
    pub csrf: String,
}

impl std::fmt::Debug for SessionView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionView").field("role", &self.role).finish_non_exhaustive()
    }
}

struct Session {
    view: SessionView,
    expires: Instant,
}

/// Why a login could not make a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionsFull;

/// The console's sessions.
pub struct Sessions {
    ttl: Duration,
    by_digest: Mutex<BTreeMap<[u8; 32], Session>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").field("ttl", &self.ttl).finish_non_exhaustive()
    }
}

fn fresh_secret() -> String {
    hex(&dlock_rt::rand::secret_bytes::<SESSION_ID_BYTES>())
}

impl Sessions {
    pub fn new(ttl: Duration) -> Sessions {
        Sessions { ttl, by_digest: Mutex::new(BTreeMap::new()) }
    }

    /// How long a session lives after its login.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<[u8; 32], Session>> {
        self.by_digest.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new session for `token` (of `role`): its id (for the cookie) and its CSRF token.
    pub fn create(&self, token: Secret, role: Role, now: Instant) -> Result<(String, String), SessionsFull> {
        let mut map = self.lock();
        map.retain(|_, s| s.expires > now);
        if map.len() >= SESSIONS_MAX {
            return Err(SessionsFull);
        }
        let id = fresh_secret();
        let csrf = fresh_secret();
        let view = SessionView { token, role, csrf: csrf.clone() };
        map.insert(digest(id.as_bytes()), Session { view, expires: now + self.ttl });
        assert!(map.len() <= SESSIONS_MAX, "the session store is bounded");
        Ok((id, csrf))
    }

    /// The live session `id` names, if any (an expired one is dropped).
    pub fn get(&self, id: &str, now: Instant) -> Option<SessionView> {
        let key = digest(id.as_bytes());
        let mut map = self.lock();
        match map.get(&key) {
            Some(s) if s.expires > now => Some(s.view.clone()),
            Some(_) => {
                map.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Ends session `id`; whether it existed.
    pub fn delete(&self, id: &str) -> bool {
        self.lock().remove(&digest(id.as_bytes())).is_some()
    }

    /// Sessions held now (expired ones not yet dropped included).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether `presented` is the session's CSRF token (compared without an early exit).
pub fn csrf_matches(session: &SessionView, presented: Option<&str>) -> bool {
    match presented {
        Some(p) if !p.is_empty() => token_eq(p.as_bytes(), session.csrf.as_bytes()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok() -> Secret {
        Secret::new("operator-token-000000000001")
    }

    #[test]
    fn a_session_expires_after_its_ttl_on_the_monotonic_clock() {
        let s = Sessions::new(Duration::from_millis(1_000));
        let t0 = dlock_rt::Clock::system().now();
        let (id, csrf) = s.create(tok(), Role::Operator, t0).expect("room");
        let v = s.get(&id, t0 + Duration::from_millis(999)).expect("live");
        assert!(csrf_matches(&v, Some(&csrf)));
        assert!(s.get(&id, t0 + Duration::from_millis(1_000)).is_none(), "expired at its ttl");
        assert!(s.is_empty(), "an expired session is dropped");
    }

    #[test]
    fn the_store_refuses_a_login_beyond_its_bound_until_a_session_expires() {
        let s = Sessions::new(Duration::from_millis(1_000));
        let t0 = dlock_rt::Clock::system().now();
        for _ in 0..SESSIONS_MAX {
            s.create(tok(), Role::Reader, t0).expect("room");
        }
        assert_eq!(s.create(tok(), Role::Reader, t0), Err(SessionsFull));
        assert!(s.create(tok(), Role::Reader, t0 + Duration::from_millis(1_000)).is_ok(), "expired ones make room");
    }

    #[test]
    fn a_deleted_session_is_gone_and_ids_and_csrf_tokens_differ() {
        let s = Sessions::new(Duration::from_millis(60_000));
        let t0 = dlock_rt::Clock::system().now();
        let (a, ca) = s.create(tok(), Role::Reader, t0).expect("room");
        let (b, cb) = s.create(tok(), Role::Reader, t0).expect("room");
        assert_ne!(a, b);
        assert_ne!(ca, cb);
        assert_eq!(a.len(), SESSION_ID_BYTES * 2);
        assert!(s.delete(&a));
        assert!(s.get(&a, t0).is_none());
        assert!(s.get(&b, t0).is_some());
    }

    #[test]
    fn a_missing_empty_or_wrong_csrf_token_does_not_match() {
        let s = Sessions::new(Duration::from_millis(60_000));
        let t0 = dlock_rt::Clock::system().now();
        let (id, csrf) = s.create(tok(), Role::Operator, t0).expect("room");
        let v = s.get(&id, t0).expect("live");
        assert!(!csrf_matches(&v, None));
        assert!(!csrf_matches(&v, Some("")));
        assert!(!csrf_matches(&v, Some(&csrf[1..])));
        assert!(csrf_matches(&v, Some(&csrf)));
        assert!(!format!("{v:?}").contains(&csrf));
    }
}
