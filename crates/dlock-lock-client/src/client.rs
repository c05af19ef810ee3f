//! The entry point: a validated config, one HTTP client per budget, session open, and the
//! advisory read.

use std::sync::Arc;

use dlock_contract::lock::{is_lock_key, LockInfo, SessionOpened};

use crate::config::LockClientConfig;
use crate::error::{LockClientError, Operation};
use crate::now;
use crate::retry::{self, Failure, RetryPolicy, UNAVAILABLE_RETRY_CODES};
use crate::session::Session;
use crate::wire::{self, OpenSessionBody, Transport};

#[derive(Debug)]
pub(crate) struct ClientInner {
    pub(crate) config: LockClientConfig,
    pub(crate) transport: Transport,
}

/// The executor's client of the lock server. Cheap to clone; clones share nothing mutable.
#[derive(Debug, Clone)]
pub struct LockClient {
    inner: Arc<ClientInner>,
}

impl LockClient {
    /// Validates `config` (see [`LockClientConfig::validate`]).
    pub fn new(config: LockClientConfig) -> Result<LockClient, LockClientError> {
        config.validate()?;
        let transport = Transport::new(&config);
        Ok(LockClient { inner: Arc::new(ClientInner { config, transport }) })
    }

    pub fn config(&self) -> &LockClientConfig {
        &self.inner.config
    }

    /// Opens a session (C3 L1) and starts its heartbeat. Retried like an acquire, but only
    /// on `NOT_LEADER` / `NOT_READY` and refused connections. An open whose answer was lost
    /// is [`LockClientError::Ambiguous`]: a session may exist that nobody heartbeats; it
    /// holds no lock and expires after its TTL.
    pub async fn open_session(&self) -> Result<Session, LockClientError> {
        let inner = &*self.inner;
        let cfg = &inner.config;
        let transport = &inner.transport;
        let owner = cfg.owner_id.as_str();
        let body = serde_json::to_vec(&OpenSessionBody { owner_id: owner, ttl_millis: cfg.session_ttl_ms })
            .map_err(|e| LockClientError::Invalid(e.to_string()))?;
        let body = &body[..];
        let path = wire::sessions_path();
        let path = path.as_str();
        let policy = RetryPolicy {
            attempts_max: cfg.acquire_attempts_max,
            backoff_ms_min: cfg.backoff_ms_min,
            backoff_ms_max: cfg.backoff_ms_max,
            retry_after_ms_max: cfg.retry_after_ms_max,
        };
        let (opened, sent_at) = retry::run(policy, |attempt| async move {
            let sent_at = now();
            let answer = transport.call(&transport.acquire, http::Method::POST, path, None, Some(body.to_vec())).await;
            let ok = retry::classify(Operation::OpenSession, attempt, answer, UNAVAILABLE_RETRY_CODES)?;
            let ambiguous = |cause: String| {
                // A 201 was sent: the session exists, but the client cannot trust it.
                Failure::Final(LockClientError::Ambiguous { operation: Operation::OpenSession, cause })
            };
            let opened: SessionOpened =
                serde_json::from_slice(&ok.body).map_err(|e| ambiguous(format!("unreadable session: {e}")))?;
            if opened.owner_id != owner {
                return Err(ambiguous(format!("session names owner {:?}, asked for {owner:?}", opened.owner_id)));
            }
            Ok((opened, sent_at))
        })
        .await?;
        let granted_ms = u64::try_from(opened.ttl_millis).unwrap_or(0).min(cfg.session_ttl_ms);
        if granted_ms == 0 {
            return Err(LockClientError::Protocol {
                operation: Operation::OpenSession,
                cause: format!("session {} granted ttlMillis {}", opened.session_id, opened.ttl_millis),
            });
        }
        Ok(Session::start(self.inner.clone(), opened.session_id, granted_ms, sent_at))
    }

    /// Reads a lock's state (C3 L7). **Advisory**: the lease may change between this answer
    /// and any action; only a fenced write decides (FR-07). `None` when the server has never
    /// seen the key. Retried up to `read_retries_max` times, lost answers included (a read has
    /// no side effect).
    pub async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockClientError> {
        if !is_lock_key(key) {
            return Err(LockClientError::Invalid(format!("lock key {key:?} must be 1 to 128 of [a-zA-Z0-9:._-]")));
        }
        let cfg = &self.inner.config;
        let transport = &self.inner.transport;
        let path = wire::lock_path(key, None);
        let path = path.as_str();
        let policy = RetryPolicy {
            attempts_max: cfg.read_retries_max.saturating_add(1),
            backoff_ms_min: cfg.backoff_ms_min,
            backoff_ms_max: cfg.backoff_ms_max,
            retry_after_ms_max: cfg.retry_after_ms_max,
        };
        retry::run(policy, |attempt| async move {
            let answer = transport.call(&transport.read, http::Method::GET, path, None, None).await;
            let ok = retry::classify_read(Operation::Inspect, attempt, answer)?;
            if ok.not_found {
                return Ok(None);
            }
            serde_json::from_slice::<LockInfo>(&ok.body).map(Some).map_err(|e| {
                Failure::Final(LockClientError::Protocol {
                    operation: Operation::Inspect,
                    cause: format!("unreadable lock info: {e}"),
                })
            })
        })
        .await
    }
}
