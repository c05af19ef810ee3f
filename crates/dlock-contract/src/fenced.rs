//! The body of a 409 `FENCED_OUT` (docs/contracts/C3-http-surfaces.md §3.4): what both
//! resources write and the executor reads, so the fenced writer's alert needs no database
//! query.
//!
//! A true `FENCED_OUT` has `highest_token >= presented_token` (a token is fenced because it
//! does not exceed the stored one). The body does not assert it: it reports what the
//! resource decided, and the simulation's oracle (`fenced_out_means_a_newer_holder`) holds
//! the decision to it.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::rail::SubmissionOutcome;

/// Where the write was fenced: the value set of `resourceType`, of the
/// `lock_fenced_out_total{resource}` tag and of the `fenced_out` log event's `resource`
/// (C4 §4.2). There is no `payout`: a fenced payout write is fenced at its account's
/// balance row, its ledger, or the rail's high-water mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum FencedResource {
    Account,
    Ledger,
    Rail,
}

impl FencedResource {
    pub const ALL: [FencedResource; 3] = [FencedResource::Account, FencedResource::Ledger, FencedResource::Rail];

    /// As the wire, the metric tag and the log event spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            FencedResource::Account => "account",
            FencedResource::Ledger => "ledger",
            FencedResource::Rail => "rail",
        }
    }
}

/// `details` of a 409 `FENCED_OUT`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FencedOut {
    /// What the fenced writer sent.
    pub presented_token: i64,
    /// The stored fence that beat it: the gap tells how long the writer slept.
    pub highest_token: i64,
    pub resource_type: FencedResource,
    /// The account (or payout) the fence guards. Logged, never a metric tag.
    pub resource_id: String,
    /// The fenced worker.
    pub owner_id: String,
    /// The payout the write was for (absent for a whole batch refused at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payout_id: Option<Uuid>,
    /// The rail-proxy's record of the fenced attempt (a single submission only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submission_id: Option<Uuid>,
    /// `FENCED` on a single submission's answer (C3 §3.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<SubmissionOutcome>,
}

impl FencedOut {
    /// The details of `presented` fenced by `highest` at `resource_type` `resource_id`.
    pub fn new(
        presented_token: i64,
        highest_token: i64,
        resource_type: FencedResource,
        resource_id: impl Into<String>,
        owner_id: impl Into<String>,
    ) -> FencedOut {
        FencedOut {
            presented_token,
            highest_token,
            resource_type,
            resource_id: resource_id.into(),
            owner_id: owner_id.into(),
            payout_id: None,
            submission_id: None,
            outcome: None,
        }
    }

    /// With the payout the write was for.
    pub fn for_payout(mut self, payout_id: Uuid) -> FencedOut {
        self.payout_id = Some(payout_id);
        self
    }

    /// As the envelope's `details`.
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// Read from an envelope's `details`; `None` when they are not a `FENCED_OUT` body.
    pub fn from_details(details: &serde_json::Value) -> Option<FencedOut> {
        serde_json::from_value(details.clone()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fenced_out_body_has_the_c3_field_names_and_reads_back() {
        let payout = Uuid::nil();
        let f = FencedOut::new(7, 9, FencedResource::Ledger, "acct:1", "worker-1").for_payout(payout);
        let v = f.to_value();
        assert_eq!(
            v,
            serde_json::json!({
                "presentedToken": 7,
                "highestToken": 9,
                "resourceType": "ledger",
                "resourceId": "acct:1",
                "ownerId": "worker-1",
                "payoutId": payout,
            })
        );
        assert_eq!(FencedOut::from_details(&v), Some(f));
        assert_eq!(FencedOut::from_details(&serde_json::json!({"state": "POSTED"})), None);
        for r in FencedResource::ALL {
            assert_eq!(serde_json::to_value(r).expect("serializes"), serde_json::json!(r.as_str()));
        }
    }
}
