//! Every answer the payment-resource records or renders, as pure functions of what the store
//! decided (C3 §3.4, P2–P3; the batches P2b and P3b of C3-extensions E-19; the creates).
//!
//! This module sits below the store: a store renders the answer of an outcome that commits
//! here, inside its transaction, so that the recorded bytes and the first answer are one,
//! and nothing above the store (HTTP, metrics, logs) runs inside a transaction. The handlers
//! render refusals with the same functions.
//!
//! Invariants:
//! - A single write is a batch of one ([`Shape::Single`]): its answer is the one item's
//!   answer, byte for byte what a batch carries for that payout in its `items`.
//! - A batch's `200` carries one item per payout, in the request's order, each the single
//!   write's answer under the batch's token and trace id ([`BatchAnswer`]'s shape).
//! - A committed outcome renders as its `2xx` (or, for a claim that failed for funds, the
//!   recorded `422 INSUFFICIENT_FUNDS`); a refusal renders as its envelope; nothing else
//!   renders (an internal envelope marks a caller's mistake, never a client's).
//!
//! [`BatchAnswer`]: dlock_contract::batch::BatchAnswer

use dlock_contract::payment::{AccountBody, ClaimAck, EntryBody, PayoutBody, PostAck, ResolutionAck, SubmissionBody};
use dlock_contract::payout::PayoutState;
use dlock_contract::{ErrorCode, FieldError};
use dlock_http::ApiError;
use serde_json::json;
use uuid::Uuid;

use crate::store::{
    AccountView, AmbiguousResolution, ClaimBatchOutcome, ClaimOutcome, CreateAccountOutcome, CreatePayoutOutcome,
    PayoutView, PostBatchOutcome, PostOutcome, ResolveOutcome, StoredResponse,
};

/// The request shape a fenced write came in: P2/P3 for one payout, or P2b/P3b for several
/// payouts of one account. The store runs both as a batch; the shape decides the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// P2 or P3: one payout, named in the path; answered as that payout's write.
    Single,
    /// P2b or P3b: the account named in the path; answered as a `BatchAnswer`.
    Batch,
}

/// What a recorded answer says beyond the outcome: the request's shape, idempotency key
/// (a `ClaimAck` echoes it) and trace id (every recorded envelope carries the first
/// request's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answering {
    pub shape: Shape,
    pub key: String,
    pub trace_id: String,
}

/// P2's message for a payout not in the expected state.
pub const CLAIM_NOT_CLAIMABLE: &str = "the payout is not in the expected state; a claim changes nothing";
/// P3's message for a payout that is not RAIL_ACKED.
pub const POST_NOT_CLAIMABLE: &str = "only a RAIL_ACKED payout is posted; the post changes nothing";

/// The resolution's message for a payout that is not RAIL_AMBIGUOUS (C3-extensions E-21).
pub const RESOLVE_NOT_AMBIGUOUS: &str =
    "only a RAIL_AMBIGUOUS payout is resolved; it is in another state and the resolution changes nothing";

/// A 2xx body as it is recorded and answered.
pub fn recorded<T: serde::Serialize>(status: u16, body: &T) -> StoredResponse {
    match serde_json::to_vec(body) {
        Ok(body) => StoredResponse { status, body },
        Err(e) => recorded_error(ApiError::internal(format!("serialize response: {e}")), ""),
    }
}

/// An error envelope as it is recorded and answered (with the first request's trace id).
pub fn recorded_error(err: ApiError, trace_id: &str) -> StoredResponse {
    let (status, body) = dlock_http::envelope_bytes(err, trace_id);
    StoredResponse { status, body }
}

/// The 404 of an unknown `what`.
pub fn not_found(what: &str) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("no such {what}"))
}

/// The 409 `PAYOUT_NOT_CLAIMABLE` of a payout in `state`.
pub fn not_claimable(payout_id: Uuid, state: PayoutState, message: &str) -> ApiError {
    ApiError::new(ErrorCode::PayoutNotClaimable, message).with_details(json!({ "payoutId": payout_id, "state": state }))
}

/// P3's 400 for a body that names no acknowledged attempt of the payout.
pub fn rail_mismatch() -> ApiError {
    ApiError::validation(
        "no acknowledged rail submission of this payout has this submissionId and railReference",
        vec![
            FieldError::new("submissionId", "names no acknowledged submission of this payout"),
            FieldError::new("railReference", "does not match the acknowledged submission"),
        ],
    )
}

