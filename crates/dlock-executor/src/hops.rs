//! The executor's three HTTP hops, each with its C3 §3.8 budget and retry rule:
//!
//! | hop | budget | retries |
//! |---|---|---|
//! | claim / post → payment-resource | 500 ms / 3 s | 1, only on 503 or a connect failure (nothing sent); never on a 409 |
//! | submit → rail-proxy | 1 s / rail read timeout + 2 s | 0, ever |
//! | advisory GETs → payment-resource | 300 ms / 1 s | 2 tries |

use std::time::Duration;

use bytes::Bytes;
use dlock_contract::ErrorCode;
use dlock_rt::http::{BaseUrl, ClientError, HttpClient};
use serde_json::Value;

use crate::config::ExecutorConfig;

/// Longest `retryAfterMillis` honoured before the one retry of a claim or post.
pub const WRITE_RETRY_AFTER_MS_MAX: u64 = 1_000;
/// Pause before the retry of an advisory read.
pub const READ_RETRY_PAUSE_MS: u64 = 50;

/// What a hop came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// A 2xx, with its JSON body.
    Ok { status: u16, body: Value },
    /// A non-2xx envelope: its code (when it parsed) and its body.
    Refused { status: u16, code: Option<ErrorCode>, body: Value },
    /// No connection could be opened: nothing was sent.
    Unreachable { cause: String },
    /// The request was sent and its answer lost (a read timeout, a reset): the outcome is
    /// unknown to this caller.
    Lost { cause: String },
}

impl Answer {
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Answer::Refused { code, .. } => *code,
            _ => None,
        }
    }

    fn from(result: Result<dlock_rt::http::ClientResponse, ClientError>) -> Answer {
        match result {
            Ok(r) => {
                let body: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                if (200..300).contains(&r.status) {
                    Answer::Ok { status: r.status, body }
                } else {
                    let code = body.get("code").and_then(|c| serde_json::from_value::<ErrorCode>(c.clone()).ok());
                    Answer::Refused { status: r.status, code, body }
                }
            }
            Err(e) if e.nothing_sent() => Answer::Unreachable { cause: e.to_string() },
            Err(e) => Answer::Lost { cause: e.to_string() },
        }
    }
}

/// The three hops, with their budgets.
#[derive(Debug, Clone)]
pub struct Hops {
    write: HttpClient,
    write_retries_max: u32,
    submit: HttpClient,
    read: HttpClient,
    read_tries_max: u32,
}

impl Hops {
    pub fn new(cfg: &ExecutorConfig) -> Hops {
        Hops {
            write: HttpClient::new(cfg.write_connect_timeout_ms, cfg.write_read_timeout_ms),
            write_retries_max: cfg.write_retries_max,
            submit: HttpClient::new(cfg.submit_connect_timeout_ms, cfg.submit_read_timeout_ms),
            read: HttpClient::new(cfg.read_connect_timeout_ms, cfg.read_read_timeout_ms),
            read_tries_max: cfg.read_tries_max,
        }
    }

    /// A fenced write to the payment-resource (claim or post). Retried once, and only when
    /// nothing was sent or the answer is 503: the same key, token and body replay, so a
    /// retry cannot double the effect. Never on a 409: the world moved on.
    pub async fn write(&self, base: &BaseUrl, path: &str, headers: &[(&str, &str)], body: &Value) -> Answer {
        let bytes = Bytes::from(body.to_string());
        let mut answer = Answer::Unreachable { cause: "not sent".into() };
        for attempt in 0..=self.write_retries_max {
            answer = Answer::from(self.write.send(base, http::Method::POST, path, headers, Some(bytes.clone())).await);
            let retry = match &answer {
                Answer::Unreachable { .. } => true,
                Answer::Refused { status: 503, body, .. } => {
                    let after = body.get("retryAfterMillis").and_then(Value::as_u64).unwrap_or(0);
                    if attempt < self.write_retries_max {
                        dlock_rt::sleep(Duration::from_millis(after.min(WRITE_RETRY_AFTER_MS_MAX))).await;
                    }
                    true
                }
                _ => false,
            };
            if !retry {
                break;
            }
        }
        answer
    }

    /// The one submission to the rail-proxy. Never retried, whatever happens.
    pub async fn submit(&self, base: &BaseUrl, headers: &[(&str, &str)], body: &Value) -> Answer {
        let bytes = Bytes::from(body.to_string());
        Answer::from(self.submit.send(base, http::Method::POST, "/v1/rail/submissions", headers, Some(bytes)).await)
    }

    /// An advisory GET: up to `read_tries_max` tries on any failure (never for a decision).
    pub async fn read(&self, base: &BaseUrl, path: &str) -> Answer {
        let mut answer = Answer::Unreachable { cause: "not sent".into() };
        for attempt in 0..self.read_tries_max {
            if attempt > 0 {
                dlock_rt::sleep(Duration::from_millis(READ_RETRY_PAUSE_MS)).await;
            }
            answer = Answer::from(self.read.send(base, http::Method::GET, path, &[], None).await);
            if matches!(answer, Answer::Ok { .. } | Answer::Refused { status: 400..=499, .. }) {
                break;
            }
        }
        answer
    }
}
