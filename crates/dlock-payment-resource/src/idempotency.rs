//! Request fingerprints for the idempotency ledger (design §4).
//!
//! `fingerprint = hex(SHA-256(JCS(semantic)))`, where `semantic` is
//! `{"body": <validated typed request>, "operation": …, "ownerId": …, "target": …}` and JCS is
//! RFC 8785 (`serde_json_canonicalizer`). Key order and whitespace never count, and fields
//! validation ignores never reach the body, so they do not count either.
//!
//! **int64 exactness.** RFC 8785 writes every number as an IEEE-754 double, and
//! `serde_json_canonicalizer` does so for `i64`/`u64` too (`9007199254740993` becomes
//! `9007199254740992`). Two requests differing only in an integer beyond ±(2⁵³ − 1) would
//! then share a fingerprint and the second would replay the first's answer. So before
//! canonicalising, every integer outside the exactly representable range is replaced by its
//! decimal string. That string could only be confused with a string field holding the same
//! digits at the same place, and a typed body never has one place that is a number in one
//! request and a string in another.

use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Largest magnitude a double holds exactly together with all its neighbours
/// (JavaScript's `Number.MAX_SAFE_INTEGER`, 2⁵³ − 1).
const SAFE_INTEGER_MAX: u64 = (1 << 53) - 1;

/// The fingerprint of one mutating request: lower-case hex SHA-256 of the RFC 8785 form of
/// `{body, operation, ownerId, target}`. Errors only when `body` cannot be represented as JSON
/// (e.g. a map with non-string keys); the message names no value.
pub fn fingerprint<T: Serialize>(operation: &str, target: &str, owner_id: &str, body: &T) -> Result<String, String> {
    let mut body =
        serde_json::to_value(body).map_err(|e| format!("the request body is not JSON-representable: {e}"))?;
    exact_integers(&mut body);
    let mut semantic = Map::new();
    semantic.insert("body".to_owned(), body);
    semantic.insert("operation".to_owned(), Value::String(operation.to_owned()));
    semantic.insert("ownerId".to_owned(), Value::String(owner_id.to_owned()));
    semantic.insert("target".to_owned(), Value::String(target.to_owned()));
    let canonical = serde_json_canonicalizer::to_vec(&Value::Object(semantic))
        .map_err(|e| format!("the request body could not be canonicalised: {e}"))?;
    Ok(hex::encode(Sha256::digest(&canonical)))
}

