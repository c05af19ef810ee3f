//! Bodies of the rail-proxy surface (C3 §3.5) and of the rail-stub (C3 §3.6).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::currency::is_iso_4217;
use crate::error::FieldError;

/// Longest accepted `accountId`.
pub const ACCOUNT_ID_CHARS_MAX: usize = 64;
/// Longest accepted `beneficiaryRef`.
pub const BENEFICIARY_REF_CHARS_MAX: usize = 256;

/// Outcome recorded on a `rail_submission` row (C1), also the `outcome` tag of
/// `rail_submission_total` in lower case (C4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SubmissionOutcome {
    /// Step 1 refused the token; nothing was forwarded.
    Fenced,
    /// Step 2 found a forwardable attempt for this payout; nothing was forwarded.
    Duplicate,
    /// The rail acknowledged the transfer.
    Acked,
    /// The rail declined the transfer.
    Rejected,
    /// Forwarded; outcome unknown (timeout, reset, 5xx, malformed ack). Quarantines the payout.
    Timeout,
    /// The connection to the rail could not be opened, so no byte was presented.
    Unsent,
}

impl SubmissionOutcome {
    pub const ALL: [SubmissionOutcome; 6] = [
        SubmissionOutcome::Fenced,
        SubmissionOutcome::Duplicate,
        SubmissionOutcome::Acked,
        SubmissionOutcome::Rejected,
        SubmissionOutcome::Timeout,
        SubmissionOutcome::Unsent,
    ];

    /// Column spelling, e.g. `FENCED`.
    pub fn as_str(self) -> &'static str {
        match self {
            SubmissionOutcome::Fenced => "FENCED",
            SubmissionOutcome::Duplicate => "DUPLICATE",
            SubmissionOutcome::Acked => "ACKED",
            SubmissionOutcome::Rejected => "REJECTED",
            SubmissionOutcome::Timeout => "TIMEOUT",
            SubmissionOutcome::Unsent => "UNSENT",
        }
    }

    /// Metric tag spelling, e.g. `fenced`.
    pub fn tag(self) -> &'static str {
        match self {
            SubmissionOutcome::Fenced => "fenced",
            SubmissionOutcome::Duplicate => "duplicate",
            SubmissionOutcome::Acked => "acked",
            SubmissionOutcome::Rejected => "rejected",
            SubmissionOutcome::Timeout => "timeout",
            SubmissionOutcome::Unsent => "unsent",
        }
    }

    pub fn parse(raw: &str) -> Option<SubmissionOutcome> {
        SubmissionOutcome::ALL.into_iter().find(|o| o.as_str() == raw)
    }
}

/// `POST /v1/rail/submissions` body, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubmissionRequest {
    pub payout_id: Uuid,
    #[schema(pattern = "^[a-zA-Z0-9:._-]{1,64}$", example = "acct-1")]
    pub account_id: String,
    #[schema(minimum = 1, example = 1250)]
    pub amount_minor: i64,
    #[schema(pattern = "^[A-Z]{3}$", example = "EUR")]
    pub currency: String,
    #[schema(min_length = 1, max_length = 256, example = "ben-1")]
    pub beneficiary_ref: String,
}

/// Whether an account id is 1 to 64 characters of `[a-zA-Z0-9:._-]`.
pub fn is_account_id(raw: &str) -> bool {
    !raw.is_empty()
        && raw.len() <= ACCOUNT_ID_CHARS_MAX
        && raw.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'.' | b'_' | b'-'))
}

