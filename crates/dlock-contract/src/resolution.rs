//! An operator's resolution of a quarantined payout (C2: RAIL_AMBIGUOUS → POSTED | FAILED,
//! operator only): the bounds and the field rules of its text fields.
//!
//! Every surface that takes a resolution applies these functions and no other copy of
//! them: `dlock resolve` (the reconciler's command line), the payment-resource's
//! `POST /v1/payouts/{payoutId}/resolution` (C3-extensions E-21, through
//! [`crate::payment::ResolutionRequest`]) and the console's Resolve form. So one input gets
//! one verdict everywhere, and paydb's CHECKs on `payout_resolutions` never see a value a
//! surface let through.
//!
//! Each function returns the accepted value or a message that names the rule and never
//! echoes the input.

use crate::headers::OwnerId;
use crate::payout::PayoutState;

/// Fewest characters an operator's reason may have (not counting leading and trailing
/// blanks).
pub const RESOLUTION_REASON_CHARS_MIN: usize = 8;
/// Most characters an operator's reason may have.
pub const RESOLUTION_REASON_CHARS_MAX: usize = 1_000;
/// Most characters a resolution's rail reference may have.
pub const RESOLUTION_RAIL_REFERENCE_CHARS_MAX: usize = 128;

/// The operator who resolves: 1 to 64 visible ASCII characters (the `X-Owner-Id` rule).
pub fn parse_operator(raw: &str) -> Result<String, String> {
    OwnerId::parse(raw)
        .map(|o| o.as_str().to_owned())
        .map_err(|_| "the operator is 1 to 64 visible ASCII characters".to_owned())
}

/// The reason: at least [`RESOLUTION_REASON_CHARS_MIN`] characters that are not blanks, at
/// most [`RESOLUTION_REASON_CHARS_MAX`] in all, and no control character (a line break
/// included).
pub fn parse_reason(raw: &str) -> Result<String, String> {
    let chars = raw.trim().chars().count();
    if chars < RESOLUTION_REASON_CHARS_MIN || raw.chars().count() > RESOLUTION_REASON_CHARS_MAX {
        return Err(format!(
            "the reason is {RESOLUTION_REASON_CHARS_MIN} to {RESOLUTION_REASON_CHARS_MAX} characters (say what \
             the rail's statement shows)"
        ));
    }
    if raw.chars().any(char::is_control) {
        return Err("the reason holds no control characters (no line breaks)".into());
    }
    Ok(raw.to_owned())
}

/// The rail's reference (or statement line) the verdict rests on: 1 to
/// [`RESOLUTION_RAIL_REFERENCE_CHARS_MAX`] visible ASCII characters.
pub fn parse_rail_reference(raw: &str) -> Result<String, String> {
    if raw.is_empty() || raw.len() > RESOLUTION_RAIL_REFERENCE_CHARS_MAX || !raw.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "the rail reference is 1 to {RESOLUTION_RAIL_REFERENCE_CHARS_MAX} visible ASCII characters"
        ));
    }
    Ok(raw.to_owned())
}

/// The verdict as the wire spells it: `POSTED` (the rail paid) or `FAILED` (it did not).
pub fn parse_resolved_as(raw: &str) -> Result<PayoutState, String> {
    match PayoutState::parse(raw) {
        Some(s @ (PayoutState::Posted | PayoutState::Failed)) => Ok(s),
        _ => Err("the verdict is POSTED or FAILED".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution_fields_are_held_to_the_rules_of_dlock_resolve() {
        assert!(parse_reason("too few").is_err());
        assert!(parse_reason("        x       ").is_err(), "blanks do not count");
        assert!(parse_reason("statement\nline").is_err());
        assert!(parse_reason(&"x".repeat(RESOLUTION_REASON_CHARS_MAX + 1)).is_err());
        assert_eq!(parse_reason(&"x".repeat(RESOLUTION_REASON_CHARS_MAX)).map(|r| r.len()), Ok(1_000));
        assert_eq!(parse_reason("rail statement line 42"), Ok("rail statement line 42".into()));
        assert!(parse_operator("").is_err());
        assert!(parse_operator("ops alice").is_err());
        assert!(parse_operator(&"o".repeat(65)).is_err());
        assert_eq!(parse_operator("ops-alice"), Ok("ops-alice".into()));
        assert!(parse_rail_reference("").is_err());
        assert!(parse_rail_reference("RR 1").is_err());
        assert!(parse_rail_reference(&"r".repeat(RESOLUTION_RAIL_REFERENCE_CHARS_MAX + 1)).is_err());
        assert_eq!(parse_rail_reference("RR-00ff"), Ok("RR-00ff".into()));
        assert_eq!(parse_resolved_as("POSTED"), Ok(PayoutState::Posted));
        assert_eq!(parse_resolved_as("FAILED"), Ok(PayoutState::Failed));
        for other in ["posted", "RAIL_AMBIGUOUS", "PENDING", ""] {
            assert!(parse_resolved_as(other).is_err(), "{other}");
        }
        let hostile = "<script> alert(1)</script>";
        for e in [parse_reason("x"), parse_rail_reference(hostile), parse_operator(hostile)] {
            assert!(e.is_err_and(|m| !m.contains("<script>")), "a message never echoes the input");
        }
    }
}
