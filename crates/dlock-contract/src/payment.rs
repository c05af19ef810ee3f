//! Bodies of the payment-resource surface (C3 §3.4): P1–P5 and the two create endpoints.
//!
//! Every request type has `from_json`, which validates a parsed body field by field, reports
//! every bad field at once and never echoes a value the caller sent. Unknown fields are
//! ignored. The validated, typed request is also what the idempotency fingerprint is taken
//! over, so two bodies that validate to the same request fingerprint the same.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::currency::is_iso_4217;
use crate::error::FieldError;
use crate::payout::PayoutState;
use crate::rail::{is_account_id, SubmissionOutcome, BENEFICIARY_REF_CHARS_MAX};

/// Largest accepted `amountMinor` (10¹⁵). Small enough that no SUM over one account's
/// payouts or ledger entries can overflow int64.
pub const AMOUNT_MINOR_MAX: i64 = 1_000_000_000_000_000;
/// Largest accepted `openingBalanceMinor` (10¹⁵).
pub const OPENING_BALANCE_MINOR_MAX: i64 = AMOUNT_MINOR_MAX;
/// Largest accepted P1 `limit`.
pub const P1_LIMIT_MAX: u32 = 500;
/// P1 `limit` when the query names none.
pub const P1_LIMIT_DEFAULT: u32 = 100;
/// Longest accepted P1 `cursor`.
pub const CURSOR_CHARS_MAX: usize = 512;
/// Longest accepted `railReference`.
pub const RAIL_REFERENCE_CHARS_MAX: usize = 256;

const _: () = assert!(1 <= P1_LIMIT_DEFAULT && P1_LIMIT_DEFAULT <= P1_LIMIT_MAX);

/// The only `railOutcome` a post accepts.
const RAIL_OUTCOME_ACKED: &str = "ACKED";

/// Reads the fields of one JSON object, collecting a [`FieldError`] per bad field.
struct Fields<'a> {
    obj: &'a Map<String, Value>,
    problems: Vec<FieldError>,
}

impl<'a> Fields<'a> {
    fn of(body: &'a Value) -> Result<Fields<'a>, Vec<FieldError>> {
        match body.as_object() {
            Some(obj) => Ok(Fields { obj, problems: Vec::new() }),
            None => Err(vec![FieldError::new("$", "the body must be a JSON object")]),
        }
    }

    fn problem(&mut self, name: &str, problem: &str) {
        self.problems.push(FieldError::new(name, problem));
    }

    /// A string field; `None` when absent or null (not recorded as a problem).
    fn optional_text(&mut self, name: &str) -> Option<Option<&'a str>> {
        match self.obj.get(name) {
            None | Some(Value::Null) => Some(None),
            Some(Value::String(s)) => Some(Some(s.as_str())),
            Some(_) => {
                self.problem(name, "must be a string");
                None
            }
        }
    }

    /// A required string field.
    fn text(&mut self, name: &str) -> Option<&'a str> {
        match self.optional_text(name) {
            Some(Some(s)) => Some(s),
            Some(None) => {
                self.problem(name, "is required");
                None
            }
            None => None,
        }
    }

    /// A required string of 1 to `max` characters.
    fn bounded_text(&mut self, name: &str, max: usize, problem: &str) -> Option<String> {
        let raw = self.text(name)?;
        if !raw.is_empty() && raw.chars().count() <= max {
            Some(raw.to_owned())
        } else {
            self.problem(name, problem);
            None
        }
    }

    /// A required string held to `rule`, whose message is the problem.
    fn ruled<T>(&mut self, name: &str, rule: impl FnOnce(&str) -> Result<T, String>) -> Option<T> {
        let raw = self.text(name)?;
        match rule(raw) {
            Ok(v) => Some(v),
            Err(problem) => {
                self.problem(name, &problem);
                None
            }
        }
    }

    /// A required account id (1 to 64 characters of `[a-zA-Z0-9:._-]`).
    fn account_id(&mut self, name: &str) -> Option<String> {
        let raw = self.text(name)?;
        if is_account_id(raw) {
            Some(raw.to_owned())
        } else {
            self.problem(name, "must be 1 to 64 characters of [a-zA-Z0-9:._-]");
            None
        }
    }

    /// A required ISO 4217 alphabetic code.
    fn currency(&mut self, name: &str) -> Option<String> {
        let raw = self.text(name)?;
        if is_iso_4217(raw) {
            Some(raw.to_owned())
        } else {
            self.problem(name, "must be an ISO 4217 alphabetic code");
            None
        }
    }

    /// Parses a hyphenated, 36-character UUID.
    fn uuid_of(&mut self, name: &str, raw: &str) -> Option<Uuid> {
        match Uuid::parse_str(raw) {
            Ok(id) if raw.len() == 36 => Some(id),
            _ => {
                self.problem(name, "must be a hyphenated UUID");
                None
            }
        }
    }

    /// A required hyphenated UUID.
    fn uuid(&mut self, name: &str) -> Option<Uuid> {
        let raw = self.text(name)?;
        self.uuid_of(name, raw)
    }

    /// An optional hyphenated UUID: `Some(None)` when absent or null, `None` when bad.
    fn optional_uuid(&mut self, name: &str) -> Option<Option<Uuid>> {
        match self.optional_text(name)? {
            None => Some(None),
            Some(raw) => self.uuid_of(name, raw).map(Some),
        }
    }

    /// A required JSON integer in `min..=max`. Floats (`1.5`, `1.0`, `1e3`), strings and
    /// integers beyond int64 are refused, never coerced.
    fn integer(&mut self, name: &str, min: i64, max: i64) -> Option<i64> {
        let n = match self.obj.get(name) {
            None | Some(Value::Null) => {
                self.problem(name, "is required");
                return None;
            }
            Some(Value::Number(n)) => n,
            Some(_) => {
                self.problem(name, "must be an integer");
                return None;
            }
        };
        if let Some(v) = n.as_i64() {
            if (min..=max).contains(&v) {
                return Some(v);
            }
            self.problem(name, &format!("must be between {min} and {max}"));
        } else if n.as_u64().is_some() {
            self.problem(name, "must be an integer that fits in int64");
        } else {
            // A float. A whole one that large was an integer literal beyond int64.
            let beyond_int64 = -(i64::MIN as f64); // 2^63, exact
            let whole_and_huge = n.as_f64().is_some_and(|f| f.fract() == 0.0 && f.abs() >= beyond_int64);
            if whole_and_huge {
                self.problem(name, "must be an integer that fits in int64");
            } else {
                self.problem(name, "must be an integer, written without a fraction or exponent");
            }
        }
        None
    }

    fn finish<T>(self, value: Option<T>) -> Result<T, Vec<FieldError>> {
        match value {
            Some(value) if self.problems.is_empty() => Ok(value),
            _ => Err(self.problems),
        }
    }
}

