//! The error-code catalogue (C3 §3.2) and the error envelope (C3 §3.1).
//!
//! "Retry-safe" answers one question: may the identical request be re-sent by the same
//! caller with the same token without risking a duplicate side effect or a lost
//! mutual-exclusion event? It is *not* "was the error transient".
//!
//! The first fifteen codes are C3's. The rest are transport-level codes C3 does not name
//! but that every HTTP service must answer (unknown route, wrong method, oversized body,
//! wrong content type, not ready, internal fault); `docs/contracts/C3-extensions.md`
//! records why each exists and its verdict.

use serde::{Deserialize, Serialize};

/// A stable, machine-readable error identifier. Alerts filter on this, never on `message`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    LockContended,
    ContentionExceeded,
    NotLeader,
    LockLost,
    SessionUnknown,
    SessionExpired,
    InvalidToken,
    FencedOut,
    PayoutNotClaimable,
    DuplicateSubmission,
    InsufficientFunds,
    IdempotencyConflict,
    RailUnavailable,
    RailAmbiguous,
    ValidationFailed,
    // Transport-level extensions (not in C3 §3.2; see C3-extensions.md).
    NotFound,
    MethodNotAllowed,
    PayloadTooLarge,
    UnsupportedMediaType,
    NotReady,
    Internal,
    HeadersTooLarge,
    Unauthenticated,
    Forbidden,
}

/// Where a code is defined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A row of the C3 §3.2 table.
    C3,
    /// A transport-level code added by dlock (`docs/contracts/C3-extensions.md`).
    Extension,
}

/// One row of the catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorSpec {
    pub code: ErrorCode,
    pub http_status: u16,
    pub retry_safe: bool,
    /// Whether the envelope for this code carries `retryAfterMillis` (C3 §3.1).
    pub carries_retry_after: bool,
    pub origin: Origin,
    pub meaning: &'static str,
}

const fn row(
    code: ErrorCode,
    http_status: u16,
    retry_safe: bool,
    carries_retry_after: bool,
    origin: Origin,
    meaning: &'static str,
) -> ErrorSpec {
    ErrorSpec { code, http_status, retry_safe, carries_retry_after, origin, meaning }
}

/// The catalogue: the one place where status and retry-safety are written down.
pub const CATALOGUE: &[ErrorSpec] = &[
    row(
        ErrorCode::LockContended,
        409,
        true,
        true,
        Origin::C3,
        "Lock currently held by another owner; lease not yet expired.",
    ),
    row(
        ErrorCode::ContentionExceeded,
        429,
        true,
        true,
        Origin::C3,
        "Retry budget for this key exhausted, or the waiter queue is over its cap.",
    ),
    row(
        ErrorCode::NotLeader,
        503,
        true,
        true,
        Origin::C3,
        "This replica cannot currently guarantee the backend's ordering.",
    ),
    row(
        ErrorCode::LockLost,
        409,
        false,
        false,
        Origin::C3,
        "The named grant expired or was revoked; the caller is no longer the holder.",
    ),
    row(
        ErrorCode::SessionUnknown,
        404,
        false,
        false,
        Origin::C3,
        "No such session: it never existed or was garbage-collected.",
    ),
    row(
        ErrorCode::SessionExpired,
        410,
        false,
        false,
        Origin::C3,
        "The session existed, its heartbeat lapsed, and its locks were released.",
    ),
    row(
        ErrorCode::InvalidToken,
        400,
        false,
        false,
        Origin::C3,
        "X-Fencing-Token absent, non-numeric, <= 0, or overflowing int64.",
    ),
    row(
        ErrorCode::FencedOut,
        409,
        false,
        false,
        Origin::C3,
        "The presented token did not exceed the stored fence; a newer holder exists.",
    ),
    row(
        ErrorCode::PayoutNotClaimable,
        409,
        false,
        false,
        Origin::C3,
        "The payout is not in a state this transition allows.",
    ),
    row(
        ErrorCode::DuplicateSubmission,
        409,
        false,
        false,
        Origin::C3,
        "The proxy already holds a submission record for this payout.",
    ),
    row(
        ErrorCode::InsufficientFunds,
        422,
        false,
        false,
        Origin::C3,
        "The balance would go negative; the payout fails without a rail call.",
    ),
    row(
        ErrorCode::IdempotencyConflict,
        422,
        false,
        false,
        Origin::C3,
        "Same X-Idempotency-Key, materially different body.",
    ),
    row(
        ErrorCode::RailUnavailable,
        503,
        true,
        true,
        Origin::C3,
        "The rail was not reached and nothing was presented to it.",
    ),
    row(
        ErrorCode::RailAmbiguous,
        409,
        false,
        false,
        Origin::C3,
        "An attempt was forwarded and its outcome is unknown.",
    ),
    row(
        ErrorCode::ValidationFailed,
        400,
        false,
        false,
        Origin::C3,
        "Schema or constraint violation; see details.fields.",
    ),
    row(ErrorCode::NotFound, 404, false, false, Origin::Extension, "No such route or resource."),
    row(
        ErrorCode::MethodNotAllowed,
        405,
        false,
        false,
        Origin::Extension,
        "The route exists but not with this method.",
    ),
    row(
        ErrorCode::PayloadTooLarge,
        413,
        false,
        false,
        Origin::Extension,
        "The request body exceeds the service's named size limit.",
    ),
    row(
        ErrorCode::UnsupportedMediaType,
        415,
        false,
        false,
        Origin::Extension,
        "The request body is not declared as application/json.",
    ),
    row(
        ErrorCode::NotReady,
        503,
        true,
        true,
        Origin::Extension,
        "A dependency of this service is unreachable; nothing was attempted.",
    ),
    row(
        ErrorCode::Internal,
        500,
        false,
        false,
        Origin::Extension,
        "An unexpected fault; whether a side effect happened is unknown.",
    ),
    row(
        ErrorCode::HeadersTooLarge,
        431,
        false,
        false,
        Origin::Extension,
        "The request's header section exceeds the service's named limit (http.header-bytes-max).",
    ),
    row(
        ErrorCode::Unauthenticated,
        401,
        false,
        false,
        Origin::Extension,
        "No credential, or one this service does not know (E-13); fix the credential, do not resend.",
    ),
    row(
        ErrorCode::Forbidden,
        403,
        false,
        false,
        Origin::Extension,
        "The credential's role may not call this endpoint, or it is not bound to the owner id it names, or to the owner of the session or grant the write addresses (E-13, E-9).",
    ),
];

