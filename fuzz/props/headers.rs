//! Properties of the protected-write header parsers in `dlock_contract::headers`, shared by
//! the fuzz targets (`fuzz/fuzz_targets/`) and the corpus replay test
//! (`crates/dlock-contract/tests/fuzz_corpus.rs`). Each checks the parser against an
//! independent oracle written from the contract (C3 §3.1), not just "no panic".
#![allow(dead_code)] // each fuzz target uses one property of this file

use dlock_contract::headers::{
    FencingToken, HeaderError, IdempotencyKey, OwnerId, IDEMPOTENCY_KEY_CHARS_MAX, OWNER_ID_CHARS_MAX,
};

/// `FencingToken::parse` accepts exactly `[1-9][0-9]*` within `i64::MAX`; what it accepts
/// is positive and prints back as the input; serde agrees with the parse.
pub fn fencing_token(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else { return };
    fencing_token_check(s, FencingToken::parse(s));
}

/// The property of [`fencing_token`] for one input `s` and the parser's answer `parsed`
/// (apart so a test can show it fails a wrong parser).
pub fn fencing_token_check(s: &str, parsed: Result<FencingToken, HeaderError>) {
    let canonical = !s.is_empty()
        && s.len() <= 19
        && !s.starts_with('0')
        && s.bytes().all(|b| b.is_ascii_digit())
        && s.parse::<u128>().is_ok_and(|v| v <= i64::MAX as u128);
    match parsed {
        Ok(t) => {
            assert!(canonical, "accepted a non-canonical token {s:?}");
            assert!(t.get() > 0, "accepted a non-positive token from {s:?}");
            assert_eq!(t.to_string(), s, "accepted a non-canonical spelling");
            let json = serde_json::to_string(&t).expect("a token serialises");
            assert_eq!(serde_json::from_str::<FencingToken>(&json).ok(), Some(t));
        }
        Err(e) => {
            assert!(!canonical, "refused the canonical token {s:?}");
            let expected = if s.is_empty() { HeaderError::MissingToken } else { HeaderError::MalformedToken };
            assert_eq!(e, expected, "{s:?}");
        }
    }
}

fn visible(s: &str, max: usize) -> bool {
    (1..=max).contains(&s.len()) && s.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

/// `OwnerId::parse` accepts exactly 1 to 64 visible ASCII characters, keeps them verbatim,
/// and serde (`try_from = "String"`) agrees with it.
pub fn owner_id(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let ok = visible(s, OWNER_ID_CHARS_MAX);
    let via_serde = serde_json::from_value::<OwnerId>(serde_json::Value::String(s.to_owned())).ok();
    match OwnerId::parse(s) {
        Ok(id) => {
            assert!(ok, "accepted owner id {s:?}");
            assert_eq!(id.as_str(), s);
            assert_eq!(id.to_string(), s);
            assert_eq!(via_serde, Some(id));
        }
        Err(e) => {
            assert!(!ok, "refused owner id {s:?}");
            assert!(via_serde.is_none(), "serde accepted what parse refused: {s:?}");
            let expected = if s.is_empty() {
                HeaderError::Missing("X-Owner-Id")
            } else {
                HeaderError::Malformed { name: "X-Owner-Id", max: OWNER_ID_CHARS_MAX }
            };
            assert_eq!(e, expected);
        }
    }
}

/// `IdempotencyKey::parse` accepts exactly 1 to 255 visible ASCII characters, keeps them
/// verbatim, and serde agrees with it.
pub fn idempotency_key(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let ok = visible(s, IDEMPOTENCY_KEY_CHARS_MAX);
    let via_serde = serde_json::from_value::<IdempotencyKey>(serde_json::Value::String(s.to_owned())).ok();
    match IdempotencyKey::parse(s) {
        Ok(k) => {
            assert!(ok, "accepted idempotency key {s:?}");
            assert_eq!(k.as_str(), s);
            assert_eq!(k.to_string(), s);
            assert_eq!(via_serde, Some(k));
        }
        Err(e) => {
            assert!(!ok, "refused idempotency key {s:?}");
            assert!(via_serde.is_none(), "serde accepted what parse refused: {s:?}");
            let expected = if s.is_empty() {
                HeaderError::Missing("X-Idempotency-Key")
            } else {
                HeaderError::Malformed { name: "X-Idempotency-Key", max: IDEMPOTENCY_KEY_CHARS_MAX }
            };
            assert_eq!(e, expected);
        }
    }
}

/// `SubmissionRequest::from_json` on any JSON value: whatever it accepts has a positive
/// amount and an ISO 4217 currency, and it re-validates its own serialisation to itself.
pub fn submission_body(data: &[u8]) {
    use dlock_contract::currency::is_iso_4217;
    use dlock_contract::rail::SubmissionRequest;
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    if let Ok(r) = SubmissionRequest::from_json(&v) {
        assert!(r.amount_minor > 0, "accepted amountMinor {}", r.amount_minor);
        assert!(is_iso_4217(&r.currency), "accepted currency {:?}", r.currency);
        let again = serde_json::to_value(&r).expect("a request serialises");
        assert_eq!(SubmissionRequest::from_json(&again).ok(), Some(r));
    }
}
