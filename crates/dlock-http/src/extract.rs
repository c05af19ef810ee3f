//! Boundary parsing: headers into validated newtypes, bodies into JSON, trace ids.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap, StatusCode};
use dlock_contract::headers::HeaderError;
use dlock_contract::{ErrorCode, FencingToken, FieldError, IdempotencyKey, OwnerId};
use dlock_contract::{HEADER_FENCING_TOKEN, HEADER_IDEMPOTENCY_KEY, HEADER_OWNER_ID};

use crate::ApiError;

/// The request's OpenTelemetry trace id (32 lowercase hex characters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceId(pub String);

impl TraceId {
    /// The trace id of an incoming W3C `traceparent` header, or a fresh one (the rules of
    /// [`dlock_rt::trace::TraceContext::for_request`]).
    pub fn from_headers(headers: &HeaderMap) -> TraceId {
        let incoming = dlock_rt::trace::traceparent_of(headers);
        TraceId(dlock_rt::trace::TraceContext::for_request(incoming).trace_id_hex())
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, ()> {
    match headers.get(name) {
        None => Ok(""),
        Some(v) => v.to_str().map_err(|_| ()),
    }
}

/// `X-Fencing-Signature`, if present (syntax checked: a malformed one is 400
/// `INVALID_TOKEN` before anything else is read; [`dlock_contract::grant`] judges it).
pub fn fencing_signature(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get(dlock_contract::HEADER_FENCING_SIGNATURE) else { return Ok(None) };
    let malformed = || ApiError::new(ErrorCode::InvalidToken, dlock_contract::grant::GrantError::Malformed.to_string());
    let raw = v.to_str().map_err(|_| malformed())?;
    if raw.is_empty() {
        return Err(malformed());
    }
    dlock_contract::grant::GrantSignature::parse(raw)
        .map_err(|e| ApiError::new(ErrorCode::InvalidToken, e.to_string()))?;
    Ok(Some(raw.to_owned()))
}

/// A grant refusal (C3-extensions E-14): 400 `INVALID_TOKEN`, and the coverage probe.
pub fn grant_refused(e: dlock_contract::grant::GrantError) -> ApiError {
    dlock_rt::probe::hit(dlock_rt::probe::Probe::ForgedTokenRefused);
    ApiError::new(ErrorCode::InvalidToken, e.to_string())
}

/// `X-Fencing-Token`, or 400 `INVALID_TOKEN` (never coerced).
pub fn fencing_token(headers: &HeaderMap) -> Result<FencingToken, ApiError> {
    let raw = header_str(headers, HEADER_FENCING_TOKEN)
        .map_err(|_| ApiError::new(ErrorCode::InvalidToken, HeaderError::MalformedToken.to_string()))?;
    FencingToken::parse(raw).map_err(|e| ApiError::new(ErrorCode::InvalidToken, e.to_string()))
}

/// `X-Owner-Id`, or 400 `VALIDATION_FAILED`.
pub fn owner_id(headers: &HeaderMap) -> Result<OwnerId, ApiError> {
    let bad = |e: HeaderError| ApiError::validation(e.to_string(), vec![FieldError::new("X-Owner-Id", e.to_string())]);
    let raw = header_str(headers, HEADER_OWNER_ID).map_err(|_| {
        bad(HeaderError::Malformed { name: "X-Owner-Id", max: dlock_contract::headers::OWNER_ID_CHARS_MAX })
    })?;
    OwnerId::parse(raw).map_err(bad)
}

/// `X-Idempotency-Key`, or 400 `VALIDATION_FAILED`.
pub fn idempotency_key(headers: &HeaderMap) -> Result<IdempotencyKey, ApiError> {
    let bad =
        |e: HeaderError| ApiError::validation(e.to_string(), vec![FieldError::new("X-Idempotency-Key", e.to_string())]);
    let raw = header_str(headers, HEADER_IDEMPOTENCY_KEY).map_err(|_| {
        bad(HeaderError::Malformed {
            name: "X-Idempotency-Key",
            max: dlock_contract::headers::IDEMPOTENCY_KEY_CHARS_MAX,
        })
    })?;
    IdempotencyKey::parse(raw).map_err(bad)
}

/// A request body that must be declared `application/json` and parse as a JSON object.
///
/// Missing or other content type: 415 `UNSUPPORTED_MEDIA_TYPE`. Over the body limit: 413
/// `PAYLOAD_TOO_LARGE`. Not JSON, not an object, a key given twice at any depth, or a NUL
/// character in any string: 400 `VALIDATION_FAILED` (see [`crate::strict_json`]). The value
/// is always a `Value::Object`. Field rules are the handler's.
#[derive(Debug, Clone)]
pub struct JsonBody(pub serde_json::Value);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let declared_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or("").trim().eq_ignore_ascii_case("application/json"))
            .unwrap_or(false);
        if !declared_json {
            return Err(ApiError::new(
                ErrorCode::UnsupportedMediaType,
                "the request body must be declared Content-Type: application/json",
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(ErrorCode::PayloadTooLarge, "the request body is larger than this service accepts")
            } else {
                ApiError::validation("the request body could not be read", vec![])
            }
        })?;
        crate::strict_json::parse_body(&bytes)
            .map(JsonBody)
            .map_err(|p| ApiError::validation(p.message(), vec![FieldError::new(p.field(), p.problem())]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_supplies_the_trace_id_when_well_formed() {
        let mut h = HeaderMap::new();
        h.insert("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().expect("hv"));
        assert_eq!(TraceId::from_headers(&h).0, "4bf92f3577b34da6a3ce929d0e0e4736");
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        ] {
            h.insert("traceparent", bad.parse().expect("hv"));
            let t = TraceId::from_headers(&h).0;
            assert!(t != "4bf92f3577b34da6a3ce929d0e0e4736" && t != "0".repeat(32) && t.len() == 32, "{bad}");
        }
    }

    #[test]
    fn missing_token_header_is_invalid_token() {
        let err = fencing_token(&HeaderMap::new()).expect_err("missing");
        assert_eq!(err.code, ErrorCode::InvalidToken);
    }
}
