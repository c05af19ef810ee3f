//! The payout state machine (C2): eight states and the transitions each process may make.
//!
//! [`may_transition`] is the one check every transition goes through: each store asks it
//! (directly, through [`check_transition`], or through the SQL state lists built from it by
//! [`sources`] and [`sql_states`]) before it moves a payout, and the database triggers' pairs
//! are held to [`TRANSITIONS`] by a test. A state never moves out of a terminal state.
//!
//! Defence in depth: [`may_transition`] and [`may_write_state`] are where the state-checks
//! layer decides ([`crate::defence::Layer::StateChecks`]). Only a simulation campaign can
//! switch it off (`cfg(madsim)`); in every other build they are exactly C2's table.

use serde::{Deserialize, Serialize};

/// A payout's state (`payouts.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, utoipa::ToSchema)]
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

fn in_c2(from: PayoutState, to: PayoutState, actor: Actor) -> bool {
    TRANSITIONS.iter().any(|(f, t, a)| *f == from && *t == to && *a == actor)
}

/// Whether `actor` may move a payout from `from` to `to`.
///
/// The state-checks layer of defence in depth decides here ([`crate::defence::Layer::StateChecks`]:
/// only a simulation campaign can switch it off, and then every transition is allowed).
pub fn may_transition(from: PayoutState, to: PayoutState, actor: Actor) -> bool {
    !crate::defence::stops(crate::defence::Layer::StateChecks, !in_c2(from, to, actor))
}

/// A transition C2 does not allow for that actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("payouts: transition {}>{} by {actor:?} is not in C2", from.as_str(), to.as_str())]
pub struct TransitionRefused {
    pub from: PayoutState,
    pub to: PayoutState,
    pub actor: Actor,
}

/// [`may_transition`] as a `Result`, for the stores' `?`.
pub fn check_transition(from: PayoutState, to: PayoutState, actor: Actor) -> Result<(), TransitionRefused> {
    if may_transition(from, to, actor) {
        Ok(())
    } else {
        Err(TransitionRefused { from, to, actor })
    }
}

/// What the state triggers allow on any write (they do not know the actor): a same-state
/// write, or a transition some actor [`may_transition`].
pub fn may_write_state(from: PayoutState, to: PayoutState) -> bool {
    let allowed = from == to
        || [Actor::PaymentResource, Actor::RailProxy, Actor::Operator].into_iter().any(|a| in_c2(from, to, a));
    !crate::defence::stops(crate::defence::Layer::StateChecks, !allowed)
}

/// The states from which `actor` may move a payout to `to`, in [`PayoutState::ALL`] order:
/// the state a conditional update must find (`WHERE state IN …`).
pub fn sources(to: PayoutState, actor: Actor) -> Vec<PayoutState> {
    PayoutState::ALL.into_iter().filter(|from| may_transition(*from, to, actor)).collect()
}

/// An SQL list of state literals, `('PENDING', 'CLAIMED')`, for `state IN …` (the literals
/// are this crate's own spellings, never caller input). An empty list matches nothing.
pub fn sql_states(states: &[PayoutState]) -> String {
    let quoted: Vec<String> = states.iter().map(|s| format!("'{}'", s.as_str())).collect();
    if quoted.is_empty() {
        // `IN (NULL)` matches no row: no state may move there.
        return "(NULL)".to_owned();
    }
    format!("({})", quoted.join(", "))
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
    fn check_transition_is_may_transition_and_sources_invert_it() {
        let actors = [Actor::PaymentResource, Actor::RailProxy, Actor::Operator];
        for from in PayoutState::ALL {
            for to in PayoutState::ALL {
                let mut any = false;
                for actor in actors {
                    let ok = may_transition(from, to, actor);
                    any |= ok;
                    assert_eq!(check_transition(from, to, actor).is_ok(), ok);
                    assert_eq!(sources(to, actor).contains(&from), ok, "{from:?}>{to:?} by {actor:?}");
                }
                assert_eq!(may_write_state(from, to), any || from == to);
            }
        }
        assert_eq!(sql_states(&sources(PayoutState::Abandoned, Actor::Operator)), "('PENDING', 'CLAIMED')");
        assert_eq!(sql_states(&sources(PayoutState::Posted, Actor::PaymentResource)), "('RAIL_ACKED')");
    }

    #[test]
    fn state_spellings_round_trip() {
        for s in PayoutState::ALL {
            assert_eq!(PayoutState::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_string(&s).expect("ser"), format!("\"{}\"", s.as_str()));
        }
    }
}
