//! The console's calls to the services: advisory `GET`s and the two operator writes (L8
//! revoke; the resolution of a quarantined payout, C3-extensions E-21), each with the
//! session's bearer through `dlock_rt::http::HttpClient`, answered as JSON or as the
//! service's C3 refusal.
//!
//! The console never retries a write: a revoke or a resolution whose answer is lost is shown
//! as unknown, and the operator looks again (L7, the payout) before trying anything else.

use bytes::Bytes;
use dlock_contract::auth::Secret;
use dlock_rt::http::{BaseUrl, Bearer, HttpClient};
use serde_json::Value;

/// Connect budget of every console call, ms.
pub const UPSTREAM_CONNECT_TIMEOUT_MS: u64 = 500;
/// Read budget of every console call, ms.
pub const UPSTREAM_READ_TIMEOUT_MS: u64 = 3_000;

/// Why a call gave no JSON answer. None of these carries a token.
#[derive(Debug, Clone)]
pub enum UpstreamError {
    /// The service could not be reached, or its answer was lost.
    Unreachable(String),
    /// The service refused: its status and the envelope's `code` and `message`.
    Refused { status: u16, code: String, message: String },
    /// The answer was not JSON.
    NotJson(u16),
}

impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamError::Unreachable(e) => write!(f, "the service did not answer: {e}"),
            UpstreamError::Refused { status, code, message } => write!(f, "{status} {code}: {message}"),
            UpstreamError::NotJson(status) => write!(f, "the service answered {status} without JSON"),
        }
    }
}

impl UpstreamError {
    /// The refusal's status, if the service answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            UpstreamError::Refused { status, .. } | UpstreamError::NotJson(status) => Some(*status),
            UpstreamError::Unreachable(_) => None,
        }
    }
}

fn client(token: &Secret) -> HttpClient {
    HttpClient::new(UPSTREAM_CONNECT_TIMEOUT_MS, UPSTREAM_READ_TIMEOUT_MS)
        .without_bearer()
        .with_bearer(Some(Bearer::fixed(token.clone())))
}

fn answer(status: u16, body: &[u8]) -> Result<Value, UpstreamError> {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    match (status, parsed) {
        (200..=299, Some(v)) => Ok(v),
        (200..=299, None) => Err(UpstreamError::NotJson(status)),
        (_, Some(v)) => Err(UpstreamError::Refused {
            status,
            code: v.get("code").and_then(Value::as_str).unwrap_or("UNKNOWN").to_owned(),
            message: v.get("message").and_then(Value::as_str).unwrap_or("").to_owned(),
        }),
        (_, None) => Err(UpstreamError::NotJson(status)),
    }
}

/// `GET base path_and_query` with `token`.
pub async fn get(base: &BaseUrl, path_and_query: &str, token: &Secret) -> Result<Value, UpstreamError> {
    let r = client(token)
        .send(base, http::Method::GET, path_and_query, &[("accept", "application/json")], None)
        .await
        .map_err(|e| UpstreamError::Unreachable(e.to_string()))?;
    answer(r.status, &r.body)
}

/// `POST base path` with a JSON `body`, extra `headers` and `token`; sent once.
pub async fn post(
    base: &BaseUrl,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
    token: &Secret,
) -> Result<Value, UpstreamError> {
    let mut all = vec![("content-type", "application/json"), ("accept", "application/json")];
    all.extend_from_slice(headers);
    let bytes = Bytes::from(serde_json::to_vec(body).unwrap_or_default());
    let r = client(token)
        .send(base, http::Method::POST, path, &all, Some(bytes))
        .await
        .map_err(|e| UpstreamError::Unreachable(e.to_string()))?;
    answer(r.status, &r.body)
}