impl SubmissionRequest {
    /// Validates a parsed JSON body field by field. Values are never echoed back in the
    /// problems, so nothing the caller sent leaks into logs through an error message.
    pub fn from_json(body: &Value) -> Result<SubmissionRequest, Vec<FieldError>> {
        let Some(obj) = body.as_object() else {
            return Err(vec![FieldError::new("$", "the body must be a JSON object")]);
        };
        let mut problems = Vec::new();
        let mut text = |name: &str| -> Option<String> {
            match obj.get(name) {
                None | Some(Value::Null) => {
                    problems.push(FieldError::new(name, "is required"));
                    None
                }
                Some(Value::String(s)) => Some(s.clone()),
                Some(_) => {
                    problems.push(FieldError::new(name, "must be a string"));
                    None
                }
            }
        };
        let payout_id = text("payoutId");
        let account_id = text("accountId");
        let currency = text("currency");
        let beneficiary_ref = text("beneficiaryRef");
        let amount_minor = match obj.get("amountMinor") {
            None | Some(Value::Null) => {
                problems.push(FieldError::new("amountMinor", "is required"));
                None
            }
            Some(Value::Number(n)) => match n.as_i64() {
                Some(v) if v > 0 => Some(v),
                Some(_) => {
                    problems.push(FieldError::new("amountMinor", "must be greater than zero"));
                    None
                }
                None => {
                    problems.push(FieldError::new("amountMinor", "must be an integer that fits in int64"));
                    None
                }
            },
            Some(_) => {
                problems.push(FieldError::new("amountMinor", "must be an integer"));
                None
            }
        };
        let payout_id = payout_id.and_then(|raw| match Uuid::parse_str(&raw) {
            Ok(id) if raw.len() == 36 => Some(id),
            _ => {
                problems.push(FieldError::new("payoutId", "must be a hyphenated UUID"));
                None
            }
        });
        let account_id = account_id.and_then(|raw| {
            if is_account_id(&raw) {
                Some(raw)
            } else {
                problems.push(FieldError::new("accountId", "must be 1 to 64 characters of [a-zA-Z0-9:._-]"));
                None
            }
        });
        let currency = currency.and_then(|raw| {
            if is_iso_4217(&raw) {
                Some(raw)
            } else {
                problems.push(FieldError::new("currency", "must be an ISO 4217 alphabetic code"));
                None
            }
        });
        let beneficiary_ref = beneficiary_ref.and_then(|raw| {
            if !raw.is_empty() && raw.chars().count() <= BENEFICIARY_REF_CHARS_MAX {
                Some(raw)
            } else {
                problems.push(FieldError::new("beneficiaryRef", "must be 1 to 256 characters"));
                None
            }
        });
        match (payout_id, account_id, amount_minor, currency, beneficiary_ref) {
            (Some(payout_id), Some(account_id), Some(amount_minor), Some(currency), Some(beneficiary_ref))
                if problems.is_empty() =>
            {
                Ok(SubmissionRequest { payout_id, account_id, amount_minor, currency, beneficiary_ref })
            }
            _ => Err(problems),
        }
    }
}

/// One submission of an R1b batch (C3-extensions E-19): the single submission's body less
/// its account (the batch's), and the payout's stable idempotency key (the single
/// submission's `X-Idempotency-Key`, recorded on its row).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubmissionBatchItem {
    pub payout_id: Uuid,
    #[schema(minimum = 1, example = 1250)]
    pub amount_minor: i64,
    #[schema(pattern = "^[A-Z]{3}$", example = "EUR")]
    pub currency: String,
    #[schema(min_length = 1, max_length = 256, example = "ben-1")]
    pub beneficiary_ref: String,
    #[schema(min_length = 1, max_length = 255, example = "payout:4b6f1b5e-8d0a-4a39-9f5e-2f1d1a0c9e11")]
    pub idempotency_key: String,
}

/// R1b `POST /v1/rail/submission-batches` body, validated: one account, 1 to
/// [`crate::batch::BATCH_PAYOUTS_MAX`] submissions, each payout once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubmissionBatchRequest {
    #[schema(pattern = "^[a-zA-Z0-9:._-]{1,64}$", example = "acct-1")]
    pub account_id: String,
    pub submissions: Vec<SubmissionBatchItem>,
}

impl SubmissionBatchItem {
    /// The single submission's body of this payout, in `account_id`.
    pub fn request(&self, account_id: &str) -> SubmissionRequest {
        SubmissionRequest {
            payout_id: self.payout_id,
            account_id: account_id.to_owned(),
            amount_minor: self.amount_minor,
            currency: self.currency.clone(),
            beneficiary_ref: self.beneficiary_ref.clone(),
        }
    }
}

impl SubmissionBatchRequest {
    /// Validates a parsed JSON body: each submission as the single submission's body (with
    /// the batch's `accountId`) plus a valid `idempotencyKey`. Values are never echoed.
    pub fn from_json(body: &Value) -> Result<SubmissionBatchRequest, Vec<FieldError>> {
        let account_id = match body.as_object().map(|o| o.get("accountId")) {
            None => return Err(vec![FieldError::new("$", "the body must be a JSON object")]),
            Some(Some(Value::String(s))) if is_account_id(s) => Ok(s.clone()),
            Some(None | Some(Value::Null)) => Err(FieldError::new("accountId", "is required")),
            Some(_) => Err(FieldError::new("accountId", "must be 1 to 64 characters of [a-zA-Z0-9:._-]")),
        };
        // Each element is validated as a single submission in a valid account, so a bad
        // `accountId` is reported once, for the batch.
        let shared = account_id.as_ref().map(String::as_str).unwrap_or("acct");
        let submissions = crate::batch::validate_elements(
            body,
            "submissions",
            |v| {
                let mut one = v.clone();
                if let Some(o) = one.as_object_mut() {
                    o.insert("accountId".into(), Value::String(shared.to_owned()));
                }
                let single = SubmissionRequest::from_json(&one);
                let key = match v.get("idempotencyKey") {
                    Some(Value::String(k)) => crate::IdempotencyKey::parse(k)
                        .map(|_| k.clone())
                        .map_err(|_| FieldError::new("idempotencyKey", "must be 1 to 255 visible ASCII characters")),
                    None | Some(Value::Null) => Err(FieldError::new("idempotencyKey", "is required")),
                    Some(_) => Err(FieldError::new("idempotencyKey", "must be a string")),
                };
                match (single, key) {
                    (Ok(s), Ok(idempotency_key)) => Ok(SubmissionBatchItem {
                        payout_id: s.payout_id,
                        amount_minor: s.amount_minor,
                        currency: s.currency,
                        beneficiary_ref: s.beneficiary_ref,
                        idempotency_key,
                    }),
                    (single, key) => {
                        let mut problems = single.err().unwrap_or_default();
                        problems.extend(key.err());
                        Err(problems)
                    }
                }
            },
            |i| i.payout_id,
        );
        match (account_id, submissions) {
            (Ok(account_id), Ok(submissions)) => Ok(SubmissionBatchRequest { account_id, submissions }),
            (account_id, submissions) => {
                let mut problems: Vec<FieldError> = account_id.err().into_iter().collect();
                problems.extend(submissions.err().unwrap_or_default());
                Err(problems)
            }
        }
    }
}