/// The envelope of a claim its payout refused (P2's, and a batch item's body): not
/// claimable, or not found. Any other outcome is no refusal of its payout.
pub fn claim_refusal(payout_id: Uuid, o: &ClaimOutcome) -> ApiError {
    match o {
        ClaimOutcome::NotClaimable { state } => not_claimable(payout_id, *state, CLAIM_NOT_CLAIMABLE),
        ClaimOutcome::NotFound => not_found("payout"),
        ClaimOutcome::Fenced { .. } | ClaimOutcome::Claimed { .. } | ClaimOutcome::InsufficientFunds { .. } => {
            ApiError::internal("committed outcome without a recorded response")
        }
    }
}

/// The envelope of a post its payout refused (P3's, and a batch item's body).
pub fn post_refusal(payout_id: Uuid, o: &PostOutcome) -> ApiError {
    match o {
        PostOutcome::NotClaimable { state } => not_claimable(payout_id, *state, POST_NOT_CLAIMABLE),
        PostOutcome::RailMismatch => rail_mismatch(),
        PostOutcome::NotFound => not_found("payout"),
        PostOutcome::Fenced { .. } | PostOutcome::Posted { .. } => {
            ApiError::internal("committed outcome without a recorded response")
        }
    }
}

/// P5's body of an account.
pub fn account_body(a: &AccountView) -> AccountBody {
    AccountBody {
        account_id: a.account_id.clone(),
        currency: a.currency.clone(),
        balance_minor: a.balance_minor,
        fence: a.fence,
        ledger_sum_minor: a.ledger_sum_minor,
        available_minor: a.balance_minor - a.reserved_minor,
        created_at: a.created_at,
        updated_at: a.updated_at,
    }
}

/// P4's body of a payout and its rail submissions.
pub fn payout_body(p: &PayoutView) -> PayoutBody {
    PayoutBody {
        payout_id: p.payout_id,
        account_id: p.account_id.clone(),
        amount_minor: p.amount_minor,
        currency: p.currency.clone(),
        beneficiary_ref: p.beneficiary_ref.clone(),
        state: p.state,
        attempt_count: p.attempt_count,
        claim_token: p.claim_token,
        claimed_by: p.claimed_by.clone(),
        claimed_at: p.claimed_at,
        created_at: p.created_at,
        updated_at: p.updated_at,
        submissions: p
            .submissions
            .iter()
            .map(|s| SubmissionBody {
                submission_id: s.submission_id,
                presented_token: s.presented_token,
                outcome: s.outcome,
                rail_reference: s.rail_reference.clone(),
                submitted_at: s.submitted_at,
                resolved_at: s.resolved_at,
            })
            .collect(),
    }
}

/// The recorded answer of a created account: 201 with its body.
pub fn account_created(o: &CreateAccountOutcome, trace_id: &str) -> StoredResponse {
    match o {
        CreateAccountOutcome::Created(view) => recorded(201, &account_body(view)),
        CreateAccountOutcome::Exists => recorded_error(ApiError::internal("not a committed outcome"), trace_id),
    }
}

/// The recorded answer of a created payout: 201 with its body.
pub fn payout_created(o: &CreatePayoutOutcome, trace_id: &str) -> StoredResponse {
    match o {
        CreatePayoutOutcome::Created(view) => recorded(201, &payout_body(view)),
        _ => recorded_error(ApiError::internal("not a committed outcome"), trace_id),
    }
}

/// The recorded answer of a committed resolution `r` (C3-extensions E-21): 200
/// `ResolutionAck`.
pub fn resolved(o: &ResolveOutcome, r: &AmbiguousResolution, trace_id: &str) -> StoredResponse {
    match o {
        ResolveOutcome::Resolved { state, balance_minor } => recorded(
            200,
            &ResolutionAck {
                payout_id: r.payout_id,
                state: *state,
                resolution_id: r.resolution_id,
                balance_minor: *balance_minor,
            },
        ),
        _ => recorded_error(ApiError::internal("not a committed outcome"), trace_id),
    }
}

/// The envelope of a resolution its payout refused: 409 `PAYOUT_NOT_CLAIMABLE` (not
/// RAIL_AMBIGUOUS, with the payout's state), or 404.
pub fn resolve_refusal(payout_id: Uuid, o: &ResolveOutcome) -> ApiError {
    match o {
        ResolveOutcome::NotAmbiguous { state } => not_claimable(payout_id, *state, RESOLVE_NOT_AMBIGUOUS),
        ResolveOutcome::NotFound => not_found("payout"),
        ResolveOutcome::Resolved { .. } => ApiError::internal("committed outcome without a recorded response"),
    }
}

