//! Everything a submission can come to besides a [`SubmissionAck`].
//!
//! [`SubmissionAck`]: dlock_contract::rail::SubmissionAck

use dlock_contract::{ErrorCode, ErrorEnvelope};
use dlock_rt::http::{ClientError, ClientResponse};
use serde::de::DeserializeOwned;

/// A submission's refusal. None of them is ever answered by re-sending.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RailRefusal {
    /// The proxy answered a non-2xx with a C3 envelope.
    #[error("submit: HTTP {status} {}: {} (trace {})", .envelope.code, .envelope.message, .envelope.trace_id)]
    Refused { status: u16, envelope: ErrorEnvelope },
    /// No connection could be opened: not a byte left this process, nothing was presented.
    #[error("submit: nothing was sent: {cause}")]
    NothingSent { cause: String },
    /// The request may have reached the proxy (and the rail) and no complete answer came
    /// back in the read budget: the outcome is unknown.
    #[error("submit: sent, and no answer came back: {cause}")]
    NoAnswer { cause: String },
    /// An answer came back that is neither a `SubmissionAck` nor a C3 envelope.
    #[error("submit: HTTP {status} does not follow C3: {cause}")]
    Unreadable { status: u16, cause: String },
}

impl RailRefusal {
    /// The envelope's code, when the proxy sent one.
    pub fn code(&self) -> Option<ErrorCode> {
        self.envelope().map(|e| e.code)
    }

    pub fn envelope(&self) -> Option<&ErrorEnvelope> {
        match self {
            RailRefusal::Refused { envelope, .. } => Some(envelope),
            _ => None,
        }
    }

    /// The envelope's `details`, when there are any.
    pub fn details(&self) -> Option<&serde_json::Value> {
        self.envelope().and_then(|e| e.details.as_ref())
    }

    /// The `FENCED_OUT` body (C3 §3.4: both tokens, where, whose), when this refusal is one
    /// and its details read as one.
    pub fn fenced_out(&self) -> Option<dlock_contract::fenced::FencedOut> {
        let e = self.envelope().filter(|e| e.code == dlock_contract::ErrorCode::FencedOut)?;
        e.details.as_ref().and_then(dlock_contract::fenced::FencedOut::from_details)
    }

    /// The HTTP status of the answer, when one arrived.
    pub fn status(&self) -> Option<u16> {
        match self {
            RailRefusal::Refused { status, .. } | RailRefusal::Unreadable { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// C3 §3.2's verdict on re-sending the identical request: the catalogue's for an
    /// envelope, yes when nothing was sent, never after a lost or unreadable answer. (This
    /// client re-sends nothing either way: a new submission is the caller's decision, under
    /// a new grant, after a fresh read.)
    pub fn retry_safe(&self) -> bool {
        match self {
            RailRefusal::Refused { envelope, .. } => envelope.code.retry_safe(),
            RailRefusal::NothingSent { .. } => true,
            RailRefusal::NoAnswer { .. } | RailRefusal::Unreadable { .. } => false,
        }
    }

    /// Whether the rail may have been presented the transfer without this caller learning
    /// the outcome: a lost answer, an unreadable one, `RAIL_AMBIGUOUS` or `INTERNAL`.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            RailRefusal::NoAnswer { .. } | RailRefusal::Unreadable { .. } => true,
            RailRefusal::Refused { envelope, .. } => {
                matches!(envelope.code, ErrorCode::RailAmbiguous | ErrorCode::Internal)
            }
            RailRefusal::NothingSent { .. } => false,
        }
    }

    /// The quarantined attempt's `submissionId` of a `RAIL_AMBIGUOUS` refusal.
    pub fn ambiguous_submission_id(&self) -> Option<&str> {
        match self {
            RailRefusal::Refused { envelope, .. } if envelope.code == ErrorCode::RailAmbiguous => {
                envelope.details.as_ref()?.get("submissionId")?.as_str()
            }
            _ => None,
        }
    }
}

/// Reads the submission's fate as `T` or a refusal.
pub(crate) fn decode<T: DeserializeOwned>(sent: Result<ClientResponse, ClientError>) -> Result<T, RailRefusal> {
    let r = match sent {
        Ok(r) => r,
        Err(e) if e.nothing_sent() => return Err(RailRefusal::NothingSent { cause: e.to_string() }),
        Err(e) => return Err(RailRefusal::NoAnswer { cause: e.to_string() }),
    };
    let status = r.status;
    if (200..300).contains(&status) {
        return serde_json::from_slice::<T>(&r.body)
            .map_err(|e| RailRefusal::Unreadable { status, cause: e.to_string() });
    }
    match serde_json::from_slice::<ErrorEnvelope>(&r.body) {
        Ok(envelope) => Err(RailRefusal::Refused { status, envelope }),
        Err(e) => Err(RailRefusal::Unreadable { status, cause: format!("no C3 envelope: {e}") }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: ErrorCode, wire_says_safe: bool) -> RailRefusal {
        let mut envelope = ErrorEnvelope::new(code, "m", "t");
        envelope.retry_safe = wire_says_safe;
        RailRefusal::Refused { status: code.http_status(), envelope }
    }

    #[test]
    fn an_envelope_takes_its_retry_verdict_from_the_catalogue_not_the_wire() {
        for code in ErrorCode::ALL {
            for wire in [false, true] {
                assert_eq!(refused(code, wire).retry_safe(), code.retry_safe(), "{code}");
            }
        }
    }

    #[test]
    fn a_lost_answer_rail_ambiguous_and_internal_are_unknown_outcomes() {
        let lost = RailRefusal::NoAnswer { cause: "timeout".into() };
        assert!(lost.outcome_unknown() && !lost.retry_safe());
        let garbled = RailRefusal::Unreadable { status: 502, cause: "<html>".into() };
        assert!(garbled.outcome_unknown() && !garbled.retry_safe());
        assert!(refused(ErrorCode::RailAmbiguous, false).outcome_unknown());
        assert!(refused(ErrorCode::Internal, false).outcome_unknown());
        assert!(!refused(ErrorCode::FencedOut, false).outcome_unknown());
        let unsent = RailRefusal::NothingSent { cause: "refused".into() };
        assert!(!unsent.outcome_unknown() && unsent.retry_safe());
    }

    #[test]
    fn rail_ambiguous_names_its_quarantined_submission() {
        let mut envelope = ErrorEnvelope::new(ErrorCode::RailAmbiguous, "m", "t");
        envelope.details = Some(serde_json::json!({"submissionId": "s-1"}));
        let r = RailRefusal::Refused { status: 409, envelope };
        assert_eq!(r.ambiguous_submission_id(), Some("s-1"));
        assert_eq!(refused(ErrorCode::FencedOut, false).ambiguous_submission_id(), None);
    }
}
