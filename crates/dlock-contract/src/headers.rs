//! Validated newtypes for the three protected-write headers (C3 §3.1).
//!
//! Parsing is the boundary: once a value is one of these types it is known-good, and no
//! code behind the boundary re-checks or coerces it.

use serde::{Deserialize, Serialize};

/// Why a header value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("X-Fencing-Token is missing")]
    MissingToken,
    #[error(
        "X-Fencing-Token must be a decimal int64 greater than zero, written without sign, padding or leading zeros"
    )]
    MalformedToken,
    #[error("{0} is missing")]
    Missing(&'static str),
    #[error("{name} must be 1 to {max} visible ASCII characters")]
    Malformed { name: &'static str, max: usize },
}

/// A fencing token: a decimal int64 strictly greater than zero (C3 §3.1, §3.2 INVALID_TOKEN).
///
/// Only the canonical spelling `[1-9][0-9]*` within `i64::MAX` is accepted. There is no
/// `Default` and no `From<i64>` for zero or negatives: a token can only come from a parse
/// or from [`FencingToken::new`], which refuses `<= 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct FencingToken(i64);

impl FencingToken {
    /// The token, if `value > 0`.
    pub fn new(value: i64) -> Option<FencingToken> {
        (value > 0).then_some(FencingToken(value))
    }

    pub fn get(self) -> i64 {
        self.0
    }

    /// Parses a header value. Rejects empty, `0`, signs, whitespace, leading zeros,
    /// decimals, exponents, hex, non-ASCII digits and anything above `i64::MAX`.
    pub fn parse(raw: &str) -> Result<FencingToken, HeaderError> {
        let bytes = raw.as_bytes();
        if bytes.is_empty() {
            return Err(HeaderError::MissingToken);
        }
        if bytes[0] == b'0' || !bytes.iter().all(u8::is_ascii_digit) {
            return Err(HeaderError::MalformedToken);
        }
        // 19 digits is i64::MAX's width; anything longer overflows before parse is asked.
        if bytes.len() > 19 {
            return Err(HeaderError::MalformedToken);
        }
        raw.parse::<i64>().ok().and_then(FencingToken::new).ok_or(HeaderError::MalformedToken)
    }
}

impl TryFrom<i64> for FencingToken {
    type Error = HeaderError;
    fn try_from(v: i64) -> Result<Self, Self::Error> {
        FencingToken::new(v).ok_or(HeaderError::MalformedToken)
    }
}

impl From<FencingToken> for i64 {
    fn from(t: FencingToken) -> i64 {
        t.0
    }
}

impl std::fmt::Display for FencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

fn visible_ascii(raw: &str, max: usize) -> bool {
    !raw.is_empty() && raw.len() <= max && raw.bytes().all(|b| b.is_ascii_graphic())
}

/// Longest accepted `X-Owner-Id` (C3 §3.1).
pub const OWNER_ID_CHARS_MAX: usize = 64;
/// Longest accepted `X-Idempotency-Key`.
pub const IDEMPOTENCY_KEY_CHARS_MAX: usize = 255;

/// An opaque worker identity: 1 to 64 visible ASCII characters (C3 §3.1, FR-30).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OwnerId(String);

impl OwnerId {
    pub fn parse(raw: &str) -> Result<OwnerId, HeaderError> {
        if raw.is_empty() {
            return Err(HeaderError::Missing("X-Owner-Id"));
        }
        if !visible_ascii(raw, OWNER_ID_CHARS_MAX) {
            return Err(HeaderError::Malformed { name: "X-Owner-Id", max: OWNER_ID_CHARS_MAX });
        }
        Ok(OwnerId(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for OwnerId {
    type Error = HeaderError;
    fn try_from(v: String) -> Result<Self, Self::Error> {
        OwnerId::parse(&v)
    }
}

impl From<OwnerId> for String {
    fn from(v: OwnerId) -> String {
        v.0
    }
}

impl std::fmt::Display for OwnerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A payout's stable idempotency key: 1 to 255 visible ASCII characters (C3 §3.1).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn parse(raw: &str) -> Result<IdempotencyKey, HeaderError> {
        if raw.is_empty() {
            return Err(HeaderError::Missing("X-Idempotency-Key"));
        }
        if !visible_ascii(raw, IDEMPOTENCY_KEY_CHARS_MAX) {
            return Err(HeaderError::Malformed { name: "X-Idempotency-Key", max: IDEMPOTENCY_KEY_CHARS_MAX });
        }
        Ok(IdempotencyKey(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for IdempotencyKey {
    type Error = HeaderError;
    fn try_from(v: String) -> Result<Self, Self::Error> {
        IdempotencyKey::parse(&v)
    }
}

impl From<IdempotencyKey> for String {
    fn from(v: IdempotencyKey) -> String {
        v.0
    }
}

impl std::fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_accepts_canonical_positive_decimals() {
        assert_eq!(FencingToken::parse("1").map(FencingToken::get), Ok(1));
        assert_eq!(FencingToken::parse("42").map(FencingToken::get), Ok(42));
        assert_eq!(FencingToken::parse("9223372036854775807").map(FencingToken::get), Ok(i64::MAX));
    }

    #[test]
    fn token_rejects_every_non_canonical_spelling_without_coercion() {
        let bad = [
            "0",
            "-1",
            "+5",
            " 5",
            "5 ",
            "05",
            "5.0",
            "1e3",
            "0x10",
            "9223372036854775808",
            "99999999999999999999999",
            "٣",
            "５",
            "1_000",
            "00",
            "-0",
            "\t7",
            "7\n",
        ];
        for raw in bad {
            assert_eq!(FencingToken::parse(raw), Err(HeaderError::MalformedToken), "{raw:?}");
        }
    }

    #[test]
    fn token_reports_empty_as_missing() {
        assert_eq!(FencingToken::parse(""), Err(HeaderError::MissingToken));
    }

    #[test]
    fn token_cannot_be_built_from_zero_or_negative() {
        assert_eq!(FencingToken::new(0), None);
        assert_eq!(FencingToken::new(-7), None);
        assert!(serde_json::from_str::<FencingToken>("0").is_err());
    }

    #[test]
    fn owner_id_is_one_to_64_visible_ascii() {
        assert!(OwnerId::parse("worker-1").is_ok());
        assert!(OwnerId::parse(&"w".repeat(64)).is_ok());
        assert!(OwnerId::parse(&"w".repeat(65)).is_err());
        assert!(OwnerId::parse("has space").is_err());
        assert!(OwnerId::parse("naïve").is_err());
        assert_eq!(OwnerId::parse(""), Err(HeaderError::Missing("X-Owner-Id")));
    }

    #[test]
    fn idempotency_key_is_one_to_255_visible_ascii() {
        assert!(IdempotencyKey::parse("payout:9b2c").is_ok());
        assert!(IdempotencyKey::parse(&"k".repeat(255)).is_ok());
        assert!(IdempotencyKey::parse(&"k".repeat(256)).is_err());
        assert!(IdempotencyKey::parse("a\u{7f}").is_err());
        assert_eq!(IdempotencyKey::parse(""), Err(HeaderError::Missing("X-Idempotency-Key")));
    }
}