/// `POST /v1/accounts` body, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NewAccountRequest {
    #[schema(pattern = "^[a-zA-Z0-9:._-]{1,64}$", example = "acct-1")]
    pub account_id: String,
    #[schema(pattern = "^[A-Z]{3}$", example = "EUR")]
    pub currency: String,
    #[schema(minimum = 0, maximum = 1_000_000_000_000_000_i64, example = 100_000)]
    pub opening_balance_minor: i64,
}

impl NewAccountRequest {
    /// Validates a parsed JSON body; see the module documentation.
    pub fn from_json(body: &Value) -> Result<NewAccountRequest, Vec<FieldError>> {
        let mut f = Fields::of(body)?;
        let account_id = f.account_id("accountId");
        let currency = f.currency("currency");
        let opening_balance_minor = f.integer("openingBalanceMinor", 0, OPENING_BALANCE_MINOR_MAX);
        let value = match (account_id, currency, opening_balance_minor) {
            (Some(account_id), Some(currency), Some(opening_balance_minor)) => {
                Some(NewAccountRequest { account_id, currency, opening_balance_minor })
            }
            _ => None,
        };
        f.finish(value)
    }
}

/// `POST /v1/payouts` body, validated. Without `payoutId` the service generates one; the
/// fingerprint then sees `null`, not the generated id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NewPayoutRequest {
    #[schema(required = false)]
    pub payout_id: Option<Uuid>,
    #[schema(pattern = "^[a-zA-Z0-9:._-]{1,64}$", example = "acct-1")]
    pub account_id: String,
    #[schema(minimum = 1, maximum = 1_000_000_000_000_000_i64, example = 1250)]
    pub amount_minor: i64,
    #[schema(pattern = "^[A-Z]{3}$", example = "EUR")]
    pub currency: String,
    #[schema(min_length = 1, max_length = 256, example = "ben-1")]
    pub beneficiary_ref: String,
}

impl NewPayoutRequest {
    /// Validates a parsed JSON body; see the module documentation.
    pub fn from_json(body: &Value) -> Result<NewPayoutRequest, Vec<FieldError>> {
        let mut f = Fields::of(body)?;
        let payout_id = f.optional_uuid("payoutId");
        let account_id = f.account_id("accountId");
        let amount_minor = f.integer("amountMinor", 1, AMOUNT_MINOR_MAX);
        let currency = f.currency("currency");
        let beneficiary_ref =
            f.bounded_text("beneficiaryRef", BENEFICIARY_REF_CHARS_MAX, "must be 1 to 256 characters");
        let value = match (payout_id, account_id, amount_minor, currency, beneficiary_ref) {
            (Some(payout_id), Some(account_id), Some(amount_minor), Some(currency), Some(beneficiary_ref)) => {
                Some(NewPayoutRequest { payout_id, account_id, amount_minor, currency, beneficiary_ref })
            }
            _ => None,
        };
        f.finish(value)
    }
}

/// P2 `POST /v1/payouts/{payoutId}/claim` body, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRequest {
    /// `PENDING` for a first claim, `CLAIMED` for a recovery re-claim. Nothing else.
    #[schema(example = "PENDING")]
    pub expected_state: PayoutState,
}

impl ClaimRequest {
    /// Validates a parsed JSON body; see the module documentation.
    pub fn from_json(body: &Value) -> Result<ClaimRequest, Vec<FieldError>> {
        let mut f = Fields::of(body)?;
        let expected_state = f.text("expectedState").and_then(|raw| match PayoutState::parse(raw) {
            Some(s @ (PayoutState::Pending | PayoutState::Claimed)) => Some(s),
            Some(_) => {
                f.problem("expectedState", "must be PENDING or CLAIMED; a claim starts from no other state");
                None
            }
            None => {
                f.problem("expectedState", "must be PENDING or CLAIMED");
                None
            }
        });
        let value = expected_state.map(|expected_state| ClaimRequest { expected_state });
        f.finish(value)
    }
}

/// P3 `POST /v1/payouts/{payoutId}/post` body, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostRequest {
    #[schema(min_length = 1, max_length = 256, example = "rail-ref-1")]
    pub rail_reference: String,
    pub submission_id: Uuid,
    /// Always `ACKED`: only an acknowledged transfer is posted.
    #[schema(pattern = "^ACKED$", example = "ACKED")]
    pub rail_outcome: String,
}

impl PostRequest {
    /// Validates a parsed JSON body; see the module documentation.
    pub fn from_json(body: &Value) -> Result<PostRequest, Vec<FieldError>> {
        let mut f = Fields::of(body)?;
        let rail_reference = f.bounded_text("railReference", RAIL_REFERENCE_CHARS_MAX, "must be 1 to 256 characters");
        let submission_id = f.uuid("submissionId");
        let rail_outcome = f.text("railOutcome").and_then(|raw| {
            if raw == RAIL_OUTCOME_ACKED {
                Some(raw.to_owned())
            } else {
                f.problem("railOutcome", "must be ACKED");
                None
            }
        });
        let value = match (rail_reference, submission_id, rail_outcome) {
            (Some(rail_reference), Some(submission_id), Some(rail_outcome)) => {
                Some(PostRequest { rail_reference, submission_id, rail_outcome })
            }
            _ => None,
        };
        f.finish(value)
    }
}