/// One payout's answer to a claim under `token`: 200 `ClaimAck`, the (recorded) 422
/// `INSUFFICIENT_FUNDS` envelope, or its refusal's envelope.
pub fn claim_item(o: &ClaimOutcome, payout_id: Uuid, token: i64, key: &str, trace_id: &str) -> StoredResponse {
    match o {
        ClaimOutcome::Claimed {
            account_id,
            account_fence,
            attempt_count,
            amount_minor,
            currency,
            beneficiary_ref,
            ..
        } => recorded(
            200,
            &ClaimAck {
                payout_id,
                state: PayoutState::Claimed,
                claim_token: token,
                account_fence: *account_fence,
                attempt_count: *attempt_count,
                idempotency_key: key.to_owned(),
                account_id: Some(account_id.clone()),
                amount_minor: Some(*amount_minor),
                currency: Some(currency.clone()),
                beneficiary_ref: Some(beneficiary_ref.clone()),
            },
        ),
        ClaimOutcome::InsufficientFunds { account_id, amount_minor, available_minor } => {
            let message = "the account's available balance does not cover this payout; it is FAILED and will never \
                           reach the rail";
            let err = ApiError::new(ErrorCode::InsufficientFunds, message).with_details(json!({
                "payoutId": payout_id,
                "accountId": account_id,
                "amountMinor": amount_minor,
                "availableMinor": available_minor,
                "state": PayoutState::Failed,
            }));
            recorded_error(err, trace_id)
        }
        refused => recorded_error(claim_refusal(payout_id, refused), trace_id),
    }
}

/// One payout's answer to a post: 200 `PostAck`, or its refusal's envelope.
pub fn post_item(o: &PostOutcome, payout_id: Uuid, trace_id: &str) -> StoredResponse {
    match o {
        PostOutcome::Posted { entries, balance_minor, .. } => recorded(
            200,
            &PostAck {
                payout_id,
                state: PayoutState::Posted,
                entries: entries
                    .iter()
                    .map(|e| EntryBody {
                        entry_id: e.entry_id,
                        account_id: e.account_id.clone(),
                        direction: e.direction.as_str().to_owned(),
                        amount_minor: e.amount_minor,
                        fence: e.fence,
                    })
                    .collect(),
                balance_minor: *balance_minor,
            },
        ),
        refused => recorded_error(post_refusal(payout_id, refused), trace_id),
    }
}

/// One item of a batch's `200` as it goes on the wire: its body is the single write's
/// answer, byte for byte ([`dlock_contract::batch::BatchAnswer`]'s shape).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct BatchItemBytes {
    payout_id: Uuid,
    status: u16,
    body: Box<serde_json::value::RawValue>,
}

/// A batch's `200` as it goes on the wire.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct BatchAnswerBytes<'a> {
    account_id: &'a str,
    presented_token: i64,
    items: Vec<BatchItemBytes>,
}

/// The `200` of a batch: one item per payout, each the single write's answer (`answers`,
/// in the request's order), its bytes kept as they are.
fn batch_answer(
    account_id: &str,
    token: i64,
    answers: impl Iterator<Item = (Uuid, StoredResponse)>,
    trace_id: &str,
) -> StoredResponse {
    let mut items = Vec::new();
    for (payout_id, r) in answers {
        let body = String::from_utf8(r.body)
            .map_err(|e| e.to_string())
            .and_then(|text| serde_json::value::RawValue::from_string(text).map_err(|e| e.to_string()));
        match body {
            Ok(body) => items.push(BatchItemBytes { payout_id, status: r.status, body }),
            Err(e) => return recorded_error(ApiError::internal(format!("a batch item is not JSON: {e}")), trace_id),
        }
    }
    recorded(200, &BatchAnswerBytes { account_id, presented_token: token, items })
}

/// The answer of a decided claim of `account_id`'s payouts under `token` (recorded when it
/// committed): a single claim's one item ([`claim_item`]), or the batch's `200` with each
/// payout's. The `ClaimAck`'s `idempotencyKey` is the request's key.
pub fn claim(o: &ClaimBatchOutcome, account_id: &str, token: i64, a: &Answering) -> StoredResponse {
    let ClaimBatchOutcome::Decided { items } = o else {
        return recorded_error(ApiError::internal("not a decided claim"), &a.trace_id);
    };
    let item = |(payout_id, item): &(Uuid, ClaimOutcome)| {
        (*payout_id, claim_item(item, *payout_id, token, &a.key, &a.trace_id))
    };
    match (a.shape, items.as_slice()) {
        (Shape::Single, [one]) => item(one).1,
        (Shape::Single, _) => recorded_error(ApiError::internal("a single claim decided several payouts"), &a.trace_id),
        (Shape::Batch, _) => batch_answer(account_id, token, items.iter().map(item), &a.trace_id),
    }
}

