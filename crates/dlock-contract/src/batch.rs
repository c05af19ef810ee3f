//! Batches (C3-extensions E-19): several payouts of one account under one grant.
//!
//! Three fenced writes carry a batch: P2b `POST /v1/accounts/{accountId}/claims`, P3b
//! `POST /v1/accounts/{accountId}/posts` and R1b `POST /v1/rail/submission-batches`. Each
//! answers `200` with one [`BatchItem`] per payout, in the request's order, whose `status`
//! and `body` are exactly what the single write (P2, P3, the submission) would answer for
//! that payout under the batch's token. What concerns the whole request (a bad body, a
//! refused signature, the fence or the mark not below the token, an unknown outcome) is
//! answered for the whole request, as an envelope, and then no item exists.
//!
//! Invariants this module owns:
//! - A batch names 1 to [`BATCH_PAYOUTS_MAX`] payouts, each once ([`validate_payout_ids`]).
//! - A batch's idempotency target (P2b, P3b) is [`batch_target`] of its account: the
//!   `account:` prefix keeps it apart from every payout's target, which is a UUID.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::error::{ErrorEnvelope, FieldError};

/// Most payouts one batch names. Bounds the request body (64 posts of the longest rail
/// reference stay far below the services' 64 KiB body bound), the transaction, and the
/// rail-proxy's concurrent forwards of one batch.
pub const BATCH_PAYOUTS_MAX: usize = 64;

/// The idempotency target of a batch of `account_id` (P2b, P3b; C3-extensions E-19).
pub fn batch_target(account_id: &str) -> String {
    format!("account:{account_id}")
}

/// One payout's answer in a batch: what the single write would answer for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchItem {
    pub payout_id: Uuid,
    /// The single write's HTTP status for this payout.
    pub status: u16,
    /// The single write's body for this payout: its 2xx body, or its C3 envelope.
    #[schema(value_type = Object)]
    pub body: Value,
}

impl BatchItem {
    /// The item's envelope, when its status is not 2xx and its body is one.
    pub fn envelope(&self) -> Option<ErrorEnvelope> {
        if (200..300).contains(&self.status) {
            return None;
        }
        serde_json::from_value(self.body.clone()).ok()
    }

    /// The item's 2xx body as `T` (`None` for a refusal, or a body that is not a `T`).
    pub fn ok<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        if !(200..300).contains(&self.status) {
            return None;
        }
        serde_json::from_value(self.body.clone()).ok()
    }
}

/// `200` body of P2b, P3b and R1b.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchAnswer {
    pub account_id: String,
    pub presented_token: i64,
    /// One per payout of the request, in its order.
    pub items: Vec<BatchItem>,
}

impl BatchAnswer {
    /// The item of `payout_id`.
    pub fn item(&self, payout_id: Uuid) -> Option<&BatchItem> {
        self.items.iter().find(|i| i.payout_id == payout_id)
    }
}

/// The array field `name` of a batch body: its elements (objects), or the problems. The
/// array must hold 1 to [`BATCH_PAYOUTS_MAX`] elements, each a JSON object.
pub fn batch_elements<'a>(body: &'a Value, name: &str) -> Result<&'a [Value], Vec<FieldError>> {
    let Some(obj) = body.as_object() else {
        return Err(vec![FieldError::new("$", "the body must be a JSON object")]);
    };
    let items = match obj.get(name) {
        None | Some(Value::Null) => return Err(vec![FieldError::new(name, "is required")]),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(vec![FieldError::new(name, "must be an array")]),
    };
    if items.is_empty() || items.len() > BATCH_PAYOUTS_MAX {
        return Err(vec![FieldError::new(name, format!("must hold 1 to {BATCH_PAYOUTS_MAX} payouts"))]);
    }
    let problems: Vec<FieldError> = items
        .iter()
        .enumerate()
        .filter(|(_, v)| !v.is_object())
        .map(|(i, _)| FieldError::new(format!("{name}[{i}]"), "must be a JSON object"))
        .collect();
    if problems.is_empty() {
        Ok(items)
    } else {
        Err(problems)
    }
}

