//! `dlock resolve`: an operator's explicit, audited verdict on a quarantined payout
//! (C2: RAIL_AMBIGUOUS → POSTED | FAILED, operator only; FR-23).
//!
//! The reconciler never calls this: it only reports, and says which verdict the rail's
//! record supports. The verdict is a separate command, backed by a rail reference (or a
//! statement line), a named operator and a reason, and refused unless the payout is
//! RAIL_AMBIGUOUS. The store does it in one transaction with its audit row
//! (`ReconcileStore::resolve_ambiguous`, the statements the payment-resource runs).
//!
//! The same verdict can be given over HTTP, `POST /v1/payouts/{payoutId}/resolution` on the
//! payment-resource (C3-extensions E-21, operator role; the console's Resolve action uses
//! it): one set of field rules ([`dlock_contract::resolution`]) and the same statements in
//! paydb for both.

use chrono::{DateTime, Utc};
use dlock_contract::payout::PayoutState;
use dlock_paydb::pay::{AmbiguousResolution, ResolveOutcome};
use dlock_paydb::StoreError;
use uuid::Uuid;

use crate::store::ReconcileStore;

/// The verdict: the rail paid (POSTED) or it did not (FAILED).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ResolveAs {
    Posted,
    Failed,
}

impl ResolveAs {
    pub fn state(self) -> PayoutState {
        match self {
            ResolveAs::Posted => PayoutState::Posted,
            ResolveAs::Failed => PayoutState::Failed,
        }
    }
}

/// The field rules of `--operator`, `--reason` and `--rail-reference`: the ones every
/// surface applies (the payment-resource's `POST /v1/payouts/{payoutId}/resolution` and the
/// console's Resolve form too), kept once in [`dlock_contract::resolution`].
pub use dlock_contract::resolution::{parse_operator, parse_rail_reference, parse_reason};

/// One operator verdict, as typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolveRequest {
    pub payout_id: Uuid,
    pub resolved_as: ResolveAs,
    pub operator: String,
    pub reason: String,
    pub rail_reference: String,
}

impl ResolveRequest {
    /// Checks every field (clap already did; a library caller may not have).
    pub fn validate(&self) -> Result<(), String> {
        parse_operator(&self.operator)?;
        parse_reason(&self.reason)?;
        if self.rail_reference.is_empty() && self.resolved_as == ResolveAs::Posted {
            return Err("--as posted needs --rail-reference: the rail's reference of the payment".into());
        }
        parse_rail_reference(&self.rail_reference)?;
        Ok(())
    }

    /// The store's request, with fresh ids, at `at`.
    pub fn resolution(&self, at: DateTime<Utc>) -> AmbiguousResolution {
        AmbiguousResolution {
            resolution_id: dlock_rt::rand::uuid_v4(),
            payout_id: self.payout_id,
            resolved_as: self.resolved_as.state(),
            operator: self.operator.clone(),
            reason: self.reason.clone(),
            rail_reference: self.rail_reference.clone(),
            posting_id: dlock_rt::rand::uuid_v4(),
            entry_ids: [dlock_rt::rand::uuid_v4(), dlock_rt::rand::uuid_v4()],
            at,
        }
    }
}

/// Why a resolve did not commit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// A field is invalid; nothing was sent to paydb.
    #[error("{0}")]
    Invalid(String),
    /// paydb refused: the payout is not RAIL_AMBIGUOUS (or does not exist). Nothing changed.
    #[error("{0}")]
    Refused(String),
    /// paydb could not decide, or its answer was lost (run the same command again: a
    /// committed resolution then answers "not RAIL_AMBIGUOUS, it is POSTED|FAILED").
    #[error("paydb: {0}")]
    Store(StoreError),
}

/// What a committed resolution did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub resolution_id: Uuid,
    pub state: PayoutState,
    pub balance_minor: i64,
}

/// Validates `req` and resolves it in one paydb transaction at `at`.
pub async fn resolve(
    pay: &dyn ReconcileStore,
    req: &ResolveRequest,
    at: DateTime<Utc>,
) -> Result<Resolved, ResolveError> {
    req.validate().map_err(ResolveError::Invalid)?;
    let r = req.resolution(at);
    match pay.resolve_ambiguous(&r).await.map_err(ResolveError::Store)? {
        ResolveOutcome::Resolved { state, balance_minor } => {
            tracing::info!(
                payoutId = %r.payout_id,
                resolutionId = %r.resolution_id,
                resolvedAs = state.as_str(),
                operator = %r.operator,
                railReference = %r.rail_reference,
                "payout_resolved"
            );
            Ok(Resolved { resolution_id: r.resolution_id, state, balance_minor })
        }
        ResolveOutcome::NotAmbiguous { state } => Err(ResolveError::Refused(format!(
            "payout {} is {}, not RAIL_AMBIGUOUS: only a quarantined payout can be resolved",
            req.payout_id,
            state.as_str()
        ))),
        ResolveOutcome::NotFound => Err(ResolveError::Refused(format!("no payout {}", req.payout_id))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resolve_request_is_held_to_each_field_rule() {
        // The field rules are dlock_contract::resolution's (tested there); here, that a
        // request is held to each of them.
        let ok = ResolveRequest {
            payout_id: Uuid::from_u128(1),
            resolved_as: ResolveAs::Posted,
            operator: "ops-alice".into(),
            reason: "rail statement line 42".into(),
            rail_reference: "RR-00ff".into(),
        };
        assert_eq!(ok.validate(), Ok(()));
        let with = |f: &dyn Fn(&mut ResolveRequest)| {
            let mut r = ok.clone();
            f(&mut r);
            r.validate()
        };
        assert!(with(&|r| r.reason = "too few".into()).is_err());
        assert!(with(&|r| r.operator = "ops alice".into()).is_err());
        assert!(with(&|r| r.rail_reference = "RR 1".into()).is_err());
    }
}