/// The answer of a decided post of `account_id`'s payouts under `token`: a single post's
/// one item ([`post_item`]), or the batch's `200` with each payout's.
pub fn post(o: &PostBatchOutcome, account_id: &str, token: i64, a: &Answering) -> StoredResponse {
    let PostBatchOutcome::Decided { items } = o else {
        return recorded_error(ApiError::internal("not a decided post"), &a.trace_id);
    };
    let item = |(payout_id, item): &(Uuid, PostOutcome)| (*payout_id, post_item(item, *payout_id, &a.trace_id));
    match (a.shape, items.as_slice()) {
        (Shape::Single, [one]) => item(one).1,
        (Shape::Single, _) => recorded_error(ApiError::internal("a single post decided several payouts"), &a.trace_id),
        (Shape::Batch, _) => batch_answer(account_id, token, items.iter().map(item), &a.trace_id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{BatchOutcome, ClaimOutcome, Direction, LedgerEntry};

    fn answering(shape: Shape) -> Answering {
        Answering { shape, key: "k".into(), trace_id: "trace-1".into() }
    }

    /// The one item of a batch answer with `payout_id`, as (status, body bytes).
    fn item_of(batch: &StoredResponse, payout_id: Uuid) -> (u16, Vec<u8>) {
        let v: serde_json::Value = serde_json::from_slice(&batch.body).expect("a batch answer is JSON");
        let items = v["items"].as_array().expect("items");
        let item = items.iter().find(|i| i["payoutId"] == payout_id.to_string()).expect("the payout's item");
        let status = u16::try_from(item["status"].as_u64().expect("status")).expect("a status");
        (status, serde_json::to_vec(&item["body"]).expect("body"))
    }

    /// A single write is a batch of one (module doc): for every outcome a payout can have,
    /// the single answer is the batch's item for that payout, status and bytes.
    #[test]
    fn a_single_answer_is_the_batch_items_answer_byte_for_byte() {
        let p = Uuid::from_u128(7);
        let claims = [
            ClaimOutcome::Claimed {
                account_id: "acct".into(),
                account_fence: 5,
                attempt_count: 1,
                reclaimed: false,
                amount_minor: 100,
                currency: "EUR".into(),
                beneficiary_ref: "ben".into(),
            },
            ClaimOutcome::InsufficientFunds { account_id: "acct".into(), amount_minor: 100, available_minor: 3 },
            ClaimOutcome::NotClaimable { state: PayoutState::Posted },
            ClaimOutcome::NotFound,
        ];
        for o in claims {
            let decided = BatchOutcome::Decided { items: vec![(p, o.clone())] };
            let single = claim(&decided, "acct", 5, &answering(Shape::Single));
            let batch = claim(&decided, "acct", 5, &answering(Shape::Batch));
            let canonical: serde_json::Value = serde_json::from_slice(&single.body).expect("JSON");
            let single_bytes = serde_json::to_vec(&canonical).expect("bytes");
            assert_eq!((single.status, single_bytes), item_of(&batch, p), "{o:?}");
            assert_eq!(single, claim_item(&o, p, 5, "k", "trace-1"), "{o:?}");
        }
        let entry = |direction| LedgerEntry {
            entry_id: Uuid::from_u128(1),
            posting_id: Uuid::from_u128(2),
            payout_id: Some(p),
            account_id: "acct".into(),
            direction,
            amount_minor: 100,
            currency: "EUR".into(),
            fence: 5,
            created_at: chrono::DateTime::<chrono::Utc>::from_timestamp_millis(0).expect("instant"),
        };
        let posts = [
            PostOutcome::Posted {
                account_id: "acct".into(),
                entries: [entry(Direction::Debit), entry(Direction::Credit)],
                balance_minor: 900,
            },
            PostOutcome::NotClaimable { state: PayoutState::Claimed },
            PostOutcome::RailMismatch,
            PostOutcome::NotFound,
        ];
        for o in posts {
            let decided = BatchOutcome::Decided { items: vec![(p, o.clone())] };
            let single = post(&decided, "acct", 5, &answering(Shape::Single));
            let batch = post(&decided, "acct", 5, &answering(Shape::Batch));
            let canonical: serde_json::Value = serde_json::from_slice(&single.body).expect("JSON");
            let single_bytes = serde_json::to_vec(&canonical).expect("bytes");
            assert_eq!((single.status, single_bytes), item_of(&batch, p), "{o:?}");
        }
    }

    /// Only a decided outcome of one payout renders as a single answer; anything else is an
    /// internal envelope (a caller's mistake, never a client's answer).
    #[test]
    fn a_single_answer_of_anything_but_one_decided_payout_is_internal() {
        let p = Uuid::from_u128(7);
        let two = BatchOutcome::Decided { items: vec![(p, ClaimOutcome::NotFound), (p, ClaimOutcome::NotFound)] };
        let fenced: BatchOutcome<ClaimOutcome> = BatchOutcome::Fenced { highest_token: 9 };
        for o in [two, fenced] {
            assert_eq!(claim(&o, "acct", 5, &answering(Shape::Single)).status, 500, "{o:?}");
        }
    }
}