/// The `payouts` of a P2b or P3b body (C3-extensions E-19): each element a `payoutId` and a
/// valid body of the single write (`single`), made into its item by `item`; 1 to
/// [`crate::batch::BATCH_PAYOUTS_MAX`] of them, each payout once.
fn payouts_of<S, I>(
    body: &Value,
    single: fn(&Value) -> Result<S, Vec<FieldError>>,
    item: fn(Uuid, S) -> I,
    payout_id: fn(&I) -> Uuid,
) -> Result<Vec<I>, Vec<FieldError>> {
    crate::batch::validate_elements(
        body,
        "payouts",
        |v| {
            let mut f = Fields::of(v)?;
            let payout_id = f.uuid("payoutId");
            let value = match (payout_id, single(v)) {
                (Some(id), Ok(s)) => Some(item(id, s)),
                (_, Err(problems)) => {
                    f.problems.extend(problems);
                    None
                }
                _ => None,
            };
            f.finish(value)
        },
        payout_id,
    )
}

/// One payout of a P2b batch claim (C3-extensions E-19): its id and P2's body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimBatchItem {
    pub payout_id: Uuid,
    /// `PENDING` for a first claim, `CLAIMED` for a recovery re-claim. Nothing else.
    #[schema(example = "PENDING")]
    pub expected_state: PayoutState,
}

/// P2b `POST /v1/accounts/{accountId}/claims` body, validated: 1 to
/// [`crate::batch::BATCH_PAYOUTS_MAX`] payouts, each once, each a valid P2 body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimBatchRequest {
    pub payouts: Vec<ClaimBatchItem>,
}

impl ClaimBatchRequest {
    /// Validates a parsed JSON body; see the module documentation.
    pub fn from_json(body: &Value) -> Result<ClaimBatchRequest, Vec<FieldError>> {
        let item = |payout_id, c: ClaimRequest| ClaimBatchItem { payout_id, expected_state: c.expected_state };
        let payouts = payouts_of(body, ClaimRequest::from_json, item, |i| i.payout_id)?;
        Ok(ClaimBatchRequest { payouts })
    }
}

/// One payout of a P3b batch post (C3-extensions E-19): its id and P3's body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostBatchItem {
    pub payout_id: Uuid,
    #[schema(min_length = 1, max_length = 256, example = "rail-ref-1")]
    pub rail_reference: String,
    pub submission_id: Uuid,
    /// Always `ACKED`: only an acknowledged transfer is posted.
    #[schema(pattern = "^ACKED$", example = "ACKED")]
    pub rail_outcome: String,
}

impl PostBatchItem {
    /// The single post's body of this payout.
    pub fn request(&self) -> PostRequest {
        PostRequest {
            rail_reference: self.rail_reference.clone(),
            submission_id: self.submission_id,
            rail_outcome: self.rail_outcome.clone(),
        }
    }
}

/// P3b `POST /v1/accounts/{accountId}/posts` body, validated: 1 to
/// [`crate::batch::BATCH_PAYOUTS_MAX`] payouts, each once, each a valid P3 body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostBatchRequest {
    pub payouts: Vec<PostBatchItem>,
}

impl PostBatchRequest {
    /// Validates a parsed JSON body; see the module documentation.
    pub fn from_json(body: &Value) -> Result<PostBatchRequest, Vec<FieldError>> {
        let item = |payout_id, p: PostRequest| PostBatchItem {
            payout_id,
            rail_reference: p.rail_reference,
            submission_id: p.submission_id,
            rail_outcome: p.rail_outcome,
        };
        let payouts = payouts_of(body, PostRequest::from_json, item, |i| i.payout_id)?;
        Ok(PostBatchRequest { payouts })
    }
}

/// `POST /v1/payouts/{payoutId}/resolution` body (C3-extensions E-21), validated: an
/// operator's verdict on a RAIL_AMBIGUOUS payout. Each field is held to the rule
/// `dlock resolve` applies ([`crate::resolution`]); the operator is the request's
/// `X-Owner-Id`, not a body field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolutionRequest {
    /// `POSTED` (the rail paid: the ledger entries are written) or `FAILED` (it did not: the
    /// reservation is released). Nothing else.
    #[schema(example = "POSTED")]
    pub resolved_as: PayoutState,
    /// Why: what the rail's statement shows. 8 to 1 000 characters, at least 8 of them not
    /// blanks, no control character.
    #[schema(min_length = 8, max_length = 1000, example = "rail statement 2026-03-01 line 42 shows the transfer")]
    pub reason: String,
    /// The rail's reference (or statement line) the verdict rests on: 1 to 128 visible ASCII
    /// characters.
    #[schema(min_length = 1, max_length = 128, pattern = "^[!-~]{1,128}$", example = "RR-00ff")]
    pub rail_reference: String,
}

impl ResolutionRequest {
    /// Validates a parsed JSON body; see the module documentation.
    pub fn from_json(body: &Value) -> Result<ResolutionRequest, Vec<FieldError>> {
        use crate::resolution::{parse_rail_reference, parse_reason, parse_resolved_as};
        let mut f = Fields::of(body)?;
        let resolved_as = f.ruled("resolvedAs", parse_resolved_as);
        let reason = f.ruled("reason", parse_reason);
        let rail_reference = f.ruled("railReference", parse_rail_reference);
        let value = match (resolved_as, reason, rail_reference) {
            (Some(resolved_as), Some(reason), Some(rail_reference)) => {
                Some(ResolutionRequest { resolved_as, reason, rail_reference })
            }
            _ => None,
        };
        f.finish(value)
    }
}

/// `200` body of P2.
///
/// Since issue 14 (C3-extensions C-30) the answer also carries the payout's immutable terms
/// (`accountId`, `amountMinor`, `currency`, `beneficiaryRef`), read by the claim's own
/// transaction, so a worker can submit without reading the payout again. They are optional
/// on the wire: a recorded answer from before the change (replayed under its idempotency
/// key) lacks them, and a client then reads the payout (P4) instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimAck {
    pub payout_id: Uuid,
    pub state: PayoutState,
    pub claim_token: i64,
    /// The account's fence after the claim (equal to `claimToken`).
    pub account_fence: i64,
    pub attempt_count: i32,
    pub idempotency_key: String,
    /// The payout's account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_id: Option<String>,
    /// The payout's amount, in minor units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount_minor: Option<i64>,
    /// The payout's ISO 4217 currency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// The payout's beneficiary reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beneficiary_ref: Option<String>,
}

