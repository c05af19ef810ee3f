//! The client's one refusal type: everything a payment-resource call can come to besides
//! the contract's success body.
//!
//! Retry-safety (C3 §3.2: may the identical request be re-sent?) is read from the error
//! catalogue ([`ErrorCode::retry_safe`]) for an envelope, never from the HTTP status alone;
//! a lost answer to a write is never retry-safe.

use dlock_contract::{ErrorCode, ErrorEnvelope};
use dlock_rt::http::{ClientError, ClientResponse};
use serde::de::DeserializeOwned;

use crate::config::{WRITE_RETRY_AFTER_MS_MAX, WRITE_RETRY_CODES};

/// Which payment-resource call a refusal came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// P1 `GET /v1/payouts`.
    List,
    /// P4 `GET /v1/payouts/{payoutId}`.
    Payout,
    /// P5 `GET /v1/accounts/{accountId}`.
    Account,
    /// P2 `POST /v1/payouts/{payoutId}/claim`.
    Claim,
    /// P3 `POST /v1/payouts/{payoutId}/post`.
    Post,
    /// P2b `POST /v1/accounts/{accountId}/claims` (C3-extensions E-19).
    ClaimBatch,
    /// P3b `POST /v1/accounts/{accountId}/posts` (C3-extensions E-19).
    PostBatch,
    /// `POST /v1/accounts`.
    CreateAccount,
    /// `POST /v1/payouts`.
    CreatePayout,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::List => "list",
            Operation::Payout => "payout",
            Operation::Account => "account",
            Operation::Claim => "claim",
            Operation::Post => "post",
            Operation::ClaimBatch => "claim_batch",
            Operation::PostBatch => "post_batch",
            Operation::CreateAccount => "create_account",
            Operation::CreatePayout => "create_payout",
        }
    }

    /// Whether the call is an advisory `GET`, which has no side effect to duplicate.
    pub fn is_read(self) -> bool {
        matches!(self, Operation::List | Operation::Payout | Operation::Account)
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything a call can come to besides success.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PaymentRefusal {
    /// The service answered a non-2xx with a C3 envelope.
    #[error("{operation}: HTTP {status} {}: {} (trace {})", .envelope.code, .envelope.message, .envelope.trace_id)]
    Refused { operation: Operation, status: u16, envelope: ErrorEnvelope },
    /// No connection could be opened (or the request could not be formed): not a byte left
    /// this process, so nothing happened.
    #[error("{operation}: nothing was sent: {cause}")]
    NothingSent { operation: Operation, cause: String },
    /// The request may have reached the service and no complete answer came back in the
    /// read budget: for a write the outcome is unknown. Never re-sent.
    #[error("{operation}: sent, and no answer came back: {cause}")]
    NoAnswer { operation: Operation, cause: String },
    /// An answer came back that is neither the contract's success body nor a C3 envelope.
    #[error("{operation}: HTTP {status} does not follow C3: {cause}")]
    Unreadable { operation: Operation, status: u16, cause: String },
}

impl PaymentRefusal {
    pub fn operation(&self) -> Operation {
        match self {
            PaymentRefusal::Refused { operation, .. }
            | PaymentRefusal::NothingSent { operation, .. }
            | PaymentRefusal::NoAnswer { operation, .. }
            | PaymentRefusal::Unreadable { operation, .. } => *operation,
        }
    }

    /// The envelope's code, when the service sent one.
    pub fn code(&self) -> Option<ErrorCode> {
        self.envelope().map(|e| e.code)
    }

    pub fn envelope(&self) -> Option<&ErrorEnvelope> {
        match self {
            PaymentRefusal::Refused { envelope, .. } => Some(envelope),
            _ => None,
        }
    }

    /// The envelope's `details`, when there are any.
    pub fn details(&self) -> Option<&serde_json::Value> {
        self.envelope().and_then(|e| e.details.as_ref())
    }

    /// The `FENCED_OUT` body (C3 §3.4: both tokens, where, whose), when this refusal is one
    /// and its details read as one.
    pub fn fenced_out(&self) -> Option<dlock_contract::fenced::FencedOut> {
        let e = self.envelope().filter(|e| e.code == dlock_contract::ErrorCode::FencedOut)?;
        e.details.as_ref().and_then(dlock_contract::fenced::FencedOut::from_details)
    }

    /// The HTTP status of the answer, when one arrived.
    pub fn status(&self) -> Option<u16> {
        match self {
            PaymentRefusal::Refused { status, .. } | PaymentRefusal::Unreadable { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// C3 §3.2's verdict: may the identical request be re-sent? An envelope's verdict is its
    /// code's catalogue row; nothing sent is safe; a lost or unreadable answer is safe only
    /// for an advisory read.
    pub fn retry_safe(&self) -> bool {
        match self {
            PaymentRefusal::Refused { envelope, .. } => envelope.code.retry_safe(),
            PaymentRefusal::NothingSent { .. } => true,
            PaymentRefusal::NoAnswer { operation, .. } | PaymentRefusal::Unreadable { operation, .. } => {
                operation.is_read()
            }
        }
    }

    /// Whether a write may have taken effect without this caller learning how: a lost
    /// answer, an unreadable one, or `INTERNAL` ("whether a side effect happened is
    /// unknown"). Always `false` for a read.
    pub fn outcome_unknown(&self) -> bool {
        if self.operation().is_read() {
            return false;
        }
        match self {
            PaymentRefusal::NoAnswer { .. } | PaymentRefusal::Unreadable { .. } => true,
            PaymentRefusal::Refused { envelope, .. } => envelope.code == ErrorCode::Internal,
            PaymentRefusal::NothingSent { .. } => false,
        }
    }

    /// The pause before re-sending a write after this refusal, or `None` when it must not be
    /// re-sent (C3 §3.8: "0 on any 409; 1 retry only on 503 or a connect failure").
    pub fn write_retry_pause_ms(&self) -> Option<u64> {
        let pause = match self {
            PaymentRefusal::NothingSent { .. } => Some(0),
            PaymentRefusal::Refused { status: 503, envelope, .. }
                if WRITE_RETRY_CODES.contains(&envelope.code) && envelope.code.retry_safe() && envelope.retry_safe =>
            {
                Some(envelope.retry_after_millis.unwrap_or(0).min(WRITE_RETRY_AFTER_MS_MAX))
            }
            _ => None,
        };
        assert!(pause.is_none() || self.retry_safe(), "only a retry-safe refusal is re-sent");
        pause
    }

    /// Whether an advisory read is tried again after this refusal: on anything but a 2xx or
    /// a 4xx answer.
    pub fn read_retries(&self) -> bool {
        self.operation().is_read() && self.status().is_none_or(|s| !(200..500).contains(&s))
    }
}

/// Reads one request's fate as the answer type `T` or a refusal.
pub(crate) fn decode<T: DeserializeOwned>(
    operation: Operation,
    sent: Result<ClientResponse, ClientError>,
) -> Result<T, PaymentRefusal> {
    let r = match sent {
        Ok(r) => r,
        Err(e) if e.nothing_sent() => return Err(PaymentRefusal::NothingSent { operation, cause: e.to_string() }),
        Err(e) => return Err(PaymentRefusal::NoAnswer { operation, cause: e.to_string() }),
    };
    let status = r.status;
    if (200..300).contains(&status) {
        return serde_json::from_slice::<T>(&r.body).map_err(|e| PaymentRefusal::Unreadable {
            operation,
            status,
            cause: e.to_string(),
        });
    }
    match serde_json::from_slice::<ErrorEnvelope>(&r.body) {
        Ok(envelope) => Err(PaymentRefusal::Refused { operation, status, envelope }),
        Err(e) => Err(PaymentRefusal::Unreadable { operation, status, cause: format!("no C3 envelope: {e}") }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(operation: Operation, code: ErrorCode, wire_says_safe: bool) -> PaymentRefusal {
        let mut envelope = ErrorEnvelope::new(code, "m", "t");
        envelope.retry_safe = wire_says_safe;
        PaymentRefusal::Refused { operation, status: code.http_status(), envelope }
    }

    #[test]
    fn an_envelope_takes_its_retry_verdict_from_the_catalogue_not_the_wire() {
        for code in ErrorCode::ALL {
            for wire in [false, true] {
                let r = refused(Operation::Claim, code, wire);
                assert_eq!(r.retry_safe(), code.retry_safe(), "{code}");
                assert_eq!(r.code(), Some(code));
            }
        }
    }

    #[test]
    fn no_non_retry_safe_code_and_no_lost_answer_is_ever_re_sent() {
        for code in ErrorCode::ALL.into_iter().filter(|c| !c.retry_safe()) {
            for wire in [false, true] {
                assert_eq!(refused(Operation::Claim, code, wire).write_retry_pause_ms(), None, "{code}");
            }
        }
        for code in [ErrorCode::LockContended, ErrorCode::ContentionExceeded] {
            assert_eq!(refused(Operation::Post, code, true).write_retry_pause_ms(), None, "{code}: not a 503");
        }
        assert_eq!(refused(Operation::Claim, ErrorCode::NotReady, false).write_retry_pause_ms(), None);
        let lost = PaymentRefusal::NoAnswer { operation: Operation::Claim, cause: "timeout".into() };
        assert_eq!(lost.write_retry_pause_ms(), None);
        assert!(!lost.retry_safe() && lost.outcome_unknown());
        let garbled = PaymentRefusal::Unreadable { operation: Operation::Post, status: 503, cause: "<html>".into() };
        assert_eq!(garbled.write_retry_pause_ms(), None);
        assert!(refused(Operation::Post, ErrorCode::Internal, false).outcome_unknown());
    }

    #[test]
    fn nothing_sent_and_retry_safe_503s_are_re_sent_with_a_bounded_pause() {
        let unsent = PaymentRefusal::NothingSent { operation: Operation::Claim, cause: "refused".into() };
        assert_eq!(unsent.write_retry_pause_ms(), Some(0));
        assert!(unsent.retry_safe() && !unsent.outcome_unknown());
        let mut env = ErrorEnvelope::new(ErrorCode::NotReady, "m", "t");
        env.retry_after_millis = Some(250);
        let r = PaymentRefusal::Refused { operation: Operation::Post, status: 503, envelope: env.clone() };
        assert_eq!(r.write_retry_pause_ms(), Some(250));
        env.retry_after_millis = Some(60_000);
        let r = PaymentRefusal::Refused { operation: Operation::Post, status: 503, envelope: env };
        assert_eq!(r.write_retry_pause_ms(), Some(WRITE_RETRY_AFTER_MS_MAX));
    }

    #[test]
    fn reads_retry_anything_but_a_2xx_or_4xx_answer() {
        assert!(PaymentRefusal::NoAnswer { operation: Operation::Payout, cause: "t".into() }.read_retries());
        assert!(refused(Operation::List, ErrorCode::NotReady, true).read_retries());
        assert!(refused(Operation::Payout, ErrorCode::Internal, false).read_retries());
        assert!(!refused(Operation::Payout, ErrorCode::NotFound, false).read_retries());
        let garbled = PaymentRefusal::Unreadable { operation: Operation::Account, status: 200, cause: "x".into() };
        assert!(!garbled.read_retries());
        assert!(!PaymentRefusal::NoAnswer { operation: Operation::Claim, cause: "t".into() }.read_retries());
    }

    #[test]
    fn answers_decode_as_body_envelope_or_unreadable() {
        let resp = |status: u16, body: &str| {
            Ok(ClientResponse { status, headers: http::HeaderMap::new(), body: bytes::Bytes::from(body.to_owned()) })
        };
        let ok: Result<serde_json::Value, _> = decode(Operation::Claim, resp(200, r#"{"a":1}"#));
        assert_eq!(ok, Ok(serde_json::json!({"a": 1})));
        let env = serde_json::to_string(&ErrorEnvelope::new(ErrorCode::FencedOut, "m", "t")).expect("ser");
        let fenced: Result<serde_json::Value, _> = decode(Operation::Claim, resp(409, &env));
        assert_eq!(fenced.err().and_then(|r| r.code()), Some(ErrorCode::FencedOut));
        let unknown = r#"{"code":"SOMETHING_NEW","message":"m","retrySafe":true,"traceId":"t"}"#;
        let r: Result<serde_json::Value, _> = decode(Operation::Claim, resp(409, unknown));
        assert!(matches!(r, Err(PaymentRefusal::Unreadable { status: 409, .. })), "{r:?}");
        let r: Result<dlock_contract::payment::ClaimAck, _> = decode(Operation::Claim, resp(200, "{}"));
        assert!(matches!(r, Err(PaymentRefusal::Unreadable { status: 200, .. })), "{r:?}");
        let r: Result<serde_json::Value, _> = decode(Operation::Claim, Err(ClientError::Connect("refused".into())));
        assert!(matches!(r, Err(PaymentRefusal::NothingSent { .. })));
        let r: Result<serde_json::Value, _> = decode(Operation::Claim, Err(ClientError::Timeout(3_000)));
        assert!(matches!(r, Err(PaymentRefusal::NoAnswer { .. })));
    }
}