/// Validates each element of the array field `name` with `one`, prefixing each problem's
/// field with the element's place (`payouts[2].expectedState`); then [`validate_payout_ids`].
pub fn validate_elements<T>(
    body: &Value,
    name: &str,
    one: impl Fn(&Value) -> Result<T, Vec<FieldError>>,
    payout_id: impl Fn(&T) -> Uuid,
) -> Result<Vec<T>, Vec<FieldError>> {
    let elements = batch_elements(body, name)?;
    let mut out = Vec::with_capacity(elements.len());
    let mut problems = Vec::new();
    for (i, element) in elements.iter().enumerate() {
        match one(element) {
            Ok(v) => out.push(v),
            Err(ps) => {
                problems.extend(ps.into_iter().map(|p| FieldError::new(format!("{name}[{i}].{}", p.field), p.problem)))
            }
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let ids: Vec<Uuid> = out.iter().map(payout_id).collect();
    validate_payout_ids(&ids, name)?;
    Ok(out)
}

/// A batch names each payout once.
pub fn validate_payout_ids(ids: &[Uuid], name: &str) -> Result<(), Vec<FieldError>> {
    let mut seen = std::collections::BTreeSet::new();
    let problems: Vec<FieldError> = ids
        .iter()
        .enumerate()
        .filter(|(_, id)| !seen.insert(**id))
        .map(|(i, _)| FieldError::new(format!("{name}[{i}].payoutId"), "names a payout named earlier in the batch"))
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_batch_holds_one_to_the_bound_objects() {
        assert!(batch_elements(&json!({"payouts": []}), "payouts").is_err());
        assert!(batch_elements(&json!({"payouts": [{}]}), "payouts").is_ok());
        let full: Vec<Value> = (0..BATCH_PAYOUTS_MAX).map(|_| json!({})).collect();
        assert!(batch_elements(&json!({ "payouts": full }), "payouts").is_ok());
        let over: Vec<Value> = (0..=BATCH_PAYOUTS_MAX).map(|_| json!({})).collect();
        assert!(batch_elements(&json!({ "payouts": over }), "payouts").is_err());
        let bad = batch_elements(&json!({"payouts": [{}, 3]}), "payouts").expect_err("refused");
        assert_eq!(bad[0].field, "payouts[1]");
        assert!(batch_elements(&json!([]), "payouts").is_err());
        assert!(batch_elements(&json!({"payouts": {}}), "payouts").is_err());
    }

    #[test]
    fn a_batch_names_each_payout_once() {
        let a = Uuid::from_u128(1);
        let b = Uuid::from_u128(2);
        assert!(validate_payout_ids(&[a, b], "payouts").is_ok());
        let refused = validate_payout_ids(&[a, b, a], "payouts").expect_err("refused");
        assert_eq!(refused[0].field, "payouts[2].payoutId");
    }

    #[test]
    fn a_batch_target_is_never_a_payout_id() {
        let t = batch_target("acct-1");
        assert_eq!(t, "account:acct-1");
        assert!(Uuid::parse_str(&batch_target(&Uuid::nil().to_string())).is_err());
    }

    #[test]
    fn an_items_body_reads_as_its_answer_or_its_envelope() {
        let ok = BatchItem { payout_id: Uuid::nil(), status: 200, body: json!({"x": 1}) };
        assert_eq!(ok.ok::<Value>(), Some(json!({"x": 1})));
        assert!(ok.envelope().is_none());
        let refused = BatchItem {
            payout_id: Uuid::nil(),
            status: 409,
            body: json!({"code": "PAYOUT_NOT_CLAIMABLE", "message": "m", "retrySafe": false, "traceId": "t"}),
        };
        assert!(refused.ok::<Value>().is_none());
        assert_eq!(refused.envelope().map(|e| e.code), Some(crate::ErrorCode::PayoutNotClaimable));
    }

    const A: &str = "4b6f1b5e-8d0a-4a39-9f5e-2f1d1a0c9e11";
    const B: &str = "7c1e0d2a-3b4f-4c5d-8e6f-a0b1c2d3e4f5";

    #[test]
    fn a_claim_batch_is_valid_p2_bodies_with_their_payout_ids() {
        use crate::payment::ClaimBatchRequest;
        use crate::payout::PayoutState;
        let ok = ClaimBatchRequest::from_json(&json!({"payouts": [
            {"payoutId": A, "expectedState": "PENDING"}, {"payoutId": B, "expectedState": "CLAIMED"}]}))
        .expect("valid");
        assert_eq!(ok.payouts.len(), 2);
        assert_eq!(ok.payouts[1].expected_state, PayoutState::Claimed);
        let bad = ClaimBatchRequest::from_json(&json!({"payouts": [
            {"payoutId": A, "expectedState": "PENDING"}, {"payoutId": "x", "expectedState": "POSTED"}]}))
        .expect_err("refused");
        let fields: Vec<&str> = bad.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["payouts[1].payoutId", "payouts[1].expectedState"]);
        let twice = ClaimBatchRequest::from_json(&json!({"payouts": [
            {"payoutId": A, "expectedState": "PENDING"}, {"payoutId": A, "expectedState": "PENDING"}]}))
        .expect_err("refused");
        assert_eq!(twice[0].field, "payouts[1].payoutId");
    }

    #[test]
    fn a_post_batch_is_valid_p3_bodies_with_their_payout_ids() {
        use crate::payment::PostBatchRequest;
        let item = |id: &str, outcome: &str| json!({"payoutId": id, "submissionId": B, "railReference": "rr-1", "railOutcome": outcome});
        let ok = PostBatchRequest::from_json(&json!({"payouts": [item(A, "ACKED")]})).expect("valid");
        assert_eq!(ok.payouts[0].request().rail_reference, "rr-1");
        let bad = PostBatchRequest::from_json(&json!({"payouts": [item(A, "TIMEOUT")]})).expect_err("refused");
        assert_eq!(bad[0].field, "payouts[0].railOutcome");
    }

    #[test]
    fn a_submission_batch_is_valid_submissions_of_its_one_account_with_their_keys() {
        use crate::rail::SubmissionBatchRequest;
        let item = |id: &str, key: Value| json!({"payoutId": id, "amountMinor": 100, "currency": "EUR", "beneficiaryRef": "ben-1", "idempotencyKey": key});
        let ok = SubmissionBatchRequest::from_json(&json!({"accountId": "acct-1",
            "submissions": [item(A, json!("payout:a")), item(B, json!("payout:b"))]}))
        .expect("valid");
        assert_eq!(ok.submissions[1].request(&ok.account_id).account_id, "acct-1");
        let bad = SubmissionBatchRequest::from_json(&json!({"accountId": "no spaces",
            "submissions": [item(A, json!(null)), item(B, json!("payout:b"))]}))
        .expect_err("refused");
        let fields: Vec<&str> = bad.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["accountId", "submissions[0].idempotencyKey"]);
        // A submission's own accountId is the batch's, whatever it says.
        let own = SubmissionBatchRequest::from_json(&json!({"accountId": "acct-1",
            "submissions": [{"payoutId": A, "accountId": "other", "amountMinor": 1, "currency": "EUR",
                "beneficiaryRef": "b", "idempotencyKey": "k"}]}))
        .expect("valid");
        assert_eq!(own.submissions[0].request(&own.account_id).account_id, "acct-1");
    }
}