/// The payout terms a [`ClaimAck`] carries (all four, or none of them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedTerms {
    pub account_id: String,
    pub amount_minor: i64,
    pub currency: String,
    pub beneficiary_ref: String,
}

impl ClaimAck {
    /// The payout's terms, when the answer carries all of them (`None` for a recorded answer
    /// from before they were added, or one missing any).
    pub fn terms(&self) -> Option<ClaimedTerms> {
        Some(ClaimedTerms {
            account_id: self.account_id.clone()?,
            amount_minor: self.amount_minor?,
            currency: self.currency.clone()?,
            beneficiary_ref: self.beneficiary_ref.clone()?,
        })
    }
}

/// One ledger entry in a P3 answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EntryBody {
    pub entry_id: Uuid,
    pub account_id: String,
    /// `DEBIT` or `CREDIT`.
    pub direction: String,
    pub amount_minor: i64,
    pub fence: i64,
}

/// `200` body of P3.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostAck {
    pub payout_id: Uuid,
    pub state: PayoutState,
    /// Two balanced entries.
    pub entries: Vec<EntryBody>,
    /// The payout account's balance after the post.
    pub balance_minor: i64,
}

/// `200` body of `POST /v1/payouts/{payoutId}/resolution` (C3-extensions E-21).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolutionAck {
    pub payout_id: Uuid,
    /// `POSTED` or `FAILED`: the verdict, now the payout's state.
    pub state: PayoutState,
    /// The audit row's id (`payout_resolutions.resolution_id`).
    pub resolution_id: Uuid,
    /// The payout account's balance after the resolution (debited for `POSTED`, unchanged
    /// for `FAILED`, whose reservation is released).
    pub balance_minor: i64,
}

/// One rail submission in a P4 answer, in `seq` order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubmissionBody {
    pub submission_id: Uuid,
    pub presented_token: i64,
    /// `null` while the attempt is unresolved.
    pub outcome: Option<SubmissionOutcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rail_reference: Option<String>,
    #[serde(with = "crate::time::ms")]
    pub submitted_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "crate::time::ms_opt")]
    pub resolved_at: Option<DateTime<Utc>>,
}

/// `200` body of P4 and `201` body of `POST /v1/payouts`. Advisory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PayoutBody {
    pub payout_id: Uuid,
    pub account_id: String,
    pub amount_minor: i64,
    pub currency: String,
    pub beneficiary_ref: String,
    pub state: PayoutState,
    pub attempt_count: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_token: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "crate::time::ms_opt")]
    pub claimed_at: Option<DateTime<Utc>>,
    #[serde(with = "crate::time::ms")]
    pub created_at: DateTime<Utc>,
    #[serde(with = "crate::time::ms")]
    pub updated_at: DateTime<Utc>,
    pub submissions: Vec<SubmissionBody>,
}

/// `200` body of P5 and `201` body of `POST /v1/accounts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccountBody {
    pub account_id: String,
    pub currency: String,
    pub balance_minor: i64,
    pub fence: i64,
    /// Recomputed from the ledger; equals `balanceMinor` (FR-25).
    pub ledger_sum_minor: i64,
    /// Balance less the amounts reserved by the account's in-flight payouts.
    pub available_minor: i64,
    #[serde(with = "crate::time::ms")]
    pub created_at: DateTime<Utc>,
    #[serde(with = "crate::time::ms")]
    pub updated_at: DateTime<Utc>,
}

/// One row of a P1 page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PayoutItem {
    pub payout_id: Uuid,
    pub account_id: String,
    pub amount_minor: i64,
    pub currency: String,
    pub state: PayoutState,
    pub attempt_count: i32,
    #[serde(with = "crate::time::ms")]
    pub created_at: DateTime<Utc>,
}

