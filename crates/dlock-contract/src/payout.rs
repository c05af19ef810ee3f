//! The payout state machine (C2): eight states and the transitions each process may make.

use serde::{Deserialize, Serialize};

/// A payout's state (`payouts.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PayoutState {
    Pending,
    Claimed,
    Submitted,
    RailAcked,
    Posted,
    Failed,
    Abandoned,
    /// Quarantine: submittable by no worker under any token (FR-23).
    RailAmbiguous,
}

/// Which process performs a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor {
    PaymentResource,
    RailProxy,
    Operator,
}

impl PayoutState {
    pub const ALL: [PayoutState; 8] = [
        PayoutState::Pending,
        PayoutState::Claimed,
        PayoutState::Submitted,
        PayoutState::RailAcked,
        PayoutState::Posted,
        PayoutState::Failed,
        PayoutState::Abandoned,
        PayoutState::RailAmbiguous,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PayoutState::Pending => "PENDING",
            PayoutState::Claimed => "CLAIMED",
            PayoutState::Submitted => "SUBMITTED",
            PayoutState::RailAcked => "RAIL_ACKED",
            PayoutState::Posted => "POSTED",
            PayoutState::Failed => "FAILED",
            PayoutState::Abandoned => "ABANDONED",
            PayoutState::RailAmbiguous => "RAIL_AMBIGUOUS",
        }
    }

    pub fn parse(raw: &str) -> Option<PayoutState> {
        PayoutState::ALL.into_iter().find(|s| s.as_str() == raw)
    }

    /// No transition leaves a terminal state.
    pub fn is_terminal(self) -> bool {
        matches!(self, PayoutState::Posted | PayoutState::Failed | PayoutState::Abandoned)
    }
}

/// Every allowed transition and the process that performs it (C2). Anything not listed is
/// refused.
pub const TRANSITIONS: &[(PayoutState, PayoutState, Actor)] = &[
    (PayoutState::Pending, PayoutState::Claimed, Actor::PaymentResource),
    (PayoutState::Claimed, PayoutState::Claimed, Actor::PaymentResource),
    (PayoutState::Pending, PayoutState::Failed, Actor::PaymentResource),
    (PayoutState::Claimed, PayoutState::Failed, Actor::PaymentResource),
    (PayoutState::Claimed, PayoutState::Submitted, Actor::RailProxy),
    (PayoutState::Submitted, PayoutState::RailAcked, Actor::RailProxy),
    (PayoutState::Submitted, PayoutState::Failed, Actor::RailProxy),
    (PayoutState::Submitted, PayoutState::RailAmbiguous, Actor::RailProxy),
    (PayoutState::Submitted, PayoutState::Claimed, Actor::RailProxy),
    (PayoutState::RailAcked, PayoutState::Posted, Actor::PaymentResource),
    (PayoutState::Pending, PayoutState::Abandoned, Actor::Operator),
    (PayoutState::Claimed, PayoutState::Abandoned, Actor::Operator),
    (PayoutState::RailAmbiguous, PayoutState::Posted, Actor::Operator),
    (PayoutState::RailAmbiguous, PayoutState::Failed, Actor::Operator),
];

/// Whether `actor` may move a payout from `from` to `to`.
pub fn may_transition(from: PayoutState, to: PayoutState, actor: Actor) -> bool {
    TRANSITIONS.iter().any(|(f, t, a)| *f == from && *t == to && *a == actor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states_have_no_way_out() {
        for (from, _, _) in TRANSITIONS {
            assert!(!from.is_terminal(), "{from:?}");
        }
    }

    #[test]
    fn quarantine_is_left_only_by_an_operator() {
        for (from, _, actor) in TRANSITIONS {
            if *from == PayoutState::RailAmbiguous {
                assert_eq!(*actor, Actor::Operator);
            }
        }
        assert!(!may_transition(PayoutState::RailAmbiguous, PayoutState::Submitted, Actor::RailProxy));
    }

    #[test]
    fn state_spellings_round_trip() {
        for s in PayoutState::ALL {
            assert_eq!(PayoutState::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_string(&s).expect("ser"), format!("\"{}\"", s.as_str()));
        }
    }
}