/// Replaces every integer a double cannot hold exactly by its decimal string, in place.
fn exact_integers(value: &mut Value) {
    match value {
        Value::Number(n) => {
            let exact = match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => i.unsigned_abs() <= SAFE_INTEGER_MAX,
                (None, Some(u)) => u <= SAFE_INTEGER_MAX,
                // A float: JCS's own domain, written as ECMAScript would.
                (None, None) => true,
            };
            if !exact {
                *value = Value::String(n.to_string());
            }
        }
        Value::Array(items) => items.iter_mut().for_each(exact_integers),
        Value::Object(fields) => fields.values_mut().for_each(exact_integers),
        Value::Null | Value::Bool(_) | Value::String(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_contract::payment::{ClaimRequest, NewPayoutRequest};
    use dlock_contract::payout::PayoutState;
    use serde_json::json;

    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Amount {
        amount_minor: i64,
    }

    #[derive(Serialize)]
    struct Unsigned {
        n: u64,
    }

    fn sha_hex(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    #[test]
    fn fingerprint_hashes_the_canonical_semantic_object() {
        let body = ClaimRequest { expected_state: PayoutState::Pending };
        let got = fingerprint("CLAIM", "4b6f1b5e-8d0a-4a39-9f5e-2f1d1a0c9e11", "w-1", &body).expect("fingerprint");
        let canonical = br#"{"body":{"expectedState":"PENDING"},"operation":"CLAIM","ownerId":"w-1","target":"4b6f1b5e-8d0a-4a39-9f5e-2f1d1a0c9e11"}"#;
        assert_eq!(got, sha_hex(canonical));
        assert_eq!(got.len(), 64);
        assert!(got.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)), "{got}");
    }

    #[test]
    fn fingerprint_ignores_key_order_and_whitespace() {
        let a: Value = serde_json::from_str(
            r#"{"railReference":"r-1","submissionId":"7c1e0d2a-3b4f-4c5d-8e6f-a0b1c2d3e4f5","railOutcome":"ACKED","n":{"x":1,"y":[1,2]}}"#,
        )
        .expect("json");
        let b: Value = serde_json::from_str(
            "{\n  \"n\" : { \"y\" : [ 1 , 2 ] , \"x\" : 1 },\n  \"railOutcome\" : \"ACKED\",\n\t\"submissionId\":\"7c1e0d2a-3b4f-4c5d-8e6f-a0b1c2d3e4f5\" ,\"railReference\":\"r-1\"\n}",
        )
        .expect("json");
        assert_eq!(fingerprint("POST", "t", "w-1", &a).expect("a"), fingerprint("POST", "t", "w-1", &b).expect("b"));
    }

    #[test]
    fn fingerprint_ignores_fields_validation_ignores() {
        let plain = ClaimRequest::from_json(&json!({"expectedState": "PENDING"})).expect("valid");
        let noisy = ClaimRequest::from_json(&json!({"note": "x", "expectedState": "PENDING"})).expect("valid");
        assert_eq!(
            fingerprint("CLAIM", "t", "w-1", &plain).expect("plain"),
            fingerprint("CLAIM", "t", "w-1", &noisy).expect("noisy")
        );
    }

    /// Pins the crate's behaviour that `exact_integers` exists for: JCS writes int64 as a
    /// double. Should a future version write it exactly, the workaround can go.
    #[test]
    fn the_canonicaliser_itself_writes_int64_as_a_double() {
        let lossy = serde_json_canonicalizer::to_vec(&json!({"n": 9_007_199_254_740_993_i64})).expect("jcs");
        assert_eq!(lossy, br#"{"n":9007199254740992}"#);
    }

    #[test]
    fn fingerprint_distinguishes_int64_beyond_2_pow_53() {
        let f = |amount_minor: i64| fingerprint("CREATE_PAYOUT", "payouts", "w-1", &Amount { amount_minor });
        assert_ne!(f(9_007_199_254_740_993).expect("odd"), f(9_007_199_254_740_992).expect("even"));
        assert_ne!(f(i64::MAX).expect("max"), f(i64::MAX - 1).expect("max - 1"));
        assert_ne!(f(i64::MIN).expect("min"), f(i64::MIN + 1).expect("min + 1"));
        assert_ne!(f(-9_007_199_254_740_993).expect("neg odd"), f(-9_007_199_254_740_992).expect("neg even"));
        let u = |n: u64| fingerprint("CREATE_PAYOUT", "payouts", "w-1", &Unsigned { n });
        assert_ne!(u(u64::MAX).expect("max"), u(u64::MAX - 1).expect("max - 1"));
    }

    #[test]
    fn safe_integers_stay_numbers_and_big_ones_become_strings() {
        let got = fingerprint("OP", "t", "o", &Amount { amount_minor: 9_007_199_254_740_991 }).expect("safe");
        assert_eq!(
            got,
            sha_hex(br#"{"body":{"amountMinor":9007199254740991},"operation":"OP","ownerId":"o","target":"t"}"#)
        );
        let got = fingerprint("OP", "t", "o", &Amount { amount_minor: -9_007_199_254_740_993 }).expect("big");
        assert_eq!(
            got,
            sha_hex(br#"{"body":{"amountMinor":"-9007199254740993"},"operation":"OP","ownerId":"o","target":"t"}"#)
        );
        let mut nested = json!({"a": [1, {"b": u64::MAX}], "c": 1.5});
        exact_integers(&mut nested);
        assert_eq!(nested, json!({"a": [1, {"b": "18446744073709551615"}], "c": 1.5}));
    }

    #[test]
    fn a_different_operation_target_or_owner_changes_the_fingerprint() {
        let body = ClaimRequest { expected_state: PayoutState::Pending };
        let base = fingerprint("CLAIM", "t-1", "w-1", &body).expect("base");
        assert_ne!(base, fingerprint("POST", "t-1", "w-1", &body).expect("operation"));
        assert_ne!(base, fingerprint("CLAIM", "t-2", "w-1", &body).expect("target"));
        assert_ne!(base, fingerprint("CLAIM", "t-1", "w-2", &body).expect("owner"));
        let reclaim = ClaimRequest { expected_state: PayoutState::Claimed };
        assert_ne!(base, fingerprint("CLAIM", "t-1", "w-1", &reclaim).expect("body"));
        assert_eq!(base, fingerprint("CLAIM", "t-1", "w-1", &body).expect("again"));
    }

    #[test]
    fn a_create_without_payout_id_fingerprints_null() {
        let body = json!({"accountId": "acct:1", "amountMinor": 1250, "currency": "EUR", "beneficiaryRef": "b"});
        let r = NewPayoutRequest::from_json(&body).expect("valid");
        let got = fingerprint("CREATE_PAYOUT", "payouts", "w-1", &r).expect("fingerprint");
        let canonical = br#"{"body":{"accountId":"acct:1","amountMinor":1250,"beneficiaryRef":"b","currency":"EUR","payoutId":null},"operation":"CREATE_PAYOUT","ownerId":"w-1","target":"payouts"}"#;
        assert_eq!(got, sha_hex(canonical));
    }

    #[test]
    fn a_body_that_is_not_json_is_an_error_not_a_panic() {
        let mut bad = std::collections::BTreeMap::new();
        bad.insert((1, 2), "tuple keys are not JSON");
        assert!(fingerprint("OP", "t", "o", &bad).is_err());
    }
}