/// `200` body of P1.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PayoutPage {
    pub items: Vec<PayoutItem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use serde_json::json;

    const PAYOUT_ID: &str = "4b6f1b5e-8d0a-4a39-9f5e-2f1d1a0c9e11";
    const SUBMISSION_ID: &str = "7c1e0d2a-3b4f-4c5d-8e6f-a0b1c2d3e4f5";

    fn fields(problems: &[FieldError]) -> Vec<&str> {
        problems.iter().map(|p| p.field.as_str()).collect()
    }

    fn problem_of<'a>(problems: &'a [FieldError], field: &str) -> &'a str {
        problems.iter().find(|p| p.field == field).map(|p| p.problem.as_str()).unwrap_or("<none>")
    }

    /// Asserts that no problem text contains `secret`.
    fn echoes_nothing(problems: &[FieldError], secret: &str) {
        for p in problems {
            assert!(!p.problem.contains(secret), "{} echoes {secret}: {}", p.field, p.problem);
            assert!(!p.field.contains(secret), "{} echoes {secret}", p.field);
        }
    }

    fn account() -> Value {
        json!({"accountId": "acct:1", "currency": "EUR", "openingBalanceMinor": 5000})
    }

    fn payout() -> Value {
        json!({
            "payoutId": PAYOUT_ID,
            "accountId": "acct:1",
            "amountMinor": 1250,
            "currency": "EUR",
            "beneficiaryRef": "ben-1"
        })
    }

    fn post() -> Value {
        json!({"railReference": "rail-77", "submissionId": SUBMISSION_ID, "railOutcome": "ACKED"})
    }

    fn t(ms: i64) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(ms).single().expect("valid instant")
    }

    // ---- constants -------------------------------------------------------------------

    #[test]
    fn amount_bound_leaves_room_for_sums_in_int64() {
        assert_eq!(AMOUNT_MINOR_MAX, 10_i64.pow(15));
        assert_eq!(OPENING_BALANCE_MINOR_MAX, AMOUNT_MINOR_MAX);
        assert!(AMOUNT_MINOR_MAX.checked_mul(9_000).is_some());
    }

    // ---- the resolution (C3-extensions E-21) --------------------------------------------

    #[test]
    fn a_resolution_body_is_held_to_dlock_resolves_rules_and_reports_every_bad_field() {
        let ok = json!({"resolvedAs": "FAILED", "reason": "statement line 42 shows nothing", "railReference": "none"});
        let r = ResolutionRequest::from_json(&ok).expect("valid");
        assert_eq!(r.resolved_as, PayoutState::Failed);
        assert_eq!((r.reason.as_str(), r.rail_reference.as_str()), ("statement line 42 shows nothing", "none"));
        let p = ResolutionRequest::from_json(&json!({})).expect_err("empty");
        assert_eq!(fields(&p), ["resolvedAs", "reason", "railReference"]);
        let hostile = "<script> alert(1)</script>";
        let bad = json!({"resolvedAs": "RAIL_AMBIGUOUS", "reason": "short", "railReference": hostile});
        let p = ResolutionRequest::from_json(&bad).expect_err("bad");
        assert_eq!(fields(&p), ["resolvedAs", "reason", "railReference"]);
        assert_eq!(problem_of(&p, "resolvedAs"), "the verdict is POSTED or FAILED");
        echoes_nothing(&p, "<script>");
        let p = ResolutionRequest::from_json(&json!({"resolvedAs": "POSTED", "reason": "line\nbreak here",
            "railReference": 7}))
        .expect_err("types");
        assert_eq!(fields(&p), ["reason", "railReference"]);
        assert_eq!(problem_of(&p, "railReference"), "must be a string");
    }

    // ---- bodies that are not objects ---------------------------------------------------

    #[test]
    fn every_request_must_be_an_object() {
        for body in [json!([1, 2]), json!("x"), json!(null), json!(3)] {
            for problems in [
                NewAccountRequest::from_json(&body).expect_err("account"),
                NewPayoutRequest::from_json(&body).expect_err("payout"),
                ClaimRequest::from_json(&body).expect_err("claim"),
                PostRequest::from_json(&body).expect_err("post"),
            ] {
                assert_eq!(fields(&problems), ["$"]);
            }
        }
    }

    #[test]
    fn an_empty_object_names_every_required_field() {
        let empty = json!({});
        let p = NewAccountRequest::from_json(&empty).expect_err("account");
        assert_eq!(fields(&p), ["accountId", "currency", "openingBalanceMinor"]);
        let p = NewPayoutRequest::from_json(&empty).expect_err("payout");
        assert_eq!(fields(&p), ["accountId", "amountMinor", "currency", "beneficiaryRef"]);
        let p = ClaimRequest::from_json(&empty).expect_err("claim");
        assert_eq!(fields(&p), ["expectedState"]);
        let p = PostRequest::from_json(&empty).expect_err("post");
        assert_eq!(fields(&p), ["railReference", "submissionId", "railOutcome"]);
        for p in [
            NewAccountRequest::from_json(&empty).expect_err("account"),
            NewPayoutRequest::from_json(&empty).expect_err("payout"),
            ClaimRequest::from_json(&empty).expect_err("claim"),
            PostRequest::from_json(&empty).expect_err("post"),
        ] {
            assert!(p.iter().all(|e| e.problem == "is required"));
        }
    }

    #[test]
    fn null_counts_as_absent() {
        let mut body = account();
        body["currency"] = Value::Null;
        let p = NewAccountRequest::from_json(&body).expect_err("null currency");
        assert_eq!(fields(&p), ["currency"]);
        assert_eq!(problem_of(&p, "currency"), "is required");
    }

    // ---- NewAccountRequest ------------------------------------------------------------

    #[test]
    fn account_accepts_a_well_formed_body_and_ignores_unknown_fields() {
        let mut body = account();
        body["nickname"] = json!({"anything": [1, 2, 3]});
        let r = NewAccountRequest::from_json(&body).expect("valid");
        assert_eq!(
            r,
            NewAccountRequest { account_id: "acct:1".into(), currency: "EUR".into(), opening_balance_minor: 5000 }
        );
        assert_eq!(
            serde_json::to_value(&r).expect("ser"),
            json!({"accountId": "acct:1", "currency": "EUR", "openingBalanceMinor": 5000})
        );
    }

    #[test]
    fn account_opening_balance_bounds_are_inclusive() {
        for (v, ok) in
            [(0, true), (OPENING_BALANCE_MINOR_MAX, true), (-1, false), (OPENING_BALANCE_MINOR_MAX + 1, false)]
        {
            let mut body = account();
            body["openingBalanceMinor"] = json!(v);
            assert_eq!(NewAccountRequest::from_json(&body).is_ok(), ok, "{v}");
        }
    }

    #[test]
    fn account_names_every_bad_field_without_echoing_values() {
        let body = json!({"accountId": "bad id!secret", "currency": "SECRETCUR", "openingBalanceMinor": -777_123});
        let p = NewAccountRequest::from_json(&body).expect_err("invalid");
        assert_eq!(fields(&p), ["accountId", "currency", "openingBalanceMinor"]);
        assert_eq!(problem_of(&p, "accountId"), "must be 1 to 64 characters of [a-zA-Z0-9:._-]");
        assert_eq!(problem_of(&p, "currency"), "must be an ISO 4217 alphabetic code");
        assert_eq!(problem_of(&p, "openingBalanceMinor"), "must be between 0 and 1000000000000000");
        for secret in ["secret", "SECRETCUR", "777123", "-777"] {
            echoes_nothing(&p, secret);
        }
    }

    #[test]
    fn account_id_longer_than_64_is_refused() {
        let mut body = account();
        body["accountId"] = json!("a".repeat(65));
        assert_eq!(fields(&NewAccountRequest::from_json(&body).expect_err("long")), ["accountId"]);
        body["accountId"] = json!("a".repeat(64));
        assert!(NewAccountRequest::from_json(&body).is_ok());
        body["accountId"] = json!("");
        assert_eq!(fields(&NewAccountRequest::from_json(&body).expect_err("empty")), ["accountId"]);
    }

    #[test]
    fn strings_where_strings_belong_are_checked_for_type() {
        let body = json!({"accountId": 12, "currency": ["EUR"], "openingBalanceMinor": 1});
        let p = NewAccountRequest::from_json(&body).expect_err("types");
        assert_eq!(fields(&p), ["accountId", "currency"]);
        assert!(p.iter().all(|e| e.problem == "must be a string"));
    }

    // ---- integers -----------------------------------------------------------------------

    #[test]
    fn integers_refuse_strings_floats_and_int64_overflow() {
        let cases = [
            (json!("1250"), "must be an integer"),
            (json!(true), "must be an integer"),
            (json!({"v": 1}), "must be an integer"),
            (json!(1.5), "must be an integer, written without a fraction or exponent"),
            (json!(1250.0), "must be an integer, written without a fraction or exponent"),
            (json!(9_223_372_036_854_775_808u64), "must be an integer that fits in int64"),
            (json!(u64::MAX), "must be an integer that fits in int64"),
            (json!(1e20), "must be an integer that fits in int64"),
            (json!(-1e19), "must be an integer that fits in int64"),
            (json!(i64::MIN), "must be between 1 and 1000000000000000"),
            (json!(i64::MAX), "must be between 1 and 1000000000000000"),
            (json!(0), "must be between 1 and 1000000000000000"),
            (json!(-5), "must be between 1 and 1000000000000000"),
        ];
        for (amount, expected) in cases {
            let mut body = payout();
            body["amountMinor"] = amount.clone();
            let p = NewPayoutRequest::from_json(&body).expect_err("invalid amount");
            assert_eq!(fields(&p), ["amountMinor"], "{amount}");
            assert_eq!(problem_of(&p, "amountMinor"), expected, "{amount}");
        }
    }

    #[test]
    fn integers_parsed_from_text_beyond_int64_are_refused() {
        for text in [
            r#"{"accountId":"a","currency":"EUR","openingBalanceMinor":9223372036854775808}"#,
            r#"{"accountId":"a","currency":"EUR","openingBalanceMinor":100000000000000000000000}"#,
            r#"{"accountId":"a","currency":"EUR","openingBalanceMinor":-9223372036854775809}"#,
        ] {
            let body: Value = serde_json::from_str(text).expect("json");
            let p = NewAccountRequest::from_json(&body).expect_err("overflow");
            assert_eq!(problem_of(&p, "openingBalanceMinor"), "must be an integer that fits in int64", "{text}");
        }
        let body: Value =
            serde_json::from_str(r#"{"accountId":"a","currency":"EUR","openingBalanceMinor":1e3}"#).expect("json");
        let p = NewAccountRequest::from_json(&body).expect_err("exponent");
        assert_eq!(problem_of(&p, "openingBalanceMinor"), "must be an integer, written without a fraction or exponent");
    }

    // ---- NewPayoutRequest -----------------------------------------------------------------

    #[test]
    fn payout_accepts_a_well_formed_body() {
        let r = NewPayoutRequest::from_json(&payout()).expect("valid");
        assert_eq!(r.payout_id, Some(Uuid::parse_str(PAYOUT_ID).expect("uuid")));
        assert_eq!(r.amount_minor, 1250);
        assert_eq!(r.beneficiary_ref, "ben-1");
    }

    #[test]
    fn payout_id_is_optional_and_serialises_as_null_when_absent() {
        for absent in [None, Some(Value::Null)] {
            let mut body = payout();
            match absent {
                None => {
                    body.as_object_mut().expect("object").remove("payoutId");
                }
                Some(v) => body["payoutId"] = v,
            }
            let r = NewPayoutRequest::from_json(&body).expect("valid");
            assert_eq!(r.payout_id, None);
            let wire = serde_json::to_value(&r).expect("ser");
            assert_eq!(wire.get("payoutId"), Some(&Value::Null));
        }
    }

    #[test]
    fn payout_id_must_be_a_hyphenated_uuid() {
        for bad in [
            json!("nope-secret"),
            json!("4b6f1b5e8d0a4a399f5e2f1d1a0c9e11"),
            json!("{4b6f1b5e-8d0a-4a39-9f5e-2f1d1a0c9e11}"),
            json!("urn:uuid:4b6f1b5e-8d0a-4a39-9f5e-2f1d1a0c9e11"),
            json!(""),
        ] {
            let mut body = payout();
            body["payoutId"] = bad.clone();
            let p = NewPayoutRequest::from_json(&body).expect_err("bad uuid");
            assert_eq!(fields(&p), ["payoutId"], "{bad}");
            assert_eq!(problem_of(&p, "payoutId"), "must be a hyphenated UUID");
            echoes_nothing(&p, "secret");
        }
        let mut body = payout();
        body["payoutId"] = json!(42);
        let p = NewPayoutRequest::from_json(&body).expect_err("number");
        assert_eq!(problem_of(&p, "payoutId"), "must be a string");
    }

    #[test]
    fn payout_amount_bounds_are_inclusive() {
        for (v, ok) in [(1, true), (AMOUNT_MINOR_MAX, true), (0, false), (AMOUNT_MINOR_MAX + 1, false)] {
            let mut body = payout();
            body["amountMinor"] = json!(v);
            assert_eq!(NewPayoutRequest::from_json(&body).is_ok(), ok, "{v}");
        }
    }

    #[test]
    fn payout_beneficiary_ref_is_1_to_256_characters() {
        for (v, ok) in
            [(String::new(), false), ("é".repeat(256), true), ("b".repeat(256), true), ("b".repeat(257), false)]
        {
            let mut body = payout();
            body["beneficiaryRef"] = json!(v);
            let r = NewPayoutRequest::from_json(&body);
            assert_eq!(r.is_ok(), ok, "{} chars", v.chars().count());
            if let Err(p) = r {
                assert_eq!(problem_of(&p, "beneficiaryRef"), "must be 1 to 256 characters");
            }
        }
    }

    #[test]
    fn payout_names_every_bad_field_without_echoing_values() {
        let body = json!({
            "payoutId": "nope-secret",
            "accountId": "has space secret",
            "amountMinor": "secret-amount",
            "currency": "secret",
            "beneficiaryRef": "",
            "unknown": "ignored"
        });
        let p = NewPayoutRequest::from_json(&body).expect_err("invalid");
        assert_eq!(fields(&p), ["payoutId", "accountId", "amountMinor", "currency", "beneficiaryRef"]);
        echoes_nothing(&p, "secret");
        echoes_nothing(&p, "nope");
    }

    // ---- ClaimRequest -------------------------------------------------------------------

    #[test]
    fn claim_accepts_pending_and_claimed_only() {
        for s in PayoutState::ALL {
            let r = ClaimRequest::from_json(&json!({"expectedState": s.as_str(), "extra": 1}));
            match s {
                PayoutState::Pending | PayoutState::Claimed => {
                    assert_eq!(r.expect("claimable"), ClaimRequest { expected_state: s });
                }
                _ => {
                    let p = r.expect_err("not claimable");
                    assert_eq!(fields(&p), ["expectedState"]);
                    assert_eq!(
                        problem_of(&p, "expectedState"),
                        "must be PENDING or CLAIMED; a claim starts from no other state"
                    );
                    echoes_nothing(&p, s.as_str());
                }
            }
        }
    }

    #[test]
    fn claim_refuses_unknown_spellings_and_types() {
        for (bad, expected) in [
            (json!("pending"), "must be PENDING or CLAIMED"),
            (json!("SECRET_STATE"), "must be PENDING or CLAIMED"),
            (json!(""), "must be PENDING or CLAIMED"),
            (json!(1), "must be a string"),
            (json!(null), "is required"),
        ] {
            let p = ClaimRequest::from_json(&json!({"expectedState": bad})).expect_err("invalid");
            assert_eq!(problem_of(&p, "expectedState"), expected, "{bad}");
            echoes_nothing(&p, "SECRET");
        }
    }

    #[test]
    fn claim_serialises_as_the_fingerprinted_body() {
        let r = ClaimRequest::from_json(&json!({"expectedState": "PENDING"})).expect("valid");
        assert_eq!(serde_json::to_string(&r).expect("ser"), r#"{"expectedState":"PENDING"}"#);
    }

    // ---- PostRequest --------------------------------------------------------------------

    #[test]
    fn post_accepts_a_well_formed_body_and_ignores_unknown_fields() {
        let mut body = post();
        body["note"] = json!("ignored");
        let r = PostRequest::from_json(&body).expect("valid");
        assert_eq!(
            r,
            PostRequest {
                rail_reference: "rail-77".into(),
                submission_id: Uuid::parse_str(SUBMISSION_ID).expect("uuid"),
                rail_outcome: "ACKED".into(),
            }
        );
        assert_eq!(
            serde_json::to_value(&r).expect("ser"),
            json!({"railReference": "rail-77", "submissionId": SUBMISSION_ID, "railOutcome": "ACKED"})
        );
    }

    #[test]
    fn post_rail_outcome_must_be_exactly_acked() {
        for bad in ["acked", "REJECTED", "TIMEOUT", "ACKED ", "SECRET"] {
            let mut body = post();
            body["railOutcome"] = json!(bad);
            let p = PostRequest::from_json(&body).expect_err("not acked");
            assert_eq!(fields(&p), ["railOutcome"]);
            assert_eq!(problem_of(&p, "railOutcome"), "must be ACKED");
            echoes_nothing(&p, "SECRET");
        }
        let mut body = post();
        body.as_object_mut().expect("object").remove("railOutcome");
        let p = PostRequest::from_json(&body).expect_err("missing");
        assert_eq!(problem_of(&p, "railOutcome"), "is required");
    }

    #[test]
    fn post_rail_reference_is_1_to_256_characters() {
        for (v, ok) in [(String::new(), false), ("r".repeat(256), true), ("r".repeat(257), false)] {
            let mut body = post();
            body["railReference"] = json!(v);
            let r = PostRequest::from_json(&body);
            assert_eq!(r.is_ok(), ok, "{} chars", v.len());
            if let Err(p) = r {
                assert_eq!(problem_of(&p, "railReference"), "must be 1 to 256 characters");
            }
        }
    }

    #[test]
    fn post_names_every_bad_field_without_echoing_values() {
        let body = json!({"railReference": 7, "submissionId": "secret-id", "railOutcome": "secret"});
        let p = PostRequest::from_json(&body).expect_err("invalid");
        assert_eq!(fields(&p), ["railReference", "submissionId", "railOutcome"]);
        assert_eq!(problem_of(&p, "railReference"), "must be a string");
        assert_eq!(problem_of(&p, "submissionId"), "must be a hyphenated UUID");
        echoes_nothing(&p, "secret");
    }

    // ---- responses ------------------------------------------------------------------------

    #[test]
    fn claim_ack_is_camel_case() {
        let ack = ClaimAck {
            payout_id: Uuid::parse_str(PAYOUT_ID).expect("uuid"),
            state: PayoutState::Claimed,
            claim_token: 9_007_199_254_740_993,
            account_fence: 9_007_199_254_740_993,
            attempt_count: 1,
            idempotency_key: "payout:k".into(),
            account_id: None,
            amount_minor: None,
            currency: None,
            beneficiary_ref: None,
        };
        let wire = serde_json::to_string(&ack).expect("ser");
        assert_eq!(
            wire,
            format!(
                r#"{{"payoutId":"{PAYOUT_ID}","state":"CLAIMED","claimToken":9007199254740993,"accountFence":9007199254740993,"attemptCount":1,"idempotencyKey":"payout:k"}}"#
            )
        );
        assert_eq!(serde_json::from_str::<ClaimAck>(&wire).expect("de"), ack);
        assert_eq!(ack.terms(), None, "an answer recorded before C-30 carries no terms");
    }

    #[test]
    fn claim_ack_carries_the_payout_terms_in_camel_case() {
        let ack = ClaimAck {
            payout_id: Uuid::parse_str(PAYOUT_ID).expect("uuid"),
            state: PayoutState::Claimed,
            claim_token: 3,
            account_fence: 3,
            attempt_count: 0,
            idempotency_key: "payout:k".into(),
            account_id: Some("acct-1".into()),
            amount_minor: Some(1250),
            currency: Some("EUR".into()),
            beneficiary_ref: Some("ben-1".into()),
        };
        let wire = serde_json::to_string(&ack).expect("ser");
        assert!(
            wire.ends_with(r#""accountId":"acct-1","amountMinor":1250,"currency":"EUR","beneficiaryRef":"ben-1"}"#),
            "{wire}"
        );
        assert_eq!(serde_json::from_str::<ClaimAck>(&wire).expect("de"), ack);
        let terms = ack.terms().expect("all four terms");
        assert_eq!((terms.account_id.as_str(), terms.amount_minor), ("acct-1", 1250));
        let partial = ClaimAck { currency: None, ..ack };
        assert_eq!(partial.terms(), None, "a partial set is no set");
    }

    #[test]
    fn post_ack_round_trips() {
        let entry = |dir: &str, acct: &str| EntryBody {
            entry_id: Uuid::new_v4(),
            account_id: acct.into(),
            direction: dir.into(),
            amount_minor: 1250,
            fence: 12,
        };
        let ack = PostAck {
            payout_id: Uuid::parse_str(PAYOUT_ID).expect("uuid"),
            state: PayoutState::Posted,
            entries: vec![entry("DEBIT", "acct:1"), entry("CREDIT", "settlement")],
            balance_minor: 3750,
        };
        let wire = serde_json::to_value(&ack).expect("ser");
        assert_eq!(wire["entries"][0]["direction"], "DEBIT");
        assert_eq!(wire["entries"][1]["accountId"], "settlement");
        assert_eq!(wire["balanceMinor"], 3750);
        assert_eq!(serde_json::from_value::<PostAck>(wire).expect("de"), ack);
    }

    #[test]
    fn submission_outcome_is_null_but_other_optionals_are_omitted() {
        let s = SubmissionBody {
            submission_id: Uuid::parse_str(SUBMISSION_ID).expect("uuid"),
            presented_token: 7,
            outcome: None,
            rail_reference: None,
            submitted_at: t(1_764_500_730_123),
            resolved_at: None,
        };
        let wire = serde_json::to_value(&s).expect("ser");
        assert_eq!(
            wire,
            json!({
                "submissionId": SUBMISSION_ID,
                "presentedToken": 7,
                "outcome": null,
                "submittedAt": "2025-11-30T11:05:30.123Z"
            })
        );
        assert_eq!(serde_json::from_value::<SubmissionBody>(wire).expect("de"), s);

        let resolved = SubmissionBody {
            outcome: Some(SubmissionOutcome::Acked),
            rail_reference: Some("rail-77".into()),
            resolved_at: Some(t(1_764_500_731_000)),
            ..s
        };
        let wire = serde_json::to_value(&resolved).expect("ser");
        assert_eq!(wire["outcome"], "ACKED");
        assert_eq!(wire["railReference"], "rail-77");
        assert_eq!(wire["resolvedAt"], "2025-11-30T11:05:31.000Z");
        assert_eq!(serde_json::from_value::<SubmissionBody>(wire).expect("de"), resolved);
    }

    #[test]
    fn payout_body_omits_unset_claim_fields() {
        let body = PayoutBody {
            payout_id: Uuid::parse_str(PAYOUT_ID).expect("uuid"),
            account_id: "acct:1".into(),
            amount_minor: 1250,
            currency: "EUR".into(),
            beneficiary_ref: "ben-1".into(),
            state: PayoutState::Pending,
            attempt_count: 0,
            claim_token: None,
            claimed_by: None,
            claimed_at: None,
            created_at: t(1_764_500_730_123),
            updated_at: t(1_764_500_730_123),
            submissions: vec![],
        };
        let wire = serde_json::to_value(&body).expect("ser");
        let obj = wire.as_object().expect("object");
        for absent in ["claimToken", "claimedBy", "claimedAt"] {
            assert!(!obj.contains_key(absent), "{absent}");
        }
        assert_eq!(wire["createdAt"], "2025-11-30T11:05:30.123Z");
        assert_eq!(wire["submissions"], json!([]));
        assert_eq!(serde_json::from_value::<PayoutBody>(wire).expect("de"), body);

        let claimed = PayoutBody {
            state: PayoutState::Claimed,
            attempt_count: 1,
            claim_token: Some(42),
            claimed_by: Some("w-1".into()),
            claimed_at: Some(t(1_764_500_731_000)),
            ..body
        };
        let wire = serde_json::to_value(&claimed).expect("ser");
        assert_eq!(wire["claimToken"], 42);
        assert_eq!(wire["claimedBy"], "w-1");
        assert_eq!(wire["claimedAt"], "2025-11-30T11:05:31.000Z");
        assert_eq!(serde_json::from_value::<PayoutBody>(wire).expect("de"), claimed);
    }

    #[test]
    fn account_body_is_camel_case() {
        let body = AccountBody {
            account_id: "acct:1".into(),
            currency: "EUR".into(),
            balance_minor: 5000,
            fence: 0,
            ledger_sum_minor: 5000,
            available_minor: 3750,
            created_at: t(1_764_500_730_123),
            updated_at: t(1_764_500_730_123),
        };
        let wire = serde_json::to_value(&body).expect("ser");
        let mut keys: Vec<_> = wire.as_object().expect("object").keys().cloned().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "accountId",
                "availableMinor",
                "balanceMinor",
                "createdAt",
                "currency",
                "fence",
                "ledgerSumMinor",
                "updatedAt"
            ]
        );
        assert_eq!(serde_json::from_value::<AccountBody>(wire).expect("de"), body);
    }

    #[test]
    fn payout_page_omits_a_missing_next_cursor() {
        let item = PayoutItem {
            payout_id: Uuid::parse_str(PAYOUT_ID).expect("uuid"),
            account_id: "acct:1".into(),
            amount_minor: 1250,
            currency: "EUR".into(),
            state: PayoutState::Pending,
            attempt_count: 0,
            created_at: t(1_764_500_730_123),
        };
        let last = PayoutPage { items: vec![item.clone()], next_cursor: None };
        let wire = serde_json::to_value(&last).expect("ser");
        assert!(!wire.as_object().expect("object").contains_key("nextCursor"));
        assert_eq!(wire["items"][0]["createdAt"], "2025-11-30T11:05:30.123Z");
        assert_eq!(serde_json::from_value::<PayoutPage>(wire).expect("de"), last);

        let more = PayoutPage { items: vec![item], next_cursor: Some("abc.def".into()) };
        let wire = serde_json::to_value(&more).expect("ser");
        assert_eq!(wire["nextCursor"], "abc.def");
        assert_eq!(serde_json::from_value::<PayoutPage>(wire).expect("de"), more);
    }
}
