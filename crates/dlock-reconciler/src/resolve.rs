//! `dlock resolve`: an operator's explicit, audited verdict on a quarantined payout
//! (C2: RAIL_AMBIGUOUS → POSTED | FAILED, operator only; FR-23).
//!
//! The reconciler never calls this: it only reports, and says which verdict the rail's
//! record supports. The verdict is a separate command, backed by a rail reference (or a
//! statement line), a named operator and a reason, and refused unless the payout is
//! RAIL_AMBIGUOUS. The store does it in one transaction with its audit row
//! (`ReconcileStore::resolve_ambiguous`, the statements the payment-resource runs).

use chrono::{DateTime, Utc};
use dlock_contract::headers::OwnerId;
use dlock_contract::payout::PayoutState;
use dlock_paydb::pay::{
    AmbiguousResolution, ResolveOutcome, RESOLUTION_RAIL_REFERENCE_CHARS_MAX, RESOLUTION_REASON_CHARS_MAX,
    RESOLUTION_REASON_CHARS_MIN,
};
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

/// `--operator`: 1 to 64 visible ASCII characters (the `X-Owner-Id` rule).
pub fn parse_operator(raw: &str) -> Result<String, String> {
    OwnerId::parse(raw)
        .map(|o| o.as_str().to_owned())
        .map_err(|_| "the operator is 1 to 64 visible ASCII characters".to_owned())
}

/// `--reason`: at least 8 and at most 1 000 characters, not all blank, no control characters.
pub fn parse_reason(raw: &str) -> Result<String, String> {
    let chars = raw.trim().chars().count();
    if chars < RESOLUTION_REASON_CHARS_MIN || raw.chars().count() > RESOLUTION_REASON_CHARS_MAX {
        return Err(format!(
            "the reason is {RESOLUTION_REASON_CHARS_MIN} to {RESOLUTION_REASON_CHARS_MAX} characters (say what \
             the rail's statement shows)"
        ));
    }
    if raw.chars().any(char::is_control) {
        return Err("the reason holds no control characters".into());
    }
    Ok(raw.to_owned())
}

/// `--rail-reference`: 1 to 128 visible ASCII characters.
pub fn parse_rail_reference(raw: &str) -> Result<String, String> {
    if raw.is_empty() || raw.len() > RESOLUTION_RAIL_REFERENCE_CHARS_MAX || !raw.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "the rail reference is 1 to {RESOLUTION_RAIL_REFERENCE_CHARS_MAX} visible ASCII characters"
        ));
    }
    Ok(raw.to_owned())
}

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
    fn resolve_refuses_a_reason_shorter_than_eight_characters() {
        assert!(parse_reason("too few").is_err());
        assert!(parse_reason("        x       ").is_err(), "blanks do not count");
        assert!(parse_reason("statement\nline").is_err());
        assert!(parse_reason(&"x".repeat(1_001)).is_err());
        assert_eq!(parse_reason("rail statement line 42"), Ok("rail statement line 42".into()));
        assert!(parse_operator("").is_err());
        assert!(parse_operator("ops alice").is_err());
        assert!(parse_operator(&"o".repeat(65)).is_err());
        assert_eq!(parse_operator("ops-alice"), Ok("ops-alice".into()));
        assert!(parse_rail_reference("").is_err());
        assert!(parse_rail_reference("RR 1").is_err());
        assert_eq!(parse_rail_reference("RR-00ff"), Ok("RR-00ff".into()));
    }
}
