//! The lock server's HTTP surface as the client sends it (C3 §3.3): request bodies, paths,
//! headers, and the first reading of an answer (success, C3 envelope, or neither).
//!
//! One connection per request ([`HttpClient`]) for acquire, renew and reads, so a
//! request's fate is never blurred by a pool: `Connect` means nothing left this process;
//! `Timeout` and `Broken` mean it may have (a lost acquire answer resets the session).
//! Release and heartbeat keep their connections alive ([`HttpClient::with_keep_alive`],
//! issue 14 cut 9): a lost answer of either is already safe (a release is never retried and
//! the lease expires; a missed heartbeat is followed by the next one), and a failure on a
//! reused connection is never "nothing sent", so no retry rule changes.

use bytes::Bytes;
use dlock_contract::{ErrorEnvelope, FencingToken, OwnerId, CONTENT_TYPE_JSON, HEADER_FENCING_TOKEN, HEADER_OWNER_ID};
use dlock_rt::http::{BaseUrl, ClientError, HttpClient};
use serde::Serialize;
use uuid::Uuid;

use crate::config::LockClientConfig;

/// L1 body.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OpenSessionBody<'a> {
    pub owner_id: &'a str,
    pub ttl_millis: u64,
}

/// L4 body.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AcquireBody {
    pub session_id: Uuid,
    pub ttl_millis: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_millis: Option<u64>,
}

/// L5 body.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RenewBody {
    pub session_id: Uuid,
    pub ttl_millis: u64,
}

/// L6 body: `sessionId` is carried for attribution only; the predicate is (key, token).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReleaseBody {
    pub session_id: Uuid,
}

pub(crate) fn sessions_path() -> String {
    "/v1/sessions".to_owned()
}

pub(crate) fn heartbeat_path(session_id: Uuid) -> String {
    format!("/v1/sessions/{session_id}/heartbeat")
}

pub(crate) fn session_path(session_id: Uuid) -> String {
    format!("/v1/sessions/{session_id}")
}

/// `key` has been checked with `dlock_contract::lock::is_lock_key`: path-safe as is.
pub(crate) fn lock_path(key: &str, action: Option<&str>) -> String {
    match action {
        Some(action) => format!("/v1/locks/{key}/{action}"),
        None => format!("/v1/locks/{key}"),
    }
}

/// The first reading of a complete answer.
#[derive(Debug)]
pub(crate) enum Answer {
    /// 2xx; the body is for the caller to parse.
    Success { body: Bytes },
    /// Non-2xx with a C3 envelope.
    Refused { status: u16, envelope: ErrorEnvelope },
    /// Non-2xx without a C3 envelope (a gateway page, an unknown code).
    Garbled { status: u16, cause: String },
}

fn read_answer(status: u16, body: Bytes) -> Answer {
    if (200..300).contains(&status) {
        return Answer::Success { body };
    }
    match serde_json::from_slice::<ErrorEnvelope>(&body) {
        Ok(envelope) => Answer::Refused { status, envelope },
        Err(e) => Answer::Garbled { status, cause: e.to_string() },
    }
}

/// One HTTP client per C3 §3.8 budget, and what every request carries.
#[derive(Debug)]
pub(crate) struct Transport {
    base: BaseUrl,
    owner: OwnerId,
    pub acquire: HttpClient,
    pub heartbeat: HttpClient,
    pub renew: HttpClient,
    pub release: HttpClient,
    pub read: HttpClient,
}

impl Transport {
    pub(crate) fn new(cfg: &LockClientConfig) -> Transport {
        // The one place the credential (E-13) is attached.
        let budget = |connect, read| HttpClient::new(connect, read).with_bearer(cfg.bearer.clone());
        Transport {
            base: cfg.base_url.clone(),
            owner: cfg.owner_id.clone(),
            acquire: budget(cfg.acquire_connect_timeout_ms, cfg.acquire_read_timeout_ms),
            heartbeat: budget(cfg.heartbeat_connect_timeout_ms, cfg.heartbeat_read_timeout_ms).with_keep_alive(),
            renew: budget(cfg.renew_connect_timeout_ms, cfg.renew_read_timeout_ms),
            release: budget(cfg.release_connect_timeout_ms, cfg.release_read_timeout_ms).with_keep_alive(),
            read: budget(cfg.read_connect_timeout_ms, cfg.read_read_timeout_ms),
        }
    }

    /// Sends one request with `X-Owner-Id` (every write carries it, C3 §3.1) and, when
    /// given, `X-Fencing-Token`.
    pub(crate) async fn call(
        &self,
        budget: &HttpClient,
        method: http::Method,
        path: &str,
        token: Option<FencingToken>,
        body: Option<Vec<u8>>,
    ) -> Result<Answer, ClientError> {
        let token_text = token.map(|t| t.to_string());
        let mut headers: Vec<(&str, &str)> =
            vec![(HEADER_OWNER_ID, self.owner.as_str()), ("accept", CONTENT_TYPE_JSON)];
        if body.is_some() {
            headers.push(("content-type", CONTENT_TYPE_JSON));
        }
        if let Some(t) = token_text.as_deref() {
            headers.push((HEADER_FENCING_TOKEN, t));
        }
        let resp = budget.send(&self.base, method, path, &headers, body.map(Bytes::from)).await?;
        Ok(read_answer(resp.status, resp.body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_contract::ErrorCode;

    /// Cut 9: only release and heartbeat keep connections alive; acquire (a lost answer
    /// resets the session), renew and reads open one per request.
    #[test]
    fn only_release_and_heartbeat_keep_connections_alive() {
        let url = dlock_rt::http::BaseUrl::parse("http://127.0.0.1:1").expect("url");
        let cfg = LockClientConfig::new(url, OwnerId::parse("w").expect("owner"));
        let t = Transport::new(&cfg);
        assert!(t.release.keeps_alive() && t.heartbeat.keeps_alive());
        assert!(!t.acquire.keeps_alive() && !t.renew.keeps_alive() && !t.read.keeps_alive());
    }

    #[test]
    fn bodies_use_the_c3_field_names() {
        let id = Uuid::nil();
        let acquire = serde_json::to_value(AcquireBody { session_id: id, ttl_millis: 5_000, wait_millis: None })
            .expect("serialize");
        assert_eq!(acquire, serde_json::json!({"sessionId": id, "ttlMillis": 5_000}));
        let open = serde_json::to_value(OpenSessionBody { owner_id: "w", ttl_millis: 1_000 }).expect("serialize");
        assert_eq!(open, serde_json::json!({"ownerId": "w", "ttlMillis": 1_000}));
        let release = serde_json::to_value(ReleaseBody { session_id: id }).expect("serialize");
        assert_eq!(release, serde_json::json!({"sessionId": id}));
    }

    #[test]
    fn answers_are_success_envelope_or_garbled() {
        assert!(matches!(read_answer(204, Bytes::new()), Answer::Success { .. }));
        let env = serde_json::to_vec(&ErrorEnvelope::new(ErrorCode::FencedOut, "m", "t")).expect("serialize");
        match read_answer(409, Bytes::from(env)) {
            Answer::Refused { status: 409, envelope } => assert_eq!(envelope.code, ErrorCode::FencedOut),
            other => panic!("{other:?}"),
        }
        assert!(matches!(read_answer(502, Bytes::from_static(b"<html>")), Answer::Garbled { status: 502, .. }));
        let unknown = br#"{"code":"SOMETHING_NEW","message":"m","retrySafe":true,"traceId":"t"}"#;
        assert!(matches!(read_answer(409, Bytes::from_static(unknown)), Answer::Garbled { .. }));
    }
}