/// `200` body of `POST /v1/rail/submissions` (C3 §3.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubmissionAck {
    pub submission_id: Uuid,
    pub payout_id: Uuid,
    pub presented_token: i64,
    pub outcome: SubmissionOutcome,
    pub rail_reference: String,
    #[serde(with = "crate::time::ms")]
    pub submitted_at: DateTime<Utc>,
    #[serde(with = "crate::time::ms")]
    pub resolved_at: DateTime<Utc>,
}

/// `POST /submit` body of the rail (C3 §3.6). No token, no idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RailSubmit {
    #[schema(min_length = 1, max_length = 128, example = "4b6f1b5e-8d0a-4a39-9f5e-2f1d1a0c9e11")]
    pub client_ref: String,
    pub amount_minor: i64,
    #[schema(min_length = 1, example = "EUR")]
    pub currency: String,
}

/// `200` body of the rail's `POST /submit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RailAck {
    pub rail_reference: String,
    #[serde(with = "crate::time::ms")]
    pub accepted_at: DateTime<Utc>,
}

/// What the rail did with one inbound call, as its own record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RailCallOutcome {
    /// Paid and answered 200 (the caller may still have stopped listening).
    Accepted,
    /// Not paid; answered 402.
    Declined,
    /// Not paid; answered 5xx.
    Error,
    /// Connection held open, then dropped without an answer. `paid` says whether money moved.
    Dropped,
}

/// One entry of the rail's call log (`GET /calls`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RailCall {
    pub client_ref: String,
    pub amount_minor: i64,
    pub currency: String,
    pub outcome: RailCallOutcome,
    /// Whether this call moved money. A payout paid twice has two entries with `paid`.
    pub paid: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rail_reference: Option<String>,
    #[serde(with = "crate::time::ms")]
    pub received_at: DateTime<Utc>,
}

/// `GET /calls` body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RailCallLog {
    pub calls: Vec<RailCall>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn good() -> Value {
        json!({
            "payoutId": "4b6f1b5e-8d0a-4a39-9f5e-2f1d1a0c9e11",
            "accountId": "acct:1",
            "amountMinor": 1250,
            "currency": "EUR",
            "beneficiaryRef": "ben-1"
        })
    }

    #[test]
    fn submission_body_accepts_a_well_formed_request() {
        let r = SubmissionRequest::from_json(&good()).expect("valid");
        assert_eq!(r.amount_minor, 1250);
        assert_eq!(r.account_id, "acct:1");
    }

    #[test]
    fn submission_body_names_every_bad_field_without_echoing_values() {
        let body = json!({"payoutId": "nope", "amountMinor": 0, "currency": "eur", "beneficiaryRef": 5});
        let problems = SubmissionRequest::from_json(&body).expect_err("invalid");
        let fields: Vec<_> = problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["accountId", "beneficiaryRef", "amountMinor", "payoutId", "currency"]);
        assert!(problems.iter().all(|p| !p.problem.contains("nope")));
    }

    #[test]
    fn submission_body_rejects_amounts_that_are_not_positive_int64() {
        for amount in [json!(-1), json!(1.5), json!("10"), json!(9_223_372_036_854_775_808u64)] {
            let mut body = good();
            body["amountMinor"] = amount.clone();
            assert!(SubmissionRequest::from_json(&body).is_err(), "{amount}");
        }
    }

    #[test]
    fn submission_body_must_be_an_object() {
        assert!(SubmissionRequest::from_json(&json!([1, 2])).is_err());
    }

    #[test]
    fn outcome_spellings_round_trip() {
        for o in SubmissionOutcome::ALL {
            assert_eq!(SubmissionOutcome::parse(o.as_str()), Some(o));
            assert_eq!(o.tag(), o.as_str().to_ascii_lowercase());
        }
    }
}
