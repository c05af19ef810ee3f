//! The client's one, closed error type.
//!
//! Every variant answers C3 §3.2's question — may the identical request be re-sent without
//! risking a duplicate side effect or a lost mutual-exclusion event? — through
//! [`LockClientError::retry_safe`]. A server's verdict is read from the catalogue
//! ([`ErrorCode::retry_safe`]), never guessed from the HTTP status or the message.

use dlock_contract::{ErrorCode, ErrorEnvelope};

use crate::lease::{LossReason, SessionLoss};

/// Which lock-server call an error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    OpenSession,
    Heartbeat,
    CloseSession,
    Acquire,
    Renew,
    Release,
    /// Release + acquire in one call (C3-extensions E-18).
    Rotate,
    Inspect,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::OpenSession => "open_session",
            Operation::Heartbeat => "heartbeat",
            Operation::CloseSession => "close_session",
            Operation::Acquire => "acquire",
            Operation::Renew => "renew",
            Operation::Release => "release",
            Operation::Rotate => "rotate",
            Operation::Inspect => "inspect",
        }
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything a lock-client call can come to besides success.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LockClientError {
    /// The server answered with a C3 envelope. Retry-safety is the code's catalogue verdict.
    #[error("{operation}: the lock server answered {code}: {message} (trace {trace_id})")]
    Server {
        operation: Operation,
        code: ErrorCode,
        message: String,
        retry_after_ms: Option<u64>,
        details: Option<serde_json::Value>,
        trace_id: String,
    },
    /// The acquire budget is spent (every attempt answered `LOCK_CONTENDED`), or the server
    /// itself answered `CONTENTION_EXCEEDED` (FR-28). Retry-safe, but only after
    /// `retry_after_ms` when present: an immediate retry is what causes the throttle.
    #[error("acquire: contention exceeded after {attempts} attempt(s)")]
    ContentionExceeded { attempts: u32, retry_after_ms: Option<u64> },
    /// No connection could be opened: not a byte of the request left this process.
    #[error("{operation}: the lock server is unreachable, nothing was sent: {cause}")]
    Unreachable { operation: Operation, cause: String },
    /// The request may have reached the server and no usable answer came back (timeout,
    /// broken connection, `INTERNAL`, an answer that is not C3). Never retried. For an
    /// acquire the grant may exist, attached to the session: it dies with the session, so the
    /// remedy is to close the session (or let it expire) and open a new one.
    #[error("{operation}: outcome unknown: {cause}")]
    Ambiguous { operation: Operation, cause: String },
    /// A success answer that contradicts the request (wrong key, session or token).
    #[error("{operation}: the answer does not follow C3: {cause}")]
    Protocol { operation: Operation, cause: String },
    /// The grant is no longer held locally; refused before anything was sent.
    #[error("the lease is no longer held: {reason}")]
    LeaseLost { reason: LossReason },
    /// The session is no longer alive; refused before anything was sent.
    #[error("the session is no longer alive: {reason}")]
    SessionLost { reason: SessionLoss },
    /// A caller-supplied value (config, key, option) is out of range; nothing was sent.
    #[error("invalid: {0}")]
    Invalid(String),
}

impl LockClientError {
    /// C3 §3.2's verdict: may the identical request be re-sent by the same caller?
    pub fn retry_safe(&self) -> bool {
        match self {
            LockClientError::Server { code, .. } => code.retry_safe(),
            LockClientError::ContentionExceeded { .. } => true,
            LockClientError::Unreachable { .. } => true,
            LockClientError::Ambiguous { .. }
            | LockClientError::Protocol { .. }
            | LockClientError::LeaseLost { .. }
            | LockClientError::SessionLost { .. }
            | LockClientError::Invalid(_) => false,
        }
    }

    /// The C3 code behind this error, when the server (or the client's own budget, for
    /// `CONTENTION_EXCEEDED`) named one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            LockClientError::Server { code, .. } => Some(*code),
            LockClientError::ContentionExceeded { .. } => Some(ErrorCode::ContentionExceeded),
            _ => None,
        }
    }

    /// How long the server asked the caller to wait before trying again, if it did.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            LockClientError::Server { retry_after_ms, .. }
            | LockClientError::ContentionExceeded { retry_after_ms, .. } => *retry_after_ms,
            _ => None,
        }
    }

    pub(crate) fn from_envelope(operation: Operation, env: ErrorEnvelope) -> LockClientError {
        LockClientError::Server {
            operation,
            code: env.code,
            message: env.message,
            retry_after_ms: env.retry_after_millis,
            details: env.details,
            trace_id: env.trace_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_take_their_verdict_from_the_catalogue() {
        for code in ErrorCode::ALL {
            let e = LockClientError::from_envelope(Operation::Acquire, ErrorEnvelope::new(code, "m", "t"));
            assert_eq!(e.retry_safe(), code.retry_safe(), "{code}");
            assert_eq!(e.code(), Some(code));
        }
    }

    #[test]
    fn ambiguity_and_local_loss_are_never_retry_safe() {
        let never = [
            LockClientError::Ambiguous { operation: Operation::Acquire, cause: "timeout".into() },
            LockClientError::Protocol { operation: Operation::Renew, cause: "token".into() },
            LockClientError::LeaseLost { reason: LossReason::DeadlinePassed },
            LockClientError::SessionLost { reason: SessionLoss::HeartbeatLapsed },
            LockClientError::Invalid("key".into()),
        ];
        for e in never {
            assert!(!e.retry_safe(), "{e}");
        }
        assert!(LockClientError::Unreachable { operation: Operation::Acquire, cause: "refused".into() }.retry_safe());
        let exceeded = LockClientError::ContentionExceeded { attempts: 5, retry_after_ms: Some(100) };
        assert!(exceeded.retry_safe());
        assert_eq!(exceeded.code(), Some(ErrorCode::ContentionExceeded));
        assert_eq!(exceeded.retry_after_ms(), Some(100));
    }
}