impl ErrorCode {
    /// Every code, in catalogue order.
    pub const ALL: [ErrorCode; 24] = [
        ErrorCode::LockContended,
        ErrorCode::ContentionExceeded,
        ErrorCode::NotLeader,
        ErrorCode::LockLost,
        ErrorCode::SessionUnknown,
        ErrorCode::SessionExpired,
        ErrorCode::InvalidToken,
        ErrorCode::FencedOut,
        ErrorCode::PayoutNotClaimable,
        ErrorCode::DuplicateSubmission,
        ErrorCode::InsufficientFunds,
        ErrorCode::IdempotencyConflict,
        ErrorCode::RailUnavailable,
        ErrorCode::RailAmbiguous,
        ErrorCode::ValidationFailed,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::PayloadTooLarge,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::NotReady,
        ErrorCode::Internal,
        ErrorCode::HeadersTooLarge,
        ErrorCode::Unauthenticated,
        ErrorCode::Forbidden,
    ];

    /// This code's catalogue row.
    pub fn spec(self) -> &'static ErrorSpec {
        // The catalogue is ordered exactly as the enum; `catalogue_is_in_enum_order` proves it.
        &CATALOGUE[self as usize]
    }

    pub fn http_status(self) -> u16 {
        self.spec().http_status
    }

    pub fn retry_safe(self) -> bool {
        self.spec().retry_safe
    }

    /// The wire spelling, e.g. `FENCED_OUT`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::LockContended => "LOCK_CONTENDED",
            ErrorCode::ContentionExceeded => "CONTENTION_EXCEEDED",
            ErrorCode::NotLeader => "NOT_LEADER",
            ErrorCode::LockLost => "LOCK_LOST",
            ErrorCode::SessionUnknown => "SESSION_UNKNOWN",
            ErrorCode::SessionExpired => "SESSION_EXPIRED",
            ErrorCode::InvalidToken => "INVALID_TOKEN",
            ErrorCode::FencedOut => "FENCED_OUT",
            ErrorCode::PayoutNotClaimable => "PAYOUT_NOT_CLAIMABLE",
            ErrorCode::DuplicateSubmission => "DUPLICATE_SUBMISSION",
            ErrorCode::InsufficientFunds => "INSUFFICIENT_FUNDS",
            ErrorCode::IdempotencyConflict => "IDEMPOTENCY_CONFLICT",
            ErrorCode::RailUnavailable => "RAIL_UNAVAILABLE",
            ErrorCode::RailAmbiguous => "RAIL_AMBIGUOUS",
            ErrorCode::ValidationFailed => "VALIDATION_FAILED",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            ErrorCode::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            ErrorCode::UnsupportedMediaType => "UNSUPPORTED_MEDIA_TYPE",
            ErrorCode::NotReady => "NOT_READY",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::HeadersTooLarge => "HEADERS_TOO_LARGE",
            ErrorCode::Unauthenticated => "UNAUTHENTICATED",
            ErrorCode::Forbidden => "FORBIDDEN",
        }
    }

    /// The code a bare HTTP status maps to when a layer below the handlers (router,
    /// extractor, body limit) produced the response.
    pub fn for_status(status: u16) -> ErrorCode {
        match status {
            400 | 422 => ErrorCode::ValidationFailed,
            401 => ErrorCode::Unauthenticated,
            403 => ErrorCode::Forbidden,
            404 => ErrorCode::NotFound,
            405 => ErrorCode::MethodNotAllowed,
            413 => ErrorCode::PayloadTooLarge,
            415 => ErrorCode::UnsupportedMediaType,
            431 => ErrorCode::HeadersTooLarge,
            503 => ErrorCode::NotReady,
            _ => ErrorCode::Internal,
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One field-level problem in a `VALIDATION_FAILED` body (`details.fields[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FieldError {
    pub field: String,
    pub problem: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        FieldError { field: field.into(), problem: problem.into() }
    }
}

/// The only error body on the wire (C3 §3.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ErrorEnvelope {
    pub code: ErrorCode,
    pub message: String,
    pub retry_safe: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_millis: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Value>,
    pub trace_id: String,
}

impl ErrorEnvelope {
    /// Builds an envelope whose `retrySafe` comes from the catalogue, never from the caller.
    pub fn new(code: ErrorCode, message: impl Into<String>, trace_id: impl Into<String>) -> Self {
        ErrorEnvelope {
            code,
            message: message.into(),
            retry_safe: code.retry_safe(),
            retry_after_millis: None,
            details: None,
            trace_id: trace_id.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_is_in_enum_order() {
        assert_eq!(CATALOGUE.len(), ErrorCode::ALL.len());
        for (i, code) in ErrorCode::ALL.iter().enumerate() {
            assert_eq!(CATALOGUE[i].code, *code, "row {i}");
            assert_eq!(*code as usize, i);
        }
    }

    #[test]
    fn catalogue_matches_c3_table_3_2() {
        // (code, HTTP, retry-safe) exactly as C3 §3.2 prints them.
        let c3 = [
            ("LOCK_CONTENDED", 409, true),
            ("CONTENTION_EXCEEDED", 429, true),
            ("NOT_LEADER", 503, true),
            ("LOCK_LOST", 409, false),
            ("SESSION_UNKNOWN", 404, false),
            ("SESSION_EXPIRED", 410, false),
            ("INVALID_TOKEN", 400, false),
            ("FENCED_OUT", 409, false),
            ("PAYOUT_NOT_CLAIMABLE", 409, false),
            ("DUPLICATE_SUBMISSION", 409, false),
            ("INSUFFICIENT_FUNDS", 422, false),
            ("IDEMPOTENCY_CONFLICT", 422, false),
            ("RAIL_UNAVAILABLE", 503, true),
            ("RAIL_AMBIGUOUS", 409, false),
            ("VALIDATION_FAILED", 400, false),
        ];
        let ours: Vec<_> = CATALOGUE.iter().filter(|r| r.origin == Origin::C3).collect();
        assert_eq!(ours.len(), 15);
        for ((name, status, safe), r) in c3.iter().zip(ours) {
            assert_eq!(r.code.as_str(), *name);
            assert_eq!(r.http_status, *status, "{name}");
            assert_eq!(r.retry_safe, *safe, "{name}");
        }
    }

    #[test]
    fn retry_after_is_carried_by_exactly_the_codes_c3_names() {
        let with: Vec<_> = CATALOGUE
            .iter()
            .filter(|r| r.origin == Origin::C3 && r.carries_retry_after)
            .map(|r| r.code.as_str())
            .collect();
        assert_eq!(with, ["LOCK_CONTENDED", "CONTENTION_EXCEEDED", "NOT_LEADER", "RAIL_UNAVAILABLE"]);
    }

    #[test]
    fn wire_spelling_round_trips_through_serde() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_string(&code).expect("serialize");
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            let back: ErrorCode = serde_json::from_str(&json).expect("deserialize");
            assert_eq!(back, code);
        }
    }

    #[test]
    fn envelope_takes_retry_safety_from_the_catalogue_and_omits_absent_fields() {
        let e = ErrorEnvelope::new(ErrorCode::FencedOut, "stale", "abc");
        let v = serde_json::to_value(&e).expect("serialize");
        assert_eq!(v["code"], "FENCED_OUT");
        assert_eq!(v["retrySafe"], false);
        assert_eq!(v["traceId"], "abc");
        assert!(v.get("retryAfterMillis").is_none());
        assert!(v.get("details").is_none());
    }
}
